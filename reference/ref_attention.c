/* ref_attention.c - the attention core of the reference (model-spec §6.5-§6.8, §9): sink attention of one
 * query over a gathered list of key=value rows, and the grouped output projection.
 *
 * Quiet traps:
 * - K = V: the same 512-d row (rope'd trailing channels included) is the key and the value; the caller
 *   de-rotates the output's rope channels afterwards (inverse RoPE at the query position).
 * - The sink is a per-head logit in the denominator only; it has no value row.
 * - Heads are grouped CONTIGUOUSLY for the output projection: group g = heads g·H/G .. (g+1)·H/G − 1, and it
 *   uses rows g·o_r .. (g+1)·o_r − 1 of wo_a.
 */
#include <cblas.h>
#include <math.h>

#include "ref_fault.h"
#include "ref_ops.h"

/* Fault ALT_ORDER (test builds only, ref_fault.h), a faithful second bf16 implementation: the online softmax of the
 * mma kernel, P rounded against the running maximum of 32-entry tiles, the accumulators rescaled when it grows. */
static void attention_bf16p_tiled(float *o, const float *s, const float *kv, int m, float sink, int d)
{
    float mx = -INFINITY, l = 0.0f;
    for (int i = 0; i < d; i++) o[i] = 0.0f;
    for (int t0 = 0; t0 < m; t0 += 32) {
        const int t1 = t0 + 32 < m ? t0 + 32 : m;
        float mt = mx;
        for (int j = t0; j < t1; j++)
            if (s[j] > mt) mt = s[j];
        if (mt > mx) {
            const float r = mx == -INFINITY ? 0.0f : expf(mx - mt);
            for (int i = 0; i < d; i++) o[i] *= r;
            l *= r;
            mx = mt;
        }
        for (int j = t0; j < t1; j++) {
            const float p = dsv4_bf16_to_f32(dsv4_f32_to_bf16(expf(s[j] - mx)));
            l += p;
            for (int i = 0; i < d; i++) o[i] += p * kv[(size_t)j * d + i];
        }
    }
    const float M = mx > sink ? mx : sink, wm = expf(mx - M), fct = wm / (l * wm + expf(sink - M));
    for (int i = 0; i < d; i++) o[i] *= fct;
}

void dsv4_ref_sink_attention(float *o, const float *q, const float *kv, int m, const float *sinks, int H, int d,
                             float *scores)
{
    float scale = 1.0f / sqrtf((float)d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, H, m, d, 1.0f, q, d, kv, d, 0.0f, scores, m);
    for (int h = 0; h < H; h++) {
        float *s = scores + (size_t)h * m;
        for (int j = 0; j < m; j++) s[j] *= scale;
        dsv4_ref_sink_softmax(s, s, m, sinks[h]);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, H, d, m, 1.0f, scores, m, kv, d, 0.0f, o, d);
}

void dsv4_ref_sink_attention_bf16p(float *o, const float *q, const float *kv, int m, const float *sinks, int H,
                                   int d, float *scores)
{
    float scale = 1.0f / sqrtf((float)d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, H, m, d, 1.0f, q, d, kv, d, 0.0f, scores, m);
    for (int h = 0; h < H; h++) {
        float *s = scores + (size_t)h * m;
        float mx = -INFINITY;
        for (int j = 0; j < m; j++) {
            s[j] *= scale;
            if (s[j] > mx) mx = s[j];
        }
        if (DSV4_FAULT(ALT_ORDER)) {
            attention_bf16p_tiled(o + (size_t)h * d, s, kv, m, sinks[h], d);
            continue;
        }
        /* sparse_attn.cu: p = bf16(e^{s - max}) enters P.V, and the denominator sums the ROUNDED p */
        float l = 0.0f;
        for (int j = 0; j < m; j++) {
            s[j] = dsv4_bf16_to_f32(dsv4_f32_to_bf16(expf(s[j] - mx)));
            l += s[j];
        }
        /* attn_final_factor: the sink enters the denominator in fp32 */
        float sink = sinks[h], M = mx > sink ? mx : sink, wm = expf(mx - M);
        float fct = wm / (l * wm + expf(sink - M));
        float *oh = o + (size_t)h * d;
        cblas_sgemv(CblasRowMajor, CblasTrans, m, d, 1.0f, kv, d, s, 1, 0.0f, oh, 1);
        for (int i = 0; i < d; i++) oh[i] *= fct;
    }
}

void dsv4_ref_grouped_out(float *out, float *z, const float *o, const float *wo_a, const float *wo_b, int S, int H,
                          int d, int G, int o_r, int D)
{
    int gin = H * d / G;
    for (int g = 0; g < G; g++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, o_r, gin, 1.0f, o + (size_t)g * gin, H * d,
                    wo_a + (size_t)g * o_r * gin, gin, 0.0f, z + (size_t)g * o_r, G * o_r);
    }
    dsv4_ref_linear(out, z, wo_b, S, G * o_r, D);
}
