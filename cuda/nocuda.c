/* Built when CUDA is off: every CUDA entry point reports that it is not in this build. */
#include "cuda/cuda.h"

#include "include/dear_types.h"

int dear_cuda_built(void) { return 0; }
int dear_nccl_built(void) { return 0; }
int dear_nccl_alltoall(void) { return 0; }

int dear_cuda_device_count(int *n)
{
    *n = 0;
    return DEAR_ERR_UNSUPPORTED;
}

int dear_cuda_pointer_device(const void *p, size_t bytes, int *device)
{
    *device = -1;
    return DEAR_ERR_UNSUPPORTED;
}

int dear_cuda_current_device(int *device)
{
    *device = -1;
    return DEAR_ERR_UNSUPPORTED;
}

int dear_cuda_open(MPI_Comm comm, int want, double init_timeout_s, dear_cuda_t **out) { return DEAR_ERR_UNSUPPORTED; }
void dear_cuda_close(dear_cuda_t *c) {}
const dear_mem_ops_t *dear_cuda_mem(const dear_cuda_t *c) { return NULL; }
dear_memq_t *dear_cuda_comm_queue(const dear_cuda_t *c) { return NULL; }
dear_transport_t *dear_cuda_transport(const dear_cuda_t *c) { return NULL; }
const char *dear_cuda_transport_name(const dear_cuda_t *c) { return "none"; }
int dear_cuda_queue_wrap(void *stream, dear_memq_t **q) { return DEAR_ERR_UNSUPPORTED; }
void dear_cuda_queue_free(dear_memq_t *q) {}
