/*
 * Partitioned tensors (DEAR_PARTITION) against unpartitioned runs and a plain closed-form
 * reference (Check, CK_FORK=no, under mpirun -np 1..4). The gradients are small integers, so
 * every sum is exact whatever the order: cutting the tensors into chunks, and so bucketing and
 * reducing them differently, must leave the parameters bit for bit those of the run with every
 * tensor whole. Every update must run exactly once per tensor and iteration and see its whole
 * averaged gradient (every chunk in place). The model: a float32 tensor cut into many chunks, a
 * tiny one, a bfloat16 one (2-byte elements), a sparse one (rows of 16) and one more, with a
 * layer that holds no tensor.
 *   bitwise   dear, wfbp, sync x none (a bucket per chunk), threshold (buckets across tensors)
 *   planfile  dear_plan_save of a partitioned run and DEAR_PLAN_FILE in a new run without
 *             DEAR_PARTITION: the file's cuts, the same parameters; the timeline and the stats
 *             with chunks; plans cutting the bfloat16 tensor mid-element or the sparse one mid-row
 *             refused at commit, naming the file's line
 *   early     a plan whose early all-gather groups split a tensor's chunks between the backward
 *             pass and the next forward
 */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "collectives/reduce.h"
#include "fusion/planfile.h"
#include "fusion/units.h"
#include "include/dear.h"
#include "runtime/rt.h"
#include "tests/mpi/suite_run.h"

static int rank, nranks;

static char logbuf[16384];
static size_t loglen;
static void sink(const char *line, void *arg)
{
    (void)arg;
    size_t n = strlen(line);
    if (loglen + n + 1 < sizeof logbuf) {
        memcpy(logbuf + loglen, line, n + 1);
        loglen += n;
    }
}

static void capture_start(void)
{
    loglen = 0;
    logbuf[0] = '\0';
    dear_log_set_sink(sink, NULL);
}

static void capture_stop(void) { dear_log_set_sink(NULL, NULL); }

#define NT 5
#define NL 5
#define ITERS 5
#define ROW 16
#define SPARSE_T 3
#define LR 0.25f
#define PART "1000"     /* bytes: every tensor but the tiny one is cut */

static const size_t counts[NT] = { 3000, 5, 1001, 64 * ROW, 777 };
static const int layer_of[NT] = { 0, 2, 2, 3, 4 };   /* layer 1 holds no tensor */
static const dear_dtype_t dtype_of[NT] = { DEAR_FLOAT32, DEAR_FLOAT32, DEAR_BFLOAT16, DEAR_FLOAT32, DEAR_FLOAT32 };

static size_t esz(int t) { return dtype_of[t] == DEAR_BFLOAT16 ? 2 : 4; }

/* Rank r's gradient of element i of tensor t in iteration it: an integer in [-4, 4]; the sparse
 * tensor has a third of its rows non-zero, a different third on each rank and iteration. */
static float grad_value(int t, size_t i, int r, long long it)
{
    if (t == SPARSE_T && (i / ROW + (size_t)r + (size_t)it) % 3 != 0)
        return 0;
    return (float)((long long)((i * 7 + (size_t)t * 13 + (size_t)r * 5 + (size_t)it * 3) % 9) - 4);
}

/* The average over the ranks, the sum being exact: what every update must see. */
static float average(int t, size_t i, long long it)
{
    float s = 0;
    for (int r = 0; r < nranks; r++)
        s += grad_value(t, i, r, it);
    return s / (float)nranks;
}

typedef struct model model_t;
typedef struct {
    model_t *m;
    int t;
} upd_arg_t;

struct model {
    float *w[NT];
    char *g;                    /* the gradients, one arena in registration order */
    size_t off[NT];             /* byte offsets in g */
    long calls[NT][ITERS];
    int bad;                    /* an update saw another gradient than the average */
    upd_arg_t arg[NT];
};

static void model_init(model_t *m)
{
    memset(m, 0, sizeof *m);
    size_t bytes = 0;
    for (int t = 0; t < NT; t++) {
        m->off[t] = bytes;
        bytes += counts[t] * esz(t);
        m->w[t] = malloc(counts[t] * sizeof(float));
        ck_assert_ptr_nonnull(m->w[t]);
        for (size_t i = 0; i < counts[t]; i++)
            m->w[t][i] = (float)((i + (size_t)t) % 5);
        m->arg[t] = (upd_arg_t){ m, t };
    }
    m->g = calloc(1, bytes);
    ck_assert_ptr_nonnull(m->g);
}

static void model_free(model_t *m)
{
    for (int t = 0; t < NT; t++)
        free(m->w[t]);
    free(m->g);
}

static float grad_at(const void *g, int t, size_t i)
{
    return dtype_of[t] == DEAR_BFLOAT16 ? dear_bf16_to_float(((const unsigned short *)g)[i]) : ((const float *)g)[i];
}

/* SGD, once per tensor and iteration, on a gradient that must be the whole average. */
static int update(const dear_update_info_t *u)
{
    upd_arg_t *a = u->arg;
    model_t *m = a->m;
    int t = a->t;
    if (u->iteration < 0 || u->iteration >= ITERS || u->count != counts[t])
        return 1;
    m->calls[t][u->iteration]++;
    for (size_t i = 0; i < counts[t]; i++) {
        float g = grad_at(u->grad, t, i), want = average(t, i, u->iteration);
        if (dtype_of[t] == DEAR_BFLOAT16)
            want = dear_bf16_to_float(dear_float_to_bf16(want));
        if (!(fabsf(g - want) <= 1e-6f * (1 + fabsf(want))))
            m->bad = 1;
        m->w[t][i] -= LR * g;
    }
    return 0;
}

static void write_grads(model_t *m, int t, long long it)
{
    for (size_t i = 0; i < counts[t]; i++) {
        float v = grad_value(t, i, rank, it);
        if (dtype_of[t] == DEAR_BFLOAT16)
            ((unsigned short *)(m->g + m->off[t]))[i] = dear_float_to_bf16(v);
        else
            ((float *)(m->g + m->off[t]))[i] = v;
    }
}

/* Registered and committed under the environment the caller set; NULL when commit failed
 * (its status in *rc). */
static dear_ctx_t *setup(model_t *m, int *rc)
{
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    for (int t = 0; t < NT; t++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", t);
        ck_assert_int_eq(dear_register(ctx, name, layer_of[t], m->g + m->off[t], counts[t], dtype_of[t],
                                       DEAR_MEM_HOST, update, &m->arg[t]),
                         DEAR_OK);
    }
    ck_assert_int_eq(dear_register_layer(ctx, 1), DEAR_OK);
    ck_assert_int_eq(dear_register_sparse(ctx, SPARSE_T, ROW), DEAR_OK);
    *rc = dear_commit(ctx);
    if (*rc != DEAR_OK) {
        ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
        return NULL;
    }
    return ctx;
}

static void train(dear_ctx_t *ctx, model_t *m)
{
    for (long long it = 0; it < ITERS; it++) {
        for (int l = 0; l < NL; l++)
            ck_assert_int_eq(dear_forward_begin(ctx, l), DEAR_OK);
        for (int l = NL - 1; l >= 0; l--) {
            for (int t = 0; t < NT; t++)
                if (layer_of[t] == l)
                    write_grads(m, t, it);
            ck_assert_int_eq(dear_backward_done(ctx, l), DEAR_OK);
        }
        ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
}

static void set_env(const char *sched, const char *fusion, const char *partition)
{
    setenv("DEAR_SCHEDULE", sched, 1);
    setenv("DEAR_FUSION", fusion, 1);
    setenv("DEAR_FUSION_THRESHOLD", "1500", 1);
    setenv("DEAR_PARTITION", partition, 1);
    setenv("DEAR_SPARSE", "on", 1);
}

static void unset_env(void)
{
    static const char *const vars[] = { "DEAR_SCHEDULE", "DEAR_FUSION", "DEAR_FUSION_THRESHOLD", "DEAR_PARTITION",
                                        "DEAR_SPARSE", "DEAR_PLAN_FILE", "DEAR_TIMELINE", "DEAR_STATS" };
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
}

/* One run from fresh parameters into m; cut: whether some tensor must be in several units. */
static void run(model_t *m, int cut, const char *what)
{
    int rc;
    model_init(m);
    dear_ctx_t *ctx = setup(m, &rc);
    ck_assert_msg(ctx != NULL, "%s: commit failed: %s", what, dear_status_string(rc));
    ck_assert_msg((ctx->graph.nunits > NT) == cut, "%s: %d units for %d tensors", what, ctx->graph.nunits, NT);
    train(ctx, m);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    int bad = m->bad, calls_ok = 1;
    for (int t = 0; t < NT; t++)
        for (int k = 0; k < ITERS; k++)
            calls_ok &= m->calls[t][k] == 1;
    ck_assert_msg(!bad, "%s: an update saw a gradient other than the average (a chunk not in place)", what);
    ck_assert_msg(calls_ok, "%s: an update did not run exactly once per tensor and iteration", what);
}

/* The parameters of a and b are the same bits on every rank; and those of the closed-form
 * reference, bit for bit where 1/P is exact (P a power of two), else within float rounding. */
static void same_params(const model_t *a, const model_t *b, const char *what)
{
    int differ = 0, off_ref = 0, exact = (nranks & (nranks - 1)) == 0;
    for (int t = 0; t < NT; t++) {
        differ |= memcmp(a->w[t], b->w[t], counts[t] * sizeof(float)) != 0;
        for (size_t i = 0; i < counts[t]; i++) {
            float w = (float)((i + (size_t)t) % 5);
            for (long long it = 0; it < ITERS; it++) {
                float g = average(t, i, it);
                if (dtype_of[t] == DEAR_BFLOAT16)
                    g = dear_bf16_to_float(dear_float_to_bf16(g));
                w -= LR * g;
            }
            off_ref |= exact ? w != a->w[t][i] : !(fabsf(w - a->w[t][i]) <= 1e-5f * (1 + fabsf(w)));
        }
    }
    int any[2] = { differ, off_ref }, all[2];
    MPI_Allreduce(any, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    ck_assert_msg(!all[0], "%s: partitioned and unpartitioned parameters differ", what);
    ck_assert_msg(!all[1], "%s: parameters differ from the closed-form reference", what);
}

static const char *const scheds[] = { "dear", "wfbp", "sync" };
static const char *const fusions[] = { "none", "threshold" };

START_TEST(test_bitwise)
{
    const char *sched = scheds[_i / 2], *fusion = fusions[_i % 2];
    char what[64];
    snprintf(what, sizeof what, "%s/%s", sched, fusion);
    model_t whole, cut;
    set_env(sched, fusion, "0");
    run(&whole, 0, what);
    set_env(sched, fusion, PART);
    run(&cut, 1, what);
    unset_env();
    same_params(&cut, &whole, what);
    model_free(&whole);
    model_free(&cut);
}
END_TEST

/* A file path every rank agrees on. */
static void shared_path(char *path, size_t len, const char *what)
{
    snprintf(path, len, "/tmp/dear-part-%s-%d", what, (int)getpid());
    MPI_Bcast(path, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD);
}

static int file_has(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, text) != NULL;
}

/* A plan file for the model with one extra line (a cut) instead of its units; rank 0 writes it. */
static void write_plan(const char *path, const char *cut_line, int nunits)
{
    if (rank != 0)
        return;
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "dear-plan 2\nplanner hand\ntensors %d\nunits %d\n%s\nrs 1 0\nag 1 0\nend\n", NT, nunits, cut_line);
    fclose(f);
}

START_TEST(test_planfile)
{
    char plan[96], tl[96], tl0[128];
    shared_path(plan, sizeof plan, "plan");
    shared_path(tl, sizeof tl, "tl");
    snprintf(tl0, sizeof tl0, "%s-%d.json", tl, rank);
    strcat(tl, "-%r.json");
    /* A partitioned run saves its plan, and writes a timeline and its statistics. */
    model_t a, b;
    int rc;
    set_env("dear", "none", PART);
    setenv("DEAR_TIMELINE", tl, 1);
    setenv("DEAR_STATS", "1", 1);
    model_init(&a);
    dear_ctx_t *ctx = setup(&a, &rc);
    ck_assert_ptr_nonnull(ctx);
    int nunits = ctx->graph.nunits, nbuckets = ctx->graph.nbuckets;
    ck_assert_int_gt(nunits, NT);
    ck_assert_int_eq(nbuckets, nunits);   /* none: a bucket per chunk */
    train(ctx, &a);
    if (rank == 0)
        ck_assert_int_eq(dear_plan_save(ctx, plan), DEAR_OK);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    unset_env();
    MPI_Barrier(MPI_COMM_WORLD);
    ck_assert_msg(file_has(plan, "dear-plan 2") && file_has(plan, "\ncut 0 12000 "), "the saved plan has no cuts");
    /* one rank communicates nothing: no collective to draw */
    ck_assert_msg(nranks == 1 || (file_has(tl0, "reduce-scatter bucket") && file_has(tl0, "all-gather group")),
                  "timeline %s lacks the collectives", tl0);
    ck_assert_msg(file_has(tl0, "backward L0"), "timeline %s lacks the layers", tl0);
    unlink(tl0);
    /* A run without DEAR_PARTITION takes the file's cuts and gives the same parameters. */
    set_env("dear", "threshold", "0");
    setenv("DEAR_PLAN_FILE", plan, 1);
    model_init(&b);
    ctx = setup(&b, &rc);
    ck_assert_ptr_nonnull(ctx);
    ck_assert_int_eq(ctx->graph.nunits, nunits);
    ck_assert_int_eq(ctx->graph.nbuckets, nbuckets);
    train(ctx, &b);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    unset_env();
    same_params(&a, &b, "plan file");
    ck_assert(!b.bad);
    model_free(&a);
    model_free(&b);
    /* Cuts that do not fit the registered tensors: refused on every rank, naming the line. */
    static const struct {
        const char *cut, *says;
    } bad[] = {
        { "cut 2 2002 1001", ":5: tensor 2 is cut at byte 1001, inside an element of 2 bytes" },
        { "cut 3 4096 100", ":5: sparse tensor 3 is cut at byte 100, inside a row of 64 bytes" },
        { "cut 4 3108 3108", ":5: tensor 4 (3108 bytes) is cut at '3108', not a byte offset inside it" },
        { "cut 0 12000 8000 4000", ":5: tensor 0: cut at byte 4000 after byte 8000" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        write_plan(plan, bad[k].cut, NT + 1 + (k == 3));
        MPI_Barrier(MPI_COMM_WORLD);
        set_env("dear", "threshold", "0");
        setenv("DEAR_PLAN_FILE", plan, 1);
        model_init(&a);
        capture_start();
        ctx = setup(&a, &rc);
        capture_stop();
        unset_env();
        ck_assert_ptr_null(ctx);
        ck_assert_int_eq(rc, k < 2 ? DEAR_ERR_MISMATCH : DEAR_ERR_FORMAT);
        if (rank == 0)
            ck_assert_msg(strstr(logbuf, bad[k].says) != NULL, "expected '%s' in: %s", bad[k].says, logbuf);
        model_free(&a);
    }
    if (rank == 0)
        unlink(plan);
}
END_TEST

/* A plan (one bucket per unit) whose last all-gather groups run early, the first of them holding
 * the middle chunk of tensor 0: its chunks are gathered partly during backward, partly in the
 * next forward, and its update still runs once, with every chunk in place. Then (_i = 1) every
 * other group from the first runs early instead, not a trailing run: the groups are early as
 * marked, the fixed order puts each early one right behind its bucket and the others, in forward
 * order, after the barriers, and training ends as with whole tensors. */
START_TEST(test_early_split)
{
    char plan[96];
    shared_path(plan, sizeof plan, "early");
    dear_tensor_desc_t d[NT];
    for (int t = 0; t < NT; t++)
        d[t] = (dear_tensor_desc_t){ .bytes = counts[t] * esz(t), .layer = layer_of[t], .elem_bytes = esz(t),
                                     .row_bytes = t == SPARSE_T ? ROW * 4 : 0 };
    dear_unit_t *u = NULL;
    int nu = 0;
    ck_assert_int_eq(dear_units_cut(NT, d, (size_t)atoi(PART), &u, &nu), DEAR_OK);
    ck_assert_msg(u != NULL, "partition " PART " cuts no tensor");
    int c0 = 0;
    while (c0 < nu && u[c0].tensor == 0)
        c0++;   /* tensor 0's chunks: units 0 .. c0 - 1 */
    ck_assert_int_ge(c0, 3);
    if (rank == 0) {
        int *first = malloc(sizeof(int) * (size_t)(nu + 1));
        for (int i = 0; i <= nu; i++)
            first[i] = i;
        dear_plan_t p = { 0 };
        ck_assert_int_eq(dear_plan_same(&p, nu, nu, first, "hand"), DEAR_OK);
        ck_assert_int_eq(dear_plan_set_units(&p, NT, u), DEAR_OK);
        p.ag_early = nu - c0 / 2;
        if (_i == 1) {
            unsigned char *mark = malloc((size_t)nu);
            for (int g = 0; g < nu; g++)
                mark[g] = g % 2 == 0;
            ck_assert_int_eq(dear_plan_set_early(&p, mark), DEAR_OK);
            free(mark);
        }
        const char *names[NT] = { "w0", "w1", "w2", "w3", "w4" };
        ck_assert_int_eq(dear_planfile_save(plan, &p, d, names), DEAR_OK);
        dear_plan_free(&p);
        free(first);
    }
    free(u);
    MPI_Barrier(MPI_COMM_WORLD);
    model_t a, b;
    set_env("dear", "threshold", "0");
    run(&a, 0, "early: whole");
    setenv("DEAR_PLAN_FILE", plan, 1);
    int rc;
    model_init(&b);
    dear_ctx_t *ctx = setup(&b, &rc);
    ck_assert_ptr_nonnull(ctx);
    const dear_graph_t *gr = &ctx->graph;
    if (_i == 0) {
        ck_assert_int_eq(gr->ngroups_early, nu - c0 / 2);
        ck_assert(gr->groups[c0 / 2].early && !gr->groups[c0 / 2 - 1].early);
    } else {
        ck_assert_int_eq(gr->ngroups, nu);
        ck_assert_int_eq(gr->ngroups_early, (nu + 1) / 2);
        for (int g = 0; g < nu; g++)
            ck_assert_int_eq(gr->groups[g].early, g % 2 == 0);
    }
    int pos = 0;
    for (int bk = gr->nbuckets - 1; bk >= 0; bk--) {
        ck_assert_ptr_eq(gr->ops[pos++], &gr->buckets[bk].op);
        for (int g = gr->ngroups - 1; g >= 0; g--)
            if (gr->groups[g].early && gr->units[gr->groups[g].u0].bucket == bk)
                ck_assert_msg(gr->ops[pos++] == &gr->groups[g].op, "op %d is not early group %d", pos - 1, g);
    }
    pos += gr->nbarriers;
    for (int g = 0; g < gr->ngroups; g++)
        if (!gr->groups[g].early)
            ck_assert_msg(gr->ops[pos++] == &gr->groups[g].op, "op %d is not group %d", pos - 1, g);
    ck_assert_int_eq(pos, gr->nops);
    train(ctx, &b);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    unset_env();
    ck_assert(!b.bad);
    for (int t = 0; t < NT; t++)
        for (int k = 0; k < ITERS; k++)
            ck_assert_int_eq(b.calls[t][k], 1);
    same_params(&b, &a, "early");
    model_free(&a);
    model_free(&b);
    if (rank == 0)
        unlink(plan);
}
END_TEST

int main(int argc, char **argv)
{
    mpi_suite_init(&argc, &argv, &rank, &nranks);
    Suite *s = suite_create("partition");
    TCase *tc = tcase_create("partition");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_bitwise, 0, 6);
    tcase_add_test(tc, test_planfile);
    tcase_add_loop_test(tc, test_early_split, 0, 2);
    suite_add_tcase(s, tc);
    return mpi_suite_run(s, rank);
}
