# bench/: the emulated cluster (bench/emucluster), its probe programs, and the scripts that
# regenerate docs/PERFORMANCE.md. dear-p2p and emu-hello use MPI only (CC is mpicc), not libdear.
noinst_PROGRAMS += bench/dear-p2p bench/emu-hello bench/dear-overhead bench/finite-cost
bench_dear_p2p_SOURCES = bench/dear-p2p.c
bench_dear_p2p_LDADD = -lm
bench_emu_hello_SOURCES = bench/emu-hello.c
bench_emu_hello_LDADD =
# dear-overhead: libdear's cost per hook and its progress thread's CPU (public API only).
bench_dear_overhead_SOURCES = bench/dear-overhead.c
bench_dear_overhead_LDADD = libdear.la $(DEAR_DEP_LIBS)
# finite-cost: DEAR_CHECK_FINITE's kernel per MiB on the host row (bench/finite-cost.sh).
bench_finite_cost_SOURCES = bench/finite-cost.c
bench_finite_cost_LDADD = $(DEAR_COLL_LIBS) $(DEAR_DEP_LIBS)
EXTRA_DIST += bench/emucluster bench/README.md bench/coll-perf.sh bench/perf-report.py bench/loop-overhead.py bench/docsection.py bench/torch-ddp.sh bench/torch-ddp.py bench/torch-overhead.py \
    bench/torch-accuracy.sh bench/torch-accuracy.py \
    bench/auto-repeat.sh bench/sparse-perf.sh bench/sparse-report.py bench/gpt-sparse.sh bench/shard-perf.sh \
    bench/torch-first.sh bench/torch-first.py bench/ab-builds.sh bench/ab-report.py bench/env-ab.sh \
    bench/finite-cost.sh
