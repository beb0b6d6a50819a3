/* opt_stub.c - the optimized path's entry points in a build without CUDA: the options work (optimized/opt_options.c,
 * so the command line parses the switches), everything that needs a GPU returns DSV4_ERR_UNSUPPORTED "this build
 * has no CUDA". */
#include <string.h>

#include "dsv4/dsv4_opt.h"

int dsv4_opt_init(dsv4_model *m, const dsv4_opt_options *o, dsv4_opt **out)
{
    (void)m;
    (void)o;
    if (out) *out = NULL;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA");
}
void dsv4_opt_free(dsv4_opt *o) { (void)o; }
int dsv4_opt_step(dsv4_opt *o, const int32_t *tokens, const uint8_t *active, dsv4_probe_sink *probe,
                  float *logits, int32_t *next)
{
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA");
}
int dsv4_opt_step_ragged(dsv4_opt *o, const int32_t *tokens, const int32_t *n_tok, dsv4_probe_sink *probe,
                         float *logits, int32_t *next)
{
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA");
}
int dsv4_opt_step_budget(const dsv4_opt *o) { return 0; }
int dsv4_opt_stage_timing(dsv4_opt *o, int on)
{
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA");
}
int dsv4_opt_stage_times(const dsv4_opt *o, dsv4_opt_kernel_time *out, int max_out, int *n_out, int *steps)
{
    if (n_out) *n_out = 0;
    if (steps) *steps = 0;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA");
}
int dsv4_opt_position(const dsv4_opt *o, int seq) { return 0; }
int dsv4_opt_reset(dsv4_opt *o, int seq) { return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA"); }
int dsv4_opt_dump_entries(dsv4_opt *o, dsv4_probe_sink *probe)
{
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA");
}
const char *dsv4_opt_producer(const dsv4_opt *o) { return "dsv4 " DSV4_VERSION " optimized (no CUDA)"; }
long dsv4_opt_device_alloc_count(void) { return 0; }
int dsv4_opt_nccl_timing(dsv4_opt *o, int on)
{
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA");
}
int dsv4_opt_nccl_time(const dsv4_opt *o, double *us, int *calls_per_step, int *steps)
{
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA");
}
void dsv4_opt_memory(const dsv4_opt *o, size_t *weights, size_t *state, size_t *scratch)
{
    if (weights) *weights = 0;
    if (state) *state = 0;
    if (scratch) *scratch = 0;
}
dsv4_opt_weights dsv4_opt_weights_mode(const dsv4_opt *o)
{
    (void)o;
    return DSV4_OPT_WEIGHTS_AUTO;
}
size_t dsv4_opt_layer_weight_bytes(const dsv4_opt *o, int layer)
{
    (void)o, (void)layer;
    return 0;
}
int dsv4_opt_follow_stats_get(dsv4_opt *o, dsv4_opt_follow_stats *s)
{
    if (s) memset(s, 0, sizeof *s);
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized path: this build has no CUDA");
}
