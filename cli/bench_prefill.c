/* bench_prefill.c - `dsv4 bench --prefill N`: the prefill of one prompt on the optimized path (issue 35), on the
 * Flash-shaped random model of `dsv4 bench` (cli/bench_model.c), C = 1.
 *
 * What it measures and how:
 * - The prompt (random tokens) is fed in steps of --prefill-chunk tokens (dsv4_opt_step_ragged); the time is host
 *   wall time from the first step to the last one's synchronisation; the caches start empty (a real prefill, not
 *   dsv4 bench's random state). Rep 0 warms up (cuBLAS heuristics, first launches); the best later rep is kept.
 * - FLOPs: per position p the decode step's useful FLOPs at live p + 1 (bench_step_roofline), without the head, plus
 *   one head per step (the logits of the chunk's last token). The FLOP floor is FLOPs / the cuBLAS bf16 GEMM rate
 *   measured at the start of the same run (bench_measure_ceilings); "of the floor" = floor / measured time.
 * - The indexer's share: one more rep with device events around every CSA layer's indexer (key compressor,
 *   queries, scores, top-k), dsv4_opt_indexer_timing; it synchronises per step, so it is a rep of its own.
 * - Then one decode step (C = 1) after the prompt: its time, for the record.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_model.h"
#include "dsv4/dsv4.h"
#include "dsv4/dsv4_opt.h"

#ifdef DSV4_HAVE_CUDA
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

typedef struct prefill_args {
    int n, chunk, layers, reps;
    unsigned long long seed;
    dsv4_opt_weights weights;
    const char *variant;
} prefill_args;

static int count_arg(const char *k, const char *v, long lo, long hi, int *out)
{
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > hi)
        return dsv4_error(DSV4_ERR_USAGE, "%s: '%s' is not a count in [%ld, %ld]", k, v ? v : "", lo, hi);
    *out = (int)x;
    return 0;
}

static int parse(int argc, char **argv, prefill_args *a)
{
    memset(a, 0, sizeof *a);
    a->layers = 4, a->reps = 2, a->seed = 1, a->weights = DSV4_OPT_WEIGHTS_BF16, a->variant = "all-on";
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(k, "--prefill")) rc = count_arg(k, v, 1, DSV4_OPT_MAX_CONTEXT - 1, &a->n);
        else if (!strcmp(k, "--prefill-chunk")) rc = count_arg(k, v, 1, DSV4_OPT_MAX_STEP_TOKENS, &a->chunk);
        else if (!strcmp(k, "--layers")) rc = count_arg(k, v, 1, DSV4_MAX_LAYERS, &a->layers);
        else if (!strcmp(k, "--reps")) rc = count_arg(k, v, 1, 100, &a->reps);
        else if (!strcmp(k, "--seed")) {
            int s = 0;
            rc = count_arg(k, v, 0, 1000000000, &s);
            a->seed = (unsigned long long)s;
        } else if (!strcmp(k, "--weights")) {
            if (!v || (strcmp(v, "bf16") && strcmp(v, "fp8")))
                return dsv4_error(DSV4_ERR_USAGE, "--weights: want bf16 or fp8");
            a->weights = strcmp(v, "fp8") ? DSV4_OPT_WEIGHTS_BF16 : DSV4_OPT_WEIGHTS_FP8;
        } else if (!strcmp(k, "--variant")) {
            static const char *const ok[] = {"all-on", "attn-simt", "indexer-fp32", "mhc-roundtrip", "index-max",
                                             "all-naive"};
            int found = 0;
            for (int j = 0; j < 6 && v; j++) found |= !strcmp(v, ok[j]);
            if (!found)
                return dsv4_error(DSV4_ERR_USAGE, "--variant: want all-on, attn-simt, indexer-fp32, mhc-roundtrip, "
                                  "index-max or all-naive");
            a->variant = v;
        } else
            return dsv4_error(DSV4_ERR_USAGE, "dsv4 bench --prefill: unknown option '%s' (see dsv4 bench --help)", k);
        if (rc) return rc;
        i++;
    }
    if (!a->chunk) a->chunk = a->n < 8192 ? a->n : 8192;
    return 0;
}

#ifndef DSV4_HAVE_CUDA
int bench_prefill(int argc, char **argv)
{
    prefill_args a;
    if (parse(argc, argv, &a)) {
        fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
        return 2;
    }
    fprintf(stderr, "dsv4 bench: this build has no CUDA (configure with a CUDA compiler)\n");
    return 2;
}
#else

/* Feed the prompt in chunks from position 0 (sequence 0 reset first); the wall time in ms. */
static int prefill_once(dsv4_opt *o, const int32_t *tok, int n, int chunk, double *ms)
{
    int32_t next = 0;
    DSV4_TRY(dsv4_opt_reset(o, 0));
    const double t0 = now_s();
    for (int p = 0; p < n; p += chunk) {
        int32_t k = n - p < chunk ? n - p : chunk;
        DSV4_TRY(dsv4_opt_step_ragged(o, tok + p, &k, NULL, NULL, &next));
    }
    *ms = 1e3 * (now_s() - t0);
    return 0;
}

int bench_prefill(int argc, char **argv)
{
    prefill_args a;
    if (parse(argc, argv, &a)) {
        fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
        return 2;
    }
    double copy_gbs = 0, gemm_tf = 0;
    if (bench_measure_ceilings(&copy_gbs, &gemm_tf)) {
        fprintf(stderr, "dsv4 bench: ceilings: %s\n", dsv4_last_error());
        return 2;
    }
    const int max_ctx = a.n + 1;
    dsv4_config cfg;
    if (bench_flash_config(a.layers, max_ctx, &cfg)) {
        fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
        return 2;
    }
    dsv4_opt_options oo;
    dsv4_opt_options_default(&oo);
    oo.n_seq = 1, oo.max_context = max_ctx, oo.max_step_tokens = a.chunk, oo.print_plan = 1;
    oo.weights = a.weights;
    const int all = !strcmp(a.variant, "all-naive");
    if (all || !strcmp(a.variant, "attn-simt")) oo.attn = DSV4_OPT_ATTN_SIMT;
    if (all || !strcmp(a.variant, "indexer-fp32")) oo.indexer = DSV4_OPT_INDEXER_FP32;
    if (all || !strcmp(a.variant, "mhc-roundtrip")) oo.mhc = DSV4_OPT_MHC_ROUNDTRIP;
    if (all || !strcmp(a.variant, "index-max")) oo.index_context = DSV4_OPT_INDEX_MAX;
    dsv4_opt *o = NULL;
    int32_t *tok = malloc((size_t)a.n * sizeof *tok);
    int rc = tok ? 0 : dsv4_error(DSV4_ERR_NOMEM, "out of host memory");
    if (!rc) rc = dsv4_opt_init_random(&cfg, a.seed, &oo, &o);
    uint64_t h = a.seed * 0x9E3779B97F4A7C15ull + 7;
    for (int p = 0; !rc && p < a.n; p++) {
        h ^= h << 13, h ^= h >> 7, h ^= h << 17;
        tok[p] = (int32_t)(h % (uint64_t)cfg.vocab_size);
    }
    double best = 0, ms = 0, idx_ms = 0, idx_total = 0, dec_ms = 0;
    for (int r = 0; !rc && r < a.reps; r++) {
        if ((rc = prefill_once(o, tok, a.n, a.chunk, &ms))) break;
        fprintf(stderr, "dsv4 bench --prefill: rep %d: %.1f ms%s\n", r, ms, r == 0 && a.reps > 1 ? " (warm-up)" : "");
        if ((r > 0 || a.reps == 1) && (best == 0 || ms < best)) best = ms;
    }
    if (!rc && !(rc = dsv4_opt_indexer_timing(o, 1)) && !(rc = prefill_once(o, tok, a.n, a.chunk, &idx_total))) {
        idx_ms = dsv4_opt_indexer_ms(o);
        rc = dsv4_opt_indexer_timing(o, 0);
    }
    if (!rc) { /* one decode step after the prompt (the state of the last rep) */
        int32_t one = tok[0], next = 0;
        double t0 = now_s();
        rc = dsv4_opt_step(o, &one, NULL, NULL, NULL, &next);
        dec_ms = 1e3 * (now_s() - t0);
    }
    if (rc) {
        fprintf(stderr, "dsv4 bench --prefill: %s\n", dsv4_last_error());
        dsv4_opt_free(o);
        free(tok);
        return 1;
    }
    /* the useful FLOPs: every position's step without its head, plus one head per step */
    double flops = 0, bytes = 0, f0 = 0;
    const double head = 2.0 * cfg.vocab_size * cfg.hidden_size;
    for (int p = 0; p < a.n; p++) {
        bench_step_roofline(&cfg, 1, p + 1, a.weights == DSV4_OPT_WEIGHTS_FP8, 0, &bytes, &f0);
        flops += f0 - head;
    }
    const int steps = (a.n + a.chunk - 1) / a.chunk;
    flops += head * steps;
    const double floor_ms = flops / (gemm_tf * 1e12) * 1e3;
    printf("prefill: %d tokens in steps of %d, %d Flash-shaped layers, weights %s, variant %s: %.1f ms "
           "(%.1f ms per layer), %.0f tokens/s\n",
           a.n, a.chunk, a.layers, a.weights == DSV4_OPT_WEIGHTS_FP8 ? "fp8" : "bf16", a.variant, best,
           best / a.layers, a.n / (best / 1e3));
    printf("prefill: %.2f TFLOP useful, %.1f TFLOP/s; FLOP floor %.1f ms at the cuBLAS bf16 GEMM rate %.0f TFLOP/s "
           "measured now: %.1f%% of the floor\n",
           flops / 1e12, flops / (best * 1e9), floor_ms, gemm_tf, 100.0 * floor_ms / best);
    printf("prefill: indexer (key compressor, queries, scores, top-k) %.1f ms of %.1f ms in the timed rep: %.1f%%\n",
           idx_ms, idx_total, idx_total > 0 ? 100.0 * idx_ms / idx_total : 0.0);
    printf("prefill: one decode step after the prompt: %.2f ms (eager-or-graph as dsv4_opt_step runs it)\n", dec_ms);
    dsv4_opt_free(o);
    free(tok);
    return 0;
}
#endif
