/*
 * Element-wise reduction kernels of the collectives: sums with an optional fused scale, per
 * element type. The type and the scale are resolved once per call, never per element, so the
 * loops inside are plain and vectorise (reduce.c is built with -O3). 16-bit float types are
 * widened to float32, added (and scaled) in float32 and rounded once per call to the nearest
 * even 16-bit value; the collectives keep their partial sums in float32 (widen, widen_acc,
 * narrow), so a sum over any number of ranks is rounded once. int32 sums wrap modulo 2^32 like
 * MPI_SUM in Open MPI.
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

/* Exact 16-bit sums: partial sums of bfloat16 and float16 are kept in float32 and rounded once,
 * when the result is final. widen: dst = float32(src); widen_acc: acc += float32(src); narrow:
 * dst = round(src * scale) to the 16-bit type. For DEAR_FLOAT32 they copy, add and scale. */
void dear_reduce_widen(dear_dtype_t dtype, float *dst, const void *src, size_t n);
void dear_reduce_widen_acc(dear_dtype_t dtype, float *acc, const void *src, size_t n);
void dear_reduce_narrow(dear_dtype_t dtype, void *dst, const float *src, size_t n, double scale);
/* A compressed hop, dtype 16-bit: dst = round((a + float32(b)) * scale), or when dst32 is not NULL
 * dst32 = (a + float32(b)) * scale (dst32 may be exactly a); the bits of widen, sum, narrow. */
void dear_reduce_wire_add(dear_dtype_t dtype, void *dst, float *dst32, const float *a, const void *b, size_t n,
                          double scale);
/* Error feedback against the 16-bit type dtype: x = v + e, v = round(x) (as float32), e = x - v,
 * exact in float32; e = 0 where v overflowed to an infinity (or x is not finite). */
void dear_reduce_feedback(dear_dtype_t dtype, float *v, float *e, size_t n);
/* int8 with a float32 scale per block of DEAR_Q8_BLOCK elements (collectives/elem.h): n elements
 * travel as their blocks' scales, then n codes, blocks cut from element 0. dear_q8_bytes: that
 * size. pack: the blocks of src[0..n) into dst (4-byte aligned); with e (not NULL, n elements) it
 * quantizes x = src + e and leaves in e what that dropped, x - value (0 where a block is not
 * finite): error feedback. unpack: dst = the values (acc 0) or dst += them (acc 1), in float32. */
size_t dear_q8_bytes(size_t n);
/* A buffer slot for one packed run of n elements: its bytes rounded up to 16, so that the next
 * slot's scales stay aligned. */
static inline size_t dear_q8_stride(size_t n) { return (dear_q8_bytes(n) + 15) & ~(size_t)15; }
void dear_reduce_q8_pack(void *dst, const float *src, float *e, size_t n);
void dear_reduce_q8_unpack(float *dst, const void *src, size_t n, int acc);
/* 1 for the 16-bit floating types, whose partial sums must not be rounded on the way. */
static inline int dear_dtype_is16(dear_dtype_t dtype) { return dtype == DEAR_BFLOAT16 || dtype == DEAR_FLOAT16; }

/* Leading zero bytes of the n bytes at p (n when all are zero): the zero-block scan of the sparse
 * collectives, bitwise, so -0.0 is not zero and a zero block is rebuilt exactly by zero-filling;
 * one call skips a whole run of zero blocks, however small they are. */
size_t dear_reduce_zero_prefix(const void *p, size_t n);

/* Negative zeros of a float32 or float64 vector made positive (other types: nothing). */
void dear_reduce_zero_sign(dear_dtype_t dtype, void *v, size_t n);

/* Sum of the squares of src[0..n), added in float64 in index order (global-norm clipping). */
double dear_reduce_sumsq(dear_dtype_t dtype, const void *src, size_t n);

/* Elements of src[0..n) that are NaN or infinite (DEAR_CHECK_FINITE), from their exponent bits:
 * no arithmetic, so it runs at the speed of the reads. */
size_t dear_reduce_nonfinite(dear_dtype_t dtype, const void *src, size_t n);

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
