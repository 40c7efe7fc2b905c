/*
 * model.c: layers, forward and backward of the dear-cnn model (see model.h for the shapes).
 *
 * Matrix products go through CBLAS (OpenBLAS, one thread per rank). Everything else is plain
 * loops over contiguous memory. The same file builds in float (the trainer) and in double
 * (-DCNN_DOUBLE, the finite-difference tests).
 */
#include "apps/cnn/model.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CNN_DOUBLE
#define cnn_gemm cblas_dgemm
#else
#define cnn_gemm cblas_sgemm
#endif

double cnn_rng_normal(cnn_rng_t *rng)
{
    double u1 = cnn_rng_uniform(rng);
    double u2 = cnn_rng_uniform(rng);
    if (u1 < 1e-300)
        u1 = 1e-300; /* log(0) */
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* ---------------------------------------------------------------------------------------------
 * Configuration and memory
 */

cnn_config_t cnn_config_default(void)
{
    cnn_config_t cfg = {.in_h = 28, .in_w = 28, .k = 5, .c1 = 16, .c2 = 32, .hidden = 128,
                        .classes = 10};
    return cfg;
}

int cnn_config_check(const cnn_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->in_h <= 0 || cfg->in_w <= 0 || cfg->k <= 0 || cfg->c1 <= 0 || cfg->c2 <= 0 ||
        cfg->hidden <= 0 || cfg->classes <= 1 || cfg->classes > 256) {
        snprintf(err, errlen, "model sizes must be positive (and 2..256 classes)");
        return -1;
    }
    int h1 = cfg->in_h - cfg->k + 1, w1 = cfg->in_w - cfg->k + 1;
    if (h1 <= 0 || w1 <= 0 || h1 % 2 || w1 % 2) {
        snprintf(err, errlen, "conv1 output %dx%d must be positive and even (input %dx%d, kernel %d)",
                 h1, w1, cfg->in_h, cfg->in_w, cfg->k);
        return -1;
    }
    int h2 = h1 / 2 - cfg->k + 1, w2 = w1 / 2 - cfg->k + 1;
    if (h2 <= 0 || w2 <= 0 || h2 % 2 || w2 % 2) {
        snprintf(err, errlen, "conv2 output %dx%d must be positive and even", h2, w2);
        return -1;
    }
    return 0;
}

int cnn_model_create(cnn_model_t *m, const cnn_config_t *cfg, int max_batch, char *err,
                     size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (cnn_config_check(cfg, err, errlen) != 0)
        return -1;
    if (max_batch <= 0) {
        snprintf(err, errlen, "max_batch must be positive, got %d", max_batch);
        return -1;
    }
    m->cfg = *cfg;
    const int k = cfg->k, kk = k * k;
    m->h1 = cfg->in_h - k + 1;
    m->w1 = cfg->in_w - k + 1;
    m->ph1 = m->h1 / 2;
    m->pw1 = m->w1 / 2;
    m->h2 = m->ph1 - k + 1;
    m->w2 = m->pw1 - k + 1;
    m->ph2 = m->h2 / 2;
    m->pw2 = m->w2 / 2;
    m->flat = cfg->c2 * m->ph2 * m->pw2;

    static const char *names[CNN_NTENSORS] = {"conv1.weight", "conv1.bias", "conv2.weight",
                                              "conv2.bias",   "fc1.weight", "fc1.bias",
                                              "fc2.weight",   "fc2.bias"};
    const size_t counts[CNN_NTENSORS] = {
        (size_t)cfg->c1 * kk,                  (size_t)cfg->c1,
        (size_t)cfg->c2 * cfg->c1 * kk,        (size_t)cfg->c2,
        (size_t)cfg->hidden * m->flat,         (size_t)cfg->hidden,
        (size_t)cfg->classes * cfg->hidden,    (size_t)cfg->classes};
    size_t off = 0;
    for (int t = 0; t < CNN_NTENSORS; t++) {
        m->name[t] = names[t];
        m->layer[t] = t / 2; /* weight and bias of each layer */
        m->offset[t] = off;
        m->count[t] = counts[t];
        off += counts[t];
    }
    m->nparams = off;

    /* Activation arena: every buffer for max_batch images, back to back. */
    const size_t N = (size_t)max_batch;
    const size_t s_x = N * cfg->in_h * cfg->in_w;
    const size_t s_col1 = (size_t)kk * N * m->h1 * m->w1;
    const size_t s_a1 = (size_t)cfg->c1 * N * m->h1 * m->w1;
    const size_t s_p1 = (size_t)cfg->c1 * N * m->ph1 * m->pw1;
    const size_t s_col2 = (size_t)cfg->c1 * kk * N * m->h2 * m->w2;
    const size_t s_a2 = (size_t)cfg->c2 * N * m->h2 * m->w2;
    const size_t s_p2 = (size_t)cfg->c2 * N * m->ph2 * m->pw2;
    const size_t s_f = N * m->flat;
    const size_t s_h = N * cfg->hidden;
    const size_t s_l = N * cfg->classes;
    const size_t sizes[] = {s_x,  s_col1, s_a1, s_p1, s_col2, s_a2, s_p2, s_f,  s_h,
                            s_l,  s_l,    s_l,  s_h,  s_f,    s_p2, s_a2, s_col2, s_p1,
                            s_a1};
    real **ptrs[] = {&m->x,  &m->col1,    &m->a1, &m->p1,  &m->col2, &m->a2, &m->p2,
                     &m->f,  &m->h,       &m->logits, &m->probs, &m->dlogits, &m->dh,
                     &m->df, &m->dp2,     &m->da2, &m->dcol2, &m->dp1, &m->da1};
    const size_t nbuf = sizeof sizes / sizeof sizes[0];
    size_t total = 0;
    for (size_t i = 0; i < nbuf; i++)
        total += sizes[i];

    m->params = calloc(m->nparams, sizeof(real));
    m->grads = calloc(m->nparams, sizeof(real));
    m->acts = calloc(total, sizeof(real));
    m->idx1 = calloc(s_p1, sizeof(int32_t));
    m->idx2 = calloc(s_p2, sizeof(int32_t));
    if (!m->params || !m->grads || !m->acts || !m->idx1 || !m->idx2) {
        snprintf(err, errlen, "out of memory allocating the model (%zu parameters, %zu activations)",
                 m->nparams, total);
        cnn_model_destroy(m);
        return -1;
    }
    real *p = m->acts;
    for (size_t i = 0; i < nbuf; i++) {
        *ptrs[i] = p;
        p += sizes[i];
    }
    m->max_batch = max_batch;
    return 0;
}

void cnn_model_destroy(cnn_model_t *m)
{
    free(m->params);
    free(m->grads);
    free(m->acts);
    free(m->idx1);
    free(m->idx2);
    memset(m, 0, sizeof *m);
}

void cnn_init_params(cnn_model_t *m, cnn_rng_t *rng)
{
    for (int t = 0; t < CNN_NTENSORS; t++) {
        real *p = m->params + m->offset[t];
        if (t % 2 == 1) { /* bias */
            memset(p, 0, m->count[t] * sizeof(real));
            continue;
        }
        size_t fan_out = m->count[t + 1]; /* rows of the weight = bias length */
        size_t fan_in = m->count[t] / fan_out;
        /* He gain 2 where a ReLU follows; the output layer feeds the softmax directly. */
        double gain = t == CNN_FC2_W ? 1.0 : 2.0;
        double std = sqrt(gain / (double)fan_in);
        for (size_t i = 0; i < m->count[t]; i++)
            p[i] = (real)(std * cnn_rng_normal(rng));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Convolution (im2col + GEMM), channel-major activations (C,N,H,W)
 */

void cnn_im2col(real *col, const real *in, int C, int N, int H, int W, int k)
{
    const int OH = H - k + 1, OW = W - k + 1;
    const size_t M = (size_t)N * OH * OW; /* columns */
    for (int c = 0; c < C; c++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                real *row = col + ((size_t)(c * k + ki) * k + kj) * M;
                for (int n = 0; n < N; n++) {
                    const real *plane = in + ((size_t)c * N + n) * H * W;
                    for (int oh = 0; oh < OH; oh++) {
                        const real *src = plane + (size_t)(oh + ki) * W + kj;
                        real *dst = row + ((size_t)n * OH + oh) * OW;
                        memcpy(dst, src, (size_t)OW * sizeof(real));
                    }
                }
            }
}

void cnn_col2im(real *in, const real *col, int C, int N, int H, int W, int k)
{
    const int OH = H - k + 1, OW = W - k + 1;
    const size_t M = (size_t)N * OH * OW;
    memset(in, 0, (size_t)C * N * H * W * sizeof(real));
    for (int c = 0; c < C; c++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                const real *row = col + ((size_t)(c * k + ki) * k + kj) * M;
                for (int n = 0; n < N; n++) {
                    real *plane = in + ((size_t)c * N + n) * H * W;
                    for (int oh = 0; oh < OH; oh++) {
                        real *dst = plane + (size_t)(oh + ki) * W + kj;
                        const real *src = row + ((size_t)n * OH + oh) * OW;
                        for (int ow = 0; ow < OW; ow++)
                            dst[ow] += src[ow];
                    }
                }
            }
}

void cnn_conv_forward(real *out, real *col, const real *in, const real *w, const real *b,
                      int N, int C, int H, int W, int OC, int k)
{
    const int CKK = C * k * k;
    const int M = N * (H - k + 1) * (W - k + 1);
    cnn_im2col(col, in, C, N, H, W, k);
    /* out (OC, M) = w (OC, CKK) x col (CKK, M) */
    cnn_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, M, CKK, 1.0, w, CKK, col, M, 0.0,
             out, M);
    for (int oc = 0; oc < OC; oc++) {
        real *row = out + (size_t)oc * M;
        const real bias = b[oc];
        for (int j = 0; j < M; j++)
            row[j] += bias;
    }
}

void cnn_conv_backward(real *dw, real *db, real *din, real *dcol, const real *dout,
                       const real *col, const real *w, int N, int C, int H, int W, int OC, int k)
{
    const int CKK = C * k * k;
    const int M = N * (H - k + 1) * (W - k + 1);
    /* dw (OC, CKK) = dout (OC, M) x col^T (M, CKK) */
    cnn_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, CKK, M, 1.0, dout, M, col, M, 0.0, dw,
             CKK);
    for (int oc = 0; oc < OC; oc++) {
        const real *row = dout + (size_t)oc * M;
        double s = 0.0; /* double: M is tens of thousands of terms */
        for (int j = 0; j < M; j++)
            s += row[j];
        db[oc] = (real)s;
    }
    if (din) {
        /* dcol (CKK, M) = w^T (CKK, OC) x dout (OC, M), then scatter back to the image. */
        cnn_gemm(CblasRowMajor, CblasTrans, CblasNoTrans, CKK, M, OC, 1.0, w, CKK, dout, M, 0.0,
                 dcol, M);
        cnn_col2im(din, dcol, C, N, H, W, k);
    }
}

/* ---------------------------------------------------------------------------------------------
 * ReLU, max pool, flatten
 */

void cnn_relu_forward(real *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] > 0 ? x[i] : 0;
}

void cnn_relu_backward(real *d, const real *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = y[i] > 0 ? d[i] : 0;
}

void cnn_maxpool_forward(real *out, int32_t *idx, const real *in, int planes, int H, int W)
{
    const int OH = H / 2, OW = W / 2;
    for (int p = 0; p < planes; p++) {
        const real *src = in + (size_t)p * H * W;
        real *dst = out + (size_t)p * OH * OW;
        int32_t *di = idx + (size_t)p * OH * OW;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                int best = 2 * oh * W + 2 * ow;
                const int cand[3] = {best + 1, best + W, best + W + 1};
                for (int c = 0; c < 3; c++)
                    if (src[cand[c]] > src[best])
                        best = cand[c];
                dst[oh * OW + ow] = src[best];
                di[oh * OW + ow] = best;
            }
    }
}

void cnn_maxpool_backward(real *din, const real *dout, const int32_t *idx, int planes, int H,
                          int W)
{
    const int O = (H / 2) * (W / 2);
    memset(din, 0, (size_t)planes * H * W * sizeof(real));
    for (int p = 0; p < planes; p++) {
        real *dst = din + (size_t)p * H * W;
        const real *src = dout + (size_t)p * O;
        const int32_t *si = idx + (size_t)p * O;
        for (int o = 0; o < O; o++)
            dst[si[o]] += src[o];
    }
}

void cnn_flatten_forward(real *out, const real *in, int C, int N, int S)
{
    for (int c = 0; c < C; c++)
        for (int n = 0; n < N; n++)
            memcpy(out + ((size_t)n * C + c) * S, in + ((size_t)c * N + n) * S,
                   (size_t)S * sizeof(real));
}

void cnn_flatten_backward(real *din, const real *dout, int C, int N, int S)
{
    for (int c = 0; c < C; c++)
        for (int n = 0; n < N; n++)
            memcpy(din + ((size_t)c * N + n) * S, dout + ((size_t)n * C + c) * S,
                   (size_t)S * sizeof(real));
}

/* ---------------------------------------------------------------------------------------------
 * Fully connected, softmax cross-entropy
 */

void cnn_fc_forward(real *out, const real *in, const real *w, const real *b, int N, int IN,
                    int OUT)
{
    /* out (N, OUT) = in (N, IN) x w^T (IN, OUT) */
    cnn_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OUT, IN, 1.0, in, IN, w, IN, 0.0, out,
             OUT);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OUT; o++)
            out[(size_t)n * OUT + o] += b[o];
}

void cnn_fc_backward(real *dw, real *db, real *din, const real *dout, const real *in,
                     const real *w, int N, int IN, int OUT)
{
    /* dw (OUT, IN) = dout^T (OUT, N) x in (N, IN) */
    cnn_gemm(CblasRowMajor, CblasTrans, CblasNoTrans, OUT, IN, N, 1.0, dout, OUT, in, IN, 0.0, dw,
             IN);
    for (int o = 0; o < OUT; o++) {
        double s = 0.0;
        for (int n = 0; n < N; n++)
            s += dout[(size_t)n * OUT + o];
        db[o] = (real)s;
    }
    if (din) /* din (N, IN) = dout (N, OUT) x w (OUT, IN) */
        cnn_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IN, OUT, 1.0, dout, OUT, w, IN,
                 0.0, din, IN);
}

double cnn_softmax_xent_forward(real *probs, const real *logits, const uint8_t *labels, int N,
                                int K)
{
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        const real *z = logits + (size_t)n * K;
        real *p = probs + (size_t)n * K;
        real zmax = z[0];
        for (int j = 1; j < K; j++)
            zmax = z[j] > zmax ? z[j] : zmax;
        double sum = 0.0;
        for (int j = 0; j < K; j++)
            sum += exp((double)(z[j] - zmax));
        for (int j = 0; j < K; j++)
            p[j] = (real)(exp((double)(z[j] - zmax)) / sum);
        if (labels) /* -log softmax, computed from the logits to stay finite */
            loss += log(sum) - (double)(z[labels[n]] - zmax);
    }
    return loss / N;
}

void cnn_softmax_xent_backward(real *dlogits, const real *probs, const uint8_t *labels, int N,
                               int K)
{
    const real inv = (real)(1.0 / N);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            size_t i = (size_t)n * K + j;
            dlogits[i] = (probs[i] - (j == labels[n] ? 1 : 0)) * inv;
        }
}

/* ---------------------------------------------------------------------------------------------
 * The model: forward and backward in order, calling the hook around each parameter layer.
 */

#define HOOK(m, ev, l)                                                                             \
    do {                                                                                           \
        if ((m)->hook) {                                                                           \
            int hook_rc_ = (m)->hook((m)->hook_arg, (ev), (l));                                    \
            if (hook_rc_ != 0)                                                                     \
                return hook_rc_;                                                                   \
        }                                                                                          \
    } while (0)

static int forward_layers(cnn_model_t *m, int N)
{
    const cnn_config_t *c = &m->cfg;
    const real *P = m->params;
    const size_t *o = m->offset;

    HOOK(m, CNN_HOOK_FORWARD_BEGIN, CNN_L_CONV1);
    cnn_conv_forward(m->a1, m->col1, m->x, P + o[CNN_CONV1_W], P + o[CNN_CONV1_B], N, 1, c->in_h,
                     c->in_w, c->c1, c->k);
    cnn_relu_forward(m->a1, (size_t)c->c1 * N * m->h1 * m->w1);
    cnn_maxpool_forward(m->p1, m->idx1, m->a1, c->c1 * N, m->h1, m->w1);

    HOOK(m, CNN_HOOK_FORWARD_BEGIN, CNN_L_CONV2);
    cnn_conv_forward(m->a2, m->col2, m->p1, P + o[CNN_CONV2_W], P + o[CNN_CONV2_B], N, c->c1,
                     m->ph1, m->pw1, c->c2, c->k);
    cnn_relu_forward(m->a2, (size_t)c->c2 * N * m->h2 * m->w2);
    cnn_maxpool_forward(m->p2, m->idx2, m->a2, c->c2 * N, m->h2, m->w2);
    cnn_flatten_forward(m->f, m->p2, c->c2, N, m->ph2 * m->pw2);

    HOOK(m, CNN_HOOK_FORWARD_BEGIN, CNN_L_FC1);
    cnn_fc_forward(m->h, m->f, P + o[CNN_FC1_W], P + o[CNN_FC1_B], N, m->flat, c->hidden);
    cnn_relu_forward(m->h, (size_t)N * c->hidden);

    HOOK(m, CNN_HOOK_FORWARD_BEGIN, CNN_L_FC2);
    cnn_fc_forward(m->logits, m->h, P + o[CNN_FC2_W], P + o[CNN_FC2_B], N, c->hidden,
                   c->classes);
    return 0;
}

double cnn_forward(cnn_model_t *m, const real *x, const uint8_t *labels, int n, int *status)
{
    *status = 0;
    if (n <= 0 || n > m->max_batch) {
        *status = -1;
        return 0.0;
    }
    m->batch = n;
    if (x != m->x)
        memcpy(m->x, x, (size_t)n * m->cfg.in_h * m->cfg.in_w * sizeof(real));
    int rc = forward_layers(m, n);
    if (rc != 0) {
        *status = rc;
        return 0.0;
    }
    return cnn_softmax_xent_forward(m->probs, m->logits, labels, n, m->cfg.classes);
}

int cnn_backward(cnn_model_t *m, const uint8_t *labels)
{
    const cnn_config_t *c = &m->cfg;
    const int N = m->batch;
    const real *P = m->params;
    real *G = m->grads;
    const size_t *o = m->offset;

    cnn_softmax_xent_backward(m->dlogits, m->probs, labels, N, c->classes);

    cnn_fc_backward(G + o[CNN_FC2_W], G + o[CNN_FC2_B], m->dh, m->dlogits, m->h,
                    P + o[CNN_FC2_W], N, c->hidden, c->classes);
    HOOK(m, CNN_HOOK_BACKWARD_DONE, CNN_L_FC2);

    cnn_relu_backward(m->dh, m->h, (size_t)N * c->hidden);
    cnn_fc_backward(G + o[CNN_FC1_W], G + o[CNN_FC1_B], m->df, m->dh, m->f, P + o[CNN_FC1_W], N,
                    m->flat, c->hidden);
    HOOK(m, CNN_HOOK_BACKWARD_DONE, CNN_L_FC1);

    cnn_flatten_backward(m->dp2, m->df, c->c2, N, m->ph2 * m->pw2);
    cnn_maxpool_backward(m->da2, m->dp2, m->idx2, c->c2 * N, m->h2, m->w2);
    cnn_relu_backward(m->da2, m->a2, (size_t)c->c2 * N * m->h2 * m->w2);
    cnn_conv_backward(G + o[CNN_CONV2_W], G + o[CNN_CONV2_B], m->dp1, m->dcol2, m->da2, m->col2,
                      P + o[CNN_CONV2_W], N, c->c1, m->ph1, m->pw1, c->c2, c->k);
    HOOK(m, CNN_HOOK_BACKWARD_DONE, CNN_L_CONV2);

    cnn_maxpool_backward(m->da1, m->dp1, m->idx1, c->c1 * N, m->h1, m->w1);
    cnn_relu_backward(m->da1, m->a1, (size_t)c->c1 * N * m->h1 * m->w1);
    /* The input needs no gradient: din = NULL skips the largest GEMM of the pass. */
    cnn_conv_backward(G + o[CNN_CONV1_W], G + o[CNN_CONV1_B], NULL, NULL, m->da1, m->col1,
                      P + o[CNN_CONV1_W], N, 1, c->in_h, c->in_w, c->c1, c->k);
    HOOK(m, CNN_HOOK_BACKWARD_DONE, CNN_L_CONV1);
    return 0;
}

int cnn_predict(const cnn_model_t *m, int i)
{
    const real *z = m->logits + (size_t)i * m->cfg.classes;
    int best = 0;
    for (int j = 1; j < m->cfg.classes; j++)
        if (z[j] > z[best])
            best = j;
    return best;
}
