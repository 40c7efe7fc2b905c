/*
 * The transports: what carries the collectives' point-to-point messages between ranks.
 * collectives/ implements them (one file each, an ops table of collectives/net.h), the runtime
 * opens the one DEAR_TRANSPORT names, and the tools list them.
 *
 * DEAR_TRANSPORT_TABLE(X) has one row per transport, in the order of dear_transport_id_t:
 *     X(ID, "name", OPS, FLAGS, "help")
 *   OPS    the transport's dear_transport_ops_t (collectives/net.h); only collectives/ expands
 *          this column
 *   FLAGS  DEAR_TRANSPORT_F_*
 * Adding a transport is one file in collectives/ and one row here (docs/HACKING.md).
 */
#ifndef DEAR_TRANSPORT_TABLE_H
#define DEAR_TRANSPORT_TABLE_H

/* DEAR_TRANSPORT=auto takes it when the job spans hosts (the first such row), MPI otherwise:
 * inside one host MPI's shared memory copies less. */
#define DEAR_TRANSPORT_F_ACROSS_HOSTS 0x1

#define DEAR_TRANSPORT_TABLE(X)                                                                \
    X(MPI, "mpi", dear_net_mpi_ops, 0, "MPI point-to-point messages on the context's communicator") \
    X(SOCKET, "socket", dear_net_sock_ops, DEAR_TRANSPORT_F_ACROSS_HOSTS,                      \
      "TCP connections between every pair of ranks; the progress thread sleeps in epoll")

/* DEAR_TRANSPORT_AUTO lets dear_transport_open choose by the hosts the job spans. */
typedef enum {
    DEAR_TRANSPORT_AUTO = 0,
#define DEAR_TRANSPORT_ENUM_(ID, NAME, OPS, FLAGS, HELP) DEAR_TRANSPORT_##ID,
    DEAR_TRANSPORT_TABLE(DEAR_TRANSPORT_ENUM_)
#undef DEAR_TRANSPORT_ENUM_
    DEAR_TRANSPORT_COUNT
} dear_transport_id_t;

/* "auto|mpi|socket": DEAR_TRANSPORT's choices, in enum order. */
#define DEAR_TRANSPORT_CHOICE_(ID, NAME, OPS, FLAGS, HELP) "|" NAME
#define DEAR_TRANSPORT_CHOICES "auto" DEAR_TRANSPORT_TABLE(DEAR_TRANSPORT_CHOICE_)

/* "auto", "mpi", ...; "unknown" out of range. parse returns 0 and sets *t, or -1. */
const char *dear_transport_id_name(dear_transport_id_t t);
int dear_transport_id_parse(const char *name, dear_transport_id_t *t);
unsigned dear_transport_id_flags(dear_transport_id_t t);
const char *dear_transport_id_help(dear_transport_id_t t);

#endif
