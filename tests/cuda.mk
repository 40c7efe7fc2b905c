# tests/cuda: run on a GPU machine, skip (77) elsewhere; and the emulated CUDA runtime
# (tests/cuda/emu) that lets the GPU code's tests run without a GPU.
#   tests/cuda/test_cuda_device       the build sees the GPU (skips without one)
#   tests/cuda/test_cuemu             stream, event, memory and device semantics, and what the
#                                     emulator flags, against the emulator
#   tests/cuda/test_cuemu_real        the same source's API-only tests against libcudart (skips
#                                     without a GPU)
# libcuemu is a check-only convenience library, never part of libdear: a test links it instead
# of $(CUDA_LIBS), and is compiled with $(CUEMU_CPPFLAGS).
if HAVE_CHECK
check_PROGRAMS += tests/cuda/test_cuda_device
TESTS += tests/cuda/test_cuda_device
tests_cuda_test_cuda_device_SOURCES = tests/cuda/test_cuda_device.c
tests_cuda_test_cuda_device_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_cuda_device_LDADD = $(DEAR_INTERNAL_LIBS) $(CUDA_LDFLAGS) $(CUDA_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
endif

if HAVE_CUDA
CUEMU_CPPFLAGS = $(AM_CPPFLAGS) -DCUEMU_BUILD -I$(top_srcdir)/tests/cuda/emu $(CUDA_CPPFLAGS)
check_LTLIBRARIES += tests/cuda/emu/libcuemu.la
tests_cuda_emu_libcuemu_la_SOURCES = tests/cuda/emu/cuemu.h tests/cuda/emu/emu.h tests/cuda/emu/emu_core.c \
    tests/cuda/emu/emu_mem.c tests/cuda/emu/emu_stream.c tests/cuda/emu/emu_copy.c
tests_cuda_emu_libcuemu_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_cuda_emu_libcuemu_la_LIBADD = $(PTHREAD_LIBS) -lrt

if HAVE_CHECK
check_PROGRAMS += tests/cuda/test_cuemu tests/cuda/test_cuemu_real
TESTS += tests/cuda/test_cuemu tests/cuda/test_cuemu_real
tests_cuda_test_cuemu_SOURCES = tests/cuda/test_cuemu.c tests/cuda/cuda_check.h
tests_cuda_test_cuemu_CPPFLAGS = $(CUEMU_CPPFLAGS)
tests_cuda_test_cuemu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_cuemu_LDADD = tests/cuda/emu/libcuemu.la $(CHECK_LIBS) $(PTHREAD_LIBS) -lm
tests_cuda_test_cuemu_real_SOURCES = tests/cuda/test_cuemu.c tests/cuda/cuda_check.h
tests_cuda_test_cuemu_real_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_cuda_test_cuemu_real_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_cuemu_real_LDADD = $(CUDA_LDFLAGS) $(CUDA_LIBS) $(CHECK_LIBS) $(PTHREAD_LIBS) -lm
endif
endif
