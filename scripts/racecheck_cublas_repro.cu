/* racecheck_cublas_repro.cu - does compute-sanitizer racecheck fault on cuBLAS's bf16 GEMMs when it checks only
 * some launches (--launch-skip, --launch-count, --kernel-name)? docs/robustness.md (session 16): that is how
 * racecheck of part of a golden/topk512 run failed, the faulting call opt_gemm's cublasGemmEx. This program makes
 * the optimized path's cuBLAS calls alone, as it makes them: a non-blocking stream, the handle's own 32 MiB
 * workspace set after the stream, bf16 W [n_out, n_in] (transposed) times bf16 x [S, n_in] into f32 and bf16
 * outputs, a strided-batched bf16 GEMM (wo_a's groups), and a small kernel of our own with shared memory between
 * them. It checks every cuBLAS status, and the f32 output against a GEMM on the host.
 *   nvcc -O2 -arch=sm_90 -o /tmp/race scripts/racecheck_cublas_repro.cu -lcublas
 *   compute-sanitizer --tool racecheck --launch-skip 40 /tmp/race     (scripts/gpu-focus.sh race-repro runs the
 *   modes)
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

int main(int argc, char **argv)
{
    const int n_in = 1024, n_out = 2048, S = 3, G = 8, iters = argc > 1 ? atoi(argv[1]) : 20;
    const size_t nw = (size_t)n_out * n_in, nx = (size_t)S * n_in;
    unsigned short *hw = (unsigned short *)malloc(nw * 2), *hx = (unsigned short *)malloc(nx * 2);
    unsigned seed = 12345;
    for (size_t i = 0; i < nw + nx; i++) {
        seed = seed * 1664525u + 1013904223u;
        const float v = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.25f;
        __nv_bfloat16 b = __float2bfloat16(v);
        unsigned short bits;
        memcpy(&bits, &b, 2);
        if (i < nw) hw[i] = bits;
        else hx[i - nw] = bits;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *dw, *dx, *dyf, *dyb, *dyg, *ws, *dsum;
    const size_t ws_bytes = 32u << 20;
    CK(cudaMalloc(&dw, nw * 2));
    CK(cudaMalloc(&dx, nx * 2));
    CK(cudaMalloc(&dyf, (size_t)S * n_out * 4));
    CK(cudaMalloc(&dyb, (size_t)S * n_out * 2));
    CK(cudaMalloc(&dyg, (size_t)S * n_out * 2));
    CK(cudaMalloc(&dsum, (size_t)S * n_out / 256 * 4));
    CK(cudaMalloc(&ws, ws_bytes));
    CK(cudaMemcpy(dw, hw, nw * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, hx, nx * 2, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    CB(cublasCreate(&h));
    CB(cublasSetStream(h, st));
    CB(cublasSetWorkspace(h, ws, ws_bytes));
    const float one = 1.0f, zero = 0.0f;
    const int rows = n_out / G; /* a grouped GEMM like wo_a's: G groups of `rows` outputs over n_in / G inputs */
    /* the golden models' GEMMs are tiny (golden/tiny: hidden 32): cuBLAS picks other kernels for those */
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
    /* the f32 output against the host */
    float *hy = (float *)malloc((size_t)S * n_out * 4);
    CK(cudaMemcpy(hy, dyf, (size_t)S * n_out * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int s = 0; s < S; s++)
        for (int o = 0; o < n_out; o++) {
            double acc = 0;
            for (int i = 0; i < n_in; i++)
                acc += (double)bf16_value(hw[(size_t)o * n_in + i]) * bf16_value(hx[(size_t)s * n_in + i]);
            const double e = fabs(acc - hy[(size_t)s * n_out + o]);
            if (e > worst) worst = e;
        }
    printf("racecheck_cublas_repro: %d iterations of 6 cuBLAS bf16 GEMMs + 1 kernel, worst |f32 GEMM - host| %.3g\n",
           iters, worst);
    CB(cublasDestroy(h));
    return worst < 1e-3 ? 0 : 1;
}
