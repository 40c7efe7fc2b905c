/* Units: the cut of tensors into chunks, its check against the tensors, and the unit profile. */
#include "fusion/units.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "include/dear_types.h"

/* A tensor's cut alignment: its row when sparse, else DEAR_UNIT_ALIGN. */
static size_t cut_align(const dear_tensor_desc_t *t)
{
    return t->row_bytes > 0 ? t->row_bytes : DEAR_UNIT_ALIGN;
}

/* Chunks of tensor t at partition bytes: 1 when it stays whole. */
static size_t chunks_of(const dear_tensor_desc_t *t, size_t partition)
{
    if (partition == 0 || t->bytes <= partition)
        return 1;
    size_t k = t->bytes / partition + (t->bytes % partition != 0), most = t->bytes / cut_align(t);
    return k < most ? k : most > 0 ? most : 1;
}

/* floor(i * bytes / k) rounded down to a multiple of align, without overflow (i < k). */
static size_t cut_at(size_t bytes, size_t k, size_t i, size_t align)
{
    size_t x = (bytes / k) * i + ((bytes % k) * i) / k;
    return x / align * align;
}

int dear_units_cut(int ntensors, const dear_tensor_desc_t *tensors, size_t partition, dear_unit_t **units,
                   int *nunits)
{
    if (ntensors < 0 || (ntensors > 0 && !tensors) || !units || !nunits)
        return DEAR_ERR_ARG;
    size_t total = 0;
    int cut = 0;
    for (int t = 0; t < ntensors; t++) {
        size_t k = chunks_of(&tensors[t], partition);
        cut |= k > 1;
        total += k;
        if (total > (size_t)DEAR_UNITS_MAX) {
            DEAR_ERROR("plan", "partition size %zu bytes cuts the tensors into more than %d units; choose a larger "
                       "one (DEAR_PARTITION, --partition) or 0 to leave every tensor whole", partition, DEAR_UNITS_MAX);
            return DEAR_ERR_ARG;
        }
    }
    *units = NULL;
    *nunits = ntensors;
    if (!cut)
        return DEAR_OK;
    dear_unit_t *u = malloc(sizeof *u * total);
    if (!u)
        return DEAR_ERR_NOMEM;
    size_t n = 0;
    for (int t = 0; t < ntensors; t++) {
        const dear_tensor_desc_t *d = &tensors[t];
        size_t k = chunks_of(d, partition), align = cut_align(d);
        if (k == 1) {
            u[n++] = (dear_unit_t){ .tensor = t };
            continue;
        }
        for (size_t i = 0; i < k; i++) {
            size_t lo = cut_at(d->bytes, k, i, align), hi = i + 1 < k ? cut_at(d->bytes, k, i + 1, align) : d->bytes;
            u[n++] = (dear_unit_t){ .tensor = t, .offset = lo, .bytes = hi - lo };
        }
    }
    *units = u;
    *nunits = (int)n;
    return DEAR_OK;
}

int dear_units_check(int ntensors, const dear_tensor_desc_t *tensors, int nunits, const dear_unit_t *units,
                     char *msg, size_t msglen)
{
    for (int i = 0; units && i < nunits; i++) {
        const dear_unit_t *u = &units[i];
        if (u->bytes == 0)
            continue;
        if (u->tensor < 0 || u->tensor >= ntensors) {
            snprintf(msg, msglen, "unit %d belongs to tensor %d; %d tensor(s) are registered", i, u->tensor, ntensors);
            return DEAR_ERR_MISMATCH;
        }
        const dear_tensor_desc_t *t = &tensors[u->tensor];
        size_t end = u->offset + u->bytes;
        int last = i + 1 == nunits || units[i + 1].tensor != u->tensor;
        if (end < u->offset || end > t->bytes || (last && end != t->bytes)) {
            snprintf(msg, msglen, "tensor %d has %zu bytes, its chunk %d ends at byte %zu%s", u->tensor, t->bytes, i,
                     end, end > t->bytes || end < u->offset ? ", outside it" : " (its last chunk must end at its end)");
            return DEAR_ERR_MISMATCH;
        }
        if (t->elem_bytes > 0 && u->offset % t->elem_bytes != 0) {
            snprintf(msg, msglen, "tensor %d is cut at byte %zu, inside an element of %zu bytes", u->tensor, u->offset,
                     t->elem_bytes);
            return DEAR_ERR_MISMATCH;
        }
        if (t->row_bytes > 0 && u->offset % t->row_bytes != 0) {
            snprintf(msg, msglen, "sparse tensor %d is cut at byte %zu, inside a row of %zu bytes", u->tensor,
                     u->offset, t->row_bytes);
            return DEAR_ERR_MISMATCH;
        }
    }
    return DEAR_OK;
}

/* The chunks of unit i's tensor and unit i's place among them (0 of 1 when whole). */
static void chunk_place(const dear_unit_t *units, int nunits, int i, int *chunk, int *nchunks)
{
    if (!units || units[i].bytes == 0) {
        *chunk = 0;
        *nchunks = 1;
        return;
    }
    int lo = i, hi = i;
    while (lo > 0 && units[lo - 1].tensor == units[i].tensor)
        lo--;
    while (hi + 1 < nunits && units[hi + 1].tensor == units[i].tensor)
        hi++;
    *chunk = i - lo;
    *nchunks = hi - lo + 1;
}

int dear_units_descs(int ntensors, const dear_tensor_desc_t *tensors, int nunits, const dear_unit_t *units,
                     dear_tensor_desc_t **out)
{
    if (!units && nunits != ntensors)
        return DEAR_ERR_ARG;
    dear_tensor_desc_t *d = malloc(sizeof *d * (size_t)(nunits > 0 ? nunits : 1));
    if (!d)
        return DEAR_ERR_NOMEM;
    for (int i = 0; i < nunits; i++) {
        int t = units ? units[i].tensor : i;
        d[i] = tensors[t];
        if (units && units[i].bytes > 0)
            d[i].bytes = units[i].bytes;
        chunk_place(units, nunits, i, &d[i].chunk, &d[i].nchunks);
    }
    *out = d;
    return DEAR_OK;
}

int dear_prof_units(const dear_profile_t *prof, int nunits, const dear_unit_t *units, dear_profile_t *out)
{
    if (!prof || !out || (!units && nunits != prof->ntensors))
        return DEAR_ERR_ARG;
    dear_profile_t p;
    dear_prof_init(&p, prof->model);
    int rc = DEAR_OK;
    p.no_times = prof->no_times;
    for (int l = 0; l < prof->nlayers && rc == DEAR_OK; l++) {
        rc = dear_prof_add_layer(&p, prof->layers[l].id, prof->layers[l].fwd_s, prof->layers[l].bwd_s);
        if (rc == DEAR_OK)
            dear_prof_set_flops(&p, prof->layers[l].flops);
    }
    for (int i = 0; i < nunits && rc == DEAR_OK; i++) {
        int t = units ? units[i].tensor : i;
        if (t < 0 || t >= prof->ntensors) {
            rc = DEAR_ERR_ARG;
            break;
        }
        const dear_prof_tensor_t *pt = &prof->tensors[t];
        size_t bytes = pt->bytes;
        int priced_down = 0;
        if (units && units[i].bytes > 0) {
            /* What the cut tensor's chunks add up to: its last chunk's end. */
            int last = i;
            while (last + 1 < nunits && units[last + 1].tensor == t)
                last++;
            priced_down = pt->bytes != units[last].offset + units[last].bytes;
            bytes = priced_down ? 1 : units[i].bytes;
        }
        rc = dear_prof_add_tensor(&p, pt->name, pt->layer, bytes);
        if (rc != DEAR_OK)
            break;
        dear_prof_tensor_t *q = &p.tensors[p.ntensors - 1];
        q->block_bytes = priced_down ? 0 : pt->block_bytes;
        q->density_rs = pt->density_rs;
        q->density_ag = pt->density_ag;
        q->compress_rs = pt->compress_rs;
        q->compress_ag = pt->compress_ag;
        /* A chunk's step is its share of the tensor's. */
        q->step_s = units && units[i].bytes > 0 && pt->bytes > 0 ? pt->step_s * (double)units[i].bytes / (double)pt->bytes
                                                                 : pt->step_s;
        chunk_place(units, nunits, i, &q->chunk, &q->nchunks);
    }
    char msg[256];
    if (rc == DEAR_OK && dear_prof_check(&p, msg, sizeof msg) != DEAR_OK) {
        DEAR_ERROR("plan", "the profile of the units is rejected: %s", msg);
        rc = DEAR_ERR_FORMAT;
    }
    if (rc != DEAR_OK) {
        dear_prof_free(&p);
        return rc;
    }
    dear_prof_free(out);
    *out = p;
    return DEAR_OK;
}

int dear_prof_cut(const dear_profile_t *prof, size_t partition, dear_unit_t **units, int *nunits,
                  dear_profile_t *out)
{
    dear_tensor_desc_t *descs = NULL;
    dear_unit_t *u = NULL;
    int n = 0, rc = dear_prof_descs(prof, &descs);
    if (rc == DEAR_OK)
        rc = dear_units_cut(prof->ntensors, descs, partition, &u, &n);
    if (rc == DEAR_OK)
        rc = dear_prof_units(prof, n, u, out);
    free(descs);
    if (rc != DEAR_OK) {
        free(u);
        return rc;
    }
    *units = u;
    *nunits = n;
    return DEAR_OK;
}
