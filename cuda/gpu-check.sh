#!/bin/bash
# cuda/gpu-check.sh: the GPU check, built on a CPU machine, run on a GPU machine in priority order
# within a time budget, each step's result written as soon as the step ends.
#
#   cuda/gpu-check.sh --prepare DIR
#       Here (CUDA and NCCL under /usr/local/cuda, Debian's archive reachable), from a tree
#       configured with CUDA and NCCL: builds what the check runs and copies it into DIR (bin/: the
#       GPU test programs and dear-gpu-bench; lib/: libdear.so.1; debs/: Open MPI, hwloc, Check's
#       runtime and their libraries as Debian packages; BUILD: what was built, from which commit).
#       Put DIR inside the checkout, ignored (.gpu/ is), and carry it: the GPU machine builds nothing.
#   cuda/gpu-check.sh --carried DIR [--budget S] [--out D] [--steps '1 2 ...']
#       On the GPU machine (no network): unpacks the .debs into a prefix of its own (Open MPI
#       relocated with OPAL_PREFIX and PMIX_INSTALL_PREFIX; a carried library only where the
#       machine lacks it), finds NCCL and the CUDA runtime (the system's, else torch's wheels), and
#       runs the steps below.
#   cuda/gpu-check.sh --emulate --builddir DIR [--budget S] [--out D]
#       CI, no GPU: the same steps against the emulated CUDA runtime and NCCL of a built tree, the
#       binding and the models on the CPU, small sizes; then --publish into a scratch copy of
#       docs/PERFORMANCE.md. So the script cannot rot between GPU runs.
#   cuda/gpu-check.sh --publish D [--also D2]...
#       Here, from the folder a GPU run returned: rewrites docs/PERFORMANCE.md's generated section
#       "GPU check" (the GPU, driver, CUDA, NCCL, torch and Open MPI named, and the command).
#       --also adds a later call's folder on the same machine (say, --steps '2' --binding-cases all):
#       its steps follow the first call's, and its CSV rows follow, marked by a "call" column.
#
# The steps, most important first; a step starts only where the budget has the time it needs:
#   1 tests      test_gpu_real at np 1 and 2 (all but its compressed case), test_cuda_device, and the
#                emulator's self-tests against the real runtime and NCCL;
#   2 binding    tests/python/test_loops.py on CUDA parameters at np 1 against DDP over NCCL (a
#                cut-down case list: --binding-cases, 'all' for every case);
#   3 compressed test_gpu_real's compressed case (bf16, fp16, fp16 with error feedback on the
#                device, against float32) at np 1 (NCCL) and np 2 (NCCL where there are 2 GPUs,
#                else staged);
#   4 model-np1  bench/torch-ddp.py: torchvision's resnet18 on the GPU at np 1, plain PyTorch, DDP
#                (NCCL) and dear.wrap taking turns: the binding's cost per iteration, and the host
#                CPU time per iteration while the GPU works;
#   5 model-np2  the same at np 2 on the machine's GPUs (on one GPU: dear staged, DDP over gloo
#                with CUDA tensors, since NCCL refuses two ranks on one GPU);
#   6 bench      bench/dear-gpu-bench: busbw (coll), overlap of a reduce-scatter with a kernel, and
#                a profile's model under dear, wfbp and sync at np 1..--max-ranks.
# Results in --out (default $OUT, the device tool's folder, else a new one under /tmp), at most 8
# files as the device tool returns them: steps.txt (one line per step and sub-run, written as each
# ends), log.txt (everything printed), env.txt (the machine and the versions), and the CSVs
# model-np1.csv, model-np2.csv, coll.csv, overlap.csv, train.csv.
set -uo pipefail

SRCDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SELF=$SRCDIR/cuda/gpu-check.sh
PROG=gpu-check.sh
MODE=
DIR=
BUILDDIR=
BUDGET=540
OUTDIR=${OUT:-}
STEPS="1 2 3 4 5 6"
MAXRANKS=2
PROFILE=$SRCDIR/fusion/profiles/resnet50.prof
BINDING_CASES=clip_grad_norm_,scaler,accumulate,state_dict,cached_views,nested_reads,clip_norm,two_backward
ALSO=()

usage() {
    cat <<EOF
usage: cuda/gpu-check.sh --prepare DIR
       cuda/gpu-check.sh --carried DIR [--budget SECONDS] [--out DIR] [--steps '1 2 3 4 5 6']
       cuda/gpu-check.sh --emulate --builddir DIR [--budget SECONDS] [--out DIR]
       cuda/gpu-check.sh --publish DIR [--also DIR2]...
options: --max-ranks N (step 6, default $MAXRANKS) --profile FILE (step 6)
         --binding-cases A,B|all (step 2, default $BINDING_CASES)
EOF
}

die() { echo "$PROG: $*" >&2; exit 2; }
need_arg() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }

while [ $# -gt 0 ]; do
    case $1 in
    --prepare | --carried | --publish) need_arg "$@"; [ -z "$MODE" ] || die "$1 and --$MODE together"
        MODE=${1#--}; DIR=$2; shift ;;
    --emulate) [ -z "$MODE" ] || die "--emulate and --$MODE together"; MODE=emulate ;;
    --builddir) need_arg "$@"; BUILDDIR=$2; shift ;;
    --budget) need_arg "$@"; BUDGET=$2; shift ;;
    --out) need_arg "$@"; OUTDIR=$2; shift ;;
    --steps) need_arg "$@"; STEPS=$2; shift ;;
    --max-ranks) need_arg "$@"; MAXRANKS=$2; shift ;;
    --profile) need_arg "$@"; PROFILE=$2; shift ;;
    --binding-cases) need_arg "$@"; BINDING_CASES=$2; shift ;;
    --also) need_arg "$@"; ALSO+=("$2"); shift ;;
    --run-step) need_arg "$@"; MODE=run-step; DIR=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "$PROG: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
[ -n "$MODE" ] || { usage >&2; exit 2; }
[ ${#ALSO[@]} -eq 0 ] || [ "$MODE" = publish ] || die "--also goes with --publish (a later call's results folder)"
case $BUDGET in '' | *[!0-9]*) die "--budget '$BUDGET' is not a number of seconds" ;; esac
case $MAXRANKS in '' | *[!0-9]* | 0) die "--max-ranks '$MAXRANKS' is not a positive count" ;; esac
for s in $STEPS; do
    case $s in [1-6]) ;; *) die "--steps '$STEPS': steps are numbered 1 to 6" ;; esac
done

# --- publish: a returned results folder into docs/PERFORMANCE.md ------------------------------
publish() { # PAGE RESULTS [LATER-RESULTS]...
    /usr/bin/env python3 - "$SRCDIR/bench" "$@" <<'EOF'
import csv, os, re, sys
sys.path.insert(0, sys.argv[1])
from docsection import replace_section
page, calls = sys.argv[2], sys.argv[3:]
def build_of(res):
    """A later call's build, where its env.txt names it: its figures may be of other code."""
    p = os.path.join(res, "env.txt")
    lines = open(p).read().splitlines() if os.path.exists(p) else []
    commits = [l[len("build: "):] for l in lines if l.startswith("build: commit ")]
    return " (build: %s)" % commits[0] if commits else ""
def text(name):
    """The first call's file; steps.txt is every call's, each later one under its own heading."""
    parts = []
    for i, res in enumerate(calls if name == "steps.txt" else calls[:1]):
        p = os.path.join(res, name)
        if os.path.exists(p):
            parts.append(("" if i == 0 else "--- call %d%s\n" % (i + 1, build_of(res))) + open(p).read().rstrip())
    return "\n".join(parts)
def table(name, cols):
    """Every call's CSV rows as one Markdown table, the columns named (those it has), or all of them;
    a "call" column where more than one call measured it."""
    rows = []
    for i, res in enumerate(calls):
        p = os.path.join(res, name)
        if os.path.exists(p):
            rows += [dict(r, call=str(i + 1)) for r in csv.DictReader(open(p))]
    if not rows:
        return "(%s: not measured; steps.txt says why)" % name
    cols = [c for c in cols if c in rows[0]] or [c for c in rows[0] if c != "call"]
    if len({r["call"] for r in rows}) > 1:
        cols = ["call"] + cols
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(out + ["| " + " | ".join(r.get(c) or "" for c in cols) + " |" for r in rows])
def binding():
    """test_loops.py's lines from every call's log: how many runs matched DDP and the largest
    relative differences (parameters, recorded values), each with the run that had it."""
    pat = re.compile(r"^ok: (.*?): parameters ([0-9.e+-]+), recorded values (?:\(\d+\) )?([0-9.e+-]+) from DDP's")
    runs = []
    for res in calls:
        p = os.path.join(res, "log.txt")
        if os.path.exists(p):
            runs += [m.groups() for m in map(pat.match, open(p, errors="replace")) if m]
    if not runs:
        return "(the binding's loops: not run; steps.txt says why)"
    cases = sorted({w.split()[0] for w, _, _ in runs})
    dp = max(runs, key=lambda r: float(r[1]))
    dr = max(runs, key=lambda r: float(r[2]))
    return ("The binding's loops on CUDA against DDP over NCCL (tests/python/test_loops.py): %d runs of %d "
            "cases (%s) matched DDP. Largest relative difference in the parameters: %s (%s); in the recorded "
            "values (losses, norms, scales): %s (%s)." % (len(runs), len(cases), ", ".join(cases), dp[1], dp[0],
                                                         dr[2], dr[0]))
model_cols = ["model", "np", "config", "device", "backend", "warmup", "median_ms", "q1_ms", "q3_ms", "speedup", "baseline",
              "cpu_ms"]
section = """<!-- BEGIN gpu-check: generated by cuda/gpu-check.sh --publish, edits here are overwritten -->
## GPU check

Run by `cuda/gpu-check.sh --carried DIR --budget S --out $OUT` on the GPU machine, from a tree built
here by `cuda/gpu-check.sh --prepare DIR`; this section by `cuda/gpu-check.sh --publish` from
the folder it returned. The machine and versions:

```
%s
```

Each step and sub-run, in the order run (a step skipped for the budget says so):

```
%s
```

%s

A real model on the GPU (`bench/torch-ddp.py --device cuda`): median iteration (ms) over the
rounds, each configuration's ratio to the baseline named in the same run, and the host CPU time
per iteration (all threads; the binding's hooks and dear's progress thread included, and any
spinning in CUDA's synchronisation):

%s

%s

dear-gpu-bench (busbw GB/s, overlap, a profile's model):

%s

%s

%s
<!-- END gpu-check -->
""" % (text("env.txt"), text("steps.txt"), binding(), table("model-np1.csv", model_cols), table("model-np2.csv", model_cols),
       table("coll.csv", []), table("overlap.csv", []), table("train.csv", []))
replace_section(page, section, "<!-- BEGIN gpu-check", "<!-- END gpu-check -->")
EOF
}
if [ "$MODE" = publish ]; then
    [ -s "$DIR/steps.txt" ] || die "--publish $DIR: no steps.txt there (the folder a GPU run returned)"
    for d in "${ALSO[@]}"; do [ -s "$d/steps.txt" ] || die "--also $d: no steps.txt there"; done
    publish "$SRCDIR/docs/PERFORMANCE.md" "$DIR" "${ALSO[@]}" || exit 1
    echo "$PROG: docs/PERFORMANCE.md's GPU check section rewritten from $DIR${ALSO[*]:+ and ${ALSO[*]}}"
    exit 0
fi

# --- prepare: build here, copy into DIR -------------------------------------------------------
# The packages the programs load beyond what a GPU machine has (CUDA, NCCL, compilers, python).
PKGS="libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libhwloc-plugins libsubunit0 libnettle8
      libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libpsm-infinipath1 libpsm2-2
      libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libltdl7 libnuma1 libxnvctrl0"
GPU_PROGS="tests/cuda/test_gpu_real tests/cuda/test_cuda_device tests/cuda/test_cuemu_real
           tests/cuda/test_cuemu_nccl_real bench/dear-gpu-bench"
if [ "$MODE" = prepare ]; then
    B=${BUILDDIR:-$(pwd)}
    [ -f "$B/config.status" ] || die "--prepare: $B is not a configured build tree (run it there, or --builddir)"
    grep -q '^S\["CUDA_LIBS"\]=".*cudart' "$B/config.status" ||
        die "--prepare: $B was configured without CUDA (./configure --with-cuda --with-nccl)"
    (cd "$B" && make -j"$(nproc)" >/dev/null && make -j"$(nproc)" $GPU_PROGS >/dev/null) || die "the build failed"
    rm -rf "$DIR" && mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/debs" || die "cannot make $DIR"
    for p in $GPU_PROGS; do cp "$B/$p" "$DIR/bin/" || die "$p was not built"; done
    cp -L "$B/.libs/libdear.so.1" "$DIR/lib/" || die "libdear.so.1 was not built"
    # shellcheck disable=SC2086
    (cd "$DIR/debs" && apt-get download $PKGS >/dev/null 2>&1) || die "apt-get download failed (network?)"
    {
        echo "built $(date -u +%FT%TZ) on $(uname -n), $(. /etc/os-release && echo "$PRETTY_NAME")"
        echo "commit $(git -C "$SRCDIR" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$SRCDIR" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
        echo "nvcc $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([^,]*\).*/\1/p')"
        echo "NCCL headers $(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' /usr/local/cuda/include/nccl.h 2>/dev/null | paste -sd.)"
        echo "Open MPI $(dpkg-query -W -f '${Version}' libopenmpi3 2>/dev/null) (carried as .debs)"
    } >"$DIR/BUILD"
    echo "$PROG: $DIR holds $(du -sh "$DIR" | cut -f1): carry it (device run carry=[\"$DIR\"])," \
        "then run: bash cuda/gpu-check.sh --carried $DIR --budget 540 --out \$OUT"
    exit 0
fi

# --- the environment the steps run in ---------------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Containers (gVisor) refuse cross-memory attach; shared memory copies in two steps instead.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# The directory holding a library the dynamic loader resolves by name, or nothing.
libdir_of() { /sbin/ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { sub(/.* => /, ""); print; exit }' | xargs -r dirname; }
# A library in the python packages' trees (torch's nvidia-* wheels), or nothing.
wheel_libdir() {
    local py=$1 name=$2
    "$py" - "$name" <<'EOF' 2>/dev/null
import glob, os, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for f in glob.glob(os.path.join(d, "nvidia", "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(f)); sys.exit(0)
EOF
}
if [ "$MODE" = carried ]; then
    [ -d "$DIR/bin" ] && [ -d "$DIR/debs" ] || die "--carried $DIR: not a folder --prepare made (bin/, debs/)"
    DIR=$(cd "$DIR" && pwd)
    PREFIX=$(mktemp -d /tmp/gpu-check-prefix.XXXXXX)
    trap 'rm -rf "$PREFIX"' EXIT
    for d in "$DIR"/debs/*.deb; do dpkg -x "$d" "$PREFIX" || die "dpkg -x $d failed"; done
    # Open MPI and PMIx always the carried ones (mpirun, the library and the plugins must agree);
    # any other carried library only where the machine has none of that name.
    mkdir -p "$PREFIX/need"
    for f in "$PREFIX"/usr/lib/x86_64-linux-gnu/lib*.so.*; do
        n=$(basename "$f")
        case $n in
        libmpi* | libopen-* | libmca_* | libompitrace* | liboshmem* | libpmix*) ln -sf "$f" "$PREFIX/need/" ;;
        *) [ -n "$(libdir_of "$n")" ] || ln -sf "$f" "$PREFIX/need/" ;;
        esac
    done
    export OPAL_PREFIX=$PREFIX/usr PMIX_INSTALL_PREFIX=$PREFIX/usr
    # PMIx's plugins from the carried tree: a machine's own PMIx plugins lack the carried library's symbols.
    export PMIX_MCA_mca_base_component_path=$PREFIX/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
    export PATH=$PREFIX/usr/bin:$PATH
    LDP=$DIR/lib:$PREFIX/need:$PREFIX/usr/lib/x86_64-linux-gnu/openmpi/lib
    PY=python3
    for lib in libnccl.so.2 libcudart.so.13; do
        [ -n "$(libdir_of $lib)" ] || [ -e /usr/local/cuda/lib64/$lib ] && continue
        w=$(wheel_libdir $PY $lib)
        [ -n "$w" ] && LDP=$LDP:$w
    done
    export LD_LIBRARY_PATH=$LDP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export MPIRUN=$PREFIX/usr/bin/orterun MPIRUN_NP=-np MPIRUN_FLAGS="--bind-to none" MPIRUN_ENV=-x
    export T_DEVICE=$DIR/bin/test_cuda_device T_CUEMU=$DIR/bin/test_cuemu_real \
        T_CUEMU_NCCL=$DIR/bin/test_cuemu_nccl_real T_GPU=$DIR/bin/test_gpu_real BENCH=$DIR/bin/dear-gpu-bench \
        LIBDEAR=$DIR/lib/libdear.so.1 PY EMU=0 CARRY=$DIR
elif [ "$MODE" = emulate ]; then
    [ -n "$BUILDDIR" ] || die "--emulate needs --builddir (a configured, built tree)"
    B=$(cd "$BUILDDIR" && pwd) || die "--builddir $BUILDDIR: no such directory"
    # The launcher: make check's when it runs this, else the MPI in PATH.
    : "${MPIRUN:=mpirun}" "${MPIRUN_NP:=-np}" "${MPIRUN_FLAGS:=--bind-to none}" "${MPIRUN_ENV:=-x}"
    PY=
    for cand in python3 /usr/bin/python3; do
        if "$cand" -c "import torch, mpi4py" >/dev/null 2>&1; then PY=$cand; break; fi
    done
    export MPIRUN MPIRUN_NP MPIRUN_FLAGS MPIRUN_ENV T_DEVICE='' T_CUEMU=$B/tests/cuda/test_cuemu \
        T_CUEMU_NCCL=$B/tests/cuda/test_cuemu_nccl T_GPU=$B/tests/cuda/test_gpu \
        BENCH=$B/tests/cuda/dear-gpu-bench-emu LIBDEAR=$B/.libs/libdear.so.1 PY EMU=1 CARRY=
fi

# --- the steps (each runs as its own process: --run-step N, under the budget's timeout) ---------
# shellcheck disable=SC1091
. "$SRCDIR/tests/mpi-launch.sh"
rec() { echo "$*" | tee -a "$OUTDIR/log.txt" >>"$OUTDIR/steps.txt"; }
left() { echo $((DEADLINE - $(date +%s))); }
# run_np SECONDS NP LABEL [NAME=VALUE]... PROGRAM [ARGS]...: one sub-run, its result in steps.txt;
# killed at SECONDS or at the budget's end, whichever is first. 77 is a skip, as make check's.
run_np() {
    local secs=$1 np=$2 label=$3 t0 st l sub
    shift 3
    l=$(left)
    [ "$l" -lt "$secs" ] && secs=$l
    [ "$secs" -gt 5 ] || { rec "  $label: not started, the budget is spent"; SUB_FAILS=$((SUB_FAILS + 1)); return; }
    t0=$(date +%s)
    echo "--- $label (np $np, up to $secs s)" >>"$OUTDIR/log.txt"
    sub=$(mktemp /tmp/gpu-check-sub.XXXXXX)
    mpi_run "$secs" "$np" "$@" >"$sub" 2>&1 </dev/null
    st=$?
    cat "$sub" >>"$OUTDIR/log.txt"
    case $st in
    0) rec "  $label: pass ($(($(date +%s) - t0)) s)" ;;
    77) rec "  $label: skipped ($(grep -m1 -i skip "$sub" || echo 'exit 77'))" ;;
    124 | 137) rec "  $label: FAIL: killed at $secs s"; SUB_FAILS=$((SUB_FAILS + 1)) ;;
    *) rec "  $label: FAIL (status $st)"; SUB_FAILS=$((SUB_FAILS + 1)) ;;
    esac
    rm -f "$sub"
}
# The binding's environment: the python tree, and the library it loads.
binding_env() { echo "PYTHONPATH=$SRCDIR/python:$SRCDIR/tests/python" "DEAR_LIBRARY=$LIBDEAR" OMP_NUM_THREADS=4; }
have_py() { [ -n "$PY" ] || { rec "  not run: $PY_WHY"; return 1; }; }

step1() {
    if [ "$EMU" = 1 ]; then
        run_np 300 1 test_cuemu "$T_CUEMU"
        run_np 300 2 "test_cuemu_nccl" CUEMU_DEVICES=2 "$T_CUEMU_NCCL"
        run_np 300 2 "test_gpu --quick" CK_FORK=no CUEMU_DEVICES=2 CK_EXCLUDE_CASE=compressed "$T_GPU" --quick
        return
    fi
    run_np 120 1 test_cuda_device "$T_DEVICE"
    run_np 300 1 "test_gpu_real np 1" CK_FORK=no CK_EXCLUDE_CASE=compressed "$T_GPU"
    run_np 300 2 "test_gpu_real np 2" CK_FORK=no CK_EXCLUDE_CASE=compressed "$T_GPU"
    run_np 120 1 test_cuemu_real "$T_CUEMU"
    run_np 180 2 test_cuemu_nccl_real "$T_CUEMU_NCCL"
}
step2() {
    have_py || return 0
    local cases=$BINDING_CASES dev=cuda backend=nccl
    [ "$cases" = all ] && cases=
    # On the emulator torch has no GPU: the same loops on the CPU, DDP over gloo.
    [ "$EMU" = 1 ] && { dev=cpu backend=gloo cases=clip_grad_norm_,cached_views; }
    # shellcheck disable=SC2046
    run_np 420 1 "test_loops.py on $dev, DDP over $backend" $(binding_env) DEAR_TEST_DEVICE=$dev \
        "$PY" "$SRCDIR/tests/python/test_loops.py" ${cases:+--cases "$cases"} --ddp-backend $backend
}
step3() {
    local ndev=2
    [ "$EMU" = 1 ] || ndev=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    run_np 300 1 "test_gpu compressed np 1" CK_FORK=no CUEMU_DEVICES=2 CK_RUN_CASE=compressed "$T_GPU"
    run_np 300 2 "test_gpu compressed np 2 ($([ "$ndev" -ge 2 ] && echo nccl || echo 'staged, one GPU'))" \
        CK_FORK=no CUEMU_DEVICES=2 CK_RUN_CASE=compressed "$T_GPU"
}
model() { # NP CSV CONFIGS
    have_py || return 0
    local np=$1 csv=$2 configs=$3 backend=nccl args
    if [ "$EMU" = 1 ]; then
        backend=gloo args="--model encoder --device cpu --rounds 1 --iters 2 --warmup 6 --auto-warmup 6 --batch 2"
    else
        # Two ranks on one GPU: NCCL refuses them, gloo carries DDP's CUDA tensors.
        [ "$np" -gt 1 ] && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -lt "$np" ] && backend=gloo
        args="--model resnet18 --device cuda --rounds 5 --iters 20 --warmup 25 --batch 128"
    fi
    # shellcheck disable=SC2046,SC2086
    run_np 300 "$np" "torch-ddp.py np $np, DDP over $backend" $(binding_env) "$PY" "$SRCDIR/bench/torch-ddp.py" \
        $args --backend $backend --configs "$configs" --csv "$OUTDIR/$csv"
}
step4() { model 1 model-np1.csv "plain;ddp;dear:sync:threshold;dear:wfbp:threshold;dear:dear:threshold;dear:dear:auto"; }
step5() { model 2 model-np2.csv "ddp;dear:wfbp:threshold;dear:dear:threshold;dear:dear:auto"; }
step6() {
    local benv='' sizes="--min 1m --max 256m --iters 10" overlap="--bytes 16m --iters 10" train="--train-iters 20"
    local np=$MAXRANKS
    [ "$np" -ge 2 ] || np=2
    if [ "$EMU" = 1 ]; then
        benv="CUEMU_DEVICES=$MAXRANKS CUEMU_DELAY_US=0" sizes="--min 64k --max 256k --iters 3"
        overlap="--bytes 256k --iters 3" train="--time-scale 0.02 --train-iters 8"
        # Two ranks on one GPU: the NCCL rows are left out, the others still measured.
        mpi_run 300 2 CUEMU_DEVICES=1 CUEMU_DELAY_US=0 "$BENCH" coll --min 64k --max 64k --iters 1 2>&1 |
            grep -q "n/a" && rec "  coll on a shared GPU leaves the NCCL rows out: pass" ||
            { rec "  coll on a shared GPU did not leave the NCCL rows out: FAIL"; SUB_FAILS=$((SUB_FAILS + 1)); }
    fi
    # shellcheck disable=SC2086
    run_np 300 "$np" "dear-gpu-bench coll" $benv "$BENCH" coll $sizes --csv "$OUTDIR/coll.csv"
    # shellcheck disable=SC2086
    run_np 300 "$np" "dear-gpu-bench overlap" $benv "$BENCH" overlap $overlap --csv "$OUTDIR/overlap.csv"
    for n in $(seq 1 "$MAXRANKS"); do
        # shellcheck disable=SC2086
        run_np 300 "$n" "dear-gpu-bench train np $n" $benv "$BENCH" train --profile "$PROFILE" $train \
            --csv "$OUTDIR/train-$n.csv"
        # one CSV for all rank counts (the device tool returns 8 files at most)
        if [ -s "$OUTDIR/train-$n.csv" ]; then
            if [ -s "$OUTDIR/train.csv" ]; then tail -n +2 "$OUTDIR/train-$n.csv"; else cat "$OUTDIR/train-$n.csv"; fi \
                >>"$OUTDIR/train.csv"
        fi
        rm -f "$OUTDIR/train-$n.csv"
    done
}
STEP_NAMES=(- tests binding compressed model-np1 model-np2 bench)
STEP_NEED=(0 60 90 60 90 90 60) # seconds a step needs to be worth starting

if [ "$MODE" = run-step ]; then
    OUTDIR=$GC_OUTDIR DEADLINE=$GC_DEADLINE PROFILE=$GC_PROFILE MAXRANKS=$GC_MAXRANKS BINDING_CASES=$GC_CASES
    SUB_FAILS=0
    "step$DIR"
    exit $((SUB_FAILS > 0))
fi

# --- the run ----------------------------------------------------------------------------------
OUT_TMP=
[ -n "$OUTDIR" ] || OUTDIR=$(mktemp -d /tmp/gpu-check-out.XXXXXX) OUT_TMP=1
mkdir -p "$OUTDIR" || die "cannot make --out $OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
: >"$OUTDIR/steps.txt"
: >"$OUTDIR/log.txt"
START=$(date +%s)
DEADLINE=$((START + BUDGET))
# The steps' processes (--run-step) take the settings from here, not from their arguments.
export GC_OUTDIR=$OUTDIR GC_DEADLINE=$DEADLINE GC_PROFILE=$PROFILE GC_MAXRANKS=$MAXRANKS GC_CASES=$BINDING_CASES
PY_WHY=
if [ -z "$PY" ] || ! "$PY" -c "import torch, mpi4py" >/dev/null 2>&1; then
    PY='' PY_WHY="no python3 with torch and mpi4py"
else
    # mpi4py is built against one MPI; the library must be built against the same.
    PY_WHY=$(mpi4py_mismatch "$PY")
    [ -z "$PY_WHY" ] || PY=''
fi
export PY PY_WHY
{
    echo "date $(date -u +%FT%TZ), $MODE mode, budget $BUDGET s, steps $STEPS"
    if [ "$EMU" = 1 ]; then
        echo "GPU: none (the emulated CUDA runtime and NCCL of $B)"
    else
        gpus=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | paste -sd';')
        echo "GPU (name, driver, memory): ${gpus:-nvidia-smi printed nothing}"
        echo "nvcc: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([^,]*\).*/\1/p')"
        echo "libnccl.so.2: $(libdir_of libnccl.so.2)$(for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/libnccl.so.2" ] && echo "$d" && break; done)"
        echo "Open MPI: $($MPIRUN --version 2>/dev/null | head -1)"
        sed 's/^/build: /' "$CARRY/BUILD" 2>/dev/null
        # where each library the programs need resolves (a carried one, the system's, a wheel's)
        ldd "$T_GPU" "$LIBDEAR" 2>&1 | awk '/=>/ && /mpi|nccl|cudart|hwloc|pmix|subunit|nettle|not found/ {print "ldd: " $1 " => " $3}' | sort -u
    fi
    [ -n "$PY" ] && "$PY" -c "import torch, sys
c = torch.cuda.is_available()
print('torch %s, CUDA %s, NCCL %s, GPUs %d, python %s' % (torch.__version__, torch.version.cuda,
      '.'.join(map(str, torch.cuda.nccl.version())) if c else '-', torch.cuda.device_count() if c else 0,
      sys.version.split()[0]))" 2>&1 | tail -1
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >>"$OUTDIR/log.txt"

FAILS=0
for n in $STEPS; do
    l=$(left)
    if [ "$l" -lt "${STEP_NEED[$n]}" ]; then
        rec "step $n ${STEP_NAMES[$n]}: skipped: $l s of the budget left, it needs about ${STEP_NEED[$n]} s"
        continue
    fi
    echo "=== step $n ${STEP_NAMES[$n]} ($l s of the budget left)" >>"$OUTDIR/log.txt"
    rec "step $n ${STEP_NAMES[$n]}:"
    t0=$(date +%s)
    timeout -k 10 "$l" bash "$SELF" --run-step "$n"
    st=$?
    case $st in
    0) rec "step $n ${STEP_NAMES[$n]}: done in $(($(date +%s) - t0)) s" ;;
    124 | 137) rec "step $n ${STEP_NAMES[$n]}: FAIL: cut off at the budget's end"; FAILS=$((FAILS + 1)) ;;
    *) rec "step $n ${STEP_NAMES[$n]}: FAIL in $(($(date +%s) - t0)) s"; FAILS=$((FAILS + 1)) ;;
    esac
done
rec "total $(($(date +%s) - START)) s of $BUDGET, $FAILS step(s) failed; results in $OUTDIR"

if [ "$EMU" = 1 ]; then
    # Every step's output where a GPU run's would be, and --publish able to read it.
    # (each file of a step that ran to its end)
    for f in 4:model-np1.csv 5:model-np2.csv 6:coll.csv 6:overlap.csv 6:train.csv; do
        case $PY:${f#*:} in :model-*) continue ;; esac
        grep -q "^step ${f%%:*} [a-z0-9-]*: done in" "$OUTDIR/steps.txt" || continue
        [ -s "$OUTDIR/${f#*:}" ] || { echo "$PROG: the emulated run wrote no ${f#*:}" >&2; FAILS=$((FAILS + 1)); }
    done
    page=$(mktemp /tmp/gpu-check-page.XXXXXX)
    printf '# scratch\n\n<!-- BEGIN gpu-check -->\n<!-- END gpu-check -->\n' >"$page"
    if ! publish "$page" "$OUTDIR" "$OUTDIR" ||
        ! grep -q "^## GPU check" "$page" || ! grep -q "^--- call 2" "$page"; then
        echo "$PROG: --publish could not write the section from the emulated run's results" >&2
        FAILS=$((FAILS + 1))
    fi
    rm -f "$page"
fi
[ "$FAILS" -eq 0 ] || { cat "$OUTDIR/steps.txt" >&2; exit 1; }
cat "$OUTDIR/steps.txt"
[ -z "$OUT_TMP" ] || [ "$EMU" = 0 ] || rm -rf "$OUTDIR"
exit 0
