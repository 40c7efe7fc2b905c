# apps/tools/coll-bench: dear-coll-bench, the collectives benchmark (nccl-tests style rows,
# --overlap for the OSU overlap percentage). It drives collectives/ directly, so it links the
# internal libraries rather than libdear's public API.
bin_PROGRAMS += apps/tools/dear-coll-bench
apps_tools_dear_coll_bench_SOURCES = apps/tools/dear-coll-bench.c
apps_tools_dear_coll_bench_LDADD = $(DEAR_COLL_LIBS) $(DEAR_DEP_LIBS)
