/* ref_mhc.c - manifold-constrained hyper-connections (model-spec §5): pre (collapse + coefficients with
 * Sinkhorn), post (expand + mix) and the final hc_head collapse, all fp32.
 *
 * FOUR PLACES THIS GOES WRONG QUIETLY:
 * 1. Sinkhorn: one row softmax (+eps), then ONE column normalisation, then (iters-1) x (row, column); it ends on
 *    a column step, so columns sum to ~1 exactly and rows only approximately.
 * 2. comb[j][k] (row-major, m[2n + j·n + k]) is the weight FROM source stream j TO destination stream k:
 *    X'[k] = post[k]·out + Σ_j comb[j][k]·X[j] (the sum runs over the FIRST index; comb is not symmetric).
 * 3. pre = sigmoid(..) + hc_eps, but post = 2·sigmoid(..) with no eps.
 * 4. The RMS is taken over the whole flattened n·D vector (all streams together), without a weight.
 */
#include <cblas.h>
#include <math.h>

#include "ref_ops.h"

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

void dsv4_ref_hc_sinkhorn(float *c, int n, int iters, float eps)
{
    for (int j = 0; j < n; j++) { /* row softmax */
        float *row = c + j * n;
        float mx = row[0];
        for (int k = 1; k < n; k++)
            if (row[k] > mx) mx = row[k];
        float sum = 0.0f;
        for (int k = 0; k < n; k++) {
            row[k] = expf(row[k] - mx);
            sum += row[k];
        }
        for (int k = 0; k < n; k++) row[k] = row[k] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            for (int j = 0; j < n; j++) {
                float s = 0.0f;
                for (int k = 0; k < n; k++) s += c[j * n + k];
                for (int k = 0; k < n; k++) c[j * n + k] /= s + eps;
            }
        }
        for (int k = 0; k < n; k++) {
            float s = 0.0f;
            for (int j = 0; j < n; j++) s += c[j * n + k];
            for (int j = 0; j < n; j++) c[j * n + k] /= s + eps;
        }
    }
}

/* vn [n·D] = flatten(X) / rms(flatten(X)) */
static void hc_flat_norm(const float *X, int nD, float norm_eps, float *vn)
{
    dsv4_ref_rmsnorm(vn, X, NULL, nD, norm_eps);
}

void dsv4_ref_hc_pre(const dsv4_ref_hc_params *hp, const float *X, int n, int D, int iters, float hc_eps,
                     float norm_eps, float *pre, float *post, float *comb, float *x, float *vn, float *mix)
{
    int n_mix = (2 + n) * n;
    hc_flat_norm(X, n * D, norm_eps, vn);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n_mix, n * D, 1.0f, hp->fn, n * D, vn, 1, 0.0f, mix, 1);
    for (int j = 0; j < n; j++) {
        pre[j] = sigmoidf(mix[j] * hp->scale[0] + hp->base[j]) + hc_eps;
        post[j] = 2.0f * sigmoidf(mix[n + j] * hp->scale[1] + hp->base[n + j]);
    }
    for (int i = 0; i < n * n; i++) comb[i] = mix[2 * n + i] * hp->scale[2] + hp->base[2 * n + i];
    dsv4_ref_hc_sinkhorn(comb, n, iters, hc_eps);
    for (int d = 0; d < D; d++) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += pre[j] * X[j * D + d];
        x[d] = acc;
    }
}

void dsv4_ref_hc_post(float *Xo, const float *X, const float *out, const float *post, const float *comb, int n,
                      int D)
{
    for (int k = 0; k < n; k++) {
        for (int d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int j = 0; j < n; j++) acc += comb[j * n + k] * X[j * D + d];
            Xo[k * D + d] = post[k] * out[d] + acc;
        }
    }
}

void dsv4_ref_hc_head(const float *fn, const float *base, const float *scale, const float *X, int n, int D,
                      float hc_eps, float norm_eps, float *y, float *vn)
{
    float m[16], pre[16]; /* n <= 16: checked when the model is bound */
    hc_flat_norm(X, n * D, norm_eps, vn);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, n * D, 1.0f, fn, n * D, vn, 1, 0.0f, m, 1);
    for (int j = 0; j < n; j++) pre[j] = sigmoidf(m[j] * scale[0] + base[j]) + hc_eps;
    for (int d = 0; d < D; d++) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += pre[j] * X[j * D + d];
        y[d] = acc;
    }
}
