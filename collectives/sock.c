/*
 * The socket transport (sock.h): connection set-up over MPI, then framed messages on one TCP
 * connection per pair, moved by non-blocking reads and writes that an epoll set says are ready.
 * Set-up runs every connection of a rank at once in one poll loop, each through the handshake
 * of sock_auth.h with a deadline of its own, so that nothing a stranger does delays a rank.
 *
 * A message on the wire is a 16-byte header (context, tag, length; little-endian as the
 * sender's memory is: every rank of a job runs the same build) and its payload. Per peer there
 * is a send queue (the head may be partly written), the receives posted and not yet matched,
 * the messages that arrived before their receive ("unexpected", with buffers of their own), and
 * the one message whose payload is being read now (cur). Everything is under the fabric's lock.
 *
 * Between ranks of one host the payloads go through shared-memory rings instead (sock_shm.h):
 * the connection then carries headers and doorbells only, and the messages whose headers came
 * take their payloads from the ring in header order (rhead..rtail) rather than from cur.
 */
#include "collectives/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mpi_check.h"
#include "base/params.h"
#include "base/sync.h"
#include "base/util.h"
#include "collectives/sock_auth.h"
#include "collectives/sock_shm.h"

#define HDR_BYTES 16
#define MAX_EVENTS 64
#define DISCARD_BYTES 65536
/* The eventfd's epoll tag: peer indices are below it. */
#define POKE_TAG UINT64_MAX
/* A header in this context is a doorbell (sock_shm.h): look at the rings with its sender. */
#define BELL_CTX UINT32_MAX
/* Frames staged for a ring pair's connection: a few headers and one doorbell. */
#define CTL_BYTES (4 * HDR_BYTES)

enum { MSG_SEND, MSG_RECV, MSG_UNEXPECTED };
enum { ST_PENDING, ST_DONE, ST_FAILED };

struct dear_sock_msg {
    struct dear_sock_msg *next;
    int kind, state, peer;
    uint32_t ctx;
    int32_t tag;
    char *buf;
    size_t cap;         /* send: payload bytes; receive: room in buf */
    size_t len;         /* payload bytes on the wire (a receive learns it from the header) */
    size_t off;         /* send: header and payload bytes written; receive: payload bytes read */
    unsigned char hdr[HDR_BYTES];
    int owned;          /* buf is ours to free (unexpected, or a copy of an abandoned send) */
    int orphan;         /* nobody will test it: free it when it completes */
    int truncated;      /* longer than its receive: the payload is read and dropped */
    struct dear_sock_msg *rnext; /* the next message whose payload comes through the ring */
};

typedef struct {
    dear_sock_msg_t *head, *tail;
} queue_t;

typedef struct {
    int fd;
    int failed;
    int want_out;               /* EPOLLOUT is in the epoll set */
    queue_t sendq;              /* head: the message being written */
    queue_t posted;             /* receives without a message yet */
    queue_t unexpected;         /* messages without a receive yet, arrived or arriving */
    size_t unexpected_bytes;    /* what they hold: payloads plus DEAR_SOCK_MSG_COST each */
    dear_sock_msg_t *cur;       /* the message whose payload is being read, or NULL */
    unsigned char rhdr[HDR_BYTES];
    size_t rhdr_got;
    char addr[24];              /* its listening address, for messages */
    /* A peer of this host (sock_shm.h): payloads go through rings, headers on the connection. */
    dear_ring_t *rin, *rout;
    dear_sock_msg_t *rhead, *rtail; /* messages whose headers came, their payloads to read in order */
    unsigned char ctl[CTL_BYTES];   /* frames to send: ctl[ctl_off..ctl_len) */
    size_t ctl_off, ctl_len;
    size_t bell_end;                /* a doorbell is staged and unsent while ctl_off < bell_end */
} peer_t;

struct dear_sock {
    pthread_mutex_t lock;
    int rank, size;
    int ep, poke_fd;
    peer_t *peers;
    char *discard;
    uint64_t messages, timeouts;
    size_t max_message, max_unexpected; /* dear_sock_set_limits */
    double dead_s;                      /* DEAR_SOCKET_DEAD_S */
    dear_shm_t *shm;                    /* rings with the ranks of this host, or NULL */
    char address[64];
};

/* ---- queues ---------------------------------------------------------------------------- */

static void q_push(queue_t *q, dear_sock_msg_t *m)
{
    m->next = NULL;
    if (q->tail)
        q->tail->next = m;
    else
        q->head = m;
    q->tail = m;
}

/* Unlink m (present in q). */
static void q_remove(queue_t *q, dear_sock_msg_t *m)
{
    dear_sock_msg_t **link = &q->head, *prev = NULL;
    while (*link && *link != m) {
        prev = *link;
        link = &(*link)->next;
    }
    if (*link == NULL)
        return;
    *link = m->next;
    if (q->tail == m)
        q->tail = prev;
    m->next = NULL;
}

/* The first message of q with this context and tag, or NULL. */
static dear_sock_msg_t *q_match(const queue_t *q, uint32_t ctx, int32_t tag)
{
    for (dear_sock_msg_t *m = q->head; m; m = m->next)
        if (m->ctx == ctx && m->tag == tag)
            return m;
    return NULL;
}

static int q_has(const queue_t *q, const dear_sock_msg_t *m)
{
    for (const dear_sock_msg_t *x = q->head; x; x = x->next)
        if (x == m)
            return 1;
    return 0;
}

static void msg_free(dear_sock_msg_t *m)
{
    if (m->owned)
        free(m->buf);
    free(m);
}

/* A message reached its end (done or failed): its tester learns it, or, orphaned, it goes. */
static void msg_finish(dear_sock_t *s, dear_sock_msg_t *m, int state)
{
    m->state = state;
    if (state == ST_DONE)
        s->messages++;
    if (m->orphan)
        msg_free(m);
}

/* ---- failures -------------------------------------------------------------------------- */

/* The connection to peer p is unusable: every message it carries or would carry fails. */
static void peer_fail(dear_sock_t *s, int p, const char *what, int err)
{
    peer_t *pe = &s->peers[p];
    if (pe->failed)
        return;
    pe->failed = 1;
    if (err == ETIMEDOUT)
        /* TCP_USER_TIMEOUT or keepalive gave up: the peer's kernel acknowledged nothing. */
        DEAR_ERROR("sock", "connection to rank %d (%s) %s: it acknowledged nothing for DEAR_SOCKET_DEAD_S=%g s (its "
                           "host is down or the link to it is cut); its messages fail",
                   p, pe->addr, what, s->dead_s);
    else
        DEAR_ERROR("sock", "connection to rank %d (%s) %s%s%s; its messages fail", p, pe->addr, what, err ? ": " : "",
                   err ? strerror(err) : "");
    epoll_ctl(s->ep, EPOLL_CTL_DEL, pe->fd, NULL);
    shutdown(pe->fd, SHUT_RDWR);
    /* An unexpected message being read is also on its queue, freed there. */
    dear_sock_msg_t *cur = pe->cur;
    pe->cur = NULL;
    if (cur && cur->kind != MSG_UNEXPECTED)
        msg_finish(s, cur, ST_FAILED);
    for (dear_sock_msg_t *m = pe->rhead, *next; m; m = next) {
        next = m->rnext;
        if (m->kind != MSG_UNEXPECTED)
            msg_finish(s, m, ST_FAILED);
    }
    pe->rhead = pe->rtail = NULL;
    pe->ctl_off = pe->ctl_len = pe->bell_end = 0;
    queue_t *qs[2] = { &pe->sendq, &pe->posted };
    for (int i = 0; i < 2; i++)
        while (qs[i]->head) {
            dear_sock_msg_t *m = qs[i]->head;
            q_remove(qs[i], m);
            msg_finish(s, m, ST_FAILED);
        }
    while (pe->unexpected.head) {
        dear_sock_msg_t *m = pe->unexpected.head;
        q_remove(&pe->unexpected, m);
        msg_free(m);
    }
    pe->unexpected_bytes = 0;
}

/* A peer broke the limits (dear_sock_set_limits): what it sent is not read any further. */
static int peer_violation(dear_sock_t *s, int p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int peer_violation(dear_sock_t *s, int p, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    peer_fail(s, p, what, 0);
    return -1;
}

/* ---- writing --------------------------------------------------------------------------- */

static void want_out(dear_sock_t *s, int p, int on)
{
    peer_t *pe = &s->peers[p];
    if (pe->want_out == on || pe->failed)
        return;
    struct epoll_event ev = { .events = EPOLLIN | (on ? EPOLLOUT : 0), .data.u64 = (uint64_t)p };
    if (epoll_ctl(s->ep, EPOLL_CTL_MOD, pe->fd, &ev) != 0) {
        peer_fail(s, p, "could not be watched", errno);
        return;
    }
    pe->want_out = on;
}

/* After a write that failed: 1 to write again (interrupted), 0 to stop (the socket is full, and
 * EPOLLOUT will say when it has room, or the peer failed). */
static int send_again(dear_sock_t *s, int p)
{
    if (errno == EINTR)
        return 1;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        want_out(s, p, 1);
    else
        peer_fail(s, p, "failed while sending", errno);
    return 0;
}

static void ring_write(dear_sock_t *s, int p);
static void ring_read(dear_sock_t *s, int p);

/* Write queued messages until the queue is empty or the socket is full. */
static void peer_write(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    if (pe->rout) {
        ring_write(s, p);
        return;
    }
    while (!pe->failed && pe->sendq.head) {
        dear_sock_msg_t *m = pe->sendq.head;
        size_t total = HDR_BYTES + m->len;
        struct iovec iov[2];
        int n = 0;
        if (m->off < HDR_BYTES)
            iov[n++] = (struct iovec){ m->hdr + m->off, HDR_BYTES - m->off };
        size_t poff = m->off > HDR_BYTES ? m->off - HDR_BYTES : 0;
        if (m->len > poff)
            iov[n++] = (struct iovec){ m->buf + poff, m->len - poff };
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };
        ssize_t w = sendmsg(pe->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (send_again(s, p))
                continue;
            return;
        }
        m->off += (size_t)w;
        if (m->off < total)
            continue;
        q_remove(&pe->sendq, m);
        msg_finish(s, m, ST_DONE);
    }
    want_out(s, p, 0);
}

/* ---- reading --------------------------------------------------------------------------- */

/* A header arrived: find its receive, or make it an unexpected message (*out; NULL for a
 * doorbell). 0 or -1 (failed). */
static int header_done(dear_sock_t *s, int p, dear_sock_msg_t **out)
{
    peer_t *pe = &s->peers[p];
    uint32_t ctx;
    int32_t tag;
    uint64_t len;
    memcpy(&ctx, pe->rhdr, 4);
    memcpy(&tag, pe->rhdr + 4, 4);
    memcpy(&len, pe->rhdr + 8, 8);
    pe->rhdr_got = 0;
    *out = NULL;
    if (ctx == BELL_CTX && pe->rin) {
        if (len != 0 || tag != 0)
            return peer_violation(s, p, "sent a doorbell with a tag of %d and a length of %llu", (int)tag,
                                  (unsigned long long)len);
        return 0;
    }
    /* A length is a peer's claim: checked against what the ranks can send before anything is
     * allocated or read for it. */
    if (len > s->max_message)
        return peer_violation(s, p,
                              "announced a message of %llu bytes (context %u, tag %d), more than the %zu bytes the "
                              "largest message may have",
                              (unsigned long long)len, (unsigned)ctx, (int)tag, s->max_message);
    dear_sock_msg_t *m = q_match(&pe->posted, ctx, tag);
    if (m) {
        q_remove(&pe->posted, m);
        m->len = (size_t)len;
        if (m->len > m->cap) {
            DEAR_ERROR("sock", "a message of %zu bytes from rank %d (context %u, tag %d) arrived for a receive of %zu "
                               "bytes: it is dropped and the receive fails",
                       m->len, p, (unsigned)ctx, (int)tag, m->cap);
            m->truncated = 1;
        }
    } else {
        size_t cost = (size_t)len + DEAR_SOCK_MSG_COST;
        if (pe->unexpected_bytes + cost > s->max_unexpected)
            return peer_violation(s, p,
                                  "sent a message of %llu bytes (context %u, tag %d) with %zu bytes already queued "
                                  "without receives from it, past the bound of %zu",
                                  (unsigned long long)len, (unsigned)ctx, (int)tag, pe->unexpected_bytes,
                                  s->max_unexpected);
        m = calloc(1, sizeof *m);
        char *buf = len > 0 ? malloc((size_t)len) : NULL;
        if (m == NULL || (len > 0 && buf == NULL)) {
            free(m);
            free(buf);
            DEAR_ERROR("sock", "no memory for a message of %llu bytes from rank %d", (unsigned long long)len, p);
            peer_fail(s, p, "lost a message", ENOMEM);
            return -1;
        }
        *m = (dear_sock_msg_t){ .kind = MSG_UNEXPECTED, .peer = p, .ctx = ctx, .tag = tag, .buf = buf,
                                .cap = (size_t)len, .len = (size_t)len, .owned = 1 };
        q_push(&pe->unexpected, m);
        pe->unexpected_bytes += cost;
    }
    *out = m;
    return 0;
}

/* The payload of m is complete. */
static void payload_done(dear_sock_t *s, dear_sock_msg_t *m)
{
    if (m->kind == MSG_UNEXPECTED)
        m->state = ST_DONE;   /* waits on the unexpected queue for its receive */
    else
        msg_finish(s, m, m->truncated ? ST_FAILED : ST_DONE);
}

/* Under the lock: the header in rhdr is complete (0), or the peer failed (-1). Its payload is
 * read next from the socket (cur) or, from a peer of this host, in turn from the ring; a message
 * of no payload completes at once. */
static int header_read(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    dear_sock_msg_t *m;
    if (header_done(s, p, &m) != 0)
        return -1;
    if (m == NULL)
        return 0;
    if (m->len == 0) {
        payload_done(s, m);
    } else if (pe->rin) {
        m->rnext = NULL;
        if (pe->rtail)
            pe->rtail->rnext = m;
        else
            pe->rhead = m;
        pe->rtail = m;
    } else {
        pe->cur = m;
    }
    return 0;
}

/* After a read that got nothing (r <= 0): 1 to read again (interrupted), 0 to stop (the socket
 * is empty, or the peer failed). */
static int recv_again(dear_sock_t *s, int p, ssize_t r)
{
    if (r == 0) {
        peer_fail(s, p, "was closed by the peer", 0);
        return 0;
    }
    if (errno == EINTR)
        return 1;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
        peer_fail(s, p, "failed while receiving", errno);
    return 0;
}

/* Read whatever the socket holds into headers and payloads.
 * Rule: a read shorter than asked found the socket empty, so reading stops there (epoll, level
 * triggered, reports what comes later), and a payload's read takes the next header with it.
 * Why: a system call per header and one more that finds nothing doubled the calls per message,
 * and with ranks sharing cores those calls are what a small collective costs. */
static void peer_read(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    if (pe->rin) {
        ring_read(s, p);
        return;
    }
    while (!pe->failed) {
        ssize_t r;
        size_t asked;
        if (pe->cur == NULL) {
            asked = HDR_BYTES - pe->rhdr_got;
            r = recv(pe->fd, pe->rhdr + pe->rhdr_got, asked, MSG_DONTWAIT);
            if (r > 0) {
                pe->rhdr_got += (size_t)r;
                if (pe->rhdr_got == HDR_BYTES && header_read(s, p) != 0)
                    return;
                if ((size_t)r < asked)
                    return;
                continue;
            }
        } else {
            dear_sock_msg_t *m = pe->cur;
            size_t want = m->len - m->off;
            int drop = m->truncated || m->orphan;
            char *dst = drop ? s->discard : m->buf + m->off;
            if (drop && want > DISCARD_BYTES)
                want = DISCARD_BYTES;
            /* header_done left rhdr empty for the next header. */
            struct iovec iov[2] = { { dst, want }, { pe->rhdr, HDR_BYTES } };
            struct msghdr mh = { .msg_iov = iov, .msg_iovlen = drop ? 1 : 2 };
            asked = want + (drop ? 0 : HDR_BYTES);
            r = recvmsg(pe->fd, &mh, MSG_DONTWAIT);
            if (r > 0) {
                size_t got = (size_t)r < want ? (size_t)r : want;
                m->off += got;
                pe->rhdr_got = (size_t)r - got;
                if (m->off == m->len) {
                    pe->cur = NULL;
                    payload_done(s, m);
                }
                if (pe->rhdr_got == HDR_BYTES && header_read(s, p) != 0)
                    return;
                if ((size_t)r < asked)
                    return;
                continue;
            }
        }
        if (recv_again(s, p, r))
            continue;
        return;
    }
}

/* ---- a peer of this host: payloads through the rings ------------------------------------ */

/* Stage a frame for the connection; 0 when ctl has no room for it and `spare` bytes more. */
static int ctl_stage(peer_t *pe, const unsigned char *frame, size_t spare)
{
    if (pe->ctl_off == pe->ctl_len)
        pe->ctl_off = pe->ctl_len = pe->bell_end = 0;
    if (pe->ctl_len + HDR_BYTES + spare > CTL_BYTES) {
        size_t n = pe->ctl_len - pe->ctl_off;
        if (n + HDR_BYTES + spare > CTL_BYTES)
            return 0;
        memmove(pe->ctl, pe->ctl + pe->ctl_off, n);
        pe->bell_end = pe->bell_end > pe->ctl_off ? pe->bell_end - pe->ctl_off : 0;
        pe->ctl_off = 0;
        pe->ctl_len = n;
    }
    memcpy(pe->ctl + pe->ctl_len, frame, HDR_BYTES);
    pe->ctl_len += HDR_BYTES;
    return 1;
}

/* One doorbell at a time is enough: its receiver looks at both rings whenever it comes. */
static void ring_bell(peer_t *pe)
{
    static const unsigned char bell[HDR_BYTES] = { 0xff, 0xff, 0xff, 0xff };
    if (pe->ctl_off < pe->bell_end)
        return;
    /* Headers leave room for it (ring_write), so it always fits. */
    if (ctl_stage(pe, bell, 0))
        pe->bell_end = pe->ctl_len;
}

/* Send the staged frames, or as many as the socket takes. */
static void ctl_flush(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    while (!pe->failed && pe->ctl_off < pe->ctl_len) {
        ssize_t w = send(pe->fd, pe->ctl + pe->ctl_off, pe->ctl_len - pe->ctl_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (send_again(s, p))
                continue;
            return;
        }
        pe->ctl_off += (size_t)w;
    }
    want_out(s, p, 0);
}

/* Queued messages go out as their header on the connection and their payload into the ring:
 * payload first where it fits, so the header wakes a reader that finds it all there. A send is
 * complete once its payload is in the ring. A full ring leaves the writer waiting for the
 * reader's doorbell, not polling. */
static void ring_write(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    int wrote = 0;
again:
    while (!pe->failed && pe->sendq.head) {
        dear_sock_msg_t *m = pe->sendq.head;
        if (m->off == 0) {
            /* No room for its header: the staged frames go first (below). */
            if (!ctl_stage(pe, m->hdr, HDR_BYTES))
                break;
            m->off = HDR_BYTES;
        }
        size_t done = m->off - HDR_BYTES;
        if (done < m->len) {
            long long k = dear_ring_put(pe->rout, m->buf + done, m->len - done);
            if (k < 0) {
                peer_violation(s, p, "claimed to have read more of its shared-memory ring than was written");
                return;
            }
            m->off += (size_t)k;
            wrote |= k > 0;
            if (m->off < HDR_BYTES + m->len) {
                if (dear_ring_wait_room(pe->rout))
                    break;
                continue;
            }
        }
        q_remove(&pe->sendq, m);
        msg_finish(s, m, ST_DONE);
    }
    if (wrote && !pe->failed && dear_ring_reader_waits(pe->rout))
        ring_bell(pe);
    ctl_flush(s, p);
    /* A header that found no room has it now that the frames are gone; frames the socket did
     * not take leave EPOLLOUT on, which calls this back. */
    if (!pe->failed && pe->sendq.head && pe->sendq.head->off == 0 && pe->ctl_off == pe->ctl_len)
        goto again;
}

/* Payloads out of the ring into the messages whose headers came, in order. */
static void ring_drain(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    int freed = 0;
    while (!pe->failed && pe->rhead) {
        dear_sock_msg_t *m = pe->rhead;
        int drop = m->truncated || m->orphan;
        long long k = dear_ring_get(pe->rin, drop ? NULL : m->buf + m->off, m->len - m->off);
        if (k < 0) {
            peer_violation(s, p, "claimed more bytes in its shared-memory ring than the %zu it holds",
                           dear_ring_bytes(pe->rin));
            return;
        }
        if (k == 0) {
            if (dear_ring_wait_data(pe->rin))
                break;
            continue;
        }
        freed = 1;
        m->off += (size_t)k;
        if (m->off == m->len) {
            pe->rhead = m->rnext;
            if (pe->rhead == NULL)
                pe->rtail = NULL;
            m->rnext = NULL;
            payload_done(s, m);
        }
    }
    if (freed && !pe->failed && dear_ring_writer_waits(pe->rin))
        ring_bell(pe);
}

/* The connection carries only frames: read them in batches, then move the rings both ways (a
 * doorbell may have meant bytes to read or room to write). */
static void ring_read(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    unsigned char buf[64 * HDR_BYTES];
    while (!pe->failed) {
        ssize_t r = recv(pe->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r > 0) {
            for (size_t i = 0; i < (size_t)r && !pe->failed;) {
                size_t k = HDR_BYTES - pe->rhdr_got;
                if (k > (size_t)r - i)
                    k = (size_t)r - i;
                memcpy(pe->rhdr + pe->rhdr_got, buf + i, k);
                pe->rhdr_got += k;
                i += k;
                if (pe->rhdr_got == HDR_BYTES && header_read(s, p) != 0)
                    return;
            }
            if ((size_t)r < sizeof buf)
                break;
            continue;
        }
        if (recv_again(s, p, r))
            continue;
        break;
    }
    if (pe->failed)
        return;
    ring_drain(s, p);
    ring_write(s, p);
}

/* ---- the API --------------------------------------------------------------------------- */

static int peer_check(const dear_sock_t *s, int peer, uint32_t ctx, const char *what)
{
    if (peer < 0 || peer >= s->size || peer == s->rank) {
        DEAR_ERROR("sock", "%s: peer %d is not another rank of the %d", what, peer, s->size);
        return DEAR_ERR_INTERNAL;
    }
    if (ctx == BELL_CTX) {
        DEAR_ERROR("sock", "%s: context %u is the transport's own", what, (unsigned)ctx);
        return DEAR_ERR_INTERNAL;
    }
    return DEAR_OK;
}

/* u, an unexpected message still arriving, hands the rest of its payload to m. 0: u is whole. */
static int take_over(peer_t *pe, dear_sock_msg_t *u, dear_sock_msg_t *m)
{
    if (pe->cur == u) {
        pe->cur = m;
        return 1;
    }
    for (dear_sock_msg_t **at = &pe->rhead; *at; at = &(*at)->rnext)
        if (*at == u) {
            m->rnext = u->rnext;
            *at = m;
            if (pe->rtail == u)
                pe->rtail = m;
            return 1;
        }
    return 0;
}

int dear_sock_isend(dear_sock_t *s, int peer, uint32_t ctx, int tag, const void *buf, size_t bytes,
                    dear_sock_msg_t **msg)
{
    DEAR_CHECK(peer_check(s, peer, ctx, "dear_sock_isend"));
    dear_sock_msg_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return DEAR_ERR_NOMEM;
    *m = (dear_sock_msg_t){ .kind = MSG_SEND, .peer = peer, .ctx = ctx, .tag = tag, .buf = (char *)buf,
                            .cap = bytes, .len = bytes };
    uint64_t len = bytes;
    memcpy(m->hdr, &ctx, 4);
    memcpy(m->hdr + 4, &tag, 4);
    memcpy(m->hdr + 8, &len, 8);
    dear_lock(&s->lock);
    peer_t *pe = &s->peers[peer];
    if (pe->failed) {
        m->state = ST_FAILED;
    } else {
        int first = pe->sendq.head == NULL;
        q_push(&pe->sendq, m);
        /* Straight into the kernel when nothing is ahead of it: no wake-up needed to start. */
        if (first)
            peer_write(s, peer);
    }
    dear_unlock(&s->lock);
    *msg = m;
    return DEAR_OK;
}

int dear_sock_irecv(dear_sock_t *s, int peer, uint32_t ctx, int tag, void *buf, size_t bytes, dear_sock_msg_t **msg)
{
    DEAR_CHECK(peer_check(s, peer, ctx, "dear_sock_irecv"));
    dear_sock_msg_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return DEAR_ERR_NOMEM;
    *m = (dear_sock_msg_t){ .kind = MSG_RECV, .peer = peer, .ctx = ctx, .tag = tag, .buf = buf, .cap = bytes };
    dear_lock(&s->lock);
    peer_t *pe = &s->peers[peer];
    dear_sock_msg_t *u = pe->failed ? NULL : q_match(&pe->unexpected, ctx, tag);
    if (pe->failed) {
        m->state = ST_FAILED;
    } else if (u == NULL) {
        q_push(&pe->posted, m);
    } else {
        q_remove(&pe->unexpected, u);
        pe->unexpected_bytes -= u->len + DEAR_SOCK_MSG_COST;
        m->len = u->len;
        if (u->len > bytes) {
            DEAR_ERROR("sock", "a message of %zu bytes from rank %d (context %u, tag %d) arrived for a receive of %zu "
                               "bytes: it is dropped and the receive fails",
                       u->len, peer, (unsigned)ctx, (int)tag, bytes);
            m->truncated = 1;
        } else if (u->off > 0) {
            memcpy(buf, u->buf, u->off);
        }
        m->off = u->off;
        /* The rest of it arrives straight into buf. */
        if (!take_over(pe, u, m))
            msg_finish(s, m, m->truncated ? ST_FAILED : ST_DONE);
        msg_free(u);
    }
    dear_unlock(&s->lock);
    *msg = m;
    return DEAR_OK;
}

int dear_sock_test(dear_sock_t *s, dear_sock_msg_t **msg, int *flag, size_t *bytes)
{
    dear_sock_msg_t *m = *msg;
    *flag = 0;
    if (m == NULL) {
        *flag = 1;
        return DEAR_OK;
    }
    dear_lock(&s->lock);
    int state = m->state;
    dear_unlock(&s->lock);
    if (state == ST_PENDING)
        return DEAR_OK;
    int peer = m->peer, kind = m->kind;
    if (bytes)
        *bytes = m->len;
    msg_free(m);
    *msg = NULL;
    if (state == ST_FAILED) {
        DEAR_ERROR("sock", "%s rank %d failed", kind == MSG_SEND ? "a send to" : "a receive from", peer);
        return DEAR_ERR_NET;
    }
    *flag = 1;
    return DEAR_OK;
}

void dear_sock_abandon(dear_sock_t *s, dear_sock_msg_t **msg)
{
    dear_sock_msg_t *m = *msg;
    if (m == NULL)
        return;
    *msg = NULL;
    dear_lock(&s->lock);
    peer_t *pe = &s->peers[m->peer];
    if (m->state != ST_PENDING) {
        msg_free(m);  /* finished: in no queue */
    } else if (m->kind == MSG_RECV && q_has(&pe->posted, m)) {
        q_remove(&pe->posted, m);
        msg_free(m);
    } else if (m->kind == MSG_RECV) {
        m->orphan = 1;  /* its payload is arriving: read to the end, dropped */
    } else if (m->off == 0) {
        q_remove(&pe->sendq, m);  /* not a byte of it went out */
        msg_free(m);
    } else {
        /* Partly written: the peer expects the rest, which must outlive the caller's buffer. */
        m->orphan = 1;
        char *copy = m->len > 0 ? malloc(m->len) : NULL;
        if (m->len > 0 && copy == NULL) {
            peer_fail(s, m->peer, "lost a send being abandoned", ENOMEM);
        } else {
            if (m->len > 0)
                memcpy(copy, m->buf, m->len);
            m->buf = copy;
            m->owned = 1;
        }
    }
    dear_unlock(&s->lock);
}

/* Under the lock: act on what epoll reported. */
static void handle_events(dear_sock_t *s, const struct epoll_event *ev, int n)
{
    for (int i = 0; i < n; i++) {
        if (ev[i].data.u64 == POKE_TAG) {
            uint64_t v;
            while (read(s->poke_fd, &v, sizeof v) > 0)
                ;
            continue;
        }
        int p = (int)ev[i].data.u64;
        if (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
            peer_read(s, p);
        if (ev[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            peer_write(s, p);
    }
}

int dear_sock_progress(dear_sock_t *s)
{
    struct epoll_event ev[MAX_EVENTS];
    dear_lock(&s->lock);
    int n = epoll_wait(s->ep, ev, MAX_EVENTS, 0);
    if (n > 0)
        handle_events(s, ev, n);
    dear_unlock(&s->lock);
    if (n < 0 && errno != EINTR) {
        DEAR_ERROR("sock", "epoll_wait failed: %s", strerror(errno));
        return DEAR_ERR_NET;
    }
    return DEAR_OK;
}

int dear_sock_block(dear_sock_t *s, double timeout_s)
{
    struct epoll_event ev[MAX_EVENTS];
    int ms = timeout_s <= 0 ? 0 : (int)(timeout_s * 1e3 + 0.999);
    int n = epoll_wait(s->ep, ev, MAX_EVENTS, ms);
    if (n < 0) {
        if (errno == EINTR)
            return DEAR_OK;
        DEAR_ERROR("sock", "epoll_wait failed: %s", strerror(errno));
        return DEAR_ERR_NET;
    }
    dear_lock(&s->lock);
    if (n == 0)
        s->timeouts++;
    else
        handle_events(s, ev, n);
    dear_unlock(&s->lock);
    return DEAR_OK;
}

void dear_sock_poke(dear_sock_t *s)
{
    uint64_t one = 1;
    /* Only fails when the counter is saturated: then it is readable already. */
    ssize_t w = write(s->poke_fd, &one, sizeof one);
    (void)w;
}

void dear_sock_set_limits(dear_sock_t *s, size_t max_message, size_t max_unexpected)
{
    dear_lock(&s->lock);
    if (max_message > 0)
        s->max_message = max_message;
    if (max_unexpected > 0)
        s->max_unexpected = max_unexpected;
    DEAR_DEBUG("sock", "a peer may send messages of up to %zu bytes, and queue %zu bytes without receives", s->max_message,
               s->max_unexpected);
    dear_unlock(&s->lock);
}

void dear_sock_counters(dear_sock_t *s, uint64_t *messages, uint64_t *timeouts)
{
    dear_lock(&s->lock);
    if (messages)
        *messages = s->messages;
    if (timeouts)
        *timeouts = s->timeouts;
    dear_unlock(&s->lock);
}

const char *dear_sock_address(const dear_sock_t *s)
{
    return s->address;
}

/* ---- set-up ---------------------------------------------------------------------------- */

/* 1 when interface name matches one of the comma-separated prefixes in list. */
static int name_in(const char *name, const char *list)
{
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n > 0 && strncmp(name, p, n) == 0)
            return 1;
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* The IPv4 address to listen on, chosen by ifnames (sock.h). DEAR_ERR_PARAM when none fits. */
static int pick_address(const char *ifnames, struct in_addr *addr, char *ifname, size_t ifname_size)
{
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0) {
        DEAR_ERROR("sock", "getifaddrs failed: %s", strerror(errno));
        return DEAR_ERR_NET;
    }
    int exclude = ifnames[0] == '^';
    const char *list = exclude ? ifnames + 1 : ifnames;
    int found = 0, loop_found = 0;
    struct in_addr loop_addr = { 0 };
    for (struct ifaddrs *i = all; i && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
            continue;
        struct in_addr a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
        int loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
        int ok;
        if (list[0] == '\0')
            ok = !loopback && strncmp(i->ifa_name, "docker", 6) != 0;
        else
            ok = exclude ? !name_in(i->ifa_name, list) : name_in(i->ifa_name, list);
        if (ok) {
            *addr = a;
            snprintf(ifname, ifname_size, "%s", i->ifa_name);
            found = 1;
        } else if (loopback && !loop_found) {
            loop_addr = a;
            loop_found = 1;
        }
    }
    if (!found && list[0] == '\0' && loop_found) {
        *addr = loop_addr;  /* one host, no network: its ranks still talk through loopback */
        snprintf(ifname, ifname_size, "lo");
        found = 1;
    }
    freeifaddrs(all);
    if (!found) {
        DEAR_ERROR("sock", "DEAR_SOCKET_IFNAME='%s' selects no interface that is up with an IPv4 address; accepted: "
                           "name prefixes separated by commas, '^' in front to exclude them",
                   ifnames);
        return DEAR_ERR_PARAM;
    }
    return DEAR_OK;
}

typedef struct {
    uint32_t ip;        /* network order */
    uint16_t port;      /* network order */
    uint16_t pad;
} endpoint_t;

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void addr_string(struct in_addr a, unsigned port, char *buf, size_t size)
{
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a, ip, sizeof ip);
    snprintf(buf, size, "%s:%u", ip, port);
}

static dear_sock_hooks_t g_hooks;
static int g_hooked;

int dear_sock_ring_peers(const dear_sock_t *s)
{
    int n = 0;
    for (int p = 0; p < s->size; p++)
        n += s->peers[p].rin != NULL;
    return n;
}

dear_ring_t *dear_sock_ring(const dear_sock_t *s, int peer, int out)
{
    if (peer < 0 || peer >= s->size)
        return NULL;
    return out ? s->peers[peer].rout : s->peers[peer].rin;
}

void dear_sock_set_hooks(const dear_sock_hooks_t *hooks)
{
    g_hooked = hooks != NULL;
    g_hooks = hooks ? *hooks : (dear_sock_hooks_t){ 0 };
}

/* Options of every connection. Keepalive probes an idle one (a rank that only waits to receive
 * has nothing unacknowledged to time out), and TCP_USER_TIMEOUT aborts one whose data or probes
 * go unacknowledged for dead_s: without them a dead host is noticed after minutes of
 * retransmissions, or never by a rank that only receives. */
static int tune(const dear_sock_t *s, int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        return -1;
    if (s->dead_s <= 0)
        return 0;
    int idle = (int)(s->dead_s / 2), intvl = (int)(s->dead_s / 6), count = 6;
    unsigned int user_ms = (unsigned int)(s->dead_s * 1e3);
    if (idle < 1)
        idle = 1;
    if (intvl < 1)
        intvl = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms) != 0)
        return -1;
    return 0;
}

/* The steps of one connection during set-up: ours to a lower rank (C_), or one accepted,
 * from a higher rank or a stranger (A_). Each waits for its socket and has its own deadline,
 * so no connection ever waits behind another. */
enum { C_CONNECT, C_HELLO, C_ANSWER, C_PROOF, A_HELLO, A_ANSWER, A_PROOF, L_GONE };

typedef struct {
    int fd, step;
    int peer;                   /* C_: the rank connected to; A_: the rank claimed, -1 before the hello */
    double deadline;
    struct sockaddr_in sa;      /* C_: where to; A_: where from */
    unsigned char rec[DEAR_SOCK_ANSWER_BYTES]; /* the record being read or written */
    size_t len, off;
    unsigned char conn_nonce[DEAR_SOCK_NONCE_BYTES], acc_nonce[DEAR_SOCK_NONCE_BYTES];
} link_t;

typedef struct {
    dear_sock_t *s;
    const endpoint_t *eps;
    const unsigned char *key;
    link_t *links;
    int nlinks, cap;
    int *state;                 /* per rank: 0 waiting, 1 connected, -1 failed */
    uint64_t *binding;          /* per rank: the start of its connection's acceptor nonce, 0 if none */
    int left;                   /* ranks neither connected nor failed */
    int rc;
    int twice;                  /* a rank that proved itself twice, or -1 */
    int strays;                 /* connections turned away */
    double listen_after;        /* no room and no stranger to shed: accept again then */
    int queue_held;             /* new connections wait in the listen queue until listen_after, or
                                 * until fewer strangers than this are held (0: not held) */
    int hold_said;              /* that was logged (once per set-up) */
} setup_t;

/* An accepted connection a set-up has not yet authenticated may wait this long for its records:
 * a rank sends them at once, and a stranger holding a slot costs one descriptor, no time. */
#define HELLO_WAIT_S 5.0
/* Unauthenticated connections held at once beyond the ranks' own (shed_one says which go). */
#define MAX_STRANGERS 64
/* A connection taken from the queue is not judged silent before this: a rank's hello follows its
 * connection at once, but the rank's process may not have run yet. */
#define SILENT_GRACE_S 0.25
/* Strangers named one by one in the log; past this, only their count. */
#define MAX_STRAY_LOG 8

/* What a connection to a lower rank was doing, for messages. */
static const char *step_what(int step)
{
    switch (step) {
    case C_CONNECT: return "connecting";
    case C_ANSWER: return "waiting for the answer to its hello";
    default: return "sending a set-up record";
    }
}

static void link_close(link_t *k)
{
    if (k->fd >= 0)
        close(k->fd);
    k->fd = -1;
    k->step = L_GONE;
}

/* A lower rank this rank connects to cannot be reached: the set-up fails, every other
 * connection still goes on so that the ranks waiting for this one learn it at once. */
static int fail_rank(setup_t *su, link_t *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_rank(setup_t *su, link_t *k, const char *fmt, ...)
{
    char why[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    DEAR_ERROR("sock", "could not connect to rank %d at %s: %s", k->peer, su->s->peers[k->peer].addr, why);
    su->state[k->peer] = -1;
    su->left--;
    su->rc = DEAR_ERR_NET;
    link_close(k);
    return 0;
}

/* A connection that is not (or not yet shown to be) a rank of this fabric: closed, and the
 * ranks carry on as if it never came. */
static int turn_away(setup_t *su, link_t *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int turn_away(setup_t *su, link_t *k, const char *fmt, ...)
{
    if (++su->strays <= MAX_STRAY_LOG) {
        char why[256], from[32];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        addr_string(k->sa.sin_addr, ntohs(k->sa.sin_port), from, sizeof from);
        DEAR_WARN("sock", "turned away a connection to %s from %s: it %s", su->s->address, from, why);
    }
    link_close(k);
    return 0;
}

/* Read or write the rest of k's record: 1 complete, 0 not yet, -1 failed (errno; 0 when the
 * peer closed). A stranger's first bytes are checked as they come. */
static int link_io(link_t *k, int out)
{
    while (k->off < k->len) {
        ssize_t r = out ? send(k->fd, k->rec + k->off, k->len - k->off, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(k->fd, k->rec + k->off, k->len - k->off, MSG_DONTWAIT);
        if (r > 0) {
            k->off += (size_t)r;
            if (k->step == A_HELLO && !dear_sock_magic_prefix(k->rec, k->off)) {
                errno = EPROTO;
                return -1;
            }
            continue;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
    return 1;
}

static void link_record(link_t *k, int step, size_t len)
{
    k->step = step;
    k->len = len;
    k->off = 0;
}

/* Hand an authenticated connection to the fabric. */
static int connected(setup_t *su, link_t *k)
{
    su->s->peers[k->peer].fd = k->fd;
    su->state[k->peer] = 1;
    memcpy(&su->binding[k->peer], k->acc_nonce, sizeof su->binding[k->peer]);
    if (su->binding[k->peer] == 0)
        su->binding[k->peer] = 1;  /* 0 means "no connection" */
    su->left--;
    k->fd = -1;
    k->step = L_GONE;
    return 0;
}

/* The connection to a lower rank, as far as its socket allows. */
static int step_connector(setup_t *su, link_t *k)
{
    dear_sock_t *s = su->s;
    int rc;
    if (k->step == C_CONNECT) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (err == EINPROGRESS || err == EALREADY)
            return 0;
        /* Every listener was up before the ranks agreed to connect, so a refusal is a firewall
         * or an address this host cannot reach: not worth a retry. */
        if (err != 0)
            return fail_rank(su, k, "%s (a firewall, or an interface the ranks cannot reach each other on? "
                                    "DEAR_SOCKET_IFNAME picks it)", strerror(err));
        dear_sock_hello_t h = { .from = s->rank, .to = k->peer };
        if (dear_sock_random(h.nonce, sizeof h.nonce) != 0)
            return fail_rank(su, k, "getrandom failed: %s", strerror(errno));
        memcpy(k->conn_nonce, h.nonce, sizeof h.nonce);
        dear_sock_hello_pack(&h, k->rec);
        link_record(k, C_HELLO, DEAR_SOCK_HELLO_BYTES);
        if (g_hooked && g_hooks.tap)
            g_hooks.tap(g_hooks.arg, k->peer, k->rec, k->len);
    }
    if (k->step == C_HELLO) {
        if ((rc = link_io(k, 1)) <= 0)
            goto io;
        link_record(k, C_ANSWER, DEAR_SOCK_ANSWER_BYTES);
    }
    if (k->step == C_ANSWER) {
        if ((rc = link_io(k, 0)) <= 0)
            goto io;
        memcpy(k->acc_nonce, k->rec, DEAR_SOCK_NONCE_BYTES);
        if (!dear_sock_proof_ok(su->key, DEAR_SOCK_BY_ACCEPTOR, s->rank, k->peer, k->conn_nonce, k->acc_nonce,
                                k->rec + DEAR_SOCK_NONCE_BYTES))
            return fail_rank(su, k, "whatever answered there does not hold this job's key: it is not rank %d "
                                    "(another process on its port, or something on the path)", k->peer);
        dear_sock_proof(su->key, DEAR_SOCK_BY_CONNECTOR, s->rank, k->peer, k->conn_nonce, k->acc_nonce, k->rec);
        link_record(k, C_PROOF, DEAR_SOCK_PROOF_BYTES);
        if (g_hooked && g_hooks.tap)
            g_hooks.tap(g_hooks.arg, k->peer, k->rec, k->len);
    }
    if ((rc = link_io(k, 1)) <= 0)
        goto io;
    return connected(su, k);
io:
    if (rc < 0 && k->step == C_ANSWER && errno == 0)
        return fail_rank(su, k, "it closed the connection during set-up: it refused this rank (its log says why)");
    if (rc < 0)
        return fail_rank(su, k, "%s failed: %s", step_what(k->step), strerror(errno ? errno : EPIPE));
    return 0;
}

/* An accepted connection, as far as its socket allows. */
static int step_acceptor(setup_t *su, link_t *k)
{
    dear_sock_t *s = su->s;
    int rc;
    if (k->step == A_HELLO) {
        if ((rc = link_io(k, 0)) <= 0)
            goto io;
        dear_sock_hello_t h;
        if (dear_sock_hello_unpack(k->rec, &h) != 0 || h.to != s->rank || h.from <= s->rank || h.from >= s->size)
            return turn_away(su, k, "introduced itself as rank %d connecting to rank %d", h.from, h.to);
        /* Set-up runs over the addresses MPI gave: a rank's connection comes from its own. */
        if (k->sa.sin_addr.s_addr != su->eps[h.from].ip) {
            char want[INET_ADDRSTRLEN] = "?";
            inet_ntop(AF_INET, &su->eps[h.from].ip, want, sizeof want);
            return turn_away(su, k, "claimed rank %d, whose address is %s", h.from, want);
        }
        k->peer = h.from;
        memcpy(k->conn_nonce, h.nonce, sizeof h.nonce);
        if (dear_sock_random(k->acc_nonce, sizeof k->acc_nonce) != 0) {
            DEAR_ERROR("sock", "getrandom failed: %s", strerror(errno));
            su->rc = DEAR_ERR_NET;
            link_close(k);
            return 0;
        }
        memcpy(k->rec, k->acc_nonce, DEAR_SOCK_NONCE_BYTES);
        dear_sock_proof(su->key, DEAR_SOCK_BY_ACCEPTOR, k->peer, s->rank, k->conn_nonce, k->acc_nonce,
                        k->rec + DEAR_SOCK_NONCE_BYTES);
        link_record(k, A_ANSWER, DEAR_SOCK_ANSWER_BYTES);
    }
    if (k->step == A_ANSWER) {
        if ((rc = link_io(k, 1)) <= 0)
            goto io;
        link_record(k, A_PROOF, DEAR_SOCK_PROOF_BYTES);
    }
    if ((rc = link_io(k, 0)) <= 0)
        goto io;
    if (!dear_sock_proof_ok(su->key, DEAR_SOCK_BY_CONNECTOR, k->peer, s->rank, k->conn_nonce, k->acc_nonce, k->rec))
        return turn_away(su, k, "claimed rank %d without proving it holds this job's key", k->peer);
    if (su->state[k->peer] != 1)
        return connected(su, k);
    /* Two processes proved they hold the key for one rank: the key is out, or a rank runs
     * twice. Which one is the rank cannot be told, so the set-up fails (every rank names it). */
    char from[32];
    addr_string(k->sa.sin_addr, ntohs(k->sa.sin_port), from, sizeof from);
    DEAR_ERROR("sock", "rank %d connected to rank %d (%s) a second time (from %s), proving both times that it holds "
                       "this job's key",
               k->peer, s->rank, s->address, from);
    su->twice = su->twice < 0 || k->peer < su->twice ? k->peer : su->twice;
    link_close(k);
    return 0;
io:
    if (rc < 0 && errno == EPROTO)
        return turn_away(su, k, "does not speak this transport's protocol (or an older version of it)");
    if (rc < 0)
        return turn_away(su, k, "closed or failed while %s: %s",
                         k->peer >= 0 ? "proving its rank" : "introducing itself",
                         errno ? strerror(errno) : "closed by its end");
    return 0;
}

/* An accepted connection not yet authenticated. */
static int is_stranger(const link_t *k) { return k->step >= A_HELLO && k->step != L_GONE; }

static int count_strangers(const setup_t *su)
{
    int n = 0;
    for (int i = 0; i < su->nlinks; i++)
        n += is_stranger(&su->links[i]);
    return n;
}

/* Unauthenticated connections held at once: beyond them new ones wait in the listen queue. */
static int stranger_room(const setup_t *su) { return MAX_STRANGERS + su->s->size - 1; }

/* One unauthenticated connection goes to make room: 1 when one went. Only a connection that
 * cannot be a rank in the middle of its handshake is a candidate, in this order: one that has
 * said nothing for SILENT_GRACE_S since it was taken (each read once before it is judged), one
 * whose hello has stayed incomplete as long, one past its hello whose claimed rank is connected
 * already. A rank sends its hello the moment its connection is up, so the grace keeps a rank
 * taken from the queue in the same burst as a flood. A connection whose hello claimed a rank not
 * yet connected is never shed before its deadline: it may be that rank, whose connector counts
 * itself connected as soon as its proof is sent, so shedding it would fail the set-up on every
 * rank. With none to shed, *retry is when a young one comes of age (or never: +inf). */
static int shed_one(setup_t *su, double now, double *retry)
{
    int partial = -1, dup = -1;
    *retry = INFINITY;
    for (int i = 0; i < su->nlinks; i++) {
        link_t *k = &su->links[i];
        if (k->step == A_HELLO) {
            double of_age = k->deadline - HELLO_WAIT_S + SILENT_GRACE_S;
            step_acceptor(su, k);
            if (k->step == L_GONE)
                return 1; /* it spoke, and was turned away */
            if (k->step == A_HELLO && now < of_age) {
                *retry = fmin(*retry, of_age);
                continue;
            }
            if (k->step == A_HELLO && k->off == 0) {
                turn_away(su, k, "said nothing while %d newer connections came", count_strangers(su) - 1);
                return 1;
            }
            if (k->step == A_HELLO && partial < 0)
                partial = i;
        }
        if (is_stranger(k) && k->step != A_HELLO && su->state[k->peer] == 1 && dup < 0)
            dup = i;
    }
    if (partial >= 0)
        turn_away(su, &su->links[partial], "sent part of a hello and no more while newer connections came");
    else if (dup >= 0)
        turn_away(su, &su->links[dup], "claimed rank %d, which is connected already", su->links[dup].peer);
    return partial >= 0 || dup >= 0;
}

/* No slot to take a connection into and none to free now: new connections wait in the listen
 * queue (the backlog holds them) until a held one comes of age or ends, at its deadline or
 * sooner. */
static void hold_queue(setup_t *su, double now, double retry)
{
    double until = fmin(retry, now + HELLO_WAIT_S);
    int claims = 0;
    for (int i = 0; i < su->nlinks; i++)
        if (is_stranger(&su->links[i])) {
            until = fmin(until, su->links[i].deadline);
            claims += su->links[i].step != A_HELLO;
        }
    if (claims > 0 && !su->hold_said++)
        DEAR_WARN("sock", "%d unauthenticated connections to %s claim ranks not yet connected; new connections wait "
                          "for one of them to end (at most %g s)",
                  claims, su->s->address, HELLO_WAIT_S);
    su->queue_held = count_strangers(su);
    su->listen_after = until;
}

/* Room in the array for one more link. */
static int link_room(setup_t *su)
{
    if (su->nlinks == su->cap) {
        int cap = su->cap * 2;
        link_t *l = realloc(su->links, sizeof *l * (size_t)cap);
        if (l == NULL)
            return DEAR_ERR_NOMEM;
        su->links = l;
        su->cap = cap;
    }
    return DEAR_OK;
}

/* Take the connections waiting on the listening socket while there is room for them. */
static void accept_new(setup_t *su, int lfd, double now)
{
    dear_sock_t *s = su->s;
    for (;;) {
        double retry;
        if (count_strangers(su) >= stranger_room(su) && !shed_one(su, now, &retry)) {
            hold_queue(su, now, retry);
            return;
        }
        struct sockaddr_in sa;
        socklen_t len = sizeof sa;
        int fd = accept4(lfd, (struct sockaddr *)&sa, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            /* Out of descriptors (strangers hold them): shed one and take the next, or leave
             * the queue until one ends rather than spin on it. */
            if (errno == EMFILE || errno == ENFILE) {
                if (shed_one(su, now, &retry))
                    continue;
                hold_queue(su, now, retry);
                return;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                DEAR_WARN("sock", "accept on %s failed: %s", s->address, strerror(errno));
                su->listen_after = now + 0.1;
            }
            return;
        }
        if (link_room(su) != DEAR_OK) {
            close(fd);
            return;
        }
        link_t *k = &su->links[su->nlinks++];
        *k = (link_t){ .fd = fd, .step = A_HELLO, .peer = -1, .deadline = now + HELLO_WAIT_S, .sa = sa,
                       .len = DEAR_SOCK_HELLO_BYTES };
        int known = 0;
        for (int p = s->rank + 1; p < s->size && !known; p++)
            known = su->eps[p].ip == sa.sin_addr.s_addr;
        if (!known)
            turn_away(su, k, "comes from no address of a rank that connects here");
        else if (tune(s, fd) != 0)
            turn_away(su, k, "could not be set up: %s", strerror(errno));
    }
}

/* Start the connection to lower rank p, from this rank's own address (the one the acceptor
 * checks). */
static int connect_start(setup_t *su, int p, double deadline)
{
    dear_sock_t *s = su->s;
    link_t *k = &su->links[su->nlinks++];
    *k = (link_t){ .fd = -1, .step = C_CONNECT, .peer = p, .deadline = deadline };
    k->sa = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = su->eps[p].port,
                                  .sin_addr.s_addr = su->eps[p].ip };
    struct sockaddr_in me = { .sin_family = AF_INET, .sin_addr.s_addr = su->eps[s->rank].ip };
    k->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (k->fd < 0)
        return fail_rank(su, k, "socket() failed: %s", strerror(errno));
    if (tune(s, k->fd) != 0 || bind(k->fd, (struct sockaddr *)&me, sizeof me) != 0)
        return fail_rank(su, k, "could not set up its socket: %s", strerror(errno));
    if (connect(k->fd, (struct sockaddr *)&k->sa, sizeof k->sa) != 0 && errno != EINPROGRESS)
        return fail_rank(su, k, "%s (a firewall, or an interface the ranks cannot reach each other on? "
                                "DEAR_SOCKET_IFNAME picks it)", strerror(errno));
    return 0;
}

/* Connect every pair: this rank to the lower ranks, the higher ones to it, all at once. */
static int connect_all(setup_t *su, int lfd, double timeout_s)
{
    dear_sock_t *s = su->s;
    double deadline = mono_now() + timeout_s;
    su->left = s->size - 1;
    for (int p = 0; p < s->rank; p++)
        connect_start(su, p, deadline);
    struct pollfd *pf = NULL;
    int pf_cap = 0;
    while (su->left > 0) {
        double now = mono_now();
        /* Expired links, and those gone; what remains is watched. */
        int n = 0;
        for (int i = 0; i < su->nlinks; i++) {
            link_t *k = &su->links[i];
            if (k->step != L_GONE && now >= k->deadline) {
                if (k->step >= A_HELLO)
                    turn_away(su, k, "%s within %g s",
                              k->step == A_HELLO ? "said nothing that introduced it" : "did not finish the handshake",
                              HELLO_WAIT_S);
                else
                    fail_rank(su, k, "no answer in DEAR_SOCKET_TIMEOUT_S=%g s while %s", timeout_s,
                              step_what(k->step));
            }
            if (k->step != L_GONE)
                su->links[n++] = *k;
        }
        su->nlinks = n;
        if (su->left == 0)
            break;
        if (su->queue_held && count_strangers(su) < su->queue_held) {
            su->queue_held = 0; /* one ended: its slot and descriptor are free, take the queue again */
            su->listen_after = 0;
        }
        if (now >= deadline) {
            char who[256] = "";
            size_t used = 0;
            for (int p = s->rank + 1; p < s->size && used + 16 < sizeof who; p++)
                if (su->state[p] == 0)
                    used += (size_t)snprintf(who + used, sizeof who - used, "%s%d", used ? ", " : "", p);
            DEAR_ERROR("sock", "rank(s) %s did not connect to %s within DEAR_SOCKET_TIMEOUT_S=%g s (a firewall, or "
                               "DEAR_SOCKET_IFNAME picking an interface the others cannot reach?)",
                       who, s->address, timeout_s);
            su->rc = DEAR_ERR_NET;
            break;
        }
        if (pf_cap < n + 1) {
            struct pollfd *q = realloc(pf, sizeof *pf * (size_t)(n + 1));
            if (q == NULL) {
                su->rc = DEAR_ERR_NOMEM;
                break;
            }
            pf = q;
            pf_cap = n + 1;
        }
        double wake = deadline;
        pf[0] = (struct pollfd){ .fd = now >= su->listen_after ? lfd : -1, .events = POLLIN };
        if (now < su->listen_after && su->listen_after < wake)
            wake = su->listen_after;
        for (int i = 0; i < n; i++) {
            link_t *k = &su->links[i];
            int out = k->step == C_CONNECT || k->step == C_HELLO || k->step == C_PROOF || k->step == A_ANSWER;
            pf[i + 1] = (struct pollfd){ .fd = k->fd, .events = out ? POLLOUT : POLLIN };
            if (k->deadline < wake)
                wake = k->deadline;
        }
        int ready = poll(pf, (nfds_t)n + 1, (int)((wake - now) * 1e3) + 1);
        if (ready < 0 && errno != EINTR) {
            DEAR_ERROR("sock", "poll failed: %s", strerror(errno));
            su->rc = DEAR_ERR_NET;
            break;
        }
        for (int i = 0; ready > 0 && i < n; i++) {
            link_t *k = &su->links[i];
            if (pf[i + 1].revents == 0 || k->step == L_GONE)
                continue;
            if (k->step >= A_HELLO)
                step_acceptor(su, k);
            else
                step_connector(su, k);
        }
        if (ready > 0 && (pf[0].revents & POLLIN))
            accept_new(su, lfd, mono_now());
    }
    free(pf);
    for (int i = 0; i < su->nlinks; i++)
        link_close(&su->links[i]);
    su->nlinks = 0;
    if (su->strays > MAX_STRAY_LOG)
        DEAR_WARN("sock", "turned away %d connections to %s in all during set-up", su->strays, s->address);
    if (su->twice >= 0 && su->rc == DEAR_OK)
        su->rc = DEAR_ERR_AUTH;
    return su->rc;
}

/* Listen on this rank's address; fills ep and s->address. */
static int listen_on(dear_sock_t *s, const char *ifnames, int *lfd, endpoint_t *ep)
{
    struct in_addr addr;
    char ifname[IF_NAMESIZE + 1];
    DEAR_CHECK(pick_address(ifnames, &addr, ifname, sizeof ifname));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        DEAR_ERROR("sock", "socket() failed: %s", strerror(errno));
        return DEAR_ERR_NET;
    }
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = 0, .sin_addr = addr };
    socklen_t len = sizeof sa;
    /* A backlog beyond the ranks: strangers knocking at once must not push a rank's SYN out. */
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, s->size + SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &addr, ip, sizeof ip);
        DEAR_ERROR("sock", "could not listen on %s (%s): %s", ip, ifname, strerror(errno));
        close(fd);
        return DEAR_ERR_NET;
    }
    addr_string(addr, ntohs(sa.sin_port), s->address, sizeof s->address);
    DEAR_DEBUG("sock", "listening on %s (%s)", s->address, ifname);
    ep->ip = sa.sin_addr.s_addr;
    ep->port = sa.sin_port;
    *lfd = fd;
    return DEAR_OK;
}

/* Every rank's verdict: the worst status of all (they are negative). */
static int agree(MPI_Comm comm, int rc, int *all)
{
    DEAR_MPI_CHECK(MPI_Allreduce(&rc, all, 1, MPI_INT, MPI_MIN, comm));
    return DEAR_OK;
}

/* Both ends of a connection know its acceptor's nonce; MPI, which the ranks trust, confirms
 * they hold the same one. A connection a rank accepted as rank c that is not the one c made
 * (c made another, or none: its own was refused once the acceptor was done) was made by another
 * process holding the key: c is raised to *twice (the lowest such). An acceptor that holds none
 * for c merely timed out, which the set-up's status already says. */
static int check_bindings(dear_sock_t *s, MPI_Comm comm, const uint64_t *mine, int *twice)
{
    int rc = DEAR_OK;
    uint64_t *theirs = NULL;
    DEAR_ALLOC_GOTO(theirs, calloc((size_t)s->size, sizeof *theirs), sizeof *theirs * (size_t)s->size, rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Alltoall(mine, 1, MPI_UINT64_T, theirs, 1, MPI_UINT64_T, comm), rc, out);
    for (int p = 0; p < s->size; p++) {
        uint64_t acceptor_holds = p > s->rank ? mine[p] : theirs[p];
        if (p == s->rank || mine[p] == theirs[p] || acceptor_holds == 0)
            continue;
        int c = p > s->rank ? p : s->rank;
        if (p > s->rank)
            DEAR_ERROR("sock", "the connection rank %d accepted as rank %d is not the one rank %d made: another "
                               "process proved it holds this job's key",
                       s->rank, c, c);
        if (*twice < 0 || c < *twice)
            *twice = c;
    }
out:
    free(theirs);
    return rc;
}

/* The set-up's verdict: the worst status, the lowest rank any rank saw prove itself twice
 * (-1: none) with a rank it connected to, named on every rank, and whether any rank asked for
 * rings (*rings; the host-level step is collective, so all take it or none). */
static int agree_setup(dear_sock_t *s, MPI_Comm comm, int rc, int twice, size_t ring_bytes, int *all, int *rings)
{
    long long mine[3] = { rc, twice >= 0 ? (long long)twice * s->size + s->rank : LLONG_MAX, -(ring_bytes > 0) };
    long long both[3];
    DEAR_MPI_CHECK(MPI_Allreduce(mine, both, 3, MPI_LONG_LONG, MPI_MIN, comm));
    *all = (int)both[0];
    *rings = both[2] < 0;
    if (both[1] != LLONG_MAX) {
        int c = (int)(both[1] / s->size), seen_by = (int)(both[1] % s->size);
        DEAR_ERROR("sock", "rank %d connected twice, proving both times that it holds this job's key (seen by rank %d; "
                           "another process has the key, or the rank runs twice): the socket transport is not set up",
                   c, seen_by);
        if (*all == DEAR_OK || *all == DEAR_ERR_NET)
            *all = DEAR_ERR_AUTH;
    }
    return DEAR_OK;
}

static int epoll_setup(dear_sock_t *s)
{
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    s->poke_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->ep < 0 || s->poke_fd < 0) {
        DEAR_ERROR("sock", "epoll or eventfd set-up failed: %s", strerror(errno));
        return DEAR_ERR_NET;
    }
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = POKE_TAG };
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, s->poke_fd, &ev) != 0)
        goto fail;
    for (int p = 0; p < s->size; p++) {
        if (p == s->rank)
            continue;
        ev = (struct epoll_event){ .events = EPOLLIN, .data.u64 = (uint64_t)p };
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, s->peers[p].fd, &ev) != 0)
            goto fail;
    }
    return DEAR_OK;
fail:
    DEAR_ERROR("sock", "epoll_ctl failed: %s", strerror(errno));
    return DEAR_ERR_NET;
}

int dear_sock_create(MPI_Comm comm, const char *ifnames, double timeout_s, dear_sock_t **out)
{
    int rc = DEAR_OK, all = DEAR_OK, lfd = -1;
    size_t ring_bytes = 0;
    dear_sock_t *s = NULL;
    endpoint_t *eps = NULL, me = { 0 };
    setup_t su = { .twice = -1 };
    unsigned char key[DEAR_SOCK_KEY_BYTES] = { 0 };
    struct sockaddr_in *addrs = NULL;
    int rank, size;
    DEAR_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    DEAR_MPI_CHECK(MPI_Comm_size(comm, &size));
    DEAR_ALLOC_GOTO(s, calloc(1, sizeof *s), sizeof *s, rc, local);
    s->ep = s->poke_fd = -1;
    s->rank = rank;
    s->size = size;
    s->max_message = DEAR_SOCK_MAX_MESSAGE_DEFAULT;
    s->max_unexpected = DEAR_SOCK_MAX_UNEXPECTED_DEFAULT;
    s->dead_s = dear_param_double(DEAR_P_SOCKET_DEAD_S);
    DEAR_PTHREAD_CHECK_GOTO(pthread_mutex_init(&s->lock, NULL), rc, local);
    DEAR_ALLOC_GOTO(s->peers, calloc((size_t)size, sizeof *s->peers), (size_t)size * sizeof *s->peers, rc, local);
    for (int p = 0; p < size; p++)
        s->peers[p].fd = -1;
    DEAR_ALLOC_GOTO(s->discard, malloc(DISCARD_BYTES), DISCARD_BYTES, rc, local);
    DEAR_ALLOC_GOTO(eps, calloc((size_t)size, sizeof *eps), (size_t)size * sizeof *eps, rc, local);
    DEAR_ALLOC_GOTO(addrs, calloc((size_t)size, sizeof *addrs), (size_t)size * sizeof *addrs, rc, local);
    DEAR_ALLOC_GOTO(su.state, calloc((size_t)size, sizeof *su.state), (size_t)size * sizeof *su.state, rc, local);
    DEAR_ALLOC_GOTO(su.binding, calloc((size_t)size, sizeof *su.binding), (size_t)size * sizeof *su.binding, rc,
                    local);
    ring_bytes = (size_t)dear_param_int(DEAR_P_SOCKET_SHM_BYTES);
    DEAR_CHECK_GOTO(dear_shm_check(ring_bytes), rc, local);
    su.cap = size + 16;
    DEAR_ALLOC_GOTO(su.links, malloc(sizeof *su.links * (size_t)su.cap), sizeof *su.links * (size_t)su.cap, rc,
                    local);
    /* The fabric's key: random, carried by MPI only, and on the wire never itself (sock_auth.h). */
    if (rank == 0 && dear_sock_random(key, sizeof key) != 0) {
        DEAR_ERROR("sock", "getrandom failed: %s", strerror(errno));
        rc = DEAR_ERR_NET;
        goto local;
    }
    rc = listen_on(s, ifnames, &lfd, &me);
local:
    /* Nothing so far depended on the others: agree before anyone waits for a connection. */
    DEAR_CHECK_GOTO(agree(comm, rc, &all), rc, out);
    if (all != DEAR_OK) {
        rc = all;
        goto out;
    }
    DEAR_MPI_CHECK_GOTO(MPI_Allgather(&me, sizeof me, MPI_BYTE, eps, sizeof me, MPI_BYTE, comm), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(key, sizeof key, MPI_BYTE, 0, comm), rc, out);
    for (int p = 0; p < size; p++) {
        addrs[p] = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = eps[p].port,
                                         .sin_addr.s_addr = eps[p].ip };
        addr_string(addrs[p].sin_addr, ntohs(eps[p].port), s->peers[p].addr, sizeof s->peers[p].addr);
    }
    if (g_hooked && g_hooks.before_connect) {
        dear_sock_setup_view_t v = { .rank = rank, .size = size, .key = key, .addrs = addrs };
        g_hooks.before_connect(g_hooks.arg, &v);
    }
    su.s = s;
    su.eps = eps;
    su.key = key;
    rc = connect_all(&su, lfd, timeout_s);
    /* Whoever still knocks (a rank whose place was taken) is refused now, not left waiting. */
    close(lfd);
    lfd = -1;
    int brc = check_bindings(s, comm, su.binding, &su.twice);
    if (rc == DEAR_OK)
        rc = brc;
    if (rc == DEAR_OK && su.twice >= 0)
        rc = DEAR_ERR_AUTH;
    if (rc == DEAR_OK)
        rc = epoll_setup(s);
    int rings = 0, arc = agree_setup(s, comm, rc, su.twice, ring_bytes, &all, &rings);
    if (arc != DEAR_OK)
        rc = arc;
    else if (rc == DEAR_OK || all == DEAR_ERR_AUTH) /* an impostor is every rank's verdict */
        rc = all;
    /* Every rank is here with the same verdict: the rings are set up by all or by none, and
     * not even tried (no split by host, no collectives) when no rank asked. */
    if (rc == DEAR_OK && rings)
        rc = dear_shm_create(comm, ring_bytes, &s->shm);
    for (int p = 0; p < size && rc == DEAR_OK; p++) {
        s->peers[p].rin = dear_shm_ring_in(s->shm, p);
        s->peers[p].rout = dear_shm_ring_out(s->shm, p);
    }
out:
    explicit_bzero(key, sizeof key);
    if (lfd >= 0)
        close(lfd);
    free(eps);
    free(addrs);
    free(su.state);
    free(su.binding);
    free(su.links);
    if (rc != DEAR_OK) {
        dear_sock_destroy(s);
        return rc;
    }
    *out = s;
    return DEAR_OK;
}

void dear_sock_destroy(dear_sock_t *s)
{
    if (s == NULL)
        return;
    if (s->peers) {
        for (int p = 0; p < s->size; p++) {
            peer_t *pe = &s->peers[p];
            /* Only messages nobody holds a handle to are ours to free; an unexpected one being
             * read is also on its queue. */
            if (pe->cur && pe->cur->orphan && pe->cur->kind != MSG_UNEXPECTED)
                msg_free(pe->cur);
            for (dear_sock_msg_t *m = pe->rhead, *next; m; m = next) {
                next = m->rnext;
                if (m->orphan && m->kind != MSG_UNEXPECTED)
                    msg_free(m);
            }
            queue_t *qs[3] = { &pe->sendq, &pe->posted, &pe->unexpected };
            for (int i = 0; i < 3; i++)
                while (qs[i]->head) {
                    dear_sock_msg_t *m = qs[i]->head;
                    q_remove(qs[i], m);
                    if (m->orphan || m->kind == MSG_UNEXPECTED)
                        msg_free(m);
                }
            if (pe->fd >= 0)
                close(pe->fd);
        }
    }
    if (s->ep >= 0)
        close(s->ep);
    if (s->poke_fd >= 0)
        close(s->poke_fd);
    dear_shm_destroy(s->shm);
    free(s->peers);
    free(s->discard);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
