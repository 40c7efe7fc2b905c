/*
 * Shared by the MPI test programs, called right after MPI_Init: a test must run on the ranks it
 * asked for. tests/mpi-launch.sh gives every rank MPI_TEST_NP, the rank count it launched; a
 * launcher of another MPI than the one the program was built with starts that many one-rank
 * jobs instead, each of which would pass, so another MPI_COMM_WORLD size fails the test before
 * it runs. Without MPI_TEST_NP (a program started by hand) nothing is checked. Include after
 * <mpi.h>.
 */
#ifndef DEAR_TESTS_NP_CHECK_H
#define DEAR_TESTS_NP_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static inline void np_check(const char *prog)
{
    const char *want = getenv("MPI_TEST_NP");
    char *end;
    int size;
    if (want == NULL)
        return;
    long np = strtol(want, &end, 10);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (*want != '\0' && *end == '\0' && np == size)
        return;
    fprintf(stderr,
            "%s: %d rank(s) in MPI_COMM_WORLD, but the launcher was asked for MPI_TEST_NP=%s: is "
            "MPIRUN the launcher of the MPI this test was built with?\n",
            prog, size, want);
    MPI_Finalize();
    exit(1);
}

#endif
