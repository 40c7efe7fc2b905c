// The CUDA memory row's kernels on the GPU (kern.h): grid-stride loops over kern_body.h's
// per-element arithmetic, int8 packing a thread block per int8 block, and a two-pass,
// fixed-order squared norm.
#include "cuda/kern.h"
#include "cuda/kern_body.h"

namespace {

const int kThreads = DEAR_KERN_THREADS;

unsigned blocks_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

__global__ void scale_k(dear_dtype_t t, void *dst, const void *src, size_t n, double s)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        kern_scale_at(t, dst, src, i, s);
}

__global__ void sum_k(dear_dtype_t t, void *dst, const void *a, const void *b, size_t n, double s)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        kern_sum_at(t, dst, a, b, i, s);
}

__global__ void widen_k(dear_dtype_t t, float *dst, const void *src, size_t n, int acc)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (acc)
            kern_widen_acc_at(t, dst, src, i);
        else
            kern_widen_at(t, dst, src, i);
    }
}

__global__ void narrow_k(dear_dtype_t t, void *dst, const float *src, size_t n, double s)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        kern_narrow_at(t, dst, src, i, s);
}

__global__ void feedback_k(dear_dtype_t t, float *v, float *e, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        kern_feedback_at(t, v, e, i);
}

static_assert(DEAR_KERN_THREADS == DEAR_Q8_BLOCK, "q8_pack_k runs one thread per element of an int8 block");

// One thread block per int8 block (grid-stride over them): the block's largest magnitude by a
// tree of maxima in shared memory (exact in any order), then each thread's code and residual.
__global__ void q8_pack_k(void *dst, const float *src, float *e, size_t n)
{
    __shared__ uint32_t mag[kThreads];
    size_t nb = kern_q8_nblocks(n);
    for (size_t b = blockIdx.x; b < nb; b += gridDim.x) {
        size_t i = b * DEAR_Q8_BLOCK + threadIdx.x;
        float x = i < n ? kern_q8_in_at(src, e, i) : 0.0f;
        mag[threadIdx.x] = i < n ? q8_mag(x) : 0u;
        __syncthreads();
        for (int w = kThreads / 2; w > 0; w /= 2) {
            if ((int)threadIdx.x < w && mag[threadIdx.x + w] > mag[threadIdx.x])
                mag[threadIdx.x] = mag[threadIdx.x + w];
            __syncthreads();
        }
        float s = q8_scale(bits_f(mag[0]));
        if (threadIdx.x == 0)
            ((float *)dst)[b] = s;
        if (i < n)
            kern_q8_code_at(dst, n, e, i, x, s);
        __syncthreads(); // mag[0] is read by all before the next block overwrites it
    }
}

__global__ void q8_unpack_k(float *dst, const void *src, size_t n, int acc)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        kern_q8_value_at(dst, src, n, i, acc);
}

// Pass 1: block b adds the squares of its stride of elements and reduces them in a fixed tree.
__global__ void sumsq_partial_k(dear_dtype_t t, const void *src, size_t n, double *partial)
{
    __shared__ double acc[kThreads];
    double v = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        v += kern_sq_at(t, src, i);
    acc[threadIdx.x] = v;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            acc[threadIdx.x] += acc[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partial[blockIdx.x] = acc[0];
}

// Pass 2: the blocks' sums in block order.
__global__ void sumsq_final_k(const double *partial, int nblocks, double *out)
{
    double s = 0;
    for (int b = 0; b < nblocks; b++)
        s += partial[b];
    *out = s;
}

}  // namespace

extern "C" {

cudaError_t dear_kern_scale(cudaStream_t s, dear_dtype_t t, void *dst, const void *src, size_t n, double scale)
{
    if (n == 0)
        return cudaSuccess;
    scale_k<<<blocks_for(n), kThreads, 0, s>>>(t, dst, src, n, scale);
    return cudaGetLastError();
}

cudaError_t dear_kern_sum(cudaStream_t s, dear_dtype_t t, void *dst, const void *a, const void *b, size_t n,
                          double scale)
{
    if (n == 0)
        return cudaSuccess;
    sum_k<<<blocks_for(n), kThreads, 0, s>>>(t, dst, a, b, n, scale);
    return cudaGetLastError();
}

cudaError_t dear_kern_widen(cudaStream_t s, dear_dtype_t t, float *dst, const void *src, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    widen_k<<<blocks_for(n), kThreads, 0, s>>>(t, dst, src, n, 0);
    return cudaGetLastError();
}

cudaError_t dear_kern_widen_acc(cudaStream_t s, dear_dtype_t t, float *acc, const void *src, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    widen_k<<<blocks_for(n), kThreads, 0, s>>>(t, acc, src, n, 1);
    return cudaGetLastError();
}

cudaError_t dear_kern_narrow(cudaStream_t s, dear_dtype_t t, void *dst, const float *src, size_t n, double scale)
{
    if (n == 0)
        return cudaSuccess;
    narrow_k<<<blocks_for(n), kThreads, 0, s>>>(t, dst, src, n, scale);
    return cudaGetLastError();
}

cudaError_t dear_kern_feedback(cudaStream_t s, dear_dtype_t t, float *v, float *e, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    feedback_k<<<blocks_for(n), kThreads, 0, s>>>(t, v, e, n);
    return cudaGetLastError();
}

cudaError_t dear_kern_q8_pack(cudaStream_t s, void *dst, const float *src, float *e, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    q8_pack_k<<<blocks_for(n), kThreads, 0, s>>>(dst, src, e, n);
    return cudaGetLastError();
}

cudaError_t dear_kern_q8_unpack(cudaStream_t s, float *dst, const void *src, size_t n, int acc)
{
    if (n == 0)
        return cudaSuccess;
    q8_unpack_k<<<blocks_for(n), kThreads, 0, s>>>(dst, src, n, acc);
    return cudaGetLastError();
}

cudaError_t dear_kern_sumsq(cudaStream_t s, dear_dtype_t t, const void *src, size_t n, double *scratch, double *out)
{
    sumsq_partial_k<<<DEAR_KERN_SUMSQ_BLOCKS, kThreads, 0, s>>>(t, src, n, scratch);
    sumsq_final_k<<<1, 1, 0, s>>>(scratch, DEAR_KERN_SUMSQ_BLOCKS, scratch + DEAR_KERN_SUMSQ_BLOCKS);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return err;
    return cudaMemcpyAsync(out, scratch + DEAR_KERN_SUMSQ_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost, s);
}

}  // extern "C"
