# tests/runtime.mk: the runtime (issue 3).
#   tests/mpi/runtime-np{1,2,3,4}.mpi  test_runtime's Check suite: training under every schedule x
#                                  fusion setting against an MPI_Allreduce reference, updates once
#                                  per iteration, flush, mismatch, bad parameters, calls out of
#                                  order, stall warning, plan file, profile. np2 forces the mpi
#                                  algorithm, np3 the ring with one collective in flight; np1 and
#                                  np4 use the selection table
#   tests/mpi/runtime-thread-np1.mpi   dear_init refuses MPI_THREAD_SINGLE
#   tests/mpi/runtime-timeline.sh  the timeline of a 2-rank run parses as JSON with the events
#   tests/mpi/runtime-stall-abort.sh  DEAR_STALL_ABORT_S aborts a job whose rank 1 sleeps
#   make check-valgrind-runtime    the engine test (np 2) under valgrind memcheck, zero errors;
#                                  VALGRIND_TOOL=helgrind for the thread checker
#   tests/mpi/online-np{2,4}.mpi   test_online: plan switches mid-run under every model-driven
#                                  planner x schedule stay bitwise equal to MPI_Allreduce, ranks
#                                  end on one plan; calibration cache written, reused, corrupt
#                                  cache re-measured; DEAR_CALIBRATE=off with each preset
#   tests/mpi/bench_overhead       per-iteration overhead with 200 small tensors (not run by check)
if HAVE_CHECK
check_PROGRAMS += tests/mpi/test_runtime tests/mpi/test_online
TESTS += tests/mpi/online-np2.mpi tests/mpi/online-np4.mpi
tests_mpi_test_online_SOURCES = tests/mpi/test_online.c tests/mpi/synth.h
tests_mpi_test_online_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_mpi_test_online_LDADD = $(DEAR_INTERNAL_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
TESTS += tests/mpi/runtime-np1.mpi tests/mpi/runtime-np2.mpi tests/mpi/runtime-np3.mpi \
    tests/mpi/runtime-np4.mpi tests/mpi/runtime-thread-np1.mpi tests/mpi/runtime-timeline.sh \
    tests/mpi/runtime-stall-abort.sh
tests_mpi_test_runtime_SOURCES = tests/mpi/test_runtime.c tests/mpi/synth.h
tests_mpi_test_runtime_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_mpi_test_runtime_LDADD = $(DEAR_INTERNAL_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
endif
EXTRA_DIST += tests/mpi/runtime-np1.mpi tests/mpi/runtime-np2.mpi tests/mpi/runtime-np3.mpi \
    tests/mpi/runtime-np4.mpi tests/mpi/runtime-thread-np1.mpi tests/mpi/runtime-timeline.sh \
    tests/mpi/runtime-valgrind.sh tests/mpi/helgrind-runtime.supp tests/mpi/runtime-stall-abort.sh \
    tests/mpi/online-np2.mpi tests/mpi/online-np4.mpi

noinst_PROGRAMS += tests/mpi/bench_overhead
tests_mpi_bench_overhead_SOURCES = tests/mpi/bench_overhead.c
tests_mpi_bench_overhead_LDADD = libdear.la $(DEAR_DEP_LIBS)

check-valgrind-runtime: tests/mpi/test_runtime$(EXEEXT)
	top_srcdir='$(top_srcdir)' top_builddir='$(top_builddir)' \
	    $(SHELL) $(top_srcdir)/tests/mpi/runtime-valgrind.sh
.PHONY: check-valgrind-runtime
