/* test_dump_common.h - the small model config and helpers shared by the tests/test_dump_*.c tests.
 *
 * The config is model-spec §16's tiny recipe (4 layers: sliding, CSA, HCA, CSA; hash MoE then MoE;
 * CSA ratio 4, HCA ratio 8, index_topk 3), once as config.json text (what a dump embeds and the reader
 * parses) and once filled by hand (what the writer and probe sink are given), so the tests do not depend
 * on the reader to build their inputs. test_dump_roundtrip's test_hand_config_is_the_json_config checks that
 * the two agree, field by field.
 */
#ifndef TEST_DUMP_COMMON_H
#define TEST_DUMP_COMMON_H

#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4_test.h"

static const char test_dump_config_json[] =
    "{\n"
    "  \"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\",\n"
    "  \"vocab_size\": 256, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,\n"
    "  \"num_key_value_heads\": 1, \"head_dim\": 32, \"qk_rope_head_dim\": 8, \"partial_rotary_factor\": 0.25,\n"
    "  \"q_lora_rank\": 32, \"o_groups\": 2, \"o_lora_rank\": 16, \"sliding_window\": 8,\n"
    "  \"layer_types\": [\"sliding_attention\", \"compressed_sparse_attention\",\n"
    "                    \"heavily_compressed_attention\", \"compressed_sparse_attention\"],\n"
    "  \"mlp_layer_types\": [\"hash_moe\", \"moe\", \"moe\", \"moe\"],\n"
    "  \"compress_rates\": {\"compressed_sparse_attention\": 4, \"heavily_compressed_attention\": 8},\n"
    "  \"index_n_heads\": 16, \"index_head_dim\": 16, \"index_topk\": 3,\n"
    "  \"n_routed_experts\": 8, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2,\n"
    "  \"moe_intermediate_size\": 32, \"num_hash_layers\": 1, \"scoring_func\": \"sqrtsoftplus\",\n"
    "  \"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true, \"routed_scaling_factor\": 1.5,\n"
    "  \"swiglu_limit\": 10.0, \"hidden_act\": \"silu\", \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20,\n"
    "  \"hc_eps\": 1e-06, \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 4096,\n"
    "  \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,\n"
    "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 256,\n"
    "                   \"beta_fast\": 32, \"beta_slow\": 1},\n"
    "  \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1,\n"
    "  \"attention_bias\": false, \"attention_dropout\": 0.0, \"torch_dtype\": \"float32\"\n"
    "}\n";

static inline void test_dump_config(dsv4_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 256;
    c->hidden_size = 64;
    c->num_hidden_layers = 4;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 1;
    c->head_dim = 32;
    c->qk_rope_head_dim = 8;
    c->q_lora_rank = 32;
    c->o_groups = 2;
    c->o_lora_rank = 16;
    c->sliding_window = 8;
    c->index_n_heads = 16;
    c->index_head_dim = 16;
    c->index_topk = 3;
    c->n_routed_experts = 8;
    c->n_shared_experts = 1;
    c->num_experts_per_tok = 2;
    c->moe_intermediate_size = 32;
    c->num_hash_layers = 1;
    c->norm_topk_prob = 1;
    c->routed_scaling_factor = 1.5;
    c->swiglu_limit = 10.0;
    c->hc_mult = 4;
    c->hc_sinkhorn_iters = 20;
    c->hc_eps = 1e-6;
    c->rms_norm_eps = 1e-6;
    c->max_position_embeddings = 4096;
    c->bos_token_id = 0;
    c->eos_token_id = 1;
    snprintf(c->scoring_func, sizeof c->scoring_func, "sqrtsoftplus");
    c->compress_rate_csa = 4;
    c->compress_rate_hca = 8;
    const dsv4_attn_type at[4] = {DSV4_ATTN_SLIDING, DSV4_ATTN_CSA, DSV4_ATTN_HCA, DSV4_ATTN_CSA};
    const int ratio[4] = {0, 4, 8, 4};
    for (int l = 0; l < 4; l++) {
        c->attn_type[l] = at[l];
        c->mlp_type[l] = l == 0 ? DSV4_MLP_HASH_MOE : DSV4_MLP_MOE;
        c->compress_ratio[l] = ratio[l];
    }
}

static inline dsv4_dump_meta test_dump_meta(int prompt_len, int n_decode)
{
    dsv4_dump_meta m = {
        .producer = "dsv4 0.1 test",
        .config_json = test_dump_config_json,
        .weights_digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        .prompt_len = prompt_len,
        .n_decode = n_decode,
        .mode = "forced",
    };
    return m;
}

/* Deterministic xorshift stream (fixed seeds: every run writes the same bytes). */
static inline uint32_t test_dump_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 11);
}

static inline void test_dump_fill_f32(float *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) p[i] = ((float)(test_dump_rand(&s) & 0xffffff) / 16777216.0f - 0.5f) * 8.0f;
}

static inline void test_dump_fill_i32(int32_t *p, size_t n, uint64_t seed, int32_t mod)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (size_t i = 0; i < n; i++) p[i] = (int32_t)(test_dump_rand(&s) % (uint32_t)mod);
}

static inline int test_dump_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* "<dir>/<name>" in a static buffer per slot (slot 0..3). */
static inline const char *test_dump_path(const char *dir, const char *name, int slot)
{
    static char buf[4][4096];
    snprintf(buf[slot & 3], sizeof buf[0], "%s/%s", dir, name);
    return buf[slot & 3];
}

/* Every HDF5 file the dump code opened is closed again (HDF5 frees what is left at exit, so a sanitizer
 * would not see it). Files are opened with H5F_CLOSE_STRONG, so this also covers their datasets/groups. */
static inline void test_dump_assert_no_open_handles(void)
{
    ssize_t n = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    ck_assert_msg(n == 0, "%zd HDF5 file objects still open", n);
}

#endif
