/* ref_gpu.cu - TEMPORARY PLACEHOLDER for the GPU reference (issue 5, item 3): it only lets CUDA builds link.
 * It returns DSV4_ERR_UNSUPPORTED until the GPU reference replaces this file; nothing here is a GPU path. */
#include "dsv4/dsv4_ref.h"

extern "C" int dsv4_ref_gpu_init(dsv4_model *m, int max_tokens, dsv4_ref **out)
{
    (void)m;
    (void)max_tokens;
    if (out) *out = NULL;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "ref-gpu: GPU reference not built yet (placeholder)");
}
