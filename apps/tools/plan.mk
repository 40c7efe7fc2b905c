# apps/tools/plan
