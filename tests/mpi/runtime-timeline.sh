#!/bin/sh
# The timeline of a short 2-rank training run (test_runtime train, schedule dear, DEAR_TIMELINE
# with %r) is one file per rank that parses as JSON and holds the events the runtime promises:
# forward and backward spans per layer, each collective with phase, bucket, bytes and
# algorithm, and the waits in forward_begin. DEAR_STATS=1 makes rank 0 print its counters.
# A second run with DEAR_INFLIGHT_BYTES=1 must run its collectives one at a time.
set -u
: "${top_builddir:=.}" "${top_srcdir:=.}"
. "$top_srcdir/tests/mpi-launch.sh"
exe=$top_builddir/tests/mpi/test_runtime
[ -x "$exe" ] || { echo "runtime-timeline.sh: $exe not built" >&2; exit 99; }
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: skipped"; exit 77; }
dir=$(mktemp -d /tmp/dear-tl.XXXXXX) || exit 99
trap 'rm -rf "$dir"' EXIT
mpi_run 120 2 DEAR_SCHEDULE=dear DEAR_FUSION=threshold DEAR_FUSION_THRESHOLD=100000 \
    "DEAR_TIMELINE=$dir/tl-%r.json" DEAR_STATS=1 "$exe" train >"$dir/out" 2>&1 || { cat "$dir/out"; exit 1; }
cat "$dir/out"
# DEAR_INFLIGHT_BYTES=1: every collective is larger than the window, so each runs alone: no two
# collective spans of a rank overlap (by default the 100 kB buckets do).
mpi_run 120 2 DEAR_SCHEDULE=dear DEAR_FUSION=threshold DEAR_FUSION_THRESHOLD=100000 \
    "DEAR_TIMELINE=$dir/one-%r.json" DEAR_INFLIGHT_BYTES=1 "$exe" train >"$dir/out1" 2>&1 ||
    { cat "$dir/out1"; exit 1; }
# DEAR_STATS=1: rank 0 (only) prints its counters at finalize
[ "$(grep -c 'stats: 4 iterations, median iteration .* busbw .* progress thread CPU' "$dir/out")" = 1 ] ||
    { echo "runtime-timeline.sh: no DEAR_STATS line from rank 0" >&2; exit 1; }
python3 - "$dir" <<'PYEOF'
import json, sys
d = sys.argv[1]
def spans_of(path):
    with open(path) as f:
        doc = json.load(f)
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in ev if e.get("ph") == "X"]
for r in (0, 1):
    comm = sorted((e for e in spans_of(f"{d}/one-{r}.json") if e.get("cat") == "comm"), key=lambda e: e["ts"])
    if len(comm) < 8:
        sys.exit(f"rank {r}: only {len(comm)} collectives with DEAR_INFLIGHT_BYTES=1")
    for a, b in zip(comm, comm[1:]):
        if b["ts"] < a["ts"] + a["dur"] - 1e-3:
            sys.exit(f"rank {r}: with DEAR_INFLIGHT_BYTES=1, {b['name']} started at {b['ts']} us while "
                     f"{a['name']} ran until {a['ts'] + a['dur']} us")
    print(f"rank {r}: {len(comm)} collectives, one at a time with DEAR_INFLIGHT_BYTES=1: ok")
for r in (0, 1):
    spans = spans_of(f"{d}/tl-{r}.json")
    names = [e["name"] for e in spans]
    fwd = [n for n in names if n.startswith("forward L")]
    bwd = [n for n in names if n.startswith("backward L")]
    last = [n for n in names if n.startswith("forward+backward L")]
    comm = [e for e in spans if e.get("cat") == "comm"]
    waits = [e for e in spans if e.get("cat") == "wait"]
    phases = {e["args"]["phase"] for e in comm}
    ok = True
    def need(cond, what):
        global ok
        if not cond:
            print(f"rank {r}: {what}", file=sys.stderr)
            ok = False
    # 4 iterations of 40 layers: 39 separate forwards and backwards each, the last layer merged
    need(len(fwd) == 4 * 39, f"{len(fwd)} forward spans, expected {4 * 39}")
    need(len(bwd) == 4 * 39, f"{len(bwd)} backward spans, expected {4 * 39}")
    need(len(last) == 4, f"{len(last)} forward+backward spans, expected 4")
    need(phases == {"reduce_scatter", "allgather"}, f"collective phases {phases}")
    for e in comm:
        a = e["args"]
        need(all(k in a for k in ("bucket", "bytes", "algorithm")) and a["bytes"] > 0, f"collective args {a}")
        need(e["dur"] >= 0, "negative duration")
    rs = [e for e in comm if e["args"]["phase"] == "reduce_scatter"]
    ag = [e for e in comm if e["args"]["phase"] == "allgather"]
    need(len(rs) > 0 and len(rs) % 4 == 0 and len(ag) % 4 == 0 and len(ag) > 0, f"{len(rs)} rs / {len(ag)} ag")
    need(sum(e["args"]["bytes"] for e in rs) == 4 * sum(e["args"]["bytes"] for e in rs[: len(rs) // 4]),
         "reduce-scatter bytes differ between iterations")
    need(all(e["name"].startswith("wait ") for e in waits), "wait names")
    if not ok:
        sys.exit(1)
    print(f"rank {r}: {len(spans)} spans ({len(comm)} collectives, {len(waits)} waits): ok")
PYEOF
