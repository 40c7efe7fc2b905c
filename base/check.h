/* Check macros, after NCCL's checks.h: every call that can fail is handled in one line. The
 * place that first sees a foreign error (pthread, allocation; MPI in base/mpi_check.h) logs it
 * with the call text and location and translates it to a dear_status_t; callers above only pass
 * the code up. MPI-free: fusion/ uses it too. */
#ifndef DEAR_CHECK_H
#define DEAR_CHECK_H

#include <string.h>

#include "base/log.h"
#include "include/dear_types.h"

/* Pass a dear status up. */
#define DEAR_CHECK(call)                                                                       \
    do {                                                                                       \
        int dear_rc_ = (call);                                                                 \
        if (dear_rc_ != DEAR_OK)                                                               \
            return dear_rc_;                                                                   \
    } while (0)

#define DEAR_CHECK_GOTO(call, rc, label)                                                       \
    do {                                                                                       \
        (rc) = (call);                                                                         \
        if ((rc) != DEAR_OK)                                                                   \
            goto label;                                                                        \
    } while (0)

#define DEAR_PTHREAD_CHECK(call)                                                               \
    do {                                                                                       \
        int dear_pt_rc_ = (call);                                                              \
        if (dear_pt_rc_ != 0) {                                                                \
            DEAR_ERROR("sys", "%s failed: %s (%s:%d)", #call, strerror(dear_pt_rc_), __FILE__, \
                       __LINE__);                                                              \
            return DEAR_ERR_INTERNAL;                                                          \
        }                                                                                      \
    } while (0)

#define DEAR_PTHREAD_CHECK_GOTO(call, rc, label)                                               \
    do {                                                                                       \
        int dear_pt_rc_ = (call);                                                              \
        if (dear_pt_rc_ != 0) {                                                                \
            DEAR_ERROR("sys", "%s failed: %s (%s:%d)", #call, strerror(dear_pt_rc_), __FILE__, \
                       __LINE__);                                                              \
            (rc) = DEAR_ERR_INTERNAL;                                                          \
            goto label;                                                                        \
        }                                                                                      \
    } while (0)

/* ptr = expression; on NULL log the size wanted and return DEAR_ERR_NOMEM. */
#define DEAR_ALLOC_CHECK(ptr, expr, bytes)                                                     \
    do {                                                                                       \
        (ptr) = (expr);                                                                        \
        if ((ptr) == NULL && (bytes) > 0) {                                                    \
            DEAR_ERROR("sys", "allocation of %zu bytes failed (%s:%d)", (size_t)(bytes),       \
                       __FILE__, __LINE__);                                                    \
            return DEAR_ERR_NOMEM;                                                             \
        }                                                                                      \
    } while (0)

/* ptr = expression; on NULL log the size wanted and go to label with DEAR_ERR_NOMEM. */
#define DEAR_ALLOC_GOTO(ptr, expr, bytes, rc, label)                                           \
    do {                                                                                       \
        (ptr) = (expr);                                                                        \
        if ((ptr) == NULL && (bytes) > 0) {                                                    \
            DEAR_ERROR("sys", "allocation of %zu bytes failed (%s:%d)", (size_t)(bytes),       \
                       __FILE__, __LINE__);                                                    \
            (rc) = DEAR_ERR_NOMEM;                                                             \
            goto label;                                                                        \
        }                                                                                      \
    } while (0)

#define DEAR_ARG_CHECK(cond, ...)                                                              \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            DEAR_ERROR("api", __VA_ARGS__);                                                    \
            return DEAR_ERR_ARG;                                                               \
        }                                                                                      \
    } while (0)

#endif
