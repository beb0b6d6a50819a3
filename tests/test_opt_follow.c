/* test_opt_follow.c - the follow table of `dsv4 run --path opt --follow DUMP` (optimized/opt_follow.c), on the CPU.
 *
 * The table must hold exactly the dump's rows: every topk_idx (CSA layers) and router_ids row of golden/tiny (all
 * positions) and golden/topk512 (a subset of positions) is compared with a direct read through the dump reader,
 * rows of -1 only and positions not stored give NULL (the path keeps its own choice there), and the counts add up.
 * Bad inputs give errors that name the file and what is wrong: a missing file, a dump of another model (layer
 * count, index_topk), a dataset of the wrong width, a router row with a repeated or out-of-range expert, a top-k
 * id of an entry that does not exist yet at that position. The bad dumps are written here with the dump writer
 * (tiny's config, one dataset each). The command line refuses a dump of another model and a dump of other tokens
 * with every path (the GPU reference follows too, since issue 34), with exit status 2, before any GPU is needed;
 * --emulate with the optimized path (the bf16 path itself) and an unknown --emulate value likewise.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_opt.h"
#include "dsv4_test.h"

static dsv4_config load_cfg(const char *set)
{
    char rel[128];
    snprintf(rel, sizeof rel, "golden/%s/config.json", set);
    dsv4_config cfg;
    ck_assert_msg(dsv4_config_load(dsv4_test_source_path(rel), &cfg) == 0, "%s: %s", rel, dsv4_last_error());
    return cfg;
}

/* Every row of the table against a direct read of the dump; returns the rows of each kind that hold ids. */
static void check_rows(const char *set, long *n_topk, long *n_router)
{
    char rel[128];
    snprintf(rel, sizeof rel, "golden/%s/forced.h5", set);
    char *path = strdup(dsv4_test_source_path(rel));
    dsv4_config cfg = load_cfg(set);
    dsv4_opt_follow *f = NULL;
    ck_assert_msg(dsv4_opt_follow_load(path, &cfg, &f) == 0, "%s: %s", path, dsv4_last_error());
    dsv4_dump *d = NULL;
    ck_assert_int_eq(dsv4_dump_open(path, &d), 0);
    int n_tok, n_pos, n_ftok;
    const int32_t *tok = dsv4_dump_tokens(d, &n_tok), *pos = dsv4_dump_positions(d, &n_pos);
    const int32_t *ftok = dsv4_opt_follow_tokens(f, &n_ftok);
    ck_assert_int_eq(n_ftok, n_tok);
    ck_assert(memcmp(ftok, tok, (size_t)n_tok * sizeof *tok) == 0);
    long count[2] = {0, 0}, minus_one_rows = 0, unstored = 0;
    for (int kind = 0; kind < 2; kind++) {
        const int w = dsv4_opt_follow_width(f, (dsv4_opt_follow_kind)kind);
        ck_assert_int_eq(w, kind ? cfg.num_experts_per_tok : cfg.index_topk);
        int32_t *buf = malloc((size_t)n_pos * w * sizeof *buf);
        ck_assert_ptr_nonnull(buf);
        for (int L = 0; L < cfg.num_hidden_layers; L++) {
            char name[64];
            snprintf(name, sizeof name, "layers/%d/%s", L, kind ? "router_ids" : "topk_idx");
            const int present = dsv4_dump_has(d, name);
            ck_assert_int_eq(present, kind ? 1 : cfg.attn_type[L] == DSV4_ATTN_CSA);
            if (present) ck_assert_int_eq(dsv4_dump_read_rows(d, name, 0, n_pos, buf), 0);
            int r = 0;
            for (int p = 0; p < n_tok; p++) {
                const int32_t *row = dsv4_opt_follow_row(f, (dsv4_opt_follow_kind)kind, L, p);
                const int stored = r < n_pos && pos[r] == p;
                if (!present || !stored) {
                    ck_assert_msg(row == NULL, "%s %s position %d: a row where the dump stores none", set, name, p);
                    unstored += present;
                    continue;
                }
                const int32_t *want = buf + (size_t)r++ * w;
                int valid = 0;
                for (int j = 0; j < w; j++) valid += want[j] != -1;
                if (!valid) {
                    ck_assert_msg(row == NULL, "%s %s position %d: a row of -1 only must be no row", set, name, p);
                    minus_one_rows++;
                    continue;
                }
                ck_assert_msg(row != NULL, "%s %s position %d: the dump's row is missing", set, name, p);
                for (int j = 0; j < w; j++)
                    ck_assert_msg(row[j] == want[j], "%s %s position %d slot %d: table %d, dump %d", set, name, p, j,
                                  row[j], want[j]);
                count[kind]++;
            }
        }
        free(buf);
        ck_assert_int_eq(dsv4_opt_follow_rows(f, (dsv4_opt_follow_kind)kind), count[kind]);
    }
    /* out of range asks give NULL, never a neighbour's row */
    ck_assert_ptr_null(dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_ROUTER, -1, pos[0]));
    ck_assert_ptr_null(dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_ROUTER, cfg.num_hidden_layers, pos[0]));
    ck_assert_ptr_null(dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_ROUTER, 0, n_tok));
    ck_assert_ptr_null(dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_ROUTER, 0, -1));
    printf("%s: %ld top-k rows, %ld router rows, %ld rows of -1 only, %ld unstored (layer, position) pairs\n", set,
           count[0], count[1], minus_one_rows, unstored);
    *n_topk = count[0];
    *n_router = count[1];
    if (!strcmp(set, "tiny")) ck_assert_int_gt(minus_one_rows, 0); /* early CSA positions: nothing visible yet */
    if (!strcmp(set, "topk512")) ck_assert_int_gt(unstored, 0);
    dsv4_dump_free(d);
    dsv4_opt_follow_free(f);
    free(path);
}

START_TEST(tiny_rows_are_the_dumps)
{
    long nt, nr;
    check_rows("tiny", &nt, &nr);
    ck_assert_int_gt(nt, 0);
    ck_assert_int_gt(nr, 0);
}
END_TEST

START_TEST(topk512_subset_of_positions)
{
    long nt, nr;
    check_rows("topk512", &nt, &nr);
    ck_assert_int_gt(nt, 0);
    ck_assert_int_gt(nr, 0);
}
END_TEST

/* The load must fail with `code` and a message containing every one of the NULL-terminated `needles`. */
static void expect_error(const char *path, const dsv4_config *cfg, int code, const char *const *needles)
{
    dsv4_opt_follow *f = (dsv4_opt_follow *)&f; /* must be reset to NULL */
    int rc = dsv4_opt_follow_load(path, cfg, &f);
    const char *msg = dsv4_last_error();
    printf("expected error (%s): %s\n", dsv4_err_name(rc), msg);
    ck_assert_msg(rc == code, "%s: rc %d (%s), want %d: %s", path, rc, dsv4_err_name(rc), code, msg);
    ck_assert_ptr_null(f);
    for (int i = 0; needles[i]; i++) ck_assert_msg(strstr(msg, needles[i]), "message lacks '%s': %s", needles[i], msg);
}

START_TEST(missing_file_and_other_model)
{
    dsv4_config tiny = load_cfg("tiny");
    char *missing = strdup(dsv4_test_source_path("golden/tiny/no-such-dump.h5"));
    expect_error(missing, &tiny, DSV4_ERR_IO, (const char *const[]){"no-such-dump.h5", NULL});
    free(missing);
    char *big = strdup(dsv4_test_source_path("golden/topk512/forced.h5"));
    expect_error(big, &tiny, DSV4_ERR_SHAPE, (const char *const[]){"topk512/forced.h5", "num_hidden_layers", NULL});
    free(big);
    char *own = strdup(dsv4_test_source_path("golden/tiny/forced.h5"));
    dsv4_config other = tiny;
    other.index_topk = 8;
    expect_error(own, &other, DSV4_ERR_SHAPE, (const char *const[]){"tiny/forced.h5", "index_topk", NULL});
    other = tiny;
    other.num_experts_per_tok = 2;
    expect_error(own, &other, DSV4_ERR_SHAPE, (const char *const[]){"num_experts_per_tok", NULL});
    free(own);
}
END_TEST

/* A dump of tiny's config with every position stored and one dataset, `name`, of row width w: row p = fill(p),
 * then slot `bad_slot` of position bad_pos set to bad_id (bad_pos < 0: no bad row). */
static char *write_dump(const char *dir, const char *file, const char *name, int w, int router, int bad_pos,
                        int bad_slot, int32_t bad_id)
{
    char *path = malloc(4096);
    snprintf(path, 4096, "%s/%s", dir, file);
    dsv4_dump *g = NULL;
    ck_assert_int_eq(dsv4_dump_open(dsv4_test_source_path("golden/tiny/forced.h5"), &g), 0);
    const dsv4_config *cfg = NULL;
    ck_assert_int_eq(dsv4_dump_config(g, &cfg), 0);
    int T;
    const int32_t *tok = dsv4_dump_tokens(g, &T);
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    for (int p = 0; p < T; p++) pos[p] = p;
    dsv4_dump_meta meta = {.producer = "test_opt_follow", .config_json = dsv4_dump_attr(g, "config_json"),
                           .weights_digest = dsv4_dump_attr(g, "weights_digest"),
                           .prompt_len = dsv4_dump_prompt_len(g), .n_decode = dsv4_dump_n_decode(g), .mode = "forced"};
    dsv4_dump_writer *wr = NULL;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, cfg, tok, T, pos, T, &wr) == 0, "%s", dsv4_last_error());
    int32_t row[64];
    for (int p = 0; p < T; p++) {
        for (int j = 0; j < w; j++) row[j] = router ? (p + j) % cfg->n_routed_experts : (j < (p + 1) / 4 ? j : -1);
        if (p == bad_pos) row[bad_slot] = bad_id;
        int64_t shape[1] = {w};
        ck_assert_msg(dsv4_dump_writer_row(wr, name, p, DSV4_DTYPE_I32, 1, shape, row) == 0, "%s", dsv4_last_error());
    }
    ck_assert_int_eq(dsv4_dump_writer_commit(wr), 0);
    free(pos);
    dsv4_dump_free(g);
    return path;
}

START_TEST(bad_rows_are_refused)
{
    dsv4_config tiny = load_cfg("tiny");
    int csa = -1;
    for (int L = 0; L < tiny.num_hidden_layers && csa < 0; L++)
        if (tiny.attn_type[L] == DSV4_ATTN_CSA) csa = L;
    ck_assert_int_ge(csa, 0);
    char *dir = dsv4_test_mkdtemp("follow");
    const int K = tiny.num_experts_per_tok, k = tiny.index_topk;
    char name[64];

    /* the good dumps load, and their one layer is the only one with rows */
    char *p = write_dump(dir, "router-ok.h5", "layers/2/router_ids", K, 1, -1, 0, 0);
    dsv4_opt_follow *f = NULL;
    ck_assert_msg(dsv4_opt_follow_load(p, &tiny, &f) == 0, "%s", dsv4_last_error());
    ck_assert_ptr_nonnull(dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_ROUTER, 2, 5));
    ck_assert_int_eq(dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_ROUTER, 2, 5)[1], 6 % tiny.n_routed_experts);
    ck_assert_ptr_null(dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_ROUTER, 3, 5));
    ck_assert_ptr_null(dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_TOPK, csa, 20));
    dsv4_opt_follow_free(f);
    free(p);
    snprintf(name, sizeof name, "layers/%d/topk_idx", csa);
    p = write_dump(dir, "topk-ok.h5", name, k, 0, -1, 0, 0);
    ck_assert_msg(dsv4_opt_follow_load(p, &tiny, &f) == 0, "%s", dsv4_last_error());
    ck_assert_ptr_null(dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_TOPK, csa, 2)); /* -1 only */
    const int32_t *r = dsv4_opt_follow_row(f, DSV4_OPT_FOLLOW_TOPK, csa, 9);  /* 2 visible entries */
    ck_assert_ptr_nonnull(r);
    ck_assert(r[0] == 0 && r[1] == 1 && r[2] == -1 && r[3] == -1);
    ck_assert_int_eq(dsv4_opt_follow_rows(f, DSV4_OPT_FOLLOW_ROUTER), 0);
    dsv4_opt_follow_free(f);
    free(p);

    /* a repeated expert, an expert past E, a top-k entry not visible yet, a row of the wrong width */
    p = write_dump(dir, "router-dup.h5", "layers/2/router_ids", K, 1, 7, 1, 7 % tiny.n_routed_experts);
    expect_error(p, &tiny, DSV4_ERR_FORMAT, (const char *const[]){"router-dup.h5", "layers/2/router_ids", "position 7",
                                                                  "distinct", NULL});
    free(p);
    p = write_dump(dir, "router-range.h5", "layers/3/router_ids", K, 1, 11, 0, tiny.n_routed_experts);
    expect_error(p, &tiny, DSV4_ERR_FORMAT, (const char *const[]){"layers/3/router_ids", "position 11", NULL});
    free(p);
    p = write_dump(dir, "topk-future.h5", name, k, 0, 9, 2, 2); /* (9+1) div 4 = 2 entries: id 2 is not there */
    expect_error(p, &tiny, DSV4_ERR_FORMAT, (const char *const[]){"topk_idx", "position 9", "id 2", NULL});
    free(p);
    p = write_dump(dir, "topk-narrow.h5", name, k - 1, 0, -1, 0, 0);
    expect_error(p, &tiny, DSV4_ERR_SHAPE, (const char *const[]){"topk-narrow.h5", name, NULL});
    free(p);
    dsv4_test_rmtree(dir);
}
END_TEST

/* `dsv4 run ... ARGS`: must exit 2 with every needle in its output */
static void expect_cli_error(const char *args, const char *const *needles)
{
    char cmd[4096], *out = NULL;
    const char *g = dsv4_test_source_path("");
    snprintf(cmd, sizeof cmd, "%s run --model %sgolden/tiny %s 2>&1", dsv4_test_bin(), g, args);
    int st = dsv4_test_run(cmd, &out);
    printf("$ %s -> %d\n%s", cmd, st, out ? out : "");
    ck_assert_msg(st == 2, "%s: exit %d, want 2\n%s", cmd, st, out ? out : "");
    for (int i = 0; needles[i]; i++)
        ck_assert_msg(out && strstr(out, needles[i]), "%s: output lacks '%s'\n%s", cmd, needles[i], out ? out : "");
    free(out);
}

START_TEST(cli_refuses_bad_follow)
{
    char a[4096];
    const char *g = dsv4_test_source_path("");
    char *root = strdup(g);
    /* ref-gpu takes --follow and --emulate now: a bad dump is refused before the GPU is set up (no "CUDA") */
    snprintf(a, sizeof a, "--path ref-gpu --emulate bf16 --tokens-from %sgolden/tiny/forced.h5 --follow "
             "%sgolden/tiny/greedy.h5", root, root);
    expect_cli_error(a, (const char *const[]){"greedy.h5", "its token at position", NULL});
    snprintf(a, sizeof a, "--path ref-gpu --tokens-from %sgolden/tiny/forced.h5 --follow %sgolden/topk512/forced.h5",
             root, root);
    expect_cli_error(a, (const char *const[]){"topk512/forced.h5", "num_hidden_layers", NULL});
    snprintf(a, sizeof a, "--path opt --tokens-from %sgolden/tiny/forced.h5 --emulate bf16", root);
    expect_cli_error(a, (const char *const[]){"--emulate is an option of --path ref-cpu and ref-gpu (not of opt", NULL});
    snprintf(a, sizeof a, "--path ref-gpu --tokens-from %sgolden/tiny/forced.h5 --emulate bf8", root);
    expect_cli_error(a, (const char *const[]){"want none or bf16", NULL});
    snprintf(a, sizeof a, "--path ref-cpu --tokens-from %sgolden/tiny/forced.h5 --emulate bf8", root);
    expect_cli_error(a, (const char *const[]){"want none or bf16", NULL});
    snprintf(a, sizeof a, "--path ref-cpu --tokens-from %sgolden/tiny/forced.h5 --follow %sgolden/tiny/greedy.h5",
             root, root);
    expect_cli_error(a, (const char *const[]){"greedy.h5", "its token at position", NULL});
    snprintf(a, sizeof a, "--path opt --tokens-from %sgolden/tiny/forced.h5 --follow %sgolden/topk512/forced.h5",
             root, root);
    expect_cli_error(a, (const char *const[]){"topk512/forced.h5", "num_hidden_layers", NULL});
    snprintf(a, sizeof a, "--path opt --tokens-from %sgolden/tiny/forced.h5 --follow %sgolden/tiny/greedy.h5", root,
             root);
    expect_cli_error(a, (const char *const[]){"greedy.h5", "its token at position", NULL});
    free(root);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("opt_follow");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, tiny_rows_are_the_dumps);
    tcase_add_test(tc, topk512_subset_of_positions);
    tcase_add_test(tc, missing_file_and_other_model);
    tcase_add_test(tc, bad_rows_are_refused);
    tcase_add_test(tc, cli_refuses_bad_follow);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
