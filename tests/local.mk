# tests/: unit (Check, no MPI), mpi (Check under mpirun via *.mpi files), cuda (skip 77 without
# GPU). One fragment per area, owned with the code it tests, lists its tests in the variables
# below; the rules at the end of this file build, run and distribute every list the same way, so
# adding a test is one line:
#   SH_TESTS      scripts make check runs
#   CK_TESTS      Check programs make check runs
#   CK_PROGS      Check programs that *.mpi files or scripts run
#   CK_RUNS       *.mpi files and scripts that run CK_PROGS (run only where Check is found)
#   CK_NCCL_RUNS  the same, run only where CUDA and NCCL are found too
# A program tests/<dir>/<name> in CK_TESTS or CK_PROGS is built from tests/<dir>/<name>.c alone
# (shared headers are in EXTRA_DIST below) with $(CHECK_CFLAGS), and linked with LDADD: every
# layer, Check and the dependencies. One that needs fewer layers sets its own <name>_LDADD; one
# with more sources or other flags is no CK_ program and keeps its own block in its fragment.
SH_TESTS =
CK_TESTS =
CK_PROGS =
CK_RUNS =
CK_NCCL_RUNS =
include tests/build.mk
include tests/base.mk
include tests/coll.mk
include tests/runtime.mk
include tests/fusion.mk
include tests/cnn.mk
include tests/gpt.mk
include tests/bench.mk
include tests/cuda.mk
include tests/dearbench.mk
include tests/python.mk
include tests/fuzz.mk
include tests/sanitizers.mk

EXTRA_DIST += $(SH_TESTS) $(CK_RUNS) $(CK_NCCL_RUNS) tests/unit/ck_run.h tests/mpi/np_check.h \
    tests/mpi/suite_run.h tests/mpi/coll_check.h tests/mpi/synth.h
TESTS += $(SH_TESTS)
if HAVE_CHECK
check_PROGRAMS += $(CK_TESTS) $(CK_PROGS)
TESTS += $(CK_TESTS) $(CK_RUNS)
if HAVE_CUDA
if HAVE_NCCL
TESTS += $(CK_NCCL_RUNS)
endif
endif
endif
# TEST_MPI_LIBS, linked before MPI: blocking collectives that wait without spinning
# (tests/mpi/polite.c), for the tests of hundreds of checked collectives on more ranks than
# cores. Not for the tests that time iterations: sleeping waits add their wake-up jitter.
check_LTLIBRARIES += tests/mpi/libpolite.la
tests_mpi_libpolite_la_SOURCES = tests/mpi/polite.c
TEST_MPI_LIBS = tests/mpi/libpolite.la
# LDADD, the link line of every program without its own <name>_LDADD, is the Check programs'.
# Every other program sets its own (bench/emu-hello, MPI only, an empty one).
LDADD = $(DEAR_INTERNAL_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
# $(CHECK_CFLAGS) after $(AM_CFLAGS) for these programs alone, on their compile and link lines
# (GNU make target-specific variables; private: the libraries they depend on keep AM_CFLAGS).
CK_OBJECTS = $(CK_TESTS:=.$(OBJEXT)) $(CK_PROGS:=.$(OBJEXT))
CK_EXES = $(CK_TESTS:=$(EXEEXT)) $(CK_PROGS:=$(EXEEXT))
$(CK_OBJECTS) $(CK_EXES): private AM_CFLAGS += $(CHECK_CFLAGS)
