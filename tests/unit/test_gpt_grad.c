/*
 * test_gpt_grad: checks every backward pass of dear-gpt's model against central finite
 * differences in float64. apps/gpt/model.c is compiled for this test with -DGPT_REAL_DOUBLE,
 * so the code under test is the trainer's own, only in double precision.
 *
 * For a layer y = f(x) and a random weighting w, the objective L = sum(w * y) has gradient
 * dL/dx = backward(dout = w); each checked element of that gradient must match
 * (L(x + h) - L(x - h)) / 2h. The whole-model test does the same for the mean cross-entropy
 * and every parameter tensor, and checks the order of the layer hooks. Also checks the text
 * loader's vocabulary, split and unigram entropy against values counted here.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/gpt/model.h"
#include "apps/gpt/text.h"

#define FD_H 1e-5
#define FD_TOL 1e-6     /* relative to max(1, |numeric|) */
#define FD_MAX_CHECKS 160

static uint64_t g_rng = 12345;

static double urand(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}

static gpt_real *rand_array(size_t n, double scale)
{
    gpt_real *a = malloc(n * sizeof *a);
    ck_assert_ptr_nonnull(a);
    for (size_t i = 0; i < n; i++)
        a[i] = (gpt_real)(scale * (2 * urand() - 1));
    return a;
}

static gpt_real *zeros(size_t n)
{
    gpt_real *a = calloc(n, sizeof *a);
    ck_assert_ptr_nonnull(a);
    return a;
}

typedef double (*objective_fn)(void *ctx);

static double weighted_sum(const gpt_real *w, const gpt_real *y, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)w[i] * (double)y[i];
    return s;
}

/* Compare analytic[i] with the central difference of f in x[i], for up to FD_MAX_CHECKS
 * elements spread over x; returns the largest error seen (relative to max(1, |numeric|)). */
static double fd_check(const char *what, gpt_real *x, size_t n, const gpt_real *analytic,
                       objective_fn f, void *ctx)
{
    size_t stride = n > FD_MAX_CHECKS ? n / FD_MAX_CHECKS : 1;
    double worst = 0;
    for (size_t i = 0; i < n; i += stride) {
        gpt_real saved = x[i];
        x[i] = saved + FD_H;
        double fp = f(ctx);
        x[i] = saved - FD_H;
        double fm = f(ctx);
        x[i] = saved;
        double num = (fp - fm) / (2 * FD_H);
        double err = fabs(num - analytic[i]) / fmax(1.0, fabs(num));
        if (err > worst)
            worst = err;
        ck_assert_msg(err < FD_TOL, "%s[%zu]: analytic %.10g, finite difference %.10g", what, i,
                      (double)analytic[i], num);
    }
    return worst;
}

/* ---- encoder ---- */
typedef struct {
    int B, T, C, V;
    int *inp;
    gpt_real *wte, *wpe, *out, *w;
} enc_ctx_t;

static double enc_obj(void *p)
{
    enc_ctx_t *c = p;
    gpt_encoder_forward(c->out, c->inp, c->wte, c->wpe, c->B, c->T, c->C);
    return weighted_sum(c->w, c->out, (size_t)c->B * c->T * c->C);
}

START_TEST(test_encoder)
{
    enc_ctx_t c = {.B = 2, .T = 5, .C = 6, .V = 7};
    size_t n = (size_t)c.B * c.T * c.C;
    c.inp = malloc((size_t)c.B * c.T * sizeof *c.inp);
    for (int i = 0; i < c.B * c.T; i++)
        c.inp[i] = (int)(urand() * 4); /* ids 4..6 never appear: their gradient must be 0 */
    c.wte = rand_array((size_t)c.V * c.C, 1);
    c.wpe = rand_array((size_t)c.T * c.C, 1);
    c.out = zeros(n);
    c.w = rand_array(n, 1);
    gpt_real *dwte = zeros((size_t)c.V * c.C), *dwpe = zeros((size_t)c.T * c.C);
    gpt_encoder_backward(dwte, dwpe, c.w, c.inp, c.B, c.T, c.C);
    fd_check("dwte", c.wte, (size_t)c.V * c.C, dwte, enc_obj, &c);
    fd_check("dwpe", c.wpe, (size_t)c.T * c.C, dwpe, enc_obj, &c);
    for (size_t i = 4 * (size_t)c.C; i < (size_t)c.V * c.C; i++)
        ck_assert(dwte[i] == 0);
    free(c.inp); free(c.wte); free(c.wpe); free(c.out); free(c.w); free(dwte); free(dwpe);
}
END_TEST

/* ---- layernorm ---- */
typedef struct {
    int N, C;
    gpt_real *inp, *weight, *bias, *out, *mean, *rstd, *w;
} ln_ctx_t;

static double ln_obj(void *p)
{
    ln_ctx_t *c = p;
    gpt_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->weight, c->bias, c->N, c->C);
    return weighted_sum(c->w, c->out, (size_t)c->N * c->C);
}

START_TEST(test_layernorm)
{
    ln_ctx_t c = {.N = 6, .C = 10};
    size_t n = (size_t)c.N * c.C;
    c.inp = rand_array(n, 2);
    c.weight = rand_array((size_t)c.C, 1);
    c.bias = rand_array((size_t)c.C, 1);
    c.out = zeros(n);
    c.mean = zeros((size_t)c.N);
    c.rstd = zeros((size_t)c.N);
    c.w = rand_array(n, 1);
    ln_obj(&c);
    /* the forward pass normalises: each row of (out - bias) / weight has mean 0, variance 1 */
    for (int r = 0; r < c.N; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < c.C; i++)
            m += (c.out[r * c.C + i] - c.bias[i]) / c.weight[i];
        m /= c.C;
        for (int i = 0; i < c.C; i++) {
            double d = (c.out[r * c.C + i] - c.bias[i]) / c.weight[i] - m;
            v += d * d;
        }
        ck_assert_double_eq_tol(m, 0, 1e-9);
        ck_assert_double_eq_tol(v / c.C, 1, 1e-4); /* eps = 1e-5 in the variance */
    }
    gpt_real *dinp = zeros(n), *dw = zeros((size_t)c.C), *db = zeros((size_t)c.C);
    gpt_layernorm_backward(dinp, dw, db, c.w, c.inp, c.weight, c.mean, c.rstd, c.N, c.C);
    fd_check("layernorm dinp", c.inp, n, dinp, ln_obj, &c);
    fd_check("layernorm dweight", c.weight, (size_t)c.C, dw, ln_obj, &c);
    fd_check("layernorm dbias", c.bias, (size_t)c.C, db, ln_obj, &c);
    free(c.inp); free(c.weight); free(c.bias); free(c.out); free(c.mean); free(c.rstd);
    free(c.w); free(dinp); free(dw); free(db);
}
END_TEST

/* ---- matmul ---- */
typedef struct {
    int N, C, OC;
    gpt_real *inp, *weight, *bias, *out, *w;
} mm_ctx_t;

static double mm_obj(void *p)
{
    mm_ctx_t *c = p;
    gpt_matmul_forward(c->out, c->inp, c->weight, c->bias, c->N, c->C, c->OC);
    return weighted_sum(c->w, c->out, (size_t)c->N * c->OC);
}

START_TEST(test_matmul)
{
    mm_ctx_t c = {.N = 7, .C = 5, .OC = 9};
    c.inp = rand_array((size_t)c.N * c.C, 1);
    c.weight = rand_array((size_t)c.OC * c.C, 1);
    c.bias = rand_array((size_t)c.OC, 1);
    c.out = zeros((size_t)c.N * c.OC);
    c.w = rand_array((size_t)c.N * c.OC, 1);
    /* forward against a plain triple loop */
    mm_obj(&c);
    for (int n = 0; n < c.N; n++)
        for (int o = 0; o < c.OC; o++) {
            double s = c.bias[o];
            for (int i = 0; i < c.C; i++)
                s += c.inp[n * c.C + i] * c.weight[o * c.C + i];
            ck_assert_double_eq_tol(c.out[n * c.OC + o], s, 1e-12);
        }
    gpt_real *dinp = zeros((size_t)c.N * c.C), *dw = zeros((size_t)c.OC * c.C);
    gpt_real *db = zeros((size_t)c.OC);
    gpt_matmul_backward(dinp, dw, db, c.w, c.inp, c.weight, c.N, c.C, c.OC);
    fd_check("matmul dinp", c.inp, (size_t)c.N * c.C, dinp, mm_obj, &c);
    fd_check("matmul dweight", c.weight, (size_t)c.OC * c.C, dw, mm_obj, &c);
    fd_check("matmul dbias", c.bias, (size_t)c.OC, db, mm_obj, &c);
    free(c.inp); free(c.weight); free(c.bias); free(c.out); free(c.w); free(dinp); free(dw);
    free(db);
}
END_TEST

/* ---- attention ---- */
typedef struct {
    int B, T, C, NH;
    gpt_real *qkv, *att, *out, *w;
} att_ctx_t;

static double att_obj(void *p)
{
    att_ctx_t *c = p;
    gpt_attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return weighted_sum(c->w, c->out, (size_t)c->B * c->T * c->C);
}

START_TEST(test_attention)
{
    att_ctx_t c = {.B = 2, .T = 5, .C = 8, .NH = 2};
    size_t n = (size_t)c.B * c.T * c.C, nqkv = 3 * n;
    c.qkv = rand_array(nqkv, 1);
    c.att = zeros((size_t)c.B * c.NH * c.T * c.T);
    c.out = zeros(n);
    c.w = rand_array(n, 1);
    att_obj(&c);
    /* causality: the output at position 0 is exactly v at position 0, per head */
    int hs = c.C / c.NH;
    for (int b = 0; b < c.B; b++)
        for (int i = 0; i < c.C; i++)
            ck_assert_double_eq_tol(c.out[(size_t)b * c.T * c.C + i],
                                    c.qkv[(size_t)b * c.T * 3 * c.C + 2 * c.C + i], 1e-12);
    (void)hs;
    gpt_real *dqkv = zeros(nqkv), *scratch = zeros((size_t)c.T * c.T);
    gpt_attention_backward(dqkv, c.w, c.qkv, c.att, scratch, c.B, c.T, c.C, c.NH);
    fd_check("attention dqkv", c.qkv, nqkv, dqkv, att_obj, &c);
    free(c.qkv); free(c.att); free(c.out); free(c.w); free(dqkv); free(scratch);
}
END_TEST

/* ---- gelu, residual ---- */
typedef struct {
    int N;
    gpt_real *a, *b, *out, *w;
} pw_ctx_t;

static double gelu_obj(void *p)
{
    pw_ctx_t *c = p;
    gpt_gelu_forward(c->out, c->a, c->N);
    return weighted_sum(c->w, c->out, (size_t)c->N);
}

static double res_obj(void *p)
{
    pw_ctx_t *c = p;
    gpt_residual_forward(c->out, c->a, c->b, c->N);
    return weighted_sum(c->w, c->out, (size_t)c->N);
}

START_TEST(test_gelu_residual)
{
    pw_ctx_t c = {.N = 50};
    c.a = rand_array((size_t)c.N, 4);
    c.b = rand_array((size_t)c.N, 4);
    c.out = zeros((size_t)c.N);
    c.w = rand_array((size_t)c.N, 1);
    gelu_obj(&c);
    for (int i = 0; i < c.N; i++) { /* tanh form vs the exact erf form: close, not equal */
        double x = c.a[i];
        ck_assert_double_eq_tol(c.out[i], 0.5 * x * (1 + erf(x / sqrt(2.0))), 2e-3);
    }
    gpt_real *da = zeros((size_t)c.N), *db = zeros((size_t)c.N);
    gpt_gelu_backward(da, c.a, c.w, c.N);
    fd_check("gelu dinp", c.a, (size_t)c.N, da, gelu_obj, &c);
    memset(da, 0, (size_t)c.N * sizeof *da);
    gpt_residual_backward(da, db, c.w, c.N);
    fd_check("residual da", c.a, (size_t)c.N, da, res_obj, &c);
    fd_check("residual db", c.b, (size_t)c.N, db, res_obj, &c);
    free(c.a); free(c.b); free(c.out); free(c.w); free(da); free(db);
}
END_TEST

/* ---- softmax + cross-entropy ---- */
typedef struct {
    int N, V;
    int *targets;
    gpt_real *logits, *probs, *losses;
    gpt_real dloss;
} ce_ctx_t;

static double ce_obj(void *p)
{
    ce_ctx_t *c = p;
    gpt_softmax_forward(c->probs, c->logits, c->N, c->V);
    gpt_crossentropy_forward(c->losses, c->probs, c->targets, c->N, c->V);
    double s = 0;
    for (int i = 0; i < c->N; i++)
        s += c->dloss * c->losses[i];
    return s;
}

START_TEST(test_crossentropy)
{
    ce_ctx_t c = {.N = 6, .V = 11, .dloss = (gpt_real)(1.0 / 6)};
    c.targets = malloc((size_t)c.N * sizeof *c.targets);
    for (int i = 0; i < c.N; i++)
        c.targets[i] = (int)(urand() * c.V);
    c.logits = rand_array((size_t)c.N * c.V, 3);
    c.probs = zeros((size_t)c.N * c.V);
    c.losses = zeros((size_t)c.N);
    ce_obj(&c);
    for (int n = 0; n < c.N; n++) { /* loss = logsumexp(logits) - logits[target] */
        double lse = 0;
        for (int i = 0; i < c.V; i++)
            lse += exp(c.logits[n * c.V + i]);
        ck_assert_double_eq_tol(c.losses[n], log(lse) - c.logits[n * c.V + c.targets[n]], 1e-12);
    }
    gpt_real *dl = zeros((size_t)c.N * c.V);
    gpt_crossentropy_softmax_backward(dl, c.probs, c.targets, c.dloss, c.N, c.V);
    fd_check("crossentropy dlogits", c.logits, (size_t)c.N * c.V, dl, ce_obj, &c);
    free(c.targets); free(c.logits); free(c.probs); free(c.losses); free(dl);
}
END_TEST

/* ---- whole model ---- */
typedef struct {
    gpt_model_t *m;
    int *inputs, *targets;
    int B, T;
} model_ctx_t;

static double model_obj(void *p)
{
    model_ctx_t *c = p;
    ck_assert_int_eq(gpt_forward(c->m, c->inputs, c->targets, c->B, c->T, NULL), 0);
    return c->m->mean_loss;
}

typedef struct {
    int events[64];
    int n;
} hook_log_t;

static int log_forward(void *arg, int layer)
{
    hook_log_t *h = arg;
    if (h->n < 64)
        h->events[h->n++] = layer;
    return 0;
}

static int log_backward(void *arg, int layer)
{
    hook_log_t *h = arg;
    if (h->n < 64)
        h->events[h->n++] = 100 + layer;
    return 0;
}

START_TEST(test_model)
{
    gpt_config_t cfg = {.vocab = 9, .max_seq = 6, .layers = 2, .heads = 2, .dim = 8};
    gpt_model_t m;
    char err[128];
    ck_assert_int_eq(gpt_model_init(&m, &cfg, 3, 7, err, sizeof err), 0);
    /* larger initial weights than GPT-2's 0.02 so every path carries gradient well above the
     * finite-difference noise */
    for (size_t i = 0; i < m.num_params; i++)
        m.params_memory[i] += (gpt_real)(0.3 * (2 * urand() - 1));
    /* the tensors tile the arena back to back in forward order, with non-decreasing layers */
    size_t off = 0;
    for (int i = 0; i < m.num_tensors; i++) {
        ck_assert_uint_eq(m.tensors[i].offset, off);
        off += m.tensors[i].count;
        if (i > 0)
            ck_assert_int_ge(m.tensors[i].layer, m.tensors[i - 1].layer);
    }
    ck_assert_uint_eq(off, m.num_params);
    ck_assert_str_eq(m.tensors[0].name, "wte");
    ck_assert_uint_eq(m.tensors[0].count, (size_t)cfg.vocab * cfg.dim);

    model_ctx_t c = {.m = &m, .B = 2, .T = 5}; /* smaller than the allocation on purpose */
    c.inputs = malloc((size_t)c.B * c.T * sizeof(int));
    c.targets = malloc((size_t)c.B * c.T * sizeof(int));
    for (int i = 0; i < c.B * c.T; i++) {
        c.inputs[i] = (int)(urand() * (cfg.vocab - 2)); /* the last 2 ids never appear */
        c.targets[i] = (int)(urand() * cfg.vocab);
    }
    hook_log_t log = {.n = 0};
    gpt_hooks_t hooks = {log_forward, log_backward, &log};
    ck_assert_int_eq(gpt_forward(&m, c.inputs, c.targets, c.B, c.T, &hooks), 0);
    ck_assert_int_eq(gpt_backward(&m, &hooks), 0);
    const int L = gpt_layer_count(&cfg);
    ck_assert_int_eq(log.n, 2 * L);
    for (int l = 0; l < L; l++) {
        ck_assert_int_eq(log.events[l], l);              /* forward in order */
        ck_assert_int_eq(log.events[L + l], 100 + L - 1 - l); /* backward in reverse */
    }

    gpt_real *analytic = malloc(m.num_params * sizeof *analytic);
    memcpy(analytic, m.grads_memory, m.num_params * sizeof *analytic);
    /* the token-embedding gradient is sparse: rows of absent characters are exactly zero */
    for (size_t i = (size_t)(cfg.vocab - 2) * cfg.dim; i < (size_t)cfg.vocab * cfg.dim; i++)
        ck_assert(analytic[i] == 0);
    for (int i = 0; i < m.num_tensors; i++) {
        const gpt_tensor_t *t = &m.tensors[i];
        fd_check(t->name, m.params_memory + t->offset, t->count, analytic + t->offset,
                 model_obj, &c);
    }
    /* a second backward of the same batch gives the same gradient (it overwrites) */
    model_obj(&c);
    ck_assert_int_eq(gpt_backward(&m, NULL), 0);
    for (size_t i = 0; i < m.num_params; i++)
        ck_assert_double_eq_tol(m.grads_memory[i], analytic[i], 1e-12);
    free(analytic);
    free(c.inputs);
    free(c.targets);
    gpt_model_free(&m);
}
END_TEST

START_TEST(test_model_bad_shapes)
{
    gpt_config_t cfg = {.vocab = 9, .max_seq = 6, .layers = 1, .heads = 3, .dim = 8};
    gpt_model_t m;
    char err[128] = "";
    ck_assert_int_eq(gpt_model_init(&m, &cfg, 1, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "heads") != NULL, "message names the problem: %s", err);
}
END_TEST

/* ---- text ---- */
START_TEST(test_text)
{
    char path[] = "/tmp/test_gpt_textXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    /* 12 KiB of text in 3 blocks; blocks 0..2 are all training (every tenth is validation) */
    const char *pattern = "abcab\n";
    size_t n = 3 * 4096 + 100;
    size_t count[256] = {0};
    FILE *f = fdopen(fd, "w");
    for (size_t i = 0; i < n; i++) {
        fputc(pattern[i % 6], f);
        count[(unsigned char)pattern[i % 6]]++;
    }
    fclose(f);
    gpt_text_t t;
    char err[256];
    ck_assert_int_eq(gpt_text_load(&t, path, NULL, 0, err, sizeof err), 0);
    ck_assert_int_eq(t.vocab, 4); /* '\n' a b c */
    ck_assert_int_eq(t.itos[0], '\n');
    ck_assert_int_eq(t.stoi['c'], 3);
    ck_assert_uint_eq(t.train_len + t.val_len, n);
    ck_assert_uint_eq(t.val_len, 0);
    /* entropy from the counts made while writing */
    double h = gpt_unigram_entropy(t.train, t.train_len, t.vocab), ref = 0;
    for (int c = 0; c < 256; c++)
        if (count[c])
            ref -= (double)count[c] / (double)n * log((double)count[c] / (double)n);
    ck_assert_double_eq_tol(h, ref, 1e-12);
    gpt_text_free(&t);
    unlink(path);
    ck_assert_int_eq(gpt_text_load(&t, "/nonexistent/file", NULL, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "/nonexistent/file") != NULL, "%s", err);
    ck_assert_int_eq(gpt_text_load(&t, NULL, "/nonexistent/dir", 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "apt-get install fortunes") != NULL, "%s", err);
}
END_TEST

static Suite *gpt_suite(void)
{
    Suite *s = suite_create("gpt");
    TCase *tc = tcase_create("backward");
    tcase_add_test(tc, test_encoder);
    tcase_add_test(tc, test_layernorm);
    tcase_add_test(tc, test_matmul);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_gelu_residual);
    tcase_add_test(tc, test_crossentropy);
    tcase_add_test(tc, test_model);
    tcase_add_test(tc, test_model_bad_shapes);
    tcase_add_test(tc, test_text);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(gpt_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
