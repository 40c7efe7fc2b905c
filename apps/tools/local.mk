# apps/tools: dear-info (runtime), dear-plan (fusion), dear-coll-bench (collectives).
include apps/tools/info.mk
include apps/tools/plan.mk
include apps/tools/coll-bench.mk
