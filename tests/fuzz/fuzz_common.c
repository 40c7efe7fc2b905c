/* What the three harnesses share: a private temporary directory for the inputs (the readers
 * take paths), a log sink that drops the readers' error lines after formatting them, and the
 * libFuzzer entry point. */
#include "tests/fuzz/fuzz.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

static char fuzz_dir[4096];

static void drop_line(const char *line, void *arg)
{
    (void)line;
    (void)arg;
}

/* Remove what the harnesses wrote; only this process writes in the directory. */
static void remove_dir(void)
{
    static const char *const names[] = { "input", "again" };
    char p[DEAR_FUZZ_PATH_MAX];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", fuzz_dir, names[i]);
        unlink(p);
    }
    rmdir(fuzz_dir);
}

void dear_fuzz_path(const char *name, char path[DEAR_FUZZ_PATH_MAX])
{
    if (!fuzz_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : tmp && tmp[0] ? tmp : "/tmp";
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/dear-fuzz-XXXXXX", base);
        DEAR_FUZZ_EXPECT(mkdtemp(fuzz_dir) != NULL, "mkdtemp in %s: %s", base, strerror(errno));
        atexit(remove_dir);
        /* Every refused input logs an error: formatted (that code runs), then dropped. */
        dear_log_set_sink(drop_line, NULL);
    }
    snprintf(path, DEAR_FUZZ_PATH_MAX, "%s/%s", fuzz_dir, name);
}

void dear_fuzz_write(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    DEAR_FUZZ_EXPECT(f != NULL, "cannot write %s: %s", path, strerror(errno));
    DEAR_FUZZ_EXPECT(fwrite(data, 1, size, f) == size && fclose(f) == 0, "cannot write %s", path);
}

int dear_fuzz_next_line(const uint8_t *data, size_t size, size_t *pos, char *line, size_t len)
{
    size_t i = *pos, n = 0;
    if (i >= size)
        return 0;
    for (; i < size && data[i] != '\n'; i++)
        if (n + 1 < len)
            line[n++] = (char)data[i];
    line[n] = '\0';
    *pos = i + 1;
    return 1;
}

int dear_fuzz_close(double a, double b, double tol)
{
    return a == b || fabs(a - b) <= tol * fmax(fabs(a), fabs(b));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dear_fuzz_one(data, size);
    return 0;
}
