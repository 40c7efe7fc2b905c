/* An outside program built only from the installed dear.h and `pkg-config --cflags --libs dear`:
 * proves the installed library, header and dear.pc work for users. It registers one tensor,
 * runs three iterations of the default schedule and checks the averaged gradient. */
#include <dear.h>
#include <mpi.h>
#include <stdio.h>

static int updates;

static int update(const dear_update_info_t *u)
{
    if (u->iteration != updates) /* the iteration the gradient belongs to */
        return 1;
    updates++;
    return 0;
}

int main(int argc, char **argv)
{
    int provided, rank, size, rc;
    float grad[7];
    dear_ctx_t *ctx = NULL;

    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rc = dear_init(MPI_COMM_WORLD, &ctx);
    if (rc == DEAR_OK)
        rc = dear_register(ctx, "w", 0, grad, 7, DEAR_FLOAT32, DEAR_MEM_HOST, update, NULL);
    if (rc == DEAR_OK)
        rc = dear_commit(ctx);
    for (int it = 0; it < 3 && rc == DEAR_OK; it++) {
        rc = dear_forward_begin(ctx, 0);
        for (int i = 0; i < 7; i++)
            grad[i] = (float)(rank + i);
        if (rc == DEAR_OK)
            rc = dear_backward_done(ctx, 0);
        if (rc == DEAR_OK)
            rc = dear_backward_end(ctx);
    }
    if (rc == DEAR_OK)
        rc = dear_flush(ctx);
    /* mean over ranks of (rank + i) = (size - 1) / 2 + i */
    for (int i = 0; i < 7 && rc == DEAR_OK; i++)
        if (grad[i] != (float)(size - 1) / 2.0f + (float)i) {
            fprintf(stderr, "hello: grad[%d] = %g, expected %g\n", i, grad[i], (size - 1) / 2.0 + i);
            rc = DEAR_ERR_INTERNAL;
        }
    if (rc == DEAR_OK && updates != 3) {
        fprintf(stderr, "hello: %d updates, expected 3\n", updates);
        rc = DEAR_ERR_INTERNAL;
    }
    int frc = dear_finalize(&ctx);
    if (rc == DEAR_OK)
        rc = frc;
    if (rank == 0)
        printf("hello: dear %s on %d ranks: %s\n", dear_version(), size, dear_status_string(rc));
    MPI_Finalize();
    return rc == DEAR_OK ? 0 : 1;
}
