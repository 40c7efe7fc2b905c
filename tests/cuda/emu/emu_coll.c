/*
 * emu_coll.c: the ranks of an emulated NCCL communicator meet in one POSIX shared-memory
 * segment named after the unique id: a header (the ranks' identities, a futex barrier, the
 * shared error, each rank's current collective) and one staging slot per rank. A collective
 * moves its data through the slots a chunk at a time: every rank stages its chunk, a barrier,
 * every rank reads what it needs, a barrier. No MPI is involved, as with real NCCL.
 *
 * Arithmetic, the same on every rank so that all get the same bits: elements are reduced in rank
 * order 0..n-1; float16 and bfloat16 are widened to float32, reduced in float32 and rounded once
 * (round to nearest even; NaN becomes 0x7fff as CUDA's conversions give). ncclAvg is what NCCL
 * does (enqueue.cc, hostToDevRedOp): floating types multiply every input by 1/nranks rounded to
 * the type (ncclDevPreMulSum) and then sum; integers sum and divide (ncclDevSumPostDiv). Real
 * NCCL reduces in ring or tree order and rounds 16-bit types at each step, so its last bits may
 * differ from these.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tests/cuda/emu/emu_nccl.h"

#define SHM_MAGIC 0x43554d53u
#define SHM_PREFIX "cuemu-nccl-"
/* Staging per rank and chunk: large enough that big collectives need few barriers, small
 * enough for four ranks in /dev/shm. */
#define SLOT_BYTES ((size_t)1 << 20)

struct shm_rank {
    atomic_int pid;          /* 0 until the rank joined */
    atomic_int left;         /* the rank aborted, destroyed or exited */
    atomic_uint waiting_gen; /* the barrier generation it waits to pass */
    struct emu_ident ident;
    struct emu_opdesc desc;  /* its current collective */
};

struct shm_hdr {
    atomic_uint ready; /* SHM_MAGIC once the creator set it up */
    uint32_t nranks;
    uint64_t total, data_off;
    atomic_uint arrived, gen; /* the barrier */
    atomic_int err;           /* 0, -1 while a rank writes the error, 1 once it is set */
    int32_t err_rank, err_code, err_peers;
    char err_msg[512];
    struct shm_rank rank[];
};

struct emu_shm {
    struct shm_hdr *h;
    size_t total;
    int rank, nranks;
    char name[64];
    double timeout;
};

/* ---- types ---- */

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    float f;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float */
        f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return 0x7fff;
    if (u >= 0x47800000u) /* 65536 and above (65520 and above round up to it): infinity */
        return sign | 0x7c00;
    if (u < 0x38800000u) { /* below 2^-14: subnormal; float addition rounds to nearest even */
        float a, magic = 0.5f; /* 2^-1: its ulp is 2^-24, the half subnormal step */
        memcpy(&a, &u, sizeof a);
        a += magic;
        memcpy(&u, &a, sizeof u);
        return sign | (uint16_t)(u - 0x3f000000u);
    }
    uint32_t odd = (u >> 13) & 1;
    u += 0xc8000fffu + odd; /* rebias the exponent (-112 << 23) and round to nearest even */
    return sign | (uint16_t)(u >> 13);
}

static float bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

size_t emu_dtype_size(int dtype)
{
    switch (dtype) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclFloat32:
    case ncclInt32: return 4;
    case ncclFloat64: return 8;
    default: return 0;
    }
}

static const char *dtype_name(int t)
{
    switch (t) {
    case ncclFloat16: return "float16";
    case ncclBfloat16: return "bfloat16";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclInt32: return "int32";
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    default: return "unsupported-type";
    }
}

static const char *op_name(int op)
{
    static const char *const names[] = {"sum", "prod", "max", "min", "avg"};
    return op >= 0 && op < 5 ? names[op] : "unsupported-op";
}

static const char *kind_name(int k)
{
    static const char *const names[] = {"AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce", "AlltoAll"};
    return k >= 0 && k < 6 ? names[k] : "?";
}

void emu_opdesc_str(const struct emu_opdesc *d, char *buf, size_t len)
{
    int rooted = d->kind == EMU_COLL_BROADCAST || d->kind == EMU_COLL_REDUCE;
    int reduces = d->kind != EMU_COLL_ALLGATHER && d->kind != EMU_COLL_BROADCAST && d->kind != EMU_COLL_ALLTOALL;
    int n = snprintf(buf, len, "%s(count=%llu, %s", kind_name(d->kind), (unsigned long long)d->count,
                     dtype_name(d->dtype));
    if (n >= 0 && (size_t)n < len && reduces)
        n += snprintf(buf + n, len - (size_t)n, ", %s", op_name(d->op));
    if (n >= 0 && (size_t)n < len && rooted)
        n += snprintf(buf + n, len - (size_t)n, ", root=%d", d->root);
    if (n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ")");
}

/* ---- reduction ---- */

static float load_f(int t, const char *p, size_t i)
{
    uint16_t h;
    float f;
    switch (t) {
    case ncclFloat16: memcpy(&h, p + 2 * i, 2); return f16_to_f32(h);
    case ncclBfloat16: memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h);
    default: memcpy(&f, p + 4 * i, 4); return f;
    }
}

/* f rounded to type t, as a float. */
static float round_f(int t, float f)
{
    return t == ncclFloat16 ? f16_to_f32(f32_to_f16(f)) : t == ncclBfloat16 ? bf16_to_f32(f32_to_bf16(f)) : f;
}

static void store_f(int t, char *p, size_t i, float f)
{
    uint16_t h;
    switch (t) {
    case ncclFloat16: h = f32_to_f16(f); memcpy(p + 2 * i, &h, 2); break;
    case ncclBfloat16: h = f32_to_bf16(f); memcpy(p + 2 * i, &h, 2); break;
    default: memcpy(p + 4 * i, &f, 4); break;
    }
}

#define EMU_COMBINE(op, acc, x)                                                                 \
    ((op) == ncclProd ? (acc) * (x) : (op) == ncclMax ? ((x) > (acc) ? (x) : (acc))              \
     : (op) == ncclMin ? ((x) < (acc) ? (x) : (acc)) : (acc) + (x))

/* dst[i] = src[0][i] op ... op src[n-1][i] for i < m, each src already offset to the chunk. */
static void reduce(int t, int op, int n, const char *const *src, char *dst, size_t m)
{
    if (t == ncclFloat64) {
        double s = 1.0 / n, acc = 0, x;
        for (size_t i = 0; i < m; i++) {
            for (int r = 0; r < n; r++) {
                memcpy(&x, src[r] + 8 * i, 8);
                x = op == ncclAvg ? x * s : x;
                acc = r == 0 ? x : EMU_COMBINE(op, acc, x);
            }
            memcpy(dst + 8 * i, &acc, 8);
        }
    } else if (t == ncclInt32) {
        int32_t x;
        for (size_t i = 0; i < m; i++) {
            uint32_t acc = 0; /* unsigned: wraps like the GPU's adds, without C's overflow */
            int32_t best = 0;
            for (int r = 0; r < n; r++) {
                memcpy(&x, src[r] + 4 * i, 4);
                if (op == ncclSum || op == ncclAvg)
                    acc += (uint32_t)x;
                else if (op == ncclProd)
                    acc = r == 0 ? (uint32_t)x : acc * (uint32_t)x;
                else
                    best = r == 0 ? x : EMU_COMBINE(op, best, x);
            }
            int32_t v = op == ncclMax || op == ncclMin ? best : (int32_t)acc;
            v = op == ncclAvg ? v / n : v;
            memcpy(dst + 4 * i, &v, 4);
        }
    } else {
        float s = round_f(t, (float)(1.0 / n)), acc = 0, x;
        for (size_t i = 0; i < m; i++) {
            for (int r = 0; r < n; r++) {
                x = load_f(t, src[r], i);
                x = op == ncclAvg ? round_f(t, x * s) : x;
                acc = r == 0 ? x : EMU_COMBINE(op, acc, x);
            }
            store_f(t, dst, i, acc);
        }
    }
}

/* ---- the segment ---- */

static long futex(atomic_uint *addr, int cmd, unsigned val, const struct timespec *ts)
{
    return syscall(SYS_futex, (unsigned *)addr, cmd, val, ts, NULL, 0);
}

static char *slot(struct emu_shm *sh, int r)
{
    return (char *)sh->h + sh->h->data_off + (size_t)r * SLOT_BYTES;
}

static void shm_name(const struct emu_uid *u, char *buf, size_t len)
{
    snprintf(buf, len, "/" SHM_PREFIX "%d-%016llx", (int)u->creator_pid, (unsigned long long)u->key);
}

static void vfail(struct emu_shm *sh, ncclResult_t code, ncclResult_t peers, const char *fmt, va_list ap)
{
    struct shm_hdr *h = sh->h;
    int zero = 0;
    if (!atomic_compare_exchange_strong(&h->err, &zero, -1))
        return; /* the first error stays */
    h->err_rank = sh->rank;
    h->err_code = code;
    h->err_peers = peers;
    vsnprintf(h->err_msg, sizeof h->err_msg, fmt, ap);
    atomic_store(&h->err, 1);
    futex(&h->gen, FUTEX_WAKE, INT_MAX, NULL);
}

void emu_shm_fail(struct emu_shm *sh, ncclResult_t code, ncclResult_t peers, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(sh, code, peers, fmt, ap);
    va_end(ap);
}

ncclResult_t emu_shm_error(struct emu_shm *sh, char *msg, size_t len)
{
    struct shm_hdr *h = sh->h;
    if (atomic_load(&h->err) != 1)
        return ncclSuccess;
    if (msg != NULL)
        snprintf(msg, len, "%s", h->err_msg);
    return h->err_rank == sh->rank ? (ncclResult_t)h->err_code : (ncclResult_t)h->err_peers;
}

static int pid_gone(int pid)
{
    return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

/* The ranks every rank waits for: passes when all arrived; fails on the communicator's error, on
 * *abort, on a peer that left or died while it was awaited, and after the timeout. */
/* Whether rank r has reached the barrier of generation g (or a later one). */
static int arrived(struct emu_shm *sh, int r, unsigned g)
{
    return (int)(atomic_load(&sh->h->rank[r].waiting_gen) - (g + 1)) >= 0;
}

static ncclResult_t barrier(struct emu_shm *sh, const atomic_int *abort, const char *what)
{
    struct shm_hdr *h = sh->h;
    unsigned g = atomic_load(&h->gen);
    atomic_store(&h->rank[sh->rank].waiting_gen, g + 1);
    if (atomic_fetch_add(&h->arrived, 1) + 1 == h->nranks) {
        atomic_store(&h->arrived, 0);
        atomic_store(&h->gen, g + 1);
        futex(&h->gen, FUTEX_WAKE, INT_MAX, NULL);
        return ncclSuccess;
    }
    double start = emu_now(), checked = start;
    while (atomic_load(&h->gen) == g) { /* passing wins over any error seen after it */
        ncclResult_t e = emu_shm_error(sh, NULL, 0);
        if (e != ncclSuccess)
            return e;
        if ((abort != NULL && atomic_load(abort)) || emu_exiting())
            return ncclInvalidUsage; /* this rank gives up: its own communicator is going away */
        double now = emu_now();
        if (now - checked > 0.1) {
            checked = now;
            for (int r = 0; r < sh->nranks; r++) {
                if (arrived(sh, r, g))
                    continue;
                int pid = atomic_load(&h->rank[r].pid);
                const char *how = atomic_load(&h->rank[r].left) ? "left the communicator (abort, destroy or exit)"
                                  : pid_gone(pid)               ? "died"
                                                                : NULL;
                if (how != NULL) {
                    emu_shm_fail(sh, ncclRemoteError, ncclRemoteError, "rank %d (pid %d) %s while rank %d waited "
                                 "for it in %s", r, pid, how, sh->rank, what);
                    return ncclRemoteError;
                }
            }
        }
        if (sh->timeout > 0 && now - start > sh->timeout) {
            char late[256] = "";
            for (int r = 0, n = 0; r < sh->nranks; r++)
                if (!arrived(sh, r, g))
                    n += snprintf(late + n, n < (int)sizeof late ? sizeof late - (size_t)n : 0, " %d", r);
            emu_flag(CUEMU_FLAG_NCCL_HANG, what, "rank %d waited %.0f s (CUEMU_NCCL_TIMEOUT_S) for rank(s)%s: a "
                     "rank that skipped this call, or issued it on another communicator or stream that waits",
                     sh->rank, sh->timeout, late);
            emu_shm_fail(sh, ncclSystemError, ncclSystemError, "rank %d waited %.0f s for rank(s)%s in %s",
                         sh->rank, sh->timeout, late, what);
            return ncclSystemError;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        futex(&h->gen, FUTEX_WAIT, g, &ts);
    }
    return ncclSuccess;
}

static int sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    return nanosleep(&ts, NULL);
}

/* Opens (creating it if this rank is first) and maps the segment. */
static ncclResult_t shm_open_map(struct emu_shm *sh, const atomic_int *abort, char *why, size_t whylen)
{
    size_t hdr = sizeof(struct shm_hdr) + (size_t)sh->nranks * sizeof(struct shm_rank);
    size_t off = (hdr + 4095) / 4096 * 4096;
    size_t total = off + (size_t)sh->nranks * SLOT_BYTES;
    double start = emu_now();
    for (;;) {
        if ((abort != NULL && atomic_load(abort)) || (sh->timeout > 0 && emu_now() - start > sh->timeout)) {
            snprintf(why, whylen, "gave up waiting for the communicator's shared memory %s", sh->name);
            return ncclSystemError;
        }
        int fd = shm_open(sh->name, O_RDWR | O_CREAT | O_EXCL, 0600);
        int creator = fd >= 0;
        if (!creator && errno == EEXIST)
            fd = shm_open(sh->name, O_RDWR, 0);
        if (fd < 0) {
            if (errno == ENOENT) /* removed between the two opens: try again */
                continue;
            snprintf(why, whylen, "shm_open %s: %s", sh->name, strerror(errno));
            return ncclSystemError;
        }
        struct stat st = {0};
        if (creator && ftruncate(fd, (off_t)total) != 0) {
            snprintf(why, whylen, "ftruncate %s to %zu bytes: %s", sh->name, total, strerror(errno));
            close(fd);
            shm_unlink(sh->name);
            return ncclSystemError;
        }
        if (fstat(fd, &st) != 0 || (size_t)st.st_size != total) {
            close(fd);
            if (st.st_size != 0 && (size_t)st.st_size != total) {
                snprintf(why, whylen, "the communicator's shared memory has %lld bytes, %zu expected: the ranks "
                         "passed different nranks", (long long)st.st_size, total);
                return ncclInvalidUsage;
            }
            sleep_ms(1); /* its creator has not sized it yet */
            continue;
        }
        void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED) {
            snprintf(why, whylen, "mmap %s: %s", sh->name, strerror(errno));
            return ncclSystemError;
        }
        sh->h = m;
        sh->total = total;
        if (creator) {
            sh->h->nranks = (uint32_t)sh->nranks;
            sh->h->total = total;
            sh->h->data_off = off;
            atomic_store(&sh->h->ready, SHM_MAGIC);
        }
        while (atomic_load(&sh->h->ready) != SHM_MAGIC)
            sleep_ms(1);
        if (sh->h->nranks != (uint32_t)sh->nranks) {
            snprintf(why, whylen, "this rank says nranks=%d, another said %u", sh->nranks, sh->h->nranks);
            return ncclInvalidUsage;
        }
        return ncclSuccess;
    }
}

/* NCCL's bus id number: "0000:18:00.0" is 0x18000. */
static long busid_number(const char *busid)
{
    char hex[16];
    int n = 0;
    for (const char *p = busid; *p && n < 15; p++)
        if (*p != ':' && *p != '.')
            hex[n++] = *p;
    hex[n] = '\0';
    return strtol(hex, NULL, 16);
}

ncclResult_t emu_shm_join(const ncclUniqueId *id, int nranks, int rank, const struct emu_ident *me,
                          const atomic_int *abort, struct emu_shm **out, char *why, size_t whylen)
{
    struct emu_uid u;
    memcpy(&u, id->internal, sizeof u);
    struct emu_shm *sh = calloc(1, sizeof *sh);
    if (sh == NULL) {
        snprintf(why, whylen, "out of memory");
        return ncclSystemError;
    }
    sh->rank = rank;
    sh->nranks = nranks;
    sh->timeout = (double)emu_env_long("CUEMU_NCCL_TIMEOUT_S", 60, 0, 86400);
    shm_name(&u, sh->name, sizeof sh->name);
    ncclResult_t r = shm_open_map(sh, abort, why, whylen);
    if (r != ncclSuccess)
        goto err;
    struct shm_rank *mine = &sh->h->rank[rank];
    int zero = 0;
    if (!atomic_compare_exchange_strong(&mine->pid, &zero, (int)getpid())) {
        snprintf(why, whylen, "rank %d joined twice (pids %d and %d)", rank, zero, (int)getpid());
        r = ncclInvalidUsage;
        goto err_map;
    }
    mine->ident = *me;
    r = barrier(sh, abort, "ncclCommInitRank");
    /* Everyone has opened it (or it failed): the name can go, so nothing stays in /dev/shm. */
    shm_unlink(sh->name);
    if (r != ncclSuccess) {
        if (emu_shm_error(sh, why, whylen) == ncclSuccess)
            snprintf(why, whylen, "ncclCommInitRank gave up (aborted, or the process is exiting)");
        goto err_map;
    }
    for (int a = 0; a < nranks; a++)
        for (int b = a + 1; b < nranks; b++) {
            const struct emu_ident *x = &sh->h->rank[a].ident, *y = &sh->h->rank[b].ident;
            if (x->host_hash == y->host_hash && strcmp(x->busid, y->busid) == 0) {
                snprintf(why, whylen, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", b, a,
                         busid_number(x->busid));
                r = ncclInvalidUsage;
                goto err_map;
            }
        }
    *out = sh;
    return ncclSuccess;

err_map:
    atomic_store(&sh->h->rank[rank].left, 1);
    munmap(sh->h, sh->total);
err:
    free(sh);
    return r;
}

void emu_shm_leave(struct emu_shm *sh)
{
    atomic_store(&sh->h->rank[sh->rank].left, 1);
    futex(&sh->h->gen, FUTEX_WAKE, INT_MAX, NULL);
}

void emu_shm_close(struct emu_shm *sh)
{
    munmap(sh->h, sh->total);
    free(sh);
}

int cuemu_shm_clean(void)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int pid;
        char name[300];
        if (strncmp(e->d_name, SHM_PREFIX, strlen(SHM_PREFIX)) != 0 ||
            sscanf(e->d_name + strlen(SHM_PREFIX), "%d-", &pid) != 1 || !pid_gone(pid))
            continue;
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* ---- collectives ---- */

static ncclResult_t check_same(struct emu_shm *sh, const struct emu_opdesc *mine, const char *what)
{
    for (int r = 0; r < sh->nranks; r++) {
        const struct emu_opdesc *o = &sh->h->rank[r].desc;
        const char *diff = o->seq != mine->seq       ? "the collectives' numbers"
                           : o->kind != mine->kind   ? "the operation"
                           : o->count != mine->count ? "the count"
                           : o->dtype != mine->dtype ? "the data type"
                           : o->op != mine->op       ? "the reduction op"
                           : o->root != mine->root   ? "the root"
                                                     : NULL;
        if (diff == NULL)
            continue;
        char a[128], b[128];
        emu_opdesc_str(mine, a, sizeof a);
        emu_opdesc_str(o, b, sizeof b);
        emu_flag(CUEMU_FLAG_NCCL_MISMATCH, what, "collective #%llu: rank %d called %s, rank %d called %s (%s "
                 "differ): every rank must issue the same collectives in the same order",
                 (unsigned long long)mine->seq, sh->rank, a, r, b, diff);
        emu_shm_fail(sh, ncclInvalidUsage, ncclInvalidUsage, "collective #%llu: rank %d called %s, rank %d called "
                     "%s (%s differ)", (unsigned long long)mine->seq, sh->rank, a, r, b, diff);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

#define STEP(x)                        \
    do {                               \
        ncclResult_t step_ = (x);      \
        if (step_ != ncclSuccess)      \
            return step_;              \
    } while (0)

ncclResult_t emu_coll_run(struct emu_shm *sh, const struct emu_coll *c, const atomic_int *abort)
{
    const struct emu_opdesc *d = &c->d;
    char what[160];
    emu_opdesc_str(d, what, sizeof what);
    sh->h->rank[sh->rank].desc = *d;
    STEP(barrier(sh, abort, what));
    STEP(check_same(sh, d, what));

    size_t es = emu_dtype_size(d->dtype), per = SLOT_BYTES / es, me = (size_t)sh->rank, n = d->count;
    int nr = sh->nranks;
    const char *send = emu_ptr_view(c->send);
    char *recv = emu_ptr_view(c->recv);
    const char *src[EMU_MAX_RANKS];
    /* The index space staged chunk by chunk: a reduce-scatter and an all-to-all stage every rank's
     * whole input. */
    size_t total = d->kind == EMU_COLL_REDUCESCATTER || d->kind == EMU_COLL_ALLTOALL ? n * (size_t)nr : n;
    if (total == 0)
        return barrier(sh, abort, what); /* no one rewrites its desc before all compared */
    for (size_t a = 0; a < total; a += per) {
        size_t m = total - a < per ? total - a : per;
        if (d->kind != EMU_COLL_BROADCAST || (int)me == d->root)
            memcpy(slot(sh, (int)me), send + a * es, m * es);
        STEP(barrier(sh, abort, what));
        for (int r = 0; r < nr; r++)
            src[r] = slot(sh, r);
        switch (d->kind) {
        case EMU_COLL_ALLREDUCE:
            reduce(d->dtype, d->op, nr, src, recv + a * es, m);
            break;
        case EMU_COLL_REDUCE:
            if ((int)me == d->root)
                reduce(d->dtype, d->op, nr, src, recv + a * es, m);
            break;
        case EMU_COLL_REDUCESCATTER: {
            size_t lo = a > me * n ? a : me * n, hi = a + m < (me + 1) * n ? a + m : (me + 1) * n;
            if (lo < hi) {
                for (int r = 0; r < nr; r++)
                    src[r] += (lo - a) * es;
                reduce(d->dtype, d->op, nr, src, recv + (lo - me * n) * es, hi - lo);
            }
            break;
        }
        case EMU_COLL_ALLGATHER:
            for (int r = 0; r < nr; r++)
                memcpy(recv + ((size_t)r * n + a) * es, src[r], m * es);
            break;
        case EMU_COLL_ALLTOALL: { /* rank r's chunk me lands at chunk r */
            size_t lo = a > me * n ? a : me * n, hi = a + m < (me + 1) * n ? a + m : (me + 1) * n;
            for (int r = 0; r < nr && lo < hi; r++)
                memcpy(recv + ((size_t)r * n + lo - me * n) * es, src[r] + (lo - a) * es, (hi - lo) * es);
            break;
        }
        case EMU_COLL_BROADCAST:
            memcpy(recv + a * es, src[d->root], m * es);
            break;
        default:
            break;
        }
        STEP(barrier(sh, abort, what)); /* the slots are read: they may be staged again */
    }
    return ncclSuccess;
}
