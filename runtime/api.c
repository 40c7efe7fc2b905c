/*
 * The lifetime of a context: dear_init (thread level, parameters, private communicator,
 * topology, timeline), dear_register (validation of each tensor), dear_commit (registry check
 * across ranks, plan, buckets, progress thread), dear_get_stats, dear_profile_save,
 * dear_plan_save and dear_finalize (flush, meet the other ranks, stop, report, free). The per-iteration hooks
 * live in iteration.c and the schedules' files.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/planfile.h"
#include "fusion/profile.h"
#include "base/mpi_check.h"
#include "collectives/net.h"
#include "base/params.h"
#include "base/sync.h"
#include "runtime/rt.h"
#include "base/util.h"

/* Collective: DEAR_TRANSPORT (rank 0's) picks what carries the collectives, and comm and hier's
 * communicators get their endpoints on it (in the same order on every rank). */
static int net_setup(dear_ctx_t *ctx)
{
    int t = (int)dear_param_enum(DEAR_P_TRANSPORT);
    DEAR_MPI_CHECK(MPI_Bcast(&t, 1, MPI_INT, 0, ctx->cm.comm));
    DEAR_CHECK(dear_transport_open(ctx->cm.comm, t, ctx->cm.topo.nnodes, &ctx->cm.tp));
    DEAR_CHECK(dear_net_open(ctx->cm.tp, ctx->cm.comm, &ctx->cm.net));
    return dear_coll_topo_attach(ctx->cm.coll_topo, ctx->cm.tp);
}

/* The endpoints before the transport, hier's before the communicators they name. */
static void net_free(dear_ctx_t *ctx)
{
    dear_coll_topo_free(ctx->cm.coll_topo, ctx->cm.keep);
    ctx->cm.coll_topo = NULL;
    dear_net_close(ctx->cm.net);
    ctx->cm.net = NULL;
    dear_transport_close(ctx->cm.tp);
    ctx->cm.tp = NULL;
}

/* The transport's limits (net.h set_limits) from what any plan over the registered tensors can
 * send: no collective's vector holds more than all of them (16-bit ones travel as float32
 * partial sums) plus calibration's, and a peer runs ahead by at most the collectives in flight. */
static void net_limits(dear_ctx_t *ctx)
{
    size_t most = (size_t)16 << 20;
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        size_t es = dear_dtype_size(ctx->reg.tensors[t].dtype);
        most += ctx->reg.tensors[t].count * (es < 4 ? 4 : es);
    }
    size_t w = ctx->cfg.inflight_window, inflight = w == 0 ? (size_t)ctx->cfg.max_inflight * most : w > most ? w : most;
    dear_transport_set_limits(ctx->cm.tp, most, 4 * inflight);
}

static int ctx_free(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    if (!ctx)
        return DEAR_OK;
    /* Collectives abandoned and never settled (the ranks could not meet): what their messages
     * may still use, theirs and the fusion buffers, is left allocated rather than freed. */
    if (ctx->eng.pt.parked) {
        DEAR_WARN("api", "dear_finalize: collectives abandoned after an error could not be settled with the other "
                         "ranks; their buffers are left allocated, since their messages may still use them");
    } else {
        dear_graph_free(ctx);
        dear_features_free(ctx);
        dear_rt_mem_free(ctx);
    }
    free(ctx->reg.tensors);
    free(ctx->reg.declared);
    free(ctx->reg.hints);
    dear_iter_profile_free(&ctx->it, ctx->reg.nlayers);
    dear_registry_free_layers(&ctx->reg);
    dear_samples_free(&ctx->it.iter_times);
    free(ctx->check.samples);
    dear_planning_free(ctx);
    dear_timeline_close(ctx->tl);
    net_free(ctx);
    if (ctx->cm.comm != MPI_COMM_NULL && !ctx->cm.keep) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin && MPI_Comm_free(&ctx->cm.comm) != MPI_SUCCESS)
            rc = DEAR_ERR_MPI;
    }
    if (ctx->eng.sync_ready) {
        DEAR_PTHREAD_MUST(pthread_cond_destroy(&ctx->eng.done_cv));
        DEAR_PTHREAD_MUST(pthread_cond_destroy(&ctx->eng.work_cv));
        DEAR_PTHREAD_MUST(pthread_mutex_destroy(&ctx->eng.lock));
    }
    free(ctx);
    return rc;
}

/* The progress thread's lock and conditions; ctx->eng.sync_ready once all three exist. */
static int sync_init(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    DEAR_PTHREAD_CHECK(pthread_mutex_init(&ctx->eng.lock, NULL));
    DEAR_PTHREAD_CHECK_GOTO(pthread_cond_init(&ctx->eng.work_cv, NULL), rc, err_lock);
    DEAR_PTHREAD_CHECK_GOTO(pthread_cond_init(&ctx->eng.done_cv, NULL), rc, err_work);
    ctx->eng.sync_ready = 1;
    return DEAR_OK;
err_work:
    DEAR_PTHREAD_MUST(pthread_cond_destroy(&ctx->eng.work_cv));
err_lock:
    DEAR_PTHREAD_MUST(pthread_mutex_destroy(&ctx->eng.lock));
    return rc;
}

/* Collective: DEAR_OK only if rc is DEAR_OK on every rank; a rank that was fine reports which
 * rank failed and why, the failing rank has logged its own error. */
static int agree(MPI_Comm comm, int rc, const char *why)
{
    int me = 0;
    DEAR_MPI_CHECK(MPI_Comm_rank(comm, &me));
    /* MAXLOC over (failed, rank): whether any rank failed, and the lowest such rank. */
    int mine[2] = { rc == DEAR_OK ? 0 : 1, me }, first[2];
    DEAR_MPI_CHECK(MPI_Allreduce(mine, first, 1, MPI_2INT, MPI_MAXLOC, comm));
    if (first[0] == 0)
        return DEAR_OK;
    int code = rc;
    DEAR_MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, first[1], comm));
    if (rc == DEAR_OK)
        DEAR_ERROR("api", "dear_init: rank %d failed (%s): %s", first[1], dear_status_string(code), why);
    return rc != DEAR_OK ? rc : code;
}

static const char *thread_level_name(int level)
{
    return level == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE" : level == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED"
           : level == MPI_THREAD_SERIALIZED                 ? "MPI_THREAD_SERIALIZED"
                                                            : "unknown (below MPI_THREAD_MULTIPLE)";
}

int dear_init(MPI_Comm comm, dear_ctx_t **ctx_out)
{
    int rc = DEAR_OK, inited = 0, level = 0;
    dear_ctx_t *ctx = NULL;

    DEAR_ARG_CHECK(ctx_out != NULL, "dear_init: ctx (output pointer) is NULL");
    DEAR_MPI_CHECK(MPI_Initialized(&inited));
    if (!inited) {
        DEAR_ERROR("api", "dear_init: MPI is not initialised; call MPI_Init_thread(&argc, &argv, "
                          "MPI_THREAD_MULTIPLE, &provided) first");
        return DEAR_ERR_STATE;
    }
    DEAR_ARG_CHECK(comm != MPI_COMM_NULL, "dear_init: comm is MPI_COMM_NULL");
    DEAR_MPI_CHECK(MPI_Query_thread(&level));
    if (level < MPI_THREAD_MULTIPLE) {
        DEAR_ERROR("api", "dear_init: MPI provides thread level %s, libdear needs MPI_THREAD_MULTIPLE "
                          "(its progress thread calls MPI): initialise MPI with MPI_Init_thread(&argc, "
                          "&argv, MPI_THREAD_MULTIPLE, &provided) and check provided",
                   thread_level_name(level));
        return DEAR_ERR_UNSUPPORTED;
    }
    /* Every rank must leave with the same verdict, or the others would hang in the collective
     * calls that follow: one all-reduce on the caller's communicator settles it. */
    rc = dear_params_load();
    DEAR_CHECK(agree(comm, rc, "a DEAR_* variable has a bad value"));
    /* Every rank must pick the same algorithms: the one setting that changes them everywhere. */
    int det[2] = { (int)dear_param_int(DEAR_P_DETERMINISTIC), -(int)dear_param_int(DEAR_P_DETERMINISTIC) }, both[2];
    DEAR_MPI_CHECK(MPI_Allreduce(det, both, 2, MPI_INT, MPI_MAX, comm));
    if (both[0] != -both[1]) {
        DEAR_ERROR("api", "dear_init: DEAR_DETERMINISTIC is %d on this rank but not on every rank; set the same value "
                          "everywhere (mpirun -x DEAR_DETERMINISTIC)",
                   det[0]);
        return DEAR_ERR_PARAM;
    }

    DEAR_ALLOC_GOTO(ctx, calloc(1, sizeof *ctx), sizeof *ctx, rc, err);
    ctx->cm.comm = MPI_COMM_NULL;
    DEAR_CHECK_GOTO(sync_init(ctx), rc, err);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_dup(comm, &ctx->cm.comm), rc, err);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_rank(ctx->cm.comm, &ctx->cm.rank), rc, err);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_size(ctx->cm.comm, &ctx->cm.size), rc, err);
    dear_log_set_rank(ctx->cm.rank);
    DEAR_CHECK_GOTO(dear_topo_detect(ctx->cm.comm, &ctx->cm.topo), rc, err);
    /* Hosts of several ranks each: the collectives may go in two levels (coll_hier.c). */
    DEAR_CHECK_GOTO(dear_coll_topo_create(ctx->cm.comm, -1, &ctx->cm.coll_topo), rc, err);
    DEAR_CHECK_GOTO(net_setup(ctx), rc, err);

    ctx->cfg.sched = (dear_sched_t)dear_param_enum(DEAR_P_SCHEDULE);
    ctx->cfg.sched_ops = dear_sched_ops(ctx->cfg.sched);
    ctx->cfg.stats_print = (int)dear_param_int(DEAR_P_STATS);
    ctx->cfg.stall_warn_s = dear_param_double(DEAR_P_STALL_WARN_S);
    ctx->cfg.stall_abort_s = dear_param_double(DEAR_P_STALL_ABORT_S);
    ctx->cfg.max_inflight = (int)dear_param_int(DEAR_P_MAX_INFLIGHT);
    ctx->cfg.inflight_window = (size_t)dear_param_int(DEAR_P_INFLIGHT_BYTES);
    ctx->it.last_hook_lidx = -1;
    const char *tl = dear_param_string(DEAR_P_TIMELINE);
    if (tl && tl[0])
        rc = dear_timeline_open(tl, ctx->cm.rank, (size_t)dear_param_int(DEAR_P_TIMELINE_MAX), &ctx->tl);
    DEAR_CHECK_GOTO(agree(ctx->cm.comm, rc, "its DEAR_TIMELINE file cannot be opened"), rc, err);
    DEAR_INFO("api", "initialised on %d rank(s), schedule %s, fusion %s", ctx->cm.size,
              dear_sched_name(ctx->cfg.sched), dear_param_string(DEAR_P_FUSION));
    *ctx_out = ctx;
    return DEAR_OK;
err:
    ctx_free(ctx);
    return rc;
}

static int commit_claimed(dear_ctx_t *ctx)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_commit: ctx is NULL");
    if (ctx->committed) {
        DEAR_ERROR("api", "dear_commit: the context is already committed (call it once, after the last "
                          "dear_register)");
        return DEAR_ERR_STATE;
    }
    /* Before the collective check: no rank sends past it before every rank has its limits. */
    net_limits(ctx);
    /* The check is collective and runs before anything is built, so every rank leaves here
     * with the same verdict. */
    DEAR_CHECK(dear_registry_check(&ctx->cm, &ctx->reg));
    if (ctx->reg.ntensors == 0) {
        DEAR_ERROR("api", "dear_commit: no tensor registered; call dear_register for each gradient first");
        return DEAR_ERR_STATE;
    }
    int rc = dear_registry_build_layers(&ctx->reg);
    if (rc == DEAR_OK)
        rc = dear_iter_profile_alloc(&ctx->it, ctx->reg.nlayers);
    if (rc == DEAR_OK)
        rc = dear_registry_check_layers(&ctx->cm, &ctx->reg);
    /* The features (feature table): each decided, the pairs checked, each set up in the rows'
     * order; then the memory, and what the features keep in it. */
    if (rc == DEAR_OK)
        rc = dear_features_commit(ctx);
    if (rc == DEAR_OK)
        rc = dear_rt_mem_setup(ctx);
    if (rc == DEAR_OK)
        rc = dear_features_mem(ctx);
    if (rc == DEAR_OK)
        rc = dear_planning_setup(ctx);
    if (rc == DEAR_OK)
        rc = dear_planning_initial(ctx);
    if (rc == DEAR_OK)
        rc = dear_graph_build(ctx);
    if (rc == DEAR_OK)
        rc = dear_engine_start(ctx);
    if (rc != DEAR_OK) {
        /* Back to the registered state, so a corrected environment can commit again. */
        dear_graph_free(ctx);
        dear_features_free(ctx);
        dear_rt_mem_free(ctx);
        dear_iter_profile_free(&ctx->it, ctx->reg.nlayers);
        dear_registry_free_layers(&ctx->reg);
        return rc;
    }
    ctx->committed = 1;
    ctx->it.t_commit = dear_now();
    return DEAR_OK;
}

int dear_commit(dear_ctx_t *ctx)
{
    DEAR_CLAIMED(ctx, "dear_commit", commit_claimed(ctx));
}

static int get_stats_claimed(dear_ctx_t *ctx, dear_stats_t *stats)
{
    DEAR_ARG_CHECK(ctx != NULL && stats != NULL, "dear_get_stats: %s is NULL", ctx ? "stats" : "ctx");
    dear_stats_t s = { 0 };
    s.iterations = (uint64_t)ctx->it.iter;
    s.blocked_s = ctx->it.blocked_s;
    s.last_iter_s = ctx->it.iter_times.n ? ctx->it.iter_times.v[ctx->it.iter_times.n - 1] : 0;
    s.median_iter_s = ctx->it.iter_times.n >= 1 && ctx->it.iter >= 2 ? dear_samples_median(&ctx->it.iter_times) : 0;
    dear_lock(&ctx->eng.lock);
    s.bytes_sent = ctx->eng.sh.bytes_sent;
    s.progress_cpu_s = ctx->eng.sh.progress_cpu_s;
    dear_unlock(&ctx->eng.lock);
    *stats = s;
    return DEAR_OK;
}

int dear_get_stats(dear_ctx_t *ctx, dear_stats_t *stats)
{
    DEAR_CLAIMED(ctx, "dear_get_stats", get_stats_claimed(ctx, stats));
}

static int get_plan_info_claimed(dear_ctx_t *ctx, dear_plan_info_t *info)
{
    DEAR_ARG_CHECK(ctx != NULL && info != NULL, "dear_get_plan_info: %s is NULL", ctx ? "info" : "ctx");
    DEAR_ARG_CHECK(info->size >= sizeof(dear_plan_info_t),
                   "dear_get_plan_info: info->size is %zu; set it to sizeof(dear_plan_info_t) first", info->size);
    if (!ctx->committed) {
        DEAR_ERROR("api", "dear_get_plan_info: the context is not committed");
        return DEAR_ERR_STATE;
    }
    dear_plan_info_t s = { .size = info->size, .comm_scale = ctx->online.fit_scale > 0 ? ctx->online.fit_scale : 1,
                           .measured_iter_s = ctx->online.fit_measured_s, .predicted_iter_s = ctx->online.fit_pred_s };
    memcpy(info, &s, sizeof s);
    return DEAR_OK;
}

int dear_get_plan_info(dear_ctx_t *ctx, dear_plan_info_t *info)
{
    DEAR_CLAIMED(ctx, "dear_get_plan_info", get_plan_info_claimed(ctx, info));
}

/* Medians per layer, the slowest rank's (MAX all-reduce): a plan must fit the slowest worker.
 * The communicator is quiet here (flushed, nothing queued), so this one call outside the
 * progress thread cannot interleave with its collectives. */
static int profile_save_claimed(dear_ctx_t *ctx, const char *path)
{
    dear_profile_t prof = { 0 };
    DEAR_ARG_CHECK(ctx != NULL && path != NULL && path[0], "dear_profile_save: %s is NULL or empty",
                   ctx ? "path" : "ctx");
    if (!ctx->committed || ctx->it.in_backward) {
        DEAR_ERROR("api", "dear_profile_save('%s'): %s", path,
                   ctx->committed ? "called during the backward pass; call it between iterations"
                                  : "the context is not committed; call it after training iterations");
        return DEAR_ERR_STATE;
    }
    DEAR_CHECK(dear_sched_flush(ctx, "dear_profile_save"));
    int rc = dear_profile_measured(ctx, "dear", 0, &prof);
    if (rc == DEAR_ERR_MPI)
        return rc;
    if (ctx->cm.rank == 0 && rc == DEAR_OK)
        rc = dear_prof_save(&prof, path);
    dear_prof_free(&prof);
    DEAR_MPI_CHECK(MPI_Bcast(&rc, 1, MPI_INT, 0, ctx->cm.comm));
    return rc;
}

int dear_profile_save(dear_ctx_t *ctx, const char *path)
{
    DEAR_CLAIMED(ctx, "dear_profile_save", profile_save_claimed(ctx, path));
}

static int plan_save_claimed(dear_ctx_t *ctx, const char *path)
{
    int rc = DEAR_OK;
    DEAR_ARG_CHECK(ctx != NULL && path != NULL && path[0], "dear_plan_save: %s is NULL or empty",
                   ctx ? "path" : "ctx");
    if (!ctx->committed) {
        DEAR_ERROR("api", "dear_plan_save('%s'): the context is not committed; call it after dear_commit", path);
        return DEAR_ERR_STATE;
    }
    dear_tensor_desc_t *desc = NULL;
    const char **names = NULL;
    DEAR_CHECK_GOTO(dear_tensor_table(ctx, &desc, &names), rc, out);
    rc = dear_planfile_save(path, &ctx->graph.plan, desc, names);
out:
    free(desc);
    free(names);
    return rc;
}

int dear_plan_save(dear_ctx_t *ctx, const char *path)
{
    DEAR_CLAIMED(ctx, "dear_plan_save", plan_save_claimed(ctx, path));
}

static void print_stats(dear_ctx_t *ctx)
{
    dear_stats_t s;
    if (get_stats_claimed(ctx, &s) != DEAR_OK) /* dear_finalize holds the claim */
        return;
    double wall = dear_now() - ctx->it.t_commit;
    dear_lock(&ctx->eng.lock);
    double busbytes = ctx->eng.sh.busbytes, busy = ctx->eng.sh.busy_s;
    dear_unlock(&ctx->eng.lock);
    fprintf(stderr,
            "[dear 0] stats: %llu iterations, median iteration %.3f ms, blocked %.3f s, %.3f MB sent by rank 0, "
            "busbw %.1f MB/s over %.3f s of communication, progress thread CPU %.3f s (%.1f%% of %.3f s wall), "
            "schedule %s, %d bucket(s)\n",
            (unsigned long long)s.iterations, 1e3 * s.median_iter_s, s.blocked_s, 1e-6 * (double)s.bytes_sent,
            busy > 0 ? 1e-6 * busbytes / busy : 0.0, busy, s.progress_cpu_s,
            wall > 0 ? 100.0 * s.progress_cpu_s / wall : 0.0, wall, dear_sched_name(ctx->cfg.sched), ctx->graph.nbuckets);
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        dear_sparse_stats_t sp = { .size = sizeof sp };
        if (dear_sparse_stats_claimed(ctx, t, &sp) != DEAR_OK || sp.block == 0)
            continue;
        char phases[64];
        fprintf(stderr,
                "[dear 0] stats: sparse tensor '%s' (block %zu): warm-up density %.3f (%.3f averaged), %s, %llu sparse "
                "and %llu dense message(s), %.3f MB sent in sparse collectives\n",
                ctx->reg.tensors[t].name, sp.block, sp.density, sp.density_union,
                dear_sparse_phases(ctx, sp.sparse_rs, sp.sparse_ag, phases, sizeof phases),
                (unsigned long long)sp.msgs_sparse, (unsigned long long)sp.msgs_dense, 1e-6 * (double)sp.bytes_sent);
    }
}

/* Above every collective's tag (the engine's run below 16384), within the MPI minimum of 32767. */
#define FINALIZE_TAG 32000

/* Names the ranks whose flag is 0 into buf ("1, 5, 7" or "1, 5 and 12 more"). */
static void missing_ranks(const int *arrived, int n, int self, char *buf, size_t cap)
{
    size_t len = 0;
    int listed = 0, more = 0;
    buf[0] = '\0';
    for (int p = 0; p < n; p++) {
        if (p == self || arrived[p])
            continue;
        if (listed < 16 && len + 16 < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", listed ? ", " : "", p), listed++;
        else
            more++;
    }
    if (more)
        snprintf(buf + len, cap - len, " and %d more", more);
}

/* Tests each message of the parked collectives still active; counts the receives still open. */
static void settle_one(dear_net_req_t *q, void *arg)
{
    if (!dear_net_active(q))
        return;
    int recv = dear_net_is_recv(q), flag = 0;
    if (dear_net_test(q, &flag) != DEAR_OK) {
        dear_net_abandon(q); /* failed: the transport is done with it (the error is logged) */
        return;
    }
    if (!flag && recv)
        (*(int *)arg)++;
}

/* Every rank tells every other one it is finalizing, with its iteration count, and waits for
 * all of them. A rank that left the training loop early would otherwise return at once while
 * its peers wait forever in a collective it will never join: past DEAR_STALL_ABORT_S the job is
 * aborted, naming the ranks that never came (DEAR_STALL_WARN_S warns first). Point to point, so
 * that the missing ranks can be named (and an MPI_Ibarrier would match algorithm mpi's abandoned
 * collectives); runs after the engine stopped, on the private communicator.
 * Each rank also says how many collectives it started and whether it abandoned any: unless all
 * agree and none did, a peer's message may sit unmatched, and cm.keep keeps the communicators
 * from being freed (MPI would hand their context ids to later ones).
 * A rank with collectives abandoned in flight (engine.c parks them, receives cancelled) says it
 * only once it has tested their messages until its receives are over (cancelled, or filled by a
 * message that had matched, whose sender moves it in this same loop). Hearing from every rank
 * then proves that no receive anywhere can take a send's data any more, and the parked
 * collectives' buffers may be freed. */
static int finalize_together(dear_ctx_t *ctx)
{
    int n = ctx->cm.size, rc = DEAR_OK;
    enum { ITER, STARTED, UNCLEAN, NSAY };
    long long mine[NSAY] = { ctx->it.iter, ctx->eng.pt.next_seq, ctx->eng.sh.rc != DEAR_OK || ctx->eng.pt.abandoned };
    long long(*theirs)[NSAY] = calloc((size_t)n, sizeof *theirs);
    MPI_Request *req = malloc(sizeof *req * 2 * (size_t)n);
    int *arrived = calloc((size_t)n, sizeof *arrived), *idx = malloc(sizeof *idx * 2 * (size_t)n);
    if (!theirs || !req || !arrived || !idx) {
        rc = DEAR_ERR_NOMEM;
        goto out;
    }
    for (int p = 0; p < n; p++) {
        req[p] = req[n + p] = MPI_REQUEST_NULL;
        if (p != ctx->cm.rank)
            DEAR_MPI_CHECK_GOTO(MPI_Irecv(theirs[p], NSAY, MPI_LONG_LONG, p, FINALIZE_TAG, ctx->cm.comm, &req[p]), rc,
                                out);
    }
    double t0 = dear_now(), pause = 1e-4;
    int left = 2 * (n - 1), warned = 0, said = 0, open = 0;
    for (;;) {
        if (!said) {
            open = 0;
            for (dear_run_t *r = ctx->eng.pt.parked; r; r = r->next)
                dear_coll_each_req(r->req, settle_one, &open);
            for (int p = 0; open == 0 && p < n; p++)
                if (p != ctx->cm.rank)
                    DEAR_MPI_CHECK_GOTO(MPI_Isend(mine, NSAY, MPI_LONG_LONG, p, FINALIZE_TAG, ctx->cm.comm, &req[n + p]),
                                        rc, out);
            said = open == 0;
        }
        int got = 0;
        DEAR_MPI_CHECK_GOTO(MPI_Testsome(2 * n, req, &got, idx, MPI_STATUSES_IGNORE), rc, out);
        for (int i = 0; got != MPI_UNDEFINED && i < got; i++) {
            if (idx[i] < n)
                arrived[idx[i]] = 1;
            left--;
        }
        if (said && left == 0)
            break;
        double age = dear_now() - t0;
        int abort_now = ctx->cfg.stall_abort_s > 0 && age > ctx->cfg.stall_abort_s,
            warn_now = ctx->cfg.stall_warn_s > 0 && age > ctx->cfg.stall_warn_s && !warned;
        if (abort_now || warn_now) {
            char who[256], why[400];
            missing_ranks(arrived, n, ctx->cm.rank, who, sizeof who);
            if (said)
                snprintf(why, sizeof why, "rank(s) %s have not reached dear_finalize; they are still training (this "
                                          "rank stopped after iteration %lld) or have stopped", who, mine[ITER]);
            else
                snprintf(why, sizeof why, "the messages of this rank's collectives abandoned after an error have not "
                                          "settled (%d receive(s) open)%s%s",
                         open, who[0] ? "; not yet heard from rank(s) " : "", who);
            if (abort_now) {
                DEAR_ERROR("api", "dear_finalize: after %.1f s (DEAR_STALL_ABORT_S=%g), %s: aborting the job", age,
                           ctx->cfg.stall_abort_s, why);
                MPI_Abort(ctx->cm.comm, 1);
            }
            warned = 1;
            DEAR_WARN("api", "dear_finalize: waiting %.1f s: %s; every rank must run the same iterations", age, why);
        }
        /* Finalize is rare and not timed: back off to 10 ms sleeps rather than spin a core. */
        dear_sleep(pause);
        pause = pause < 0.01 ? pause * 2 : 0.01;
    }
    while (ctx->eng.pt.parked) {
        dear_run_t *r = ctx->eng.pt.parked;
        ctx->eng.pt.parked = r->next;
        dear_coll_free(r->req);
        free(r);
    }
    ctx->cm.keep = (int)mine[UNCLEAN];
    for (int p = 0; p < n; p++) {
        if (p == ctx->cm.rank)
            continue;
        if (theirs[p][ITER] != mine[ITER])
            DEAR_WARN("api", "dear_finalize: rank %d ran %lld iterations, this rank %lld", p, theirs[p][ITER],
                      mine[ITER]);
        if (theirs[p][STARTED] != mine[STARTED] || theirs[p][UNCLEAN])
            ctx->cm.keep = 1;
    }
    if (ctx->cm.keep)
        DEAR_INFO("api", "dear_finalize: a collective was left unfinished; the context's communicators stay "
                         "allocated, so that no later communicator can match its messages");
out:
    if (rc == DEAR_OK || rc == DEAR_ERR_NOMEM) { /* after an MPI error, posted messages may still use them */
        free(theirs);
        free(req);
    }
    free(arrived);
    free(idx);
    return rc;
}

int dear_finalize(dear_ctx_t **handle)
{
    int rc = DEAR_OK;
    DEAR_ARG_CHECK(handle != NULL, "dear_finalize: the handle is NULL (pass &ctx)");
    dear_ctx_t *ctx = *handle;
    if (!ctx)
        return DEAR_OK;
    /* Claimed and never released: the context is gone when it returns. */
    DEAR_CHECK(dear_rt_claim(ctx, "dear_finalize"));
    *handle = NULL;
    if (ctx->committed) {
        if (ctx->it.in_backward) {
            DEAR_WARN("api", "dear_finalize: called during backward of iteration %lld (%d of %d layers done); "
                             "the partial iteration is dropped",
                      ctx->it.iter, ctx->it.layers_done, ctx->reg.nlayers);
        } else {
            rc = dear_sched_flush(ctx, "dear_finalize");
        }
        dear_engine_stop(ctx);
        int rc3 = finalize_together(ctx);
        if (rc == DEAR_OK)
            rc = rc3;
        if (ctx->cfg.stats_print && ctx->cm.rank == 0)
            print_stats(ctx);
    }
    int rc2 = ctx_free(ctx);
    return rc != DEAR_OK ? rc : rc2;
}
