/*
 * The runtime end to end, under mpirun -np 1..4 (Check, CK_FORK=no). A synthetic model of 60
 * tensors (1 element to 3 MiB, odd counts, a few float64 among float32, 40 layers with
 * non-contiguous ids) is trained with SGD for 20 iterations under every schedule x fusion
 * setting, with its gradients in one arena (zero-copy buckets) and in separate allocations
 * (fusion buffers). Gradients are integer-valued and their per-rank offsets sum to zero, so the
 * average is exact and the parameters must match, bit for bit, a reference loop that uses plain
 * MPI_Allreduce. Also: update counts per schedule (exactly once per tensor per iteration, at
 * the documented hook), flush, registry mismatch on every rank with the message, bad
 * parameters, calls out of order, collectives abandoned in flight after an error, the stall
 * warning, a plan file whose all-gather groups cut across buckets (and, under dear, which updates
 * each forward_begin runs: those of every layer its groups bring in whole), the profile file.
 *
 * Modes (argv[1]): none = the Check suite; "train" = a short training run with the
 * environment's DEAR_* settings (timeline test); "engine" = calls out of order, one training
 * run per schedule with the large tensors capped, and the stall warning (for valgrind);
 * "stall-abort" = DEAR_STALL_ABORT_S must abort the job (runtime-stall-abort.sh); "abandon" =
 * the abandoned collectives alone (runtime-abandon-*.mpi, under conditions that make them last);
 * "thread-single" = dear_init under MPI_THREAD_SINGLE must fail with DEAR_ERR_UNSUPPORTED.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <mpi.h>
#include <stdint.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/sched_table.h"
#include "cuda/cuda.h"
#include "fusion/planfile.h"
#include "include/dear.h"
#ifdef DEAR_TEST_MEM_DELAY
#include "tests/mpi/mem_delay.h"
#endif
#include "base/log.h"
#include "base/params.h"
#include "tests/mpi/synth.h"
#include "tests/mpi/np_check.h"

#define NT 60
#define ITERS 20

static int rank, nranks;
static int small_model;     /* "engine" mode: largest tensors capped, for valgrind */

/* ---- the synthetic model ---- */

typedef struct {
    tensor_t t[NT];
    int arena;
    void *arena_mem;
    int nlayers, layer_ids[NT];
    long long layer_first[NT], layer_last[NT];
} model_t;

static size_t tensor_count(int i)
{
    if (small_model && (i == 17 || i == 41))
        return 4099;
    if (i == 17)
        return 786433;      /* 3 MiB of float32 */
    if (i == 41)
        return 131075;      /* 0.5 MiB of float32 */
    if (i == 0 || i == 59)
        return 1;
    return 1 + 2 * (size_t)((i * 37) % 1000);   /* odd, up to 1999 */
}

static void model_init(model_t *m, int arena)
{
    memset(m, 0, sizeof *m);
    m->arena = arena;
    size_t total = 0;
    for (int i = 0; i < NT; i++) {
        tensor_t *t = &m->t[i];
        snprintf(t->name, sizeof t->name, "t%02d.%s", i, i % 3 ? "weight" : "bias");
        t->layer = 7 + 2 * (i * 2 / 3);
        t->count = tensor_count(i);
        t->dtype = (i % 13 == 5) ? DEAR_FLOAT64 : DEAR_FLOAT32;
        total = (total + 7) & ~(size_t)7;
        total += t->count * esize(t->dtype);
    }
    if (arena) {
        m->arena_mem = calloc(1, total + 8);
        ck_assert_ptr_nonnull(m->arena_mem);
    }
    size_t off = 0;
    for (int i = 0; i < NT; i++) {
        tensor_t *t = &m->t[i];
        size_t bytes = t->count * esize(t->dtype);
        /* float32 tensors pack back to back; a float64 one is aligned (which cuts contiguity
         * only where the type changes anyway). */
        if (t->dtype == DEAR_FLOAT64)
            off = (off + 7) & ~(size_t)7;
        t->grad = arena ? (char *)m->arena_mem + off : calloc(1, bytes);
        off += bytes;
        t->param = calloc(1, bytes);
        ck_assert_ptr_nonnull(t->grad);
        ck_assert_ptr_nonnull(t->param);
        for (size_t j = 0; j < t->count; j++) {
            double v = (double)((i * 3 + (int)j) % 17) - 8;
            if (t->dtype == DEAR_FLOAT64)
                ((double *)t->param)[j] = v;
            else
                ((float *)t->param)[j] = (float)v;
        }
    }
    m->nlayers = 0;
    for (int i = 0; i < NT; i++) {
        if (i == 0 || m->t[i].layer != m->t[i - 1].layer) {
            m->layer_ids[m->nlayers] = m->t[i].layer;
            m->layer_first[m->nlayers] = i;
            m->nlayers++;
        }
        m->layer_last[m->nlayers - 1] = i;
    }
}

static void model_free(model_t *m)
{
    for (int i = 0; i < NT; i++) {
        if (!m->arena)
            free(m->t[i].grad);
        free(m->t[i].param);
    }
    free(m->arena_mem);
}

/* Integer-valued gradient depending on the parameter; the rank offsets
 * ((rank + j) % P) - (P - 1) / 2 sum to zero over ranks, so the average is exactly v. */
static double grad_value(int i, size_t j, int iter, double p)
{
    long long v = ((long long)j * 7 + i * 13 + iter * 5 + (long long)floor(p)) % 9;
    if (v < 0)
        v += 9;
    return (double)(v - 4) + (double)((rank + (long long)j) % nranks) - 0.5 * (nranks - 1);
}

static void compute_grads(model_t *m, int i, int iter, void *dst)
{
    tensor_t *t = &m->t[i];
    for (size_t j = 0; j < t->count; j++) {
        if (t->dtype == DEAR_FLOAT64)
            ((double *)dst)[j] = grad_value(i, j, iter, ((double *)t->param)[j]);
        else
            ((float *)dst)[j] = (float)grad_value(i, j, iter, ((float *)t->param)[j]);
    }
}

/* The reference: the same loop with a blocking MPI_Allreduce per tensor. */
static void reference_train(model_t *m, int iters)
{
    for (int k = 0; k < iters; k++)
        for (int i = NT - 1; i >= 0; i--) {
            tensor_t *t = &m->t[i];
            compute_grads(m, i, k, t->grad);
            reference_step(t, nranks);
        }
}

static uint64_t model_hash(const model_t *m)
{
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < NT; i++) {
        const unsigned char *p = m->t[i].param;
        for (size_t b = 0; b < m->t[i].count * esize(m->t[i].dtype); b++)
            h = (h ^ p[b]) * 1099511628211ULL;
    }
    return h;
}

static void register_model(dear_ctx_t *ctx, model_t *m)
{
    for (int i = 0; i < NT; i++) {
        tensor_t *t = &m->t[i];
        ck_assert_int_eq(dear_register(ctx, t->name, t->layer, t->grad, t->count, t->dtype, DEAR_MEM_HOST,
                                       update_cb, t),
                         DEAR_OK);
    }
}

/* A context with the model (its gradients in one arena) registered and committed. */
static dear_ctx_t *model_committed(model_t *m)
{
    dear_ctx_t *ctx = NULL;
    model_init(m, 1);
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    register_model(ctx, m);
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    return ctx;
}

/* Under dear with known groups: after forward_begin(l), exactly the tensors of the layers whose
 * last unit lies in a group up to layer l's last one have had their updates run (the layer's own,
 * those before it, and the later ones its groups brought in whole); every other tensor's count is
 * as the iteration began. */
static void check_group_rule(const model_t *m, const int *group_of_tensor, int l, int k, const int *before)
{
    int gl = group_of_tensor[m->layer_last[l]];
    for (int j = 0; j < m->nlayers; j++)
        for (long long i = m->layer_first[j]; i <= m->layer_last[j]; i++) {
            int ran = group_of_tensor[m->layer_last[j]] <= gl;
            ck_assert_msg(m->t[i].updates == (ran ? k : before[i]),
                          "iteration %d, after forward_begin of layer %d (group %d): tensor %lld of layer %d "
                          "(group %d) has %d update(s), expected %d",
                          k, m->layer_ids[l], gl, i, m->layer_ids[j], group_of_tensor[m->layer_last[j]],
                          (int)m->t[i].updates, ran ? k : before[i]);
        }
}

/* One training iteration through the hooks, checking when updates have run. */
static void dear_iteration(dear_ctx_t *ctx, model_t *m, int k, const char *sched, const int *group_of_tensor)
{
    int deferred = strcmp(sched, "dear") == 0, before[NT];
    for (int i = 0; i < NT; i++)
        before[i] = m->t[i].updates;
    for (int l = 0; l < m->nlayers; l++) {
        ck_assert_int_eq(dear_forward_begin(ctx, m->layer_ids[l]), DEAR_OK);
        /* dear: the layer's updates of iterations 0..k-1 have run now; wfbp/sync: at backward_end. */
        for (long long i = m->layer_first[l]; i <= m->layer_last[l]; i++)
            ck_assert_int_eq(m->t[i].updates, k);
        if (deferred && group_of_tensor)
            check_group_rule(m, group_of_tensor, l, k, before);
    }
    for (int l = m->nlayers - 1; l >= 0; l--) {
        for (long long i = m->layer_last[l]; i >= m->layer_first[l]; i--)
            compute_grads(m, (int)i, k, m->t[i].grad);
        ck_assert_int_eq(dear_backward_done(ctx, m->layer_ids[l]), DEAR_OK);
    }
    ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    for (int i = 0; i < NT; i++)
        ck_assert_int_eq(m->t[i].updates, deferred ? k : k + 1);
}

/* group_of_tensor: the all-gather group of each tensor (one unit each) of the plan file in use,
 * whose per-group update rule is then checked; NULL for a plan the test does not know. */
static void train_and_compare(const char *sched, const char *fusion, const char *threshold, int arena,
                              const int *group_of_tensor)
{
    setenv("DEAR_SCHEDULE", sched, 1);
    setenv("DEAR_FUSION", fusion, 1);
    if (threshold)
        setenv("DEAR_FUSION_THRESHOLD", threshold, 1);
    else
        unsetenv("DEAR_FUSION_THRESHOLD");

    /* The reference does not depend on the schedule: computed once per process. */
    static model_t ref;
    static int ref_ready;
    model_t m;
    model_init(&m, arena);
    if (!ref_ready) {
        model_init(&ref, 0);
        reference_train(&ref, ITERS);
        ref_ready = 1;
    }
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    register_model(ctx, &m);
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    for (int k = 0; k < ITERS; k++) {
        dear_iteration(ctx, &m, k, sched, group_of_tensor);
        if (k == ITERS / 2 - 1) {
            /* An evaluation point mid-training: everything applied, then training goes on. */
            ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
            for (int i = 0; i < NT; i++)
                ck_assert_int_eq(m.t[i].updates, k + 1);
            ck_assert_int_eq(dear_flush(ctx), DEAR_OK); /* a second flush has nothing to do */
            for (int i = 0; i < NT; i++)
                ck_assert_int_eq(m.t[i].updates, k + 1);
        }
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    for (int i = 0; i < NT; i++)
        ck_assert_int_eq(m.t[i].updates, ITERS);
    dear_stats_t st;
    ck_assert_int_eq(dear_get_stats(ctx, &st), DEAR_OK);
    ck_assert_int_eq((int)st.iterations, ITERS);
    ck_assert(st.median_iter_s > 0);
    if (nranks > 1)
        ck_assert(st.bytes_sent > 0);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    for (int i = 0; i < NT; i++)
        ck_assert_int_eq(m.t[i].updates, ITERS);

    for (int i = 0; i < NT; i++)
        ck_assert_msg(memcmp(m.t[i].param, ref.t[i].param, m.t[i].count * esize(m.t[i].dtype)) == 0,
                      "%s/%s/%s/%s: tensor %d differs from the MPI_Allreduce reference", sched, fusion,
                      threshold ? threshold : "default", arena ? "arena" : "separate", i);
    uint64_t h = model_hash(&m), hmin, hmax;
    MPI_Allreduce(&h, &hmin, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hmax, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    ck_assert_msg(hmin == hmax, "parameters differ across ranks");
    model_free(&m);
    unsetenv("DEAR_SCHEDULE");
    unsetenv("DEAR_FUSION");
    unsetenv("DEAR_FUSION_THRESHOLD");
}

/* schedule x fusion x layout, one Check loop test per combination */
static const struct { const char *fusion, *threshold; } fusions[] = {
    { "none", NULL }, { "threshold", "20000" }, { "threshold", NULL },
};

START_TEST(test_train)
{
    int s = _i / 6, f = (_i / 2) % 3, arena = _i % 2;
    train_and_compare(dear_sched_name((dear_sched_t)s), fusions[f].fusion, fusions[f].threshold, arena, NULL);
}
END_TEST

/* A plan from a file (DEAR_PLAN_FILE) whose all-gather groups cut across the reduce-scatter
 * buckets: groups span several buckets and parts of one (the multi-block all-gather); none, half
 * or all of the groups run early (during backward, behind the bucket completing their data), or
 * every other one from the first (not a trailing run: a bucket then completes early groups and
 * groups left for the forward). */
START_TEST(test_planfile)
{
    int arena = _i % 2, early = _i / 2;
    model_t m;
    model_init(&m, 0);
    dear_tensor_desc_t desc[NT];
    const char *names[NT];
    for (int i = 0; i < NT; i++) {
        desc[i].bytes = m.t[i].count * esize(m.t[i].dtype);
        desc[i].layer = m.t[i].layer;
        names[i] = m.t[i].name;
    }
    int rs[NT + 1], ag[NT + 1], nrs = 0, nag = 0;
    for (int i = 0; i < NT; i += 7)
        rs[nrs++] = i;
    rs[nrs] = NT;
    for (int i = 0; i < NT; i += (nag % 2 ? 3 : 11))
        ag[nag++] = i;
    ag[nag] = NT;
    /* The runtime's groups: the file's, each cut where the element type changes (one type a
     * collective). */
    int group[NT], ng = -1;
    for (int g = 0; g < nag; g++)
        for (int i = ag[g]; i < ag[g + 1]; i++)
            group[i] = i == ag[g] || m.t[i].dtype != m.t[i - 1].dtype ? ++ng : ng;
    dear_plan_t plan = { 0 };
    ck_assert_int_eq(dear_partition_set(&plan.rs, NT, nrs, rs), DEAR_OK);
    ck_assert_int_eq(dear_partition_set(&plan.ag, NT, nag, ag), DEAR_OK);
    plan.nunits = plan.ntensors = NT;
    plan.ag_early = early == 0 ? 0 : early == 1 ? nag / 2 : nag;
    if (early == 3) {
        unsigned char mark[NT + 1];
        for (int g = 0; g < nag; g++)
            mark[g] = g % 2 == 0;
        ck_assert_int_eq(dear_plan_set_early(&plan, mark), DEAR_OK);
        ck_assert_ptr_nonnull(plan.early);
        ck_assert_int_eq(plan.ag_early, (nag + 1) / 2);
    }
    snprintf(plan.planner, sizeof plan.planner, "test");
    char path[64] = "/tmp/dear-test-plan-XXXXXX";
    if (rank == 0) {
        int fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        close(fd);
        ck_assert_int_eq(dear_planfile_save(path, &plan, desc, names), DEAR_OK);
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    dear_plan_free(&plan);
    model_free(&m);
    setenv("DEAR_PLAN_FILE", path, 1);
    train_and_compare("dear", "threshold", NULL, arena, group);
    setenv("DEAR_PLAN_FILE", path, 1);
    train_and_compare("wfbp", "threshold", NULL, arena, group);
    /* The plan of another model: commit fails on every rank saying what does not fit, not that
     * the ranks disagree. */
    if (_i == 0) {
        dear_ctx_t *ctx = NULL;
        float x[3];
        ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
        ck_assert_int_eq(dear_register(ctx, "x", 0, x, 3, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_OK);
        capture_start();
        int rc = dear_commit(ctx);
        capture_stop();
        ck_assert_int_eq(rc, DEAR_ERR_MISMATCH);
        ck_assert_msg(strstr(logbuf, "does not fit the registered tensors") != NULL, "log: %s", logbuf);
        ck_assert_msg(strstr(logbuf, "ranks disagree") == NULL, "log: %s", logbuf);
        ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    }
    unsetenv("DEAR_PLAN_FILE");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        unlink(path);
}
END_TEST

/* ---- mismatch ---- */

static void mismatch_case(int which, const char *field, const char *value0, const char *value1)
{
    model_t m;
    model_init(&m, 1);
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    int odd = rank == nranks - 1;
    for (int i = 0; i < NT; i++) {
        tensor_t *t = &m.t[i];
        size_t count = t->count;
        const char *name = t->name;
        if (odd && which == 0 && i == 3)
            count = t->count - 2;   /* a shorter view: the buffers must not overlap */
        if (odd && which == 1 && i == 4)
            name = "renamed";
        ck_assert_int_eq(dear_register(ctx, name, t->layer, t->grad, count, t->dtype, DEAR_MEM_HOST, update_cb, t),
                         DEAR_OK);
    }
    float extra = 0;
    if (odd && which == 2)
        ck_assert_int_eq(dear_register(ctx, "extra", 1000, &extra, 1, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL),
                         DEAR_OK);
    capture_start();
    double t0 = MPI_Wtime();
    int rc = dear_commit(ctx);
    double dt = MPI_Wtime() - t0;
    ck_assert_int_eq(rc, DEAR_ERR_MISMATCH);
    ck_assert_msg(dt < 5, "mismatch took %.1f s", dt);
    ck_assert_msg(strstr(logbuf, field) != NULL, "no '%s' in: %s", field, logbuf);
    ck_assert_msg(strstr(logbuf, value0) != NULL, "no '%s' in: %s", value0, logbuf);
    ck_assert_msg(strstr(logbuf, value1) != NULL, "no '%s' in: %s", value1, logbuf);
    char want[64];
    snprintf(want, sizeof want, "rank %d", nranks - 1);
    ck_assert_msg(strstr(logbuf, want) != NULL, "no '%s' in: %s", want, logbuf);
    /* A failed commit leaves the context usable for nothing but finalize. */
    ck_assert_int_eq(dear_forward_begin(ctx, 7), DEAR_ERR_STATE);
    capture_stop();
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);
}

START_TEST(test_mismatch)
{
    if (nranks < 2)
        return;
    char c0[32], c1[32];
    snprintf(c0, sizeof c0, "is %zu", tensor_count(3));
    snprintf(c1, sizeof c1, "but %zu", tensor_count(3) - 2);
    mismatch_case(0, "index 3", c0, c1);
    mismatch_case(0, "field count", c0, c1);
    mismatch_case(1, "field name", "'t04.weight'", "'renamed'");
    mismatch_case(2, "index 60", "registered 60 tensor(s)", "'extra'");
}
END_TEST

/* ---- parameters ---- */

static void bad_param(const char *var, const char *value, int want_init, int want_commit)
{
    setenv(var, value, 1);
    dear_ctx_t *ctx = NULL;
    capture_start();
    int rc = dear_init(MPI_COMM_WORLD, &ctx);
    capture_stop();
    ck_assert_int_eq(rc, want_init);
    if (rc != DEAR_OK) {
        ck_assert_ptr_null(ctx);
        ck_assert_msg(strstr(logbuf, var) != NULL && strstr(logbuf, value) != NULL,
                      "message does not name %s=%s: %s", var, value, logbuf);
    } else {
        model_t m;
        model_init(&m, 0);
        register_model(ctx, &m);
        capture_start();
        rc = dear_commit(ctx);
        capture_stop();
        ck_assert_int_eq(rc, want_commit);
        ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
        model_free(&m);
    }
    unsetenv(var);
}

START_TEST(test_params)
{
    bad_param("DEAR_SCHEDULE", "bogus", DEAR_ERR_PARAM, 0);
    bad_param("DEAR_FUSION_THRESHOLD", "12x", DEAR_ERR_PARAM, 0);
    bad_param("DEAR_MAX_INFLIGHT", "0", DEAR_ERR_PARAM, 0);
    bad_param("DEAR_STALL_WARN_S", "-1", DEAR_ERR_PARAM, 0);
    bad_param("DEAR_FUSION", "bogus", DEAR_ERR_PARAM, 0);
    /* A bad value on one rank only still fails init on every rank, quickly (no hang). */
    if (nranks > 1) {
        if (rank == 1)
            setenv("DEAR_SCHEDULE", "bogus", 1);
        dear_ctx_t *c1 = NULL;
        capture_start();
        int rc = dear_init(MPI_COMM_WORLD, &c1);
        capture_stop();
        ck_assert_int_eq(rc, DEAR_ERR_PARAM);
        ck_assert_ptr_null(c1);
        ck_assert_msg(strstr(logbuf, rank == 1 ? "DEAR_SCHEDULE" : "rank 1 failed") != NULL, "log: %s", logbuf);
        unsetenv("DEAR_SCHEDULE");
    }
    /* after the failures a good environment works again */
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
}
END_TEST

/* ---- calls out of order ---- */

#define EXPECT(call, code, text)                                                                   \
    do {                                                                                           \
        capture_start();                                                                           \
        int rc_ = (call);                                                                          \
        capture_stop();                                                                            \
        ck_assert_int_eq(rc_, code);                                                               \
        ck_assert_msg(strstr(logbuf, text) != NULL, "%s: no '%s' in: %s", #call, text, logbuf);    \
    } while (0)

START_TEST(test_order)
{
    model_t m;
    model_init(&m, 1);
    dear_ctx_t *ctx = NULL;
    float x[4];
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    EXPECT(dear_forward_begin(ctx, 7), DEAR_ERR_STATE, "not committed");
    /* A host pointer registered as CUDA memory: a build without CUDA says so, a machine without a
     * GPU that nothing can tell, one with a GPU that it is host memory. */
    int ndev = 0, cuda = dear_cuda_built(), gpu = cuda && dear_cuda_device_count(&ndev) == DEAR_OK && ndev > 0;
    EXPECT(dear_register(ctx, "x", 1, x, 4, DEAR_FLOAT32, DEAR_MEM_CUDA, NULL, NULL),
           !cuda ? DEAR_ERR_UNSUPPORTED : gpu ? DEAR_ERR_ARG : DEAR_ERR_CUDA,
           !cuda ? "built without CUDA" : gpu ? "is host memory" : "cannot say what grad is");
    EXPECT(dear_register(ctx, NULL, 1, x, 4, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_ERR_ARG, "name");
    EXPECT(dear_register(ctx, "x", 1, x, 0, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_ERR_ARG, "count is 0");
    EXPECT(dear_register(ctx, "x", 1, x, 4, DEAR_INT32, DEAR_MEM_HOST, NULL, NULL), DEAR_ERR_ARG, "int32");
    EXPECT(dear_register(ctx, "x", 1, x, 4, (dear_dtype_t)42, DEAR_MEM_HOST, NULL, NULL), DEAR_ERR_ARG, "dtype 42");
    register_model(ctx, &m);
    EXPECT(dear_register(ctx, "t04.weight", 500, x, 4, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_ERR_ARG,
           "already registered");
    EXPECT(dear_register(ctx, "late", 1, x, 4, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_ERR_ARG,
           "non-decreasing");
    /* Aliased buffers: a tensor sharing bytes with one already registered (here the second half
     * of the second tensor's gradient) would be reduced and updated twice. */
    float *alias = (float *)m.t[1].grad + m.t[1].count / 2;
    EXPECT(dear_register(ctx, "alias", 500, alias, 4, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_ERR_ARG,
           "overlaps that of tensor 't01.weight'");
    /* A byte count that wraps: SIZE_MAX/4 + 2 floats would be 4 bytes. */
    EXPECT(dear_register(ctx, "huge", 500, x, SIZE_MAX / 4 + 2, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL),
           DEAR_ERR_ARG, "more than the address space holds");
    EXPECT(dear_backward_end(ctx), DEAR_ERR_STATE, "not committed");
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    EXPECT(dear_register(ctx, "late", 500, x, 4, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_ERR_STATE,
           "already committed");
    EXPECT(dear_commit(ctx), DEAR_ERR_STATE, "already committed");
    EXPECT(dear_forward_begin(ctx, 8), DEAR_ERR_ARG, "unknown layer id");
    EXPECT(dear_backward_done(ctx, 100000), DEAR_ERR_ARG, "unknown layer id");
    EXPECT(dear_backward_end(ctx), DEAR_ERR_STATE, "only 0 of");
    int last = m.layer_ids[m.nlayers - 1];
    ck_assert_int_eq(dear_backward_done(ctx, last), DEAR_OK);
    EXPECT(dear_backward_done(ctx, last), DEAR_ERR_STATE, "twice");
    EXPECT(dear_forward_begin(ctx, 7), DEAR_ERR_STATE, "during the backward pass");
    EXPECT(dear_flush(ctx), DEAR_ERR_STATE, "during the backward pass");
    EXPECT(dear_backward_end(ctx), DEAR_ERR_STATE, "only 1 of");
    for (int l = m.nlayers - 2; l >= 0; l--)
        ck_assert_int_eq(dear_backward_done(ctx, m.layer_ids[l]), DEAR_OK);
    ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    EXPECT(dear_backward_end(ctx), DEAR_ERR_STATE, "only 0 of");
    /* A backward with only its own layer's forward hook: the other pending updates run first,
     * with a warning (their gradients were not written yet). */
    ck_assert_int_eq(dear_forward_begin(ctx, last), DEAR_OK);
    EXPECT(dear_backward_done(ctx, last), DEAR_OK, "still pending");
    for (int i = 0; i < NT; i++)
        ck_assert_int_eq(m.t[i].updates, 1);
    for (int l = m.nlayers - 2; l >= 0; l--)
        ck_assert_int_eq(dear_backward_done(ctx, m.layer_ids[l]), DEAR_OK);
    ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    if (strcmp(dear_schedule(ctx), "dear") == 0) {
        /* A backward without its forward (two backward passes through one forward): the gradient
         * just written shares its buffer with an all-gather still pending, so it is lost: the
         * call fails, and so does every later one, never a silent wrong result. */
        EXPECT(dear_backward_done(ctx, last), DEAR_ERR_STATE, "overwritten and lost");
        EXPECT(dear_backward_done(ctx, m.layer_ids[0]), DEAR_ERR_STATE, "stopped after an earlier error");
        dear_finalize(&ctx);
        ck_assert_ptr_null(ctx);
        model_free(&m);
        return;
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    for (int i = 0; i < NT; i++)
        ck_assert_int_eq(m.t[i].updates, 2);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    /* finalize clears the handle, so a second finalize of it is harmless (not a use after free) */
    ck_assert_ptr_null(ctx);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    ck_assert_int_eq(dear_finalize(NULL), DEAR_ERR_ARG);
    model_free(&m);
}
END_TEST

/* ---- collectives abandoned after an error ---- */

/* The engine stops on an error with all-gathers in flight (here: a backward without its forward,
 * ranks reaching it at different moments). After dear_finalize returns, no message may still
 * write the registered buffers (the program frees or reuses them at once), nor the library's
 * own, freed by then (the heap's checks, or ASan, see those). */
START_TEST(test_abandon)
{
    if (nranks < 2)
        return;
    for (int rep = 0; rep < 12; rep++) {
        model_t m;
        dear_ctx_t *ctx = model_committed(&m);
        dear_iteration(ctx, &m, 0, dear_schedule(ctx), NULL);
        if (strcmp(dear_schedule(ctx), "dear") != 0) {
            ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
            model_free(&m);
            return;
        }
        usleep((useconds_t)(((rank + rep) % nranks) * 700 * (rep % 3)));
        capture_start();
        int rc = dear_backward_done(ctx, m.layer_ids[m.nlayers - 1]);
        capture_stop();
        ck_assert_int_eq(rc, DEAR_ERR_STATE);
        dear_finalize(&ctx);
        ck_assert_ptr_null(ctx);
        /* The program owns its buffers again: mark them, let MPI progress, and look. */
        for (int i = 0; i < NT; i++)
            memset(m.t[i].grad, 0x5a, m.t[i].count * esize(m.t[i].dtype));
        for (int k = 0; k < 5; k++) {
            int flag;
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
            usleep(2000);
        }
        for (int i = 0; i < NT; i++) {
            const unsigned char *g = m.t[i].grad;
            size_t bytes = m.t[i].count * esize(m.t[i].dtype), bad = bytes;
            for (size_t b = 0; b < bytes && bad == bytes; b++)
                if (g[b] != 0x5a)
                    bad = b;
            ck_assert_msg(bad == bytes, "rep %d: tensor %d written at byte %zu of %zu after dear_finalize", rep,
                          i, bad, bytes);
        }
        model_free(&m);
    }
}
END_TEST

/* ---- stall warning ---- */

START_TEST(test_stall)
{
    if (nranks < 2)
        return;
    setenv("DEAR_STALL_WARN_S", "1", 1);
    model_t m;
    dear_ctx_t *ctx = model_committed(&m);
    capture_start();
    for (int l = 0; l < m.nlayers; l++)
        ck_assert_int_eq(dear_forward_begin(ctx, m.layer_ids[l]), DEAR_OK);
    for (int l = m.nlayers - 1; l >= 0; l--) {
        if (rank == 1 && l == m.nlayers - 1)
            usleep(1800 * 1000);  /* the straggler */
        ck_assert_int_eq(dear_backward_done(ctx, m.layer_ids[l]), DEAR_OK);
    }
    ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    capture_stop();
    if (rank != 1) {
        ck_assert_msg(strstr(logbuf, "stall") && strstr(logbuf, "reduce-scatter of bucket") &&
                          strstr(logbuf, "layers") && strstr(logbuf, "DEAR_STALL_WARN_S=1"),
                      "no stall warning: %s", logbuf);
    }
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);
    unsetenv("DEAR_STALL_WARN_S");
}
END_TEST

/* ---- profile ---- */

START_TEST(test_profile)
{
    model_t m;
    dear_ctx_t *ctx = model_committed(&m);
    for (int k = 0; k < 3; k++)
        dear_iteration(ctx, &m, k, "dear", NULL);
    char path[64] = "/tmp/dear-test-profile-XXXXXX";
    if (rank == 0) {
        int fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        close(fd);
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    ck_assert_int_eq(dear_profile_save(ctx, path), DEAR_OK);
    for (int i = 0; i < NT; i++)
        ck_assert_int_eq(m.t[i].updates, 3); /* saving flushes */
    if (rank == 0) {
        FILE *f = fopen(path, "r");
        ck_assert_ptr_nonnull(f);
        char line[256];
        int found_big = 0;
        while (fgets(line, sizeof line, f))
            if (strstr(line, "t17.weight") && strstr(line, "3145732"))
                found_big = 1;
        fclose(f);
        ck_assert_msg(found_big, "profile %s lacks tensor t17.weight with 3145732 bytes", path);
        unlink(path);
    }
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);
}
END_TEST

/* Two threads on one context: a call made while another runs on another thread fails at once
 * (DEAR_ERR_STATE, naming the cause) and touches nothing; the first completes normally. Here the
 * first is a forward_begin whose update holds it open until told, the others every call that
 * changes or reads the context, made in that window. A call from inside the update callback
 * fails the same way, naming the callback. */
typedef struct {
    dear_ctx_t *ctx;
    int updates;
    atomic_int gate_on, inside, go;
    int inner_rc;               /* the callback's own call on its context */
} threads_t;

static int slow_update(const dear_update_info_t *u)
{
    threads_t *st = u->arg;
    if (atomic_load(&st->gate_on)) {
        st->inner_rc = dear_flush(st->ctx);
        atomic_store(&st->inside, 1);
        while (!atomic_load(&st->go))
            usleep(1000);
    }
    st->updates++;
    return 0;
}

static void *forward_thread(void *arg)
{
    static int rc;
    rc = dear_forward_begin((dear_ctx_t *)arg, 0);
    return &rc;
}

START_TEST(test_threads)
{
    setenv("DEAR_SCHEDULE", "dear", 1);
    dear_params_load();
    float g[4] = { 1, 2, 3, 4 }, w[4] = { 0 };
    static threads_t st;
    memset(&st, 0, sizeof st);
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    st.ctx = ctx;
    ck_assert_int_eq(dear_register(ctx, "g", 0, g, 4, DEAR_FLOAT32, DEAR_MEM_HOST, slow_update, &st), DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    ck_assert_int_eq(dear_forward_begin(ctx, 0), DEAR_OK);
    ck_assert_int_eq(dear_backward_done(ctx, 0), DEAR_OK);
    ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    atomic_store(&st.gate_on, 1); /* the next forward_begin runs the update, and waits inside it */
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, forward_thread, ctx), 0);
    while (!atomic_load(&st.inside))
        usleep(1000);
    dear_stats_t stats;
    dear_sparse_stats_t sstats;
    char path[64];
    snprintf(path, sizeof path, "/tmp/dear-threads-%d-%d.txt", (int)getpid(), rank);
    EXPECT(dear_flush(ctx), DEAR_ERR_STATE, "another thread");
    EXPECT(dear_set_stream(ctx, NULL), DEAR_ERR_STATE, "another thread");
    EXPECT(dear_freeze(ctx, 0, 1), DEAR_ERR_STATE, "another thread");
    EXPECT(dear_no_grad(ctx, 0), DEAR_ERR_STATE, "another thread");
    EXPECT(dear_profile_save(ctx, path), DEAR_ERR_STATE, "another thread");
    EXPECT(dear_plan_save(ctx, path), DEAR_ERR_STATE, "another thread");
    EXPECT(dear_get_stats(ctx, &stats), DEAR_ERR_STATE, "another thread");
    EXPECT(dear_get_sparse_stats(ctx, 0, &sstats), DEAR_ERR_STATE, "another thread");
    EXPECT(dear_set_clip_norm(ctx, 1.0), DEAR_ERR_STATE, "another thread");
    EXPECT(dear_set_param(ctx, 0, w), DEAR_ERR_STATE, "another thread");
    dear_ctx_t *alias = ctx;
    EXPECT(dear_finalize(&alias), DEAR_ERR_STATE, "another thread");
    ck_assert_ptr_eq(alias, ctx); /* not freed: the other thread still runs on it */
    ck_assert_int_eq(access(path, F_OK), -1);
    atomic_store(&st.go, 1);
    void *res = NULL;
    pthread_join(th, &res);
    atomic_store(&st.gate_on, 0);
    ck_assert_int_eq(*(int *)res, DEAR_OK);
    ck_assert_int_eq(st.inner_rc, DEAR_ERR_STATE); /* the callback's own dear_flush */
    ck_assert_int_eq(st.updates, 1);
    /* The context is whole: the next iteration runs, from this thread. */
    ck_assert_int_eq(dear_backward_done(ctx, 0), DEAR_OK);
    ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    ck_assert_int_eq(st.updates, 2);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    unsetenv("DEAR_SCHEDULE");
    dear_params_load();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("runtime");
    TCase *tc = tcase_create("runtime");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_order);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_abandon);
    tcase_add_test(tc, test_params);
    tcase_add_test(tc, test_mismatch);
    tcase_add_loop_test(tc, test_train, 0, DEAR_SCHED_COUNT * 6);
    tcase_add_loop_test(tc, test_planfile, 0, 8);
    tcase_add_test(tc, test_stall);
    tcase_add_test(tc, test_profile);
    suite_add_tcase(s, tc);
    return s;
}

/* A few iterations with whatever DEAR_* the environment holds (the timeline test). */
START_TEST(test_train_env)
{
    model_t m;
    model_init(&m, 0);
    dear_ctx_t *ctx = NULL;
    const char *s = getenv("DEAR_SCHEDULE");
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    register_model(ctx, &m);
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    for (int k = 0; k < 4; k++)
        dear_iteration(ctx, &m, k, s ? s : "dear", NULL);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&m);
}
END_TEST

/* A suite of one test, for the modes that run a test alone. */
static Suite *suite_one(const char *name, const TTest *test, int timeout_s)
{
    Suite *s = suite_create(name);
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, timeout_s);
    tcase_add_test(tc, test);
    suite_add_tcase(s, tc);
    return s;
}

/* DEAR_STALL_ABORT_S=1 and a peer gone (runtime-stall-abort.sh checks the message and that the
 * job ended well before the fault would have): PEER_FAULT=
 *   sleep: rank 1 sleeps 30 s in backward: rank 0's progress thread aborts the job;
 *   stop:  rank 1 stops itself (SIGSTOP) in backward: the same;
 *   leave: rank 1 leaves after 2 iterations (dear_finalize) while rank 0 computes a long forward
 *          with nothing pending: rank 1's dear_finalize aborts the job, naming rank 0. */
START_TEST(test_stall_abort)
{
    const char *fault = getenv("PEER_FAULT") ? getenv("PEER_FAULT") : "sleep";
    setenv("DEAR_STALL_ABORT_S", "1", 1);
    model_t m;
    dear_ctx_t *ctx = model_committed(&m);
    for (int it = 0; it < 3; it++) {
        if (it == 2 && strcmp(fault, "leave") == 0) {
            if (rank == 1) {
                dear_finalize(&ctx);
                ck_abort_msg("rank 1: dear_finalize returned while rank 0 was still training");
            }
            sleep(30); /* a long forward pass */
        }
        for (int l = 0; l < m.nlayers; l++)
            ck_assert_int_eq(dear_forward_begin(ctx, m.layer_ids[l]), DEAR_OK);
        for (int l = m.nlayers - 1; l >= 0; l--) {
            if (it == 2 && rank == 1 && l == m.nlayers - 1) {
                if (strcmp(fault, "stop") == 0)
                    raise(SIGSTOP);
                else
                    sleep(30);
            }
            ck_assert_int_eq(dear_backward_done(ctx, m.layer_ids[l]), DEAR_OK);
        }
        ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    ck_abort_msg("rank %d: no abort although rank 1 was gone past DEAR_STALL_ABORT_S (%s)", rank, fault);
}
END_TEST

/* The engine under valgrind: calls out of order and one training run per schedule. */
START_TEST(test_engine)
{
    train_and_compare(dear_sched_name((dear_sched_t)_i), "threshold", "20000", _i % 2, NULL);
}
END_TEST

static Suite *suite_engine(void)
{
    Suite *s = suite_create("runtime-engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_order);
    tcase_add_loop_test(tc, test_engine, 0, DEAR_SCHED_COUNT);
    tcase_add_test(tc, test_stall);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    int provided, failed = 0;
    if (argc > 1 && strcmp(argv[1], "thread-single") == 0) {
        MPI_Init(&argc, &argv);
        np_check(argv[0]);
        MPI_Query_thread(&provided);
        dear_ctx_t *ctx = NULL;
        capture_start();
        int rc = dear_init(MPI_COMM_WORLD, &ctx);
        capture_stop();
        if (provided < MPI_THREAD_MULTIPLE &&
            (rc != DEAR_ERR_UNSUPPORTED || ctx != NULL || !strstr(logbuf, "MPI_THREAD_MULTIPLE") ||
             !strstr(logbuf, "provides thread level MPI_THREAD_"))) { /* the level by its name */
            fprintf(stderr, "thread-single: dear_init returned %d, log: %s\n", rc, logbuf);
            failed = 1;
        }
        MPI_Finalize();
        return failed;
    }
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    np_check(argv[0]);
#ifdef DEAR_TEST_MEM_DELAY
    mem_delay_install(); /* every context's gradients behind delayed queues (mem_delay.h) */
#endif
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "MPI lacks MPI_THREAD_MULTIPLE: skipped\n");
        MPI_Finalize();
        return 77;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    {
        const char *mode = argc > 1 ? argv[1] : "";
        small_model = strcmp(mode, "engine") == 0;
        SRunner *sr = srunner_create(strcmp(mode, "train") == 0 ? suite_one("runtime-train", test_train_env, 120)
                                     : strcmp(mode, "stall-abort") == 0
                                         ? suite_one("runtime-stall-abort", test_stall_abort, 60)
                                     : strcmp(mode, "abandon") == 0 ? suite_one("runtime-abandon", test_abandon, 300)
                                     : small_model                       ? suite_engine()
                                                                         : suite());
        srunner_set_fork_status(sr, CK_NOFORK);
        srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
    }
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}
