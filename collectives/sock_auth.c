/*
 * The socket transport's handshake records and proofs (sock_auth.h). Integers travel as
 * little-endian u32 whatever the host's order, so the records are the same bytes everywhere.
 */
#include "collectives/sock_auth.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>

#include <nettle/hmac.h>
#include <nettle/memops.h>

_Static_assert(DEAR_SOCK_PROOF_BYTES == SHA256_DIGEST_SIZE, "a proof is one HMAC-SHA256 tag");

static const unsigned char MAGIC[DEAR_SOCK_MAGIC_BYTES] = { 'd', 'e', 'a', 'r', 's', 'c', 'k', '2' };
static const char *const LABEL[2] = { "dear-sock acceptor proof", "dear-sock connector proof" };

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int dear_sock_random(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

void dear_hmac_sha256(const void *key, size_t key_len, int n, const void *const part[], const size_t len[],
                      unsigned char out[DEAR_SOCK_PROOF_BYTES])
{
    struct hmac_sha256_ctx c;
    hmac_sha256_set_key(&c, key_len, key);
    for (int i = 0; i < n; i++)
        hmac_sha256_update(&c, len[i], part[i]);
    hmac_sha256_digest(&c, SHA256_DIGEST_SIZE, out);
    explicit_bzero(&c, sizeof c); /* the keyed inner and outer states */
}

int dear_equal_ct(const void *a, const void *b, size_t n)
{
    return memeql_sec(a, b, n) != 0;
}

void dear_sock_hello_pack(const dear_sock_hello_t *h, unsigned char out[DEAR_SOCK_HELLO_BYTES])
{
    memcpy(out, MAGIC, sizeof MAGIC);
    put_u32(out + 8, (uint32_t)h->from);
    put_u32(out + 12, (uint32_t)h->to);
    memcpy(out + 16, h->nonce, DEAR_SOCK_NONCE_BYTES);
}

int dear_sock_hello_unpack(const unsigned char in[DEAR_SOCK_HELLO_BYTES], dear_sock_hello_t *h)
{
    if (memcmp(in, MAGIC, sizeof MAGIC) != 0)
        return -1;
    /* Ranks above INT_MAX come out negative, which every range check refuses. */
    h->from = (int)get_u32(in + 8);
    h->to = (int)get_u32(in + 12);
    memcpy(h->nonce, in + 16, DEAR_SOCK_NONCE_BYTES);
    return 0;
}

int dear_sock_magic_prefix(const unsigned char *in, size_t n)
{
    return memcmp(in, MAGIC, n < sizeof MAGIC ? n : sizeof MAGIC) == 0;
}

void dear_sock_proof(const unsigned char key[DEAR_SOCK_KEY_BYTES], dear_sock_side_t by, int from, int to,
                     const unsigned char conn_nonce[DEAR_SOCK_NONCE_BYTES],
                     const unsigned char acc_nonce[DEAR_SOCK_NONCE_BYTES], unsigned char out[DEAR_SOCK_PROOF_BYTES])
{
    unsigned char ranks[8];
    put_u32(ranks, (uint32_t)from);
    put_u32(ranks + 4, (uint32_t)to);
    const char *label = LABEL[by == DEAR_SOCK_BY_CONNECTOR];
    /* The label's terminating NUL goes in too: no label is a prefix of the other's input. */
    const void *part[4] = { label, ranks, conn_nonce, acc_nonce };
    const size_t len[4] = { strlen(label) + 1, sizeof ranks, DEAR_SOCK_NONCE_BYTES, DEAR_SOCK_NONCE_BYTES };
    dear_hmac_sha256(key, DEAR_SOCK_KEY_BYTES, 4, part, len, out);
}

int dear_sock_proof_ok(const unsigned char key[DEAR_SOCK_KEY_BYTES], dear_sock_side_t by, int from, int to,
                       const unsigned char conn_nonce[DEAR_SOCK_NONCE_BYTES],
                       const unsigned char acc_nonce[DEAR_SOCK_NONCE_BYTES],
                       const unsigned char proof[DEAR_SOCK_PROOF_BYTES])
{
    unsigned char want[DEAR_SOCK_PROOF_BYTES];
    dear_sock_proof(key, by, from, to, conn_nonce, acc_nonce, want);
    int ok = dear_equal_ct(want, proof, sizeof want);
    explicit_bzero(want, sizeof want);
    return ok;
}
