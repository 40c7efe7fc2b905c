# runtime/: base services (status, log, params, util) and the runtime proper.
noinst_LTLIBRARIES += runtime/libdearbase.la runtime/libdearrt.la
runtime_libdearbase_la_SOURCES = runtime/status.c runtime/log.c runtime/log.h runtime/check.h \
    runtime/mpierr.c runtime/util.c runtime/util.h runtime/params.c runtime/params.h
runtime_libdearbase_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS)
EXTRA_DIST += runtime/params.def

runtime_libdearrt_la_SOURCES = runtime/api.c runtime/rt.h runtime/model.c runtime/engine.c runtime/hooks.c \
    runtime/planning.c
runtime_libdearrt_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS) $(HWLOC_CFLAGS)
runtime_libdearrt_la_SOURCES += runtime/timeline.c runtime/topo.c runtime/timeline.h runtime/topo.h
