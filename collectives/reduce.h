/*
 * Element-wise reduction kernels of the collectives: sums with an optional fused scale, per
 * element type. The type and the scale are resolved once per call, never per element, so the
 * loops inside are plain and vectorise (reduce.c is built with -O3). 16-bit float types are
 * widened to float32, added (and scaled) in float32 and rounded once per call to the nearest
 * even 16-bit value; int32 sums wrap modulo 2^32 like MPI_SUM in Open MPI.
 */
#ifndef DEAR_REDUCE_H
#define DEAR_REDUCE_H

#include <stddef.h>

#include "include/dear.h"

/* dst[i] = (a[i] + b[i]) * scale for i < n. dst may be exactly a (accumulate) or b; no other
 * overlap. scale == 1.0 costs nothing. */
void dear_reduce_sum(dear_dtype_t dtype, void *dst, const void *a, const void *b, size_t n,
                     double scale);

/* dst[i] = src[i] * scale; dst may be exactly src. With scale == 1.0 a copy (or nothing). */
void dear_reduce_scale(dear_dtype_t dtype, void *dst, const void *src, size_t n, double scale);

/* Scalar conversions used by the kernels and by tests as the reference rounding. */
float dear_bf16_to_float(unsigned short h);
unsigned short dear_float_to_bf16(float f);
float dear_half_to_float(unsigned short h);
unsigned short dear_float_to_half(float f);

/* Element i of buf as a double, and back (rounded to the type): for filling and verifying
 * buffers of any type in tests and benchmarks, not for hot loops. */
double dear_elem_get(dear_dtype_t dtype, const void *buf, size_t i);
void dear_elem_put(dear_dtype_t dtype, void *buf, size_t i, double v);

#endif
