/* test_verify_baseline.c - baseline mode (dsv4_verify_options.baseline, docs/verify.md "Baseline mode") on synthetic
 * dumps: a golden, a "baseline" with 1% relative noise everywhere, and candidates.
 * - A candidate with another 1% noise realisation passes; 3% noise on one layer fails at that layer (rms gate),
 *   though the fixed-style gates it replaces would not say where; a 0.5% scale on one layer, its RMS within the
 *   gate, fails at that layer (scale gate); an exact baseline still passes a candidate with fp32-level noise (the
 *   floor); a strict top-k pick fails whatever the baseline (selections keep their rules).
 * - The first divergence is layer-major: noise at layer 1 from a late position comes before a NaN at layer 2 at
 *   an early one.
 * - A baseline that cannot serve is refused with status 2 and a message naming it and the problem: unreadable, not a
 *   dsv4 dump, other weights, other tokens, a missing probe, missing positions.
 * - The reports carry the numbers: text (ratio table, the gates' sentence), JSON (per probe: both RMS, the ratio,
 *   the scale statistic; the baseline file and gates).
 * - indexer_scores rows are floored at the layer's typical score (dsv4_verify_scores_f32): a row of two near-zero
 *   scores off by 0.05 is no longer a relative error of ~1. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_verify.h"
#include "dsv4_test.h"
#include "synth_dump.h"

static char *g_dir;
static char g_golden[4200], g_base[4200], g_cand[4200], g_tmp[4200];

static void setup(void)
{
    g_dir = dsv4_test_mkdtemp("verify-baseline");
    snprintf(g_golden, sizeof g_golden, "%s/golden.h5", g_dir);
    snprintf(g_base, sizeof g_base, "%s/baseline.h5", g_dir);
    snprintf(g_cand, sizeof g_cand, "%s/candidate.h5", g_dir);
    snprintf(g_tmp, sizeof g_tmp, "%s/tmp.h5", g_dir);
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(g_golden, &s, 0), 0);
    ck_assert_int_eq(synth_copy_transformed(g_golden, g_base, SYNTH_ALL_LAYERS, 1e-2, 1.0, 11), 0);
}

static void teardown(void) { dsv4_test_rmtree(g_dir); }

/* the candidate: 1% noise everywhere (another seed than the baseline's), then `rel` more noise and a `scale` on
 * layer `layer` (-3: none) */
static void write_candidate(int layer, double rel, double scale)
{
    ck_assert_int_eq(synth_copy_transformed(g_golden, layer == -3 ? g_cand : g_tmp, SYNTH_ALL_LAYERS, 1e-2, 1.0, 23),
                     0);
    if (layer != -3) ck_assert_int_eq(synth_copy_transformed(g_tmp, g_cand, layer, rel, scale, 37), 0);
}

static dsv4_verify_result *verify_with(const char *baseline)
{
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.profile = "bf16";
    o.baseline = baseline;
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(g_golden, g_cand, &o, &r), 0);
    free(synth_text_report(r));
    return r;
}

START_TEST(test_faithful_passes)
{
    write_candidate(-3, 0, 1);
    dsv4_verify_result *r = verify_with(g_base);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert_int_eq(r->baseline, 1);
    ck_assert_int_gt(r->base_checks, 0);
    ck_assert_int_eq(r->base_failed, 0);
    /* every float probe got a statistic, near a ratio of 1 */
    int judged = 0;
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_base_stat *b = &r->probes[i].base;
        if (!b->n_rows) continue;
        judged++;
        ck_assert_msg(b->cand_rms > 0.5 * b->base_rms && b->cand_rms < 1.5 * b->base_rms, "%s: %g vs %g",
                      r->probes[i].dataset, b->cand_rms, b->base_rms);
    }
    ck_assert_int_gt(judged, 40);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(test_larger_error_fails_at_its_layer)
{
    write_candidate(2, 3e-2, 1.0);
    dsv4_verify_result *r = verify_with(g_base);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.layer, 2);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_REL_L2);
    const dsv4_verify_probe *p = &r->probes[r->first.probe_index];
    ck_assert(p->base.failed & 1u);
    ck_assert_double_gt(p->base.cand_rms, DSV4_VERIFY_BASE_RMS_FACTOR * p->base.base_rms);
    ck_assert_double_eq_tol(r->first.tolerance, p->base.rms_tol, 1e-12);
    ck_assert_ptr_nonnull(strstr(r->first.detail, "RMS over"));
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(test_bias_fails_at_its_layer)
{
    /* 0.5% too small on layer 1: its RMS error grows only to ~1.1x the baseline's, the bias is many se */
    write_candidate(1, 0, 0.995);
    dsv4_verify_result *r = verify_with(g_base);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.layer, 1);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_SCALE);
    const dsv4_verify_probe *p = &r->probes[r->first.probe_index];
    ck_assert_uint_eq(p->base.failed, 2u); /* the scale gate alone */
    ck_assert_double_eq_tol(p->base.cand_scale - p->base.base_scale, -0.005, 1.5e-3);
    ck_assert_ptr_nonnull(strstr(r->first.detail, "standard errors"));
    dsv4_verify_result_free(r);
    /* and the control: the same layer scaled by 1 passes */
    write_candidate(1, 0, 1.0);
    r = verify_with(g_base);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(test_exact_baseline_floor)
{
    /* a baseline equal to the golden: its error is 0, and a candidate with 1e-6 noise stays under the floor; 1e-3
     * does not */
    ck_assert_int_eq(synth_copy_transformed(g_golden, g_base, SYNTH_ALL_LAYERS, 0, 1.0, 5), 0);
    ck_assert_int_eq(synth_copy_transformed(g_golden, g_cand, SYNTH_ALL_LAYERS, 1e-6, 1.0, 7), 0);
    dsv4_verify_result *r = verify_with(g_base);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    dsv4_verify_result_free(r);
    ck_assert_int_eq(synth_copy_transformed(g_golden, g_cand, SYNTH_ALL_LAYERS, 1e-3, 1.0, 7), 0);
    r = verify_with(g_base);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.layer, 0);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(test_selections_keep_their_rules)
{
    /* a strict top-k swap (the lowest-scored entries picked) in the golden's own noise-free copy */
    synth_spec s;
    synth_spec_init(&s);
    s.low_layer = 1;
    s.low_position = 30;
    s.low_count = 1;
    ck_assert_int_eq(synth_write(g_cand, &s, 1), 0);
    dsv4_verify_result *r = verify_with(g_base);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_str_eq(r->first.dataset, "layers/1/topk_idx");
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_STRICT);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(test_first_divergence_is_layer_major)
{
    /* 3% noise on layer 1 (every position), a NaN at layer 2, position 3: position-major would name the NaN */
    write_candidate(1, 3e-2, 1.0);
    ck_assert_int_eq(synth_set_element(g_cand, "layers/2/attn_out", 3, 5, NAN), 0);
    dsv4_verify_result *r = verify_with(g_base);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.layer, 1);
    dsv4_verify_result_free(r);
    /* without the layer-1 noise, the NaN is the first divergence */
    write_candidate(-3, 0, 1);
    ck_assert_int_eq(synth_set_element(g_cand, "layers/2/attn_out", 3, 5, NAN), 0);
    r = verify_with(g_base);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.layer, 2);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_NONFINITE);
    dsv4_verify_result_free(r);
}
END_TEST

/* The comparison is refused (status 2) and the message names the baseline file and `what`. */
static void assert_refused(const char *baseline, const char *what)
{
    dsv4_verify_result *r = verify_with(baseline);
    ck_assert_int_eq(r->status, DSV4_VERIFY_ERROR);
    ck_assert_msg(strstr(r->error, "baseline") && strstr(r->error, baseline), "error names the baseline: %s",
                  r->error);
    ck_assert_msg(strstr(r->error, what) != NULL, "error says '%s': %s", what, r->error);
    dsv4_verify_result_free(r);
}

START_TEST(test_bad_baselines_refused)
{
    write_candidate(-3, 0, 1);
    char path[4300];
    synth_spec s;
    /* unreadable */
    snprintf(path, sizeof path, "%s/missing.h5", g_dir);
    assert_refused(path, "cannot open");
    /* not a dsv4 dump */
    snprintf(path, sizeof path, "%s/text.h5", g_dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("not a dump\n", f);
    fclose(f);
    assert_refused(path, "HDF5");
    /* other weights */
    snprintf(path, sizeof path, "%s/weights.h5", g_dir);
    synth_spec_init(&s);
    s.digest = "0000000000000000000000000000000000000000000000000000000000000001";
    ck_assert_int_eq(synth_write(path, &s, 1), 0);
    assert_refused(path, "different weights");
    /* other tokens after the prompt */
    snprintf(path, sizeof path, "%s/tokens.h5", g_dir);
    synth_spec_init(&s);
    s.token_diff_position = 30;
    ck_assert_int_eq(synth_write(path, &s, 1), 0);
    assert_refused(path, "tokens differ");
    /* a probe the golden and candidate both hold */
    snprintf(path, sizeof path, "%s/probe.h5", g_dir);
    synth_spec_init(&s);
    s.omit_dataset = "layers/2/ffn_out";
    s.omit_role = 1;
    ck_assert_int_eq(synth_write(path, &s, 1), 0);
    assert_refused(path, "lacks 1 probe");
    /* positions the candidate is compared at */
    snprintf(path, sizeof path, "%s/positions.h5", g_dir);
    synth_spec_init(&s);
    const int32_t some[] = {23, 24, 25, 26};
    s.positions = some;
    s.n_positions = 4;
    ck_assert_int_eq(synth_write(path, &s, 1), 0);
    assert_refused(path, "does not store position 0");
}
END_TEST

START_TEST(test_reports_carry_the_numbers)
{
    write_candidate(2, 3e-2, 1.0);
    dsv4_verify_result *r = verify_with(g_base);
    char *text = synth_text_report(r);
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_nonnull(strstr(text, "baseline   "));
    ck_assert_ptr_nonnull(strstr(text, "baseline mode:"));
    ck_assert_ptr_nonnull(strstr(text, "ratio"));
    ck_assert_ptr_null(strstr(text, "note: the bf16 profile")); /* that note is for runs without a baseline */
    free(text);
    char json_path[4300];
    snprintf(json_path, sizeof json_path, "%s/r.json", g_dir);
    ck_assert_int_eq(dsv4_verify_write_json(r, json_path), 0);
    json_error_t err;
    json_t *j = json_load_file(json_path, 0, &err);
    ck_assert_ptr_nonnull(j);
    json_t *b = json_object_get(j, "baseline");
    ck_assert_ptr_nonnull(b);
    ck_assert_str_eq(json_string_value(json_object_get(b, "path")), g_base);
    ck_assert_double_eq(json_real_value(json_object_get(json_object_get(b, "gates"), "rms_factor")),
                        DSV4_VERIFY_BASE_RMS_FACTOR);
    json_t *probes = json_object_get(j, "probes");
    int seen = 0;
    for (size_t i = 0; i < json_array_size(probes); i++) {
        json_t *p = json_array_get(probes, i), *pb = json_object_get(p, "baseline");
        if (strcmp(json_string_value(json_object_get(p, "dataset")), "layers/2/attn_out")) continue;
        seen = 1;
        ck_assert_ptr_nonnull(pb);
        double c = json_real_value(json_object_get(pb, "candidate_rms")),
               bb = json_real_value(json_object_get(pb, "baseline_rms"));
        ck_assert_double_eq_tol(json_real_value(json_object_get(pb, "ratio")), c / bb, 1e-9);
        ck_assert(json_is_false(json_object_get(pb, "pass")));
    }
    ck_assert(seen);
    json_decref(j);
    dsv4_verify_result_free(r);
    /* without a baseline, the bf16 profile says its numbers are fixed */
    r = verify_with(NULL);
    text = synth_text_report(r);
    ck_assert_ptr_nonnull(strstr(text, "note: the bf16 profile's tolerances are fixed numbers"));
    ck_assert_ptr_nonnull(strstr(text, "--baseline"));
    free(text);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(test_scores_floor)
{
    /* two entries whose head sums cancel to about 0: 0.05 off each is a relative error of ~10 against the row,
     * ~0.05 against a layer whose scores are ~1 */
    const float g[2] = {0.004f, -0.003f}, c[2] = {0.054f, 0.047f};
    dsv4_verify_row row;
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_scores_f32(g, c, 2, 0, &row);
    ck_assert_double_gt(row.v[DSV4_METRIC_REL_L2], 5);
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_scores_f32(g, c, 2, 1.0, &row);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_REL_L2], 0.05, 1e-6);
    /* a row of its own size is not floored */
    const float g2[2] = {3.0f, -4.0f}, c2[2] = {3.3f, -4.0f};
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_scores_f32(g2, c2, 2, 1.0, &row);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_REL_L2], 0.3 / 5.0, 1e-6);
    /* the scale metric: c = 1.01 g */
    const float g3[3] = {1, 2, 3}, c3[3] = {1.01f, 2.02f, 3.03f};
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_dense_f32(g3, c3, 3, &row);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_SCALE], 0.01, 1e-6);
    ck_assert_double_eq_tol(row.g_norm2, 14.0, 1e-9);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("verify_baseline");
    TCase *tc = tcase_create("baseline");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_faithful_passes);
    tcase_add_test(tc, test_larger_error_fails_at_its_layer);
    tcase_add_test(tc, test_bias_fails_at_its_layer);
    tcase_add_test(tc, test_exact_baseline_floor);
    tcase_add_test(tc, test_selections_keep_their_rules);
    tcase_add_test(tc, test_first_divergence_is_layer_major);
    tcase_add_test(tc, test_bad_baselines_refused);
    tcase_add_test(tc, test_reports_carry_the_numbers);
    tcase_add_test(tc, test_scores_floor);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
