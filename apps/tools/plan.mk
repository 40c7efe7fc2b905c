# apps/tools/plan: dear-plan predicts iteration times for every schedule x planner from a
# profile and a cost model (pure fusion code; it initialises no MPI). Internal libraries only:
# the fusion library and the base services (status strings, logging, time).
bin_PROGRAMS += apps/tools/dear-plan
apps_tools_dear_plan_SOURCES = apps/tools/dear-plan.c
apps_tools_dear_plan_LDADD = $(DEAR_FUSION_LIBS) $(DEAR_DEP_LIBS)
