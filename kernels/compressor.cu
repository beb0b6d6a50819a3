/* compressor.cu - the KV compressors' update (model-spec §7): one token per sequence (decode, one block per
 * sequence), or runs of tokens per sequence (prefill chunks, compressor_plan.h: the same bits as one-token steps).
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
#include "compressor_plan.h"
#include "kv_layout.h"
#include "opt_common.cuh"

enum { CMP_THREADS = 256, CMP_MAX_DC = 1024, CMP_MAX_ROWS_MOVED = 16 /* CSA ratio a run supports */ };

/* Pool entry w = pos div r of sequence c from its 2r (CSA) or r (HCA) slots, src(i, col, &kv, &score) giving
 * slot i's values, then RMSNorm, RoPE at r·w, the FP8 simulation and the store (model-spec §7.3-§7.5). One block;
 * the order of every sum is fixed, so a run and one-token steps pool the same values to the same bits. `after`
 * runs between the pooling and the norm (the one-token step moves CSA's rows there). */
template <class Src, class After>
static __device__ void cmp_close(const dsv4_compressor_params &p, int c, int64_t pos, float *e, Src src, After after)
{
    const int r = p.ratio, dc = p.d_c, n_slots = (p.overlap ? 2 : 1) * r;
    for (int ch = threadIdx.x; ch < dc; ch += CMP_THREADS) {
        float mx = -INFINITY, kv, sc;
        for (int i = 0; i < n_slots; i++) {
            src(i, (p.overlap && i >= r) ? dc + ch : ch, &kv, &sc);
            mx = fmaxf(mx, sc);
        }
        float sum = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            src(i, (p.overlap && i >= r) ? dc + ch : ch, &kv, &sc);
            sum += expf(sc - mx);
        }
        float acc = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            src(i, (p.overlap && i >= r) ? dc + ch : ch, &kv, &sc);
            acc += kv * (expf(sc - mx) / sum);
        }
        e[ch] = acc;
    }
    __syncthreads();
    after();
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

/* One token per sequence (decode): block c writes its state row, and when the window closes pools the state. */
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
    cmp_close(
        p, c, pos, e,
        [&](int i, int col, float *kv, float *sc) {
            *kv = skv[(size_t)i * W + col];
            *sc = ssc[(size_t)i * W + col];
        },
        [&]() {
            if (p.overlap)
                for (int i = threadIdx.x; i < r * W; i += CMP_THREADS) {
                    skv[i] = skv[(size_t)r * W + i];
                    ssc[i] = ssc[(size_t)r * W + i];
                }
        });
}

/* Runs, part 1: block c pools the entry that row c closes (if it does) from the run's rows and the state as it
 * was before the step (compressor_plan.h); the state is not written here. */
__global__ void __launch_bounds__(CMP_THREADS) compressor_run_entries(dsv4_compressor_params p)
{
    __shared__ float e[CMP_MAX_DC];
    const int c = blockIdx.x;
    const int64_t pos = p.pos[c];
    if (!p.active[c] || (pos + 1) % p.ratio != 0) return;
    const int r = p.ratio, W = (p.overlap ? 2 : 1) * p.d_c, rows = (p.overlap ? 2 : 1) * r, s = p.seq[c];
    const int64_t p0 = pos - p.run_off[c], w = pos / r;
    const float *skv = p.state_kv + (size_t)s * rows * W, *ssc = p.state_score + (size_t)s * rows * W;
    cmp_close(
        p, s, pos, e,
        [&](int i, int col, float *kv, float *sc) {
            const int64_t q = dsv4_cmp_slot_pos(w, i, r, p.overlap);
            if (q < 0) {
                *kv = 0.0f, *sc = -INFINITY; /* before position 0: what an empty state holds */
            } else if (q >= p0) {
                const float *pr = p.proj + (size_t)(c - (pos - q)) * p.proj_stride;
                *kv = pr[p.kv_off + col];
                *sc = pr[p.gate_off + col] + p.ape[(size_t)(q % r) * W + col];
            } else {
                const size_t o = (size_t)dsv4_cmp_state_row(q, p0, r, p.overlap) * W + col;
                *kv = skv[o];
                *sc = ssc[o];
            }
        },
        [] {});
}

/* Runs, part 2: the last row of each run rewrites its sequence's state to what one-token steps leave after p1
 * (dsv4_cmp_carry). One thread per column reads every old row it needs before it writes any. */
__global__ void __launch_bounds__(CMP_THREADS) compressor_run_carry(dsv4_compressor_params p)
{
    const int c = blockIdx.x;
    if (!p.active[c] || p.run_off[c] != p.run_len[c] - 1) return;
    const int r = p.ratio, W = (p.overlap ? 2 : 1) * p.d_c, rows = (p.overlap ? 2 : 1) * r, s = p.seq[c];
    const int64_t p1 = p.pos[c], p0 = p1 - p.run_off[c];
    float *skv = p.state_kv + (size_t)s * rows * W, *ssc = p.state_score + (size_t)s * rows * W;
    for (int col = threadIdx.x; col < W; col += CMP_THREADS) {
        float okv[CMP_MAX_ROWS_MOVED], osc[CMP_MAX_ROWS_MOVED]; /* CSA: the old current rows */
        if (p.overlap)
            for (int j = 0; j < r; j++) {
                okv[j] = skv[(size_t)(r + j) * W + col];
                osc[j] = ssc[(size_t)(r + j) * W + col];
            }
        for (int row = 0; row < rows; row++) {
            int64_t src = 0;
            const int how = dsv4_cmp_carry(p0, p1, r, p.overlap, row, &src);
            if (how == DSV4_CMP_KEEP) continue;
            float kv, sc;
            if (how == DSV4_CMP_FROM_RUN) {
                const float *pr = p.proj + (size_t)(c - (p1 - src)) * p.proj_stride;
                kv = pr[p.kv_off + col];
                sc = pr[p.gate_off + col] + p.ape[(size_t)(src % r) * W + col];
            } else {
                kv = okv[src - r];
                sc = osc[src - r];
            }
            skv[(size_t)row * W + col] = kv;
            ssc[(size_t)row * W + col] = sc;
        }
    }
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
    if (!p->seq) {
        compressor_kernel<<<p->n_seq, CMP_THREADS, 0, p->stream>>>(*p);
        DSV4_LAUNCH_CHECK("compressor_kernel");
        return 0;
    }
    DSV4_CHECK(p->run_off && p->run_len, "compressor: runs (seq) need run_off and run_len");
    if (p->overlap && p->ratio > CMP_MAX_ROWS_MOVED)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "compressor: runs of an overlapping ratio %d > %d", p->ratio,
                          (int)CMP_MAX_ROWS_MOVED);
    compressor_run_entries<<<p->n_seq, CMP_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("compressor_run_entries");
    compressor_run_carry<<<p->n_seq, CMP_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("compressor_run_carry");
    return 0;
}
