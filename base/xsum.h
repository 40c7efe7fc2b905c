/*
 * An exact sum of doubles: each value is added into fixed-point limbs that cover every double's
 * exponent, so the total does not depend on the order or grouping of the additions. Summing
 * ranks' partial sums element-wise (the limbs as float64, each below 2^32 once exported) is exact
 * too, in any order, up to 2^21 ranks. What it is for: a norm whose value must not depend on how
 * the elements were split between ranks and buckets (clipping under DEAR_DETERMINISTIC).
 */
#ifndef DEAR_XSUM_H
#define DEAR_XSUM_H

#include <stdint.h>

/* Limbs of 32 bits from 2^-1074 (the smallest subnormal) past 2^1024, with room for carries. */
#define DEAR_XSUM_LIMBS 68
/* Exported: the limbs, then the sum of the non-finite values added (0 when none). */
#define DEAR_XSUM_WORDS (DEAR_XSUM_LIMBS + 1)

typedef struct dear_xsum_s {
    int64_t limb[DEAR_XSUM_LIMBS];
    double special;             /* Inf and NaN added, summed as doubles */
    uint32_t pending;           /* additions since the last carry propagation */
} dear_xsum_t;

void dear_xsum_init(dear_xsum_t *x);
/* x += v, exactly (v of either sign; a non-finite v makes the total non-finite). */
void dear_xsum_add(dear_xsum_t *x, double v);
/* The total as DEAR_XSUM_WORDS doubles, each limb in [0, 2^32): the total must not be negative. */
void dear_xsum_export(dear_xsum_t *x, double out[DEAR_XSUM_WORDS]);
/* The value of exported words (or of element-wise sums of them, each below 2^53), rounded as a
 * function of the exact total alone: the limbs carried, then added from the lowest up. */
double dear_xsum_value(const double w[DEAR_XSUM_WORDS]);

#endif
