/* test_kernel_follow.cu - kernels/follow.cu (decision following) against a CPU reference on random rows.
 *
 * For every case, C = 3 sequences of k ids each (own picks: distinct ids with -1 padding; the dump's row: partly
 * the same ids, partly others, with -1 and, for top-k, repeated ids), sequence 1 following:
 *   - flag 0: nothing may change (ids, weights, counter);
 *   - flag 1: row 1 must equal the CPU merge (shared ids keep their slots, the dump's other ids fill the other
 *     slots in the dump's order, -1 after), which is checked twice: against a direct CPU merge, and by its
 *     properties (the valid set is the dump's valid set; every shared id sits where it was);
 *   - rows 0 and 2 are untouched; the counter counts exactly the rows that changed;
 *   - route: weights of a changed row are s_j / (Σ s_j + 1e-20) · scale from sqrt(softplus(logit)) (CPU fp64,
 *     rel 1e-5: device expf/log1pf are within a few ulp), and an unchanged row keeps its weights bit for bit
 *     (they are a sentinel the kernel must not write).
 * Every failure prints the case, slot and both values.
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
#include "../../kernels/follow.cuh"

#define CK(call) ck_assert_msg((call) == cudaSuccess, "%s failed", #call)

static uint64_t rng_state;
static uint32_t rng_u32(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* n distinct ids from [0, range) (range >= n), in random order. */
static void distinct_ids(int32_t *out, int n, int range)
{
    for (int i = 0; i < n;) {
        int32_t v = (int32_t)(rng_u32() % (uint32_t)range);
        int dup = 0;
        for (int j = 0; j < i && !dup; j++) dup = out[j] == v;
        if (!dup) out[i++] = v;
    }
}

/* The merge as follow.cuh states it, written directly. Returns 1 when the row changed. */
static int cpu_merge(const int32_t *own, const int32_t *tgt, int k, int32_t *out)
{
    int *keep = (int *)calloc((size_t)k, sizeof(int)), *miss = (int *)calloc((size_t)k, sizeof(int));
    for (int j = 0; j < k; j++) {
        int first = own[j] >= 0, in = 0;
        for (int i = 0; i < j; i++) first &= own[i] != own[j];
        for (int i = 0; i < k; i++) in |= tgt[i] == own[j];
        keep[j] = first && in;
        int m = tgt[j] >= 0;
        for (int i = 0; i < j; i++) m &= tgt[i] != tgt[j];
        for (int i = 0; i < k; i++) m &= own[i] != tgt[j];
        miss[j] = m;
    }
    int m = 0, changed = 0;
    for (int j = 0; j < k; j++) {
        out[j] = own[j];
        if (keep[j]) continue;
        while (m < k && !miss[m]) m++;
        out[j] = m < k ? tgt[m++] : -1;
        changed |= out[j] != own[j];
    }
    free(keep);
    free(miss);
    return changed;
}

typedef struct fcase {
    int k, range, route, n_own_valid, n_shared, n_tgt_valid, dup_tgt, flag;
} fcase;

static void run_case(const fcase *t, int ci, int *n_changed_rows, int *n_changed_gpu)
{
    const int C = 3, seq = 1, k = t->k, E = t->range;
    rng_state = 12345 + 977 * (uint64_t)ci;
    int32_t *sel = (int32_t *)malloc(sizeof(int32_t) * C * k), *tgt = (int32_t *)malloc(sizeof(int32_t) * k);
    int32_t *want = (int32_t *)malloc(sizeof(int32_t) * k), *got = (int32_t *)malloc(sizeof(int32_t) * C * k);
    float *w = (float *)malloc(sizeof(float) * C * k), *wgot = (float *)malloc(sizeof(float) * C * k);
    float *lg = (float *)malloc(sizeof(float) * C * E);
    /* own rows: n_own_valid distinct ids then -1; the dump's: n_shared of the own ids, others, -1, maybe a repeat */
    int32_t *pool = (int32_t *)malloc(sizeof(int32_t) * (2 * k + 2));
    for (int c = 0; c < C; c++) {
        distinct_ids(pool, t->n_own_valid + k, E);
        for (int j = 0; j < k; j++) sel[c * k + j] = j < t->n_own_valid ? pool[j] : -1;
        if (c == seq) {
            for (int j = 0; j < k; j++) tgt[j] = -1;
            for (int j = 0; j < t->n_shared; j++) tgt[j] = pool[(j * 7) % t->n_own_valid]; /* other order */
            for (int j = t->n_shared; j < t->n_tgt_valid; j++) tgt[j] = pool[t->n_own_valid + j]; /* not own */
            if (t->dup_tgt && t->n_tgt_valid >= 1 && t->n_tgt_valid < k) tgt[t->n_tgt_valid] = tgt[0];
            for (int j = k - 1; j > 0; j--) { /* shuffle the dump's row, -1 and repeat included */
                int i = (int)(rng_u32() % (uint32_t)(j + 1));
                int32_t v = tgt[i];
                tgt[i] = tgt[j];
                tgt[j] = v;
            }
        }
    }
    for (int i = 0; i < C * k; i++) w[i] = 12345.0f + (float)i; /* sentinel weights */
    for (int i = 0; i < C * E; i++) lg[i] = (float)((int)(rng_u32() % 2001) - 1000) / 125.0f; /* [-8, 8] */
    lg[seq * E + 0] = 25.0f; /* the softplus threshold branch */
    const int changed = cpu_merge(sel + seq * k, tgt, k, want);

    int32_t *d_sel, *d_tgt, *d_flag, *d_cnt;
    float *d_w, *d_lg;
    CK(cudaMalloc(&d_sel, sizeof(int32_t) * C * k));
    CK(cudaMalloc(&d_tgt, sizeof(int32_t) * k));
    CK(cudaMalloc(&d_flag, sizeof(int32_t)));
    CK(cudaMalloc(&d_cnt, sizeof(int32_t)));
    CK(cudaMalloc(&d_w, sizeof(float) * C * k));
    CK(cudaMalloc(&d_lg, sizeof(float) * C * E));
    CK(cudaMemcpy(d_sel, sel, sizeof(int32_t) * C * k, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tgt, tgt, sizeof(int32_t) * k, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_flag, &t->flag, sizeof(int32_t), cudaMemcpyHostToDevice));
    CK(cudaMemset(d_cnt, 0, sizeof(int32_t)));
    CK(cudaMemcpy(d_w, w, sizeof(float) * C * k, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_lg, lg, sizeof(float) * C * E, cudaMemcpyHostToDevice));
    dsv4_follow_params p;
    memset(&p, 0, sizeof p);
    p.n_seq = C, p.seq = seq, p.k = k, p.flag = d_flag, p.ids = d_tgt, p.sel = d_sel, p.changed = d_cnt;
    p.logits = d_lg, p.logit_stride = E, p.n_experts = E, p.routed_scale = 2.5f, p.weights = d_w, p.stream = 0;
    int rc = t->route ? dsv4_opt_follow_route(&p) : dsv4_opt_follow_topk(&p);
    ck_assert_msg(rc == 0, "case %d: %s", ci, dsv4_last_error());
    CK(cudaDeviceSynchronize());
    int cnt = -1;
    CK(cudaMemcpy(got, d_sel, sizeof(int32_t) * C * k, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(wgot, d_w, sizeof(float) * C * k, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&cnt, d_cnt, sizeof(int32_t), cudaMemcpyDeviceToHost));

    const int expect_change = t->flag && changed;
    printf("case %d: k %d %s flag %d own %d shared %d dump %d%s: %s\n", ci, k, t->route ? "route" : "topk", t->flag,
           t->n_own_valid, t->n_shared, t->n_tgt_valid, t->dup_tgt ? " +repeat" : "",
           expect_change ? "changed" : "unchanged");
    ck_assert_msg(cnt == expect_change, "case %d: counter %d, want %d", ci, cnt, expect_change);
    for (int c = 0; c < C; c++)
        for (int j = 0; j < k; j++) {
            const int32_t e = c == seq && t->flag ? want[j] : sel[c * k + j];
            ck_assert_msg(got[c * k + j] == e, "case %d: seq %d slot %d: gpu %d, want %d (own %d)", ci, c, j,
                          got[c * k + j], e, sel[c * k + j]);
        }
    if (t->flag) { /* the properties, independent of the CPU merge's code */
        const int32_t *o = got + seq * k, *own = sel + seq * k;
        for (int i = 0; i < k; i++) {
            int in_out = 0, in_tgt = 0;
            for (int j = 0; j < k; j++) in_out |= tgt[i] >= 0 && o[j] == tgt[i];
            ck_assert_msg(tgt[i] < 0 || in_out, "case %d: the dump's id %d is not in the followed row", ci, tgt[i]);
            for (int j = 0; j < k; j++) in_tgt |= o[i] == tgt[j];
            ck_assert_msg(o[i] < 0 || in_tgt, "case %d: slot %d holds %d, not one of the dump's", ci, i, o[i]);
            for (int j = 0; j < i; j++) ck_assert_msg(o[i] < 0 || o[j] != o[i], "case %d: %d twice", ci, o[i]);
            for (int j = 0; j < k; j++)
                ck_assert_msg(!(own[i] >= 0 && own[i] == tgt[j]) || o[i] == own[i],
                              "case %d: shared id %d moved from slot %d", ci, own[i], i);
        }
    }
    for (int c = 0; c < C; c++) {
        const int recomputed = t->route && c == seq && expect_change;
        double s[64], sum = 0.0;
        if (recomputed)
            for (int j = 0; j < k; j++) {
                double z = lg[c * E + want[j]];
                s[j] = sqrt(z > 20.0 ? z : log1p(exp(z)));
                sum += s[j];
            }
        for (int j = 0; j < k; j++) {
            const float g = wgot[c * k + j];
            if (!recomputed) {
                ck_assert_msg(memcmp(&g, &w[c * k + j], 4) == 0, "case %d: seq %d weight %d written: %g (was %g)",
                              ci, c, j, (double)g, (double)w[c * k + j]);
                continue;
            }
            const double e = s[j] / (sum + 1e-20) * 2.5;
            ck_assert_msg(fabs(g - e) <= 1e-5 * fabs(e) + 1e-7, "case %d: weight %d of expert %d: gpu %.9g, cpu %.9g",
                          ci, j, want[j], (double)g, e);
        }
    }
    *n_changed_rows += expect_change;
    *n_changed_gpu += cnt;
    cudaFree(d_sel), cudaFree(d_tgt), cudaFree(d_flag), cudaFree(d_cnt), cudaFree(d_w), cudaFree(d_lg);
    free(sel), free(tgt), free(want), free(got), free(w), free(wgot), free(lg), free(pool);
}

static const fcase cases[] = {
    /* k, range, route, own valid, shared, dump valid, repeat, flag */
    {4, 16, 0, 4, 4, 4, 0, 1},         /* the same set in another order: nothing moves */
    {4, 16, 0, 4, 3, 4, 0, 1},         /* one pick differs (the tiny golden's flip) */
    {4, 16, 0, 2, 1, 3, 1, 1},         /* partly -1 both sides, a repeat in the dump */
    {4, 16, 0, 4, 0, 4, 0, 0},         /* flag 0: untouched although all differ */
    {1, 5, 0, 1, 0, 1, 0, 1},          /* k = 1 */
    {512, 2051, 0, 512, 509, 512, 0, 1},
    {512, 900, 0, 300, 150, 400, 1, 1}, /* more dump ids than own ones */
    {1024, 4096, 0, 1024, 0, 1000, 0, 1},
    {3, 8, 1, 3, 3, 3, 0, 1},          /* route: same experts, weights untouched */
    {3, 8, 1, 3, 2, 3, 0, 1},          /* route: one expert differs, weights recomputed */
    {6, 32, 1, 6, 4, 6, 0, 1},
    {16, 256, 1, 16, 0, 16, 0, 1},
    {6, 32, 1, 6, 0, 6, 0, 0},         /* route, flag 0 */
};

START_TEST(follow_matches_cpu)
{
    int rows = 0, gpu = 0;
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) run_case(&cases[i], i, &rows, &gpu);
    ck_assert_int_eq(rows, gpu);
    ck_assert_int_ge(rows, 6); /* the cases exercise changes, not only no-ops */
}
END_TEST

START_TEST(launcher_checks)
{
    dsv4_follow_params p;
    memset(&p, 0, sizeof p);
    p.n_seq = 2, p.seq = 2, p.k = 4;
    ck_assert_int_ne(dsv4_opt_follow_topk(&p), 0); /* seq out of range, NULL buffers */
    p.seq = 0, p.k = 17;
    ck_assert_int_eq(dsv4_opt_follow_route(&p), DSV4_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(dsv4_last_error(), "follow_route"), "%s", dsv4_last_error());
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("kernel_follow");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, follow_matches_cpu);
    tcase_add_test(tc, launcher_checks);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
