/* bench_indexer.cu - micro-benchmark of kernels/indexer.cu, both variants of `indexer` and both positions of
 * `index_context`, Flash shapes: 64 heads x 128, live entries 1K (4K context) and 8K (32K context), maximum
 * 262144 entries (1M context / 4), C = 1, 16, 64.
 *   run: build/bench_indexer [--quick] [--verbose]
 * Bytes counted (the fewest): the keys of the computed entries (live, or all 262144 for `max`) and q read once,
 * the scores written once; the fp32 variant's scratch traffic is not counted (it is what that variant wastes).
 * FLOPs: 2*H*d per computed entry. Live runs rotate the key window per rep through a 64 MB-per-sequence pool so
 * the keys come from HBM.
 * Spot check (first call of each case, before the timing): 16 live scores of the first and last sequence against a
 * double-precision sum over the same bf16 q and keys, and (max) two masked entries past the live ones = -inf.
 */
#include <math.h>
#include <string.h>

#include "../kernels/indexer.cuh"
#include "bench_common.cuh"

enum { H = 64, D = 128, N_MAX = 262144 };

typedef struct idx_bench {
    dsv4_indexer_params p;
    const uint16_t *keys0;
    int n_offsets, live;
} idx_bench;

static void idx_fn(void *ctx, int rep)
{
    idx_bench *b = (idx_bench *)ctx;
    b->p.keys = b->keys0 + (size_t)(rep % b->n_offsets) * b->live * D;
    BENCH_OK(dsv4_opt_indexer_scores(&b->p));
}

/* Scores of sequences 0 and C-1 (key window 0) at 16 live entries against the CPU sum; max: entries past live. */
static void check_idx(const idx_bench *b, int C, int live, const char *var, const char *ctx)
{
    const dsv4_indexer_params *p = &b->p;
    uint16_t *q = (uint16_t *)bench_to_host(p->q, (size_t)C * H * D * 2), key[D];
    float *w = (float *)bench_to_host(p->weights, (size_t)C * H * 4), got[18];
    double want[18];
    const int seqs[2] = {0, C - 1};
    for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
        const int c = seqs[t];
        int n = 0;
        for (int i = 0; i < 16; i++, n++) {
            const int e = (int)(((int64_t)i * 7919 + 13) % live);
            BENCH_CHECK(cudaMemcpy(key, b->keys0 + (size_t)c * p->key_seq_stride + (size_t)e * D, D * 2,
                                   cudaMemcpyDeviceToHost));
            double sum = 0.0;
            for (int h = 0; h < H; h++) {
                double dot = 0.0;
                for (int d = 0; d < D; d++)
                    dot += (double)bench_bf16_to_f32(q[((size_t)c * H + h) * D + d]) * bench_bf16_to_f32(key[d]);
                sum += w[(size_t)c * H + h] * (dot > 0.0 ? dot : 0.0);
            }
            want[n] = sum;
            BENCH_CHECK(cudaMemcpy(&got[n], p->scores + (size_t)c * p->score_stride + e, 4, cudaMemcpyDeviceToHost));
        }
        char what[96];
        snprintf(what, sizeof(what), "indexer %s %s C=%d live=%d seq %d scores", var, ctx, C, live, c);
        bench_check_close(what, got, want, (size_t)n, 1e-5, 1e-3);
        if (p->context == DSV4_INDEX_CONTEXT_MAX) {
            const int past[2] = {live, N_MAX - 1};
            int bad = 0;
            for (int i = 0; i < 2; i++) {
                float v;
                BENCH_CHECK(cudaMemcpy(&v, p->scores + (size_t)c * p->score_stride + past[i], 4, cudaMemcpyDeviceToHost));
                bad += !(isinf(v) && v < 0);
            }
            if (bad || bench_verbose)
                printf("check %-44s %s: entries %d and %d past live are -inf\n", what, bad ? "FAIL" : "ok", live,
                       N_MAX - 1);
            if (bad)
                bench_failures++;
            else
                bench_passes++;
        }
    }
    free(q);
    free(w);
}

int main(int argc, char **argv)
{
    bench_init(argc, argv);
    bench_ceilings cl = bench_measure_ceilings();
    bench_header();
    const int Cs[3] = {1, 16, 64}, lives[2] = {1024, 8192};
    for (int ci = 0; ci < 3; ci++) {
        const int C = Cs[ci];
        void *q, *keys, *w, *nl, *sc, *scr = NULL;
        BENCH_CHECK(cudaMalloc(&q, (size_t)C * H * D * 2));
        BENCH_CHECK(cudaMalloc(&keys, (size_t)C * N_MAX * D * 2));
        BENCH_CHECK(cudaMalloc(&w, (size_t)C * H * 4));
        BENCH_CHECK(cudaMalloc(&nl, (size_t)C * 4));
        BENCH_CHECK(cudaMalloc(&sc, (size_t)C * N_MAX * 4));
        bench_fill_bf16(q, (size_t)C * H * D, 21, 1.0f);
        bench_fill_bf16(keys, (size_t)C * N_MAX * D, 22, 1.0f);
        bench_fill_f32(w, (size_t)C * H, 23, 0.011f);
        size_t scr_max = (size_t)C * H * N_MAX * 4;
        BENCH_CHECK(cudaMalloc(&scr, scr_max));
        for (int li = 0; li < 2; li++) {
            const int live = lives[li];
            int32_t *hl = (int32_t *)malloc((size_t)C * 4);
            for (int c = 0; c < C; c++) hl[c] = live;
            BENCH_CHECK(cudaMemcpy(nl, hl, (size_t)C * 4, cudaMemcpyHostToDevice));
            free(hl);
            for (int ctx = 0; ctx < 2; ctx++)
                for (int v = 0; v < 2; v++) {
                    idx_bench b;
                    memset(&b, 0, sizeof(b));
                    dsv4_indexer_params *p = &b.p;
                    p->n_seq = C;
                    p->n_heads = H;
                    p->head_dim = D;
                    p->context = ctx == 0 ? DSV4_INDEX_CONTEXT_LIVE : DSV4_INDEX_CONTEXT_MAX;
                    p->kernel = v == 0 ? DSV4_INDEXER_KERNEL_BF16 : DSV4_INDEXER_KERNEL_F32;
                    p->n_work = ctx == 0 ? live : N_MAX;
                    p->q = (const uint16_t *)q;
                    p->key_seq_stride = (int64_t)N_MAX * D;
                    p->weights = (const float *)w;
                    p->n_live = (const int32_t *)nl;
                    p->scores = (float *)sc;
                    p->score_stride = N_MAX;
                    p->scratch = (float *)scr;
                    p->scratch_bytes = scr_max;
                    b.keys0 = (const uint16_t *)keys;
                    b.live = live;
                    b.n_offsets = ctx == 0 ? N_MAX / live - 1 : 1;
                    bench_fill_f32(sc, (size_t)C * N_MAX, 24 + v, 1e3f); /* garbage: unwritten scores fail */
                    idx_fn(&b, 0);
                    BENCH_CHECK(cudaDeviceSynchronize());
                    check_idx(&b, C, live, v == 0 ? "bf16" : "f32", ctx == 0 ? "live" : "max");
                    double us = bench_median_us(idx_fn, &b);
                    double n = p->n_work;
                    double bytes = (double)C * (n * D * 2 + H * D * 2 + n * 4);
                    double flops = (double)C * 2.0 * H * D * n;
                    char shape[64];
                    snprintf(shape, sizeof(shape), "64x128 live=%d work=%d", live, p->n_work);
                    bench_row(&cl, "indexer", v == 0 ? "bf16" : "f32", ctx == 0 ? "live" : "max", C, shape, us, bytes,
                              flops);
                }
        }
        cudaFree(q);
        cudaFree(keys);
        cudaFree(w);
        cudaFree(nl);
        cudaFree(sc);
        cudaFree(scr);
    }
    return bench_finish();
}
