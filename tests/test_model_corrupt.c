/* test_model_corrupt.c - bad input to the loader, one START_TEST per corruption: each must give its own
 * error code and a message naming the file and (where there is one) the tensor, never a crash or a leak,
 * and `dsv4 inspect` must exit 2 for unreadable input and 1 for tensors that do not match the config. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4/dsv4.h"
#include "dsv4_test.h"
#include "st_writer.h"

/* A small valid file's worth of tensors: two F32 and one BF16. */
static dsv4_stw *small_set(void)
{
    dsv4_stw *w = dsv4_stw_new();
    float a[12] = {0}, b[4] = {1, 2, 3, 4};
    uint16_t c[8] = {0};
    int64_t sa[2] = {3, 4}, sb[1] = {4}, sc[1] = {8};
    ck_assert_int_eq(dsv4_stw_add_f32(w, "layers.0.hc_attn_fn", 2, sa, a), 0);
    ck_assert_int_eq(dsv4_stw_add_f32(w, "layers.0.attn.attn_sink", 1, sb, b), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "norm.weight", "BF16", 1, sc, c, sizeof c), 0);
    return w;
}

static void write_config(const char *dir, const char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* Write config + model.safetensors (w is freed) and return the folder. */
static char *folder(dsv4_stw *w, const dsv4_stw_corrupt *c)
{
    char *dir = dsv4_test_mkdtemp("corrupt");
    ck_assert_ptr_nonnull(dir);
    write_config(dir, dsv4_stw_tiny_config());
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(dsv4_stw_write(w, path, c), 0);
    dsv4_stw_free(w);
    return dir;
}

/* dsv4_model_open must fail with `code`, the message naming the file `fname` and containing n1 and n2;
 * `dsv4 inspect` must exit 2 and print the same. */
static void expect_open_error(char *dir, int code, const char *fname, const char *n1, const char *n2)
{
    dsv4_model *m = (dsv4_model *)1;
    int rc = dsv4_model_open(dir, &m);
    const char *msg = dsv4_last_error();
    ck_assert_msg(rc == code, "open: want %d, got %d: %s", code, rc, msg);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(msg, dir) && strstr(msg, fname), "message lacks the file %s/%s: %s", dir, fname, msg);
    if (n1) ck_assert_msg(strstr(msg, n1), "message lacks '%s': %s", n1, msg);
    if (n2) ck_assert_msg(strstr(msg, n2), "message lacks '%s': %s", n2, msg);
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s'", dsv4_test_bin(), dir);
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == 2, "inspect exit %d, want 2:\n%s", st, out);
    if (n1) ck_assert_msg(strstr(out, n1), "inspect output lacks '%s':\n%s", n1, out);
    free(out);
    dsv4_test_rmtree(dir);
}

START_TEST(test_valid_baseline)
{
    /* the fixture itself is fine: the corruptions below are what fails */
    char *dir = folder(small_set(), NULL);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    ck_assert_int_eq(dsv4_model_tensor_count(m), 3);
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_truncated_file)
{
    dsv4_stw_corrupt c = {.truncate_bytes = 5};
    expect_open_error(folder(small_set(), &c), DSV4_ERR_FORMAT, "model.safetensors", "norm.weight", "past the end");
}
END_TEST

START_TEST(test_shorter_than_header_length)
{
    char *dir = dsv4_test_mkdtemp("corrupt");
    write_config(dir, dsv4_stw_tiny_config());
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    fwrite("\x10\x00\x00", 1, 3, f);
    fclose(f);
    expect_open_error(dir, DSV4_ERR_FORMAT, "model.safetensors", "truncated", NULL);
}
END_TEST

START_TEST(test_header_length_past_eof)
{
    dsv4_stw_corrupt c = {.header_len_delta = 100000};
    expect_open_error(folder(small_set(), &c), DSV4_ERR_FORMAT, "model.safetensors", "header length", "past the end");
}
END_TEST

START_TEST(test_header_not_json)
{
    dsv4_stw_corrupt c = {.header_text = "{\"norm.weight\": {\"dtype\": \"BF16\", "};
    expect_open_error(folder(small_set(), &c), DSV4_ERR_FORMAT, "model.safetensors", "not valid JSON", NULL);
}
END_TEST

START_TEST(test_header_not_object)
{
    dsv4_stw_corrupt c = {.header_text = "[1, 2, 3]       "};
    expect_open_error(folder(small_set(), &c), DSV4_ERR_FORMAT, "model.safetensors", "not an object", NULL);
}
END_TEST

START_TEST(test_duplicate_keys)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_add_raw_entry(w, "norm.weight", "{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,16]}"),
                     0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "duplicate", "norm.weight");
}
END_TEST

/* One malformed header entry beside valid ones: each shape of entry gets its own message naming the tensor. */
START_TEST(test_malformed_header_entry)
{
    static const struct {
        const char *entry, *says;
    } cases[] = {
        {"5", "header entry is not an object"},
        {"{\"shape\":[8],\"data_offsets\":[0,16]}", "missing or non-string \"dtype\""},
        {"{\"dtype\":8,\"shape\":[8],\"data_offsets\":[0,16]}", "missing or non-string \"dtype\""},
        {"{\"dtype\":\"BF16\",\"data_offsets\":[0,16]}", "missing or non-array \"shape\""},
        {"{\"dtype\":\"BF16\",\"shape\":[1,1,1,2,4],\"data_offsets\":[0,16]}", "5 dims (at most 4 supported)"},
        {"{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0]}", "\"data_offsets\" must be [begin, end]"},
        {"{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,\"16\"]}", "\"data_offsets\" must be [begin, end]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsv4_stw *w = small_set();
        ck_assert_int_eq(dsv4_stw_add_raw_entry(w, "layers.0.bad", cases[i].entry), 0);
        expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "layers.0.bad", cases[i].says);
    }
}
END_TEST

START_TEST(test_offsets_out_of_range)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_set_offsets(w, "layers.0.attn.attn_sink", 64, 48), 0); /* begin > end */
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "layers.0.attn.attn_sink", "out of range");
}
END_TEST

START_TEST(test_negative_offsets)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_set_offsets(w, "layers.0.attn.attn_sink", -16, 0), 0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "layers.0.attn.attn_sink", "out of range");
}
END_TEST

START_TEST(test_overlapping_offsets)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_set_offsets(w, "layers.0.attn.attn_sink", 40, 56), 0); /* inside hc_attn_fn [0,48) */
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "overlap", "layers.0.hc_attn_fn");
}
END_TEST

START_TEST(test_past_the_end_offsets)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_set_offsets(w, "norm.weight", 64, 80), 0); /* data section is 80 bytes: [64,80) ok */
    ck_assert_int_eq(dsv4_stw_set_offsets(w, "layers.0.attn.attn_sink", 72, 88), 0); /* ends past 80 */
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "layers.0.attn.attn_sink", "past the end");
}
END_TEST

START_TEST(test_shape_times_dtype_mismatch)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_set_shape_text(w, "layers.0.attn.attn_sink", "[5]"), 0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "layers.0.attn.attn_sink", "20 bytes");
}
END_TEST

START_TEST(test_unknown_dtype)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_set_dtype_text(w, "norm.weight", "F7"), 0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "norm.weight", "unknown dtype \"F7\"");
}
END_TEST

START_TEST(test_negative_dim)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_set_shape_text(w, "layers.0.hc_attn_fn", "[-3, -4]"), 0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "layers.0.hc_attn_fn", "negative dim");
}
END_TEST

START_TEST(test_overflowing_dim)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_set_shape_text(w, "layers.0.hc_attn_fn", "[4294967296, 4294967296, 4294967296]"), 0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "layers.0.hc_attn_fn", "overflow");
}
END_TEST

START_TEST(test_non_integer_dim)
{
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_set_shape_text(w, "layers.0.hc_attn_fn", "[3, \"4\"]"), 0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "layers.0.hc_attn_fn", "integers");
}
END_TEST

START_TEST(test_same_tensor_twice)
{
    dsv4_stw *w = small_set();
    uint16_t c[8] = {0};
    int64_t sc[1] = {8};
    ck_assert_int_eq(dsv4_stw_add(w, "model.norm.weight", "BF16", 1, sc, c, sizeof c), 0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "appears twice", "model.norm.weight");
}
END_TEST

/* ---------------------------------------------------------------------------------- config.json */
START_TEST(test_config_missing)
{
    char *dir = dsv4_test_mkdtemp("corrupt");
    expect_open_error(dir, DSV4_ERR_IO, "config.json", "cannot open", NULL);
}
END_TEST

START_TEST(test_config_missing_field)
{
    char *dir = folder(small_set(), NULL);
    write_config(dir, "{\"vocab_size\": 96, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"head_dim\": 32}");
    expect_open_error(dir, DSV4_ERR_CONFIG, "config.json", "num_attention_heads", "missing");
}
END_TEST

START_TEST(test_config_wrong_type)
{
    char *dir = folder(small_set(), NULL);
    write_config(dir, "{\"vocab_size\": 96, \"hidden_size\": \"64\", \"num_hidden_layers\": 4, "
                      "\"num_attention_heads\": 8, \"head_dim\": 32}");
    expect_open_error(dir, DSV4_ERR_CONFIG, "config.json", "hidden_size", "integer");
}
END_TEST

/* ------------------------------------------------------------------------------ index and shards */
static char *sharded(void)
{
    char *dir = dsv4_test_mkdtemp("corrupt");
    dsv4_stw_model_opts o = {DSV4_STW_OFFICIAL_F32, NULL, NULL, 2};
    ck_assert_int_eq(dsv4_stw_make_model(dir, dsv4_stw_tiny_config(), &o), 0);
    return dir;
}

START_TEST(test_index_missing_shard)
{
    char *dir = sharded();
    char path[4200];
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    ck_assert_int_eq(unlink(path), 0);
    expect_open_error(dir, DSV4_ERR_IO, "model.safetensors.index.json", "model-00002-of-00002.safetensors",
                      "does not exist");
}
END_TEST

START_TEST(test_index_tensor_not_in_shard)
{
    char *dir = sharded();
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"weight_map\": {\"embed.weight\": \"model-00001-of-00002.safetensors\", "
          "\"head.weight\": \"model-00001-of-00002.safetensors\"}}",
          f); /* head.weight is in shard 2 */
    fclose(f);
    expect_open_error(dir, DSV4_ERR_FORMAT, "model.safetensors.index.json", "head.weight", "not in its shard");
}
END_TEST

START_TEST(test_index_not_json)
{
    char *dir = sharded();
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"weight_map\": ", f);
    fclose(f);
    expect_open_error(dir, DSV4_ERR_FORMAT, "model.safetensors.index.json", "not valid JSON", NULL);
}
END_TEST

START_TEST(test_corrupt_shard_named)
{
    char *dir = sharded();
    char path[4200];
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    ck_assert_int_eq(truncate(path, 100), 0);
    expect_open_error(dir, DSV4_ERR_FORMAT, "model-00002-of-00002.safetensors", NULL, NULL);
}
END_TEST

/* ------------------------------------------------------------------- tensors against the config */
/* A full tiny model with one change; open succeeds, check and inspect report the problem (exit 1). */
static void expect_check_problem(const char *omit, const char *misshape, const char *n1, const char *n2)
{
    char *dir = dsv4_test_mkdtemp("corrupt");
    dsv4_stw_model_opts o = {DSV4_STW_OFFICIAL_QUANT, omit, misshape, 1};
    ck_assert_int_eq(dsv4_stw_make_model(dir, dsv4_stw_tiny_config(), &o), 0);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    ck_assert_int_gt(dsv4_model_check(m, NULL, NULL), 0);
    dsv4_model_free(m);
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s'", dsv4_test_bin(), dir);
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == 1, "inspect exit %d, want 1:\n%s", st, out);
    ck_assert_msg(strstr(out, n1), "inspect output lacks '%s':\n%s", n1, out);
    if (n2) ck_assert_msg(strstr(out, n2), "inspect output lacks '%s':\n%s", n2, out);
    free(out);
    dsv4_test_rmtree(dir);
}

START_TEST(test_missing_tensor)
{
    expect_check_problem("layers.2.attn.compressor.ape", NULL, "missing: layers.2.attn.compressor.ape", "[8,32]");
    /* and a path asking for it gets DSV4_ERR_MISSING naming it */
    char *dir = dsv4_test_mkdtemp("corrupt");
    dsv4_stw_model_opts o = {DSV4_STW_OFFICIAL_QUANT, "layers.2.attn.compressor.ape", NULL, 1};
    ck_assert_int_eq(dsv4_stw_make_model(dir, dsv4_stw_tiny_config(), &o), 0);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    const float *v;
    ck_assert_int_eq(dsv4_model_f32(m, "layers.2.attn.compressor.ape", 8 * 32, &v), DSV4_ERR_MISSING);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "layers.2.attn.compressor.ape"));
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_wrong_shape_tensor)
{
    expect_check_problem(NULL, "layers.1.attn.wkv.weight", "mis-shaped: layers.1.attn.wkv.weight", "expected [32,64]");
}
END_TEST

START_TEST(test_wrong_shape_fp4_expert)
{
    expect_check_problem(NULL, "layers.3.ffn.experts.1.w2.weight", "mis-shaped: layers.3.ffn.experts.1.w2.weight",
                         "[65,32]");
}
END_TEST

START_TEST(test_missing_scale)
{
    /* an FP8 weight whose .scale is absent: check reports it, and dequantising it fails naming it */
    dsv4_stw *w = dsv4_stw_new();
    uint8_t q[64] = {0x38};
    int64_t s[2] = {8, 8};
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.attn.wkv.weight", "F8_E4M3", 2, s, q, sizeof q), 0);
    char *dir = folder(w, NULL);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    float v[64];
    ck_assert_int_eq(dsv4_model_read_f32(m, "layers.0.attn.wkv.weight", v, 64), DSV4_ERR_MISSING);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "layers.0.attn.wkv.weight"));
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "scale"));
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_wrong_scale_shape)
{
    dsv4_stw *w = dsv4_stw_new();
    uint8_t q[64] = {0x38}, sc[2] = {127, 127};
    int64_t s[2] = {8, 8}, ss[2] = {1, 2};
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.attn.wkv.weight", "F8_E4M3", 2, s, q, sizeof q), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.attn.wkv.scale", "F8_E8M0", 2, ss, sc, 2), 0);
    char *dir = folder(w, NULL);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    float v[64];
    ck_assert_int_eq(dsv4_model_read_f32(m, "layers.0.attn.wkv.weight", v, 64), DSV4_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "layers.0.attn.wkv.scale"));
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "want [1,1]"));
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

/* The tiny model made in dir (with o's options) as a writer holding every tensor it opened with, to add more to;
 * *cfg its config. */
static dsv4_stw *tiny_model_copy(const char *dir, const dsv4_stw_model_opts *o, dsv4_config *cfg)
{
    ck_assert_int_eq(dsv4_stw_make_model(dir, dsv4_stw_tiny_config(), o), 0);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    dsv4_stw *all = dsv4_stw_new();
    for (int i = 0; i < dsv4_model_tensor_count(m); i++) {
        const dsv4_tensor *t = dsv4_model_tensor_at(m, i);
        ck_assert_int_eq(dsv4_stw_add(all, t->name, dsv4_dtype_name(t->dtype), t->ndim, t->shape, t->data, t->nbytes),
                         0);
    }
    *cfg = *dsv4_model_config(m);
    dsv4_model_free(m);
    return all;
}

/* Write `all` as dir's model.safetensors (freeing it), run `dsv4 inspect dir`, which must exit 1; its output. */
static char *inspect_written(dsv4_stw *all, const char *dir)
{
    char path[4200], cmd[4400], *out = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(dsv4_stw_write(all, path, NULL), 0);
    dsv4_stw_free(all);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s'", dsv4_test_bin(), dir);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 1);
    return out;
}

START_TEST(test_unexpected_tensor)
{
    /* a complete model plus one stray tensor (reported) and one MTP tensor (ignored: not used by decode) */
    char *dir = dsv4_test_mkdtemp("corrupt");
    dsv4_stw_model_opts o = {DSV4_STW_OFFICIAL_F32, NULL, NULL, 1};
    dsv4_config cfg;
    dsv4_stw *all = tiny_model_copy(dir, &o, &cfg);
    float x[2] = {1, 2};
    int64_t s[1] = {2};
    ck_assert_int_eq(dsv4_stw_add_f32(all, "layers.9.attn.bogus", 1, s, x), 0);
    ck_assert_int_eq(dsv4_stw_add_f32(all, "mtp.0.enorm.weight", 1, s, x), 0);
    char *out = inspect_written(all, dir);
    ck_assert_msg(strstr(out, "unexpected: layers.9.attn.bogus"), "%s", out);
    ck_assert_msg(!strstr(out, "unexpected: mtp.0"), "%s", out);
    ck_assert_msg(strstr(out, "check: 1 problem\n"), "%s", out);
    free(out);
    dsv4_test_rmtree(dir);
}
END_TEST

/* ------------------------------------------------------------------ counts that size what open builds */
START_TEST(test_fused_experts_count_not_the_config)
{
    /* a fused tensor is split into one view per expert: 10^9 experts of 0 bytes each would be 10^9 views (and
     * ~150 GB of names), so the count is checked against n_routed_experts (4 in the fixture) before any is made */
    dsv4_stw *w = small_set();
    ck_assert_int_eq(dsv4_stw_add_raw_entry(w, "model.layers.0.mlp.experts.gate_up_proj",
                                            "{\"dtype\":\"BF16\",\"shape\":[1000000000,0,64],\"data_offsets\":[0,0]}"),
                     0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "model.layers.0.mlp.experts.gate_up_proj",
                      "holds 1000000000 experts, the config's n_routed_experts is 4");
    w = small_set();
    ck_assert_int_eq(dsv4_stw_add_raw_entry(w, "model.layers.1.mlp.experts.down_proj",
                                            "{\"dtype\":\"BF16\",\"shape\":[5,0,32],\"data_offsets\":[0,0]}"),
                     0);
    expect_open_error(folder(w, NULL), DSV4_ERR_FORMAT, "model.safetensors", "model.layers.1.mlp.experts.down_proj",
                      "holds 5 experts");
}
END_TEST

START_TEST(test_expert_id_past_int)
{
    /* "4294967296" read with %d wrapped to expert 0 and stood in for the missing layers.0.ffn.experts.0.w1 */
    char *dir = dsv4_test_mkdtemp("corrupt");
    dsv4_stw_model_opts o = {DSV4_STW_OFFICIAL_F32, "layers.0.ffn.experts.0.w1.weight", NULL, 1};
    dsv4_config cfg;
    dsv4_stw *all = tiny_model_copy(dir, &o, &cfg);
    int64_t s[2] = {cfg.moe_intermediate_size, cfg.hidden_size};
    float *x = calloc((size_t)(s[0] * s[1]), sizeof *x);
    ck_assert_int_eq(dsv4_stw_add_f32(all, "model.layers.0.mlp.experts.4294967296.gate_proj.weight", 2, s, x), 0);
    free(x);
    char *out = inspect_written(all, dir);
    ck_assert_msg(strstr(out, "unexpected: layers.0.mlp.experts.4294967296.gate_proj.weight"), "%s", out);
    ck_assert_msg(strstr(out, "missing: layers.0.ffn.experts.0.w1.weight"), "%s", out);
    ck_assert_msg(strstr(out, "check: 2 problems\n"), "%s", out);
    free(out);
    dsv4_test_rmtree(dir);
}
END_TEST

/* --------------------------------------------- FIFOs and directories where files are read (these hung) */
START_TEST(test_index_fifo_or_directory)
{
    char *dir = sharded();
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    expect_open_error(dir, DSV4_ERR_IO, "model.safetensors.index.json", "not a regular file", NULL);
    dir = sharded();
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    expect_open_error(dir, DSV4_ERR_IO, "model.safetensors.index.json", "not a regular file", NULL);
}
END_TEST

/* The digest hashes every *.safetensors of a sharded folder (dump-format.md), named by the index or not: one that
 * is not a regular file is refused in-process and by `dsv4 inspect --digest` (exit 2), never read. */
static void expect_digest_refused(const char *extra, int fifo)
{
    char *dir = sharded();
    char path[4200], cmd[4400], *out = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, extra);
    ck_assert_int_eq(fifo ? mkfifo(path, 0600) : mkdir(path, 0700), 0);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0); /* the index does not name it */
    char hex[65];
    int rc = dsv4_model_weights_digest(m, hex);
    const char *msg = dsv4_last_error();
    ck_assert_msg(rc == DSV4_ERR_IO, "digest: want IO, got %d: %s", rc, msg);
    ck_assert_msg(strstr(msg, path) && strstr(msg, "not a regular file"), "message lacks %s / the problem: %s", path,
                  msg);
    dsv4_model_free(m);
    snprintf(cmd, sizeof cmd, "'%s' inspect --digest '%s'", dsv4_test_bin(), dir);
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == 2, "inspect --digest exit %d, want 2:\n%s", st, out);
    ck_assert_msg(strstr(out, extra) && strstr(out, "not a regular file"), "inspect output:\n%s", out);
    free(out);
    dsv4_test_rmtree(dir);
}

START_TEST(test_digest_fifo_or_directory_shard)
{
    expect_digest_refused("zz-extra.safetensors", 1);
    expect_digest_refused("aa-dir.safetensors", 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_corrupt");
    TCase *tc = tcase_create("corrupt");
    tcase_add_test(tc, test_valid_baseline);
    tcase_add_test(tc, test_truncated_file);
    tcase_add_test(tc, test_shorter_than_header_length);
    tcase_add_test(tc, test_header_length_past_eof);
    tcase_add_test(tc, test_header_not_json);
    tcase_add_test(tc, test_header_not_object);
    tcase_add_test(tc, test_duplicate_keys);
    tcase_add_test(tc, test_malformed_header_entry);
    tcase_add_test(tc, test_offsets_out_of_range);
    tcase_add_test(tc, test_negative_offsets);
    tcase_add_test(tc, test_overlapping_offsets);
    tcase_add_test(tc, test_past_the_end_offsets);
    tcase_add_test(tc, test_shape_times_dtype_mismatch);
    tcase_add_test(tc, test_unknown_dtype);
    tcase_add_test(tc, test_negative_dim);
    tcase_add_test(tc, test_overflowing_dim);
    tcase_add_test(tc, test_non_integer_dim);
    tcase_add_test(tc, test_same_tensor_twice);
    tcase_add_test(tc, test_config_missing);
    tcase_add_test(tc, test_config_missing_field);
    tcase_add_test(tc, test_config_wrong_type);
    tcase_add_test(tc, test_index_missing_shard);
    tcase_add_test(tc, test_index_tensor_not_in_shard);
    tcase_add_test(tc, test_index_not_json);
    tcase_add_test(tc, test_corrupt_shard_named);
    tcase_add_test(tc, test_missing_tensor);
    tcase_add_test(tc, test_wrong_shape_tensor);
    tcase_add_test(tc, test_wrong_shape_fp4_expert);
    tcase_add_test(tc, test_missing_scale);
    tcase_add_test(tc, test_wrong_scale_shape);
    tcase_add_test(tc, test_unexpected_tensor);
    tcase_add_test(tc, test_fused_experts_count_not_the_config);
    tcase_add_test(tc, test_expert_id_past_int);
    suite_add_tcase(s, tc);
    /* a regression here hangs on a FIFO: a short timeout makes it a failure, not a 10-minute stall */
    TCase *hang = tcase_create("no_hang");
    tcase_set_timeout(hang, 60);
    tcase_add_test(hang, test_index_fifo_or_directory);
    tcase_add_test(hang, test_digest_fifo_or_directory_shard);
    suite_add_tcase(s, hang);
    return dsv4_test_main(s);
}
