/*
 * dear-gpt: trains a decoder-only transformer (model.c) on characters or words data-parallel
 * over MPI, with libdear synchronising the gradients.
 *
 *     mpirun -np 4 dear-gpt --iters 1000 --schedule dear
 *     mpirun -np 4 dear-gpt --vocab words --vocab-size 16384
 *
 * Every rank holds the whole model and trains on its shard of every global batch: the global
 * batch is drawn from a random generator seeded identically on all ranks, rank r takes
 * sequences [r*B/P, (r+1)*B/P), and libdear averages the gradients, so P ranks compute the
 * same steps as one rank with the same global batch. Every parameter tensor is registered
 * with its layer id in forward order (the token embedding's gradient is its own tensor, declared
 * sparse: only the rows of the batch's tokens are non-zero, a few hundred of the 16k rows of a
 * word vocabulary); the model calls dear_forward_begin before each layer and
 * dear_backward_done after each layer's backward through its hooks, and AdamW runs in the
 * per-tensor update callback, the moment the averaged gradient of that tensor is in place.
 * With --shard each rank runs AdamW on its slice of every tensor only and keeps the moments of
 * those slices alone (1/P of them); libdear's all-gathers then carry the updated parameters.
 *
 * Reports training and validation loss in nats per token next to the unigram baseline
 * (entropy of the training text's token distribution: the best a model without context can
 * do), for words also the validation loss per character (the unknown word's loss plus what
 * spelling it out costs, over the characters the tokens cover), so characters and words compare;
 * throughput, the share of iteration time the application was blocked on communication, and
 * what the sparse embedding sent; prints a sample at the end. Uses only include/dear.h and MPI.
 */
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "include/dear.h"
#include "apps/gpt/model.h"
#include "apps/gpt/text.h"

/* ------------------------------------------------------------------------------------------ */
/* Options */

#define GPT_DEFAULT_VOCAB_SIZE 16384 /* words: large enough that a batch touches ~2% of it */

typedef struct {
    const char *data;           /* NULL: the fortunes */
    const char *schedule;       /* NULL: DEAR_SCHEDULE or dear's default */
    const char *profile_out;
    const char *loss_out;
    const char *params_out;
    long vocab_size;            /* 0: characters; K: the K most frequent words and <unk> */
    long iters, batch, seq, layers, heads, dim;
    long seed, sample, eval_every, print_every, val_chars, warmup;
    double lr, min_lr_frac, weight_decay, beta1, beta2, temperature, clip;
    int shard;                  /* --shard: sharded updates (dear_set_shard) */
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: mpirun -np P dear-gpt [options]\n"
        "Train a character- or word-level transformer data-parallel with libdear.\n\n"
        "Data\n"
        "  --data FILE         train on FILE instead of the fortunes in %s\n"
        "                      (Debian package: fortunes)\n"
        "  --vocab chars|words tokens: bytes (default), or words: runs of letters, digits and\n"
        "                      UTF-8 bytes, every other byte (space, newline, punctuation) a\n"
        "                      token of its own; the input embedding's gradient then touches a\n"
        "                      few hundred of its rows per batch and travels sparse (DEAR_SPARSE)\n"
        "  --vocab-size K      words: keep the K most frequent tokens of the training text, most\n"
        "                      frequent first (ties in byte order); the rest become <unk>\n"
        "                      (default %d, at most the number of distinct tokens)\n"
        "  --val-chars N       characters of validation text evaluated (default 65536)\n"
        "Model\n"
        "  --layers N          transformer blocks (default 2)\n"
        "  --heads N           attention heads, must divide --dim (default 4)\n"
        "  --dim N             channels (default 96)\n"
        "  --seq N             context length in tokens (default 64)\n"
        "Training\n"
        "  --iters N           iterations (default 1000)\n"
        "  --batch N           global batch in sequences, divisible by P (default 32)\n"
        "  --lr X              AdamW peak learning rate (default 3e-3; warm-up, cosine decay)\n"
        "  --warmup N          warm-up iterations (default: iters/20)\n"
        "  --weight-decay X    AdamW decoupled weight decay of the weight matrices (default 0.1)\n"
        "  --clip X            clip the gradient to global L2 norm X (default 1; 0: off), from the\n"
        "                      shards under dear (dear_set_clip_norm)\n"
        "  --seed N            seed of initialisation, batches and sample (default 1)\n"
        "  --schedule S        dear|wfbp|sync (default: $DEAR_SCHEDULE, else dear)\n"
        "  --shard             sharded updates: each rank runs AdamW on its 1/P slice of every\n"
        "                      tensor and keeps only those moments; the all-gathers carry the\n"
        "                      parameters (dear_set_shard; the embedding's all-gathers then\n"
        "                      travel dense, its reduce-scatters still sparse)\n"
        "Output\n"
        "  --print-every N     progress line every N iterations (default 50; 0: none)\n"
        "  --eval-every N      validation loss every N iterations (default 200; 0: end only)\n"
        "  --sample N          tokens to sample at the end (default 400; 0: none)\n"
        "  --temperature X     sampling temperature (default 0.8)\n"
        "  --profile-out FILE  write the measured per-layer profile (dear_profile_save)\n"
        "  --loss-out FILE     write the training loss of every iteration (rank 0)\n"
        "  --params-out FILE   write the trained parameters, one per line in the order of the\n"
        "                      model's one allocation (rank 0), to compare runs\n"
        "  --help              this text\n"
        "Losses are nats per token: per character for --vocab chars, per word-level token for\n"
        "words, which are not comparable. For words the validation line also gives nats per\n"
        "character: the token losses plus the cost of spelling out each <unk> with a byte\n"
        "unigram model, over the characters evaluated; that figure compares with the character\n"
        "model's (it is an upper bound of the word model's true loss per character).\n",
        GPT_FORTUNES_DIR, GPT_DEFAULT_VOCAB_SIZE);
}

/* Only rank 0 prints argument errors; every rank reaches the same verdict without talking. */
static int g_verbose = 1;

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        if (g_verbose)
            fprintf(stderr, "dear-gpt: %s '%s': expected an integer in [%ld, %ld]\n", opt, s, lo,
                    hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        if (g_verbose)
            fprintf(stderr, "dear-gpt: %s '%s': expected a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Returns 0 to run, 1 after --help, -1 on a bad argument (message printed when verbose). */
static int parse_args(int argc, char **argv, opts_t *o, int verbose)
{
    enum { O_DATA = 256, O_VALCH, O_LAYERS, O_HEADS, O_DIM, O_SEQ, O_ITERS, O_BATCH, O_LR,
           O_WARMUP, O_WD, O_SEED, O_SCHED, O_PRINT, O_EVAL, O_SAMPLE, O_TEMP, O_PROF, O_LOSS,
           O_CLIP, O_VOCAB, O_VOCAB_SIZE, O_PARAMS, O_SHARD, O_HELP };
    static const struct option longopts[] = {
        {"data", required_argument, 0, O_DATA}, {"val-chars", required_argument, 0, O_VALCH},
        {"layers", required_argument, 0, O_LAYERS}, {"heads", required_argument, 0, O_HEADS},
        {"dim", required_argument, 0, O_DIM}, {"seq", required_argument, 0, O_SEQ},
        {"iters", required_argument, 0, O_ITERS}, {"batch", required_argument, 0, O_BATCH},
        {"lr", required_argument, 0, O_LR}, {"warmup", required_argument, 0, O_WARMUP},
        {"weight-decay", required_argument, 0, O_WD}, {"seed", required_argument, 0, O_SEED},
        {"clip", required_argument, 0, O_CLIP},
        {"vocab", required_argument, 0, O_VOCAB},
        {"vocab-size", required_argument, 0, O_VOCAB_SIZE},
        {"params-out", required_argument, 0, O_PARAMS},
        {"schedule", required_argument, 0, O_SCHED}, {"shard", no_argument, 0, O_SHARD},
        {"print-every", required_argument, 0, O_PRINT},
        {"eval-every", required_argument, 0, O_EVAL}, {"sample", required_argument, 0, O_SAMPLE},
        {"temperature", required_argument, 0, O_TEMP},
        {"profile-out", required_argument, 0, O_PROF}, {"loss-out", required_argument, 0, O_LOSS},
        {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    *o = (opts_t){.iters = 1000, .batch = 32, .seq = 64, .layers = 2, .heads = 4, .dim = 96,
                  .seed = 1, .sample = 400, .eval_every = 200, .print_every = 50,
                  .val_chars = 65536, .warmup = -1, .lr = 3e-3, .min_lr_frac = 0.1,
                  .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.99, .temperature = 0.8, .clip = 1.0};
    int rc = 0, c, words = 0;
    long vocab_size = -1;
    g_verbose = verbose;
    opterr = 0;
    optind = 1;
    while (!rc && (c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        switch (c) {
        case O_DATA: o->data = optarg; break;
        case O_VALCH: rc = parse_long("--val-chars", optarg, 1, 1L << 30, &o->val_chars); break;
        case O_LAYERS: rc = parse_long("--layers", optarg, 1, 64, &o->layers); break;
        case O_HEADS: rc = parse_long("--heads", optarg, 1, 64, &o->heads); break;
        case O_DIM: rc = parse_long("--dim", optarg, 1, 4096, &o->dim); break;
        case O_SEQ: rc = parse_long("--seq", optarg, 1, 4096, &o->seq); break;
        case O_ITERS: rc = parse_long("--iters", optarg, 1, 100000000, &o->iters); break;
        case O_BATCH: rc = parse_long("--batch", optarg, 1, 1 << 20, &o->batch); break;
        case O_LR: rc = parse_double("--lr", optarg, 0, 10, &o->lr); break;
        case O_WARMUP: rc = parse_long("--warmup", optarg, 0, 100000000, &o->warmup); break;
        case O_WD: rc = parse_double("--weight-decay", optarg, 0, 10, &o->weight_decay); break;
        case O_CLIP: rc = parse_double("--clip", optarg, 0, 1e30, &o->clip); break;
        case O_SEED: rc = parse_long("--seed", optarg, 0, LONG_MAX, &o->seed); break;
        case O_SCHED:
            if (strcmp(optarg, "dear") && strcmp(optarg, "wfbp") && strcmp(optarg, "sync")) {
                if (verbose)
                    fprintf(stderr, "dear-gpt: --schedule '%s': expected dear, wfbp or sync\n",
                            optarg);
                rc = -1;
            }
            o->schedule = optarg;
            break;
        case O_PRINT: rc = parse_long("--print-every", optarg, 0, LONG_MAX, &o->print_every); break;
        case O_EVAL: rc = parse_long("--eval-every", optarg, 0, LONG_MAX, &o->eval_every); break;
        case O_SAMPLE: rc = parse_long("--sample", optarg, 0, 1L << 24, &o->sample); break;
        case O_TEMP: rc = parse_double("--temperature", optarg, 1e-3, 100, &o->temperature); break;
        case O_VOCAB:
            if (strcmp(optarg, "chars") && strcmp(optarg, "words")) {
                if (verbose)
                    fprintf(stderr, "dear-gpt: --vocab '%s': expected chars or words\n", optarg);
                rc = -1;
            }
            words = strcmp(optarg, "words") == 0;
            break;
        case O_VOCAB_SIZE:
            rc = parse_long("--vocab-size", optarg, 1, INT_MAX - 1, &vocab_size);
            break;
        case O_PROF: o->profile_out = optarg; break;
        case O_LOSS: o->loss_out = optarg; break;
        case O_PARAMS: o->params_out = optarg; break;
        case O_SHARD: o->shard = 1; break;
        case O_HELP: rc = 1; break;
        case ':':
            if (verbose)
                fprintf(stderr, "dear-gpt: %s needs a value (see --help)\n", argv[optind - 1]);
            rc = -1;
            break;
        default:
            if (verbose)
                fprintf(stderr, "dear-gpt: unknown option '%s' (see --help)\n", argv[optind - 1]);
            rc = -1;
            break;
        }
    }
    if (!rc && optind < argc) {
        if (verbose)
            fprintf(stderr, "dear-gpt: unexpected argument '%s' (see --help)\n", argv[optind]);
        rc = -1;
    }
    if (!rc && o->dim % o->heads != 0) {
        if (verbose)
            fprintf(stderr, "dear-gpt: --dim %ld is not a multiple of --heads %ld\n", o->dim,
                    o->heads);
        rc = -1;
    }
    if (!rc && vocab_size > 0 && !words) {
        if (verbose)
            fprintf(stderr, "dear-gpt: --vocab-size applies to --vocab words only (characters "
                            "take every distinct byte)\n");
        rc = -1;
    }
    if (words)
        o->vocab_size = vocab_size > 0 ? vocab_size : GPT_DEFAULT_VOCAB_SIZE;
    if (o->warmup < 0)
        o->warmup = o->iters / 20;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Random numbers: one generator per purpose, seeded from --seed, identical on every rank */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

/* ------------------------------------------------------------------------------------------ */
/* AdamW, run by libdear in the update callback of each tensor */

/* The moments of this rank's slices under --shard: its shard, the slices back to back. */
typedef struct {
    float *m, *v;
    size_t n;
} shard_state_t;

typedef struct {
    float *m, *v;               /* its moments (NULL under --shard: in the shard's) */
    const shard_state_t *shard;
    int decay;                  /* weight decay applies (weight matrices only) */
    const opts_t *o;
} adamw_slot_t;

/* Warm-up, then cosine decay to min_lr_frac of the peak at the last iteration. */
static double lr_at(const opts_t *o, long step)
{
    if (step <= o->warmup)
        return o->lr * (double)step / (double)(o->warmup + 1);
    double frac = (double)(step - o->warmup) / (double)(o->iters - o->warmup > 0 ?
                                                         o->iters - o->warmup : 1);
    if (frac > 1)
        frac = 1;
    double coeff = 0.5 * (1.0 + cos(M_PI * frac));
    return o->lr * (o->min_lr_frac + (1.0 - o->min_lr_frac) * coeff);
}

/* AdamW on the averaged (and clipped) gradient, with the learning rate and bias corrections of
 * the iteration the gradient belongs to (dear reports it: under `dear` the update of iteration k
 * runs during the forward pass of iteration k+1). */
static double g_grad_norm = -1; /* of the last iteration updated, for the progress line */

static int adamw_update(const dear_update_info_t *u)
{
    adamw_slot_t *s = u->arg;
    g_grad_norm = u->grad_norm;
    if (u->dtype != DEAR_FLOAT32)
        return 1;
    const float *g = u->grad;
    const size_t count = u->count;
    const opts_t *o = s->o;
    /* The parameters and moments of what dear hands over: the whole tensor, or under --shard
     * one slice of it, whose moments lie at its place in this rank's shard. */
    gpt_real *p = u->param;
    float *mm = s->m ? s->m + u->offset : s->shard->m + u->shard_offset;
    float *vv = s->v ? s->v + u->offset : s->shard->v + u->shard_offset;
    const long step = (long)u->iteration + 1;
    const float lr = (float)lr_at(o, step);
    const float b1 = (float)o->beta1, b2 = (float)o->beta2, eps = 1e-8f;
    const float c1 = 1.0f / (1.0f - (float)pow(o->beta1, (double)step));
    const float c2 = 1.0f / (1.0f - (float)pow(o->beta2, (double)step));
    const float wd = s->decay ? (float)o->weight_decay : 0.0f;
    for (size_t i = 0; i < count; i++) {
        float m = b1 * mm[i] + (1 - b1) * g[i];
        float v = b2 * vv[i] + (1 - b2) * g[i] * g[i];
        mm[i] = m;
        vv[i] = v;
        p[i] -= lr * ((m * c1) / (sqrtf(v * c2) + eps) + wd * p[i]);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Hooks: the model calls these around each layer */

static int hook_forward_begin(void *arg, int layer)
{
    int rc = dear_forward_begin(arg, layer);
    if (rc)
        fprintf(stderr, "dear-gpt: dear_forward_begin(%d): %s\n", layer, dear_status_string(rc));
    return rc;
}

static int hook_backward_done(void *arg, int layer)
{
    int rc = dear_backward_done(arg, layer);
    if (rc)
        fprintf(stderr, "dear-gpt: dear_backward_done(%d): %s\n", layer, dear_status_string(rc));
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Data and evaluation */

/* Draw the global batch (B offsets, same on every rank) and keep this rank's sequences. */
static void next_batch(uint64_t *rng, const gpt_text_t *text, int B, int T, int rank, int P,
                       int *inputs, int *targets)
{
    const int local = B / P;
    const size_t span = text->train_len - (size_t)T - 1;
    for (int b = 0; b < B; b++) {
        size_t off = (size_t)(rng_uniform(rng) * (double)(span + 1));
        if (off > span)
            off = span;
        int lb = b - rank * local;
        if (lb < 0 || lb >= local)
            continue;
        for (int t = 0; t < T; t++) {
            inputs[lb * T + t] = text->train[off + t];
            targets[lb * T + t] = text->train[off + t + 1];
        }
    }
}

/* Windows of T tokens that evaluate: as many as the validation text holds whose targets cover
 * at most val_chars characters (for characters, val_chars / T), at least one. */
static size_t eval_windows(const gpt_text_t *text, long val_chars, int T)
{
    const size_t windows = (text->val_len - 1) / (size_t)T;
    size_t n = 0, chars = 0;
    for (; n < windows * (size_t)T; n++) {
        chars += text->val_bytes ? (size_t)text->val_bytes[n + 1] : 1;
        if (chars > (size_t)val_chars)
            break;
    }
    return n >= (size_t)T ? n / (size_t)T : 1;
}

/* The validation loss per token, and per character of the text its targets cover, where an
 * unknown word's target also pays for spelling the word out (text->val_spell). */
typedef struct {
    double per_token, per_char;
} val_loss_t;

/* The validation loss over eval_windows windows of T, dealt round-robin to the ranks.
 * Parameters must be up to date (dear_flush first). Collective. */
static val_loss_t evaluate(gpt_model_t *m, const gpt_text_t *text, size_t windows, int T,
                           int rank, int P, int *inputs, int *targets)
{
    double sums[4] = {0, 0, 0, 0}; /* model nats, tokens, characters, spelling nats */
    int nb = 0;
    for (size_t w = (size_t)rank;; w += (size_t)P) {
        int flush = w >= windows;
        if (!flush) {
            for (int t = 0; t < T; t++) {
                const size_t j = w * T + t + 1; /* the target */
                inputs[nb * T + t] = text->val[j - 1];
                targets[nb * T + t] = text->val[j];
                sums[2] += text->val_bytes ? text->val_bytes[j] : 1;
                sums[3] += text->val_spell ? text->val_spell[j] : 0;
            }
            nb++;
        }
        if (nb == m->max_batch || (flush && nb > 0)) {
            gpt_forward(m, inputs, targets, nb, T, NULL);
            sums[0] += m->mean_loss * nb * T;
            sums[1] += (double)nb * T;
            nb = 0;
        }
        if (flush)
            break;
    }
    MPI_Allreduce(MPI_IN_PLACE, sums, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return (val_loss_t){sums[0] / sums[1], (sums[0] + sums[3]) / sums[2]};
}

/* The id of the newline token, or 0 when the vocabulary has none. */
static int newline_id(const gpt_text_t *text)
{
    for (int id = 0; id < text->vocab; id++) {
        const char *s;
        if (gpt_token_text(text, id, &s) == 1 && s[0] == '\n')
            return id;
    }
    return 0;
}

/* Sample n tokens after a newline, at the given temperature (rank 0). */
static void sample_text(gpt_model_t *m, const gpt_text_t *text, long n, double temperature,
                        uint64_t *rng, int *ctx_buf, FILE *out)
{
    const int T = m->cfg.max_seq, V = m->cfg.vocab;
    int len = 1;
    ctx_buf[0] = newline_id(text);
    double *p = malloc((size_t)V * sizeof *p);
    if (!p)
        return;
    for (long i = 0; i < n; i++) {
        int start = len > T ? len - T : 0, t = len - start;
        gpt_forward(m, ctx_buf + start, NULL, 1, t, NULL);
        const gpt_real *logits = m->acts.logits + (size_t)(t - 1) * V;
        double mx = logits[0], sum = 0;
        for (int c = 1; c < V; c++)
            if (logits[c] > mx)
                mx = logits[c];
        for (int c = 0; c < V; c++)
            sum += (p[c] = exp((logits[c] - mx) / temperature));
        double r = rng_uniform(rng) * sum;
        int next = V - 1;
        for (int c = 0; c < V; c++) {
            r -= p[c];
            if (r <= 0) {
                next = c;
                break;
            }
        }
        const char *s;
        size_t slen = gpt_token_text(text, next, &s);
        fwrite(s, 1, slen, out);
        /* keep the last T tokens: slide the window when the buffer is full */
        if (len == 2 * T) {
            memmove(ctx_buf, ctx_buf + T, (size_t)T * sizeof *ctx_buf);
            len = T;
        }
        ctx_buf[len++] = next;
    }
    fputc('\n', out);
    free(p);
}

/* Start the output head at the unigram distribution (bias = log frequency, add-one smoothed):
 * the first iterations then learn context instead of spending hundreds of small Adam steps
 * walking the bias from uniform to the character frequencies. Same on every rank. */
static void init_head_bias(gpt_model_t *m, const gpt_text_t *text)
{
    const int V = m->cfg.vocab;
    double total = (double)text->train_len + V;
    for (int c = 0; c < V; c++)
        m->params.lmb[c] = 0;
    for (size_t i = 0; i < text->train_len; i++)
        m->params.lmb[text->train[i]] += 1;
    for (int c = 0; c < V; c++)
        m->params.lmb[c] = (gpt_real)log((m->params.lmb[c] + 1) / total);
}

/* ------------------------------------------------------------------------------------------ */
/* Main and its steps */

/* Everything one run holds; run_end releases whatever of it was reached. */
typedef struct {
    opts_t o;
    int rank, P;
    gpt_text_t text;
    gpt_model_t model;
    int have_text, have_model;
    int B, T, local_B;          /* global batch, context, this rank's share of the batch */
    double unigram;             /* nats per token of the training text's tokens */
    size_t val_windows;         /* windows of T tokens each validation evaluates */
    const char *unit;           /* what a token is: "char" or "token" */
    dear_ctx_t *ctx;
    float *opt_state;           /* AdamW's two moments per parameter (--shard: per element of the shard) */
    size_t opt_floats;          /* of them */
    shard_state_t shard;
    adamw_slot_t *slots;
    int *inputs, *targets;
    double *losses;             /* training loss of every iteration, mean over the ranks */
    double *iter_s;             /* wall time of every iteration on this rank */
    FILE *loss_file, *params_file;
} run_t;

/* The training loop's accounting: rates leave out the first iteration; a window spans the
 * iterations since the last progress line. */
typedef struct {
    double train_s, blocked_s, window_s, window_blocked;
    val_loss_t val;
    long timed_iters, last_print;
} progress_t;

/* A failing dear call is reported with its status text and ends the step with status 1; the
 * trainer's own few MPI calls keep MPI_COMM_WORLD's default handler (MPI_ERRORS_ARE_FATAL),
 * which aborts the job with MPI's message. A rank that fails alone ends in MPI_Abort (run_end)
 * so the others never wait forever. */
#define DEAR_TRY(call)                                                                       \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != DEAR_OK) {                                                                \
            fprintf(stderr, "dear-gpt: rank %d: %s: %s\n", rank, #call,                      \
                    dear_status_string(rc_));                                                \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

/* Options, the batch split and --schedule (DEAR_SCHEDULE, read by dear_init). Returns -1 to go
 * on, else the exit status: 0 after --help, 2 for a bad argument, 1 when setenv fails. */
static int check_options(run_t *r, int argc, char **argv)
{
    int prc = parse_args(argc, argv, &r->o, r->rank == 0);
    if (prc != 0) {
        if (prc > 0 && r->rank == 0)
            usage(stdout);
        return prc > 0 ? 0 : 2;
    }
    if (r->o.batch % r->P != 0) {
        if (r->rank == 0)
            fprintf(stderr,
                    "dear-gpt: --batch %ld does not divide across %d ranks: every rank trains on "
                    "an equal shard of the global batch; pick a multiple of %d\n",
                    r->o.batch, r->P, r->P);
        return 2;
    }
    if (r->o.schedule && setenv("DEAR_SCHEDULE", r->o.schedule, 1) != 0) {
        fprintf(stderr, "dear-gpt: setenv: %s\n", strerror(errno));
        return 1;
    }
    return -1;
}

/* Every rank reads the same file, so a missing file fails everywhere alike: no hang. 0, or 2
 * when the text is missing or too short for --seq, --vocab-size is more than its distinct
 * tokens, or the ranks built different vocabularies (they read different files). Collective. */
static int load_text(run_t *r)
{
    char err[512];
    if (gpt_text_load(&r->text, r->o.data, NULL, r->o.vocab_size, err, sizeof err)) {
        if (r->rank == 0)
            fprintf(stderr, "dear-gpt: %s\n", err);
        return 2;
    }
    r->have_text = 1;
    r->unit = r->text.words ? "token" : "char";
    if (r->text.train_len < (size_t)r->o.seq + 2 || r->text.val_len < (size_t)r->o.seq + 2) {
        if (r->rank == 0)
            fprintf(stderr,
                    "dear-gpt: the text is too short for --seq %ld (%zu training and %zu "
                    "validation %ss)\n",
                    r->o.seq, r->text.train_len, r->text.val_len, r->unit);
        return 2;
    }
    /* The same vocabulary everywhere, or the ranks would average gradients of different
     * tokens. The largest fingerprint and the largest complement equal one's own on every rank
     * exactly when all agree, so every rank reaches the same verdict. */
    uint64_t h[2] = {gpt_vocab_hash(&r->text), ~gpt_vocab_hash(&r->text)}, most[2];
    MPI_Allreduce(h, most, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (most[0] != h[0] || most[1] != h[1]) {
        if (r->rank == 0)
            fprintf(stderr, "dear-gpt: the ranks built different vocabularies: every rank must "
                            "read the same text (--data)\n");
        return 2;
    }
    r->unigram = gpt_unigram_entropy(r->text.train, r->text.train_len, r->text.vocab);
    r->val_windows = eval_windows(&r->text, r->o.val_chars, (int)r->o.seq);
    return 0;
}
/* An output file (--loss-out, --params-out) is opened before training, so a bad path fails
 * before the work: without following a link (O_NOFOLLOW) and without blocking on a FIFO
 * (O_NONBLOCK), and kept only if it is a regular file, which is then emptied; anything else at
 * that path is refused and left alone. */
static FILE *open_out_file(const char *opt, const char *path)
{
    struct stat st;
    FILE *f = NULL;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        fprintf(stderr, "dear-gpt: %s %s is %s; refused (accepted: a regular file or a new path)\n",
                opt, path, S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file");
        return NULL;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "dear-gpt: cannot write %s %s: %s\n", opt, path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        fprintf(stderr, "dear-gpt: %s %s is not a regular file; refused\n", opt, path);
    else if (ftruncate(fd, 0) != 0 || !(f = fdopen(fd, "w")))
        fprintf(stderr, "dear-gpt: cannot write %s %s: %s\n", opt, path, strerror(errno));
    if (!f)
        close(fd);
    return f;
}


/* The model, the optimiser state and the batch buffers (sized for evaluation batches too),
 * and rank 0's --loss-out and --params-out files. 0; 1 when this rank failed (run_end aborts the
 * job); 2 on every rank when one of the files cannot be written. */
static int build_model(run_t *r)
{
    const opts_t *o = &r->o;
    char err[512];
    r->B = (int)o->batch, r->T = (int)o->seq, r->local_B = r->B / r->P;
    const int eval_B = r->local_B > 8 ? r->local_B : 8, T = r->T;
    gpt_config_t cfg = {.vocab = r->text.vocab, .max_seq = T, .layers = (int)o->layers,
                        .heads = (int)o->heads, .dim = (int)o->dim};
    if (gpt_model_init(&r->model, &cfg, eval_B, (uint64_t)o->seed, err, sizeof err)) {
        fprintf(stderr, "dear-gpt: rank %d: %s\n", r->rank, err);
        return 1;
    }
    r->have_model = 1;
    init_head_bias(&r->model, &r->text);
    /* --shard: the moments come after dear_commit, which fixes the slices (start_dear). */
    r->opt_floats = o->shard ? 0 : 2 * r->model.num_params;
    r->opt_state = calloc(r->opt_floats + 1, sizeof *r->opt_state);
    r->slots = calloc((size_t)r->model.num_tensors, sizeof *r->slots);
    r->inputs = malloc((size_t)eval_B * T * sizeof *r->inputs);
    r->targets = malloc((size_t)eval_B * T * sizeof *r->targets);
    r->losses = calloc((size_t)o->iters, sizeof *r->losses);
    r->iter_s = calloc((size_t)o->iters, sizeof *r->iter_s);
    if (!r->opt_state || !r->slots || !r->inputs || !r->targets || !r->losses || !r->iter_s) {
        fprintf(stderr, "dear-gpt: rank %d: out of memory\n", r->rank);
        return 1;
    }
    int status = 0;
    if (r->rank == 0 && o->loss_out && !(r->loss_file = open_out_file("--loss-out", o->loss_out)))
        status = 2;
    if (r->rank == 0 && o->params_out &&
        !(r->params_file = open_out_file("--params-out", o->params_out)))
        status = 2;
    MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return status;
}

/* Every tensor with its parameters and its AdamW slot (the moments at the parameters' offsets
 * in opt_state, two arrays of num_params; --shard: in the shard's, set after commit) as the
 * update; model: its tensor table and arenas are read. */
static int register_tensors(int rank, dear_ctx_t *ctx, const gpt_model_t model, float *opt_state,
                            adamw_slot_t *slots, const shard_state_t *shard, const opts_t *o)
{
    for (int i = 0; i < model.num_tensors; i++) {
        const gpt_tensor_t *t = &model.tensors[i];
        slots[i] = (adamw_slot_t){.m = o->shard ? NULL : opt_state + t->offset,
                                  .v = o->shard ? NULL : opt_state + model.num_params + t->offset,
                                  .shard = shard, .decay = t->is_matrix, .o = o};
        DEAR_TRY(dear_register(ctx, t->name, t->layer, model.grads_memory + t->offset, t->count,
                               DEAR_FLOAT32, DEAR_MEM_HOST, adamw_update, &slots[i]));
        DEAR_TRY(dear_set_param(ctx, i, model.params_memory + t->offset));
        /* A batch touches only the rows of the tokens in it: let DEAR_SPARSE send just those. */
        if (strcmp(t->name, "wte") == 0)
            DEAR_TRY(dear_register_sparse(ctx, i, (size_t)model.cfg.dim));
    }
    return 0;
}

/* --shard: the moments of this rank's slices, as many as dear_shard_slices says it owns. */
static int alloc_shard_state(run_t *r)
{
    const int rank = r->rank;
    int n = dear_shard_slices(r->ctx, rank, NULL, 0);
    if (n < 0)
        DEAR_TRY(n);
    dear_slice_t *sl = calloc((size_t)n + 1, sizeof *sl);
    if (!sl) {
        fprintf(stderr, "dear-gpt: rank %d: out of memory\n", rank);
        return 1;
    }
    int got = dear_shard_slices(r->ctx, rank, sl, n);
    r->shard.n = got > 0 ? sl[got - 1].shard_offset + sl[got - 1].count : 0;
    free(sl);
    if (got < 0)
        DEAR_TRY(got);
    free(r->opt_state);
    r->opt_floats = 2 * r->shard.n;
    r->opt_state = calloc(r->opt_floats + 1, sizeof *r->opt_state);
    if (!r->opt_state) {
        fprintf(stderr, "dear-gpt: rank %d: out of memory\n", rank);
        return 1;
    }
    r->shard.m = r->opt_state;
    r->shard.v = r->opt_state + r->shard.n;
    return 0;
}

static int start_dear(run_t *r)
{
    const int rank = r->rank;
    dear_ctx_t *ctx = NULL;
    DEAR_TRY(dear_init(MPI_COMM_WORLD, &ctx));
    r->ctx = ctx;
    if (register_tensors(rank, ctx, r->model, r->opt_state, r->slots, &r->shard, &r->o) != 0)
        return 1;
    if (r->o.clip > 0)
        DEAR_TRY(dear_set_clip_norm(ctx, r->o.clip));
    if (r->o.shard)
        DEAR_TRY(dear_set_shard(ctx, DEAR_SHARD_ON));
    DEAR_TRY(dear_commit(ctx));
    return r->o.shard ? alloc_shard_state(r) : 0;
}

static void print_banner(const run_t *r)
{
    const opts_t *o = &r->o;
    if (r->rank != 0)
        return;
    printf("dear-gpt: %d ranks, schedule %s, %s: %zu characters (%d files), vocabulary %d, "
           "%zu train / %zu validation %ss\n",
           r->P, getenv("DEAR_SCHEDULE") ? getenv("DEAR_SCHEDULE") : "dear (default)",
           o->data ? o->data : GPT_FORTUNES_DIR, r->text.raw_len, r->text.files, r->text.vocab,
           r->text.train_len, r->text.val_len, r->unit);
    if (r->text.words)
        printf("words: the %d most frequent of the %zu distinct tokens of the training text, and "
               "<unk> for %.1f%% of the training and %.1f%% of the validation tokens; %.2f "
               "characters per token\n",
               r->text.unk, r->text.distinct, 100.0 * r->text.train_unk / r->text.train_len,
               100.0 * r->text.val_unk / r->text.val_len,
               (double)r->text.raw_len / (double)(r->text.train_len + r->text.val_len));
    printf("model: %ld layers, %ld heads, dim %ld, context %d, %zu parameters in %d tensors, "
           "%d hook layers; global batch %d x %d %ss\n",
           o->layers, o->heads, o->dim, r->T, r->model.num_params, r->model.num_tensors,
           gpt_layer_count(&r->model.cfg), r->B, r->T, r->unit);
    printf("unigram baseline (entropy of the training %ss): %.4f nats/%s\n", r->unit,
           r->unigram, r->unit);
    fflush(stdout);
}

/* The largest AdamW state of any rank: 1/P of the unsharded one under --shard. Collective. */
static void print_opt_state(const run_t *r)
{
    unsigned long long most = r->opt_floats;
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    if (r->rank == 0)
        printf("optimizer state: %llu floats (%.3f MB) on the largest rank, %s (unsharded: %zu)\n",
               most, 4e-6 * (double)most, r->o.shard ? "sharded" : "whole",
               2 * r->model.num_params);
}

/* The progress line of iteration it: mean over ranks of the per-rank means = mean over the
 * global batch, of the iterations since the last line. */
static void print_progress(run_t *r, progress_t *pg, long it)
{
    const opts_t *o = &r->o;
    long n = it - pg->last_print;
    MPI_Allreduce(MPI_IN_PLACE, r->losses + pg->last_print, (int)n, MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
    double mean = 0;
    for (long i = pg->last_print; i < it; i++) {
        r->losses[i] /= r->P;
        mean += r->losses[i];
    }
    mean /= (double)n;
    if (r->rank == 0 && o->print_every > 0) {
        printf("iter %6ld  train %.4f  lr %.2e  %8.0f %ss/s  blocked %4.1f%%", it, mean,
               lr_at(o, it), (double)n * r->B * r->T / pg->window_s, r->unit,
               100.0 * pg->window_blocked / pg->window_s);
        if (g_grad_norm >= 0)
            printf("  |g| %.3f", g_grad_norm);
        printf("\n");
        fflush(stdout);
    }
    pg->last_print = it;
    pg->window_s = pg->window_blocked = 0;
}

/* Validation loss after iteration it, once every pending update is in place. */
static int validate(run_t *r, progress_t *pg, long it)
{
    const int rank = r->rank;
    dear_ctx_t *ctx = r->ctx;
    DEAR_TRY(dear_flush(ctx));
    pg->val = evaluate(&r->model, &r->text, r->val_windows, r->T, rank, r->P, r->inputs,
                       r->targets);
    if (rank == 0) {
        printf("iter %6ld  validation %.4f nats/%s  (unigram %.4f)", it, pg->val.per_token,
               r->unit, r->unigram);
        if (r->text.words)
            printf("  %.4f nats/char with <unk> spelled out", pg->val.per_char);
        printf("\n");
        fflush(stdout);
    }
    return 0;
}

/* --iters iterations on this rank's shard of each global batch, with a progress line every
 * --print-every and the validation loss every --eval-every, both also after the last. */
static int train(run_t *r, progress_t *pg)
{
    const int rank = r->rank;
    const opts_t *o = &r->o;
    dear_ctx_t *ctx = r->ctx;
    const gpt_hooks_t hooks = {hook_forward_begin, hook_backward_done, ctx};
    uint64_t batch_rng = (uint64_t)o->seed * 0x9E3779B97F4A7C15ull + 7;
    *pg = (progress_t){.val = {NAN, NAN}};
    for (long it = 1; it <= o->iters; it++) {
        dear_stats_t s0, s1;
        DEAR_TRY(dear_get_stats(ctx, &s0));
        double t0 = MPI_Wtime();
        next_batch(&batch_rng, &r->text, r->B, r->T, rank, r->P, r->inputs, r->targets);
        if (gpt_forward(&r->model, r->inputs, r->targets, r->local_B, r->T, &hooks) ||
            gpt_backward(&r->model, &hooks))
            return 1;
        DEAR_TRY(dear_backward_end(ctx));
        double dt = MPI_Wtime() - t0;
        DEAR_TRY(dear_get_stats(ctx, &s1));
        r->losses[it - 1] = r->model.mean_loss;
        r->iter_s[it - 1] = dt;
        /* the first iteration pays for first touches and plan set-up: keep it out of rates */
        if (it > 1) {
            pg->train_s += dt;
            pg->blocked_s += s1.blocked_s - s0.blocked_s;
            pg->timed_iters++;
        }
        pg->window_s += dt;
        pg->window_blocked += s1.blocked_s - s0.blocked_s;
        if ((o->print_every > 0 && it % o->print_every == 0) || it == o->iters)
            print_progress(r, pg, it);
        if (((o->eval_every > 0 && it % o->eval_every == 0) || it == o->iters) &&
            validate(r, pg, it) != 0)
            return 1;
    }
    DEAR_TRY(dear_flush(ctx));
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* What the sparse embedding did (rank 0): whether its phases ran sparse, the densities dear
 * measured in warm-up and the messages of its sparse collectives. */
static void print_sparse_stats(const run_t *r)
{
    const int t = dear_tensor_index(r->ctx, "wte");
    dear_sparse_stats_t sp = {.size = sizeof sp};
    if (t < 0 || dear_get_sparse_stats(r->ctx, t, &sp) != DEAR_OK)
        return;
    const char *sched = getenv("DEAR_SCHEDULE") ? getenv("DEAR_SCHEDULE") : "dear";
    printf("sparse embedding wte (%d rows of %zu): ", r->model.cfg.vocab, sp.block);
    if (strcmp(sched, "dear") == 0 || r->o.shard) /* sharded, every schedule splits the phases */
        printf("reduce-scatter %s, all-gather %s", sp.sparse_rs ? "sparse" : "dense",
               sp.sparse_ag ? "sparse" : "dense");
    else
        printf("all-reduce %s", sp.sparse_rs ? "sparse" : "dense");
    if (sp.density >= 0 && sp.density_union >= 0)
        printf("; warm-up density %.4f on rank 0, %.4f of the averaged gradient", sp.density,
               sp.density_union);
    else if (sp.density >= 0) /* sharded: no rank holds the averaged gradient whole */
        printf("; warm-up density %.4f on rank 0", sp.density);
    else
        printf("; density not measured (DEAR_SPARSE=off)");
    printf("; %llu sparse and %llu dense messages, %.3f MB sent by rank 0\n",
           (unsigned long long)sp.msgs_sparse, (unsigned long long)sp.msgs_dense,
           1e-6 * (double)sp.bytes_sent);
}

/* The final lines: losses against the unigram baseline and throughput (rank 0), and rank 0's
 * --loss-out and --params-out (the parameters are up to date: train ends with dear_flush).
 * Collective. */
static void print_summary(run_t *r, const progress_t *pg)
{
    const opts_t *o = &r->o;
    /* ranks block for different lengths (the last to arrive waits least): report the mean */
    double blocked_share = pg->train_s > 0 ? pg->blocked_s / pg->train_s : 0;
    MPI_Allreduce(MPI_IN_PLACE, &blocked_share, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    blocked_share /= r->P;
    /* an iteration lasts as long as its slowest rank */
    MPI_Allreduce(MPI_IN_PLACE, r->iter_s, (int)o->iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r->rank != 0)
        return;
    double tail = 0;
    long k = o->iters < 20 ? o->iters : 20;
    for (long i = o->iters - k; i < o->iters; i++)
        tail += r->losses[i];
    tail /= (double)k;
    printf("final: train %.4f (mean of last %ld)  validation %.4f  unigram %.4f nats/%s  "
           "(%.1f%% below unigram); validation %.4f nats/char = %.4f bits/char%s\n",
           tail, k, pg->val.per_token, r->unigram, r->unit,
           100.0 * (r->unigram - pg->val.per_token) / r->unigram, pg->val.per_char,
           pg->val.per_char / M_LN2, r->text.words ? " (<unk> spelled out)" : "");
    if (pg->timed_iters > 0)
        printf("throughput: %.0f %ss/s, %.2f ms/iteration, blocked on communication "
               "%.1f%% of iteration time (mean over ranks; iterations 2..%ld, evaluation "
               "excluded)\n",
               (double)pg->timed_iters * r->B * r->T / pg->train_s, r->unit,
               1e3 * pg->train_s / (double)pg->timed_iters, 100.0 * blocked_share, o->iters);
    /* the second half: past dear's warm-up, the online plan and auto's checks */
    long first = o->iters / 2 + 1 > 2 ? o->iters / 2 + 1 : 2;
    if (first <= o->iters) {
        qsort(r->iter_s + first - 1, (size_t)(o->iters - first + 1), sizeof *r->iter_s,
              cmp_double);
        long n = o->iters - first + 1;
        double med = n % 2 ? r->iter_s[first - 1 + n / 2]
                           : 0.5 * (r->iter_s[first - 2 + n / 2] + r->iter_s[first - 1 + n / 2]);
        printf("iteration time: median %.2f ms of the slowest rank over iterations %ld..%ld\n",
               1e3 * med, first, o->iters);
    }
    if (r->P > 1)
        print_sparse_stats(r);
    if (r->loss_file) {
        for (long i = 0; i < o->iters; i++)
            fprintf(r->loss_file, "%ld %.9g\n", i + 1, r->losses[i]);
    }
    if (r->params_file) {
        for (size_t i = 0; i < r->model.num_params; i++)
            fprintf(r->params_file, "%.9g\n", (double)r->model.params_memory[i]);
    }
    fflush(stdout);
}

static int save_profile(const run_t *r)
{
    if (!r->o.profile_out)
        return 0;
    int rc = dear_profile_save(r->ctx, r->o.profile_out);
    if (rc != DEAR_OK) {
        if (r->rank == 0)
            fprintf(stderr, "dear-gpt: --profile-out %s: %s\n", r->o.profile_out,
                    dear_status_string(rc));
        return 1;
    }
    return 0;
}

/* Rank 0: --sample characters of text from the trained model. */
static void print_sample(run_t *r)
{
    const opts_t *o = &r->o;
    if (r->rank != 0 || o->sample <= 0)
        return;
    uint64_t sample_rng = (uint64_t)o->seed * 0xD1B54A32D192ED03ull + 11;
    int *ctx_buf = malloc((size_t)2 * r->T * sizeof *ctx_buf);
    if (ctx_buf) {
        printf("sample (%ld %ss, temperature %.2f):\n", o->sample, r->unit, o->temperature);
        sample_text(&r->model, &r->text, o->sample, o->temperature, &sample_rng, ctx_buf, stdout);
        free(ctx_buf);
    }
}

/* Close --loss-out, --params-out and dear (a failure there fails a run that had succeeded), free the run,
 * and end: status 1 on a rank that failed alone aborts the job, since the other ranks may be
 * waiting in a collective; status 2 is reached by every rank alike. */
static int run_end(run_t *r, int status)
{
    if (r->loss_file && fclose(r->loss_file) != 0 && status == 0) {
        fprintf(stderr, "dear-gpt: error writing --loss-out %s\n", r->o.loss_out);
        status = 1;
    }
    if (r->params_file && fclose(r->params_file) != 0 && status == 0) {
        fprintf(stderr, "dear-gpt: error writing --params-out %s\n", r->o.params_out);
        status = 1;
    }
    if (r->ctx) {
        int rc = dear_finalize(&r->ctx);
        if (rc != DEAR_OK && status == 0) {
            fprintf(stderr, "dear-gpt: dear_finalize: %s\n", dear_status_string(rc));
            status = 1;
        }
    }
    free(r->losses);
    free(r->iter_s);
    free(r->inputs);
    free(r->targets);
    free(r->slots);
    free(r->opt_state);
    if (r->have_model)
        gpt_model_free(&r->model);
    if (r->have_text)
        gpt_text_free(&r->text);
    if (status != 0 && status != 2 && r->P > 1) {
        /* a rank that failed alone would leave the others waiting in a collective; stdio's
         * buffers first, since MPI_Abort may end the process before they reach the launcher */
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status);
    }
    MPI_Finalize();
    return status;
}

int main(int argc, char **argv)
{
    static run_t r = {.P = 1};
    int provided;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dear-gpt: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.P);
    int status = check_options(&r, argc, argv);
    if (status >= 0) {
        MPI_Finalize();
        return status;
    }
#ifdef OPENBLAS_VERSION
    openblas_set_num_threads(1); /* one core per rank: ranks share the machine */
#endif
    progress_t pg;
    status = load_text(&r);
    if (status == 0)
        status = build_model(&r);
    if (status == 0)
        status = start_dear(&r);
    if (status == 0) {
        print_banner(&r);
        print_opt_state(&r);
        status = train(&r, &pg);
    }
    if (status == 0) {
        print_summary(&r, &pg);
        status = save_profile(&r);
    }
    if (status == 0)
        print_sample(&r);
    return run_end(&r, status);
}
