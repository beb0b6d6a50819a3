/* test_ref_lazy.c - the CPU reference's lazy weights (issue 36, docs/reference.md): the checkpoint kept in its own
 * formats and each tensor dequantised to f32 when used give bitwise the results of the up-front dequantisation.
 *
 *   bitwise:   on every golden set (tiny: fp32 weights; tiny-fp8: FP8 linears and FP4 experts; topk512), plain and
 *              --emulate bf16, prefill of the prompt + the forced decode steps, every position dumped: the lazy
 *              run's dump (dsv4_ref_options.weights LAZY, the default) equals the up-front run's (UPFRONT: every
 *              weight from the loader's f32 cache at init, as before issue 36) in every dataset, bit for bit; and
 *              the prompt fed token by token (the decode step's path, one token per call) on tiny-fp8 as well.
 *              The comparison can fail: the plain and the emulated dumps of one set differ.
 *   once:      a routed expert is asked for once per call for all the tokens routed to it, and only if one is:
 *              on tiny-fp8 the expert loads of the prefill equal the distinct (layer, expert) pairs of its
 *              router_ids; each layer is loaded once per call.
 *   plan:      on tiny-fp8 the lazy plan holds less f32 weight than the up-front one (FP8/FP4 are 4-8x smaller on
 *              disk than as f32, and only one layer is held), and DSV4_HOST_MEM_LIMIT below the plan refuses the
 *              init with the plan's numbers.
 *
 * Optional: DSV4_REF_PRECHANGE_DIR=DIR compares the lazy dumps with dumps made by a dsv4 built before the lazy
 * scheme (`dsv4 run --model golden/SET --tokens-from golden/SET/forced.h5 --dump-positions all --emulate E
 * --dump DIR/SET-E.h5`, E = none or bf16; with --decode-from 0: DIR/SET-E-tbt.h5), where those exist. OpenBLAS picks
 * its kernels by CPU, so such dumps compare bitwise only on the machine that made them: not part of CI.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../reference/ref_model.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_ref.h"
#include "dsv4_test.h"

static char *tmpdir;

static const char *const sets[] = {"tiny", "tiny-fp8", "topk512"};

/* golden/SET's forced tokens through the CPU reference with options o: the prompt as one prefill (tbt: token by
 * token), then the decode steps, every position dumped to out. Returns the reference's expert loads of the prompt
 * (lazy) in *expert_loads and its layer loads in *layer_loads when not NULL. */
static void run_set(const char *set, const dsv4_ref_options *o, int tbt, const char *out, long *expert_loads,
                    long *layer_loads)
{
    int T;
    int32_t *tok = dsv4_test_golden_tokens(set, &T);
    char rel[64];
    snprintf(rel, sizeof rel, "golden/%s/forced.h5", set);
    dsv4_dump *g = NULL;
    ck_assert_msg(dsv4_dump_open(dsv4_test_source_path(rel), &g) == 0, "%s", dsv4_last_error());
    const int P = dsv4_dump_prompt_len(g);
    dsv4_dump_free(g);
    dsv4_model *m = dsv4_test_open_golden(set);
    const dsv4_config *cfg = dsv4_model_config(m);
    dsv4_ref *r = NULL;
    ck_assert_msg(dsv4_ref_cpu_init_opts(m, T, o, &r) == 0, "%s: init: %s", set, dsv4_last_error());
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    for (int p = 0; p < T; p++) pos[p] = p;
    char digest[65];
    ck_assert_int_eq(dsv4_model_weights_digest(m, digest), 0);
    dsv4_dump_meta meta = {.producer = dsv4_ref_producer(r), .config_json = dsv4_model_config_json(m),
                           .weights_digest = digest, .prompt_len = P, .n_decode = T - P, .mode = "forced"};
    dsv4_dump_writer *w = NULL;
    dsv4_probe_sink *sink = NULL;
    ck_assert_int_eq(dsv4_dump_writer_open(out, &meta, cfg, tok, T, pos, T, &w), 0);
    ck_assert_int_eq(dsv4_probe_sink_init(w, cfg, pos, T, T, &sink), 0);
    const dsv4_ref_cpu *c = r->impl;
    int p = 0;
    if (!tbt) {
        ck_assert_msg(dsv4_ref_prefill(r, tok, P, sink, NULL) == 0, "%s", dsv4_last_error());
        p = P;
        if (expert_loads) *expert_loads = c->ws.expert_loads;
        if (layer_loads) *layer_loads = c->ws.layer_loads;
    }
    for (; p < T; p++) ck_assert_msg(dsv4_ref_decode(r, tok[p], sink, NULL) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_dump_entries(r, sink), 0);
    dsv4_probe_sink_free(sink);
    ck_assert_msg(dsv4_dump_writer_commit(w) == 0, "%s", dsv4_last_error());
    dsv4_ref_free(r);
    dsv4_model_free(m);
    free(pos);
    free(tok);
}

static char *tmp_path(const char *fmt, const char *a, const char *b)
{
    char name[256];
    snprintf(name, sizeof name, fmt, a, b);
    size_t n = strlen(tmpdir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", tmpdir, name);
    return p;
}

/* Datasets of a and b (the same names, shapes) whose bytes differ. */
static int datasets_differing(const char *pa, const char *pb)
{
    dsv4_dump *a = NULL, *b = NULL;
    ck_assert_int_eq(dsv4_dump_open(pa, &a), 0);
    ck_assert_int_eq(dsv4_dump_open(pb, &b), 0);
    int differ = 0;
    for (int i = 0; i < dsv4_dump_dataset_count(a); i++) {
        const char *name = dsv4_dump_dataset_name(a, i);
        dsv4_dataset_info ia, ib;
        ck_assert_msg(dsv4_dump_info(a, name, &ia) == 0 && dsv4_dump_info(b, name, &ib) == 0, "%s", name);
        size_t n = 1;
        for (int k = 0; k < ia.ndim; k++) n *= (size_t)ia.shape[k];
        void *x = malloc(n * 4 + 4), *y = malloc(n * 4 + 4);
        ck_assert(dsv4_dump_read_rows(a, name, 0, ia.shape[0], x) == 0);
        ck_assert(dsv4_dump_read_rows(b, name, 0, ib.shape[0], y) == 0);
        differ += memcmp(x, y, n * 4) != 0;
        free(x);
        free(y);
    }
    dsv4_dump_free(a);
    dsv4_dump_free(b);
    return differ;
}

/* DSV4_REF_PRECHANGE_DIR/NAME against the lazy dump, when both exist. */
static void compare_prechange(const char *name, const char *lazy)
{
    const char *dir = getenv("DSV4_REF_PRECHANGE_DIR");
    if (!dir || !*dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (access(path, R_OK)) {
        printf("  %s: not there, not compared\n", path);
        return;
    }
    dsv4_test_assert_dumps_equal(path, lazy, path);
    printf("  %s: bitwise equal to the lazy run\n", path);
}

START_TEST(lazy_is_upfront_bitwise)
{
    dsv4_ref_options o;
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        char *dumps[2][2]; /* [emulate][lazy, upfront] */
        for (int emu = 0; emu < 2; emu++) {
            const char *en = emu ? "bf16" : "none";
            for (int up = 0; up < 2; up++) {
                dsv4_ref_options_default(&o);
                o.emulate = emu ? DSV4_REF_EMULATE_BF16 : DSV4_REF_EMULATE_NONE;
                o.weights = up ? DSV4_REF_WEIGHTS_UPFRONT : DSV4_REF_WEIGHTS_LAZY;
                dumps[emu][up] = tmp_path(up ? "%s-%s-upfront.h5" : "%s-%s-lazy.h5", sets[i], en);
                double t0 = dsv4_test_now_s();
                run_set(sets[i], &o, 0, dumps[emu][up], NULL, NULL);
                printf("%s emulate %s %s: %.2f s\n", sets[i], en, up ? "up-front" : "lazy", dsv4_test_now_s() - t0);
            }
            char what[128];
            snprintf(what, sizeof what, "%s emulate %s: lazy vs up-front", sets[i], en);
            dsv4_test_assert_dumps_equal(dumps[emu][1], dumps[emu][0], what);
            char name[64];
            snprintf(name, sizeof name, "%s-%s.h5", sets[i], en);
            compare_prechange(name, dumps[emu][0]);
        }
        /* the comparison sees a difference where there is one */
        int d = datasets_differing(dumps[0][0], dumps[1][0]);
        printf("%s: plain vs emulated: %d datasets differ\n", sets[i], d);
        ck_assert_msg(d > 10, "%s: the plain and emulated runs differ in only %d datasets", sets[i], d);
        for (int emu = 0; emu < 2; emu++)
            for (int up = 0; up < 2; up++) free(dumps[emu][up]);
    }
}
END_TEST

START_TEST(lazy_token_by_token_is_upfront_bitwise)
{
    dsv4_ref_options o;
    const char *set = "tiny-fp8";
    for (int emu = 0; emu < 2; emu++) {
        const char *en = emu ? "bf16" : "none";
        char *lazy = tmp_path("%s-%s-tbt-lazy.h5", set, en), *up = tmp_path("%s-%s-tbt-upfront.h5", set, en);
        dsv4_ref_options_default(&o);
        o.emulate = emu ? DSV4_REF_EMULATE_BF16 : DSV4_REF_EMULATE_NONE;
        run_set(set, &o, 1, lazy, NULL, NULL);
        o.weights = DSV4_REF_WEIGHTS_UPFRONT;
        run_set(set, &o, 1, up, NULL, NULL);
        char what[128];
        snprintf(what, sizeof what, "%s emulate %s, token by token: lazy vs up-front", set, en);
        dsv4_test_assert_dumps_equal(up, lazy, what);
        char name[64];
        snprintf(name, sizeof name, "%s-%s-tbt.h5", set, en);
        compare_prechange(name, lazy);
        free(lazy);
        free(up);
    }
    if (getenv("DSV4_REF_PRECHANGE_DIR")) { /* the other sets token by token, and tiny greedy, against old dumps */
        for (int i = 0; i < 3; i += 2)
            for (int emu = 0; emu < 2; emu++) {
                const char *en = emu ? "bf16" : "none";
                char *lazy = tmp_path("%s-%s-tbt-lazy.h5", sets[i], en), name[64];
                dsv4_ref_options_default(&o);
                o.emulate = emu ? DSV4_REF_EMULATE_BF16 : DSV4_REF_EMULATE_NONE;
                run_set(sets[i], &o, 1, lazy, NULL, NULL);
                snprintf(name, sizeof name, "%s-%s-tbt.h5", sets[i], en);
                compare_prechange(name, lazy);
                free(lazy);
            }
    }
}
END_TEST

START_TEST(an_expert_is_dequantised_once_per_call)
{
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    char *out = tmp_path("%s-%s-loads.h5", "tiny-fp8", "none");
    long loads = -1, layers = -1;
    run_set("tiny-fp8", &o, 0, out, &loads, &layers);
    /* the distinct (layer, expert) pairs of the prompt's router_ids */
    dsv4_dump *d = NULL;
    ck_assert_int_eq(dsv4_dump_open(out, &d), 0);
    const dsv4_config *cfg;
    ck_assert_int_eq(dsv4_dump_config(d, &cfg), 0);
    const int P = dsv4_dump_prompt_len(d), k = cfg->num_experts_per_tok, E = cfg->n_routed_experts;
    const int n_layers = cfg->num_hidden_layers; /* cfg is d's */
    long distinct = 0, pairs = 0;
    for (int L = 0; L < n_layers; L++) {
        char name[64];
        snprintf(name, sizeof name, "layers/%d/router_ids", L);
        int32_t *ids = malloc((size_t)P * k * sizeof *ids);
        ck_assert_int_eq(dsv4_dump_read_rows(d, name, 0, P, ids), 0);
        char *seen = calloc((size_t)E, 1);
        for (int i = 0; i < P * k; i++) {
            ck_assert(ids[i] >= 0 && ids[i] < E);
            distinct += !seen[ids[i]];
            seen[ids[i]] = 1;
        }
        pairs += (long)P * k;
        free(seen);
        free(ids);
    }
    dsv4_dump_free(d);
    printf("tiny-fp8 prefill of %d tokens: %ld routed pairs, %ld distinct (layer, expert), %ld expert loads, %ld "
           "layer loads\n", P, pairs, distinct, loads, layers);
    ck_assert_msg(distinct < pairs, "the test needs experts shared between tokens (%ld of %ld)", distinct, pairs);
    ck_assert_int_eq(loads, distinct);
    ck_assert_int_eq(layers, n_layers);
    free(out);
}
END_TEST

START_TEST(lazy_plan_is_smaller_and_checked)
{
    dsv4_model *m = dsv4_test_open_golden("tiny-fp8");
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    dsv4_ref_plan lazy, up;
    ck_assert_msg(dsv4_ref_cpu_plan(m, 64, 32, &o, &lazy) == 0, "%s", dsv4_last_error());
    o.weights = DSV4_REF_WEIGHTS_UPFRONT;
    ck_assert_msg(dsv4_ref_cpu_plan(m, 64, 32, &o, &up) == 0, "%s", dsv4_last_error());
    char a[512], b[512];
    printf("lazy:     %s\nup-front: %s\n", dsv4_ref_plan_describe(&lazy, 64, 32, a, sizeof a),
           dsv4_ref_plan_describe(&up, 64, 32, b, sizeof b));
    ck_assert_msg(lazy.weights > 0 && lazy.weights * 2 < up.weights, "lazy weights %.0f, up-front %.0f", lazy.weights,
                  up.weights);
    ck_assert(lazy.arena > 0 && lazy.expert > 0 && lazy.prefill > lazy.scratch);
    ck_assert_double_eq(lazy.state, up.state);
    /* a limit below the plan refuses the init, naming the numbers */
    char lim[32];
    snprintf(lim, sizeof lim, "%.0f", lazy.total - 1);
    setenv("DSV4_HOST_MEM_LIMIT", lim, 1);
    dsv4_ref *r = (dsv4_ref *)1;
    dsv4_ref_options_default(&o);
    ck_assert_int_eq(dsv4_ref_cpu_plan(m, 64, 32, &o, &lazy), DSV4_ERR_NOMEM);
    const char *e = dsv4_last_error();
    ck_assert_msg(strstr(e, "reference cpu (weights as f32 a layer at a time") && strstr(e, "one routed expert") &&
                  strstr(e, "prefill of 32 tokens") && strstr(e, "DSV4_HOST_MEM_LIMIT"), "%s", e);
    snprintf(lim, sizeof lim, "%.0f", lazy.total - lazy.prefill); /* without the prefill it fits */
    setenv("DSV4_HOST_MEM_LIMIT", lim, 1);
    ck_assert_msg(dsv4_ref_cpu_init_opts(m, 64, &o, &r) == 0, "%s", dsv4_last_error());
    dsv4_ref_free(r);
    snprintf(lim, sizeof lim, "%.0f", lazy.total - lazy.prefill - 1);
    setenv("DSV4_HOST_MEM_LIMIT", lim, 1);
    ck_assert_int_eq(dsv4_ref_cpu_init_opts(m, 64, &o, &r), DSV4_ERR_NOMEM);
    ck_assert_ptr_null(r);
    unsetenv("DSV4_HOST_MEM_LIMIT");
    dsv4_model_free(m);
}
END_TEST

int main(void)
{
    tmpdir = dsv4_test_mkdtemp("ref-lazy");
    Suite *s = suite_create("ref_lazy");
    TCase *tc = tcase_create("lazy");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, lazy_is_upfront_bitwise);
    tcase_add_test(tc, lazy_token_by_token_is_upfront_bitwise);
    tcase_add_test(tc, an_expert_is_dequantised_once_per_call);
    tcase_add_test(tc, lazy_plan_is_smaller_and_checked);
    suite_add_tcase(s, tc);
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(tmpdir);
    return rc;
}
