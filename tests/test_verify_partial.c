/* test_verify_partial.c - a partial candidate (another engine that cannot give every probe or position;
 * docs/dump-format.md "Partial dumps"): what both files hold is compared, what the candidate lacks is listed plainly
 * (datasets grouped by probe, positions as ranges) and does not fail, unless --require names it (a structure failure
 * in model order, exit 1; a glob matching nothing is exit 2); top-k picks are still judged by the GOLDEN's
 * indexer_scores when the candidate has none (tie swaps accepted, clearly lower picks strict). */
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

START_TEST(missing_datasets_are_listed_not_failed)
{
    synth_spec s;
    synth_spec_init(&s);
    s.omit_probes = "kv,attn_hc_*,compressed_kv,final/norm";
    s.omit_role = 1;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    /* 4 layers x (kv + 3 attn_hc) + compressed_kv of layers 1-3 + final/norm */
    ck_assert_int_eq(r->n_only_golden, 4 * 4 + 3 + 1);
    ck_assert_int_eq(r->n_required_missing, 0);
    ck_assert_int_eq(r->n_only_candidate, 0);
    ck_assert_int_eq(r->n_failed_checks, 0);
    ck_assert_int_eq(verify_pair_probe(r, "layers/1/attn_out")->n_rows, 40); /* what both hold is compared */
    dsv4_verify_result_free(r);
    char *out = NULL;
    ck_assert_int_eq(verify_pair_cli("", &out), 0);
    ck_assert_msg(strstr(out, "VERDICT: PASS  every gated metric within the fp32 profile (but see what only one file "
                              "holds, below)"), "%s", out);
    ck_assert_msg(strstr(out, "only in golden: 20 datasets the candidate did not provide, not compared (a partial "
                              "dump; --require PROBES makes a missing probe fail)\n"
                              "  attn_hc_pre (layers 0-3), attn_hc_post (layers 0-3), attn_hc_comb (layers 0-3), kv "
                              "(layers 0-3), compressed_kv (layers 1-3), final/norm\n"), "%s", out);
    free(out);
}
END_TEST

START_TEST(missing_positions_are_listed_not_failed)
{
    synth_spec s;
    synth_spec_init(&s);
    int32_t cand[17];
    int n = 0;
    for (int p = 23; p < 40; p++) cand[n++] = p; /* the last prefill position and every decode position */
    s.candidate_positions = cand;
    s.n_candidate_positions = n;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert_int_eq(r->n_positions, 17);
    ck_assert_int_eq(r->positions[0], 23);
    ck_assert_int_eq(r->n_positions_only_golden, 23);
    ck_assert_int_eq(r->positions_only_golden[22], 22);
    ck_assert_int_eq(r->n_positions_only_candidate, 0);
    ck_assert_int_eq(r->n_only_golden, 0);
    dsv4_verify_result_free(r);
    char *out = NULL;
    ck_assert_int_eq(verify_pair_cli("", &out), 0);
    ck_assert_msg(strstr(out, "only in golden: 23 of its 40 stored positions the candidate did not store, not "
                              "compared: 0-22\n"), "%s", out);
    free(out);
    /* --positions narrows the listing too */
    ck_assert_int_eq(verify_pair_cli("--positions 20-", &out), 0);
    ck_assert_msg(strstr(out, "only in golden: 3 of its 40 stored positions the candidate did not store, not "
                              "compared: 20-22\n"), "%s", out);
    free(out);
}
END_TEST

START_TEST(topk_judged_by_golden_scores_without_candidate_scores)
{
    /* the candidate has no indexer_scores at all; its tied swaps are still accepted by the golden's scores */
    synth_spec s;
    synth_spec_init(&s);
    s.omit_probes = "indexer_scores";
    s.omit_role = 1;
    s.tie_layer = 3;
    s.tie_position = 35;
    s.tie_count = 2;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert_int_eq(r->n_only_golden, 2);
    const dsv4_verify_row *row = verify_pair_row(verify_pair_probe(r, "layers/3/topk_idx"), 35);
    ck_assert_double_eq(row->v[DSV4_METRIC_ACCEPTED], 2);
    ck_assert_double_eq(row->v[DSV4_METRIC_STRICT], 0);
    ck_assert(r->first_tie.found && r->first_tie.position == 35 && r->first_tie.layer == 3);
    dsv4_verify_result_free(r);
    /* and picks of clearly lower golden score are strict mismatches, with the candidate's scores absent */
    synth_spec_init(&s);
    s.omit_probes = "indexer_scores";
    s.omit_role = 1;
    s.low_layer = 1;
    s.low_position = 30;
    s.low_count = 1;
    r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_str_eq(r->first.dataset, "layers/1/topk_idx");
    ck_assert_int_eq(r->first.position, 30);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_STRICT);
    ck_assert_double_eq(verify_pair_row(verify_pair_probe(r, "layers/1/topk_idx"), 30)->v[DSV4_METRIC_STRICT], 1);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(require_makes_a_missing_probe_fail)
{
    synth_spec s;
    synth_spec_init(&s);
    s.omit_probes = "kv,indexer_scores";
    s.omit_role = 1;
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.require = "indexer_scores,final/*";
    dsv4_verify_result *r = verify_pair_run(&s, &o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->n_only_golden, 6);
    ck_assert_int_eq(r->n_required_missing, 2);
    ck_assert_int_eq(r->n_failed_checks, 2);
    ck_assert(verify_pair_probe(r, "layers/1/indexer_scores")->required &&
              !verify_pair_probe(r, "layers/0/kv")->required);
    /* the first in model order: position 0 (the first compared), layer 1 */
    ck_assert_str_eq(r->first.dataset, "layers/1/indexer_scores");
    ck_assert_int_eq(r->first.position, 0);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_STRUCTURE);
    ck_assert_ptr_nonnull(strstr(r->first.detail, "required by --require"));
    dsv4_verify_result_free(r);

    /* a failure earlier in model order stays first: noise at layer 0 from position 0 */
    s.noise = 1e-2;
    s.noise_layer = 0;
    s.noise_position = 0;
    r = verify_pair_run(&s, &o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.layer, 0);
    ck_assert_int_eq(r->first.position, 0);
    dsv4_verify_result_free(r);

    /* what the candidate has may be required */
    s.noise_layer = -1;
    o.require = "out,final/logits,layers/*/topk_idx";
    r = verify_pair_run(&s, &o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert_int_eq(r->n_required_missing, 0);
    dsv4_verify_result_free(r);

    /* a glob that matches nothing of the golden is an error, not a requirement met */
    o.require = "out,topk-idx";
    r = verify_pair_run(&s, &o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_ERROR);
    ck_assert_msg(strstr(r->error, "--require 'topk-idx' matches no dataset of the golden"), "%s", r->error);
    dsv4_verify_result_free(r);

    char *out = NULL;
    ck_assert_int_eq(verify_pair_cli("--require kv", &out), 1);
    ck_assert_msg(strstr(out, "only in golden: 6 datasets the candidate did not provide: 4 REQUIRED by --require "
                              "(failed), 2 not compared\n  kv (layers 0-3; REQUIRED), indexer_scores (layers 1, 3)"),
                  "%s", out);
    ck_assert_msg(strstr(out, "first divergence: position 0, layer 0 (swa/hash), kv"), "%s", out);
    free(out);
    ck_assert_int_eq(verify_pair_cli("--require nosuch", &out), 2);
    free(out);
    ck_assert_int_eq(verify_pair_cli("--require 'out,final/logits'", &out), 0);
    free(out);
    /* --probes narrows what --require applies to */
    ck_assert_int_eq(verify_pair_cli("--require kv --probes 'attn_*'", &out), 0);
    free(out);
}
END_TEST

START_TEST(require_in_baseline_mode)
{
    /* the baseline is the golden itself (a zero error envelope); the candidate is an exact copy lacking kv */
    synth_spec s;
    synth_spec_init(&s);
    s.omit_probes = "kv";
    s.omit_role = 1;
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.baseline = verify_pair_path("golden.h5");
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(verify_pair_path("golden.h5"), verify_pair_path("cand.h5"), &o, &r), 0);
    ck_assert_msg(r->status == DSV4_VERIFY_PASS, "%s", r->error);
    ck_assert_int_eq(r->n_only_golden, 4);
    dsv4_verify_result_free(r);
    o.baseline = verify_pair_path("golden.h5");
    o.require = "kv";
    ck_assert_int_eq(dsv4_verify_run(verify_pair_path("golden.h5"), verify_pair_path("cand.h5"), &o, &r), 0);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_str_eq(r->first.dataset, "layers/0/kv");
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(json_lists_what_the_candidate_lacks)
{
    synth_spec s;
    synth_spec_init(&s);
    int32_t cand[5] = {35, 36, 37, 38, 39};
    s.candidate_positions = cand;
    s.n_candidate_positions = 5;
    s.omit_probes = "router_weights";
    s.omit_role = 1;
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), &s, 0), 0);
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), &s, 1), 0);
    char *out = NULL, args[4400];
    snprintf(args, sizeof args, "--require 'layers/2/router_weights' --json %s", verify_pair_path("r.json"));
    ck_assert_int_eq(verify_pair_cli(args, &out), 1);
    free(out);
    char *buf = dsv4_test_read_file(verify_pair_path("r.json"), NULL);
    ck_assert_ptr_nonnull(buf);
    char *lacks = strstr(buf, "\"candidate_lacks\"");
    ck_assert_ptr_nonnull(lacks);
    ck_assert_msg(strstr(lacks, "\"layers/0/router_weights\""), "%s", lacks);
    ck_assert_msg(strstr(lacks, "\"required_missing\": [\n   \"layers/2/router_weights\"\n  ]"), "%s", lacks);
    ck_assert_msg(strstr(lacks, "\"positions\": [\n   0,"), "%s", lacks);
    ck_assert_msg(strstr(lacks, "   34\n  ]"), "%s", lacks);
    free(buf);
}
END_TEST

int main(void)
{
    g_dir = dsv4_test_mkdtemp("verify-partial");
    verify_pair_dir(g_dir);
    Suite *su = suite_create("verify_partial");
    TCase *tc = tcase_create("partial");
    tcase_add_test(tc, missing_datasets_are_listed_not_failed);
    tcase_add_test(tc, missing_positions_are_listed_not_failed);
    tcase_add_test(tc, topk_judged_by_golden_scores_without_candidate_scores);
    tcase_add_test(tc, require_makes_a_missing_probe_fail);
    tcase_add_test(tc, require_in_baseline_mode);
    tcase_add_test(tc, json_lists_what_the_candidate_lacks);
    suite_add_tcase(su, tc);
    int rc = dsv4_test_main(su);
    dsv4_test_rmtree(g_dir);
    return rc;
}
