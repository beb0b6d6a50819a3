/* ref_indexer.c - the lightning indexer of CSA layers (model-spec §8): index scores of one query over the
 * indexer key pool, and the top-k selection with transformers' causality rules.
 *
 * Quiet traps:
 * - ω can be negative, so scores can be negative; if every head's ReLU is 0 the score is exactly 0 (ties).
 * - The two scalars: d_I^-½ on the ReLU'd dot products and H_I^-½ on the head weights.
 * - k = min(index_topk, entries in the pool), not min(index_topk, visible entries): during a prefill the
 *   pool holds the whole prompt's entries; entries a query may not see get −∞ and any pick landing on one
 *   becomes −1. In decode the pool is exactly the visible set, so every pick is valid.
 * - Ties: the reference keeps equal scores in ascending entry order (dsv4_ref_topk); torch.topk's order is
 *   unspecified, so selections are compared as sets and ties judged by score.
 */
#include <cblas.h>
#include <math.h>

#include "ref_ops.h"

void dsv4_ref_index_scores(float *score, const float *qI, const float *keys, int n, const float *wraw, int H_I,
                           int d_I, float *dots)
{
    if (n <= 0) return;
    float s_scale = 1.0f / sqrtf((float)d_I);
    float w_scale = 1.0f / sqrtf((float)H_I);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, H_I, n, d_I, 1.0f, qI, d_I, keys, d_I, 0.0f, dots, n);
    for (int w = 0; w < n; w++) score[w] = 0.0f;
    for (int h = 0; h < H_I; h++) {
        float wh = wraw[h] * w_scale;
        const float *dr = dots + (size_t)h * n;
        for (int w = 0; w < n; w++) {
            float v = dr[w] > 0.0f ? dr[w] : 0.0f;
            score[w] += (v * s_scale) * wh;
        }
    }
}

int dsv4_ref_index_select(float *score, int n_pool, int n_visible, int topk, int32_t *idx)
{
    int k = topk < n_pool ? topk : n_pool;
    if (k <= 0) return 0;
    for (int w = n_visible; w < n_pool; w++) score[w] = -INFINITY;
    dsv4_ref_topk(score, n_pool, k, idx);
    for (int i = 0; i < k; i++)
        if (idx[i] >= n_visible) idx[i] = -1;
    return k;
}
