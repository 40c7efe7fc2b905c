/* Logging: rank-prefixed lines on stderr, filtered by DEAR_LOG_LEVEL (error, warn, info,
 * debug). By default only warnings and errors print. The rank is set once by dear_init; before
 * that lines carry "?". Safe to call from any thread. */
#ifndef DEAR_LOG_H
#define DEAR_LOG_H

#include <stdarg.h>

typedef enum { DEAR_LOG_ERROR = 0, DEAR_LOG_WARN = 1, DEAR_LOG_INFO = 2, DEAR_LOG_DEBUG = 3 } dear_log_level_t;

void dear_log_set_level(dear_log_level_t level);
dear_log_level_t dear_log_get_level(void);
void dear_log_set_rank(int rank);
/* Redirect log lines (tests capture them); NULL restores stderr. */
void dear_log_set_sink(void (*sink)(const char *line, void *arg), void *arg);

void dear_log_write(dear_log_level_t level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define DEAR_LOG_ON(level) ((level) <= dear_log_get_level())
#define DEAR_ERROR(subsys, ...) dear_log_write(DEAR_LOG_ERROR, subsys, __VA_ARGS__)
#define DEAR_WARN(subsys, ...) dear_log_write(DEAR_LOG_WARN, subsys, __VA_ARGS__)
#define DEAR_INFO(subsys, ...) \
    do { if (DEAR_LOG_ON(DEAR_LOG_INFO)) dear_log_write(DEAR_LOG_INFO, subsys, __VA_ARGS__); } while (0)
#define DEAR_DEBUG(subsys, ...) \
    do { if (DEAR_LOG_ON(DEAR_LOG_DEBUG)) dear_log_write(DEAR_LOG_DEBUG, subsys, __VA_ARGS__); } while (0)

#endif
