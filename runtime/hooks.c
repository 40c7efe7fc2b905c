/*
 * The schedules behind the per-iteration hooks. backward_done counts each bucket's tensors down
 * and, when a bucket is complete, packs it (fusion buffer) and queues its reduce-scatter (dear)
 * or all-reduce (wfbp); backward_end queues the all-gathers in forward order (dear) or waits
 * and runs the updates (wfbp; sync first queues its one all-reduce). forward_begin (dear) waits
 * only for the all-gather groups holding its layer's tensors, unpacks them and runs the layer's
 * updates. flush completes what is pending. Hook timestamps also give the per-layer profile,
 * the iteration times and the timeline's compute spans.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/rt.h"
#include "runtime/util.h"

/* Per-layer and per-iteration samples are capped so a long run does not grow without bound;
 * the median of the most recent window is what a planner wants anyway. */
#define SAMPLES_MAX 4096

const char *dear_sched_name(dear_sched_t s)
{
    return s == DEAR_SCHED_DEAR ? "dear" : s == DEAR_SCHED_WFBP ? "wfbp" : "sync";
}

void dear_samples_add(dear_samples_t *s, double v)
{
    if (s->n == SAMPLES_MAX) {
        memmove(s->v, s->v + SAMPLES_MAX / 2, sizeof *s->v * (SAMPLES_MAX / 2));
        s->n = SAMPLES_MAX / 2;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        double *nv = realloc(s->v, sizeof *nv * cap);
        if (!nv)
            return; /* a lost sample only blurs a statistic */
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dear_median(const double *v, size_t n)
{
    if (n == 0)
        return 0;
    double *tmp = malloc(sizeof *tmp * n);
    if (!tmp)
        return v[n - 1];
    memcpy(tmp, v, sizeof *tmp * n);
    qsort(tmp, n, sizeof *tmp, cmp_double);
    double m = n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
    free(tmp);
    return m;
}

double dear_samples_median(const dear_samples_t *s)
{
    return dear_median(s->v, s->n);
}

double dear_samples_min_tail(const dear_samples_t *s, size_t k)
{
    size_t from = s->n > k ? s->n - k : 0;
    if (from == 0 && s->n > 1)
        from = 1; /* the first sample carries the start-up (connections, first touches) */
    double m = s->n > from ? s->v[from] : 0;
    for (size_t i = from + 1; i < s->n; i++)
        m = s->v[i] < m ? s->v[i] : m;
    return m;
}

void dear_samples_free(dear_samples_t *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

int dear_layer_index(const dear_ctx_t *ctx, int layer)
{
    int lo = 0, hi = ctx->nlayers - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (ctx->layers[mid].id == layer)
            return mid;
        if (ctx->layers[mid].id < layer)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static int group_of(const dear_ctx_t *ctx, int t)
{
    int lo = 0, hi = ctx->ngroups - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ctx->groups[mid].t0 <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Common checks of every hook; lidx_out gets the layer's index when layer_check is set. */
static int hook_enter(dear_ctx_t *ctx, const char *call, int layer, int layer_check, int *lidx_out)
{
    DEAR_ARG_CHECK(ctx != NULL, "%s: ctx is NULL", call);
    if (!ctx->committed) {
        DEAR_ERROR("api", "%s: the context is not committed; call dear_commit after registering the tensors", call);
        return DEAR_ERR_STATE;
    }
    if (layer_check) {
        int l = dear_layer_index(ctx, layer);
        DEAR_ARG_CHECK(l >= 0, "%s(layer %d): unknown layer id; the registered layers have ids %d..%d (%d layers)",
                       call, layer, ctx->layers[0].id, ctx->layers[ctx->nlayers - 1].id, ctx->nlayers);
        *lidx_out = l;
    }
    pthread_mutex_lock(&ctx->lock);
    int erc = ctx->engine_rc;
    pthread_mutex_unlock(&ctx->lock);
    if (erc != DEAR_OK) {
        DEAR_ERROR("api", "%s: communication stopped after an earlier error (%s)", call, dear_status_string(erc));
        return erc;
    }
    return DEAR_OK;
}

static void span(dear_ctx_t *ctx, const char *what, int lidx, int lane, double t0, double t1)
{
    if (!ctx->tl)
        return;
    char name[64], args[96];
    snprintf(name, sizeof name, "%s L%d", what, ctx->layers[lidx].id);
    snprintf(args, sizeof args, "\"layer\":%d,\"iteration\":%lld", ctx->layers[lidx].id, ctx->iter);
    dear_timeline_span(ctx->tl, name, lane == DEAR_LANE_WAIT ? "wait" : "compute", lane, t0, t1, args);
}

static int call_update(dear_ctx_t *ctx, int t)
{
    dear_tensor_t *tt = &ctx->tensors[t];
    if (!tt->update)
        return DEAR_OK;
    int r = tt->update(tt->grad, tt->count, tt->dtype, tt->arg);
    if (r != 0) {
        DEAR_ERROR("api", "update callback of tensor '%s' (layer %d) returned %d", tt->name, tt->layer, r);
        return DEAR_ERR_CALLBACK;
    }
    return DEAR_OK;
}

/* dear: run tensor t's deferred update if it is still pending. */
static int run_update(dear_ctx_t *ctx, int t)
{
    if (!ctx->tensors[t].pending)
        return DEAR_OK;
    ctx->tensors[t].pending = 0;
    ctx->npending--;
    return call_update(ctx, t);
}

/* dear: make group g's data of the pending iteration usable (wait, unpack). */
static int group_ready(dear_ctx_t *ctx, int g, const char *call, int lidx)
{
    dear_group_t *gr = &ctx->groups[g];
    if (gr->unpacked)
        return DEAR_OK;
    double t0 = dear_now();
    DEAR_CHECK(dear_engine_wait(ctx, &gr->op, ctx->iter - 1));
    double t1 = dear_now();
    if (ctx->tl && t1 - t0 > 2e-6) {
        char name[80], args[96];
        snprintf(name, sizeof name, "wait %s", call);
        snprintf(args, sizeof args, "\"group\":%d,\"layer\":%d", g, lidx >= 0 ? ctx->layers[lidx].id : -1);
        dear_timeline_span(ctx->tl, name, "wait", DEAR_LANE_WAIT, t0, t1, args);
    }
    int b0 = ctx->tensors[gr->t0].bucket, b1 = ctx->tensors[gr->t1 - 1].bucket;
    for (int b = b0; b <= b1; b++)
        if (ctx->buckets[b].fused)
            dear_bucket_unpack(ctx, &ctx->buckets[b], gr->t0, gr->t1);
    gr->unpacked = 1;
    return DEAR_OK;
}

/* Complete every pending update (dear): all-gathers in forward order, then updates. */
int dear_hooks_flush(dear_ctx_t *ctx, const char *call)
{
    int rc = DEAR_OK;
    if (ctx->sched == DEAR_SCHED_DEAR && ctx->npending > 0) {
        for (int g = 0; g < ctx->ngroups; g++) {
            DEAR_CHECK(group_ready(ctx, g, call, -1));
            for (int t = ctx->groups[g].t0; t < ctx->groups[g].t1; t++) {
                int r = run_update(ctx, t);
                if (r != DEAR_OK && rc == DEAR_OK)
                    rc = r;
            }
        }
    }
    /* The next iteration's time starts at its first hook, not here (evaluation, checkpoints). */
    ctx->t_iter_start = 0;
    return rc;
}

static void hook_mark(dear_ctx_t *ctx, int fwd, int lidx)
{
    ctx->t_hook = dear_now();
    ctx->last_hook_fwd = fwd;
    ctx->last_hook_lidx = lidx;
}

int dear_forward_begin(dear_ctx_t *ctx, int layer)
{
    int lidx = -1, rc = DEAR_OK;
    DEAR_CHECK(hook_enter(ctx, "dear_forward_begin", layer, 1, &lidx));
    if (ctx->in_backward) {
        DEAR_ERROR("api", "dear_forward_begin(layer %d): called during the backward pass of iteration %lld (%d of %d "
                          "layers done); call dear_backward_end first",
                   layer, ctx->iter, ctx->layers_done, ctx->nlayers);
        return DEAR_ERR_STATE;
    }
    double now = dear_now();
    if (ctx->t_iter_start == 0)
        ctx->t_iter_start = now;
    if (ctx->last_hook_fwd && ctx->last_hook_lidx >= 0 && ctx->last_hook_lidx < lidx) {
        dear_samples_add(&ctx->fwd_times[ctx->last_hook_lidx], now - ctx->t_hook);
        span(ctx, "forward", ctx->last_hook_lidx, DEAR_LANE_COMPUTE, ctx->t_hook, now);
    }
    if (ctx->sched == DEAR_SCHED_DEAR && ctx->npending > 0) {
        const dear_layer_t *L = &ctx->layers[lidx];
        int g0 = group_of(ctx, L->t0), g1 = group_of(ctx, L->t1 - 1);
        for (int g = g0; g <= g1; g++)
            DEAR_CHECK(group_ready(ctx, g, "dear_forward_begin", lidx));
        for (int t = L->t0; t < L->t1; t++) {
            int r = run_update(ctx, t);
            if (r != DEAR_OK && rc == DEAR_OK)
                rc = r;
        }
    }
    hook_mark(ctx, 1, lidx);
    return rc;
}

static void begin_backward(dear_ctx_t *ctx, double now)
{
    ctx->in_backward = 1;
    ctx->layers_done = 0;
    for (int b = 0; b < ctx->nbuckets; b++)
        ctx->buckets[b].remaining = ctx->buckets[b].t1 - ctx->buckets[b].t0;
    if (ctx->t_iter_start == 0)
        ctx->t_iter_start = now;
}

int dear_backward_done(dear_ctx_t *ctx, int layer)
{
    int lidx = -1, rc = DEAR_OK;
    DEAR_CHECK(hook_enter(ctx, "dear_backward_done", layer, 1, &lidx));
    dear_layer_t *L = &ctx->layers[lidx];
    if (ctx->in_backward && L->bwd_iter == ctx->iter) {
        DEAR_ERROR("api", "dear_backward_done(layer %d): called twice in the backward pass of iteration %lld",
                   layer, ctx->iter);
        return DEAR_ERR_STATE;
    }
    double now = dear_now();
    if (!ctx->in_backward) {
        if (ctx->sched == DEAR_SCHED_DEAR && ctx->npending > 0) {
            /* The gradients about to be reduced share memory with the all-gathers still
             * pending: finish those first. Correct, but the updates ran late. */
            DEAR_WARN("api", "dear_backward_done(layer %d): %d update(s) of iteration %lld were still pending "
                             "(dear_forward_begin not called for every layer?); running them now",
                      layer, ctx->npending, ctx->iter - 1);
            DEAR_CHECK(dear_hooks_flush(ctx, "dear_backward_done"));
            now = dear_now();
        }
        begin_backward(ctx, now);
        /* Between the last forward hook and the first backward hook lie the forward and the
         * backward of the last layer (and the loss); split as backward = 2 x forward. */
        if (ctx->last_hook_fwd && ctx->last_hook_lidx >= 0) {
            double d = now - ctx->t_hook;
            if (ctx->last_hook_lidx == lidx) {
                dear_samples_add(&ctx->fwd_times[lidx], d / 3);
                dear_samples_add(&ctx->bwd_times[lidx], 2 * d / 3);
                span(ctx, "forward+backward", lidx, DEAR_LANE_COMPUTE, ctx->t_hook, now);
            } else {
                dear_samples_add(&ctx->fwd_times[ctx->last_hook_lidx], d);
                span(ctx, "forward", ctx->last_hook_lidx, DEAR_LANE_COMPUTE, ctx->t_hook, now);
            }
        }
    } else if (!ctx->last_hook_fwd) {
        dear_samples_add(&ctx->bwd_times[lidx], now - ctx->t_hook);
        span(ctx, "backward", lidx, DEAR_LANE_COMPUTE, ctx->t_hook, now);
    }
    L->bwd_iter = ctx->iter;
    ctx->layers_done++;
    /* Buckets are contiguous tensor ranges, so the layer's tensors touch a run of buckets. */
    for (int t = L->t0; t < L->t1; t++) {
        dear_bucket_t *b = &ctx->buckets[ctx->tensors[t].bucket];
        if (--b->remaining > 0)
            continue;
        if (b->fused)
            dear_bucket_pack(ctx, b);
        if (ctx->sched != DEAR_SCHED_SYNC)
            dear_engine_queue(ctx, &b->op);
        /* Early all-gathers this bucket completes: they start once it is reduced. */
        for (int g = b->early_hi; ctx->sched == DEAR_SCHED_DEAR && g >= b->early_lo; g--) {
            ctx->groups[g].unpacked = 0;
            dear_engine_queue(ctx, &ctx->groups[g].op);
        }
    }
    hook_mark(ctx, 0, lidx);
    return rc;
}

/* wfbp, sync: wait for every bucket, unpack, run all updates in forward order. */
static int reduce_and_update(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    double t0 = dear_now();
    for (int i = 0; i < ctx->nops; i++)
        DEAR_CHECK(dear_engine_wait(ctx, ctx->ops[i], ctx->iter));
    double t1 = dear_now();
    if (ctx->tl && t1 - t0 > 2e-6)
        dear_timeline_span(ctx->tl, "wait dear_backward_end", "wait", DEAR_LANE_WAIT, t0, t1, NULL);
    for (int b = 0; b < ctx->nbuckets; b++)
        if (ctx->buckets[b].fused)
            dear_bucket_unpack(ctx, &ctx->buckets[b], ctx->buckets[b].t0, ctx->buckets[b].t1);
    for (int t = 0; t < ctx->ntensors; t++) {
        int r = call_update(ctx, t);
        if (r != DEAR_OK && rc == DEAR_OK)
            rc = r;
    }
    return rc;
}

/* Online planning and its check: every rank reaches this at the same backward_end. The plan's
 * collectives are drained first (dear: the all-gathers just queued are waited for and their
 * data put in place; the updates stay pending and still run in the next forward passes), so
 * the switch happens with nothing in flight. */
static int switch_plan(dear_ctx_t *ctx, int verify)
{
    if (ctx->sched == DEAR_SCHED_DEAR && ctx->npending > 0)
        for (int g = 0; g < ctx->ngroups; g++)
            DEAR_CHECK(group_ready(ctx, g, "dear_backward_end", -1));
    return verify ? dear_planning_verify(ctx) : dear_planning_replan(ctx);
}

int dear_backward_end(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    DEAR_CHECK(hook_enter(ctx, "dear_backward_end", 0, 0, NULL));
    if (!ctx->in_backward || ctx->layers_done != ctx->nlayers) {
        int missing = -1;
        for (int l = ctx->nlayers - 1; l >= 0 && missing < 0; l--)
            if (!ctx->in_backward || ctx->layers[l].bwd_iter != ctx->iter)
                missing = ctx->layers[l].id;
        DEAR_ERROR("api", "dear_backward_end: only %d of %d layers reported dear_backward_done in iteration %lld "
                          "(first missing, in backward order: layer %d); call it for every layer first",
                   ctx->in_backward ? ctx->layers_done : 0, ctx->nlayers, ctx->iter, missing);
        return DEAR_ERR_STATE;
    }
    switch (ctx->sched) {
    case DEAR_SCHED_DEAR:
        /* Behind the reduce-scatters, in forward order: the first layers' groups arrive first
         * (the early ones were queued during backward). */
        for (int g = 0; g < ctx->ngroups; g++) {
            if (ctx->groups[g].early)
                continue;
            ctx->groups[g].unpacked = 0;
            dear_engine_queue(ctx, &ctx->groups[g].op);
        }
        for (int t = 0; t < ctx->ntensors; t++)
            ctx->tensors[t].pending = 1;
        ctx->npending = ctx->ntensors;
        break;
    case DEAR_SCHED_SYNC:
        for (int i = 0; i < ctx->nops; i++)
            dear_engine_queue(ctx, ctx->ops[i]);
        rc = reduce_and_update(ctx);
        break;
    case DEAR_SCHED_WFBP:
        rc = reduce_and_update(ctx);
        break;
    }
    ctx->in_backward = 0;
    ctx->iter++;
    double now = dear_now();
    if (ctx->t_iter_start > 0) {
        dear_samples_add(&ctx->iter_times, now - ctx->t_iter_start);
        if (ctx->verify_at >= 0 && ctx->iter > ctx->verify_at - ctx->verify_iters)
            dear_samples_add(&ctx->verify_times, now - ctx->t_iter_start);
    }
    if (rc == DEAR_OK && ctx->verify_at >= 0 && ctx->iter >= ctx->verify_at) {
        rc = switch_plan(ctx, 1);
        now = dear_now();
    }
    if (rc == DEAR_OK && ctx->next_plan_iter >= 0 && ctx->iter >= ctx->next_plan_iter) {
        rc = switch_plan(ctx, 0);
        now = dear_now(); /* planning time is not the next forward pass's */
    }
    ctx->t_iter_start = now;
    hook_mark(ctx, 0, -1);
    return rc;
}

int dear_flush(dear_ctx_t *ctx)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_flush: ctx is NULL");
    if (!ctx->committed)
        return DEAR_OK; /* nothing can be in flight before commit */
    DEAR_CHECK(hook_enter(ctx, "dear_flush", 0, 0, NULL));
    if (ctx->in_backward) {
        DEAR_ERROR("api", "dear_flush: called during the backward pass of iteration %lld (%d of %d layers done); "
                          "call dear_backward_end first",
                   ctx->iter, ctx->layers_done, ctx->nlayers);
        return DEAR_ERR_STATE;
    }
    return dear_hooks_flush(ctx, "dear_flush");
}
