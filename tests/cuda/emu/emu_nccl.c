/*
 * emu_nccl.c: the NCCL API over emu_coll.c's shared-memory communicator. A collective is
 * checked when it is called (types, ops, roots, buffers: device memory of the communicator's
 * device, inside its allocation) and runs when its stream's worker reaches it, as a kernel
 * would: it blocks that worker until the peers arrive. As in NCCL, a communicator's collectives
 * run in the order they were called even across streams, and a group launches on its first
 * stream after all the others and holds them back until it is done. Failures (injected with
 * CUEMU_NCCL_FAIL_RANK/AFTER, a peer that left or died, calls that differ between ranks) reach
 * every rank's ncclCommGetAsyncError and fail the stream, so that no later work runs on garbage.
 */
#include "config.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "tests/cuda/emu/emu_nccl.h"

enum { COMM_INITIALIZING, COMM_READY, COMM_FAILED };

struct ncclComm {
    struct ncclComm *next; /* the list of live handles */
    int refs;              /* comm_mu: the handle's and each queued collective's */
    int rank, nranks, device, blocking;
    atomic_int state;
    ncclResult_t init_result;
    atomic_int aborted;
    atomic_int active;     /* workers inside one of its collectives */
    atomic_int inprogress; /* a non-blocking call returned ncclInProgress, not yet queried */
    atomic_int in_call;    /* a thread is issuing collectives on it */
    struct emu_shm *shm;
    ncclUniqueId id;
    struct emu_ident ident;
    long fail_rank, fail_after;
    /* comm_mu: */
    uint64_t ncalls;       /* collectives launched, numbering them in call order */
    int pending;           /* launched and not yet done */
    int finalizing;
    int have_last;
    struct emu_dep last;   /* where the last collective lies, for call order across streams */
    pthread_t init_thread;
    int init_started;
};

static pthread_mutex_t comm_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t comm_cv = PTHREAD_COND_INITIALIZER; /* a collective was done or dropped */
static struct ncclComm *comms;
static char last_error[1024];
static _Thread_local char last_error_copy[1024];

/* ---- errors ---- */

static int debug_on(void)
{
    const char *v = getenv("NCCL_DEBUG");
    return v != NULL && (!strcasecmp(v, "WARN") || !strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE"));
}

/* Records msg as ncclGetLastError's text (printed under NCCL_DEBUG=WARN) and returns code. */
static ncclResult_t EMU_PRINTF(2, 3) nccl_err(ncclResult_t code, const char *fmt, ...)
{
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&comm_mu);
    memcpy(last_error, msg, sizeof msg);
    pthread_mutex_unlock(&comm_mu);
    if (debug_on())
        emu_warn("NCCL WARN %s", msg);
    return code;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    pthread_mutex_lock(&comm_mu);
    memcpy(last_error_copy, last_error, sizeof last_error);
    pthread_mutex_unlock(&comm_mu);
    return last_error_copy;
}

ncclResult_t ncclGetVersion(int *version)
{
    if (version == NULL)
        return nccl_err(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* Every entry point: the emulator is up, and no host function or kernel calls NCCL. */
static ncclResult_t nccl_enter(const char *call)
{
    emu_init();
    if (emu_tls_ctx == EMU_CTX_HOSTFN || emu_tls_ctx == EMU_CTX_KERNEL) {
        emu_flag(CUEMU_FLAG_CALLBACK_API, call, "called from a host function or an emulated kernel");
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* ---- communicators ---- */

static void comm_unref_locked(struct ncclComm *c)
{
    if (--c->refs > 0)
        return;
    if (c->shm != NULL)
        emu_shm_close(c->shm);
    free(c);
}

static void comm_unlink_locked(struct ncclComm *c)
{
    for (struct ncclComm **pp = &comms; *pp != NULL; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            return;
        }
}

/* Resolves a handle; ready: it must have finished its initialisation successfully. */
static ncclResult_t comm_get(ncclComm_t h, const char *call, int ready, struct ncclComm **out)
{
    pthread_mutex_lock(&comm_mu);
    struct ncclComm *c = comms;
    while (c != NULL && c != h)
        c = c->next;
    pthread_mutex_unlock(&comm_mu);
    if (c == NULL) {
        emu_flag(CUEMU_FLAG_BAD_HANDLE, call, "%p is not a live communicator (destroyed, aborted or never made)",
                 (void *)h);
        return nccl_err(ncclInvalidArgument, "%s: invalid communicator %p", call, (void *)h);
    }
    int state = atomic_load(&c->state);
    if (ready && state != COMM_READY) {
        emu_flag(CUEMU_FLAG_NCCL_MISUSE, call, "communicator %p %s", (void *)h,
                 state == COMM_INITIALIZING ? "is still initialising: poll ncclCommGetAsyncError until it is no "
                                              "longer ncclInProgress" : "failed its initialisation");
        return nccl_err(ncclInvalidUsage, "%s: communicator %p is not initialised", call, (void *)h);
    }
    if (ready && atomic_load(&c->inprogress))
        emu_flag(CUEMU_FLAG_NCCL_MISUSE, call, "the last call on non-blocking communicator %p returned "
                 "ncclInProgress and ncclCommGetAsyncError was not polled since", (void *)h);
    *out = c;
    return ncclSuccess;
}

static ncclResult_t comm_join(struct ncclComm *c)
{
    char why[512] = "";
    struct emu_shm *sh = NULL;
    ncclResult_t r = emu_shm_join(&c->id, c->nranks, c->rank, &c->ident, &c->aborted, &sh, why, sizeof why);
    c->shm = sh;
    c->init_result = r;
    if (r != ncclSuccess)
        nccl_err(r, "ncclCommInitRank: rank %d of %d: %s", c->rank, c->nranks, why);
    atomic_store(&c->state, r == ncclSuccess ? COMM_READY : COMM_FAILED);
    return r;
}

static void *init_thread_main(void *arg)
{
    comm_join(arg);
    return NULL;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static atomic_uint counter;
    ncclResult_t r = nccl_enter("ncclGetUniqueId");
    if (r != ncclSuccess)
        return r;
    if (id == NULL)
        return nccl_err(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
    cuemu_shm_clean();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned n = atomic_fetch_add(&counter, 1);
    struct emu_uid u = {.magic = EMU_UID_MAGIC, .creator_pid = (int32_t)getpid()};
    u.key = emu_hash(&ts, sizeof ts, emu_hash(&n, sizeof n, emu_hash(&u.creator_pid, sizeof u.creator_pid, 0)));
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &u, sizeof u);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config)
{
    static const char call[] = "ncclCommInitRank";
    ncclResult_t r = nccl_enter(call);
    if (r != ncclSuccess)
        return r;
    const char *mode = getenv("CUEMU_NCCL");
    if (mode != NULL && strcmp(mode, "broken") == 0)
        return nccl_err(ncclSystemError, "%s: cuemu: CUEMU_NCCL=broken: NCCL behaves as if libnccl were missing or "
                        "broken, and no communicator can be made", call);
    struct emu_uid u;
    memcpy(&u, id.internal, sizeof u);
    if (out == NULL || nranks < 1 || nranks > EMU_MAX_RANKS || rank < 0 || rank >= nranks)
        return nccl_err(ncclInvalidArgument, "%s: rank %d of %d ranks (at most %d), comm %p", call, rank, nranks,
                        EMU_MAX_RANKS, (void *)out);
    if (u.magic != EMU_UID_MAGIC)
        return nccl_err(ncclInvalidArgument, "%s: the unique id does not come from ncclGetUniqueId", call);
    int blocking = 1;
    if (config != NULL) {
        if (config->magic != 0xcafebeef)
            return nccl_err(ncclInvalidArgument, "%s: the config was not set with NCCL_CONFIG_INITIALIZER", call);
        if (config->blocking != NCCL_CONFIG_UNDEF_INT)
            blocking = config->blocking;
        if (blocking != 0 && blocking != 1)
            return nccl_err(ncclInvalidArgument, "%s: config blocking=%d, 0 or 1 expected", call, blocking);
    }
    if (emu_knobs.ndevices == 0)
        return nccl_err(ncclUnhandledCudaError, "%s: no CUDA device", call);

    struct ncclComm *c = calloc(1, sizeof *c);
    if (c == NULL)
        return nccl_err(ncclSystemError, "%s: out of memory", call);
    c->refs = 1;
    c->rank = rank;
    c->nranks = nranks;
    c->device = emu_current_device();
    c->blocking = blocking;
    c->id = id;
    const char *hostid = getenv("NCCL_HOSTID");
    if (hostid == NULL || *hostid == '\0')
        hostid = emu_hostname;
    c->ident.host_hash = emu_hash(hostid, strlen(hostid), 0);
    c->ident.cudev = c->device;
    c->ident.phys = emu_devices[c->device].phys;
    memcpy(c->ident.busid, emu_devices[c->device].busid, sizeof c->ident.busid);
    /* Read at each initialisation, so that a test may inject a failure into one communicator. */
    c->fail_rank = emu_env_long("CUEMU_NCCL_FAIL_RANK", -1, -1, EMU_MAX_RANKS);
    c->fail_after = emu_env_long("CUEMU_NCCL_FAIL_AFTER", 0, 0, 1L << 40);
    atomic_store(&c->state, COMM_INITIALIZING);
    pthread_mutex_lock(&comm_mu);
    c->next = comms;
    comms = c;
    pthread_mutex_unlock(&comm_mu);

    if (!blocking) {
        /* As NCCL does: the handle now, the initialisation in the background. */
        pthread_mutex_lock(&comm_mu);
        c->init_started = pthread_create(&c->init_thread, NULL, init_thread_main, c) == 0;
        pthread_mutex_unlock(&comm_mu);
        if (!c->init_started)
            comm_join(c);
        *out = c;
        return c->init_started ? ncclInProgress : c->init_result;
    }
    r = comm_join(c);
    if (r != ncclSuccess) {
        pthread_mutex_lock(&comm_mu);
        comm_unlink_locked(c);
        comm_unref_locked(c);
        pthread_mutex_unlock(&comm_mu);
        return r;
    }
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    return ncclCommInitRankConfig(out, nranks, id, rank, NULL);
}

static void join_init_thread(struct ncclComm *c)
{
    pthread_mutex_lock(&comm_mu);
    int join = c->init_started;
    c->init_started = 0;
    pthread_mutex_unlock(&comm_mu);
    if (join)
        pthread_join(c->init_thread, NULL);
}

/* Waits until no collective of c is queued or running. */
static void comm_drain(struct ncclComm *c)
{
    pthread_mutex_lock(&comm_mu);
    while (c->pending > 0)
        pthread_cond_wait(&comm_cv, &comm_mu);
    pthread_mutex_unlock(&comm_mu);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    struct ncclComm *c;
    ncclResult_t r = nccl_enter("ncclCommGetAsyncError");
    if (r == ncclSuccess)
        r = comm_get(comm, "ncclCommGetAsyncError", 0, &c);
    if (r != ncclSuccess)
        return r;
    if (err == NULL)
        return nccl_err(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    int state = atomic_load(&c->state);
    if (state != COMM_READY) {
        *err = state == COMM_INITIALIZING ? ncclInProgress : c->init_result;
        return ncclSuccess;
    }
    char msg[512];
    ncclResult_t e = emu_shm_error(c->shm, msg, sizeof msg);
    if (e != ncclSuccess) {
        nccl_err(e, "rank %d: %s", c->rank, msg);
        *err = e;
        return ncclSuccess;
    }
    pthread_mutex_lock(&comm_mu);
    int busy = c->finalizing && c->pending > 0;
    pthread_mutex_unlock(&comm_mu);
    /* A non-blocking call's ncclInProgress shows once here, so that callers poll. */
    *err = atomic_exchange(&c->inprogress, 0) || busy ? ncclInProgress : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    struct ncclComm *c;
    ncclResult_t r = nccl_enter("ncclCommFinalize");
    if (r == ncclSuccess)
        r = comm_get(comm, "ncclCommFinalize", 1, &c);
    if (r != ncclSuccess)
        return r;
    pthread_mutex_lock(&comm_mu);
    c->finalizing = 1;
    int busy = c->pending > 0;
    pthread_mutex_unlock(&comm_mu);
    if (!c->blocking && busy)
        return ncclInProgress;
    comm_drain(c);
    return emu_shm_error(c->shm, NULL, 0);
}

/* Ends a handle: destroy (drains first) or abort (releases a worker blocked in a collective,
 * drops what is queued). Peers that wait for this rank from now on fail. */
static ncclResult_t comm_end(ncclComm_t comm, const char *call, int abort)
{
    struct ncclComm *c;
    ncclResult_t r = nccl_enter(call);
    if (r != ncclSuccess)
        return r;
    if (comm == NULL && abort)
        return ncclSuccess;
    r = comm_get(comm, call, 0, &c);
    if (r != ncclSuccess)
        return r;
    if (abort)
        atomic_store(&c->aborted, 1);
    join_init_thread(c);
    if (c->shm != NULL && abort)
        emu_shm_leave(c->shm);
    if (abort) {
        while (atomic_load(&c->active) > 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    } else {
        comm_drain(c);
        if (c->shm != NULL)
            emu_shm_leave(c->shm);
    }
    pthread_mutex_lock(&comm_mu);
    comm_unlink_locked(c);
    comm_unref_locked(c);
    pthread_mutex_unlock(&comm_mu);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    return comm_end(comm, "ncclCommDestroy", 0);
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    return comm_end(comm, "ncclCommAbort", 1);
}

enum comm_field { FIELD_COUNT, FIELD_DEVICE, FIELD_RANK };

/* ncclCommCount, ncclCommCuDevice and ncclCommUserRank: one integer of a ready communicator. */
static ncclResult_t comm_int(ncclComm_t comm, const char *call, enum comm_field f, int *out)
{
    struct ncclComm *c;
    ncclResult_t r = nccl_enter(call);
    if (r == ncclSuccess)
        r = comm_get(comm, call, 1, &c);
    if (r == ncclSuccess && out == NULL)
        r = nccl_err(ncclInvalidArgument, "%s: the output is NULL", call);
    if (r == ncclSuccess)
        *out = f == FIELD_COUNT ? c->nranks : f == FIELD_DEVICE ? c->device : c->rank;
    return r;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    return comm_int(comm, "ncclCommCount", FIELD_COUNT, count);
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    return comm_int(comm, "ncclCommCuDevice", FIELD_DEVICE, device);
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    return comm_int(comm, "ncclCommUserRank", FIELD_RANK, rank);
}

/* ---- launching ---- */

struct pending_op {
    struct ncclComm *comm;
    struct emu_stream *stream;
    struct emu_coll c;
    int done;
};

struct launch {
    size_t n;
    struct pending_op ops[];
};

static cudaError_t launch_run(void *ctx)
{
    struct launch *l = ctx;
    for (size_t i = 0; i < l->n; i++) {
        struct pending_op *o = &l->ops[i];
        struct ncclComm *c = o->comm;
        char what[160], msg[512] = "";
        ncclResult_t r;
        atomic_fetch_add(&c->active, 1);
        if (atomic_load(&c->aborted))
            r = ncclInvalidUsage;
        else if ((r = emu_shm_error(c->shm, msg, sizeof msg)) != ncclSuccess)
            ;
        else if (c->rank == c->fail_rank && o->c.d.seq == (uint64_t)c->fail_after + 1) {
            emu_shm_fail(c->shm, ncclRemoteError, ncclRemoteError, "cuemu: injected failure of rank %d in its "
                         "collective #%llu (CUEMU_NCCL_FAIL_RANK=%ld CUEMU_NCCL_FAIL_AFTER=%ld)", c->rank,
                         (unsigned long long)o->c.d.seq, c->fail_rank, c->fail_after);
            r = ncclRemoteError;
        } else
            r = emu_coll_run(c->shm, &o->c, &c->aborted);
        atomic_fetch_sub(&c->active, 1);
        o->done = 1;
        if (r != ncclSuccess) {
            emu_opdesc_str(&o->c.d, what, sizeof what);
            if (msg[0] == '\0')
                emu_shm_error(c->shm, msg, sizeof msg);
            nccl_err(r, "rank %d: %s (collective #%llu) failed: %s: %s", c->rank, what,
                     (unsigned long long)o->c.d.seq, ncclGetErrorString(r), msg[0] ? msg : "aborted");
            return EMU_WORK_FAILED;
        }
    }
    return cudaSuccess;
}

/* Runs after launch_run, or instead of it when the stream failed before: a collective this rank
 * will never take part in fails its communicator, so that no peer waits for it. */
static void launch_drop(void *ctx, int ran)
{
    struct launch *l = ctx;
    pthread_mutex_lock(&comm_mu);
    for (size_t i = 0; i < l->n; i++) {
        struct ncclComm *c = l->ops[i].comm;
        if (!l->ops[i].done && c->shm != NULL)
            emu_shm_fail(c->shm, ncclRemoteError, ncclRemoteError, "rank %d skipped collective #%llu: its stream "
                         "failed before it", c->rank, (unsigned long long)l->ops[i].c.d.seq);
        c->pending--;
        comm_unref_locked(c);
    }
    pthread_cond_broadcast(&comm_cv);
    pthread_mutex_unlock(&comm_mu);
    free(l);
    (void)ran;
}

/* One launch for n collectives: numbered in call order on their communicators, run in order
 * on the first one's stream after each communicator's previous collective and every other
 * stream's work so far; the other streams then wait for it, as NCCL's group launches do. */
static ncclResult_t launch(const struct pending_op *ops, size_t n, const char *call)
{
    struct launch *l = malloc(sizeof *l + n * sizeof *ops);
    struct emu_dep *deps = malloc(2 * n * sizeof *deps);
    struct emu_item *it = emu_item_new(EMU_ITEM_EXT, call);
    if (l == NULL || deps == NULL || it == NULL) {
        free(l);
        free(deps);
        free(it);
        return nccl_err(ncclSystemError, "%s: out of memory", call);
    }
    l->n = n;
    memcpy(l->ops, ops, n * sizeof *ops);
    int nd = 0;
    pthread_mutex_lock(&comm_mu);
    for (size_t i = 0; i < n; i++) {
        struct ncclComm *c = l->ops[i].comm;
        l->ops[i].c.d.seq = ++c->ncalls;
        if (c->have_last)
            deps[nd++] = c->last;
        c->pending++;
        c->refs++;
    }
    pthread_mutex_unlock(&comm_mu);
    struct emu_stream *first = ops[0].stream;
    for (size_t i = 1; i < n; i++)
        if (ops[i].stream != first)
            deps[nd++] = emu_stream_tail(ops[i].stream);
    for (size_t i = 0; i < n && 2 * i + 1 < EMU_ITEM_RANGES; i++) {
        size_t es = emu_dtype_size(ops[i].c.d.dtype);
        emu_item_use(it, ops[i].c.send, es * ops[i].c.d.count);
        emu_item_use(it, ops[i].c.recv, es * ops[i].c.d.count);
    }
    it->u.ext.run = launch_run;
    it->u.ext.drop = launch_drop;
    it->u.ext.ctx = l;
    struct emu_dep pos;
    cudaError_t e = emu_enqueue(first, it, deps, nd, &pos);
    free(deps);
    if (e != cudaSuccess)
        return nccl_err(ncclUnhandledCudaError, "%s: %s", call, cudaGetErrorString(e));
    pthread_mutex_lock(&comm_mu);
    for (size_t i = 0; i < n; i++) {
        ops[i].comm->last = pos;
        ops[i].comm->have_last = 1;
    }
    pthread_mutex_unlock(&comm_mu);
    for (size_t i = 1; i < n; i++) {
        int seen = ops[i].stream == first;
        for (size_t j = 1; j < i && !seen; j++)
            seen = ops[j].stream == ops[i].stream;
        struct emu_item *w = seen ? NULL : emu_item_new(EMU_ITEM_WAIT, call);
        if (w != NULL && emu_enqueue(ops[i].stream, w, &pos, 1, NULL) != cudaSuccess)
            return nccl_err(ncclUnhandledCudaError, "%s: joining the group's streams failed", call);
    }
    return ncclSuccess;
}

/* ---- groups ---- */

static _Thread_local int group_depth;
static _Thread_local struct pending_op *group_ops;
static _Thread_local size_t group_n, group_cap;
static _Thread_local ncclResult_t group_err;

ncclResult_t ncclGroupStart(void)
{
    ncclResult_t r = nccl_enter("ncclGroupStart");
    if (r == ncclSuccess)
        group_depth++;
    return r;
}

/* ncclInProgress when a launched collective's communicator is non-blocking (remembered there
 * until ncclCommGetAsyncError is polled), else ncclSuccess. */
static ncclResult_t launched(const struct pending_op *ops, size_t n)
{
    ncclResult_t r = ncclSuccess;
    for (size_t i = 0; i < n; i++)
        if (!ops[i].comm->blocking) {
            atomic_store(&ops[i].comm->inprogress, 1);
            r = ncclInProgress;
        }
    return r;
}

ncclResult_t ncclGroupEnd(void)
{
    static const char call[] = "ncclGroupEnd";
    ncclResult_t r = nccl_enter(call);
    if (r != ncclSuccess)
        return r;
    if (group_depth == 0)
        return nccl_err(ncclInvalidUsage, "%s: no ncclGroupStart before it", call);
    if (--group_depth > 0)
        return ncclSuccess;
    size_t n = group_n;
    group_n = 0;
    r = group_err;
    group_err = ncclSuccess;
    if (r != ncclSuccess || n == 0)
        return r; /* a call in the group failed: nothing of it is launched */
    r = launch(group_ops, n, call);
    return r == ncclSuccess ? launched(group_ops, n) : r;
}

/* ---- collectives ---- */

/* A buffer of bytes bytes a collective reads or writes: device memory, inside its allocation. */
static ncclResult_t check_buf(const struct ncclComm *c, const char *call, const char *name, const void *p,
                              size_t bytes)
{
    struct emu_ptrinfo pi;
    if (bytes == 0)
        return ncclSuccess;
    emu_ptr_classify(p, &pi);
    if (p == NULL || pi.cls == EMU_PTR_BAD) {
        emu_flag(CUEMU_FLAG_BAD_POINTER, call, "%s %p %s", name, p, p == NULL ? "is NULL" : pi.why);
        return nccl_err(ncclInvalidArgument, "%s: %s %p is not device memory", call, name, p);
    }
    if (pi.cls == EMU_PTR_PAGEABLE || (pi.cls == EMU_PTR_PINNED && pi.avail < bytes)) {
        emu_flag(CUEMU_FLAG_PAGEABLE, call, "%s %p is pageable host memory: NCCL's kernels cannot reach it", name, p);
        return nccl_err(ncclInvalidArgument, "%s: %s %p is host memory", call, name, p);
    }
    if (pi.avail < bytes) {
        emu_flag(CUEMU_FLAG_BAD_POINTER, call, "%s %p: the collective uses %zu bytes, its allocation has %zu left",
                 name, p, bytes, pi.avail);
        return nccl_err(ncclInvalidArgument, "%s: %s %p is too small", call, name, p);
    }
    if (pi.cls == EMU_PTR_DEVICE && pi.device != c->device)
        emu_flag(CUEMU_FLAG_OTHER_DEVICE, call, "%s %p is memory of device %d, the communicator's device is %d", name,
                 p, pi.device, c->device);
    return ncclSuccess;
}

static ncclResult_t coll_check(struct ncclComm *c, const char *call, int kind, const void *send, void *recv,
                               size_t count, ncclDataType_t dt, ncclRedOp_t op, int root, cudaStream_t stream,
                               struct emu_stream **s)
{
    size_t es = emu_dtype_size(dt);
    int rooted = kind == EMU_COLL_BROADCAST || kind == EMU_COLL_REDUCE;
    if (es == 0)
        return nccl_err(ncclInvalidArgument, "%s: data type %d is not emulated (float32, float16, bfloat16, "
                        "float64, int32, int8 and uint8 are)", call, (int)dt);
    if ((int)op < 0 || op > ncclAvg)
        return nccl_err(ncclInvalidArgument, "%s: reduction op %d is not emulated", call, (int)op);
    int moves = kind == EMU_COLL_ALLGATHER || kind == EMU_COLL_BROADCAST || kind == EMU_COLL_ALLTOALL;
    if (es == 1 && !moves)
        return nccl_err(ncclInvalidArgument, "%s: reductions of 8-bit types are not emulated (moving them is)", call);
    if (rooted && (root < 0 || root >= c->nranks))
        return nccl_err(ncclInvalidArgument, "%s: root %d of %d ranks", call, root, c->nranks);
    cudaError_t ce = emu_stream_get(stream, call, s);
    if (ce != cudaSuccess)
        return nccl_err(ncclUnhandledCudaError, "%s: stream %p: %s", call, (void *)stream, cudaGetErrorString(ce));
    if (emu_stream_device(*s) != c->device) {
        emu_flag(CUEMU_FLAG_OTHER_DEVICE, call, "stream of device %d, communicator of device %d",
                 emu_stream_device(*s), c->device);
        return nccl_err(ncclUnhandledCudaError, "%s: the stream belongs to another device", call);
    }
    size_t all = count * (size_t)c->nranks * es, one = count * es;
    int a2a = kind == EMU_COLL_ALLTOALL;
    size_t in = kind == EMU_COLL_REDUCESCATTER || a2a ? all : one, out = kind == EMU_COLL_ALLGATHER || a2a ? all : one;
    int me_root = c->rank == root;
    ncclResult_t r = kind == EMU_COLL_BROADCAST && !me_root ? ncclSuccess : check_buf(c, call, "sendbuff", send, in);
    if (r == ncclSuccess && (kind != EMU_COLL_REDUCE || me_root))
        r = check_buf(c, call, "recvbuff", recv, out);
    if (r != ncclSuccess || (rooted && !me_root))
        return r;
    /* In place is NCCL's exact layout; any other overlap is undefined there. */
    const char *sp = send, *rp = recv;
    int inplace = a2a                              ? 0 /* NCCL has no in-place all-to-all */
                  : kind == EMU_COLL_REDUCESCATTER ? sp + (size_t)c->rank * one == rp
                  : kind == EMU_COLL_ALLGATHER     ? rp + (size_t)c->rank * one == sp
                                                   : sp == rp;
    if (!inplace && sp < rp + out && rp < sp + in)
        emu_flag(CUEMU_FLAG_NCCL_MISUSE, call, "sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) overlap but are "
                 "not NCCL's in-place layout", send, in, recv, out);
    return ncclSuccess;
}

static ncclResult_t coll(const char *call, int kind, const void *send, void *recv, size_t count, ncclDataType_t dt,
                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    struct ncclComm *c;
    struct emu_stream *s;
    ncclResult_t r = nccl_enter(call);
    if (r == ncclSuccess)
        r = comm_get(comm, call, 1, &c);
    if (r == ncclSuccess)
        r = coll_check(c, call, kind, send, recv, count, dt, op, root, stream, &s);
    if (r != ncclSuccess) {
        if (group_depth > 0 && group_err == ncclSuccess)
            group_err = r;
        return r;
    }
    int rooted = kind == EMU_COLL_BROADCAST || kind == EMU_COLL_REDUCE;
    int reduces = kind != EMU_COLL_ALLGATHER && kind != EMU_COLL_BROADCAST && kind != EMU_COLL_ALLTOALL;
    struct pending_op o = {.comm = c, .stream = s, .c = {.send = send, .recv = recv}};
    o.c.d = (struct emu_opdesc){.kind = kind, .dtype = dt, .op = reduces ? op : 0, .root = rooted ? root : 0,
                                .count = count};
    if (group_depth > 0) {
        if (group_n == group_cap) {
            size_t cap = group_cap ? 2 * group_cap : 16;
            struct pending_op *g = realloc(group_ops, cap * sizeof *g);
            if (g == NULL)
                return group_err = nccl_err(ncclSystemError, "%s: out of memory", call);
            group_ops = g;
            group_cap = cap;
        }
        group_ops[group_n++] = o;
        return ncclSuccess;
    }
    if (atomic_exchange(&c->in_call, 1))
        emu_flag(CUEMU_FLAG_NCCL_MISUSE, call, "another thread is issuing a collective on communicator %p at the same "
                 "time: NCCL communicators are not thread-safe", (void *)c);
    r = launch(&o, 1, call);
    atomic_store(&c->in_call, 0);
    return r == ncclSuccess ? launched(&o, 1) : r;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    return coll("ncclAllReduce", EMU_COLL_ALLREDUCE, send, recv, count, dt, op, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t dt, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream)
{
    return coll("ncclReduceScatter", EMU_COLL_REDUCESCATTER, send, recv, recvcount, dt, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t stream)
{
    return coll("ncclAllGather", EMU_COLL_ALLGATHER, send, recv, sendcount, dt, ncclSum, 0, comm, stream);
}

ncclResult_t ncclAlltoAll(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                          cudaStream_t stream)
{
    return coll("ncclAlltoAll", EMU_COLL_ALLTOALL, send, recv, count, dt, ncclSum, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t stream)
{
    return coll("ncclBroadcast", EMU_COLL_BROADCAST, send, recv, count, dt, ncclSum, root, comm, stream);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t dt, int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll("ncclBcast", EMU_COLL_BROADCAST, buff, buff, count, dt, ncclSum, root, comm, stream);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream)
{
    return coll("ncclReduce", EMU_COLL_REDUCE, send, recv, count, dt, op, root, comm, stream);
}

/* ---- exit ---- */

void emu_nccl_shutdown(void)
{
    pthread_mutex_lock(&comm_mu);
    for (struct ncclComm *c = comms; c != NULL; c = c->next) {
        atomic_store(&c->aborted, 1);
        if (atomic_load(&c->state) == COMM_READY)
            emu_shm_leave(c->shm);
    }
    pthread_mutex_unlock(&comm_mu);
    for (;;) { /* initialisations in the background see the abort within a barrier's poll */
        struct ncclComm *c;
        pthread_mutex_lock(&comm_mu);
        for (c = comms; c != NULL && !c->init_started; c = c->next)
            ;
        pthread_mutex_unlock(&comm_mu);
        if (c == NULL)
            break;
        join_init_thread(c);
    }
}
