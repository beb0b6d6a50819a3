/* test_opt_long_state.c - the optimized path's decode at golden/topk512's length without its 2,304-step prompt:
 * each case puts a batch of 3 sequences at position 2,304 with random valid cache state (dsv4_opt_random_state:
 * 576 compressed entries of ratio 4, so the indexer scores 576-578 live entries and the top-k ranks 512 of them),
 * then decodes 8 forced steps of the golden tokens, dumping sequence 1. Checks, per variant:
 * - two runs from the same seed give bitwise identical dumps (every probe, topk_idx and router_ids included);
 * - every topk_idx row of every CSA layer is exactly the top 512 of that row's indexer_scores over the live
 *   entries, ranked on the host by the tie rule (higher score first, then lower entry id): the GPU top-k read the
 *   same fp32 scores, so the sets must agree entry for entry; a dead entry (--index-context max scores the whole
 *   pool) or a duplicate fails it.
 * Why this file: a whole golden/topk512 run is 2,312 steps, ~2 hours under racecheck (docs/robustness.md); these
 * cases run the same kernels at the same sizes in 16 steps each, so scripts/gpu-focus.sh san-long can put them
 * under both sanitizers. The values of a random state are not those of a prompt: the golden comparison of the
 * topk512 set is e2e_opt_gpu's. One Check case per variant (CK_RUN_CASE runs one).
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

enum { N_SEQ = 3, DUMP_SEQ = 1, START = 2304, STEPS = 8 }; /* START: a multiple of both ratios (4, 128) */

/* One run: a fresh optimized model with options o (n_gpus 2 emulated on one GPU when emulate_n2), the random
 * state at START from seed 5, STEPS forced steps of golden/topk512's tokens at START.., every probe of sequence
 * DUMP_SEQ into a dump at path. */
static void run_once(dsv4_model *m, const dsv4_opt_options *o, int emulate_n2, const char *path)
{
    const dsv4_config *cfg = dsv4_model_config(m);
    int T;
    int32_t *tok = dsv4_test_golden_tokens("topk512", &T);
    ck_assert_int_ge(T, START + STEPS);
    T = START + STEPS;
    if (emulate_n2) {
        setenv("DSV4_NCCL_EMULATE_ONE_GPU", "1", 1);
        setenv("DSV4_NCCL_REPLICA_CHECK", "1", 1); /* the ranks' streams agree bitwise at every step */
    }
    dsv4_opt *h = NULL;
    int rc = dsv4_opt_init(m, o, &h);
    unsetenv("DSV4_NCCL_EMULATE_ONE_GPU");
    unsetenv("DSV4_NCCL_REPLICA_CHECK");
    ck_assert_msg(rc == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_opt_random_state(h, START, 5) == 0, "%s", dsv4_last_error());
    char digest[65];
    ck_assert_msg(dsv4_model_weights_digest(m, digest) == 0, "%s", dsv4_last_error());
    int32_t pos[STEPS];
    for (int i = 0; i < STEPS; i++) pos[i] = START + i;
    dsv4_dump_meta meta = {.producer = dsv4_opt_producer(h), .config_json = dsv4_model_config_json(m),
                           .weights_digest = digest, .prompt_len = START, .n_decode = STEPS, .mode = "forced"};
    dsv4_dump_writer *w = NULL;
    dsv4_probe_sink *sink = NULL;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, cfg, tok, T, pos, STEPS, &w) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_probe_sink_init(w, cfg, pos, STEPS, T, &sink) == 0, "%s", dsv4_last_error());
    for (int p = START; p < T; p++) {
        int32_t in[N_SEQ], next[N_SEQ];
        for (int c = 0; c < N_SEQ; c++) in[c] = tok[p];
        ck_assert_msg(dsv4_opt_step(h, in, NULL, sink, NULL, next) == 0, "position %d: %s", p, dsv4_last_error());
        for (int c = 0; c < N_SEQ; c++) ck_assert_int_lt((unsigned)next[c], (unsigned)cfg->vocab_size);
    }
    ck_assert_int_eq(dsv4_opt_position(h, DUMP_SEQ), T);
    dsv4_probe_sink_free(sink);
    ck_assert_msg(dsv4_dump_writer_commit(w) == 0, "%s", dsv4_last_error());
    dsv4_opt_free(h);
    free(tok);
}

typedef struct ranked {
    float score;
    int32_t id;
} ranked;
static int by_tie_rule(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Every CSA layer's topk_idx rows of the dump against the host's top-k of its indexer_scores rows. */
static void check_topk_rows(const char *path, const char *what)
{
    dsv4_dump *d = NULL;
    ck_assert_msg(dsv4_dump_open(path, &d) == 0, "%s", dsv4_last_error());
    const dsv4_config *cfg = NULL;
    ck_assert_msg(dsv4_dump_config(d, &cfg) == 0, "%s", dsv4_last_error());
    const int k = cfg->index_topk;
    int n_layers_checked = 0;
    for (int L = 0; L < cfg->num_hidden_layers; L++) {
        char sname[64], tname[64];
        snprintf(sname, sizeof sname, "layers/%d/indexer_scores", L);
        snprintf(tname, sizeof tname, "layers/%d/topk_idx", L);
        if (!dsv4_dump_has(d, tname)) continue;
        dsv4_dataset_info si, ti;
        ck_assert_msg(dsv4_dump_info(d, sname, &si) == 0 && dsv4_dump_info(d, tname, &ti) == 0, "%s",
                      dsv4_last_error());
        ck_assert_int_eq(si.shape[0], STEPS);
        ck_assert_int_eq(ti.shape[1], k);
        const int N = (int)si.shape[1];
        float *scores = malloc((size_t)STEPS * N * sizeof *scores);
        int32_t *picked = malloc((size_t)STEPS * k * sizeof *picked);
        ranked *rank = malloc((size_t)N * sizeof *rank);
        int32_t *want = malloc((size_t)k * sizeof *want);
        ck_assert(dsv4_dump_read_rows(d, sname, 0, STEPS, scores) == 0);
        ck_assert(dsv4_dump_read_rows(d, tname, 0, STEPS, picked) == 0);
        for (int r = 0; r < STEPS; r++) {
            const int live = (START + r + 1) / 4; /* the CSA entries visible at this position */
            ck_assert_int_le(live, N);
            ck_assert_msg(live > k, "only %d live entries: the top-k would not rank", live);
            for (int e = 0; e < live; e++) {
                ck_assert_msg(isfinite(scores[(size_t)r * N + e]), "%s layer %d row %d entry %d: score %g", what,
                              L, r, e, scores[(size_t)r * N + e]);
                rank[e] = (ranked){scores[(size_t)r * N + e], e};
            }
            qsort(rank, (size_t)live, sizeof *rank, by_tie_rule);
            for (int j = 0; j < k; j++) want[j] = rank[j].id;
            int32_t *got = picked + (size_t)r * k;
            qsort(want, (size_t)k, sizeof *want, cmp_i32);
            qsort(got, (size_t)k, sizeof *got, cmp_i32);
            for (int j = 0; j < k; j++)
                ck_assert_msg(got[j] == want[j],
                              "%s layer %d position %d: sorted pick %d is entry %d, the host's top-%d has %d (%d live)",
                              what, L, START + r, j, got[j], k, want[j], live);
        }
        free(scores), free(picked), free(rank), free(want);
        n_layers_checked++;
    }
    ck_assert_msg(n_layers_checked == 2, "%s: %d CSA layers with topk_idx (golden/topk512 has 2)", what,
                  n_layers_checked);
    dsv4_dump_free(d);
}

static void run_variant(const char *what, void (*set)(dsv4_opt_options *), int emulate_n2)
{
    dsv4_model *m = dsv4_test_open_golden("topk512");
    dsv4_opt_options o;
    dsv4_opt_options_default(&o);
    o.n_seq = N_SEQ, o.dump_seq = DUMP_SEQ, o.max_context = 2560;
    if (set) set(&o);
    char *dir = dsv4_test_mkdtemp("long-state");
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/a.h5", dir);
    snprintf(b, sizeof b, "%s/b.h5", dir);
    const double t0 = dsv4_test_now_s();
    run_once(m, &o, emulate_n2, a);
    run_once(m, &o, emulate_n2, b);
    dsv4_test_assert_dumps_equal(a, b, what);
    check_topk_rows(a, what);
    printf("%s: two runs of %d steps from position %d bitwise equal, top-%d rows exact (%.1f s)\n", what, STEPS,
           START, dsv4_model_config(m)->index_topk, dsv4_test_now_s() - t0);
    dsv4_test_rmtree(dir);
    dsv4_model_free(m);
}

static void set_naive(dsv4_opt_options *o)
{
    o->attn = DSV4_OPT_ATTN_SIMT, o->indexer = DSV4_OPT_INDEXER_FP32, o->mhc = DSV4_OPT_MHC_ROUNDTRIP;
    o->index_context = DSV4_OPT_INDEX_MAX;
}
static void set_kv8(dsv4_opt_options *o) { o->kv = DSV4_OPT_KV_FP8; }
static void set_eager(dsv4_opt_options *o) { o->cuda_graph = 0; }
static void set_nccl(dsv4_opt_options *o) { o->n_gpus = 1; }
static void set_nccl_n2(dsv4_opt_options *o) { o->n_gpus = 2; }

START_TEST(test_state_defaults) { run_variant("defaults (graph)", NULL, 0); }
END_TEST
START_TEST(test_state_eager) { run_variant("defaults, eager", set_eager, 0); }
END_TEST
START_TEST(test_state_naive) { run_variant("all naive variants", set_naive, 0); }
END_TEST
START_TEST(test_state_kv8) { run_variant("--kv fp8", set_kv8, 0); }
END_TEST
START_TEST(test_state_nccl_n1) { run_variant("--gpus 1", set_nccl, 0); }
END_TEST
START_TEST(test_state_nccl_n2emu) { run_variant("--gpus 2 emulated on one GPU", set_nccl_n2, 1); }
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("opt_long_state");
    const TTest *const tests[] = {
        test_state_defaults,
        test_state_eager,
        test_state_naive,
        test_state_kv8,
        test_state_nccl_n1,
        test_state_nccl_n2emu,
    };
    dsv4_test_add_each(s, 600, tests, (int)(sizeof tests / sizeof tests[0]));
    return dsv4_test_main(s);
}
