/* bench.c - `dsv4 bench`: decode throughput of the optimized path on a Flash-shaped model with random weights
 * (design.md "Performance method"; issue 7): C = 1/16/64 sequences at live context 4K/32K with the caches
 * allocated for 1M positions; the ablation (all on, each switch naive alone, all naive) in one run; the
 * indexer + top-k context scaling, live vs max; the roofline per step and per kernel against the copy-bandwidth
 * and bf16-GEMM ceilings measured at the start of the same run.
 *
 * Invariants that fail quietly:
 * - The caches are NOT filled by a prefill: dsv4_opt_random_state writes random RMS-1 rows for every position
 *   before the live context (window ring, compressed pools, indexer keys) and empty compressor states. The work
 *   of a decode step depends on the positions only (the indexer scores every live entry, attention gathers
 *   window + top-k), so the timings are those of a real step; the values are not those of a real prompt.
 * - Every variant of one C is built from the same config and seed, so the weights are bit-identical across
 *   variants. Positions start at ctx - 128 (a window boundary of both ratios) and at most 128 steps are taken,
 *   so all measured steps of a context fall in one graph bucket (the live entry count never crosses a power of 2).
 * - Step time is host wall time around dsv4_opt_step (graph launch, the step's own synchronisation, the argmax
 *   read back): what a caller sees. Kernel times are device event times of single launches with a cold L2.
 * - Bytes "that must move" count each weight the step reads once, the experts a batch touches (the expected
 *   number of distinct experts of C·k uniform picks), the gathered KV rows and the live indexer keys; FLOPs are
 *   2 per multiply-add. The floor is max(bytes / copy bandwidth, FLOPs / GEMM rate).
 * - The arguments, and that --json can be written there, are checked in every build before any GPU work
 *   (cli/bench_args.c). The results go to a registered temporary renamed into place (model/tempfile.c); a
 *   results file that could not be written makes the exit status 2 (the bench's numbers are lost), whatever the
 *   runs did.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_model.h"
#include "bench_serve_args.h"
#include "commands.h"
#include "dsv4/dsv4.h"
#include "dsv4/dsv4_opt.h"
#include "progress.h"

#ifndef DSV4_HAVE_CUDA
int dsv4_cmd_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prefill")) return bench_prefill(argc, argv);
        if (!strcmp(argv[i], "--serve")) return bench_serve(argc, argv);
    }
    bench_args a;
    int rc = bench_check_args(argc, argv, &a);
    if (rc) return rc;
    fprintf(stderr, "dsv4 bench: this build has no CUDA (configure with a CUDA compiler)\n");
    return 2;
}
#else

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <jansson.h>

enum { MAX_KT = 16 }; /* kernel timings per step */

static double t_start;
#define progress(...) cli_progress_note("bench", t_start, __VA_ARGS__)

static const char *gib(double b, char *buf) { return dsv4_mem_format(b, buf, 32); }

/* ------------------------------------------------------------------------------------ ceilings */
typedef struct ceilings {
    double copy_gbs, gemm_tflops;
} ceilings;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define BCUDA(call)                                                                                              \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) {                                                                                 \
            rc = dsv4_error(DSV4_ERR_CUDA, "%s: %s", #call, cudaGetErrorString(e_));                             \
            goto done;                                                                                           \
        }                                                                                                        \
    } while (0)

/* The two ceilings as bench/bench_common.cuh measures them: a 1 GiB device-to-device copy ((read + written)
 * bytes / s) and a cuBLAS bf16 GEMM 8192^3 with fp32 accumulation on random data; medians of 10 after 3. */
static int measure_ceilings(ceilings *cl)
{
    int rc = 0;
    const size_t nb = (size_t)1 << 30, N = 8192;
    void *a = NULL, *b = NULL, *c = NULL;
    cublasHandle_t h = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double t[10];
    BCUDA(cudaEventCreate(&e0));
    BCUDA(cudaEventCreate(&e1));
    BCUDA(cudaMalloc(&a, nb));
    BCUDA(cudaMalloc(&b, nb));
    BCUDA(cudaMalloc(&c, N * N * 2));
    if ((rc = dsv4_opt_random_f32(a, nb / 4, 1, 0.0f, 1.0f, NULL))) goto done;
    for (int i = 0; i < 13; i++) {
        BCUDA(cudaEventRecord(e0, 0));
        BCUDA(cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, nb, cudaMemcpyDeviceToDevice, 0));
        BCUDA(cudaEventRecord(e1, 0));
        BCUDA(cudaEventSynchronize(e1));
        float ms;
        BCUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3) t[i - 3] = ms;
    }
    qsort(t, 10, sizeof t[0], cmp_double);
    cl->copy_gbs = 2.0 * nb / (t[5] * 1e6);
    if ((rc = dsv4_opt_random_bf16(a, N * N, 2, 0.0f, 1.0f, NULL)) ||
        (rc = dsv4_opt_random_bf16(b, N * N, 3, 0.0f, 1.0f, NULL)))
        goto done;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        rc = dsv4_error(DSV4_ERR_CUDA, "cublasCreate failed");
        goto done;
    }
    for (int i = 0; i < 13; i++) {
        const float one = 1.0f, zero = 0.0f;
        BCUDA(cudaEventRecord(e0, 0));
        if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)N, (int)N, &one, a, CUDA_R_16BF, (int)N, b,
                         CUDA_R_16BF, (int)N, &zero, c, CUDA_R_16BF, (int)N, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
            rc = dsv4_error(DSV4_ERR_CUDA, "cublasGemmEx failed");
            goto done;
        }
        BCUDA(cudaEventRecord(e1, 0));
        BCUDA(cudaEventSynchronize(e1));
        float ms;
        BCUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3) t[i - 3] = ms;
    }
    qsort(t, 10, sizeof t[0], cmp_double);
    cl->gemm_tflops = 2.0 * (double)N * N * N / (t[5] * 1e9);
done:
    if (h) cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}
#undef BCUDA

int bench_measure_ceilings(double *copy_gbs, double *gemm_tflops)
{
    ceilings cl = {0, 0};
    int rc = measure_ceilings(&cl);
    *copy_gbs = cl.copy_gbs, *gemm_tflops = cl.gemm_tflops;
    return rc;
}

/* ------------------------------------------------------------------------------------ one variant */
static void variant_options(int v, int C, int max_ctx, dsv4_opt_weights weights, dsv4_opt_kv kv, int gpus,
                            dsv4_opt_options *o)
{
    dsv4_opt_options_default(o);
    o->weights = weights;
    o->kv = kv;
    o->n_seq = C;
    o->n_gpus = gpus;
    o->max_context = max_ctx;
    if (v == 1 || v == 5) o->attn = DSV4_OPT_ATTN_SIMT;
    if (v == 2 || v == 5) o->indexer = DSV4_OPT_INDEXER_FP32;
    if (v == 3 || v == 5) o->mhc = DSV4_OPT_MHC_ROUNDTRIP;
    if (v == 4 || v == 5) o->index_context = DSV4_OPT_INDEX_MAX;
}

typedef struct step_stats {
    double med_ms, min_ms, max_ms, mean_ms;
    int pos0, steps;
} step_stats;

static int run_steps(dsv4_opt *o, int C, int pos0, int warmup, int reps, unsigned long long seed, step_stats *st)
{
    int32_t *tok = malloc((size_t)C * sizeof *tok), *next = malloc((size_t)C * sizeof *next);
    double *t = malloc((size_t)reps * sizeof *t);
    int rc = tok && next && t ? 0 : dsv4_error(DSV4_ERR_NOMEM, "bench: out of host memory");
    uint64_t h = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int s = 0; !rc && s < warmup + reps; s++) {
        for (int c = 0; c < C; c++) {
            h ^= h << 13, h ^= h >> 7, h ^= h << 17;
            tok[c] = (int32_t)(h % 129280u);
        }
        double t0 = cli_now_s();
        rc = dsv4_opt_step(o, tok, NULL, NULL, NULL, next);
        if (s >= warmup) t[s - warmup] = 1e3 * (cli_now_s() - t0);
    }
    if (!rc) {
        double sum = 0;
        for (int i = 0; i < reps; i++) sum += t[i];
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        st->med_ms = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        st->min_ms = t[0], st->max_ms = t[reps - 1], st->mean_ms = sum / reps;
        st->pos0 = pos0, st->steps = warmup + reps;
    }
    free(tok);
    free(next);
    free(t);
    return rc;
}

static json_t *kernels_json(const dsv4_opt_kernel_time *kt, int nk, const ceilings *cl, double *head_us)
{
    json_t *arr = json_array();
    for (int i = 0; i < nk; i++) {
        double floor_us = fmax(kt[i].bytes / (cl->copy_gbs * 1e3), kt[i].flops / (cl->gemm_tflops * 1e6));
        json_t *k = json_pack("{s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:i}", "name", kt[i].name, "layer",
                              kt[i].layer, "us", kt[i].us, "bytes", kt[i].bytes, "flops", kt[i].flops, "gbs",
                              kt[i].bytes / (kt[i].us * 1e3), "tflops", kt[i].flops / (kt[i].us * 1e6), "floor_us",
                              floor_us, "fraction_of_floor", kt[i].us > 0 ? floor_us / kt[i].us : 0.0, "work",
                              kt[i].work, "experts", kt[i].experts);
        json_array_append_new(arr, k);
        if (!strcmp(kt[i].name, "head") && head_us) *head_us = kt[i].us;
    }
    return arr;
}

/* ------------------------------------------------------------------------------------ the command */
/* The results file, as results_check's comment says; nothing is left behind when it fails. */
static int write_json(const char *path, json_t *root)
{
    char tmp[4200];
    if (!path) return 0;
    int rc = bench_results_tmp_name(path, tmp, sizeof tmp);
    if (rc) return rc;
    int slot = dsv4_tempfile_register(tmp); /* before the file exists: a signal while writing removes it */
    if (json_dump_file(root, tmp, JSON_INDENT(1) | JSON_REAL_PRECISION(6)))
        rc = dsv4_error(DSV4_ERR_IO, "%s: cannot write the results (the temporary %s)", path, tmp);
    else if (rename(tmp, path))
        rc = dsv4_error(DSV4_ERR_IO, "%s: cannot write the results: rename: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    dsv4_tempfile_unregister(slot);
    return rc;
}

static void print_tables(json_t *root);

/* A variant that fails (out of memory, a kernel error) is recorded and the run goes on; a sticky CUDA error makes
 * every later variant fail too, and each says so. Returns 0 (the run continues); the exit status is still 1. */
static int record_failure(json_t *fails, int C, const char *variant, const char *stage)
{
    progress("  FAILED (%s, C=%d %s): %s", stage, C, variant, dsv4_last_error());
    json_array_append_new(fails, json_pack("{s:i, s:s, s:s, s:s}", "C", C, "variant", variant, "stage", stage,
                                           "error", dsv4_last_error()));
    cudaGetLastError(); /* clear a non-sticky error */
    return 0;
}

int dsv4_cmd_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prefill")) return bench_prefill(argc, argv);
        if (!strcmp(argv[i], "--serve")) return bench_serve(argc, argv);
    }
    bench_args a;
    if (bench_check_args(argc, argv, &a)) return 2;
    t_start = cli_now_s();
    int rc = 0, dev = 0, drv = 0, rt = 0;
    struct cudaDeviceProp prop;
    cudaError_t dev_err = cudaGetDeviceCount(&dev);
    if (dev_err != cudaSuccess || dev < 1) { /* CUDA's reason: no driver, a driver too old, none visible */
        fprintf(stderr, "dsv4 bench: no CUDA device (%s)\n",
                dev_err != cudaSuccess ? cudaGetErrorString(dev_err) : "0 devices");
        return 2;
    }
    cudaGetDeviceProperties(&prop, 0);
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    progress("device %s (%d SMs, %.1f GiB), CUDA driver API %d.%d, runtime %d.%d", prop.name,
             prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, drv / 1000, drv % 1000 / 10, rt / 1000,
             rt % 1000 / 10);
    ceilings cl = {0, 0};
    if ((rc = measure_ceilings(&cl))) {
        fprintf(stderr, "dsv4 bench: ceilings: %s\n", dsv4_last_error());
        return 1;
    }
    progress("ceilings (measured now): copy %.0f GB/s (read + written), cuBLAS bf16 GEMM 8192^3 %.0f TFLOP/s",
             cl.copy_gbs, cl.gemm_tflops);

    /* the layer count: as many as fit with the largest C */
    int cmax = 1;
    for (int i = 0; i < a.n_batch; i++) cmax = a.batch[i] > cmax ? a.batch[i] : cmax;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const double margin = 3.0 * 1073741824.0;
    int naive_idx = 0;
    for (int i = 0; i < a.n_variant; i++) naive_idx |= a.variant[i] == 2 || a.variant[i] == 5;
    dsv4_config cfg;
    bench_mem_plan mp;
    int layers = a.layers;
    if (!layers) {
        for (layers = 1; layers < DSV4_MAX_LAYERS; layers++) {
            if ((rc = bench_flash_config(layers + 1, a.max_context, &cfg))) break;
            bench_plan_memory(&cfg, cmax, a.max_context, naive_idx, a.weights == DSV4_OPT_WEIGHTS_FP8,
                              a.kv == DSV4_OPT_KV_FP8, &mp);
            if (mp.total > (double)free_b - margin) break;
        }
        if (rc) {
            fprintf(stderr, "dsv4 bench: config: %s\n", dsv4_last_error());
            return 1;
        }
    }
    if ((rc = bench_flash_config(layers, a.max_context, &cfg))) {
        fprintf(stderr, "dsv4 bench: config: %s\n", dsv4_last_error());
        return 1;
    }
    bench_plan_memory(&cfg, cmax, a.max_context, naive_idx, a.weights == DSV4_OPT_WEIGHTS_FP8,
                      a.kv == DSV4_OPT_KV_FP8, &mp);
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32], b8[32], b9[32];
    double w_sum = mp.global, c_sum = 0;
    for (int L = 0; L < layers; L++) w_sum += mp.per_layer_w[L], c_sum += mp.per_layer_cache[L];
    printf("memory plan (weights %s, kv %s, largest C = %d, max context %d, %d layers: ",
           dsv4_opt_weights_name(a.weights), dsv4_opt_kv_name(a.kv), cmax, a.max_context, layers);
    for (int L = 0; L < layers; L++) printf("%s%s", L ? "," : "", dsv4_attn_type_name(cfg.attn_type[L]));
    printf("):\n  weights %s (%s per CSA layer, embed + head %s), caches %s (%s per CSA layer, %s per HCA layer),\n"
           "  scratch ~%s; total ~%s of %s free\n",
           gib(w_sum, b1), gib(mp.per_layer_w[0], b2), gib(mp.global, b3), gib(c_sum, b4),
           gib(mp.per_layer_cache[0], b5), gib(layers > 1 ? mp.per_layer_cache[1] : 0, b6), gib(mp.scratch, b7),
           gib(mp.total, b8), gib((double)free_b, b9));
    fflush(stdout);
    if (mp.total > (double)free_b - margin) {
        fprintf(stderr, "dsv4 bench: %d layers with C = %d and max context %d need ~%.1f GiB, %.1f GiB free: reduce "
                        "--layers, --batch or --max-context\n",
                layers, cmax, a.max_context, mp.total / 1073741824.0, free_b / 1073741824.0);
        return 2;
    }
    if (layers < 4) progress("warning: only %d layers fit (the issue asks for at least 4)", layers);

    json_t *root = json_object(), *runs = json_array(), *scal = json_array(), *base = json_array();
    json_object_set_new(root, "schema", json_string("dsv4-bench/1"));
    json_object_set_new(root, "device", json_pack("{s:s, s:i, s:f, s:i, s:i}", "name", prop.name, "sms",
                                                  prop.multiProcessorCount, "memory_gib",
                                                  prop.totalGlobalMem / 1073741824.0, "cuda_driver_api", drv,
                                                  "cuda_runtime", rt));
    json_object_set_new(root, "ceilings", json_pack("{s:f, s:f}", "copy_gbs", cl.copy_gbs, "gemm_tflops",
                                                    cl.gemm_tflops));
    json_t *model = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I}", "layers",
                              layers, "hidden", cfg.hidden_size, "heads", cfg.num_attention_heads, "head_dim",
                              cfg.head_dim, "q_rank", cfg.q_lora_rank, "index_heads", cfg.index_n_heads,
                              "index_head_dim", cfg.index_head_dim, "experts", cfg.n_routed_experts,
                              "experts_per_token", cfg.num_experts_per_tok, "expert_inter",
                              cfg.moe_intermediate_size, "vocab", cfg.vocab_size, "window", cfg.sliding_window,
                              "index_topk", cfg.index_topk, "seed", (json_int_t)a.seed);
    json_t *lt = json_array();
    for (int L = 0; L < layers; L++) json_array_append_new(lt, json_string(dsv4_attn_type_name(cfg.attn_type[L])));
    json_object_set_new(model, "layer_types", lt);
    json_object_set_new(root, "model", model);
    json_object_set_new(root, "method", json_pack("{s:i, s:i, s:i, s:i, s:s, s:s}", "max_context", a.max_context,
                                                  "warmup", a.warmup, "reps", a.reps, "kernel_reps", a.kernel_reps,
                                                  "state", "random valid state written directly (no prefill)",
                                                  "step_time", "host wall time around dsv4_opt_step (graph replay)"));
    json_object_set_new(root, "runs", runs);
    json_object_set_new(root, "scaling", scal);
    json_object_set_new(root, "baseline_max_eq_live", base);
    json_t *fails = json_array();
    json_object_set_new(root, "failures", fails);
    int n_total = a.n_batch * a.n_variant, n_done = 0;
    for (int bi = 0; bi < a.n_batch && !rc; bi++) {
        const int C = a.batch[bi];
        for (int vi = 0; vi < a.n_variant && !rc; vi++) {
            const int v = a.variant[vi];
            dsv4_opt_options oo;
            variant_options(v, C, a.max_context, a.weights, a.kv, a.gpus, &oo);
            dsv4_opt *o = NULL;
            double t0 = cli_now_s();
            progress("[%d/%d] C=%d %s: building (random weights on the GPU, caches for %d positions)", ++n_done,
                     n_total, C, bench_variant_names[v], a.max_context);
            if ((rc = dsv4_opt_init_random(&cfg, a.seed, &oo, &o))) {
                rc = record_failure(fails, C, bench_variant_names[v], "build");
                continue;
            }
            size_t wb, sb, xb;
            dsv4_opt_memory(o, &wb, &sb, &xb);
            progress("  built in %.1f s: weights %s, caches %s, scratch %s (%s)", cli_now_s() - t0, gib((double)wb, b1),
                     gib((double)sb, b2), gib((double)xb, b3), dsv4_opt_producer(o));
            progress("  weights per layer (%s): layer 0 (%s) %s, layer 1 (%s) %s; embed + head + rest %s",
                     dsv4_opt_weights_name(dsv4_opt_weights_mode(o)), dsv4_attn_type_name(cfg.attn_type[0]),
                     gib((double)dsv4_opt_layer_weight_bytes(o, 0), b4),
                     layers > 1 ? dsv4_attn_type_name(cfg.attn_type[1]) : "-",
                     gib((double)dsv4_opt_layer_weight_bytes(o, 1), b5),
                     gib((double)dsv4_opt_layer_weight_bytes(o, -1), b6));
            for (int ci = 0; ci < a.n_ctx && !rc; ci++) {
                const int ctx = a.ctx[ci], pos0 = ctx - 128;
                if ((rc = dsv4_opt_random_state(o, pos0, a.seed + 1000 + (unsigned)ctx))) break;
                step_stats st;
                if ((rc = run_steps(o, C, pos0, a.warmup, a.reps, a.seed + (unsigned)ci, &st))) break;
                double bytes, flops;
                bench_step_roofline(&cfg, C, pos0 + a.warmup + a.reps / 2, a.weights == DSV4_OPT_WEIGHTS_FP8,
                                    a.kv == DSV4_OPT_KV_FP8, &bytes, &flops);
                const double floor_ms = fmax(bytes / (cl.copy_gbs * 1e6), flops / (cl.gemm_tflops * 1e9));
                json_t *r = json_pack("{s:i, s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "C", C,
                                      "variant", bench_variant_names[v], "context", ctx, "max_context", a.max_context,
                                      "pos0", st.pos0, "ms_median", st.med_ms, "ms_min", st.min_ms, "ms_max",
                                      st.max_ms, "ms_mean", st.mean_ms, "tokens_per_s", 1e3 * C / st.med_ms,
                                      "us_per_layer", 1e3 * st.med_ms / layers, "bytes", bytes, "flops", flops,
                                      "floor_ms", floor_ms);
                json_object_set_new(r, "fraction_of_floor", json_real(floor_ms / st.med_ms));
                json_object_set_new(r, "producer", json_string(dsv4_opt_producer(o)));
                json_object_set_new(r, "weights", json_string(dsv4_opt_weights_name(dsv4_opt_weights_mode(o))));
                json_object_set_new(r, "kv", json_string(dsv4_opt_kv_name(a.kv)));
                json_t *lw = json_array(); /* with --gpus N: rank 0's shard */
                for (int L = -1; L < layers; L++)
                    json_array_append_new(lw, json_integer((json_int_t)dsv4_opt_layer_weight_bytes(o, L)));
                json_object_set_new(r, "weight_bytes_rest_then_layers", lw);
                if ((a.gpus > 1 || a.nccl_time) && pos0 + st.steps + 1 + a.reps > a.max_context) {
                    progress("  ctx %d: no NCCL timing (the timed steps would pass --max-context)", ctx);
                } else if (a.gpus > 1 || a.nccl_time) {
                    /* eager steps with events around every all-reduce (graphs and timing events are not mixed) */
                    step_stats se;
                    double nccl_us = 0;
                    int calls = 0, steps = 0;
                    if ((rc = dsv4_opt_nccl_timing(o, 1)) ||
                        (rc = run_steps(o, C, pos0 + st.steps, 1, a.reps, a.seed + 99 + (unsigned)ci, &se)) ||
                        (rc = dsv4_opt_nccl_time(o, &nccl_us, &calls, &steps)) || (rc = dsv4_opt_nccl_timing(o, 0))) {
                        json_decref(r);
                        break;
                    }
                    const double per = steps > 0 ? nccl_us / steps : 0;
                    json_object_set_new(r, "nccl", json_pack("{s:i, s:f, s:i, s:i, s:f, s:s}", "gpus", a.gpus,
                                                             "us_per_step", per, "collectives_per_step", calls,
                                                             "timed_steps", steps, "eager_ms_median", se.med_ms,
                                                             "method", "CUDA events around each all-reduce, "
                                                             "eager steps, the slowest rank per step"));
                    progress("  ctx %d: NCCL %.1f us/step in %d all-reduces (eager step %.3f ms)", ctx, per, calls,
                             se.med_ms);
                }
                progress("  ctx %d: %.3f ms/step (min %.3f, max %.3f), %.1f tokens/s, floor %.3f ms (%.0f%%)", ctx,
                         st.med_ms, st.min_ms, st.max_ms, 1e3 * C / st.med_ms, floor_ms, 100 * floor_ms / st.med_ms);
                if (a.kernel_reps > 0) {
                    dsv4_opt_kernel_time kt[MAX_KT];
                    int nk = 0;
                    if ((rc = dsv4_opt_time_kernels(o, a.kernel_reps, kt, MAX_KT, &nk))) {
                        json_decref(r);
                        break;
                    }
                    double head_us = 0;
                    json_object_set_new(r, "kernels", kernels_json(kt, nk, &cl, &head_us));
                    double per_layer = (1e3 * st.med_ms - head_us) / layers;
                    json_object_set_new(r, "us_per_layer_ex_head", json_real(per_layer));
                    json_object_set_new(r, "head_us", json_real(head_us));
                    /* Flash: 43 layers (2 sliding, 21 CSA, 20 HCA); this model's mix is CSA/HCA alternating */
                    json_object_set_new(r, "ms_flash43_extrapolated", json_real((head_us + 43 * per_layer) / 1e3));
                }
                json_array_append_new(runs, r);
            }
            /* context scaling of the indexer + top-k, live vs max, on the all-on object */
            int do_scal = 0;
            for (int i = 0; i < a.n_sbatch; i++) do_scal |= a.sbatch[i] == C;
            if (!rc && v == 0 && do_scal && a.n_scaling > 0) {
                int top = 0;
                for (int i = 0; i < a.n_scaling; i++) top = a.scaling[i] > top ? a.scaling[i] : top;
                if (top > a.max_context - 1) top = a.max_context - 1;
                progress("  indexer + top-k scaling, live contexts up to %d, max %d", top, a.max_context);
                if (!(rc = dsv4_opt_random_state(o, top / 128 * 128, a.seed + 77))) {
                    for (int i = 0; i < a.n_scaling && !rc; i++) {
                        const int live = a.scaling[i] / cfg.compress_rate_csa;
                        if (a.scaling[i] > top || live < 1) continue;
                        double s_live, k_live, s_max, k_max;
                        if ((rc = dsv4_opt_time_indexer(o, live, 0, a.kernel_reps ? a.kernel_reps : 5, &s_live,
                                                        &k_live)) ||
                            (rc = dsv4_opt_time_indexer(o, live, 1, a.kernel_reps ? a.kernel_reps : 5, &s_max,
                                                        &k_max)))
                            break;
                        int n_csa = 0;
                        for (int L = 0; L < layers; L++) n_csa += cfg.attn_type[L] == DSV4_ATTN_CSA;
                        json_array_append_new(scal,
                                              json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:i}", "C", C,
                                                        "live_context", a.scaling[i], "live_entries", live,
                                                        "max_context", a.max_context, "live_scores_us", s_live,
                                                        "live_topk_us", k_live, "max_scores_us", s_max, "max_topk_us",
                                                        k_max, "csa_layers", n_csa));
                        progress("    live %7d: live %.1f + %.1f us, max %.1f + %.1f us per CSA layer", a.scaling[i],
                                 s_live, k_live, s_max, k_max);
                    }
                }
            }
            dsv4_opt_free(o);
            if (rc) rc = record_failure(fails, C, bench_variant_names[v], "run");
            json_object_set_new(root, "elapsed_s", json_real(cli_now_s() - t_start));
            json_object_set_new(root, "complete", json_boolean(0));
            if (write_json(a.json, root)) progress("warning: %s", dsv4_last_error());
        }
        /* the index-context target: the same all-on step with the caches sized for the live context only */
        if (!rc && a.baseline) {
            for (int ci = 0; ci < a.n_ctx && !rc; ci++) {
                const int ctx = a.ctx[ci], pos0 = ctx - 128;
                if (ctx != 4096 && a.n_ctx > 1) continue; /* the target is stated at 4K */
                dsv4_opt_options oo;
                variant_options(0, C, ctx, a.weights, a.kv, a.gpus, &oo);
                dsv4_opt *o = NULL;
                progress("C=%d all-on, max context %d (= live): the index-context baseline", C, ctx);
                step_stats st;
                if ((rc = dsv4_opt_init_random(&cfg, a.seed, &oo, &o)) ||
                    (rc = dsv4_opt_random_state(o, pos0, a.seed + 1000 + (unsigned)ctx)) ||
                    (rc = run_steps(o, C, pos0, a.warmup, a.reps, a.seed + (unsigned)ci, &st))) {
                    dsv4_opt_free(o);
                    rc = record_failure(fails, C, "all-on max=live", "baseline");
                    continue;
                }
                dsv4_opt_free(o);
                json_array_append_new(base, json_pack("{s:i, s:i, s:i, s:f, s:f, s:f}", "C", C, "context", ctx,
                                                      "max_context", ctx, "ms_median", st.med_ms, "ms_min",
                                                      st.min_ms, "ms_max", st.max_ms));
                progress("  %.3f ms/step", st.med_ms);
            }
        }
        json_object_set_new(root, "elapsed_s", json_real(cli_now_s() - t_start));
        json_object_set_new(root, "complete", json_boolean(0));
        if (write_json(a.json, root)) progress("warning: %s", dsv4_last_error());
    }
    if (rc) {
        fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
        json_object_set_new(root, "error", json_string(dsv4_last_error()));
    } else {
        json_object_set_new(root, "complete", json_boolean(1));
    }
    json_object_set_new(root, "elapsed_s", json_real(cli_now_s() - t_start));
    const int json_rc = write_json(a.json, root);
    if (json_rc) fprintf(stderr, "dsv4 bench: %s\n", dsv4_last_error());
    print_tables(root);
    /* record_failure lets the run go on, so a failed variant leaves rc 0: it still makes the exit status 1 */
    const size_t n_failed = json_array_size(fails);
    if (n_failed)
        fprintf(stderr, "dsv4 bench: %zu run(s) FAILED (the tables' FAILED lines; \"failures\" in the JSON)\n",
                n_failed);
    json_decref(root);
    /* the results file not written: 2, as for any output that could not be */
    return json_rc ? 2 : rc || n_failed ? 1 : 0;
}

/* ------------------------------------------------------------------------------------ tables */
static double jnum(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return v ? json_number_value(v) : 0.0;
}

static void print_tables(json_t *root)
{
    json_t *runs = json_object_get(root, "runs"), *r;
    size_t i;
    printf("\nthroughput (median of the timed steps; spread = min..max):\n");
    printf("%-5s %-14s %-7s %7s %10s %17s %12s %10s %10s %7s\n", "C", "variant", "weights", "ctx", "ms/step", "spread",
           "tokens/s", "us/layer", "floor ms", "%floor");
    json_array_foreach(runs, i, r)
    {
        char spread[32];
        snprintf(spread, sizeof spread, "%.2f..%.2f", jnum(r, "ms_min"), jnum(r, "ms_max"));
        const char *wm = json_string_value(json_object_get(r, "weights"));
        printf("%-5d %-14s %-7s %7d %10.3f %17s %12.1f %10.1f %10.3f %6.0f%%\n", (int)jnum(r, "C"),
               json_string_value(json_object_get(r, "variant")), wm ? wm : "?", (int)jnum(r, "context"),
               jnum(r, "ms_median"), spread,
               jnum(r, "tokens_per_s"), jnum(r, "us_per_layer"), jnum(r, "floor_ms"),
               100 * jnum(r, "fraction_of_floor"));
    }
    /* speed-ups against all-naive, per C and context */
    printf("\nablation: each variant's step time over all-on's (how much that optimization buys), all-naive over "
           "all-on:\n");
    json_t *a, *b;
    size_t j;
    json_array_foreach(runs, i, a)
    {
        if (strcmp(json_string_value(json_object_get(a, "variant")), "all-on")) continue;
        printf("  C=%-3d ctx %6d:", (int)jnum(a, "C"), (int)jnum(a, "context"));
        json_array_foreach(runs, j, b)
        {
            if (jnum(b, "C") != jnum(a, "C") || jnum(b, "context") != jnum(a, "context") || i == j) continue;
            printf("  %s x%.2f", json_string_value(json_object_get(b, "variant")),
                   jnum(b, "ms_median") / jnum(a, "ms_median"));
        }
        printf("\n");
    }
    json_t *base = json_object_get(root, "baseline_max_eq_live");
    json_array_foreach(base, i, b)
    {
        json_array_foreach(runs, j, a)
        {
            if (jnum(a, "C") == jnum(b, "C") && jnum(a, "context") == jnum(b, "context") &&
                !strcmp(json_string_value(json_object_get(a, "variant")), "all-on"))
                printf("index-context live, C=%d ctx %d: max context %d: %.3f ms, max context = live: %.3f ms: "
                       "x%.3f\n",
                       (int)jnum(a, "C"), (int)jnum(a, "context"), (int)jnum(a, "max_context"), jnum(a, "ms_median"),
                       jnum(b, "ms_median"), jnum(a, "ms_median") / jnum(b, "ms_median"));
        }
    }
    printf("\nkernels (all-on; single launches, cold L2; floor = max(bytes/copy, FLOPs/GEMM)):\n");
    printf("%-4s %6s %-12s %9s %9s %7s %9s %7s\n", "C", "ctx", "kernel", "us", "GB/s", "%copy", "TFLOP/s", "%floor");
    const double bw = jnum(json_object_get(root, "ceilings"), "copy_gbs");
    json_array_foreach(runs, i, a)
    {
        if (strcmp(json_string_value(json_object_get(a, "variant")), "all-on")) continue;
        json_t *ks = json_object_get(a, "kernels"), *k;
        json_array_foreach(ks, j, k)
        printf("%-4d %6d %-12s %9.1f %9.0f %6.1f%% %9.2f %6.0f%%\n", (int)jnum(a, "C"), (int)jnum(a, "context"),
               json_string_value(json_object_get(k, "name")), jnum(k, "us"), jnum(k, "gbs"),
               100 * jnum(k, "gbs") / bw, jnum(k, "tflops"), 100 * jnum(k, "fraction_of_floor"));
    }
    json_t *fails = json_object_get(root, "failures");
    json_array_foreach(fails, i, a)
    printf("FAILED: C=%d %s (%s): %s\n", (int)jnum(a, "C"), json_string_value(json_object_get(a, "variant")),
           json_string_value(json_object_get(a, "stage")), json_string_value(json_object_get(a, "error")));
    json_t *scal = json_object_get(root, "scaling");
    if (json_array_size(scal)) {
        printf("\nindexer + top-k per CSA layer (us), live vs max context:\n%-4s %8s %12s %12s %8s\n", "C", "live",
               "live", "max", "max/live");
        json_array_foreach(scal, i, a)
        {
            double l = jnum(a, "live_scores_us") + jnum(a, "live_topk_us");
            double m = jnum(a, "max_scores_us") + jnum(a, "max_topk_us");
            printf("%-4d %8d %12.1f %12.1f %8.1f\n", (int)jnum(a, "C"), (int)jnum(a, "live_context"), l, m, m / l);
        }
    }
}
#endif /* DSV4_HAVE_CUDA */
