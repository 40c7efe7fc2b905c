/*
 * model.c: dear-bench's emulated model. Every layer's forward and backward compute is a sleep of
 * its profiled time (sleeping, not spinning, so the cores stay free for the progress threads),
 * and the runtime is driven through the public hooks and update callbacks exactly as a trainer
 * drives it. The gradients cycle through a period-17 sequence of exact binary fractions indexed
 * by element, iteration and rank, and the update is plain SGD, so after a run the parameters of
 * every rank can be checked twice: against rank 0's bytes, and, for sampled elements, against
 * a float64 recomputation of the whole run from the closed form of the gradients.
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

static float param0(size_t e)
{
    return (float)((int)((3u * (e % 11u)) % 11u) - 5) * 0.125f;
}

static void fill_grad(model_t *m, int t, long it, int r, int fault)
{
    float *g = m->grad + m->off[t];
    unsigned k = grad_index(m->off[t], it, r);
    for (size_t i = 0; i < m->count[t]; i++) {
        g[i] = g_tab[k];
        k += 7;
        if (k >= GRAD_PERIOD)
            k -= GRAD_PERIOD;
    }
    if (fault && t == 0)
        for (size_t i = 0; i < m->count[t]; i++)
            g[i] += 0.5f;
}

static int update_sgd(const dear_update_info_t *info)
{
    upd_arg_t *u = info->arg;
    const float *g = info->grad;
    if (info->dtype != DEAR_FLOAT32)
        return 1;
    for (size_t i = 0; i < info->count; i++)
        u->param[i] -= LR * g[i];
    u->calls++;
    return 0;
}

static void *alloc_arena(size_t nelem)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, nelem * sizeof(float) + 64) != 0)
        return NULL;
    return p;
}

int model_build(const dear_profile_t *src, const opts_t *o, model_t *m)
{
    char msg[256];
    dear_prof_init(&m->prof, src->model);
    for (int l = 0; l < src->nlayers; l++)
        if (dear_prof_add_layer(&m->prof, src->layers[l].id, src->layers[l].fwd_s * o->time_scale,
                                src->layers[l].bwd_s * o->time_scale) != DEAR_OK)
            return DEAR_ERR_NOMEM;
    for (int t = 0; t < src->ntensors; t++) {
        double el = floor((double)src->tensors[t].bytes / sizeof(float) * o->size_scale + 0.5);
        size_t n = el < 1 ? 1 : (size_t)el;
        if (dear_prof_add_tensor(&m->prof, src->tensors[t].name, src->tensors[t].layer, n * sizeof(float)) != DEAR_OK)
            return DEAR_ERR_NOMEM;
    }
    if (dear_prof_check(&m->prof, msg, sizeof msg) != DEAR_OK) {
        if (g_rank == 0)
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
                g_rank, m->nelem * 4.0 / 1048576);
        return DEAR_ERR_NOMEM;
    }
    for (int t = 0; t < nt; t++)
        m->upd[t].param = m->param + m->off[t];
    return DEAR_OK;
}

void model_free(model_t *m)
{
    free(m->off);
    free(m->count);
    free(m->upd);
    free(m->lfirst);
    free(m->lcount);
    free(m->grad);
    free(m->param);
    dear_prof_free(&m->prof);
}

void model_reset(model_t *m)
{
    for (size_t e = 0; e < m->nelem; e++)
        m->param[e] = param0(e);
    for (int t = 0; t < m->prof.ntensors; t++)
        m->upd[t].calls = 0;
}

int model_register(dear_ctx_t *ctx, model_t *m)
{
    int rc = DEAR_OK;
    for (int t = 0; rc == DEAR_OK && t < m->prof.ntensors; t++)
        rc = dear_register(ctx, m->prof.tensors[t].name, m->prof.tensors[t].layer, m->grad + m->off[t], m->count[t],
                           DEAR_FLOAT32, DEAR_MEM_HOST, update_sgd, &m->upd[t]);
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

static double ts_diff(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) * 1e-9;
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

/* ---- the parameter check ---- */

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int check_params(model_t *m, long total_iters, char *why, size_t whylen)
{
    int bad_calls = 0;
    for (int t = 0; t < m->prof.ntensors; t++)
        if (m->upd[t].calls != total_iters) {
            if (!bad_calls)
                fprintf(stderr, "dear-bench: rank %d: tensor %s updated %ld times, expected %ld\n", g_rank,
                        m->prof.tensors[t].name, m->upd[t].calls, total_iters);
            bad_calls++;
        }
    uint64_t h = fnv1a(m->param, m->nelem * sizeof(float)), h0 = h;
    MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    int differs = h != h0;

    /* Closed form: sum over iterations and ranks of the period-17 sequence, in float64. */
    size_t stride = m->nelem / SAMPLE_TARGET + 1;
    double tol = 4e-7 * (double)(total_iters + 8), worst = 0, worst_ref = 0;
    size_t worst_e = 0, nbad = 0;
    for (int t = 0; t < m->prof.ntensors; t++) {
        size_t n = m->count[t];
        for (size_t i = 0;; i = i + stride < n ? i + stride : n - 1) {
            size_t e = m->off[t] + i;
            double sum = 0;
            for (long it = 0; it < total_iters; it++)
                for (int r = 0; r < g_size; r++)
                    sum += g_tab[grad_index(e, it, r)];
            double ref = (double)param0(e) - (double)LR * sum / g_size;
            double err = fabs((double)m->param[e] - ref);
            if (err > worst)
                worst = err, worst_e = e, worst_ref = ref;
            if (err > tol)
                nbad++;
            if (i == n - 1)
                break;
        }
    }
    /* Every rank sees a mismatch of the shared result: rank 0 tells it, others only their own. */
    if (nbad && (g_rank == 0 || differs))
        fprintf(stderr,
                "dear-bench: rank %d: %zu sampled parameters differ from the float64 reference by more than "
                "%.2g; worst element %zu: %.9g, expected %.9g\n",
                g_rank, nbad, tol, worst_e, (double)m->param[worst_e], worst_ref);
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
            fprintf(stderr, "dear-bench: rank %d: %s failed: %s\n", g_rank, #call, dear_status_string(rc_)); \
            return rc_;                                                                                      \
        }                                                                                                    \
    } while (0)

/* The injected noise of iteration it on this rank: uniform in [0, jitter_s), from a counter-based
 * generator (splitmix64 of seed, rank and iteration), so each rank has its own sequence and
 * every configuration of a run sees the same one. */
static double jitter(const model_t *m, long it)
{
    if (m->jitter_s <= 0)
        return 0;
    uint64_t z = m->jitter_seed * 0xd1b54a32d192ed03ull + (uint64_t)g_rank * 0x9e3779b97f4a7c15ull +
                 (uint64_t)it * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return m->jitter_s * (double)(z >> 11) / 9007199254740992.0;
}

/* Forward in layer order, backward in reverse, exactly the trainer's sequence; the jitter is
 * slept with the first layer's forward compute. */
int model_iterate(dear_ctx_t *ctx, model_t *m, long it, int fault, double *compute_s)
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
            fill_grad(m, t, it, g_rank, fault);
        compute(&s, p->layers[l].bwd_s, &late);
        clock_gettime(CLOCK_MONOTONIC, &e);
        comp += ts_diff(&s, &e);
        if (m->lcount[l])
            RT_CHECK(dear_backward_done(ctx, p->layers[l].id));
    }
    RT_CHECK(dear_backward_end(ctx));
    *compute_s = comp;
    return DEAR_OK;
}
