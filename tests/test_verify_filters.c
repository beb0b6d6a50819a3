/* test_verify_filters.c - --layers, --positions, --probes restrict what is compared (and can hide or reveal a
 * divergence), --tol and a profile FILE override gates, and the shipped profiles parse with a rationale for
 * every probe. */
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

/* noise 1e-3 on layers >= 2 from position 30 on */
static void write_pair(void)
{
    synth_spec s;
    synth_spec_init(&s);
    s.noise = 1e-3;
    s.noise_layer = 2;
    s.noise_position = 30;
    ck_assert_int_eq(synth_write(g_golden, &s, 0), 0);
    ck_assert_int_eq(synth_write(g_cand, &s, 1), 0);
}

static int cli(const char *args, char **out)
{
    char cmd[16000];
    snprintf(cmd, sizeof cmd, "'%s' verify --no-color '%s' '%s' %s", dsv4_test_bin(), g_golden, g_cand, args);
    return dsv4_test_run(cmd, out);
}

static dsv4_verify_result *run(dsv4_verify_options *o)
{
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(g_golden, g_cand, o, &r), 0);
    return r;
}

START_TEST(layers_filter)
{
    write_pair();
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.layer_lo = 0;
    o.layer_hi = 1;
    dsv4_verify_result *r = run(&o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS); /* the noise is on layers >= 2 */
    for (int i = 0; i < r->n_probes; i++) ck_assert(r->probes[i].layer >= 0 && r->probes[i].layer <= 1);
    dsv4_verify_result_free(r);
    o.layer_lo = 3;
    o.layer_hi = -1; /* 3- : layer 3 and final/ */
    r = run(&o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_int_eq(r->first.layer, 3);
    int final = 0;
    for (int i = 0; i < r->n_probes; i++) {
        ck_assert(r->probes[i].layer == 3 || r->probes[i].layer == -1);
        final |= r->probes[i].layer == -1;
    }
    ck_assert(final);
    dsv4_verify_result_free(r);
    char *out = NULL;
    ck_assert_int_eq(cli("--layers 0-1", &out), 0);
    free(out);
    ck_assert_int_eq(cli("--layers 2", &out), 1);
    ck_assert_ptr_nonnull(strstr(out, "first divergence: position 30, layer 2"));
    free(out);
}
END_TEST

START_TEST(positions_filter)
{
    write_pair();
    char *out = NULL;
    ck_assert_int_eq(cli("--positions 0-29", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "compared   30 positions (0..29)"));
    free(out);
    ck_assert_int_eq(cli("--positions 31-", &out), 1);
    ck_assert_ptr_nonnull(strstr(out, "first divergence: position 31, layer 2"));
    free(out);
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.pos_lo = 12;
    o.pos_hi = 27;
    dsv4_verify_result *r = run(&o);
    ck_assert_int_eq(r->n_positions, 16);
    /* per-entry rows are filtered by the position closing them: CSA entry w closes at 4w+3 */
    for (int i = 0; i < r->n_probes; i++)
        for (int k = 0; k < r->probes[i].n_rows; k++) {
            int p = r->probes[i].rows[k].position;
            ck_assert_msg(p >= 12 && p <= 27, "%s row at position %d", r->probes[i].dataset, p);
        }
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(probes_filter)
{
    write_pair();
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.probes = "attn_out,final/*";
    dsv4_verify_result *r = run(&o);
    ck_assert_int_eq(r->n_compared, 4 + 3);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_str_eq(r->first.dataset, "layers/2/attn_out");
    dsv4_verify_result_free(r);
    o.probes = "layers/1/*";
    r = run(&o);
    ck_assert_int_eq(r->status, DSV4_VERIFY_PASS);
    for (int i = 0; i < r->n_probes; i++) ck_assert_int_eq(r->probes[i].layer, 1);
    dsv4_verify_result_free(r);
    /* topk_idx alone still reads the golden indexer_scores for the tie rule */
    o.probes = "topk_idx";
    r = run(&o);
    ck_assert_int_eq(r->n_compared, 2);
    ck_assert_str_eq(r->probes[0].note, "");
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(tol_override_and_profile_file)
{
    write_pair();
    char *out = NULL;
    /* loosen every probe's gate: rel_l2 10x above the noise; logits also gate argmax and kl */
    ck_assert_int_eq(cli("--tol default=rel_l2:1e-2 --probes attn_out,ffn_out", &out), 1); /* named probes keep 1e-4 */
    free(out);
    ck_assert_int_eq(cli("--tol attn_out=rel_l2:1e-2 --tol ffn_out=rel_l2:1e-2 --probes attn_out,ffn_out", &out), 0);
    free(out);
    /* one layer only: layers/2 loosened, layer 3 still fails */
    ck_assert_int_eq(cli("--tol layers/2/attn_out=rel_l2:1e-2 --probes attn_out", &out), 1);
    ck_assert_ptr_nonnull(strstr(out, "layer 3 (csa/moe), attn_out"));
    free(out);
    /* switch a gate off, switch another on */
    ck_assert_int_eq(cli("--tol attn_out=rel_l2:off --probes attn_out", &out), 0);
    free(out);
    ck_assert_int_eq(cli("--tol attn_out=rel_l2:off --tol attn_out=max_abs:1e-9 --probes attn_out", &out), 1);
    ck_assert_ptr_nonnull(strstr(out, "max_abs = "));
    free(out);
    ck_assert_int_eq(cli("--tol attn_out=bogus:1", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "unknown metric 'bogus'"));
    free(out);
    ck_assert_int_eq(cli("--tol attn_out", &out), 2);
    free(out);
    /* a profile file */
    char prof[4300];
    snprintf(prof, sizeof prof, "%s/loose.json", g_dir);
    FILE *f = fopen(prof, "w");
    fputs("{\"profile\": \"loose\", \"probes\": {\"default\": {\"rel_l2\": 0.1, \"why\": \"test\"},"
          " \"topk_idx\": {\"strict\": 0}, \"router_ids\": {\"mismatch\": 0}}}",
          f);
    fclose(f);
    char args[4400];
    snprintf(args, sizeof args, "--profile '%s'", prof);
    ck_assert_int_eq(cli(args, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "profile    loose"));
    free(out);
    f = fopen(prof, "w");
    fputs("{\"probes\": {\"default\": {\"rel_l3\": 0.1}}}", f);
    fclose(f);
    ck_assert_int_eq(cli(args, &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "unknown metric 'rel_l3'"));
    free(out);
    /* a misspelt entry key is an error too: topk_idx would fall back to the default's rel_l2, which top-k rows do
     * not have, and so be gated by nothing */
    f = fopen(prof, "w");
    fputs("{\"probes\": {\"default\": {\"rel_l2\": 0.1}, \"topk-idx\": {\"strict\": 0}}}", f);
    fclose(f);
    ck_assert_int_eq(cli(args, &out), 2);
    ck_assert_msg(strstr(out, "loose.json: probes.\"topk-idx\" is not a probe of dump-format.md"), "%s", out);
    free(out);
    f = fopen(prof, "w");
    fputs("{\"probes\": {\"default\": {\"rel_l2\": 0.1}, \"layers/x/attn_out\": {\"rel_l2\": 0.1}}}", f);
    fclose(f);
    ck_assert_int_eq(cli(args, &out), 2);
    ck_assert_msg(strstr(out, "probes.\"layers/x/attn_out\" is not a probe"), "%s", out);
    free(out);
    ck_assert_int_eq(cli("--tol atn_out=rel_l2:1e-2", &out), 2);
    ck_assert_msg(strstr(out, "'atn_out' is not a probe of dump-format.md"), "%s", out);
    free(out);
    ck_assert_int_eq(cli("--tol final/logits=kl:1e-3", &out), 1); /* a known dataset key is taken */
    free(out);
    ck_assert_int_eq(cli("--profile bf16", &out), 0); /* 1e-3 noise is within bf16 */
    free(out);
    ck_assert_int_eq(cli("--profile nosuch", &out), 2);
    free(out);
}
END_TEST

START_TEST(profile_gates_that_cannot_apply_are_an_error)
{
    /* One candidate router row picks an expert the golden did not: the shipped fp32 profile (router_ids
     * mismatch <= 0) fails it. A profile without a router_ids entry (the example of docs/verify.md: default,
     * topk_idx, logits) gates router_ids with the default's rel_l2, a metric a set of ids does not have: the
     * probe would be gated by nothing, and the wrong expert pass. That must be refused (status 2, naming the
     * probe), not reported as a PASS. */
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(g_golden, &s, 0), 0);
    ck_assert_int_eq(synth_write(g_cand, &s, 1), 0);
    dsv4_dump *d = NULL;
    ck_assert_int_eq(dsv4_dump_open(g_golden, &d), 0);
    int32_t ids[2];
    ck_assert_int_eq(dsv4_dump_read_rows(d, "layers/2/router_ids", 10, 1, ids), 0); /* every position stored */
    dsv4_dump_free(d);
    int other = 0;
    while (other == ids[0] || other == ids[1]) other++; /* 8 experts, 2 picked: one is free */
    ck_assert_int_eq(synth_set_element(g_cand, "layers/2/router_ids", 10, 0, other), 0);
    char *out = NULL;
    ck_assert_int_eq(cli("", &out), 1);
    ck_assert_msg(strstr(out, "layer 2 (hca/moe), router_ids"), "%s", out);
    free(out);
    char prof[4300], args[4400];
    snprintf(prof, sizeof prof, "%s/example.json", g_dir);
    snprintf(args, sizeof args, "--profile '%s'", prof);
    FILE *f = fopen(prof, "w");
    fputs("{\"profile\": \"fp32\", \"probes\": {\"default\": {\"rel_l2\": 1e-4, \"why\": \"...\"},"
          " \"topk_idx\": {\"strict\": 0, \"tie_abs\": 1e-7, \"tie_rel\": 1e-4, \"why\": \"...\"},"
          " \"logits\": {\"rel_l2\": 1e-4, \"argmax\": 0, \"kl\": 1e-6, \"tie_abs\": 1e-6, \"tie_rel\": 1e-4}}}",
          f);
    fclose(f);
    ck_assert_int_eq(cli(args, &out), 2);
    ck_assert_msg(strstr(out, "router_ids") && strstr(out, "rel_l2"), "%s", out);
    free(out);
    /* with a router_ids entry the same profile gates it */
    f = fopen(prof, "w");
    fputs("{\"profile\": \"fp32\", \"probes\": {\"default\": {\"rel_l2\": 1e-4, \"why\": \"...\"},"
          " \"topk_idx\": {\"strict\": 0, \"tie_abs\": 1e-7, \"tie_rel\": 1e-4, \"why\": \"...\"},"
          " \"router_ids\": {\"mismatch\": 0},"
          " \"logits\": {\"rel_l2\": 1e-4, \"argmax\": 0, \"kl\": 1e-6, \"tie_abs\": 1e-6, \"tie_rel\": 1e-4}}}",
          f);
    fclose(f);
    ck_assert_int_eq(cli(args, &out), 1);
    ck_assert_msg(strstr(out, "layer 2 (hca/moe), router_ids"), "%s", out);
    free(out);
    /* switching a probe's gates off on purpose is not that mistake: --tol router_ids=mismatch:off passes */
    ck_assert_int_eq(cli("--tol router_ids=mismatch:off", &out), 0);
    free(out);
}
END_TEST

START_TEST(a_profile_that_is_no_file_is_named_so)
{
    /* a folder read as an empty text: "DIR:1: '[' or '{' expected near end of file" */
    dsv4_verify_profile *p = NULL;
    ck_assert_int_eq(dsv4_verify_profile_load(g_dir, &p), DSV4_ERR_IO);
    ck_assert_ptr_null(p);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "is a directory, not a profile file"));
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), g_dir));
    /* a missing file was reported at line -1 */
    char path[4300];
    snprintf(path, sizeof path, "%s/no-such-profile.json", g_dir);
    ck_assert_int_eq(dsv4_verify_profile_load(path, &p), DSV4_ERR_IO);
    ck_assert_ptr_null(strstr(dsv4_last_error(), ":-1:"));
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "no-such-profile.json"));
    /* a text that is not JSON stays a format error with its line */
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\n  \"name\": oops\n}\n", f);
    fclose(f);
    ck_assert_int_eq(dsv4_verify_profile_load(path, &p), DSV4_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "no-such-profile.json:2:"));
    remove(path);
}
END_TEST

START_TEST(shipped_profiles_are_complete)
{
    const char *probes[] = {
        "default",       "attn_hc_pre", "attn_hc_post",   "attn_hc_comb", "attn_in",        "kv",
        "compressed_kv", "indexer_kv",  "indexer_scores", "topk_idx",     "attn_out",       "ffn_hc_pre",
        "ffn_hc_post",   "ffn_hc_comb", "ffn_in",         "router_ids",   "router_weights", "ffn_out",
        "out",           "hc_head",     "norm",           "logits"};
    const char *names[] = {"fp32", "bf16"};
    for (int n = 0; n < 2; n++) {
        char path[4200];
        snprintf(path, sizeof path, "%s", dsv4_test_source_path("verify/profiles/"));
        strncat(path, names[n], sizeof path - strlen(path) - 8);
        strcat(path, ".json");
        json_error_t e;
        json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
        ck_assert_msg(root != NULL, "%s: %s", path, e.text);
        json_t *pr = json_object_get(root, "probes");
        for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
            json_t *entry = json_object_get(pr, probes[i]);
            ck_assert_msg(entry != NULL, "%s has no entry for %s", names[n], probes[i]);
            ck_assert_msg(json_is_string(json_object_get(entry, "why")), "%s.%s has no why", names[n], probes[i]);
        }
        json_decref(root);
        dsv4_verify_profile *p;
        ck_assert_int_eq(dsv4_verify_profile_load(names[n], &p), 0);
        dsv4_verify_gate gates[DSV4_VERIFY_MAX_GATES];
        int ng;
        double ta, tr;
        ck_assert_int_eq(dsv4_verify_profile_lookup(p, "layers/5/attn_out", "attn_out", gates, &ng, &ta, &tr), 0);
        ck_assert_int_eq(ng, 1);
        ck_assert_int_eq(gates[0].metric, DSV4_METRIC_REL_L2);
        ck_assert(n == 0 ? gates[0].tol == 1e-4 : gates[0].tol > 1e-3);
        dsv4_verify_profile_free(p);
    }
}
END_TEST

int main(void)
{
    g_dir = dsv4_test_mkdtemp("verify-filters");
    snprintf(g_golden, sizeof g_golden, "%s/golden.h5", g_dir);
    snprintf(g_cand, sizeof g_cand, "%s/cand.h5", g_dir);
    Suite *s = suite_create("verify_filters");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, layers_filter);
    tcase_add_test(tc, positions_filter);
    tcase_add_test(tc, probes_filter);
    tcase_add_test(tc, tol_override_and_profile_file);
    tcase_add_test(tc, profile_gates_that_cannot_apply_are_an_error);
    tcase_add_test(tc, a_profile_that_is_no_file_is_named_so);
    tcase_add_test(tc, shipped_profiles_are_complete);
    suite_add_tcase(s, tc);
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(g_dir);
    return rc;
}
