/* Check macros of the CUDA backend, after base/check.h: a failed CUDA or NCCL call is logged
 * once, where it happens, with its text and place, and becomes DEAR_ERR_CUDA. */
#ifndef DEAR_CUDA_CHECK_H
#define DEAR_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "base/log.h"
#include "include/dear_types.h"

#define DEAR_CUDA_CHECK(call)                                                                  \
    do {                                                                                       \
        cudaError_t dear_cu_rc_ = (call);                                                      \
        if (dear_cu_rc_ != cudaSuccess) {                                                      \
            DEAR_ERROR("cuda", "%s failed: %s (%s:%d)", #call, cudaGetErrorString(dear_cu_rc_), \
                       __FILE__, __LINE__);                                                    \
            return DEAR_ERR_CUDA;                                                              \
        }                                                                                      \
    } while (0)

#define DEAR_CUDA_CHECK_GOTO(call, rc, label)                                                  \
    do {                                                                                       \
        cudaError_t dear_cu_rc_ = (call);                                                      \
        if (dear_cu_rc_ != cudaSuccess) {                                                      \
            DEAR_ERROR("cuda", "%s failed: %s (%s:%d)", #call, cudaGetErrorString(dear_cu_rc_), \
                       __FILE__, __LINE__);                                                    \
            (rc) = DEAR_ERR_CUDA;                                                              \
            goto label;                                                                        \
        }                                                                                      \
    } while (0)

#ifdef HAVE_NCCL
#include <nccl.h>
#define DEAR_NCCL_CHECK(call)                                                                  \
    do {                                                                                       \
        ncclResult_t dear_nc_rc_ = (call);                                                     \
        if (dear_nc_rc_ != ncclSuccess && dear_nc_rc_ != ncclInProgress) {                     \
            DEAR_ERROR("nccl", "%s failed: %s (%s) (%s:%d)", #call, ncclGetErrorString(dear_nc_rc_), \
                       ncclGetLastError(NULL), __FILE__, __LINE__);                            \
            return DEAR_ERR_CUDA;                                                              \
        }                                                                                      \
    } while (0)
#endif

#endif
