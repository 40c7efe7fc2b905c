#!/bin/sh
# The timeline files are valid JSON for Python's json module (a second, independent parser next
# to the one inside test_timeline): every per-record snapshot, the multi-thread file and the files
# of the SIGKILLed writers; and the events carry the names, phases, lanes and arguments written.
# Skips (77) without python3.
set -u
: "${top_builddir:=.}"
command -v python3 >/dev/null 2>&1 || { echo "timeline-json.sh: python3 not found, skipping"; exit 77; }
prog=$top_builddir/tests/unit/test_timeline
[ -x "$prog" ] || { echo "timeline-json.sh: $prog not built" >&2; exit 99; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/dear-timeline-json.XXXXXX") || exit 99
trap 'rm -rf "$dir"' EXIT
TIMELINE_KEEP_DIR=$dir CK_FORK=no "$prog" || { echo "timeline-json.sh: test_timeline failed" >&2; exit 1; }
python3 - "$dir" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
NMETA = 8
LANES = {0: "compute", 1: "wait", 2: "comm"}

def parse(path, text):
    doc = json.loads(text)
    assert set(doc) == {"traceEvents"}, (path, list(doc))
    ev = doc["traceEvents"]
    assert isinstance(ev, list)
    return ev

def load(path):
    with open(path, encoding="utf-8") as f:
        return parse(path, f.read())

def load_killed(path):
    """The killed writer's file. The one documented exception of runtime/timeline.c, a SIGKILL
    inside the write of the record that spans a page boundary, cuts that record there; the file
    is cut back to the record's start, as test_timeline does, and must then be whole. The write
    overwrote the old tail from the record's start: past the tail the file ends at the boundary;
    within it (k = 1..3 bytes written) the tail's last 4 - k bytes remain after them."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return parse(path, data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        in_page = len(data) % 4096
        if 0 < in_page < 4:
            cut = len(data) - 4
            assert data[cut:].startswith(b",\n{"[:4 - in_page]) and data.endswith(b"\n]}\n"[4 - in_page:]), \
                (path, "invalid JSON and not a record cut inside the old tail")
        else:
            assert in_page == 0, (path, "invalid JSON and not cut at a page boundary", len(data))
            cut = data.rfind(b",\n{")
            assert cut > 0 and len(data) - cut < 4096, (path, "invalid JSON and not a cut record")
        print("timeline-json.sh: %s: record cut at a page boundary (%d bytes), checked up to it"
              % (os.path.basename(path), len(data)))
        return parse(path, (data[:cut] + b"\n]}\n").decode("utf-8"))

def check_events(path, ev):
    meta = [e for e in ev if e["ph"] == "M"]
    assert len(meta) == NMETA, (path, len(meta))
    pid = meta[0]["pid"]
    names = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert names == LANES, (path, names)
    pname = [e["args"]["name"] for e in meta if e["name"] == "process_name"]
    assert pname == ["rank %d" % pid], (path, pname)
    for e in ev:
        assert e["pid"] == pid and e["tid"] in LANES, (path, e)
        if e["ph"] == "M":
            continue
        assert e["ph"] in ("X", "i"), (path, e)
        assert isinstance(e["name"], str) and isinstance(e["cat"], str) and e["cat"], (path, e)
        assert isinstance(e["ts"], (int, float)), (path, e)
        if e["ph"] == "X":
            assert e["dur"] >= 0, (path, e)
        else:
            assert e["s"] == "t" and "dur" not in e, (path, e)

# Snapshots taken after every record: event count grows by exactly one each time.
snaps = sorted(glob.glob(os.path.join(d, "snap-*.json")))
assert len(snaps) == 61, len(snaps)
for i, p in enumerate(snaps):
    ev = load(p)
    assert len(ev) == NMETA + i, (p, len(ev))
    check_events(p, ev)

# The last state: names round-trip through escaping (invalid UTF-8 becomes U+FFFD).
ev = load(os.path.join(d, "trace-r7.json"))
check_events("trace-r7", ev)
odd = ["plain", 'quote"d', "back\\slash", "new\nline", "ctl\x02", "utf8 \u00e9t\u00e9", "bad \ufffd byte", ""]
recs = [e for e in ev if e["ph"] != "M"]
assert len(recs) == 60
for i, e in enumerate(recs):
    assert e["name"] == odd[i % len(odd)], (i, e["name"])
    if i % 3 == 0:
        assert e["ph"] == "X" and e["tid"] == 2 and e["cat"] == "comm"
        assert e["args"] == {"bucket": i, "bytes": 4096 * i, "algo": "ring"}, e
        assert abs(e["dur"] - 2500.0) < 0.01
    elif i % 3 == 1:
        assert e["ph"] == "X" and e["tid"] == 0 and "args" not in e and abs(e["dur"] - 1000.0) < 0.01
    else:
        assert e["ph"] == "i" and e["tid"] == 1
        assert ("args" in e) == (i % 2 == 1), e

# Four threads, 400 records each, all present once.
ev = load(os.path.join(d, "threads.json"))
check_events("threads", ev)
got = sorted(e["name"] for e in ev if e["ph"] != "M")
want = sorted("t%d-%d" % (t, i) for t in range(4) for i in range(400))
assert got == want

# Killed writers: a prefix of the records, consecutive, nothing torn.
killed = sorted(glob.glob(os.path.join(d, "killed-*.json")))
assert len(killed) == 4, killed
for p in killed:
    ev = load_killed(p)
    check_events(p, ev)
    recs = [e for e in ev if e["ph"] != "M"]
    assert len(recs) >= 10, (p, len(recs))
    for i, e in enumerate(recs):
        assert e["name"] == 'rec %d "q"' % i and e["args"] == {"seq": i} and e["tid"] == i % 3, (p, i, e)
    print("timeline-json.sh: %s: %d records after SIGKILL, valid" % (os.path.basename(p), len(recs)))
print("timeline-json.sh: %d snapshots and %d other files parsed with python json" % (len(snaps), 2 + len(killed)))
PY
