/*
 * model.c: the GPT of dear-gpt (characters or words): parameter layout, initialisation, and one
 * forward and one backward function per layer, in the mould of llm.c's train_gpt2.c.
 *
 * All parameters live in one allocation and all gradients in another with the same layout,
 * tensor after tensor in forward order, so that the trainer can register them with dear back to
 * back (no copies) and the token-embedding gradient is its own tensor. The output head is not
 * tied to the token embedding: with weight tying the embedding gradient would be dense, and
 * its sparsity is what the sparse collectives are meant to exploit. Matrix products go
 * through CBLAS (sgemm, or dgemm in the float64 test build).
 */
#include "apps/gpt/model.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Single-precision maths in the float build: the double versions of exp and tanh cost more
 * than all the matrix products of the small model together. */
#ifdef GPT_REAL_DOUBLE
#define GEMM cblas_dgemm
#define EXP exp
#define TANH tanh
#define LOG log
#define SQRT sqrt
#else
#define GEMM cblas_sgemm
#define EXP expf
#define TANH fast_tanhf
#define LOG logf
#define SQRT sqrtf
#endif

/* ------------------------------------------------------------------------------------------ */
/* Layers */

void gpt_encoder_forward(gpt_real *out, const int *inp, const gpt_real *wte, const gpt_real *wpe,
                         int B, int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            gpt_real *o = out + ((size_t)b * T + t) * C;
            const gpt_real *te = wte + (size_t)inp[b * T + t] * C;
            const gpt_real *pe = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++)
                o[i] = te[i] + pe[i];
        }
    }
}

void gpt_encoder_backward(gpt_real *dwte, gpt_real *dwpe, const gpt_real *dout, const int *inp,
                          int B, int T, int C)
{
    /* Only the rows of wte for tokens in the batch receive gradient: sparse. */
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const gpt_real *d = dout + ((size_t)b * T + t) * C;
            gpt_real *dte = dwte + (size_t)inp[b * T + t] * C;
            gpt_real *dpe = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                dte[i] += d[i];
                dpe[i] += d[i];
            }
        }
    }
}

void gpt_layernorm_forward(gpt_real *out, gpt_real *mean, gpt_real *rstd, const gpt_real *inp,
                           const gpt_real *weight, const gpt_real *bias, int N, int C)
{
    const gpt_real eps = (gpt_real)1e-5;
    for (int n = 0; n < N; n++) {
        const gpt_real *x = inp + (size_t)n * C;
        gpt_real m = 0;
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= C;
        gpt_real v = 0;
        for (int i = 0; i < C; i++) {
            gpt_real d = x[i] - m;
            v += d * d;
        }
        v /= C;
        gpt_real s = 1 / SQRT(v + eps);
        gpt_real *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = (x[i] - m) * s * weight[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void gpt_layernorm_backward(gpt_real *dinp, gpt_real *dweight, gpt_real *dbias,
                            const gpt_real *dout, const gpt_real *inp, const gpt_real *weight,
                            const gpt_real *mean, const gpt_real *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const gpt_real *d = dout + (size_t)n * C;
        const gpt_real *x = inp + (size_t)n * C;
        gpt_real *dx = dinp + (size_t)n * C;
        gpt_real m = mean[n], s = rstd[n];
        /* two reductions of the normalised gradient, then the closed form of d/dx */
        gpt_real dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int i = 0; i < C; i++) {
            gpt_real norm = (x[i] - m) * s;
            gpt_real dnorm = weight[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            gpt_real norm = (x[i] - m) * s;
            gpt_real dnorm = weight[i] * d[i];
            dbias[i] += d[i];
            dweight[i] += norm * d[i];
            dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
}

void gpt_matmul_forward(gpt_real *out, const gpt_real *inp, const gpt_real *weight,
                        const gpt_real *bias, int N, int C, int OC)
{
    /* out(N,OC) = inp(N,C) @ weight(OC,C)^T */
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1, inp, C, weight, C, 0, out, OC);
    if (bias) {
        for (int n = 0; n < N; n++) {
            gpt_real *o = out + (size_t)n * OC;
            for (int j = 0; j < OC; j++)
                o[j] += bias[j];
        }
    }
}

void gpt_matmul_backward(gpt_real *dinp, gpt_real *dweight, gpt_real *dbias, const gpt_real *dout,
                         const gpt_real *inp, const gpt_real *weight, int N, int C, int OC)
{
    /* dinp(N,C) += dout(N,OC) @ weight(OC,C) */
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1, dout, OC, weight, C, 1, dinp, C);
    /* dweight(OC,C) += dout(N,OC)^T @ inp(N,C) */
    GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1, dout, OC, inp, C, 1, dweight, C);
    if (dbias) {
        for (int n = 0; n < N; n++) {
            const gpt_real *d = dout + (size_t)n * OC;
            for (int j = 0; j < OC; j++)
                dbias[j] += d[j];
        }
    }
}

void gpt_attention_forward(gpt_real *out, gpt_real *att, const gpt_real *qkv, int B, int T, int C,
                           int NH)
{
    /* qkv(B,T,3C) holds Q, K, V side by side; head h uses channels [h*hs, (h+1)*hs) of each. */
    const int hs = C / NH, C3 = 3 * C;
    const gpt_real scale = 1 / (gpt_real)sqrt((double)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const gpt_real *q = qkv + (size_t)b * T * C3 + h * hs;
            const gpt_real *k = q + C;
            const gpt_real *v = q + 2 * C;
            gpt_real *a = att + ((size_t)b * NH + h) * T * T;
            /* a(T,T) = scale * q(T,hs) @ k(T,hs)^T; the masked upper triangle is overwritten */
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0, a, T);
            for (int t = 0; t < T; t++) {
                gpt_real *row = a + (size_t)t * T;
                gpt_real mx = row[0];
                for (int u = 1; u <= t; u++)
                    if (row[u] > mx)
                        mx = row[u];
                gpt_real sum = 0;
                for (int u = 0; u <= t; u++) {
                    row[u] = EXP(row[u] - mx);
                    sum += row[u];
                }
                for (int u = 0; u <= t; u++)
                    row[u] /= sum;
                for (int u = t + 1; u < T; u++)
                    row[u] = 0; /* causal: no attention to the future */
            }
            /* out(T,hs) = a(T,T) @ v(T,hs), written into the head's channels of out(B,T,C) */
            gpt_real *o = out + (size_t)b * T * C + h * hs;
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1, a, T, v, C3, 0, o, C);
        }
    }
}

void gpt_attention_backward(gpt_real *dqkv, const gpt_real *dout, const gpt_real *qkv,
                            const gpt_real *att, gpt_real *scratch, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const gpt_real scale = 1 / (gpt_real)sqrt((double)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const gpt_real *q = qkv + (size_t)b * T * C3 + h * hs;
            const gpt_real *k = q + C;
            const gpt_real *v = q + 2 * C;
            gpt_real *dq = dqkv + (size_t)b * T * C3 + h * hs;
            gpt_real *dk = dq + C;
            gpt_real *dv = dq + 2 * C;
            const gpt_real *a = att + ((size_t)b * NH + h) * T * T;
            const gpt_real *d = dout + (size_t)b * T * C + h * hs;
            gpt_real *da = scratch; /* (T,T) */
            /* da(T,T) = d(T,hs) @ v(T,hs)^T;  dv(T,hs) += a(T,T)^T @ d(T,hs) */
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1, d, C, v, C3, 0, da, T);
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1, a, T, d, C, 1, dv, C3);
            /* softmax backward, row by row: ds = a * (da - sum(a * da)); masked entries have
             * a = 0 and so get ds = 0 */
            for (int t = 0; t < T; t++) {
                const gpt_real *arow = a + (size_t)t * T;
                gpt_real *row = da + (size_t)t * T;
                gpt_real dot = 0;
                for (int u = 0; u <= t; u++)
                    dot += arow[u] * row[u];
                for (int u = 0; u <= t; u++)
                    row[u] = arow[u] * (row[u] - dot);
                for (int u = t + 1; u < T; u++)
                    row[u] = 0;
            }
            /* dq(T,hs) += scale * ds @ k;  dk(T,hs) += scale * ds^T @ q */
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, da, T, k, C3, 1, dq,
                 C3);
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, da, T, q, C3, 1, dk, C3);
        }
    }
}

#define GELU_SCALE 0.7978845608028654 /* sqrt(2/pi) */

#ifndef GPT_REAL_DOUBLE
/* tanh through expf, several times faster than glibc's tanhf (whose expm1f dominated the
 * profile); absolute error about 1e-7, which is all GELU needs. Saturates correctly: expf
 * overflows to inf (-> 1) or underflows to 0 (-> -1). */
static inline float fast_tanhf(float x)
{
    return 1.0f - 2.0f / (expf(2.0f * x) + 1.0f);
}
#endif

void gpt_gelu_forward(gpt_real *out, const gpt_real *inp, int N)
{
    for (int i = 0; i < N; i++) {
        gpt_real x = inp[i];
        gpt_real cube = (gpt_real)0.044715 * x * x * x;
        out[i] = (gpt_real)0.5 * x * (1 + TANH((gpt_real)GELU_SCALE * (x + cube)));
    }
}

void gpt_gelu_backward(gpt_real *dinp, const gpt_real *inp, const gpt_real *dout, int N)
{
    for (int i = 0; i < N; i++) {
        gpt_real x = inp[i];
        gpt_real cube = (gpt_real)0.044715 * x * x * x;
        gpt_real targ = (gpt_real)GELU_SCALE * (x + cube);
        gpt_real th = TANH(targ);
        gpt_real sech2 = 1 - th * th;
        gpt_real grad = (gpt_real)0.5 * (1 + th) +
                        (gpt_real)0.5 * x * sech2 * (gpt_real)GELU_SCALE *
                            (1 + 3 * (gpt_real)0.044715 * x * x);
        dinp[i] += grad * dout[i];
    }
}

void gpt_residual_forward(gpt_real *out, const gpt_real *a, const gpt_real *b, int N)
{
    for (int i = 0; i < N; i++)
        out[i] = a[i] + b[i];
}

void gpt_residual_backward(gpt_real *da, gpt_real *db, const gpt_real *dout, int N)
{
    for (int i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

void gpt_softmax_forward(gpt_real *probs, const gpt_real *logits, int N, int V)
{
    for (int n = 0; n < N; n++) {
        const gpt_real *l = logits + (size_t)n * V;
        gpt_real *p = probs + (size_t)n * V;
        gpt_real mx = l[0];
        for (int i = 1; i < V; i++)
            if (l[i] > mx)
                mx = l[i];
        gpt_real sum = 0;
        for (int i = 0; i < V; i++) {
            p[i] = EXP(l[i] - mx);
            sum += p[i];
        }
        for (int i = 0; i < V; i++)
            p[i] /= sum;
    }
}

void gpt_crossentropy_forward(gpt_real *losses, const gpt_real *probs, const int *targets, int N,
                              int V)
{
    for (int n = 0; n < N; n++)
        losses[n] = -LOG(probs[(size_t)n * V + targets[n]]);
}

void gpt_crossentropy_softmax_backward(gpt_real *dlogits, const gpt_real *probs,
                                       const int *targets, gpt_real dloss, int N, int V)
{
    for (int n = 0; n < N; n++) {
        const gpt_real *p = probs + (size_t)n * V;
        gpt_real *d = dlogits + (size_t)n * V;
        for (int i = 0; i < V; i++)
            d[i] += (p[i] - (i == targets[n] ? 1 : 0)) * dloss;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Parameter layout and initialisation */

int gpt_layer_count(const gpt_config_t *cfg)
{
    return 2 + 2 * cfg->layers;
}

/* Deterministic random numbers (splitmix64), identical on every rank for the same seed. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_normal(uint64_t *s)
{
    /* Box-Muller; u1 in (0,1] so the log is finite */
    double u1 = ((double)(rng_next(s) >> 11) + 1.0) / 9007199254740992.0;
    double u2 = (double)(rng_next(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Append one tensor to the layout; views are bound after the arena is allocated. */
static void layout_add(gpt_model_t *m, const char *name, int block, int layer, size_t count,
                       int is_matrix)
{
    gpt_tensor_t *t = &m->tensors[m->num_tensors++];
    if (block >= 0)
        snprintf(t->name, sizeof t->name, "h%d.%s", block, name);
    else
        snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = m->num_params;
    t->count = count;
    t->layer = layer;
    t->is_matrix = is_matrix;
    m->num_params += count;
}

static void bind_params(gpt_params_t *p, gpt_real *base, const gpt_model_t *m)
{
    /* Same order as layout_add calls in gpt_model_init. */
    const gpt_tensor_t *t = m->tensors;
    p->wte = base + (t++)->offset;
    p->wpe = base + (t++)->offset;
    for (int l = 0; l < m->cfg.layers; l++) {
        gpt_block_params_t *bp = &p->blocks[l];
        bp->ln1w = base + (t++)->offset;
        bp->ln1b = base + (t++)->offset;
        bp->qkvw = base + (t++)->offset;
        bp->qkvb = base + (t++)->offset;
        bp->attprojw = base + (t++)->offset;
        bp->attprojb = base + (t++)->offset;
        bp->ln2w = base + (t++)->offset;
        bp->ln2b = base + (t++)->offset;
        bp->fcw = base + (t++)->offset;
        bp->fcb = base + (t++)->offset;
        bp->fcprojw = base + (t++)->offset;
        bp->fcprojb = base + (t++)->offset;
    }
    p->lnfw = base + (t++)->offset;
    p->lnfb = base + (t++)->offset;
    p->lmw = base + (t++)->offset;
    p->lmb = base + (t++)->offset;
}

/* Carve the activation arena; returns the number of elements used (base NULL: count only). */
static size_t bind_acts(gpt_acts_t *a, gpt_real *base, const gpt_config_t *cfg, int B)
{
    const size_t T = (size_t)cfg->max_seq, C = (size_t)cfg->dim, V = (size_t)cfg->vocab;
    const size_t NH = (size_t)cfg->heads, BT = (size_t)B * T;
    size_t off = 0;
#define CARVE(ptr, n) do { (ptr) = base ? base + off : NULL; off += (n); } while (0)
    CARVE(a->encoded, BT * C);
    for (int l = 0; l < cfg->layers; l++) {
        gpt_block_acts_t *ba = &a->blocks[l];
        CARVE(ba->ln1, BT * C);
        CARVE(ba->ln1_mean, BT);
        CARVE(ba->ln1_rstd, BT);
        CARVE(ba->qkv, BT * 3 * C);
        CARVE(ba->att, (size_t)B * NH * T * T);
        CARVE(ba->atty, BT * C);
        CARVE(ba->attproj, BT * C);
        CARVE(ba->res2, BT * C);
        CARVE(ba->ln2, BT * C);
        CARVE(ba->ln2_mean, BT);
        CARVE(ba->ln2_rstd, BT);
        CARVE(ba->fch, BT * 4 * C);
        CARVE(ba->fch_gelu, BT * 4 * C);
        CARVE(ba->fcproj, BT * C);
        CARVE(ba->res3, BT * C);
    }
    CARVE(a->lnf, BT * C);
    CARVE(a->lnf_mean, BT);
    CARVE(a->lnf_rstd, BT);
    CARVE(a->logits, BT * V);
    CARVE(a->probs, BT * V);
    CARVE(a->losses, BT);
#undef CARVE
    return off;
}

int gpt_model_init(gpt_model_t *m, const gpt_config_t *cfg, int max_batch, uint64_t seed,
                   char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (cfg->vocab < 2 || cfg->max_seq < 1 || cfg->layers < 1 || cfg->heads < 1 ||
        cfg->dim < 1 || max_batch < 1) {
        snprintf(err, errlen, "model shapes must be positive (vocab >= 2)");
        return -1;
    }
    if (cfg->dim % cfg->heads != 0) {
        snprintf(err, errlen, "dim %d is not a multiple of heads %d", cfg->dim, cfg->heads);
        return -1;
    }
    m->cfg = *cfg;
    m->max_batch = max_batch;
    const size_t V = (size_t)cfg->vocab, T = (size_t)cfg->max_seq, C = (size_t)cfg->dim;
    const int NL = cfg->layers;

    m->tensors = calloc((size_t)(6 + 12 * NL), sizeof *m->tensors);
    m->params.blocks = calloc((size_t)NL, sizeof(gpt_block_params_t));
    m->grads.blocks = calloc((size_t)NL, sizeof(gpt_block_params_t));
    m->acts.blocks = calloc((size_t)NL, sizeof(gpt_block_acts_t));
    m->grads_acts.blocks = calloc((size_t)NL, sizeof(gpt_block_acts_t));
    if (!m->tensors || !m->params.blocks || !m->grads.blocks || !m->acts.blocks ||
        !m->grads_acts.blocks)
        goto err_nomem;

    /* forward order; hook layers: 0 embeddings, 1+2l attention of block l, 2+2l its MLP,
     * 1+2NL final LayerNorm and head */
    layout_add(m, "wte", -1, 0, V * C, 0);
    layout_add(m, "wpe", -1, 0, T * C, 0);
    for (int l = 0; l < NL; l++) {
        int la = 1 + 2 * l, lm = 2 + 2 * l;
        layout_add(m, "ln1w", l, la, C, 0);
        layout_add(m, "ln1b", l, la, C, 0);
        layout_add(m, "qkvw", l, la, 3 * C * C, 1);
        layout_add(m, "qkvb", l, la, 3 * C, 0);
        layout_add(m, "attprojw", l, la, C * C, 1);
        layout_add(m, "attprojb", l, la, C, 0);
        layout_add(m, "ln2w", l, lm, C, 0);
        layout_add(m, "ln2b", l, lm, C, 0);
        layout_add(m, "fcw", l, lm, 4 * C * C, 1);
        layout_add(m, "fcb", l, lm, 4 * C, 0);
        layout_add(m, "fcprojw", l, lm, 4 * C * C, 1);
        layout_add(m, "fcprojb", l, lm, C, 0);
    }
    layout_add(m, "lnfw", -1, 1 + 2 * NL, C, 0);
    layout_add(m, "lnfb", -1, 1 + 2 * NL, C, 0);
    layout_add(m, "lmw", -1, 1 + 2 * NL, V * C, 1);
    layout_add(m, "lmb", -1, 1 + 2 * NL, V, 0);

    m->params_memory = malloc(m->num_params * sizeof(gpt_real));
    m->grads_memory = calloc(m->num_params, sizeof(gpt_real));
    m->num_acts = bind_acts(&m->acts, NULL, cfg, max_batch);
    m->acts_memory = calloc(m->num_acts, sizeof(gpt_real));
    m->grads_acts_memory = calloc(m->num_acts, sizeof(gpt_real));
    m->scratch = calloc(T * T, sizeof(gpt_real));
    if (!m->params_memory || !m->grads_memory || !m->acts_memory || !m->grads_acts_memory ||
        !m->scratch)
        goto err_nomem;
    bind_params(&m->params, m->params_memory, m);
    bind_params(&m->grads, m->grads_memory, m);
    bind_acts(&m->acts, m->acts_memory, cfg, max_batch);
    bind_acts(&m->grads_acts, m->grads_acts_memory, cfg, max_batch);

    uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
    const double resid_scale = 1.0 / sqrt(2.0 * NL);
    for (int i = 0; i < m->num_tensors; i++) {
        const gpt_tensor_t *t = &m->tensors[i];
        gpt_real *p = m->params_memory + t->offset;
        const char *base = strrchr(t->name, '.') ? strrchr(t->name, '.') + 1 : t->name;
        int is_ln_weight = strcmp(base, "ln1w") == 0 || strcmp(base, "ln2w") == 0 ||
                           strcmp(base, "lnfw") == 0;
        int is_bias = base[strlen(base) - 1] == 'b'; /* ln1b, qkvb, ..., lmb */
        double std = 0.02;
        if (strcmp(base, "attprojw") == 0 || strcmp(base, "fcprojw") == 0)
            std *= resid_scale; /* keeps the residual stream's variance flat with depth */
        for (size_t j = 0; j < t->count; j++) {
            if (is_ln_weight)
                p[j] = 1;
            else if (is_bias)
                p[j] = 0;
            else
                p[j] = (gpt_real)(std * rng_normal(&s));
        }
    }
    return 0;

err_nomem:
    gpt_model_free(m);
    snprintf(err, errlen, "out of memory allocating the model");
    return -1;
}

void gpt_model_free(gpt_model_t *m)
{
    free(m->tensors);
    free(m->params.blocks);
    free(m->grads.blocks);
    free(m->acts.blocks);
    free(m->grads_acts.blocks);
    free(m->params_memory);
    free(m->grads_memory);
    free(m->acts_memory);
    free(m->grads_acts_memory);
    free(m->scratch);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------------------------------ */
/* Whole model */

static int hook_forward(const gpt_hooks_t *h, int layer)
{
    return h && h->forward_begin ? h->forward_begin(h->arg, layer) : 0;
}

static int hook_backward(const gpt_hooks_t *h, int layer)
{
    return h && h->backward_done ? h->backward_done(h->arg, layer) : 0;
}

int gpt_forward(gpt_model_t *m, const int *inputs, const int *targets, int B, int T,
                const gpt_hooks_t *hooks)
{
    const int C = m->cfg.dim, V = m->cfg.vocab, NH = m->cfg.heads, NL = m->cfg.layers;
    const int BT = B * T;
    const gpt_params_t *p = &m->params;
    gpt_acts_t *a = &m->acts;
    int rc;
    if (B < 1 || B > m->max_batch || T < 1 || T > m->cfg.max_seq)
        return -1;
    /* The activation views were carved for (max_batch, max_seq); smaller batches use their
     * leading part, which is valid because every view is contiguous and indexed with B, T. */
    m->inputs = inputs;
    m->targets = targets;
    m->B = B;
    m->T = T;

    if ((rc = hook_forward(hooks, 0)))
        return rc;
    gpt_encoder_forward(a->encoded, inputs, p->wte, p->wpe, B, T, C);

    const gpt_real *residual = a->encoded;
    for (int l = 0; l < NL; l++) {
        const gpt_block_params_t *bp = &p->blocks[l];
        gpt_block_acts_t *ba = &a->blocks[l];
        if ((rc = hook_forward(hooks, 1 + 2 * l)))
            return rc;
        gpt_layernorm_forward(ba->ln1, ba->ln1_mean, ba->ln1_rstd, residual, bp->ln1w, bp->ln1b,
                              BT, C);
        gpt_matmul_forward(ba->qkv, ba->ln1, bp->qkvw, bp->qkvb, BT, C, 3 * C);
        gpt_attention_forward(ba->atty, ba->att, ba->qkv, B, T, C, NH);
        gpt_matmul_forward(ba->attproj, ba->atty, bp->attprojw, bp->attprojb, BT, C, C);
        gpt_residual_forward(ba->res2, residual, ba->attproj, BT * C);
        if ((rc = hook_forward(hooks, 2 + 2 * l)))
            return rc;
        gpt_layernorm_forward(ba->ln2, ba->ln2_mean, ba->ln2_rstd, ba->res2, bp->ln2w, bp->ln2b,
                              BT, C);
        gpt_matmul_forward(ba->fch, ba->ln2, bp->fcw, bp->fcb, BT, C, 4 * C);
        gpt_gelu_forward(ba->fch_gelu, ba->fch, BT * 4 * C);
        gpt_matmul_forward(ba->fcproj, ba->fch_gelu, bp->fcprojw, bp->fcprojb, BT, 4 * C, C);
        gpt_residual_forward(ba->res3, ba->res2, ba->fcproj, BT * C);
        residual = ba->res3;
    }

    if ((rc = hook_forward(hooks, 1 + 2 * NL)))
        return rc;
    gpt_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, residual, p->lnfw, p->lnfb, BT, C);
    gpt_matmul_forward(a->logits, a->lnf, p->lmw, p->lmb, BT, C, V);
    gpt_softmax_forward(a->probs, a->logits, BT, V);
    if (targets) {
        gpt_crossentropy_forward(a->losses, a->probs, targets, BT, V);
        double sum = 0;
        for (int i = 0; i < BT; i++)
            sum += a->losses[i];
        m->mean_loss = sum / BT;
    } else {
        m->mean_loss = -1;
    }
    return 0;
}

int gpt_backward(gpt_model_t *m, const gpt_hooks_t *hooks)
{
    const int C = m->cfg.dim, V = m->cfg.vocab, NH = m->cfg.heads, NL = m->cfg.layers;
    const int B = m->B, T = m->T, BT = B * T;
    const gpt_params_t *p = &m->params;
    const gpt_params_t *g = &m->grads;
    const gpt_acts_t *a = &m->acts;
    gpt_acts_t *ga = &m->grads_acts;
    int rc;
    if (!m->targets)
        return -1;
    /* Gradients accumulate (+=) inside the layers, so start from zero. The previous
     * iteration's gradients are no longer needed: their updates have run by now (in
     * dear_forward_begin of this iteration, or in dear_backward_end of the last one). */
    memset(m->grads_memory, 0, m->num_params * sizeof(gpt_real));
    memset(m->grads_acts_memory, 0, m->num_acts * sizeof(gpt_real));

    /* head: d(mean loss)/d(loss_i) = 1/BT */
    gpt_crossentropy_softmax_backward(ga->logits, a->probs, m->targets, (gpt_real)1 / BT, BT, V);
    gpt_matmul_backward(ga->lnf, g->lmw, g->lmb, ga->logits, a->lnf, p->lmw, BT, C, V);
    const gpt_real *residual = NL > 0 ? a->blocks[NL - 1].res3 : a->encoded;
    gpt_real *dresidual = NL > 0 ? ga->blocks[NL - 1].res3 : ga->encoded;
    gpt_layernorm_backward(dresidual, g->lnfw, g->lnfb, ga->lnf, residual, p->lnfw, a->lnf_mean,
                           a->lnf_rstd, BT, C);
    if ((rc = hook_backward(hooks, 1 + 2 * NL)))
        return rc;

    for (int l = NL - 1; l >= 0; l--) {
        const gpt_block_params_t *bp = &p->blocks[l];
        const gpt_block_params_t *gp = &g->blocks[l];
        const gpt_block_acts_t *ba = &a->blocks[l];
        gpt_block_acts_t *gba = &ga->blocks[l];
        const gpt_real *block_in = l > 0 ? a->blocks[l - 1].res3 : a->encoded;
        gpt_real *dblock_in = l > 0 ? ga->blocks[l - 1].res3 : ga->encoded;

        /* MLP half: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
        gpt_residual_backward(gba->res2, gba->fcproj, gba->res3, BT * C);
        gpt_matmul_backward(gba->fch_gelu, gp->fcprojw, gp->fcprojb, gba->fcproj, ba->fch_gelu,
                            bp->fcprojw, BT, 4 * C, C);
        gpt_gelu_backward(gba->fch, ba->fch, gba->fch_gelu, BT * 4 * C);
        gpt_matmul_backward(gba->ln2, gp->fcw, gp->fcb, gba->fch, ba->ln2, bp->fcw, BT, C, 4 * C);
        gpt_layernorm_backward(gba->res2, gp->ln2w, gp->ln2b, gba->ln2, ba->res2, bp->ln2w,
                               ba->ln2_mean, ba->ln2_rstd, BT, C);
        if ((rc = hook_backward(hooks, 2 + 2 * l)))
            return rc;

        /* attention half: res2 = block_in + attproj(attention(qkv(ln1(block_in)))) */
        gpt_residual_backward(dblock_in, gba->attproj, gba->res2, BT * C);
        gpt_matmul_backward(gba->atty, gp->attprojw, gp->attprojb, gba->attproj, ba->atty,
                            bp->attprojw, BT, C, C);
        gpt_attention_backward(gba->qkv, gba->atty, ba->qkv, ba->att, m->scratch, B, T, C, NH);
        gpt_matmul_backward(gba->ln1, gp->qkvw, gp->qkvb, gba->qkv, ba->ln1, bp->qkvw, BT, C,
                            3 * C);
        gpt_layernorm_backward(dblock_in, gp->ln1w, gp->ln1b, gba->ln1, block_in, bp->ln1w,
                               ba->ln1_mean, ba->ln1_rstd, BT, C);
        if ((rc = hook_backward(hooks, 1 + 2 * l)))
            return rc;
    }

    gpt_encoder_backward(g->wte, g->wpe, ga->encoded, m->inputs, B, T, C);
    return hook_backward(hooks, 0);
}
