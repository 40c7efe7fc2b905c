/*
 * The planners: how the tensors are grouped into buckets and all-gather groups. fusion/ runs
 * them (one file each), the runtime picks one with DEAR_FUSION, dear-plan and dear-bench list
 * them.
 *
 * DEAR_PLANNER_TABLE(X) has one row per planner, in the order of dear_planner_t:
 *     X(ID, "name", FN, FLAGS, "help")
 *   FN     int FN(dear_plan_t *, const dear_plan_problem_t *) (fusion/planners.h); only fusion/
 *          expands this column
 *   FLAGS  DEAR_PLANNER_F_*
 * Adding a planner is one file in fusion/ and one row here (docs/HACKING.md).
 */
#ifndef DEAR_PLANNER_TABLE_H
#define DEAR_PLANNER_TABLE_H

/* Needs the measured profile and the cost model: the runtime starts on the threshold plan and
 * switches to this planner's once the warm-up iterations are profiled. */
#define DEAR_PLANNER_F_MODEL 0x1
/* auto compares this planner's plans (and, for dear, pairs of two planners' phases). */
#define DEAR_PLANNER_F_CANDIDATE 0x2

#define DEAR_PLANNER_TABLE(X)                                                                  \
    X(NONE, "none", dear_plan_none_p, DEAR_PLANNER_F_CANDIDATE, "one bucket per layer (WFBP)")  \
    X(THRESHOLD, "threshold", dear_plan_threshold_p, DEAR_PLANNER_F_CANDIDATE,                  \
      "buckets closed at DEAR_FUSION_THRESHOLD bytes (Horovod, PyTorch DDP, DeAR)")            \
    X(MGWFBP, "mgwfbp", dear_plan_mgwfbp, DEAR_PLANNER_F_MODEL | DEAR_PLANNER_F_CANDIDATE,     \
      "MG-WFBP's greedy merge on the linear cost model")                                       \
    X(DP, "dp", dear_plan_dp, DEAR_PLANNER_F_MODEL | DEAR_PLANNER_F_CANDIDATE,                 \
      "exact dynamic programme per phase for one FIFO channel")                                \
    X(GRADSSA, "gradssa", dear_plan_gradssa, DEAR_PLANNER_F_MODEL | DEAR_PLANNER_F_CANDIDATE,  \
      "sparrow search over fusion vectors with the simulator as fitness")                      \
    X(AUTO, "auto", dear_plan_auto, DEAR_PLANNER_F_MODEL,                                      \
      "the lowest predicted iteration time of the others, per phase for dear")

typedef enum {
#define DEAR_PLANNER_ENUM_(ID, NAME, FN, FLAGS, HELP) DEAR_PLANNER_##ID,
    DEAR_PLANNER_TABLE(DEAR_PLANNER_ENUM_)
#undef DEAR_PLANNER_ENUM_
    DEAR_PLANNER_COUNT
} dear_planner_t;

/* "none|threshold|...": DEAR_FUSION's choices, in enum order. */
#define DEAR_PLANNER_CHOICE_(ID, NAME, FN, FLAGS, HELP) "|" NAME
#define DEAR_PLANNER_CHOICES (DEAR_PLANNER_TABLE(DEAR_PLANNER_CHOICE_) + 1)

/* "none", ...; "unknown" out of range. parse returns 0 and sets *p, or -1. */
const char *dear_planner_name(dear_planner_t p);
int dear_planner_parse(const char *name, dear_planner_t *p);
unsigned dear_planner_flags(dear_planner_t p);
const char *dear_planner_help(dear_planner_t p);

#endif
