/*
 * Plans: which tensors travel together, separately for each phase.
 *
 * A plan ranges over units: the tensors in forward (registration) order, each whole or cut into
 * chunks (fusion/units.h: a tensor above DEAR_PARTITION bytes), so that a bucket boundary may
 * fall inside a tensor. Units are numbered 0..n-1 in forward order; gradients become ready in
 * the reverse order, a chunk's when its tensor's is. A partition cuts 0..n-1 into contiguous
 * groups, stored as boundaries in forward order: group g holds units [first[g], first[g+1]),
 * first[0] = 0 and first[ngroups] = n. A plan has two partitions under one objective, the
 * iteration time:
 *   rs: reduce-scatter buckets (all-reduce buckets for wfbp), launched last group first, as
 *       backward completes them;
  *   ag: all-gather groups, run in forward order during the next forward pass (schedule dear);
 *       some of them run early instead: during backward, each right behind the reduce-scatter
 *       that completes its data, so link time left idle by backward carries all-gather traffic
 *       and the next forward waits for less. Usually the last ag_early groups (the last layers'
 *       tensors, needed last in forward and reduced first in backward); any set where early
 *       marks them (a group of the first layers gathered in backward's idle link time spares
 *       the forward a wait that the trailing run can only move).
 * Pure C: no MPI, no CUDA. Planners fill plans; the runtime executes them.
 */
#ifndef DEAR_FUSION_PLAN_H
#define DEAR_FUSION_PLAN_H

#include <stddef.h>
#include <stdio.h>

/* A tensor, or a unit of one, as the planners and the unit cut see it. */
typedef struct {
    size_t bytes;       /* gradient size */
    int layer;          /* caller's layer id, non-decreasing in forward order */
    int chunk, nchunks; /* a unit: its place among its tensor's chunks; nchunks 0 or 1: whole */
    size_t elem_bytes;  /* a tensor: its element size, which a cut must respect (0: unknown) */
    size_t row_bytes;   /* a tensor: its sparse block (a row), which a cut must respect (0: dense) */
} dear_tensor_desc_t;

/* A unit of a plan: bytes [offset, offset + bytes) of a tensor. A whole tensor is {t, 0, 0}: its
 * size is the registry's (or the profile's), which the plan need not know. */
typedef struct {
    int tensor;
    size_t offset;
    size_t bytes;       /* 0: the whole tensor */
} dear_unit_t;

typedef struct {
    int ngroups;
    int *first;     /* ngroups + 1 boundaries */
} dear_partition_t;

typedef struct {
    int nunits;         /* what the partitions range over */
    dear_partition_t rs;
    dear_partition_t ag;
    int ag_early;       /* 0..ag.ngroups: all-gather groups run during backward: the trailing ones,
                         * or those early marks */
    unsigned char *early; /* NULL, or per all-gather group 1 if it runs during backward (any set;
                           * dear_plan_set_early keeps it NULL for a trailing run) */
    char planner[32];   /* who made it, for logs and plan files */
    int ntensors;       /* the tensors the units are cut from */
    dear_unit_t *units; /* nunits of them, in order; NULL: every tensor whole (nunits == ntensors) */
} dear_plan_t;

/* Set p from ngroups+1 boundaries (copied); checks they are strictly increasing from 0 to n. */
int dear_partition_set(dear_partition_t *p, int nunits, int ngroups, const int *first);
void dear_partition_free(dear_partition_t *p);
/* 1 if both have the same groups (the same boundaries). */
int dear_partition_equal(const dear_partition_t *a, const dear_partition_t *b);

void dear_plan_free(dear_plan_t *plan);
int dear_plan_copy(dear_plan_t *dst, const dear_plan_t *src);
/* DEAR_OK if the plan is well formed for ntensors tensors: its units cover them in order (each
 * tensor whole, or chunks back to back from byte 0) and both partitions cover its units; else
 * DEAR_ERR_FORMAT with msg. Whether the cuts fit the tensors' sizes, elements and rows is
 * dear_units_check's (fusion/units.h). */
int dear_plan_validate(const dear_plan_t *plan, int ntensors, char *msg, size_t msglen);
/* 1 if units, both partitions and the early groups are equal. */
int dear_plan_equal(const dear_plan_t *a, const dear_plan_t *b);
/* 1 if all-gather group g runs during backward. */
int dear_plan_is_early(const dear_plan_t *plan, int g);
/* The early all-gather groups: early[g] != 0 for each of plan->ag.ngroups groups (copied); NULL
 * for none. A trailing run is kept as a count alone (early NULL), so equal sets compare, save
 * and broadcast alike. DEAR_ERR_NOMEM leaves the plan as it was. */
int dear_plan_set_early(dear_plan_t *plan, const unsigned char *early);
/* Human-readable summary: groups with unit ranges and bytes (units: the descriptors of the
 * plan's units, or NULL). */
void dear_plan_print(FILE *out, const dear_plan_t *plan, const dear_tensor_desc_t *units);

/* Replace *plan with one of nunits whole tensors made from the two partitions' boundaries
 * (copied) and the planner's name, no early all-gather groups; *plan is untouched on error. */
int dear_plan_set(dear_plan_t *plan, int nunits, int nrs, const int *rs_first, int nag, const int *ag_first,
                  const char *planner);
/* Give a plan made over units (plan->nunits of them) the units it was made over, cut from
 * ntensors tensors (copied; NULL or none cut: every tensor whole). DEAR_ERR_ARG when the count
 * differs or the units are malformed (dear_plan_validate). */
int dear_plan_set_units(dear_plan_t *plan, int ntensors, const dear_unit_t *units);

/* Replace *plan with the same partition for both phases (ngroups+1 boundaries, copied). */
int dear_plan_same(dear_plan_t *plan, int nunits, int ngroups, const int *first, const char *planner);

/* Planner `none`: one bucket per layer (WFBP), and one per chunk of a cut tensor (no fusion at
 * all, as ByteScheduler sends each partition); the same partition for both phases. */
int dear_plan_none(dear_plan_t *plan, int nunits, const dear_tensor_desc_t *units);
/* Planner `threshold`: walking backward from the last unit, a bucket is closed once it holds
 * at least `threshold` bytes (Horovod, PyTorch DDP, DeAR); same partition for both phases. */
int dear_plan_threshold(dear_plan_t *plan, int nunits, const dear_tensor_desc_t *units, size_t threshold);

#endif
