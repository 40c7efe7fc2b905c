#!/bin/sh
# The emulated GPU catches a missing wait of the backend: test_gpu (2 ranks, nccl, the first
# cases) must fail, with parameters or forward reads that differ from the reference, for each
# wait DEAR_DEBUG_DROP_WAIT leaves out (the communication's wait for the gradients' event, the
# compute stream's wait for the all-gathers'), and pass with every wait in place.
set -u
: "${top_builddir:=.}" "${top_srcdir:=.}"
. "$top_srcdir/tests/mpi-launch.sh"
. "$top_srcdir/tests/drop-wait-lib.sh"
exe=$top_builddir/tests/cuda/test_gpu
[ -x "$exe" ] || { echo "gpu-mutation.sh: $exe not built" >&2; exit 99; }
drop_wait_check gpu-mutation.sh 2 300 "none ready done" 'differ from the MPI_Allreduce reference' \
    CUEMU_DEVICES=2 CUEMU_SEED=11 DEAR_CUDA_TRANSPORT=nccl "$exe" --quick
