/* compressor.cu - decode update of the KV compressors (model-spec §7), one block per sequence.
 *
 * Quiet traps (as reference/ref_compressor.c):
 * - The window closes AT the token with (p+1) mod r == 0, inside that token's step: its query sees entry p div r.
 * - ape is indexed by the slot inside the window (p mod r) and added to the gate only.
 * - CSA: slot i < r reads channel ch of state row i (a-half), slot i >= r reads channel d_c + ch (b-half); after
 *   pooling the current rows (r..2r-1, both halves) move to rows 0..r-1. HCA: r rows, channel ch.
 * - The entry is RMSNorm'd, then rope'd at r·w, the FIRST source position of its window.
 * The state row of this token is written by the same block that pools it: a __syncthreads orders the global
 * writes before the reads (no other block touches this sequence's state).
 */
#include <math.h>

#include "compressor.cuh"
#include "kv_layout.h"
#include "opt_common.cuh"

enum { CMP_THREADS = 256, CMP_MAX_DC = 1024 };

__global__ void __launch_bounds__(CMP_THREADS) compressor_kernel(dsv4_compressor_params p)
{
    __shared__ float e[CMP_MAX_DC];
    const int c = blockIdx.x;
    if (!p.active[c]) return;
    const int r = p.ratio, dc = p.d_c, W = (p.overlap ? 2 : 1) * dc, rows = (p.overlap ? 2 : 1) * r;
    const int64_t pos = p.pos[c];
    const int slot = (int)(pos % r), row = p.overlap ? r + slot : slot;
    float *skv = p.state_kv + (size_t)c * rows * W, *ssc = p.state_score + (size_t)c * rows * W;
    const float *pr = p.proj + (size_t)c * p.proj_stride;
    for (int i = threadIdx.x; i < W; i += CMP_THREADS) {
        skv[(size_t)row * W + i] = pr[p.kv_off + i];
        ssc[(size_t)row * W + i] = pr[p.gate_off + i] + p.ape[(size_t)slot * W + i];
    }
    if ((pos + 1) % r != 0) return;
    __syncthreads();
    const int n_slots = rows;
    for (int ch = threadIdx.x; ch < dc; ch += CMP_THREADS) {
        float mx = -INFINITY;
        for (int i = 0; i < n_slots; i++) {
            int col = (p.overlap && i >= r) ? dc + ch : ch;
            mx = fmaxf(mx, ssc[(size_t)i * W + col]);
        }
        float sum = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            int col = (p.overlap && i >= r) ? dc + ch : ch;
            sum += expf(ssc[(size_t)i * W + col] - mx);
        }
        float acc = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            int col = (p.overlap && i >= r) ? dc + ch : ch;
            acc += skv[(size_t)i * W + col] * (expf(ssc[(size_t)i * W + col] - mx) / sum);
        }
        e[ch] = acc;
    }
    __syncthreads();
    if (p.overlap)
        for (int i = threadIdx.x; i < r * W; i += CMP_THREADS) {
            skv[i] = skv[(size_t)r * W + i];
            ssc[i] = ssc[(size_t)r * W + i];
        }
    float ss = 0.0f;
    for (int ch = threadIdx.x; ch < dc; ch += CMP_THREADS) ss += e[ch] * e[ch];
    const float rr = 1.0f / sqrtf(dsv4_block_sum(ss) / (float)dc + p.eps);
    for (int ch = threadIdx.x; ch < dc; ch += CMP_THREADS) e[ch] = p.norm_w[ch] * (e[ch] * rr);
    __syncthreads();
    const int64_t w = pos / r;
    const int np = p.rope_pairs, r0 = dc - 2 * np;
    for (int i = threadIdx.x; i < np; i += CMP_THREADS) {
        float cs, sn;
        dsv4_rope_cos_sin(p.inv_freq[i], w * r, &cs, &sn);
        float x0 = e[r0 + 2 * i], x1 = e[r0 + 2 * i + 1];
        e[r0 + 2 * i] = x0 * cs + (-x1) * sn;
        e[r0 + 2 * i + 1] = x1 * cs + x0 * sn;
    }
    __syncthreads();
    uint8_t *dst8 = p.pool8 && w < p.pool_cap
                        ? p.pool8 + (size_t)c * p.pool8_seq_stride +
                              (size_t)(p.pool_row0 + w) * dsv4_kv8_entry_bytes(dc, 2 * np)
                        : NULL;
    if (p.fp8_nope)
        dsv4_fp8_nope_sim_smem(e, r0, dst8 ? dst8 + dsv4_kv8_codes_at(2 * np) : NULL,
                               dst8 ? dst8 + dsv4_kv8_scales_at(dc, 2 * np) : NULL);
    if (w >= p.pool_cap) return;
    if (dst8) { /* the codes and scales are written: the rope part is left */
        for (int i = threadIdx.x; i < 2 * np; i += CMP_THREADS)
            reinterpret_cast<uint16_t *>(dst8)[i] = dsv4_f32_to_bf16_bits(e[r0 + i]);
        return;
    }
    uint16_t *dst = p.pool + (size_t)c * p.pool_seq_stride + (size_t)(p.pool_row0 + w) * dc;
    for (int ch = threadIdx.x; ch < dc; ch += CMP_THREADS) dst[ch] = dsv4_f32_to_bf16_bits(e[ch]);
}

int dsv4_opt_compressor_update(const dsv4_compressor_params *p)
{
    DSV4_CHECK(p != NULL, "compressor: params is NULL");
    DSV4_CHECK(p->n_seq >= 1 && p->ratio >= 1, "compressor: n_seq %d, ratio %d", p->n_seq, p->ratio);
    if (p->d_c < 1 || p->d_c > CMP_MAX_DC)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "compressor: d_c %d unsupported (1..%d)", p->d_c, CMP_MAX_DC);
    DSV4_CHECK(p->rope_pairs >= 0 && 2 * p->rope_pairs <= p->d_c, "compressor: %d rope pairs for d_c %d",
               p->rope_pairs, p->d_c);
    DSV4_CHECK(!p->fp8_nope || p->d_c - 2 * p->rope_pairs <= 4096, "compressor: fp8 nope width > 4096");
    DSV4_CHECK(p->pos && p->active && p->proj && p->ape && p->norm_w && p->state_kv && p->state_score &&
                   (p->pool != NULL) != (p->pool8 != NULL),
               "compressor: pos, active, proj, ape, norm_w, state must be non-NULL, and one of pool, pool8");
    DSV4_CHECK(!p->pool8 || (p->fp8_nope && dsv4_kv8_shape_ok(p->d_c, 2 * p->rope_pairs) &&
                             p->pool8_seq_stride % 16 == 0),
               "compressor: the fp8 pool (pool8) needs fp8_nope, a layout of kernels/kv_layout.h for d_c %d with %d "
               "rope pairs and a 16-byte sequence stride", p->d_c, p->rope_pairs);
    DSV4_CHECK(p->rope_pairs == 0 || p->inv_freq, "compressor: inv_freq is NULL");
    compressor_kernel<<<p->n_seq, CMP_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("compressor_kernel");
    return 0;
}
