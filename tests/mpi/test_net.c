/*
 * The socket transport (collectives/sock.c) and its routing (collectives/net.c) under mpirun
 * (Check, CK_FORK=no), against payloads every rank can recompute: a message from rank s with
 * tag t and size n holds byte i = (s * 131 + t * 17 + i * 7) & 0xff.
 *   - every pair, sizes 0 .. 4 MiB + 3, receives posted before the sends and after them (the
 *     message then waits as unexpected, whole or still arriving);
 *   - matching: same tag in posting order, other tags in any order, contexts kept apart;
 *   - a stream of small messages all in the socket at once arrives whole and in order;
 *   - a message longer than its receive fails that receive, and the next message still arrives;
 *   - an abandoned receive leaves its message to the next receive of its tag; a receive or a
 *     send abandoned part-way leaves the next message whole, and the send arrives whole;
 *   - ranks of one host reach each other through shared-memory rings (sock_shm.h) when
 *     DEAR_SOCKET_SHM_BYTES asks for them: the .mpi files run this over TCP alone (the default),
 *     with 4 MiB rings and with 4 KiB rings (so messages wrap and wait for room);
 *   - a peer that closes its connections fails the receives waiting on it (no hang);
 *   - an interface list that selects nothing fails on every rank with DEAR_ERR_PARAM, and
 *     dear_init with it fails on every rank;
 *   - a sub-communicator's endpoint on the socket row of the transport table reaches the right
 *     peers;
 *   - with --unreachable alone (tests/apps/emucluster.sh, across hosts, DEAR_SOCKET_IFNAME=lo):
 *     DEAR_TRANSPORT=socket fails on every rank with DEAR_ERR_NET in time, auto runs over MPI;
 *   - with --cut alone (tests/apps/emucluster-faults.sh, which cuts a host's link while it
 *     runs): all-reduces over the fabric until one fails, then MPI_Abort, as an application
 *     ends; the script times the failure and the end of the job.
 * Every rank reaches every assertion: local failures are combined with MPI_Allreduce first.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "base/util.h"
#include "collectives/coll.h"
#include "collectives/net.h"
#include "collectives/sock.h"
#include "include/dear.h"
#include "tests/mpi/suite_run.h"

static int g_rank, g_size;
static dear_transport_t *g_tp;  /* the socket row of the transport table, on MPI_COMM_WORLD */
static dear_sock_t *g_sock;     /* its fabric */

static unsigned char pattern(int src, int tag, size_t i)
{
    return (unsigned char)((src * 131 + tag * 17 + (int)(i * 7)) & 0xff);
}

static void fill(unsigned char *p, size_t n, int src, int tag)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pattern(src, tag, i);
}

/* Index of the first byte that differs from the pattern, or n. */
static size_t first_bad(const unsigned char *p, size_t n, int src, int tag)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != pattern(src, tag, i))
            return i;
    return n;
}

/* 1 when every rank passes ok. */
static int all_ok(int ok)
{
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

/* Drive the fabric until *msg completes; its status (DEAR_ERR_TIMEOUT after 30 s). */
static int finish(dear_sock_msg_t **msg, size_t *bytes)
{
    double t0 = dear_now();
    for (;;) {
        int flag = 0, rc = dear_sock_test(g_sock, msg, &flag, bytes);
        if (rc != DEAR_OK || flag)
            return rc;
        if (dear_now() - t0 > 30)
            return DEAR_ERR_TIMEOUT;
        dear_sock_block(g_sock, 0.01);
    }
}

static const size_t sizes[] = { 0, 1, 16, 4095, 65536, 1 << 20, (4 << 20) + 3 };
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Every rank sends to every other one message per size (tag = size index), then receives them:
 * receives posted after the sends (late = 1: the messages wait as unexpected) or before. */
static int exchange(int late, uint32_t ctx)
{
    int ok = 1, n = g_size - 1;
    size_t count = (size_t)n * NSIZES;
    dear_sock_msg_t **s = calloc(count, sizeof *s), **r = calloc(count, sizeof *r);
    unsigned char **sb = calloc(count, sizeof *sb), **rb = calloc(count, sizeof *rb);
    ck_assert(s && r && sb && rb);
    for (int pass = 0; pass < 2; pass++) {
        int sending = (pass == 0) == late;
        for (int i = 0; i < n; i++) {
            int peer = (g_rank + 1 + i) % g_size;
            for (size_t k = 0; k < NSIZES; k++) {
                size_t j = (size_t)i * NSIZES + k;
                if (sending) {
                    sb[j] = malloc(sizes[k] + 1);
                    fill(sb[j], sizes[k], g_rank, (int)k);
                    ok &= dear_sock_isend(g_sock, peer, ctx, (int)k, sb[j], sizes[k], &s[j]) == DEAR_OK;
                } else {
                    rb[j] = malloc(sizes[k] + 1);
                    memset(rb[j], 0, sizes[k] + 1);
                    ok &= dear_sock_irecv(g_sock, peer, ctx, (int)k, rb[j], sizes[k], &r[j]) == DEAR_OK;
                }
            }
        }
        if (late && pass == 0) {
            /* Let the messages arrive before any receive exists. */
            MPI_Barrier(MPI_COMM_WORLD);
            for (int t = 0; t < 50; t++)
                dear_sock_block(g_sock, 0.002);
        }
    }
    for (int i = 0; i < n; i++) {
        int peer = (g_rank + 1 + i) % g_size;
        for (size_t k = 0; k < NSIZES; k++) {
            size_t j = (size_t)i * NSIZES + k, got = 99;
            int rc = finish(&r[j], &got);
            size_t bad = first_bad(rb[j], sizes[k], peer, (int)k);
            if (rc != DEAR_OK || got != sizes[k] || bad != sizes[k] || rb[j][sizes[k]] != 0) {
                fprintf(stderr, "rank %d: %zu bytes from %d (tag %zu, %s): status %d, got %zu, first bad byte %zu\n",
                        g_rank, sizes[k], peer, k, late ? "late" : "early", rc, got, bad);
                ok = 0;
            }
            ok &= finish(&s[j], NULL) == DEAR_OK;
            free(sb[j]);
            free(rb[j]);
        }
    }
    free(s);
    free(r);
    free(sb);
    free(rb);
    return ok;
}

START_TEST(test_pairs)
{
    ck_assert_msg(all_ok(exchange(0, 0)), "receives posted first: a message went wrong (see above)");
    ck_assert_msg(all_ok(exchange(1, 0)), "receives posted late: a message went wrong (see above)");
    ck_assert_msg(all_ok(exchange(1, 7)), "in context 7: a message went wrong (see above)");
}
END_TEST

/* Rank 0 sends to rank 1: tags 1, 2, 1 in context 0 and tag 1 in context 1; rank 1 receives
 * context 1 first, then tag 2, then tag 1 twice: each gets its own message, tag 1's in order. */
START_TEST(test_matching)
{
    int ok = 1;
    enum { N = 100000 };
    static unsigned char out[4][N], in[4][N];
    dear_sock_msg_t *m[4] = { 0 };
    const int tags[4] = { 1, 2, 1, 1 };
    const uint32_t ctxs[4] = { 0, 0, 0, 1 };
    if (g_rank == 0) {
        for (int i = 0; i < 4; i++) {
            fill(out[i], N, 10 + i, tags[i]);
            ok &= dear_sock_isend(g_sock, 1, ctxs[i], tags[i], out[i], N, &m[i]) == DEAR_OK;
        }
        for (int i = 0; i < 4; i++)
            ok &= finish(&m[i], NULL) == DEAR_OK;
    } else if (g_rank == 1) {
        const int order[4] = { 3, 1, 0, 2 };
        for (int k = 0; k < 4; k++) {
            int i = order[k];
            ok &= dear_sock_irecv(g_sock, 0, ctxs[i], tags[i], in[i], N, &m[i]) == DEAR_OK;
        }
        for (int i = 0; i < 4; i++) {
            size_t got = 0;
            int rc = finish(&m[i], &got);
            size_t bad = first_bad(in[i], N, 10 + i, tags[i]);
            if (rc != DEAR_OK || got != N || bad != N) {
                fprintf(stderr, "matching: message %d (context %u, tag %d): status %d, first bad byte %zu\n", i,
                        (unsigned)ctxs[i], tags[i], rc, bad);
                ok = 0;
            }
        }
    }
    ck_assert_msg(all_ok(ok), "a message was matched to the wrong receive (see above)");
}
END_TEST

/* Rank 0 sends rank 1 a stream of messages of many small sizes (no payload, shorter and longer
 * than a header, a page, 8 KiB and odd), all in the socket at once, so that reads end inside
 * payloads and headers alike: each arrives whole and in order, with its receive posted after the
 * sends (waiting as unexpected) or before them (late = 0). */
static int stream(int late)
{
    static const size_t len[] = { 0, 1, 15, 16, 17, 100, 4096, 8197, 3, 0, 33 };
    enum { NLEN = sizeof len / sizeof len[0], NMSG = 600 };
    int ok = 1;
    dear_sock_msg_t **m = calloc(NMSG, sizeof *m);
    unsigned char **buf = calloc(NMSG, sizeof *buf);
    ck_assert(m && buf);
    for (int i = 0; i < NMSG; i++) {
        buf[i] = calloc(1, len[i % NLEN] + 1);
        ck_assert(buf[i]);
    }
    /* The receives first (early), or after the messages have come in (late). */
    for (int i = 0; i < NMSG && g_rank == 1 && !late; i++)
        ok &= dear_sock_irecv(g_sock, 0, 0, i % 97, buf[i], len[i % NLEN], &m[i]) == DEAR_OK;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < NMSG && g_rank == 0; i++) {
        fill(buf[i], len[i % NLEN], 3, i % 97);
        ok &= dear_sock_isend(g_sock, 1, 0, i % 97, buf[i], len[i % NLEN], &m[i]) == DEAR_OK;
    }
    if (late) {
        MPI_Barrier(MPI_COMM_WORLD);
        for (int t = 0; t < 50 && g_rank == 1; t++)
            dear_sock_block(g_sock, 0.002);
        for (int i = 0; i < NMSG && g_rank == 1; i++)
            ok &= dear_sock_irecv(g_sock, 0, 0, i % 97, buf[i], len[i % NLEN], &m[i]) == DEAR_OK;
    }
    for (int i = 0; i < NMSG && g_rank < 2; i++) {
        size_t n = len[i % NLEN], got = 99;
        int rc = finish(&m[i], g_rank == 1 ? &got : NULL);
        size_t bad = g_rank == 1 ? first_bad(buf[i], n, 3, i % 97) : n;
        if (rc != DEAR_OK || (g_rank == 1 && (got != n || bad != n || buf[i][n] != 0))) {
            fprintf(stderr, "rank %d, stream (%s): message %d of %zu bytes: status %d, got %zu, first bad byte %zu\n",
                    g_rank, late ? "late" : "early", i, n, rc, got, bad);
            ok = 0;
        }
    }
    for (int i = 0; i < NMSG; i++)
        free(buf[i]);
    free(buf);
    free(m);
    return ok;
}

START_TEST(test_stream)
{
    ck_assert_msg(all_ok(stream(1)), "a stream of small messages, received late: see above");
    ck_assert_msg(all_ok(stream(0)), "a stream of small messages, received early: see above");
}
END_TEST

/* Rank 0 sends rank 1 two patterned messages (sizes n1, n2; pattern sources 1 and 2; tags t1, t2)
 * in context 0 and waits for both; 1 when all went well. */
static int send_two(size_t n1, int t1, size_t n2, int t2)
{
    unsigned char *m1 = malloc(n1), *m2 = malloc(n2);
    dear_sock_msg_t *a = NULL, *b = NULL;
    fill(m1, n1, 1, t1);
    fill(m2, n2, 2, t2);
    int ok = dear_sock_isend(g_sock, 1, 0, t1, m1, n1, &a) == DEAR_OK &&
             dear_sock_isend(g_sock, 1, 0, t2, m2, n2, &b) == DEAR_OK;
    ok = ok && finish(&a, NULL) == DEAR_OK && finish(&b, NULL) == DEAR_OK;
    free(m1);
    free(m2);
    return ok;
}

/* A message longer than its receive fails it (DEAR_ERR_NET), and the next one arrives whole. */
START_TEST(test_truncation)
{
    int ok = 1;
    unsigned char small[10], next[500];
    dear_sock_msg_t *a = NULL, *b = NULL;
    if (g_rank == 0) {
        ok = send_two(1000, 3, sizeof next, 4);
    } else if (g_rank == 1) {
        ok &= dear_sock_irecv(g_sock, 0, 0, 3, small, sizeof small, &a) == DEAR_OK;
        ok &= dear_sock_irecv(g_sock, 0, 0, 4, next, sizeof next, &b) == DEAR_OK;
        int rc = finish(&a, NULL);
        if (rc != DEAR_ERR_NET) {
            fprintf(stderr, "truncation: the short receive ended with %d, not DEAR_ERR_NET\n", rc);
            ok = 0;
        }
        ok &= finish(&b, NULL) == DEAR_OK && first_bad(next, sizeof next, 2, 4) == sizeof next;
    }
    ck_assert_msg(all_ok(ok), "truncation: see above");
}
END_TEST

/* Rank 1 posts a receive and abandons it before rank 0 sends: the message is left for the next
 * receive of its tag, and a later message still arrives after it. */
START_TEST(test_abandon)
{
    int ok = 1;
    unsigned char r1[300], r2[300];
    dear_sock_msg_t *a = NULL, *b = NULL;
    if (g_rank == 1) {
        ok &= dear_sock_irecv(g_sock, 0, 0, 9, r1, sizeof r1, &a) == DEAR_OK;
        dear_sock_abandon(g_sock, &a);
        ok &= a == NULL;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
        ok = send_two(sizeof r1, 9, sizeof r2, 9);
    } else if (g_rank == 1) {
        ok &= dear_sock_irecv(g_sock, 0, 0, 9, r1, sizeof r1, &a) == DEAR_OK;
        ok &= dear_sock_irecv(g_sock, 0, 0, 9, r2, sizeof r2, &b) == DEAR_OK;
        ok &= finish(&a, NULL) == DEAR_OK && finish(&b, NULL) == DEAR_OK;
        ok &= first_bad(r1, sizeof r1, 1, 9) == sizeof r1 && first_bad(r2, sizeof r2, 2, 9) == sizeof r2;
    }
    ck_assert_msg(all_ok(ok), "abandon: the messages did not reach the receives in order");
}
END_TEST

/* Abandoned on their way: rank 1 withdraws a receive of 200 KB once part of it may have come,
 * and rank 0 a send of 1 MiB part-written, overwriting its buffer at once. The next message
 * after each arrives whole, and so does the abandoned send, from the copy the transport kept.
 * With rings smaller than these (the ring-4k pass) both are cut off mid-ring. */
START_TEST(test_abandon_midway)
{
    enum { BIG = 200000, HUGE = 1 << 20, SMALL = 300 };
    int ok = 1;
    unsigned char *big = calloc(1, HUGE), small[SMALL];
    dear_sock_msg_t *a = NULL, *b = NULL;
    ck_assert(big);
    if (g_rank == 0) {
        ok = send_two(BIG, 5, SMALL, 6);
        fill(big, HUGE, 3, 7);
        ok &= dear_sock_isend(g_sock, 1, 0, 7, big, HUGE, &a) == DEAR_OK;
        dear_sock_abandon(g_sock, &a);
        memset(big, 0xaa, HUGE);
        fill(small, SMALL, 4, 8);
        ok &= dear_sock_isend(g_sock, 1, 0, 8, small, SMALL, &b) == DEAR_OK && finish(&b, NULL) == DEAR_OK;
    } else if (g_rank == 1) {
        ok &= dear_sock_irecv(g_sock, 0, 0, 5, big, BIG, &a) == DEAR_OK;
        ok &= dear_sock_irecv(g_sock, 0, 0, 6, small, SMALL, &b) == DEAR_OK;
        for (int t = 0; t < 3; t++)
            dear_sock_block(g_sock, 0.002);
        dear_sock_abandon(g_sock, &a);
        ok &= finish(&b, NULL) == DEAR_OK && first_bad(small, SMALL, 2, 6) == SMALL;
        ok &= dear_sock_irecv(g_sock, 0, 0, 7, big, HUGE, &a) == DEAR_OK && finish(&a, NULL) == DEAR_OK;
        ok &= first_bad(big, HUGE, 3, 7) == HUGE;
        ok &= dear_sock_irecv(g_sock, 0, 0, 8, small, SMALL, &b) == DEAR_OK && finish(&b, NULL) == DEAR_OK;
        ok &= first_bad(small, SMALL, 4, 8) == SMALL;
    }
    free(big);
    ck_assert_msg(all_ok(ok), "abandoned on their way: a later message, or the abandoned send, went wrong");
}
END_TEST

/* Each rank reaches the other ranks of its host (as MPI counts them) through rings, or none
 * with DEAR_SOCKET_SHM_BYTES=0 (the default). */
START_TEST(test_rings)
{
    MPI_Comm node;
    int nlocal;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &nlocal);
    MPI_Comm_free(&node);
    int want = dear_param_int(DEAR_P_SOCKET_SHM_BYTES) > 0 ? nlocal - 1 : 0;
    int got = dear_sock_ring_peers(g_sock);
    if (got != want)
        fprintf(stderr, "rank %d reaches %d peers through rings, not %d\n", g_rank, got, want);
    ck_assert_msg(all_ok(got == want), "rings: a pair of ranks of this host is not where it should be");
}
END_TEST

/* A sub-communicator of the odd ranks (or of all but rank 0) routed through the fabric: its
 * rank i sends to its rank i+1, the peers named in its own numbering. */
START_TEST(test_subcomm)
{
    int ok = 1;
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, g_rank == 0 ? MPI_UNDEFINED : 1, g_size - g_rank, &sub);
    if (sub != MPI_COMM_NULL) {
        int r, n;
        MPI_Comm_rank(sub, &r);
        MPI_Comm_size(sub, &n);
        if (n < 2) {  /* np 2: a sub-communicator of one rank has no peer */
            MPI_Comm_free(&sub);
            ck_assert(all_ok(1));
            return;
        }
        dear_net_t *ep = NULL;
        ck_assert_int_eq(dear_net_open(g_tp, sub, &ep), DEAR_OK);
        ck_assert_ptr_eq(ep->tp, g_tp);
        unsigned char out[64], in[64];
        fill(out, sizeof out, g_rank, r);
        dear_net_req_t s = DEAR_NET_REQ_NULL, q = DEAR_NET_REQ_NULL;
        int to = (r + 1) % n, from = (r + n - 1) % n;
        ok &= dear_net_irecv(ep, in, sizeof in, from, from, &q) == DEAR_OK;
        ok &= dear_net_isend(ep, out, sizeof out, to, r, &s) == DEAR_OK;
        ok &= q.net == ep && s.net == ep;
        for (double t0 = dear_now(); ok && (dear_net_active(&q) || dear_net_active(&s)) && dear_now() - t0 < 30;) {
            int f;
            dear_transport_progress(g_tp);
            ok &= dear_net_test(&q, &f) == DEAR_OK && dear_net_test(&s, &f) == DEAR_OK;
        }
        /* Sub rank `from` is world rank g_size - (its key order): keys descend with world rank. */
        int world_from = g_size - 1 - from;
        ok &= !dear_net_active(&q) && first_bad(in, sizeof in, world_from, from) == sizeof in;
        dear_net_close(ep);
        MPI_Comm_free(&sub);
    }
    ck_assert_msg(all_ok(ok), "sub-communicator: a message missed its peer");
}
END_TEST

/* An interface list that selects nothing: DEAR_ERR_PARAM on every rank, nothing left open; and
 * dear_init under it fails on every rank. */
START_TEST(test_bad_ifname)
{
    dear_sock_t *s = NULL;
    int rc = dear_sock_create(MPI_COMM_WORLD, "nosuchif", 5, &s);
    ck_assert_msg(all_ok(rc == DEAR_ERR_PARAM && s == NULL), "dear_sock_create(nosuchif): %d", rc);
    setenv("DEAR_TRANSPORT", "socket", 1);
    setenv("DEAR_SOCKET_IFNAME", "nosuchif", 1);
    dear_ctx_t *ctx = NULL;
    rc = dear_init(MPI_COMM_WORLD, &ctx);
    unsetenv("DEAR_TRANSPORT");
    unsetenv("DEAR_SOCKET_IFNAME");
    dear_params_load();
    ck_assert_msg(all_ok(rc == DEAR_ERR_PARAM && ctx == NULL), "dear_init with DEAR_SOCKET_IFNAME=nosuchif: %d", rc);
}
END_TEST

/* Run alone (--unreachable) across hosts, with DEAR_SOCKET_IFNAME naming an interface the hosts
 * cannot reach each other on (loopback) and a short DEAR_SOCKET_TIMEOUT_S: DEAR_TRANSPORT=socket
 * fails on every rank with DEAR_ERR_NET within the timeout, and auto goes on over MPI. */
START_TEST(test_unreachable)
{
    double timeout_s = dear_param_double(DEAR_P_SOCKET_TIMEOUT_S);
    setenv("DEAR_TRANSPORT", "socket", 1);
    dear_params_load();
    dear_ctx_t *ctx = NULL;
    double t0 = MPI_Wtime();
    int rc = dear_init(MPI_COMM_WORLD, &ctx);
    double took = MPI_Wtime() - t0;
    ck_assert_msg(all_ok(rc == DEAR_ERR_NET && ctx == NULL), "DEAR_TRANSPORT=socket on an unreachable interface: %d",
                  rc);
    ck_assert_msg(all_ok(took < timeout_s + 5), "dear_init took %.1f s to fail, DEAR_SOCKET_TIMEOUT_S=%g", took,
                  timeout_s);
    setenv("DEAR_TRANSPORT", "auto", 1);
    dear_params_load();
    rc = dear_init(MPI_COMM_WORLD, &ctx);
    unsetenv("DEAR_TRANSPORT");
    dear_params_load();
    ck_assert_msg(all_ok(rc == DEAR_OK), "DEAR_TRANSPORT=auto on an unreachable interface: %d", rc);
    ck_assert_msg(all_ok(strcmp(dear_transport(ctx), "mpi") == 0), "auto fell back to %s, not mpi",
                  dear_transport(ctx));
    ck_assert_msg(all_ok(dear_finalize(&ctx) == DEAR_OK), "dear_finalize after the fallback failed");
}
END_TEST

/* The last test: rank 1 closes its connections while rank 0 waits for a message from it. */
START_TEST(test_peer_gone)
{
    int ok = 1;
    unsigned char buf[128];
    if (g_rank == 0) {
        dear_sock_msg_t *m = NULL;
        ok &= dear_sock_irecv(g_sock, 1, 0, 1, buf, sizeof buf, &m) == DEAR_OK;
        MPI_Barrier(MPI_COMM_WORLD);
        int rc = finish(&m, NULL);
        if (rc != DEAR_ERR_NET) {
            fprintf(stderr, "peer gone: the receive ended with %d, not DEAR_ERR_NET\n", rc);
            ok = 0;
        }
        /* Posting to it now fails at once. */
        ok &= dear_sock_isend(g_sock, 1, 0, 1, buf, sizeof buf, &m) == DEAR_OK && finish(&m, NULL) == DEAR_ERR_NET;
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        if (g_rank == 1) {
            dear_transport_close(g_tp);
            g_tp = NULL;
            g_sock = NULL;
        }
    }
    ck_assert_msg(all_ok(ok), "peer gone: see above");
}
END_TEST

/* --cut: ring all-reduces of 1 MiB on the world, routed through a fabric, until one fails.
 * Rank 0 says "streaming" once 5 went through; every rank says how long after its last good one
 * the failure came, then (1 s later, so that the others can say it too) aborts the job as an
 * application would on a dead peer. */
static int run_cut(void)
{
    enum { COUNT = 1 << 18 };
    dear_net_t *ep = NULL;
    int rc = dear_transport_open(MPI_COMM_WORLD, DEAR_TRANSPORT_SOCKET, 1, &g_tp);
    if (rc == DEAR_OK)
        rc = dear_net_open(g_tp, MPI_COMM_WORLD, &ep);
    if (!all_ok(rc == DEAR_OK)) {
        fprintf(stderr, "test_net --cut: rank %d: the fabric could not be set up: %s\n", g_rank, dear_status_string(rc));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float *v = malloc(sizeof(float) * COUNT);
    double last = dear_now();
    for (long i = 0; v != NULL; i++) {
        for (int k = 0; k < COUNT; k++)
            v[k] = 1.0f;
        dear_coll_args_t a = { .op = DEAR_COLL_ALLREDUCE, .algo = DEAR_ALGO_RING, .dtype = DEAR_FLOAT32,
                               .comm = MPI_COMM_WORLD, .net = ep, .tag = (int)(i % 1000), .scale = 1.0, .recvbuf = v,
                               .count = COUNT };
        dear_coll_req_t *req = NULL;
        rc = dear_coll_start(&a, &req);
        if (rc == DEAR_OK)
            rc = dear_coll_wait(req);
        dear_coll_free(req);
        if (rc != DEAR_OK)
            break;
        last = dear_now();
        if (g_rank == 0 && i == 5) {
            printf("test_net --cut: streaming\n");
            fflush(stdout);
        }
    }
    printf("test_net --cut: rank %d: an all-reduce failed %.1f s after the last one completed: %s\n", g_rank,
           dear_now() - last, dear_status_string(rc));
    fflush(stdout);
    fflush(stderr);
    /* The other ranks' own reports first: the abort would kill them mid-way. */
    dear_sleep(1.0);
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 1;
}

int main(int argc, char **argv)
{
    mpi_suite_init(&argc, &argv, &g_rank, &g_size);
    dear_log_set_rank(g_rank);
    if (dear_params_load() != DEAR_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    if (g_size < 2) {
        fprintf(stderr, "test_net needs at least 2 ranks\n");
        MPI_Finalize();
        return 77;
    }
    Suite *s = suite_create("net");
    TCase *tc = tcase_create("net");
    tcase_set_timeout(tc, 120);
    if (argc > 1 && strcmp(argv[1], "--cut") == 0)
        return run_cut();
    if (argc > 1 && strcmp(argv[1], "--unreachable") == 0) {
        tcase_add_test(tc, test_unreachable);
        suite_add_tcase(s, tc);
        return mpi_suite_run(s, g_rank);
    }
    int rc = dear_transport_open(MPI_COMM_WORLD, DEAR_TRANSPORT_SOCKET, 1, &g_tp);
    if (!all_ok(rc == DEAR_OK)) {
        fprintf(stderr, "rank %d: the socket transport failed: %s\n", g_rank, dear_status_string(rc));
        MPI_Finalize();
        return 1;
    }
    g_sock = g_tp->impl;
    tcase_add_test(tc, test_pairs);
    tcase_add_test(tc, test_matching);
    tcase_add_test(tc, test_stream);
    tcase_add_test(tc, test_truncation);
    tcase_add_test(tc, test_abandon);
    tcase_add_test(tc, test_abandon_midway);
    tcase_add_test(tc, test_rings);
    tcase_add_test(tc, test_subcomm);
    tcase_add_test(tc, test_bad_ifname);
    tcase_add_test(tc, test_peer_gone);
    suite_add_tcase(s, tc);
    rc = mpi_suite_run(s, g_rank);
    dear_transport_close(g_tp);
    return rc;
}
