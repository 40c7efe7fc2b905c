// test_gpu's kernels on a real GPU (gpu_kern.h).
#include "tests/cuda/gpu_kern.h"

namespace {

__global__ void grad_k(dear_dtype_t dt, void *g, size_t n, int t, int r, long it, int m, int acc, long long spin)
{
    if (spin > 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        long long t0 = clock64();
        while (clock64() - t0 < spin) {
        }
    }
    __syncthreads();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        tk_store(dt, g, i, (acc ? tk_load(dt, g, i) : 0.0f) + tk_grad_value(t, r, it, m, i));
}

__global__ void sgd_k(float *w, const void *g, dear_dtype_t dt, size_t n, float lr)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] -= lr * tk_load(dt, g, i);
}

__global__ void sum_k(const float *w, size_t n, double *out)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += w[i];
    *out = s;
}

}  // namespace

extern "C" {

cudaError_t tk_grad(cudaStream_t s, dear_dtype_t dtype, void *g, size_t n, int t, int r, long it, int m, int accumulate,
                    int delay_us)
{
    // The spin is one block's: a GPU clock of about 1.5 GHz, so 1500 cycles per microsecond.
    grad_k<<<1, 256, 0, s>>>(dtype, g, n, t, r, it, m, accumulate, (long long)delay_us * 1500);
    return cudaGetLastError();
}

cudaError_t tk_sgd(cudaStream_t s, float *w, const void *g, dear_dtype_t dtype, size_t n, float lr)
{
    sgd_k<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(w, g, dtype, n, lr);
    return cudaGetLastError();
}

cudaError_t tk_sum(cudaStream_t s, const float *w, size_t n, double *out)
{
    sum_k<<<1, 1, 0, s>>>(w, n, out);
    return cudaGetLastError();
}

}  // extern "C"
