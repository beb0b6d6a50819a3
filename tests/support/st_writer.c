/* st_writer.c - safetensors fixture writer and tiny model folders for tests (st_writer.h). */
#define _POSIX_C_SOURCE 200809L
#include "st_writer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"

typedef struct stw_entry {
    char *name;
    char dtype[32];
    int ndim;
    int64_t shape[4];
    uint8_t *data;
    size_t nbytes;
    char *dtype_text, *shape_text; /* overrides, or NULL */
    int has_offsets;
    int64_t begin, end;
    char *raw_value; /* a raw entry: name + raw JSON value, no data */
} stw_entry;

struct dsv4_stw {
    stw_entry *e;
    int n, cap;
};

dsv4_stw *dsv4_stw_new(void)
{
    return calloc(1, sizeof(dsv4_stw));
}

void dsv4_stw_free(dsv4_stw *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
        free(w->e[i].dtype_text);
        free(w->e[i].shape_text);
        free(w->e[i].raw_value);
    }
    free(w->e);
    free(w);
}

static stw_entry *push(dsv4_stw *w, const char *name)
{
    if (w->n == w->cap) {
        int nc = w->cap ? 2 * w->cap : 64;
        stw_entry *ne = realloc(w->e, (size_t)nc * sizeof *ne);
        if (!ne) return NULL;
        w->e = ne;
        w->cap = nc;
    }
    stw_entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return NULL;
    w->n++;
    return e;
}

int dsv4_stw_add(dsv4_stw *w, const char *name, const char *dtype, int ndim, const int64_t *shape, const void *data,
                 size_t nbytes)
{
    if (ndim < 0 || ndim > 4) return -1;
    stw_entry *e = push(w, name);
    if (!e) return -1;
    snprintf(e->dtype, sizeof e->dtype, "%s", dtype);
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = nbytes;
    e->data = malloc(nbytes ? nbytes : 1);
    if (!e->data) return -1;
    if (nbytes) memcpy(e->data, data, nbytes);
    return 0;
}

int dsv4_stw_add_f32(dsv4_stw *w, const char *name, int ndim, const int64_t *shape, const float *data)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return dsv4_stw_add(w, name, "F32", ndim, shape, data, n * 4);
}

static stw_entry *find(dsv4_stw *w, const char *name)
{
    for (int i = 0; i < w->n; i++)
        if (!w->e[i].raw_value && !strcmp(w->e[i].name, name)) return &w->e[i];
    fprintf(stderr, "st_writer: no tensor %s\n", name);
    return NULL;
}

int dsv4_stw_set_dtype_text(dsv4_stw *w, const char *name, const char *dtype)
{
    stw_entry *e = find(w, name);
    return e && (e->dtype_text = strdup(dtype)) ? 0 : -1;
}

int dsv4_stw_set_shape_text(dsv4_stw *w, const char *name, const char *shape_json)
{
    stw_entry *e = find(w, name);
    return e && (e->shape_text = strdup(shape_json)) ? 0 : -1;
}

int dsv4_stw_set_offsets(dsv4_stw *w, const char *name, int64_t begin, int64_t end)
{
    stw_entry *e = find(w, name);
    if (!e) return -1;
    e->has_offsets = 1;
    e->begin = begin;
    e->end = end;
    return 0;
}

int dsv4_stw_add_raw_entry(dsv4_stw *w, const char *name, const char *value_json)
{
    stw_entry *e = push(w, name);
    return e && (e->raw_value = strdup(value_json)) ? 0 : -1;
}

/* Growable text buffer. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap ? b->cap : 4096);
        while (nc < b->n + (size_t)k + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

int dsv4_stw_write(const dsv4_stw *w, const char *path, const dsv4_stw_corrupt *c)
{
    sbuf h = {0};
    sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const stw_entry *e = &w->e[i];
        if (e->raw_value) {
            sb_printf(&h, ",\"%s\":%s", e->name, e->raw_value);
            continue;
        }
        sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":", e->name, e->dtype_text ? e->dtype_text : e->dtype);
        if (e->shape_text) sb_printf(&h, "%s", e->shape_text);
        else {
            sb_printf(&h, "[");
            for (int k = 0; k < e->ndim; k++) sb_printf(&h, "%s%lld", k ? "," : "", (long long)e->shape[k]);
            sb_printf(&h, "]");
        }
        long long b = e->has_offsets ? e->begin : (long long)off, en = e->has_offsets ? e->end : (long long)(off + e->nbytes);
        sb_printf(&h, ",\"data_offsets\":[%lld,%lld]}", b, en);
        off += e->nbytes;
    }
    sb_printf(&h, "}");
    while (!h.oom && h.n % 8) sb_printf(&h, " "); /* safetensors pads the header to 8 bytes */
    if (h.oom) {
        free(h.p);
        return -1;
    }
    const char *text = c && c->header_text ? c->header_text : h.p;
    size_t tlen = strlen(text);
    uint64_t hl = (uint64_t)((int64_t)tlen + (c ? c->header_len_delta : 0));
    size_t total = 8 + tlen + off;
    uint8_t *buf = malloc(total);
    if (!buf) {
        free(h.p);
        return -1;
    }
    for (int k = 0; k < 8; k++) buf[k] = (uint8_t)(hl >> (8 * k));
    memcpy(buf + 8, text, tlen);
    size_t p = 8 + tlen;
    for (int i = 0; i < w->n; i++) {
        if (w->e[i].raw_value) continue;
        memcpy(buf + p, w->e[i].data, w->e[i].nbytes);
        p += w->e[i].nbytes;
    }
    if (c && c->truncate_bytes) total = c->truncate_bytes < total ? total - c->truncate_bytes : 0;
    FILE *f = fopen(path, "wb");
    int rc = -1;
    if (f) {
        rc = fwrite(buf, 1, total, f) == total ? 0 : -1;
        if (fclose(f)) rc = -1;
    }
    if (rc) fprintf(stderr, "st_writer: cannot write %s\n", path);
    free(buf);
    free(h.p);
    return rc;
}

/* ------------------------------------------------------------------------------------- tiny models */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

float dsv4_stw_value(const char *name, size_t i)
{
    uint64_t h = mix64(name_hash(name) + 0x9e3779b97f4a7c15ull * (i + 1));
    return (float)((int)(h % 128) - 64) / 64.0f;
}

int64_t dsv4_stw_tid2eid(int64_t t, int64_t j, int64_t n_experts)
{
    return (t * 7 + j) % n_experts;
}

const char *dsv4_stw_tiny_config(void)
{
    return "{\n"
           "  \"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\",\n"
           "  \"vocab_size\": 96, \"hidden_size\": 64, \"moe_intermediate_size\": 32, \"num_hidden_layers\": 4,\n"
           "  \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 32, \"q_lora_rank\": 160,\n"
           "  \"partial_rotary_factor\": 0.25, \"num_experts_per_tok\": 2, \"n_routed_experts\": 4,\n"
           "  \"n_shared_experts\": 1,\n"
           "  \"layer_types\": [\"sliding_attention\", \"compressed_sparse_attention\",\n"
           "                  \"heavily_compressed_attention\", \"compressed_sparse_attention\"],\n"
           "  \"mlp_layer_types\": [\"hash_moe\", \"moe\", \"moe\", \"moe\"],\n"
           "  \"compress_rates\": {\"compressed_sparse_attention\": 4, \"heavily_compressed_attention\": 8},\n"
           "  \"sliding_window\": 8, \"o_groups\": 2, \"o_lora_rank\": 16, \"index_n_heads\": 4,\n"
           "  \"index_head_dim\": 16, \"index_topk\": 3, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-06,\n"
           "  \"max_position_embeddings\": 4096, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,\n"
           "  \"rope_parameters\": {\"main\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0,\n"
           "                                 \"partial_rotary_factor\": 0.25},\n"
           "                        \"compress\": {\"rope_type\": \"yarn\", \"factor\": 16.0,\n"
           "                                     \"original_max_position_embeddings\": 256, \"beta_fast\": 32,\n"
           "                                     \"beta_slow\": 1, \"rope_theta\": 160000.0,\n"
           "                                     \"partial_rotary_factor\": 0.25, \"attention_factor\": 1.0}},\n"
           "  \"swiglu_limit\": 10.0, \"routed_scaling_factor\": 1.5, \"rms_norm_eps\": 1e-06,\n"
           "  \"scoring_func\": \"sqrtsoftplus\", \"norm_topk_prob\": true, \"tie_word_embeddings\": false,\n"
           "  \"bos_token_id\": 0, \"eos_token_id\": 1, \"expert_dtype\": \"fp4\",\n"
           "  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\",\n"
           "                          \"weight_block_size\": [128, 128], \"activation_scheme\": \"dynamic\"}\n"
           "}\n";
}

/* canonical per-layer suffix -> transformers suffix (independent of model/naming.c on purpose) */
static const char *const tf_names[][2] = {
    {"hc_attn_fn", "attn_hc.fn"},
    {"hc_attn_base", "attn_hc.base"},
    {"hc_attn_scale", "attn_hc.scale"},
    {"hc_ffn_fn", "ffn_hc.fn"},
    {"hc_ffn_base", "ffn_hc.base"},
    {"hc_ffn_scale", "ffn_hc.scale"},
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn.attn_sink", "self_attn.sinks"},
    {"attn.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attn.q_norm.weight", "self_attn.q_a_norm.weight"},
    {"attn.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attn.wkv.weight", "self_attn.kv_proj.weight"},
    {"attn.kv_norm.weight", "self_attn.kv_norm.weight"},
    {"attn.wo_a.weight", "self_attn.o_a_proj.weight"},
    {"attn.wo_b.weight", "self_attn.o_b_proj.weight"},
    {"attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"},
    {"attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"},
    {"attn.compressor.ape", "self_attn.compressor.position_bias"},
    {"attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"},
    {"attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"},
    {"attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"},
    {"attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"},
    {"attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"},
    {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
    {"attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"},
    {"ffn.gate.weight", "mlp.gate.weight"},
    {"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
    {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
    {"ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
};

static void disk_name(dsv4_stw_naming nm, const char *canon, char *out, size_t cap)
{
    int L = -1, k = 0;
    const char *rest = canon;
    if (sscanf(canon, "layers.%d.%n", &L, &k) == 1 && k > 0) rest = canon + k;
    if (nm == DSV4_STW_OFFICIAL_QUANT || nm == DSV4_STW_OFFICIAL_F32) {
        snprintf(out, cap, "%s", canon);
        return;
    }
    if (L < 0) {
        static const char *const g[][3] = {/* canonical, transformers, save */
                                           {"embed.weight", "model.embed_tokens.weight", "model.embed_tokens.weight"},
                                           {"head.weight", "lm_head.weight", "head.weight"},
                                           {"norm.weight", "model.norm.weight", "model.norm.weight"},
                                           {"hc_head_fn", "model.hc_head.hc_fn", "model.hc_head.hc_fn"},
                                           {"hc_head_base", "model.hc_head.hc_base", "model.hc_head.hc_base"},
                                           {"hc_head_scale", "model.hc_head.hc_scale", "model.hc_head.hc_scale"}};
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
            if (!strcmp(canon, g[i][0])) {
                snprintf(out, cap, "%s", g[i][nm == DSV4_STW_TRANSFORMERS_F32 ? 1 : 2]);
                return;
            }
        snprintf(out, cap, "%s", canon);
        return;
    }
    if (nm == DSV4_STW_SAVE_F32) {
        snprintf(out, cap, "model.layers.%d.%s", L, !strcmp(rest, "attn.kv_norm.weight") ? "attn.norm.weight" : rest);
        return;
    }
    for (size_t i = 0; i < sizeof tf_names / sizeof tf_names[0]; i++)
        if (!strcmp(rest, tf_names[i][0])) {
            snprintf(out, cap, "model.layers.%d.%s", L, tf_names[i][1]);
            return;
        }
    snprintf(out, cap, "model.layers.%d.%s", L, rest);
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !memcmp(s + a - b, suf, b);
}

/* How the quantised official layout stores a canonical tensor. */
typedef enum { KIND_F32, KIND_BF16, KIND_FP8, KIND_FP4, KIND_I64 } stw_kind;

static stw_kind quant_kind(const char *canon)
{
    if (ends_with(canon, ".tid2eid")) return KIND_I64;
    if (strstr(canon, ".ffn.experts.")) return KIND_FP4;
    static const char *const fp8[] = {"attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
                                      "attn.wo_b.weight", "shared_experts.w1.weight", "shared_experts.w2.weight",
                                      "shared_experts.w3.weight", "indexer.wq_b.weight"};
    for (size_t i = 0; i < sizeof fp8 / sizeof fp8[0]; i++)
        if (ends_with(canon, fp8[i]) && !strstr(canon, "compressor.")) return KIND_FP8;
    if (ends_with(canon, ".weight")) return KIND_BF16; /* norms, embed, head, gate, compressor projections */
    return KIND_F32;                                   /* hc_*, attn_sink, ape, gate.bias */
}

static uint8_t rand_byte(const char *name, size_t i, uint64_t salt)
{
    return (uint8_t)(mix64(name_hash(name) ^ (salt + 0x632be59bd9b4e019ull * (i + 1))) >> 24);
}

/* Add one canonical tensor (logical shape s) to `w` under its disk name for naming `nm`. */
static int add_canonical(dsv4_stw *w, dsv4_stw_naming nm, const char *canon, int ndim, const int64_t *s,
                         int64_t n_experts)
{
    char dn[256];
    disk_name(nm, canon, dn, sizeof dn);
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= (size_t)s[i];
    stw_kind kind = nm == DSV4_STW_OFFICIAL_QUANT ? quant_kind(canon) : ends_with(canon, ".tid2eid") ? KIND_I64 : KIND_F32;
    if ((kind == KIND_FP8 || kind == KIND_FP4) && ndim != 2) kind = KIND_F32;
    int rc = -1;
    if (kind == KIND_I64) {
        int64_t *v = malloc(numel * 8);
        if (!v) return -1;
        for (size_t i = 0; i < numel; i++) v[i] = dsv4_stw_tid2eid((int64_t)i / s[1], (int64_t)i % s[1], n_experts);
        rc = dsv4_stw_add(w, dn, "I64", ndim, s, v, numel * 8);
        free(v);
    } else if (kind == KIND_F32 || kind == KIND_BF16) {
        float *v = malloc(numel * 4);
        uint16_t *b = malloc(numel * 2);
        if (v && b) {
            for (size_t i = 0; i < numel; i++) {
                v[i] = dsv4_stw_value(canon, i);
                b[i] = dsv4_f32_to_bf16(v[i]);
            }
            rc = kind == KIND_F32 ? dsv4_stw_add_f32(w, dn, ndim, s, v) : dsv4_stw_add(w, dn, "BF16", ndim, s, b, numel * 2);
        }
        free(v);
        free(b);
    } else {
        /* codes: random bytes, FP8 NaN codes (0x7f, 0xff) avoided; scales 2^-3 .. 2^3 */
        int fp4 = kind == KIND_FP4;
        int64_t ds[2] = {s[0], fp4 ? s[1] / 2 : s[1]};
        int64_t ss[2] = {fp4 ? s[0] : (s[0] + 127) / 128, fp4 ? (s[1] + 31) / 32 : (s[1] + 127) / 128};
        size_t nd = (size_t)(ds[0] * ds[1]), ns = (size_t)(ss[0] * ss[1]);
        uint8_t *q = malloc(nd ? nd : 1), *sc = malloc(ns ? ns : 1);
        if (q && sc) {
            for (size_t i = 0; i < nd; i++) {
                q[i] = rand_byte(canon, i, 1);
                if (!fp4 && (q[i] & 0x7f) == 0x7f) q[i] ^= 0x01;
            }
            for (size_t i = 0; i < ns; i++) sc[i] = (uint8_t)(124 + rand_byte(canon, i, 2) % 7);
            char sn[300];
            snprintf(sn, sizeof sn, "%.*s.scale", (int)(strlen(dn) - 7), dn);
            rc = dsv4_stw_add(w, dn, fp4 ? "I8" : "F8_E4M3", 2, ds, q, nd);
            if (!rc) rc = dsv4_stw_add(w, sn, "F8_E8M0", 2, ss, sc, ns);
        }
        free(q);
        free(sc);
    }
    return rc;
}

/* transformers' fused experts of layer L: gate_up_proj [E, 2I, D] = per expert [w1; w3], down_proj [E, D, I]. */
static int add_fused_experts(dsv4_stw *w, int L, int64_t E, int64_t I, int64_t D, const char *omit)
{
    size_t per = (size_t)(I * D);
    float *gu = malloc((size_t)E * 2 * per * 4), *dn = malloc((size_t)E * per * 4);
    int rc = -1;
    if (gu && dn) {
        char name[160];
        for (int64_t e = 0; e < E; e++) {
            snprintf(name, sizeof name, "layers.%d.ffn.experts.%lld.w1.weight", L, (long long)e);
            for (size_t i = 0; i < per; i++) gu[(size_t)e * 2 * per + i] = dsv4_stw_value(name, i);
            snprintf(name, sizeof name, "layers.%d.ffn.experts.%lld.w3.weight", L, (long long)e);
            for (size_t i = 0; i < per; i++) gu[(size_t)e * 2 * per + per + i] = dsv4_stw_value(name, i);
            snprintf(name, sizeof name, "layers.%d.ffn.experts.%lld.w2.weight", L, (long long)e);
            for (size_t i = 0; i < per; i++) dn[(size_t)e * per + i] = dsv4_stw_value(name, i);
        }
        int64_t s1[3] = {E, 2 * I, D}, s2[3] = {E, D, I};
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", L);
        rc = 0;
        if (!omit || strcmp(omit, name)) rc = dsv4_stw_add_f32(w, name, 3, s1, gu);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", L);
        if (!rc && (!omit || strcmp(omit, name))) rc = dsv4_stw_add_f32(w, name, 3, s2, dn);
    }
    free(gu);
    free(dn);
    return rc;
}

int dsv4_stw_make_model(const char *dir, const char *config_json, const dsv4_stw_model_opts *o)
{
    dsv4_stw_model_opts def = {DSV4_STW_OFFICIAL_QUANT, NULL, NULL, 1};
    if (!o) o = &def;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fputs(config_json, f) < 0) {
        if (f) fclose(f);
        fprintf(stderr, "st_writer: cannot write %s\n", path);
        return -1;
    }
    fclose(f);
    dsv4_config cfg;
    if (dsv4_config_parse(config_json, path, &cfg)) {
        fprintf(stderr, "st_writer: %s\n", dsv4_last_error());
        return -1;
    }
    dsv4_expected_tensor *ex;
    int n;
    if (dsv4_config_expected_tensors(&cfg, &ex, &n)) return -1;
    int nshards = o->shards > 1 ? o->shards : 1;
    dsv4_stw **w = calloc((size_t)nshards, sizeof *w);
    int rc = w ? 0 : -1;
    for (int k = 0; k < nshards && !rc; k++)
        if (!(w[k] = dsv4_stw_new())) rc = -1;
    for (int i = 0; i < n && !rc; i++) {
        dsv4_expected_tensor e = ex[i];
        dsv4_stw *dst = w[i % nshards];
        if (o->omit && !strcmp(o->omit, e.name)) continue;
        if (o->misshape && !strcmp(o->misshape, e.name)) e.shape[0] += 1;
        int L, ex_id, k = 0;
        if (o->naming == DSV4_STW_TRANSFORMERS_F32 &&
            sscanf(e.name, "layers.%d.ffn.experts.%d.%n", &L, &ex_id, &k) == 2 && k > 0) {
            if (ex_id == 0 && strstr(e.name, ".w1.weight"))
                rc = add_fused_experts(dst, L, cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size, o->omit);
            continue;
        }
        rc = add_canonical(dst, o->naming, e.name, e.ndim, e.shape, cfg.n_routed_experts);
    }
    if (!rc && nshards == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = dsv4_stw_write(w[0], path, NULL);
    } else if (!rc) {
        sbuf idx = {0};
        sb_printf(&idx, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
        int first = 1;
        for (int k = 0; k < nshards && !rc; k++) {
            char shard[64];
            snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", k + 1, nshards);
            snprintf(path, sizeof path, "%s/%s", dir, shard);
            rc = dsv4_stw_write(w[k], path, NULL);
            for (int i = 0; i < w[k]->n; i++) {
                sb_printf(&idx, "%s\"%s\": \"%s\"", first ? "" : ", ", w[k]->e[i].name, shard);
                first = 0;
            }
        }
        sb_printf(&idx, "}}\n");
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE *fi = idx.oom ? NULL : fopen(path, "wb");
        if (!fi || fputs(idx.p, fi) < 0) rc = -1;
        if (fi) fclose(fi);
        free(idx.p);
    }
    for (int k = 0; w && k < nshards; k++) dsv4_stw_free(w[k]);
    free(w);
    free(ex);
    return rc;
}
