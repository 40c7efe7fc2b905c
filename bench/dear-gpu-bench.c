/*
 * dear-gpu-bench: the GPU figures of cuda/gpu-check.sh, from device buffers, under mpirun.
 *
 *   coll      busbw of an all-reduce of device memory, per size, four ways in the same run:
 *             dear's nccl transport (native collectives on the communication stream), dear's staged
 *             path (copies to pinned host buffers, dear's own collective, copies back), NCCL's own
 *             ncclAllReduce, and the baseline cudaMemcpy + MPI_Allreduce + cudaMemcpy
 *   overlap   OSU overlap% of a reduce-scatter (16 MiB by default) with a GPU kernel as the compute:
 *             t_pure alone, then the collective posted, a kernel of t_pure on the compute stream,
 *             both waited for: overlap = max(0, 100 - 100 (t_overall - t_compute) / t_pure)
 *   train     a profile's model (dear-bench's format) on the device: every layer a kernel of its
 *             profiled time on the compute stream, its gradients DEAR_MEM_CUDA in one arena,
 *             trained under dear, wfbp and sync in turn: median iteration time, time blocked in
 *             the hooks, and the hooks' host time
 * Built twice: against the real CUDA runtime and NCCL, and against the emulated ones
 * (tests/cuda/emu), so that the script that runs it in CI cannot rot. Prints a table and, with
 * --csv, one CSV per mode.
 */
#include <getopt.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h: ncclGroupStart() */
#include <nccl.h>
#pragma GCC diagnostic pop

#include "base/params.h"
#include "base/stats.h"
#include "collectives/coll.h"
#include "cuda/cuda.h"
#include "fusion/profile.h"
#include "include/dear.h"
#include "tests/cuda/gpu_kern.h"

static int g_rank, g_size;

#define DIE(...)                                                                               \
    do {                                                                                       \
        fprintf(stderr, "dear-gpu-bench: rank %d: ", g_rank);                                  \
        fprintf(stderr, __VA_ARGS__);                                                          \
        fprintf(stderr, "\n");                                                                 \
        MPI_Abort(MPI_COMM_WORLD, 2);                                                          \
    } while (0)
#define CU(call)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess)                                                                 \
            DIE("%s: %s", #call, cudaGetErrorString(e_));                                      \
    } while (0)

typedef struct {
    const char *mode, *csv, *profile;
    size_t min, max, overlap_bytes;
    int iters, train_iters;
    double time_scale;
} opts_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: mpirun -np P dear-gpu-bench [coll|overlap|train] [options]\n"
               "  --min BYTES / --max BYTES   coll: sizes, doubling (default 1m..256m)\n"
               "  --bytes BYTES               overlap: the reduce-scatter (default 16m)\n"
               "  --iters N                   timed repetitions per row, median reported (default 10)\n"
               "  --profile FILE              train: the model (dear-bench's profile format)\n"
               "  --time-scale X              train: layer times multiplied by X (default 1)\n"
               "  --train-iters N             train: iterations per schedule (default 20)\n"
               "  --csv FILE                  also write the rows as CSV (rank 0)\n"
               "Each rank takes GPU rank %% (devices); DEAR_CUDA_TRANSPORT is set per row.\n");
}

static double median(double *v, int n) { return dear_median(v, n); }

static double max_over_ranks(double t)
{
    double m = 0;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

/* ---- coll ---- */

typedef struct {
    int nccl;                   /* every rank has a GPU of its own: the NCCL rows run */
    dear_cuda_t *nccl_side;     /* dear's device side under nccl */
    dear_net_t *nccl_ep;
    ncclComm_t raw;             /* NCCL's own communicator, for the peer row */
    cudaStream_t stream;
    float *dev;
    float *pinned;
} coll_env_t;

/* Whether every rank has a GPU of its own (NCCL refuses two ranks on one): no host holds more
 * ranks than GPUs. */
static int gpu_each(void)
{
    MPI_Comm host;
    int local = 0, ndev = 0, crowded = 0, any = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &host);
    MPI_Comm_size(host, &local);
    MPI_Comm_free(&host);
    CU(cudaGetDeviceCount(&ndev));
    crowded = local > ndev;
    MPI_Allreduce(&crowded, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return !any;
}

static void coll_env(coll_env_t *e, size_t maxb)
{
    *e = (coll_env_t){ .nccl = gpu_each() };
    if (!e->nccl && g_rank == 0)
        printf("ranks share a GPU, which NCCL refuses: the NCCL rows are left out (n/a)\n");
    setenv("DEAR_CUDA_TRANSPORT", "nccl", 1);
    if (dear_params_load() != DEAR_OK)
        DIE("bad DEAR_* parameters");
    if (e->nccl) {
        if (dear_cuda_open(MPI_COMM_WORLD, DEAR_CUDA_T_NCCL, 60, &e->nccl_side) != DEAR_OK)
            DIE("dear's nccl transport could not set up");
        if (dear_net_open(dear_cuda_transport(e->nccl_side), MPI_COMM_WORLD, &e->nccl_ep) != DEAR_OK)
            DIE("dear_net_open");
        ncclUniqueId id;
        if (g_rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
            DIE("ncclGetUniqueId");
        MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (ncclCommInitRank(&e->raw, g_size, id, g_rank) != ncclSuccess)
            DIE("ncclCommInitRank: %s", ncclGetLastError(NULL));
    }
    CU(cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking));
    CU(cudaMalloc((void **)&e->dev, maxb));
    CU(cudaMemset(e->dev, 0, maxb));
    CU(cudaMallocHost((void **)&e->pinned, maxb));
}

static void coll_env_free(coll_env_t *e)
{
    cudaFree(e->dev);
    cudaFreeHost(e->pinned);
    cudaStreamDestroy(e->stream);
    if (e->nccl) {
        ncclCommDestroy(e->raw);
        dear_net_close(e->nccl_ep);
        dear_cuda_close(e->nccl_side);
    }
}

enum { W_NCCL, W_STAGED, W_RAW, W_BASE, W_COUNT };
static const char *const way_name[W_COUNT] = { "dear nccl", "dear staged", "NCCL ncclAllReduce",
                                               "cudaMemcpy+MPI_Allreduce" };

/* One all-reduce of n floats of device memory, one way, completed. */
static void allreduce_once(coll_env_t *e, int way, size_t n)
{
    size_t bytes = n * sizeof(float);
    dear_coll_args_t a = { .op = DEAR_COLL_ALLREDUCE, .dtype = DEAR_FLOAT32, .comm = MPI_COMM_WORLD,
                           .scale = 1.0 / g_size, .count = n };
    dear_coll_req_t *req = NULL;
    switch (way) {
    case W_NCCL:
        a.net = e->nccl_ep;
        a.recvbuf = e->dev;
        if (dear_coll_start(&a, &req) != DEAR_OK || dear_coll_wait(req) != DEAR_OK)
            DIE("dear nccl all-reduce");
        dear_coll_free(req);
        break;
    case W_STAGED: /* the staged transport's pipeline: down, dear's collective, up */
        CU(cudaMemcpyAsync(e->pinned, e->dev, bytes, cudaMemcpyDeviceToHost, e->stream));
        CU(cudaStreamSynchronize(e->stream));
        a.recvbuf = e->pinned;
        if (dear_coll_start(&a, &req) != DEAR_OK || dear_coll_wait(req) != DEAR_OK)
            DIE("dear host all-reduce");
        dear_coll_free(req);
        CU(cudaMemcpyAsync(e->dev, e->pinned, bytes, cudaMemcpyHostToDevice, e->stream));
        CU(cudaStreamSynchronize(e->stream));
        break;
    case W_RAW:
        if (ncclAllReduce(e->dev, e->dev, n, ncclFloat32, ncclAvg, e->raw, e->stream) != ncclSuccess)
            DIE("ncclAllReduce");
        CU(cudaStreamSynchronize(e->stream));
        break;
    case W_BASE:
        CU(cudaMemcpy(e->pinned, e->dev, bytes, cudaMemcpyDeviceToHost));
        MPI_Allreduce(MPI_IN_PLACE, e->pinned, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        CU(cudaMemcpy(e->dev, e->pinned, bytes, cudaMemcpyHostToDevice));
        break;
    }
}

static void run_coll(const opts_t *o, FILE *csv)
{
    coll_env_t e;
    coll_env(&e, o->max);
    double *t = malloc(sizeof(double) * (size_t)o->iters);
    if (g_rank == 0) {
        printf("all-reduce of device memory, %d ranks (busbw = bytes x 2(P-1)/P / time, median of %d)\n", g_size,
               o->iters);
        printf("%12s", "bytes");
        for (int w = 0; w < W_COUNT; w++)
            printf(" %26s", way_name[w]);
        printf("   (busbw GB/s)\n");
        if (csv)
            fprintf(csv, "bytes,way,time_us,busbw_GBps\n");
    }
    for (size_t b = o->min; b <= o->max; b *= 2) {
        size_t n = b / sizeof(float);
        double bw[W_COUNT];
        for (int w = 0; w < W_COUNT; w++) {
            bw[w] = -1;
            if (!e.nccl && (w == W_NCCL || w == W_RAW))
                continue;
            allreduce_once(&e, w, n); /* warm */
            for (int i = 0; i < o->iters; i++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                allreduce_once(&e, w, n);
                t[i] = max_over_ranks(MPI_Wtime() - t0);
            }
            double tm = median(t, o->iters);
            bw[w] = g_size > 1 ? (double)b * 2.0 * (g_size - 1) / g_size / tm / 1e9 : 0;
            if (g_rank == 0 && csv)
                fprintf(csv, "%zu,%s,%.3f,%.4f\n", b, way_name[w], 1e6 * tm, bw[w]);
        }
        if (g_rank == 0) {
            printf("%12zu", b);
            for (int w = 0; w < W_COUNT; w++)
                if (bw[w] < 0)
                    printf(" %26s", "n/a");
                else
                    printf(" %26.3f", bw[w]);
            printf("\n");
        }
    }
    free(t);
    coll_env_free(&e);
}

/* ---- overlap ---- */

/* One reduce-scatter of n floats, started; under nccl on the device, staged on pinned memory
 * after the copy down. Completed by rs_wait. */
static void rs_start(coll_env_t *e, int staged, size_t n, dear_coll_req_t **req)
{
    dear_coll_args_t a = { .op = DEAR_COLL_REDUCE_SCATTER, .dtype = DEAR_FLOAT32, .comm = MPI_COMM_WORLD,
                           .scale = 1.0 / g_size, .count = n };
    if (staged) {
        CU(cudaMemcpyAsync(e->pinned, e->dev, n * sizeof(float), cudaMemcpyDeviceToHost, e->stream));
        CU(cudaStreamSynchronize(e->stream));
        a.recvbuf = e->pinned;
    } else {
        a.net = e->nccl_ep;
        a.recvbuf = e->dev;
    }
    if (dear_coll_start(&a, req) != DEAR_OK)
        DIE("reduce-scatter start");
}

static void rs_wait(dear_coll_req_t *req)
{
    if (dear_coll_wait(req) != DEAR_OK)
        DIE("reduce-scatter");
    dear_coll_free(req);
}

static void run_overlap(const opts_t *o, FILE *csv)
{
    coll_env_t e;
    coll_env(&e, o->overlap_bytes);
    cudaStream_t compute;
    CU(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    void *scratch;
    CU(cudaMalloc(&scratch, 4));
    size_t n = o->overlap_bytes / sizeof(float);
    if (g_rank == 0 && csv)
        fprintf(csv, "way,bytes,t_pure_us,t_overall_us,t_compute_us,overlap_pct\n");
    for (int staged = !e.nccl; staged < 2; staged++) {
        double tp[64], to[64], tc[64];
        int it = o->iters < 64 ? o->iters : 64;
        for (int i = 0; i < it; i++) {
            dear_coll_req_t *req;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            rs_start(&e, staged, n, &req);
            rs_wait(req);
            tp[i] = max_over_ranks(MPI_Wtime() - t0);
        }
        double pure = median(tp, it);
        int spin_us = (int)(pure * 1e6);
        for (int i = 0; i < it; i++) {
            dear_coll_req_t *req;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            CU(tk_grad(compute, DEAR_FLOAT32, scratch, 1, 0, g_rank, 0, 0, 0, spin_us));
            rs_start(&e, staged, n, &req);
            double t1 = MPI_Wtime();
            rs_wait(req);
            CU(cudaStreamSynchronize(compute));
            to[i] = max_over_ranks(MPI_Wtime() - t0);
            (void)t1;
            double c0 = MPI_Wtime();
            CU(tk_grad(compute, DEAR_FLOAT32, scratch, 1, 0, g_rank, 0, 0, 0, spin_us));
            CU(cudaStreamSynchronize(compute));
            tc[i] = max_over_ranks(MPI_Wtime() - c0);
        }
        double overall = median(to, it), comp = median(tc, it);
        double ov = 100.0 - 100.0 * (overall - comp) / pure;
        ov = ov < 0 ? 0 : ov > 100 ? 100 : ov;
        if (g_rank == 0) {
            printf("overlap of a %zu-byte reduce-scatter (%s) with a GPU kernel: t_pure %.1f us, overall %.1f us, "
                   "compute %.1f us: %.1f%%\n",
                   o->overlap_bytes, staged ? "dear staged" : "dear nccl", 1e6 * pure, 1e6 * overall, 1e6 * comp,
                   ov);
            if (csv)
                fprintf(csv, "%s,%zu,%.1f,%.1f,%.1f,%.1f\n", staged ? "staged" : "nccl", o->overlap_bytes, 1e6 * pure,
                        1e6 * overall, 1e6 * comp, ov);
        }
    }
    cudaFree(scratch);
    cudaStreamDestroy(compute);
    coll_env_free(&e);
}

/* ---- train ---- */

typedef struct {
    float *w;
    size_t n;
} wslot_t;

static int train_update(const dear_update_info_t *u)
{
    const wslot_t *s = u->arg;
    return tk_sgd((cudaStream_t)u->stream, s->w, u->grad, u->dtype, u->count, 1e-6f) != cudaSuccess;
}

/* One schedule on the profile's model: median iteration, blocked time, mean hook time. */
static void train_one(const opts_t *o, const dear_profile_t *p, const char *sched, FILE *csv)
{
    setenv("DEAR_SCHEDULE", sched, 1);
    size_t total = 0;
    for (int t = 0; t < p->ntensors; t++)
        total += p->tensors[t].bytes / sizeof(float);
    float *g = NULL, *w = NULL;
    CU(cudaMalloc((void **)&g, total * sizeof(float) + 4));
    CU(cudaMalloc((void **)&w, total * sizeof(float) + 4));
    CU(cudaMemset(g, 0, total * sizeof(float)));
    CU(cudaMemset(w, 0, total * sizeof(float)));
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    wslot_t *slots = calloc((size_t)p->ntensors, sizeof *slots);
    dear_ctx_t *ctx = NULL;
    if (dear_init(MPI_COMM_WORLD, &ctx) != DEAR_OK || dear_set_stream(ctx, (void *)s) != DEAR_OK)
        DIE("dear_init");
    size_t off = 0;
    for (int t = 0; t < p->ntensors; t++) {
        size_t n = p->tensors[t].bytes / sizeof(float);
        slots[t] = (wslot_t){ w + off, n };
        if (dear_register(ctx, p->tensors[t].name, p->tensors[t].layer, g + off, n ? n : 1, DEAR_FLOAT32,
                          DEAR_MEM_CUDA, train_update, &slots[t]) != DEAR_OK)
            DIE("dear_register %s", p->tensors[t].name);
        off += n;
    }
    for (int l = 0; l < p->nlayers; l++)
        dear_register_layer(ctx, p->layers[l].id);
    if (dear_commit(ctx) != DEAR_OK)
        DIE("dear_commit");
    int iters = o->train_iters;
    /* hook_s: the hooks' host time; other_s: backward_end's and flush's (the other calls that can
     * block), so that the waits (the stats' blocked time) can be taken out of the hooks' time. */
    double *it_s = malloc(sizeof(double) * (size_t)iters), hook_s = 0, other_s = 0;
    long hooks = 0;
    for (int it = 0; it < iters; it++) {
        double t0 = MPI_Wtime();
        for (int l = 0; l < p->nlayers; l++) {
            double h = MPI_Wtime();
            dear_forward_begin(ctx, p->layers[l].id);
            hook_s += MPI_Wtime() - h;
            hooks++;
            CU(tk_grad(s, DEAR_FLOAT32, w, 1, 0, g_rank, it, 0, 1, (int)(1e6 * p->layers[l].fwd_s * o->time_scale)));
        }
        for (int l = p->nlayers - 1; l >= 0; l--) {
            CU(tk_grad(s, DEAR_FLOAT32, g, 1, 0, g_rank, it, 0, 1, (int)(1e6 * p->layers[l].bwd_s * o->time_scale)));
            double h = MPI_Wtime();
            dear_backward_done(ctx, p->layers[l].id);
            hook_s += MPI_Wtime() - h;
            hooks++;
        }
        double h = MPI_Wtime();
        dear_backward_end(ctx);
        other_s += MPI_Wtime() - h;
        CU(cudaStreamSynchronize(s)); /* an iteration ends when the GPU is done with it */
        it_s[it] = MPI_Wtime() - t0;
    }
    double h = MPI_Wtime();
    dear_flush(ctx);
    other_s += MPI_Wtime() - h;
    CU(cudaStreamSynchronize(s));
    dear_stats_t st;
    dear_get_stats(ctx, &st);
    /* The host work per hook, waits excluded (at least 0: the clocks differ a little). */
    double work_s = hook_s + other_s - st.blocked_s;
    work_s = work_s > 0 ? work_s / (double)(hooks + iters + 1) : 0;
    int skip = iters / 4; /* warm-up and plan switch */
    double med = median(it_s + skip, iters - skip);
    double med_max = max_over_ranks(med), blocked = max_over_ranks(st.blocked_s / iters);
    if (g_rank == 0) {
        printf("  %-5s %-8s iteration %9.3f ms   blocked %8.3f ms/iteration   hooks %6.1f us each, %6.1f us "
               "of work\n",
               sched, dear_transport(ctx), 1e3 * med_max, 1e3 * blocked, 1e6 * hook_s / (double)hooks, 1e6 * work_s);
        if (csv)
            fprintf(csv, "%s,%s,%d,%.4f,%.4f,%.2f,%.2f\n", p->model, sched, g_size, 1e3 * med_max, 1e3 * blocked,
                    1e6 * hook_s / (double)hooks, 1e6 * work_s);
    }
    dear_finalize(&ctx);
    free(it_s);
    free(slots);
    cudaStreamDestroy(s);
    cudaFree(g);
    cudaFree(w);
}

static void run_train(const opts_t *o, FILE *csv)
{
    if (o->profile == NULL)
        DIE("train needs --profile FILE");
    dear_profile_t p = { 0 };
    if (dear_prof_load(o->profile, &p) != DEAR_OK)
        DIE("cannot load the profile %s", o->profile);
    if (g_rank == 0) {
        printf("%s on %d rank(s), layer times x %g, %d iterations per schedule (median of the last 3/4)\n", p.model,
               g_size, o->time_scale, o->train_iters);
        if (csv)
            fprintf(csv, "model,schedule,nranks,iteration_ms,blocked_ms,hook_us,hook_work_us\n");
    }
    const char *scheds[] = { "dear", "wfbp", "sync" };
    for (int i = 0; i < 3; i++)
        train_one(o, &p, scheds[i], csv);
    dear_prof_free(&p);
}

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'k' || *end == 'K')
        v *= 1024;
    else if (*end == 'm' || *end == 'M')
        v *= 1024 * 1024;
    else if (*end == 'g' || *end == 'G')
        v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    opts_t o = { "coll", NULL, NULL, 1 << 20, 256u << 20, 16u << 20, 10, 20, 1.0 };
    static const struct option lo[] = { { "min", 1, 0, 'a' },   { "max", 1, 0, 'b' },         { "bytes", 1, 0, 'y' },
                                        { "iters", 1, 0, 'i' }, { "profile", 1, 0, 'p' },     { "time-scale", 1, 0, 's' },
                                        { "csv", 1, 0, 'c' },   { "train-iters", 1, 0, 't' }, { "help", 0, 0, 'h' },
                                        { 0, 0, 0, 0 } };
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'a': o.min = parse_bytes(optarg); break;
        case 'b': o.max = parse_bytes(optarg); break;
        case 'y': o.overlap_bytes = parse_bytes(optarg); break;
        case 'i': o.iters = atoi(optarg); break;
        case 'p': o.profile = optarg; break;
        case 's': o.time_scale = atof(optarg); break;
        case 'c': o.csv = optarg; break;
        case 't': o.train_iters = atoi(optarg); break;
        case 'h':
            if (g_rank == 0)
                usage(stdout);
            MPI_Finalize();
            return 0;
        default:
            if (g_rank == 0)
                usage(stderr);
            MPI_Finalize();
            return 2;
        }
    }
    if (optind < argc)
        o.mode = argv[optind];
    if (o.iters < 1 || o.train_iters < 4 || o.min < 4 || o.max < o.min || o.overlap_bytes < 4 * (size_t)g_size) {
        if (g_rank == 0)
            usage(stderr);
        MPI_Finalize();
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        if (g_rank == 0)
            fprintf(stderr, "dear-gpu-bench: no CUDA device\n");
        MPI_Finalize();
        return 77;
    }
    CU(cudaSetDevice(g_rank % ndev));
    if (dear_params_load() != DEAR_OK)
        DIE("bad DEAR_* parameters");
    FILE *csv = NULL;
    if (g_rank == 0 && o.csv && (csv = fopen(o.csv, "w")) == NULL)
        DIE("cannot write %s", o.csv);
    if (strcmp(o.mode, "coll") == 0)
        run_coll(&o, csv);
    else if (strcmp(o.mode, "overlap") == 0)
        run_overlap(&o, csv);
    else if (strcmp(o.mode, "train") == 0)
        run_train(&o, csv);
    else
        DIE("unknown mode '%s' (accepted: coll, overlap, train)", o.mode);
    if (csv)
        fclose(csv);
    MPI_Finalize();
    return 0;
}
