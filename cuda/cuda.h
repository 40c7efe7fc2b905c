/* Optional CUDA backend: what the build has and what the machine offers. Without
 * --with-cuda the functions exist and report DEAR_ERR_UNSUPPORTED, so callers never need
 * #ifdefs and the core library never links libcudart. */
#ifndef DEAR_CUDA_H
#define DEAR_CUDA_H

/* 1 if built with CUDA, 0 if not. */
int dear_cuda_built(void);
/* 1 if built with NCCL. */
int dear_nccl_built(void);
/* Number of visible CUDA devices in *n. DEAR_ERR_UNSUPPORTED without CUDA in the build,
 * DEAR_ERR_CUDA when the driver cannot be queried (no GPU, no driver): *n is 0 then. */
int dear_cuda_device_count(int *n);

#endif
