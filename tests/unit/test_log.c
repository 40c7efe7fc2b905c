/* Logging: level filtering (a line prints iff its level is at or above the threshold), the
 * rank prefix ("?" before dear_init sets it), truncation of long lines, stderr as the default
 * sink, and whole lines when several threads log at once. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "include/dear_types.h"
#include "tests/unit/ck_run.h"

static char captured[1 << 18];
static int nlines;

static void capture(const char *line, void *arg)
{
    (void)arg;
    strncat(captured, line, sizeof captured - strlen(captured) - 1);
    nlines++;
}

static void setup(void)
{
    captured[0] = '\0';
    nlines = 0;
    dear_log_set_sink(capture, NULL);
    dear_log_set_rank(-1);
    dear_log_set_level(DEAR_LOG_WARN);
}

static void teardown(void)
{
    dear_log_set_sink(NULL, NULL);
    dear_log_set_level(DEAR_LOG_WARN);
}

START_TEST(test_filtering)
{
    static const char *const names[] = { "error", "warn", "info", "debug" };
    for (int threshold = DEAR_LOG_ERROR; threshold <= DEAR_LOG_DEBUG; threshold++) {
        dear_log_set_level((dear_log_level_t)threshold);
        ck_assert_int_eq(dear_log_get_level(), threshold);
        for (int level = DEAR_LOG_ERROR; level <= DEAR_LOG_DEBUG; level++) {
            captured[0] = '\0';
            nlines = 0;
            switch (level) {
            case DEAR_LOG_ERROR: DEAR_ERROR("t", "msg %d", level); break;
            case DEAR_LOG_WARN: DEAR_WARN("t", "msg %d", level); break;
            case DEAR_LOG_INFO: DEAR_INFO("t", "msg %d", level); break;
            default: DEAR_DEBUG("t", "msg %d", level); break;
            }
            int shown = level <= threshold;
            ck_assert_int_eq(nlines, shown);
            ck_assert_int_eq(DEAR_LOG_ON((dear_log_level_t)level), shown);
            if (shown) {
                char want[64];
                snprintf(want, sizeof want, "[dear ?] %s t: msg %d\n", names[level], level);
                ck_assert_str_eq(captured, want);
            }
        }
    }
}
END_TEST

/* Arguments of a filtered-out INFO/DEBUG line are not even evaluated (cheap when off). */
static int evaluated;
static int side_effect(void) { return ++evaluated; }

START_TEST(test_filtered_args_not_evaluated)
{
    dear_log_set_level(DEAR_LOG_WARN);
    DEAR_DEBUG("t", "%d", side_effect());
    DEAR_INFO("t", "%d", side_effect());
    ck_assert_int_eq(evaluated, 0);
    dear_log_set_level(DEAR_LOG_DEBUG);
    DEAR_DEBUG("t", "%d", side_effect());
    ck_assert_int_eq(evaluated, 1);
    ck_assert_str_eq(captured, "[dear ?] debug t: 1\n");
}
END_TEST

START_TEST(test_rank_prefix)
{
    for (int rank = 0; rank < 1000; rank += 37) {
        char want[64];
        captured[0] = '\0';
        dear_log_set_rank(rank);
        DEAR_WARN("engine", "stalled %s", "here");
        snprintf(want, sizeof want, "[dear %d] warn engine: stalled here\n", rank);
        ck_assert_str_eq(captured, want);
    }
    captured[0] = '\0';
    dear_log_set_rank(-1);
    DEAR_ERROR("api", "x");
    ck_assert_str_eq(captured, "[dear ?] error api: x\n");
}
END_TEST

START_TEST(test_long_line_truncated)
{
    char *big = malloc(10000);
    ck_assert_ptr_nonnull(big);
    memset(big, 'z', 9999);
    big[9999] = '\0';
    DEAR_ERROR("t", "%s", big);
    size_t len = strlen(captured);
    ck_assert_int_eq(nlines, 1);
    ck_assert(len > 1000 && len < 9999);          /* cut, but not to nothing */
    ck_assert_int_eq(captured[len - 1], '\n');    /* still one whole line */
    ck_assert(strchr(captured, '\n') == captured + len - 1);
    ck_assert(strncmp(captured, "[dear ?] error t: zzz", 21) == 0);
    free(big);
}
END_TEST

/* Without a sink, lines go to stderr (fd 2): redirect it into a pipe and read them back. */
START_TEST(test_stderr_default)
{
    int fds[2], saved = dup(2);
    char buf[256] = "";
    ck_assert_int_eq(pipe(fds), 0);
    dear_log_set_sink(NULL, NULL);
    fflush(stderr);
    dup2(fds[1], 2);
    dear_log_set_rank(5);
    DEAR_WARN("io", "to %s", "stderr");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fds[1]);
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    ck_assert(n > 0);
    buf[n] = '\0';
    ck_assert_str_eq(buf, "[dear 5] warn io: to stderr\n");
    ck_assert_int_eq(nlines, 0);
}
END_TEST

#define NTHREADS 4
#define PER_THREAD 500

static void *writer(void *arg)
{
    int id = (int)(long)arg;
    for (int i = 0; i < PER_THREAD; i++)
        DEAR_WARN("mt", "thread %d line %d end", id, i);
    return NULL;
}

/* Lines from concurrent threads arrive whole and all of them arrive. */
START_TEST(test_threads)
{
    pthread_t th[NTHREADS];
    int seen[NTHREADS] = { 0 };
    for (long i = 0; i < NTHREADS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, writer, (void *)i), 0);
    for (int i = 0; i < NTHREADS; i++)
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    ck_assert_int_eq(nlines, NTHREADS * PER_THREAD);
    for (char *line = strtok(captured, "\n"); line; line = strtok(NULL, "\n")) {
        int id, idx;
        char end[8];
        ck_assert_msg(sscanf(line, "[dear ?] warn mt: thread %d line %d %7s", &id, &idx, end) == 3, "%s", line);
        ck_assert_str_eq(end, "end");
        ck_assert(id >= 0 && id < NTHREADS);
        ck_assert_int_eq(idx, seen[id]);   /* each thread's lines in its own order */
        seen[id]++;
    }
    for (int i = 0; i < NTHREADS; i++)
        ck_assert_int_eq(seen[i], PER_THREAD);
}
END_TEST

/* dear_last_error: the error lines since the previous call, from any thread, only errors, then
 * forgotten; the first ones kept when there are too many. */
START_TEST(test_last_error)
{
    char buf[8192];
    dear_last_error(NULL, 0);
    DEAR_WARN("t", "a warning");
    DEAR_ERROR("t", "first %d", 1);
    DEAR_ERROR("t", "second");
    size_t n = dear_last_error(buf, sizeof buf);
    ck_assert_uint_eq(n, strlen(buf));
    ck_assert_str_eq(buf, "[dear ?] error t: first 1\n[dear ?] error t: second\n");
    ck_assert_uint_eq(dear_last_error(buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "");
    DEAR_ERROR("t", "cut");
    ck_assert_uint_eq(dear_last_error(buf, 5), strlen("[dear ?] error t: cut\n"));
    ck_assert_str_eq(buf, "[dea");
    for (int i = 0; i < 400; i++)
        DEAR_ERROR("t", "line %d", i);
    n = dear_last_error(buf, sizeof buf);
    ck_assert(n < 4096 && strncmp(buf, "[dear ?] error t: line 0\n", 25) == 0);
}
END_TEST


int main(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_filtering);
    tcase_add_test(tc, test_filtered_args_not_evaluated);
    tcase_add_test(tc, test_rank_prefix);
    tcase_add_test(tc, test_long_line_truncated);
    tcase_add_test(tc, test_stderr_default);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_last_error);
    suite_add_tcase(s, tc);
    return dear_ck_run(s);
}
