/*
 * The device kernels' arithmetic, one element at a time: what cuda/kernels.cu runs on the GPU
 * (compiled by nvcc) and cuda/kernels_emu.c runs on the emulated runtime's streams (compiled by
 * the C compiler), so both compute the same values. The rules are the host row's
 * (collectives/reduce.h): 16-bit floating types are computed in float32 and rounded once to
 * nearest even, float32 in float32, float64 in float64, int32 wraps.
 */
#ifndef DEAR_KERN_BODY_H
#define DEAR_KERN_BODY_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/elem.h"
#include "include/dear_types.h"

/* Element i of p as float32 arithmetic sees it (float64 and int32 are handled apart). */
DEAR_ELEM_FN float kern_load16(dear_dtype_t t, const void *p, size_t i)
{
    uint16_t h = ((const uint16_t *)p)[i];
    return t == DEAR_BFLOAT16 ? bf16_to_f(h) : half_to_f(h);
}

DEAR_ELEM_FN void kern_store16(dear_dtype_t t, void *p, size_t i, float v)
{
    ((uint16_t *)p)[i] = t == DEAR_BFLOAT16 ? f_to_bf16(v) : f_to_half(v);
}

/* dst[i] = src[i] * s */
DEAR_ELEM_FN void kern_scale_at(dear_dtype_t t, void *dst, const void *src, size_t i, double s)
{
    switch (t) {
    case DEAR_FLOAT32: ((float *)dst)[i] = ((const float *)src)[i] * (float)s; break;
    case DEAR_FLOAT64: ((double *)dst)[i] = ((const double *)src)[i] * s; break;
    case DEAR_INT32: ((uint32_t *)dst)[i] = ((const uint32_t *)src)[i] * (uint32_t)s; break;
    default: kern_store16(t, dst, i, kern_load16(t, src, i) * (float)s); break;
    }
}

/* dst[i] = (a[i] + b[i]) * s */
DEAR_ELEM_FN void kern_sum_at(dear_dtype_t t, void *dst, const void *a, const void *b, size_t i, double s)
{
    switch (t) {
    case DEAR_FLOAT32: {
        float v = ((const float *)a)[i] + ((const float *)b)[i];
        ((float *)dst)[i] = s == 1.0 ? v : v * (float)s;
        break;
    }
    case DEAR_FLOAT64: {
        double v = ((const double *)a)[i] + ((const double *)b)[i];
        ((double *)dst)[i] = s == 1.0 ? v : v * s;
        break;
    }
    case DEAR_INT32: ((uint32_t *)dst)[i] = ((const uint32_t *)a)[i] + ((const uint32_t *)b)[i]; break;
    default: {
        float v = kern_load16(t, a, i) + kern_load16(t, b, i);
        kern_store16(t, dst, i, s == 1.0 ? v : v * (float)s);
        break;
    }
    }
}

/* float32 partial sums of 16-bit data: dst = float32(src), acc += float32(src), and the result
 * rounded once to t after the scale. float32 copies, adds and scales. */
DEAR_ELEM_FN void kern_widen_at(dear_dtype_t t, float *dst, const void *src, size_t i)
{
    dst[i] = t == DEAR_FLOAT32 ? ((const float *)src)[i] : kern_load16(t, src, i);
}

DEAR_ELEM_FN void kern_widen_acc_at(dear_dtype_t t, float *acc, const void *src, size_t i)
{
    acc[i] += t == DEAR_FLOAT32 ? ((const float *)src)[i] : kern_load16(t, src, i);
}

DEAR_ELEM_FN void kern_narrow_at(dear_dtype_t t, void *dst, const float *src, size_t i, double s)
{
    if (t == DEAR_FLOAT32)
        ((float *)dst)[i] = src[i] * (float)s;
    else
        kern_store16(t, dst, i, src[i] * (float)s);
}

/* Error feedback against the 16-bit type t (collectives/reduce.h's dear_reduce_feedback):
 * x = v + e, v = x rounded to t, e = x - v (0 where that is not finite). */
DEAR_ELEM_FN void kern_feedback_at(dear_dtype_t t, float *v, float *e, size_t i)
{
    float x = v[i] + e[i];
    float q = t == DEAR_BFLOAT16 ? bf16_to_f(f_to_bf16(x)) : half_to_f(f_to_half(x));
    float d = x - q;
    e[i] = d - d == 0.0f ? d : 0.0f;
    v[i] = q;
}

/* int8 blocks (collectives/elem.h; the host row's dear_reduce_q8_pack and _unpack): n elements
 * packed are their ceil(n / DEAR_Q8_BLOCK) float32 scales, then n codes. */
DEAR_ELEM_FN size_t kern_q8_nblocks(size_t n) { return (n + DEAR_Q8_BLOCK - 1) / DEAR_Q8_BLOCK; }

/* Element i before quantization: with error feedback (e set) what was dropped last time is added. */
DEAR_ELEM_FN float kern_q8_in_at(const float *src, const float *e, size_t i)
{
    return e != NULL ? e[i] + src[i] : src[i];
}

/* Element i's code in its block of scale s (q8_scale of the block's largest q8_mag), x its value
 * from kern_q8_in_at, and e[i] what the code drops: nothing, and codes of 0, in a zero block; a
 * non-finite block's residual restarts from zero. */
DEAR_ELEM_FN void kern_q8_code_at(void *dst, size_t n, float *e, size_t i, float x, float s)
{
    int8_t *codes = (int8_t *)((char *)dst + kern_q8_nblocks(n) * sizeof(float));
    int live = s - s == 0.0f && s > 0.0f;
    int8_t q = live ? f_to_q8(x, s) : (int8_t)0;
    codes[i] = q;
    if (e != NULL)
        e[i] = live ? x - q8_to_f(q, s) : 0.0f;
}

/* dst[i] = its value in packed src of n elements (acc: dst[i] += it). */
DEAR_ELEM_FN void kern_q8_value_at(float *dst, const void *src, size_t n, size_t i, int acc)
{
    const int8_t *codes = (const int8_t *)((const char *)src + kern_q8_nblocks(n) * sizeof(float));
    float v = q8_to_f(codes[i], ((const float *)src)[i / DEAR_Q8_BLOCK]);
    dst[i] = acc ? dst[i] + v : v;
}

/* The square of element i, in float64 (the squared norm for clipping). */
DEAR_ELEM_FN double kern_sq_at(dear_dtype_t t, const void *src, size_t i)
{
    double v;
    switch (t) {
    case DEAR_FLOAT32: v = ((const float *)src)[i]; break;
    case DEAR_FLOAT64: v = ((const double *)src)[i]; break;
    case DEAR_INT32: v = ((const int32_t *)src)[i]; break;
    default: v = kern_load16(t, src, i); break;
    }
    return v * v;
}

#endif
