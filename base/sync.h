/* Mutexes and condition variables through the check macros. Lock, unlock, signal, broadcast and
 * wait fail only when their object is corrupt or was never initialised: a libdear bug, with no
 * sane way on (the state the lock protects can no longer be trusted), so the failure is printed
 * with the call and its location and the process aborts. Calls that can fail for outside
 * reasons (init, create, join) use DEAR_PTHREAD_CHECK and return a status instead. */
#ifndef DEAR_SYNC_H
#define DEAR_SYNC_H

#include <errno.h>
#include <pthread.h>
#include <time.h>

void dear_pthread_fatal(const char *call, int err, const char *file, int line) __attribute__((noreturn));

#define DEAR_PTHREAD_MUST(call)                                                                \
    do {                                                                                       \
        int dear_pt_err_ = (call);                                                             \
        if (dear_pt_err_ != 0)                                                                 \
            dear_pthread_fatal(#call, dear_pt_err_, __FILE__, __LINE__);                       \
    } while (0)

static inline void dear_lock(pthread_mutex_t *m) { DEAR_PTHREAD_MUST(pthread_mutex_lock(m)); }
static inline void dear_unlock(pthread_mutex_t *m) { DEAR_PTHREAD_MUST(pthread_mutex_unlock(m)); }
static inline void dear_signal(pthread_cond_t *c) { DEAR_PTHREAD_MUST(pthread_cond_signal(c)); }
static inline void dear_broadcast(pthread_cond_t *c) { DEAR_PTHREAD_MUST(pthread_cond_broadcast(c)); }
static inline void dear_wait(pthread_cond_t *c, pthread_mutex_t *m) { DEAR_PTHREAD_MUST(pthread_cond_wait(c, m)); }

/* Wait until the absolute CLOCK_REALTIME time ts; a timeout is a normal return. */
static inline void dear_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *ts)
{
    int err = pthread_cond_timedwait(c, m, ts);
    if (err != 0 && err != ETIMEDOUT)
        dear_pthread_fatal("pthread_cond_timedwait", err, __FILE__, __LINE__);
}

#endif
