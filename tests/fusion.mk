# tests for fusion: Check unit tests (no MPI) of the cost model, profiles, simulator, planners
# and plan files, and a shell test of dear-plan's command line and error messages.
if HAVE_CHECK
check_PROGRAMS += tests/unit/test_fusion
TESTS += tests/unit/test_fusion
tests_unit_test_fusion_SOURCES = tests/unit/test_fusion.c
tests_unit_test_fusion_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -DDEAR_SRCDIR='"$(abs_top_srcdir)"'
tests_unit_test_fusion_LDADD = $(DEAR_FUSION_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
endif
SH_TESTS += tests/unit/test_dear_plan.sh
