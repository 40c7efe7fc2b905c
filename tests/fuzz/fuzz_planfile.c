/* Fuzz harness of the plan-file reader (dear_planfile_load). The input is loaded for as many
 * tensors as its first 'tensors COUNT' line says (0 without one, at most FUZZ_MAX_TENSORS: a
 * caller registers only tensors it holds), so the parser runs to the end rather than stopping
 * at a count mismatch. A load either fails (DEAR_ERR_FORMAT, or DEAR_ERR_MISMATCH when the
 * count was not that line's) or gives a plan that validates for that count and survives a save
 * and a second load unchanged. An accepted file is then loaded against registered tensors t0,
 * t1, ... so the tensor comparison runs too. */
#include "tests/fuzz/fuzz.h"

#include <string.h>

#include "base/textio.h"
#include "fusion/planfile.h"
#include "include/dear_types.h"

/* Tensors registered for the loads, and made up with names for the second one: at most. */
#define FUZZ_MAX_TENSORS 65536
#define FUZZ_MAX_NAMED 4096

/* COUNT of the first line that reads 'tensors COUNT' before any '#' (capped), else 0. */
static int tensors_line(const uint8_t *data, size_t size)
{
    char line[128];
    size_t pos = 0;
    while (dear_fuzz_next_line(data, size, &pos, line, sizeof line)) {
        line[strcspn(line, "#")] = '\0';
        char *f[3];
        int count;
        if (dear_text_fields(line, f, 2) == 2 && strcmp(f[0], "tensors") == 0 && dear_text_int(f[1], &count) == 0 &&
            count >= 0)
            return count < FUZZ_MAX_TENSORS ? count : FUZZ_MAX_TENSORS;
    }
    return 0;
}

static void load_named(const char *path, int n)
{
    dear_tensor_desc_t *t = malloc(sizeof *t * (size_t)n);
    char (*name)[16] = malloc(sizeof *name * (size_t)n);
    const char **names = malloc(sizeof *names * (size_t)n);
    DEAR_FUZZ_EXPECT(t && name && names, "out of memory for %d tensors", n);
    for (int i = 0; i < n; i++) {
        t[i] = (dear_tensor_desc_t){ .bytes = (size_t)i + 1, .layer = i };
        snprintf(name[i], sizeof name[i], "t%d", i);
        names[i] = name[i];
    }
    dear_plan_t plan = { 0 };
    int rc = dear_planfile_load(path, n, t, names, &plan);
    DEAR_FUZZ_EXPECT(rc == DEAR_OK || rc == DEAR_ERR_MISMATCH, "well formed, then status %d", rc);
    dear_plan_free(&plan);
    free(names);
    free(name);
    free(t);
}

int dear_fuzz_one(const uint8_t *data, size_t size)
{
    char in[DEAR_FUZZ_PATH_MAX], again[DEAR_FUZZ_PATH_MAX];
    dear_fuzz_path("input", in);
    dear_fuzz_path("again", again);
    dear_fuzz_write(in, data, size);
    int n = tensors_line(data, size);
    dear_plan_t plan = { 0 }, back = { 0 };
    int rc = dear_planfile_load(in, n, NULL, NULL, &plan);
    DEAR_FUZZ_EXPECT(rc == DEAR_OK || rc == DEAR_ERR_FORMAT || rc == DEAR_ERR_MISMATCH, "status %d", rc);
    if (rc == DEAR_OK) {
        char msg[256];
        DEAR_FUZZ_EXPECT(plan.ntensors == n && plan.nunits >= n, "loaded for %d tensors, the plan has %d in %d units",
                         n, plan.ntensors, plan.nunits);
        DEAR_FUZZ_EXPECT(dear_plan_validate(&plan, n, msg, sizeof msg) == DEAR_OK, "accepted, then refused: %s", msg);
        DEAR_FUZZ_EXPECT(plan.ag_early >= 0 && plan.ag_early <= plan.ag.ngroups, "early %d of %d groups",
                         plan.ag_early, plan.ag.ngroups);
        DEAR_FUZZ_EXPECT(dear_planfile_save(again, &plan, NULL, NULL) == DEAR_OK, "cannot save what was loaded");
        int rc2 = dear_planfile_load(again, n, NULL, NULL, &back);
        DEAR_FUZZ_EXPECT(rc2 == DEAR_OK, "a saved plan is refused (status %d)", rc2);
        /* A plan without a planner line is written as made by "unknown". */
        const char *planner = plan.planner[0] ? plan.planner : "unknown";
        DEAR_FUZZ_EXPECT(dear_plan_equal(&plan, &back) && strcmp(planner, back.planner) == 0,
                         "the plan (planner '%s') changed through a save and a load", planner);
        if (n > 0 && n <= FUZZ_MAX_NAMED)
            load_named(in, n);
    }
    dear_plan_free(&back);
    dear_plan_free(&plan);
    return rc;
}
