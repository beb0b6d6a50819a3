/* test_kernel_indexer.cu - kernels/indexer.cu: both variants of `indexer` (bf16 mma fused, fp32 SIMT + elementwise)
 * and both positions of `index_context` (live, max), against a CPU computation in double precision on the SAME
 * bf16-rounded q and keys (fresh random inputs per case, fixed seeds).
 *
 * Tolerance: relative L2 1e-5 over the live scores of each sequence. Both variants multiply exact bf16 values
 * (products exact in fp32) and accumulate in fp32, so ~1e-7 is expected; ReLU flips at |x| ~ 1e-7 change a score by
 * that much only. Outside the tolerance: written-ness. Scores are NaN-poisoned first; live writes exactly w < n_live,
 * max writes w < n_work with -inf past n_live, and nothing past the bound is touched (still NaN).
 * The gate is shown to fail against a reference without the ReLU.
 */
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "dsv4_test.h"
}
#include "dsv4/dsv4.h"
#include "../../kernels/indexer.cuh"

typedef struct idx_case {
    const char *name;
    int C, H, d, n_work;
    int n_live[4];
} idx_case;

static const idx_case cases[] = {
    {"tiny 4x32", 3, 4, 32, 40, {0, 5, 31}},
    {"16x64, 257 entries", 2, 16, 64, 300, {257, 100}},
    {"H=20, d=48", 2, 20, 48, 200, {1, 129}},
    {"Flash 64x128, live 1/300/2051", 3, 64, 128, 2051, {1, 300, 2051}}, /* Flash heads at a size racecheck runs */
    {"Flash 64x128, live 1/17/2051/65536", 4, 64, 128, 65536, {1, 17, 2051, 65536}},
};
enum { N_CASES = sizeof(cases) / sizeof(cases[0]) };

static uint64_t rng_state;
static double rng_uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static void check_case(int ci, dsv4_indexer_kernel kern, dsv4_index_context ctx)
{
    const idx_case *k = &cases[ci];
    if (k->n_work > dsv4_test_max_work()) {
        printf("indexer %s: skipped (n_work %d > DSV4_TEST_MAX_WORK)\n", k->name, k->n_work);
        return;
    }
    rng_state = 77 + 13 * ci + 5 * kern + ctx;
    const int C = k->C, H = k->H, d = k->d, nw = k->n_work;
    const int64_t stride = nw + 5; /* the slack past n_work must stay untouched */
    size_t nq = (size_t)C * H * d, nk = (size_t)C * nw * d, ns = (size_t)C * stride;
    uint16_t *q = (uint16_t *)malloc(nq * 2), *keys = (uint16_t *)malloc(nk * 2);
    float *w = (float *)malloc((size_t)C * H * 4), *got = (float *)malloc(ns * 4);
    for (size_t i = 0; i < nq; i++) q[i] = dsv4_f32_to_bf16((float)(rng_uniform() * 2 - 1));
    for (size_t i = 0; i < nk; i++) keys[i] = dsv4_f32_to_bf16((float)(rng_uniform() * 2 - 1));
    for (int i = 0; i < C * H; i++) w[i] = (float)((rng_uniform() * 2 - 0.7) * 0.011048543); /* some negative */

    void *dq, *dk, *dw, *dl, *ds, *dscr = NULL;
    ck_assert_int_eq(cudaMalloc(&dq, nq * 2), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&dk, nk * 2), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&dw, (size_t)C * H * 4), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&dl, (size_t)C * 4), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&ds, ns * 4), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(dq, q, nq * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(dk, keys, nk * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(dw, w, (size_t)C * H * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(dl, k->n_live, (size_t)C * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemset(ds, 0xff, ns * 4), cudaSuccess);

    dsv4_indexer_params p;
    memset(&p, 0, sizeof(p));
    p.n_seq = C;
    p.n_heads = H;
    p.head_dim = d;
    p.n_work = nw;
    p.q = (const uint16_t *)dq;
    p.keys = (const uint16_t *)dk;
    p.key_seq_stride = (int64_t)nw * d;
    p.weights = (const float *)dw;
    p.n_live = (const int32_t *)dl;
    p.scores = (float *)ds;
    p.score_stride = stride;
    p.kernel = kern;
    p.context = ctx;
    p.scratch_bytes = dsv4_opt_indexer_scratch_bytes(&p);
    if (p.scratch_bytes) {
        ck_assert_int_eq(cudaMalloc(&dscr, p.scratch_bytes), cudaSuccess);
        p.scratch = (float *)dscr;
    }
    int rc = dsv4_opt_indexer_scores(&p);
    ck_assert_msg(rc == 0, "dsv4_opt_indexer_scores: %s", dsv4_last_error());
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(got, ds, ns * 4, cudaMemcpyDeviceToHost), cudaSuccess);

    double worst = 0, worst_norelu = INFINITY;
    for (int c = 0; c < C; c++) {
        const int live = k->n_live[c], bound = ctx == DSV4_INDEX_CONTEXT_LIVE ? live : nw;
        double e2 = 0, r2 = 0, e2n = 0;
        for (int j = 0; j < live; j++) {
            double s = 0, sn = 0;
            for (int h = 0; h < H; h++) {
                double dot = 0;
                for (int i = 0; i < d; i++)
                    dot += (double)dsv4_bf16_to_f32(q[((size_t)c * H + h) * d + i]) *
                           dsv4_bf16_to_f32(keys[((size_t)c * nw + j) * d + i]);
                s += w[c * H + h] * (dot > 0 ? dot : 0);
                sn += w[c * H + h] * dot;
            }
            float g = got[c * stride + j];
            ck_assert_msg(isfinite(g), "%s seq %d: score[%d] = %g not written / not finite", k->name, c, j, g);
            e2 += (g - s) * (g - s);
            r2 += s * s;
            e2n += (g - sn) * (g - sn);
        }
        for (int j = live; j < stride; j++) {
            float g = got[c * stride + j];
            if (j < bound)
                ck_assert_msg(g == -INFINITY, "%s seq %d: masked score[%d] = %g, want -inf", k->name, c, j, g);
            else
                ck_assert_msg(isnan(g), "%s seq %d: score[%d] = %g written past the bound %d", k->name, c, j, g, bound);
        }
        if (live > 0) {
            double rel = sqrt(e2 / r2), reln = sqrt(e2n / r2);
            if (rel > worst) worst = rel;
            if (reln < worst_norelu) worst_norelu = reln;
        }
    }
    printf("indexer %-4s %-4s %-36s: worst rel L2 %.3g (tol 1e-5); without ReLU %.3g\n",
           kern == DSV4_INDEXER_KERNEL_BF16 ? "bf16" : "f32", ctx == DSV4_INDEX_CONTEXT_LIVE ? "live" : "max", k->name,
           worst, worst_norelu);
    ck_assert_msg(worst < 1e-5, "%s: relative L2 %.3g >= 1e-5", k->name, worst);
    ck_assert_msg(worst_norelu > 1e-5, "%s: gate too weak (no-ReLU reference passes: %.3g)", k->name, worst_norelu);

    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dw);
    cudaFree(dl);
    cudaFree(ds);
    cudaFree(dscr);
    free(q);
    free(keys);
    free(w);
    free(got);
}

START_TEST(test_bf16_live)
{
    check_case(_i, DSV4_INDEXER_KERNEL_BF16, DSV4_INDEX_CONTEXT_LIVE);
}
END_TEST
START_TEST(test_bf16_max)
{
    check_case(_i, DSV4_INDEXER_KERNEL_BF16, DSV4_INDEX_CONTEXT_MAX);
}
END_TEST
START_TEST(test_f32_live)
{
    check_case(_i, DSV4_INDEXER_KERNEL_F32, DSV4_INDEX_CONTEXT_LIVE);
}
END_TEST
START_TEST(test_f32_max)
{
    check_case(_i, DSV4_INDEXER_KERNEL_F32, DSV4_INDEX_CONTEXT_MAX);
}
END_TEST

START_TEST(test_rejects_bad_shapes)
{
    dsv4_indexer_params p;
    memset(&p, 0, sizeof(p));
    p.n_seq = 1;
    p.n_heads = 65;
    p.head_dim = 128;
    p.n_work = 4;
    ck_assert_int_eq(dsv4_opt_indexer_scores(&p), DSV4_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "n_heads 65"));
    p.n_heads = 64;
    ck_assert_int_eq(dsv4_opt_indexer_scores(&p), DSV4_ERR_USAGE); /* NULL pointers */
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("kernel_indexer");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_bf16_live, 0, N_CASES);
    tcase_add_loop_test(tc, test_bf16_max, 0, N_CASES);
    tcase_add_loop_test(tc, test_f32_live, 0, N_CASES);
    tcase_add_loop_test(tc, test_f32_max, 0, N_CASES);
    tcase_add_test(tc, test_rejects_bad_shapes);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
