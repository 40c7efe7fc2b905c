/*
 * The delayed host row of the memory table (mem_delay.h). A queue is a FIFO of closures run by a
 * worker thread of its own; a fence is the queue and the number of items enqueued on it when it
 * was recorded, complete once the worker has run that many. Every entry point checks nothing the
 * host row does not: the point is the timing.
 */
#include "tests/mpi/mem_delay.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/reduce.h"
#include "runtime/rt.h"

enum { K_COPY, K_ZERO, K_SCALE, K_SUM, K_WIDEN, K_WIDEN_ACC, K_NARROW, K_SUMSQ, K_WAIT };

typedef struct item {
    struct item *next;
    int kind;
    dear_dtype_t t;
    void *dst;
    const void *a, *b;
    size_t n;
    double s;
    double *out;
    dear_memq_t *wq;            /* K_WAIT: the queue waited for ... */
    uint64_t wseq;              /* ... until it has run this many items */
} item_t;

struct dear_memq {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* work queued, an item run, or stop */
    item_t *head, *tail;
    uint64_t enq, ran;
    int stop;
    unsigned seed;
    pthread_t thread;
};

struct dear_fence {
    dear_memq_t *q;             /* NULL: never recorded, or recorded on the calling thread */
    uint64_t seq;
};

static long delay_us = 300;
static unsigned seed0 = 1;

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

void mem_delay_install(void)
{
    delay_us = env_long("MEM_DELAY_US", 300);
    seed0 = (unsigned)env_long("MEM_DELAY_SEED", 1);
    dear_rt_mem_set_host_row(&mem_delay_ops);
}

static void run(item_t *it)
{
    switch (it->kind) {
    case K_COPY: memcpy(it->dst, it->a, it->n); break;
    case K_ZERO: memset(it->dst, 0, it->n); break;
    case K_SCALE: dear_reduce_scale(it->t, it->dst, it->a, it->n, it->s); break;
    case K_SUM: dear_reduce_sum(it->t, it->dst, it->a, it->b, it->n, it->s); break;
    case K_WIDEN: dear_reduce_widen(it->t, it->dst, it->a, it->n); break;
    case K_WIDEN_ACC: dear_reduce_widen_acc(it->t, it->dst, it->a, it->n); break;
    case K_NARROW: dear_reduce_narrow(it->t, it->dst, it->a, it->n, it->s); break;
    case K_SUMSQ: *it->out = dear_reduce_sumsq(it->t, it->a, it->n); break;
    case K_WAIT:
        pthread_mutex_lock(&it->wq->mu);
        while (it->wq->ran < it->wseq && !it->wq->stop)
            pthread_cond_wait(&it->wq->cv, &it->wq->mu);
        pthread_mutex_unlock(&it->wq->mu);
        break;
    }
}

static void *worker(void *arg)
{
    dear_memq_t *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->head == NULL && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->head == NULL)
            break;
        item_t *it = q->head;
        long us = delay_us > 0 ? (long)(rand_r(&q->seed) % (unsigned)(delay_us + 1)) : 0;
        pthread_mutex_unlock(&q->mu);
        if (us > 0)
            nanosleep(&(struct timespec){ us / 1000000, (us % 1000000) * 1000 }, NULL);
        run(it);
        pthread_mutex_lock(&q->mu);
        q->head = it->next;
        if (q->head == NULL)
            q->tail = NULL;
        q->ran++;
        free(it);
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static int queue_create(dear_memq_t **out)
{
    static unsigned nq;
    dear_memq_t *q = calloc(1, sizeof *q);
    if (q == NULL)
        return DEAR_ERR_NOMEM;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->seed = seed0 + 7919u * __atomic_fetch_add(&nq, 1, __ATOMIC_RELAXED);
    if (pthread_create(&q->thread, NULL, worker, q) != 0) {
        free(q);
        return DEAR_ERR_INTERNAL;
    }
    *out = q;
    return DEAR_OK;
}

/* Runs what is queued, then stops. */
static void queue_destroy(dear_memq_t *q)
{
    if (q == NULL)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

/* Queue NULL: now, on this thread. */
static int submit(dear_memq_t *q, item_t proto)
{
    if (q == NULL) {
        run(&proto);
        return DEAR_OK;
    }
    item_t *it = malloc(sizeof *it);
    if (it == NULL)
        return DEAR_ERR_NOMEM;
    *it = proto;
    it->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    q->enq++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return DEAR_OK;
}

static int fence_create(dear_fence_t **f)
{
    *f = calloc(1, sizeof **f);
    return *f ? DEAR_OK : DEAR_ERR_NOMEM;
}

static void fence_destroy(dear_fence_t *f) { free(f); }

static int fence_record(dear_fence_t *f, dear_memq_t *q)
{
    f->q = q;
    if (q) {
        pthread_mutex_lock(&q->mu);
        f->seq = q->enq;
        pthread_mutex_unlock(&q->mu);
    }
    return DEAR_OK;
}

static int fence_query(dear_fence_t *f, int *done)
{
    *done = 1;
    if (f && f->q) {
        pthread_mutex_lock(&f->q->mu);
        *done = f->q->ran >= f->seq;
        pthread_mutex_unlock(&f->q->mu);
    }
    return DEAR_OK;
}

static int fence_wait(dear_memq_t *q, dear_fence_t *f)
{
    if (f == NULL || f->q == NULL || f->q == q)
        return DEAR_OK; /* complete, or earlier on the same queue */
    return submit(q, (item_t){ .kind = K_WAIT, .wq = f->q, .wseq = f->seq });
}

static int d_alloc(size_t bytes, int host, void **p)
{
    *p = malloc(bytes);
    return *p ? DEAR_OK : DEAR_ERR_NOMEM;
}

static void d_release(void *p, int host) { free(p); }

static int d_copy(dear_memq_t *q, void *dst, const void *src, size_t bytes)
{
    return submit(q, (item_t){ .kind = K_COPY, .dst = dst, .a = src, .n = bytes });
}

static int d_zero(dear_memq_t *q, void *dst, size_t bytes)
{
    return submit(q, (item_t){ .kind = K_ZERO, .dst = dst, .n = bytes });
}

static int d_scale(dear_memq_t *q, dear_dtype_t t, void *dst, const void *src, size_t n, double s)
{
    return submit(q, (item_t){ .kind = K_SCALE, .t = t, .dst = dst, .a = src, .n = n, .s = s });
}

static int d_sum(dear_memq_t *q, dear_dtype_t t, void *dst, const void *a, const void *b, size_t n, double s)
{
    return submit(q, (item_t){ .kind = K_SUM, .t = t, .dst = dst, .a = a, .b = b, .n = n, .s = s });
}

static int d_widen(dear_memq_t *q, dear_dtype_t t, float *dst, const void *src, size_t n)
{
    return submit(q, (item_t){ .kind = K_WIDEN, .t = t, .dst = dst, .a = src, .n = n });
}

static int d_widen_acc(dear_memq_t *q, dear_dtype_t t, float *acc, const void *src, size_t n)
{
    return submit(q, (item_t){ .kind = K_WIDEN_ACC, .t = t, .dst = acc, .a = src, .n = n });
}

static int d_narrow(dear_memq_t *q, dear_dtype_t t, void *dst, const float *src, size_t n, double s)
{
    return submit(q, (item_t){ .kind = K_NARROW, .t = t, .dst = dst, .a = src, .n = n, .s = s });
}

static int d_sumsq(dear_memq_t *q, dear_dtype_t t, const void *src, size_t n, double *out)
{
    return submit(q, (item_t){ .kind = K_SUMSQ, .t = t, .a = src, .n = n, .out = out });
}

const dear_mem_ops_t mem_delay_ops = {
    .name = "host-delayed",
    .flags = DEAR_MEM_F_HOST_ACCESS | DEAR_MEM_F_STAGE,
    .alloc = d_alloc,
    .release = d_release,
    .queue_create = queue_create,
    .queue_destroy = queue_destroy,
    .fence_create = fence_create,
    .fence_destroy = fence_destroy,
    .fence_record = fence_record,
    .fence_wait = fence_wait,
    .fence_query = fence_query,
    .copy = d_copy,
    .zero = d_zero,
    .scale = d_scale,
    .sum = d_sum,
    .widen = d_widen,
    .widen_acc = d_widen_acc,
    .narrow = d_narrow,
    .sumsq = d_sumsq,
};
