/*
 * dear-overhead: what the runtime costs per iteration when there is nothing to hide the
 * communication behind. A model of many small tensors (default 200 x 256 float32, one per
 * layer, in one arena) runs iterations (no compute unless asked) through
 *   plain           the loop alone: no communication, each tensor's update called directly,
 *   mpi-per-tensor  a blocking MPI_Allreduce per tensor in backward order (the naive loop),
 *   mpi-fused       one MPI_Allreduce of the whole arena,
 *   dear/wfbp/sync  the libdear hooks with DEAR_SCHEDULE set, fusion threshold (default 25 MiB:
 *                   one bucket) and none (one bucket per layer),
 * optionally with --compute-us of arithmetic per layer (forward; twice that backward) to see
 * overlap, and reports the median iteration time (slowest rank), the time per hook call above
 * the plain loop (what libdear adds to each of the 2N+1 hooks of an iteration: at one rank, where
 * nothing travels, that is all it costs), the overhead against mpi-per-tensor and mpi-fused, and
 * the progress thread's CPU share while iterating and while idle (a sleep with the context
 * committed and nothing in flight). Uses only include/dear.h.
 *
 *   mpirun -np 2 bench/dear-overhead [--tensors N] [--count C] [--iters I] [--csv FILE]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "include/dear.h"

static int rank, nranks;
static int ntensors = 200, count = 256, iters = 300, warmup = 30;
static double idle_s = 1.0, compute_us = 0;
static volatile double sink_value;

/* Stand-in for a layer's compute: real arithmetic for the given time (the point is to occupy
 * the core as a training step would, so the progress thread has to share it). */
static void compute(double us)
{
    if (us <= 0)
        return;
    double t_end = MPI_Wtime() + us * 1e-6, x = 1.0;
    while (MPI_Wtime() < t_end)
        for (int i = 0; i < 256; i++)
            x = x * 1.0000001 + 1e-9;
    sink_value = x;
}

typedef struct {
    char mode[32];
    double med_us, cpu_share, idle_share;
} row_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over iterations of the slowest rank's iteration time. */
static double median_us(double *t, int n)
{
    double *all = malloc(sizeof *all * (size_t)n);
    MPI_Allreduce(t, all, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(all, (size_t)n, sizeof *all, cmp_double);
    double m = all[n / 2] * 1e6;
    free(all);
    return m;
}

static int nop_update(const dear_update_info_t *info)
{
    ++*(long *)info->arg;
    return 0;
}

static void fill(float *arena, int it)
{
    size_t total = (size_t)ntensors * (size_t)count;
    for (size_t j = 0; j < total; j++)
        arena[j] = (float)((j + (size_t)it) % 7);
}

/* The loop without libdear: the same fills, compute and one update call per tensor. */
static double run_plain(float *arena)
{
    double *t = malloc(sizeof *t * (size_t)iters);
    long updates = 0;
    for (int it = -warmup; it < iters; it++) {
        fill(arena, it);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int l = 0; l < ntensors; l++) {
            dear_update_info_t info = { .size = sizeof info, .grad = arena + (size_t)l * (size_t)count,
                                        .count = (size_t)count, .arg = &updates, .tensor = l, .iteration = it };
            nop_update(&info);
            compute(compute_us);
        }
        for (int l = ntensors - 1; l >= 0; l--)
            compute(2 * compute_us);
        if (it >= 0)
            t[it] = MPI_Wtime() - t0;
    }
    double m = median_us(t, iters);
    free(t);
    return m;
}

static double run_mpi(float *arena, int fused)
{
    double *t = malloc(sizeof *t * (size_t)iters);
    for (int it = -warmup; it < iters; it++) {
        fill(arena, it);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int l = 0; l < ntensors; l++)
            compute(compute_us);
        if (fused) {
            for (int l = ntensors - 1; l >= 0; l--)
                compute(2 * compute_us);
            MPI_Allreduce(MPI_IN_PLACE, arena, ntensors * count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else {
            for (int i = ntensors - 1; i >= 0; i--) {
                compute(2 * compute_us);
                MPI_Allreduce(MPI_IN_PLACE, arena + (size_t)i * (size_t)count, count, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
            }
        }
        float s = 1.0f / (float)nranks;
        for (size_t j = 0; j < (size_t)ntensors * (size_t)count; j++)
            arena[j] *= s;
        if (it >= 0)
            t[it] = MPI_Wtime() - t0;
    }
    double m = median_us(t, iters);
    free(t);
    return m;
}

static int run_dear(float *arena, const char *sched, const char *fusion, row_t *row)
{
    setenv("DEAR_SCHEDULE", sched, 1);
    setenv("DEAR_FUSION", fusion, 1);
    dear_ctx_t *ctx = NULL;
    long updates = 0;
    int rc = dear_init(MPI_COMM_WORLD, &ctx);
    for (int i = 0; i < ntensors && rc == DEAR_OK; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        rc = dear_register(ctx, name, i, arena + (size_t)i * (size_t)count, (size_t)count, DEAR_FLOAT32,
                           DEAR_MEM_HOST, nop_update, &updates);
    }
    if (rc == DEAR_OK)
        rc = dear_commit(ctx);
    if (rc != DEAR_OK) {
        fprintf(stderr, "dear-overhead: %s/%s: %s\n", sched, fusion, dear_status_string(rc));
        return rc;
    }
    /* Idle: committed, nothing queued; the progress thread should sleep. */
    dear_stats_t s0, s1;
    dear_get_stats(ctx, &s0);
    struct timespec ts = { (time_t)idle_s, (long)((idle_s - (double)(time_t)idle_s) * 1e9) };
    nanosleep(&ts, NULL);
    dear_get_stats(ctx, &s1);
    double idle_cpu = s1.progress_cpu_s - s0.progress_cpu_s;

    double *t = malloc(sizeof *t * (size_t)iters);
    double wall0 = 0, cpu0 = 0;
    for (int it = -warmup; it < iters && rc == DEAR_OK; it++) {
        fill(arena, it);
        if (it == 0) {
            dear_get_stats(ctx, &s0);
            cpu0 = s0.progress_cpu_s;
            wall0 = MPI_Wtime();
        }
        double t0 = MPI_Wtime();
        for (int l = 0; l < ntensors && rc == DEAR_OK; l++) {
            rc = dear_forward_begin(ctx, l);
            compute(compute_us);
        }
        for (int l = ntensors - 1; l >= 0 && rc == DEAR_OK; l--) {
            compute(2 * compute_us);
            rc = dear_backward_done(ctx, l);
        }
        if (rc == DEAR_OK)
            rc = dear_backward_end(ctx);
        if (it >= 0)
            t[it] = MPI_Wtime() - t0;
    }
    if (rc == DEAR_OK)
        rc = dear_flush(ctx);
    double wall = MPI_Wtime() - wall0;
    dear_get_stats(ctx, &s1);
    double cpu = s1.progress_cpu_s - cpu0;
    int frc = dear_finalize(&ctx);
    if (rc == DEAR_OK)
        rc = frc;
    if (rc != DEAR_OK) {
        free(t);
        fprintf(stderr, "dear-overhead: %s/%s failed: %s\n", sched, fusion, dear_status_string(rc));
        return rc;
    }
    snprintf(row->mode, sizeof row->mode, "%s/%s", sched, fusion);
    row->med_us = median_us(t, iters);
    double shares[2] = { 100 * cpu / wall, 100 * idle_cpu / idle_s }, maxs[2];
    MPI_Allreduce(shares, maxs, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    row->cpu_share = maxs[0];
    row->idle_share = maxs[1];
    free(t);
    unsetenv("DEAR_SCHEDULE");
    unsetenv("DEAR_FUSION");
    return DEAR_OK;
}

static void usage(void)
{
    printf("usage: mpirun -np P dear-overhead [--tensors N] [--count C] [--iters I] [--warmup W]\n"
           "                                 [--compute-us U] [--idle S] [--csv FILE]\n"
           "Per-iteration time of libdear's schedules against plain MPI_Allreduce loops for N tensors\n"
           "of C float32 each (defaults 200 x 256); progress-thread CPU share while\n"
           "iterating and while idle for S seconds (default 1). --compute-us: U us of arithmetic per\n"
           "layer forward and 2U backward (default 0), to see overlap. Table on stdout, CSV to FILE.\n");
}

int main(int argc, char **argv)
{
    const char *csv = NULL;
    int provided;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage();
            return 0;
        } else if (i + 1 < argc && strcmp(argv[i], "--tensors") == 0) {
            ntensors = atoi(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--count") == 0) {
            count = atoi(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--iters") == 0) {
            iters = atoi(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--warmup") == 0) {
            warmup = atoi(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--compute-us") == 0) {
            compute_us = atof(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--idle") == 0) {
            idle_s = atof(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--csv") == 0) {
            csv = argv[++i];
        } else {
            fprintf(stderr, "dear-overhead: unknown argument '%s'\n", argv[i]);
            usage();
            return 2;
        }
    }
    if (ntensors < 1 || count < 1 || iters < 1 || warmup < 0 || idle_s < 0 || compute_us < 0) {
        fprintf(stderr, "dear-overhead: --tensors, --count and --iters must be >= 1, --warmup, --idle and "
                        "--compute-us >= 0\n");
        return 2;
    }
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    float *arena = calloc((size_t)ntensors * (size_t)count, sizeof *arena);

    row_t rows[10];
    int nrows = 0, rc = 0;
    double plain = run_plain(arena), per_tensor = run_mpi(arena, 0), fused = run_mpi(arena, 1);
    snprintf(rows[nrows].mode, sizeof rows[0].mode, "plain");
    rows[nrows].med_us = plain;
    rows[nrows++].cpu_share = rows[0].idle_share = -1;
    snprintf(rows[nrows].mode, sizeof rows[0].mode, "mpi-per-tensor");
    rows[nrows].med_us = per_tensor;
    rows[nrows++].cpu_share = rows[1].idle_share = -1;
    snprintf(rows[nrows].mode, sizeof rows[0].mode, "mpi-fused");
    rows[nrows].med_us = fused;
    rows[nrows++].cpu_share = rows[2].idle_share = -1;
    static const char *const cfg[][2] = {
        { "dear", "threshold" }, { "dear", "none" }, { "wfbp", "threshold" }, { "wfbp", "none" }, { "sync", "threshold" },
    };
    for (int c = 0; c < 5 && rc == 0; c++)
        if (run_dear(arena, cfg[c][0], cfg[c][1], &rows[nrows]) == DEAR_OK)
            nrows++;
        else
            rc = 1;

    if (rank == 0) {
        printf("dear-overhead: %d rank(s), %d tensors x %d float32 (%d bytes each), %d iterations (median, "
               "slowest rank), compute %.0f us forward + %.0f us backward per layer\n",
               nranks, ntensors, count, count * 4, iters, compute_us, 2 * compute_us);
        int hooks = 2 * ntensors + 1;
        printf("%-16s %12s %12s %14s %12s %14s %12s\n", "mode", "us/iter", "us/hook", "vs per-tensor", "vs fused",
               "progress CPU%", "idle CPU%");
        for (int r = 0; r < nrows; r++) {
            printf("%-16s %12.1f %12.3f %13.2fx %11.2fx", rows[r].mode, rows[r].med_us,
                   (rows[r].med_us - plain) / hooks, rows[r].med_us / per_tensor, rows[r].med_us / fused);
            if (rows[r].cpu_share >= 0)
                printf(" %14.1f %12.2f\n", rows[r].cpu_share, rows[r].idle_share);
            else
                printf(" %14s %12s\n", "-", "-");
        }
        if (csv) {
            FILE *f = fopen(csv, "w");
            if (!f) {
                fprintf(stderr, "dear-overhead: cannot write %s\n", csv);
                rc = 1;
            } else {
                fprintf(f, "np,tensors,count,mode,us_per_iter,us_per_hook_over_plain,progress_cpu_pct,idle_cpu_pct\n");
                for (int r = 0; r < nrows; r++)
                    fprintf(f, "%d,%d,%d,%s,%.2f,%.4f,%.2f,%.3f\n", nranks, ntensors, count, rows[r].mode,
                            rows[r].med_us, (rows[r].med_us - plain) / (2 * ntensors + 1), rows[r].cpu_share,
                            rows[r].idle_share);
                fclose(f);
            }
        }
    }
    free(arena);
    MPI_Finalize();
    return rc;
}
