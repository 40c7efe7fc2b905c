/*
 * The socket transport (sock.h): connection set-up over MPI, then framed messages on one TCP
 * connection per pair, moved by non-blocking reads and writes that an epoll set says are ready.
 *
 * A message on the wire is a 16-byte header (context, tag, length; little-endian as the
 * sender's memory is: every rank of a job runs the same build) and its payload. Per peer there
 * is a send queue (the head may be partly written), the receives posted and not yet matched,
 * the messages that arrived before their receive ("unexpected", with buffers of their own), and
 * the one message whose payload is being read now (cur). Everything is under the fabric's lock.
 */
#include "collectives/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
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
#include "base/sync.h"
#include "base/util.h"

#define HDR_BYTES 16
#define HELLO_MAGIC 0x64656172736f636bULL /* "dearsock" */
#define MAX_EVENTS 64
#define DISCARD_BYTES 65536
#define HELLO_WAIT_S 5.0
/* The eventfd's epoll tag: peer indices are below it. */
#define POKE_TAG UINT64_MAX

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
    dear_sock_msg_t *cur;       /* the message whose payload is being read, or NULL */
    unsigned char rhdr[HDR_BYTES];
    size_t rhdr_got;
} peer_t;

struct dear_sock {
    pthread_mutex_t lock;
    int rank, size;
    int ep, poke_fd;
    peer_t *peers;
    char *discard;
    uint64_t messages, timeouts;
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
    DEAR_ERROR("sock", "connection to rank %d %s%s%s; its messages fail", p, what, err ? ": " : "",
               err ? strerror(err) : "");
    epoll_ctl(s->ep, EPOLL_CTL_DEL, pe->fd, NULL);
    shutdown(pe->fd, SHUT_RDWR);
    /* An unexpected message being read is also on its queue, freed there. */
    dear_sock_msg_t *cur = pe->cur;
    pe->cur = NULL;
    if (cur && cur->kind != MSG_UNEXPECTED)
        msg_finish(s, cur, ST_FAILED);
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

/* Write queued messages until the queue is empty or the socket is full. */
static void peer_write(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
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
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                want_out(s, p, 1);
                return;
            }
            peer_fail(s, p, "failed while sending", errno);
            return;
        }
        m->off += (size_t)w;
        if (m->off < total)
            continue;
        pe->sendq.head = m->next;
        if (pe->sendq.head == NULL)
            pe->sendq.tail = NULL;
        m->next = NULL;
        msg_finish(s, m, ST_DONE);
    }
    want_out(s, p, 0);
}

/* ---- reading --------------------------------------------------------------------------- */

/* A header arrived: find its receive, or make it an unexpected message. 0 or -1 (failed). */
static int header_done(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    uint32_t ctx;
    int32_t tag;
    uint64_t len;
    memcpy(&ctx, pe->rhdr, 4);
    memcpy(&tag, pe->rhdr + 4, 4);
    memcpy(&len, pe->rhdr + 8, 8);
    pe->rhdr_got = 0;
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
    }
    pe->cur = m;
    return 0;
}

/* The payload of cur is complete. */
static void payload_done(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    dear_sock_msg_t *m = pe->cur;
    pe->cur = NULL;
    if (m->kind == MSG_UNEXPECTED)
        m->state = ST_DONE;   /* waits on the unexpected queue for its receive */
    else
        msg_finish(s, m, m->truncated ? ST_FAILED : ST_DONE);
}

/* Read whatever the socket holds into headers and payloads. */
static void peer_read(dear_sock_t *s, int p)
{
    peer_t *pe = &s->peers[p];
    while (!pe->failed) {
        ssize_t r;
        if (pe->cur == NULL) {
            r = recv(pe->fd, pe->rhdr + pe->rhdr_got, HDR_BYTES - pe->rhdr_got, MSG_DONTWAIT);
            if (r > 0) {
                pe->rhdr_got += (size_t)r;
                if (pe->rhdr_got == HDR_BYTES && header_done(s, p) != 0)
                    return;
                if (pe->cur && pe->cur->len == 0)
                    payload_done(s, p);
                continue;
            }
        } else {
            dear_sock_msg_t *m = pe->cur;
            size_t want = m->len - m->off;
            int drop = m->truncated || m->orphan;
            char *dst = drop ? s->discard : m->buf + m->off;
            if (drop && want > DISCARD_BYTES)
                want = DISCARD_BYTES;
            r = recv(pe->fd, dst, want, MSG_DONTWAIT);
            if (r > 0) {
                m->off += (size_t)r;
                if (m->off == m->len)
                    payload_done(s, p);
                continue;
            }
        }
        if (r == 0) {
            peer_fail(s, p, "was closed by the peer", 0);
            return;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            peer_fail(s, p, "failed while receiving", errno);
        return;
    }
}

/* ---- the API --------------------------------------------------------------------------- */

static int peer_check(const dear_sock_t *s, int peer, const char *what)
{
    if (peer < 0 || peer >= s->size || peer == s->rank) {
        DEAR_ERROR("sock", "%s: peer %d is not another rank of the %d", what, peer, s->size);
        return DEAR_ERR_INTERNAL;
    }
    return DEAR_OK;
}

int dear_sock_isend(dear_sock_t *s, int peer, uint32_t ctx, int tag, const void *buf, size_t bytes,
                    dear_sock_msg_t **msg)
{
    DEAR_CHECK(peer_check(s, peer, "dear_sock_isend"));
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
    DEAR_CHECK(peer_check(s, peer, "dear_sock_irecv"));
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
        if (pe->cur == u) {
            pe->cur = m;  /* the rest of it arrives straight into buf */
        } else {
            msg_finish(s, m, m->truncated ? ST_FAILED : ST_DONE);
        }
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

typedef struct {
    uint64_t magic, key;
    int32_t rank, pad;
} hello_t;

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wait until fd is ready for events, at most until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - mono_now();
        if (left <= 0)
            return 0;
        struct pollfd pf = { .fd = fd, .events = events };
        int n = poll(&pf, 1, (int)(left * 1e3) + 1);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* Blocking-style I/O of a small record on a non-blocking socket, within the deadline. */
static int io_all(int fd, void *p, size_t n, int out, double deadline)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = out ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
        if (r > 0) {
            c += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return -1;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        if (wait_fd(fd, out ? POLLOUT : POLLIN, deadline) <= 0)
            return -1;
    }
    return 0;
}

static int tune(int fd)
{
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Connect to a lower rank and introduce ourselves. */
static int connect_to(dear_sock_t *s, int p, const endpoint_t *ep, uint64_t key, double deadline)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = ep->port, .sin_addr.s_addr = ep->ip };
    char where[48];
    snprintf(where, sizeof where, "%s:%u", inet_ntoa(sa.sin_addr), (unsigned)ntohs(ep->port));
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            DEAR_ERROR("sock", "socket() failed: %s", strerror(errno));
            return DEAR_ERR_NET;
        }
        int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa), err = 0;
        if (rc != 0 && errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline);
            socklen_t len = sizeof err;
            if (w <= 0)
                err = w == 0 ? ETIMEDOUT : errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
        } else if (rc != 0) {
            err = errno;
        }
        if (err == 0) {
            hello_t h = { HELLO_MAGIC, key, s->rank, 0 };
            if (tune(fd) == 0 && io_all(fd, &h, sizeof h, 1, deadline) == 0) {
                s->peers[p].fd = fd;
                return DEAR_OK;
            }
            err = errno ? errno : EPIPE;
        }
        close(fd);
        /* Only an interrupted attempt is retried: every listener was up before the ranks agreed
         * to connect, so a refusal is a firewall or an address this host cannot reach. */
        if (err == EINTR && mono_now() < deadline)
            continue;
        DEAR_ERROR("sock", "could not connect to rank %d at %s: %s (a firewall, or an interface the ranks cannot "
                           "reach each other on? DEAR_SOCKET_IFNAME picks it)",
                   p, where, strerror(err));
        return DEAR_ERR_NET;
    }
}

/* Accept the higher ranks' connections, each introducing itself. */
static int accept_all(dear_sock_t *s, int lfd, uint64_t key, double deadline)
{
    int want = s->size - 1 - s->rank;
    while (want > 0) {
        if (wait_fd(lfd, POLLIN, deadline) <= 0) {
            DEAR_ERROR("sock", "%d higher rank(s) did not connect to %s in time (a firewall, or DEAR_SOCKET_IFNAME "
                               "picking an interface the others cannot reach?)",
                       want, s->address);
            return DEAR_ERR_NET;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED)
                continue;
            DEAR_ERROR("sock", "accept failed: %s", strerror(errno));
            return DEAR_ERR_NET;
        }
        /* A rank sends its hello as soon as it is connected: a connection silent for longer is a
         * stray, which must not hold up the ranks queued behind it. */
        double hello_by = mono_now() + HELLO_WAIT_S;
        hello_t h;
        if (io_all(fd, &h, sizeof h, 0, hello_by < deadline ? hello_by : deadline) != 0 || h.magic != HELLO_MAGIC ||
            h.key != key || h.rank <= s->rank || h.rank >= s->size || s->peers[h.rank].fd >= 0) {
            /* Not one of ours (a stray connection, another job): ignore it. */
            DEAR_WARN("sock", "ignored a connection to %s that did not introduce itself as a rank of this job",
                      s->address);
            close(fd);
            continue;
        }
        if (tune(fd) != 0) {
            DEAR_ERROR("sock", "setsockopt(TCP_NODELAY) failed: %s", strerror(errno));
            close(fd);
            return DEAR_ERR_NET;
        }
        s->peers[h.rank].fd = fd;
        want--;
    }
    return DEAR_OK;
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
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, s->size) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        DEAR_ERROR("sock", "could not listen on %s (%s): %s", inet_ntoa(addr), ifname, strerror(errno));
        close(fd);
        return DEAR_ERR_NET;
    }
    snprintf(s->address, sizeof s->address, "%s:%u", inet_ntoa(addr), (unsigned)ntohs(sa.sin_port));
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
    dear_sock_t *s = NULL;
    endpoint_t *eps = NULL, me = { 0 };
    int rank, size;
    DEAR_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    DEAR_MPI_CHECK(MPI_Comm_size(comm, &size));
    DEAR_ALLOC_GOTO(s, calloc(1, sizeof *s), sizeof *s, rc, local);
    s->ep = s->poke_fd = -1;
    s->rank = rank;
    s->size = size;
    DEAR_PTHREAD_CHECK_GOTO(pthread_mutex_init(&s->lock, NULL), rc, local);
    DEAR_ALLOC_GOTO(s->peers, calloc((size_t)size, sizeof *s->peers), (size_t)size * sizeof *s->peers, rc, local);
    for (int p = 0; p < size; p++)
        s->peers[p].fd = -1;
    DEAR_ALLOC_GOTO(s->discard, malloc(DISCARD_BYTES), DISCARD_BYTES, rc, local);
    DEAR_ALLOC_GOTO(eps, calloc((size_t)size, sizeof *eps), (size_t)size * sizeof *eps, rc, local);
    rc = listen_on(s, ifnames, &lfd, &me);
local:
    /* Nothing so far depended on the others: agree before anyone waits for a connection. */
    DEAR_CHECK_GOTO(agree(comm, rc, &all), rc, out);
    if (all != DEAR_OK) {
        rc = all;
        goto out;
    }
    uint64_t key = 0;
    if (rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        key = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 16);
    }
    DEAR_MPI_CHECK_GOTO(MPI_Allgather(&me, sizeof me, MPI_BYTE, eps, sizeof me, MPI_BYTE, comm), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&key, 1, MPI_UINT64_T, 0, comm), rc, out);
    double deadline = mono_now() + timeout_s;
    for (int p = 0; p < rank && rc == DEAR_OK; p++)
        rc = connect_to(s, p, &eps[p], key, deadline);
    if (rc == DEAR_OK)
        rc = accept_all(s, lfd, key, deadline);
    if (rc == DEAR_OK)
        rc = epoll_setup(s);
    int arc = agree(comm, rc, &all);
    if (arc != DEAR_OK)
        rc = arc;
    else if (rc == DEAR_OK)
        rc = all;
out:
    if (lfd >= 0)
        close(lfd);
    free(eps);
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
    free(s->peers);
    free(s->discard);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
