/*
 * bench.h: what every part of dear-bench shares: this process's rank and the size of
 * MPI_COMM_WORLD, set once by main, and bench_say(), which prints on rank 0 only so that P ranks give
 * one report. Private to apps/bench.
 */
#ifndef DEAR_APPS_BENCH_BENCH_H
#define DEAR_APPS_BENCH_BENCH_H

extern int bench_rank, bench_size;

/* printf on rank 0, flushed at once so progress shows while a configuration runs. */
__attribute__((format(printf, 1, 2))) void bench_say(const char *fmt, ...);

#endif /* DEAR_APPS_BENCH_BENCH_H */
