# tests/base.mk: base services (params, log, timeline, topology) and the generated docs.
#   tests/unit/test_params, test_log, test_timeline   Check suites, no MPI
#   tests/unit/test_stats          medians and the judgement of auto's check against hand values
#   tests/unit/test_xsum           the exact sum: known totals, any order or grouping the same bits
#   tests/unit/test_fileio         files: non-regular paths and planted links refused, atomic
#                                  writes, bounded readers, readers' value checks
#   tests/unit/timeline-json.sh    the timeline files are valid JSON for Python's json module,
#                                  after every record and after a SIGKILL, with the events in them
#   tests/unit/layers.sh           no layer includes a higher one, fusion/ and base/ include no
#                                  MPI header, no library's LIBADD names a higher layer
#   tests/unit/features.sh         the feature table's rule: no file of the library touches another
#                                  feature's state, one file per row, each in the combination test
#   tests/unit/params-doc.sh       docs/PARAMS.md equals what `dear-info --markdown` prints now
#   tests/unit/dear-info.sh        dear-info runs alone, lists every parameter, reports bad values
#   tests/unit/linkage.sh          libdear calls NCCL and the stream-ordered CUDA calls when built with
#                                  them, and needs and references neither when built without
#   tests/mpi/topo-np2.mpi         topology counts and progress-core choice on synthetic hwloc
#                                  topologies, 2 ranks on one node
SH_TESTS += tests/unit/layers.sh tests/unit/features.sh tests/unit/params-doc.sh tests/unit/dear-info.sh \
    tests/unit/linkage.sh
CK_TESTS += tests/unit/test_params tests/unit/test_log tests/unit/test_timeline tests/unit/test_fileio \
    tests/unit/test_stats tests/unit/test_xsum
CK_RUNS += tests/unit/timeline-json.sh tests/mpi/topo-np2.mpi tests/mpi/topo-np3.mpi
tests_unit_test_xsum_LDADD = $(DEAR_BASE_LIBS) $(CHECK_LIBS) -lm
if HAVE_CHECK
check_PROGRAMS += tests/mpi/test_topo
tests_mpi_test_topo_SOURCES = tests/mpi/test_topo.c tests/mpi/np_check.h
tests_mpi_test_topo_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(HWLOC_CFLAGS)
endif
