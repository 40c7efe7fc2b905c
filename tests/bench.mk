# tests for bench/: the emulated cluster end to end (skips without CAP_NET_ADMIN, ip or tc), dead
# links on it (the socket transport's alone, then a whole host's: the job must fail in seconds,
# naming the peer, and end), and perf-report.py's section for several ranks per host on made-up
# figures; dear-coll-bench's --stream.
SH_TESTS += tests/apps/emucluster.sh tests/apps/emucluster-faults.sh tests/apps/perf-report.sh \
    tests/apps/collbench.sh
EXTRA_DIST += tests/apps/emucluster-lib.sh tests/apps/report-lib.sh
