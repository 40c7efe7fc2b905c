/* Cost model: evaluation, least-squares fit, presets, scaling and the calibration cache file.
 * Pure C; the runtime measures, this file only does arithmetic and files. */
#include "fusion/cost.h"
#include "base/fileio.h"
#include "base/textio.h"
#include "base/util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/dear_types.h"
#include "base/log.h"

double dear_cost_line_eval(const dear_cost_line_t *line, double bytes)
{
    int n = line->npts;
    if (n < 2)
        return line->alpha + (line->beta + line->gamma) * bytes;
    const double *x = line->pt_bytes, *y = line->pt_sec;
    if (bytes <= x[0])
        return y[0]; /* start-up dominated: no cheaper than the smallest measured size */
    /* Beyond the largest: its own time per byte. Why: a slope from two noisy samples carries
     * about three times their relative noise, and could promise a rate never measured. */
    if (bytes >= x[n - 1])
        return y[n - 1] / x[n - 1] * bytes;
    int i = 0; /* the segment [i, i + 1] holding bytes */
    while (bytes > x[i + 1])
        i++;
    return y[i] + (y[i + 1] - y[i]) / (x[i + 1] - x[i]) * (bytes - x[i]);
}

double dear_cost_eval(const dear_cost_model_t *model, dear_coll_op_t op, double bytes, int *algo)
{
    double best = INFINITY;
    int which = -1;
    if (model->line[op][DEAR_ALGO_AUTO].valid) {
        if (algo)
            *algo = DEAR_ALGO_AUTO;
        return dear_cost_line_eval(&model->line[op][DEAR_ALGO_AUTO], bytes);
    }
    for (int a = 0; a < DEAR_ALGO_COUNT; a++) {
        const dear_cost_line_t *l = &model->line[op][a];
        if (!l->valid)
            continue;
        double t = dear_cost_line_eval(l, bytes);
        if (t < best) {
            best = t;
            which = a;
        }
    }
    if (algo)
        *algo = which;
    return best;
}

double dear_cost_eval_fmt(const dear_cost_model_t *model, dear_coll_op_t op, int c, double wire)
{
    if (c > DEAR_COMPRESS_NONE && c < DEAR_COMPRESS_COUNT && model->fmt[c][op].valid)
        return dear_cost_line_eval(&model->fmt[c][op], wire);
    return dear_cost_eval(model, op, wire, NULL);
}

const dear_cost_line_t *dear_cost_burst(const dear_cost_model_t *model, dear_coll_op_t op)
{
    const dear_cost_line_t *b = &model->burst[op];
    return model->burst_k >= 2 && b->valid && b->npts >= 2 ? b : NULL;
}

double dear_cost_queued_factor(const dear_cost_model_t *model, dear_coll_op_t op, double bytes)
{
    const dear_cost_line_t *b = dear_cost_burst(model, op), *a = &model->line[op][DEAR_ALGO_AUTO];
    if (!b || !a->valid || bytes > b->pt_bytes[b->npts - 1])
        return 1.0;
    double x = bytes < b->pt_bytes[0] ? b->pt_bytes[0] : bytes, alone = dear_cost_line_eval(a, x);
    return alone > 0 ? dear_cost_line_eval(b, x) / alone : 1.0;
}

/* Weighted least squares of y = a + b x with weights w; returns -1 if degenerate. */
static int wls(const double *x, const double *y, const double *w, int n, double *a, double *b)
{
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        sw += w[i];
        sx += w[i] * x[i];
        sy += w[i] * y[i];
        sxx += w[i] * x[i] * x[i];
        sxy += w[i] * x[i] * y[i];
    }
    double det = sw * sxx - sx * sx;
    if (!(fabs(det) > 1e-300 * (sw * sxx + 1e-300)) || sw <= 0)
        return -1;
    *b = (sw * sxy - sx * sy) / det;
    *a = (sy - *b * sx) / sw;
    return 0;
}

const dear_cost_line_t *dear_cost_idle(const dear_cost_model_t *model, dear_coll_op_t op)
{
    const dear_cost_line_t *l = &model->idle[op];
    return l->valid && l->npts >= 2 ? l : NULL;
}

double dear_cost_idle_factor(const dear_cost_model_t *model, dear_coll_op_t op, double bytes)
{
    const dear_cost_line_t *l = dear_cost_idle(model, op), *a = &model->line[op][DEAR_ALGO_AUTO];
    if (!l || !a->valid || bytes <= l->pt_bytes[0])
        return 1.0;
    /* The idle curve's slope by least squares over its points: a burst allowance shifts every
     * lone collective by the same time, so it leaves the slope alone. */
    double w[DEAR_COST_MAXPTS], icpt, slope, back = dear_cost_line_eval(a, bytes);
    for (int i = 0; i < l->npts; i++)
        w[i] = 1.0;
    if (wls(l->pt_bytes, l->pt_sec, w, l->npts, &icpt, &slope) != 0 || !(slope > 0) || !(back > 0))
        return 1.0;
    double x0 = l->pt_bytes[0], lone = dear_cost_line_eval(a, x0) + slope * (bytes - x0);
    double f = lone / back + DEAR_COST_IDLE_TOL;
    return f < 1.0 ? f : 1.0;
}

int dear_cost_fit(const double *bytes, const double *seconds, int n, dear_cost_line_t *line)
{
    if (!bytes || !seconds || !line || n < 2) {
        DEAR_ERROR("cost", "fit needs at least 2 (bytes, seconds) samples, got %d", n);
        return DEAR_ERR_ARG;
    }
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        if (!(seconds[i] > 0) || !(bytes[i] >= 0) || !isfinite(seconds[i])) {
            DEAR_ERROR("cost", "fit sample %d is invalid (bytes %g, seconds %g): need bytes >= 0 and seconds > 0", i,
                       bytes[i], seconds[i]);
            return DEAR_ERR_ARG;
        }
        if (bytes[i] != bytes[0])
            distinct = 1;
    }
    if (!distinct) {
        DEAR_ERROR("cost", "fit needs at least two distinct sizes, all %d samples are %g bytes", n, bytes[0]);
        return DEAR_ERR_ARG;
    }
    double *w = malloc(sizeof(double) * (size_t)n);
    if (!w)
        return DEAR_ERR_NOMEM;
    for (int i = 0; i < n; i++)
        w[i] = 1.0 / (seconds[i] * seconds[i]);
    double a = 0, b = 0;
    int rc = wls(bytes, seconds, w, n, &a, &b);
    if (rc == 0 && a < 0) {
        /* Through the origin: b = sum(w x y) / sum(w x x). */
        double sxy = 0, sxx = 0;
        for (int i = 0; i < n; i++) {
            sxy += w[i] * bytes[i] * seconds[i];
            sxx += w[i] * bytes[i] * bytes[i];
        }
        a = 0;
        b = sxx > 0 ? sxy / sxx : 0;
    }
    if (rc == 0 && b < 0) {
        /* Constant: the weighted mean. */
        double sw = 0, sy = 0;
        for (int i = 0; i < n; i++) {
            sw += w[i];
            sy += w[i] * seconds[i];
        }
        a = sy / sw;
        b = 0;
    }
    free(w);
    if (rc != 0) {
        DEAR_ERROR("cost", "fit is degenerate for %d samples", n);
        return DEAR_ERR_ARG;
    }
    dear_cost_line_t out = { .valid = 1, .alpha = a, .beta = b, .gamma = 0, .nsamples = n };
    for (int i = 0; i < n; i++) {
        double r = fabs(a + b * bytes[i] - seconds[i]) / seconds[i];
        if (r > out.fit_err)
            out.fit_err = r;
    }
    *line = out;
    return DEAR_OK;
}

int dear_cost_fit_curve(const double *bytes, const double *seconds, int n, dear_cost_line_t *line)
{
    if (n > DEAR_COST_MAXPTS) {
        DEAR_ERROR("cost", "a curve holds at most %d points, got %d samples", DEAR_COST_MAXPTS, n);
        return DEAR_ERR_ARG;
    }
    dear_cost_line_t l;
    int rc = dear_cost_fit(bytes, seconds, n, &l);
    if (rc != DEAR_OK)
        return rc;
    int order[DEAR_COST_MAXPTS];
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && bytes[order[j - 1]] > bytes[i]; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    for (int i = 0; i < n; i++) {
        l.pt_bytes[i] = bytes[order[i]];
        l.pt_sec[i] = i > 0 && seconds[order[i]] < l.pt_sec[i - 1] ? l.pt_sec[i - 1] : seconds[order[i]];
        if (i > 0 && !(l.pt_bytes[i] > l.pt_bytes[i - 1])) {
            DEAR_ERROR("cost", "a curve needs distinct sizes, %g bytes appears twice", l.pt_bytes[i]);
            return DEAR_ERR_ARG;
        }
    }
    l.npts = n;
    *line = l;
    return DEAR_OK;
}

int dear_cost_linear(const dear_cost_model_t *model, dear_coll_op_t op, double *alpha, double *beta)
{
    int nvalid = 0, last = -1;
    for (int a = 0; a < DEAR_ALGO_COUNT; a++)
        if (model->line[op][a].valid) {
            nvalid++;
            last = a;
        }
    if (nvalid == 0) {
        DEAR_ERROR("cost", "cost model has no line for %s", dear_coll_op_short(op));
        return DEAR_ERR_ARG;
    }
    if (nvalid == 1 && model->line[op][last].npts < 2) {
        *alpha = model->line[op][last].alpha;
        *beta = model->line[op][last].beta + model->line[op][last].gamma;
        return DEAR_OK;
    }
    enum { NS = 17 };
    double x[NS], y[NS];
    for (int i = 0; i < NS; i++) {
        x[i] = 4096.0 * pow(2.0, i);
        y[i] = dear_cost_eval(model, op, x[i], NULL);
    }
    dear_cost_line_t l;
    int rc = dear_cost_fit(x, y, NS, &l);
    if (rc != DEAR_OK)
        return rc;
    *alpha = l.alpha;
    *beta = l.beta;
    return DEAR_OK;
}

static void model_clear(dear_cost_model_t *m, int comm_size, int rph, const char *source)
{
    memset(m, 0, sizeof *m);
    m->comm_size = comm_size;
    m->ranks_per_host = rph;
    snprintf(m->source, sizeof m->source, "%s", source);
}

/* All-reduce (a, b) into the ring column; RS and AG as half an all-reduce each. */
static void model_set_ar(dear_cost_model_t *m, double a, double b)
{
    m->line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RING] = (dear_cost_line_t){ .valid = 1, .alpha = a, .beta = b };
    m->line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_RING] = (dear_cost_line_t){ .valid = 1, .alpha = a / 2, .beta = b / 2 };
    m->line[DEAR_COLL_ALLGATHER][DEAR_ALGO_RING] = (dear_cost_line_t){ .valid = 1, .alpha = a / 2, .beta = b / 2 };
}

int dear_cost_from_alpha_beta(double alpha, double beta, int comm_size, dear_cost_model_t *model)
{
    if (!(alpha >= 0) || !(beta >= 0) || !isfinite(alpha) || !isfinite(beta) || comm_size < 2) {
        DEAR_ERROR("cost", "alpha %g and beta %g must be finite and >= 0, workers %d must be >= 2", alpha, beta,
                   comm_size);
        return DEAR_ERR_ARG;
    }
    model_clear(model, comm_size, 1, "alpha-beta");
    model_set_ar(model, alpha, beta);
    return DEAR_OK;
}

typedef struct {
    const char *name;
    int p;
    double alpha, beta;   /* all-reduce */
} preset_t;

/* MG-WFBP (Shi et al.) all-reduce fits, seconds and seconds per byte. shm: one host of four
 * ranks, a memcpy-bound figure that calibration replaces (docs/PERFORMANCE.md#shm-preset). */
static const preset_t presets[] = {
    { "10gbe", 8, 5.23e-4, 8.57e-10 },
    { "10gbe", 16, 9.08e-4, 7.40e-10 },
    { "ib56", 8, 9.75e-5, 3.06e-10 },
    { "ib56", 16, 2.36e-4, 4.06e-10 },
    { "shm", 4, 1.5e-5, 4.0e-10 },
};

const char *dear_cost_preset_names(void)
{
    return "10gbe|ib56|shm";
}

int dear_cost_preset(const char *name, int comm_size, int ranks_per_host, dear_cost_model_t *model)
{
    if (!name || comm_size < 2) {
        DEAR_ERROR("cost", "preset needs a name (%s) and at least 2 workers (got %d)", dear_cost_preset_names(),
                   comm_size);
        return DEAR_ERR_ARG;
    }
    const preset_t *best = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0)
            continue;
        /* Nearest published P on a log scale. */
        if (!best || fabs(log((double)presets[i].p / comm_size)) < fabs(log((double)best->p / comm_size)))
            best = &presets[i];
    }
    if (!best) {
        DEAR_ERROR("cost", "unknown cost preset '%s' (accepted: %s)", name, dear_cost_preset_names());
        return DEAR_ERR_ARG;
    }
    dear_cost_model_t base;
    char src[32];
    snprintf(src, sizeof src, "preset:%s", name);
    model_clear(&base, best->p, ranks_per_host, src);
    model_set_ar(&base, best->alpha, best->beta);
    return dear_cost_scale(&base, comm_size, model);
}

static double ring_steps(int p)
{
    return (double)(p - 1);
}

static double log_steps(int p)
{
    return ceil(log2((double)p));
}

/* A line's start-up times st, the rest times bw (a curve's points as alpha plus the rest). */
static void scale_line(dear_cost_line_t *l, double st, double bw)
{
    if (!l->valid)
        return;
    for (int i = 0; i < l->npts; i++) {
        double rest = l->pt_sec[i] - l->alpha;
        l->pt_sec[i] = l->alpha * st + (rest > 0 ? rest * bw : rest * st);
    }
    l->alpha *= st;
    l->beta *= bw;
    l->gamma *= bw;
}

int dear_cost_scale(const dear_cost_model_t *in, int comm_size, dear_cost_model_t *out)
{
    if (!in || !out || comm_size < 2 || in->comm_size < 2) {
        DEAR_ERROR("cost", "scaling needs P >= 2 (model P %d, target P %d)", in ? in->comm_size : -1, comm_size);
        return DEAR_ERR_ARG;
    }
    dear_cost_model_t m = *in;
    int p0 = in->comm_size, p1 = comm_size;
    double bw = ((double)(p1 - 1) / p1) / ((double)(p0 - 1) / p0), ring = ring_steps(p1) / ring_steps(p0);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        for (int a = 0; a < DEAR_ALGO_COUNT; a++)
            scale_line(&m.line[op][a], a == DEAR_ALGO_RHD ? log_steps(p1) / log_steps(p0) : ring, bw);
        for (int c = 1; c < DEAR_COMPRESS_COUNT; c++) /* auto curves: scaled like the ring */
            scale_line(&m.fmt[c][op], ring, bw);
        scale_line(&m.burst[op], ring, bw);
        scale_line(&m.idle[op], ring, bw);
    }
    m.comm_size = p1;
    *out = m;
    return DEAR_OK;
}

void dear_cost_mul(dear_cost_model_t *model, double s)
{
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        for (int a = 0; a < DEAR_ALGO_COUNT; a++)
            scale_line(&model->line[op][a], s, s);
        for (int c = 1; c < DEAR_COMPRESS_COUNT; c++)
            scale_line(&model->fmt[c][op], s, s);
        scale_line(&model->burst[op], s, s);
        scale_line(&model->idle[op], s, s);
    }
}

/* ---- cache file ---- */

typedef struct {
    int p, rph;
    dear_coll_op_t op;
    dear_coll_algo_t algo;
    int fmt;            /* a compressed format's curve (algo auto+FORMAT), else 0 */
    int k;              /* a burst curve (algo auto/K), COST_IDLE for the idle curve (auto@idle), else 0 */
    dear_cost_line_t line;
} cost_rec_t;

/* The longest burst a record may name: DEAR_MAX_INFLIGHT's range. */
#define COST_MAX_BURST 64
#define COST_IDLE (-1)
#define COST_IDLE_SUFFIX "@idle"

#define COST_MAGIC "dear-cost 1"
/* Bounds a measured model cannot break: a cache line is short (a record and at most
 * DEAR_COST_MAXPTS points), a cache holds a few records per layout, and no collective costs a
 * minute of start-up or a second per byte; beyond them a value is damage, refused at its line
 * rather than failing a planner later with no file named. */
#define COST_MAX_LINE 4096
#define COST_MAX_BYTES ((size_t)16 << 20)
#define COST_MAX_ALPHA_S 60.0
#define COST_MAX_S_PER_BYTE 1.0
#define COST_MAX_PT_BYTES 1e15
#define COST_MAX_PT_S 3600.0
#define COST_MAX_FIT_ERR 1e3
#define COST_MAX_RANKS 10000000

/* "B:S,B:S,..." into line's curve; -1 unless 2..DEAR_COST_MAXPTS points with increasing sizes
 * and non-decreasing times > 0 (what dear_cost_fit_curve makes). */
static int parse_points(char *text, dear_cost_line_t *line)
{
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(text, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        if (!colon || n == DEAR_COST_MAXPTS)
            return -1;
        *colon = '\0';
        double b, t;
        if (dear_text_double(tok, 0, COST_MAX_PT_BYTES, &b) || dear_text_double(colon + 1, 0, COST_MAX_PT_S, &t) ||
            !(t > 0))
            return -1;
        if (n > 0 && (!(b > line->pt_bytes[n - 1]) || t < line->pt_sec[n - 1]))
            return -1;
        line->pt_bytes[n] = b;
        line->pt_sec[n] = t;
        n++;
    }
    if (n < 2)
        return -1;
    line->npts = n;
    return 0;
}

/* One record of a cache file, with its points when it has them; a format's curve (fmt > 0) is
 * algo auto+FORMAT, a burst curve (k > 0) auto/K, the idle curve auto@idle. */
static void write_record(FILE *f, int p, int rph, int op, int algo, int fmt, int k, const dear_cost_line_t *l)
{
    char suffix[32] = "";
    if (fmt)
        snprintf(suffix, sizeof suffix, "+%s", dear_compress_name((dear_compress_t)fmt));
    else if (k == COST_IDLE)
        snprintf(suffix, sizeof suffix, "%s", COST_IDLE_SUFFIX);
    else if (k)
        snprintf(suffix, sizeof suffix, "/%d", k);
    fprintf(f, "%d %d %s %s%s %.9g %.9g %.9g %.6g %d", p, rph, dear_coll_op_short((dear_coll_op_t)op),
            dear_coll_algo_name((dear_coll_algo_t)algo), suffix, l->alpha, l->beta, l->gamma, l->fit_err,
            l->nsamples);
    for (int i = 0; i < l->npts; i++)
        fprintf(f, "%c%.9g:%.9g", i ? ',' : ' ', l->pt_bytes[i], l->pt_sec[i]);
    fputc('\n', f);
}

/* An algorithm's name, auto+FORMAT for a compressed format's curve, auto/K for a burst curve
 * (2 <= K <= COST_MAX_BURST) or auto@idle for the idle curve; -1 if none of them. */
static int parse_algo(const char *text, dear_coll_algo_t *algo, int *fmt, int *k)
{
    char name[32];
    const char *plus = strchr(text, '+'), *slash = strchr(text, '/'), *at = strchr(text, '@');
    if (at) {
        if (plus || slash || strcmp(at, COST_IDLE_SUFFIX) != 0)
            return -1;
        snprintf(name, sizeof name, "%.*s", (int)(at - text), text);
        *fmt = 0;
        *k = COST_IDLE;
        return dear_coll_algo_parse(name, algo) || *algo != DEAR_ALGO_AUTO ? -1 : 0;
    }
    const char *cut = plus ? plus : slash;
    dear_compress_t c = DEAR_COMPRESS_NONE;
    long burst = 0;
    if (plus && slash)
        return -1;
    if (plus && (dear_compress_parse(plus + 1, &c) || c == DEAR_COMPRESS_NONE))
        return -1;
    if (slash && dear_text_long(slash + 1, 2, COST_MAX_BURST, &burst))
        return -1;
    snprintf(name, sizeof name, "%.*s", cut ? (int)(cut - text) : (int)strlen(text), text);
    if (dear_coll_algo_parse(name, algo) || (cut && *algo != DEAR_ALGO_AUTO))
        return -1;
    *fmt = (int)c;
    *k = (int)burst;
    return 0;
}

/* Read every record of a cache file. A missing file gives 0 records. */
static int cost_read(const char *path, cost_rec_t **recs, int *nrecs)
{
    *recs = NULL;
    *nrecs = 0;
    dear_lines_t lr;
    int rc = dear_lines_open(&lr, path, "calibration file", COST_MAX_LINE, COST_MAX_BYTES, 1);
    if (rc != DEAR_OK || !lr.f)
        return rc;
    int lineno = 0, seen_magic = 0, cap = 0, got;
    char *buf;
    cost_rec_t *r = NULL;
    while ((got = dear_lines_next(&lr, &buf)) == 1) {
        lineno = lr.lineno;
        char *hash = strchr(buf, '#');
        if (hash)
            *hash = '\0';
        char *fld[12];
        int nf = dear_text_fields(buf, fld, 11);
        if (nf == 0)
            continue;
        if (!seen_magic) {
            if (nf != 2 || strcmp(fld[0], "dear-cost") != 0 || strcmp(fld[1], "1") != 0) {
                DEAR_ERROR("cost", "%s:%d: expected the header '%s'", path, lineno, COST_MAGIC);
                rc = DEAR_ERR_FORMAT;
                break;
            }
            seen_magic = 1;
            continue;
        }
        cost_rec_t c = { 0 };
        long p, rph, ns;
        if ((nf != 9 && nf != 10) || dear_text_long(fld[0], 1, COST_MAX_RANKS, &p) ||
            dear_text_long(fld[1], 1, p, &rph) || dear_coll_op_parse(fld[2], &c.op) ||
            parse_algo(fld[3], &c.algo, &c.fmt, &c.k) || dear_text_double(fld[4], 0, COST_MAX_ALPHA_S, &c.line.alpha) ||
            dear_text_double(fld[5], 0, COST_MAX_S_PER_BYTE, &c.line.beta) ||
            dear_text_double(fld[6], 0, COST_MAX_S_PER_BYTE, &c.line.gamma) ||
            dear_text_double(fld[7], 0, COST_MAX_FIT_ERR, &c.line.fit_err) ||
            dear_text_long(fld[8], 0, 1000000000L, &ns)) {
            DEAR_ERROR("cost",
                       "%s:%d: expected 'P ranks_per_host rs|ag|ar ring|rhd|mpi|auto|auto+FORMAT|auto/K|auto@idle "
                       "alpha beta gamma fit_err nsamples [points]' (FORMAT: bf16, fp16 or int8; K: 2 to %d) with 1 <= "
                       "ranks_per_host <= P <= %d, alpha in [0, %g] s, beta and gamma in [0, %g] s/byte, fit_err in [0, %g], nsamples >= 0",
                       path, lineno, COST_MAX_BURST, COST_MAX_RANKS, COST_MAX_ALPHA_S, COST_MAX_S_PER_BYTE,
                       COST_MAX_FIT_ERR);
            rc = DEAR_ERR_FORMAT;
            break;
        }
        if (nf == 10 && parse_points(fld[9], &c.line) != 0) {
            DEAR_ERROR("cost",
                       "%s:%d: expected the points as BYTES:SECONDS,BYTES:SECONDS,... (2 to %d of them, sizes "
                       "increasing, times > 0 and non-decreasing), got '%s'",
                       path, lineno, DEAR_COST_MAXPTS, fld[9]);
            rc = DEAR_ERR_FORMAT;
            break;
        }
        c.p = (int)p;
        c.rph = (int)rph;
        c.line.nsamples = (int)ns;
        c.line.valid = 1;
        if (*nrecs == cap) {
            cap = cap ? 2 * cap : 16;
            cost_rec_t *nr = realloc(r, sizeof *r * (size_t)cap);
            if (!nr) {
                rc = DEAR_ERR_NOMEM;
                break;
            }
            r = nr;
        }
        r[(*nrecs)++] = c;
    }
    if (rc == DEAR_OK && got < 0)
        rc = got;
    if (rc == DEAR_OK && !seen_magic && lineno > 0) {
        DEAR_ERROR("cost", "%s: no '%s' header", path, COST_MAGIC);
        rc = DEAR_ERR_FORMAT;
    }
    dear_lines_close(&lr);
    if (rc != DEAR_OK) {
        free(r);
        *nrecs = 0;
        return rc;
    }
    *recs = r;
    return DEAR_OK;
}

int dear_cost_load(const char *path, int comm_size, int ranks_per_host, dear_cost_model_t *model, int *found)
{
    return dear_cost_load_ex(path, comm_size, ranks_per_host, 0, model, found);
}

/* Where a record goes in a model (its key without P and ranks per host). */
static dear_cost_line_t *rec_slot(dear_cost_model_t *m, const cost_rec_t *c)
{
    if (c->k == COST_IDLE)
        return &m->idle[c->op];
    return c->k ? &m->burst[c->op] : c->fmt ? &m->fmt[c->fmt][c->op] : &m->line[c->op][c->algo];
}

int dear_cost_load_ex(const char *path, int comm_size, int ranks_per_host, int inflight, dear_cost_model_t *model,
                      int *found)
{
    if (!path || !model || !found)
        return DEAR_ERR_ARG;
    cost_rec_t *recs;
    int n;
    int rc = cost_read(path, &recs, &n);
    if (rc != DEAR_OK)
        return rc;
    dear_cost_model_t m;
    model_clear(&m, comm_size, ranks_per_host, "file");
    int k = 0;
    for (int i = 0; i < n; i++)
        if (recs[i].p == comm_size && recs[i].rph == ranks_per_host && (recs[i].k <= 0 || recs[i].k == inflight)) {
            *rec_slot(&m, &recs[i]) = recs[i].line;
            m.burst_k = recs[i].k > 0 ? recs[i].k : m.burst_k;
            k++;
        }
    free(recs);
    *model = m;
    *found = k;
    return DEAR_OK;
}

int dear_cost_save(const char *path, const dear_cost_model_t *model)
{
    if (!path || !model)
        return DEAR_ERR_ARG;
    /* The records of other layouts are kept, so the file is read first: refuse a link or a
     * device before even that. */
    if (dear_file_check_target(path, "calibration file") != DEAR_OK)
        return DEAR_ERR_IO;
    cost_rec_t *recs;
    int n;
    int rc = cost_read(path, &recs, &n);
    if (rc != DEAR_OK)
        return rc;
    dear_file_out_t out;
    rc = dear_file_out_open(&out, path, "calibration file");
    if (rc != DEAR_OK) {
        free(recs);
        return rc;
    }
    FILE *f = out.f;
    fprintf(f, "%s\n# dear calibration cache (docs/FORMATS.md): time = alpha + (beta + gamma) * bytes, or\n"
               "# interpolated between the points bytes:seconds when a record has them; algo auto+FORMAT:\n"
               "# float32 vectors travelling compressed, by the bytes on the wire; algo auto/K: seconds per\n"
               "# collective with K in flight; algo auto@idle: each alone, after the link was idle\n"
               "# P ranks_per_host op algo alpha_s beta_s_per_byte gamma_s_per_byte fit_err nsamples [points]\n",
            COST_MAGIC);
    for (int i = 0; i < n; i++) {
        const cost_rec_t *c = &recs[i];
        const dear_cost_line_t *mine = rec_slot((dear_cost_model_t *)model, c);
        if (c->p == model->comm_size && c->rph == model->ranks_per_host && mine->valid &&
            (c->k <= 0 || c->k == model->burst_k))
            continue;   /* replaced below */
        write_record(f, c->p, c->rph, c->op, c->algo, c->fmt, c->k, &c->line);
    }
    free(recs);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        for (int a = 0; a < DEAR_ALGO_COUNT; a++)
            if (model->line[op][a].valid)
                write_record(f, model->comm_size, model->ranks_per_host, op, a, 0, 0, &model->line[op][a]);
        for (int c = 1; c < DEAR_COMPRESS_COUNT; c++)
            if (model->fmt[c][op].valid)
                write_record(f, model->comm_size, model->ranks_per_host, op, DEAR_ALGO_AUTO, c, 0,
                             &model->fmt[c][op]);
        if (model->burst_k >= 2 && model->burst[op].valid)
            write_record(f, model->comm_size, model->ranks_per_host, op, DEAR_ALGO_AUTO, 0, model->burst_k,
                         &model->burst[op]);
        if (model->idle[op].valid)
            write_record(f, model->comm_size, model->ranks_per_host, op, DEAR_ALGO_AUTO, 0, COST_IDLE,
                         &model->idle[op]);
    }
    return dear_file_out_commit(&out);
}

static void print_line(FILE *out, int op, const char *name, const dear_cost_line_t *l)
{
    if (!l->valid)
        return;
    double b = l->beta + l->gamma;
    fprintf(out, "  %s %-4s alpha %10.3f us  beta %8.4f ns/B (%7.1f MB/s)", dear_coll_op_short((dear_coll_op_t)op),
            name, l->alpha * 1e6, b * 1e9, b > 0 ? 1e-6 / b : INFINITY);
    if (l->npts >= 2)
        fprintf(out, "  curve through %d measured sizes (%.0f%% from linear)", l->npts, 100 * l->fit_err);
    else if (l->nsamples > 0)
        fprintf(out, "  fit: %d samples, max rel. error %.1f%%", l->nsamples, 100 * l->fit_err);
    fputc('\n', out);
}

void dear_cost_print(FILE *out, const dear_cost_model_t *model)
{
    fprintf(out, "cost model (%s) for P=%d, %d rank(s) per host\n", model->source, model->comm_size,
            model->ranks_per_host);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        for (int a = 0; a < DEAR_ALGO_COUNT; a++)
            print_line(out, op, dear_coll_algo_name((dear_coll_algo_t)a), &model->line[op][a]);
        for (int c = 1; c < DEAR_COMPRESS_COUNT; c++) {
            char name[32];
            snprintf(name, sizeof name, "auto+%s", dear_compress_name((dear_compress_t)c));
            print_line(out, op, name, &model->fmt[c][op]);
        }
        const dear_cost_line_t *bl = dear_cost_burst(model, (dear_coll_op_t)op);
        if (bl) {
            char name[32];
            snprintf(name, sizeof name, "auto/%d", model->burst_k);
            print_line(out, op, name, bl);
            fprintf(out, "    queued behind others (%d in flight), a %s costs", model->burst_k,
                    dear_coll_op_short((dear_coll_op_t)op));
            for (int i = 0; i < bl->npts; i++)
                fprintf(out, "%s x%.2f at %.0f B", i ? "," : "",
                        dear_cost_queued_factor(model, (dear_coll_op_t)op, bl->pt_bytes[i]), bl->pt_bytes[i]);
            fprintf(out, " of its time alone; x1 above %.0f B (not measured there)\n", bl->pt_bytes[bl->npts - 1]);
        }
        const dear_cost_line_t *il = dear_cost_idle(model, (dear_coll_op_t)op);
        if (il) {
            print_line(out, op, "auto" COST_IDLE_SUFFIX, il);
            fprintf(out, "    starting on a link idle for %g ms, a %s costs", 1e3 * DEAR_COST_IDLE_GAP_S,
                    dear_coll_op_short((dear_coll_op_t)op));
            for (int i = 0; i < il->npts; i++)
                fprintf(out, "%s x%.2f at %.0f B", i ? "," : "",
                        dear_cost_idle_factor(model, (dear_coll_op_t)op, il->pt_bytes[i]), il->pt_bytes[i]);
            fprintf(out, " of its time back to back; x1 up to %.0f B\n", il->pt_bytes[0]);
        }
    }
}
