/* Timeline: Chrome trace JSON (Perfetto and chrome://tracing open it), one file per rank.
 * Every record is followed by the closing "]}" and the write position steps back over it, so
 * the file is valid JSON after each record even if the process dies (Horovod's trick).
 * Times are dear_now() seconds; the file stores microseconds since the timeline opened.
 * Thread-safe: the application thread and the progress thread both record. */
#ifndef DEAR_TIMELINE_H
#define DEAR_TIMELINE_H

#include <stddef.h>

typedef struct dear_timeline dear_timeline_t;

/* Lanes (trace "tid"): one per kind of activity, so Perfetto draws them as separate rows. */
enum { DEAR_LANE_COMPUTE = 0, DEAR_LANE_WAIT = 1, DEAR_LANE_COMM = 2 };

/* Open path (every "%r" replaced by rank) for writing. Once the file would grow past max_bytes
 * (0: no cap) a last record says the timeline stopped there, and the rest is dropped. *tl is
 * set only on success. */
int dear_timeline_open(const char *path, int rank, size_t max_bytes, dear_timeline_t **tl);
/* A complete event ("ph":"X") from t_begin to t_end. args_json: the members of the "args"
 * object without braces (e.g. "\"bucket\":3,\"bytes\":4096"), or NULL. */
void dear_timeline_span(dear_timeline_t *tl, const char *name, const char *cat, int lane,
                        double t_begin, double t_end, const char *args_json);
/* An instant event ("ph":"i"). */
void dear_timeline_instant(dear_timeline_t *tl, const char *name, const char *cat, int lane,
                           double t, const char *args_json);
/* Escape src as the body of a JSON string (quotes, backslashes, control characters; invalid
 * UTF-8 becomes U+FFFD) into dst of dstlen bytes, always NUL-terminated, truncated at a
 * character boundary. Returns the length written. For string values in args_json. */
size_t dear_timeline_escape(char *dst, size_t dstlen, const char *src);
/* Close the file (it is valid JSON either way). NULL is accepted. */
void dear_timeline_close(dear_timeline_t *tl);

#endif
