#!/bin/sh
# cuda/gpu-check.sh in its emulator mode: the one GPU command's steps (the emulated tests, and
# dear-gpu-bench's coll, overlap and train runs) still work where there is no GPU, so the script
# a GPU machine runs cannot rot.
set -u
: "${top_builddir:=.}" "${top_srcdir:=.}"
exec bash "$top_srcdir/cuda/gpu-check.sh" --emulate --builddir "$top_builddir" --max-ranks 2 \
    --profile "$top_srcdir/tests/apps/dearbench-tiny.prof"
