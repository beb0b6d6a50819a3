/* bench_args.h - the arguments of `dsv4 bench` (cli/bench.c), parsed and checked in every build before any GPU
 * work, so a CPU-only build refuses a bad command line just as a CUDA build does. */
#ifndef DSV4_CLI_BENCH_ARGS_H
#define DSV4_CLI_BENCH_ARGS_H

#include <stddef.h>

#include "dsv4/dsv4_opt.h"

enum { BENCH_MAX_LIST = 16, BENCH_N_VARIANTS = 6 };

/* all-on, then each switch naive alone (attn, indexer, mhc, index-context), then all-naive */
extern const char *const bench_variant_names[BENCH_N_VARIANTS];

typedef struct bench_args {
    int layers; /* 0: auto */
    int batch[BENCH_MAX_LIST], n_batch;
    int ctx[BENCH_MAX_LIST], n_ctx;
    int max_context;
    int variant[BENCH_N_VARIANTS], n_variant;
    int warmup, reps, kernel_reps;
    int scaling[BENCH_MAX_LIST], n_scaling;
    int sbatch[BENCH_MAX_LIST], n_sbatch;
    int baseline;
    unsigned long long seed;
    const char *json;
    dsv4_opt_weights weights; /* resolved: bf16 or fp8 */
    dsv4_opt_kv kv;           /* the caches' form */
    int gpus;      /* 0: one GPU, no NCCL */
    int nccl_time; /* time the collectives at N = 1 too */
} bench_args;

/* The strict number parsers of the bench command lines (here and cli/bench_serve_args.c): decimal digits only (no
 * sign, no blanks, not empty), in range. */
/* v in [lo, hi] (lo >= 0): 0, or -1; prints nothing. */
int bench_parse_long(const char *v, long lo, long hi, long *out);
/* An option's integer in [lo, hi] (lo >= 0): 0, or 2 (bad usage) with "CMD: K 'V': want <alt>an integer in [lo,
 * hi]" on stderr (alt: the other values the option takes, or ""). */
int bench_parse_int(const char *cmd, const char *k, const char *v, long lo, long hi, const char *alt, int *out);
/* A comma list of at most max integers in [lo, hi] (lo >= 0), no empty item; with k_suffix an item may end in K or
 * k (x1024, range-checked after the scaling). 0, or -1 (*n then undefined); prints nothing, so that the caller's
 * message says what the list wants. */
int bench_parse_list(const char *s, long lo, long hi, int k_suffix, int max, int *out, int *n);

/* Parses argv (--help prints the usage and exits 0) and checks that --json can be written there: 0, or 2 (bad
 * usage) with the message printed. */
int bench_check_args(int argc, char **argv, bench_args *a);

/* --json is written as docs/robustness.md says: to "<path>.tmp.<pid>" (this name), registered with
 * model/tempfile.c (a signal removes it), renamed into place when complete, removed when the write or the rename
 * fails. */
int bench_results_tmp_name(const char *path, char *tmp, size_t size);

#endif /* DSV4_CLI_BENCH_ARGS_H */
