/*
 * The cost model at commit: DEAR_CALIBRATE=auto measures reduce-scatter, all-gather and
 * all-reduce as the collectives layer will run them (its selection table) on the context's
 * private communicator, each also in the compressed formats the context's gradients travel in
 * (DEAR_COMPRESS, DEAR_COMPRESS_AG), unless DEAR_CALIBRATION_FILE already holds those curves for
 * this communicator size and ranks per host (what it lacks is measured and added).
 * Small collectives are also timed DEAR_MAX_INFLIGHT at a time, as the progress thread keeps them,
 * for the burst curve that prices a collective queued behind others, and large ones each alone
 * after an idle gap, for the idle curve that prices one starting on an idle link (fusion/cost.h).
 * DEAR_CALIBRATE=off takes DEAR_COST_PRESET. Rank 0 reads the cache and every rank receives the
 * model, so all plan from the same numbers. A corrupt cache is reported, kept as PATH.corrupt,
 * measured again and replaced. This runs before the progress thread starts: the communicator is
 * the application thread's alone.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/mpi_check.h"
#include "base/params.h"
#include "base/sched_table.h"
#include "base/stats.h"
#include "base/util.h"
#include "fusion/cost.h"
#include "runtime/rt.h"

/* Sizes from start-up dominated to bandwidth dominated; the largest sets the time per byte the
 * curve is extended with. Where the selection table changes algorithm between two of them, both
 * sides of the change are timed too (item_sizes): a curve drawn across the change would price
 * the sizes between by neither algorithm. Each size is timed as a stream of back-to-back
 * collectives of at least CALIB_STREAM_BYTES (and CALIB_REPS) after an untimed
 * CALIB_WARM_BYTES, because the runtime's channel runs them one behind the other and a
 * network's burst allowance flatters collectives timed alone. A stream gives the median time
 * per collective of the slowest rank's completions (dear_stream_median) and CALIB_PASSES passes
 * the median of theirs, because stalls only ever add time (docs/PERFORMANCE.md#calibration). */
static const size_t calib_bytes[] = { 8u << 10, 64u << 10, 256u << 10, 1u << 20, 2u << 20, 4u << 20, 8u << 20 };
#define CALIB_NSIZES ((int)(sizeof calib_bytes / sizeof calib_bytes[0]))
#define CALIB_MAX_SIZES DEAR_COST_MAXPTS /* with the sides of the algorithm changes */
#define CALIB_REPS 5
#define CALIB_STREAM_BYTES ((size_t)4 << 20)
#define CALIB_WARM_BYTES ((size_t)1 << 20)
#define CALIB_MAX_REPS 512
#define CALIB_PASSES 3
/* The idle curve's collectives timed per size and pass, each after the ranks lined up and the
 * link stayed idle DEAR_COST_IDLE_GAP_S. */
#define CALIB_IDLE_REPS 3
/* DEAR_MAX_INFLIGHT's bound, and the tags' span as the progress thread's (engine.c). */
#define CALIB_MAX_BURST 64
#define CALIB_TAG_SPAN 16384

static void log_model(const dear_ctx_t *ctx, const char *how)
{
    if (!DEAR_LOG_ON(DEAR_LOG_INFO) || ctx->cm.rank != 0) /* the same on every rank: printed once */
        return;
    DEAR_INFO("plan", "cost model (%s) for P=%d, %d rank(s) per host: %s", ctx->online.cost.source, ctx->online.cost.comm_size,
              ctx->online.cost.ranks_per_host, how);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
        for (int a = 0; a < DEAR_ALGO_COUNT + DEAR_COMPRESS_COUNT - 1; a++) {
            int fmt = a >= DEAR_ALGO_COUNT ? a - DEAR_ALGO_COUNT + 1 : 0;
            const dear_cost_line_t *l = fmt ? &ctx->online.cost.fmt[fmt][op] : &ctx->online.cost.line[op][a];
            if (!l->valid)
                continue;
            DEAR_INFO("plan", "  %s %s%s%s alpha %.2f us, beta %.4f ns/B (%.0f MB/s), gamma %.4f ns/B, fit error "
                              "%.1f%% over %d sample(s)%s%s",
                      dear_coll_op_short((dear_coll_op_t)op),
                      dear_coll_algo_name(fmt ? DEAR_ALGO_AUTO : (dear_coll_algo_t)a), fmt ? "+" : "",
                      fmt ? dear_compress_name((dear_compress_t)fmt) : "", 1e6 * l->alpha,
                      1e9 * l->beta, l->beta > 0 ? 1e-6 / l->beta : 0.0, 1e9 * l->gamma, 100 * l->fit_err,
                      l->nsamples, l->npts >= 2 ? "; priced by the curve through the samples" : "",
                      fmt ? " (bytes on the wire)" : "");
            for (int i = 0; i < l->npts; i++)
                DEAR_INFO("plan", "    %.0f B: %.1f us (%.0f MB/s)", l->pt_bytes[i], 1e6 * l->pt_sec[i],
                          l->pt_sec[i] > 0 ? 1e-6 * l->pt_bytes[i] / l->pt_sec[i] : 0.0);
        }
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        const dear_cost_line_t *l = dear_cost_idle(&ctx->online.cost, (dear_coll_op_t)op);
        for (int i = 0; l && i < l->npts; i++)
            DEAR_INFO("plan", "  %s auto@idle %.0f B: %.1f us alone on an idle link, x%.2f of back to back",
                      dear_coll_op_short((dear_coll_op_t)op), l->pt_bytes[i], 1e6 * l->pt_sec[i],
                      dear_cost_idle_factor(&ctx->online.cost, (dear_coll_op_t)op, l->pt_bytes[i]));
    }
}

static int reps_for(size_t bytes, size_t volume, int least)
{
    size_t r = (volume + bytes - 1) / bytes;
    return r < (size_t)least ? least : r > CALIB_MAX_REPS ? CALIB_MAX_REPS : (int)r;
}

/* The timed collectives of a stream of this size, k in flight. */
static int stream_reps(size_t bytes, int k)
{
    return reps_for(bytes, CALIB_STREAM_BYTES, CALIB_REPS * k);
}

/* A collective abandoned in flight: its receives cancelled; it is left allocated with its buffer,
 * since a message that had matched may still land (the communicator is kept, cm.keep). */
static void cancel_one(dear_net_req_t *q, void *arg)
{
    (void)arg;
    dear_net_cancel(q);
}

/* Wait for whichever of req[0..*nin) finishes first, until wait_s (0: no bound) has passed
 * without one, and free it; its time is appended to done[*ndone] when done is given (the timed
 * stream). */
static int reap_one(dear_coll_req_t **req, int *nin, double *done, int *ndone, double wait_s)
{
    int w = 0, rc = dear_coll_waitany_until(req, *nin, &w, wait_s > 0 ? dear_now() + wait_s : INFINITY);
    if (rc == DEAR_OK) {
        dear_coll_free(req[w]);
        req[w] = req[--*nin];
        if (done)
            done[(*ndone)++] = dear_now();
    }
    return rc;
}

/* One (collective, size) sample, the ranks lined up by the agreement that ended the last: an
 * untimed stream fills the pipes and drains any burst allowance, then a timed stream of
 * collectives, up to k in flight as the progress thread keeps them (k = 1: back to back), whose
 * completions, in seconds from the stream's start, go to done[0..stream_reps()). The i-th runs on
 * the i % k-th slice of count elements of recvbuf, with the tag the progress thread would give it.
 * DEAR_ERR_UNSUPPORTED from start (size limits) is returned without logging: the same on every
 * rank, it only means the size is skipped. DEAR_ERR_TIMEOUT when no collective finished within
 * wait_s (0: no bound). inject: abandon the stream halfway (DEAR_DEBUG_CALIB_FAIL). *parked is
 * set when a failure left collectives in flight: recvbuf must then never be freed. */
static int time_burst(dear_ctx_t *ctx, dear_coll_args_t *args, size_t bytes, int k, double wait_s, int inject,
                      double *done, int *parked)
{
    int warm = reps_for(bytes, CALIB_WARM_BYTES, k), reps = stream_reps(bytes, k);
    dear_coll_req_t *req[CALIB_MAX_BURST];
    int nin = 0, rc = DEAR_OK, ndone = 0;
    dear_coll_args_t a = *args;
    double t0 = 0, *timed = NULL;
    for (int r = -warm; r < reps && rc == DEAR_OK; r++) {
        if (r == 0) { /* the timed stream starts on an empty channel: the warm-up drained, untimed */
            while (nin > 0 && rc == DEAR_OK)
                rc = reap_one(req, &nin, NULL, NULL, wait_s);
            t0 = dear_now();
            timed = done;
        }
        if (rc == DEAR_OK && nin == k)
            rc = reap_one(req, &nin, timed, &ndone, wait_s);
        if (rc != DEAR_OK)
            break;
        a.tag = (r + warm) % CALIB_TAG_SPAN;
        a.recvbuf = (char *)args->recvbuf + (size_t)((r + warm) % k) * bytes;
        rc = dear_coll_start(&a, &req[nin]);
        nin += rc == DEAR_OK;
        if (rc == DEAR_OK && inject && r == reps / 2) {
            DEAR_ERROR("plan", "calibration: DEAR_DEBUG_CALIB_FAIL: this rank abandons its stream halfway, %d "
                               "collective(s) in flight",
                       nin);
            rc = DEAR_ERR_NET;
        }
    }
    while (nin > 0 && rc == DEAR_OK)
        rc = reap_one(req, &nin, timed, &ndone, wait_s);
    if (rc != DEAR_OK) {
        if (rc != DEAR_ERR_UNSUPPORTED || nin > 0)
            ctx->cm.keep = 1; /* a peer's messages of it may be left unmatched */
        for (int i = 0; i < nin; i++)
            dear_coll_each_req(req[i], cancel_one, NULL);
        *parked = nin > 0;
        return rc;
    }
    for (int i = 0; i < ndone; i++)
        done[i] -= t0;
    return DEAR_OK;
}

/* One collective of the idle curve: the link left idle DEAR_COST_IDLE_GAP_S after the agreement
 * that lined the ranks up, then one collective alone, its duration on this rank to *done. The
 * rest as time_burst. */
static int time_idle(dear_ctx_t *ctx, dear_coll_args_t *args, double wait_s, int inject, double *done, int *parked)
{
    dear_coll_req_t *req;
    int nin = 0, ndone = 0;
    dear_sleep(DEAR_COST_IDLE_GAP_S);
    double t0 = dear_now();
    int rc = dear_coll_start(args, &req);
    nin = rc == DEAR_OK;
    if (rc == DEAR_OK && inject) {
        DEAR_ERROR("plan", "calibration: DEAR_DEBUG_CALIB_FAIL: this rank abandons its collective alone, in flight");
        rc = DEAR_ERR_NET;
    }
    if (rc == DEAR_OK)
        rc = reap_one(&req, &nin, done, &ndone, wait_s);
    if (rc != DEAR_OK) {
        if (rc != DEAR_ERR_UNSUPPORTED || nin > 0)
            ctx->cm.keep = 1;
        if (nin > 0)
            dear_coll_each_req(req, cancel_one, NULL);
        *parked = nin > 0;
        return rc;
    }
    *done -= t0;
    return DEAR_OK;
}

/* Measure each collective as the runtime will run it (DEAR_ALGO_AUTO: the selection table, or
 * the algorithm DEAR_COLL_ALGO forces) at every calibration size, and keep the median pass's
 * means as the auto curve of the model; the model is the same on every rank (rank 0 takes the
 * slowest rank's samples and broadcasts). A straight line per algorithm, as the model had before, priced
 * buckets of 2-25 MiB from a fit dominated by the small sizes (off by 20-50% on a 1 Gbit/s
 * link) and with algorithms the selection table never runs there. */
/* The collectives the schedule runs, the only ones worth measuring without a cache file:
 * reduce-scatter and all-gather when buckets are split in two phases (dear), else all-reduce. */
static int op_needed(const dear_ctx_t *ctx, int op)
{
    int split = (dear_sched_flags(ctx->cfg.sched) & DEAR_SCHED_F_SPLIT) != 0;
    return op == DEAR_COLL_ALLREDUCE ? !split : split;
}

/* One curve of the model: a collective on float32 vectors travelling in format fmt (none: the
 * auto line, else the format's curve, by wire bytes). */
typedef struct {
    int op, fmt;
    int k;      /* >= 2: the burst curve of k in flight (float32); CALIB_IDLE: the idle curve; else 0 */
    int nsizes; /* the sizes timed, increasing (item_sizes) */
    size_t bytes[CALIB_MAX_SIZES];
} calib_item_t;
#define CALIB_MAX_ITEMS (4 * DEAR_COLL_OP_COUNT)
#define CALIB_IDLE (-1)

/* How many of its collectives the item's streams keep in flight. */
static int item_inflight(calib_item_t it) { return it.k > 0 ? it.k : 1; }

static dear_cost_line_t *item_line(dear_cost_model_t *m, calib_item_t it)
{
    if (it.k == CALIB_IDLE)
        return &m->idle[it.op];
    if (it.k)
        return m->burst_k == it.k ? &m->burst[it.op] : NULL;
    return it.fmt ? &m->fmt[it.fmt][it.op] : &m->line[it.op][DEAR_ALGO_AUTO];
}

static void item_add(calib_item_t *its, int *n, int op, int fmt, int k)
{
    for (int i = 0; i < *n; i++)
        if (its[i].op == op && its[i].fmt == fmt && its[i].k == k)
            return;
    its[(*n)++] = (calib_item_t){ .op = op, .fmt = fmt, .k = k };
}

/* Rank 0's DEAR_MAX_INFLIGHT and DEAR_INFLIGHT_BYTES: what the bursts are measured with, the
 * same on every rank (as the cache is rank 0's) whatever the others' environments say. */
typedef struct {
    long long k, window;
} calib_burst_t;

/* Whether a size is measured for a burst of k (0: alone, always): only where the runtime keeps k
 * of that size in flight (k of them within DEAR_INFLIGHT_BYTES) and they fit the buffer. */
static int burst_size(const calib_burst_t *b, int k, size_t bytes, size_t maxb)
{
    size_t kb = (size_t)k * bytes;
    return k == 0 || (kb <= maxb && (b->window == 0 || kb <= (size_t)b->window));
}

/* The burst the runtime runs, when at least two calibration sizes have it (a curve needs two
 * points), else 0: then queued collectives are priced as alone. */
static int burst_k(const calib_burst_t *b)
{
    int k = (int)b->k, n = 0;
    if (k < 2 || k > CALIB_MAX_BURST)
        return 0;
    for (int s = 0; s < CALIB_NSIZES; s++)
        n += burst_size(b, k, calib_bytes[s], calib_bytes[CALIB_NSIZES - 1]);
    return n >= 2 ? k : 0;
}

/* The curves the plans of this context are priced with (complete: every schedule's): each
 * collective the schedule runs, and its compressed formats as the simulator prices them: each
 * phase in its own, an all-reduce whole when both halves travel alike, else as its two halves. */
static int items_needed(const dear_ctx_t *ctx, const calib_burst_t *burst, int complete, calib_item_t *its)
{
    dear_compress_t rs, ag;
    int n = 0;
    dear_compress_formats(ctx, &rs, &ag);
    int split = (dear_sched_flags(ctx->cfg.sched) & DEAR_SCHED_F_SPLIT) != 0;
    int k = burst_k(burst);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
        if (complete || op_needed(ctx, op)) {
            item_add(its, &n, op, DEAR_COMPRESS_NONE, 0);
            if (k)
                item_add(its, &n, op, DEAR_COMPRESS_NONE, k);
            /* Only across hosts: within one, nothing shapes the link an idle gap would refill, and
             * the lone collectives would only lengthen every commit. */
            if (ctx->cm.topo.nnodes > 1)
                item_add(its, &n, op, DEAR_COMPRESS_NONE, CALIB_IDLE);
        }
    /* Sparse runs are priced alone, by wire bytes in float32's curve (sim.c): no burst, no idle. */
    if (dear_sparse_any(ctx)) {
        item_add(its, &n, DEAR_COLL_REDUCE_SCATTER, DEAR_COMPRESS_NONE, 0);
        item_add(its, &n, DEAR_COLL_ALLGATHER, DEAR_COMPRESS_NONE, 0);
    }
    if (rs == DEAR_COMPRESS_NONE && ag == DEAR_COMPRESS_NONE)
        return n;
    if (split || complete || rs != ag) {
        item_add(its, &n, DEAR_COLL_REDUCE_SCATTER, rs, 0);
        item_add(its, &n, DEAR_COLL_ALLGATHER, ag, 0);
    }
    if ((!split || complete) && rs == ag)
        item_add(its, &n, DEAR_COLL_ALLREDUCE, rs, 0);
    return n;
}

/* The algorithm a float32 size of item it runs on this context's communicator over net. */
static dear_coll_algo_t item_algo(const dear_ctx_t *ctx, const dear_net_t *net, calib_item_t it, size_t bytes)
{
    return dear_coll_algo_for((dear_coll_op_t)it.op, bytes / sizeof(float), (dear_compress_t)it.fmt, ctx->cm.size,
                              ctx->cm.coll_topo, net);
}

/* it->bytes: the calibration sizes, and where the algorithm changes between two of them, the
 * last size before the change and the first after it (whole floats, found by bisection; the
 * table's choice changes at thresholds, so each run of one algorithm is an interval). A
 * transport running its own collectives (NCCL) runs native at every size: the sizes alone. */
static void item_sizes(const dear_ctx_t *ctx, const dear_net_t *net, calib_item_t *it)
{
    const size_t f = sizeof(float);
    int n = 0;
    for (int s = 0; s < CALIB_NSIZES; s++) {
        size_t lo = s > 0 ? calib_bytes[s - 1] : 0, hi = calib_bytes[s];
        /* Each change of algorithm in (lo, hi): its two sides, while room is left for the sizes. */
        while (s > 0 && n + 2 + (CALIB_NSIZES - s) <= CALIB_MAX_SIZES) {
            dear_coll_algo_t a = item_algo(ctx, net, *it, lo);
            if (a == item_algo(ctx, net, *it, hi))
                break;
            size_t last = lo, first = hi; /* last runs a, first does not */
            while (first - last > f) {
                size_t mid = last + (first - last) / f / 2 * f;
                *(item_algo(ctx, net, *it, mid) == a ? &last : &first) = mid;
            }
            if (last != lo)
                it->bytes[n++] = last;
            if (first == hi)
                break;
            it->bytes[n++] = lo = first;
        }
        it->bytes[n++] = hi;
    }
    /* The idle curve from DEAR_COST_IDLE_MIN_BYTES: below, the lone collective's time would be the
     * network's burst allowance (fusion/cost.h). */
    int keep = 0;
    for (int s = 0; s < n; s++)
        if (it->k != CALIB_IDLE || it->bytes[s] >= DEAR_COST_IDLE_MIN_BYTES)
            it->bytes[keep++] = it->bytes[s];
    it->nsizes = keep;
}

/* After one sample (a stream, or a collective of the idle curve) that ended with r1 on this rank:
 * every rank learns how the others' ended before the next starts (this also lines them up for
 * it): a rank whose sample broke halfway must not leave the others waiting in the next one, nor
 * in a collective it never joins. Returns the failure (negative, logged), 1 when the size is
 * beyond the algorithm (the same on every rank), else 0. */
static int sample_agree(dear_ctx_t *ctx, int r1, int op, int fmt_id, size_t bytes, double wait_s)
{
    const char *what = dear_coll_op_short((dear_coll_op_t)op);
    const char *fmt = dear_compress_name((dear_compress_t)fmt_id);
    if (r1 == DEAR_ERR_TIMEOUT)
        DEAR_ERROR("plan", "calibration: %s (%s) on %zu bytes: no collective finished in %g s "
                           "(DEAR_STALL_ABORT_S): a rank probably failed in this stream (its message says why)",
                   what, fmt, bytes, wait_s);
    else if (r1 != DEAR_OK && r1 != DEAR_ERR_UNSUPPORTED)
        DEAR_ERROR("plan", "calibration: %s (%s) on %zu bytes failed: %s", what, fmt, bytes, dear_status_string(r1));
    int mine = r1 == DEAR_ERR_UNSUPPORTED ? 1 : r1, agreed = 0;
    DEAR_MPI_CHECK(MPI_Allreduce(&mine, &agreed, 1, MPI_INT, MPI_MIN, ctx->cm.comm));
    if (agreed < 0) {
        if (mine >= 0)
            DEAR_ERROR("plan", "calibration: %s (%s) on %zu bytes failed on another rank (its message says why): %s",
                       what, fmt, bytes, dear_status_string(agreed));
        return mine < 0 ? mine : agreed;
    }
    return agreed;
}

/* Measure the curves its[0..nits), each at its item_sizes, into ctx->online.cost (rank 0
 * assembles, everyone receives); the curves it already holds (loaded from the cache) are kept. */
static int calibrate(dear_ctx_t *ctx, const calib_burst_t *burst, calib_item_t *its, int nits)
{
    int rc = DEAR_OK, parked = 0;
    size_t maxb = calib_bytes[CALIB_NSIZES - 1];
    float *buf = NULL;
    double *t = NULL, *tmax = NULL, *c = NULL, *cmax = NULL;
    size_t nk = (size_t)nits * CALIB_MAX_SIZES, nt = nk * CALIB_PASSES; /* t[pass * nk + k] */
    size_t nc = nt * CALIB_MAX_REPS; /* sample k's completions: c[k * CALIB_MAX_REPS + i] */
    double t_start = dear_now();
    dear_net_t *net = dear_rt_work_net(ctx);
    int nsizes = 0;
    for (int i = 0; i < nits; i++) {
        item_sizes(ctx, net, &its[i]);
        nsizes += its[i].nsizes;
    }

    /* The buffers the gradients' collectives run on: device memory under NCCL, else host. */
    const dear_mem_ops_t *mo = dear_rt_work_ops(ctx);
    DEAR_CHECK_GOTO(mo->alloc(maxb, 0, (void **)&buf), rc, agree);
    DEAR_ALLOC_GOTO(t, calloc(nt, sizeof *t), nt * sizeof *t, rc, agree);
    DEAR_ALLOC_GOTO(tmax, calloc(nt, sizeof *tmax), nt * sizeof *tmax, rc, agree);
    DEAR_ALLOC_GOTO(c, calloc(nc, sizeof *c), nc * sizeof *c, rc, agree);
    if (ctx->cm.rank == 0)
        DEAR_ALLOC_GOTO(cmax, calloc(nc, sizeof *cmax), nc * sizeof *cmax, rc, agree);
    rc = mo->zero(NULL, buf, maxb); /* values stay 0 */
agree:;
    /* Agreed before the first collective: a rank that could not set up alone would leave the
     * others waiting for it in time_burst's barrier, and itself in dear_cost_setup's agreement. */
    int any = rc != DEAR_OK, all = 0;
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, ctx->cm.comm), rc, out);
    if (all) {
        if (rc == DEAR_OK) {
            DEAR_ERROR("plan", "calibration: another rank could not set up its buffers; see its message");
            rc = DEAR_ERR_NOMEM;
        }
        goto out;
    }
    /* A collective of calibration pending DEAR_STALL_ABORT_S fails the stream: a rank whose stream
     * broke halfway left it unmatched. DEAR_DEBUG_CALIB_FAIL (tests) breaks one on purpose. */
    double wait_s = ctx->cfg.stall_abort_s;
    long long inject_at = dear_param_int(DEAR_P_DEBUG_CALIB_FAIL), nstream = 0;
    for (int pass = 0; pass < CALIB_PASSES; pass++)
        for (int i = 0; i < nits; i++)
            for (int s = 0; s < its[i].nsizes; s++) {
                int op = its[i].op;
                size_t bytes = its[i].bytes[s];
                dear_coll_args_t args = { 0 };
                args.op = (dear_coll_op_t)op;
                args.algo = DEAR_ALGO_AUTO;
                args.dtype = DEAR_FLOAT32;
                args.compress = args.compress_ag = (dear_compress_t)its[i].fmt; /* no error feedback */
                args.comm = ctx->cm.comm;
                args.net = net;
                args.mem = mo;
                args.topo = ctx->cm.coll_topo;
                args.tag = 0; /* nothing else runs on the communicator before commit ends */
                args.scale = op == DEAR_COLL_ALLGATHER ? 1.0 : 1.0 / ctx->cm.size;
                args.recvbuf = buf;
                size_t k = (size_t)pass * nk + (size_t)i * CALIB_MAX_SIZES + (size_t)s;
                if (!burst_size(burst, its[i].k > 0 ? its[i].k : 0, bytes, maxb)) {
                    t[k] = -1; /* the runtime never has k of this size in flight: no sample */
                    continue;
                }
                args.count = bytes / sizeof(float);
                int idle = its[i].k == CALIB_IDLE;
                for (int rep = 0; rep < (idle ? CALIB_IDLE_REPS : 1); rep++) {
                    int inject = ++nstream == inject_at;
                    int r1 = idle ? time_idle(ctx, &args, wait_s, inject, &c[k * CALIB_MAX_REPS + rep], &parked)
                                  : time_burst(ctx, &args, bytes, item_inflight(its[i]), wait_s, inject,
                                               &c[k * CALIB_MAX_REPS], &parked);
                    int agreed = sample_agree(ctx, r1, op, its[i].fmt, bytes, wait_s);
                    if (agreed < 0) {
                        rc = agreed;
                        goto out;
                    }
                    if (agreed == 1) {
                        t[k] = -1; /* this size is beyond the algorithm: no sample */
                        break;
                    }
                }
            }
    DEAR_MPI_CHECK_GOTO(MPI_Reduce(t, tmax, (int)nt, MPI_DOUBLE, MPI_MAX, 0, ctx->cm.comm), rc, out);
    /* The slowest rank's completions: the stream as the channel runs it, whichever rank lags. */
    DEAR_MPI_CHECK_GOTO(MPI_Reduce(c, cmax, (int)nc, MPI_DOUBLE, MPI_MAX, 0, ctx->cm.comm), rc, out);
    if (ctx->cm.rank == 0) {
        dear_cost_model_t *m = &ctx->online.cost;
        m->comm_size = ctx->cm.size;
        m->ranks_per_host = ctx->cm.topo.max_local_size;
        snprintf(m->source, sizeof m->source, "fit");
        for (int i = 0; i < nits; i++) {
            int op = its[i].op, kin = item_inflight(its[i]);
            double xs[CALIB_MAX_SIZES], ys[CALIB_MAX_SIZES];
            int n = 0;
            for (int s = 0; s < its[i].nsizes; s++) {
                size_t bytes = its[i].bytes[s];
                double pv[CALIB_PASSES], lo = INFINITY, hi = 0;
                for (int pass = 0; pass < CALIB_PASSES; pass++) {
                    size_t k = (size_t)pass * nk + (size_t)i * CALIB_MAX_SIZES + (size_t)s;
                    pv[pass] = tmax[k] < 0                ? -1 /* no sample */
                               : its[i].k == CALIB_IDLE ? dear_median(&cmax[k * CALIB_MAX_REPS], CALIB_IDLE_REPS)
                                                        : dear_stream_median(&cmax[k * CALIB_MAX_REPS],
                                                                             (size_t)stream_reps(bytes, kin), kin, 0);
                    lo = pv[pass] < lo ? pv[pass] : lo;
                    hi = pv[pass] > hi ? pv[pass] : hi;
                }
                if (pv[0] < 0) /* beyond the algorithm, in every pass alike */
                    continue;
                double v = dear_median(pv, CALIB_PASSES);
                /* A format's curve is by the bytes on the wire, which is how the simulator asks. */
                xs[n] = (double)bytes * dear_compress_ratio((dear_compress_t)its[i].fmt);
                ys[n++] = v;
                if (its[i].k == CALIB_IDLE)
                    DEAR_DEBUG("plan", "calibration: %s %zu B: %.1f us alone on a link idle %g ms, the median of %d "
                                       "(slowest rank, median of %d passes, %.1f..%.1f us)",
                               dear_coll_op_short((dear_coll_op_t)op), bytes, 1e6 * v, 1e3 * DEAR_COST_IDLE_GAP_S,
                               CALIB_IDLE_REPS, CALIB_PASSES, 1e6 * lo, 1e6 * hi);
                else
                    DEAR_DEBUG("plan", "calibration: %s (%s) %zu B: %.1f us per collective, the median over a "
                                       "stream of %d, %d in flight (slowest rank, median of %d passes, %.1f..%.1f us)",
                               dear_coll_op_short((dear_coll_op_t)op), dear_compress_name((dear_compress_t)its[i].fmt),
                               bytes, 1e6 * v, stream_reps(bytes, kin), kin, CALIB_PASSES, 1e6 * lo, 1e6 * hi);
            }
            if (its[i].k > 0)
                m->burst_k = its[i].k; /* the loaded model has no other (dear_cost_load_ex) */
            if (n < 2 || dear_cost_fit_curve(xs, ys, n, item_line(m, its[i])) != DEAR_OK) {
                if (its[i].k == CALIB_IDLE)
                    DEAR_WARN("plan", "calibration: %d usable size(s) of %s alone, no idle curve: one starting on "
                                      "an idle link priced back to back",
                              n, dear_coll_op_short((dear_coll_op_t)op));
                else if (its[i].k)
                    DEAR_WARN("plan", "calibration: %d usable size(s) of %s with %d in flight, no burst curve: "
                                      "queued collectives priced as alone",
                              n, dear_coll_op_short((dear_coll_op_t)op), its[i].k);
                else if (its[i].fmt)
                    DEAR_WARN("plan", "calibration: %d usable size(s) of %s in %s, no curve: priced by its wire "
                                      "bytes alone", n, dear_coll_op_short((dear_coll_op_t)op),
                              dear_compress_name((dear_compress_t)its[i].fmt));
                else
                    DEAR_WARN("plan", "calibration: %d usable size(s) of %s, no curve: that collective is priced "
                                      "as infinitely expensive",
                              n, dear_coll_op_short((dear_coll_op_t)op));
            }
        }
    }
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&ctx->online.cost, (int)sizeof ctx->online.cost, MPI_BYTE, 0, ctx->cm.comm), rc, out);
    ctx->online.calib_measured++;
    DEAR_INFO("plan", "calibration: measured %d curve(s), %d size(s) in all, each as a stream of at least %zu "
                      "bytes, median of %d passes, in %.3f s",
              nits, nsizes, CALIB_STREAM_BYTES, CALIB_PASSES, dear_now() - t_start);
out:
    if (buf && !parked)
        dear_rt_work_ops(ctx)->release(buf, 0);
    free(t);
    free(tmax);
    free(c);
    free(cmax);
    return rc;
}

/* The curves of its[0..n) that m lacks, moved to the front; returns their number. */
static int items_missing(dear_cost_model_t *m, calib_item_t *its, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        const dear_cost_line_t *l = item_line(m, its[i]);
        if (!l || !l->valid)
            its[k++] = its[i];
    }
    return k;
}

/* DEAR_CALIBRATE=auto: the cache (rank 0 reads, everyone receives), else a measurement. */
static int cost_calibrated(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    const char *path = dear_param_string(DEAR_P_CALIBRATION_FILE);
    /* Rank 0's setting decides for every rank: the cache is rank 0's file, which the other ranks
     * may not even name, and the collectives measured must be the same on all. */
    int use_file = path && path[0];
    /* rank 0's: 1 cache hit, 0 measure, 2 measure and replace a corrupt file, -1 refused (the path
     * names a link, a device, a FIFO...: it must be neither read nor replaced) */
    int verdict = 0;
    if (ctx->cm.rank == 0 && use_file &&
        dear_file_check_target(path, "calibration file (DEAR_CALIBRATION_FILE)") != DEAR_OK) {
        verdict = -1;
    } else if (ctx->cm.rank == 0 && use_file) {
        dear_cost_model_t m;
        int found = 0;
        int lrc = dear_cost_load_ex(path, ctx->cm.size, ctx->cm.topo.max_local_size, ctx->cfg.max_inflight, &m,
                                    &found);
        if (lrc == DEAR_ERR_FORMAT) {
            DEAR_WARN("plan", "DEAR_CALIBRATION_FILE=%s is corrupt (the error above names the line): measuring "
                              "again; the file is kept as %s.corrupt and a new one is written",
                      path, path);
            verdict = 2;
        } else if (lrc != DEAR_OK) {
            DEAR_WARN("plan", "DEAR_CALIBRATION_FILE=%s cannot be read (%s): measuring again", path,
                      dear_status_string(lrc));
        } else if (found > 0) {
            ctx->online.cost = m; /* what it lacks is measured below */
            verdict = 1;
        }
    }
    long long decided[4] = { verdict, use_file, ctx->cfg.max_inflight, (long long)ctx->cfg.inflight_window };
    DEAR_MPI_CHECK(MPI_Bcast(decided, 4, MPI_LONG_LONG, 0, ctx->cm.comm));
    verdict = (int)decided[0];
    use_file = (int)decided[1];
    calib_burst_t burst = { decided[2], decided[3] };
    if (verdict == -1) {
        if (ctx->cm.rank != 0)
            DEAR_ERROR("plan", "rank 0 refused DEAR_CALIBRATION_FILE (its message says why)");
        return DEAR_ERR_IO;
    }
    /* Every rank needs the loaded curves to agree on what is still to measure. */
    if (verdict == 1)
        DEAR_MPI_CHECK(MPI_Bcast(&ctx->online.cost, (int)sizeof ctx->online.cost, MPI_BYTE, 0, ctx->cm.comm));
    else
        memset(&ctx->online.cost, 0, sizeof ctx->online.cost);
    calib_item_t its[CALIB_MAX_ITEMS];
    int nits = items_missing(&ctx->online.cost, its, items_needed(ctx, &burst, use_file, its));
    if (verdict == 1 && nits == 0) {
        log_model(ctx, "loaded from the calibration cache, nothing measured");
        return DEAR_OK;
    }
    DEAR_CHECK(calibrate(ctx, &burst, its, nits));
    log_model(ctx, verdict == 1 ? "loaded from the calibration cache, the curves it lacked measured at commit"
                                : "measured at commit");
    if (ctx->cm.rank == 0 && use_file) {
        if (verdict == 2) {
            char bad[4200];
            snprintf(bad, sizeof bad, "%s.corrupt", path);
            if (rename(path, bad) != 0)
                DEAR_WARN("plan", "cannot move the corrupt %s aside to %s", path, bad);
        }
        rc = dear_cost_save(path, &ctx->online.cost);
        if (rc != DEAR_OK)
            DEAR_WARN("plan", "DEAR_CALIBRATION_FILE=%s: cannot save the fitted model (%s); the next run measures "
                              "again",
                      path, dear_status_string(rc));
    }
    return DEAR_OK;
}

int dear_cost_setup(dear_ctx_t *ctx, int calibrate_on)
{
    int rc;
    if (calibrate_on) {
        rc = cost_calibrated(ctx);
    } else {
        char name[32];
        if (ctx->cm.rank == 0)
            snprintf(name, sizeof name, "%s", dear_param_string(DEAR_P_COST_PRESET));
        DEAR_MPI_CHECK(MPI_Bcast(name, (int)sizeof name, MPI_CHAR, 0, ctx->cm.comm));
        rc = dear_cost_preset(name, ctx->cm.size, ctx->cm.topo.max_local_size, &ctx->online.cost);
        if (rc == DEAR_OK)
            log_model(ctx, "DEAR_CALIBRATE=off, from DEAR_COST_PRESET");
    }
    /* Every rank computed or received the same model; a failure on one is a failure on all. */
    int any = rc != DEAR_OK, all = 0;
    DEAR_MPI_CHECK(MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, ctx->cm.comm));
    if (all && rc == DEAR_OK) {
        DEAR_ERROR("plan", "dear_commit: another rank could not build the cost model; see its message");
        rc = DEAR_ERR_INTERNAL;
    }
    return rc;
}
