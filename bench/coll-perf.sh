#!/bin/bash
# coll-perf.sh: the collectives figures of docs/PERFORMANCE.md, from measurement to page.
#
# Brings up the emulated cluster (4 hosts at 1 Gbit/s by default, bench/emucluster), measures
# the point-to-point rate between two hosts (bench/dear-p2p), runs dear-coll-bench across all
# hosts (one rank per host, or --layout HOSTSxRANKS) from 64 KiB to 64 MiB for every algorithm
# and Open MPI's own calls, tears the cluster down, keeps the CSVs under bench/results/, and
# regenerates the layout's generated section of docs/PERFORMANCE.md with bench/perf-report.py
# (tables, targets, an SVG plot). --report-only redoes the last step from the kept CSVs.
set -euo pipefail
PROG="coll-perf.sh"
# shellcheck source=bench/bench-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

HOSTS=4
RANKS=1
RATE=1gbit
MIN=65536
MAX=67108864
BUILDDIR=
REPORT_ONLY=0
P2P_ONLY=0
P2P_TIME=2
ITERS=5
SMALL_ITERS=20
SMALL_MAX=1048576
WARMUP=1
REPEAT=1
OVERLAP_BYTES=16777216
EXTRA=()

usage() {
    cat <<EOF
usage: bench/coll-perf.sh [options] [-- dear-coll-bench options]
  --builddir DIR    build directory holding apps/tools/dear-coll-bench and bench/dear-p2p
                    (default: the current directory if it has them, else the source tree)
  --hosts N         emulated hosts, one rank each (default $HOSTS)
  --layout HxR      H emulated hosts of R ranks each (e.g. 2x2; R > 1 measures the two-level
                    collectives, hier, against the flat ones); replaces --hosts
  --rate RATE       link rate, tc syntax (default $RATE)
  --min BYTES       smallest collective size (default $MIN; k, m, g suffixes: 1024-based)
  --max BYTES       largest collective size (default $MAX)
  --iters N         timed iterations per row above $SMALL_MAX bytes, median reported
                    (default $ITERS; one 64 MiB Open MPI reduce-scatter takes seconds at 1gbit)
  --small-iters N   timed iterations per row up to $SMALL_MAX bytes (default $SMALL_ITERS: small
                    sizes are cheap and the noisiest on a shared machine)
  --warmup N        untimed iterations per row (default $WARMUP)
  --repeat N        run the benchmark N times, one job after the other (default $REPEAT); the
                    report takes each row's median over the runs, so a stall of the shared
                    machine spoils one run's row rather than the figure
  --overlap BYTES   size of the OSU overlap run (dear-coll-bench --overlap; default
                    $OVERLAP_BYTES; 0 skips it)
  --report-only     do not measure; regenerate docs/PERFORMANCE.md from bench/results/
  --p2p-only        measure only the point-to-point rate (while dear-coll-bench is missing);
                    the page then says the collective figures are missing
  --help            this text
Writes bench/results/{p2p,coll}-TAG.csv, bench/results/coll-TAG.{meta,txt},
bench/results/coll-TAG.svg and the layout's generated section of docs/PERFORMANCE.md, where TAG
is HxRATE for one rank per host (coll-4x1gbit) and HxRxRATE otherwise (coll-2x2x1gbit).
EMU_PREFIX and EMU_SUBNET (bench/emucluster) give the run a cluster of its own.
Needs root (network namespaces); takes a few minutes at 1gbit.
EOF
}

# Bytes from a count with an optional k/m/g suffix (1024-based, as dear-coll-bench reads them).
to_bytes() {
    [[ ${1,,} =~ ^([0-9]+)([kmg]?)$ ]] || { echo "$1"; return 0; }
    local n=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in
        k) n=$((n << 10)) ;; m) n=$((n << 20)) ;; g) n=$((n << 30)) ;;
    esac
    echo "$n"
}

hosts_opt() { HOSTS=$1 RANKS=1; }
layout_opt() {
    [[ $1 =~ ^([0-9]+)x([0-9]+)$ ]] || die "bad --layout '$1': expected HOSTSxRANKS, e.g. 2x2"
    HOSTS=${BASH_REMATCH[1]} RANKS=${BASH_REMATCH[2]}
}
bench_options --builddir=BUILDDIR --hosts=@hosts_opt --layout=@layout_opt --rate=RATE --min=MIN --max=MAX \
    --iters=ITERS --small-iters=SMALL_ITERS --warmup=WARMUP --repeat=REPEAT --overlap=OVERLAP_BYTES \
    --report-only=REPORT_ONLY! --p2p-only=P2P_ONLY! --=EXTRA -- "$@"
MIN=$(to_bytes "$MIN")
MAX=$(to_bytes "$MAX")
OVERLAP_BYTES=$(to_bytes "$OVERLAP_BYTES")
if ! [[ $HOSTS =~ ^[0-9]+$ ]] || ((HOSTS < 2)); then
    die "bad --hosts '$HOSTS': expected 2 or more"
fi
((RANKS >= 1)) || die "bad --layout '${HOSTS}x$RANKS': expected 1 or more ranks per host"
if ! [[ $MIN =~ ^[0-9]+$ && $MAX =~ ^[0-9]+$ ]] || ((MIN < 1 || MIN > MAX)); then
    die "bad --min/--max '$MIN'/'$MAX': expected byte counts with 1 <= min <= max"
fi
if ! [[ $ITERS =~ ^[0-9]+$ && $SMALL_ITERS =~ ^[0-9]+$ && $WARMUP =~ ^[0-9]+$ &&
        $OVERLAP_BYTES =~ ^[0-9]+$ && $REPEAT =~ ^[0-9]+$ ]] || ((ITERS < 1 || SMALL_ITERS < 1 || REPEAT < 1)); then
    die "bad --iters/--small-iters/--warmup/--overlap/--repeat '$ITERS'/'$SMALL_ITERS'/'$WARMUP'/'$OVERLAP_BYTES'/'$REPEAT': expected counts (iters, repeat >= 1)"
fi

NP=$((HOSTS * RANKS))
LAYOUT=${HOSTS}x$RANKS
if ((RANKS == 1)); then TAG=${HOSTS}x$RATE; else TAG=${HOSTS}x${RANKS}x$RATE; fi
P2P_CSV=$RES/p2p-$TAG.csv
COLL_CSV=$RES/coll-$TAG.csv
OVL_CSV=$RES/overlap-$TAG.csv
META=$RES/coll-$TAG.meta
SVG=$RES/coll-$TAG.svg

report() {
    local coll=()
    ((P2P_ONLY)) || coll=(--coll "$COLL_CSV")
    ((P2P_ONLY)) || [[ ! -f $OVL_CSV ]] || coll+=(--overlap "$OVL_CSV")
    local where="--hosts $HOSTS"
    ((RANKS == 1)) || where="--layout $LAYOUT"
    python3 "$SRCDIR/bench/perf-report.py" --p2p "$P2P_CSV" "${coll[@]}" --meta "$META" --layout "$LAYOUT" \
        --svg "$SVG" --doc "$DOC" --command "bench/coll-perf.sh $where --rate $RATE --min $MIN --max $MAX --iters $ITERS --small-iters $SMALL_ITERS --warmup $WARMUP$( ((REPEAT > 1)) && echo " --repeat $REPEAT") --overlap $OVERLAP_BYTES$( ((P2P_ONLY)) && echo ' --p2p-only')${EXTRA[*]:+ -- ${EXTRA[*]}}"
}

if ((REPORT_ONLY)); then
    [[ -f $P2P_CSV ]] || die "no results for $TAG under $RES: run without --report-only first"
    [[ -f $COLL_CSV ]] || P2P_ONLY=1
    report
    exit 0
fi

want=apps/tools/dear-coll-bench
((P2P_ONLY)) && want=bench/dear-p2p
BUILDDIR=$(bench_builddir "$BUILDDIR" "$want" "build it (make apps/tools/dear-coll-bench bench/dear-p2p)")
BENCH=$BUILDDIR/apps/tools/dear-coll-bench
P2P=$BUILDDIR/bench/dear-p2p
((P2P_ONLY)) || [[ -x $BENCH ]] || die "$BENCH is not built (make apps/tools/dear-coll-bench; or --p2p-only)"
[[ -x $P2P ]] || die "$P2P is not built (make bench/dear-p2p)"
[[ $EUID -eq 0 ]] || die "needs root to create network namespaces"

mkdir -p "$RES"
bench_start

load_before=$(meta_load)
hostlist=$(emu_hosts "$HOSTS" "$RANKS")
emu_up "$HOSTS" "$RATE"
"$EMU" status

echo "$PROG: point-to-point ${EMU_PREFIX:-h}1 <-> ${EMU_PREFIX:-h}2"
EMU_BUILDDIR=$BUILDDIR "$EMU" p2p --csv --time "$P2P_TIME" --reps 3 | tee "$tmp/p2p.csv"
grep -q '^oneway,' "$tmp/p2p.csv" || die "dear-p2p printed no oneway row"

elapsed=0
if ! ((P2P_ONLY)); then
    echo "$PROG: dear-coll-bench on $hostlist, $MIN..$MAX bytes"
    start=$(date +%s)
    # Two runs over the doubling sequence from MIN: the small sizes with more iterations.
    small_last=0 big_first=0
    for ((b = MIN; b <= MAX; b *= 2)); do
        if ((b <= SMALL_MAX)); then small_last=$b; elif ((big_first == 0)); then big_first=$b; fi
    done
    : >"$tmp/coll.txt"
    part=0
    for ((run = 1; run <= REPEAT; run++)); do
        for range in "$MIN:$small_last:$SMALL_ITERS" "$big_first:$MAX:$ITERS"; do
            IFS=: read -r lo hi it <<<"$range"
            ((lo > 0 && hi >= lo)) || continue
            part=$((part + 1))
            emu_mpirun "$NP" "$hostlist" "$BENCH" --min "$lo" --max "$hi" \
                --iters "$it" --warmup "$WARMUP" --csv "$tmp/coll$part.csv" "${EXTRA[@]}" | tee -a "$tmp/coll.txt"
            [[ -s $tmp/coll$part.csv ]] || die "dear-coll-bench ($lo..$hi bytes) wrote no CSV"
            if ((part == 1)); then cat "$tmp/coll1.csv"; else tail -n +2 "$tmp/coll$part.csv"; fi >>"$tmp/coll.csv"
        done
    done
    [[ -s $tmp/coll.csv ]] || die "dear-coll-bench wrote no CSV"
    if ((OVERLAP_BYTES > 0)); then
        echo "$PROG: dear-coll-bench --overlap at $OVERLAP_BYTES bytes"
        emu_mpirun "$NP" "$hostlist" "$BENCH" --overlap --min "$OVERLAP_BYTES" \
            --max "$OVERLAP_BYTES" --iters "$ITERS" --warmup "$WARMUP" --csv "$tmp/overlap.csv" \
            "${EXTRA[@]}" | tee -a "$tmp/coll.txt"
        [[ -s $tmp/overlap.csv ]] || die "dear-coll-bench --overlap wrote no CSV"
    fi
    elapsed=$(( $(date +%s) - start ))
fi

{
    echo "date: $(meta_date)"
    echo "commit: $(meta_commit)"
    echo "cluster: $HOSTS hosts, $RATE each way per host (tbf on both ends of each veth), $( ((RANKS == 1)) && echo 'one rank' || echo "$RANKS ranks") per host"
    echo "load average: $load_before before, $(meta_load) after (1, 5, 15 min)"
    echo "machine: $(meta_machine)"
    ((P2P_ONLY)) || echo "bench: dear-coll-bench --min $MIN --max $MAX ${EXTRA[*]}: --iters $SMALL_ITERS up to $SMALL_MAX bytes, --iters $ITERS above, --warmup $WARMUP$( ((REPEAT > 1)) && echo ", $REPEAT runs (each row the median of the runs)")$( ((OVERLAP_BYTES > 0)) && echo "; then --overlap at $OVERLAP_BYTES bytes") (${elapsed} s in all)"
} >"$tmp/meta"
cp "$tmp/p2p.csv" "$P2P_CSV"
if ! ((P2P_ONLY)); then
    cp "$tmp/coll.csv" "$COLL_CSV"
    cp "$tmp/coll.txt" "$RES/coll-$TAG.txt"
    rm -f "$OVL_CSV"
    if [[ -f $tmp/overlap.csv ]]; then cp "$tmp/overlap.csv" "$OVL_CSV"; fi
fi
cp "$tmp/meta" "$META"
emu_down
report
if ((P2P_ONLY)); then
    echo "$PROG: wrote $P2P_CSV, $META and $DOC (p2p only)"
else
    echo "$PROG: wrote $P2P_CSV, $COLL_CSV, $SVG and $DOC"
fi
