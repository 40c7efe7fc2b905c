# tests/cuda: run on a GPU machine, skip (77) elsewhere.
if HAVE_CHECK
check_PROGRAMS += tests/cuda/test_cuda_device
TESTS += tests/cuda/test_cuda_device
tests_cuda_test_cuda_device_SOURCES = tests/cuda/test_cuda_device.c
tests_cuda_test_cuda_device_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_cuda_device_LDADD = $(DEAR_INTERNAL_LIBS) $(CUDA_LDFLAGS) $(CUDA_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
endif
