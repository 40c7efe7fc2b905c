/* The MPI check macros (after NCCL's checks.h): an MPI call that fails is logged with MPI's own
 * error text, the call and its location, and becomes DEAR_ERR_MPI. Kept apart from base/check.h
 * so that the MPI-free layers never include mpi.h. */
#ifndef DEAR_MPI_CHECK_H
#define DEAR_MPI_CHECK_H

#include <mpi.h>

#include "base/check.h"

/* Log an MPI failure with MPI's own error text. */
void dear_log_mpi_error(const char *call, int mpi_rc, const char *file, int line);

#define DEAR_MPI_CHECK(call)                                                                   \
    do {                                                                                       \
        int dear_mpi_rc_ = (call);                                                             \
        if (dear_mpi_rc_ != MPI_SUCCESS) {                                                     \
            dear_log_mpi_error(#call, dear_mpi_rc_, __FILE__, __LINE__);                       \
            return DEAR_ERR_MPI;                                                               \
        }                                                                                      \
    } while (0)

#define DEAR_MPI_CHECK_GOTO(call, rc, label)                                                   \
    do {                                                                                       \
        int dear_mpi_rc_ = (call);                                                             \
        if (dear_mpi_rc_ != MPI_SUCCESS) {                                                     \
            dear_log_mpi_error(#call, dear_mpi_rc_, __FILE__, __LINE__);                       \
            (rc) = DEAR_ERR_MPI;                                                               \
            goto label;                                                                        \
        }                                                                                      \
    } while (0)

/* For a void context (a pthread_once routine): on failure log, set rc to DEAR_ERR_MPI and go on. */
#define DEAR_MPI_CHECK_SET(call, rc)                                                           \
    do {                                                                                       \
        int dear_mpi_rc_ = (call);                                                             \
        if (dear_mpi_rc_ != MPI_SUCCESS) {                                                     \
            dear_log_mpi_error(#call, dear_mpi_rc_, __FILE__, __LINE__);                       \
            (rc) = DEAR_ERR_MPI;                                                               \
        }                                                                                      \
    } while (0)

#endif
