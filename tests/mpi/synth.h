/*
 * Pieces shared by the runtime's MPI tests (test_runtime.c, test_online.c): capture of the
 * library's log lines, the tensor of their synthetic models, the SGD update the runtime calls,
 * and the reference step (a blocking MPI_Allreduce per tensor, then the average) that the
 * runtime's results must equal bit for bit. Each test keeps its own model layout. Include after
 * <check.h> and <mpi.h>.
 */
#ifndef DEAR_TESTS_SYNTH_H
#define DEAR_TESTS_SYNTH_H

#include <string.h>

#include "include/dear.h"
#include "base/log.h"

#define LR 0.125

/* ---- log capture ---- */

static char logbuf[1 << 16];
static size_t loglen;

static inline void sink(const char *line, void *arg)
{
    (void)arg;
    size_t n = strlen(line);
    if (loglen + n + 1 < sizeof logbuf) {
        memcpy(logbuf + loglen, line, n + 1);
        loglen += n;
    }
}

static inline void capture_start(void)
{
    loglen = 0;
    logbuf[0] = '\0';
    dear_log_set_sink(sink, NULL);
}

static inline void capture_stop(void) { dear_log_set_sink(NULL, NULL); }

/* ---- a tensor of the synthetic models ---- */

typedef struct {
    char name[32];
    int layer;
    size_t count;
    dear_dtype_t dtype;
    void *param, *grad;
    long long updates;
} tensor_t;

static inline size_t esize(dear_dtype_t d) { return d == DEAR_FLOAT64 ? 8 : 4; }

static inline void sgd(tensor_t *t, const void *grad)
{
    for (size_t j = 0; j < t->count; j++) {
        if (t->dtype == DEAR_FLOAT64)
            ((double *)t->param)[j] -= LR * ((const double *)grad)[j];
        else
            ((float *)t->param)[j] -= (float)LR * ((const float *)grad)[j];
    }
}

/* The update callback registered for every tensor: it must see its own gradient buffer, name and
 * layer, and the iteration its gradient belongs to, which is the number of updates it had. */
static inline int update_cb(const dear_update_info_t *u)
{
    tensor_t *t = u->arg;
    if (u->size < sizeof *u || u->grad != t->grad || u->count != t->count || u->dtype != t->dtype ||
        strcmp(u->name, t->name) != 0 || u->layer != t->layer || u->iteration != t->updates)
        return 1;
    sgd(t, u->grad);
    t->updates++;
    return 0;
}

/* The reference: t's gradient summed with a blocking MPI_Allreduce, averaged, applied. */
static inline void reference_step(tensor_t *t, int nranks)
{
    MPI_Datatype dt = t->dtype == DEAR_FLOAT64 ? MPI_DOUBLE : MPI_FLOAT;
    ck_assert_int_eq(MPI_Allreduce(MPI_IN_PLACE, t->grad, (int)t->count, dt, MPI_SUM, MPI_COMM_WORLD),
                     MPI_SUCCESS);
    for (size_t j = 0; j < t->count; j++) {
        if (t->dtype == DEAR_FLOAT64)
            ((double *)t->grad)[j] /= nranks;
        else
            ((float *)t->grad)[j] /= (float)nranks;
    }
    sgd(t, t->grad);
}

#endif
