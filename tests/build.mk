# tests for the build itself: the installed library works for an outside program.
TESTS += tests/install.sh
EXTRA_DIST += tests/install.sh tests/install/hello.c
