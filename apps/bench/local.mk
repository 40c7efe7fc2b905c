# apps/bench: dear-bench, the profile-driven benchmark driver. It drives the runtime
# through the public API (libdear.la) and loads profiles and predicts with the fusion library's
# pure functions (fusion/ and base/); libdear exports only the
# DEAR_API symbols, so the two sets do not collide.
bin_PROGRAMS += apps/bench/dear-bench
apps_bench_dear_bench_SOURCES = apps/bench/dear-bench.c apps/bench/bench.h apps/bench/args.c apps/bench/args.h \
    apps/bench/model.c apps/bench/model.h apps/bench/predict.c apps/bench/predict.h
apps_bench_dear_bench_LDADD = libdear.la $(DEAR_FUSION_LIBS) $(DEAR_DEP_LIBS)
