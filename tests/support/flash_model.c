/* flash_model.c - the Flash-width random model of flash_model.h: the tensor list comes from the loader's own
 * dsv4_config_expected_tensors (canonical official names), streamed to one safetensors file in chunks, so the
 * 7 GB never sit in memory. Data order: I64, then F32, then BF16 tensors, so every F32 tensor is 4-aligned. */
#include "flash_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"

static const char flash_config[] =
    "{\n"
    "  \"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\",\n"
    "  \"vocab_size\": 8192, \"hidden_size\": 4096, \"num_hidden_layers\": 4,\n"
    "  \"num_attention_heads\": 64, \"num_key_value_heads\": 1, \"head_dim\": 512,\n"
    "  \"partial_rotary_factor\": 0.125, \"qk_rope_head_dim\": 64, \"q_lora_rank\": 1024,\n"
    "  \"o_groups\": 8, \"o_lora_rank\": 1024, \"sliding_window\": 128,\n"
    "  \"layer_types\": [\"compressed_sparse_attention\", \"heavily_compressed_attention\",\n"
    "                  \"compressed_sparse_attention\", \"heavily_compressed_attention\"],\n"
    "  \"mlp_layer_types\": [\"hash_moe\", \"moe\", \"moe\", \"moe\"],\n"
    "  \"compress_rates\": {\"compressed_sparse_attention\": 4, \"heavily_compressed_attention\": 128},\n"
    "  \"compress_rope_theta\": 160000.0, \"rope_theta\": 10000.0,\n"
    "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16.0, \"original_max_position_embeddings\": 65536,\n"
    "                   \"beta_fast\": 32.0, \"beta_slow\": 1.0},\n"
    "  \"max_position_embeddings\": 1048576,\n"
    "  \"index_n_heads\": 64, \"index_head_dim\": 128, \"index_topk\": 512,\n"
    "  \"n_routed_experts\": 32, \"n_shared_experts\": 1, \"num_experts_per_tok\": 6,\n"
    "  \"moe_intermediate_size\": 2048, \"num_hash_layers\": 1,\n"
    "  \"scoring_func\": \"sqrtsoftplus\", \"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true,\n"
    "  \"routed_scaling_factor\": 1.5, \"swiglu_limit\": 10.0, \"hidden_act\": \"silu\",\n"
    "  \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-06, \"rms_norm_eps\": 1e-06,\n"
    "  \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1\n"
    "}\n";

const char *dsv4_flash_model_config(void) { return flash_config; }

enum { KIND_I64, KIND_F32, KIND_BF16 };

typedef struct ftensor {
    const dsv4_expected_tensor *e;
    int kind;
    size_t numel, nbytes;
    float lo, hi; /* uniform range */
} ftensor;

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* dtype and value range of a canonical tensor */
static void classify(ftensor *t, int D, int n)
{
    const char *nm = t->e->name;
    t->lo = -0.1f, t->hi = 0.1f;
    if (ends_with(nm, "tid2eid")) t->kind = KIND_I64;
    else if (strstr(nm, "hc_") && (ends_with(nm, "_fn"))) {
        float a = sqrtf(3.0f / (float)(n * D));
        t->kind = KIND_F32, t->lo = -a, t->hi = a;
    } else if (strstr(nm, "hc_") && ends_with(nm, "_base")) t->kind = KIND_F32, t->lo = -0.5f, t->hi = 0.5f;
    else if (strstr(nm, "hc_") && ends_with(nm, "_scale")) t->kind = KIND_F32, t->lo = 0.5f, t->hi = 1.5f;
    else if (ends_with(nm, "attn_sink")) t->kind = KIND_F32, t->lo = -1.0f, t->hi = 1.0f;
    else if (ends_with(nm, ".ape")) t->kind = KIND_F32, t->lo = -0.5f, t->hi = 0.5f;
    else if (ends_with(nm, "gate.bias")) t->kind = KIND_F32, t->lo = -0.1f, t->hi = 0.1f;
    else if (ends_with(nm, "norm.weight")) t->kind = KIND_BF16, t->lo = 0.8f, t->hi = 1.2f;
    else if (!strcmp(nm, "embed.weight")) t->kind = KIND_BF16, t->lo = -1.0f, t->hi = 1.0f;
    else if (t->e->ndim == 2) {
        float a = sqrtf(3.0f / (float)t->e->shape[1]);
        t->kind = KIND_BF16, t->lo = -a, t->hi = a;
    } else t->kind = KIND_F32;
    size_t el = t->kind == KIND_I64 ? 8 : (t->kind == KIND_F32 ? 4 : 2);
    t->numel = 1;
    for (int i = 0; i < t->e->ndim; i++) t->numel *= (size_t)t->e->shape[i];
    t->nbytes = t->numel * el;
}

static uint64_t name_seed(const char *s, uint64_t seed)
{
    uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h ? h : 1;
}

static inline uint64_t xs(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static inline uint16_t bf16_rne(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

static int write_data(FILE *fp, const ftensor *t, uint64_t seed, int E, int k, void *buf, size_t buf_elems)
{
    uint64_t x = name_seed(t->e->name, seed);
    float span = t->hi - t->lo;
    if (t->kind == KIND_I64) {
        int64_t *v = buf;
        size_t rows = t->numel / k;
        for (size_t r = 0; r < rows; r++) {
            int64_t base = (int64_t)(xs(&x) % (uint64_t)E);
            for (int j = 0; j < k; j++) v[j] = (base + j) % E; /* distinct while k <= E */
            if (fwrite(v, 8, (size_t)k, fp) != (size_t)k) return -1;
        }
        return 0;
    }
    for (size_t done = 0; done < t->numel;) {
        size_t n = t->numel - done < buf_elems ? t->numel - done : buf_elems;
        if (t->kind == KIND_F32) {
            float *v = buf;
            for (size_t i = 0; i < n; i++) v[i] = t->lo + span * (float)(xs(&x) >> 40) * (1.0f / 16777216.0f);
            if (fwrite(v, 4, n, fp) != n) return -1;
        } else {
            uint16_t *v = buf;
            for (size_t i = 0; i < n; i += 4) {
                uint64_t r = xs(&x);
                for (size_t j = 0; j < 4 && i + j < n; j++, r >>= 16)
                    v[i + j] = bf16_rne(t->lo + span * (float)(r & 0xffff) * (1.0f / 65536.0f));
            }
            if (fwrite(v, 2, n, fp) != n) return -1;
        }
        done += n;
    }
    return 0;
}

int dsv4_flash_model_write(const char *dir, uint64_t seed)
{
    dsv4_config cfg;
    if (dsv4_config_parse(flash_config, "flash config", &cfg)) {
        fprintf(stderr, "flash_model: %s\n", dsv4_last_error());
        return -1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *fp = fopen(path, "w");
    if (!fp || fputs(flash_config, fp) == EOF || fclose(fp)) {
        fprintf(stderr, "flash_model: cannot write %s\n", path);
        return -1;
    }
    dsv4_expected_tensor *ex = NULL;
    int n = 0;
    if (dsv4_config_expected_tensors(&cfg, &ex, &n)) {
        fprintf(stderr, "flash_model: %s\n", dsv4_last_error());
        return -1;
    }
    ftensor *ts = calloc((size_t)n, sizeof *ts);
    size_t hcap = (size_t)n * 160 + 256, hlen = 0, off = 0;
    char *hdr = malloc(hcap + 8);
    size_t buf_elems = 1 << 20;
    void *buf = malloc(buf_elems * 4 > (size_t)cfg.num_experts_per_tok * 8 ? buf_elems * 4 : 4096);
    int rc = -1;
    if (!ts || !hdr || !buf) goto done;
    for (int i = 0; i < n; i++) {
        ts[i].e = &ex[i];
        classify(&ts[i], cfg.hidden_size, cfg.hc_mult);
    }
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "{\"__metadata__\":{\"format\":\"pt\"}");
    static const char *dt[] = {"I64", "F32", "BF16"};
    for (int kind = 0; kind < 3; kind++)
        for (int i = 0; i < n; i++) {
            if (ts[i].kind != kind) continue;
            hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", ex[i].name,
                                     dt[kind]);
            for (int d = 0; d < ex[i].ndim; d++)
                hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "%s%lld", d ? "," : "", (long long)ex[i].shape[d]);
            hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "],\"data_offsets\":[%zu,%zu]}", off,
                                     off + ts[i].nbytes);
            off += ts[i].nbytes;
            if (hlen + 200 > hcap) goto done;
        }
    hdr[hlen++] = '}';
    while (hlen % 8) hdr[hlen++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fp = fopen(path, "wb");
    if (!fp) goto done;
    uint64_t hl = hlen;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hl >> (8 * i));
    int bad = fwrite(le, 1, 8, fp) != 8 || fwrite(hdr, 1, hlen, fp) != hlen;
    for (int kind = 0; kind < 3 && !bad; kind++)
        for (int i = 0; i < n && !bad; i++)
            if (ts[i].kind == kind)
                bad = write_data(fp, &ts[i], seed, cfg.n_routed_experts, cfg.num_experts_per_tok, buf, buf_elems);
    if (fclose(fp) || bad) {
        fprintf(stderr, "flash_model: cannot write %s\n", path);
        goto done;
    }
    rc = 0;
done:
    if (rc && !ts) fprintf(stderr, "flash_model: out of memory\n");
    free(ts);
    free(hdr);
    free(buf);
    free(ex);
    return rc;
}
