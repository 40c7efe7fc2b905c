/* Parameter table: every type parses its good values (sizes with suffixes), rejects bad ones with
 * a message naming the variable, the value and what is accepted, defaults apply, an unknown
 * DEAR_* variable is a warning, and a failed load keeps the values in force. Expected numbers
 * are computed here from their definition (1k = 1024 bytes, ...), not copied from the code. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "include/dear.h"
#include "base/log.h"
#include "base/params.h"
#include "tests/unit/ck_run.h"

extern char **environ;

/* ---- captured log lines ---- */
static char captured[16384];

static void capture(const char *line, void *arg)
{
    (void)arg;
    strncat(captured, line, sizeof captured - strlen(captured) - 1);
}

/* Remove every DEAR_* variable so each test starts from the defaults. */
static void clear_dear_env(void)
{
    for (;;) {
        char name[256] = "";
        for (char **e = environ; e && *e; e++) {
            if (strncmp(*e, "DEAR_", 5) == 0) {
                size_t len = strcspn(*e, "=");
                snprintf(name, sizeof name, "%.*s", (int)len, *e);
                break;
            }
        }
        if (name[0] == '\0')
            return;
        unsetenv(name);
    }
}

static void setup(void)
{
    clear_dear_env();
    captured[0] = '\0';
    dear_log_set_sink(capture, NULL);
    dear_log_set_level(DEAR_LOG_WARN);
}

static void teardown(void)
{
    dear_log_set_sink(NULL, NULL);
    clear_dear_env();
}

/* Parse text for id with dear_param_parse_int; return the status and leave the message in msg. */
static char msg[1024];
static int parse(dear_param_id_t id, const char *text)
{
    msg[0] = '\0';
    long long ignored;
    return dear_param_parse_int(id, text, &ignored, msg, sizeof msg);
}

/* Load with one variable set; return the status. */
static int load_with(const char *name, const char *value)
{
    setenv(name, value, 1);
    return dear_params_load();
}

/* The value must be rejected with a message naming variable, value and the accepted text. */
static void expect_rejected(dear_param_id_t id, const char *text, const char *accepted)
{
    char want_head[700];
    ck_assert_int_eq(parse(id, text), DEAR_ERR_PARAM);
    snprintf(want_head, sizeof want_head, "DEAR_%s='%s'", dear_param_table[id].name, text);
    ck_assert_msg(strstr(msg, want_head) != NULL, "message '%s' lacks '%s'", msg, want_head);
    ck_assert_msg(strstr(msg, accepted) != NULL, "message '%s' lacks '%s'", msg, accepted);
}

START_TEST(test_int)
{
    char text[32];
    for (long long v = 1; v <= 1000000; v *= 7) {
        snprintf(text, sizeof text, "%lld", v);
        ck_assert_int_eq(load_with("DEAR_WARMUP_ITERS", text), DEAR_OK);
        ck_assert_int_eq(dear_param_int(DEAR_P_WARMUP_ITERS), v);
        ck_assert_str_eq(dear_param_string(DEAR_P_WARMUP_ITERS), text);
        ck_assert_int_eq(dear_param_from_env(DEAR_P_WARMUP_ITERS), 1);
    }
    const char *bad[] = { "0", "1000001", "-3", "abc", "5x", "", "2.5", "1k", " 4", "99999999999999999999" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_rejected(DEAR_P_WARMUP_ITERS, bad[i], "an integer in [1, 1000000]");
}
END_TEST

START_TEST(test_size)
{
    const struct { const char *text; long long bytes; } good[] = {
        { "1", 1 }, { "4096", 4096 }, { "4k", 4LL << 10 }, { "4K", 4LL << 10 }, { "4KiB", 4LL << 10 },
        { "4kB", 4000 }, { "10MB", 10000000 }, { "25m", 25LL << 20 }, { "25MiB", 25LL << 20 }, { "25M", 25LL << 20 },
        { "3g", 3LL << 30 }, { "3GB", 3000000000LL }, { "3GiB", 3LL << 30 },
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        ck_assert_int_eq(parse(DEAR_P_FUSION_THRESHOLD, good[i].text), DEAR_OK);
        ck_assert_int_eq(load_with("DEAR_FUSION_THRESHOLD", good[i].text), DEAR_OK);
        ck_assert_int_eq(dear_param_int(DEAR_P_FUSION_THRESHOLD), good[i].bytes);
        ck_assert(dear_param_double(DEAR_P_FUSION_THRESHOLD) == (double)good[i].bytes);
    }
    const char *bad[] = { "0", "-1", "12q", "k", "1.5m", "4kk", "4 k", "", "1t", "9999999g", "4kb", "10mb", "1Mi" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_rejected(DEAR_P_FUSION_THRESHOLD, bad[i], "a byte count in [1, 1000000000000000], optionally with k/m/g");
    /* The lower bound of COLL_SEGMENT is 1024: 1k is in, 1023 is out. */
    ck_assert_int_eq(parse(DEAR_P_COLL_SEGMENT, "1k"), DEAR_OK);
    expect_rejected(DEAR_P_COLL_SEGMENT, "1023", "a byte count in [1024, ");
}
END_TEST

START_TEST(test_double)
{
    const struct { const char *text; double v; } good[] = {
        { "0", 0.0 }, { "0.5", 0.5 }, { "1e3", 1000.0 }, { "60", 60.0 }, { "2.25", 2.25 },
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        ck_assert_int_eq(load_with("DEAR_STALL_WARN_S", good[i].text), DEAR_OK);
        ck_assert(dear_param_double(DEAR_P_STALL_WARN_S) == good[i].v);
    }
    const char *bad[] = { "-1", "nan", "inf", "1e10", "abc", "1.5s", "" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_rejected(DEAR_P_STALL_WARN_S, bad[i], "a number in [0, 1e+09]");
}
END_TEST

START_TEST(test_bool)
{
    ck_assert_int_eq(load_with("DEAR_STATS", "1"), DEAR_OK);
    ck_assert_int_eq(dear_param_int(DEAR_P_STATS), 1);
    ck_assert_int_eq(load_with("DEAR_STATS", "0"), DEAR_OK);
    ck_assert_int_eq(dear_param_int(DEAR_P_STATS), 0);
    const char *bad[] = { "yes", "2", "true", "", "01" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_rejected(DEAR_P_STATS, bad[i], "0 or 1");
}
END_TEST

START_TEST(test_enum)
{
    /* Every choice parses to its position in the declared list. */
    const char *choices = dear_param_table[DEAR_P_SCHEDULE].choices;
    char word[64];
    int idx = 0;
    for (const char *p = choices; *p; idx++) {
        size_t n = strcspn(p, "|");
        snprintf(word, sizeof word, "%.*s", (int)n, p);
        ck_assert_int_eq(load_with("DEAR_SCHEDULE", word), DEAR_OK);
        ck_assert_int_eq(dear_param_enum(DEAR_P_SCHEDULE), idx);
        ck_assert_str_eq(dear_param_string(DEAR_P_SCHEDULE), word);
        p += n;
        if (*p == '|')
            p++;
    }
    ck_assert_int_eq(idx, 3);
    const char *bad[] = { "WFBP", "dearx", "", "wfbp ", "1" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_rejected(DEAR_P_SCHEDULE, bad[i], "one of dear|wfbp|sync");
}
END_TEST

START_TEST(test_enum_int)
{
    ck_assert_int_eq(load_with("DEAR_PROGRESS_CORE", "auto"), DEAR_OK);
    ck_assert_int_eq(dear_param_enum(DEAR_P_PROGRESS_CORE), 0);
    ck_assert_int_eq(dear_param_int(DEAR_P_PROGRESS_CORE), -1);
    ck_assert_int_eq(load_with("DEAR_PROGRESS_CORE", "none"), DEAR_OK);
    ck_assert_int_eq(dear_param_enum(DEAR_P_PROGRESS_CORE), 1);
    ck_assert_int_eq(load_with("DEAR_PROGRESS_CORE", "13"), DEAR_OK);
    ck_assert_int_eq(dear_param_enum(DEAR_P_PROGRESS_CORE), -1);
    ck_assert_int_eq(dear_param_int(DEAR_P_PROGRESS_CORE), 13);
    ck_assert_int_eq(load_with("DEAR_PROGRESS_CORE", "0"), DEAR_OK);
    ck_assert_int_eq(dear_param_int(DEAR_P_PROGRESS_CORE), 0);
    const char *bad[] = { "-2", "65536", "x", "Auto", "3k", "" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_rejected(DEAR_P_PROGRESS_CORE, bad[i], "one of auto|none or an integer in [0, 65535]");
}
END_TEST

START_TEST(test_string)
{
    const char *path = "/tmp/trace-%r with spaces \"and quotes\".json";
    ck_assert_int_eq(load_with("DEAR_TIMELINE", path), DEAR_OK);
    ck_assert_str_eq(dear_param_string(DEAR_P_TIMELINE), path);
    ck_assert_int_eq(load_with("DEAR_TIMELINE", ""), DEAR_OK);
    ck_assert_str_eq(dear_param_string(DEAR_P_TIMELINE), "");
    /* Over-long values are refused with their length, whatever the type. */
    char *big = malloc(2000);
    ck_assert_ptr_nonnull(big);
    memset(big, 'a', 1999);
    big[1999] = '\0';
    ck_assert_int_eq(parse(DEAR_P_TIMELINE, big), DEAR_ERR_PARAM);
    ck_assert_msg(strstr(msg, "DEAR_TIMELINE is 1999 characters long") != NULL, "%s", msg);
    free(big);
}
END_TEST

START_TEST(test_defaults)
{
    setenv("DEAR_SCHEDULE", "sync", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    clear_dear_env();
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    for (int i = 0; i < DEAR_P_COUNT; i++) {
        const dear_param_desc_t *d = &dear_param_table[i];
        /* The default is a value the table itself accepts... */
        ck_assert_msg(parse((dear_param_id_t)i, d->defval) == DEAR_OK, "default of DEAR_%s rejected: %s", d->name, msg);
        /* ... and is what the getters now return, not from the environment. */
        ck_assert_str_eq(dear_param_string((dear_param_id_t)i), d->defval);
        ck_assert_int_eq(dear_param_from_env((dear_param_id_t)i), 0);
    }
    ck_assert_int_eq(dear_param_enum(DEAR_P_SCHEDULE), 0);
    ck_assert_int_eq(dear_param_int(DEAR_P_FUSION_THRESHOLD), 25LL << 20);
    ck_assert(dear_param_double(DEAR_P_STALL_WARN_S) == 60.0);
    ck_assert_str_eq(captured, "");   /* a clean environment warns about nothing */
}
END_TEST

START_TEST(test_unknown_warns)
{
    setenv("DEAR_SCHEDUEL", "wfbp", 1);
    setenv("DEAR_FOO", "1", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    ck_assert_msg(strstr(captured, "warn params: unknown variable DEAR_SCHEDUEL ignored") != NULL, "%s", captured);
    ck_assert_msg(strstr(captured, "unknown variable DEAR_FOO ignored") != NULL, "%s", captured);
    /* A variable that merely starts like a known one is unknown too. */
    captured[0] = '\0';
    unsetenv("DEAR_SCHEDUEL");
    unsetenv("DEAR_FOO");
    setenv("DEAR_SCHEDULE_X", "1", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    ck_assert_msg(strstr(captured, "unknown variable DEAR_SCHEDULE_X") != NULL, "%s", captured);
    /* Known variables are not reported. */
    ck_assert(strstr(captured, "DEAR_SCHEDULE ") == NULL);
}
END_TEST

START_TEST(test_failed_load_keeps_values)
{
    setenv("DEAR_SCHEDULE", "wfbp", 1);
    setenv("DEAR_FUSION_THRESHOLD", "8m", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    ck_assert_int_eq(dear_param_enum(DEAR_P_SCHEDULE), 1);

    /* One bad value (plus a good change) fails the whole load... */
    setenv("DEAR_SCHEDULE", "bogus", 1);
    setenv("DEAR_FUSION_THRESHOLD", "1k", 1);
    setenv("DEAR_SEED", "-5", 1);
    captured[0] = '\0';
    ck_assert_int_eq(dear_params_load(), DEAR_ERR_PARAM);
    /* ... each bad value is logged as an error naming it ... */
    ck_assert_msg(strstr(captured, "error params: DEAR_SCHEDULE='bogus' is not valid: expected one of dear|wfbp|sync")
                  != NULL, "%s", captured);
    ck_assert_msg(strstr(captured, "DEAR_SEED='-5' is not valid: expected an integer in [0, 2147483647]") != NULL,
                  "%s", captured);
    /* ... and nothing changes, not even the good value. */
    ck_assert_int_eq(dear_param_enum(DEAR_P_SCHEDULE), 1);
    ck_assert_str_eq(dear_param_string(DEAR_P_SCHEDULE), "wfbp");
    ck_assert_int_eq(dear_param_int(DEAR_P_FUSION_THRESHOLD), 8LL << 20);
    ck_assert_int_eq(dear_param_int(DEAR_P_SEED), 1);
}
END_TEST

START_TEST(test_log_level_applied)
{
    ck_assert_int_eq(load_with("DEAR_LOG_LEVEL", "debug"), DEAR_OK);
    ck_assert_int_eq(dear_log_get_level(), DEAR_LOG_DEBUG);
    ck_assert_int_eq(load_with("DEAR_LOG_LEVEL", "error"), DEAR_OK);
    ck_assert_int_eq(dear_log_get_level(), DEAR_LOG_ERROR);
}
END_TEST

/* dear_params_print reports the environment as dear_init would read it. */
START_TEST(test_print)
{
    char *buf = NULL;
    size_t len = 0;
    setenv("DEAR_SCHEDULE", "nope", 1);
    setenv("DEAR_SEED", "42", 1);
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    int nbad = dear_params_print(f, "> ");
    fclose(f);
    ck_assert_int_eq(nbad, 1);
    ck_assert_msg(strstr(buf, "> DEAR_SEED                = 42           (environment)\n") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "> DEAR_SCHEDULE            = nope         (environment, INVALID") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "DEAR_SCHEDULE='nope' is not valid: expected one of dear|wfbp|sync") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "> DEAR_STATS               = 0            (default)\n") != NULL, "%s", buf);
    /* One line per parameter plus the one message line. */
    int lines = 0;
    for (char *p = buf; *p; p++)
        lines += *p == '\n';
    ck_assert_int_eq(lines, DEAR_P_COUNT + 1);
    free(buf);
}
END_TEST

/* The Markdown table has one row per parameter and no unescaped '|' inside a cell. */
START_TEST(test_markdown)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    dear_params_markdown(f);
    fclose(f);
    int rows = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "| `DEAR_", 8) != 0)
            continue;
        rows++;
        int cells = 0;
        for (char *p = line; *p; p++)
            cells += *p == '|' && (p == line || p[-1] != '\\');
        ck_assert_msg(cells == 6, "row has %d separators: %s", cells, line);
    }
    ck_assert_int_eq(rows, DEAR_P_COUNT);
    free(buf);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("params");
    TCase *tc = tcase_create("params");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_int);
    tcase_add_test(tc, test_size);
    tcase_add_test(tc, test_double);
    tcase_add_test(tc, test_bool);
    tcase_add_test(tc, test_enum);
    tcase_add_test(tc, test_enum_int);
    tcase_add_test(tc, test_string);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_unknown_warns);
    tcase_add_test(tc, test_failed_load_keeps_values);
    tcase_add_test(tc, test_log_level_applied);
    tcase_add_test(tc, test_print);
    tcase_add_test(tc, test_markdown);
    suite_add_tcase(s, tc);
    return dear_ck_run(s);
}
