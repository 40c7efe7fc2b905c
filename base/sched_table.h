/*
 * The schedules: how one iteration's communication is placed around the compute. The runtime
 * runs them (runtime/sched_*.c), the simulator predicts them (fusion/sim.c), and DEAR_SCHEDULE
 * names them.
 *
 * DEAR_SCHED_TABLE(X) has one row per schedule, in the order of dear_sched_t:
 *     X(ID, "name", RUNTIME_OPS, SIM_FN, FLAGS, "help")
 *   RUNTIME_OPS  the runtime's dear_sched_ops_t (runtime/rt.h), expanded only in runtime/
 *   SIM_FN       the simulator's function for one iteration (fusion/sim.c), expanded only there
 *   FLAGS        DEAR_SCHED_F_*
 * Adding a schedule is one file in runtime/, one function in fusion/sim.c and one row here.
 */
#ifndef DEAR_SCHED_TABLE_H
#define DEAR_SCHED_TABLE_H

/* Buckets are reduce-scattered and gathered in a second phase (two partitions in a plan);
 * without it a bucket is one all-reduce. */
#define DEAR_SCHED_F_SPLIT 0x1

#define DEAR_SCHED_TABLE(X)                                                                    \
    X(DEAR, "dear", dear_sched_dear_ops, sim_dear, DEAR_SCHED_F_SPLIT,                         \
      "reduce-scatter in backward, all-gather in the next forward")                           \
    X(WFBP, "wfbp", dear_sched_wfbp_ops, sim_wfbp, 0,                                          \
      "bucketed all-reduce during backward, waited for at backward_end")                      \
    X(SYNC, "sync", dear_sched_sync_ops, sim_sync, 0, "one all-reduce after backward")

typedef enum {
#define DEAR_SCHED_ENUM_(ID, NAME, OPS, SIM, FLAGS, HELP) DEAR_SCHED_##ID,
    DEAR_SCHED_TABLE(DEAR_SCHED_ENUM_)
#undef DEAR_SCHED_ENUM_
    DEAR_SCHED_COUNT
} dear_sched_t;

/* "dear|wfbp|sync": DEAR_SCHEDULE's choices, in enum order (the literal "|dear|..." past its
 * first bar: still a constant for static initialisers). */
#define DEAR_SCHED_CHOICE_(ID, NAME, OPS, SIM, FLAGS, HELP) "|" NAME
#define DEAR_SCHED_CHOICES (DEAR_SCHED_TABLE(DEAR_SCHED_CHOICE_) + 1)

/* "dear", ...; "unknown" out of range. parse returns 0 and sets *s, or -1. */
const char *dear_sched_name(dear_sched_t s);
int dear_sched_parse(const char *name, dear_sched_t *s);
unsigned dear_sched_flags(dear_sched_t s);
const char *dear_sched_help(dear_sched_t s);

#endif
