/* config.c - config.json -> dsv4_config (model-spec §1).
 *
 * Two dialects are accepted, and may be mixed:
 * - the released DeepSeek config: compress_ratios (0/4/128 per layer, may be longer than the layer count:
 *   the trailing entries are for MTP blocks), num_hash_layers, qk_rope_head_dim, rope_theta,
 *   compress_rope_theta, rope_scaling {type: yarn, factor, original_max_position_embeddings, beta_*};
 * - what transformers' DeepseekV4Config.save_pretrained writes: layer_types, mlp_layer_types, compress_rates
 *   {compressed_sparse_attention, heavily_compressed_attention}, partial_rotary_factor,
 *   rope_parameters {main: {...}, compress: {...}} (or a flat rope_parameters holding the yarn keys).
 * Precedence and defaults follow transformers (configuration_deepseek_v4.py): layer_types > compress_ratios >
 * the V4-Pro default schedule (2x HCA, then alternating HCA/CSA); partial_rotary_factor > qk_rope_head_dim/head_dim
 * > 64/512, qk_rope_head_dim = int(head_dim * factor); every absent key takes transformers' default.
 * Required (no default makes sense for a real model): vocab_size, hidden_size, num_hidden_layers,
 * num_attention_heads, head_dim. A JSON null counts as absent (transformers' None).
 * Quiet traps: a YaRN compress rope with no original_max_position_embeddings uses max_position_embeddings;
 * the sliding-layer rope never gets YaRN unless rope_parameters.main says so; a non-empty rope_scaling beside
 * rope_parameters replaces it whole; a flat dict's own rope_theta sets neither base (parse_ropes).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/internal.h"

typedef struct cfg_ctx {
    const char *origin;
    json_t *root;
} cfg_ctx;

static const char *const attn_names[] = {"sliding_attention", "compressed_sparse_attention",
                                         "heavily_compressed_attention"};
static const char *const attn_short[] = {"sliding", "csa", "hca"};
static const char *const mlp_names[] = {"hash_moe", "moe"};
_Static_assert(sizeof attn_names / sizeof attn_names[0] == DSV4_ATTN_HCA + 1, "one name per dsv4_attn_type");
_Static_assert(sizeof attn_short / sizeof attn_short[0] == DSV4_ATTN_HCA + 1, "one name per dsv4_attn_type");
_Static_assert(sizeof mlp_names / sizeof mlp_names[0] == DSV4_MLP_MOE + 1, "one name per dsv4_mlp_type");

const char *dsv4_attn_type_name(dsv4_attn_type t)
{
    return (unsigned)t <= DSV4_ATTN_HCA ? attn_short[t] : "?";
}

const char *dsv4_mlp_type_name(dsv4_mlp_type t)
{
    return (unsigned)t <= DSV4_MLP_MOE ? mlp_names[t] : "?";
}

/* The value of `key` in `obj`, NULL if absent or null. */
static json_t *get(json_t *obj, const char *key)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    return json_is_null(v) ? NULL : v;
}

static int wrong_type(const cfg_ctx *c, const char *key, const char *want)
{
    return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"%s\" must be %s", c->origin, key, want);
}

/* Integer key; `required` makes absence an error. `where` prefixes nested keys in messages. */
static int get_int64(const cfg_ctx *c, json_t *obj, const char *key, int required, int64_t def, int64_t *out)
{
    json_t *v = get(obj, key);
    if (!v) {
        if (required) return dsv4_error(DSV4_ERR_CONFIG, "%s: missing required key \"%s\"", c->origin, key);
        *out = def;
        return 0;
    }
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15) {
        *out = (int64_t)json_real_value(v); /* 4.0 written by a float-happy tool */
        return 0;
    }
    if (!json_is_integer(v)) return wrong_type(c, key, "an integer");
    *out = json_integer_value(v);
    return 0;
}

static int get_int(const cfg_ctx *c, json_t *obj, const char *key, int required, int def, int *out)
{
    int64_t v = 0;
    int rc = get_int64(c, obj, key, required, def, &v);
    if (rc) return rc;
    if (v < -2147483647 || v > 2147483647)
        return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"%s\" = %lld does not fit an int", c->origin, key, (long long)v);
    *out = (int)v;
    return 0;
}

static int get_double(const cfg_ctx *c, json_t *obj, const char *key, double def, double *out)
{
    json_t *v = get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return wrong_type(c, key, "a number");
    *out = json_number_value(v);
    return 0;
}

static int get_bool(const cfg_ctx *c, json_t *obj, const char *key, int def, int *out)
{
    json_t *v = get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return wrong_type(c, key, "true or false");
    *out = json_is_true(v);
    return 0;
}

static int get_string(const cfg_ctx *c, json_t *obj, const char *key, const char *def, char *out, size_t cap)
{
    json_t *v = get(obj, key);
    const char *s = def;
    if (v) {
        if (!json_is_string(v)) return wrong_type(c, key, "a string");
        s = json_string_value(v);
    }
    if (strlen(s) >= cap) return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"%s\" value too long", c->origin, key);
    snprintf(out, cap, "%s", s);
    return 0;
}

/* A RoPE base b: the tables are b^(-2i/d) in fp32 (rope.c), which decay only for b > 1, and YaRN divides by ln b;
 * b = 0 gives inf/NaN everywhere, and a b past FLT_MAX is undefined to convert to float. */
static int check_theta(const cfg_ctx *c, const char *key, double v)
{
    if (v > 1.0 && v <= FLT_MAX) return 0;
    return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"%s\" = %g (a RoPE base must be a number > 1 and at most %g)",
                      c->origin, key, v, (double)FLT_MAX);
}

/* One rope dict (rope_parameters.main/compress, a flat rope_parameters, or rope_scaling); `d` may be NULL.
 * theta_def is the value of the top-level key theta_key, used (and checked under that name) when `d` has no
 * rope_theta of its own. */
static int parse_rope(const cfg_ctx *c, json_t *d, const char *label, double theta_def, const char *theta_key,
                      int64_t max_pos, dsv4_rope_params *r)
{
    char key[64];
    memset(r, 0, sizeof *r);
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->original_max_position_embeddings = max_pos;
    r->theta = theta_def;
    if (d && !json_is_object(d)) return wrong_type(c, label, "an object");
    if (!d) return check_theta(c, theta_key, theta_def);
    const char *type = "default";
    json_t *jt = get(d, "rope_type");
    if (!jt) jt = get(d, "type");
    if (jt) {
        if (!json_is_string(jt)) {
            snprintf(key, sizeof key, "%s.rope_type", label);
            return wrong_type(c, key, "a string");
        }
        type = json_string_value(jt);
    }
    if (!strcmp(type, "yarn")) r->yarn = 1;
    else if (strcmp(type, "default"))
        return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"%s\": rope type \"%s\" is not supported (default or yarn)",
                          c->origin, label, type);
#define ROPE_NUM(k, dst, def)                                                                                    \
    do {                                                                                                         \
        json_t *v_ = get(d, k);                                                                                  \
        if (v_ && !json_is_number(v_)) {                                                                         \
            snprintf(key, sizeof key, "%s.%s", label, k);                                                        \
            return wrong_type(c, key, "a number");                                                               \
        }                                                                                                        \
        dst = v_ ? json_number_value(v_) : (def);                                                                \
    } while (0)
    ROPE_NUM("rope_theta", r->theta, theta_def);
    snprintf(key, sizeof key, "%s.rope_theta", label);
    int rc = check_theta(c, get(d, "rope_theta") ? key : theta_key, r->theta);
    if (rc) return rc;
    if (r->yarn) {
        double omp;
        ROPE_NUM("factor", r->factor, 1.0);
        if (!(r->factor > 0 && r->factor <= FLT_MAX)) /* 1/(factor * b^e) in fp32: 0 divides, FLT_MAX+ is undefined */
            return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"%s.factor\" = %g (the YaRN factor must be a number > 0 and "
                              "at most %g)", c->origin, label, r->factor, (double)FLT_MAX);
        ROPE_NUM("original_max_position_embeddings", omp, (double)max_pos);
        if (!(omp >= 0 && omp < 9e15)) /* a double out of int64's range would be undefined to convert */
            return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"%s.original_max_position_embeddings\" = %g is out of range",
                              c->origin, label, omp);
        r->original_max_position_embeddings = (int64_t)omp;
        ROPE_NUM("beta_fast", r->beta_fast, 32.0);
        ROPE_NUM("beta_slow", r->beta_slow, 1.0);
    }
#undef ROPE_NUM
    return 0;
}

static int attn_type_from_name(const char *s)
{
    for (int i = 0; i <= DSV4_ATTN_HCA; i++)
        if (!strcmp(s, attn_names[i])) return i;
    return -1;
}

static int parse_schedule(const cfg_ctx *c, dsv4_config *cfg)
{
    json_t *root = c->root;
    int n = cfg->num_hidden_layers;
    int rc;
    /* compress rates: dict (transformers) with legacy scalar overrides */
    cfg->compress_rate_csa = 4;
    cfg->compress_rate_hca = 128;
    json_t *rates = get(root, "compress_rates");
    if (rates) {
        if (!json_is_object(rates)) return wrong_type(c, "compress_rates", "an object");
        if ((rc = get_int(c, rates, "compressed_sparse_attention", 0, 4, &cfg->compress_rate_csa))) return rc;
        if ((rc = get_int(c, rates, "heavily_compressed_attention", 0, 128, &cfg->compress_rate_hca))) return rc;
    }
    if ((rc = get_int(c, root, "compress_rate_csa", 0, cfg->compress_rate_csa, &cfg->compress_rate_csa))) return rc;
    if ((rc = get_int(c, root, "compress_rate_hca", 0, cfg->compress_rate_hca, &cfg->compress_rate_hca))) return rc;

    json_t *lt = get(root, "layer_types"), *cr = get(root, "compress_ratios");
    if (lt) {
        if (!json_is_array(lt)) return wrong_type(c, "layer_types", "a list of strings");
        if ((int)json_array_size(lt) != n)
            return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"layer_types\" has %zu entries, num_hidden_layers is %d",
                              c->origin, json_array_size(lt), n);
        for (int i = 0; i < n; i++) {
            json_t *v = json_array_get(lt, (size_t)i);
            int t = json_is_string(v) ? attn_type_from_name(json_string_value(v)) : -1;
            if (t < 0)
                return dsv4_error(DSV4_ERR_CONFIG,
                                  "%s: key \"layer_types\"[%d] must be sliding_attention, compressed_sparse_attention "
                                  "or heavily_compressed_attention",
                                  c->origin, i);
            cfg->attn_type[i] = (dsv4_attn_type)t;
        }
    } else if (cr) {
        if (!json_is_array(cr)) return wrong_type(c, "compress_ratios", "a list of integers");
        if ((int)json_array_size(cr) < n)
            return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"compress_ratios\" has %zu entries, num_hidden_layers is %d",
                              c->origin, json_array_size(cr), n);
        for (int i = 0; i < n; i++) {
            json_t *v = json_array_get(cr, (size_t)i);
            json_int_t r = json_is_integer(v) ? json_integer_value(v) : -1;
            if (r != 0 && r != 4 && r != 128)
                return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"compress_ratios\"[%d] must be 0, 4 or 128", c->origin, i);
            cfg->attn_type[i] = r == 0 ? DSV4_ATTN_SLIDING : r == 4 ? DSV4_ATTN_CSA : DSV4_ATTN_HCA;
        }
    } else { /* transformers' default: the V4-Pro schedule */
        for (int i = 0; i < n; i++)
            cfg->attn_type[i] = i < 2 ? DSV4_ATTN_HCA : ((i - 2) % 2 ? DSV4_ATTN_CSA : DSV4_ATTN_HCA);
    }
    for (int i = 0; i < n; i++)
        cfg->compress_ratio[i] = cfg->attn_type[i] == DSV4_ATTN_CSA   ? cfg->compress_rate_csa
                                 : cfg->attn_type[i] == DSV4_ATTN_HCA ? cfg->compress_rate_hca
                                                                      : 0;

    json_t *mt = get(root, "mlp_layer_types");
    if (mt) {
        if (!json_is_array(mt)) return wrong_type(c, "mlp_layer_types", "a list of strings");
        if ((int)json_array_size(mt) != n)
            return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"mlp_layer_types\" has %zu entries, num_hidden_layers is %d",
                              c->origin, json_array_size(mt), n);
        for (int i = 0; i < n; i++) {
            json_t *v = json_array_get(mt, (size_t)i);
            const char *s = json_is_string(v) ? json_string_value(v) : "";
            if (!strcmp(s, "hash_moe")) cfg->mlp_type[i] = DSV4_MLP_HASH_MOE;
            else if (!strcmp(s, "moe")) cfg->mlp_type[i] = DSV4_MLP_MOE;
            else
                return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"mlp_layer_types\"[%d] must be hash_moe or moe",
                                  c->origin, i);
        }
    } else {
        int nh = 3;
        if ((rc = get_int(c, root, "num_hash_layers", 0, 3, &nh))) return rc;
        if (nh < 0) return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"num_hash_layers\" is negative", c->origin);
        for (int i = 0; i < n; i++) cfg->mlp_type[i] = i < nh ? DSV4_MLP_HASH_MOE : DSV4_MLP_MOE;
    }
    cfg->num_hash_layers = 0;
    for (int i = 0; i < n; i++) cfg->num_hash_layers += cfg->mlp_type[i] == DSV4_MLP_HASH_MOE;
    return 0;
}

/* The two ropes as transformers' DeepseekV4Config builds them: a non-empty rope_scaling replaces rope_parameters
 * whole (RotaryEmbeddingConfigMixin: `rope_parameters = rope_scaling or rope_parameters`); a dict holding both
 * "main" and "compress" gives each rope its own keys; any other dict is the compress rope's (YaRN) keys, and the
 * main rope is then plain rope of base rope_theta. */
static int parse_ropes(const cfg_ctx *c, dsv4_config *cfg)
{
    json_t *root = c->root;
    double rope_theta = 0, compress_theta = 0; /* set by the get_double calls below (gcc -O3 cannot tell) */
    int rc;
    if ((rc = get_double(c, root, "rope_theta", 10000.0, &rope_theta))) return rc;
    if ((rc = get_double(c, root, "compress_rope_theta", 160000.0, &compress_theta))) return rc;
    json_t *rp = get(root, "rope_parameters"), *rs = get(root, "rope_scaling");
    if (rp && !json_is_object(rp)) return wrong_type(c, "rope_parameters", "an object");
    if (rs && !json_is_object(rs)) return wrong_type(c, "rope_scaling", "an object");
    const char *name = "rope_parameters";
    if (rs && json_object_size(rs) > 0) rp = rs, name = "rope_scaling";
    char main_label[32], comp_label[32];
    snprintf(main_label, sizeof main_label, "%s.main", name);
    snprintf(comp_label, sizeof comp_label, "%s.compress", name);
    json_t *main = rp ? get(rp, "main") : NULL, *comp = rp ? get(rp, "compress") : NULL;
    if (json_is_object(main) && json_is_object(comp)) {
        if ((rc = parse_rope(c, main, main_label, rope_theta, "rope_theta", cfg->max_position_embeddings,
                             &cfg->rope_main)))
            return rc;
        return parse_rope(c, comp, comp_label, compress_theta, "compress_rope_theta", cfg->max_position_embeddings,
                          &cfg->rope_compress);
    }
    if ((rc = parse_rope(c, NULL, main_label, rope_theta, "rope_theta", cfg->max_position_embeddings,
                         &cfg->rope_main)))
        return rc;
    if ((rc = parse_rope(c, rp, name, compress_theta, "compress_rope_theta", cfg->max_position_embeddings,
                         &cfg->rope_compress)))
        return rc;
    /* transformers sets the compress rope's base to compress_rope_theta over the dict's own rope_theta, and the
     * main rope's to rope_theta: a flat dict's rope_theta is used by neither (it is still checked) */
    cfg->rope_compress.theta = compress_theta;
    return check_theta(c, "compress_rope_theta", compress_theta);
}

static int parse_quant(const cfg_ctx *c, dsv4_config *cfg)
{
    int rc = get_string(c, c->root, "expert_dtype", "", cfg->expert_dtype, sizeof cfg->expert_dtype);
    if (rc) return rc;
    json_t *q = get(c->root, "quantization_config");
    cfg->fp8_block_quant = 0;
    if (!q) return 0;
    if (!json_is_object(q)) return wrong_type(c, "quantization_config", "an object");
    char method[32], fmt[32];
    if ((rc = get_string(c, q, "quant_method", "", method, sizeof method))) return rc;
    if ((rc = get_string(c, q, "fmt", "e4m3", fmt, sizeof fmt))) return rc;
    if (strcmp(method, "fp8")) return 0;
    if (strcmp(fmt, "e4m3"))
        return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"quantization_config.fmt\" = \"%s\" (only e4m3 is supported)",
                          c->origin, fmt);
    json_t *bs = get(q, "weight_block_size");
    if (bs && (!json_is_array(bs) || json_array_size(bs) != 2 ||
               json_integer_value(json_array_get(bs, 0)) != 128 || json_integer_value(json_array_get(bs, 1)) != 128))
        return dsv4_error(DSV4_ERR_CONFIG, "%s: key \"quantization_config.weight_block_size\" must be [128, 128]",
                          c->origin);
    cfg->fp8_block_quant = 1;
    return 0;
}

#define REQUIRE(cond, ...)                                                                                       \
    do {                                                                                                         \
        if (!(cond)) return dsv4_error(DSV4_ERR_CONFIG, __VA_ARGS__);                                            \
    } while (0)

static int validate(const cfg_ctx *c, const dsv4_config *g)
{
    const char *o = c->origin;
    REQUIRE(g->num_hidden_layers >= 1 && g->num_hidden_layers <= DSV4_MAX_LAYERS,
            "%s: key \"num_hidden_layers\" = %d (must be 1..%d)", o, g->num_hidden_layers, DSV4_MAX_LAYERS);
    /* counts and widths: > 0, and those that size a list or a tensor from the config alone capped (dsv4.h), so that
     * a config cannot ask for 3 x 10^9 x L expected tensors; sliding_window and the compress rates size only the
     * decode state, which is checked against the host's memory instead (memlimit.c) */
    const struct {
        const char *key;
        int v, max;
    } pos[] = {{"vocab_size", g->vocab_size, DSV4_MAX_VOCAB},
               {"hidden_size", g->hidden_size, DSV4_MAX_WIDTH},
               {"num_attention_heads", g->num_attention_heads, DSV4_MAX_HEADS},
               {"head_dim", g->head_dim, DSV4_MAX_WIDTH},
               {"q_lora_rank", g->q_lora_rank, DSV4_MAX_WIDTH},
               {"o_groups", g->o_groups, DSV4_MAX_HEADS},
               {"o_lora_rank", g->o_lora_rank, DSV4_MAX_WIDTH},
               {"sliding_window", g->sliding_window, INT_MAX},
               {"index_n_heads", g->index_n_heads, DSV4_MAX_HEADS},
               {"index_head_dim", g->index_head_dim, DSV4_MAX_WIDTH},
               {"index_topk", g->index_topk, INT_MAX},
               {"n_routed_experts", g->n_routed_experts, DSV4_MAX_EXPERTS},
               {"num_experts_per_tok", g->num_experts_per_tok, DSV4_MAX_EXPERTS},
               {"moe_intermediate_size", g->moe_intermediate_size, DSV4_MAX_WIDTH},
               {"hc_mult", g->hc_mult, DSV4_MAX_HC_MULT},
               {"compress_rates.compressed_sparse_attention", g->compress_rate_csa, INT_MAX},
               {"compress_rates.heavily_compressed_attention", g->compress_rate_hca, INT_MAX}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        REQUIRE(pos[i].v > 0, "%s: key \"%s\" = %d (must be > 0)", o, pos[i].key, pos[i].v);
        REQUIRE(pos[i].v <= pos[i].max, "%s: key \"%s\" = %d (must be 1..%d)", o, pos[i].key, pos[i].v, pos[i].max);
    }
    REQUIRE(g->n_shared_experts >= 0, "%s: key \"n_shared_experts\" is negative", o);
    REQUIRE(g->n_shared_experts <= DSV4_MAX_EXPERTS, "%s: key \"n_shared_experts\" = %d (must be 0..%d)", o,
            g->n_shared_experts, DSV4_MAX_EXPERTS);
    /* every mHC step runs this many Sinkhorn rounds (Flash: 20): 10^9 would not fail, it would not end */
    REQUIRE(g->hc_sinkhorn_iters >= 0 && g->hc_sinkhorn_iters <= 1000,
            "%s: key \"hc_sinkhorn_iters\" = %d (must be 0..1000)", o, g->hc_sinkhorn_iters);
    REQUIRE(g->num_key_value_heads == 1, "%s: key \"num_key_value_heads\" = %d (DeepSeek-V4 has one shared KV head)",
            o, g->num_key_value_heads);
    REQUIRE(g->num_attention_heads % g->o_groups == 0,
            "%s: num_attention_heads (%d) must be divisible by o_groups (%d)", o, g->num_attention_heads, g->o_groups);
    REQUIRE(g->qk_rope_head_dim > 0 && g->qk_rope_head_dim % 2 == 0,
            "%s: rope dim int(head_dim * partial_rotary_factor) = %d must be even and > 0", o, g->qk_rope_head_dim);
    REQUIRE(g->qk_rope_head_dim <= g->head_dim, "%s: rope dim %d exceeds head_dim %d", o, g->qk_rope_head_dim,
            g->head_dim);
    REQUIRE(g->qk_rope_head_dim <= g->index_head_dim, "%s: rope dim %d exceeds index_head_dim %d", o,
            g->qk_rope_head_dim, g->index_head_dim);
    REQUIRE(g->num_experts_per_tok <= g->n_routed_experts,
            "%s: num_experts_per_tok (%d) exceeds n_routed_experts (%d)", o, g->num_experts_per_tok,
            g->n_routed_experts);
    REQUIRE(g->max_position_embeddings > 0, "%s: key \"max_position_embeddings\" must be > 0", o);
    REQUIRE(!g->rope_compress.yarn || (g->rope_compress.factor > 0 && g->rope_compress.original_max_position_embeddings > 0),
            "%s: YaRN compress rope needs factor > 0 and original_max_position_embeddings > 0", o);
    REQUIRE(!g->rope_main.yarn || (g->rope_main.factor > 0 && g->rope_main.original_max_position_embeddings > 0),
            "%s: YaRN main rope needs factor > 0 and original_max_position_embeddings > 0", o);
    return 0;
}

int dsv4_config_parse(const char *json_text, const char *origin, dsv4_config *cfg)
{
    if (!origin) origin = "config.json";
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return dsv4_error(DSV4_ERR_CONFIG, "%s: not valid JSON (%s, line %d column %d)", origin, jerr.text, jerr.line,
                          jerr.column);
    cfg_ctx c = {origin, root};
    int rc = 0;
    if (!json_is_object(root)) {
        rc = dsv4_error(DSV4_ERR_CONFIG, "%s: top level is not a JSON object", origin);
        goto done;
    }
    char model_type[64];
    if ((rc = get_string(&c, root, "model_type", "deepseek_v4", model_type, sizeof model_type))) goto done;
    if (strcmp(model_type, "deepseek_v4")) {
        rc = dsv4_error(DSV4_ERR_CONFIG, "%s: key \"model_type\" is \"%s\", not deepseek_v4", origin, model_type);
        goto done;
    }
    /* key, required, default (transformers' DeepseekV4Config), destination */
    const struct {
        const char *key, *alias;
        int required, def;
        int *dst;
    } ints[] = {
        {"vocab_size", NULL, 1, 129280, &cfg->vocab_size},
        {"hidden_size", NULL, 1, 4096, &cfg->hidden_size},
        {"num_hidden_layers", NULL, 1, 43, &cfg->num_hidden_layers},
        {"num_attention_heads", NULL, 1, 64, &cfg->num_attention_heads},
        {"head_dim", NULL, 1, 512, &cfg->head_dim},
        {"num_key_value_heads", NULL, 0, 1, &cfg->num_key_value_heads},
        {"q_lora_rank", NULL, 0, 1024, &cfg->q_lora_rank},
        {"o_groups", NULL, 0, 8, &cfg->o_groups},
        {"o_lora_rank", NULL, 0, 1024, &cfg->o_lora_rank},
        {"sliding_window", NULL, 0, 128, &cfg->sliding_window},
        {"index_n_heads", NULL, 0, 64, &cfg->index_n_heads},
        {"index_head_dim", NULL, 0, 128, &cfg->index_head_dim},
        {"index_topk", NULL, 0, 512, &cfg->index_topk},
        {"n_routed_experts", "num_local_experts", 0, 256, &cfg->n_routed_experts},
        {"n_shared_experts", NULL, 0, 1, &cfg->n_shared_experts},
        {"num_experts_per_tok", NULL, 0, 6, &cfg->num_experts_per_tok},
        {"moe_intermediate_size", "intermediate_size", 0, 2048, &cfg->moe_intermediate_size},
        {"hc_mult", NULL, 0, 4, &cfg->hc_mult},
        {"hc_sinkhorn_iters", NULL, 0, 20, &cfg->hc_sinkhorn_iters},
        {"bos_token_id", NULL, 0, 0, &cfg->bos_token_id},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        const char *key = ints[i].key;
        if (ints[i].alias && !get(root, key) && get(root, ints[i].alias)) key = ints[i].alias;
        if ((rc = get_int(&c, root, key, ints[i].required, ints[i].def, ints[i].dst))) goto done;
    }
    /* an id or a list of ids (transformers allows both; the first is kept); each must be a token of the vocabulary,
     * or at least fit an int32 while vocab_size is itself wrong (validate() says why) */
    json_t *eos = get(root, "eos_token_id");
    size_t n_eos = json_is_array(eos) ? json_array_size(eos) : eos != NULL;
    cfg->eos_token_id = 1;
    for (size_t i = 0; i < n_eos; i++) {
        json_t *v = json_is_array(eos) ? json_array_get(eos, i) : eos;
        if (!json_is_integer(v)) {
            rc = wrong_type(&c, "eos_token_id", "an integer or a list of integers");
            goto done;
        }
        json_int_t id = json_integer_value(v);
        int64_t hi = cfg->vocab_size > 0 ? cfg->vocab_size : INT32_MAX;
        if (id < 0 || id >= hi) {
            rc = dsv4_error(DSV4_ERR_CONFIG, "%s: key \"eos_token_id\" = %lld is not a token id (must be 0..%lld)",
                            origin, (long long)id, (long long)hi - 1);
            goto done;
        }
        if (i == 0) cfg->eos_token_id = (int)id;
    }
    if (!get(root, "bos_token_id") && json_is_null(json_object_get(root, "bos_token_id"))) cfg->bos_token_id = -1;
    if ((rc = get_int64(&c, root, "max_position_embeddings", 0, 1048576, &cfg->max_position_embeddings))) goto done;
    if ((rc = get_bool(&c, root, "norm_topk_prob", 1, &cfg->norm_topk_prob))) goto done;
    if ((rc = get_bool(&c, root, "tie_word_embeddings", 0, &cfg->tie_word_embeddings))) goto done;
    if ((rc = get_double(&c, root, "routed_scaling_factor", 1.5, &cfg->routed_scaling_factor))) goto done;
    if ((rc = get_double(&c, root, "swiglu_limit", 10.0, &cfg->swiglu_limit))) goto done;
    if ((rc = get_double(&c, root, "hc_eps", 1e-6, &cfg->hc_eps))) goto done;
    if ((rc = get_double(&c, root, "rms_norm_eps", 1e-6, &cfg->rms_norm_eps))) goto done;
    if ((rc = get_string(&c, root, "scoring_func", "sqrtsoftplus", cfg->scoring_func, sizeof cfg->scoring_func)))
        goto done;
    if (strcmp(cfg->scoring_func, "sqrtsoftplus") && strcmp(cfg->scoring_func, "softmax") &&
        strcmp(cfg->scoring_func, "sigmoid")) {
        rc = dsv4_error(DSV4_ERR_CONFIG, "%s: key \"scoring_func\" = \"%s\" (sqrtsoftplus, softmax or sigmoid)", origin,
                        cfg->scoring_func);
        goto done;
    }
    /* rope dim: partial_rotary_factor > legacy qk_rope_head_dim / head_dim > 64/512 */
    double prf;
    int legacy_rope = 0;
    if ((rc = get_int(&c, root, "qk_rope_head_dim", 0, 0, &legacy_rope))) goto done;
    double prf_def = legacy_rope ? (double)legacy_rope / cfg->head_dim : 64.0 / 512.0;
    if ((rc = get_double(&c, root, "partial_rotary_factor", prf_def, &prf))) goto done;
    if (!(fabs(cfg->head_dim * prf) < 2147483647.0)) { /* 64 * 1e25 is no int: undefined (found by fuzz_config) */
        rc = dsv4_error(DSV4_ERR_CONFIG, "%s: key \"partial_rotary_factor\" = %g gives no valid rope dim", origin, prf);
        goto done;
    }
    cfg->qk_rope_head_dim = (int)(cfg->head_dim * prf);
    if (cfg->num_hidden_layers < 1 || cfg->num_hidden_layers > DSV4_MAX_LAYERS) {
        rc = validate(&c, cfg);
        goto done;
    }
    if ((rc = parse_schedule(&c, cfg))) goto done;
    if ((rc = parse_ropes(&c, cfg))) goto done;
    if ((rc = parse_quant(&c, cfg))) goto done;
    rc = validate(&c, cfg);
done:
    json_decref(root);
    return rc;
}

int dsv4_file_read_text(const char *path, char **out, size_t *len_out)
{
    *out = NULL;
    struct stat st; /* a FIFO or a device would block or never end: only regular files are read */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return dsv4_error(DSV4_ERR_IO, "%s: not a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return dsv4_error(DSV4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            size_t nc = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, nc);
            if (!nb) {
                free(buf);
                fclose(f);
                return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return dsv4_error(DSV4_ERR_IO, "%s: read error", path);
    }
    buf[len] = 0;
    *out = buf;
    if (len_out) *len_out = len;
    return 0;
}

int dsv4_config_load(const char *path, dsv4_config *cfg)
{
    char *buf;
    int rc = dsv4_file_read_text(path, &buf, NULL);
    if (rc) return rc;
    rc = dsv4_config_parse(buf, path, cfg);
    free(buf);
    return rc;
}
