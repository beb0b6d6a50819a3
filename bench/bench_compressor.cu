/* bench_compressor.cu - micro-benchmark of kernels/compressor.cu, the decode update of the KV compressors with the
 * Flash widths (model-spec §1, §7): CSA main (ratio 4, d_c 512, overlapping: projections and state 1024 wide,
 * 8 state rows), CSA indexer (ratio 4, d_c 128, overlapping) and HCA main (ratio 128, d_c 512, 128 state rows),
 * 32 rope pairs, C = 1, 16, 64 sequences, each case as a step that only writes its state row (`write`, 3 of 4 CSA
 * steps, 127 of 128 HCA steps) and as a step that closes a window (`close`: pool, RMSNorm, RoPE, pool-entry write).
 *   run: build/bench_compressor [--quick] [--verbose]
 * Bytes counted (the fewest): write: the kv and gate projections read, the ape row read once per distinct slot, the
 * kv and score state rows written; close adds the state values the pooling reads (rows x d_c of each of kv and
 * score), norm_w, inv_freq, and the bf16 pool entry written. CSA's move of the current rows to the previous rows
 * (r x 2 d_c of kv and score, read and written) is not counted: a ring index would avoid it.
 * FLOPs (approximate, the kernel is latency-bound): write: one add per gate value; close: 7 per (slot, channel) of
 * the pooling (max, exp, sum, weight, multiply-add), 3 per channel of the norm, 6 per rope pair.
 * The sequences' positions differ (random windows) but share the phase of the case. The state is random (finite
 * scores), so each rep does the full work; the L2 flush before every rep makes the state cold.
 * Spot checks (first call, before the timing): the written state rows exactly; for `close` the pool entries of the
 * first and last sequence against a double-precision CPU pooling + norm + RoPE from the state before the call, and
 * CSA's moved rows exactly.
 */
#include <math.h>
#include <string.h>

#include "../kernels/compressor.cuh"
#include "bench_common.cuh"

enum { NP = 32, POOL_CAP = 2048 };
static const float EPS = 1e-6f;

typedef struct cmp_case {
    const char *name;
    int ratio, d_c, overlap, row0;
} cmp_case;

static void cmp_fn(void *ctx, int rep)
{
    (void)rep;
    BENCH_OK(dsv4_opt_compressor_update((const dsv4_compressor_params *)ctx));
}

/* Host copies of what the check needs. */
typedef struct cmp_host {
    float *skv, *ssc, *proj, *ape, *nw, *inv;
    int32_t *pos;
} cmp_host;

/* CPU entry of window w in double from a sequence's state after this token's row (model-spec §7.2-§7.3):
 * per-channel softmax pooling over the state rows (CSA: a-halves of rows < r, b-halves of rows >= r), RMSNorm,
 * RoPE of the trailing pairs at r·w. */
static void cpu_entry(const cmp_case *k, const float *kv, const float *sc, const float *nw, const float *inv, int w,
                      double *e)
{
    const int r = k->ratio, dc = k->d_c, W = (k->overlap ? 2 : 1) * dc, rows = (k->overlap ? 2 : 1) * r;
    double ss = 0.0;
    for (int ch = 0; ch < dc; ch++) {
        double mx = -INFINITY, sum = 0.0, acc = 0.0;
        for (int i = 0; i < rows; i++) mx = fmax(mx, sc[(size_t)i * W + ((k->overlap && i >= r) ? dc + ch : ch)]);
        for (int i = 0; i < rows; i++) sum += exp(sc[(size_t)i * W + ((k->overlap && i >= r) ? dc + ch : ch)] - mx);
        for (int i = 0; i < rows; i++) {
            const size_t o = (size_t)i * W + ((k->overlap && i >= r) ? dc + ch : ch);
            acc += kv[o] * exp(sc[o] - mx) / sum;
        }
        e[ch] = acc;
        ss += acc * acc;
    }
    const double rr = 1.0 / sqrt(ss / dc + EPS);
    for (int ch = 0; ch < dc; ch++) e[ch] = nw[ch] * (e[ch] * rr);
    const int r0 = dc - 2 * NP;
    for (int i = 0; i < NP; i++) {
        const float a = inv[i] * (float)(w * r);
        const double cs = (float)cos((double)a), sn = (float)sin((double)a);
        const double x0 = e[r0 + 2 * i], x1 = e[r0 + 2 * i + 1];
        e[r0 + 2 * i] = x0 * cs - x1 * sn;
        e[r0 + 2 * i + 1] = x1 * cs + x0 * sn;
    }
}

static void check_case(const cmp_case *k, int close, int C, const dsv4_compressor_params *p, const cmp_host *h)
{
    const int r = k->ratio, dc = k->d_c, W = (k->overlap ? 2 : 1) * dc, rows = (k->overlap ? 2 : 1) * r;
    const size_t st = (size_t)rows * W;
    float *skv = (float *)bench_to_host(p->state_kv, (size_t)C * st * 4);
    float *ssc = (float *)bench_to_host(p->state_score, (size_t)C * st * 4);
    uint16_t *pool = (uint16_t *)bench_to_host(p->pool, (size_t)C * p->pool_seq_stride * 2);
    const int seqs[2] = {0, C - 1};
    double *want = (double *)malloc((size_t)st * sizeof(double));
    float *got = (float *)malloc((size_t)st * sizeof(float));
    char what[96];
    for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
        const int c = seqs[t], pos = h->pos[c], slot = pos % r, row = k->overlap ? r + slot : slot;
        /* the state as the kernel must see it after writing this token's row */
        float *kv = (float *)malloc(st * 4), *sc = (float *)malloc(st * 4);
        memcpy(kv, h->skv + (size_t)c * st, st * 4);
        memcpy(sc, h->ssc + (size_t)c * st, st * 4);
        for (int i = 0; i < W; i++) {
            kv[(size_t)row * W + i] = h->proj[(size_t)c * 2 * W + i];
            sc[(size_t)row * W + i] = h->proj[(size_t)c * 2 * W + W + i] + h->ape[(size_t)slot * W + i];
        }
        if (!close) {
            for (int i = 0; i < W; i++) {
                want[i] = kv[(size_t)row * W + i];
                got[i] = skv[(size_t)c * st + (size_t)row * W + i];
                want[W + i] = sc[(size_t)row * W + i];
                got[W + i] = ssc[(size_t)c * st + (size_t)row * W + i];
            }
            snprintf(what, sizeof(what), "compressor %s write C=%d seq %d state row", k->name, C, c);
            bench_check_close(what, got, want, 2 * (size_t)W, 0.0, 0.0);
        } else {
            double e[1024];
            const int w = pos / r;
            cpu_entry(k, kv, sc, h->nw, h->inv, w, e);
            const uint16_t *dst = pool + (size_t)c * p->pool_seq_stride + (size_t)(k->row0 + w) * dc;
            for (int ch = 0; ch < dc; ch++) {
                want[ch] = e[ch];
                got[ch] = bench_bf16_to_f32(dst[ch]);
            }
            snprintf(what, sizeof(what), "compressor %s close C=%d seq %d entry (bf16)", k->name, C, c);
            bench_check_close(what, got, want, dc, 1e-3, 1e-2);
            if (k->overlap) { /* rows r..2r-1 (as written) moved to 0..r-1 */
                for (size_t i = 0; i < (size_t)r * W; i++) {
                    want[i] = kv[(size_t)r * W + i];
                    got[i] = skv[(size_t)c * st + i];
                }
                snprintf(what, sizeof(what), "compressor %s close C=%d seq %d moved rows", k->name, C, c);
                bench_check_close(what, got, want, (size_t)r * W, 0.0, 0.0);
            }
        }
        free(kv);
        free(sc);
    }
    free(skv);
    free(ssc);
    free(pool);
    free(want);
    free(got);
}

int main(int argc, char **argv)
{
    bench_init(argc, argv);
    bench_ceilings cl = bench_measure_ceilings();
    bench_header();
    const cmp_case cases[3] = {{"csa", 4, 512, 1, 128}, {"csa_idx", 4, 128, 1, 0}, {"hca", 128, 512, 0, 128}};
    const int Cs[3] = {1, 16, 64};
    float inv[NP];
    for (int i = 0; i < NP; i++) inv[i] = (float)pow(160000.0, -2.0 * i / (2.0 * NP));
    for (int ki = 0; ki < 3; ki++)
        for (int ci = 0; ci < 3; ci++)
            for (int close = 0; close < 2; close++) {
                const cmp_case *k = &cases[ki];
                const int C = Cs[ci], r = k->ratio, dc = k->d_c, W = (k->overlap ? 2 : 1) * dc;
                const int rows = (k->overlap ? 2 : 1) * r;
                const size_t st = (size_t)rows * W;
                const int64_t pool_stride = (int64_t)(k->row0 + POOL_CAP) * dc;
                void *pos, *act, *proj, *ape, *nw, *dinv, *skv, *ssc, *pool;
                BENCH_CHECK(cudaMalloc(&pos, (size_t)C * 4));
                BENCH_CHECK(cudaMalloc(&act, (size_t)C * 4));
                BENCH_CHECK(cudaMalloc(&proj, (size_t)C * 2 * W * 4));
                BENCH_CHECK(cudaMalloc(&ape, (size_t)r * W * 4));
                BENCH_CHECK(cudaMalloc(&nw, (size_t)dc * 4));
                BENCH_CHECK(cudaMalloc(&dinv, NP * 4));
                BENCH_CHECK(cudaMalloc(&skv, (size_t)C * st * 4));
                BENCH_CHECK(cudaMalloc(&ssc, (size_t)C * st * 4));
                BENCH_CHECK(cudaMalloc(&pool, (size_t)C * pool_stride * 2));
                bench_fill_f32(proj, (size_t)C * 2 * W, 51 + ki, 1.0f);
                bench_fill_f32(ape, (size_t)r * W, 54 + ki, 0.5f);
                bench_fill_f32(nw, dc, 57 + ki, 1.0f);
                bench_fill_f32(skv, (size_t)C * st, 60 + ki, 1.0f);
                bench_fill_f32(ssc, (size_t)C * st, 63 + ki, 2.0f);
                bench_fill_bf16(pool, (size_t)C * pool_stride, 66 + ki, 1e3f);
                BENCH_CHECK(cudaMemcpy(dinv, inv, NP * 4, cudaMemcpyHostToDevice));
                int32_t *hpos = (int32_t *)malloc((size_t)C * 4), *hact = (int32_t *)malloc((size_t)C * 4);
                uint64_t rs = 1000 + 10 * ki + close;
                int distinct_slots = 0, seen[128] = {0};
                for (int c = 0; c < C; c++) {
                    const int w = (int)(bench_rand(&rs) % (POOL_CAP / 2));
                    const int slot = close ? r - 1 : (int)(bench_rand(&rs) % (uint64_t)(r - 1));
                    hpos[c] = w * r + slot;
                    hact[c] = 1;
                    if (!seen[slot]++) distinct_slots++;
                }
                BENCH_CHECK(cudaMemcpy(pos, hpos, (size_t)C * 4, cudaMemcpyHostToDevice));
                BENCH_CHECK(cudaMemcpy(act, hact, (size_t)C * 4, cudaMemcpyHostToDevice));

                dsv4_compressor_params p;
                memset(&p, 0, sizeof(p));
                p.n_seq = C;
                p.ratio = r;
                p.d_c = dc;
                p.overlap = k->overlap;
                p.rope_pairs = NP;
                p.eps = EPS;
                p.pos = (const int32_t *)pos;
                p.active = (const int32_t *)act;
                p.proj = (const float *)proj;
                p.proj_stride = 2 * W;
                p.kv_off = 0;
                p.gate_off = W;
                p.ape = (const float *)ape;
                p.norm_w = (const float *)nw;
                p.inv_freq = (const float *)dinv;
                p.state_kv = (float *)skv;
                p.state_score = (float *)ssc;
                p.pool = (uint16_t *)pool;
                p.pool_seq_stride = pool_stride;
                p.pool_row0 = k->row0;
                p.pool_cap = POOL_CAP;

                cmp_host h;
                h.skv = (float *)bench_to_host(skv, (size_t)C * st * 4);
                h.ssc = (float *)bench_to_host(ssc, (size_t)C * st * 4);
                h.proj = (float *)bench_to_host(proj, (size_t)C * 2 * W * 4);
                h.ape = (float *)bench_to_host(ape, (size_t)r * W * 4);
                h.nw = (float *)bench_to_host(nw, (size_t)dc * 4);
                h.inv = inv;
                h.pos = hpos;
                BENCH_OK(dsv4_opt_compressor_update(&p));
                BENCH_CHECK(cudaDeviceSynchronize());
                check_case(k, close, C, &p, &h);
                free(h.skv);
                free(h.ssc);
                free(h.proj);
                free(h.ape);
                free(h.nw);

                const double us = bench_median_us(cmp_fn, &p);
                double bytes = (double)C * (2.0 * W * 4 + 2.0 * W * 4) + (double)distinct_slots * W * 4;
                double flops = (double)C * W;
                if (close) {
                    bytes += (double)C * ((double)rows * dc * 2 * 4 + dc * 2) + dc * 4.0 + NP * 4.0;
                    flops += (double)C * (7.0 * rows * dc + 3.0 * dc + 6.0 * NP);
                }
                char shape[64];
                snprintf(shape, sizeof(shape), "r%d d_c%d rows%d w%d", r, dc, rows, W);
                bench_row(&cl, "compressor", k->name, close ? "close" : "write", C, shape, us, bytes, flops);
                free(hpos);
                free(hact);
                void *bufs[] = {pos, act, proj, ape, nw, dinv, skv, ssc, pool};
                for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) cudaFree(bufs[i]);
            }
    return bench_finish();
}
