/* test_model_config.c - config.json -> dsv4_config for both dialects (model-spec §1): the released
 * DeepSeek-V4-Flash config, the transformers save_pretrained config, transformers' defaults for absent keys,
 * and each validation error naming the file and the key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4_test.h"
#include "st_writer.h"

/* The released DeepSeek-V4-Flash config.json (model-spec §1.1), compress_ratios [0,0] + [4,128]*20 + [4,0]. */
static char *flash_config(void)
{
    static char buf[8192];
    char ratios[1024];
    size_t k = (size_t)snprintf(ratios, sizeof ratios, "[0, 0");
    for (int i = 0; i < 20; i++) k += (size_t)snprintf(ratios + k, sizeof ratios - k, ", 4, 128");
    snprintf(ratios + k, sizeof ratios - k, ", 4, 0]");
    snprintf(buf, sizeof buf,
             "{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\",\n"
             " \"vocab_size\": 129280, \"hidden_size\": 4096, \"num_hidden_layers\": 43,\n"
             " \"num_nextn_predict_layers\": 1, \"num_attention_heads\": 64, \"num_key_value_heads\": 1,\n"
             " \"head_dim\": 512, \"qk_rope_head_dim\": 64, \"q_lora_rank\": 1024, \"o_groups\": 8,\n"
             " \"o_lora_rank\": 1024, \"sliding_window\": 128, \"compress_ratios\": %s,\n"
             " \"compress_rope_theta\": 160000, \"rope_theta\": 10000,\n"
             " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536,\n"
             "                  \"beta_fast\": 32, \"beta_slow\": 1},\n"
             " \"max_position_embeddings\": 1048576, \"index_n_heads\": 64, \"index_head_dim\": 128,\n"
             " \"index_topk\": 512, \"n_routed_experts\": 256, \"n_shared_experts\": 1, \"num_experts_per_tok\": 6,\n"
             " \"moe_intermediate_size\": 2048, \"num_hash_layers\": 3, \"scoring_func\": \"sqrtsoftplus\",\n"
             " \"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true, \"routed_scaling_factor\": 1.5,\n"
             " \"swiglu_limit\": 10.0, \"hidden_act\": \"silu\", \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20,\n"
             " \"hc_eps\": 1e-06, \"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": false, \"bos_token_id\": 0,\n"
             " \"eos_token_id\": 1, \"torch_dtype\": \"bfloat16\", \"expert_dtype\": \"fp4\",\n"
             " \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\",\n"
             "                         \"weight_block_size\": [128, 128], \"activation_scheme\": \"dynamic\"},\n"
             " \"attention_bias\": false, \"attention_dropout\": 0.0, \"initializer_range\": 0.02,\n"
             " \"transformers_version\": \"4.57.1\"}\n",
             ratios);
    return buf;
}

START_TEST(test_released_flash_config)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_parse(flash_config(), "flash/config.json", &c), 0);
    ck_assert_int_eq(c.vocab_size, 129280);
    ck_assert_int_eq(c.hidden_size, 4096);
    ck_assert_int_eq(c.num_hidden_layers, 43);
    ck_assert_int_eq(c.num_attention_heads, 64);
    ck_assert_int_eq(c.head_dim, 512);
    ck_assert_int_eq(c.qk_rope_head_dim, 64);
    ck_assert_int_eq(c.q_lora_rank, 1024);
    ck_assert_int_eq(c.o_groups, 8);
    ck_assert_int_eq(c.o_lora_rank, 1024);
    ck_assert_int_eq(c.sliding_window, 128);
    ck_assert_int_eq(c.index_n_heads, 64);
    ck_assert_int_eq(c.index_head_dim, 128);
    ck_assert_int_eq(c.index_topk, 512);
    ck_assert_int_eq(c.n_routed_experts, 256);
    ck_assert_int_eq(c.num_experts_per_tok, 6);
    ck_assert_int_eq(c.moe_intermediate_size, 2048);
    ck_assert_int_eq(c.num_hash_layers, 3);
    ck_assert_int_eq(c.hc_mult, 4);
    ck_assert_int_eq(c.hc_sinkhorn_iters, 20);
    ck_assert_double_eq(c.routed_scaling_factor, 1.5);
    ck_assert_double_eq(c.swiglu_limit, 10.0);
    ck_assert_double_eq(c.rms_norm_eps, 1e-6);
    ck_assert_int_eq(c.max_position_embeddings, 1048576);
    ck_assert_str_eq(c.scoring_func, "sqrtsoftplus");
    ck_assert_int_eq(c.norm_topk_prob, 1);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.fp8_block_quant, 1);
    ck_assert_str_eq(c.expert_dtype, "fp4");
    /* schedule: 0,1 sliding; even >= 2 CSA (4); odd >= 3 HCA (128); hash 0-2 */
    int n[3] = {0, 0, 0};
    for (int i = 0; i < 43; i++) {
        dsv4_attn_type want = i < 2 ? DSV4_ATTN_SLIDING : i % 2 == 0 ? DSV4_ATTN_CSA : DSV4_ATTN_HCA;
        ck_assert_int_eq(c.attn_type[i], want);
        ck_assert_int_eq(c.compress_ratio[i], want == DSV4_ATTN_SLIDING ? 0 : want == DSV4_ATTN_CSA ? 4 : 128);
        ck_assert_int_eq(c.mlp_type[i], i < 3 ? DSV4_MLP_HASH_MOE : DSV4_MLP_MOE);
        n[c.attn_type[i]]++;
    }
    ck_assert_int_eq(n[DSV4_ATTN_CSA], 21);
    ck_assert_int_eq(n[DSV4_ATTN_HCA], 20);
    ck_assert_double_eq(c.rope_main.theta, 10000.0);
    ck_assert_int_eq(c.rope_main.yarn, 0);
    ck_assert_double_eq(c.rope_compress.theta, 160000.0);
    ck_assert_int_eq(c.rope_compress.yarn, 1);
    ck_assert_double_eq(c.rope_compress.factor, 16.0);
    ck_assert_int_eq(c.rope_compress.original_max_position_embeddings, 65536);
    ck_assert_double_eq(c.rope_compress.beta_fast, 32.0);
    ck_assert_double_eq(c.rope_compress.beta_slow, 1.0);
    ck_assert_str_eq(dsv4_attn_type_name(c.attn_type[2]), "csa");
    ck_assert_str_eq(dsv4_mlp_type_name(c.mlp_type[0]), "hash_moe");
    /* the Flash tensor inventory: 6 globals + per layer (16 + 3*257 experts/shared + gate 2) + compressor/indexer */
    dsv4_expected_tensor *ex;
    int ne;
    ck_assert_int_eq(dsv4_config_expected_tensors(&c, &ex, &ne), 0);
    int per_layer = 16 + 2 + 3 + 3 * 256;
    ck_assert_int_eq(ne, 6 + 43 * per_layer + 41 * 4 + 21 * 6);
    int found = 0;
    for (int i = 0; i < ne; i++) {
        if (!strcmp(ex[i].name, "layers.2.attn.compressor.ape")) {
            ck_assert_int_eq(ex[i].shape[0], 4);
            ck_assert_int_eq(ex[i].shape[1], 1024);
            found++;
        } else if (!strcmp(ex[i].name, "layers.3.attn.compressor.ape")) {
            ck_assert_int_eq(ex[i].shape[0], 128);
            ck_assert_int_eq(ex[i].shape[1], 512);
            found++;
        } else if (!strcmp(ex[i].name, "layers.0.ffn.gate.tid2eid")) {
            ck_assert_int_eq(ex[i].shape[0], 129280);
            ck_assert_int_eq(ex[i].shape[1], 6);
            found++;
        } else if (!strcmp(ex[i].name, "layers.3.ffn.gate.bias") || !strcmp(ex[i].name, "layers.4.attn.wo_a.weight")) {
            if (ex[i].ndim == 2) {
                ck_assert_int_eq(ex[i].shape[0], 8192);
                ck_assert_int_eq(ex[i].shape[1], 4096);
            }
            found++;
        } else if (!strcmp(ex[i].name, "layers.2.attn.indexer.compressor.wkv.weight")) {
            ck_assert_int_eq(ex[i].shape[0], 256);
            found++;
        } else if (!strcmp(ex[i].name, "hc_head_fn")) {
            ck_assert_int_eq(ex[i].shape[0], 4);
            ck_assert_int_eq(ex[i].shape[1], 16384);
            found++;
        } else if (!strcmp(ex[i].name, "layers.0.hc_attn_fn")) {
            ck_assert_int_eq(ex[i].shape[0], 24);
            found++;
        }
        ck_assert(strcmp(ex[i].name, "layers.3.ffn.gate.tid2eid") && strcmp(ex[i].name, "layers.0.ffn.gate.bias") &&
                  strcmp(ex[i].name, "layers.3.attn.indexer.wq_b.weight") &&
                  strcmp(ex[i].name, "layers.1.attn.compressor.wkv.weight"));
    }
    ck_assert_int_eq(found, 8);
    free(ex);
}
END_TEST

START_TEST(test_transformers_saved_config)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_parse(dsv4_stw_tiny_config(), "tiny/config.json", &c), 0);
    ck_assert_int_eq(c.num_hidden_layers, 4);
    ck_assert_int_eq(c.qk_rope_head_dim, 8); /* int(32 * 0.25) */
    ck_assert_int_eq(c.compress_rate_csa, 4);
    ck_assert_int_eq(c.compress_rate_hca, 8);
    static const dsv4_attn_type at[4] = {DSV4_ATTN_SLIDING, DSV4_ATTN_CSA, DSV4_ATTN_HCA, DSV4_ATTN_CSA};
    static const int ratio[4] = {0, 4, 8, 4};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(c.attn_type[i], at[i]);
        ck_assert_int_eq(c.compress_ratio[i], ratio[i]);
        ck_assert_int_eq(c.mlp_type[i], i == 0 ? DSV4_MLP_HASH_MOE : DSV4_MLP_MOE);
    }
    ck_assert_int_eq(c.num_hash_layers, 1);
    ck_assert_int_eq(c.rope_main.yarn, 0);
    ck_assert_double_eq(c.rope_main.theta, 10000.0);
    ck_assert_int_eq(c.rope_compress.yarn, 1);
    ck_assert_double_eq(c.rope_compress.theta, 160000.0);
    ck_assert_double_eq(c.rope_compress.factor, 16.0);
    ck_assert_int_eq(c.rope_compress.original_max_position_embeddings, 256);
    ck_assert_int_eq(c.q_lora_rank, 160);
    ck_assert_int_eq(c.index_topk, 3);
}
END_TEST

#define REQUIRED_KEYS "\"vocab_size\": 32, \"hidden_size\": 16, \"num_hidden_layers\": 5, " \
                      "\"num_attention_heads\": 8, \"head_dim\": 64"

START_TEST(test_defaults_are_transformers_defaults)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_parse("{" REQUIRED_KEYS "}", "min.json", &c), 0);
    /* V4-Pro default schedule: 2x HCA, then alternating HCA (even offset) / CSA */
    static const dsv4_attn_type at[5] = {DSV4_ATTN_HCA, DSV4_ATTN_HCA, DSV4_ATTN_HCA, DSV4_ATTN_CSA, DSV4_ATTN_HCA};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(c.attn_type[i], at[i]);
        ck_assert_int_eq(c.mlp_type[i], i < 3 ? DSV4_MLP_HASH_MOE : DSV4_MLP_MOE);
    }
    ck_assert_int_eq(c.compress_ratio[3], 4);
    ck_assert_int_eq(c.compress_ratio[0], 128);
    ck_assert_int_eq(c.qk_rope_head_dim, 8); /* int(64 * 64/512) */
    ck_assert_int_eq(c.num_key_value_heads, 1);
    ck_assert_int_eq(c.q_lora_rank, 1024);
    ck_assert_int_eq(c.o_groups, 8);
    ck_assert_int_eq(c.o_lora_rank, 1024);
    ck_assert_int_eq(c.sliding_window, 128);
    ck_assert_int_eq(c.index_n_heads, 64);
    ck_assert_int_eq(c.index_head_dim, 128);
    ck_assert_int_eq(c.index_topk, 512);
    ck_assert_int_eq(c.n_routed_experts, 256);
    ck_assert_int_eq(c.n_shared_experts, 1);
    ck_assert_int_eq(c.num_experts_per_tok, 6);
    ck_assert_int_eq(c.moe_intermediate_size, 2048);
    ck_assert_int_eq(c.hc_mult, 4);
    ck_assert_int_eq(c.hc_sinkhorn_iters, 20);
    ck_assert_double_eq(c.hc_eps, 1e-6);
    ck_assert_double_eq(c.rms_norm_eps, 1e-6);
    ck_assert_double_eq(c.routed_scaling_factor, 1.5);
    ck_assert_double_eq(c.swiglu_limit, 10.0);
    ck_assert_int_eq(c.max_position_embeddings, 1048576);
    ck_assert_int_eq(c.norm_topk_prob, 1);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.bos_token_id, 0);
    ck_assert_int_eq(c.eos_token_id, 1);
    ck_assert_str_eq(c.scoring_func, "sqrtsoftplus");
    ck_assert_double_eq(c.rope_main.theta, 10000.0);
    ck_assert_double_eq(c.rope_compress.theta, 160000.0);
    ck_assert_int_eq(c.rope_compress.yarn, 0); /* no rope_scaling: plain rope in compress layers too */
    ck_assert_int_eq(c.fp8_block_quant, 0);
}
END_TEST

START_TEST(test_legacy_keys_and_aliases)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_parse("{" REQUIRED_KEYS ", \"qk_rope_head_dim\": 16, \"num_hash_layers\": 1,"
                                       " \"compress_rate_hca\": 16, \"num_local_experts\": 8,"
                                       " \"eos_token_id\": [7, 8], \"bos_token_id\": null,"
                                       " \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0,"
                                       " \"rope_theta\": 5000.0}, \"index_head_dim\": 32}",
                                       "legacy.json", &c),
                     0);
    ck_assert_int_eq(c.qk_rope_head_dim, 16);
    ck_assert_int_eq(c.num_hash_layers, 1);
    ck_assert_int_eq(c.compress_ratio[0], 16);
    ck_assert_int_eq(c.n_routed_experts, 8);
    ck_assert_int_eq(c.eos_token_id, 7);
    ck_assert_int_eq(c.bos_token_id, -1);
    ck_assert_int_eq(c.rope_compress.yarn, 1);
    ck_assert_double_eq(c.rope_compress.factor, 4.0);
    ck_assert_double_eq(c.rope_compress.theta, 160000.0);            /* compress_rope_theta default */
    ck_assert_double_eq(c.rope_main.theta, 10000.0); /* rope_theta's default: the flat dict's 5000 sets neither */
    ck_assert_int_eq(c.rope_main.yarn, 0);
    ck_assert_int_eq(c.rope_compress.original_max_position_embeddings, 1048576); /* max_position_embeddings */
    /* partial_rotary_factor wins over qk_rope_head_dim */
    ck_assert_int_eq(dsv4_config_parse("{" REQUIRED_KEYS ", \"qk_rope_head_dim\": 16, \"partial_rotary_factor\": 0.5,"
                                       " \"index_head_dim\": 32}",
                                       "x.json", &c),
                     0);
    ck_assert_int_eq(c.qk_rope_head_dim, 32);
    /* compress_ratios longer than the layer count (MTP entries) are fine */
    ck_assert_int_eq(dsv4_config_parse("{" REQUIRED_KEYS ", \"compress_ratios\": [0, 4, 128, 4, 128, 0, 0]}", "x.json",
                                       &c),
                     0);
    ck_assert_int_eq(c.attn_type[0], DSV4_ATTN_SLIDING);
    ck_assert_int_eq(c.attn_type[2], DSV4_ATTN_HCA);
}
END_TEST

/* Parse must fail with `code` and a message containing every needle. */
static void expect_error(const char *json, int code, const char *n1, const char *n2)
{
    dsv4_config c;
    int rc = dsv4_config_parse(json, "bad/config.json", &c);
    ck_assert_msg(rc == code, "want %d, got %d (%s) for %s", code, rc, dsv4_last_error(), json);
    ck_assert_msg(strstr(dsv4_last_error(), "bad/config.json"), "message lacks the file: %s", dsv4_last_error());
    if (n1) ck_assert_msg(strstr(dsv4_last_error(), n1), "message lacks '%s': %s", n1, dsv4_last_error());
    if (n2) ck_assert_msg(strstr(dsv4_last_error(), n2), "message lacks '%s': %s", n2, dsv4_last_error());
}

START_TEST(test_config_missing_field)
{
    expect_error("{\"vocab_size\": 32, \"hidden_size\": 16, \"num_attention_heads\": 8, \"head_dim\": 64}",
                 DSV4_ERR_CONFIG, "num_hidden_layers", "missing");
}
END_TEST

START_TEST(test_config_wrong_type)
{
    expect_error("{" REQUIRED_KEYS ", \"q_lora_rank\": \"big\"}", DSV4_ERR_CONFIG, "q_lora_rank", "integer");
    expect_error("{" REQUIRED_KEYS ", \"norm_topk_prob\": 1}", DSV4_ERR_CONFIG, "norm_topk_prob", NULL);
    expect_error("{" REQUIRED_KEYS ", \"rope_theta\": \"1e4\"}", DSV4_ERR_CONFIG, "rope_theta", "number");
    expect_error("{" REQUIRED_KEYS ", \"layer_types\": \"sliding_attention\"}", DSV4_ERR_CONFIG, "layer_types", NULL);
    expect_error("{" REQUIRED_KEYS ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": \"16\"}}", DSV4_ERR_CONFIG,
                 "rope_scaling.factor", NULL);
}
END_TEST

START_TEST(test_config_not_json)
{
    expect_error("{\"vocab_size\": 32,", DSV4_ERR_CONFIG, "JSON", NULL);
    expect_error("[1, 2]", DSV4_ERR_CONFIG, "object", NULL);
    expect_error("{" REQUIRED_KEYS ", \"head_dim\": 64}", DSV4_ERR_CONFIG, "duplicate", NULL);
    expect_error("{" REQUIRED_KEYS ", \"model_type\": \"llama\"}", DSV4_ERR_CONFIG, "model_type", NULL);
}
END_TEST

START_TEST(test_config_constraints)
{
    expect_error("{" REQUIRED_KEYS ", \"num_key_value_heads\": 2}", DSV4_ERR_CONFIG, "num_key_value_heads", NULL);
    expect_error("{" REQUIRED_KEYS ", \"o_groups\": 3}", DSV4_ERR_CONFIG, "o_groups", NULL);
    expect_error("{" REQUIRED_KEYS ", \"partial_rotary_factor\": 0.109375}", DSV4_ERR_CONFIG, "even", NULL); /* 7 */
    expect_error("{" REQUIRED_KEYS ", \"partial_rotary_factor\": 1.5}", DSV4_ERR_CONFIG, "head_dim", NULL);
    expect_error("{" REQUIRED_KEYS ", \"qk_rope_head_dim\": 32, \"index_head_dim\": 16}", DSV4_ERR_CONFIG,
                 "index_head_dim", NULL);
    expect_error("{\"vocab_size\": 32, \"hidden_size\": 16, \"num_hidden_layers\": 129, \"num_attention_heads\": 8,"
                 " \"head_dim\": 64}",
                 DSV4_ERR_CONFIG, "num_hidden_layers", NULL);
    expect_error("{" REQUIRED_KEYS ", \"layer_types\": [\"sliding_attention\"]}", DSV4_ERR_CONFIG, "layer_types",
                 "num_hidden_layers");
    expect_error("{" REQUIRED_KEYS ", \"mlp_layer_types\": [\"moe\", \"moe\", \"moe\", \"moe\", \"dense\"]}",
                 DSV4_ERR_CONFIG, "mlp_layer_types", NULL);
    expect_error("{" REQUIRED_KEYS ", \"compress_ratios\": [0, 4, 128]}", DSV4_ERR_CONFIG, "compress_ratios", NULL);
    expect_error("{" REQUIRED_KEYS ", \"compress_ratios\": [0, 4, 128, 5, 0]}", DSV4_ERR_CONFIG, "compress_ratios",
                 NULL);
    expect_error("{" REQUIRED_KEYS ", \"num_experts_per_tok\": 300}", DSV4_ERR_CONFIG, "num_experts_per_tok", NULL);
    expect_error("{" REQUIRED_KEYS ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}", DSV4_ERR_CONFIG,
                 "linear", NULL);
}
END_TEST

START_TEST(test_config_rope_values)
{
    /* a base of 0 gave NaN everywhere; a base of 1 with YaRN divided by ln 1 = 0 (rope.c), a factor of 0 by 0 */
    expect_error("{" REQUIRED_KEYS ", \"rope_theta\": 0}", DSV4_ERR_CONFIG, "key \"rope_theta\" = 0",
                 "must be a number > 1");
    expect_error("{" REQUIRED_KEYS ", \"rope_theta\": -10000}", DSV4_ERR_CONFIG, "\"rope_theta\"", "> 1");
    expect_error("{" REQUIRED_KEYS ", \"rope_theta\": 1e39}", DSV4_ERR_CONFIG, "\"rope_theta\"", "at most");
    expect_error("{" REQUIRED_KEYS ", \"compress_rope_theta\": 1,"
                 " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16}}",
                 DSV4_ERR_CONFIG, "key \"compress_rope_theta\" = 1", "> 1");
    expect_error("{" REQUIRED_KEYS ", \"compress_rope_theta\": 0.5}", DSV4_ERR_CONFIG, "\"compress_rope_theta\"", NULL);
    expect_error("{" REQUIRED_KEYS ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 0}}", DSV4_ERR_CONFIG,
                 "key \"rope_scaling.factor\" = 0", "must be a number > 0");
    expect_error("{" REQUIRED_KEYS ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": -4}}", DSV4_ERR_CONFIG,
                 "rope_scaling.factor", NULL);
    expect_error("{" REQUIRED_KEYS ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 1e300}}",
                 DSV4_ERR_CONFIG, "rope_parameters.factor", "at most");
    /* the transformers dialect: each dict's own keys are named */
    const char *mc = "{" REQUIRED_KEYS ", \"rope_parameters\":"
                     " {\"main\": {\"rope_type\": \"default\", \"rope_theta\": %s},"
                     " \"compress\": {\"rope_type\": \"yarn\", \"factor\": %s, \"rope_theta\": %s}}}";
    char buf[1024];
    snprintf(buf, sizeof buf, mc, "0", "16", "160000");
    expect_error(buf, DSV4_ERR_CONFIG, "key \"rope_parameters.main.rope_theta\" = 0", NULL);
    snprintf(buf, sizeof buf, mc, "10000", "16", "1");
    expect_error(buf, DSV4_ERR_CONFIG, "key \"rope_parameters.compress.rope_theta\" = 1", NULL);
    snprintf(buf, sizeof buf, mc, "10000", "0", "160000");
    expect_error(buf, DSV4_ERR_CONFIG, "key \"rope_parameters.compress.factor\" = 0", NULL);
    /* a dict's own base wins, so a bad top-level one it replaces is not used and not refused */
    dsv4_config c;
    const char *own = "{" REQUIRED_KEYS ", \"rope_theta\": 0, \"compress_rope_theta\": 0,"
                      " \"rope_parameters\": {\"main\": {\"rope_theta\": 10000},"
                      " \"compress\": {\"rope_type\": \"yarn\", \"factor\": 16, \"rope_theta\": 160000}}}";
    ck_assert_msg(dsv4_config_parse(own, "x.json", &c) == 0, "%s", dsv4_last_error());
    ck_assert_double_eq(c.rope_main.theta, 10000.0);
    /* the released and the saved configs stay legal (their own tests check every value) */
    ck_assert_int_eq(dsv4_config_parse(flash_config(), "flash/config.json", &c), 0);
    ck_assert_int_eq(dsv4_config_parse(dsv4_stw_tiny_config(), "tiny/config.json", &c), 0);
}
END_TEST

/* transformers (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict): rope_parameters = rope_scaling or
 * rope_parameters, so a non-empty rope_scaling replaces rope_parameters whole, nested or flat; an empty one does
 * not. Then DeepseekV4Config.__post_init__: the compress rope gets the flat dict's keys with base
 * compress_rope_theta, the main rope plain rope of base rope_theta. */
START_TEST(test_rope_scaling_replaces_rope_parameters)
{
    dsv4_config c;
    const char *nested = "\"rope_parameters\": {\"main\": {\"rope_theta\": 20000},"
                         " \"compress\": {\"rope_type\": \"yarn\", \"factor\": 4, \"rope_theta\": 40000}}";
    char buf[2048];
    snprintf(buf, sizeof buf,
             "{" REQUIRED_KEYS ", \"rope_theta\": 30000, \"compress_rope_theta\": 50000, %s,"
             " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8, \"original_max_position_embeddings\": 512,"
             " \"rope_theta\": 7}}",
             nested);
    ck_assert_msg(dsv4_config_parse(buf, "x.json", &c) == 0, "%s", dsv4_last_error());
    ck_assert_double_eq(c.rope_main.theta, 30000.0);
    ck_assert_int_eq(c.rope_main.yarn, 0);
    ck_assert_int_eq(c.rope_compress.yarn, 1);
    ck_assert_double_eq(c.rope_compress.factor, 8.0);
    ck_assert_int_eq(c.rope_compress.original_max_position_embeddings, 512);
    ck_assert_double_eq(c.rope_compress.theta, 50000.0);
    /* an empty rope_scaling leaves the nested dict in charge */
    snprintf(buf, sizeof buf, "{" REQUIRED_KEYS ", %s, \"rope_scaling\": {}}", nested);
    ck_assert_msg(dsv4_config_parse(buf, "x.json", &c) == 0, "%s", dsv4_last_error());
    ck_assert_double_eq(c.rope_main.theta, 20000.0);
    ck_assert_double_eq(c.rope_compress.theta, 40000.0);
    ck_assert_double_eq(c.rope_compress.factor, 4.0);
    /* a bad key of the rope_scaling that is used is named as rope_scaling's */
    snprintf(buf, sizeof buf, "{" REQUIRED_KEYS ", %s, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 0}}",
             nested);
    expect_error(buf, DSV4_ERR_CONFIG, "key \"rope_scaling.factor\" = 0", NULL);
}
END_TEST

START_TEST(test_rope_base_just_above_one)
{
    /* legal (> 1), but ln b ~ 1e-12 puts YaRN's correction dims near 1e14: past int, undefined to convert (x86 gave
     * INT_MIN, so lo = 0 and every pair extrapolated). transformers keeps them as Python ints: lo ~ 1e14 > hi, every
     * ramp is 1 and every pair interpolated, 1 / (factor * b^e) = 1/16 with b = 1.0f in fp32 */
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_parse("{" REQUIRED_KEYS ", \"rope_parameters\": {\"main\": {\"rope_theta\": 10000},"
                                       " \"compress\": {\"rope_type\": \"yarn\", \"factor\": 16,"
                                       " \"original_max_position_embeddings\": 256, \"rope_theta\": 1.000000000001}}}",
                                       "x.json", &c),
                     0);
    int lo, hi;
    dsv4_rope_yarn_range(&c.rope_compress, c.qk_rope_head_dim, &lo, &hi);
    ck_assert_msg(lo > hi && hi == c.qk_rope_head_dim - 1, "yarn range [%d, %d]", lo, hi);
    float f[4];
    ck_assert_int_eq(c.qk_rope_head_dim, 8);
    dsv4_rope_inv_freq(&c.rope_compress, c.qk_rope_head_dim, f);
    for (int i = 0; i < 4; i++) ck_assert_msg(f[i] == 1.0f / 16.0f, "inv_freq[%d] = %g, want 1/16", i, f[i]);
}
END_TEST

START_TEST(test_config_counts_capped)
{
    /* 10^9 experts passed and made `dsv4 inspect` list 3 x 10^9 x L tensors (400 GB) */
    expect_error("{" REQUIRED_KEYS ", \"n_routed_experts\": 1000000000}", DSV4_ERR_CONFIG,
                 "key \"n_routed_experts\" = 1000000000", "must be 1..1024");
    expect_error("{" REQUIRED_KEYS ", \"num_local_experts\": 1025}", DSV4_ERR_CONFIG, "\"n_routed_experts\" = 1025",
                 "1..1024");
    expect_error("{" REQUIRED_KEYS ", \"n_shared_experts\": 1000000}", DSV4_ERR_CONFIG, "\"n_shared_experts\"",
                 "0..1024");
    expect_error("{\"vocab_size\": 32, \"hidden_size\": 16, \"num_hidden_layers\": 5, \"num_attention_heads\": 2048,"
                 " \"head_dim\": 64}",
                 DSV4_ERR_CONFIG, "\"num_attention_heads\" = 2048", "1..1024");
    expect_error("{" REQUIRED_KEYS ", \"index_n_heads\": 100000}", DSV4_ERR_CONFIG, "\"index_n_heads\"", "1..1024");
    expect_error("{\"vocab_size\": 32, \"hidden_size\": 1000000, \"num_hidden_layers\": 5, \"num_attention_heads\": 8,"
                 " \"head_dim\": 64}",
                 DSV4_ERR_CONFIG, "\"hidden_size\" = 1000000", "1..65536");
    expect_error("{" REQUIRED_KEYS ", \"moe_intermediate_size\": 2000000000}", DSV4_ERR_CONFIG,
                 "\"moe_intermediate_size\"", "1..65536");
    expect_error("{" REQUIRED_KEYS ", \"q_lora_rank\": 70000}", DSV4_ERR_CONFIG, "\"q_lora_rank\"", "1..65536");
    expect_error("{\"vocab_size\": 100000000, \"hidden_size\": 16, \"num_hidden_layers\": 5,"
                 " \"num_attention_heads\": 8, \"head_dim\": 64}",
                 DSV4_ERR_CONFIG, "\"vocab_size\" = 100000000", "1..16777216");
    expect_error("{" REQUIRED_KEYS ", \"hc_mult\": 17}", DSV4_ERR_CONFIG, "\"hc_mult\" = 17", "1..16");
    expect_error("{" REQUIRED_KEYS ", \"hc_sinkhorn_iters\": 1000000000}", DSV4_ERR_CONFIG,
                 "\"hc_sinkhorn_iters\" = 1000000000", "0..1000");
    /* at the caps themselves: legal */
    dsv4_config c;
    ck_assert_msg(dsv4_config_parse("{" REQUIRED_KEYS ", \"n_routed_experts\": 1024, \"n_shared_experts\": 1024,"
                                    " \"hc_mult\": 16, \"index_n_heads\": 1024}",
                                    "x.json", &c) == 0,
                  "%s", dsv4_last_error());
    ck_assert_int_eq(c.n_routed_experts, DSV4_MAX_EXPERTS);
}
END_TEST

START_TEST(test_config_eos_token_id_range)
{
    /* 99999999999 was truncated to an int; a list of ids is legal (transformers), each entry must be a token */
    expect_error("{" REQUIRED_KEYS ", \"eos_token_id\": 99999999999}", DSV4_ERR_CONFIG,
                 "key \"eos_token_id\" = 99999999999", "not a token id (must be 0..31)");
    expect_error("{" REQUIRED_KEYS ", \"eos_token_id\": -1}", DSV4_ERR_CONFIG, "\"eos_token_id\" = -1", "0..31");
    expect_error("{" REQUIRED_KEYS ", \"eos_token_id\": 32}", DSV4_ERR_CONFIG, "\"eos_token_id\" = 32", "0..31");
    expect_error("{" REQUIRED_KEYS ", \"eos_token_id\": [7, 4294967297]}", DSV4_ERR_CONFIG,
                 "\"eos_token_id\" = 4294967297", NULL);
    expect_error("{" REQUIRED_KEYS ", \"eos_token_id\": [7, \"8\"]}", DSV4_ERR_CONFIG, "eos_token_id",
                 "a list of integers");
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_parse("{" REQUIRED_KEYS ", \"eos_token_id\": [31, 0]}", "x.json", &c), 0);
    ck_assert_int_eq(c.eos_token_id, 31);
    ck_assert_int_eq(dsv4_config_parse("{" REQUIRED_KEYS ", \"eos_token_id\": []}", "x.json", &c), 0);
    ck_assert_int_eq(c.eos_token_id, 1);
}
END_TEST

START_TEST(test_config_load_file)
{
    dsv4_config c;
    char *dir = dsv4_test_mkdtemp("cfg");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ck_assert_int_eq(dsv4_config_load(path, &c), DSV4_ERR_IO);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), path));
    FILE *f = fopen(path, "w");
    fputs(dsv4_stw_tiny_config(), f);
    fclose(f);
    ck_assert_int_eq(dsv4_config_load(path, &c), 0);
    ck_assert_int_eq(c.hidden_size, 64);
    dsv4_test_rmtree(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, test_released_flash_config);
    tcase_add_test(tc, test_transformers_saved_config);
    tcase_add_test(tc, test_defaults_are_transformers_defaults);
    tcase_add_test(tc, test_legacy_keys_and_aliases);
    tcase_add_test(tc, test_config_missing_field);
    tcase_add_test(tc, test_config_wrong_type);
    tcase_add_test(tc, test_config_not_json);
    tcase_add_test(tc, test_config_constraints);
    tcase_add_test(tc, test_config_rope_values);
    tcase_add_test(tc, test_rope_scaling_replaces_rope_parameters);
    tcase_add_test(tc, test_rope_base_just_above_one);
    tcase_add_test(tc, test_config_counts_capped);
    tcase_add_test(tc, test_config_eos_token_id_range);
    tcase_add_test(tc, test_config_load_file);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
