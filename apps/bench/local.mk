# apps/bench: dear-bench, the profile-driven benchmark driver (issue 6). It drives the runtime
# through the public API (libdear.la) and loads profiles and predicts with the fusion library's
# pure functions (fusion/libdearfusion.la, runtime/libdearbase.la); libdear exports only the
# DEAR_API symbols, so the two sets do not collide.
bin_PROGRAMS += apps/bench/dear-bench
apps_bench_dear_bench_SOURCES = apps/bench/dear-bench.c
apps_bench_dear_bench_LDADD = libdear.la fusion/libdearfusion.la runtime/libdearbase.la $(DEAR_DEP_LIBS)
