/*
 * Units: the tensors cut into the pieces a plan ranges over. A tensor larger than the partition
 * size (DEAR_PARTITION, dear-plan --partition) is cut into chunks of about equal size, so that a
 * bucket boundary may fall inside it: its reduce-scatter can start with part of it and its
 * all-gather can be spread over groups. Every chunk of a tensor is ready when the tensor is (the
 * end of its layer's backward) and the tensor's update runs once, after its last chunk is in
 * place. The runtime's planning, dear-plan and dear-bench's predictions cut with the one function
 * below, so all three plan over the same units. Pure C.
 */
#ifndef DEAR_FUSION_UNITS_H
#define DEAR_FUSION_UNITS_H

#include <stddef.h>

#include "fusion/plan.h"
#include "fusion/profile.h"

/* Dense cuts fall on multiples of this many bytes: a multiple of every element size (2, 4 and 8
 * bytes), so a profile, which records no element type, is cut exactly where the runtime cuts the
 * registered tensors. */
#define DEAR_UNIT_ALIGN 64
/* The most units a plan may have (a plan file's bound on tensors too). */
#define DEAR_UNITS_MAX (1 << 20)

/* Cut ntensors tensors (bytes, layer; row_bytes for sparse ones) at partition bytes (0: never):
 * a tensor of B > partition bytes becomes k = ceil(B / partition) chunks, chunk i ending at
 * floor(i B / k) rounded down to a multiple of its alignment (its row when sparse, else
 * DEAR_UNIT_ALIGN), and never more chunks than whole alignments fit, so none is empty. *units
 * gets *nunits entries ({t, 0, 0} for a tensor left whole), or NULL when no tensor is cut (free
 * it). DEAR_ERR_ARG, logged naming the partition, when the units would exceed DEAR_UNITS_MAX. */
int dear_units_cut(int ntensors, const dear_tensor_desc_t *tensors, size_t partition, dear_unit_t **units,
                   int *nunits);

/* Whether the units (nunits of them, NULL: none cut) fit the tensors: each chunk inside its
 * tensor, the chunks ending at its size, and every cut on a whole element (elem_bytes) and, for a
 * sparse tensor, on a whole row (row_bytes). DEAR_OK, else DEAR_ERR_MISMATCH with msg naming the
 * first chunk that does not fit. */
int dear_units_check(int ntensors, const dear_tensor_desc_t *tensors, int nunits, const dear_unit_t *units,
                     char *msg, size_t msglen);

/* The descriptors of the units (chunk, nchunks set) for the planners that take descriptors,
 * from the tensors' (sizes from the tensors for whole ones). *out: nunits entries; free it. */
int dear_units_descs(int ntensors, const dear_tensor_desc_t *tensors, int nunits, const dear_unit_t *units,
                     dear_tensor_desc_t **out);

/* The profile whose tensors are the units (units NULL: every tensor whole), the profile the
 * planners and the simulator take: each unit has its tensor's name, layer, sparse block and
 * densities, chunk and nchunks, and its share of the bytes; a tensor the profile prices below the
 * units' size (a frozen one, priced at 1 byte) gives each of its units 1 byte. *out is checked. */
int dear_prof_units(const dear_profile_t *prof, int nunits, const dear_unit_t *units, dear_profile_t *out);

/* A profile cut at partition bytes, as the runtime cuts the registered tensors: *units and
 * *nunits as dear_units_cut gives them, *out the profile of those units (dear_prof_units). On
 * failure neither is set. */
int dear_prof_cut(const dear_profile_t *prof, size_t partition, dear_unit_t **units, int *nunits,
                  dear_profile_t *out);

#endif
