/* naming.c - the three on-disk namings of model-spec §2 mapped to ONE canonical naming (the official
 * checkpoint names, dsv4.h).
 *
 *   official       layers.L.attn.wq_a.weight (+ layers.L.attn.wq_a.scale), embed.weight, head.weight, hc_head_fn
 *   transformers   model.layers.L.self_attn.q_a_proj.weight, mlp.experts.gate_up_proj [E,2I,D] (fused),
 *                  model.embed_tokens.weight, lm_head.weight, model.hc_head.hc_fn
 *   save_pretrained model.layers.L.<official suffix>, except attn.norm.weight = the kv norm; head.weight
 *
 * Quiet traps:
 * - "attn_hc.scale" / "ffn_hc.scale" are mHC parameters, not FP8 scale siblings; they are matched before
 *   any ".scale" suffix is stripped.
 * - In the save layout "attn.norm.weight" is the kv norm (official attn.kv_norm.weight), while
 *   "attn.compressor.norm.weight" keeps its official meaning.
 * - FP8 scale siblings come as "<base>.scale" (official), "<base>.weight.scale" or "<base>.weight_scale_inv"
 *   (transformers' FP8 quantizer); all become canonical "<base>.scale".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

typedef struct rename_rule {
    const char *from, *to;
} rename_rule;

/* transformers suffixes after "model.layers.L." (or "layers.L."), exact matches. */
static const rename_rule tf_layer_rules[] = {
    {"attn_hc.fn", "hc_attn_fn"},
    {"attn_hc.base", "hc_attn_base"},
    {"attn_hc.scale", "hc_attn_scale"},
    {"ffn_hc.fn", "hc_ffn_fn"},
    {"ffn_hc.base", "hc_ffn_base"},
    {"ffn_hc.scale", "hc_ffn_scale"},
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.sinks", "attn.attn_sink"},
    {"self_attn.q_a_proj.weight", "attn.wq_a.weight"},
    {"self_attn.q_a_norm.weight", "attn.q_norm.weight"},
    {"self_attn.q_b_proj.weight", "attn.wq_b.weight"},
    {"self_attn.kv_proj.weight", "attn.wkv.weight"},
    {"self_attn.kv_norm.weight", "attn.kv_norm.weight"},
    {"self_attn.o_a_proj.weight", "attn.wo_a.weight"},
    {"self_attn.o_b_proj.weight", "attn.wo_b.weight"},
    {"self_attn.compressor.kv_proj.weight", "attn.compressor.wkv.weight"},
    {"self_attn.compressor.gate_proj.weight", "attn.compressor.wgate.weight"},
    {"self_attn.compressor.position_bias", "attn.compressor.ape"},
    {"self_attn.compressor.kv_norm.weight", "attn.compressor.norm.weight"},
    {"self_attn.compressor.indexer.q_b_proj.weight", "attn.indexer.wq_b.weight"},
    {"self_attn.compressor.indexer.weights_proj.weight", "attn.indexer.weights_proj.weight"},
    {"self_attn.compressor.indexer.scorer.weights_proj.weight", "attn.indexer.weights_proj.weight"},
    {"self_attn.compressor.indexer.kv_proj.weight", "attn.indexer.compressor.wkv.weight"},
    {"self_attn.compressor.indexer.gate_proj.weight", "attn.indexer.compressor.wgate.weight"},
    {"self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape"},
    {"self_attn.compressor.indexer.kv_norm.weight", "attn.indexer.compressor.norm.weight"},
    {"mlp.gate.weight", "ffn.gate.weight"},
    {"mlp.gate.tid2eid", "ffn.gate.tid2eid"},
    {"mlp.gate.e_score_correction_bias", "ffn.gate.bias"},
    {"mlp.shared_experts.gate_proj.weight", "ffn.shared_experts.w1.weight"},
    {"mlp.shared_experts.up_proj.weight", "ffn.shared_experts.w3.weight"},
    {"mlp.shared_experts.down_proj.weight", "ffn.shared_experts.w2.weight"},
};

/* Global names: (disk, canonical, naming bit; 0 = shared by two namings, says nothing). */
static const struct {
    const char *from, *to;
    unsigned naming;
} global_rules[] = {
    {"embed.weight", "embed.weight", DSV4_NAMING_OFFICIAL},
    {"norm.weight", "norm.weight", DSV4_NAMING_OFFICIAL},
    {"hc_head_fn", "hc_head_fn", DSV4_NAMING_OFFICIAL},
    {"hc_head_base", "hc_head_base", DSV4_NAMING_OFFICIAL},
    {"hc_head_scale", "hc_head_scale", DSV4_NAMING_OFFICIAL},
    {"head.weight", "head.weight", 0},
    {"lm_head.weight", "head.weight", DSV4_NAMING_TRANSFORMERS},
    {"model.embed_tokens.weight", "embed.weight", 0},
    {"model.norm.weight", "norm.weight", 0},
    {"model.hc_head.hc_fn", "hc_head_fn", 0},
    {"model.hc_head.hc_base", "hc_head_base", 0},
    {"model.hc_head.hc_scale", "hc_head_scale", 0},
    {"embed_tokens.weight", "embed.weight", DSV4_NAMING_TRANSFORMERS},
    {"hc_head.hc_fn", "hc_head_fn", DSV4_NAMING_TRANSFORMERS},
    {"hc_head.hc_base", "hc_head_base", DSV4_NAMING_TRANSFORMERS},
    {"hc_head.hc_scale", "hc_head_scale", DSV4_NAMING_TRANSFORMERS},
};

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !memcmp(s + a - b, suf, b);
}

static int starts_with(const char *s, const char *pre)
{
    return !strncmp(s, pre, strlen(pre));
}

/* The decimal number at the start of `s` (layer or expert id), *end just past it; -1 if `s` does not start with a
 * digit or the number exceeds 1000000 (no model has that many layers or experts, and the bound keeps the
 * accumulation far from overflow: a sscanf %d of "4294967296" would wrap to expert 0). */
static int parse_index(const char *s, const char **end)
{
    if (*s < '0' || *s > '9') return -1;
    long v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        v = v * 10 + (*s - '0');
        if (v > 1000000) return -1;
    }
    *end = s;
    return (int)v;
}

/* "layers.12." -> 12 and the rest; -1 if `s` does not start with "layers.<digits>.". */
static int parse_layer_prefix(const char *s, const char **rest)
{
    if (!starts_with(s, "layers.")) return -1;
    const char *p;
    int v = parse_index(s + 7, &p);
    if (v < 0 || *p != '.') return -1;
    *rest = p + 1;
    return v;
}

/* The per-layer rest in transformers naming -> official rest; 1 if it was a transformers name. */
static int map_tf_rest(const char *rest, char *out, size_t cap, dsv4_fused_kind *fused)
{
    for (size_t i = 0; i < sizeof tf_layer_rules / sizeof tf_layer_rules[0]; i++)
        if (!strcmp(rest, tf_layer_rules[i].from)) {
            snprintf(out, cap, "%s", tf_layer_rules[i].to);
            return 1;
        }
    if (!strcmp(rest, "mlp.experts.gate_up_proj")) {
        *fused = DSV4_FUSED_GATE_UP;
        return 1;
    }
    if (!strcmp(rest, "mlp.experts.down_proj")) {
        *fused = DSV4_FUSED_DOWN;
        return 1;
    }
    /* Per-expert transformers-style modules: mlp.experts.E.{gate,up,down}_proj.weight or .w1/.w2/.w3. */
    const char *p;
    int e = starts_with(rest, "mlp.experts.") ? parse_index(rest + 12, &p) : -1;
    if (e < 0 || *p != '.') return 0;
    p++;
    const char *w = !strcmp(p, "gate_proj.weight") || !strcmp(p, "w1.weight")   ? "w1"
                    : !strcmp(p, "up_proj.weight") || !strcmp(p, "w3.weight")   ? "w3"
                    : !strcmp(p, "down_proj.weight") || !strcmp(p, "w2.weight") ? "w2"
                                                                                : NULL;
    if (!w) return 0;
    snprintf(out, cap, "ffn.experts.%d.%s.weight", e, w);
    return 1;
}

/* Map a weight (non-scale) name. */
static int map_weight(const char *disk, char *out, size_t cap, unsigned *naming, dsv4_fused_kind *fused,
                      int *layer)
{
    for (size_t i = 0; i < sizeof global_rules / sizeof global_rules[0]; i++)
        if (!strcmp(disk, global_rules[i].from)) {
            *naming = global_rules[i].naming;
            return snprintf(out, cap, "%s", global_rules[i].to) < (int)cap ? 0 : -1;
        }
    int model_prefix = starts_with(disk, "model.");
    const char *rest = NULL;
    int L = parse_layer_prefix(model_prefix ? disk + 6 : disk, &rest);
    if (L < 0) { /* unknown or MTP (mtp.N.*): kept verbatim, official */
        *naming = starts_with(disk, "mtp.") ? DSV4_NAMING_OFFICIAL : 0;
        return snprintf(out, cap, "%s", disk) < (int)cap ? 0 : -1;
    }
    *layer = L;
    char mapped[256];
    if (map_tf_rest(rest, mapped, sizeof mapped, fused)) {
        *naming = DSV4_NAMING_TRANSFORMERS;
        if (*fused != DSV4_FUSED_NONE) return 0;
        rest = mapped;
    } else {
        *naming = model_prefix ? DSV4_NAMING_SAVE : DSV4_NAMING_OFFICIAL;
        if (!strcmp(rest, "attn.norm.weight")) rest = "attn.kv_norm.weight";
    }
    return snprintf(out, cap, "layers.%d.%s", L, rest) < (int)cap ? 0 : -1;
}

int dsv4_naming_canonical(const char *disk, char *out, size_t cap, unsigned *naming, dsv4_fused_kind *fused,
                          int *layer)
{
    *naming = 0;
    *fused = DSV4_FUSED_NONE;
    *layer = -1;
    size_t n = strlen(disk);
    char base[512];
    int is_scale = 0;
    if (n + 8 < sizeof base && !ends_with(disk, "_hc.scale")) {
        if (ends_with(disk, ".weight_scale_inv")) {
            memcpy(base, disk, n - 10); /* keep ".weight" */
            base[n - 10] = 0;
            is_scale = 1;
        } else if (ends_with(disk, ".weight.scale")) {
            memcpy(base, disk, n - 6);
            base[n - 6] = 0;
            is_scale = 1;
        } else if (ends_with(disk, ".scale")) {
            memcpy(base, disk, n - 6);
            memcpy(base + n - 6, ".weight", 8);
            is_scale = 1;
        }
    }
    if (!is_scale) {
        if (map_weight(disk, out, cap, naming, fused, layer))
            return dsv4_error(DSV4_ERR_FORMAT, "tensor name too long: %s", disk);
        return 0;
    }
    char w[512];
    if (map_weight(base, w, sizeof w, naming, fused, layer) || *fused != DSV4_FUSED_NONE || !ends_with(w, ".weight")) {
        /* a scale of a fused tensor or of a non-.weight name: keep it verbatim, it will show as unexpected */
        *fused = DSV4_FUSED_NONE;
        return snprintf(out, cap, "%s", disk) < (int)cap ? 0 : dsv4_error(DSV4_ERR_FORMAT, "name too long: %s", disk);
    }
    w[strlen(w) - 7] = 0;
    if (snprintf(out, cap, "%s.scale", w) >= (int)cap) return dsv4_error(DSV4_ERR_FORMAT, "name too long: %s", disk);
    return 0;
}

const char *dsv4_naming_describe(unsigned naming)
{
    static const char *names[8] = {
        "unknown",
        "official",
        "transformers",
        "official+transformers",
        "save_pretrained",
        "official+save_pretrained",
        "transformers+save_pretrained",
        "official+transformers+save_pretrained",
    };
    return names[naming & 7u];
}
