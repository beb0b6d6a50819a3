/* test_robust_dump.c - bad dumps the dump tests (tests/test_dump_*.c) do not cover: a huge declared /tokens or
 * /positions (refused before its buffer is allocated), NaN and other non-JSON in config_json, a config_json whose
 * sizes are absurd, positions beyond the tokens, a dataset of a huge declared shape, a layer group named like a
 * number but not one, and `dsv4 verify` against a dump whose config_json is absurd (every probe fails its structure
 * check, with the config's message). docs/robustness.md lists
 * every bad input with its test. */
#define _POSIX_C_SOURCE 200809L
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4_test.h"
#include "synth_dump.h"

/* A small valid dump (synth golden) at dir/name; returns its path (static buffer). */
static const char *valid_dump(const char *dir, const char *name)
{
    static char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(path, &s, 0), 0);
    return path;
}

/* Replaces dataset `name` by a chunked one of `n` int32 entries, declared only (never written). */
static void declare_ids(const char *path, const char *name, hsize_t n)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    H5Ldelete(f, name, H5P_DEFAULT);
    hsize_t chunk[1] = {n < (1u << 20) ? n : (1u << 20)};
    hid_t s = H5Screate_simple(1, &n, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    hid_t d = H5Dcreate2(f, name, H5T_STD_I32LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ck_assert(d >= 0);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(s);
    H5Fclose(f);
}

static void set_int_attr(const char *path, const char *name, long long v)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    if (H5Aexists(f, name) > 0) H5Adelete(f, name);
    hid_t s = H5Screate(H5S_SCALAR), a = H5Acreate2(f, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0 && H5Awrite(a, H5T_NATIVE_LLONG, &v) >= 0);
    H5Aclose(a);
    H5Sclose(s);
    H5Fclose(f);
}

static void expect_open(const char *path, int code, const char *a, const char *b)
{
    dsv4_dump *d = (dsv4_dump *)1;
    int rc = dsv4_dump_open(path, &d);
    const char *msg = dsv4_last_error();
    ck_assert_msg(rc == code, "open: want %d, got %d: %s", code, rc, msg);
    ck_assert_ptr_null(d);
    ck_assert_msg(strstr(msg, path), "message lacks the file: %s", msg);
    if (a) ck_assert_msg(strstr(msg, a), "message lacks '%s': %s", a, msg);
    if (b) ck_assert_msg(strstr(msg, b), "message lacks '%s': %s", b, msg);
}

START_TEST(test_huge_declared_tokens_refused_before_allocating)
{
    char *dir = dsv4_test_mkdtemp("robust-dump");
    const char *path = valid_dump(dir, "d.h5");
    /* 2^31 - 1 tokens declared (a few KB on disk), prompt_len + n_decode agreeing: 8 GiB if read */
    declare_ids(path, "tokens", 2147483647ull);
    set_int_attr(path, "prompt_len", 2147483647ll - 16);
    setenv("DSV4_HOST_MEM_LIMIT", "256M", 1);
    expect_open(path, DSV4_ERR_NOMEM, "/tokens: needs 8.0 GiB", "DSV4_HOST_MEM_LIMIT");
    unsetenv("DSV4_HOST_MEM_LIMIT");
    /* and when the counts disagree, the count is refused before any allocation at all */
    set_int_attr(path, "prompt_len", 24);
    expect_open(path, DSV4_ERR_SHAPE, "/tokens has 2147483647 entries", "expected at most 40");
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_huge_declared_positions)
{
    char *dir = dsv4_test_mkdtemp("robust-dump");
    const char *path = valid_dump(dir, "d.h5");
    declare_ids(path, "positions", 1ull << 34);
    expect_open(path, DSV4_ERR_SHAPE, "/positions has 17179869184 entries", NULL);
    declare_ids(path, "positions", 41); /* more positions than tokens (40) */
    expect_open(path, DSV4_ERR_SHAPE, "/positions has 41 entries", "expected at most 40");
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_nan_and_absurd_config_json)
{
    char *dir = dsv4_test_mkdtemp("robust-dump");
    const char *path = valid_dump(dir, "d.h5");
    static const char *const bad[][2] = {
        {"{\"vocab_size\": NaN, \"hidden_size\": 64}", "not valid JSON"},
        {"{\"vocab_size\": Infinity}", "not valid JSON"},
        {"", "not valid JSON"},
        {"[1, 2]", "not a JSON object"},
        {"{\"vocab_size\": 16, \"hidden_size\": 8, \"num_hidden_layers\": 1000000000, \"num_attention_heads\": 2, "
         "\"head_dim\": 8}",
         "must be 1..128"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(synth_set_root_attr(path, "config_json", bad[i][0]), 0);
        dsv4_dump *d;
        ck_assert_msg(dsv4_dump_open(path, &d) == 0, "a dump with a bad config still opens: %s", dsv4_last_error());
        const dsv4_config *cfg = (const dsv4_config *)1;
        int rc = dsv4_dump_config(d, &cfg);
        ck_assert_msg(rc == DSV4_ERR_CONFIG && strstr(dsv4_last_error(), bad[i][1]), "%zu: %d %s", i, rc,
                      dsv4_last_error());
        ck_assert_ptr_null(cfg);
        dsv4_dataset_info info;
        ck_assert_int_eq(dsv4_dump_info(d, "layers/0/attn_out", &info), DSV4_ERR_CONFIG); /* cannot check shapes */
        ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "cannot check layers/0/attn_out against the config"));
        dsv4_dump_free(d);
    }
    /* dsv4 verify: every probe of the candidate fails its structure check with the config's message (exit 1) */
    const char *good = valid_dump(dir, "good.h5");
    char cmd[9000], *out = NULL, json[4200];
    snprintf(json, sizeof json, "%s/report.json", dir);
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s/d.h5' --json '%s'", dsv4_test_bin(), good, dir, json);
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == 1, "verify exit %d, want 1:\n%s", st, out);
    ck_assert_msg(strstr(out, "cannot check layers/0/attn_hc_pre against the config") && strstr(out, "must be 1..128"),
                  "%s", out);
    free(out);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_dataset_with_a_huge_declared_shape)
{
    char *dir = dsv4_test_mkdtemp("robust-dump");
    const char *path = valid_dump(dir, "d.h5");
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "layers/0/attn_out", H5P_DEFAULT);
    hsize_t dims[2] = {1ull << 40, 1ull << 20}, chunk[2] = {1, 1024};
    hid_t s = H5Screate_simple(2, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 2, chunk);
    hid_t d = H5Dcreate2(f, "layers/0/attn_out", H5T_IEEE_F32LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ck_assert(d >= 0);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(s);
    H5Fclose(f);
    dsv4_dump *dd;
    ck_assert_int_eq(dsv4_dump_open(path, &dd), 0);
    dsv4_dataset_info info;
    ck_assert_int_eq(dsv4_dump_info(dd, "layers/0/attn_out", &info), DSV4_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "has shape [1099511627776,1048576], expected [40,"));
    float row[8];
    ck_assert_int_eq(dsv4_dump_read_rows(dd, "layers/0/attn_out", 0, 1, row), DSV4_ERR_SHAPE);
    dsv4_dump_free(dd);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_layer_group_not_a_number)
{
    char *dir = dsv4_test_mkdtemp("robust-dump");
    const char *path = valid_dump(dir, "d.h5");
    static const char *const names[] = {"layers/007", "layers/-1", "layers/1e3", "layers/99999999999999999999"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
        hid_t g = H5Gcreate2(f, names[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        ck_assert(g >= 0);
        H5Gclose(g);
        H5Fclose(f);
        expect_open(path, DSV4_ERR_FORMAT, names[i], "layer groups are named by their number");
        f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
        H5Ldelete(f, names[i], H5P_DEFAULT);
        H5Fclose(f);
    }
    dsv4_test_rmtree(dir);
}
END_TEST

static Suite *robust_dump_suite(void)
{
    Suite *s = suite_create("robust_dump");
    TCase *tc = tcase_create("dumps");
    tcase_add_test(tc, test_huge_declared_tokens_refused_before_allocating);
    tcase_add_test(tc, test_huge_declared_positions);
    tcase_add_test(tc, test_nan_and_absurd_config_json);
    tcase_add_test(tc, test_dataset_with_a_huge_declared_shape);
    tcase_add_test(tc, test_layer_group_not_a_number);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dsv4_test_main(robust_dump_suite());
}
