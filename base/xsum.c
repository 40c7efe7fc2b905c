/*
 * The exact sum (xsum.h). A finite double is m * 2^e with m a 53-bit integer; it lands in the
 * limbs at bit e + 1074 as three 32-bit pieces. A limb takes 2^30 such pieces before a carry
 * propagation must run, so one runs every 2^30 additions.
 */
#include "base/xsum.h"

#include <math.h>
#include <string.h>

#define BITS 32
#define MASK ((int64_t)0xffffffff)
#define EMIN (-1074)

void dear_xsum_init(dear_xsum_t *x) { memset(x, 0, sizeof *x); }

/* Every limb but the top one in [0, 2^32) (the top one keeps the sign). */
static void carry(dear_xsum_t *x)
{
    for (int i = 0; i < DEAR_XSUM_LIMBS - 1; i++) {
        int64_t c = x->limb[i] >> BITS; /* arithmetic: a negative limb borrows */
        x->limb[i] -= c * ((int64_t)1 << BITS);
        x->limb[i + 1] += c;
    }
    x->pending = 0;
}

void dear_xsum_add(dear_xsum_t *x, double v)
{
    if (!isfinite(v)) {
        x->special += v;
        return;
    }
    if (v == 0)
        return;
    int e;
    double f = frexp(fabs(v), &e);            /* |v| = f * 2^e, f in [0.5, 1) */
    uint64_t m = (uint64_t)ldexp(f, 53);      /* exact: 53 bits */
    int pos = e - 53 - EMIN;                  /* the weight of m's lowest bit, from 2^-1074 */
    if (pos < 0) {                            /* a subnormal: its low bits are zero */
        m >>= -pos;
        pos = 0;
    }
    unsigned __int128 w = (unsigned __int128)m << (pos % BITS);
    int i = pos / BITS;
    int64_t p0 = (int64_t)(w & (unsigned __int128)MASK), p1 = (int64_t)((w >> BITS) & (unsigned __int128)MASK),
            p2 = (int64_t)(w >> (2 * BITS));
    if (v < 0) {
        p0 = -p0;
        p1 = -p1;
        p2 = -p2;
    }
    x->limb[i] += p0;
    x->limb[i + 1] += p1;
    x->limb[i + 2] += p2;
    if (++x->pending == (1u << 30))
        carry(x);
}

void dear_xsum_export(dear_xsum_t *x, double out[DEAR_XSUM_WORDS])
{
    carry(x);
    for (int i = 0; i < DEAR_XSUM_LIMBS; i++)
        out[i] = (double)x->limb[i];
    out[DEAR_XSUM_LIMBS] = x->special;
}

double dear_xsum_value(const double w[DEAR_XSUM_WORDS])
{
    /* The carries first: sums of exported words hold one total in many ways, the carried limbs
     * in one, so the rounding below is a function of the total alone. */
    dear_xsum_t x = { .pending = 0 };
    for (int i = 0; i < DEAR_XSUM_LIMBS; i++)
        x.limb[i] = (int64_t)w[i];
    carry(&x);
    double s = 0;
    for (int i = 0; i < DEAR_XSUM_LIMBS; i++)
        if (x.limb[i] != 0)
            s += ldexp((double)x.limb[i], EMIN + BITS * i);
    return s + w[DEAR_XSUM_LIMBS];
}
