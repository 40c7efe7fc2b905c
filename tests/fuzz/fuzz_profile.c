/* Fuzz harness of the profile reader (dear_prof_load). A load either fails with
 * DEAR_ERR_FORMAT or gives a profile that passes dear_prof_check and survives a save and a
 * second load unchanged (times to the 9 digits the writer keeps). */
#include "tests/fuzz/fuzz.h"

#include <string.h>

#include "fusion/profile.h"
#include "include/dear_types.h"

static void expect_same(const dear_profile_t *a, const dear_profile_t *b)
{
    DEAR_FUZZ_EXPECT(strcmp(a->model, b->model) == 0, "model '%s' came back as '%s'", a->model, b->model);
    DEAR_FUZZ_EXPECT(a->nlayers == b->nlayers && a->ntensors == b->ntensors, "%d layers, %d tensors came back as %d, %d",
                     a->nlayers, a->ntensors, b->nlayers, b->ntensors);
    for (int l = 0; l < a->nlayers; l++) {
        const dear_prof_layer_t *x = &a->layers[l], *y = &b->layers[l];
        DEAR_FUZZ_EXPECT(x->id == y->id && dear_fuzz_close(x->fwd_s, y->fwd_s, 1e-8) &&
                             dear_fuzz_close(x->bwd_s, y->bwd_s, 1e-8),
                         "layer %d (%d %.17g %.17g) came back as (%d %.17g %.17g)", l, x->id, x->fwd_s, x->bwd_s,
                         y->id, y->fwd_s, y->bwd_s);
    }
    for (int i = 0; i < a->ntensors; i++) {
        const dear_prof_tensor_t *x = &a->tensors[i], *y = &b->tensors[i];
        DEAR_FUZZ_EXPECT(strcmp(x->name, y->name) == 0 && x->layer == y->layer && x->lidx == y->lidx &&
                             x->bytes == y->bytes,
                         "tensor %d (%s %d %zu) came back as (%s %d %zu)", i, x->name, x->layer, x->bytes, y->name,
                         y->layer, y->bytes);
    }
}

int dear_fuzz_one(const uint8_t *data, size_t size)
{
    char in[DEAR_FUZZ_PATH_MAX], again[DEAR_FUZZ_PATH_MAX];
    dear_fuzz_path("input", in);
    dear_fuzz_path("again", again);
    dear_fuzz_write(in, data, size);
    dear_profile_t prof = { 0 };
    int rc = dear_prof_load(in, &prof);
    DEAR_FUZZ_EXPECT(rc == DEAR_OK || rc == DEAR_ERR_FORMAT, "status %d", rc);
    if (rc == DEAR_OK) {
        char msg[256];
        DEAR_FUZZ_EXPECT(prof.ntensors > 0, "a profile without tensors was accepted");
        DEAR_FUZZ_EXPECT(dear_prof_check(&prof, msg, sizeof msg) == DEAR_OK, "accepted, then refused: %s", msg);
        dear_tensor_desc_t *descs = NULL;
        DEAR_FUZZ_EXPECT(dear_prof_descs(&prof, &descs) == DEAR_OK, "no tensor list");
        for (int i = 0; i < prof.ntensors; i++)
            DEAR_FUZZ_EXPECT(descs[i].bytes == prof.tensors[i].bytes && descs[i].layer == prof.tensors[i].layer,
                             "tensor %d differs in the tensor list", i);
        free(descs);
        dear_profile_t back = { 0 };
        DEAR_FUZZ_EXPECT(dear_prof_save(&prof, again) == DEAR_OK, "cannot save what was loaded");
        int rc2 = dear_prof_load(again, &back);
        DEAR_FUZZ_EXPECT(rc2 == DEAR_OK, "a saved profile is refused (status %d)", rc2);
        expect_same(&prof, &back);
        dear_prof_free(&back);
    }
    dear_prof_free(&prof);
    return rc;
}
