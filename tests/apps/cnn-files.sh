#!/bin/sh
# Files a training job writes cannot be turned against the user who runs it (often root): a
# device, a FIFO or a symbolic link planted where libdear or dear-cnn writes (calibration cache,
# timeline, plan, profile, checkpoint) is refused with a message naming it, and left as it was;
# nothing blocks on a FIFO; a link planted at the old predictable temporary name of the checkpoint
# is never followed.
. "${top_srcdir:-.}/tests/apps/cnn-lib.sh"
NP=2
RUN="$SMALL --iters 3"
D=$WORK/shared
mkdir -m 1777 "$D"
echo precious >"$WORK/victim"
fails=0
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
intact() { [ "$(cat "$WORK/victim")" = precious ] || bad "$1: the link's target was written"; }

# refused NAME PATTERN ENV... -- ARGS...: the run fails, its output matches PATTERN.
refused() {
    name=$1 pat=$2
    shift 2
    (
        while [ "$1" != -- ]; do export "${1?}"; shift; done
        shift
        CNN_TIMEOUT=60
        # shellcheck disable=SC2086
        cnn_run $NP $RUN "$@"
    ) >"$WORK/$name.log" 2>&1
    rc=$?
    [ $rc -eq 124 ] && bad "$name: hung (timed out)"
    [ $rc -ne 0 ] || { cat "$WORK/$name.log" >&2; bad "$name: exited 0"; }
    grep -q "$pat" "$WORK/$name.log" || { cat "$WORK/$name.log" >&2; bad "$name: no message matching '$pat'"; }
}

# 1. A character device as the calibration cache: refused, still a device.
if mknod -m 666 "$D/n" c 1 3 2>/dev/null; then
    refused calib-dev "calibration file (DEAR_CALIBRATION_FILE) .*/n is a character device; refused" \
        DEAR_CALIBRATION_FILE="$D/n" DEAR_FUSION=dp -- --schedule dear
    [ -c "$D/n" ] || bad "calib-dev: the device node was replaced"
else
    echo "note: mknod not permitted here; the device case is covered by tests/unit/test_fileio"
fi

# 2. A FIFO as the plan file, the calibration cache, the timeline: refused at once.
mkfifo "$D/fifo"
refused plan-fifo "fifo is a FIFO; refused" DEAR_PLAN_FILE="$D/fifo" -- --schedule dear
refused calib-fifo "fifo is a FIFO; refused" DEAR_CALIBRATION_FILE="$D/fifo" DEAR_FUSION=dp -- --schedule dear
refused tl-fifo "fifo is a FIFO; refused" DEAR_TIMELINE="$D/fifo" -- --schedule dear
[ -p "$D/fifo" ] || bad "the FIFO was replaced"

# 3. Links planted where the job writes: the timeline of rank 0, the profile, the checkpoint.
ln -s "$WORK/victim" "$D/t-0.json"
refused tl-link "t-0.json is a symbolic link; refused" DEAR_TIMELINE="$D/t-%r.json" -- --schedule dear
intact timeline
ln -s "$WORK/victim" "$D/p.prof"
refused prof-link "p.prof is a symbolic link; refused" -- --profile-out "$D/p.prof"
intact profile
ln -s "$WORK/victim" "$D/c.ckpt"
refused ckpt-link "c.ckpt is a symbolic link; refused" -- --ckpt "$D/c.ckpt" --ckpt-every 2
intact checkpoint

# 4. A link at the old predictable temporary name is never followed: the checkpoint is written.
ln -s "$WORK/victim" "$D/d.ckpt.tmp"
cnn_run $NP $RUN --ckpt "$D/d.ckpt" --ckpt-every 2 >"$WORK/tmp-link.log" 2>&1 ||
    { cat "$WORK/tmp-link.log" >&2; bad "checkpoint beside a planted .tmp link: run failed"; }
[ -f "$D/d.ckpt" ] && [ ! -L "$D/d.ckpt" ] || bad "checkpoint beside a planted .tmp link: not written"
intact "planted .tmp link"
[ $fails -eq 0 ]
