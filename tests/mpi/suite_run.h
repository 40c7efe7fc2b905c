/*
 * Shared by the MPI test programs whose main only runs one Check suite: MPI up with
 * MPI_THREAD_MULTIPLE on the ranks the test asked for (np_check.h), then the suite on every rank
 * without forking (Check's fork would duplicate an MPI process), printed on rank 0 only, with one
 * verdict agreed over the ranks, so that every rank exits alike and a failure on any rank fails
 * the test. Include after <check.h> and <mpi.h>.
 */
#ifndef DEAR_TESTS_SUITE_RUN_H
#define DEAR_TESTS_SUITE_RUN_H

#include "tests/mpi/np_check.h"

static inline void mpi_suite_init(int *argc, char ***argv, int *rank, int *nranks)
{
    int provided;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    np_check((*argv)[0]);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, nranks);
}

/* DEAR_TEST_TRANSPORT=name (the *-socket.mpi tests, tests/apps/emucluster.sh): the transport
 * (dear_transport) every context the test makes must have taken. Include dear.h first. */
static inline void check_transport(const dear_ctx_t *ctx)
{
    const char *want = getenv("DEAR_TEST_TRANSPORT");
    if (want != NULL && *want != '\0')
        ck_assert_msg(strcmp(dear_transport(ctx), want) == 0, "the context runs on %s, DEAR_TEST_TRANSPORT=%s",
                      dear_transport(ctx), want);
}

/* Finalizes MPI. The exit status of the test program: 0 when every rank passed, else 1. */
static inline int mpi_suite_run(Suite *s, int rank)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}

#endif
