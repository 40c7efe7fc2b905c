/*
 * Profiles: what the simulator and planners know about a model. Per layer (forward order) the
 * forward and backward compute seconds; per gradient tensor (forward order) its name, layer and
 * bytes. The runtime fills one from hook timestamps (median over warm-up iterations) and writes
 * it with dear_profile_save; dear-plan reads it; fusion/profiles/ ships six. A model description
 * is a profile without times: its layers may carry a compute hint (forward FLOPs) instead, from
 * which fusion/estimate.h makes times. The text formats are in docs/FORMATS.md. A tensor may be sparse: its gradient travels in blocks, of which only the
 * non-zero ones are sent, and the profile then says how dense each phase is, so the planners
 * price what travels rather than the dense size. Pure C.
 */
#ifndef DEAR_FUSION_PROFILE_H
#define DEAR_FUSION_PROFILE_H

#include <stddef.h>
#include <stdio.h>

#include "base/algo_table.h"
#include "fusion/plan.h"
#include "include/dear_types.h"

#define DEAR_PROF_NAME_MAX 64

typedef struct {
    int id;             /* caller's layer id, strictly increasing in forward order */
    double fwd_s;       /* forward compute seconds */
    double bwd_s;       /* backward compute seconds (all of the layer's gradients) */
    double flops;       /* relative forward compute (FLOPs, any one unit for every layer); < 0: no hint */
} dear_prof_layer_t;

typedef struct {
    char name[DEAR_PROF_NAME_MAX];
    int layer;          /* caller's layer id (one of the layers) */
    int lidx;           /* index of that layer in layers[], set by dear_prof_check */
    size_t bytes;
    size_t block_bytes; /* sparse: bytes of one block (divides bytes); 0: dense */
    double density_rs;  /* sparse: non-zero fraction of blocks one rank sends in reduce-scatter */
    double density_ag;  /* sparse: non-zero fraction of blocks of the reduced result (the union) */
    int chunk, nchunks; /* a profile of units (fusion/units.h): place among its tensor's chunks; nchunks
                         * 0 or 1: a whole tensor */
    dear_compress_t compress_rs, compress_ag; /* the 16-bit format the float32 gradient travels in
                         * per phase (an all-reduce: its two halves); NONE: as it is. Not in files:
                         * a run's setting, applied by dear_prof_set_compress */
    double step_s;      /* sharded updates: seconds this rank's step of the tensor's slice takes on the
                         * compute stream, after its reduce-scatter (fusion/sim.h); 0: none. Not in
                         * files: a run's measurement */
} dear_prof_tensor_t;

typedef struct {
    char model[DEAR_PROF_NAME_MAX];
    int nlayers, ntensors;
    int no_times;       /* a model description: times unknown (0), written as 'dear-model 1' */
    dear_prof_layer_t *layers;
    dear_prof_tensor_t *tensors;
    int cap_layers, cap_tensors;
} dear_profile_t;

/* Builder: init (empty, zeroed struct), then layers and tensors in forward order, then check. A
 * layer is added without a compute hint; dear_prof_set_flops gives the last added one its hint. */
void dear_prof_init(dear_profile_t *prof, const char *model);
int dear_prof_add_layer(dear_profile_t *prof, int id, double fwd_s, double bwd_s);
void dear_prof_set_flops(dear_profile_t *prof, double flops);
int dear_prof_add_tensor(dear_profile_t *prof, const char *name, int layer, size_t bytes);
/* Mark the last added tensor sparse: blocks of block_bytes, densities in [0, 1]. Checked by
 * dear_prof_check. */
void dear_prof_set_sparse(dear_profile_t *prof, size_t block_bytes, double density_rs, double density_ag);
/* Checks layer ids strictly increase, times are finite and >= 0, hints finite, every tensor names a declared
 * layer, tensor layers are non-decreasing, names are non-empty without blanks, sizes > 0; fills
 * lidx; a sparse tensor's block divides its bytes and its densities lie in [0, 1].
 * DEAR_ERR_FORMAT with a message otherwise. */
int dear_prof_check(dear_profile_t *prof, char *msg, size_t msglen);
void dear_prof_free(dear_profile_t *prof);
/* A copy of src, every field of every layer and tensor; *out is replaced only on success. */
int dear_prof_copy(const dear_profile_t *src, dear_profile_t *out);

/* Text format (docs/FORMATS.md): 'dear-profile 1' (times), or 'dear-model 1' for a model
 * description (no_times: layers with an optional hint instead of times). load reads either:
 * DEAR_ERR_IO if the file cannot be read, DEAR_ERR_FORMAT for a bad or truncated file, with an
 * error naming the file and line. load replaces *prof only on success, freeing what it held: it
 * must be initialised (dear_prof_init, or zeroed). */
int dear_prof_write(const dear_profile_t *prof, FILE *out);
int dear_prof_save(const dear_profile_t *prof, const char *path);
int dear_prof_load(const char *path, dear_profile_t *prof);

/* Compression of tensor t (t < 0: of every tensor), taken as float32: its reduce-scatters (and
 * all-reduces) travel in rs's format, its all-gathers in ag's. */
void dear_prof_set_compress(dear_profile_t *prof, int t, dear_compress_t rs, dear_compress_t ag);

/* Index bytes the sparse collectives send with each non-zero block. */
#define DEAR_PROF_SPARSE_IDX_BYTES 4
/* Bytes tensor t puts on the wire in one collective of op: all of them when dense, half when
 * compressed (a float32 in 16 bits); when sparse its non-zero blocks, so compressed, with their
 * indices (not compressed), never more than dense (the collectives send a message dense when
 * sparse would be no smaller). All-reduce: the reduce-scatter's; one whose halves differ (sparse,
 * or compressed apart) is priced by the simulator as a reduce-scatter then an all-gather. */
double dear_prof_wire_bytes(const dear_prof_tensor_t *t, dear_coll_op_t op);

/* Sharded steps from per-layer times: each tensor's step_s is layer_s[its layer index] times its
 * share of the layer's bytes (prof checked: lidx set). */
int dear_prof_set_steps(dear_profile_t *prof, const double *layer_s);

/* Totals, and the tensor list the plan functions take (bytes, layer, chunks, sparse row; caller
 * frees *descs). */
double dear_prof_fwd_total(const dear_profile_t *prof);
double dear_prof_bwd_total(const dear_profile_t *prof);
size_t dear_prof_bytes_total(const dear_profile_t *prof);
int dear_prof_descs(const dear_profile_t *prof, dear_tensor_desc_t **descs);

#endif
