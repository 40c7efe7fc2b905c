# The launcher the tests start ranks with, and its flags, chosen for the MPI that CC links.
# Another MPI's launcher does not fail: it starts N separate one-rank jobs, and the tests pass on
# one rank each. So CC's MPI (mpi.h's macros) and the launcher's (`MPIRUN --version`) are named
# by flavour, a mismatch stops configure, and the flags follow the launcher's flavour. Every
# result can be set on the configure command line; tests/mpi-launch.sh is their only user.

# DEAR_MPI_LAUNCHER_FLAVOUR(PROGRAM, VARIABLE): VARIABLE=openmpi, mpich or unknown, from what
# PROGRAM --version says (Open MPI's mpirun names itself; MPICH's is the HYDRA process manager).
AC_DEFUN([DEAR_MPI_LAUNCHER_FLAVOUR], [
  AS_CASE([`$1 --version 2>&1 </dev/null`],
    [*"Open MPI"*|*OpenRTE*], [$2=openmpi],
    [*HYDRA*], [$2=mpich],
    [$2=unknown])
])

# DEAR_CHECK_MPI_LAUNCHER: after AC_PROG_CC with an MPI compiler wrapper as CC. Sets and
# substitutes MPI_FLAVOUR, MPIRUN, MPIRUN_NP, MPIRUN_FLAGS, MPIRUN_ENV.
AC_DEFUN([DEAR_CHECK_MPI_LAUNCHER], [
  AC_ARG_VAR([MPIRUN], [launcher for the tests' MPI jobs (default: the mpirun or mpiexec of the MPI that CC links)])
  AC_ARG_VAR([MPIRUN_NP], [MPIRUN's rank-count flag (default: -np for Open MPI, -n otherwise)])
  AC_ARG_VAR([MPIRUN_FLAGS], [MPIRUN flags for the tests: more ranks than cores, ranks unbound])
  AC_ARG_VAR([MPIRUN_ENV], [MPIRUN flag giving every rank a variable: -x (NAME=VALUE), -genv or -env (NAME VALUE)])

  AC_MSG_CHECKING([which MPI $CC builds for])
  AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>
#ifndef OMPI_MAJOR_VERSION
#error not Open MPI
#endif]])], [MPI_FLAVOUR=openmpi],
    [AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>
#ifndef MPICH_VERSION
#error not MPICH
#endif]])], [MPI_FLAVOUR=mpich], [MPI_FLAVOUR=unknown])])
  AC_MSG_RESULT([$MPI_FLAVOUR])

  # Candidates by flavour, Debian's suffixed names first (they never follow the mpirun
  # alternative), searched first where CC lives: an MPI in its own prefix has its launcher there.
  AS_CASE([$MPI_FLAVOUR],
    [openmpi], [dear_launchers="mpirun.openmpi mpiexec.openmpi orterun mpirun mpiexec"],
    [mpich], [dear_launchers="mpiexec.mpich mpirun.mpich mpiexec.hydra mpiexec mpirun"],
    [dear_launchers="mpiexec mpirun"])
  dear_cc_path=`command -v "${CC%% *}" 2>/dev/null`
  AS_CASE([$dear_cc_path], [*/*], [dear_cc_dir=${dear_cc_path%/*}], [dear_cc_dir=])
  AC_CACHE_CHECK([for the launcher of $MPI_FLAVOUR], [ac_cv_path_MPIRUN],
    [AC_PATH_PROGS_FEATURE_CHECK([MPIRUN], [$dear_launchers],
      [DEAR_MPI_LAUNCHER_FLAVOUR([$ac_path_MPIRUN], [dear_found_flavour])
       AS_IF([test "x$MPI_FLAVOUR" = xunknown || test "$dear_found_flavour" = "$MPI_FLAVOUR"],
             [ac_cv_path_MPIRUN=$ac_path_MPIRUN ac_path_MPIRUN_found=:])],
      [AC_MSG_ERROR([no mpirun or mpiexec of $MPI_FLAVOUR found (Debian: apt-get install openmpi-bin, or mpich); set MPIRUN])],
      [$dear_cc_dir$PATH_SEPARATOR$PATH])])
  MPIRUN=$ac_cv_path_MPIRUN

  DEAR_MPI_LAUNCHER_FLAVOUR([$MPIRUN], [dear_mpirun_flavour])
  AS_IF([test "x$MPI_FLAVOUR" != xunknown && test "x$dear_mpirun_flavour" != xunknown &&
         test "$MPI_FLAVOUR" != "$dear_mpirun_flavour"],
        [AC_MSG_ERROR([MPIRUN=$MPIRUN launches $dear_mpirun_flavour but $CC builds $MPI_FLAVOUR programs: every test would run as one-rank jobs. Leave MPIRUN unset or name $MPI_FLAVOUR's launcher])])
  AS_IF([test "x$MPI_FLAVOUR" = xunknown], [MPI_FLAVOUR=$dear_mpirun_flavour])

  # Open MPI refuses more ranks than cores and binds ranks to cores unless told; btl self,vader
  # keeps a node's ranks on shared memory and yield_when_idle lets oversubscribed ranks share.
  # MPICH's hydra oversubscribes as it is and binds nothing by default; -bind-to none says so.
  AS_CASE([$MPI_FLAVOUR],
    [openmpi], [dear_np=-np
                dear_flags="--oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1"
                dear_env=-x],
    [mpich], [dear_np=-n; dear_flags="-bind-to none"; dear_env=-genv],
    [dear_np=-n; dear_flags=; dear_env=
     AC_MSG_WARN([$MPIRUN is neither Open MPI's nor MPICH's launcher: the tests will run $MPIRUN -n N PROGRAM; set MPIRUN_NP, MPIRUN_FLAGS and MPIRUN_ENV if it needs others])])
  AS_IF([test "${MPIRUN_NP+set}" != set], [MPIRUN_NP=$dear_np])
  AS_IF([test "${MPIRUN_FLAGS+set}" != set], [MPIRUN_FLAGS=$dear_flags])
  AS_IF([test "${MPIRUN_ENV+set}" != set], [MPIRUN_ENV=$dear_env])
  AC_SUBST([MPI_FLAVOUR])
])
