/* ref_gpu_stub.c - the GPU reference entry points of a build without CUDA (DSV4_CUDA=OFF): they exist so the
 * library links, and say plainly why there is no GPU path. Options that do not fit the model are refused first,
 * with the message a CUDA build gives, so a bad --follow table reads the same in both builds. */
#include "../ref_model.h"

int dsv4_ref_gpu_init(dsv4_model *m, int max_tokens, dsv4_ref **out)
{
    return dsv4_ref_gpu_init_opts(m, max_tokens, NULL, out);
}

int dsv4_ref_gpu_init_opts(dsv4_model *m, int max_tokens, const dsv4_ref_options *o, dsv4_ref **out)
{
    (void)max_tokens;
    DSV4_CHECK(m && out, "dsv4_ref_gpu_init: NULL argument");
    *out = NULL;
    if (o) {
        int rc = dsv4_ref_options_check(dsv4_model_config(m), o, "ref-gpu");
        if (rc) return rc;
    }
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "ref-gpu: this build has no CUDA (configured with DSV4_CUDA=OFF)");
}
