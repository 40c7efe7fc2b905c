/*
 * The deterministic mode (DEAR_DETERMINISTIC): every sum is taken in rank order by the direct
 * exchange, so that results do not depend on the plan. dear_init agrees on the setting across the
 * ranks (the collectives read it from the parameter table); this row holds it for the runtime's
 * other features, which ask dear_determ_on, and for the pairs it meets (sparse tensors give way;
 * clipping then adds its squares exactly).
 */
#include "base/params.h"
#include "runtime/rt.h"

int dear_determ_on(const dear_ctx_t *ctx) { return ctx->determ.on; }

static int determ_decide(dear_ctx_t *ctx)
{
    ctx->determ.on = (int)dear_param_int(DEAR_P_DETERMINISTIC);
    return DEAR_OK;
}

const dear_feature_t dear_feature_determ = {
    .decide = determ_decide,
    .on = dear_determ_on,
};
