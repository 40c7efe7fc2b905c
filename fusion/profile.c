/* Profiles: builder, checks and the text format of docs/FORMATS.md. A load error names the file
 * and line, and a file cut short is caught by its closing 'end NLAYERS NTENSORS' line. */
#include "fusion/profile.h"

#include "base/util.h"
#include "base/fileio.h"
#include "base/textio.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "include/dear_types.h"
#include "base/log.h"

#define PROF_MAGIC "dear-profile 1"
#define MODEL_MAGIC "dear-model 1"

void dear_prof_init(dear_profile_t *prof, const char *model)
{
    memset(prof, 0, sizeof *prof);
    snprintf(prof->model, sizeof prof->model, "%s", model ? model : "");
}

void dear_prof_free(dear_profile_t *prof)
{
    if (!prof)
        return;
    free(prof->layers);
    free(prof->tensors);
    memset(prof, 0, sizeof *prof);
}

int dear_prof_copy(const dear_profile_t *src, dear_profile_t *out)
{
    dear_profile_t p = *src;
    size_t lb = sizeof *p.layers * (size_t)(src->nlayers > 0 ? src->nlayers : 1);
    size_t tb = sizeof *p.tensors * (size_t)(src->ntensors > 0 ? src->ntensors : 1);
    p.layers = malloc(lb);
    p.tensors = malloc(tb);
    if (!p.layers || !p.tensors) {
        free(p.layers);
        free(p.tensors);
        return DEAR_ERR_NOMEM;
    }
    if (src->nlayers > 0)
        memcpy(p.layers, src->layers, sizeof *p.layers * (size_t)src->nlayers);
    if (src->ntensors > 0)
        memcpy(p.tensors, src->tensors, sizeof *p.tensors * (size_t)src->ntensors);
    p.cap_layers = src->nlayers > 0 ? src->nlayers : 1;
    p.cap_tensors = src->ntensors > 0 ? src->ntensors : 1;
    dear_prof_free(out);
    *out = p;
    return DEAR_OK;
}

int dear_prof_add_layer(dear_profile_t *prof, int id, double fwd_s, double bwd_s)
{
    if (prof->nlayers == prof->cap_layers) {
        int cap = prof->cap_layers ? 2 * prof->cap_layers : 64;
        dear_prof_layer_t *l = realloc(prof->layers, sizeof *l * (size_t)cap);
        if (!l)
            return DEAR_ERR_NOMEM;
        prof->layers = l;
        prof->cap_layers = cap;
    }
    prof->layers[prof->nlayers++] = (dear_prof_layer_t){ .id = id, .fwd_s = fwd_s, .bwd_s = bwd_s, .flops = -1 };
    return DEAR_OK;
}

void dear_prof_set_flops(dear_profile_t *prof, double flops)
{
    prof->layers[prof->nlayers - 1].flops = flops;
}

int dear_prof_add_tensor(dear_profile_t *prof, const char *name, int layer, size_t bytes)
{
    if (!name || strlen(name) >= DEAR_PROF_NAME_MAX)
        return DEAR_ERR_ARG;
    if (prof->ntensors == prof->cap_tensors) {
        int cap = prof->cap_tensors ? 2 * prof->cap_tensors : 64;
        dear_prof_tensor_t *t = realloc(prof->tensors, sizeof *t * (size_t)cap);
        if (!t)
            return DEAR_ERR_NOMEM;
        prof->tensors = t;
        prof->cap_tensors = cap;
    }
    dear_prof_tensor_t *t = &prof->tensors[prof->ntensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->layer = layer;
    t->lidx = -1;
    t->bytes = bytes;
    return DEAR_OK;
}

void dear_prof_set_sparse(dear_profile_t *prof, size_t block_bytes, double density_rs, double density_ag)
{
    dear_prof_tensor_t *t = &prof->tensors[prof->ntensors - 1];
    t->block_bytes = block_bytes;
    t->density_rs = density_rs;
    t->density_ag = density_ag;
}

void dear_prof_set_compress(dear_profile_t *prof, int t, dear_compress_t rs, dear_compress_t ag)
{
    for (int i = t < 0 ? 0 : t; i < (t < 0 ? prof->ntensors : t + 1); i++) {
        prof->tensors[i].compress_rs = rs;
        prof->tensors[i].compress_ag = ag;
    }
}

double dear_prof_wire_bytes(const dear_prof_tensor_t *t, dear_coll_op_t op)
{
    dear_compress_t c = op == DEAR_COLL_ALLGATHER ? t->compress_ag : t->compress_rs;
    double f = dear_compress_ratio(c);
    double dense = (double)t->bytes * f;
    if (t->block_bytes == 0)
        return dense;
    double d = op == DEAR_COLL_ALLGATHER ? t->density_ag : t->density_rs;
    /* Non-zero blocks' values in the format, each with its index; int8 packs each block on its
     * own, so a block has its own scales (one per 256 values, at least one). */
    double fs = f;
    if (c == DEAR_COMPRESS_INT8) {
        double vals = (double)t->block_bytes / sizeof(float);
        fs = 0.25 + (double)sizeof(float) * ceil(vals / DEAR_COMPRESS_INT8_BLOCK) / (double)t->block_bytes;
    }
    double wire = d * (double)t->bytes * (fs + (double)DEAR_PROF_SPARSE_IDX_BYTES / (double)t->block_bytes);
    return wire < dense ? wire : dense;
}

int dear_prof_check(dear_profile_t *prof, char *msg, size_t msglen)
{
    for (int l = 0; l < prof->nlayers; l++) {
        const dear_prof_layer_t *L = &prof->layers[l];
        if (l > 0 && L->id <= prof->layers[l - 1].id) {
            snprintf(msg, msglen, "layer ids must strictly increase: layer %d follows layer %d", L->id,
                     prof->layers[l - 1].id);
            return DEAR_ERR_FORMAT;
        }
        if (!(L->fwd_s >= 0) || !(L->bwd_s >= 0) || !isfinite(L->fwd_s) || !isfinite(L->bwd_s)) {
            snprintf(msg, msglen, "layer %d: times must be finite seconds >= 0 (forward %g, backward %g)", L->id,
                     L->fwd_s, L->bwd_s);
            return DEAR_ERR_FORMAT;
        }
        if (!isfinite(L->flops)) {
            snprintf(msg, msglen, "layer %d: compute hint %g must be finite (>= 0, or negative for none)", L->id,
                     L->flops);
            return DEAR_ERR_FORMAT;
        }
    }
    int li = 0;
    for (int i = 0; i < prof->ntensors; i++) {
        dear_prof_tensor_t *t = &prof->tensors[i];
        if (t->name[0] == '\0' || strpbrk(t->name, " \t\r\n#")) {
            snprintf(msg, msglen, "tensor %d: name '%s' must be non-empty, without blanks or '#'", i, t->name);
            return DEAR_ERR_FORMAT;
        }
        if (t->bytes == 0) {
            snprintf(msg, msglen, "tensor %s: size must be > 0 bytes", t->name);
            return DEAR_ERR_FORMAT;
        }
        if (t->block_bytes > 0 && (t->bytes % t->block_bytes != 0 || !(t->density_rs >= 0 && t->density_rs <= 1) ||
                                   !(t->density_ag >= 0 && t->density_ag <= 1))) {
            snprintf(msg, msglen, "tensor %s: sparse blocks of %zu bytes must divide its %zu bytes and the densities "
                     "(%g, %g) lie in [0, 1]", t->name, t->block_bytes, t->bytes, t->density_rs, t->density_ag);
            return DEAR_ERR_FORMAT;
        }
        while (li < prof->nlayers && prof->layers[li].id < t->layer)
            li++;
        if (li == prof->nlayers || prof->layers[li].id != t->layer) {
            int declared = 0;
            for (int l = 0; l < prof->nlayers; l++)
                declared |= prof->layers[l].id == t->layer;
            if (declared)
                snprintf(msg, msglen, "tensor %s: layer %d comes after a tensor of a later layer (tensors must be "
                         "in forward order)", t->name, t->layer);
            else
                snprintf(msg, msglen, "tensor %s: layer %d is not declared", t->name, t->layer);
            return DEAR_ERR_FORMAT;
        }
        t->lidx = li;
    }
    return DEAR_OK;
}

/* Bounds of a profile: short lines, a few records per layer and tensor; no layer takes an hour
 * and no model holds 2^48 bytes of gradients (the sums of sizes must not wrap). */
#define PROF_MAX_LINE 1024
#define PROF_MAX_BYTES ((size_t)64 << 20)
#define PROF_MAX_LAYER_S 3600.0
#define PROF_MAX_FLOPS 1e30
#define PROF_MAX_BYTES_TOTAL ((size_t)1 << 48)

int dear_prof_write(const dear_profile_t *prof, FILE *out)
{
    fprintf(out, "%s\n", prof->no_times ? MODEL_MAGIC : PROF_MAGIC);
    fprintf(out, "%s"
                 "# tensor NAME LAYER_ID BYTES      (forward order)\n"
                 "# sparse NAME BLOCK_BYTES RS_DENSITY AG_DENSITY   (after its tensor line)\n",
            prof->no_times ? "# layer ID [FLOPS]                (forward order; FLOPS: forward compute hint)\n"
                           : "# layer ID FORWARD_S BACKWARD_S   (forward order)\n");
    if (prof->model[0])
        fprintf(out, "model %s\n", prof->model);
    for (int l = 0; l < prof->nlayers; l++) {
        const dear_prof_layer_t *L = &prof->layers[l];
        if (!prof->no_times)
            fprintf(out, "layer %d %.9g %.9g\n", L->id, L->fwd_s, L->bwd_s);
        else if (L->flops >= 0)
            fprintf(out, "layer %d %.9g\n", L->id, L->flops);
        else
            fprintf(out, "layer %d\n", L->id);
    }
    for (int i = 0; i < prof->ntensors; i++) {
        const dear_prof_tensor_t *t = &prof->tensors[i];
        fprintf(out, "tensor %s %d %zu\n", t->name, t->layer, t->bytes);
        if (t->block_bytes > 0)
            fprintf(out, "sparse %s %zu %.9g %.9g\n", t->name, t->block_bytes, t->density_rs, t->density_ag);
    }
    fprintf(out, "end %d %d\n", prof->nlayers, prof->ntensors);
    return ferror(out) ? DEAR_ERR_IO : DEAR_OK;
}

int dear_prof_save(const dear_profile_t *prof, const char *path)
{
    dear_file_out_t out;
    int rc = dear_file_out_open(&out, path, "profile");
    if (rc != DEAR_OK)
        return rc;
    if (dear_prof_write(prof, out.f) != DEAR_OK) {
        DEAR_ERROR("profile", "error writing %s; the old file, if any, is left as it was", path);
        dear_file_out_abort(&out);
        return DEAR_ERR_IO;
    }
    return dear_file_out_commit(&out);
}

int dear_prof_load(const char *path, dear_profile_t *prof)
{
    if (!path || !prof)
        return DEAR_ERR_ARG;
    dear_lines_t lr;
    int rc = dear_lines_open(&lr, path, "profile", PROF_MAX_LINE, PROF_MAX_BYTES, 0);
    if (rc != DEAR_OK)
        return rc;
    dear_profile_t p;
    dear_prof_init(&p, "");
    char *buf;
    size_t total = 0;
    int lineno = 0, got, seen_magic = 0, seen_end = 0;
#define BAD(...)                                                                                   \
    do {                                                                                           \
        char m_[512];                                                                              \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                      \
        DEAR_ERROR("profile", "%s:%d: %s", path, lineno, m_);                                      \
        rc = DEAR_ERR_FORMAT;                                                                      \
        goto done;                                                                                 \
    } while (0)
    while ((got = dear_lines_next(&lr, &buf)) == 1) {
        lineno = lr.lineno;
        char *hash = strchr(buf, '#');
        if (hash)
            *hash = '\0';
        char *fld[6], *save = NULL;
        int nf = 0;
        for (char *tok = strtok_r(buf, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
            if (nf == 5)
                BAD("too many fields");
            fld[nf++] = tok;
        }
        if (nf == 0)
            continue;
        if (seen_end)
            BAD("'%s' after the 'end' line", fld[0]);
        if (!seen_magic) {
            if (nf != 2 || (strcmp(fld[0], "dear-profile") != 0 && strcmp(fld[0], "dear-model") != 0) ||
                strcmp(fld[1], "1") != 0)
                BAD("expected the header '%s' or '%s' (is this a dear profile or model description?)", PROF_MAGIC,
                    MODEL_MAGIC);
            p.no_times = strcmp(fld[0], "dear-model") == 0;
            seen_magic = 1;
        } else if (strcmp(fld[0], "model") == 0) {
            if (nf != 2 || strlen(fld[1]) >= sizeof p.model)
                BAD("expected 'model NAME' (one word, under %zu characters)", sizeof p.model);
            snprintf(p.model, sizeof p.model, "%s", fld[1]);
        } else if (strcmp(fld[0], "layer") == 0 && p.no_times) {
            int id;
            double flops = -1;
            if (nf < 2 || nf > 3 || dear_text_int(fld[1], &id) ||
                (nf == 3 && dear_text_double(fld[2], 0, PROF_MAX_FLOPS, &flops)))
                BAD("expected 'layer ID [FLOPS]' (a model description) with an integer id and a compute hint in "
                    "[0, %g]", PROF_MAX_FLOPS);
            if (p.ntensors > 0)
                BAD("layer %d after the first tensor: all layer lines come first", id);
            if (p.nlayers > 0 && id <= p.layers[p.nlayers - 1].id)
                BAD("layer id %d does not increase (previous layer %d)", id, p.layers[p.nlayers - 1].id);
            if (dear_prof_add_layer(&p, id, 0, 0) != DEAR_OK) {
                rc = DEAR_ERR_NOMEM;
                goto done;
            }
            dear_prof_set_flops(&p, flops);
        } else if (strcmp(fld[0], "layer") == 0) {
            int id;
            double fw, bw;
            if (nf != 4 || dear_text_int(fld[1], &id) || dear_text_double(fld[2], 0, PROF_MAX_LAYER_S, &fw) ||
                dear_text_double(fld[3], 0, PROF_MAX_LAYER_S, &bw))
                BAD("expected 'layer ID FORWARD_S BACKWARD_S' with an integer id and times in [0, %g] seconds",
                    PROF_MAX_LAYER_S);
            if (p.ntensors > 0)
                BAD("layer %d after the first tensor: all layer lines come first", id);
            if (p.nlayers > 0 && id <= p.layers[p.nlayers - 1].id)
                BAD("layer id %d does not increase (previous layer %d)", id, p.layers[p.nlayers - 1].id);
            if (dear_prof_add_layer(&p, id, fw, bw) != DEAR_OK) {
                rc = DEAR_ERR_NOMEM;
                goto done;
            }
        } else if (strcmp(fld[0], "tensor") == 0) {
            int layer;
            size_t bytes;
            if (nf != 4 || strlen(fld[1]) >= DEAR_PROF_NAME_MAX || dear_text_int(fld[2], &layer) ||
                dear_text_size(fld[3], &bytes) || bytes == 0 || bytes > PROF_MAX_BYTES_TOTAL)
                BAD("expected 'tensor NAME LAYER_ID BYTES' (name under %d characters, bytes in 1..%zu)",
                    DEAR_PROF_NAME_MAX, PROF_MAX_BYTES_TOTAL);
            if (bytes > PROF_MAX_BYTES_TOTAL - total)
                BAD("tensor %s: the tensors add up to more than %zu bytes", fld[1], PROF_MAX_BYTES_TOTAL);
            total += bytes;
            int ok = 0;
            for (int l = p.nlayers - 1; l >= 0 && !ok; l--)
                ok = p.layers[l].id == layer;
            if (!ok)
                BAD("tensor %s names layer %d, which no layer line declares", fld[1], layer);
            if (p.ntensors > 0 && layer < p.tensors[p.ntensors - 1].layer)
                BAD("tensor %s (layer %d) follows a tensor of layer %d: tensors must be in forward order", fld[1],
                    layer, p.tensors[p.ntensors - 1].layer);
            if (dear_prof_add_tensor(&p, fld[1], layer, bytes) != DEAR_OK) {
                rc = DEAR_ERR_NOMEM;
                goto done;
            }
        } else if (strcmp(fld[0], "sparse") == 0) {
            size_t block;
            double drs, dag;
            if (nf != 5 || dear_text_size(fld[2], &block) || block == 0 || dear_text_double(fld[3], 0, 1, &drs) ||
                dear_text_double(fld[4], 0, 1, &dag))
                BAD("expected 'sparse NAME BLOCK_BYTES RS_DENSITY AG_DENSITY' (block >= 1 byte, densities in [0, 1])");
            if (p.ntensors == 0 || strcmp(fld[1], p.tensors[p.ntensors - 1].name) != 0)
                BAD("'sparse %s' must follow the tensor line of %s", fld[1], fld[1]);
            if (p.tensors[p.ntensors - 1].block_bytes > 0)
                BAD("tensor %s is declared sparse twice", fld[1]);
            if (p.tensors[p.ntensors - 1].bytes % block != 0)
                BAD("tensor %s: sparse blocks of %zu bytes do not divide its %zu bytes", fld[1], block,
                    p.tensors[p.ntensors - 1].bytes);
            dear_prof_set_sparse(&p, block, drs, dag);
        } else if (strcmp(fld[0], "end") == 0) {
            int nl, nt;
            if (nf != 3 || dear_text_int(fld[1], &nl) || dear_text_int(fld[2], &nt))
                BAD("expected 'end NLAYERS NTENSORS'");
            if (nl != p.nlayers || nt != p.ntensors)
                BAD("'end' says %d layers and %d tensors, the file has %d and %d", nl, nt, p.nlayers, p.ntensors);
            seen_end = 1;
        } else {
            BAD("unknown record '%s' (accepted: model, layer, tensor, sparse, end)", fld[0]);
        }
    }
    if (got < 0) {
        rc = got;
        goto done;
    }
    if (!seen_magic)
        BAD("empty file: expected the header '%s' or '%s'", PROF_MAGIC, MODEL_MAGIC);
    if (!seen_end)
        BAD("truncated: the file ends without its 'end NLAYERS NTENSORS' line");
    if (p.ntensors == 0)
        BAD("the profile declares no tensors");
    {
        char msg[256];
        if (dear_prof_check(&p, msg, sizeof msg) != DEAR_OK)
            BAD("%s", msg);
    }
#undef BAD
done:
    dear_lines_close(&lr);
    if (rc != DEAR_OK) {
        dear_prof_free(&p);
        return rc;
    }
    dear_prof_free(prof);
    *prof = p;
    return DEAR_OK;
}

int dear_prof_set_steps(dear_profile_t *prof, const double *layer_s)
{
    double *lb = calloc((size_t)(prof->nlayers > 0 ? prof->nlayers : 1), sizeof *lb);
    if (!lb)
        return DEAR_ERR_NOMEM;
    for (int t = 0; t < prof->ntensors; t++)
        lb[prof->tensors[t].lidx] += (double)prof->tensors[t].bytes;
    for (int t = 0; t < prof->ntensors; t++) {
        dear_prof_tensor_t *pt = &prof->tensors[t];
        pt->step_s = lb[pt->lidx] > 0 ? layer_s[pt->lidx] * (double)pt->bytes / lb[pt->lidx] : 0;
    }
    free(lb);
    return DEAR_OK;
}

double dear_prof_fwd_total(const dear_profile_t *prof)
{
    double s = 0;
    for (int l = 0; l < prof->nlayers; l++)
        s += prof->layers[l].fwd_s;
    return s;
}

double dear_prof_bwd_total(const dear_profile_t *prof)
{
    double s = 0;
    for (int l = 0; l < prof->nlayers; l++)
        s += prof->layers[l].bwd_s;
    return s;
}

size_t dear_prof_bytes_total(const dear_profile_t *prof)
{
    size_t s = 0;
    for (int i = 0; i < prof->ntensors; i++)
        s += prof->tensors[i].bytes;
    return s;
}

int dear_prof_descs(const dear_profile_t *prof, dear_tensor_desc_t **descs)
{
    dear_tensor_desc_t *d = malloc(sizeof *d * (size_t)(prof->ntensors > 0 ? prof->ntensors : 1));
    if (!d)
        return DEAR_ERR_NOMEM;
    for (int i = 0; i < prof->ntensors; i++) {
        const dear_prof_tensor_t *t = &prof->tensors[i];
        d[i] = (dear_tensor_desc_t){ .bytes = t->bytes, .layer = t->layer, .chunk = t->chunk, .nchunks = t->nchunks,
                                     .row_bytes = t->block_bytes };
    }
    *descs = d;
    return DEAR_OK;
}
