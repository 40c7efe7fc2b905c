/* CUDA device discovery; built only with CUDA (cuda/local.mk). */
#include "config.h"

#include "cuda/cuda.h"

#include <cuda_runtime.h>

#include "include/dear.h"
#include "base/log.h"

int dear_cuda_built(void) { return 1; }

int dear_nccl_built(void)
{
#ifdef HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

int dear_cuda_device_count(int *n)
{
    *n = 0;
    cudaError_t err = cudaGetDeviceCount(n);
    if (err != cudaSuccess) {
        DEAR_INFO("cuda", "cudaGetDeviceCount: %s", cudaGetErrorString(err));
        *n = 0;
        return DEAR_ERR_CUDA;
    }
    return DEAR_OK;
}
