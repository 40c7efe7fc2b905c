/*
 * The CUDA backend, as the runtime sees it: what the build has and the machine offers, what a
 * registered pointer is, and a context's device side (dear_cuda_t): its GPU, its communication
 * stream, the row of the memory table its gradients are reached through and, under nccl, the
 * transport that runs their collectives. Without CUDA in the build (nocuda.c) every function
 * exists and reports DEAR_ERR_UNSUPPORTED, so callers need no #ifdef and the core library never
 * links libcudart.
 */
#ifndef DEAR_CUDA_H
#define DEAR_CUDA_H

#include <mpi.h>

#include "collectives/mem.h"
#include "collectives/net.h"

/* 1 if built with CUDA, 0 if not. */
int dear_cuda_built(void);
/* 1 if built with NCCL. */
int dear_nccl_built(void);
/* 1 if the NCCL loaded has ncclAlltoAll (2.28 and newer), which int8 compression needs there. */
int dear_nccl_alltoall(void);
/* Number of visible CUDA devices in *n. DEAR_ERR_UNSUPPORTED without CUDA in the build,
 * DEAR_ERR_CUDA when the driver cannot be queried (no GPU, no driver): *n is 0 then. */
int dear_cuda_device_count(int *n);

/* What p (bytes long) is: *device >= 0, the device's index, for memory of a CUDA device (the
 * whole range inside one allocation), -1 for host memory, pinned or not. DEAR_ERR_UNSUPPORTED
 * without CUDA; DEAR_ERR_CUDA when no driver answers (then nothing is known). */
int dear_cuda_pointer_device(const void *p, size_t bytes, int *device);
/* The calling thread's current device. */
int dear_cuda_current_device(int *device);

/* DEAR_CUDA_TRANSPORT's choices, in the parameter table's order. */
enum { DEAR_CUDA_T_AUTO, DEAR_CUDA_T_NCCL, DEAR_CUDA_T_STAGED };

typedef struct dear_cuda dear_cuda_t;

/* Collective over comm: the device side of a context on the calling thread's current device.
 * want (rank 0's DEAR_CUDA_TRANSPORT) picks the transport: nccl (refused, naming them, where
 * two ranks share a GPU or NCCL is not built), staged, or auto: nccl when every rank has a GPU
 * of its own and NCCL sets up, staged otherwise (logged at info level). Every rank returns the
 * same status; DEAR_ERR_TIMEOUT when NCCL's set-up ran past init_timeout_s. */
int dear_cuda_open(MPI_Comm comm, int want, double init_timeout_s, dear_cuda_t **out);
void dear_cuda_close(dear_cuda_t *c);

/* The memory row of the gradients: direct (nccl) or staged (DEAR_MEM_F_STAGE). */
const dear_mem_ops_t *dear_cuda_mem(const dear_cuda_t *c);
/* The communication stream, as a queue of that row (dear_cuda_close destroys it). */
dear_memq_t *dear_cuda_comm_queue(const dear_cuda_t *c);
/* The NCCL transport that runs the gradients' collectives, or NULL when staged. */
dear_transport_t *dear_cuda_transport(const dear_cuda_t *c);
/* "nccl" or "staged". */
const char *dear_cuda_transport_name(const dear_cuda_t *c);
/* The application's stream (a cudaStream_t; NULL for the legacy default stream) as a queue of the
 * row, never destroyed by it; free the wrapper with dear_cuda_queue_free. */
int dear_cuda_queue_wrap(void *stream, dear_memq_t **q);
void dear_cuda_queue_free(dear_memq_t *q);

#endif
