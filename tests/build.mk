# tests for the build itself: the installed library works for an outside program.
SH_TESTS += tests/install.sh
EXTRA_DIST += tests/install/hello.c
