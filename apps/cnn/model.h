/*
 * model.h: the small CNN of dear-cnn, with no MPI and no dear in it, so tests link it alone.
 *
 *   input (N,1,28,28)
 *   conv1 5x5, 1->16   -> (16,N,24,24)  ReLU  maxpool2 -> (16,N,12,12)
 *   conv2 5x5, 16->32  -> (32,N,8,8)    ReLU  maxpool2 -> (32,N,4,4)
 *   flatten            -> (N,512)
 *   fc1 512->128       -> (N,128)       ReLU
 *   fc2 128->10        -> (N,10)        softmax cross-entropy
 *
 * The convolution stack keeps activations channel-major, (C,N,H,W): then the im2col matrix of a
 * whole batch times the weights is one GEMM whose result is already the next activation, with no
 * transposes. For C=1 this is the same memory as (N,C,H,W), so the input needs no reordering;
 * flatten turns (C,N,H*W) into the (N,C*H*W) rows the fully connected layers use.
 *
 * The scalar type `real` is float, or double when compiled with -DCNN_DOUBLE: the gradient tests
 * build this same file in double and compare every backward against finite differences.
 * All parameters live in one allocation and all gradients in another with the same layout (the
 * gradient arena lets dear communicate them without copies).
 */
#ifndef CNN_MODEL_H
#define CNN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef CNN_DOUBLE
typedef double real;
#else
typedef float real;
#endif

/* ---------------------------------------------------------------------------------------------
 * Random numbers: splitmix64, small, fast and the same on every platform (repeatable runs).
 */
typedef struct {
    uint64_t state;
} cnn_rng_t;

static inline uint64_t cnn_rng_u64(cnn_rng_t *rng)
{
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double cnn_rng_uniform(cnn_rng_t *rng)
{
    return (double)(cnn_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n); n > 0. The modulo bias is below 2^-40 for the sizes used here. */
static inline uint64_t cnn_rng_below(cnn_rng_t *rng, uint64_t n)
{
    return cnn_rng_u64(rng) % n;
}

/* Standard normal (Box-Muller; one value per call, the second is dropped for simplicity). */
double cnn_rng_normal(cnn_rng_t *rng);

/* ---------------------------------------------------------------------------------------------
 * Shapes and parameter layout.
 */
typedef struct {
    int in_h, in_w;   /* input image, one channel */
    int k;            /* square convolution kernel, stride 1, no padding */
    int c1, c2;       /* output channels of conv1 and conv2 */
    int hidden;       /* fc1 outputs */
    int classes;      /* fc2 outputs */
} cnn_config_t;

/* The model dear-cnn trains on 28x28 Fashion-MNIST. */
cnn_config_t cnn_config_default(void);

/* 0 if the shapes work (positive sizes, even sizes before each 2x2 pool); otherwise -1 and a
 * message in err. */
int cnn_config_check(const cnn_config_t *cfg, char *err, size_t errlen);

/* Parameter tensors in forward order, and the layers that own them (dear layer ids). */
enum {
    CNN_CONV1_W, CNN_CONV1_B, CNN_CONV2_W, CNN_CONV2_B,
    CNN_FC1_W, CNN_FC1_B, CNN_FC2_W, CNN_FC2_B,
    CNN_NTENSORS
};
enum { CNN_L_CONV1, CNN_L_CONV2, CNN_L_FC1, CNN_L_FC2, CNN_NLAYERS };

/* Hook events, so the trainer can tell dear where the model is without model.c knowing dear. */
enum { CNN_HOOK_FORWARD_BEGIN, CNN_HOOK_BACKWARD_DONE };
/* Return 0 to go on; non-zero stops the pass and is returned by cnn_forward/cnn_backward. */
typedef int (*cnn_hook_fn)(void *arg, int event, int layer);

typedef struct {
    cnn_config_t cfg;
    /* derived sizes */
    int h1, w1;          /* conv1 output */
    int ph1, pw1;        /* after pool1 */
    int h2, w2;          /* conv2 output */
    int ph2, pw2;        /* after pool2 */
    int flat;            /* c2 * ph2 * pw2 */

    const char *name[CNN_NTENSORS];
    int layer[CNN_NTENSORS];
    size_t offset[CNN_NTENSORS];
    size_t count[CNN_NTENSORS];
    size_t nparams;
    real *params;        /* one allocation: every weight and bias */
    real *grads;         /* one allocation, same layout: dLoss/dparams of the last backward */

    /* Activations of the current batch, one allocation sized for max_batch images. */
    int max_batch;
    int batch;           /* images in the last forward */
    real *acts;
    real *x;             /* (1,N,H,W) input */
    real *col1;          /* (k*k, N*h1*w1) im2col of x */
    real *a1;            /* (c1,N,h1,w1) conv1 + ReLU */
    real *p1;            /* (c1,N,ph1,pw1) pool1 */
    real *col2;          /* (c1*k*k, N*h2*w2) im2col of p1 */
    real *a2;            /* (c2,N,h2,w2) conv2 + ReLU */
    real *p2;            /* (c2,N,ph2,pw2) pool2 */
    real *f;             /* (N,flat) flatten of p2 */
    real *h;             /* (N,hidden) fc1 + ReLU */
    real *logits;        /* (N,classes) */
    real *probs;         /* (N,classes) softmax */
    /* gradients of activations, same shapes */
    real *dlogits, *dh, *df, *dp2, *da2, *dcol2, *dp1, *da1;
    int32_t *idx1, *idx2; /* argmax of each pool window, for pool backward */

    cnn_hook_fn hook;    /* may be NULL */
    void *hook_arg;
} cnn_model_t;

/* Allocate parameters, gradients and activations for up to max_batch images. Parameters are
 * zero until cnn_init_params. Returns 0, or -1 with a message in err. */
int cnn_model_create(cnn_model_t *m, const cnn_config_t *cfg, int max_batch, char *err,
                     size_t errlen);
void cnn_model_destroy(cnn_model_t *m);

/* He-normal weights (std sqrt(2/fan_in); sqrt(1/fan_in) for the output layer, which no ReLU
 * follows), zero biases, drawn from rng in tensor order. */
void cnn_init_params(cnn_model_t *m, cnn_rng_t *rng);

/* Forward pass over n <= max_batch images (pixels already normalised, n*in_h*in_w values).
 * With labels, returns the mean cross-entropy and leaves probs for backward; labels may be
 * NULL (evaluation), then returns 0. A hook error is returned through *status (0 otherwise). */
double cnn_forward(cnn_model_t *m, const real *x, const uint8_t *labels, int n, int *status);

/* Backward pass of the last forward (which had labels): writes every gradient in m->grads
 * (overwrites, never accumulates). Returns 0 or the first non-zero hook result. */
int cnn_backward(cnn_model_t *m, const uint8_t *labels);

/* Index of the largest logit of image i of the last forward. */
int cnn_predict(const cnn_model_t *m, int i);

/* ---------------------------------------------------------------------------------------------
 * Layers. Each forward has a backward; shapes in the comments. Backward functions overwrite
 * their outputs. Exposed for the gradient tests.
 */

/* im2col for channel-major input in (C,N,H,W): col (C*k*k, N*OH*OW), OH = H-k+1. */
void cnn_im2col(real *col, const real *in, int C, int N, int H, int W, int k);
/* Adds col (C*k*k, N*OH*OW) back into in (C,N,H,W) (in is zeroed first). */
void cnn_col2im(real *in, const real *col, int C, int N, int H, int W, int k);

/* out (OC,N,OH,OW) = W (OC, C*k*k) x im2col(in) + b (OC); col is scratch (C*k*k, N*OH*OW)
 * and keeps im2col(in) for backward. */
void cnn_conv_forward(real *out, real *col, const real *in, const real *w, const real *b,
                      int N, int C, int H, int W, int OC, int k);
/* From dout (OC,N,OH,OW) and the col of forward: dw (OC, C*k*k), db (OC) and, if din is not
 * NULL, din (C,N,H,W) through dcol (scratch, C*k*k x N*OH*OW). */
void cnn_conv_backward(real *dw, real *db, real *din, real *dcol, const real *dout,
                       const real *col, const real *w, int N, int C, int H, int W, int OC, int k);

/* In place: x = max(x, 0), n values. */
void cnn_relu_forward(real *x, size_t n);
/* d *= (y > 0), where y is the ReLU output; n values. */
void cnn_relu_backward(real *d, const real *y, size_t n);

/* 2x2 max pool, stride 2, over `planes` planes of (H,W): out (planes, H/2, W/2); idx keeps the
 * position (0..H*W-1) of each maximum within its plane. */
void cnn_maxpool_forward(real *out, int32_t *idx, const real *in, int planes, int H, int W);
/* din (planes,H,W) = dout routed to the positions in idx, zero elsewhere. */
void cnn_maxpool_backward(real *din, const real *dout, const int32_t *idx, int planes, int H,
                          int W);

/* (C,N,S) -> (N,C*S) and back. */
void cnn_flatten_forward(real *out, const real *in, int C, int N, int S);
void cnn_flatten_backward(real *din, const real *dout, int C, int N, int S);

/* out (N,OUT) = in (N,IN) x W^T (W is OUT x IN) + b (OUT). */
void cnn_fc_forward(real *out, const real *in, const real *w, const real *b, int N, int IN,
                    int OUT);
/* dw (OUT,IN) = dout^T x in, db (OUT) = column sums of dout, din (N,IN) = dout x W (if not NULL). */
void cnn_fc_backward(real *dw, real *db, real *din, const real *dout, const real *in,
                     const real *w, int N, int IN, int OUT);

/* probs (N,K) = softmax(logits); returns the mean over N of -log probs[label]. */
double cnn_softmax_xent_forward(real *probs, const real *logits, const uint8_t *labels, int N,
                                int K);
/* dlogits (N,K) = (probs - onehot(label)) / N. */
void cnn_softmax_xent_backward(real *dlogits, const real *probs, const uint8_t *labels, int N,
                               int K);

#endif /* CNN_MODEL_H */
