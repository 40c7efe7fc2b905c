/*
 * The per-iteration hooks, common to every schedule: their checks, the per-layer profile and the
 * iteration times from their timestamps, the timeline's compute spans, the bucket countdown of
 * backward_done (a complete bucket's gradients are fenced, mem.c) and the plan switches at
 * backward_end. What each schedule does at each hook is its dear_sched_ops_t (sched_dear.c,
 * sched_allreduce.c), the row of DEAR_SCHED_TABLE.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/mpi_check.h"
#include "fusion/profile.h"
#include "base/sync.h"
#include "cuda/cuda.h"
#include "runtime/rt.h"
#include "base/util.h"

int dear_iter_profile_alloc(dear_iter_t *it, int nlayers)
{
    int rc = DEAR_OK;
    size_t n = (size_t)(nlayers ? nlayers : 1), sb = sizeof *it->fwd_times * n;
    DEAR_ALLOC_GOTO(it->fwd_times, calloc(n, sizeof *it->fwd_times), sb, rc, err);
    DEAR_ALLOC_GOTO(it->bwd_times, calloc(n, sizeof *it->bwd_times), sb, rc, err);
    DEAR_ALLOC_GOTO(it->upd_times, calloc(n, sizeof *it->upd_times), sb, rc, err);
    DEAR_ALLOC_GOTO(it->upd_sum, calloc(n, sizeof *it->upd_sum), sizeof *it->upd_sum * n, rc, err);
    DEAR_ALLOC_GOTO(it->upd_iter, calloc(n, sizeof *it->upd_iter), sizeof *it->upd_iter * n, rc, err);
    for (size_t l = 0; l < n; l++)
        it->upd_iter[l] = -1;
    return DEAR_OK;
err:
    dear_iter_profile_free(it, 0);
    return rc;
}

void dear_iter_profile_free(dear_iter_t *it, int nlayers)
{
    for (int l = 0; it->fwd_times && l < nlayers; l++)
        dear_samples_free(&it->fwd_times[l]);
    for (int l = 0; it->bwd_times && l < nlayers; l++)
        dear_samples_free(&it->bwd_times[l]);
    for (int l = 0; it->upd_times && l < nlayers; l++)
        dear_samples_free(&it->upd_times[l]);
    free(it->fwd_times);
    free(it->bwd_times);
    free(it->upd_times);
    free(it->upd_sum);
    free(it->upd_iter);
    it->fwd_times = it->bwd_times = it->upd_times = NULL;
    it->upd_sum = NULL;
    it->upd_iter = NULL;
}

int dear_layer_index(const dear_registry_t *reg, int layer)
{
    int lo = 0, hi = reg->nlayers - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (reg->layers[mid].id == layer)
            return mid;
        if (reg->layers[mid].id < layer)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* The calls on a context run one at a time: one made while another runs (two threads on one
 * context, or a call from inside an update callback) fails at once, touching nothing, where it
 * would corrupt the context. Calls from different threads one after the other are fine (PyTorch
 * runs backward hooks on its autograd threads). One atomic exchange per call. */
int dear_rt_claim(dear_ctx_t *ctx, const char *call)
{
    DEAR_ARG_CHECK(ctx != NULL, "%s: ctx is NULL", call);
    if (atomic_exchange(&ctx->hook_busy, 1) != 0) {
        /* The owner is read without the claim: only to word the message. */
        if (pthread_equal(ctx->hook_owner, pthread_self()))
            DEAR_ERROR("api", "%s: called from inside another call on this context (an update callback?); "
                              "callbacks must not call dear_* functions on their context",
                       call);
        else
            DEAR_ERROR("api", "%s: called while another call on this context runs on another thread; a "
                              "context's functions are called from one thread at a time",
                       call);
        return DEAR_ERR_STATE;
    }
    ctx->hook_owner = pthread_self();
    return DEAR_OK;
}

void dear_rt_release(dear_ctx_t *ctx) { atomic_store(&ctx->hook_busy, 0); }

/* Common checks of every hook; lidx_out gets the layer's index when layer_check is set. */
static int hook_enter(dear_ctx_t *ctx, const char *call, int layer, int layer_check, int *lidx_out)
{
    DEAR_ARG_CHECK(ctx != NULL, "%s: ctx is NULL", call);
    if (!ctx->committed) {
        DEAR_ERROR("api", "%s: the context is not committed; call dear_commit after registering the tensors", call);
        return DEAR_ERR_STATE;
    }
    if (layer_check) {
        int l = dear_layer_index(&ctx->reg, layer);
        DEAR_ARG_CHECK(l >= 0, "%s(layer %d): unknown layer id; the registered layers have ids %d..%d (%d layers)",
                       call, layer, ctx->reg.layers[0].id, ctx->reg.layers[ctx->reg.nlayers - 1].id, ctx->reg.nlayers);
        *lidx_out = l;
    }
    dear_lock(&ctx->eng.lock);
    int erc = ctx->eng.sh.rc;
    dear_unlock(&ctx->eng.lock);
    if (erc != DEAR_OK) {
        DEAR_ERROR("api", "%s: communication stopped after an earlier error (%s)", call, dear_status_string(erc));
        return erc;
    }
    /* Sharded updates held for the program's own step: any later call sends them as they are. */
    return dear_shard_release_held(ctx, call);
}

static void span(dear_ctx_t *ctx, const char *what, int lidx, int lane, double t0, double t1)
{
    if (!ctx->tl)
        return;
    char name[64], args[96];
    snprintf(name, sizeof name, "%s L%d", what, ctx->reg.layers[lidx].id);
    snprintf(args, sizeof args, "\"layer\":%d,\"iteration\":%lld", ctx->reg.layers[lidx].id, ctx->it.iter);
    dear_timeline_span(ctx->tl, name, lane == DEAR_LANE_WAIT ? "wait" : "compute", lane, t0, t1, args);
}

#define SCHED_OPS_(ID, NAME, OPS, SIM, FLAGS, HELP) [DEAR_SCHED_##ID] = &OPS,
static const dear_sched_ops_t *const sched_ops[DEAR_SCHED_COUNT] = { DEAR_SCHED_TABLE(SCHED_OPS_) };
#undef SCHED_OPS_

const dear_sched_ops_t *dear_sched_ops(dear_sched_t s)
{
    return sched_ops[(unsigned)s < DEAR_SCHED_COUNT ? s : DEAR_SCHED_DEAR];
}

/* The time of an update callback of layer lidx for `iteration`, into that layer's samples: one
 * per iteration, the sum of its tensors' (and slices') callbacks. Why: the updates are compute on
 * the application's thread that the forward and backward spans leave out. */
static void update_time(dear_iter_t *it, int lidx, long long iteration, double s)
{
    if (it->upd_iter[lidx] != iteration) {
        if (it->upd_iter[lidx] >= 0)
            dear_samples_add(&it->upd_times[lidx], it->upd_sum[lidx]);
        it->upd_iter[lidx] = iteration;
        it->upd_sum[lidx] = 0;
    }
    it->upd_sum[lidx] += s;
}

/* Tensor t's callback for elements [first, first + count) (all of it, or a slice at shard_offset
 * in this rank's shard). */
static int call_update(dear_ctx_t *ctx, int t, long long iteration, size_t first, size_t count, size_t shard_offset)
{
    dear_tensor_t *tt = &ctx->reg.tensors[t];
    if (!tt->update)
        return DEAR_OK;
    size_t at = first * dear_dtype_size(tt->dtype);
    dear_update_info_t info = {
        .size = sizeof info, .grad = (char *)tt->grad + at, .count = count, .dtype = tt->dtype, .mem = tt->mem,
        .arg = tt->arg, .name = tt->name, .tensor = t, .layer = tt->layer, .iteration = iteration,
        .grad_norm = -1, .clip_coef = 1, .stream = dear_rt_mem_stream(ctx),
        .param = tt->param ? (char *)tt->param + at : NULL, .offset = first, .tensor_count = tt->count,
        .shard_offset = shard_offset,
    };
    dear_clip_result(ctx, iteration, &info.grad_norm, &info.clip_coef);
    double t0 = dear_now();
    int r = tt->update(&info);
    update_time(&ctx->it, tt->lidx, iteration, dear_now() - t0);
    if (r != 0) {
        DEAR_ERROR("api", "update callback of tensor '%s' (layer %d, iteration %lld, elements %zu..%zu) returned %d",
                   tt->name, tt->layer, iteration, first, first + count, r);
        return DEAR_ERR_CALLBACK;
    }
    return DEAR_OK;
}

int dear_call_update(dear_ctx_t *ctx, int t, long long iteration)
{
    return call_update(ctx, t, iteration, 0, ctx->reg.tensors[t].count, 0);
}

int dear_call_update_slice(dear_ctx_t *ctx, int u, long long iteration)
{
    const dear_rt_unit_t *un = &ctx->graph.units[u];
    return call_update(ctx, un->tensor, iteration, un->eoff + un->own_off, un->own_len, un->own_pos);
}

int dear_sched_flush(dear_ctx_t *ctx, const char *call)
{
    DEAR_CHECK(dear_shard_release_held(ctx, call));
    int rc = ctx->cfg.sched_ops->flush ? ctx->cfg.sched_ops->flush(ctx, call) : DEAR_OK;
    /* The next iteration's time starts at its first hook, not here (evaluation, checkpoints). */
    ctx->it.t_iter_start = 0;
    return rc;
}

/* Profile samples come only from training passes: a hook of another mode leaves no mark to
 * measure the next span from. */
static void hook_mark(dear_ctx_t *ctx, int fwd, int lidx)
{
    ctx->it.t_hook = dear_now();
    ctx->it.last_hook_fwd = fwd;
    ctx->it.last_hook_lidx = ctx->it.mode == DEAR_MODE_TRAIN ? lidx : -1;
}

static int forward_begin_one(dear_ctx_t *ctx, int layer)
{
    int lidx = -1, rc = DEAR_OK;
    DEAR_CHECK(hook_enter(ctx, "dear_forward_begin", layer, 1, &lidx));
    if (ctx->it.in_backward) {
        DEAR_ERROR("api", "dear_forward_begin(layer %d): called during the backward pass of iteration %lld (%d of %d "
                          "layers done); call dear_backward_end first",
                   layer, ctx->it.iter, ctx->it.layers_done, ctx->reg.nlayers);
        return DEAR_ERR_STATE;
    }
    if (ctx->it.mode == DEAR_MODE_EVAL)
        return DEAR_OK; /* set_mode completed every update: nothing to wait for or to measure */
    double now = dear_now();
    if (ctx->it.t_iter_start == 0)
        ctx->it.t_iter_start = now;
    else if (!ctx->it.last_hook_fwd && ctx->it.last_hook_lidx < 0 && ctx->it.t_hook >= ctx->it.t_iter_start)
        ctx->it.outside_s = now - ctx->it.t_hook; /* the first forward hook since backward_end */
    if (ctx->it.last_hook_fwd && ctx->it.last_hook_lidx >= 0 && ctx->it.last_hook_lidx < lidx) {
        dear_samples_add(&ctx->it.fwd_times[ctx->it.last_hook_lidx], now - ctx->it.t_hook);
        span(ctx, "forward", ctx->it.last_hook_lidx, DEAR_LANE_COMPUTE, ctx->it.t_hook, now);
    }
    if (ctx->cfg.sched_ops->forward_layer)
        rc = ctx->cfg.sched_ops->forward_layer(ctx, lidx);
    hook_mark(ctx, 1, lidx);
    return rc;
}

/* EVAL has no backward pass; ACCUMULATE's needs nothing from the schedule. */
static int mode_allows_backward(const dear_ctx_t *ctx, const char *call)
{
    if (ctx->it.mode != DEAR_MODE_EVAL)
        return DEAR_OK;
    DEAR_ERROR("api", "%s: the context is in evaluation mode (dear_set_mode DEAR_MODE_EVAL); set DEAR_MODE_TRAIN "
                      "or DEAR_MODE_ACCUMULATE before a backward pass",
               call);
    return DEAR_ERR_STATE;
}

static void begin_backward(dear_ctx_t *ctx, double now)
{
    ctx->it.in_backward = 1;
    ctx->it.layers_done = 0;
    for (int b = 0; b < ctx->graph.nbuckets; b++)
        ctx->graph.buckets[b].remaining = ctx->graph.buckets[b].u1 - ctx->graph.buckets[b].u0;
    if (ctx->it.t_iter_start == 0)
        ctx->it.t_iter_start = now;
}

/* Updates of the last iteration still pending when a backward pass reports layer lidx: a
 * forward_begin was skipped. The gradients just written lie in buffers that the pending
 * all-gathers of the layer's groups still write: those gradients are lost, so the context stops
 * (every later call says why). Pending groups of other layers share no memory with them: they
 * are completed first, and the backward pass goes on. */
static int pending_before_backward(dear_ctx_t *ctx, int lidx, const char *call)
{
    const dear_layer_t *L = &ctx->reg.layers[lidx];
    int clash = 0;
    if (L->u1 > L->u0 && ctx->graph.ngroups > 0) {
        int g0 = dear_group_of(&ctx->graph, L->u0), g1 = dear_group_of(&ctx->graph, L->u1 - 1);
        for (int g = g0; g <= g1; g++)
            clash |= !ctx->graph.groups[g].unpacked;
    }
    if (clash) {
        DEAR_ERROR("api", "%s(layer %d): the all-gathers of iteration %lld into this layer's gradients were still "
                          "pending (dear_forward_begin(%d) was not called since), so the gradient just written is "
                          "overwritten and lost: call dear_forward_begin for every layer before its backward pass "
                          "(in PyTorch: one backward per forward; retain_graph or several losses need a single "
                          "backward of their sum, or DEAR_SCHEDULE=wfbp); communication on this context stops",
                   call, L->id, ctx->it.iter - 1, L->id);
        dear_lock(&ctx->eng.lock);
        if (ctx->eng.sh.rc == DEAR_OK)
            ctx->eng.sh.rc = DEAR_ERR_STATE;
        dear_broadcast(&ctx->eng.done_cv);
        dear_signal(&ctx->eng.work_cv);
        dear_unlock(&ctx->eng.lock);
        return DEAR_ERR_STATE;
    }
    /* Correct, but the updates ran late. */
    DEAR_WARN("api", "%s(layer %d): %d update(s) of iteration %lld were still pending (dear_forward_begin not called "
                     "for every layer?); running them now",
              call, L->id, ctx->it.npending, ctx->it.iter - 1);
    return dear_sched_flush(ctx, call);
}

static int backward_done_one(dear_ctx_t *ctx, int layer)
{
    int lidx = -1, rc = DEAR_OK;
    DEAR_CHECK(hook_enter(ctx, "dear_backward_done", layer, 1, &lidx));
    DEAR_CHECK(mode_allows_backward(ctx, "dear_backward_done"));
    dear_layer_t *L = &ctx->reg.layers[lidx];
    if (ctx->it.mode == DEAR_MODE_ACCUMULATE) {
        /* A micro-batch writes gradients that share memory with all-gathers still pending. */
        if (ctx->it.npending > 0)
            DEAR_CHECK(pending_before_backward(ctx, lidx, "dear_backward_done"));
        hook_mark(ctx, 0, lidx);
        return DEAR_OK;
    }
    if (ctx->it.in_backward && L->bwd_iter == ctx->it.iter) {
        DEAR_ERROR("api", "dear_backward_done(layer %d): called twice in the backward pass of iteration %lld",
                   layer, ctx->it.iter);
        return DEAR_ERR_STATE;
    }
    double now = dear_now();
    if (!ctx->it.in_backward) {
        if (ctx->it.npending > 0) {
            DEAR_CHECK(pending_before_backward(ctx, lidx, "dear_backward_done"));
            now = dear_now();
        }
        begin_backward(ctx, now);
        /* Between the last forward hook and the first backward hook lie the forward and the
         * backward of the last layer (and the loss); split as backward = 2 x forward. */
        if (ctx->it.last_hook_fwd && ctx->it.last_hook_lidx >= 0) {
            double d = now - ctx->it.t_hook;
            if (ctx->it.last_hook_lidx == lidx) {
                dear_samples_add(&ctx->it.fwd_times[lidx], d / 3);
                dear_samples_add(&ctx->it.bwd_times[lidx], 2 * d / 3);
                span(ctx, "forward+backward", lidx, DEAR_LANE_COMPUTE, ctx->it.t_hook, now);
            } else {
                dear_samples_add(&ctx->it.fwd_times[ctx->it.last_hook_lidx], d);
                span(ctx, "forward", ctx->it.last_hook_lidx, DEAR_LANE_COMPUTE, ctx->it.t_hook, now);
            }
        }
    } else if (!ctx->it.last_hook_fwd) {
        dear_samples_add(&ctx->it.bwd_times[lidx], now - ctx->it.t_hook);
        span(ctx, "backward", lidx, DEAR_LANE_COMPUTE, ctx->it.t_hook, now);
    }
    L->bwd_iter = ctx->it.iter;
    ctx->it.layers_done++;
    /* Buckets are contiguous unit ranges, so the layer's units touch a run of buckets. */
    for (int u = L->u0; u < L->u1; u++) {
        dear_bucket_t *b = &ctx->graph.buckets[ctx->graph.units[u].bucket];
        if (--b->remaining > 0)
            continue;
        DEAR_CHECK(dear_rt_bucket_ready(ctx, b));
        if (ctx->cfg.sched_ops->bucket_done)
            ctx->cfg.sched_ops->bucket_done(ctx, b);
    }
    /* Sharded: the slices whose reduce-scatters are done are stepped now, during backward. */
    if (dear_shard_on(ctx))
        rc = dear_shard_step_ready(ctx);
    hook_mark(ctx, 0, lidx);
    return rc;
}

/* Online planning and its check: every rank reaches this at the same backward_end. The plan's
 * collectives are drained first (dear: the all-gathers just queued are waited for and their
 * data put in place; the updates stay pending and still run in the next forward passes), so
 * the switch happens with nothing in flight. */
int dear_switch_plan(dear_ctx_t *ctx, dear_switch_t kind)
{
    if (ctx->cfg.sched_ops->drain)
        DEAR_CHECK(ctx->cfg.sched_ops->drain(ctx));
    return kind == DEAR_SWITCH_VERIFY    ? dear_planning_verify(ctx)
           : kind == DEAR_SWITCH_RESCALE ? dear_planning_rescale(ctx)
                                         : dear_planning_replan(ctx);
}

static int backward_end_one(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    DEAR_CHECK(hook_enter(ctx, "dear_backward_end", 0, 0, NULL));
    DEAR_CHECK(mode_allows_backward(ctx, "dear_backward_end"));
    if (ctx->it.mode == DEAR_MODE_ACCUMULATE)
        return DEAR_OK; /* the gradients stay on this rank, to be added to by the next pass */
    if (!ctx->it.in_backward || ctx->it.layers_done != ctx->reg.nlayers) {
        int missing = -1;
        for (int l = ctx->reg.nlayers - 1; l >= 0 && missing < 0; l--)
            if (!ctx->it.in_backward || ctx->reg.layers[l].bwd_iter != ctx->it.iter)
                missing = ctx->reg.layers[l].id;
        DEAR_ERROR("api", "dear_backward_end: only %d of %d layers reported dear_backward_done in iteration %lld "
                          "(first missing, in backward order: layer %d); call it for every layer first",
                   ctx->it.in_backward ? ctx->it.layers_done : 0, ctx->reg.nlayers, ctx->it.iter, missing);
        return DEAR_ERR_STATE;
    }
    rc = ctx->cfg.sched_ops->backward_end(ctx);
    ctx->it.in_backward = 0;
    ctx->it.iter++;
    /* Sharded: the updates ran; their parameters travel now, unless the program steps first. */
    if (dear_shard_on(ctx) && !dear_shard_holds(ctx)) {
        int r = dear_shard_release_held(ctx, "dear_backward_end");
        if (rc == DEAR_OK)
            rc = r;
    }
    double now = dear_now();
    if (ctx->it.t_iter_start > 0) {
        double iter_s = now - ctx->it.t_iter_start;
        dear_samples_add(&ctx->it.iter_times, iter_s);
        dear_planning_sample(ctx, iter_s, ctx->it.accumulated ? 0 : iter_s - ctx->it.outside_s);
    }
    ctx->it.outside_s = 0;
    ctx->it.accumulated = 0;
    /* Before a plan switch at the same backward_end: the new buckets take the decision. */
    if (rc == DEAR_OK && dear_sparse_due(ctx)) {
        rc = dear_sparse_decide(ctx);
        now = dear_now();
    }
    /* Parameters held for the program's step: a switch follows their release. */
    if (rc == DEAR_OK && ctx->check.at >= 0 && ctx->it.iter >= ctx->check.at &&
        !dear_shard_defer_switch(ctx, DEAR_SWITCH_VERIFY)) {
        rc = dear_switch_plan(ctx, DEAR_SWITCH_VERIFY);
        now = dear_now();
    }
    /* The first plan again, now that one iteration gave the scale of its estimate. */
    if (rc == DEAR_OK && ctx->online.rescale_at >= 0 && ctx->it.iter >= ctx->online.rescale_at &&
        ctx->it.iter < ctx->online.next_plan_iter && !dear_shard_defer_switch(ctx, DEAR_SWITCH_RESCALE)) {
        rc = dear_switch_plan(ctx, DEAR_SWITCH_RESCALE);
        now = dear_now();
    }
    /* A re-plan due during auto's check waits for its end (planning.c sets the next one then). */
    if (rc == DEAR_OK && ctx->check.at < 0 && ctx->online.next_plan_iter >= 0 &&
        ctx->it.iter >= ctx->online.next_plan_iter && !dear_shard_defer_switch(ctx, DEAR_SWITCH_REPLAN)) {
        rc = dear_switch_plan(ctx, DEAR_SWITCH_REPLAN);
        now = dear_now(); /* planning time is not the next forward pass's */
    }
    ctx->it.t_iter_start = now;
    hook_mark(ctx, 0, -1);
    return rc;
}

static int set_mode_one(dear_ctx_t *ctx, dear_mode_t mode)
{
    DEAR_CHECK(hook_enter(ctx, "dear_set_mode", 0, 0, NULL));
    DEAR_ARG_CHECK(mode == DEAR_MODE_TRAIN || mode == DEAR_MODE_ACCUMULATE || mode == DEAR_MODE_EVAL,
                   "dear_set_mode: mode %d unknown; accepted: DEAR_MODE_TRAIN (0), DEAR_MODE_ACCUMULATE (1), "
                   "DEAR_MODE_EVAL (2)",
                   (int)mode);
    if (ctx->it.in_backward) {
        DEAR_ERROR("api", "dear_set_mode: called during the backward pass of iteration %lld; call dear_backward_end "
                          "first",
                   ctx->it.iter);
        return DEAR_ERR_STATE;
    }
    int rc = DEAR_OK;
    /* An evaluation forward reads parameters: every update must have run first. */
    if (mode == DEAR_MODE_EVAL)
        rc = dear_sched_flush(ctx, "dear_set_mode");
    /* The time spent in another mode is no layer's and, out of evaluation, no iteration's. */
    if (ctx->it.mode == DEAR_MODE_EVAL)
        ctx->it.t_iter_start = 0;
    ctx->it.mode = mode;
    ctx->it.last_hook_lidx = -1;
    ctx->it.accumulated |= mode == DEAR_MODE_ACCUMULATE;
    return rc;
}

const char *dear_schedule(const dear_ctx_t *ctx)
{
    return ctx ? dear_sched_name(ctx->cfg.sched) : "unknown";
}

const char *dear_transport(const dear_ctx_t *ctx)
{
    if (ctx == NULL || ctx->cm.tp == NULL)
        return "unknown";
    /* CUDA gradients under NCCL travel on it; staged ones on the context's transport. */
    return ctx->mem.net ? dear_transport_name(ctx->mem.net->tp) : dear_transport_name(ctx->cm.tp);
}

static int wait_grad_one(dear_ctx_t *ctx, int layer)
{
    int lidx = -1;
    DEAR_CHECK(hook_enter(ctx, "dear_wait_grad", layer, 1, &lidx));
    if (ctx->it.in_backward) {
        DEAR_ERROR("api", "dear_wait_grad(layer %d): called during the backward pass; the averaged gradients of an "
                          "iteration exist only after its dear_backward_end",
                   layer);
        return DEAR_ERR_STATE;
    }
    if (dear_shard_on(ctx)) {
        DEAR_ERROR("api", "dear_wait_grad(layer %d): under sharded updates the averaged gradient exists only as "
                          "each rank's slices, which the update callbacks see; the parameters of a layer are in "
                          "place after its dear_forward_begin (or dear_flush)",
                   layer);
        return DEAR_ERR_STATE;
    }
    return ctx->cfg.sched_ops->wait_layer ? ctx->cfg.sched_ops->wait_layer(ctx, lidx) : DEAR_OK;
}

static int flush_one(dear_ctx_t *ctx)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_flush: ctx is NULL");
    if (!ctx->committed)
        return DEAR_OK; /* nothing can be in flight before commit */
    DEAR_CHECK(hook_enter(ctx, "dear_flush", 0, 0, NULL));
    if (ctx->it.in_backward) {
        DEAR_ERROR("api", "dear_flush: called during the backward pass of iteration %lld (%d of %d layers done); "
                          "call dear_backward_end first",
                   ctx->it.iter, ctx->it.layers_done, ctx->reg.nlayers);
        return DEAR_ERR_STATE;
    }
    return dear_sched_flush(ctx, "dear_flush");
}

/* Per tensor: non-zero and all blocks scanned in warm-up, reduce-scatter then all-gather. */
#define SPARSE_COUNTS 4

/* A sparse tensor in a profile: its block and, per phase, the fraction of non-zero blocks
 * measured in warm-up (c: the densest rank's counts; NULL: nothing measured yet); a phase that
 * runs dense, or was never measured, is priced dense (density 1). */
static void set_density(dear_profile_t *prof, const dear_tensor_t *tt, size_t block, const uint64_t *c)
{
    double rs = c && tt->sparse_rs && c[1] > 0 ? (double)c[0] / (double)c[1] : 1.0;
    double ag = c && tt->sparse_ag && c[3] > 0 ? (double)c[2] / (double)c[3] : 1.0;
    dear_prof_set_sparse(prof, block * dear_dtype_size(tt->dtype), rs, ag);
}

/* The registered tensors into prof, as planning prices them when communicated (a frozen tensor
 * moves nothing: 1 byte keeps it a tensor of the profile), else as the model holds them; sparse
 * ones with their block and densities (most: SPARSE_COUNTS per tensor, or NULL). Then checked. */
static int add_tensors(const dear_ctx_t *ctx, dear_profile_t *prof, int communicated, const uint64_t *most)
{
    int rc = DEAR_OK;
    for (int t = 0; t < ctx->reg.ntensors && rc == DEAR_OK; t++) {
        char name[DEAR_NAME_MAX + 1];
        snprintf(name, sizeof name, "%s", ctx->reg.tensors[t].name);
        for (char *c = name; *c; c++) /* the text format has no blanks in names */
            if (*c == ' ' || *c == '\t' || *c == '\n')
                *c = '_';
        /* A frozen tensor moves nothing (1 byte keeps it a tensor of the profile). */
        size_t tb = communicated && ctx->reg.tensors[t].frozen ? 1 : ctx->reg.tensors[t].bytes;
        rc = dear_prof_add_tensor(prof, name, ctx->reg.tensors[t].layer, tb);
        size_t block = dear_tensor_block(ctx, t);
        if (rc == DEAR_OK && block > 0 && tb == ctx->reg.tensors[t].bytes)
            set_density(prof, &ctx->reg.tensors[t], block, most ? &most[SPARSE_COUNTS * t] : NULL);
    }
    if (rc == DEAR_OK && communicated)
        dear_features_profile(ctx, prof); /* planning prices the bytes that travel */
    char msg[256];
    if (rc == DEAR_OK && (rc = dear_prof_check(prof, msg, sizeof msg)) != DEAR_OK)
        DEAR_ERROR("plan", "the profile is rejected: %s", msg);
    return rc;
}

int dear_profile_structure(const dear_ctx_t *ctx, dear_profile_t *prof)
{
    int rc = DEAR_OK;
    dear_prof_init(prof, "structure");
    prof->no_times = 1;
    for (int l = 0; l < ctx->reg.nlayers && rc == DEAR_OK; l++) {
        rc = dear_prof_add_layer(prof, ctx->reg.layers[l].id, 0, 0);
        if (rc == DEAR_OK)
            dear_prof_set_flops(prof, ctx->reg.layers[l].flops);
    }
    if (rc == DEAR_OK)
        rc = add_tensors(ctx, prof, 1, NULL);
    if (rc != DEAR_OK)
        dear_prof_free(prof);
    return rc;
}

/* Layer l's update time per iteration: the median of the iterations closed, or, before any
 * closed, the one still gathering (0 with no update yet). */
static double layer_update_s(const dear_iter_t *it, int l)
{
    if (it->upd_times[l].n > 0)
        return dear_samples_median(&it->upd_times[l]);
    return it->upd_iter[l] >= 0 ? it->upd_sum[l] : 0;
}

int dear_profile_measured(dear_ctx_t *ctx, const char *model, int communicated, dear_profile_t *prof)
{
    int rc = DEAR_OK, nl = ctx->reg.nlayers, nt = ctx->reg.ntensors;
    double *med = NULL, *all = NULL;
    uint64_t *cnt = NULL, *most = NULL;
    size_t bytes = sizeof(double) * 3 * (size_t)nl, cbytes = sizeof(uint64_t) * SPARSE_COUNTS * (size_t)(nt ? nt : 1);
    dear_prof_init(prof, model);
    /* Allocation failures are the reduction's too: every rank must reach it. */
    med = malloc(bytes);
    all = malloc(bytes);
    cnt = malloc(cbytes);
    most = malloc(cbytes);
    /* Planning places a layer's updates on its forward pass, where dear runs them (sync and
     * wfbp run them all at backward_end, the same total), except sharded ones under dear: steps
     * after the reduce-scatters (fusion/sim.h). A saved profile holds the model's passes only, as
     * dear-bench adds the updates of its own optimizer. */
    int steps = communicated && dear_shard_on(ctx) && ctx->cfg.sched == DEAR_SCHED_DEAR;
    for (int l = 0; med && l < nl; l++) {
        double u = communicated ? layer_update_s(&ctx->it, l) : 0;
        med[3 * l] = dear_samples_median(&ctx->it.fwd_times[l]) + (steps ? 0 : u);
        med[3 * l + 1] = dear_samples_median(&ctx->it.bwd_times[l]);
        med[3 * l + 2] = steps ? u : 0;
    }
    if (cnt) {
        dear_lock(&ctx->eng.lock);
        for (int t = 0; t < nt; t++) {
            const dear_tensor_t *tt = &ctx->reg.tensors[t];
            uint64_t *c = &cnt[SPARSE_COUNTS * t];
            c[0] = tt->sh.nz_rs, c[1] = tt->sh.blocks_rs, c[2] = tt->sh.nz_ag, c[3] = tt->sh.blocks_ag;
        }
        dear_unlock(&ctx->eng.lock);
    }
    int ok = med != NULL && all != NULL && cnt != NULL && most != NULL, all_ok = 0;
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, ctx->cm.comm), rc, out);
    if (!all_ok) {
        DEAR_ERROR("plan", "the measured profile: %s", ok ? "another rank ran out of memory" : "out of memory");
        rc = DEAR_ERR_NOMEM;
        goto out;
    }
    /* A plan must fit the slowest worker. */
    DEAR_MPI_CHECK_GOTO(MPI_Reduce(med, all, 3 * nl, MPI_DOUBLE, MPI_MAX, 0, ctx->cm.comm), rc, out);
    /* And the densest rank's sparse blocks, which every rank's collective waits for. */
    DEAR_MPI_CHECK_GOTO(MPI_Reduce(cnt, most, SPARSE_COUNTS * nt, MPI_UINT64_T, MPI_MAX, 0, ctx->cm.comm), rc, out);
    if (ctx->cm.rank != 0)
        goto out;
    for (int l = 0; l < nl && rc == DEAR_OK; l++)
        rc = dear_prof_add_layer(prof, ctx->reg.layers[l].id, all[3 * l], all[3 * l + 1]);
    /* Planning prices what travels; a saved profile describes the model. */
    if (rc == DEAR_OK)
        rc = add_tensors(ctx, prof, communicated, most);
    if (rc == DEAR_OK && steps) {
        for (int l = 0; l < nl; l++) /* the steps, packed in place */
            all[l] = all[3 * l + 2];
        rc = dear_prof_set_steps(prof, all);
    }
out:
    free(med);
    free(all);
    free(cnt);
    free(most);
    return rc;
}

int dear_first_iteration_times(dear_ctx_t *ctx, double *fwd_s, double *bwd_s)
{
    /* This rank's first training iteration: every layer's first sample. */
    double mine[2] = { 0, 0 }, most[2] = { 0, 0 };
    for (int l = 0; l < ctx->reg.nlayers; l++) {
        if (ctx->it.fwd_times[l].n > 0)
            mine[0] += ctx->it.fwd_times[l].v[0];
        if (ctx->it.bwd_times[l].n > 0)
            mine[1] += ctx->it.bwd_times[l].v[0];
    }
    /* The slowest rank's, as a plan must fit it. */
    DEAR_MPI_CHECK(MPI_Reduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, 0, ctx->cm.comm));
    *fwd_s = most[0];
    *bwd_s = most[1];
    return DEAR_OK;
}

static int set_stream_claimed(dear_ctx_t *ctx, void *stream)
{
    if (ctx->it.in_backward) {
        DEAR_ERROR("api", "dear_set_stream: called during the backward pass of iteration %lld; call it between "
                          "iterations",
                   ctx->it.iter);
        return DEAR_ERR_STATE;
    }
    if (ctx->committed && ctx->mem.cuda) {
        /* Updates still pending wait for their data on the stream they were promised. */
        DEAR_CHECK(dear_sched_flush(ctx, "dear_set_stream"));
        dear_memq_t *q = NULL;
        DEAR_CHECK(dear_cuda_queue_wrap(stream, &q));
        dear_cuda_queue_free(ctx->mem.app);
        ctx->mem.app = q;
    }
    ctx->mem.stream = stream;
    return DEAR_OK;
}

/* ---- the hooks and the calls between them, one call at a time ---- */

int dear_set_stream(dear_ctx_t *ctx, void *stream)
{
    DEAR_CLAIMED(ctx, "dear_set_stream", set_stream_claimed(ctx, stream));
}

int dear_forward_begin(dear_ctx_t *ctx, int layer)
{
    int rc = dear_rt_claim(ctx, "dear_forward_begin");
    if (rc != DEAR_OK)
        return rc;
    rc = forward_begin_one(ctx, layer);
    dear_rt_release(ctx);
    return rc;
}

int dear_backward_done(dear_ctx_t *ctx, int layer)
{
    int rc = dear_rt_claim(ctx, "dear_backward_done");
    if (rc != DEAR_OK)
        return rc;
    rc = backward_done_one(ctx, layer);
    dear_rt_release(ctx);
    return rc;
}

int dear_backward_end(dear_ctx_t *ctx)
{
    int rc = dear_rt_claim(ctx, "dear_backward_end");
    if (rc != DEAR_OK)
        return rc;
    rc = backward_end_one(ctx);
    dear_rt_release(ctx);
    return rc;
}

int dear_set_mode(dear_ctx_t *ctx, dear_mode_t mode)
{
    int rc = dear_rt_claim(ctx, "dear_set_mode");
    if (rc != DEAR_OK)
        return rc;
    rc = set_mode_one(ctx, mode);
    dear_rt_release(ctx);
    return rc;
}

int dear_wait_grad(dear_ctx_t *ctx, int layer)
{
    int rc = dear_rt_claim(ctx, "dear_wait_grad");
    if (rc != DEAR_OK)
        return rc;
    rc = wait_grad_one(ctx, layer);
    dear_rt_release(ctx);
    return rc;
}

int dear_shard_release(dear_ctx_t *ctx)
{
    int rc = dear_rt_claim(ctx, "dear_shard_release");
    if (rc != DEAR_OK)
        return rc;
    if (ctx->committed && dear_shard_held(ctx))
        rc = hook_enter(ctx, "dear_shard_release", 0, 0, NULL); /* which releases them */
    dear_rt_release(ctx);
    return rc;
}

int dear_flush(dear_ctx_t *ctx)
{
    int rc = dear_rt_claim(ctx, "dear_flush");
    if (rc != DEAR_OK)
        return rc;
    rc = flush_one(ctx);
    dear_rt_release(ctx);
    return rc;
}
