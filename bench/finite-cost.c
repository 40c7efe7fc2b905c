/*
 * finite-cost: what DEAR_CHECK_FINITE costs per MiB of gradient on the host: the count of
 * non-finite elements it takes of each unit (collectives/reduce.h), and, for scale, the squared
 * norm a device row takes instead (the host row's sumsq) and a copy of the same bytes (a bucket's
 * packing). Prints a Markdown table; bench/finite-cost.sh puts it in
 * docs/PERFORMANCE.md.
 *
 *   bench/finite-cost [MiB] [repeats]      (default 64 MiB, 15 repeats; the medians)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"
#include "collectives/mem.h"
#include "collectives/reduce.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 64;
    int reps = argc > 2 ? atoi(argv[2]) : 15;
    if (mib == 0 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: finite-cost [MiB > 0] [repeats 1..1000]\n");
        return 2;
    }
    size_t bytes = mib << 20;
    char *v = malloc(bytes), *w = malloc(bytes);
    double *t = malloc((size_t)reps * sizeof *t);
    if (!v || !w || !t) {
        fprintf(stderr, "finite-cost: out of memory for %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < bytes / 4; i++)
        ((float *)v)[i] = (float)((int)(i % 2001) - 1000) * 1e-3f;
    memcpy(w, v, bytes);
    const dear_mem_ops_t *mo = &dear_mem_host_ops;
    const struct { const char *name; dear_dtype_t t; } types[] = {
        { "float32", DEAR_FLOAT32 }, { "bfloat16", DEAR_BFLOAT16 }, { "float64", DEAR_FLOAT64 } };
    printf("| what | ms per MiB (median of %d over %zu MiB) | GB/s |\n|---|---:|---:|\n", reps, mib);
    const size_t nt = sizeof types / sizeof types[0];
    for (size_t k = 0; k < 2 * nt + 1; k++) {
        char what[96];
        for (int r = 0; r < reps; r++) {
            double sq = 0, t0 = now();
            if (k < nt)
                sq = (double)dear_reduce_nonfinite(types[k].t, v, bytes / dear_dtype_size(types[k].t));
            else if (k < 2 * nt)
                mo->sumsq(NULL, types[k - nt].t, v, bytes / dear_dtype_size(types[k - nt].t), &sq);
            else
                memcpy(w, v, bytes);
            t[r] = now() - t0;
            if (sq < 0)
                return 1; /* keep the result alive */
        }
        if (k < nt)
            snprintf(what, sizeof what, "the check, %s (count of NaN and Inf)", types[k].name);
        else if (k < 2 * nt)
            snprintf(what, sizeof what, "a device row's way, %s (squared norm, float64, in order)", types[k - nt].name);
        else
            snprintf(what, sizeof what, "copy of the same bytes (a bucket's packing)");
        qsort(t, (size_t)reps, sizeof *t, cmp);
        double med = t[reps / 2];
        printf("| %s | %.4f | %.2f |\n", what, med * 1e3 / (double)mib, (double)bytes / med / 1e9);
    }
    free(v);
    free(w);
    free(t);
    return 0;
}
