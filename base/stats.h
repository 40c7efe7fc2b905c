/* Samples: a series of timings capped in length, and their median (see stats.c). */
#ifndef DEAR_STATS_H
#define DEAR_STATS_H

#include <stddef.h>

typedef struct {
    double *v;
    size_t n, cap;
} dear_samples_t;

void dear_samples_add(dear_samples_t *s, double v);
double dear_samples_median(const dear_samples_t *s);
/* Median of v[0..n) (0 when n is 0); v is left as it was. */
double dear_median(const double *v, size_t n);
void dear_samples_free(dear_samples_t *s);
/* Seconds per item of a stream that started at t0, up to k items in flight, whose items completed
 * at done[0..n) (ascending, n >= k >= 1): the median over windows of k completions, the first
 * window from t0. A stall lengthens the few windows it falls in, not the median, where a mean
 * over the stream would carry it. 0 when n < k. */
double dear_stream_median(const double *done, size_t n, int k, double t0);

/* Two series of timings side by side: their medians and the spread they share. */
typedef struct {
    double med_a, med_b;
    double spread;      /* 1.4826 x the median absolute deviation of every sample from its series' median */
    double margin;      /* max(k x spread, tol x the smaller median) */
} dear_compare_t;

/* Which series ran faster, judged against its own noise: -1 when a's median is below b's by more
 * than the margin, +1 when b's is, 0 when the difference is within it (inconclusive). The spread
 * is a robust standard deviation (the scaled MAD of the deviations of both series pooled), so a
 * stall in either series does not inflate it and a quiet run still has one; tol keeps differences
 * too small to matter from deciding anything. na, nb > 0. */
int dear_samples_compare(const double *a, size_t na, const double *b, size_t nb, double k, double tol,
                         dear_compare_t *out);

/* Why auto's check kept the plan it kept (dear_check_verdict). */
typedef enum {
    DEAR_VERDICT_MEASURED, /* one plan measured faster beyond the margin */
    DEAR_VERDICT_MODEL,    /* inconclusive; the model's predicted difference fits the samples */
    DEAR_VERDICT_REFUTED,  /* inconclusive, but the samples refute the model's predicted difference */
    DEAR_VERDICT_TIE,      /* inconclusive between plans predicted alike: the lower median stays */
} dear_verdict_t;

/* The plan auto's check keeps (1 the new, 0 the old), from c = dear_samples_compare(old, new) and
 * its result how, and the model's predictions for both plans (seconds; a failed prediction is
 * infinite and loses). Beyond the margin the measurement decides. Within it the model decides,
 * unless the difference it predicted lies more than the margin away from the measured one: a
 * model the samples contradict has no say, and the plan measured faster stays. */
int dear_check_verdict(int how, const dear_compare_t *c, double pred_old, double pred_new, dear_verdict_t *why);

/* The plan the check of two plans the model predicts alike keeps (1 the new, 0 the old): beyond
 * the margin the measurement decides, as dear_check_verdict; within it the lower median, the old
 * plan on equal (or missing) ones. Why: the model has no say between them, so the samples are the
 * only evidence; following them costs nothing in expectation where the plans run alike, and a
 * fixed choice loses the whole difference whenever the other plan is the faster. */
int dear_tie_verdict(int how, const dear_compare_t *c, dear_verdict_t *why);

#endif
