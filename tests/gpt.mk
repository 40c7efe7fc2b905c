# tests for apps/gpt (dear-gpt).
# test_gpt_grad: every layer's backward and the whole model's gradient against central finite
#   differences, with model.c compiled in float64 (-DGPT_REAL_DOUBLE), no MPI.
# gpt-args.sh: bad arguments, an indivisible batch and a missing data file fail cleanly.
# gpt-equiv.sh: 2 ranks equal 1 rank with the same global batch, and the schedules dear, wfbp
#   and sync give the same loss curve, to float tolerance.
if HAVE_CHECK
check_PROGRAMS += tests/unit/test_gpt_grad
TESTS += tests/unit/test_gpt_grad
tests_unit_test_gpt_grad_SOURCES = tests/unit/test_gpt_grad.c apps/gpt/model.c apps/gpt/model.h \
    apps/gpt/text.c apps/gpt/text.h
tests_unit_test_gpt_grad_CFLAGS = $(AM_CFLAGS) $(CBLAS_CFLAGS) $(CHECK_CFLAGS) -DGPT_REAL_DOUBLE
tests_unit_test_gpt_grad_LDADD = $(CBLAS_LIBS) $(CHECK_LIBS) -lm
endif
TESTS += tests/apps/gpt-args.sh tests/apps/gpt-equiv.sh
EXTRA_DIST += tests/apps/gpt-args.sh tests/apps/gpt-equiv.sh
