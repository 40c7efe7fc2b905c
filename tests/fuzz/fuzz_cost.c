/* Fuzz harness of the calibration-cache reader (dear_cost_load). The input is loaded for the
 * key (P, ranks per host) of its first record, so accepted records reach the model. A load
 * either fails with DEAR_ERR_FORMAT or gives lines the cost functions can use (coefficients
 * finite and >= 0, curves of 2..DEAR_COST_MAXPTS increasing points) that survive a save and a
 * second load (to the 9 and 6 digits the writer keeps). */
#include "tests/fuzz/fuzz.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "base/textio.h"
#include "fusion/cost.h"
#include "include/dear_types.h"

/* P and ranks per host of the first line that starts with two integers, else 4 and 1. */
static void first_key(const uint8_t *data, size_t size, int *p, int *rph)
{
    char line[128];
    size_t pos = 0;
    while (dear_fuzz_next_line(data, size, &pos, line, sizeof line)) {
        char *f[3];
        if (dear_text_fields(line, f, 2) >= 2 && dear_text_int(f[0], p) == 0 && dear_text_int(f[1], rph) == 0)
            return;
    }
    *p = 4;
    *rph = 1;
}

static int check_line(const dear_cost_line_t *l)
{
    DEAR_FUZZ_EXPECT(isfinite(l->alpha) && isfinite(l->beta) && isfinite(l->gamma) && l->alpha >= 0 &&
                         l->beta >= 0 && l->gamma >= 0,
                     "coefficients %g %g %g", l->alpha, l->beta, l->gamma);
    DEAR_FUZZ_EXPECT(l->npts == 0 || (l->npts >= 2 && l->npts <= DEAR_COST_MAXPTS), "%d points", l->npts);
    for (int i = 0; i < l->npts; i++)
        DEAR_FUZZ_EXPECT(l->pt_sec[i] > 0 && (i == 0 || (l->pt_bytes[i] > l->pt_bytes[i - 1] &&
                                                        l->pt_sec[i] >= l->pt_sec[i - 1])),
                         "point %d (%g:%g) out of order", i, l->pt_bytes[i], l->pt_sec[i]);
    for (double b = 1; b <= 1e12; b *= 64)
        DEAR_FUZZ_EXPECT(dear_cost_line_eval(l, b) >= 0, "cost %g at %g bytes", dear_cost_line_eval(l, b), b);
    return 1;
}

static void expect_same(const dear_cost_line_t *a, const dear_cost_line_t *b)
{
    DEAR_FUZZ_EXPECT(b->valid && a->npts == b->npts && a->nsamples == b->nsamples, "a line lost its points or samples");
    DEAR_FUZZ_EXPECT(dear_fuzz_close(a->alpha, b->alpha, 1e-8) && dear_fuzz_close(a->beta, b->beta, 1e-8) &&
                         dear_fuzz_close(a->gamma, b->gamma, 1e-8) && dear_fuzz_close(a->fit_err, b->fit_err, 1e-5),
                     "(%.17g %.17g %.17g %.17g) came back as (%.17g %.17g %.17g %.17g)", a->alpha, a->beta, a->gamma,
                     a->fit_err, b->alpha, b->beta, b->gamma, b->fit_err);
    for (int i = 0; i < a->npts; i++)
        DEAR_FUZZ_EXPECT(dear_fuzz_close(a->pt_bytes[i], b->pt_bytes[i], 1e-8) &&
                             dear_fuzz_close(a->pt_sec[i], b->pt_sec[i], 1e-8),
                         "point %d %.17g:%.17g came back as %.17g:%.17g", i, a->pt_bytes[i], a->pt_sec[i],
                         b->pt_bytes[i], b->pt_sec[i]);
}

/* Line k of op in m: the algorithms' lines, the compressed formats' curves, then the burst curve
 * (of FUZZ_INFLIGHT in flight, the default DEAR_MAX_INFLIGHT: the K the corpus names). */
#define NLINES (DEAR_ALGO_COUNT + DEAR_COMPRESS_COUNT)
#define FUZZ_INFLIGHT 4
static dear_cost_line_t *line_k(dear_cost_model_t *m, int op, int k)
{
    return k < DEAR_ALGO_COUNT ? &m->line[op][k]
           : k < NLINES - 1    ? &m->fmt[k - DEAR_ALGO_COUNT + 1][op]
                               : &m->burst[op];
}

int dear_fuzz_one(const uint8_t *data, size_t size)
{
    char in[DEAR_FUZZ_PATH_MAX], again[DEAR_FUZZ_PATH_MAX];
    dear_fuzz_path("input", in);
    dear_fuzz_path("again", again);
    dear_fuzz_write(in, data, size);
    int p, rph, found = -1;
    first_key(data, size, &p, &rph);
    dear_cost_model_t m;
    int rc = dear_cost_load_ex(in, p, rph, FUZZ_INFLIGHT, &m, &found);
    DEAR_FUZZ_EXPECT(rc == DEAR_OK || rc == DEAR_ERR_FORMAT, "status %d", rc);
    if (rc != DEAR_OK)
        return rc;
    DEAR_FUZZ_EXPECT(m.comm_size == p && m.ranks_per_host == rph, "model for P %d, %d per host", m.comm_size,
                     m.ranks_per_host);
    int nvalid = 0;
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
        for (int k = 0; k < NLINES; k++)
            if (line_k(&m, op, k)->valid)
                nvalid += check_line(line_k(&m, op, k));
    /* found counts records, and a key given twice is one line: the last record wins. */
    DEAR_FUZZ_EXPECT(found >= nvalid && (found == 0) == (nvalid == 0), "%d records found, %d lines", found, nvalid);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
        if (nvalid > 0) {
            int algo;
            double t = dear_cost_eval(&m, (dear_coll_op_t)op, 1 << 20, &algo);
            DEAR_FUZZ_EXPECT(!isnan(t) && (algo >= 0 || isinf(t)), "cost %g by algorithm %d", t, algo);
            for (int c = 1; c < DEAR_COMPRESS_COUNT; c++)
                DEAR_FUZZ_EXPECT(!isnan(dear_cost_eval_fmt(&m, (dear_coll_op_t)op, c, 1 << 20)), "format %d cost NaN", c);
            for (double b = 1; b < 1e12; b *= 37) {
                double f = dear_cost_queued_factor(&m, (dear_coll_op_t)op, b);
                DEAR_FUZZ_EXPECT(f >= 0 && !isnan(f), "queued factor %g at %g B", f, b);
            }
        }
    DEAR_FUZZ_EXPECT(m.burst_k == 0 || m.burst_k == FUZZ_INFLIGHT, "burst curves of %d in flight loaded", m.burst_k);
    if (nvalid == 0)
        return rc;
    unlink(again);
    DEAR_FUZZ_EXPECT(dear_cost_save(again, &m) == DEAR_OK, "cannot save what was loaded");
    dear_cost_model_t back;
    int found2 = -1;
    int rc2 = dear_cost_load_ex(again, p, rph, FUZZ_INFLIGHT, &back, &found2);
    DEAR_FUZZ_EXPECT(rc2 == DEAR_OK && found2 == nvalid, "a saved cache is refused (status %d, %d of %d lines)", rc2,
                     found2, nvalid);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
        for (int k = 0; k < NLINES; k++)
            if (line_k(&m, op, k)->valid)
                expect_same(line_k(&m, op, k), line_k(&back, op, k));
    return rc;
}
