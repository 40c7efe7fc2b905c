/* Small services shared by every layer: monotonic time, element sizes and names. */
#ifndef DEAR_UTIL_H
#define DEAR_UTIL_H

#include <stddef.h>
#include "include/dear_types.h"

/* Seconds from an arbitrary fixed point, CLOCK_MONOTONIC. */
double dear_now(void);
/* Thread CPU time in seconds (CLOCK_THREAD_CPUTIME_ID) of the calling thread. */
double dear_thread_cpu(void);
/* Bytes per element; 0 for an unknown type. */
size_t dear_dtype_size(dear_dtype_t dtype);
/* "float32", ...; "unknown" for an unknown type. */
const char *dear_dtype_name(dear_dtype_t dtype);
/* Parse "float32" etc.; returns 0 and sets *dtype, or -1. */
int dear_dtype_parse(const char *name, dear_dtype_t *dtype);
/* DEAR_COMPRESS's choices, in dear_compress_t's order. */
#define DEAR_COMPRESS_CHOICES "none|bf16|fp16|int8"
/* "none", "bf16", "fp16", "int8" (DEAR_COMPRESS's names); "unknown" out of range. */
const char *dear_compress_name(dear_compress_t c);
/* Parse one of those names; returns 0 and sets *c, or -1. */
int dear_compress_parse(const char *name, dear_compress_t *c);
/* The element type a compressed float32 travels as (DEAR_FLOAT32 for none, and for int8, which
 * is no element type: blocks of codes with their scales). */
dear_dtype_t dear_compress_dtype(dear_compress_t c);
/* Wire bytes per float32 byte in format c: 1, 1/2 for 16 bits, (1 + 4 / 256) / 4 for int8 (the
 * codes and their blocks' scales): what the planners and the selection table price. */
double dear_compress_ratio(dear_compress_t c);
/* Sleep for a number of seconds (nanosleep, restarted on EINTR). */
void dear_sleep(double seconds);

#endif
