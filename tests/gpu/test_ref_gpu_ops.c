/* test_ref_gpu_ops.c - every kernel of the GPU fp32 reference (reference/ref_gpu.cuh) against the CPU reference
 * op it mirrors (reference/ref_ops.h), on random inputs from fixed seeds, at odd sizes (17, 31, 257) and real
 * Flash ones (D = 4096, head_dim 512, 64 rope channels). GPU outputs are poisoned with NaN before each launch,
 * so an unwritten element fails; the gate is relative L2 <= 1e-6 (fp32 reduction-order noise is ~1e-7), ids are
 * compared exactly. Without a CUDA device the test exits 77 (skipped).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../reference/ref_gpu.cuh"
#include "../../reference/ref_ops.h"
#include "dsv4_test.h"

#define TOL 1e-6

static cublasHandle_t blas;
static unsigned long long rng_state;

static void seed(unsigned long long s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
static float urand(float a) /* uniform in [-a, a) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((float)(rng_state >> 40) / 16777216.0f * 2.0f - 1.0f) * a;
}
static float *hrand(size_t n, float a)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++) p[i] = urand(a);
    return p;
}
static float *hzero(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    ck_assert_ptr_nonnull(p);
    return p;
}
static void *dev(size_t bytes)
{
    void *p = NULL;
    ck_assert_int_eq(cudaMalloc(&p, bytes ? bytes : 4), cudaSuccess);
    return p;
}
static float *up(const float *h, size_t n)
{
    float *d = dev(n * sizeof *d);
    ck_assert_int_eq(cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
static int32_t *up_i32(const int32_t *h, size_t n)
{
    int32_t *d = dev(n * sizeof *d);
    ck_assert_int_eq(cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
/* a device buffer of n floats poisoned with NaN */
static float *dpoison(size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    ck_assert_ptr_nonnull(h);
    dsv4_test_poison_f32(h, n);
    float *d = up(h, n);
    free(h);
    return d;
}
static float *down(const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

/* relative L2 of got vs ref; every element must be finite where ref is */
static void check_close(const char *what, const float *got, const float *ref, size_t n, double tol)
{
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(isfinite(got[i]) || !isfinite(ref[i]), "%s: element %zu is %g (ref %g): not written", what, i,
                      got[i], ref[i]);
        if (!isfinite(ref[i])) {
            ck_assert_msg(got[i] == ref[i], "%s: element %zu is %g, ref %g", what, i, got[i], ref[i]);
            continue;
        }
        double d = (double)got[i] - ref[i];
        e2 += d * d;
        r2 += (double)ref[i] * ref[i];
    }
    double rel = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
    printf("  %-44s n=%-9zu rel_l2 %.3g\n", what, n, rel);
    ck_assert_msg(rel <= tol, "%s: relative L2 %.3g > %.1g", what, rel, tol);
}

/* ---------------------------------------------------------------------------------------- linear */
START_TEST(test_linear)
{
    static const int shapes[][3] = {{1, 31, 17}, {17, 257, 31}, {257, 31, 257}, {31, 4096, 512}, {1, 4096, 1024}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        int S = shapes[t][0], ni = shapes[t][1], no = shapes[t][2];
        seed(100 + t);
        float *x = hrand((size_t)S * ni, 1.0f), *w = hrand((size_t)no * ni, 0.05f), *ref = hzero((size_t)S * no);
        dsv4_ref_linear(ref, x, w, S, ni, no);
        float *dx = up(x, (size_t)S * ni), *dw = up(w, (size_t)no * ni), *dy = dpoison((size_t)S * no);
        ck_assert_int_eq(dsv4_ref_gpu_linear(blas, dy, dx, dw, S, ni, no), 0);
        float *got = down(dy, (size_t)S * no);
        char name[64];
        snprintf(name, sizeof name, "linear %dx%d->%d", S, ni, no);
        check_close(name, got, ref, (size_t)S * no, TOL);
        free(x), free(w), free(ref), free(got);
        cudaFree(dx), cudaFree(dw), cudaFree(dy);
    }
}
END_TEST

START_TEST(test_grouped_out)
{
    static const int shapes[][6] = {{17, 8, 32, 4, 16, 31}, {3, 64, 512, 8, 1024, 257}}; /* S H d G o_r D */
    for (size_t t = 0; t < 2; t++) {
        int S = shapes[t][0], H = shapes[t][1], d = shapes[t][2], G = shapes[t][3], o_r = shapes[t][4];
        int D = shapes[t][5], gin = H * d / G;
        seed(200 + t);
        float *o = hrand((size_t)S * H * d, 1.0f), *wa = hrand((size_t)G * o_r * gin, 0.02f);
        float *wb = hrand((size_t)D * G * o_r, 0.02f), *z = hzero((size_t)S * G * o_r), *ref = hzero((size_t)S * D);
        dsv4_ref_grouped_out(ref, z, o, wa, wb, S, H, d, G, o_r, D);
        float *d_o = up(o, (size_t)S * H * d), *dwa = up(wa, (size_t)G * o_r * gin), *dwb = up(wb, (size_t)D * G * o_r);
        float *dz = dpoison((size_t)S * G * o_r), *dout = dpoison((size_t)S * D);
        ck_assert_int_eq(dsv4_ref_gpu_grouped_out(blas, dout, dz, d_o, dwa, dwb, S, gin, G, o_r, D), 0);
        float *gz = down(dz, (size_t)S * G * o_r), *got = down(dout, (size_t)S * D);
        check_close("grouped_out z", gz, z, (size_t)S * G * o_r, TOL);
        check_close("grouped_out out", got, ref, (size_t)S * D, TOL);
        free(o), free(wa), free(wb), free(z), free(ref), free(gz), free(got);
        cudaFree(d_o), cudaFree(dwa), cudaFree(dwb), cudaFree(dz), cudaFree(dout);
    }
}
END_TEST

/* -------------------------------------------------------------------------------------- RMSNorm, RoPE */
START_TEST(test_rmsnorm)
{
    static const int shapes[][2] = {{17, 31}, {3, 257}, {31, 4096}, {5, 16384}};
    for (size_t t = 0; t < 4; t++)
        for (int weighted = 0; weighted < 2; weighted++) {
            int rows = shapes[t][0], n = shapes[t][1];
            seed(300 + t * 2 + weighted);
            float *x = hrand((size_t)rows * n, 3.0f), *w = hrand(n, 1.5f), *ref = hzero((size_t)rows * n);
            for (int r = 0; r < rows; r++)
                dsv4_ref_rmsnorm(ref + (size_t)r * n, x + (size_t)r * n, weighted ? w : NULL, n, 1e-6f);
            float *dx = up(x, (size_t)rows * n), *dw = up(w, n), *dy = dpoison((size_t)rows * n);
            ck_assert_int_eq(dsv4_ref_gpu_rmsnorm(dy, dx, weighted ? dw : NULL, rows, n, 1e-6f), 0);
            float *got = down(dy, (size_t)rows * n);
            check_close(weighted ? "rmsnorm weighted" : "rmsnorm unweighted", got, ref, (size_t)rows * n, TOL);
            /* in place */
            ck_assert_int_eq(dsv4_ref_gpu_rmsnorm(dx, dx, weighted ? dw : NULL, rows, n, 1e-6f), 0);
            float *got2 = down(dx, (size_t)rows * n);
            check_close("rmsnorm in place", got2, ref, (size_t)rows * n, TOL);
            free(x), free(w), free(ref), free(got), free(got2);
            cudaFree(dx), cudaFree(dw), cudaFree(dy);
        }
}
END_TEST

/* The Flash compress table (YaRN) and the main table, at positions past 2,000. */
static void flash_tables(float *inv_main, float *inv_cmp)
{
    dsv4_rope_params mp = {.theta = 10000.0};
    dsv4_rope_params cp = {.theta = 160000.0, .yarn = 1, .factor = 16.0, .original_max_position_embeddings = 65536,
                           .beta_fast = 32.0, .beta_slow = 1.0};
    dsv4_rope_inv_freq(&mp, 64, inv_main);
    dsv4_rope_inv_freq(&cp, 64, inv_cmp);
}

START_TEST(test_rope)
{
    enum { NP = 32 };
    float inv[2][NP];
    flash_tables(inv[0], inv[1]);
    static const int shapes[][3] = {{17, 3, 512}, {31, 64, 128}, {5, 1, 257 + 7}}; /* S heads dim */
    for (int tab = 0; tab < 2; tab++)
        for (size_t t = 0; t < 3; t++)
            for (int inverse = 0; inverse < 2; inverse++) {
                int S = shapes[t][0], heads = shapes[t][1], dim = shapes[t][2];
                int64_t p0 = 2581 - 17 * (int64_t)t;
                seed(400 + t);
                float *x = hrand((size_t)S * heads * dim, 2.0f), *ref = malloc((size_t)S * heads * dim * sizeof(float));
                float *cs = malloc((size_t)S * NP * sizeof(float)), *sn = malloc((size_t)S * NP * sizeof(float));
                memcpy(ref, x, (size_t)S * heads * dim * sizeof(float));
                for (int s = 0; s < S; s++) {
                    dsv4_ref_rope_cos_sin(inv[tab], NP, p0 + s, cs + s * NP, sn + s * NP);
                    for (int h = 0; h < heads; h++)
                        dsv4_ref_rope_apply(ref + ((size_t)s * heads + h) * dim, dim, NP, cs + s * NP, sn + s * NP,
                                            inverse);
                }
                float *dinv = up(inv[tab], NP), *dcs = dpoison((size_t)S * NP), *dsn = dpoison((size_t)S * NP);
                ck_assert_int_eq(dsv4_ref_gpu_rope_table(dcs, dsn, dinv, NP, p0, S), 0);
                float *gcs = down(dcs, (size_t)S * NP), *gsn = down(dsn, (size_t)S * NP);
                check_close("rope table cos", gcs, cs, (size_t)S * NP, TOL);
                check_close("rope table sin", gsn, sn, (size_t)S * NP, TOL);
                float *dx = up(x, (size_t)S * heads * dim);
                ck_assert_int_eq(dsv4_ref_gpu_rope(dx, S, heads, dim, NP, dcs, dsn, inverse), 0);
                float *got = down(dx, (size_t)S * heads * dim);
                check_close(inverse ? "rope inverse" : "rope", got, ref, (size_t)S * heads * dim, TOL);
                free(x), free(ref), free(cs), free(sn), free(gcs), free(gsn), free(got);
                cudaFree(dinv), cudaFree(dcs), cudaFree(dsn), cudaFree(dx);
            }
}
END_TEST

/* --------------------------------------------------------------------------------------------- mHC */
START_TEST(test_hc_pre_post_head)
{
    static const int Ds[] = {17, 257, 4096};
    const int n = 4, nmix = (2 + n) * n, iters = 20;
    const float hc_eps = 1e-6f, eps = 1e-6f;
    for (size_t t = 0; t < 3; t++) {
        int D = Ds[t], S = 31;
        seed(500 + t);
        float *X = hrand((size_t)S * n * D, 1.0f), *fn = hrand((size_t)nmix * n * D, 2.0f / sqrtf((float)n * D));
        float *base = hrand(nmix, 0.5f), scale[3] = {0.7f, 0.9f, 1.3f}, *out = hrand((size_t)S * D, 1.0f);
        float *hfn = hrand((size_t)n * n * D, 2.0f / sqrtf((float)n * D)), *hbase = hrand(n, 0.5f), hscale = 0.8f;
        dsv4_ref_hc_params hp = {fn, base, scale};
        float *pre = hzero((size_t)S * n), *post = hzero((size_t)S * n), *comb = hzero((size_t)S * n * n);
        float *x = hzero((size_t)S * D), *vn = hzero((size_t)n * D), mix[24], *Xo = hzero((size_t)S * n * D);
        float *y = hzero((size_t)S * D);
        for (int s = 0; s < S; s++) {
            dsv4_ref_hc_pre(&hp, X + (size_t)s * n * D, n, D, iters, hc_eps, eps, pre + s * n, post + s * n,
                            comb + s * n * n, x + (size_t)s * D, vn, mix);
            dsv4_ref_hc_post(Xo + (size_t)s * n * D, X + (size_t)s * n * D, out + (size_t)s * D, post + s * n,
                             comb + s * n * n, n, D);
            dsv4_ref_hc_head(hfn, hbase, &hscale, X + (size_t)s * n * D, n, D, hc_eps, eps, y + (size_t)s * D, vn);
        }
        float *dX = up(X, (size_t)S * n * D), *dfn = up(fn, (size_t)nmix * n * D), *dbase = up(base, nmix);
        float *dscale = up(scale, 3), *dout = up(out, (size_t)S * D), *dvn = dpoison((size_t)S * n * D);
        float *dmix = dpoison((size_t)S * nmix), *dpre = dpoison((size_t)S * n), *dpost = dpoison((size_t)S * n);
        float *dcomb = dpoison((size_t)S * n * n), *dx = dpoison((size_t)S * D), *dXo = dpoison((size_t)S * n * D);
        ck_assert_int_eq(dsv4_ref_gpu_rmsnorm(dvn, dX, NULL, S, n * D, eps), 0);
        ck_assert_int_eq(dsv4_ref_gpu_linear(blas, dmix, dvn, dfn, S, n * D, nmix), 0);
        ck_assert_int_eq(dsv4_ref_gpu_hc_coeff(dmix, dbase, dscale, S, n, iters, hc_eps, dpre, dpost, dcomb), 0);
        ck_assert_int_eq(dsv4_ref_gpu_hc_collapse(dx, dX, dpre, S, n, D), 0);
        ck_assert_int_eq(dsv4_ref_gpu_hc_post(dXo, dX, dout, dpost, dcomb, S, n, D), 0);
        float *g;
        check_close("hc_pre pre", g = down(dpre, (size_t)S * n), pre, (size_t)S * n, TOL), free(g);
        check_close("hc_pre post", g = down(dpost, (size_t)S * n), post, (size_t)S * n, TOL), free(g);
        check_close("hc_pre comb (Sinkhorn)", g = down(dcomb, (size_t)S * n * n), comb, (size_t)S * n * n, TOL), free(g);
        check_close("hc_pre collapse", g = down(dx, (size_t)S * D), x, (size_t)S * D, TOL), free(g);
        /* post from the CPU's own coefficients, so its check does not inherit the pre's rounding */
        float *dpost_c = up(post, (size_t)S * n), *dcomb_c = up(comb, (size_t)S * n * n);
        ck_assert_int_eq(dsv4_ref_gpu_hc_post(dXo, dX, dout, dpost_c, dcomb_c, S, n, D), 0);
        check_close("hc_post", g = down(dXo, (size_t)S * n * D), Xo, (size_t)S * n * D, TOL), free(g);
        /* hc_head */
        float *dhfn = up(hfn, (size_t)n * n * D), *dhbase = up(hbase, n), *dhscale = up(&hscale, 1);
        float *dhm = dpoison((size_t)S * n), *dhpre = dpoison((size_t)S * n), *dy = dpoison((size_t)S * D);
        ck_assert_int_eq(dsv4_ref_gpu_linear(blas, dhm, dvn, dhfn, S, n * D, n), 0);
        ck_assert_int_eq(dsv4_ref_gpu_hc_head_pre(dhm, dhbase, dhscale, S, n, hc_eps, dhpre), 0);
        ck_assert_int_eq(dsv4_ref_gpu_hc_collapse(dy, dX, dhpre, S, n, D), 0);
        check_close("hc_head", g = down(dy, (size_t)S * D), y, (size_t)S * D, TOL), free(g);
        free(X), free(fn), free(base), free(out), free(hfn), free(hbase), free(pre), free(post), free(comb);
        free(x), free(vn), free(Xo), free(y);
        cudaFree(dX), cudaFree(dfn), cudaFree(dbase), cudaFree(dscale), cudaFree(dout), cudaFree(dvn);
        cudaFree(dmix), cudaFree(dpre), cudaFree(dpost), cudaFree(dcomb), cudaFree(dx), cudaFree(dXo);
        cudaFree(dpost_c), cudaFree(dcomb_c), cudaFree(dhfn), cudaFree(dhbase), cudaFree(dhscale), cudaFree(dhm);
        cudaFree(dhpre), cudaFree(dy);
    }
}
END_TEST

/* --------------------------------------------------------------------------------------------- MoE */
START_TEST(test_swiglu)
{
    size_t n = 257 * 31;
    seed(600);
    float *g = hrand(n, 15.0f), *u = hrand(n, 15.0f), *ref = hzero(n);
    dsv4_ref_swiglu(ref, g, u, (int)n, 10.0f);
    float *dg = up(g, n), *du = up(u, n), *dh = dpoison(n);
    ck_assert_int_eq(dsv4_ref_gpu_swiglu(dh, dg, du, n, 10.0f), 0);
    float *got = down(dh, n);
    check_close("swiglu (limit 10)", got, ref, n, TOL);
    free(g), free(u), free(ref), free(got);
    cudaFree(dg), cudaFree(du), cudaFree(dh);
}
END_TEST

START_TEST(test_route)
{
    const int S = 31, E = 32, k = 6, V = 17;
    for (int hash = 0; hash < 2; hash++) {
        seed(700 + hash);
        float *lg = hrand((size_t)S * E, 4.0f), *bias = hrand(E, 0.3f), s_scr[32];
        int32_t tid[17 * 6], tok[31], *ids = malloc((size_t)S * k * sizeof(int32_t));
        float *wt = hzero((size_t)S * k);
        for (int t = 0; t < V; t++)
            for (int j = 0; j < k; j++) tid[t * k + j] = (7 * t + 5 * j) % E;
        for (int s = 0; s < S; s++) tok[s] = (s * 11) % V;
        lg[3] = 25.0f; /* softplus' linear branch */
        for (int s = 0; s < S; s++)
            dsv4_ref_route(lg + s * E, E, k, hash ? NULL : bias, hash ? tid + tok[s] * k : NULL, 1.5f, ids + s * k,
                           wt + s * k, s_scr);
        float *dlg = up(lg, (size_t)S * E), *dbias = up(bias, E), *dw = dpoison((size_t)S * k);
        float *dsb = dpoison((size_t)S * E);
        int32_t *dtid = up_i32(tid, (size_t)V * k), *dtok = up_i32(tok, S), *dids = dev((size_t)S * k * 4);
        ck_assert_int_eq(cudaMemset(dids, 0xff, (size_t)S * k * 4), cudaSuccess);
        ck_assert_int_eq(dsv4_ref_gpu_route(dlg, S, E, k, hash ? NULL : dbias, dtid, dtok, 1.5f, dids, dw, dsb), 0);
        int32_t *gids = malloc((size_t)S * k * 4);
        ck_assert_int_eq(cudaMemcpy(gids, dids, (size_t)S * k * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int i = 0; i < S * k; i++)
            ck_assert_msg(gids[i] == ids[i], "route (%s): id %d is %d, cpu %d", hash ? "hash" : "learned", i, gids[i],
                          ids[i]);
        float *gw = down(dw, (size_t)S * k);
        check_close(hash ? "route hash weights" : "route learned weights", gw, wt, (size_t)S * k, TOL);
        free(lg), free(bias), free(ids), free(wt), free(gids), free(gw);
        cudaFree(dlg), cudaFree(dbias), cudaFree(dw), cudaFree(dsb), cudaFree(dtid), cudaFree(dtok), cudaFree(dids);
    }
}
END_TEST

START_TEST(test_gather_combine)
{
    const int S = 17, k = 3, D = 31;
    seed(800);
    float *src = hrand((size_t)S * D, 1.0f), *y = hrand((size_t)S * k * D, 1.0f), *w = hrand((size_t)S * k, 1.0f);
    float *fo = hrand((size_t)S * D, 1.0f), *ref = malloc((size_t)S * D * sizeof(float));
    int32_t rows[17 * 3], slot[17 * 3];
    for (int i = 0; i < S * k; i++) {
        rows[i] = (i * 7) % S;
        slot[i] = (i * 5 + 2) % (S * k); /* a permutation: gcd(5, 51) = 1 */
    }
    for (int s = 0; s < S; s++)
        for (int c = 0; c < D; c++) {
            float acc = 0.0f;
            for (int j = 0; j < k; j++) acc += y[(size_t)slot[s * k + j] * D + c] * w[s * k + j];
            ref[s * D + c] = acc + fo[s * D + c];
        }
    float *dsrc = up(src, (size_t)S * D), *dg = dpoison((size_t)S * k * D);
    int32_t *drows = up_i32(rows, (size_t)S * k), *dslot = up_i32(slot, (size_t)S * k);
    ck_assert_int_eq(dsv4_ref_gpu_gather_rows(dg, dsrc, drows, S * k, D), 0);
    float *gg = down(dg, (size_t)S * k * D), *gref = malloc((size_t)S * k * D * sizeof(float));
    for (int i = 0; i < S * k; i++) memcpy(gref + (size_t)i * D, src + (size_t)rows[i] * D, D * sizeof(float));
    check_close("gather_rows", gg, gref, (size_t)S * k * D, 0.0);
    float *dy = up(y, (size_t)S * k * D), *dw = up(w, (size_t)S * k), *dfo = up(fo, (size_t)S * D);
    ck_assert_int_eq(dsv4_ref_gpu_moe_combine(dfo, dy, dslot, dw, S, k, D), 0);
    float *got = down(dfo, (size_t)S * D);
    check_close("moe_combine", got, ref, (size_t)S * D, TOL);
    free(src), free(y), free(w), free(fo), free(ref), free(gg), free(gref), free(got);
    cudaFree(dsrc), cudaFree(dg), cudaFree(drows), cudaFree(dslot), cudaFree(dy), cudaFree(dw), cudaFree(dfo);
}
END_TEST


/* -------------------------------------------------------------------------------------- compressors */
/* CPU: push every token, finishing each closed entry; GPU: one prefill call of S1 tokens, then one token per call. */
static void run_compressor_case(int ratio, int dc, int overlap, int np, int T, int S1)
{
    int width = (overlap ? 2 : 1) * dc, cap = T / ratio;
    float inv[2][32];
    flash_tables(inv[0], inv[1]);
    float invc[32];
    for (int i = 0; i < np; i++) invc[i] = inv[1][i * (32 / np)];
    seed(900 + ratio + dc);
    float *kvp = hrand((size_t)T * width, 1.0f), *gp = hrand((size_t)T * width, 2.0f);
    float *ape = hrand((size_t)ratio * width, 0.5f), *nw = hrand(dc, 1.5f);
    /* CPU */
    size_t nst = dsv4_ref_compressor_state_floats(ratio, dc, overlap);
    float *mem = hzero(nst), *ref = hzero((size_t)(cap ? cap : 1) * dc), *entry = hzero(dc), cs[32], sn[32];
    dsv4_ref_compressor c;
    dsv4_ref_compressor_init(&c, ratio, dc, overlap, mem);
    for (int p = 0; p < T; p++) {
        if (!dsv4_ref_compressor_push(&c, p, kvp + (size_t)p * width, gp + (size_t)p * width, ape, entry)) continue;
        int w = p / ratio;
        dsv4_ref_rope_cos_sin(invc, np, (int64_t)ratio * w, cs, sn);
        dsv4_ref_compressor_finish(entry, dc, nw, 1e-6f, np, cs, sn);
        memcpy(ref + (size_t)w * dc, entry, dc * sizeof(float));
    }
    /* GPU */
    float *dmem = dev(nst * sizeof(float)), *dkvp = up(kvp, (size_t)T * width), *dgp = up(gp, (size_t)T * width);
    float *dape = up(ape, (size_t)ratio * width), *dnw = up(nw, dc), *dinv = up(invc, np);
    float *dpool = dpoison((size_t)(cap ? cap : 1) * dc);
    dsv4_ref_gpu_compressor gc;
    ck_assert_int_eq(dsv4_ref_gpu_compressor_init(&gc, ratio, dc, overlap, dmem), 0);
    for (int p0 = 0; p0 < T;) {
        int S = p0 == 0 ? S1 : 1;
        if (p0 + S > T) S = T - p0;
        int w0 = p0 / ratio, n_new = (p0 + S) / ratio - p0 / ratio;
        ck_assert_int_eq(dsv4_ref_gpu_compressor_run(&gc, dkvp + (size_t)p0 * width, dgp + (size_t)p0 * width, dape,
                                                     p0, S, dpool), 0);
        ck_assert_int_eq(dsv4_ref_gpu_compressor_finish(dpool, w0, n_new, dc, dnw, 1e-6f, dinv, np, ratio), 0);
        p0 += S;
    }
    char name[96];
    float *got = down(dpool, (size_t)cap * dc);
    snprintf(name, sizeof name, "compressor r=%d d_c=%d %s entries", ratio, dc, overlap ? "csa" : "hca");
    check_close(name, got, ref, (size_t)cap * dc, TOL);
    float *st = down(dmem, nst);
    snprintf(name, sizeof name, "compressor r=%d d_c=%d state", ratio, dc);
    check_close(name, st, mem, nst, 0.0);
    free(kvp), free(gp), free(ape), free(nw), free(mem), free(ref), free(entry), free(got), free(st);
    cudaFree(dmem), cudaFree(dkvp), cudaFree(dgp), cudaFree(dape), cudaFree(dnw), cudaFree(dinv), cudaFree(dpool);
}

START_TEST(test_compressor)
{
    run_compressor_case(4, 17, 1, 4, 61, 13);   /* odd width, prefill ends mid-window */
    run_compressor_case(4, 128, 1, 32, 45, 1);  /* indexer width, token by token from 0 */
    run_compressor_case(8, 31, 0, 4, 70, 37);
    run_compressor_case(4, 512, 1, 32, 300, 257);
    run_compressor_case(128, 512, 0, 32, 300, 255);
}
END_TEST

/* ------------------------------------------------------------------------------------------ indexer */
static void check_select(const char *what, const float *score, int S, int n_pool, int64_t p0, int ratio, int k)
{
    float *dsc = up(score, (size_t)S * n_pool), *tmp = malloc((size_t)n_pool * sizeof(float));
    int32_t *didx = dev((size_t)S * k * 4), *gidx = malloc((size_t)S * k * 4), *cidx = malloc((size_t)k * 4);
    ck_assert_int_eq(cudaMemset(didx, 0x7f, (size_t)S * k * 4), cudaSuccess);
    ck_assert_int_eq(dsv4_ref_gpu_index_select(didx, k, dsc, S, n_pool, p0, ratio, k), 0);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(gidx, didx, (size_t)S * k * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int s = 0; s < S; s++) {
        memcpy(tmp, score + (size_t)s * n_pool, (size_t)n_pool * sizeof(float));
        int kk = dsv4_ref_index_select(tmp, n_pool, dsv4_ref_entries_visible(p0 + s, ratio), k, cidx);
        ck_assert_int_eq(kk, k);
        for (int i = 0; i < k; i++)
            ck_assert_msg(gidx[(size_t)s * k + i] == cidx[i], "%s: query %d pick %d is %d, cpu %d", what, s, i,
                          gidx[(size_t)s * k + i], cidx[i]);
    }
    printf("  %-44s %d queries x %d picks: identical, same order\n", what, S, k);
    free(tmp), free(gidx), free(cidx);
    cudaFree(dsc), cudaFree(didx);
}

START_TEST(test_indexer)
{
    static const int shapes[][5] = {{7, 257, 16, 32, 1000}, {3, 650, 64, 128, 2597}}; /* S n_pool H_I d_I p0 */
    for (size_t t = 0; t < 2; t++) {
        int S = shapes[t][0], n_pool = shapes[t][1], HI = shapes[t][2], dI = shapes[t][3], p0 = shapes[t][4];
        int k = n_pool < 512 ? n_pool : 512;
        seed(1000 + t);
        float *qI = hrand((size_t)S * HI * dI, 1.0f), *keys = hrand((size_t)n_pool * dI, 1.0f);
        float *wraw = hrand((size_t)S * HI, 1.0f), *ref = hzero((size_t)S * n_pool), *dots = hzero((size_t)HI * n_pool);
        for (int s = 0; s < S; s++)
            dsv4_ref_index_scores(ref + (size_t)s * n_pool, qI + (size_t)s * HI * dI, keys, n_pool, wraw + s * HI, HI,
                                  dI, dots);
        float *dq = up(qI, (size_t)S * HI * dI), *dk = up(keys, (size_t)n_pool * dI), *dw = up(wraw, (size_t)S * HI);
        float *dsc = dpoison((size_t)S * n_pool);
        ck_assert_int_eq(dsv4_ref_gpu_index_scores(dsc, dq, dk, dw, S, n_pool, HI, dI), 0);
        float *got = down(dsc, (size_t)S * n_pool);
        check_close(t ? "index_scores 64x128 over 650" : "index_scores 16x32 over 257", got, ref, (size_t)S * n_pool,
                    TOL);
        check_select("index_select on the gpu scores", got, S, n_pool, p0, 4, k);
        free(qI), free(keys), free(wraw), free(ref), free(dots), free(got);
        cudaFree(dq), cudaFree(dk), cudaFree(dw), cudaFree(dsc);
    }
    /* ties: exact zeros, repeated values, NaN and -inf, invisible entries, k > visible */
    enum { S = 4, N = 31 };
    float sc[S * N];
    for (int s = 0; s < S; s++)
        for (int w = 0; w < N; w++) {
            float v = (float)((w * 7 + s) % 5) - 2.0f; /* -2..2, many equal */
            if (w % 6 == 0) v = 0.0f;
            if (w == 9) v = NAN;
            if (w == 13) v = -INFINITY;
            sc[s * N + w] = v;
        }
    check_select("index_select ties/NaN/-inf, k 17", sc, S, N, 80, 4, 17);
    check_select("index_select all picked, k = pool", sc, S, N, 100, 4, N);
    check_select("index_select early queries (-1 picks)", sc, S, N, 7, 4, N);
}
END_TEST

/* ----------------------------------------------------------------------------------- sink attention */
static void run_attention_case(const char *what, int S, int H, int d, int np, int window, int64_t p0, int ratio,
                               int n_pool, int csa, int n_topk)
{
    float inv[2][32];
    flash_tables(inv[0], inv[1]);
    seed(1100 + S + H + ratio + csa);
    float *q = hrand((size_t)S * H * d, 1.0f), *kv = hrand((size_t)S * d, 1.0f), *ring = hrand((size_t)window * d, 1.0f);
    float *pool = hrand((size_t)(n_pool ? n_pool : 1) * d, 1.0f), *sinks = hrand(H, 2.0f);
    int32_t *topk = malloc((size_t)S * (n_topk ? n_topk : 1) * 4);
    for (int s = 0; s < S; s++)
        for (int i = 0; i < n_topk; i++)
            topk[(size_t)s * n_topk + i] = (i * 3 + s) % 5 == 4 ? -1 : (int32_t)((i * 37 + s * 11) % n_pool);
    float *cs = hzero((size_t)S * np), *sn = hzero((size_t)S * np), *ref = hzero((size_t)S * H * d);
    int m_max = window + (csa ? n_topk : n_pool);
    float *gather = hzero((size_t)m_max * d), *scores = hzero((size_t)H * m_max);
    for (int s = 0; s < S; s++) {
        int64_t p = p0 + s, lo = p - window + 1 > 0 ? p - window + 1 : 0;
        int m = 0;
        dsv4_ref_rope_cos_sin(inv[1], np, p, cs + s * np, sn + s * np);
        for (int64_t t = lo; t <= p; t++, m++)
            memcpy(gather + (size_t)m * d, t >= p0 ? kv + (t - p0) * d : ring + (t % window) * d, d * sizeof(float));
        if (n_pool && !csa)
            for (int w = 0; w < (p + 1) / ratio; w++, m++) memcpy(gather + (size_t)m * d, pool + (size_t)w * d, d * 4);
        if (csa)
            for (int i = 0; i < n_topk; i++) {
                int32_t e = topk[(size_t)s * n_topk + i];
                if (e >= 0) memcpy(gather + (size_t)m++ * d, pool + (size_t)e * d, d * sizeof(float));
            }
        float *o = ref + (size_t)s * H * d;
        dsv4_ref_sink_attention(o, q + (size_t)s * H * d, gather, m, sinks, H, d, scores);
        for (int h = 0; h < H; h++) dsv4_ref_rope_apply(o + (size_t)h * d, d, np, cs + s * np, sn + s * np, 1);
    }
    dsv4_ref_gpu_attn_params ap;
    memset(&ap, 0, sizeof ap);
    ap.o = dpoison((size_t)S * H * d);
    ap.q = up(q, (size_t)S * H * d);
    ap.kv = up(kv, (size_t)S * d);
    ap.ring = up(ring, (size_t)window * d);
    ap.pool = n_pool ? up(pool, (size_t)n_pool * d) : NULL;
    ap.topk = csa ? up_i32(topk, (size_t)S * n_topk) : NULL;
    ap.topk_stride = n_topk;
    ap.n_topk = n_topk;
    ap.sinks = up(sinks, H);
    ap.cos_t = up(cs, (size_t)S * np);
    ap.sin_t = up(sn, (size_t)S * np);
    ap.S = S, ap.H = H, ap.d = d, ap.n_pairs = np, ap.window = window, ap.ratio = ratio, ap.p0 = p0;
    ap.m_max = m_max;
    ck_assert_int_eq(dsv4_ref_gpu_attention_prepare(m_max, d, n_topk), 0);
    ck_assert_int_eq(dsv4_ref_gpu_attention(&ap), 0);
    float *got = down(ap.o, (size_t)S * H * d);
    check_close(what, got, ref, (size_t)S * H * d, TOL);
    cudaFree(ap.o), cudaFree((void *)ap.q), cudaFree((void *)ap.kv), cudaFree((void *)ap.ring);
    cudaFree((void *)ap.pool), cudaFree((void *)ap.topk), cudaFree((void *)ap.sinks), cudaFree((void *)ap.cos_t);
    cudaFree((void *)ap.sin_t);
    free(q), free(kv), free(ring), free(pool), free(sinks), free(topk), free(cs), free(sn), free(ref), free(gather);
    free(scores), free(got);
}

START_TEST(test_attention)
{
    run_attention_case("attention sliding, prefill from 0", 17, 3, 64, 8, 8, 0, 0, 0, 0, 0);
    run_attention_case("attention sliding, ring + call rows", 13, 3, 64, 8, 8, 20, 0, 0, 0, 0);
    run_attention_case("attention hca, ratio 4", 31, 5, 64, 8, 8, 3, 4, 10, 0, 0);
    run_attention_case("attention csa picks with -1", 13, 3, 64, 8, 8, 20, 4, 31, 1, 7);
    run_attention_case("attention flash csa 64x512, 128+512 keys", 2, 64, 512, 32, 128, 2598, 4, 650, 1, 512);
    run_attention_case("attention flash hca 64x512, decode", 1, 64, 512, 32, 128, 2600, 128, 20, 0, 0);
}
END_TEST

static void add_attn_tests(TCase *tc)
{
    tcase_add_test(tc, test_compressor);
    tcase_add_test(tc, test_indexer);
    tcase_add_test(tc, test_attention);
}

int main(void)
{
    dsv4_test_require_gpu();
    if (dsv4_ref_gpu_blas_init(&blas)) {
        fprintf(stderr, "test_ref_gpu_ops: %s\n", dsv4_last_error());
        return 1;
    }
    Suite *s = suite_create("ref_gpu_ops");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_grouped_out);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_hc_pre_post_head);
    tcase_add_test(tc, test_swiglu);
    tcase_add_test(tc, test_route);
    tcase_add_test(tc, test_gather_combine);
    add_attn_tests(tc);
    suite_add_tcase(s, tc);
    int rc = dsv4_test_main(s);
    cublasDestroy(blas);
    return rc;
}
