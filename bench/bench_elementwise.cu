/* bench_elementwise.cu - micro-benchmark of kernels/elementwise.cu and kernels/step.cu with the Flash shapes
 * (model-spec §1, §3, §4, §6, §9): norm_rope of the queries (64 heads x 512, f32 in, unweighted RMSNorm, RoPE on
 * the trailing 64, bf16 out) and of the KV (1 head x 512 from the strided projection, weighted norm, RoPE, the
 * window-ring write + the f32 copy; `--kv` bf16 and fp8), the embedding gather into the 4 streams (vocab 129280,
 * D 4096), the greedy argmax over the vocab, and the per-step bookkeeping step_setup / step_index (window 128,
 * CSA ratio 4 + 512 picks, HCA ratio 128 + 256 entries), C = 1, 16, 64; and the queries' norm_rope of a long
 * prefill run (C = 8192), block kernel against warp-per-row.
 *   run: build/bench_elementwise [--quick] [--verbose]
 * Bytes counted (the fewest): every input element read once, every output written once (embed: one table row per
 * token; argmax: the C x 129280 logits). FLOPs: norm_rope 3 per channel + 6 per rope pair (the FP8 simulation not
 * counted); the gathers, argmax and bookkeeping count 0 (no arithmetic worth the name).
 * Working sets are small except the embed table (1.06 GB) and the logits (33 MB at C = 64): the L2 flush before
 * every rep is what makes them cold.
 * Spot checks (first call, before the timing): rows of the first and last token against a CPU computation (the
 * fp8 rows with the tolerance of one e4m3 step), the embedded streams and every argmax and every step output
 * exactly.
 */
#include <math.h>
#include <string.h>

#include "../kernels/elementwise.cuh"
#include "../kernels/step.cuh"
#include "bench_common.cuh"

enum { H = 64, HD = 512, NP = 32, D = 4096, NS = 4, V = 129280, WIN = 128, TOPK = 512, NHCA = 256, NX = 1536 };
static const float EPS = 1e-6f;

static void nr_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_norm_rope((const dsv4_norm_rope_params *)ctx));
}
static void embed_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_embed((const dsv4_embed_params *)ctx));
}
typedef struct am_ctx {
    int32_t *out;
    const float *x;
    int C;
} am_ctx;
static void argmax_fn(void *ctx, int rep)
{
    (void)rep;
    const am_ctx *a = (const am_ctx *)ctx;
    BENCH_OK(dsv4_opt_argmax(a->out, a->x, a->C, V, V, 0));
}
static void setup_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_step_setup((const dsv4_step_setup_params *)ctx));
}
static void index_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_step_index((const dsv4_step_index_params *)ctx));
}

/* e4m3 round-to-nearest-even of v (|v| <= 448 already): 3 mantissa bits, subnormal step 2^-9. */
static double e4m3_round(double v)
{
    const double a = fabs(v);
    if (a == 0.0) return 0.0;
    int e = (int)floor(log2(a));
    if (e < -6) e = -6;
    const double step = ldexp(1.0, e - 3);
    return nearbyint(v / step) * step;
}

/* CPU norm_rope of one row (dim HD) in double: v = x; RMSNorm (· w); RoPE with cs/sn; FP8 sim of the nope part. */
static void cpu_norm_rope(const float *x, const float *w, const float *cs, const float *sn, int fp8, double *v)
{
    double ss = 0.0;
    for (int i = 0; i < HD; i++) ss += (double)x[i] * x[i];
    const double r = 1.0 / sqrt(ss / HD + EPS);
    for (int i = 0; i < HD; i++) v[i] = (w ? w[i] : 1.0) * (x[i] * r);
    const int r0 = HD - 2 * NP;
    for (int i = 0; i < NP; i++) {
        const double x0 = v[r0 + 2 * i], x1 = v[r0 + 2 * i + 1];
        v[r0 + 2 * i] = x0 * cs[i] - x1 * sn[i];
        v[r0 + 2 * i + 1] = x1 * cs[i] + x0 * sn[i];
    }
    if (!fp8) return;
    for (int b = 0; b < r0; b += 64) {
        double amax = 0.0;
        for (int i = b; i < b + 64 && i < r0; i++) amax = fmax(amax, fabs(v[i]));
        const double s = exp2(ceil(log2(fmax(amax, 1e-4) / 448.0)));
        for (int i = b; i < b + 64 && i < r0; i++) v[i] = e4m3_round(fmin(fmax(v[i] / s, -448.0), 448.0)) * s;
    }
}

static void bench_norm_rope(const bench_ceilings *cl, int C)
{
    void *xq, *oq, *xkv, *w, *cs, *sn, *ring, *slot, *of;
    const int64_t ring_stride = (int64_t)(WIN + 64) * HD;
    BENCH_CHECK(cudaMalloc(&xq, (size_t)C * H * HD * 4));
    BENCH_CHECK(cudaMalloc(&oq, (size_t)C * H * HD * 2));
    BENCH_CHECK(cudaMalloc(&xkv, (size_t)C * NX * 4));
    BENCH_CHECK(cudaMalloc(&w, HD * 4));
    BENCH_CHECK(cudaMalloc(&cs, (size_t)C * NP * 4));
    BENCH_CHECK(cudaMalloc(&sn, (size_t)C * NP * 4));
    BENCH_CHECK(cudaMalloc(&ring, (size_t)C * ring_stride * 2));
    BENCH_CHECK(cudaMalloc(&slot, (size_t)C * 4));
    BENCH_CHECK(cudaMalloc(&of, (size_t)C * HD * 4));
    bench_fill_f32(xq, (size_t)C * H * HD, 91, 3.0f);
    bench_fill_f32(xkv, (size_t)C * NX, 92, 3.0f);
    bench_fill_f32(w, HD, 93, 1.0f);
    /* garbage in the outputs: unwritten elements (or the previous C's, whose inputs share the seeds) must fail */
    bench_fill_bf16(oq, (size_t)C * H * HD, 94, 1e3f);
    float *hcs = (float *)malloc((size_t)C * NP * 4), *hsn = (float *)malloc((size_t)C * NP * 4);
    int32_t *hslot = (int32_t *)malloc((size_t)C * 4);
    uint64_t rs = 77 + C;
    for (int i = 0; i < C * NP; i++) {
        const double a = (double)(bench_rand(&rs) % 100000) * 1e-3;
        hcs[i] = (float)cos(a);
        hsn[i] = (float)sin(a);
    }
    for (int c = 0; c < C; c++) hslot[c] = (int32_t)(bench_rand(&rs) % WIN);
    BENCH_CHECK(cudaMemcpy(cs, hcs, (size_t)C * NP * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(sn, hsn, (size_t)C * NP * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(slot, hslot, (size_t)C * 4, cudaMemcpyHostToDevice));
    float *hw = (float *)bench_to_host(w, HD * 4);
    const int toks[2] = {0, C - 1};
    double want[HD];
    float got[HD];
    char what[96];

    /* queries: [C, 64 x 512] f32 -> bf16 */
    dsv4_norm_rope_params p;
    memset(&p, 0, sizeof(p));
    p.n_tok = C;
    p.heads = H;
    p.dim = HD;
    p.x = xq;
    p.x_tok_stride = (int64_t)H * HD;
    p.norm = 1;
    p.eps = EPS;
    p.rope_pairs = NP;
    p.cos = (const float *)cs;
    p.sin = (const float *)sn;
    p.out = (uint16_t *)oq;
    p.out_tok_stride = (int64_t)H * HD;
    p.post_scale = 1.0f;
    BENCH_OK(dsv4_opt_norm_rope(&p));
    BENCH_CHECK(cudaDeviceSynchronize());
    {
        float *hx = (float *)bench_to_host(xq, (size_t)C * H * HD * 4);
        uint16_t *ho = (uint16_t *)bench_to_host(oq, (size_t)C * H * HD * 2);
        const int heads[2] = {0, H - 1};
        for (int t = 0; t < (C > 1 ? 2 : 1); t++)
            for (int hi = 0; hi < 2; hi++) {
                const size_t row = (size_t)toks[t] * H + heads[hi];
                cpu_norm_rope(hx + row * HD, NULL, hcs + (size_t)toks[t] * NP, hsn + (size_t)toks[t] * NP, 0, want);
                for (int i = 0; i < HD; i++) got[i] = bench_bf16_to_f32(ho[row * HD + i]);
                snprintf(what, sizeof(what), "norm_rope q C=%d tok %d head %d (bf16)", C, toks[t], heads[hi]);
                bench_check_close(what, got, want, HD, 1e-3, 1e-2);
            }
        free(hx);
        free(ho);
    }
    double us = bench_median_us(nr_fn, &p);
    bench_row(cl, "norm_rope", "bf16", "q", C, "64x512 rope64 f32->bf16", us,
              (double)C * H * HD * 6 + (double)C * NP * 8, (double)C * H * (3.0 * HD + 6.0 * NP));

    /* KV: one head from the strided projection, weighted, ring write + f32 copy; bf16 and fp8 nope */
    for (int fp8 = 0; fp8 < 2; fp8++) {
        dsv4_norm_rope_params k;
        memset(&k, 0, sizeof(k));
        k.n_tok = C;
        k.heads = 1;
        k.dim = HD;
        k.x = xkv;
        k.x_tok_stride = NX;
        k.norm = 1;
        k.weight = (const float *)w;
        k.eps = EPS;
        k.rope_pairs = NP;
        k.cos = (const float *)cs;
        k.sin = (const float *)sn;
        k.fp8_nope = fp8;
        k.out = (uint16_t *)ring;
        k.out_slot = (const int32_t *)slot;
        k.out_seq_stride = ring_stride;
        k.out_f32 = (float *)of;
        k.post_scale = 1.0f;
        bench_fill_f32(of, (size_t)C * HD, 95 + fp8, 1e3f); /* the other variant's rows would pass the fp8 check */
        bench_fill_bf16(ring, (size_t)C * ring_stride, 94 + fp8, 1e3f);
        BENCH_OK(dsv4_opt_norm_rope(&k));
        BENCH_CHECK(cudaDeviceSynchronize());
        float *hx = (float *)bench_to_host(xkv, (size_t)C * NX * 4);
        uint16_t *hr = (uint16_t *)bench_to_host(ring, (size_t)C * ring_stride * 2);
        float *hf = (float *)bench_to_host(of, (size_t)C * HD * 4);
        for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
            const int c = toks[t];
            cpu_norm_rope(hx + (size_t)c * NX, hw, hcs + (size_t)c * NP, hsn + (size_t)c * NP, fp8, want);
            for (int i = 0; i < HD; i++) got[i] = bench_bf16_to_f32(hr[(size_t)c * ring_stride + (size_t)hslot[c] * HD + i]);
            /* fp8: a value next to a rounding boundary may land one e4m3 step (1/8 relative) away */
            snprintf(what, sizeof(what), "norm_rope kv %s C=%d tok %d ring row", fp8 ? "fp8" : "bf16", C, c);
            bench_check_close(what, got, want, HD, 1e-3, fp8 ? 0.13 : 1e-2);
            snprintf(what, sizeof(what), "norm_rope kv %s C=%d tok %d f32 copy", fp8 ? "fp8" : "bf16", C, c);
            bench_check_close(what, hf + (size_t)c * HD, want, HD, 1e-4, fp8 ? 0.13 : 1e-4);
        }
        free(hx);
        free(hr);
        free(hf);
        us = bench_median_us(nr_fn, &k);
        bench_row(cl, "norm_rope", fp8 ? "fp8" : "bf16", "kv", C, "1x512 rope64 ring+f32", us,
                  (double)C * HD * (4 + 2 + 4) + HD * 4.0 + (double)C * (NP * 8 + 4), (double)C * (3.0 * HD + 6.0 * NP));
    }
    free(hcs), free(hsn), free(hslot), free(hw);
    void *bufs[] = {xq, oq, xkv, w, cs, sn, ring, slot, of};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) cudaFree(bufs[i]);
}

static void bench_embed_argmax(const bench_ceilings *cl, int C, const void *table)
{
    void *tok, *X, *lg, *am;
    BENCH_CHECK(cudaMalloc(&tok, (size_t)C * 4));
    BENCH_CHECK(cudaMalloc(&X, (size_t)C * NS * D * 2));
    BENCH_CHECK(cudaMalloc(&lg, (size_t)C * V * 4));
    BENCH_CHECK(cudaMalloc(&am, (size_t)C * 4));
    int32_t *htok = (int32_t *)malloc((size_t)C * 4);
    uint64_t rs = 5150 + C;
    for (int c = 0; c < C; c++) htok[c] = (int32_t)(bench_rand(&rs) % V);
    BENCH_CHECK(cudaMemcpy(tok, htok, (size_t)C * 4, cudaMemcpyHostToDevice));
    dsv4_embed_params e;
    memset(&e, 0, sizeof(e));
    e.n_tok = C;
    e.n_streams = NS;
    e.dim = D;
    e.tokens = (const int32_t *)tok;
    e.embed = (const uint16_t *)table;
    e.X = (uint16_t *)X;
    bench_fill_bf16(X, (size_t)C * NS * D, 96, 1e3f);
    BENCH_OK(dsv4_opt_embed(&e));
    BENCH_CHECK(cudaDeviceSynchronize());
    {
        uint16_t *hX = (uint16_t *)bench_to_host(X, (size_t)C * NS * D * 2), *row = (uint16_t *)malloc(D * 2);
        int32_t *got = (int32_t *)malloc((size_t)2 * NS * D * 4), *want = (int32_t *)malloc((size_t)2 * NS * D * 4);
        const int toks[2] = {0, C - 1};
        size_t n = 0;
        for (int t = 0; t < 2; t++) {
            BENCH_CHECK(cudaMemcpy(row, (const uint16_t *)table + (size_t)htok[toks[t]] * D, D * 2, cudaMemcpyDeviceToHost));
            for (int j = 0; j < NS; j++)
                for (int d = 0; d < D; d++, n++) {
                    got[n] = hX[((size_t)toks[t] * NS + j) * D + d];
                    want[n] = row[d];
                }
        }
        char what[96];
        snprintf(what, sizeof(what), "embed C=%d toks 0, C-1 (4 streams, bits)", C);
        bench_check_equal_i32(what, got, want, n);
        free(hX), free(row), free(got), free(want);
    }
    double us = bench_median_us(embed_fn, &e);
    bench_row(cl, "embed", "bf16", "-", C, "V129280 D4096 x4 streams", us, (double)C * (4 + D * 2 + NS * D * 2), 0.0);

    bench_fill_f32(lg, (size_t)C * V, 95 + C, 8.0f);
    am_ctx a = {(int32_t *)am, (const float *)lg, C};
    BENCH_CHECK(cudaMemset(am, 0xff, (size_t)C * 4));
    argmax_fn(&a, 0);
    BENCH_CHECK(cudaDeviceSynchronize());
    {
        float *hl = (float *)bench_to_host(lg, (size_t)C * V * 4);
        int32_t *got = (int32_t *)bench_to_host(am, (size_t)C * 4), *want = (int32_t *)malloc((size_t)C * 4);
        for (int c = 0; c < C; c++) {
            int b = 0;
            for (int i = 1; i < V; i++)
                if (hl[(size_t)c * V + i] > hl[(size_t)c * V + b]) b = i;
            want[c] = b;
        }
        char what[96];
        snprintf(what, sizeof(what), "argmax C=%d all rows", C);
        bench_check_equal_i32(what, got, want, C);
        free(hl), free(got), free(want);
    }
    us = bench_median_us(argmax_fn, &a);
    bench_row(cl, "argmax", "f32", "-", C, "of 129280", us, (double)C * (V * 4.0 + 4), 0.0);
    free(htok);
    cudaFree(tok), cudaFree(X), cudaFree(lg), cudaFree(am);
}

/* The q heads of a long prefill run (C = 8192 tokens x 64 heads x 512): the block kernel (a decode step's) against
 * the warp-per-row kernel a step with runs takes (warp_rows), the same inputs; spot rows checked as above. */
static void bench_norm_rope_long(const bench_ceilings *cl, int C)
{
    void *xq, *oq, *cs, *sn;
    BENCH_CHECK(cudaMalloc(&xq, (size_t)C * H * HD * 4));
    BENCH_CHECK(cudaMalloc(&oq, (size_t)C * H * HD * 2));
    BENCH_CHECK(cudaMalloc(&cs, (size_t)C * NP * 4));
    BENCH_CHECK(cudaMalloc(&sn, (size_t)C * NP * 4));
    bench_fill_f32(xq, (size_t)C * H * HD, 191, 3.0f);
    float *hcs = (float *)malloc((size_t)C * NP * 4), *hsn = (float *)malloc((size_t)C * NP * 4);
    uint64_t rs = 177;
    for (int i = 0; i < C * NP; i++) {
        const double a = (double)(bench_rand(&rs) % 100000) * 1e-3;
        hcs[i] = (float)cos(a);
        hsn[i] = (float)sin(a);
    }
    BENCH_CHECK(cudaMemcpy(cs, hcs, (size_t)C * NP * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(sn, hsn, (size_t)C * NP * 4, cudaMemcpyHostToDevice));
    dsv4_norm_rope_params p;
    memset(&p, 0, sizeof(p));
    p.n_tok = C, p.heads = H, p.dim = HD, p.x = xq, p.x_tok_stride = (int64_t)H * HD, p.norm = 1, p.eps = EPS;
    p.rope_pairs = NP, p.cos = (const float *)cs, p.sin = (const float *)sn, p.out = (uint16_t *)oq;
    p.out_tok_stride = (int64_t)H * HD, p.post_scale = 1.0f;
    float *hx = (float *)bench_to_host(xq, (size_t)2 * H * HD * 4); /* the first two tokens' rows */
    for (int warp = 0; warp < 2; warp++) {
        p.warp_rows = warp;
        bench_fill_bf16(oq, (size_t)C * H * HD, 194 + warp, 1e3f);
        BENCH_OK(dsv4_opt_norm_rope(&p));
        BENCH_CHECK(cudaDeviceSynchronize());
        uint16_t *ho = (uint16_t *)bench_to_host(oq, (size_t)2 * H * HD * 2);
        double want[HD];
        float got[HD];
        char what[96];
        const size_t row = (size_t)1 * H + H - 1;
        cpu_norm_rope(hx + row * HD, NULL, hcs + NP, hsn + NP, 0, want);
        for (int i = 0; i < HD; i++) got[i] = bench_bf16_to_f32(ho[row * HD + i]);
        snprintf(what, sizeof(what), "norm_rope q C=%d tok 1 head %d (%s)", C, H - 1, warp ? "warp rows" : "block");
        bench_check_close(what, got, want, HD, 1e-3, 1e-2);
        free(ho);
        const double us = bench_median_us(nr_fn, &p);
        bench_row(cl, "norm_rope", "bf16", warp ? "q warp-rows" : "q block", C, "64x512 rope64 f32->bf16", us,
                  (double)C * H * HD * 6 + (double)C * NP * 8, (double)C * H * (3.0 * HD + 6.0 * NP));
    }
    free(hx), free(hcs), free(hsn);
    cudaFree(xq), cudaFree(oq), cudaFree(cs), cudaFree(sn);
}

static void bench_step(const bench_ceilings *cl, int C)
{
    void *pos, *act, *inv, *ring, *lc, *lh, *tab, *tk, *idx;
    BENCH_CHECK(cudaMalloc(&pos, (size_t)C * 4));
    BENCH_CHECK(cudaMalloc(&act, (size_t)C * 4));
    BENCH_CHECK(cudaMalloc(&inv, 2 * NP * 4));
    BENCH_CHECK(cudaMalloc(&ring, (size_t)C * 4));
    BENCH_CHECK(cudaMalloc(&lc, (size_t)C * 4));
    BENCH_CHECK(cudaMalloc(&lh, (size_t)C * 4));
    BENCH_CHECK(cudaMalloc(&tab, (size_t)4 * C * NP * 4));
    BENCH_CHECK(cudaMalloc(&tk, (size_t)C * TOPK * 4));
    BENCH_CHECK(cudaMalloc(&idx, (size_t)C * (WIN + TOPK) * 4));
    int32_t *hpos = (int32_t *)malloc((size_t)C * 4), *hact = (int32_t *)malloc((size_t)C * 4);
    float hinv[2 * NP];
    uint64_t rs = 31337 + C;
    for (int c = 0; c < C; c++) {
        hpos[c] = c == 0 ? 5 : (int32_t)(4096 + bench_rand(&rs) % 28000); /* seq 0 before the window fills */
        hact[c] = !(C > 1 && c == 1);                                      /* seq 1 inactive */
    }
    for (int i = 0; i < NP; i++) {
        hinv[i] = (float)pow(10000.0, -2.0 * i / (2.0 * NP));
        hinv[NP + i] = (float)pow(160000.0, -2.0 * i / (2.0 * NP)) / 16.0f;
    }
    BENCH_CHECK(cudaMemcpy(pos, hpos, (size_t)C * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(act, hact, (size_t)C * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(inv, hinv, 2 * NP * 4, cudaMemcpyHostToDevice));
    float *t = (float *)tab;
    BENCH_CHECK(cudaMemset(ring, 0x7f, (size_t)C * 4)); /* garbage in the outputs: unwritten ones fail */
    BENCH_CHECK(cudaMemset(lc, 0x7f, (size_t)C * 4));
    BENCH_CHECK(cudaMemset(lh, 0x7f, (size_t)C * 4));
    BENCH_CHECK(cudaMemset(tab, 0xff, (size_t)4 * C * NP * 4));
    dsv4_step_setup_params su;
    memset(&su, 0, sizeof(su));
    su.n_seq = C;
    su.window = WIN;
    su.ratio_csa = 4;
    su.ratio_hca = 128;
    su.rope_pairs = NP;
    su.pos = (const int32_t *)pos;
    su.active = (const int32_t *)act;
    su.inv_main = (const float *)inv;
    su.inv_cmp = (const float *)inv + NP;
    su.ring_slot = (int32_t *)ring;
    su.live_csa = (int32_t *)lc;
    su.live_hca = (int32_t *)lh;
    su.cos_main = t;
    su.sin_main = t + (size_t)C * NP;
    su.cos_cmp = t + (size_t)2 * C * NP;
    su.sin_cmp = t + (size_t)3 * C * NP;
    BENCH_OK(dsv4_opt_step_setup(&su));
    BENCH_CHECK(cudaDeviceSynchronize());
    char what[96];
    int32_t *hlc = (int32_t *)bench_to_host(lc, (size_t)C * 4), *hlh = (int32_t *)bench_to_host(lh, (size_t)C * 4);
    {
        int32_t *hr = (int32_t *)bench_to_host(ring, (size_t)C * 4), *want = (int32_t *)calloc((size_t)3 * C, 4);
        int32_t *got = (int32_t *)calloc((size_t)3 * C, 4);
        for (int c = 0; c < C; c++) {
            want[c] = hact[c] ? hpos[c] % WIN : -1;
            want[C + c] = hact[c] ? (hpos[c] + 1) / 4 : 0;
            want[2 * C + c] = hact[c] ? (hpos[c] + 1) / 128 : 0;
            got[c] = hr[c];
            got[C + c] = hlc[c];
            got[2 * C + c] = hlh[c];
        }
        snprintf(what, sizeof(what), "step_setup C=%d ring slots, live csa/hca", C);
        bench_check_equal_i32(what, got, want, (size_t)3 * C);
        float *ht = (float *)bench_to_host(tab, (size_t)4 * C * NP * 4);
        double *wt = (double *)malloc((size_t)4 * C * NP * sizeof(double));
        for (int c = 0; c < C; c++)
            for (int i = 0; i < NP; i++)
                for (int tb = 0; tb < 2; tb++) {
                    const float a = hinv[tb * NP + i] * (float)hpos[c];
                    wt[((size_t)2 * tb * C + c) * NP + i] = (float)cos((double)a);
                    wt[((size_t)(2 * tb + 1) * C + c) * NP + i] = (float)sin((double)a);
                }
        snprintf(what, sizeof(what), "step_setup C=%d cos/sin tables", C);
        bench_check_close(what, ht, wt, (size_t)4 * C * NP, 1e-6, 0.0);
        free(hr), free(want), free(got), free(ht), free(wt);
    }
    double us = bench_median_us(setup_fn, &su);
    bench_row(cl, "step_setup", "-", "-", C, "W128 r4/128 rope32 x2", us,
              (double)C * 8 + 2.0 * NP * 4 + (double)C * (12 + 4 * NP * 4), 0.0);

    /* step_index: the gather lists of a sliding, a CSA (picks with repeats and dead ids) and an HCA layer */
    int32_t *htk = (int32_t *)malloc((size_t)C * TOPK * 4);
    for (size_t i = 0; i < (size_t)C * TOPK; i++) {
        const uint64_t u = bench_rand(&rs) % 1200;
        htk[i] = u < 10 ? -1 : (int32_t)(u % 1100); /* live is up to 7000: ids, repeats, a few -1 */
    }
    BENCH_CHECK(cudaMemcpy(tk, htk, (size_t)C * TOPK * 4, cudaMemcpyHostToDevice));
    const dsv4_step_index_kind kinds[3] = {DSV4_STEP_INDEX_WINDOW, DSV4_STEP_INDEX_CSA, DSV4_STEP_INDEX_HCA};
    const char *names[3] = {"window", "csa", "hca"};
    const int extra[3] = {0, TOPK, NHCA};
    int32_t *want = (int32_t *)malloc((size_t)C * (WIN + TOPK) * 4);
    for (int ki = 0; ki < 3; ki++) {
        dsv4_step_index_params xp;
        memset(&xp, 0, sizeof(xp));
        xp.n_seq = C;
        xp.window = WIN;
        xp.n_extra = extra[ki];
        xp.kind = kinds[ki];
        xp.pos = (const int32_t *)pos;
        xp.topk = (const int32_t *)tk;
        xp.live = (const int32_t *)(ki == 2 ? lh : lc);
        xp.idx = (int32_t *)idx;
        BENCH_CHECK(cudaMemset(idx, 0x7f, (size_t)C * (WIN + TOPK) * 4));
        BENCH_OK(dsv4_opt_step_index(&xp));
        BENCH_CHECK(cudaDeviceSynchronize());
        const int n_idx = WIN + extra[ki];
        const int32_t *live = ki == 2 ? hlh : hlc;
        for (int c = 0; c < C; c++)
            for (int j = 0; j < n_idx; j++) {
                int32_t v;
                if (j < WIN) {
                    const int64_t tt = (int64_t)hpos[c] - (WIN - 1) + j;
                    v = tt >= 0 ? (int32_t)(tt % WIN) : -1;
                } else if (ki == 1) {
                    const int32_t *pk = htk + (size_t)c * TOPK, w = pk[j - WIN];
                    int ok = w >= 0 && w < live[c];
                    for (int i = 0; ok && i < j - WIN; i++) ok = pk[i] != w;
                    v = ok ? WIN + w : -1;
                } else {
                    v = j - WIN < live[c] ? j : -1;
                }
                want[(size_t)c * n_idx + j] = v;
            }
        int32_t *got = (int32_t *)bench_to_host(idx, (size_t)C * n_idx * 4);
        snprintf(what, sizeof(what), "step_index %s C=%d all lists", names[ki], C);
        bench_check_equal_i32(what, got, want, (size_t)C * n_idx);
        free(got);
        us = bench_median_us(index_fn, &xp);
        char shape[64];
        snprintf(shape, sizeof(shape), "n_idx %d = W128 + %d", n_idx, extra[ki]);
        const double bytes = (double)C * (4 + 4 + (ki == 1 ? TOPK * 4 : 0) + n_idx * 4);
        bench_row(cl, "step_index", names[ki], "-", C, shape, us, bytes, 0.0);
    }
    free(hpos), free(hact), free(hlc), free(hlh), free(htk), free(want);
    void *bufs[] = {pos, act, inv, ring, lc, lh, tab, tk, idx};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) cudaFree(bufs[i]);
}

int main(int argc, char **argv)
{
    bench_init(argc, argv);
    bench_ceilings cl = bench_measure_ceilings();
    void *table;
    BENCH_CHECK(cudaMalloc(&table, (size_t)V * D * 2));
    bench_fill_bf16(table, (size_t)V * D, 99, 1.0f);
    bench_header();
    const int Cs[3] = {1, 16, 64};
    for (int ci = 0; ci < 3; ci++) {
        bench_norm_rope(&cl, Cs[ci]);
        bench_embed_argmax(&cl, Cs[ci], table);
        bench_step(&cl, Cs[ci]);
    }
    bench_norm_rope_long(&cl, 8192);
    cudaFree(table);
    return bench_finish();
}
