/*
 * What the collectives' MPI tests (test_coll.c, test_compress.c) share: the communicator they
 * run on (a duplicate of MPI_COMM_WORLD, through the socket transport with --socket), the
 * first failure's message, a verdict agreed over the ranks (so one failing rank cannot leave
 * the others waiting in a collective), a seeded data source and the suite's start and end.
 * Include after <check.h>, <mpi.h> and the library's headers, once per program.
 */
#ifndef DEAR_TESTS_COLL_CHECK_H
#define DEAR_TESTS_COLL_CHECK_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/mpi/np_check.h"

static int g_rank, g_size;
static dear_transport_t *g_tp;  /* --socket: the transport g_comm goes through */
static dear_net_t *g_net;       /* g_comm on it (NULL: MPI) */
static MPI_Comm g_comm;
static char g_first_err[512];

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Combine a local failure flag over all ranks, then assert with the first local message. */
static void assert_all_ok(int local_bad, const char *what)
{
    int any = 0;
    MPI_Allreduce(&local_bad, &any, 1, MPI_INT, MPI_MAX, g_comm);
    if (any && local_bad)
        fprintf(stderr, "[rank %d] %s: %s\n", g_rank, what, g_first_err);
    g_first_err[0] = '\0';
    ck_assert_msg(!any, "%s failed on some rank (see stderr)", what);
}

/* bad, and the first bad one's message kept for assert_all_ok. */
static int note(int bad, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int note(int bad, const char *fmt, ...)
{
    if (bad && g_first_err[0] == '\0') {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g_first_err, sizeof g_first_err, fmt, ap);
        va_end(ap);
    }
    return bad;
}

/* Deterministic pseudo-random value in [-1, 1) from (r, i). */
static double rand_value(int r, size_t i)
{
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)(r + 1) * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (double)(x >> 11) / 4503599627370496.0 - 1.0;
}

/* MPI up, g_comm and the parameters; with socket, g_comm's transport. */
static void coll_test_init(int *argc, char ***argv, int socket)
{
    int provided;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    np_check((*argv)[0]);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_comm);
    MPI_Comm_rank(g_comm, &g_rank);
    MPI_Comm_size(g_comm, &g_size);
    dear_log_set_rank(g_rank);
    if (dear_params_load() != DEAR_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    if (socket && (dear_transport_open(g_comm, DEAR_TRANSPORT_SOCKET, 1, &g_tp) != DEAR_OK ||
                   dear_net_open(g_tp, g_comm, &g_net) != DEAR_OK))
        MPI_Abort(MPI_COMM_WORLD, 2);
}

/* Runs the suite without forking, checks that a socket transport carried messages, finalizes
 * MPI; the exit status, 0 when every rank passed. */
static int coll_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, g_rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (g_tp) {
        /* The tests must really have gone over the sockets. */
        uint64_t msgs = 0, timeouts = 0;
        dear_transport_counters(g_tp, &msgs, &timeouts);
        if (g_rank == 0)
            fprintf(stderr, "socket transport: %llu messages, %llu waits that timed out\n",
                    (unsigned long long)msgs, (unsigned long long)timeouts);
        if (msgs == 0)
            failed++;
        dear_net_close(g_net);
        dear_transport_close(g_tp);
    }
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Comm_free(&g_comm);
    MPI_Finalize();
    return any ? 1 : 0;
}

#endif
