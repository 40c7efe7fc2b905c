/*
 * test_cnn_model: the dear-cnn model (apps/cnn/model.c), built in double (-DCNN_DOUBLE).
 *
 * Every layer's backward is checked against central finite differences of its forward in
 * float64: for a layer y = f(x, w, b) and a fixed random R, the scalar L = sum(y * R) has
 * dL/dy = R, so backward(dout = R) must equal the numerical derivative of L for every input,
 * weight and bias element. The whole model is checked the same way against its real loss
 * (softmax cross-entropy) on a small configuration, and the forward passes of the convolution
 * and the fully connected layer against direct loops (not GEMM).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cnn/model.h"

#define EPS 1e-5
#define TOL 1e-7

static cnn_rng_t rng = {12345};

static void fill(real *x, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * (2.0 * cnn_rng_uniform(&rng) - 1.0);
}

static real *alloc(size_t n)
{
    real *p = calloc(n ? n : 1, sizeof(real));
    ck_assert_ptr_nonnull(p);
    return p;
}

static double dot(const real *a, const real *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

typedef double (*objective_fn)(void *ctx);

/* Compare ana[i] with the central difference of f in x[i], for every i. */
static void check_grad(const char *what, real *x, size_t n, const real *ana, objective_fn f,
                       void *ctx)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        real save = x[i];
        x[i] = save + EPS;
        double lp = f(ctx);
        x[i] = save - EPS;
        double lm = f(ctx);
        x[i] = save;
        double num = (lp - lm) / (2 * EPS);
        double e = fabs(num - ana[i]) / (1.0 + fabs(num));
        ck_assert_msg(e <= TOL, "%s[%zu]: backward %.12g, finite difference %.12g", what, i,
                      (double)ana[i], num);
        worst = e > worst ? e : worst;
    }
    ck_assert_msg(n > 0, "%s: nothing checked", what);
}

/* ---- convolution ---- */
typedef struct {
    int N, C, H, W, OC, k, OH, OW;
    real *in, *w, *b, *out, *col, *R;
} conv_ctx;

static double conv_obj(void *p)
{
    conv_ctx *c = p;
    cnn_conv_forward(c->out, c->col, c->in, c->w, c->b, c->N, c->C, c->H, c->W, c->OC, c->k);
    return dot(c->out, c->R, (size_t)c->OC * c->N * c->OH * c->OW);
}

START_TEST(test_conv)
{
    conv_ctx c = {.N = 2, .C = 2, .H = 6, .W = 5, .OC = 3, .k = 3};
    c.OH = c.H - c.k + 1;
    c.OW = c.W - c.k + 1;
    size_t nin = (size_t)c.C * c.N * c.H * c.W, nw = (size_t)c.OC * c.C * c.k * c.k;
    size_t nout = (size_t)c.OC * c.N * c.OH * c.OW, ncol = (size_t)c.C * c.k * c.k * c.N * c.OH * c.OW;
    c.in = alloc(nin), c.w = alloc(nw), c.b = alloc(c.OC), c.out = alloc(nout);
    c.col = alloc(ncol), c.R = alloc(nout);
    fill(c.in, nin, 1), fill(c.w, nw, 1), fill(c.b, c.OC, 1), fill(c.R, nout, 1);

    /* forward against the definition: out[oc,n,i,j] = b + sum w[oc,c,ki,kj] in[c,n,i+ki,j+kj] */
    conv_obj(&c);
    for (int oc = 0; oc < c.OC; oc++)
        for (int n = 0; n < c.N; n++)
            for (int i = 0; i < c.OH; i++)
                for (int j = 0; j < c.OW; j++) {
                    double s = c.b[oc];
                    for (int ch = 0; ch < c.C; ch++)
                        for (int ki = 0; ki < c.k; ki++)
                            for (int kj = 0; kj < c.k; kj++)
                                s += c.w[((oc * c.C + ch) * c.k + ki) * c.k + kj] *
                                     c.in[((ch * c.N + n) * c.H + i + ki) * c.W + j + kj];
                    double got = c.out[((oc * c.N + n) * c.OH + i) * c.OW + j];
                    ck_assert_msg(fabs(got - s) < 1e-12, "conv out %d,%d,%d,%d: %g vs %g", oc, n,
                                  i, j, got, s);
                }

    real *dw = alloc(nw), *db = alloc(c.OC), *din = alloc(nin), *dcol = alloc(ncol);
    conv_obj(&c);
    cnn_conv_backward(dw, db, din, dcol, c.R, c.col, c.w, c.N, c.C, c.H, c.W, c.OC, c.k);
    check_grad("conv din", c.in, nin, din, conv_obj, &c);
    check_grad("conv dw", c.w, nw, dw, conv_obj, &c);
    check_grad("conv db", c.b, c.OC, db, conv_obj, &c);

    /* din = NULL (first layer) still gives the same weight gradients */
    real *dw2 = alloc(nw), *db2 = alloc(c.OC);
    conv_obj(&c);
    cnn_conv_backward(dw2, db2, NULL, NULL, c.R, c.col, c.w, c.N, c.C, c.H, c.W, c.OC, c.k);
    ck_assert_mem_eq(dw, dw2, nw * sizeof(real));
    ck_assert_mem_eq(db, db2, c.OC * sizeof(real));
    free(dw2), free(db2);
    free(dw), free(db), free(din), free(dcol);
    free(c.in), free(c.w), free(c.b), free(c.out), free(c.col), free(c.R);
}
END_TEST

/* ---- fully connected ---- */
typedef struct {
    int N, IN, OUT;
    real *in, *w, *b, *out, *R;
} fc_ctx;

static double fc_obj(void *p)
{
    fc_ctx *c = p;
    cnn_fc_forward(c->out, c->in, c->w, c->b, c->N, c->IN, c->OUT);
    return dot(c->out, c->R, (size_t)c->N * c->OUT);
}

START_TEST(test_fc)
{
    fc_ctx c = {.N = 3, .IN = 7, .OUT = 4};
    size_t nin = (size_t)c.N * c.IN, nw = (size_t)c.OUT * c.IN, nout = (size_t)c.N * c.OUT;
    c.in = alloc(nin), c.w = alloc(nw), c.b = alloc(c.OUT), c.out = alloc(nout), c.R = alloc(nout);
    fill(c.in, nin, 1), fill(c.w, nw, 1), fill(c.b, c.OUT, 1), fill(c.R, nout, 1);
    fc_obj(&c);
    for (int n = 0; n < c.N; n++)
        for (int o = 0; o < c.OUT; o++) {
            double s = c.b[o];
            for (int i = 0; i < c.IN; i++)
                s += c.w[o * c.IN + i] * c.in[n * c.IN + i];
            ck_assert_msg(fabs(c.out[n * c.OUT + o] - s) < 1e-12, "fc out %d,%d", n, o);
        }
    real *dw = alloc(nw), *db = alloc(c.OUT), *din = alloc(nin);
    cnn_fc_backward(dw, db, din, c.R, c.in, c.w, c.N, c.IN, c.OUT);
    check_grad("fc din", c.in, nin, din, fc_obj, &c);
    check_grad("fc dw", c.w, nw, dw, fc_obj, &c);
    check_grad("fc db", c.b, c.OUT, db, fc_obj, &c);
    free(dw), free(db), free(din);
    free(c.in), free(c.w), free(c.b), free(c.out), free(c.R);
}
END_TEST

/* ---- ReLU ---- */
typedef struct {
    size_t n;
    real *in, *out, *R;
} relu_ctx;

static double relu_obj(void *p)
{
    relu_ctx *c = p;
    memcpy(c->out, c->in, c->n * sizeof(real));
    cnn_relu_forward(c->out, c->n);
    return dot(c->out, c->R, c->n);
}

START_TEST(test_relu)
{
    relu_ctx c = {.n = 40};
    c.in = alloc(c.n), c.out = alloc(c.n), c.R = alloc(c.n);
    fill(c.in, c.n, 1), fill(c.R, c.n, 1);
    for (size_t i = 0; i < c.n; i++) /* stay clear of the kink at 0 */
        if (fabs(c.in[i]) < 0.01)
            c.in[i] = 0.5;
    int neg = 0;
    for (size_t i = 0; i < c.n; i++)
        neg += c.in[i] < 0;
    ck_assert_int_gt(neg, 5); /* both sides of the kink are exercised */
    relu_obj(&c);
    real *d = alloc(c.n);
    memcpy(d, c.R, c.n * sizeof(real));
    cnn_relu_backward(d, c.out, c.n);
    check_grad("relu din", c.in, c.n, d, relu_obj, &c);
    free(d), free(c.in), free(c.out), free(c.R);
}
END_TEST

/* ---- max pool ---- */
typedef struct {
    int planes, H, W;
    real *in, *out, *R;
    int32_t *idx;
} pool_ctx;

static double pool_obj(void *p)
{
    pool_ctx *c = p;
    cnn_maxpool_forward(c->out, c->idx, c->in, c->planes, c->H, c->W);
    return dot(c->out, c->R, (size_t)c->planes * (c->H / 2) * (c->W / 2));
}

START_TEST(test_maxpool)
{
    pool_ctx c = {.planes = 3, .H = 4, .W = 6};
    size_t nin = (size_t)c.planes * c.H * c.W, nout = nin / 4;
    c.in = alloc(nin), c.out = alloc(nout), c.R = alloc(nout);
    c.idx = calloc(nout, sizeof(int32_t));
    fill(c.in, nin, 1), fill(c.R, nout, 1);
    pool_obj(&c);
    for (size_t o = 0; o < nout; o++) { /* the maximum of each window, by brute force */
        int p = (int)(o / (nout / c.planes)), r = (int)(o % (nout / c.planes));
        int oh = r / (c.W / 2), ow = r % (c.W / 2);
        double m = -1e300;
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                m = fmax(m, c.in[(p * c.H + 2 * oh + i) * c.W + 2 * ow + j]);
        ck_assert(c.out[o] == m);
    }
    real *din = alloc(nin);
    cnn_maxpool_backward(din, c.R, c.idx, c.planes, c.H, c.W);
    check_grad("maxpool din", c.in, nin, din, pool_obj, &c);
    free(din), free(c.in), free(c.out), free(c.R), free(c.idx);
}
END_TEST

/* ---- flatten ---- */
typedef struct {
    int C, N, S;
    real *in, *out, *R;
} flat_ctx;

static double flat_obj(void *p)
{
    flat_ctx *c = p;
    cnn_flatten_forward(c->out, c->in, c->C, c->N, c->S);
    return dot(c->out, c->R, (size_t)c->C * c->N * c->S);
}

START_TEST(test_flatten)
{
    flat_ctx c = {.C = 3, .N = 2, .S = 4};
    size_t n = (size_t)c.C * c.N * c.S;
    c.in = alloc(n), c.out = alloc(n), c.R = alloc(n);
    fill(c.in, n, 1), fill(c.R, n, 1);
    flat_obj(&c);
    ck_assert(c.out[(1 * c.C + 2) * c.S + 3] == c.in[(2 * c.N + 1) * c.S + 3]);
    real *din = alloc(n);
    cnn_flatten_backward(din, c.R, c.C, c.N, c.S);
    check_grad("flatten din", c.in, n, din, flat_obj, &c);
    free(din), free(c.in), free(c.out), free(c.R);
}
END_TEST

/* ---- softmax cross-entropy (its own scalar loss) ---- */
typedef struct {
    int N, K;
    real *logits, *probs;
    uint8_t *labels;
} xent_ctx;

static double xent_obj(void *p)
{
    xent_ctx *c = p;
    return cnn_softmax_xent_forward(c->probs, c->logits, c->labels, c->N, c->K);
}

START_TEST(test_softmax_xent)
{
    uint8_t labels[3] = {4, 0, 2};
    xent_ctx c = {.N = 3, .K = 5, .labels = labels};
    size_t n = (size_t)c.N * c.K;
    c.logits = alloc(n), c.probs = alloc(n);
    fill(c.logits, n, 3);
    double loss = xent_obj(&c);
    double ref = 0; /* -log softmax computed directly */
    for (int i = 0; i < c.N; i++) {
        double s = 0;
        for (int j = 0; j < c.K; j++)
            s += exp(c.logits[i * c.K + j]);
        ref -= log(exp(c.logits[i * c.K + labels[i]]) / s);
    }
    ck_assert_double_eq_tol(loss, ref / c.N, 1e-12);
    real *d = alloc(n);
    cnn_softmax_xent_backward(d, c.probs, c.labels, c.N, c.K);
    check_grad("xent dlogits", c.logits, n, d, xent_obj, &c);
    free(d), free(c.logits), free(c.probs);
}
END_TEST

/* ---- the whole model on a small configuration ---- */
typedef struct {
    cnn_model_t *m;
    real *x;
    uint8_t *labels;
    int n;
} model_ctx;

static double model_obj(void *p)
{
    model_ctx *c = p;
    int status;
    double loss = cnn_forward(c->m, c->x, c->labels, c->n, &status);
    ck_assert_int_eq(status, 0);
    return loss;
}

static int events[64], nevents;
static int record_hook(void *arg, int event, int layer)
{
    (void)arg;
    if (nevents < 64)
        events[nevents++] = event * 100 + layer;
    return 0;
}

START_TEST(test_model)
{
    cnn_config_t cfg = {.in_h = 14, .in_w = 14, .k = 3, .c1 = 2, .c2 = 3, .hidden = 6,
                        .classes = 4};
    cnn_model_t m;
    char err[256];
    ck_assert_int_eq(cnn_model_create(&m, &cfg, 4, err, sizeof err), 0);
    ck_assert_int_eq(m.flat, 3 * 2 * 2);
    cnn_rng_t r = {7};
    cnn_init_params(&m, &r);
    for (int t = 1; t < CNN_NTENSORS; t += 2) /* non-zero biases, so their paths are live */
        fill(m.params + m.offset[t], m.count[t], 0.1);
    uint8_t labels[3] = {1, 3, 0};
    real *x = alloc(3 * 14 * 14);
    fill(x, 3 * 14 * 14, 1.5);
    model_ctx c = {.m = &m, .x = x, .labels = labels, .n = 3};
    m.hook = record_hook;
    nevents = 0;
    model_obj(&c);
    ck_assert_int_eq(cnn_backward(&m, labels), 0);
    /* the hooks: forward_begin 0..3 in order, then backward_done 3..0 */
    const int want[8] = {0, 1, 2, 3, 103, 102, 101, 100};
    ck_assert_int_eq(nevents, 8);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(events[i], want[i]);
    m.hook = NULL;
    real *g = alloc(m.nparams);
    memcpy(g, m.grads, m.nparams * sizeof(real));
    for (int t = 0; t < CNN_NTENSORS; t++)
        check_grad(m.name[t], m.params + m.offset[t], m.count[t], g + m.offset[t], model_obj, &c);
    free(g), free(x);
    cnn_model_destroy(&m);
}
END_TEST

START_TEST(test_default_layout)
{
    cnn_config_t cfg = cnn_config_default();
    cnn_model_t m;
    char err[256];
    ck_assert_int_eq(cnn_model_create(&m, &cfg, 2, err, sizeof err), 0);
    /* 28 -> conv5 24 -> pool 12 -> conv5 8 -> pool 4: flat = 32*4*4 */
    ck_assert_int_eq(m.flat, 512);
    size_t want = (16 * 25 + 16) + (32 * 16 * 25 + 32) + (128 * 512 + 128) + (10 * 128 + 10);
    ck_assert_uint_eq(m.nparams, want);
    for (int t = 1; t < CNN_NTENSORS; t++) /* back to back: one arena */
        ck_assert_uint_eq(m.offset[t], m.offset[t - 1] + m.count[t - 1]);
    cnn_model_destroy(&m);
    cfg.in_h = 27; /* odd conv1 output: refused with a message */
    ck_assert_int_eq(cnn_model_create(&m, &cfg, 2, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "even"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cnn_model");
    TCase *tc = tcase_create("layers");
    tcase_add_test(tc, test_conv);
    tcase_add_test(tc, test_fc);
    tcase_add_test(tc, test_relu);
    tcase_add_test(tc, test_maxpool);
    tcase_add_test(tc, test_flatten);
    tcase_add_test(tc, test_softmax_xent);
    tcase_add_test(tc, test_model);
    tcase_add_test(tc, test_default_layout);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
