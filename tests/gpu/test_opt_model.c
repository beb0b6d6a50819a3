/* test_opt_model.c - the optimized path as a whole on golden/tiny and golden/topk512 (dsv4_opt.h):
 * - the decode step allocates nothing: dsv4_opt_device_alloc_count is unchanged over a whole run of a staggered
 *   batch (graph capture steps included), style rule 10;
 * - graph replay == eager launch, bitwise, on every step's logits and greedy picks (the buckets make both run the
 *   same launches);
 * - two `dsv4 run --path opt` of the same input give bitwise identical dumps (every dataset compared with the
 *   dump reader; the HDF5 files themselves may differ in timestamps), for the defaults and all naive variants;
 * - both constructors share one layout: dsv4_opt_init on a model and dsv4_opt_init_random on its config give the
 *   same three arena sizes, and a step of the random one runs (every view it reads is carved).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_opt.h"
#include "dsv4_test.h"

START_TEST(test_no_alloc_and_graph_equals_eager)
{
    int T;
    int32_t *tok = dsv4_test_golden_tokens("tiny", &T);
    T = dsv4_test_steps(T);
    dsv4_model *m = dsv4_test_open_golden("tiny");
    const int V = dsv4_model_config(m)->vocab_size;
    dsv4_opt_options o;
    dsv4_opt_options_default(&o);
    o.n_seq = 2;
    o.max_context = T;
    o.dump_seq = 1;
    dsv4_opt *g = NULL, *e = NULL;
    ck_assert_msg(dsv4_opt_init(m, &o, &g) == 0, "%s", dsv4_last_error());
    o.cuda_graph = 0;
    ck_assert_msg(dsv4_opt_init(m, &o, &e) == 0, "%s", dsv4_last_error());
    float *lg = malloc((size_t)V * 4), *le = malloc((size_t)V * 4);
    long before = dsv4_opt_device_alloc_count();
    for (int s = 0; s < T + 5; s++) {
        int32_t in[2] = {s < T ? tok[s] : 0, s >= 5 ? tok[s - 5] : 0};
        uint8_t act[2] = {s < T, s >= 5};
        int32_t ng[2], ne[2];
        ck_assert_msg(dsv4_opt_step(g, in, act, NULL, lg, ng) == 0, "%s", dsv4_last_error());
        ck_assert_msg(dsv4_opt_step(e, in, act, NULL, le, ne) == 0, "%s", dsv4_last_error());
        if (s >= 5) {
            ck_assert_msg(memcmp(lg, le, (size_t)V * 4) == 0, "step %d: graph and eager logits differ", s);
            ck_assert_int_eq(ng[1], ne[1]);
        }
    }
    ck_assert_int_eq(dsv4_opt_position(g, 0), T);
    ck_assert_int_eq(dsv4_opt_position(g, 1), T);
    ck_assert_msg(dsv4_opt_device_alloc_count() == before, "the decode steps made %ld device allocations",
                  dsv4_opt_device_alloc_count() - before);
    /* a position past max_context is refused with a message */
    int32_t in[2] = {0, 0};
    ck_assert_int_eq(dsv4_opt_step(g, in, NULL, NULL, NULL, NULL), DSV4_ERR_USAGE);
    ck_assert(strstr(dsv4_last_error(), "max_context") != NULL);
    /* reset restarts a sequence at 0 */
    ck_assert_int_eq(dsv4_opt_reset(g, 1), 0);
    ck_assert_int_eq(dsv4_opt_position(g, 1), 0);
    free(lg);
    free(le);
    dsv4_opt_free(g);
    dsv4_opt_free(e);
    dsv4_model_free(m);
    free(tok);
}
END_TEST


static void run_twice(const char *set, const char *args)
{
    char *dir = dsv4_test_mkdtemp("opt-det");
    char cmd[4096], opt_args[1024], dump[600], *out = NULL;
    snprintf(opt_args, sizeof opt_args, "--path opt %s", args);
    for (int r = 0; r < 2; r++) {
        snprintf(dump, sizeof dump, "%s/run%d.h5", dir, r);
        dsv4_test_run_command(cmd, sizeof cmd, set, opt_args, NULL, dump);
        int st = dsv4_test_run(cmd, &out);
        ck_assert_msg(st == 0, "%s\n%s", cmd, out ? out : "");
        free(out);
    }
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/run0.h5", dir);
    snprintf(b, sizeof b, "%s/run1.h5", dir);
    dsv4_test_assert_dumps_equal(a, b, "two runs of the same input");
    dsv4_test_rmtree(dir);
}

START_TEST(test_deterministic_default)
{
    /* topk512 is 2,312 full steps: under the sanitizers (DSV4_TEST_MAX_WORK or DSV4_TEST_MAX_STEPS set) only the
     * tiny runs fit the time box */
    if (dsv4_test_max_work() > 100000 && !dsv4_test_max_steps()) run_twice("topk512", "");
    run_twice("tiny", "--batch 3 --dump-seq 1");
}
END_TEST
START_TEST(test_deterministic_naive)
{
    run_twice("tiny", "--attn simt --indexer fp32 --mhc roundtrip --index-context max --graph off");
    run_twice("tiny", "--kv fp8");
}
END_TEST

/* One layout for both constructors (optimized/opt_layout.c): same weights, caches and scratch bytes for the same
 * config and options, for the defaults and the naive variants (whose workspaces differ). */
START_TEST(test_constructors_share_layout)
{
    static const char *const sets[] = {"tiny", "topk512"};
    for (int si = 0; si < 2; si++) {
        dsv4_model *m = dsv4_test_open_golden(sets[si]);
        const dsv4_config *cfg = dsv4_model_config(m);
        for (int naive = 0; naive < 2; naive++) {
            dsv4_opt_options o;
            dsv4_opt_options_default(&o);
            o.n_seq = 3;
            o.max_context = 64;
            if (naive) {
                o.attn = DSV4_OPT_ATTN_SIMT, o.indexer = DSV4_OPT_INDEXER_FP32, o.mhc = DSV4_OPT_MHC_ROUNDTRIP;
                o.index_context = DSV4_OPT_INDEX_MAX;
            }
            dsv4_opt *a = NULL, *b = NULL;
            ck_assert_msg(dsv4_opt_init(m, &o, &a) == 0, "%s", dsv4_last_error());
            ck_assert_msg(dsv4_opt_init_random(cfg, 7, &o, &b) == 0, "%s", dsv4_last_error());
            size_t wa, sa, xa, wb, sb, xb;
            dsv4_opt_memory(a, &wa, &sa, &xa);
            dsv4_opt_memory(b, &wb, &sb, &xb);
            ck_assert_msg(wa == wb && sa == sb && xa == xb,
                          "%s naive=%d: model arenas %zu/%zu/%zu B, random %zu/%zu/%zu B", sets[si], naive, wa, sa,
                          xa, wb, sb, xb);
            int32_t tok[3] = {1, 2, 3}, next[3];
            ck_assert_msg(dsv4_opt_random_state(b, 16, 11) == 0, "%s", dsv4_last_error());
            ck_assert_msg(dsv4_opt_step(b, tok, NULL, NULL, NULL, next) == 0, "%s", dsv4_last_error());
            for (int c = 0; c < 3; c++) ck_assert_int_lt((unsigned)next[c], (unsigned)cfg->vocab_size);
            dsv4_opt_free(a);
            dsv4_opt_free(b);
        }
        dsv4_model_free(m);
    }
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("opt_model");
    const TTest *const tests[] = {
        test_no_alloc_and_graph_equals_eager,
        test_deterministic_default,
        test_deterministic_naive,
        test_constructors_share_layout,
    };
    dsv4_test_add_each(s, 600, tests, (int)(sizeof tests / sizeof tests[0]));
    return dsv4_test_main(s);
}
