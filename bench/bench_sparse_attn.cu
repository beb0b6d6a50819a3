/* bench_sparse_attn.cu - micro-benchmark of kernels/sparse_attn.cu, both variants of `attn`, Flash shapes:
 * 64 heads x 512, 128 window + 512 selected entries (a CSA layer), bf16 output, C = 1, 16, 64 sequences; and, mma
 * only, the longest HCA list (128 window + 8192 compressed entries of a 1M-position pool), where the work split
 * matters most (kernels/sparse_attn_plan.h). The CSA list also runs on the --kv fp8 cache form (kernels/kv_layout.h:
 * 592-byte entries of e4m3 codes, ue8m0 scales and bf16 rope channels), mma only, as `mma-kv8`.
 *   run: build/bench_sparse_attn [--quick] [--verbose]
 * Bytes counted (the fewest a step must move): the n gathered KV rows (or fp8 entries) and q of each sequence, read
 * once, and the bf16 output, written once. FLOPs: 2*H*d*n (Q.K^T) + 2*H*d*n (P.V) per sequence. Each rep gathers a different
 * random entry set out of a KV pool of >= 256 MB, so the rows come from HBM, not L2 (60 MB).
 * Spot check (first call of each variant, before the timing): heads 0 and 63 of the first and last sequence against
 * a double-precision sink softmax + P.V + inverse RoPE over the same gathered bf16 rows.
 */
#include <math.h>
#include <string.h>

#include "../kernels/kv_layout.h"
#include "../kernels/sparse_attn.cuh"
#include "bench_common.cuh"
#include "dsv4/dsv4.h"

enum { H = 64, D = 512, ROPE = 64, N_CSA = 640, N_HCA_MAX = 128 + (1 << 20) / 128 };

typedef struct attn_bench {
    dsv4_sparse_attn_params p;
    int32_t *idx_sets; /* [n_sets][C, p.n_idx] */
    int n_sets;
} attn_bench;

static void attn_fn(void *ctx, int rep)
{
    attn_bench *b = (attn_bench *)ctx;
    b->p.idx = b->idx_sets + (size_t)(rep % b->n_sets) * b->p.n_seq * b->p.n_idx;
    BENCH_OK(dsv4_opt_sparse_attn(&b->p));
}

/* Slot `slot` of sequence c as floats: a bf16 row, or an fp8 entry decoded from its definition (code x 2^(b-127),
 * rope channels bf16). */
static void get_row(const dsv4_sparse_attn_params *p, int c, int slot, float *row)
{
    if (!p->kv8) {
        uint16_t r[D];
        BENCH_CHECK(cudaMemcpy(r, p->kv + (size_t)c * p->kv_seq_stride + (size_t)slot * D, D * 2, cudaMemcpyDeviceToHost));
        for (int d = 0; d < D; d++) row[d] = bench_bf16_to_f32(r[d]);
        return;
    }
    const int eb = (int)dsv4_kv8_entry_bytes(D, ROPE), nope = D - ROPE;
    uint8_t e[1024];
    BENCH_CHECK(cudaMemcpy(e, p->kv8 + (size_t)c * p->kv_seq_stride + (size_t)slot * eb, eb, cudaMemcpyDeviceToHost));
    for (int ch = 0; ch < nope; ch++)
        row[ch] = dsv4_e4m3_to_f32(e[dsv4_kv8_codes_at(ROPE) + ch]) *
                  ldexpf(1.0f, (int)e[dsv4_kv8_scales_at(D, ROPE) + ch / DSV4_KV8_BLOCK] - 127);
    for (int i = 0; i < ROPE; i++) row[nope + i] = bench_bf16_to_f32((uint16_t)(e[2 * i] | e[2 * i + 1] << 8));
}

/* n_slots fp8 cache entries per sequence of C: random e4m3 codes (never the NaN code), scales 2^-9 .. 2^-7 (values
 * up to 3.5, like the bf16 pool's), random bf16 rope channels, zero padding; made on the host. */
static void *make_kv8(int C, int n_slots, uint64_t seed)
{
    const int eb = (int)dsv4_kv8_entry_bytes(D, ROPE), nope = D - ROPE;
    const size_t bytes = (size_t)C * n_slots * eb;
    uint8_t *h = (uint8_t *)calloc(bytes, 1);
    uint64_t st = seed;
    for (size_t e = 0; e < (size_t)C * n_slots; e++) {
        uint8_t *en = h + e * eb;
        for (int i = 0; i < ROPE; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            const float v = (float)((st >> 40) & 0xffff) / 32768.0f - 1.0f;
            uint32_t u;
            memcpy(&u, &v, 4);
            const uint16_t b = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); /* round to nearest even */
            en[2 * i] = (uint8_t)b, en[2 * i + 1] = (uint8_t)(b >> 8);
        }
        for (int ch = 0; ch < nope; ch++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            uint8_t code = (uint8_t)(st >> 56);
            if ((code & 0x7f) == 0x7f) code ^= 1; /* 0x7f / 0xff are NaN in e4m3 */
            en[dsv4_kv8_codes_at(ROPE) + ch] = code;
        }
        for (int b = 0; b < dsv4_kv8_scales(nope); b++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            en[dsv4_kv8_scales_at(D, ROPE) + b] = (uint8_t)(127 - 9 + (st >> 62) % 3);
        }
    }
    void *d = NULL;
    BENCH_CHECK(cudaMalloc(&d, bytes));
    BENCH_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* Heads 0 and H-1 of sequences 0 and C-1 (entry set 0) against the CPU (sparse_attn.cuh's formula). */
static void check_attn(const attn_bench *b, const char *var)
{
    const dsv4_sparse_attn_params *p = &b->p;
    const int C = p->n_seq, np = ROPE / 2, n_idx = p->n_idx;
    uint16_t *q = (uint16_t *)bench_to_host(p->q, (size_t)C * H * D * 2), *o = (uint16_t *)bench_to_host(p->out, (size_t)C * H * D * 2);
    int32_t *idx = (int32_t *)bench_to_host(b->idx_sets, (size_t)C * n_idx * 4);
    float *sink = (float *)bench_to_host(p->sink, H * 4), *cs = (float *)bench_to_host(p->rope_cos, (size_t)C * np * 4);
    float *sn = (float *)bench_to_host(p->rope_sin, (size_t)C * np * 4), got[D];
    float *rows = (float *)malloc((size_t)n_idx * D * 4);
    double *s = (double *)malloc((size_t)n_idx * sizeof(double)), want[D];
    const int seqs[2] = {0, C - 1}, heads[2] = {0, H - 1};
    for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
        const int c = seqs[t];
        for (int j = 0; j < n_idx; j++) get_row(p, c, idx[c * n_idx + j], rows + (size_t)j * D);
        for (int hi = 0; hi < 2; hi++) {
            const int h = heads[hi];
            const uint16_t *qh = q + ((size_t)c * H + h) * D;
            double mx = sink[h], sum = 0.0;
            for (int j = 0; j < n_idx; j++) {
                double a = 0.0;
                for (int d = 0; d < D; d++) a += (double)bench_bf16_to_f32(qh[d]) * rows[(size_t)j * D + d];
                s[j] = a * p->scale;
                mx = fmax(mx, s[j]);
            }
            sum = exp(sink[h] - mx);
            for (int j = 0; j < n_idx; j++) sum += exp(s[j] - mx);
            for (int d = 0; d < D; d++) want[d] = 0.0;
            for (int j = 0; j < n_idx; j++) {
                const double pj = exp(s[j] - mx) / sum;
                for (int d = 0; d < D; d++) want[d] += pj * rows[(size_t)j * D + d];
            }
            for (int i = 0; i < np; i++) { /* inverse RoPE: rotate by -theta */
                const int r = D - ROPE + 2 * i;
                const double x0 = want[r], x1 = want[r + 1], cc = cs[c * np + i], ss = sn[c * np + i];
                want[r] = x0 * cc + x1 * ss;
                want[r + 1] = x1 * cc - x0 * ss;
            }
            for (int d = 0; d < D; d++) got[d] = bench_bf16_to_f32(o[((size_t)c * H + h) * D + d]);
            char what[96];
            snprintf(what, sizeof(what), "sparse_attn %s C=%d seq %d head %d (bf16)", var, C, c, h);
            bench_check_close(what, got, want, D, 1e-3, 2e-2);
        }
    }
    free(q), free(o), free(idx), free(sink), free(cs), free(sn), free(rows), free(s);
}

int main(int argc, char **argv)
{
    bench_init(argc, argv);
    bench_ceilings cl = bench_measure_ceilings();
    bench_header();
    const int Cs[3] = {1, 16, 64}, Ns[2] = {N_CSA, N_HCA_MAX};
    for (int k = 0; k < 6; k++) { /* the CSA list at C = 1, 16, 64, then the longest HCA list */
        const int C = Cs[k % 3], n_idx = Ns[k / 3];
        int n_slots = C >= 256 ? 1024 : 262144 / C; /* C * n_slots * 1 KB = 256 MB of KV */
        if (n_slots < 2 * n_idx) n_slots = 2 * n_idx; /* the long list: mostly distinct rows (1 GB at C = 64) */
        const double set_bytes = (double)C * n_idx * D * 2;
        int n_sets = (int)ceil(3.0 * BENCH_L2_BYTES / set_bytes);
        if (n_sets < 4) n_sets = 4;
        if (n_sets > BENCH_WARMUP + BENCH_REPS) n_sets = BENCH_WARMUP + BENCH_REPS;

        attn_bench b;
        memset(&b, 0, sizeof(b));
        void *q, *kv, *sink, *cs, *sn, *out;
        BENCH_CHECK(cudaMalloc(&q, (size_t)C * H * D * 2));
        BENCH_CHECK(cudaMalloc(&kv, (size_t)C * n_slots * D * 2));
        BENCH_CHECK(cudaMalloc(&sink, H * 4));
        BENCH_CHECK(cudaMalloc(&cs, (size_t)C * ROPE / 2 * 4));
        BENCH_CHECK(cudaMalloc(&sn, (size_t)C * ROPE / 2 * 4));
        BENCH_CHECK(cudaMalloc(&out, (size_t)C * H * D * 2));
        BENCH_CHECK(cudaMalloc((void **)&b.idx_sets, (size_t)n_sets * C * n_idx * 4));
        bench_fill_bf16(q, (size_t)C * H * D, 11, 4.0f);
        bench_fill_bf16(kv, (size_t)C * n_slots * D, 12, 1.0f);
        bench_fill_f32(sink, H, 13, 1.0f);
        bench_fill_f32(cs, (size_t)C * ROPE / 2, 14, 1.0f);
        bench_fill_f32(sn, (size_t)C * ROPE / 2, 15, 1.0f);
        int32_t *hidx = (int32_t *)malloc((size_t)n_sets * C * n_idx * 4);
        uint64_t st = 99;
        for (size_t i = 0; i < (size_t)n_sets * C * n_idx; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            hidx[i] = (int32_t)((st >> 33) % (uint64_t)n_slots);
        }
        BENCH_CHECK(cudaMemcpy(b.idx_sets, hidx, (size_t)n_sets * C * n_idx * 4, cudaMemcpyHostToDevice));
        free(hidx);
        b.n_sets = n_sets;

        dsv4_sparse_attn_params *p = &b.p;
        p->n_seq = C;
        p->n_heads = H;
        p->head_dim = D;
        p->rope_dim = ROPE;
        p->n_idx = n_idx;
        p->n_slots = n_slots;
        p->scale = 1.0f / sqrtf((float)D);
        p->q = (const uint16_t *)q;
        p->kv = (const uint16_t *)kv;
        p->kv_seq_stride = (int64_t)n_slots * D;
        p->idx = b.idx_sets;
        p->sink = (const float *)sink;
        p->rope_cos = (const float *)cs;
        p->rope_sin = (const float *)sn;
        p->out = out;
        p->out_dtype = DSV4_OUT_BF16;
        p->stream = 0;
        void *ws = NULL;
        const double bytes = (double)C * (n_idx * D * 2 + H * D * 2 + H * D * 2);
        const double flops = (double)C * 4.0 * H * D * n_idx;
        void *kv8 = n_idx == N_CSA ? make_kv8(C, n_slots, 77 + C) : NULL;
        static const char *const vars[3] = {"mma", "simt", "mma-kv8"};
        for (int v = 0; v < (n_idx == N_CSA ? 3 : 1); v++) { /* simt, kv8: the CSA list only (long lists take ms) */
            p->kernel = v == 1 ? DSV4_ATTN_KERNEL_SIMT : DSV4_ATTN_KERNEL_MMA;
            const int fp8 = v == 2, eb = (int)dsv4_kv8_entry_bytes(D, ROPE);
            p->kv = fp8 ? NULL : (const uint16_t *)kv;
            p->kv8 = fp8 ? (const uint8_t *)kv8 : NULL;
            p->kv_seq_stride = fp8 ? (int64_t)n_slots * eb : (int64_t)n_slots * D;
            const double v_bytes = fp8 ? (double)C * (n_idx * eb + H * D * 2 + H * D * 2) : bytes;
            p->workspace_bytes = dsv4_opt_sparse_attn_workspace_bytes(p);
            if (p->workspace_bytes) BENCH_CHECK(cudaMalloc(&ws, p->workspace_bytes));
            p->workspace = ws;
            bench_fill_bf16(out, (size_t)C * H * D, 16 + v, 1e3f); /* garbage: unwritten outputs fail */
            attn_fn(&b, 0);
            BENCH_CHECK(cudaDeviceSynchronize());
            check_attn(&b, vars[v]);
            double us = bench_median_us(attn_fn, &b);
            char shape[64];
            snprintf(shape, sizeof(shape), "64x512 n=%d ws=%zuKB", n_idx, p->workspace_bytes >> 10);
            bench_row(&cl, "sparse_attn", vars[v], "-", C, shape, us, v_bytes, flops);
            cudaFree(ws);
            ws = NULL;
        }
        cudaFree(q);
        cudaFree(kv);
        cudaFree(kv8);
        cudaFree(sink);
        cudaFree(cs);
        cudaFree(sn);
        cudaFree(out);
        cudaFree(b.idx_sets);
    }
    return bench_finish();
}
