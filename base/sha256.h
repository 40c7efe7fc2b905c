/*
 * SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the socket transport's handshake, which
 * proves knowledge of the job's key without sending it. Small and dependency-free rather than
 * fast: a handshake hashes a few hundred bytes. tests/unit/test_sha256.c holds the standards'
 * test vectors.
 */
#ifndef DEAR_SHA256_H
#define DEAR_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define DEAR_SHA256_BYTES 32
#define DEAR_SHA256_BLOCK 64

typedef struct {
    uint32_t h[8];
    uint64_t total;                         /* bytes hashed so far */
    unsigned char block[DEAR_SHA256_BLOCK]; /* a partial block waiting for more */
    size_t fill;
} dear_sha256_t;

void dear_sha256_init(dear_sha256_t *c);
void dear_sha256_update(dear_sha256_t *c, const void *data, size_t len);
void dear_sha256_final(dear_sha256_t *c, unsigned char out[DEAR_SHA256_BYTES]);
void dear_sha256(const void *data, size_t len, unsigned char out[DEAR_SHA256_BYTES]);

/* HMAC-SHA256 over the concatenation of n parts (part[i], len[i]), so callers need not pack
 * their fields into one buffer. */
void dear_hmac_sha256(const void *key, size_t key_len, int n, const void *const part[], const size_t len[],
                      unsigned char out[DEAR_SHA256_BYTES]);

/* 1 when the n bytes at a and b are equal, in a time that does not depend on where they differ. */
int dear_equal_ct(const void *a, const void *b, size_t n);

#endif
