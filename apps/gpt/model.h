/*
 * model.h: a decoder-only transformer (GPT) over characters or words, written out in C, layer by
 * layer.
 *
 * The model knows nothing of MPI or dear: the trainer (train.c) passes hooks that run before
 * each layer's forward and after each layer's backward, which is where it calls
 * dear_forward_begin and dear_backward_done. A "layer" for those hooks is a group of tensors
 * that is computed together (see gpt_layer_count): the embeddings, then per block the
 * attention half and the MLP half, then the final LayerNorm with the output head.
 *
 * The element type is gpt_real: float by default, double when compiled with
 * -DGPT_REAL_DOUBLE, which is how the unit tests check every backward pass against finite
 * differences in float64 with the very same code the trainer runs.
 */
#ifndef DEAR_APPS_GPT_MODEL_H
#define DEAR_APPS_GPT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef GPT_REAL_DOUBLE
typedef double gpt_real;
#else
typedef float gpt_real;
#endif

/* Hyper-parameters that fix the shapes. */
typedef struct {
    int vocab;      /* V: distinct tokens (characters, or words and <unk>) */
    int max_seq;    /* maxT: longest context (size of the position embedding) */
    int layers;     /* NL: transformer blocks */
    int heads;      /* NH: attention heads; dim % heads == 0 */
    int dim;        /* C: channels */
} gpt_config_t;

/* One parameter tensor, in forward order; its values and gradient sit at the same offset of
 * the parameter and gradient arenas. */
typedef struct {
    char name[32];
    size_t offset;
    size_t count;
    int layer;      /* hook layer id (0 .. gpt_layer_count-1) */
    int is_matrix;  /* 2-D weight of a linear map (weight decay applies) */
} gpt_tensor_t;

/* Per-block parameter views (all inside the parameter or gradient arena). */
typedef struct {
    gpt_real *ln1w, *ln1b;          /* (C), (C) */
    gpt_real *qkvw, *qkvb;          /* (3C, C), (3C) */
    gpt_real *attprojw, *attprojb;  /* (C, C), (C) */
    gpt_real *ln2w, *ln2b;          /* (C), (C) */
    gpt_real *fcw, *fcb;            /* (4C, C), (4C) */
    gpt_real *fcprojw, *fcprojb;    /* (C, 4C), (C) */
} gpt_block_params_t;

typedef struct {
    gpt_real *wte;                  /* (V, C) token embedding */
    gpt_real *wpe;                  /* (maxT, C) position embedding */
    gpt_block_params_t *blocks;     /* NL */
    gpt_real *lnfw, *lnfb;          /* (C), (C) */
    gpt_real *lmw, *lmb;            /* (V, C), (V) output head, not tied to wte */
} gpt_params_t;

/* Per-block activations for one (B, T) batch. */
typedef struct {
    gpt_real *ln1, *ln1_mean, *ln1_rstd;    /* (B,T,C), (B,T), (B,T) */
    gpt_real *qkv;                          /* (B,T,3C) */
    gpt_real *att;                          /* (B,NH,T,T) softmax probabilities */
    gpt_real *atty;                         /* (B,T,C) attention output before projection */
    gpt_real *attproj;                      /* (B,T,C) */
    gpt_real *res2;                         /* (B,T,C) residual after attention */
    gpt_real *ln2, *ln2_mean, *ln2_rstd;    /* (B,T,C), (B,T), (B,T) */
    gpt_real *fch;                          /* (B,T,4C) */
    gpt_real *fch_gelu;                     /* (B,T,4C) */
    gpt_real *fcproj;                       /* (B,T,C) */
    gpt_real *res3;                         /* (B,T,C) residual after the MLP: block output */
} gpt_block_acts_t;

typedef struct {
    gpt_real *encoded;                      /* (B,T,C) */
    gpt_block_acts_t *blocks;               /* NL */
    gpt_real *lnf, *lnf_mean, *lnf_rstd;    /* (B,T,C), (B,T), (B,T) */
    gpt_real *logits;                       /* (B,T,V) */
    gpt_real *probs;                        /* (B,T,V) */
    gpt_real *losses;                       /* (B,T) */
} gpt_acts_t;

/* Called before the forward pass of a layer and after its backward pass; non-zero aborts
 * the pass and is returned. */
typedef struct {
    int (*forward_begin)(void *arg, int layer);
    int (*backward_done)(void *arg, int layer);
    void *arg;
} gpt_hooks_t;

typedef struct {
    gpt_config_t cfg;
    int max_batch;                  /* B the activations were sized for */
    size_t num_params;
    gpt_real *params_memory;        /* one allocation for every parameter */
    gpt_real *grads_memory;         /* one allocation for every gradient, same layout */
    gpt_params_t params, grads;
    int num_tensors;
    gpt_tensor_t *tensors;          /* forward order, back to back in the arenas */
    size_t num_acts;
    gpt_real *acts_memory, *grads_acts_memory;
    gpt_acts_t acts, grads_acts;
    gpt_real *scratch;              /* (T,T) attention backward scratch */
    /* last batch seen by gpt_forward (needed by gpt_backward) */
    const int *inputs, *targets;
    int B, T;
    double mean_loss;               /* of the last forward with targets */
} gpt_model_t;

/* Number of hook layers: 1 (embeddings) + 2 per block + 1 (final LayerNorm and head). */
int gpt_layer_count(const gpt_config_t *cfg);

/* Allocate the model for batches of up to max_batch sequences of up to cfg->max_seq tokens
 * and initialise the parameters from seed (GPT-2 style: N(0, 0.02), residual projections
 * scaled by 1/sqrt(2 NL), LayerNorm weights 1, biases 0). Returns 0 or -1 with a message in
 * err. */
int gpt_model_init(gpt_model_t *m, const gpt_config_t *cfg, int max_batch, uint64_t seed,
                   char *err, size_t errlen);
void gpt_model_free(gpt_model_t *m);

/* Forward pass of inputs (B,T) token ids. With targets (B,T) it also computes the mean
 * cross-entropy into m->mean_loss (nats per token). hooks may be NULL (evaluation). */
int gpt_forward(gpt_model_t *m, const int *inputs, const int *targets, int B, int T,
                const gpt_hooks_t *hooks);
/* Backward pass of the last forward (which must have had targets): every gradient in
 * m->grads_memory is overwritten. The gradient is that of the mean loss. */
int gpt_backward(gpt_model_t *m, const gpt_hooks_t *hooks);

/* ---- the layers, exposed for the finite-difference tests; B,T,C as in the shapes ----
 * Every backward function adds into its gradient outputs (d*), as llm.c's do, so that a
 * tensor used twice (the residual stream) collects both contributions. */

/* out(B,T,C) = wte[inp] + wpe[t] */
void gpt_encoder_forward(gpt_real *out, const int *inp, const gpt_real *wte, const gpt_real *wpe,
                         int B, int T, int C);
void gpt_encoder_backward(gpt_real *dwte, gpt_real *dwpe, const gpt_real *dout, const int *inp,
                          int B, int T, int C);
/* out(N,C) = (inp - mean) * rstd * weight + bias, per row of N = B*T rows */
void gpt_layernorm_forward(gpt_real *out, gpt_real *mean, gpt_real *rstd, const gpt_real *inp,
                           const gpt_real *weight, const gpt_real *bias, int N, int C);
void gpt_layernorm_backward(gpt_real *dinp, gpt_real *dweight, gpt_real *dbias,
                            const gpt_real *dout, const gpt_real *inp, const gpt_real *weight,
                            const gpt_real *mean, const gpt_real *rstd, int N, int C);
/* out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC); bias may be NULL */
void gpt_matmul_forward(gpt_real *out, const gpt_real *inp, const gpt_real *weight,
                        const gpt_real *bias, int N, int C, int OC);
void gpt_matmul_backward(gpt_real *dinp, gpt_real *dweight, gpt_real *dbias, const gpt_real *dout,
                         const gpt_real *inp, const gpt_real *weight, int N, int C, int OC);
/* out(B,T,C) = causal multi-head attention of qkv(B,T,3C); att(B,NH,T,T) keeps the
 * probabilities; scratch holds T*T elements */
void gpt_attention_forward(gpt_real *out, gpt_real *att, const gpt_real *qkv, int B, int T, int C,
                           int NH);
void gpt_attention_backward(gpt_real *dqkv, const gpt_real *dout, const gpt_real *qkv,
                            const gpt_real *att, gpt_real *scratch, int B, int T, int C, int NH);
/* out(N) = GELU(inp) (tanh approximation) */
void gpt_gelu_forward(gpt_real *out, const gpt_real *inp, int N);
void gpt_gelu_backward(gpt_real *dinp, const gpt_real *inp, const gpt_real *dout, int N);
/* out(N) = a + b */
void gpt_residual_forward(gpt_real *out, const gpt_real *a, const gpt_real *b, int N);
void gpt_residual_backward(gpt_real *da, gpt_real *db, const gpt_real *dout, int N);
/* probs(B,T,V) = softmax(logits); losses(B,T) = -log probs[target] */
void gpt_softmax_forward(gpt_real *probs, const gpt_real *logits, int N, int V);
void gpt_crossentropy_forward(gpt_real *losses, const gpt_real *probs, const int *targets, int N,
                              int V);
/* dlogits(N,V) = (probs - onehot(target)) * dloss, the gradient of sum(dloss * losses) */
void gpt_crossentropy_softmax_backward(gpt_real *dlogits, const gpt_real *probs,
                                       const int *targets, gpt_real dloss, int N, int V);

#endif /* DEAR_APPS_GPT_MODEL_H */
