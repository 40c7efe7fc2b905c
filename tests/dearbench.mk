# tests for apps/bench/dear-bench: argument and profile errors, every schedule at np 2 and 3 on a
# tiny profile (correctness check and CSV rows), and injected faults that must be detected.
SH_TESTS += tests/apps/dearbench-args.sh tests/apps/dearbench-run.sh tests/apps/dearbench-fault.sh
EXTRA_DIST += tests/apps/dearbench-lib.sh tests/apps/dearbench-tiny.prof
# The end-to-end matrix (needs root and the emulated cluster; not run by make check);
# its report, the judge of the issue's targets, on made-up CSVs with known verdicts.
SH_TESTS += tests/apps/e2e-report.sh
# The compression report's int8 ceilings and int4 rows, on made-up CSVs, against hand figures.
SH_TESTS += tests/apps/compress-report.sh
EXTRA_DIST += bench/compress-report.py bench/compress-perf.sh
# The report of what collectives cost as the runtime runs them, on a made-up cache and CSVs.
SH_TESTS += tests/apps/engine-cost-report.sh
EXTRA_DIST += bench/engine-cost-report.py bench/engine-cost.sh
# The report of predictions against bytes per second, on made-up CSVs and counters.
SH_TESTS += tests/apps/pred-rate-report.sh
EXTRA_DIST += bench/pred-rate-report.py bench/pred-rate.sh
# The report of predictions with and without the model fitted to training, on made-up CSVs.
SH_TESTS += tests/apps/refit-report.sh
EXTRA_DIST += bench/refit-report.py bench/refit.sh
# The simulator's prediction of dear+auto on the emulated cluster, 2 hosts x 2 ranks, within 10%
# of the measured iteration (skips without root, namespaces or tbf).
SH_TESTS += tests/apps/e2e-predict.sh
EXTRA_DIST += bench/e2e-matrix.sh bench/e2e-report.py bench/first-plan.sh bench/bench-lib.sh \
    bench/first-plan-report.py
