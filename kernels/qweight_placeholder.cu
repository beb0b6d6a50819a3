/* qweight_placeholder.cu - TEMPORARY: the qweight.cuh launchers before the real kernels are merged (they are
 * written in parallel against the same contract). Each returns DSV4_ERR_UNSUPPORTED, so --weights fp8 fails
 * with a clear message instead of a link error. The lead deletes this file when merging the kernels. */
#include "dsv4/dsv4.h"
#include "kernels/qweight.cuh"

extern "C" size_t dsv4_opt_fp8_linear_workspace_bytes(int n_tok, int n_out, int n_in)
{
    (void)n_tok, (void)n_out, (void)n_in;
    return 0;
}

extern "C" int dsv4_opt_fp8_linear(const dsv4_fp8_linear_params *p)
{
    (void)p;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "dsv4_opt_fp8_linear: the FP8 kernels are not merged yet");
}

extern "C" int dsv4_opt_fp4_experts(const dsv4_fp4_experts_params *p)
{
    (void)p;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "dsv4_opt_fp4_experts: the FP4 kernels are not merged yet");
}
