/*
 * Shared-memory rings between ranks of one host, for the socket transport (sock_shm.h).
 */
#include "collectives/sock_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "base/mpi_check.h"
#include "collectives/sock_auth.h"

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "ring counters are shared between processes: their atomics must not take a lock");

/* Each side's counter and flag on a cache line of their own: the two sides write apart. */
typedef struct {
    _Alignas(64) _Atomic uint64_t head; /* bytes ever written: the writer's */
    _Atomic uint32_t writer_waits;      /* the writer found no room */
    _Alignas(64) _Atomic uint64_t tail; /* bytes ever read: the reader's */
    _Atomic uint32_t reader_waits;      /* the reader found nothing */
} ring_ctl_t;

struct dear_ring {
    ring_ctl_t *ctl; /* NULL: no ring with this peer */
    unsigned char *data;
    size_t size;
    uint64_t mine; /* this side's counter: only it writes it, so only its own copy is believed */
};

struct dear_shm {
    int size;
    dear_ring_t *in, *out; /* per rank of comm */
    void **maps;           /* per rank of the host: its segment, mapped here */
    size_t *map_bytes;
    int nlocal;
};

/* What a rank of a host tells the others about its segment. */
typedef struct {
    char name[40];
    uint64_t ring_bytes;
    int32_t ok;   /* 1: created; 0: this rank asks for no rings, or could not create them */
    int32_t rank; /* in comm */
} seg_rec_t;

static size_t slot_bytes(size_t ring_bytes)
{
    return sizeof(ring_ctl_t) + ring_bytes;
}

/* A segment holds the rings into its rank from the nlocal - 1 others of its host; the ring from
 * rank `from` of the host into rank `to` is slot slot_of(from, to). */
static int slot_of(int from, int to)
{
    return from < to ? from : from - 1;
}

/* Create this rank's segment (zeroed, its pages reserved). 1 on success. */
static int seg_create(seg_rec_t *me, size_t ring_bytes, int nlocal, void **map, size_t *bytes)
{
    unsigned char rnd[16];
    if (dear_sock_random(rnd, sizeof rnd) != 0) {
        DEAR_WARN("sock", "shared memory: getrandom failed (%s)", strerror(errno));
        return 0;
    }
    int n = snprintf(me->name, sizeof me->name, "/dear-");
    for (size_t i = 0; i < sizeof rnd; i++)
        n += snprintf(me->name + n, sizeof me->name - (size_t)n, "%02x", rnd[i]);
    *bytes = slot_bytes(ring_bytes) * (size_t)(nlocal - 1);
    /* Exclusive and private to this user: nobody can have made it ahead of us, or open it after. */
    int fd = shm_open(me->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        DEAR_WARN("sock", "shared memory: shm_open(%s) failed (%s)", me->name, strerror(errno));
        return 0;
    }
    /* Reserved, not only sized: a /dev/shm too small (a container's 64 MiB) fails here, where a
     * page touched later past its end would be SIGBUS. */
    void *p = MAP_FAILED;
    int err = posix_fallocate(fd, 0, (off_t)*bytes);
    if (err == 0) {
        p = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        err = errno;
    }
    close(fd);
    if (p == MAP_FAILED) {
        DEAR_WARN("sock", "shared memory: a segment of %zu bytes could not be made (%s)", *bytes, strerror(err));
        shm_unlink(me->name);
        return 0;
    }
    *map = p;
    return 1;
}

/* Map a peer's segment, checking it is the size its record implies. 1 on success. */
static int seg_map(const seg_rec_t *rec, int nlocal, void **map, size_t *bytes)
{
    if (rec->ring_bytes < DEAR_SHM_RING_MIN || rec->ring_bytes > DEAR_SHM_RING_MAX || rec->ring_bytes % 64) {
        DEAR_WARN("sock", "shared memory: rank %d's rings of %llu bytes are not a size this build makes", rec->rank,
                  (unsigned long long)rec->ring_bytes);
        return 0;
    }
    *bytes = slot_bytes(rec->ring_bytes) * (size_t)(nlocal - 1);
    int fd = shm_open(rec->name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        DEAR_WARN("sock", "shared memory: rank %d's segment %s could not be opened (%s)", rec->rank, rec->name,
                  strerror(errno));
        return 0;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size == *bytes)
        p = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    else
        DEAR_WARN("sock", "shared memory: rank %d's segment %s is not the %zu bytes it should be", rec->rank,
                  rec->name, *bytes);
    close(fd);
    if (p == MAP_FAILED)
        return 0;
    *map = p;
    return 1;
}

static dear_ring_t ring_at(void *seg, size_t ring_bytes, int slot)
{
    unsigned char *base = (unsigned char *)seg + slot_bytes(ring_bytes) * (size_t)slot;
    return (dear_ring_t){ .ctl = (ring_ctl_t *)base, .data = base + sizeof(ring_ctl_t), .size = ring_bytes };
}

void dear_shm_destroy(dear_shm_t *shm)
{
    if (shm == NULL)
        return;
    for (int i = 0; i < shm->nlocal; i++)
        if (shm->maps[i])
            munmap(shm->maps[i], shm->map_bytes[i]);
    free(shm->maps);
    free(shm->map_bytes);
    free(shm->in);
    free(shm->out);
    free(shm);
}

/* With every rank of the host: each rank's segment is made and mapped by all (the records
 * say who asked for what), or, any rank short, none is kept. *ok the host's verdict. */
static int host_rings(dear_shm_t *shm, MPI_Comm node, int me, int rank, size_t ring_bytes, int *ok)
{
    int rc = DEAR_OK, nlocal = shm->nlocal;
    seg_rec_t mine = { .ring_bytes = ring_bytes, .rank = rank }, *recs = NULL;
    DEAR_ALLOC_GOTO(recs, calloc((size_t)nlocal, sizeof *recs), sizeof *recs * (size_t)nlocal, rc, out);
    mine.ok = ring_bytes > 0 && seg_create(&mine, ring_bytes, nlocal, &shm->maps[me], &shm->map_bytes[me]);
    DEAR_MPI_CHECK_GOTO(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, recs, sizeof mine, MPI_BYTE, node), rc, out);
    int mapped = 1;
    for (int i = 0; i < nlocal; i++)
        mapped &= recs[i].ok == 1;
    for (int i = 0; i < nlocal && mapped; i++)
        if (i != me) {
            recs[i].name[sizeof recs[i].name - 1] = '\0';
            mapped = seg_map(&recs[i], nlocal, &shm->maps[i], &shm->map_bytes[i]);
        }
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&mapped, ok, 1, MPI_INT, MPI_MIN, node), rc, out);
out:
    /* Every peer has mapped it or given up: the name has served. */
    if (mine.ok)
        shm_unlink(mine.name);
    /* Said once per host, and only where some rank asked for rings (they are off by default). */
    if (recs && rc == DEAR_OK && !*ok && me == 0) {
        int asked = 0, off = 0;
        for (int i = 0; i < nlocal; i++) {
            asked += recs[i].ring_bytes > 0;
            off += recs[i].ok != 1;
        }
        if (asked && off)
            DEAR_WARN("sock", "shared memory: %d of the %d ranks of this host made no rings (DEAR_SOCKET_SHM_BYTES=0 "
                              "there, or they said why): this host's ranks talk over TCP",
                      off, nlocal);
        else if (asked)
            DEAR_WARN("sock", "shared memory: a rank of this host could not map a peer's rings (it said why): this "
                              "host's ranks talk over TCP");
    }
    free(recs);
    return rc;
}

int dear_shm_check(size_t ring_bytes)
{
    if (ring_bytes > 0 && (ring_bytes < DEAR_SHM_RING_MIN || ring_bytes > DEAR_SHM_RING_MAX)) {
        DEAR_ERROR("sock", "DEAR_SOCKET_SHM_BYTES=%zu: a ring holds %d to %zu bytes (0 turns rings off)", ring_bytes,
                   DEAR_SHM_RING_MIN, DEAR_SHM_RING_MAX);
        return DEAR_ERR_PARAM;
    }
    return DEAR_OK;
}

int dear_shm_create(MPI_Comm comm, size_t ring_bytes, dear_shm_t **out)
{
    int rc = DEAR_OK, size, me, nlocal, ok = 0;
    MPI_Comm node = MPI_COMM_NULL;
    dear_shm_t *shm = NULL;
    int *ranks = NULL;
    DEAR_MPI_CHECK(MPI_Comm_size(comm, &size));
    int rank;
    DEAR_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    DEAR_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    DEAR_MPI_CHECK_GOTO(MPI_Comm_size(node, &nlocal), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_rank(node, &me), rc, out);
    if (nlocal == 1)
        goto out;
    /* Many ranks on a host: no rank's rings take more than DEAR_SHM_RANK_BYTES in all. Whole
     * cache lines, as every rank rounds them: a peer derives the size from the segment's. */
    if (ring_bytes > DEAR_SHM_RANK_BYTES / (size_t)(nlocal - 1))
        ring_bytes = DEAR_SHM_RANK_BYTES / (size_t)(nlocal - 1);
    if (ring_bytes > 0 && ring_bytes < DEAR_SHM_RING_MIN)
        ring_bytes = DEAR_SHM_RING_MIN;
    ring_bytes = ring_bytes / 64 * 64;
    DEAR_ALLOC_GOTO(ranks, calloc((size_t)nlocal, sizeof *ranks), sizeof *ranks * (size_t)nlocal, rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Allgather(&rank, 1, MPI_INT, ranks, 1, MPI_INT, node), rc, out);
    DEAR_ALLOC_GOTO(shm, calloc(1, sizeof *shm), sizeof *shm, rc, out);
    shm->size = size;
    shm->nlocal = nlocal;
    DEAR_ALLOC_GOTO(shm->maps, calloc((size_t)nlocal, sizeof *shm->maps), sizeof *shm->maps * (size_t)nlocal, rc,
                    out);
    DEAR_ALLOC_GOTO(shm->map_bytes, calloc((size_t)nlocal, sizeof *shm->map_bytes),
                    sizeof *shm->map_bytes * (size_t)nlocal, rc, out);
    DEAR_ALLOC_GOTO(shm->in, calloc((size_t)size, sizeof *shm->in), sizeof *shm->in * (size_t)size, rc, out);
    DEAR_ALLOC_GOTO(shm->out, calloc((size_t)size, sizeof *shm->out), sizeof *shm->out * (size_t)size, rc, out);
    DEAR_CHECK_GOTO(host_rings(shm, node, me, rank, ring_bytes, &ok), rc, out);
    if (!ok)
        goto out;
    for (int i = 0; i < nlocal; i++) {
        if (i == me)
            continue;
        shm->in[ranks[i]] = ring_at(shm->maps[me], ring_bytes, slot_of(i, me));
        /* The peer's rings have its size, which seg_map checked against the segment's. */
        size_t theirs = shm->map_bytes[i] / (size_t)(nlocal - 1) - sizeof(ring_ctl_t);
        shm->out[ranks[i]] = ring_at(shm->maps[i], theirs, slot_of(me, i));
    }
    DEAR_DEBUG("sock", "shared memory: rings of %zu bytes with the %d other ranks of this host", ring_bytes,
               nlocal - 1);
out:
    if (node != MPI_COMM_NULL)
        MPI_Comm_free(&node);
    free(ranks);
    if (rc != DEAR_OK || !ok) {
        dear_shm_destroy(shm);
        shm = NULL;
    }
    if (rc == DEAR_OK)
        *out = shm;
    return rc;
}

dear_ring_t *dear_shm_ring_in(const dear_shm_t *shm, int peer)
{
    return shm && shm->in[peer].ctl ? &shm->in[peer] : NULL;
}

dear_ring_t *dear_shm_ring_out(const dear_shm_t *shm, int peer)
{
    return shm && shm->out[peer].ctl ? &shm->out[peer] : NULL;
}

size_t dear_ring_bytes(const dear_ring_t *r)
{
    return r->size;
}

/* Copy n bytes between a ring position and flat memory, in two pieces where it wraps. */
static void ring_copy(dear_ring_t *r, uint64_t pos, unsigned char *flat, size_t n, int into_ring)
{
    size_t at = (size_t)(pos % r->size), first = n < r->size - at ? n : r->size - at;
    if (into_ring) {
        memcpy(r->data + at, flat, first);
        memcpy(r->data, flat + first, n - first);
    } else {
        memcpy(flat, r->data + at, first);
        memcpy(flat + first, r->data, n - first);
    }
}

long long dear_ring_put(dear_ring_t *r, const void *src, size_t n)
{
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire), used = r->mine - tail;
    if (used > r->size)
        return -1;
    size_t room = r->size - (size_t)used, k = n < room ? n : room;
    if (k == 0)
        return 0;
    ring_copy(r, r->mine, (unsigned char *)src, k, 1);
    r->mine += k;
    atomic_store(&r->ctl->head, r->mine); /* seq_cst: ordered before the look at the reader's flag */
    return (long long)k;
}

long long dear_ring_get(dear_ring_t *r, void *dst, size_t n)
{
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire), avail = head - r->mine;
    if (avail > r->size)
        return -1;
    size_t k = n < avail ? n : (size_t)avail;
    if (k == 0)
        return 0;
    if (dst)
        ring_copy(r, r->mine, dst, k, 0);
    r->mine += k;
    atomic_store(&r->ctl->tail, r->mine);
    return (long long)k;
}

int dear_ring_wait_data(dear_ring_t *r)
{
    atomic_store(&r->ctl->reader_waits, 1);
    if (atomic_load(&r->ctl->head) != r->mine) {
        atomic_store(&r->ctl->reader_waits, 0);
        return 0;
    }
    return 1;
}

int dear_ring_wait_room(dear_ring_t *r)
{
    atomic_store(&r->ctl->writer_waits, 1);
    if (r->mine - atomic_load(&r->ctl->tail) < r->size) {
        atomic_store(&r->ctl->writer_waits, 0);
        return 0;
    }
    return 1;
}

int dear_ring_reader_waits(dear_ring_t *r)
{
    return atomic_load(&r->ctl->reader_waits) && atomic_exchange(&r->ctl->reader_waits, 0);
}

int dear_ring_writer_waits(dear_ring_t *r)
{
    return atomic_load(&r->ctl->writer_waits) && atomic_exchange(&r->ctl->writer_waits, 0);
}

void dear_ring_claim(dear_ring_t *r, uint64_t value, int writer)
{
    atomic_store(writer ? &r->ctl->head : &r->ctl->tail, value);
}
