/* ref_moe.c - the MoE of the reference (model-spec §10): router (sqrtsoftplus scores, bias-corrected top-k or
 * hash routing from tid2eid) and one clamped-SwiGLU expert.
 *
 * Quiet traps:
 * - The correction bias (noaux_tc) only SELECTS experts; the weights are the plain scores of the selected
 *   experts, normalised to sum 1 (+1e-20 like transformers) and times routed_scaling_factor.
 * - Hash layers select by tid2eid[token] and still weight by the learned gate's scores.
 * - No expert groups (no n_group / topk_group).
 * - SwiGLU: gate clamped from above only, up clamped on both sides, for routed AND shared experts.
 */
#include <stddef.h>

#include "ref_ops.h"

void dsv4_ref_route(const float *logits, int E, int k, const float *bias, const int32_t *hash_ids,
                    float routed_scale, int32_t *ids, float *weights, float *s_scratch)
{
    for (int e = 0; e < E; e++) s_scratch[e] = dsv4_ref_sqrtsoftplus(logits[e]);
    if (bias) {
        /* s_scratch holds the selection key s + bias for the top-k, then the plain scores again */
        for (int e = 0; e < E; e++) s_scratch[e] += bias[e];
        dsv4_ref_topk(s_scratch, E, k, ids);
        for (int e = 0; e < E; e++) s_scratch[e] = dsv4_ref_sqrtsoftplus(logits[e]);
    } else {
        for (int j = 0; j < k; j++) ids[j] = hash_ids[j];
    }
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        weights[j] = s_scratch[ids[j]];
        sum += weights[j];
    }
    for (int j = 0; j < k; j++) weights[j] = weights[j] / (sum + 1e-20f) * routed_scale;
}

void dsv4_ref_expert(float *y, const float *x, const float *w1, const float *w3, const float *w2, int S, int D,
                     int inter, float limit, float *g, float *u)
{
    dsv4_ref_linear(g, x, w1, S, D, inter);
    dsv4_ref_linear(u, x, w3, S, D, inter);
    dsv4_ref_swiglu(g, g, u, S * inter, limit);
    dsv4_ref_linear(y, g, w2, S, inter, D);
}
