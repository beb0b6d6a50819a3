/* test_opt_follow_run.c - decision following of the optimized path end to end (`dsv4 run --path opt --follow`), on
 * golden/tiny and golden/topk512, through the dsv4 command and the dump reader:
 * - following the path's OWN dump changes nothing: every dataset of the following run is bitwise the free run's,
 *   and the run reports 0 rows that ran on the dump's choices; with --dump-positions decode the prompt steps run
 *   as CUDA graphs, so this also checks that the staged rows reach a graph replay at the right layer and
 *   position (a row of another position or layer would differ from the own picks somewhere and change a row);
 *   the staggered batch (--batch 3 --dump-seq 1) checks that only the dumped copy follows and at its own
 *   positions;
 * - following a dump whose row differs at ONE (position, layer) from the own one: everything before that
 *   position is bitwise the free run's; at it, the probe of the selection (topk_idx / router_ids, and the router
 *   weights) still records the path's own choice, bitwise, while the output of that attention / MoE differs;
 *   the run reports at least that row as run on the dump's choice (later positions may follow too: their state
 *   differs from the free run's from there on). Once for a top-k row (CSA layer), once for a
 *   router row (learned MoE layer).
 * The modified dumps are written here: the free run's topk_idx and router_ids, one row changed.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4_test.h"

static char *dir;

/* dsv4 run --path opt on the set's forced tokens into DIR/out.h5 with extra args; returns the output */
static char *run_opt(const char *set, const char *out, const char *args)
{
    char cmd[4096], g[512], *o = NULL;
    snprintf(g, sizeof g, "%s", dsv4_test_source_path(""));
    snprintf(cmd, sizeof cmd, "%s run --model %sgolden/%s --path opt --tokens-from %sgolden/%s/forced.h5 %s "
             "--dump %s/%s 2>&1", dsv4_test_bin(), g, set, g, set, args, dir, out);
    int st = dsv4_test_run(cmd, &o);
    ck_assert_msg(st == 0, "%s\n%s", cmd, o ? o : "");
    printf("$ %s\n%s", cmd, o ? o : "");
    return o;
}

static char *path_of(const char *file)
{
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", dir, file);
    return p;
}

/* Rows [0, n_rows) of `name` in both dumps: bitwise equal (want_equal) or differing somewhere. */
static void compare_rows(dsv4_dump *a, dsv4_dump *b, const char *name, int64_t row0, int64_t n_rows, int want_equal)
{
    dsv4_dataset_info ia, ib;
    ck_assert_msg(dsv4_dump_info(a, name, &ia) == 0 && dsv4_dump_info(b, name, &ib) == 0, "%s: %s", name,
                  dsv4_last_error());
    ck_assert_int_eq(ia.ndim, ib.ndim);
    size_t row = 1;
    for (int k = 1; k < ia.ndim; k++) {
        ck_assert_int_eq(ia.shape[k], ib.shape[k]);
        row *= (size_t)ia.shape[k];
    }
    if (n_rows < 0) n_rows = ia.shape[0] - row0;
    if (n_rows <= 0) return;
    void *da = malloc((size_t)n_rows * row * 4), *db = malloc((size_t)n_rows * row * 4);
    ck_assert(dsv4_dump_read_rows(a, name, row0, n_rows, da) == 0);
    ck_assert(dsv4_dump_read_rows(b, name, row0, n_rows, db) == 0);
    size_t first = (size_t)-1;
    for (size_t i = 0; i < (size_t)n_rows * row && first == (size_t)-1; i++)
        if (memcmp((char *)da + 4 * i, (char *)db + 4 * i, 4)) first = i;
    if (want_equal)
        ck_assert_msg(first == (size_t)-1, "%s rows %lld..%lld: differ first at row %lld element %zu (%s)", name,
                      (long long)row0, (long long)(row0 + n_rows - 1), (long long)(row0 + first / row), first % row,
                      ia.dtype == DSV4_DTYPE_I32 ? "ids" : "values");
    else
        ck_assert_msg(first != (size_t)-1, "%s rows %lld..%lld: bitwise equal, but they must differ", name,
                      (long long)row0, (long long)(row0 + n_rows - 1));
    free(da);
    free(db);
}

/* Every dataset of a and b bitwise equal. */
static void assert_same(const char *pa, const char *pb)
{
    dsv4_dump *a = NULL, *b = NULL;
    ck_assert_msg(dsv4_dump_open(pa, &a) == 0 && dsv4_dump_open(pb, &b) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_dump_dataset_count(a), dsv4_dump_dataset_count(b));
    for (int i = 0; i < dsv4_dump_dataset_count(a); i++) compare_rows(a, b, dsv4_dump_dataset_name(a, i), 0, -1, 1);
    dsv4_dump_free(a);
    dsv4_dump_free(b);
}

/* The counts of the run's follow line: rows that ran on the dump's choice instead of the own one. */
static void followed_rows(const char *out, long *topk_changed, long *router_changed)
{
    const char *t = strstr(out, " ran on the dump's picks"), *r = strstr(out, " on the dump's experts)");
    ck_assert_msg(t && r, "no follow line in:\n%s", out);
    while (t > out && t[-1] != '(') t--;
    while (r > out && r[-1] != '(') r--;
    *topk_changed = strtol(t, NULL, 10);
    *router_changed = strtol(r, NULL, 10);
}

static void assert_followed_rows(const char *out, long topk_changed, long router_changed)
{
    long t, r;
    followed_rows(out, &t, &r);
    ck_assert_msg(t == topk_changed && r == router_changed, "want %ld top-k and %ld router rows on the dump's "
                  "choices, the run reports %ld and %ld:\n%s", topk_changed, router_changed, t, r, out);
}

/* Following the free run's own choices at every position changes nothing. The follow source is made with the
 * same batch: a copy of a batch agrees with a batch of 1 only within bf16 noise, so its own picks could differ at
 * a near-tie. */
static void own_dump_changes_nothing(const char *set, const char *positions, const char *batch)
{
    char args[1024];
    snprintf(args, sizeof args, "--dump-positions all %s", batch);
    free(run_opt(set, "own.h5", args));
    snprintf(args, sizeof args, "--dump-positions %s %s", positions, batch);
    free(run_opt(set, "free.h5", args));
    char *own = path_of("own.h5");
    snprintf(args, sizeof args, "--dump-positions %s %s --follow %s", positions, batch, own);
    char *out = run_opt(set, "follow.h5", args);
    ck_assert_msg(strstr(out, "follow: "), "no follow line:\n%s", out);
    assert_followed_rows(out, 0, 0);
    char *a = path_of("free.h5"), *b = path_of("follow.h5");
    assert_same(a, b);
    free(a), free(b), free(own), free(out);
}

START_TEST(test_follow_own_dump_all) { own_dump_changes_nothing("tiny", "all", ""); }
END_TEST
START_TEST(test_follow_own_dump_decode) { own_dump_changes_nothing("tiny", "decode", ""); }
END_TEST
START_TEST(test_follow_own_dump_batch) { own_dump_changes_nothing("tiny", "all", "--batch 3 --dump-seq 1"); }
END_TEST
START_TEST(test_follow_own_dump_topk512)
{
    if (dsv4_test_max_steps()) { /* the topk512 cases are left out */
        printf("%s: not run (DSV4_TEST_MAX_STEPS is set)\n", __func__);
        return;
    }
    own_dump_changes_nothing("topk512", "decode", "");
}
END_TEST

/* Copy the free run's topk_idx and router_ids into DIR/file, one row changed: kind 0 top-k, 1 router, at the
 * first stored position >= p0 where a change is possible in layer L. Returns that position. */
static int write_changed(const char *src, const char *file, int kind, int L, int p0)
{
    dsv4_dump *d = NULL;
    ck_assert_int_eq(dsv4_dump_open(src, &d), 0);
    const dsv4_config *cfg = NULL;
    ck_assert_int_eq(dsv4_dump_config(d, &cfg), 0);
    int T, R;
    const int32_t *tok = dsv4_dump_tokens(d, &T), *pos = dsv4_dump_positions(d, &R);
    ck_assert_int_eq(R, T); /* every position stored: row = position */
    dsv4_dump_meta meta = {.producer = "test_opt_follow_run (changed)", .config_json = dsv4_dump_attr(d, "config_json"),
                           .weights_digest = dsv4_dump_attr(d, "weights_digest"),
                           .prompt_len = dsv4_dump_prompt_len(d), .n_decode = dsv4_dump_n_decode(d), .mode = "forced"};
    char *out = path_of(file);
    dsv4_dump_writer *w = NULL;
    ck_assert_msg(dsv4_dump_writer_open(out, &meta, cfg, tok, T, pos, R, &w) == 0, "%s", dsv4_last_error());
    int changed_at = -1;
    for (int l = 0; l < cfg->num_hidden_layers; l++)
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "layers/%d/%s", l, k ? "router_ids" : "topk_idx");
            if (!dsv4_dump_has(d, name)) continue;
            const int wd = k ? cfg->num_experts_per_tok : cfg->index_topk;
            int32_t *rows = malloc((size_t)R * wd * 4);
            ck_assert(dsv4_dump_read_rows(d, name, 0, R, rows) == 0);
            for (int p = p0; k == kind && l == L && changed_at < 0 && p < T; p++) {
                int32_t *r = rows + (size_t)p * wd;
                const int n_ids = k ? cfg->n_routed_experts : (p + 1) / cfg->compress_ratio[l];
                int used = 0;
                for (int j = 0; j < wd; j++) used += r[j] >= 0;
                if (used == 0 || used >= n_ids) continue; /* no free id to swap in */
                for (int e = n_ids - 1; e >= 0 && changed_at < 0; e--) {
                    int in = 0;
                    for (int j = 0; j < wd; j++) in |= r[j] == e;
                    if (!in) {
                        r[0] = e; /* the first pick replaced by an id the path did not choose */
                        changed_at = p;
                    }
                }
            }
            int64_t shape[1] = {wd};
            for (int p = 0; p < R; p++)
                ck_assert(dsv4_dump_writer_row(w, name, p, DSV4_DTYPE_I32, 1, shape, rows + (size_t)p * wd) == 0);
            free(rows);
        }
    ck_assert_int_eq(dsv4_dump_writer_commit(w), 0);
    dsv4_dump_free(d);
    free(out);
    ck_assert_int_ge(changed_at, 0);
    return changed_at;
}

static void check_one_change(const char *set, int kind)
{
    free(run_opt(set, "own.h5", "--dump-positions all"));
    char *own = path_of("own.h5");
    dsv4_dump *d = NULL;
    ck_assert_int_eq(dsv4_dump_open(own, &d), 0);
    const dsv4_config *cfg = NULL;
    ck_assert_int_eq(dsv4_dump_config(d, &cfg), 0);
    int L = -1;
    for (int l = 0; l < cfg->num_hidden_layers && L < 0; l++)
        if (kind == 0 ? cfg->attn_type[l] == DSV4_ATTN_CSA : cfg->mlp_type[l] == DSV4_MLP_MOE) L = l;
    ck_assert_int_ge(L, 0);
    dsv4_dump_free(d);
    const int p = write_changed(own, "changed.h5", kind, L, 20);
    char args[600];
    char *chg = path_of("changed.h5");
    snprintf(args, sizeof args, "--dump-positions all --follow %s", chg);
    char *out = run_opt(set, "follow.h5", args);
    /* at least the changed row ran on the dump's choice; later ones may too: from p on the state differs, so the
     * path's own picks of later positions can differ from the dump's unchanged rows (tiny flips near-ties) */
    long t_rows, r_rows;
    followed_rows(out, &t_rows, &r_rows);
    ck_assert_msg(kind == 0 ? t_rows >= 1 : r_rows >= 1, "the changed row did not run on the dump's choice:\n%s",
                  out);
    printf("%s: %s row of layer %d changed at position %d\n", set, kind ? "router" : "top-k", L, p);
    char *fol = path_of("follow.h5");
    dsv4_dump *a = NULL, *b = NULL;
    ck_assert(dsv4_dump_open(own, &a) == 0 && dsv4_dump_open(fol, &b) == 0);
    for (int i = 0; i < dsv4_dump_dataset_count(a); i++) { /* every per-position probe before p */
        const char *name = dsv4_dump_dataset_name(a, i);
        if (strstr(name, "compressed_kv") || strstr(name, "indexer_kv")) continue;
        compare_rows(a, b, name, 0, p, 1);
    }
    char name[64];
    const char *own_probe[2][2] = {{"topk_idx", NULL}, {"router_ids", "router_weights"}};
    for (int j = 0; j < 2; j++) {
        if (!own_probe[kind][j]) continue;
        snprintf(name, sizeof name, "layers/%d/%s", L, own_probe[kind][j]);
        compare_rows(a, b, name, p, 1, 1); /* the dump records the path's own choice */
    }
    snprintf(name, sizeof name, "layers/%d/%s", L, kind == 0 ? "attn_out" : "ffn_out");
    compare_rows(a, b, name, p, 1, 0); /* ... and the step ran on the dump's */
    dsv4_dump_free(a);
    dsv4_dump_free(b);
    free(own), free(chg), free(out), free(fol);
}

START_TEST(test_follow_one_changed_topk_row)
{
    check_one_change("tiny", 0);
    if (!dsv4_test_max_steps()) check_one_change("topk512", 0); /* DSV4_TEST_MAX_STEPS: tiny only */
}
END_TEST
START_TEST(test_follow_one_changed_router_row) { check_one_change("tiny", 1); }
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    dir = dsv4_test_mkdtemp("opt-follow");
    Suite *s = suite_create("opt_follow_run");
    const TTest *const tests[] = {
        test_follow_own_dump_all,
        test_follow_own_dump_decode,
        test_follow_own_dump_batch,
        test_follow_own_dump_topk512,
        test_follow_one_changed_topk_row,
        test_follow_one_changed_router_row,
    };
    dsv4_test_add_each(s, 900, tests, (int)(sizeof tests / sizeof tests[0]));
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(dir);
    return rc;
}
