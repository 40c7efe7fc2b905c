/* dear-p2p: point-to-point streaming rate between two MPI ranks.
 *
 * The reference every collective figure is compared with (docs/PERFORMANCE.md: "busbw >= 90%
 * of the point-to-point rate"), so it measures what a bandwidth-bound collective can at best
 * get from one link: large messages streamed with several in flight, one way (rank 0 -> 1)
 * and both ways at once (each rank sends and receives; the rate reported is per direction).
 * The message count is sized from a short probe so each measurement lasts about --time
 * seconds at whatever rate the link has; the probe also warms the connection up (TCP slow
 * start, Open MPI's lazy connection set-up). Every received message is compared with the
 * pattern the sender wrote. MB/s means 10^6 bytes per second, as in nccl-tests' algbw. */
#include <getopt.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P2P_MAX_WINDOW 64

/* A failed MPI call ends the run: this is a measurement program, not library code. */
#define P2P_MPI(call)                                                         \
    do {                                                                      \
        int rc_ = (call);                                                     \
        if (rc_ != MPI_SUCCESS) {                                             \
            fprintf(stderr, "dear-p2p: %s failed (%d)\n", #call, rc_);        \
            MPI_Abort(MPI_COMM_WORLD, 1);                                     \
        }                                                                     \
    } while (0)

typedef struct {
    size_t size;     /* bytes per message */
    int window;      /* messages in flight per direction */
    double time_s;   /* target duration of one measurement */
    int reps;        /* measurements per mode; the median is reported */
    int csv;         /* CSV on stdout instead of the table */
    int modes;       /* bit 0: one way, bit 1: both ways */
} p2p_opts_t;

enum { MODE_ONEWAY = 1, MODE_BIDIR = 2 };

static void usage(FILE *f)
{
    fprintf(f,
        "usage: mpirun -np 2 dear-p2p [options]\n"
        "Streams large messages between rank 0 and rank 1 and prints the rate in MB/s (10^6 B/s).\n"
        "  --size BYTES     bytes per message (default 4194304; suffixes k, m: 1024-based)\n"
        "  --window N       messages in flight per direction, 1..%d (default 4)\n"
        "  --time S         seconds per measurement (default 1.0); the message count is sized\n"
        "                   from a short probe\n"
        "  --reps N         measurements per mode, the median is reported (default 3)\n"
        "  --mode M         oneway, bidir or both (default both)\n"
        "  --csv            print CSV (header: mode,bytes,msgs,window,reps,time_s,MBps,MBps_best,wrong)\n"
        "  --help           this text\n"
        "bidir: both ranks send and receive at once; MB/s is per direction.\n",
        P2P_MAX_WINDOW);
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return -1;
    if (*end == 'k' || *end == 'K') { v <<= 10; end++; }
    else if (*end == 'm' || *end == 'M') { v <<= 20; end++; }
    else if (*end == 'g' || *end == 'G') { v <<= 30; end++; }
    if (*end || v == 0)
        return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_opts(int argc, char **argv, p2p_opts_t *o)
{
    static const struct option longopts[] = {
        {"size", required_argument, 0, 's'}, {"window", required_argument, 0, 'w'},
        {"time", required_argument, 0, 't'}, {"reps", required_argument, 0, 'r'},
        {"mode", required_argument, 0, 'm'}, {"csv", no_argument, 0, 'c'},
        {"help", no_argument, 0, 'h'},       {0, 0, 0, 0}};
    p2p_opts_t d = {.size = 4u << 20, .window = 4, .time_s = 1.0, .reps = 3, .csv = 0,
                    .modes = MODE_ONEWAY | MODE_BIDIR};
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 's':
            if (parse_size(optarg, &d.size)) {
                fprintf(stderr, "dear-p2p: bad --size '%s': expected a positive byte count "
                                "(suffix k, m or g allowed)\n", optarg);
                return -1;
            }
            break;
        case 'w':
            d.window = (int)strtol(optarg, &end, 10);
            if (*end || d.window < 1 || d.window > P2P_MAX_WINDOW) {
                fprintf(stderr, "dear-p2p: bad --window '%s': expected 1..%d\n", optarg,
                        P2P_MAX_WINDOW);
                return -1;
            }
            break;
        case 't':
            d.time_s = strtod(optarg, &end);
            if (*end || !(d.time_s > 0 && d.time_s <= 600)) {
                fprintf(stderr, "dear-p2p: bad --time '%s': expected seconds in (0, 600]\n", optarg);
                return -1;
            }
            break;
        case 'r':
            d.reps = (int)strtol(optarg, &end, 10);
            if (*end || d.reps < 1 || d.reps > 1000) {
                fprintf(stderr, "dear-p2p: bad --reps '%s': expected 1..1000\n", optarg);
                return -1;
            }
            break;
        case 'm':
            if (!strcmp(optarg, "oneway")) d.modes = MODE_ONEWAY;
            else if (!strcmp(optarg, "bidir")) d.modes = MODE_BIDIR;
            else if (!strcmp(optarg, "both")) d.modes = MODE_ONEWAY | MODE_BIDIR;
            else {
                fprintf(stderr, "dear-p2p: bad --mode '%s': expected oneway, bidir or both\n", optarg);
                return -1;
            }
            break;
        case 'c': d.csv = 1; break;
        case 'h': return 1;
        default: return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dear-p2p: unexpected argument '%s' (see --help)\n", argv[optind]);
        return -1;
    }
    *o = d;
    return 0;
}

static void fill_pattern(unsigned char *buf, size_t size)
{
    uint32_t x = 2654435761u;
    for (size_t i = 0; i < size; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 24);
    }
}

/* Every message carries the same pattern except its first 8 bytes, which hold its sequence
 * number: MPI matches receives from one sender on one tag in posting order, so the receiver
 * knows which number each receive must see. */
typedef struct {
    unsigned char *send[P2P_MAX_WINDOW];
    unsigned char *recv[P2P_MAX_WINDOW];
    unsigned char *expect;
} p2p_bufs_t;

static void stamp(unsigned char *buf, size_t size, long m)
{
    uint64_t v = (uint64_t)m;
    memcpy(buf, &v, size < sizeof(v) ? size : sizeof(v));
}

static int check(const unsigned char *buf, const unsigned char *expect, size_t size, long m)
{
    unsigned char head[sizeof(uint64_t)];
    size_t h = size < sizeof(head) ? size : sizeof(head);
    uint64_t v = (uint64_t)m;
    memcpy(head, &v, sizeof(head));
    return memcmp(buf, head, h) == 0 && memcmp(buf + h, expect + h, size - h) == 0;
}

/* Streams nsend messages to and nrecv from peer, keeping `window` of each in flight.
 * Returns the number of messages received with wrong contents. */
static long stream(const p2p_opts_t *o, p2p_bufs_t *b, int peer, long nsend, long nrecv)
{
    MPI_Request req[2 * P2P_MAX_WINDOW];
    long slot_msg[2 * P2P_MAX_WINDOW];
    long sent = 0, recvd = 0, wrong = 0;
    int w = o->window;

    for (int i = 0; i < 2 * w; i++)
        req[i] = MPI_REQUEST_NULL;
    for (int i = 0; i < w && recvd < nrecv; i++, recvd++) {
        slot_msg[w + i] = recvd;
        P2P_MPI(MPI_Irecv(b->recv[i], (int)o->size, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &req[w + i]));
    }
    for (int i = 0; i < w && sent < nsend; i++, sent++) {
        slot_msg[i] = sent;
        stamp(b->send[i], o->size, sent);
        P2P_MPI(MPI_Isend(b->send[i], (int)o->size, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &req[i]));
    }
    for (;;) {
        int idx;
        P2P_MPI(MPI_Waitany(2 * w, req, &idx, MPI_STATUS_IGNORE));
        if (idx == MPI_UNDEFINED)
            break;
        if (idx < w) {
            if (sent < nsend) {
                slot_msg[idx] = sent;
                stamp(b->send[idx], o->size, sent++);
                P2P_MPI(MPI_Isend(b->send[idx], (int)o->size, MPI_BYTE, peer, 0, MPI_COMM_WORLD,
                                  &req[idx]));
            }
        } else {
            int s = idx - w;
            if (!check(b->recv[s], b->expect, o->size, slot_msg[idx]))
                wrong++;
            if (recvd < nrecv) {
                slot_msg[idx] = recvd++;
                P2P_MPI(MPI_Irecv(b->recv[s], (int)o->size, MPI_BYTE, peer, 0, MPI_COMM_WORLD,
                                  &req[idx]));
            }
        }
    }
    return wrong;
}

/* One timed measurement; returns seconds on rank 0 (the same value on both ranks) and adds
 * wrong messages seen anywhere to *wrong. */
static double measure(const p2p_opts_t *o, p2p_bufs_t *b, int mode, long nmsg, int rank, long *wrong)
{
    int peer = 1 - rank;
    long bad = 0, total = 0;
    char ack = 0;
    double t0, t;

    P2P_MPI(MPI_Barrier(MPI_COMM_WORLD));
    t0 = MPI_Wtime();
    if (mode == MODE_ONEWAY) {
        bad = stream(o, b, peer, rank == 0 ? nmsg : 0, rank == 1 ? nmsg : 0);
        /* The sender's clock stops when the receiver has everything, not when the last send
         * buffer is free (that can be long before the data arrives). */
        if (rank == 0)
            P2P_MPI(MPI_Recv(&ack, 1, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        else
            P2P_MPI(MPI_Send(&ack, 1, MPI_CHAR, peer, 1, MPI_COMM_WORLD));
    } else {
        bad = stream(o, b, peer, nmsg, nmsg);
    }
    t = MPI_Wtime() - t0;
    double tmax;
    P2P_MPI(MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    P2P_MPI(MPI_Allreduce(&bad, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    *wrong += total;
    return tmax;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int rank, size, prc;
    p2p_opts_t o;

    P2P_MPI(MPI_Init(&argc, &argv));
    P2P_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    P2P_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
    prc = parse_opts(argc, argv, &o);
    if (prc != 0) {
        if (rank == 0)
            usage(prc > 0 ? stdout : stderr);
        MPI_Finalize();
        return prc > 0 ? 0 : 2;
    }
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "dear-p2p: needs exactly 2 ranks (got %d): mpirun -np 2\n", size);
        MPI_Finalize();
        return 2;
    }
    if (o.size > (size_t)INT32_MAX) {
        if (rank == 0)
            fprintf(stderr, "dear-p2p: --size %zu is above %d bytes\n", o.size, INT32_MAX);
        MPI_Finalize();
        return 2;
    }

    p2p_bufs_t b;
    memset(&b, 0, sizeof(b));
    b.expect = malloc(o.size);
    if (!b.expect) {
        fprintf(stderr, "dear-p2p: rank %d: out of memory for %zu bytes\n", rank, o.size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fill_pattern(b.expect, o.size);
    for (int i = 0; i < o.window; i++) {
        b.send[i] = malloc(o.size);
        b.recv[i] = malloc(o.size);
        if (!b.send[i] || !b.recv[i]) {
            fprintf(stderr, "dear-p2p: rank %d: out of memory for 2 x %d x %zu bytes\n", rank,
                    o.window, o.size);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        memcpy(b.send[i], b.expect, o.size);
    }

    /* Probe: a few messages one way size the runs so each lasts about --time seconds. */
    long wrong = 0, probe_msgs = o.window + 1;
    double tp = measure(&o, &b, MODE_ONEWAY, probe_msgs, rank, &wrong);
    /* The first probe pays for connection set-up and first touch; the second one sizes. */
    tp = measure(&o, &b, MODE_ONEWAY, probe_msgs, rank, &wrong);
    long nmsg = (long)ceil(o.time_s * (double)probe_msgs / tp);
    if (nmsg < 2L * o.window)
        nmsg = 2L * o.window;
    if (nmsg > 1000000)
        nmsg = 1000000;
    P2P_MPI(MPI_Bcast(&nmsg, 1, MPI_LONG, 0, MPI_COMM_WORLD));

    double *times = malloc(sizeof(double) * (size_t)o.reps);
    if (!times) {
        fprintf(stderr, "dear-p2p: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
        if (o.csv)
            printf("mode,bytes,msgs,window,reps,time_s,MBps,MBps_best,wrong\n");
        else
            printf("# dear-p2p: %zu-byte messages, %d in flight, %ld per measurement, "
                   "median of %d (MB/s = 1e6 B/s, per direction)\n"
                   "#  %-7s %12s %8s %10s %10s %10s %6s\n", o.size, o.window, nmsg, o.reps,
                   "mode", "bytes", "msgs", "time_s", "MB/s", "best", "wrong");
    }
    for (int mode = MODE_ONEWAY; mode <= MODE_BIDIR; mode <<= 1) {
        if (!(o.modes & mode))
            continue;
        long mwrong = 0;
        for (int r = 0; r < o.reps; r++)
            times[r] = measure(&o, &b, mode, nmsg, rank, &mwrong);
        qsort(times, (size_t)o.reps, sizeof(double), cmp_double);
        double med = o.reps % 2 ? times[o.reps / 2]
                                : 0.5 * (times[o.reps / 2 - 1] + times[o.reps / 2]);
        double bytes = (double)o.size * (double)nmsg;
        double mbps = bytes / med / 1e6, best = bytes / times[0] / 1e6;
        const char *name = mode == MODE_ONEWAY ? "oneway" : "bidir";
        if (rank == 0) {
            if (o.csv)
                printf("%s,%zu,%ld,%d,%d,%.6f,%.2f,%.2f,%ld\n", name, o.size, nmsg, o.window,
                       o.reps, med, mbps, best, mwrong);
            else
                printf("   %-7s %12zu %8ld %10.4f %10.2f %10.2f %6ld\n", name, o.size, nmsg,
                       med, mbps, best, mwrong);
            fflush(stdout);
        }
        wrong += mwrong;
    }
    if (rank == 0 && wrong)
        fprintf(stderr, "dear-p2p: %ld messages arrived with wrong contents\n", wrong);

    free(times);
    for (int i = 0; i < o.window; i++) {
        free(b.send[i]);
        free(b.recv[i]);
    }
    free(b.expect);
    P2P_MPI(MPI_Finalize());
    return wrong ? 1 : 0;
}
