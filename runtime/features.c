/*
 * The feature table's loops (runtime/features.h): the order of the rows from their `after`
 * masks, the pairs checked in one place, and each step of dear_commit, dear_graph_build and the
 * context's release run over every row. Nothing here knows a feature by name but the table.
 */
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "base/mpi_check.h"
#include "runtime/features.h"
#include "runtime/rt.h"

#define ROW_PTR_(ID, NAME, ROW, WHAT) &ROW,
static const dear_feature_t *const rows[DEAR_FEAT_COUNT] = { DEAR_FEATURE_TABLE(ROW_PTR_) };
#undef ROW_PTR_
#define WHAT_(ID, NAME, ROW, WHAT) WHAT,
static const char *const whats[DEAR_FEAT_COUNT] = { DEAR_FEATURE_TABLE(WHAT_) };
#undef WHAT_

/* The rows in an order where each comes after every row its `after` names, ties in table
 * order; 0 when the masks make a cycle (a defect of the table, which then fails every dear_commit). */
static int order(dear_feat_t out[DEAR_FEAT_COUNT])
{
    unsigned placed = 0;
    for (int n = 0; n < DEAR_FEAT_COUNT; n++) {
        int f = 0;
        while (f < DEAR_FEAT_COUNT && ((placed >> f & 1) || (rows[f]->after & ~placed)))
            f++;
        if (f == DEAR_FEAT_COUNT)
            return 0;
        out[n] = (dear_feat_t)f;
        placed |= 1u << f;
    }
    return 1;
}

static int rule_applies(const dear_feature_rule_t *r, unsigned on, int split)
{
    return (on >> r->other & 1) && (r->when == DEAR_WHEN_ALWAYS || split);
}

/* Row f's first rule of this kind that applies to the features in `on`; NULL when none does or f
 * is not on itself. */
static const dear_feature_rule_t *rule_of(int f, dear_rule_kind_t kind, unsigned on, int split)
{
    for (const dear_feature_rule_t *r = rows[f]->rules; r && r->kind != DEAR_RULE_END && (on >> f & 1); r++)
        if (r->kind == kind && rule_applies(r, on, split))
            return r;
    return NULL;
}

/* Row f meets r->other: it narrows itself or turns off, and rank 0 says so once. */
static void yield(dear_ctx_t *ctx, int f, const dear_feature_rule_t *r)
{
    if (ctx->cm.rank == 0)
        DEAR_INFO("api", "%s with %s: %s", whats[f], whats[r->other], r->why);
    rows[f]->yield(ctx, r->other);
}

/* The features left on once those that give way to another have turned off, in table order (a
 * feature that gave way no longer makes another give way); with a ctx, each one that gives way
 * does so (yield). */
static unsigned effective(dear_ctx_t *ctx, unsigned on, int split)
{
    for (int f = 0; f < DEAR_FEAT_COUNT; f++) {
        const dear_feature_rule_t *r = rule_of(f, DEAR_RULE_GIVES_WAY, on, split);
        if (r == NULL)
            continue;
        if (ctx)
            yield(ctx, f, r);
        on &= ~(1u << f);
    }
    return on;
}

int dear_feature_refused(unsigned on, int split, char *msg, size_t len)
{
    on = effective(NULL, on, split);
    for (int f = 0; f < DEAR_FEAT_COUNT; f++) {
        const dear_feature_rule_t *r = rule_of(f, DEAR_RULE_REFUSES, on, split);
        if (r) {
            snprintf(msg, len, "%s and %s do not go together%s: %s", whats[f], whats[r->other],
                     r->when == DEAR_WHEN_SPLIT ? " with the phases apart (DEAR_SCHEDULE=dear, or sharded)" : "",
                     r->why);
            return 1;
        }
    }
    return 0;
}

static unsigned features_on(const dear_ctx_t *ctx)
{
    unsigned on = 0;
    for (int f = 0; f < DEAR_FEAT_COUNT; f++)
        if (rows[f]->on && rows[f]->on(ctx))
            on |= 1u << f;
    return on;
}

/* The features that give way turn off, then the refusals, with the same verdict on every rank
 * (every row decided collectively), then the yields of those left on. */
static int check_pairs(dear_ctx_t *ctx)
{
    unsigned on = features_on(ctx);
    int split = dear_rt_split(ctx);
    unsigned left = effective(ctx, on, split);
    char msg[512];
    if (dear_feature_refused(on, split, msg, sizeof msg)) {
        DEAR_ERROR("api", "dear_commit: %s", msg);
        return DEAR_ERR_UNSUPPORTED;
    }
    for (int f = 0; f < DEAR_FEAT_COUNT; f++)
        for (const dear_feature_rule_t *r = rows[f]->rules; r && r->kind != DEAR_RULE_END && (left >> f & 1); r++)
            if (r->kind == DEAR_RULE_YIELDS && rule_applies(r, left, split))
                yield(ctx, f, r);
    return DEAR_OK;
}

int dear_features_commit(dear_ctx_t *ctx)
{
    dear_feat_t ord[DEAR_FEAT_COUNT];
    if (!order(ord)) {
        DEAR_ERROR("api", "dear_commit: the feature table's `after` masks form a cycle");
        return DEAR_ERR_INTERNAL;
    }
    for (int i = 0; i < DEAR_FEAT_COUNT; i++)
        if (rows[ord[i]]->decide)
            DEAR_CHECK(rows[ord[i]]->decide(ctx));
    DEAR_CHECK(check_pairs(ctx));
    for (int i = 0; i < DEAR_FEAT_COUNT; i++)
        if (rows[ord[i]]->setup && rows[ord[i]]->on(ctx))
            DEAR_CHECK(rows[ord[i]]->setup(ctx));
    return DEAR_OK;
}

/* The steps after set-up run over the rows that are on, in the same order. */
#define EACH_ON(ctx, STEP, CALL)                                                                                       \
    do {                                                                                                               \
        dear_feat_t ord_[DEAR_FEAT_COUNT];                                                                             \
        int ok_ = order(ord_);                                                                                         \
        for (int i_ = 0; ok_ && i_ < DEAR_FEAT_COUNT; i_++) {                                                          \
            const dear_feature_t *row = rows[ord_[i_]];                                                                \
            if (row->STEP && row->on(ctx))                                                                             \
                CALL;                                                                                                  \
        }                                                                                                              \
    } while (0)

int dear_features_mem(dear_ctx_t *ctx)
{
    EACH_ON(ctx, mem, DEAR_CHECK(row->mem(ctx)));
    return DEAR_OK;
}

int dear_features_graph(dear_ctx_t *ctx)
{
    EACH_ON(ctx, graph, DEAR_CHECK(row->graph(ctx)));
    return DEAR_OK;
}

void dear_features_profile(const dear_ctx_t *ctx, dear_profile_t *prof)
{
    EACH_ON(ctx, profile, row->profile(ctx, prof));
}

/* Releases run on every row, on or not: a commit that failed half-way may have left state in
 * a row that a later refusal turned off. */
void dear_features_graph_free(dear_ctx_t *ctx)
{
    for (int f = 0; f < DEAR_FEAT_COUNT; f++)
        if (rows[f]->graph_free)
            rows[f]->graph_free(ctx);
}

void dear_features_free(dear_ctx_t *ctx)
{
    for (int f = 0; f < DEAR_FEAT_COUNT; f++)
        if (rows[f]->free)
            rows[f]->free(ctx);
}
