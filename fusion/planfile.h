/*
 * Plan files (docs/FORMATS.md): a plan written by dear-plan or the runtime and loaded with
 * DEAR_PLAN_FILE. The file records the tensor list it was made for (index, name, layer,
 * bytes) and where each cut tensor is cut (its units, fusion/units.h), so loading it against
 * the registered tensors can say exactly what does not fit. Version 1 files (no cuts) are still
 * read: every tensor is one unit. Pure C.
 */
#ifndef DEAR_FUSION_PLANFILE_H
#define DEAR_FUSION_PLANFILE_H

#include <stdio.h>

#include "fusion/plan.h"

/* names may be NULL (tensors are then written as t0, t1, ...). */
int dear_planfile_write(FILE *out, const dear_plan_t *plan, const dear_tensor_desc_t *tensors,
                        const char *const *names);
int dear_planfile_save(const char *path, const dear_plan_t *plan, const dear_tensor_desc_t *tensors,
                       const char *const *names);
/* Load and check against the ntensors registered tensors (tensors and names may be NULL to
 * skip that part of the check). DEAR_ERR_IO: unreadable; DEAR_ERR_FORMAT: malformed (the error
 * names file and line), including a cut outside its tensor, out of order or overlapping;
 * DEAR_ERR_MISMATCH: made for another number of tensors (refused at its 'tensors' line, before
 * the rest is read), a cut that does not fit a registered tensor (its size, inside an element of
 * elem_bytes or a row of row_bytes: refused at its line), or well formed but made for other
 * tensors (the error names the first tensor that differs). *plan is set only on success. */
int dear_planfile_load(const char *path, int ntensors, const dear_tensor_desc_t *tensors,
                       const char *const *names, dear_plan_t *plan);

#endif
