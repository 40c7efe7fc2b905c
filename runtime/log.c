/* Logging implementation: one formatted line per call, written with a single fputs under a
 * mutex so lines from the progress thread and the application thread never interleave. */
#include "runtime/log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static dear_log_level_t log_level = DEAR_LOG_WARN;
static int log_rank = -1;
static void (*log_sink)(const char *, void *);
static void *log_sink_arg;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = { "error", "warn", "info", "debug" };

void dear_log_set_level(dear_log_level_t level) { log_level = level; }
dear_log_level_t dear_log_get_level(void) { return log_level; }
void dear_log_set_rank(int rank) { log_rank = rank; }

void dear_log_set_sink(void (*sink)(const char *line, void *arg), void *arg)
{
    pthread_mutex_lock(&log_lock);
    log_sink = sink;
    log_sink_arg = arg;
    pthread_mutex_unlock(&log_lock);
}

void dear_log_write(dear_log_level_t level, const char *subsys, const char *fmt, ...)
{
    char line[2048];
    int n;
    va_list ap;

    if (level > log_level)
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
    pthread_mutex_lock(&log_lock);
    if (log_sink)
        log_sink(line, log_sink_arg);
    else
        fputs(line, stderr);
    pthread_mutex_unlock(&log_lock);
}
