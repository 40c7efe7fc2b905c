/*
 * The fuzz harnesses of the three file readers (profile, plan file, calibration cache) and
 * their two drivers: libFuzzer (clang, make check-fuzz) and tests/fuzz/replay.c (any compiler,
 * make check), which feeds the kept corpus and every crash ever found to the same function.
 * The readers take a path, so each input is written to a file in a directory of this process.
 */
#ifndef DEAR_TESTS_FUZZ_H
#define DEAR_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Defined by each harness: load one input, check what a successful load promises, free it.
 * Returns the reader's status (DEAR_OK or the error it is documented to return). */
int dear_fuzz_one(const uint8_t *data, size_t size);

#define DEAR_FUZZ_PATH_MAX 4160

/* Sets path to NAME ("input" or "again") in this process's temporary directory (under /dev/shm
 * when writable, else $TMPDIR or /tmp), created on first use and removed at exit. */
void dear_fuzz_path(const char *name, char path[DEAR_FUZZ_PATH_MAX]);
/* Writes data to path; aborts if it cannot. */
void dear_fuzz_write(const char *path, const uint8_t *data, size_t size);

/* The largest single allocation an input may cause, in MiB: libFuzzer's -malloc_limit_mb in
 * make check-fuzz, the wrapped allocator of the replay driver in make check. */
#define DEAR_FUZZ_MALLOC_LIMIT_MB 64

/* Copies the line of data at *pos (up to len - 1 characters, without its newline) into line
 * and moves *pos past it; 0 once data is used up. Harnesses read a key of the input with it. */
int dear_fuzz_next_line(const uint8_t *data, size_t size, size_t *pos, char *line, size_t len);

/* Both relative differences at most tol (files keep 9 or 6 significant digits). */
int dear_fuzz_close(double a, double b, double tol);

/* A broken promise is a crash: libFuzzer keeps the input, the replay test fails. */
#define DEAR_FUZZ_EXPECT(cond, ...)                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "fuzz: %s:%d: %s: ", __FILE__, __LINE__, #cond);                   \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
