/*
 * emu_mem.c: memory as a GPU program sees it. A cudaMalloc allocation is a memfd mapped twice:
 * PROT_NONE at the address the application gets, so that any host dereference faults at once,
 * and read-write for the stream workers (emu_ptr_view, cuemu_device_view). Both mappings end in
 * a guard page and the allocation ends as close to it as 256-byte alignment allows, so an
 * overrun faults too. Pinned and registered host memory is recorded in the same table, which is
 * what tells pinned from pageable memory and answers cudaPointerGetAttributes.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/cuda/emu/emu.h"

enum { ALLOC_DEVICE, ALLOC_PINNED, ALLOC_REGISTERED };

struct emu_alloc {
    char *base;      /* the application's address */
    size_t size;     /* bytes asked for */
    int kind;
    int device;      /* where it lives (device) or which was current (pinned, registered) */
    char *dev_map;   /* device memory: the PROT_NONE mapping, guard page included */
    char *view_map;  /* device memory: the workers' read-write mapping, guard page included */
    size_t map_len;
};

/* Fresh device memory is filled with 0xff (NaN in every float format) up to this size, so that a
 * read of memory nothing wrote shows; beyond it the memfd's zeros stay. */
#define EMU_FILL_MAX ((size_t)256 << 20)
/* Freed device address ranges stay reserved (PROT_NONE) this many frees long, so that a late use
 * is named as such instead of reaching a new allocation. */
#define EMU_QUARANTINE 4096
#define EMU_DEVICE_ALIGN 256

static pthread_rwlock_t table_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct emu_alloc *table; /* sorted by base */
static size_t ntable, captable;
static size_t used_bytes[EMU_MAX_DEVICES];
static struct { char *map; size_t len; } quarantine[EMU_QUARANTINE];
static size_t nfreed;

static size_t page_size(void)
{
    static size_t ps;
    if (ps == 0)
        ps = (size_t)sysconf(_SC_PAGESIZE);
    return ps;
}

static size_t round_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

/* Index of the first entry whose base is greater than p. Caller holds table_lock. */
static size_t upper_bound(const char *p)
{
    size_t lo = 0, hi = ntable;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (table[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The entry containing p (a zero-size registration contains nothing). Caller holds table_lock. */
static struct emu_alloc *find_locked(const void *p)
{
    size_t i = upper_bound(p);
    if (i == 0)
        return NULL;
    struct emu_alloc *a = &table[i - 1];
    return (const char *)p < a->base + a->size ? a : NULL;
}

static int table_insert(const struct emu_alloc *a)
{
    if (ntable == captable) {
        size_t cap = captable ? 2 * captable : 64;
        struct emu_alloc *t = realloc(table, cap * sizeof *t);
        if (t == NULL)
            return -1;
        table = t;
        captable = cap;
    }
    size_t i = upper_bound(a->base);
    memmove(&table[i + 1], &table[i], (ntable - i) * sizeof *table);
    table[i] = *a;
    ntable++;
    return 0;
}

static void table_remove(struct emu_alloc *a)
{
    size_t i = (size_t)(a - table);
    memmove(&table[i], &table[i + 1], (ntable - i - 1) * sizeof *table);
    ntable--;
}

void emu_ptr_classify(const void *p, struct emu_ptrinfo *out)
{
    const char *c = p;
    memset(out, 0, sizeof *out);
    out->cls = EMU_PTR_PAGEABLE;
    out->device = cudaInvalidDeviceId;
    if (p == NULL)
        return;
    pthread_rwlock_rdlock(&table_lock);
    size_t i = upper_bound(c);
    struct emu_alloc *a = i > 0 ? &table[i - 1] : NULL;
    if (a != NULL && c < a->base + a->size) {
        out->cls = a->kind == ALLOC_DEVICE ? EMU_PTR_DEVICE : EMU_PTR_PINNED;
        out->device = a->device;
        out->base = a->base;
        out->avail = (size_t)(a->base + a->size - c);
    } else if ((a != NULL && a->kind == ALLOC_DEVICE && c < a->dev_map + a->map_len + page_size()) ||
               (i < ntable && table[i].kind == ALLOC_DEVICE && c >= table[i].dev_map)) {
        out->cls = EMU_PTR_BAD;
        out->why = "lies outside every device allocation (past its end or before its start)";
    } else {
        for (size_t q = 0; q < EMU_QUARANTINE && q < nfreed; q++)
            if (c >= quarantine[q].map && c < quarantine[q].map + quarantine[q].len) {
                out->cls = EMU_PTR_BAD;
                out->why = "was freed with cudaFree";
                break;
            }
    }
    pthread_rwlock_unlock(&table_lock);
}

void *emu_ptr_view(const void *p)
{
    void *v = (void *)p;
    pthread_rwlock_rdlock(&table_lock);
    struct emu_alloc *a = p ? find_locked(p) : NULL;
    if (a != NULL && a->kind == ALLOC_DEVICE)
        v = a->view_map + ((const char *)p - a->dev_map);
    pthread_rwlock_unlock(&table_lock);
    return v;
}

void *cuemu_device_view(const void *ptr)
{
    static const char call[] = "cuemu_device_view";
    struct emu_ptrinfo pi;
    if (ptr == NULL)
        return NULL;
    if (emu_tls_ctx != EMU_CTX_KERNEL) {
        emu_flag(CUEMU_FLAG_CALLBACK_API, call, "%p: called outside an emulated kernel; host code cannot "
                 "dereference device memory", ptr);
        return NULL;
    }
    emu_ptr_classify(ptr, &pi);
    switch (pi.cls) {
    case EMU_PTR_PINNED:
        return (void *)ptr;
    case EMU_PTR_DEVICE:
        if (pi.device != emu_tls_ctx_device)
            emu_flag(CUEMU_FLAG_OTHER_DEVICE, call, "%p is memory of device %d, the kernel runs on device %d "
                     "(peer access is not emulated)", ptr, pi.device, emu_tls_ctx_device);
        return emu_ptr_view(ptr);
    case EMU_PTR_BAD:
        emu_flag(CUEMU_FLAG_BAD_POINTER, call, "%p %s", ptr, pi.why);
        return NULL;
    default:
        emu_flag(CUEMU_FLAG_PAGEABLE, call, "%p is pageable host memory, which a kernel cannot dereference",
                 ptr);
        return NULL;
    }
}

/* ---- device memory ---- */

/* Maps fd's first len bytes at a fresh address with prot, followed by a PROT_NONE guard page. */
static char *map_with_guard(int fd, size_t len, int prot)
{
    char *m = mmap(NULL, len + page_size(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    if (mmap(m, len, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        munmap(m, len + page_size());
        return NULL;
    }
    return m;
}

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    EMU_ENTER("cudaMalloc");
    if (ptr == NULL)
        return emu_ret(cudaErrorInvalidValue);
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    int dev = emu_current_device();
    if (emu_knobs.ndevices == 0)
        return emu_ret(cudaErrorNoDevice);
    size_t rounded = round_up(size, EMU_DEVICE_ALIGN);
    size_t len = round_up(rounded, page_size());
    pthread_rwlock_wrlock(&table_lock);
    int full = used_bytes[dev] + len > emu_knobs.mem_bytes || len < size;
    if (!full)
        used_bytes[dev] += len;
    pthread_rwlock_unlock(&table_lock);
    if (full)
        return emu_ret(cudaErrorMemoryAllocation);

    struct emu_alloc a = {.size = size, .kind = ALLOC_DEVICE, .device = dev, .map_len = len};
    int fd = memfd_create("cuemu-device", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0)
        goto err_fd;
    a.dev_map = map_with_guard(fd, len, PROT_NONE);
    if (a.dev_map == NULL)
        goto err_fd;
    a.view_map = map_with_guard(fd, len, PROT_READ | PROT_WRITE);
    if (a.view_map == NULL)
        goto err_dev;
    close(fd);
    fd = -1;
    a.base = a.dev_map + (len - rounded);
    memset(a.view_map + (len - rounded), 0xff, size < EMU_FILL_MAX ? size : EMU_FILL_MAX);
    pthread_rwlock_wrlock(&table_lock);
    int bad = table_insert(&a);
    pthread_rwlock_unlock(&table_lock);
    if (bad)
        goto err_view;
    *ptr = a.base;
    return cudaSuccess;

err_view:
    munmap(a.view_map, len + page_size());
err_dev:
    munmap(a.dev_map, len + page_size());
err_fd:
    if (fd >= 0)
        close(fd);
    pthread_rwlock_wrlock(&table_lock);
    used_bytes[dev] -= len;
    pthread_rwlock_unlock(&table_lock);
    return emu_ret(cudaErrorMemoryAllocation);
}

/* Removes the entry based at p of the given kind after the release checks every kind shares:
 * queued work that uses it is flagged, and (as cudaFree does on a GPU) the device is drained
 * first. *out receives the removed entry. */
static cudaError_t release(void *p, int kind, const char *call, cudaError_t notfound, struct emu_alloc *out)
{
    pthread_rwlock_rdlock(&table_lock);
    struct emu_alloc *a = find_locked(p);
    int ok = a != NULL && a->base == (char *)p && a->kind == kind;
    size_t size = ok ? a->size : 0;
    pthread_rwlock_unlock(&table_lock);
    if (!ok) {
        struct emu_ptrinfo pi;
        emu_ptr_classify(p, &pi);
        emu_flag(CUEMU_FLAG_BAD_POINTER, call, "%p is not the start of a live %s (%s)", p,
                 kind == ALLOC_DEVICE ? "cudaMalloc allocation"
                 : kind == ALLOC_PINNED ? "cudaMallocHost/cudaHostAlloc allocation" : "cudaHostRegister range",
                 pi.cls == EMU_PTR_BAD ? pi.why : pi.cls == EMU_PTR_DEVICE ? "device memory"
                 : pi.cls == EMU_PTR_PINNED ? "pinned host memory" : "host memory");
        return notfound;
    }
    emu_check_queued_use(p, size, call);
    emu_device_idle_all();
    pthread_rwlock_wrlock(&table_lock);
    a = find_locked(p);
    ok = a != NULL && a->base == (char *)p && a->kind == kind;
    if (ok) {
        *out = *a;
        table_remove(a);
        if (kind == ALLOC_DEVICE)
            used_bytes[out->device] -= out->map_len;
    }
    pthread_rwlock_unlock(&table_lock);
    return ok ? cudaSuccess : notfound; /* another thread released it meanwhile */
}

/* cudaFree and cudaFreeHost: NULL is fine; anything else must be a live allocation of kind. */
static cudaError_t free_kind(void *p, int kind, const char *call)
{
    struct emu_alloc a;
    if (p == NULL)
        return cudaSuccess;
    cudaError_t e = release(p, kind, call, cudaErrorInvalidValue, &a);
    if (e != cudaSuccess || kind != ALLOC_DEVICE) {
        if (e == cudaSuccess)
            munmap(a.base, a.size);
        return e;
    }
    munmap(a.view_map, a.map_len + page_size());
    pthread_rwlock_wrlock(&table_lock);
    size_t q = nfreed++ % EMU_QUARANTINE;
    if (nfreed > EMU_QUARANTINE)
        munmap(quarantine[q].map, quarantine[q].len);
    quarantine[q].map = a.dev_map;
    quarantine[q].len = a.map_len + page_size();
    pthread_rwlock_unlock(&table_lock);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    EMU_ENTER("cudaFree");
    return emu_ret(free_kind(p, ALLOC_DEVICE, "cudaFree"));
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    EMU_ENTER("cudaMemGetInfo");
    if (free_bytes == NULL || total == NULL)
        return emu_ret(cudaErrorInvalidValue);
    pthread_rwlock_rdlock(&table_lock);
    *total = emu_knobs.mem_bytes;
    *free_bytes = emu_knobs.mem_bytes - used_bytes[emu_current_device()];
    pthread_rwlock_unlock(&table_lock);
    return cudaSuccess;
}

/* ---- pinned and registered host memory ---- */

static cudaError_t add_host(void *p, size_t size, int kind)
{
    struct emu_alloc a = {.base = p, .size = size, .kind = kind, .device = emu_current_device()};
    cudaError_t e = cudaSuccess;
    pthread_rwlock_wrlock(&table_lock);
    size_t i = upper_bound(p);
    if ((i > 0 && table[i - 1].base + table[i - 1].size > (char *)p) ||
        (i < ntable && table[i].base < (char *)p + size))
        e = cudaErrorHostMemoryAlreadyRegistered;
    else if (table_insert(&a) != 0)
        e = cudaErrorMemoryAllocation;
    pthread_rwlock_unlock(&table_lock);
    return e;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    EMU_ENTER("cudaHostAlloc");
    if (ptr == NULL || (flags & ~(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined)))
        return emu_ret(cudaErrorInvalidValue);
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return emu_ret(cudaErrorMemoryAllocation);
    cudaError_t e = add_host(m, size, ALLOC_PINNED);
    if (e != cudaSuccess) {
        munmap(m, size);
        return emu_ret(cudaErrorMemoryAllocation);
    }
    *ptr = m;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void *p)
{
    EMU_ENTER("cudaFreeHost");
    return emu_ret(free_kind(p, ALLOC_PINNED, "cudaFreeHost"));
}

cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    EMU_ENTER("cudaHostRegister");
    struct emu_ptrinfo pi;
    if (p == NULL || size == 0)
        return emu_ret(cudaErrorInvalidValue);
    emu_ptr_classify(p, &pi);
    if (pi.cls == EMU_PTR_DEVICE || pi.cls == EMU_PTR_BAD) {
        emu_flag(CUEMU_FLAG_BAD_POINTER, "cudaHostRegister", "%p is device memory, not host memory", p);
        return emu_ret(cudaErrorInvalidValue);
    }
    return emu_ret(add_host(p, size, ALLOC_REGISTERED));
}

cudaError_t cudaHostUnregister(void *p)
{
    EMU_ENTER("cudaHostUnregister");
    struct emu_alloc a;
    return emu_ret(release(p, ALLOC_REGISTERED, "cudaHostUnregister", cudaErrorHostMemoryNotRegistered, &a));
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags)
{
    EMU_ENTER("cudaHostGetDevicePointer");
    struct emu_ptrinfo pi;
    if (dev == NULL || flags != 0)
        return emu_ret(cudaErrorInvalidValue);
    emu_ptr_classify(host, &pi);
    if (pi.cls != EMU_PTR_PINNED)
        return emu_ret(cudaErrorInvalidValue);
    *dev = host; /* unified addressing: the same address on both sides */
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    EMU_ENTER("cudaPointerGetAttributes");
    struct emu_ptrinfo pi;
    if (attr == NULL)
        return emu_ret(cudaErrorInvalidValue);
    emu_ptr_classify(ptr, &pi);
    memset(attr, 0, sizeof *attr);
    switch (pi.cls) {
    case EMU_PTR_DEVICE:
        attr->type = cudaMemoryTypeDevice;
        attr->device = pi.device;
        attr->devicePointer = (void *)ptr;
        break;
    case EMU_PTR_PINNED:
        attr->type = cudaMemoryTypeHost;
        attr->device = pi.device;
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = (void *)ptr;
        break;
    case EMU_PTR_BAD:
        emu_flag(CUEMU_FLAG_BAD_POINTER, "cudaPointerGetAttributes", "%p %s", ptr, pi.why);
        return emu_ret(cudaErrorInvalidValue);
    default:
        /* CUDA 11 and later: plain host memory is not an error. */
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = cudaInvalidDeviceId;
        attr->hostPointer = (void *)ptr;
        break;
    }
    return cudaSuccess;
}
