/*
 * Plans: which tensors travel together, separately for each phase.
 *
 * Tensors are numbered 0..n-1 in forward (registration) order; gradients become ready in the
 * reverse order. A partition cuts 0..n-1 into contiguous groups, stored as boundaries in
 * forward order: group g holds tensors [first[g], first[g+1]), first[0] = 0 and
 * first[ngroups] = n. A plan has two partitions under one objective, the iteration time:
 *   rs: reduce-scatter buckets (all-reduce buckets for wfbp), launched last group first, as
 *       backward completes them;
 *   ag: all-gather groups, run in forward order during the next forward pass (schedule dear);
 *       the last ag_early of them (the last layers' tensors, needed last in forward and reduced
 *       first in backward) run early instead: during backward, each right behind the
 *       reduce-scatter that completes its data, so link time left idle by backward carries
 *       all-gather traffic and the next forward waits for less.
 * Pure C: no MPI, no CUDA. Planners fill plans; the runtime executes them.
 */
#ifndef DEAR_FUSION_PLAN_H
#define DEAR_FUSION_PLAN_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    size_t bytes;   /* gradient size */
    int layer;      /* caller's layer id, non-decreasing in forward order */
} dear_tensor_desc_t;

typedef struct {
    int ngroups;
    int *first;     /* ngroups + 1 boundaries */
} dear_partition_t;

typedef struct {
    int ntensors;
    dear_partition_t rs;
    dear_partition_t ag;
    int ag_early;       /* 0..ag.ngroups: trailing all-gather groups run during backward */
    char planner[32];   /* who made it, for logs and plan files */
} dear_plan_t;

/* Set p from ngroups+1 boundaries (copied); checks they are strictly increasing from 0 to n. */
int dear_partition_set(dear_partition_t *p, int ntensors, int ngroups, const int *first);
void dear_partition_free(dear_partition_t *p);
/* Group holding tensor t, by binary search. */
int dear_partition_group_of(const dear_partition_t *p, int t);

void dear_plan_free(dear_plan_t *plan);
int dear_plan_copy(dear_plan_t *dst, const dear_plan_t *src);
/* DEAR_OK if both partitions are well formed for ntensors; else DEAR_ERR_FORMAT with msg. */
int dear_plan_validate(const dear_plan_t *plan, int ntensors, char *msg, size_t msglen);
/* 1 if both partitions are equal. */
int dear_plan_equal(const dear_plan_t *a, const dear_plan_t *b);
/* Human-readable summary: groups with tensor ranges and bytes. */
void dear_plan_print(FILE *out, const dear_plan_t *plan, const dear_tensor_desc_t *tensors);

/* Replace *plan with one of ntensors tensors made from the two partitions' boundaries (copied)
 * and the planner's name, no early all-gather groups; *plan is untouched on error. */
int dear_plan_set(dear_plan_t *plan, int ntensors, int nrs, const int *rs_first, int nag, const int *ag_first,
                  const char *planner);

/* Replace *plan with the same partition for both phases (ngroups+1 boundaries, copied). */
int dear_plan_same(dear_plan_t *plan, int ntensors, int ngroups, const int *first, const char *planner);

/* Planner `none`: one bucket per layer (WFBP), same partition for both phases. */
int dear_plan_none(dear_plan_t *plan, int ntensors, const dear_tensor_desc_t *tensors);
/* Planner `threshold`: walking backward from the last tensor, a bucket is closed once it holds
 * at least `threshold` bytes (Horovod, PyTorch DDP, DeAR); same partition for both phases. */
int dear_plan_threshold(dear_plan_t *plan, int ntensors, const dear_tensor_desc_t *tensors,
                        size_t threshold);

#endif
