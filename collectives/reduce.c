/*
 * Reduction kernels (see reduce.h). Each kernel is a simple counted loop over restrict
 * pointers with branch-free conversions, so gcc vectorises every one of them; the type switch
 * and the scale == 1 test happen once per call. This file is built with -O3 and a dynamic
 * vectorisation cost model (collectives/local.mk). Conversions use mask selects, not ?:, which
 * gcc leaves scalar (the vectorisation report: docs/PERFORMANCE.md#reduce-kernels).
 */
#include "collectives/reduce.h"
#include "collectives/elem.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* On x86-64 each kernel is also built for AVX2, picked at load time (an ifunc): twice the
 * vector width for the 16-bit conversions, which the progress thread runs on every compressed
 * byte; the same C, so the same results. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define KERNEL __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef KERNEL
#define KERNEL
#endif

float dear_bf16_to_float(unsigned short h) { return bf16_to_f(h); }
unsigned short dear_float_to_bf16(float f) { return f_to_bf16(f); }
float dear_half_to_float(unsigned short h) { return half_to_f(h); }
unsigned short dear_float_to_half(float f) { return f_to_half(f); }

/* dst = a + b (three distinct arrays) and dst += b (accumulate), per type, with and without
 * scale. Macros keep the eight loops identical in shape. */
#define DEF_KERNELS(NAME, T, LOAD, STORE, ACC_T)                                                \
    KERNEL static void sum_##NAME(T *restrict d, const T *restrict a, const T *restrict b, size_t n) \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = STORE((ACC_T)LOAD(a[i]) + (ACC_T)LOAD(b[i]));                               \
    }                                                                                          \
    KERNEL static void acc_##NAME(T *restrict d, const T *restrict b, size_t n)                       \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = STORE((ACC_T)LOAD(d[i]) + (ACC_T)LOAD(b[i]));                               \
    }                                                                                          \
    KERNEL static void sums_##NAME(T *restrict d, const T *restrict a, const T *restrict b, size_t n, \
                            ACC_T s)                                                           \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = STORE(((ACC_T)LOAD(a[i]) + (ACC_T)LOAD(b[i])) * s);                         \
    }                                                                                          \
    KERNEL static void accs_##NAME(T *restrict d, const T *restrict b, size_t n, ACC_T s)             \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = STORE(((ACC_T)LOAD(d[i]) + (ACC_T)LOAD(b[i])) * s);                         \
    }                                                                                          \
    KERNEL static void scale_##NAME(T *restrict d, const T *restrict a, size_t n, ACC_T s)            \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = STORE((ACC_T)LOAD(a[i]) * s);                                               \
    }                                                                                          \
    KERNEL static void scalei_##NAME(T *restrict d, size_t n, ACC_T s)                                \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = STORE((ACC_T)LOAD(d[i]) * s);                                               \
    }

#define ID(x) (x)
DEF_KERNELS(f32, float, ID, ID, float)
DEF_KERNELS(f64, double, ID, ID, double)
DEF_KERNELS(bf16, uint16_t, bf16_to_f, f_to_bf16, float)
DEF_KERNELS(f16, uint16_t, half_to_f, f_to_half, float)
/* int32 adds in uint32 so that overflow wraps (defined) instead of being undefined. */
DEF_KERNELS(i32, uint32_t, ID, ID, uint32_t)

/* 16-bit types summed in float32 and rounded once: widen, accumulate widened, narrow. */
#define DEF_WIDE_KERNELS(NAME, LOAD, STORE)                                                    \
    KERNEL static void widen_##NAME(float *restrict d, const uint16_t *restrict a, size_t n)         \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = LOAD(a[i]);                                                                 \
    }                                                                                          \
    KERNEL static void wacc_##NAME(float *restrict d, const uint16_t *restrict a, size_t n)          \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] += LOAD(a[i]);                                                                \
    }                                                                                          \
    KERNEL static void narrow_##NAME(uint16_t *restrict d, const float *restrict a, size_t n, float s) \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = STORE(a[i] * s);                                                            \
    }

DEF_WIDE_KERNELS(bf16, bf16_to_f, f_to_bf16)
DEF_WIDE_KERNELS(f16, half_to_f, f_to_half)

/* A compressed hop in one pass: the received 16-bit partial sum widened, the own float32 input
 * added, scaled, rounded (or kept float32: in place on a, or into another vector). */
#define DEF_HOP(NAME, LOAD, STORE)                                                             \
    KERNEL static void hop_##NAME(uint16_t *restrict d, const float *restrict a, const uint16_t *restrict b, \
                                  size_t n, float s)                                          \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = STORE((a[i] + LOAD(b[i])) * s);                                             \
    }                                                                                          \
    KERNEL static void hop32_##NAME(float *restrict d, const float *restrict a, const uint16_t *restrict b, \
                                    size_t n, float s)                                        \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = (a[i] + LOAD(b[i])) * s;                                                    \
    }                                                                                          \
    KERNEL static void hop32i_##NAME(float *restrict d, const uint16_t *restrict b, size_t n, float s) \
    {                                                                                          \
        for (size_t i = 0; i < n; i++)                                                         \
            d[i] = (d[i] + LOAD(b[i])) * s;                                                    \
    }

DEF_HOP(bf16, bf16_to_f, f_to_bf16)
DEF_HOP(f16, half_to_f, f_to_half)

void dear_reduce_wire_add(dear_dtype_t dtype, void *dst, float *dst32, const float *a, const void *b, size_t n,
                          double scale)
{
    float s = (float)scale;
    int bf = dtype == DEAR_BFLOAT16;
    if (dst32 == NULL)
        (bf ? hop_bf16 : hop_f16)(dst, a, b, n, s);
    else if (dst32 == a)
        (bf ? hop32i_bf16 : hop32i_f16)(dst32, b, n, s);
    else
        (bf ? hop32_bf16 : hop32_f16)(dst32, a, b, n, s);
}

/* The rounding error of a float32 to fewer significant bits is a float32 itself, so e is exact. */
#define DEF_FEEDBACK(NAME, LOAD, STORE)                                                        \
    KERNEL static void feedback_##NAME(float *restrict v, float *restrict e, size_t n)               \
    {                                                                                          \
        for (size_t i = 0; i < n; i++) {                                                       \
            float x = v[i] + e[i], q = LOAD(STORE(x)), d = x - q;                              \
            e[i] = isfinite(d) ? d : 0.0f;                                                     \
            v[i] = q;                                                                          \
        }                                                                                      \
    }

DEF_FEEDBACK(bf16, bf16_to_f, f_to_bf16)
DEF_FEEDBACK(f16, half_to_f, f_to_half)

void dear_reduce_feedback(dear_dtype_t dtype, float *v, float *e, size_t n)
{
    if (dtype == DEAR_BFLOAT16)
        feedback_bf16(v, e, n);
    else if (dtype == DEAR_FLOAT16)
        feedback_f16(v, e, n);
}

void dear_reduce_widen(dear_dtype_t dtype, float *dst, const void *src, size_t n)
{
    if (dtype == DEAR_BFLOAT16)
        widen_bf16(dst, src, n);
    else if (dtype == DEAR_FLOAT16)
        widen_f16(dst, src, n);
    else if (dtype == DEAR_FLOAT32 && (const void *)dst != src)
        memcpy(dst, src, n * sizeof(float));
}

void dear_reduce_widen_acc(dear_dtype_t dtype, float *acc, const void *src, size_t n)
{
    if (dtype == DEAR_BFLOAT16)
        wacc_bf16(acc, src, n);
    else if (dtype == DEAR_FLOAT16)
        wacc_f16(acc, src, n);
    else if (dtype == DEAR_FLOAT32)
        acc_f32(acc, src, n);
}

void dear_reduce_narrow(dear_dtype_t dtype, void *dst, const float *src, size_t n, double scale)
{
    if (dtype == DEAR_BFLOAT16)
        narrow_bf16(dst, src, n, (float)scale);
    else if (dtype == DEAR_FLOAT16)
        narrow_f16(dst, src, n, (float)scale);
    else if (dtype == DEAR_FLOAT32)
        dear_reduce_scale(DEAR_FLOAT32, dst, src, n, scale);
}

/* int8 blocks (elem.h). The largest magnitude is taken on the bits (q8_mag): an integer max
 * vectorises where a float one does not. */
KERNEL static float q8_amax(const float *restrict x, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = q8_mag(x[i]);
        m = a > m ? a : m;
    }
    return bits_f(m);
}

KERNEL static void q8_codes(int8_t *restrict q, const float *restrict x, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        q[i] = f_to_q8(x[i], s);
}

/* e = x - value, exact or nearly (|e| <= scale / 2); x is e itself on entry. */
KERNEL static void q8_keep(float *restrict e, const int8_t *restrict q, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        e[i] -= q8_to_f(q[i], s);
}

KERNEL static void q8_values(float *restrict d, const int8_t *restrict q, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        d[i] = q8_to_f(q[i], s);
}

KERNEL static void q8_values_acc(float *restrict d, const int8_t *restrict q, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        d[i] += q8_to_f(q[i], s);
}

size_t dear_q8_bytes(size_t n)
{
    return (n + DEAR_Q8_BLOCK - 1) / DEAR_Q8_BLOCK * sizeof(float) + n;
}

void dear_reduce_q8_pack(void *dst, const float *src, float *e, size_t n)
{
    size_t nb = (n + DEAR_Q8_BLOCK - 1) / DEAR_Q8_BLOCK;
    int8_t *codes = (int8_t *)((char *)dst + nb * sizeof(float));
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DEAR_Q8_BLOCK, len = n - lo < DEAR_Q8_BLOCK ? n - lo : DEAR_Q8_BLOCK;
        const float *x = src + lo;
        if (e != NULL) {
            for (size_t i = 0; i < len; i++)
                e[lo + i] += src[lo + i];
            x = e + lo;
        }
        float s = q8_scale(q8_amax(x, len));
        memcpy((char *)dst + b * sizeof(float), &s, sizeof s);
        int finite = s - s == 0.0f;
        if (finite && s > 0.0f)
            q8_codes(codes + lo, x, len, s);
        else
            memset(codes + lo, 0, len);
        /* What a zero block drops is nothing; a non-finite one's residual restarts from zero, as
         * the 16-bit feedback does. */
        if (e != NULL && finite && s > 0.0f)
            q8_keep(e + lo, codes + lo, len, s);
        else if (e != NULL)
            memset(e + lo, 0, len * sizeof(float));
    }
}

void dear_reduce_q8_unpack(float *dst, const void *src, size_t n, int acc)
{
    size_t nb = (n + DEAR_Q8_BLOCK - 1) / DEAR_Q8_BLOCK;
    const int8_t *codes = (const int8_t *)((const char *)src + nb * sizeof(float));
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DEAR_Q8_BLOCK, len = n - lo < DEAR_Q8_BLOCK ? n - lo : DEAR_Q8_BLOCK;
        float s;
        memcpy(&s, (const char *)src + b * sizeof(float), sizeof s);
        (acc ? q8_values_acc : q8_values)(dst + lo, codes + lo, len, s);
    }
}

size_t dear_reduce_zero_prefix(const void *p, size_t n)
{
    /* 64 bytes per test: a run of zeros costs one OR per word and vectorises; the first non-zero
     * 64 bytes end it, and the byte it starts at is found within them. */
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        uint64_t w[8], o = 0;
        memcpy(w, b + i, sizeof w);
        for (int k = 0; k < 8; k++)
            o |= w[k];
        if (o != 0)
            break;
    }
    while (i < n && b[i] == 0)
        i++;
    return i;
}

void dear_reduce_zero_sign(dear_dtype_t dtype, void *v, size_t n)
{
    /* x == 0 holds for both zeros, so assigning +0 there changes nothing else. */
    if (dtype == DEAR_FLOAT32) {
        float *f = v;
        for (size_t i = 0; i < n; i++)
            f[i] = f[i] == 0.0f ? 0.0f : f[i];
    } else if (dtype == DEAR_FLOAT64) {
        double *d = v;
        for (size_t i = 0; i < n; i++)
            d[i] = d[i] == 0.0 ? 0.0 : d[i];
    }
}

size_t dear_reduce_nonfinite(dear_dtype_t dtype, const void *src, size_t n)
{
    size_t bad = 0;
    switch (dtype) {
    case DEAR_FLOAT32: {
        const uint32_t *u = src;
        for (size_t i = 0; i < n; i++)
            bad += (u[i] & 0x7f800000u) == 0x7f800000u;
        break;
    }
    case DEAR_FLOAT64: {
        const uint64_t *u = src;
        for (size_t i = 0; i < n; i++)
            bad += (u[i] & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        break;
    }
    case DEAR_BFLOAT16: {
        const uint16_t *u = src;
        for (size_t i = 0; i < n; i++)
            bad += (u[i] & 0x7f80u) == 0x7f80u;
        break;
    }
    case DEAR_FLOAT16: {
        const uint16_t *u = src;
        for (size_t i = 0; i < n; i++)
            bad += (u[i] & 0x7c00u) == 0x7c00u;
        break;
    }
    default:
        break; /* integers are always finite */
    }
    return bad;
}

double dear_reduce_sumsq(dear_dtype_t dtype, const void *src, size_t n)
{
    double s = 0;
    switch (dtype) {
    case DEAR_FLOAT32:
        for (size_t i = 0; i < n; i++)
            s += (double)((const float *)src)[i] * ((const float *)src)[i];
        break;
    case DEAR_FLOAT64:
        for (size_t i = 0; i < n; i++)
            s += ((const double *)src)[i] * ((const double *)src)[i];
        break;
    case DEAR_BFLOAT16:
        for (size_t i = 0; i < n; i++) {
            double v = bf16_to_f(((const uint16_t *)src)[i]);
            s += v * v;
        }
        break;
    case DEAR_FLOAT16:
        for (size_t i = 0; i < n; i++) {
            double v = half_to_f(((const uint16_t *)src)[i]);
            s += v * v;
        }
        break;
    case DEAR_INT32:
        for (size_t i = 0; i < n; i++)
            s += (double)((const int32_t *)src)[i] * ((const int32_t *)src)[i];
        break;
    }
    return s;
}

#define DISPATCH_SUM(NAME, T, ACC_T)                                                           \
    do {                                                                                       \
        T *d_ = dst;                                                                           \
        const T *a_ = a, *b_ = b;                                                              \
        if ((const void *)d_ == (const void *)b_) { /* sum is commutative */                   \
            b_ = a_;                                                                           \
            a_ = d_;                                                                           \
        }                                                                                      \
        if (scale == 1.0) {                                                                    \
            if ((const void *)d_ == (const void *)a_)                                          \
                acc_##NAME(d_, b_, n);                                                         \
            else                                                                               \
                sum_##NAME(d_, a_, b_, n);                                                     \
        } else {                                                                               \
            if ((const void *)d_ == (const void *)a_)                                          \
                accs_##NAME(d_, b_, n, (ACC_T)scale);                                          \
            else                                                                               \
                sums_##NAME(d_, a_, b_, n, (ACC_T)scale);                                      \
        }                                                                                      \
    } while (0)

void dear_reduce_sum(dear_dtype_t dtype, void *dst, const void *a, const void *b, size_t n,
                     double scale)
{
    switch (dtype) {
    case DEAR_FLOAT32: DISPATCH_SUM(f32, float, float); break;
    case DEAR_FLOAT64: DISPATCH_SUM(f64, double, double); break;
    case DEAR_BFLOAT16: DISPATCH_SUM(bf16, uint16_t, float); break;
    case DEAR_FLOAT16: DISPATCH_SUM(f16, uint16_t, float); break;
    case DEAR_INT32: DISPATCH_SUM(i32, uint32_t, uint32_t); break;
    }
}

#define DISPATCH_SCALE(NAME, T, ACC_T, ESIZE)                                                  \
    do {                                                                                       \
        if (scale == 1.0) {                                                                    \
            if (dst != src)                                                                    \
                memcpy(dst, src, n * (ESIZE));                                                 \
        } else if (dst == src) {                                                               \
            scalei_##NAME((T *)dst, n, (ACC_T)scale);                                          \
        } else {                                                                               \
            scale_##NAME((T *)dst, (const T *)src, n, (ACC_T)scale);                           \
        }                                                                                      \
    } while (0)

void dear_reduce_scale(dear_dtype_t dtype, void *dst, const void *src, size_t n, double scale)
{
    switch (dtype) {
    case DEAR_FLOAT32: DISPATCH_SCALE(f32, float, float, 4); break;
    case DEAR_FLOAT64: DISPATCH_SCALE(f64, double, double, 8); break;
    case DEAR_BFLOAT16: DISPATCH_SCALE(bf16, uint16_t, float, 2); break;
    case DEAR_FLOAT16: DISPATCH_SCALE(f16, uint16_t, float, 2); break;
    case DEAR_INT32: DISPATCH_SCALE(i32, uint32_t, uint32_t, 4); break;
    }
}

double dear_elem_get(dear_dtype_t dtype, const void *buf, size_t i)
{
    switch (dtype) {
    case DEAR_FLOAT32: return ((const float *)buf)[i];
    case DEAR_FLOAT64: return ((const double *)buf)[i];
    case DEAR_BFLOAT16: return dear_bf16_to_float(((const uint16_t *)buf)[i]);
    case DEAR_FLOAT16: return dear_half_to_float(((const uint16_t *)buf)[i]);
    case DEAR_INT32: return ((const int32_t *)buf)[i];
    }
    return NAN;
}

void dear_elem_put(dear_dtype_t dtype, void *buf, size_t i, double v)
{
    switch (dtype) {
    case DEAR_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DEAR_FLOAT64: ((double *)buf)[i] = v; break;
    case DEAR_BFLOAT16: ((uint16_t *)buf)[i] = dear_float_to_bf16((float)v); break;
    case DEAR_FLOAT16: ((uint16_t *)buf)[i] = dear_float_to_half((float)v); break;
    case DEAR_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    }
}
