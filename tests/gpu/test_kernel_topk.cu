/* test_kernel_topk.cu - kernels/topk.cu (both its paths: one block per sequence for n_work <= 8192, multi-block
 * radix select above): exact equality with a CPU sort under the tie rule "higher score first,
 * then lower id" (model-spec §13), -1 padding when fewer than k entries are live, both index_context positions.
 * Inputs are fresh random scores per case (fixed seeds), in three flavours: continuous; coarsely quantised (many
 * exact ties, +0.0 and -0.0 mixed, as the indexer produces when every ReLU is 0); and all equal. Outputs are
 * poisoned first. The tie gate is shown to fail: on the tied inputs the GPU result differs from the CPU result
 * with the opposite id order.
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
#include "../../kernels/topk.cuh"

enum { FLAVOUR_CONT, FLAVOUR_TIED, FLAVOUR_EQUAL };

typedef struct tk_case {
    const char *name;
    int C, k, n_work, flavour;
    int n_live[4];
} tk_case;

static const tk_case cases[] = {
    {"n=1 k=512", 1, 512, 1, FLAVOUR_CONT, {1}},
    {"n=0,17,511,512 k=512", 4, 512, 600, FLAVOUR_CONT, {0, 17, 511, 512}},
    {"n=513,2051 k=512", 2, 512, 2051, FLAVOUR_CONT, {513, 2051}},
    {"n=257 k=1,31", 1, 1, 257, FLAVOUR_CONT, {257}},
    {"n=257 k=100 tied", 2, 100, 257, FLAVOUR_TIED, {257, 200}},
    {"n=65536 k=512 tied", 2, 512, 65536, FLAVOUR_TIED, {65536, 40000}},
    {"n=262144 k=512", 2, 512, 262144, FLAVOUR_CONT, {262144, 262143}},
    {"n=262144 k=2048 tied", 1, 2048, 262144, FLAVOUR_TIED, {262144}},
    {"n=5000 k=512 all equal", 2, 512, 5000, FLAVOUR_EQUAL, {5000, 3000}},
    {"multi-block n=0,100,9000 k=512", 3, 512, 9000, FLAVOUR_TIED, {0, 100, 9000}},
};
enum { N_CASES = sizeof(cases) / sizeof(cases[0]) };

static uint64_t rng_state;
static double rng_uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static const float *sort_scores;
static int sort_ids_desc; /* 0: the rule (lower id first on ties); 1: the wrong one */
static int cmp_entry(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    float sx = sort_scores[x], sy = sort_scores[y]; /* -0 == +0 under float comparison */
    if (sx != sy) return sx > sy ? -1 : 1;
    return sort_ids_desc ? (x > y ? -1 : 1) : (x < y ? -1 : 1);
}

static void cpu_topk(const float *s, int n, int k, int ids_desc, int *out)
{
    int *ord = (int *)malloc(sizeof(int) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) ord[i] = i;
    sort_scores = s;
    sort_ids_desc = ids_desc;
    qsort(ord, n, sizeof(int), cmp_entry);
    for (int r = 0; r < k; r++) out[r] = r < n ? ord[r] : -1;
    free(ord);
}

static void check_case(int ci, dsv4_index_context ctx)
{
    const tk_case *t = &cases[ci];
    if (t->n_work > dsv4_test_max_work()) {
        printf("topk %-26s: skipped (n_work %d > DSV4_TEST_MAX_WORK)\n", t->name, t->n_work);
        return;
    }
    const int k = (ci == 3 && ctx == DSV4_INDEX_CONTEXT_MAX) ? 31 : t->k; /* the k=1 case also runs k=31 */
    rng_state = 991 + 7 * ci + ctx;
    const int64_t stride = t->n_work + 3;
    size_t ns = (size_t)t->C * stride, no = (size_t)t->C * k;
    float *s = (float *)malloc(ns * 4);
    for (size_t i = 0; i < ns; i++) {
        double u = rng_uniform() * 2 - 1;
        float v = (float)u;
        if (t->flavour == FLAVOUR_TIED) v = (float)(floor(u * 6) / 6.0) * (rng_uniform() < 0.5 ? 1.0f : -1.0f);
        if (t->flavour == FLAVOUR_EQUAL) v = 0.25f;
        s[i] = v; /* TIED: values k/6 with both signs of zero */
    }
    for (int c = 0; c < t->C; c++) /* past live: what the indexer's max position leaves */
        for (int j = t->n_live[c]; j < stride; j++) s[(size_t)c * stride + j] = ctx == DSV4_INDEX_CONTEXT_MAX ? -INFINITY : NAN;

    void *d_s, *d_l, *d_o, *d_ws;
    dsv4_topk_params p;
    memset(&p, 0, sizeof(p));
    p.n_seq = t->C;
    p.k = k;
    p.n_work = t->n_work;
    p.score_stride = stride;
    p.context = ctx;
    p.workspace_bytes = dsv4_opt_topk_workspace_bytes(&p);
    ck_assert_int_eq(cudaMalloc(&d_s, ns * 4), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&d_l, (size_t)t->C * 4), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&d_o, no * 4), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&d_ws, p.workspace_bytes), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d_s, s, ns * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d_l, t->n_live, (size_t)t->C * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemset(d_o, 0x7f, no * 4), cudaSuccess); /* poison: no valid id looks like 0x7f7f7f7f */
    p.scores = (const float *)d_s;
    p.n_live = (const int32_t *)d_l;
    p.out = (int32_t *)d_o;
    p.workspace = d_ws;
    int *got = (int *)malloc(no * 4), *want = (int *)malloc((size_t)k * 4), *wrong = (int *)malloc((size_t)k * 4);
    for (int run = 0; run < 2; run++) { /* the second run proves no state leaks between launches */
        ck_assert_int_eq(cudaMemset(d_o, 0x7f, no * 4), cudaSuccess);
        int rc = dsv4_opt_topk(&p);
        ck_assert_msg(rc == 0, "dsv4_opt_topk: %s", dsv4_last_error());
        ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
        ck_assert_int_eq(cudaMemcpy(got, d_o, no * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        int tie_gate_failed = 0;
        for (int c = 0; c < t->C; c++) {
            const int live = t->n_live[c];
            cpu_topk(s + (size_t)c * stride, live, k, 0, want);
            for (int r = 0; r < k; r++)
                ck_assert_msg(got[(size_t)c * k + r] == want[r], "%s (%s) seq %d: rank %d id %d, want %d (score %g)",
                              t->name, ctx == DSV4_INDEX_CONTEXT_LIVE ? "live" : "max", c, r, got[(size_t)c * k + r],
                              want[r], want[r] >= 0 ? s[(size_t)c * stride + want[r]] : 0.0);
            cpu_topk(s + (size_t)c * stride, live, k, 1, wrong);
            if (memcmp(wrong, got + (size_t)c * k, (size_t)k * 4) != 0) tie_gate_failed = 1;
        }
        if (t->flavour != FLAVOUR_CONT)
            ck_assert_msg(tie_gate_failed, "%s: gate too weak: the reversed tie order also matches", t->name);
    }
    printf("topk %-4s %-26s C=%d k=%d: exact match with the CPU sort\n", ctx == DSV4_INDEX_CONTEXT_LIVE ? "live" : "max",
           t->name, t->C, k);
    cudaFree(d_s);
    cudaFree(d_l);
    cudaFree(d_o);
    cudaFree(d_ws);
    free(s);
    free(got);
    free(want);
    free(wrong);
}

START_TEST(test_topk_live)
{
    check_case(_i, DSV4_INDEX_CONTEXT_LIVE);
}
END_TEST
START_TEST(test_topk_max)
{
    check_case(_i, DSV4_INDEX_CONTEXT_MAX);
}
END_TEST

START_TEST(test_rejects_bad_params)
{
    dsv4_topk_params p;
    memset(&p, 0, sizeof(p));
    p.n_seq = 1;
    p.k = 4096;
    p.n_work = 10;
    p.score_stride = 10;
    ck_assert_int_eq(dsv4_opt_topk(&p), DSV4_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "k 4096"));
    p.k = 8;
    ck_assert_int_eq(dsv4_opt_topk(&p), DSV4_ERR_USAGE); /* NULL pointers */
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("kernel_topk");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_topk_live, 0, N_CASES);
    tcase_add_loop_test(tc, test_topk_max, 0, N_CASES);
    tcase_add_test(tc, test_rejects_bad_params);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
