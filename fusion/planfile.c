/* Plan files: write, read, and check against the registered tensors. */
#include "fusion/planfile.h"
#include "base/fileio.h"
#include "base/textio.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "include/dear_types.h"
#include "base/log.h"

#define PLAN_MAGIC "dear-plan 1"

static void write_partition(FILE *out, const char *tag, const dear_partition_t *p)
{
    fprintf(out, "%s %d", tag, p->ngroups);
    for (int g = 0; g < p->ngroups; g++)
        fprintf(out, " %d", p->first[g]);
    fputc('\n', out);
}

int dear_planfile_write(FILE *out, const dear_plan_t *plan, const dear_tensor_desc_t *tensors,
                        const char *const *names)
{
    char msg[256];
    if (!out || !plan || dear_plan_validate(plan, plan->ntensors, msg, sizeof msg) != DEAR_OK)
        return DEAR_ERR_ARG;
    fprintf(out, "%s\n# tensors in forward order; rs: reduce-scatter (all-reduce) buckets, ag: all-gather groups,\n"
                 "# each 'TAG NGROUPS FIRST_TENSOR_OF_EACH_GROUP...'; early: trailing all-gather groups run\n"
                 "# during backward (docs/FORMATS.md)\n", PLAN_MAGIC);
    fprintf(out, "planner %s\n", plan->planner[0] ? plan->planner : "unknown");
    fprintf(out, "tensors %d\n", plan->ntensors);
    if (tensors)
        for (int t = 0; t < plan->ntensors; t++) {
            if (names && names[t])
                fprintf(out, "tensor %d %s %d %zu\n", t, names[t], tensors[t].layer, tensors[t].bytes);
            else
                fprintf(out, "tensor %d t%d %d %zu\n", t, t, tensors[t].layer, tensors[t].bytes);
        }
    write_partition(out, "rs", &plan->rs);
    write_partition(out, "ag", &plan->ag);
    if (plan->ag_early > 0)
        fprintf(out, "early %d\n", plan->ag_early);
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

/* Bounds of a plan file: a tensor record per tensor and two lines of group starts; a million
 * tensors is ten times the largest model in fusion/profiles. */
#define PLAN_MAX_TENSORS (1 << 20)
#define PLAN_MAX_LINE ((size_t)16 << 20)
#define PLAN_MAX_BYTES ((size_t)256 << 20)

typedef struct {
    char name[64];
    int layer;
    size_t bytes;
    int seen;
} rec_tensor_t;

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
    int lineno = 0, got, magic = 0, end = 0, nfile = -1, ntrec = 0;
    rec_tensor_t *rt = NULL;
    dear_plan_t p = { 0 };
    int have_rs = 0, have_ag = 0, have_early = 0;
    int *first = NULL;
#define BAD(...)                                                                                   \
    do {                                                                                           \
        char m_[512];                                                                              \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                      \
        DEAR_ERROR("plan", "%s:%d: %s", path, lineno, m_);                                         \
        rc = DEAR_ERR_FORMAT;                                                                      \
        goto done;                                                                                 \
    } while (0)
    while ((got = dear_lines_next(&lr, &line)) == 1) {
        lineno = lr.lineno;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *save = NULL, *tag = strtok_r(line, " \t\r\n", &save);
        if (!tag)
            continue;
        if (end)
            BAD("'%s' after the 'end' line", tag);
        if (!magic) {
            char *v = strtok_r(NULL, " \t\r\n", &save);
            if (strcmp(tag, "dear-plan") != 0 || !v || strcmp(v, "1") != 0 || strtok_r(NULL, " \t\r\n", &save))
                BAD("expected the header '%s' (is this a dear plan file?)", PLAN_MAGIC);
            magic = 1;
        } else if (strcmp(tag, "planner") == 0) {
            char *v = strtok_r(NULL, " \t\r\n", &save);
            if (!v || strtok_r(NULL, " \t\r\n", &save))
                BAD("expected 'planner NAME'");
            snprintf(p.planner, sizeof p.planner, "%s", v);
        } else if (strcmp(tag, "tensors") == 0) {
            long v;
            char *s = strtok_r(NULL, " \t\r\n", &save);
            if (nfile >= 0 || !s || dear_text_long(s, 0, PLAN_MAX_TENSORS, &v) || strtok_r(NULL, " \t\r\n", &save))
                BAD("expected one 'tensors COUNT' line with COUNT in 0..%d", PLAN_MAX_TENSORS);
            nfile = (int)v;
            /* Another count cannot fit, so it is refused here, before anything is allocated: the
             * count is only the file's claim, and even within PLAN_MAX_TENSORS it would ask for
             * tens of megabytes. */
            if (nfile != ntensors) {
                DEAR_ERROR("plan", "plan file %s was made for %d tensors, %d are registered", path, nfile, ntensors);
                rc = DEAR_ERR_MISMATCH;
                goto done;
            }
            rt = calloc((size_t)(nfile > 0 ? nfile : 1), sizeof *rt);
            first = malloc(sizeof(int) * (size_t)(nfile + 1));
            if (!rt || !first) {
                rc = DEAR_ERR_NOMEM;
                goto done;
            }
        } else if (strcmp(tag, "tensor") == 0) {
            char *fi = strtok_r(NULL, " \t\r\n", &save), *nm = strtok_r(NULL, " \t\r\n", &save);
            char *la = strtok_r(NULL, " \t\r\n", &save), *by = strtok_r(NULL, " \t\r\n", &save);
            long i, l, b;
            if (nfile < 0)
                BAD("'tensor' before the 'tensors COUNT' line");
            if (!by || strtok_r(NULL, " \t\r\n", &save) || dear_text_long(fi, 0, nfile - 1, &i) ||
                strlen(nm) >= sizeof rt[0].name || dear_text_long(la, -2147483647L, 2147483647L, &l) ||
                dear_text_long(by, 1, __LONG_MAX__, &b))
                BAD("expected 'tensor INDEX NAME LAYER BYTES' with INDEX in 0..%d and BYTES > 0", nfile - 1);
            if (rt[i].seen)
                BAD("tensor %ld listed twice", i);
            rt[i] = (rec_tensor_t){ .layer = (int)l, .bytes = (size_t)b, .seen = 1 };
            snprintf(rt[i].name, sizeof rt[i].name, "%s", nm);
            ntrec++;
        } else if (strcmp(tag, "rs") == 0 || strcmp(tag, "ag") == 0) {
            int is_rs = tag[0] == 'r';
            long ng;
            char *s = strtok_r(NULL, " \t\r\n", &save);
            if (nfile < 0)
                BAD("'%s' before the 'tensors COUNT' line", tag);
            if ((is_rs && have_rs) || (!is_rs && have_ag))
                BAD("second '%s' line", tag);
            if (!s || dear_text_long(s, nfile > 0 ? 1 : 0, nfile, &ng))
                BAD("expected '%s NGROUPS FIRST...' with NGROUPS in %d..%d", tag, nfile > 0 ? 1 : 0, nfile);
            for (long g = 0; g < ng; g++) {
                long v;
                s = strtok_r(NULL, " \t\r\n", &save);
                if (!s)
                    BAD("'%s' says %ld groups but lists %ld", tag, ng, g);
                if (dear_text_long(s, 0, nfile - 1, &v))
                    BAD("'%s' group %ld starts at '%s', not a tensor index in 0..%d", tag, g, s, nfile - 1);
                if ((g == 0 && v != 0) || (g > 0 && v <= first[g - 1]))
                    BAD("'%s' group starts must begin at 0 and strictly increase (group %ld starts at %ld)", tag,
                        g, v);
                first[g] = (int)v;
            }
            if (strtok_r(NULL, " \t\r\n", &save))
                BAD("'%s' lists more than its %ld groups", tag, ng);
            first[ng] = nfile;
            int r2 = dear_partition_set(is_rs ? &p.rs : &p.ag, nfile, (int)ng, first);
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
        } else if (strcmp(tag, "end") == 0) {
            end = 1;
        } else {
            BAD("unknown record '%s' (accepted: planner, tensors, tensor, rs, ag, early, end)", tag);
        }
    }
    if (got < 0) {
        rc = got;
        goto done;
    }
    if (!magic)
        BAD("empty file: expected the header '%s'", PLAN_MAGIC);
    if (!end)
        BAD("truncated: the file ends without its 'end' line");
    if (nfile < 0 || !have_rs || !have_ag)
        BAD("incomplete plan: needs 'tensors', 'rs' and 'ag' lines");
    if (ntrec != 0 && ntrec != nfile)
        BAD("lists %d of its %d tensors: list all or none", ntrec, nfile);
    p.ntensors = nfile;
#undef BAD
    /* Well formed, and for as many tensors; now are they the registered ones? */
    for (int t = 0; ntrec && t < nfile; t++) {
        const char *nm = names && names[t] ? names[t] : NULL;
        if ((tensors && (tensors[t].bytes != rt[t].bytes || tensors[t].layer != rt[t].layer)) ||
            (nm && strcmp(nm, rt[t].name) != 0)) {
            DEAR_ERROR("plan",
                       "plan file %s does not fit tensor %d: the file has '%s' (layer %d, %zu bytes), registered "
                       "is '%s' (layer %d, %zu bytes)",
                       path, t, rt[t].name, rt[t].layer, rt[t].bytes, nm ? nm : "?", tensors ? tensors[t].layer : -1,
                       tensors ? tensors[t].bytes : 0);
            rc = DEAR_ERR_MISMATCH;
            goto done;
        }
    }
done:
    free(rt);
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
