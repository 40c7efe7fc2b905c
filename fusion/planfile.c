/* Plan files: write, read, and check against the registered tensors. Version 2 adds the units
 * (the cut tensors' chunks); version 1 files are still read, every tensor whole. */
#include "fusion/planfile.h"
#include "base/fileio.h"
#include "base/textio.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "include/dear_types.h"
#include "base/log.h"
#include "fusion/units.h"

#define PLAN_MAGIC "dear-plan 2"

static void write_partition(FILE *out, const char *tag, const dear_partition_t *p)
{
    fprintf(out, "%s %d", tag, p->ngroups);
    for (int g = 0; g < p->ngroups; g++)
        fprintf(out, " %d", p->first[g]);
    fputc('\n', out);
}

/* One 'cut' line per cut tensor: its size, then where its chunks after the first begin. */
static void write_cuts(FILE *out, const dear_plan_t *plan)
{
    const dear_unit_t *u = plan->units;
    for (int i = 0; u && i < plan->nunits; i++) {
        if (u[i].bytes == 0 || u[i].offset != 0)
            continue;
        int k = i;
        while (k + 1 < plan->nunits && u[k + 1].tensor == u[i].tensor)
            k++;
        fprintf(out, "cut %d %zu", u[i].tensor, u[k].offset + u[k].bytes);
        for (int j = i + 1; j <= k; j++)
            fprintf(out, " %zu", u[j].offset);
        fputc('\n', out);
    }
}

int dear_planfile_write(FILE *out, const dear_plan_t *plan, const dear_tensor_desc_t *tensors,
                        const char *const *names)
{
    char msg[256];
    if (!out || !plan || dear_plan_validate(plan, plan->ntensors, msg, sizeof msg) != DEAR_OK)
        return DEAR_ERR_ARG;
    fprintf(out, "%s\n# tensors in forward order; units: the tensors, each whole or cut into chunks at the byte\n"
                 "# offsets of its 'cut TENSOR BYTES OFFSET...' line; rs: reduce-scatter (all-reduce) buckets,\n"
                 "# ag: all-gather groups, each 'TAG NGROUPS FIRST_UNIT_OF_EACH_GROUP...'; early: trailing\n"
                 "# all-gather groups run during backward, or early-groups: which (docs/FORMATS.md)\n", PLAN_MAGIC);
    fprintf(out, "planner %s\n", plan->planner[0] ? plan->planner : "unknown");
    fprintf(out, "tensors %d\n", plan->ntensors);
    if (tensors)
        for (int t = 0; t < plan->ntensors; t++) {
            if (names && names[t])
                fprintf(out, "tensor %d %s %d %zu\n", t, names[t], tensors[t].layer, tensors[t].bytes);
            else
                fprintf(out, "tensor %d t%d %d %zu\n", t, t, tensors[t].layer, tensors[t].bytes);
        }
    fprintf(out, "units %d\n", plan->nunits);
    write_cuts(out, plan);
    write_partition(out, "rs", &plan->rs);
    write_partition(out, "ag", &plan->ag);
    if (plan->early) {
        fprintf(out, "early-groups %d", plan->ag_early);
        for (int g = 0; g < plan->ag.ngroups; g++)
            if (plan->early[g])
                fprintf(out, " %d", g);
        fputc('\n', out);
    } else if (plan->ag_early > 0) {
        fprintf(out, "early %d\n", plan->ag_early);
    }
    fprintf(out, "end\n");
    return ferror(out) ? DEAR_ERR_IO : DEAR_OK;
}

int dear_planfile_save(const char *path, const dear_plan_t *plan, const dear_tensor_desc_t *tensors,
                       const char *const *names)
{
    dear_file_out_t out;
    int rc = dear_file_out_open(&out, path, "plan file");
    if (rc != DEAR_OK)
        return rc;
    rc = dear_planfile_write(out.f, plan, tensors, names);
    if (rc != DEAR_OK) {
        DEAR_ERROR("plan", "error writing plan file %s; the old file, if any, is left as it was", path);
        dear_file_out_abort(&out);
        return rc;
    }
    return dear_file_out_commit(&out);
}

/* Bounds of a plan file: a tensor record per tensor, a cut line per cut tensor and two lines of
 * group starts; a million tensors (or units) is ten times the largest model in fusion/profiles. */
#define PLAN_MAX_TENSORS DEAR_UNITS_MAX
#define PLAN_MAX_LINE ((size_t)16 << 20)
#define PLAN_MAX_BYTES ((size_t)256 << 20)

typedef struct {
    char name[64];
    int layer;
    size_t bytes;
    int seen;
} rec_tensor_t;

/* What the reader has seen so far. */
typedef struct {
    const char *path;
    int lineno, version, nfile, nunits_file, ntrec;
    rec_tensor_t *rt;
    const dear_tensor_desc_t *tensors;  /* registered (NULL: unknown) */
    dear_unit_t *cuts;                  /* the cut tensors' chunks, in order */
    int ncuts, cuts_cap, ncut_tensors, last_cut;
    int units_done;                     /* the units are fixed: a partition line came */
} reader_t;

/* A 'cut TENSOR BYTES OFFSET...' line (fields after the tag in save): its chunks appended to
 * r->cuts. DEAR_OK, or the error (logged, naming the line). */
static int read_cut(reader_t *r, char **save)
{
    int rc = DEAR_ERR_FORMAT;
#define CUT_BAD(code, ...)                                                                         \
    do {                                                                                           \
        char m_[512];                                                                              \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                      \
        DEAR_ERROR("plan", "%s:%d: %s", r->path, r->lineno, m_);                                   \
        return (code);                                                                             \
    } while (0)
    if (r->nunits_file < 0 || r->units_done)
        CUT_BAD(rc, "'cut' lines come after the 'units' line and before the 'rs' and 'ag' lines");
    long t, b;
    char *ts = strtok_r(NULL, " \t\r\n", save), *bs = strtok_r(NULL, " \t\r\n", save);
    if (!ts || !bs || dear_text_long(ts, 0, r->nfile - 1, &t) || dear_text_long(bs, 2, __LONG_MAX__, &b))
        CUT_BAD(rc, "expected 'cut TENSOR BYTES OFFSET...' with TENSOR in 0..%d and BYTES >= 2", r->nfile - 1);
    if (t <= r->last_cut)
        CUT_BAD(rc, "tensor %ld is cut after tensor %d: one 'cut' line per tensor, in tensor order", t, r->last_cut);
    if (r->ntrec > 0 && (!r->rt[t].seen || r->rt[t].bytes != (size_t)b))
        CUT_BAD(rc, "tensor %ld has %zu bytes by its 'tensor' line, its 'cut' line says %ld", t,
                r->rt[t].seen ? r->rt[t].bytes : 0, b);
    const dear_tensor_desc_t *reg = r->tensors ? &r->tensors[t] : NULL;
    if (reg && reg->bytes != (size_t)b)
        CUT_BAD(DEAR_ERR_MISMATCH, "tensor %ld is cut as %ld bytes, the registered tensor has %zu", t, b, reg->bytes);
    r->last_cut = (int)t;
    size_t prev = 0;
    int first = r->ncuts, noff = 0;
    for (char *s; (s = strtok_r(NULL, " \t\r\n", save)) != NULL;) {
        long off;
        if (dear_text_long(s, 1, b - 1, &off))
            CUT_BAD(rc, "tensor %ld (%ld bytes) is cut at '%s', not a byte offset inside it (1..%ld)", t, b, s, b - 1);
        if ((size_t)off <= prev)
            CUT_BAD(rc, "tensor %ld: cut at byte %ld after byte %zu; offsets must strictly increase (chunks in order, "
                    "none overlapping or empty)", t, off, prev);
        if (reg && reg->elem_bytes > 0 && (size_t)off % reg->elem_bytes != 0)
            CUT_BAD(DEAR_ERR_MISMATCH, "tensor %ld is cut at byte %ld, inside an element of %zu bytes", t, off,
                    reg->elem_bytes);
        if (reg && reg->row_bytes > 0 && (size_t)off % reg->row_bytes != 0)
            CUT_BAD(DEAR_ERR_MISMATCH, "sparse tensor %ld is cut at byte %ld, inside a row of %zu bytes", t, off,
                    reg->row_bytes);
        /* Chunks beyond the count the 'units' line declared cannot fit: stop before storing them. */
        if (++noff > r->nunits_file - r->nfile - (first - r->ncut_tensors))
            CUT_BAD(rc, "the cuts make more units than the %d of the 'units' line", r->nunits_file);
        if (r->ncuts + 2 > r->cuts_cap) {
            int cap = r->cuts_cap ? 2 * r->cuts_cap : 64;
            dear_unit_t *c = realloc(r->cuts, sizeof *c * (size_t)cap);
            if (!c)
                return DEAR_ERR_NOMEM;
            r->cuts = c;
            r->cuts_cap = cap;
        }
        if (r->ncuts == first)
            r->cuts[r->ncuts++] = (dear_unit_t){ .tensor = (int)t, .offset = 0 };
        r->cuts[r->ncuts - 1].bytes = (size_t)off - r->cuts[r->ncuts - 1].offset;
        r->cuts[r->ncuts++] = (dear_unit_t){ .tensor = (int)t, .offset = (size_t)off };
        prev = (size_t)off;
    }
    if (r->ncuts == first)
        CUT_BAD(rc, "'cut %ld %ld' names no offset: list where each chunk after the first begins", t, b);
    r->cuts[r->ncuts - 1].bytes = (size_t)b - r->cuts[r->ncuts - 1].offset;
    r->ncut_tensors++;
    return DEAR_OK;
#undef CUT_BAD
}

/* The plan's units from the cut lines: each tensor whole unless cut. *units NULL when none is. */
static int expand_units(const reader_t *r, dear_unit_t **units, int *nunits)
{
    *units = NULL;
    *nunits = r->nfile + r->ncuts - r->ncut_tensors;
    if (r->ncuts == 0)
        return DEAR_OK;
    dear_unit_t *u = malloc(sizeof *u * (size_t)*nunits);
    if (!u)
        return DEAR_ERR_NOMEM;
    int n = 0, c = 0;
    for (int t = 0; t < r->nfile; t++) {
        if (c < r->ncuts && r->cuts[c].tensor == t)
            while (c < r->ncuts && r->cuts[c].tensor == t)
                u[n++] = r->cuts[c++];
        else
            u[n++] = (dear_unit_t){ .tensor = t };
    }
    *units = u;
    return DEAR_OK;
}

int dear_planfile_load(const char *path, int ntensors, const dear_tensor_desc_t *tensors,
                       const char *const *names, dear_plan_t *plan)
{
    if (!path || !plan || ntensors < 0)
        return DEAR_ERR_ARG;
    dear_lines_t lr;
    int rc = dear_lines_open(&lr, path, "plan file", PLAN_MAX_LINE, PLAN_MAX_BYTES, 0);
    if (rc != DEAR_OK)
        return rc;
    char *line;
    int got, end = 0;
    reader_t r = { .path = path, .nfile = -1, .nunits_file = -1, .tensors = tensors, .last_cut = -1 };
    dear_plan_t p = { 0 };
    int have_rs = 0, have_ag = 0, have_early = 0;
    int *first = NULL;
#define BAD(...)                                                                                   \
    do {                                                                                           \
        char m_[512];                                                                              \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                      \
        DEAR_ERROR("plan", "%s:%d: %s", path, r.lineno, m_);                                       \
        rc = DEAR_ERR_FORMAT;                                                                      \
        goto done;                                                                                 \
    } while (0)
    while ((got = dear_lines_next(&lr, &line)) == 1) {
        r.lineno = lr.lineno;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *save = NULL, *tag = strtok_r(line, " \t\r\n", &save);
        if (!tag)
            continue;
        if (end)
            BAD("'%s' after the 'end' line", tag);
        if (!r.version) {
            char *v = strtok_r(NULL, " \t\r\n", &save);
            if (strcmp(tag, "dear-plan") != 0 || !v || strtok_r(NULL, " \t\r\n", &save))
                BAD("expected the header '%s' (is this a dear plan file?)", PLAN_MAGIC);
            if (strcmp(v, "1") != 0 && strcmp(v, "2") != 0)
                BAD("plan file version '%s': this reader knows versions 1 and 2 (make the plan again with this "
                    "build's dear-plan or dear_plan_save)", v);
            r.version = v[0] - '0';
        } else if (strcmp(tag, "planner") == 0) {
            char *v = strtok_r(NULL, " \t\r\n", &save);
            if (!v || strtok_r(NULL, " \t\r\n", &save))
                BAD("expected 'planner NAME'");
            snprintf(p.planner, sizeof p.planner, "%s", v);
        } else if (strcmp(tag, "tensors") == 0) {
            long v;
            char *s = strtok_r(NULL, " \t\r\n", &save);
            if (r.nfile >= 0 || !s || dear_text_long(s, 0, PLAN_MAX_TENSORS, &v) || strtok_r(NULL, " \t\r\n", &save))
                BAD("expected one 'tensors COUNT' line with COUNT in 0..%d", PLAN_MAX_TENSORS);
            r.nfile = (int)v;
            /* Another count cannot fit, so it is refused here, before anything is allocated: the
             * count is only the file's claim, and even within PLAN_MAX_TENSORS it would ask for
             * tens of megabytes. */
            if (r.nfile != ntensors) {
                DEAR_ERROR("plan", "plan file %s was made for %d tensors, %d are registered", path, r.nfile, ntensors);
                rc = DEAR_ERR_MISMATCH;
                goto done;
            }
            r.rt = calloc((size_t)(r.nfile > 0 ? r.nfile : 1), sizeof *r.rt);
            if (!r.rt) {
                rc = DEAR_ERR_NOMEM;
                goto done;
            }
            if (r.version == 1)
                r.nunits_file = r.nfile;
        } else if (strcmp(tag, "tensor") == 0) {
            char *fi = strtok_r(NULL, " \t\r\n", &save), *nm = strtok_r(NULL, " \t\r\n", &save);
            char *la = strtok_r(NULL, " \t\r\n", &save), *by = strtok_r(NULL, " \t\r\n", &save);
            long i, l, b;
            if (r.nfile < 0)
                BAD("'tensor' before the 'tensors COUNT' line");
            if (r.version > 1 && r.nunits_file >= 0)
                BAD("'tensor' after the 'units' line: the tensors come first");
            if (!by || strtok_r(NULL, " \t\r\n", &save) || dear_text_long(fi, 0, r.nfile - 1, &i) ||
                strlen(nm) >= sizeof r.rt[0].name || dear_text_long(la, -2147483647L, 2147483647L, &l) ||
                dear_text_long(by, 1, __LONG_MAX__, &b))
                BAD("expected 'tensor INDEX NAME LAYER BYTES' with INDEX in 0..%d and BYTES > 0", r.nfile - 1);
            if (r.rt[i].seen)
                BAD("tensor %ld listed twice", i);
            r.rt[i] = (rec_tensor_t){ .layer = (int)l, .bytes = (size_t)b, .seen = 1 };
            snprintf(r.rt[i].name, sizeof r.rt[i].name, "%s", nm);
            r.ntrec++;
        } else if (strcmp(tag, "units") == 0) {
            long v;
            char *s = strtok_r(NULL, " \t\r\n", &save);
            if (r.version == 1)
                BAD("'units' is a version 2 record; this file says 'dear-plan 1'");
            if (r.nfile < 0 || r.nunits_file >= 0)
                BAD("one 'units' line, after the 'tensors COUNT' line");
            if (!s || dear_text_long(s, r.nfile, PLAN_MAX_TENSORS, &v) || strtok_r(NULL, " \t\r\n", &save))
                BAD("expected 'units COUNT' with COUNT in %d..%d (the tensors, each whole or cut)", r.nfile,
                    PLAN_MAX_TENSORS);
            if (r.ntrec != 0 && r.ntrec != r.nfile)
                BAD("lists %d of its %d tensors before the 'units' line: list all or none", r.ntrec, r.nfile);
            r.nunits_file = (int)v;
        } else if (strcmp(tag, "cut") == 0) {
            if (r.version == 1)
                BAD("'cut' is a version 2 record; this file says 'dear-plan 1'");
            int r2 = read_cut(&r, &save);
            if (r2 != DEAR_OK) {
                rc = r2;
                goto done;
            }
        } else if (strcmp(tag, "rs") == 0 || strcmp(tag, "ag") == 0) {
            int is_rs = tag[0] == 'r';
            long ng;
            char *s = strtok_r(NULL, " \t\r\n", &save);
            if (r.nunits_file < 0)
                BAD("'%s' before the '%s' line", tag, r.version == 1 ? "tensors COUNT" : "units COUNT");
            if (!r.units_done) {
                int nu = r.nfile + r.ncuts - r.ncut_tensors;
                if (nu != r.nunits_file)
                    BAD("the cut lines make %d units, the 'units' line says %d", nu, r.nunits_file);
                r.units_done = 1;
                first = malloc(sizeof(int) * (size_t)(r.nunits_file + 1));
                if (!first) {
                    rc = DEAR_ERR_NOMEM;
                    goto done;
                }
            }
            int nu = r.nunits_file;
            if ((is_rs && have_rs) || (!is_rs && have_ag))
                BAD("second '%s' line", tag);
            if (!s || dear_text_long(s, nu > 0 ? 1 : 0, nu, &ng))
                BAD("expected '%s NGROUPS FIRST...' with NGROUPS in %d..%d", tag, nu > 0 ? 1 : 0, nu);
            for (long g = 0; g < ng; g++) {
                long v;
                s = strtok_r(NULL, " \t\r\n", &save);
                if (!s)
                    BAD("'%s' says %ld groups but lists %ld", tag, ng, g);
                if (dear_text_long(s, 0, nu - 1, &v))
                    BAD("'%s' group %ld starts at '%s', not a unit index in 0..%d", tag, g, s, nu - 1);
                if ((g == 0 && v != 0) || (g > 0 && v <= first[g - 1]))
                    BAD("'%s' group starts must begin at 0 and strictly increase (group %ld starts at %ld)", tag,
                        g, v);
                first[g] = (int)v;
            }
            if (strtok_r(NULL, " \t\r\n", &save))
                BAD("'%s' lists more than its %ld groups", tag, ng);
            first[ng] = nu;
            int r2 = dear_partition_set(is_rs ? &p.rs : &p.ag, nu, (int)ng, first);
            if (r2 != DEAR_OK) {
                rc = r2;
                goto done;
            }
            if (is_rs)
                have_rs = 1;
            else
                have_ag = 1;
        } else if (strcmp(tag, "early") == 0) {
            long v;
            char *s = strtok_r(NULL, " \t\r\n", &save);
            if (!have_ag)
                BAD("'early' before the 'ag' line");
            if (have_early || !s || dear_text_long(s, 0, p.ag.ngroups, &v) || strtok_r(NULL, " \t\r\n", &save))
                BAD("expected one 'early COUNT' line with COUNT in 0..%d (the all-gather groups)", p.ag.ngroups);
            p.ag_early = (int)v;
            have_early = 1;
        } else if (strcmp(tag, "early-groups") == 0) {
            long v, ne;
            char *s = strtok_r(NULL, " \t\r\n", &save);
            if (!have_ag)
                BAD("'early-groups' before the 'ag' line");
            if (have_early || !s || dear_text_long(s, 0, p.ag.ngroups, &ne))
                BAD("expected one 'early' or 'early-groups COUNT GROUP...' line with COUNT in 0..%d (the all-gather "
                    "groups)", p.ag.ngroups);
            unsigned char *mark = calloc((size_t)p.ag.ngroups + 1, 1);
            if (!mark) {
                rc = DEAR_ERR_NOMEM;
                goto done;
            }
            for (long k = 0, prev = -1; k < ne; k++, prev = v) {
                s = strtok_r(NULL, " \t\r\n", &save);
                if (!s || dear_text_long(s, prev + 1, p.ag.ngroups - 1, &v)) {
                    free(mark);
                    BAD("'early-groups' lists %ld groups: group %ld is '%s', expected a group index in %ld..%d, "
                        "increasing", ne, k, s ? s : "missing", prev + 1, p.ag.ngroups - 1);
                }
                mark[v] = 1;
            }
            int r2 = strtok_r(NULL, " \t\r\n", &save) ? DEAR_ERR_FORMAT : dear_plan_set_early(&p, mark);
            free(mark);
            if (r2 == DEAR_ERR_FORMAT)
                BAD("'early-groups' lists more than its %ld groups", ne);
            if (r2 != DEAR_OK) {
                rc = r2;
                goto done;
            }
            have_early = 1;
        } else if (strcmp(tag, "end") == 0) {
            end = 1;
        } else {
            BAD("unknown record '%s' (accepted: planner, tensors, tensor, %srs, ag, early, early-groups, end)", tag,
                r.version == 1 ? "" : "units, cut, ");
        }
    }
    if (got < 0) {
        rc = got;
        goto done;
    }
    if (!r.version)
        BAD("empty file: expected the header '%s'", PLAN_MAGIC);
    if (!end)
        BAD("truncated: the file ends without its 'end' line");
    if (r.nfile < 0 || r.nunits_file < 0 || !have_rs || !have_ag)
        BAD("incomplete plan: needs 'tensors', %s'rs' and 'ag' lines", r.version == 1 ? "" : "'units', ");
    if (r.ntrec != 0 && r.ntrec != r.nfile)
        BAD("lists %d of its %d tensors: list all or none", r.ntrec, r.nfile);
#undef BAD
    p.ntensors = r.nfile;
    rc = expand_units(&r, &p.units, &p.nunits);
    if (rc != DEAR_OK)
        goto done;
    /* Well formed, and for as many tensors; now are they the registered ones? */
    for (int t = 0; r.ntrec && t < r.nfile; t++) {
        const char *nm = names && names[t] ? names[t] : NULL;
        if ((tensors && (tensors[t].bytes != r.rt[t].bytes || tensors[t].layer != r.rt[t].layer)) ||
            (nm && strcmp(nm, r.rt[t].name) != 0)) {
            DEAR_ERROR("plan",
                       "plan file %s does not fit tensor %d: the file has '%s' (layer %d, %zu bytes), registered "
                       "is '%s' (layer %d, %zu bytes)",
                       path, t, r.rt[t].name, r.rt[t].layer, r.rt[t].bytes, nm ? nm : "?",
                       tensors ? tensors[t].layer : -1, tensors ? tensors[t].bytes : 0);
            rc = DEAR_ERR_MISMATCH;
            goto done;
        }
    }
done:
    free(r.rt);
    free(r.cuts);
    free(first);
    dear_lines_close(&lr);
    if (rc != DEAR_OK) {
        dear_plan_free(&p);
        return rc;
    }
    dear_plan_free(plan);
    *plan = p;
    return DEAR_OK;
}
