/* test_verify_topk.c - tie-aware top-k agreement: picks swapped with exactly tied golden scores are accepted,
 * picks swapped for clearly lower scores are strict mismatches, counted and reported; plus the selection and
 * logits metrics on hand-made rows. */
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

START_TEST(tied_swaps_are_accepted)
{
    synth_spec s;
    synth_spec_init(&s);
    s.tie_layer = 3;
    s.tie_position = 35; /* 9 visible entries, k = 4 */
    s.tie_count = 2;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    const dsv4_verify_row *row = verify_pair_row(verify_pair_probe(r, "layers/3/topk_idx"), 35);
    ck_assert_double_eq(row->v[DSV4_METRIC_ACCEPTED], 2);
    ck_assert_double_eq(row->v[DSV4_METRIC_STRICT], 0);
    ck_assert_double_eq_tol(row->v[DSV4_METRIC_RECALL], 0.5, 1e-12);
    ck_assert_double_eq_tol(row->v[DSV4_METRIC_JACCARD], 2.0 / 6.0, 1e-12);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(lower_swaps_are_strict)
{
    synth_spec s;
    synth_spec_init(&s);
    s.low_layer = 3;
    s.low_position = 35;
    s.low_count = 2;
    dsv4_verify_result *r = verify_pair_run(&s, NULL);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    const dsv4_verify_probe *p = verify_pair_probe(r, "layers/3/topk_idx");
    const dsv4_verify_row *row = verify_pair_row(p, 35);
    ck_assert_double_eq(row->v[DSV4_METRIC_STRICT], 2);
    ck_assert_double_eq(row->v[DSV4_METRIC_ACCEPTED], 0);
    ck_assert_int_eq(p->n_failed_rows, 1);
    ck_assert_int_eq(r->first.position, 35);
    ck_assert_int_eq(r->first.layer, 3);
    ck_assert_str_eq(r->first.dataset, "layers/3/topk_idx");
    ck_assert_int_eq(r->first.metric, DSV4_METRIC_STRICT);
    ck_assert_ptr_nonnull(strstr(r->first.detail, "golden score"));
    dsv4_verify_result_free(r);
    /* the same swap judged without golden scores is strict too, and says why */
    s.omit_dataset = "layers/3/indexer_scores";
    s.omit_role = 0;
    r = verify_pair_run(&s, NULL);
    p = verify_pair_probe(r, "layers/3/topk_idx");
    ck_assert_double_eq(verify_pair_row(p, 35)->v[DSV4_METRIC_STRICT], 2);
    ck_assert_ptr_nonnull(strstr(p->note, "every pick outside the golden set is strict"));
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(tied_swaps_rejected_when_tolerance_is_negative_control)
{
    /* the tie rule must be what accepts the tied swap: make the tolerance reject even exact ties */
    synth_spec s;
    synth_spec_init(&s);
    s.tie_layer = 1;
    s.tie_position = 39;
    s.tie_count = 1;
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    const char *tol[] = {"topk_idx=tie_abs:-1e-3", "topk_idx=tie_rel:0"};
    o.tol = tol;
    o.n_tol = 2;
    dsv4_verify_result *r = verify_pair_run(&s, &o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_double_eq(verify_pair_row(verify_pair_probe(r, "layers/1/topk_idx"), 39)->v[DSV4_METRIC_STRICT], 1);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(topk_rows_by_hand)
{
    dsv4_verify_row row;
    /* golden picks {0,1,2}; scores 9, 8, 5 and entry 3 ties the k-th (5), entry 4 is far below (1) */
    const float sc[6] = {9, 8, 5, 5, 1, -INFINITY};
    const int32_t g[3] = {2, 0, 1};
    const int32_t same[3] = {0, 1, 2}, tie[3] = {3, 0, 1}, low[3] = {4, 0, 1}, dup[3] = {0, 0, 1}, invis[3] = {5, 0, 1};
    const int32_t shorter[3] = {0, 1, -1};
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_topk(g, same, 3, sc, 6, 0, 0, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_RECALL], 1);
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 0);
    dsv4_verify_topk(g, tie, 3, sc, 6, 0, 0, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_ACCEPTED], 1);
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 0);
    dsv4_verify_topk(g, low, 3, sc, 6, 0, 0, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 1);
    dsv4_verify_topk(g, low, 3, sc, 6, 4.0, 0, &row); /* within an absolute tolerance of 4: accepted */
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 0);
    dsv4_verify_topk(g, low, 3, sc, 6, 0, 4.0 / 9.0 - 1e-9, &row); /* relative to max|score| = 9: just short */
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 1);
    dsv4_verify_topk(g, dup, 3, sc, 6, 1e9, 0, &row); /* a repeated pick is never acceptable */
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 1);
    dsv4_verify_topk(g, invis, 3, sc, 6, 1e9, 0, &row); /* an invisible entry (-inf) is never acceptable */
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 1);
    dsv4_verify_topk(g, shorter, 3, sc, 6, 0, 0, &row); /* a dropped pick is strict */
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 1);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_RECALL], 2.0 / 3.0, 1e-12);
    dsv4_verify_topk(g, tie, 3, NULL, 0, 1e9, 1e9, &row); /* no scores: strict */
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 1);
}
END_TEST

START_TEST(topk_dropping_a_high_golden_pick_is_strict)
{
    /* A tie swaps an entry AT the k-th rank for one tied with it. A candidate that leaves out the golden's best
     * entry (score 9, the k-th is 5) and picks an entry tied with the k-th instead is not a tie: some golden pick
     * scoring far above every candidate pick is missing. Golden {0,1,2} of scores {9,8,5,5,1}; the candidate
     * {3,1,2} drops entry 0 (9) for entry 3 (5 = the k-th). By hand: one pick outside G, and the golden pick it
     * replaces lies 9 - 5 = 4 above the k-th, so it is strict unless the tie tolerance reaches 4. */
    dsv4_verify_row row;
    const float sc[6] = {9, 8, 5, 5, 1, -INFINITY};
    const int32_t g[3] = {0, 1, 2}, drop_top[3] = {3, 1, 2}, drop_kth[3] = {0, 1, 3};
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_topk(g, drop_top, 3, sc, 6, 0, 0, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 1);
    ck_assert_double_eq(row.v[DSV4_METRIC_ACCEPTED], 0);
    dsv4_verify_topk(g, drop_top, 3, sc, 6, 3.9, 0, &row); /* 9 > 5 + 3.9: still strict */
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 1);
    dsv4_verify_topk(g, drop_top, 3, sc, 6, 4.0, 0, &row); /* 9 <= 5 + 4 and 5 >= 5 - 4: a tie at that tolerance */
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 0);
    ck_assert_double_eq(row.v[DSV4_METRIC_ACCEPTED], 1);
    /* the control: the same pick in place of the k-th golden pick (entry 2, score 5) is the tie it should be */
    dsv4_verify_topk(g, drop_kth, 3, sc, 6, 0, 0, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_STRICT], 0);
    ck_assert_double_eq(row.v[DSV4_METRIC_ACCEPTED], 1);
}
END_TEST

START_TEST(topk_dropping_the_best_pick_is_reported)
{
    /* The golden has a tie at the k-th rank at (35, layer 3); the candidate keeps the golden's k-th pick and puts
     * the tied non-pick in place of the golden's BEST pick instead. That is no tie: strict, and the report names
     * the golden pick left out. */
    synth_spec s;
    synth_spec_init(&s);
    s.tie_layer = 3;
    s.tie_position = 35;
    s.tie_count = 1;
    const char *g = verify_pair_path("golden.h5"), *c = verify_pair_path("cand.h5");
    ck_assert_int_eq(synth_write(g, &s, 0), 0);
    ck_assert_int_eq(synth_write(c, &s, 0), 0); /* the golden's own selection, changed below */
    dsv4_dump *d = NULL;
    ck_assert_int_eq(dsv4_dump_open(g, &d), 0);
    dsv4_dataset_info si, ki;
    ck_assert_int_eq(dsv4_dump_info(d, "layers/3/indexer_scores", &si), 0);
    ck_assert_int_eq(dsv4_dump_info(d, "layers/3/topk_idx", &ki), 0);
    const int64_t n = si.shape[1], k = ki.shape[1];
    float *sc = malloc((size_t)n * sizeof *sc);
    int32_t *pick = malloc((size_t)k * sizeof *pick);
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/3/indexer_scores", 35, 1, sc), 0); /* every position stored */
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/3/topk_idx", 35, 1, pick), 0);
    dsv4_dump_free(d);
    /* by hand: the best and the lowest golden pick, and the best entry the golden did not pick */
    int64_t best = 0, low = 0, other = -1;
    for (int64_t i = 1; i < k; i++) {
        if (sc[pick[i]] > sc[pick[best]]) best = i;
        if (sc[pick[i]] < sc[pick[low]]) low = i;
    }
    for (int64_t w = 0; w < n; w++) {
        int picked = 0;
        for (int64_t i = 0; i < k; i++) picked |= pick[i] == w;
        if (!picked && isfinite(sc[w]) && (other < 0 || sc[w] > sc[other])) other = w;
    }
    ck_assert_int_ge(other, 0);
    ck_assert_float_eq(sc[other], sc[pick[low]]);    /* the tie synth_write made at the k-th rank */
    ck_assert_float_gt(sc[pick[best]], sc[pick[low]] + 0.01f); /* far above it: no tie */
    const int32_t best_id = pick[best];
    ck_assert_int_eq(synth_set_element(c, "layers/3/topk_idx", 35, best, (double)other), 0);
    free(sc);
    free(pick);
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(g, c, NULL, &r), 0);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    const dsv4_verify_row *row = verify_pair_row(verify_pair_probe(r, "layers/3/topk_idx"), 35);
    ck_assert_double_eq(row->v[DSV4_METRIC_STRICT], 1);
    ck_assert_double_eq(row->v[DSV4_METRIC_ACCEPTED], 0);
    ck_assert_int_eq(r->first_tie.found, 0);
    ck_assert_str_eq(r->first.dataset, "layers/3/topk_idx");
    ck_assert_int_eq(r->first.position, 35);
    char want[64];
    snprintf(want, sizeof want, "golden pick %d", (int)best_id);
    ck_assert_msg(strstr(r->first.detail, want), "detail '%s' does not name %s", r->first.detail, want);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(router_and_dense_by_hand)
{
    dsv4_verify_row row;
    const int32_t g[3] = {5, 1, 7}, perm[3] = {7, 5, 1}, one[3] = {7, 5, 2};
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_router_ids(g, perm, 3, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_MISMATCH], 0);
    dsv4_verify_router_ids(g, one, 3, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_MISMATCH], 1);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_JACCARD], 0.5, 1e-12);
    /* an expert picked twice is one mismatch more than a swap: bf16's gate (mismatch <= 1) must not take it */
    const int32_t twice[3] = {5, 5, 7};
    dsv4_verify_router_ids(g, twice, 3, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_MISMATCH], 2);
    /* an expert dropped (-1, or any negative id: a router always picks k) is not a near-tie swap either: the
     * candidate routes to 2 experts instead of 3. By hand: |G \ C| = 1, |C \ G| = 0, and one pick short counts 1
     * more, so 2, which bf16's gate (mismatch <= 1, "one swapped expert") refuses */
    const int32_t dropped[3] = {5, -1, 7};
    dsv4_verify_router_ids(g, dropped, 3, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_MISMATCH], 2);
    dsv4_verify_router_ids(dropped, g, 3, &row); /* and the other way round */
    ck_assert_double_eq(row.v[DSV4_METRIC_MISMATCH], 2);
    /* weights paired by id: the same weights in another order are equal */
    const float gw[3] = {0.5f, 0.3f, 0.2f}, cw[3] = {0.2f, 0.5f, 0.3f};
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_router_weights(gw, cw, g, perm, 3, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_MAX_ABS], 0);
    /* one expert swapped (g {5, 1, 7}, c {7, 5, 2}): the common 5 and 7 are compared as shares of their sum; the
     * candidate normalised over its own set, so its raw weights are scaled but their ratio is the golden one */
    const float cw_swap[3] = {0.25f, 0.625f, 0.125f}; /* 7: 0.25, 5: 0.625 -> shares 2/7, 5/7 as golden 0.2, 0.5 */
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_router_weights(gw, cw_swap, g, one, 3, &row);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_REL_L2], 0, 1e-7);
    const float cw_off[3] = {0.5f, 0.5f, 0.0f}; /* 7 and 5 equal: shares 1/2, 1/2 against 2/7, 5/7 */
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_router_weights(gw, cw_off, g, one, 3, &row);
    ck_assert_double_gt(row.v[DSV4_METRIC_REL_L2], 0.2);
    /* dense: g = (3, 4), c = (3, 4.5): ||d|| = 0.5, ||g|| = 5 */
    const float a[2] = {3, 4}, b[2] = {3, 4.5f};
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_dense_f32(a, b, 2, &row);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_REL_L2], 0.1, 1e-12);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_NMSE], 0.01, 1e-12);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_MAX_ABS], 0.5, 1e-12);
    ck_assert_int_eq(row.max_abs_at, 1);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_COSINE], (9 + 18.0) / (5 * sqrt(9 + 20.25)), 1e-12);
    /* matching -inf is agreement; NaN anywhere and a lone inf are not */
    const float gi[4] = {-INFINITY, 1, 2, NAN}, ci[4] = {-INFINITY, INFINITY, 2, NAN};
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_dense_f32(gi, ci, 4, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_NONFINITE], 2);
    ck_assert_int_eq(row.nonfinite_at, 1);
}
END_TEST

START_TEST(logits_by_hand)
{
    dsv4_verify_row row;
    /* KL of softmax([0, log 3]) = (1/4, 3/4) against softmax([0, 0]) = (1/2, 1/2) */
    const float g[2] = {0, (float)log(3.0)}, c[2] = {0, 0};
    dsv4_verify_row_clear(&row, 0, -1);
    dsv4_verify_logits(g, c, 2, 0, 0, &row);
    double want = 0.25 * log(0.25 / 0.5) + 0.75 * log(0.75 / 0.5);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_KL], want, 1e-7);
    ck_assert_int_eq(row.argmax_g, 1);
    ck_assert_int_eq(row.argmax_c, 0);
    ck_assert_double_eq(row.v[DSV4_METRIC_ARGMAX], 1); /* margin log 3 > 0 */
    dsv4_verify_logits(g, c, 2, 2.0, 0, &row);         /* within a tie tolerance of 2: accepted */
    ck_assert_double_eq(row.v[DSV4_METRIC_ARGMAX], 0);
    const double kl = row.v[DSV4_METRIC_KL];
    dsv4_verify_logits_argmax(g, 2, 0, 0, &row); /* the argmax alone, again under no tolerance */
    ck_assert_double_eq(row.v[DSV4_METRIC_ARGMAX], 1);
    ck_assert_double_eq(row.v[DSV4_METRIC_KL], kl);
    /* top-5 overlap: 6 logits, candidate swaps the 5th and 6th */
    const float g6[6] = {6, 5, 4, 3, 2, 1}, c6[6] = {6, 5, 4, 3, 1, 2};
    dsv4_verify_logits(g6, c6, 6, 0, 0, &row);
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_TOP5], 0.8, 1e-12);
    ck_assert_double_eq(row.v[DSV4_METRIC_ARGMAX], 0);
    /* fewer than 5 finite logits: the overlap is out of the picks there are */
    const float g3[6] = {3, 2, 1, -INFINITY, -INFINITY, -INFINITY}, c3[6] = {3, 2, -INFINITY, 1, -INFINITY, -INFINITY};
    dsv4_verify_logits(g3, g3, 6, 0, 0, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_TOP5], 1);
    dsv4_verify_logits(g3, c3, 6, 0, 0, &row); /* 2 of the 3 picks shared */
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_TOP5], 2.0 / 3.0, 1e-12);
    const float c1[6] = {3, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    dsv4_verify_logits(g3, c1, 6, 0, 0, &row); /* the candidate kept 1 finite logit of the golden's 3 */
    ck_assert_double_eq_tol(row.v[DSV4_METRIC_TOP5], 1.0 / 3.0, 1e-12);
    /* a large vocabulary in double: identical rows give KL 0 exactly */
    float *big = malloc(129280 * sizeof *big);
    for (int i = 0; i < 129280; i++) big[i] = (float)sin(i * 0.37) * 8;
    dsv4_verify_logits(big, big, 129280, 0, 0, &row);
    ck_assert_double_eq(row.v[DSV4_METRIC_KL], 0);
    free(big);
}
END_TEST

int main(void)
{
    g_dir = dsv4_test_mkdtemp("verify-topk");
    verify_pair_dir(g_dir);
    Suite *s = suite_create("verify_topk");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, tied_swaps_are_accepted);
    tcase_add_test(tc, lower_swaps_are_strict);
    tcase_add_test(tc, tied_swaps_rejected_when_tolerance_is_negative_control);
    tcase_add_test(tc, topk_rows_by_hand);
    tcase_add_test(tc, topk_dropping_a_high_golden_pick_is_strict);
    tcase_add_test(tc, topk_dropping_the_best_pick_is_reported);
    tcase_add_test(tc, router_and_dense_by_hand);
    tcase_add_test(tc, logits_by_hand);
    suite_add_tcase(s, tc);
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(g_dir);
    return rc;
}
