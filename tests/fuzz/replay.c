/* Replays fuzz inputs through one harness without libFuzzer, so make check runs every kept
 * input with the build's own compiler: each regular file of the directories (or each file)
 * named on the command line, in name order; without arguments the harness's corpus and
 * regression directories in the source tree. A file whose name starts with "valid-" must load;
 * any other input may be refused, but the harness aborts on a broken promise, and a crash is a
 * crash, and so is an allocation above the limit libFuzzer sets. Fails when it finds no input
 * at all (a wrong path must not pass). */
#include "tests/fuzz/fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "include/dear_types.h"

static int ninputs, naccepted, nfailed;

/* The readers' allocations go through these (the link wraps malloc, calloc and realloc): one
 * above DEAR_FUZZ_MALLOC_LIMIT_MB is a crash, as libFuzzer's -malloc_limit_mb makes it, since
 * no input of a few KiB needs it and a count read from a file must not decide it. */
void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);

static void check_size(const char *fn, size_t n, size_t size)
{
    size_t limit = (size_t)DEAR_FUZZ_MALLOC_LIMIT_MB << 20;
    DEAR_FUZZ_EXPECT(size == 0 || n <= limit / size, "%s of %zu x %zu bytes, above the %d MiB limit", fn, n, size,
                     DEAR_FUZZ_MALLOC_LIMIT_MB);
}

void *__wrap_malloc(size_t size)
{
    check_size("malloc", 1, size);
    return __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
    check_size("calloc", n, size);
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size)
{
    check_size("realloc", 1, size);
    return __real_realloc(p, size);
}

static void replay_file(const char *path, const char *base, size_t size)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = malloc(size ? size : 1);
    DEAR_FUZZ_EXPECT(buf != NULL, "out of memory reading %s", path);
    if (!f || fread(buf, 1, size, f) != size) {
        fprintf(stderr, "replay: cannot read %s: %s\n", path, strerror(errno));
        nfailed++;
        free(buf);
        if (f)
            fclose(f);
        return;
    }
    fclose(f);
    printf("replay: %s\n", path);
    fflush(stdout);
    int rc = dear_fuzz_one(buf, size);
    free(buf);
    ninputs++;
    naccepted += rc == DEAR_OK;
    if (strncmp(base, "valid-", 6) == 0 && rc != DEAR_OK) {
        fprintf(stderr, "replay: %s must load, status %d (%s)\n", path, rc, dear_status_string(rc));
        nfailed++;
    }
}

static void replay_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("replay: %s: none (%s)\n", path, strerror(errno));
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        const char *slash = strrchr(path, '/');
        replay_file(path, slash ? slash + 1 : path, (size_t)st.st_size);
        return;
    }
    struct dirent **ents;
    int k = scandir(path, &ents, NULL, alphasort);
    DEAR_FUZZ_EXPECT(k >= 0, "cannot list %s: %s", path, strerror(errno));
    for (int i = 0; i < k; i++) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, ents[i]->d_name);
        if (ents[i]->d_name[0] != '.' && stat(full, &st) == 0 && S_ISREG(st.st_mode))
            replay_file(full, ents[i]->d_name, (size_t)st.st_size);
        free(ents[i]);
    }
    free(ents);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            replay_path(argv[i]);
    } else {
        static const char *const kinds[] = { "corpus", "regress" };
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            char dir[4096];
            snprintf(dir, sizeof dir, "%s/tests/fuzz/%s/%s", DEAR_SRCDIR, kinds[i], DEAR_FUZZ_READER);
            replay_path(dir);
        }
    }
    printf("replay: %d inputs, %d accepted, %d refused, %d failed\n", ninputs, naccepted, ninputs - naccepted,
           nfailed);
    if (ninputs == 0)
        fprintf(stderr, "replay: no inputs found\n");
    return ninputs > 0 && nfailed == 0 ? 0 : 1;
}
