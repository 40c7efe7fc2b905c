# cuda/: optional backend. Only this fragment knows whether CUDA is in the build.
noinst_LTLIBRARIES += cuda/libdearcuda.la
cuda_libdearcuda_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS)
if HAVE_CUDA
cuda_libdearcuda_la_SOURCES = cuda/cuda.c cuda/cuda.h
cuda_libdearcuda_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) $(NCCL_CPPFLAGS)
cuda_libdearcuda_la_LIBADD = $(CUDA_LDFLAGS) $(CUDA_LIBS)
else
cuda_libdearcuda_la_SOURCES = cuda/nocuda.c cuda/cuda.h
endif
EXTRA_DIST += cuda/cuda.c cuda/nocuda.c
