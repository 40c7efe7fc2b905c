#!/bin/bash
# cuda/gpu-check.sh: the GPU check in one command.
#
# On a machine with an NVIDIA GPU and no network (the device tool's), from an unpacked dist
# tarball of this tree or a clone:
#   1. unpacks the Debian packages the build needs, carried as .debs (--debs DIR: Open MPI, hwloc,
#      Check, ...), into a prefix of its own (Open MPI relocated with OPAL_PREFIX);
#   2. builds against the machine's CUDA and NCCL (--with-cuda, --with-nccl);
#   3. runs tests/cuda on the GPU: test_gpu_real (libdear with device tensors under nccl and
#      staged), and the emulator's own self-tests against the real runtime (test_cuemu_real,
#      test_cuemu_nccl_real), so the emulator is shown to behave like CUDA; and, where a python3
#      has a torch that sees the GPU, tests/python/torch.sh (its loops then run on CUDA too);
#   4. measures with bench/dear-gpu-bench: busbw of dear's nccl and staged all-reduce against
#      NCCL's own and cudaMemcpy + MPI_Allreduce; overlap% of a 16 MiB reduce-scatter under a GPU
#      kernel; a profile's model trained under dear, wfbp and sync on 1..N ranks (iteration,
#      blocked time, the hooks' host time);
#   5. writes the figures, the GPU named, into docs/PERFORMANCE.md ("GPU").
# --prepare (on a machine with Debian's archive): downloads the .debs into DIR and makes the
#   dist tarball to carry with them.
# --emulate (CI, no GPU): steps 3 and 4 against the emulated CUDA runtime and NCCL of an
#   existing build (--builddir), with small sizes, so that this script cannot rot; nothing is
#   written to docs/.
set -euo pipefail

SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=gpu-check.sh
MODE=gpu
DEBS=
BUILDDIR=
MAXRANKS=4
PROFILE=$SRCDIR/fusion/profiles/resnet50.prof

usage() {
    cat <<EOF
usage: cuda/gpu-check.sh [--debs DIR] [--builddir DIR] [--max-ranks N] [--profile FILE]
       cuda/gpu-check.sh --prepare DIR
       cuda/gpu-check.sh --emulate --builddir DIR
EOF
}

while [ $# -gt 0 ]; do
    case $1 in
    --debs) DEBS=$2; shift ;;
    --builddir) BUILDDIR=$2; shift ;;
    --max-ranks) MAXRANKS=$2; shift ;;
    --profile) PROFILE=$2; shift ;;
    --prepare) MODE=prepare; DEBS=$2; shift ;;
    --emulate) MODE=emulate ;;
    -h | --help) usage; exit 0 ;;
    *) echo "$PROG: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

say() { echo "$PROG: $*"; }

# The packages a build and its tests need beyond what a GPU machine has (CUDA, NCCL, compilers).
PKGS="libopenmpi-dev openmpi-bin openmpi-common libopenmpi3 libpmix2 libpmix-dev libhwloc-dev libhwloc15
      libhwloc-plugins hwloc check libsubunit-dev libsubunit0 libevent-dev libevent-2.1-7 libevent-core-2.1-7
      libevent-pthreads-2.1-7 libfabric1 libucx0 libpsm-infinipath1 libpsm2-2 libibverbs1 librdmacm1
      libnl-3-200 libnl-route-3-200 libltdl7 libopenblas-dev libopenblas0-pthread libopenblas-pthread-dev
      zlib1g-dev libnuma1 libxnvctrl0 libudev1"

if [ $MODE = prepare ]; then
    mkdir -p "$DEBS"
    (cd "$DEBS" && apt-get download $PKGS)
    (cd "$SRCDIR" && make dist >/dev/null && cp dear-*.tar.gz "$DEBS/")
    say "carried in $DEBS: $(ls "$DEBS" | wc -l) files (the .debs and the dist tarball)"
    exit 0
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# The launcher: make check's (tests/mpi-launch.sh) when it runs this, else the MPI in PATH.
: "${MPIRUN:=mpirun}" "${MPIRUN_NP:=-np}" "${MPIRUN_FLAGS:=--bind-to none}"
export MPIRUN MPIRUN_NP MPIRUN_FLAGS
# shellcheck disable=SC1091
. "$SRCDIR/tests/mpi-launch.sh"

if [ $MODE = gpu ]; then
    if [ -n "$DEBS" ]; then
        PREFIX=$(mktemp -d /tmp/gpu-check.XXXXXX)
        for d in "$DEBS"/*.deb; do dpkg -x "$d" "$PREFIX"; done
        export OPAL_PREFIX=$PREFIX/usr
        export PATH=$PREFIX/usr/bin:$PATH
        export LD_LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}
        export PKG_CONFIG_PATH=$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig:$PREFIX/usr/share/pkgconfig
        export CPATH=$PREFIX/usr/include:$PREFIX/usr/lib/x86_64-linux-gnu/openmpi/include
        export LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/usr/lib/x86_64-linux-gnu/openmpi/lib
        say "packages unpacked into $PREFIX (OPAL_PREFIX=$OPAL_PREFIX)"
    fi
    if [ -z "$BUILDDIR" ]; then
        BUILDDIR=$SRCDIR
        cd "$SRCDIR"
        [ -x configure ] || ./autogen.sh
        # NCCL_HOME: an NCCL outside CUDA's directory (e.g. the nvidia-nccl wheel's, made linkable).
        ./configure --with-cuda --with-nccl${NCCL_HOME:+=$NCCL_HOME} >/dev/null
        make -j"$(nproc)" >/dev/null
        make -j"$(nproc)" check TESTS= >/dev/null
    fi
fi
[ -n "$BUILDDIR" ] || { echo "$PROG: --emulate needs --builddir (a configured, built tree)" >&2; exit 2; }
cd "$BUILDDIR"

if [ $MODE = emulate ]; then
    BENCH="$BUILDDIR/tests/cuda/dear-gpu-bench-emu"
    BENV="CUEMU_DEVICES=$MAXRANKS CUEMU_DELAY_US=0"
    SIZES="--min 64k --max 256k --iters 3"
    OVERLAP="--bytes 256k --iters 3"
    TRAIN="--time-scale 0.02 --train-iters 8"
    # The tests themselves run in make check; here only that the script's steps still work.
    "$BUILDDIR/tests/cuda/test_cuemu" >/dev/null
    mpi_run 300 2 CK_FORK=no CUEMU_DEVICES=2 DEAR_CUDA_TRANSPORT=nccl "$BUILDDIR/tests/cuda/test_gpu" --quick >/dev/null
    say "the emulated tests pass"
else
    BENCH="$BUILDDIR/bench/dear-gpu-bench"
    BENV=
    SIZES="--min 1m --max 256m --iters 10"
    OVERLAP="--bytes 16m --iters 10"
    TRAIN="--train-iters 20"
    TESTS_TO_RUN="tests/cuda/test_cuda_device tests/cuda/test_cuemu_real tests/cuda/cuemu-nccl-real-np2.mpi \
tests/cuda/gpu-real-np1.mpi tests/cuda/gpu-real-np2.mpi"
    # The PyTorch binding's loops on CUDA parameters, where a torch that sees the GPU is installed.
    for py in python3 /usr/bin/python3; do
        if "$py" -c "import torch, mpi4py, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
            TESTS_TO_RUN="$TESTS_TO_RUN tests/python/torch.sh"
            break
        fi
    done
    say "tests on the GPU: $TESTS_TO_RUN"
    make check TESTS="$TESTS_TO_RUN" >/dev/null || { tail -50 tests/cuda/*.log; exit 1; }
    grep -h "^:test-result" tests/cuda/*.trs | sort | uniq -c
fi

OUT=$(mktemp -d /tmp/gpu-check-out.XXXXXX)
run() { # ranks, then dear-gpu-bench's arguments
    local np=$1
    shift
    # shellcheck disable=SC2086
    mpi_run 600 "$np" $BENV "$BENCH" "$@"
}
NP=$MAXRANKS
[ "$NP" -ge 2 ] || NP=2
# shellcheck disable=SC2086
run "$NP" coll $SIZES --csv "$OUT/coll.csv" | tee "$OUT/coll.txt"
# shellcheck disable=SC2086
run "$NP" overlap $OVERLAP --csv "$OUT/overlap.csv" | tee "$OUT/overlap.txt"
: >"$OUT/train.txt"
for np in $(seq 1 "$MAXRANKS"); do
    # shellcheck disable=SC2086
    run "$np" train --profile "$PROFILE" $TRAIN --csv "$OUT/train-$np.csv" |
        tee -a "$OUT/train.txt"
done

if [ $MODE = emulate ]; then
    for f in coll overlap train; do
        [ -s "$OUT/$f.txt" ] || { echo "$PROG: dear-gpu-bench $f printed nothing" >&2; exit 1; }
    done
    say "emulated run complete (figures are the emulator's, not written to docs)"
    rm -rf "$OUT"
    exit 0
fi

GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo "unknown GPU")
python3 - "$SRCDIR/docs/PERFORMANCE.md" "$OUT" "$GPU" "$MAXRANKS" <<'EOF'
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "..", "bench"))
from docsection import replace_section
page, out, gpu, ranks = sys.argv[1:5]
read = lambda f: open(os.path.join(out, f)).read().rstrip()
section = ("<!-- BEGIN gpu-check -->\n## GPU\n\nMeasured by `cuda/gpu-check.sh` on %s, up to %s ranks on one "
           "machine.\n\n```\n%s\n```\n\n```\n%s\n```\n\n```\n%s\n```\n<!-- END gpu-check -->\n"
           % (gpu, ranks, read("coll.txt"), read("overlap.txt"), read("train.txt")))
replace_section(page, section, "<!-- BEGIN gpu-check -->", "<!-- END gpu-check -->")
EOF
say "figures written to docs/PERFORMANCE.md (GPU: $GPU); raw output in $OUT"
