/*
 * dear-coll-bench: nccl-tests style benchmark of the collectives. For each operation
 * (reduce-scatter, all-gather, all-reduce), each size from --min to --max bytes (doubling; the
 * size is the full vector) and each algorithm, it prints one row: size, count, type, op,
 * algorithm, median time, algbw, busbw and the number of wrong elements (every result is
 * checked against the exact sum). Our algorithms (ring, rhd, direct, auto = what the selection
 * table picks, mpi) run through dear_coll start+wait; Open MPI's blocking calls (ompi-blocking) and its non-blocking calls followed by
 * MPI_Wait (ompi-nb) run side by side in the same job. busbw follows nccl-tests: all-reduce
 * x 2(P-1)/P, reduce-scatter and all-gather x (P-1)/P.
 *
 * --density D zeroes blocks of --block elements at random on each rank (a block is non-zero with
 * probability D, drawn per rank and block), for every algorithm alike, and adds `sparse` (the
 * block-sparse collectives) to the algorithms, so sparse and dense run side by side on the same
 * data. --scan times instead the sparse collectives' zero-block scan alone, in GB/s.
 *
 * --overlap measures instead the OSU overlap percentage of each non-blocking reduce-scatter and
 * all-gather: t_pure (the call alone), then post it, "compute" for t_pure by sleeping (the CPU
 * is free) while a helper thread advances our request with dear_coll_progress (backing off
 * between calls), wait; overlap% = max(0, 100 - 100 (t_overall - t_compute) / t_pure).
 * Open MPI's non-blocking call (ompi-nb) is measured the same way with nobody calling MPI
 * during the sleep, as an application without a progress thread would.
 *
 * --compress LIST runs float32 vectors compressed on the wire (coll.h; int8 runs hier where the row
 * says hier or auto picks it, else direct), each format beside the uncompressed rows; sizes and busbw stay those of the
 * float32 vector (what the user moves). --accuracy measures instead the error of one compressed
 * all-reduce (the average over the ranks) of random float32 data per algorithm against the
 * float64 average, in units of the format's unit roundoff u times the element's mean |x| over the
 * ranks (int8: of 1/254, half a scale of a block whose largest is 1, as the data's are). --convert times the
 * conversions the progress thread runs (pack, unpack, one ring hop's add; int8: the owner's add
 * of a received chunk) per MiB of float32.
 *
 * Times are the maximum over ranks of one iteration, median over --iters iterations; the
 * algorithms of one size take turns iteration by iteration (see time_algos). Data are
 * integer-valued (exact in every type), the calls out of place, so inputs never need resetting.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "collectives/net.h"
#include "collectives/reduce.h"
#include "include/dear.h"
#include "base/fileio.h"
#include "base/log.h"
#include "base/params.h"
#include "base/util.h"

enum { A_RING, A_RHD, A_DIRECT, A_AUTO, A_MPI, A_HIER, A_SPARSE, A_OMPI_BLOCKING, A_OMPI_NB, A_COUNT };
static const char *const algo_names[A_COUNT] = { "ring", "rhd", "direct", "auto", "mpi", "hier", "sparse",
                                                 "ompi-blocking", "ompi-nb" };
/* The hosts of MPI_COMM_WORLD (NULL: one host, or hosts of unequal or single ranks): what the
 * runtime hands its collectives, so auto and hier choose as there. */
static dear_coll_topo_t *g_topo;
/* MPI_COMM_WORLD on --transport's transport. */
static dear_net_t *g_net;
static const char *const op_short[DEAR_COLL_OP_COUNT] = { "rs", "ag", "ar" };

typedef struct {
    size_t min_bytes, max_bytes;
    int iters, warmup, overlap, scan;
    int stream;                 /* --stream: collectives back to back per timed iteration */
    double density;             /* < 0: every block as it comes (dense data) */
    size_t block;
    int ops[DEAR_COLL_OP_COUNT];
    int algos[A_COUNT];
    dear_dtype_t dtype;
    const char *csv;
    dear_transport_id_t transport; /* --transport */
    int compress[DEAR_COMPRESS_COUNT]; /* --compress: the formats to run */
    int accuracy, convert;
} opts_t;

static int g_rank, g_size;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np P dear-coll-bench [options]\n"
            "  --min BYTES        smallest full-vector size (default 1024; k/m/g suffixes)\n"
            "  --max BYTES        largest size, reached by doubling (default 67108864)\n"
            "  --iters N          timed iterations per row, median reported (default 20)\n"
            "  --warmup N         untimed iterations first (default 3)\n"
            "  --stream N         each timed iteration runs N collectives back to back, one after the\n"
            "                     other, as the runtime's channel runs a phase, and reports the time per\n"
            "                     collective (default 1: alone, which a link's burst allowance flatters)\n"
            "  --ops LIST         rs,ag,ar (default all three)\n"
            "  --algos LIST       ring,rhd,direct,auto,mpi,hier,sparse,ompi-blocking,ompi-nb (default all\n"
            "                     but sparse, which --density adds; hier only where the job spans several\n"
            "                     hosts of as many ranks each)\n"
            "  --density D        fraction in [0, 1] of non-zero blocks: each rank zeroes each block of its\n"
            "                     input with probability 1-D (its own random pattern), for every algorithm;\n"
            "                     adds sparse to the default algorithms (default: dense data, no sparse)\n"
            "  --block N          elements per block for --density, sparse and --scan (default 256)\n"
            "  --scan             time the sparse collectives' zero-block scan alone (rank 0, one\n"
            "                     buffer per size with --density's pattern, all-zero by default, the\n"
            "                     slowest case); CSV header dtype,bytes,block,density,nonzero,time_us,GBps\n"
            "  --dtype TYPE       float32 (default), float64, bfloat16, float16, int32; Open MPI's\n"
            "                     own calls run only for float32, float64 and int32\n"
            "  --csv FILE         also write the rows as CSV (rank 0); header\n"
            "                     op,algo,dtype,bytes,count,nranks,time_us,algbw_MBps,busbw_MBps,wrong\n"
            "  --overlap          measure OSU overlap%% of rs and ag instead (sleep as compute,\n"
            "                     our requests advanced by a helper thread); CSV header\n"
            "                     op,algo,dtype,bytes,count,nranks,t_pure_us,t_overall_us,t_compute_us,overlap_pct\n"
            "  --compress LIST    none,bf16,fp16,int8: float32 vectors travel in each listed format, rows side by\n"
            "                     side (default none); size and busbw count the float32 bytes\n"
            "  --accuracy         instead: the error of one all-reduce (average) of random float32 data per\n"
            "                     algorithm and --compress format (--max bytes per rank), against the float64\n"
            "                     average; CSV header algo,compress,nranks,count,max_err_u,rms_err_u\n"
            "  --convert          instead: the progress thread's conversions (pack float32 to 16 bits,\n"
            "                     unpack, a ring hop's widen+add+round; int8: pack, unpack, the owner's add)\n"
            "                     per MiB of float32 (rank 0, --max bytes); CSV header\n"
            "                     step,compress,bytes,us_per_MiB,GBps\n"
            "  --transport T      what carries the algorithms' messages, a row of the transport table:\n"
            "                     mpi (default): MPI_Isend/Irecv, polled; socket: libdear's socket transport\n"
            "                     (DEAR_SOCKET_IFNAME picks the interface), waiting in epoll. Open MPI's own\n"
            "                     calls use MPI either way\n"
            "  --help             this text\n"
            "DEAR_COLL_SEGMENT sets the ring's segment size. Sizes are rounded down to whole elements.\n");
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1048576; end++; break;
    case 'g': case 'G': v *= 1073741824.0; end++; break;
    default: break;
    }
    if (*end != '\0')
        return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_list(const char *s, const char *const *names, int n, int *flags, const char *what)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    memset(flags, 0, sizeof(int) * (size_t)n);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = 0; i < n; i++)
            if (strcmp(tok, names[i]) == 0)
                flags[i] = found = 1;
        if (!found) {
            if (g_rank == 0)
                fprintf(stderr, "dear-coll-bench: unknown %s '%s'\n", what, tok);
            return -1;
        }
    }
    return 0;
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    static const struct option longopts[] = {
        { "min", required_argument, 0, 'a' }, { "max", required_argument, 0, 'b' },
        { "iters", required_argument, 0, 'i' }, { "warmup", required_argument, 0, 'w' },
        { "ops", required_argument, 0, 'o' }, { "algos", required_argument, 0, 'g' },
        { "dtype", required_argument, 0, 't' }, { "csv", required_argument, 0, 'c' },
        { "overlap", no_argument, 0, 'v' }, { "help", no_argument, 0, 'h' },
        { "density", required_argument, 0, 'd' }, { "block", required_argument, 0, 'k' },
        { "scan", no_argument, 0, 's' }, { "transport", required_argument, 0, 'T' },
        { "compress", required_argument, 0, 'z' }, { "accuracy", no_argument, 0, 'A' },
        { "convert", no_argument, 0, 'V' }, { "stream", required_argument, 0, 'S' }, { 0, 0, 0, 0 }
    };
    static const char *const comp_names[DEAR_COMPRESS_COUNT] = { "none", "bf16", "fp16", "int8" };
    *o = (opts_t){ .min_bytes = 1024, .max_bytes = 64u << 20, .iters = 20, .warmup = 3,
                   .dtype = DEAR_FLOAT32, .density = -1, .block = 256, .stream = 1 };
    int algos_given = 0;
    for (int i = 0; i < DEAR_COLL_OP_COUNT; i++)
        o->ops[i] = 1;
    for (int i = 0; i < A_COUNT; i++)
        o->algos[i] = 1;
    o->compress[DEAR_COMPRESS_NONE] = 1;
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
        int bad = 0;
        switch (c) {
        case 'a': bad = parse_size(optarg, &o->min_bytes); break;
        case 'b': bad = parse_size(optarg, &o->max_bytes); break;
        case 'i': o->iters = atoi(optarg); bad = o->iters < 1; break;
        case 'w': o->warmup = atoi(optarg); bad = o->warmup < 0; break;
        case 'o': bad = parse_list(optarg, op_short, DEAR_COLL_OP_COUNT, o->ops, "op"); break;
        case 'g': bad = parse_list(optarg, algo_names, A_COUNT, o->algos, "algorithm"); algos_given = 1; break;
        case 't': bad = dear_dtype_parse(optarg, &o->dtype); break;
        case 'c': o->csv = optarg; break;
        case 'v': o->overlap = 1; break;
        case 's': o->scan = 1; break;
        case 'd': {
            char *end;
            o->density = strtod(optarg, &end);
            bad = end == optarg || *end != '\0' || !(o->density >= 0 && o->density <= 1);
            break;
        }
        case 'k': bad = parse_size(optarg, &o->block) || o->block < 1; break;
        case 'T':
            bad = dear_transport_id_parse(optarg, &o->transport) != 0 || o->transport == DEAR_TRANSPORT_AUTO;
            break;
        case 'z': bad = parse_list(optarg, comp_names, DEAR_COMPRESS_COUNT, o->compress, "compress format"); break;
        case 'A': o->accuracy = 1; break;
        case 'V': o->convert = 1; break;
        case 'S': o->stream = atoi(optarg); bad = o->stream < 1 || o->stream > 100000; break;
        case 'h': if (g_rank == 0) usage(stdout); return 1;
        default: bad = 1; break;
        }
        if (bad) {
            if (g_rank == 0) {
                if (c != '?')  /* getopt already named an unknown option */
                    fprintf(stderr, "dear-coll-bench: bad value '%s' for --%s\n", optarg,
                            longopts[li].name);
                usage(stderr);
            }
            return -1;
        }
    }
    if (!algos_given)
        o->algos[A_SPARSE] = o->density >= 0;
    if (o->min_bytes < 1 || o->max_bytes < o->min_bytes) {
        if (g_rank == 0)
            fprintf(stderr, "dear-coll-bench: need 1 <= --min <= --max\n");
        return -1;
    }
    return 0;
}

/* ---- data and verification ---- */

static double value(int r, size_t i) { return (double)((long)((i * 7 + (size_t)r * 13) % 17) - 8); }

/* --density's pattern: block b of rank r is non-zero with probability g_density (a hash of r and
 * b, so every rank can work out every other rank's input). */
static double g_density = -1;
static size_t g_block = 256;

/* A hash of (r, i) uniform in [0, 1): every rank can work out every other rank's draws. */
static double uniform(int r, size_t i)
{
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)(r + 1) * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (double)(x >> 11) / 9007199254740992.0;
}

static int block_on(int r, size_t b)
{
    return uniform(r, b) < g_density;
}

static double input_value(int r, size_t i)
{
    return g_density < 0 || block_on(r, i / g_block) ? value(r, i) : 0;
}

/* Sum over ranks of value(r, i): value depends on i mod 17 only through (i*7) % 17. */
static double sum_table[17];

static double expected_sum(size_t i)
{
    if (g_density < 0)
        return sum_table[i % 17];
    double s = 0;
    for (int r = 0; r < g_size; r++)
        s += input_value(r, i);
    return s;
}

typedef struct {
    dear_coll_op_t op;
    dear_dtype_t t;
    size_t count, es, off, len;
    size_t *counts, *displs;
    int *icounts, *idispls;
    char *send, *recv;
    MPI_Comm comm;
} bench_t;

static void bench_setup(bench_t *b, dear_coll_op_t op, dear_dtype_t t, size_t count, MPI_Comm comm)
{
    memset(b, 0, sizeof *b);
    b->op = op, b->t = t, b->count = count, b->comm = comm;
    b->es = dear_dtype_size(t);
    b->counts = malloc((size_t)g_size * sizeof(size_t));
    b->displs = malloc((size_t)g_size * sizeof(size_t));
    b->icounts = malloc((size_t)g_size * sizeof(int));
    b->idispls = malloc((size_t)g_size * sizeof(int));
    for (int p = 0; p < g_size; p++) {
        dear_coll_shard(count, g_size, p, &b->displs[p], &b->counts[p]);
        b->icounts[p] = (int)b->counts[p];
        b->idispls[p] = (int)b->displs[p];
    }
    b->off = b->displs[g_rank], b->len = b->counts[g_rank];
    size_t sn = op == DEAR_COLL_ALLGATHER ? b->len : count;
    size_t rn = op == DEAR_COLL_REDUCE_SCATTER ? b->len : count;
    b->send = malloc(sn * b->es + 64);
    b->recv = malloc(rn * b->es + 64);
    if (b->send == NULL || b->recv == NULL) {
        fprintf(stderr, "dear-coll-bench: out of memory for %zu elements\n", count);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (size_t i = 0; i < sn; i++)
        dear_elem_put(t, b->send, i, op == DEAR_COLL_ALLGATHER ? expected_sum(b->off + i) : input_value(g_rank, i));
    memset(b->recv, 0, rn * b->es);
}

static void bench_free(bench_t *b)
{
    free(b->counts), free(b->displs), free(b->icounts), free(b->idispls);
    free(b->send), free(b->recv);
}

/* Wrong elements on this rank: off by more than tol. All-gather gathers the expected sums
 * themselves. */
static long bench_verify(const bench_t *b, double scale, double tol)
{
    long wrong = 0;
    size_t lo = b->op == DEAR_COLL_REDUCE_SCATTER ? b->off : 0;
    size_t n = b->op == DEAR_COLL_REDUCE_SCATTER ? b->len : b->count;
    for (size_t i = 0; i < n; i++)
        wrong += !(fabs(dear_elem_get(b->t, b->recv, i) - expected_sum(lo + i) * scale) <= tol);
    return wrong;
}

/* The other formats carry these small integers exactly; int8 within half a scale per
 * quantization on an element's path: the peers' inputs (at most 8 each, so scales of at most
 * 8/127) and the gathered sums (at most 8 P). */
static double format_tol(dear_compress_t c)
{
    return c == DEAR_COMPRESS_INT8 ? (g_size - 1) * 8.0 / 254 + 8.0 * g_size / 254 * 1.01 : 0;
}

static MPI_Datatype mpi_type(dear_dtype_t t)
{
    switch (t) {
    case DEAR_FLOAT32: return MPI_FLOAT;
    case DEAR_FLOAT64: return MPI_DOUBLE;
    case DEAR_INT32: return MPI_INT32_T;
    default: return MPI_DATATYPE_NULL;
    }
}

/* ---- one call of each kind ---- */

/* A row's algorithm: one of ours or Open MPI's, and for ours the wire format. */
typedef struct {
    int algo;
    dear_compress_t comp;
} entry_t;

static const dear_coll_algo_t algo_map[] = { DEAR_ALGO_RING, DEAR_ALGO_RHD, DEAR_ALGO_DIRECT, DEAR_ALGO_AUTO,
                                             DEAR_ALGO_MPI, DEAR_ALGO_HIER, DEAR_ALGO_SPARSE };

static int dear_start(bench_t *b, entry_t e, double scale, dear_coll_req_t **req)
{
    dear_coll_args_t a = { .op = b->op, .algo = algo_map[e.algo], .dtype = b->t, .comm = b->comm, .net = g_net,
                           .tag = 5, .scale = scale, .sendbuf = b->send, .recvbuf = b->recv,
                           .count = b->count, .topo = g_topo, .sparse_block = g_block, .compress = e.comp,
                           .compress_ag = e.comp };
    return dear_coll_start(&a, req);
}

/* "ring", or "ring+bf16" for a compressed row. */
static const char *entry_name(entry_t e, char *buf, size_t len)
{
    if (e.comp == DEAR_COMPRESS_NONE)
        return algo_names[e.algo];
    snprintf(buf, len, "%s+%s", algo_names[e.algo], dear_compress_name(e.comp));
    return buf;
}

static int ompi_start(bench_t *b, MPI_Request *r)
{
    MPI_Datatype t = mpi_type(b->t);
    switch (b->op) {
    case DEAR_COLL_REDUCE_SCATTER:
        return MPI_Ireduce_scatter(b->send, b->recv, b->icounts, t, MPI_SUM, b->comm, r);
    case DEAR_COLL_ALLGATHER:
        return MPI_Iallgatherv(b->send, (int)b->len, t, b->recv, b->icounts, b->idispls, t, b->comm, r);
    default:
        return MPI_Iallreduce(b->send, b->recv, (int)b->count, t, MPI_SUM, b->comm, r);
    }
}

static int ompi_blocking(bench_t *b)
{
    MPI_Datatype t = mpi_type(b->t);
    switch (b->op) {
    case DEAR_COLL_REDUCE_SCATTER:
        return MPI_Reduce_scatter(b->send, b->recv, b->icounts, t, MPI_SUM, b->comm);
    case DEAR_COLL_ALLGATHER:
        return MPI_Allgatherv(b->send, (int)b->len, t, b->recv, b->icounts, b->idispls, t, b->comm);
    default:
        return MPI_Allreduce(b->send, b->recv, (int)b->count, t, MPI_SUM, b->comm);
    }
}

static int run_once(bench_t *b, entry_t e)
{
    int algo = e.algo;
    if (algo == A_OMPI_BLOCKING)
        return ompi_blocking(b) == MPI_SUCCESS ? DEAR_OK : DEAR_ERR_MPI;
    if (algo == A_OMPI_NB) {
        MPI_Request r;
        if (ompi_start(b, &r) != MPI_SUCCESS || MPI_Wait(&r, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return DEAR_ERR_MPI;
        return DEAR_OK;
    }
    dear_coll_req_t *req = NULL;
    int rc = dear_start(b, e, 1.0, &req);
    if (rc == DEAR_OK)
        rc = dear_coll_wait(req);
    dear_coll_free(req);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times the n algorithms in alg[] together: every iteration runs each of them once, in turn, so
 * that all see the same conditions. On the emulated cluster the token bucket of each link
 * refills during pauses and drains under back-to-back calls, so when each algorithm ran all its
 * iterations in a row, the first one after a size change got a fuller bucket: at 64 KiB that
 * row came out up to 2x faster than the others, whichever algorithm it was; and one that
 * follows a slow call (Open MPI's non-blocking reduce-scatter sends at a third of the line rate)
 * gets a fuller bucket than one that follows a fast call, so the order rotates every
 * iteration. t[k] gets the
 * median over iterations of the slowest rank's time of alg[k] (< 0 if any call failed) and
 * wrong[k] the elements that rank got wrong in the last iteration, checked right after it. */
static void time_algos(bench_t *b, const entry_t *alg, int n, const opts_t *o, double *t, long *wrong)
{
    size_t es = dear_dtype_size(b->t);
    size_t rbytes = (b->op == DEAR_COLL_REDUCE_SCATTER ? b->len : b->count) * es;
    double *v = malloc(sizeof(double) * (size_t)o->iters * (size_t)n);
    int *fail = calloc((size_t)n, sizeof(int));
    if (v == NULL || fail == NULL) {
        fprintf(stderr, "dear-coll-bench: out of memory for %d x %d timings\n", n, o->iters);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (int i = 0; i < o->warmup + o->iters; i++) {
        int last = i == o->warmup + o->iters - 1;
        for (int j = 0; j < n; j++) {
            int k = (i + j) % n;  /* rotate: each one follows every other equally often */
            if (last)
                memset(b->recv, 0, rbytes);
            MPI_Barrier(b->comm);
            double t0 = dear_now();
            for (int r = 0; r < o->stream; r++)
                fail[k] |= run_once(b, alg[k]) != DEAR_OK;
            double dt = (dear_now() - t0) / o->stream, mx;
            MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, b->comm);
            if (i >= o->warmup)
                v[(size_t)k * (size_t)o->iters + (size_t)(i - o->warmup)] = mx;
            if (last)
                wrong[k] = fail[k] ? (long)b->count : bench_verify(b, 1.0, format_tol(alg[k].comp));
        }
    }
    for (int k = 0; k < n; k++) {
        int any;
        MPI_Allreduce(&fail[k], &any, 1, MPI_INT, MPI_MAX, b->comm);
        t[k] = any ? -1 : median(v + (size_t)k * (size_t)o->iters, o->iters);
    }
    free(fail);
    free(v);
}

/* One algorithm alone: the median of the slowest rank's time; < 0 on failure. */
static double time_algo(bench_t *b, int algo, const opts_t *o)
{
    double t;
    long wrong;
    entry_t e = { algo, DEAR_COMPRESS_NONE };
    time_algos(b, &e, 1, o, &t, &wrong);
    return t;
}

/* ---- overlap: a helper thread advances one request at a time ---- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dear_coll_req_t *job;
    int job_done, job_rc, quit;
    pthread_t th;
} helper_t;

static void *helper_main(void *arg)
{
    helper_t *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->job == NULL && !h->quit)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->quit)
            break;
        dear_coll_req_t *req = h->job;
        pthread_mutex_unlock(&h->mu);
        int done = 0, rc = DEAR_OK;
        dear_coll_info_t info;
        size_t seen = 0;
        double since = dear_now();
        /* Progress with back-off, as a runtime progress thread would: yield while a transfer
         * completed in the last 100 ms, otherwise sleep 20 us between calls. */
        while (rc == DEAR_OK && !done) {
            rc = dear_coll_progress(req, &done);
            if (done || rc != DEAR_OK)
                break;
            dear_coll_get_info(req, &info);
            if (info.events != seen) {
                seen = info.events;
                since = dear_now();
            }
            if (dear_now() - since < 100e-3)
                sched_yield();
            else
                dear_sleep(20e-6);
        }
        pthread_mutex_lock(&h->mu);
        h->job = NULL;
        h->job_done = 1;
        h->job_rc = rc;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static int overlap_once(bench_t *b, int algo, double t_pure, helper_t *h, double *t_overall,
                        double *t_compute)
{
    int rc = DEAR_OK;
    double t0 = dear_now(), c0, c1;
    if (algo == A_OMPI_NB) {
        MPI_Request r;
        rc = ompi_start(b, &r) == MPI_SUCCESS ? DEAR_OK : DEAR_ERR_MPI;
        c0 = dear_now();
        dear_sleep(t_pure);
        c1 = dear_now();
        if (rc == DEAR_OK && MPI_Wait(&r, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            rc = DEAR_ERR_MPI;
    } else {
        dear_coll_req_t *req = NULL;
        rc = dear_start(b, (entry_t){ algo, DEAR_COMPRESS_NONE }, 1.0, &req);
        if (rc == DEAR_OK) {
            pthread_mutex_lock(&h->mu);
            h->job = req;
            h->job_done = 0;
            pthread_cond_broadcast(&h->cv);
            pthread_mutex_unlock(&h->mu);
        }
        c0 = dear_now();
        dear_sleep(t_pure);
        c1 = dear_now();
        if (rc == DEAR_OK) {
            pthread_mutex_lock(&h->mu);
            while (!h->job_done)
                pthread_cond_wait(&h->cv, &h->mu);
            rc = h->job_rc;
            pthread_mutex_unlock(&h->mu);
        }
        dear_coll_free(req);
    }
    *t_overall = dear_now() - t0;
    *t_compute = c1 - c0;
    return rc;
}

/* ---- main ---- */

static double busbw_factor(dear_coll_op_t op)
{
    double p = g_size;
    return op == DEAR_COLL_ALLREDUCE ? 2.0 * (p - 1) / p : (p - 1) / p;
}

static void run_normal(const opts_t *o, FILE *csv)
{
    if (g_rank == 0) {
        printf("# dear-coll-bench: %d ranks, dtype %s, %d iterations (median of the slowest rank), "
               "%d warm-up\n", g_size, dear_dtype_name(o->dtype), o->iters, o->warmup);
        if (o->density >= 0)
            printf("# density %g: each rank's blocks of %zu elements non-zero at random with that probability\n",
                   o->density, o->block);
        printf("%12s %12s %8s %6s %14s %12s %12s %12s %8s\n", "size(B)", "count", "type", "op",
               "algo", "time(us)", "algbw(MB/s)", "busbw(MB/s)", "#wrong");
    }
    size_t es = dear_dtype_size(o->dtype);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        if (!o->ops[op])
            continue;
        for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 2) {
            size_t count = bytes / es;
            if (count == 0)
                continue;
            bench_t b;
            bench_setup(&b, (dear_coll_op_t)op, o->dtype, count, MPI_COMM_WORLD);
            entry_t alg[A_COUNT * DEAR_COMPRESS_COUNT];
            int n = 0;
            for (int a = 0; a < A_COUNT; a++)
                for (int c = 0; c < DEAR_COMPRESS_COUNT; c++) {
                    int ours = a < A_OMPI_BLOCKING, wire = c != DEAR_COMPRESS_NONE;
                    if (o->algos[a] && o->compress[c] && !(!ours && mpi_type(o->dtype) == MPI_DATATYPE_NULL) &&
                        !(wire && (!ours || o->dtype != DEAR_FLOAT32)))
                        alg[n++] = (entry_t){ a, (dear_compress_t)c };
                }
            double t[A_COUNT * DEAR_COMPRESS_COUNT];
            long wrong[A_COUNT * DEAR_COMPRESS_COUNT];
            time_algos(&b, alg, n, o, t, wrong);
            for (int k = 0; k < n; k++) {
                char nb[32];
                const char *name = entry_name(alg[k], nb, sizeof nb);
                long total_wrong = 0;
                MPI_Reduce(&wrong[k], &total_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
                if (g_rank != 0)
                    continue;
                size_t fb = count * es;
                double algbw = t[k] > 0 ? fb / t[k] / 1e6 : 0, busbw = algbw * busbw_factor(b.op);
                printf("%12zu %12zu %8s %6s %14s %12.1f %12.1f %12.1f %8ld\n", fb, count,
                       dear_dtype_name(o->dtype), op_short[op], name, t[k] * 1e6, algbw, busbw,
                       total_wrong);
                if (csv)
                    fprintf(csv, "%s,%s,%s,%zu,%zu,%d,%.3f,%.3f,%.3f,%ld,%s\n", op_short[op],
                            algo_names[alg[k].algo], dear_dtype_name(o->dtype), fb, count, g_size, t[k] * 1e6, algbw,
                            busbw, total_wrong, dear_compress_name(alg[k].comp));
                fflush(stdout);
            }
            bench_free(&b);
        }
    }
}

/* The zero-block scan alone, on rank 0: one buffer per size with --density's pattern (all-zero
 * without it: every byte is read, the slowest case), the median of --iters scans. */
static void run_scan(const opts_t *o, FILE *csv)
{
    if (g_rank != 0)
        return;
    printf("# dear-coll-bench --scan: dtype %s, blocks of %zu elements, density %g, median of %d\n",
           dear_dtype_name(o->dtype), o->block, o->density < 0 ? 0 : o->density, o->iters);
    printf("%12s %8s %8s %10s %12s %12s %10s\n", "size(B)", "type", "block", "density", "nonzero", "time(us)",
           "GB/s");
    size_t es = dear_dtype_size(o->dtype);
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 2) {
        size_t count = bytes / es, nz = 0;
        char *v = calloc(count + 1, es);
        double *t = malloc(sizeof(double) * (size_t)o->iters);
        if (v == NULL || t == NULL) {
            fprintf(stderr, "dear-coll-bench: out of memory for %zu bytes\n", bytes);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        for (size_t i = 0; o->density >= 0 && i < count; i++)
            dear_elem_put(o->dtype, v, i, input_value(0, i));
        for (int i = 0; i < o->warmup + o->iters; i++) {
            double t0 = dear_now();
            nz = dear_coll_sparse_nonzero(o->dtype, v, count, o->block);
            if (i >= o->warmup)
                t[i - o->warmup] = dear_now() - t0;
        }
        double med = median(t, o->iters), gbps = med > 0 ? (double)(count * es) / med / 1e9 : 0;
        double d = o->density < 0 ? 0 : o->density;
        printf("%12zu %8s %8zu %10g %12zu %12.1f %10.2f\n", count * es, dear_dtype_name(o->dtype), o->block, d, nz,
               med * 1e6, gbps);
        if (csv)
            fprintf(csv, "%s,%zu,%zu,%g,%zu,%.3f,%.3f\n", dear_dtype_name(o->dtype), count * es, o->block, d, nz,
                    med * 1e6, gbps);
        free(v);
        free(t);
    }
}

/* Deterministic pseudo-random value in [-1, 1) from (r, i). */
static double rand_value(int r, size_t i)
{
    return 2 * uniform(r, i) - 1;
}

/* The error of one all-reduce (the average) of random float32 data, per algorithm and format,
 * against the float64 average: element i's error over u times its mean |x| over the ranks, the
 * largest and the root mean square over the vector (--max bytes of float32 per rank). */
static void run_accuracy(const opts_t *o, FILE *csv)
{
    size_t n = o->max_bytes / sizeof(float);
    double *x = malloc(n * sizeof(double)), *ax = malloc(n * sizeof(double));
    double *sum = malloc(n * sizeof(double)), *asum = malloc(n * sizeof(double));
    if (!x || !ax || !sum || !asum) {
        fprintf(stderr, "dear-coll-bench: out of memory for %zu elements\n", n);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    bench_t b;
    bench_setup(&b, DEAR_COLL_ALLREDUCE, DEAR_FLOAT32, n, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++) {
        ((float *)b.send)[i] = (float)rand_value(g_rank, i);
        x[i] = ((float *)b.send)[i];
        ax[i] = fabs(x[i]);
    }
    MPI_Allreduce(x, sum, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(ax, asum, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("# dear-coll-bench --accuracy: %d ranks, one all-reduce (average) of %zu random float32 in [-1, 1) "
               "per rank; error / (u x mean |x|), u = 2^-8 bf16, 2^-11 fp16, 2^-24 none; int8: error / (1/254), "
               "its half scale where a block's largest is 1\n", g_size, n);
        printf("%14s %8s %12s %12s\n", "algo", "compress", "max_err_u", "rms_err_u");
    }
    for (int a = 0; a < A_OMPI_BLOCKING; a++)
        for (int c = 0; c < DEAR_COMPRESS_COUNT; c++) {
            if (!o->algos[a] || !o->compress[c])
                continue;
            dear_coll_req_t *req = NULL;
            int rc = dear_start(&b, (entry_t){ a, (dear_compress_t)c }, 1.0 / g_size, &req);
            if (rc == DEAR_OK)
                rc = dear_coll_wait(req);
            dear_coll_free(req);
            double u = c == DEAR_COMPRESS_BF16   ? 0x1p-8
                       : c == DEAR_COMPRESS_FP16 ? 0x1p-11
                       : c == DEAR_COMPRESS_INT8 ? 1.0 / 254
                                                 : 0x1p-24;
            double worst = 0, sq = 0;
            for (size_t i = 0; i < n; i++) {
                /* int8's error follows its block's largest value, not the element's (the data's is 1) */
                double mag = c == DEAR_COMPRESS_INT8 ? 1.0 : asum[i] / g_size;
                double e = fabs((double)((float *)b.recv)[i] - sum[i] / g_size) / (u * mag + 1e-300);
                worst = e > worst ? e : worst;
                sq += e * e;
            }
            int any = rc != DEAR_OK;
            MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            double rms = sqrt(sq / ((double)n * g_size));
            if (g_rank != 0)
                continue;
            if (any) {
                printf("%14s %8s %12s %12s\n", algo_names[a], dear_compress_name((dear_compress_t)c), "failed", "-");
                continue;
            }
            printf("%14s %8s %12.3f %12.3f\n", algo_names[a], dear_compress_name((dear_compress_t)c), worst, rms);
            if (csv)
                fprintf(csv, "%s,%s,%d,%zu,%.4f,%.4f\n", algo_names[a], dear_compress_name((dear_compress_t)c), g_size,
                        n, worst, rms);
            fflush(stdout);
        }
    bench_free(&b);
    free(x), free(ax), free(sum), free(asum);
}

/* One conversion step's median time over --iters, printed and written as a row. */
static void convert_row(const opts_t *o, FILE *csv, const char *step, dear_compress_t c, size_t n, double med)
{
    double mib = (double)(n * 4) / 1048576.0;
    printf("%10s %8s %12.1f %10.2f\n", step, dear_compress_name(c), med * 1e6 / mib, (double)(n * 4) / med / 1e9);
    if (csv)
        fprintf(csv, "%s,%s,%zu,%.3f,%.3f\n", step, dear_compress_name(c), n * 4, med * 1e6 / mib,
                (double)(n * 4) / med / 1e9);
}

/* int8's conversions (collectives/reduce.h): pack a vector into blocks, unpack it, and the
 * owner's add of one received chunk of n values into its float32 sum. */
static void convert_q8(const opts_t *o, FILE *csv, float *f, float *acc, double *t)
{
    size_t n = o->max_bytes / sizeof(float);
    void *q = malloc(dear_q8_bytes(n) + 1);
    if (q == NULL) {
        fprintf(stderr, "dear-coll-bench: out of memory for %zu elements\n", n);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    dear_reduce_q8_pack(q, f, NULL, n);
    static const char *const steps[3] = { "pack", "unpack", "add" };
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < o->warmup + o->iters; i++) {
            double t0 = dear_now();
            if (s == 0)
                dear_reduce_q8_pack(q, f, NULL, n);
            else
                dear_reduce_q8_unpack(s == 1 ? f : acc, q, n, s == 2);
            if (i >= o->warmup)
                t[i - o->warmup] = dear_now() - t0;
        }
        convert_row(o, csv, steps[s], DEAR_COMPRESS_INT8, n, median(t, o->iters));
    }
    free(q);
}

/* The conversions a compressed collective runs on the progress thread, through the host row as
 * the collectives do, per MiB of float32: pack (round the vector to 16 bits), unpack (widen it
 * back), and a ring hop (widen the received segment, add the own float32 input, round), in
 * 2048-element chunks as coll_wire_add runs it. Rank 0, --max bytes, median of --iters. */
static void run_convert(const opts_t *o, FILE *csv)
{
    if (g_rank != 0)
        return;
    const dear_mem_ops_t *m = &dear_mem_host_ops;
    size_t n = o->max_bytes / sizeof(float);
    float *f = malloc(n * sizeof(float)), *own = malloc(n * sizeof(float)), tmp[2048];
    uint16_t *h = malloc(n * sizeof(uint16_t)), *h2 = malloc(n * sizeof(uint16_t));
    double *t = malloc(sizeof(double) * (size_t)o->iters);
    if (!f || !own || !h || !h2 || !t) {
        fprintf(stderr, "dear-coll-bench: out of memory for %zu elements\n", n);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)rand_value(0, i);
        own[i] = (float)rand_value(1, i);
    }
    printf("# dear-coll-bench --convert: %zu bytes of float32, host row, one thread, median of %d\n", n * 4,
           o->iters);
    printf("%10s %8s %12s %10s\n", "step", "compress", "us/MiB", "GB/s");
    static const char *const steps[3] = { "pack", "unpack", "hop" };
    int only_none = 1;
    for (int c = DEAR_COMPRESS_BF16; c < DEAR_COMPRESS_COUNT; c++)
        only_none &= !o->compress[c];
    for (int c = DEAR_COMPRESS_BF16; c < DEAR_COMPRESS_COUNT; c++) {
        if (!o->compress[c] && !only_none)
            continue;
        if (c == DEAR_COMPRESS_INT8) {
            convert_q8(o, csv, f, own, t);
            continue;
        }
        dear_dtype_t w = dear_compress_dtype((dear_compress_t)c);
        m->narrow(NULL, w, h, own, n, 1.0);
        for (int s = 0; s < 3; s++) {
            for (int i = 0; i < o->warmup + o->iters; i++) {
                double t0 = dear_now();
                if (s == 0)
                    m->narrow(NULL, w, h2, f, n, 1.0);
                else if (s == 1)
                    m->widen(NULL, w, f, h, n);
                else
                    for (size_t k = 0; k < n; k += 2048) {
                        size_t len = n - k < 2048 ? n - k : 2048;
                        m->widen(NULL, w, tmp, h + k, len);
                        m->sum(NULL, DEAR_FLOAT32, tmp, tmp, own + k, len, 1.0);
                        m->narrow(NULL, w, h2 + k, tmp, len, 1.0);
                    }
                if (i >= o->warmup)
                    t[i - o->warmup] = dear_now() - t0;
            }
            convert_row(o, csv, steps[s], (dear_compress_t)c, n, median(t, o->iters));
        }
    }
    free(f), free(own), free(h), free(h2), free(t);
}

static void run_overlap(const opts_t *o, FILE *csv)
{
    helper_t h = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
    if (pthread_create(&h.th, NULL, helper_main, &h) != 0) {
        fprintf(stderr, "dear-coll-bench: cannot start the helper thread\n");
        MPI_Abort(MPI_COMM_WORLD, 4);
    }
    if (g_rank == 0) {
        printf("# dear-coll-bench --overlap: %d ranks, dtype %s, compute = sleep of t_pure (CPU free); "
               "ours advanced by a helper thread, ompi-nb by nobody; medians of %d\n",
               g_size, dear_dtype_name(o->dtype), o->iters);
        printf("%12s %8s %6s %14s %12s %14s %14s %10s\n", "size(B)", "type", "op", "algo",
               "t_pure(us)", "t_overall(us)", "t_compute(us)", "overlap%");
    }
    size_t es = dear_dtype_size(o->dtype);
    for (int op = 0; op < DEAR_COLL_ALLREDUCE; op++) {
        if (!o->ops[op])
            continue;
        for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 2) {
            size_t count = bytes / es;
            if (count == 0)
                continue;
            bench_t b;
            bench_setup(&b, (dear_coll_op_t)op, o->dtype, count, MPI_COMM_WORLD);
            for (int a = 0; a < A_COUNT; a++) {
                if (!o->algos[a] || a == A_OMPI_BLOCKING ||
                    (a == A_OMPI_NB && mpi_type(o->dtype) == MPI_DATATYPE_NULL))
                    continue;
                double t_pure = time_algo(&b, a, o);
                double *tov = malloc(sizeof(double) * (size_t)o->iters);
                double *tco = malloc(sizeof(double) * (size_t)o->iters);
                int fail = t_pure < 0;
                for (int i = 0; i < o->warmup + o->iters && !fail; i++) {
                    double ov, co, mx[2], loc[2];
                    MPI_Barrier(MPI_COMM_WORLD);
                    fail |= overlap_once(&b, a, t_pure, &h, &ov, &co) != DEAR_OK;
                    loc[0] = ov, loc[1] = co;
                    MPI_Allreduce(loc, mx, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                    if (i >= o->warmup)
                        tov[i - o->warmup] = mx[0], tco[i - o->warmup] = mx[1];
                }
                long wrong = fail ? (long)count : bench_verify(&b, 1.0, 0), total_wrong = 0;
                MPI_Reduce(&wrong, &total_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
                double t_ov = fail ? 0 : median(tov, o->iters), t_co = fail ? 0 : median(tco, o->iters);
                free(tov), free(tco);
                if (g_rank != 0)
                    continue;
                double pct = 100.0 - 100.0 * (t_ov - t_co) / t_pure;
                pct = fail ? 0 : pct < 0 ? 0 : pct;
                printf("%12zu %8s %6s %14s %12.1f %14.1f %14.1f %10.1f%s\n", count * es,
                       dear_dtype_name(o->dtype), op_short[op], algo_names[a], t_pure * 1e6, t_ov * 1e6,
                       t_co * 1e6, pct, total_wrong ? "  WRONG RESULT" : "");
                if (csv)
                    fprintf(csv, "%s,%s,%s,%zu,%zu,%d,%.3f,%.3f,%.3f,%.2f\n", op_short[op], algo_names[a],
                            dear_dtype_name(o->dtype), count * es, count, g_size, t_pure * 1e6,
                            t_ov * 1e6, t_co * 1e6, pct);
                fflush(stdout);
            }
            bench_free(&b);
        }
    }
    pthread_mutex_lock(&h.mu);
    h.quit = 1;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(h.th, NULL);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    dear_log_set_rank(g_rank);
    opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc == 0 && dear_params_load() != DEAR_OK)
        rc = -1;
    if (rc == 0 && o.overlap && provided < MPI_THREAD_MULTIPLE) {
        if (g_rank == 0)
            fprintf(stderr, "dear-coll-bench: --overlap needs MPI_THREAD_MULTIPLE\n");
        rc = -1;
    }
    if (rc != 0) {
        MPI_Finalize();
        return rc > 0 ? 0 : 2;
    }
    if (dear_coll_topo_create(MPI_COMM_WORLD, -1, &g_topo) != DEAR_OK)
        MPI_Abort(MPI_COMM_WORLD, 3);
    if (g_topo == NULL && o.algos[A_HIER]) {
        o.algos[A_HIER] = 0;
        if (g_rank == 0)
            fprintf(stderr, "dear-coll-bench: hier skipped: the job is not several hosts of as many ranks each\n");
    }
    /* --transport: the world's messages and hier's go over one transport, as the runtime's. */
    dear_transport_t *tp = NULL;
    if (o.transport == DEAR_TRANSPORT_AUTO)
        o.transport = DEAR_TRANSPORT_MPI;
    if (dear_transport_open(MPI_COMM_WORLD, o.transport, 1, &tp) != DEAR_OK ||
        dear_net_open(tp, MPI_COMM_WORLD, &g_net) != DEAR_OK || dear_coll_topo_attach(g_topo, tp) != DEAR_OK)
        MPI_Abort(MPI_COMM_WORLD, 3);
    /* The socket transport's limits: its largest vector, as float32 partial sums of 16-bit types,
     * a few in flight. */
    dear_transport_set_limits(tp, 2 * o.max_bytes, 8 * o.max_bytes);
    g_density = o.density;
    g_block = o.block;
    for (int k = 0; k < 17; k++) {
        sum_table[k] = 0;
        for (int r = 0; r < g_size; r++)
            sum_table[k] += value(r, (size_t)k);
    }
    FILE *csv = NULL;
    dear_file_out_t csv_out;
    if (g_rank == 0 && o.csv) {
        if (dear_file_out_open(&csv_out, o.csv, "CSV file") != DEAR_OK)
            MPI_Abort(MPI_COMM_WORLD, 2);
        csv = csv_out.f;
        fprintf(csv, o.scan      ? "dtype,bytes,block,density,nonzero,time_us,GBps\n"
                     : o.overlap ? "op,algo,dtype,bytes,count,nranks,t_pure_us,t_overall_us,t_compute_us,overlap_pct\n"
                     : o.accuracy ? "algo,compress,nranks,count,max_err_u,rms_err_u\n"
                     : o.convert ? "step,compress,bytes,us_per_MiB,GBps\n"
                                 : "op,algo,dtype,bytes,count,nranks,time_us,algbw_MBps,busbw_MBps,wrong,compress\n");
    }
    if (o.accuracy)
        run_accuracy(&o, csv);
    else if (o.convert)
        run_convert(&o, csv);
    else if (o.scan)
        run_scan(&o, csv);
    else if (o.overlap)
        run_overlap(&o, csv);
    else
        run_normal(&o, csv);
    if (csv && dear_file_out_commit(&csv_out) != DEAR_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    dear_coll_topo_free(g_topo, 0);
    dear_net_close(g_net);
    dear_transport_close(tp);
    MPI_Finalize();
    return 0;
}
