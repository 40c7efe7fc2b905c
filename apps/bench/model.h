/*
 * model.h: the emulated model of dear-bench: the profile scaled by --time-scale and
 * --size-scale, real float32 gradient and parameter buffers of its tensor sizes, gradients
 * that are closed-form functions of (element, iteration, rank), compute emulated by sleeping,
 * and the check of the parameters after a run against a float64 recomputation.
 */
#ifndef DEAR_APPS_BENCH_MODEL_H
#define DEAR_APPS_BENCH_MODEL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fusion/profile.h"
#include "include/dear.h"
#include "apps/bench/args.h"

/* One tensor's update: SGD on the parameters libdear hands over (the tensor, or a slice of it
 * under +shard), its elements counted so a missing or repeated update is caught, and the time
 * it took (the optimizer step is compute the predictions must count). */
typedef struct {
    long elems;
    double secs;
} upd_arg_t;

/* A sparse tensor's replay: each rank and iteration touches the rows of `tokens` draws from a
 * Zipf distribution over popularity ranks, rank k sitting at row k * mult mod rows. */
typedef struct {
    size_t rows, row_elems;     /* rows 0: a dense tensor */
    long tokens;
    double *cdf;                /* per popularity rank, cumulative probability */
    size_t mult;                /* coprime to rows: spreads popular rows over the shards */
    double dens_rs, dens_ag;    /* expected share of rows touched by one rank, by any rank */
} sparse_t;

typedef struct {
    dear_profile_t prof;        /* scaled: times x time-scale, bytes x size-scale */
    size_t *off, *count;        /* per tensor, elements */
    size_t nelem;
    int *lfirst, *lcount;       /* tensors of each layer index */
    float *grad, *param;
    upd_arg_t *upd;
    sparse_t *sp;               /* per tensor */
    int nsparse;
    unsigned char *hit;         /* scratch: rows touched, as many as the largest sparse tensor */
    double *flops;              /* --hints: per layer index, the hint dear_set_layer_cost gets (< 0: none) */
    double jitter_s;            /* --jitter-ms in seconds: the most injected noise per iteration */
    uint64_t jitter_seed;
} bench_model_t;

/* m (zeroed by the caller) from src scaled by o; DEAR_ERR_FORMAT when the scaled profile is
 * invalid (rank 0 says why), DEAR_ERR_NOMEM. model_free releases what was built, also after a
 * failure. */
int bench_model_build(const dear_profile_t *src, const bench_opts_t *o, bench_model_t *m);
void bench_model_free(bench_model_t *m);

/* The profile's sparse records as a configuration runs: sparse at the replay's expected
 * densities (on), or none, every tensor priced dense (off); the all-gathers dense unless ag
 * (sharded, they carry parameters). For the predictions. */
void bench_model_price_sparse(bench_model_t *m, int on, int ag);

/* Fresh parameters and update counts, for a run from the start. */
void bench_model_reset(bench_model_t *m);

/* Zero the time spent in the update callbacks, or add it up per layer index into upd_s
 * (m->prof.nlayers entries), divided by iters. */
void bench_model_upd_zero(bench_model_t *m);
void bench_model_upd_per_layer(const bench_model_t *m, int iters, double *upd_s);

/* Register every tensor with ctx, its update being SGD on its parameters, the profile's sparse
 * tensors with their rows (dear_register_sparse) and, if hints, the --hints (dear_set_layer_cost); stops at
 * the first failure and returns its status. */
int bench_model_register(dear_ctx_t *ctx, bench_model_t *m, int hints);

/* One iteration it through ctx, exactly a trainer's sequence of hooks, with this rank's
 * gradients (fault: perturbed) and the injected jitter; *compute_s: the emulated compute it
 * took, jitter included; *arrive_s: when (MPI_Wtime) its backward pass ended, before the hook
 * that hands over the last gradients. */
int bench_model_iterate(dear_ctx_t *ctx, bench_model_t *m, long it, int fault, double *compute_s, double *arrive_s);

/* The compute of bench_model_iterate without its hooks, iteration after iteration, its
 * gradients written to scratch memory, until *stop: the load training puts on this rank's
 * cores, for a calibration to run beside (--calib-load). Returns the iterations begun. */
long bench_model_replay(const bench_model_t *m, atomic_int *stop);
/* Every rank: same bytes as rank 0? Sampled elements equal to the float64 recomputation of
 * total_iters iterations? Each element updated exactly once per iteration (sharded: by one rank)?
 * Returns 1 when all hold on every rank, else 0 with the failed checks named in why. Collective. */
int bench_check_params(bench_model_t *m, long total_iters, int sharded, dear_compress_t ag, char *why,
                       size_t whylen);

#endif /* DEAR_APPS_BENCH_MODEL_H */
