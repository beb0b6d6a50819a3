/* test_dump_timing.c - how long a ~50 MB dump takes to write and to read back (printed).
 *
 * The verifier must compare two 50 MB dumps in under 2 s on a 2-core machine, so one dump must read in well
 * under a second: the chunk size (dump/writer.c) and the reader's one-chunk cache are chosen for that. The
 * read is timed twice: whole datasets, and row by row (the verifier's per-position pattern, which would
 * inflate each chunk once per row without the cache). Bounds are loose (a busy CI machine) and skipped
 * under sanitizers; the numbers are printed for the record.
 */
#define _POSIX_C_SOURCE 200809L

#include "test_dump_common.h"

#define R 48     /* stored positions */
#define D 4096   /* hidden_size */
#define V 129280 /* vocab_size */
#define L 4

/* The tiny config with Flash's width and vocabulary. */
static char *wide_config_json(void)
{
    const char *src = test_dump_config_json;
    char *out = malloc(strlen(src) + 64);
    const char *a = strstr(src, "\"vocab_size\": 256, \"hidden_size\": 64,");
    ck_assert_ptr_nonnull(a);
    size_t head = (size_t)(a - src);
    memcpy(out, src, head);
    int n = sprintf(out + head, "\"vocab_size\": %d, \"hidden_size\": %d,", V, D);
    strcpy(out + head + n, a + strlen("\"vocab_size\": 256, \"hidden_size\": 64,"));
    return out;
}

static const char *const row_probes[] = {"attn_in", "attn_out", "ffn_in", "ffn_out", "out"};

START_TEST(test_write_and_read_50mb)
{
    char *dir = dsv4_test_mkdtemp("dump-timing");
    const char *path = test_dump_path(dir, "big.h5", 0);
    dsv4_config cfg;
    test_dump_config(&cfg);
    cfg.hidden_size = D;
    cfg.vocab_size = V;
    char *json = wide_config_json();
    dsv4_dump_meta meta = test_dump_meta(R - 8, 8);
    meta.config_json = json;
    int32_t tokens[R] = {0};
    dsv4_dump_writer *w = NULL;
    double t0 = dsv4_test_now_s();
    int32_t pos[R];
    for (int i = 0; i < R; i++) pos[i] = i;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, &cfg, tokens, R, pos, R, &w) == 0, "%s", dsv4_last_error());
    dsv4_probe_sink *p = NULL;
    ck_assert_int_eq(dsv4_probe_sink_init(w, &cfg, NULL, 0, R, &p), 0);
    float *buf = malloc((size_t)V * sizeof *buf);
    size_t bytes = 0;
    /* Decode order: every probe of every layer for one position, then the next position. */
    for (int t = 0; t < R; t++) {
        for (int l = 0; l < L; l++)
            for (size_t k = 0; k < sizeof row_probes / sizeof row_probes[0]; k++) {
                size_t n = strcmp(row_probes[k], "out") == 0 ? 4 * D : D;
                test_dump_fill_f32(buf, n, (uint64_t)(t * 100 + l * 10 + (int)k));
                ck_assert_msg(dsv4_probe(p, l, row_probes[k], t, buf, n) == 0, "%s", dsv4_last_error());
                bytes += n * 4;
            }
        test_dump_fill_f32(buf, D, (uint64_t)t);
        ck_assert_int_eq(dsv4_probe(p, -1, "norm", t, buf, D), 0);
        test_dump_fill_f32(buf, V, (uint64_t)t + 7);
        ck_assert_int_eq(dsv4_probe(p, -1, "logits", t, buf, V), 0);
        bytes += (D + V) * 4;
    }
    dsv4_probe_sink_free(p);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);
    double t_write = dsv4_test_now_s() - t0;
    struct stat st;
    ck_assert(stat(path, &st) == 0);

    /* Whole datasets. */
    t0 = dsv4_test_now_s();
    dsv4_dump *d = NULL;
    ck_assert_msg(dsv4_dump_open(path, &d) == 0, "%s", dsv4_last_error());
    float *all = malloc((size_t)R * V * sizeof *all);
    double sum = 0;
    for (int i = 0; i < dsv4_dump_dataset_count(d); i++) {
        const char *name = dsv4_dump_dataset_name(d, i);
        dsv4_dataset_info info;
        ck_assert_msg(dsv4_dump_info(d, name, &info) == 0, "%s", dsv4_last_error());
        ck_assert_msg(dsv4_dump_read_rows(d, name, 0, info.shape[0], all) == 0, "%s", dsv4_last_error());
        sum += all[0];
    }
    dsv4_dump_free(d);
    double t_read = dsv4_test_now_s() - t0;

    /* Row by row, position-major like a per-position comparison. */
    t0 = dsv4_test_now_s();
    ck_assert_int_eq(dsv4_dump_open(path, &d), 0);
    for (int t = 0; t < R; t++)
        for (int i = 0; i < dsv4_dump_dataset_count(d); i++) {
            ck_assert_int_eq(dsv4_dump_read_rows(d, dsv4_dump_dataset_name(d, i), t, 1, all), 0);
            sum += all[0];
        }
    double t_rows = dsv4_test_now_s() - t0;
    /* Spot check: the last logits row is what was written. */
    test_dump_fill_f32(buf, V, (uint64_t)(R - 1) + 7);
    ck_assert_int_eq(dsv4_dump_read_rows(d, "final/logits", R - 1, 1, all), 0);
    ck_assert_mem_eq(all, buf, (size_t)V * 4);
    dsv4_dump_free(d);

    printf("dump timing: %.1f MB of probes, %.1f MB on disk: write %.3f s, read whole datasets %.3f s (%.0f MB/s), "
           "read row by row %.3f s (checksum %g)\n",
           bytes / 1e6, (double)st.st_size / 1e6, t_write, t_read, bytes / 1e6 / t_read, t_rows, sum);
    ck_assert_msg(bytes > 45e6, "the timing dump should hold ~50 MB, holds %zu bytes", bytes);
#if !defined(__SANITIZE_ADDRESS__)
    ck_assert_msg(t_read < 1.5 && t_rows < 2.0, "reading a 50 MB dump took %.3f s (whole) / %.3f s (rows)", t_read,
                  t_rows);
#endif
    free(all);
    free(buf);
    free(json);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

static Suite *dump_timing_suite(void)
{
    Suite *s = suite_create("dump_timing");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_write_and_read_50mb);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dsv4_test_main(dump_timing_suite());
}
