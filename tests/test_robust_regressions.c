/* test_robust_regressions.c - every input a fuzzer once crashed on (tests/fuzz/regressions/<target>/) is fed again
 * to the parser it crashed, through the public API, in every build: each must now be refused (or accepted)
 * cleanly; in the sanitizer build an overflow, an undefined conversion or a leak fails the test.
 *   config/       dsv4_config_parse, then dsv4_config_expected_tensors
 *   safetensors/  the file as model.safetensors of a folder with the tests' tiny config, dsv4_model_open
 *   index/        the file as the index.json of a two-shard tiny model, dsv4_model_open
 *   dump/         structure-aware inputs are not files: skipped here (tests/fuzz/smoke.sh replays them)
 *   dump_raw/     the file as a dump, dsv4_dump_open and every dataset's info
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4_test.h"
#include "st_writer.h"

static void put(const char *dir, const char *name, const char *data, size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* Calls fn(path) for every file of tests/fuzz/regressions/<target>/; returns how many. */
static int each_input(const char *target, void (*fn)(const char *path))
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", dsv4_test_source_path("tests/fuzz/regressions"));
    size_t n = strlen(dir);
    snprintf(dir + n, sizeof dir - n, "/%s", target);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        fn(path);
        count++;
    }
    closedir(d);
    return count;
}

static void run_config(const char *path)
{
    size_t len;
    char *text = dsv4_test_read_file(path, &len);
    dsv4_config cfg;
    if (dsv4_config_parse(text, path, &cfg) == 0) {
        dsv4_expected_tensor *t;
        int n;
        if (dsv4_config_expected_tensors(&cfg, &t, &n) == 0) free(t);
    } else {
        ck_assert_msg(strstr(dsv4_last_error(), path), "message does not name the input: %s", dsv4_last_error());
    }
    free(text);
}

static void run_safetensors(const char *path)
{
    size_t len;
    char *bytes = dsv4_test_read_file(path, &len);
    char *dir = dsv4_test_mkdtemp("regress");
    put(dir, "config.json", dsv4_stw_tiny_config(), strlen(dsv4_stw_tiny_config()));
    put(dir, "model.safetensors", bytes, len);
    dsv4_model *m;
    if (dsv4_model_open(dir, &m) == 0) dsv4_model_free(m);
    free(bytes);
    dsv4_test_rmtree(dir);
}

static void run_index(const char *path)
{
    size_t len;
    char *bytes = dsv4_test_read_file(path, &len);
    char *dir = dsv4_test_mkdtemp("regress");
    dsv4_stw_model_opts o = {DSV4_STW_OFFICIAL_F32, NULL, NULL, 2};
    ck_assert_int_eq(dsv4_stw_make_model(dir, dsv4_stw_tiny_config(), &o), 0);
    put(dir, "model.safetensors.index.json", bytes, len);
    dsv4_model *m;
    if (dsv4_model_open(dir, &m) == 0) dsv4_model_free(m);
    free(bytes);
    dsv4_test_rmtree(dir);
}

static void run_dump(const char *path)
{
    dsv4_dump *d;
    if (dsv4_dump_open(path, &d)) return;
    for (int i = 0; i < dsv4_dump_dataset_count(d); i++) {
        dsv4_dataset_info info;
        dsv4_dump_info(d, dsv4_dump_dataset_name(d, i), &info);
    }
    dsv4_dump_free(d);
}

START_TEST(test_fuzz_regressions)
{
    int n = each_input("config", run_config);
    n += each_input("safetensors", run_safetensors);
    n += each_input("index", run_index);
    n += each_input("dump_raw", run_dump);
    ck_assert_int_ge(n, 1); /* at least the partial_rotary_factor = 1e25 config */
}
END_TEST

START_TEST(test_partial_rotary_factor_out_of_int_range)
{
    /* the first fuzz_config finding: head_dim * 1e25 converted to int (undefined behaviour) */
    static const char *const texts[] = {
        "{\"vocab_size\": 96, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
        "\"head_dim\": 32, \"partial_rotary_factor\": 1E25}",
        "{\"vocab_size\": 96, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
        "\"head_dim\": 32, \"partial_rotary_factor\": -1E300}",
    };
    for (int i = 0; i < 2; i++) {
        dsv4_config cfg;
        ck_assert_int_eq(dsv4_config_parse(texts[i], "config.json", &cfg), DSV4_ERR_CONFIG);
        ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "partial_rotary_factor"));
    }
    const char *yarn = "{\"vocab_size\": 96, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
                       "\"head_dim\": 32, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, "
                       "\"original_max_position_embeddings\": 1e300}}";
    dsv4_config cfg;
    ck_assert_int_eq(dsv4_config_parse(yarn, "config.json", &cfg), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "original_max_position_embeddings\" = 1e+300 is out of range"));
}
END_TEST

static Suite *robust_regressions_suite(void)
{
    Suite *s = suite_create("robust_regressions");
    TCase *tc = tcase_create("fuzz");
    tcase_add_test(tc, test_fuzz_regressions);
    tcase_add_test(tc, test_partial_rotary_factor_out_of_int_range);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dsv4_test_main(robust_regressions_suite());
}
