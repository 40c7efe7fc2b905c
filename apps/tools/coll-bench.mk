# apps/tools/coll-bench
