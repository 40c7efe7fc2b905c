# cuda/: the optional CUDA backend (cuda/cuda.h). Only this fragment knows whether CUDA is in the
# build: without it nocuda.c stands in, so the core library never links libcudart.
noinst_LTLIBRARIES += cuda/libdearcuda.la
cuda_libdearcuda_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS)
# The backend's sources, also built against the tests' emulated runtime (tests/cuda.mk).
CUDA_BACKEND_SOURCES = cuda/cuda.c cuda/cuda.h cuda/cuda_impl.h cuda/cuda_check.h cuda/mem_cuda.c \
    cuda/kern.h cuda/kern_body.h
CUDA_BACKEND_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) $(NCCL_CPPFLAGS) $(HWLOC_CFLAGS)
if HAVE_NCCL
CUDA_BACKEND_SOURCES += cuda/nccl.c
endif
EXTRA_DIST += cuda/cuda.c cuda/nocuda.c cuda/mem_cuda.c cuda/nccl.c cuda/kernels.cu cuda/nvcc-lo.sh \
    cuda/cuda.h cuda/cuda_impl.h cuda/cuda_check.h cuda/kern.h cuda/kern_body.h
if HAVE_CUDA
cuda_libdearcuda_la_SOURCES = $(CUDA_BACKEND_SOURCES)
cuda_libdearcuda_la_CPPFLAGS = $(CUDA_BACKEND_CPPFLAGS)
cuda_libdearcuda_la_LIBADD = cuda/kernels.lo $(CUDA_LDFLAGS) $(CUDA_LIBS) $(NCCL_LDFLAGS) $(NCCL_LIBS) -lstdc++
cuda_libdearcuda_la_DEPENDENCIES = cuda/kernels.lo
# The kernels, for the GPUs of the last generations (sm_80, sm_90) and as PTX for later ones.
NVCC_FLAGS = -O3 -std=c++14 -Xcompiler -fvisibility=hidden -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -gencode arch=compute_90,code=compute_90 -I$(top_srcdir) -I$(top_srcdir)/include -I$(top_builddir)
cuda/kernels.lo: $(top_srcdir)/cuda/kernels.cu $(top_srcdir)/cuda/kern.h $(top_srcdir)/cuda/kern_body.h \
    $(top_srcdir)/collectives/elem.h
	$(AM_V_GEN)$(SHELL) $(top_srcdir)/cuda/nvcc-lo.sh '$(NVCC)' $@ $(NVCC_FLAGS) $(top_srcdir)/cuda/kernels.cu
CLEANFILES += cuda/kernels.lo cuda/kernels.o cuda/.libs/kernels.o
else
cuda_libdearcuda_la_SOURCES = cuda/nocuda.c cuda/cuda.h
endif
