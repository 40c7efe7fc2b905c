/* Time, sleep and data-type helpers used by every layer (no MPI). */
#include "base/util.h"

#include <errno.h>
#include <string.h>
#include <time.h>

double dear_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double dear_thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const struct { const char *name; size_t size; } dtypes[DEAR_DTYPE_COUNT] = {
    [DEAR_FLOAT32] = { "float32", 4 }, [DEAR_FLOAT64] = { "float64", 8 },
    [DEAR_BFLOAT16] = { "bfloat16", 2 }, [DEAR_FLOAT16] = { "float16", 2 },
    [DEAR_INT32] = { "int32", 4 },
};

size_t dear_dtype_size(dear_dtype_t dtype)
{
    return ((unsigned)dtype < DEAR_DTYPE_COUNT) ? dtypes[dtype].size : 0;
}

const char *dear_dtype_name(dear_dtype_t dtype)
{
    return ((unsigned)dtype < DEAR_DTYPE_COUNT) ? dtypes[dtype].name : "unknown";
}

int dear_dtype_parse(const char *name, dear_dtype_t *dtype)
{
    for (int i = 0; i < DEAR_DTYPE_COUNT; i++)
        if (strcmp(name, dtypes[i].name) == 0) {
            *dtype = (dear_dtype_t)i;
            return 0;
        }
    return -1;
}

static const char *const compress_names[DEAR_COMPRESS_COUNT] = {
    [DEAR_COMPRESS_NONE] = "none", [DEAR_COMPRESS_BF16] = "bf16", [DEAR_COMPRESS_FP16] = "fp16",
    [DEAR_COMPRESS_INT8] = "int8",
};

const char *dear_compress_name(dear_compress_t c)
{
    return (unsigned)c < DEAR_COMPRESS_COUNT ? compress_names[c] : "unknown";
}

int dear_compress_parse(const char *name, dear_compress_t *c)
{
    for (int i = 0; i < DEAR_COMPRESS_COUNT; i++)
        if (strcmp(name, compress_names[i]) == 0) {
            *c = (dear_compress_t)i;
            return 0;
        }
    return -1;
}

dear_dtype_t dear_compress_dtype(dear_compress_t c)
{
    return c == DEAR_COMPRESS_BF16 ? DEAR_BFLOAT16 : c == DEAR_COMPRESS_FP16 ? DEAR_FLOAT16 : DEAR_FLOAT32;
}

double dear_compress_ratio(dear_compress_t c)
{
    if (c == DEAR_COMPRESS_INT8)
        return (1.0 + (double)sizeof(float) / DEAR_COMPRESS_INT8_BLOCK) / sizeof(float);
    return (double)dear_dtype_size(dear_compress_dtype(c)) / sizeof(float);
}

void dear_sleep(double seconds)
{
    if (seconds <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
