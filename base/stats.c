/* Samples and their statistics: a capped series of timings (per layer, per iteration) and the
 * median, the statistic the planners and reports use because stalls of a shared machine only
 * ever add time. */
#include "base/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Per-layer and per-iteration samples are capped so a long run does not grow without bound;
 * the median of the most recent window is what a planner wants anyway. */
#define SAMPLES_MAX 4096

void dear_samples_add(dear_samples_t *s, double v)
{
    if (s->n == SAMPLES_MAX) {
        memmove(s->v, s->v + SAMPLES_MAX / 2, sizeof *s->v * (SAMPLES_MAX / 2));
        s->n = SAMPLES_MAX / 2;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        double *nv = realloc(s->v, sizeof *nv * cap);
        if (!nv)
            return; /* a lost sample only blurs a statistic */
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dear_median(const double *v, size_t n)
{
    if (n == 0)
        return 0;
    double *tmp = malloc(sizeof *tmp * n);
    if (!tmp)
        return v[n - 1];
    memcpy(tmp, v, sizeof *tmp * n);
    qsort(tmp, n, sizeof *tmp, cmp_double);
    double m = n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
    free(tmp);
    return m;
}

double dear_stream_median(const double *done, size_t n, int k, double t0)
{
    if (k < 1 || n < (size_t)k)
        return 0;
    double *w = malloc(sizeof *w * (n - (size_t)k + 1));
    if (!w)
        return (done[n - 1] - t0) / (double)n; /* the mean: a stall only blurs it */
    size_t nw = 0;
    for (size_t i = (size_t)k - 1; i < n; i++)
        w[nw++] = (done[i] - (i >= (size_t)k ? done[i - (size_t)k] : t0)) / k;
    double m = dear_median(w, nw);
    free(w);
    return m;
}

double dear_samples_median(const dear_samples_t *s)
{
    return dear_median(s->v, s->n);
}

void dear_samples_free(dear_samples_t *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}


/* The scaled MAD estimates the standard deviation of normal noise (1.4826 = 1 / Phi^-1(3/4)) while
 * ignoring up to half of the samples, so one stalled iteration moves neither medians nor spread. */
int dear_samples_compare(const double *a, size_t na, const double *b, size_t nb, double k, double tol,
                         dear_compare_t *out)
{
    dear_compare_t c = { dear_median(a, na), dear_median(b, nb), 0, 0 };
    double *dev = malloc(sizeof *dev * (na + nb));
    if (dev) {
        for (size_t i = 0; i < na; i++)
            dev[i] = fabs(a[i] - c.med_a);
        for (size_t i = 0; i < nb; i++)
            dev[na + i] = fabs(b[i] - c.med_b);
        c.spread = 1.4826 * dear_median(dev, na + nb);
        free(dev);
    } else {
        c.spread = INFINITY; /* no judgement without the spread: inconclusive */
    }
    c.margin = fmax(k * c.spread, tol * fmin(c.med_a, c.med_b));
    *out = c;
    if (c.med_a + c.margin < c.med_b)
        return -1;
    if (c.med_b + c.margin < c.med_a)
        return 1;
    return 0;
}

int dear_check_verdict(int how, const dear_compare_t *c, double pred_old, double pred_new, dear_verdict_t *why)
{
    if (how != 0) {
        *why = DEAR_VERDICT_MEASURED;
        return how > 0;
    }
    /* The new plan wins a tie, being the fresher; a failed prediction loses. */
    int model_new = !(pred_new > pred_old);
    *why = DEAR_VERDICT_MODEL;
    if (!isfinite(pred_old) || !isfinite(pred_new) || !isfinite(c->margin))
        return model_new;
    double gain_pred = pred_old - pred_new, gain_meas = c->med_a - c->med_b;
    if (fabs(gain_pred - gain_meas) <= c->margin)
        return model_new;
    *why = DEAR_VERDICT_REFUTED;
    return c->med_b < c->med_a;
}

int dear_tie_verdict(int how, const dear_compare_t *c, dear_verdict_t *why)
{
    if (how != 0) {
        *why = DEAR_VERDICT_MEASURED;
        return how > 0;
    }
    *why = DEAR_VERDICT_TIE;
    return c->med_b < c->med_a;
}
