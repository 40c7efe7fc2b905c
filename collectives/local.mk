# collectives/: non-blocking reduce-scatter / all-gather / all-reduce state machines.
# The reduction kernels are a separate convenience library so they alone get -O3 and the
# dynamic vectorisation cost model (explicit -f flags survive a later user -O2 in CFLAGS).
noinst_LTLIBRARIES += collectives/libdearcoll.la collectives/libdearreduce.la
collectives_libdearreduce_la_SOURCES = collectives/reduce.c collectives/reduce.h collectives/elem.h
collectives_libdearreduce_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS) -O3 -ftree-loop-vectorize \
    -fvect-cost-model=dynamic
collectives_libdearcoll_la_SOURCES = collectives/coll.h collectives/coll_impl.h \
    collectives/coll_common.c collectives/coll.c collectives/coll_mpi.c collectives/coll_ring.c \
    collectives/coll_rhd.c collectives/coll_direct.c collectives/coll_hier.c collectives/coll_topo.c \
    collectives/coll_sparse.c collectives/coll_native.c collectives/mem.h collectives/mem_host.c collectives/net.h \
    collectives/net.c collectives/net_mpi.c collectives/net_sock.c collectives/sock.h collectives/sock.c \
    collectives/sock_auth.h collectives/sock_auth.c collectives/sock_shm.h collectives/sock_shm.c
collectives_libdearcoll_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS) $(NETTLE_CFLAGS)
collectives_libdearcoll_la_LIBADD = collectives/libdearreduce.la
