# Optional CUDA and NCCL, in the manner of UCX's config/m4/cuda.m4: the default is to guess,
# a failed guess just turns the backend off, and only an explicit --with-cuda / --with-nccl
# that cannot be satisfied stops configure. The core library never links libcudart; the
# CUDA objects are built only under "if HAVE_CUDA".

# DEAR_CHECK_CUDA: sets CUDA_CPPFLAGS, CUDA_LDFLAGS, CUDA_LIBS, NVCC, HAVE_CUDA.
AC_DEFUN([DEAR_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the CUDA backend (default: guess, /usr/local/cuda)])],
    [], [with_cuda=guess])
  have_cuda=no
  CUDA_SUMMARY=no
  AS_CASE(["x$with_cuda"],
    [xno], [CUDA_SUMMARY="no (disabled)"],
    [xyes|xguess], [cuda_dir=/usr/local/cuda],
    [cuda_dir=$with_cuda])
  AS_IF([test "x$with_cuda" != "xno"], [
    save_CPPFLAGS=$CPPFLAGS; save_LDFLAGS=$LDFLAGS; save_LIBS=$LIBS
    CUDA_CPPFLAGS="-isystem $cuda_dir/include"
    CUDA_LDFLAGS="-L$cuda_dir/lib64 -Wl,-rpath,$cuda_dir/lib64"
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"; LDFLAGS="$LDFLAGS $CUDA_LDFLAGS"
    AC_CHECK_HEADER([cuda_runtime.h],
      [AC_CHECK_LIB([cudart], [cudaGetDeviceCount], [have_cuda=yes; CUDA_LIBS=-lcudart])])
    CPPFLAGS=$save_CPPFLAGS; LDFLAGS=$save_LDFLAGS; LIBS=$save_LIBS
    AC_PATH_PROG([NVCC], [nvcc], [no], [$cuda_dir/bin:$PATH])
    dnl The backend's kernels need nvcc: without it there is no backend to build.
    AS_IF([test "x$have_cuda" = "xyes" && test "x$NVCC" = "xno"],
          [have_cuda=no
           AS_IF([test "x$with_cuda" != "xguess"], [AC_MSG_ERROR([--with-cuda was given but nvcc was not found under $cuda_dir/bin or in PATH])])
           CUDA_SUMMARY="no (nvcc not found)"; CUDA_CPPFLAGS=; CUDA_LDFLAGS=])
    AS_IF([test "x$have_cuda" = "xyes"], [CUDA_SUMMARY="yes ($cuda_dir, $NVCC)"],
          [test "x$NVCC" = "xno" && test -n "$CUDA_SUMMARY" && test "x$CUDA_SUMMARY" != "xno"], [],
          [test "x$with_cuda" != "xguess"],
            [AC_MSG_ERROR([--with-cuda was given but cuda_runtime.h / libcudart were not usable under $cuda_dir])],
          [CUDA_SUMMARY="no (not found under $cuda_dir)"; CUDA_CPPFLAGS=; CUDA_LDFLAGS=])
  ])
  AS_IF([test "x$have_cuda" = "xyes"], [AC_DEFINE([HAVE_CUDA], [1], [CUDA backend built])])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$have_cuda" = "xyes"])
  AM_CONDITIONAL([HAVE_NVCC], [test "x$have_cuda" = "xyes"])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LDFLAGS])
  AC_SUBST([CUDA_LIBS])
])

# DEAR_CHECK_NCCL: needs CUDA; sets NCCL_CPPFLAGS, NCCL_LDFLAGS, NCCL_LIBS, HAVE_NCCL.
AC_DEFUN([DEAR_CHECK_NCCL], [
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@], [build the NCCL backend (default: guess, CUDA's directory)])],
    [], [with_nccl=guess])
  have_nccl=no
  NCCL_SUMMARY=no
  AS_CASE(["x$with_nccl"],
    [xno], [NCCL_SUMMARY="no (disabled)"],
    [xyes|xguess], [nccl_dir=${cuda_dir:-/usr/local/cuda}],
    [nccl_dir=$with_nccl])
  AS_IF([test "x$with_nccl" != "xno" && test "x$have_cuda" != "xyes"],
        [AS_IF([test "x$with_nccl" != "xguess"], [AC_MSG_ERROR([--with-nccl needs a usable CUDA (see --with-cuda)])])
         NCCL_SUMMARY="no (needs CUDA)"],
        [test "x$with_nccl" != "xno"], [
    save_CPPFLAGS=$CPPFLAGS; save_LDFLAGS=$LDFLAGS; save_LIBS=$LIBS
    NCCL_CPPFLAGS="-isystem $nccl_dir/include"
    NCCL_LDFLAGS="-L$nccl_dir/lib64 -L$nccl_dir/lib -Wl,-rpath,$nccl_dir/lib64"
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS $NCCL_CPPFLAGS"; LDFLAGS="$LDFLAGS $CUDA_LDFLAGS $NCCL_LDFLAGS"
    AC_CHECK_HEADER([nccl.h],
      [AC_CHECK_LIB([nccl], [ncclCommInitRank], [have_nccl=yes; NCCL_LIBS=-lnccl], [], [$CUDA_LIBS])])
    CPPFLAGS=$save_CPPFLAGS; LDFLAGS=$save_LDFLAGS; LIBS=$save_LIBS
    AS_IF([test "x$have_nccl" = "xyes"], [NCCL_SUMMARY="yes ($nccl_dir)"],
          [test "x$with_nccl" != "xguess"],
            [AC_MSG_ERROR([--with-nccl was given but nccl.h / libnccl were not usable under $nccl_dir])],
          [NCCL_SUMMARY="no (not found under $nccl_dir)"; NCCL_CPPFLAGS=; NCCL_LDFLAGS=])
  ])
  AS_IF([test "x$have_nccl" = "xyes"], [AC_DEFINE([HAVE_NCCL], [1], [NCCL backend built])])
  AM_CONDITIONAL([HAVE_NCCL], [test "x$have_nccl" = "xyes"])
  AC_SUBST([NCCL_CPPFLAGS])
  AC_SUBST([NCCL_LDFLAGS])
  AC_SUBST([NCCL_LIBS])
])
