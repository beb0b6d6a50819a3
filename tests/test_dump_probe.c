/* test_dump_probe.c - the probe sink (dump/probe.c): positions -> rows, padding of the ragged probes, refusals.
 *
 * Traps: a probe at a position that is not stored must not land in some other row; indexer_scores rows are
 * as wide as the entries at the LAST stored position, padded with -inf (a 0 would look like a real score);
 * topk_idx is padded with -1; prefill may hand more scores than that width, which is fine only when the
 * extra ones are -inf (invisible to every stored position).
 */
#include "test_dump_common.h"

/* P = 12, n_decode = 8 (T = 20), positions {5, 11, 19}: CSA layers 1 and 3 have N = 20 div 4 = 5 entries. */
static const int32_t stored[3] = {5, 11, 19};

static dsv4_dump_writer *open_writer(const char *path, const int32_t *pos, int n_pos, dsv4_probe_sink **sink)
{
    dsv4_config cfg;
    test_dump_config(&cfg);
    dsv4_dump_meta meta = test_dump_meta(12, 8);
    int32_t tokens[20] = {0};
    dsv4_dump_writer *w = NULL;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, &cfg, tokens, 20, pos, n_pos, &w) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_probe_sink_init(w, &cfg, pos, n_pos, 20, sink) == 0, "%s", dsv4_last_error());
    return w;
}

static dsv4_dump *reopen(const char *path)
{
    dsv4_dump *d = NULL;
    ck_assert_msg(dsv4_dump_open(path, &d) == 0, "%s", dsv4_last_error());
    return d;
}

START_TEST(test_positions_not_stored_are_ignored_and_rows_follow_positions)
{
    char *dir = dsv4_test_mkdtemp("probe-pos");
    const char *path = test_dump_path(dir, "p.h5", 0);
    dsv4_probe_sink *p = NULL;
    dsv4_dump_writer *w = open_writer(path, stored, 3, &p);
    float row[64];
    for (int pos = 0; pos < 20; pos++) {
        ck_assert_int_eq(dsv4_probe_wants(p, pos), pos == 5 || pos == 11 || pos == 19);
        test_dump_fill_f32(row, 64, 500 + pos);
        ck_assert_msg(dsv4_probe(p, 2, "attn_out", pos, row, 64) == 0, "%s", dsv4_last_error());
        ck_assert_int_eq(dsv4_probe(p, -1, "norm", pos, row, 64), 0);
    }
    ck_assert_int_eq(dsv4_probe_wants(p, 20), 0);
    ck_assert_int_eq(dsv4_probe_wants(p, -1), 0);
    ck_assert_int_eq(dsv4_probe(p, 2, "attn_out", 20, row, 64), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_probe(p, 2, "attn_out", -1, row, 64), DSV4_ERR_USAGE);
    dsv4_probe_sink_free(p);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);

    dsv4_dump *d = reopen(path);
    float got[3][64], ref[64];
    dsv4_dataset_info info;
    ck_assert_int_eq(dsv4_dump_info(d, "layers/2/attn_out", &info), 0);
    ck_assert_int_eq(info.shape[0], 3);
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/2/attn_out", 0, 3, got), 0);
    for (int r = 0; r < 3; r++) {
        test_dump_fill_f32(ref, 64, 500 + (uint64_t)stored[r]);
        ck_assert_msg(memcmp(got[r], ref, sizeof ref) == 0, "row %d is not position %d", r, stored[r]);
    }
    ck_assert_int_eq(dsv4_dump_read_rows(d, "final/norm", 0, 3, got), 0);
    test_dump_fill_f32(ref, 64, 519);
    ck_assert_mem_eq(got[2], ref, sizeof ref);
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_indexer_scores_padded_with_minus_inf_to_last_position_entries)
{
    char *dir = dsv4_test_mkdtemp("probe-scores");
    const char *path = test_dump_path(dir, "s.h5", 0);
    dsv4_probe_sink *p = NULL;
    dsv4_dump_writer *w = open_writer(path, stored, 3, &p);
    /* Decode-style: each position knows (p+1) div 4 entries: 1, 3, 5. */
    const float s5[1] = {0.5f}, s11[3] = {1.f, 2.f, 3.f}, s19[5] = {5.f, 4.f, 3.f, 2.f, 1.f};
    ck_assert_msg(dsv4_probe(p, 1, "indexer_scores", 5, s5, 1) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_probe(p, 1, "indexer_scores", 11, s11, 3), 0);
    ck_assert_int_eq(dsv4_probe(p, 1, "indexer_scores", 19, s19, 5), 0);
    const float s6[6] = {5.f, 4.f, 3.f, 2.f, 1.f, 7.f}; /* a 6th, visible score: wider than the row */
    ck_assert_int_eq(dsv4_probe(p, 1, "indexer_scores", 19, s6, 6), DSV4_ERR_USAGE);
    /* Layer 3 is CSA too; an unstored position is ignored even with a bad length. */
    ck_assert_int_eq(dsv4_probe(p, 3, "indexer_scores", 6, s19, 5), 0);
    ck_assert_int_eq(dsv4_probe(p, 3, "indexer_scores", 19, s19, 0), 0);
    dsv4_probe_sink_free(p);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);

    dsv4_dump *d = reopen(path);
    dsv4_dataset_info info;
    ck_assert_msg(dsv4_dump_info(d, "layers/1/indexer_scores", &info) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(info.ndim, 2);
    ck_assert_int_eq(info.shape[0], 3);
    ck_assert_int_eq(info.shape[1], 5);
    float got[3][5];
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/1/indexer_scores", 0, 3, got), 0);
    ck_assert(got[0][0] == 0.5f);
    for (int i = 1; i < 5; i++) ck_assert_msg(isinf(got[0][i]) && got[0][i] < 0, "score %d of row 0 = %g, not -inf", i, got[0][i]);
    ck_assert_mem_eq(got[1], s11, sizeof s11);
    ck_assert(isinf(got[1][3]) && got[1][3] < 0 && isinf(got[1][4]) && got[1][4] < 0);
    ck_assert_mem_eq(got[2], s19, sizeof s19);
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/3/indexer_scores", 0, 3, got), 0);
    ck_assert(isnan(got[0][0]) && isnan(got[1][4])); /* never written: fill */
    for (int i = 0; i < 5; i++) ck_assert(isinf(got[2][i]));
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_prefill_scores_wider_than_the_row_must_be_minus_inf_there)
{
    char *dir = dsv4_test_mkdtemp("probe-prefill");
    const char *path = test_dump_path(dir, "f.h5", 0);
    /* Only position 5 stored: N = 6 div 4 = 1, but prefill over 12 tokens scores 3 entries. */
    const int32_t only5[1] = {5};
    dsv4_probe_sink *p = NULL;
    dsv4_dump_writer *w = open_writer(path, only5, 1, &p);
    const float ok[3] = {0.25f, -INFINITY, -INFINITY}, bad[3] = {0.25f, 2.0f, -INFINITY};
    ck_assert_int_eq(dsv4_probe(p, 1, "indexer_scores", 5, bad, 3), DSV4_ERR_USAGE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "indexer_scores"));
    ck_assert_msg(dsv4_probe(p, 1, "indexer_scores", 5, ok, 3) == 0, "%s", dsv4_last_error());
    dsv4_probe_sink_free(p);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);
    dsv4_dump *d = reopen(path);
    dsv4_dataset_info info;
    ck_assert_int_eq(dsv4_dump_info(d, "layers/1/indexer_scores", &info), 0);
    ck_assert_int_eq(info.shape[1], 1);
    float got[1];
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/1/indexer_scores", 0, 1, got), 0);
    ck_assert(got[0] == 0.25f);
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_topk_idx_padded_with_minus_one)
{
    char *dir = dsv4_test_mkdtemp("probe-topk");
    const char *path = test_dump_path(dir, "t.h5", 0);
    dsv4_probe_sink *p = NULL;
    dsv4_dump_writer *w = open_writer(path, stored, 3, &p);
    const int32_t one[1] = {0}, three[3] = {4, 0, 2}, four[4] = {1, 2, 3, 4};
    ck_assert_msg(dsv4_probe_i32(p, 1, "topk_idx", 5, one, 1) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_probe_i32(p, 1, "topk_idx", 11, one, 0), 0);
    ck_assert_int_eq(dsv4_probe_i32(p, 1, "topk_idx", 19, three, 3), 0);
    ck_assert_int_eq(dsv4_probe_i32(p, 1, "topk_idx", 19, four, 4), DSV4_ERR_USAGE);
    const int32_t ids[2] = {3, 6};
    ck_assert_int_eq(dsv4_probe_i32(p, 0, "router_ids", 19, ids, 1), DSV4_ERR_USAGE); /* not ragged */
    ck_assert_int_eq(dsv4_probe_i32(p, 0, "router_ids", 19, ids, 2), 0);
    dsv4_probe_sink_free(p);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);
    dsv4_dump *d = reopen(path);
    int32_t got[3][3];
    ck_assert_msg(dsv4_dump_read_rows(d, "layers/1/topk_idx", 0, 3, got) == 0, "%s", dsv4_last_error());
    const int32_t want[3][3] = {{0, -1, -1}, {-1, -1, -1}, {4, 0, 2}};
    ck_assert_mem_eq(got, want, sizeof want);
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_keep_list_stores_only_the_named_probes)
{
    char *dir = dsv4_test_mkdtemp("probe-keep");
    const char *path = test_dump_path(dir, "k.h5", 0);
    dsv4_probe_sink *p = NULL;
    dsv4_dump_writer *w = open_writer(path, stored, 3, &p);
    ck_assert_int_eq(dsv4_probe_sink_keep(p, "topk_idx,routers"), DSV4_ERR_USAGE); /* unknown name refused */
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "'routers'"));
    ck_assert_int_eq(dsv4_probe_sink_keep(p, "topk_idx,,router_ids"), DSV4_ERR_USAGE);
    ck_assert_msg(dsv4_probe_sink_keep(p, "router_ids,norm") == 0, "%s", dsv4_last_error());
    float row[64];
    test_dump_fill_f32(row, 64, 7);
    const int32_t ids[2] = {3, 6};
    ck_assert_int_eq(dsv4_probe(p, 2, "attn_out", 5, row, 64), 0); /* dropped */
    ck_assert_int_eq(dsv4_probe(p, -1, "norm", 5, row, 64), 0);    /* kept */
    ck_assert_int_eq(dsv4_probe_i32(p, 0, "router_ids", 5, ids, 2), 0);
    ck_assert_int_eq(dsv4_probe_i32(p, 1, "topk_idx", 5, ids, 2), 0); /* dropped: "router_ids" holds no "topk" */
    dsv4_probe_sink_free(p);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);
    dsv4_dump *d = reopen(path);
    ck_assert(dsv4_dump_has(d, "layers/0/router_ids"));
    ck_assert(dsv4_dump_has(d, "final/norm"));
    ck_assert(!dsv4_dump_has(d, "layers/2/attn_out"));
    ck_assert(!dsv4_dump_has(d, "layers/1/topk_idx"));
    int32_t got[2];
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/0/router_ids", 0, 1, got), 0);
    ck_assert_mem_eq(got, ids, sizeof ids);
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_unknown_or_misused_probes_are_usage_errors)
{
    char *dir = dsv4_test_mkdtemp("probe-bad");
    const char *path = test_dump_path(dir, "b.h5", 0);
    dsv4_probe_sink *p = NULL;
    dsv4_dump_writer *w = open_writer(path, stored, 3, &p);
    float f[256] = {0};
    int32_t i[4] = {0};
    ck_assert_int_eq(dsv4_probe(p, 1, "attn_outt", 5, f, 64), DSV4_ERR_USAGE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "attn_outt"));
    ck_assert_int_eq(dsv4_probe(p, 0, "logits", 5, f, 256), DSV4_ERR_USAGE);     /* final probe on a layer */
    ck_assert_int_eq(dsv4_probe(p, -1, "attn_out", 5, f, 64), DSV4_ERR_USAGE);   /* layer probe as final */
    ck_assert_int_eq(dsv4_probe(p, 4, "attn_out", 5, f, 64), DSV4_ERR_USAGE);    /* layer out of range */
    ck_assert_int_eq(dsv4_probe(p, 1, "attn_out", 5, f, 63), DSV4_ERR_USAGE);    /* wrong length */
    ck_assert_int_eq(dsv4_probe(p, 1, "topk_idx", 5, f, 3), DSV4_ERR_USAGE);     /* i32 probe as f32 */
    ck_assert_int_eq(dsv4_probe_i32(p, 1, "attn_out", 5, i, 4), DSV4_ERR_USAGE); /* f32 probe as i32 */
    ck_assert_int_eq(dsv4_probe_i32(p, 0, "topk_idx", 5, i, 3), DSV4_ERR_USAGE); /* CSA probe on sliding */
    ck_assert_int_eq(dsv4_probe(p, 2, "indexer_scores", 5, f, 1), DSV4_ERR_USAGE); /* CSA probe on HCA */
    ck_assert_int_eq(dsv4_probe(p, 1, "compressed_kv", 5, f, 32), DSV4_ERR_USAGE); /* per entry as per position */
    ck_assert_int_eq(dsv4_probe_entries(p, 1, "attn_out", f, 1, 64), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_probe_entries(p, 0, "compressed_kv", f, 1, 32), DSV4_ERR_USAGE); /* sliding */
    ck_assert_int_eq(dsv4_probe_entries(p, 1, "compressed_kv", f, 1, 31), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_probe_entries(p, 2, "compressed_kv", f, 3, 32), DSV4_ERR_USAGE); /* 20 div 8 = 2 max */
    ck_assert_msg(dsv4_probe_entries(p, 2, "compressed_kv", f, 2, 32) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_probe_entries(p, 2, "compressed_kv", f, 2, 32), DSV4_ERR_USAGE); /* written once */
    ck_assert_int_eq(dsv4_probe_entries(p, 1, "indexer_kv", f, 0, 16), 0);                 /* no entries yet */
    dsv4_probe_sink_free(p);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);
    dsv4_dump *d = reopen(path);
    dsv4_dataset_info info;
    ck_assert_msg(dsv4_dump_info(d, "layers/1/indexer_kv", &info) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(info.shape[0], 0);
    ck_assert_int_eq(info.shape[1], 16);
    ck_assert_int_eq(dsv4_dump_info(d, "layers/2/compressed_kv", &info), 0);
    ck_assert_int_eq(info.shape[0], 2);
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_null_sink_is_a_no_op_and_positions_must_match_the_writer)
{
    float f[64] = {0};
    int32_t i[3] = {0};
    ck_assert_int_eq(dsv4_probe(NULL, 0, "attn_out", 0, f, 64), 0);
    ck_assert_int_eq(dsv4_probe(NULL, 0, "no_such_probe", 0, NULL, 0), 0);
    ck_assert_int_eq(dsv4_probe_i32(NULL, 1, "topk_idx", 0, i, 3), 0);
    ck_assert_int_eq(dsv4_probe_entries(NULL, 1, "compressed_kv", f, 1, 32), 0);
    ck_assert_int_eq(dsv4_probe_wants(NULL, 0), 0);
    dsv4_probe_sink_free(NULL);

    char *dir = dsv4_test_mkdtemp("probe-match");
    const char *path = test_dump_path(dir, "m.h5", 0);
    dsv4_probe_sink *p = NULL;
    dsv4_dump_writer *w = open_writer(path, stored, 3, &p);
    dsv4_probe_sink_free(p);
    dsv4_config cfg;
    test_dump_config(&cfg);
    const int32_t other[3] = {5, 12, 19};
    p = (dsv4_probe_sink *)1;
    ck_assert_int_eq(dsv4_probe_sink_init(w, &cfg, other, 3, 20, &p), DSV4_ERR_USAGE);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(dsv4_probe_sink_init(w, &cfg, NULL, 0, 20, &p), DSV4_ERR_USAGE); /* all 20 != 3 stored */
    ck_assert_int_eq(dsv4_probe_sink_init(w, &cfg, stored, 2, 20, &p), DSV4_ERR_USAGE);
    dsv4_dump_writer_abort(w);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

static Suite *dump_probe_suite(void)
{
    Suite *s = suite_create("dump_probe");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_positions_not_stored_are_ignored_and_rows_follow_positions);
    tcase_add_test(tc, test_indexer_scores_padded_with_minus_inf_to_last_position_entries);
    tcase_add_test(tc, test_prefill_scores_wider_than_the_row_must_be_minus_inf_there);
    tcase_add_test(tc, test_topk_idx_padded_with_minus_one);
    tcase_add_test(tc, test_keep_list_stores_only_the_named_probes);
    tcase_add_test(tc, test_unknown_or_misused_probes_are_usage_errors);
    tcase_add_test(tc, test_null_sink_is_a_no_op_and_positions_must_match_the_writer);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dsv4_test_main(dump_probe_suite());
}
