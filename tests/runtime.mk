# tests/runtime.mk: the runtime.
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
#                                  VALGRIND_TOOL=helgrind for the thread checker, which must
#                                  also report the race tests/mpi/helgrind_race plants
#   tests/mpi/online-np{2,4}.mpi   test_online: plan switches mid-run under every model-driven
#                                  planner x schedule stay bitwise equal to MPI_Allreduce, ranks
#                                  end on one plan; calibration cache written, reused, corrupt
#                                  cache re-measured; DEAR_CALIBRATE=off with each preset; the
#                                  first plan without a profile (DEAR_FIRST_PLAN) identical on
#                                  every rank and equal to fusion/estimate.h's, bad hints refused
#   tests/mpi/online-np3-first.mpi test_online's "first" case alone at np 3
#   tests/mpi/loop-np{1..5}.mpi    test_loop: a training loop's patterns (LR schedule, clipping,
#                                  accumulation, frozen and unused tensors, evaluation,
#                                  parameter-less layers, dear_wait_grad, bfloat16 rounded once)
#                                  against a plain MPI_Allreduce loop; np5 bfloat16 only
#   tests/mpi/sparse-np{1..5}.mpi  test_sparse: embedding-like tensors declared sparse
#                                  (dear_register_sparse), per-rank row patterns from none to
#                                  all, every schedule x DEAR_SPARSE=on|off|auto x float32,
#                                  bfloat16, bitwise against MPI_Allreduce; the phases auto
#                                  chose, warm-up densities, sparse messages sent; bad input
#   tests/mpi/{loop-np3,sparse-np3,online-np4}-socket.mpi  the same suites with
#                                  DEAR_TRANSPORT=socket, every context asserted to run on it
#                                  (DEAR_TEST_TRANSPORT); loop-np3 and runtime-abandon-np3
#                                  through its shared-memory rings (DEAR_SOCKET_SHM_BYTES)
CK_PROGS += tests/mpi/test_loop
CK_RUNS += tests/mpi/loop-np1.mpi tests/mpi/loop-np2.mpi tests/mpi/loop-np3.mpi \
    tests/mpi/loop-np4.mpi tests/mpi/loop-np5.mpi tests/mpi/loop-np3-socket.mpi

# Features together (tests/mpi/test_combo.c): a covering set of combinations of sharding,
# compression, error feedback, clipping, sparse and unused tensors, partitions, the deterministic
# mode, freezing, accumulation and sharded slices stepped at backward_end only (DEAR_SHARD_EARLY=0;
# else during backward under dear), under every schedule, planner, transport and np 1..4, against a
# float64 MPI_Allreduce loop, with guard regions around every tensor:
#   tests/mpi/combo-np{1..4}.mpi     host memory
#   tests/mpi/combo-np{2,3}-delay.mpi  the delayed host row (tests/mpi/mem_delay.h)
CK_PROGS += tests/mpi/test_combo
CK_RUNS += tests/mpi/combo-np1.mpi tests/mpi/combo-np2.mpi tests/mpi/combo-np3.mpi \
    tests/mpi/combo-np4.mpi tests/mpi/combo-np2-delay.mpi tests/mpi/combo-np3-delay.mpi

# The memory seam's fences (collectives/mem.h, runtime/mem.c): test_loop and test_runtime built
# again with every context's gradients behind the delayed host row (tests/mpi/mem_delay.h), whose
# queues run on worker threads with seeded random delays:
#   tests/mpi/{loop-np3,runtime-np2}-delay.mpi  the suites pass unchanged
#   tests/mpi/mem-delay-mutation.sh  each wait left out (DEAR_DEBUG_DROP_WAIT) makes test_loop's
#                                  parameters differ from the MPI_Allreduce loop
# The *_delay programs, here for test_combo, test_loop, test_runtime and test_finite: the suite's
# source and mem_delay.c, built with -DDEAR_TEST_MEM_DELAY.
CK_RUNS += tests/mpi/loop-np3-delay.mpi tests/mpi/runtime-np2-delay.mpi tests/mpi/mem-delay-mutation.sh
MEM_DELAY_SOURCES = tests/mpi/mem_delay.c tests/mpi/mem_delay.h
MEM_DELAY_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -DDEAR_TEST_MEM_DELAY
if HAVE_CHECK
check_PROGRAMS += tests/mpi/test_combo_delay tests/mpi/test_loop_delay tests/mpi/test_runtime_delay \
    tests/mpi/test_finite_delay
endif
tests_mpi_test_combo_delay_SOURCES = tests/mpi/test_combo.c $(MEM_DELAY_SOURCES)
tests_mpi_test_combo_delay_CFLAGS = $(MEM_DELAY_CFLAGS)
tests_mpi_test_loop_delay_SOURCES = tests/mpi/test_loop.c $(MEM_DELAY_SOURCES)
tests_mpi_test_loop_delay_CFLAGS = $(MEM_DELAY_CFLAGS)
# test_loop asserts results, never timings: its reference loop's collectives wait politely.
tests_mpi_test_loop_LDADD = $(TEST_MPI_LIBS) $(LDADD)
tests_mpi_test_loop_delay_LDADD = $(TEST_MPI_LIBS) $(LDADD)
tests_mpi_test_runtime_delay_SOURCES = tests/mpi/test_runtime.c $(MEM_DELAY_SOURCES)
tests_mpi_test_runtime_delay_CFLAGS = $(MEM_DELAY_CFLAGS)
tests_mpi_test_finite_delay_SOURCES = tests/mpi/test_finite.c $(MEM_DELAY_SOURCES)
tests_mpi_test_finite_delay_CFLAGS = $(MEM_DELAY_CFLAGS)

CK_PROGS += tests/mpi/test_runtime tests/mpi/test_online
CK_RUNS += tests/mpi/online-np2.mpi tests/mpi/online-np4.mpi tests/mpi/online-np4-socket.mpi \
    tests/mpi/online-np3-first.mpi \
    tests/mpi/runtime-np1.mpi tests/mpi/runtime-np2.mpi tests/mpi/runtime-np3.mpi \
    tests/mpi/runtime-np4.mpi tests/mpi/runtime-thread-np1.mpi tests/mpi/runtime-timeline.sh \
    tests/mpi/runtime-stall-abort.sh tests/mpi/runtime-abandon-np4.mpi tests/mpi/runtime-abandon-np3-socket.mpi
EXTRA_DIST += tests/mpi/runtime-valgrind.sh tests/mpi/helgrind-runtime.supp

# The check for non-finite gradients (tests/mpi/test_finite.c, runtime/finite.c):
#   tests/mpi/finite-np3.mpi         warn names the rank, tensor, iteration and count, under every
#                                    schedule, sharded or not; no false report; off reports nothing
#   tests/mpi/finite-np3-delay.mpi   the same on the delayed host row
#   tests/mpi/finite-abort.sh        abort ends the job with rank 1's message
CK_PROGS += tests/mpi/test_finite
CK_RUNS += tests/mpi/finite-np3.mpi tests/mpi/finite-np3-delay.mpi tests/mpi/finite-abort.sh

CK_PROGS += tests/mpi/test_sparse
CK_RUNS += tests/mpi/sparse-np1.mpi tests/mpi/sparse-np2.mpi tests/mpi/sparse-np3.mpi \
    tests/mpi/sparse-np4.mpi tests/mpi/sparse-np5.mpi tests/mpi/sparse-np3-socket.mpi

# A race planted on a user buffer that Open MPI copies: the helgrind run must report it.
check_PROGRAMS += tests/mpi/helgrind_race
tests_mpi_helgrind_race_SOURCES = tests/mpi/helgrind_race.c
tests_mpi_helgrind_race_LDADD = $(PTHREAD_LIBS)

check-valgrind-runtime: tests/mpi/test_runtime$(EXEEXT) tests/mpi/helgrind_race$(EXEEXT)
	$(MPI_LAUNCH_ENV) top_srcdir='$(top_srcdir)' top_builddir='$(top_builddir)' \
	    $(SHELL) $(top_srcdir)/tests/mpi/runtime-valgrind.sh
.PHONY: check-valgrind-runtime

# tests/mpi/partition-np{1..4}.mpi  test_partition: tensors cut into chunks (DEAR_PARTITION) give
#                                  the parameters of the unpartitioned run bit for bit under every
#                                  schedule, each update once per iteration with every chunk in
#                                  place; plan files with cuts, refused cuts, early groups across a
#                                  tensor's chunks. The -part variants rerun test_loop, test_sparse
#                                  and test_online with their tensors cut.
CK_PROGS += tests/mpi/test_partition
CK_RUNS += tests/mpi/partition-np1.mpi tests/mpi/partition-np2.mpi tests/mpi/partition-np3.mpi \
    tests/mpi/partition-np4.mpi tests/mpi/loop-np2-part.mpi tests/mpi/loop-np3-part.mpi \
    tests/mpi/sparse-np3-part.mpi tests/mpi/online-np2-part.mpi
