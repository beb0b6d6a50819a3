/* test_gpu_cublas.c - proves the GPU path of the build: a device query and one cuBLAS SGEMM checked against
 * a CPU triple loop in double precision on random inputs. Without a CUDA device it exits 77 (ctest: skipped).
 * The output is poisoned with NaN first so an unwritten element fails. */
#include <check.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsv4_test.h"

enum { M = 257, N = 31, K = 129 };

static float lcg_uniform(unsigned *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (float)((*state >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

START_TEST(test_device_query)
{
    int n = 0;
    ck_assert_int_eq(cudaGetDeviceCount(&n), cudaSuccess);
    ck_assert_int_gt(n, 0);
    struct cudaDeviceProp prop;
    ck_assert_int_eq(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    printf("device 0: %s, sm_%d%d, %d SMs, %.1f GiB\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, (double)prop.totalGlobalMem / (1u << 30));
    ck_assert_int_ge(prop.major, 7);
}
END_TEST

START_TEST(test_cublas_sgemm_matches_cpu)
{
    /* Column-major C[M,N] = A[M,K] * B[K,N]. */
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N), *c = malloc(sizeof(float) * M * N);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(c);
    unsigned seed = 12345;
    for (int i = 0; i < M * K; i++) a[i] = lcg_uniform(&seed);
    for (int i = 0; i < K * N; i++) b[i] = lcg_uniform(&seed);
    dsv4_test_poison_f32(c, (size_t)M * N);

    float *da, *db, *dc;
    ck_assert_int_eq(cudaMalloc((void **)&da, sizeof(float) * M * K), cudaSuccess);
    ck_assert_int_eq(cudaMalloc((void **)&db, sizeof(float) * K * N), cudaSuccess);
    ck_assert_int_eq(cudaMalloc((void **)&dc, sizeof(float) * M * N), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(da, a, sizeof(float) * M * K, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(db, b, sizeof(float) * K * N, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(dc, c, sizeof(float) * M * N, cudaMemcpyHostToDevice), cudaSuccess);

    cublasHandle_t h;
    ck_assert_int_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    /* Plain fp32: no TF32 tensor-core shortcut, so the result is fp32-accurate. */
    ck_assert_int_eq(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    ck_assert_int_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one, da, M, db, K, &zero, dc, M),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cudaMemcpy(c, dc, sizeof(float) * M * N, cudaMemcpyDeviceToHost), cudaSuccess);

    double err2 = 0, ref2 = 0;
    for (int j = 0; j < N; j++)
        for (int i = 0; i < M; i++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)a[i + k * M] * b[k + j * K];
            double d = c[i + j * M] - s;
            ck_assert_msg(isfinite(c[i + j * M]), "C[%d,%d] not written / not finite", i, j);
            err2 += d * d;
            ref2 += s * s;
        }
    double rel = sqrt(err2 / ref2);
    printf("cuBLAS SGEMM %dx%dx%d: relative L2 error vs fp64 CPU = %.3g\n", M, N, K, rel);
    ck_assert_msg(rel < 1e-6, "relative L2 error %.3g >= 1e-6", rel);

    cublasDestroy(h);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    free(a);
    free(b);
    free(c);
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("gpu_cublas");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_device_query);
    tcase_add_test(tc, test_cublas_sgemm_matches_cpu);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
