/* test_gpu's kernels on the emulated runtime (gpu_kern.h), as emulated kernels on the stream. */
#include <time.h>

#include "cuemu.h"
#include "tests/cuda/gpu_kern.h"

typedef struct {
    int op;
    dear_dtype_t dt;
    void *g;
    float *w;
    double *out;
    size_t n;
    int t, r, m, acc, delay_us;
    long it;
    float lr;
} targs_t;

enum { T_GRAD, T_SGD, T_SUM };

static void run(void *arg)
{
    const targs_t *k = arg;
    if (k->op == T_GRAD && k->delay_us > 0) {
        struct timespec ts = { k->delay_us / 1000000, (long)(k->delay_us % 1000000) * 1000 };
        nanosleep(&ts, NULL);
    }
    void *g = cuemu_device_view(k->g);
    float *w = k->w ? cuemu_device_view(k->w) : NULL;
    double *out = k->out ? cuemu_device_view(k->out) : NULL;
    switch (k->op) {
    case T_GRAD:
        for (size_t i = 0; g && i < k->n; i++)
            tk_store(k->dt, g, i, (k->acc ? tk_load(k->dt, g, i) : 0.0f) + tk_grad_value(k->t, k->r, k->it, k->m, i));
        break;
    case T_SGD:
        for (size_t i = 0; g && w && i < k->n; i++)
            w[i] -= k->lr * tk_load(k->dt, g, i);
        break;
    case T_SUM: {
        double s = 0;
        for (size_t i = 0; w && i < k->n; i++)
            s += w[i];
        if (out)
            *out = s;
        break;
    }
    }
}

cudaError_t tk_grad(cudaStream_t s, dear_dtype_t dtype, void *g, size_t n, int t, int r, long it, int m, int accumulate,
                    int delay_us)
{
    targs_t k = { .op = T_GRAD, .dt = dtype, .g = g, .n = n, .t = t, .r = r, .m = m, .acc = accumulate,
                  .delay_us = delay_us, .it = it };
    return cuemu_kernel_args(s, run, &k, sizeof k);
}

cudaError_t tk_sgd(cudaStream_t s, float *w, const void *g, dear_dtype_t dtype, size_t n, float lr)
{
    targs_t k = { .op = T_SGD, .dt = dtype, .g = (void *)g, .w = w, .n = n, .lr = lr };
    return cuemu_kernel_args(s, run, &k, sizeof k);
}

cudaError_t tk_sum(cudaStream_t s, const float *w, size_t n, double *out)
{
    targs_t k = { .op = T_SUM, .w = (float *)w, .out = out, .n = n, .g = (void *)w };
    return cuemu_kernel_args(s, run, &k, sizeof k);
}
