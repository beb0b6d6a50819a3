/* bench_serve_args.h - the arguments of `dsv4 bench --serve` (cli/bench_serve.c), parsed and checked in every build
 * before any GPU work: the workload of every C is drawn and the scheduler set up on the host, so a request that
 * cannot fit, a budget below one decode per request, zero requests or outputs are refused with exit 2 by a CPU-only
 * build as by a CUDA one. */
#ifndef DSV4_CLI_BENCH_SERVE_ARGS_H
#define DSV4_CLI_BENCH_SERVE_ARGS_H

#include "dsv4/dsv4_opt.h"
#include "dsv4/dsv4_serve.h"

enum { SERVE_MAX_C = 16, SERVE_N_STEPS = 5 };

/* The seeds' table, cumulative in the original campaign's order: "original" (every switch naive), then MMA
 * split-K attention, the bf16 indexer, cast-free mHC, live-context indexing switched on one after the other. */
extern const char *const serve_step_names[SERVE_N_STEPS];

typedef struct serve_args {
    int layers;                  /* 0: auto */
    int conc[SERVE_MAX_C], n_conc; /* C values */
    int requests;                /* measured requests per C (-1: the default, max(8, 2C)) */
    int warmup;                  /* unmeasured requests before them (-1: the default, min(C, 8)) */
    int input_min, input_max, output_min, output_max;
    double rate;                 /* <= 0: all at once */
    int token_budget, prefill_chunk, max_context;
    int seeds_table;             /* 1: the five cumulative configurations; 0: the defaults only */
    unsigned long long seed;
    dsv4_opt_weights weights;    /* bf16 or fp8 */
    const char *json, *markdown, *svg;
} serve_args;

/* Parse argv (argv[0] is "bench"; --serve anywhere) and check everything that needs no GPU (--help prints the usage
 * and exits 0): 0, or 2 with the message printed. */
int serve_check_args(int argc, char **argv, serve_args *a);
/* The warm-up (measured = 0) or measured (1) requests of concurrency C, malloc'd, *n of them (the warm-up may be
 * empty). NULL with the message in dsv4_last_error() when they cannot be drawn (zero measured requests, a bad
 * length range). */
dsv4_serve_request *serve_workload(const serve_args *a, int C, int measured, int *n);
/* The scheduler's config for concurrency C. */
dsv4_serve_config serve_config(const serve_args *a, int C);
/* Switches of step s of the seeds' table (0 = original .. 4 = everything on) into o. */
void serve_step_options(int s, dsv4_opt_options *o);

/* `dsv4 bench --serve ...` (cli/bench_serve.c): dsv4_cmd_bench hands the command line over. Exit status. */
int bench_serve(int argc, char **argv);

#endif /* DSV4_CLI_BENCH_SERVE_ARGS_H */
