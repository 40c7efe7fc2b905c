/* Iteration simulator (model in sim.h). The core works on prefix sums so a planner can
 * evaluate thousands of candidate plans per second; dear_sim_run wraps it and records every
 * operation for reports and Gantt charts. */
#include "fusion/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "include/dear_types.h"
#include "base/log.h"
#include "base/util.h"

static double cap_penalty(const dear_sim_model_arg_t *m, size_t bytes)
{
    return m->cap_bytes > 0 && bytes > m->cap_bytes ? DEAR_SIM_CAP_PENALTY_S * (double)bytes / (double)m->cap_bytes : 0;
}

double dear_sim_cost_model(void *arg, dear_coll_op_t op, size_t bytes)
{
    const dear_sim_model_arg_t *m = arg;
    return dear_cost_eval(m->model, op, (double)bytes, NULL) + cap_penalty(m, bytes);
}

double dear_sim_cost_model_fmt(void *arg, dear_coll_op_t op, size_t wire, int c)
{
    const dear_sim_model_arg_t *m = arg;
    return dear_cost_eval_fmt(m->model, op, c, (double)wire) + cap_penalty(m, wire);
}

double dear_sim_cost_model_queued(void *arg, dear_coll_op_t op, size_t bytes)
{
    const dear_sim_model_arg_t *m = arg;
    return dear_cost_queued_factor(m->model, op, (double)bytes);
}

double dear_sim_cost_model_idle(void *arg, dear_coll_op_t op, size_t bytes)
{
    const dear_sim_model_arg_t *m = arg;
    return dear_cost_idle_factor(m->model, op, (double)bytes);
}

dear_sim_cost_t dear_sim_model_cost(dear_sim_model_arg_t *marg)
{
    return (dear_sim_cost_t){ .fn = dear_sim_cost_model, .arg = marg, .fmt_fn = dear_sim_cost_model_fmt,
                              .queued_fn = dear_sim_cost_model_queued, .idle_fn = dear_sim_cost_model_idle,
                              .spread = marg->model->ranks_per_host };
}

struct dear_sim_ws {
    int nlayers, ntensors;
    double F, B;
    double *fwd;        /* per layer */
    double *bwd;        /* per layer */
    double *ready;      /* per tensor: seconds after backward start when its gradient is ready */
    size_t *prefix;     /* prefix[t] = bytes of tensors 0..t-1 (ntensors + 1) */
    /* Sparse or compressed tensors (only when the profile has any): the wire bytes of each phase
     * as prefix sums, each tensor's block and formats (its all-reduce is one collective when both
     * halves travel alike), and the end of its run of tensors with the same block and formats
     * (the runtime cuts buckets there). */
    int wired;
    double *wire_rs, *wire_ag;
    size_t *block;
    unsigned char *fmt_rs, *fmt_ag; /* per tensor: its formats (dear_compress_t) */
    int *run_end;
    int *first_tensor;  /* per layer: its first tensor, or -1 */
    int *last_tensor;   /* per layer: its last tensor, or -1 */
    int *lidx;          /* per tensor: profile layer index */
    double *ag_end;     /* per all-gather group (<= ntensors): end, seconds from this forward's start */
    double *early_prev; /* per early group: its end in the previous iteration, same origin */
    double *hook;       /* the backward hooks (ends of layers with tensors), ascending, from backward start */
    int *hook_layer;    /* per hook: its layer */
    int nhooks;
    int shard;          /* dear_sim_shard_t (dear_sim_ws_set_shard) */
    double *step;       /* sharded steps (profile step_s): prefix sums (ntensors + 1); NULL: none */
    double S;           /* their total */
    double *rs_end;     /* per reduce-scatter bucket: its end in this iteration */
    double *rs_ready, *stepped; /* sharded: per bucket, when it is queued and when its step ends */
    /* recording (dear_sim_run only) */
    dear_sim_op_t *ops;
    int nops, capops;
    int record;
};

void dear_sim_ws_free(dear_sim_ws_t *ws)
{
    if (!ws)
        return;
    free(ws->fwd);
    free(ws->bwd);
    free(ws->ready);
    free(ws->prefix);
    free(ws->first_tensor);
    free(ws->last_tensor);
    free(ws->lidx);
    free(ws->ag_end);
    free(ws->early_prev);
    free(ws->hook);
    free(ws->hook_layer);
    free(ws->step);
    free(ws->rs_end);
    free(ws->rs_ready);
    free(ws->stepped);
    free(ws->wire_rs);
    free(ws->wire_ag);
    free(ws->block);
    free(ws->fmt_rs);
    free(ws->fmt_ag);
    free(ws->run_end);
    free(ws->ops);
    free(ws);
}

/* The wire tables, when the profile has a sparse or a compressed tensor; other profiles keep
 * the one-call group cost. */
static int wire_setup(dear_sim_ws_t *ws, const dear_profile_t *prof)
{
    int nt = prof->ntensors;
    for (int t = 0; t < nt; t++) {
        const dear_prof_tensor_t *pt = &prof->tensors[t];
        ws->wired |= pt->block_bytes > 0 || pt->compress_rs != DEAR_COMPRESS_NONE || pt->compress_ag != DEAR_COMPRESS_NONE;
    }
    if (!ws->wired)
        return DEAR_OK;
    ws->wire_rs = malloc(sizeof(double) * (size_t)(nt + 1));
    ws->wire_ag = malloc(sizeof(double) * (size_t)(nt + 1));
    ws->block = malloc(sizeof(size_t) * (size_t)nt);
    ws->run_end = malloc(sizeof(int) * (size_t)nt);
    ws->fmt_rs = malloc((size_t)nt);
    ws->fmt_ag = malloc((size_t)nt);
    if (!ws->wire_rs || !ws->wire_ag || !ws->block || !ws->run_end || !ws->fmt_rs || !ws->fmt_ag)
        return DEAR_ERR_NOMEM;
    ws->wire_rs[0] = ws->wire_ag[0] = 0;
    for (int t = 0; t < nt; t++) {
        const dear_prof_tensor_t *pt = &prof->tensors[t];
        ws->block[t] = pt->block_bytes;
        ws->fmt_rs[t] = (unsigned char)pt->compress_rs;
        ws->fmt_ag[t] = (unsigned char)pt->compress_ag;
        ws->wire_rs[t + 1] = ws->wire_rs[t] + dear_prof_wire_bytes(pt, DEAR_COLL_REDUCE_SCATTER);
        ws->wire_ag[t + 1] = ws->wire_ag[t] + dear_prof_wire_bytes(pt, DEAR_COLL_ALLGATHER);
    }
    for (int t = nt - 1; t >= 0; t--) {
        const dear_prof_tensor_t *pt = &prof->tensors[t], *nx = t + 1 < nt ? &prof->tensors[t + 1] : NULL;
        int same = nx != NULL && nx->block_bytes == pt->block_bytes && nx->compress_rs == pt->compress_rs &&
                   nx->compress_ag == pt->compress_ag;
        ws->run_end[t] = same ? ws->run_end[t + 1] : t + 1;
    }
    return DEAR_OK;
}

int dear_sim_ws_create(const dear_profile_t *prof, dear_sim_ws_t **out)
{
    int nl = prof->nlayers, nt = prof->ntensors;
    if (nl < 1 || nt < 1)
        return DEAR_ERR_ARG;
    dear_sim_ws_t *ws = calloc(1, sizeof *ws);
    if (!ws)
        return DEAR_ERR_NOMEM;
    ws->nlayers = nl;
    ws->ntensors = nt;
    ws->fwd = malloc(sizeof(double) * (size_t)nl);
    ws->bwd = malloc(sizeof(double) * (size_t)nl);
    ws->ready = malloc(sizeof(double) * (size_t)nt);
    ws->prefix = malloc(sizeof(size_t) * (size_t)(nt + 1));
    ws->first_tensor = malloc(sizeof(int) * (size_t)nl);
    ws->last_tensor = malloc(sizeof(int) * (size_t)nl);
    ws->lidx = malloc(sizeof(int) * (size_t)nt);
    ws->ag_end = malloc(sizeof(double) * (size_t)nt);
    ws->early_prev = malloc(sizeof(double) * (size_t)nt);
    ws->hook = malloc(sizeof(double) * (size_t)nl);
    ws->hook_layer = malloc(sizeof(int) * (size_t)nl);
    ws->rs_end = malloc(sizeof(double) * (size_t)nt);
    ws->rs_ready = malloc(sizeof(double) * (size_t)nt);
    ws->stepped = malloc(sizeof(double) * (size_t)nt);
    if (!ws->fwd || !ws->bwd || !ws->ready || !ws->prefix || !ws->first_tensor || !ws->last_tensor || !ws->lidx ||
        !ws->ag_end || !ws->early_prev || !ws->hook || !ws->hook_layer || !ws->rs_end || !ws->rs_ready ||
        !ws->stepped) {
        dear_sim_ws_free(ws);
        return DEAR_ERR_NOMEM;
    }
    double *bwd_done = malloc(sizeof(double) * (size_t)nl);
    if (!bwd_done) {
        dear_sim_ws_free(ws);
        return DEAR_ERR_NOMEM;
    }
    double acc = 0;
    for (int l = nl - 1; l >= 0; l--) {
        acc += prof->layers[l].bwd_s;
        bwd_done[l] = acc;
    }
    ws->B = acc;
    ws->F = 0;
    for (int l = 0; l < nl; l++) {
        ws->fwd[l] = prof->layers[l].fwd_s;
        ws->bwd[l] = prof->layers[l].bwd_s;
        ws->F += prof->layers[l].fwd_s;
        ws->first_tensor[l] = ws->last_tensor[l] = -1;
    }
    ws->prefix[0] = 0;
    for (int t = 0; t < nt; t++) {
        int l = prof->tensors[t].lidx;
        if (l < 0 || l >= nl) {
            free(bwd_done);
            dear_sim_ws_free(ws);
            DEAR_ERROR("sim", "profile tensor %d has no layer index: run dear_prof_check first", t);
            return DEAR_ERR_ARG;
        }
        ws->lidx[t] = l;
        ws->ready[t] = bwd_done[l];
        ws->prefix[t + 1] = ws->prefix[t] + prof->tensors[t].bytes;
        if (ws->first_tensor[l] < 0)
            ws->first_tensor[l] = t;
        ws->last_tensor[l] = t;
    }
    for (int l = nl - 1; l >= 0; l--)
        if (ws->first_tensor[l] >= 0) {
            ws->hook_layer[ws->nhooks] = l;
            ws->hook[ws->nhooks++] = bwd_done[l];
        }
    free(bwd_done);
    int steps = 0;
    for (int t = 0; t < nt; t++)
        steps |= prof->tensors[t].step_s > 0;
    if (steps) {
        if (!(ws->step = malloc(sizeof(double) * (size_t)(nt + 1)))) {
            dear_sim_ws_free(ws);
            return DEAR_ERR_NOMEM;
        }
        ws->step[0] = 0;
        for (int t = 0; t < nt; t++)
            ws->step[t + 1] = ws->step[t] + (prof->tensors[t].step_s > 0 ? prof->tensors[t].step_s : 0);
        ws->S = ws->step[nt];
    }
    int rc = wire_setup(ws, prof);
    if (rc != DEAR_OK) {
        dear_sim_ws_free(ws);
        return rc;
    }
    *out = ws;
    return DEAR_OK;
}

size_t dear_sim_ws_bytes(const dear_sim_ws_t *ws, int lo, int hi)
{
    return ws->prefix[hi] - ws->prefix[lo];
}

/* One collective of the run [a, b), `wire` bytes: a dense compressed run by its format's cost
 * when the cost function has one; a sparse run by its wire bytes (values in the format, indices
 * as they are), a reduce-scatter's with spread ranks per host spread times over while that stays
 * under the run's dense bytes in its format, else by those, as the runtime then runs the dense
 * algorithm (collectives/coll_sparse.c; an all-gather crosses once per host, through partners);
 * int8 always runs the exchange (sim.h). */
static double wire_cost(const dear_sim_ws_t *ws, const dear_sim_cost_t *cost, dear_coll_op_t op, int a, int b,
                        size_t wire)
{
    int f = op == DEAR_COLL_ALLGATHER ? ws->fmt_ag[a] : ws->fmt_rs[a];
    if (cost->fmt_fn && ws->block[a] == 0 && f != DEAR_COMPRESS_NONE)
        return cost->fmt_fn(cost->arg, op, wire, f);
    if (ws->block[a] > 0 && cost->spread > 1 && op != DEAR_COLL_ALLGATHER) {
        double dense = (double)(ws->prefix[b] - ws->prefix[a]) * dear_compress_ratio((dear_compress_t)f);
        double x = (double)wire * cost->spread;
        wire = (size_t)llround(f == DEAR_COMPRESS_INT8 || x < dense ? x : dense);
    }
    return cost->fn(cost->arg, op, wire);
}

/* How a collective finds the channel when it becomes ready: busy (it starts queued), idle for
 * DEAR_COST_IDLE_GAP_S or more, or neither (it starts as the channel frees). */
enum { CH_FREEING, CH_QUEUED, CH_IDLE };

/* The state of a channel free from chan for a collective ready at `ready`. */
static int chan_state(double ready, double chan)
{
    return ready < chan ? CH_QUEUED : ready - chan >= DEAR_COST_IDLE_GAP_S ? CH_IDLE : CH_FREEING;
}

/* Factor on a float32 collective of `bytes` that finds the channel in state q: queued_fn's or
 * idle_fn's, else 1. */
static double queued(const dear_sim_cost_t *cost, dear_coll_op_t op, size_t bytes, int q)
{
    if (q == CH_QUEUED && cost->queued_fn)
        return cost->queued_fn(cost->arg, op, bytes);
    return q == CH_IDLE && cost->idle_fn ? cost->idle_fn(cost->arg, op, bytes) : 1.0;
}

/* The group [lo, hi) as the channel runs it in state q (chan_state): its dense float32
 * collectives run in flight with the ones ahead when queued (dear_sim_cost_t.queued_fn), alone
 * on an idle link when idle (idle_fn), by each collective's bytes. Compressed and sparse runs keep
 * their price back to back: their bursts (the conversions on the progress thread, the index
 * exchange) were never measured. */
static double group_cost(const dear_sim_ws_t *ws, const dear_sim_cost_t *cost, dear_coll_op_t op, int lo, int hi,
                         int q)
{
    if (!ws->wired) {
        size_t bytes = ws->prefix[hi] - ws->prefix[lo];
        return cost->fn(cost->arg, op, bytes) * queued(cost, op, bytes, q);
    }
    /* The runtime cuts a bucket where the block or the type changes: one collective per run. */
    double c = 0;
    for (int a = lo; a < hi;) {
        int b = ws->run_end[a] < hi ? ws->run_end[a] : hi;
        size_t rs = (size_t)llround(ws->wire_rs[b] - ws->wire_rs[a]);
        size_t ag = (size_t)llround(ws->wire_ag[b] - ws->wire_ag[a]);
        int f = op == DEAR_COLL_ALLGATHER ? ws->fmt_ag[a] : ws->fmt_rs[a];
        int dense32 = ws->block[a] == 0 && f == DEAR_COMPRESS_NONE &&
                      (op != DEAR_COLL_ALLREDUCE || ws->fmt_ag[a] == DEAR_COMPRESS_NONE);
        double k = dense32 ? queued(cost, op, ws->prefix[b] - ws->prefix[a], q) : 1.0;
        if (op != DEAR_COLL_ALLREDUCE)
            c += k * wire_cost(ws, cost, op, a, b, op == DEAR_COLL_ALLGATHER ? ag : rs);
        else if (ws->block[a] == 0 && ws->fmt_rs[a] == ws->fmt_ag[a])
            c += k * wire_cost(ws, cost, op, a, b, rs);
        else
            c += wire_cost(ws, cost, DEAR_COLL_REDUCE_SCATTER, a, b, rs) +
                 wire_cost(ws, cost, DEAR_COLL_ALLGATHER, a, b, ag);
        a = b;
    }
    return c;
}

double dear_sim_ws_group(const dear_sim_ws_t *ws, const dear_sim_cost_t *cost, dear_coll_op_t op, int lo, int hi)
{
    return group_cost(ws, cost, op, lo, hi, CH_FREEING);
}

static void rec(dear_sim_ws_t *ws, int kind, int index, double start, double end, size_t bytes)
{
    if (!ws->record)
        return;
    if (ws->nops == ws->capops) {
        int cap = ws->capops ? 2 * ws->capops : 256;
        dear_sim_op_t *o = realloc(ws->ops, sizeof *o * (size_t)cap);
        if (!o) {
            ws->record = -1;   /* reported by dear_sim_run */
            return;
        }
        ws->ops = o;
        ws->capops = cap;
    }
    ws->ops[ws->nops++] = (dear_sim_op_t){ .kind = kind, .index = index, .start = start, .end = end, .bytes = bytes };
}

/* Records the backward of layers *l down to `to`, the next starting *tb after backward's start,
 * shifted by `shift`. */
static void rec_bwd_to(dear_sim_ws_t *ws, int *l, int to, double *tb, double shift)
{
    for (; ws->record && *l >= to; (*l)--) {
        rec(ws, DEAR_SIM_BWD, *l, shift + *tb, shift + *tb + ws->bwd[*l], 0);
        *tb += ws->bwd[*l];
    }
}

/* Records the whole backward from t0, undelayed. */
static void rec_backward(dear_sim_ws_t *ws, double t0)
{
    int l = ws->nlayers - 1;
    double tb = 0;
    rec_bwd_to(ws, &l, 0, &tb, t0);
}

/* The partitions of a plan as the schedules' functions take them. */
typedef struct {
    int nrs, nag, ne;
    const int *rs, *ag;
    const unsigned char *em; /* per group, 1: early; NULL: the last ne groups */
} sim_plan_t;

/* Whether group g runs early, and the lowest group that may. */
static int is_early(const sim_plan_t *p, int g)
{
    return p->em ? p->em[g] != 0 : g >= p->nag - p->ne;
}

static int early_lo(const sim_plan_t *p)
{
    return p->em ? 0 : p->nag - p->ne;
}

static double sim_sync(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, const sim_plan_t *p, double *comm)
{
    size_t bytes = ws->prefix[ws->ntensors];
    /* The link has been idle since the previous iteration's all-reduce: through F + B. */
    double c = group_cost(ws, cost, DEAR_COLL_ALLREDUCE, 0, ws->ntensors, chan_state(ws->F + ws->B, 0));
    if (ws->record) {
        double t = 0;
        for (int l = 0; l < ws->nlayers; l++) {
            rec(ws, DEAR_SIM_FWD, l, t, t + ws->fwd[l], 0);
            t += ws->fwd[l];
        }
        rec_backward(ws, ws->F);
        rec(ws, DEAR_COLL_ALLREDUCE, 0, ws->F + ws->B, ws->F + ws->B + c, bytes);
    }
    *comm = c;
    return ws->F + ws->B + c;
}

/* Buckets launched last group first as backward completes them, FIFO from chan_free. Returns
 * the channel's free time; adds busy time to *comm. */
static double run_buckets(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, dear_coll_op_t op, double bwd_start, double chan_free, int ng, const int *first, double *comm)
{
    double chan = chan_free;
    for (int g = ng - 1; g >= 0; g--) {
        size_t bytes = ws->prefix[first[g + 1]] - ws->prefix[first[g]];
        double ready = bwd_start + ws->ready[first[g]];
        double start = ready > chan ? ready : chan;
        double c = group_cost(ws, cost, op, first[g], first[g + 1], chan_state(ready, chan));
        chan = start + c;
        *comm += c;
        rec(ws, (int)op, g, start, chan, bytes);
    }
    return chan;
}

static double sim_wfbp(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, const sim_plan_t *p, double *comm)
{
    if (ws->record) {
        double t = 0;
        for (int l = 0; l < ws->nlayers; l++) {
            rec(ws, DEAR_SIM_FWD, l, t, t + ws->fwd[l], 0);
            t += ws->fwd[l];
        }
        rec_backward(ws, ws->F);
    }
    *comm = 0;
    double end = run_buckets(ws, cost, DEAR_COLL_ALLREDUCE, ws->F, 0, p->nrs, p->rs, comm);
    double compute = ws->F + ws->B;
    return end > compute ? end : compute;
}

/* Index of the group of a partition (first[0..ng]) holding tensor t. */
static int group_of(const int *first, int ng, int t)
{
    int lo = 0, hi = ng - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (first[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Steps *e (a group; *eb the bucket holding its first tensor) down one group. */
static void group_down(const sim_plan_t *p, int *e, int *eb)
{
    while (*e - 1 >= early_lo(p) && *eb > 0 && p->rs[*eb] > p->ag[*e - 1])
        (*eb)--;   /* the bucket holding group e - 1's first tensor */
    (*e)--;
}

/* Moves *e down past the groups that do not run early, down to the lowest that may. */
static void early_next(const sim_plan_t *p, int *e, int *eb)
{
    while (*e >= early_lo(p) && !is_early(p, *e))
        group_down(p, e, eb);
}

/* The early groups *e, *e - 1, ... completed by buckets >= b (those is_early of the ones from
 * nag - 1 down), one after another in the channel from *chan, none before ready. */
static void early_run(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, const sim_plan_t *p, int *e, int *eb, int b,
                      double ready, double *chan, double *comm)
{
    const int *ag = p->ag;
    int lo = early_lo(p);
    for (early_next(p, e, eb); *e >= lo && *eb >= b; early_next(p, e, eb)) {
        size_t gb = ws->prefix[ag[*e + 1]] - ws->prefix[ag[*e]];
        double cg = group_cost(ws, cost, DEAR_COLL_ALLGATHER, ag[*e], ag[*e + 1], chan_state(ready, *chan));
        double start = ready > *chan ? ready : *chan;
        rec(ws, DEAR_COLL_ALLGATHER, *e, start, start + cg, gb);
        *chan = start + cg;
        ws->ag_end[*e] = *chan;
        *comm += cg;
        group_down(p, e, eb);
    }
}

/* Queues reduce-scatter bucket b, ready at `ready`, in the channel. */
static void rs_queue(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, const int *rs, int b, double ready,
                     double *chan, double *comm)
{
    size_t bytes = ws->prefix[rs[b + 1]] - ws->prefix[rs[b]];
    double start = ready > *chan ? ready : *chan;
    double c = group_cost(ws, cost, DEAR_COLL_REDUCE_SCATTER, rs[b], rs[b + 1], chan_state(ready, *chan));
    rec(ws, DEAR_COLL_REDUCE_SCATTER, b, start, start + c, bytes);
    *chan = start + c;
    *comm += c;
    ws->rs_end[b] = *chan;
}

/* Backward from fw without sharded steps: reduce-scatters as backward completes their buckets
 * (last first), an early all-gather group behind the bucket that completes its data, in the
 * same FIFO channel. Returns the end of backward. */
static double backward_plain(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, const sim_plan_t *p, double fw,
                             double *chan, double *comm)
{
    if (ws->record)
        rec_backward(ws, fw);
    int e = p->nag - 1, eb = e >= early_lo(p) ? group_of(p->rs, p->nrs, p->ag[e]) : -1;
    for (int b = p->nrs - 1; b >= 0; b--) {
        rs_queue(ws, cost, p->rs, b, fw + ws->ready[p->rs[b]], chan, comm);
        early_run(ws, cost, p, &e, &eb, b, 0, chan, comm);
    }
    return fw + ws->B;
}

/* The channel of a sharded backward: it runs the runtime's sequence (runtime/buckets.c,
 * ops_order), RS(n-1), then for each bucket b below it RS(b) and the early groups E(b + 1) that
 * bucket b + 1 completes, then E(0); an op starts once the ones before it started and it is
 * queued: a bucket at the hook that completes it (ready), E(b) when bucket b's step ends (an
 * empty E(b) is no op). Unknown times are NAN. */
typedef struct {
    const sim_plan_t *p;
    int k;              /* next op of the sequence, 0 .. 2 nrs - 1 */
    int e, eb;          /* next early group, the bucket that completes it */
    double *ready, *stepped; /* per bucket */
} shard_chan_t;

static void shard_advance(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, shard_chan_t *sc, double *chan,
                          double *comm)
{
    const sim_plan_t *p = sc->p;
    int n = p->nrs, lo = early_lo(p);
    for (; sc->k < 2 * n; sc->k++) {
        int k = sc->k;
        if (k == 0 || (k % 2 == 1 && k < 2 * n - 1)) {
            int b = k == 0 ? n - 1 : n - 1 - (k + 1) / 2;
            if (isnan(sc->ready[b]))
                return;
            rs_queue(ws, cost, p->rs, b, sc->ready[b], chan, comm);
        } else {
            int b = k == 2 * n - 1 ? 0 : n - k / 2;
            early_next(p, &sc->e, &sc->eb);
            if (sc->e < lo || sc->eb < b)
                continue; /* bucket b completes no early group */
            if (isnan(sc->stepped[b]))
                return;
            early_run(ws, cost, p, &sc->e, &sc->eb, b, sc->stepped[b], chan, comm);
        }
    }
}

/* Steps bucket b's slices from t on the compute stream, then lets the channel run what waited
 * for it. Returns the step's end. */
static double step_bucket(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, shard_chan_t *sc, int b, double t,
                          double *chan, double *comm)
{
    const int *rs = sc->p->rs;
    double end = t + (ws->step ? ws->step[rs[b + 1]] - ws->step[rs[b]] : 0);
    if (end > t)
        rec(ws, DEAR_SIM_STEP, b, t, end, 0);
    sc->stepped[b] = end;
    shard_advance(ws, cost, sc, chan, comm);
    return end;
}

/* Backward from fw with sharded updates (runtime/shard.c): a bucket's slices are stepped on the
 * compute stream once its reduce-scatter is done, in the order backward completed the buckets.
 * With DEAR_SIM_SHARD_EARLY, at the first backward hook that finds it done: a hook first queues
 * the buckets it completes, then steps, and the steps delay the rest of backward. backward_end
 * steps the others, each once its reduce-scatter ends, and the next forward starts after it: the
 * returned time. */
static double backward_sharded(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, const sim_plan_t *p, double fw,
                               double *chan, double *comm)
{
    int n = p->nrs;
    shard_chan_t sc = { .p = p, .e = p->nag - 1, .ready = ws->rs_ready, .stepped = ws->stepped };
    sc.eb = sc.e >= early_lo(p) ? group_of(p->rs, n, p->ag[sc.e]) : -1;
    for (int b = 0; b < n; b++)
        sc.ready[b] = sc.stepped[b] = ws->rs_end[b] = NAN;
    int nb = n - 1, sb = n - 1, l = ws->nlayers - 1; /* next bucket to complete, to step; layer to record */
    double delay = 0, tb = 0;                        /* the steps so far; recording */
    for (int h = 0; h < ws->nhooks; h++) {
        rec_bwd_to(ws, &l, ws->hook_layer[h], &tb, fw + delay);
        double t = fw + ws->hook[h] + delay;
        for (; nb >= 0 && ws->ready[p->rs[nb]] <= ws->hook[h]; nb--)
            sc.ready[nb] = t;
        shard_advance(ws, cost, &sc, chan, comm);
        for (; ws->shard == DEAR_SIM_SHARD_EARLY && sb > nb && ws->rs_end[sb] <= t; sb--)
            t = step_bucket(ws, cost, &sc, sb, t, chan, comm);
        delay = t - fw - ws->hook[h];
    }
    rec_bwd_to(ws, &l, 0, &tb, fw + delay);
    double t = fw + ws->B + delay;
    for (; nb >= 0; nb--) /* buckets of no layer with a hook: none in a checked profile */
        sc.ready[nb] = t;
    shard_advance(ws, cost, &sc, chan, comm);
    for (; sb >= 0; sb--)
        t = step_bucket(ws, cost, &sc, sb, ws->rs_end[sb] > t ? ws->rs_end[sb] : t, chan, comm);
    return t;
}

/* One dear iteration. The channel is free from c0 after the forward start (c0 <= 0: it freed -c0
 * before it); the early all-gather groups (is_early) ended at ws->early_prev[g] in the
 * previous iteration's backward (same origin: usually negative). Returns the iteration time, the
 * next iteration's c0 and, in ws->early_prev, the early groups' ends for the next iteration. */
static double dear_once(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, const sim_plan_t *p, double c0,
                        double *c0_next, double *comm)
{
    *comm = 0;
    int nag = p->nag, first = 1;
    const int *ag = p->ag;
    /* Regular all-gathers, queued at the end of the previous backward, run back to back from
     * c0, in forward order; layer l starts once every group holding one of its tensors is done. */
    double chan = c0 > 0 ? c0 : 0, t = 0;
    int g = 0, g0 = 0, g1 = 0;
    for (int l = 0; l < ws->nlayers; l++) {
        int ft = ws->first_tensor[l], lt = ws->last_tensor[l];
        double start = t;
        if (lt >= 0) {
            /* Layers come in tensor order: the groups holding them only move forward. */
            for (g0 = g1; g0 + 1 < nag && ag[g0 + 1] <= ft; g0++)
                ;
            for (g1 = g0; g1 + 1 < nag && ag[g1 + 1] <= lt; g1++)
                ;
            for (; g < nag && g <= g1; g++) {
                if (is_early(p, g))
                    continue;
                size_t bytes = ws->prefix[ag[g + 1]] - ws->prefix[ag[g]];
                /* Queued together at the previous backward's end: all but a first that finds the
                 * channel free run in flight with the ones ahead. */
                double c = group_cost(ws, cost, DEAR_COLL_ALLGATHER, ag[g], ag[g + 1],
                                      first ? chan_state(0, c0) : CH_QUEUED);
                first = 0;
                rec(ws, DEAR_COLL_ALLGATHER, g, chan, chan + c, bytes);
                chan += c;
                ws->ag_end[g] = chan;
                *comm += c;
            }
            for (int k = g0; k <= g1; k++) {
                double e = is_early(p, k) ? ws->early_prev[k] : ws->ag_end[k];
                if (e > start)
                    start = e;
            }
        }
        rec(ws, DEAR_SIM_FWD, l, start, start + ws->fwd[l], 0);
        t = start + ws->fwd[l];
    }
    double fw = t;
    double iter = ws->shard != DEAR_SIM_SHARD_NONE || ws->step ? backward_sharded(ws, cost, p, fw, &chan, comm)
                                               : backward_plain(ws, cost, p, fw, &chan, comm);
    for (int k = early_lo(p); k < nag; k++)
        if (is_early(p, k))
            ws->early_prev[k] = ws->ag_end[k] - iter;
    *c0_next = chan - iter;
    return iter;
}

static double sim_dear(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, const sim_plan_t *p, double *comm)
{
    int nrs = p->nrs, nag = p->nag, ne = p->ne;
    if (ne < 0 || ne > nag)
        return INFINITY;
    *comm = 0;
    int record = ws->record;
    ws->record = 0;
    double next = 0, iter = 0;
    /* Without early groups the channel is always free when backward starts (the last
     * all-gather group holds the last tensor, whose layer waits for it), so the reduce-scatter
     * tail past the end of backward depends on plan.rs and on how long the channel was idle
     * before each bucket: run_buckets from an idle channel is the start. Early groups make the
     * next forward depend on this backward (their ends, the channel's tail), and the idle time
     * before the first all-gather prices it: the map (c0, ends) -> next is iterated from that
     * start to its fixed point. */
    double c0 = run_buckets(ws, cost, DEAR_COLL_REDUCE_SCATTER, 0, 0, nrs, p->rs, comm) - ws->B;
    for (int k = 0; k < nag; k++)
        ws->early_prev[k] = -INFINITY;
    double prev_iter = -1;
    for (int k = 0; k < 64; k++) {
        iter = dear_once(ws, cost, p, c0, &next, comm);
        if (fabs(next - c0) <= 1e-12 * (1 + iter) && (ne == 0 || fabs(iter - prev_iter) <= 1e-12 * (1 + iter)))
            break;
        c0 = next;
        prev_iter = iter;
    }
    if (record) {
        ws->record = record;
        iter = dear_once(ws, cost, p, c0, &next, comm);
    }
    return iter;
}

/* One iteration of each schedule, in the order of dear_sched_t (base/sched_table.h). */
typedef double (*sim_fn_t)(dear_sim_ws_t *, const dear_sim_cost_t *, const sim_plan_t *, double *);
#define SIM_FN_(ID, NAME, OPS, SIM, FLAGS, HELP) [DEAR_SCHED_##ID] = SIM,
static const sim_fn_t sim_fns[DEAR_SCHED_COUNT] = { DEAR_SCHED_TABLE(SIM_FN_) };
#undef SIM_FN_

double dear_sim_ws_iter(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, dear_sched_t sched, int nrs,
                        const int *rs_first, int nag, const int *ag_first, int ag_early)
{
    return dear_sim_ws_iter_early(ws, cost, sched, nrs, rs_first, nag, ag_first, ag_early, NULL);
}

double dear_sim_ws_iter_early(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, dear_sched_t sched, int nrs,
                              const int *rs_first, int nag, const int *ag_first, int ag_early,
                              const unsigned char *early)
{
    double comm;
    if ((unsigned)sched >= DEAR_SCHED_COUNT)
        return INFINITY;
    sim_plan_t p = { .nrs = nrs, .rs = rs_first, .nag = nag, .ag = ag_first, .ne = ag_early, .em = early };
    if (early != NULL)
        for (int g = p.ne = 0; g < nag; g++)
            p.ne += early[g] != 0;
    return sim_fns[sched](ws, cost, &p, &comm);
}

void dear_sim_ws_set_shard(dear_sim_ws_t *ws, int shard)
{
    ws->shard = shard == DEAR_SIM_SHARD_END || shard == DEAR_SIM_SHARD_EARLY ? shard : DEAR_SIM_SHARD_NONE;
}

int dear_sim_run(const dear_profile_t *prof, const dear_sim_cost_t *cost, dear_sched_t sched,
                 const dear_plan_t *plan, int record, dear_sim_result_t *res)
{
    return dear_sim_run_ex(prof, cost, sched, plan, DEAR_SIM_SHARD_NONE, record, res);
}

int dear_sim_run_ex(const dear_profile_t *prof, const dear_sim_cost_t *cost, dear_sched_t sched,
                    const dear_plan_t *plan, int shard, int record, dear_sim_result_t *res)
{
    if (!prof || !cost || !cost->fn || !plan || !res || (unsigned)sched >= DEAR_SCHED_COUNT)
        return DEAR_ERR_ARG;
    char msg[256];
    /* The profile's tensors are the plan's units (fusion/units.h). */
    if (plan->nunits != prof->ntensors)
        snprintf(msg, sizeof msg, "the plan has %d units, the profile %d tensors", plan->nunits, prof->ntensors);
    if (plan->nunits != prof->ntensors || dear_plan_validate(plan, plan->ntensors, msg, sizeof msg) != DEAR_OK) {
        DEAR_ERROR("sim", "plan does not fit the profile: %s", msg);
        return DEAR_ERR_ARG;
    }
    dear_sim_ws_t *ws;
    int rc = dear_sim_ws_create(prof, &ws);
    if (rc != DEAR_OK)
        return rc;
    ws->record = record ? 1 : 0;
    dear_sim_ws_set_shard(ws, shard);
    double comm = 0;
    sim_plan_t p = { .nrs = plan->rs.ngroups, .rs = plan->rs.first, .nag = plan->ag.ngroups, .ag = plan->ag.first,
                     .ne = plan->ag_early, .em = plan->early };
    double iter = sim_fns[sched](ws, cost, &p, &comm);
    if (ws->record < 0) {
        dear_sim_ws_free(ws);
        return DEAR_ERR_NOMEM;
    }
    /* Sharded steps are compute where the schedule places them (dear only). */
    double compute = ws->F + ws->B + (sched == DEAR_SCHED_DEAR ? ws->S : 0);
    dear_sim_result_t r = { .sched = sched, .iter_s = iter, .compute_s = compute, .comm_s = comm };
    r.exposed_s = iter - r.compute_s;
    if (record) {
        r.ops = ws->ops;
        r.nops = ws->nops;
        ws->ops = NULL;
    }
    dear_sim_ws_free(ws);
    dear_sim_result_free(res);
    *res = r;
    return DEAR_OK;
}

void dear_sim_result_free(dear_sim_result_t *res)
{
    if (!res)
        return;
    free(res->ops);
    res->ops = NULL;
    res->nops = 0;
}

/* The iteration of plan under cost with every collective of its model s times dearer. */
static int iter_scaled(const dear_profile_t *prof, const dear_sim_cost_t *cost, dear_cost_model_t *work,
                       dear_sched_t sched, const dear_plan_t *plan, int shard, double s, double *iter_s)
{
    const dear_sim_model_arg_t *marg = cost->arg;
    *work = *marg->model;
    dear_cost_mul(work, s);
    dear_sim_model_arg_t m = { .model = work, .cap_bytes = marg->cap_bytes };
    dear_sim_cost_t c = *cost;
    c.arg = &m;
    dear_sim_result_t r = { 0 };
    int rc = dear_sim_run_ex(prof, &c, sched, plan, shard, 0, &r);
    *iter_s = r.iter_s;
    return rc;
}

int dear_sim_fit_scale(const dear_profile_t *prof, const dear_sim_cost_t *cost, dear_sched_t sched,
                       const dear_plan_t *plan, int shard, double measured_s, double smax, double *scale)
{
    const dear_sim_model_arg_t *marg = cost ? cost->arg : NULL;
    if (!prof || !marg || !marg->model || !plan || !scale || !(measured_s > 0) || !(smax >= 1) || !isfinite(smax))
        return DEAR_ERR_ARG;
    *scale = 1;
    dear_cost_model_t *work = malloc(sizeof *work);
    if (!work)
        return DEAR_ERR_NOMEM;
    double lo = 1, hi = smax, t = 0;
    int rc = iter_scaled(prof, cost, work, sched, plan, shard, lo, &t);
    if (rc == DEAR_OK && t >= measured_s)
        hi = lo; /* the model prices the plan as slow as it ran, or slower */
    else if (rc == DEAR_OK && (rc = iter_scaled(prof, cost, work, sched, plan, shard, hi, &t)) == DEAR_OK &&
             t < measured_s)
        lo = hi; /* even smax prices it faster than it ran */
    /* The iteration never shortens as collectives get dearer: bisect to a thousandth. */
    while (rc == DEAR_OK && hi - lo > 1e-3) {
        double mid = 0.5 * (lo + hi);
        rc = iter_scaled(prof, cost, work, sched, plan, shard, mid, &t);
        if (t < measured_s)
            lo = mid;
        else
            hi = mid;
    }
    free(work);
    if (rc == DEAR_OK)
        *scale = 0.5 * (lo + hi);
    return rc;
}

/* Record kinds (dear_coll_op_t values, then DEAR_SIM_FWD, DEAR_SIM_BWD, DEAR_SIM_STEP): names
 * and colours, and the legend's order. */
#define SIM_NKINDS (DEAR_SIM_STEP + 1)
static const char *kind_name(int k)
{
    static const char *const n[SIM_NKINDS] = { [DEAR_COLL_REDUCE_SCATTER] = "reduce-scatter",
                                               [DEAR_COLL_ALLGATHER] = "all-gather",
                                               [DEAR_COLL_ALLREDUCE] = "all-reduce",
                                               [DEAR_SIM_FWD] = "forward",
                                               [DEAR_SIM_BWD] = "backward",
                                               [DEAR_SIM_STEP] = "sharded step" };
    return (unsigned)k < SIM_NKINDS ? n[k] : "?";
}

int dear_sim_svg(const dear_sim_result_t *res, const char *title, FILE *out)
{
    if (!res || !out)
        return DEAR_ERR_ARG;
    double tmax = res->iter_s;
    for (int i = 0; i < res->nops; i++)
        if (res->ops[i].end > tmax)
            tmax = res->ops[i].end;
    if (!(tmax > 0))
        tmax = 1;
    const double W = 1200, left = 110, right = 20, row = 36, top = 50;
    double scale = (W - left - right) / tmax;
    static const char *const fill[SIM_NKINDS] = { [DEAR_SIM_FWD] = "#4e79a7", [DEAR_SIM_BWD] = "#59a14f",
                                                  [DEAR_COLL_REDUCE_SCATTER] = "#f28e2b",
                                                  [DEAR_COLL_ALLGATHER] = "#b07aa1",
                                                  [DEAR_COLL_ALLREDUCE] = "#e15759",
                                                  [DEAR_SIM_STEP] = "#edc948" };
    static const int legend[SIM_NKINDS] = { DEAR_SIM_FWD, DEAR_SIM_BWD, DEAR_SIM_STEP, DEAR_COLL_REDUCE_SCATTER,
                                            DEAR_COLL_ALLGATHER, DEAR_COLL_ALLREDUCE };
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                 "font-family=\"sans-serif\" font-size=\"12\">\n", W, top + 2 * row + 70);
    fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(out, "<text x=\"10\" y=\"20\" font-size=\"14\">");
    for (const char *c = title ? title : ""; *c; c++) {
        if (*c == '<')
            fputs("&lt;", out);
        else if (*c == '&')
            fputs("&amp;", out);
        else
            fputc(*c, out);
    }
    fprintf(out, "</text>\n<text x=\"10\" y=\"38\">%s: iteration %.3f ms, compute %.3f ms, exposed communication "
                 "%.3f ms</text>\n", dear_sched_name(res->sched), res->iter_s * 1e3, res->compute_s * 1e3,
            res->exposed_s * 1e3);
    fprintf(out, "<text x=\"10\" y=\"%.0f\">compute</text>\n", top + row * 0.6);
    fprintf(out, "<text x=\"10\" y=\"%.0f\">communication</text>\n", top + row * 1.6);
    for (int i = 0; i < res->nops; i++) {
        const dear_sim_op_t *o = &res->ops[i];
        int r = o->kind >= DEAR_SIM_FWD ? 0 : 1;
        double x = left + o->start * scale, w = (o->end - o->start) * scale;
        fprintf(out, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                     "stroke-width=\"0.3\"><title>%s %d: %.3f-%.3f ms",
                x, top + r * row + 4, w > 0.2 ? w : 0.2, row - 8, (unsigned)o->kind < SIM_NKINDS ? fill[o->kind] : "black", kind_name(o->kind), o->index,
                o->start * 1e3, o->end * 1e3);
        if (o->bytes)
            fprintf(out, ", %zu bytes", o->bytes);
        fprintf(out, "</title></rect>\n");
    }
    double xe = left + res->iter_s * scale;
    fprintf(out, "<line x1=\"%.2f\" y1=\"%.0f\" x2=\"%.2f\" y2=\"%.0f\" stroke=\"black\" stroke-dasharray=\"4\"/>\n",
            xe, top - 5, xe, top + 2 * row + 5);
    double ay = top + 2 * row + 20;
    fprintf(out, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", left, ay, W - right, ay);
    for (int k = 0; k <= 10; k++) {
        double tk = tmax * k / 10;
        fprintf(out, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.1f ms</text>\n", left + tk * scale, ay + 15,
                tk * 1e3);
    }
    double lx = left;
    for (int i = 0; i < SIM_NKINDS; i++) {
        int k = legend[i];
        fprintf(out, "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                     "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", lx, ay + 25, fill[k], lx + 16, ay + 36,
                kind_name(k));
        lx += 140;
    }
    fprintf(out, "</svg>\n");
    return ferror(out) ? DEAR_ERR_IO : DEAR_OK;
}
