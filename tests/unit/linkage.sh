#!/bin/sh
# What libdear links and calls, by how it was configured: built with CUDA and NCCL it references
# the stream-ordered calls the GPU path rests on (ncclReduceScatter, ncclAllGather,
# cudaEventRecord, cudaStreamWaitEvent); built without CUDA (.ci/check-mpich configures so) it
# neither needs libcudart or libnccl nor references any cuda* or nccl* symbol, so the core never
# drags the CUDA runtime into a CPU-only program.
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}"
lib=$top_builddir/.libs/libdear.so.1
[ -e "$lib" ] || { echo "linkage.sh: $lib not built" >&2; exit 99; }
command -v nm >/dev/null && command -v readelf >/dev/null || { echo "linkage.sh: no nm/readelf: skipped"; exit 77; }
fail=0
undef=$(nm -D --undefined-only "$lib" | awk '{print $NF}' | sed 's/@.*//')
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
if grep -q '^#define HAVE_CUDA 1' "$top_builddir/config.h"; then
    want="cudaEventRecord cudaStreamWaitEvent"
    grep -q '^#define HAVE_NCCL 1' "$top_builddir/config.h" && want="$want ncclReduceScatter ncclAllGather ncclAllReduce"
    for s in $want; do
        echo "$undef" | grep -qx "$s" || { echo "linkage.sh: a CUDA build of libdear does not call $s" >&2; fail=1; }
    done
    echo "linkage.sh: built with CUDA; libdear calls $want"
else
    if echo "$needed" | grep -Eq '^lib(cudart|cuda|nccl)\.'; then
        echo "linkage.sh: built without CUDA, libdear still needs: $(echo "$needed" | grep -E '^lib(cudart|cuda|nccl)\.')" >&2
        fail=1
    fi
    stray=$(echo "$undef" | grep -E '^(cuda|nccl)' | tr '\n' ' ')
    [ -z "$stray" ] || { echo "linkage.sh: built without CUDA, libdear references $stray" >&2; fail=1; }
    echo "linkage.sh: built without CUDA; libdear needs $(echo "$needed" | tr '\n' ' ')"
fi
exit $fail
