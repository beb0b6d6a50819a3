/* test_opt_kernels.cu - the optimized path's own kernels against CPU double computations on random inputs
 * (fixed seeds, fresh per case), outputs poisoned with NaN first, odd sizes (D = 17, 257) beside small real ones:
 *   mhc pre/post/head, cast-free AND roundtrip, and over long runs (the tiled pre, the vectorised post); compressor
 *   CSA (overlap) and HCA windows closing over many steps with an inactive sequence; moe routing (learned with
 *   exact ties, hash) and the grouped experts; norm_rope with RoPE, the window-ring slot write and the FP8 KV
 *   simulation; argmax ties. Each gate is also shown to fail on a deliberately wrong reference (the "test is too
 *   weak" check).
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
#include "../../kernels/compressor.cuh"
#include "../../kernels/elementwise.cuh"
#include "../../kernels/kv_layout.h"
#include "../../kernels/mhc.cuh"
#include "../../kernels/moe.cuh"

static uint64_t rs;
static float urand(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rs >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
static float bfr(float x) { return dsv4_bf16_to_f32(dsv4_f32_to_bf16(x)); }
static void *dup_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    ck_assert(cudaMalloc(&d, bytes ? bytes : 4) == cudaSuccess);
    if (h) ck_assert(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    else ck_assert(cudaMemset(d, 0xff, bytes) == cudaSuccess); /* NaN poison for f32 and bf16 */
    return d;
}
static void get(void *h, const void *d, size_t bytes)
{
    ck_assert(cudaDeviceSynchronize() == cudaSuccess);
    ck_assert(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
}
/* ||a - b|| / ||b||, NaN -> inf */
static double rel(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static void bf16_to_f32v(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dsv4_bf16_to_f32(src[i]);
}

/* ------------------------------------------------------------------------------------------------ mhc */
static void cpu_mhc(const float *X, const float *fn, const float *base, const float *scale, const float *nw, int C,
                    int n, int D, int head, double *pre, double *post, double *comb, double *x, double *xn)
{
    int nmix = head ? n : (2 + n) * n, nD = n * D;
    for (int c = 0; c < C; c++) {
        const float *v = X + (size_t)c * nD;
        double ss = 0, m[24];
        for (int i = 0; i < nD; i++) ss += (double)v[i] * v[i];
        double rho = 1.0 / sqrt(ss / nD + 1e-6);
        for (int r = 0; r < nmix; r++) {
            double a = 0;
            for (int i = 0; i < nD; i++) a += (double)fn[(size_t)r * nD + i] * v[i];
            m[r] = a * rho;
        }
        double *pr = pre + c * n;
        for (int j = 0; j < n; j++) pr[j] = 1.0 / (1.0 + exp(-(m[j] * scale[0] + base[j]))) + 1e-6;
        if (!head) {
            for (int j = 0; j < n; j++) post[c * n + j] = 2.0 / (1.0 + exp(-(m[n + j] * scale[1] + base[n + j])));
            double *cb = comb + c * n * n;
            for (int i = 0; i < n * n; i++) cb[i] = m[2 * n + i] * scale[2] + base[2 * n + i];
            for (int j = 0; j < n; j++) {
                double mx = -1e300, s = 0;
                for (int k = 0; k < n; k++) mx = fmax(mx, cb[j * n + k]);
                for (int k = 0; k < n; k++) s += exp(cb[j * n + k] - mx);
                for (int k = 0; k < n; k++) cb[j * n + k] = exp(cb[j * n + k] - mx) / s + 1e-6;
            }
            for (int it = 0; it < 20; it++) {
                if (it)
                    for (int j = 0; j < n; j++) {
                        double s = 0;
                        for (int k = 0; k < n; k++) s += cb[j * n + k];
                        for (int k = 0; k < n; k++) cb[j * n + k] /= s + 1e-6;
                    }
                for (int k = 0; k < n; k++) {
                    double s = 0;
                    for (int j = 0; j < n; j++) s += cb[j * n + k];
                    for (int j = 0; j < n; j++) cb[j * n + k] /= s + 1e-6;
                }
            }
        }
        double ss2 = 0;
        for (int d = 0; d < D; d++) {
            double a = 0;
            for (int j = 0; j < n; j++) a += pr[j] * v[(size_t)j * D + d];
            x[(size_t)c * D + d] = a;
            ss2 += a * a;
        }
        double r2 = 1.0 / sqrt(ss2 / D + 1e-6);
        for (int d = 0; d < D; d++) xn[(size_t)c * D + d] = nw[d] * x[(size_t)c * D + d] * r2;
    }
}

/* The mHC weights of a random case, after its streams (the order the cases draw in): fn [nmix, nD], base [24],
 * scale [3], norm weights [D]. */
static void mhc_random_weights(float *fn, size_t n_fn, float *base, float *scale, float *nw, int D)
{
    for (size_t i = 0; i < n_fn; i++) fn[i] = urand() * 0.05f;
    for (int i = 0; i < 24; i++) base[i] = urand();
    for (int i = 0; i < 3; i++) scale[i] = 0.5f + urand() * 0.3f;
    for (int d = 0; d < D; d++) nw[d] = 1 + 0.2f * urand();
}

/* One mHC pre (and for a block site the post) of C tokens against cpu_mhc. part: the cast-free partials of a call of
 * >= DSV4_MHC_TILED_MIN_TOKENS tokens (tiled or rows); such calls print their distances. */
static void mhc_case_p(int C, int D, int head, dsv4_mhc_kernel kern, dsv4_mhc_partial part)
{
    const int n = 4, nD = n * D, nmix = head ? n : (2 + n) * n;
    rs = 1234 + D * 7 + head + 3 * kern;
    size_t nx = (size_t)C * nD;
    float *X = (float *)malloc(nx * 4), *fn = (float *)malloc((size_t)nmix * nD * 4), base[24], scale[3], *nw =
                                                                                                   (float *)malloc(D * 4);
    uint16_t *Xb = (uint16_t *)malloc(nx * 2);
    for (size_t i = 0; i < nx; i++) {
        Xb[i] = dsv4_f32_to_bf16(urand() * 3);
        X[i] = dsv4_bf16_to_f32(Xb[i]);
    }
    mhc_random_weights(fn, (size_t)nmix * nD, base, scale, nw, D);
    dsv4_mhc_pre_params p;
    memset(&p, 0, sizeof p);
    p.n_tok = C, p.n_streams = n, p.dim = D, p.head = head, p.sinkhorn_iters = 20, p.hc_eps = 1e-6f, p.norm_eps = 1e-6f;
    p.X = (uint16_t *)dup_dev(Xb, nx * 2);
    p.fn = (float *)dup_dev(fn, (size_t)nmix * nD * 4);
    p.base = (float *)dup_dev(base, sizeof base);
    p.scale = (float *)dup_dev(scale, sizeof scale);
    p.norm_w = (float *)dup_dev(nw, D * 4);
    p.pre = (float *)dup_dev(NULL, C * n * 4);
    p.post = (float *)dup_dev(NULL, C * n * 4);
    p.comb = (float *)dup_dev(NULL, C * n * n * 4);
    p.x = (float *)dup_dev(NULL, (size_t)C * D * 4);
    p.xn = (uint16_t *)dup_dev(NULL, (size_t)C * D * 2);
    p.kernel = kern, p.partial = part;
    p.X_f32 = (float *)dup_dev(NULL, nx * 4);
    p.workspace_bytes = dsv4_opt_mhc_pre_workspace_bytes(&p);
    p.workspace = dup_dev(NULL, p.workspace_bytes);
    cublasHandle_t h;
    ck_assert(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    p.cublas = h;
    ck_assert_msg(dsv4_opt_mhc_pre(&p) == 0, "%s", dsv4_last_error());
    double *pre = (double *)calloc(C * n, 8), *post = (double *)calloc(C * n, 8), *comb = (double *)calloc(C * n * n, 8);
    double *x = (double *)calloc((size_t)C * D, 8), *xn = (double *)calloc((size_t)C * D, 8);
    cpu_mhc(X, fn, base, scale, nw, C, n, D, head, pre, post, comb, x, xn);
    float *g = (float *)malloc((size_t)C * D * 4 + 4096);
    uint16_t *gb = (uint16_t *)malloc((size_t)C * D * 2);
    get(g, p.pre, C * n * 4);
    ck_assert_msg(rel(g, pre, C * n) < 1e-5, "pre rel %g (D %d head %d kernel %d)", rel(g, pre, C * n), D, head, kern);
    if (!head) {
        get(g, p.post, C * n * 4);
        ck_assert_msg(rel(g, post, C * n) < 1e-5, "post rel %g", rel(g, post, C * n));
        get(g, p.comb, C * n * n * 4);
        ck_assert_msg(rel(g, comb, C * n * n) < 1e-5, "comb rel %g", rel(g, comb, C * n * n));
        comb[1] += 0.01; /* too weak? a wrong reference must fail */
        ck_assert(rel(g, comb, C * n * n) > 1e-5);
        comb[1] -= 0.01;
    }
    get(g, p.x, (size_t)C * D * 4);
    ck_assert_msg(rel(g, x, (size_t)C * D) < 1e-5, "x rel %g", rel(g, x, (size_t)C * D));
    get(gb, p.xn, (size_t)C * D * 2);
    bf16_to_f32v(g, gb, (size_t)C * D);
    ck_assert_msg(rel(g, xn, (size_t)C * D) < 8e-3, "xn rel %g", rel(g, xn, (size_t)C * D));
    if (C >= DSV4_MHC_TILED_MIN_TOKENS && kern == DSV4_MHC_KERNEL_CASTFREE) {
        get(g, p.pre, C * n * 4);
        const double r_pre = rel(g, pre, C * n);
        get(g, p.x, (size_t)C * D * 4);
        printf("mhc castfree %s: C = %d, D = %d, head %d: pre rel %.2e, x rel %.2e against the CPU\n",
               part == DSV4_MHC_PARTIAL_TILED ? "tiled" : "rows", C, D, head, r_pre, rel(g, x, (size_t)C * D));
    }
    if (!head) { /* the post, same variant */
        float *out = (float *)malloc((size_t)C * D * 4);
        for (size_t i = 0; i < (size_t)C * D; i++) out[i] = urand();
        dsv4_mhc_post_params q;
        memset(&q, 0, sizeof q);
        q.n_tok = C, q.n_streams = n, q.dim = D, q.X = p.X, q.X_f32 = p.X_f32, q.kernel = kern;
        q.out = (float *)dup_dev(out, (size_t)C * D * 4);
        q.post = p.post, q.comb = p.comb;
        q.X_out = (uint16_t *)dup_dev(NULL, nx * 2);
        ck_assert_msg(dsv4_opt_mhc_post(&q) == 0, "%s", dsv4_last_error());
        double *ref = (double *)malloc(nx * 8);
        for (int c = 0; c < C; c++)
            for (int k = 0; k < n; k++)
                for (int d = 0; d < D; d++) {
                    double a = post[c * n + k] * out[(size_t)c * D + d];
                    for (int j = 0; j < n; j++) a += comb[c * n * n + j * n + k] * X[((size_t)c * n + j) * D + d];
                    ref[((size_t)c * n + k) * D + d] = a;
                }
        uint16_t *ob = (uint16_t *)malloc(nx * 2);
        float *of = (float *)malloc(nx * 4);
        get(ob, q.X_out, nx * 2);
        bf16_to_f32v(of, ob, nx);
        ck_assert_msg(rel(of, ref, nx) < 8e-3, "post rel %g", rel(of, ref, nx));
        free(ob), free(of), free(ref), free(out);
        cudaFree((void *)q.out), cudaFree(q.X_out);
    }
    cublasDestroy(h);
    cudaFree((void *)p.X), cudaFree((void *)p.fn), cudaFree((void *)p.base), cudaFree((void *)p.scale);
    cudaFree((void *)p.norm_w), cudaFree(p.pre), cudaFree(p.post), cudaFree(p.comb), cudaFree(p.x), cudaFree(p.xn);
    cudaFree(p.X_f32), cudaFree(p.workspace);
    free(X), free(fn), free(nw), free(Xb), free(pre), free(post), free(comb), free(x), free(xn), free(g), free(gb);
}
static void mhc_case(int C, int D, int head, dsv4_mhc_kernel kern)
{
    mhc_case_p(C, D, head, kern, DSV4_MHC_PARTIAL_TILED);
}

START_TEST(test_mhc)
{
    const int Ds[] = {17, 64, 257, 4096};
    for (int kern = 0; kern < 2; kern++) {
        for (int i = 0; i < 4; i++)
            for (int head = 0; head < 2; head++) mhc_case(i == 3 ? 2 : 3, Ds[i], head, (dsv4_mhc_kernel)kern);
        /* 2 and 4 tokens per cast-free partial block, with a partly filled last block; a row longer than the
         * finish kernel keeps in registers (D > 4096); more partials than it stages in shared memory
         * (83 chunks x 25 > MHC_STAGE_FLOATS) */
        mhc_case(9, 257, 0, (dsv4_mhc_kernel)kern);
        mhc_case(33, 4096, 0, (dsv4_mhc_kernel)kern);
        mhc_case(1, 4100, 0, (dsv4_mhc_kernel)kern);
        mhc_case(1, 10500, 0, (dsv4_mhc_kernel)kern);
    }
}
END_TEST

/* Token c's outputs of an mHC pre as bytes into o: pre | post | comb | x | xn. Returns their count; with o NULL it
 * only counts. */
static size_t mhc_token_bytes(uint8_t *o, const dsv4_mhc_pre_params *p, int c)
{
    const int n = p->n_streams, D = p->dim;
    const struct { const void *src; size_t bytes; } part[] = {
        {p->pre + c * n, (size_t)n * 4},
        {p->post + c * n, (size_t)n * 4},
        {p->comb + c * n * n, (size_t)n * n * 4},
        {p->x + (size_t)c * D, (size_t)D * 4},
        {p->xn + (size_t)c * D, (size_t)D * 2},
    };
    size_t at = 0;
    for (size_t i = 0; i < sizeof part / sizeof part[0]; i++) {
        if (o) get(o + at, part[i].src, part[i].bytes);
        at += part[i].bytes;
    }
    return at;
}

/* The cast-free pre of a token gives the same bits in a batch of 1, 9 (2 tokens per partial block) or 33 (4 per
 * block) tokens: the kernels' order of adds does not depend on the batch. */
START_TEST(test_mhc_batch_bitwise)
{
    const int n = 4, D = 4096, nD = n * D, nmix = (2 + n) * n, Cs[] = {33, 9};
    rs = 4242;
    uint16_t *Xb = (uint16_t *)malloc((size_t)33 * nD * 2);
    float *fn = (float *)malloc((size_t)nmix * nD * 4), base[24], scale[3], *nw = (float *)malloc(D * 4);
    for (size_t i = 0; i < (size_t)33 * nD; i++) Xb[i] = dsv4_f32_to_bf16(urand() * 3);
    mhc_random_weights(fn, (size_t)nmix * nD, base, scale, nw, D);
    dsv4_mhc_pre_params p;
    memset(&p, 0, sizeof p);
    p.n_streams = n, p.dim = D, p.sinkhorn_iters = 20, p.hc_eps = 1e-6f, p.norm_eps = 1e-6f;
    p.kernel = DSV4_MHC_KERNEL_CASTFREE;
    p.X = (uint16_t *)dup_dev(Xb, (size_t)33 * nD * 2);
    p.fn = (float *)dup_dev(fn, (size_t)nmix * nD * 4);
    p.base = (float *)dup_dev(base, sizeof base), p.scale = (float *)dup_dev(scale, sizeof scale);
    p.norm_w = (float *)dup_dev(nw, D * 4);
    p.pre = (float *)dup_dev(NULL, 33 * n * 4), p.post = (float *)dup_dev(NULL, 33 * n * 4);
    p.comb = (float *)dup_dev(NULL, 33 * n * n * 4), p.x = (float *)dup_dev(NULL, (size_t)33 * D * 4);
    p.xn = (uint16_t *)dup_dev(NULL, (size_t)33 * D * 2);
    p.n_tok = 33;
    p.workspace_bytes = dsv4_opt_mhc_pre_workspace_bytes(&p);
    p.workspace = dup_dev(NULL, p.workspace_bytes);
    const size_t per_tok = mhc_token_bytes(NULL, &p, 0);
    uint8_t *batch = (uint8_t *)malloc(33 * per_tok), *one = (uint8_t *)malloc(per_tok);
    for (int ci = 0; ci < 2; ci++) {
        const int C = Cs[ci];
        p.n_tok = C;
        ck_assert_msg(dsv4_opt_mhc_pre(&p) == 0, "%s", dsv4_last_error());
        for (int c = 0; c < C; c++) mhc_token_bytes(batch + (size_t)c * per_tok, &p, c);
        const int toks[] = {0, 1, C / 2, C - 2, C - 1};
        for (int ti = 0; ti < 5; ti++) {
            const int c = toks[ti];
            dsv4_mhc_pre_params q = p;
            q.n_tok = 1, q.X = p.X + (size_t)c * nD;
            ck_assert_msg(dsv4_opt_mhc_pre(&q) == 0, "%s", dsv4_last_error());
            mhc_token_bytes(one, &q, 0);
            const uint8_t *b = batch + (size_t)c * per_tok;
            size_t first = per_tok;
            for (size_t k = 0; k < per_tok && first == per_tok; k++)
                if (one[k] != b[k]) first = k;
            ck_assert_msg(first == per_tok, "C = %d, token %d: the batch of 1 differs from the batch at byte %zu of %zu "
                          "(pre | post | comb | x | xn)", C, c, first, per_tok);
        }
    }
    printf("mhc castfree: tokens of batches of 33 and 9 give the bits of a batch of 1\n");
    cudaFree((void *)p.X), cudaFree((void *)p.fn), cudaFree((void *)p.base), cudaFree((void *)p.scale);
    cudaFree((void *)p.norm_w), cudaFree(p.pre), cudaFree(p.post), cudaFree(p.comb), cudaFree(p.x), cudaFree(p.xn);
    cudaFree(p.workspace);
    free(Xb), free(fn), free(nw), free(batch), free(one);
}
END_TEST

/* Long runs (a prefill chunk) take the tiled partial kernel from DSV4_MHC_TILED_MIN_TOKENS tokens on. Against the
 * CPU with test_mhc's tolerances: C = 300 and 1100 (not multiples of the 128-token tile), the head, D = 257 and
 * 17 (n·D not a multiple of 8: element-wise loads, a part-filled last chunk and sub-step), D = 10500 (more
 * partials than the finish kernel stages); the per-token kernel at C = 300 as well (the ablation). */
START_TEST(test_mhc_long)
{
    const dsv4_mhc_kernel cf = DSV4_MHC_KERNEL_CASTFREE;
    mhc_case_p(300, 4096, 0, cf, DSV4_MHC_PARTIAL_TILED);
    mhc_case_p(1100, 4096, 0, cf, DSV4_MHC_PARTIAL_TILED);
    mhc_case_p(300, 4096, 1, cf, DSV4_MHC_PARTIAL_TILED);
    mhc_case_p(300, 257, 0, cf, DSV4_MHC_PARTIAL_TILED);
    mhc_case_p(DSV4_MHC_TILED_MIN_TOKENS, 17, 1, cf, DSV4_MHC_PARTIAL_TILED);
    mhc_case_p(DSV4_MHC_TILED_MIN_TOKENS, 10500, 0, cf, DSV4_MHC_PARTIAL_TILED);
    mhc_case_p(300, 4096, 0, cf, DSV4_MHC_PARTIAL_ROWS);
}
END_TEST

/* The host copies of one cast-free pre: its outputs and its partials (the workspace, [C][n_chunks][n_mix + 1]). */
typedef struct mhc_host {
    float *pre, *post, *comb, *x, *part;
    uint16_t *xn;
} mhc_host;

/* p's pre over C tokens from token `first` of p->X on, with `part`, every output and the workspace poisoned first. */
static mhc_host mhc_run(const dsv4_mhc_pre_params *p, int C, int first, dsv4_mhc_partial part, size_t part_per_tok)
{
    const int n = p->n_streams, D = p->dim;
    dsv4_mhc_pre_params q = *p;
    q.n_tok = C, q.X = p->X + (size_t)first * n * D, q.partial = part;
    ck_assert(cudaMemset(q.pre, 0xff, (size_t)C * n * 4) == cudaSuccess);
    ck_assert(cudaMemset(q.post, 0xff, (size_t)C * n * 4) == cudaSuccess);
    ck_assert(cudaMemset(q.comb, 0xff, (size_t)C * n * n * 4) == cudaSuccess);
    ck_assert(cudaMemset(q.x, 0xff, (size_t)C * D * 4) == cudaSuccess);
    ck_assert(cudaMemset(q.xn, 0xff, (size_t)C * D * 2) == cudaSuccess);
    ck_assert(cudaMemset(q.workspace, 0xff, q.workspace_bytes) == cudaSuccess);
    ck_assert_msg(dsv4_opt_mhc_pre(&q) == 0, "%s", dsv4_last_error());
    mhc_host h;
    h.pre = (float *)malloc((size_t)C * n * 4), h.post = (float *)malloc((size_t)C * n * 4);
    h.comb = (float *)malloc((size_t)C * n * n * 4), h.x = (float *)malloc((size_t)C * D * 4);
    h.part = (float *)malloc((size_t)C * part_per_tok * 4), h.xn = (uint16_t *)malloc((size_t)C * D * 2);
    get(h.pre, q.pre, (size_t)C * n * 4), get(h.post, q.post, (size_t)C * n * 4);
    get(h.comb, q.comb, (size_t)C * n * n * 4), get(h.x, q.x, (size_t)C * D * 4);
    get(h.xn, q.xn, (size_t)C * D * 2), get(h.part, q.workspace, (size_t)C * part_per_tok * 4);
    return h;
}
static void mhc_host_free(mhc_host *h) { free(h->pre), free(h->post), free(h->comb), free(h->x), free(h->part), free(h->xn); }

/* rel() of two float arrays */
static double rel_ff(const float *a, const float *b, size_t n)
{
    double *bd = (double *)malloc(n * 8);
    for (size_t i = 0; i < n; i++) bd[i] = b[i];
    const double r = rel(a, bd, n);
    free(bd);
    return r;
}

/* Tokens a_first .. a_first + C - 1 of run a against tokens b_first .. of run b, bit for bit: the first array that
 * differs ("pre", ..., "partials"), or NULL. */
static const char *mhc_host_diff(const mhc_host *a, int a_first, const mhc_host *b, int b_first, int C, int n, int D,
                                 size_t part_per_tok)
{
    const struct { const char *name; const void *pa, *pb; size_t per_tok; } arr[] = {
        {"pre", a->pre, b->pre, (size_t)n * 4},           {"post", a->post, b->post, (size_t)n * 4},
        {"comb", a->comb, b->comb, (size_t)n * n * 4},    {"x", a->x, b->x, (size_t)D * 4},
        {"xn", a->xn, b->xn, (size_t)D * 2},              {"partials", a->part, b->part, part_per_tok * 4},
    };
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
        if (memcmp((const uint8_t *)arr[i].pa + a_first * arr[i].per_tok,
                   (const uint8_t *)arr[i].pb + b_first * arr[i].per_tok, (size_t)C * arr[i].per_tok))
            return arr[i].name;
    return NULL;
}

/* The tiled kernel against the per-token one on the same inputs (block site, D = 4096):
 * - C = 1100: their partials within 2e-6 of each other (relative over the whole workspace: fp32 sums of 512
 *   products in two orders, ~1e-7 expected), every output within test_mhc's 1e-5 (xn 8e-3);
 * - C = DSV4_MHC_TILED_MIN_TOKENS - 1: asking for tiled runs the per-token kernel: every output and partial bit
 *   equal; at DSV4_MHC_TILED_MIN_TOKENS the partials differ in some bit (if not, the tiled kernel did not run);
 * - a token's tiled bits do not depend on the batch nor on its place in a tile: tokens 37 .. 292 of a call of 300
 *   are the bits of a call of 256 from token 37 on, and tokens 0 .. 299 those of the call of 1100. */
START_TEST(test_mhc_long_tiled_vs_rows)
{
    const int n = 4, D = 4096, nD = n * D, nmix = (2 + n) * n, CM = 1100, T0 = DSV4_MHC_TILED_MIN_TOKENS;
    const size_t ppt = (size_t)((nD + 511) / 512) * (nmix + 1); /* partials per token: 512-element chunks */
    rs = 5151;
    uint16_t *Xb = (uint16_t *)malloc((size_t)CM * nD * 2);
    float *fn = (float *)malloc((size_t)nmix * nD * 4), base[24], scale[3], *nw = (float *)malloc(D * 4);
    for (size_t i = 0; i < (size_t)CM * nD; i++) Xb[i] = dsv4_f32_to_bf16(urand() * 3);
    mhc_random_weights(fn, (size_t)nmix * nD, base, scale, nw, D);
    dsv4_mhc_pre_params p;
    memset(&p, 0, sizeof p);
    p.n_streams = n, p.dim = D, p.sinkhorn_iters = 20, p.hc_eps = 1e-6f, p.norm_eps = 1e-6f;
    p.kernel = DSV4_MHC_KERNEL_CASTFREE;
    p.X = (uint16_t *)dup_dev(Xb, (size_t)CM * nD * 2);
    p.fn = (float *)dup_dev(fn, (size_t)nmix * nD * 4);
    p.base = (float *)dup_dev(base, sizeof base), p.scale = (float *)dup_dev(scale, sizeof scale);
    p.norm_w = (float *)dup_dev(nw, D * 4);
    p.pre = (float *)dup_dev(NULL, CM * n * 4), p.post = (float *)dup_dev(NULL, CM * n * 4);
    p.comb = (float *)dup_dev(NULL, CM * n * n * 4), p.x = (float *)dup_dev(NULL, (size_t)CM * D * 4);
    p.xn = (uint16_t *)dup_dev(NULL, (size_t)CM * D * 2);
    p.n_tok = CM;
    p.workspace_bytes = dsv4_opt_mhc_pre_workspace_bytes(&p);
    ck_assert(p.workspace_bytes >= (size_t)CM * ppt * 4);
    p.workspace = dup_dev(NULL, p.workspace_bytes);

    mhc_host t = mhc_run(&p, CM, 0, DSV4_MHC_PARTIAL_TILED, ppt), r = mhc_run(&p, CM, 0, DSV4_MHC_PARTIAL_ROWS, ppt);
    const double d_part = rel_ff(t.part, r.part, (size_t)CM * ppt), d_pre = rel_ff(t.pre, r.pre, (size_t)CM * n);
    const double d_post = rel_ff(t.post, r.post, (size_t)CM * n), d_comb = rel_ff(t.comb, r.comb, (size_t)CM * n * n);
    const double d_x = rel_ff(t.x, r.x, (size_t)CM * D);
    float *tf = (float *)malloc((size_t)CM * D * 4), *rf = (float *)malloc((size_t)CM * D * 4);
    bf16_to_f32v(tf, t.xn, (size_t)CM * D), bf16_to_f32v(rf, r.xn, (size_t)CM * D);
    const double d_xn = rel_ff(tf, rf, (size_t)CM * D);
    printf("mhc castfree C = %d: tiled against rows: partials rel %.2e, pre %.2e, post %.2e, comb %.2e, x %.2e, "
           "xn %.2e\n", CM, d_part, d_pre, d_post, d_comb, d_x, d_xn);
    ck_assert_msg(d_part < 2e-6, "partials rel %g", d_part);
    ck_assert_msg(d_pre < 1e-5 && d_post < 1e-5 && d_comb < 1e-5 && d_x < 1e-5 && d_xn < 8e-3,
                  "outputs: pre %g post %g comb %g x %g xn %g", d_pre, d_post, d_comb, d_x, d_xn);
    free(tf), free(rf);
    float *off = (float *)malloc((size_t)CM * ppt * 4); /* too weak? one token's partials 1e-3 off must fail */
    memcpy(off, t.part, (size_t)CM * ppt * 4);
    for (size_t i = 7 * ppt; i < 8 * ppt; i++) off[i] *= 1.001f;
    ck_assert(rel_ff(off, r.part, (size_t)CM * ppt) > 2e-6);
    free(off);

    mhc_host s = mhc_run(&p, 300, 0, DSV4_MHC_PARTIAL_TILED, ppt), u = mhc_run(&p, T0, 37, DSV4_MHC_PARTIAL_TILED, ppt);
    const char *w = mhc_host_diff(&s, 37, &u, 0, T0, n, D, ppt);
    ck_assert_msg(!w, "tiled: tokens 37.. of a call of 300 differ from a call of %d from token 37 (%s)", T0, w);
    w = mhc_host_diff(&s, 0, &t, 0, 300, n, D, ppt);
    ck_assert_msg(!w, "tiled: tokens 0..299 of a call of 300 differ from the call of %d (%s)", CM, w);
    mhc_host_free(&s), mhc_host_free(&u);

    s = mhc_run(&p, T0 - 1, 0, DSV4_MHC_PARTIAL_TILED, ppt), u = mhc_run(&p, T0 - 1, 0, DSV4_MHC_PARTIAL_ROWS, ppt);
    w = mhc_host_diff(&s, 0, &u, 0, T0 - 1, n, D, ppt);
    ck_assert_msg(!w, "C = %d: tiled asked, the per-token kernel expected: %s differ", T0 - 1, w);
    mhc_host_free(&s), mhc_host_free(&u);
    s = mhc_run(&p, T0, 0, DSV4_MHC_PARTIAL_TILED, ppt), u = mhc_run(&p, T0, 0, DSV4_MHC_PARTIAL_ROWS, ppt);
    ck_assert_msg(memcmp(s.part, u.part, (size_t)T0 * ppt * 4) != 0, "C = %d: tiled gave the per-token bits", T0);
    mhc_host_free(&s), mhc_host_free(&u);
    printf("mhc castfree tiled: a token's bits the same in calls of %d, 300 and %d tokens; C = %d runs the "
           "per-token kernel, C = %d the tiled one\n", T0, CM, T0 - 1, T0);

    mhc_host_free(&t), mhc_host_free(&r);
    cudaFree((void *)p.X), cudaFree((void *)p.fn), cudaFree((void *)p.base), cudaFree((void *)p.scale);
    cudaFree((void *)p.norm_w), cudaFree(p.pre), cudaFree(p.post), cudaFree(p.comb), cudaFree(p.x), cudaFree(p.xn);
    cudaFree(p.workspace);
    free(Xb), free(fn), free(nw);
}
END_TEST

/* The mHC post of >= DSV4_MHC_TILED_MIN_TOKENS tokens takes the vectorised kernel (8 elements per thread, D % 8 ==
 * 0): the bits of the scalar kernel, which a call of DSV4_MHC_TILED_MIN_TOKENS - 1 tokens still takes. (test_mhc_long
 * checks it against the CPU at C = 300, and the scalar kernel at D = 257.) */
START_TEST(test_mhc_post_long_bitwise)
{
    const int n = 4, D = 4096, C = 300, T0 = DSV4_MHC_TILED_MIN_TOKENS;
    const size_t nx = (size_t)C * n * D;
    rs = 6161;
    uint16_t *Xb = (uint16_t *)malloc(nx * 2);
    float *out = (float *)malloc((size_t)C * D * 4), *post = (float *)malloc(C * n * 4),
          *comb = (float *)malloc(C * n * n * 4);
    for (size_t i = 0; i < nx; i++) Xb[i] = dsv4_f32_to_bf16(urand() * 3);
    for (size_t i = 0; i < (size_t)C * D; i++) out[i] = urand();
    for (int i = 0; i < C * n; i++) post[i] = 1 + urand();
    for (int i = 0; i < C * n * n; i++) comb[i] = 0.5f + 0.5f * urand();
    dsv4_mhc_post_params q;
    memset(&q, 0, sizeof q);
    q.n_streams = n, q.dim = D, q.kernel = DSV4_MHC_KERNEL_CASTFREE;
    q.X = (uint16_t *)dup_dev(Xb, nx * 2);
    q.out = (float *)dup_dev(out, (size_t)C * D * 4);
    q.post = (float *)dup_dev(post, C * n * 4), q.comb = (float *)dup_dev(comb, C * n * n * 4);
    q.X_out = (uint16_t *)dup_dev(NULL, nx * 2);
    uint16_t *vec = (uint16_t *)malloc(nx * 2), *sca = (uint16_t *)malloc(nx * 2);
    q.n_tok = C;
    ck_assert_msg(dsv4_opt_mhc_post(&q) == 0, "%s", dsv4_last_error());
    get(vec, q.X_out, nx * 2);
    ck_assert(cudaMemset(q.X_out, 0xff, nx * 2) == cudaSuccess);
    q.n_tok = T0 - 1;
    ck_assert_msg(dsv4_opt_mhc_post(&q) == 0, "%s", dsv4_last_error());
    get(sca, q.X_out, nx * 2);
    size_t first = SIZE_MAX;
    for (size_t i = 0; i < (size_t)(T0 - 1) * n * D && first == SIZE_MAX; i++)
        if (vec[i] != sca[i]) first = i;
    ck_assert_msg(first == SIZE_MAX, "mhc post: C = %d (vectorised) differs from C = %d (scalar) at element %zu", C,
                  T0 - 1, first);
    for (size_t i = (size_t)(T0 - 1) * n * D; i < nx; i++) /* the vectorised call wrote its last tokens too */
        ck_assert_msg(vec[i] != 0xffff, "mhc post: element %zu of C = %d left unwritten", i, C);
    printf("mhc post: a call of %d tokens (vectorised) gives the bits of a call of %d (scalar)\n", C, T0 - 1);
    cudaFree((void *)q.X), cudaFree((void *)q.out), cudaFree((void *)q.post), cudaFree((void *)q.comb);
    cudaFree(q.X_out);
    free(Xb), free(out), free(post), free(comb), free(vec), free(sca);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ compressor */
static void compressor_case(int overlap, int r, int dc, int np, int steps)
{
    const int C = 2, W = (overlap ? 2 : 1) * dc, rows = (overlap ? 2 : 1) * r, cap = steps / r + 1, row0 = 3;
    rs = 99 + overlap * 13 + dc;
    float *ape = (float *)malloc((size_t)r * W * 4), nw[1024], inv[64];
    for (int i = 0; i < r * W; i++) ape[i] = urand();
    for (int i = 0; i < dc; i++) nw[i] = 1 + 0.1f * urand();
    for (int i = 0; i < np; i++) inv[i] = powf(160000.0f, -(float)(2 * i) / (2 * np));
    /* CPU state (double) */
    double *skv = (double *)calloc((size_t)C * rows * W, 8), *ssc = (double *)malloc((size_t)C * rows * W * 8);
    for (size_t i = 0; i < (size_t)C * rows * W; i++) ssc[i] = -INFINITY;
    double *pool = (double *)calloc((size_t)C * (row0 + cap) * dc, 8);
    dsv4_compressor_params p;
    memset(&p, 0, sizeof p);
    p.n_seq = C, p.ratio = r, p.d_c = dc, p.overlap = overlap, p.rope_pairs = np, p.eps = 1e-6f;
    int32_t hpos[2] = {0, 0}, hact[2];
    p.pos = (int32_t *)dup_dev(hpos, 8);
    p.active = (int32_t *)dup_dev(hpos, 8);
    p.proj_stride = 2 * W + 3;
    p.kv_off = 1, p.gate_off = 2 + W;
    float *proj = (float *)malloc((size_t)C * p.proj_stride * 4);
    p.proj = (float *)dup_dev(NULL, (size_t)C * p.proj_stride * 4);
    p.ape = (float *)dup_dev(ape, (size_t)r * W * 4);
    p.norm_w = (float *)dup_dev(nw, dc * 4);
    p.inv_freq = (float *)dup_dev(inv, 64 * 4);
    p.state_kv = (float *)dup_dev(NULL, (size_t)C * rows * W * 4);
    ck_assert(cudaMemset(p.state_kv, 0, (size_t)C * rows * W * 4) == cudaSuccess);
    p.state_score = (float *)dup_dev(NULL, (size_t)C * rows * W * 4);
    ck_assert(dsv4_opt_fill_f32(p.state_score, -INFINITY, (size_t)C * rows * W, 0) == 0);
    p.pool_seq_stride = (int64_t)(row0 + cap) * dc + 8;
    p.pool = (uint16_t *)dup_dev(NULL, (size_t)C * p.pool_seq_stride * 2);
    p.pool_row0 = row0, p.pool_cap = cap;
    int pos[2] = {0, 0};
    for (int s = 0; s < steps; s++) {
        for (int c = 0; c < C; c++) hact[c] = c == 0 || (s % 3 != 1); /* sequence 1 idles every third step */
        for (int c = 0; c < C; c++) hpos[c] = pos[c];
        for (size_t i = 0; i < (size_t)C * p.proj_stride; i++) proj[i] = urand() * 2;
        ck_assert(cudaMemcpy((void *)p.pos, hpos, 8, cudaMemcpyHostToDevice) == cudaSuccess);
        ck_assert(cudaMemcpy((void *)p.active, hact, 8, cudaMemcpyHostToDevice) == cudaSuccess);
        ck_assert(cudaMemcpy((void *)p.proj, proj, (size_t)C * p.proj_stride * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        ck_assert_msg(dsv4_opt_compressor_update(&p) == 0, "%s", dsv4_last_error());
        for (int c = 0; c < C; c++) {
            if (!hact[c]) continue;
            int pp = pos[c]++, slot = pp % r, row = overlap ? r + slot : slot;
            double *kv = skv + (size_t)c * rows * W, *sc = ssc + (size_t)c * rows * W;
            for (int i = 0; i < W; i++) {
                kv[row * W + i] = proj[c * p.proj_stride + 1 + i];
                sc[row * W + i] = (double)proj[c * p.proj_stride + 2 + W + i] + ape[slot * W + i];
            }
            if ((pp + 1) % r) continue;
            double e[1024], ss = 0;
            for (int ch = 0; ch < dc; ch++) {
                double mx = -INFINITY, sum = 0, acc = 0;
                for (int i = 0; i < rows; i++) mx = fmax(mx, sc[i * W + ((overlap && i >= r) ? dc + ch : ch)]);
                for (int i = 0; i < rows; i++) sum += exp(sc[i * W + ((overlap && i >= r) ? dc + ch : ch)] - mx);
                for (int i = 0; i < rows; i++) {
                    int col = (overlap && i >= r) ? dc + ch : ch;
                    acc += kv[i * W + col] * exp(sc[i * W + col] - mx) / sum;
                }
                e[ch] = acc;
                ss += acc * acc;
            }
            if (overlap) {
                memcpy(kv, kv + r * W, (size_t)r * W * 8);
                memcpy(sc, sc + r * W, (size_t)r * W * 8);
            }
            double rr = 1.0 / sqrt(ss / dc + 1e-6);
            for (int ch = 0; ch < dc; ch++) e[ch] *= rr * nw[ch];
            int w = pp / r;
            for (int i = 0; i < np; i++) {
                double a = (double)(inv[i] * (float)(w * r)), x0 = e[dc - 2 * np + 2 * i], x1 = e[dc - 2 * np + 2 * i + 1];
                e[dc - 2 * np + 2 * i] = x0 * cos(a) - x1 * sin(a);
                e[dc - 2 * np + 2 * i + 1] = x1 * cos(a) + x0 * sin(a);
            }
            memcpy(pool + ((size_t)c * (row0 + cap) + row0 + w) * dc, e, (size_t)dc * 8);
        }
    }
    for (int c = 0; c < C; c++) {
        int n = pos[c] / r;
        ck_assert_int_gt(n, 1);
        uint16_t *gb = (uint16_t *)malloc((size_t)n * dc * 2);
        float *g = (float *)malloc((size_t)n * dc * 4);
        get(gb, p.pool + (size_t)c * p.pool_seq_stride + (size_t)row0 * dc, (size_t)n * dc * 2);
        bf16_to_f32v(g, gb, (size_t)n * dc);
        const double *ref = pool + ((size_t)c * (row0 + cap) + row0) * dc;
        double e = rel(g, ref, (size_t)n * dc);
        ck_assert_msg(e < 8e-3, "compressor overlap %d r %d dc %d seq %d: rel %g", overlap, r, dc, c, e);
        free(gb), free(g);
    }
    free(ape), free(skv), free(ssc), free(pool), free(proj);
    cudaFree((void *)p.pos), cudaFree((void *)p.active), cudaFree((void *)p.proj), cudaFree((void *)p.ape);
    cudaFree((void *)p.norm_w), cudaFree((void *)p.inv_freq), cudaFree(p.state_kv), cudaFree(p.state_score);
    cudaFree(p.pool);
}

START_TEST(test_compressor)
{
    compressor_case(1, 4, 32, 4, 41);
    compressor_case(1, 4, 128, 32, 37);
    compressor_case(0, 8, 32, 4, 50);
    compressor_case(0, 128, 512, 32, 400);
    compressor_case(1, 4, 17 + 1, 1, 23);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ moe */
START_TEST(test_moe)
{
    const int C = 5, E = 8, K = 3, D = 34, I = 18, V = 7;
    rs = 4242;
    float lg[C * 11], bias[E];
    int32_t t2e[V * K], tok[C] = {0, 3, 6, 2, 3};
    for (int i = 0; i < C * 11; i++) lg[i] = urand() * 3;
    for (int e = 0; e < E; e++) bias[e] = 0.1f * urand();
    /* exact ties of s + bias on token 1: experts 2 and 5 equal, the lower must come first */
    lg[11 + 5] = lg[11 + 2] = 4.0f, bias[5] = bias[2] = 0.3f;
    for (int i = 0; i < V * K; i++) t2e[i] = (i * 5 + i / K) % E;
    for (int hash = 0; hash < 2; hash++) {
        dsv4_moe_route_params p;
        memset(&p, 0, sizeof p);
        p.n_tok = C, p.n_experts = E, p.k = K, p.logit_stride = 11, p.routed_scale = 1.5f;
        p.logits = (float *)dup_dev(lg, sizeof lg);
        p.bias = hash ? NULL : (float *)dup_dev(bias, sizeof bias);
        p.tid2eid = (int32_t *)dup_dev(t2e, sizeof t2e);
        p.tokens = (int32_t *)dup_dev(tok, sizeof tok);
        p.ids = (int32_t *)dup_dev(NULL, C * K * 4);
        p.weights = (float *)dup_dev(NULL, C * K * 4);
        ck_assert_msg(dsv4_opt_moe_route(&p) == 0, "%s", dsv4_last_error());
        int32_t ids[C * K];
        float w[C * K];
        get(ids, p.ids, sizeof ids);
        get(w, p.weights, sizeof w);
        for (int c = 0; c < C; c++) {
            double s[E], sum = 0;
            for (int e = 0; e < E; e++) {
                double z = lg[c * 11 + e];
                s[e] = sqrt(z > 20 ? z : log1p(exp(z)));
            }
            int ref[K];
            if (hash) {
                for (int j = 0; j < K; j++) ref[j] = t2e[tok[c] * K + j];
            } else {
                int used[E] = {0};
                for (int j = 0; j < K; j++) {
                    int b = -1;
                    for (int e = 0; e < E; e++)
                        if (!used[e] && (b < 0 || (float)(s[e]) + bias[e] > (float)s[b] + bias[b])) b = e;
                    used[b] = 1;
                    ref[j] = b;
                }
            }
            for (int j = 0; j < K; j++) sum += s[ref[j]];
            for (int j = 0; j < K; j++) {
                ck_assert_msg(ids[c * K + j] == ref[j], "hash %d token %d slot %d: id %d want %d", hash, c, j,
                              ids[c * K + j], ref[j]);
                ck_assert(fabs(w[c * K + j] - s[ref[j]] / sum * 1.5) < 1e-5);
            }
        }
        cudaFree((void *)p.logits), cudaFree((void *)p.bias), cudaFree((void *)p.tid2eid), cudaFree((void *)p.tokens);
        if (!hash) { /* grouped experts on these ids */
            uint16_t *x = (uint16_t *)malloc(C * D * 2), *w13 = (uint16_t *)malloc((size_t)E * 2 * I * D * 2);
            uint16_t *w2 = (uint16_t *)malloc((size_t)E * D * I * 2);
            float sh[C * D];
            for (int i = 0; i < C * D; i++) x[i] = dsv4_f32_to_bf16(urand() * 2), sh[i] = urand();
            for (int i = 0; i < E * 2 * I * D; i++) w13[i] = dsv4_f32_to_bf16(urand() * 1.5f);
            for (int i = 0; i < E * D * I; i++) w2[i] = dsv4_f32_to_bf16(urand() * 0.5f);
            dsv4_moe_experts_params q;
            memset(&q, 0, sizeof q);
            q.n_tok = C, q.k = K, q.dim = D, q.inter = I, q.limit = 2.5f; /* small limit: the clamps act */
            q.x = (uint16_t *)dup_dev(x, C * D * 2);
            q.ids = p.ids, q.weights = p.weights;
            q.w13 = (uint16_t *)dup_dev(w13, (size_t)E * 2 * I * D * 2);
            q.w2 = (uint16_t *)dup_dev(w2, (size_t)E * D * I * 2);
            q.h = (uint16_t *)dup_dev(NULL, C * K * I * 2);
            q.shared = (float *)dup_dev(sh, sizeof sh), q.shared_stride = D;
            q.out = (float *)dup_dev(NULL, C * D * 4);
            ck_assert_msg(dsv4_opt_moe_experts(&q) == 0, "%s", dsv4_last_error());
            float out[C * D];
            double ref[C * D];
            get(out, q.out, sizeof out);
            for (int c = 0; c < C; c++)
                for (int r = 0; r < D; r++) {
                    double acc = 0;
                    for (int j = 0; j < K; j++) {
                        int e = ids[c * K + j];
                        for (int m = 0; m < I; m++) {
                            double g = 0, u = 0;
                            for (int i = 0; i < D; i++) {
                                g += dsv4_bf16_to_f32(w13[((size_t)e * 2 * I + m) * D + i]) * dsv4_bf16_to_f32(x[c * D + i]);
                                u += dsv4_bf16_to_f32(w13[((size_t)e * 2 * I + I + m) * D + i]) * dsv4_bf16_to_f32(x[c * D + i]);
                            }
                            g = fmin(g, 2.5), u = fmax(fmin(u, 2.5), -2.5);
                            double h = g / (1 + exp(-g)) * u * w[c * K + j];
                            acc += h * dsv4_bf16_to_f32(w2[((size_t)e * D + r) * I + m]);
                        }
                    }
                    ref[c * D + r] = acc + sh[c * D + r];
                }
            double e = rel(out, ref, C * D);
            ck_assert_msg(e < 1e-2, "experts rel %g", e);
            ref[3] += 0.5;
            ck_assert(rel(out, ref, C * D) > 1e-3);
            cudaFree((void *)q.x), cudaFree((void *)q.w13), cudaFree((void *)q.w2), cudaFree(q.h);
            cudaFree((void *)q.shared), cudaFree(q.out);
            free(x), free(w13), free(w2);
        }
        cudaFree(p.ids), cudaFree(p.weights);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------------ elementwise */
/* nearest e4m3 value, ties to the even code (round to nearest even) */
static double e4m3_rne(double v)
{
    double best = 0, bd = INFINITY;
    int bc = 0;
    for (int c = 0; c < 256; c++) {
        float q = dsv4_e4m3_to_f32((uint8_t)c);
        if (!isfinite(q)) continue;
        double dd = fabs(q - v);
        if (dd < bd || (dd == bd && (c & 1) == 0 && (bc & 1))) bd = dd, best = q, bc = c;
    }
    return best;
}

/* The norm_rope case of the two tests below: 3 tokens of 160 channels (16 rope pairs) with random rows (every
 * 37th value times `big`), norm weights and angles, written to slots {2, none, 4} of a 5-row ring. p points at
 * device copies of the inputs and has no outputs set; norm_rope_case_free releases the inputs. */
enum { NR_C = 3, NR_D = 160, NR_NP = 16, NR_SLOTS = 5 };
typedef struct norm_rope_case {
    float x[NR_C * NR_D], w[NR_D], cs[NR_C * NR_NP], sn[NR_C * NR_NP];
    int32_t slot[NR_C];
    dsv4_norm_rope_params p;
} norm_rope_case;

static void norm_rope_case_init(norm_rope_case *k, uint64_t seed, float big, int fp8)
{
    rs = seed;
    for (int i = 0; i < NR_C * NR_D; i++) k->x[i] = urand() * 4 * (i % 37 == 0 ? big : 1);
    for (int i = 0; i < NR_D; i++) k->w[i] = 1 + 0.3f * urand();
    for (int i = 0; i < NR_C * NR_NP; i++) k->cs[i] = cosf(urand() * 3), k->sn[i] = sinf(acosf(k->cs[i]));
    k->slot[0] = 2, k->slot[1] = -1, k->slot[2] = 4;
    dsv4_norm_rope_params *p = &k->p;
    memset(p, 0, sizeof *p);
    p->n_tok = NR_C, p->heads = 1, p->dim = NR_D, p->x = dup_dev(k->x, sizeof k->x), p->x_tok_stride = NR_D;
    p->norm = 1, p->weight = (float *)dup_dev(k->w, sizeof k->w), p->eps = 1e-6f, p->rope_pairs = NR_NP;
    p->cos = (float *)dup_dev(k->cs, sizeof k->cs), p->sin = (float *)dup_dev(k->sn, sizeof k->sn);
    p->fp8_nope = fp8, p->post_scale = 1, p->out_slot = (int32_t *)dup_dev(k->slot, sizeof k->slot);
}

static void norm_rope_case_free(norm_rope_case *k)
{
    cudaFree((void *)k->p.x), cudaFree((void *)k->p.weight), cudaFree((void *)k->p.cos);
    cudaFree((void *)k->p.sin), cudaFree((void *)k->p.out_slot);
}

START_TEST(test_norm_rope_fp8)
{
    const int C = NR_C, d = NR_D, np = NR_NP, nope = d - 2 * np, slots = NR_SLOTS;
    static norm_rope_case nr;
    for (int fp8 = 0; fp8 < 2; fp8++) {
        norm_rope_case_init(&nr, 77 + fp8, 1, fp8);
        const float *x = nr.x, *w = nr.w, *cs = nr.cs, *sn = nr.sn;
        const int32_t *slot = nr.slot;
        dsv4_norm_rope_params p = nr.p;
        p.out = (uint16_t *)dup_dev(NULL, (size_t)C * slots * d * 2), p.out_seq_stride = (int64_t)slots * d;
        p.out_f32 = (float *)dup_dev(NULL, C * d * 4);
        ck_assert_msg(dsv4_opt_norm_rope(&p) == 0, "%s", dsv4_last_error());
        uint16_t *ob = (uint16_t *)malloc((size_t)C * slots * d * 2);
        get(ob, p.out, (size_t)C * slots * d * 2);
        for (int c = 0; c < C; c++) {
            double v[d], ss = 0;
            for (int i = 0; i < d; i++) ss += (double)x[c * d + i] * x[c * d + i];
            for (int i = 0; i < d; i++) v[i] = x[c * d + i] / sqrt(ss / d + 1e-6) * w[i];
            for (int i = 0; i < np; i++) {
                double x0 = v[nope + 2 * i], x1 = v[nope + 2 * i + 1], cc = cs[c * np + i], s = sn[c * np + i];
                v[nope + 2 * i] = x0 * cc - x1 * s, v[nope + 2 * i + 1] = x1 * cc + x0 * s;
            }
            if (fp8)
                for (int b = 0; b < nope; b += 64) {
                    double a = 0;
                    for (int i = b; i < nope && i < b + 64; i++) a = fmax(a, fabs(v[i]));
                    double sc = exp2(ceil(log2(fmax(a, 1e-4) / 448)));
                    for (int i = b; i < nope && i < b + 64; i++) v[i] = e4m3_rne(fmax(fmin(v[i] / sc, 448), -448)) * sc;
                }
            for (int s = 0; s < slots; s++) {
                const uint16_t *row = ob + ((size_t)c * slots + s) * d;
                if (s != slot[c]) { /* untouched: still the 0xffff poison */
                    ck_assert_msg(row[0] == 0xffff, "seq %d slot %d written", c, s);
                    continue;
                }
                int bad = 0;
                for (int i = 0; i < d; i++) {
                    double g = dsv4_bf16_to_f32(row[i]);
                    double tol = fp8 && i < nope ? 1e-6 + 1e-6 * fabs(v[i]) : 8e-3 * fabs(v[i]) + 1e-6;
                    if (!(fabs(g - (fp8 && i < nope ? v[i] : bfr((float)v[i]))) <= tol)) bad++;
                }
                ck_assert_msg(bad <= (fp8 ? 2 : 0), "fp8 %d seq %d: %d channels off", fp8, c, bad);
            }
        }
        free(ob);
        cudaFree(p.out), cudaFree(p.out_f32);
        norm_rope_case_free(&nr);
    }
}
END_TEST

/* The warp-per-row norm_rope of long runs (warp_rows): the q heads (f32 in, unweighted norm, RoPE on the last 64
 * channels) at 300 tokens x 8 heads x 512, and the indexer queries' shape (128 channels, no norm) from bf16 input
 * with RoPE and an f32 copy: each row against a double reference within bf16 rounding (4e-3 of |v|), against
 * the block kernel (the same row without warp_rows) within one bf16 ulp everywhere, and a row's
 * bits the same whether it is computed in a call of 300 or of 37 tokens. A ring-slot write with warp_rows set keeps
 * the block kernel (dsv4_opt_norm_rope_warp_ok is 0). */
static void norm_rope_rows_ref(const float *x, int d, int norm, int np, const float *cs, const float *sn, double *v)
{
    double ss = 0;
    for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
    const double r = norm ? 1.0 / sqrt(ss / d + 1e-6) : 1.0;
    for (int i = 0; i < d; i++) v[i] = x[i] * r;
    for (int i = 0, r0 = d - 2 * np; i < np; i++) {
        const double x0 = v[r0 + 2 * i], x1 = v[r0 + 2 * i + 1];
        v[r0 + 2 * i] = x0 * cs[i] - x1 * sn[i], v[r0 + 2 * i + 1] = x1 * cs[i] + x0 * sn[i];
    }
}

START_TEST(test_norm_rope_warp_rows)
{
    enum { T = 300, H = 8, NP = 32 };
    const int dims[2] = {512, 128}, norms[2] = {1, 0}, bf16_in[2] = {0, 1};
    for (int k = 0; k < 2; k++) {
        const int d = dims[k], n = T * H * d;
        rs = 901 + k;
        float *x = (float *)malloc((size_t)n * 4), *cs = (float *)malloc(T * NP * 4), *sn = (float *)malloc(T * NP * 4);
        uint16_t *xb = (uint16_t *)malloc((size_t)n * 2);
        for (int i = 0; i < n; i++) {
            x[i] = urand() * 3 * (i % 41 == 0 ? 20 : 1);
            xb[i] = dsv4_f32_to_bf16(x[i]);
            if (bf16_in[k]) x[i] = dsv4_bf16_to_f32(xb[i]);
        }
        for (int i = 0; i < T * NP; i++) cs[i] = cosf(urand() * 3), sn[i] = sinf(acosf(cs[i]));
        dsv4_norm_rope_params p;
        memset(&p, 0, sizeof p);
        p.n_tok = T, p.heads = H, p.dim = d, p.x_bf16 = bf16_in[k];
        p.x = bf16_in[k] ? dup_dev(xb, (size_t)n * 2) : dup_dev(x, (size_t)n * 4);
        p.x_tok_stride = (int64_t)H * d, p.norm = norms[k], p.eps = 1e-6f, p.rope_pairs = NP;
        p.cos = (float *)dup_dev(cs, T * NP * 4), p.sin = (float *)dup_dev(sn, T * NP * 4);
        p.out = (uint16_t *)dup_dev(NULL, (size_t)n * 2), p.out_tok_stride = (int64_t)H * d, p.post_scale = 1;
        p.out_f32 = k == 1 ? (float *)dup_dev(NULL, (size_t)n * 4) : NULL;
        dsv4_norm_rope_params blk = p, part = p;
        blk.out = (uint16_t *)dup_dev(NULL, (size_t)n * 2);
        blk.out_f32 = NULL;
        p.warp_rows = 1;
        ck_assert_msg(dsv4_opt_norm_rope_warp_ok(&p), "dim %d: the warp kernel should take this call", d);
        ck_assert_msg(!dsv4_opt_norm_rope_warp_ok(&blk), "dim %d: warp_rows 0 must keep the block kernel", d);
        ck_assert_msg(dsv4_opt_norm_rope(&p) == 0 && dsv4_opt_norm_rope(&blk) == 0, "%s", dsv4_last_error());
        /* the last 37 tokens alone: the same rows, the same bits */
        part.n_tok = 37, part.warp_rows = 1;
        part.x = (const char *)p.x + (size_t)(T - 37) * H * d * (bf16_in[k] ? 2 : 4);
        part.cos = p.cos + (size_t)(T - 37) * NP, part.sin = p.sin + (size_t)(T - 37) * NP;
        part.out = (uint16_t *)dup_dev(NULL, (size_t)37 * H * d * 2), part.out_f32 = NULL;
        ck_assert_msg(dsv4_opt_norm_rope(&part) == 0, "%s", dsv4_last_error());
        uint16_t *ow = (uint16_t *)malloc((size_t)n * 2), *ob = (uint16_t *)malloc((size_t)n * 2);
        uint16_t *op = (uint16_t *)malloc((size_t)37 * H * d * 2);
        float *of = k == 1 ? (float *)malloc((size_t)n * 4) : NULL;
        get(ow, p.out, (size_t)n * 2), get(ob, blk.out, (size_t)n * 2), get(op, part.out, (size_t)37 * H * d * 2);
        if (of) get(of, p.out_f32, (size_t)n * 4);
        double v[512];
        int bad_ref = 0, bad_blk = 0, bad_f32 = 0, differ_blk = 0;
        for (int row = 0; row < T * H; row++) {
            const int t = row / H;
            norm_rope_rows_ref(x + (size_t)row * d, d, norms[k], NP, cs + t * NP, sn + t * NP, v);
            for (int i = 0; i < d; i++) {
                const size_t j = (size_t)row * d + i;
                const double g = dsv4_bf16_to_f32(ow[j]), b = dsv4_bf16_to_f32(ob[j]);
                if (!(fabs(g - v[i]) <= 4e-3 * fabs(v[i]) + 1e-6)) bad_ref++; /* bf16 rounding: 2^-9 */
                if (!(fabs(g - b) <= 8e-3 * fabs(b) + 1e-6)) bad_blk++; /* one bf16 ulp: <= 2^-7 of it */
                differ_blk += ow[j] != ob[j];
                if (of && !(fabs(of[j] - v[i]) <= 1e-5 * fabs(v[i]) + 1e-6)) bad_f32++;
            }
        }
        const size_t off = (size_t)(T - 37) * H * d;
        ck_assert_msg(!memcmp(op, ow + off, (size_t)37 * H * d * 2),
                      "dim %d: rows of a 37-token call differ from the same rows of the 300-token call", d);
        printf("norm_rope warp rows (dim %d, %s in, norm %d): %d of %d values off the double reference, %d off the "
               "block kernel by > 1 bf16 ulp (%d differ in bits), %d f32 copies off\n",
               d, bf16_in[k] ? "bf16" : "f32", norms[k], bad_ref, n, bad_blk, differ_blk, bad_f32);
        ck_assert_msg(bad_ref == 0 && bad_blk == 0 && bad_f32 == 0, "dim %d: %d / %d / %d values off", d, bad_ref,
                      bad_blk, bad_f32);
        /* a ring-slot write keeps the block kernel even with warp_rows */
        dsv4_norm_rope_params ring = p;
        ring.heads = 1, ring.out_slot = (const int32_t *)p.cos;
        ck_assert(!dsv4_opt_norm_rope_warp_ok(&ring));
        cudaFree((void *)p.x), cudaFree((void *)p.cos), cudaFree((void *)p.sin), cudaFree(p.out), cudaFree(blk.out);
        cudaFree(part.out), cudaFree(p.out_f32);
        free(x), free(xb), free(cs), free(sn), free(ow), free(ob), free(op), free(of);
    }
}
END_TEST

/* A --kv fp8 entry (kernels/kv_layout.h) as floats, from its definition: code x 2^(scale byte - 127), rope bf16. */
static void kv8_decode_host(const uint8_t *e, int d, int rope, float *out)
{
    const int nope = d - rope;
    for (int ch = 0; ch < nope; ch++)
        out[ch] = dsv4_e4m3_to_f32(e[dsv4_kv8_codes_at(rope) + ch]) *
                  ldexpf(1.0f, (int)e[dsv4_kv8_scales_at(d, rope) + ch / DSV4_KV8_BLOCK] - 127);
    for (int i = 0; i < rope; i++) {
        uint16_t b;
        memcpy(&b, e + 2 * i, 2);
        out[nope + i] = dsv4_bf16_to_f32(b);
    }
}

/* The fp8 cache writers: norm_rope (window ring, out8) and the compressor (pool8) store entries that decode to
 * exactly the bf16 values of the fp8 simulation on the same inputs; slots not written keep their poison. */
START_TEST(test_kv8_writers)
{
    const int C = NR_C, d = NR_D, np = NR_NP, rope = 2 * np, slots = NR_SLOTS;
    const int eb = (int)dsv4_kv8_entry_bytes(d, rope);
    ck_assert_int_eq(eb, (int)((2 * rope + (d - rope) + 2 + 15) / 16 * 16));
    static norm_rope_case nr;
    norm_rope_case_init(&nr, 91, 50, 1); /* a few large values: varied scales */
    const int32_t *slot = nr.slot;
    float dec[NR_D];
    dsv4_norm_rope_params p = nr.p;
    p.out = (uint16_t *)dup_dev(NULL, (size_t)C * slots * d * 2), p.out_seq_stride = (int64_t)slots * d;
    ck_assert_msg(dsv4_opt_norm_rope(&p) == 0, "%s", dsv4_last_error());
    dsv4_norm_rope_params p8 = p;
    p8.out = NULL, p8.out8 = (uint8_t *)dup_dev(NULL, (size_t)C * slots * eb), p8.out8_seq_stride = (int64_t)slots * eb;
    ck_assert_msg(dsv4_opt_norm_rope(&p8) == 0, "%s", dsv4_last_error());
    uint16_t *ob = (uint16_t *)malloc((size_t)C * slots * d * 2);
    uint8_t *o8 = (uint8_t *)malloc((size_t)C * slots * eb);
    get(ob, p.out, (size_t)C * slots * d * 2);
    get(o8, p8.out8, (size_t)C * slots * eb);
    for (int c = 0; c < C; c++)
        for (int sl = 0; sl < slots; sl++) {
            const uint8_t *e = o8 + ((size_t)c * slots + sl) * eb;
            if (sl != slot[c]) {
                for (int b = 0; b < eb; b++) ck_assert_msg(e[b] == 0xff, "seq %d slot %d byte %d written", c, sl, b);
                continue;
            }
            kv8_decode_host(e, d, rope, dec);
            for (int i = 0; i < d; i++)
                ck_assert_msg(dec[i] == dsv4_bf16_to_f32(ob[((size_t)c * slots + sl) * d + i]),
                              "norm_rope seq %d channel %d: entry %g, simulation %g", c, i, dec[i],
                              dsv4_bf16_to_f32(ob[((size_t)c * slots + sl) * d + i]));
            for (int b = dsv4_kv8_scales_at(d, rope) + dsv4_kv8_scales(d - rope); b < eb; b++)
                ck_assert_msg(e[b] == 0xff, "padding byte %d written", b);
        }
    /* refused: out8 with out, without fp8_nope, or with a layout kernels/kv_layout.h has no form for */
    p8.out = p.out;
    ck_assert_int_eq(dsv4_opt_norm_rope(&p8), DSV4_ERR_USAGE);
    p8.out = NULL, p8.fp8_nope = 0;
    ck_assert_int_eq(dsv4_opt_norm_rope(&p8), DSV4_ERR_USAGE);
    p8.fp8_nope = 1, p8.rope_pairs = 3;
    ck_assert_int_eq(dsv4_opt_norm_rope(&p8), DSV4_ERR_USAGE);
    free(ob), free(o8);
    cudaFree(p.out), cudaFree(p8.out8);
    norm_rope_case_free(&nr);

    /* the compressor: HCA r = 4, d_c 160; two states fed the same projections, one pool of each form */
    const int r = 4, dc = d, cap = 3, row0 = 2, steps = 3 * r;
    float ape[4 * 160], nw[160], inv[16];
    for (int i = 0; i < r * dc; i++) ape[i] = urand();
    for (int i = 0; i < dc; i++) nw[i] = 1 + 0.1f * urand();
    for (int i = 0; i < np; i++) inv[i] = powf(160000.0f, -(float)(2 * i) / (2 * np));
    dsv4_compressor_params q[2];
    memset(q, 0, sizeof q);
    int32_t hpos[1] = {0}, hact[1] = {1};
    float *proj = (float *)malloc((size_t)(2 * dc) * 4);
    for (int f = 0; f < 2; f++) {
        dsv4_compressor_params *k = &q[f];
        k->n_seq = 1, k->ratio = r, k->d_c = dc, k->overlap = 0, k->rope_pairs = np, k->fp8_nope = 1, k->eps = 1e-6f;
        k->pos = (int32_t *)dup_dev(hpos, 4), k->active = (int32_t *)dup_dev(hact, 4);
        k->proj = (float *)dup_dev(NULL, (size_t)2 * dc * 4), k->proj_stride = 2 * dc, k->kv_off = 0, k->gate_off = dc;
        k->ape = (float *)dup_dev(ape, sizeof ape), k->norm_w = (float *)dup_dev(nw, sizeof nw);
        k->inv_freq = (float *)dup_dev(inv, sizeof inv);
        k->state_kv = (float *)dup_dev(NULL, (size_t)r * dc * 4);
        ck_assert(cudaMemset(k->state_kv, 0, (size_t)r * dc * 4) == cudaSuccess);
        k->state_score = (float *)dup_dev(NULL, (size_t)r * dc * 4);
        ck_assert(dsv4_opt_fill_f32(k->state_score, -INFINITY, (size_t)r * dc, 0) == 0);
        k->pool_row0 = row0, k->pool_cap = cap;
        if (f == 0)
            k->pool = (uint16_t *)dup_dev(NULL, (size_t)(row0 + cap) * dc * 2), k->pool_seq_stride = (row0 + cap) * dc;
        else
            k->pool8 = (uint8_t *)dup_dev(NULL, (size_t)(row0 + cap) * eb), k->pool8_seq_stride = (row0 + cap) * eb;
    }
    for (int st = 0; st < steps; st++) {
        hpos[0] = st;
        for (int i = 0; i < 2 * dc; i++) proj[i] = urand() * 2 * (i % 41 == 0 ? 30 : 1);
        for (int f = 0; f < 2; f++) {
            ck_assert(cudaMemcpy((void *)q[f].pos, hpos, 4, cudaMemcpyHostToDevice) == cudaSuccess);
            ck_assert(cudaMemcpy((void *)q[f].proj, proj, (size_t)2 * dc * 4, cudaMemcpyHostToDevice) == cudaSuccess);
            ck_assert_msg(dsv4_opt_compressor_update(&q[f]) == 0, "%s", dsv4_last_error());
        }
    }
    uint16_t pb[5 * 160];
    uint8_t *p8b = (uint8_t *)malloc((size_t)(row0 + cap) * eb);
    get(pb, q[0].pool, sizeof pb);
    get(p8b, q[1].pool8, (size_t)(row0 + cap) * eb);
    for (int row = 0; row < row0 + cap; row++) {
        const uint8_t *e = p8b + (size_t)row * eb;
        if (row < row0) { /* the window ring's rows: the compressor never writes them */
            for (int b = 0; b < eb; b++) ck_assert_msg(e[b] == 0xff, "compressor wrote ring row %d", row);
            continue;
        }
        kv8_decode_host(e, dc, rope, dec);
        for (int i = 0; i < dc; i++)
            ck_assert_msg(dec[i] == dsv4_bf16_to_f32(pb[row * dc + i]), "compressor entry %d channel %d: %g vs %g",
                          row - row0, i, dec[i], dsv4_bf16_to_f32(pb[row * dc + i]));
    }
    printf("kv8 writers: norm_rope and compressor entries of %d B decode to the simulation's values\n", eb);
    q[1].pool = q[0].pool; /* both pools: refused */
    ck_assert_int_eq(dsv4_opt_compressor_update(&q[1]), DSV4_ERR_USAGE);
    for (int f = 0; f < 2; f++) {
        cudaFree((void *)q[f].pos), cudaFree((void *)q[f].active), cudaFree((void *)q[f].proj);
        cudaFree((void *)q[f].ape), cudaFree((void *)q[f].norm_w), cudaFree((void *)q[f].inv_freq);
        cudaFree(q[f].state_kv), cudaFree(q[f].state_score);
    }
    cudaFree(q[0].pool), cudaFree(q[1].pool8);
    free(proj), free(p8b);
}
END_TEST

START_TEST(test_argmax_ties)
{
    const int R = 3, n = 1000;
    float *x = (float *)malloc(R * n * 4);
    rs = 5;
    for (int i = 0; i < R * n; i++) x[i] = urand();
    x[0 * n + 700] = x[0 * n + 300] = 5.0f; /* tie: 300 wins */
    x[1 * n + 999] = 9.0f;
    x[2 * n + 0] = 9.0f;
    x[2 * n + 1] = NAN;
    float *dx = (float *)dup_dev(x, R * n * 4);
    int32_t *dout = (int32_t *)dup_dev(NULL, R * 4), out[R];
    ck_assert(dsv4_opt_argmax(dout, dx, R, n, n, 0) == 0);
    get(out, dout, sizeof out);
    ck_assert_int_eq(out[0], 300);
    ck_assert_int_eq(out[1], 999);
    ck_assert_int_eq(out[2], 0);
    cudaFree(dx), cudaFree(dout), free(x);
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("opt_kernels");
    const TTest *const tests[] = {
        test_mhc,
        test_mhc_batch_bitwise,
        test_mhc_long,
        test_mhc_long_tiled_vs_rows,
        test_mhc_post_long_bitwise,
        test_compressor,
        test_moe,
        test_norm_rope_fp8,
        test_norm_rope_warp_rows,
        test_kv8_writers,
        test_argmax_ties,
    };
    dsv4_test_add_each(s, 300, tests, (int)(sizeof tests / sizeof tests[0])); /* one case each: CK_RUN_CASE */
    return dsv4_test_main(s);
}
