/* bench_args.c - the command line of `dsv4 bench` (cli/bench.c): usage, strict number parsing (digits only, in
 * range, checked before a K suffix scales them), and the --json writability check, in every build. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_args.h"
#include "commands.h"
#include "dsv4/dsv4.h"

const char *const bench_variant_names[BENCH_N_VARIANTS] = {"all-on", "attn", "indexer", "mhc", "index-context",
                                                           "all-naive"};

static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 bench [--layers N|auto] [--batch LIST] [--context LIST] [--max-context N]\n"
            "                  [--variants LIST] [--warmup N] [--reps N] [--kernel-reps N] [--scaling LIST|none]\n"
            "                  [--scaling-batch LIST] [--no-baseline] [--seed N] [--json OUT.json]\n"
            "                  [--weights bf16|fp8] [--quantize fp8] [--kv bf16|fp8] [--gpus N] [--nccl-time]\n\n"
            "Decode throughput of the optimized path on a DeepSeek-V4-Flash-shaped model (D 4096, 64 heads x 512,\n"
            "q rank 1024, 64 indexer heads x 128, 256 experts of 2048 top-6 + shared, vocab 129280, window 128,\n"
            "index_topk 512) with random weights generated on the GPU from --seed; layers follow the Flash schedule\n"
            "from layer 2 on (CSA with hash MoE, HCA, CSA, HCA, ...). The caches are allocated for --max-context\n"
            "positions per sequence and filled with random valid state up to the live context (no prefill).\n"
            "Serving runs (requests with prompts, TTFT/TPOT/ITL): dsv4 bench --serve --help.\n\n"
            "  --layers N|auto     decoder layers (auto, the default: as many as fit the GPU with the largest C)\n"
            "  --batch LIST        sequences decoded together, comma list (default 1,16,64)\n"
            "  --context LIST      live contexts, comma list (default 4096,32768); steps start at ctx-128\n"
            "  --max-context N     positions the caches hold per sequence (default 1048576)\n"
            "  --variants LIST     of all-on, attn, indexer, mhc, index-context, all-naive (default: all six)\n"
            "  --warmup N          untimed steps per context (default 3; the first captures the graph)\n"
            "  --reps N            timed steps per context (default 10); warmup + reps <= 128\n"
            "  --kernel-reps N     launches per kernel timing (default 7; 0: no kernel timing)\n"
            "  --scaling LIST      live contexts of the indexer + top-k scaling (default 1024,2048,...,262144)\n"
            "  --scaling-batch L   the C values the scaling runs at (default: every --batch value)\n"
            "  --no-baseline       skip the run with max context = live context (the index-context target)\n"
            "  --seed N            weights and state seed (default 7)\n"
            "  --weights bf16|fp8  how the weights are held (default bf16): fp8 = the checkpoint's formats, FP8\n"
            "                      e4m3 linears with 128x128 block scales and FP4 e2m1 experts, drawn as codes on\n"
            "                      the GPU (no bf16 copy); --quantize fp8 means the same for the random model\n"
            "                      (auto: bf16; --quantize none changes nothing; --quantize fp8 with\n"
            "                      --weights bf16 is refused)\n"
            "  --kv bf16|fp8       the caches' form (default bf16): fp8 = e4m3 nope channels with ue8m0 scales per\n"
            "                      64 and bf16 rope channels (kernels/kv_layout.h), 592 of 1,024 bytes per entry\n"
            "  --json OUT.json     write every number (rewritten after each variant, so a cut-short run keeps\n"
            "                      what ran)\n"
            "  --gpus N            N ranks over NCCL on GPUs 0..N-1 (docs/multigpu.md; default: one GPU, no NCCL);\n"
            "                      the kernel timings are rank 0's. With N > 1 (or --nccl-time) every context adds\n"
            "                      --reps eager steps timed with CUDA events around each all-reduce\n"
            "  --nccl-time         the collective timing at N = 1 too (needs --gpus N)\n\n"
            "dsv4 bench --prefill N [--prefill-chunk N] [--layers N] [--weights bf16|fp8] [--variant V] [--reps N]\n"
            "                  [--experts grouped|decode] [--linears gemm|kernel] [--expert-lanes N]\n"
            "                  [--mhc-pre tiled|rows] [--max-context M] [--batch B] [--seed N]:\n"
            "                  the prefill of one N-token prompt (random tokens; --batch B: B such prompts\n"
            "                  together, sharing each step in sequence order as `dsv4 run` does) on the same random\n"
            "                  model, in steps of --prefill-chunk tokens (default min(N x B, 8192)); prints ms,\n"
            "                  tokens/s, TFLOP/s and the share of the FLOP floor at the bf16 GEMM rate measured\n"
            "                  now, the time of each stage (device events at the stage boundaries, --reps more\n"
            "                  reps; the indexer's share among them) and a decode step after it. V: all-on (default),\n"
            "                  attn-simt, indexer-fp32, mhc-roundtrip, index-max, all-naive; --experts decode /\n"
            "                  --linears kernel: the decode kernels for the routed experts / the FP8 linears\n"
            "                  instead of the prefill GEMMs; --expert-lanes N: the grouped experts' GEMMs on N\n"
            "                  streams (1 .. 8, default 4; 1: one after another); --mhc-pre rows: the decode\n"
            "                  kernel (4 tokens per block) for the mHC pre's projection instead of the tiled one;\n"
            "                  --max-context M: the caches' length (default N + 1); --layers default 4, --reps\n"
            "                  default 3 (after one warm-up; the median is reported)\n\n"
            "--batch, --context, --variants, --scaling and --scaling-batch may each be given once (a second list\n"
            "would replace the first); another option given twice takes its last value.\n"
            "Progress goes to stderr, the tables to stdout. Exit status: 0 ok, 1 a run failed, 2 bad usage, no CUDA\n"
            "(a build without it, or no device), a plan that does not fit the GPU's free memory, or the --json file\n"
            "could not be written (checked before the GPU work, and at the end).\n");
}

/* ------------------------------------------------------------------------------------ arguments */
static int is_digit(char c) { return c >= '0' && c <= '9'; }

int bench_parse_long(const char *v, long lo, long hi, long *out)
{
    char *end = NULL;
    if (!is_digit(v[0])) return -1;
    errno = 0;
    const long n = strtol(v, &end, 10);
    if (n < lo || n > hi || errno || *end) return -1;
    *out = n;
    return 0;
}

int bench_parse_int(const char *cmd, const char *k, const char *v, long lo, long hi, const char *alt, int *out)
{
    long n;
    if (bench_parse_long(v, lo, hi, &n)) {
        fprintf(stderr, "%s: %s '%s': want %san integer in [%ld, %ld]\n", cmd, k, v, alt, lo, hi);
        return 2;
    }
    *out = (int)n;
    return 0;
}

int bench_parse_list(const char *s, long lo, long hi, int k_suffix, int max, int *out, int *n)
{
    *n = 0;
    for (const char *p = s;;) {
        char *end = NULL;
        if (!is_digit(*p)) return -1;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (k_suffix && (*end == 'K' || *end == 'k')) v = v > hi / 1024 ? -1 : v * 1024, end++;
        if (v < lo || v > hi || errno || *n == max || (*end && *end != ',') || (*end == ',' && !end[1])) return -1;
        out[(*n)++] = (int)v;
        if (!*end) return 0;
        p = end + 1;
    }
}

static int parse_int(const char *k, const char *v, long lo, long hi, const char *alt, int *out)
{
    return bench_parse_int("dsv4 bench", k, v, lo, hi, alt, out);
}

/* A comma list of integers in [1, 2^20], each optionally with a K (x1024) suffix, checked after the suffix. */
static int parse_list(const char *s, int *out, int *n, const char *what)
{
    if (!bench_parse_list(s, 1, 1L << 20, 1, BENCH_MAX_LIST, out, n)) return 0;
    fprintf(stderr, "dsv4 bench: %s '%s': want a comma list of at most %d integers in [1, 2^20] (K = x1024)\n", what,
            s, BENCH_MAX_LIST);
    return -1;
}

/* --variants: a comma list of variant names, no empty item. */
static int parse_variants(const char *s, bench_args *a)
{
    a->n_variant = 0;
    for (const char *p = s;;) {
        size_t len = strcspn(p, ",");
        int found = -1;
        for (int j = 0; j < BENCH_N_VARIANTS; j++)
            if (strlen(bench_variant_names[j]) == len && !strncmp(p, bench_variant_names[j], len)) found = j;
        if (found < 0 || a->n_variant == BENCH_N_VARIANTS) {
            fprintf(stderr, "dsv4 bench: --variants '%s': want a comma list of all-on, attn, indexer, mhc, "
                            "index-context, all-naive\n", s);
            return -1;
        }
        a->variant[a->n_variant++] = found;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

/* The options that take a value (parse_args handles each). */
static int takes_value(const char *k)
{
    static const char *const names[] = {"--layers",  "--batch", "--context", "--max-context", "--variants",
                                        "--warmup",  "--reps",  "--kernel-reps", "--scaling", "--scaling-batch",
                                        "--seed",    "--gpus",  "--json",    "--kv",          "--weights",
                                        "--quantize"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(k, names[i])) return 1;
    return 0;
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    memset(a, 0, sizeof *a);
    int b[] = {1, 16, 64}, c[] = {4096, 32768};
    memcpy(a->batch, b, sizeof b), a->n_batch = 3;
    memcpy(a->ctx, c, sizeof c), a->n_ctx = 2;
    a->max_context = 1 << 20;
    for (int i = 0; i < BENCH_N_VARIANTS; i++) a->variant[i] = i;
    a->n_variant = BENCH_N_VARIANTS;
    a->warmup = 3, a->reps = 10, a->kernel_reps = 7, a->baseline = 1, a->seed = 7;
    a->weights = DSV4_OPT_WEIGHTS_BF16;
    a->kv = DSV4_OPT_KV_BF16;
    for (int v = 1024; v <= 262144; v *= 2) a->scaling[a->n_scaling++] = v;
    a->n_sbatch = -1;
    dsv4_opt_weights weights = DSV4_OPT_WEIGHTS_AUTO; /* as given; resolved with --quantize after the loop */
    int quantize = 0;
    dsv4_cli_seen lists = {{0}, 0};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = dsv4_cli_value(argc, argv, i);
        int takes = 1;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            bench_usage(stdout);
            exit(0);
        } else if (!strcmp(k, "--no-baseline")) {
            a->baseline = 0, takes = 0;
        } else if (!strcmp(k, "--nccl-time")) {
            a->nccl_time = 1, takes = 0;
        } else if (k[0] != '-') {
            fprintf(stderr, "dsv4 bench: unexpected argument '%s': dsv4 bench takes options only (--help lists "
                            "them)\n", k);
            return -1;
        } else if (!takes_value(k)) { /* before the value check: a misspelt flag last was "needs a value" */
            fprintf(stderr, "dsv4 bench: unknown option '%s' (--help lists them)\n", k);
            return -1;
        } else if (!v) {
            fprintf(stderr, "dsv4 bench: %s needs a value\n", k);
            return -1;
        } else if ((!strcmp(k, "--batch") || !strcmp(k, "--context") || !strcmp(k, "--variants") ||
                    !strcmp(k, "--scaling") || !strcmp(k, "--scaling-batch")) &&
                   dsv4_cli_list_again(&lists, k)) {
            fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
            return -1;
        } else if (!strcmp(k, "--layers")) {
            a->layers = 0;
            if (strcmp(v, "auto") && parse_int(k, v, 1, DSV4_MAX_LAYERS, "auto or ", &a->layers)) return -1;
        } else if (!strcmp(k, "--batch")) {
            if (parse_list(v, a->batch, &a->n_batch, "--batch")) return -1;
        } else if (!strcmp(k, "--context")) {
            if (parse_list(v, a->ctx, &a->n_ctx, "--context")) return -1;
        } else if (!strcmp(k, "--max-context")) {
            int n = 0, t[BENCH_MAX_LIST];
            if (parse_list(v, t, &n, "--max-context")) return -1;
            if (n != 1) {
                fprintf(stderr, "dsv4 bench: --max-context '%s': want one integer\n", v);
                return -1;
            }
            a->max_context = t[0];
        } else if (!strcmp(k, "--variants")) {
            if (parse_variants(v, a)) return -1;
        } else if (!strcmp(k, "--warmup")) {
            if (parse_int(k, v, 1, 127, "", &a->warmup)) return -1;
        } else if (!strcmp(k, "--reps")) {
            if (parse_int(k, v, 1, 127, "", &a->reps)) return -1;
        } else if (!strcmp(k, "--kernel-reps")) {
            if (parse_int(k, v, 0, 1 << 20, "", &a->kernel_reps)) return -1;
        } else if (!strcmp(k, "--scaling")) {
            if (!strcmp(v, "none")) a->n_scaling = 0;
            else if (parse_list(v, a->scaling, &a->n_scaling, "--scaling")) return -1;
        } else if (!strcmp(k, "--scaling-batch")) {
            if (parse_list(v, a->sbatch, &a->n_sbatch, "--scaling-batch")) return -1;
        } else if (!strcmp(k, "--seed")) {
            char *end = NULL;
            errno = 0;
            a->seed = is_digit(v[0]) ? strtoull(v, &end, 10) : 0;
            if (!end || *end || errno) { /* strtoull would take "-1" as 2^64 - 1 */
                fprintf(stderr, "dsv4 bench: --seed '%s': want an integer in [0, 2^64)\n", v);
                return -1;
            }
        } else if (!strcmp(k, "--gpus")) {
            if (parse_int(k, v, 1, 64, "", &a->gpus)) return -1;
        } else if (!strcmp(k, "--json")) {
            a->json = v;
        } else if (!strcmp(k, "--kv")) {
            dsv4_opt_options t;
            dsv4_opt_options_default(&t);
            if (dsv4_opt_options_set(&t, "kv", v)) {
                fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
                return -1;
            }
            a->kv = t.kv;
        } else if (!strcmp(k, "--weights") || !strcmp(k, "--quantize")) {
            dsv4_opt_options t;
            dsv4_opt_options_default(&t);
            if (dsv4_opt_options_set(&t, k + 2, v)) {
                fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
                return -1;
            }
            if (k[2] == 'w') weights = t.weights;
            else quantize = t.quantize == DSV4_OPT_QUANTIZE_FP8;
        } else {
            fprintf(stderr, "dsv4 bench: unknown option '%s' (--help lists them)\n", k);
            return -1;
        }
        i += takes;
    }
    /* whatever the order (the last of the two used to win): the random model has no form of quantised values
     * held in bf16, which `dsv4 run --quantize fp8 --weights bf16` means */
    if (quantize && weights == DSV4_OPT_WEIGHTS_BF16) {
        fprintf(stderr, "dsv4 bench: --quantize fp8 with --weights bf16: the random model is drawn in one format; "
                        "give --weights bf16 or fp8 (--quantize fp8 alone means fp8)\n");
        return -1;
    }
    a->weights = quantize || weights == DSV4_OPT_WEIGHTS_FP8 ? DSV4_OPT_WEIGHTS_FP8 : DSV4_OPT_WEIGHTS_BF16;
    if (a->n_sbatch < 0) memcpy(a->sbatch, a->batch, sizeof a->batch), a->n_sbatch = a->n_batch;
    if (a->nccl_time && a->gpus < 1) {
        fprintf(stderr, "dsv4 bench: --nccl-time needs --gpus N\n");
        return -1;
    }
    if (a->warmup + a->reps > 128) {
        fprintf(stderr, "dsv4 bench: --warmup %d + --reps %d: want at most 128 steps\n", a->warmup, a->reps);
        return -1;
    }
    for (int i = 0; i < a->n_ctx; i++)
        if (a->ctx[i] < 256 || a->ctx[i] % 128 || a->ctx[i] > a->max_context) {
            fprintf(stderr, "dsv4 bench: --context %d: want a multiple of 128 in [256, max context %d]\n", a->ctx[i],
                    a->max_context);
            return -1;
        }
    return 0;
}

/* ------------------------------------------------------------------------------------ the results file */
int bench_results_tmp_name(const char *path, char *tmp, size_t size)
{
    if ((size_t)snprintf(tmp, size, "%s.tmp.%ld", path, (long)getpid()) >= size)
        return dsv4_error(DSV4_ERR_USAGE, "%s: cannot write the results: the name is too long", path);
    return 0;
}

/* Before any GPU work: can the results be written there? Creates and removes the temporary; refuses a final name
 * that is a directory or another non-file (the rename would fail after the whole run). */
static int results_check(const char *path)
{
    char tmp[4200];
    struct stat st;
    if (!path) return 0;
    if (!stat(path, &st) && !S_ISREG(st.st_mode))
        return dsv4_error(DSV4_ERR_USAGE, "%s: cannot write the results: it is not a regular file", path);
    int rc = bench_results_tmp_name(path, tmp, sizeof tmp);
    if (rc) return rc;
    int slot = dsv4_tempfile_register(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        rc = dsv4_error(DSV4_ERR_IO, "%s: cannot write the results: %s", path, strerror(errno));
    } else {
        close(fd);
        unlink(tmp);
    }
    dsv4_tempfile_unregister(slot);
    return rc;
}

int bench_check_args(int argc, char **argv, bench_args *a)
{
    if (parse_args(argc, argv, a)) return 2;
    if (results_check(a->json)) {
        fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
        return 2;
    }
    return 0;
}
