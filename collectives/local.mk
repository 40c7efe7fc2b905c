# collectives/: non-blocking reduce-scatter / all-gather / all-reduce state machines.
noinst_LTLIBRARIES += collectives/libdearcoll.la
collectives_libdearcoll_la_SOURCES = collectives/coll.h collectives/coll_common.c
collectives_libdearcoll_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS)
