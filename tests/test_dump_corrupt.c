/* test_dump_corrupt.c - bad dumps get a clear error naming the file (and dataset), never a crash or HDF5 noise.
 *
 * Each corruption is its own test: wrong schema, missing schema, a missing required attribute, an attribute of
 * the wrong type, prompt_len / n_decode out of range, /tokens not prompt_len + n_decode long, positions out of order or out of range, ids stored as floats, a bad mode,
 * datasets of the wrong shape or dtype for the config, a file that is not HDF5, a truncated file, and a
 * damaged compressed chunk. A valid dump is written with the writer, then broken with the raw HDF5 API.
 * HDF5 must stay quiet: stderr is captured around each open and must be empty.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include "test_dump_common.h"

/* A valid dump: tiny config, P = 10, n_decode = 6, all 16 positions, a few probes and one wide extra. */
static void write_valid(const char *path)
{
    dsv4_config cfg;
    test_dump_config(&cfg);
    dsv4_dump_meta meta = test_dump_meta(10, 6);
    int32_t tokens[16] = {0};
    dsv4_dump_writer *w = NULL;
    int32_t pos[16];
    for (int i = 0; i < 16; i++) pos[i] = i;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, &cfg, tokens, 16, pos, 16, &w) == 0, "%s", dsv4_last_error());
    float row[64];
    int32_t ids[3] = {0, 1, 2};
    int64_t d64[1] = {64}, d3[1] = {3}, dwide[1] = {20000};
    float *wide = malloc(20000 * sizeof *wide);
    for (int r = 0; r < 16; r++) {
        test_dump_fill_f32(row, 64, (uint64_t)r);
        test_dump_fill_f32(wide, 20000, 100 + (uint64_t)r);
        ck_assert_int_eq(dsv4_dump_writer_row(w, "layers/1/attn_out", r, DSV4_DTYPE_F32, 1, d64, row), 0);
        ck_assert_int_eq(dsv4_dump_writer_row(w, "layers/1/topk_idx", r, DSV4_DTYPE_I32, 1, d3, ids), 0);
        ck_assert_int_eq(dsv4_dump_writer_row(w, "layers/0/wide_extra", r, DSV4_DTYPE_F32, 1, dwide, wide), 0);
    }
    free(wide);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);
}

/* Opens path with stderr captured; returns the rc, asserts HDF5 printed nothing and d is NULL on failure. */
static int open_quietly(const char *path, dsv4_dump **d)
{
    fflush(stderr);
    int saved = dup(2);
    char errpath[] = "/tmp/dsv4-dump-stderr-XXXXXX";
    int fd = mkstemp(errpath);
    ck_assert(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    int rc = dsv4_dump_open(path, d);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    close(fd);
    unlink(errpath);
    ck_assert_msg(len == 0, "%lld bytes on stderr while opening %s", (long long)len, path);
    if (rc) ck_assert_ptr_null(*d);
    return rc;
}

static void expect_open_error(const char *path, int code, const char *needle1, const char *needle2)
{
    dsv4_dump *d = NULL;
    int rc = open_quietly(path, &d);
    dsv4_dump_free(d);
    ck_assert_msg(rc == code, "open %s: got %d (%s), expected %d", path, rc, dsv4_last_error(), code);
    ck_assert_msg(strstr(dsv4_last_error(), path), "message does not name the file: %s", dsv4_last_error());
    if (needle1) ck_assert_msg(strstr(dsv4_last_error(), needle1), "message lacks '%s': %s", needle1, dsv4_last_error());
    if (needle2) ck_assert_msg(strstr(dsv4_last_error(), needle2), "message lacks '%s': %s", needle2, dsv4_last_error());
}

static hid_t open_rw(const char *path)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    return f;
}

static void set_fixed_str_attr(hid_t obj, const char *name, const char *value)
{
    if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(value) + 1);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0 && H5Awrite(a, t, value) >= 0);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
}

static void set_int_attr(hid_t obj, const char *name, long long v)
{
    if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0 && H5Awrite(a, H5T_NATIVE_LLONG, &v) >= 0);
    H5Aclose(a);
    H5Sclose(s);
}

/* Replaces dataset `name` by a contiguous one of `type`, dims, holding `data` (given as native mtype). */
static void replace_dataset(hid_t f, const char *name, hid_t type, hid_t mtype, int ndim, const hsize_t *dims,
                            const void *data)
{
    if (H5Lexists(f, name, H5P_DEFAULT) > 0) H5Ldelete(f, name, H5P_DEFAULT);
    hid_t s = H5Screate_simple(ndim, dims, NULL);
    hid_t d = H5Dcreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(d >= 0);
    if (data) ck_assert(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(d);
    H5Sclose(s);
}

#define SETUP(tag)                                                                                                 \
    char *dir = dsv4_test_mkdtemp(tag);                                                                            \
    const char *path = test_dump_path(dir, "d.h5", 0);                                                             \
    write_valid(path)

START_TEST(test_valid_dump_opens)
{
    SETUP("corrupt-valid");
    dsv4_dump *d = NULL;
    ck_assert_msg(open_quietly(path, &d) == 0, "%s", dsv4_last_error());
    dsv4_dataset_info info;
    ck_assert_msg(dsv4_dump_info(d, "layers/1/attn_out", &info) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_dump_info(d, "layers/0/wide_extra", &info) == 0, "%s", dsv4_last_error());
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_wrong_schema_names_the_schema_found)
{
    SETUP("corrupt-schema");
    hid_t f = open_rw(path);
    set_fixed_str_attr(f, "schema", "dsv4-dump/0");
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_FORMAT, "dsv4-dump/0", NULL);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_missing_schema_attribute)
{
    SETUP("corrupt-noschema");
    hid_t f = open_rw(path);
    H5Adelete(f, "schema");
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_FORMAT, "schema", NULL);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_missing_required_attribute)
{
    SETUP("corrupt-noattr");
    hid_t f = open_rw(path);
    H5Adelete(f, "weights_digest");
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_MISSING, "weights_digest", NULL);
    f = open_rw(path);
    set_fixed_str_attr(f, "weights_digest", "ab");
    H5Adelete(f, "n_decode");
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_MISSING, "n_decode", NULL);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_integer_attribute_stored_as_string)
{
    SETUP("corrupt-intstr");
    hid_t f = open_rw(path);
    set_fixed_str_attr(f, "prompt_len", "10");
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_FORMAT, "prompt_len", "integer");
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_string_attribute_stored_as_integer)
{
    SETUP("corrupt-strint");
    hid_t f = open_rw(path);
    set_int_attr(f, "weights_digest", 7);
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_FORMAT, "root attribute 'weights_digest' is not a string", NULL);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

/* prompt_len / n_decode negative, or summing past INT_MAX: refused before /tokens is sized by them */
START_TEST(test_prompt_len_or_n_decode_out_of_range)
{
    SETUP("corrupt-lens");
    static const long long bad[][2] = {{-1, 6}, {10, -6}, {10, 2147483647LL}};
    for (int i = 0; i < 3; i++) {
        hid_t f = open_rw(path);
        set_int_attr(f, "prompt_len", bad[i][0]);
        set_int_attr(f, "n_decode", bad[i][1]);
        H5Fclose(f);
        expect_open_error(path, DSV4_ERR_FORMAT, "out of range", "n_decode");
    }
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_bad_mode)
{
    SETUP("corrupt-mode");
    hid_t f = open_rw(path);
    set_fixed_str_attr(f, "mode", "sampled");
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_FORMAT, "sampled", NULL);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_tokens_length_mismatch)
{
    SETUP("corrupt-tokens");
    hid_t f = open_rw(path);
    set_int_attr(f, "prompt_len", 11); /* 11 + 6 = 17, /tokens holds 16 */
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_SHAPE, "/tokens", "17");
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_tokens_stored_as_float)
{
    SETUP("corrupt-tokf");
    hid_t f = open_rw(path);
    float tok[16] = {0};
    hsize_t dims[1] = {16};
    replace_dataset(f, "tokens", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, dims, tok);
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_SHAPE, "/tokens", "integer");
    f = open_rw(path);
    H5Ldelete(f, "tokens", H5P_DEFAULT);
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_MISSING, "/tokens", NULL);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_positions_not_ascending_or_out_of_range)
{
    SETUP("corrupt-pos");
    hid_t f = open_rw(path);
    int32_t pos[16];
    for (int i = 0; i < 16; i++) pos[i] = i;
    pos[7] = 6; /* repeats position 6 */
    hsize_t dims[1] = {16};
    replace_dataset(f, "positions", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, dims, pos);
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_FORMAT, "/positions[7]", NULL);
    f = open_rw(path);
    pos[7] = 7;
    pos[15] = 16; /* T = 16 */
    replace_dataset(f, "positions", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, dims, pos);
    H5Fclose(f);
    expect_open_error(path, DSV4_ERR_FORMAT, "/positions[15]", NULL);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

/* Asserts info and read_rows of `name` fail with DSV4_ERR_SHAPE naming file, dataset and both shapes. */
static void expect_shape_error(const char *path, const char *name, const char *got, const char *want)
{
    dsv4_dump *d = NULL;
    ck_assert_msg(open_quietly(path, &d) == 0, "%s", dsv4_last_error());
    dsv4_dataset_info info;
    float buf[16 * 64 * 4];
    ck_assert_int_eq(dsv4_dump_info(d, name, &info), DSV4_ERR_SHAPE);
    const char *m = dsv4_last_error();
    ck_assert_msg(strstr(m, path) && strstr(m, name), "message does not name file and dataset: %s", m);
    if (got) ck_assert_msg(strstr(m, got), "message lacks the actual shape %s: %s", got, m);
    if (want) ck_assert_msg(strstr(m, want), "message lacks the expected shape %s: %s", want, m);
    ck_assert_int_eq(dsv4_dump_read_rows(d, name, 0, 1, buf), DSV4_ERR_SHAPE);
    dsv4_dump_free(d);
}

START_TEST(test_dataset_of_wrong_row_shape)
{
    SETUP("corrupt-shape");
    hid_t f = open_rw(path);
    float data[16 * 63] = {0};
    hsize_t dims[2] = {16, 63};
    replace_dataset(f, "layers/1/attn_out", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, dims, data);
    H5Fclose(f);
    expect_shape_error(path, "layers/1/attn_out", "[16,63]", "[16,64]");
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_dataset_with_wrong_row_count)
{
    SETUP("corrupt-rows");
    hid_t f = open_rw(path);
    float data[15 * 64] = {0};
    hsize_t dims[2] = {15, 64};
    replace_dataset(f, "layers/1/attn_out", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, dims, data);
    H5Fclose(f);
    expect_shape_error(path, "layers/1/attn_out", "[15,64]", "[16,64]");
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_out_missing_the_stream_dimension)
{
    SETUP("corrupt-out");
    hid_t f = open_rw(path);
    float data[16 * 64] = {0};
    hsize_t dims[2] = {16, 64};
    replace_dataset(f, "layers/2/out", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, dims, data);
    H5Fclose(f);
    expect_shape_error(path, "layers/2/out", "[16,64]", "[16,4,64]");
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_ids_stored_as_float)
{
    SETUP("corrupt-idsf");
    hid_t f = open_rw(path);
    float data[16 * 3] = {0};
    hsize_t dims[2] = {16, 3};
    replace_dataset(f, "layers/1/topk_idx", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, dims, data);
    H5Fclose(f);
    expect_shape_error(path, "layers/1/topk_idx", "floating point", "int32");
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_compressed_kv_with_too_many_entries)
{
    SETUP("corrupt-ckv");
    hid_t f = open_rw(path);
    float data[5 * 32] = {0};
    hsize_t dims[2] = {5, 32}; /* layer 1: 16 div 4 = 4 entries at most */
    replace_dataset(f, "layers/1/compressed_kv", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, dims, data);
    H5Fclose(f);
    expect_shape_error(path, "layers/1/compressed_kv", "[5,32]", "[4,32]");
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_not_an_hdf5_file)
{
    char *dir = dsv4_test_mkdtemp("corrupt-text");
    const char *path = test_dump_path(dir, "text.h5", 0);
    FILE *fp = fopen(path, "w");
    fputs("{\"this\": \"is json, not HDF5\"}\n", fp);
    fclose(fp);
    expect_open_error(path, DSV4_ERR_FORMAT, "not an HDF5 file", NULL);
    fp = fopen(path, "w"); /* empty */
    fclose(fp);
    expect_open_error(path, DSV4_ERR_FORMAT, "not an HDF5 file", NULL);
    expect_open_error(test_dump_path(dir, "absent.h5", 1), DSV4_ERR_IO, NULL, NULL);
    expect_open_error(dir, DSV4_ERR_IO, "not a regular file", NULL);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_truncated_hdf5_file)
{
    SETUP("corrupt-trunc");
    struct stat st;
    ck_assert(stat(path, &st) == 0);
    const char *cut = test_dump_path(dir, "cut.h5", 1);
    const off_t lengths[] = {8, 100, 600, 2048, st.st_size / 2, st.st_size - 1};
    FILE *in = fopen(path, "rb");
    char *all = malloc((size_t)st.st_size);
    ck_assert(fread(all, 1, (size_t)st.st_size, in) == (size_t)st.st_size);
    fclose(in);
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        FILE *out = fopen(cut, "wb");
        fwrite(all, 1, (size_t)lengths[i], out);
        fclose(out);
        dsv4_dump *d = NULL;
        int rc = open_quietly(cut, &d);
        dsv4_dump_free(d);
        ck_assert_msg(rc == DSV4_ERR_FORMAT, "%lld of %lld bytes: open gave %d (%s)", (long long)lengths[i],
                      (long long)st.st_size, rc, dsv4_last_error());
        ck_assert_ptr_nonnull(strstr(dsv4_last_error(), cut));
        /* Past the superblock, HDF5's own diagnosis comes through. */
        if (lengths[i] >= 2048) ck_assert_msg(strstr(dsv4_last_error(), "truncated file"), "%s", dsv4_last_error());
    }
    free(all);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_damaged_compressed_chunk)
{
    SETUP("corrupt-chunk");
    /* wide_extra is 16 rows x 80 KB of incompressible data: the middle of the file is its chunks. */
    struct stat st;
    ck_assert(stat(path, &st) == 0);
    int fd = open(path, O_RDWR);
    unsigned char junk[64];
    for (int i = 0; i < 64; i++) junk[i] = (unsigned char)(i * 37 + 11);
    ck_assert(pwrite(fd, junk, sizeof junk, st.st_size / 2) == (ssize_t)sizeof junk);
    close(fd);
    dsv4_dump *d = NULL;
    ck_assert_msg(open_quietly(path, &d) == 0, "%s", dsv4_last_error());
    float *buf = malloc(16 * 20000 * sizeof *buf);
    int rc = dsv4_dump_read_rows(d, "layers/0/wide_extra", 0, 16, buf);
    ck_assert_msg(rc == DSV4_ERR_FORMAT, "reading a damaged chunk gave %d (%s)", rc, dsv4_last_error());
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "layers/0/wide_extra"));
    free(buf);
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

static Suite *dump_corrupt_suite(void)
{
    Suite *s = suite_create("dump_corrupt");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_valid_dump_opens);
    tcase_add_test(tc, test_wrong_schema_names_the_schema_found);
    tcase_add_test(tc, test_missing_schema_attribute);
    tcase_add_test(tc, test_missing_required_attribute);
    tcase_add_test(tc, test_integer_attribute_stored_as_string);
    tcase_add_test(tc, test_string_attribute_stored_as_integer);
    tcase_add_test(tc, test_prompt_len_or_n_decode_out_of_range);
    tcase_add_test(tc, test_bad_mode);
    tcase_add_test(tc, test_tokens_length_mismatch);
    tcase_add_test(tc, test_tokens_stored_as_float);
    tcase_add_test(tc, test_positions_not_ascending_or_out_of_range);
    tcase_add_test(tc, test_dataset_of_wrong_row_shape);
    tcase_add_test(tc, test_dataset_with_wrong_row_count);
    tcase_add_test(tc, test_out_missing_the_stream_dimension);
    tcase_add_test(tc, test_ids_stored_as_float);
    tcase_add_test(tc, test_compressed_kv_with_too_many_entries);
    tcase_add_test(tc, test_not_an_hdf5_file);
    tcase_add_test(tc, test_truncated_hdf5_file);
    tcase_add_test(tc, test_damaged_compressed_chunk);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dsv4_test_main(dump_corrupt_suite());
}
