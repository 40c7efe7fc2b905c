/*
 * libdear with CUDA gradients, under mpirun (Check, CK_FORK=no), built twice from this source:
 * test_gpu against the emulated runtime and NCCL (tests/cuda/emu, -DCUEMU_BUILD, with the
 * backend's emulated kernels) and test_gpu_real against libcudart and libnccl (exit 77 without
 * a GPU). A small model's parameters and gradients live on the device; its layers are kernels
 * on the application's compute stream (gpu_kern.h), its updates kernels the update callbacks
 * launch on the stream they are given. Every rank computes the same training on the host in
 * float64 with MPI_Allreduce, and at the end:
 *   - the parameters equal the reference's (float32 to 1e-5, 16-bit gradients to their
 *     rounding), under every schedule, with the threshold, none and dp planners, clipping,
 *     accumulation, unused tensors and tensors cut into chunks;
 *   - what each forward pass read equals the reference's parameters of that iteration: a
 *     forward never reads a parameter before its update has run;
 *   - the last layer's gradient kernel is slow (it is still running when the host reports the
 *     layer done), and the results are the new values, never stale ones;
 *   - each update ran once per iteration, on the application's stream;
 *   - the emulator flagged nothing (no pageable async copy, no wait on an unrecorded event).
 * And: the hooks return in microseconds while the device is busy (the figure is printed); bad
 * input fails clearly (a host pointer as CUDA and the reverse, a pointer of another device,
 * mixed kinds, sparse CUDA tensors, sharded updates of CUDA memory, NCCL broken or refused for
 * ranks sharing a GPU).
 * The .mpi files choose DEAR_CUDA_TRANSPORT (GPU_TEST_TRANSPORT says which the context must
 * report) and CUEMU_DEVICES (one per rank for nccl, one for all for staged).
 */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "include/dear.h"
#include "tests/cuda/cuda_check.h"
#include "tests/cuda/gpu_kern.h"
#include "tests/mpi/suite_run.h"
#ifdef CUEMU_BUILD
#include "cuemu.h"
#endif

static int g_rank, g_size, g_ndev;
static cudaStream_t g_stream;

#ifdef CUEMU_BUILD
#define FLAGS_NOW() cuemu_flag_count()
#else
#define FLAGS_NOW() 0UL
#endif

/* ---- the model: NT tensors, tensor t in layer t ---- */

#define NT 5
#define ITERS 6
#define LR 0.0625f
static const size_t counts[NT] = { 33, 1000, 257, 4096, 7 };

typedef struct {
    const char *sched, *fusion;
    dear_dtype_t dt;
    double clip;                /* 0: off */
    int micro;                  /* micro-batches per iteration (accumulation) */
    int nograd;                 /* tensor 2 has no gradient on rank 0 in odd iterations */
    const char *partition;      /* DEAR_PARTITION, NULL: the default */
    const char *compress;       /* DEAR_COMPRESS ("+ef": with DEAR_COMPRESS_EF), NULL: none */
} case_t;

typedef struct {
    const case_t *c;
    float *w;                   /* device: the parameters, one arena */
    void *g;                    /* device: the gradients, one arena of c->dt */
    double *cks;                /* device: what forward it of layer l read, [it * NT + l] */
    size_t off[NT + 1];
    float *w0;                  /* host: the initial parameters */
    long calls[NT];
    int bad_stream;
} model_t;

typedef struct {
    model_t *m;
    int t;
} tensor_arg_t;
static tensor_arg_t targs[NT];

static size_t esize(dear_dtype_t t) { return t == DEAR_FLOAT32 ? 4 : 2; }

static int sgd(const dear_update_info_t *u)
{
    tensor_arg_t *a = u->arg;
    model_t *m = a->m;
    m->calls[a->t]++;
    if (u->stream != (void *)g_stream || u->mem != DEAR_MEM_CUDA)
        m->bad_stream = 1;
    return tk_sgd((cudaStream_t)u->stream, m->w + m->off[a->t], u->grad, u->dtype, u->count, LR) == cudaSuccess ? 0 : 1;
}

static void model_init(model_t *m, const case_t *c)
{
    memset(m, 0, sizeof *m);
    m->c = c;
    for (int t = 0; t < NT; t++)
        m->off[t + 1] = m->off[t] + counts[t];
    size_t n = m->off[NT];
    m->w0 = malloc(n * sizeof *m->w0);
    ck_assert_ptr_nonnull(m->w0);
    for (size_t i = 0; i < n; i++)
        m->w0[i] = (float)cos(0.3 * (double)i);
    CK_CUDA(cudaMalloc((void **)&m->w, n * sizeof(float)));
    CK_CUDA(cudaMalloc(&m->g, n * esize(c->dt)));
    CK_CUDA(cudaMalloc((void **)&m->cks, ITERS * NT * sizeof(double)));
    CK_CUDA(cudaMemcpy(m->w, m->w0, n * sizeof(float), cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemset(m->g, 0, n * esize(c->dt)));
}

static void model_free(model_t *m)
{
    cudaFree(m->w);
    cudaFree(m->g);
    cudaFree(m->cks);
    free(m->w0);
}

static int has_grad(const case_t *c, int t, int r, long it) { return !(c->nograd && t == 2 && r == 0 && it % 2 == 1); }

/* The reference: the same training on the host in float64, the ranks' gradients summed with
 * MPI_Allreduce. ref_w gets the final parameters, ref_sum[it * NT + t] what forward it read. */
static void reference(const model_t *m, double *ref_w, double *ref_sum)
{
    const case_t *c = m->c;
    size_t n = m->off[NT];
    double *mine = malloc(n * sizeof *mine), *avg = malloc(n * sizeof *avg);
    ck_assert(mine && avg);
    for (size_t i = 0; i < n; i++)
        ref_w[i] = m->w0[i];
    for (long it = 0; it < ITERS; it++) {
        for (int t = 0; t < NT; t++) {
            double s = 0;
            for (size_t i = m->off[t]; i < m->off[t + 1]; i++)
                s += (float)ref_w[i];
            ref_sum[it * NT + t] = s;
        }
        for (int t = 0; t < NT; t++)
            for (size_t i = 0; i < counts[t]; i++) {
                double v = 0;
                for (int mb = 0; mb < c->micro && has_grad(c, t, g_rank, it); mb++)
                    v += tk_grad_value(t, g_rank, it, mb, i);
                mine[m->off[t] + i] = v;
            }
        MPI_Allreduce(mine, avg, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double sq = 0;
        for (size_t i = 0; i < n; i++) {
            avg[i] /= g_size;
            sq += avg[i] * avg[i];
        }
        double coef = 1;
        if (c->clip > 0) {
            coef = c->clip / (sqrt(sq) + 1e-6);
            coef = coef < 1 ? coef : 1;
        }
        for (size_t i = 0; i < n; i++)
            ref_w[i] -= LR * coef * avg[i];
    }
    free(mine);
    free(avg);
}

/* A context on g_stream with the model's tensors registered (t0, t1, ...), each stepped by sgd
 * when with_updates, else updated by nobody. */
static dear_ctx_t *register_model(model_t *m, int with_updates)
{
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_set_stream(ctx, (void *)g_stream), DEAR_OK);
    for (int t = 0; t < NT; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        targs[t] = (tensor_arg_t){ m, t };
        ck_assert_int_eq(dear_register(ctx, name, t, (char *)m->g + m->off[t] * esize(m->c->dt), counts[t], m->c->dt,
                                       DEAR_MEM_CUDA, with_updates ? sgd : NULL, with_updates ? &targs[t] : NULL),
                         DEAR_OK);
    }
    return ctx;
}

static dear_ctx_t *setup(model_t *m)
{
    const case_t *c = m->c;
    setenv("DEAR_SCHEDULE", c->sched, 1);
    setenv("DEAR_FUSION", c->fusion, 1);
    setenv("DEAR_CALIBRATE", "off", 1); /* the preset prices the plans: quick, the same everywhere */
    setenv("DEAR_WARMUP_ITERS", "2", 1);
    setenv("DEAR_VERIFY_ITERS", "0", 1);
    if (c->partition)
        setenv("DEAR_PARTITION", c->partition, 1);
    else
        unsetenv("DEAR_PARTITION");
    char comp[16];
    snprintf(comp, sizeof comp, "%.4s", c->compress ? c->compress : "none");
    setenv("DEAR_COMPRESS", comp, 1);
    setenv("DEAR_COMPRESS_EF", c->compress && strstr(c->compress, "+ef") ? "1" : "0", 1);
    dear_ctx_t *ctx = register_model(m, 1);
    if (c->clip > 0)
        ck_assert_int_eq(dear_set_clip_norm(ctx, c->clip), DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    const char *want = getenv("GPU_TEST_TRANSPORT");
    if (want && *want)
        ck_assert_msg(strcmp(dear_transport(ctx), want) == 0, "the context runs on %s, not %s", dear_transport(ctx),
                      want);
    return ctx;
}

/* One iteration as an application runs it: forward kernels after forward_begin, backward
 * kernels and then backward_done, the last layer's gradient kernel slow. */
static void iterate(dear_ctx_t *ctx, model_t *m, long it)
{
    const case_t *c = m->c;
    for (int mb = 0; mb < c->micro; mb++) {
        if (c->micro > 1)
            ck_assert_int_eq(dear_set_mode(ctx, mb < c->micro - 1 ? DEAR_MODE_ACCUMULATE : DEAR_MODE_TRAIN), DEAR_OK);
        for (int t = 0; t < NT; t++) {
            ck_assert_int_eq(dear_forward_begin(ctx, t), DEAR_OK);
            if (mb == 0)
                CK_CUDA(tk_sum(g_stream, m->w + m->off[t], counts[t], m->cks + it * NT + t));
        }
        for (int t = NT - 1; t >= 0; t--) {
            void *g = (char *)m->g + m->off[t] * esize(c->dt);
            if (has_grad(c, t, g_rank, it))
                CK_CUDA(tk_grad(g_stream, c->dt, g, counts[t], t, g_rank, it, mb, mb > 0, t == NT - 1 ? 3000 : 0));
            else
                ck_assert_int_eq(dear_no_grad(ctx, t), DEAR_OK);
            ck_assert_int_eq(dear_backward_done(ctx, t), DEAR_OK);
        }
        ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    }
}

static void run_case(const case_t *c)
{
    model_t m;
    model_init(&m, c);
    unsigned long flags0 = FLAGS_NOW();
    dear_ctx_t *ctx = setup(&m);
    for (long it = 0; it < ITERS; it++)
        iterate(ctx, &m, it);
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    CK_CUDA(cudaStreamSynchronize(g_stream));
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);

    size_t n = m.off[NT];
    float *w = malloc(n * sizeof *w);
    double *cks = malloc(ITERS * NT * sizeof *cks), *ref_w = malloc(n * sizeof *ref_w),
           *ref_sum = malloc(ITERS * NT * sizeof *ref_sum);
    ck_assert(w && cks && ref_w && ref_sum);
    CK_CUDA(cudaMemcpy(w, m.w, n * sizeof *w, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(cks, m.cks, ITERS * NT * sizeof *cks, cudaMemcpyDeviceToHost));
    reference(&m, ref_w, ref_sum);
    /* float32 gradients: every sum exact, the averaging and clipping rounded; 16-bit ones are
     * averaged in their own precision by NCCL. Compressed ones: the small integers and their sums
     * are exact in 16 bits, and so is the average where 1/P is a power of two and nothing clips;
     * otherwise the all-gather rounds it (2^-9 of a gradient of at most 4, each iteration). int8
     * moves each gradient by up to half a block scale (4/254) per phase, LR times that per
     * iteration: 6 * LR * 2 * 4/254 < 1.2e-2. */
    int pow2 = (g_size & (g_size - 1)) == 0, int8 = c->compress && strncmp(c->compress, "int8", 4) == 0;
    double tol = c->dt != DEAR_FLOAT32                     ? 2e-2
                 : int8                                     ? 1.2e-2
                 : !c->compress || (pow2 && c->clip == 0) ? 1e-5
                                                            : 4e-3;
    char what[160];
    snprintf(what, sizeof what, "%s/%s %s%s%s clip %g micro %d nograd %d part %s, np %d on %s", c->sched, c->fusion,
             c->dt == DEAR_FLOAT32 ? "float32" : "bfloat16", c->compress ? " compressed " : "",
             c->compress ? c->compress : "", c->clip, c->micro, c->nograd,
             c->partition ? c->partition : "-", g_size, getenv("DEAR_CUDA_TRANSPORT") ? getenv("DEAR_CUDA_TRANSPORT") : "auto");
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs(w[i] - ref_w[i]) <= tol * (1 + fabs(ref_w[i])))) {
            if (bad++ < 3)
                fprintf(stderr, "rank %d %s: parameter %zu is %.7g, the reference %.7g\n", g_rank, what, i, w[i],
                        ref_w[i]);
        }
    for (int k = 0; k < ITERS * NT; k++)
        if (!(fabs(cks[k] - ref_sum[k]) <= tol * (1 + fabs(ref_sum[k])) * (double)counts[k % NT])) {
            if (bad++ < 6)
                fprintf(stderr, "rank %d %s: forward %d of layer %d read parameters summing to %.9g, the reference "
                                "%.9g (read before the update?)\n",
                        g_rank, what, k / NT, k % NT, cks[k], ref_sum[k]);
        }
    for (int t = 0; t < NT; t++)
        if (m.calls[t] != ITERS && bad++ < 9)
            fprintf(stderr, "rank %d %s: tensor %d updated %ld times in %d iterations\n", g_rank, what, t, m.calls[t],
                    ITERS);
    int all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    ck_assert_msg(all == 0, "%s: parameters or forward reads differ from the MPI_Allreduce reference (stderr)", what);
    ck_assert_msg(!m.bad_stream, "%s: an update was not told the application's stream", what);
    ck_assert_msg(FLAGS_NOW() == flags0, "%s: the emulator flagged %lu misuse(s) (stderr)", what, FLAGS_NOW() - flags0);
    free(w);
    free(cks);
    free(ref_w);
    free(ref_sum);
    model_free(&m);
}

static const case_t cases[] = {
    { "dear", "threshold", DEAR_FLOAT32, 0, 1, 0, NULL, NULL },
    { "dear", "none", DEAR_FLOAT32, 0, 1, 0, NULL, NULL },
    { "dear", "dp", DEAR_FLOAT32, 0, 1, 0, NULL, NULL },
    { "wfbp", "threshold", DEAR_FLOAT32, 0, 1, 0, NULL, NULL },
    { "wfbp", "none", DEAR_FLOAT32, 0, 1, 0, NULL, NULL },
    { "sync", "threshold", DEAR_FLOAT32, 0, 1, 0, NULL, NULL },
    { "dear", "threshold", DEAR_BFLOAT16, 0, 1, 0, NULL, NULL },
    { "wfbp", "threshold", DEAR_BFLOAT16, 0, 1, 0, NULL, NULL },
    { "dear", "none", DEAR_FLOAT32, 1.5, 1, 0, NULL, NULL },
    { "wfbp", "threshold", DEAR_FLOAT32, 1.5, 1, 0, NULL, NULL },
    { "dear", "threshold", DEAR_FLOAT32, 0, 2, 0, NULL, NULL },
    { "dear", "none", DEAR_FLOAT32, 0, 1, 1, NULL, NULL },
    { "dear", "dp", DEAR_FLOAT32, 0, 1, 0, "1k", NULL },
    { "wfbp", "none", DEAR_FLOAT32, 0, 1, 0, "1k", NULL },
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

START_TEST(test_train) { run_case(&cases[_i]); }
END_TEST

/* The hooks never wait for the GPU: with 200 ms of GPU work queued ahead of every iteration and
 * no synchronisation between iterations, backward_done returns at once, and so does the next
 * iteration's forward_begin under nccl, whose all-gathers are ordered on the GPU; staged ones
 * run on the host behind the copies, so there forward_begin waits for them (reported only). */
START_TEST(test_hooks_async)
{
    static const case_t c = { "dear", "threshold", DEAR_FLOAT32, 0, 1, 0, NULL, NULL };
    model_t m;
    model_init(&m, &c);
    dear_ctx_t *ctx = setup(&m);
    iterate(ctx, &m, 0);
    CK_CUDA(cudaStreamSynchronize(g_stream));
    int nccl = strcmp(dear_transport(ctx), "nccl") == 0;
    double worst[2] = { 0, 0 }, total[2] = { 0, 0 }; /* [0] forward_begin, [1] backward_done */
    int n[2] = { 0, 0 }, busy = 1;
    for (long it = 1; it < 4; it++) {
        CK_CUDA(tk_grad(g_stream, DEAR_FLOAT32, m.g, 1, 0, g_rank, it, 0, 0, 200000));
        for (int t = 0; t < NT; t++) {
            double t0 = MPI_Wtime();
            ck_assert_int_eq(dear_forward_begin(ctx, t), DEAR_OK);
            double d = MPI_Wtime() - t0;
            worst[0] = d > worst[0] ? d : worst[0];
            total[0] += d;
            n[0]++;
            CK_CUDA(tk_sum(g_stream, m.w + m.off[t], counts[t], m.cks + it * NT + t));
        }
        for (int t = NT - 1; t >= 0; t--) {
            CK_CUDA(tk_grad(g_stream, c.dt, (char *)m.g + m.off[t] * 4, counts[t], t, g_rank, it, 0, 0, 0));
            double t0 = MPI_Wtime();
            ck_assert_int_eq(dear_backward_done(ctx, t), DEAR_OK);
            double d = MPI_Wtime() - t0;
            worst[1] = d > worst[1] ? d : worst[1];
            total[1] += d;
            n[1]++;
        }
        ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
        busy &= cudaStreamQuery(g_stream) == cudaErrorNotReady; /* the host is ahead of the GPU */
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    CK_CUDA(cudaStreamSynchronize(g_stream));
    if (g_rank == 0)
        printf("hooks with 200 ms of GPU work ahead (np %d, %s): forward_begin mean %.1f us, slowest %.1f us; "
               "backward_done mean %.1f us, slowest %.1f us\n",
               g_size, dear_transport(ctx), 1e6 * total[0] / n[0], 1e6 * worst[0], 1e6 * total[1] / n[1],
               1e6 * worst[1]);
    ck_assert_msg(nccl ? busy : 1, "the GPU was idle at backward_end: the hooks waited for it");
    ck_assert_msg(worst[1] < 0.05, "a backward_done took %.1f ms while the GPU was busy: it waited for it",
                  1e3 * worst[1]);
    ck_assert_msg(!nccl || worst[0] < 0.05, "a forward_begin took %.1f ms while the GPU was busy (nccl)",
                  1e3 * worst[0]);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);
}
END_TEST

static char log_buf[8192];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER; /* the progress thread logs too */

static void log_sink(const char *line, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&log_lock);
    size_t n = strlen(log_buf);
    snprintf(log_buf + n, sizeof log_buf - n, "%s", line);
    pthread_mutex_unlock(&log_lock);
}

static void log_capture_start(void)
{
    log_buf[0] = '\0';
    dear_log_set_sink(log_sink, NULL);
}

static void log_capture_stop(void) { dear_log_set_sink(NULL, NULL); }

/* Registration of the wrong kind of memory, and set-ups that cannot work, fail clearly. */
START_TEST(test_bad_input)
{
    dear_ctx_t *ctx = NULL;
    float host[8];
    void *dev = NULL;
    CK_CUDA(cudaMalloc(&dev, 64));
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "h", 0, host, 8, DEAR_FLOAT32, DEAR_MEM_CUDA, NULL, NULL), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_register(ctx, "d", 0, dev, 8, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_ERR_ARG);
    /* The whole range must be one allocation: 17 floats from a 64-byte buffer is not. */
    ck_assert_int_eq(dear_register(ctx, "long", 0, dev, 17, DEAR_FLOAT32, DEAR_MEM_CUDA, NULL, NULL), DEAR_ERR_ARG);
    /* A count whose byte count wraps (to 400) is refused for its size, before the device is asked
     * about the wrapped range. */
    log_capture_start();
    int rc = dear_register(ctx, "wrap", 0, dev, SIZE_MAX / 4 + 1 + 100, DEAR_FLOAT32, DEAR_MEM_CUDA, NULL, NULL);
    log_capture_stop();
    ck_assert_int_eq(rc, DEAR_ERR_ARG);
    ck_assert_msg(strstr(log_buf, "more than the address space holds") && !strstr(log_buf, "400 bytes"),
                  "a wrapped byte count was not refused for its size: %s", log_buf);
    if (g_ndev > 1) {
        int cur;
        void *other = NULL;
        CK_CUDA(cudaGetDevice(&cur));
        CK_CUDA(cudaSetDevice((cur + 1) % g_ndev));
        CK_CUDA(cudaMalloc(&other, 64));
        CK_CUDA(cudaSetDevice(cur));
        ck_assert_int_eq(dear_register(ctx, "o", 0, other, 8, DEAR_FLOAT32, DEAR_MEM_CUDA, NULL, NULL), DEAR_ERR_ARG);
        CK_CUDA(cudaFree(other));
    }
    /* Mixed kinds in one context. */
    ck_assert_int_eq(dear_register(ctx, "d", 0, dev, 8, DEAR_FLOAT32, DEAR_MEM_CUDA, NULL, NULL), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "h", 1, host, 8, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_ERR_UNSUPPORTED);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    /* A CUDA tensor declared sparse. */
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "d", 0, dev, 8, DEAR_FLOAT32, DEAR_MEM_CUDA, NULL, NULL), DEAR_OK);
    ck_assert_int_eq(dear_register_sparse(ctx, 0, 4), DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_ERR_UNSUPPORTED);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    /* Sharded updates of CUDA memory: parameters must be the gradient's kind, and commit refuses. */
    void *dparam = NULL;
    CK_CUDA(cudaMalloc(&dparam, 64));
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "d", 0, dev, 8, DEAR_FLOAT32, DEAR_MEM_CUDA, NULL, NULL), DEAR_OK);
    ck_assert_int_eq(dear_set_param(ctx, 0, host), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_set_param(ctx, 0, dparam), DEAR_OK);
    ck_assert_int_eq(dear_set_shard(ctx, DEAR_SHARD_ON), DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_ERR_UNSUPPORTED);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    CK_CUDA(cudaFree(dparam));
    CK_CUDA(cudaFree(dev));
}
END_TEST

/* Compressed gradients (DEAR_COMPRESS, bf16 under dear with clipping, fp16 under wfbp with tensors
 * cut, fp16 with error feedback under sync; int8 with its feedback under dear, whose all-gathers
 * gather several buckets, and without under wfbp's all-reduces of cut tensors): the parameters
 * within the format's rounding of the reference, under NCCL (its collectives in the 16-bit type,
 * int8 chunks packed and unpacked by device kernels around its all-to-all and all-gather, all on
 * the communication stream) and staged (dear's collectives on the host copies). */
START_TEST(test_compressed)
{
    static const case_t cc[] = { { "dear", "threshold", DEAR_FLOAT32, 1.5, 1, 0, NULL, "bf16" },
                                 { "wfbp", "none", DEAR_FLOAT32, 0, 1, 0, "1k", "fp16" },
                                 { "sync", "threshold", DEAR_FLOAT32, 0, 1, 0, NULL, "fp16+ef" },
                                 { "dear", "threshold", DEAR_FLOAT32, 0, 1, 0, NULL, "int8+ef" },
                                 { "wfbp", "none", DEAR_FLOAT32, 1.5, 1, 0, "1k", "int8" } };
    /* int8 under dear from a plan whose all-gather groups straddle buckets, so that they gather
     * several blocks, one of them early. */
    char plan[64];
    snprintf(plan, sizeof plan, "/tmp/test_gpu_%d.plan", (int)getpid());
    FILE *f = fopen(plan, "w");
    ck_assert(f != NULL);
    fprintf(f, "dear-plan 2\nplanner dp\ntensors %d\n", NT);
    for (int t = 0; t < NT; t++)
        fprintf(f, "tensor %d t%d %d %zu\n", t, t, t, counts[t] * sizeof(float));
    fprintf(f, "units %d\nrs 3 0 2 4\nag 2 0 3\nearly 1\nend\n", NT);
    fclose(f);
    for (int k = 0; k < (int)(sizeof cc / sizeof cc[0]); k++) {
        if (k == 3)
            setenv("DEAR_PLAN_FILE", plan, 1);
        run_case(&cc[k]);
        unsetenv("DEAR_PLAN_FILE");
    }
    unlink(plan);
    setenv("DEAR_COMPRESS", "none", 1);
    setenv("DEAR_COMPRESS_EF", "0", 1);
}
END_TEST

/* DEAR_CHECK_FINITE=warn on device tensors: the last rank writes a NaN into tensor 2's gradient on
 * its stream in iteration 3; that rank, and no other, names the tensor and the iteration (under
 * NCCL from the squares read once the stream has run them, staged at once with the count). */
START_TEST(test_finite)
{
    static const case_t c = { "dear", "threshold", DEAR_FLOAT32, 0, 1, 0, NULL, NULL };
    model_t m;
    model_init(&m, &c);
    float *nan_h = NULL;
    CK_CUDA(cudaMallocHost((void **)&nan_h, sizeof *nan_h));
    *nan_h = NAN;
    setenv("DEAR_CHECK_FINITE", "warn", 1);
    dear_ctx_t *ctx = setup(&m);
    log_capture_start();
    for (long it = 0; it < ITERS; it++) {
        for (int t = 0; t < NT; t++)
            ck_assert_int_eq(dear_forward_begin(ctx, t), DEAR_OK);
        for (int t = NT - 1; t >= 0; t--) {
            float *g = (float *)m.g + m.off[t];
            CK_CUDA(tk_grad(g_stream, DEAR_FLOAT32, g, counts[t], t, g_rank, it, 0, 0, 0));
            if (t == 2 && it == 3 && g_rank == g_size - 1)
                CK_CUDA(cudaMemcpyAsync(g + 5, nan_h, sizeof *nan_h, cudaMemcpyHostToDevice, g_stream));
            ck_assert_int_eq(dear_backward_done(ctx, t), DEAR_OK);
        }
        ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    log_capture_stop();
    unsetenv("DEAR_CHECK_FINITE");
    char want[96];
    snprintf(want, sizeof want, "rank %d: the gradient of tensor 't2' (layer 2, elements 0..", g_rank);
    const char *at = strstr(log_buf, want);
    int mine = g_rank == g_size - 1;
    ck_assert_msg(!!at == mine && (!at || strstr(at, "in iteration 3, before its reduce-scatter")),
                  "rank %d (%s): %s", g_rank, mine ? "made the NaN" : "did not", log_buf);
    ck_assert_msg(strstr(log_buf, "tensor 't0'") == NULL && strstr(log_buf, "tensor 't1'") == NULL,
                  "a finite tensor was reported: %s", log_buf);
    cudaFreeHost(nan_h);
    model_free(&m);
}
END_TEST

/* DEAR_CUDA_TRANSPORT=nccl where it cannot run (GPU_TEST_EXPECT=shared: ranks share a GPU;
 * =broken: CUEMU_NCCL=broken) fails commit on every rank, naming why; auto runs staged. */
START_TEST(test_nccl_refused)
{
    const char *why = getenv("GPU_TEST_EXPECT");
    if (why == NULL || g_size < 2)
        return;
    static const case_t c = { "dear", "threshold", DEAR_FLOAT32, 0, 1, 0, NULL, NULL };
    model_t m;
    model_init(&m, &c);
    setenv("DEAR_CUDA_TRANSPORT", "nccl", 1);
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "w", 0, m.g, 8, DEAR_FLOAT32, DEAR_MEM_CUDA, NULL, NULL), DEAR_OK);
    int rc = dear_commit(ctx);
    char err[2048];
    dear_last_error(err, sizeof err);
    int want = strcmp(why, "shared") == 0 ? DEAR_ERR_UNSUPPORTED : DEAR_ERR_CUDA;
    ck_assert_msg(rc == want, "DEAR_CUDA_TRANSPORT=nccl with %s: %d", why, rc);
    ck_assert_msg(strstr(err, strcmp(why, "shared") == 0 ? "share GPU" : "NCCL") != NULL, "the error says: %s", err);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    setenv("DEAR_CUDA_TRANSPORT", "auto", 1);
    setenv("GPU_TEST_TRANSPORT", "mpi", 1);
    run_case(&c); /* auto goes on staged, over the context's host transport */
    model_free(&m);
}
END_TEST

/* --calib-oom: the last rank's device has too little memory for calibration's buffers (the
 * emulator's CUEMU_DEVICE_MEM_MB, set before the first CUDA call), the others enough. Commit
 * fails on every rank, the last naming the allocation and the others the rank it waits for; no
 * rank is left waiting for a collective the other never starts. */
START_TEST(test_calib_oom)
{
    static const case_t c = { "dear", "threshold", DEAR_FLOAT32, 0, 1, 0, NULL, NULL };
    model_t m;
    model_init(&m, &c);
    setenv("DEAR_CALIBRATE", "auto", 1);
    unsetenv("DEAR_CALIBRATION_FILE");
    dear_ctx_t *ctx = register_model(&m, 0);
    log_capture_start();
    int rc = dear_commit(ctx);
    log_capture_stop();
    ck_assert_msg(rc != DEAR_OK, "rank %d: commit succeeded where a rank cannot calibrate", g_rank);
    const char *want = g_rank == g_size - 1 ? "cudaMalloc" : "another rank could not set up its buffers";
    ck_assert_msg(strstr(log_buf, want) != NULL, "rank %d: the log does not say '%s': %s", g_rank, want, log_buf);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);
}
END_TEST

int main(int argc, char **argv)
{
    mpi_suite_init(&argc, &argv, &g_rank, &g_size);
    int calib_oom = argc > 1 && strcmp(argv[1], "--calib-oom") == 0;
#ifdef CUEMU_BUILD
    if (calib_oom && g_rank == g_size - 1)
        setenv("CUEMU_DEVICE_MEM_MB", "4", 1); /* calibration needs 8 MiB at once */
#else
    if (calib_oom) { /* a real device's memory cannot be shrunk for one rank */
        MPI_Finalize();
        return 77;
    }
#endif
    if (cudaGetDeviceCount(&g_ndev) != cudaSuccess || g_ndev < 1) {
        if (g_rank == 0)
            fprintf(stderr, "test_gpu: no CUDA device: skipped\n");
        MPI_Finalize();
        return 77;
    }
    /* One GPU per rank where there are enough, else every rank on GPU rank % n. */
    cudaSetDevice(g_rank % g_ndev);
    cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
    Suite *s = suite_create("gpu");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 600);
    const char *only = argc > 1 ? argv[1] : "";
    TCase *tcc = NULL;
    if (strcmp(only, "--refused") == 0) {
        tcase_add_test(tc, test_nccl_refused);
    } else if (calib_oom) {
        tcase_add_test(tc, test_calib_oom);
    } else {
        tcase_add_loop_test(tc, test_train, 0, strcmp(only, "--quick") == 0 ? 3 : NCASES);
        tcase_add_test(tc, test_hooks_async);
        tcase_add_test(tc, test_bad_input);
        tcase_add_test(tc, test_finite);
        /* A case of its own, so that CK_RUN_CASE / CK_EXCLUDE_CASE can order it (cuda/gpu-check.sh). */
        tcc = tcase_create("compressed");
        tcase_set_timeout(tcc, 600);
        tcase_add_test(tcc, test_compressed);
    }
    suite_add_tcase(s, tc);
    if (tcc)
        suite_add_tcase(s, tcc);
    int rc = mpi_suite_run(s, g_rank);
    cudaStreamDestroy(g_stream);
    return rc;
}
