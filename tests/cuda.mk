# tests/cuda: run on a GPU machine, skip (77) elsewhere; and the emulated CUDA runtime and NCCL
# (tests/cuda/emu, README.md there) that let the GPU code's tests run without a GPU.
#   tests/cuda/test_cuda_device       the build sees the GPU (skips without one)
#   tests/cuda/test_cuemu             stream, event, memory and device semantics, and what the
#                                     emulator flags, against the emulator
#   tests/cuda/test_cuemu_real        the same source's API-only tests against libcudart (skips
#                                     without a GPU)
#   tests/cuda/cuemu-nccl-np{1..4}.mpi  test_cuemu_nccl: the emulated NCCL's collectives against
#                                     host references, groups, call-order check, duplicate GPU,
#                                     injected remote error, abort, non-blocking communicators
#   tests/cuda/cuemu-nccl-real-np2.mpi  its API-only tests against libnccl (skips without a GPU)
# libcuemu is a check-only convenience library, never part of libdear: a test links it instead
# of $(CUDA_LIBS) and $(NCCL_LIBS), and is compiled with $(CUEMU_CPPFLAGS).
if HAVE_CHECK
check_PROGRAMS += tests/cuda/test_cuda_device
TESTS += tests/cuda/test_cuda_device
tests_cuda_test_cuda_device_SOURCES = tests/cuda/test_cuda_device.c
tests_cuda_test_cuda_device_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_cuda_device_LDADD = $(DEAR_INTERNAL_LIBS) $(CUDA_LDFLAGS) $(CUDA_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
endif

EXTRA_DIST += tests/cuda/emu/README.md
if HAVE_CUDA
CUEMU_CPPFLAGS = $(AM_CPPFLAGS) -DCUEMU_BUILD -I$(top_srcdir)/tests/cuda/emu $(CUDA_CPPFLAGS) $(NCCL_CPPFLAGS)
check_LTLIBRARIES += tests/cuda/emu/libcuemu.la
tests_cuda_emu_libcuemu_la_SOURCES = tests/cuda/emu/cuemu.h tests/cuda/emu/emu.h tests/cuda/emu/emu_core.c \
    tests/cuda/emu/emu_mem.c tests/cuda/emu/emu_stream.c tests/cuda/emu/emu_copy.c
tests_cuda_emu_libcuemu_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) $(NCCL_CPPFLAGS)
tests_cuda_emu_libcuemu_la_LIBADD = $(PTHREAD_LIBS) -lrt
if HAVE_NCCL
tests_cuda_emu_libcuemu_la_SOURCES += tests/cuda/emu/emu_nccl.h tests/cuda/emu/emu_nccl.c tests/cuda/emu/emu_coll.c
endif

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
if HAVE_NCCL
CUEMU_NCCL_MPI_TESTS = tests/cuda/cuemu-nccl-np1.mpi tests/cuda/cuemu-nccl-np2.mpi tests/cuda/cuemu-nccl-np3.mpi \
    tests/cuda/cuemu-nccl-np4.mpi tests/cuda/cuemu-nccl-real-np2.mpi
check_PROGRAMS += tests/cuda/test_cuemu_nccl tests/cuda/test_cuemu_nccl_real
TESTS += $(CUEMU_NCCL_MPI_TESTS)
tests_cuda_test_cuemu_nccl_SOURCES = tests/cuda/test_cuemu_nccl.c tests/cuda/cuda_check.h tests/mpi/suite_run.h
tests_cuda_test_cuemu_nccl_CPPFLAGS = $(CUEMU_CPPFLAGS)
tests_cuda_test_cuemu_nccl_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_cuemu_nccl_LDADD = tests/cuda/emu/libcuemu.la $(CHECK_LIBS) $(PTHREAD_LIBS) -lm
tests_cuda_test_cuemu_nccl_real_SOURCES = tests/cuda/test_cuemu_nccl.c tests/cuda/cuda_check.h tests/mpi/suite_run.h
tests_cuda_test_cuemu_nccl_real_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) $(NCCL_CPPFLAGS)
tests_cuda_test_cuemu_nccl_real_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_cuemu_nccl_real_LDADD = $(CUDA_LDFLAGS) $(CUDA_LIBS) $(NCCL_LDFLAGS) $(NCCL_LIBS) $(CHECK_LIBS) \
    $(PTHREAD_LIBS) -lm
endif
endif
endif
EXTRA_DIST += tests/cuda/cuemu-nccl-np1.mpi tests/cuda/cuemu-nccl-np2.mpi tests/cuda/cuemu-nccl-np3.mpi \
    tests/cuda/cuemu-nccl-np4.mpi tests/cuda/cuemu-nccl-real-np2.mpi
