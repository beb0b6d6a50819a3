/* test_verify_after_tie.c - the after_tie rule (model-spec 13, docs/verify.md "After a tie"): once a top-k
 * comparison accepts a tied pick at (position p, layer L), every comparison after it in model order is gated
 * with the profile's after_tie tolerances. On synthetic pairs (fp32 profile: normal gate 1e-4, after_tie 1e-2):
 * noise of 1e-3 downstream of a tied swap passes and the report names the tie; the same noise without the tie
 * fails; noise above after_tie fails; noise before the tie in model order (earlier position, lower layer, or an
 * earlier probe of the tie's own layer) is gated normally and fails; a strict pick after the tie still fails;
 * a tie given by --tie-at counts like one seen, and one no comparison can have seen (a layer past the model or
 * without a top-k, a position past the tokens) is refused; a profile without after_tie changes nothing. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_verify.h"
#include "dsv4_test.h"
#include "synth_dump.h"

static char *g_dir;
static char g_golden[4200], g_cand[4200];

#define TIE_POS 30
#define TIE_LAYER 1 /* CSA; at position 30 it has 7 visible entries for k = 4 */

/* A pair: a tied swap at (TIE_POS, TIE_LAYER) when tie, and relative noise `noise` on every float probe of
 * layers >= noise_layer (and final/) at positions >= noise_position. */
static void write_pair(int tie, double noise, int noise_layer, int noise_position)
{
    synth_spec s;
    synth_spec_init(&s);
    if (tie) {
        s.tie_layer = TIE_LAYER;
        s.tie_position = TIE_POS;
        s.tie_count = 1;
    }
    s.noise = noise;
    s.noise_layer = noise_layer;
    s.noise_position = noise_position;
    ck_assert_int_eq(synth_write(g_golden, &s, 0), 0);
    ck_assert_int_eq(synth_write(g_cand, &s, 1), 0);
}

static dsv4_verify_result *verify(const dsv4_verify_options *o)
{
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(g_golden, g_cand, o, &r), 0);
    ck_assert_int_ne(r->status, DSV4_VERIFY_ERROR);
    return r;
}

static void assert_first(const dsv4_verify_result *r, int position, int layer, const char *dataset, double tol)
{
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_msg(r->first.position == position && r->first.layer == layer,
                  "first divergence at position %d layer %d (%s), want %d/%d", r->first.position, r->first.layer,
                  r->first.dataset, position, layer);
    if (dataset) ck_assert_str_eq(r->first.dataset, dataset);
    ck_assert_double_eq(r->first.tolerance, tol);
}

START_TEST(noise_after_a_tie_passes_and_is_reported)
{
    /* (30, layer 2) and everything later comes after the tie at (30, layer 1) */
    write_pair(1, 1e-3, 2, TIE_POS);
    dsv4_verify_result *r = verify(NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert(r->first_tie.found && !r->first_tie.given);
    ck_assert_int_eq(r->first_tie.position, TIE_POS);
    ck_assert_int_eq(r->first_tie.layer, TIE_LAYER);
    ck_assert_int_eq(r->first_tie.accepted, 1);
    ck_assert_str_eq(r->first_tie.dataset, "layers/1/topk_idx");
    ck_assert(r->profile_after_tie);
    ck_assert_int_gt(r->n_after_tie_saved, 10);
    ck_assert_int_ge(r->n_after_tie_checks, r->n_after_tie_saved);
    /* the rows of the tie's own layer before it, and the tie row itself, kept the normal gates */
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        for (int k = 0; k < p->n_rows; k++) {
            const dsv4_verify_row *row = &p->rows[k];
            int after = row->position > TIE_POS ||
                        (row->position == TIE_POS &&
                         (p->layer < 0 || p->layer > TIE_LAYER ||
                          (p->layer == TIE_LAYER && p->order > r->probes[r->first_tie.probe_index].order)));
            ck_assert_msg(row->after_tie == after, "%s row at %d entry %d: after_tie %d", p->dataset, row->position,
                          row->entry, row->after_tie);
            if (row->after_tie_saved) ck_assert(row->after_tie);
        }
    }
    const char *txt = synth_text_report(r);
    ck_assert_ptr_nonnull(txt);
    ck_assert_ptr_nonnull(strstr(txt, "first tie-accepted top-k difference: position 30, layer 1 (csa/"));
    ck_assert_ptr_nonnull(strstr(txt, "after_tie gates"));
    ck_assert_ptr_nonnull(strstr(txt, "passed only thanks to them"));
    ck_assert_ptr_nonnull(strstr(txt, "~"));
    free((void *)txt);
    /* JSON and HTML say it too */
    char json[4200], html[4200];
    snprintf(json, sizeof json, "%s/r.json", g_dir);
    snprintf(html, sizeof html, "%s/r.html", g_dir);
    ck_assert_int_eq(dsv4_verify_write_json(r, json), 0);
    ck_assert_int_eq(dsv4_verify_write_html(r, html), 0);
    json_error_t e;
    json_t *root = json_load_file(json, 0, &e);
    ck_assert_ptr_nonnull(root);
    json_t *t = json_object_get(root, "first_tie");
    ck_assert(json_is_object(t));
    ck_assert_int_eq(json_integer_value(json_object_get(t, "position")), TIE_POS);
    ck_assert_int_eq(json_integer_value(json_object_get(t, "layer")), TIE_LAYER);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(root, "after_tie"), "passed_only_after_tie")),
                     r->n_after_tie_saved);
    json_decref(root);
    FILE *f = fopen(html, "r");
    ck_assert_ptr_nonnull(f);
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "After a tie"));
    ck_assert_ptr_nonnull(strstr(buf, "position 30, layer 1"));
    dsv4_verify_result_free(r);
    /* noise from the next position on, in every layer, is after the tie too */
    write_pair(1, 1e-3, 0, TIE_POS + 1);
    r = verify(NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert_int_gt(r->n_after_tie_saved, 0);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(html_map_does_not_paint_a_pass_as_failing)
{
    /* The HTML's (position x layer) map colours a cell red, "> 1 fails", when a row's value/tolerance exceeds 1.
     * Noise of 1e-3 after the tie passes under the after_tie gate (1e-2) while it breaks the normal one (1e-4):
     * a PASS, so no cell of the map may be red; only the legend's swatch is. */
    write_pair(1, 1e-3, 2, TIE_POS);
    dsv4_verify_result *r = verify(NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert_int_gt(r->n_after_tie_saved, 0);
    char html[4200];
    snprintf(html, sizeof html, "%s/map.html", g_dir);
    ck_assert_int_eq(dsv4_verify_write_html(r, html), 0);
    dsv4_verify_result_free(r);
    char *buf = dsv4_test_read_file(html, NULL);
    const char *map = strstr(buf, "Worst gate ratio");
    ck_assert_ptr_nonnull(map);
    int red = 0;
    for (const char *q = map; (q = strstr(q, "fill=\"#d32f2f\"")); q++) red++;
    ck_assert_msg(red == 1, "%d red swatches in the map of a PASS (1 = the legend's)", red);
    free(buf);
}
END_TEST

START_TEST(same_noise_without_the_tie_fails)
{
    write_pair(0, 1e-3, 2, TIE_POS);
    dsv4_verify_result *r = verify(NULL);
    assert_first(r, TIE_POS, 2, NULL, 1e-4);
    ck_assert(!r->first_tie.found);
    ck_assert_int_eq(r->n_after_tie_checks, 0);
    ck_assert_int_eq(r->n_after_tie_saved, 0);
    char *txt = synth_text_report(r);
    ck_assert_ptr_nonnull(txt);
    ck_assert_ptr_null(strstr(txt, "tie-accepted top-k difference"));
    free(txt);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(noise_above_after_tie_fails)
{
    write_pair(1, 5e-2, 2, TIE_POS);
    dsv4_verify_result *r = verify(NULL);
    assert_first(r, TIE_POS, 2, NULL, 1e-2); /* judged against the after_tie gate, and broken */
    ck_assert_double_gt(r->first.value, 1e-2);
    ck_assert(r->first_tie.found);
    char *txt = synth_text_report(r);
    ck_assert_ptr_nonnull(txt);
    ck_assert_ptr_nonnull(strstr(txt, "first tie-accepted top-k difference: position 30, layer 1"));
    free(txt);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(noise_before_the_tie_is_gated_normally)
{
    /* an earlier position */
    write_pair(1, 1e-3, 0, 25);
    dsv4_verify_result *r = verify(NULL);
    assert_first(r, 25, 0, NULL, 1e-4);
    ck_assert(r->first_tie.found);
    ck_assert_int_eq(r->first_tie.position, TIE_POS);
    dsv4_verify_result_free(r);
    /* the tie's position, a lower layer */
    write_pair(1, 1e-3, 0, TIE_POS);
    r = verify(NULL);
    assert_first(r, TIE_POS, 0, NULL, 1e-4);
    dsv4_verify_result_free(r);
    /* the tie's own position and layer, a probe computed before topk_idx */
    write_pair(1, 1e-3, TIE_LAYER, TIE_POS);
    r = verify(NULL);
    assert_first(r, TIE_POS, TIE_LAYER, "layers/1/attn_hc_pre", 1e-4);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(strict_pick_after_a_tie_still_fails)
{
    synth_spec s;
    synth_spec_init(&s);
    s.tie_layer = TIE_LAYER;
    s.tie_position = TIE_POS;
    s.tie_count = 1;
    s.low_layer = 3;
    s.low_position = 35;
    s.low_count = 1;
    ck_assert_int_eq(synth_write(g_golden, &s, 0), 0);
    ck_assert_int_eq(synth_write(g_cand, &s, 1), 0);
    dsv4_verify_result *r = verify(NULL);
    assert_first(r, 35, 3, "layers/3/topk_idx", 0);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_STRICT);
    dsv4_verify_result_free(r);
}
END_TEST

/* A near tie at (position, layer) of both files: the golden's best non-pick gets the score kth - rel * max|score|
 * (in both files, so indexer_scores agree), and the candidate picks it instead of the golden's k-th pick. */
static void plant_near_tie(int position, int layer, double rel)
{
    char topk[64], scores[64];
    snprintf(topk, sizeof topk, "layers/%d/topk_idx", layer);
    snprintf(scores, sizeof scores, "layers/%d/indexer_scores", layer);
    dsv4_dump *d = NULL;
    dsv4_dataset_info ti, si;
    ck_assert_int_eq(dsv4_dump_open(g_golden, &d), 0);
    ck_assert_int_eq(dsv4_dump_info(d, topk, &ti), 0);
    ck_assert_int_eq(dsv4_dump_info(d, scores, &si), 0);
    const int k = (int)ti.shape[1], n = (int)si.shape[1];
    int32_t picks[64];
    float sc[256];
    ck_assert(k <= 64 && n <= 256);
    ck_assert_int_eq(dsv4_dump_read_rows(d, topk, position, 1, picks), 0);
    ck_assert_int_eq(dsv4_dump_read_rows(d, scores, position, 1, sc), 0);
    dsv4_dump_free(d);
    int kth = picks[0], other = -1;
    double scale = 0;
    for (int j = 0; j < k; j++)
        if (sc[picks[j]] < sc[kth]) kth = picks[j];
    for (int w = 0; w < n; w++) {
        int picked = 0;
        for (int j = 0; j < k; j++) picked |= picks[j] == w;
        if (isfinite(sc[w]) && fabs(sc[w]) > scale) scale = fabs(sc[w]);
        if (!picked && isfinite(sc[w]) && (other < 0 || sc[w] > sc[other])) other = w;
    }
    ck_assert_int_ge(other, 0);
    const double near = (double)sc[kth] - rel * scale;
    ck_assert_int_eq(synth_set_element(g_golden, scores, position, other, near), 0);
    ck_assert_int_eq(synth_set_element(g_cand, scores, position, other, near), 0);
    for (int j = 0; j < k; j++)
        if (picks[j] == kth) ck_assert_int_eq(synth_set_element(g_cand, topk, position, j, other), 0);
}

/* A pick 5e-3 of the row's scale below the k-th golden score: outside fp32's tie tolerance (1e-4), inside its
 * after_tie one (1e-2). After the tie it passes, and is counted among the checks that passed only thanks to the
 * after_tie gates (it was not: that count compared the metric under the looser tie tolerance with the normal
 * gate, which never changes for strict picks); without the tie it fails. */
START_TEST(near_tie_after_a_tie_passes_only_thanks_to_after_tie)
{
    write_pair(1, 0, 0, 0);
    plant_near_tie(35, 3, 5e-3);
    dsv4_verify_result *r = verify(NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert_int_eq(r->n_after_tie_saved, 1);
    int found = 0;
    for (int i = 0; i < r->n_probes; i++)
        for (int k = 0; k < r->probes[i].n_rows; k++) {
            const dsv4_verify_row *row = &r->probes[i].rows[k];
            if (!row->after_tie_saved) continue;
            found++;
            ck_assert_str_eq(r->probes[i].dataset, "layers/3/topk_idx");
            ck_assert_int_eq(row->position, 35);
            ck_assert_uint_eq(row->after_tie_saved, 1u << DSV4_METRIC_STRICT);
        }
    ck_assert_int_eq(found, 1);
    dsv4_verify_result_free(r);
    write_pair(0, 0, 0, 0);
    plant_near_tie(35, 3, 5e-3);
    r = verify(NULL);
    assert_first(r, 35, 3, "layers/3/topk_idx", 0);
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_STRICT);
    dsv4_verify_result_free(r);
}
END_TEST

/* The filters narrow what is compared, not which gates apply: the tie at (30, layer 1) still puts the noisy
 * rows after it under the after_tie gates when --layers, --positions or --probes leave that top-k row out. */
START_TEST(filters_keep_the_first_tie)
{
    write_pair(1, 1e-3, 2, TIE_POS);
    for (int f = 0; f < 3; f++) {
        dsv4_verify_options o;
        dsv4_verify_options_init(&o);
        if (f == 0) o.layer_lo = 2;
        if (f == 1) o.pos_lo = TIE_POS + 1;
        if (f == 2) o.probes = "attn_*";
        dsv4_verify_result *r = verify(&o);
        ck_assert_msg(r->status == DSV4_VERIFY_PASS, "filter %d: status %d, first at %d %s", f, r->status,
                      r->first.position, r->first.dataset);
        ck_assert(r->first_tie.found && !r->first_tie.given);
        ck_assert_int_eq(r->first_tie.position, TIE_POS);
        ck_assert_int_eq(r->first_tie.layer, TIE_LAYER);
        ck_assert_int_eq(r->first_tie.accepted, 1);
        ck_assert_int_gt(r->n_after_tie_saved, 0);
        dsv4_verify_result_free(r);
    }
    /* a --tie-at earlier than the one seen still counts first */
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.layer_lo = 2;
    o.tie_at_position = 20;
    o.tie_at_layer = 1;
    dsv4_verify_result *r = verify(&o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert(r->first_tie.found && r->first_tie.given);
    ck_assert_int_eq(r->first_tie.position, 20);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(tie_given_by_option)
{
    /* the files show no tie (e.g. the golden does not store that position); another comparison proved one */
    write_pair(0, 1e-3, 2, TIE_POS);
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.tie_at_position = TIE_POS;
    o.tie_at_layer = TIE_LAYER;
    dsv4_verify_result *r = verify(&o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    ck_assert(r->first_tie.found && r->first_tie.given);
    ck_assert_int_gt(r->n_after_tie_saved, 0);
    char *txt = synth_text_report(r);
    ck_assert_ptr_nonnull(txt);
    ck_assert_ptr_nonnull(strstr(txt, "given by --tie-at"));
    free(txt);
    dsv4_verify_result_free(r);
    /* through the command line, and a later given tie does not move an earlier one */
    char cmd[16000];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --tie-at %d:%d --quiet", dsv4_test_bin(), g_golden, g_cand,
             TIE_POS, TIE_LAYER);
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --tie-at %d:%d --quiet", dsv4_test_bin(), g_golden, g_cand,
             TIE_POS, 3);
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 1); /* (30, layer 2) is before a tie at (30, layer 3) */
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --tie-at 30 --quiet 2>/dev/null", dsv4_test_bin(), g_golden,
             g_cand);
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 2);
}
END_TEST

/* A --tie-at that no comparison can have seen (a layer past the model, a layer without a top-k, a position past
 * the tokens: a typo of the command line) loosened every later gate all the same, and the noise that needs
 * after_tie passed; it is refused, exit 2 naming the option and why. */
START_TEST(tie_given_out_of_range_is_refused)
{
    write_pair(0, 1e-3, 2, TIE_POS); /* passes only under after_tie from (30, 1) */
    static const char *const bad[][2] = {
        {"30:99", "the dumps have layers 0..3"},
        {"30:4", "the dumps have layers 0..3"},
        {"30:2", "layer 2 is hca"},
        {"30:0", "layer 0 is sliding"},
        {"40:1", "the golden has positions 0..39"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[16000], *out = NULL, want[64];
        snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --tie-at %s 2>&1", dsv4_test_bin(), g_golden, g_cand,
                 bad[i][0]);
        int st = dsv4_test_run(cmd, &out);
        snprintf(want, sizeof want, "--tie-at %s", bad[i][0]);
        ck_assert_msg(st == 2 && out && strstr(out, want) && strstr(out, bad[i][1]), "%s: exit %d, want 2 with '%s'"
                      " and '%s'\n%s", cmd, st, want, bad[i][1], out ? out : "");
        free(out);
    }
    char cmd[16000];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --tie-at 39:3 --quiet", dsv4_test_bin(), g_golden, g_cand);
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 1); /* in range and csa: taken (after the noise's start, so 1) */
}
END_TEST

START_TEST(profile_after_tie_section)
{
    /* no after_tie section: the normal gates throughout, and the report says so */
    write_pair(1, 1e-3, 2, TIE_POS);
    char prof[4200];
    snprintf(prof, sizeof prof, "%s/plain.json", g_dir);
    FILE *f = fopen(prof, "w");
    fputs("{\"profile\": \"plain\", \"probes\": {\"default\": {\"rel_l2\": 1e-4, \"why\": \"t\"},"
          " \"topk_idx\": {\"strict\": 0, \"tie_abs\": 1e-7, \"tie_rel\": 1e-4, \"why\": \"t\"},"
          " \"router_ids\": {\"mismatch\": 0, \"why\": \"t\"}}}",
          f);
    fclose(f);
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.profile = prof;
    dsv4_verify_result *r = verify(&o);
    assert_first(r, TIE_POS, 2, NULL, 1e-4);
    ck_assert(r->first_tie.found && !r->profile_after_tie);
    char *txt = synth_text_report(r);
    ck_assert_ptr_nonnull(txt);
    ck_assert_ptr_nonnull(strstr(txt, "no after_tie section"));
    free(txt);
    dsv4_verify_result_free(r);
    /* after_tie only loosens the normal gates of the same metrics: a tighter value, or a metric the probe is
     * not gated on, changes nothing; a missing default and an unknown metric are errors */
    f = fopen(prof, "w");
    fputs("{\"probes\": {\"default\": {\"rel_l2\": 1e-4}, \"logits\": {\"rel_l2\": 1e-4, \"kl\": 1e-6}},"
          " \"after_tie\": {\"default\": {\"rel_l2\": 1e-6, \"cosine\": 0.5, \"why\": \"t\"},"
          " \"logits\": {\"kl\": 1e-3}}}",
          f);
    fclose(f);
    dsv4_verify_profile *p;
    ck_assert_int_eq(dsv4_verify_profile_load(prof, &p), 0);
    ck_assert(dsv4_verify_profile_has_after_tie(p));
    dsv4_verify_gate gates[DSV4_VERIFY_MAX_GATES];
    int ng;
    double ta, tr;
    ck_assert_int_eq(dsv4_verify_profile_lookup(p, "layers/2/out", "out", gates, &ng, &ta, &tr), 0);
    dsv4_verify_profile_after_tie(p, "layers/2/out", "out", gates, ng, &ta, &tr);
    ck_assert_int_eq(ng, 1);
    ck_assert_double_eq(gates[0].tol, 1e-4);
    ck_assert_int_eq(dsv4_verify_profile_lookup(p, "final/logits", "logits", gates, &ng, &ta, &tr), 0);
    dsv4_verify_profile_after_tie(p, "final/logits", "logits", gates, ng, &ta, &tr);
    ck_assert_int_eq(ng, 2);
    ck_assert_double_eq(gates[0].tol, 1e-4); /* the logits entry replaces the after_tie default */
    ck_assert_double_eq(gates[1].tol, 1e-3);
    dsv4_verify_profile_free(p);
    f = fopen(prof, "w");
    fputs("{\"probes\": {\"default\": {\"rel_l2\": 1e-4}}, \"after_tie\": {\"out\": {\"rel_l2\": 1e-2}}}", f);
    fclose(f);
    ck_assert_int_ne(dsv4_verify_profile_load(prof, &p), 0);
    f = fopen(prof, "w");
    fputs("{\"probes\": {\"default\": {\"rel_l2\": 1e-4}}, \"after_tie\": {\"default\": {\"rel_l3\": 1e-2}}}", f);
    fclose(f);
    ck_assert_int_ne(dsv4_verify_profile_load(prof, &p), 0);
    f = fopen(prof, "w");
    fputs("{\"probes\": {\"default\": {\"rel_l2\": 1e-4}}, \"after_ties\": {}}", f);
    fclose(f);
    ck_assert_int_ne(dsv4_verify_profile_load(prof, &p), 0);
}
END_TEST

START_TEST(shipped_profiles_have_after_tie)
{
    const char *names[] = {"fp32", "bf16"};
    for (int n = 0; n < 2; n++) {
        char path[4200];
        snprintf(path, sizeof path, "%sverify/profiles/%s.json", dsv4_test_source_path(""), names[n]);
        json_error_t e;
        json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
        ck_assert_msg(root != NULL, "%s: %s", path, e.text);
        json_t *at = json_object_get(root, "after_tie");
        ck_assert_msg(json_is_object(at), "%s has no after_tie section", names[n]);
        const char *key;
        json_t *val;
        json_object_foreach(at, key, val)
        {
            ck_assert_msg(json_is_string(json_object_get(val, "why")), "%s after_tie.%s has no why", names[n], key);
        }
        ck_assert(json_object_get(at, "default"));
        json_decref(root);
        /* looser than the normal gates, and strict top-k stays 0 */
        dsv4_verify_profile *p;
        ck_assert_int_eq(dsv4_verify_profile_load(names[n], &p), 0);
        dsv4_verify_gate g[DSV4_VERIFY_MAX_GATES], a[DSV4_VERIFY_MAX_GATES];
        int ng;
        double ta, tr, ata, atr;
        ck_assert_int_eq(dsv4_verify_profile_lookup(p, "layers/3/compressed_kv", "compressed_kv", g, &ng, &ta, &tr), 0);
        memcpy(a, g, sizeof g);
        dsv4_verify_profile_after_tie(p, "layers/3/compressed_kv", "compressed_kv", a, ng, &ta, &tr);
        ck_assert_double_gt(a[0].tol, g[0].tol);
        ck_assert_int_eq(dsv4_verify_profile_lookup(p, "layers/3/topk_idx", "topk_idx", g, &ng, &ta, &tr), 0);
        memcpy(a, g, sizeof g);
        ata = ta;
        atr = tr;
        dsv4_verify_profile_after_tie(p, "layers/3/topk_idx", "topk_idx", a, ng, &ata, &atr);
        ck_assert_int_eq(a[0].metric, DSV4_METRIC_STRICT);
        ck_assert_double_eq(a[0].tol, 0);
        ck_assert_double_gt(atr, tr);
        dsv4_verify_profile_free(p);
    }
}
END_TEST

int main(void)
{
    g_dir = dsv4_test_mkdtemp("verify-after-tie");
    snprintf(g_golden, sizeof g_golden, "%s/golden.h5", g_dir);
    snprintf(g_cand, sizeof g_cand, "%s/cand.h5", g_dir);
    Suite *s = suite_create("verify_after_tie");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, noise_after_a_tie_passes_and_is_reported);
    tcase_add_test(tc, html_map_does_not_paint_a_pass_as_failing);
    tcase_add_test(tc, same_noise_without_the_tie_fails);
    tcase_add_test(tc, noise_above_after_tie_fails);
    tcase_add_test(tc, noise_before_the_tie_is_gated_normally);
    tcase_add_test(tc, strict_pick_after_a_tie_still_fails);
    tcase_add_test(tc, near_tie_after_a_tie_passes_only_thanks_to_after_tie);
    tcase_add_test(tc, filters_keep_the_first_tie);
    tcase_add_test(tc, tie_given_by_option);
    tcase_add_test(tc, tie_given_out_of_range_is_refused);
    tcase_add_test(tc, profile_after_tie_section);
    tcase_add_test(tc, shipped_profiles_have_after_tie);
    suite_add_tcase(s, tc);
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(g_dir);
    return rc;
}
