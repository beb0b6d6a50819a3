/* racecheck_cublas_repro.cu - does compute-sanitizer racecheck fault on cuBLAS's bf16 GEMMs when it checks only
 * some launches (--launch-skip, --launch-count, --kernel-name)? docs/robustness.md (session 16): that is how
 * racecheck of part of a golden/topk512 run failed, the faulting call opt_gemm's cublasGemmEx. This program makes
 * the optimized path's cuBLAS calls alone, as it makes them: a non-blocking stream, the handle's own 32 MiB
 * workspace set after the stream, bf16 W [n_out, n_in] (transposed) times bf16 x [S, n_in] into f32 and bf16
 * outputs, a strided-batched bf16 GEMM (wo_a's groups), and a small kernel of our own with shared memory between
 * them. It checks every cuBLAS status, and the f32 output against a GEMM on the host.
 * With the argument `flash` it makes instead the optimized path's bf16 GEMMs at the Flash width, batch 3
 * (tests/gpu/test_opt_long_state.c's Flash case, whose racecheck reports races inside cuBLAS's nvjet_sm90_*
 * kernels): is cuBLAS alone, with no kernel of ours, reported the same way?
 *   nvcc -O2 -arch=sm_90 -o /tmp/race scripts/racecheck_cublas_repro.cu -lcublas
 *   compute-sanitizer --tool racecheck --launch-skip 40 /tmp/race [ITERS [flash]]   (scripts/gpu-focus.sh
 *   race-repro runs the modes)
 * Exit 0: every call succeeded and matched; 1: a cuBLAS or CUDA failure or a wrong result (printed).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                               \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "%s: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__);                    \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)
#define CB(call)                                                                                               \
    do {                                                                                                       \
        cublasStatus_t s_ = (call);                                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                     \
            fprintf(stderr, "%s: cuBLAS status %d (line %d)\n", #call, (int)s_, __LINE__);                     \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

/* y[i] = sum of a block's 256 inputs through shared memory, so that racecheck has a kernel of ours to check */
__global__ void block_sum(const float *x, float *y, int n)
{
    __shared__ float s[256];
    const int i = blockIdx.x * 256 + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[blockIdx.x] = s[0];
}

static float bf16_value(unsigned short b)
{
    unsigned u = (unsigned)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void random_bf16(unsigned short *h, size_t n, unsigned *seed)
{
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        __nv_bfloat16 b = __float2bfloat16(((float)(*seed >> 8) / 16777216.0f - 0.5f) * 0.25f);
        memcpy(&h[i], &b, 2);
    }
}

/* a device copy of bytes at h */
static void *device_copy(const void *h, size_t bytes)
{
    void *d;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* worst |y - W x| over y [S, n_out] (f32, on the host) against a double GEMM of bf16 W [n_out, n_in], x [S, n_in] */
static double worst_error(const float *y, const unsigned short *w, const unsigned short *x, int n_out, int n_in,
                          int S)
{
    double worst = 0;
    for (int s = 0; s < S; s++)
        for (int o = 0; o < n_out; o++) {
            double acc = 0;
            for (int i = 0; i < n_in; i++)
                acc += (double)bf16_value(w[(size_t)o * n_in + i]) * bf16_value(x[(size_t)s * n_in + i]);
            const double e = fabs(acc - y[(size_t)s * n_out + o]);
            if (e > worst) worst = e;
        }
    return worst;
}

/* The Flash-width bf16 GEMMs of one decode step at batch S = 3 (optimized/opt_step.c, bf16 weights): the fused
 * x-projections of a CSA and an HCA layer, wq_b, the indexer's wq_b, wo_b, the ffn projection (gate | shared
 * w1 | w3), the shared w2 and the head, each into f32 (as the path) and into bf16; then wo_a, 8 groups of 1024
 * rows over 4096 inputs into bf16 (strided batched). Every f32 output is checked against the host. */
static int flash_gemms(cublasHandle_t h, cudaStream_t st, int iters)
{
    enum { S = 3, N_SHAPES = 8 };
    const int shape[N_SHAPES][2] = {{4160, 4096}, {2560, 4096}, {32768, 1024}, {8192, 1024},
                                    {4096, 8192}, {4128, 4096}, {4096, 2048},  {8192, 4096}};
    const int G = 8, rows = 1024, g_in = 4096;
    const float one = 1.0f, zero = 0.0f;
    unsigned seed = 777;
    double worst = 0;
    for (int k = 0; k < N_SHAPES; k++) {
        const int n_out = shape[k][0], n_in = shape[k][1];
        const size_t nw = (size_t)n_out * n_in, nx = (size_t)S * n_in;
        unsigned short *hw = (unsigned short *)malloc(nw * 2), *hx = (unsigned short *)malloc(nx * 2);
        float *hy = (float *)malloc((size_t)S * n_out * 4);
        random_bf16(hw, nw, &seed);
        random_bf16(hx, nx, &seed);
        void *dw = device_copy(hw, nw * 2), *dx = device_copy(hx, nx * 2), *dyf, *dyb;
        CK(cudaMalloc(&dyf, (size_t)S * n_out * 4));
        CK(cudaMalloc(&dyb, (size_t)S * n_out * 2));
        for (int it = 0; it < iters; it++) {
            CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, S, n_in, &one, dw, CUDA_R_16BF, n_in, dx,
                            CUDA_R_16BF, n_in, &zero, dyf, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
            CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, S, n_in, &one, dw, CUDA_R_16BF, n_in, dx,
                            CUDA_R_16BF, n_in, &zero, dyb, CUDA_R_16BF, n_out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
        }
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(hy, dyf, (size_t)S * n_out * 4, cudaMemcpyDeviceToHost));
        const double e = worst_error(hy, hw, hx, n_out, n_in, S);
        if (e > worst) worst = e;
        CK(cudaFree(dw));
        CK(cudaFree(dx));
        CK(cudaFree(dyf));
        CK(cudaFree(dyb));
        free(hw);
        free(hx);
        free(hy);
    }
    /* wo_a: W [G·rows, g_in], x [S, G·g_in] (group g reads inputs g·g_in..), y [S, G·rows] bf16 */
    const size_t nw = (size_t)G * rows * g_in, nx = (size_t)S * G * g_in;
    unsigned short *hw = (unsigned short *)malloc(nw * 2), *hx = (unsigned short *)malloc(nx * 2);
    random_bf16(hw, nw, &seed);
    random_bf16(hx, nx, &seed);
    void *dw = device_copy(hw, nw * 2), *dx = device_copy(hx, nx * 2), *dy;
    CK(cudaMalloc(&dy, (size_t)S * G * rows * 2));
    for (int it = 0; it < iters; it++)
        CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, S, g_in, &one, dw, CUDA_R_16BF, g_in,
                                      (long long)rows * g_in, dx, CUDA_R_16BF, G * g_in, g_in, &zero, dy,
                                      CUDA_R_16BF, G * rows, rows, G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CK(cudaStreamSynchronize(st));
    CK(cudaFree(dw));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    free(hw);
    free(hx);
    printf("racecheck_cublas_repro flash: %d iterations of %d Flash-width bf16 GEMMs, worst |f32 GEMM - host| %.3g\n",
           iters, 2 * N_SHAPES + 1, worst);
    return worst < 1e-3 ? 0 : 1;
}

/* The tiny mode: a GEMM like the Flash path's at a smaller width (into f32 and bf16, and grouped), our own
 * shared-memory kernel after the first, and the golden models' tiny GEMMs (golden/tiny: hidden 32), for which
 * cuBLAS picks other kernels. */
static int tiny_gemms(cublasHandle_t h, cudaStream_t st, int iters)
{
    const int n_in = 1024, n_out = 2048, S = 3, G = 8;
    const size_t nw = (size_t)n_out * n_in, nx = (size_t)S * n_in;
    unsigned short *hw = (unsigned short *)malloc(nw * 2), *hx = (unsigned short *)malloc(nx * 2);
    unsigned seed = 12345;
    random_bf16(hw, nw, &seed);
    random_bf16(hx, nx, &seed);
    void *dw = device_copy(hw, nw * 2), *dx = device_copy(hx, nx * 2), *dyf, *dyb, *dyg, *dsum;
    CK(cudaMalloc(&dyf, (size_t)S * n_out * 4));
    CK(cudaMalloc(&dyb, (size_t)S * n_out * 2));
    CK(cudaMalloc(&dyg, (size_t)S * n_out * 2));
    CK(cudaMalloc(&dsum, (size_t)S * n_out / 256 * 4));
    const float one = 1.0f, zero = 0.0f;
    const int rows = n_out / G; /* a grouped GEMM like wo_a's: G groups of `rows` outputs over n_in / G inputs */
    const int small[][2] = {{64, 32}, {256, 32}, {32, 64}};
    for (int it = 0; it < iters; it++) {
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, S, n_in, &one, dw, CUDA_R_16BF, n_in, dx, CUDA_R_16BF,
                        n_in, &zero, dyf, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        block_sum<<<S * n_out / 256, 256, 0, st>>>((const float *)dyf, (float *)dsum, S * n_out);
        CK(cudaGetLastError());
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, S, n_in, &one, dw, CUDA_R_16BF, n_in, dx, CUDA_R_16BF,
                        n_in, &zero, dyb, CUDA_R_16BF, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, S, n_in / G, &one, dw, CUDA_R_16BF,
                                      n_in / G, (long long)rows * (n_in / G), dx, CUDA_R_16BF, n_in, n_in / G, &zero,
                                      dyg, CUDA_R_16BF, n_out, rows, G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        for (int k = 0; k < 3; k++) /* into scratch outputs: dyg is large enough for each */
            CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, small[k][0], S, small[k][1], &one, dw, CUDA_R_16BF,
                            small[k][1], dx, CUDA_R_16BF, n_in, &zero, dyg, CUDA_R_32F, small[k][0],
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    CK(cudaStreamSynchronize(st));
    float *hy = (float *)malloc((size_t)S * n_out * 4);
    CK(cudaMemcpy(hy, dyf, (size_t)S * n_out * 4, cudaMemcpyDeviceToHost));
    const double worst = worst_error(hy, hw, hx, n_out, n_in, S);
    printf("racecheck_cublas_repro: %d iterations of 6 cuBLAS bf16 GEMMs + 1 kernel, worst |f32 GEMM - host| %.3g\n",
           iters, worst);
    return worst < 1e-3 ? 0 : 1;
}

int main(int argc, char **argv)
{
    const int iters = argc > 1 ? atoi(argv[1]) : 20, flash = argc > 2 && strcmp(argv[2], "flash") == 0;
    if (argc > 2 && !flash) {
        fprintf(stderr, "usage: %s [ITERS [flash]]\n", argv[0]);
        return 2;
    }
    /* as the optimized path: a non-blocking stream, then the handle's own workspace */
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *ws;
    const size_t ws_bytes = 32u << 20;
    CK(cudaMalloc(&ws, ws_bytes));
    cublasHandle_t h;
    CB(cublasCreate(&h));
    CB(cublasSetStream(h, st));
    CB(cublasSetWorkspace(h, ws, ws_bytes));
    const int rc = flash ? flash_gemms(h, st, iters) : tiny_gemms(h, st, iters);
    CB(cublasDestroy(h));
    return rc;
}
