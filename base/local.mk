# base/: the services every layer uses: status strings, logging, the check macros (MPI-free in
# check.h, MPI's in mpi_check.h), the parameter table, samples and their statistics, strict
# text parsing, time and element types, and the extension tables (collective algorithms,
# schedules, planners) every layer names. Nothing here includes a header of another layer.
noinst_LTLIBRARIES += base/libdearbase.la
base_libdearbase_la_SOURCES = base/status.c base/log.c base/log.h base/check.h base/mpi_check.h \
    base/mpi_check.c base/util.c base/util.h base/params.c base/params.h base/stats.c base/stats.h \
    base/textio.c base/textio.h base/fileio.c base/fileio.h base/tables.c base/algo_table.h base/planner_table.h \
    base/sched_table.h base/transport_table.h base/sync.h base/xsum.c base/xsum.h
base_libdearbase_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS)
EXTRA_DIST += base/params.def
