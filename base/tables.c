/* Names, flags and help of the extension tables (algo_table.h, sched_table.h,
 * planner_table.h, transport_table.h), generated from their rows. */
#include <string.h>

#include "base/algo_table.h"
#include "base/planner_table.h"
#include "base/sched_table.h"
#include "base/transport_table.h"

/* One extension table's columns, indexed by its enum. */
typedef struct {
    int n;
    const char *const *names;
    const unsigned *flags;      /* NULL: none */
    const char *const *help;    /* NULL: none */
} table_t;

static const char *name_of(const table_t *t, int i) { return (unsigned)i < (unsigned)t->n ? t->names[i] : "unknown"; }
static unsigned flags_of(const table_t *t, int i) { return t->flags && (unsigned)i < (unsigned)t->n ? t->flags[i] : 0; }
static const char *help_of(const table_t *t, int i) { return t->help && (unsigned)i < (unsigned)t->n ? t->help[i] : ""; }

/* Index of name in the table, or -1. */
static int index_of(const table_t *t, const char *name)
{
    for (int i = 0; name && i < t->n; i++)
        if (strcmp(t->names[i], name) == 0)
            return i;
    return -1;
}

/* parse: index of name into *out (an enum of the table), 0; or -1 leaving *out alone. */
#define TABLE_PARSE_(table, name, out, type)                                                   \
    do {                                                                                       \
        int i_ = index_of(table, name);                                                        \
        if (i_ < 0)                                                                            \
            return -1;                                                                         \
        *(out) = (type)i_;                                                                     \
        return 0;                                                                              \
    } while (0)

/* ---- collective operations and algorithms ---- */

static const char *const op_names[DEAR_COLL_OP_COUNT] = { "reduce_scatter", "allgather", "allreduce" };
static const char *const op_short[DEAR_COLL_OP_COUNT] = { "rs", "ag", "ar" };
static const table_t ops_long = { DEAR_COLL_OP_COUNT, op_names, NULL, NULL };
static const table_t ops_short = { DEAR_COLL_OP_COUNT, op_short, NULL, NULL };

const char *dear_coll_op_name(dear_coll_op_t op) { return name_of(&ops_long, op); }
const char *dear_coll_op_short(dear_coll_op_t op) { return name_of(&ops_short, op); }

int dear_coll_op_parse(const char *shortname, dear_coll_op_t *op)
{
    TABLE_PARSE_(&ops_short, shortname, op, dear_coll_op_t);
}

#define ALGO_NAME_(ID, NAME, OPS, FLAGS, HELP) NAME,
#define ALGO_FLAGS_(ID, NAME, OPS, FLAGS, HELP) FLAGS,
#define ALGO_HELP_(ID, NAME, OPS, FLAGS, HELP) HELP,
static const char *const algo_names[DEAR_ALGO_COUNT] = { "auto", DEAR_COLL_ALGO_TABLE(ALGO_NAME_) };
static const unsigned algo_flags[DEAR_ALGO_COUNT] = { 0, DEAR_COLL_ALGO_TABLE(ALGO_FLAGS_) };
static const char *const algo_help[DEAR_ALGO_COUNT] = { "the selection table by size, ranks and hosts",
                                                        DEAR_COLL_ALGO_TABLE(ALGO_HELP_) };
static const table_t algos = { DEAR_ALGO_COUNT, algo_names, algo_flags, algo_help };

const char *dear_coll_algo_name(dear_coll_algo_t algo) { return name_of(&algos, algo); }
unsigned dear_coll_algo_flags(dear_coll_algo_t algo) { return flags_of(&algos, algo); }
const char *dear_coll_algo_help(dear_coll_algo_t algo) { return help_of(&algos, algo); }

int dear_coll_algo_parse(const char *name, dear_coll_algo_t *algo)
{
    TABLE_PARSE_(&algos, name, algo, dear_coll_algo_t);
}

/* ---- schedules ---- */

#define SCHED_NAME_(ID, NAME, OPS, SIM, FLAGS, HELP) NAME,
#define SCHED_FLAGS_(ID, NAME, OPS, SIM, FLAGS, HELP) FLAGS,
#define SCHED_HELP_(ID, NAME, OPS, SIM, FLAGS, HELP) HELP,
static const char *const sched_names[DEAR_SCHED_COUNT] = { DEAR_SCHED_TABLE(SCHED_NAME_) };
static const unsigned sched_flags[DEAR_SCHED_COUNT] = { DEAR_SCHED_TABLE(SCHED_FLAGS_) };
static const char *const sched_help[DEAR_SCHED_COUNT] = { DEAR_SCHED_TABLE(SCHED_HELP_) };
static const table_t scheds = { DEAR_SCHED_COUNT, sched_names, sched_flags, sched_help };

const char *dear_sched_name(dear_sched_t s) { return name_of(&scheds, s); }
unsigned dear_sched_flags(dear_sched_t s) { return flags_of(&scheds, s); }
const char *dear_sched_help(dear_sched_t s) { return help_of(&scheds, s); }

int dear_sched_parse(const char *name, dear_sched_t *s)
{
    TABLE_PARSE_(&scheds, name, s, dear_sched_t);
}

/* ---- planners ---- */

#define PLANNER_NAME_(ID, NAME, FN, FLAGS, HELP) NAME,
#define PLANNER_FLAGS_(ID, NAME, FN, FLAGS, HELP) FLAGS,
#define PLANNER_HELP_(ID, NAME, FN, FLAGS, HELP) HELP,
static const char *const planner_names[DEAR_PLANNER_COUNT] = { DEAR_PLANNER_TABLE(PLANNER_NAME_) };
static const unsigned planner_flags[DEAR_PLANNER_COUNT] = { DEAR_PLANNER_TABLE(PLANNER_FLAGS_) };
static const char *const planner_help[DEAR_PLANNER_COUNT] = { DEAR_PLANNER_TABLE(PLANNER_HELP_) };
static const table_t planners = { DEAR_PLANNER_COUNT, planner_names, planner_flags, planner_help };

const char *dear_planner_name(dear_planner_t p) { return name_of(&planners, p); }
unsigned dear_planner_flags(dear_planner_t p) { return flags_of(&planners, p); }
const char *dear_planner_help(dear_planner_t p) { return help_of(&planners, p); }

int dear_planner_parse(const char *name, dear_planner_t *p)
{
    TABLE_PARSE_(&planners, name, p, dear_planner_t);
}

/* ---- transports ---- */

#define TRANSPORT_NAME_(ID, NAME, OPS, FLAGS, HELP) NAME,
#define TRANSPORT_FLAGS_(ID, NAME, OPS, FLAGS, HELP) FLAGS,
#define TRANSPORT_HELP_(ID, NAME, OPS, FLAGS, HELP) HELP,
static const char *const transport_names[DEAR_TRANSPORT_COUNT] = { "auto", DEAR_TRANSPORT_TABLE(TRANSPORT_NAME_) };
static const unsigned transport_flags[DEAR_TRANSPORT_COUNT] = { 0, DEAR_TRANSPORT_TABLE(TRANSPORT_FLAGS_) };
static const char *const transport_help[DEAR_TRANSPORT_COUNT] = {
    "a transport flagged for jobs across hosts when the job spans hosts, else mpi",
    DEAR_TRANSPORT_TABLE(TRANSPORT_HELP_)
};
static const table_t transports = { DEAR_TRANSPORT_COUNT, transport_names, transport_flags, transport_help };

const char *dear_transport_id_name(dear_transport_id_t t) { return name_of(&transports, t); }
unsigned dear_transport_id_flags(dear_transport_id_t t) { return flags_of(&transports, t); }
const char *dear_transport_id_help(dear_transport_id_t t) { return help_of(&transports, t); }

int dear_transport_id_parse(const char *name, dear_transport_id_t *t)
{
    TABLE_PARSE_(&transports, name, t, dear_transport_id_t);
}
