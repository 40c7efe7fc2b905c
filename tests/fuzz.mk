# tests/fuzz.mk: the three file readers (profile, plan file, calibration cache) under fuzzing;
# the harnesses are tests/fuzz/fuzz_<reader>.c, one function each (tests/fuzz/fuzz.h).
#   tests/fuzz/replay-{profile,planfile,cost}  every input kept in tests/fuzz/corpus/<reader>/
#                                  and tests/fuzz/regress/<reader>/ (each crash ever found)
#                                  through the harness, built with the build's own compiler:
#                                  valid-* files must load, no input may crash, break what a
#                                  load promises or allocate more than 64 MiB at once
#   make check-fuzz                libFuzzer (clang) on each reader for FUZZ_SECONDS (60) from
#                                  that corpus; not part of make check (FUZZ_CC=clang-NN)
FUZZ_REPLAY_SRCS = tests/fuzz/replay.c tests/fuzz/fuzz_common.c tests/fuzz/fuzz.h
FUZZ_REPLAY_FLAGS = $(AM_CFLAGS) -DDEAR_SRCDIR='"$(abs_top_srcdir)"'
# The replay driver counts the readers' allocations (tests/fuzz/replay.c).
FUZZ_REPLAY_WRAP = -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc
FUZZ_REPLAY_LIBS = $(DEAR_FUSION_LIBS) $(DEAR_DEP_LIBS)
check_PROGRAMS += tests/fuzz/replay-profile tests/fuzz/replay-planfile tests/fuzz/replay-cost
TESTS += tests/fuzz/replay-profile tests/fuzz/replay-planfile tests/fuzz/replay-cost
tests_fuzz_replay_profile_SOURCES = $(FUZZ_REPLAY_SRCS) tests/fuzz/fuzz_profile.c
tests_fuzz_replay_profile_CFLAGS = $(FUZZ_REPLAY_FLAGS) -DDEAR_FUZZ_READER='"profile"'
tests_fuzz_replay_profile_LDFLAGS = $(FUZZ_REPLAY_WRAP)
tests_fuzz_replay_profile_LDADD = $(FUZZ_REPLAY_LIBS)
tests_fuzz_replay_planfile_SOURCES = $(FUZZ_REPLAY_SRCS) tests/fuzz/fuzz_planfile.c
tests_fuzz_replay_planfile_CFLAGS = $(FUZZ_REPLAY_FLAGS) -DDEAR_FUZZ_READER='"planfile"'
tests_fuzz_replay_planfile_LDFLAGS = $(FUZZ_REPLAY_WRAP)
tests_fuzz_replay_planfile_LDADD = $(FUZZ_REPLAY_LIBS)
tests_fuzz_replay_cost_SOURCES = $(FUZZ_REPLAY_SRCS) tests/fuzz/fuzz_cost.c
tests_fuzz_replay_cost_CFLAGS = $(FUZZ_REPLAY_FLAGS) -DDEAR_FUZZ_READER='"cost"'
tests_fuzz_replay_cost_LDFLAGS = $(FUZZ_REPLAY_WRAP)
tests_fuzz_replay_cost_LDADD = $(FUZZ_REPLAY_LIBS)
EXTRA_DIST += tests/fuzz/check-fuzz.sh tests/fuzz/corpus tests/fuzz/regress

# FUZZ_CC and FUZZ_SECONDS may be given on the command line or in the environment.
check-fuzz:
	top_srcdir='$(top_srcdir)' top_builddir='$(top_builddir)' $(SHELL) $(top_srcdir)/tests/fuzz/check-fuzz.sh
.PHONY: check-fuzz
clean-local: clean-local-fuzz
clean-local-fuzz:
	-rm -rf $(top_builddir)/tests/fuzz/work $(top_builddir)/tests/fuzz/fuzz-profile \
	    $(top_builddir)/tests/fuzz/fuzz-planfile $(top_builddir)/tests/fuzz/fuzz-cost \
	    $(top_builddir)/tests/fuzz/fuzz-*.out
.PHONY: clean-local-fuzz
