/* bench_serve_args.c - the command line of `dsv4 bench --serve` (bench_serve_args.h). */
#define _POSIX_C_SOURCE 200809L
#include "bench_serve_args.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_args.h"
#include "commands.h"
#include "dsv4/dsv4.h"

const char *const serve_step_names[SERVE_N_STEPS] = {"original", "+mma-attn", "+bf16-indexer", "+castfree-mhc",
                                                     "+live-index"};

static void serve_usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 bench --serve [--concurrency LIST] [--requests N] [--warmup N] [--input-len A[:B]]\n"
            "                  [--output-len A[:B]] [--rate R] [--token-budget N] [--prefill-chunk N]\n"
            "                  [--max-context N] [--layers N|auto] [--weights bf16|fp8] [--seeds-table] [--seed N]\n"
            "                  [--json OUT.json] [--markdown OUT.md] [--svg OUT.svg]\n\n"
            "Serving-shaped throughput of the optimized path on the Flash-shaped random model of `dsv4 bench`:\n"
            "requests of random token ids (EOS ignored) with the given input and output lengths, at most C in\n"
            "flight, each step packing one decode per generating request first and then prompt chunks up to the\n"
            "token budget (docs/bench.md \"Serving runs\"). Reports request throughput, input, output and total\n"
            "tokens/s, and TTFT, TPOT, ITL and end-to-end latency (mean, median, p99) as vLLM's `bench serve`\n"
            "defines them, and the step time split into prefill and decode tokens.\n\n"
            "  --concurrency LIST  requests in flight at most, comma list (default 1,16,64)\n"
            "  --requests N        measured requests per C (default max(8, 2C))\n"
            "  --warmup N          requests served before them and not measured (default min(C, 8))\n"
            "  --input-len A[:B]   prompt tokens, fixed or uniform in [A, B] (default 1024:8192)\n"
            "  --output-len A[:B]  output tokens, fixed or uniform in [A, B] (default 256:1024)\n"
            "  --rate R            requests per second, Poisson arrivals (default inf: all sent at once)\n"
            "  --token-budget N    tokens of one step at most (default 8192; at least C)\n"
            "  --prefill-chunk N   prompt tokens of one request in one step at most (default: the budget)\n"
            "  --max-context N     positions of each cache slot (default 1048576)\n"
            "  --layers N|auto     decoder layers (auto: as many as fit with the largest C)\n"
            "  --weights bf16|fp8  as `dsv4 bench` (default bf16)\n"
            "  --seeds-table       serve the workload five times: every optimization off (\"original\": --attn simt\n"
            "                      --indexer fp32 --mhc roundtrip --index-context max), then MMA split-K attention,\n"
            "                      the bf16 indexer, cast-free mHC and live-context indexing switched on one after\n"
            "                      the other; without it, the defaults (everything on) only\n"
            "  --seed N            workload and weights seed (default 7)\n"
            "  --json OUT.json     every number and every request's timeline\n"
            "  --markdown OUT.md   the tables\n"
            "  --svg OUT.svg       output tokens/s against C per configuration, and the ITL distribution\n\n"
            "Exit status: 0 ok, 1 a run failed, 2 bad usage (zero requests, an output of 0 tokens, a request longer\n"
            "than --max-context, a budget below one decode per request), no CUDA, or a plan that does not fit.\n");
}

static int bad(const char *opt, const char *v, const char *want)
{
    fprintf(stderr, "dsv4 bench --serve: %s '%s': %s\n", opt, v, want);
    return 2;
}

static int parse_int_opt(const char *opt, const char *v, long lo, long hi, int *out)
{
    return bench_parse_int("dsv4 bench --serve", opt, v, lo, hi, "", out);
}

/* A[:B] with 0 <= A <= B: a fixed length or a uniform range (0 is let through here so that the scheduler's own
 * check names it: "an output of 0 tokens ...") */
static int parse_range(const char *opt, const char *v, int *lo, int *hi)
{
    char buf[64];
    if (strlen(v) >= sizeof buf)
        return bad(opt, v, "want A or A:B");
    strcpy(buf, v);
    char *colon = strchr(buf, ':');
    if (colon)
        *colon = 0;
    long a, b;
    if (bench_parse_long(buf, 0, 1L << 20, &a) || (colon && bench_parse_long(colon + 1, 0, 1L << 20, &b)))
        return bad(opt, v, "want A or A:B, integers in [0, 2^20]");
    if (!colon)
        b = a;
    if (b < a)
        return bad(opt, v, "want A <= B");
    *lo = (int)a, *hi = (int)b;
    return 0;
}

static int check_writable(const char *opt, const char *path)
{
    char tmp[4096];
    if (bench_results_tmp_name(path, tmp, sizeof tmp))
        return bad(opt, path, "the path is too long");
    FILE *f = fopen(tmp, "w");
    if (!f)
        return bad(opt, path, "cannot be written there");
    fclose(f);
    remove(tmp);
    return 0;
}

int serve_check_args(int argc, char **argv, serve_args *a)
{
    memset(a, 0, sizeof *a);
    const int conc[] = {1, 16, 64};
    memcpy(a->conc, conc, sizeof conc), a->n_conc = 3;
    a->warmup = -1, a->requests = -1;
    a->input_min = 1024, a->input_max = 8192, a->output_min = 256, a->output_max = 1024;
    a->token_budget = 8192, a->max_context = 1 << 20;
    a->seed = 7;
    a->weights = DSV4_OPT_WEIGHTS_BF16;
    int seen_conc = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--serve"))
            continue;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            serve_usage(stdout);
            exit(0);
        }
        if (!strcmp(k, "--seeds-table")) {
            a->seeds_table = 1;
            continue;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "dsv4 bench --serve: %s needs a value (or is unknown: --help lists the options)\n", k);
            return 2;
        }
        i++;
        int rc = 0;
        if (!strcmp(k, "--concurrency")) {
            if (seen_conc++)
                return bad(k, v, "given twice (one list, please)");
            if (bench_parse_list(v, 1, DSV4_OPT_MAX_SEQ, 0, SERVE_MAX_C, a->conc, &a->n_conc))
                return bad(k, v, "want a comma list of at most 16 integers in [1, 4096]");
        } else if (!strcmp(k, "--requests"))
            rc = parse_int_opt(k, v, 0, 1 << 20, &a->requests);
        else if (!strcmp(k, "--warmup"))
            rc = parse_int_opt(k, v, 0, 1 << 20, &a->warmup);
        else if (!strcmp(k, "--input-len"))
            rc = parse_range(k, v, &a->input_min, &a->input_max);
        else if (!strcmp(k, "--output-len"))
            rc = parse_range(k, v, &a->output_min, &a->output_max);
        else if (!strcmp(k, "--rate")) {
            char *end = NULL;
            a->rate = strtod(v, &end);
            if (!strcmp(v, "inf"))
                a->rate = 0;
            else if (*end || !(a->rate > 0) || !isfinite(a->rate))
                rc = bad(k, v, "want a positive number of requests per second, or inf");
        } else if (!strcmp(k, "--token-budget"))
            rc = parse_int_opt(k, v, 1, DSV4_OPT_MAX_STEP_TOKENS, &a->token_budget);
        else if (!strcmp(k, "--prefill-chunk"))
            rc = parse_int_opt(k, v, 1, DSV4_OPT_MAX_STEP_TOKENS, &a->prefill_chunk);
        else if (!strcmp(k, "--max-context"))
            rc = parse_int_opt(k, v, 1, DSV4_OPT_MAX_CONTEXT, &a->max_context);
        else if (!strcmp(k, "--layers")) {
            if (strcmp(v, "auto"))
                rc = parse_int_opt(k, v, 1, DSV4_MAX_LAYERS, &a->layers);
        } else if (!strcmp(k, "--weights")) {
            if (!strcmp(v, "bf16"))
                a->weights = DSV4_OPT_WEIGHTS_BF16;
            else if (!strcmp(v, "fp8"))
                a->weights = DSV4_OPT_WEIGHTS_FP8;
            else
                rc = bad(k, v, "want bf16 or fp8");
        } else if (!strcmp(k, "--seed")) {
            long s;
            if (bench_parse_long(v, 0, 0x7fffffffL, &s))
                rc = bad(k, v, "want an integer in [0, 2^31)");
            a->seed = (unsigned long long)s;
        } else if (!strcmp(k, "--json"))
            a->json = v;
        else if (!strcmp(k, "--markdown"))
            a->markdown = v;
        else if (!strcmp(k, "--svg"))
            a->svg = v;
        else {
            fprintf(stderr, "dsv4 bench --serve: unknown option %s (--help lists the options)\n", k);
            return 2;
        }
        if (rc)
            return rc;
    }
    if (!a->prefill_chunk)
        a->prefill_chunk = a->token_budget;
    /* what the scheduler refuses, before any GPU work: draw every C's workloads and set their schedulers up */
    for (int i = 0; i < a->n_conc; i++)
        for (int measured = 0; measured < 2; measured++) {
            const int C = a->conc[i];
            int n = 0;
            dsv4_serve_request *r = serve_workload(a, C, measured, &n);
            if (!r) {
                fprintf(stderr, "dsv4 bench --serve: %s\n", dsv4_last_error());
                return 2;
            }
            if (n == 0) { /* no warm-up */
                free(r);
                continue;
            }
            const dsv4_serve_config cfg = serve_config(a, C);
            dsv4_serve_sched *s = NULL;
            char err[512];
            int rc = dsv4_serve_sched_init(&s, &cfg, r, n, err, sizeof err);
            dsv4_serve_sched_free(s);
            free(r);
            if (rc) {
                fprintf(stderr, "dsv4 bench --serve: %s (C = %d, %s requests)\n", err, C,
                        measured ? "measured" : "warm-up");
                return 2;
            }
        }
    if ((a->json && check_writable("--json", a->json)) || (a->markdown && check_writable("--markdown", a->markdown)) ||
        (a->svg && check_writable("--svg", a->svg)))
        return 2;
    return 0;
}

dsv4_serve_request *serve_workload(const serve_args *a, int C, int measured, int *n)
{
    const int n_warm = a->warmup >= 0 ? a->warmup : (C < 8 ? C : 8);
    const int n_meas = a->requests >= 0 ? a->requests : (2 * C > 8 ? 2 * C : 8);
    *n = measured ? n_meas : n_warm;
    dsv4_serve_request *r = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *r);
    if (!r) {
        dsv4_error(DSV4_ERR_NOMEM, "out of host memory for %d requests", *n);
        return NULL;
    }
    if (!measured && *n == 0)
        return r;
    /* two streams of the seed, so that --warmup does not change the measured workload; the warm-up is sent at
     * once, the measured requests at --rate */
    const dsv4_serve_workload_spec w = {.n_requests = *n, .input_min = a->input_min, .input_max = a->input_max,
                                        .output_min = a->output_min, .output_max = a->output_max,
                                        .rate = measured ? a->rate : 0, .seed = a->seed * 2 + (unsigned)measured};
    char err[256];
    if (dsv4_serve_workload(&w, r, err, sizeof err)) {
        dsv4_error(DSV4_ERR_USAGE, "%s", err);
        free(r);
        return NULL;
    }
    return r;
}

dsv4_serve_config serve_config(const serve_args *a, int C)
{
    return (dsv4_serve_config){.n_slots = C, .token_budget = a->token_budget, .prefill_chunk = a->prefill_chunk,
                               .max_context = a->max_context};
}

void serve_step_options(int s, dsv4_opt_options *o)
{
    o->attn = s >= 1 ? DSV4_OPT_ATTN_MMA : DSV4_OPT_ATTN_SIMT;
    o->indexer = s >= 2 ? DSV4_OPT_INDEXER_BF16 : DSV4_OPT_INDEXER_FP32;
    o->mhc = s >= 3 ? DSV4_OPT_MHC_CASTFREE : DSV4_OPT_MHC_ROUNDTRIP;
    o->index_context = s >= 4 ? DSV4_OPT_INDEX_LIVE : DSV4_OPT_INDEX_MAX;
}
