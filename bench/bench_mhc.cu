/* bench_mhc.cu - micro-benchmark of kernels/mhc.cu: the mHC pre of a block site (both variants of `mhc`: castfree,
 * roundtrip) and the post, Flash shapes (model-spec §1, §5): D 4096, n 4 streams, n_mix 24, Sinkhorn 20, C = 1, 16,
 * 64 tokens, and C = 8192 (a long prefill chunk), where castfree takes the tiled partial kernel and the row
 * castfree-rows the per-token one (dsv4_mhc_pre_params.partial, `dsv4 bench --prefill --mhc-pre rows`), and the
 * post's castfree row is its vectorised kernel (8 elements per thread).
 *   run: build/bench_mhc [--quick] [--verbose]
 * Bytes counted (the fewest): pre reads X (bf16 [C, 4, D]), fn (f32 [24, 4D]), norm_w once and writes x (f32),
 * xn (bf16) and the coefficients once; post reads X (bf16), out (f32), post/comb and writes X_out (bf16). The
 * roundtrip variant's fp32 copy of X (written by its pre, read by its post) is what it wastes: not counted.
 * FLOPs: pre 2·(n_mix + 1)·4D (projection + sum of squares) + 2·4D (collapse) + 3·D (norm) per token; post
 * (2n² + 2n)·D per token. Working sets are <= 9 MB, so the L2 flush before every rep is what makes them cold.
 * Spot checks (first call of each variant, before the timing): pre / post / comb / x / xn of the first and last
 * token and X_out of the post against a double-precision CPU computation from the same inputs.
 */
#include <math.h>
#include <string.h>

#include "../kernels/mhc.cuh"
#include "bench_common.cuh"

enum { D = 4096, N = 4, NMIX = (2 + N) * N, ND = N * D, ITERS = 20 };
static const float HC_EPS = 1e-6f, NORM_EPS = 1e-6f;

static void pre_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_mhc_pre((const dsv4_mhc_pre_params *)ctx));
}
static void post_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_mhc_post((const dsv4_mhc_post_params *)ctx));
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* CPU mHC pre of token c (model-spec §5.1) in double: pre[N], post[N], comb[N*N], x[D], xn[D]. */
static void cpu_pre(const uint16_t *X, const float *fn, const float *base, const float *scale, const float *nw, int c,
                    double *pre, double *post, double *comb, double *x, double *xn)
{
    const uint16_t *v = X + (size_t)c * ND;
    double ss = 0.0, m[NMIX];
    for (int i = 0; i < ND; i++) ss += (double)bench_bf16_to_f32(v[i]) * bench_bf16_to_f32(v[i]);
    const double rho = 1.0 / sqrt(ss / ND + NORM_EPS);
    for (int r = 0; r < NMIX; r++) {
        double a = 0.0;
        for (int i = 0; i < ND; i++) a += (double)fn[(size_t)r * ND + i] * bench_bf16_to_f32(v[i]);
        m[r] = a * rho;
    }
    for (int j = 0; j < N; j++) {
        pre[j] = sigm(m[j] * scale[0] + base[j]) + HC_EPS;
        post[j] = 2.0 * sigm(m[N + j] * scale[1] + base[N + j]);
    }
    double C0[N * N];
    for (int i = 0; i < N * N; i++) C0[i] = m[2 * N + i] * scale[2] + base[2 * N + i];
    for (int j = 0; j < N; j++) { /* row softmax + eps */
        double mx = C0[j * N], s = 0.0;
        for (int k = 1; k < N; k++) mx = fmax(mx, C0[j * N + k]);
        for (int k = 0; k < N; k++) s += exp(C0[j * N + k] - mx);
        for (int k = 0; k < N; k++) comb[j * N + k] = exp(C0[j * N + k] - mx) / s + HC_EPS;
    }
    for (int it = 0; it < ITERS; it++) { /* (row,) column: ends on a column step */
        if (it > 0)
            for (int j = 0; j < N; j++) {
                double s = 0.0;
                for (int k = 0; k < N; k++) s += comb[j * N + k];
                for (int k = 0; k < N; k++) comb[j * N + k] /= s + HC_EPS;
            }
        for (int k = 0; k < N; k++) {
            double s = 0.0;
            for (int j = 0; j < N; j++) s += comb[j * N + k];
            for (int j = 0; j < N; j++) comb[j * N + k] /= s + HC_EPS;
        }
    }
    double s2 = 0.0;
    for (int d = 0; d < D; d++) {
        double a = 0.0;
        for (int j = 0; j < N; j++) a += pre[j] * bench_bf16_to_f32(v[(size_t)j * D + d]);
        x[d] = a;
        s2 += a * a;
    }
    const double rr = 1.0 / sqrt(s2 / D + NORM_EPS);
    for (int d = 0; d < D; d++) xn[d] = nw[d] * (x[d] * rr);
}

typedef struct mhc_dev {
    void *X, *Xf, *fn, *base, *scale, *nw, *pre, *post, *comb, *x, *xn, *out, *Xo, *ws;
    size_t ws_bytes;
} mhc_dev;

/* The pre's outputs of tokens 0 and C-1 against cpu_pre. */
static void check_pre(const char *var, int C, const mhc_dev *m)
{
    uint16_t *X = (uint16_t *)bench_to_host(m->X, (size_t)C * ND * 2);
    float *fn = (float *)bench_to_host(m->fn, (size_t)NMIX * ND * 4);
    float *base = (float *)bench_to_host(m->base, NMIX * 4), *scale = (float *)bench_to_host(m->scale, 3 * 4);
    float *nw = (float *)bench_to_host(m->nw, D * 4);
    float *pre = (float *)bench_to_host(m->pre, (size_t)C * N * 4), *post = (float *)bench_to_host(m->post, (size_t)C * N * 4);
    float *comb = (float *)bench_to_host(m->comb, (size_t)C * N * N * 4), *x = (float *)bench_to_host(m->x, (size_t)C * D * 4);
    uint16_t *xn = (uint16_t *)bench_to_host(m->xn, (size_t)C * D * 2);
    double wp[N], wq[N], wc[N * N], *wx = (double *)malloc(D * sizeof(double)), *wn = (double *)malloc(D * sizeof(double));
    float *xnf = (float *)malloc(D * sizeof(float));
    const int toks[2] = {0, C - 1};
    for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
        const int c = toks[t];
        cpu_pre(X, fn, base, scale, nw, c, wp, wq, wc, wx, wn);
        char what[96];
        snprintf(what, sizeof(what), "mhc_pre %s C=%d tok %d pre", var, C, c);
        bench_check_close(what, pre + (size_t)c * N, wp, N, 1e-5, 1e-4);
        snprintf(what, sizeof(what), "mhc_pre %s C=%d tok %d post", var, C, c);
        bench_check_close(what, post + (size_t)c * N, wq, N, 1e-5, 1e-4);
        snprintf(what, sizeof(what), "mhc_pre %s C=%d tok %d comb", var, C, c);
        bench_check_close(what, comb + (size_t)c * N * N, wc, N * N, 1e-5, 1e-3);
        snprintf(what, sizeof(what), "mhc_pre %s C=%d tok %d x", var, C, c);
        bench_check_close(what, x + (size_t)c * D, wx, D, 1e-4, 1e-3);
        for (int d = 0; d < D; d++) xnf[d] = bench_bf16_to_f32(xn[(size_t)c * D + d]);
        snprintf(what, sizeof(what), "mhc_pre %s C=%d tok %d xn (bf16)", var, C, c);
        bench_check_close(what, xnf, wn, D, 1e-3, 1e-2);
    }
    free(X), free(fn), free(base), free(scale), free(nw), free(pre), free(post), free(comb), free(x), free(xn);
    free(wx), free(wn), free(xnf);
}

/* X_out of tokens 0 and C-1 against X'[k] = post[k]·out + Σ_j comb[j][k]·X[j] from the device's post/comb. */
static void check_post(const char *var, int C, const mhc_dev *m)
{
    uint16_t *X = (uint16_t *)bench_to_host(m->X, (size_t)C * ND * 2), *Xo = (uint16_t *)bench_to_host(m->Xo, (size_t)C * ND * 2);
    float *out = (float *)bench_to_host(m->out, (size_t)C * D * 4);
    float *post = (float *)bench_to_host(m->post, (size_t)C * N * 4), *comb = (float *)bench_to_host(m->comb, (size_t)C * N * N * 4);
    double *want = (double *)malloc(ND * sizeof(double));
    float *got = (float *)malloc(ND * sizeof(float));
    const int toks[2] = {0, C - 1};
    for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
        const int c = toks[t];
        for (int k = 0; k < N; k++)
            for (int d = 0; d < D; d++) {
                double a = (double)post[c * N + k] * out[(size_t)c * D + d];
                for (int j = 0; j < N; j++)
                    a += (double)comb[(size_t)c * N * N + j * N + k] * bench_bf16_to_f32(X[((size_t)c * N + j) * D + d]);
                want[(size_t)k * D + d] = a;
                got[(size_t)k * D + d] = bench_bf16_to_f32(Xo[((size_t)c * N + k) * D + d]);
            }
        char what[96];
        snprintf(what, sizeof(what), "mhc_post %s C=%d tok %d X_out (bf16)", var, C, c);
        bench_check_close(what, got, want, ND, 1e-3, 1e-2);
    }
    free(X), free(Xo), free(out), free(post), free(comb), free(want), free(got);
}

int main(int argc, char **argv)
{
    bench_init(argc, argv);
    bench_ceilings cl = bench_measure_ceilings();
    cublasHandle_t cub;
    if (cublasCreate(&cub) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    bench_header();
    const int Cs[4] = {1, 16, 64, 8192};
    for (int ci = 0; ci < 4; ci++) {
        const int C = Cs[ci];
        mhc_dev m;
        memset(&m, 0, sizeof(m));
        BENCH_CHECK(cudaMalloc(&m.X, (size_t)C * ND * 2));
        BENCH_CHECK(cudaMalloc(&m.Xf, (size_t)C * ND * 4));
        BENCH_CHECK(cudaMalloc(&m.fn, (size_t)NMIX * ND * 4));
        BENCH_CHECK(cudaMalloc(&m.base, NMIX * 4));
        BENCH_CHECK(cudaMalloc(&m.scale, 3 * 4));
        BENCH_CHECK(cudaMalloc(&m.nw, D * 4));
        BENCH_CHECK(cudaMalloc(&m.pre, (size_t)C * N * 4));
        BENCH_CHECK(cudaMalloc(&m.post, (size_t)C * N * 4));
        BENCH_CHECK(cudaMalloc(&m.comb, (size_t)C * N * N * 4));
        BENCH_CHECK(cudaMalloc(&m.x, (size_t)C * D * 4));
        BENCH_CHECK(cudaMalloc(&m.xn, (size_t)C * D * 2));
        BENCH_CHECK(cudaMalloc(&m.out, (size_t)C * D * 4));
        BENCH_CHECK(cudaMalloc(&m.Xo, (size_t)C * ND * 2));
        bench_fill_bf16(m.X, (size_t)C * ND, 41, 1.0f);
        bench_fill_f32(m.fn, (size_t)NMIX * ND, 42, 0.01f); /* m ~ O(0.5): sigmoid / softmax not saturated */
        bench_fill_f32(m.base, NMIX, 43, 0.5f);
        bench_fill_f32(m.scale, 3, 44, 1.0f);
        bench_fill_f32(m.nw, D, 45, 1.0f);
        bench_fill_f32(m.out, (size_t)C * D, 46, 1.0f);

        dsv4_mhc_pre_params p;
        memset(&p, 0, sizeof(p));
        p.n_tok = C;
        p.n_streams = N;
        p.dim = D;
        p.head = 0;
        p.sinkhorn_iters = ITERS;
        p.hc_eps = HC_EPS;
        p.norm_eps = NORM_EPS;
        p.X = (const uint16_t *)m.X;
        p.fn = (const float *)m.fn;
        p.base = (const float *)m.base;
        p.scale = (const float *)m.scale;
        p.norm_w = (const float *)m.nw;
        p.pre = (float *)m.pre;
        p.post = (float *)m.post;
        p.comb = (float *)m.comb;
        p.x = (float *)m.x;
        p.xn = (uint16_t *)m.xn;
        p.X_f32 = (float *)m.Xf;
        p.cublas = cub;
        p.kernel = DSV4_MHC_KERNEL_CASTFREE;
        size_t wsb = dsv4_opt_mhc_pre_workspace_bytes(&p);
        p.kernel = DSV4_MHC_KERNEL_ROUNDTRIP;
        if (dsv4_opt_mhc_pre_workspace_bytes(&p) > wsb) wsb = dsv4_opt_mhc_pre_workspace_bytes(&p);
        BENCH_CHECK(cudaMalloc(&m.ws, wsb));
        p.workspace = m.ws;
        p.workspace_bytes = wsb;

        const double pre_bytes = (double)C * ND * 2 + (double)NMIX * ND * 4 + D * 4.0 + (double)C * D * 6 +
                                 (double)C * (2 * N + N * N) * 4;
        const double pre_flops = (double)C * (2.0 * (NMIX + 1) * ND + 2.0 * ND + 3.0 * D);
        const double post_bytes = (double)C * ND * 2 * 2 + (double)C * D * 4 + (double)C * (N + N * N) * 4;
        const double post_flops = (double)C * (2.0 * N * N + 2.0 * N) * D;
        char shape[64];
        /* from DSV4_MHC_TILED_MIN_TOKENS on castfree is the tiled kernel, castfree-rows the per-token one */
        const int n_var = C >= DSV4_MHC_TILED_MIN_TOKENS ? 3 : 2;
        for (int v = 0; v < n_var; v++) {
            const char *var = v == 0 ? "castfree" : v == 1 ? "roundtrip" : "castfree-rows";
            p.kernel = v == 1 ? DSV4_MHC_KERNEL_ROUNDTRIP : DSV4_MHC_KERNEL_CASTFREE;
            p.partial = v == 2 ? DSV4_MHC_PARTIAL_ROWS : DSV4_MHC_PARTIAL_TILED;
            /* garbage in every output first: an unwritten element (or one left by the other variant or the
             * previous C, whose inputs share the seeds) must fail the check */
            bench_fill_f32(m.x, (size_t)C * D, 47 + v, 1e3f);
            bench_fill_bf16(m.xn, (size_t)C * D, 47 + v, 1e3f);
            bench_fill_f32(m.pre, (size_t)C * N, 47 + v, 1e3f);
            bench_fill_f32(m.post, (size_t)C * N, 47 + v, 1e3f);
            bench_fill_f32(m.comb, (size_t)C * N * N, 47 + v, 1e3f);
            BENCH_OK(dsv4_opt_mhc_pre(&p));
            BENCH_CHECK(cudaDeviceSynchronize());
            check_pre(var, C, &m);
            double us = bench_median_us(pre_fn, &p);
            snprintf(shape, sizeof(shape), "n4 D4096 mix24 sk20");
            bench_row(&cl, "mhc_pre", var, "-", C, shape, us, pre_bytes, pre_flops);
        }
        /* the post after the pres: X_f32 holds the roundtrip pre's fp32 copy of X, post/comb the last coefficients */
        dsv4_mhc_post_params q;
        memset(&q, 0, sizeof(q));
        q.n_tok = C;
        q.n_streams = N;
        q.dim = D;
        q.X = (const uint16_t *)m.X;
        q.X_f32 = (const float *)m.Xf;
        q.out = (const float *)m.out;
        q.post = (const float *)m.post;
        q.comb = (const float *)m.comb;
        q.X_out = (uint16_t *)m.Xo;
        for (int v = 0; v < 2; v++) {
            const char *var = v == 0 ? "castfree" : "roundtrip";
            q.kernel = v == 0 ? DSV4_MHC_KERNEL_CASTFREE : DSV4_MHC_KERNEL_ROUNDTRIP;
            bench_fill_bf16(m.Xo, (size_t)C * ND, 48 + v, 1e3f);
            BENCH_OK(dsv4_opt_mhc_post(&q));
            BENCH_CHECK(cudaDeviceSynchronize());
            check_post(var, C, &m);
            double us = bench_median_us(post_fn, &q);
            snprintf(shape, sizeof(shape), "n4 D4096");
            bench_row(&cl, "mhc_post", var, "-", C, shape, us, post_bytes, post_flops);
        }
        void *bufs[] = {m.X, m.Xf, m.fn, m.base, m.scale, m.nw, m.pre, m.post, m.comb, m.x, m.xn, m.out, m.Xo, m.ws};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) cudaFree(bufs[i]);
    }
    cublasDestroy(cub);
    return bench_finish();
}
