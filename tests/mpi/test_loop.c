/*
 * What a real training loop does, against a plain MPI_Allreduce loop computed in the same
 * program (Check, CK_FORK=no, under mpirun -np 1..5). A small model of float32 tensors with
 * parameter-less layers between them is trained with SGD with momentum; its gradient depends on
 * the parameters (so any wrong update changes everything after it), on the rank, the iteration
 * and the micro-batch. The reference sums every rank's gradient with MPI_Allreduce, averages,
 * clips, and updates with the learning rate of the iteration, each step written out. Under every
 * schedule, and under dear with a plan whose all-gather groups cut its buckets (two groups
 * early, during backward), the parameters must match it:
 *   lr       a learning-rate schedule read from dear_update_info_t.iteration
 *   clip     clipping by global norm (dear_set_clip_norm, DEAR_CLIP_NORM): parameters, and the
 *            norm each update is told
 *   accum    gradient accumulation over micro-batches (DEAR_MODE_ACCUMULATE), whose passes enter
 *            no profile
 *   frozen   tensors frozen before commit and in mid-run: unchanged, and fewer bytes sent
 *   nograd   tensors without a gradient on every rank or on one (dear_no_grad), with and
 *            without DEAR_FIND_UNUSED
 *   eval     evaluation forwards between iterations (DEAR_MODE_EVAL): no change to the
 *            parameters or the profile
 *   layers   parameter-less layers (dear_register_layer) are hooked and seen by the profile; a
 *            rank declaring other layers fails commit on every rank
 *   wait     update = NULL: dear_wait_grad gives the averaged gradient of one layer
 *   bf16     bfloat16 gradients whose float32 sums are exact: the update sees the float32 sum
 *            rounded once, bit for bit, at every rank count
 *   determ.  DEAR_DETERMINISTIC: two plans end on the same parameters bit for bit, also with
 *            compressed gradients, and with clipping by global norm (sharded or not)
 *   shard    sharded updates (dear_set_shard): each rank steps the momenta of its slices only,
 *            under every schedule and with the options above (float32), and the all-gathers
 *            bring every rank the same parameters as the reference; DEAR_SHARD_HOLD, where the
 *            program steps the slices after dear_backward_end; plan switches of online planning
 *            and auto's check, which must not move a slice (its momentum would be lost); bitwise
 *            the unsharded parameters under DEAR_DETERMINISTIC; the slices cover every element
 *            once, about 1/P per rank; bad use refused; with DEAR_SHARD_EARLY on and off, and
 *            under dear the slices stepped inside the backward hooks (with the cut plan's early
 *            all-gathers) exactly where no clipping, DEAR_FIND_UNUSED or DEAR_SHARD_HOLD is on
 *   wire16   float32 gradients compressed to float16 (DEAR_COMPRESS or dear_set_compress), whose
 *            partial sums are exact in 16 bits: the update sees the float32 average rounded once,
 *            bit for bit, and half the bytes travel; different settings on one rank fail commit
 *   ef       error feedback (DEAR_COMPRESS_EF): gradients too small for float16 get through
 *            over the iterations, and do not without it; the same for int8, whose feedback is on
 *            by default, with gradients under half a block scale
 */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/reduce.h"
#include "include/dear.h"
#include "runtime/rt.h"
#ifdef DEAR_TEST_MEM_DELAY
#include "tests/mpi/mem_delay.h"
#endif
#include "tests/mpi/suite_run.h"

static int rank, nranks;

/* ---- the model: NT tensors, tensor t in layer 2t, parameter-less layers 2t+1 ---- */

#define NT 6
#define ITERS 12
#define MU 0.9f

typedef enum { OPT_NONE = 0, OPT_CLIP = 1, OPT_ACCUM = 2, OPT_FREEZE = 4, OPT_NOGRAD = 8, OPT_EVAL = 16,
               OPT_BF16 = 32, OPT_FIND_UNUSED = 64, OPT_WAIT = 128, OPT_CLIP_ENV = 256, OPT_SHARD = 512,
               OPT_HOLD = 1024, OPT_ONLINE = 2048, OPT_WIRE16 = 4096, OPT_TINY = 8192, OPT_Q8 = 16384,
               OPT_NOEARLY = 32768, OPT_SLOW = 65536 } opt_t;

/* A slice an update callback noted under DEAR_SHARD_HOLD, stepped after dear_backward_end. */
typedef struct {
    int t;
    size_t off, n, pos;
    const float *g;
    long long it;
} note_t;

#define MAX_NOTES 64
#define MAX_SLICES 256

typedef struct {
    int opts;
    float *w, *v;               /* parameters and momenta, one arena each */
    void *g;                    /* gradients: one arena (float32, or bfloat16 with OPT_BF16) */
    size_t off[NT + 1];         /* element offsets */
    double norm[ITERS];         /* the norm the updates were told, per iteration */
    long calls[NT];
    long elems[NT];             /* OPT_SHARD: elements this rank updated */
    float *vs;                  /* OPT_SHARD: the momenta of this rank's slices only */
    size_t nshard;
    note_t notes[MAX_NOTES];    /* OPT_HOLD */
    int nnotes;
    double *total;              /* OPT_TINY, OPT_Q8: the averaged gradients added up over the iterations */
    int in_end;                 /* inside dear_backward_end */
    long early;                 /* OPT_SHARD: slice updates run before dear_backward_end was entered */
} model_t;

static const size_t counts[NT] = { 5, 301, 64, 1, 1200, 37 };

static float lr_of(long long it) { return 0.05f * (float)(it + 1) / (float)(it + 3); }

/* A micro-batch's gradient of element i of tensor t on a rank. With OPT_BF16 (OPT_WIRE16) the
 * values are multiples of 2^-10 under 2^-4, exact in bfloat16, summed exactly in float32 (and
 * in float16: their partial sums over up to 5 ranks need 9 bits). OPT_TINY: 2^-26, which float16
 * rounds to zero. OPT_Q8: 1 at every 16th element, else 2^-9, under half the int8 scale (1/254)
 * of any block holding a 1. */
static float grad_value(const model_t *m, int t, size_t i, int r, long long it, int micro)
{
    double d = sin(0.7 * (double)i + 1.3 * t + 0.37 * r + 0.11 * (double)it + 0.5 * micro);
    if (m->opts & OPT_TINY)
        return 0x1p-26f;
    if (m->opts & OPT_Q8)
        return i % 16 == 0 ? 1.0f : 0x1p-9f;
    if (m->opts & (OPT_BF16 | OPT_WIRE16))
        return (float)ldexp(round(ldexp(d, 6)), -10);
    return (float)(0.2 * d + 0.05 * tanh((double)m->w[m->off[t] + i]));
}

/* Does rank r have a gradient for tensor t in iteration it? (OPT_NOGRAD) Tensor 2 on no rank in
 * odd iterations, tensor 4 never on the last rank. */
static int has_grad(const model_t *m, int t, int r, long long it)
{
    if (!(m->opts & OPT_NOGRAD))
        return 1;
    if (t == 2 && it % 2 == 1)
        return 0;
    if (t == 4 && r == nranks - 1)
        return 0;
    return 1;
}

/* Frozen: tensor 1 from the start, tensor 3 from iteration FREEZE_AT on (OPT_FREEZE). */
#define FREEZE_AT 5
static int frozen(const model_t *m, int t, long long it)
{
    return (m->opts & OPT_FREEZE) && (t == 1 || (t == 3 && it >= FREEZE_AT));
}

static int micro_batches(const model_t *m) { return m->opts & OPT_ACCUM ? 3 : 1; }
static double max_norm(const model_t *m) { return m->opts & (OPT_CLIP | OPT_CLIP_ENV) ? 0.5 : 0; }

static void model_init(model_t *m, int opts)
{
    memset(m, 0, sizeof *m);
    m->opts = opts;
    for (int t = 0; t < NT; t++)
        m->off[t + 1] = m->off[t] + counts[t];
    size_t n = m->off[NT];
    m->w = calloc(n, sizeof *m->w);
    m->v = calloc(n, sizeof *m->v);
    m->g = calloc(n, sizeof(float));
    m->total = calloc(n, sizeof(double));
    ck_assert(m->w && m->v && m->g && m->total);
    for (size_t i = 0; i < n; i++)
        m->w[i] = (float)cos(0.3 * (double)i);
    for (int k = 0; k < ITERS; k++)
        m->norm[k] = -1;
}

static void model_free(model_t *m)
{
    free(m->w);
    free(m->v);
    free(m->g);
    free(m->vs);
    free(m->total);
}

/* OPT_SHARD: one step of elements [off, off + n) of tensor t, their momenta at pos in vs. */
static void sgd_slice(model_t *m, int t, size_t off, size_t n, size_t pos, const float *g, long long it)
{
    float lr = lr_of(it);
    for (size_t i = 0; i < n; i++) {
        float *v = &m->vs[pos + i];
        *v = MU * *v + g[i];
        m->w[m->off[t] + off + i] -= lr * *v;
    }
    m->elems[t] += (long)n;
}

/* OPT_SHARD: the callback of a slice, which must point into the tensor's gradient and parameters. */
static int update_slice(model_t *m, const dear_update_info_t *u)
{
    int t = u->tensor;
    if (u->tensor_count != counts[t] || u->offset + u->count > counts[t] || u->shard_offset + u->count > m->nshard ||
        u->param != m->w + m->off[t] + u->offset || u->grad != (float *)m->g + m->off[t] + u->offset)
        return 1;
    m->norm[u->iteration] = u->grad_norm;
    m->early += !m->in_end;
    if (m->opts & OPT_HOLD) {
        if (m->nnotes == MAX_NOTES)
            return 1;
        m->notes[m->nnotes++] = (note_t){ t, u->offset, u->count, u->shard_offset, u->grad, u->iteration };
        return 0;
    }
    sgd_slice(m, t, u->offset, u->count, u->shard_offset, u->grad, u->iteration);
    return 0;
}

static void sgd(model_t *m, int t, const float *g, long long it)
{
    float lr = lr_of(it);
    for (size_t i = 0; i < counts[t]; i++) {
        float *v = &m->v[m->off[t] + i];
        *v = MU * *v + g[i];
        m->w[m->off[t] + i] -= lr * *v;
    }
}

/* ---- the reference: plain MPI_Allreduce, every step written out ---- */

static void reference(model_t *m)
{
    size_t n = m->off[NT];
    float *g = malloc(n * sizeof *g);
    double *wide = malloc(n * sizeof *wide);
    for (long long it = 0; it < ITERS; it++) {
        for (size_t i = 0; i < n; i++)
            g[i] = 0;
        for (int mb = 0; mb < micro_batches(m); mb++)
            for (int t = 0; t < NT; t++)
                for (size_t i = 0; i < counts[t] && has_grad(m, t, rank, it); i++)
                    g[m->off[t] + i] += grad_value(m, t, i, rank, it, mb);
        if (m->opts & (OPT_BF16 | OPT_WIRE16)) {
            /* Exact float32 sums (see grad_value), rounded once after the average. */
            for (size_t i = 0; i < n; i++)
                wide[i] = g[i];
            MPI_Allreduce(MPI_IN_PLACE, wide, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            for (size_t i = 0; i < n; i++) {
                float avg = (float)wide[i] * (float)(1.0 / nranks);
                g[i] = m->opts & OPT_BF16 ? dear_bf16_to_float(dear_float_to_bf16(avg))
                       : nranks > 1       ? dear_half_to_float(dear_float_to_half(avg))
                                          : avg; /* one rank sends nothing */
            }
        } else {
            MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            for (size_t i = 0; i < n; i++)
                g[i] *= (float)(1.0 / nranks);
        }
        if (max_norm(m) > 0) {
            double s = 0;
            for (int t = 0; t < NT; t++)
                for (size_t i = 0; i < counts[t] && !frozen(m, t, it); i++)
                    s += (double)g[m->off[t] + i] * g[m->off[t] + i];
            double norm = sqrt(s), coef = max_norm(m) / (norm + 1e-6);
            m->norm[it] = norm;
            for (size_t i = 0; i < n && coef < 1; i++)
                g[i] *= (float)coef;
        }
        for (int t = 0; t < NT; t++) {
            int anyone = 0;
            for (int r = 0; r < nranks; r++)
                anyone |= has_grad(m, t, r, it);
            if (frozen(m, t, it) || ((m->opts & OPT_FIND_UNUSED) && !anyone))
                continue;
            sgd(m, t, g + m->off[t], it);
            m->calls[t]++;
        }
    }
    free(g);
    free(wide);
}

/* ---- the same loop through libdear ---- */

static int update(const dear_update_info_t *u)
{
    model_t *m = u->arg;
    int t = u->tensor;
    if (u->size < sizeof *u || u->iteration < 0 || u->iteration >= ITERS)
        return 1;
    if (m->opts & OPT_SHARD)
        return update_slice(m, u);
    if (u->count != counts[t] || u->offset != 0 || u->param != NULL)
        return 1;
    float tmp[1200];
    const float *g = u->grad;
    if (u->dtype == DEAR_BFLOAT16) {
        for (size_t i = 0; i < u->count; i++)
            tmp[i] = dear_bf16_to_float(((const unsigned short *)u->grad)[i]);
        g = tmp;
    }
    m->norm[u->iteration] = u->grad_norm;
    if (m->opts & (OPT_TINY | OPT_Q8)) {
        for (size_t i = 0; i < u->count; i++)
            m->total[m->off[t] + i] += g[i];
        m->calls[t]++;
        return 0;
    }
    sgd(m, t, g, u->iteration);
    m->calls[t]++;
    return 0;
}

/* Write this rank's gradients of layer 2t for micro-batch mb (added to earlier micro-batches). */
static void backward_tensor(dear_ctx_t *ctx, model_t *m, int t, long long it, int mb)
{
    if (!has_grad(m, t, rank, it)) {
        ck_assert_int_eq(dear_no_grad(ctx, t), DEAR_OK);
        return;
    }
    for (size_t i = 0; i < counts[t]; i++) {
        float v = grad_value(m, t, i, rank, it, mb);
        if (m->opts & OPT_BF16) {
            unsigned short *g = (unsigned short *)m->g + m->off[t] + i;
            *g = dear_float_to_bf16((mb ? dear_bf16_to_float(*g) : 0.0f) + v);
        } else {
            float *g = (float *)m->g + m->off[t] + i;
            *g = (mb ? *g : 0.0f) + v;
        }
    }
}

/* One forward pass through every layer (the hooks run the pending updates first). */
static void forward(dear_ctx_t *ctx, int sleep_layer, int sleep_us)
{
    for (int l = 0; l < 2 * NT; l++) {
        ck_assert_int_eq(dear_forward_begin(ctx, l), DEAR_OK);
        if (l == sleep_layer)
            usleep((useconds_t)sleep_us);
    }
}

static void backward(dear_ctx_t *ctx, model_t *m, long long it, int mb)
{
    for (int l = 2 * NT - 1; l >= 0; l--) {
        if (l % 2 == 0)
            backward_tensor(ctx, m, l / 2, it, mb);
        if ((m->opts & OPT_SLOW) && l % 2 == 0)
            usleep(20000); /* a slow layer: the reduce-scatters queued so far are done at the next hook */
        ck_assert_int_eq(dear_backward_done(ctx, l), DEAR_OK);
    }
    m->in_end = 1;
    ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    m->in_end = 0;
}

static dear_ctx_t *setup(model_t *m, const char *sched, const char *plan)
{
    dear_ctx_t *ctx = NULL;
    char path[64] = "";
    if (plan != NULL) {
        snprintf(path, sizeof path, "/tmp/dear-loop-%d.plan", (int)getpid());
        MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            FILE *f = fopen(path, "w");
            ck_assert_ptr_nonnull(f);
            fputs(plan, f);
            ck_assert_int_eq(fclose(f), 0);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        setenv("DEAR_PLAN_FILE", path, 1);
    }
    setenv("DEAR_SCHEDULE", sched, 1);
    setenv("DEAR_FUSION", "threshold", 1);
    setenv("DEAR_FUSION_THRESHOLD", "2k", 1); /* several buckets */
    if (m->opts & OPT_FIND_UNUSED)
        setenv("DEAR_FIND_UNUSED", "1", 1);
    if (m->opts & OPT_CLIP_ENV)
        setenv("DEAR_CLIP_NORM", "0.5", 1);
    if (m->opts & OPT_NOEARLY)
        setenv("DEAR_SHARD_EARLY", "0", 1);
    if (m->opts & OPT_ONLINE) {
        /* Plans switch after 2 iterations, auto's check swaps back and forth, and it plans again
         * every 4, over tensors cut into chunks of 1 KiB. */
        setenv("DEAR_FUSION", "auto", 1);
        setenv("DEAR_WARMUP_ITERS", "2", 1);
        setenv("DEAR_VERIFY_ITERS", "2", 1);
        setenv("DEAR_REPLAN_EVERY", "4", 1);
        setenv("DEAR_CALIBRATE", "off", 1);
        setenv("DEAR_COST_PRESET", "10gbe", 1);
        setenv("DEAR_PARTITION", "1k", 1);
    }
    /* Compressed to float16: through the environment under some schedules, the call under others. */
    int by_env = sched[0] == 'w' || plan != NULL;
    if ((m->opts & (OPT_WIRE16 | OPT_TINY)) && by_env)
        setenv("DEAR_COMPRESS", "fp16", 1);
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    check_transport(ctx);
    if ((m->opts & (OPT_WIRE16 | OPT_TINY)) && !by_env)
        ck_assert_int_eq(dear_set_compress(ctx, DEAR_COMPRESS_FP16, DEAR_COMPRESS_FP16,
                                           getenv("DEAR_COMPRESS_EF") != NULL),
                         DEAR_OK);
    dear_dtype_t dt = m->opts & OPT_BF16 ? DEAR_BFLOAT16 : DEAR_FLOAT32;
    size_t es = m->opts & OPT_BF16 ? 2 : 4;
    for (int t = 0; t < NT; t++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", t);
        ck_assert_int_eq(dear_register(ctx, name, 2 * t, (char *)m->g + m->off[t] * es, counts[t], dt, DEAR_MEM_HOST,
                                       m->opts & OPT_WAIT ? NULL : update, m),
                         DEAR_OK);
        ck_assert_int_eq(dear_register_layer(ctx, 2 * t + 1), DEAR_OK);
    }
    if (m->opts & OPT_CLIP)
        ck_assert_int_eq(dear_set_clip_norm(ctx, max_norm(m)), DEAR_OK);
    if (m->opts & OPT_FREEZE)
        ck_assert_int_eq(dear_freeze(ctx, 1, 1), DEAR_OK);
    if (m->opts & OPT_SHARD) {
        for (int t = 0; t < NT; t++)
            ck_assert_int_eq(dear_set_param(ctx, t, m->w + m->off[t]), DEAR_OK);
        ck_assert_int_eq(dear_set_shard(ctx, DEAR_SHARD_ON | (m->opts & OPT_HOLD ? DEAR_SHARD_HOLD : 0)), DEAR_OK);
    }
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    if (m->opts & OPT_SHARD) {
        /* The momenta of this rank's slices, at the places dear_shard_slices gives. */
        dear_slice_t sl[MAX_SLICES];
        int n = dear_shard_slices(ctx, rank, sl, MAX_SLICES);
        ck_assert_int_ge(n, 0);
        ck_assert_int_le(n, MAX_SLICES);
        m->nshard = n > 0 ? sl[n - 1].shard_offset + sl[n - 1].count : 0;
        m->vs = calloc(m->nshard + 1, sizeof *m->vs);
        ck_assert_ptr_nonnull(m->vs);
    }
    if (plan != NULL) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0)
            unlink(path);
        unsetenv("DEAR_PLAN_FILE");
    }
    unsetenv("DEAR_SCHEDULE");
    unsetenv("DEAR_FUSION");
    unsetenv("DEAR_FUSION_THRESHOLD");
    unsetenv("DEAR_FIND_UNUSED");
    unsetenv("DEAR_CLIP_NORM");
    unsetenv("DEAR_SHARD_EARLY");
    const char *online[] = { "DEAR_FUSION", "DEAR_WARMUP_ITERS", "DEAR_VERIFY_ITERS", "DEAR_REPLAN_EVERY",
                             "DEAR_CALIBRATE", "DEAR_COST_PRESET", "DEAR_PARTITION" };
    for (size_t i = 0; (m->opts & OPT_ONLINE) && i < sizeof online / sizeof online[0]; i++)
        unsetenv(online[i]);
    unsetenv("DEAR_COMPRESS");
    return ctx;
}

/* OPT_HOLD: the slices the callbacks noted, stepped now; then their parameters leave, at once
 * (even iterations) or at the next hook. */
static void step_held(dear_ctx_t *ctx, model_t *m, long long it)
{
    for (int k = 0; k < m->nnotes; k++) {
        const note_t *n = &m->notes[k];
        sgd_slice(m, n->t, n->off, n->n, n->pos, n->g, n->it);
    }
    m->nnotes = 0;
    if (it % 2 == 0)
        ck_assert_int_eq(dear_shard_release(ctx), DEAR_OK);
}

/* Train ITERS iterations through libdear; eval_us > 0: an evaluation forward after every
 * iteration whose layer 0 sleeps that long. */
static void train(dear_ctx_t *ctx, model_t *m, int eval_us)
{
    for (long long it = 0; it < ITERS; it++) {
        if ((m->opts & OPT_FREEZE) && it == FREEZE_AT)
            ck_assert_int_eq(dear_freeze(ctx, 3, 1), DEAR_OK);
        int mbs = micro_batches(m);
        for (int mb = 0; mb < mbs; mb++) {
            /* The micro-batches before the last one accumulate; their layer 0 is slow, which
             * the profile must not see. */
            ck_assert_int_eq(dear_set_mode(ctx, mb < mbs - 1 ? DEAR_MODE_ACCUMULATE : DEAR_MODE_TRAIN), DEAR_OK);
            forward(ctx, 0, mb < mbs - 1 ? 30000 : 0);
            backward(ctx, m, it, mb);
        }
        if (m->opts & OPT_HOLD)
            step_held(ctx, m, it);
        if (eval_us > 0) {
            ck_assert_int_eq(dear_set_mode(ctx, DEAR_MODE_EVAL), DEAR_OK);
            forward(ctx, 0, eval_us);
            ck_assert_int_eq(dear_backward_done(ctx, 0), DEAR_ERR_STATE);
            ck_assert_int_eq(dear_set_mode(ctx, DEAR_MODE_TRAIN), DEAR_OK);
        }
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
}

static void assert_close(const float *got, const float *want, size_t n, double tol, const char *what)
{
    int bad = 0;
    size_t at = 0;
    for (size_t i = 0; i < n && !bad; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs((double)want[i])))) {
            bad = 1;
            at = i;
        }
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad)
        fprintf(stderr, "[rank %d] %s: element %zu is %.9g, expected %.9g\n", rank, what, at, (double)got[at],
                (double)want[at]);
    ck_assert_msg(!any, "%s: parameters differ from the MPI_Allreduce loop (see stderr)", what);
}

/* Median forward time of a layer in a profile file written by dear_profile_save. */
static double profile_fwd(const char *path, int layer)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    double fwd = -1;
    while (fgets(line, sizeof line, f)) {
        int id;
        double a, b;
        if (sscanf(line, "layer %d %lf %lf", &id, &a, &b) == 3 && id == layer)
            fwd = a;
    }
    fclose(f);
    return fwd;
}

/* The schedules, the last being dear again under a plan whose all-gather groups cut both
 * buckets (each bucket's reduce-scatter then shards every group's piece over the ranks), two
 * of them early. */
static const char *const scheds[] = { "dear", "wfbp", "sync", "dear" };
#define NSCHED 4
static const char *const cut_plan = "dear-plan 2\nplanner hand\ntensors 6\nunits 6\nrs 2 0 2\n"
                                    "ag 5 0 1 3 4 5\nearly 2\nend\n";
static const char *plan_of(int s) { return s == NSCHED - 1 ? cut_plan : NULL; }

/* What the last compare saw: the fewest and most slice updates a rank ran inside the backward
 * hooks, and the all-gather groups run during backward. */
static long last_early_min, last_early_max;
static int last_groups_early, last_early_lagged;

/* 1 if every early all-gather group of a bucket but the last to complete starts behind the next
 * bucket's reduce-scatter, 0 if each starts right behind its own. */
static int early_lagged(const dear_ctx_t *ctx)
{
    int lagged = 0, direct = 0;
    for (int g = 0; g < ctx->graph.ngroups; g++) {
        if (!ctx->graph.groups[g].early)
            continue;
        int b = ctx->graph.units[ctx->graph.groups[g].u0].bucket, pos = ctx->graph.groups[g].op.pos;
        ck_assert_msg(pos > ctx->graph.buckets[b].op.pos, "early group %d at %d, before its bucket %d", g, pos, b);
        if (b == 0)
            continue; /* behind every reduce-scatter either way */
        int after = pos > ctx->graph.buckets[b - 1].op.pos;
        lagged += after;
        direct += !after;
    }
    ck_assert_msg(lagged == 0 || direct == 0, "%d early group(s) lagged, %d not", lagged, direct);
    return lagged > 0;
}

/* Run one option set under schedule s and compare with the reference. */
static void compare(int opts, int s, int eval_us)
{
    model_t ref, m;
    model_init(&ref, opts);
    model_init(&m, opts);
    reference(&ref);
    dear_ctx_t *ctx = setup(&m, scheds[s], plan_of(s));
    ck_assert_str_eq(dear_schedule(ctx), scheds[s]);
    train(ctx, &m, eval_us);
    MPI_Allreduce(&m.early, &last_early_min, 1, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&m.early, &last_early_max, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    last_groups_early = ctx->graph.ngroups_early;
    last_early_lagged = early_lagged(ctx);
    char what[112];
    snprintf(what, sizeof what, "options 0x%x, schedule %s%s, np %d", opts, scheds[s],
             plan_of(s) ? " (buckets cut by the all-gather groups)" : "", nranks);
    /* bfloat16, float16 on the wire: the same float32 sum rounded once, so the same parameters
     * bit for bit. */
    assert_close(m.w, ref.w, m.off[NT], opts & (OPT_BF16 | OPT_WIRE16) ? 0 : 2e-5, what);
    if (opts & OPT_SHARD) {
        /* Every element updated once per update of the reference, by one rank. */
        long all[NT];
        MPI_Allreduce(m.elems, all, NT, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        for (int t = 0; t < NT; t++)
            ck_assert_msg(all[t] == (long)counts[t] * ref.calls[t], "%s: tensor %d had %ld element updates over "
                          "the ranks, the reference %ld", what, t, all[t], (long)counts[t] * ref.calls[t]);
    }
    for (int t = 0; t < NT && !(opts & OPT_SHARD); t++)
        ck_assert_msg(m.calls[t] == ref.calls[t], "%s: tensor %d updated %ld times, the reference %ld", what, t,
                      m.calls[t], ref.calls[t]);
    for (int k = 0; k < ITERS && max_norm(&m) > 0; k++)
        ck_assert_msg(fabs(m.norm[k] - ref.norm[k]) <= 1e-5 * ref.norm[k], "%s: iteration %d was told norm %g, the "
                      "reference's is %g", what, k, m.norm[k], ref.norm[k]);
    if (opts & (OPT_ACCUM | OPT_EVAL)) {
        /* The slow forwards (30 ms in accumulated micro-batches, eval_us in evaluation) are not
         * the training passes' layer 0, which takes microseconds. */
        char path[64];
        snprintf(path, sizeof path, "/tmp/dear-loop-%d.prof", (int)getpid());
        MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
        ck_assert_int_eq(dear_profile_save(ctx, path), DEAR_OK);
        if (rank == 0) {
            double f0 = profile_fwd(path, 0);
            unlink(path);
            ck_assert_msg(f0 >= 0 && f0 < 0.010, "%s: the profile gives layer 0 a forward of %g s", what, f0);
        }
    }
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&ref);
    model_free(&m);
}

START_TEST(test_lr)
{
    compare(OPT_NONE, _i, 0);
    if (plan_of(_i)) /* unsharded: each early group right behind the bucket completing it */
        ck_assert_int_eq(last_early_lagged, 0);
}
END_TEST
START_TEST(test_clip) { compare(OPT_CLIP, _i, 0); compare(OPT_CLIP_ENV, _i, 0); }
END_TEST
START_TEST(test_accum) { compare(OPT_ACCUM, _i, 0); }
END_TEST
START_TEST(test_nograd) { compare(OPT_NOGRAD, _i, 0); compare(OPT_NOGRAD | OPT_FIND_UNUSED, _i, 0); }
END_TEST
START_TEST(test_eval) { compare(OPT_EVAL, _i, 30000); }
END_TEST
START_TEST(test_bf16) { compare(OPT_BF16, _i, 0); }
END_TEST

/* The bytes this rank sent training with opts under schedule s. */
static uint64_t bytes_sent(int opts, int s)
{
    model_t m;
    model_init(&m, opts);
    dear_ctx_t *ctx = setup(&m, scheds[s], plan_of(s));
    train(ctx, &m, 0);
    dear_stats_t st;
    ck_assert_int_eq(dear_get_stats(ctx, &st), DEAR_OK);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);
    return st.bytes_sent;
}

/* Compressed float32 on the wire: bit for bit the reference rounded once (see grad_value), with
 * half the bytes of the uncompressed run; a rank that compresses otherwise fails commit everywhere. */
START_TEST(test_wire16)
{
    compare(OPT_WIRE16, _i, 0);
    if (nranks < 2)
        return;
    uint64_t sent[2] = { bytes_sent(OPT_NONE, _i), bytes_sent(OPT_WIRE16, _i) };
    ck_assert_msg(2 * sent[1] == sent[0], "compressed: %llu bytes sent, %llu uncompressed", (unsigned long long)sent[1],
                  (unsigned long long)sent[0]);
    if (_i > 0)
        return;
    float x[4] = { 0 };
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "x", 0, x, 4, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_OK);
    ck_assert_int_eq(dear_set_compress(ctx, (dear_compress_t)DEAR_COMPRESS_COUNT, DEAR_COMPRESS_NONE, 0), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_set_compress(ctx, DEAR_COMPRESS_BF16, DEAR_COMPRESS_NONE, 2), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_set_compress(ctx, DEAR_COMPRESS_BF16, rank == nranks - 1 ? DEAR_COMPRESS_FP16
                                                                                  : DEAR_COMPRESS_BF16, 0),
                     DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_ERR_MISMATCH);
    ck_assert_int_eq(dear_set_compress(ctx, DEAR_COMPRESS_BF16, DEAR_COMPRESS_BF16, 0), DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    ck_assert_int_eq(dear_set_compress(ctx, DEAR_COMPRESS_NONE, DEAR_COMPRESS_NONE, 0), DEAR_ERR_STATE);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
}
END_TEST

/* Error feedback: every rank's gradient is 2^-26, which float16 rounds to zero. Without it the
 * updates see zeros (this rank's own share, added unrounded, is lost in the all-gather's
 * rounding of the average); with it each rank's residual grows until it travels, and the
 * averaged gradients add up to the true total within two float16 steps (2^-24 each). */
START_TEST(test_ef)
{
    if (nranks < 2)
        return;
    for (int ef = 0; ef < 2; ef++) {
        if (ef)
            setenv("DEAR_COMPRESS_EF", "1", 1);
        model_t m;
        model_init(&m, OPT_TINY);
        dear_ctx_t *ctx = setup(&m, scheds[_i], plan_of(_i));
        train(ctx, &m, 0);
        ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
        unsetenv("DEAR_COMPRESS_EF");
        double want = ef ? ITERS * 0x1p-26 : 0, tol = ef ? 2 * 0x1p-24 : 0;
        for (size_t i = 0; i < m.off[NT]; i++)
            ck_assert_msg(fabs(m.total[i] - want) <= tol, "error feedback %d, schedule %s: element %zu's gradients add "
                          "up to %g, expected %g", ef, scheds[_i], i, m.total[i], want);
        model_free(&m);
    }
}
END_TEST

/* int8's error feedback, on by default: gradients of 2^-9 in blocks whose largest is 1 code to 0
 * (half a scale is 1/254). Without feedback most of them add up to nothing; with it each
 * quantization's residual grows until it travels, and every one adds up to the true total
 * within a scale for each side (the contributions' and the average's). */
START_TEST(test_ef_int8)
{
    if (nranks < 2)
        return;
    for (int ef = 0; ef < 2; ef++) {
        setenv("DEAR_COMPRESS", "int8", 1);
        if (!ef)
            setenv("DEAR_COMPRESS_EF", "0", 1);
        model_t m;
        model_init(&m, OPT_Q8);
        dear_ctx_t *ctx = setup(&m, scheds[_i], plan_of(_i));
        train(ctx, &m, 0);
        ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
        unsetenv("DEAR_COMPRESS_EF");
        double want = ITERS * 0x1p-9, tol = 2.0 / 127;
        size_t small = 0, lost = 0;
        for (int t = 0; t < NT; t++)
            for (size_t i = 0; i < counts[t]; i++) {
                if (i % 16 == 0)
                    continue;
                double got = m.total[m.off[t] + i];
                small++;
                lost += got == 0;
                if (ef)
                    ck_assert_msg(fabs(got - want) <= tol, "int8 with error feedback, schedule %s: tensor %d element "
                                  "%zu's gradients add up to %g, expected %g (within %g)", scheds[_i], t, i, got,
                                  want, tol);
            }
        if (rank == 0)
            fprintf(stderr, "int8 %s error feedback, schedule %s: %zu of %zu small gradients lost\n",
                    ef ? "with" : "without", scheds[_i], lost, small);
        if (!ef)
            ck_assert_msg(lost * 10 >= small * 8, "int8 without error feedback, schedule %s: only %zu of %zu small "
                          "gradients were lost", scheds[_i], lost, small);
        model_free(&m);
    }
}
END_TEST

/* DEAR_DETERMINISTIC: the same training under two plans (2 KiB buckets of whole tensors; chunks of
 * 256 bytes, and for the cut schedule its hand plan) ends on the same parameters bit for bit,
 * though the gradients are not exact and the plans sum them in other pieces; the second run
 * with options opts_b (sharded: the sums are in rank order either way, momentum element-wise);
 * compressed: float32 travels as bfloat16 in both (each contribution rounded once, wherever it
 * is summed). */
static void determ_compare(int s, int opts_a, int opts_b, int compressed, const char *what)
{
    setenv("DEAR_DETERMINISTIC", "1", 1);
    model_t a, b;
    model_init(&a, opts_a);
    model_init(&b, opts_b);
    if (compressed)
        setenv("DEAR_COMPRESS", "bf16", 1);
    dear_ctx_t *ctx = setup(&a, scheds[s], NULL);
    train(ctx, &a, 0);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    setenv("DEAR_PARTITION", "256", 1);
    if (compressed)
        setenv("DEAR_COMPRESS", "bf16", 1); /* setup unset it */
    ctx = setup(&b, scheds[s], plan_of(s));
    train(ctx, &b, 0);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    unsetenv("DEAR_PARTITION");
    unsetenv("DEAR_DETERMINISTIC");
    unsetenv("DEAR_COMPRESS");
    size_t n = a.off[NT], differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += memcmp(&a.w[i], &b.w[i], sizeof a.w[i]) != 0;
    ck_assert_msg(differ == 0, "DEAR_DETERMINISTIC=1%s, schedule %s, np %d: %zu of %zu parameters differ between %s",
                  compressed ? " DEAR_COMPRESS=bf16" : "", scheds[s], nranks, differ, n, what);
    /* Clipping: the norm itself, as each update was told it, bit for bit (a norm one rounding
     * off rarely moves a float32 parameter, so the parameters alone would not show it). */
    for (int it = 0; it < ITERS && (opts_a & OPT_CLIP); it++)
        ck_assert_msg(memcmp(&a.norm[it], &b.norm[it], sizeof a.norm[it]) == 0,
                      "DEAR_DETERMINISTIC=1, schedule %s, np %d: iteration %d's norm is %.17g and %.17g between %s",
                      scheds[s], nranks, it, a.norm[it], b.norm[it], what);
    model_free(&a);
    model_free(&b);
}

START_TEST(test_deterministic)
{
    for (int c = 0; c < 2; c++)
        determ_compare(_i, OPT_NONE, OPT_NONE, c, "two plans");
}
END_TEST

/* Frozen tensors: unchanged, and their bytes do not travel. */
START_TEST(test_frozen)
{
    compare(OPT_FREEZE, _i, 0);
    if (nranks < 2)
        return;
    uint64_t sent[2] = { bytes_sent(OPT_NONE, _i), bytes_sent(OPT_FREEZE, _i) };
    ck_assert_msg(sent[1] < sent[0], "frozen: %llu bytes sent, %llu without freezing", (unsigned long long)sent[1],
                  (unsigned long long)sent[0]);
}
END_TEST

/* update = NULL: dear_wait_grad puts one layer's averaged gradient in its buffer. */
START_TEST(test_wait)
{
    model_t m;
    model_init(&m, OPT_WAIT);
    dear_ctx_t *ctx = setup(&m, scheds[_i], plan_of(_i));
    float *want = malloc(m.off[NT] * sizeof *want);
    for (long long it = 0; it < 3; it++) {
        forward(ctx, -1, 0);
        backward(ctx, &m, it, 0);
        for (int t = 0; t < NT; t++)
            for (size_t i = 0; i < counts[t]; i++)
                want[m.off[t] + i] = grad_value(&m, t, i, rank, it, 0);
        MPI_Allreduce(MPI_IN_PLACE, want, (int)m.off[NT], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (size_t i = 0; i < m.off[NT]; i++)
            want[i] *= (float)(1.0 / nranks);
        for (int t = NT - 1; t >= 0; t--) { /* any order, one layer at a time */
            ck_assert_int_eq(dear_wait_grad(ctx, 2 * t), DEAR_OK);
            assert_close((float *)m.g + m.off[t], want + m.off[t], counts[t], 2e-6, "dear_wait_grad");
        }
    }
    ck_assert_int_eq(dear_wait_grad(ctx, 12345), DEAR_ERR_ARG);
    free(want);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);
}
END_TEST

/* Sharded updates under every schedule, with each of the loop's patterns (float32: the all-gathers
 * carry the parameters in the gradients' type), and with the slices stepped by the program. */
START_TEST(test_shard)
{
    const int opts[] = { OPT_NONE, OPT_CLIP, OPT_ACCUM, OPT_NOGRAD | OPT_FIND_UNUSED, OPT_FREEZE, OPT_HOLD,
                         OPT_HOLD | OPT_CLIP | OPT_ACCUM, OPT_NOEARLY, OPT_NOEARLY | OPT_ACCUM | OPT_FREEZE };
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
        compare(OPT_SHARD | opts[k], _i, 0);
    compare(OPT_SHARD | OPT_EVAL, _i, 2000);
}
END_TEST

/* Where slices are stepped: under dear, inside the backward hooks that find their reduce-scatters
 * done (slow layers make sure some are), and the cut plan's early all-gathers run; at
 * dear_backward_end, none early, under the other schedules, with clipping or DEAR_FIND_UNUSED
 * (a barrier over every reduce-scatter), DEAR_SHARD_HOLD or DEAR_SHARD_EARLY=0. The parameters
 * are the reference's either way. */
START_TEST(test_shard_early)
{
    const int opts[] = { OPT_NONE, OPT_CLIP, OPT_NOGRAD | OPT_FIND_UNUSED, OPT_HOLD, OPT_NOEARLY };
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        compare(OPT_SHARD | OPT_SLOW | opts[k], _i, 0);
        int early = strcmp(scheds[_i], "dear") == 0 && opts[k] == OPT_NONE;
        if (early)
            ck_assert_msg(last_early_min > 0, "options 0x%x, schedule %s, np %d: a rank stepped no slice inside the "
                          "backward hooks", opts[k], scheds[_i], nranks);
        else
            ck_assert_msg(last_early_max == 0, "options 0x%x, schedule %s, np %d: %ld slice(s) stepped before "
                          "dear_backward_end", opts[k], scheds[_i], nranks, last_early_max);
        if (plan_of(_i)) {
            ck_assert_int_eq(last_groups_early, early ? 2 : 0);
            /* Queued at the hook that steps them, they must not hold the next bucket. */
            ck_assert_int_eq(last_early_lagged, early);
        }
    }
}
END_TEST

START_TEST(test_shard_lr) { compare(OPT_SHARD, _i, 0); }
END_TEST

/* Plan switches (online planning, auto's check, re-planning) while sharded: the slices, and with
 * them the momenta the program keeps, never move, so the parameters stay the reference's. */
START_TEST(test_shard_online)
{
    if (nranks < 2)
        return; /* one rank plans nothing */
    for (int hold = 0; hold < 2; hold++) {
        int opts = OPT_SHARD | OPT_ONLINE | (hold ? OPT_HOLD : 0);
        model_t ref, m;
        model_init(&ref, opts);
        model_init(&m, opts);
        reference(&ref);
        dear_ctx_t *ctx = setup(&m, scheds[_i], NULL);
        dear_slice_t before[MAX_SLICES], after[MAX_SLICES];
        int n0 = dear_shard_slices(ctx, rank, before, MAX_SLICES);
        train(ctx, &m, 0);
        /* A new plan, then auto's check: old, then new or old again. */
        ck_assert_msg(ctx->online.nplans >= 1 && (ctx->check.nreverts > 0 || !strstr(ctx->graph.plan.planner, "warm")),
                      "%s: %d online plan(s), on plan %s", scheds[_i], ctx->online.nplans, ctx->graph.plan.planner);
        ck_assert_int_eq(dear_shard_slices(ctx, rank, after, MAX_SLICES), n0);
        for (int k = 0; k < n0; k++)
            ck_assert_msg(before[k].tensor == after[k].tensor && before[k].offset == after[k].offset &&
                          before[k].count == after[k].count && before[k].shard_offset == after[k].shard_offset,
                          "slice %d moved", k);
        ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
        char what[96];
        snprintf(what, sizeof what, "sharded%s, online planning, schedule %s, np %d", hold ? " (held)" : "",
                 scheds[_i], nranks);
        assert_close(m.w, ref.w, m.off[NT], 2e-5, what);
        model_free(&ref);
        model_free(&m);
    }
}
END_TEST

START_TEST(test_shard_determ)
{
    determ_compare(_i, OPT_NONE, OPT_SHARD, 0, "sharded and unsharded under two plans");
    determ_compare(_i, OPT_NONE, OPT_SHARD | OPT_NOEARLY, 0,
                   "sharded (DEAR_SHARD_EARLY=0) and unsharded under two plans");
}

/* Clipping by global norm under DEAR_DETERMINISTIC: the norm is the exact sum of the squares,
 * whatever buckets, chunks and shards hold them, so two plans, and sharded against unsharded,
 * clip by the same factor and end bit for bit the same. */
START_TEST(test_clip_determ)
{
    determ_compare(_i, OPT_CLIP, OPT_CLIP, 0, "two plans with clipping");
    determ_compare(_i, OPT_CLIP, OPT_CLIP | OPT_SHARD, 0, "sharded and unsharded with clipping under two plans");
}
END_TEST
END_TEST

/* The slices of every rank cover each element once, about 1/P of the model each; bad use of the
 * sharded calls is refused with the reason. */
START_TEST(test_shard_slices)
{
    model_t m;
    model_init(&m, OPT_SHARD);
    setenv("DEAR_PARTITION", "256", 1);
    dear_ctx_t *ctx = setup(&m, "dear", NULL);
    unsetenv("DEAR_PARTITION");
    size_t n = m.off[NT];
    unsigned char *seen = calloc(n, 1);
    dear_slice_t sl[MAX_SLICES];
    for (int r = 0; r < nranks; r++) {
        int k = dear_shard_slices(ctx, r, sl, MAX_SLICES);
        ck_assert_int_gt(k, 0);
        ck_assert_int_le(k, MAX_SLICES);
        size_t pos = 0, most = 0;
        for (int i = 0; i < k; i++) {
            ck_assert_uint_eq(sl[i].shard_offset, pos);
            ck_assert(sl[i].offset + sl[i].count <= counts[sl[i].tensor]);
            for (size_t e = 0; e < sl[i].count; e++)
                seen[m.off[sl[i].tensor] + sl[i].offset + e]++;
            pos += sl[i].count;
        }
        /* Each chunk (at most 64 floats) is cut over the ranks: at most one more element each. */
        for (int t = 0; t < NT; t++)
            most += (counts[t] + 63) / 64 * ((64 + (size_t)nranks - 1) / (size_t)nranks);
        ck_assert_msg(pos <= most, "rank %d holds %zu elements, more than %zu", r, pos, most);
        if (r == rank)
            ck_assert_uint_eq(pos, m.nshard);
    }
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(seen[i] == 1, "element %zu is in %d slices", i, seen[i]);
    free(seen);
    ck_assert_int_eq(dear_shard_slices(ctx, nranks, sl, MAX_SLICES), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_shard_slices(ctx, 0, NULL, 4), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_shard_slices(ctx, 0, NULL, 0), dear_shard_slices(ctx, 0, sl, MAX_SLICES));
    ck_assert_int_eq(dear_set_shard(ctx, DEAR_SHARD_ON), DEAR_ERR_STATE);
    ck_assert_int_eq(dear_set_param(ctx, 0, m.w), DEAR_ERR_STATE);
    forward(ctx, -1, 0);
    backward(ctx, &m, 0, 0);
    ck_assert_int_eq(dear_wait_grad(ctx, 0), DEAR_ERR_STATE);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);

    float w[8], g[8], w2[8];
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_set_shard(ctx, DEAR_SHARD_HOLD), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_register(ctx, "a", 0, g, 4, DEAR_FLOAT32, DEAR_MEM_HOST, update, NULL), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "b", 1, g + 4, 4, DEAR_FLOAT32, DEAR_MEM_HOST, update, NULL), DEAR_OK);
    ck_assert_int_eq(dear_set_param(ctx, 0, g + 2), DEAR_ERR_ARG);   /* a gradient */
    ck_assert_int_eq(dear_set_param(ctx, 2, w), DEAR_ERR_ARG);       /* no such tensor */
    ck_assert_int_eq(dear_set_param(ctx, 0, NULL), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_set_param(ctx, 0, w), DEAR_OK);
    ck_assert_int_eq(dear_set_param(ctx, 1, w + 2), DEAR_ERR_ARG);   /* tensor a's parameters */
    ck_assert_int_eq(dear_set_param(ctx, 0, w2), DEAR_OK);           /* replaces */
    ck_assert_int_eq(dear_set_param(ctx, 1, w + 2), DEAR_OK);
    ck_assert_int_eq(dear_shard_slices(ctx, 0, sl, 4), DEAR_ERR_STATE);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    /* DEAR_SHARD=1 for a program that gave no parameters (or only rank 0 did): refused on every
     * rank at commit. */
    setenv("DEAR_SHARD", "1", 1);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
        ck_assert_int_eq(dear_register(ctx, "a", 0, g, 4, DEAR_FLOAT32, DEAR_MEM_HOST, update, NULL), DEAR_OK);
        if (k == 1 && rank == 0)
            ck_assert_int_eq(dear_set_param(ctx, 0, w), DEAR_OK);
        ck_assert_int_eq(dear_commit(ctx), k == 1 && nranks == 1 ? DEAR_OK : DEAR_ERR_ARG);
        ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    }
    unsetenv("DEAR_SHARD");
}
END_TEST

/* Parameter-less layers: their time reaches the profile; different declarations fail commit. */
START_TEST(test_layers)
{
    model_t m;
    model_init(&m, OPT_NONE);
    dear_ctx_t *ctx = setup(&m, "dear", NULL);
    for (long long it = 0; it < 4; it++) {
        forward(ctx, 3, 20000); /* layer 3 holds no tensor */
        backward(ctx, &m, it, 0);
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/dear-layers-%d.prof", (int)getpid());
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    ck_assert_int_eq(dear_profile_save(ctx, path), DEAR_OK);
    if (rank == 0) {
        double f3 = profile_fwd(path, 3);
        unlink(path);
        ck_assert_msg(f3 >= 0.015, "layer 3's forward in the profile: %g s (it sleeps 20 ms)", f3);
    }
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);
    if (nranks < 2)
        return;
    /* The last rank declares one more layer. */
    float x[4] = { 0 };
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "x", 0, x, 4, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_OK);
    if (rank == nranks - 1)
        ck_assert_int_eq(dear_register_layer(ctx, 9), DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_ERR_MISMATCH);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
}
END_TEST

int main(int argc, char **argv)
{
    mpi_suite_init(&argc, &argv, &rank, &nranks);
#ifdef DEAR_TEST_MEM_DELAY
    mem_delay_install(); /* every context's gradients behind delayed queues (mem_delay.h) */
#endif
    Suite *s = suite_create("loop");
    TCase *tc = tcase_create("loop");
    tcase_set_timeout(tc, 300);
    int only16 = argc > 1 && strcmp(argv[1], "--bf16-only") == 0;
    int only_lr = argc > 1 && strcmp(argv[1], "--lr-only") == 0;
    int only_shard = argc > 1 && strcmp(argv[1], "--shard-lr-only") == 0;
    if (only_lr)
        tcase_add_loop_test(tc, test_lr, 0, NSCHED);
    else if (only_shard)
        tcase_add_loop_test(tc, test_shard_lr, 0, NSCHED);
    else
        tcase_add_loop_test(tc, test_bf16, 0, NSCHED);
    if (!only16 && !only_lr && !only_shard) {
        tcase_add_loop_test(tc, test_lr, 0, NSCHED);
        tcase_add_loop_test(tc, test_clip, 0, NSCHED);
        tcase_add_loop_test(tc, test_accum, 0, NSCHED);
        tcase_add_loop_test(tc, test_nograd, 0, NSCHED);
        tcase_add_loop_test(tc, test_eval, 0, NSCHED);
        tcase_add_loop_test(tc, test_frozen, 0, NSCHED);
        tcase_add_loop_test(tc, test_wait, 0, NSCHED);
        tcase_add_loop_test(tc, test_deterministic, 0, NSCHED);
        tcase_add_loop_test(tc, test_wire16, 0, NSCHED);
        tcase_add_loop_test(tc, test_ef, 0, NSCHED);
        tcase_add_loop_test(tc, test_ef_int8, 0, NSCHED);
        tcase_add_test(tc, test_layers);
        tcase_add_loop_test(tc, test_shard, 0, NSCHED);
        tcase_add_loop_test(tc, test_shard_early, 0, NSCHED);
        tcase_add_loop_test(tc, test_shard_online, 0, 2); /* sync plans once */
        tcase_add_loop_test(tc, test_shard_determ, 0, NSCHED);
        tcase_add_loop_test(tc, test_clip_determ, 0, NSCHED);
        tcase_add_test(tc, test_shard_slices);
    }
    suite_add_tcase(s, tc);
    return mpi_suite_run(s, rank);
}
