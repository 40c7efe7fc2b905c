/*
 * The registry: each tensor checked as it is registered, the layers it forms at commit, the
 * check at commit that every rank registered the same tensors (naming the first difference on
 * every rank), and the tensors as the fusion layer describes them.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mpi_check.h"
#include "base/util.h"
#include "runtime/rt.h"

static int name_taken(const dear_registry_t *reg, const char *name)
{
    for (int i = 0; i < reg->ntensors; i++)
        if (strcmp(reg->tensors[i].name, name) == 0)
            return 1;
    return 0;
}

/* The registered tensor whose gradient (or, with params, whose parameters) shares a byte with
 * [p, p + bytes), or NULL. */
static const dear_tensor_t *overlapping(const dear_registry_t *reg, const void *p, size_t bytes, int params)
{
    uintptr_t a0 = (uintptr_t)p, a1 = a0 + bytes;
    for (int i = 0; i < reg->ntensors; i++) {
        const dear_tensor_t *t = &reg->tensors[i];
        uintptr_t b0 = (uintptr_t)(params ? t->param : t->grad), b1 = b0 + t->bytes;
        if (b0 != 0 && a0 < b1 && b0 < a1)
            return t;
    }
    return NULL;
}

/* Room for one more element in a growing array (*arr of *cap, n used): doubled when full, from
 * first. The array pointer is passed as void ** through its address. */
static int room_for(void *arr, int n, int *cap, size_t elem, int first)
{
    if (n < *cap)
        return DEAR_OK;
    void **pa = arr, *p;
    int c = *cap ? 2 * *cap : first;
    DEAR_ALLOC_CHECK(p, realloc(*pa, elem * (size_t)c), elem * (size_t)c);
    *pa = p;
    *cap = c;
    return DEAR_OK;
}

static int register_claimed(dear_ctx_t *ctx, const char *name, int layer, void *grad, size_t count,
                            dear_dtype_t dtype, dear_mem_t mem, dear_update_fn update, void *arg)
{
    int rc = DEAR_OK;
    DEAR_ARG_CHECK(ctx != NULL, "dear_register: ctx is NULL");
    if (ctx->committed) {
        DEAR_ERROR("api", "dear_register('%s'): the context is already committed; register every "
                          "tensor before dear_commit",
                   name ? name : "(null)");
        return DEAR_ERR_STATE;
    }
    DEAR_ARG_CHECK(name != NULL && name[0] != '\0', "dear_register: name is NULL or empty");
    DEAR_ARG_CHECK(strlen(name) <= DEAR_NAME_MAX,
                   "dear_register: name '%.40s...' has %zu characters, at most %d are accepted", name,
                   strlen(name), DEAR_NAME_MAX);
    DEAR_ARG_CHECK(!name_taken(&ctx->reg, name), "dear_register('%s'): a tensor of that name is already registered",
                   name);
    DEAR_CHECK(dear_rt_mem_kind_valid("dear_register", name, mem));
    DEAR_ARG_CHECK((unsigned)dtype < DEAR_DTYPE_COUNT, "dear_register('%s'): dtype %d unknown; accepted: "
                   "DEAR_FLOAT32, DEAR_FLOAT64, DEAR_BFLOAT16, DEAR_FLOAT16", name, (int)dtype);
    DEAR_ARG_CHECK(dtype != DEAR_INT32, "dear_register('%s'): int32 gradients cannot be averaged; "
                   "accepted: DEAR_FLOAT32, DEAR_FLOAT64, DEAR_BFLOAT16, DEAR_FLOAT16", name);
    /* An empty tensor would make an empty bucket, which the collectives and the plan reject;
     * a caller with nothing to synchronise simply does not register it. */
    DEAR_ARG_CHECK(count > 0, "dear_register('%s'): count is 0; register only tensors with elements", name);
    DEAR_ARG_CHECK(grad != NULL, "dear_register('%s'): grad is NULL", name);
    size_t esize = dear_dtype_size(dtype);
    /* The byte count must fit a size_t and the buffer the address space, before anything uses it:
     * a wrapped product would pass the memory check on a few bytes, or fail it naming them. */
    DEAR_ARG_CHECK(count <= (SIZE_MAX - (uintptr_t)grad) / esize,
                   "dear_register('%s'): count %zu of %s is %s bytes, more than the address space holds", name, count,
                   dear_dtype_name(dtype), count <= SIZE_MAX / esize ? "that many" : "an overflowing number of");
    DEAR_CHECK(dear_rt_mem_check("dear_register", name, "grad", grad, count * esize, mem));
    const dear_tensor_t *o = overlapping(&ctx->reg, grad, count * esize, 0);
    DEAR_ARG_CHECK(o == NULL,
                   "dear_register('%s'): its gradient [%p, +%zu bytes) overlaps that of tensor '%s' [%p, +%zu bytes); "
                   "every tensor needs a buffer of its own (it would be reduced and updated twice)",
                   name, grad, count * esize, o ? o->name : "", o ? o->grad : NULL, o ? o->bytes : (size_t)0);
    o = overlapping(&ctx->reg, grad, count * esize, 1);
    DEAR_ARG_CHECK(o == NULL, "dear_register('%s'): its gradient [%p, +%zu bytes) overlaps the parameters of tensor "
                   "'%s' (dear_set_param); gradients and parameters need buffers of their own",
                   name, grad, count * esize, o ? o->name : "");
    if (ctx->reg.ntensors > 0 && layer < ctx->reg.tensors[ctx->reg.ntensors - 1].layer) {
        DEAR_ERROR("api", "dear_register('%s'): layer %d after layer %d; register tensors in forward "
                          "order with non-decreasing layer ids",
                   name, layer, ctx->reg.tensors[ctx->reg.ntensors - 1].layer);
        return DEAR_ERR_ARG;
    }
    DEAR_CHECK_GOTO(room_for(&ctx->reg.tensors, ctx->reg.ntensors, &ctx->reg.tensors_cap, sizeof *ctx->reg.tensors, 64),
                    rc, err);
    dear_tensor_t *t = &ctx->reg.tensors[ctx->reg.ntensors];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->layer = layer;
    t->grad = grad;
    t->count = count;
    t->dtype = dtype;
    t->bytes = count * esize;
    t->mem = mem;
    t->nograd_iter = -1;
    t->update = update;
    t->arg = arg;
    ctx->reg.ntensors++;
    return DEAR_OK;
err:
    return rc;
}

int dear_register(dear_ctx_t *ctx, const char *name, int layer, void *grad, size_t count,
                  dear_dtype_t dtype, dear_mem_t mem, dear_update_fn update, void *arg)
{
    DEAR_CLAIMED(ctx, "dear_register", register_claimed(ctx, name, layer, grad, count, dtype, mem, update, arg));
}

void dear_registry_free_layers(dear_registry_t *reg)
{
    free(reg->layers);
    reg->layers = NULL;
    reg->nlayers = 0;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int dear_registry_build_layers(dear_registry_t *reg)
{
    int rc = DEAR_OK, cap = reg->ntensors + reg->ndeclared, n = 0;
    int *ids = NULL;
    /* The layer ids: the tensors' (non-decreasing) merged with the declared ones, each once. */
    DEAR_ALLOC_GOTO(ids, malloc(sizeof *ids * (size_t)(cap ? cap : 1)), sizeof *ids * (size_t)(cap ? cap : 1), rc, err);
    for (int i = 0; i < reg->ntensors; i++)
        ids[n++] = reg->tensors[i].layer;
    for (int i = 0; i < reg->ndeclared; i++)
        ids[n++] = reg->declared[i];
    qsort(ids, (size_t)n, sizeof *ids, cmp_int);
    int nl = 0;
    for (int i = 0; i < n; i++)
        if (i == 0 || ids[i] != ids[i - 1])
            ids[nl++] = ids[i];
    size_t lb = sizeof *reg->layers * (size_t)(nl ? nl : 1);
    DEAR_ALLOC_GOTO(reg->layers, calloc((size_t)(nl ? nl : 1), sizeof *reg->layers), lb, rc, err);
    reg->nlayers = nl;
    /* Each layer holds the tensors [t0, t1) of its id; a layer without parameters holds none, at
     * the place its id sorts to, so tensor ranges stay in layer order. */
    int t = 0;
    for (int l = 0; l < nl; l++) {
        dear_layer_t *L = &reg->layers[l];
        L->id = ids[l];
        L->bwd_iter = -1;
        L->flops = -1;
        L->t0 = t;
        while (t < reg->ntensors && reg->tensors[t].layer == L->id)
            reg->tensors[t++].lidx = l;
        L->t1 = t;
    }
    /* The hints, in call order: a later one for the same layer replaces an earlier one. */
    for (int h = 0; h < reg->nhints; h++) {
        int lo = 0, hi = nl - 1;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (reg->layers[mid].id < reg->hints[h].layer)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (nl > 0 && reg->layers[lo].id == reg->hints[h].layer)
            reg->layers[lo].flops = reg->hints[h].flops;
    }
err:
    free(ids);
    return rc;
}

static int register_layer_claimed(dear_ctx_t *ctx, int layer)
{
    int rc = DEAR_OK;
    DEAR_ARG_CHECK(ctx != NULL, "dear_register_layer: ctx is NULL");
    if (ctx->committed) {
        DEAR_ERROR("api", "dear_register_layer(%d): the context is already committed; declare every layer before "
                          "dear_commit",
                   layer);
        return DEAR_ERR_STATE;
    }
    DEAR_CHECK_GOTO(room_for(&ctx->reg.declared, ctx->reg.ndeclared, &ctx->reg.declared_cap, sizeof *ctx->reg.declared,
                             16),
                    rc, err);
    ctx->reg.declared[ctx->reg.ndeclared++] = layer;
    return DEAR_OK;
err:
    return rc;
}

int dear_register_layer(dear_ctx_t *ctx, int layer)
{
    DEAR_CLAIMED(ctx, "dear_register_layer", register_layer_claimed(ctx, layer));
}

/* Before commit: whether some tensor or dear_register_layer has named this layer id. */
static int layer_known(const dear_registry_t *reg, int layer)
{
    for (int t = 0; t < reg->ntensors; t++)
        if (reg->tensors[t].layer == layer)
            return 1;
    for (int i = 0; i < reg->ndeclared; i++)
        if (reg->declared[i] == layer)
            return 1;
    return 0;
}

static int set_layer_cost_claimed(dear_ctx_t *ctx, int layer, double flops)
{
    int rc = DEAR_OK;
    DEAR_ARG_CHECK(ctx != NULL, "dear_set_layer_cost: ctx is NULL");
    DEAR_ARG_CHECK(isfinite(flops) && flops >= 0,
                   "dear_set_layer_cost(layer %d, %g): the hint must be a finite number >= 0 (the layer's forward "
                   "FLOPs, or any one unit proportional to them for every layer)",
                   layer, flops);
    if (ctx->committed) {
        int l = dear_layer_index(&ctx->reg, layer);
        DEAR_ARG_CHECK(l >= 0, "dear_set_layer_cost(layer %d): unknown layer id; the registered layers have ids "
                               "%d..%d (%d layers)",
                       layer, ctx->reg.layers[0].id, ctx->reg.layers[ctx->reg.nlayers - 1].id, ctx->reg.nlayers);
        if (ctx->it.in_backward) {
            DEAR_ERROR("api", "dear_set_layer_cost(layer %d): called during the backward pass of iteration %lld; "
                              "call it between iterations",
                       layer, ctx->it.iter);
            return DEAR_ERR_STATE;
        }
        ctx->reg.layers[l].flops = flops;
        return DEAR_OK;
    }
    DEAR_ARG_CHECK(layer_known(&ctx->reg, layer),
                   "dear_set_layer_cost(layer %d): no tensor registered in this layer and no dear_register_layer "
                   "for it; register the layer first",
                   layer);
    DEAR_CHECK_GOTO(room_for(&ctx->reg.hints, ctx->reg.nhints, &ctx->reg.hints_cap, sizeof *ctx->reg.hints, 16), rc,
                    err);
    ctx->reg.hints[ctx->reg.nhints++] = (dear_layer_hint_t){ layer, flops };
    return DEAR_OK;
err:
    return rc;
}

int dear_set_layer_cost(dear_ctx_t *ctx, int layer, double flops)
{
    DEAR_CLAIMED(ctx, "dear_set_layer_cost", set_layer_cost_claimed(ctx, layer, flops));
}

/* ---- the same tensors on every rank ---- */

typedef struct {
    char name[DEAR_NAME_MAX + 1];
    int64_t layer;
    int64_t count;
    int64_t dtype;
    int64_t frozen;
    int64_t sparse_block;
    int64_t mem;
} wire_tensor_t;

static void wire_fill(const dear_registry_t *reg, int i, wire_tensor_t *w)
{
    memset(w, 0, sizeof *w);
    if (i < 0 || i >= reg->ntensors) {
        w->dtype = -1; /* marks "no tensor at this index" */
        return;
    }
    memcpy(w->name, reg->tensors[i].name, sizeof w->name);
    w->layer = reg->tensors[i].layer;
    w->count = (int64_t)reg->tensors[i].count;
    w->dtype = reg->tensors[i].dtype;
    w->frozen = reg->tensors[i].frozen;
    w->sparse_block = (int64_t)reg->tensors[i].sparse_block;
    w->mem = reg->tensors[i].mem;
}

static void wire_describe(const wire_tensor_t *w, char *buf, size_t len)
{
    if (w->dtype < 0)
        snprintf(buf, len, "no tensor");
    else
        snprintf(buf, len, "'%s' (layer %lld, %lld x %s)", w->name, (long long)w->layer, (long long)w->count,
                 dear_dtype_name((dear_dtype_t)w->dtype));
}

/* First field where a and b differ, with both values as text; NULL if equal. */
static const char *wire_diff(const wire_tensor_t *a, const wire_tensor_t *b, char *va, char *vb, size_t len)
{
    if ((a->dtype < 0) != (b->dtype < 0)) {
        wire_describe(a, va, len);
        wire_describe(b, vb, len);
        return "presence";
    }
    if (a->dtype < 0)
        return NULL;
    if (strncmp(a->name, b->name, sizeof a->name) != 0) {
        snprintf(va, len, "'%s'", a->name);
        snprintf(vb, len, "'%s'", b->name);
        return "name";
    }
    if (a->layer != b->layer) {
        snprintf(va, len, "%lld", (long long)a->layer);
        snprintf(vb, len, "%lld", (long long)b->layer);
        return "layer";
    }
    if (a->count != b->count) {
        snprintf(va, len, "%lld", (long long)a->count);
        snprintf(vb, len, "%lld", (long long)b->count);
        return "count";
    }
    if (a->dtype != b->dtype) {
        snprintf(va, len, "%s", dear_dtype_name((dear_dtype_t)a->dtype));
        snprintf(vb, len, "%s", dear_dtype_name((dear_dtype_t)b->dtype));
        return "dtype";
    }
    if (a->frozen != b->frozen) {
        snprintf(va, len, "%s", a->frozen ? "frozen" : "not frozen");
        snprintf(vb, len, "%s", b->frozen ? "frozen" : "not frozen");
        return "frozen (dear_freeze)";
    }
    if (a->mem != b->mem) {
        snprintf(va, len, "%s", dear_rt_mem_kind_name(a->mem));
        snprintf(vb, len, "%s", dear_rt_mem_kind_name(b->mem));
        return "memory kind";
    }
    if (a->sparse_block != b->sparse_block) {
        snprintf(va, len, "%lld", (long long)a->sparse_block);
        snprintf(vb, len, "%lld", (long long)b->sparse_block);
        return "sparse block (dear_register_sparse; 0: dense)";
    }
    return NULL;
}

/* Rank 0's table goes to everyone (its size first, so a rank with a different count never
 * waits for data that is not coming); each rank finds its first difference; one MIN
 * all-reduce agrees on the first differing index; an all-gather tells who differs there and
 * the lowest such rank broadcasts its entry, so every rank prints the same message. */
int dear_registry_check(const dear_rt_comm_t *cm, dear_registry_t *reg)
{
    int rc = DEAR_OK;
    long long n0 = reg->ntensors;
    wire_tensor_t *table = NULL, mine, theirs;
    int *differs = NULL;
    char va[160], vb[160], ranks[256];

    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&n0, 1, MPI_LONG_LONG, 0, cm->comm), rc, out);
    size_t bytes = sizeof *table * (size_t)(n0 > 0 ? n0 : 1);
    DEAR_ALLOC_GOTO(table, malloc(bytes), bytes, rc, out);
    if (cm->rank == 0)
        for (int i = 0; i < n0; i++)
            wire_fill(reg, i, &table[i]);
    if (n0 > 0)
        DEAR_MPI_CHECK_GOTO(MPI_Bcast(table, (int)(n0 * (long long)sizeof *table), MPI_BYTE, 0, cm->comm), rc, out);

    int first = INT_MAX;
    long long upto = n0 < reg->ntensors ? n0 : reg->ntensors;
    for (int i = 0; i < upto && first == INT_MAX; i++) {
        wire_fill(reg, i, &mine);
        if (wire_diff(&table[i], &mine, va, vb, sizeof va))
            first = i;
    }
    if (first == INT_MAX && n0 != reg->ntensors)
        first = (int)upto;
    int agreed = INT_MAX;
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&first, &agreed, 1, MPI_INT, MPI_MIN, cm->comm), rc, out);
    if (agreed == INT_MAX)
        goto out;

    /* Everyone compares its own entry at the agreed index with rank 0's. */
    wire_tensor_t ref;
    if (agreed < n0)
        ref = table[agreed];
    else
        wire_fill(reg, -1, &ref);
    wire_fill(reg, agreed, &mine);
    int me_differs = wire_diff(&ref, &mine, va, vb, sizeof va) != NULL;
    DEAR_ALLOC_GOTO(differs, malloc(sizeof *differs * (size_t)cm->size), sizeof *differs * (size_t)cm->size, rc,
                    out);
    DEAR_MPI_CHECK_GOTO(MPI_Allgather(&me_differs, 1, MPI_INT, differs, 1, MPI_INT, cm->comm), rc, out);
    int witness = -1;
    size_t used = 0;
    ranks[0] = '\0';
    for (int r = 0; r < cm->size; r++) {
        if (!differs[r])
            continue;
        if (witness < 0)
            witness = r;
        if (used + 16 < sizeof ranks)
            used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", used ? "," : "", r);
        else if (used + 4 < sizeof ranks && ranks[used - 1] != '.')
            used += (size_t)snprintf(ranks + used, sizeof ranks - used, "...");
    }
    if (witness < 0) {
        DEAR_ERROR("commit", "dear_commit: ranks disagree on the first differing tensor index %d but none "
                             "reports a difference there",
                   agreed);
        rc = DEAR_ERR_INTERNAL;
        goto out;
    }
    theirs = mine;
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&theirs, (int)sizeof theirs, MPI_BYTE, witness, cm->comm), rc, out);
    const char *field = wire_diff(&ref, &theirs, va, vb, sizeof va);
    if (field && strcmp(field, "presence") == 0) {
        DEAR_ERROR("commit", "dear_commit: registered tensors differ across ranks at tensor index %d: rank 0 "
                             "registered %lld tensor(s) and has %s there, rank %d has %s; ranks differing from "
                             "rank 0 there: %s",
                   agreed, n0, va, witness, vb, ranks);
    } else {
        char desc[160];
        wire_describe(&ref, desc, sizeof desc);
        DEAR_ERROR("commit", "dear_commit: registered tensors differ across ranks at tensor index %d (rank 0: "
                             "%s): field %s is %s on rank 0 but %s on rank %d; ranks differing from rank 0 "
                             "there: %s",
                   agreed, desc, field ? field : "?", va, vb, witness, ranks);
    }
    rc = DEAR_ERR_MISMATCH;
out:
    free(table);
    free(differs);
    return rc;
}

int dear_tensor_table(const dear_ctx_t *ctx, dear_tensor_desc_t **desc, const char ***names)
{
    const dear_registry_t *reg = &ctx->reg;
    int rc = DEAR_OK, n = reg->ntensors;
    size_t nd = sizeof **desc * (size_t)(n ? n : 1), nn = sizeof **names * (size_t)(n ? n : 1);
    *desc = NULL;
    *names = NULL;
    DEAR_ALLOC_GOTO(*desc, malloc(nd), nd, rc, err);
    DEAR_ALLOC_GOTO(*names, malloc(nn), nn, rc, err);
    for (int i = 0; i < n; i++) {
        const dear_tensor_t *t = &reg->tensors[i];
        size_t esz = dear_dtype_size(t->dtype);
        (*desc)[i] = (dear_tensor_desc_t){ .bytes = t->bytes, .layer = t->layer, .elem_bytes = esz,
                                           .row_bytes = dear_tensor_block(ctx, i) * esz };
        (*names)[i] = t->name;
    }
    return DEAR_OK;
err:
    free(*desc);
    *desc = NULL;
    return rc;
}

/* Rank 0's layer ids go to everyone (their count first); one MIN all-reduce agrees on the first
 * index where some rank differs, and that rank's id there is broadcast, so every rank prints the
 * same message. Tensors were checked already: only declared layers can differ here. */
int dear_registry_check_layers(const dear_rt_comm_t *cm, const dear_registry_t *reg)
{
    int rc = DEAR_OK, n0 = reg->nlayers;
    int *ids = NULL;
    DEAR_MPI_CHECK(MPI_Bcast(&n0, 1, MPI_INT, 0, cm->comm));
    DEAR_ALLOC_GOTO(ids, malloc(sizeof *ids * (size_t)(n0 > 0 ? n0 : 1)), sizeof *ids * (size_t)(n0 > 0 ? n0 : 1),
                    rc, out);
    for (int l = 0; cm->rank == 0 && l < n0; l++)
        ids[l] = reg->layers[l].id;
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(ids, n0, MPI_INT, 0, cm->comm), rc, out);
    int mine = INT_MAX, first = INT_MAX, upto = n0 < reg->nlayers ? n0 : reg->nlayers;
    for (int l = 0; l < upto && mine == INT_MAX; l++)
        if (ids[l] != reg->layers[l].id)
            mine = l;
    if (mine == INT_MAX && n0 != reg->nlayers)
        mine = upto;
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, cm->comm), rc, out);
    if (first == INT_MAX)
        goto out;
    /* The lowest rank that differs there says what it has (INT_MIN: no layer). */
    int who[2] = { mine == first ? cm->rank : INT_MAX, 0 }, lowest = 0;
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&who[0], &lowest, 1, MPI_INT, MPI_MIN, cm->comm), rc, out);
    int theirs = first < reg->nlayers ? reg->layers[first].id : INT_MIN;
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&theirs, 1, MPI_INT, lowest, cm->comm), rc, out);
    char a[32], b[32];
    if (first < n0)
        snprintf(a, sizeof a, "layer %d", ids[first]);
    else
        snprintf(a, sizeof a, "no layer");
    if (theirs != INT_MIN)
        snprintf(b, sizeof b, "layer %d", theirs);
    else
        snprintf(b, sizeof b, "no layer");
    DEAR_ERROR("commit", "dear_commit: the layers differ across ranks at layer index %d: rank 0 has %s (of %d), rank %d "
                         "has %s; declare the same layers (dear_register_layer) on every rank",
               first, a, n0, lowest, b);
    rc = DEAR_ERR_MISMATCH;
out:
    free(ids);
    return rc;
}

static int set_param_claimed(dear_ctx_t *ctx, int tensor, void *param)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_set_param: ctx is NULL");
    if (ctx->committed) {
        DEAR_ERROR("api", "dear_set_param(tensor %d): the context is already committed; give the parameters before "
                          "dear_commit",
                   tensor);
        return DEAR_ERR_STATE;
    }
    DEAR_ARG_CHECK(tensor >= 0 && tensor < ctx->reg.ntensors,
                   "dear_set_param: tensor %d unknown; %d tensor(s) registered (indices from dear_tensor_index)", tensor,
                   ctx->reg.ntensors);
    dear_tensor_t *t = &ctx->reg.tensors[tensor];
    DEAR_ARG_CHECK(param != NULL, "dear_set_param('%s'): param is NULL", t->name);
    DEAR_ARG_CHECK((uintptr_t)param <= UINTPTR_MAX - t->bytes,
                   "dear_set_param('%s'): %zu bytes at %p run past the address space", t->name, t->bytes, param);
    DEAR_CHECK(dear_rt_mem_check("dear_set_param", t->name, "param", param, t->bytes, t->mem));
    const dear_tensor_t *o = overlapping(&ctx->reg, param, t->bytes, 0);
    DEAR_ARG_CHECK(o == NULL, "dear_set_param('%s'): the parameters [%p, +%zu bytes) overlap the gradient of tensor "
                   "'%s'; gradients and parameters need buffers of their own",
                   t->name, param, t->bytes, o ? o->name : "");
    void *old = t->param;
    t->param = NULL; /* a second call replaces the first */
    o = overlapping(&ctx->reg, param, t->bytes, 1);
    if (o != NULL) {
        t->param = old;
        DEAR_ERROR("api", "dear_set_param('%s'): the parameters [%p, +%zu bytes) overlap those of tensor '%s'; every "
                          "tensor needs parameters of its own",
                   t->name, param, t->bytes, o->name);
        return DEAR_ERR_ARG;
    }
    t->param = param;
    return DEAR_OK;
}

int dear_set_param(dear_ctx_t *ctx, int tensor, void *param)
{
    DEAR_CLAIMED(ctx, "dear_set_param", set_param_claimed(ctx, tensor, param));
}
