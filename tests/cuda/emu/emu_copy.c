/*
 * emu_copy.c: cudaMemcpy and cudaMemset, synchronous and on streams. Every copy is work on a
 * stream (the legacy default stream for the synchronous forms), and the synchronous forms block
 * the host exactly as far as CUDA's documented rules do, no further: a device-to-device copy, a
 * memset of device memory and a copy from pageable memory to the device return before the
 * device has done them, which is where programs that assume otherwise go wrong.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "tests/cuda/emu/emu.h"

static const char *class_name(int cls)
{
    switch (cls) {
    case EMU_PTR_DEVICE: return "device memory";
    case EMU_PTR_PINNED: return "pinned host memory";
    case EMU_PTR_PAGEABLE: return "pageable host memory";
    default: return "a bad device address";
    }
}

/* Device-accessible: device memory, or pinned host memory (mapped, unified addressing). */
static int dev_ok(const struct emu_ptrinfo *pi)
{
    return pi->cls == EMU_PTR_DEVICE || pi->cls == EMU_PTR_PINNED;
}

static int host_ok(const struct emu_ptrinfo *pi)
{
    return pi->cls == EMU_PTR_PAGEABLE || pi->cls == EMU_PTR_PINNED;
}

/* Checks one side of a transfer of n bytes: a live address, inside its allocation. A pinned
 * range that ends before the transfer does counts as pageable. */
static cudaError_t check_side(const void *p, size_t n, struct emu_ptrinfo *pi, const char *call, const char *side)
{
    emu_ptr_classify(p, pi);
    if (pi->cls == EMU_PTR_BAD) {
        emu_flag(CUEMU_FLAG_BAD_POINTER, call, "%s %p %s", side, p, pi->why);
        return cudaErrorInvalidValue;
    }
    if (pi->cls == EMU_PTR_DEVICE && n > pi->avail) {
        emu_flag(CUEMU_FLAG_BAD_POINTER, call, "%s %p: %zu bytes run past the end of its allocation (%zu left)",
                 side, p, n, pi->avail);
        return cudaErrorInvalidValue;
    }
    if (pi->cls == EMU_PTR_PINNED && n > pi->avail)
        pi->cls = EMU_PTR_PAGEABLE;
    return cudaSuccess;
}

/* Whether the kind agrees with what the pointers are; cudaMemcpyDefault takes them as they are. */
static cudaError_t check_kind(enum cudaMemcpyKind kind, const struct emu_ptrinfo *d, const struct emu_ptrinfo *s,
                              const char *call)
{
    int ok;
    switch (kind) {
    case cudaMemcpyHostToHost: ok = host_ok(d) && host_ok(s); break;
    case cudaMemcpyHostToDevice: ok = dev_ok(d) && host_ok(s); break;
    case cudaMemcpyDeviceToHost: ok = host_ok(d) && dev_ok(s); break;
    case cudaMemcpyDeviceToDevice: ok = dev_ok(d) && dev_ok(s); break;
    case cudaMemcpyDefault: ok = 1; break;
    default: return cudaErrorInvalidMemcpyDirection;
    }
    if (!ok) {
        emu_flag(CUEMU_FLAG_BAD_POINTER, call, "kind %d, but the destination is %s and the source %s", (int)kind,
                 class_name(d->cls), class_name(s->cls));
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

static void check_device_of(const struct emu_ptrinfo *pi, const void *p, int device, const char *call)
{
    if (pi->cls == EMU_PTR_DEVICE && pi->device != device)
        emu_flag(CUEMU_FLAG_OTHER_DEVICE, call, "%p is memory of device %d, the stream belongs to device %d", p,
                 pi->device, device);
}

/* Enqueues a copy of n bytes on s; staging, if not NULL, is a host copy of the source that the
 * item owns. *pos is where it lies in s. */
static cudaError_t enqueue_copy(struct emu_stream *s, void *dst, const void *src, size_t n, void *staging,
                                const char *call, struct emu_dep *pos)
{
    struct emu_item *it = emu_item_new(EMU_ITEM_COPY, call);
    if (it == NULL) {
        free(staging);
        return cudaErrorMemoryAllocation;
    }
    it->u.copy.dst = dst;
    it->u.copy.src = src;
    it->u.copy.n = n;
    it->u.copy.staging = staging;
    emu_item_use(it, dst, n);
    emu_item_use(it, src, n);
    return emu_enqueue(s, it, NULL, 0, pos);
}

/* The checks every copy passes: both sides, the kind, the stream. */
static cudaError_t check_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t h,
                              const char *call, struct emu_ptrinfo *d, struct emu_ptrinfo *s, struct emu_stream **st)
{
    cudaError_t e = check_side(dst, n, d, call, "destination");
    if (e == cudaSuccess)
        e = check_side(src, n, s, call, "source");
    if (e == cudaSuccess)
        e = check_kind(kind, d, s, call);
    if (e == cudaSuccess)
        e = emu_stream_get(h, call, st);
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t h)
{
    static const char call[] = "cudaMemcpyAsync";
    EMU_ENTER(call);
    struct emu_ptrinfo d, s;
    struct emu_stream *st;
    cudaError_t e = check_copy(dst, src, n, kind, h, call, &d, &s, &st);
    if (e != cudaSuccess)
        return emu_ret(e);
    int dev = emu_stream_device(st);
    check_device_of(&d, dst, dev, call);
    check_device_of(&s, src, dev, call);
    if ((d.cls == EMU_PTR_DEVICE && s.cls == EMU_PTR_PAGEABLE) ||
        (s.cls == EMU_PTR_DEVICE && d.cls == EMU_PTR_PAGEABLE))
        emu_flag(CUEMU_FLAG_PAGEABLE, call, "%s %p is pageable host memory (not cudaMallocHost, cudaHostAlloc or "
                 "cudaHostRegister): on a GPU the copy is synchronous and overlaps nothing; here it runs in "
                 "stream order like a pinned one", d.cls == EMU_PTR_PAGEABLE ? "destination" : "source",
                 d.cls == EMU_PTR_PAGEABLE ? dst : src);
    if (n == 0)
        return cudaSuccess;
    return emu_ret(enqueue_copy(st, dst, src, n, NULL, call, NULL));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    static const char call[] = "cudaMemcpy";
    EMU_ENTER(call);
    struct emu_ptrinfo d, s;
    struct emu_stream *st;
    struct emu_dep pos;
    cudaError_t e = check_copy(dst, src, n, kind, NULL, call, &d, &s, &st);
    if (e != cudaSuccess || n == 0)
        return emu_ret(e);
    /* CUDA's rules for the host: device to device does not wait; pageable to device returns once
     * the source is staged; everything else returns when the copy is done. */
    if (d.cls == EMU_PTR_DEVICE && s.cls == EMU_PTR_DEVICE)
        return emu_ret(enqueue_copy(st, dst, src, n, NULL, call, NULL));
    if (d.cls == EMU_PTR_DEVICE && s.cls == EMU_PTR_PAGEABLE) {
        void *staging = malloc(n);
        if (staging == NULL)
            return emu_ret(cudaErrorMemoryAllocation);
        memcpy(staging, src, n);
        return emu_ret(enqueue_copy(st, dst, src, n, staging, call, NULL));
    }
    e = enqueue_copy(st, dst, src, n, NULL, call, &pos);
    if (e == cudaSuccess)
        e = emu_dep_wait(pos);
    return emu_ret(e);
}

/* Enqueues a memset after the checks both forms share; *pinned tells the caller to wait. */
static cudaError_t memset_on(cudaStream_t h, void *dst, int value, size_t n, const char *call, struct emu_dep *pos,
                             int *pinned)
{
    struct emu_ptrinfo d;
    struct emu_stream *st;
    cudaError_t e = check_side(dst, n, &d, call, "destination");
    if (e == cudaSuccess && d.cls == EMU_PTR_PAGEABLE) {
        emu_flag(CUEMU_FLAG_PAGEABLE, call, "%p is pageable host memory, which the device cannot write", dst);
        e = cudaErrorInvalidValue;
    }
    if (e == cudaSuccess)
        e = emu_stream_get(h, call, &st);
    if (e != cudaSuccess)
        return e;
    check_device_of(&d, dst, emu_stream_device(st), call);
    *pinned = d.cls == EMU_PTR_PINNED;
    if (n == 0) {
        *pinned = 0;
        return cudaSuccess;
    }
    struct emu_item *it = emu_item_new(EMU_ITEM_SET, call);
    if (it == NULL)
        return cudaErrorMemoryAllocation;
    it->u.set.dst = dst;
    it->u.set.value = value;
    it->u.set.n = n;
    emu_item_use(it, dst, n);
    return emu_enqueue(st, it, NULL, 0, pos);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t h)
{
    EMU_ENTER("cudaMemsetAsync");
    struct emu_dep pos;
    int pinned;
    return emu_ret(memset_on(h, dst, value, n, "cudaMemsetAsync", &pos, &pinned));
}

cudaError_t cudaMemset(void *dst, int value, size_t n)
{
    EMU_ENTER("cudaMemset");
    struct emu_dep pos;
    int pinned = 0;
    /* Asynchronous to the host for device memory, as documented; synchronous for pinned memory. */
    cudaError_t e = memset_on(NULL, dst, value, n, "cudaMemset", &pos, &pinned);
    if (e == cudaSuccess && pinned)
        e = emu_dep_wait(pos);
    return emu_ret(e);
}
