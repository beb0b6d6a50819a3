/* test_verify_golden.c - the verifier on the committed golden sets (golden/, issue 3): every golden dump
 * compared with itself passes, and a copy with ONE layer perturbed (1e-3 relative noise on every float probe
 * of that layer, written through the dump reader and writer) is caught at exactly that layer, at the first
 * stored position, with no other layer failing. The golden sets are committed: a missing one fails, it is not
 * skipped. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_verify.h"
#include "dsv4_test.h"
#include "synth_dump.h"

static char *g_dir;
static const char *const g_sets[] = {"golden/tiny/forced.h5", "golden/tiny/greedy.h5", "golden/topk512/forced.h5",
                                     "golden/tiny-fp8/forced.h5"};
#define N_SETS ((int)(sizeof g_sets / sizeof g_sets[0]))

static int have(const char *rel)
{
    return access(dsv4_test_source_path(rel), R_OK) == 0;
}

START_TEST(golden_against_itself_passes)
{
    char path[4200];
    snprintf(path, sizeof path, "%s", dsv4_test_source_path(g_sets[_i]));
    ck_assert_msg(have(g_sets[_i]), "cannot read %s (the golden sets are committed)", path);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "'%s' verify --no-color '%s' '%s'", dsv4_test_bin(), path, path);
    char *out = NULL;
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == 0, "%s vs itself: exit %d\n%s", g_sets[_i], st, out);
    ck_assert_ptr_nonnull(strstr(out, "VERDICT: PASS"));
    free(out);
}
END_TEST

/* A prompt of 3 tokens makes no compressed entry: its dump holds [3, 0] indexer_scores (dump-format.md). Such a
 * dump compared with itself passes. */
START_TEST(dump_with_empty_probes_against_itself_passes)
{
    ck_assert_msg(have("golden/tiny/config.json"), "cannot read golden/tiny/config.json (committed)");
    char prompt[4300], dump[4300], cmd[13000];
    snprintf(prompt, sizeof prompt, "%s/three-tokens.txt", g_dir);
    snprintf(dump, sizeof dump, "%s/three-tokens.h5", g_dir);
    FILE *f = fopen(prompt, "w");
    ck_assert_ptr_nonnull(f);
    fputs("5 17 42\n", f);
    ck_assert_int_eq(fclose(f), 0);
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --path ref-cpu --prompt-tokens '%s' --decode 0 --dump '%s'",
             dsv4_test_bin(), dsv4_test_source_path("golden/tiny"), prompt, dump);
    ck_assert_msg(dsv4_test_run(cmd, &out) == 0, "%s\n%s", cmd, out);
    free(out);
    dsv4_dump *d = NULL;
    dsv4_dataset_info info;
    ck_assert_msg(dsv4_dump_open(dump, &d) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_dump_info(d, "layers/1/indexer_scores", &info) == 0, "%s", dsv4_last_error());
    ck_assert_msg(info.ndim == 2 && info.shape[0] == 3 && info.shape[1] == 0, "indexer_scores is not [3, 0]");
    dsv4_dump_free(d);
    snprintf(cmd, sizeof cmd, "'%s' verify --no-color '%s' '%s'", dsv4_test_bin(), dump, dump);
    const int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == 0 && strstr(out, "VERDICT: PASS"), "exit %d\n%s", st, out);
    free(out);
}
END_TEST

START_TEST(one_perturbed_layer_is_caught_there)
{
    ck_assert_msg(have(g_sets[_i]), "cannot read %s (the golden sets are committed)", g_sets[_i]);
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s", dsv4_test_source_path(g_sets[_i]));
    snprintf(dst, sizeof dst, "%s/perturbed-%d.h5", g_dir, _i);
    dsv4_verify_result *r0 = NULL;
    ck_assert_int_eq(dsv4_verify_run(src, src, NULL, &r0), 0);
    ck_assert_msg(r0->status == DSV4_VERIFY_PASS, "%s vs itself: status %d", g_sets[_i], r0->status);
    ck_assert_int_gt(r0->n_layers, 0); /* the loop below must perturb something */
    int n_layers = r0->n_layers, first_pos = r0->positions[0];
    dsv4_verify_result_free(r0);
    for (int k = 0; k < n_layers; k++) {
        ck_assert_int_eq(synth_copy_perturbed(src, dst, k, 1e-3, 42 + (uint64_t)k), 0);
        dsv4_verify_result *r = NULL;
        ck_assert_int_eq(dsv4_verify_run(src, dst, NULL, &r), 0);
        ck_assert_msg(r->status == DSV4_VERIFY_DIVERGED, "%s layer %d: status %d", g_sets[_i], k, r->status);
        ck_assert_int_eq(r->first.layer, k);
        /* the first stored position, or earlier for a per-entry row (entry w belongs to the position
         * closing it, stored or not: topk512 stores positions from 2295 on, its CSA entry 0 closes at 3) */
        if (r->first.entry < 0)
            ck_assert_int_eq(r->first.position, first_pos);
        else
            ck_assert_int_le(r->first.position, first_pos);
        for (int i = 0; i < r->n_probes; i++)
            if (r->probes[i].layer != k)
                ck_assert_msg(r->probes[i].n_failed_rows == 0, "%s perturbed at layer %d: %s fails", g_sets[_i], k,
                              r->probes[i].dataset);
        dsv4_verify_result_free(r);
    }
    if (_i == 0) { /* the report a person reads, for the tiny forced set perturbed at layer 3 */
        ck_assert_int_eq(synth_copy_perturbed(src, dst, 3, 1e-3, 45), 0);
        char cmd[9000];
        snprintf(cmd, sizeof cmd, "'%s' verify --no-color '%s' '%s'", dsv4_test_bin(), src, dst);
        char *out = NULL;
        ck_assert_int_eq(dsv4_test_run(cmd, &out), 1);
        printf("%s", out);
        ck_assert_ptr_nonnull(strstr(out, "first divergence: position 0, layer 3"));
        free(out);
    }
}
END_TEST

int main(void)
{
    g_dir = dsv4_test_mkdtemp("verify-golden");
    Suite *s = suite_create("verify_golden");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, golden_against_itself_passes, 0, N_SETS);
    tcase_add_loop_test(tc, one_perturbed_layer_is_caught_there, 0, N_SETS);
    tcase_add_test(tc, dump_with_empty_probes_against_itself_passes);
    suite_add_tcase(s, tc);
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(g_dir);
    return rc;
}
