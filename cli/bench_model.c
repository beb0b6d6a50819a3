/* bench_model.c - the Flash-shaped model of `dsv4 bench`: config text, memory plan, step roofline (bench_model.h). */
#define _POSIX_C_SOURCE 200809L
#include "bench_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kv_layout.h"

int bench_flash_config(int layers, int max_pos, dsv4_config *cfg)
{
    char json[8192];
    size_t n = 0;
    n += (size_t)snprintf(json + n, sizeof json - n,
                          "{\"model_type\": \"deepseek_v4\", \"vocab_size\": 129280, \"hidden_size\": 4096, "
                          "\"num_attention_heads\": 64, \"num_key_value_heads\": 1, \"head_dim\": 512, "
                          "\"qk_rope_head_dim\": 64, \"q_lora_rank\": 1024, \"o_groups\": 8, \"o_lora_rank\": 1024, "
                          "\"sliding_window\": 128, \"index_n_heads\": 64, \"index_head_dim\": 128, "
                          "\"index_topk\": 512, \"n_routed_experts\": 256, \"n_shared_experts\": 1, "
                          "\"num_experts_per_tok\": 6, \"moe_intermediate_size\": 2048, \"num_hash_layers\": 1, "
                          "\"scoring_func\": \"sqrtsoftplus\", \"norm_topk_prob\": true, "
                          "\"routed_scaling_factor\": 1.5, \"swiglu_limit\": 10.0, \"hc_mult\": 4, "
                          "\"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-6, \"rms_norm_eps\": 1e-6, "
                          "\"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1, "
                          "\"num_hidden_layers\": %d, \"max_position_embeddings\": %d, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0, \"rope_scaling\": "
                          "{\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536, "
                          "\"beta_fast\": 32, \"beta_slow\": 1}, \"layer_types\": [",
                          layers, max_pos);
    for (int L = 0; L < layers; L++) /* Flash layers 2, 3, 4, ...: even = CSA, odd = HCA */
        n += (size_t)snprintf(json + n, sizeof json - n, "%s\"%s\"", L ? ", " : "",
                              L % 2 == 0 ? "compressed_sparse_attention" : "heavily_compressed_attention");
    n += (size_t)snprintf(json + n, sizeof json - n, "], \"mlp_layer_types\": [");
    for (int L = 0; L < layers; L++) /* Flash layer 2 is the last hash-routed one */
        n += (size_t)snprintf(json + n, sizeof json - n, "%s\"%s\"", L ? ", " : "", L == 0 ? "hash_moe" : "moe");
    n += (size_t)snprintf(json + n, sizeof json - n, "]}");
    if (n >= sizeof json) return dsv4_error(DSV4_ERR_USAGE, "bench: config text too long");
    return dsv4_config_parse(json, "dsv4 bench (Flash shapes)", cfg);
}


/* Bytes per element of a linear the checkpoint keeps in FP8 and of a routed expert, as held in each mode. */
static double q8_bytes(int fp8) { return fp8 ? 1.0 + 1.0 / 16384 : 2.0; }
static double q4_bytes(int fp8) { return fp8 ? 0.5 + 1.0 / 32 : 2.0; }

/* Bytes of one window-ring or pool entry: bf16, or the --kv fp8 entry of kernels/kv_layout.h. */
static double kv_entry_bytes(const dsv4_config *f, int kv8)
{
    return kv8 ? (double)dsv4_kv8_entry_bytes(f->head_dim, f->qk_rope_head_dim) : 2.0 * f->head_dim;
}

void bench_plan_memory(const dsv4_config *f, int C, int max_ctx, int fp32_indexer, int fp8, int kv8,
                       bench_mem_plan *p)
{
    const double D = f->hidden_size, n = f->hc_mult, V = f->vocab_size, H = f->num_attention_heads,
                 d = f->head_dim, qr = f->q_lora_rank, HI = f->index_n_heads, dI = f->index_head_dim,
                 E = f->n_routed_experts, K = f->num_experts_per_tok, NI = f->moe_intermediate_size,
                 W = f->sliding_window, G = f->o_groups, o_r = f->o_lora_rank, mix = (2 + n) * n;
    memset(p, 0, sizeof *p);
    p->global = 2 * V * D * 2 + D * 4 + n * n * D * 4;
    double pool_csa = 0;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        const int csa = f->attn_type[L] == DSV4_ATTN_CSA, r = f->compress_ratio[L];
        const double width = (csa ? 2 : 1) * d, pool = r > 0 ? floor((double)max_ctx / r) : 0;
        double nx = qr + d + (r > 0 ? 2 * width : 0) + (csa ? 4 * dI + HI : 0);
        double w = 4 * (2 * (mix * n * D + mix + 3) + 2 * D + qr + d + H + (r > 0 ? r * width + d : 0) +
                        (csa ? r * 2 * dI + dI : 0));
        w += f->mlp_type[L] == DSV4_MLP_HASH_MOE ? V * K * 4 : E * 4;
        const double q8 = (qr + d) * D + (csa ? HI * dI * qr : 0) + H * d * qr + G * o_r * (H * d / G) +
                          D * G * o_r + 3 * NI * D;
        w += 2 * ((nx - qr - d) * D + E * D) + q8 * q8_bytes(fp8) + E * 3 * NI * D * q4_bytes(fp8);
        double c = C * (W + pool) * kv_entry_bytes(f, kv8);
        if (r > 0) c += 2 * C * (csa ? 2 : 1) * r * width * 4;
        if (csa) c += C * pool * dI * 2 + 2 * C * 2 * r * 2 * dI * 4, pool_csa = pool;
        p->per_layer_w[L] = w, p->per_layer_cache[L] = c;
        p->total += w + c;
    }
    /* logits, indexer scores, kernel workspace (split-K partials, top-k), cuBLAS workspace, activations */
    p->scratch = C * (V * 4 + pool_csa * 4 * 2) + C * (H * d * 12 + 16 * n * D) + (64.0 + 32.0) * (1 << 20);
    if (fp32_indexer) p->scratch += C * HI * pool_csa * 4; /* the naive indexer's fp32 [C, H, n] products */
    p->total += p->global + p->scratch;
}

void bench_step_roofline(const dsv4_config *f, int C, int live, int fp8, int kv8, double *bytes, double *flops)
{
    const double D = f->hidden_size, n = f->hc_mult, V = f->vocab_size, H = f->num_attention_heads,
                 d = f->head_dim, qr = f->q_lora_rank, HI = f->index_n_heads, dI = f->index_head_dim,
                 E = f->n_routed_experts, K = f->num_experts_per_tok, NI = f->moe_intermediate_size,
                 W = f->sliding_window, G = f->o_groups, o_r = f->o_lora_rank, mix = (2 + n) * n, topk = f->index_topk;
    const double touched = E * (1.0 - pow(1.0 - K / E, C)); /* expected distinct experts of C·K uniform picks */
    double b = V * D * 2 + C * D * 2 + n * n * D * 4, fl = 2 * C * V * D;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        const int csa = f->attn_type[L] == DSV4_ATTN_CSA, r = f->compress_ratio[L];
        const double width = (csa ? 2 : 1) * d, ent = r > 0 ? floor((double)live / r) : 0;
        double nx = qr + d + (r > 0 ? 2 * width : 0) + (csa ? 4 * dI + HI : 0);
        double dense = nx * D + (csa ? HI * dI * qr : 0) + H * d * qr + G * o_r * (H * d / G) + D * G * o_r +
                       (E + 2 * NI) * D + D * NI;
        const double q8 = (qr + d) * D + (csa ? HI * dI * qr : 0) + H * d * qr + G * o_r * (H * d / G) +
                          D * G * o_r + 3 * NI * D; /* the part of dense the checkpoint keeps in FP8 */
        double nidx = W + (csa ? (ent < topk ? ent : topk) : ent);
        b += (dense - q8) * 2 + q8 * q8_bytes(fp8) + 2 * mix * n * D * 4 + touched * 3 * NI * D * q4_bytes(fp8);
        b += C * nidx * kv_entry_bytes(f, kv8) + (csa ? C * ent * dI * 2 : 0); /* KV rows gathered, indexer keys */
        b += 4 * C * n * D * 2;                                          /* the residual streams, twice r+w */
        fl += 2 * C * (dense + K * 3 * NI * D + 2 * mix * n * D) + 4 * C * H * nidx * d;
        if (csa) fl += 2 * C * ent * HI * dI;
    }
    *bytes = b, *flops = fl;
}
