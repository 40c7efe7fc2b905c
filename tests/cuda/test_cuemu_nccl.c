/*
 * NCCL's collectives under mpirun (Check, CK_FORK=no), checked twice from this one source:
 * test_cuemu_nccl against the emulator (tests/cuda/emu, -DCUEMU_BUILD, CUEMU_DEVICES set by the
 * .mpi file) and test_cuemu_nccl_real against libnccl on a GPU machine (exit 77 without a
 * device; with fewer GPUs than ranks only the refusal of two ranks on one GPU: real NCCL 2.28
 * hung in its first collective when the ranks were told apart by NCCL_HOSTID on one GPU, so
 * the emulator alone gives each rank a host id of its own). MPI only carries the unique id, as in real programs, and Check's verdict.
 * Every rank fills its inputs from a formula of (rank, index) with small integers, so any rank
 * computes the expected result of any collective on the host, in double.
 *   - all-reduce, reduce-scatter, all-gather, broadcast: float32, float16, bfloat16 (float64 and
 *     int32 for all-reduce), sum and avg, in place and out of place, counts that cross the
 *     emulator's staging chunk;
 *   - groups of collectives on one stream and across two streams; a non-blocking communicator;
 *   - two ranks on one GPU are refused (ncclInvalidUsage, "Duplicate GPU detected");
 *   - ncclCommAbort releases a stream blocked in a collective that peers never join;
 *   - emulator alone: ranks that issue different collectives fail on every rank, naming both;
 *     an injected failure (CUEMU_NCCL_FAIL_RANK/AFTER) reaches every rank's
 *     ncclCommGetAsyncError as ncclRemoteError and fails the stream, so later work never runs;
 *     a collective the other ranks skip times out (CUEMU_NCCL_TIMEOUT_S) on every rank;
 *     CUEMU_NCCL=broken; nothing is left in /dev/shm.
 */
#include <check.h>
#include <dirent.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h: ncclGroupStart() */
#include <nccl.h>
#pragma GCC diagnostic pop

#include "include/dear.h" /* suite_run.h's check_transport names dear_ctx_t; nothing of libdear is linked */
#include "tests/cuda/cuda_check.h"
#include "tests/mpi/suite_run.h"
#ifdef CUEMU_BUILD
#include "cuemu.h"
#endif

static int g_rank, g_size, g_ndev;

/* A correct program raises no flag: the tests of both builds end with CK_NO_FLAGS(). */
#ifdef CUEMU_BUILD
static unsigned long g_flags0;
static void flags_mark(void)
{
    g_flags0 = cuemu_flag_count();
}
#define CK_NO_FLAGS() ck_assert_uint_eq(cuemu_flag_count(), g_flags0)
#else
static void flags_mark(void)
{
}
#define CK_NO_FLAGS() ((void)0)
#endif

#define CK_NCCL(call)                                                                                \
    do {                                                                                             \
        ncclResult_t ck_r_ = (call);                                                                 \
        ck_assert_msg(ck_r_ == ncclSuccess, "%s: %s (%s)", #call, ncclGetErrorString(ck_r_),        \
                      ncclGetLastError(NULL));                                                       \
    } while (0)

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Each rank on its own GPU when there are enough; else on GPU rank % n with a host id of its
 * own, which NCCL accepts (it then talks over sockets). */
static void pick_device(void)
{
    CK_CUDA(cudaSetDevice(g_rank % g_ndev));
    if (g_ndev < g_size) {
        char id[32];
        snprintf(id, sizeof id, "cuemu-test-rank-%d", g_rank);
        setenv("NCCL_HOSTID", id, 1);
    }
}

static ncclUniqueId shared_id(void)
{
    ncclUniqueId id;
    if (g_rank == 0)
        CK_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    return id;
}

static ncclComm_t comm_new(void)
{
    ncclComm_t c;
    pick_device();
    ncclUniqueId id = shared_id();
    CK_NCCL(ncclCommInitRank(&c, g_size, id, g_rank));
    return c;
}

/* Rank r's input element i: a small integer, exact in every type and in every sum of them. */
static int input(int r, size_t i)
{
    return (int)((r * 7 + i * 3) % 23) - 11;
}

static size_t type_size(ncclDataType_t t)
{
    return t == ncclFloat16 || t == ncclBfloat16 ? 2 : t == ncclFloat64 ? 8 : 4;
}

static void put(ncclDataType_t t, void *p, size_t i, int v)
{
    switch (t) {
    case ncclFloat16: ((uint16_t *)p)[i] = test_half_of_int(v); break;
    case ncclBfloat16: ((uint16_t *)p)[i] = test_bf16_of_int(v); break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    case ncclInt32: ((int32_t *)p)[i] = v; break;
    default: ((float *)p)[i] = (float)v; break;
    }
}

static double get(ncclDataType_t t, const void *p, size_t i)
{
    switch (t) {
    case ncclFloat16: return test_half_value(((const uint16_t *)p)[i]);
    case ncclBfloat16: return test_bf16_value(((const uint16_t *)p)[i]);
    case ncclFloat64: return ((const double *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    default: return ((const float *)p)[i];
    }
}

/* The reduction of every rank's element i; avg rounds toward zero for integers, as NCCL. */
static double reduced(ncclDataType_t t, ncclRedOp_t op, size_t i)
{
    long sum = 0;
    for (int r = 0; r < g_size; r++)
        sum += input(r, i);
    if (op != ncclAvg)
        return (double)sum;
    return t == ncclInt32 ? (double)(sum / g_size) : (double)sum / g_size;
}

static double tolerance(ncclDataType_t t, double want)
{
    double rel = t == ncclBfloat16 ? 1.0 / 32
                 : t == ncclFloat16 ? 1.0 / 256
                 : t == ncclFloat32 ? 1e-6
                 : t == ncclFloat64 ? 1e-12
                                    : 0;
    return rel * (1 + (want < 0 ? -want : want));
}

/* Asserts only on a wrong value: Check logs every assertion that passes, and there are millions. */
static void check_value(ncclDataType_t t, const void *p, size_t at, double want, const char *what, size_t i)
{
    double got = get(t, p, at);
    double d = got - want;
    if ((d < 0 ? -d : d) > tolerance(t, want))
        ck_abort_msg("rank %d: %s type %d element %zu: %g, %g expected", g_rank, what, (int)t, i, got, want);
}

enum { ALLREDUCE, REDUCESCATTER, ALLGATHER, BROADCAST };

/* One collective of count elements per rank (in place or not) on a fresh buffer pair,
 * compared element by element with the host's result. */
static void run_one(ncclComm_t c, cudaStream_t s, int kind, ncclDataType_t t, ncclRedOp_t op, size_t count,
                    int inplace)
{
    size_t es = type_size(t), n = (size_t)g_size;
    size_t in_n = kind == REDUCESCATTER ? count * n : count, out_n = kind == ALLGATHER ? count * n : count;
    size_t big = (in_n > out_n ? in_n : out_n) * es;
    char *h, *dsend, *drecv;
    int root = g_size - 1;
    CK_CUDA(cudaMallocHost((void **)&h, big));
    CK_CUDA(cudaMalloc((void **)&drecv, big));
    /* In place: the input sits where NCCL's layout wants it inside the output buffer. */
    size_t off = !inplace ? 0 : kind == ALLGATHER ? (size_t)g_rank * count * es : 0;
    if (inplace)
        dsend = drecv + off;
    else
        CK_CUDA(cudaMalloc((void **)&dsend, in_n * es));
    for (size_t i = 0; i < in_n; i++)
        put(t, h, i, kind == BROADCAST && g_rank != root ? 99 : input(g_rank, i));
    CK_CUDA(cudaMemcpyAsync(dsend, h, in_n * es, cudaMemcpyHostToDevice, s));
    if (!inplace)
        CK_CUDA(cudaMemsetAsync(drecv, 0, big, s));
    void *recv = kind == REDUCESCATTER && inplace ? dsend + (size_t)g_rank * count * es : drecv;
    switch (kind) {
    case ALLREDUCE: CK_NCCL(ncclAllReduce(dsend, recv, count, t, op, c, s)); break;
    case REDUCESCATTER: CK_NCCL(ncclReduceScatter(dsend, recv, count, t, op, c, s)); break;
    case ALLGATHER: CK_NCCL(ncclAllGather(dsend, recv, count, t, c, s)); break;
    default: CK_NCCL(ncclBroadcast(dsend, recv, count, t, root, c, s)); break;
    }
    CK_CUDA(cudaMemcpyAsync(h, recv, out_n * es, cudaMemcpyDeviceToHost, s));
    CK_CUDA(cudaStreamSynchronize(s));
    for (size_t i = 0; i < out_n; i++) {
        double want = kind == ALLREDUCE       ? reduced(t, op, i)
                      : kind == REDUCESCATTER ? reduced(t, op, (size_t)g_rank * count + i)
                      : kind == ALLGATHER     ? input((int)(i / count), i % count)
                                              : input(root, i);
        check_value(t, h, i, want, kind == ALLREDUCE ? "all-reduce" : kind == REDUCESCATTER ? "reduce-scatter"
                                   : kind == ALLGATHER ? "all-gather" : "broadcast", i);
    }
    if (!inplace)
        CK_CUDA(cudaFree(dsend));
    CK_CUDA(cudaFree(drecv));
    CK_CUDA(cudaFreeHost(h));
}

/* Counts: one element, an odd count, and one past the emulator's 1 MiB staging chunk. */
static const size_t counts[] = {1, 1001, (1 << 18) + 5};
static const ncclDataType_t types[] = {ncclFloat32, ncclFloat16, ncclBfloat16};

static void sweep(int kind, int with_ops)
{
    ncclComm_t c = comm_new();
    cudaStream_t s;
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (int op = 0; op < (with_ops ? 2 : 1); op++)
            for (int inplace = 0; inplace < 2; inplace++)
                for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
                    /* The large count once per type is enough. */
                    if (ci == 2 && (op || inplace))
                        continue;
                    run_one(c, s, kind, types[ti], op ? ncclAvg : ncclSum, counts[ci], inplace);
                }
    CK_CUDA(cudaStreamDestroy(s));
    CK_NCCL(ncclCommDestroy(c));
}

START_TEST(test_comm_queries)
{
    ncclComm_t c = comm_new();
    int n = -1, r = -1, d = -1, v = 0, cur = -1;
    CK_NCCL(ncclCommCount(c, &n));
    CK_NCCL(ncclCommUserRank(c, &r));
    CK_NCCL(ncclCommCuDevice(c, &d));
    CK_NCCL(ncclGetVersion(&v));
    CK_CUDA(cudaGetDevice(&cur));
    ck_assert_int_eq(n, g_size);
    ck_assert_int_eq(r, g_rank);
    ck_assert_int_eq(d, cur);
    ck_assert_int_ge(v, 21003); /* ncclAvg and bfloat16 */
    ncclResult_t e = ncclInternalError;
    CK_NCCL(ncclCommGetAsyncError(c, &e));
    ck_assert_int_eq(e, ncclSuccess);
    ck_assert_str_eq(ncclGetErrorString(ncclRemoteError), "remote process exited or there was a network error");
    CK_NCCL(ncclCommDestroy(c));
    CK_NO_FLAGS();
}
END_TEST

START_TEST(test_allreduce)
{
    sweep(ALLREDUCE, 1);
    ncclComm_t c = comm_new();
    cudaStream_t s;
    CK_CUDA(cudaStreamCreate(&s));
    run_one(c, s, ALLREDUCE, ncclFloat64, ncclAvg, 1001, 0);
    run_one(c, s, ALLREDUCE, ncclInt32, ncclSum, 1001, 1);
    run_one(c, s, ALLREDUCE, ncclInt32, ncclAvg, 1001, 0);
    run_one(c, 0, ALLREDUCE, ncclFloat32, ncclSum, 1001, 0); /* the legacy default stream */
    CK_CUDA(cudaStreamDestroy(s));
    CK_NCCL(ncclCommDestroy(c));
    CK_NO_FLAGS();
}
END_TEST

START_TEST(test_reduce_scatter)
{
    sweep(REDUCESCATTER, 1);
    CK_NO_FLAGS();
}
END_TEST

START_TEST(test_all_gather)
{
    sweep(ALLGATHER, 0);
    CK_NO_FLAGS();
}
END_TEST

START_TEST(test_broadcast)
{
    sweep(BROADCAST, 0);
    CK_NO_FLAGS();
}
END_TEST

/* Three collectives in a group on one stream, then two in a group across two streams: the
 * streams' later work sees every result. */
START_TEST(test_group)
{
    enum { N = 999 };
    ncclComm_t c = comm_new();
    cudaStream_t s1, s2;
    float *a, *b, *g, *h;
    size_t n = (size_t)g_size;
    CK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CK_CUDA(cudaMalloc((void **)&a, N * n * sizeof *a));
    CK_CUDA(cudaMalloc((void **)&b, N * n * sizeof *b));
    CK_CUDA(cudaMalloc((void **)&g, N * n * sizeof *g));
    CK_CUDA(cudaMallocHost((void **)&h, N * (n + 1) * sizeof *h)); /* room for two results below */
    for (size_t i = 0; i < N * n; i++)
        h[i] = (float)input(g_rank, i);
    CK_CUDA(cudaMemcpyAsync(a, h, N * n * sizeof *h, cudaMemcpyHostToDevice, s1));
    CK_CUDA(cudaMemcpyAsync(b, h, N * n * sizeof *h, cudaMemcpyHostToDevice, s1));
    CK_CUDA(cudaMemcpyAsync(g + (size_t)g_rank * N, h, N * sizeof *h, cudaMemcpyHostToDevice, s1));
    CK_NCCL(ncclGroupStart());
    CK_NCCL(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, c, s1));
    CK_NCCL(ncclReduceScatter(b, b + (size_t)g_rank * N, N, ncclFloat32, ncclSum, c, s1));
    CK_NCCL(ncclAllGather(g + (size_t)g_rank * N, g, N, ncclFloat32, c, s1));
    CK_NCCL(ncclGroupEnd());
    CK_CUDA(cudaMemcpyAsync(h, a, N * sizeof *h, cudaMemcpyDeviceToHost, s1));
    CK_CUDA(cudaStreamSynchronize(s1));
    for (size_t i = 0; i < N; i++)
        check_value(ncclFloat32, h, i, reduced(ncclFloat32, ncclSum, i), "grouped all-reduce", i);
    CK_CUDA(cudaMemcpyAsync(h, b + (size_t)g_rank * N, N * sizeof *h, cudaMemcpyDeviceToHost, s1));
    CK_CUDA(cudaStreamSynchronize(s1));
    for (size_t i = 0; i < N; i++)
        check_value(ncclFloat32, h, i, reduced(ncclFloat32, ncclSum, (size_t)g_rank * N + i),
                    "grouped reduce-scatter", i);
    CK_CUDA(cudaMemcpyAsync(h, g, N * n * sizeof *h, cudaMemcpyDeviceToHost, s1));
    CK_CUDA(cudaStreamSynchronize(s1));
    for (size_t i = 0; i < N * n; i++)
        check_value(ncclFloat32, h, i, input((int)(i / N), i % N), "grouped all-gather", i);

    /* Across streams: s2's copy of a must see the group's all-reduce, launched from s1. */
    for (size_t i = 0; i < N; i++)
        h[i] = (float)input(g_rank, i);
    CK_CUDA(cudaMemcpyAsync(a, h, N * sizeof *h, cudaMemcpyHostToDevice, s1));
    CK_CUDA(cudaMemcpyAsync(b, h, N * sizeof *h, cudaMemcpyHostToDevice, s2));
    CK_NCCL(ncclGroupStart());
    CK_NCCL(ncclAllReduce(a, a, N, ncclFloat32, ncclSum, c, s1));
    CK_NCCL(ncclAllReduce(b, b, N, ncclFloat32, ncclAvg, c, s2));
    CK_NCCL(ncclGroupEnd());
    CK_CUDA(cudaMemcpyAsync(h, a, N * sizeof *h, cudaMemcpyDeviceToHost, s2));
    CK_CUDA(cudaMemcpyAsync(h + N, b, N * sizeof *h, cudaMemcpyDeviceToHost, s2));
    CK_CUDA(cudaStreamSynchronize(s2));
    for (size_t i = 0; i < N; i++) {
        check_value(ncclFloat32, h, i, reduced(ncclFloat32, ncclSum, i), "all-reduce on s1 read on s2", i);
        check_value(ncclFloat32, h, N + i, reduced(ncclFloat32, ncclAvg, i), "all-reduce on s2", i);
    }
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaFreeHost(h));
    CK_CUDA(cudaFree(a));
    CK_CUDA(cudaFree(b));
    CK_CUDA(cudaFree(g));
    CK_CUDA(cudaStreamDestroy(s1));
    CK_CUDA(cudaStreamDestroy(s2));
    CK_NCCL(ncclCommDestroy(c));
    CK_NO_FLAGS();
}
END_TEST

/* Polls until the communicator's state is no longer ncclInProgress (10 s at most). */
static ncclResult_t settle(ncclComm_t c)
{
    ncclResult_t e = ncclInProgress;
    for (int i = 0; i < 10000 && e == ncclInProgress; i++) {
        CK_NCCL(ncclCommGetAsyncError(c, &e));
        if (e == ncclInProgress)
            sleep_ms(1);
    }
    return e;
}

START_TEST(test_nonblocking)
{
    enum { N = 513 };
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t c;
    cudaStream_t s;
    float *d, *h;
    cfg.blocking = 0;
    pick_device();
    ncclUniqueId id = shared_id();
    ncclResult_t r = ncclCommInitRankConfig(&c, g_size, id, g_rank, &cfg);
    ck_assert_msg(r == ncclSuccess || r == ncclInProgress, "ncclCommInitRankConfig: %s", ncclGetErrorString(r));
    ck_assert_int_eq(settle(c), ncclSuccess);
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaMalloc((void **)&d, N * sizeof *d));
    CK_CUDA(cudaMallocHost((void **)&h, N * sizeof *h));
    for (size_t i = 0; i < N; i++)
        h[i] = (float)input(g_rank, i);
    CK_CUDA(cudaMemcpyAsync(d, h, N * sizeof *h, cudaMemcpyHostToDevice, s));
    r = ncclAllReduce(d, d, N, ncclFloat32, ncclSum, c, s);
    ck_assert_msg(r == ncclSuccess || r == ncclInProgress, "ncclAllReduce: %s", ncclGetErrorString(r));
    ck_assert_int_eq(settle(c), ncclSuccess);
    CK_CUDA(cudaMemcpyAsync(h, d, N * sizeof *h, cudaMemcpyDeviceToHost, s));
    CK_CUDA(cudaStreamSynchronize(s));
    for (size_t i = 0; i < N; i++)
        check_value(ncclFloat32, h, i, reduced(ncclFloat32, ncclSum, i), "non-blocking all-reduce", i);
    r = ncclCommFinalize(c);
    ck_assert_msg(r == ncclSuccess || r == ncclInProgress, "ncclCommFinalize: %s", ncclGetErrorString(r));
    ck_assert_int_eq(settle(c), ncclSuccess);
    CK_NCCL(ncclCommDestroy(c));
    CK_CUDA(cudaFreeHost(h));
    CK_CUDA(cudaFree(d));
    CK_CUDA(cudaStreamDestroy(s));
    CK_NO_FLAGS();
}
END_TEST

START_TEST(test_duplicate_gpu)
{
    ncclComm_t c;
    char *saved = getenv("NCCL_HOSTID") ? strdup(getenv("NCCL_HOSTID")) : NULL;
    unsetenv("NCCL_HOSTID");
    CK_CUDA(cudaSetDevice(0));
    ncclUniqueId id = shared_id();
    ncclResult_t r = ncclCommInitRank(&c, g_size, id, g_rank);
    if (saved != NULL) {
        setenv("NCCL_HOSTID", saved, 1);
        free(saved);
    }
    ck_assert_msg(r == ncclInvalidUsage, "two ranks on GPU 0: %s", ncclGetErrorString(r));
    ck_assert_msg(strstr(ncclGetLastError(NULL), "Duplicate GPU detected") != NULL, "last error: %s",
                  ncclGetLastError(NULL));
    CK_NO_FLAGS();
}
END_TEST

/* Rank 0 starts a collective the others never join; its abort must free the stream. */
START_TEST(test_abort_releases_stream)
{
    ncclComm_t c = comm_new();
    cudaStream_t s;
    float *d;
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK_CUDA(cudaMalloc((void **)&d, 1024 * sizeof *d));
    CK_CUDA(cudaMemset(d, 0, 1024 * sizeof *d));
    CK_CUDA(cudaDeviceSynchronize());
    if (g_rank == 0) {
        CK_NCCL(ncclAllReduce(d, d, 1024, ncclFloat32, ncclSum, c, s));
        sleep_ms(200);
        ck_assert_int_eq(cudaStreamQuery(s), cudaErrorNotReady);
        CK_NCCL(ncclCommAbort(c));
        cudaError_t q = cudaErrorNotReady;
        for (int i = 0; i < 10000 && (q = cudaStreamQuery(s)) == cudaErrorNotReady; i++)
            sleep_ms(1);
        ck_assert_msg(q != cudaErrorNotReady, "the stream is still blocked 10 s after ncclCommAbort");
#ifdef CUEMU_BUILD
        /* The emulator fails the stream rather than let later work run on what never arrived. */
        ck_assert_int_eq(q, cudaErrorLaunchFailure);
#endif
    } else {
        sleep_ms(600);
        CK_NCCL(ncclCommAbort(c));
    }
    (void)cudaGetLastError();
    CK_CUDA(cudaFree(d));
    (void)cudaStreamDestroy(s);
    CK_NO_FLAGS();
}
END_TEST

#ifdef CUEMU_BUILD

static void no_shm_left(void)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "cuemu-nccl-%d-", (int)getpid());
    DIR *dir = opendir("/dev/shm");
    ck_assert_ptr_nonnull(dir);
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            ck_abort_msg("/dev/shm/%s is still there", e->d_name);
    closedir(dir);
}

START_TEST(test_mismatch_fails_every_rank)
{
    ncclComm_t c = comm_new();
    cudaStream_t s;
    float *d;
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaMalloc((void **)&d, 64 * sizeof *d));
    CK_CUDA(cudaMemset(d, 0, 64 * sizeof *d));
    unsigned long before = cuemu_flag_count_of(CUEMU_FLAG_NCCL_MISMATCH);
    CK_NCCL(ncclAllReduce(d, d, 32 + (g_rank == 1), ncclFloat32, ncclSum, c, s));
    ck_assert_int_eq(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
    ncclResult_t e = ncclSuccess;
    CK_NCCL(ncclCommGetAsyncError(c, &e));
    ck_assert_int_eq(e, ncclInvalidUsage);
    ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_NCCL_MISMATCH), before + 1);
    const char *msg = ncclGetLastError(c);
    ck_assert_msg(strstr(msg, "AllReduce(count=32") && strstr(msg, "AllReduce(count=33") && strstr(msg, "count"),
                  "last error: %s", msg);
    (void)cudaGetLastError();
    CK_NCCL(ncclCommAbort(c));
    CK_CUDA(cudaFree(d));
    (void)cudaStreamDestroy(s);
}
END_TEST

/* The last rank's second collective fails: every rank hears of it, its stream fails, and the
 * copy queued behind the collectives never runs. */
START_TEST(test_remote_error_reaches_every_rank)
{
    enum { N = 4096 };
    char after[16];
    snprintf(after, sizeof after, "%d", g_size - 1);
    setenv("CUEMU_NCCL_FAIL_RANK", after, 1);
    setenv("CUEMU_NCCL_FAIL_AFTER", "1", 1);
    ncclComm_t c = comm_new();
    unsetenv("CUEMU_NCCL_FAIL_RANK");
    unsetenv("CUEMU_NCCL_FAIL_AFTER");
    cudaStream_t s;
    float *d, *h;
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaMalloc((void **)&d, N * sizeof *d));
    CK_CUDA(cudaMallocHost((void **)&h, N * sizeof *h));
    CK_CUDA(cudaMemsetAsync(d, 0, N * sizeof *d, s));
    for (int k = 0; k < 3; k++)
        CK_NCCL(ncclAllReduce(d, d, N, ncclFloat32, ncclSum, c, s));
    for (size_t i = 0; i < N; i++)
        h[i] = -7.0f;
    CK_CUDA(cudaMemcpyAsync(h, d, N * sizeof *h, cudaMemcpyDeviceToHost, s));
    double t0 = MPI_Wtime();
    ncclResult_t e = ncclSuccess;
    while (e == ncclSuccess && MPI_Wtime() - t0 < 10) {
        CK_NCCL(ncclCommGetAsyncError(c, &e));
        if (e == ncclSuccess)
            sleep_ms(1);
    }
    ck_assert_int_eq(e, ncclRemoteError);
    ck_assert_int_eq(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
    ck_assert_double_lt(MPI_Wtime() - t0, 10);
    size_t touched = 0;
    for (size_t i = 0; i < N; i++)
        touched += h[i] != -7.0f;
    ck_assert_msg(touched == 0, "the copy queued after the failed collective wrote %zu elements", touched);
    ck_assert_msg(strstr(ncclGetLastError(c), "injected") != NULL, "last error: %s", ncclGetLastError(c));
    (void)cudaGetLastError();
    CK_NCCL(ncclCommAbort(c));
    CK_CUDA(cudaFreeHost(h));
    CK_CUDA(cudaFree(d));
    (void)cudaStreamDestroy(s);
}
END_TEST

/* Rank 0 issues a collective no other rank does: after CUEMU_NCCL_TIMEOUT_S it fails, flagged,
 * and the others hear of it. */
START_TEST(test_skipped_collective_times_out)
{
    setenv("CUEMU_NCCL_TIMEOUT_S", "1", 1);
    ncclComm_t c = comm_new();
    unsetenv("CUEMU_NCCL_TIMEOUT_S");
    cudaStream_t s;
    float *d;
    CK_CUDA(cudaStreamCreate(&s));
    CK_CUDA(cudaMalloc((void **)&d, 64 * sizeof *d));
    CK_CUDA(cudaMemset(d, 0, 64 * sizeof *d));
    unsigned long before = cuemu_flag_count_of(CUEMU_FLAG_NCCL_HANG);
    if (g_rank == 0) {
        CK_NCCL(ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, c, s));
        ck_assert_int_eq(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
        ck_assert_uint_eq(cuemu_flag_count_of(CUEMU_FLAG_NCCL_HANG), before + 1);
    }
    ncclResult_t e = ncclSuccess;
    for (int i = 0; i < 5000 && e == ncclSuccess; i++) {
        CK_NCCL(ncclCommGetAsyncError(c, &e));
        if (e == ncclSuccess)
            sleep_ms(1);
    }
    ck_assert_int_eq(e, ncclSystemError);
    (void)cudaGetLastError();
    CK_NCCL(ncclCommAbort(c));
    CK_CUDA(cudaFree(d));
    (void)cudaStreamDestroy(s);
}
END_TEST

START_TEST(test_broken_nccl)
{
    ncclComm_t c;
    ncclUniqueId id;
    CK_NCCL(ncclGetUniqueId(&id));
    setenv("CUEMU_NCCL", "broken", 1);
    ncclResult_t r = ncclCommInitRank(&c, g_size, id, g_rank);
    unsetenv("CUEMU_NCCL");
    ck_assert_int_eq(r, ncclSystemError);
    ck_assert_msg(strstr(ncclGetLastError(NULL), "CUEMU_NCCL=broken") != NULL, "last error: %s",
                  ncclGetLastError(NULL));
}
END_TEST

START_TEST(test_nothing_left_in_shm)
{
    ncclComm_t c = comm_new();
    if (g_rank == 0)
        no_shm_left(); /* the name goes once every rank joined */
    CK_NCCL(ncclCommDestroy(c));
}
END_TEST

#endif /* CUEMU_BUILD */

int main(int argc, char **argv)
{
    mpi_suite_init(&argc, &argv, &g_rank, &g_size);
    if (cudaGetDeviceCount(&g_ndev) != cudaSuccess || g_ndev == 0) {
        if (g_rank == 0)
            fprintf(stderr, "test_cuemu_nccl: no CUDA device\n");
        MPI_Finalize();
        return 77;
    }
    Suite *s = suite_create("cuemu-nccl");
    TCase *tc = tcase_create("nccl");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, flags_mark, NULL);
#ifndef CUEMU_BUILD
    if (g_ndev < g_size) {
        if (g_rank == 0)
            fprintf(stderr, "test_cuemu_nccl: %d GPU(s) for %d ranks: only the refusal of ranks sharing one\n",
                    g_ndev, g_size);
        tcase_add_test(tc, test_duplicate_gpu);
        suite_add_tcase(s, tc);
        return mpi_suite_run(s, g_rank);
    }
#endif
    tcase_add_test(tc, test_comm_queries);
    tcase_add_test(tc, test_allreduce);
    tcase_add_test(tc, test_reduce_scatter);
    tcase_add_test(tc, test_all_gather);
    tcase_add_test(tc, test_broadcast);
    tcase_add_test(tc, test_group);
    tcase_add_test(tc, test_nonblocking);
    if (g_size > 1) {
        tcase_add_test(tc, test_duplicate_gpu);
        tcase_add_test(tc, test_abort_releases_stream);
    }
#ifdef CUEMU_BUILD
    if (g_size > 1) {
        tcase_add_test(tc, test_mismatch_fails_every_rank);
        tcase_add_test(tc, test_skipped_collective_times_out);
    }
    tcase_add_test(tc, test_remote_error_reaches_every_rank);
    tcase_add_test(tc, test_broken_nccl);
    tcase_add_test(tc, test_nothing_left_in_shm);
#endif
    suite_add_tcase(s, tc);
    return mpi_suite_run(s, g_rank);
}
