/*
 * The device kernels of the CUDA memory row (mem_cuda.c): launchers that enqueue on a stream and
 * return at once. Real in kernels.cu (nvcc, sm_80 and sm_90 plus PTX), emulated in
 * kernels_emu.c (the tests' emulated runtime); both run kern_body.h's arithmetic. Errors are
 * cudaError_t values (0 on success).
 */
#ifndef DEAR_KERN_H
#define DEAR_KERN_H

#include <stddef.h>

#include <cuda_runtime.h>

#include "include/dear_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks of the first pass of sumsq: its partial sums need that many doubles of device scratch. */
#define DEAR_KERN_SUMSQ_BLOCKS 128
#define DEAR_KERN_THREADS 256

cudaError_t dear_kern_scale(cudaStream_t s, dear_dtype_t t, void *dst, const void *src, size_t n, double scale);
cudaError_t dear_kern_sum(cudaStream_t s, dear_dtype_t t, void *dst, const void *a, const void *b, size_t n,
                          double scale);
cudaError_t dear_kern_widen(cudaStream_t s, dear_dtype_t t, float *dst, const void *src, size_t n);
cudaError_t dear_kern_widen_acc(cudaStream_t s, dear_dtype_t t, float *acc, const void *src, size_t n);
cudaError_t dear_kern_narrow(cudaStream_t s, dear_dtype_t t, void *dst, const float *src, size_t n, double scale);
cudaError_t dear_kern_feedback(cudaStream_t s, dear_dtype_t t, float *v, float *e, size_t n);
/* int8 blocks (kern_body.h's packing): dst = src packed, each value plus e's residual where e is
 * set (e then keeps what the codes drop); dst = the values of packed src (acc: added to dst). dst
 * of pack and src of unpack 4-byte aligned. */
cudaError_t dear_kern_q8_pack(cudaStream_t s, void *dst, const float *src, float *e, size_t n);
cudaError_t dear_kern_q8_unpack(cudaStream_t s, float *dst, const void *src, size_t n, int acc);
/* *out (pinned host memory) = the sum of the squares of src: DEAR_KERN_SUMSQ_BLOCKS blocks of
 * DEAR_KERN_THREADS threads each add a stride of elements and reduce them in a fixed tree, then
 * the blocks' sums are added in block order into scratch[DEAR_KERN_SUMSQ_BLOCKS] and copied to
 * *out: the same value on every run. scratch: DEAR_KERN_SUMSQ_BLOCKS + 1 doubles of device memory. */
cudaError_t dear_kern_sumsq(cudaStream_t s, dear_dtype_t t, const void *src, size_t n, double *scratch, double *out);

#ifdef __cplusplus
}
#endif

#endif
