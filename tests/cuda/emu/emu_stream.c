/*
 * emu_stream.c: streams and events. Each stream is a FIFO of work items run by a worker thread
 * of its own, which sleeps a seeded random time (CUEMU_DELAY_US, CUEMU_SEED) before each item,
 * so that work two streams were not told to order runs in either order. An item may wait for
 * positions in other streams (struct emu_dep): an event is such a position taken at record time,
 * and the legacy default stream's implicit synchronisation with blocking streams is one too. A
 * failed item (an NCCL error) fails its stream from there on and every stream that waits on it:
 * later work is skipped, never run on garbage, and the synchronising calls return the error.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/cuda/emu/emu.h"

enum { STREAM_USER, STREAM_LEGACY, STREAM_PER_THREAD };

/* Stream records are never freed: a destroyed stream's record is what lets a late use be named
 * as such, and what the positions other streams wait for point to. */
struct emu_stream {
    int device;
    unsigned flags;
    int priority;
    int kind;
    int destroyed;
    uint64_t id;                   /* creation number, in messages and for the delay seed */
    uint64_t enqueued, completed;  /* positions: items are numbered from 1 */
    uint64_t failed_at;            /* 0, or the position of the first failed item */
    cudaError_t error;
    struct emu_item *head, *tail;  /* head: running or next to run */
    pthread_cond_t work;
    pthread_t thread;
    int started, exited, joined, stop;
    uint64_t rng;                  /* the worker's alone */
    unsigned delay_us;
    struct emu_stream *next;
};

/* An event's capture: a position in a stream and, once reached, when. */
struct emu_mark {
    int refs;
    struct emu_dep dep;
    double t;
};

struct emu_event {
    int device;
    unsigned flags;
    struct emu_mark *mark; /* the last record's; NULL before the first */
    struct emu_event *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER; /* some item completed */
static struct emu_stream *streams;
static struct emu_stream *legacy[EMU_MAX_DEVICES];
static struct emu_event *events;
static uint64_t nmade;
static int shutting_down;

static pthread_key_t ptds_key;
static pthread_once_t ptds_once = PTHREAD_ONCE_INIT;

/* ---- items ---- */

struct emu_item *emu_item_new(int kind, const char *call)
{
    struct emu_item *it = calloc(1, sizeof *it);
    if (it != NULL) {
        it->kind = kind;
        it->call = call;
    }
    return it;
}

void emu_item_use(struct emu_item *it, const void *p, size_t n)
{
    struct emu_ptrinfo pi;
    emu_ptr_classify(p, &pi);
    if ((pi.cls == EMU_PTR_DEVICE || pi.cls == EMU_PTR_PINNED) && it->nuse < EMU_ITEM_RANGES) {
        it->use[it->nuse].p = p;
        it->use[it->nuse].n = n;
        it->nuse++;
    }
}

static void mark_unref_locked(struct emu_mark *m)
{
    if (m != NULL && --m->refs == 0)
        free(m);
}

/* Frees what an item owns; ran says whether it ran or was skipped. Caller holds mu. */
static void item_free_locked(struct emu_item *it, int ran)
{
    switch (it->kind) {
    case EMU_ITEM_COPY: free(it->u.copy.staging); break;
    case EMU_ITEM_KERNEL: free(it->u.kernel.owned); break;
    case EMU_ITEM_RECORD: mark_unref_locked(it->u.record.mark); break;
    case EMU_ITEM_EXT: it->u.ext.drop(it->u.ext.ctx, ran); break;
    default: break;
    }
    free(it->deps);
    free(it);
}

static cudaError_t item_run(struct emu_item *it)
{
    switch (it->kind) {
    case EMU_ITEM_COPY: {
        const void *src = it->u.copy.staging ? it->u.copy.staging : emu_ptr_view(it->u.copy.src);
        memmove(emu_ptr_view(it->u.copy.dst), src, it->u.copy.n);
        break;
    }
    case EMU_ITEM_SET:
        memset(emu_ptr_view(it->u.set.dst), it->u.set.value, it->u.set.n);
        break;
    case EMU_ITEM_HOSTFN:
        emu_tls_ctx = EMU_CTX_HOSTFN;
        it->u.hostfn.fn(it->u.hostfn.data);
        emu_tls_ctx = EMU_CTX_WORKER;
        break;
    case EMU_ITEM_KERNEL:
        emu_tls_ctx = EMU_CTX_KERNEL;
        it->u.kernel.fn(it->u.kernel.arg);
        emu_tls_ctx = EMU_CTX_WORKER;
        break;
    case EMU_ITEM_RECORD:
        it->u.record.mark->t = emu_now(); /* read by others only after the completion, under mu */
        break;
    case EMU_ITEM_EXT:
        return it->u.ext.run(it->u.ext.ctx);
    default:
        break;
    }
    return cudaSuccess;
}

/* ---- positions ---- */

static int dep_failed(struct emu_dep d)
{
    return d.s->failed_at != 0 && d.s->failed_at <= d.seq;
}

static int dep_reached(struct emu_dep d)
{
    return d.s->completed >= d.seq || dep_failed(d);
}

/* 1 when every dependency of it is reached; *err is the error of a failed one. Caller holds mu. */
static int deps_ready(const struct emu_item *it, cudaError_t *err)
{
    for (int i = 0; i < it->ndeps; i++) {
        if (dep_failed(it->deps[i])) {
            *err = it->deps[i].s->error;
            return 1;
        }
        if (!dep_reached(it->deps[i]))
            return 0;
    }
    return 1;
}

/* Position d's state: cudaSuccess once reached, the error of a failed stream, else
 * cudaErrorNotReady; block waits for it first. */
static cudaError_t dep_status(struct emu_dep d, int block)
{
    pthread_mutex_lock(&mu);
    while (block && !dep_reached(d) && !shutting_down)
        pthread_cond_wait(&done_cv, &mu);
    cudaError_t e = dep_failed(d)     ? d.s->error
                    : dep_reached(d) ? cudaSuccess
                    : block          ? cudaErrorCudartUnloading
                                     : cudaErrorNotReady;
    pthread_mutex_unlock(&mu);
    return e;
}

cudaError_t emu_dep_wait(struct emu_dep d)
{
    return dep_status(d, 1);
}

static int is_blocking(const struct emu_stream *t)
{
    return t->kind != STREAM_LEGACY && !(t->flags & cudaStreamNonBlocking);
}

static int pending(const struct emu_stream *t)
{
    return t->enqueued > t->completed;
}

/* What work issued on s now must wait for besides s's own: a legacy default stream waits for
 * every blocking stream of its device, a blocking stream for its device's legacy stream.
 * Returns how many it wrote into out (room for every stream). Caller holds mu. */
static int implicit_deps_locked(struct emu_stream *s, struct emu_dep *out)
{
    int n = 0;
    if (s->kind == STREAM_LEGACY) {
        for (struct emu_stream *t = streams; t != NULL; t = t->next)
            if (t != s && t->device == s->device && is_blocking(t) && pending(t))
                out[n++] = (struct emu_dep){t, t->enqueued};
    } else if (is_blocking(s)) {
        struct emu_stream *l = legacy[s->device];
        if (l != NULL && pending(l))
            out[n++] = (struct emu_dep){l, l->enqueued};
    }
    return n;
}

static size_t count_streams_locked(void)
{
    size_t n = 0;
    for (struct emu_stream *t = streams; t != NULL; t = t->next)
        n++;
    return n;
}

/* ---- workers ---- */

static void stream_delay(struct emu_stream *s)
{
    if (s->delay_us == 0)
        return;
    s->rng ^= s->rng << 13; /* xorshift64 */
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    long us = (long)(s->rng % (s->delay_us + 1u));
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void fail_locked(struct emu_stream *s, uint64_t seq, cudaError_t err)
{
    if (s->failed_at == 0) {
        s->failed_at = seq;
        s->error = err;
    }
}

static void *worker_main(void *arg)
{
    struct emu_stream *s = arg;
    emu_tls_ctx = EMU_CTX_WORKER;
    emu_tls_ctx_device = s->device;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (s->head == NULL && !s->stop && !s->destroyed)
            pthread_cond_wait(&s->work, &mu);
        struct emu_item *it = s->head;
        if (it == NULL)
            break;
        cudaError_t dep_err = cudaSuccess;
        while (!deps_ready(it, &dep_err) && !shutting_down)
            pthread_cond_wait(&done_cv, &mu);
        if (dep_err != cudaSuccess)
            fail_locked(s, it->seq, dep_err);
        else if (shutting_down)
            fail_locked(s, it->seq, cudaErrorCudartUnloading);
        int skip = s->failed_at != 0;
        pthread_mutex_unlock(&mu);

        cudaError_t err = cudaSuccess;
        if (!skip) {
            stream_delay(s);
            err = item_run(it);
        }

        pthread_mutex_lock(&mu);
        if (err != cudaSuccess)
            fail_locked(s, it->seq, err);
        s->head = it->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->completed = it->seq;
        item_free_locked(it, !skip);
        pthread_cond_broadcast(&done_cv);
    }
    s->exited = 1;
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Joins the workers of destroyed streams that have drained. Caller holds mu. */
static void reap_locked(void)
{
    for (struct emu_stream *t = streams; t != NULL; t = t->next)
        if (t->started && t->exited && !t->joined) {
            pthread_join(t->thread, NULL);
            t->joined = 1;
        }
}

/* ---- streams ---- */

static struct emu_stream *stream_new_locked(int device, unsigned flags, int priority, int kind)
{
    struct emu_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->device = device;
    s->flags = flags;
    s->priority = priority;
    s->kind = kind;
    s->id = ++nmade;
    /* Read here, not once per process, so that a test may change them between streams. */
    s->delay_us = (unsigned)emu_env_long("CUEMU_DELAY_US", 100, 0, 10000000);
    uint64_t seed = (uint64_t)emu_env_long("CUEMU_SEED", 1, 0, 0x7fffffffffffffffL);
    s->rng = emu_hash(&s->id, sizeof s->id, emu_hash(&seed, sizeof seed, 0)) | 1;
    pthread_cond_init(&s->work, NULL);
    s->next = streams;
    streams = s;
    return s;
}

static void ptds_release(void *p)
{
    struct emu_stream **per = p;
    pthread_mutex_lock(&mu);
    for (int d = 0; d < EMU_MAX_DEVICES; d++)
        if (per[d] != NULL) {
            per[d]->destroyed = 1;
            pthread_cond_signal(&per[d]->work);
        }
    pthread_mutex_unlock(&mu);
    free(per);
}

static void ptds_key_make(void)
{
    pthread_key_create(&ptds_key, ptds_release);
}

/* The stream a built-in handle names on the current device, made at first use. Caller holds mu. */
static struct emu_stream *builtin_locked(cudaStream_t h)
{
    int d = emu_current_device();
    if (h == cudaStreamPerThread) {
        pthread_once(&ptds_once, ptds_key_make);
        struct emu_stream **per = pthread_getspecific(ptds_key);
        if (per == NULL) {
            per = calloc(EMU_MAX_DEVICES, sizeof *per);
            if (per == NULL || pthread_setspecific(ptds_key, per) != 0) {
                free(per);
                return NULL;
            }
        }
        if (per[d] == NULL)
            per[d] = stream_new_locked(d, 0, 0, STREAM_PER_THREAD);
        return per[d];
    }
    if (legacy[d] == NULL)
        legacy[d] = stream_new_locked(d, 0, 0, STREAM_LEGACY);
    return legacy[d];
}

static cudaError_t stream_get_locked(cudaStream_t h, const char *call, struct emu_stream **out)
{
    if (h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread) {
        if (emu_knobs.ndevices == 0)
            return cudaErrorNoDevice;
        *out = builtin_locked(h);
        return *out ? cudaSuccess : cudaErrorMemoryAllocation;
    }
    for (struct emu_stream *t = streams; t != NULL; t = t->next)
        if (t == (struct emu_stream *)h) {
            if (t->destroyed || t->kind != STREAM_USER) {
                emu_flag(CUEMU_FLAG_BAD_HANDLE, call, "stream %p (#%llu) was destroyed", (void *)h,
                         (unsigned long long)t->id);
                return cudaErrorInvalidResourceHandle;
            }
            *out = t;
            return cudaSuccess;
        }
    emu_flag(CUEMU_FLAG_BAD_HANDLE, call, "%p is not a stream", (void *)h);
    return cudaErrorInvalidResourceHandle;
}

cudaError_t emu_stream_get(cudaStream_t h, const char *call, struct emu_stream **out)
{
    pthread_mutex_lock(&mu);
    cudaError_t e = stream_get_locked(h, call, out);
    pthread_mutex_unlock(&mu);
    return e;
}

struct emu_dep emu_stream_tail(struct emu_stream *s)
{
    pthread_mutex_lock(&mu);
    struct emu_dep d = {s, s->enqueued};
    pthread_mutex_unlock(&mu);
    return d;
}

int emu_stream_device(const struct emu_stream *s)
{
    return s->device;
}

cudaError_t emu_enqueue(struct emu_stream *s, struct emu_item *it, const struct emu_dep *deps, int ndeps,
                        struct emu_dep *pos)
{
    pthread_mutex_lock(&mu);
    cudaError_t e = cudaSuccess;
    if (shutting_down) {
        e = cudaErrorCudartUnloading;
        goto err;
    }
    it->deps = malloc((count_streams_locked() + (size_t)ndeps) * sizeof *it->deps);
    if (it->deps == NULL) {
        e = cudaErrorMemoryAllocation;
        goto err;
    }
    it->ndeps = implicit_deps_locked(s, it->deps);
    for (int i = 0; i < ndeps; i++)
        if (deps[i].s != s && !(deps[i].s->completed >= deps[i].seq && !dep_failed(deps[i])))
            it->deps[it->ndeps++] = deps[i];
    if (!s->started) {
        if (pthread_create(&s->thread, NULL, worker_main, s) != 0) {
            e = cudaErrorMemoryAllocation;
            goto err;
        }
        s->started = 1;
    }
    it->seq = ++s->enqueued;
    it->next = NULL;
    if (s->tail != NULL)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    if (pos != NULL)
        *pos = (struct emu_dep){s, it->seq};
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;

err:
    item_free_locked(it, 0);
    pthread_mutex_unlock(&mu);
    return e;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *ps, unsigned int flags, int priority)
{
    EMU_ENTER("cudaStreamCreateWithPriority");
    if (ps == NULL || (flags & ~(unsigned)cudaStreamNonBlocking))
        return emu_ret(cudaErrorInvalidValue);
    if (emu_knobs.ndevices == 0)
        return emu_ret(cudaErrorNoDevice);
    /* As on a GPU, priorities outside [greatest, least] = [-5, 0] are clamped. */
    priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    pthread_mutex_lock(&mu);
    reap_locked();
    struct emu_stream *s = stream_new_locked(emu_current_device(), flags, priority, STREAM_USER);
    pthread_mutex_unlock(&mu);
    if (s == NULL)
        return emu_ret(cudaErrorMemoryAllocation);
    *ps = (cudaStream_t)s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags)
{
    return cudaStreamCreateWithPriority(ps, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *ps)
{
    return cudaStreamCreateWithPriority(ps, cudaStreamDefault, 0);
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    EMU_ENTER("cudaDeviceGetStreamPriorityRange");
    if (least != NULL)
        *least = 0;
    if (greatest != NULL)
        *greatest = -5;
    return cudaSuccess;
}

/* cudaStreamGetFlags and cudaStreamGetPriority: the stream, once out is known to be valid. */
static cudaError_t stream_for_query(cudaStream_t h, const void *out, const char *call, struct emu_stream **s)
{
    return out == NULL ? cudaErrorInvalidValue : emu_stream_get(h, call, s);
}

cudaError_t cudaStreamGetFlags(cudaStream_t h, unsigned int *flags)
{
    EMU_ENTER("cudaStreamGetFlags");
    struct emu_stream *s;
    cudaError_t e = stream_for_query(h, flags, "cudaStreamGetFlags", &s);
    if (e == cudaSuccess)
        *flags = s->flags;
    return emu_ret(e);
}

cudaError_t cudaStreamGetPriority(cudaStream_t h, int *priority)
{
    EMU_ENTER("cudaStreamGetPriority");
    struct emu_stream *s;
    cudaError_t e = stream_for_query(h, priority, "cudaStreamGetPriority", &s);
    if (e == cudaSuccess)
        *priority = s->priority;
    return emu_ret(e);
}

cudaError_t cudaStreamDestroy(cudaStream_t h)
{
    EMU_ENTER("cudaStreamDestroy");
    struct emu_stream *s;
    if (h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread)
        return emu_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&mu);
    cudaError_t e = stream_get_locked(h, "cudaStreamDestroy", &s);
    if (e == cudaSuccess) {
        /* As on a GPU, queued work still runs; the worker leaves once it has drained. */
        s->destroyed = 1;
        pthread_cond_signal(&s->work);
        reap_locked();
    }
    pthread_mutex_unlock(&mu);
    return emu_ret(e);
}

/* The positions a synchronisation with s waits for: its last item and, for a legacy default
 * stream, every blocking stream's (synchronising with it is an operation on it). Returns how
 * many it wrote into out. Caller holds mu. */
static int sync_targets_locked(struct emu_stream *s, struct emu_dep *out)
{
    int n = s->kind == STREAM_LEGACY ? implicit_deps_locked(s, out) : 0;
    out[n++] = (struct emu_dep){s, s->enqueued};
    return n;
}

/* Waits for (block) or checks (query) every target of s, or of every stream of device d when s
 * is NULL. Returns the first failure, cudaErrorNotReady for a query not yet reached. */
static cudaError_t sync_or_query(struct emu_stream *s, int d, int block)
{
    pthread_mutex_lock(&mu);
    size_t room = count_streams_locked() + 1;
    struct emu_dep *t = malloc(room * sizeof *t);
    if (t == NULL) {
        pthread_mutex_unlock(&mu);
        return cudaErrorMemoryAllocation;
    }
    int n = 0;
    if (s != NULL)
        n = sync_targets_locked(s, t);
    else
        for (struct emu_stream *u = streams; u != NULL; u = u->next)
            if (u->device == d)
                t[n++] = (struct emu_dep){u, u->enqueued};
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        while (block && !dep_reached(t[i]) && !shutting_down)
            pthread_cond_wait(&done_cv, &mu);
        if (dep_failed(t[i]))
            e = t[i].s->error;
        else if (!dep_reached(t[i]))
            e = block ? cudaErrorCudartUnloading : cudaErrorNotReady;
    }
    pthread_mutex_unlock(&mu);
    free(t);
    return e;
}

static cudaError_t stream_sync_or_query(cudaStream_t h, const char *call, int block)
{
    EMU_ENTER(call);
    struct emu_stream *s;
    cudaError_t e = emu_stream_get(h, call, &s);
    return emu_ret(e != cudaSuccess ? e : sync_or_query(s, 0, block));
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
    return stream_sync_or_query(h, "cudaStreamSynchronize", 1);
}

cudaError_t cudaStreamQuery(cudaStream_t h)
{
    return stream_sync_or_query(h, "cudaStreamQuery", 0);
}

cudaError_t cudaDeviceSynchronize(void)
{
    EMU_ENTER("cudaDeviceSynchronize");
    if (emu_knobs.ndevices == 0)
        return emu_ret(cudaErrorNoDevice);
    return emu_ret(sync_or_query(NULL, emu_current_device(), 1));
}

void emu_device_idle_all(void)
{
    for (int d = 0; d < emu_knobs.ndevices; d++)
        (void)sync_or_query(NULL, d, 1);
}

static int overlaps(const char *a, size_t an, const char *b, size_t bn)
{
    return a < b + bn && b < a + an;
}

void emu_check_queued_use(const void *p, size_t n, const char *call)
{
    pthread_mutex_lock(&mu);
    for (struct emu_stream *s = streams; s != NULL; s = s->next)
        for (struct emu_item *it = s->head; it != NULL; it = it->next)
            for (int i = 0; i < it->nuse; i++)
                if (overlaps(it->use[i].p, it->use[i].n, p, n ? n : 1)) {
                    emu_flag(CUEMU_FLAG_FREE_IN_USE, call,
                             "%p is used by %s queued on stream #%llu and not yet run (the release waits "
                             "for it here, as on a GPU, but a caching allocator would hand the memory on)",
                             p, it->call, (unsigned long long)s->id);
                    pthread_mutex_unlock(&mu);
                    return;
                }
    pthread_mutex_unlock(&mu);
}

/* ---- host functions and kernels ---- */

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *data)
{
    EMU_ENTER("cudaLaunchHostFunc");
    struct emu_stream *s;
    if (fn == NULL)
        return emu_ret(cudaErrorInvalidValue);
    cudaError_t e = emu_stream_get(h, "cudaLaunchHostFunc", &s);
    if (e != cudaSuccess)
        return emu_ret(e);
    struct emu_item *it = emu_item_new(EMU_ITEM_HOSTFN, "cudaLaunchHostFunc");
    if (it == NULL)
        return emu_ret(cudaErrorMemoryAllocation);
    it->u.hostfn.fn = fn;
    it->u.hostfn.data = data;
    return emu_ret(emu_enqueue(s, it, NULL, 0, NULL));
}

static cudaError_t kernel_launch(cudaStream_t h, cuemu_kernel_fn fn, void *arg, void *owned)
{
    struct emu_stream *s;
    cudaError_t e = fn == NULL ? cudaErrorInvalidValue : emu_stream_get(h, "cuemu_kernel", &s);
    if (e == cudaSuccess && s->device != emu_current_device()) {
        emu_flag(CUEMU_FLAG_OTHER_DEVICE, "cuemu_kernel", "stream of device %d, current device %d: a kernel "
                 "launch into another device's stream fails", s->device, emu_current_device());
        e = cudaErrorInvalidResourceHandle;
    }
    struct emu_item *it = e == cudaSuccess ? emu_item_new(EMU_ITEM_KERNEL, "cuemu_kernel") : NULL;
    if (e == cudaSuccess && it == NULL)
        e = cudaErrorMemoryAllocation;
    if (e != cudaSuccess) {
        free(owned);
        return emu_ret(e);
    }
    it->u.kernel.fn = fn;
    it->u.kernel.arg = arg;
    it->u.kernel.owned = owned;
    return emu_ret(emu_enqueue(s, it, NULL, 0, NULL));
}

cudaError_t cuemu_kernel(cudaStream_t h, cuemu_kernel_fn fn, void *arg)
{
    EMU_ENTER("cuemu_kernel");
    return kernel_launch(h, fn, arg, NULL);
}

cudaError_t cuemu_kernel_args(cudaStream_t h, cuemu_kernel_fn fn, const void *args, size_t size)
{
    EMU_ENTER("cuemu_kernel_args");
    void *copy = malloc(size ? size : 1);
    if (copy == NULL)
        return emu_ret(cudaErrorMemoryAllocation);
    if (size > 0)
        memcpy(copy, args, size);
    return kernel_launch(h, fn, copy, copy);
}

/* ---- events ---- */

static cudaError_t event_get_locked(cudaEvent_t h, const char *call, struct emu_event **out)
{
    for (struct emu_event *e = events; e != NULL; e = e->next)
        if (e == (struct emu_event *)h) {
            *out = e;
            return cudaSuccess;
        }
    emu_flag(CUEMU_FLAG_BAD_HANDLE, call, "%p is not a live event (destroyed, or never created)", (void *)h);
    return cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned int flags)
{
    EMU_ENTER("cudaEventCreateWithFlags");
    if (pe == NULL || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)))
        return emu_ret(cudaErrorInvalidValue);
    if (flags & cudaEventInterprocess) {
        emu_flag(CUEMU_FLAG_UNSUPPORTED, "cudaEventCreateWithFlags", "interprocess events are not emulated");
        return emu_ret(cudaErrorInvalidValue);
    }
    if (emu_knobs.ndevices == 0)
        return emu_ret(cudaErrorNoDevice);
    struct emu_event *e = calloc(1, sizeof *e);
    if (e == NULL)
        return emu_ret(cudaErrorMemoryAllocation);
    e->device = emu_current_device();
    e->flags = flags;
    pthread_mutex_lock(&mu);
    e->next = events;
    events = e;
    pthread_mutex_unlock(&mu);
    *pe = (cudaEvent_t)e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *pe)
{
    return cudaEventCreateWithFlags(pe, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t h)
{
    EMU_ENTER("cudaEventDestroy");
    struct emu_event *e;
    pthread_mutex_lock(&mu);
    cudaError_t err = event_get_locked(h, "cudaEventDestroy", &e);
    if (err == cudaSuccess) {
        struct emu_event **pp = &events;
        while (*pp != e)
            pp = &(*pp)->next;
        *pp = e->next;
        mark_unref_locked(e->mark); /* a pending record keeps its own reference */
        free(e);
    }
    pthread_mutex_unlock(&mu);
    return emu_ret(err);
}

cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t sh)
{
    EMU_ENTER("cudaEventRecord");
    struct emu_event *e;
    struct emu_stream *s;
    pthread_mutex_lock(&mu);
    cudaError_t err = event_get_locked(h, "cudaEventRecord", &e);
    if (err == cudaSuccess)
        err = stream_get_locked(sh, "cudaEventRecord", &s);
    if (err == cudaSuccess && e->device != s->device) {
        emu_flag(CUEMU_FLAG_OTHER_DEVICE, "cudaEventRecord", "event of device %d, stream of device %d: a record "
                 "needs both on one device", e->device, s->device);
        err = cudaErrorInvalidResourceHandle;
    }
    pthread_mutex_unlock(&mu);
    if (err != cudaSuccess)
        return emu_ret(err);
    struct emu_mark *m = calloc(1, sizeof *m);
    struct emu_item *it = emu_item_new(EMU_ITEM_RECORD, "cudaEventRecord");
    if (m == NULL || it == NULL) {
        free(m);
        free(it);
        return emu_ret(cudaErrorMemoryAllocation);
    }
    m->refs = 2; /* the event's and the record item's */
    it->u.record.mark = m;
    struct emu_dep pos;
    err = emu_enqueue(s, it, NULL, 0, &pos);
    pthread_mutex_lock(&mu);
    if (err == cudaSuccess) {
        m->dep = pos;
        if (event_get_locked(h, "cudaEventRecord", &e) == cudaSuccess) { /* not destroyed meanwhile */
            mark_unref_locked(e->mark);
            e->mark = m;
            m = NULL;
        }
    }
    mark_unref_locked(m);
    pthread_mutex_unlock(&mu);
    return emu_ret(err);
}

/* The event's last capture, referenced (NULL, flagged, when it was never recorded). */
static cudaError_t event_mark(cudaEvent_t h, const char *call, struct emu_mark **out)
{
    struct emu_event *e;
    pthread_mutex_lock(&mu);
    cudaError_t err = event_get_locked(h, call, &e);
    *out = NULL;
    if (err == cudaSuccess) {
        *out = e->mark;
        if (e->mark != NULL)
            e->mark->refs++;
        else
            emu_flag(CUEMU_FLAG_UNRECORDED_EVENT, call, "event %p was never recorded: CUDA treats it as "
                     "complete, so this orders nothing", (void *)h);
    }
    pthread_mutex_unlock(&mu);
    return err;
}

static void mark_unref(struct emu_mark *m)
{
    pthread_mutex_lock(&mu);
    mark_unref_locked(m);
    pthread_mutex_unlock(&mu);
}

static cudaError_t event_sync_or_query(cudaEvent_t h, const char *call, int block)
{
    EMU_ENTER(call);
    struct emu_mark *m;
    cudaError_t err = event_mark(h, call, &m);
    if (err != cudaSuccess || m == NULL)
        return emu_ret(err);
    err = dep_status(m->dep, block);
    mark_unref(m);
    return emu_ret(err);
}

cudaError_t cudaEventQuery(cudaEvent_t h)
{
    return event_sync_or_query(h, "cudaEventQuery", 0);
}

cudaError_t cudaEventSynchronize(cudaEvent_t h)
{
    return event_sync_or_query(h, "cudaEventSynchronize", 1);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t sh, cudaEvent_t h, unsigned int flags)
{
    EMU_ENTER("cudaStreamWaitEvent");
    struct emu_stream *s;
    struct emu_mark *m;
    if (flags != cudaEventWaitDefault)
        return emu_ret(cudaErrorInvalidValue);
    cudaError_t err = emu_stream_get(sh, "cudaStreamWaitEvent", &s);
    if (err == cudaSuccess)
        err = event_mark(h, "cudaStreamWaitEvent", &m);
    if (err != cudaSuccess || m == NULL)
        return emu_ret(err);
    /* An event of another device is fine here (unlike in cudaEventRecord). The wait takes the
     * capture as it is now: a later record of the event does not move it. */
    struct emu_item *it = emu_item_new(EMU_ITEM_WAIT, "cudaStreamWaitEvent");
    struct emu_dep d = m->dep;
    mark_unref(m);
    if (it == NULL)
        return emu_ret(cudaErrorMemoryAllocation);
    return emu_ret(emu_enqueue(s, it, &d, 1, NULL));
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    EMU_ENTER("cudaEventElapsedTime");
    struct emu_event *a, *b;
    if (ms == NULL)
        return emu_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&mu);
    cudaError_t err = event_get_locked(start, "cudaEventElapsedTime", &a);
    if (err == cudaSuccess)
        err = event_get_locked(end, "cudaEventElapsedTime", &b);
    if (err == cudaSuccess) {
        if ((a->flags | b->flags) & cudaEventDisableTiming || a->mark == NULL || b->mark == NULL)
            err = cudaErrorInvalidResourceHandle;
        else if (a->device != b->device) {
            emu_flag(CUEMU_FLAG_OTHER_DEVICE, "cudaEventElapsedTime", "events of devices %d and %d", a->device,
                     b->device);
            err = cudaErrorInvalidResourceHandle;
        } else if (dep_failed(a->mark->dep) || dep_failed(b->mark->dep))
            err = dep_failed(a->mark->dep) ? a->mark->dep.s->error : b->mark->dep.s->error;
        else if (!dep_reached(a->mark->dep) || !dep_reached(b->mark->dep))
            err = cudaErrorNotReady;
        else
            *ms = (float)((b->mark->t - a->mark->t) * 1e3);
    }
    pthread_mutex_unlock(&mu);
    return emu_ret(err);
}

/* ---- exit ---- */

void emu_stream_shutdown(void)
{
    pthread_mutex_lock(&mu);
    shutting_down = 1;
    size_t n = 0, room = count_streams_locked();
    pthread_t *join = malloc(room * sizeof *join);
    uint64_t *ids = malloc(room * sizeof *ids);
    for (struct emu_stream *s = streams; s != NULL; s = s->next) {
        s->stop = 1;
        pthread_cond_signal(&s->work);
        /* Claimed here, joined below without mu: a worker needs mu to leave. */
        if (join != NULL && ids != NULL && s->started && !s->joined && !pthread_equal(s->thread, pthread_self())) {
            s->joined = 1;
            ids[n] = s->id;
            join[n++] = s->thread;
        }
    }
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&mu);
    for (size_t i = 0; i < n; i++) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 5;
        if (pthread_timedjoin_np(join[i], NULL, &until) != 0)
            emu_warn("at exit: the worker of stream #%llu is still running an item after 5 s (a host function "
                     "that blocks?); leaving it", (unsigned long long)ids[i]);
    }
    free(join);
    free(ids);
}
