# apps/tools/info: dear-info prints the version, build configuration, every DEAR_* parameter
# (value and origin), the topology, and with --markdown the text of docs/PARAMS.md. It is an
# MPI program that also runs as a singleton (no mpirun). It reads internal tables, so it links
# the internal libraries rather than libdear.la.
bin_PROGRAMS += apps/tools/dear-info
apps_tools_dear_info_SOURCES = apps/tools/dear-info.c
apps_tools_dear_info_CFLAGS = $(AM_CFLAGS) $(HWLOC_CFLAGS)
apps_tools_dear_info_LDADD = $(DEAR_INTERNAL_LIBS) $(CUDA_LDFLAGS) $(CUDA_LIBS) $(NCCL_LDFLAGS) \
    $(NCCL_LIBS) $(DEAR_DEP_LIBS)
