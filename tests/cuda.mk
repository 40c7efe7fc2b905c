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
CK_TESTS += tests/cuda/test_cuda_device
tests_cuda_test_cuda_device_LDADD = $(DEAR_INTERNAL_LIBS) $(CUDA_LDFLAGS) $(CUDA_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
CK_NCCL_RUNS += tests/cuda/cuemu-nccl-np1.mpi tests/cuda/cuemu-nccl-np2.mpi tests/cuda/cuemu-nccl-np3.mpi \
    tests/cuda/cuemu-nccl-np4.mpi tests/cuda/cuemu-nccl-real-np2.mpi

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
check_PROGRAMS += tests/cuda/test_cuemu_nccl tests/cuda/test_cuemu_nccl_real
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
# libdear with CUDA gradients (tests/cuda/test_gpu.c), against the emulator and the real libraries:
#   tests/cuda/gpu-nccl-np{1,2,4}.mpi   DEAR_CUDA_TRANSPORT=nccl, a GPU per rank: every schedule
#                                     and planner, float32 and bfloat16, clipping, accumulation,
#                                     unused tensors, partitions, a slow gradient kernel, against
#                                     an MPI_Allreduce reference; hooks that never wait for the GPU;
#                                     bad input
#   tests/cuda/gpu-staged-np{2,3}.mpi   the same staged, every rank on one GPU
#   tests/cuda/gpu-refused-np2.mpi      nccl on ranks sharing a GPU fails commit, naming them;
#                                     auto runs staged
#   tests/cuda/gpu-broken-np2.mpi       nccl where NCCL cannot set up fails commit; auto runs staged
#   tests/cuda/gpu-calib-oom-np2.mpi    one rank cannot allocate calibration's buffers: commit fails
#                                     on both, neither waits for the other
#   tests/cuda/gpu-mutation.sh          DEAR_DEBUG_DROP_WAIT=ready and =done, each leaving one wait
#                                     of the backend out, make the results wrong
#   tests/cuda/gpu-real-np{1,2}.mpi     test_gpu_real against libcudart and libnccl (skip without a GPU)
#   tests/cuda/gpu-check-emu.sh         cuda/gpu-check.sh --emulate: the GPU check's six steps under
#                                     its budget, against the emulator (the binding and the models
#                                     on the CPU), then --publish into a scratch page
# test_gpu links libdear's layers with the backend built from the same sources against the
# emulator (tests/cuda/libdearcuda_emu.la: -DCUEMU_BUILD, kernels_emu.c for kernels.cu).
# The runs of test_combo_cuda and dear-gpu-bench-emu, below, are listed here too.
CK_NCCL_RUNS += tests/cuda/gpu-nccl-np1.mpi tests/cuda/gpu-nccl-np2.mpi tests/cuda/gpu-nccl-np4.mpi \
    tests/cuda/gpu-staged-np2.mpi tests/cuda/gpu-staged-np3.mpi tests/cuda/gpu-refused-np2.mpi \
    tests/cuda/gpu-broken-np2.mpi tests/cuda/gpu-calib-oom-np2.mpi tests/cuda/gpu-real-np1.mpi \
    tests/cuda/gpu-real-np2.mpi \
    tests/cuda/gpu-mutation.sh tests/cuda/combo-np2-cuda.mpi tests/cuda/combo-np3-cuda.mpi \
    tests/cuda/gpu-check-emu.sh
EXTRA_DIST += tests/cuda/gpu_kern.cu tests/cuda/gpu_kern_emu.c tests/cuda/kernels_emu.c cuda/gpu-check.sh \
    bench/dear-gpu-bench.c
if HAVE_CUDA
if HAVE_NCCL
if HAVE_CHECK
check_LTLIBRARIES += tests/cuda/libdearcuda_emu.la
tests_cuda_libdearcuda_emu_la_SOURCES = $(CUDA_BACKEND_SOURCES) tests/cuda/kernels_emu.c
tests_cuda_libdearcuda_emu_la_CPPFLAGS = $(CUDA_BACKEND_CPPFLAGS) -DCUEMU_BUILD -I$(top_srcdir)/tests/cuda/emu
tests_cuda_libdearcuda_emu_la_CFLAGS = $(AM_CFLAGS)
DEAR_EMU_LIBS = runtime/libdearrt.la tests/cuda/libdearcuda_emu.la collectives/libdearcoll.la \
    fusion/libdearfusion.la $(DEAR_BASE_LIBS) tests/cuda/emu/libcuemu.la
check_PROGRAMS += tests/cuda/test_gpu tests/cuda/test_gpu_real
tests_cuda_test_gpu_SOURCES = tests/cuda/test_gpu.c tests/cuda/gpu_kern.h tests/cuda/gpu_kern_emu.c \
    tests/cuda/cuda_check.h tests/mpi/suite_run.h
tests_cuda_test_gpu_CPPFLAGS = $(CUEMU_CPPFLAGS)
tests_cuda_test_gpu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_gpu_LDADD = $(DEAR_EMU_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS) -lrt
tests_cuda_test_gpu_real_SOURCES = tests/cuda/test_gpu.c tests/cuda/gpu_kern.h tests/cuda/cuda_check.h \
    tests/mpi/suite_run.h
tests_cuda_test_gpu_real_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_cuda_test_gpu_real_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_gpu_real_LDADD = tests/cuda/gpu_kern.lo $(DEAR_INTERNAL_LIBS) $(CUDA_LDFLAGS) $(CUDA_LIBS) \
    $(NCCL_LDFLAGS) $(NCCL_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS) -lstdc++
tests_cuda_test_gpu_real_DEPENDENCIES = tests/cuda/gpu_kern.lo $(DEAR_INTERNAL_LIBS)
tests/cuda/gpu_kern.lo: $(top_srcdir)/tests/cuda/gpu_kern.cu $(top_srcdir)/tests/cuda/gpu_kern.h \
    $(top_srcdir)/collectives/elem.h
	$(AM_V_GEN)$(SHELL) $(top_srcdir)/cuda/nvcc-lo.sh '$(NVCC)' $@ $(NVCC_FLAGS) $(top_srcdir)/tests/cuda/gpu_kern.cu
CLEANFILES += tests/cuda/gpu_kern.lo tests/cuda/gpu_kern.o tests/cuda/.libs/gpu_kern.o
# Features together on CUDA memory (tests/mpi/test_combo.c, -DDEAR_TEST_MEM_CUDA): the cases of
# the combination test's covering design whose memory is cuda, each through NCCL or staged.
check_PROGRAMS += tests/cuda/test_combo_cuda
tests_cuda_test_combo_cuda_SOURCES = tests/mpi/test_combo.c tests/cuda/gpu_kern.h tests/cuda/gpu_kern_emu.c \
    tests/cuda/cuda_check.h tests/mpi/suite_run.h
tests_cuda_test_combo_cuda_CPPFLAGS = $(CUEMU_CPPFLAGS)
tests_cuda_test_combo_cuda_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -DDEAR_TEST_MEM_CUDA
tests_cuda_test_combo_cuda_LDADD = $(DEAR_EMU_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS) -lrt
# The GPU measurements (cuda/gpu-check.sh): on the real libraries, and on the emulated ones for CI.
noinst_PROGRAMS += bench/dear-gpu-bench
bench_dear_gpu_bench_SOURCES = bench/dear-gpu-bench.c tests/cuda/gpu_kern.h
bench_dear_gpu_bench_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) $(NCCL_CPPFLAGS)
bench_dear_gpu_bench_LDADD = tests/cuda/gpu_kern.lo $(DEAR_INTERNAL_LIBS) $(CUDA_LDFLAGS) $(CUDA_LIBS) \
    $(NCCL_LDFLAGS) $(NCCL_LIBS) $(DEAR_DEP_LIBS) -lstdc++
bench_dear_gpu_bench_DEPENDENCIES = tests/cuda/gpu_kern.lo $(DEAR_INTERNAL_LIBS)
check_PROGRAMS += tests/cuda/dear-gpu-bench-emu
tests_cuda_dear_gpu_bench_emu_SOURCES = bench/dear-gpu-bench.c tests/cuda/gpu_kern.h tests/cuda/gpu_kern_emu.c
tests_cuda_dear_gpu_bench_emu_CPPFLAGS = $(CUEMU_CPPFLAGS)
tests_cuda_dear_gpu_bench_emu_LDADD = $(DEAR_EMU_LIBS) $(DEAR_DEP_LIBS) -lrt -lm
endif
endif
endif
