/*
 * The CUDA runtime's stream semantics, checked twice from this one source: test_cuemu against
 * the emulator (tests/cuda/emu, -DCUEMU_BUILD) and test_cuemu_real against libcudart on a GPU
 * machine (exit 77 without a device). The tests outside CUEMU_BUILD use the CUDA API alone and
 * hold on a real GPU; those inside it show that the emulator catches what a GPU punishes:
 *   - per-stream FIFO order; events as snapshots taken at record time, which a later record
 *     does not move under an already enqueued wait; the legacy default stream's implicit
 *     synchronisation with blocking streams and none with non-blocking ones;
 *   - a missing cudaStreamWaitEvent gives wrong data under CUEMU_DELAY_US, the right one with it;
 *   - flags: async copies with pageable memory, waits on never-recorded events, CUDA calls from
 *     host functions, memory freed while queued work uses it, other devices' memory and events,
 *     destroyed streams, bad and freed pointers; CUEMU_STRICT=1 turns a flag into an abort;
 *   - a host dereference of device memory dies with SIGSEGV; cudaPointerGetAttributes' types;
 *   - emulated kernels (cuemu_kernel_args, cuemu_device_view); several host threads at once.
 * Each test runs in a process of its own (Check's fork mode, whatever CK_FORK says), so knobs set
 * with setenv before the first CUDA call of a test apply to it alone; main asks for a device in a
 * child, since CUDA does not survive a fork.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/cuda/cuda_check.h"
#ifdef CUEMU_BUILD
#include "cuemu.h"
#endif

/* ---- helpers ---- */

/* How many flags the emulator must have raised in this test's process so far (none, for a
 * correct program); nothing to check against the real runtime. */
#ifdef CUEMU_BUILD
#define CK_FLAGS(n) ck_assert_uint_eq(cuemu_flag_count(), (n))
#else
#define CK_FLAGS(n) ((void)0)
#endif

/* A host function that blocks its stream until the test opens it. */
struct gate {
    pthread_mutex_t m;
    pthread_cond_t c;
    int open;
};
#define GATE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}

static void CUDART_CB gate_wait(void *p)
{
    struct gate *g = p;
    pthread_mutex_lock(&g->m);
    while (!g->open)
        pthread_cond_wait(&g->c, &g->m);
    pthread_mutex_unlock(&g->m);
}

static void gate_open(struct gate *g)
{
    pthread_mutex_lock(&g->m);
    g->open = 1;
    pthread_cond_broadcast(&g->c);
    pthread_mutex_unlock(&g->m);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Polls q (an event or stream query) until it stops saying cudaErrorNotReady, for up to 10 s. */
static cudaError_t poll_event(cudaEvent_t e)
{
    cudaError_t r = cudaErrorNotReady;
    for (int i = 0; i < 10000 && (r = cudaEventQuery(e)) == cudaErrorNotReady; i++)
        sleep_ms(1);
    return r;
}

/* Runs fn in a child process; returns its wait status. */
static int in_child(void (*fn)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

/* ---- both builds ---- */

START_TEST(test_device_basics)
{
    int n = 0, d = -1, v = 0, least = 1, greatest = 1;
    char bus[32] = "";
    struct cudaDeviceProp p;
    CK_CUDA(cudaGetDeviceCount(&n));
    ck_assert_int_ge(n, 1);
    CK_CUDA(cudaSetDevice(n - 1));
    CK_CUDA(cudaGetDevice(&d));
    ck_assert_int_eq(d, n - 1);
    CK_CUDA(cudaSetDevice(0));
    ck_assert_int_eq(cudaSetDevice(n), cudaErrorInvalidDevice);
    ck_assert_int_eq(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    ck_assert_int_eq(cudaGetLastError(), cudaErrorInvalidDevice);
    ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
    ck_assert_str_eq(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
    ck_assert_str_eq(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
    CK_CUDA(cudaRuntimeGetVersion(&v));
    ck_assert_int_ge(v, 11000);
    CK_CUDA(cudaDriverGetVersion(&v));
    ck_assert_int_ge(v, 11000);
    CK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
    ck_assert_msg(strchr(bus, ':') != NULL, "bus id %s", bus);
    CK_CUDA(cudaGetDeviceProperties(&p, 0));
    ck_assert_int_gt((int)strlen(p.name), 0);
    ck_assert_int_ge(p.major, 3);
    CK_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0));
    ck_assert_int_eq(v, p.major);
    CK_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrPciBusId, 0));
    ck_assert_int_eq(v, p.pciBusID);
    CK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    ck_assert_int_le(greatest, least);
    CK_CUDA(cudaDeviceSynchronize());
    CK_FLAGS(0);
}
END_TEST

struct order_log {
    int next;
    int seen[64];
};

struct order_step {
    struct order_log *log;
    int i;
};

static void CUDART_CB order_note(void *p)
{
    struct order_step *s = p;
    s->log->seen[s->log->next++] = s->i;
}

/* Work on one stream runs in issue order: memsets of one buffer, host functions, a copy chain. */
START_TEST(test_fifo_order)
{
    enum { N = 4096, STEPS = 64 };
    cudaStream_t s;
    unsigned char *d, *e, *h;
    struct order_log log = {0};
    struct order_step steps[STEPS];
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK_CUDA(cudaMalloc((void **)&d, N));
    CK_CUDA(cudaMalloc((void **)&e, N));
    CK_CUDA(cudaMallocHost((void **)&h, N));
    for (int i = 0; i < STEPS; i++) {
        steps[i] = (struct order_step){&log, i};
        CK_CUDA(cudaMemsetAsync(d, i + 1, N, s));
        CK_CUDA(cudaMemcpyAsync(e, d, N, cudaMemcpyDeviceToDevice, s));
        CK_CUDA(cudaLaunchHostFunc(s, order_note, &steps[i]));
    }
    CK_CUDA(cudaMemcpyAsync(h, e, N, cudaMemcpyDeviceToHost, s));
    CK_CUDA(cudaStreamSynchronize(s));
    ck_assert_int_eq(cudaStreamQuery(s), cudaSuccess);
    ck_assert_int_eq(log.next, STEPS);
    for (int i = 0; i < STEPS; i++)
        if (log.seen[i] != i)
            ck_abort_msg("host function %d ran as number %d", log.seen[i], i);
    for (int i = 0; i < N; i++)
        if (h[i] != STEPS)
            ck_abort_msg("byte %d is %d, the last memset wrote %d", i, h[i], STEPS);
    CK_CUDA(cudaFreeHost(h));
    CK_CUDA(cudaFree(e));
    CK_CUDA(cudaFree(d));
    CK_CUDA(cudaStreamDestroy(s));
    CK_FLAGS(0);
}
END_TEST

/* A record captures the stream's work at call time: a wait waits for that and nothing after;
 * an event is not ready before its capture is; a wait already enqueued keeps its capture when
 * the event is recorded again. */
START_TEST(test_event_snapshot)
{
    struct gate g1 = GATE_INIT, g2 = GATE_INIT, gb = GATE_INIT, ga = GATE_INIT;
    cudaStream_t a, b;
    cudaEvent_t e, eb;
    CK_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK_CUDA(cudaEventCreateWithFlags(&eb, cudaEventDisableTiming));

    CK_CUDA(cudaLaunchHostFunc(a, gate_wait, &g1));
    CK_CUDA(cudaEventRecord(e, a));
    CK_CUDA(cudaLaunchHostFunc(a, gate_wait, &g2));
    CK_CUDA(cudaStreamWaitEvent(b, e, 0));
    CK_CUDA(cudaEventRecord(eb, b));
    sleep_ms(20);
    ck_assert_int_eq(cudaEventQuery(e), cudaErrorNotReady);
    ck_assert_int_eq(cudaEventQuery(eb), cudaErrorNotReady);
    gate_open(&g1);
    ck_assert_int_eq(poll_event(eb), cudaSuccess); /* while g2 still holds a */
    ck_assert_int_eq(cudaEventQuery(e), cudaSuccess);
    ck_assert_int_eq(cudaStreamQuery(a), cudaErrorNotReady);
    gate_open(&g2);
    CK_CUDA(cudaStreamSynchronize(a));

    /* b, held by gb, is handed a wait on e as recorded now (a is idle); then e is recorded again
     * behind ga. Opening gb must complete b although ga holds a. */
    CK_CUDA(cudaEventRecord(e, a));
    CK_CUDA(cudaLaunchHostFunc(b, gate_wait, &gb));
    CK_CUDA(cudaStreamWaitEvent(b, e, 0));
    CK_CUDA(cudaEventRecord(eb, b));
    CK_CUDA(cudaLaunchHostFunc(a, gate_wait, &ga));
    CK_CUDA(cudaEventRecord(e, a));
    gate_open(&gb);
    ck_assert_int_eq(poll_event(eb), cudaSuccess);
    ck_assert_int_eq(cudaEventQuery(e), cudaErrorNotReady);
    gate_open(&ga);
    CK_CUDA(cudaEventSynchronize(e));
    CK_CUDA(cudaEventDestroy(e));
    CK_CUDA(cudaEventDestroy(eb));
    CK_CUDA(cudaStreamDestroy(a));
    CK_CUDA(cudaStreamDestroy(b));
    CK_FLAGS(0);
}
END_TEST

/* The legacy default stream waits for blocking streams and they for it; non-blocking streams
 * take no part. */
START_TEST(test_legacy_stream_sync)
{
    struct gate g = GATE_INIT, g0 = GATE_INIT;
    cudaStream_t blk, blk2, nb;
    cudaEvent_t e0, eb2, enb;
    CK_CUDA(cudaStreamCreate(&blk));
    CK_CUDA(cudaStreamCreate(&blk2));
    CK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    CK_CUDA(cudaEventCreateWithFlags(&e0, cudaEventDisableTiming));
    CK_CUDA(cudaEventCreateWithFlags(&eb2, cudaEventDisableTiming));
    CK_CUDA(cudaEventCreateWithFlags(&enb, cudaEventDisableTiming));

    CK_CUDA(cudaLaunchHostFunc(blk, gate_wait, &g));
    CK_CUDA(cudaEventRecord(e0, 0));     /* waits for blk */
    CK_CUDA(cudaEventRecord(eb2, blk2)); /* waits for the legacy stream's record */
    CK_CUDA(cudaEventRecord(enb, nb));   /* waits for nothing */
    ck_assert_int_eq(poll_event(enb), cudaSuccess);
    sleep_ms(20);
    ck_assert_int_eq(cudaEventQuery(e0), cudaErrorNotReady);
    ck_assert_int_eq(cudaEventQuery(eb2), cudaErrorNotReady);
    ck_assert_int_eq(cudaStreamQuery(0), cudaErrorNotReady);
    gate_open(&g);
    CK_CUDA(cudaEventSynchronize(eb2));
    CK_CUDA(cudaEventSynchronize(e0));

    /* The other way: work held on the legacy stream holds a blocking stream's later work. */
    CK_CUDA(cudaLaunchHostFunc(cudaStreamLegacy, gate_wait, &g0));
    CK_CUDA(cudaEventRecord(eb2, blk2));
    CK_CUDA(cudaEventRecord(enb, nb));
    ck_assert_int_eq(poll_event(enb), cudaSuccess);
    sleep_ms(20);
    ck_assert_int_eq(cudaEventQuery(eb2), cudaErrorNotReady);
    gate_open(&g0);
    CK_CUDA(cudaEventSynchronize(eb2));
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaEventDestroy(e0));
    CK_CUDA(cudaEventDestroy(eb2));
    CK_CUDA(cudaEventDestroy(enb));
    CK_CUDA(cudaStreamDestroy(blk));
    CK_CUDA(cudaStreamDestroy(blk2));
    CK_CUDA(cudaStreamDestroy(nb));
    CK_FLAGS(0);
}
END_TEST

/* Producer and consumer streams: the producer writes d in four copies, the consumer reads it
 * in one; with the consumer waiting on the producer's event the data arrive. Returns how many of
 * iters rounds read wrong data. */
static int produce_consume(int iters, int wait)
{
    enum { N = 1 << 14 };
    cudaStream_t prod, cons;
    cudaEvent_t e;
    int *d, *src, *dst, wrong = 0;
    CK_CUDA(cudaStreamCreateWithFlags(&prod, cudaStreamNonBlocking));
    CK_CUDA(cudaStreamCreateWithFlags(&cons, cudaStreamNonBlocking));
    CK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK_CUDA(cudaMalloc((void **)&d, N * sizeof *d));
    CK_CUDA(cudaMallocHost((void **)&src, N * sizeof *src));
    CK_CUDA(cudaMallocHost((void **)&dst, N * sizeof *dst));
    CK_CUDA(cudaMemset(d, 0, N * sizeof *d));
    CK_CUDA(cudaDeviceSynchronize());
    for (int it = 1; it <= iters; it++) {
        for (int i = 0; i < N; i++)
            src[i] = it * 100000 + i;
        for (int q = 0; q < 4; q++)
            CK_CUDA(cudaMemcpyAsync(d + q * (N / 4), src + q * (N / 4), N / 4 * sizeof *d, cudaMemcpyHostToDevice,
                                    prod));
        CK_CUDA(cudaEventRecord(e, prod));
        if (wait)
            CK_CUDA(cudaStreamWaitEvent(cons, e, 0));
        CK_CUDA(cudaMemcpyAsync(dst, d, N * sizeof *d, cudaMemcpyDeviceToHost, cons));
        CK_CUDA(cudaStreamSynchronize(cons));
        CK_CUDA(cudaStreamSynchronize(prod));
        int bad = 0;
        for (int i = 0; i < N; i++)
            bad |= dst[i] != it * 100000 + i;
        wrong += bad;
    }
    CK_CUDA(cudaFreeHost(dst));
    CK_CUDA(cudaFreeHost(src));
    CK_CUDA(cudaFree(d));
    CK_CUDA(cudaEventDestroy(e));
    CK_CUDA(cudaStreamDestroy(prod));
    CK_CUDA(cudaStreamDestroy(cons));
    return wrong;
}

START_TEST(test_wait_orders_streams)
{
#ifdef CUEMU_BUILD
    setenv("CUEMU_DELAY_US", "2000", 1);
#endif
    ck_assert_int_eq(produce_consume(20, 1), 0);
    CK_FLAGS(0);
}
END_TEST

START_TEST(test_unrecorded_event_succeeds)
{
    cudaStream_t s;
    cudaEvent_t e;
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaEventCreate(&e));
#ifdef CUEMU_BUILD
    unsigned long before = cuemu_flag_count_of(CUEMU_FLAG_UNRECORDED_EVENT);
#endif
    CK_CUDA(cudaStreamWaitEvent(s, e, 0));
    CK_CUDA(cudaEventQuery(e));
    CK_CUDA(cudaEventSynchronize(e));
    CK_CUDA(cudaStreamSynchronize(s));
#ifdef CUEMU_BUILD
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_UNRECORDED_EVENT), before + 3);
#endif
    CK_CUDA(cudaEventDestroy(e));
    CK_CUDA(cudaStreamDestroy(s));
    CK_FLAGS(3);
}
END_TEST

static int *g_device_int;

/* The child makes no CUDA call (CUDA does not survive a fork); it only touches the memory. */
static void deref_device_memory(void)
{
    *(volatile int *)g_device_int = 1; /* host code writing device memory */
}

START_TEST(test_host_deref_faults)
{
    CK_CUDA(cudaMalloc((void **)&g_device_int, 4096));
    int st = in_child(deref_device_memory);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "the child ended with status %#x, not SIGSEGV", st);
    CK_CUDA(cudaFree(g_device_int));
}
END_TEST

START_TEST(test_pointer_attributes)
{
    struct cudaPointerAttributes a;
    void *dev, *pinned, *mapped;
    size_t n = 1 << 16;
    char *plain = malloc(n), *reg = malloc(n);
    ck_assert_ptr_nonnull(plain);
    ck_assert_ptr_nonnull(reg);
    CK_CUDA(cudaMalloc(&dev, n));
    CK_CUDA(cudaMallocHost(&pinned, n));
    CK_CUDA(cudaHostAlloc(&mapped, n, cudaHostAllocMapped));
    CK_CUDA(cudaHostRegister(reg, n, cudaHostRegisterDefault));

    CK_CUDA(cudaPointerGetAttributes(&a, dev));
    ck_assert_int_eq(a.type, cudaMemoryTypeDevice);
    ck_assert_int_eq(a.device, 0);
    ck_assert_ptr_eq(a.devicePointer, dev);
    CK_CUDA(cudaPointerGetAttributes(&a, (char *)dev + 100));
    ck_assert_int_eq(a.type, cudaMemoryTypeDevice);
    CK_CUDA(cudaPointerGetAttributes(&a, pinned));
    ck_assert_int_eq(a.type, cudaMemoryTypeHost);
    ck_assert_ptr_eq(a.hostPointer, pinned);
    CK_CUDA(cudaPointerGetAttributes(&a, mapped));
    ck_assert_int_eq(a.type, cudaMemoryTypeHost);
    CK_CUDA(cudaPointerGetAttributes(&a, reg + 10));
    ck_assert_int_eq(a.type, cudaMemoryTypeHost);
    CK_CUDA(cudaPointerGetAttributes(&a, plain));
    ck_assert_int_eq(a.type, cudaMemoryTypeUnregistered);
    CK_CUDA(cudaHostUnregister(reg));
    CK_CUDA(cudaPointerGetAttributes(&a, reg));
    ck_assert_int_eq(a.type, cudaMemoryTypeUnregistered);
    ck_assert_int_eq(cudaHostUnregister(reg), cudaErrorHostMemoryNotRegistered);
    (void)cudaGetLastError();

    CK_CUDA(cudaFreeHost(mapped));
    CK_CUDA(cudaFreeHost(pinned));
    CK_CUDA(cudaFree(dev));
    free(reg);
    free(plain);
    CK_FLAGS(1);
}
END_TEST

/* The legacy synchronous forms: cudaMemcpy to the host returns with the data there, after the
 * earlier work of blocking streams. */
START_TEST(test_sync_copies)
{
    enum { N = 1 << 12 };
    cudaStream_t s;
    int *d, h[N], back[N];
    for (int i = 0; i < N; i++)
        h[i] = 7 * i - 3;
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaMalloc((void **)&d, sizeof h));
    CK_CUDA(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice)); /* pageable source: staged */
    memset(h, 0, sizeof h);                                    /* the copy must not see this */
    CK_CUDA(cudaMemsetAsync(d, 0, sizeof(int), s));             /* blocking stream, before */
    CK_CUDA(cudaMemcpy(back, d, sizeof back, cudaMemcpyDefault));
    ck_assert_int_eq(back[0], 0);
    for (int i = 1; i < N; i++)
        if (back[i] != 7 * i - 3)
            ck_abort_msg("element %d is %d, %d expected", i, back[i], 7 * i - 3);
    CK_CUDA(cudaMemset(d, 0xff, sizeof(int)));
    CK_CUDA(cudaMemcpy(back, d, sizeof(int), cudaMemcpyDeviceToHost));
    ck_assert_int_eq(back[0], -1);
    CK_CUDA(cudaFree(d));
    CK_CUDA(cudaStreamDestroy(s));
    CK_FLAGS(0);
}
END_TEST

START_TEST(test_per_thread_stream)
{
    int *d, *h;
    CK_CUDA(cudaMalloc((void **)&d, sizeof *h));
    CK_CUDA(cudaMallocHost((void **)&h, sizeof *h));
    CK_CUDA(cudaMemsetAsync(d, 0x01, sizeof *h, cudaStreamPerThread));
    CK_CUDA(cudaMemcpyAsync(h, d, sizeof *h, cudaMemcpyDeviceToHost, cudaStreamPerThread));
    CK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
    ck_assert_int_eq(*h, 0x01010101);
    CK_CUDA(cudaFreeHost(h));
    CK_CUDA(cudaFree(d));
    CK_FLAGS(0);
}
END_TEST

START_TEST(test_event_timing)
{
    cudaStream_t s;
    cudaEvent_t a, b, nt;
    float ms = -1;
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaEventCreate(&a));
    CK_CUDA(cudaEventCreate(&b));
    CK_CUDA(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
    CK_CUDA(cudaEventRecord(a, s));
    CK_CUDA(cudaEventRecord(b, s));
    CK_CUDA(cudaEventRecord(nt, s));
    CK_CUDA(cudaEventSynchronize(b));
    CK_CUDA(cudaEventElapsedTime(&ms, a, b));
    ck_assert_float_ge(ms, 0);
    ck_assert_int_eq(cudaEventElapsedTime(&ms, a, nt), cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    CK_CUDA(cudaEventDestroy(a));
    CK_CUDA(cudaEventDestroy(b));
    CK_CUDA(cudaEventDestroy(nt));
    CK_CUDA(cudaStreamDestroy(s));
    CK_FLAGS(0);
}
END_TEST

struct worker_arg {
    int id;
    int errors;
};

static void *thread_copies(void *p)
{
    enum { N = 1 << 12, ROUNDS = 40 };
    struct worker_arg *w = p;
    cudaStream_t s;
    int *d, *h;
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&d, N * sizeof *d) != cudaSuccess ||
        cudaMallocHost((void **)&h, N * sizeof *h) != cudaSuccess) {
        w->errors++;
        return NULL;
    }
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < N; i++)
            h[i] = w->id * 1000000 + r * 1000 + i;
        w->errors += cudaMemcpyAsync(d, h, N * sizeof *d, cudaMemcpyHostToDevice, s) != cudaSuccess;
        w->errors += cudaMemsetAsync(h, 0, N * sizeof *h, s) != cudaSuccess;
        w->errors += cudaMemcpyAsync(h, d, N * sizeof *d, cudaMemcpyDeviceToHost, s) != cudaSuccess;
        w->errors += cudaStreamSynchronize(s) != cudaSuccess;
        for (int i = 0; i < N; i++)
            w->errors += h[i] != w->id * 1000000 + r * 1000 + i;
        (void)cudaStreamQuery(0);
    }
    w->errors += cudaFreeHost(h) != cudaSuccess;
    w->errors += cudaFree(d) != cudaSuccess;
    w->errors += cudaStreamDestroy(s) != cudaSuccess;
    return NULL;
}

/* The runtime is thread-safe: threads with streams of their own, at once. */
START_TEST(test_threads)
{
    enum { T = 3 };
    pthread_t t[T];
    struct worker_arg w[T];
    for (int i = 0; i < T; i++) {
        w[i] = (struct worker_arg){i + 1, 0};
        ck_assert_int_eq(pthread_create(&t[i], NULL, thread_copies, &w[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(t[i], NULL);
        ck_assert_int_eq(w[i].errors, 0);
    }
    CK_FLAGS(0);
}
END_TEST

/* ---- the emulator alone ---- */

#ifdef CUEMU_BUILD

START_TEST(test_missing_wait_is_caught)
{
    setenv("CUEMU_DELAY_US", "2000", 1);
    setenv("CUEMU_SEED", "7", 1);
    int wrong = produce_consume(20, 0);
    ck_assert_msg(wrong > 0, "without the wait, every one of 20 rounds still read the right data");
    ck_assert_int_eq(produce_consume(20, 1), 0);
}
END_TEST

static void visible_2_0(void)
{
    int n = 0;
    char b0[32], b1[32];
    setenv("CUEMU_DEVICES", "3", 1);
    setenv("CUDA_VISIBLE_DEVICES", "2,0", 1);
    if (cudaGetDeviceCount(&n) != cudaSuccess || n != 2)
        _exit(10 + n);
    cudaDeviceGetPCIBusId(b0, sizeof b0, 0);
    cudaDeviceGetPCIBusId(b1, sizeof b1, 1);
    if (strcmp(b0, b1) == 0 || strcmp(b0, "0000:38:00.0") != 0 || strcmp(b1, "0000:18:00.0") != 0)
        _exit(20);
    _exit(0);
}

static void visible_stops_at_bad_entry(void)
{
    int n = 0;
    setenv("CUEMU_DEVICES", "3", 1);
    setenv("CUDA_VISIBLE_DEVICES", "1,7,0", 1);
    _exit(cudaGetDeviceCount(&n) == cudaSuccess && n == 1 ? 0 : 10 + n);
}

static void visible_none(void)
{
    int n = 5;
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    _exit(cudaGetDeviceCount(&n) == cudaErrorNoDevice && n == 0 ? 0 : 1);
}

START_TEST(test_visible_devices)
{
    ck_assert_int_eq(in_child(visible_2_0), 0);
    ck_assert_int_eq(in_child(visible_stops_at_bad_entry), 0);
    ck_assert_int_eq(in_child(visible_none), 0);
}
END_TEST

START_TEST(test_pageable_async_flagged)
{
    enum { N = 1 << 12 };
    cudaStream_t s;
    char *d, *pinned, *plain = malloc(N), *reg = malloc(N);
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaMalloc((void **)&d, N));
    CK_CUDA(cudaMallocHost((void **)&pinned, N));
    CK_CUDA(cudaHostRegister(reg, N, 0));
    memset(plain, 1, N);
    unsigned long before = cuemu_flag_count_of(CUEMU_FLAG_PAGEABLE);
    CK_CUDA(cudaMemcpyAsync(d, pinned, N, cudaMemcpyHostToDevice, s));
    CK_CUDA(cudaMemcpyAsync(d, reg, N, cudaMemcpyHostToDevice, s));
    CK_CUDA(cudaMemcpy(d, plain, N, cudaMemcpyHostToDevice)); /* synchronous: fine */
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_PAGEABLE), before);
    CK_CUDA(cudaMemcpyAsync(d, plain, N, cudaMemcpyHostToDevice, s));
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_PAGEABLE), before + 1);
    CK_CUDA(cudaMemcpyAsync(plain, d, N, cudaMemcpyDefault, s));
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_PAGEABLE), before + 2);
    ck_assert_int_eq(cudaMemcpyAsync(pinned, d, N + 1, cudaMemcpyDeviceToHost, s), cudaErrorInvalidValue);
    (void)cudaGetLastError(); /* past the end of d */
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaHostUnregister(reg));
    CK_CUDA(cudaFreeHost(pinned));
    CK_CUDA(cudaFree(d));
    CK_CUDA(cudaStreamDestroy(s));
    free(reg);
    free(plain);
}
END_TEST

static void strict_child(void)
{
    char *d, plain[64];
    setenv("CUEMU_STRICT", "1", 1);
    if (cudaMalloc((void **)&d, sizeof plain) != cudaSuccess)
        _exit(3);
    cudaMemcpyAsync(d, plain, sizeof plain, cudaMemcpyHostToDevice, 0);
    _exit(0);
}

START_TEST(test_strict_aborts)
{
    int st = in_child(strict_child);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "status %#x, SIGABRT expected", st);
}
END_TEST

static void CUDART_CB calls_cuda(void *p)
{
    void *d = NULL;
    *(cudaError_t *)p = cudaMalloc(&d, 16);
}

START_TEST(test_callback_api_flagged)
{
    cudaError_t got = cudaSuccess;
    unsigned long before = cuemu_flag_count_of(CUEMU_FLAG_CALLBACK_API);
    CK_CUDA(cudaLaunchHostFunc(0, calls_cuda, &got));
    CK_CUDA(cudaDeviceSynchronize());
    ck_assert_int_eq(got, cudaErrorNotPermitted);
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_CALLBACK_API), before + 1);
}
END_TEST

static void *open_later(void *p)
{
    sleep_ms(50);
    gate_open(p);
    return NULL;
}

/* cudaFree waits for the device, as on a GPU, but memory that queued work still uses is
 * flagged; a freed pointer is then refused by name. */
START_TEST(test_free_in_use_flagged)
{
    struct gate g = GATE_INIT;
    cudaStream_t s;
    pthread_t t;
    char *d, *h, *d2;
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaMalloc((void **)&d, 4096));
    CK_CUDA(cudaMalloc((void **)&d2, 4096));
    CK_CUDA(cudaMallocHost((void **)&h, 4096));
    CK_CUDA(cudaLaunchHostFunc(s, gate_wait, &g));
    CK_CUDA(cudaMemcpyAsync(d, h, 4096, cudaMemcpyHostToDevice, s));
    unsigned long before = cuemu_flag_count_of(CUEMU_FLAG_FREE_IN_USE);
    ck_assert_int_eq(pthread_create(&t, NULL, open_later, &g), 0);
    CK_CUDA(cudaFree(d));
    pthread_join(t, NULL);
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_FREE_IN_USE), before + 1);
    ck_assert_int_eq(cudaStreamQuery(s), cudaSuccess);

    unsigned long bad = cuemu_flag_count_of(CUEMU_FLAG_BAD_POINTER);
    ck_assert_int_eq(cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    ck_assert_int_eq(cudaFree(d), cudaErrorInvalidValue);
    ck_assert_int_eq(cudaMemset(d2 + 4000, 0, 200), cudaErrorInvalidValue);
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_BAD_POINTER), bad + 3);
    (void)cudaGetLastError();
    CK_CUDA(cudaFree(d2));
    CK_CUDA(cudaFreeHost(h));
    CK_CUDA(cudaStreamDestroy(s));
}
END_TEST

START_TEST(test_other_device_flagged)
{
    setenv("CUEMU_DEVICES", "2", 1);
    cudaStream_t s0;
    cudaEvent_t e1;
    char *d1, *h;
    CK_CUDA(cudaSetDevice(1));
    CK_CUDA(cudaMalloc((void **)&d1, 4096));
    CK_CUDA(cudaEventCreate(&e1));
    CK_CUDA(cudaSetDevice(0));
    CK_CUDA(cudaStreamCreate(&s0));
    CK_CUDA(cudaMallocHost((void **)&h, 4096));
    unsigned long before = cuemu_flag_count_of(CUEMU_FLAG_OTHER_DEVICE);
    CK_CUDA(cudaMemcpyAsync(d1, h, 4096, cudaMemcpyHostToDevice, s0));
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_OTHER_DEVICE), before + 1);
    ck_assert_int_eq(cudaEventRecord(e1, s0), cudaErrorInvalidResourceHandle);
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_OTHER_DEVICE), before + 2);
    (void)cudaGetLastError();
    struct cudaPointerAttributes a;
    CK_CUDA(cudaPointerGetAttributes(&a, d1));
    ck_assert_int_eq(a.device, 1);
    CK_CUDA(cudaStreamSynchronize(s0));
    CK_CUDA(cudaFree(d1));
    CK_CUDA(cudaFreeHost(h));
    CK_CUDA(cudaEventDestroy(e1));
    CK_CUDA(cudaStreamDestroy(s0));
}
END_TEST

START_TEST(test_destroyed_stream_refused)
{
    cudaStream_t s;
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaStreamDestroy(s));
    unsigned long before = cuemu_flag_count_of(CUEMU_FLAG_BAD_HANDLE);
    ck_assert_int_eq(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_BAD_HANDLE), before + 1);
    (void)cudaGetLastError();
}
END_TEST

struct axpy_args {
    float *y;
    const float *x;
    float a;
    size_t n;
};

/* y = a x + y: the emulated stand-in for a __global__ kernel. */
static void axpy_kernel(void *p)
{
    struct axpy_args *k = p;
    float *y = cuemu_device_view(k->y);
    const float *x = cuemu_device_view(k->x);
    for (size_t i = 0; i < k->n; i++)
        y[i] = k->a * x[i] + y[i];
}

START_TEST(test_emulated_kernel)
{
    enum { N = 1000 };
    cudaStream_t s;
    float *x, *y, *h;
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaMalloc((void **)&x, N * sizeof *h));
    CK_CUDA(cudaMalloc((void **)&y, N * sizeof *h));
    CK_CUDA(cudaMallocHost((void **)&h, N * sizeof *h));
    for (int i = 0; i < N; i++)
        h[i] = (float)i;
    CK_CUDA(cudaMemcpyAsync(x, h, N * sizeof *h, cudaMemcpyDefault, s));
    CK_CUDA(cudaMemsetAsync(y, 0, N * sizeof *h, s));
    struct gate g = GATE_INIT;
    struct axpy_args args = {y, x, 2.0f, N};
    CK_CUDA(cudaLaunchHostFunc(s, gate_wait, &g));
    CK_CUDA(cuemu_kernel_args(s, axpy_kernel, &args, sizeof args));
    args.a = 100.0f; /* the launch copied the arguments: the kernel, held by g, must not see this */
    gate_open(&g);
    CK_CUDA(cudaMemcpyAsync(h, y, N * sizeof *h, cudaMemcpyDefault, s));
    CK_CUDA(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++)
        if (h[i] != 2.0f * (float)i)
            ck_abort_msg("y[%d] = %g, %g expected", i, h[i], 2.0f * (float)i);
    CK_FLAGS(0);
    ck_assert_ptr_null(cuemu_device_view(x)); /* not inside a kernel */
    CK_FLAGS(1);
    CK_CUDA(cudaFreeHost(h));
    CK_CUDA(cudaFree(x));
    CK_CUDA(cudaFree(y));
    CK_CUDA(cudaStreamDestroy(s));
}
END_TEST

START_TEST(test_fresh_memory_is_not_zero)
{
    float *d, h[4];
    CK_CUDA(cudaMalloc((void **)&d, sizeof h));
    CK_CUDA(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4; i++)
        ck_assert_msg(h[i] != h[i], "uninitialised device memory reads as %g, NaN expected", h[i]);
    CK_CUDA(cudaFree(d));
}
END_TEST

#endif /* CUEMU_BUILD */

#ifndef CUEMU_BUILD
/* Asked in a child: CUDA initialised here would not survive Check's fork into each test. */
static void probe_device(void)
{
    int n = 0;
    _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
}
#endif

int main(void)
{
#ifndef CUEMU_BUILD
    if (in_child(probe_device) != 0)
        return 77; /* no GPU here: the emulated build covers these tests */
#endif
    Suite *s = suite_create("cuemu");
    TCase *tc = tcase_create("cuda");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_device_basics);
    tcase_add_test(tc, test_fifo_order);
    tcase_add_test(tc, test_event_snapshot);
    tcase_add_test(tc, test_legacy_stream_sync);
    tcase_add_test(tc, test_wait_orders_streams);
    tcase_add_test(tc, test_unrecorded_event_succeeds);
    tcase_add_test(tc, test_host_deref_faults);
    tcase_add_test(tc, test_pointer_attributes);
    tcase_add_test(tc, test_sync_copies);
    tcase_add_test(tc, test_per_thread_stream);
    tcase_add_test(tc, test_event_timing);
    tcase_add_test(tc, test_threads);
#ifdef CUEMU_BUILD
    tcase_add_test(tc, test_missing_wait_is_caught);
    tcase_add_test(tc, test_visible_devices);
    tcase_add_test(tc, test_pageable_async_flagged);
    tcase_add_test(tc, test_strict_aborts);
    tcase_add_test(tc, test_callback_api_flagged);
    tcase_add_test(tc, test_free_in_use_flagged);
    tcase_add_test(tc, test_other_device_flagged);
    tcase_add_test(tc, test_destroyed_stream_refused);
    tcase_add_test(tc, test_emulated_kernel);
    tcase_add_test(tc, test_fresh_memory_is_not_zero);
#endif
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    /* Every test needs a process of its own: the emulator reads its knobs at a process's first
     * CUDA call, and a test that breaks CUDA's state must not break the next. */
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
