/*
 * SHA-256 and HMAC-SHA256 (sha256.h), written from FIPS 180-4 and RFC 2104. The constants are
 * the standard's: the first 32 bits of the fractional parts of the cube roots (K) and square
 * roots (H0) of the first primes.
 */
#include "base/sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t H0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

static uint32_t ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

/* One 64-byte block into the state (the standard's compression function). */
static void compress(uint32_t h[8], const unsigned char *p)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = ror(w[t - 15], 7) ^ ror(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = ror(w[t - 2], 17) ^ ror(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

void dear_sha256_init(dear_sha256_t *c)
{
    memcpy(c->h, H0, sizeof H0);
    c->total = 0;
    c->fill = 0;
}

void dear_sha256_update(dear_sha256_t *c, const void *data, size_t len)
{
    const unsigned char *p = data;
    c->total += len;
    if (c->fill > 0) {
        size_t take = DEAR_SHA256_BLOCK - c->fill < len ? DEAR_SHA256_BLOCK - c->fill : len;
        memcpy(c->block + c->fill, p, take);
        c->fill += take;
        p += take;
        len -= take;
        if (c->fill < DEAR_SHA256_BLOCK)
            return;
        compress(c->h, c->block);
        c->fill = 0;
    }
    for (; len >= DEAR_SHA256_BLOCK; p += DEAR_SHA256_BLOCK, len -= DEAR_SHA256_BLOCK)
        compress(c->h, p);
    memcpy(c->block, p, len);
    c->fill = len;
}

void dear_sha256_final(dear_sha256_t *c, unsigned char out[DEAR_SHA256_BYTES])
{
    /* Padding: 0x80, zeros up to 56 bytes mod 64, then the length in bits, big-endian. */
    uint64_t bits = c->total * 8;
    unsigned char pad[DEAR_SHA256_BLOCK + 8] = { 0x80 };
    size_t zeros = c->fill < 56 ? 56 - c->fill : 120 - c->fill;
    for (int i = 0; i < 8; i++)
        pad[zeros + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
    dear_sha256_update(c, pad, zeros + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(c->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)c->h[i];
    }
    explicit_bzero(c, sizeof *c);
}

void dear_sha256(const void *data, size_t len, unsigned char out[DEAR_SHA256_BYTES])
{
    dear_sha256_t c;
    dear_sha256_init(&c);
    dear_sha256_update(&c, data, len);
    dear_sha256_final(&c, out);
}

void dear_hmac_sha256(const void *key, size_t key_len, int n, const void *const part[], const size_t len[],
                      unsigned char out[DEAR_SHA256_BYTES])
{
    /* A key longer than a block is hashed first; a shorter one is padded with zeros. */
    unsigned char k[DEAR_SHA256_BLOCK] = { 0 }, pad[DEAR_SHA256_BLOCK], inner[DEAR_SHA256_BYTES];
    if (key_len > DEAR_SHA256_BLOCK)
        dear_sha256(key, key_len, k);
    else
        memcpy(k, key, key_len);
    dear_sha256_t c;
    for (int i = 0; i < DEAR_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x36;
    dear_sha256_init(&c);
    dear_sha256_update(&c, pad, sizeof pad);
    for (int i = 0; i < n; i++)
        dear_sha256_update(&c, part[i], len[i]);
    dear_sha256_final(&c, inner);
    for (int i = 0; i < DEAR_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x5c;
    dear_sha256_init(&c);
    dear_sha256_update(&c, pad, sizeof pad);
    dear_sha256_update(&c, inner, sizeof inner);
    dear_sha256_final(&c, out);
    /* The key's traces on the stack: explicit_bzero, which the compiler may not drop. */
    explicit_bzero(k, sizeof k);
    explicit_bzero(pad, sizeof pad);
    explicit_bzero(inner, sizeof inner);
}

int dear_equal_ct(const void *a, const void *b, size_t n)
{
    const volatile unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= x[i] ^ y[i];
    return d == 0;
}
