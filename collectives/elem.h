/*
 * The element conversions every kernel shares: bfloat16 and IEEE binary16 to and from float32,
 * and 8-bit codes with a float32 scale per block, branch-free so that loops over them vectorise. One source for the host's kernels (reduce.c)
 * and the device's (cuda/kern_body.h), which nvcc compiles for the GPU and the C compiler for
 * the emulated runtime, so every path rounds alike.
 */
#ifndef DEAR_ELEM_H
#define DEAR_ELEM_H

#include <stdint.h>
#include <string.h>

#include "include/dear_types.h"

#ifdef __CUDACC__
#define DEAR_ELEM_FN __host__ __device__ static inline
#else
#define DEAR_ELEM_FN static inline
#endif

DEAR_ELEM_FN float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

DEAR_ELEM_FN uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* bfloat16 is the top half of a float32. */
DEAR_ELEM_FN float bf16_to_f(uint16_t h) { return bits_f((uint32_t)h << 16); }

/* Round to nearest even; NaNs stay NaN (quiet bit forced so truncation cannot make an Inf). */
DEAR_ELEM_FN uint16_t f_to_bf16(float f)
{
    uint32_t u = f_bits(f);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)(((u & 0x7FFFFFFFu) > 0x7F800000u) ? nan : rounded);
}

/* IEEE binary16 -> binary32, exact. Normals and subnormals: place exponent and mantissa in a
 * float32 and rescale by 2^112 (exact: a power of two). Inf/NaN: force the float32 exponent. */
DEAR_ELEM_FN float half_to_f(uint16_t h)
{
    uint32_t em = (uint32_t)(h & 0x7FFFu);
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t finite = f_bits(bits_f(em << 13) * 0x1p112f);
    uint32_t special = 0x7F800000u | ((em & 0x3FFu) << 13);
    uint32_t is_special = 0u - (uint32_t)(em >= 0x7C00u);
    return bits_f(sign | (special & is_special) | (finite & ~is_special));
}

/* IEEE binary32 -> binary16, round to nearest even, overflow to Inf, NaN to a quiet NaN,
 * subnormal results rounded by the FPU (F. Giesen's float_to_half_fast3_rtne, branch-free). */
DEAR_ELEM_FN uint16_t f_to_half(float f)
{
    const uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t u = f_bits(f);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint32_t big = 0x7C00u | (0x0200u & (0u - (uint32_t)(u > f32infty)));
    uint32_t sub = f_bits(bits_f(u) + bits_f(denorm_magic)) - denorm_magic;
    uint32_t mant_odd = (u >> 13) & 1u;
    uint32_t norm = (u + (uint32_t)((15 - 127) * (1 << 23)) + 0xFFFu + mant_odd) >> 13;
    /* Selects as masks: gcc if-converts nested conditionals in this loop body less reliably. */
    uint32_t is_big = 0u - (uint32_t)(u >= f16max);
    uint32_t is_sub = ~is_big & (0u - (uint32_t)(u < (113u << 23)));
    uint32_t is_norm = ~(is_big | is_sub);
    uint32_t o = (big & is_big) | (sub & is_sub) | (norm & is_norm);
    return (uint16_t)(o | (sign >> 16));
}

/* int8 with one float32 scale per block of DEAR_Q8_BLOCK elements (DEAR_COMPRESS=int8): a
 * block of n elements travels as its scale then n codes, value = code * scale with
 * scale = max|x| / 127 and code = x / scale rounded to nearest even, so every element is within
 * scale / 2 of its input (up to float32 rounding). 256 keeps the scale's share of the bytes at
 * 1/64 while one large element costs the precision of 256 neighbours only. */
#define DEAR_Q8_BLOCK DEAR_COMPRESS_INT8_BLOCK

/* The scale of a block from its largest magnitude: 0 for a zero block (its codes are all 0);
 * NaN when the block holds a NaN or an infinity, so that every value of it arrives NaN and a
 * non-finite gradient is not hidden (the finite check and clipping see it). */
DEAR_ELEM_FN float q8_scale(float amax)
{
    float s = amax / 127.0f;
    return s - s == 0.0f ? s : bits_f(0x7FC00000u);
}

/* The code of x in a block of finite scale > 0: 1.5 * 2^23 added and taken away rounds to
 * nearest even without a library call, the same on the host and the device. |x| <= amax keeps
 * the quotient within 127 (1 + 2^-23) for a normal scale, and within 254 for a subnormal one
 * rounded down; the clamp is on the integer so that the loop stays free of float selects, which
 * gcc leaves scalar. */
DEAR_ELEM_FN int8_t f_to_q8(float x, float scale)
{
    int32_t c = (int32_t)((x / scale + 12582912.0f) - 12582912.0f);
    c = c > 127 ? 127 : c;
    c = c < -127 ? -127 : c;
    return (int8_t)c;
}

DEAR_ELEM_FN float q8_to_f(int8_t q, float scale) { return (float)q * scale; }

/* |x| as bits, whose maximum over a block is the block's largest magnitude: for non-negative
 * floats the integer order is the float order, and a NaN's bits lie above an infinity's, so the
 * maximum of a block holding one is a NaN and q8_scale makes its scale NaN. */
DEAR_ELEM_FN uint32_t q8_mag(float x) { return f_bits(x) & 0x7FFFFFFFu; }

#endif
