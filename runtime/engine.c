/*
 * The progress thread: the only caller of MPI after commit, on the context's private
 * communicator. Operations have fixed places in each iteration (pos) and therefore a global
 * sequence number seq = iteration * nops + pos; they start strictly in seq order on every rank,
 * which is what lets collectives run without any per-iteration negotiation. An operation starts
 * once it is queued, its dependencies (the reduce-scatters an all-gather reads) are done and
 * fewer than DEAR_MAX_INFLIGHT are in flight; the sequence number gives its tag.
 *
 * Never a busy spin: with nothing in flight the thread sleeps on a condition variable. With
 * collectives in flight and no progress, on a transport that can sleep (the socket fabric's
 * epoll) it blocks in it until a message can move or an operation is queued; on one that moves
 * only when polled (MPI) it yields a
 * few times, then waits on the condition with a timeout growing from 20 us to 100 us (50 us
 * while the application thread is blocked on a collective; a newly queued operation or a new
 * waiter wakes it at once). It also
 * watches for stalls (DEAR_STALL_WARN_S, DEAR_STALL_ABORT_S) and records each collective in the
 * timeline and the counters.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/check.h"
#include "base/sync.h"
#include "runtime/rt.h"
#include "base/util.h"

#define YIELDS_BEFORE_SLEEP 8
#define SLEEP_MIN_S 20e-6
/* While the application computes, sleeps grow to SLEEP_MAX_S and leave it the cores; longer
 * sleeps idle the link between the steps of a collective (docs/PERFORMANCE.md#progress-sleeps). */
#define SLEEP_MAX_S 100e-6
/* While the application thread waits on a collective the progress thread is the critical path:
 * MPI's pipelined transfers need a progress call per fragment, so sleeps stop growing here. */
#define SLEEP_URGENT_MAX_S 50e-6
/* With only queued (not startable) work the thread still looks at the clock for stalls. */
#define STALL_POLL_S 0.25
#define WAIT_YIELDS 4
#define TAG_SPAN 16384

static const char *phase_name(dear_coll_op_t k)
{
    return k == DEAR_COLL_REDUCE_SCATTER ? "reduce-scatter" : k == DEAR_COLL_ALLGATHER ? "all-gather" : "all-reduce";
}

static void timed_wait(dear_ctx_t *ctx, double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(seconds * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    dear_timedwait(&ctx->eng.work_cv, &ctx->eng.lock, &ts);
}

/* The transport every running collective travels on when it can sleep until they move, or
 * NULL when one needs polling. */
static dear_transport_t *blocking_transport(const dear_ctx_t *ctx)
{
    if (!dear_transport_can_block(ctx->cm.tp))
        return NULL;
    for (const dear_run_t *r = ctx->eng.pt.running; r; r = r->next)
        if (dear_coll_transport(r->req) != ctx->cm.tp)
            return NULL;
    return ctx->cm.tp;
}

/* A collective its transport runs on the communication queue (NCCL): ordered there against
 * the copies around it and the collectives before it, so the GPU, not this thread, waits. */
static int on_queue(const dear_op_t *op)
{
    return op->args.net != NULL && op->args.net->tp->ops->coll_start != NULL;
}

/* Under the lock: the next operation to prepare (in seq order, as soon as it is queued). */
static dear_op_t *preparable(dear_ctx_t *ctx)
{
    long long iter = ctx->eng.pt.next_prep / ctx->graph.nops;
    dear_op_t *op = ctx->graph.ops[ctx->eng.pt.next_prep % ctx->graph.nops];
    if (op->sh.state != DEAR_OP_QUEUED || op->sh.iter != iter)
        return NULL;
    /* What prepares itself after its dependencies (the norm, behind the squares of every shard)
     * waits for them; the rest never holds back the packing of the buckets behind it. */
    for (int d = 0; op->prepare && d < op->ndeps; d++)
        if (op->deps[d]->sh.done_iter != iter)
            return NULL;
    return op;
}

/* Under the lock: the next operation in seq order if it may start now. One whose buffer the
 * memory's queues still fill (its start fence) sets fence_wait: the thread then polls. */
static dear_op_t *startable(dear_ctx_t *ctx)
{
    ctx->eng.pt.fence_wait = 0;
    long long iter = ctx->eng.pt.next_seq / ctx->graph.nops;
    dear_op_t *op = ctx->graph.ops[ctx->eng.pt.next_seq % ctx->graph.nops];
    if (op->sh.state != DEAR_OP_QUEUED || op->sh.iter != iter || op->pt.prep_iter != iter)
        return NULL;
    int q = on_queue(op);
    if (!q && ctx->eng.pt.nhost >= ctx->cfg.max_inflight)
        return NULL;
    /* Large collectives go one at a time (DEAR_INFLIGHT_BYTES): sharing the links, they would
     * all finish late, the first one needed included, which is what the planner's simulator
     * (one collective at a time) and the schedule's priorities assume does not happen. On the
     * communication queue they run one at a time anyway. */
    if (!q && ctx->eng.pt.nhost > 0 && ctx->cfg.inflight_window > 0 &&
        ctx->eng.pt.inflight_bytes + op->bytes > ctx->cfg.inflight_window)
        return NULL;
    /* A dependency on the same queue only needs to be enqueued there before it. */
    for (int d = 0; d < op->ndeps; d++) {
        const dear_op_t *dep = op->deps[d];
        if (dep->sh.done_iter != iter && !(q && on_queue(dep) && dep->sh.launch_iter == iter))
            return NULL;
    }
    if (op->pt.start_fence) {
        int done = 1, rc = dear_fence_done(ctx->mem.ops, op->pt.start_fence, &done);
        if (rc != DEAR_OK && ctx->eng.sh.rc == DEAR_OK)
            ctx->eng.sh.rc = rc; /* the row logged it; the loop stops on it */
        if (rc != DEAR_OK || !done) {
            ctx->eng.pt.fence_wait = rc == DEAR_OK;
            return NULL;
        }
        op->pt.start_fence = NULL;
    }
    return op;
}

/* One pending collective's age against the stall limits: a warning past DEAR_STALL_WARN_S (once),
 * the job aborted past DEAR_STALL_ABORT_S. */
/* "waiting for messages from ranks 1, 3" (the ranks this rank's collectives have receives
 * outstanding from), or what else it waits for, into buf. */
static const char *waited_for(const dear_ctx_t *ctx, const dear_op_t *op, int running, char *buf, size_t len)
{
    if (running && on_queue(op))
        return "in flight inside the device transport (NCCL), which does not say which rank it waits for";
    unsigned char *flags = calloc((size_t)ctx->cm.size, 1);
    if (flags == NULL)
        return "in flight";
    dear_net_waiting(ctx->cm.net, ctx->cm.comm, flags);
    if (ctx->cm.coll_topo)
        for (int i = 0; i < 2; i++) {
            dear_net_waiting(ctx->cm.coll_topo->node_net[i], ctx->cm.comm, flags);
            dear_net_waiting(ctx->cm.coll_topo->cross_net[i], ctx->cm.comm, flags);
        }
    /* A queued operation waits for those in flight, so for what they wait for. */
    size_t n = (size_t)snprintf(buf, len, "%s, waiting for messages from rank(s)",
                                running ? "in flight" : "queued behind the operations in flight");
    int any = 0;
    for (int r = 0; r < ctx->cm.size && n < len; r++)
        if (flags[r]) {
            n += (size_t)snprintf(buf + n, len - n, "%s %d", any ? "," : "", r);
            any = 1;
        }
    free(flags);
    if (!any)
        snprintf(buf, len, "%s", running ? "in flight (its sends not yet taken by their peers)"
                                         : "queued, waiting for earlier operations");
    return buf;
}

static void stall_one(dear_ctx_t *ctx, const dear_op_t *op, long long iter, double age, int running, int *warned)
{
    int due = (ctx->cfg.stall_abort_s > 0 && age > ctx->cfg.stall_abort_s) ||
              (ctx->cfg.stall_warn_s > 0 && age > ctx->cfg.stall_warn_s && !*warned);
    if (!due)
        return;
    char why[256];
    const char *where = waited_for(ctx, op, running, why, sizeof why);
    if (ctx->cfg.stall_abort_s > 0 && age > ctx->cfg.stall_abort_s) {
        DEAR_ERROR("engine", "stall: %s of %s %d (layers %d..%d, %zu bytes, iteration %lld) pending %.1f s "
                             "(%s), past DEAR_STALL_ABORT_S=%g: aborting the job; a rank probably stopped "
                             "calling the dear hooks",
                   phase_name(op->kind), op->kind == DEAR_COLL_ALLGATHER ? "group" : "bucket", op->index,
                   op->layer_lo, op->layer_hi, op->bytes, iter, age, where, ctx->cfg.stall_abort_s);
        MPI_Abort(ctx->cm.comm, 1);
    }
    if (ctx->cfg.stall_warn_s > 0 && age > ctx->cfg.stall_warn_s && !*warned) {
        *warned = 1;
        DEAR_WARN("engine", "stall: %s of %s %d (layers %d..%d, %zu bytes, iteration %lld) pending %.1f s (%s), "
                            "past DEAR_STALL_WARN_S=%g; is every rank calling the dear hooks?",
                  phase_name(op->kind), op->kind == DEAR_COLL_ALLGATHER ? "group" : "bucket", op->index,
                  op->layer_lo, op->layer_hi, op->bytes, iter, age, where, ctx->cfg.stall_warn_s);
    }
}

/* Under the lock: every operation queued and not started, and every run in flight. */
static void stall_check(dear_ctx_t *ctx, double now)
{
    if (ctx->cfg.stall_warn_s <= 0 && ctx->cfg.stall_abort_s <= 0)
        return;
    /* Those in flight first: the oldest, and what the queued ones wait for. */
    for (dear_run_t *r = ctx->eng.pt.running; r; r = r->next)
        stall_one(ctx, r->op, r->iter, now - r->t_queued, 1, &r->stall_warned);
    for (int i = 0; i < ctx->graph.nops; i++) {
        dear_op_t *op = ctx->graph.ops[i];
        if (op->sh.state == DEAR_OP_QUEUED)
            stall_one(ctx, op, op->sh.iter, now - op->sh.t_queued, 0, &op->pt.stall_warned);
    }
}

/* The timeline record of a finished collective (no lock: the timeline has its own). */
static void record_timeline(dear_ctx_t *ctx, const dear_run_t *r, double t_done, const dear_coll_info_t *info)
{
    const dear_op_t *op = r->op;
    char args[384], name[64];
    snprintf(name, sizeof name, "%s %s %d", phase_name(op->kind), op->kind == DEAR_COLL_ALLGATHER ? "group" : "bucket",
             op->index);
    int n = snprintf(args, sizeof args,
                     "\"phase\":\"%s\",\"bucket\":%d,\"bytes\":%zu,\"algorithm\":\"%s\",\"layers\":\"%d..%d\","
                     "\"iteration\":%lld,\"queued_us\":%.1f",
                     dear_coll_op_name(op->kind), op->index, op->bytes, dear_coll_algo_name(info->algo), op->layer_lo,
                     op->layer_hi, r->iter, 1e6 * (r->t_start - r->t_queued));
    /* What a sparse collective saved is per call: the bytes it sent and the forms of its messages. */
    if (info->algo == DEAR_ALGO_SPARSE && n > 0 && (size_t)n < sizeof args)
        snprintf(args + n, sizeof args - (size_t)n, ",\"bytes_sent\":%zu,\"msgs_sparse\":%zu,\"msgs_dense\":%zu",
                 info->bytes_sent, info->msgs_sparse, info->msgs_dense);
    dear_timeline_span(ctx->tl, name, "comm", DEAR_LANE_COMM, r->t_start, t_done, args);
}

/* Under the lock: counters of a finished collective (busbw as nccl-tests defines it). */
static void record_counters(dear_ctx_t *ctx, const dear_op_t *op, const dear_coll_info_t *info)
{
    double p = ctx->cm.size;
    double factor = ctx->cm.size > 1 ? (p - 1) / p : 0;
    if (op->kind == DEAR_COLL_ALLREDUCE)
        factor *= 2;
    ctx->eng.sh.bytes_sent += info->bytes_sent;
    ctx->eng.sh.busbytes += factor * (double)op->bytes;
    dear_sparse_record(ctx, op, info);
}

static void fail(dear_ctx_t *ctx, dear_op_t *op, int rc, const char *what)
{
    DEAR_ERROR("engine", "%s of %s %d (layers %d..%d, iteration %lld) failed in %s: %s; communication on this "
                         "context stops",
               phase_name(op->kind), op->kind == DEAR_COLL_ALLGATHER ? "group" : "bucket", op->index, op->layer_lo,
               op->layer_hi, op->sh.iter, what, dear_status_string(rc));
    dear_lock(&ctx->eng.lock);
    if (ctx->eng.sh.rc == DEAR_OK)
        ctx->eng.sh.rc = rc;
    dear_broadcast(&ctx->eng.done_cv);
    dear_unlock(&ctx->eng.lock);
}

/* Under the lock: wake the application thread if it waits for op. Why not at every end: woken
 * for another operation it only takes the lock and sleeps again, and with ranks sharing cores
 * that costs the progress thread the core and then the lock it needs next. */
static void wake_waiter(dear_ctx_t *ctx, const dear_op_t *op)
{
    if (ctx->eng.sh.wait_op == op)
        dear_broadcast(&ctx->eng.done_cv);
}

/* Under the lock: an operation completed (its collective ended, or it had nothing to move). */
static void op_done(dear_ctx_t *ctx, dear_op_t *op)
{
    op->sh.state = DEAR_OP_DONE;
    op->sh.done_iter = op->sh.launch_iter = op->sh.iter;
    wake_waiter(ctx, op);
}

/* The features' steps before an operation's collective, in the order they were added. */
static void op_before(dear_ctx_t *ctx, dear_op_t *op)
{
    for (int h = 0; h < op->nhooks; h++)
        if (op->hooks[h].before)
            op->hooks[h].before(ctx, op);
}

/* The memory's side of an operation's end, after the features' `after` steps (lock not held). */
static int op_finish(dear_ctx_t *ctx, dear_op_t *op)
{
    for (int h = 0; h < op->nhooks; h++)
        if (op->hooks[h].after)
            op->hooks[h].after(ctx, op);
    return op->finish ? op->finish(ctx, op) : DEAR_OK;
}

/* Step 1, under the lock: prepare every queued operation in seq order (pack its bucket), so
 * the copies run while earlier collectives are still in flight. */
static int prepare_queued(dear_ctx_t *ctx)
{
    dear_op_t *op;
    while ((op = preparable(ctx)) != NULL) {
        op->pt.prep_iter = op->sh.iter;
        op->pt.start_fence = NULL;
        ctx->eng.pt.next_prep++;
        if (op->prepare == NULL)
            continue;
        dear_unlock(&ctx->eng.lock);
        int rc = op->prepare(ctx, op);
        if (rc != DEAR_OK)
            fail(ctx, op, rc, "preparing its buffer");
        dear_lock(&ctx->eng.lock);
        if (rc != DEAR_OK)
            return rc;
        /* On the communication queue its collective goes right behind its copies, before the next
         * operation's wait for gradients still being computed. */
        if (on_queue(op))
            break;
    }
    return DEAR_OK;
}

/* Under the lock: a run record for op's collective of this iteration. */
static dear_run_t *run_new(dear_ctx_t *ctx, dear_op_t *op, double now)
{
    dear_run_t *r = ctx->eng.pt.spare;
    if (r)
        ctx->eng.pt.spare = r->next;
    else if ((r = malloc(sizeof *r)) == NULL)
        return NULL;
    *r = (dear_run_t){ .op = op, .iter = op->sh.iter, .t_queued = op->sh.t_queued, .t_start = now };
    return r;
}

/* Step 2, under the lock: start everything that may start, in seq order; *progressed when one
 * did. */
static int start_ready(dear_ctx_t *ctx, int *progressed)
{
    dear_op_t *op;
    while ((op = startable(ctx)) != NULL) {
        double now = dear_now();
        op->sh.state = DEAR_OP_RUNNING;
        ctx->eng.sh.nqueued--;
        op->args.tag = (int)(ctx->eng.pt.next_seq % TAG_SPAN);
        ctx->eng.pt.next_seq++;
        *progressed = 1;
        dear_unlock(&ctx->eng.lock);
        op_before(ctx, op);
        if (op->bytes == 0) {
            /* Nothing to move (every tensor of it frozen), the same on every rank. */
            int rc = op_finish(ctx, op);
            if (rc != DEAR_OK)
                fail(ctx, op, rc, "finishing");
            dear_lock(&ctx->eng.lock);
            if (rc != DEAR_OK)
                return rc;
            op_done(ctx, op);
            continue;
        }
        dear_coll_req_t *req = NULL;
        int rc = dear_coll_start(&op->args, &req);
        if (rc != DEAR_OK)
            fail(ctx, op, rc, "dear_coll_start");
        int queued = rc == DEAR_OK && dear_coll_queued(req);
        if (queued) {
            /* Its result is ordered on the communication queue already: what follows it there
             * (the shards' squares, the unpacking, the `done` fence) is enqueued now, and the
             * application may go on, its stream waiting on the GPU, not its thread. */
            rc = op_finish(ctx, op);
            if (rc != DEAR_OK)
                fail(ctx, op, rc, "enqueueing what follows it");
        }
        dear_lock(&ctx->eng.lock);
        dear_run_t *r = rc == DEAR_OK ? run_new(ctx, op, now) : NULL;
        if (rc == DEAR_OK && r == NULL) {
            DEAR_ERROR("sys", "allocation of %zu bytes failed", sizeof *r);
            rc = ctx->eng.sh.rc = DEAR_ERR_NOMEM;
        }
        if (rc != DEAR_OK) {
            dear_coll_free(req);
            return rc;
        }
        r->req = req;
        r->on_queue = queued;
        if (queued) {
            op->sh.launch_iter = op->sh.iter;
            wake_waiter(ctx, op);
        }
        if (ctx->eng.pt.nrunning == 0)
            ctx->eng.pt.busy_since = now;
        if (!queued) {
            ctx->eng.pt.nhost++;
            ctx->eng.pt.inflight_bytes += op->bytes;
        }
        r->next = ctx->eng.pt.running;
        ctx->eng.pt.running = r;
        ctx->eng.pt.nrunning++;
    }
    return ctx->eng.sh.rc;
}

/* A run ended: its records, its operation's after and finish (unless they ran at its start),
 * then done (lock not held; r is off the list). */
static int end_running(dear_ctx_t *ctx, dear_run_t *r)
{
    dear_op_t *op = r->op;
    double t_done = dear_now();
    dear_coll_info_t info;
    dear_coll_get_info(r->req, &info);
    if (ctx->tl)
        record_timeline(ctx, r, t_done, &info);
    int rc = r->on_queue ? DEAR_OK : op_finish(ctx, op);
    if (rc != DEAR_OK)
        fail(ctx, op, rc, "finishing");
    dear_coll_free(r->req);
    dear_lock(&ctx->eng.lock);
    record_counters(ctx, op, &info);
    if (r->on_queue) {
        /* Its operation may be queued for a later iteration already: only the completion moves. */
        if (op->sh.done_iter < r->iter)
            op->sh.done_iter = r->iter;
        wake_waiter(ctx, op);
    } else {
        op_done(ctx, op);
    }
    if (ctx->eng.pt.nrunning == 0)
        ctx->eng.sh.busy_s += t_done - ctx->eng.pt.busy_since;
    r->next = ctx->eng.pt.spare;
    ctx->eng.pt.spare = r;
    dear_unlock(&ctx->eng.lock);
    return rc;
}

/* Step 3, without the lock (the running list is this thread's alone): advance every collective
 * in flight. *ndone: how many ended; *stepped: a transfer completed (the back-off restarts, so
 * the next step is not left waiting). A message the transport completed during the round may
 * belong to a collective advanced before it: the count tells that another round is due. */
static int advance_running(dear_ctx_t *ctx, int *ndone, int *stepped)
{
    uint64_t msgs0 = 0, msgs1 = 0;
    dear_transport_counters(ctx->cm.tp, &msgs0, NULL);
    /* One poll of the context's transport for the round, when a host collective runs (NCCL's
     * never touch it); a failed poll is repeated, and fails the collective, in its own. */
    const dear_transport_t *polled = NULL;
    if (ctx->eng.pt.nhost > 0 && dear_transport_progress(ctx->cm.tp) == DEAR_OK)
        polled = ctx->cm.tp;
    dear_run_t **link = &ctx->eng.pt.running;
    while (*link) {
        dear_run_t *r = *link;
        int done = 0, rc = dear_coll_progress_polled(r->req, polled, &done);
        if (rc != DEAR_OK) {
            fail(ctx, r->op, rc, "dear_coll_progress");
            return rc;
        }
        if (!done) {
            dear_coll_info_t info;
            dear_coll_get_info(r->req, &info);
            if (info.events != r->last_events) {
                r->last_events = info.events;
                *stepped = 1;
            }
            link = &r->next;
            continue;
        }
        *link = r->next;
        ctx->eng.pt.nrunning--;
        if (!r->on_queue) {
            ctx->eng.pt.nhost--;
            ctx->eng.pt.inflight_bytes -= r->op->bytes;
        }
        (*ndone)++;
        DEAR_CHECK(end_running(ctx, r));
    }
    dear_transport_counters(ctx->cm.tp, &msgs1, NULL);
    *stepped |= msgs1 != msgs0;
    return DEAR_OK;
}

/* Step 4, under the lock: nothing moved. Sleep in the transport when only it can change that
 * (a newly queued operation pokes it); else yield first (cheap, keeps latency low when a peer
 * is about to answer), then sleep longer and longer so ranks sharing cores get them. */
static int idle_wait(dear_ctx_t *ctx, int *idle_rounds, double *sleep_s)
{
    dear_transport_t *tp = ctx->eng.pt.fence_wait ? NULL : blocking_transport(ctx);
    if (tp) {
        /* The timeout keeps the stall checks going. */
        ctx->eng.sh.in_net_wait = 1;
        dear_unlock(&ctx->eng.lock);
        int rc = dear_transport_block(tp, STALL_POLL_S);
        if (rc != DEAR_OK)
            fail(ctx, ctx->eng.pt.running->op, rc, "the transport's block");
        dear_lock(&ctx->eng.lock);
        ctx->eng.sh.in_net_wait = 0;
        return rc;
    }
    if ((*idle_rounds)++ < YIELDS_BEFORE_SLEEP) {
        dear_unlock(&ctx->eng.lock);
        sched_yield();
        dear_lock(&ctx->eng.lock);
        return DEAR_OK;
    }
    double cap = ctx->eng.sh.wait_op ? SLEEP_URGENT_MAX_S : SLEEP_MAX_S;
    if (*sleep_s > cap)
        *sleep_s = cap;
    timed_wait(ctx, *sleep_s);
    *sleep_s = *sleep_s * 2 < cap ? *sleep_s * 2 : cap;
    return DEAR_OK;
}

static void cancel_one(dear_net_req_t *q, void *arg)
{
    (void)arg;
    dear_net_cancel(q);
}

static void *engine_main(void *arg)
{
    dear_ctx_t *ctx = arg;
    int idle_rounds = 0;
    double sleep_s = SLEEP_MIN_S, cpu_mark = 0;

    dear_topo_bind_self(&ctx->cm.topo);
    /* A device's queues are used from this thread too (CUDA's current device is per thread). */
    if (ctx->mem.ops->bind && ctx->mem.ops->bind(ctx->mem.comm) != DEAR_OK)
        fail(ctx, ctx->graph.ops[0], DEAR_ERR_CUDA, "selecting the device");
    dear_lock(&ctx->eng.lock);
    while (ctx->eng.sh.rc == DEAR_OK) {
        int progressed = 0;
        if (prepare_queued(ctx) != DEAR_OK || start_ready(ctx, &progressed) != DEAR_OK)
            break;
        if (ctx->eng.pt.nrunning == 0) {
            /* finalize flushed first; what is still queued now can never start (a partial
             * iteration), so it is dropped rather than waited for. */
            if (ctx->eng.sh.stop)
                break;
            ctx->eng.sh.progress_cpu_s = dear_thread_cpu();
            idle_rounds = 0;
            sleep_s = SLEEP_MIN_S;
            if (ctx->eng.pt.fence_wait) {
                timed_wait(ctx, SLEEP_MAX_S); /* a buffer still filling: poll its fence */
            } else if (ctx->eng.sh.nqueued > 0 && (ctx->cfg.stall_warn_s > 0 || ctx->cfg.stall_abort_s > 0)) {
                stall_check(ctx, dear_now());
                timed_wait(ctx, STALL_POLL_S);
            } else {
                dear_wait(&ctx->eng.work_cv, &ctx->eng.lock);
            }
            continue;
        }
        dear_unlock(&ctx->eng.lock);
        int ndone = 0, stepped = 0, rc = advance_running(ctx, &ndone, &stepped);
        dear_lock(&ctx->eng.lock);
        if (rc != DEAR_OK)
            break;
        if (ndone || stepped)
            progressed = 1;
        double now = dear_now();
        if (now - cpu_mark > 0.01) {
            ctx->eng.sh.progress_cpu_s = dear_thread_cpu();
            cpu_mark = now;
        }
        stall_check(ctx, now);
        if (progressed || preparable(ctx) || startable(ctx)) {
            idle_rounds = 0;
            sleep_s = SLEEP_MIN_S;
            continue;
        }
        if (idle_wait(ctx, &idle_rounds, &sleep_s) != DEAR_OK)
            break;
    }
    /* On an error the collectives in flight are abandoned (their peers are in an unknown state):
     * their receives are cancelled, and they are parked, not freed, since a message that had
     * matched still reads or writes their buffers; dear_finalize settles them with the peers. */
    ctx->eng.pt.abandoned = ctx->eng.pt.running != NULL;
    for (dear_run_t *r = ctx->eng.pt.running; r; r = r->next)
        dear_coll_each_req(r->req, cancel_one, NULL);
    ctx->eng.pt.parked = ctx->eng.pt.running;
    ctx->eng.pt.running = NULL;
    ctx->eng.pt.nrunning = 0;
    while (ctx->eng.pt.spare) {
        dear_run_t *r = ctx->eng.pt.spare;
        ctx->eng.pt.spare = r->next;
        free(r);
    }
    ctx->eng.pt.nhost = 0;
    ctx->eng.pt.inflight_bytes = 0;
    ctx->eng.sh.progress_cpu_s = dear_thread_cpu();
    dear_broadcast(&ctx->eng.done_cv);
    dear_unlock(&ctx->eng.lock);
    return NULL;
}

int dear_engine_start(dear_ctx_t *ctx)
{
    if (ctx->cm.size == 1)
        return DEAR_OK; /* one rank: nothing ever travels, operations complete as they are queued */
    DEAR_PTHREAD_CHECK(pthread_create(&ctx->eng.thread, NULL, engine_main, ctx));
    ctx->eng.thread_started = 1;
    return DEAR_OK;
}

void dear_engine_stop(dear_ctx_t *ctx)
{
    if (!ctx->eng.thread_started)
        return;
    dear_lock(&ctx->eng.lock);
    ctx->eng.sh.stop = 1;
    dear_signal(&ctx->eng.work_cv);
    if (ctx->eng.sh.in_net_wait)
        dear_transport_poke(ctx->cm.tp);
    dear_unlock(&ctx->eng.lock);
    DEAR_PTHREAD_MUST(pthread_join(ctx->eng.thread, NULL));
    ctx->eng.thread_started = 0;
}

void dear_engine_queue(dear_ctx_t *ctx, dear_op_t *op)
{
    dear_engine_queue_at(ctx, op, ctx->it.iter);
}

void dear_engine_queue_at(dear_ctx_t *ctx, dear_op_t *op, long long iter)
{
    if (ctx->cm.size == 1) {
        /* The reduction of one rank is its own data, averaged over one: already in place. */
        op->sh.iter = op->pt.prep_iter = iter;
        op->pt.start_fence = NULL;
        int rc = op->prepare ? op->prepare(ctx, op) : DEAR_OK;
        /* What a collective would have waited for (the shards' squares), this thread waits for. */
        if (rc == DEAR_OK && op->pt.start_fence)
            rc = ctx->mem.ops->fence_wait(NULL, op->pt.start_fence);
        op_before(ctx, op);
        if (rc == DEAR_OK)
            rc = op_finish(ctx, op);
        if (rc != DEAR_OK) {
            fail(ctx, op, rc, "its memory operations");
            return;
        }
        op->sh.done_iter = op->sh.launch_iter = op->sh.iter;
        op->sh.state = DEAR_OP_DONE;
        return;
    }
    dear_lock(&ctx->eng.lock);
    op->sh.state = DEAR_OP_QUEUED;
    op->sh.iter = iter;
    op->sh.t_queued = dear_now();
    op->pt.stall_warned = 0;
    ctx->eng.sh.nqueued++;
    dear_signal(&ctx->eng.work_cv);
    if (ctx->eng.sh.in_net_wait)
        dear_transport_poke(ctx->cm.tp);
    dear_unlock(&ctx->eng.lock);
}

int dear_engine_done(dear_ctx_t *ctx, const dear_op_t *op, long long iter)
{
    dear_lock(&ctx->eng.lock);
    int done = op->sh.launch_iter == iter;
    dear_unlock(&ctx->eng.lock);
    return done;
}

int dear_engine_wait(dear_ctx_t *ctx, dear_op_t *op, long long iter)
{
    int rc = DEAR_OK;
    dear_lock(&ctx->eng.lock);
    if (op->sh.launch_iter != iter && ctx->eng.sh.rc == DEAR_OK) {
        double t0 = dear_now();
        /* A few yields first: a small collective is often about to finish, and a yield hands
         * the core to the progress thread without the cost of a sleep and wake-up. */
        for (int y = 0; y < WAIT_YIELDS && op->sh.launch_iter != iter && ctx->eng.sh.rc == DEAR_OK; y++) {
            if (y == 0)
                dear_signal(&ctx->eng.work_cv);
            dear_unlock(&ctx->eng.lock);
            sched_yield();
            dear_lock(&ctx->eng.lock);
        }
        ctx->eng.sh.wait_op = op;
        dear_signal(&ctx->eng.work_cv); /* cut a long back-off sleep short */
        while (op->sh.launch_iter != iter && ctx->eng.sh.rc == DEAR_OK)
            dear_wait(&ctx->eng.done_cv, &ctx->eng.lock);
        ctx->eng.sh.wait_op = NULL;
        ctx->it.blocked_s += dear_now() - t0;
    }
    if (op->sh.launch_iter != iter)
        rc = ctx->eng.sh.rc != DEAR_OK ? ctx->eng.sh.rc : DEAR_ERR_INTERNAL;
    dear_unlock(&ctx->eng.lock);
    return rc;
}
