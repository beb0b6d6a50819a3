/* probe_defs.c - the probe names of dump-format.md, their dtypes and row shapes from the config.
 *
 * The table is in model order (the order a layer computes them), which is the order the reader lists
 * datasets in and so the order in which the verifier finds the first divergence. Per-entry probes
 * (compressed_kv, indexer_kv) sit where their entries are made: after the window kv, before the indexer.
 * Row shapes that fail quietly if mixed up: attn_hc_comb is [hc_mult, hc_mult] (not [4] flattened), out is
 * [hc_mult, D] (all residual streams), indexer_scores is as wide as the entries at the LAST stored position.
 */
#include <assert.h>
#include <string.h>

#include "dump/dump_internal.h"

#define F32 DSV4_DTYPE_F32
#define I32 DSV4_DTYPE_I32
#define ALL DSV4_PROBE_ON_ALL
#define CSA DSV4_PROBE_ON_CSA
#define COMPRESSED (DSV4_PROBE_ON_CSA | DSV4_PROBE_ON_HCA)

static const dsv4_probe_def dsv4_probe_defs[] = {
    /* name              final entry dtype ndim dims                                                     on */
    {"attn_hc_pre",       0, 0, F32, 1, {DSV4_PROBE_DIM_HC, 0},                                         ALL},
    {"attn_hc_post",      0, 0, F32, 1, {DSV4_PROBE_DIM_HC, 0},                                         ALL},
    {"attn_hc_comb",      0, 0, F32, 2, {DSV4_PROBE_DIM_HC, DSV4_PROBE_DIM_HC},                         ALL},
    {"attn_in",           0, 0, F32, 1, {DSV4_PROBE_DIM_D, 0},                                          ALL},
    {"kv",                0, 0, F32, 1, {DSV4_PROBE_DIM_HEAD_DIM, 0},                                   ALL},
    {"compressed_kv",     0, 1, F32, 1, {DSV4_PROBE_DIM_HEAD_DIM, 0},                                   COMPRESSED},
    {"indexer_kv",        0, 1, F32, 1, {DSV4_PROBE_DIM_INDEX_HEAD_DIM, 0},                             CSA},
    {"indexer_scores",    0, 0, F32, 1, {DSV4_PROBE_DIM_N_ENTRIES, 0},                                  CSA},
    {"topk_idx",          0, 0, I32, 1, {DSV4_PROBE_DIM_INDEX_TOPK, 0},                                 CSA},
    {"attn_out",          0, 0, F32, 1, {DSV4_PROBE_DIM_D, 0},                                          ALL},
    {"ffn_hc_pre",        0, 0, F32, 1, {DSV4_PROBE_DIM_HC, 0},                                         ALL},
    {"ffn_hc_post",       0, 0, F32, 1, {DSV4_PROBE_DIM_HC, 0},                                         ALL},
    {"ffn_hc_comb",       0, 0, F32, 2, {DSV4_PROBE_DIM_HC, DSV4_PROBE_DIM_HC},                         ALL},
    {"ffn_in",            0, 0, F32, 1, {DSV4_PROBE_DIM_D, 0},                                          ALL},
    {"router_ids",        0, 0, I32, 1, {DSV4_PROBE_DIM_K_EXPERTS, 0},                                  ALL},
    {"router_weights",    0, 0, F32, 1, {DSV4_PROBE_DIM_K_EXPERTS, 0},                                  ALL},
    {"ffn_out",           0, 0, F32, 1, {DSV4_PROBE_DIM_D, 0},                                          ALL},
    {"out",               0, 0, F32, 2, {DSV4_PROBE_DIM_HC, DSV4_PROBE_DIM_D},                          ALL},
    {"hc_head",           1, 0, F32, 1, {DSV4_PROBE_DIM_D, 0},                                          ALL},
    {"norm",              1, 0, F32, 1, {DSV4_PROBE_DIM_D, 0},                                          ALL},
    {"logits",            1, 0, F32, 1, {DSV4_PROBE_DIM_VOCAB, 0},                                      ALL},
};
#define DSV4_PROBE_DEF_COUNT ((int)(sizeof dsv4_probe_defs / sizeof dsv4_probe_defs[0]))
/* dump-format.md lists 18 layer probes (two are per-entry) and 3 final ones: a new probe goes in both. */
static_assert(sizeof dsv4_probe_defs / sizeof dsv4_probe_defs[0] == 21, "probe table out of sync with dump-format.md");

#undef F32
#undef I32
#undef ALL
#undef CSA
#undef COMPRESSED

const dsv4_probe_def *dsv4_probe_def_find(int final, const char *name)
{
    if (!name) return NULL;
    for (int i = 0; i < DSV4_PROBE_DEF_COUNT; i++)
        if (dsv4_probe_defs[i].final == (final != 0) && strcmp(dsv4_probe_defs[i].name, name) == 0)
            return &dsv4_probe_defs[i];
    return NULL;
}

int dsv4_probe_def_rank(int final, const char *name)
{
    const dsv4_probe_def *def = dsv4_probe_def_find(final, name);
    return def ? (int)(def - dsv4_probe_defs) : DSV4_PROBE_DEF_COUNT;
}

int dsv4_probe_def_row_shape(const dsv4_probe_def *def, const dsv4_config *cfg, int layer, int64_t last_pos,
                             int64_t shape[2])
{
    int ratio = 0;
    if (!def->final) {
        DSV4_CHECK(layer >= 0 && layer < cfg->num_hidden_layers && layer < DSV4_MAX_LAYERS,
                   "probe %s: layer %d out of range [0, %d)", def->name, layer, cfg->num_hidden_layers);
        dsv4_attn_type at = cfg->attn_type[layer];
        DSV4_CHECK((def->on >> at) & 1u, "probe %s does not exist on layer %d (attention %s)", def->name, layer,
                   dsv4_attn_type_name(at));
        ratio = cfg->compress_ratio[layer];
    }
    for (int i = 0; i < def->row_ndim; i++) {
        int64_t v = 0;
        switch (def->dims[i]) {
        case DSV4_PROBE_DIM_HC: v = cfg->hc_mult; break;
        case DSV4_PROBE_DIM_D: v = cfg->hidden_size; break;
        case DSV4_PROBE_DIM_HEAD_DIM: v = cfg->head_dim; break;
        case DSV4_PROBE_DIM_INDEX_HEAD_DIM: v = cfg->index_head_dim; break;
        case DSV4_PROBE_DIM_INDEX_TOPK: v = cfg->index_topk; break;
        case DSV4_PROBE_DIM_K_EXPERTS: v = cfg->num_experts_per_tok; break;
        case DSV4_PROBE_DIM_VOCAB: v = cfg->vocab_size; break;
        case DSV4_PROBE_DIM_N_ENTRIES:
            DSV4_CHECK(ratio > 0, "probe %s: layer %d has no compressor", def->name, layer);
            v = last_pos >= 0 ? (last_pos + 1) / ratio : 0;
            break;
        case DSV4_PROBE_DIM_COUNT: break;
        }
        shape[i] = v;
    }
    return 0;
}
