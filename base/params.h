/* The DEAR_* parameter table (base/params.def) and its values. dear_params_load reads the
 * environment once per dear_init; the getters return the cached values. A bad value is an
 * error naming the variable, the value and what is accepted; an unknown DEAR_* variable is a
 * warning (likely a typo). */
#ifndef DEAR_PARAMS_H
#define DEAR_PARAMS_H

#include <stdio.h>

typedef enum {
    DEAR_PT_INT, DEAR_PT_SIZE, DEAR_PT_DOUBLE, DEAR_PT_BOOL, DEAR_PT_ENUM, DEAR_PT_ENUM_INT, DEAR_PT_STRING
} dear_param_type_t;

typedef enum {
#define DEAR_PARAM(NAME, TYPE, DEFAULT, MIN, MAX, CHOICES, HELP) DEAR_P_##NAME,
#include "base/params.def"
#undef DEAR_PARAM
    DEAR_P_COUNT
} dear_param_id_t;

typedef struct {
    const char *name;           /* without the DEAR_ prefix */
    dear_param_type_t type;
    const char *defval;
    double min, max;
    const char *choices;
    const char *help;
} dear_param_desc_t;

extern const dear_param_desc_t dear_param_table[DEAR_P_COUNT];

/* Read and validate every DEAR_* variable. Returns DEAR_OK or DEAR_ERR_PARAM (logged). On
 * error the previous values stay in force. */
int dear_params_load(void);
/* Validate one value without touching the cache, and give it as dear_param_int would (a size's
 * suffix applied), for tools that take a parameter's value on their command line (and tests).
 * msg gets the error text. */
int dear_param_parse_int(dear_param_id_t id, const char *text, long long *value, char *msg, size_t msglen);

long long dear_param_int(dear_param_id_t id);      /* INT, SIZE, BOOL, ENUM_INT (-1 for a choice) */
double dear_param_double(dear_param_id_t id);      /* DOUBLE (and numeric types) */
int dear_param_enum(dear_param_id_t id);           /* ENUM, ENUM_INT: index in CHOICES, -1 for an integer */
const char *dear_param_string(dear_param_id_t id); /* the value as text, for every type */
int dear_param_from_env(dear_param_id_t id);       /* 1 if set in the environment */

/* Print "DEAR_NAME = value (default|environment)" lines for the environment as dear_init would
 * read it now; a value that would fail is marked INVALID. Returns the number of invalid values.
 * dear_params_markdown prints the Markdown text of docs/PARAMS.md. */
int dear_params_print(FILE *out, const char *prefix);
void dear_params_markdown(FILE *out);

#endif
