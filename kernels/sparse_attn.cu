/* sparse_attn.cu - sparse attention decode, model-spec §6 steps 6-7 and §9 (gather form); both variants of the
 * `attn` switch (design.md "The paths"). Launcher contract in sparse_attn.cuh.
 *
 * MMA variant, three parts (style rule 11):
 *   1. work split (host, attn_plan): tiles of ATTN_T = 32 entries; each block takes a run of tiles of one
 *      sequence for one group of up to 64 heads; the number of splits minimises waves x (tiles per split + a
 *      split's fixed work) for the device's SM count (sparse_attn_plan.h). The split depends only on the shapes
 *      and the device, never on timing.
 *   2. partial kernel (attn_mma_partial): Q of the head group in shared memory; KV tiles gathered by cp.async
 *      (double buffer); S = Q.K^T and O += P.V on mma.sync m16n8k16 bf16 with fp32 accumulators; online softmax
 *      with the running (max, sum) per head in shared memory. With one split it finalises directly. An fp8 cache
 *      (kv8) is gathered raw by cp.async (double buffer) and expanded into one bf16 tile before each tile's math.
 *   3. combine kernel (attn_combine): merges the splits' (max, sum, out) in split order 0..n-1, adds the sink to
 *      the denominator, applies the inverse RoPE and stores. No atomics anywhere: bitwise deterministic.
 *
 * Quiet traps:
 *  - P enters the P.V mma rounded to bf16; the running sum adds the ROUNDED p, so the output is an exact convex
 *    combination of the entries with the rounded weights (error ~2^-9 relative per weight, not a bias in the sum).
 *  - A row whose entries are all skipped has max -inf: alpha and p are forced to 1 and 0 (never exp(-inf+inf)),
 *    and the output is 0 (the sink alone takes the whole probability).
 *  - Slots < 0 or >= n_slots are skipped (zero-filled rows, score -inf); the kernels never read outside the buffer.
 *  - Inverse RoPE uses -sin: x' = x cos + y sin, y' = y cos - x sin on pairs (d - rope_dim + 2i, +1).
 */
#include <math.h>

#include "common.cuh"
#include "kv_layout.h"
#include "sparse_attn.cuh"
#include "sparse_attn_plan.h"

enum { ATTN_T = DSV4_ATTN_TILE, ATTN_WARPS = 8, ATTN_THREADS = ATTN_WARPS * 32, ATTN_MAX_D = 512 };
enum { ATTN_SIMT_THREADS = 128 };
enum { ATTN_S_PITCH = ATTN_T + 4, ATTN_P_PITCH = ATTN_T + 8, ATTN_SIMT_MAX_IDX = 16384 };

typedef struct attn_kparams {
    dsv4_sparse_attn_params p;
    int head_group; /* heads per block: 16 * MT */
    int n_tiles;    /* ceil(n_idx / ATTN_T) */
    int tiles_per_split;
    int n_split;
    float *ws_o;    /* [C, n_split, H, d] unnormalised partial outputs */
    float *ws_ml;   /* [C, n_split, H, 2] (running max, running sum) */
} attn_kparams;

/* ------------------------------------------------------------------------------------------------ shared tail */
/* Inverse RoPE of channel pair (col, col+1) of sequence c, then store. */
static __device__ __forceinline__ void attn_store_pair(const dsv4_sparse_attn_params &p, int c, int h, int col,
                                                       float x, float y)
{
    int rope_start = p.head_dim - p.rope_dim;
    if (col >= rope_start) {
        int i = (col - rope_start) >> 1;
        float cs = p.rope_cos[(size_t)c * (p.rope_dim / 2) + i], sn = p.rope_sin[(size_t)c * (p.rope_dim / 2) + i];
        float nx = x * cs + y * sn, ny = y * cs - x * sn;
        x = nx;
        y = ny;
    }
    size_t o = ((size_t)c * p.n_heads + h) * p.head_dim + col;
    if (p.out_dtype == DSV4_OUT_F32) {
        *reinterpret_cast<float2 *>(static_cast<float *>(p.out) + o) = make_float2(x, y);
    } else {
        *reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(p.out) + o) = dsv4_bf16_pack2(x, y);
    }
}

/* Scale turning an unnormalised accumulator of running max m and sum l into the sink-softmax output. */
static __device__ __forceinline__ float attn_final_factor(float m, float l, float sink)
{
    float mx = fmaxf(m, sink);
    float wm = (m == -INFINITY) ? 0.0f : expf(m - mx);
    return wm / (l * wm + expf(sink - mx));
}

/* ------------------------------------------------------------------------------------------------ MMA partial */
static __device__ __forceinline__ int attn_slot(const dsv4_sparse_attn_params &p, int c, int e)
{
    if (e >= p.n_idx) return -1;
    int s = p.idx[(size_t)c * p.n_idx + e];
    return (s >= 0 && s < p.n_slots + p.n_fresh) ? s : -1;
}

/* Where slot s (>= 0) of query row c lives: its sequence's buffer, or past n_slots the step's fresh rows. `eb`:
 * the bytes of one row (bf16: 2·d; fp8: the entry). */
static __device__ __forceinline__ const unsigned char *attn_row(const dsv4_sparse_attn_params &p, int c, int s,
                                                                 int64_t eb)
{
    if (s >= p.n_slots) return static_cast<const unsigned char *>(p.fresh) + (size_t)(s - p.n_slots) * eb;
    const int64_t seq = p.seq ? p.seq[c] : c;
    const int64_t esz = p.kv8 ? 1 : 2; /* kv_seq_stride counts elements of kv or bytes of kv8 */
    const unsigned char *base = p.kv8 ? p.kv8 : reinterpret_cast<const unsigned char *>(p.kv);
    return base + (size_t)(seq * p.kv_seq_stride * esz) + (size_t)s * eb;
}

/* Gather tile t (ATTN_T entries of sequence c) into kv_dst [ATTN_T][d+8] and its slots into idx_dst. */
static __device__ __forceinline__ void attn_issue_tile(const dsv4_sparse_attn_params &p, int c, int t,
                                                       uint16_t *kv_dst, int *idx_dst)
{
    const int d = p.head_dim, chunks = d / 8, pitch = d + 8;
    for (int i = threadIdx.x; i < ATTN_T * chunks; i += ATTN_THREADS) {
        int row = i / chunks, ch = i - row * chunks;
        int slot = attn_slot(p, c, t * ATTN_T + row);
        const uint16_t *src = reinterpret_cast<const uint16_t *>(attn_row(p, c, slot < 0 ? 0 : slot, 2 * d)) + ch * 8;
        dsv4_cp_async16(kv_dst + row * pitch + ch * 8, src, slot < 0 ? 0 : 16);
    }
    if (threadIdx.x < ATTN_T) idx_dst[threadIdx.x] = attn_slot(p, c, t * ATTN_T + threadIdx.x);
}

/* The fp8 form: the raw entries of tile t into raw_dst [ATTN_T][entry bytes] (zero-filled rows for skipped slots). */
static __device__ __forceinline__ void attn_issue_tile8(const dsv4_sparse_attn_params &p, int c, int t,
                                                        uint8_t *raw_dst, int *idx_dst)
{
    const int eb = (int)dsv4_kv8_entry_bytes(p.head_dim, p.rope_dim), chunks = eb / 16;
    for (int i = threadIdx.x; i < ATTN_T * chunks; i += ATTN_THREADS) {
        int row = i / chunks, ch = i - row * chunks;
        int slot = attn_slot(p, c, t * ATTN_T + row);
        dsv4_cp_async16(raw_dst + row * eb + ch * 16, attn_row(p, c, slot < 0 ? 0 : slot, eb) + ch * 16,
                        slot < 0 ? 0 : 16);
    }
    if (threadIdx.x < ATTN_T) idx_dst[threadIdx.x] = attn_slot(p, c, t * ATTN_T + threadIdx.x);
}

/* Expands a raw fp8 tile into the bf16 tile kv_dst [ATTN_T][d+8], 8 channels per item: nope codes times their
 * block's scale (exact in bf16), rope channels copied. A zero-filled row decodes to zeros. */
static __device__ __forceinline__ void attn_expand_tile8(const dsv4_sparse_attn_params &p, const uint8_t *raw,
                                                         uint16_t *kv_dst)
{
    const int d = p.head_dim, rope = p.rope_dim, nope = d - rope, pitch = d + 8, groups = d / 8;
    const int eb = (int)dsv4_kv8_entry_bytes(d, rope), codes = dsv4_kv8_codes_at(rope);
    const int scales = dsv4_kv8_scales_at(d, rope);
    for (int i = threadIdx.x; i < ATTN_T * groups; i += ATTN_THREADS) {
        const int row = i / groups, ch = (i - row * groups) * 8;
        const uint8_t *e = raw + row * eb;
        uint4 v;
        if (ch >= nope) {
            v = *reinterpret_cast<const uint4 *>(e + 2 * (ch - nope)); /* rope part: 16-byte aligned */
        } else {
            const uint2 c8 = *reinterpret_cast<const uint2 *>(e + codes + ch);
            const float sc = dsv4_kv8_scale(e[scales + ch / DSV4_KV8_BLOCK]);
            float2 f0 = dsv4_kv8_decode2((uint16_t)c8.x, sc), f1 = dsv4_kv8_decode2((uint16_t)(c8.x >> 16), sc);
            float2 f2 = dsv4_kv8_decode2((uint16_t)c8.y, sc), f3 = dsv4_kv8_decode2((uint16_t)(c8.y >> 16), sc);
            v = make_uint4(dsv4_bf16_pack2(f0.x, f0.y), dsv4_bf16_pack2(f1.x, f1.y), dsv4_bf16_pack2(f2.x, f2.y),
                           dsv4_bf16_pack2(f3.x, f3.y));
        }
        *reinterpret_cast<uint4 *>(kv_dst + row * pitch + ch) = v;
    }
}

template <int MT>
__global__ void __launch_bounds__(ATTN_THREADS, 1) attn_mma_partial(const __grid_constant__ attn_kparams kp)
{
    const dsv4_sparse_attn_params &p = kp.p;
    constexpr int HG = MT * 16;
    const int c = blockIdx.z, h0 = blockIdx.y * HG, split = blockIdx.x;
    const int hn = min(HG, p.n_heads - h0);
    const int d = p.head_dim, pitch = d + 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int t_begin = split * kp.tiles_per_split, t_end = min(kp.n_tiles, t_begin + kp.tiles_per_split);

    extern __shared__ __align__(16) unsigned char attn_smem[];
    uint16_t *q_s = reinterpret_cast<uint16_t *>(attn_smem);  /* [HG][d+8] bf16 */
    const bool fp8 = p.kv8 != nullptr;
    uint16_t *kv_s = q_s + HG * pitch;                         /* [2][ATTN_T][d+8] bf16 (fp8: [1][..]) */
    float *s_s = reinterpret_cast<float *>(kv_s + (fp8 ? 1 : 2) * ATTN_T * pitch); /* [2][HG][ATTN_S_PITCH] */
    uint16_t *p_s = reinterpret_cast<uint16_t *>(s_s + 2 * HG * ATTN_S_PITCH); /* [HG][ATTN_P_PITCH] bf16 */
    float *m_s = reinterpret_cast<float *>(p_s + HG * ATTN_P_PITCH); /* [HG] running max */
    float *l_s = m_s + HG;                                     /* [HG] running sum of rounded p */
    float *alpha_s = l_s + HG;                                 /* [HG] rescale of this tile */
    int *idx_s = reinterpret_cast<int *>(alpha_s + HG);        /* [2][ATTN_T] */
    uint8_t *raw_s = reinterpret_cast<uint8_t *>(idx_s + 2 * ATTN_T); /* fp8: [2][ATTN_T][entry bytes] */
    const int raw_tile = fp8 ? ATTN_T * (int)dsv4_kv8_entry_bytes(d, p.rope_dim) : 0;

    /* Q rows of the group; rows past the last head are zero so they never produce NaN. */
    const uint16_t *qg = p.q + ((size_t)c * p.n_heads + h0) * d;
    for (int i = threadIdx.x; i < HG * (d / 8); i += ATTN_THREADS) {
        int row = i / (d / 8), ch = i - row * (d / 8);
        bool ok = row < hn;
        dsv4_cp_async16(q_s + row * pitch + ch * 8, qg + (size_t)(ok ? row : 0) * d + ch * 8, ok ? 16 : 0);
    }
    if (fp8)
        attn_issue_tile8(p, c, t_begin, raw_s, idx_s);
    else
        attn_issue_tile(p, c, t_begin, kv_s, idx_s);
    dsv4_cp_async_commit();
    if (threadIdx.x < HG) {
        m_s[threadIdx.x] = -INFINITY;
        l_s[threadIdx.x] = 0.0f;
    }

    float acc[MT][8][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][j][e] = 0.0f;

    for (int t = t_begin; t < t_end; t++) {
        const int buf = (t - t_begin) & 1;
        const uint16_t *kt = kv_s + (fp8 ? 0 : buf) * ATTN_T * pitch;
        dsv4_cp_async_wait<0>();
        __syncthreads(); /* tile t visible; every warp is done with tile t-1 (and, fp8, with the bf16 tile) */
        if (fp8) {
            attn_expand_tile8(p, raw_s + buf * raw_tile, kv_s);
            if (t + 1 < t_end) attn_issue_tile8(p, c, t + 1, raw_s + (buf ^ 1) * raw_tile, idx_s + (buf ^ 1) * ATTN_T);
        } else if (t + 1 < t_end) {
            attn_issue_tile(p, c, t + 1, kv_s + (buf ^ 1) * ATTN_T * pitch, idx_s + (buf ^ 1) * ATTN_T);
        }
        dsv4_cp_async_commit();
        if (fp8) __syncthreads(); /* the expanded tile visible */

        /* S = Q.K^T: warp w < 2*MT owns m-tile w/2, all ATTN_T entries, and the k-steps ks = w%2 (mod 2); the two
         * halves go to separate buffers and are added (in a fixed order) by the softmax. Each Q element is read
         * from shared memory once per tile, each K element MT times. */
        if (warp < 2 * MT) {
            const int mi = warp >> 1, kh = warp & 1;
            float s[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            const uint16_t *qa = q_s + (mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + (lane >> 4) * 8;
            const uint16_t *kb = kt + (((lane >> 4) << 3) + (lane & 7)) * pitch + ((lane >> 3) & 1) * 8;
#pragma unroll 2
            for (int ks = kh; ks < d / 16; ks += 2) {
                uint32_t a[4], b0[4], b1[4];
                dsv4_ldmatrix_x4(a, qa + ks * 16);
                dsv4_ldmatrix_x4(b0, kb + ks * 16);
                dsv4_ldmatrix_x4(b1, kb + 16 * pitch + ks * 16);
                dsv4_mma_bf16_16816(s[0], a, b0);
                dsv4_mma_bf16_16816(s[1], a, b0 + 2);
                dsv4_mma_bf16_16816(s[2], a, b1);
                dsv4_mma_bf16_16816(s[3], a, b1 + 2);
            }
            float *sh = s_s + kh * HG * ATTN_S_PITCH;
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                float *r0 = sh + (mi * 16 + g) * ATTN_S_PITCH + nt * 8 + 2 * tq, *r1 = r0 + 8 * ATTN_S_PITCH;
                *reinterpret_cast<float2 *>(r0) = make_float2(s[nt][0], s[nt][1]);
                *reinterpret_cast<float2 *>(r1) = make_float2(s[nt][2], s[nt][3]);
            }
        }
        __syncthreads();

        /* Online softmax: warp w takes rows w, w+8, ... (RPW of them, interleaved for latency); lane = entry. */
        {
            constexpr int RPW = HG / ATTN_WARPS;
            const bool valid = idx_s[buf * ATTN_T + lane] >= 0;
            float sv[RPW], mx[RPW];
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                const int r = warp + ATTN_WARPS * i;
                float v = s_s[r * ATTN_S_PITCH + lane] + s_s[(HG + r) * ATTN_S_PITCH + lane];
                sv[i] = valid ? v * p.scale : -INFINITY;
                mx[i] = sv[i];
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int i = 0; i < RPW; i++) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], o));
            float pv[RPW], al[RPW], mn[RPW];
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                const float m_old = m_s[warp + ATTN_WARPS * i];
                mn[i] = fmaxf(m_old, mx[i]);
                pv[i] = 0.0f;
                al[i] = 1.0f;
                if (mn[i] != -INFINITY) {
                    pv[i] = dsv4_bf16_round(expf(sv[i] - mn[i])); /* exp(-inf) = 0 for skipped entries */
                    al[i] = expf(m_old - mn[i]);
                }
                p_s[(warp + ATTN_WARPS * i) * ATTN_P_PITCH + lane] = __bfloat16_as_ushort(__float2bfloat16_rn(pv[i]));
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int i = 0; i < RPW; i++) pv[i] += __shfl_xor_sync(0xffffffffu, pv[i], o);
            __syncwarp();
            if (lane == 0) {
#pragma unroll
                for (int i = 0; i < RPW; i++) {
                    const int r = warp + ATTN_WARPS * i;
                    m_s[r] = mn[i];
                    l_s[r] = l_s[r] * al[i] + pv[i];
                    alpha_s[r] = al[i];
                }
            }
        }
        __syncthreads();

        /* O = O*alpha + P.V: warp w owns the n8 column tiles w, w+8, ... of d. */
        uint32_t pa[MT][2][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
            float a0 = alpha_s[mi * 16 + g], a1 = alpha_s[mi * 16 + g + 8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                acc[mi][j][0] *= a0;
                acc[mi][j][1] *= a0;
                acc[mi][j][2] *= a1;
                acc[mi][j][3] *= a1;
            }
            const uint16_t *pr = p_s + (mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ATTN_P_PITCH + (lane >> 4) * 8;
            dsv4_ldmatrix_x4(pa[mi][0], pr);
            dsv4_ldmatrix_x4(pa[mi][1], pr + 16);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int nt = warp + ATTN_WARPS * j;
            if (nt * 8 < d) {
                uint32_t b[4];
                dsv4_ldmatrix_x4_trans(b, kt + lane * pitch + nt * 8);
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    dsv4_mma_bf16_16816(acc[mi][j], pa[mi][0], b);
                    dsv4_mma_bf16_16816(acc[mi][j], pa[mi][1], b + 2);
                }
            }
        }
    }
    /* m_s / l_s were last written before the final barrier of the loop: visible here. */

#pragma unroll
    for (int mi = 0; mi < MT; mi++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = mi * 16 + g + half * 8;
            if (r >= hn) continue;
            const int h = h0 + r;
            const float m = m_s[r], l = l_s[r];
            if (kp.n_split == 1) {
                const float f = attn_final_factor(m, l, p.sink[h]);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int nt = warp + ATTN_WARPS * j;
                    if (nt * 8 < d)
                        attn_store_pair(p, c, h, nt * 8 + 2 * tq, acc[mi][j][2 * half] * f,
                                        acc[mi][j][2 * half + 1] * f);
                }
            } else {
                const size_t row = ((size_t)c * kp.n_split + split) * p.n_heads + h;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int nt = warp + ATTN_WARPS * j;
                    if (nt * 8 < d)
                        *reinterpret_cast<float2 *>(kp.ws_o + row * d + nt * 8 + 2 * tq) =
                            make_float2(acc[mi][j][2 * half], acc[mi][j][2 * half + 1]);
                }
                if (warp == 0 && tq == 0) *reinterpret_cast<float2 *>(kp.ws_ml + row * 2) = make_float2(m, l);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------ combine */
/* One block per (head, sequence): merges the splits in order 0..n_split-1. The split weights are computed once
 * (thread 0, serially, fixed order) into shared memory; each thread then merges 4 channels. */
__global__ void __launch_bounds__(128) attn_combine(const __grid_constant__ attn_kparams kp)
{
    const dsv4_sparse_attn_params &p = kp.p;
    const int h = blockIdx.x, c = blockIdx.y, d = p.head_dim, ns = kp.n_split;
    const size_t row0 = (size_t)c * ns * p.n_heads + h; /* split s at row0 + s*H */
    extern __shared__ float comb_smem[];
    float *w_s = comb_smem;      /* [ns] running max, then weight e^{m_s - M} / denominator */
    float *l_s = comb_smem + ns; /* [ns] */
    for (int s = threadIdx.x; s < ns; s += blockDim.x) {
        float2 ml = *reinterpret_cast<const float2 *>(kp.ws_ml + (row0 + (size_t)s * p.n_heads) * 2);
        w_s[s] = ml.x;
        l_s[s] = ml.y;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const float sink = p.sink[h];
        float mx = sink;
        for (int s = 0; s < ns; s++) mx = fmaxf(mx, w_s[s]);
        float denom = expf(sink - mx);
        for (int s = 0; s < ns; s++) {
            w_s[s] = w_s[s] == -INFINITY ? 0.0f : expf(w_s[s] - mx);
            denom += l_s[s] * w_s[s];
        }
        const float inv = 1.0f / denom;
        for (int s = 0; s < ns; s++) w_s[s] *= inv;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < d / 4; i += blockDim.x) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int s = 0; s < ns; s++) {
            const float w = w_s[s];
            float4 v = *reinterpret_cast<const float4 *>(kp.ws_o + (row0 + (size_t)s * p.n_heads) * d + 4 * i);
            acc.x += w * v.x;
            acc.y += w * v.y;
            acc.z += w * v.z;
            acc.w += w * v.w;
        }
        attn_store_pair(p, c, h, 4 * i, acc.x, acc.y);
        attn_store_pair(p, c, h, 4 * i + 2, acc.z, acc.w);
    }
}

/* ------------------------------------------------------------------------------------------------ SIMT (naive) */
/* Channels (2i, 2i+1) of slot `slot` of sequence c, from either form of the cache. */
static __device__ __forceinline__ float2 attn_kv_pair(const dsv4_sparse_attn_params &p, int c, int slot, int i)
{
    const int d = p.head_dim;
    if (!p.kv8) {
        uint32_t kk = reinterpret_cast<const uint32_t *>(attn_row(p, c, slot, 2 * d))[i];
        return make_float2(dsv4_bf16_lo(kk), dsv4_bf16_hi(kk));
    }
    const int rope = p.rope_dim, nope = d - rope, ch = 2 * i;
    const uint8_t *e = attn_row(p, c, slot, dsv4_kv8_entry_bytes(d, rope));
    if (ch >= nope) {
        uint32_t kk = reinterpret_cast<const uint32_t *>(e)[(ch - nope) / 2];
        return make_float2(dsv4_bf16_lo(kk), dsv4_bf16_hi(kk));
    }
    const uint16_t two = *reinterpret_cast<const uint16_t *>(e + dsv4_kv8_codes_at(rope) + ch);
    return dsv4_kv8_decode2(two, dsv4_kv8_scale(e[dsv4_kv8_scales_at(d, rope) + ch / DSV4_KV8_BLOCK]));
}

/* The original: one block per (head, sequence); the entries are read twice per head, scores in shared memory. */
__global__ void __launch_bounds__(ATTN_SIMT_THREADS) attn_simt(const __grid_constant__ dsv4_sparse_attn_params p)
{
    const int h = blockIdx.x, c = blockIdx.y, d = p.head_dim;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = ATTN_SIMT_THREADS / 32;
    extern __shared__ __align__(16) unsigned char simt_smem[];
    float *q_s = reinterpret_cast<float *>(simt_smem); /* [d] */
    float *sc_s = q_s + d;                              /* [n_idx] scores, then probabilities */
    __shared__ float red_s[ATTN_SIMT_THREADS / 32];

    const uint16_t *qh = p.q + ((size_t)c * p.n_heads + h) * d;
    for (int i = threadIdx.x; i < d; i += ATTN_SIMT_THREADS) q_s[i] = __uint_as_float((uint32_t)qh[i] << 16);
    __syncthreads();
    for (int j = warp; j < p.n_idx; j += nwarps) {
        int slot = attn_slot(p, c, j);
        float dot = 0.0f;
        if (slot >= 0) {
            for (int i = lane; i < d / 2; i += 32) {
                const float2 k = attn_kv_pair(p, c, slot, i);
                dot += q_s[2 * i] * k.x + q_s[2 * i + 1] * k.y;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (lane == 0) sc_s[j] = slot >= 0 ? dot * p.scale : -INFINITY;
    }
    __syncthreads();

    const float sink = p.sink[h];
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < p.n_idx; j += ATTN_SIMT_THREADS) mx = fmaxf(mx, sc_s[j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red_s[warp] = mx;
    __syncthreads();
    mx = sink;
    for (int w = 0; w < nwarps; w++) mx = fmaxf(mx, red_s[w]);
    __syncthreads();
    float sum = 0.0f;
    for (int j = threadIdx.x; j < p.n_idx; j += ATTN_SIMT_THREADS) {
        float e = expf(sc_s[j] - mx);
        sc_s[j] = e;
        sum += e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) red_s[warp] = sum;
    __syncthreads();
    float denom = expf(sink - mx);
    for (int w = 0; w < nwarps; w++) denom += red_s[w];
    const float inv = 1.0f / denom;

    for (int i = threadIdx.x; i < d / 2; i += ATTN_SIMT_THREADS) {
        float x = 0.0f, y = 0.0f;
        for (int j = 0; j < p.n_idx; j++) {
            float pj = sc_s[j];
            if (pj == 0.0f) continue; /* skipped entries (and underflow: contributes nothing either way) */
            const float2 k = attn_kv_pair(p, c, attn_slot(p, c, j), i);
            x += pj * k.x;
            y += pj * k.y;
        }
        attn_store_pair(p, c, h, 2 * i, x * inv, y * inv);
    }
}

/* ------------------------------------------------------------------------------------------------ host */
/* Shared memory of the MMA partial kernel; entry_bytes 0 for a bf16 cache, else the fp8 entry size (one bf16 tile
 * plus two raw tiles instead of two bf16 tiles). */
static size_t attn_mma_smem(int mt, int d, int64_t entry_bytes)
{
    int hg = 16 * mt, pitch = d + 8;
    size_t kv = entry_bytes ? (size_t)ATTN_T * pitch * 2 + (size_t)2 * ATTN_T * entry_bytes
                            : (size_t)2 * ATTN_T * pitch * 2;
    return (size_t)hg * pitch * 2 + kv + (size_t)2 * hg * ATTN_S_PITCH * 4 + (size_t)hg * ATTN_P_PITCH * 2 +
           (size_t)hg * 3 * 4 + 2 * ATTN_T * 4;
}
static int64_t attn_entry8(const dsv4_sparse_attn_params *p)
{
    return p->kv8 ? dsv4_kv8_entry_bytes(p->head_dim, p->rope_dim) : 0;
}

/* The work split (part 1 of 3). Fills kp's plan fields; 0 or a negative error. */
static int attn_plan(const dsv4_sparse_attn_params *p, int64_t e8, attn_kparams *kp, int *mt_out)
{
    int dev = 0, sms = 0, smem_max = 0;
    DSV4_CUDA_CHECK(cudaGetDevice(&dev));
    DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    int mt = dsv4_ceil_div(p->n_heads < 64 ? p->n_heads : 64, 16);
    while (mt > 1 && attn_mma_smem(mt, p->head_dim, e8) > (size_t)smem_max) mt--;
    if (attn_mma_smem(mt, p->head_dim, e8) > (size_t)smem_max)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "sparse_attn: head_dim %d needs %zu B of shared memory, device has %d",
                          p->head_dim, attn_mma_smem(mt, p->head_dim, e8), smem_max);
    const int groups = dsv4_ceil_div(p->n_heads, 16 * mt), nt = dsv4_ceil_div(p->n_idx, ATTN_T);
    int n_split = 1, tps = nt;
    dsv4_attn_choose_split((int64_t)p->n_seq * groups, nt, sms, 16 * mt, &n_split, &tps);
    kp->head_group = 16 * mt;
    kp->n_tiles = nt;
    kp->tiles_per_split = tps;
    kp->n_split = n_split;
    *mt_out = mt;
    return 0;
}

/* The shape check: what the work split and the workspace size depend on (counts, head_dim, rope_dim, out_dtype,
 * kernel, the SIMT limit). The size query uses it alone, so a caller can size the workspace before any buffer
 * exists. */
static int attn_validate_shape(const dsv4_sparse_attn_params *p)
{
    DSV4_CHECK(p != NULL, "sparse_attn: params is NULL");
    DSV4_CHECK(p->n_seq >= 1 && p->n_heads >= 1 && p->n_idx >= 1 && p->n_slots >= 1,
               "sparse_attn: n_seq %d, n_heads %d, n_idx %d, n_slots %d must all be >= 1", p->n_seq, p->n_heads,
               p->n_idx, p->n_slots);
    if (p->head_dim < 16 || p->head_dim % 16 != 0 || p->head_dim > ATTN_MAX_D)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "sparse_attn: head_dim %d unsupported (multiple of 16, <= %d)",
                          p->head_dim, ATTN_MAX_D);
    DSV4_CHECK(p->rope_dim >= 0 && p->rope_dim % 2 == 0 && p->rope_dim <= p->head_dim,
               "sparse_attn: rope_dim %d must be even and <= head_dim %d", p->rope_dim, p->head_dim);
    DSV4_CHECK(p->out_dtype == DSV4_OUT_F32 || p->out_dtype == DSV4_OUT_BF16, "sparse_attn: bad out_dtype %d",
               (int)p->out_dtype);
    DSV4_CHECK(p->kernel == DSV4_ATTN_KERNEL_MMA || p->kernel == DSV4_ATTN_KERNEL_SIMT, "sparse_attn: bad kernel %d",
               (int)p->kernel);
    if (p->kernel == DSV4_ATTN_KERNEL_SIMT && p->n_idx > ATTN_SIMT_MAX_IDX)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "sparse_attn simt: n_idx %d > %d", p->n_idx, ATTN_SIMT_MAX_IDX);
    return 0;
}

/* The launcher's check: the shapes, then the pointers, their alignment and the KV stride. */
static int attn_validate(const dsv4_sparse_attn_params *p)
{
    int rc = attn_validate_shape(p);
    if (rc != 0) return rc;
    DSV4_CHECK(p->q && (p->kv != NULL) != (p->kv8 != NULL) && p->idx && p->sink && p->out,
               "sparse_attn: q, one of kv and kv8, idx, sink, out must be non-NULL");
    DSV4_CHECK(p->rope_dim == 0 || (p->rope_cos && p->rope_sin), "sparse_attn: rope_cos/rope_sin are NULL");
    DSV4_CHECK(p->n_fresh >= 0 && (p->n_fresh == 0 || (p->fresh && dsv4_aligned16(p->fresh))),
               "sparse_attn: %d fresh rows need a 16-byte aligned fresh buffer", p->n_fresh);
    DSV4_CHECK(dsv4_aligned16(p->q) && dsv4_aligned16(p->kv ? (const void *)p->kv : p->kv8) && dsv4_aligned16(p->out),
               "sparse_attn: q, kv and out must be 16-byte aligned");
    if (p->kv8) {
        if (!dsv4_kv8_shape_ok(p->head_dim, p->rope_dim))
            return dsv4_error(DSV4_ERR_UNSUPPORTED, "sparse_attn: no fp8 cache layout for head_dim %d, rope_dim %d "
                              "(kernels/kv_layout.h needs both parts multiples of 8)", p->head_dim, p->rope_dim);
        const int64_t eb = dsv4_kv8_entry_bytes(p->head_dim, p->rope_dim);
        DSV4_CHECK(p->kv_seq_stride % 16 == 0 && (p->n_seq == 1 || p->seq || p->kv_seq_stride >= (int64_t)p->n_slots * eb),
                   "sparse_attn: kv_seq_stride %lld (bytes, fp8 cache) must be a multiple of 16 and >= n_slots*%lld",
                   (long long)p->kv_seq_stride, (long long)eb);
        return 0;
    }
    DSV4_CHECK(p->kv_seq_stride % 8 == 0 && (p->n_seq == 1 || p->seq || p->kv_seq_stride >= (int64_t)p->n_slots * p->head_dim),
               "sparse_attn: kv_seq_stride %lld must be a multiple of 8 and >= n_slots*head_dim",
               (long long)p->kv_seq_stride);
    return 0;
}

/* The workspace of one KV form: entry bytes e8 (0 = bf16). */
static size_t attn_workspace_form(const dsv4_sparse_attn_params *p, int64_t e8)
{
    attn_kparams kp;
    int mt = 0;
    if (attn_plan(p, e8, &kp, &mt) != 0 || kp.n_split == 1) return 0;
    size_t rows = (size_t)p->n_seq * kp.n_split * p->n_heads;
    return rows * p->head_dim * sizeof(float) + rows * 2 * sizeof(float);
}

extern "C" size_t dsv4_opt_sparse_attn_workspace_bytes(const dsv4_sparse_attn_params *p)
{
    if (attn_validate_shape(p) != 0 || p->kernel != DSV4_ATTN_KERNEL_MMA) return 0;
    size_t a = attn_workspace_form(p, 0), b = 0;
    if (dsv4_kv8_shape_ok(p->head_dim, p->rope_dim))
        b = attn_workspace_form(p, dsv4_kv8_entry_bytes(p->head_dim, p->rope_dim));
    return a > b ? a : b;
}

template <int MT> static int attn_launch_mma(const attn_kparams *kp)
{
    const dsv4_sparse_attn_params *p = &kp->p;
    size_t smem = attn_mma_smem(MT, p->head_dim, attn_entry8(p));
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(attn_mma_partial<MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid(kp->n_split, dsv4_ceil_div(p->n_heads, 16 * MT), p->n_seq);
    attn_mma_partial<MT><<<grid, ATTN_THREADS, smem, p->stream>>>(*kp);
    DSV4_LAUNCH_CHECK("attn_mma_partial");
    if (kp->n_split > 1) {
        attn_combine<<<dim3(p->n_heads, p->n_seq), 128, 2 * kp->n_split * sizeof(float), p->stream>>>(*kp);
        DSV4_LAUNCH_CHECK("attn_combine");
    }
    return 0;
}

extern "C" int dsv4_opt_sparse_attn(const dsv4_sparse_attn_params *p)
{
    int rc = attn_validate(p);
    if (rc != 0) return rc;
    if (p->kernel == DSV4_ATTN_KERNEL_SIMT) {
        size_t smem = (size_t)(p->head_dim + p->n_idx) * sizeof(float);
        DSV4_CUDA_CHECK(cudaFuncSetAttribute(attn_simt, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attn_simt<<<dim3(p->n_heads, p->n_seq), ATTN_SIMT_THREADS, smem, p->stream>>>(*p);
        DSV4_LAUNCH_CHECK("attn_simt");
        return 0;
    }
    attn_kparams kp;
    kp.p = *p;
    int mt = 0;
    rc = attn_plan(p, attn_entry8(p), &kp, &mt);
    if (rc != 0) return rc;
    kp.ws_o = NULL;
    kp.ws_ml = NULL;
    if (kp.n_split > 1) {
        size_t rows = (size_t)p->n_seq * kp.n_split * p->n_heads, need = rows * (p->head_dim + 2) * sizeof(float);
        DSV4_CHECK(p->workspace != NULL && p->workspace_bytes >= need && dsv4_aligned16(p->workspace),
                   "sparse_attn: workspace of %zu B (16-aligned) needed, got %zu B at %p", need, p->workspace_bytes,
                   p->workspace);
        kp.ws_o = static_cast<float *>(p->workspace);
        kp.ws_ml = kp.ws_o + rows * p->head_dim;
    }
    switch (mt) {
    case 1: return attn_launch_mma<1>(&kp);
    case 2: return attn_launch_mma<2>(&kp);
    case 3: return attn_launch_mma<3>(&kp);
    default: return attn_launch_mma<4>(&kp);
    }
}
