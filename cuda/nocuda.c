/* Built when CUDA is off: every CUDA entry point reports that it is not in this build. */
#include "cuda/cuda.h"

#include "include/dear.h"

int dear_cuda_built(void) { return 0; }
int dear_nccl_built(void) { return 0; }

int dear_cuda_device_count(int *n)
{
    *n = 0;
    return DEAR_ERR_UNSUPPORTED;
}
