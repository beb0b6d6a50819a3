/* opt_stub.c - the optimized path's entry points in a build without CUDA: options work (so the command line
 * parses the switches), everything that needs a GPU returns DSV4_ERR_UNSUPPORTED "this build has no CUDA". */
#include <string.h>

#include "dsv4/dsv4_opt.h"

void dsv4_opt_options_default(dsv4_opt_options *o)
{
    memset(o, 0, sizeof *o);
    o->n_seq = 1;
    o->max_context = 4096;
    o->cuda_graph = 1;
}

static const char *name2(int v, const char *a, const char *b) { return v == 0 ? a : v == 1 ? b : "?"; }
const char *dsv4_opt_attn_name(dsv4_opt_attn v) { return name2(v, "mma", "simt"); }
const char *dsv4_opt_indexer_name(dsv4_opt_indexer v) { return name2(v, "bf16", "fp32"); }
const char *dsv4_opt_mhc_name(dsv4_opt_mhc v) { return name2(v, "castfree", "roundtrip"); }
const char *dsv4_opt_index_context_name(dsv4_opt_index_context v) { return name2(v, "live", "max"); }
const char *dsv4_opt_kv_name(dsv4_opt_kv v) { return name2(v, "bf16", "fp8"); }
const char *dsv4_opt_weights_name(dsv4_opt_weights v) { return v == 0 ? "auto" : name2(v - 1, "bf16", "fp8"); }
const char *dsv4_opt_quantize_name(dsv4_opt_quantize v) { return name2(v, "none", "fp8"); }

int dsv4_opt_options_set(dsv4_opt_options *o, const char *name, const char *value)
{
    static const char *const names[5][3] = {{"attn", "mma", "simt"},       {"indexer", "bf16", "fp32"},
                                            {"mhc", "castfree", "roundtrip"}, {"index-context", "live", "max"},
                                            {"kv", "bf16", "fp8"}};
    if (!strcmp(name, "weights") || !strcmp(name, "quantize")) {
        const int w = name[0] == 'w';
        const char *a = w ? "bf16" : "none", *b = "fp8";
        if (w && !strcmp(value, "auto")) o->weights = DSV4_OPT_WEIGHTS_AUTO;
        else if (!strcmp(value, a) || !strcmp(value, b)) {
            if (w) o->weights = !strcmp(value, a) ? DSV4_OPT_WEIGHTS_BF16 : DSV4_OPT_WEIGHTS_FP8;
            else o->quantize = !strcmp(value, a) ? DSV4_OPT_QUANTIZE_NONE : DSV4_OPT_QUANTIZE_FP8;
        } else return dsv4_error(DSV4_ERR_USAGE, "--%s '%s': want %s or %s", name, value, a, b);
        return 0;
    }
    for (int i = 0; i < 5; i++) {
        if (strcmp(name, names[i][0])) continue;
        int v = !strcmp(value, names[i][1]) ? 0 : !strcmp(value, names[i][2]) ? 1 : -1;
        if (v < 0)
            return dsv4_error(DSV4_ERR_USAGE, "--%s '%s': want %s or %s", name, value, names[i][1], names[i][2]);
        if (i == 0) o->attn = (dsv4_opt_attn)v;
        else if (i == 1) o->indexer = (dsv4_opt_indexer)v;
        else if (i == 2) o->mhc = (dsv4_opt_mhc)v;
        else if (i == 3) o->index_context = (dsv4_opt_index_context)v;
        else o->kv = (dsv4_opt_kv)v;
        return 0;
    }
    return dsv4_error(DSV4_ERR_USAGE, "unknown switch '%s' (attn, indexer, mhc, index-context, kv, weights, quantize)", name);
}

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
