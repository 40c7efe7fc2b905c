/*
 * The socket transport against a hostile network (collectives/sock.c, docs/DESIGN.md "Trust
 * model"), 3 ranks on one host under mpirun (Check, CK_FORK=no). Each test makes its own fabric;
 * a rogue is played from the test hooks of sock.h with sock_auth.h's records, where a stranger on
 * the network would stand:
 *   - spoofed hellos: what a sniffer captured of rank 1's hello to rank 0, sent back as the old
 *     clear-text hello (the bytes where its key was) claiming rank 2, replayed as captured with
 *     its recorded proof, and replayed claiming rank 2: none gets a slot (each is closed without
 *     a proof), the set-up takes no longer, and every pair's messages arrive whole;
 *   - a rank's claim from the wrong address, made with the job's key: closed before any answer;
 *   - a rank that proves itself twice (the key in a second process), before the rank's own
 *     connection or after it: the set-up fails on every rank, each naming the rank;
 *   - six silent connections to each accepting rank during set-up: it still takes under 3 s;
 *   - a hundred, with the accepting ranks 24 descriptors short of them: the same;
 *   - 72 valid-magic hellos claiming rank 1, from the ranks' host, sent to rank 0 while rank 1's
 *     own connection there waits for its proof: rank 0 runs out of room but never sheds a
 *     connection that may be a rank mid-handshake, so set-up succeeds on every rank;
 *   - a header announcing 8 GiB: the receiver's connection fails at once with DEAR_ERR_NET naming
 *     the peer and the size, and its address space does not grow by it;
 *   - a flood of messages without receives past dear_sock_set_limits's bound fails the
 *     connection the same way, while traffic within the limits goes through;
 *   - a rank of the host that lies in a shared ring's counters (more written than the ring
 *     holds, more read than was written) fails its connection, named, on the rank it lied to;
 *   - rings asked for by some ranks of a host and not by another: TCP for all, said once.
 * Every rank reaches every assertion: local verdicts are combined with MPI_Allreduce first.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "base/util.h"
#include "collectives/sock.h"
#include "collectives/sock_auth.h"
#include "collectives/sock_shm.h"
#include "include/dear.h"
#include "tests/mpi/suite_run.h"

static int g_rank, g_size;

/* ---- the log, captured ------------------------------------------------------------------ */

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_log[1 << 16];

static void capture(const char *line, void *arg)
{
    (void)arg;
    fputs(line, stderr);
    pthread_mutex_lock(&g_log_lock);
    strncat(g_log, line, sizeof g_log - strlen(g_log) - 1);
    pthread_mutex_unlock(&g_log_lock);
}

static void log_reset(void)
{
    pthread_mutex_lock(&g_log_lock);
    g_log[0] = '\0';
    pthread_mutex_unlock(&g_log_lock);
}

static int log_has(const char *what)
{
    pthread_mutex_lock(&g_log_lock);
    int found = strstr(g_log, what) != NULL;
    pthread_mutex_unlock(&g_log_lock);
    return found;
}

/* ---- helpers ---------------------------------------------------------------------------- */

/* 1 when every rank passes ok. */
static int all_ok(int ok)
{
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

static double slowest(double t)
{
    double all = 0;
    MPI_Allreduce(&t, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

/* A fabric over the world with hooks h (NULL: none); *took its set-up's seconds. */
static int create(const dear_sock_hooks_t *h, double timeout_s, dear_sock_t **s, double *took)
{
    dear_sock_set_hooks(h);
    double t0 = dear_now();
    int rc = dear_sock_create(MPI_COMM_WORLD, "", timeout_s, s);
    *took = dear_now() - t0;
    dear_sock_set_hooks(NULL);
    return rc;
}

/* Drive s until *msg completes or limit_s passes (DEAR_ERR_TIMEOUT). */
static int finish(dear_sock_t *s, dear_sock_msg_t **msg, double limit_s)
{
    double t0 = dear_now();
    for (;;) {
        int flag = 0, rc = dear_sock_test(s, msg, &flag, NULL);
        if (rc != DEAR_OK || flag)
            return rc;
        if (dear_now() - t0 > limit_s) {
            dear_sock_abandon(s, msg);
            return DEAR_ERR_TIMEOUT;
        }
        dear_sock_block(s, 0.01);
    }
}

/* Drive *msg to its end: 1 when it failed with DEAR_ERR_NET, as a connection a peer broke must;
 * else 0, saying what `what` ended with. */
static int fails_net(dear_sock_t *s, dear_sock_msg_t **msg, const char *what)
{
    int rc = finish(s, msg, 5);
    if (rc != DEAR_ERR_NET)
        fprintf(stderr, "%s ended with %d, not DEAR_ERR_NET\n", what, rc);
    return rc == DEAR_ERR_NET;
}

/* create, with DEAR_SOCKET_SHM_BYTES=bytes on this rank for its set-up alone. */
static int create_rings(const char *bytes, dear_sock_t **s)
{
    double took;
    setenv("DEAR_SOCKET_SHM_BYTES", bytes, 1);
    dear_params_load();
    int rc = create(NULL, 20, s, &took);
    unsetenv("DEAR_SOCKET_SHM_BYTES");
    dear_params_load();
    return rc;
}

/* Every rank sends every other one 100 KiB of its pattern and checks what arrives: 1 when all
 * of it did, on this rank. */
static int pairs_ok(dear_sock_t *s)
{
    enum { N = 100 * 1024 };
    int ok = 1;
    unsigned char *out = malloc(N), *in = malloc((size_t)N * (size_t)g_size);
    dear_sock_msg_t **r = calloc((size_t)g_size, sizeof *r), **w = calloc((size_t)g_size, sizeof *w);
    for (int i = 0; i < N; i++)
        out[i] = (unsigned char)(g_rank * 37 + i);
    for (int p = 0; p < g_size; p++)
        if (p != g_rank) {
            ok &= dear_sock_irecv(s, p, 0, 1, in + (size_t)p * N, N, &r[p]) == DEAR_OK;
            ok &= dear_sock_isend(s, p, 0, 1, out, N, &w[p]) == DEAR_OK;
        }
    for (int p = 0; p < g_size; p++)
        if (p != g_rank) {
            int rr = finish(s, &r[p], 5), rw = finish(s, &w[p], 5);
            int bad = 0;
            for (int i = 0; rr == DEAR_OK && i < N; i++)
                bad += in[(size_t)p * N + (size_t)i] != (unsigned char)(p * 37 + i);
            if (rr != DEAR_OK || rw != DEAR_OK || bad) {
                fprintf(stderr, "rank %d: with rank %d: receive %d, send %d, %d bytes wrong\n", g_rank, p, rr, rw, bad);
                ok = 0;
            }
        }
    free(out);
    free(in);
    free(r);
    free(w);
    return ok;
}

/* A blocking TCP connection to `to`, from address `from` when not NULL; -1 on failure. */
static int raw_connect(const struct sockaddr_in *to, const struct in_addr *from)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (from) {
        struct sockaddr_in me = { .sin_family = AF_INET, .sin_addr = *from };
        if (bind(fd, (struct sockaddr *)&me, sizeof me) != 0) {
            close(fd);
            return -1;
        }
    }
    if (connect(fd, (const struct sockaddr *)to, sizeof *to) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Read up to n bytes within limit_s: the count read (short when the peer closed), or -1 when
 * the time ran out with the connection still open. */
static ssize_t read_within(int fd, void *buf, size_t n, double limit_s)
{
    size_t got = 0;
    double t0 = dear_now();
    while (got < n) {
        double left = limit_s - (dear_now() - t0);
        struct pollfd pf = { .fd = fd, .events = POLLIN };
        if (left <= 0 || poll(&pf, 1, (int)(left * 1e3) + 1) <= 0)
            return -1;
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r <= 0)
            return (ssize_t)got;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* 1 when the other end closes fd within limit_s (whatever it sent first is read and dropped). */
static int closed_within(int fd, double limit_s)
{
    char sink[256];
    double t0 = dear_now();
    for (;;) {
        ssize_t r = read_within(fd, sink, sizeof sink, limit_s - (dear_now() - t0));
        if (r < 0)
            return 0;
        if (r < (ssize_t)sizeof sink)
            return 1;
    }
}

/* The connecting side of the handshake, as a rogue holding the key: 1 when the acceptor
 * answered with a valid proof (it took us for rank `from`), 0 when it closed first. */
static int rogue_handshake(int fd, const unsigned char *key, int from, int to)
{
    dear_sock_hello_t h = { .from = from, .to = to };
    unsigned char rec[DEAR_SOCK_ANSWER_BYTES];
    dear_sock_random(h.nonce, sizeof h.nonce);
    dear_sock_hello_pack(&h, rec);
    if (send(fd, rec, DEAR_SOCK_HELLO_BYTES, MSG_NOSIGNAL) != DEAR_SOCK_HELLO_BYTES)
        return 0;
    if (read_within(fd, rec, DEAR_SOCK_ANSWER_BYTES, 5) != DEAR_SOCK_ANSWER_BYTES)
        return 0;
    if (!dear_sock_proof_ok(key, DEAR_SOCK_BY_ACCEPTOR, from, to, h.nonce, rec, rec + DEAR_SOCK_NONCE_BYTES))
        return 0;
    unsigned char proof[DEAR_SOCK_PROOF_BYTES];
    dear_sock_proof(key, DEAR_SOCK_BY_CONNECTOR, from, to, h.nonce, rec, proof);
    return send(fd, proof, sizeof proof, MSG_NOSIGNAL) == (ssize_t)sizeof proof;
}

/* ---- spoofed hellos --------------------------------------------------------------------- */

/* What rank 1 saw go out to rank 0, and the rogue's connections made from it. */
typedef struct {
    struct sockaddr_in rank0;
    int forged_old, replayed, reclaimed;  /* the rogue's connections, -1 when none */
    unsigned char hello[DEAR_SOCK_HELLO_BYTES];
} spoof_t;

static void spoof_before(void *arg, const dear_sock_setup_view_t *v)
{
    spoof_t *sp = arg;
    sp->rank0 = v->addrs[0];
    /* Rank 2 comes late, so that a rogue claiming its rank is first in rank 0's queue. */
    if (v->rank == 2)
        dear_sleep(0.3);
}

/* Rank 1's records to rank 0, captured as they leave; the rogue acts on them at once. */
static void spoof_tap(void *arg, int to, const void *rec, size_t len)
{
    spoof_t *sp = arg;
    if (g_rank != 1 || to != 0)
        return;
    if (len == DEAR_SOCK_HELLO_BYTES && sp->forged_old < 0) {
        memcpy(sp->hello, rec, len);
        /* The clear-text hello of old: magic, the key, the rank. A sniffer took "the key" from
         * where it used to travel. */
        struct {
            uint64_t magic, key;
            int32_t rank, pad;
        } old = { 0x64656172736f636bULL, 0, 2, 0 };
        memcpy(&old.key, (const unsigned char *)rec + 8, sizeof old.key);
        sp->forged_old = raw_connect(&sp->rank0, NULL);
        if (sp->forged_old >= 0)
            send(sp->forged_old, &old, sizeof old, MSG_NOSIGNAL);
        /* The hello as captured, and claiming rank 2. */
        sp->replayed = raw_connect(&sp->rank0, NULL);
        if (sp->replayed >= 0)
            send(sp->replayed, rec, len, MSG_NOSIGNAL);
        unsigned char moved[DEAR_SOCK_HELLO_BYTES];
        memcpy(moved, rec, len);
        moved[8] = 2;
        sp->reclaimed = raw_connect(&sp->rank0, NULL);
        if (sp->reclaimed >= 0)
            send(sp->reclaimed, moved, len, MSG_NOSIGNAL);
    } else if (len == DEAR_SOCK_PROOF_BYTES && sp->replayed >= 0) {
        /* The proof rank 1 made for its own connection, replayed on the rogue's. */
        char answer[DEAR_SOCK_ANSWER_BYTES];
        if (read_within(sp->replayed, answer, sizeof answer, 2) == (ssize_t)sizeof answer)
            send(sp->replayed, rec, len, MSG_NOSIGNAL);
    }
}

START_TEST(test_spoofed_hellos)
{
    spoof_t sp = { .forged_old = -1, .replayed = -1, .reclaimed = -1 };
    dear_sock_hooks_t h = { .before_connect = spoof_before, .tap = spoof_tap, .arg = &sp };
    dear_sock_t *s = NULL;
    double took;
    log_reset();
    int rc = create(&h, 20, &s, &took);
    ck_assert_msg(all_ok(rc == DEAR_OK), "set-up under spoofed hellos: %d", rc);
    double t = slowest(took);
    ck_assert_msg(t < 3, "set-up under spoofed hellos took %.1f s", t);
    int ok = 1;
    if (g_rank == 1) {
        int fds[3] = { sp.forged_old, sp.replayed, sp.reclaimed };
        const char *what[3] = { "the old clear-text hello", "the replayed hello and proof", "the hello moved to rank 2" };
        for (int i = 0; i < 3; i++)
            if (fds[i] < 0 || !closed_within(fds[i], 2)) {
                fprintf(stderr, "spoof: %s was %s\n", what[i], fds[i] < 0 ? "never sent" : "kept open by rank 0");
                ok = 0;
            }
    }
    if (g_rank == 0)
        ok &= log_has("turned away a connection");
    ck_assert_msg(all_ok(ok), "spoofed hellos: a rogue connection was kept (see above)");
    ck_assert_msg(all_ok(pairs_ok(s)), "spoofed hellos: the ranks' messages went astray (see above)");
    for (int i = 0; i < 3; i++) {
        int fd = i == 0 ? sp.forged_old : i == 1 ? sp.replayed : sp.reclaimed;
        if (fd >= 0)
            close(fd);
    }
    dear_sock_destroy(s);
}
END_TEST

/* ---- the wrong address, with the key ----------------------------------------------------- */

typedef struct {
    int fd, proved, answered_bytes;
} wrong_t;

/* A loopback address other than a: the rogue's "other host". */
static struct in_addr elsewhere(struct in_addr a)
{
    struct in_addr e;
    inet_pton(AF_INET, "127.0.0.2", &e);
    if (e.s_addr == a.s_addr)
        inet_pton(AF_INET, "127.0.0.3", &e);
    return e;
}

static void wrong_before(void *arg, const dear_sock_setup_view_t *v)
{
    wrong_t *w = arg;
    if (v->rank != 2)
        return;
    struct in_addr from = elsewhere(v->addrs[2].sin_addr);
    w->fd = raw_connect(&v->addrs[0], &from);
    if (w->fd < 0)
        return;
    dear_sock_hello_t hh = { .from = 2, .to = 0 };
    unsigned char rec[DEAR_SOCK_ANSWER_BYTES];
    dear_sock_random(hh.nonce, sizeof hh.nonce);
    dear_sock_hello_pack(&hh, rec);
    send(w->fd, rec, DEAR_SOCK_HELLO_BYTES, MSG_NOSIGNAL);
    w->answered_bytes = (int)read_within(w->fd, rec, sizeof rec, 3);
    w->proved = w->answered_bytes == DEAR_SOCK_ANSWER_BYTES &&
                dear_sock_proof_ok(v->key, DEAR_SOCK_BY_ACCEPTOR, 2, 0, hh.nonce, rec, rec + DEAR_SOCK_NONCE_BYTES);
    if (w->proved) {
        unsigned char proof[DEAR_SOCK_PROOF_BYTES];
        dear_sock_proof(v->key, DEAR_SOCK_BY_CONNECTOR, 2, 0, hh.nonce, rec, proof);
        send(w->fd, proof, sizeof proof, MSG_NOSIGNAL);
    }
}

START_TEST(test_wrong_address)
{
    wrong_t w = { .fd = -1, .answered_bytes = -2 };
    dear_sock_hooks_t h = { .before_connect = wrong_before, .arg = &w };
    dear_sock_t *s = NULL;
    double took;
    log_reset();
    int rc = create(&h, 20, &s, &took);
    ck_assert_msg(all_ok(rc == DEAR_OK), "set-up beside a rogue on another address: %d", rc);
    int ok = 1;
    if (g_rank == 2 && (w.fd < 0 || w.answered_bytes != 0)) {
        fprintf(stderr, "wrong address: the rogue %s (answer of %d bytes, proof %s)\n",
                w.fd < 0 ? "could not connect" : "was answered", w.answered_bytes, w.proved ? "valid" : "none");
        ok = 0;
    }
    if (g_rank == 0)
        ok &= log_has("from 127.0.0.");
    ck_assert_msg(all_ok(ok), "wrong address: the rogue was not refused before any answer (see above)");
    ck_assert_msg(all_ok(pairs_ok(s)), "wrong address: the ranks' messages went astray (see above)");
    if (w.fd >= 0)
        close(w.fd);
    dear_sock_destroy(s);
}
END_TEST

/* ---- a rank twice ------------------------------------------------------------------------ */

/* A second process with the key, on rank 2's own address: first in line (before rank 2's own
 * connection), or after it, while rank 0 still waits for rank 1. */
typedef struct {
    int late, fd;
    struct sockaddr_in to, from;
    unsigned char key[DEAR_SOCK_KEY_BYTES];
    pthread_t thread;
    int started;
} twice_t;

static void *twice_late(void *arg)
{
    twice_t *tw = arg;
    dear_sleep(0.1);
    tw->fd = raw_connect(&tw->to, &tw->from.sin_addr);
    if (tw->fd >= 0 && !rogue_handshake(tw->fd, tw->key, 2, 0)) {
        close(tw->fd);
        tw->fd = -1;
    }
    return NULL;
}

static void twice_before(void *arg, const dear_sock_setup_view_t *v)
{
    twice_t *tw = arg;
    if (v->rank == 1 && tw->late)
        dear_sleep(0.6);
    if (v->rank != 2)
        return;
    tw->to = v->addrs[0];
    tw->from = v->addrs[2];
    memcpy(tw->key, v->key, sizeof tw->key);
    if (tw->late) {
        tw->started = pthread_create(&tw->thread, NULL, twice_late, tw) == 0;
        return;
    }
    tw->fd = raw_connect(&v->addrs[0], &v->addrs[2].sin_addr);
    if (tw->fd >= 0 && !rogue_handshake(tw->fd, v->key, 2, 0)) {
        close(tw->fd);
        tw->fd = -1;
    }
}

START_TEST(test_rank_twice)
{
    for (int late = 0; late < 2; late++) {
        twice_t tw = { .late = late, .fd = -1 };
        dear_sock_hooks_t h = { .before_connect = twice_before, .arg = &tw };
        dear_sock_t *s = NULL;
        double took;
        log_reset();
        int rc = create(&h, 20, &s, &took);
        if (tw.started)
            pthread_join(tw.thread, NULL);
        const char *order = late ? "second" : "first";
        ck_assert_msg(all_ok(rc == DEAR_ERR_AUTH && s == NULL), "rank 2 twice (the other %s): set-up returned %d",
                      order, rc);
        double t = slowest(took);
        ck_assert_msg(t < 5, "rank 2 twice (the other %s): the set-up took %.1f s to fail", order, t);
        ck_assert_msg(all_ok(g_rank != 2 || tw.fd >= 0), "the other rank 2 (%s) did not get through the handshake",
                      order);
        ck_assert_msg(all_ok(log_has("rank 2 connected twice")), "a rank's log does not name rank 2 (the other %s)",
                      order);
        if (late)
            ck_assert_msg(all_ok(g_rank != 0 || log_has("rank 2 connected to rank 0 (")),
                          "rank 0 did not see the second rank 2 itself");
        if (tw.fd >= 0)
            close(tw.fd);
    }
}
END_TEST

/* ---- silent strays ----------------------------------------------------------------------- */

/* The last rank's silent connections to each other rank, from the ranks' own address: they get
 * past the address check and say nothing. */
#define MAX_STRAYS 100

typedef struct {
    int per_rank;
    int fds[2 * MAX_STRAYS];    /* to ranks 0 and 1 */
} strays_t;

static void strays_before(void *arg, const dear_sock_setup_view_t *v)
{
    strays_t *st = arg;
    if (v->rank != v->size - 1)
        return;
    for (int p = 0; p < v->size - 1 && p < 2; p++)
        for (int i = 0; i < st->per_rank; i++)
            st->fds[p * MAX_STRAYS + i] = raw_connect(&v->addrs[p], NULL);
}

/* A set-up among per_rank strays to each accepting rank, each of which may open `spare`
 * descriptors beyond those it holds (0: no limit), must succeed within 3 s and carry the
 * ranks' messages. */
static void set_up_among_strays(int per_rank, int spare, const char *what)
{
    static strays_t st;
    st.per_rank = per_rank;
    for (int i = 0; i < 2 * MAX_STRAYS; i++)
        st.fds[i] = -1;
    struct rlimit was;
    getrlimit(RLIMIT_NOFILE, &was);
    if (spare > 0 && g_rank < g_size - 1) {
        int held = 0;
        for (int fd = 0; fd < 4096; fd++)
            held += fcntl(fd, F_GETFD) != -1;
        struct rlimit low = was;
        low.rlim_cur = (rlim_t)(held + spare);
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    }
    dear_sock_hooks_t h = { .before_connect = strays_before, .arg = &st };
    dear_sock_t *s = NULL;
    double took;
    int rc = create(&h, 20, &s, &took);
    setrlimit(RLIMIT_NOFILE, &was);
    double t = slowest(took);
    ck_assert_msg(all_ok(rc == DEAR_OK), "set-up %s: %d (in %.1f s)", what, rc, t);
    ck_assert_msg(t < 3, "set-up %s took %.1f s", what, t);
    int made = 0;
    for (int i = 0; i < 2 * MAX_STRAYS; i++)
        made += st.fds[i] >= 0;
    ck_assert_msg(all_ok(g_rank != g_size - 1 || made == 2 * per_rank), "%s: only %d strays connected", what, made);
    ck_assert_msg(all_ok(pairs_ok(s)), "%s: the ranks' messages went astray (see above)", what);
    for (int i = 0; i < 2 * MAX_STRAYS; i++)
        if (st.fds[i] >= 0)
            close(st.fds[i]);
    dear_sock_destroy(s);
}

START_TEST(test_silent_strays)
{
    set_up_among_strays(6, 0, "with 6 silent strays per rank");
}
END_TEST

/* 24 descriptors short of 100 strangers: set-up sheds them. */
START_TEST(test_descriptor_flood)
{
    set_up_among_strays(MAX_STRAYS, 24, "with its descriptors taken by strangers");
}
END_TEST

/* ---- a flood of hellos while a rank's handshake is in flight ------------------------------ */

/* More than rank 0 holds at once (64 strangers beyond the ranks' own). */
#define HELLO_FLOOD 72

typedef struct {
    struct sockaddr_in rank0;
    int fds[HELLO_FLOOD];
    int answered;               /* flood connections rank 0 answered before rank 1's proof left */
} hflood_t;

static void hflood_before(void *arg, const dear_sock_setup_view_t *v)
{
    hflood_t *hf = arg;
    hf->rank0 = v->addrs[0];
}

/* Rank 1, about to send rank 0 its proof (rank 0 has answered its hello and waits for it):
 * valid-magic hellos claiming rank 1 itself, from this host's address, as any local user could
 * send, each answered by rank 0 while rank 1's own connection waits for its proof. Which of
 * them is rank 1 only a proof can tell. */
static void hflood_tap(void *arg, int to, const void *rec, size_t len)
{
    hflood_t *hf = arg;
    (void)rec;
    if (g_rank != 1 || to != 0 || len != DEAR_SOCK_PROOF_BYTES)
        return;
    for (int i = 0; i < HELLO_FLOOD; i++) {
        dear_sock_hello_t h = { .from = 1, .to = 0 };
        unsigned char hello[DEAR_SOCK_HELLO_BYTES];
        dear_sock_random(h.nonce, sizeof h.nonce);
        dear_sock_hello_pack(&h, hello);
        hf->fds[i] = raw_connect(&hf->rank0, NULL);
        if (hf->fds[i] >= 0)
            send(hf->fds[i], hello, sizeof hello, MSG_NOSIGNAL);
    }
    /* Rank 0 answers what it takes in; give it a moment for each, then let the proof go. */
    double t0 = dear_now();
    for (int i = 0; i < HELLO_FLOOD && dear_now() - t0 < 2; i++) {
        unsigned char answer[DEAR_SOCK_ANSWER_BYTES];
        if (hf->fds[i] >= 0 && read_within(hf->fds[i], answer, sizeof answer, 0.2) == (ssize_t)sizeof answer)
            hf->answered++;
    }
}

/* The flood makes rank 0 run out of room while rank 1's connection, answered, waits for its
 * proof. Rank 1 counts itself connected once the proof is sent, so rank 0 must not shed that
 * connection: set-up succeeds on every rank, and the ranks' messages arrive. */
START_TEST(test_hello_flood_in_handshake)
{
    static hflood_t hf;
    memset(&hf, 0, sizeof hf);
    for (int i = 0; i < HELLO_FLOOD; i++)
        hf.fds[i] = -1;
    dear_sock_hooks_t h = { .before_connect = hflood_before, .tap = hflood_tap, .arg = &hf };
    dear_sock_t *s = NULL;
    double took;
    log_reset();
    int rc = create(&h, 15, &s, &took);
    double t = slowest(took);
    ck_assert_msg(all_ok(g_rank != 1 || hf.answered > 0), "rank 0 answered none of the flood's hellos");
    ck_assert_msg(all_ok(rc == DEAR_OK), "set-up with a flood of hellos during rank 1's handshake: %d (in %.1f s)",
                  rc, t);
    ck_assert_msg(all_ok(g_rank != 0 || log_has("new connections wait")),
                  "rank 0 did not say it held its queue for the connections that may be ranks'");
    ck_assert_msg(t < 12, "set-up among the flood took %.1f s", t);
    ck_assert_msg(all_ok(pairs_ok(s)), "among the flood: the ranks' messages went astray (see above)");
    for (int i = 0; i < HELLO_FLOOD; i++)
        if (hf.fds[i] >= 0)
            close(hf.fds[i]);
    dear_sock_destroy(s);
}
END_TEST

/* ---- lengths a peer claims ---------------------------------------------------------------- */

static size_t vm_size(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %zu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* Rank 0 sends rank 1 a message of 8 GiB (read-only zero pages: nothing is committed for it) while
 * rank 1 waits for another tag: rank 1's connection fails at the header. */
START_TEST(test_huge_header)
{
    const size_t huge = (size_t)8 << 30;
    dear_sock_t *s = NULL;
    double took;
    ck_assert(all_ok(create(NULL, 20, &s, &took) == DEAR_OK));
    log_reset();
    int ok = 1;
    if (g_rank == 0) {
        void *zeros = mmap(NULL, huge, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        ck_assert(zeros != MAP_FAILED);
        dear_sock_msg_t *m = NULL;
        ok &= dear_sock_isend(s, 1, 0, 2, zeros, huge, &m) == DEAR_OK;
        ok &= fails_net(s, &m, "huge header: the sender's send");
        munmap(zeros, huge);
    } else if (g_rank == 1) {
        size_t before = vm_size();
        char small[64];
        dear_sock_msg_t *m = NULL;
        ok &= dear_sock_irecv(s, 0, 0, 1, small, sizeof small, &m) == DEAR_OK;
        double t0 = dear_now();
        int rc = finish(s, &m, 5);
        double t = dear_now() - t0;
        size_t grew = vm_size() - before;
        if (rc != DEAR_ERR_NET || t > 2 || grew > ((size_t)1 << 30)) {
            fprintf(stderr, "huge header: the receive ended with %d after %.1f s, the address space grew %zu MiB\n", rc,
                    t, grew >> 20);
            ok = 0;
        }
        ok &= log_has("connection to rank 0 (") && log_has("8589934592 bytes");
    }
    ck_assert_msg(all_ok(ok), "huge header: see above");
    dear_sock_destroy(s);
}
END_TEST

/* Limits of 1 MiB per message and 4 MiB queued: 3 MiB sent ahead of its receives arrives; then
 * 64 messages of 128 KiB that nobody receives fail rank 1's connection to rank 0. */
START_TEST(test_unexpected_flood)
{
    enum { PIECE = 128 * 1024, AHEAD = 24, FLOOD = 64 };
    dear_sock_t *s = NULL;
    double took;
    ck_assert(all_ok(create(NULL, 20, &s, &took) == DEAR_OK));
    dear_sock_set_limits(s, (size_t)1 << 20, (size_t)4 << 20);
    log_reset();
    unsigned char *buf = calloc(AHEAD, PIECE);
    dear_sock_msg_t *m[FLOOD] = { 0 };
    int ok = 1;
    /* Within the limits: sent before any receive is posted, which waits until they arrived. */
    if (g_rank == 0)
        for (int i = 0; i < AHEAD; i++)
            ok &= dear_sock_isend(s, 1, 0, 3, buf, PIECE, &m[i]) == DEAR_OK;
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
        for (int i = 0; i < AHEAD; i++)
            ok &= finish(s, &m[i], 5) == DEAR_OK;
    } else if (g_rank == 1) {
        for (double t0 = dear_now(); dear_now() - t0 < 0.3;)
            dear_sock_block(s, 0.01);
        for (int i = 0; i < AHEAD; i++)
            ok &= dear_sock_irecv(s, 0, 0, 3, buf + (size_t)i * PIECE, PIECE, &m[i]) == DEAR_OK &&
                  finish(s, &m[i], 5) == DEAR_OK;
    }
    ck_assert_msg(all_ok(ok), "3 MiB sent ahead of their receives, within a 4 MiB bound, did not arrive");
    /* The flood. */
    if (g_rank == 0) {
        for (int i = 0; i < FLOOD; i++)
            ok &= dear_sock_isend(s, 1, 0, 4, buf, PIECE, &m[i]) == DEAR_OK;
        for (int i = 0; i < FLOOD; i++)
            finish(s, &m[i], 5);
    } else if (g_rank == 1) {
        char small[64];
        dear_sock_msg_t *r = NULL;
        ok &= dear_sock_irecv(s, 0, 0, 5, small, sizeof small, &r) == DEAR_OK;
        ok &= fails_net(s, &r, "flood: the receive");
        ok &= log_has("connection to rank 0 (") && log_has("past the bound of 4194304");
    }
    ck_assert_msg(all_ok(ok), "unexpected flood: see above");
    free(buf);
    dear_sock_destroy(s);
}
END_TEST

/* A peer of this host that lies in the shared ring's counters: rank 0 claims to have written
 * twice what the ring 0 -> 1 holds, after a message of 100 bytes; rank 1's connection to it
 * fails, naming the ring, before anything is read past the ring. Then rank 2 claims to have read
 * more of the ring 1 -> 2 than rank 1 wrote: rank 1's next send to it fails the same way. */
START_TEST(test_ring_lies)
{
    dear_sock_t *s = NULL;
    ck_assert(all_ok(create_rings("4m", &s) == DEAR_OK));
    if (!all_ok(dear_sock_ring_peers(s) == g_size - 1)) {
        dear_sock_destroy(s);
        ck_assert_msg(0, "ring lies: the ranks of this host have no rings");
    }
    log_reset();
    int ok = 1;
    unsigned char msg[100] = { 1 }, in[100];
    dear_sock_msg_t *m = NULL;
    if (g_rank == 0) {
        dear_ring_t *r = dear_sock_ring(s, 1, 1);
        ok &= dear_sock_isend(s, 1, 0, 1, msg, sizeof msg, &m) == DEAR_OK && finish(s, &m, 5) == DEAR_OK;
        dear_ring_claim(r, sizeof msg + 2 * dear_ring_bytes(r), 1);
    } else if (g_rank == 2) {
        dear_ring_claim(dear_sock_ring(s, 1, 0), (uint64_t)1 << 40, 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 1) {
        ok &= dear_sock_irecv(s, 0, 0, 1, in, sizeof in, &m) == DEAR_OK;
        ok &= fails_net(s, &m, "ring lies: the receive from the lying writer");
        ok &= log_has("connection to rank 0 (") && log_has("more bytes in its shared-memory ring than the");
        ok &= dear_sock_isend(s, 2, 0, 2, msg, sizeof msg, &m) == DEAR_OK;
        ok &= fails_net(s, &m, "ring lies: the send to the lying reader");
        ok &= log_has("connection to rank 2 (") && log_has("read more of its shared-memory ring than was written");
    }
    ck_assert_msg(all_ok(ok), "ring lies: see above");
    dear_sock_destroy(s);
}
END_TEST

/* Rings asked for by ranks 0 and 2 but not by rank 1: the host keeps TCP on every rank, rank 0
 * says so once, and a message between the two that asked still arrives (over TCP). */
START_TEST(test_rings_mixed)
{
    dear_sock_t *s = NULL;
    log_reset();
    ck_assert(all_ok(create_rings(g_rank == 1 ? "0" : "4m", &s) == DEAR_OK));
    int ok = dear_sock_ring_peers(s) == 0;
    if (g_rank == 0)
        ok &= log_has("1 of the 3 ranks of this host made no rings");
    unsigned char out[100] = { 7 }, in[100] = { 0 };
    dear_sock_msg_t *m = NULL;
    if (g_rank == 0)
        ok &= dear_sock_isend(s, 2, 0, 1, out, sizeof out, &m) == DEAR_OK && finish(s, &m, 5) == DEAR_OK;
    else if (g_rank == 2)
        ok &= dear_sock_irecv(s, 0, 0, 1, in, sizeof in, &m) == DEAR_OK && finish(s, &m, 5) == DEAR_OK &&
              memcmp(in, out, sizeof in) == 0;
    ck_assert_msg(all_ok(ok), "rings asked for by some ranks of a host: not TCP for all, not said, or lost");
    dear_sock_destroy(s);
}
END_TEST

int main(int argc, char **argv)
{
    mpi_suite_init(&argc, &argv, &g_rank, &g_size);
    dear_log_set_rank(g_rank);
    if (dear_params_load() != DEAR_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    dear_log_set_sink(capture, NULL);
    Suite *s = suite_create("sock_guard");
    TCase *tc = tcase_create("sock_guard");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_spoofed_hellos);
    tcase_add_test(tc, test_wrong_address);
    tcase_add_test(tc, test_rank_twice);
    tcase_add_test(tc, test_silent_strays);
    tcase_add_test(tc, test_descriptor_flood);
    tcase_add_test(tc, test_hello_flood_in_handshake);
    tcase_add_test(tc, test_huge_header);
    tcase_add_test(tc, test_unexpected_flood);
    tcase_add_test(tc, test_ring_lies);
    tcase_add_test(tc, test_rings_mixed);
    suite_add_tcase(s, tc);
    return mpi_suite_run(s, g_rank);
}
