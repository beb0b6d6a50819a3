/* ref_compressor.c - the KV compressors (model-spec §7): softmax-gated pooling of every r source tokens into
 * one compressed entry, as a per-token state machine (§7.6) that prefill and decode both drive, so the two
 * agree by construction.
 *
 * Quiet traps:
 * - The window closes AT the token p with (p+1) mod r == 0, inside that token's forward: the query at p already
 *   sees the new entry (w = p div r). A partial window is never pooled.
 * - ape (position_bias) is indexed by the slot inside the window, p mod r, and is added to the gate only.
 * - CSA overlap (overlap = 1): each token's projection has an "a" half [0, d_c) and a "b" half [d_c, 2·d_c).
 *   Entry w pools the a-halves of window w−1 (state rows 0..r−1) with the b-halves of window w (rows r..2r−1),
 *   one softmax over the 2r gate values per channel. For w = 0 the a-rows are empty (gate −∞, weight 0).
 *   After a close, the current rows move to the previous rows.
 * - The entry is RMSNorm'd and then rope'd at position r·w, the FIRST source position of its window.
 */
#include <math.h>
#include <string.h>

#include "ref_fault.h"
#include "ref_ops.h"

size_t dsv4_ref_compressor_state_floats(int ratio, int d_c, int overlap)
{
    size_t rows = (size_t)(overlap ? 2 : 1) * ratio, width = (size_t)(overlap ? 2 : 1) * d_c;
    return 2 * rows * width;
}

void dsv4_ref_compressor_init(dsv4_ref_compressor *c, int ratio, int d_c, int overlap, float *mem)
{
    c->ratio = ratio;
    c->d_c = d_c;
    c->overlap = overlap;
    c->width = (overlap ? 2 : 1) * d_c;
    c->rows = (overlap ? 2 : 1) * ratio;
    size_t n = (size_t)c->rows * c->width;
    c->kv = mem;
    c->score = mem + n;
    memset(c->kv, 0, n * sizeof(float));
    for (size_t i = 0; i < n; i++) c->score[i] = -INFINITY;
}

int dsv4_ref_compressor_push(dsv4_ref_compressor *c, int64_t p, const float *kv_p, const float *gate_p,
                             const float *ape, float *entry)
{
    int r = c->ratio, W = c->width, dc = c->d_c;
    int slot = (int)(p % r);
    int row = c->overlap ? r + slot : slot;
    float *kv = c->kv + (size_t)row * W, *sc = c->score + (size_t)row * W;
    /* fault COMPRESSOR_APE (test builds only, ref_fault.h): the bias of the next slot */
    const float *bias = ape + (size_t)(DSV4_FAULT(COMPRESSOR_APE) ? (slot + 1) % r : slot) * W;
    for (int i = 0; i < W; i++) {
        kv[i] = kv_p[i];
        sc[i] = gate_p[i] + bias[i];
    }
    if ((p + 1) % r != 0) return 0;

    int n_slots = c->overlap ? 2 * r : r;
    for (int ch = 0; ch < dc; ch++) {
        /* slot i < r reads channel ch of row i (a-half when overlapping); slot i >= r reads row i, channel
         * dc + ch (b-half). Without overlap every slot reads channel ch of row i. */
        float mx = -INFINITY;
        for (int i = 0; i < n_slots; i++) {
            int col = (c->overlap && i >= r) ? dc + ch : ch;
            float g = c->score[(size_t)i * W + col];
            if (g > mx) mx = g;
        }
        float sum = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            int col = (c->overlap && i >= r) ? dc + ch : ch;
            sum += expf(c->score[(size_t)i * W + col] - mx);
        }
        float acc = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            int col = (c->overlap && i >= r) ? dc + ch : ch;
            float wgt = expf(c->score[(size_t)i * W + col] - mx) / sum;
            acc += c->kv[(size_t)i * W + col] * wgt;
        }
        entry[ch] = acc;
    }
    if (c->overlap) {
        memcpy(c->kv, c->kv + (size_t)r * W, (size_t)r * W * sizeof(float));
        memcpy(c->score, c->score + (size_t)r * W, (size_t)r * W * sizeof(float));
    }
    return 1;
}

void dsv4_ref_compressor_finish(float *entry, int d_c, const float *norm_w, float eps, int n_pairs,
                                const float *cos_v, const float *sin_v)
{
    dsv4_ref_rmsnorm(entry, entry, norm_w, d_c, eps);
    dsv4_ref_rope_apply(entry, d_c, n_pairs, cos_v, sin_v, 0);
}
