/*
 * The socket transport's handshake without sockets: the HMAC-SHA256 wrapper over nettle against
 * RFC 4231's test cases (computed another way: the standard's published digests), whole and in
 * parts, then the records and proofs of collectives/sock_auth.h:
 *   - a hello survives packing and unpacking, and a foreign magic is refused at its first byte;
 *   - a proof verifies only for its key, side, ranks and both nonces: replayed with another
 *     nonce, reflected to the other side, or moved to another pair of ranks, it fails.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/sock_auth.h"
#include "tests/unit/ck_run.h"

static void hex(const unsigned char *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_hmac(const void *key, size_t klen, const void *msg, size_t mlen, const char *want)
{
    unsigned char d[DEAR_SOCK_PROOF_BYTES];
    char got[2 * DEAR_SOCK_PROOF_BYTES + 1];
    const void *part[1] = { msg };
    const size_t len[1] = { mlen };
    dear_hmac_sha256(key, klen, 1, part, len, d);
    hex(d, sizeof d, got);
    ck_assert_str_eq(got, want);
}

/* RFC 4231 test cases 1-4, 6 and 7 (5 truncates the output, which nothing here does). */
START_TEST(test_hmac_rfc4231)
{
    unsigned char k[131], m[50];
    memset(k, 0x0b, 20);
    check_hmac(k, 20, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(k, 0xaa, 20);
    memset(m, 0xdd, 50);
    check_hmac(k, 20, m, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    for (int i = 0; i < 25; i++)
        k[i] = (unsigned char)(i + 1);
    memset(m, 0xcd, 50);
    check_hmac(k, 25, m, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    memset(k, 0xaa, 131);
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    check_hmac(k, 131, m6, strlen(m6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    const char *m7 = "This is a test using a larger than block-size key and a larger than block-size data. The key "
                     "needs to be hashed before being used by the HMAC algorithm.";
    check_hmac(k, 131, m7, strlen(m7), "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
    /* The same message in parts gives the same tag. */
    unsigned char whole[DEAR_SOCK_PROOF_BYTES], parts[DEAR_SOCK_PROOF_BYTES];
    const void *p1[1] = { m7 }, *p3[3] = { m7, m7 + 10, m7 + 100 };
    const size_t l1[1] = { strlen(m7) }, l3[3] = { 10, 90, strlen(m7) - 100 };
    dear_hmac_sha256(k, 131, 1, p1, l1, whole);
    dear_hmac_sha256(k, 131, 3, p3, l3, parts);
    ck_assert_mem_eq(whole, parts, sizeof whole);
}
END_TEST

START_TEST(test_equal_ct)
{
    ck_assert_int_eq(dear_equal_ct("abcd", "abcd", 4), 1);
    ck_assert_int_eq(dear_equal_ct("abcd", "abce", 4), 0);
    ck_assert_int_eq(dear_equal_ct("xbcd", "abcd", 4), 0);
    ck_assert_int_eq(dear_equal_ct("", "", 0), 1);
}
END_TEST

START_TEST(test_hello_record)
{
    dear_sock_hello_t h = { .from = 7, .to = 3 }, back;
    ck_assert_int_eq(dear_sock_random(h.nonce, sizeof h.nonce), 0);
    unsigned char rec[DEAR_SOCK_HELLO_BYTES];
    dear_sock_hello_pack(&h, rec);
    ck_assert_int_eq(dear_sock_hello_unpack(rec, &back), 0);
    ck_assert_int_eq(back.from, 7);
    ck_assert_int_eq(back.to, 3);
    ck_assert_mem_eq(back.nonce, h.nonce, sizeof h.nonce);
    /* The ranks are little-endian u32 whatever the host's order. */
    ck_assert_int_eq(rec[8], 7);
    ck_assert_int_eq(rec[12], 3);
    for (size_t n = 0; n <= DEAR_SOCK_MAGIC_BYTES; n++)
        ck_assert_int_eq(dear_sock_magic_prefix(rec, n), 1);
    /* The old clear-text hello began with the bytes of 0x64656172736f636b, little-endian. */
    const unsigned char old[8] = { 0x6b, 0x63, 0x6f, 0x73, 0x72, 0x61, 0x65, 0x64 };
    ck_assert_int_eq(dear_sock_magic_prefix(old, 1), 0);
    unsigned char bad[DEAR_SOCK_HELLO_BYTES];
    memcpy(bad, rec, sizeof bad);
    bad[7] ^= 1;
    ck_assert_int_eq(dear_sock_magic_prefix(bad, 7), 1);
    ck_assert_int_eq(dear_sock_magic_prefix(bad, 8), 0);
    ck_assert_int_eq(dear_sock_hello_unpack(bad, &back), -1);
    /* Two draws differ (a nonce that repeats would let a recorded proof be replayed). */
    unsigned char n1[DEAR_SOCK_NONCE_BYTES], n2[DEAR_SOCK_NONCE_BYTES];
    ck_assert_int_eq(dear_sock_random(n1, sizeof n1), 0);
    ck_assert_int_eq(dear_sock_random(n2, sizeof n2), 0);
    ck_assert_int_ne(memcmp(n1, n2, sizeof n1), 0);
}
END_TEST

START_TEST(test_proofs)
{
    unsigned char key[DEAR_SOCK_KEY_BYTES], other[DEAR_SOCK_KEY_BYTES];
    unsigned char nc[DEAR_SOCK_NONCE_BYTES], na[DEAR_SOCK_NONCE_BYTES], na2[DEAR_SOCK_NONCE_BYTES];
    ck_assert_int_eq(dear_sock_random(key, sizeof key), 0);
    ck_assert_int_eq(dear_sock_random(other, sizeof other), 0);
    ck_assert_int_eq(dear_sock_random(nc, sizeof nc), 0);
    ck_assert_int_eq(dear_sock_random(na, sizeof na), 0);
    ck_assert_int_eq(dear_sock_random(na2, sizeof na2), 0);
    unsigned char pa[DEAR_SOCK_PROOF_BYTES], pc[DEAR_SOCK_PROOF_BYTES];
    dear_sock_proof(key, DEAR_SOCK_BY_ACCEPTOR, 2, 0, nc, na, pa);
    dear_sock_proof(key, DEAR_SOCK_BY_CONNECTOR, 2, 0, nc, na, pc);
    ck_assert_int_eq(dear_sock_proof_ok(key, DEAR_SOCK_BY_ACCEPTOR, 2, 0, nc, na, pa), 1);
    ck_assert_int_eq(dear_sock_proof_ok(key, DEAR_SOCK_BY_CONNECTOR, 2, 0, nc, na, pc), 1);
    /* Reflected: one side's proof is not the other's. */
    ck_assert_int_ne(memcmp(pa, pc, sizeof pa), 0);
    ck_assert_int_eq(dear_sock_proof_ok(key, DEAR_SOCK_BY_CONNECTOR, 2, 0, nc, na, pa), 0);
    /* Replayed: the acceptor's fresh nonce makes a recorded proof worthless. */
    ck_assert_int_eq(dear_sock_proof_ok(key, DEAR_SOCK_BY_CONNECTOR, 2, 0, nc, na2, pc), 0);
    /* Another pair, or ranks swapped. */
    ck_assert_int_eq(dear_sock_proof_ok(key, DEAR_SOCK_BY_CONNECTOR, 1, 0, nc, na, pc), 0);
    ck_assert_int_eq(dear_sock_proof_ok(key, DEAR_SOCK_BY_CONNECTOR, 0, 2, nc, na, pc), 0);
    /* Another job's key. */
    ck_assert_int_eq(dear_sock_proof_ok(other, DEAR_SOCK_BY_CONNECTOR, 2, 0, nc, na, pc), 0);
    /* Any flipped bit. */
    for (size_t i = 0; i < sizeof pc; i++) {
        pc[i] ^= 0x10;
        ck_assert_int_eq(dear_sock_proof_ok(key, DEAR_SOCK_BY_CONNECTOR, 2, 0, nc, na, pc), 0);
        pc[i] ^= 0x10;
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sock_auth");
    TCase *tc = tcase_create("sock_auth");
    tcase_add_test(tc, test_hmac_rfc4231);
    tcase_add_test(tc, test_equal_ct);
    tcase_add_test(tc, test_hello_record);
    tcase_add_test(tc, test_proofs);
    suite_add_tcase(s, tc);
    return dear_ck_run(s);
}
