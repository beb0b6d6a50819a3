/* opt_options.c - the optimized path's options: defaults, the switches' names, parsing one switch and the range
 * checks of dsv4_opt_options (dsv4_opt.h). Host-only C, the same file in the CUDA build and in the build without
 * CUDA (where the command line still parses the switches), so the two cannot drift apart. */
#include <stdio.h>
#include <string.h>

#include "dsv4/dsv4_opt.h"
#include "reference/ref_shard.h"

void dsv4_opt_options_default(dsv4_opt_options *o)
{
    memset(o, 0, sizeof *o);
    o->n_seq = 1;
    o->max_context = 4096;
    o->cuda_graph = 1;
    o->expert_lanes = 4;
}

static const char *const attn_names[] = {"mma", "simt"};
static const char *const indexer_names[] = {"bf16", "fp32"};
static const char *const mhc_names[] = {"castfree", "roundtrip"};
static const char *const ictx_names[] = {"live", "max"};
static const char *const kv_names[] = {"bf16", "fp8"};
_Static_assert(DSV4_OPT_ATTN_SIMT == 1 && DSV4_OPT_INDEXER_FP32 == 1 && DSV4_OPT_MHC_ROUNDTRIP == 1 &&
                   DSV4_OPT_INDEX_MAX == 1 && DSV4_OPT_KV_FP8 == 1, "switch name tables have two entries");

const char *dsv4_opt_attn_name(dsv4_opt_attn v) { return (unsigned)v < 2 ? attn_names[v] : "?"; }
const char *dsv4_opt_indexer_name(dsv4_opt_indexer v) { return (unsigned)v < 2 ? indexer_names[v] : "?"; }
const char *dsv4_opt_mhc_name(dsv4_opt_mhc v) { return (unsigned)v < 2 ? mhc_names[v] : "?"; }
const char *dsv4_opt_index_context_name(dsv4_opt_index_context v) { return (unsigned)v < 2 ? ictx_names[v] : "?"; }
const char *dsv4_opt_kv_name(dsv4_opt_kv v) { return (unsigned)v < 2 ? kv_names[v] : "?"; }
static const char *const weights_names[] = {"auto", "bf16", "fp8"};
static const char *const quantize_names[] = {"none", "fp8"};
_Static_assert(DSV4_OPT_WEIGHTS_FP8 == 2 && DSV4_OPT_QUANTIZE_FP8 == 1, "weights / quantize name tables");
const char *dsv4_opt_weights_name(dsv4_opt_weights v) { return (unsigned)v < 3 ? weights_names[v] : "?"; }
const char *dsv4_opt_quantize_name(dsv4_opt_quantize v) { return (unsigned)v < 2 ? quantize_names[v] : "?"; }

/* value's index among the n names, or a usage error listing them all */
static int pick_of(const char *const *names, int n, const char *name, const char *value, int *out)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(value, names[i])) {
            *out = i;
            return 0;
        }
    char want[128] = ""; /* "a, b or c" */
    for (int i = 0, len = 0; i < n && len < (int)sizeof want; i++)
        len += snprintf(want + len, sizeof want - (size_t)len, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
                        names[i]);
    return dsv4_error(DSV4_ERR_USAGE, "--%s '%s': want %s", name, value, want);
}
static int pick(const char *const names[2], const char *name, const char *value, int *out)
{
    return pick_of(names, 2, name, value, out);
}

int dsv4_opt_options_set(dsv4_opt_options *o, const char *name, const char *value)
{
    int v = 0, rc;
    if (!strcmp(name, "attn")) {
        if (!(rc = pick(attn_names, name, value, &v))) o->attn = (dsv4_opt_attn)v;
    } else if (!strcmp(name, "indexer")) {
        if (!(rc = pick(indexer_names, name, value, &v))) o->indexer = (dsv4_opt_indexer)v;
    } else if (!strcmp(name, "mhc")) {
        if (!(rc = pick(mhc_names, name, value, &v))) o->mhc = (dsv4_opt_mhc)v;
    } else if (!strcmp(name, "index-context")) {
        if (!(rc = pick(ictx_names, name, value, &v))) o->index_context = (dsv4_opt_index_context)v;
    } else if (!strcmp(name, "kv")) {
        if (!(rc = pick(kv_names, name, value, &v))) o->kv = (dsv4_opt_kv)v;
    } else if (!strcmp(name, "weights")) {
        if (!(rc = pick_of(weights_names, 3, name, value, &v))) o->weights = (dsv4_opt_weights)v;
    } else if (!strcmp(name, "quantize")) {
        if (!(rc = pick(quantize_names, name, value, &v))) o->quantize = (dsv4_opt_quantize)v;
    } else {
        rc = dsv4_error(DSV4_ERR_USAGE, "unknown switch '%s' (attn, indexer, mhc, index-context, kv, weights, "
                        "quantize)", name);
    }
    return rc;
}

/* An API caller can put any int in an enum: a value past the last one ran as the default of some switches
 * (kv, index-context, quantize), failed at the first step for others (attn, indexer) and mixed the two mHC
 * variants (pre roundtrip, post cast-free). */
int dsv4_opt_options_check(const dsv4_opt_options *op)
{
    DSV4_CHECK(op != NULL, "optimized: options are NULL");
    DSV4_CHECK(op->n_seq >= 1 && op->n_seq <= DSV4_OPT_MAX_SEQ, "optimized: n_seq %d outside [1, %d]", op->n_seq,
               DSV4_OPT_MAX_SEQ);
    DSV4_CHECK(op->max_context >= 1 && op->max_context <= DSV4_OPT_MAX_CONTEXT,
               "optimized: max_context %d outside [1, 2^20]", op->max_context);
    DSV4_CHECK(op->n_gpus >= 0 && op->n_gpus <= DSV4_REF_SHARD_MAX,
               "optimized: n_gpus %d outside [0, %d] (0: one GPU without NCCL)", op->n_gpus, DSV4_REF_SHARD_MAX);
    DSV4_CHECK(op->dump_seq >= 0 && op->dump_seq < op->n_seq, "optimized: dump_seq %d outside [0, %d)", op->dump_seq,
               op->n_seq);
    DSV4_CHECK(op->max_step_tokens >= 0 && op->max_step_tokens <= DSV4_OPT_MAX_STEP_TOKENS,
               "optimized: max_step_tokens %d outside [0, %d] (0: n_seq, decode steps only)", op->max_step_tokens,
               DSV4_OPT_MAX_STEP_TOKENS);
    DSV4_CHECK(op->expert_lanes >= 1 && op->expert_lanes <= DSV4_OPT_MAX_EXPERT_LANES,
               "optimized: expert_lanes %d outside [1, %d] (1: the experts' GEMMs one after another)",
               op->expert_lanes, DSV4_OPT_MAX_EXPERT_LANES);
    const struct {
        const char *name;
        unsigned v, n;
    } sw[] = {{"attn", (unsigned)op->attn, 2},       {"indexer", (unsigned)op->indexer, 2},
              {"mhc", (unsigned)op->mhc, 2},         {"index_context", (unsigned)op->index_context, 2},
              {"kv", (unsigned)op->kv, 2},           {"weights", (unsigned)op->weights, 3},
              {"quantize", (unsigned)op->quantize, 2}, {"prefill_experts", (unsigned)op->prefill_experts, 2},
              {"prefill_linears", (unsigned)op->prefill_linears, 2}, {"prefill_mhc", (unsigned)op->prefill_mhc, 2}};
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
        DSV4_CHECK(sw[i].v < sw[i].n, "optimized: options.%s = %d is not one of its %u values", sw[i].name,
                   (int)sw[i].v, sw[i].n);
    return 0;
}
