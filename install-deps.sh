#!/bin/sh
# Install what building, testing and running dear needs on Debian 12 (or a derivative).
# Idempotent; uses sudo when not run as root.
set -e
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
PKGS="build-essential autoconf automake libtool pkg-config
      libopenmpi-dev openmpi-bin mpich libmpich-dev libhwloc-dev hwloc nettle-dev check libsubunit-dev zlib1g-dev
      libopenblas-dev
      dataset-fashion-mnist fortunes iproute2 python3 valgrind python3-torch python3-mpi4py"
# MPICH comes for a second test build (.ci/check-mpich) and must not change the default MPI:
# Debian ranks Open MPI first on amd64, not on every architecture, so the MPI alternatives are
# set back to what they were before (Open MPI's where there was none).
mpi_alternatives() {
    update-alternatives --get-selections 2>/dev/null |
        awk '$1 == "mpi" || $1 == "mpirun" || $1 ~ /^mpi-.*-linux-/ { print $1, $3 }'
}
mpi_before=$(mpi_alternatives)
missing=
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "install-deps.sh: installing$missing"
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
mpi_alternatives | while read -r name now; do
    was=$(echo "$mpi_before" | awk -v n="$name" '$1 == n { print $2 }')
    if [ -z "$was" ]; then
        case $name in
        mpi) was=/usr/bin/mpicc.openmpi ;;
        mpirun) was=/usr/bin/mpirun.openmpi ;;
        *) was=/usr/lib/${name#mpi-}/openmpi/include ;;
        esac
    fi
    if [ "$now" != "$was" ] && [ -e "$was" ]; then
        echo "install-deps.sh: alternative $name pointed at $now; set back to $was"
        $SUDO update-alternatives --set "$name" "$was" >/dev/null
    fi
done
echo "install-deps.sh: all build and test dependencies are installed"
