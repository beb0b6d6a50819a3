/* bench_moe.cu - micro-benchmark of kernels/moe.cu with the Flash shapes (model-spec §1, §10): the routing
 * (sqrtsoftplus + bias top-6 of 256 for learned layers, tid2eid for hash layers), the grouped bf16 routed-expert
 * kernel dsv4_opt_moe_experts (D 4096, I 2048, E 256: 12.9 GB of expert weights) and the shared expert's clamped
 * SwiGLU, C = 1, 16, 64 tokens.
 *   run: build/bench_moe [--quick] [--verbose]
 * Bytes counted (the fewest): route learned: the C x 256 logits, the bias, ids + weights written; route hash: the
 * token ids, their tid2eid rows and the 6 picked logits (the kernel reads all 256; not counted), ids + weights.
 * experts: the weights of the DISTINCT experts the batch touches (random routing: printed as ex=N/256; each
 * (2I x D + D x I) bf16 = 48 MiB), x, the shared output read, out written; the bf16 h between the two halves
 * (C x 6 x I, written and read back) is not counted. swiglu: the gate and up values read, h written.
 * FLOPs: experts 6·D·I per (token, expert) pair (2 per multiply-add); route ~4 per scored (token, expert)
 * (exp, log1p, sqrt, bias; top-k compares not counted), hash 3 per pick; swiglu 5 per output.
 * The L2 flush before every rep makes everything cold (the experts are far larger than L2 anyway).
 * Spot checks (first call, before the timing): route ids exactly and weights against a CPU top-k of the first and
 * last token; experts: 8 h values per (token, expert) and 4 output rows of the first and last token against
 * double-precision dot products of the same bf16 weights; swiglu: the first and last token's rows.
 */
#include <math.h>
#include <string.h>

#include "../kernels/moe.cuh"
#include "bench_common.cuh"

enum { D = 4096, I = 2048, E = 256, K = 6, V = 129280 };
static const float LIMIT = 10.0f, ROUTED_SCALE = 1.5f;

static void route_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_moe_route((const dsv4_moe_route_params *)ctx));
}
static void experts_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_moe_experts((const dsv4_moe_experts_params *)ctx));
}
static void swiglu_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_swiglu((const dsv4_swiglu_params *)ctx));
}

static float sqrtsoftplus(float z) { return sqrtf(z > 20.0f ? z : log1pf(expf(z))); }
static double silu_clamped(double g, double u)
{
    g = fmin(g, LIMIT);
    u = fmin(fmax(u, -LIMIT), LIMIT);
    return g / (1.0 + exp(-g)) * u;
}

/* CPU routing of token c: learned (bias != NULL) or hash, as moe.cuh states. */
static void cpu_route(const float *lg, const float *bias, const int32_t *tid2eid, const int32_t *tokens, int c,
                      int32_t *ids, double *w)
{
    float s[E];
    for (int e = 0; e < E; e++) s[e] = sqrtsoftplus(lg[(size_t)c * E + e]);
    if (bias) {
        int used[E] = {0};
        for (int j = 0; j < K; j++) { /* the largest key, the lower id on ties */
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!used[e] && (best < 0 || s[e] + bias[e] > s[best] + bias[best])) best = e;
            used[best] = 1;
            ids[j] = best;
        }
    } else {
        for (int j = 0; j < K; j++) ids[j] = tid2eid[(size_t)tokens[c] * K + j];
    }
    double sum = 0.0;
    for (int j = 0; j < K; j++) sum += s[ids[j]];
    for (int j = 0; j < K; j++) w[j] = s[ids[j]] / (sum + 1e-20) * ROUTED_SCALE;
}

static void check_route(const char *var, int C, const dsv4_moe_route_params *p, const float *lg, const float *bias,
                        const int32_t *tid2eid, const int32_t *tokens)
{
    int32_t *ids = (int32_t *)bench_to_host(p->ids, (size_t)C * K * 4);
    float *w = (float *)bench_to_host(p->weights, (size_t)C * K * 4);
    const int toks[2] = {0, C - 1};
    for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
        int32_t wid[K];
        double ww[K];
        cpu_route(lg, bias, tid2eid, tokens, toks[t], wid, ww);
        char what[96];
        snprintf(what, sizeof(what), "moe_route %s C=%d tok %d ids", var, C, toks[t]);
        bench_check_equal_i32(what, ids + (size_t)toks[t] * K, wid, K);
        snprintf(what, sizeof(what), "moe_route %s C=%d tok %d weights", var, C, toks[t]);
        bench_check_close(what, w + (size_t)toks[t] * K, ww, K, 1e-6, 1e-5);
    }
    free(ids);
    free(w);
}

/* h at 8 intermediate rows of every (token, expert) pair and 4 output rows, tokens 0 and C-1. */
static void check_experts(int C, const dsv4_moe_experts_params *p, const int32_t *ids, const float *wts)
{
    uint16_t *x = (uint16_t *)bench_to_host(p->x, (size_t)C * D * 2), *h = (uint16_t *)bench_to_host(p->h, (size_t)C * K * I * 2);
    float *out = (float *)bench_to_host(p->out, (size_t)C * D * 4), *sh = (float *)bench_to_host(p->shared, (size_t)C * D * 4);
    uint16_t *row = (uint16_t *)malloc((size_t)D * 2 * 2);
    const int toks[2] = {0, C - 1}, ms[8] = {0, 1, 63, 500, 1024, 1337, 2046, 2047}, ds[4] = {0, 777, 2048, 4095};
    for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
        const int c = toks[t];
        double want[K * 8];
        float got[K * 8];
        for (int j = 0; j < K; j++) {
            const int e = ids[c * K + j];
            for (int mi = 0; mi < 8; mi++) {
                const int m = ms[mi];
                const uint16_t *w13 = p->w13 + (size_t)e * 2 * I * D;
                BENCH_CHECK(cudaMemcpy(row, w13 + (size_t)m * D, (size_t)D * 2, cudaMemcpyDeviceToHost));
                BENCH_CHECK(cudaMemcpy(row + D, w13 + (size_t)(I + m) * D, (size_t)D * 2, cudaMemcpyDeviceToHost));
                double g = 0.0, u = 0.0;
                for (int d = 0; d < D; d++) {
                    const double xv = bench_bf16_to_f32(x[(size_t)c * D + d]);
                    g += bench_bf16_to_f32(row[d]) * xv;
                    u += bench_bf16_to_f32(row[D + d]) * xv;
                }
                want[j * 8 + mi] = silu_clamped(g, u) * wts[c * K + j];
                got[j * 8 + mi] = bench_bf16_to_f32(h[((size_t)c * K + j) * I + m]);
            }
        }
        char what[96];
        snprintf(what, sizeof(what), "moe_experts C=%d tok %d h (bf16, 8 rows x 6)", C, c);
        bench_check_close(what, got, want, K * 8, 1e-3, 1e-2);
        double wo[4];
        float go[4];
        for (int di = 0; di < 4; di++) {
            const int d = ds[di];
            double a = 0.0;
            for (int j = 0; j < K; j++) {
                const int e = ids[c * K + j];
                BENCH_CHECK(cudaMemcpy(row, p->w2 + ((size_t)e * D + d) * I, (size_t)I * 2, cudaMemcpyDeviceToHost));
                for (int i = 0; i < I; i++)
                    a += (double)bench_bf16_to_f32(row[i]) * bench_bf16_to_f32(h[((size_t)c * K + j) * I + i]);
            }
            wo[di] = a + sh[(size_t)c * D + d];
            go[di] = out[(size_t)c * D + d];
        }
        snprintf(what, sizeof(what), "moe_experts C=%d tok %d out (4 rows)", C, c);
        bench_check_close(what, go, wo, 4, 1e-4, 1e-3);
    }
    free(x), free(h), free(out), free(sh), free(row);
}

int main(int argc, char **argv)
{
    bench_init(argc, argv);
    bench_ceilings cl = bench_measure_ceilings();
    /* the expert weights once for all C: 256 x (2I x D + D x I) bf16 */
    void *w13, *w2, *bias, *tid2eid;
    BENCH_CHECK(cudaMalloc(&w13, (size_t)E * 2 * I * D * 2));
    BENCH_CHECK(cudaMalloc(&w2, (size_t)E * D * I * 2));
    BENCH_CHECK(cudaMalloc(&bias, E * 4));
    BENCH_CHECK(cudaMalloc(&tid2eid, (size_t)V * K * 4));
    bench_fill_bf16(w13, (size_t)E * 2 * I * D, 71, 0.05f);
    bench_fill_bf16(w2, (size_t)E * D * I, 72, 0.05f);
    bench_fill_f32(bias, E, 73, 0.3f);
    float *hbias = (float *)bench_to_host(bias, E * 4);
    uint64_t rs = 2024;
    int32_t *ht2e = (int32_t *)malloc((size_t)V * K * 4);
    for (size_t v = 0; v < V; v++) /* K distinct experts per token, as a real table */
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = (int)(bench_rand(&rs) % E);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ht2e[v * K + i] == e;
            } while (dup);
            ht2e[v * K + j] = e;
        }
    BENCH_CHECK(cudaMemcpy(tid2eid, ht2e, (size_t)V * K * 4, cudaMemcpyHostToDevice));
    printf("expert weights: %.2f GB bf16 (E %d, D %d, I %d)\n", ((double)E * 3 * I * D * 2) / 1e9, E, D, I);
    bench_header();
    const int Cs[3] = {1, 16, 64};
    for (int ci = 0; ci < 3; ci++) {
        const int C = Cs[ci], NF = E + 2 * I;
        void *lg, *tok, *ids, *wts, *x, *h, *sh, *out, *gu, *hs;
        BENCH_CHECK(cudaMalloc(&lg, (size_t)C * E * 4));
        BENCH_CHECK(cudaMalloc(&tok, (size_t)C * 4));
        BENCH_CHECK(cudaMalloc(&ids, (size_t)C * K * 4));
        BENCH_CHECK(cudaMalloc(&wts, (size_t)C * K * 4));
        BENCH_CHECK(cudaMalloc(&x, (size_t)C * D * 2));
        BENCH_CHECK(cudaMalloc(&h, (size_t)C * K * I * 2));
        BENCH_CHECK(cudaMalloc(&sh, (size_t)C * D * 4));
        BENCH_CHECK(cudaMalloc(&out, (size_t)C * D * 4));
        BENCH_CHECK(cudaMalloc(&gu, (size_t)C * NF * 4));
        BENCH_CHECK(cudaMalloc(&hs, (size_t)C * I * 2));
        bench_fill_f32(lg, (size_t)C * E, 74 + ci, 3.0f);
        bench_fill_bf16(x, (size_t)C * D, 77 + ci, 1.0f);
        bench_fill_f32(sh, (size_t)C * D, 80 + ci, 1.0f);
        bench_fill_f32(gu, (size_t)C * NF, 83 + ci, 12.0f); /* beyond the clamp at 10 on both sides */
        int32_t *htok = (int32_t *)malloc((size_t)C * 4);
        for (int c = 0; c < C; c++) htok[c] = (int32_t)(bench_rand(&rs) % V);
        BENCH_CHECK(cudaMemcpy(tok, htok, (size_t)C * 4, cudaMemcpyHostToDevice));
        float *hlg = (float *)bench_to_host(lg, (size_t)C * E * 4);

        /* ---- routing */
        dsv4_moe_route_params rp;
        memset(&rp, 0, sizeof(rp));
        rp.n_tok = C;
        rp.n_experts = E;
        rp.k = K;
        rp.logits = (const float *)lg;
        rp.logit_stride = E;
        rp.tokens = (const int32_t *)tok;
        rp.routed_scale = ROUTED_SCALE;
        rp.ids = (int32_t *)ids;
        rp.weights = (float *)wts;
        for (int v = 0; v < 2; v++) {
            const char *var = v == 0 ? "learned" : "hash";
            rp.bias = v == 0 ? (const float *)bias : NULL;
            rp.tid2eid = v == 0 ? NULL : (const int32_t *)tid2eid;
            BENCH_CHECK(cudaMemset(ids, 0xff, (size_t)C * K * 4)); /* -1 and NaN: unwritten outputs fail */
            BENCH_CHECK(cudaMemset(wts, 0xff, (size_t)C * K * 4));
            BENCH_OK(dsv4_opt_moe_route(&rp));
            BENCH_CHECK(cudaDeviceSynchronize());
            check_route(var, C, &rp, hlg, v == 0 ? hbias : NULL, ht2e, htok);
            const double us = bench_median_us(route_fn, &rp);
            const double bytes = v == 0 ? (double)C * E * 4 + E * 4.0 + (double)C * K * 8
                                        : (double)C * 4 + (double)C * K * 4 * 2 + (double)C * K * 8;
            const double flops = v == 0 ? (double)C * E * 4 : (double)C * K * 3;
            bench_row(&cl, "moe_route", var, "-", C, "sqrtsoftplus top6 of 256", us, bytes, flops);
        }

        /* ---- routed experts, on random routing: K distinct experts per token, positive weights */
        int32_t *hids = (int32_t *)malloc((size_t)C * K * 4);
        float *hw = (float *)malloc((size_t)C * K * 4);
        int touched[E] = {0}, distinct = 0;
        for (int c = 0; c < C; c++)
            for (int j = 0; j < K; j++) {
                int e, dup;
                do {
                    e = (int)(bench_rand(&rs) % E);
                    dup = 0;
                    for (int i = 0; i < j; i++) dup |= hids[c * K + i] == e;
                } while (dup);
                hids[c * K + j] = e;
                hw[c * K + j] = 0.1f + 0.4f * (float)(bench_rand(&rs) % 1000) / 1000.0f;
                if (!touched[e]++) distinct++;
            }
        BENCH_CHECK(cudaMemcpy(ids, hids, (size_t)C * K * 4, cudaMemcpyHostToDevice));
        BENCH_CHECK(cudaMemcpy(wts, hw, (size_t)C * K * 4, cudaMemcpyHostToDevice));
        dsv4_moe_experts_params ep;
        memset(&ep, 0, sizeof(ep));
        ep.n_tok = C;
        ep.k = K;
        ep.dim = D;
        ep.inter = I;
        ep.limit = LIMIT;
        ep.x = (const uint16_t *)x;
        ep.ids = (const int32_t *)ids;
        ep.weights = (const float *)wts;
        ep.w13 = (const uint16_t *)w13;
        ep.w2 = (const uint16_t *)w2;
        ep.h = (uint16_t *)h;
        ep.shared = (const float *)sh;
        ep.shared_stride = D;
        ep.out = (float *)out;
        bench_fill_f32(out, (size_t)C * D, 86, 1e3f); /* garbage: unwritten outputs must fail the checks */
        bench_fill_bf16(h, (size_t)C * K * I, 87, 1e3f);
        BENCH_OK(dsv4_opt_moe_experts(&ep));
        BENCH_CHECK(cudaDeviceSynchronize());
        check_experts(C, &ep, hids, hw);
        double us = bench_median_us(experts_fn, &ep);
        double bytes = (double)distinct * 3.0 * I * D * 2 + (double)C * D * (2 + 4 + 4);
        double flops = (double)C * K * 6.0 * D * I;
        char shape[64];
        snprintf(shape, sizeof(shape), "k6 D4096 I2048 ex=%d/256", distinct);
        bench_row(&cl, "moe_experts", "bf16", "-", C, shape, us, bytes, flops);

        /* ---- shared-expert SwiGLU */
        dsv4_swiglu_params sp;
        memset(&sp, 0, sizeof(sp));
        sp.n_tok = C;
        sp.inter = I;
        sp.limit = LIMIT;
        sp.gu = (const float *)gu;
        sp.gu_stride = NF;
        sp.g_off = E;
        sp.u_off = E + I;
        sp.h = (uint16_t *)hs;
        bench_fill_bf16(hs, (size_t)C * I, 88, 1e3f);
        BENCH_OK(dsv4_opt_swiglu(&sp));
        BENCH_CHECK(cudaDeviceSynchronize());
        {
            float *hgu = (float *)bench_to_host(gu, (size_t)C * NF * 4);
            uint16_t *hh = (uint16_t *)bench_to_host(hs, (size_t)C * I * 2);
            double *want = (double *)malloc((size_t)I * sizeof(double));
            float *got = (float *)malloc((size_t)I * sizeof(float));
            const int toks[2] = {0, C - 1};
            for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
                const int c = toks[t];
                for (int m = 0; m < I; m++) {
                    want[m] = silu_clamped(hgu[(size_t)c * NF + E + m], hgu[(size_t)c * NF + E + I + m]);
                    got[m] = bench_bf16_to_f32(hh[(size_t)c * I + m]);
                }
                char what[96];
                snprintf(what, sizeof(what), "swiglu C=%d tok %d h (bf16)", C, c);
                bench_check_close(what, got, want, I, 1e-3, 1e-2);
            }
            free(hgu), free(hh), free(want), free(got);
        }
        us = bench_median_us(swiglu_fn, &sp);
        bench_row(&cl, "swiglu", "clamp10", "-", C, "I2048 from f32 gate|up", us, (double)C * I * (4 + 4 + 2),
                  (double)C * I * 5);

        free(htok), free(hlg), free(hids), free(hw);
        void *bufs[] = {lg, tok, ids, wts, x, h, sh, out, gu, hs};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) cudaFree(bufs[i]);
    }
    free(hbias);
    free(ht2e);
    cudaFree(w13);
    cudaFree(w2);
    cudaFree(bias);
    cudaFree(tid2eid);
    return bench_finish();
}
