/*
 * Sparse tensors (dear_register_sparse) in a training loop, against a plain MPI_Allreduce loop
 * computed in the same program (Check, CK_FORK=no, under mpirun -np 1..5). Two embedding-like
 * tensors of different row lengths around a dense one; each rank's gradient touches different
 * rows per iteration: none, one, a ragged few, or (one tensor) all of them. Gradients are small
 * integers, so every sum is exact and the parameters must equal the reference bit for bit, in
 * float32 and bfloat16, under every schedule and DEAR_SPARSE=on|off|auto, and sharded (float32):
 *   loop     the parameters; which phases ran sparse (on: all, off: none, auto: what the bytes of
 *            the densest rank's warm-up blocks decide; sharded, the reduce-scatters only); the
 *            warm-up densities, this rank's and the union's (none sharded), counted here from the
 *            row patterns; sparse messages really sent; fewer bytes in all than with
 *            DEAR_SPARSE=off
 *   planned  auto's choice kept through a plan switch at the same backward_end (DEAR_FUSION=auto)
 *            and a freeze mid-run, with the clipping collective between the phases
 *   block    DEAR_SPARSE_BLOCK in place of the rows: half-rows, two rows; the same parameters, the
 *            block reported, more bytes on the wire in half-rows than in rows (an index per
 *            half); a block that does not divide a sparse tensor's count refused at commit
 *   errors   a block not dividing the count, a bad index, a declaration after commit, stats
 *            before commit or without their size; ranks declaring different blocks fail commit
 */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/reduce.h"
#include "fusion/profile.h"
#include "include/dear.h"
#include "tests/mpi/suite_run.h"

static int rank, nranks;

/* ---- the model: tok (16 rows of 8), w (dense), embed (32 rows of 4) and pos (8 rows of 4), one
 * layer each; embed and pos share a bucket, apart in memory (a fusion buffer) ---- */

#define NT 4
#define GAP 3                   /* elements between embed and pos */
#define ITERS 8
#define WARMUP 3
#define LR 0.125f
#define FREEZE_AT 5             /* planned: pos is frozen from this iteration on */

static const size_t counts[NT] = { 128, 50, 128, 32 };
static const size_t rowlen[NT] = { 8, 0, 4, 4 };

typedef struct {
    int bf16;
    int planned;                /* online planning, the clipping collective, pos frozen mid-run */
    int shard;                  /* sharded updates: each rank steps its slices, the all-gathers carry w */
    float *w;
    void *g;                    /* one arena, float32 or bfloat16 */
    size_t off[NT + 1];
} model_t;

/* Does rank r's gradient of tensor t touch row `row` in iteration it? tok never touches every row,
 * embed does on one rank in four. */
static int touched(int t, size_t row, int r, long long it)
{
    if (t == 1)
        return 1;
    if (t == 0) {
        int p = (int)((r + it) % 3);
        return p == 1 ? row == (size_t)((it * 5 + r) % 16) : p == 2 ? (row * 7 + (size_t)(r + it)) % 5 == 0 : 0;
    }
    if (t == 3) {
        int p = (int)((r + 2 * it) % 3);
        return p == 1 ? row == (size_t)((it + r) % 8) : p == 2 ? (row + (size_t)r) % 3 == 0 : 0;
    }
    int p = (int)((r + it) % 4);
    return p == 1 ? row == (size_t)((it * 3 + 2 * r) % 32)
         : p == 2 ? (row * 5 + (size_t)(r + it)) % 7 < 2
                  : p == 3;
}

/* Element i of tensor t on rank r: a small positive integer where its row is touched. */
static float grad_value(int t, size_t i, int r, long long it)
{
    size_t row = rowlen[t] ? i / rowlen[t] : i;
    return touched(t, row, r, it) ? (float)(1 + (i + 3 * (size_t)r + (size_t)it) % 5) : 0.0f;
}

static void model_init(model_t *m, int bf16)
{
    memset(m, 0, sizeof *m);
    m->bf16 = bf16;
    for (int t = 0; t < NT; t++)
        m->off[t + 1] = m->off[t] + counts[t] + (t == 2 ? GAP : 0);
    m->w = malloc(m->off[NT] * sizeof *m->w);
    m->g = calloc(m->off[NT], sizeof(float));
    ck_assert(m->w && m->g);
    for (size_t i = 0; i < m->off[NT]; i++)
        m->w[i] = (float)cos(0.3 * (double)i);
}

static void model_free(model_t *m)
{
    free(m->w);
    free(m->g);
}

/* The average as the library makes it: the exact sum times (float)(1/P), rounded once to bf16. */
static float average(const model_t *m, float sum)
{
    float a = sum * (float)(1.0 / nranks);
    return m->bf16 ? dear_bf16_to_float(dear_float_to_bf16(a)) : a;
}

static void reference(model_t *m)
{
    size_t n = m->off[NT];
    float *g = calloc(n, sizeof *g);
    for (long long it = 0; it < ITERS; it++) {
        for (int t = 0; t < NT; t++)
            for (size_t i = 0; i < counts[t]; i++)
                g[m->off[t] + i] = grad_value(t, i, rank, it);
        MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (size_t i = 0; i < n; i++)
            if (!(m->planned && it >= FREEZE_AT && i >= m->off[3]))
                m->w[i] -= LR * average(m, g[i]);
    }
    free(g);
}

/* ---- the same loop through libdear ---- */

static int update(const dear_update_info_t *u)
{
    model_t *m = u->arg;
    for (size_t i = 0; i < u->count; i++) {
        float g = u->dtype == DEAR_BFLOAT16 ? dear_bf16_to_float(((const unsigned short *)u->grad)[i])
                                            : ((const float *)u->grad)[i];
        m->w[m->off[u->tensor] + u->offset + i] -= LR * g;
    }
    return 0;
}

static void train(dear_ctx_t *ctx, model_t *m)
{
    for (long long it = 0; it < ITERS; it++) {
        if (m->planned && it == FREEZE_AT)
            ck_assert_int_eq(dear_freeze(ctx, 3, 1), DEAR_OK);
        for (int l = 0; l < NT; l++)
            ck_assert_int_eq(dear_forward_begin(ctx, l), DEAR_OK);
        for (int t = NT - 1; t >= 0; t--) {
            for (size_t i = 0; i < counts[t]; i++) {
                float v = grad_value(t, i, rank, it);
                if (m->bf16)
                    ((unsigned short *)m->g)[m->off[t] + i] = dear_float_to_bf16(v);
                else
                    ((float *)m->g)[m->off[t] + i] = v;
            }
            ck_assert_int_eq(dear_backward_done(ctx, t), DEAR_OK);
        }
        ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
}

/* The parameters equal the MPI_Allreduce loop's bit for bit on every rank; what names the run.
 * Combined over the ranks first, so no rank is left in a collective when another fails. */
static void assert_same_params(const model_t *m, const model_t *ref, const char *what)
{
    int bad = memcmp(m->w, ref->w, m->off[NT] * sizeof *m->w) != 0, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    ck_assert_msg(!any, "%s: parameters differ from the MPI_Allreduce loop", what);
}

static dear_ctx_t *setup(model_t *m, const char *sched, const char *mode)
{
    dear_ctx_t *ctx = NULL;
    setenv("DEAR_SCHEDULE", sched, 1);
    setenv("DEAR_FUSION", m->planned ? "auto" : "threshold", 1);
    setenv("DEAR_FUSION_THRESHOLD", "1m", 1); /* one bucket, were it not for the sparse tensors */
    setenv("DEAR_WARMUP_ITERS", "3", 1);
    setenv("DEAR_SPARSE", mode, 1);
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    check_transport(ctx);
    size_t es = m->bf16 ? 2 : 4;
    const char *names[NT] = { "tok", "w", "embed", "pos" };
    for (int t = 0; t < NT; t++) {
        ck_assert_int_eq(dear_register(ctx, names[t], t, (char *)m->g + m->off[t] * es, counts[t],
                                       m->bf16 ? DEAR_BFLOAT16 : DEAR_FLOAT32, DEAR_MEM_HOST, update, m),
                         DEAR_OK);
        if (rowlen[t])
            ck_assert_int_eq(dear_register_sparse(ctx, dear_tensor_index(ctx, names[t]), rowlen[t]), DEAR_OK);
        if (m->shard)
            ck_assert_int_eq(dear_set_param(ctx, t, m->w + m->off[t]), DEAR_OK);
    }
    if (m->shard)
        ck_assert_int_eq(dear_set_shard(ctx, DEAR_SHARD_ON), DEAR_OK);
    if (m->planned)
        ck_assert_int_eq(dear_set_clip_norm(ctx, INFINITY), DEAR_OK); /* its collective, no scaling */
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    unsetenv("DEAR_SCHEDULE");
    unsetenv("DEAR_FUSION");
    unsetenv("DEAR_FUSION_THRESHOLD");
    unsetenv("DEAR_WARMUP_ITERS");
    unsetenv("DEAR_SPARSE");
    return ctx;
}

/* Rows of tensor t touched over the warm-up iterations: by rank r (r >= 0) or by any rank. */
static long rows_touched(int t, int r)
{
    long n = 0;
    size_t rows = counts[t] / rowlen[t];
    for (long long it = 0; it < WARMUP; it++)
        for (size_t row = 0; row < rows; row++) {
            int any = 0;
            for (int q = 0; q < nranks; q++)
                any |= (r < 0 || q == r) && touched(t, row, q, it);
            n += any;
        }
    return n;
}

/* Where the ranks span hosts of `copies` ranks each (2 or more), the reduce-scatter's exchange
 * crosses a host's link once per rank and hier once per host; else 1. Phase decisions that
 * weighing changed (auto). */
static int copies = 1, flips;

/* DEAR_SPARSE=auto's rule: the densest rank's non-zero rows, each with a 4-byte index, k times
 * over, are fewer bytes than all rows. */
static int pays_times(int t, long nz, size_t es, int k)
{
    long blocks = (long)(counts[t] / rowlen[t]) * WARMUP;
    return (double)k * (double)nz * (double)(rowlen[t] * es + 4) < (double)blocks * (double)(rowlen[t] * es);
}

/* The reduce-scatter (or all-reduce) weighs by copies where it falls back to hier: not in 16
 * bits, whose sums fall back to the ring; never the all-gather, which crosses once per host
 * (through partners). */
static int pays(int t, long nz, size_t es, int ag)
{
    return pays_times(t, nz, es, !ag && es != 2 ? copies : 1);
}

/* copies from MPI's view of the hosts: ranks sharing memory form a host. */
static void find_copies(void)
{
    MPI_Comm node;
    int local, leaders = 0, lo, hi;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_rank(node, &lo);
    hi = lo == 0;
    MPI_Allreduce(&hi, &leaders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&local, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&local, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    copies = leaders > 1 && lo == hi && lo > 1 ? lo : 1;
    MPI_Comm_free(&node);
}

static const char *const scheds[] = { "dear", "wfbp", "sync" };
static const char *const modes[] = { "on", "off", "auto" };

static void check_stats(dear_ctx_t *ctx, const model_t *m, int s, int mode, size_t es, const char *what)
{
    for (int t = 0; t < NT; t++) {
        dear_sparse_stats_t st = { .size = sizeof st };
        ck_assert_int_eq(dear_get_sparse_stats(ctx, t, &st), DEAR_OK);
        ck_assert_uint_eq(st.block, rowlen[t]);
        if (rowlen[t] == 0 || mode == 1) {
            ck_assert_msg(!st.sparse_rs && !st.sparse_ag && st.msgs_sparse == 0 && st.msgs_dense == 0 &&
                              st.density == -1 && st.density_union == -1,
                          "%s: tensor %d is dense but its sparse stats are %d/%d, %llu/%llu messages, densities %g/%g",
                          what, t, st.sparse_rs, st.sparse_ag, (unsigned long long)st.msgs_sparse,
                          (unsigned long long)st.msgs_dense, st.density, st.density_union);
            continue;
        }
        size_t rows = counts[t] / rowlen[t];
        double mine = (double)rows_touched(t, rank) / (double)(rows * WARMUP);
        /* Sharded, no rank holds the averaged gradient whole: nothing to count. */
        double uni = m->shard ? -1 : (double)rows_touched(t, -1) / (double)(rows * WARMUP);
        ck_assert_msg(st.density == mine && st.density_union == uni,
                      "%s: tensor %d's warm-up densities are %g (this rank) and %g (union), the rows touched give %g "
                      "and %g", what, t, st.density, st.density_union, mine, uni);
        /* embed and pos share a bucket: it runs sparse when both pay. */
        int rs = 1, ag = s == 0 && !m->shard;
        for (int u = t < 2 ? t : 2; u <= (t < 2 ? t : 3); u++) {
            long most = 0;
            for (int q = 0; q < nranks; q++)
                most = rows_touched(u, q) > most ? rows_touched(u, q) : most;
            long u_uni = rows_touched(u, -1);
            rs &= mode == 0 || pays(u, most, es, 0);
            ag &= mode == 0 || pays(u, u_uni, es, 1);
            flips += mode == 2 && pays(u, most, es, 0) != pays_times(u, most, es, 1);
            flips += mode == 2 && ag && pays(u, u_uni, es, 1) != pays_times(u, u_uni, es, 1);
        }
        ck_assert_msg(st.sparse_rs == rs && st.sparse_ag == ag, "%s: tensor %d runs reduce-scatter %s, all-gather %s; "
                      "expected %s, %s", what, t, st.sparse_rs ? "sparse" : "dense", st.sparse_ag ? "sparse" : "dense",
                      rs ? "sparse" : "dense", ag ? "sparse" : "dense");
        /* tok's rows are sparse on every rank: some messages really went sparse. */
        if (nranks > 1 && t == 0)
            ck_assert_msg(st.msgs_sparse > 0 && st.bytes_sent > 0, "%s: tok sent %llu sparse message(s), %llu bytes",
                          what, (unsigned long long)st.msgs_sparse, (unsigned long long)st.bytes_sent);
    }
}

/* End a run: the bytes this rank sent, then the context and the model are freed. */
static uint64_t finish(dear_ctx_t **ctx, model_t *m)
{
    dear_stats_t st;
    ck_assert_int_eq(dear_get_stats(*ctx, &st), DEAR_OK);
    ck_assert_int_eq(dear_finalize(ctx), DEAR_OK);
    model_free(m);
    return st.bytes_sent;
}

/* The saved profile prices each sparse tensor by its warm-up densities: the densest rank's rows
 * for the reduce-scatter, the union's for the all-gather, 1 for a phase the tensor runs dense
 * (auto's rule per tensor); DEAR_SPARSE=off declares none. */
static void check_profile(dear_ctx_t *ctx, int shard, int mode, size_t es, const char *what)
{
    char path[64] = "/tmp/dear-sparse-prof-XXXXXX";
    if (rank == 0) {
        int fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        close(fd);
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    ck_assert_int_eq(dear_profile_save(ctx, path), DEAR_OK);
    if (rank != 0)
        return;
    dear_profile_t p = { 0 };
    ck_assert_int_eq(dear_prof_load(path, &p), DEAR_OK);
    unlink(path);
    ck_assert_int_eq(p.ntensors, NT);
    for (int t = 0; t < NT; t++) {
        const dear_prof_tensor_t *pt = &p.tensors[t];
        if (rowlen[t] == 0 || mode == 1) {
            ck_assert_msg(pt->block_bytes == 0, "%s: profile declares tensor %d sparse", what, t);
            continue;
        }
        long most = 0, blocks = (long)(counts[t] / rowlen[t]) * WARMUP;
        for (int q = 0; q < nranks; q++)
            most = rows_touched(t, q) > most ? rows_touched(t, q) : most;
        long uni = rows_touched(t, -1);
        double rs = mode == 0 || pays(t, most, es, 0) ? (double)most / (double)blocks : 1;
        double ag = !shard && (mode == 0 || pays(t, uni, es, 1)) ? (double)uni / (double)blocks : 1;
        ck_assert_msg(pt->block_bytes == rowlen[t] * es && fabs(pt->density_rs - rs) <= 1e-8 &&
                          fabs(pt->density_ag - ag) <= 1e-8,
                      "%s: profile has tensor %d sparse in blocks of %zu bytes at densities %g/%g; expected %zu "
                      "bytes, %g/%g", what, t, pt->block_bytes, pt->density_rs, pt->density_ag, rowlen[t] * es, rs, ag);
    }
    dear_prof_free(&p);
}

START_TEST(test_loop)
{
    int shard = _i >= 6, s = shard ? _i - 6 : _i / 2, bf16 = !shard && _i % 2;
    size_t es = bf16 ? 2 : 4;
    model_t ref;
    model_init(&ref, bf16);
    reference(&ref);
    uint64_t sent[3];
    for (int mode = 0; mode < 3; mode++) {
        model_t m;
        model_init(&m, bf16);
        m.shard = shard;
        dear_ctx_t *ctx = setup(&m, scheds[s], modes[mode]);
        train(ctx, &m);
        char what[96];
        snprintf(what, sizeof what, "schedule %s%s, DEAR_SPARSE=%s, %s, np %d", scheds[s], shard ? ", sharded" : "",
                 modes[mode], bf16 ? "bfloat16" : "float32", nranks);
        assert_same_params(&m, &ref, what);
        check_stats(ctx, &m, s, mode, es, what);
        check_profile(ctx, shard, mode, es, what);
        sent[mode] = finish(&ctx, &m);
    }
    if (nranks > 1)
        ck_assert_msg(sent[0] < sent[1], "schedule %s%s: %llu bytes sent with DEAR_SPARSE=on, %llu with off", scheds[s],
                      shard ? ", sharded" : "", (unsigned long long)sent[0], (unsigned long long)sent[1]);
    if (rank == 0 && copies > 1)
        printf("test_sparse: %d ranks per host: DEAR_SPARSE=auto weighs the exchange %d times over; %d phase "
               "decision(s) so far differ from one host's\n", copies, copies, flips);
    model_free(&ref);
}
END_TEST

/* The decision of DEAR_SPARSE=auto survives the plan switch at the same backward_end and a
 * rebuild by dear_freeze; the clipping collective runs between sparse phases. */
START_TEST(test_planned)
{
    model_t ref, m;
    model_init(&ref, 0);
    model_init(&m, 0);
    ref.planned = m.planned = 1;
    reference(&ref);
    dear_ctx_t *ctx = setup(&m, scheds[_i], "auto");
    train(ctx, &m);
    char what[64];
    snprintf(what, sizeof what, "planned, schedule %s", scheds[_i]);
    assert_same_params(&m, &ref, what);
    dear_sparse_stats_t st = { .size = sizeof st };
    ck_assert_int_eq(dear_get_sparse_stats(ctx, 0, &st), DEAR_OK);
    ck_assert_msg(st.sparse_rs && (st.sparse_ag || _i != 0), "planned, schedule %s: tok runs %d/%d after the switch",
                  scheds[_i], st.sparse_rs, st.sparse_ag);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    model_free(&ref);
    model_free(&m);
}
END_TEST

/* DEAR_SPARSE_BLOCK replaces the rows as blocks: results stay bitwise the reference's; blocks of
 * half a row add an index per half of every touched row, so they send more than rows do. A block
 * that does not divide a sparse tensor's count fails commit on every rank, naming it. */
START_TEST(test_block)
{
    static const char *blocks[] = { "0", "2", "16" };
    uint64_t sent[3];
    model_t ref;
    model_init(&ref, 0);
    reference(&ref);
    for (int b = 0; b < 3; b++) {
        model_t m;
        model_init(&m, 0);
        setenv("DEAR_SPARSE_BLOCK", blocks[b], 1);
        dear_ctx_t *ctx = setup(&m, scheds[_i], "on");
        unsetenv("DEAR_SPARSE_BLOCK");
        train(ctx, &m);
        char what[64];
        snprintf(what, sizeof what, "schedule %s, DEAR_SPARSE_BLOCK=%s", scheds[_i], blocks[b]);
        assert_same_params(&m, &ref, what);
        for (int t = 0; t < NT; t++) {
            dear_sparse_stats_t st = { .size = sizeof st };
            ck_assert_int_eq(dear_get_sparse_stats(ctx, t, &st), DEAR_OK);
            ck_assert_uint_eq(st.block, rowlen[t] == 0 ? 0 : b == 0 ? rowlen[t] : (size_t)atoi(blocks[b]));
        }
        sent[b] = finish(&ctx, &m);
    }
    if (nranks > 1)
        ck_assert_msg(sent[0] < sent[1], "schedule %s: %llu bytes sent in rows, %llu in half-rows", scheds[_i],
                      (unsigned long long)sent[0], (unsigned long long)sent[1]);
    if (rank == 0 && nranks > 1)
        fprintf(stderr, "block, schedule %s: %llu bytes sent in rows, %llu in half-rows, %llu in two rows\n",
                scheds[_i], (unsigned long long)sent[0], (unsigned long long)sent[1], (unsigned long long)sent[2]);
    model_free(&ref);
    /* 5 does not divide the 12 elements of a sparse tensor of rows of 4. */
    dear_ctx_t *ctx = NULL;
    float a[12] = { 0 };
    setenv("DEAR_SPARSE_BLOCK", "5", 1);
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "a", 0, a, 12, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_OK);
    ck_assert_int_eq(dear_register_sparse(ctx, 0, 4), DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_ERR_PARAM);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    unsetenv("DEAR_SPARSE_BLOCK");
}
END_TEST

START_TEST(test_errors)
{
    float a[10] = { 0 }, b[6] = { 0 };
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "a", 0, a, 10, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_OK);
    ck_assert_int_eq(dear_register(ctx, "b", 1, b, 6, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_OK);
    ck_assert_int_eq(dear_register_sparse(ctx, 0, 3), DEAR_ERR_ARG);  /* 3 does not divide 10 */
    ck_assert_int_eq(dear_register_sparse(ctx, 0, 0), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_register_sparse(ctx, 2, 5), DEAR_ERR_ARG);  /* no tensor 2 */
    ck_assert_int_eq(dear_register_sparse(ctx, -1, 5), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_register_sparse(NULL, 0, 5), DEAR_ERR_ARG);
    dear_sparse_stats_t st = { .size = sizeof st };
    ck_assert_int_eq(dear_get_sparse_stats(ctx, 0, &st), DEAR_ERR_STATE);
    ck_assert_int_eq(dear_register_sparse(ctx, 0, 5), DEAR_OK);
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    ck_assert_int_eq(dear_register_sparse(ctx, 0, 5), DEAR_ERR_STATE);
    ck_assert_int_eq(dear_register_sparse(ctx, 1, 3), DEAR_ERR_STATE);
    ck_assert_int_eq(dear_get_sparse_stats(ctx, 0, &st), DEAR_OK);
    ck_assert_uint_eq(st.block, 5);
    ck_assert_int_eq(dear_get_sparse_stats(ctx, 2, &st), DEAR_ERR_ARG);
    st.size = 0;
    ck_assert_int_eq(dear_get_sparse_stats(ctx, 0, &st), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    if (nranks < 2)
        return;
    /* The last rank declares another block, then only rank 0 declares one. */
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
        ck_assert_int_eq(dear_register(ctx, "a", 0, a, 10, DEAR_FLOAT32, DEAR_MEM_HOST, NULL, NULL), DEAR_OK);
        if (k == 0)
            ck_assert_int_eq(dear_register_sparse(ctx, 0, rank == nranks - 1 ? 2 : 5), DEAR_OK);
        else if (rank == 0)
            ck_assert_int_eq(dear_register_sparse(ctx, 0, 5), DEAR_OK);
        ck_assert_int_eq(dear_commit(ctx), DEAR_ERR_MISMATCH);
        ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    }
}
END_TEST

int main(int argc, char **argv)
{
    mpi_suite_init(&argc, &argv, &rank, &nranks);
    find_copies();
    Suite *s = suite_create("sparse");
    TCase *tc = tcase_create("sparse");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_loop, 0, 9); /* schedule x (float32, bfloat16), then sharded float32 */
    tcase_add_loop_test(tc, test_planned, 0, 2); /* dear, wfbp */
    tcase_add_loop_test(tc, test_block, 0, 3); /* schedule */
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return mpi_suite_run(s, rank);
}
