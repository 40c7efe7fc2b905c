/* Timeline: the file is valid JSON with the expected events after every record, after
 * concurrent records from several threads, and after the writing process is SIGKILLed mid-run.
 * Validity is checked by a strict JSON parser written here (RFC 8259, independent of the
 * writer); tests/unit/timeline-json.sh checks the same files again with Python's json module:
 * set TIMELINE_KEEP_DIR and the files (one snapshot per record) are left there. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "include/dear.h"
#include "base/log.h"
#include "runtime/timeline.h"
#include "base/util.h"
#include "tests/unit/ck_run.h"

/* Metadata records written at open: process name and sort index, name and sort index per lane. */
#define NMETA 8

/* ---- a strict JSON validator ---- */
typedef struct {
    const char *p, *end;
    int depth;
    long top_events;        /* elements of the top-level "traceEvents" array, -1 if absent */
} json_t;

static int j_value(json_t *j);

static void j_ws(json_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int j_lit(json_t *j, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || strncmp(j->p, lit, n) != 0)
        return -1;
    j->p += n;
    return 0;
}

/* A string; if out is given, its raw body (escapes kept) is copied there. */
static int j_string(json_t *j, char *out, size_t outlen)
{
    const char *start;
    if (j->p >= j->end || *j->p != '"')
        return -1;
    start = ++j->p;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p;
        if (c < 0x20)
            return -1;
        if (c == '\\') {
            j->p++;
            if (j->p >= j->end)
                return -1;
            if (*j->p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (j->p + i >= j->end || !strchr("0123456789abcdefABCDEF", j->p[i]) || j->p[i] == '\0')
                        return -1;
                j->p += 4;
            } else if (!strchr("\"\\/bfnrt", *j->p) || *j->p == '\0') {
                return -1;
            }
        }
        j->p++;
    }
    if (j->p >= j->end)
        return -1;
    if (out) {
        size_t n = (size_t)(j->p - start);
        snprintf(out, outlen, "%.*s", (int)(n < outlen ? n : outlen - 1), start);
    }
    j->p++;
    return 0;
}

static int j_number(json_t *j)
{
    const char *s = j->p;
    if (j->p < j->end && *j->p == '-')
        j->p++;
    if (j->p >= j->end)
        return -1;
    if (*j->p == '0') {
        j->p++;
    } else if (*j->p >= '1' && *j->p <= '9') {
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    } else {
        return -1;
    }
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return -1;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return -1;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    return j->p > s ? 0 : -1;
}

static int j_array(json_t *j, long *count)
{
    long n = 0;
    j->p++;
    j_ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
        if (count)
            *count = 0;
        return 0;
    }
    for (;;) {
        if (j_value(j) != 0)
            return -1;
        n++;
        j_ws(j);
        if (j->p >= j->end)
            return -1;
        if (*j->p == ']') {
            j->p++;
            break;
        }
        if (*j->p != ',')
            return -1;
        j->p++;
    }
    if (count)
        *count = n;
    return 0;
}

static int j_object(json_t *j)
{
    int top = j->depth == 1;
    j->p++;
    j_ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char key[64];
        j_ws(j);
        if (j_string(j, key, sizeof key) != 0)
            return -1;
        j_ws(j);
        if (j->p >= j->end || *j->p != ':')
            return -1;
        j->p++;
        j_ws(j);
        if (top && strcmp(key, "traceEvents") == 0 && j->p < j->end && *j->p == '[') {
            j->depth++;
            if (j_array(j, &j->top_events) != 0)
                return -1;
            j->depth--;
        } else if (j_value(j) != 0) {
            return -1;
        }
        j_ws(j);
        if (j->p >= j->end)
            return -1;
        if (*j->p == '}') {
            j->p++;
            return 0;
        }
        if (*j->p != ',')
            return -1;
        j->p++;
    }
}

static int j_value(json_t *j)
{
    int rc;
    j_ws(j);
    if (j->p >= j->end || j->depth > 64)
        return -1;
    j->depth++;
    switch (*j->p) {
    case '{': rc = j_object(j); break;
    case '[': rc = j_array(j, NULL); break;
    case '"': rc = j_string(j, NULL, 0); break;
    case 't': rc = j_lit(j, "true"); break;
    case 'f': rc = j_lit(j, "false"); break;
    case 'n': rc = j_lit(j, "null"); break;
    default: rc = j_number(j); break;
    }
    j->depth--;
    return rc;
}

/* Validate a whole document; returns the number of trace events, or -1 if invalid. */
static long json_trace_events(const char *text, size_t len)
{
    json_t j = { text, text + len, 0, -1 };
    if (j_value(&j) != 0)
        return -1;
    j_ws(&j);
    return j.p == j.end ? j.top_events : -1;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    fclose(f);
    if (buf)
        buf[n < cap ? n : cap - 1] = '\0';
    *len = n;
    return buf;
}

static long file_events(const char *path)
{
    size_t len;
    char *text = slurp(path, &len);
    if (!text)
        return -2;
    long n = json_trace_events(text, len);
    free(text);
    return n;
}

static int count_substr(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

static char dir[512];

static void setup(void)
{
    const char *keep = getenv("TIMELINE_KEEP_DIR");
    if (keep && keep[0]) {
        snprintf(dir, sizeof dir, "%s", keep);
        mkdir(dir, 0755);
    } else {
        snprintf(dir, sizeof dir, "/tmp/dear-test-timeline-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir));
    }
}

static void teardown(void)
{
    if (!getenv("TIMELINE_KEEP_DIR")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
}

static void copy_file(const char *from, const char *to)
{
    size_t len;
    char *text = slurp(from, &len);
    ck_assert_ptr_nonnull(text);
    FILE *f = fopen(to, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(text, 1, len, f), len);
    fclose(f);
    free(text);
}

/* ---- tests ---- */

START_TEST(test_validator_rejects)
{
    /* The validator must be able to fail, or the tests below prove nothing. */
    const char *bad[] = { "", "{", "{\"traceEvents\":[", "{\"traceEvents\":[{}]", "{\"traceEvents\":[{},]}",
                          "{\"a\":\"x\ny\"}", "{\"a\":01}", "{\"a\":\"\\x\"}", "{\"a\":1}}", "[1,2" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(json_trace_events(bad[i], strlen(bad[i])) == -1, "accepted: %s", bad[i]);
    const char *good = "{\"traceEvents\":[{\"a\":[1,-2.5e3,true,null,\"\\u00e9\\\"\"]},{}],\"x\":{}}";
    ck_assert_int_eq(json_trace_events(good, strlen(good)), 2);
}
END_TEST

START_TEST(test_escape)
{
    char out[64];
    ck_assert_int_eq(dear_timeline_escape(out, sizeof out, "a\"b\\c\nd\te\x01\x7f"), 25);
    ck_assert_str_eq(out, "a\\\"b\\\\c\\nd\\te\\u0001\\u007f");
    dear_timeline_escape(out, sizeof out, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");   /* valid UTF-8 kept */
    ck_assert_str_eq(out, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    dear_timeline_escape(out, sizeof out, "x\xff" "y\xc3(\xed\xa0\x80");   /* invalid bytes, a surrogate */
    ck_assert_str_eq(out, "x\\ufffdy\\ufffd(\\ufffd\\ufffd\\ufffd");
    /* Truncation never leaves half an escape: 7 bytes hold "ab" and one 2-byte escape. */
    ck_assert_int_eq(dear_timeline_escape(out, 7, "ab\"\"\"\""), 6);
    ck_assert_str_eq(out, "ab\\\"\\\"");
    ck_assert_int_eq(dear_timeline_escape(out, 6, "ab\"\"\"\""), 4);
    ck_assert_str_eq(out, "ab\\\"");
    ck_assert_int_eq(dear_timeline_escape(out, sizeof out, NULL), 0);
    ck_assert_str_eq(out, "");
}
END_TEST

/* Names the writer must escape, and what they look like once escaped. */
static const char *const odd_names[] = { "plain", "quote\"d", "back\\slash", "new\nline", "ctl\x02",
                                         "utf8 \xc3\xa9t\xc3\xa9", "bad \xff byte", "" };
static const char *const odd_escaped[] = { "plain", "quote\\\"d", "back\\\\slash", "new\\nline", "ctl\\u0002",
                                           "utf8 \xc3\xa9t\xc3\xa9", "bad \\ufffd byte", "" };
#define NODD ((int)(sizeof odd_names / sizeof odd_names[0]))

START_TEST(test_valid_after_every_record)
{
    char pattern[600], path[600], snap[700];
    dear_timeline_t *tl = NULL;
    snprintf(pattern, sizeof pattern, "%s/trace-r%%r.json", dir);
    snprintf(path, sizeof path, "%s/trace-r7.json", dir);
    ck_assert_int_eq(dear_timeline_open(pattern, 7, 0, &tl), DEAR_OK);
    ck_assert_ptr_nonnull(tl);
    ck_assert_int_eq(file_events(path), NMETA);
    snprintf(snap, sizeof snap, "%s/snap-0000.json", dir);
    copy_file(path, snap);

    const int nrec = 60;
    for (int i = 0; i < nrec; i++) {
        double t = dear_now();
        char args[128];
        snprintf(args, sizeof args, "\"bucket\":%d,\"bytes\":%d,\"algo\":\"ring\"", i, 4096 * i);
        const char *name = odd_names[i % NODD];
        if (i % 3 == 0)
            dear_timeline_span(tl, name, "comm", DEAR_LANE_COMM, t, t + 0.0025, args);
        else if (i % 3 == 1)
            dear_timeline_span(tl, name, "compute", DEAR_LANE_COMPUTE, t, t + 0.001, NULL);
        else
            dear_timeline_instant(tl, name, "wait", DEAR_LANE_WAIT, t, i % 2 ? args : "");
        ck_assert_int_eq(file_events(path), NMETA + i + 1);
        snprintf(snap, sizeof snap, "%s/snap-%04d.json", dir, i + 1);
        copy_file(path, snap);
    }
    dear_timeline_close(tl);
    ck_assert_int_eq(file_events(path), NMETA + nrec);

    size_t len;
    char *text = slurp(path, &len);
    ck_assert_ptr_nonnull(text);
    /* Metadata: process named after the rank, the three lanes named. */
    ck_assert(strstr(text, "\"name\":\"process_name\",\"ph\":\"M\",\"pid\":7,\"tid\":0,\"args\":{\"name\":\"rank 7\"}"));
    ck_assert(strstr(text, "\"tid\":0,\"args\":{\"name\":\"compute\"}"));
    ck_assert(strstr(text, "\"tid\":1,\"args\":{\"name\":\"wait\"}"));
    ck_assert(strstr(text, "\"tid\":2,\"args\":{\"name\":\"comm\"}"));
    /* Event kinds and counts: i%3==0 comm spans, ==1 compute spans, ==2 instants. */
    ck_assert_int_eq(count_substr(text, "\"ph\":\"X\""), 40);
    ck_assert_int_eq(count_substr(text, "\"ph\":\"i\",\"s\":\"t\""), 20);
    ck_assert_int_eq(count_substr(text, "\"dur\":2500.000,\"pid\":7,\"tid\":2,\"args\":{\"bucket\":"), 20);
    ck_assert_int_eq(count_substr(text, "\"dur\":1000.000,\"pid\":7,\"tid\":0}"), 20);
    ck_assert(strstr(text, "\"bucket\":33,\"bytes\":135168,\"algo\":\"ring\"}"));
    /* Each odd name appears escaped as expected. */
    for (int k = 0; k < NODD; k++) {
        char want[128];
        snprintf(want, sizeof want, "{\"name\":\"%s\",\"cat\":", odd_escaped[k]);
        ck_assert_msg(count_substr(text, want) >= nrec / NODD, "missing %s", want);
    }
    /* The file ends with the closing brackets and nothing after. */
    ck_assert(len >= 4 && strcmp(text + len - 4, "\n]}\n") == 0);
    free(text);
}
END_TEST

/* A size cap: the file stays within it, valid, every record up to the stop in order, and a last
 * record saying where it stopped. */
START_TEST(test_size_cap)
{
    char path[600];
    dear_timeline_t *tl = NULL;
    const size_t cap = 20000;
    snprintf(path, sizeof path, "%s/cap.json", dir);
    ck_assert_int_eq(dear_timeline_open(path, 0, cap, &tl), DEAR_OK);
    double t = dear_now();
    for (int i = 0; i < 5000; i++) {
        char name[32];
        snprintf(name, sizeof name, "r%d", i);
        dear_timeline_span(tl, name, "c", DEAR_LANE_COMM, t, t + 1e-6, "\"k\":1");
    }
    dear_timeline_close(tl);
    size_t len;
    char *text = slurp(path, &len);
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(len <= cap, "timeline of %zu bytes with a cap of %zu", len, cap);
    long n = json_trace_events(text, len);
    ck_assert_msg(n > NMETA + 100, "only %ld events before the cap", n);
    ck_assert_ptr_nonnull(strstr(text, "timeline stopped: DEAR_TIMELINE_MAX (20000 bytes) reached"));
    char last[32];
    snprintf(last, sizeof last, "\"r%ld\"", n - NMETA - 2); /* the last record kept, before the note */
    ck_assert_msg(strstr(text, last) != NULL, "record %s missing", last);
    free(text);
}
END_TEST

START_TEST(test_timestamps)
{
    char path[600];
    dear_timeline_t *tl = NULL;
    snprintf(path, sizeof path, "%s/ts.json", dir);
    double before = dear_now();
    ck_assert_int_eq(dear_timeline_open(path, 0, 0, &tl), DEAR_OK);
    double after = dear_now();
    /* An event 0.25 s after open: ts is 250000 us after the open instant, give or take the
     * open call itself. A span whose end precedes its start gets duration 0. */
    dear_timeline_span(tl, "late", "c", DEAR_LANE_COMPUTE, after + 0.25, after + 0.5, NULL);
    dear_timeline_span(tl, "backwards", "c", DEAR_LANE_COMPUTE, after + 1.0, after + 0.9, NULL);
    dear_timeline_close(tl);
    size_t len;
    char *text = slurp(path, &len);
    ck_assert_ptr_nonnull(text);
    ck_assert_int_eq(json_trace_events(text, len), NMETA + 2);
    const char *e = strstr(text, "\"name\":\"late\"");
    ck_assert_ptr_nonnull(e);
    double ts = -1, dur = -1;
    ck_assert_int_eq(sscanf(strstr(e, "\"ts\":"), "\"ts\":%lf,\"dur\":%lf", &ts, &dur), 2);
    ck_assert_msg(ts >= 250000.0 - 1 && ts <= 250000.0 + (after - before) * 1e6 + 1, "ts %f", ts);
    ck_assert(dur > 249999.0 && dur < 250001.0);
    e = strstr(text, "\"name\":\"backwards\"");
    ck_assert_ptr_nonnull(e);
    ck_assert(strstr(e, "\"dur\":0.000,"));
    free(text);
}
END_TEST

#define NTHREADS 4
#define PER_THREAD 400
static dear_timeline_t *shared_tl;

static void *writer(void *arg)
{
    int id = (int)(long)arg;
    char name[32];
    for (int i = 0; i < PER_THREAD; i++) {
        double t = dear_now();
        snprintf(name, sizeof name, "t%d-%d", id, i);
        if (i % 2)
            dear_timeline_span(shared_tl, name, "mt", id % 3, t, t + 1e-6, "\"i\":1");
        else
            dear_timeline_instant(shared_tl, name, "mt", id % 3, t, NULL);
    }
    return NULL;
}

START_TEST(test_threads)
{
    char path[600];
    pthread_t th[NTHREADS];
    snprintf(path, sizeof path, "%s/threads.json", dir);
    ck_assert_int_eq(dear_timeline_open(path, 1, 0, &shared_tl), DEAR_OK);
    double t0 = dear_now();
    for (long i = 0; i < NTHREADS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, writer, (void *)i), 0);
    for (int i = 0; i < NTHREADS; i++)
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    double dt = dear_now() - t0;
    dear_timeline_close(shared_tl);
    printf("timeline: %d records from %d threads in %.1f ms (%.2f us per record, one pwrite each)\n",
           NTHREADS * PER_THREAD, NTHREADS, dt * 1e3, dt * 1e6 / (NTHREADS * PER_THREAD));
    size_t len;
    char *text = slurp(path, &len);
    ck_assert_ptr_nonnull(text);
    ck_assert_int_eq(json_trace_events(text, len), NMETA + NTHREADS * PER_THREAD);
    for (int id = 0; id < NTHREADS; id++)
        for (int i = 0; i < PER_THREAD; i++) {
            char want[48];
            snprintf(want, sizeof want, "{\"name\":\"t%d-%d\",", id, i);
            ck_assert_msg(count_substr(text, want) == 1, "%s", want);
        }
    free(text);
}
END_TEST

/* A child writes records as fast as it can and is SIGKILLed at several moments; each time the
 * file must parse and hold every record up to some point (names are consecutive). The child
 * stops at KILLED_MAX_RECORDS and waits for the signal: a plain build kills it long before, but
 * under a sanitizer the polling parse below rarely sees a quiet file and the child would write
 * for the whole 10 s of grace (2 million records, 250 MB). */
#define KILLED_MAX_RECORDS 100000

/* Where the record began that a SIGKILL cut at a page boundary (the exception runtime/timeline.c
 * documents), or NULL if text is not such a cut. The write overwrote the old tail "\n]}\n" from
 * the record's start and stopped at the boundary: past the tail the file ends there; within it
 * (k = 1..3 bytes written) the tail's last 4 - k bytes remain after the record's first k. */
static char *cut_record(char *text, size_t len)
{
    static const char tail[] = "\n]}\n", head[] = ",\n{";
    size_t in_page = len % 4096;
    if (in_page > 0 && in_page < 4)
        return len >= 4 && memcmp(text + len - 4, head, 4 - in_page) == 0 &&
                       memcmp(text + len - in_page, tail + 4 - in_page, in_page) == 0
                   ? text + len - 4
                   : NULL;
    if (in_page != 0)
        return NULL;
    char *cut = text + len;
    while (cut > text && strncmp(cut, head, 3) != 0)
        cut--;
    return cut > text && (size_t)(text + len - cut) < 4096 ? cut : NULL;
}
/* cut_record on every way a kill can cut the record that crosses a page boundary: its first k
 * bytes written up to the boundary, the bytes past it as they were. Where the record is not yet
 * whole, the cut is found at its start and the file cut back there holds the event before it; a
 * file torn anywhere else is refused. */
START_TEST(test_cut_record)
{
    static const char head[] = "{\"traceEvents\":[{\"name\":\"m\"}", tail[] = "\n]}\n",
                      rec[] = ",\n{\"name\":\"r\",\"ph\":\"i\",\"s\":\"t\",\"ts\":1}\n]}\n";
    size_t rl = sizeof rec - 1;
    char *buf = malloc(2 * 4096);
    ck_assert_ptr_nonnull(buf);
    for (size_t k = 1; k < rl; k++) {
        /* the old file: head, spaces up to P = 4096 - k, the tail; the record written from P */
        size_t P = 4096 - k, len = P + 4 > 4096 ? P + 4 : 4096;
        memset(buf, ' ', P);
        memcpy(buf, head, sizeof head - 1);
        memcpy(buf + P, tail, 4);
        memcpy(buf + P, rec, k);
        buf[len] = '\0';
        long n = json_trace_events(buf, len);
        char *cut = cut_record(buf, len);
        if (k == rl - 1) {      /* all but the last newline: the file is whole, with the new event */
            ck_assert_int_eq(n, 2);
            continue;
        }
        ck_assert_msg(n == -1 && cut == buf + P, "k=%zu: events %ld, cut at %td", k, n, cut ? cut - buf : -1);
        memcpy(cut, tail, 4);
        ck_assert_int_eq(json_trace_events(buf, P + 4), 1);
    }
    /* Refused: a file ending at a boundary with no record starting in its last page; one 1 byte
     * past it that does not end as the old tail does; a length 4 or more past a boundary. */
    memset(buf, ' ', 4100);
    ck_assert_ptr_null(cut_record(buf, 4096));
    memcpy(buf + 4093, ",\n{x", 4);
    ck_assert_ptr_null(cut_record(buf, 4097));
    buf[4096] = '\n';
    ck_assert_ptr_eq(cut_record(buf, 4097), buf + 4093);
    ck_assert_ptr_null(cut_record(buf, 4100));
    free(buf);
}
END_TEST

START_TEST(test_killed_child)
{
    for (int round = 0; round < 4; round++) {
        char path[600];
        snprintf(path, sizeof path, "%s/killed-%d.json", dir, round);
        pid_t pid = fork();
        ck_assert(pid >= 0);
        if (pid == 0) {
            dear_timeline_t *tl;
            if (dear_timeline_open(path, round, 0, &tl) != DEAR_OK)
                _exit(3);
            char name[64], args[64];
            for (long i = 0; i < KILLED_MAX_RECORDS; i++) {
                double t = dear_now();
                snprintf(name, sizeof name, "rec %ld \"q\"", i);
                snprintf(args, sizeof args, "\"seq\":%ld", i);
                dear_timeline_span(tl, name, "kill", (int)(i % 3), t, t + 1e-5, args);
                if (i % 64 == 63)
                    sched_yield();   /* let the parent run on a busy machine */
            }
            for (;;)
                pause();
        }
        /* Let it write a while (longer each round), then kill it without warning. */
        double until = dear_now() + 0.02 + 0.03 * round;
        long seen = -2;
        while (dear_now() < until || seen < NMETA + 10) {
            dear_sleep(0.005);
            seen = file_events(path);
            if (dear_now() > until + 10)
                break;
        }
        ck_assert_int_eq(kill(pid, SIGKILL), 0);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

        size_t len;
        char *text = slurp(path, &len);
        ck_assert_ptr_nonnull(text);
        long n = json_trace_events(text, len);
        if (n < 0) {
            /* The documented exception (runtime/timeline.c). Everything before the cut record
             * must still be whole. */
            char *cut = cut_record(text, len);
            ck_assert_msg(cut != NULL, "round %d: invalid, and not a record cut at a page boundary", round);
            printf("timeline: killed writer %d cut the record at byte %zu, spanning a page boundary (%zu bytes)\n",
                   round, (size_t)(cut - text), len);
            memcpy(cut, "\n]}\n", 4);
            cut[4] = '\0';
            len = (size_t)(cut - text) + 4;
            n = json_trace_events(text, len);
        }
        ck_assert_msg(n >= NMETA + 10, "round %d: %ld events after kill", round, n);
        /* Records 0..n-NMETA-1 are all there, in order, and no other. */
        long nrec = n - NMETA;
        const char *p = text;
        for (long i = 0; i < nrec; i++) {
            char want[64];
            snprintf(want, sizeof want, "{\"name\":\"rec %ld \\\"q\\\"\",", i);
            /* Record i follows record i - 1 within a line: searching that window rather than
             * the rest of the file stays linear where sanitizers check each search's whole text. */
            size_t room = (size_t)(text + len - p);
            p = memmem(p, room < 1024 ? room : 1024, want, strlen(want));
            ck_assert_msg(p != NULL, "round %d: record %ld missing of %ld", round, i, nrec);
        }
        char next[64];
        snprintf(next, sizeof next, "{\"name\":\"rec %ld ", nrec);
        ck_assert(strstr(text, next) == NULL);
        printf("timeline: killed writer %d left %ld complete records, file valid\n", round, nrec);
        free(text);
    }
}
END_TEST

static char logbuf[4096];
static void capture(const char *line, void *arg)
{
    (void)arg;
    strncat(logbuf, line, sizeof logbuf - strlen(logbuf) - 1);
}

START_TEST(test_open_errors)
{
    dear_timeline_t *tl = (dear_timeline_t *)0x1;
    char path[600];
    logbuf[0] = '\0';
    dear_log_set_sink(capture, NULL);
    snprintf(path, sizeof path, "%s/no/such/dir/t-%%r.json", dir);
    ck_assert_int_eq(dear_timeline_open(path, 3, 0, &tl), DEAR_ERR_IO);
    ck_assert_ptr_eq(tl, (dear_timeline_t *)0x1);   /* untouched on failure */
    char want[700];
    snprintf(want, sizeof want, "%s/no/such/dir/t-3.json: %s", dir, strerror(ENOENT));
    ck_assert_msg(strstr(logbuf, want) != NULL, "log: %s", logbuf);
    /* Anything but a regular file is refused before it is opened, and left as it was. */
    logbuf[0] = '\0';
    ck_assert_int_eq(dear_timeline_open("/dev/full", 0, 0, &tl), DEAR_ERR_IO);
    ck_assert_msg(strstr(logbuf, "/dev/full is a character device; refused") != NULL, "log: %s", logbuf);
    struct stat st;
    ck_assert_int_eq(stat("/dev/full", &st), 0);
    ck_assert(S_ISCHR(st.st_mode));
    ck_assert_int_eq(dear_timeline_open("", 0, 0, &tl), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_timeline_open(NULL, 0, 0, &tl), DEAR_ERR_ARG);
    dear_log_set_sink(NULL, NULL);
    /* NULL timelines are accepted everywhere (the timeline is off). */
    dear_timeline_span(NULL, "x", "y", 0, 0, 1, NULL);
    dear_timeline_instant(NULL, "x", "y", 0, 0, NULL);
    dear_timeline_close(NULL);
}
END_TEST

/* The disk fills up mid-run (RLIMIT_FSIZE in a child makes writes past 20000 bytes fail,
 * the first one partly): the timeline stops with a warning and the file is still valid JSON
 * holding every record before the failed one. */
START_TEST(test_write_failure_keeps_file_valid)
{
    char path[600];
    snprintf(path, sizeof path, "%s/full.json", dir);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = { 20000, 20000 };
        dear_timeline_t *tl;
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0 || dear_timeline_open(path, 0, 0, &tl) != DEAR_OK)
            _exit(3);
        logbuf[0] = '\0';
        dear_log_set_sink(capture, NULL);
        for (int i = 0; i < 1000; i++) {
            char name[32];
            snprintf(name, sizeof name, "r%d", i);
            dear_timeline_span(tl, name, "c", 0, dear_now(), dear_now(), "\"pad\":\"0123456789012345678901234567890123456789\"");
        }
        dear_timeline_close(tl);
        _exit(strstr(logbuf, "timeline stopped") != NULL ? 0 : 4);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    size_t len;
    char *text = slurp(path, &len);
    ck_assert_ptr_nonnull(text);
    ck_assert(len <= 20000);
    long n = json_trace_events(text, len);
    ck_assert_msg(n > NMETA + 50 && n < NMETA + 1000, "%ld events", n);
    for (long i = 0; i < n - NMETA; i++) {
        char want[32];
        snprintf(want, sizeof want, "{\"name\":\"r%ld\",", i);
        ck_assert_msg(strstr(text, want) != NULL, "record %ld missing", i);
    }
    free(text);
}
END_TEST

/* Re-opening the same path truncates the previous file. */
START_TEST(test_reopen_truncates)
{
    char path[600];
    dear_timeline_t *tl;
    snprintf(path, sizeof path, "%s/again.json", dir);
    ck_assert_int_eq(dear_timeline_open(path, 0, 0, &tl), DEAR_OK);
    for (int i = 0; i < 100; i++)
        dear_timeline_instant(tl, "long name to make the first file large", "c", 0, dear_now(), NULL);
    dear_timeline_close(tl);
    ck_assert_int_eq(file_events(path), NMETA + 100);
    ck_assert_int_eq(dear_timeline_open(path, 0, 0, &tl), DEAR_OK);
    dear_timeline_instant(tl, "x", "c", 0, dear_now(), NULL);
    dear_timeline_close(tl);
    ck_assert_int_eq(file_events(path), NMETA + 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("timeline");
    TCase *tc = tcase_create("timeline");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_validator_rejects);
    tcase_add_test(tc, test_escape);
    tcase_add_test(tc, test_valid_after_every_record);
    tcase_add_test(tc, test_timestamps);
    tcase_add_test(tc, test_size_cap);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_cut_record);
    tcase_add_test(tc, test_killed_child);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_write_failure_keeps_file_valid);
    tcase_add_test(tc, test_reopen_truncates);
    suite_add_tcase(s, tc);
    return dear_ck_run(s);
}
