/* Timeline writer: Chrome trace JSON ({"traceEvents":[...]}) that Perfetto and chrome://tracing
 * open. The file must stay valid JSON whenever it is read, including after a crash or a
 * SIGKILL, so every record is written as ",\n{...}\n]}\n" in ONE pwrite() at the offset where
 * the previous record's closing "\n]}\n" began; the next record overwrites that tail, and a
 * reader sees either the old valid file or the new valid file. The one exception: Linux checks
 * for a fatal signal between the pages a write copies, so a SIGKILL landing inside the write of
 * the one record per 4 KiB that spans two pages can leave that record cut (invalid JSON; seen
 * once in dozens of test_killed_child runs). No order of writes to one file closes that window:
 * the tail must move from one page to the next. The cost is one system call per record (about
 * a microsecond or two; no fsync), paid only when DEAR_TIMELINE is set.
 *
 * Both the application thread and the progress thread record, so records are serialised by a
 * mutex; the record is formatted into a buffer owned by the timeline under that mutex. Times
 * arrive as dear_now() seconds and are stored as microseconds since the timeline opened. A
 * write failure (disk full) is reported once as a warning and turns the timeline off: tracing
 * must never fail the training run. */
#include "runtime/timeline.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "include/dear.h"
#include "base/check.h"
#include "base/fileio.h"
#include "base/sync.h"
#include "base/log.h"
#include "base/util.h"

/* Written after every record and overwritten by the next one. */
static const char tail[] = "\n]}\n";
#define TAIL_LEN (sizeof tail - 1)

struct dear_timeline {
    int fd;
    int rank;
    double t0;              /* dear_now() at open: ts 0 */
    off_t pos;              /* where the current tail begins */
    int failed;             /* a write failed, or the size cap was reached: the timeline is off */
    size_t max_bytes;       /* DEAR_TIMELINE_MAX: the file stays within this; 0: no cap */
    char *buf;              /* record being formatted (under lock) */
    size_t len, cap;
    char path[4096];
    pthread_mutex_t lock;
};

static const char *const lane_names[] = { "compute", "wait", "comm" };

/* Grow buf to hold at least extra more bytes plus a NUL; 0 on success. */
static int buf_reserve(dear_timeline_t *tl, size_t extra)
{
    if (tl->len + extra + 1 <= tl->cap)
        return 0;
    size_t cap = tl->cap ? tl->cap : 1024;
    while (cap < tl->len + extra + 1)
        cap *= 2;
    char *p = realloc(tl->buf, cap);
    if (p == NULL)
        return -1;
    tl->buf = p;
    tl->cap = cap;
    return 0;
}

static int buf_append(dear_timeline_t *tl, const char *s, size_t n)
{
    if (buf_reserve(tl, n) != 0)
        return -1;
    memcpy(tl->buf + tl->len, s, n);
    tl->len += n;
    tl->buf[tl->len] = '\0';
    return 0;
}

static int buf_printf(dear_timeline_t *tl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int buf_printf(dear_timeline_t *tl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || buf_reserve(tl, (size_t)n) != 0)
        return -1;
    va_start(ap, fmt);
    vsnprintf(tl->buf + tl->len, tl->cap - tl->len, fmt, ap);
    va_end(ap);
    tl->len += (size_t)n;
    return 0;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if the bytes there are not one. JSON
 * readers (Python's json, Perfetto) reject invalid UTF-8, and names come from the application. */
static size_t utf8_seq_len(const unsigned char *s)
{
    size_t n;
    unsigned min;
    unsigned cp;
    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xE0) == 0xC0) { n = 2; cp = s[0] & 0x1F; min = 0x80; }
    else if ((s[0] & 0xF0) == 0xE0) { n = 3; cp = s[0] & 0x0F; min = 0x800; }
    else if ((s[0] & 0xF8) == 0xF0) { n = 4; cp = s[0] & 0x07; min = 0x10000; }
    else return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

size_t dear_timeline_escape(char *dst, size_t dstlen, const char *src)
{
    size_t out = 0;
    const unsigned char *s = (const unsigned char *)(src ? src : "");

    /* Emit one piece only if it fits whole, so the result never ends in half an escape. */
#define EMIT(piece, n)                                                                         \
    do {                                                                                       \
        if (out + (n) + 1 > dstlen)                                                            \
            goto done;                                                                         \
        memcpy(dst + out, (piece), (n));                                                       \
        out += (n);                                                                            \
    } while (0)

    if (dstlen == 0)
        return 0;
    while (*s) {
        char esc[8];
        size_t n;
        switch (*s) {
        case '"': EMIT("\\\"", 2); s++; continue;
        case '\\': EMIT("\\\\", 2); s++; continue;
        case '\n': EMIT("\\n", 2); s++; continue;
        case '\r': EMIT("\\r", 2); s++; continue;
        case '\t': EMIT("\\t", 2); s++; continue;
        default: break;
        }
        if (*s < 0x20 || *s == 0x7F) {
            snprintf(esc, sizeof esc, "\\u%04x", *s);
            EMIT(esc, 6);
            s++;
        } else if ((n = utf8_seq_len(s)) > 0) {
            EMIT(s, n);
            s += n;
        } else {
            EMIT("\\ufffd", 6);     /* invalid byte: the replacement character */
            s++;
        }
    }
done:
    dst[out] = '\0';
#undef EMIT
    return out;
}

/* Append src as a JSON string body (no quotes), escaped. */
static int buf_escape(dear_timeline_t *tl, const char *src)
{
    /* Worst case 6 output bytes per input byte. */
    size_t need = 6 * strlen(src ? src : "") + 1;
    if (buf_reserve(tl, need) != 0)
        return -1;
    tl->len += dear_timeline_escape(tl->buf + tl->len, tl->cap - tl->len, src);
    return 0;
}

/* Write tl->buf + tail at tl->pos in one call; advance pos past the record. Under lock.
 * Returns 0, or the errno of a failed write (the timeline is then off). */
static int flush_record(dear_timeline_t *tl)
{
    size_t rec = tl->len;
    if (buf_append(tl, tail, TAIL_LEN) != 0) {
        DEAR_WARN("timeline", "out of memory formatting a record for %s; timeline stopped", tl->path);
        tl->failed = 1;
        return ENOMEM;
    }
    size_t done = 0;
    while (done < tl->len) {
        ssize_t n = pwrite(tl->fd, tl->buf + done, tl->len - done, tl->pos + (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = n < 0 ? errno : ENOSPC;
            /* Part of this record may have replaced the tail: put the tail back where the record
             * began and cut the file there, so it ends valid after the last complete record. */
            if (done > 0 && (pwrite(tl->fd, tail, TAIL_LEN, tl->pos) != (ssize_t)TAIL_LEN ||
                             ftruncate(tl->fd, tl->pos + (off_t)TAIL_LEN) != 0))
                DEAR_WARN("timeline", "could not restore the end of %s: the file may be truncated JSON", tl->path);
            DEAR_WARN("timeline", "writing %s failed (%s); timeline stopped, the file holds every record "
                      "before this one", tl->path, strerror(err));
            tl->failed = 1;
            return err;
        }
        done += (size_t)n;
    }
    tl->pos += (off_t)rec;
    return 0;
}

/* Replace every "%r" in path by rank. */
static int expand_path(const char *path, int rank, char *out, size_t outlen)
{
    size_t o = 0;
    for (const char *p = path; *p; p++) {
        char piece[24];
        size_t n;
        if (p[0] == '%' && p[1] == 'r') {
            n = (size_t)snprintf(piece, sizeof piece, "%d", rank);
            p++;
        } else {
            piece[0] = *p;
            n = 1;
        }
        if (o + n + 1 > outlen)
            return -1;
        memcpy(out + o, piece, n);
        o += n;
    }
    out[o] = '\0';
    return 0;
}

int dear_timeline_open(const char *path, int rank, size_t max_bytes, dear_timeline_t **tlp)
{
    dear_timeline_t *tl = NULL;
    int rc = DEAR_OK;

    DEAR_ARG_CHECK(path != NULL && path[0] != '\0', "dear_timeline_open: empty path (DEAR_TIMELINE)");
    DEAR_ARG_CHECK(tlp != NULL, "dear_timeline_open: NULL output pointer");
    DEAR_ALLOC_GOTO(tl, calloc(1, sizeof *tl), sizeof *tl, rc, err);
    tl->fd = -1;
    tl->rank = rank;
    tl->max_bytes = max_bytes;
    if (expand_path(path, rank, tl->path, sizeof tl->path) != 0) {
        DEAR_ERROR("timeline", "DEAR_TIMELINE path '%s' is too long once %%r is replaced (at most %zu characters)",
                   path, sizeof tl->path - 1);
        rc = DEAR_ERR_ARG;
        goto err;
    }
    rc = dear_file_create_stream(tl->path, "timeline file (DEAR_TIMELINE)", &tl->fd);
    if (rc != DEAR_OK) {
        tl->fd = -1;
        goto err;
    }
    DEAR_PTHREAD_CHECK_GOTO(pthread_mutex_init(&tl->lock, NULL), rc, err);
    tl->t0 = dear_now();

    /* Header and metadata: the process is the rank, one named thread row per lane. */
    int fmt_failed = buf_printf(tl, "{\"traceEvents\":[\n"
                                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                                "\"args\":{\"name\":\"rank %d\"}},\n"
                                "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                                "\"args\":{\"sort_index\":%d}}",
                                rank, rank, rank, rank);
    for (int lane = 0; lane < 3; lane++)
        fmt_failed |= buf_printf(tl, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                                 "\"args\":{\"name\":\"%s\"}},\n"
                                 "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                                 "\"args\":{\"sort_index\":%d}}",
                                 rank, lane, lane_names[lane], rank, lane, lane);
    if (fmt_failed) {
        DEAR_ERROR("sys", "allocation failed formatting the timeline header");
        rc = DEAR_ERR_NOMEM;
        goto err_mutex;
    }
    int werr = flush_record(tl);
    if (werr != 0) {
        DEAR_ERROR("timeline", "cannot write timeline file '%s': %s", tl->path, strerror(werr));
        rc = DEAR_ERR_IO;
        goto err_mutex;
    }
    DEAR_INFO("timeline", "writing Chrome trace JSON to %s", tl->path);
    *tlp = tl;
    return DEAR_OK;

err_mutex:
    DEAR_PTHREAD_MUST(pthread_mutex_destroy(&tl->lock));
err:
    if (tl) {
        if (tl->fd >= 0)
            close(tl->fd);
        free(tl->buf);
        free(tl);
    }
    return rc;
}

/* Room kept below the cap for the note that says the timeline stopped there. */
#define CAP_NOTE_ROOM 256

/* The size cap is reached: one last record says so, and the timeline stops (the file stays
 * valid JSON). Under lock. */
static void write_cap_note(dear_timeline_t *tl, double t)
{
    tl->len = 0;
    int bad = buf_printf(tl, ",\n{\"name\":\"timeline stopped: DEAR_TIMELINE_MAX (%zu bytes) reached\",\"cat\":\"dear\","
                             "\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":%d,\"tid\":0}",
                         tl->max_bytes, (t - tl->t0) * 1e6, tl->rank);
    if (!bad)
        flush_record(tl);
    tl->failed = 1;
    DEAR_INFO("timeline", "%s reached DEAR_TIMELINE_MAX (%zu bytes): no more records", tl->path, tl->max_bytes);
}

/* Format and write one event. ph is "X" (dur >= 0) or "i" (dur < 0). */
static void record(dear_timeline_t *tl, const char *name, const char *cat, int lane, double t,
                   double dur, const char *args_json)
{
    if (tl == NULL)
        return;
    dear_lock(&tl->lock);
    if (tl->failed)
        goto out;
    tl->len = 0;
    int bad = buf_append(tl, ",\n{\"name\":\"", 11);
    bad |= buf_escape(tl, name ? name : "");
    bad |= buf_append(tl, "\",\"cat\":\"", 9);
    bad |= buf_escape(tl, cat && cat[0] ? cat : "dear");
    if (dur >= 0)
        bad |= buf_printf(tl, "\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f", (t - tl->t0) * 1e6, dur * 1e6);
    else
        bad |= buf_printf(tl, "\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f", (t - tl->t0) * 1e6);
    bad |= buf_printf(tl, ",\"pid\":%d,\"tid\":%d", tl->rank, lane);
    if (args_json && args_json[0])
        bad |= buf_printf(tl, ",\"args\":{%s}", args_json);
    bad |= buf_append(tl, "}", 1);
    if (bad) {
        DEAR_WARN("timeline", "out of memory formatting a record for %s; timeline stopped", tl->path);
        tl->failed = 1;
        goto out;
    }
    if (tl->max_bytes > 0 && (size_t)tl->pos + tl->len + TAIL_LEN + CAP_NOTE_ROOM > tl->max_bytes) {
        write_cap_note(tl, t);
        goto out;
    }
    flush_record(tl);
out:
    dear_unlock(&tl->lock);
}

void dear_timeline_span(dear_timeline_t *tl, const char *name, const char *cat, int lane,
                        double t_begin, double t_end, const char *args_json)
{
    double dur = t_end - t_begin;
    record(tl, name, cat, lane, t_begin, dur > 0 ? dur : 0, args_json);
}

void dear_timeline_instant(dear_timeline_t *tl, const char *name, const char *cat, int lane,
                           double t, const char *args_json)
{
    record(tl, name, cat, lane, t, -1, args_json);
}

void dear_timeline_close(dear_timeline_t *tl)
{
    if (tl == NULL)
        return;
    /* The file already ends with the tail; nothing to finish. */
    if (close(tl->fd) != 0)
        DEAR_WARN("timeline", "closing %s: %s", tl->path, strerror(errno));
    DEAR_PTHREAD_MUST(pthread_mutex_destroy(&tl->lock));
    free(tl->buf);
    free(tl);
}
