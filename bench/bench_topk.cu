/* bench_topk.cu - micro-benchmark of kernels/topk.cu: exact top-512 of n = 1K, 8K, 64K, 256K live scores per
 * sequence (4K ... 1M context), C = 1, 16, 64.
 *   run: build/bench_topk [--quick] [--verbose]
 * Bytes counted (the fewest): the n scores read once and the 512 ids written. FLOPs: none (reported as 0).
 * Each rep reads a different score set out of a pool of >= 180 MB, so the scores come from HBM (in the decode step
 * they were just written by the indexer and may partly sit in L2: this is the cold case).
 * Spot check (first call, before the timing): the ordered ids of the first and last sequence against a CPU sort
 * (higher score first, then lower id).
 */
#include <string.h>

#include "../kernels/topk.cuh"
#include "bench_common.cuh"

enum { K = 512 };

typedef struct tk_bench {
    dsv4_topk_params p;
    const float *pool;
    size_t set_elems;
    int n_sets;
} tk_bench;

static const float *cmp_scores; /* qsort has no context argument */
static int cmp_desc(const void *a, const void *b)
{
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const float x = cmp_scores[i], y = cmp_scores[j];
    return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}

/* The first k ids of sequences 0 and C-1 (scores set 0) against a full CPU sort. */
static void check_topk(const tk_bench *b, int C, int n)
{
    float *sc = (float *)bench_to_host(b->pool, (size_t)C * n * 4);
    int32_t *got = (int32_t *)bench_to_host(b->p.out, (size_t)C * K * 4), *ord = (int32_t *)malloc((size_t)n * 4);
    const int seqs[2] = {0, C - 1};
    for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
        const int c = seqs[t];
        for (int i = 0; i < n; i++) ord[i] = i;
        cmp_scores = sc + (size_t)c * n;
        qsort(ord, (size_t)n, 4, cmp_desc);
        char what[96];
        snprintf(what, sizeof(what), "topk C=%d n=%d seq %d ordered ids", C, n, c);
        bench_check_equal_i32(what, got + (size_t)c * K, ord, K);
    }
    free(sc);
    free(got);
    free(ord);
}

static void tk_fn(void *ctx, int rep)
{
    tk_bench *b = (tk_bench *)ctx;
    b->p.scores = b->pool + (size_t)(rep % b->n_sets) * b->set_elems;
    BENCH_OK(dsv4_opt_topk(&b->p));
}

int main(int argc, char **argv)
{
    bench_init(argc, argv);
    bench_ceilings cl = bench_measure_ceilings();
    bench_header();
    const int Cs[3] = {1, 16, 64}, ns[4] = {1024, 8192, 65536, 262144};
    for (int ci = 0; ci < 3; ci++)
        for (int ni = 0; ni < 4; ni++) {
            const int C = Cs[ci], n = ns[ni];
            tk_bench b;
            memset(&b, 0, sizeof(b));
            b.set_elems = (size_t)C * n;
            b.n_sets = (int)((3 * BENCH_L2_BYTES) / (b.set_elems * 4)) + 1;
            if (b.n_sets > BENCH_WARMUP + BENCH_REPS) b.n_sets = BENCH_WARMUP + BENCH_REPS;
            void *pool, *nl, *out, *ws;
            BENCH_CHECK(cudaMalloc(&pool, b.set_elems * b.n_sets * 4));
            bench_fill_f32(pool, b.set_elems * b.n_sets, 31 + ni, 1.0f);
            int32_t *hl = (int32_t *)malloc((size_t)C * 4);
            for (int c = 0; c < C; c++) hl[c] = n;
            BENCH_CHECK(cudaMalloc(&nl, (size_t)C * 4));
            BENCH_CHECK(cudaMemcpy(nl, hl, (size_t)C * 4, cudaMemcpyHostToDevice));
            free(hl);
            BENCH_CHECK(cudaMalloc(&out, (size_t)C * K * 4));
            dsv4_topk_params *p = &b.p;
            p->n_seq = C;
            p->k = K;
            p->n_work = n;
            p->score_stride = n;
            p->n_live = (const int32_t *)nl;
            p->context = DSV4_INDEX_CONTEXT_LIVE;
            p->out = (int32_t *)out;
            p->workspace_bytes = dsv4_opt_topk_workspace_bytes(p);
            BENCH_CHECK(cudaMalloc(&ws, p->workspace_bytes));
            p->workspace = ws;
            b.pool = (const float *)pool;
            BENCH_CHECK(cudaMemset(out, 0x7f, (size_t)C * K * 4)); /* garbage: unwritten ids fail */
            tk_fn(&b, 0);
            BENCH_CHECK(cudaDeviceSynchronize());
            check_topk(&b, C, n);
            double us = bench_median_us(tk_fn, &b);
            char shape[64];
            snprintf(shape, sizeof(shape), "k=512 of n=%d", n);
            bench_row(&cl, "topk", "radix", "live", C, shape, us, (double)C * (n * 4.0 + K * 4.0), 0.0);
            cudaFree(pool);
            cudaFree(nl);
            cudaFree(out);
            cudaFree(ws);
        }
    return bench_finish();
}
