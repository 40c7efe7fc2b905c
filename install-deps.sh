#!/bin/sh
# Install what building, testing and running dear needs on Debian 12 (or a derivative).
# Idempotent; uses sudo when not run as root.
set -e
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
PKGS="build-essential autoconf automake libtool pkg-config
      libopenmpi-dev openmpi-bin libhwloc-dev hwloc check libsubunit-dev zlib1g-dev libopenblas-dev
      dataset-fashion-mnist fortunes iproute2 python3 valgrind"
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
echo "install-deps.sh: all build and test dependencies are installed"
