# bench/: the emulated cluster (bench/emucluster), its probe programs, and the scripts that
# regenerate docs/PERFORMANCE.md. The programs use MPI only (CC is mpicc), not libdear.
noinst_PROGRAMS += bench/dear-p2p bench/emu-hello
bench_dear_p2p_SOURCES = bench/dear-p2p.c
bench_dear_p2p_LDADD = -lm
bench_emu_hello_SOURCES = bench/emu-hello.c
EXTRA_DIST += bench/emucluster bench/README.md bench/coll-perf.sh bench/perf-report.py
