/* ref_gpu_stub.c - the GPU reference entry point of a build without CUDA (DSV4_CUDA=OFF): it exists so the
 * library links, and says plainly why there is no GPU path. */
#include "dsv4/dsv4_ref.h"

int dsv4_ref_gpu_init(dsv4_model *m, int max_tokens, dsv4_ref **out)
{
    (void)m;
    (void)max_tokens;
    if (out) *out = NULL;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "ref-gpu: this build has no CUDA (configured with DSV4_CUDA=OFF)");
}
