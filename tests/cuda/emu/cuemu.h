/*
 * cuemu.h: what the emulated CUDA runtime and NCCL (tests/cuda/emu, README.md there) offer
 * beyond the real APIs. Code built against the emulator (-DCUEMU_BUILD) may use these names and
 * no other non-CUDA ones: an emulated kernel, the translation of a device pointer inside it, and
 * the counters of the misuses the emulator flagged. Everything else is the real cuda_runtime.h
 * and nccl.h, implemented with their real signatures.
 */
#ifndef CUEMU_H
#define CUEMU_H

#include <stddef.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The body of an emulated __global__ kernel: runs once, on the stream's worker thread, when the
 * stream reaches it; it loops over the elements itself. */
typedef void (*cuemu_kernel_fn)(void *arg);

/* Enqueues fn(arg) on stream as a kernel launch would (stream order, the stream's random delay).
 * arg is passed unchanged: it must stay valid until the kernel has run. The stream must belong
 * to the current device, as for <<<...>>>; errors are also left for cudaGetLastError. */
cudaError_t cuemu_kernel(cudaStream_t stream, cuemu_kernel_fn fn, void *arg);

/* The same, but the size bytes at args are copied at launch, as CUDA copies kernel parameters:
 * fn gets a pointer to the copy, so args may live on the caller's stack. */
cudaError_t cuemu_kernel_args(cudaStream_t stream, cuemu_kernel_fn fn, const void *args, size_t size);

/* Inside an emulated kernel: the address through which the kernel reads and writes the memory a
 * device pointer names (the worker's read-write view of it). Pinned host pointers
 * (cudaMallocHost, cudaHostAlloc, cudaHostRegister) come back unchanged, NULL as NULL. Anything
 * a GPU kernel could not dereference (pageable host memory, freed or unknown device memory, a
 * call from outside a kernel) is flagged and gives NULL. */
void *cuemu_device_view(const void *ptr);

/* The kinds of misuse the emulator flags: each prints one line on stderr, counts, and aborts
 * the process under CUEMU_STRICT=1. */
enum cuemu_flag {
    CUEMU_FLAG_PAGEABLE,         /* async copy with pageable host memory; kernel on host memory */
    CUEMU_FLAG_UNRECORDED_EVENT, /* wait on, query or synchronize an event never recorded */
    CUEMU_FLAG_OTHER_DEVICE,     /* pointer, event or stream of another device than the work's */
    CUEMU_FLAG_FREE_IN_USE,      /* memory freed or unregistered while queued work uses it */
    CUEMU_FLAG_BAD_POINTER,      /* unknown, freed or out-of-bounds device memory */
    CUEMU_FLAG_BAD_HANDLE,       /* destroyed or unknown stream, event or communicator */
    CUEMU_FLAG_CALLBACK_API,     /* a CUDA call from a host function or an emulated kernel */
    CUEMU_FLAG_UNSUPPORTED,      /* a valid request the emulator does not model */
    CUEMU_FLAG_NCCL_MISMATCH,    /* ranks issued different collectives at the same position */
    CUEMU_FLAG_NCCL_MISUSE,      /* NCCL rules: in-progress state, overlapping buffers, threads */
    CUEMU_FLAG_NCCL_HANG,        /* ranks waited CUEMU_NCCL_TIMEOUT_S for a peer */
    CUEMU_FLAG_NKINDS
};

/* Flags raised so far in this process: all of them, or one kind. */
unsigned long cuemu_flag_count(void);
unsigned long cuemu_flag_count_of(enum cuemu_flag kind);
/* The short name a flag's stderr line starts with ("pageable", "unrecorded-event", ...). */
const char *cuemu_flag_name(enum cuemu_flag kind);

/* Removes the emulated-NCCL segments in /dev/shm that belong to no live process (left by a rank
 * that died during ncclCommInitRank). Returns how many it removed. */
int cuemu_shm_clean(void);

#ifdef __cplusplus
}
#endif

#endif
