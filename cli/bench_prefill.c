/* bench_prefill.c - `dsv4 bench --prefill N`: the prefill of one prompt on the optimized path (issue 35), on the
 * Flash-shaped random model of `dsv4 bench` (cli/bench_model.c), C = 1.
 *
 * What it measures and how:
 * - The prompt (random tokens) is fed in steps of --prefill-chunk tokens (dsv4_opt_step_ragged); the time is host
 *   wall time from the first step to the last one's synchronisation; the caches start empty (a real prefill, not
 *   dsv4 bench's random state). One rep warms up (cuBLAS heuristics, first launches), then --reps timed reps
 *   (default 3): the median is reported.
 * - FLOPs: per position p the decode step's useful FLOPs at live p + 1 (bench_step_roofline), without the head, plus
 *   one head per step (the logits of the chunk's last token). The FLOP floor is FLOPs / the cuBLAS bf16 GEMM rate
 *   measured at the start of the same run (bench_measure_ceilings); "of the floor" = floor / measured time.
 * - The stages: --reps more reps with dsv4_opt_stage_timing on (a device event at every stage boundary of each
 *   step, so the stages tile the step; the step synchronises anyway). Per stage the median over those reps of its
 *   time summed over the prompt's steps, its useful FLOPs and fewest bytes (the library counts them per row:
 *   optimized/opt_bench.c), TFLOP/s and that rate as a share of the measured bf16 GEMM rate. The sum of the stages
 *   is compared with the untimed median: the events cost a few microseconds each, and the host gaps between
 *   steps (with --prefill-chunk < N) fall outside every stage.
 * - Then one decode step (C = 1) after the prompt: its time, for the record.
 * - The ablation of the prefill GEMMs: --experts decode runs the routed experts (bf16 or FP4) on the decode kernels
 *   instead of grouped GEMMs (options.prefill_experts); --linears kernel runs the FP8 linears (fp8 weights) on the
 *   FP8 linear kernel instead of cuBLAS over the dequantised matrix (options.prefill_linears); --expert-lanes N
 *   runs the grouped experts' GEMMs on N streams (options.expert_lanes, default 4; 1: one after another);
 *   --mhc-pre rows runs the cast-free mHC pre's projection on the decode kernel (4 tokens per block) instead of
 *   the tiled one (options.prefill_mhc).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_model.h"
#include "dsv4/dsv4.h"
#include "dsv4/dsv4_opt.h"
#include "dsv4/dsv4_serve.h"
#include "progress.h"

typedef struct prefill_args {
    int n, chunk, layers, reps, experts_decode, linears_kernel, mhc_rows, lanes; /* lanes 0: the default */
    int max_context; /* 0: the prompt's length + 1 */
    int batch;       /* prompts prefilled together (sequences), default 1 */
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
    a->layers = 4, a->reps = 3, a->seed = 1, a->batch = 1, a->weights = DSV4_OPT_WEIGHTS_BF16, a->variant = "all-on";
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(k, "--prefill")) rc = count_arg(k, v, 1, DSV4_OPT_MAX_CONTEXT - 1, &a->n);
        else if (!strcmp(k, "--prefill-chunk")) rc = count_arg(k, v, 1, DSV4_OPT_MAX_STEP_TOKENS, &a->chunk);
        else if (!strcmp(k, "--layers")) rc = count_arg(k, v, 1, DSV4_MAX_LAYERS, &a->layers);
        else if (!strcmp(k, "--reps")) rc = count_arg(k, v, 1, 100, &a->reps);
        else if (!strcmp(k, "--expert-lanes")) rc = count_arg(k, v, 1, DSV4_OPT_MAX_EXPERT_LANES, &a->lanes);
        else if (!strcmp(k, "--max-context")) rc = count_arg(k, v, 2, DSV4_OPT_MAX_CONTEXT, &a->max_context);
        else if (!strcmp(k, "--batch")) rc = count_arg(k, v, 1, 256, &a->batch);
        else if (!strcmp(k, "--seed")) {
            int s = 0;
            rc = count_arg(k, v, 0, 1000000000, &s);
            a->seed = (unsigned long long)s;
        } else if (!strcmp(k, "--weights")) {
            if (!v || (strcmp(v, "bf16") && strcmp(v, "fp8")))
                return dsv4_error(DSV4_ERR_USAGE, "--weights: want bf16 or fp8");
            a->weights = strcmp(v, "fp8") ? DSV4_OPT_WEIGHTS_BF16 : DSV4_OPT_WEIGHTS_FP8;
        } else if (!strcmp(k, "--experts")) {
            if (!v || (strcmp(v, "grouped") && strcmp(v, "decode")))
                return dsv4_error(DSV4_ERR_USAGE, "--experts: want grouped or decode");
            a->experts_decode = !strcmp(v, "decode");
        } else if (!strcmp(k, "--linears")) {
            if (!v || (strcmp(v, "gemm") && strcmp(v, "kernel")))
                return dsv4_error(DSV4_ERR_USAGE, "--linears: want gemm or kernel");
            a->linears_kernel = !strcmp(v, "kernel");
        } else if (!strcmp(k, "--mhc-pre")) {
            if (!v || (strcmp(v, "tiled") && strcmp(v, "rows")))
                return dsv4_error(DSV4_ERR_USAGE, "--mhc-pre: want tiled or rows");
            a->mhc_rows = !strcmp(v, "rows");
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
    if (!a->chunk) a->chunk = (long)a->n * a->batch < 8192 ? a->n * a->batch : 8192;
    if ((long)a->n * a->batch > 1L << 24)
        return dsv4_error(DSV4_ERR_USAGE, "--batch %d x --prefill %d: more than 2^24 prompt tokens", a->batch, a->n);
    if (a->max_context && a->max_context <= a->n)
        return dsv4_error(DSV4_ERR_USAGE, "--max-context %d: must exceed the prompt's %d tokens", a->max_context, a->n);
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

/* Feed the B prompts (prompt b at tok + b·n) from position 0 (every sequence reset first), `chunk` tokens a step
 * shared as `dsv4 run` shares them (dsv4_opt_plan_step: in sequence order, the earliest prompt first); the wall time
 * in ms, the number of steps and of head rows. run (B) and step_tok (chunk) are the caller's scratch. */
static int prefill_once(dsv4_opt *o, const int32_t *tok, int n, int B, int chunk, int32_t *want, int32_t *run,
                        int32_t *step_tok, double *ms, int *steps, int *heads)
{
    for (int b = 0; b < B; b++) DSV4_TRY(dsv4_opt_reset(o, b));
    const double t0 = cli_now_s();
    *steps = *heads = 0;
    for (;;) {
        for (int b = 0; b < B; b++) want[b] = n - dsv4_opt_position(o, b);
        const int T = dsv4_opt_plan_step(B, want, chunk, run);
        if (T == 0) break;
        for (int b = 0, t = 0; b < B; b++) {
            for (int i = 0; i < run[b]; i++) step_tok[t++] = tok[(size_t)b * n + (n - want[b]) + i];
            *heads += run[b] > 0; /* the head runs on each run's last row */
        }
        DSV4_TRY(dsv4_opt_step_ragged(o, step_tok, run, NULL, NULL, NULL));
        ++*steps;
    }
    *ms = 1e3 * (cli_now_s() - t0);
    return 0;
}

/* The median, as the serving stats compute it (dsv4_serve_dist_of: sorts v in place). */
static double median(double *v, int n)
{
    dsv4_serve_dist d;
    dsv4_serve_dist_of(v, n, &d);
    return d.median;
}

/* The stage table: per stage the median over the timed reps (st[rep][stage]), then the sum. */
static void print_stages(dsv4_opt_kernel_time st[][DSV4_OPT_MAX_STAGES], int reps, int ns, int steps,
                         double step_ms, double gemm_tf, double copy_gbs)
{
    double v[100], sum_ms = 0, sum_fl = 0;
    printf("\nprefill stages (device events at every stage boundary, summed over the prompt's %d step(s), median of "
           "%d timed reps; TFLOP/s against the bf16 GEMM rate %.0f TFLOP/s measured now, GB/s against the copy rate "
           "%.0f GB/s):\n",
           steps, reps, gemm_tf, copy_gbs);
    printf("| stage | ms | %% of step | GFLOP | GB | TFLOP/s | %% of GEMM rate | GB/s | %% of copy rate |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double tot[DSV4_OPT_MAX_STAGES];
    for (int i = 0; i < ns; i++) {
        for (int r = 0; r < reps; r++) v[r] = st[r][i].us / 1e3;
        tot[i] = median(v, reps);
        sum_ms += tot[i];
    }
    for (int i = 0; i < ns; i++) {
        const dsv4_opt_kernel_time *k = &st[0][i];
        const double ms = tot[i], tf = ms > 0 ? k->flops / (ms * 1e9) : 0, gbs = ms > 0 ? k->bytes / (ms * 1e6) : 0;
        sum_fl += k->flops;
        char tfs[32] = "-", tfp[32] = "-";
        if (k->flops > 0) {
            snprintf(tfs, sizeof tfs, "%.1f", tf);
            snprintf(tfp, sizeof tfp, "%.1f%%", 100 * tf / gemm_tf);
        }
        printf("| %s | %.2f | %.1f%% | %.1f | %.3f | %s | %s | %.0f | %.1f%% |\n", k->name, ms,
               sum_ms > 0 ? 100 * ms / sum_ms : 0.0, k->flops / 1e9, k->bytes / 1e9, tfs, tfp, gbs,
               100 * gbs / copy_gbs);
    }
    printf("| **sum** | %.2f | 100%% | %.1f | | %.1f | %.1f%% | | |\n", sum_ms, sum_fl / 1e9,
           sum_ms > 0 ? sum_fl / (sum_ms * 1e9) : 0.0, sum_ms > 0 ? 100 * sum_fl / (sum_ms * 1e9) / gemm_tf : 0.0);
    printf("prefill stages: sum %.1f ms against the untimed median %.1f ms (%+.1f%%: the events and, between "
           "steps, the host)\n",
           sum_ms, step_ms, step_ms > 0 ? 100 * (sum_ms - step_ms) / step_ms : 0.0);
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
    const int max_ctx = a.max_context ? a.max_context : a.n + 1;
    dsv4_config cfg;
    if (bench_flash_config(a.layers, max_ctx, &cfg)) {
        fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
        return 2;
    }
    dsv4_opt_options oo;
    dsv4_opt_options_default(&oo);
    oo.n_seq = a.batch, oo.max_context = max_ctx, oo.max_step_tokens = a.chunk, oo.print_plan = 1;
    oo.weights = a.weights;
    oo.prefill_experts = a.experts_decode ? DSV4_OPT_PREFILL_EXPERTS_DECODE : DSV4_OPT_PREFILL_EXPERTS_GROUPED;
    oo.prefill_linears = a.linears_kernel ? DSV4_OPT_PREFILL_LINEARS_KERNEL : DSV4_OPT_PREFILL_LINEARS_GEMM;
    if (a.lanes) oo.expert_lanes = a.lanes;
    oo.prefill_mhc = a.mhc_rows ? DSV4_OPT_PREFILL_MHC_ROWS : DSV4_OPT_PREFILL_MHC_TILED;
    const int all = !strcmp(a.variant, "all-naive");
    if (all || !strcmp(a.variant, "attn-simt")) oo.attn = DSV4_OPT_ATTN_SIMT;
    if (all || !strcmp(a.variant, "indexer-fp32")) oo.indexer = DSV4_OPT_INDEXER_FP32;
    if (all || !strcmp(a.variant, "mhc-roundtrip")) oo.mhc = DSV4_OPT_MHC_ROUNDTRIP;
    if (all || !strcmp(a.variant, "index-max")) oo.index_context = DSV4_OPT_INDEX_MAX;
    dsv4_opt *o = NULL;
    const size_t n_all = (size_t)a.n * a.batch;
    const int B = a.batch;
    int32_t *tok = malloc(n_all * sizeof *tok), *step_tok = malloc((size_t)a.chunk * sizeof *step_tok);
    int32_t *want = malloc((size_t)B * sizeof *want), *run = malloc((size_t)B * sizeof *run);
    int32_t *one = malloc((size_t)B * sizeof *one), *next = malloc((size_t)B * sizeof *next);
    int rc = tok && step_tok && want && run && one && next ? 0 : dsv4_error(DSV4_ERR_NOMEM, "out of host memory");
    if (!rc) rc = dsv4_opt_init_random(&cfg, a.seed, &oo, &o);
    uint64_t h = a.seed * 0x9E3779B97F4A7C15ull + 7;
    for (size_t p = 0; !rc && p < n_all; p++) { /* prompt b: tok[b·n ..] (prompt 0 is the B = 1 prompt) */
        h ^= h << 13, h ^= h >> 7, h ^= h << 17;
        tok[p] = (int32_t)(h % (uint64_t)cfg.vocab_size);
    }
    double wall[101], ms = 0, med = 0, dec_ms = 0;
    int n_steps = 0, n_heads = 0;
    for (int r = 0; !rc && r <= a.reps; r++) { /* rep 0 warms up */
        if ((rc = prefill_once(o, tok, a.n, B, a.chunk, want, run, step_tok, &ms, &n_steps, &n_heads))) break;
        fprintf(stderr, "dsv4 bench --prefill: rep %d: %.1f ms%s\n", r, ms, r == 0 ? " (warm-up)" : "");
        if (r > 0) wall[r - 1] = ms;
    }
    if (!rc) med = median(wall, a.reps);
    dsv4_opt_kernel_time(*st)[DSV4_OPT_MAX_STAGES] = calloc((size_t)a.reps, sizeof *st);
    int ns = 0, timed_steps = 0;
    if (!rc && !st) rc = dsv4_error(DSV4_ERR_NOMEM, "out of host memory");
    for (int r = 0; !rc && r < a.reps; r++) {
        if (!(rc = dsv4_opt_stage_timing(o, 1)) &&
            !(rc = prefill_once(o, tok, a.n, B, a.chunk, want, run, step_tok, &ms, &n_steps, &n_heads)))
            rc = dsv4_opt_stage_times(o, st[r], DSV4_OPT_MAX_STAGES, &ns, &timed_steps);
        if (!rc) rc = dsv4_opt_stage_timing(o, 0);
    }
    if (!rc) { /* one decode step after the prompts (the state of the last rep), every sequence a token */
        for (int b = 0; b < B; b++) one[b] = tok[(size_t)b * a.n];
        double t0 = cli_now_s();
        rc = dsv4_opt_step(o, one, NULL, NULL, NULL, next);
        dec_ms = 1e3 * (cli_now_s() - t0);
    }
    free(step_tok), free(want), free(run), free(one), free(next);
    if (rc) {
        fprintf(stderr, "dsv4 bench --prefill: %s\n", dsv4_last_error());
        dsv4_opt_free(o);
        free(tok);
        free(st);
        return 1;
    }
    /* the useful FLOPs: every position's step without its head (each of the B prompts), plus the head of each
     * run's last row */
    double flops = 0, bytes = 0, f0 = 0;
    const double head = 2.0 * cfg.vocab_size * cfg.hidden_size;
    for (int p = 0; p < a.n; p++) {
        bench_step_roofline(&cfg, 1, p + 1, a.weights == DSV4_OPT_WEIGHTS_FP8, 0, &bytes, &f0);
        flops += B * (f0 - head);
    }
    flops += head * n_heads;
    const double floor_ms = flops / (gemm_tf * 1e12) * 1e3;
    char experts[48];
    if (a.experts_decode) snprintf(experts, sizeof experts, "decode");
    else snprintf(experts, sizeof experts, "grouped on %d lane%s", oo.expert_lanes, oo.expert_lanes > 1 ? "s" : "");
    char what[64];
    if (B == 1) snprintf(what, sizeof what, "%d tokens", a.n);
    else snprintf(what, sizeof what, "%d prompts of %d tokens", B, a.n);
    printf("prefill: %s in %d step%s of up to %d, %d Flash-shaped layers, weights %s, experts %s, linears %s, "
           "mhc-pre %s, variant %s: %.1f ms (median of %d after a warm-up; %.1f ms per layer), %.0f tokens/s\n",
           what, n_steps, n_steps == 1 ? "" : "s", a.chunk, a.layers, a.weights == DSV4_OPT_WEIGHTS_FP8 ? "fp8" : "bf16", experts,
           a.linears_kernel ? "kernel" : "gemm", a.mhc_rows ? "rows" : "tiled", a.variant, med, a.reps,
           med / a.layers, (double)n_all / (med / 1e3));
    printf("prefill: %.2f TFLOP useful, %.1f TFLOP/s; FLOP floor %.1f ms at the cuBLAS bf16 GEMM rate %.0f TFLOP/s "
           "measured now: %.1f%% of the floor\n",
           flops / 1e12, flops / (med * 1e9), floor_ms, gemm_tf, 100.0 * floor_ms / med);
    double idx_ms[100];
    for (int r = 0; r < a.reps; r++) {
        idx_ms[r] = 0;
        for (int i = 0; i < ns; i++)
            if (!strcmp(st[r][i].name, "indexer_prep") || !strcmp(st[r][i].name, "indexer_scores"))
                idx_ms[r] += st[r][i].us / 1e3;
    }
    const double idx = median(idx_ms, a.reps);
    printf("prefill: indexer (key compressor, queries, scores, top-k) %.1f ms: %.1f%% of the step\n", idx,
           med > 0 ? 100.0 * idx / med : 0.0);
    print_stages(st, a.reps, ns, timed_steps, med, gemm_tf, copy_gbs);
    printf("prefill: one decode step after the prompt: %.2f ms (eager-or-graph as dsv4_opt_step runs it)\n", dec_ms);
    free(st);
    dsv4_opt_free(o);
    free(tok);
    return 0;
}
#endif
