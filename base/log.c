/* Logging implementation: one formatted line per call, written with a single fputs under a
 * mutex so lines from the progress thread and the application thread never interleave. */
#include "base/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/sync.h"
#include "include/dear_types.h"

static dear_log_level_t log_level = DEAR_LOG_WARN;
static int log_rank = -1;
static void (*log_sink)(const char *, void *);
static void *log_sink_arg;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = { "error", "warn", "info", "debug" };

/* The error lines logged since dear_last_error last read them (every thread: an error seen by
 * the progress thread surfaces as a failed call on the application thread), whatever the level
 * filter; the oldest are kept when it fills, since the first error is the one with context. */
static char last_errors[4096];
static size_t last_errors_len;

void dear_log_set_level(dear_log_level_t level) { log_level = level; }
dear_log_level_t dear_log_get_level(void) { return log_level; }
void dear_log_set_rank(int rank) { log_rank = rank; }

void dear_log_set_sink(void (*sink)(const char *line, void *arg), void *arg)
{
    dear_lock(&log_lock);
    log_sink = sink;
    log_sink_arg = arg;
    dear_unlock(&log_lock);
}

void dear_log_write(dear_log_level_t level, const char *subsys, const char *fmt, ...)
{
    char line[2048];
    int n;
    va_list ap;

    if (level > log_level && level != DEAR_LOG_ERROR)
        return;
    if (log_rank >= 0)
        n = snprintf(line, sizeof line, "[dear %d] %s %s: ", log_rank, level_names[level], subsys);
    else
        n = snprintf(line, sizeof line, "[dear ?] %s %s: ", level_names[level], subsys);
    if (n < 0 || (size_t)n >= sizeof line)
        n = 0;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len] = '\n';
        line[len + 1] = '\0';
    } else {
        line[sizeof line - 2] = '\n';
    }
    dear_lock(&log_lock);
    if (level == DEAR_LOG_ERROR) {
        size_t room = sizeof last_errors - 1 - last_errors_len, add = strlen(line);
        memcpy(last_errors + last_errors_len, line, add < room ? add : room);
        last_errors_len += add < room ? add : room;
        last_errors[last_errors_len] = '\0';
    }
    if (level <= log_level) {
        if (log_sink)
            log_sink(line, log_sink_arg);
        else
            fputs(line, stderr);
    }
    dear_unlock(&log_lock);
}

size_t dear_last_error(char *buf, size_t len)
{
    dear_lock(&log_lock);
    size_t n = last_errors_len;
    if (buf && len > 0) {
        size_t c = n < len - 1 ? n : len - 1;
        memcpy(buf, last_errors, c);
        buf[c] = '\0';
    }
    last_errors_len = 0;
    last_errors[0] = '\0';
    dear_unlock(&log_lock);
    return n;
}

/* Straight to stderr: the log's own lock may be the broken one. */
void dear_pthread_fatal(const char *call, int err, const char *file, int line)
{
    fprintf(stderr, "[dear %d] error sys: %s failed: %s (%s:%d); this is a bug in libdear: aborting\n",
            log_rank, call, strerror(err), file, line);
    abort();
}
