# tests/base.mk: base services (params, log, timeline, topology) and the generated docs.
#   tests/unit/test_params, test_log, test_timeline   Check suites, no MPI
#   tests/unit/timeline-json.sh    the timeline files are valid JSON for Python's json module,
#                                  after every record and after a SIGKILL, with the events in them
#   tests/unit/params-doc.sh       docs/PARAMS.md equals what `dear-info --markdown` prints now
#   tests/unit/dear-info.sh        dear-info runs alone, lists every parameter, reports bad values
#   tests/mpi/topo-np2.mpi         topology counts and progress-core choice on synthetic hwloc
#                                  topologies, 2 ranks on one node
TESTS += tests/unit/params-doc.sh tests/unit/dear-info.sh
EXTRA_DIST += tests/unit/params-doc.sh tests/unit/dear-info.sh
if HAVE_CHECK
check_PROGRAMS += tests/unit/test_params tests/unit/test_log tests/unit/test_timeline tests/mpi/test_topo
TESTS += tests/unit/test_params tests/unit/test_log tests/unit/test_timeline tests/unit/timeline-json.sh \
    tests/mpi/topo-np2.mpi tests/mpi/topo-np3.mpi
EXTRA_DIST += tests/unit/timeline-json.sh tests/mpi/topo-np2.mpi tests/mpi/topo-np3.mpi

tests_unit_test_params_SOURCES = tests/unit/test_params.c
tests_unit_test_params_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_params_LDADD = $(DEAR_INTERNAL_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)

tests_unit_test_log_SOURCES = tests/unit/test_log.c
tests_unit_test_log_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_log_LDADD = $(DEAR_INTERNAL_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)

tests_unit_test_timeline_SOURCES = tests/unit/test_timeline.c
tests_unit_test_timeline_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_timeline_LDADD = $(DEAR_INTERNAL_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)

tests_mpi_test_topo_SOURCES = tests/mpi/test_topo.c
tests_mpi_test_topo_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(HWLOC_CFLAGS)
tests_mpi_test_topo_LDADD = $(DEAR_INTERNAL_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
endif
