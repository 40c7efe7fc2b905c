/*
 * emu_core.c: the emulator's start and end, its knobs, the flags it raises, CUDA's error names
 * and last error, and the devices (CUEMU_DEVICES physical ones per host, CUDA_VISIBLE_DEVICES
 * choosing among them, as the real runtime does).
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/cuda/emu/emu.h"

struct emu_knobs emu_knobs;
struct emu_device emu_devices[EMU_MAX_DEVICES];
char emu_hostname[64];

_Thread_local int emu_tls_ctx = EMU_CTX_HOST;
_Thread_local int emu_tls_ctx_device;
static _Thread_local int tls_device;
static _Thread_local cudaError_t tls_last_error = cudaSuccess;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static atomic_int exiting;
static atomic_ulong flag_counts[CUEMU_FLAG_NKINDS];

static const char *const flag_names[CUEMU_FLAG_NKINDS] = {
    [CUEMU_FLAG_PAGEABLE] = "pageable",
    [CUEMU_FLAG_UNRECORDED_EVENT] = "unrecorded-event",
    [CUEMU_FLAG_OTHER_DEVICE] = "other-device",
    [CUEMU_FLAG_FREE_IN_USE] = "free-in-use",
    [CUEMU_FLAG_BAD_POINTER] = "bad-pointer",
    [CUEMU_FLAG_BAD_HANDLE] = "bad-handle",
    [CUEMU_FLAG_CALLBACK_API] = "callback-api",
    [CUEMU_FLAG_UNSUPPORTED] = "unsupported",
    [CUEMU_FLAG_NCCL_MISMATCH] = "nccl-mismatch",
    [CUEMU_FLAG_NCCL_MISUSE] = "nccl-misuse",
    [CUEMU_FLAG_NCCL_HANG] = "nccl-hang",
};

uint64_t emu_hash(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    if (h == 0)
        h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

double emu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void emu_warn(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuemu[%d]: %s\n", (int)getpid(), line);
}

long emu_env_long(const char *name, long def, long min, long max)
{
    const char *v = getenv(name);
    char *end;
    if (v == NULL || *v == '\0')
        return def;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || x < min || x > max) {
        emu_warn("%s=%s is not an integer in [%ld, %ld]: using %ld", name, v, min, max, def);
        return def;
    }
    return x;
}

void emu_flag(enum cuemu_flag kind, const char *call, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&flag_counts[kind], 1);
    fprintf(stderr, "cuemu[%d]: FLAG %s: %s: %s\n", (int)getpid(), flag_names[kind], call, line);
    /* Read at every flag, so that a test can turn it on for one part of a run. */
    if (emu_env_long("CUEMU_STRICT", 0, 0, 1)) {
        fprintf(stderr, "cuemu[%d]: CUEMU_STRICT=1: aborting at the first flag\n", (int)getpid());
        abort();
    }
}

unsigned long cuemu_flag_count(void)
{
    unsigned long n = 0;
    for (int k = 0; k < CUEMU_FLAG_NKINDS; k++)
        n += atomic_load(&flag_counts[k]);
    return n;
}

unsigned long cuemu_flag_count_of(enum cuemu_flag kind)
{
    return (unsigned)kind < CUEMU_FLAG_NKINDS ? atomic_load(&flag_counts[kind]) : 0;
}

const char *cuemu_flag_name(enum cuemu_flag kind)
{
    return (unsigned)kind < CUEMU_FLAG_NKINDS ? flag_names[kind] : "unknown";
}

int emu_exiting(void)
{
    return atomic_load(&exiting);
}

/* At exit: NCCL first (its blocked workers must let go), then the streams, whose workers are
 * joined so that no thread outlives the emulator. */
static void emu_atexit(void)
{
    atomic_store(&exiting, 1);
#ifdef HAVE_NCCL
    emu_nccl_shutdown();
#endif
    emu_stream_shutdown();
}

/* CUDA_VISIBLE_DEVICES as the runtime reads it: a comma list of physical indices; the first
 * entry that is not a valid, new index ends the list; an empty value hides every device. */
static int visible_devices(int nphys, int *map)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v == NULL) {
        for (int i = 0; i < nphys; i++)
            map[i] = i;
        return nphys;
    }
    int n = 0;
    while (*v != '\0' && n < nphys) {
        while (*v == ' ')
            v++;
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (end == v || errno != 0 || x < 0 || x >= nphys)
            break;
        int dup = 0;
        for (int i = 0; i < n; i++)
            dup |= map[i] == (int)x;
        if (dup)
            break;
        map[n++] = (int)x;
        while (*end == ' ')
            end++;
        if (*end != ',')
            break;
        v = end + 1;
    }
    return n;
}

static void init_once_fn(void)
{
    if (gethostname(emu_hostname, sizeof emu_hostname - 1) != 0)
        strcpy(emu_hostname, "localhost");
    int nphys = (int)emu_env_long("CUEMU_DEVICES", 1, 0, EMU_MAX_DEVICES);
    int map[EMU_MAX_DEVICES];
    emu_knobs.ndevices = visible_devices(nphys, map);
    emu_knobs.mem_bytes = (size_t)emu_env_long("CUEMU_DEVICE_MEM_MB", 16384, 1, 1L << 30) << 20;
    uint64_t host = emu_hash(emu_hostname, strlen(emu_hostname), 0);
    for (int d = 0; d < emu_knobs.ndevices; d++) {
        struct emu_device *dev = &emu_devices[d];
        dev->phys = map[d];
        snprintf(dev->busid, sizeof dev->busid, "0000:%02x:00.0", 0x18 + 0x10 * map[d]);
        uint64_t h1 = emu_hash(&dev->phys, sizeof dev->phys, host);
        uint64_t h2 = emu_hash(&h1, sizeof h1, 0);
        memcpy(dev->uuid, &h1, 8);
        memcpy(dev->uuid + 8, &h2, 8);
    }
    atexit(emu_atexit);
}

void emu_init(void)
{
    pthread_once(&init_once, init_once_fn);
}

cudaError_t emu_ret(cudaError_t err)
{
    if (err != cudaSuccess && err != cudaErrorNotReady)
        tls_last_error = err;
    return err;
}

cudaError_t emu_enter(const char *call)
{
    emu_init();
    if (emu_exiting())
        return cudaErrorCudartUnloading;
    if (emu_tls_ctx == EMU_CTX_HOSTFN || emu_tls_ctx == EMU_CTX_KERNEL) {
        emu_flag(CUEMU_FLAG_CALLBACK_API, call, "called from %s, which must not call CUDA",
                 emu_tls_ctx == EMU_CTX_HOSTFN ? "a cudaLaunchHostFunc callback" : "an emulated kernel");
        return cudaErrorNotPermitted;
    }
    return cudaSuccess;
}

int emu_current_device(void)
{
    return tls_device;
}

/* ---- errors ---- */

#define EMU_ERROR_TABLE(X)                                                                        \
    X(cudaSuccess, "no error")                                                                    \
    X(cudaErrorInvalidValue, "invalid argument")                                                  \
    X(cudaErrorMemoryAllocation, "out of memory")                                                 \
    X(cudaErrorInitializationError, "initialization error")                                       \
    X(cudaErrorCudartUnloading, "driver shutting down")                                           \
    X(cudaErrorInvalidHostPointer, "invalid host pointer")                                        \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                                    \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                       \
    X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version") \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                    \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                           \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                  \
    X(cudaErrorNotReady, "device not ready")                                                      \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")                        \
    X(cudaErrorHostMemoryAlreadyRegistered, "part or all of the requested memory range is already mapped") \
    X(cudaErrorHostMemoryNotRegistered, "pointer does not correspond to a registered memory region") \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                                       \
    X(cudaErrorNotPermitted, "operation not permitted")                                           \
    X(cudaErrorNotSupported, "operation not supported")                                           \
    X(cudaErrorUnknown, "unknown error")

const char *cudaGetErrorString(cudaError_t err)
{
    switch (err) {
#define X(code, text) \
    case code:        \
        return text;
        EMU_ERROR_TABLE(X)
#undef X
    default:
        return "unrecognized error code";
    }
}

const char *cudaGetErrorName(cudaError_t err)
{
    switch (err) {
#define X(code, text) \
    case code:        \
        return #code;
        EMU_ERROR_TABLE(X)
#undef X
    default:
        return "unrecognized error code";
    }
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tls_last_error;
    tls_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return tls_last_error;
}

/* ---- versions and devices ---- */

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (v == NULL)
        return emu_ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (v == NULL)
        return emu_ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    EMU_ENTER("cudaGetDeviceCount");
    if (count == NULL)
        return emu_ret(cudaErrorInvalidValue);
    *count = emu_knobs.ndevices;
    return emu_knobs.ndevices > 0 ? cudaSuccess : emu_ret(cudaErrorNoDevice);
}

static cudaError_t check_device(int d)
{
    if (emu_knobs.ndevices == 0)
        return cudaErrorNoDevice;
    return d >= 0 && d < emu_knobs.ndevices ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaGetDevice(int *device)
{
    EMU_ENTER("cudaGetDevice");
    if (device == NULL)
        return emu_ret(cudaErrorInvalidValue);
    cudaError_t e = check_device(0);
    if (e != cudaSuccess)
        return emu_ret(e);
    *device = tls_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    EMU_ENTER("cudaSetDevice");
    cudaError_t e = check_device(device);
    if (e != cudaSuccess)
        return emu_ret(e);
    tls_device = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *busid, int len, int device)
{
    EMU_ENTER("cudaDeviceGetPCIBusId");
    cudaError_t e = check_device(device);
    if (e != cudaSuccess)
        return emu_ret(e);
    if (busid == NULL || len <= 0)
        return emu_ret(cudaErrorInvalidValue);
    snprintf(busid, (size_t)len, "%s", emu_devices[device].busid);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *busid)
{
    EMU_ENTER("cudaDeviceGetByPCIBusId");
    if (device == NULL || busid == NULL)
        return emu_ret(cudaErrorInvalidValue);
    for (int d = 0; d < emu_knobs.ndevices; d++)
        if (strcasecmp(busid, emu_devices[d].busid) == 0) {
            *device = d;
            return cudaSuccess;
        }
    return emu_ret(cudaErrorInvalidDevice);
}

/* The emulated device's attributes, the one place their values are written: an H100-like
 * compute capability 9.0 part, so that code choosing paths by capability takes the modern ones.
 * 0 and *v set, or -1 for an attribute not emulated. */
static int attr_value(enum cudaDeviceAttr attr, int device, int *v)
{
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY: *v = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *v = 64; break;
    case cudaDevAttrMaxGridDimX: *v = 0x7fffffff; break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: *v = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 << 10; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrPciBusId: *v = (int)strtol(emu_devices[device].busid + 5, NULL, 16); break;
    case cudaDevAttrPciDeviceId:
    case cudaDevAttrPciDomainId:
    case cudaDevAttrIntegrated:
    case cudaDevAttrManagedMemory:
    case cudaDevAttrConcurrentManagedAccess:
    case cudaDevAttrPageableMemoryAccess:
    case cudaDevAttrGPUDirectRDMASupported:
    case cudaDevAttrMemoryPoolsSupported:
    case cudaDevAttrEccEnabled: *v = 0; break;
    case cudaDevAttrCanMapHostMemory:
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrConcurrentKernels:
    case cudaDevAttrStreamPrioritiesSupported:
    case cudaDevAttrHostRegisterSupported: *v = 1; break;
    case cudaDevAttrAsyncEngineCount: *v = 2; break;
    default: return -1;
    }
    return 0;
}

static cudaError_t device_arg(int device, const void *out)
{
    cudaError_t e = check_device(device);
    return e != cudaSuccess ? e : out == NULL ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    EMU_ENTER("cudaGetDeviceProperties");
    cudaError_t e = device_arg(device, p);
    if (e != cudaSuccess)
        return emu_ret(e);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuemu emulated GPU %d on %s", emu_devices[device].phys, emu_hostname);
    memcpy(p->uuid.bytes, emu_devices[device].uuid, sizeof p->uuid.bytes);
    p->totalGlobalMem = emu_knobs.mem_bytes;
    int shared = 0;
    attr_value(cudaDevAttrMaxSharedMemoryPerBlock, device, &shared);
    p->sharedMemPerBlock = (size_t)shared;
    static const struct { enum cudaDeviceAttr attr; size_t off; } fields[] = {
        {cudaDevAttrWarpSize, offsetof(struct cudaDeviceProp, warpSize)},
        {cudaDevAttrMaxThreadsPerBlock, offsetof(struct cudaDeviceProp, maxThreadsPerBlock)},
        {cudaDevAttrMaxBlockDimX, offsetof(struct cudaDeviceProp, maxThreadsDim[0])},
        {cudaDevAttrMaxBlockDimY, offsetof(struct cudaDeviceProp, maxThreadsDim[1])},
        {cudaDevAttrMaxBlockDimZ, offsetof(struct cudaDeviceProp, maxThreadsDim[2])},
        {cudaDevAttrMaxGridDimX, offsetof(struct cudaDeviceProp, maxGridSize[0])},
        {cudaDevAttrMaxGridDimY, offsetof(struct cudaDeviceProp, maxGridSize[1])},
        {cudaDevAttrMaxGridDimZ, offsetof(struct cudaDeviceProp, maxGridSize[2])},
        {cudaDevAttrComputeCapabilityMajor, offsetof(struct cudaDeviceProp, major)},
        {cudaDevAttrComputeCapabilityMinor, offsetof(struct cudaDeviceProp, minor)},
        {cudaDevAttrMultiProcessorCount, offsetof(struct cudaDeviceProp, multiProcessorCount)},
        {cudaDevAttrCanMapHostMemory, offsetof(struct cudaDeviceProp, canMapHostMemory)},
        {cudaDevAttrConcurrentKernels, offsetof(struct cudaDeviceProp, concurrentKernels)},
        {cudaDevAttrPciBusId, offsetof(struct cudaDeviceProp, pciBusID)},
        {cudaDevAttrAsyncEngineCount, offsetof(struct cudaDeviceProp, asyncEngineCount)},
        {cudaDevAttrUnifiedAddressing, offsetof(struct cudaDeviceProp, unifiedAddressing)},
        {cudaDevAttrStreamPrioritiesSupported, offsetof(struct cudaDeviceProp, streamPrioritiesSupported)},
        {cudaDevAttrHostRegisterSupported, offsetof(struct cudaDeviceProp, hostRegisterSupported)},
    };
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        attr_value(fields[i].attr, device, (int *)((char *)p + fields[i].off));
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    EMU_ENTER("cudaDeviceGetAttribute");
    cudaError_t e = device_arg(device, value);
    if (e != cudaSuccess)
        return emu_ret(e);
    if (attr_value(attr, device, value) != 0) {
        /* A value made up here would steer the caller silently. */
        emu_flag(CUEMU_FLAG_UNSUPPORTED, "cudaDeviceGetAttribute", "attribute %d is not emulated", (int)attr);
        return emu_ret(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
