#!/bin/sh
# The layers of docs/DESIGN.md hold: base -> {collectives, fusion} -> cuda -> runtime -> apps.
# Every #include "X/..." of a source file must name its own folder or a lower layer; fusion/
# and base/ (but base/mpi_check.*) include no MPI header, fusion/ no CUDA or NCCL header; the
# sample trainers use only the public API; no library's LIBADD names a higher layer; and runtime/
# names no transport and touches gradient data only through the memory table.
set -u
: "${top_srcdir:=.}"
cd "$top_srcdir" || exit 99
fail=0
bad() { echo "layers.sh: $*" >&2; fail=1; }

# allowed DIR: the folders (and include/ files) a file under DIR may include.
allowed() {
    case $1 in
    base) echo "base include/dear_types.h" ;;
    collectives) echo "base collectives include" ;;
    fusion) echo "base fusion include/dear_types.h" ;;
    cuda) echo "base collectives cuda include" ;;
    runtime) echo "base collectives fusion cuda runtime include" ;;
    apps/cnn | apps/gpt) echo "$1 include/dear.h" ;;
    apps/bench) echo "apps/bench include base fusion" ;;
    apps/tools) echo "apps/tools include base collectives fusion cuda runtime" ;;
    esac
}

for dir in base collectives fusion cuda runtime apps/cnn apps/gpt apps/bench apps/tools; do
    ok=$(allowed "$dir")
    for f in $(find "$dir" -maxdepth 1 \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.def' \) | sort); do
        # quoted includes: "folder/file"
        for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
            case $inc in */*) ;; *) continue ;; esac   # a sibling header without a folder
            hit=0
            for a in $ok; do
                case $inc in "$a" | "$a"/*) hit=1 ;; esac
            done
            [ $hit -eq 1 ] || bad "$f includes \"$inc\": $dir may include only $ok"
        done
        # system headers of the transports
        sys=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\([^>]*\)>.*/\1/p' "$f")
        case $dir in
        fusion | base)
            case $f in base/mpi_check.[ch]) ;; *)
                echo "$sys" | grep -qx 'mpi.h' && bad "$f includes <mpi.h>: $dir is MPI-free (MPI checks live in base/mpi_check.h)" ;;
            esac ;;
        esac
        case $dir in
        base | collectives | fusion)
            echo "$sys" | grep -Eq '^(cuda|cuda_runtime|cuda_runtime_api|nccl)\.h$' &&
                bad "$f includes a CUDA or NCCL header: only cuda/ (and above) may" ;;
        esac
        case $dir in
        fusion)
            grep -q '#[[:space:]]*include[[:space:]]*"base/mpi_check.h"' "$f" &&
                bad "$f includes base/mpi_check.h: fusion/ is pure C, without MPI" ;;
        esac
    done
done

# The seams (docs/DESIGN.md): runtime/ reaches a transport only through the transport table
# (collectives/net.h), never one by name, and gradient data only through the memory table
# (collectives/mem.h): a memcpy, memset or memmove there copies structs (its size is a sizeof)
# or, in timeline.c, text.
for f in runtime/*.c runtime/*.h; do
    for n in $(grep -nE 'dear_sock_|collectives/sock\.h|dear_net_(mpi|sock)_ops|DEAR_TRANSPORT_(MPI|SOCKET)\b' "$f" |
               cut -d: -f1); do
        bad "$f:$n: names a transport; runtime/ goes through the transport table (collectives/net.h)"
    done
    case $f in runtime/timeline.c) continue ;; esac
    for n in $(grep -nE '\bmem(cpy|set|move)[[:space:]]*\(' "$f" | grep -v 'sizeof' | cut -d: -f1); do
        bad "$f:$n: copies or fills memory outside the memory table (collectives/mem.h)"
    done
done

# LIBADD: a layer's library names only its own folder's or lower layers' libraries.
rank() {
    case $1 in
    base) echo 0 ;; collectives | fusion) echo 1 ;; cuda) echo 2 ;; runtime) echo 3 ;; *) echo 9 ;;
    esac
}
for mk in base/local.mk collectives/local.mk fusion/local.mk cuda/local.mk runtime/local.mk; do
    dir=${mk%/local.mk}
    me=$(rank "$dir")
    for la in $(sed -n 's/^[a-z_]*_la_LIBADD[[:space:]]*[+]*=//p' "$mk" | tr ' ' '\n' | grep '\.la$'); do
        other=${la%%/*}
        [ "$other" = "$dir" ] && continue
        [ "$(rank "$other")" -lt "$me" ] || bad "$mk: LIBADD names $la, which is not below $dir"
    done
done

[ $fail -eq 0 ] || exit 1
echo "layers.sh: every include and LIBADD follows base -> {collectives, fusion} -> cuda -> runtime -> apps"
