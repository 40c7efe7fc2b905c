/*
 * Files that cannot be turned against the user (base/fileio.c and every reader and writer built
 * on it): paths naming anything but a regular file are refused and left alone (devices, FIFOs,
 * folders, symbolic links), nothing is written through a planted link, a failed write leaves the
 * old file intact, readers are bounded per line and per file, and the readers refuse values no
 * measurement can produce at the line that holds them.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/log.h"
#include "base/params.h"
#include "fusion/cost.h"
#include "fusion/plan.h"
#include "fusion/planfile.h"
#include "fusion/profile.h"
#include "include/dear_types.h"
#include "tests/unit/ck_run.h"

static char dir[256];
static char logbuf[16384];

static void sink(const char *line, void *arg)
{
    (void)arg;
    strncat(logbuf, line, sizeof logbuf - strlen(logbuf) - 1);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/dear-test-fileio-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    logbuf[0] = '\0';
    dear_log_set_sink(sink, NULL);
    /* A FIFO opened the old way would block forever: fail instead. */
    alarm(20);
}

static void teardown(void)
{
    char cmd[1024];
    alarm(0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void path_of(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

static char *read_text(const char *path)
{
    static char buf[4096];
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* How many entries of dir start with prefix (temporary files left behind). */
static int count_prefix(const char *prefix)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -c '^%s' > '%s.count' || true", dir, prefix, dir);
    ck_assert_int_eq(system(cmd), 0);
    char cpath[300];
    snprintf(cpath, sizeof cpath, "%s.count", dir);
    int n = atoi(read_text(cpath));
    unlink(cpath);
    return n;
}

START_TEST(test_targets)
{
    char reg[300], link[300], fifo[300], missing[300], victim[300];
    path_of(reg, sizeof reg, "reg");
    path_of(link, sizeof link, "link");
    path_of(fifo, sizeof fifo, "fifo");
    path_of(missing, sizeof missing, "missing");
    path_of(victim, sizeof victim, "victim");
    write_text(reg, "x");
    write_text(victim, "precious");
    ck_assert_int_eq(symlink(victim, link), 0);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(dear_file_check_target(reg, "test file"), DEAR_OK);
    ck_assert_int_eq(dear_file_check_target(missing, "test file"), DEAR_OK);
    ck_assert_int_eq(dear_file_check_target(link, "test file"), DEAR_ERR_IO);
    ck_assert_msg(strstr(logbuf, "is a symbolic link; refused"), "log: %s", logbuf);
    ck_assert_int_eq(dear_file_check_target(fifo, "test file"), DEAR_ERR_IO);
    ck_assert_msg(strstr(logbuf, "is a FIFO; refused"), "log: %s", logbuf);
    ck_assert_int_eq(dear_file_check_target("/dev/null", "test file"), DEAR_ERR_IO);
    ck_assert_msg(strstr(logbuf, "/dev/null is a character device; refused"), "log: %s", logbuf);
    ck_assert_int_eq(dear_file_check_target(dir, "test file"), DEAR_ERR_IO);
    ck_assert_int_eq(dear_file_check_target("", "test file"), DEAR_ERR_IO);
}
END_TEST

/* The writers: through a planted link, at a device, at a FIFO: refused, nothing changed. */
START_TEST(test_writers_refuse)
{
    char link[300], victim[300], fifo[300];
    path_of(link, sizeof link, "t.prof");
    path_of(victim, sizeof victim, "victim");
    path_of(fifo, sizeof fifo, "fifo");
    write_text(victim, "precious");
    ck_assert_int_eq(symlink(victim, link), 0);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);

    dear_profile_t p;
    dear_prof_init(&p, "m");
    ck_assert_int_eq(dear_prof_add_layer(&p, 0, 1e-3, 2e-3), DEAR_OK);
    ck_assert_int_eq(dear_prof_add_tensor(&p, "w", 0, 64), DEAR_OK);
    ck_assert_int_eq(dear_prof_save(&p, link), DEAR_ERR_IO);
    ck_assert_int_eq(dear_prof_save(&p, fifo), DEAR_ERR_IO);
    ck_assert_int_eq(dear_prof_save(&p, "/dev/null"), DEAR_ERR_IO);

    dear_plan_t plan = { 0 };
    int first[2] = { 0, 1 };
    ck_assert_int_eq(dear_plan_same(&plan, 1, 1, first, "test"), DEAR_OK);
    ck_assert_int_eq(dear_planfile_save(link, &plan, NULL, NULL), DEAR_ERR_IO);

    dear_cost_model_t m;
    ck_assert_int_eq(dear_cost_preset("shm", 2, 2, &m), DEAR_OK);
    ck_assert_int_eq(dear_cost_save(link, &m), DEAR_ERR_IO);
    ck_assert_int_eq(dear_cost_save("/dev/null", &m), DEAR_ERR_IO);

    int fd = -1;
    ck_assert_int_eq(dear_file_create_stream(link, "timeline", &fd), DEAR_ERR_IO);
    ck_assert_int_eq(fd, -1);

    ck_assert_str_eq(read_text(victim), "precious");
    struct stat st;
    ck_assert_int_eq(lstat(link, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    ck_assert_int_eq(lstat(fifo, &st), 0);
    ck_assert(S_ISFIFO(st.st_mode));
    ck_assert_int_eq(stat("/dev/null", &st), 0);
    ck_assert(S_ISCHR(st.st_mode));
    ck_assert_int_eq(count_prefix("t.prof."), 0);

    /* A regular file is replaced; no temporary file is left. */
    char good[300];
    path_of(good, sizeof good, "good.prof");
    write_text(good, "old");
    ck_assert_int_eq(dear_prof_save(&p, good), DEAR_OK);
    ck_assert_ptr_nonnull(strstr(read_text(good), "dear-profile 1"));
    ck_assert_int_eq(count_prefix("good.prof."), 0);
    /* The stream file replaces a regular file by a new, empty one. */
    char tl[300];
    path_of(tl, sizeof tl, "t.json");
    write_text(tl, "old contents");
    ck_assert_int_eq(dear_file_create_stream(tl, "timeline", &fd), DEAR_OK);
    ck_assert_int_eq(write(fd, "[]", 2), 2);
    close(fd);
    ck_assert_str_eq(read_text(tl), "[]");
    dear_plan_free(&plan);
    dear_prof_free(&p);
}
END_TEST

/* A write that fails part-way (here: the file-size limit, as a full disk would) leaves the old
 * file as it was and reports the error. */
START_TEST(test_failed_write_keeps_old)
{
    char path[300];
    path_of(path, sizeof path, "big.prof");
    write_text(path, "dear-profile 1\nthe old file\n");
    dear_profile_t p;
    dear_prof_init(&p, "m");
    ck_assert_int_eq(dear_prof_add_layer(&p, 0, 1e-3, 2e-3), DEAR_OK);
    char name[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(name, sizeof name, "tensor%d", i);
        ck_assert_int_eq(dear_prof_add_tensor(&p, name, 0, 64), DEAR_OK);
    }
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim = { 4096, 4096 };
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim.rlim_max = old.rlim_max;
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = dear_prof_save(&p, path);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    ck_assert_int_eq(rc, DEAR_ERR_IO);
    ck_assert_msg(strstr(logbuf, "the old file, if any, is left as it was"), "log: %s", logbuf);
    ck_assert_str_eq(read_text(path), "dear-profile 1\nthe old file\n");
    ck_assert_int_eq(count_prefix("big.prof."), 0);
    dear_prof_free(&p);
}
END_TEST

/* The readers: FIFOs and devices refused at once, lines and files bounded. */
START_TEST(test_readers_bounded)
{
    char fifo[300], path[300];
    path_of(fifo, sizeof fifo, "fifo");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    dear_profile_t p = { 0 };
    dear_plan_t plan = { 0 };
    dear_cost_model_t m;
    int found;
    ck_assert_int_eq(dear_prof_load(fifo, &p), DEAR_ERR_IO);
    ck_assert_int_eq(dear_planfile_load(fifo, 1, NULL, NULL, &plan), DEAR_ERR_IO);
    ck_assert_int_eq(dear_cost_load(fifo, 2, 1, &m, &found), DEAR_ERR_IO);
    ck_assert_int_eq(dear_planfile_load("/dev/zero", 1, NULL, NULL, &plan), DEAR_ERR_IO);
    ck_assert_msg(strstr(logbuf, "/dev/zero is a character device; refused"), "log: %s", logbuf);

    /* A plan line of 17 MiB: refused at its line, not read whole. */
    path_of(path, sizeof path, "long.plan");
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("dear-plan 1\nplanner x", f);
    for (int i = 0; i < (17 << 20) / 16; i++)
        fputs("xxxxxxxxxxxxxxxx", f);
    fputs("\n", f);
    fclose(f);
    logbuf[0] = '\0';
    ck_assert_int_eq(dear_planfile_load(path, 1, NULL, NULL, &plan), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(logbuf, "long.plan:2: line longer than"), "log: %s", logbuf);

    /* A 'tensors' count the reader would have to allocate gigabytes for. */
    write_text(path, "dear-plan 1\ntensors 100000000\n");
    logbuf[0] = '\0';
    ck_assert_int_eq(dear_planfile_load(path, 1, NULL, NULL, &plan), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(logbuf, "long.plan:2: expected one 'tensors COUNT' line"), "log: %s", logbuf);
}
END_TEST

/* Values no measurement produces are refused at their line. */
START_TEST(test_reader_values)
{
    static const struct {
        const char *text, *where;
    } cost_cases[] = {
        { "dear-cost 1\n2 1 rs ring 1e-5 1e-9 0 -0.5 7\n", "c.cost:2:" },    /* fit_err < 0 */
        { "dear-cost 1\n2 1 rs ring 1e-5 1e-9 0 0.1 -3\n", "c.cost:2:" },    /* nsamples < 0 */
        { "dear-cost 1\n2 1 rs ring 1e308 1e-9 0 0.1 7\n", "c.cost:2:" },    /* alpha */
        { "dear-cost 1\n2 1 rs ring 1e-5 0x1p-30 0 0.1 7\n", "c.cost:2:" },  /* a hex float */
        { "dear-cost 1\n2 3 rs ring 1e-5 1e-9 0 0.1 7\n", "c.cost:2:" },     /* 3 per host of 2 */
    };
    char path[300];
    path_of(path, sizeof path, "c.cost");
    for (size_t i = 0; i < sizeof cost_cases / sizeof cost_cases[0]; i++) {
        dear_cost_model_t m;
        int found;
        write_text(path, cost_cases[i].text);
        logbuf[0] = '\0';
        ck_assert_msg(dear_cost_load(path, 2, 1, &m, &found) == DEAR_ERR_FORMAT, "cost case %zu", i);
        ck_assert_msg(strstr(logbuf, cost_cases[i].where), "cost case %zu: %s", i, logbuf);
    }
    static const char *prof_cases[] = {
        "dear-profile 1\nlayer 0 1e308 0\ntensor w 0 4\nend 1 1\n",
        "dear-profile 1\nlayer 0 0.001 0\ntensor w 0 9223372036854775808\nend 1 1\n",
        "dear-profile 1\nlayer 0 0.001 0\ntensor w 0 200000000000000\ntensor v 0 200000000000000\nend 1 2\n",
    };
    path_of(path, sizeof path, "p.prof");
    for (size_t i = 0; i < sizeof prof_cases / sizeof prof_cases[0]; i++) {
        dear_profile_t p = { 0 };
        write_text(path, prof_cases[i]);
        logbuf[0] = '\0';
        ck_assert_msg(dear_prof_load(path, &p) == DEAR_ERR_FORMAT, "profile case %zu", i);
        ck_assert_msg(strstr(logbuf, "p.prof:"), "profile case %zu: %s", i, logbuf);
    }
}
END_TEST

/* Settings in seconds take decimal numbers only. */
START_TEST(test_param_decimal_only)
{
    static const char *bad[] = { "0x10", "0x1p3", "inf", "nan", " 5", "5 ", "" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("DEAR_STALL_WARN_S", bad[i], 1);
        logbuf[0] = '\0';
        ck_assert_msg(dear_params_load() == DEAR_ERR_PARAM, "DEAR_STALL_WARN_S='%s' accepted", bad[i]);
    }
    setenv("DEAR_STALL_WARN_S", "2.5e1", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    unsetenv("DEAR_STALL_WARN_S");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fileio");
    TCase *tc = tcase_create("fileio");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_targets);
    tcase_add_test(tc, test_writers_refuse);
    tcase_add_test(tc, test_failed_write_keeps_old);
    tcase_add_test(tc, test_readers_bounded);
    tcase_add_test(tc, test_reader_values);
    tcase_add_test(tc, test_param_decimal_only);
    suite_add_tcase(s, tc);
    return dear_ck_run(s);
}
