/* test_robust_limits.c - resource limits: a size that would need more memory than the host (or GPU) has is
 * refused BEFORE it is allocated, with a message saying how much it would need (model/memlimit.c), in the
 * loader's dequantised caches and in the reference's state and scratch sizing; and bad inputs the loader
 * corruption tests do not cover (docs/robustness.md lists them all): a folder with no weights, zero-length
 * files, FIFOs and directories where files are expected, a symlink loop, an index naming "../x", a config with
 * 10^9 layers, a header claiming 2^60 elements. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_ref.h"
#include "dsv4_test.h"
#include "st_writer.h"

static void expect_msg(int rc, int code, const char *a, const char *b)
{
    const char *msg = dsv4_last_error();
    ck_assert_msg(rc == code, "want %d, got %d: %s", code, rc, msg);
    if (a) ck_assert_msg(strstr(msg, a), "message lacks '%s': %s", a, msg);
    if (b) ck_assert_msg(strstr(msg, b), "message lacks '%s': %s", b, msg);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* A tiny model (official names, quantised) with config_json; returns the folder. */
static char *tiny_model(const char *config_json, dsv4_stw_naming naming, int shards)
{
    char *dir = dsv4_test_mkdtemp("robust");
    dsv4_stw_model_opts o = {naming, NULL, NULL, shards};
    ck_assert_int_eq(dsv4_stw_make_model(dir, config_json ? config_json : dsv4_stw_tiny_config(), &o), 0);
    return dir;
}

/* dsv4_stw_tiny_config() with `key` set to the JSON `value` (added first: json keys are unique in the
 * fixture, so the fixture's own key is replaced textually). */
static char *config_with(const char *key, const char *value)
{
    const char *base = dsv4_stw_tiny_config();
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *at = strstr(base, pat);
    ck_assert_msg(at != NULL, "tiny config has no %s", key);
    const char *colon = strchr(at, ':'), *end = colon + 1;
    while (*end && *end != ',' && *end != '}') end++;
    size_t n = strlen(base) + strlen(value) + 8;
    char *out = malloc(n);
    snprintf(out, n, "%.*s: %s%s", (int)(colon - base), base, value, end);
    return out;
}

/* ------------------------------------------------------------------------------------ memlimit.c */
START_TEST(test_host_limit_from_environment)
{
    setenv("DSV4_HOST_MEM_LIMIT", "1M", 1);
    expect_msg(dsv4_mem_check_host(3.0 * 1024 * 1024, "a buffer"), DSV4_ERR_NOMEM, "a buffer: needs 3.0 MiB",
               "DSV4_HOST_MEM_LIMIT (1.0 MiB)");
    ck_assert_int_eq(dsv4_mem_check_host(1000, "a small one"), 0);
    unsetenv("DSV4_HOST_MEM_LIMIT");
}
END_TEST

START_TEST(test_host_more_than_the_machine_has)
{
    unsetenv("DSV4_HOST_MEM_LIMIT");
    expect_msg(dsv4_mem_check_host(1e18, "the state"), DSV4_ERR_NOMEM, "the state: needs 888.2 PiB", "available");
    ck_assert_int_eq(dsv4_mem_check_host(64.0 * 1024 * 1024, "64 MiB"), 0);
}
END_TEST

START_TEST(test_device_limit_and_allocation_failure_messages)
{
    setenv("DSV4_DEVICE_MEM_LIMIT", "2G", 1);
    expect_msg(dsv4_mem_check_device(3.0 * 1024 * 1024 * 1024, "layers.0.attn.wq_b.weight (bf16)"), DSV4_ERR_NOMEM,
               "layers.0.attn.wq_b.weight (bf16): needs 3.0 GiB of GPU memory", "DSV4_DEVICE_MEM_LIMIT (2.0 GiB)");
    unsetenv("DSV4_DEVICE_MEM_LIMIT");
    expect_msg(dsv4_mem_device_alloc_failed(1.5 * 1024 * 1024 * 1024, "kv cache", "out of memory"), DSV4_ERR_CUDA,
               "kv cache: cannot allocate 1.5 GiB on the GPU", "out of memory");
}
END_TEST

START_TEST(test_loader_refuses_a_dequantised_copy_past_the_limit)
{
    char *dir = tiny_model(NULL, DSV4_STW_OFFICIAL_QUANT, 1);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    const dsv4_tensor *t;
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.0.attn.wq_a.weight", &t), 0);
    ck_assert_int_eq(t->dtype, DSV4_DTYPE_F8_E4M3);
    size_t numel = (size_t)t->shape[0] * (size_t)t->shape[1];
    setenv("DSV4_HOST_MEM_LIMIT", "1K", 1);
    const float *v = (const float *)1;
    expect_msg(dsv4_model_f32(m, "layers.0.attn.wq_a.weight", numel, &v), DSV4_ERR_NOMEM,
               "tensor layers.0.attn.wq_a.weight dequantised to f32: needs", "KiB");
    ck_assert_ptr_null(v);
    uint16_t *bf = malloc(numel * 2);
    expect_msg(dsv4_model_read_bf16(m, "layers.0.attn.wq_a.weight", bf, numel), DSV4_ERR_NOMEM, "wq_a", "needs");
    free(bf);
    unsetenv("DSV4_HOST_MEM_LIMIT");
    ck_assert_int_eq(dsv4_model_f32(m, "layers.0.attn.wq_a.weight", numel, &v), 0); /* fine without the cap */
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_reference_refuses_a_state_larger_than_the_host)
{
    /* sliding_window sizes a ring per layer and no tensor depends on it: 10^9 rows x head_dim x 4 layers */
    char *cfg = config_with("sliding_window", "1000000000");
    char *dir = tiny_model(cfg, DSV4_STW_OFFICIAL_F32, 1);
    free(cfg);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    dsv4_ref *r = (dsv4_ref *)1;
    long before = 0;
    expect_msg(dsv4_ref_cpu_init(m, 64, &r), DSV4_ERR_NOMEM, "reference cpu", "decode state for 64 tokens");
    ck_assert_msg(strstr(dsv4_last_error(), "GiB available") || strstr(dsv4_last_error(), "TiB available"),
                  "%s", dsv4_last_error());
    ck_assert_ptr_null(r);
    (void)before;
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_reference_refuses_max_tokens_past_the_host_and_int_overflow)
{
    char *dir = tiny_model(NULL, DSV4_STW_OFFICIAL_F32, 1);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    dsv4_ref *r;
    setenv("DSV4_HOST_MEM_LIMIT", "64M", 1);
    expect_msg(dsv4_ref_cpu_init(m, 2000000000, &r), DSV4_ERR_NOMEM, "decode state for 2000000000 tokens",
               "DSV4_HOST_MEM_LIMIT");
    unsetenv("DSV4_HOST_MEM_LIMIT");
    ck_assert_int_eq(dsv4_ref_cpu_init(m, 64, &r), 0); /* the same model at a sane length is fine */
    dsv4_ref_free(r);
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
    char *cfg = config_with("sliding_window", "2147483000");
    dir = tiny_model(cfg, DSV4_STW_OFFICIAL_F32, 1);
    free(cfg);
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    expect_msg(dsv4_ref_cpu_init(m, 100000, &r), DSV4_ERR_CONFIG, "sliding_window 2147483000 + 12500 compressed",
               "does not fit an int");
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

/* ------------------------------------------------------------------------------- bad folders and files */
static void expect_open(const char *dir, int code, const char *a, const char *b)
{
    dsv4_model *m = (dsv4_model *)1;
    expect_msg(dsv4_model_open(dir, &m), code, a, b);
    ck_assert_ptr_null(m);
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s'", dsv4_test_bin(), dir);
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == 2, "inspect exit %d, want 2:\n%s", st, out);
    if (a) ck_assert_msg(strstr(out, a), "inspect output lacks '%s':\n%s", a, out);
    free(out);
}

START_TEST(test_folder_with_no_safetensors)
{
    char *dir = dsv4_test_mkdtemp("robust");
    write_text(dir, "config.json", dsv4_stw_tiny_config());
    expect_open(dir, DSV4_ERR_IO, "no model.safetensors or model.safetensors.index.json", NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_zero_length_files)
{
    char *dir = tiny_model(NULL, DSV4_STW_OFFICIAL_F32, 1);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(truncate(path, 0), 0);
    expect_open(dir, DSV4_ERR_FORMAT, "truncated: 0 bytes", "model.safetensors");
    write_text(dir, "config.json", "");
    expect_open(dir, DSV4_ERR_CONFIG, "config.json: not valid JSON", NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_fifo_and_directory_instead_of_files)
{
    /* a FIFO would block an open() or read() for ever: refused as not a regular file */
    char *dir = tiny_model(NULL, DSV4_STW_OFFICIAL_F32, 1);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    expect_open(dir, DSV4_ERR_IO, "model.safetensors: not a regular file", NULL);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    expect_open(dir, DSV4_ERR_IO, "model.safetensors: not a regular file", NULL);
    ck_assert_int_eq(rmdir(path), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    expect_open(dir, DSV4_ERR_IO, "config.json: not a regular file", NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_symlink_loop)
{
    char *dir = tiny_model(NULL, DSV4_STW_OFFICIAL_F32, 2);
    char path[4200];
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(symlink("model-00002-of-00002.safetensors", path), 0); /* points at itself: ELOOP */
    expect_open(dir, DSV4_ERR_IO, "model-00002-of-00002.safetensors", "does not exist");
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_index_pointing_outside_the_folder)
{
    char *dir = tiny_model(NULL, DSV4_STW_OFFICIAL_F32, 2);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"embed.weight\": \"../model-00001-of-00002.safetensors\"}}");
    expect_open(dir, DSV4_ERR_FORMAT, "weight_map entry for embed.weight is not a shard file name", NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"embed.weight\": \"\"}}");
    expect_open(dir, DSV4_ERR_FORMAT, "weight_map entry for embed.weight", NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"embed.weight\": 7}}");
    expect_open(dir, DSV4_ERR_FORMAT, "weight_map entry for embed.weight", NULL);
    write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
    expect_open(dir, DSV4_ERR_FORMAT, "no \"weight_map\" object", NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_config_with_a_billion_layers)
{
    char *cfg = config_with("num_hidden_layers", "1000000000");
    dsv4_config c;
    expect_msg(dsv4_config_parse(cfg, "config.json", &c), DSV4_ERR_CONFIG, "\"num_hidden_layers\" = 1000000000",
               "must be 1..128");
    free(cfg);
    cfg = config_with("num_hidden_layers", "1e300");
    expect_msg(dsv4_config_parse(cfg, "config.json", &c), DSV4_ERR_CONFIG, "num_hidden_layers", "integer");
    free(cfg);
    cfg = config_with("hidden_size", "99999999999");
    expect_msg(dsv4_config_parse(cfg, "config.json", &c), DSV4_ERR_CONFIG, "hidden_size", "does not fit an int");
    free(cfg);
    cfg = config_with("rms_norm_eps", "NaN");
    expect_msg(dsv4_config_parse(cfg, "config.json", &c), DSV4_ERR_CONFIG, "not valid JSON", NULL);
    free(cfg);
}
END_TEST

START_TEST(test_header_claiming_2_to_the_60_elements)
{
    char *dir = dsv4_test_mkdtemp("robust");
    write_text(dir, "config.json", dsv4_stw_tiny_config());
    dsv4_stw *w = dsv4_stw_new();
    float x[4] = {0};
    int64_t s[1] = {4};
    ck_assert_int_eq(dsv4_stw_add_f32(w, "norm.weight", 1, s, x), 0);
    ck_assert_int_eq(dsv4_stw_set_shape_text(w, "norm.weight", "[1073741824, 1073741824]"), 0);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(dsv4_stw_write(w, path, NULL), 0);
    dsv4_stw_free(w);
    expect_open(dir, DSV4_ERR_FORMAT, "tensor norm.weight: shape overflows", "dim 1 = 1073741824");
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_tid2eid_naming_an_expert_that_does_not_exist)
{
    /* a hash layer's token -> expert table indexes the experts: a value past n_routed_experts must not get in */
    char *dir = tiny_model(NULL, DSV4_STW_OFFICIAL_F32, 1);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    dsv4_stw *all = dsv4_stw_new();
    for (int i = 0; i < dsv4_model_tensor_count(m); i++) {
        const dsv4_tensor *t = dsv4_model_tensor_at(m, i);
        if (!strcmp(t->name, "head.weight") && dsv4_model_config(m)->tie_word_embeddings) continue;
        void *copy = malloc(t->nbytes ? t->nbytes : 1);
        memcpy(copy, t->data, t->nbytes);
        if (!strcmp(t->name, "layers.0.ffn.gate.tid2eid")) ((int64_t *)copy)[5] = 1000;
        ck_assert_int_eq(dsv4_stw_add(all, t->disk_name, dsv4_dtype_name(t->dtype), t->ndim, t->shape, copy, t->nbytes),
                         0);
        free(copy);
    }
    const dsv4_config cfg = *dsv4_model_config(m);
    dsv4_model_free(m);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(dsv4_stw_write(all, path, NULL), 0);
    dsv4_stw_free(all);
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    size_t n = (size_t)cfg.vocab_size * (size_t)cfg.num_experts_per_tok;
    int32_t *ids = malloc(n * sizeof *ids);
    expect_msg(dsv4_model_read_i32(m, "layers.0.ffn.gate.tid2eid", ids, n), DSV4_ERR_FORMAT,
               "tensor layers.0.ffn.gate.tid2eid: element 5 = 1000 is outside [0, ", NULL);
    free(ids);
    dsv4_ref *r = (dsv4_ref *)1;
    expect_msg(dsv4_ref_cpu_init(m, 16, &r), DSV4_ERR_FORMAT, "layers.0.ffn.gate.tid2eid", "outside");
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

static Suite *robust_limits_suite(void)
{
    Suite *s = suite_create("robust_limits");
    TCase *tc = tcase_create("limits");
    tcase_add_test(tc, test_host_limit_from_environment);
    tcase_add_test(tc, test_host_more_than_the_machine_has);
    tcase_add_test(tc, test_device_limit_and_allocation_failure_messages);
    tcase_add_test(tc, test_loader_refuses_a_dequantised_copy_past_the_limit);
    tcase_add_test(tc, test_reference_refuses_a_state_larger_than_the_host);
    tcase_add_test(tc, test_reference_refuses_max_tokens_past_the_host_and_int_overflow);
    suite_add_tcase(s, tc);
    tc = tcase_create("inputs");
    tcase_add_test(tc, test_folder_with_no_safetensors);
    tcase_add_test(tc, test_zero_length_files);
    tcase_add_test(tc, test_fifo_and_directory_instead_of_files);
    tcase_add_test(tc, test_symlink_loop);
    tcase_add_test(tc, test_index_pointing_outside_the_folder);
    tcase_add_test(tc, test_config_with_a_billion_layers);
    tcase_add_test(tc, test_header_claiming_2_to_the_60_elements);
    tcase_add_test(tc, test_tid2eid_naming_an_expert_that_does_not_exist);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dsv4_test_main(robust_limits_suite());
}
