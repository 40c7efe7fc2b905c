/* A deliberate race on a user buffer through MPI, for the helgrind run of runtime-valgrind.sh:
 * the suppressions of tests/mpi/helgrind-runtime.supp must leave it reported. On rank 0 the main
 * thread writes the buffer (planted_write) while a second thread, with no synchronisation
 * between them, sends it; Open MPI reads it in its copy to the peer, so the report's stack holds
 * Open MPI frames below the copy, which a suppression keyed on "Open MPI anywhere in the stack"
 * would hide. Rank 1 receives. Exit status 0; helgrind's --error-exitcode says whether it saw
 * the race. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#define COUNT 256

static int buf[COUNT];

static void pause_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* The sender starts before the planted write and sends after it, ordered only by time. */
static void *sender(void *arg)
{
    (void)arg;
    pause_ms(500);
    MPI_Send(buf, COUNT, MPI_INT, 1, 7, MPI_COMM_WORLD);
    return NULL;
}

/* Not inlined, so that the report names it. */
__attribute__((noinline)) static void planted_write(int *p, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = i + 1;
}

int main(int argc, char **argv)
{
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (provided < MPI_THREAD_MULTIPLE || size != 2) {
        if (rank == 0)
            fprintf(stderr, "helgrind_race: needs 2 ranks and MPI_THREAD_MULTIPLE (got %d ranks)\n", size);
        MPI_Finalize();
        return 2;
    }
    if (rank == 0) {
        pthread_t th;
        pthread_create(&th, NULL, sender, NULL);
        planted_write(buf, COUNT);
        pthread_join(th, NULL);
    } else {
        MPI_Recv(buf, COUNT, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Finalize();
    return 0;
}
