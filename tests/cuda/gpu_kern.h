/*
 * The test application's GPU work (test_gpu.c): its "layers" as kernels on its compute stream,
 * real in gpu_kern.cu and emulated in gpu_kern_emu.c, from the per-element formulas below.
 *   grad      writes (or adds, for accumulation) layer t's gradient of rank r, iteration it,
 *             after spinning delay_us: a deliberately slow kernel still running when the host has
 *             already reported the layer done
 *   sgd       w -= lr * g, the update each tensor's callback launches on the stream it is given
 *   sum       the sum of w in float64 into out[0]: what a forward pass read
 */
#ifndef DEAR_TESTS_GPU_KERN_H
#define DEAR_TESTS_GPU_KERN_H

#include <stddef.h>

#include <cuda_runtime.h>

#include "collectives/elem.h"
#include "include/dear_types.h"

#ifdef __CUDACC__
#define TK_FN __host__ __device__ static inline
#else
#define TK_FN static inline
#endif

/* Element i of tensor t's gradient on rank r in iteration it (micro-batch m): small integers,
 * exact in every floating type and in every sum of a few ranks. */
TK_FN float tk_grad_value(int t, int r, long it, int m, size_t i)
{
    return (float)((int)((i * 7 + (size_t)t * 5 + (size_t)r * 3 + (size_t)it * 2 + (size_t)m) % 9) - 4);
}

/* Element i of a gradient of type t (float32 or a 16-bit type) as float32, and back. */
TK_FN float tk_load(dear_dtype_t t, const void *g, size_t i)
{
    if (t == DEAR_FLOAT32)
        return ((const float *)g)[i];
    uint16_t h = ((const uint16_t *)g)[i];
    return t == DEAR_BFLOAT16 ? bf16_to_f(h) : half_to_f(h);
}

TK_FN void tk_store(dear_dtype_t t, void *g, size_t i, float v)
{
    if (t == DEAR_FLOAT32)
        ((float *)g)[i] = v;
    else
        ((uint16_t *)g)[i] = t == DEAR_BFLOAT16 ? f_to_bf16(v) : f_to_half(v);
}

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t tk_grad(cudaStream_t s, dear_dtype_t dtype, void *g, size_t n, int t, int r, long it, int m, int accumulate,
                    int delay_us);
cudaError_t tk_sgd(cudaStream_t s, float *w, const void *g, dear_dtype_t dtype, size_t n, float lr);
cudaError_t tk_sum(cudaStream_t s, const float *w, size_t n, double *out);

#ifdef __cplusplus
}
#endif

#endif
