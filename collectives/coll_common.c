/* The shard rule shared by every collective algorithm, and the element steps of compression. */
#include "collectives/coll.h"

#include "collectives/coll_impl.h"

void dear_coll_shard(size_t count, int nranks, int rank, size_t *offset, size_t *len)
{
    size_t p = (size_t)nranks, r = (size_t)rank;
    size_t base = count / p, rem = count % p;
    *len = base + (r < rem ? 1 : 0);
    *offset = r * base + (r < rem ? r : rem);
}

size_t dear_coll_block_piece(const dear_coll_block_t *b, int nranks, int p, size_t *at)
{
    size_t off, len;
    dear_coll_shard(b->count, nranks, p, &off, &len);
    size_t l = off > b->lo ? off : b->lo, h = off + len < b->hi ? off + len : b->hi;
    *at = l;
    return h > l ? h - l : 0;
}

size_t dear_coll_blocks_count(const dear_coll_block_t *blocks, int nblocks, int nranks, int p)
{
    size_t c = 0, at;
    for (int b = 0; b < nblocks; b++)
        c += dear_coll_block_piece(&blocks[b], nranks, p, &at);
    return c;
}

int dear_coll_blocks_each(const dear_coll_block_t *blocks, int nblocks, int nranks, const size_t *displs, int p0,
                          int p1, dear_coll_piece_fn fn, void *arg)
{
    for (int p = p0; p < p1; p++) {
        size_t pos = displs[p];
        for (int b = 0; b < nblocks; b++) {
            size_t at, n = dear_coll_block_piece(&blocks[b], nranks, p, &at);
            if (n == 0)
                continue;
            int rc = fn(arg, &blocks[b], at, n, pos);
            if (rc != 0)
                return rc;
            pos += n;
        }
    }
    return 0;
}

/* Elements converted per pass: the float32 temporary stays in the first-level cache. */
#define WIRE_CHUNK 2048

void coll_wire_add(const dear_coll_req_t *r, void *dst16, float *dst32, const void *a16, const float *a32,
                   const void *b16, size_t n, double s)
{
    if (a32 != NULL && r->mem->wire_add != NULL) {
        (void)r->mem->wire_add(NULL, r->dtype, dst16, dst32, a32, b16, n, s);
        return;
    }
    if (a32 == NULL && dst32 == NULL) { /* both 16-bit: the type's own sum, rounded once */
        coll_sum(r, r->dtype, dst16, a16, b16, n, s);
        return;
    }
    float tmp[WIRE_CHUNK];
    size_t es = r->esize;
    for (size_t i = 0; i < n; i += WIRE_CHUNK) {
        size_t m = n - i < WIRE_CHUNK ? n - i : WIRE_CHUNK;
        coll_widen(r, r->dtype, tmp, (const char *)b16 + i * es, m);
        if (a32 != NULL && dst32 != NULL) {
            coll_sum(r, DEAR_FLOAT32, dst32 + i, a32 + i, tmp, m, s);
            continue;
        }
        if (a32 != NULL)
            coll_sum(r, DEAR_FLOAT32, tmp, tmp, a32 + i, m, 1.0);
        else
            coll_widen_acc(r, r->dtype, tmp, (const char *)a16 + i * es, m);
        if (dst32 != NULL)
            coll_scale(r, DEAR_FLOAT32, dst32 + i, tmp, m, s);
        else
            coll_narrow(r, r->dtype, (char *)dst16 + i * es, tmp, m, s);
    }
}

void coll_rs_final(const dear_coll_req_t *r, const void *sum, size_t n)
{
    if (r->out32 == NULL) {
        coll_scale(r, r->dtype, r->out, sum, n, r->scale);
        return;
    }
    coll_widen(r, r->dtype, r->out32, sum, n);
    coll_scale(r, DEAR_FLOAT32, r->out32, r->out32, n, r->scale);
}
