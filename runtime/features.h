/*
 * The feature table: every optional behaviour dear_commit sets up (sharded updates, compression
 * with its error feedback, clipping, sparse tensors, unused tensors, partitions, the
 * deterministic mode, the check for non-finite gradients, gradients in CUDA memory) is one file of runtime/ and one row here, as schedules, planners and
 * transports are rows of their tables. The core (api.c, buckets.c, the schedules) never calls a
 * feature by name for these steps: it loops over the rows in the order their `after` masks give,
 * and the pairs that cannot run together are refused by one function, from the rows' rules.
 *
 * A feature's state is private to its file; another file asks it through the narrow functions
 * rt.h declares under the file's name, never by reading its fields.
 */
#ifndef DEAR_RT_FEATURES_H
#define DEAR_RT_FEATURES_H

#include <stddef.h>

#include "fusion/profile.h"
#include "include/dear.h"

/*  ID             name            row (its file)           what turns it on, for messages */
#define DEAR_FEATURE_TABLE(X)                                                                                         \
    X(CUDA, "cuda", dear_feature_cuda, "gradients in CUDA memory (DEAR_MEM_CUDA)")                                   \
    X(DETERMINISTIC, "deterministic", dear_feature_determ, "the deterministic mode (DEAR_DETERMINISTIC)")            \
    X(PARTITION, "partition", dear_feature_partition, "partitions (DEAR_PARTITION)")                                 \
    X(FINITE, "finite", dear_feature_finite, "the check for NaN and Inf gradients (DEAR_CHECK_FINITE)")               \
    X(SHARD, "shard", dear_feature_shard, "sharded updates (DEAR_SHARD, dear_set_shard)")                            \
    X(UNUSED, "unused", dear_feature_unused, "unused tensors (DEAR_FIND_UNUSED)")                                    \
    X(CLIP, "clip", dear_feature_clip, "clipping by global norm (DEAR_CLIP_NORM, dear_set_clip_norm)")               \
    X(SPARSE, "sparse", dear_feature_sparse, "sparse tensors (dear_register_sparse, DEAR_SPARSE)")                   \
    X(COMPRESS, "compress", dear_feature_compress, "compression (DEAR_COMPRESS, DEAR_COMPRESS_EF, dear_set_compress)")

#define DEAR_FEAT_ID_(ID, NAME, ROW, WHAT) DEAR_FEAT_##ID,
typedef enum { DEAR_FEATURE_TABLE(DEAR_FEAT_ID_) DEAR_FEAT_COUNT } dear_feat_t;
#undef DEAR_FEAT_ID_

#define DEAR_FEAT_BIT(ID) (1u << DEAR_FEAT_##ID)

/* When a rule applies: always, or when the reduce-scatters and all-gathers are apart (schedule
 * dear, or sharded updates under any schedule: dear_rt_split). */
typedef enum { DEAR_WHEN_ALWAYS = 0, DEAR_WHEN_SPLIT = 1 } dear_when_t;

typedef enum {
    DEAR_RULE_END = 0,
    DEAR_RULE_REFUSES,      /* commit fails on every rank, naming both features and what to change */
    DEAR_RULE_YIELDS,       /* this feature narrows itself (its row's yield) and says so once */
    DEAR_RULE_GIVES_WAY     /* this feature turns itself off (its row's yield) and says so once */
} dear_rule_kind_t;

typedef struct {
    dear_rule_kind_t kind;
    dear_feat_t other;
    dear_when_t when;
    const char *why;        /* REFUSES: the reason and what to change; YIELDS: what this feature gives up */
} dear_feature_rule_t;

/* A row. Every step may be NULL (nothing to do). Steps run in table order, except that a row
 * runs after every feature its `after` mask names. */
typedef struct dear_feature {
    unsigned after;                                 /* DEAR_FEAT_BIT()s whose steps run before this row's */
    const dear_feature_rule_t *rules;               /* ends with DEAR_RULE_END */
    /* Collective, at commit before anything is built: whether it is on, the same on every rank
     * (settings agreed or rank 0's); a bad setting fails here. */
    int (*decide)(dear_ctx_t *ctx);
    int (*on)(const dear_ctx_t *ctx);
    /* A YIELDS or GIVES_WAY rule of this row met its other feature: narrow this one, or turn it
     * off (`on` then says 0). */
    void (*yield)(dear_ctx_t *ctx, dear_feat_t other);
    /* Collective, after every row decided and the pairs were checked: the rest of its set-up. */
    int (*setup)(dear_ctx_t *ctx);
    /* After the memory's set-up: state in the memory of the buckets' buffers. */
    int (*mem)(dear_ctx_t *ctx);
    /* dear_graph_build, once buckets and all-gather groups exist: its operations' hooks, and
     * the operation it runs between the reduce-scatters and the all-gathers, if any
     * (dear_graph_barrier). */
    int (*graph)(dear_ctx_t *ctx);
    void (*graph_free)(dear_ctx_t *ctx);
    /* The bytes the planners price: this feature's change to the profile's tensors. */
    void (*profile)(const dear_ctx_t *ctx, dear_profile_t *prof);
    void (*free)(dear_ctx_t *ctx);
} dear_feature_t;

#define DEAR_FEAT_DECL_(ID, NAME, ROW, WHAT) extern const dear_feature_t ROW;
DEAR_FEATURE_TABLE(DEAR_FEAT_DECL_)
#undef DEAR_FEAT_DECL_

/* The first pair of the features in `on` that the rules refuse (split: dear_rt_split), its
 * message in msg; 0 when none is refused. Pure: the combination test asks it what to expect. */
int dear_feature_refused(unsigned on, int split, char *msg, size_t len);

/* dear_commit's steps over every row, in order: decide, the pairs (refusals, then yields),
 * setup; mem after the memory. Collective; every rank leaves with the same verdict. */
int dear_features_commit(dear_ctx_t *ctx);
int dear_features_mem(dear_ctx_t *ctx);
int dear_features_graph(dear_ctx_t *ctx);
void dear_features_graph_free(dear_ctx_t *ctx);
void dear_features_profile(const dear_ctx_t *ctx, dear_profile_t *prof);
void dear_features_free(dear_ctx_t *ctx);

#endif
