#!/bin/sh
# The Python binding (python/dear) against torch DDP over gloo, at np 1, 2 and 4
# (tests/python/test_torch.py and test_loops.py say what is compared); one rank failing ends the
# job at once (abort_torch.py). Skipped (77) only where no python3 has
# torch and mpi4py; install-deps.sh installs both (python3-torch, python3-mpi4py).
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}"
. "$top_srcdir/tests/mpi-launch.sh"
lib=$top_builddir/.libs/libdear.so.1
[ -e "$lib" ] || { echo "torch.sh: $lib not built" >&2; exit 99; }
py=
for cand in python3 /usr/bin/python3; do
    if "$cand" -c "import torch, mpi4py" >/dev/null 2>&1; then py=$cand; break; fi
done
[ -n "$py" ] || { echo "torch.sh: no python3 with torch and mpi4py (apt-get install python3-torch python3-mpi4py): skipped"; exit 77; }
# mpi4py is built against one MPI (Debian's: Open MPI); libdear must be built against the same.
why=$(mpi4py_mismatch "$py")
[ -z "$why" ] || { echo "torch.sh: $why: skipped"; exit 77; }
src=$(cd "$top_srcdir" && pwd)
libpath=$(cd "$(dirname "$lib")" && pwd)/libdear.so.1
fails=0
for t in test_torch test_loops; do
    for np in 1 2 4; do
        # A hang guard, not a time limit: under make check -j2 the np 4 runs share 2 cores with
        # another test's ranks, and took over ten times their time alone.
        mpi_run 1500 $np PYTHONPATH="$src/python" DEAR_LIBRARY="$libpath" "$py" "$src/tests/python/$t.py" || {
            echo "torch.sh: $t.py at np $np failed (status $?)" >&2
            fails=$((fails + 1))
        }
    done
done
# The same loops on GPUs where torch sees one (Debian's torch is CPU-only: then they are skipped
# and say so; cuda/gpu-check.sh runs this file on a GPU machine).
if "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    for np in 1 2; do
        mpi_run 600 $np PYTHONPATH="$src/python" DEAR_LIBRARY="$libpath" DEAR_TEST_DEVICE=cuda "$py" \
            "$src/tests/python/test_loops.py" || {
            echo "torch.sh: test_loops.py on CUDA at np $np failed (status $?)" >&2
            fails=$((fails + 1))
        }
    done
else
    echo "torch.sh: torch sees no GPU: the loops on CUDA parameters not run"
fi
# An uncaught exception, and SIGINT, on rank 1 end the job within seconds (DEAR_STALL_ABORT_S, 600
# by default, would end it otherwise), with the original error printed.
for what in "raise:ValueError: deliberate failure on rank 1" "sigint:KeyboardInterrupt (SIGINT)"; do
    start=$(date +%s)
    out=$(mpi_run 120 2 PYTHONPATH="$src/python" DEAR_LIBRARY="$libpath" "$py" "$src/tests/python/abort_torch.py" \
        "${what%%:*}" 2>&1)
    st=$? took=$(($(date +%s) - start))
    if [ $st -eq 0 ] || [ $st -eq 124 ] || [ $st -eq 137 ] || [ $took -gt 60 ] ||
        ! echo "$out" | grep -q "${what#*:}" || ! echo "$out" | grep -q "aborting the job (MPI_Abort)"; then
        echo "$out"; echo "torch.sh: ${what%%:*} on rank 1: status $st after $took s" >&2; fails=$((fails + 1))
    else
        echo "torch.sh: ${what%%:*} on rank 1 ended the job in $took s (status $st), the error printed"
    fi
done
# The sample trainer runs, learns, evaluates and says so (a short run; README gives the full one).
if [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    out=$(mpi_run 300 2 PYTHONPATH="$src/python" DEAR_LIBRARY="$libpath" "$py" "$src/apps/torch/train.py" \
        --iters 60 --log-every 30 2>&1)
    acc=$(echo "$out" | sed -n 's/^test accuracy \([0-9.]*\)% after 60 iterations (2 ranks.*/\1/p')
    if [ -z "$acc" ] || [ "${acc%%.*}" -lt 40 ]; then
        echo "$out"; echo "torch.sh: apps/torch/train.py did not learn (accuracy '$acc')" >&2; fails=$((fails + 1))
    else
        echo "torch.sh: apps/torch/train.py, 60 iterations at np 2: test accuracy $acc%"
    fi
fi
# The README's example is a complete program that learns: run it as printed there.
example=$(mktemp "${TMPDIR:-/tmp}/dear-readme.XXXXXX.py")
awk '/^## From PyTorch/{f=1} f&&/^```python/{p=1;next} p&&/^```/{exit} p' "$src/README.md" >"$example"
out=$(mpi_run 120 2 PYTHONPATH="$src/python" DEAR_LIBRARY="$libpath" "$py" "$example" 2>&1)
rm -f "$example"
# mpirun forwards each rank's stdout on its own, so two ranks' lines can arrive joined on one
# line ("rank 0: loss 0.102rank 1: loss 0.119"): match the reports, not whole lines.
reports=$(echo "$out" | grep -o 'rank [01]: loss [0-9.]*')
nlearnt=$(echo "$reports" | awk '$4 < 0.5 {seen[$2]=1} END {print length(seen)}')
if [ "$nlearnt" -ne 2 ]; then
    echo "$out"; echo "torch.sh: the README's PyTorch example did not run and learn on 2 ranks" >&2; fails=$((fails + 1))
else
    echo "torch.sh: the README's PyTorch example: $(echo "$reports" | tr '\n' ' ')"
fi
[ $fails -eq 0 ]
