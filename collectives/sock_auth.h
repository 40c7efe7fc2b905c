/*
 * The socket transport's set-up handshake (docs/DESIGN.md, "Transports"): the records through
 * which a connecting rank and the lower rank accepting it prove to each other that both hold
 * the fabric's key, which crossed MPI and never the wire. Pure functions over bytes; sock.c does
 * the I/O, and tests play a stranger with them.
 *
 *   hello   connector -> acceptor  magic "dearsck2", from rank, to rank (u32 little-endian),
 *                                  the connector's nonce                           (48 bytes)
 *   answer  acceptor -> connector  the acceptor's nonce, the acceptor's proof       (64 bytes)
 *   proof   connector -> acceptor  the connector's proof                            (32 bytes)
 *
 * A proof is HMAC-SHA256(key, label, from, to, connector's nonce, acceptor's nonce). The two
 * labels differ by direction, so one side's proof is never accepted as the other's; each side
 * checks a proof over a nonce it drew itself, so no recorded proof is good for another
 * connection; the ranks are inside the proof, so a proof for one pair proves nothing for another.
 */
#ifndef DEAR_SOCK_AUTH_H
#define DEAR_SOCK_AUTH_H

#include <stddef.h>

#define DEAR_SOCK_KEY_BYTES 32
#define DEAR_SOCK_NONCE_BYTES 32
#define DEAR_SOCK_MAGIC_BYTES 8
#define DEAR_SOCK_HELLO_BYTES 48
#define DEAR_SOCK_ANSWER_BYTES 64
#define DEAR_SOCK_PROOF_BYTES 32

typedef struct {
    int from, to;   /* the connecting rank, the accepting rank */
    unsigned char nonce[DEAR_SOCK_NONCE_BYTES];
} dear_sock_hello_t;

/* Who makes a proof. */
typedef enum { DEAR_SOCK_BY_ACCEPTOR = 0, DEAR_SOCK_BY_CONNECTOR = 1 } dear_sock_side_t;

/* n bytes from the kernel's random source (getrandom). 0, or -1 with errno set. */
int dear_sock_random(void *buf, size_t n);

void dear_sock_hello_pack(const dear_sock_hello_t *h, unsigned char out[DEAR_SOCK_HELLO_BYTES]);

/* 0 when the record starts with the magic, else -1. */
int dear_sock_hello_unpack(const unsigned char in[DEAR_SOCK_HELLO_BYTES], dear_sock_hello_t *h);

/* 1 when the first n bytes of a hello (n may be short of the magic) can still be one: a
 * stranger that speaks another protocol is turned away at its first bytes. */
int dear_sock_magic_prefix(const unsigned char *in, size_t n);

void dear_sock_proof(const unsigned char key[DEAR_SOCK_KEY_BYTES], dear_sock_side_t by, int from, int to,
                     const unsigned char conn_nonce[DEAR_SOCK_NONCE_BYTES],
                     const unsigned char acc_nonce[DEAR_SOCK_NONCE_BYTES], unsigned char out[DEAR_SOCK_PROOF_BYTES]);

/* HMAC-SHA256 (nettle's) over the concatenation of n parts (part[i], len[i]), so callers need not
 * pack their fields into one buffer. */
void dear_hmac_sha256(const void *key, size_t key_len, int n, const void *const part[], const size_t len[],
                      unsigned char out[DEAR_SOCK_PROOF_BYTES]);

/* 1 when the n bytes at a and b are equal, in a time that does not depend on where they differ. */
int dear_equal_ct(const void *a, const void *b, size_t n);

/* 1 when proof is the one by would make (constant time). */
int dear_sock_proof_ok(const unsigned char key[DEAR_SOCK_KEY_BYTES], dear_sock_side_t by, int from, int to,
                       const unsigned char conn_nonce[DEAR_SOCK_NONCE_BYTES],
                       const unsigned char acc_nonce[DEAR_SOCK_NONCE_BYTES],
                       const unsigned char proof[DEAR_SOCK_PROOF_BYTES]);

#endif
