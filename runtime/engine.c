/*
 * The progress thread: the only caller of MPI after commit, on the context's private
 * communicator. Operations have fixed places in each iteration (pos) and therefore a global
 * sequence number seq = iteration * nops + pos; they start strictly in seq order on every rank,
 * which is what lets collectives run without any per-iteration negotiation. An operation starts
 * once it is queued, its dependencies (the reduce-scatters an all-gather reads) are done and
 * fewer than DEAR_MAX_INFLIGHT are in flight; the sequence number gives its tag.
 *
 * Never a busy spin: with nothing in flight the thread sleeps on a condition variable; with
 * collectives in flight and no progress it yields a few times, then waits on the condition with
 * a timeout growing from 20 us to 100 us (50 us while the application thread is blocked on a
 * collective; a newly queued operation or a new waiter wakes it at once). It also
 * watches for stalls (DEAR_STALL_WARN_S, DEAR_STALL_ABORT_S) and records each collective in the
 * timeline and the counters.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/check.h"
#include "runtime/rt.h"
#include "runtime/util.h"

#define YIELDS_BEFORE_SLEEP 8
#define SLEEP_MIN_S 20e-6
/* While the application computes, sleeps grow to SLEEP_MAX_S and leave it the cores. Each
 * step of a collective (a ring segment, a rendezvous) needs a progress call to follow the last,
 * and TCP sockets only buffer so much, so a long sleep idles the link: with 1 ms, every
 * configuration of dear-bench on 4 emulated hosts at 1 Gbit/s ran 2-4% slower than with
 * 100 us (resnet50, two runs each: wfbp:threshold:25m 471/478 vs 452/459 ms, dear:auto 346/334
 * vs 332/326), while dear-cnn on 4 ranks and 2 cores showed no difference beyond its noise
 * (progress thread 3-5% of one core either way). */
#define SLEEP_MAX_S 100e-6
/* While the application thread is blocked on a collective, the progress thread is the critical
 * path: MPI's pipelined transfers (shared-memory fragments, rendezvous) need a progress call per
 * fragment, so sleeping up to 1 ms per poll would stretch a 200 KiB all-reduce on 4 ranks to
 * ~20 ms. Then sleeps stop growing at 50 us. */
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
    pthread_cond_timedwait(&ctx->work_cv, &ctx->lock, &ts);
}

/* Under the lock: the next operation in seq order if it may start now. */
static dear_op_t *startable(dear_ctx_t *ctx)
{
    if (ctx->nrunning >= ctx->max_inflight)
        return NULL;
    long long iter = ctx->next_seq / ctx->nops;
    dear_op_t *op = ctx->ops[ctx->next_seq % ctx->nops];
    if (op->state != DEAR_OP_QUEUED || op->iter != iter)
        return NULL;
    /* Large collectives go one at a time (DEAR_INFLIGHT_BYTES): sharing the links, they would
     * all finish late, the first one needed included, which is what the planner's simulator
     * (one collective at a time) and the schedule's priorities assume does not happen. */
    if (ctx->nrunning > 0 && ctx->inflight_window > 0 && ctx->inflight_bytes + op->bytes > ctx->inflight_window)
        return NULL;
    for (int d = 0; d < op->ndeps; d++)
        if (op->deps[d]->done_iter != iter)
            return NULL;
    return op;
}

static void stall_check(dear_ctx_t *ctx, double now)
{
    if (ctx->stall_warn_s <= 0 && ctx->stall_abort_s <= 0)
        return;
    for (int i = 0; i < ctx->nops; i++) {
        dear_op_t *op = ctx->ops[i];
        if (op->state != DEAR_OP_QUEUED && op->state != DEAR_OP_RUNNING)
            continue;
        double age = now - op->t_queued;
        const char *where = op->state == DEAR_OP_RUNNING ? "in flight" : "queued, waiting for earlier operations";
        if (ctx->stall_abort_s > 0 && age > ctx->stall_abort_s) {
            DEAR_ERROR("engine", "stall: %s of %s %d (layers %d..%d, %zu bytes, iteration %lld) pending %.1f s "
                                 "(%s), past DEAR_STALL_ABORT_S=%g: aborting the job; a rank probably stopped "
                                 "calling the dear hooks",
                       phase_name(op->kind), op->kind == DEAR_COLL_ALLGATHER ? "group" : "bucket", op->index,
                       op->layer_lo, op->layer_hi, op->bytes, op->iter, age, where, ctx->stall_abort_s);
            MPI_Abort(ctx->comm, 1);
        }
        if (ctx->stall_warn_s > 0 && age > ctx->stall_warn_s && !op->stall_warned) {
            op->stall_warned = 1;
            DEAR_WARN("engine", "stall: %s of %s %d (layers %d..%d, %zu bytes, iteration %lld) pending %.1f s (%s), "
                                "past DEAR_STALL_WARN_S=%g; is every rank calling the dear hooks?",
                      phase_name(op->kind), op->kind == DEAR_COLL_ALLGATHER ? "group" : "bucket", op->index,
                      op->layer_lo, op->layer_hi, op->bytes, op->iter, age, where, ctx->stall_warn_s);
        }
    }
}

/* The timeline record of a finished collective (no lock: the timeline has its own). */
static void record_timeline(dear_ctx_t *ctx, const dear_op_t *op, const dear_coll_info_t *info)
{
    char args[256], name[64];
    snprintf(name, sizeof name, "%s %s %d", phase_name(op->kind), op->kind == DEAR_COLL_ALLGATHER ? "group" : "bucket",
             op->index);
    snprintf(args, sizeof args,
             "\"phase\":\"%s\",\"bucket\":%d,\"bytes\":%zu,\"algorithm\":\"%s\",\"layers\":\"%d..%d\","
             "\"iteration\":%lld,\"queued_us\":%.1f",
             dear_coll_op_name(op->kind), op->index, op->bytes, dear_coll_algo_name(info->algo), op->layer_lo,
             op->layer_hi, op->iter, 1e6 * (op->t_start - op->t_queued));
    dear_timeline_span(ctx->tl, name, "comm", DEAR_LANE_COMM, op->t_start, op->t_done, args);
}

/* Under the lock: counters of a finished collective (busbw as nccl-tests defines it). */
static void record_counters(dear_ctx_t *ctx, const dear_op_t *op, const dear_coll_info_t *info)
{
    double p = ctx->size;
    double factor = ctx->size > 1 ? (p - 1) / p : 0;
    if (op->kind == DEAR_COLL_ALLREDUCE)
        factor *= 2;
    ctx->bytes_sent += info->bytes_sent;
    ctx->busbytes += factor * (double)op->bytes;
}

static void fail(dear_ctx_t *ctx, dear_op_t *op, int rc, const char *what)
{
    DEAR_ERROR("engine", "%s of %s %d (layers %d..%d, iteration %lld) failed in %s: %s; communication on this "
                         "context stops",
               phase_name(op->kind), op->kind == DEAR_COLL_ALLGATHER ? "group" : "bucket", op->index, op->layer_lo,
               op->layer_hi, op->iter, what, dear_status_string(rc));
    pthread_mutex_lock(&ctx->lock);
    if (ctx->engine_rc == DEAR_OK)
        ctx->engine_rc = rc;
    pthread_cond_broadcast(&ctx->done_cv);
    pthread_mutex_unlock(&ctx->lock);
}

static void *engine_main(void *arg)
{
    dear_ctx_t *ctx = arg;
    int idle_rounds = 0;
    double sleep_s = SLEEP_MIN_S, cpu_mark = 0;

    dear_topo_bind_self(&ctx->topo);
    pthread_mutex_lock(&ctx->lock);
    for (;;) {
        if (ctx->engine_rc != DEAR_OK)
            break;
        /* Start everything that may start, in order. */
        dear_op_t *op;
        int progressed = 0;
        while ((op = startable(ctx)) != NULL) {
            op->state = DEAR_OP_RUNNING;
            op->t_start = dear_now();
            op->last_events = 0;
            ctx->nqueued--;
            op->args.tag = (int)(ctx->next_seq % TAG_SPAN);
            ctx->next_seq++;
            pthread_mutex_unlock(&ctx->lock);
            int rc = dear_coll_start(&op->args, &op->req);
            if (rc != DEAR_OK) {
                fail(ctx, op, rc, "dear_coll_start");
                pthread_mutex_lock(&ctx->lock);
                goto out;
            }
            if (ctx->nrunning == 0)
                ctx->busy_since = op->t_start;
            ctx->inflight_bytes += op->bytes;
            op->next_running = ctx->running;
            ctx->running = op;
            ctx->nrunning++;
            progressed = 1;
            pthread_mutex_lock(&ctx->lock);
        }
        if (ctx->nrunning == 0) {
            /* finalize flushed first; what is still queued now can never start (a partial
             * iteration), so it is dropped rather than waited for. */
            if (ctx->stop)
                break;
            double cpu = dear_thread_cpu();
            ctx->progress_cpu_s = cpu;
            idle_rounds = 0;
            sleep_s = SLEEP_MIN_S;
            if (ctx->nqueued > 0 && (ctx->stall_warn_s > 0 || ctx->stall_abort_s > 0)) {
                stall_check(ctx, dear_now());
                timed_wait(ctx, STALL_POLL_S);
            } else {
                pthread_cond_wait(&ctx->work_cv, &ctx->lock);
            }
            continue;
        }
        pthread_mutex_unlock(&ctx->lock);

        /* Advance every collective in flight; the list is this thread's alone. */
        dear_op_t **link = &ctx->running;
        int ndone = 0, stepped = 0;
        while (*link) {
            op = *link;
            int done = 0, rc = dear_coll_progress(op->req, &done);
            if (rc != DEAR_OK) {
                fail(ctx, op, rc, "dear_coll_progress");
                pthread_mutex_lock(&ctx->lock);
                goto out;
            }
            if (!done) {
                /* A completed transfer (a segment sent or received) counts as progress:
                 * the back-off restarts so the next step is not left waiting up to SLEEP_MAX_S. */
                dear_coll_info_t info;
                dear_coll_get_info(op->req, &info);
                if (info.events != op->last_events) {
                    op->last_events = info.events;
                    stepped = 1;
                }
                link = &op->next_running;
                continue;
            }
            *link = op->next_running;
            ctx->nrunning--;
            ctx->inflight_bytes -= op->bytes;
            op->t_done = dear_now();
            dear_coll_info_t info;
            dear_coll_get_info(op->req, &info);
            if (ctx->tl)
                record_timeline(ctx, op, &info);
            pthread_mutex_lock(&ctx->lock);
            record_counters(ctx, op, &info);
            op->state = DEAR_OP_DONE;
            op->done_iter = op->iter;
            if (ctx->nrunning == 0)
                ctx->busy_s += op->t_done - ctx->busy_since;
            pthread_mutex_unlock(&ctx->lock);
            dear_coll_free(op->req);
            op->req = NULL;
            ndone++;
        }
        pthread_mutex_lock(&ctx->lock);
        if (ndone)
            pthread_cond_broadcast(&ctx->done_cv);
        if (ndone || stepped)
            progressed = 1;
        double now = dear_now();
        if (now - cpu_mark > 0.01) {
            ctx->progress_cpu_s = dear_thread_cpu();
            cpu_mark = now;
        }
        stall_check(ctx, now);
        if (progressed || startable(ctx)) {
            idle_rounds = 0;
            sleep_s = SLEEP_MIN_S;
            continue;
        }
        /* Nothing moved: yield first (cheap, keeps latency low when a peer is about to answer),
         * then sleep longer and longer so ranks sharing cores get them. */
        if (idle_rounds++ < YIELDS_BEFORE_SLEEP) {
            pthread_mutex_unlock(&ctx->lock);
            sched_yield();
            pthread_mutex_lock(&ctx->lock);
        } else {
            double cap = ctx->nwaiters > 0 ? SLEEP_URGENT_MAX_S : SLEEP_MAX_S;
            if (sleep_s > cap)
                sleep_s = cap;
            timed_wait(ctx, sleep_s);
            sleep_s = sleep_s * 2 < cap ? sleep_s * 2 : cap;
        }
    }
out:
    /* On an error the collectives in flight are abandoned (their peers are in an unknown state);
     * their requests are freed so nothing leaks. */
    while (ctx->running) {
        dear_op_t *op = ctx->running;
        ctx->running = op->next_running;
        dear_coll_free(op->req);
        op->req = NULL;
        ctx->nrunning--;
    }
    ctx->inflight_bytes = 0;
    ctx->progress_cpu_s = dear_thread_cpu();
    pthread_cond_broadcast(&ctx->done_cv);
    pthread_mutex_unlock(&ctx->lock);
    return NULL;
}

int dear_engine_start(dear_ctx_t *ctx)
{
    DEAR_PTHREAD_CHECK(pthread_create(&ctx->thread, NULL, engine_main, ctx));
    ctx->thread_started = 1;
    return DEAR_OK;
}

void dear_engine_stop(dear_ctx_t *ctx)
{
    if (!ctx->thread_started)
        return;
    pthread_mutex_lock(&ctx->lock);
    ctx->stop = 1;
    pthread_cond_signal(&ctx->work_cv);
    pthread_mutex_unlock(&ctx->lock);
    pthread_join(ctx->thread, NULL);
    ctx->thread_started = 0;
}

void dear_engine_queue(dear_ctx_t *ctx, dear_op_t *op)
{
    pthread_mutex_lock(&ctx->lock);
    op->state = DEAR_OP_QUEUED;
    op->iter = ctx->iter;
    op->t_queued = dear_now();
    op->stall_warned = 0;
    ctx->nqueued++;
    pthread_cond_signal(&ctx->work_cv);
    pthread_mutex_unlock(&ctx->lock);
}

int dear_engine_wait(dear_ctx_t *ctx, dear_op_t *op, long long iter)
{
    int rc = DEAR_OK;
    pthread_mutex_lock(&ctx->lock);
    if (op->done_iter != iter && ctx->engine_rc == DEAR_OK) {
        double t0 = dear_now();
        /* A few yields first: a small collective is often about to finish, and a yield hands
         * the core to the progress thread without the cost of a sleep and wake-up. */
        for (int y = 0; y < WAIT_YIELDS && op->done_iter != iter && ctx->engine_rc == DEAR_OK; y++) {
            if (y == 0)
                pthread_cond_signal(&ctx->work_cv);
            pthread_mutex_unlock(&ctx->lock);
            sched_yield();
            pthread_mutex_lock(&ctx->lock);
        }
        ctx->nwaiters++;
        pthread_cond_signal(&ctx->work_cv); /* cut a long back-off sleep short */
        while (op->done_iter != iter && ctx->engine_rc == DEAR_OK)
            pthread_cond_wait(&ctx->done_cv, &ctx->lock);
        ctx->nwaiters--;
        ctx->blocked_s += dear_now() - t0;
    }
    if (op->done_iter != iter)
        rc = ctx->engine_rc != DEAR_OK ? ctx->engine_rc : DEAR_ERR_INTERNAL;
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}
