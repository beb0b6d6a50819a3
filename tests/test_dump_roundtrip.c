/* test_dump_roundtrip.c - dsv4-dump/1 writer -> reader round trips (dump/writer.c, dump/reader.c, dump/probe.c).
 *
 * Every probe kind of dump-format.md goes in through the probe sink with random data (fixed seeds) and must
 * come back bit-exact, listed in model order with the shapes of the table. Also: rows written out of order,
 * unwritten rows reading as NaN / -1 (not 0), the temp name -> final name rename on commit, abort leaving
 * nothing, slice reads returning exactly the rows asked for, greedy token updates, extra attributes, a directory
 * as the final name refused at open; and the shared test config filled by hand is the one its config.json text
 * parses to (test_dump_common.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_dump_common.h"

enum { KIND_F32, KIND_I32, KIND_ENTRIES };

/* The probes of dump-format.md as the tiny config shapes them (P = 10, n_decode = 6, all 16 positions). */
typedef struct probe_case {
    const char *name;
    int kind;
    int on_sliding, on_csa, on_hca;
    int ndim;
    int64_t row[2];
} probe_case;

#define N_SCORES 4 /* (15 + 1) div 4 */
static const probe_case layer_probes[] = {
    {"attn_hc_pre", KIND_F32, 1, 1, 1, 1, {4}},     {"attn_hc_post", KIND_F32, 1, 1, 1, 1, {4}},
    {"attn_hc_comb", KIND_F32, 1, 1, 1, 2, {4, 4}}, {"attn_in", KIND_F32, 1, 1, 1, 1, {64}},
    {"kv", KIND_F32, 1, 1, 1, 1, {32}},             {"compressed_kv", KIND_ENTRIES, 0, 1, 1, 1, {32}},
    {"indexer_kv", KIND_ENTRIES, 0, 1, 0, 1, {16}}, {"indexer_scores", KIND_F32, 0, 1, 0, 1, {N_SCORES}},
    {"topk_idx", KIND_I32, 0, 1, 0, 1, {3}},        {"attn_out", KIND_F32, 1, 1, 1, 1, {64}},
    {"ffn_hc_pre", KIND_F32, 1, 1, 1, 1, {4}},      {"ffn_hc_post", KIND_F32, 1, 1, 1, 1, {4}},
    {"ffn_hc_comb", KIND_F32, 1, 1, 1, 2, {4, 4}},  {"ffn_in", KIND_F32, 1, 1, 1, 1, {64}},
    {"router_ids", KIND_I32, 1, 1, 1, 1, {2}},      {"router_weights", KIND_F32, 1, 1, 1, 1, {2}},
    {"ffn_out", KIND_F32, 1, 1, 1, 1, {64}},        {"out", KIND_F32, 1, 1, 1, 2, {4, 64}},
};
static const probe_case final_probes[] = {
    {"hc_head", KIND_F32, 1, 1, 1, 1, {64}},
    {"norm", KIND_F32, 1, 1, 1, 1, {64}},
    {"logits", KIND_F32, 1, 1, 1, 1, {256}},
};
#define N_LAYER_PROBES ((int)(sizeof layer_probes / sizeof layer_probes[0]))
#define N_FINAL_PROBES ((int)(sizeof final_probes / sizeof final_probes[0]))

static const int ratio_of[4] = {0, 4, 8, 4};

static int probe_on(const probe_case *c, int layer)
{
    if (layer < 0) return 1;
    return layer == 0 ? c->on_sliding : ratio_of[layer] == 8 ? c->on_hca : c->on_csa;
}

static size_t row_size(const probe_case *c)
{
    return (size_t)c->row[0] * (size_t)(c->ndim == 2 ? c->row[1] : 1);
}

static uint64_t seed_of(int layer, int probe, int pos)
{
    return (uint64_t)(layer + 2) * 1000003u + (uint64_t)probe * 1009u + (uint64_t)pos;
}

static int64_t entries_of(int layer)
{
    return 16 / ratio_of[layer]; /* entries made over T = 16 tokens */
}

/* Writes every probe of every layer at every position through the sink; commits. */
static void write_all_probes(const char *path)
{
    dsv4_config cfg;
    test_dump_config(&cfg);
    dsv4_dump_meta meta = test_dump_meta(10, 6);
    int32_t tokens[16];
    test_dump_fill_i32(tokens, 16, 99, 256);
    int32_t positions[16];
    for (int i = 0; i < 16; i++) positions[i] = i;
    dsv4_dump_writer *w = NULL;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, &cfg, tokens, 16, positions, 16, &w) == 0, "%s",
                  dsv4_last_error());
    dsv4_probe_sink *p = NULL;
    ck_assert_msg(dsv4_probe_sink_init(w, &cfg, NULL, 0, 16, &p) == 0, "%s", dsv4_last_error());
    float f[256 * 4];
    int32_t ids[8];
    for (int layer = -1; layer < 4; layer++) {
        const probe_case *cases = layer < 0 ? final_probes : layer_probes;
        int n_cases = layer < 0 ? N_FINAL_PROBES : N_LAYER_PROBES;
        for (int k = 0; k < n_cases; k++) {
            const probe_case *c = &cases[k];
            if (!probe_on(c, layer)) continue;
            if (c->kind == KIND_ENTRIES) {
                int64_t n = entries_of(layer);
                float *buf = malloc((size_t)(n * c->row[0]) * sizeof *buf);
                test_dump_fill_f32(buf, (size_t)(n * c->row[0]), seed_of(layer, k, 999));
                ck_assert_msg(dsv4_probe_entries(p, layer, c->name, buf, n, c->row[0]) == 0, "%s", dsv4_last_error());
                free(buf);
                continue;
            }
            /* Positions in reverse: rows arrive out of order. */
            for (int pos = 15; pos >= 0; pos--) {
                int rc;
                if (c->kind == KIND_F32) {
                    test_dump_fill_f32(f, row_size(c), seed_of(layer, k, pos));
                    rc = dsv4_probe(p, layer, c->name, pos, f, row_size(c));
                } else {
                    test_dump_fill_i32(ids, row_size(c), seed_of(layer, k, pos), 8);
                    rc = dsv4_probe_i32(p, layer, c->name, pos, ids, row_size(c));
                }
                ck_assert_msg(rc == 0, "layer %d %s pos %d: %s", layer, c->name, pos, dsv4_last_error());
            }
        }
    }
    dsv4_probe_sink_free(p);
    ck_assert_msg(dsv4_dump_writer_commit(w) == 0, "%s", dsv4_last_error());
}

START_TEST(test_every_probe_round_trips_bit_exact)
{
    char *dir = dsv4_test_mkdtemp("dump-rt");
    const char *path = test_dump_path(dir, "all.h5", 0);
    write_all_probes(path);

    dsv4_dump *d = NULL;
    ck_assert_msg(dsv4_dump_open(path, &d) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_dump_prompt_len(d), 10);
    ck_assert_int_eq(dsv4_dump_n_decode(d), 6);
    ck_assert_str_eq(dsv4_dump_attr(d, "schema"), DSV4_DUMP_SCHEMA);
    ck_assert_str_eq(dsv4_dump_attr(d, "mode"), "forced");
    ck_assert_str_eq(dsv4_dump_attr(d, "config_json"), test_dump_config_json);
    int nt = 0;
    const int32_t *tok = dsv4_dump_tokens(d, &nt);
    int32_t want_tok[16];
    test_dump_fill_i32(want_tok, 16, 99, 256);
    ck_assert_int_eq(nt, 16);
    ck_assert_mem_eq(tok, want_tok, sizeof want_tok);

    /* The listing: layers ascending, each in model order (the table order), then final. */
    int idx = 0;
    char want[128];
    for (int layer = 0; layer < 4; layer++)
        for (int k = 0; k < N_LAYER_PROBES; k++) {
            if (!probe_on(&layer_probes[k], layer)) continue;
            snprintf(want, sizeof want, "layers/%d/%s", layer, layer_probes[k].name);
            ck_assert_ptr_nonnull(dsv4_dump_dataset_name(d, idx));
            ck_assert_str_eq(dsv4_dump_dataset_name(d, idx), want);
            idx++;
        }
    for (int k = 0; k < N_FINAL_PROBES; k++) {
        snprintf(want, sizeof want, "final/%s", final_probes[k].name);
        ck_assert_str_eq(dsv4_dump_dataset_name(d, idx), want);
        idx++;
    }
    ck_assert_int_eq(dsv4_dump_dataset_count(d), idx);

    float *got = malloc(16 * 1024 * sizeof *got), *ref = malloc(16 * 1024 * sizeof *ref);
    for (int layer = -1; layer < 4; layer++) {
        const probe_case *cases = layer < 0 ? final_probes : layer_probes;
        int n_cases = layer < 0 ? N_FINAL_PROBES : N_LAYER_PROBES;
        for (int k = 0; k < n_cases; k++) {
            const probe_case *c = &cases[k];
            if (!probe_on(c, layer)) continue;
            char name[128];
            if (layer < 0) snprintf(name, sizeof name, "final/%s", c->name);
            else snprintf(name, sizeof name, "layers/%d/%s", layer, c->name);
            ck_assert_msg(dsv4_dump_has(d, name), "%s missing", name);
            dsv4_dataset_info info;
            ck_assert_msg(dsv4_dump_info(d, name, &info) == 0, "%s", dsv4_last_error());
            int64_t rows = c->kind == KIND_ENTRIES ? entries_of(layer) : 16;
            ck_assert_int_eq(info.ndim, 1 + c->ndim);
            ck_assert_int_eq(info.shape[0], rows);
            for (int i = 0; i < c->ndim; i++) ck_assert_int_eq(info.shape[1 + i], c->row[i]);
            ck_assert_int_eq(info.dtype, c->kind == KIND_I32 ? DSV4_DTYPE_I32 : DSV4_DTYPE_F32);
            size_t rs = row_size(c);
            dsv4_test_poison_f32(got, (size_t)rows * rs);
            ck_assert_msg(dsv4_dump_read_rows(d, name, 0, rows, got) == 0, "%s", dsv4_last_error());
            if (c->kind == KIND_ENTRIES) {
                test_dump_fill_f32(ref, (size_t)rows * rs, seed_of(layer, k, 999));
            } else {
                for (int pos = 0; pos < 16; pos++) {
                    if (c->kind == KIND_F32) test_dump_fill_f32(ref + pos * rs, rs, seed_of(layer, k, pos));
                    else test_dump_fill_i32((int32_t *)ref + pos * rs, rs, seed_of(layer, k, pos), 8);
                }
            }
            ck_assert_msg(memcmp(got, ref, (size_t)rows * rs * 4) == 0, "%s differs after the round trip", name);
        }
    }
    free(got);
    free(ref);
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

/* A writer over positions {2, 5, 9, 12, 15} of T = 16 tokens. */
static dsv4_dump_writer *open_subset(const char *path, int n_pos)
{
    dsv4_config cfg;
    test_dump_config(&cfg);
    dsv4_dump_meta meta = test_dump_meta(10, 6);
    int32_t tokens[16] = {0};
    static const int32_t positions[5] = {2, 5, 9, 12, 15};
    dsv4_dump_writer *w = NULL;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, &cfg, tokens, 16, positions, n_pos, &w) == 0, "%s",
                  dsv4_last_error());
    return w;
}

START_TEST(test_out_of_order_rows_and_unwritten_rows_are_nan_or_minus_one)
{
    char *dir = dsv4_test_mkdtemp("dump-ooo");
    const char *path = test_dump_path(dir, "ooo.h5", 0);
    dsv4_dump_writer *w = open_subset(path, 5);
    float rows[5][64];
    for (int r = 0; r < 5; r++) test_dump_fill_f32(rows[r], 64, 10 + r);
    int64_t d64[1] = {64}, d2[1] = {2};
    /* Several rows per chunk (64 floats): rows 3, 0, 2 written, 1 and 4 never. */
    const int order[3] = {3, 0, 2};
    for (int i = 0; i < 3; i++)
        ck_assert_msg(dsv4_dump_writer_row(w, "layers/1/attn_out", order[i], DSV4_DTYPE_F32, 1, d64, rows[order[i]]) == 0,
                      "%s", dsv4_last_error());
    int32_t ids[2] = {7, 3};
    ck_assert_int_eq(dsv4_dump_writer_row(w, "layers/1/router_ids", 4, DSV4_DTYPE_I32, 1, d2, ids), 0);
    /* One row per chunk (a 300 KB row, an extra probe name): row 1 only. */
    int64_t big[1] = {75000};
    float *b = malloc(75000 * sizeof *b);
    test_dump_fill_f32(b, 75000, 77);
    ck_assert_msg(dsv4_dump_writer_row(w, "layers/1/extra_wide", 1, DSV4_DTYPE_F32, 1, big, b) == 0, "%s",
                  dsv4_last_error());
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);

    dsv4_dump *d = NULL;
    ck_assert_msg(dsv4_dump_open(path, &d) == 0, "%s", dsv4_last_error());
    float got[5][64];
    ck_assert_msg(dsv4_dump_read_rows(d, "layers/1/attn_out", 0, 5, got) == 0, "%s", dsv4_last_error());
    for (int r = 0; r < 5; r++) {
        if (r == 1 || r == 4) {
            for (int i = 0; i < 64; i++) ck_assert_msg(isnan(got[r][i]), "unwritten row %d reads %g, not NaN", r, got[r][i]);
        } else {
            ck_assert_msg(memcmp(got[r], rows[r], sizeof got[r]) == 0, "row %d differs", r);
        }
    }
    int32_t gids[5][2];
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/1/router_ids", 0, 5, gids), 0);
    for (int r = 0; r < 4; r++) ck_assert_msg(gids[r][0] == -1 && gids[r][1] == -1, "unwritten id row %d not -1", r);
    ck_assert_int_eq(gids[4][0], 7);
    ck_assert_int_eq(gids[4][1], 3);
    float *gb = malloc(2 * 75000 * sizeof *gb);
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/1/extra_wide", 0, 2, gb), 0);
    ck_assert(isnan(gb[0]) && isnan(gb[74999]));
    ck_assert_mem_eq(gb + 75000, b, 75000 * sizeof *b);
    free(gb);
    free(b);
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_file_appears_under_its_name_only_at_commit)
{
    char *dir = dsv4_test_mkdtemp("dump-commit");
    const char *path = test_dump_path(dir, "c.h5", 0);
    char tmp[16500];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    dsv4_dump_writer *w = open_subset(path, 5);
    float row[64] = {1};
    int64_t d64[1] = {64};
    ck_assert_int_eq(dsv4_dump_writer_row(w, "layers/0/attn_out", 0, DSV4_DTYPE_F32, 1, d64, row), 0);
    ck_assert_msg(test_dump_exists(tmp), "%s should exist while writing", tmp);
    ck_assert_msg(!test_dump_exists(path), "%s exists before commit", path);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);
    ck_assert_msg(test_dump_exists(path), "%s missing after commit", path);
    ck_assert_msg(!test_dump_exists(tmp), "%s left behind after commit", tmp);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_abort_leaves_no_file)
{
    char *dir = dsv4_test_mkdtemp("dump-abort");
    const char *path = test_dump_path(dir, "a.h5", 0);
    char tmp[16500];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    dsv4_dump_writer *w = open_subset(path, 5);
    float row[64] = {1};
    int64_t d64[1] = {64};
    ck_assert_int_eq(dsv4_dump_writer_row(w, "layers/0/attn_out", 2, DSV4_DTYPE_F32, 1, d64, row), 0);
    ck_assert(test_dump_exists(tmp));
    dsv4_dump_writer_abort(w);
    ck_assert_msg(!test_dump_exists(tmp), "abort left %s", tmp);
    ck_assert_msg(!test_dump_exists(path), "abort created %s", path);
    dsv4_dump_writer_abort(NULL);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_slice_read_returns_exactly_the_rows_asked_for)
{
    char *dir = dsv4_test_mkdtemp("dump-slice");
    const char *path = test_dump_path(dir, "s.h5", 0);
    write_all_probes(path);
    dsv4_dump *d = NULL;
    ck_assert_msg(dsv4_dump_open(path, &d) == 0, "%s", dsv4_last_error());
    /* out: [16, 4, 64]; probe index 17 in layer_probes. Rows 5..8 into a buffer with a guard after them. */
    float got[4 * 256 + 16], ref[256];
    for (size_t i = 0; i < sizeof got / sizeof got[0]; i++) got[i] = 12345.0f;
    ck_assert_msg(dsv4_dump_read_rows(d, "layers/2/out", 5, 4, got) == 0, "%s", dsv4_last_error());
    for (int r = 0; r < 4; r++) {
        test_dump_fill_f32(ref, 256, seed_of(2, 17, 5 + r));
        ck_assert_msg(memcmp(got + r * 256, ref, sizeof ref) == 0, "slice row %d is not position %d", r, 5 + r);
    }
    for (int i = 0; i < 16; i++) ck_assert_msg(got[4 * 256 + i] == 12345.0f, "read past the slice");
    /* Out of range and empty slices. */
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/2/out", 14, 3, got), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/2/out", -1, 1, got), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/2/out", 16, 0, got), 0);
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/2/no_such", 0, 1, got), DSV4_ERR_MISSING);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "layers/2/no_such"));
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

/* The verifier may compare a dump with itself: two readers of one file must not close each other's datasets. */
START_TEST(test_same_file_opened_twice)
{
    char *dir = dsv4_test_mkdtemp("dump-twice");
    const char *path = test_dump_path(dir, "t.h5", 0);
    write_all_probes(path);
    dsv4_dump *a = NULL, *b = NULL;
    ck_assert_int_eq(dsv4_dump_open(path, &a), 0);
    ck_assert_int_eq(dsv4_dump_open(path, &b), 0);
    float x[256], y[256];
    ck_assert_int_eq(dsv4_dump_read_rows(a, "final/logits", 3, 1, x), 0);
    ck_assert_int_eq(dsv4_dump_read_rows(b, "final/logits", 3, 1, y), 0);
    ck_assert_mem_eq(x, y, sizeof x);
    dsv4_dump_free(a);
    ck_assert_msg(dsv4_dump_read_rows(b, "final/logits", 4, 1, y) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_dump_read_rows(b, "layers/3/attn_out", 0, 1, y) == 0, "%s", dsv4_last_error());
    dsv4_dump_free(b);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_greedy_tokens_and_extra_attributes)
{
    char *dir = dsv4_test_mkdtemp("dump-greedy");
    const char *path = test_dump_path(dir, "g.h5", 0);
    dsv4_config cfg;
    test_dump_config(&cfg);
    dsv4_dump_meta meta = test_dump_meta(3, 2);
    meta.mode = "greedy";
    int32_t pos[2] = {2, 4};
    dsv4_dump_writer *w = NULL;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, &cfg, NULL, 5, pos, 2, &w) == 0, "%s", dsv4_last_error());
    int32_t tok[5] = {5, 6, 7, 8, 9};
    ck_assert_int_eq(dsv4_dump_writer_set_tokens(w, tok, 4), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_dump_writer_set_tokens(w, tok, 5), 0);
    ck_assert_int_eq(dsv4_dump_writer_attr(w, "seed", "1234"), 0);
    ck_assert_int_eq(dsv4_dump_writer_attr(w, "schema", "other"), DSV4_ERR_USAGE);
    /* A second write must keep the row shape. */
    float row[64] = {0};
    int64_t d64[1] = {64}, d32[1] = {32};
    ck_assert_int_eq(dsv4_dump_writer_row(w, "layers/0/attn_out", 0, DSV4_DTYPE_F32, 1, d64, row), 0);
    ck_assert_int_eq(dsv4_dump_writer_row(w, "layers/0/attn_out", 1, DSV4_DTYPE_F32, 1, d32, row), DSV4_ERR_SHAPE);
    ck_assert_int_eq(dsv4_dump_writer_row(w, "layers/0/attn_out", 2, DSV4_DTYPE_F32, 1, d64, row), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);

    dsv4_dump *d = NULL;
    ck_assert_msg(dsv4_dump_open(path, &d) == 0, "%s", dsv4_last_error());
    int n = 0;
    ck_assert_mem_eq(dsv4_dump_tokens(d, &n), tok, sizeof tok);
    ck_assert_int_eq(n, 5);
    const int32_t *p = dsv4_dump_positions(d, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(p[0], 2);
    ck_assert_int_eq(p[1], 4);
    ck_assert_str_eq(dsv4_dump_attr(d, "seed"), "1234");
    ck_assert_str_eq(dsv4_dump_attr(d, "mode"), "greedy");
    ck_assert_ptr_null(dsv4_dump_attr(d, "nope"));
    dsv4_dump_free(d);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_writer_refuses_bad_arguments)
{
    char *dir = dsv4_test_mkdtemp("dump-args");
    const char *path = test_dump_path(dir, "x.h5", 0);
    dsv4_config cfg;
    test_dump_config(&cfg);
    dsv4_dump_meta meta = test_dump_meta(10, 6);
    int32_t tokens[16] = {0};
    int32_t desc[3] = {5, 3, 9}, past[2] = {3, 16};
    dsv4_dump_writer *w = (dsv4_dump_writer *)1;
    ck_assert_int_eq(dsv4_dump_writer_open(path, &meta, &cfg, tokens, 15, NULL, 0, &w), DSV4_ERR_USAGE);
    ck_assert_ptr_null(w);
    ck_assert_int_eq(dsv4_dump_writer_open(path, &meta, &cfg, tokens, 16, desc, 3, &w), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_dump_writer_open(path, &meta, &cfg, tokens, 16, past, 2, &w), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_dump_writer_open("/nonexistent-dir/x.h5", &meta, &cfg, tokens, 16, NULL, 0, &w), DSV4_ERR_IO);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "/nonexistent-dir/x.h5"));
    ck_assert(!test_dump_exists(path));
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

/* A final name that is a directory (`dsv4 run --dump out/`, or the folder meant to hold the dump) or another
 * non-file (a device: as root the rename would replace /dev/null by the dump) is refused at open. The temporary
 * beside it was created and the whole run made, and only the rename at commit failed: the run was lost. */
START_TEST(test_writer_refuses_a_directory_before_the_run)
{
    char *dir = dsv4_test_mkdtemp("dump-dir");
    dsv4_config cfg;
    test_dump_config(&cfg);
    dsv4_dump_meta meta = test_dump_meta(10, 6);
    int32_t tokens[16] = {0};
    char sub[4200], slash[4300];
    snprintf(sub, sizeof sub, "%s/out", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    snprintf(slash, sizeof slash, "%s/", sub);
    const char *names[] = {sub, slash};
    for (int i = 0; i < 2; i++) {
        dsv4_dump_writer *w = (dsv4_dump_writer *)1;
        int rc = dsv4_dump_writer_open(names[i], &meta, &cfg, tokens, 16, NULL, 0, &w);
        if (rc == 0) dsv4_dump_writer_abort(w);
        ck_assert_msg(rc == DSV4_ERR_IO, "%s: open returned %d, want DSV4_ERR_IO (refused before the run)", names[i],
                      rc);
        ck_assert_ptr_null(w);
        ck_assert_msg(strstr(dsv4_last_error(), names[i]) && strstr(dsv4_last_error(), "names a directory"), "%s",
                      dsv4_last_error());
    }
    DIR *d = opendir(sub); /* no temporary left inside it or beside it */
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    ck_assert_int_eq(n, 0);
    d = opendir(dir);
    n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    ck_assert_int_eq(n, 1);
    test_dump_assert_no_open_handles();
    dsv4_test_rmtree(dir);
}
END_TEST

/* test_dump_common.h's config twice, as the JSON a dump embeds and filled by hand for the writer: they must be the
 * same model, or the tests would write with one config and read with another. Every field the hand version sets. */
START_TEST(test_hand_config_is_the_json_config)
{
    dsv4_config h, j;
    test_dump_config(&h);
    ck_assert_msg(dsv4_config_parse(test_dump_config_json, "test_dump_config_json", &j) == 0, "%s",
                  dsv4_last_error());
#define SAME_INT(f) ck_assert_msg(h.f == j.f, #f ": by hand %lld, config_json %lld", (long long)h.f, (long long)j.f)
#define SAME_DBL(f) ck_assert_msg(h.f == j.f, #f ": by hand %g, config_json %g", h.f, j.f)
    SAME_INT(vocab_size);
    SAME_INT(hidden_size);
    SAME_INT(num_hidden_layers);
    SAME_INT(num_attention_heads);
    SAME_INT(num_key_value_heads);
    SAME_INT(head_dim);
    SAME_INT(qk_rope_head_dim);
    SAME_INT(q_lora_rank);
    SAME_INT(o_groups);
    SAME_INT(o_lora_rank);
    SAME_INT(sliding_window);
    SAME_INT(index_n_heads);
    SAME_INT(index_head_dim);
    SAME_INT(index_topk);
    SAME_INT(n_routed_experts);
    SAME_INT(n_shared_experts);
    SAME_INT(num_experts_per_tok);
    SAME_INT(moe_intermediate_size);
    SAME_INT(num_hash_layers);
    SAME_INT(norm_topk_prob);
    SAME_DBL(routed_scaling_factor);
    SAME_DBL(swiglu_limit);
    SAME_INT(hc_mult);
    SAME_INT(hc_sinkhorn_iters);
    SAME_DBL(hc_eps);
    SAME_DBL(rms_norm_eps);
    SAME_INT(max_position_embeddings);
    SAME_INT(tie_word_embeddings);
    SAME_INT(bos_token_id);
    SAME_INT(eos_token_id);
    SAME_INT(compress_rate_csa);
    SAME_INT(compress_rate_hca);
#undef SAME_INT
#undef SAME_DBL
    ck_assert_str_eq(h.scoring_func, j.scoring_func);
    for (int l = 0; l < h.num_hidden_layers; l++) {
        ck_assert_msg(h.attn_type[l] == j.attn_type[l], "layer %d: attention %s by hand, %s in config_json", l,
                      dsv4_attn_type_name(h.attn_type[l]), dsv4_attn_type_name(j.attn_type[l]));
        ck_assert_msg(h.mlp_type[l] == j.mlp_type[l], "layer %d: mlp %s by hand, %s in config_json", l,
                      dsv4_mlp_type_name(h.mlp_type[l]), dsv4_mlp_type_name(j.mlp_type[l]));
        ck_assert_msg(h.compress_ratio[l] == j.compress_ratio[l], "layer %d: ratio %d by hand, %d in config_json", l,
                      h.compress_ratio[l], j.compress_ratio[l]);
    }
}
END_TEST

static Suite *dump_roundtrip_suite(void)
{
    Suite *s = suite_create("dump_roundtrip");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_hand_config_is_the_json_config);
    tcase_add_test(tc, test_every_probe_round_trips_bit_exact);
    tcase_add_test(tc, test_out_of_order_rows_and_unwritten_rows_are_nan_or_minus_one);
    tcase_add_test(tc, test_file_appears_under_its_name_only_at_commit);
    tcase_add_test(tc, test_abort_leaves_no_file);
    tcase_add_test(tc, test_slice_read_returns_exactly_the_rows_asked_for);
    tcase_add_test(tc, test_same_file_opened_twice);
    tcase_add_test(tc, test_greedy_tokens_and_extra_attributes);
    tcase_add_test(tc, test_writer_refuses_bad_arguments);
    tcase_add_test(tc, test_writer_refuses_a_directory_before_the_run);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dsv4_test_main(dump_roundtrip_suite());
}
