/* flash_standin.c - the sparse full-size stand-in of flash_standin.h. The tensor list is the loader's own
 * dsv4_config_expected_tensors (canonical official names, logical shapes) of the released config, each given the
 * on-disk dtype model-spec §2 names for it (and its .scale sibling); headers are written as text, the data left as a
 * hole by ftruncate. Every tensor's byte count is a multiple of 4, so F32 tensors stay 4-aligned (mapped, as in the
 * real checkpoint). */
#define _POSIX_C_SOURCE 200809L
#include "flash_standin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4/dsv4.h"

/* The released config.json of DeepSeek-V4-Flash (model-spec §1.1), num_hidden_layers left as %d. */
static const char standin_config[] =
    "{\n"
    "  \"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\",\n"
    "  \"vocab_size\": 129280, \"hidden_size\": 4096, \"num_hidden_layers\": %d,\n"
    "  \"num_nextn_predict_layers\": 1,\n"
    "  \"num_attention_heads\": 64, \"num_key_value_heads\": 1, \"head_dim\": 512,\n"
    "  \"qk_rope_head_dim\": 64, \"q_lora_rank\": 1024, \"o_groups\": 8, \"o_lora_rank\": 1024,\n"
    "  \"sliding_window\": 128,\n"
    "  \"compress_ratios\": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,\n"
    "                      4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0],\n"
    "  \"compress_rope_theta\": 160000, \"rope_theta\": 10000,\n"
    "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536,\n"
    "                   \"beta_fast\": 32, \"beta_slow\": 1},\n"
    "  \"max_position_embeddings\": 1048576,\n"
    "  \"index_n_heads\": 64, \"index_head_dim\": 128, \"index_topk\": 512,\n"
    "  \"n_routed_experts\": 256, \"n_shared_experts\": 1, \"num_experts_per_tok\": 6,\n"
    "  \"moe_intermediate_size\": 2048, \"num_hash_layers\": 3,\n"
    "  \"scoring_func\": \"sqrtsoftplus\", \"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true,\n"
    "  \"routed_scaling_factor\": 1.5, \"swiglu_limit\": 10.0, \"hidden_act\": \"silu\",\n"
    "  \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-06, \"rms_norm_eps\": 1e-06,\n"
    "  \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1,\n"
    "  \"torch_dtype\": \"bfloat16\", \"expert_dtype\": \"fp4\",\n"
    "  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\",\n"
    "                          \"weight_block_size\": [128, 128], \"activation_scheme\": \"dynamic\"},\n"
    "  \"attention_bias\": false, \"attention_dropout\": 0.0, \"initializer_range\": 0.02,\n"
    "  \"transformers_version\": \"4.57.1\"\n"
    "}\n";

typedef struct stensor {
    char name[112];
    const char *dtype;
    int ndim;
    int64_t shape[2];
    uint64_t nbytes;
} stensor;

typedef struct slist {
    stensor *t;
    int n, cap;
} slist;

static stensor *slist_add(slist *l, const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        stensor *nt = realloc(l->t, (size_t)l->cap * sizeof *nt);
        if (!nt) return NULL;
        l->t = nt;
    }
    stensor *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    size_t el = !strcmp(dtype, "I64") ? 8 : !strcmp(dtype, "F32") ? 4 : !strcmp(dtype, "BF16") ? 2 : 1;
    t->nbytes = (uint64_t)d0 * (uint64_t)(ndim > 1 ? d1 : 1) * el;
    return t;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* One tensor under `name` with logical shape [d0, d1] (ndim 1: [d0]) as the released checkpoint holds it. */
static int add_as_on_disk(slist *l, const char *name, int ndim, int64_t d0, int64_t d1)
{
    static const char *const fp8[] = {".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight",
                                      ".attn.wo_a.weight", ".attn.wo_b.weight", ".indexer.wq_b.weight",
                                      ".shared_experts.w1.weight", ".shared_experts.w2.weight",
                                      ".shared_experts.w3.weight", "e_proj.weight", "h_proj.weight"};
    char scale[112];
    snprintf(scale, sizeof scale, "%.*s.scale", (int)(strlen(name) - 7), name);
    if (ends_with(name, ".tid2eid")) return slist_add(l, name, "I64", ndim, d0, d1) ? 0 : -1;
    if (strstr(name, ".ffn.experts.")) /* FP4: two codes per byte, an e8m0 scale per 32 columns */
        return slist_add(l, name, "I8", 2, d0, d1 / 2) && slist_add(l, scale, "F8_E8M0", 2, d0, d1 / 32) ? 0 : -1;
    for (size_t i = 0; i < sizeof fp8 / sizeof fp8[0]; i++)
        if (ends_with(name, fp8[i]))
            return slist_add(l, name, "F8_E4M3", 2, d0, d1) &&
                           slist_add(l, scale, "F8_E8M0", 2, (d0 + 127) / 128, (d1 + 127) / 128)
                       ? 0
                       : -1;
    int f32 = strstr(name, "hc_") || ends_with(name, ".attn_sink") || ends_with(name, ".ape") ||
              ends_with(name, ".gate.bias");
    return slist_add(l, name, f32 ? "F32" : "BF16", ndim, d0, d1) ? 0 : -1;
}

static int add_expected(slist *l, const dsv4_expected_tensor *e, const char *rename_from, const char *rename_to)
{
    char name[112];
    if (rename_from) snprintf(name, sizeof name, "%s%s", rename_to, e->name + strlen(rename_from));
    else snprintf(name, sizeof name, "%s", e->name);
    return add_as_on_disk(l, name, e->ndim, e->shape[0], e->ndim > 1 ? e->shape[1] : 1);
}

/* The tensor list: the config's own, then (mtp) a sliding, learned-routing block under mtp.0. with its projections. */
static int build_list(const dsv4_config *cfg, int mtp, slist *l)
{
    dsv4_expected_tensor *ex = NULL;
    int n = 0;
    if (dsv4_config_expected_tensors(cfg, &ex, &n)) return -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = add_expected(l, &ex[i], NULL, NULL);
    for (int i = 0; mtp && i < n && !rc; i++) {
        if (strncmp(ex[i].name, "layers.0.", 9)) continue;
        if (ends_with(ex[i].name, ".tid2eid"))
            rc = slist_add(l, "mtp.0.ffn.gate.bias", "F32", 1, cfg->n_routed_experts, 1) ? 0 : -1;
        else rc = add_expected(l, &ex[i], "layers.0.", "mtp.0.");
    }
    if (mtp && !rc) {
        int64_t D = cfg->hidden_size, nD = (int64_t)cfg->hc_mult * D;
        rc = add_as_on_disk(l, "mtp.0.e_proj.weight", 2, D, D) || add_as_on_disk(l, "mtp.0.h_proj.weight", 2, D, D) ||
             add_as_on_disk(l, "mtp.0.enorm.weight", 1, D, 1) || add_as_on_disk(l, "mtp.0.hnorm.weight", 1, D, 1) ||
             add_as_on_disk(l, "mtp.0.norm.weight", 1, D, 1) ||
             add_as_on_disk(l, "mtp.0.hc_head_fn", 2, cfg->hc_mult, nD) ||
             add_as_on_disk(l, "mtp.0.hc_head_base", 1, cfg->hc_mult, 1) ||
             add_as_on_disk(l, "mtp.0.hc_head_scale", 1, 1, 1);
    }
    free(ex);
    return rc;
}

/* A growing text buffer. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static int sbuf_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sbuf_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return -1;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return 0;
        }
        size_t nc = b->cap ? 2 * b->cap : 1 << 16;
        while (nc < b->n + (size_t)k + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
}

static int write_text(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "flash_standin: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int ok = fwrite(text, 1, len, f) == len;
    ok = !fclose(f) && ok;
    if (!ok) fprintf(stderr, "flash_standin: %s: write failed\n", path);
    return ok ? 0 : -1;
}

/* Shard s: tensors [a, b) of the list, its header then a hole for the data. */
static int write_shard(const char *path, const stensor *t, int a, int b)
{
    sbuf h = {0};
    uint64_t off = 0;
    int rc = sbuf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = a; i < b && !rc; i++) {
        rc = sbuf_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", t[i].name, t[i].dtype,
                         (long long)t[i].shape[0]);
        if (!rc && t[i].ndim > 1) rc = sbuf_printf(&h, ",%lld", (long long)t[i].shape[1]);
        if (!rc)
            rc = sbuf_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                             (unsigned long long)(off + t[i].nbytes));
        off += t[i].nbytes;
    }
    if (!rc) rc = sbuf_printf(&h, "}");
    while (!rc && h.n % 8) rc = sbuf_printf(&h, " "); /* the data section 8-aligned, as safetensors pads it */
    if (rc) {
        free(h.p);
        fprintf(stderr, "flash_standin: out of memory\n");
        return -1;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    int ok = fd >= 0 && write(fd, len, 8) == 8 && write(fd, h.p, h.n) == (ssize_t)h.n &&
             ftruncate(fd, (off_t)(8 + h.n + off)) == 0;
    if (fd >= 0) ok = !close(fd) && ok;
    if (!ok) fprintf(stderr, "flash_standin: %s: %s\n", path, strerror(errno));
    free(h.p);
    return ok ? 0 : -1;
}

int dsv4_flash_standin_write(const char *dir, const dsv4_standin_opts *o, double *total_bytes)
{
    if (o->n_layers < 1 || o->n_layers > 43 || o->n_shards < 1) {
        fprintf(stderr, "flash_standin: %d layers, %d shards\n", o->n_layers, o->n_shards);
        return -1;
    }
    char cfg_text[sizeof standin_config + 16], path[4096];
    snprintf(cfg_text, sizeof cfg_text, standin_config, o->n_layers);
    dsv4_config cfg;
    if (dsv4_config_parse(cfg_text, "flash_standin config.json", &cfg)) {
        fprintf(stderr, "flash_standin: %s\n", dsv4_last_error());
        return -1;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (write_text(path, cfg_text, strlen(cfg_text))) return -1;
    slist l = {0};
    if (build_list(&cfg, o->mtp, &l)) {
        free(l.t);
        fprintf(stderr, "flash_standin: cannot list the tensors\n");
        return -1;
    }
    double total = 0;
    for (int i = 0; i < l.n; i++) total += (double)l.t[i].nbytes;
    /* shards cut at equal byte counts, in model order; the index maps every tensor to its shard */
    sbuf idx = {0};
    int rc = sbuf_printf(&idx, "{\n  \"metadata\": {\"total_size\": %.0f},\n  \"weight_map\": {", total);
    double done = 0;
    int a = 0;
    for (int s = 0; s < o->n_shards && !rc; s++) {
        int b = a;
        double cut = total * (s + 1) / o->n_shards;
        while (b < l.n && (s == o->n_shards - 1 || done + (double)l.t[b].nbytes / 2 <= cut))
            done += (double)l.t[b++].nbytes;
        char shard[64];
        snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", s + 1, o->n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        rc = write_shard(path, l.t, a, b);
        for (int i = a; i < b && !rc; i++)
            rc = sbuf_printf(&idx, "%s\n    \"%s\": \"%s\"", i ? "," : "", l.t[i].name, shard);
        a = b;
    }
    if (!rc) rc = sbuf_printf(&idx, "\n  }\n}\n");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!rc) rc = write_text(path, idx.p, idx.n);
    free(idx.p);
    free(l.t);
    if (!rc && total_bytes) *total_bytes = total;
    return rc ? -1 : 0;
}
