/* What the files of the CUDA backend share (cuda.c, mem_cuda.c, nccl.c); nothing above cuda/
 * includes it. */
#ifndef DEAR_CUDA_IMPL_H
#define DEAR_CUDA_IMPL_H

#include <stddef.h>

#include <cuda_runtime.h>

#include "collectives/mem.h"
#include "collectives/net.h"
#include "cuda/cuda.h"

extern const dear_mem_ops_t dear_cuda_mem_direct_ops;
extern const dear_mem_ops_t dear_cuda_mem_staged_ops;

/* Pinned host memory, on the NUMA node of the GPU dear_cuda_open found when hwloc could place it
 * (else cudaHostAlloc's). */
int dear_cuda_pinned_alloc(size_t bytes, void **p);
void dear_cuda_pinned_free(void *p);

/* The CUDA stream of a queue of the CUDA rows (mem_cuda.c). */
cudaStream_t dear_cuda_queue_stream(const dear_memq_t *q);

#ifdef HAVE_NCCL
/* The NCCL transport (nccl.c): collective over comm, a communicator on the calling thread's
 * current device whose collectives run on stream. Every rank returns the same status;
 * DEAR_ERR_TIMEOUT when its set-up ran past timeout_s. */
int dear_nccl_create(MPI_Comm comm, cudaStream_t stream, double timeout_s, dear_transport_t **out);
#endif

#endif
