/* ref_ops.c - fp32 primitives of the reference (model-spec §3): linear, RMSNorm, RoPE tables (plain and YaRN)
 * and their application, sink softmax, clamped SwiGLU, sqrtsoftplus, top-k.
 *
 * Quiet traps:
 * - RoPE rotates interleaved PAIRS (c, c+1) of the TRAILING rope channels, not halves and not the leading
 *   channels (transformers' docstring says "first"; its code takes the trailing slice).
 * - The angle is pos·θ_i formed in fp32 as transformers does; θ comes from fp32 pow like torch.
 * - YaRN: lo/hi are floor/ceil of the correction dims computed with original_max_position_embeddings; no
 *   magnitude (mscale) factor multiplies cos/sin.
 * - SwiGLU clamps the gate from above only and the up projection on both sides.
 * - The sink enlarges the softmax denominator and has no value row.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "ref_fault.h"
#include "ref_ops.h"

void dsv4_ref_linear(float *y, const float *x, const float *w, int S, int n_in, int n_out)
{
    if (DSV4_FAULT(ALT_ORDER) && n_in >= 2) { /* test builds only (ref_fault.h): the inputs summed in two halves */
        const int h = n_in / 2;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, n_out, h, 1.0f, x, n_in, w, n_in, 0.0f, y, n_out);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, n_out, n_in - h, 1.0f, x + h, n_in, w + h, n_in, 1.0f,
                    y, n_out);
        return;
    }
    if (S == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n_out, n_in, 1.0f, w, n_in, x, 1, 0.0f, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, n_out, n_in, 1.0f, x, n_in, w, n_in, 0.0f, y,
                    n_out);
}

void dsv4_ref_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float var = (float)(ss / n);
    float r = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < n; i++) {
        float v = x[i] * r;
        y[i] = w ? w[i] * v : v;
    }
}

void dsv4_ref_rope_cos_sin(const float *inv_freq, int n_pairs, int64_t pos, float *cos_out, float *sin_out)
{
    float p = (float)pos;
    for (int i = 0; i < n_pairs; i++) {
        float a = inv_freq[i] * p;
        cos_out[i] = (float)cos((double)a);
        sin_out[i] = (float)sin((double)a);
    }
}

void dsv4_ref_rope_apply(float *x, int dim, int n_pairs, const float *cos_v, const float *sin_v, int inverse)
{
    float *r = x + dim - 2 * n_pairs;
    for (int i = 0; i < n_pairs; i++) {
        float c = cos_v[i], s = inverse ? -sin_v[i] : sin_v[i];
        float x0 = r[2 * i], x1 = r[2 * i + 1];
        r[2 * i] = x0 * c + (-x1) * s;
        r[2 * i + 1] = x1 * c + x0 * s;
    }
}

void dsv4_ref_sink_softmax(float *p, const float *s, int m, float sink)
{
    float mx = sink;
    for (int j = 0; j < m; j++)
        if (s[j] > mx) mx = s[j];
    double sum = exp((double)(sink - mx));
    for (int j = 0; j < m; j++) {
        float e = expf(s[j] - mx);
        p[j] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < m; j++) p[j] *= inv;
}

void dsv4_ref_swiglu(float *h, const float *g, const float *u, int n, float limit)
{
    for (int i = 0; i < n; i++) {
        float gi = g[i] > limit ? limit : g[i];
        float ui = u[i] > limit ? limit : (u[i] < -limit ? -limit : u[i]);
        float silu = gi / (1.0f + expf(-gi));
        h[i] = silu * ui;
    }
}

float dsv4_ref_sqrtsoftplus(float z)
{
    float sp = z > 20.0f ? z : log1pf(expf(z));
    return sqrtf(sp);
}

/* NaN ranks last, below -inf; never above a real score. */
static float topk_key(float s) { return s != s ? -INFINITY : s; }

void dsv4_ref_topk(const float *score, int n, int k, int32_t *idx)
{
    int have = 0;
    for (int i = 0; i < n; i++) {
        float s = topk_key(score[i]);
        /* strictly greater only: an equal score arriving later (higher index) stays behind */
        if (have == k && !(s > topk_key(score[idx[k - 1]]))) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && s > topk_key(score[idx[j - 1]])) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
}
