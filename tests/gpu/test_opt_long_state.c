/* test_opt_long_state.c - the optimized path's decode past 2,048 positions without the prompt that gets there:
 * each case puts a batch of 3 sequences at a position with random valid cache state (dsv4_opt_random_state, the
 * state `dsv4 bench` runs on), then decodes forced steps, dumping sequence 1. Two models:
 * - golden/topk512 at position 2,304 (576 compressed entries of ratio 4: the indexer scores 576-578 live entries
 *   and the top-k ranks 512 of them), 8 steps of its golden tokens;
 * - the Flash-width random model of e2e_opt_flash_gpu (tests/support/flash_model.h: D 4096, 64 heads x 512, 64
 *   indexer heads x 128, 32 experts), its weights drawn on the GPU (dsv4_opt_init_random), at position 2,560
 *   (640-641 live entries), 4 steps of random tokens: the launch shapes of the Flash model.
 * Checks, per variant:
 * - two runs from the same seed give bitwise identical dumps (every probe, topk_idx and router_ids included);
 * - every topk_idx row of every CSA layer is exactly the top 512 of that row's indexer_scores over the live
 *   entries, ranked on the host by the tie rule (higher score first, then lower entry id): the GPU top-k read the
 *   same fp32 scores, so the sets must agree entry for entry; a dead entry (--index-context max scores the whole
 *   pool) or a duplicate fails it.
 * Why this file: a whole golden/topk512 run is 2,312 steps, ~2 hours under racecheck, and e2e_opt_flash_gpu's
 * 2,600-token runs are as long (docs/robustness.md); these cases run the same kernels at the same sizes in a few
 * steps, so scripts/gpu-focus.sh san-long can put them under both sanitizers. The values of a random state are
 * not those of a prompt: the golden comparisons are e2e_opt_gpu's and e2e_opt_flash_gpu's. One Check case per
 * variant (CK_RUN_CASE runs one); DSV4_TEST_MAX_STEPS caps the steps (tests/support/dsv4_test.h).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_opt.h"
#include "dsv4_test.h"
#include "flash_model.h"

enum { N_SEQ = 3, DUMP_SEQ = 1, RATIO = 4, CSA_LAYERS = 2 }; /* both models: CSA ratio 4 on 2 of 4 layers */

/* Where the cases start and what they decode. start: a multiple of both ratios (4, 128) and of the window. */
typedef struct source {
    const char *name;
    dsv4_model *m;          /* golden/topk512, or NULL for the Flash-width random model: */
    dsv4_config cfg;        /* its config (the weights drawn from seed 3) */
    const char *config_json;
    char digest[65];        /* the weights' SHA-256, or a note that they are drawn (no files to digest) */
    int start, steps, max_context;
    int32_t *tok;           /* [start + steps]: the forced tokens (only start.. are stepped) */
} source;

static void source_open(source *src, int flash)
{
    memset(src, 0, sizeof *src);
    if (!flash) {
        src->name = "topk512";
        src->m = dsv4_test_open_golden("topk512");
        src->cfg = *dsv4_model_config(src->m);
        src->config_json = dsv4_model_config_json(src->m);
        ck_assert_msg(dsv4_model_weights_digest(src->m, src->digest) == 0, "%s", dsv4_last_error());
        src->start = 2304, src->steps = dsv4_test_steps(8), src->max_context = 2560;
        int T;
        src->tok = dsv4_test_golden_tokens("topk512", &T);
        ck_assert_int_ge(T, src->start + src->steps);
        return;
    }
    src->name = "flash";
    src->config_json = dsv4_flash_model_config();
    snprintf(src->digest, sizeof src->digest, "random weights, seed 3");
    ck_assert_msg(dsv4_config_parse(src->config_json, "flash_model.h", &src->cfg) == 0, "%s", dsv4_last_error());
    src->start = 2560, src->steps = dsv4_test_steps(4), src->max_context = 4096;
    const int T = src->start + src->steps;
    src->tok = malloc((size_t)T * sizeof *src->tok);
    uint32_t x = 2463534242u;
    for (int i = 0; i < T; i++) { /* xorshift32: tokens spread over the vocabulary */
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        src->tok[i] = (int32_t)(x % (uint32_t)src->cfg.vocab_size);
    }
}

static void source_close(source *src)
{
    dsv4_model_free(src->m);
    free(src->tok);
}

/* One run: a fresh optimized model with options o (n_gpus > 1 emulated on the one GPU), the random state at
 * src->start from seed 5, src->steps forced steps, every probe of sequence DUMP_SEQ into a dump at path. */
static void run_once(const source *src, const dsv4_opt_options *o, const char *path)
{
    const dsv4_config *cfg = &src->cfg;
    const int T = src->start + src->steps;
    if (o->n_gpus > 1) {
        setenv("DSV4_NCCL_EMULATE_ONE_GPU", "1", 1);
        setenv("DSV4_NCCL_REPLICA_CHECK", "1", 1); /* the ranks' streams agree bitwise at every step */
    }
    dsv4_opt *h = NULL;
    int rc = src->m ? dsv4_opt_init(src->m, o, &h) : dsv4_opt_init_random(cfg, 3, o, &h);
    unsetenv("DSV4_NCCL_EMULATE_ONE_GPU");
    unsetenv("DSV4_NCCL_REPLICA_CHECK");
    ck_assert_msg(rc == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_opt_random_state(h, src->start, 5) == 0, "%s", dsv4_last_error());
    int32_t pos[16];
    ck_assert_int_le(src->steps, 16);
    for (int i = 0; i < src->steps; i++) pos[i] = src->start + i;
    dsv4_dump_meta meta = {.producer = dsv4_opt_producer(h), .config_json = src->config_json,
                           .weights_digest = src->digest, .prompt_len = src->start, .n_decode = src->steps,
                           .mode = "forced"};
    dsv4_dump_writer *w = NULL;
    dsv4_probe_sink *sink = NULL;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, cfg, src->tok, T, pos, src->steps, &w) == 0, "%s",
                  dsv4_last_error());
    ck_assert_msg(dsv4_probe_sink_init(w, cfg, pos, src->steps, T, &sink) == 0, "%s", dsv4_last_error());
    for (int p = src->start; p < T; p++) {
        int32_t in[N_SEQ], next[N_SEQ];
        for (int c = 0; c < N_SEQ; c++) in[c] = src->tok[p];
        ck_assert_msg(dsv4_opt_step(h, in, NULL, sink, NULL, next) == 0, "position %d: %s", p, dsv4_last_error());
        for (int c = 0; c < N_SEQ; c++) ck_assert_int_lt((unsigned)next[c], (unsigned)cfg->vocab_size);
    }
    ck_assert_int_eq(dsv4_opt_position(h, DUMP_SEQ), T);
    dsv4_probe_sink_free(sink);
    ck_assert_msg(dsv4_dump_writer_commit(w) == 0, "%s", dsv4_last_error());
    dsv4_opt_free(h);
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
static void check_topk_rows(const char *path, const source *src, const char *what)
{
    const int steps = src->steps, start = src->start;
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
        ck_assert_int_eq(si.shape[0], steps);
        ck_assert_int_eq(ti.shape[1], k);
        const int N = (int)si.shape[1];
        float *scores = malloc((size_t)steps * N * sizeof *scores);
        int32_t *picked = malloc((size_t)steps * k * sizeof *picked);
        ranked *rank = malloc((size_t)N * sizeof *rank);
        int32_t *want = malloc((size_t)k * sizeof *want);
        ck_assert(dsv4_dump_read_rows(d, sname, 0, steps, scores) == 0);
        ck_assert(dsv4_dump_read_rows(d, tname, 0, steps, picked) == 0);
        for (int r = 0; r < steps; r++) {
            const int live = (start + r + 1) / RATIO; /* the CSA entries visible at this position */
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
                              what, L, start + r, j, got[j], k, want[j], live);
        }
        free(scores), free(picked), free(rank), free(want);
        n_layers_checked++;
    }
    ck_assert_msg(n_layers_checked == CSA_LAYERS, "%s: %d CSA layers with topk_idx (the model has %d)", what,
                  n_layers_checked, CSA_LAYERS);
    dsv4_dump_free(d);
}

static void run_variant(int flash, const char *what, void (*set)(dsv4_opt_options *))
{
    source src;
    source_open(&src, flash);
    dsv4_opt_options o;
    dsv4_opt_options_default(&o);
    o.n_seq = N_SEQ, o.dump_seq = DUMP_SEQ, o.max_context = src.max_context;
    if (set) set(&o);
    char *dir = dsv4_test_mkdtemp("long-state");
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/a.h5", dir);
    snprintf(b, sizeof b, "%s/b.h5", dir);
    const double t0 = dsv4_test_now_s();
    run_once(&src, &o, a);
    run_once(&src, &o, b);
    dsv4_test_assert_dumps_equal(a, b, what);
    check_topk_rows(a, &src, what);
    printf("%s %s: two runs of %d steps from position %d bitwise equal, top-%d rows exact (%.1f s)\n", src.name,
           what, src.steps, src.start, src.cfg.index_topk, dsv4_test_now_s() - t0);
    dsv4_test_rmtree(dir);
    source_close(&src);
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

START_TEST(test_state_defaults) { run_variant(0, "defaults (graph)", NULL); }
END_TEST
START_TEST(test_state_eager) { run_variant(0, "defaults, eager", set_eager); }
END_TEST
START_TEST(test_state_naive) { run_variant(0, "all naive variants", set_naive); }
END_TEST
START_TEST(test_state_kv8) { run_variant(0, "--kv fp8", set_kv8); }
END_TEST
START_TEST(test_state_nccl_n1) { run_variant(0, "--gpus 1", set_nccl); }
END_TEST
START_TEST(test_state_nccl_n2emu) { run_variant(0, "--gpus 2 emulated on one GPU", set_nccl_n2); }
END_TEST
START_TEST(test_state_flash_defaults) { run_variant(1, "defaults (graph)", NULL); }
END_TEST
START_TEST(test_state_flash_naive) { run_variant(1, "all naive variants", set_naive); }
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
        test_state_flash_defaults,
        test_state_flash_naive,
    };
    dsv4_test_add_each(s, 600, tests, (int)(sizeof tests / sizeof tests[0]));
    return dsv4_test_main(s);
}
