/* test_verify_basic.c - dsv4 verify on synthetic pairs: identical files pass, noise from layer k is first
 * seen at layer k, a NaN is found at its position, a missing probe is listed, a different digest or a wrong
 * schema cannot be compared, parted token streams are a divergence at the first differing token. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_verify.h"
#include "dsv4_test.h"
#include "synth_dump.h"
#include "verify_pair.h"

static char *g_dir;

START_TEST(identical_files_pass)
{
    synth_spec s;
    synth_spec_init(&s);
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert(!r->first.found);
    ck_assert_int_eq(r->n_positions, 40);
    ck_assert_int_eq(r->n_only_golden + r->n_only_candidate, 0);
    ck_assert_int_gt(r->n_checks, 1000);
    ck_assert_int_eq(r->n_failed_checks, 0);
    dsv4_verify_result_free(r);
    char *out = NULL;
    int st = verify_pair_cli("", &out);
    printf("%s", out);
    ck_assert_int_eq(st, 0);
    ck_assert_ptr_nonnull(strstr(out, "VERDICT: PASS"));
    free(out);
}
END_TEST

START_TEST(tiny_noise_below_tolerance_passes)
{
    /* 1e-6 relative noise everywhere is within the fp32 gate (1e-4) but not zero: the gate, not equality */
    synth_spec s;
    synth_spec_init(&s);
    s.base_noise = 1e-6;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    int probe = -1;
    for (int i = 0; i < r->n_probes; i++)
        if (!strcmp(r->probes[i].dataset, "layers/2/attn_out")) probe = i;
    ck_assert_int_ge(probe, 0);
    double rel = r->probes[probe].worst[DSV4_METRIC_REL_L2];
    ck_assert_msg(rel > 3e-7 && rel < 3e-6, "rel_l2 %g for 1e-6 rms noise", rel);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(noise_from_layer_k_first_diverges_at_k)
{
    for (int k = 1; k <= 3; k++) {
        synth_spec s;
        synth_spec_init(&s);
        s.noise = 1e-3; /* 10x the fp32 gate */
        s.noise_layer = k;
        s.base_noise = 1e-7;
        dsv4_verify_result *r = verify_pair_run(&s, NULL);
        ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
        ck_assert(r->first.found);
        ck_assert_int_eq(r->first.layer, k);
        ck_assert_int_eq(r->first.position, 0);
        ck_assert_str_eq(r->first.dataset, k == 1   ? "layers/1/attn_hc_pre"
                                           : k == 2 ? "layers/2/attn_hc_pre"
                                                    : "layers/3/attn_hc_pre");
        ck_assert_int_eq(r->first.metric, DSV4_METRIC_REL_L2);
        ck_assert(r->first.value > 1e-4 && r->first.tolerance == 1e-4);
        /* nothing before layer k fails, at any position */
        for (int i = 0; i < r->n_probes; i++)
            if (r->probes[i].layer >= 0 && r->probes[i].layer < k) ck_assert_int_eq(r->probes[i].n_failed_rows, 0);
        dsv4_verify_result_free(r);
    }
    char *out = NULL;
    int st = verify_pair_cli("", &out);
    printf("%s", out);
    ck_assert_int_eq(st, 1);
    ck_assert_ptr_nonnull(strstr(out, "first divergence: position 0, layer 3 (csa/moe), attn_hc_pre"));
    free(out);
}
END_TEST

START_TEST(noise_from_a_position_is_position_major)
{
    /* noise on layers >= 1 from position 30, plus layer 3 everywhere: the earlier position wins (layer 3, pos 0);
     * a layer-major order would name (position 30, layer 1) */
    synth_spec s;
    synth_spec_init(&s);
    s.noise = 1e-3;
    s.noise_layer = 1;
    s.noise_position = 30;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.position, 30);
    ck_assert_int_eq(r->first.layer, 1);
    dsv4_verify_result_free(r);
    ck_assert_int_eq(synth_copy_perturbed(verify_pair_path("cand.h5"), verify_pair_path("cand3.h5"), 3, 1e-3, 7), 0);
    ck_assert_int_eq(dsv4_verify_run(verify_pair_path("golden.h5"), verify_pair_path("cand3.h5"), NULL, &r), 0);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_msg(r->first.position == 0 && r->first.layer == 3, "first divergence at position %d, layer %d (%s)",
                  r->first.position, r->first.layer, r->first.dataset);
    ck_assert_str_eq(r->first.dataset, "layers/3/attn_hc_pre");
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(nan_found_at_its_position)
{
    synth_spec s;
    synth_spec_init(&s);
    s.nan_dataset = "layers/2/attn_out";
    s.nan_position = 33;
    s.nan_index = 17;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.position, 33);
    ck_assert_int_eq(r->first.layer, 2);
    ck_assert_str_eq(r->first.dataset, "layers/2/attn_out");
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_NONFINITE);
    ck_assert_ptr_nonnull(strstr(r->first.detail, "[17]"));
    ck_assert_int_eq(r->probes[r->first.probe_index].n_failed_rows, 1);
    dsv4_verify_result_free(r);
    /* the same NaN in a per-entry probe, found at the position that closes the entry */
    synth_spec_init(&s);
    s.nan_dataset = "layers/1/compressed_kv"; /* CSA, ratio 4: entry 5 closes at position 23 */
    s.nan_position = 5;
    r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.entry, 5);
    ck_assert_int_eq(r->first.position, 23);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_NONFINITE);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(missing_probe_is_listed)
{
    synth_spec s;
    synth_spec_init(&s);
    s.omit_dataset = "layers/2/kv";
    s.omit_role = 1;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->n_only_golden, 1);
    ck_assert_int_eq(r->n_only_candidate, 0);
    int found = 0;
    for (int i = 0; i < r->n_probes; i++)
        if (r->probes[i].presence == DSV4_VERIFY_ONLY_GOLDEN) found = !strcmp(r->probes[i].dataset, "layers/2/kv");
    ck_assert(found);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    dsv4_verify_result_free(r);
    char *out = NULL;
    ck_assert_int_eq(verify_pair_cli("", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "only in golden: 1 dataset the candidate did not provide, not compared"));
    ck_assert_ptr_nonnull(strstr(out, "\n  kv (layer 2)\n"));
    free(out);
    /* and the other way round */
    s.omit_role = 0;
    s.omit_dataset = "final/norm";
    r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->n_only_candidate, 1);
    dsv4_verify_result_free(r);
    ck_assert_int_eq(verify_pair_cli("", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "only in candidate (1, not compared): final/norm"));
    free(out);
}
END_TEST

START_TEST(different_digest_exit_2_unless_allowed)
{
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    s.digest = "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    char *out = NULL;
    ck_assert_int_eq(verify_pair_cli("", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "different weights"));
    free(out);
    ck_assert_int_eq(verify_pair_cli("--allow-different-weights", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "WEIGHTS DIFFER"));
    free(out);
}
END_TEST

START_TEST(wrong_schema_exit_2)
{
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    ck_assert_int_eq(synth_set_root_attr(verify_pair_path("cand.h5"), "schema", "dsv4-dump/0"), 0);
    char *out = NULL;
    ck_assert_int_eq(verify_pair_cli("", &out), 2);
    printf("%s", out);
    ck_assert_ptr_nonnull(strstr(out, "COULD NOT COMPARE"));
    ck_assert_ptr_nonnull(strstr(out, "schema"));
    free(out);
    /* an unreadable file and a missing one */
    FILE *f = fopen(verify_pair_path("cand.h5"), "w");
    fputs("not hdf5", f);
    fclose(f);
    ck_assert_int_eq(verify_pair_cli("", &out), 2);
    free(out);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "'%s' verify %s %s", dsv4_test_bin(), verify_pair_path("golden.h5"),
             verify_pair_path("nope.h5"));
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 2);
}
END_TEST

START_TEST(no_common_positions_exit_2)
{
    synth_spec s;
    synth_spec_init(&s);
    int32_t a[3] = {1, 2, 3}, b[3] = {30, 31, 32};
    s.positions = a;
    s.n_positions = 3;
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    s.positions = b;
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    char *out = NULL;
    ck_assert_int_eq(verify_pair_cli("", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "no common positions"));
    free(out);
    /* --probes matching nothing: no common probes */
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    ck_assert_int_eq(verify_pair_cli("--probes 'no_such_*'", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "no common probes"));
    free(out);
}
END_TEST

START_TEST(subset_positions_compared_where_both_store)
{
    synth_spec s;
    synth_spec_init(&s);
    int32_t a[6] = {0, 10, 23, 30, 35, 39}, b[4] = {10, 23, 35, 38};
    s.positions = a;
    s.n_positions = 6;
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    s.positions = b;
    s.n_positions = 4;
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(verify_pair_path("golden.h5"), verify_pair_path("cand.h5"), NULL, &r), 0);
    /* indexer_scores widths differ (N = 10 vs 9 entries): compared over the common columns, still exact */
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert_int_eq(r->n_positions, 3);
    ck_assert_int_eq(r->positions[0], 10);
    ck_assert_int_eq(r->positions[2], 35);
    dsv4_verify_result_free(r);
}
END_TEST

/* A finite indexer score in a column only the wider file has (an entry the other file's row does not hold) is a
 * non-finite-metric failure there, and its description says the narrower file has no such value (it read past
 * the golden's row before). */
START_TEST(finite_score_past_the_narrower_row_is_reported)
{
    synth_spec s;
    synth_spec_init(&s);
    int32_t a[28], b[40];
    for (int i = 0; i < 40; i++) b[i] = i;
    memcpy(a, b, sizeof a);
    s.positions = a;
    s.n_positions = 28;
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    s.positions = b;
    s.n_positions = 40;
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    /* golden rows hold 7 entries, the candidate's 10; at position 27 entry 9 is not yet closed (-inf) */
    ck_assert_int_eq(synth_set_element(verify_pair_path("cand.h5"), "layers/1/indexer_scores", 27, 9, 1.5f), 0);
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(verify_pair_path("golden.h5"), verify_pair_path("cand.h5"), NULL, &r), 0);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_str_eq(r->first.dataset, "layers/1/indexer_scores");
    ck_assert_int_eq(r->first.position, 27);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_NONFINITE);
    ck_assert_msg(strstr(r->first.detail, "first at [9]: golden absent, candidate 1.5"), "%s", r->first.detail);
    dsv4_verify_result_free(r);
}
END_TEST

/* Another tool's extra probe may have a long name: up to DSV4_VERIFY_NAME_MAX - 1 bytes it is compared (a 96-byte
 * buffer cut it before, and the comparison stopped: no such dataset); past that it is one structure failure that
 * says why, not a stop. */
START_TEST(long_dataset_names)
{
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    char fits[DSV4_VERIFY_NAME_MAX], too_long[DSV4_VERIFY_NAME_MAX + 40];
    snprintf(fits, sizeof fits, "layers/0/extra_%0*d", DSV4_VERIFY_NAME_MAX - 1 - 15, 0);
    snprintf(too_long, sizeof too_long, "layers/0/extra_%0*d", DSV4_VERIFY_NAME_MAX + 20 - 15, 0);
    ck_assert_int_eq((int)strlen(fits), DSV4_VERIFY_NAME_MAX - 1);
    const char *golden = verify_pair_path("golden.h5"), *cand = verify_pair_path("cand.h5"), *files[2] = {golden, cand};
    for (int f = 0; f < 2; f++) ck_assert_int_eq(synth_copy_dataset(files[f], "layers/0/attn_out", fits), 0);
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(golden, cand, NULL, &r), 0);
    ck_assert_msg(r->status == DSV4_VERIFY_PASS, "status %d: %s %s", r->status, r->error, r->first.detail);
    int compared = 0;
    for (int i = 0; i < r->n_probes; i++) compared += !strcmp(r->probes[i].dataset, fits) && r->probes[i].n_rows > 0;
    ck_assert_int_eq(compared, 1);
    dsv4_verify_result_free(r);
    for (int f = 0; f < 2; f++) ck_assert_int_eq(synth_copy_dataset(files[f], "layers/0/attn_out", too_long), 0);
    ck_assert_int_eq(dsv4_verify_run(golden, cand, NULL, &r), 0);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_STRUCTURE);
    ck_assert_msg(strstr(r->first.detail, "longer than the 255 the verifier holds: not compared"), "%s",
                  r->first.detail);
    dsv4_verify_result_free(r);
}
END_TEST

/* Another tool's extra probe stored as float in one file and as integers in the other, same shape: the reader
 * checks only probes of dump-format.md, so the verifier must say what differs: the dtype, not "shapes". */
START_TEST(extra_probe_dtype_differs_is_named)
{
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    /* router_weights f32 [40, 2] and router_ids i32 [40, 2] (k_experts 2): the same shape */
    ck_assert_int_eq(synth_copy_dataset(verify_pair_path("golden.h5"), "layers/2/router_weights", "layers/2/extra"), 0);
    ck_assert_int_eq(synth_copy_dataset(verify_pair_path("cand.h5"), "layers/2/router_ids", "layers/2/extra"), 0);
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(verify_pair_path("golden.h5"), verify_pair_path("cand.h5"), NULL, &r), 0);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_str_eq(r->first.dataset, "layers/2/extra");
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_STRUCTURE);
    ck_assert_msg(strstr(r->first.detail, "dtypes differ: golden F32[40,2], candidate I32[40,2]"), "%s",
                  r->first.detail);
    dsv4_verify_result_free(r);
}
END_TEST

/* Another tool's extra i32 probe (not topk_idx or router_ids) is compared exactly: equal passes, one changed
 * element is a divergence at that probe and position, counted as one differing element. */
START_TEST(extra_int_probe_is_exact)
{
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    for (int f = 0; f < 2; f++)
        ck_assert_int_eq(synth_copy_dataset(verify_pair_path(f ? "cand.h5" : "golden.h5"), "layers/2/router_ids",
                                            "layers/2/extra_ids"),
                         0);
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(verify_pair_path("golden.h5"), verify_pair_path("cand.h5"), NULL, &r), 0);
    ck_assert_msg(r->status == DSV4_VERIFY_PASS, "status %d: %s", r->status, r->first.detail);
    int rows = 0;
    for (int i = 0; i < r->n_probes; i++)
        if (!strcmp(r->probes[i].dataset, "layers/2/extra_ids")) {
            ck_assert_int_eq(r->probes[i].kind, DSV4_VERIFY_KIND_INT);
            rows = r->probes[i].n_rows;
        }
    ck_assert_int_eq(rows, 40);
    dsv4_verify_result_free(r);
    /* row 30 is position 30 (every position stored) */
    ck_assert_int_eq(synth_set_element(verify_pair_path("cand.h5"), "layers/2/extra_ids", 30, 1, 1234), 0);
    ck_assert_int_eq(dsv4_verify_run(verify_pair_path("golden.h5"), verify_pair_path("cand.h5"), NULL, &r), 0);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_str_eq(r->first.dataset, "layers/2/extra_ids");
    ck_assert_int_eq(r->first.position, 30);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_MISMATCH);
    ck_assert_msg(strstr(r->first.detail, "1 differing elements"), "%s", r->first.detail);
    dsv4_verify_result_free(r);
    /* the command says so; a mismatch gate of the entry that applies (default) is kept, and gates switched off
     * stay off */
    char *out = NULL;
    ck_assert_int_eq(verify_pair_cli("", &out), 1);
    ck_assert_msg(strstr(out, "first divergence: position 30, layer 2 (hca/moe), extra_ids"), "%s", out);
    free(out);
    ck_assert_int_eq(verify_pair_cli("--tol default=mismatch:1", &out), 0);
    free(out);
    ck_assert_int_eq(verify_pair_cli("--tol default=rel_l2:off", &out), 0);
    free(out);
}
END_TEST

START_TEST(parted_tokens_are_reported)
{
    synth_spec s;
    synth_spec_init(&s);
    s.mode = "greedy";
    s.token_diff_position = 30;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->token_diff_position, 30);
    ck_assert_int_eq(r->first.position, 30);
    ck_assert_str_eq(r->first.dataset, "tokens");
    ck_assert_int_eq(r->n_positions, 30);
    ck_assert_int_eq(r->n_positions_not_compared, 10);
    dsv4_verify_result_free(r);
    char *out = NULL;
    ck_assert_int_eq(verify_pair_cli("", &out), 1);
    printf("%s", out);
    ck_assert_ptr_nonnull(strstr(out, "tokens differ from position 30"));
    free(out);
    /* inside the prompt: different prompts, nothing comparable */
    s.token_diff_position = 5;
    dsv4_verify_result *r2 = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r2->status, DSV4_VERIFY_ERROR);
    ck_assert_ptr_nonnull(strstr(r2->error, "different prompts"));
    dsv4_verify_result_free(r2);
}
END_TEST

/* `dsv4 verify ARGS`: exit status 2 and the output (stderr with stdout) holding needle */
static void expect_usage_error(const char *args, const char *needle)
{
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' verify %s 2>&1", dsv4_test_bin(), args);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 2);
    ck_assert_msg(out && strstr(out, needle), "%s: output lacks '%s':\n%s", cmd, needle, out ? out : "");
    free(out);
}

START_TEST(help_and_bad_usage)
{
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' verify --help", dsv4_test_bin());
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "--allow-different-weights"));
    free(out);
    expect_usage_error("only-one.h5", "'only-one.h5' is the golden dump; give the candidate dump too");
    expect_usage_error("", "usage: dsv4 verify GOLDEN.h5 CANDIDATE.h5");
    expect_usage_error("a.h5 b.h5 c.h5", "one golden and one candidate dump, got a third argument 'c.h5'");
    /* a report over a device node: renaming the finished report onto it would replace the node */
    expect_usage_error("a.h5 b.h5 --json /dev/null", "--json /dev/null: exists and is not a regular file");
    expect_usage_error("a.h5 b.h5 --layers 5-2", "--layers '5-2': expected A-B");
    expect_usage_error("a.h5 b.h5 --bogus", "unknown option '--bogus'");
}
END_TEST

int main(void)
{
    g_dir = dsv4_test_mkdtemp("verify-basic");
    verify_pair_dir(g_dir);
    Suite *s = suite_create("verify_basic");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, identical_files_pass);
    tcase_add_test(tc, tiny_noise_below_tolerance_passes);
    tcase_add_test(tc, noise_from_layer_k_first_diverges_at_k);
    tcase_add_test(tc, noise_from_a_position_is_position_major);
    tcase_add_test(tc, nan_found_at_its_position);
    tcase_add_test(tc, missing_probe_is_listed);
    tcase_add_test(tc, different_digest_exit_2_unless_allowed);
    tcase_add_test(tc, wrong_schema_exit_2);
    tcase_add_test(tc, no_common_positions_exit_2);
    tcase_add_test(tc, subset_positions_compared_where_both_store);
    tcase_add_test(tc, finite_score_past_the_narrower_row_is_reported);
    tcase_add_test(tc, long_dataset_names);
    tcase_add_test(tc, extra_probe_dtype_differs_is_named);
    tcase_add_test(tc, extra_int_probe_is_exact);
    tcase_add_test(tc, parted_tokens_are_reported);
    tcase_add_test(tc, help_and_bad_usage);
    suite_add_tcase(s, tc);
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(g_dir);
    return rc;
}
