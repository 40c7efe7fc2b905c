# tests for bench/: the emulated cluster end to end (skips without CAP_NET_ADMIN, ip or tc).
TESTS += tests/apps/emucluster.sh
EXTRA_DIST += tests/apps/emucluster.sh
