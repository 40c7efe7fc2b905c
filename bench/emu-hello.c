/* emu-hello: the smallest check that an emulated cluster (bench/emucluster) is wired right.
 * Every rank reports its MPI processor name (the namespace's UTS host name) and the node
 * it shares memory with (MPI_Comm_split_type SHARED); rank 0 prints one line per rank and a
 * summary line the test greps:
 *     emu-hello: ranks=4 hosts=2 nodes=2 names=h1,h2
 * "hosts" counts distinct processor names, "nodes" counts distinct shared-memory
 * communicators; on a correctly launched cluster the two agree. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_LEN MPI_MAX_PROCESSOR_NAME

/* One MPI failure is fatal here: this is a probe program, not library code. */
#define HELLO_MPI(call)                                                       \
    do {                                                                      \
        int rc_ = (call);                                                     \
        if (rc_ != MPI_SUCCESS) {                                             \
            fprintf(stderr, "emu-hello: %s failed (%d)\n", #call, rc_);       \
            MPI_Abort(MPI_COMM_WORLD, 1);                                     \
        }                                                                     \
    } while (0)

int main(int argc, char **argv)
{
    int rank, size, len, node_rank, is_leader, nodes = 0;
    char name[NAME_LEN];
    MPI_Comm node;

    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: mpirun ... emu-hello\n"
               "Prints each rank's processor name and node, then a summary line\n"
               "'emu-hello: ranks=R hosts=H nodes=N names=a,b,...'.\n");
        return 0;
    }
    HELLO_MPI(MPI_Init(&argc, &argv));
    HELLO_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    HELLO_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
    memset(name, 0, sizeof(name));
    HELLO_MPI(MPI_Get_processor_name(name, &len));

    /* Node count the way the runtime's topology code sees it: one leader per shared-memory
     * communicator. */
    HELLO_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    HELLO_MPI(MPI_Comm_rank(node, &node_rank));
    is_leader = node_rank == 0;
    HELLO_MPI(MPI_Allreduce(&is_leader, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));

    char *all = NULL;
    if (rank == 0) {
        all = calloc((size_t)size, NAME_LEN);
        if (!all) {
            fprintf(stderr, "emu-hello: out of memory\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    HELLO_MPI(MPI_Gather(name, NAME_LEN, MPI_CHAR, all, NAME_LEN, MPI_CHAR, 0, MPI_COMM_WORLD));
    int *node_ranks = rank == 0 ? calloc((size_t)size, sizeof(int)) : NULL;
    if (rank == 0 && !node_ranks) {
        fprintf(stderr, "emu-hello: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    HELLO_MPI(MPI_Gather(&node_rank, 1, MPI_INT, node_ranks, 1, MPI_INT, 0, MPI_COMM_WORLD));

    if (rank == 0) {
        int hosts = 0;
        char names[4096] = "";
        for (int r = 0; r < size; r++) {
            const char *n = all + (size_t)r * NAME_LEN;
            printf("emu-hello: rank %d on %s (local rank %d)\n", r, n, node_ranks[r]);
            int seen = 0;
            for (int q = 0; q < r && !seen; q++)
                seen = !strcmp(n, all + (size_t)q * NAME_LEN);
            if (!seen) {
                if (hosts++ > 0)
                    strncat(names, ",", sizeof(names) - strlen(names) - 1);
                strncat(names, n, sizeof(names) - strlen(names) - 1);
            }
        }
        printf("emu-hello: ranks=%d hosts=%d nodes=%d names=%s\n", size, hosts, nodes, names);
        fflush(stdout);
        free(all);
        free(node_ranks);
    }
    HELLO_MPI(MPI_Comm_free(&node));
    HELLO_MPI(MPI_Finalize());
    return 0;
}
