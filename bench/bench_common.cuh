/* bench_common.cuh - what the kernel micro-benchmarks share (style rule 15, METHOD.md): the two ceilings measured in
 * the same run (device-to-device copy: bytes read + written per second; cuBLAS bf16 GEMM 8192^3 with fp32
 * accumulation: FLOP/s), random device fills (never zeros), event timing with warm-up, the median of the reps and
 * their spread, `--quick` (fewer reps), `--verbose` (every check's line), the spot checks against a small CPU
 * computation (a broken launch must not pass as fast: a failed check marks the run and the exit status), and one
 * table line per measurement.
 * Included by bench/bench_*.cu only (header-only, static functions).
 */
#ifndef DSV4_BENCH_COMMON_CUH
#define DSV4_BENCH_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"

#define BENCH_CHECK(call)                                                                                        \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) {                                                                                 \
            fprintf(stderr, "%s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__);            \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)
#define BENCH_OK(call)                                                                                           \
    do {                                                                                                         \
        if ((call) != 0) {                                                                                       \
            fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, dsv4_last_error(), __FILE__, __LINE__);           \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

enum { BENCH_WARMUP = 3, BENCH_REPS = 25, BENCH_QUICK_REPS = 7 };
#define BENCH_L2_BYTES ((size_t)60 << 20) /* H200; rotation pools are at least 3x this */

typedef struct bench_ceilings {
    double copy_gbs;  /* device-to-device copy, (read + written) bytes / s / 1e9 */
    double gemm_tflops;
} bench_ceilings;

static __global__ void bench_fill_bf16_kernel(uint16_t *p, size_t n, uint64_t seed, float amp)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        h ^= h >> 31;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        float u = (float)(h >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        __nv_bfloat16 b = __float2bfloat16_rn(u * amp);
        p[i] = *reinterpret_cast<uint16_t *>(&b);
    }
}
static __global__ void bench_fill_f32_kernel(float *p, size_t n, uint64_t seed, float amp)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        h ^= h >> 31;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        p[i] = ((float)(h >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * amp;
    }
}
static void bench_fill_bf16(void *p, size_t n, uint64_t seed, float amp)
{
    bench_fill_bf16_kernel<<<1024, 256>>>((uint16_t *)p, n, seed, amp);
    BENCH_CHECK(cudaGetLastError());
}
static void bench_fill_f32(void *p, size_t n, uint64_t seed, float amp)
{
    bench_fill_f32_kernel<<<1024, 256>>>((float *)p, n, seed, amp);
    BENCH_CHECK(cudaGetLastError());
}

static int bench_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median over BENCH_REPS of one call of fn(ctx, rep), each timed with its own events, after BENCH_WARMUP calls.
 * Before every timed call (outside the events) a 3 x L2 memset evicts the inputs: the numbers are cold-cache ones,
 * the conservative case (in a decode step some inputs were just written and may still be in L2). */
typedef void (*bench_fn)(void *ctx, int rep);
static void *bench_flush_buf;
static int bench_reps = BENCH_REPS;  /* BENCH_QUICK_REPS with --quick */
static double bench_last_spread;     /* (p90 - p10) / median of the last bench_median_us, in percent */
static int bench_failures;           /* failed spot checks so far */
static int bench_passes;             /* passed spot checks so far */
static int bench_verbose;            /* --verbose: a line for every check, not only the failed ones */
static double bench_worst_ratio;     /* the largest |err| / tolerance of any passed value, and where */
static char bench_worst_what[96];

/* --quick: fewer reps (the rest unchanged); --verbose: every check's line; anything else is a usage error. */
static void bench_init(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            bench_reps = BENCH_QUICK_REPS;
        } else if (!strcmp(argv[i], "--verbose")) {
            bench_verbose = 1;
        } else {
            fprintf(stderr, "usage: %s [--quick] [--verbose]\n", argv[0]);
            exit(2);
        }
    }
}
/* The summary of the spot checks and the exit status of a bench: 1 when any failed. */
static int bench_finish(void)
{
    printf("spot checks: %d ok, %d failed; closest to its tolerance: %.3g of it (%s)\n", bench_passes,
           bench_failures, bench_worst_ratio, bench_worst_what[0] ? bench_worst_what : "-");
    if (bench_failures) printf("FAILED: %d spot check(s) (the timings of those rows mean nothing)\n", bench_failures);
    return bench_failures ? 1 : 0;
}

static double bench_median_us(bench_fn fn, void *ctx)
{
    if (!bench_flush_buf) BENCH_CHECK(cudaMalloc(&bench_flush_buf, 3 * BENCH_L2_BYTES));
    cudaEvent_t e0, e1;
    BENCH_CHECK(cudaEventCreate(&e0));
    BENCH_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < BENCH_WARMUP; i++) fn(ctx, i);
    BENCH_CHECK(cudaDeviceSynchronize());
    float t[BENCH_REPS];
    const int reps = bench_reps;
    for (int i = 0; i < reps; i++) {
        BENCH_CHECK(cudaMemsetAsync(bench_flush_buf, i & 0xff, 3 * BENCH_L2_BYTES));
        BENCH_CHECK(cudaEventRecord(e0));
        fn(ctx, BENCH_WARMUP + i);
        BENCH_CHECK(cudaEventRecord(e1));
        BENCH_CHECK(cudaEventSynchronize(e1));
        BENCH_CHECK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    BENCH_CHECK(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    qsort(t, reps, sizeof(float), bench_cmp_float);
    const float med = t[reps / 2];
    bench_last_spread = med > 0.0f ? 100.0 * (t[reps - 1 - reps / 10] - t[reps / 10]) / med : 0.0;
    return 1000.0 * med;
}

typedef struct bench_copy_ctx {
    void *a, *b;
    size_t n;
} bench_copy_ctx;
static void bench_copy_fn(void *ctx, int rep)
{
    bench_copy_ctx *c = (bench_copy_ctx *)ctx;
    BENCH_CHECK(cudaMemcpyAsync(rep & 1 ? c->a : c->b, rep & 1 ? c->b : c->a, c->n, cudaMemcpyDeviceToDevice));
}

typedef struct bench_gemm_ctx {
    cublasHandle_t h;
    void *a, *b, *c;
    int n;
} bench_gemm_ctx;
static void bench_gemm_fn(void *ctx, int rep)
{
    bench_gemm_ctx *g = (bench_gemm_ctx *)ctx;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, g->n, g->n, g->n, &one, g->a, CUDA_R_16BF, g->n,
                                    g->b, CUDA_R_16BF, g->n, &zero, g->c, CUDA_R_16BF, g->n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasGemmEx: status %d\n", (int)s);
        exit(1);
    }
}

/* Both ceilings, printed. 2 GiB of copy (1 GiB each way), 8192^3 bf16 GEMM on random data. */
static bench_ceilings bench_measure_ceilings(void)
{
    bench_ceilings r;
    struct cudaDeviceProp prop;
    BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
    bench_copy_ctx cc;
    cc.n = (size_t)1 << 30;
    BENCH_CHECK(cudaMalloc(&cc.a, cc.n));
    BENCH_CHECK(cudaMalloc(&cc.b, cc.n));
    bench_fill_f32(cc.a, cc.n / 4, 1, 1.0f);
    double us = bench_median_us(bench_copy_fn, &cc);
    r.copy_gbs = 2.0 * cc.n / (us * 1e3);
    cudaFree(cc.a);
    cudaFree(cc.b);

    bench_gemm_ctx g;
    g.n = 8192;
    size_t nel = (size_t)g.n * g.n;
    if (cublasCreate(&g.h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        exit(1);
    }
    BENCH_CHECK(cudaMalloc(&g.a, nel * 2));
    BENCH_CHECK(cudaMalloc(&g.b, nel * 2));
    BENCH_CHECK(cudaMalloc(&g.c, nel * 2));
    bench_fill_bf16(g.a, nel, 2, 1.0f);
    bench_fill_bf16(g.b, nel, 3, 1.0f);
    us = bench_median_us(bench_gemm_fn, &g);
    r.gemm_tflops = 2.0 * g.n * (double)g.n * g.n / (us * 1e6);
    cublasDestroy(g.h);
    cudaFree(g.a);
    cudaFree(g.b);
    cudaFree(g.c);
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    printf("ceilings (measured now): copy %.0f GB/s (read+write), cuBLAS bf16 GEMM 8192^3 %.0f TFLOP/s\n", r.copy_gbs,
           r.gemm_tflops);
    return r;
}

/* Columns: spread = (p90 - p10) / median of the reps; bytes in MB (the fewest that must move), FLOPs in MFLOP. */
static void bench_header(void)
{
    printf("%-12s %-9s %-5s %4s %-30s %10s %7s %10s %10s %9s %7s %9s %7s\n", "kernel", "var", "ctx", "C", "shape",
           "us", "spread", "MB", "MFLOP", "GB/s", "%copy", "TFLOP/s", "%gemm");
}
static void bench_row(const bench_ceilings *cl, const char *kernel, const char *var, const char *ctx, int C,
                      const char *shape, double us, double bytes, double flops)
{
    double gbs = bytes / (us * 1e3), tf = flops / (us * 1e6);
    printf("%-12s %-9s %-5s %4d %-30s %10.1f %6.1f%% %10.3f %10.3f %9.0f %6.1f%% %9.3f %6.2f%%\n", kernel, var, ctx, C,
           shape, us, bench_last_spread, bytes / 1e6, flops / 1e6, gbs, 100.0 * gbs / cl->copy_gbs, tf,
           100.0 * tf / cl->gemm_tflops);
}

/* ------------------------------------------------------------------------------------------- spot checks */
static float bench_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void *bench_to_host(const void *dev, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    if (!h) {
        fprintf(stderr, "bench: out of host memory (%zu B)\n", bytes);
        exit(1);
    }
    BENCH_CHECK(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost));
    return h;
}
/* got[i] vs want[i] for n values: |got - want| <= atol + rtol·|want|, NaN/Inf in got always fails. On a failure
 * (or with --verbose) prints one line (worst error and where, the first faults); counts it. 1 when all pass. */
static int bench_check_close(const char *what, const float *got, const double *want, size_t n, double atol,
                             double rtol)
{
    size_t bad = 0, worst = 0;
    double worst_err = -1.0, worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], e = fabs(g - want[i]), tol = atol + rtol * fabs(want[i]);
        int ok = isfinite(g) && e <= tol;
        if (!isfinite(g)) e = INFINITY;
        if (e > worst_err) {
            worst_err = e;
            worst = i;
        }
        if (ok && tol > 0.0 && e / tol > worst_ratio) worst_ratio = e / tol;
        if (!ok && bad++ < 4) printf("  check %s: [%zu] got %.7g want %.7g\n", what, i, g, want[i]);
    }
    if (bad || bench_verbose)
        printf("check %-44s %s: %zu values, max |err| %.3g at [%zu] (got %.7g want %.7g), tol %.1g+%.1g|want|\n",
               what, bad ? "FAIL" : "ok", n, worst_err, worst, n ? got[worst] : 0.0, n ? want[worst] : 0.0, atol,
               rtol);
    if (bad) {
        bench_failures++;
    } else {
        bench_passes++;
        if (worst_ratio > bench_worst_ratio) {
            bench_worst_ratio = worst_ratio;
            snprintf(bench_worst_what, sizeof(bench_worst_what), "%s", what);
        }
    }
    return !bad;
}
/* Exact comparison of n int32 values. */
static int bench_check_equal_i32(const char *what, const int32_t *got, const int32_t *want, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ < 4) printf("  check %s: [%zu] got %d want %d\n", what, i, got[i], want[i]);
    if (bad || bench_verbose) printf("check %-44s %s: %zu values, %zu differ\n", what, bad ? "FAIL" : "ok", n, bad);
    if (bad)
        bench_failures++;
    else
        bench_passes++;
    return !bad;
}
/* A deterministic host PRNG for ids and positions (splitmix64). */
static uint64_t bench_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif /* DSV4_BENCH_COMMON_CUH */
