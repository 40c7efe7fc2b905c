/*
 * model.c: dear-bench's emulated model. Every layer's forward and backward compute is a sleep of
 * its profiled time (sleeping, not spinning, so the cores stay free for the progress threads),
 * and the runtime is driven through the public hooks and update callbacks exactly as a trainer
 * drives it. The gradients cycle through a period-17 sequence of exact binary fractions indexed
 * by element, iteration and rank, and the update is plain SGD, so after a run the parameters of
 * every rank can be checked twice: against rank 0's bytes, and, for sampled elements, against
 * a float64 recomputation of the whole run from the closed form of the gradients.
 *
 * A tensor the profile declares sparse (a token embedding) is replayed as a batch of tokens: each
 * rank and iteration draws --tokens rows from a Zipf distribution, and only those rows of its
 * gradient are non-zero; the draw is a function of (tensor, iteration, rank), so the check can
 * draw it again.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "fusion/profile.h"
#include "include/dear.h"
#include "apps/bench/bench.h"
#include "apps/bench/model.h"

#define LR 0.05f
#define GRAD_PERIOD 17u         /* gradients cycle through 17 values: sums stay exact in float64 */
#define SAMPLE_TARGET 100000    /* elements recomputed in float64 per configuration */

/* ---- the model: scaled profile, arenas, deterministic gradients ---- */

static const float g_tab[GRAD_PERIOD] = {
    -8.0f / 1024, -7.0f / 1024, -6.0f / 1024, -5.0f / 1024, -4.0f / 1024, -3.0f / 1024,
    -2.0f / 1024, -1.0f / 1024, 0.0f,         1.0f / 1024,  2.0f / 1024,  3.0f / 1024,
    4.0f / 1024,  5.0f / 1024,  6.0f / 1024,  7.0f / 1024,  8.0f / 1024
};

/* Gradient of global element e at iteration it on rank r: a period-17 sequence, cheap to write
 * and to sum in closed form; depends on all three so a misplaced element or rank shows. */
static unsigned grad_index(size_t e, long it, int r)
{
    return (unsigned)((7u * (e % GRAD_PERIOD) + 13u * ((unsigned long)it % GRAD_PERIOD) +
                       29u * ((unsigned)r % GRAD_PERIOD)) % GRAD_PERIOD);
}

/* The dense sequence laid out once, GRAD_TILE elements (a multiple of the period) from any phase:
 * g_pat[j] = g_tab[7 j mod 17]. A fill copies it, so the emulated backward spends little core time
 * writing gradients, which on shared cores would hold back the progress threads. */
#define GRAD_TILE (GRAD_PERIOD * 1024u)
static float g_pat[GRAD_TILE + GRAD_PERIOD];

static void grad_pattern_init(void)
{
    for (unsigned j = 0; j < GRAD_TILE + GRAD_PERIOD; j++)
        g_pat[j] = g_tab[(7u * j) % GRAD_PERIOD];
}

static float param0(size_t e)
{
    return (float)((int)((3u * (e % 11u)) % 11u) - 5) * 0.125f;
}

/* splitmix64's finaliser: a counter-based generator, the same draw for the same input. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Rows of sparse tensor t touched on rank r in iteration it, as 0/1 in hit[0..rows). */
static void draw_rows(const bench_model_t *m, int t, long it, int r, unsigned char *hit)
{
    const sparse_t *sp = &m->sp[t];
    memset(hit, 0, sp->rows);
    uint64_t base = mix64((uint64_t)t * 0x9e3779b97f4a7c15ull + (uint64_t)it * 0xd1b54a32d192ed03ull +
                          (uint64_t)r * 0xbf58476d1ce4e5b9ull + 0x5eedull);
    for (long j = 0; j < sp->tokens; j++) {
        double u = (double)(mix64(base + (uint64_t)j) >> 11) * 0x1.0p-53;
        size_t lo = 0, hi = sp->rows - 1;   /* the first popularity rank whose cdf exceeds u */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (sp->cdf[mid] > u)
                hi = mid;
            else
                lo = mid + 1;
        }
        hit[(lo * sp->mult) % sp->rows] = 1;
    }
}

/* count elements of g_pat from phase j0 on, tile by tile, into dst. */
static void copy_tiles(float *dst, size_t count, unsigned j0)
{
    for (size_t i = 0; i < count; i += GRAD_TILE)
        memcpy(dst + i, g_pat + j0, (count - i < GRAD_TILE ? count - i : GRAD_TILE) * sizeof *dst);
}

static void fill_grad(bench_model_t *m, int t, long it, int r, int fault)
{
    float *g = m->grad + m->off[t];
    const sparse_t *sp = &m->sp[t];
    if (sp->rows) {
        draw_rows(m, t, it, r, m->hit);
        memset(g, 0, m->count[t] * sizeof *g);
        for (size_t row = 0; row < sp->rows; row++)
            for (size_t i = row * sp->row_elems; m->hit[row] && i < (row + 1) * sp->row_elems; i++)
                g[i] = g_tab[grad_index(m->off[t] + i, it, r)];
        return;
    }
    /* Element i holds g_tab[k + 7 i mod 17], k element 0's index: g_pat from j0 = k / 7 mod 17
     * (5 is 7's inverse mod 17), whole tiles keeping the phase. */
    copy_tiles(g, m->count[t], (5u * grad_index(m->off[t], it, r)) % GRAD_PERIOD);
    if (fault && t == 0)
        for (size_t i = 0; i < m->count[t]; i++)
            g[i] += 0.5f;
}

static double ts_diff(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) * 1e-9;
}

static int update_sgd(const dear_update_info_t *info)
{
    upd_arg_t *u = info->arg;
    const float *g = info->grad;
    float *p = info->param;
    if (info->dtype != DEAR_FLOAT32)
        return 1;
    struct timespec s, e;
    clock_gettime(CLOCK_MONOTONIC, &s);
    for (size_t i = 0; i < info->count; i++)
        p[i] -= LR * g[i];
    clock_gettime(CLOCK_MONOTONIC, &e);
    u->elems += (long)info->count;
    u->secs += ts_diff(&s, &e);
    return 0;
}

static void *alloc_arena(size_t nelem)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, nelem * sizeof(float) + 64) != 0)
        return NULL;
    return p;
}

static size_t gcd(size_t a, size_t b)
{
    while (b) {
        size_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* Expected share of rows touched by n draws of sp's distribution. */
static double expected_share(const sparse_t *sp, double n)
{
    double e = 0, prev = 0;
    for (size_t k = 0; k < sp->rows; k++) {
        double p = sp->cdf[k] - prev;
        prev = sp->cdf[k];
        e += p >= 1 ? 1 : -expm1(n * log1p(-p));
    }
    return e / (double)sp->rows;
}

/* The replay of sparse tensor t: its Zipf distribution, its draws per rank and iteration (given,
 * or found by bisection so that one rank touches `density` of the rows) and expected densities. */
static int sparse_setup(bench_model_t *m, int t, double density, const bench_opts_t *o)
{
    sparse_t *sp = &m->sp[t];
    sp->cdf = malloc(sizeof(double) * sp->rows);
    if (!sp->cdf)
        return DEAR_ERR_NOMEM;
    double acc = 0;
    for (size_t k = 0; k < sp->rows; k++)
        sp->cdf[k] = acc += pow((double)(k + 1), -o->zipf);
    for (size_t k = 0; k < sp->rows; k++)
        sp->cdf[k] /= acc;
    sp->cdf[sp->rows - 1] = 1;
    for (sp->mult = (size_t)((double)sp->rows * 0.6180339887) | 1; gcd(sp->mult, sp->rows) != 1; sp->mult++)
        ;
    /* The fewest draws whose expected share reaches the density, at most 64 per row (a share
     * that Zipf's rarest rows reach only beyond is capped there). */
    double lo = 1, hi = 64.0 * (double)sp->rows;
    if (o->tokens > 0 || density <= 0)
        lo = o->tokens > 0 ? (double)o->tokens : 0;
    else if (expected_share(sp, hi) < density)
        lo = hi;
    else
        while (lo < hi) {
            double mid = floor((lo + hi) / 2);
            if (expected_share(sp, mid) >= density)
                hi = mid;
            else
                lo = mid + 1;
        }
    sp->tokens = (long)lo;
    sp->dens_rs = expected_share(sp, (double)sp->tokens);
    sp->dens_ag = expected_share(sp, (double)sp->tokens * bench_size);
    m->nsparse++;
    return DEAR_OK;
}

/* --hints: each layer's compute hint from a model description of the same layers; a layer
 * without tensors has no hooks here, so the runtime sees its time in the layer before it (in
 * forward order; the first with tensors when none comes before), which gets its hint too. */
static int load_hints(const char *path, bench_model_t *m)
{
    dear_profile_t h = { 0 };
    int nl = m->prof.nlayers;
    if (dear_prof_load(path, &h) != DEAR_OK) {
        if (bench_rank == 0)
            fprintf(stderr, "dear-bench: cannot use --hints %s (see the error above)\n", path);
        return DEAR_ERR_FORMAT;
    }
    int ok = h.nlayers == nl;
    for (int l = 0; ok && l < nl; l++)
        ok = h.layers[l].id == m->prof.layers[l].id;
    if (!ok) {
        if (bench_rank == 0)
            fprintf(stderr, "dear-bench: --hints %s: its %d layers are not the profile's %d (the same ids in the "
                            "same order)\n", path, h.nlayers, nl);
        dear_prof_free(&h);
        return DEAR_ERR_FORMAT;
    }
    m->flops = malloc(sizeof *m->flops * (size_t)(nl > 0 ? nl : 1));
    if (!m->flops) {
        dear_prof_free(&h);
        return DEAR_ERR_NOMEM;
    }
    int to = -1;
    for (int l = 0; l < nl; l++) {
        m->flops[l] = -1;
        if (to < 0 && m->lcount[l])
            to = l; /* where the layers before the first with tensors go */
    }
    for (int l = 0, last = to; l < nl; l++) {
        int dst = m->lcount[l] ? l : last;
        if (m->lcount[l])
            last = l;
        if (h.layers[l].flops >= 0 && dst >= 0)
            m->flops[dst] = (m->flops[dst] > 0 ? m->flops[dst] : 0) + h.layers[l].flops;
    }
    dear_prof_free(&h);
    return DEAR_OK;
}

int bench_model_build(const dear_profile_t *src, const bench_opts_t *o, bench_model_t *m)
{
    char msg[256];
    grad_pattern_init();
    m->sp = calloc((size_t)(src->ntensors > 0 ? src->ntensors : 1), sizeof *m->sp);
    if (!m->sp)
        return DEAR_ERR_NOMEM;
    dear_prof_init(&m->prof, src->model);
    for (int l = 0; l < src->nlayers; l++)
        if (dear_prof_add_layer(&m->prof, src->layers[l].id, src->layers[l].fwd_s * o->time_scale,
                                src->layers[l].bwd_s * o->time_scale) != DEAR_OK)
            return DEAR_ERR_NOMEM;
    for (int t = 0; t < src->ntensors; t++) {
        const dear_prof_tensor_t *st = &src->tensors[t];
        double el = floor((double)st->bytes / sizeof(float) * o->size_scale + 0.5);
        size_t n = el < 1 ? 1 : (size_t)el;
        if (st->block_bytes > 0) {
            /* Rows keep their width; --size-scale scales their number. */
            if (st->block_bytes % sizeof(float) != 0) {
                if (bench_rank == 0)
                    fprintf(stderr, "dear-bench: sparse tensor %s: blocks of %zu bytes are not whole float32 "
                                    "elements\n", st->name, st->block_bytes);
                return DEAR_ERR_FORMAT;
            }
            double rows = floor((double)(st->bytes / st->block_bytes) * o->size_scale + 0.5);
            m->sp[t].rows = rows < 1 ? 1 : (size_t)rows;
            m->sp[t].row_elems = st->block_bytes / sizeof(float);
            n = m->sp[t].rows * m->sp[t].row_elems;
        }
        if (dear_prof_add_tensor(&m->prof, src->tensors[t].name, src->tensors[t].layer, n * sizeof(float)) != DEAR_OK)
            return DEAR_ERR_NOMEM;
    }
    if (dear_prof_check(&m->prof, msg, sizeof msg) != DEAR_OK) {
        if (bench_rank == 0)
            fprintf(stderr, "dear-bench: scaled profile is invalid: %s\n", msg);
        return DEAR_ERR_FORMAT;
    }
    m->jitter_s = o->jitter_ms * 1e-3;
    m->jitter_seed = (uint64_t)o->jitter_seed;
    int nt = m->prof.ntensors, nl = m->prof.nlayers;
    m->off = calloc((size_t)nt, sizeof(size_t));
    m->count = calloc((size_t)nt, sizeof(size_t));
    m->upd = calloc((size_t)nt, sizeof(upd_arg_t));
    m->lfirst = calloc((size_t)nl, sizeof(int));
    m->lcount = calloc((size_t)nl, sizeof(int));
    if (!m->off || !m->count || !m->upd || !m->lfirst || !m->lcount)
        return DEAR_ERR_NOMEM;
    for (int t = 0; t < nt; t++) {
        m->off[t] = m->nelem;
        m->count[t] = m->prof.tensors[t].bytes / sizeof(float);
        m->nelem += m->count[t];
        int l = m->prof.tensors[t].lidx;
        if (m->lcount[l]++ == 0)
            m->lfirst[l] = t;
    }
    m->grad = alloc_arena(m->nelem);
    m->param = alloc_arena(m->nelem);
    if (!m->grad || !m->param) {
        fprintf(stderr, "dear-bench: rank %d: cannot allocate 2 x %.1f MiB for gradients and parameters "
                        "(use --size-scale to shrink the model)\n",
                bench_rank, m->nelem * 4.0 / 1048576);
        return DEAR_ERR_NOMEM;
    }
    size_t most = 1;
    for (int t = 0; t < nt; t++) {
        if (!m->sp[t].rows)
            continue;
        int rc = sparse_setup(m, t, src->tensors[t].density_rs, o);
        if (rc != DEAR_OK)
            return rc;
        most = m->sp[t].rows > most ? m->sp[t].rows : most;
    }
    m->hit = malloc(most);
    if (!m->hit)
        return DEAR_ERR_NOMEM;
    return o->hints ? load_hints(o->hints, m) : DEAR_OK;
}

void bench_model_price_sparse(bench_model_t *m, int on, int ag)
{
    for (int t = 0; t < m->prof.ntensors; t++) {
        const sparse_t *sp = &m->sp[t];
        if (!sp->rows)
            continue;
        m->prof.tensors[t].block_bytes = on ? sp->row_elems * sizeof(float) : 0;
        m->prof.tensors[t].density_rs = sp->dens_rs;
        m->prof.tensors[t].density_ag = ag ? sp->dens_ag : 1.0;
    }
}

void bench_model_free(bench_model_t *m)
{
    free(m->off);
    free(m->count);
    free(m->upd);
    free(m->lfirst);
    free(m->lcount);
    free(m->grad);
    free(m->param);
    for (int t = 0; m->sp && t < m->prof.ntensors; t++)
        free(m->sp[t].cdf);
    free(m->sp);
    free(m->hit);
    free(m->flops);
    dear_prof_free(&m->prof);
}

void bench_model_reset(bench_model_t *m)
{
    for (size_t e = 0; e < m->nelem; e++)
        m->param[e] = param0(e);
    for (int t = 0; t < m->prof.ntensors; t++)
        m->upd[t].elems = 0;
    bench_model_upd_zero(m);
}

void bench_model_upd_zero(bench_model_t *m)
{
    for (int t = 0; t < m->prof.ntensors; t++)
        m->upd[t].secs = 0;
}

void bench_model_upd_per_layer(const bench_model_t *m, int iters, double *upd_s)
{
    for (int l = 0; l < m->prof.nlayers; l++)
        upd_s[l] = 0;
    for (int t = 0; t < m->prof.ntensors && iters > 0; t++)
        upd_s[m->prof.tensors[t].lidx] += m->upd[t].secs / iters;
}

int bench_model_register(dear_ctx_t *ctx, bench_model_t *m, int hints)
{
    int rc = DEAR_OK;
    for (int t = 0; rc == DEAR_OK && t < m->prof.ntensors; t++) {
        rc = dear_register(ctx, m->prof.tensors[t].name, m->prof.tensors[t].layer, m->grad + m->off[t], m->count[t],
                           DEAR_FLOAT32, DEAR_MEM_HOST, update_sgd, &m->upd[t]);
        if (rc == DEAR_OK)
            rc = dear_set_param(ctx, t, m->param + m->off[t]);
        if (rc == DEAR_OK && m->sp[t].rows)
            rc = dear_register_sparse(ctx, dear_tensor_index(ctx, m->prof.tensors[t].name), m->sp[t].row_elems);
    }
    for (int l = 0; rc == DEAR_OK && hints && m->flops && l < m->prof.nlayers; l++)
        if (m->lcount[l] && m->flops[l] >= 0)
            rc = dear_set_layer_cost(ctx, m->prof.layers[l].id, m->flops[l]);
    return rc;
}

/* ---- compute emulation ---- */

/* Sleep until start + target (absolute deadline, so a signal does not stretch it). */
static void sleep_until(const struct timespec *start, double target)
{
    if (target <= 0)
        return;
    struct timespec d = *start;
    double s = floor(target);
    d.tv_sec += (time_t)s;
    d.tv_nsec += (long)((target - s) * 1e9);
    if (d.tv_nsec >= 1000000000L) {
        d.tv_sec++;
        d.tv_nsec -= 1000000000L;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &d, NULL) == EINTR)
        ;
}

/* Emulated compute of `want` seconds, part of which may already be spent writing gradients.
 * *late carries oversleep across the layers of one iteration: nanosleep overshoots by tens of
 * microseconds, which over hundreds of layers would inflate compute by several percent. */
static void compute(const struct timespec *start, double want, double *late)
{
    struct timespec now;
    sleep_until(start, want - *late);
    clock_gettime(CLOCK_MONOTONIC, &now);
    *late += ts_diff(start, &now) - want;
    if (*late < -1e-3)
        *late = -1e-3; /* a very slow gradient fill is not paid back by sleeping more later */
}

long bench_model_replay(const bench_model_t *m, atomic_int *stop)
{
    long iters = 0;
    const dear_profile_t *p = &m->prof;
    size_t most = 0;
    for (int t = 0; t < p->ntensors; t++)
        most = m->count[t] > most ? m->count[t] : most;
    float *scratch = malloc((most > 0 ? most : 1) * sizeof *scratch);
    double late = 0;
    struct timespec s;
    while (scratch && !atomic_load(stop)) {
        for (int l = 0; l < p->nlayers && !atomic_load(stop); l++) {
            clock_gettime(CLOCK_MONOTONIC, &s);
            compute(&s, p->layers[l].fwd_s, &late);
        }
        for (int l = p->nlayers - 1; l >= 0 && !atomic_load(stop); l--) {
            clock_gettime(CLOCK_MONOTONIC, &s);
            for (int t = m->lfirst[l]; t < m->lfirst[l] + m->lcount[l]; t++)
                copy_tiles(scratch, m->count[t], 0);
            compute(&s, p->layers[l].bwd_s, &late);
        }
        iters++;
    }
    free(scratch);
    return iters;
}

/* ---- the parameter check ---- */

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int bench_check_params(bench_model_t *m, long total_iters, int sharded, dear_compress_t ag, char *why,
                       size_t whylen)
{
    /* Every element updated once per iteration: by every rank, or sharded by one. */
    int bad_calls = 0;
    for (int t = 0; t < m->prof.ntensors; t++) {
        long n = m->upd[t].elems, want = (long)m->count[t] * total_iters;
        if (sharded)
            MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (n != want) {
            if (!bad_calls)
                fprintf(stderr, "dear-bench: rank %d: tensor %s had %ld element updates%s, expected %ld\n",
                        bench_rank, m->prof.tensors[t].name, n, sharded ? " over the ranks" : "", want);
            bad_calls++;
        }
    }
    uint64_t h = fnv1a(m->param, m->nelem * sizeof(float)), h0 = h;
    MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    int differs = h != h0;

    /* Closed form: sum over iterations and ranks of the period-17 sequence, in float64; a sparse
     * tensor's element only where its row was drawn. */
    size_t stride = m->nelem / SAMPLE_TARGET + 1;
    double tol = 4e-7 * (double)(total_iters + 8), worst = 0, worst_ref = 0;
    /* Compressed: the sums are exact in 16 bits, the average's all-gather rounds it once (half a
     * unit in the last place of the largest average, 8/1024) each iteration. */
    if (ag != DEAR_COMPRESS_NONE)
        tol += (double)total_iters * LR * (8.0 / 1024) * (ag == DEAR_COMPRESS_BF16 ? 0x1p-8 : 0x1p-11);
    size_t worst_e = 0, nbad = 0;
    for (int t = 0; t < m->prof.ntensors; t++) {
        size_t n = m->count[t], ns = 0, cap = n / stride + 2;
        size_t *idx = malloc(sizeof *idx * cap);
        double *sum = calloc(cap, sizeof *sum);
        if (!idx || !sum) {
            free(idx);
            free(sum);
            nbad++;
            fprintf(stderr, "dear-bench: rank %d: out of memory checking tensor %s\n", bench_rank, m->prof.tensors[t].name);
            continue;
        }
        for (size_t i = 0;; i = i + stride < n ? i + stride : n - 1) {
            idx[ns++] = i;
            if (i == n - 1)
                break;
        }
        const sparse_t *sp = &m->sp[t];
        for (long it = 0; it < total_iters; it++)
            for (int r = 0; r < bench_size; r++) {
                if (sp->rows)
                    draw_rows(m, t, it, r, m->hit);
                for (size_t k = 0; k < ns; k++)
                    if (!sp->rows || m->hit[idx[k] / sp->row_elems])
                        sum[k] += g_tab[grad_index(m->off[t] + idx[k], it, r)];
            }
        for (size_t k = 0; k < ns; k++) {
            size_t e = m->off[t] + idx[k];
            double ref = (double)param0(e) - (double)LR * sum[k] / bench_size;
            double err = fabs((double)m->param[e] - ref);
            if (err > worst)
                worst = err, worst_e = e, worst_ref = ref;
            if (err > tol)
                nbad++;
        }
        free(idx);
        free(sum);
    }
    /* Every rank sees a mismatch of the shared result: rank 0 tells it, others only their own. */
    if (nbad && (bench_rank == 0 || differs))
        fprintf(stderr,
                "dear-bench: rank %d: %zu sampled parameters differ from the float64 reference by more than "
                "%.2g; worst element %zu: %.9g, expected %.9g\n",
                bench_rank, nbad, tol, worst_e, (double)m->param[worst_e], worst_ref);
    int local[3] = { bad_calls > 0, differs, nbad > 0 }, all[3];
    MPI_Allreduce(local, all, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    snprintf(why, whylen, "%s%s%s", all[0] ? "update-count " : "", all[1] ? "ranks-differ " : "",
             all[2] ? "reference-mismatch" : "");
    return !(all[0] || all[1] || all[2]);
}

/* ---- one iteration ---- */

#define RT_CHECK(call)                                                                                       \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_ != DEAR_OK) {                                                                                \
            fprintf(stderr, "dear-bench: rank %d: %s failed: %s\n", bench_rank, #call, dear_status_string(rc_)); \
            return rc_;                                                                                      \
        }                                                                                                    \
    } while (0)

/* The injected noise of iteration it on this rank: uniform in [0, jitter_s), from a counter-based
 * generator (splitmix64 of seed, rank and iteration), so each rank has its own sequence and
 * every configuration of a run sees the same one. */
static double jitter(const bench_model_t *m, long it)
{
    if (m->jitter_s <= 0)
        return 0;
    uint64_t z = mix64(m->jitter_seed * 0xd1b54a32d192ed03ull + (uint64_t)bench_rank * 0x9e3779b97f4a7c15ull +
                       (uint64_t)it * 0xbf58476d1ce4e5b9ull);
    return m->jitter_s * (double)(z >> 11) / 9007199254740992.0;
}

/* Forward in layer order, backward in reverse, exactly the trainer's sequence; the jitter is
 * slept with the first layer's forward compute. */
int bench_model_iterate(dear_ctx_t *ctx, bench_model_t *m, long it, int fault, double *compute_s, double *arrive_s)
{
    const dear_profile_t *p = &m->prof;
    double late = 0, comp = 0, noise = jitter(m, it);
    struct timespec s, e;
    for (int l = 0; l < p->nlayers; l++) {
        if (m->lcount[l])
            RT_CHECK(dear_forward_begin(ctx, p->layers[l].id));
        clock_gettime(CLOCK_MONOTONIC, &s);
        compute(&s, p->layers[l].fwd_s + (l == 0 ? noise : 0), &late);
        clock_gettime(CLOCK_MONOTONIC, &e);
        comp += ts_diff(&s, &e);
    }
    for (int l = p->nlayers - 1; l >= 0; l--) {
        clock_gettime(CLOCK_MONOTONIC, &s);
        for (int t = m->lfirst[l]; t < m->lfirst[l] + m->lcount[l]; t++)
            fill_grad(m, t, it, bench_rank, fault);
        compute(&s, p->layers[l].bwd_s, &late);
        clock_gettime(CLOCK_MONOTONIC, &e);
        comp += ts_diff(&s, &e);
        if (l == 0)
            *arrive_s = MPI_Wtime();
        if (m->lcount[l])
            RT_CHECK(dear_backward_done(ctx, p->layers[l].id));
    }
    RT_CHECK(dear_backward_end(ctx));
    *compute_s = comp;
    return DEAR_OK;
}
