# apps/tools/info
