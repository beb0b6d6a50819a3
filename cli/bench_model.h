/* bench_model.h - the Flash-shaped model of `dsv4 bench` (cli/bench.c): its config, the memory plan that picks how
 * many layers fit, and the roofline of one decode step. */
#ifndef DSV4_CLI_BENCH_MODEL_H
#define DSV4_CLI_BENCH_MODEL_H

#include "dsv4/dsv4.h"

/* The DeepSeek-V4-Flash shapes with `layers` layers (CSA, HCA, CSA, ...; the first hash-routed) and
 * max_position_embeddings max_pos. */
int bench_flash_config(int layers, int max_pos, dsv4_config *cfg);

/* Bytes of the weights, caches and scratch, as optimized/opt_layout.c lays them out (scratch estimated). */
typedef struct bench_mem_plan {
    double global, per_layer_w[DSV4_MAX_LAYERS], per_layer_cache[DSV4_MAX_LAYERS], scratch, total;
} bench_mem_plan;
void bench_plan_memory(const dsv4_config *f, int C, int max_ctx, int fp32_indexer, int fp8, int kv8,
                       bench_mem_plan *p);

/* The roofline of one step of C sequences at `live` positions: the bytes that must move and the FLOPs that
 * must be done (counted as in cli/bench.c's header). */
void bench_step_roofline(const dsv4_config *f, int C, int live, int fp8, int kv8, double *bytes, double *flops);

/* The copy-bandwidth and bf16-GEMM ceilings measured now (cli/bench.c; CUDA builds). */
int bench_measure_ceilings(double *copy_gbs, double *gemm_tflops);

/* `dsv4 bench --prefill N ...` (cli/bench_prefill.c): the prefill of one prompt. Exit status. */
int bench_prefill(int argc, char **argv);

#endif /* DSV4_CLI_BENCH_MODEL_H */
