# AX_PTHREAD_SIMPLE: POSIX threads via -pthread (gcc and clang on Linux).
AC_DEFUN([AX_PTHREAD_SIMPLE], [
  save_CFLAGS=$CFLAGS
  CFLAGS="$CFLAGS -pthread"
  AC_MSG_CHECKING([whether $CC accepts -pthread])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <pthread.h>]], [[pthread_t t; (void)pthread_self(); (void)t;]])],
                 [AC_MSG_RESULT([yes]); PTHREAD_CFLAGS=-pthread; PTHREAD_LIBS=-pthread],
                 [AC_MSG_RESULT([no]); AC_MSG_ERROR([POSIX threads are required])])
  CFLAGS=$save_CFLAGS
  AC_SUBST([PTHREAD_CFLAGS])
  AC_SUBST([PTHREAD_LIBS])
])
