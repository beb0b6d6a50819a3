/* test_ref_ops.c - one test per quiet trap of the reference ops (style rule 14), on hand-built cases:
 * mHC (Sinkhorn ends on a column step, comb orientation in post, pre eps vs post 2·sigmoid, RMS over all
 * streams), RoPE (interleaved pairs on the trailing channels, inverse), the YaRN table of the Flash config,
 * the sink softmax, clamped SwiGLU, sqrtsoftplus routing with the bias selecting only, hash routing, top-k tie
 * order, the indexer's causal selection, and the compressor state machine (window closing at the step, ape by
 * slot, CSA a/b halves). Each gate also checks that a deliberately wrong variant would fail it. Then the
 * BLAS-backed ops (linear, sink attention, grouped output) against naive double loops at sizes 1, 17, 31, 257,
 * outputs NaN-poisoned first.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/ref_ops.h"
#include "dsv4_test.h"

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ------------------------------------------------------------------------------------------- mHC */

static void naive_rows(double *c, int n, double eps)
{
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int k = 0; k < n; k++) s += c[j * n + k];
        for (int k = 0; k < n; k++) c[j * n + k] /= s + eps;
    }
}

static void naive_cols(double *c, int n, double eps)
{
    for (int k = 0; k < n; k++) {
        double s = 0;
        for (int j = 0; j < n; j++) s += c[j * n + k];
        for (int j = 0; j < n; j++) c[j * n + k] /= s + eps;
    }
}

/* Sinkhorn in double as model-spec §5.1 words it; extra_row = 1 is the wrong variant ending on a row step. */
static void naive_sinkhorn(double *c, int n, int iters, double eps, int extra_row)
{
    for (int j = 0; j < n; j++) {
        double mx = c[j * n], s = 0;
        for (int k = 1; k < n; k++) mx = fmax(mx, c[j * n + k]);
        for (int k = 0; k < n; k++) s += exp(c[j * n + k] - mx);
        for (int k = 0; k < n; k++) c[j * n + k] = exp(c[j * n + k] - mx) / s + eps;
    }
    naive_cols(c, n, eps);
    for (int it = 1; it < iters; it++) {
        naive_rows(c, n, eps);
        naive_cols(c, n, eps);
    }
    if (extra_row) naive_rows(c, n, eps);
}

START_TEST(test_sinkhorn_ends_on_column_step)
{
    const float logits[16] = {0.3f, -1.2f, 2.0f, 0.1f, 1.5f, 0.2f, -0.7f, 0.9f,
                              -0.4f, 0.8f, 0.05f, -2.0f, 1.1f, -0.3f, 0.6f, 0.0f};
    for (int iters = 1; iters <= 20; iters += 19) {
        float c[16];
        double ref[16], wrong[16];
        for (int i = 0; i < 16; i++) c[i] = logits[i], ref[i] = wrong[i] = logits[i];
        dsv4_ref_hc_sinkhorn(c, 4, iters, 1e-6f);
        naive_sinkhorn(ref, 4, iters, 1e-6, 0);
        for (int i = 0; i < 16; i++) ck_assert_msg(fabs(c[i] - ref[i]) < 1e-6, "iters %d c[%d] %g vs %g", iters, i, c[i], ref[i]);
        for (int k = 0; k < 4; k++) {
            double s = 0;
            for (int j = 0; j < 4; j++) s += c[j * 4 + k];
            ck_assert_msg(fabs(s - 1.0) < 1e-5, "column %d sums to %.9f after the last (column) step", k, s);
        }
        if (iters == 1) {
            /* the gate can fail: ending on a row step leaves columns visibly off 1 */
            naive_sinkhorn(wrong, 4, iters, 1e-6, 1);
            double worst = 0;
            for (int k = 0; k < 4; k++) {
                double s = 0;
                for (int j = 0; j < 4; j++) s += wrong[j * 4 + k];
                worst = fmax(worst, fabs(s - 1.0));
            }
            ck_assert_msg(worst > 1e-3, "row-ending variant not distinguishable (%g)", worst);
        }
    }
}
END_TEST

START_TEST(test_hc_post_comb_orientation)
{
    /* comb[j][k] = weight from source stream j to destination k. A non-symmetric hand case:
     * comb[0][1] = 1 (stream 0 -> 1), comb[1][2] = 1, comb[2][3] = 1, comb[3][0] = 0.5, comb[3][3] = 0.5. */
    enum { n = 4, D = 3 };
    float comb[16] = {0};
    comb[0 * 4 + 1] = 1.0f;
    comb[1 * 4 + 2] = 1.0f;
    comb[2 * 4 + 3] = 1.0f;
    comb[3 * 4 + 0] = 0.5f;
    comb[3 * 4 + 3] = 0.5f;
    float X[n * D] = {1, 2, 3, 10, 20, 30, 100, 200, 300, 1000, 2000, 3000};
    float out[D] = {0.5f, -1.0f, 2.0f}, post[n] = {0.1f, 0.2f, 0.3f, 0.4f};
    float Xo[n * D];
    dsv4_test_poison_f32(Xo, n * D);
    dsv4_ref_hc_post(Xo, X, out, post, comb, n, D);
    /* by hand: X'[0] = 0.1·out + 0.5·X[3]; X'[1] = 0.2·out + X[0]; X'[2] = 0.3·out + X[1];
     * X'[3] = 0.4·out + X[2] + 0.5·X[3] */
    float expect[n * D];
    for (int d = 0; d < D; d++) {
        expect[0 * D + d] = 0.1f * out[d] + 0.5f * X[3 * D + d];
        expect[1 * D + d] = 0.2f * out[d] + X[0 * D + d];
        expect[2 * D + d] = 0.3f * out[d] + X[1 * D + d];
        expect[3 * D + d] = 0.4f * out[d] + X[2 * D + d] + 0.5f * X[3 * D + d];
    }
    for (int i = 0; i < n * D; i++) ck_assert_msg(fabsf(Xo[i] - expect[i]) < 1e-4f, "X'[%d] %g vs %g", i, Xo[i], expect[i]);
    /* the gate can fail: the transposed comb gives X'[1] = 0.2·out + X[2] */
    float combT[16], Xt[n * D];
    for (int j = 0; j < 4; j++)
        for (int k = 0; k < 4; k++) combT[k * 4 + j] = comb[j * 4 + k];
    dsv4_ref_hc_post(Xt, X, out, post, combT, n, D);
    ck_assert(fabsf(Xt[1 * D] - expect[1 * D]) > 1.0f);
}
END_TEST

START_TEST(test_hc_pre_eps_post_sigmoid_and_flat_rms)
{
    enum { n = 4, D = 5, MIX = (2 + n) * n };
    float fn[MIX * n * D], base[MIX], scale[3] = {0.7f, 1.3f, 0.9f};
    memset(fn, 0, sizeof fn);
    for (int i = 0; i < MIX; i++) base[i] = 0.1f * (float)(i % 7) - 0.3f;
    /* mix_0 reads element 0 of stream 0, mix_5 (post_1) reads element 2 of stream 3 */
    fn[0 * n * D + 0] = 1.0f;
    fn[5 * n * D + 3 * D + 2] = 2.0f;
    float X[n * D];
    for (int j = 0; j < n; j++)
        for (int d = 0; d < D; d++) X[j * D + d] = (float)(j + 1) * (0.5f + 0.25f * d) * (d % 2 ? -1.0f : 1.0f);
    double ss = 0;
    for (int i = 0; i < n * D; i++) ss += (double)X[i] * X[i];
    double rho = 1.0 / sqrt(ss / (n * D) + 1e-6); /* ONE rms over all streams */
    const float hc_eps = 0.25f; /* large so that pre's +eps is visible */
    dsv4_ref_hc_params hp = {fn, base, scale};
    float pre[n], post[n], comb[n * n], x[D], vn[n * D], mix[MIX];
    dsv4_test_poison_f32(pre, n);
    dsv4_test_poison_f32(post, n);
    dsv4_test_poison_f32(x, D);
    dsv4_ref_hc_pre(&hp, X, n, D, 20, hc_eps, 1e-6f, pre, post, comb, x, vn, mix);
    double m0 = rho * X[0], m5 = rho * 2.0 * X[3 * D + 2];
    ck_assert_msg(fabs(pre[0] - (sigm(scale[0] * m0 + base[0]) + hc_eps)) < 1e-6, "pre[0] %g", pre[0]);
    for (int j = 1; j < n; j++) ck_assert_msg(fabs(pre[j] - (sigm(base[j]) + hc_eps)) < 1e-6, "pre[%d]", j);
    ck_assert_msg(fabs(post[1] - 2.0 * sigm(scale[1] * m5 + base[5])) < 1e-6, "post[1] %g", post[1]);
    for (int j = 0; j < n; j++)
        if (j != 1) ck_assert_msg(fabs(post[j] - 2.0 * sigm(base[n + j])) < 1e-6, "post[%d] has no eps", j);
    for (int d = 0; d < D; d++) {
        double e = 0;
        for (int j = 0; j < n; j++) e += pre[j] * X[j * D + d];
        ck_assert_msg(fabs(x[d] - e) < 1e-5, "collapsed x[%d]", d);
    }
    /* the gate can fail: a per-stream rms (stream 0 only) changes pre[0] */
    double ss0 = 0;
    for (int d = 0; d < D; d++) ss0 += (double)X[d] * X[d];
    double rho0 = 1.0 / sqrt(ss0 / D + 1e-6);
    ck_assert(fabs(sigm(scale[0] * rho0 * X[0] + base[0]) - sigm(scale[0] * m0 + base[0])) > 1e-3);
}
END_TEST

START_TEST(test_hc_head)
{
    /* model-spec 5.3: m = rho * (fn . flatten(X)), rho ONE rms over all streams; pre_j = sigmoid(scale * m_j +
     * base_j) + hc_eps; y = sum_j pre_j X[j]. A non-zero fn, a scale != 1 and a large hc_eps, so that each term is
     * visible in y (with fn = 0 and hc_eps 1e-6 only the base was). */
    enum { n = 4, D = 3 };
    float fn[n * n * D] = {0}, base[n] = {0.5f, -0.5f, 1.0f, 0.0f}, scale[1] = {2.0f};
    float X[n * D] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, y[D], vn[n * D];
    fn[0 * n * D + 0] = 1.0f;          /* m_0 reads stream 0 element 0 */
    fn[1 * n * D + 3 * D + 2] = -0.5f; /* m_1 reads stream 3 element 2 */
    fn[2 * n * D + 1 * D + 1] = 0.25f; /* m_2 reads stream 1 element 1 */
    const float hc_eps = 0.25f;
    double ss = 0;
    for (int i = 0; i < n * D; i++) ss += (double)X[i] * X[i];
    const double rho = 1.0 / sqrt(ss / (n * D) + 1e-6);
    double pre[n];
    for (int j = 0; j < n; j++) {
        double m = 0;
        for (int i = 0; i < n * D; i++) m += (double)fn[j * n * D + i] * X[i];
        pre[j] = sigm(scale[0] * rho * m + base[j]) + hc_eps;
    }
    dsv4_test_poison_f32(y, D);
    dsv4_ref_hc_head(fn, base, scale, X, n, D, hc_eps, 1e-6f, y, vn);
    for (int d = 0; d < D; d++) {
        double e = 0;
        for (int j = 0; j < n; j++) e += pre[j] * X[j * D + d];
        ck_assert_msg(fabs(y[d] - e) < 1e-5 * fabs(e), "hc_head y[%d] %.9g vs %.9g", d, y[d], e);
    }
    /* the gate can fail: without hc_eps, the scale, or the projection y[0] moves by far more than the tolerance */
    double no_eps = 0, no_scale = 0, no_fn = 0;
    for (int j = 0; j < n; j++) {
        double m = 0;
        for (int i = 0; i < n * D; i++) m += (double)fn[j * n * D + i] * X[i];
        no_eps += (pre[j] - hc_eps) * X[j * D];
        no_scale += (sigm(rho * m + base[j]) + hc_eps) * X[j * D];
        no_fn += (sigm(base[j]) + hc_eps) * X[j * D];
    }
    ck_assert(fabs(no_eps - y[0]) > 1e-2 && fabs(no_scale - y[0]) > 1e-2 && fabs(no_fn - y[0]) > 1e-2);
}
END_TEST

/* ------------------------------------------------------------------------------------------ RoPE */

START_TEST(test_rope_trailing_interleaved_pairs_and_inverse)
{
    enum { dim = 10, np = 2 };
    float inv[np] = {0.5f, 0.125f}, cs[np], sn[np];
    dsv4_ref_rope_cos_sin(inv, np, 3, cs, sn);
    float x[dim], x0[dim];
    for (int i = 0; i < dim; i++) x[i] = x0[i] = (float)(i + 1);
    dsv4_ref_rope_apply(x, dim, np, cs, sn, 0);
    for (int i = 0; i < 6; i++) ck_assert_msg(x[i] == x0[i], "leading channel %d touched", i);
    /* pair (6,7) at angle 1.5, pair (8,9) at angle 0.375, as complex multiplications */
    double a0 = 1.5, a1 = 0.375;
    ck_assert(fabs(x[6] - (7 * cos(a0) - 8 * sin(a0))) < 1e-5);
    ck_assert(fabs(x[7] - (7 * sin(a0) + 8 * cos(a0))) < 1e-5);
    ck_assert(fabs(x[8] - (9 * cos(a1) - 10 * sin(a1))) < 1e-5);
    ck_assert(fabs(x[9] - (9 * sin(a1) + 10 * cos(a1))) < 1e-5);
    /* the gate can fail: rotate-half pairing (6,8),(7,9) would give another x[6] */
    ck_assert(fabs((7 * cos(a0) - 9 * sin(a0)) - x[6]) > 0.1);
    dsv4_ref_rope_apply(x, dim, np, cs, sn, 1);
    for (int i = 0; i < dim; i++) ck_assert_msg(fabsf(x[i] - x0[i]) < 1e-5f, "inverse RoPE channel %d: %g", i, x[i]);
}
END_TEST

START_TEST(test_rope_tables_flash)
{
    dsv4_rope_params main_t = {.theta = 10000.0, .yarn = 0};
    dsv4_rope_params cmp_t = {.theta = 160000.0, .yarn = 1, .factor = 16.0, .original_max_position_embeddings = 65536,
                              .beta_fast = 32.0, .beta_slow = 1.0};
    int lo, hi;
    dsv4_rope_yarn_range(&cmp_t, 64, &lo, &hi);
    ck_assert_int_eq(lo, 15);
    ck_assert_int_eq(hi, 25);
    float im[32], ic[32];
    dsv4_rope_inv_freq(&main_t, 64, im);
    dsv4_rope_inv_freq(&cmp_t, 64, ic);
    for (int i = 0; i < 32; i++) {
        double t_main = pow(10000.0, -2.0 * i / 64), t0 = pow(160000.0, -2.0 * i / 64);
        double ramp = fmin(fmax((i - 15.0) / 10.0, 0.0), 1.0);
        double t_cmp = t0 * ramp / 16.0 + t0 * (1.0 - ramp);
        ck_assert_msg(fabs(im[i] - t_main) <= 2e-7 * t_main, "main theta[%d] %g vs %g", i, im[i], t_main);
        ck_assert_msg(fabs(ic[i] - t_cmp) <= 2e-7 * t_cmp, "compress theta[%d] %g vs %g", i, ic[i], t_cmp);
    }
    /* below lo untouched, above hi divided by the factor */
    ck_assert(fabs(ic[10] - pow(160000.0, -20.0 / 64)) < 1e-7 * ic[10] + 1e-12);
    ck_assert(fabs(ic[30] * 16.0 - pow(160000.0, -60.0 / 64)) < 1e-6 * ic[30] * 16.0);
}
END_TEST

/* ---------------------------------------------------------------------- softmax, SwiGLU, routing */

START_TEST(test_sink_softmax)
{
    float s[3] = {1.0f, 2.0f, -0.5f}, p[3];
    dsv4_ref_sink_softmax(p, s, 3, 0.7f);
    double den = exp(1.0) + exp(2.0) + exp(-0.5) + exp(0.7);
    for (int j = 0; j < 3; j++) ck_assert_msg(fabs(p[j] - exp(s[j]) / den) < 1e-6, "p[%d]", j);
    ck_assert(p[0] + p[1] + p[2] < 0.9f); /* the sink takes its share and returns no value */
    float big[2] = {80.0f, 81.0f}; /* no overflow with large logits */
    dsv4_ref_sink_softmax(big, big, 2, -1e30f);
    ck_assert(fabs(big[1] - 1.0 / (1.0 + exp(-1.0))) < 1e-6);
}
END_TEST

START_TEST(test_swiglu_clamps)
{
    float g[4] = {20.0f, -20.0f, 1.0f, 3.0f}, u[4] = {1.0f, 1.0f, 20.0f, -20.0f}, h[4];
    dsv4_ref_swiglu(h, g, u, 4, 10.0f);
    double silu10 = 10.0 / (1.0 + exp(-10.0));
    ck_assert(fabs(h[0] - silu10) < 1e-5);                           /* gate clamped at +10 */
    ck_assert(fabs(h[1] - (-20.0 / (1.0 + exp(20.0)))) < 1e-9);      /* no lower gate clamp */
    ck_assert(fabs(h[2] - 10.0 / (1.0 + exp(-1.0))) < 1e-5);         /* up clamped at +10 */
    ck_assert(fabs(h[3] - (-10.0) * 3.0 / (1.0 + exp(-3.0))) < 1e-4); /* up clamped at -10 */
    /* the gate can fail: a symmetric gate clamp would make h[1] = silu(-10) = -4.5e-4 */
    ck_assert(fabs(h[1] - (-10.0 / (1.0 + exp(10.0)))) > 1e-4);
}
END_TEST

START_TEST(test_route_bias_selects_only)
{
    float logits[4] = {2.0f, 1.0f, -1.0f, 0.5f}, bias[4] = {0.0f, 0.0f, 5.0f, 0.0f}, s[4], w[2];
    int32_t ids[2];
    dsv4_ref_route(logits, 4, 2, bias, NULL, 1.5f, ids, w, s);
    double sc[4];
    for (int e = 0; e < 4; e++) sc[e] = sqrt(log1p(exp(logits[e])));
    /* s + bias ranks expert 2 first (bias), then expert 0 */
    ck_assert_int_eq(ids[0], 2);
    ck_assert_int_eq(ids[1], 0);
    double sum = sc[2] + sc[0];
    ck_assert_msg(fabs(w[0] - sc[2] / sum * 1.5) < 1e-6, "weight uses the plain score, not s+bias: %g", w[0]);
    ck_assert(fabs(w[1] - sc[0] / sum * 1.5) < 1e-6);
    /* the gate can fail: weights from s + bias would differ */
    ck_assert(fabs((sc[2] + 5.0) / (sum + 5.0) * 1.5 - w[0]) > 0.1);
    ck_assert(fabs(dsv4_ref_sqrtsoftplus(30.0f) - sqrt(30.0)) < 1e-5); /* threshold branch */
}
END_TEST

START_TEST(test_route_hash)
{
    float logits[4] = {2.0f, 1.0f, -1.0f, 0.5f}, s[4], w[2];
    int32_t hash[2] = {3, 1}, ids[2];
    dsv4_ref_route(logits, 4, 2, NULL, hash, 1.5f, ids, w, s);
    ck_assert_int_eq(ids[0], 3);
    ck_assert_int_eq(ids[1], 1);
    double s3 = sqrt(log1p(exp(0.5))), s1 = sqrt(log1p(exp(1.0)));
    ck_assert(fabs(w[0] - s3 / (s3 + s1) * 1.5) < 1e-6);
    ck_assert(fabs(w[1] - s1 / (s3 + s1) * 1.5) < 1e-6);
}
END_TEST

START_TEST(test_topk_tie_order)
{
    float s[5] = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
    int32_t idx[5];
    dsv4_ref_topk(s, 5, 2, idx);
    ck_assert_int_eq(idx[0], 1);
    ck_assert_int_eq(idx[1], 2);
    dsv4_ref_topk(s, 5, 4, idx);
    ck_assert_int_eq(idx[2], 4);
    ck_assert_int_eq(idx[3], 3);
    float t[4] = {-INFINITY, 0.0f, -INFINITY, 0.0f};
    dsv4_ref_topk(t, 4, 4, idx);
    ck_assert_int_eq(idx[0], 1);
    ck_assert_int_eq(idx[1], 3);
    ck_assert_int_eq(idx[2], 0);
    ck_assert_int_eq(idx[3], 2);
}
END_TEST

START_TEST(test_index_select_causal)
{
    /* pool of 5 entries, query sees 2: k = min(4, 5) = 4 picks, two of them -1 */
    float sc[5] = {0.5f, 1.5f, 9.0f, 8.0f, 7.0f};
    int32_t idx[4];
    int k = dsv4_ref_index_select(sc, 5, 2, 4, idx);
    ck_assert_int_eq(k, 4);
    ck_assert_int_eq(idx[0], 1);
    ck_assert_int_eq(idx[1], 0);
    ck_assert_int_eq(idx[2], -1);
    ck_assert_int_eq(idx[3], -1);
    for (int w = 2; w < 5; w++) ck_assert(isinf(sc[w]) && sc[w] < 0);
    float sd[3] = {1.0f, 2.0f, 3.0f};
    ck_assert_int_eq(dsv4_ref_index_select(sd, 3, 3, 512, idx), 3); /* decode: all visible entries */
    ck_assert_int_eq(dsv4_ref_index_select(sd, 0, 0, 4, idx), 0);
}
END_TEST

START_TEST(test_index_scores)
{
    /* 2 heads x d_I 2, 2 entries: score = Σ_h ω_h/sqrt(2) · relu(q_h·k)/sqrt(2) */
    float q[4] = {1, 0, 0, 1}, keys[4] = {1, 2, -3, 0.5f}, wraw[2] = {2.0f, -1.0f}, dots[4], s[2];
    dsv4_ref_index_scores(s, q, keys, 2, wraw, 2, 2, dots);
    double e0 = (2.0 * 1.0 + -1.0 * 2.0) / 2.0, e1 = (2.0 * 0.0 + -1.0 * 0.5) / 2.0;
    ck_assert(fabs(s[0] - e0) < 1e-6);
    ck_assert(fabs(s[1] - e1) < 1e-6);
}
END_TEST

/* ---------------------------------------------------------------------------------- compressor */

START_TEST(test_compressor_hca_closes_at_step)
{
    enum { r = 4, dc = 2 };
    float mem[2 * r * dc], ape[r * dc] = {0}, entry[dc];
    dsv4_ref_compressor c;
    dsv4_ref_compressor_init(&c, r, dc, 0, mem);
    ape[2 * dc + 0] = 50.0f; /* slot 2 dominates channel 0: ape is indexed by p mod r */
    for (int p = 0; p < 3 * r; p++) {
        float kv[dc] = {(float)p, (float)(10 * p)}, g[dc] = {0, 0};
        entry[0] = entry[1] = NAN;
        int closed = dsv4_ref_compressor_push(&c, p, kv, g, ape, entry);
        ck_assert_int_eq(closed, (p + 1) % r == 0);
        if (!closed) continue;
        int w = p / r;
        ck_assert_msg(fabsf(entry[0] - (float)(r * w + 2)) < 1e-4f, "entry %d ch0 %g", w, entry[0]);
        ck_assert_msg(fabsf(entry[1] - 10.0f * (r * w + 1.5f)) < 1e-3f, "entry %d ch1 %g", w, entry[1]);
    }
    ck_assert_int_eq(dsv4_ref_entries_visible(2, 4), 0);
    ck_assert_int_eq(dsv4_ref_entries_visible(3, 4), 1); /* the closing token sees its own entry */
    ck_assert_int_eq(dsv4_ref_entries_visible(6, 4), 1);
    ck_assert_int_eq(dsv4_ref_entries_visible(7, 4), 2);
}
END_TEST

START_TEST(test_compressor_csa_overlap_halves)
{
    enum { r = 4, dc = 1, W = 2 };
    float mem[2 * 2 * r * W], ape[r * W] = {0}, entry[dc];
    dsv4_ref_compressor c;
    dsv4_ref_compressor_init(&c, r, dc, 1, mem);
    /* token p: a-half kv = 100 + p, b-half kv = p; equal gates -> uniform weights */
    for (int p = 0; p < 2 * r; p++) {
        float kv[W] = {100.0f + p, (float)p}, g[W] = {0, 0};
        int closed = dsv4_ref_compressor_push(&c, p, kv, g, ape, entry);
        if (p == r - 1) {
            ck_assert(closed);
            /* entry 0: b-halves of tokens 0..3 only (the a-slots are empty, weight 0) */
            ck_assert_msg(fabsf(entry[0] - 1.5f) < 1e-5f, "entry 0 = %g", entry[0]);
        }
        if (p == 2 * r - 1) {
            ck_assert(closed);
            /* entry 1: a-halves of tokens 0..3 (100..103) with b-halves of tokens 4..7, 8 slots */
            double e = (100 + 101 + 102 + 103 + 4 + 5 + 6 + 7) / 8.0;
            ck_assert_msg(fabs(entry[0] - e) < 1e-4, "entry 1 = %g, want %g", entry[0], e);
            /* the gate can fail: pooling the b-halves of the previous window would give (0+..+7)/8 */
            ck_assert(fabs(entry[0] - 3.5) > 1.0);
        }
    }
}
END_TEST

START_TEST(test_compressor_finish)
{
    float e[4] = {1, 2, 3, 4}, nw[4] = {1, 1, 2, 2}, cs[1] = {0.0f}, sn[1] = {1.0f};
    dsv4_ref_compressor_finish(e, 4, nw, 1e-6f, 1, cs, sn);
    double r = 1.0 / sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
    ck_assert(fabs(e[0] - r) < 1e-6);
    /* then rotated by 90 degrees: (6r, 8r) -> (-8r, 6r) */
    ck_assert(fabs(e[2] - (-8.0 * r)) < 1e-5);
    ck_assert(fabs(e[3] - 6.0 * r) < 1e-5);
}
END_TEST


/* ------------------------------------------------------------------- shapes 1, 17, 31, 257 vs naive */

static uint64_t lcg = 12345;
static float frand(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(lcg >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static float *rand_buf(size_t n)
{
    float *p = malloc(n * sizeof *p + 4);
    for (size_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

START_TEST(test_linear_shapes)
{
    const int sizes[] = {1, 17, 31, 257};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c += 3) {
                int S = sizes[c], in = sizes[a], out = sizes[b];
                float *x = rand_buf((size_t)S * in), *w = rand_buf((size_t)out * in), *y = malloc((size_t)S * out * 4);
                dsv4_test_poison_f32(y, (size_t)S * out);
                dsv4_ref_linear(y, x, w, S, in, out);
                for (int s = 0; s < S; s++)
                    for (int o = 0; o < out; o++) {
                        double e = 0;
                        for (int i = 0; i < in; i++) e += (double)x[s * in + i] * w[o * in + i];
                        ck_assert_msg(fabs(y[s * out + o] - e) < 1e-5 * (1 + sqrt((double)in)),
                                      "linear S=%d in=%d out=%d y[%d,%d] %g vs %g", S, in, out, s, o, y[s * out + o], e);
                    }
                free(x);
                free(w);
                free(y);
            }
}
END_TEST

START_TEST(test_sink_attention_shapes)
{
    const int ms[] = {1, 17, 257};
    for (int t = 0; t < 3; t++) {
        int m = ms[t], H = 3, d = 31;
        float *q = rand_buf((size_t)H * d), *kv = rand_buf((size_t)m * d), sinks[3] = {0.5f, -1.0f, 2.0f};
        float *o = malloc((size_t)H * d * 4), *sc = malloc((size_t)H * m * 4);
        dsv4_test_poison_f32(o, (size_t)H * d);
        dsv4_ref_sink_attention(o, q, kv, m, sinks, H, d, sc);
        for (int h = 0; h < H; h++) {
            double *p = malloc((size_t)m * sizeof *p), den = exp(sinks[h]);
            for (int j = 0; j < m; j++) {
                double s = 0;
                for (int i = 0; i < d; i++) s += (double)q[h * d + i] * kv[j * d + i];
                p[j] = exp(s / sqrt((double)d));
                den += p[j];
            }
            for (int i = 0; i < d; i++) {
                double e = 0;
                for (int j = 0; j < m; j++) e += p[j] / den * kv[j * d + i];
                ck_assert_msg(fabs(o[h * d + i] - e) < 1e-5, "attention m=%d o[%d,%d] %g vs %g", m, h, i, o[h * d + i], e);
            }
            free(p);
        }
        free(q);
        free(kv);
        free(o);
        free(sc);
    }
}
END_TEST

START_TEST(test_grouped_out_shapes)
{
    /* H = 4 heads of d = 3 in G = 2 groups of 2 contiguous heads, o_r = 5, D = 17, S = 1 and 17 */
    for (int S = 1; S <= 17; S += 16) {
        int H = 4, d = 3, G = 2, o_r = 5, D = 17, gin = H * d / G;
        float *o = rand_buf((size_t)S * H * d), *wa = rand_buf((size_t)G * o_r * gin), *wb = rand_buf((size_t)D * G * o_r);
        float *z = malloc((size_t)S * G * o_r * 4), *out = malloc((size_t)S * D * 4);
        dsv4_test_poison_f32(out, (size_t)S * D);
        dsv4_ref_grouped_out(out, z, o, wa, wb, S, H, d, G, o_r, D);
        for (int s = 0; s < S; s++)
            for (int k = 0; k < D; k++) {
                double e = 0;
                for (int g = 0; g < G; g++)
                    for (int r = 0; r < o_r; r++) {
                        double zz = 0;
                        for (int i = 0; i < gin; i++) zz += (double)wa[(g * o_r + r) * gin + i] * o[s * H * d + g * gin + i];
                        e += wb[k * G * o_r + g * o_r + r] * zz;
                    }
                ck_assert_msg(fabs(out[s * D + k] - e) < 1e-4, "grouped out S=%d [%d] %g vs %g", S, k, out[s * D + k], e);
            }
        free(o);
        free(wa);
        free(wb);
        free(z);
        free(out);
    }
}
END_TEST

static Suite *ref_ops_suite(void)
{
    Suite *s = suite_create("ref_ops");
    TCase *t = tcase_create("traps");
    tcase_add_test(t, test_sinkhorn_ends_on_column_step);
    tcase_add_test(t, test_hc_post_comb_orientation);
    tcase_add_test(t, test_hc_pre_eps_post_sigmoid_and_flat_rms);
    tcase_add_test(t, test_hc_head);
    tcase_add_test(t, test_rope_trailing_interleaved_pairs_and_inverse);
    tcase_add_test(t, test_rope_tables_flash);
    tcase_add_test(t, test_sink_softmax);
    tcase_add_test(t, test_swiglu_clamps);
    tcase_add_test(t, test_route_bias_selects_only);
    tcase_add_test(t, test_route_hash);
    tcase_add_test(t, test_topk_tie_order);
    tcase_add_test(t, test_index_select_causal);
    tcase_add_test(t, test_index_scores);
    tcase_add_test(t, test_compressor_hca_closes_at_step);
    tcase_add_test(t, test_compressor_csa_overlap_halves);
    tcase_add_test(t, test_compressor_finish);
    suite_add_tcase(s, t);
    TCase *sh = tcase_create("shapes");
    tcase_add_test(sh, test_linear_shapes);
    tcase_add_test(sh, test_sink_attention_shapes);
    tcase_add_test(sh, test_grouped_out_shapes);
    suite_add_tcase(s, sh);
    return s;
}

int main(void) { return dsv4_test_main(ref_ops_suite()); }
