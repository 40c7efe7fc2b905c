/*
 * emu.h: the emulator's internals, shared by its files. core (knobs, flags, errors, devices),
 * mem (device and pinned memory, pointer classes and views), stream (streams, events, their
 * worker threads and dependencies), copy (memcpy, memset), nccl (communicators over shared
 * memory). One global mutex guards streams, events and queues; the memory table has its own lock.
 */
#ifndef CUEMU_EMU_H
#define CUEMU_EMU_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "tests/cuda/emu/cuemu.h"

#define EMU_MAX_DEVICES 16
/* The error a failed work item leaves on its stream and every stream that waits on it. */
#define EMU_WORK_FAILED cudaErrorLaunchFailure

#if defined(__GNUC__)
#define EMU_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define EMU_PRINTF(f, a)
#endif

/* ---- core ---- */

struct emu_device {
    int phys;                /* index among the CUEMU_DEVICES of this host */
    char busid[16];          /* "0000:xx:00.0", distinct per physical index */
    unsigned char uuid[16];  /* from host name and physical index */
};

/* Knobs read once, at the first call. */
struct emu_knobs {
    int ndevices;            /* visible devices after CUDA_VISIBLE_DEVICES */
    size_t mem_bytes;        /* CUEMU_DEVICE_MEM_MB: each device's capacity */
};

extern struct emu_knobs emu_knobs;
extern struct emu_device emu_devices[EMU_MAX_DEVICES];
extern char emu_hostname[64];

/* Starts the emulator once; every API entry point calls it. */
void emu_init(void);
/* 1 once the process has begun to exit: queued work is dropped, waits give up. */
int emu_exiting(void);

/* Raises a flag of kind from inside call; aborts under CUEMU_STRICT=1. */
void emu_flag(enum cuemu_flag kind, const char *call, const char *fmt, ...) EMU_PRINTF(3, 4);
/* Prints an emulator message that is not a flag (NCCL_DEBUG=WARN style). */
void emu_warn(const char *fmt, ...) EMU_PRINTF(1, 2);

/* The current device of this thread (cudaSetDevice), 0 at first. */
int emu_current_device(void);
/* FNV-1a over bytes, for host identities and unique ids. */
uint64_t emu_hash(const void *p, size_t n, uint64_t h);
/* CLOCK_MONOTONIC in seconds. */
double emu_now(void);
/* Reads an integer environment knob; def when unset, flags and uses def when malformed. */
long emu_env_long(const char *name, long def, long min, long max);

/* Every API entry: initialises, refuses calls from host functions and kernels (flagged), and
 * refuses after exit began. Returns cudaSuccess or the error to return. */
cudaError_t emu_enter(const char *call);
/* Records err as this thread's last error (not cudaSuccess, not cudaErrorNotReady) and returns it. */
cudaError_t emu_ret(cudaError_t err);
#define EMU_ENTER(call)                         \
    do {                                        \
        cudaError_t enter_err_ = emu_enter(call); \
        if (enter_err_ != cudaSuccess)          \
            return emu_ret(enter_err_);         \
    } while (0)

/* The thread is running an emulated kernel or host function (on a worker). */
enum emu_ctx { EMU_CTX_HOST, EMU_CTX_WORKER, EMU_CTX_HOSTFN, EMU_CTX_KERNEL };
extern _Thread_local int emu_tls_ctx;
extern _Thread_local int emu_tls_ctx_device; /* the device of the stream the worker serves */

/* ---- mem ---- */

enum emu_ptr_class { EMU_PTR_PAGEABLE, EMU_PTR_PINNED, EMU_PTR_DEVICE, EMU_PTR_BAD };

struct emu_ptrinfo {
    int cls;         /* enum emu_ptr_class */
    int device;      /* the device of a device or pinned allocation */
    void *base;      /* the allocation or registration it lies in */
    size_t avail;    /* bytes from the pointer to the end of it */
    const char *why; /* for EMU_PTR_BAD: what is wrong */
};

/* Classifies p: device memory, pinned (allocated or registered) host memory, pageable host
 * memory, or a bad device address (freed, between allocations). */
void emu_ptr_classify(const void *p, struct emu_ptrinfo *out);
/* The worker's read-write address for p (a device pointer's view; host pointers unchanged). */
void *emu_ptr_view(const void *p);

/* ---- stream ---- */

struct emu_stream;

/* A position in a stream: satisfied once the stream completed item seq. */
struct emu_dep {
    struct emu_stream *s;
    uint64_t seq;
};

/* An address range queued work reads or writes, for the checks of cudaFree and friends. */
struct emu_range {
    const char *p;
    size_t n;
};

#define EMU_ITEM_RANGES 4

enum emu_item_kind { EMU_ITEM_COPY, EMU_ITEM_SET, EMU_ITEM_HOSTFN, EMU_ITEM_KERNEL, EMU_ITEM_RECORD,
                     EMU_ITEM_WAIT, EMU_ITEM_EXT };

struct emu_mark;

struct emu_item {
    struct emu_item *next;
    int kind;
    uint64_t seq;
    const char *call;
    int ndeps;
    struct emu_dep *deps;
    int nuse;
    struct emu_range use[EMU_ITEM_RANGES];
    union {
        struct { void *dst; const void *src; size_t n; void *staging; } copy;
        struct { void *dst; int value; size_t n; } set;
        struct { cudaHostFn_t fn; void *data; } hostfn;
        struct { cuemu_kernel_fn fn; void *arg; void *owned; } kernel;
        struct { struct emu_mark *mark; } record;
        /* run on the worker (cudaSuccess or the error that fails the stream), then drop; drop
         * alone when the item is skipped. */
        struct { cudaError_t (*run)(void *ctx); void (*drop)(void *ctx, int ran); void *ctx; } ext;
    } u;
};

/* A new item of kind for call, zeroed. NULL when out of memory. */
struct emu_item *emu_item_new(int kind, const char *call);
/* Notes a range the item uses (device or pinned memory only; others are ignored). */
void emu_item_use(struct emu_item *it, const void *p, size_t n);

/* Resolves a stream handle (0, cudaStreamLegacy, cudaStreamPerThread or a created stream) for
 * call; an unknown or destroyed one is flagged and refused. */
cudaError_t emu_stream_get(cudaStream_t h, const char *call, struct emu_stream **out);
int emu_stream_device(const struct emu_stream *s);
/* Appends it to s after the implicit dependencies (legacy default stream) and the ndeps extra
 * ones; takes it over whatever happens. *pos, if not NULL, is its position. */
cudaError_t emu_enqueue(struct emu_stream *s, struct emu_item *it, const struct emu_dep *deps, int ndeps,
                        struct emu_dep *pos);
/* The position of the last item enqueued on s so far. */
struct emu_dep emu_stream_tail(struct emu_stream *s);
/* Blocks the host until dep is reached; the error of a failed stream, or cudaSuccess. */
cudaError_t emu_dep_wait(struct emu_dep dep);
/* Blocks until every stream of every device is idle (cudaFree and friends). */
void emu_device_idle_all(void);
/* Flags queued work that uses [p, p+n) (call: who is about to release it). */
void emu_check_queued_use(const void *p, size_t n, const char *call);
/* Stops every worker at exit. */
void emu_stream_shutdown(void);

/* ---- nccl ---- */

/* Releases every communicator's blocked workers at exit. */
void emu_nccl_shutdown(void);

#endif
