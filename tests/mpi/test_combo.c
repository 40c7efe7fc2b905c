/*
 * Features together (Check, CK_FORK=no, under mpirun -np 1..4): a covering set of combinations of
 * sharded updates, compression, error feedback, clipping, sparse tensors, unused tensors,
 * partitions, the deterministic mode, the check for non-finite gradients (abort: any false
 * report ends the job), freezing, accumulation and sharded slices stepped only at
 * dear_backward_end (DEAR_SHARD_EARLY=0; sharded cases without it step them during backward
 * under dear), each under one schedule, planner (or a plan whose early all-gather groups are not a
 * trailing run), transport,
 * memory row and rank count. The set is made here, the same on every rank, by a greedy
 * covering design: every pair of features appears together, every triple among sharding,
 * compression, error feedback, sparse tensors, partitions and the deterministic mode too, and
 * every feature meets every schedule, planner, transport, memory row, rank count and layout.
 * Each rank count runs its share of the cases (combo-np{1..4}.mpi; combo-np{2,3}-delay.mpi for
 * the delayed host row, built as test_combo_delay; tests/cuda/combo-np{2,3}-cuda.mpi for CUDA
 * memory on the emulated runtime and NCCL, built as test_combo_cuda, each case through NCCL or
 * staged). Under CUDA the program's gradients and parameters, guards included, are device
 * memory: it writes them from pinned host copies on its stream, its updates are kernels on the
 * stream it is given, and it reads them back for every check.
 *
 * The model's tensors are malloc'ed one by one (layout "apart"), gradients and parameters each
 * between two guard regions, so that a bucket's tensors are never adjacent and a write past a
 * tensor shows; or all in one arena each (layout "arena"), guarded at its ends, where a frozen
 * tensor inside a bucket leaves the bucket's vector apart from the arena's. Each case checks,
 * against a float64 MPI_Allreduce loop computed in the same program:
 *   - the guard regions, after every iteration;
 *   - every element updated exactly once per iteration (over the ranks, when sharded), frozen
 *     and unused tensors not at all;
 *   - the parameters within a tolerance derived from the wire format;
 *   - every rank holding the same parameters, bit for bit;
 *   - under the deterministic mode, a second run under another plan ending bit for bit the same;
 *   - a frozen tensor's gradient never written by the library;
 *   - the sparse tensor's phases running sparse where the features leave them (DEAR_SPARSE=on):
 *     both phases, the reduce-scatter only when sharded or its all-reduce (wfbp, sync), none
 *     under the deterministic mode;
 *   - a pair the library refuses (dear_feature_refused) failing dear_commit on every rank, with
 *     both features named, never later.
 * COMBO_LIST=1 prints the cases and exits; COMBO_CASE=k runs case k alone; COMBO_VERBOSE=1 prints
 * rank 0's log lines of each dear_commit (with DEAR_LOG_LEVEL=info, the plan).
 */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "cuda/cuda.h"
#include "include/dear.h"
#include "runtime/features.h"
#include "runtime/rt.h"
#ifdef DEAR_TEST_MEM_DELAY
#include "tests/mpi/mem_delay.h"
#define MEM_KIND 1
#elif defined DEAR_TEST_MEM_CUDA
#include <cuda_runtime.h>

#include "tests/cuda/cuda_check.h"
#include "tests/cuda/gpu_kern.h"
#define MEM_KIND 2
static cudaStream_t stream; /* the program's compute stream (dear_set_stream) */
#else
#define MEM_KIND 0
#endif
#include "tests/mpi/suite_run.h"
#include "tests/mpi/synth.h"

static int rank, nranks;

/* ---- the combinations ---- */

/* The features the test crosses, as the library's feature table names them where it has a row. */
enum { F_SHARD, F_COMPRESS, F_EF, F_CLIP, F_SPARSE, F_UNUSED, F_PART, F_DETERM, F_FREEZE, F_ACCUM, F_FINITE,
       F_LATE, NF };
static const char *const fname[NF] = { "shard",     "compress", "feedback", "clip",   "sparse",
                                       "unused",    "partition", "deterministic", "freeze", "accumulate",
                                       "finite",    "shard-late" };
/* Every triple among these appears together. */
static const int triple_set[] = { F_SHARD, F_COMPRESS, F_EF, F_SPARSE, F_PART, F_DETERM };
#define NTRIPLE_SET ((int)(sizeof triple_set / sizeof triple_set[0]))

static const char *const scheds[] = { "dear", "wfbp", "sync" };
/* "marked": the threshold plan with every other all-gather group early from the first
 * (DEAR_DEBUG_EARLY=alternate), not a trailing run as the candidates make them. */
static const char *const planners[] = { "threshold", "dp", "auto", "marked" };
static const char *const transports[] = { "mpi", "socket" };
static const char *const mems[] = { "host", "delay", "cuda" };
static const char *const layouts[] = { "apart", "arena" };
/* The wire format of a compressed case: a dimension, so that every feature meets each. */
static const char *const formats[] = { "bf16", "fp16", "int8" };
enum { NSCHED = 3, NPLAN = 4, NTRANS = 2, NMEM = 3, NNP = 4, NLAYOUT = 2, NFORMAT = 3, NDIM = 7 };
enum { MEM_HOST, MEM_DELAY, MEM_CUDA };
static const int dim_size[NDIM] = { NSCHED, NPLAN, NTRANS, NMEM, NNP, NLAYOUT, NFORMAT };

typedef struct {
    unsigned feat;          /* 1 << F_* */
    int dim[NDIM];          /* schedule, planner, transport, memory, np - 1, layout, format */
} combo_t;

#define MAX_CASES 128
static combo_t cases[MAX_CASES];
static int ncases;

/* What a case must cover, a covering array of strength 2 with a strength-3 part: every pair of
 * features in each of their four on/off settings, every triple of triple_set in each of its
 * eight, each feature on and off with each value of each dimension, each pair of dimension
 * values, each pair of features on together where they meet the most direct path: several
 * ranks on plain host memory, whose buckets run in place on the user's tensors, and each feature
 * and each schedule with compression in each wire format on several ranks. */
#define NPAIR (NF * NF * 4)
#define NTRIP (NTRIPLE_SET * NTRIPLE_SET * NTRIPLE_SET * 8)
#define NFDIM (NF * 2 * NDIM * 4)
#define NDD (NDIM * 4 * NDIM * 4)
#define NHOST (NF * NF)
#define NFMT (NF * NFORMAT + NSCHED * NFORMAT)
#define NMARK (NF * NF + NTRANS * NMEM)
#define NTARGET (NPAIR + NTRIP + NFDIM + NDD + NHOST + NFMT + NMARK)

static int on(unsigned feat, int f) { return (feat >> f) & 1; }

/* A feature another requires is switched on with it (the library's rows say the same). */
static unsigned normalise(unsigned feat)
{
    if (on(feat, F_EF))
        feat |= 1u << F_COMPRESS;
    if (on(feat, F_LATE)) /* the placement of sharded updates */
        feat |= 1u << F_SHARD;
    return feat;
}

static int targets(const combo_t *c, int *out)
{
    int n = 0;
    unsigned f = c->feat;
    for (int a = 0; a < NF; a++)
        for (int b = a + 1; b < NF; b++)
            out[n++] = (a * NF + b) * 4 + on(f, a) * 2 + on(f, b);
    for (int i = 0; i < NTRIPLE_SET; i++)
        for (int j = i + 1; j < NTRIPLE_SET; j++)
            for (int k = j + 1; k < NTRIPLE_SET; k++)
                out[n++] = NPAIR + ((i * NTRIPLE_SET + j) * NTRIPLE_SET + k) * 8 + on(f, triple_set[i]) * 4 +
                           on(f, triple_set[j]) * 2 + on(f, triple_set[k]);
    for (int a = 0; a < NF; a++)
        for (int d = 0; d < NDIM; d++)
            out[n++] = NPAIR + NTRIP + ((a * 2 + on(f, a)) * NDIM + d) * 4 + c->dim[d];
    for (int d = 0; d < NDIM; d++)
        for (int e = d + 1; e < NDIM; e++)
            out[n++] = NPAIR + NTRIP + NFDIM + (d * 4 + c->dim[d]) * NDIM * 4 + e * 4 + c->dim[e];
    for (int a = 0; a < NF && c->dim[3] == 0 && c->dim[4] > 0; a++)
        for (int b = a + 1; b < NF; b++)
            if (on(f, a) && on(f, b))
                out[n++] = NPAIR + NTRIP + NFDIM + NDD + a * NF + b;
    /* A format only acts with compression on several ranks: each feature and each schedule meet
     * each format there. */
    for (int a = 0; a < NF && on(f, F_COMPRESS) && c->dim[4] > 0; a++)
        if (on(f, a))
            out[n++] = NPAIR + NTRIP + NFDIM + NDD + NHOST + a * NFORMAT + c->dim[6];
    if (on(f, F_COMPRESS) && c->dim[4] > 0)
        out[n++] = NPAIR + NTRIP + NFDIM + NDD + NHOST + NF * NFORMAT + c->dim[0] * NFORMAT + c->dim[6];
    /* Marked early groups act under dear on several ranks where nothing turns early groups off
     * (clipping, the count of ranks with a gradient, slices stepped at backward_end): there each
     * feature and each pair of features meets them, and each transport and memory row. */
    int base = NPAIR + NTRIP + NFDIM + NDD + NHOST + NFMT;
    if (c->dim[1] == 3 && c->dim[0] == 0 && c->dim[4] > 0 && !on(f, F_CLIP) && !on(f, F_UNUSED) && !on(f, F_LATE)) {
        for (int a = 0; a < NF; a++)
            for (int b = a; b < NF; b++)
                if (on(f, a) && on(f, b))
                    out[n++] = base + a * NF + b;
        out[n++] = base + NF * NF + c->dim[2] * NMEM + c->dim[3];
    }
    return n;
}

/* The names of the features of c, as dear_commit's refusal says them. */
static unsigned lib_features(const combo_t *c)
{
    unsigned f = 0;
    static const struct { int test; int lib; } map[] = {
        { F_SHARD, DEAR_FEAT_SHARD }, { F_COMPRESS, DEAR_FEAT_COMPRESS }, { F_CLIP, DEAR_FEAT_CLIP },
        { F_SPARSE, DEAR_FEAT_SPARSE }, { F_UNUSED, DEAR_FEAT_UNUSED }, { F_PART, DEAR_FEAT_PARTITION },
        { F_DETERM, DEAR_FEAT_DETERMINISTIC }, { F_FINITE, DEAR_FEAT_FINITE } };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (on(c->feat, map[i].test))
            f |= 1u << map[i].lib;
    if (c->dim[3] == MEM_CUDA)
        f |= 1u << DEAR_FEAT_CUDA;
    return f;
}

/* CUDA memory: the collectives of case c run in NCCL or staged through host buffers, by turns. */
static const char *cuda_transport(const combo_t *c) { return (c->dim[0] + c->dim[2]) % 2 ? "staged" : "nccl"; }

static dear_compress_t wire_format(const combo_t *c)
{
    static const dear_compress_t f[NFORMAT] = { DEAR_COMPRESS_BF16, DEAR_COMPRESS_FP16, DEAR_COMPRESS_INT8 };
    return f[c->dim[6]];
}

/* Whether the library refuses case c at commit (its message in msg): the feature table's pairs,
 * and int8's (the deterministic mode, NCCL). */
static int refused(const combo_t *c, char *msg, size_t len)
{
    char tmp[512];
    int split = c->dim[0] == 0 || on(c->feat, F_SHARD);
    if (dear_feature_refused(lib_features(c), split, msg ? msg : tmp, msg ? len : sizeof tmp))
        return 1;
    int nccl = c->dim[3] == MEM_CUDA && strcmp(cuda_transport(c), "nccl") == 0 && !dear_nccl_alltoall();
    return on(c->feat, F_COMPRESS) && wire_format(c) == DEAR_COMPRESS_INT8 &&
           dear_compress_int8_refused(on(c->feat, F_DETERM), nccl, msg ? msg : tmp, msg ? len : sizeof tmp);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Greedy covering: from a fixed stream of random candidates, each round keeps the one covering
 * the most targets not yet covered, until every reachable target is. */
static void make_cases(void)
{
    static unsigned char covered[NTARGET];
    int t[NTARGET];
    uint64_t seed = 20261127;
    memset(covered, 0, sizeof covered);
    ncases = 0;
    while (ncases < MAX_CASES) {
        combo_t best = { 0 };
        int best_gain = 0;
        for (int k = 0; k < 400; k++) {
            combo_t c = { 0 };
            for (int f = 0; f < NF; f++)
                c.feat |= (unsigned)(lcg(&seed) % 2) << f;
            c.feat = normalise(c.feat);
            for (int d = 0; d < NDIM; d++)
                c.dim[d] = (int)(lcg(&seed) % (uint64_t)dim_size[d]);
            if (c.dim[3] != MEM_HOST) /* the delayed row and CUDA run at np 2 and 3 */
                c.dim[4] = 1 + c.dim[4] % 2;
            if (refused(&c, NULL, 0)) /* covers nothing: it never trains */
                continue;
            int n = targets(&c, t), gain = 0;
            for (int i = 0; i < n; i++)
                gain += !covered[t[i]];
            if (gain > best_gain) {
                best_gain = gain;
                best = c;
            }
        }
        if (best_gain == 0)
            break;
        int n = targets(&best, t);
        for (int i = 0; i < n; i++)
            covered[t[i]] = 1;
        cases[ncases++] = best;
    }
    /* The two reproductions of sharded updates with error feedback writing outside the bucket's
     * data: tensors apart, and an arena with a frozen tensor inside a bucket. */
    static const combo_t known[] = {
        { (1u << F_SHARD) | (1u << F_COMPRESS) | (1u << F_EF), { 0, 0, 0, 0, 1, 0, 0 } },
        { (1u << F_SHARD) | (1u << F_COMPRESS) | (1u << F_EF) | (1u << F_FREEZE), { 1, 0, 0, 0, 2, 1, 1 } },
        /* int8 on CUDA memory through NCCL: its chunks by all-to-all (no feature pair: the format and
         * the transport) */
        { 1u << F_COMPRESS, { 0, 0, 0, MEM_CUDA, 1, 0, 2 } },
        /* Sharded slices stepped during backward under dear (no clipping, no count of ranks with a
         * gradient): with partitions under the deterministic mode (a second plan, bit for bit),
         * and through auto's plan switches on 4 ranks, also stepped at backward_end only. */
        { (1u << F_SHARD) | (1u << F_PART) | (1u << F_DETERM), { 0, 1, 0, 0, 2, 0, 0 } },
        { (1u << F_SHARD) | (1u << F_SPARSE) | (1u << F_FREEZE) | (1u << F_ACCUM) | (1u << F_FINITE),
          { 0, 2, 1, 0, 3, 1, 0 } },
        { (1u << F_SHARD) | (1u << F_SPARSE) | (1u << F_FREEZE) | (1u << F_ACCUM) | (1u << F_FINITE) | (1u << F_LATE),
          { 0, 2, 1, 0, 3, 1, 0 } },
        /* Marked early groups on CUDA memory, through NCCL with sharded sparse partitions, and
         * staged with fed-back bf16 under the deterministic mode (a random draw seldom meets
         * every condition under which the marks act). */
        { (1u << F_SHARD) | (1u << F_SPARSE) | (1u << F_PART), { 0, 3, 0, MEM_CUDA, 1, 0, 0 } },
        { (1u << F_COMPRESS) | (1u << F_EF) | (1u << F_DETERM) | (1u << F_PART), { 0, 3, 1, MEM_CUDA, 2, 1, 0 } },
    };
    for (size_t k = 0; k < sizeof known / sizeof known[0] && ncases < MAX_CASES; k++)
        cases[ncases++] = known[k];
    /* And each pair the library refuses, once at every rank count, with everything else off. */
    for (int a = 0; a < NF; a++)
        for (int b = a + 1; b < NF; b++)
            for (int sched = 0; sched < NSCHED; sched++)
                for (int fmt = 0; fmt < NFORMAT; fmt++) {
                    combo_t c = { .feat = normalise(1u << a | 1u << b),
                                  .dim = { sched, 0, 0, 0, (a + b) % NNP, 0, fmt } };
                    /* once per format where the format is what is refused */
                    int again = fmt > 0 && !refused(&(combo_t){ c.feat, { sched, 0, 0, 0, (a + b) % NNP, 0, 0 } }, NULL, 0);
                    if (ncases < MAX_CASES && refused(&c, NULL, 0) && (fmt == 0 || again))
                        cases[ncases++] = c;
                }
}

static void describe(const combo_t *c, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "np %d, %s, %s, %s, %s%s%s, %s:", c->dim[4] + 1, scheds[c->dim[0]],
                                planners[c->dim[1]], transports[c->dim[2]], mems[c->dim[3]],
                                c->dim[3] == MEM_CUDA ? " " : "", c->dim[3] == MEM_CUDA ? cuda_transport(c) : "",
                                layouts[c->dim[5]]);
    if (on(c->feat, F_COMPRESS))
        n += (size_t)snprintf(buf + n, len - n, " %s", formats[c->dim[6]]);
    for (int f = 0; f < NF && n < len; f++)
        if (on(c->feat, f))
            n += (size_t)snprintf(buf + n, len - n, " %s", fname[f]);
}

/* ---- the model: tensors malloc'ed one by one between guard regions (device memory under CUDA) ---- */

#define NT 7
#define ITERS 10
#define GUARD 64
#define STEP 0.1
#define MAX_NORM 2.0
#define FREEZE_AT 4
#define ROW 8

static const size_t counts[NT] = { 128, 300, 7, 1000, 50, 33, 5 };
static const int layer_of[NT] = { 0, 1, 1, 2, 2, 3, 3 };
#define T_SPARSE 0
#define T_FROZEN 4
#define T_LATE_FROZEN 1
#define T_UNUSED 5
static const uint32_t canary = 0x7fa5a5a5u;

typedef struct {
    unsigned feat;
    int arena;                  /* one allocation for the gradients, one for the parameters */
    float *g[NT], *w[NT];       /* each GUARD floats past the start of its allocation (apart); the
                                 * library's: device memory under CUDA */
    float *hg[NT], *hw[NT];     /* the program's view of them: g and w themselves on the host, pinned
                                 * copies of the device's under CUDA (to_host, push_grad) */
    double *ref[NT];            /* the reference's parameters */
    float *fz[NT];              /* a frozen tensor's gradient as the program wrote it last */
    int *hits;                  /* [ITERS][elements]: updates of each element per iteration */
    size_t off[NT + 1];
    char why[256];              /* the first thing the update callback found wrong */
} model_t;

static float *guarded(size_t n)
{
    size_t bytes = (n + 2 * GUARD) * sizeof(uint32_t);
    uint32_t *p = malloc(bytes);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n + 2 * GUARD; i++)
        p[i] = canary;
#ifdef DEAR_TEST_MEM_CUDA
    void *d = NULL;
    CK_CUDA(cudaMalloc(&d, bytes));
    CK_CUDA(cudaMemcpy(d, p, bytes, cudaMemcpyHostToDevice));
    free(p);
    return (float *)d + GUARD;
#else
    return (float *)(p + GUARD);
#endif
}

static void guarded_free(float *v)
{
#ifdef DEAR_TEST_MEM_CUDA
    CK_CUDA(cudaFree(v - GUARD));
#else
    free((uint32_t *)v - GUARD);
#endif
}

/* A host view of n floats: the library's own memory on the host, pinned memory under CUDA. */
static float *host_view(float *lib, size_t n)
{
#ifdef DEAR_TEST_MEM_CUDA
    void *h = NULL;
    CK_CUDA(cudaMallocHost(&h, n * sizeof(float)));
    return h;
#else
    (void)n;
    return lib;
#endif
}

static size_t guards_broken(const float *v, size_t n)
{
    uint32_t p[2 * GUARD];
#ifdef DEAR_TEST_MEM_CUDA /* nothing writes the guards: no stream need be waited for */
    CK_CUDA(cudaMemcpy(p, v - GUARD, GUARD * sizeof *p, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(p + GUARD, v + n, GUARD * sizeof *p, cudaMemcpyDeviceToHost));
#else
    memcpy(p, (const uint32_t *)v - GUARD, GUARD * sizeof *p);
    memcpy(p + GUARD, v + n, GUARD * sizeof *p);
#endif
    size_t bad = 0;
    for (size_t i = 0; i < 2 * GUARD; i++)
        bad += p[i] != canary;
    return bad;
}

static void model_init(model_t *m, unsigned feat, int arena)
{
    memset(m, 0, sizeof *m);
    m->feat = feat;
    m->arena = arena;
    for (int t = 0; t < NT; t++)
        m->off[t + 1] = m->off[t] + counts[t];
    float *ga = arena ? guarded(m->off[NT]) : NULL, *wa = arena ? guarded(m->off[NT]) : NULL;
    float *hga = arena ? host_view(ga, m->off[NT]) : NULL, *hwa = arena ? host_view(wa, m->off[NT]) : NULL;
    for (int t = 0; t < NT; t++) {
        m->g[t] = arena ? ga + m->off[t] : guarded(counts[t]);
        m->w[t] = arena ? wa + m->off[t] : guarded(counts[t]);
        m->hg[t] = arena ? hga + m->off[t] : host_view(m->g[t], counts[t]);
        m->hw[t] = arena ? hwa + m->off[t] : host_view(m->w[t], counts[t]);
        m->ref[t] = malloc(counts[t] * sizeof(double));
        m->fz[t] = malloc(counts[t] * sizeof(float));
        ck_assert_ptr_nonnull(m->ref[t]);
        ck_assert_ptr_nonnull(m->fz[t]);
        for (size_t i = 0; i < counts[t]; i++) {
            m->hw[t][i] = (float)cos(0.3 * (double)(m->off[t] + i));
            m->ref[t][i] = m->hw[t][i];
            m->hg[t][i] = 0;
        }
#ifdef DEAR_TEST_MEM_CUDA
        CK_CUDA(cudaMemcpy(m->g[t], m->hg[t], counts[t] * sizeof(float), cudaMemcpyHostToDevice));
        CK_CUDA(cudaMemcpy(m->w[t], m->hw[t], counts[t] * sizeof(float), cudaMemcpyHostToDevice));
#endif
    }
    m->hits = calloc(ITERS * m->off[NT], sizeof *m->hits);
    ck_assert_ptr_nonnull(m->hits);
}

static void model_free(model_t *m)
{
    for (int t = 0; t < NT; t++) {
        if (!m->arena || t == 0) {
            guarded_free(m->g[t]);
            guarded_free(m->w[t]);
#ifdef DEAR_TEST_MEM_CUDA
            CK_CUDA(cudaFreeHost(m->hg[t]));
            CK_CUDA(cudaFreeHost(m->hw[t]));
#endif
        }
        free(m->ref[t]);
        free(m->fz[t]);
    }
    free(m->hits);
}

static int frozen(const model_t *m, int t, long long it)
{
    return on(m->feat, F_FREEZE) && (t == T_FROZEN || (t == T_LATE_FROZEN && it >= FREEZE_AT));
}

/* F_UNUSED: tensor T_UNUSED has no gradient anywhere every third iteration, and none on the last
 * rank in odd ones. */
static int has_grad(const model_t *m, int t, int r, long long it)
{
    if (!on(m->feat, F_UNUSED) || t != T_UNUSED)
        return 1;
    return it % 3 != 2 && !(r == nranks - 1 && it % 2 == 1);
}

static int used_anywhere(const model_t *m, int t, long long it)
{
    for (int r = 0; r < nranks; r++)
        if (has_grad(m, t, r, it))
            return 1;
    return 0;
}

static int micro_batches(const model_t *m) { return on(m->feat, F_ACCUM) ? 2 : 1; }

/* One micro-batch's gradient of element i of tensor t on rank r, from the parameter w. The
 * sparse tensor's rows are zero but for two: one per rank, one per iteration. */
static double grad_value(int t, size_t i, int r, long long it, int mb, double w)
{
    if (t == T_SPARSE) {
        size_t row = i / ROW, rows = counts[t] / ROW;
        if (row != (size_t)r % rows && row != (size_t)(3 * it + 5) % rows)
            return 0;
    }
    return 0.5 * sin(0.37 * (double)i + 1.1 * t + 0.7 * r + 0.13 * (double)it + 0.4 * mb) + 0.05 * w;
}

/* The reference: every rank's gradient summed in float64 with MPI_Allreduce, averaged, clipped,
 * applied to float64 parameters. */
static void reference(model_t *m)
{
    size_t n = m->off[NT];
    double *g = malloc(n * sizeof *g);
    ck_assert_ptr_nonnull(g);
    for (long long it = 0; it < ITERS; it++) {
        for (int t = 0; t < NT; t++)
            for (size_t i = 0; i < counts[t]; i++) {
                double s = 0;
                for (int mb = 0; mb < micro_batches(m) && has_grad(m, t, rank, it); mb++)
                    s += grad_value(t, i, rank, it, mb, m->ref[t][i]);
                g[m->off[t] + i] = s;
            }
        MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double sq = 0;
        for (int t = 0; t < NT; t++)
            for (size_t i = 0; i < counts[t]; i++) {
                g[m->off[t] + i] /= nranks;
                sq += frozen(m, t, it) ? 0 : g[m->off[t] + i] * g[m->off[t] + i];
            }
        double coef = on(m->feat, F_CLIP) ? fmin(1.0, MAX_NORM / (sqrt(sq) + 1e-6)) : 1.0;
        for (int t = 0; t < NT; t++)
            for (size_t i = 0; i < counts[t] && !frozen(m, t, it) && used_anywhere(m, t, it); i++)
                m->ref[t][i] -= STEP * coef * g[m->off[t] + i];
    }
    free(g);
}

/* ---- the same loop through libdear ---- */

/* The stream the updates are handed: the program's under CUDA, none on the host. */
static void *prog_stream(void)
{
#ifdef DEAR_TEST_MEM_CUDA
    return (void *)stream;
#else
    return NULL;
#endif
}

/* Under CUDA: the host views made current, once the program's stream ran what it was given
 * (forward_begin and backward_end make it wait for the library's results). */
static void to_host(model_t *m)
{
#ifdef DEAR_TEST_MEM_CUDA
    CK_CUDA(cudaStreamSynchronize(stream));
    for (int t = 0; t < NT; t++) {
        CK_CUDA(cudaMemcpy(m->hg[t], m->g[t], counts[t] * sizeof(float), cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(m->hw[t], m->w[t], counts[t] * sizeof(float), cudaMemcpyDeviceToHost));
    }
#else
    (void)m;
#endif
}

/* Under CUDA: tensor t's gradient, as the program wrote it in its host view, to the device on the
 * program's stream (the view is not written again before to_host waits for the stream). */
static void push_grad(const model_t *m, int t)
{
#ifdef DEAR_TEST_MEM_CUDA
    CK_CUDA(cudaMemcpyAsync(m->g[t], m->hg[t], counts[t] * sizeof(float), cudaMemcpyHostToDevice, stream));
#else
    (void)m;
    (void)t;
#endif
}

static int update(const dear_update_info_t *u)
{
    model_t *m = u->arg;
    int t = u->tensor;
    if (m->why[0])
        return 1;
    if (u->size < sizeof *u || t < 0 || t >= NT || u->iteration < 0 || u->iteration >= ITERS ||
        u->tensor_count != counts[t] || u->offset + u->count > counts[t] || u->dtype != DEAR_FLOAT32 ||
        u->grad != m->g[t] + u->offset || u->param != m->w[t] + u->offset ||
        (MEM_KIND == MEM_CUDA) != (u->mem == DEAR_MEM_CUDA) || u->stream != prog_stream() ||
        (!on(m->feat, F_SHARD) && u->count != counts[t])) {
        snprintf(m->why, sizeof m->why, "tensor %d, iteration %lld: the callback's slice [%zu, +%zu) or its pointers "
                 "are wrong", t, u->iteration, u->offset, u->count);
        return 1;
    }
    int *hits = m->hits + (size_t)u->iteration * m->off[NT] + m->off[t] + u->offset;
    for (size_t i = 0; i < u->count; i++)
        hits[i]++;
#ifdef DEAR_TEST_MEM_CUDA
    if (tk_sgd((cudaStream_t)u->stream, u->param, u->grad, DEAR_FLOAT32, u->count, (float)STEP) != cudaSuccess) {
        snprintf(m->why, sizeof m->why, "tensor %d, iteration %lld: the update kernel failed", t, u->iteration);
        return 1;
    }
#else
    const float *g = u->grad;
    float *w = u->param;
    for (size_t i = 0; i < u->count; i++)
        w[i] -= (float)STEP * g[i];
#endif
    return 0;
}

/* A frozen tensor takes no part: the library never writes its gradient. */
static void check_frozen(const model_t *m, const char *what, long long it)
{
    for (int t = 0; t < NT; t++) {
        if (!frozen(m, t, it) || !frozen(m, t, it - 1))
            continue;
        size_t differ = 0;
        for (size_t i = 0; i < counts[t]; i++)
            differ += memcmp(&m->hg[t][i], &m->fz[t][i], sizeof(float)) != 0;
        ck_assert_msg(differ == 0, "%s: before iteration %lld, %zu of the %zu gradient elements of frozen tensor %d "
                      "were changed by the library", what, it, differ, counts[t], t);
    }
}

static void backward(dear_ctx_t *ctx, model_t *m, long long it, int mb, const char *what)
{
    to_host(m);
    if (mb == 0 && it > 0)
        check_frozen(m, what, it);
    for (int l = 3; l >= 0; l--) {
        for (int t = NT - 1; t >= 0; t--) {
            if (layer_of[t] != l)
                continue;
            if (!has_grad(m, t, rank, it)) {
                ck_assert_int_eq(dear_no_grad(ctx, t), DEAR_OK);
                continue;
            }
            for (size_t i = 0; i < counts[t]; i++)
                m->hg[t][i] = (float)((mb ? m->hg[t][i] : 0.0f) + grad_value(t, i, rank, it, mb, m->hw[t][i]));
            memcpy(m->fz[t], m->hg[t], counts[t] * sizeof(float));
            push_grad(m, t);
        }
        ck_assert_int_eq(dear_backward_done(ctx, l), DEAR_OK);
    }
    ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
}

static void check_guards(const model_t *m, const char *what, long long it)
{
    for (int t = 0; t < (m->arena ? 1 : NT); t++) {
        size_t n = m->arena ? m->off[NT] : counts[t];
        size_t bg = guards_broken(m->g[t], n), bw = guards_broken(m->w[t], n);
        ck_assert_msg(bg == 0 && bw == 0, "%s: after iteration %lld, %zu guard floats of tensor %d's gradient and %zu "
                      "of its parameters changed", what, it, bg, t, bw);
    }
}

static const char *const env_names[] = { "DEAR_SCHEDULE", "DEAR_FUSION", "DEAR_FUSION_THRESHOLD", "DEAR_PARTITION",
                                         "DEAR_DETERMINISTIC", "DEAR_TRANSPORT", "DEAR_COMPRESS", "DEAR_COMPRESS_EF",
                                         "DEAR_FIND_UNUSED", "DEAR_SPARSE", "DEAR_WARMUP_ITERS", "DEAR_VERIFY_ITERS",
                                         "DEAR_REPLAN_EVERY", "DEAR_CALIBRATE", "DEAR_COST_PRESET", "DEAR_SHARD",
                                         "DEAR_CUDA_TRANSPORT", "DEAR_CHECK_FINITE", "DEAR_SHARD_EARLY",
                                         "DEAR_DEBUG_EARLY" };

static void env_clear(void)
{
    for (size_t i = 0; i < sizeof env_names / sizeof env_names[0]; i++)
        unsetenv(env_names[i]);
}

/* The environment of case c; other_plan: the second plan of the deterministic comparison. */
static void env_set(const combo_t *c, int other_plan)
{
    env_clear();
    setenv("DEAR_SCHEDULE", scheds[c->dim[0]], 1);
    setenv("DEAR_TRANSPORT", transports[c->dim[2]], 1);
    setenv("DEAR_FUSION", c->dim[1] == 3 ? "threshold" : planners[c->dim[1]], 1);
    if (c->dim[1] == 3)
        setenv("DEAR_DEBUG_EARLY", "alternate", 1);
    /* several buckets, of tensors apart in memory; marked: groups of a tensor or two, so that early
     * and regular ones interleave */
    setenv("DEAR_FUSION_THRESHOLD", c->dim[1] == 3 ? "512" : "2k", 1);
    setenv("DEAR_WARMUP_ITERS", "2", 1);
    setenv("DEAR_CALIBRATE", "off", 1);
    setenv("DEAR_COST_PRESET", "10gbe", 1);
    if (c->dim[1] == 2) { /* auto switches online, checks the switch, and plans again */
        setenv("DEAR_VERIFY_ITERS", "1", 1);
        setenv("DEAR_REPLAN_EVERY", "4", 1);
    }
    if (on(c->feat, F_PART))
        setenv("DEAR_PARTITION", "1k", 1);
    if (on(c->feat, F_DETERM))
        setenv("DEAR_DETERMINISTIC", "1", 1);
    if (on(c->feat, F_COMPRESS))
        setenv("DEAR_COMPRESS", wire_format(c) == DEAR_COMPRESS_INT8 ? "int8"
                                : wire_format(c) == DEAR_COMPRESS_FP16 ? "fp16" : "bf16", 1);
    /* int8's feedback is on unless set off: the feature's setting, said either way */
    if (on(c->feat, F_EF) || (on(c->feat, F_COMPRESS) && wire_format(c) == DEAR_COMPRESS_INT8))
        setenv("DEAR_COMPRESS_EF", on(c->feat, F_EF) ? "1" : "0", 1);
    if (on(c->feat, F_UNUSED))
        setenv("DEAR_FIND_UNUSED", "1", 1);
    if (on(c->feat, F_SPARSE))
        setenv("DEAR_SPARSE", "on", 1);
    if (on(c->feat, F_FINITE)) /* the gradients are finite: nothing may be reported */
        setenv("DEAR_CHECK_FINITE", "abort", 1);
    if (on(c->feat, F_LATE))
        setenv("DEAR_SHARD_EARLY", "0", 1);
    if (c->dim[3] == MEM_CUDA)
        setenv("DEAR_CUDA_TRANSPORT", cuda_transport(c), 1);
    if (other_plan) { /* one bucket of whole tensors, or chunks of 256 bytes */
        setenv("DEAR_FUSION", "threshold", 1);
        setenv("DEAR_FUSION_THRESHOLD", on(c->feat, F_PART) ? "64m" : "512", 1);
        setenv("DEAR_PARTITION", on(c->feat, F_PART) ? "256" : "16m", 1);
    }
}

/* The sparse tensor's phases as the features leave them: sharded updates keep the reduce-scatter
 * sparse (the all-gathers carry parameters), the deterministic mode sends it dense. */
static void check_sparse_phases(dear_ctx_t *ctx, const combo_t *c, const char *what)
{
    if (!on(c->feat, F_SPARSE))
        return;
    dear_sparse_stats_t st = { .size = sizeof st };
    ck_assert_int_eq(dear_get_sparse_stats(ctx, T_SPARSE, &st), DEAR_OK);
    int rs = !on(c->feat, F_DETERM), ag = rs && !on(c->feat, F_SHARD) && c->dim[0] == 0;
    ck_assert_msg(st.sparse_rs == rs && st.sparse_ag == ag,
                  "%s: the sparse tensor's phases run %s, %s; expected %s, %s", what,
                  st.sparse_rs ? "sparse" : "dense", st.sparse_ag ? "sparse" : "dense", rs ? "sparse" : "dense",
                  ag ? "sparse" : "dense");
}

/* Train case c; returns 0, or 1 when commit refused it (checked here). */
static int run(const combo_t *c, model_t *m, int other_plan, const char *what)
{
    env_set(c, other_plan);
    ck_assert_msg(c->dim[3] == MEM_KIND, "%s: %s memory needs another build of test_combo", what, mems[c->dim[3]]);
#ifdef DEAR_TEST_MEM_DELAY
    dear_rt_mem_set_host_row(NULL);
    mem_delay_install();
#endif
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
#ifdef DEAR_TEST_MEM_CUDA
    ck_assert_int_eq(dear_set_stream(ctx, (void *)stream), DEAR_OK);
#endif
    if (nranks > 1) /* one rank talks to nobody: no transport is set up */
        ck_assert_str_eq(dear_transport(ctx), transports[c->dim[2]]);
    for (int t = 0; t < NT; t++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", t);
        ck_assert_int_eq(dear_register(ctx, name, layer_of[t], m->g[t], counts[t], DEAR_FLOAT32,
                                       MEM_KIND == MEM_CUDA ? DEAR_MEM_CUDA : DEAR_MEM_HOST, update, m),
                         DEAR_OK);
        ck_assert_int_eq(dear_set_param(ctx, t, m->w[t]), DEAR_OK);
    }
    if (on(m->feat, F_SPARSE))
        ck_assert_int_eq(dear_register_sparse(ctx, T_SPARSE, ROW), DEAR_OK);
    if (on(m->feat, F_CLIP))
        ck_assert_int_eq(dear_set_clip_norm(ctx, MAX_NORM), DEAR_OK);
    if (on(m->feat, F_FREEZE))
        ck_assert_int_eq(dear_freeze(ctx, T_FROZEN, 1), DEAR_OK);
    if (on(m->feat, F_SHARD))
        ck_assert_int_eq(dear_set_shard(ctx, DEAR_SHARD_ON), DEAR_OK);
    char msg[512];
    int refuse = refused(c, msg, sizeof msg);
    capture_start();
    int rc = dear_commit(ctx);
    capture_stop();
    if (getenv("COMBO_VERBOSE") && rank == 0)
        fputs(logbuf, stderr);
    if (refuse) {
        ck_assert_msg(rc != DEAR_OK, "%s: dear_commit accepted a pair the feature table refuses (%s)", what, msg);
        ck_assert_msg(strstr(logbuf, msg) != NULL, "%s: dear_commit's error does not say '%s': %s", what, msg, logbuf);
        ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
        env_clear();
        return 1;
    }
    ck_assert_msg(rc == DEAR_OK, "%s: dear_commit failed (%s): %s", what, dear_status_string(rc), logbuf);
    for (long long it = 0; it < ITERS; it++) {
        if (on(m->feat, F_FREEZE) && it == FREEZE_AT)
            ck_assert_int_eq(dear_freeze(ctx, T_LATE_FROZEN, 1), DEAR_OK);
        int mbs = micro_batches(m);
        for (int mb = 0; mb < mbs; mb++) {
            ck_assert_int_eq(dear_set_mode(ctx, mb < mbs - 1 ? DEAR_MODE_ACCUMULATE : DEAR_MODE_TRAIN), DEAR_OK);
            for (int l = 0; l < 4; l++)
                ck_assert_int_eq(dear_forward_begin(ctx, l), DEAR_OK);
            backward(ctx, m, it, mb, what);
        }
        check_guards(m, what, it);
        ck_assert_msg(m->why[0] == 0, "%s: %s", what, m->why);
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    check_sparse_phases(ctx, c, what);
    to_host(m);
    check_guards(m, what, ITERS);
    check_frozen(m, what, ITERS);
    ck_assert_msg(m->why[0] == 0, "%s: %s", what, m->why);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
#ifdef DEAR_TEST_MEM_DELAY
    dear_rt_mem_set_host_row(NULL);
#endif
    env_clear();
    return 0;
}

/* The tolerance of a parameter after ITERS steps: each step's gradient (|g| < 1) off by at most
 * two roundings to the wire format (a contribution and the average; int8: half a block scale,
 * 1/254, each), or float32's sums. */
static double tolerance(const combo_t *c)
{
    double ulp = 0x1p-20;
    if (on(c->feat, F_COMPRESS) && nranks > 1)
        ulp = wire_format(c) == DEAR_COMPRESS_INT8 ? 1.0 / 254 : wire_format(c) == DEAR_COMPRESS_FP16 ? 0x1p-11 : 0x1p-8;
    return 2.0 * ITERS * STEP * ulp * 1.2 + 1e-6;
}

static void check_case(const combo_t *c, const char *what)
{
    model_t m;
    model_init(&m, c->feat, c->dim[5]);
    if (run(c, &m, 0, what)) {
        model_free(&m);
        return;
    }
    reference(&m);
    size_t n = m.off[NT];
    /* Every element once per iteration where its tensor is updated (over the ranks, sharded). */
    if (on(c->feat, F_SHARD))
        MPI_Allreduce(MPI_IN_PLACE, m.hits, (int)(ITERS * n), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (long long it = 0; it < ITERS; it++)
        for (int t = 0; t < NT; t++) {
            int want = !frozen(&m, t, it) && used_anywhere(&m, t, it);
            for (size_t i = 0; i < counts[t]; i++) {
                int h = m.hits[(size_t)it * n + m.off[t] + i];
                ck_assert_msg(h == want, "%s: element %zu of tensor %d updated %d time(s) in iteration %lld, "
                              "expected %d", what, i, t, h, it, want);
            }
        }
    /* The float64 reference, within the wire format's tolerance. */
    double tol = tolerance(c), worst = 0;
    int wt = 0;
    size_t wi = 0;
    for (int t = 0; t < NT; t++)
        for (size_t i = 0; i < counts[t]; i++) {
            double d = fabs(m.hw[t][i] - m.ref[t][i]);
            if (!(d <= worst)) {
                worst = d;
                wt = t;
                wi = i;
            }
        }
    ck_assert_msg(worst <= tol, "%s: tensor %d element %zu is %.9g, the float64 reference %.9g (tolerance %g)", what,
                  wt, wi, m.hw[wt][wi], m.ref[wt][wi], tol);
    /* The same parameters on every rank, bit for bit. */
    uint32_t *bits = malloc(2 * n * sizeof *bits);
    ck_assert_ptr_nonnull(bits);
    for (int t = 0; t < NT; t++)
        memcpy(bits + m.off[t], m.hw[t], counts[t] * sizeof(float));
    memcpy(bits + n, bits, n * sizeof *bits);
    MPI_Allreduce(MPI_IN_PLACE, bits, (int)n, MPI_UINT32_T, MPI_BAND, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, bits + n, (int)n, MPI_UINT32_T, MPI_BOR, MPI_COMM_WORLD);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += bits[i] != bits[n + i];
    free(bits);
    ck_assert_msg(differ == 0, "%s: %zu of %zu parameters differ between ranks", what, differ, n);
    /* Deterministic: another plan, the same bits. */
    if (on(c->feat, F_DETERM)) {
        model_t b;
        model_init(&b, c->feat, c->dim[5]);
        ck_assert_int_eq(run(c, &b, 1, what), 0);
        differ = 0;
        for (int t = 0; t < NT; t++)
            for (size_t i = 0; i < counts[t]; i++)
                differ += memcmp(&m.hw[t][i], &b.hw[t][i], sizeof(float)) != 0;
        ck_assert_msg(differ == 0, "%s: %zu of %zu parameters differ between two plans under DEAR_DETERMINISTIC", what,
                      differ, n);
        model_free(&b);
    }
    model_free(&m);
}

/* ---- the cases of this rank count ---- */

static int mine[MAX_CASES], nmine;

START_TEST(test_combo)
{
    const combo_t *c = &cases[mine[_i]];
    char what[256];
    describe(c, what, sizeof what);
    char full[300];
    snprintf(full, sizeof full, "case %d (%s)", mine[_i], what);
    check_case(c, full);
}
END_TEST

/* The cover itself: every target reached (a self-check of the design above). */
START_TEST(test_cover)
{
    ck_assert_int_gt(ncases, 0);
    ck_assert_int_lt(ncases, MAX_CASES);
    for (int a = 0; a < NF; a++)
        for (int b = a + 1; b < NF; b++) {
            int seen = 0;
            for (int k = 0; k < ncases && !seen; k++)
                seen = on(cases[k].feat, a) && on(cases[k].feat, b);
            ck_assert_msg(seen, "no case has %s and %s together", fname[a], fname[b]);
        }
}
END_TEST

int main(int argc, char **argv)
{
    mpi_suite_init(&argc, &argv, &rank, &nranks);
    make_cases();
    const char *only = getenv("COMBO_CASE");
#ifdef DEAR_TEST_MEM_CUDA
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "test_combo_cuda: no CUDA device\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    cudaSetDevice(rank % ndev); /* a GPU per rank where there are enough */
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
#endif
    for (int k = 0; k < ncases; k++) {
        if (getenv("COMBO_LIST") && rank == 0) {
            char what[256];
            describe(&cases[k], what, sizeof what);
            printf("%d: %s\n", k, what);
        }
        if (only ? atoi(only) == k : cases[k].dim[4] + 1 == nranks && cases[k].dim[3] == MEM_KIND)
            mine[nmine++] = k;
    }
    if (getenv("COMBO_LIST")) {
        MPI_Finalize();
        return 0;
    }
    Suite *s = suite_create("combo");
    TCase *tc = tcase_create("combo");
    tcase_set_timeout(tc, 0);
    tcase_add_test(tc, test_cover);
    tcase_add_loop_test(tc, test_combo, 0, nmine);
    suite_add_tcase(s, tc);
    return mpi_suite_run(s, rank);
}
