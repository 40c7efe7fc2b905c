# runtime/: the runtime proper, above collectives/, fusion/ and cuda/: init and registry, plans
# turned into buckets and operations, the schedules, the progress thread, online planning,
# the timeline and the topology.
noinst_LTLIBRARIES += runtime/libdearrt.la
runtime_libdearrt_la_SOURCES = runtime/rt.h runtime/api.c runtime/registry.c runtime/buckets.c runtime/mem.c \
    runtime/engine.c runtime/iteration.c runtime/sched_dear.c runtime/sched_allreduce.c runtime/clip.c \
    runtime/features.h runtime/features.c runtime/unused.c runtime/sparse.c runtime/shard.c runtime/compress.c \
    runtime/determ.c runtime/partition.c runtime/finite.c runtime/calibrate.c runtime/planning.c runtime/timeline.c runtime/topo.c runtime/timeline.h runtime/topo.h
runtime_libdearrt_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS) $(HWLOC_CFLAGS)
