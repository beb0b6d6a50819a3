/* test_opt_prefill.c - the optimized path's prefill (issue 35) on the GPU, below the end-to-end gates of
 * tests/e2e_opt_prefill_gpu.sh, so a failure there points at a piece:
 * - the compressor runs (kernels/compressor.cu, compressor_plan.h): two sequences fed in random runs of 1..2r+3
 *   tokens per call (both in one call, rows packed) give the same pool entries and the same states, bit for bit, as
 *   the one-token kernel fed the same projections a token at a time; CSA (r 4, overlapping) and HCA (r 16), bf16
 *   pools and the --kv fp8 pool. A mismatch prints the first differing byte's entry, channel and both values;
 * - the window of a run (kernels/step.cu's gather list with fresh rows and ring write, sparse_attn.cu reading
 *   them): a sliding layer's attention over 3 runs of a 30-token sequence (11, 1, 18 tokens; window 8) gives the
 *   same bits as one-token steps that write the ring first, for the mma and the simt kernels, bf16 rows and fp8
 *   cache entries (the gather order and the values are the same; one tile, so no split);
 * - the grouped expert GEMMs of a long run (kernels/moe_sorted.cu's sort, gather, dsv4_opt_moe_gemms on lanes,
 *   SwiGLU, combine, as opt_step.c runs them) against the decode kernels (kernels/moe.cu) on random bf16 experts,
 *   300 tokens, expert parallel subsets included: the same values within bf16 rounding of h (other fp32
 *   summation orders); the same with FP4 experts (fp8 mode: each expert's matrices dequantised by
 *   dsv4_opt_fp4_dequant into its lane's slot, then the same GEMMs) against the FP4 decode kernels
 *   (kernels/fp4_experts.cu); on 1, 3 and 4 lanes bitwise the same (outputs poisoned first); a bad lane set
 *   refused with a message; and the dequantisation itself bit for bit against e2m1 x 2^(b-127) computed here
 *   from the checkpoint's nibbles (low nibble = even column), -0 and every code and scale range;
 * - the FP8 linears of a long run (dsv4_opt_fp8_dequant + cuBLAS, opt_model.c): the dequantisation bit for bit
 *   against dsv4_e4m3_to_f32 x scale computed here (e8m0 and f32 scales, partial 128-blocks), and the GEMM over
 *   it against the FP8 linear kernel (the same exact products, another fp32 summation order: rel-L2 < 1e-5);
 * - a 200-token step of golden/tiny quantised to fp8 (FP8 linears, FP4 experts, e8m0 scales) with the prefill
 *   GEMMs (grouped FP4 experts, dequantised FP8 linears) against the same step on the decode kernels
 *   (options.prefill_experts decode, prefill_linears kernel): logits within a bf16 distance, no allocation in
 *   the step, the step bitwise reproducible; and 200-token steps of golden/tiny, bf16 and fp8, on 1, 2, 4 and 8
 *   expert lanes (options.expert_lanes): bitwise the same logits;
 * - the ragged step on golden/tiny (dsv4_opt_step_ragged): no device allocation in any step (style rule 10); a
 *   chunked and mixed schedule run twice gives bitwise the same logits and picks (determinism for a given batch
 *   composition); its last prompt position's logits stay within a bf16 distance of one-token steps of the same
 *   path (rel-L2 printed; the chaos of a near-tie flip is the e2e gates' business); a step past the budget and a
 *   run past max_context are refused with a message, nothing done.
 */
#include <check.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/compressor.cuh"
#include "../../kernels/elementwise.cuh"
#include "../../kernels/kv_layout.h"
#include "../../kernels/moe.cuh"
#include "../../kernels/moe_sorted.cuh"
#include "../../kernels/qweight.cuh"
#include "../../kernels/sparse_attn.cuh"
#include "../../kernels/step.cuh"
#include "dsv4/dsv4.h"
#include "dsv4/dsv4_opt.h"
#include "dsv4_test.h"

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    ck_assert_msg(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc %zu", bytes);
    ck_assert(cudaMemset(p, 0, bytes) == cudaSuccess);
    return p;
}

static void up(void *d, const void *h, size_t bytes)
{
    ck_assert(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
}

static void *down(const void *d, size_t bytes)
{
    void *h = malloc(bytes);
    ck_assert(cudaDeviceSynchronize() == cudaSuccess);
    ck_assert(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
}

static uint64_t rs = 12345;
static float urand(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* One compressor configuration: one-token calls (path 0) and runs (path 1) over P positions of 2 sequences. */
static void compressor_runs_case(int r, int overlap, int fp8)
{
    enum { C = 2, DC = 64, NP = 8, P = 77 };
    const int W = (overlap ? 2 : 1) * DC, rows = (overlap ? 2 : 1) * r, cap = P / r + 1, row0 = 5;
    const int stride = 2 * W + 3, kv_off = 1, gate_off = 2 + W;
    const int64_t eb = fp8 ? dsv4_kv8_entry_bytes(DC, 2 * NP) : 2 * DC;
    const int64_t pool_stride_b = ((row0 + cap) * eb + 15) / 16 * 16; /* bytes per sequence */
    float *proj_all = malloc((size_t)C * P * stride * 4), ape[16 * 2 * 64], nw[DC], inv[NP];
    for (size_t i = 0; i < (size_t)C * P * stride; i++) proj_all[i] = urand() * 2.0f;
    for (int i = 0; i < r * W; i++) ape[i] = urand();
    for (int i = 0; i < DC; i++) nw[i] = 1.0f + 0.1f * urand();
    for (int i = 0; i < NP; i++) inv[i] = powf(160000.0f, -(float)(2 * i) / (2 * NP));
    void *out_pool[2], *out_skv[2], *out_ssc[2];
    for (int path = 0; path < 2; path++) {
        dsv4_compressor_params p;
        memset(&p, 0, sizeof p);
        p.ratio = r, p.d_c = DC, p.overlap = overlap, p.rope_pairs = NP, p.fp8_nope = fp8, p.eps = 1e-6f;
        p.proj_stride = stride, p.kv_off = kv_off, p.gate_off = gate_off;
        p.ape = dev_alloc((size_t)r * W * 4);
        up((void *)p.ape, ape, (size_t)r * W * 4);
        p.norm_w = dev_alloc(DC * 4);
        up((void *)p.norm_w, nw, DC * 4);
        p.inv_freq = dev_alloc(NP * 4);
        up((void *)p.inv_freq, inv, NP * 4);
        p.state_kv = dev_alloc((size_t)C * rows * W * 4);
        p.state_score = dev_alloc((size_t)C * rows * W * 4);
        ck_assert(dsv4_opt_fill_f32(p.state_score, -INFINITY, (size_t)C * rows * W, 0) == 0);
        void *pool = dev_alloc((size_t)C * pool_stride_b);
        if (fp8) p.pool8 = pool, p.pool8_seq_stride = pool_stride_b;
        else p.pool = pool, p.pool_seq_stride = pool_stride_b / 2;
        p.pool_row0 = row0, p.pool_cap = cap;
        int32_t *d_pos = dev_alloc(C * P * 4), *d_act = dev_alloc(C * P * 4), *d_seq = dev_alloc(C * P * 4);
        int32_t *d_off = dev_alloc(C * P * 4), *d_len = dev_alloc(C * P * 4);
        float *d_proj = dev_alloc((size_t)C * P * stride * 4);
        p.pos = d_pos, p.active = d_act, p.proj = d_proj;
        int pos[C] = {0, 0};
        int32_t h_pos[C * P], h_act[C * P], h_seq[C * P], h_off[C * P], h_len[C * P];
        float *h_proj = malloc((size_t)C * P * stride * 4);
        rs = 777 + (uint64_t)r * 31 + (uint64_t)overlap; /* the same run lengths for both paths' checks */
        while (pos[0] < P || pos[1] < P) {
            int n[C], T = 0;
            for (int c = 0; c < C; c++) {
                int want = path == 0 ? 1 : 1 + (int)((urand() + 1.0f) * 0.5f * (float)(2 * r + 3));
                if (want > 2 * r + 3) want = 2 * r + 3;
                n[c] = pos[c] + want <= P ? want : P - pos[c];
            }
            if (path == 0) { /* one token per sequence: row c = sequence c, a finished one inactive */
                for (int c = 0; c < C; c++) {
                    h_pos[c] = pos[c] < P ? pos[c] : 0;
                    h_act[c] = pos[c] < P;
                    memcpy(h_proj + (size_t)c * stride, proj_all + ((size_t)c * P + h_pos[c]) * stride,
                           (size_t)stride * 4);
                }
                T = C;
                p.seq = p.run_off = p.run_len = NULL;
            } else {
                for (int c = 0; c < C; c++)
                    for (int j = 0; j < n[c]; j++, T++) {
                        h_pos[T] = pos[c] + j, h_act[T] = 1, h_seq[T] = c, h_off[T] = j, h_len[T] = n[c];
                        memcpy(h_proj + (size_t)T * stride, proj_all + ((size_t)c * P + pos[c] + j) * stride,
                               (size_t)stride * 4);
                    }
                up(d_seq, h_seq, (size_t)T * 4);
                up(d_off, h_off, (size_t)T * 4);
                up(d_len, h_len, (size_t)T * 4);
                p.seq = d_seq, p.run_off = d_off, p.run_len = d_len;
            }
            if (T == 0) break;
            up(d_pos, h_pos, (size_t)T * 4);
            up(d_act, h_act, (size_t)T * 4);
            up(d_proj, h_proj, (size_t)T * stride * 4);
            p.n_seq = T;
            ck_assert_msg(dsv4_opt_compressor_update(&p) == 0, "%s", dsv4_last_error());
            ck_assert(cudaDeviceSynchronize() == cudaSuccess);
            for (int c = 0; c < C; c++) pos[c] += path == 0 ? (pos[c] < P) : n[c];
        }
        out_pool[path] = down(pool, (size_t)C * pool_stride_b);
        out_skv[path] = down(p.state_kv, (size_t)C * rows * W * 4);
        out_ssc[path] = down(p.state_score, (size_t)C * rows * W * 4);
        cudaFree((void *)p.ape), cudaFree((void *)p.norm_w), cudaFree((void *)p.inv_freq);
        cudaFree(p.state_kv), cudaFree(p.state_score), cudaFree(pool);
        cudaFree(d_pos), cudaFree(d_act), cudaFree(d_seq), cudaFree(d_off), cudaFree(d_len), cudaFree(d_proj);
        free(h_proj);
    }
    const unsigned char *a = out_pool[0], *b = out_pool[1];
    for (int64_t i = 0; i < C * pool_stride_b; i++)
        ck_assert_msg(a[i] == b[i],
                      "compressor r %d overlap %d fp8 %d: pool byte %lld (sequence %lld, row %lld, byte %lld of the "
                      "entry) one-token 0x%02x, runs 0x%02x", r, overlap, fp8, (long long)i,
                      (long long)(i / pool_stride_b), (long long)(i % pool_stride_b / eb),
                      (long long)(i % pool_stride_b % eb), a[i], b[i]);
    const float *ka = out_skv[0], *kb = out_skv[1], *sa = out_ssc[0], *sb = out_ssc[1];
    for (int i = 0; i < C * rows * W; i++) {
        ck_assert_msg(memcmp(&ka[i], &kb[i], 4) == 0, "state kv [%d] (sequence %d, row %d, column %d): %g vs %g", i,
                      i / (rows * W), i / W % rows, i % W, ka[i], kb[i]);
        ck_assert_msg(memcmp(&sa[i], &sb[i], 4) == 0, "state score [%d] (sequence %d, row %d, column %d): %g vs %g",
                      i, i / (rows * W), i / W % rows, i % W, sa[i], sb[i]);
    }
    printf("compressor runs r %d %s %s: entries and states bitwise those of one-token steps\n", r,
           overlap ? "CSA" : "HCA", fp8 ? "fp8 pool" : "bf16 pool");
    for (int k = 0; k < 2; k++) free(out_pool[k]), free(out_skv[k]), free(out_ssc[k]);
    free(proj_all);
}

START_TEST(test_compressor_runs_bitwise)
{
    compressor_runs_case(4, 1, 0);
    compressor_runs_case(16, 0, 0);
    compressor_runs_case(4, 1, 1);
    compressor_runs_case(16, 0, 1);
}
END_TEST

/* bf16 bits of f, round to nearest even */
static uint16_t bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ------------------------------------------------------------------------------------------- window */
static void window_case(int kernel, int fp8)
{
    enum { P = 30, W = 8, H = 16, D = 64, ROPE = 16, NR = 3 };
    const int runs[NR] = {11, 1, 18};
    const int64_t eb = fp8 ? dsv4_kv8_entry_bytes(D, ROPE) : 2 * D, pool_cap = 4, n_slots = W + pool_cap;
    const int64_t seq_stride = n_slots * (fp8 ? eb : D); /* elements (bf16) or bytes (fp8) */
    uint8_t *kv_all = malloc((size_t)P * eb);
    uint16_t *q_all = malloc((size_t)P * H * D * 2);
    float *cs_all = malloc((size_t)P * (ROPE / 2) * 4), *sn_all = malloc((size_t)P * (ROPE / 2) * 4), sink[H];
    rs = 99 + (uint64_t)kernel * 7 + (uint64_t)fp8;
    for (int p = 0; p < P; p++) {
        uint8_t *e = kv_all + (size_t)p * eb;
        if (!fp8) {
            for (int i = 0; i < D; i++) ((uint16_t *)e)[i] = bf(urand());
        } else {
            memset(e, 0, (size_t)eb);
            for (int i = 0; i < ROPE; i++) ((uint16_t *)e)[i] = bf(urand());
            for (int ch = 0; ch < D - ROPE; ch++) {
                uint8_t c = (uint8_t)((urand() + 1.0f) * 127.0f);
                if ((c & 0x7f) == 0x7f) c ^= 1; /* NaN codes */
                e[dsv4_kv8_codes_at(ROPE) + ch] = c;
            }
            for (int b = 0; b < dsv4_kv8_scales(D - ROPE); b++) e[dsv4_kv8_scales_at(D, ROPE) + b] = 122;
        }
        for (int i = 0; i < H * D; i++) q_all[(size_t)p * H * D + i] = bf(urand());
        for (int i = 0; i < ROPE / 2; i++) {
            cs_all[p * (ROPE / 2) + i] = cosf(0.1f * (float)(p * (i + 1)));
            sn_all[p * (ROPE / 2) + i] = sinf(0.1f * (float)(p * (i + 1)));
        }
    }
    for (int h = 0; h < H; h++) sink[h] = urand();
    float *outs[2];
    for (int path = 0; path < 2; path++) {
        void *cache = dev_alloc((size_t)n_slots * eb), *fresh = dev_alloc((size_t)P * eb);
        uint16_t *q = dev_alloc((size_t)P * H * D * 2);
        float *cs = dev_alloc((size_t)P * (ROPE / 2) * 4), *sn = dev_alloc((size_t)P * (ROPE / 2) * 4);
        float *d_sink = dev_alloc(H * 4), *out = dev_alloc((size_t)P * H * D * 4);
        int32_t *idx = dev_alloc((size_t)P * W * 4), *pos = dev_alloc(P * 4), *act = dev_alloc(P * 4);
        int32_t *seq = dev_alloc(P * 4), *off = dev_alloc(P * 4), *len = dev_alloc(P * 4);
        up(d_sink, sink, H * 4);
        outs[path] = malloc((size_t)P * H * D * 4);
        int p0 = 0;
        for (int r = 0; r < (path ? NR : P); r++) {
            const int n = path ? runs[r] : 1;
            int32_t hp[P], ha[P], hs[P], ho[P], hl[P];
            for (int j = 0; j < n; j++) hp[j] = p0 + j, ha[j] = 1, hs[j] = 0, ho[j] = j, hl[j] = n;
            up(pos, hp, (size_t)n * 4), up(act, ha, (size_t)n * 4), up(seq, hs, (size_t)n * 4);
            up(off, ho, (size_t)n * 4), up(len, hl, (size_t)n * 4);
            up(q, q_all + (size_t)p0 * H * D, (size_t)n * H * D * 2);
            up(cs, cs_all + (size_t)p0 * (ROPE / 2), (size_t)n * (ROPE / 2) * 4);
            up(sn, sn_all + (size_t)p0 * (ROPE / 2), (size_t)n * (ROPE / 2) * 4);
            if (path == 0) /* one token: the ring first */
                up((char *)cache + (size_t)(p0 % W) * eb, kv_all + (size_t)p0 * eb, (size_t)eb);
            else
                up(fresh, kv_all + (size_t)p0 * eb, (size_t)n * eb);
            dsv4_step_index_params xp = {.n_seq = n, .window = W, .n_extra = 0, .kind = DSV4_STEP_INDEX_WINDOW,
                                         .pos = pos, .idx = idx, .run_off = path ? off : NULL,
                                         .fresh_base = (int)n_slots};
            ck_assert_msg(dsv4_opt_step_index(&xp) == 0, "%s", dsv4_last_error());
            dsv4_sparse_attn_params ap = {.n_seq = n, .n_heads = H, .head_dim = D, .rope_dim = ROPE, .n_idx = W,
                                          .n_slots = (int)n_slots, .scale = 0.125f, .q = q,
                                          .kv = fp8 ? NULL : cache, .kv8 = fp8 ? cache : NULL,
                                          .kv_seq_stride = seq_stride, .idx = idx, .seq = path ? seq : NULL,
                                          .fresh = path ? fresh : NULL, .n_fresh = path ? n : 0, .sink = d_sink,
                                          .rope_cos = cs, .rope_sin = sn, .out = out, .out_dtype = DSV4_OUT_F32,
                                          .kernel = (dsv4_attn_kernel)kernel};
            ck_assert_int_eq(dsv4_opt_sparse_attn_workspace_bytes(&ap), 0); /* one tile: no split */
            ck_assert_msg(dsv4_opt_sparse_attn(&ap) == 0, "%s", dsv4_last_error());
            if (path) {
                dsv4_ring_write_params rw = {.n_rows = n, .window = W, .entry_bytes = eb, .pos = pos, .active = act,
                                             .seq = seq, .run_off = off, .run_len = len, .fresh = fresh,
                                             .ring = cache, .ring_seq_stride = n_slots * eb};
                ck_assert_msg(dsv4_opt_ring_write(&rw) == 0, "%s", dsv4_last_error());
            }
            ck_assert(cudaDeviceSynchronize() == cudaSuccess);
            ck_assert(cudaMemcpy(outs[path] + (size_t)p0 * H * D, out, (size_t)n * H * D * 4,
                                 cudaMemcpyDeviceToHost) == cudaSuccess);
            p0 += n;
        }
        cudaFree(cache), cudaFree(fresh), cudaFree(q), cudaFree(cs), cudaFree(sn), cudaFree(d_sink), cudaFree(out);
        cudaFree(idx), cudaFree(pos), cudaFree(act), cudaFree(seq), cudaFree(off), cudaFree(len);
    }
    for (int i = 0; i < P * H * D; i++)
        ck_assert_msg(memcmp(&outs[0][i], &outs[1][i], 4) == 0,
                      "attention %s %s: position %d head %d channel %d: one-token %g, runs %g", kernel ? "simt" : "mma",
                      fp8 ? "fp8" : "bf16", i / (H * D), i / D % H, i % D, outs[0][i], outs[1][i]);
    printf("window of runs (%s, %s cache): attention bitwise that of one-token steps at all %d positions\n",
           kernel ? "simt" : "mma", fp8 ? "fp8" : "bf16", P);
    free(outs[0]), free(outs[1]), free(kv_all), free(q_all), free(cs_all), free(sn_all);
}

START_TEST(test_window_runs_bitwise)
{
    for (int kernel = 0; kernel < 2; kernel++)
        for (int fp8 = 0; fp8 < 2; fp8++) window_case(kernel, fp8);
}
END_TEST

/* ------------------------------------------------------------------------------------------- sorted experts */

/* The e2m1 value of a checkpoint nibble (model-spec §2): sign bit 3, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. */
static float e2m1(unsigned nib)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return nib & 8 ? -mag[nib & 7] : mag[nib & 7];
}

/* Random FP4 matrices [n_mat][rows, cols] as the checkpoint holds them: codes (host, checkpoint layout) and e8m0
 * scales in [lo, lo + span); the device copy of the codes repacked as the step holds them. */
static void fp4_random(int n_mat, int rows, int cols, int lo, int span, uint8_t **h_codes, uint8_t **h_sc,
                       uint8_t **d_codes, uint8_t **d_sc)
{
    const size_t nc = (size_t)n_mat * rows * cols / 2, ns = (size_t)n_mat * rows * cols / 32;
    *h_codes = malloc(nc), *h_sc = malloc(ns);
    for (size_t i = 0; i < nc; i++) {
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        (*h_codes)[i] = (uint8_t)(rs >> 24);
    }
    for (size_t i = 0; i < ns; i++) {
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        (*h_sc)[i] = (uint8_t)(lo + (int)((rs >> 20) % (uint64_t)span));
    }
    *d_codes = dev_alloc(nc), *d_sc = dev_alloc(ns);
    up(*d_codes, *h_codes, nc), up(*d_sc, *h_sc, ns);
    ck_assert_msg(dsv4_opt_fp4_repack(*d_codes, nc, NULL) == 0, "%s", dsv4_last_error());
}

START_TEST(test_fp4_dequant_bitwise)
{
    enum { R = 37, COLS = 96 }; /* three scale blocks per row, an odd row count */
    rs = 777;
    uint8_t *hc, *hs, *dc, *ds;
    fp4_random(1, R, COLS, 100, 50, &hc, &hs, &dc, &ds); /* 2^-27 .. 2^22: normal in bf16 */
    hc[0] = 0x98, hs[0] = 127; /* column 0: code 8 (-0), column 1: code 9 (-0.5), scale 1 */
    up(dc, hc, 4), up(ds, hs, 1);
    ck_assert(dsv4_opt_fp4_repack(dc, 4, NULL) == 0); /* the first word again (plain), with the planted byte */
    uint16_t *d = dev_alloc((size_t)R * COLS * 2);
    ck_assert_msg(dsv4_opt_fp4_dequant(dc, ds, R, COLS, d, NULL) == 0, "%s", dsv4_last_error());
    uint16_t *got = down(d, (size_t)R * COLS * 2);
    int bad = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < COLS; c++) {
            const uint8_t byte = hc[(size_t)r * COLS / 2 + c / 2];
            const float v = ldexpf(e2m1(c & 1 ? byte >> 4 : byte & 15), hs[(size_t)r * COLS / 32 + c / 32] - 127);
            const uint16_t want = bf(v), g = got[(size_t)r * COLS + c];
            if (want != g && bad++ < 5)
                printf("fp4 dequant: row %d column %d: 0x%04x, want 0x%04x (%g)\n", r, c, g, want, v);
        }
    ck_assert_msg(got[0] == 0x8000 && got[1] == 0xbf00, "-0 and -0.5 of the planted byte: 0x%04x 0x%04x", got[0],
                  got[1]);
    ck_assert_msg(bad == 0, "fp4 dequant: %d of %d values differ from e2m1 x 2^(b-127)", bad, R * COLS);
    free(hc), free(hs), free(got);
    cudaFree(dc), cudaFree(ds), cudaFree(d);
}
END_TEST

/* Test lanes for dsv4_opt_moe_gemms: lane 0 on `main`, the others on their own streams, every handle with a
 * workspace of the same size (as opt_layout.c's lanes_init), FP4 slots when asked. */
enum { LANE_WS = 4 << 20 };
typedef struct test_lanes {
    dsv4_moe_lanes l;
    void *ws[DSV4_MOE_MAX_LANES];
} test_lanes;

static void lanes_make(test_lanes *t, int n, cudaStream_t main, size_t slot_elems)
{
    memset(t, 0, sizeof *t);
    dsv4_moe_lanes *l = &t->l;
    l->n = n;
    ck_assert(cudaEventCreateWithFlags(&l->fork, cudaEventDisableTiming) == cudaSuccess);
    for (int i = 0; i < n; i++) {
        if (i == 0) l->stream[0] = main;
        else ck_assert(cudaStreamCreateWithFlags(&l->stream[i], cudaStreamNonBlocking) == cudaSuccess);
        ck_assert(cudaEventCreateWithFlags(&l->join[i], cudaEventDisableTiming) == cudaSuccess);
        ck_assert(cublasCreate(&l->cublas[i]) == CUBLAS_STATUS_SUCCESS);
        ck_assert(cublasSetStream(l->cublas[i], l->stream[i]) == CUBLAS_STATUS_SUCCESS);
        t->ws[i] = dev_alloc(LANE_WS);
        ck_assert(cublasSetWorkspace(l->cublas[i], t->ws[i], LANE_WS) == CUBLAS_STATUS_SUCCESS);
        l->wdq[i] = slot_elems ? dev_alloc(slot_elems * 2) : NULL;
    }
    ck_assert(cudaDeviceSynchronize() == cudaSuccess); /* dev_alloc's memsets ran on the legacy stream */
}

static void lanes_free(test_lanes *t, int n)
{
    ck_assert(cudaDeviceSynchronize() == cudaSuccess);
    for (int i = 0; i < n; i++) {
        cublasDestroy(t->l.cublas[i]);
        cudaFree(t->ws[i]), cudaFree(t->l.wdq[i]);
        cudaEventDestroy(t->l.join[i]);
        if (i > 0) cudaStreamDestroy(t->l.stream[i]);
    }
    cudaEventDestroy(t->l.fork);
}

/* The grouped expert GEMMs as opt_step.c's experts_sorted runs them (sort, gather, dsv4_opt_moe_gemms up, SwiGLU,
 * down, combine), against the decode kernels: bf16 experts, or (fp4) FP4 experts dequantised one matrix at a time
 * into a lane's slot before each GEMM. On 1, 3 and 4 lanes (the first n of one set of 4): bitwise the same out
 * for each, with gu, y and out poisoned with NaN before each run. */
static void sorted_case(int e_begin, int e_end, int fp4)
{
    enum { T = 300, K = 3, E = 8, D = 64, I = 32, NL = 3 };
    static const int lane_counts[NL] = {1, 3, 4};
    const int held = e_end ? e_end - e_begin : E;
    uint16_t *hx = malloc((size_t)T * D * 2), *hw13 = malloc((size_t)held * 2 * I * D * 2);
    uint16_t *hw2 = malloc((size_t)held * D * I * 2);
    int32_t *hid = malloc((size_t)T * K * 4);
    float *hwt = malloc((size_t)T * K * 4), *hsh = malloc((size_t)T * D * 4);
    rs = 4242;
    for (int i = 0; i < T * D; i++) hx[i] = bf(urand());
    for (int i = 0; i < held * 2 * I * D; i++) hw13[i] = bf(urand() * 0.3f);
    for (int i = 0; i < held * D * I; i++) hw2[i] = bf(urand() * 0.3f);
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < K; j++) {
            int e;
            int dup;
            do {
                e = (int)((urand() + 1.0f) * 0.5f * E) % E;
                dup = 0;
                for (int i = 0; i < j; i++) dup |= hid[t * K + i] == e;
            } while (dup);
            hid[t * K + j] = e;
            hwt[t * K + j] = 0.2f + 0.5f * (urand() + 1.0f);
        }
        for (int c = 0; c < D; c++) hsh[t * D + c] = urand();
    }
    uint16_t *x = dev_alloc((size_t)T * D * 2), *w13 = dev_alloc((size_t)held * 2 * I * D * 2);
    uint16_t *w2 = dev_alloc((size_t)held * D * I * 2), *h = dev_alloc((size_t)T * K * I * 2);
    int32_t *ids = dev_alloc((size_t)T * K * 4);
    float *wt = dev_alloc((size_t)T * K * 4), *sh = dev_alloc((size_t)T * D * 4), *out0 = dev_alloc((size_t)T * D * 4);
    up(x, hx, (size_t)T * D * 2), up(w13, hw13, (size_t)held * 2 * I * D * 2), up(w2, hw2, (size_t)held * D * I * 2);
    up(ids, hid, (size_t)T * K * 4), up(wt, hwt, (size_t)T * K * 4), up(sh, hsh, (size_t)T * D * 4);
    dsv4_moe_experts_params ep = {.n_tok = T, .k = K, .dim = D, .inter = I, .limit = 2.0f, .x = x, .ids = ids,
                                  .weights = wt, .w13 = w13, .w2 = w2, .e_begin = e_begin, .e_end = e_end, .h = h,
                                  .shared = sh, .shared_stride = D, .out = out0};
    uint8_t *hq13 = NULL, *hs13 = NULL, *hq2 = NULL, *hs2 = NULL, *q13 = NULL, *s13 = NULL, *q2 = NULL, *s2 = NULL;
    dsv4_moe_gemm_weights gw = {.w13 = w13, .w2 = w2};
    if (!fp4) {
        ck_assert_msg(dsv4_opt_moe_experts(&ep) == 0, "%s", dsv4_last_error());
    } else { /* scales 2^-6 .. 2^-3: weights of about 0.3, like the bf16 case */
        fp4_random(held, 2 * I, D, 121, 4, &hq13, &hs13, &q13, &s13);
        fp4_random(held, D, I, 121, 4, &hq2, &hs2, &q2, &s2);
        gw = (dsv4_moe_gemm_weights){.q13 = q13, .s13 = s13, .q2 = q2, .s2 = s2};
        dsv4_fp4_experts_params fp = {.n_tok = T, .k = K, .dim = D, .inter = I, .limit = 2.0f, .x = x, .ids = ids,
                                      .weights = wt, .w13 = q13, .s13 = s13, .w2 = q2, .s2 = s2,
                                      .e_begin = e_begin, .e_end = e_end, .h = h, .shared = sh,
                                      .shared_stride = D, .out = out0};
        ck_assert_msg(dsv4_opt_fp4_experts(&fp) == 0, "%s", dsv4_last_error());
    }
    cudaStream_t main; /* blocking: ordered after the legacy stream's uploads and memsets */
    ck_assert(cudaStreamCreate(&main) == cudaSuccess);
    dsv4_moe_sorted_params mp = {.n_tok = T, .k = K, .dim = D, .inter = I, .n_experts = E, .e_begin = e_begin,
                                 .e_end = e_end, .limit = 2.0f, .x = x, .ids = ids, .weights = wt,
                                 .shared = sh, .shared_stride = D, .stream = main};
    mp.count = dev_alloc((E + 1) * 4), mp.offset = dev_alloc((E + 1) * 4);
    mp.perm = dev_alloc((size_t)T * K * 4), mp.slot = dev_alloc((size_t)T * K * 4);
    mp.xs = dev_alloc((size_t)T * K * D * 2), mp.h = dev_alloc((size_t)T * K * I * 2);
    float *gu = dev_alloc((size_t)T * K * 2 * I * 4), *y = dev_alloc((size_t)T * K * D * 4);
    mp.gu = gu, mp.y = y, mp.out = dev_alloc((size_t)T * D * 4);
    ck_assert_msg(dsv4_opt_moe_sort(&mp) == 0, "%s", dsv4_last_error());
    int32_t *off = down(mp.offset, (E + 1) * 4);
    ck_assert_msg(dsv4_opt_moe_gather(&mp, off[held]) == 0, "%s", dsv4_last_error());
    test_lanes tl;
    dsv4_moe_lanes *lanes = &tl.l;
    lanes_make(&tl, 4, main, fp4 ? (size_t)2 * I * D : 0);
    float *a = down(out0, (size_t)T * D * 4), *b[NL];
    for (int r = 0; r < NL; r++) {
        ck_assert(cudaMemsetAsync(gu, 0xff, (size_t)T * K * 2 * I * 4, main) == cudaSuccess);
        ck_assert(cudaMemsetAsync(y, 0xff, (size_t)T * K * D * 4, main) == cudaSuccess);
        ck_assert(cudaMemsetAsync(mp.out, 0xff, (size_t)T * D * 4, main) == cudaSuccess);
        lanes->n = lane_counts[r];
        ck_assert_msg(dsv4_opt_moe_gemms(&mp, &gw, lanes, off, 1) == 0, "%s", dsv4_last_error());
        ck_assert_msg(dsv4_opt_moe_swiglu_sorted(&mp, off[held]) == 0, "%s", dsv4_last_error());
        ck_assert_msg(dsv4_opt_moe_gemms(&mp, &gw, lanes, off, 0) == 0, "%s", dsv4_last_error());
        ck_assert_msg(dsv4_opt_moe_combine(&mp) == 0, "%s", dsv4_last_error());
        b[r] = down(mp.out, (size_t)T * D * 4);
    }
    double num = 0, den = 0, mx = 0;
    int worst = 0;
    for (int i = 0; i < T * D; i++) {
        const double d = (double)a[i] - b[0][i];
        num += d * d, den += (double)a[i] * a[i];
        if (fabs(d) > mx) mx = fabs(d), worst = i;
    }
    const double rel = sqrt(num / den);
    int diff[NL] = {0};
    for (int r = 1; r < NL; r++)
        for (int i = 0; i < T * D; i++) diff[r] += memcmp(&b[r][i], &b[0][i], 4) != 0;
    printf("sorted experts (%s, held %d..%d of %d): rel-L2 %.2e from the decode kernels, max|d| %.2e at token %d "
           "channel %d (%g vs %g); on 3 and 4 lanes %d and %d of %d values differ from 1 lane\n",
           fp4 ? "FP4" : "bf16", e_begin, e_end ? e_end : E, E, rel, mx, worst / D, worst % D, a[worst], b[0][worst],
           diff[1], diff[2], T * D);
    ck_assert_msg(den > 0 && rel < 5e-3, "grouped expert GEMMs (%s) differ from the decode kernels: rel-L2 %.2e",
                  fp4 ? "FP4" : "bf16", rel);
    for (int r = 1; r < NL; r++)
        ck_assert_msg(diff[r] == 0, "grouped expert GEMMs (%s, held %d..%d): %d values on %d lanes differ from 1 lane "
                      "(the lanes must not change a bit)", fp4 ? "FP4" : "bf16", e_begin, e_end ? e_end : E, diff[r],
                      lane_counts[r]);
    lanes_free(&tl, 4);
    free(hq13), free(hs13), free(hq2), free(hs2);
    cudaFree(q13), cudaFree(s13), cudaFree(q2), cudaFree(s2);
    for (int r = 0; r < NL; r++) free(b[r]);
    free(a), free(off), free(hx), free(hw13), free(hw2), free(hid), free(hwt), free(hsh);
    cudaFree(x), cudaFree(w13), cudaFree(w2), cudaFree(h), cudaFree(ids), cudaFree(wt), cudaFree(sh), cudaFree(out0);
    cudaFree(mp.count), cudaFree(mp.offset), cudaFree(mp.perm), cudaFree(mp.slot), cudaFree(mp.xs), cudaFree(mp.h);
    cudaFree(gu), cudaFree(y), cudaFree(mp.out);
    cudaStreamDestroy(main);
}

START_TEST(test_sorted_experts)
{
    for (int fp4 = 0; fp4 < 2; fp4++) {
        sorted_case(0, 0, fp4);
        sorted_case(4, 8, fp4); /* expert parallel: the second half held, the other pairs add nothing */
        sorted_case(1, 6, fp4); /* an odd subset: 5 experts over 3 and 4 lanes */
    }
}
END_TEST

/* A bad lane set is refused with a message, before any launch: a lane 0 off the step's stream, too many lanes, an
 * FP4 lane without its slot. */
START_TEST(test_sorted_lanes_refused)
{
    enum { E = 4, D = 64, I = 32 };
    cudaStream_t main;
    ck_assert(cudaStreamCreate(&main) == cudaSuccess);
    int32_t off[E + 1] = {0, 10, 20, 30, 40};
    uint16_t *xs = dev_alloc((size_t)40 * D * 2), *w = dev_alloc((size_t)E * 2 * I * D * 2);
    float *gu = dev_alloc((size_t)40 * 2 * I * 4);
    uint8_t *q = dev_alloc((size_t)E * 2 * I * D), *sc = dev_alloc((size_t)E * 2 * I * D);
    dsv4_moe_sorted_params mp = {.n_tok = 20, .k = 2, .dim = D, .inter = I, .n_experts = E, .xs = xs, .gu = gu,
                                 .stream = main};
    dsv4_moe_gemm_weights bw = {.w13 = w, .w2 = w}, qw = {.q13 = q, .s13 = sc, .q2 = q, .s2 = sc};
    test_lanes tl;
    dsv4_moe_lanes *l = &tl.l;
    lanes_make(&tl, 2, main, 0);
    l->stream[0] = NULL; /* not the step's stream */
    ck_assert_int_eq(dsv4_opt_moe_gemms(&mp, &bw, l, off, 1), DSV4_ERR_USAGE);
    ck_assert(strstr(dsv4_last_error(), "lane 0") != NULL);
    l->stream[0] = main, l->n = DSV4_MOE_MAX_LANES + 1;
    ck_assert_int_eq(dsv4_opt_moe_gemms(&mp, &bw, l, off, 1), DSV4_ERR_USAGE);
    l->n = 2;
    ck_assert_int_eq(dsv4_opt_moe_gemms(&mp, &qw, l, off, 1), DSV4_ERR_USAGE); /* no FP4 slots */
    ck_assert(strstr(dsv4_last_error(), "FP4 slot") != NULL);
    ck_assert_int_eq(dsv4_opt_moe_gemms(&mp, &bw, l, off, 1), 0);
    lanes_free(&tl, 2);
    cudaFree(xs), cudaFree(w), cudaFree(gu), cudaFree(q), cudaFree(sc);
    cudaStreamDestroy(main);
}
END_TEST

/* ------------------------------------------------------------------------------------------- FP8 linears */
static void fp8_linear_case(int f32_scale)
{
    enum { NO = 200, NI = 272, S = 150 }; /* partial 128-blocks both ways */
    const int sr = (NO + 127) / 128, sc = (NI + 127) / 128;
    rs = 991 + (uint64_t)f32_scale;
    uint8_t *hw = malloc((size_t)NO * NI), *hs8 = malloc((size_t)sr * sc);
    float *hs32 = malloc((size_t)sr * sc * 4);
    uint16_t *hx = malloc((size_t)S * NI * 2);
    for (int i = 0; i < NO * NI; i++) {
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        uint8_t b = (uint8_t)(rs >> 24);
        hw[i] = (b & 0x7f) == 0x7f ? b ^ 1 : b; /* no NaN codes */
    }
    for (int i = 0; i < sr * sc; i++) {
        hs8[i] = (uint8_t)(118 + i % 7);
        hs32[i] = 0.01f + 0.003f * (float)i; /* not powers of two: the bf16 rounding of the product is tested */
    }
    for (int i = 0; i < S * NI; i++) hx[i] = bf(urand());
    uint8_t *w = dev_alloc((size_t)NO * NI);
    void *scale = dev_alloc((size_t)sr * sc * 4);
    uint16_t *wd = dev_alloc((size_t)NO * NI * 2), *x = dev_alloc((size_t)S * NI * 2);
    float *y0 = dev_alloc((size_t)S * NO * 4), *y1 = dev_alloc((size_t)S * NO * 4);
    up(w, hw, (size_t)NO * NI), up(x, hx, (size_t)S * NI * 2);
    up(scale, f32_scale ? (const void *)hs32 : (const void *)hs8, (size_t)sr * sc * (f32_scale ? 4 : 1));
    const dsv4_qscale kind = f32_scale ? DSV4_QSCALE_F32 : DSV4_QSCALE_E8M0;
    ck_assert_msg(dsv4_opt_fp8_dequant(w, scale, kind, NO, NI, wd, NULL) == 0, "%s", dsv4_last_error());
    uint16_t *got = down(wd, (size_t)NO * NI * 2);
    int bad = 0;
    for (int r = 0; r < NO; r++)
        for (int c = 0; c < NI; c++) {
            const int si = (r / 128) * sc + c / 128;
            const float s = f32_scale ? hs32[si] : ldexpf(1.0f, hs8[si] - 127);
            const uint16_t want = bf(dsv4_e4m3_to_f32(hw[(size_t)r * NI + c]) * s), g = got[(size_t)r * NI + c];
            if (want != g && bad++ < 5) printf("fp8 dequant: row %d column %d: 0x%04x, want 0x%04x\n", r, c, g, want);
        }
    ck_assert_msg(bad == 0, "fp8 dequant (%s scales): %d of %d values differ from e4m3 x scale", f32_scale ? "f32" :
                  "e8m0", bad, NO * NI);
    if (!f32_scale) { /* e8m0: the GEMM over the exact bf16 weights against the FP8 kernel */
        const size_t wsb = dsv4_opt_fp8_linear_workspace_bytes(S, NO, NI);
        void *ws = wsb ? dev_alloc(wsb) : NULL;
        dsv4_fp8_linear_params lp = {.n_tok = S, .n_out = NO, .n_in = NI, .x = x, .ldx = NI, .w = w, .scale = scale,
                                     .scale_kind = kind, .y = y0, .y_f32 = 1, .ldy = NO, .workspace = ws,
                                     .workspace_bytes = wsb};
        ck_assert_msg(dsv4_opt_fp8_linear(&lp) == 0, "%s", dsv4_last_error());
        cublasHandle_t cb;
        ck_assert(cublasCreate(&cb) == CUBLAS_STATUS_SUCCESS);
        const float one = 1.0f, zero = 0.0f;
        ck_assert(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, NO, S, NI, &one, wd, CUDA_R_16BF, NI, x, CUDA_R_16BF, NI,
                               &zero, y1, CUDA_R_32F, NO, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
                  CUBLAS_STATUS_SUCCESS);
        float *a = down(y0, (size_t)S * NO * 4), *b = down(y1, (size_t)S * NO * 4);
        double num = 0, den = 0;
        for (int i = 0; i < S * NO; i++) {
            const double dd = (double)a[i] - b[i];
            num += dd * dd, den += (double)a[i] * a[i];
        }
        const double rel = sqrt(num / (den > 0 ? den : 1));
        printf("fp8 linear %dx%d over %d rows: dequantised + cuBLAS vs the FP8 kernel: rel-L2 %.2e\n", NO, NI, S, rel);
        ck_assert_msg(den > 0 && rel < 1e-5, "dequantised FP8 GEMM differs from the FP8 kernel: rel-L2 %.2e", rel);
        cublasDestroy(cb);
        free(a), free(b);
        cudaFree(ws);
    }
    free(hw), free(hs8), free(hs32), free(hx), free(got);
    cudaFree(w), cudaFree(scale), cudaFree(wd), cudaFree(x), cudaFree(y0), cudaFree(y1);
}

START_TEST(test_fp8_linear_dequant)
{
    fp8_linear_case(0);
    fp8_linear_case(1);
}
END_TEST

/* One step of n random tokens on golden/tiny (fp8: quantised to fp8) on `lanes` expert lanes (naive: the decode
 * kernels instead of the prefill GEMMs): the last row's logits. */
static float *prefill_step(dsv4_model *m, const int32_t *tok, int n, int fp8, int naive, int lanes, long *allocs)
{
    const int V = dsv4_model_config(m)->vocab_size;
    dsv4_opt_options o;
    dsv4_opt_options_default(&o);
    o.max_context = n + 8, o.max_step_tokens = n, o.expert_lanes = lanes;
    o.weights = fp8 ? DSV4_OPT_WEIGHTS_FP8 : DSV4_OPT_WEIGHTS_BF16;
    o.quantize = fp8 ? DSV4_OPT_QUANTIZE_FP8 : DSV4_OPT_QUANTIZE_NONE;
    o.prefill_experts = naive ? DSV4_OPT_PREFILL_EXPERTS_DECODE : DSV4_OPT_PREFILL_EXPERTS_GROUPED;
    o.prefill_linears = naive ? DSV4_OPT_PREFILL_LINEARS_KERNEL : DSV4_OPT_PREFILL_LINEARS_GEMM;
    dsv4_opt *op = NULL;
    ck_assert_msg(dsv4_opt_init(m, &o, &op) == 0, "%s", dsv4_last_error());
    float *lg = malloc((size_t)V * 4);
    int32_t nt[1] = {n}, next[1];
    const long before = dsv4_opt_device_alloc_count();
    ck_assert_msg(dsv4_opt_step_ragged(op, tok, nt, NULL, lg, next) == 0, "%s", dsv4_last_error());
    *allocs = dsv4_opt_device_alloc_count() - before;
    dsv4_opt_free(op);
    return lg;
}

static float *fp8_step(dsv4_model *m, const int32_t *tok, int n, int naive, long *allocs)
{
    return prefill_step(m, tok, n, 1, naive, 4, allocs);
}

static void random_tokens(int32_t *tok, int n, int V)
{
    rs = 31337;
    for (int i = 0; i < n; i++) {
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        tok[i] = (int32_t)((rs >> 20) % (uint64_t)V);
    }
}

START_TEST(test_prefill_gemms_fp8)
{
    enum { N = 200 };
    dsv4_model *m = dsv4_test_open_golden("tiny");
    const int V = dsv4_model_config(m)->vocab_size;
    int32_t tok[N];
    random_tokens(tok, N, V);
    long al[3];
    float *g = fp8_step(m, tok, N, 0, &al[0]), *g2 = fp8_step(m, tok, N, 0, &al[1]);
    float *d = fp8_step(m, tok, N, 1, &al[2]);
    ck_assert_msg(al[0] == 0 && al[1] == 0 && al[2] == 0, "the steps made %ld, %ld, %ld device allocations", al[0],
                  al[1], al[2]);
    ck_assert_msg(memcmp(g, g2, (size_t)V * 4) == 0, "the same fp8 prefill step twice: logits differ");
    double num = 0, den = 0;
    int ag = 0, ad = 0;
    for (int v = 0; v < V; v++) {
        num += ((double)g[v] - d[v]) * ((double)g[v] - d[v]), den += (double)d[v] * d[v];
        if (g[v] > g[ag]) ag = v;
        if (d[v] > d[ad]) ad = v;
    }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    printf("fp8 prefill step of %d tokens: prefill GEMMs vs the decode kernels: logits rel-L2 %.3e, argmax %d vs %d\n",
           N, rel, ag, ad);
    ck_assert_msg(den > 0 && rel < 5e-2, "fp8 prefill GEMMs: logits rel-L2 %.3e from the decode kernels' step", rel);
    free(g), free(g2), free(d);
    dsv4_model_free(m);
}
END_TEST

/* The expert lanes in the model's step: a 200-token step of golden/tiny (8 experts, 3 per token: about 75 rows per
 * expert) with bf16 and with fp8 weights on 1, 2, 4 and 8 lanes (8: one expert per lane): bitwise the same logits,
 * no allocation in the step. */
START_TEST(test_expert_lanes_step)
{
    enum { N = 200 };
    static const int counts[] = {1, 2, 4, 8};
    dsv4_model *m = dsv4_test_open_golden("tiny");
    const int V = dsv4_model_config(m)->vocab_size;
    int32_t tok[N];
    random_tokens(tok, N, V);
    for (int fp8 = 0; fp8 < 2; fp8++) {
        long al = 0;
        float *one = prefill_step(m, tok, N, fp8, 0, 1, &al);
        ck_assert_msg(al == 0, "%s step on 1 lane: %ld device allocations", fp8 ? "fp8" : "bf16", al);
        for (size_t c = 1; c < sizeof counts / sizeof counts[0]; c++) {
            float *lg = prefill_step(m, tok, N, fp8, 0, counts[c], &al);
            int diff = 0;
            for (int v = 0; v < V; v++) diff += memcmp(&lg[v], &one[v], 4) != 0;
            printf("expert lanes (%s weights, %d-token step of golden/tiny): %d lanes: %d of %d logits differ from "
                   "1 lane\n", fp8 ? "fp8" : "bf16", N, counts[c], diff, V);
            ck_assert_msg(al == 0, "%s step on %d lanes: %ld device allocations", fp8 ? "fp8" : "bf16", counts[c], al);
            ck_assert_msg(diff == 0, "%s step on %d lanes: %d logits differ from 1 lane (the lanes must not change a "
                          "bit)", fp8 ? "fp8" : "bf16", counts[c], diff);
            free(lg);
        }
        free(one);
    }
    dsv4_model_free(m);
}
END_TEST

/* ------------------------------------------------------------------------------------------- the step */
typedef struct sched_out {
    float *logits_last; /* sequence 0's logits after its last prompt token */
    int32_t picks[64];  /* sequence 0's greedy picks after each of its decode steps */
} sched_out;

/* golden/tiny's prompt (P tokens) for sequence 0 in chunks of `chunk`, while sequence 1 (started `lag` steps
 * later) prefills in chunks of 3 and then decodes: a mixed batch; then 4 decode steps for both. */
static void schedule(dsv4_model *m, const int32_t *tok, int P, int chunk, int budget, sched_out *out)
{
    const int V = dsv4_model_config(m)->vocab_size;
    dsv4_opt_options o;
    dsv4_opt_options_default(&o);
    o.n_seq = 2, o.max_context = P + 64, o.max_step_tokens = budget;
    dsv4_opt *op = NULL;
    ck_assert_msg(dsv4_opt_init(m, &o, &op) == 0, "%s", dsv4_last_error());
    float *lg = malloc((size_t)V * 4);
    out->logits_last = malloc((size_t)V * 4);
    const long before = dsv4_opt_device_alloc_count();
    int pos[2] = {0, 0}, np = 0;
    int32_t next[2] = {0, 0}, last[2] = {0, 0};
    for (int s = 0; pos[0] < P + 4 || pos[1] < P + 4; s++) {
        int32_t n[2], in[64];
        int k = 0;
        for (int c = 0; c < 2; c++) {
            const int ch = c == 0 || chunk < 3 ? chunk : 3;
            n[c] = (c == 1 && s < 2) || pos[c] >= P + 4 ? 0 : pos[c] < P ? (P - pos[c] < ch ? P - pos[c] : ch) : 1;
            for (int j = 0; j < n[c]; j++) in[k++] = pos[c] + j < P ? tok[pos[c] + j] : last[c];
        }
        ck_assert_msg(dsv4_opt_step_ragged(op, in, n, NULL, lg, next) == 0, "step %d: %s", s, dsv4_last_error());
        for (int c = 0; c < 2; c++) {
            if (n[c] > 0) last[c] = next[c];
            pos[c] += n[c];
        }
        if (n[0] > 0 && pos[0] == P) memcpy(out->logits_last, lg, (size_t)V * 4);
        if (n[0] > 0 && pos[0] > P && np < 64) out->picks[np++] = next[0];
    }
    ck_assert_msg(dsv4_opt_device_alloc_count() == before, "the steps made %ld device allocations",
                  dsv4_opt_device_alloc_count() - before);
    ck_assert_int_eq(dsv4_opt_position(op, 0), P + 4);
    /* refusals: past the budget, past max_context; nothing done */
    int32_t n_big[2] = {budget + 1, 0}, n_ctx[2] = {64, 0}, zeros[64] = {0};
    int32_t *many = calloc((size_t)budget + 2, 4);
    ck_assert_int_eq(dsv4_opt_step_ragged(op, many, n_big, NULL, NULL, NULL), DSV4_ERR_USAGE);
    ck_assert(strstr(dsv4_last_error(), "budget") != NULL);
    ck_assert_int_eq(dsv4_opt_step_ragged(op, zeros, n_ctx, NULL, NULL, NULL), DSV4_ERR_USAGE);
    ck_assert(strstr(dsv4_last_error(), "max_context") != NULL);
    ck_assert_int_eq(dsv4_opt_position(op, 0), P + 4);
    free(many);
    free(lg);
    dsv4_opt_free(op);
}

START_TEST(test_ragged_steps)
{
    int T;
    int32_t *tok = dsv4_test_golden_tokens("tiny", &T);
    dsv4_model *m = dsv4_test_open_golden("tiny");
    const int V = dsv4_model_config(m)->vocab_size, P = 21; /* golden/tiny's prompt: off both ratios */
    sched_out a, b, one;
    schedule(m, tok, P, 7, 32, &a);
    schedule(m, tok, P, 7, 32, &b);
    ck_assert_msg(memcmp(a.logits_last, b.logits_last, (size_t)V * 4) == 0,
                  "the same chunked, mixed schedule twice: logits differ (not deterministic)");
    ck_assert_msg(memcmp(a.picks, b.picks, 4 * sizeof a.picks[0]) == 0, "the same schedule twice: picks differ");
    schedule(m, tok, P, 1, 2, &one); /* one-token steps of the same path (sequence 1 in runs of 1 too) */
    double num = 0, den = 0, mx = 0;
    int am = 0, ao = 0;
    for (int v = 0; v < V; v++) {
        const double d = (double)a.logits_last[v] - one.logits_last[v];
        num += d * d, den += (double)one.logits_last[v] * one.logits_last[v];
        if (fabs(d) > mx) mx = fabs(d);
        if (a.logits_last[v] > a.logits_last[am]) am = v;
        if (one.logits_last[v] > one.logits_last[ao]) ao = v;
    }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    printf("ragged (chunks of 7, mixed with a second sequence) vs one-token steps, last prompt position: logits "
           "rel-L2 %.3e, max|d| %.3e, argmax %d vs %d\n", rel, mx, am, ao);
    ck_assert_msg(rel < 5e-2, "chunked prefill's logits rel-L2 %.3e from one-token steps (> 5e-2: a bug, not bf16 "
                  "rounding)", rel);
    free(a.logits_last), free(b.logits_last), free(one.logits_last);
    dsv4_model_free(m);
    free(tok);
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("opt_prefill");
    const TTest *const tests[] = {test_compressor_runs_bitwise, test_window_runs_bitwise, test_fp4_dequant_bitwise,
                                 test_sorted_experts, test_sorted_lanes_refused, test_fp8_linear_dequant,
                                 test_prefill_gemms_fp8, test_expert_lanes_step, test_ragged_steps};
    dsv4_test_add_each(s, 600, tests, (int)(sizeof tests / sizeof tests[0]));
    return dsv4_test_main(s);
}
