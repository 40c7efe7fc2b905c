/*
 * The CUDA memory row's kernels on the tests' emulated runtime (tests/cuda/emu): each launcher
 * enqueues an emulated kernel on the stream (cuemu_kernel_args), which runs kern_body.h's
 * arithmetic on the worker's view of device memory. The squared norm adds in the GPU kernel's
 * exact order (strides, the fixed tree, the blocks in order), so both give the same bits.
 */
#include "cuda/kern.h"
#include "cuda/kern_body.h"
#include "tests/cuda/emu/cuemu.h"

typedef struct {
    int op;
    dear_dtype_t t;
    void *dst;
    const void *a, *b;
    size_t n;
    double s;
} kargs_t;

enum { K_SCALE, K_SUM, K_WIDEN, K_WIDEN_ACC, K_NARROW, K_FEEDBACK };

static void run(void *arg)
{
    const kargs_t *k = arg;
    void *dst = cuemu_device_view(k->dst);
    const void *a = cuemu_device_view(k->a), *b = k->b ? cuemu_device_view(k->b) : NULL;
    if (dst == NULL || a == NULL)
        return; /* the emulator flagged the pointer */
    for (size_t i = 0; i < k->n; i++) {
        switch (k->op) {
        case K_SCALE: kern_scale_at(k->t, dst, a, i, k->s); break;
        case K_SUM: kern_sum_at(k->t, dst, a, b, i, k->s); break;
        case K_WIDEN: kern_widen_at(k->t, dst, a, i); break;
        case K_WIDEN_ACC: kern_widen_acc_at(k->t, dst, a, i); break;
        case K_NARROW: kern_narrow_at(k->t, dst, a, i, k->s); break;
        case K_FEEDBACK: kern_feedback_at(k->t, dst, (float *)a, i); break;
        }
    }
}

static cudaError_t launch(cudaStream_t s, kargs_t k)
{
    if (k.n == 0)
        return cudaSuccess;
    return cuemu_kernel_args(s, run, &k, sizeof k);
}

cudaError_t dear_kern_scale(cudaStream_t s, dear_dtype_t t, void *dst, const void *src, size_t n, double scale)
{
    return launch(s, (kargs_t){ K_SCALE, t, dst, src, NULL, n, scale });
}

cudaError_t dear_kern_sum(cudaStream_t s, dear_dtype_t t, void *dst, const void *a, const void *b, size_t n,
                          double scale)
{
    return launch(s, (kargs_t){ K_SUM, t, dst, a, b, n, scale });
}

cudaError_t dear_kern_widen(cudaStream_t s, dear_dtype_t t, float *dst, const void *src, size_t n)
{
    return launch(s, (kargs_t){ K_WIDEN, t, dst, src, NULL, n, 1 });
}

cudaError_t dear_kern_widen_acc(cudaStream_t s, dear_dtype_t t, float *acc, const void *src, size_t n)
{
    return launch(s, (kargs_t){ K_WIDEN_ACC, t, acc, src, NULL, n, 1 });
}

cudaError_t dear_kern_narrow(cudaStream_t s, dear_dtype_t t, void *dst, const float *src, size_t n, double scale)
{
    return launch(s, (kargs_t){ K_NARROW, t, dst, src, NULL, n, scale });
}

cudaError_t dear_kern_feedback(cudaStream_t s, dear_dtype_t t, float *v, float *e, size_t n)
{
    return launch(s, (kargs_t){ K_FEEDBACK, t, v, e, NULL, n, 1 });
}

typedef struct {
    void *dst;
    const void *src;
    float *e;
    size_t n;
    int pack, acc;
} q8_args_t;

/* int8 blocks one after another: the largest magnitude, then the codes (the GPU's block). */
static void run_q8(void *arg)
{
    const q8_args_t *k = arg;
    void *dst = cuemu_device_view(k->dst);
    const void *src = cuemu_device_view(k->src);
    float *e = k->e != NULL ? cuemu_device_view(k->e) : NULL;
    if (dst == NULL || src == NULL || (k->e != NULL && e == NULL))
        return;
    if (!k->pack) {
        for (size_t i = 0; i < k->n; i++)
            kern_q8_value_at(dst, src, k->n, i, k->acc);
        return;
    }
    for (size_t b = 0; b < kern_q8_nblocks(k->n); b++) {
        size_t lo = b * DEAR_Q8_BLOCK, hi = lo + DEAR_Q8_BLOCK < k->n ? lo + DEAR_Q8_BLOCK : k->n;
        uint32_t m = 0;
        for (size_t i = lo; i < hi; i++) {
            uint32_t a = q8_mag(kern_q8_in_at(src, e, i));
            m = a > m ? a : m;
        }
        float s = q8_scale(bits_f(m));
        ((float *)dst)[b] = s;
        for (size_t i = lo; i < hi; i++)
            kern_q8_code_at(dst, k->n, e, i, kern_q8_in_at(src, e, i), s);
    }
}

cudaError_t dear_kern_q8_pack(cudaStream_t s, void *dst, const float *src, float *e, size_t n)
{
    q8_args_t k = { dst, src, e, n, 1, 0 };
    return n == 0 ? cudaSuccess : cuemu_kernel_args(s, run_q8, &k, sizeof k);
}

cudaError_t dear_kern_q8_unpack(cudaStream_t s, float *dst, const void *src, size_t n, int acc)
{
    q8_args_t k = { dst, src, NULL, n, 0, acc };
    return n == 0 ? cudaSuccess : cuemu_kernel_args(s, run_q8, &k, sizeof k);
}

typedef struct {
    dear_dtype_t t;
    const void *src;
    size_t n;
    double *scratch, *out;
} sumsq_args_t;

static void run_sumsq(void *arg)
{
    const sumsq_args_t *k = arg;
    const void *src = cuemu_device_view(k->src);
    double *scratch = cuemu_device_view(k->scratch), *out = cuemu_device_view(k->out);
    if ((src == NULL && k->n > 0) || scratch == NULL || out == NULL)
        return;
    const size_t B = DEAR_KERN_SUMSQ_BLOCKS, T = DEAR_KERN_THREADS;
    double acc[DEAR_KERN_THREADS];
    for (size_t b = 0; b < B; b++) {
        for (size_t th = 0; th < T; th++) {
            double v = 0;
            for (size_t i = b * T + th; i < k->n; i += B * T)
                v += kern_sq_at(k->t, src, i);
            acc[th] = v;
        }
        for (size_t w = T / 2; w > 0; w /= 2)
            for (size_t th = 0; th < w; th++)
                acc[th] += acc[th + w];
        scratch[b] = acc[0];
    }
    double s = 0;
    for (size_t b = 0; b < B; b++)
        s += scratch[b];
    scratch[B] = s;
    *out = s;
}

cudaError_t dear_kern_sumsq(cudaStream_t s, dear_dtype_t t, const void *src, size_t n, double *scratch, double *out)
{
    sumsq_args_t k = { t, src, n, scratch, out };
    return cuemu_kernel_args(s, run_sumsq, &k, sizeof k);
}
