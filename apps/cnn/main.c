/*
 * dear-cnn: data-parallel training of a small CNN on Fashion-MNIST with libdear.
 *
 *     mpirun -np 4 --oversubscribe dear-cnn      (5 epochs, about 91% test accuracy, ~2 min on
 *                                                 2 cores)
 *
 * Every rank holds the whole model and trains on its shard of every global batch (--batch is
 * the global batch, split evenly). libdear averages the gradients: the trainer tells it where
 * the model is (dear_forward_begin before each layer's forward, dear_backward_done after each
 * layer's backward, dear_backward_end after the pass) and registers one update function per
 * tensor, SGD with momentum and weight decay, which the runtime calls the moment that tensor's
 * averaged gradient is in place. The same code runs under every schedule (--schedule
 * dear|wfbp|sync). With --shard each rank keeps the momentum of its slices of every tensor only
 * (1/P of it) and updates those; libdear's all-gathers carry the parameters, and a checkpoint
 * gathers the momentum on rank 0, so the file is the same as unsharded and resumes either way
 * on any number of ranks. The model itself is in model.c, the data loader in data.c.
 *
 * Sections: options; the trainer (data, dear hooks, update); checkpoints; evaluation; main.
 *
 * Errors: bad options and data are found on every rank before any collective call, so all
 * ranks exit with the same message instead of hanging. The trainer's own MPI calls keep MPI's
 * default MPI_ERRORS_ARE_FATAL handler (an MPI failure ends the job); a dear failure in the
 * training loop aborts the job with the status string, since other ranks may be waiting in a
 * collective that can no longer complete.
 */
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "include/dear.h"
#include "apps/cnn/data.h"
#include "apps/cnn/model.h"

/* Fashion-MNIST pixel statistics (mean and standard deviation of x/255 over the training set). */
#define PIXEL_MEAN 0.2860
#define PIXEL_STD 0.3530

/* ---------------------------------------------------------------------------------------------
 * Options
 */
typedef struct {
    const char *data_dir;
    int epochs;
    long iters;          /* > 0: stop after this global iteration (counted from the start) */
    int batch;           /* global batch */
    double lr, momentum, wd;
    int cosine;          /* cosine decay of lr to 0 over the run */
    long warmup;         /* linear warm-up of lr over the first iterations */
    uint64_t seed;
    int log_every;
    const char *schedule;     /* NULL: DEAR_SCHEDULE or the library default */
    const char *profile_out;
    const char *ckpt;
    long ckpt_every;
    const char *resume;
    int train_limit, test_limit;
    int shard;                /* --shard: sharded updates (dear_set_shard) */
    int ckpt_test_crash;      /* hidden: _exit halfway through writing checkpoint number N */
} options_t;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: mpirun -np P dear-cnn [options]\n"
        "Data-parallel training of a small CNN (conv5x5 16 - pool - conv5x5 32 - pool - fc 128 -\n"
        "fc 10) on Fashion-MNIST, gradients averaged by libdear.\n\n"
        "  --data DIR         Fashion-MNIST IDX files (.gz or plain) [%s]\n"
        "  --epochs N         passes over the training set [5]\n"
        "  --iters N          stop after global iteration N instead (counted from the start of\n"
        "                     training, also after --resume); 0: run --epochs [0]\n"
        "  --batch B          global batch, split evenly over the ranks [64]\n"
        "  --lr X             peak learning rate [0.06]\n"
        "  --lr-schedule S    const or cosine (decay to 0 over the whole run) [cosine]\n"
        "  --warmup N         raise lr linearly over the first N iterations [200]\n"
        "  --momentum X       SGD momentum [0.9]\n"
        "  --wd X             weight decay on weights (not biases) [5e-4]\n"
        "  --seed N           initialisation and shuffling seed; same seed, same run [1]\n"
        "  --log-every N      progress line every N iterations; 0: none [100]\n"
        "  --schedule S       dear, wfbp or sync (sets DEAR_SCHEDULE) [DEAR_SCHEDULE or dear]\n"
        "  --shard            sharded updates: each rank keeps and steps the momentum of its 1/P\n"
        "                     slice of every tensor; the all-gathers carry the parameters\n"
        "  --profile-out FILE write the measured per-layer profile (dear-plan's format)\n"
        "  --ckpt FILE        checkpoint file, written atomically by rank 0\n"
        "  --ckpt-every N     write a checkpoint every N iterations and after the last (needs --ckpt)\n"
        "  --resume FILE      continue exactly where the run that wrote FILE stopped\n"
        "  --train-limit N    use only the first N training images (quick tests) [all]\n"
        "  --test-limit N     use only the first N test images [all]\n"
        "  --help             this text\n",
        CNN_DATA_DEFAULT_DIR);
}

/* Every rank parses the same argv, so all ranks reach the same verdict without talking. */
static int parse_long(const char *opt, const char *s, long lo, long hi, long *out, char *err,
                      size_t errlen)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        snprintf(err, errlen, "%s '%s': expected an integer in [%ld, %ld]", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out,
                        char *err, size_t errlen)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        snprintf(err, errlen, "%s '%s': expected a number in [%g, %g]", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Returns 0 to train, 1 for --help, -1 on a bad argument (message in err). */
static int parse_args(int argc, char **argv, options_t *o, char *err, size_t errlen)
{
    *o = (options_t){.data_dir = CNN_DATA_DEFAULT_DIR, .epochs = 5, .batch = 64, .lr = 0.06,
                     .momentum = 0.9, .wd = 5e-4, .cosine = 1, .warmup = 200, .seed = 1, .log_every = 100};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 1;
        if (!strcmp(a, "--shard")) {
            o->shard = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s' (options start with --; see --help)", a);
            return -1;
        }
        if (i + 1 >= argc) {
            snprintf(err, errlen, "%s needs a value (see --help)", a);
            return -1;
        }
        const char *v = argv[++i];
        long n;
        int rc = 0;
        if (!strcmp(a, "--data")) {
            o->data_dir = v;
        } else if (!strcmp(a, "--epochs")) {
            rc = parse_long(a, v, 1, 100000, &n, err, errlen);
            o->epochs = (int)n;
        } else if (!strcmp(a, "--iters")) {
            rc = parse_long(a, v, 0, LONG_MAX / 2, &o->iters, err, errlen);
        } else if (!strcmp(a, "--batch")) {
            rc = parse_long(a, v, 1, 1 << 20, &n, err, errlen);
            o->batch = (int)n;
        } else if (!strcmp(a, "--lr")) {
            rc = parse_double(a, v, 0, 100, &o->lr, err, errlen);
        } else if (!strcmp(a, "--lr-schedule")) {
            if (!strcmp(v, "const") || !strcmp(v, "cosine")) {
                o->cosine = !strcmp(v, "cosine");
            } else {
                snprintf(err, errlen, "--lr-schedule '%s': expected const or cosine", v);
                rc = -1;
            }
        } else if (!strcmp(a, "--warmup")) {
            rc = parse_long(a, v, 0, LONG_MAX / 2, &o->warmup, err, errlen);
        } else if (!strcmp(a, "--momentum")) {
            rc = parse_double(a, v, 0, 0.9999, &o->momentum, err, errlen);
        } else if (!strcmp(a, "--wd")) {
            rc = parse_double(a, v, 0, 1, &o->wd, err, errlen);
        } else if (!strcmp(a, "--seed")) {
            rc = parse_long(a, v, 0, LONG_MAX, &n, err, errlen);
            o->seed = (uint64_t)n;
        } else if (!strcmp(a, "--log-every")) {
            rc = parse_long(a, v, 0, INT_MAX, &n, err, errlen);
            o->log_every = (int)n;
        } else if (!strcmp(a, "--schedule")) {
            if (strcmp(v, "dear") && strcmp(v, "wfbp") && strcmp(v, "sync")) {
                snprintf(err, errlen, "--schedule '%s': expected dear, wfbp or sync", v);
                rc = -1;
            }
            o->schedule = v;
        } else if (!strcmp(a, "--profile-out")) {
            o->profile_out = v;
        } else if (!strcmp(a, "--ckpt")) {
            o->ckpt = v;
        } else if (!strcmp(a, "--ckpt-every")) {
            rc = parse_long(a, v, 1, LONG_MAX / 2, &o->ckpt_every, err, errlen);
        } else if (!strcmp(a, "--resume")) {
            o->resume = v;
        } else if (!strcmp(a, "--train-limit")) {
            rc = parse_long(a, v, 1, INT_MAX, &n, err, errlen);
            o->train_limit = (int)n;
        } else if (!strcmp(a, "--test-limit")) {
            rc = parse_long(a, v, 1, INT_MAX, &n, err, errlen);
            o->test_limit = (int)n;
        } else if (!strcmp(a, "--ckpt-test-crash")) {
            rc = parse_long(a, v, 1, INT_MAX, &n, err, errlen);
            o->ckpt_test_crash = (int)n;
        } else {
            snprintf(err, errlen, "unknown option '%s' (see --help)", a);
            rc = -1;
        }
        if (rc != 0)
            return -1;
    }
    if (o->ckpt_every && !o->ckpt) {
        snprintf(err, errlen, "--ckpt-every needs --ckpt FILE");
        return -1;
    }
    if (o->ckpt && !o->ckpt_every) {
        snprintf(err, errlen, "--ckpt needs --ckpt-every N");
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The trainer
 */
typedef struct trainer trainer_t;

/* One registered tensor: where its weights and momentum are. */
typedef struct {
    trainer_t *t;
    int index;
} slot_t;

struct trainer {
    options_t opt;
    int rank, size;
    MPI_Comm comm;            /* the trainer's own duplicate for losses, accuracy, checkpoints */
    cnn_model_t model;
    float *momentum;          /* one allocation, the parameters' layout; --shard: this rank's
                               * slices back to back (dear_shard_slices) */
    size_t nmomentum;
    cnn_dataset_t train, test;
    int local_batch;
    long iters_per_epoch;
    long total_iters;
    long iter;                /* completed iterations */
    long iter0;               /* iterations completed before dear_commit (a resumed run's) */
    uint32_t *perm;           /* shuffled training indices of perm_epoch */
    long perm_epoch;
    slot_t slots[CNN_NTENSORS];
    dear_ctx_t *dear;
    int ckpts_written;
};

static void die_dear(trainer_t *t, const char *what, int rc)
{
    fflush(stdout); /* MPI_Abort may end the process before stdio's buffers reach the launcher */
    fprintf(stderr, "dear-cnn: rank %d: %s failed: %s\n", t->rank, what, dear_status_string(rc));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void trainer_free(trainer_t *t);

/* Every rank knows that the job failed: end it with `status` through MPI_Finalize, not
 * MPI_Abort, which lets a launcher (MPICH's hydra) drop the messages that say why. */
static void end_together(trainer_t *t, int status)
{
    fflush(stdout);
    dear_finalize(&t->dear);
    trainer_free(t);
    MPI_Finalize();
    exit(status);
}

/* A libdear call made on every rank: all learn whether it failed anywhere. Failed everywhere (a
 * bad setting, a refused file): rank 0 says why and the job ends together. Failed on some ranks
 * only: those say why and the job aborts, since the others hold state the failed ones cannot meet. */
static void check_everywhere(trainer_t *t, const char *what, int rc)
{
    int v[2] = { rc == DEAR_OK, -(rc == DEAR_OK) }; /* min and -max of "succeeded" */
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, t->comm);
    if (v[0])
        return;
    if (v[1] == 0) {
        if (t->rank == 0)
            fprintf(stderr, "dear-cnn: %s failed on every rank: %s\n", what, dear_status_string(rc));
        end_together(t, 1);
    }
    if (rc != DEAR_OK)
        die_dear(t, what, rc);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Learning rate of update number `step` (0-based): linear warm-up (the first steps of a fresh
 * network are the least stable), then constant or cosine decay to 0 at the last iteration. */
static double lr_at(const trainer_t *t, uint64_t step)
{
    double lr = t->opt.lr;
    if ((long)step < t->opt.warmup)
        lr *= (double)(step + 1) / (double)t->opt.warmup;
    if (t->opt.cosine && t->total_iters > 0) {
        double frac = (double)step / (double)t->total_iters;
        lr *= 0.5 * (1.0 + cos(M_PI * (frac > 1 ? 1 : frac)));
    }
    return lr;
}

/* dear_update_fn: SGD with momentum and weight decay (weights only, not biases) on the averaged
 * gradient: v = mu v + (g + wd w); w -= lr v. The learning rate is that of the iteration the
 * gradient belongs to, which dear reports: under `dear` the update of iteration k runs during
 * the forward pass of iteration k+1. */
static int sgd_update(const dear_update_info_t *u)
{
    slot_t *s = u->arg;
    trainer_t *t = s->t;
    size_t count = u->count;
    if (u->dtype != DEAR_FLOAT32 || u->offset + count > t->model.count[s->index])
        return -1;
    /* The whole tensor, or under --shard one slice of it with its momentum in the shard. */
    float *w = u->param;
    float *v = t->opt.shard ? t->momentum + u->shard_offset
                            : t->momentum + t->model.offset[s->index] + u->offset;
    const float *g = u->grad;
    const float lr = (float)lr_at(t, (uint64_t)(t->iter0 + u->iteration));
    const float mu = (float)t->opt.momentum;
    const float wd = s->index % 2 == 0 ? (float)t->opt.wd : 0.0f; /* even index: a weight */
    for (size_t i = 0; i < count; i++) {
        float gi = g[i] + wd * w[i];
        v[i] = mu * v[i] + gi;
        w[i] -= lr * v[i];
    }
    return 0;
}

/* Model hook: tell dear where the model is. */
static int dear_hook(void *arg, int event, int layer)
{
    trainer_t *t = arg;
    int rc = event == CNN_HOOK_FORWARD_BEGIN ? dear_forward_begin(t->dear, layer)
                                             : dear_backward_done(t->dear, layer);
    if (rc != DEAR_OK)
        die_dear(t, event == CNN_HOOK_FORWARD_BEGIN ? "dear_forward_begin" : "dear_backward_done",
                 rc);
    return 0;
}

/* The permutation of epoch e depends only on (seed, e): a resumed run rebuilds it from the
 * checkpoint's seed and iteration alone. */
static void shuffle_epoch(trainer_t *t, long epoch)
{
    cnn_rng_t rng = {t->opt.seed * 0x2545F4914F6CDD1Dull + (uint64_t)epoch + 1};
    for (int i = 0; i < t->train.n; i++)
        t->perm[i] = (uint32_t)i;
    for (int i = t->train.n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)cnn_rng_below(&rng, (uint64_t)i + 1);
        uint32_t tmp = t->perm[i];
        t->perm[i] = t->perm[j];
        t->perm[j] = tmp;
    }
    t->perm_epoch = epoch;
}

static void load_images(float *x, uint8_t *labels, const cnn_dataset_t *ds, const uint32_t *idx,
                        int first, int n)
{
    const size_t px = (size_t)ds->rows * ds->cols;
    const float scale = (float)(1.0 / (255.0 * PIXEL_STD));
    const float shift = (float)(PIXEL_MEAN / PIXEL_STD);
    for (int j = 0; j < n; j++) {
        size_t src = idx ? idx[first + j] : (size_t)(first + j);
        const uint8_t *img = ds->images + src * px;
        for (size_t p = 0; p < px; p++)
            x[(size_t)j * px + p] = img[p] * scale - shift;
        labels[j] = ds->labels[src];
    }
}

/* One iteration on this rank's shard of global batch t->iter; returns the local mean loss. */
static double train_step(trainer_t *t, uint8_t *labels)
{
    long epoch = t->iter / t->iters_per_epoch;
    long pos = t->iter % t->iters_per_epoch;
    if (epoch != t->perm_epoch)
        shuffle_epoch(t, epoch);
    int first = (int)(pos * t->opt.batch + (long)t->rank * t->local_batch);
    load_images(t->model.x, labels, &t->train, t->perm, first, t->local_batch);
    int status;
    double loss = cnn_forward(&t->model, t->model.x, labels, t->local_batch, &status);
    cnn_backward(&t->model, labels); /* hooks abort on error */
    int rc = dear_backward_end(t->dear);
    if (rc != DEAR_OK)
        die_dear(t, "dear_backward_end", rc);
    t->iter++;
    return loss;
}

/* ---------------------------------------------------------------------------------------------
 * Checkpoints: one file, native byte order, rank 0 writes. Layout:
 *   char magic[8] "DEARCNN1"; uint32 version; uint32 nparams; uint64 iteration; uint64 seed;
 *   uint32 global batch; uint32 training images; double lr, momentum, wd;
 *   float params[nparams]; float momentum[nparams]; uint32 crc32 of everything before it.
 * The data position and the shuffling RNG follow from (seed, iteration, batch, images).
 */
#define CKPT_MAGIC "DEARCNN1"
#define CKPT_VERSION 1u
#define CKPT_HEADER (8 + 4 + 4 + 8 + 8 + 4 + 4 + 3 * 8)

static size_t ckpt_size(size_t nparams)
{
    return CKPT_HEADER + 2 * nparams * sizeof(float) + 4;
}

static void put(unsigned char **p, const void *v, size_t n)
{
    memcpy(*p, v, n);
    *p += n;
}

static unsigned char *ckpt_serialise(const trainer_t *t, const float *momentum, size_t *len)
{
    const size_t np = t->model.nparams;
    size_t n = ckpt_size(np);
    unsigned char *buf = malloc(n), *p = buf;
    if (!buf)
        return NULL;
    uint32_t version = CKPT_VERSION, nparams = (uint32_t)np, batch = (uint32_t)t->opt.batch,
             ntrain = (uint32_t)t->train.n;
    uint64_t iter = (uint64_t)t->iter, seed = t->opt.seed;
    put(&p, CKPT_MAGIC, 8);
    put(&p, &version, 4);
    put(&p, &nparams, 4);
    put(&p, &iter, 8);
    put(&p, &seed, 8);
    put(&p, &batch, 4);
    put(&p, &ntrain, 4);
    put(&p, &t->opt.lr, 8);
    put(&p, &t->opt.momentum, 8);
    put(&p, &t->opt.wd, 8);
    put(&p, t->model.params, np * sizeof(float));
    put(&p, momentum, np * sizeof(float));
    uint32_t crc = (uint32_t)crc32(0L, buf, (uInt)(p - buf));
    put(&p, &crc, 4);
    *len = n;
    return buf;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The checkpoint path may be a regular file (replaced) or nothing yet; a link, a device or a
 * FIFO is refused, never written through or replaced. */
static int ckpt_target_ok(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : (fprintf(stderr, "dear-cnn: checkpoint %s: %s\n", path, strerror(errno)), -1);
    if (S_ISREG(st.st_mode))
        return 0;
    fprintf(stderr, "dear-cnn: checkpoint %s is %s; refused (accepted: a regular file or a path that does not "
                    "exist yet)\n",
            path, S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file");
    return -1;
}

/* A fresh temporary file (mkstemp: an unpredictable name, created exclusively, so a link planted
 * next to the checkpoint is never followed), fsync, rename over the old checkpoint, fsync of the
 * folder: a crash at any point leaves either the old or the new checkpoint, never a torn one. */
static int ckpt_write(trainer_t *t, const float *momentum)
{
    const char *path = t->opt.ckpt;
    char tmp[4096], dir[4096];
    size_t len;
    if (ckpt_target_ok(path) != 0)
        return -1;
    unsigned char *buf = ckpt_serialise(t, momentum, &len);
    if (!buf) {
        fprintf(stderr, "dear-cnn: out of memory writing checkpoint %s\n", path);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0 || fchmod(fd, 0644) != 0) {
        fprintf(stderr, "dear-cnn: cannot create a temporary file %s: %s\n", tmp, strerror(errno));
        if (fd >= 0) {
            close(fd);
            goto err_unlink;
        }
        goto err_free;
    }
    t->ckpts_written++;
    if (t->opt.ckpt_test_crash == t->ckpts_written) {
        /* Test hook: die halfway through the write, as a killed process would. */
        if (write_all(fd, buf, len / 2) == 0)
            fsync(fd);
        fprintf(stderr, "dear-cnn: --ckpt-test-crash: exiting halfway through checkpoint %d\n",
                t->ckpts_written);
        _exit(42);
    }
    if (write_all(fd, buf, len) != 0 || fsync(fd) != 0) {
        fprintf(stderr, "dear-cnn: cannot write %s: %s\n", tmp, strerror(errno));
        close(fd);
        goto err_unlink;
    }
    if (close(fd) != 0) {
        fprintf(stderr, "dear-cnn: cannot close %s: %s\n", tmp, strerror(errno));
        goto err_unlink;
    }
    if (ckpt_target_ok(path) != 0) /* what is at path may have changed during the write */
        goto err_unlink;
    if (rename(tmp, path) != 0) {
        fprintf(stderr, "dear-cnn: cannot rename %s to %s: %s\n", tmp, path, strerror(errno));
        goto err_unlink;
    }
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd < 0 || fsync(dfd) != 0) {
        fprintf(stderr, "dear-cnn: cannot fsync folder %s: %s\n", dir, strerror(errno));
        if (dfd >= 0)
            close(dfd);
        free(buf);
        return -1;
    }
    close(dfd);
    free(buf);
    return 0;

err_unlink:
    unlink(tmp);
err_free:
    free(buf);
    return -1;
}

/* Rank 0 reads and checks the file; every rank gets the bytes (the file need not be on a
 * shared file system). Returns 0 with *out malloc'ed, or -1 on every rank (rank 0 says why). */
static int ckpt_read_bcast(trainer_t *t, const char *path, unsigned char **out)
{
    const size_t want = ckpt_size(t->model.nparams);
    long long len = -1;
    unsigned char *buf = malloc(want);
    if (!buf) {
        fprintf(stderr, "dear-cnn: out of memory reading %s\n", path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (t->rank == 0) {
        /* O_NONBLOCK: a FIFO must be refused, not waited on. */
        int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        FILE *f = NULL;
        struct stat st;
        if (fd < 0) {
            fprintf(stderr, "dear-cnn: cannot open checkpoint %s: %s\n", path, strerror(errno));
        } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            fprintf(stderr, "dear-cnn: checkpoint %s is not a regular file; refused\n", path);
            close(fd);
        } else if (!(f = fdopen(fd, "rb"))) {
            fprintf(stderr, "dear-cnn: cannot read checkpoint %s: %s\n", path, strerror(errno));
            close(fd);
        } else if ((size_t)st.st_size < CKPT_HEADER ||
                   fread(buf, 1, CKPT_HEADER, f) != CKPT_HEADER ||
                   memcmp(buf, CKPT_MAGIC, 8) != 0) {
            fprintf(stderr, "dear-cnn: %s is not a dear-cnn checkpoint (bad header)\n", path);
        } else {
            uint32_t version, nparams;
            memcpy(&version, buf + 8, 4);
            memcpy(&nparams, buf + 12, 4);
            if (version != CKPT_VERSION)
                fprintf(stderr, "dear-cnn: %s: checkpoint version %u, this program reads %u\n",
                        path, version, CKPT_VERSION);
            else if (nparams != t->model.nparams)
                fprintf(stderr, "dear-cnn: %s holds %u parameters, this model has %zu\n", path,
                        nparams, t->model.nparams);
            else if ((size_t)st.st_size != want)
                fprintf(stderr, "dear-cnn: %s is %lld bytes, expected %zu (truncated?)\n", path,
                        (long long)st.st_size, want);
            else if (fread(buf + CKPT_HEADER, 1, want - CKPT_HEADER, f) != want - CKPT_HEADER)
                fprintf(stderr, "dear-cnn: cannot read %s: %s\n", path, strerror(errno));
            else {
                uint32_t crc;
                memcpy(&crc, buf + want - 4, 4);
                if (crc != (uint32_t)crc32(0L, buf, (uInt)(want - 4)))
                    fprintf(stderr, "dear-cnn: %s: checksum mismatch (corrupt checkpoint)\n",
                            path);
                else
                    len = (long long)want;
            }
        }
        if (f)
            fclose(f);
    }
    MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, t->comm);
    if (len < 0) {
        free(buf);
        return -1;
    }
    MPI_Bcast(buf, (int)want, MPI_BYTE, 0, t->comm);
    *out = buf;
    return 0;
}

/* Apply a checkpoint read by ckpt_read_bcast. Every rank checks the same bytes against the same
 * options, so all agree. */
static int ckpt_apply(trainer_t *t, const unsigned char *buf, const char *path)
{
    const size_t np = t->model.nparams;
    uint64_t iter, seed;
    uint32_t batch, ntrain;
    double lr, mom, wd;
    memcpy(&iter, buf + 16, 8);
    memcpy(&seed, buf + 24, 8);
    memcpy(&batch, buf + 32, 4);
    memcpy(&ntrain, buf + 36, 4);
    memcpy(&lr, buf + 40, 8);
    memcpy(&mom, buf + 48, 8);
    memcpy(&wd, buf + 56, 8);
    if ((int)batch != t->opt.batch) {
        if (t->rank == 0)
            fprintf(stderr, "dear-cnn: %s was written with --batch %u; resume with the same batch "
                    "(got %d)\n", path, batch, t->opt.batch);
        return -1;
    }
    if ((int)ntrain != t->train.n) {
        if (t->rank == 0)
            fprintf(stderr, "dear-cnn: %s was written with %u training images, this run has %d "
                    "(use the same --train-limit)\n", path, ntrain, t->train.n);
        return -1;
    }
    if (t->rank == 0 && (seed != t->opt.seed || lr != t->opt.lr || mom != t->opt.momentum ||
                         wd != t->opt.wd))
        fprintf(stderr, "dear-cnn: note: resuming with the checkpoint's seed %llu; lr/momentum/wd "
                "from the command line (%g/%g/%g; checkpoint %g/%g/%g)\n",
                (unsigned long long)seed, t->opt.lr, t->opt.momentum, t->opt.wd, lr, mom, wd);
    t->opt.seed = seed;
    memcpy(t->model.params, buf + CKPT_HEADER, np * sizeof(float));
    memcpy(t->momentum, buf + CKPT_HEADER + np * sizeof(float), np * sizeof(float));
    t->iter = (long)iter;
    return 0;
}

/* --shard: every rank's slices of the momentum placed in full, the parameters' layout, on
 * rank 0 (full: nparams floats there, NULL elsewhere). So a checkpoint is the unsharded one: it
 * resumes sharded or not, on any number of ranks; the price is one whole momentum on rank 0
 * while it writes. Collective; 0, or -1 when rank 0 ran out of memory. */
static int gather_momentum(trainer_t *t, float *full)
{
    int n = t->size, *counts = calloc((size_t)n, sizeof *counts), *displs = calloc((size_t)n, sizeof *displs);
    float *all = NULL;
    int ok = counts && displs;
    size_t total = t->model.nparams;
    if (ok && t->rank == 0) {
        all = malloc(total * sizeof *all);
        ok = all != NULL;
    }
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, t->comm);
    int mine = (int)t->nmomentum;
    if (ok)
        MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, t->comm);
    for (int r = 1; ok && r < n; r++)
        displs[r] = displs[r - 1] + counts[r - 1];
    if (ok)
        MPI_Gatherv(t->momentum, mine, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0, t->comm);
    for (int r = 0; ok && t->rank == 0 && r < n; r++) {
        int ns = dear_shard_slices(t->dear, r, NULL, 0);
        dear_slice_t *sl = ns > 0 ? calloc((size_t)ns, sizeof *sl) : NULL;
        if (ns < 0 || (ns > 0 && (!sl || dear_shard_slices(t->dear, r, sl, ns) != ns))) {
            fprintf(stderr, "dear-cnn: the slices of rank %d: %s\n", r,
                    ns < 0 ? dear_status_string(ns) : "out of memory");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (int k = 0; k < ns; k++)
            memcpy(full + t->model.offset[sl[k].tensor] + sl[k].offset, all + displs[r] + sl[k].shard_offset,
                   sl[k].count * sizeof *full);
        free(sl);
    }
    free(all);
    free(counts);
    free(displs);
    return ok ? 0 : -1;
}

/* Collective: complete every pending update, then rank 0 writes; a failed write ends the job
 * (the run would otherwise go on without the checkpoints it was asked for). */
static void checkpoint(trainer_t *t)
{
    int rc = dear_flush(t->dear);
    if (rc != DEAR_OK)
        die_dear(t, "dear_flush", rc);
    float *full = t->momentum;
    int ok = 1;
    if (t->opt.shard) {
        full = t->rank == 0 ? malloc(t->model.nparams * sizeof *full) : NULL;
        ok = (t->rank != 0 || full) && gather_momentum(t, full) == 0;
        if (!ok && t->rank == 0)
            fprintf(stderr, "dear-cnn: out of memory gathering the momentum for checkpoint %s\n", t->opt.ckpt);
    }
    if (ok && t->rank == 0)
        ok = ckpt_write(t, full) == 0;
    if (full != t->momentum)
        free(full);
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, t->comm);
    if (!ok)
        end_together(t, 1);
}

/* ---------------------------------------------------------------------------------------------
 * Evaluation: each rank scores a contiguous share of the test set; the counts are summed.
 */
static double evaluate(trainer_t *t, long *correct_out)
{
    const int n = t->test.n;
    int lo = (int)((long)n * t->rank / t->size), hi = (int)((long)n * (t->rank + 1) / t->size);
    long correct = 0;
    /* Every update in place first, and nothing of this enters dear's profile. */
    int rc = dear_set_mode(t->dear, DEAR_MODE_EVAL);
    if (rc != DEAR_OK)
        die_dear(t, "dear_set_mode(DEAR_MODE_EVAL)", rc);
    uint8_t *labels = malloc((size_t)t->model.max_batch);
    if (!labels) {
        fprintf(stderr, "dear-cnn: out of memory in evaluation\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = lo; i < hi; i += t->model.max_batch) {
        int b = hi - i < t->model.max_batch ? hi - i : t->model.max_batch;
        int status;
        load_images(t->model.x, labels, &t->test, NULL, i, b);
        cnn_forward(&t->model, t->model.x, NULL, b, &status);
        for (int j = 0; j < b; j++)
            correct += cnn_predict(&t->model, j) == labels[j];
    }
    free(labels);
    rc = dear_set_mode(t->dear, DEAR_MODE_TRAIN);
    if (rc != DEAR_OK)
        die_dear(t, "dear_set_mode(DEAR_MODE_TRAIN)", rc);
    MPI_Allreduce(MPI_IN_PLACE, &correct, 1, MPI_LONG, MPI_SUM, t->comm);
    *correct_out = correct;
    return (double)correct / n;
}

/* ---------------------------------------------------------------------------------------------
 * main and its steps: options, set-up, the training loop, the final report
 */

/* Every rank reports its own failure; all ranks learn whether any failed (no one hangs). */
static int all_ok(MPI_Comm comm, int ok)
{
    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
    return all;
}

/* Options, checked on every rank alike: 0 to train, 1 after --help (printed by rank 0), -1 on a
 * bad one (rank 0 says why). */
static int check_options(trainer_t *t, int argc, char **argv)
{
    char err[4096];
    int prc = parse_args(argc, argv, &t->opt, err, sizeof err);
    if (prc == 1) {
        if (t->rank == 0)
            usage(stdout);
        return 1;
    }
    if (prc == 0 && t->opt.batch % t->size != 0) {
        snprintf(err, sizeof err,
                 "--batch %d does not divide across %d ranks: use a multiple of %d", t->opt.batch,
                 t->size, t->size);
        prc = -1;
    }
    if (prc != 0 && t->rank == 0)
        fprintf(stderr, "dear-cnn: %s\n", err);
    return prc;
}

/* Data, model and optimiser state. Every rank reads the files itself and reports its own
 * failure; returns 1 when this rank is ready. */
static int load_data_and_model(trainer_t *t)
{
    const options_t *o = &t->opt;
    char err[4096];
    int ok = 1;
    if (cnn_data_load(o->data_dir, "train", o->train_limit, &t->train, err, sizeof err) != 0 ||
        cnn_data_load(o->data_dir, "t10k", o->test_limit, &t->test, err, sizeof err) != 0) {
        fprintf(stderr, "dear-cnn: rank %d: %s\n", t->rank, err);
        ok = 0;
    }
    cnn_config_t cfg = cnn_config_default();
    if (ok && (t->train.rows != cfg.in_h || t->train.cols != cfg.in_w ||
               t->test.rows != cfg.in_h || t->test.cols != cfg.in_w)) {
        fprintf(stderr, "dear-cnn: rank %d: images are %dx%d (test %dx%d), the model takes %dx%d\n",
                t->rank, t->train.rows, t->train.cols, t->test.rows, t->test.cols, cfg.in_h,
                cfg.in_w);
        ok = 0;
    }
    if (ok && t->train.n < o->batch) {
        fprintf(stderr, "dear-cnn: rank %d: %d training images are fewer than one batch of %d\n",
                t->rank, t->train.n, o->batch);
        ok = 0;
    }
    int max_batch = t->local_batch > 256 ? t->local_batch : 256;
    if (ok && cnn_model_create(&t->model, &cfg, max_batch, err, sizeof err) != 0) {
        fprintf(stderr, "dear-cnn: rank %d: %s\n", t->rank, err);
        ok = 0;
    }
    if (ok) {
        t->momentum = calloc(t->model.nparams, sizeof(float));
        t->nmomentum = t->model.nparams;
        t->perm = malloc((size_t)t->train.n * sizeof(uint32_t));
        if (!t->momentum || !t->perm) {
            fprintf(stderr, "dear-cnn: rank %d: out of memory\n", t->rank);
            ok = 0;
        }
    }
    return ok;
}

/* --iters, else --epochs passes over the training set. */
static void count_iterations(trainer_t *t)
{
    t->iters_per_epoch = t->train.n / t->opt.batch;
    t->total_iters = t->opt.iters > 0 ? t->opt.iters : (long)t->opt.epochs * t->iters_per_epoch;
    t->perm_epoch = -1;
}

/* Parameters: from the seed (rank 0's copy is broadcast, so all ranks start identical), or from
 * a checkpoint. 0, or -1 on every rank when the checkpoint cannot be used. */
static int init_params(trainer_t *t)
{
    for (int i = 0; i < CNN_NTENSORS; i++)
        t->slots[i] = (slot_t){.t = t, .index = i};
    cnn_rng_t init_rng = {t->opt.seed};
    cnn_init_params(&t->model, &init_rng);
    MPI_Bcast(t->model.params, (int)t->model.nparams, MPI_FLOAT, 0, t->comm);
    if (!t->opt.resume)
        return 0;
    unsigned char *buf;
    if (ckpt_read_bcast(t, t->opt.resume, &buf) != 0)
        return -1;
    int arc = ckpt_apply(t, buf, t->opt.resume);
    free(buf);
    return arc;
}

/* --shard, after commit: keep the momentum of this rank's slices only (zeros, or a checkpoint's,
 * read whole), back to back as dear_shard_slices lists them. */
static void shard_momentum(trainer_t *t)
{
    int ns = dear_shard_slices(t->dear, t->rank, NULL, 0);
    dear_slice_t *sl = calloc((size_t)(ns > 0 ? ns : 1), sizeof *sl);
    if (ns < 0 || !sl || dear_shard_slices(t->dear, t->rank, sl, ns) != ns)
        die_dear(t, "dear_shard_slices", ns < 0 ? ns : DEAR_ERR_NOMEM);
    size_t n = ns > 0 ? sl[ns - 1].shard_offset + sl[ns - 1].count : 0;
    float *mine = calloc(n + 1, sizeof *mine);
    if (!mine)
        die_dear(t, "the momentum's shard", DEAR_ERR_NOMEM);
    for (int k = 0; k < ns; k++)
        memcpy(mine + sl[k].shard_offset, t->momentum + t->model.offset[sl[k].tensor] + sl[k].offset,
               sl[k].count * sizeof *mine);
    free(sl);
    free(t->momentum);
    t->momentum = mine;
    t->nmomentum = n;
    unsigned long long most = n;
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, t->comm);
    if (t->rank == 0)
        printf("sharded updates: momentum of %llu floats on the largest rank (unsharded: %zu)\n", most,
               t->model.nparams);
}

/* dear: the schedule comes from the environment, read once by dear_init; every tensor is
 * registered with its update, and the model's hooks tell dear where the model is. 0, or -1 when
 * dear_init fails (collective: on every rank alike, for bad DEAR_* values). */
static int start_dear(trainer_t *t)
{
    if (t->opt.schedule && setenv("DEAR_SCHEDULE", t->opt.schedule, 1) != 0) {
        fprintf(stderr, "dear-cnn: setenv: %s\n", strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int rc = dear_init(MPI_COMM_WORLD, &t->dear);
    if (rc != DEAR_OK) {
        if (t->rank == 0)
            fprintf(stderr, "dear-cnn: dear_init failed: %s\n", dear_status_string(rc));
        return -1;
    }
    for (int i = 0; i < CNN_NTENSORS && rc == DEAR_OK; i++) {
        rc = dear_register(t->dear, t->model.name[i], t->model.layer[i],
                           t->model.grads + t->model.offset[i], t->model.count[i], DEAR_FLOAT32,
                           DEAR_MEM_HOST, sgd_update, &t->slots[i]);
        if (rc == DEAR_OK)
            rc = dear_set_param(t->dear, i, t->model.params + t->model.offset[i]);
    }
    if (rc == DEAR_OK && t->opt.shard)
        rc = dear_set_shard(t->dear, DEAR_SHARD_ON);
    check_everywhere(t, "dear_register", rc);
    check_everywhere(t, "dear_commit", dear_commit(t->dear));
    if (t->opt.shard)
        shard_momentum(t);
    t->iter0 = t->iter; /* dear counts the iterations it sees from 0 */
    t->model.hook = dear_hook;
    t->model.hook_arg = t;
    return 0;
}

static void print_banner(const trainer_t *t)
{
    const options_t *o = &t->opt;
    const char *sched = getenv("DEAR_SCHEDULE") ? getenv("DEAR_SCHEDULE") : "dear";
    if (t->rank == 0)
        printf("dear-cnn: %d ranks, schedule %s, batch %d (%d per rank), %ld iterations/epoch, "
               "%ld iterations from %ld, %zu parameters, lr %g (%s) momentum %g wd %g seed %llu\n",
               t->size, sched, o->batch, t->local_batch, t->iters_per_epoch, t->total_iters,
               t->iter, t->model.nparams, o->lr, o->cosine ? "cosine" : "const", o->momentum,
               o->wd, (unsigned long long)o->seed);
}

/* The training loop's clocks and counters, for the progress lines and the final line. */
typedef struct {
    double t_start, t_log, loss_sum, blocked_log, eval_s, acc;
    long log0, log_iter, evaluated_at, correct;
} progress_t;

/* The progress line of the iterations since the last one: mean loss over all ranks, images/s
 * and the share of time blocked in dear. */
static void log_progress(trainer_t *t, progress_t *pg)
{
    dear_stats_t st;
    int rc;
    double sum[1] = {pg->loss_sum};
    MPI_Allreduce(MPI_IN_PLACE, sum, 1, MPI_DOUBLE, MPI_SUM, t->comm);
    double now = MPI_Wtime();
    if ((rc = dear_get_stats(t->dear, &st)) != DEAR_OK)
        die_dear(t, "dear_get_stats", rc);
    long n = t->iter - pg->log_iter;
    if (t->rank == 0)
        printf("iter %ld epoch %.2f loss %.6f img/s %.1f blocked %.2fms/iter (%.1f%%) "
               "lr %.5f\n",
               t->iter, (double)t->iter / t->iters_per_epoch, sum[0] / t->size / n,
               (double)n * t->opt.batch / (now - pg->t_log),
               1e3 * (st.blocked_s - pg->blocked_log) / n,
               100.0 * (st.blocked_s - pg->blocked_log) / (now - pg->t_log),
               lr_at(t, (uint64_t)t->iter));
    fflush(stdout);
    pg->t_log = now;
    pg->log_iter = t->iter;
    pg->loss_sum = 0.0;
    pg->blocked_log = st.blocked_s;
}

/* Test accuracy once the pending updates are in place; its time is not training time. */
static void evaluate_epoch(trainer_t *t, progress_t *pg)
{
    int rc;
    if ((rc = dear_flush(t->dear)) != DEAR_OK)
        die_dear(t, "dear_flush", rc);
    double t_eval = MPI_Wtime();
    pg->acc = evaluate(t, &pg->correct);
    pg->evaluated_at = t->iter;
    t_eval = MPI_Wtime() - t_eval;
    pg->t_log += t_eval; /* images/s and blocked shares count training time only */
    pg->eval_s += t_eval;
    if (t->rank == 0)
        printf("epoch %.2f iter %ld test_acc %.4f (%ld/%d) time %.1fs\n",
               (double)t->iter / t->iters_per_epoch, t->iter, pg->acc, pg->correct, t->test.n,
               MPI_Wtime() - pg->t_start);
    fflush(stdout);
}

/* Up to total_iters: a progress line every --log-every, a checkpoint every --ckpt-every, the
 * test accuracy after every epoch and the last iteration. */
static void train(trainer_t *t, progress_t *pg)
{
    const options_t *o = &t->opt;
    uint8_t *labels = malloc((size_t)t->local_batch);
    if (!labels) {
        fprintf(stderr, "dear-cnn: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    *pg = (progress_t){.t_start = MPI_Wtime(), .log0 = t->iter, .log_iter = t->iter,
                       .evaluated_at = -1};
    pg->t_log = pg->t_start;
    while (t->iter < t->total_iters) {
        pg->loss_sum += train_step(t, labels);
        if (o->log_every && t->iter % o->log_every == 0)
            log_progress(t, pg);
        if (o->ckpt && (t->iter % o->ckpt_every == 0 || t->iter == t->total_iters))
            checkpoint(t); /* also after the last iteration, so a finished run can be extended */
        if (t->iter % t->iters_per_epoch == 0 || t->iter == t->total_iters)
            evaluate_epoch(t, pg);
    }
    free(labels);
}

/* The final line (test accuracy, throughput, blocked share), --profile-out, and dear_finalize.
 * Returns the exit status: a profile that cannot be written fails the run on rank 0 only, after
 * a clean finalize, since training itself completed and the other ranks wrote nothing. */
static int finish(trainer_t *t, progress_t *pg)
{
    dear_stats_t st;
    int rc;
    if ((rc = dear_flush(t->dear)) != DEAR_OK)
        die_dear(t, "dear_flush", rc);
    if (pg->evaluated_at != t->iter)
        pg->acc = evaluate(t, &pg->correct);
    if ((rc = dear_get_stats(t->dear, &st)) != DEAR_OK)
        die_dear(t, "dear_get_stats", rc);
    double elapsed = MPI_Wtime() - pg->t_start, train_s = elapsed - pg->eval_s;
    if (t->rank == 0)
        printf("final iter %ld test_acc %.4f time %.1fs img/s %.1f blocked %.1f%% median_iter "
               "%.2fms\n",
               t->iter, pg->acc, elapsed,
               train_s > 0 ? (double)(t->iter - pg->log0) * t->opt.batch / train_s : 0.0,
               train_s > 0 ? 100.0 * st.blocked_s / train_s : 0.0, 1e3 * st.median_iter_s);
    fflush(stdout);
    int status = 0;
    if (t->opt.profile_out && (rc = dear_profile_save(t->dear, t->opt.profile_out)) != DEAR_OK) {
        if (rc == DEAR_ERR_MPI)
            die_dear(t, "dear_profile_save", rc);
        fprintf(stderr, "dear-cnn: rank %d: dear_profile_save failed: %s\n", t->rank,
                dear_status_string(rc));
        status = 1;
    }
    if ((rc = dear_finalize(&t->dear)) != DEAR_OK)
        die_dear(t, "dear_finalize", rc);
    return status;
}

static void trainer_free(trainer_t *t)
{
    free(t->perm);
    free(t->momentum);
    cnn_model_destroy(&t->model);
    cnn_data_free(&t->train);
    cnn_data_free(&t->test);
    MPI_Comm_free(&t->comm);
}

int main(int argc, char **argv)
{
    int provided;
    static trainer_t tr;
    trainer_t *t = &tr;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &t->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &t->size);
#ifdef OPENBLAS_VERSION
    openblas_set_num_threads(1); /* one rank per core: BLAS threads would only fight */
#endif
    int prc = check_options(t, argc, argv);
    if (prc != 0) {
        MPI_Finalize();
        return prc > 0 ? 0 : 2;
    }
    t->local_batch = t->opt.batch / t->size;
    MPI_Comm_dup(MPI_COMM_WORLD, &t->comm);
    if (!all_ok(t->comm, load_data_and_model(t))) {
        trainer_free(t);
        MPI_Finalize();
        return 1;
    }
    count_iterations(t);
    if (init_params(t) != 0 || start_dear(t) != 0) {
        trainer_free(t);
        MPI_Finalize();
        return 1;
    }
    print_banner(t);
    progress_t pg;
    train(t, &pg);
    int status = finish(t, &pg);
    trainer_free(t);
    MPI_Finalize();
    return status;
}
