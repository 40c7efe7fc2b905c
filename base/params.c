/* Parameter table implementation: parse, validate and cache the DEAR_* environment. All the
 * knowledge about a parameter lives in params.def; nothing here is specific to one of them. */
#include "base/params.h"
#include "base/textio.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/algo_table.h"
#include "base/log.h"
#include "base/planner_table.h"
#include "base/transport_table.h"
#include "base/util.h"
#include "base/sched_table.h"
#include "include/dear_types.h"

extern char **environ;

#define T_INT DEAR_PT_INT
#define T_SIZE DEAR_PT_SIZE
#define T_DOUBLE DEAR_PT_DOUBLE
#define T_BOOL DEAR_PT_BOOL
#define T_ENUM DEAR_PT_ENUM
#define T_ENUM_INT DEAR_PT_ENUM_INT
#define T_STRING DEAR_PT_STRING

const dear_param_desc_t dear_param_table[DEAR_P_COUNT] = {
#define DEAR_PARAM(NAME, TYPE, DEFAULT, MIN, MAX, CHOICES, HELP) \
    { #NAME, T_##TYPE, DEFAULT, MIN, MAX, CHOICES, HELP },
#include "base/params.def"
#undef DEAR_PARAM
};

typedef struct {
    long long i;
    double d;
    int e;
    int from_env;
    char text[512];
} param_value_t;

static param_value_t values[DEAR_P_COUNT];
static int values_loaded;

/* Index of word in "a|b|c", or -1. */
static int choice_index(const char *choices, const char *word)
{
    size_t wlen = strlen(word);
    int idx = 0;
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == wlen && strncmp(p, word, len) == 0)
            return idx;
        idx++;
        if (!bar)
            break;
        p = bar + 1;
    }
    return -1;
}

/* Size suffixes: k, m, g and KiB, MiB, GiB are binary (1024-based); kB, MB, GB (SI) are decimal,
 * as users who write 10MB mean. */
static double suffix_multiplier(const char *s)
{
    static const struct { const char *text; double mult; } units[] = {
        { "k", 0x1p10 }, { "K", 0x1p10 }, { "KiB", 0x1p10 }, { "kiB", 0x1p10 },
        { "m", 0x1p20 }, { "M", 0x1p20 }, { "MiB", 0x1p20 },
        { "g", 0x1p30 }, { "G", 0x1p30 }, { "GiB", 0x1p30 },
        { "kB", 1e3 }, { "KB", 1e3 }, { "MB", 1e6 }, { "GB", 1e9 },
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(s, units[i].text) == 0)
            return units[i].mult;
    return 0;
}

static int parse_integer(const char *text, int allow_suffix, long long *out)
{
    char *end;
    errno = 0;
    double mult = 1;
    /* strtoll would skip leading blanks; a value with blanks is a quoting mistake. */
    if (isspace((unsigned char)text[0]))
        return -1;
    long long v = strtoll(text, &end, 10);
    if (end == text || errno != 0)
        return -1;
    if (allow_suffix && *end) {
        mult = suffix_multiplier(end);
        if (mult == 0)
            return -1;
    } else if (*end != '\0') {
        return -1;
    }
    if ((double)v * mult > 9e18 || (double)v * mult < -9e18)
        return -1;
    *out = (long long)((double)v * mult);
    return 0;
}

/* "a|b|c" as "`a`, `b`, `c`" for Markdown, where '|' would split a table cell. */
static void choices_markdown(const char *choices, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (const char *p = choices; *p && o + 1 < len;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        int w = snprintf(buf + o, len - o, "%s`%.*s`", o ? ", " : "", (int)n, p);
        if (w < 0 || (size_t)w >= len - o)
            break;
        o += (size_t)w;
        if (!bar)
            break;
        p = bar + 1;
    }
}

static void accepted_text_md(const dear_param_desc_t *d, char *buf, size_t len)
{
    char list[256];
    choices_markdown(d->choices, list, sizeof list);
    switch (d->type) {
    case DEAR_PT_ENUM: snprintf(buf, len, "one of %s", list); break;
    case DEAR_PT_ENUM_INT: snprintf(buf, len, "one of %s or an integer in [%.0f, %.0f]", list, d->min, d->max); break;
    case DEAR_PT_SIZE: snprintf(buf, len, "bytes in [%.0f, %.0f]; suffix `k`, `m`, `g` (or `KiB`, `MiB`, `GiB`) for 2^10, 2^20, 2^30, `kB`, `MB`, `GB` for 10^3, 10^6, 10^9", d->min, d->max); break;
    default: break;
    }
}

static void accepted_text(const dear_param_desc_t *d, char *buf, size_t len)
{
    switch (d->type) {
    case DEAR_PT_INT: snprintf(buf, len, "an integer in [%.0f, %.0f]", d->min, d->max); break;
    case DEAR_PT_SIZE: snprintf(buf, len, "a byte count in [%.0f, %.0f], optionally with k/m/g or KiB/MiB/GiB (binary) or kB/MB/GB (decimal)", d->min, d->max); break;
    case DEAR_PT_DOUBLE: snprintf(buf, len, "a number in [%g, %g]", d->min, d->max); break;
    case DEAR_PT_BOOL: snprintf(buf, len, "0 or 1"); break;
    case DEAR_PT_ENUM: snprintf(buf, len, "one of %s", d->choices); break;
    case DEAR_PT_ENUM_INT: snprintf(buf, len, "one of %s or an integer in [%.0f, %.0f]", d->choices, d->min, d->max); break;
    case DEAR_PT_STRING: snprintf(buf, len, "any text"); break;
    }
}

/* Parse text for parameter id into *v; on failure fill msg and return DEAR_ERR_PARAM. */
static int parse_value(dear_param_id_t id, const char *text, param_value_t *v, char *msg, size_t msglen)
{
    const dear_param_desc_t *d = &dear_param_table[id];
    char accepted[256];
    int ok = 1;

    memset(v, 0, sizeof *v);
    if (strlen(text) >= sizeof v->text) {
        snprintf(msg, msglen, "DEAR_%s is %zu characters long; at most %zu are accepted", d->name,
                 strlen(text), sizeof v->text - 1);
        return DEAR_ERR_PARAM;
    }
    snprintf(v->text, sizeof v->text, "%s", text);
    switch (d->type) {
    case DEAR_PT_INT:
    case DEAR_PT_SIZE:
        ok = parse_integer(text, d->type == DEAR_PT_SIZE, &v->i) == 0 && v->i >= d->min && v->i <= d->max;
        v->d = (double)v->i;
        break;
    case DEAR_PT_BOOL:
        ok = strcmp(text, "0") == 0 || strcmp(text, "1") == 0;
        v->i = v->d = text[0] == '1';
        break;
    case DEAR_PT_DOUBLE: {
        v->d = 0;
        ok = dear_text_double(text, d->min, d->max, &v->d) == 0;
        v->i = (long long)v->d;
        break;
    }
    case DEAR_PT_ENUM:
        v->e = choice_index(d->choices, text);
        ok = v->e >= 0;
        v->i = v->e;
        break;
    case DEAR_PT_ENUM_INT:
        v->e = choice_index(d->choices, text);
        if (v->e >= 0) {
            v->i = -1;
        } else {
            ok = parse_integer(text, 0, &v->i) == 0 && v->i >= d->min && v->i <= d->max;
            v->e = -1;
        }
        v->d = (double)v->i;
        break;
    case DEAR_PT_STRING:
        break;
    }
    if (!ok) {
        accepted_text(d, accepted, sizeof accepted);
        snprintf(msg, msglen, "DEAR_%s='%s' is not valid: expected %s", d->name, text, accepted);
        return DEAR_ERR_PARAM;
    }
    return DEAR_OK;
}


int dear_param_parse_int(dear_param_id_t id, const char *text, long long *value, char *msg, size_t msglen)
{
    param_value_t v;
    if ((unsigned)id >= DEAR_P_COUNT || text == NULL) {
        snprintf(msg, msglen, "unknown parameter id %d", (int)id);
        return DEAR_ERR_ARG;
    }
    int rc = parse_value(id, text, &v, msg, msglen);
    if (rc == DEAR_OK)
        *value = v.i;
    return rc;
}

static void warn_unknown(void)
{
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "DEAR_", 5) != 0)
            continue;
        const char *name = *e + 5;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int known = 0;
        for (int i = 0; i < DEAR_P_COUNT && !known; i++)
            known = strlen(dear_param_table[i].name) == len && strncmp(dear_param_table[i].name, name, len) == 0;
        if (!known)
            DEAR_WARN("params", "unknown variable DEAR_%.*s ignored (typo? 'dear-info' lists every parameter)",
                      (int)len, name);
    }
}

int dear_params_load(void)
{
    param_value_t next[DEAR_P_COUNT];
    char msg[768];
    int rc = DEAR_OK;

    for (int i = 0; i < DEAR_P_COUNT; i++) {
        char envname[96];
        snprintf(envname, sizeof envname, "DEAR_%s", dear_param_table[i].name);
        const char *env = getenv(envname);
        int r = parse_value((dear_param_id_t)i, env ? env : dear_param_table[i].defval, &next[i], msg, sizeof msg);
        if (r != DEAR_OK) {
            DEAR_ERROR("params", "%s", msg);
            rc = r;
        }
        next[i].from_env = env != NULL;
    }
    if (rc != DEAR_OK) {
        /* A misspelt name may be why a value looks wrong: say so here too. */
        warn_unknown();
        return rc;
    }
    memcpy(values, next, sizeof values);
    values_loaded = 1;
    dear_log_set_level((dear_log_level_t)values[DEAR_P_LOG_LEVEL].e);
    warn_unknown();
    return DEAR_OK;
}

/* Getters fall back to the defaults when nothing was loaded yet (tools, unit tests). */
static const param_value_t *get(dear_param_id_t id)
{
    static param_value_t defaults[DEAR_P_COUNT];
    static int defaults_ready;
    if (values_loaded)
        return &values[id];
    if (!defaults_ready) {
        char msg[256];
        for (int i = 0; i < DEAR_P_COUNT; i++)
            parse_value((dear_param_id_t)i, dear_param_table[i].defval, &defaults[i], msg, sizeof msg);
        defaults_ready = 1;
    }
    return &defaults[id];
}

long long dear_param_int(dear_param_id_t id) { return get(id)->i; }
double dear_param_double(dear_param_id_t id) { return get(id)->d; }
int dear_param_enum(dear_param_id_t id) { return get(id)->e; }
const char *dear_param_string(dear_param_id_t id) { return get(id)->text; }
int dear_param_from_env(dear_param_id_t id) { return get(id)->from_env; }

int dear_params_print(FILE *out, const char *prefix)
{
    int nbad = 0;
    for (int i = 0; i < DEAR_P_COUNT; i++) {
        const dear_param_desc_t *d = &dear_param_table[i];
        char envname[96], msg[768];
        param_value_t v;
        snprintf(envname, sizeof envname, "DEAR_%s", d->name);
        const char *env = getenv(envname);
        const char *text = env ? env : d->defval;
        int ok = parse_value((dear_param_id_t)i, text, &v, msg, sizeof msg) == DEAR_OK;
        nbad += !ok;
        char parsed[64] = "";
        if (ok && d->type == DEAR_PT_SIZE && strspn(text, "0123456789") != strlen(text))
            snprintf(parsed, sizeof parsed, ", %lld bytes", v.i); /* what a suffix made of it */
        fprintf(out, "%s%-24s = %-12s (%s%s%s)\n", prefix ? prefix : "", envname, text[0] ? text : "\"\"",
                env ? "environment" : "default", parsed, ok ? "" : ", INVALID: dear_init would fail");
        if (!ok)
            fprintf(out, "%s    %s\n", prefix ? prefix : "", msg);
    }
    return nbad;
}

static const char *type_name(dear_param_type_t t)
{
    static const char *const names[] = { "int", "bytes", "number", "0/1", "choice", "choice or int", "text" };
    return names[t];
}

/* Text for a Markdown table cell: '|' would end the cell. */
static void md_cell(FILE *out, const char *text)
{
    for (const char *p = text; *p; p++) {
        if (*p == '|')
            fputc('\\', out);
        fputc(*p, out);
    }
}

void dear_params_markdown(FILE *out)
{
    fprintf(out, "# dear parameters\n\n"
                 "Generated by `dear-info --markdown` from `base/params.def`; do not edit by hand.\n"
                 "Every parameter is an environment variable read once by `dear_init`. A bad value fails\n"
                 "`dear_init` with `DEAR_ERR_PARAM` and a message naming the variable, the value and what is\n"
                 "accepted; an unknown `DEAR_*` variable is a warning.\n\n"
                 "| variable | type | default | accepted | meaning |\n"
                 "|---|---|---|---|---|\n");
    for (int i = 0; i < DEAR_P_COUNT; i++) {
        const dear_param_desc_t *d = &dear_param_table[i];
        char accepted[256];
        accepted_text(d, accepted, sizeof accepted);
        char defval[96];
        if (d->type == DEAR_PT_SIZE || d->type == DEAR_PT_ENUM || d->type == DEAR_PT_ENUM_INT)
            accepted_text_md(d, accepted, sizeof accepted);
        param_value_t v;
        char msg[256];
        if (d->type == DEAR_PT_SIZE && parse_value((dear_param_id_t)i, d->defval, &v, msg, sizeof msg) == DEAR_OK &&
            v.i >= 1024 && v.i % 1024 == 0) {
            static const char *const units[] = { "KiB", "MiB", "GiB", "TiB" };
            long long q = v.i / 1024;
            int u = 0;
            while (q % 1024 == 0 && q >= 1024 && u < 3) {
                q /= 1024;
                u++;
            }
            snprintf(defval, sizeof defval, "`%s` (%lld %s)", d->defval, q, units[u]);
        } else {
            snprintf(defval, sizeof defval, "`%s`", d->defval[0] ? d->defval : "\"\"");
        }
        fprintf(out, "| `DEAR_%s` | %s | %s | ", d->name, type_name(d->type), defval);
        md_cell(out, accepted);
        fputs(" | ", out);
        md_cell(out, d->help);
        fputs(" |\n", out);
    }
}
