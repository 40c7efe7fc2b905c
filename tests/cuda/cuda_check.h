/*
 * tests/cuda/cuda_check.h: what the CUDA and NCCL tests share, in both of their builds (against
 * the emulator, -DCUEMU_BUILD, and against the real libraries): one-line checks of a call's
 * result that name the call and the error, and the 16-bit float formats decoded the plain way
 * (bit fields), to check results with a method other than the emulator's.
 */
#ifndef DEAR_TESTS_CUDA_CHECK_H
#define DEAR_TESTS_CUDA_CHECK_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

#define CK_CUDA(call)                                                                          \
    do {                                                                                       \
        cudaError_t ck_err_ = (call);                                                          \
        ck_assert_msg(ck_err_ == cudaSuccess, "%s: %s", #call, cudaGetErrorName(ck_err_));     \
    } while (0)

/* Half precision from its fields: sign, 5-bit exponent biased by 15, 10-bit fraction. */
static inline double test_half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, f = h & 0x3ff;
    double v = e == 0 ? ldexp(f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexp(1024 + f, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* The half encoding of an integer |k| < 2048, which it represents exactly. */
static inline uint16_t test_half_of_int(int k)
{
    uint16_t sign = k < 0 ? 0x8000 : 0;
    unsigned a = (unsigned)(k < 0 ? -k : k);
    if (a == 0)
        return sign;
    int e = 0;
    while ((a >> (e + 1)) != 0)
        e++;
    return sign | (uint16_t)((e + 15) << 10) | (uint16_t)(((a << (10 - e)) & 0x3ff));
}

/* bfloat16 is the high half of a float32. */
static inline double test_bf16_value(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t test_bf16_of_int(int k)
{
    float f = (float)k; /* exact for |k| < 256, the bfloat16 mantissa's reach */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

#endif
