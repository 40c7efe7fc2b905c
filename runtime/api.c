/*
 * The lifetime of a context: dear_init (thread level, parameters, private communicator,
 * topology, timeline), dear_register (validation of each tensor), dear_commit (registry check
 * across ranks, plan, buckets, progress thread), dear_get_stats, dear_profile_save,
 * dear_plan_save and dear_finalize (flush, stop, report, free). The per-iteration hooks live in hooks.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/planfile.h"
#include "fusion/profile.h"
#include "runtime/check.h"
#include "runtime/params.h"
#include "runtime/rt.h"
#include "runtime/util.h"

static void layers_free(dear_ctx_t *ctx);

static int ctx_free(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    if (!ctx)
        return DEAR_OK;
    dear_model_free(ctx);
    free(ctx->tensors);
    layers_free(ctx);
    dear_samples_free(&ctx->iter_times);
    dear_samples_free(&ctx->verify_times);
    dear_plan_free(&ctx->prev_plan);
    dear_timeline_close(ctx->tl);
    dear_coll_topo_free(ctx->coll_topo);
    if (ctx->comm != MPI_COMM_NULL) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin && MPI_Comm_free(&ctx->comm) != MPI_SUCCESS)
            rc = DEAR_ERR_MPI;
    }
    pthread_cond_destroy(&ctx->done_cv);
    pthread_cond_destroy(&ctx->work_cv);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
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
        DEAR_ERROR("api", "dear_init: MPI provides thread level %d, libdear needs MPI_THREAD_MULTIPLE "
                          "(its progress thread calls MPI): initialise MPI with MPI_Init_thread(&argc, "
                          "&argv, MPI_THREAD_MULTIPLE, &provided) and check provided",
                   level);
        return DEAR_ERR_UNSUPPORTED;
    }
    /* Every rank must leave with the same verdict, or the others would hang in the collective
     * calls that follow: one all-reduce on the caller's communicator settles it. */
    rc = dear_params_load();
    DEAR_CHECK(agree(comm, rc, "a DEAR_* variable has a bad value"));

    DEAR_ALLOC_GOTO(ctx, calloc(1, sizeof *ctx), sizeof *ctx, rc, err);
    ctx->comm = MPI_COMM_NULL;
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_cond_init(&ctx->work_cv, NULL);
    pthread_cond_init(&ctx->done_cv, NULL);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_dup(comm, &ctx->comm), rc, err);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_rank(ctx->comm, &ctx->rank), rc, err);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_size(ctx->comm, &ctx->size), rc, err);
    dear_log_set_rank(ctx->rank);
    DEAR_CHECK_GOTO(dear_topo_detect(ctx->comm, &ctx->topo), rc, err);
    /* Hosts of several ranks each: the collectives may go in two levels (coll_hier.c). */
    DEAR_CHECK_GOTO(dear_coll_topo_create(ctx->comm, -1, &ctx->coll_topo), rc, err);

    ctx->sched = (dear_sched_t)dear_param_enum(DEAR_P_SCHEDULE);
    ctx->stats_print = (int)dear_param_int(DEAR_P_STATS);
    ctx->stall_warn_s = dear_param_double(DEAR_P_STALL_WARN_S);
    ctx->stall_abort_s = dear_param_double(DEAR_P_STALL_ABORT_S);
    ctx->max_inflight = (int)dear_param_int(DEAR_P_MAX_INFLIGHT);
    ctx->inflight_window = (size_t)dear_param_int(DEAR_P_INFLIGHT_BYTES);
    ctx->last_hook_lidx = -1;
    const char *tl = dear_param_string(DEAR_P_TIMELINE);
    if (tl && tl[0])
        rc = dear_timeline_open(tl, ctx->rank, &ctx->tl);
    DEAR_CHECK_GOTO(agree(ctx->comm, rc, "its DEAR_TIMELINE file cannot be opened"), rc, err);
    DEAR_INFO("api", "initialised on %d rank(s), schedule %s, fusion %s", ctx->size,
              dear_sched_name(ctx->sched), dear_param_string(DEAR_P_FUSION));
    *ctx_out = ctx;
    return DEAR_OK;
err:
    ctx_free(ctx);
    return rc;
}

static int name_taken(const dear_ctx_t *ctx, const char *name)
{
    for (int i = 0; i < ctx->ntensors; i++)
        if (strcmp(ctx->tensors[i].name, name) == 0)
            return 1;
    return 0;
}

int dear_register(dear_ctx_t *ctx, const char *name, int layer, void *grad, size_t count,
                  dear_dtype_t dtype, dear_mem_t mem, dear_update_fn update, void *arg)
{
    int rc = DEAR_OK;
    DEAR_ARG_CHECK(ctx != NULL, "dear_register: ctx is NULL");
    if (ctx->committed) {
        DEAR_ERROR("api", "dear_register('%s'): the context is already committed; register every "
                          "tensor before dear_commit",
                   name ? name : "(null)");
        return DEAR_ERR_STATE;
    }
    DEAR_ARG_CHECK(name != NULL && name[0] != '\0', "dear_register: name is NULL or empty");
    DEAR_ARG_CHECK(strlen(name) <= DEAR_NAME_MAX,
                   "dear_register: name '%.40s...' has %zu characters, at most %d are accepted", name,
                   strlen(name), DEAR_NAME_MAX);
    DEAR_ARG_CHECK(!name_taken(ctx, name), "dear_register('%s'): a tensor of that name is already registered",
                   name);
    if (mem == DEAR_MEM_CUDA) {
        DEAR_ERROR("api", "dear_register('%s'): CUDA memory is not supported in this build yet; "
                          "register host memory (DEAR_MEM_HOST)",
                   name);
        return DEAR_ERR_UNSUPPORTED;
    }
    DEAR_ARG_CHECK(mem == DEAR_MEM_HOST, "dear_register('%s'): memory kind %d unknown; accepted: "
                                         "DEAR_MEM_HOST (0), DEAR_MEM_CUDA (1)", name, (int)mem);
    DEAR_ARG_CHECK((unsigned)dtype < DEAR_DTYPE_COUNT, "dear_register('%s'): dtype %d unknown; accepted: "
                   "DEAR_FLOAT32, DEAR_FLOAT64, DEAR_BFLOAT16, DEAR_FLOAT16", name, (int)dtype);
    DEAR_ARG_CHECK(dtype != DEAR_INT32, "dear_register('%s'): int32 gradients cannot be averaged; "
                   "accepted: DEAR_FLOAT32, DEAR_FLOAT64, DEAR_BFLOAT16, DEAR_FLOAT16", name);
    /* An empty tensor would make an empty bucket, which the collectives and the plan reject;
     * a caller with nothing to synchronise simply does not register it. */
    DEAR_ARG_CHECK(count > 0, "dear_register('%s'): count is 0; register only tensors with elements", name);
    DEAR_ARG_CHECK(grad != NULL, "dear_register('%s'): grad is NULL", name);
    if (ctx->ntensors > 0 && layer < ctx->tensors[ctx->ntensors - 1].layer) {
        DEAR_ERROR("api", "dear_register('%s'): layer %d after layer %d; register tensors in forward "
                          "order with non-decreasing layer ids",
                   name, layer, ctx->tensors[ctx->ntensors - 1].layer);
        return DEAR_ERR_ARG;
    }
    if (ctx->ntensors == ctx->tensors_cap) {
        int cap = ctx->tensors_cap ? 2 * ctx->tensors_cap : 64;
        dear_tensor_t *t;
        DEAR_ALLOC_GOTO(t, realloc(ctx->tensors, sizeof *t * (size_t)cap), sizeof *t * (size_t)cap, rc, err);
        ctx->tensors = t;
        ctx->tensors_cap = cap;
    }
    dear_tensor_t *t = &ctx->tensors[ctx->ntensors];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->layer = layer;
    t->grad = grad;
    t->count = count;
    t->dtype = dtype;
    t->bytes = count * dear_dtype_size(dtype);
    t->update = update;
    t->arg = arg;
    ctx->ntensors++;
    return DEAR_OK;
err:
    return rc;
}

static void layers_free(dear_ctx_t *ctx)
{
    for (int l = 0; ctx->fwd_times && l < ctx->nlayers; l++)
        dear_samples_free(&ctx->fwd_times[l]);
    for (int l = 0; ctx->bwd_times && l < ctx->nlayers; l++)
        dear_samples_free(&ctx->bwd_times[l]);
    free(ctx->fwd_times);
    free(ctx->bwd_times);
    free(ctx->layers);
    ctx->fwd_times = ctx->bwd_times = NULL;
    ctx->layers = NULL;
    ctx->nlayers = 0;
}

static int build_layers(dear_ctx_t *ctx)
{
    int rc = DEAR_OK, n = 0;
    for (int i = 0; i < ctx->ntensors; i++)
        if (i == 0 || ctx->tensors[i].layer != ctx->tensors[i - 1].layer)
            n++;
    DEAR_ALLOC_GOTO(ctx->layers, calloc((size_t)n, sizeof *ctx->layers), sizeof *ctx->layers * (size_t)n, rc, err);
    DEAR_ALLOC_GOTO(ctx->fwd_times, calloc((size_t)n, sizeof *ctx->fwd_times), sizeof *ctx->fwd_times * (size_t)n,
                    rc, err);
    DEAR_ALLOC_GOTO(ctx->bwd_times, calloc((size_t)n, sizeof *ctx->bwd_times), sizeof *ctx->bwd_times * (size_t)n,
                    rc, err);
    ctx->nlayers = n;
    n = -1;
    for (int i = 0; i < ctx->ntensors; i++) {
        if (i == 0 || ctx->tensors[i].layer != ctx->tensors[i - 1].layer) {
            n++;
            ctx->layers[n].id = ctx->tensors[i].layer;
            ctx->layers[n].t0 = i;
            ctx->layers[n].bwd_iter = -1;
        }
        ctx->layers[n].t1 = i + 1;
        ctx->tensors[i].lidx = n;
    }
    return DEAR_OK;
err:
    return rc;
}

int dear_commit(dear_ctx_t *ctx)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_commit: ctx is NULL");
    if (ctx->committed) {
        DEAR_ERROR("api", "dear_commit: the context is already committed (call it once, after the last "
                          "dear_register)");
        return DEAR_ERR_STATE;
    }
    /* The check is collective and runs before anything is built, so every rank leaves here
     * with the same verdict. */
    DEAR_CHECK(dear_model_check(ctx));
    if (ctx->ntensors == 0) {
        DEAR_ERROR("api", "dear_commit: no tensor registered; call dear_register for each gradient first");
        return DEAR_ERR_STATE;
    }
    int rc = build_layers(ctx);
    if (rc == DEAR_OK)
        rc = dear_planning_setup(ctx);
    if (rc == DEAR_OK)
        rc = dear_model_build(ctx);
    if (rc == DEAR_OK)
        rc = dear_engine_start(ctx);
    if (rc != DEAR_OK) {
        /* Back to the registered state, so a corrected environment can commit again. */
        dear_model_free(ctx);
        layers_free(ctx);
        return rc;
    }
    ctx->committed = 1;
    ctx->t_commit = dear_now();
    return DEAR_OK;
}

int dear_get_stats(dear_ctx_t *ctx, dear_stats_t *stats)
{
    DEAR_ARG_CHECK(ctx != NULL && stats != NULL, "dear_get_stats: %s is NULL", ctx ? "stats" : "ctx");
    dear_stats_t s = { 0 };
    s.iterations = (uint64_t)ctx->iter;
    s.blocked_s = ctx->blocked_s;
    s.last_iter_s = ctx->iter_times.n ? ctx->iter_times.v[ctx->iter_times.n - 1] : 0;
    s.median_iter_s = ctx->iter_times.n >= 1 && ctx->iter >= 2 ? dear_samples_median(&ctx->iter_times) : 0;
    pthread_mutex_lock(&ctx->lock);
    s.bytes_sent = ctx->bytes_sent;
    s.progress_cpu_s = ctx->progress_cpu_s;
    pthread_mutex_unlock(&ctx->lock);
    *stats = s;
    return DEAR_OK;
}

/* Medians per layer, the slowest rank's (MAX all-reduce): a plan must fit the slowest worker.
 * The communicator is quiet here (flushed, nothing queued), so this one call outside the
 * progress thread cannot interleave with its collectives. */
int dear_profile_save(dear_ctx_t *ctx, const char *path)
{
    int rc = DEAR_OK;
    double *med = NULL, *all = NULL;
    dear_profile_t prof;
    DEAR_ARG_CHECK(ctx != NULL && path != NULL && path[0], "dear_profile_save: %s is NULL or empty",
                   ctx ? "path" : "ctx");
    if (!ctx->committed || ctx->in_backward) {
        DEAR_ERROR("api", "dear_profile_save('%s'): %s", path,
                   ctx->committed ? "called during the backward pass; call it between iterations"
                                  : "the context is not committed; call it after training iterations");
        return DEAR_ERR_STATE;
    }
    DEAR_CHECK(dear_hooks_flush(ctx, "dear_profile_save"));
    size_t bytes = sizeof(double) * 2 * (size_t)ctx->nlayers;
    DEAR_ALLOC_GOTO(med, malloc(bytes), bytes, rc, out);
    DEAR_ALLOC_GOTO(all, malloc(bytes), bytes, rc, out);
    for (int l = 0; l < ctx->nlayers; l++) {
        med[2 * l] = dear_samples_median(&ctx->fwd_times[l]);
        med[2 * l + 1] = dear_samples_median(&ctx->bwd_times[l]);
    }
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(med, all, 2 * ctx->nlayers, MPI_DOUBLE, MPI_MAX, ctx->comm), rc, out);
    if (ctx->rank == 0) {
        dear_prof_init(&prof, "dear");
        for (int l = 0; l < ctx->nlayers && rc == DEAR_OK; l++)
            rc = dear_prof_add_layer(&prof, ctx->layers[l].id, all[2 * l], all[2 * l + 1]);
        for (int t = 0; t < ctx->ntensors && rc == DEAR_OK; t++) {
            char name[DEAR_NAME_MAX + 1];
            snprintf(name, sizeof name, "%s", ctx->tensors[t].name);
            for (char *c = name; *c; c++) /* the text format has no blanks in names */
                if (*c == ' ' || *c == '\t' || *c == '\n')
                    *c = '_';
            rc = dear_prof_add_tensor(&prof, name, ctx->tensors[t].layer, ctx->tensors[t].bytes);
        }
        char msg[256];
        if (rc == DEAR_OK && (rc = dear_prof_check(&prof, msg, sizeof msg)) != DEAR_OK)
            DEAR_ERROR("api", "dear_profile_save('%s'): profile rejected: %s", path, msg);
        if (rc == DEAR_OK)
            rc = dear_prof_save(&prof, path);
        dear_prof_free(&prof);
    }
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&rc, 1, MPI_INT, 0, ctx->comm), rc, out);
out:
    free(med);
    free(all);
    return rc;
}

int dear_plan_save(dear_ctx_t *ctx, const char *path)
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
    rc = dear_planfile_save(path, &ctx->plan, desc, names);
out:
    free(desc);
    free(names);
    return rc;
}

static void print_stats(dear_ctx_t *ctx)
{
    dear_stats_t s;
    if (dear_get_stats(ctx, &s) != DEAR_OK)
        return;
    double wall = dear_now() - ctx->t_commit;
    pthread_mutex_lock(&ctx->lock);
    double busbytes = ctx->busbytes, busy = ctx->busy_s;
    pthread_mutex_unlock(&ctx->lock);
    fprintf(stderr,
            "[dear 0] stats: %llu iterations, median iteration %.3f ms, blocked %.3f s, %.3f MB sent by rank 0, "
            "busbw %.1f MB/s over %.3f s of communication, progress thread CPU %.3f s (%.1f%% of %.3f s wall), "
            "schedule %s, %d bucket(s)\n",
            (unsigned long long)s.iterations, 1e3 * s.median_iter_s, s.blocked_s, 1e-6 * (double)s.bytes_sent,
            busy > 0 ? 1e-6 * busbytes / busy : 0.0, busy, s.progress_cpu_s,
            wall > 0 ? 100.0 * s.progress_cpu_s / wall : 0.0, wall, dear_sched_name(ctx->sched), ctx->nbuckets);
}

int dear_finalize(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    if (!ctx)
        return DEAR_OK;
    if (ctx->committed) {
        if (ctx->in_backward) {
            DEAR_WARN("api", "dear_finalize: called during backward of iteration %lld (%d of %d layers done); "
                             "the partial iteration is dropped",
                      ctx->iter, ctx->layers_done, ctx->nlayers);
        } else {
            rc = dear_hooks_flush(ctx, "dear_finalize");
        }
        dear_engine_stop(ctx);
        if (ctx->stats_print && ctx->rank == 0)
            print_stats(ctx);
    }
    int rc2 = ctx_free(ctx);
    return rc != DEAR_OK ? rc : rc2;
}
