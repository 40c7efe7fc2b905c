# shellcheck shell=sh disable=SC2034
# tests/apps/emucluster-lib.sh: shared by the tests on the emulated cluster (sourced, not run,
# after setting TEST to the script's name). skip (77) and fail; emu_require checks what
# bench/emucluster needs and skips where it is missing; emu_unique names a cluster of this run
# alone (its own host prefix and bridge from the process id, a subnet no other cluster holds),
# so a test never touches a cluster someone brought up with the defaults.
: "${top_srcdir:=.}"
: "${top_builddir:=.}"
EMU=$top_srcdir/bench/emucluster

skip() { echo "$TEST: SKIP: $*"; exit 77; }
fail() { echo "$TEST: FAIL: $*"; exit 1; }

# Root, Open MPI (bench/emucluster starts the remote ranks through its launcher agent,
# plm_rsh_agent), the tools, and namespaces, veth pairs across them and tbf that work here.
emu_require() {
    [ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
    [ "${MPI_FLAVOUR:-}" = openmpi ] ||
        skip "bench/emucluster launches through Open MPI's plm_rsh_agent, this build uses ${MPI_FLAVOUR:-another MPI}"
    for t in ip tc unshare "${MPIRUN:-mpirun}" bash; do
        command -v "$t" >/dev/null 2>&1 || skip "'$t' not found"
    done
    probe=emuprobe$(( $$ % 100000 ))
    ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces (no CAP_SYS_ADMIN/CAP_NET_ADMIN?)"
    ok=1
    ip link add "ep$probe" type veth peer name "eq$probe" netns "$probe" 2>/dev/null || ok=0
    if [ $ok -eq 1 ]; then
        tc qdisc add dev "ep$probe" root tbf rate 100mbit burst 67000 latency 50ms 2>/dev/null || ok=2
        ip link del "ep$probe" 2>/dev/null
    fi
    ip netns del "$probe" 2>/dev/null
    [ $ok -eq 0 ] && skip "cannot create veth pairs across namespaces"
    [ $ok -eq 2 ] && skip "tc cannot attach a tbf qdisc (sch_tbf missing?)"
    return 0
}

# emu_unique LETTER: hosts LETTER<id>h1.. (id from the process id); bench/emucluster up claims
# a free 10.214.x under a lock, so tests running at once never share a subnet.
emu_unique() {
    id=$(( $$ % 100000 ))
    EMU_PREFIX=$1${id}h
    EMU_SUBNET=auto
    EMU_BUILDDIR=$top_builddir
    export EMU_PREFIX EMU_SUBNET EMU_BUILDDIR
}
