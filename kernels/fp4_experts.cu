/* fp4_experts.cu - the routed experts of C tokens with FP4 e2m1 weights (two codes per byte, low nibble = even
 * column) and one e8m0 scale per 32 input columns (model-spec §2, §3, §10): the contract of dsv4_opt_moe_experts
 * (moe.cuh) - h[c, j] = silu(min(x·W1ᵀ, λ)) · clamp(x·W3ᵀ, ±λ) · weight[c, j] (bf16), out[c] = Σ_j h[c, j]·W2ᵀ
 * (j ascending, fp32) + shared[c] - but each touched expert's bytes are read ONCE for all its tokens.
 *
 * Two families of kernels, the same results bit for bit (bench_qweight --fp4-sweep and test_fp4_variants check it):
 *  - variant 0, the first kernels, kept for A/B (described here);
 *  - the streamed variants 1.. (section "streamed kernels" below): one cp.async ring per warp that flows across
 *    its work items, a persistent up grid, per-block expert tables. dsv4_opt_fp4_experts runs F4_DEFAULT_UP /
 *    F4_DEFAULT_DOWN, or variant 0 where those do not fit (shared memory: sm_120, k = 16 for some downs);
 *    dsv4_opt_fp4_experts_config (bench/tests only) runs any pair.
 * Grouping without a host round trip or workspace (graph-capturable): every block rebuilds, in shared memory, the
 * set of experts its chunk of <= 64 tokens touches (a bitmap of ids) and the pairs of the expert it works on (a
 * ballot scan in pair order, so the order is fixed).
 *  - up: grid (I/16 row tiles, min(pairs, 128) slot blocks, token chunk). Slot block y takes the touched experts
 *    of rank y, y + 128, ... in id order. 4 warps split the D columns by 128-column super-steps; each warp
 *    holds 16 W1 rows and the 16 matching W3 rows (two m-tiles) against 8 tokens (one n-tile) per pass, and the 4
 *    partials are summed in warp order in shared memory before the SwiGLU epilogue.
 *  - down: grid (D/16 row tiles, token chunk), 8 warps. The touched experts are dealt to the warps in id order; a
 *    warp computes its expert's 16 rows for all its pairs over the whole of I and writes one fp32 dot product per
 *    (pair, row) into shared memory; then each (token, row) sums its k pairs in j order and adds shared[c].
 * No atomics on floats (integer atomicOr builds the bitmap only): bitwise identical run to run.
 *
 * Numerics: a lane's 16-byte load is 32 codes of one row, exactly one scale block; codes become bf16 by bit moves
 * and one exact bf16x2 multiply by 2^126·scale (qweight_dev.cuh), so the mma sees the dequantised weight exactly
 * (as the f32 dequantisation of the shared loader, unless the product is subnormal) times the bf16 activation.
 * Quiet traps: expert ids must lie in [0, 1024) (others are skipped and their pairs contribute 0); a token with the
 * same expert twice has two pairs, both computed. Expert parallel (e_end > 0, --gpus N): only experts
 * [e_begin, e_end) are held (at index e - e_begin); pairs of other experts are skipped and add 0, as in moe.cu.
 */
#include "opt_common.cuh"
#include "qweight.cuh"
#include "qweight_dev.cuh"

enum {
    F4_TOK = 64,      /* tokens per chunk (grid.z) */
    F4_MAX_K = 16,
    F4_MAX_PAIRS = F4_TOK * F4_MAX_K,
    F4_MAX_E = 1024,  /* bitmap size: expert ids must be below this */
    F4_UP_WARPS = 4,
    F4_DOWN_WARPS = 8,
    F4_SS = 128,      /* columns per super-step: 4 lanes x 32 codes */
    F4_UP_DEPTH = 2,  /* super-steps per weight batch (up: 2 m-tiles; down: F4_DOWN_DEPTH below) */
    F4_UP_SLOT_BLOCKS = 128 /* blocks along the expert slots; each loops over slots y, y + 128, ... */
};

/* Down's batch depth: the deepest that stays within 128 registers without spills on each architecture. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define F4_DOWN_DEPTH 3
#else
#define F4_DOWN_DEPTH 2
#endif

/* Copies the ids of pairs [pair0, pair0 + n_pairs) into sids (shared: the pair scans below read them many times)
 * and builds the bitmap of the experts in [e_lo, e_hi) (within [0, F4_MAX_E)) they touch into bits[F4_MAX_E / 32].
 * All threads; ends with a __syncthreads. */
static __device__ void f4_touched_bitmap(uint32_t *bits, int32_t *sids, const int32_t *ids, int pair0, int n_pairs,
                                         int e_lo, int e_hi)
{
    for (int i = threadIdx.x; i < F4_MAX_E / 32; i += blockDim.x) bits[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        const int e = ids[pair0 + i];
        sids[i] = e;
        if (e >= e_lo && e < e_hi) atomicOr(&bits[e >> 5], 1u << (e & 31));
    }
    __syncthreads();
}

/* The experts this call holds (expert parallel: [e_begin, e_end), stored at index e - e_begin; e_end 0: all). */
static __device__ int f4_e_lo(const dsv4_fp4_experts_params &p) { return p.e_end ? p.e_begin : 0; }
static __device__ int f4_e_hi(const dsv4_fp4_experts_params &p)
{
    return p.e_end && p.e_end < F4_MAX_E ? p.e_end : F4_MAX_E;
}

/* One warp: the local indices (ascending) of the pairs of expert e among the n_pairs of sids; returns the count. */
template <typename T> static __device__ int f4_warp_pairs_of(T *list, const int32_t *sids, int n_pairs, int e)
{
    const int lane = threadIdx.x & 31;
    int cnt = 0;
    for (int base = 0; base < n_pairs; base += 32) {
        const int i = base + lane;
        const bool v = i < n_pairs && sids[i] == e;
        const uint32_t m = __ballot_sync(0xffffffffu, v);
        if (v) list[cnt + __popc(m & ((1u << lane) - 1u))] = (T)i;
        cnt += __popc(m);
    }
    __syncwarp();
    return cnt;
}

/* One warp: acc[m] += W_m[16 rows, cols] · x[8 tokens, cols]ᵀ over super-steps ss0, ss0 + stride, ... of K columns.
 * wrow[m][r] / srow[m][r]: the packed codes / e8m0 scales of row g (r = 0) and g + 8 (r = 1) of m-tile m; xrow: the
 * bf16 row of this lane's token (n index g), or NULL for a padding token. The weights come in batches of DEPTH
 * super-steps, the next batch loaded while the current one is multiplied, so up to 2·DEPTH·MT KB are in flight
 * per warp (what keeps HBM busy with few warps per SM). */
template <int MT, int DEPTH>
static __device__ __forceinline__ void f4_warp_tile(float acc[MT][4], const uint8_t *const wrow[MT][2],
                                                    const uint8_t *const srow[MT][2], const uint16_t *xrow, int K,
                                                    int ss0, int stride)
{
    const int t = threadIdx.x & 3, nss = (K + F4_SS - 1) / F4_SS;
    uint4 nxt[DEPTH][MT][2];
    uint8_t nsc[DEPTH][MT][2];
    auto load = [&](int b) {
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            const int col = (b + d * stride) * F4_SS + 32 * t;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    if (col < K) {
                        nxt[d][m][r] = qw_ld_stream(wrow[m][r] + col / 2);
                        nsc[d][m][r] = srow[m][r][col / 32];
                    } else {
                        nxt[d][m][r] = make_uint4(0, 0, 0, 0);
                        nsc[d][m][r] = 0;
                    }
                }
        }
    };
    if (ss0 < nss) load(ss0);
    for (int b = ss0; b < nss; b += DEPTH * stride) {
        uint4 cur[DEPTH][MT][2];
        uint8_t csc[DEPTH][MT][2];
#pragma unroll
        for (int d = 0; d < DEPTH; d++)
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) cur[d][m][r] = nxt[d][m][r], csc[d][m][r] = nsc[d][m][r];
        if (b + DEPTH * stride < nss) load(b + DEPTH * stride);
        /* activations (L2/L1 hits): the next super-step's are loaded while this one is multiplied */
        auto load_x = [&](uint32_t X[16], int ss) {
            const int col = ss * F4_SS + 32 * t;
            if (xrow && ss < nss && col < K) {
                const uint4 *src = reinterpret_cast<const uint4 *>(xrow + col);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint4 v = __ldg(src + i);
                    X[4 * i] = v.x, X[4 * i + 1] = v.y, X[4 * i + 2] = v.z, X[4 * i + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int i = 0; i < 16; i++) X[i] = 0;
            }
        };
        uint32_t Xn[16];
        load_x(Xn, b);
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            if (b + d * stride >= nss) break;
            uint32_t X[16];
#pragma unroll
            for (int i = 0; i < 16; i++) X[i] = Xn[i];
            if (d + 1 < DEPTH) load_x(Xn, b + (d + 1) * stride);
            uint32_t m1[MT][2], m2[MT][2];
            bool two = false;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    qw_e8m0_mults(csc[d][m][r], &m1[m][r], &m2[m][r]);
                    two |= m2[m][r] != 0;
                }
#pragma unroll
            for (int s = 0; s < 8; s++) {
                const int q = s >> 1, u = s & 1;
                const uint32_t bb[2] = {__byte_perm(X[4 * q + u], X[4 * q + u + 2], 0x5410),
                                        __byte_perm(X[4 * q + u], X[4 * q + u + 2], 0x7632)};
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    uint32_t a[4];
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const uint32_t w = qw_word(cur[d][m][r], q);
                        uint32_t lo = u ? qw_e2m1_pair_raw<2>(w) : qw_e2m1_pair_raw<0>(w);
                        uint32_t hi = u ? qw_e2m1_pair_raw<3>(w) : qw_e2m1_pair_raw<1>(w);
                        lo = qw_bf16x2_mul(lo, m1[m][r]);
                        hi = qw_bf16x2_mul(hi, m1[m][r]);
                        if (two && m2[m][r]) {
                            lo = qw_bf16x2_mul(lo, m2[m][r]);
                            hi = qw_bf16x2_mul(hi, m2[m][r]);
                        }
                        a[r] = lo;     /* a[0]: row g, a[1]: row g+8 (k 2t, 2t+1) */
                        a[2 + r] = hi; /* a[2], a[3]: k 2t+8, 2t+9 */
                    }
                    dsv4_mma_bf16_16816(acc[m], a, bb);
                }
            }
        }
    }
}

/* grid (I/16, slot blocks, token chunks), F4_UP_WARPS warps: block y takes the touched experts of rank y,
 * y + gridDim.y, ... (the bitmap is built once per block, and no block is launched only to find nothing). */
__global__ void __launch_bounds__(F4_UP_WARPS * 32, 3) fp4_up_kernel(const __grid_constant__ dsv4_fp4_experts_params p)
{
    __shared__ uint32_t bits[F4_MAX_E / 32];
    __shared__ int list[F4_MAX_PAIRS];
    __shared__ int32_t sids[F4_MAX_PAIRS];
    __shared__ int s_e, s_cnt;
    __shared__ float red[F4_UP_WARPS][2][32][4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tok0 = blockIdx.z * F4_TOK, ntok = p.n_tok - tok0 < F4_TOK ? p.n_tok - tok0 : F4_TOK;
    const int pair0 = tok0 * p.k, n_pairs = ntok * p.k, D = p.dim, I = p.inter, m0 = blockIdx.x * 16;
    f4_touched_bitmap(bits, sids, p.ids, pair0, n_pairs, f4_e_lo(p), f4_e_hi(p));
    for (int slot = blockIdx.y;; slot += gridDim.y) {
        if (warp == 0) {
            const uint32_t word = bits[lane];
            const int c = __popc(word);
            int incl = c;
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const int excl = incl - c;
            int e = -1;
            if (slot >= excl && slot < incl) {
                uint32_t w = word;
                for (int n = slot - excl; n > 0; n--) w &= w - 1; /* drop the lower set bits */
                e = lane * 32 + __ffs(w) - 1;
            }
            const uint32_t hit = __ballot_sync(0xffffffffu, e >= 0);
            e = __shfl_sync(0xffffffffu, e, hit ? __ffs(hit) - 1 : 0);
            if (!hit) e = -1;
            int cnt = 0;
            if (e >= 0) {
                cnt = f4_warp_pairs_of(list, sids, n_pairs, e);
                for (int i = lane; i < cnt; i += 32) list[i] += pair0;
            }
            if (lane == 0) s_e = e, s_cnt = cnt;
        }
        __syncthreads();
        const int e = s_e, cnt = s_cnt;
        if (e < 0) return; /* uniform: every thread read the same s_e */
        const size_t el = (size_t)(e - f4_e_lo(p)); /* the held expert's index */
        const uint8_t *w13 = p.w13 + el * 2 * I * (D / 2), *s13 = p.s13 + el * 2 * I * (D / 32);
        const uint8_t *wrow[2][2], *srow[2][2];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const size_t row = (size_t)m * I + m0 + g + 8 * r;
                wrow[m][r] = w13 + row * (D / 2);
                srow[m][r] = s13 + row * (D / 32);
            }
        for (int pass = 0; pass * 8 < cnt; pass++) {
            const int idx = pass * 8 + g;
            const uint16_t *xrow = idx < cnt ? p.x + (size_t)(list[idx] / p.k) * D : NULL;
            float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
            f4_warp_tile<2, F4_UP_DEPTH>(acc, wrow, srow, xrow, D, warp, F4_UP_WARPS);
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int i = 0; i < 4; i++) red[warp][m][lane][i] = acc[m][i];
            __syncthreads();
            if (warp == 0) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float gs = 0.0f, us = 0.0f;
                    for (int w = 0; w < F4_UP_WARPS; w++) gs += red[w][0][lane][i], us += red[w][1][lane][i];
                    const int row = m0 + g + (i >= 2 ? 8 : 0), slot_i = pass * 8 + 2 * t + (i & 1);
                    if (slot_i >= cnt) continue;
                    const int pair = list[slot_i];
                    const float gv = fminf(gs, p.limit), uv = fminf(fmaxf(us, -p.limit), p.limit);
                    const float h = gv / (1.0f + expf(-gv)) * uv * p.weights[pair];
                    p.h[(size_t)pair * I + row] = dsv4_f32_to_bf16_bits(h);
                }
            }
            __syncthreads(); /* red, list and s_e are reused */
        }
    }
}

/* grid (D/16, 1, token chunks), F4_DOWN_WARPS warps; dynamic shared memory f4_down_smem(). */
__global__ void __launch_bounds__(F4_DOWN_WARPS * 32, 2)
    fp4_down_kernel(const __grid_constant__ dsv4_fp4_experts_params p)
{
    __shared__ uint32_t bits[F4_MAX_E / 32];
    __shared__ int16_t elist[F4_MAX_E];
    __shared__ int32_t sids[F4_MAX_PAIRS];
    __shared__ int n_e;
    extern __shared__ float part[]; /* [n_pairs][16] f32, then int16 lists [F4_DOWN_WARPS][n_pairs] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tok0 = blockIdx.z * F4_TOK, ntok = p.n_tok - tok0 < F4_TOK ? p.n_tok - tok0 : F4_TOK;
    const int pair0 = tok0 * p.k, n_pairs = ntok * p.k, D = p.dim, I = p.inter, row0 = blockIdx.x * 16;
    int16_t *mylist = reinterpret_cast<int16_t *>(part + (size_t)n_pairs * 16) + (size_t)warp * n_pairs;
    for (int i = threadIdx.x; i < n_pairs * 16; i += blockDim.x) part[i] = 0.0f;
    f4_touched_bitmap(bits, sids, p.ids, pair0, n_pairs, f4_e_lo(p), f4_e_hi(p));
    if (warp == 0) {
        uint32_t word = bits[lane];
        const int c = __popc(word);
        int incl = c;
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        for (int n = incl - c; word; n++, word &= word - 1) elist[n] = (int16_t)(lane * 32 + __ffs(word) - 1);
        if (lane == 31) n_e = incl;
    }
    __syncthreads();
    for (int ei = warp; ei < n_e; ei += F4_DOWN_WARPS) {
        const int e = elist[ei];
        const int cnt = f4_warp_pairs_of(mylist, sids, n_pairs, e);
        const uint8_t *wrow[1][2], *srow[1][2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const size_t row = (size_t)(e - f4_e_lo(p)) * D + row0 + g + 8 * r;
            wrow[0][r] = p.w2 + row * (I / 2);
            srow[0][r] = p.s2 + row * (I / 32);
        }
        for (int pass = 0; pass * 8 < cnt; pass++) {
            const int idx = pass * 8 + g;
            const uint16_t *hrow = idx < cnt ? p.h + (size_t)(pair0 + mylist[idx]) * I : NULL;
            float acc[1][4] = {{0, 0, 0, 0}};
            f4_warp_tile<1, F4_DOWN_DEPTH>(acc, wrow, srow, hrow, I, 0, 1);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int slot = pass * 8 + 2 * t + (i & 1);
                if (slot < cnt) part[mylist[slot] * 16 + g + (i >= 2 ? 8 : 0)] = acc[0][i];
            }
        }
        __syncwarp();
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ntok * 16; i += blockDim.x) {
        const int cl = i / 16, r = i % 16, row = row0 + r;
        float acc = 0.0f;
        for (int j = 0; j < p.k; j++) acc += part[(cl * p.k + j) * 16 + r];
        if (p.shared) acc = acc + p.shared[(size_t)(tok0 + cl) * p.shared_stride + row];
        p.out[(size_t)(tok0 + cl) * D + row] = acc;
    }
}

static size_t f4_down_smem(int n_tok, int k)
{
    const size_t pairs = (size_t)(n_tok < F4_TOK ? n_tok : F4_TOK) * k;
    return pairs * 16 * sizeof(float) + (size_t)F4_DOWN_WARPS * pairs * sizeof(int16_t);
}

/* ================================================================================ streamed kernels (variants 1+)
 * Why: the kernels above expose latency - the activations are loaded one super-step ahead and consumed at once at
 * the start of every weight batch, only one batch (2-4 KB per warp) of weights is in flight, and every block or
 * expert restarts the pipeline after a bitmap, a slot search and a __syncthreads, for only 16-64 KB of weights.
 * Here each warp runs ONE cp.async ring of STAGES super-steps (weights, their scale words and the activations,
 * 16 B per lane per row or chunk) over its whole sequence of work items: the next item is fetched while the
 * current one finishes, so the ramp is paid once per warp; (STAGES-1) x 1-2 KB of weights per warp stay in flight.
 * Every lane reads back only what it copied itself, so the inner loop has no barrier at all (cp.async.wait_group
 * orders a thread's own copies). The per-block tables group the chunk's pairs by expert once (counting sort).
 *
 * Bitwise equal to variant 0 by construction: the same column layout (lane t: columns 32t..32t+31 of each
 * 128-column super-step), the same dequantisation and mma sequence per accumulator chain, and the same sums -
 * up walks the super-steps as variant 0's 4 warps did (chain c = super-steps c, c+4, ...) and folds each chain
 * into a running sum starting at 0.0f in chain order, exactly the warp-order reduction of variant 0 (an empty
 * chain added +0 there; it is skipped here, which is the same value since the sum is never -0); down runs one
 * chain over all super-steps. Which tokens share an n-tile does not change any output column.
 *  - up: a persistent grid (blocks = SMs x blocks per SM); work item = (touched expert, 16-row tile), one warp
 *    holds 16 W1 rows and the 16 matching W3 rows over all of D (no cross-warp reduction) for NT tokens a pass;
 *    the items are dealt round-robin over the warps of all blocks, block index fastest (spreads C = 1 over SMs).
 *  - down: grid (D/(16 MT) row slices, 1, token chunks); the warps take the touched experts in rank order, each
 *    item MT x 16 rows over all of I; the per-pair partials meet in shared memory for the j-ordered sum.
 * Scales: a lane copies (cp.async.ca, 4 B) the aligned word holding its scale byte and picks the byte; words never
 * leave the array (s13/s2 must be 4-byte aligned, sizes are multiples of 4; the launcher checks). */

/* The chunk's pairs grouped by expert rank (the experts in id order). Sizes from n_pairs: f4_tab_bytes. */
struct F4Tab {
    uint32_t *bits;                 /* [32] bitmap of touched expert ids */
    int *wpre, *n_e;                /* [32] exclusive popcount prefix of bits; [1] touched experts */
    int *cnt, *beg, *fill;          /* [np] per rank: pairs, first in plist, placement cursor */
    int16_t *srank, *elist, *plist; /* [np] rank of each local pair (-1: skipped); id of each rank; pair lists */
};
static __host__ __device__ size_t f4_tab_bytes(int n_pairs)
{
    return 272 + (size_t)((n_pairs + 7) & ~7) * (3 * 4 + 3 * 2);
}
static __device__ F4Tab f4_tab_carve(unsigned char *base, int n_pairs)
{
    const int np = (n_pairs + 7) & ~7;
    F4Tab T;
    T.bits = reinterpret_cast<uint32_t *>(base);
    T.wpre = reinterpret_cast<int *>(base + 128);
    T.n_e = reinterpret_cast<int *>(base + 256);
    int *ip = reinterpret_cast<int *>(base + 272);
    T.cnt = ip, T.beg = ip + np, T.fill = ip + 2 * np;
    int16_t *sp = reinterpret_cast<int16_t *>(ip + 3 * np);
    T.srank = sp, T.elist = sp + np, T.plist = sp + 2 * np;
    return T;
}

/* All threads: fills the tables for pairs [pair0, pair0 + n_pairs) of experts in [e_lo, e_hi); the lists are in
 * pair order (a stable counting sort: ranks by bitmap popcount, placement by one warp with __match_any_sync).
 * Ends with a __syncthreads. */
static __device__ void f4_tab_build(const F4Tab &T, const int32_t *ids, int pair0, int n_pairs, int e_lo, int e_hi)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < 32; i += blockDim.x) T.bits[i] = 0;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) T.cnt[i] = 0, T.fill[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        const int e = ids[pair0 + i];
        if (e >= e_lo && e < e_hi) atomicOr(&T.bits[e >> 5], 1u << (e & 31));
    }
    __syncthreads();
    if (warp == 0) {
        uint32_t word = T.bits[lane];
        const int c = __popc(word);
        int incl = c;
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        T.wpre[lane] = incl - c;
        for (int n = incl - c; word; n++, word &= word - 1) T.elist[n] = (int16_t)(lane * 32 + __ffs(word) - 1);
        if (lane == 31) *T.n_e = incl;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        const int e = ids[pair0 + i];
        int r = -1;
        if (e >= e_lo && e < e_hi) r = T.wpre[e >> 5] + __popc(T.bits[e >> 5] & ((1u << (e & 31)) - 1u));
        T.srank[i] = (int16_t)r;
        if (r >= 0) atomicAdd(&T.cnt[r], 1); /* integer: the count does not depend on the order */
    }
    __syncthreads();
    if (warp == 0) {
        const int ne = *T.n_e;
        for (int base = 0, carry = 0; base < ne; base += 32) {
            const int i = base + lane, c = i < ne ? T.cnt[i] : 0;
            int incl = c;
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            if (i < ne) T.beg[i] = carry + incl - c;
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
        __syncwarp();
        for (int base = 0; base < n_pairs; base += 32) {
            const int i = base + lane, r = i < n_pairs ? T.srank[i] : -1;
            const uint32_t same = __match_any_sync(0xffffffffu, r);
            if (r >= 0) T.plist[T.beg[r] + T.fill[r] + __popc(same & ((1u << lane) - 1u))] = (int16_t)i;
            __syncwarp();
            if (r >= 0 && lane == __ffs(same) - 1) T.fill[r] += __popc(same);
            __syncwarp();
        }
    }
    __syncthreads();
}

/* 4-byte global -> shared copy (cp.async.cg takes 16 B only); src_bytes = 0 zero-fills. */
static __device__ __forceinline__ void f4_cp_async4(void *smem_dst, const void *gmem_src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dsv4_smem_addr(smem_dst)), "l"(gmem_src),
                 "r"(src_bytes)
                 : "memory");
}

/* One super-step of one warp: acc[m] += dequant(W_m 16 rows x this lane's 32 columns)·X, the exact arithmetic of
 * one d-iteration of f4_warp_tile (kept separate so that variant 0 stays byte for byte as it was). */
template <int MT>
static __device__ __forceinline__ void f4_ss_mma(float acc[MT][4], const uint4 cur[MT][2], const uint8_t csc[MT][2],
                                                 const uint32_t X[16])
{
    uint32_t m1[MT][2], m2[MT][2];
    bool two = false;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            qw_e8m0_mults(csc[m][r], &m1[m][r], &m2[m][r]);
            two |= m2[m][r] != 0;
        }
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const int q = s >> 1, u = s & 1;
        const uint32_t bb[2] = {__byte_perm(X[4 * q + u], X[4 * q + u + 2], 0x5410),
                                __byte_perm(X[4 * q + u], X[4 * q + u + 2], 0x7632)};
#pragma unroll
        for (int m = 0; m < MT; m++) {
            uint32_t a[4];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint32_t w = qw_word(cur[m][r], q);
                uint32_t lo = u ? qw_e2m1_pair_raw<2>(w) : qw_e2m1_pair_raw<0>(w);
                uint32_t hi = u ? qw_e2m1_pair_raw<3>(w) : qw_e2m1_pair_raw<1>(w);
                lo = qw_bf16x2_mul(lo, m1[m][r]);
                hi = qw_bf16x2_mul(hi, m1[m][r]);
                if (two && m2[m][r]) {
                    lo = qw_bf16x2_mul(lo, m2[m][r]);
                    hi = qw_bf16x2_mul(hi, m2[m][r]);
                }
                a[r] = lo, a[2 + r] = hi;
            }
            dsv4_mma_bf16_16816(acc[m], a, bb);
        }
    }
}

/* Up's walk of the super-steps in variant 0's chain order: chain c = c, c+4, ...; chains below nss%4 hold one more.
 * Step j of nss -> super-step; *last: j ends its chain. */
static __device__ __forceinline__ int f4_chain_ss(int j, int nss, bool *last)
{
    const int q = nss >> 2, r = nss & 3, big = r * (q + 1);
    int c, i, len;
    if (j < big) {
        c = j / (q + 1), i = j % (q + 1), len = q + 1;
    } else {
        c = r + (j - big) / q, i = (j - big) % q, len = q;
    }
    *last = i == len - 1;
    return c + 4 * i;
}

/* One ring stage of a warp, lane-major so each lane's 16-byte accesses are contiguous across the warp:
 * weights [MT][2 rows][32 lanes] x 16 B, scale words [MT][2][32] x 4 B, activations [4 chunks][4·NT lanes] x 16 B. */
template <int MT, int NT> struct F4Stage {
    enum { W = MT * 2 * 32 * 16, S = MT * 2 * 32 * 4, X = 4 * 4 * NT * 16, BYTES = W + S + X };
};

/* A warp's work item: an expert and a row tile. */
struct F4Item {
    const uint8_t *w, *s; /* the expert's packed codes / scales (row 0) */
    const int16_t *list;  /* its local pairs (shared) */
    int cnt, row0, live;
};
/* Where a stream stands: item n, pass (NT tokens each), step j of nss; xrow: this lane's token row or NULL. */
struct F4Cur {
    F4Item it;
    int n, pass, j;
    const uint16_t *xrow;
};

/* Row of m-tile m, fragment row r, for lane group g: up = W1 (m 0) and W3 (m 1) of one tile; down = MT tiles. */
template <bool UP>
static __device__ __forceinline__ size_t f4_row(int m, int r, int row0, int g, int inter)
{
    return UP ? (size_t)m * inter + row0 + g + 8 * r : (size_t)row0 + 16 * m + g + 8 * r;
}

/* One warp's stream over its items n = 0, 1, ... (up: global item gw + n·total over (rank, tile); down: rank
 * gw + n·total), STAGES-deep cp.async ring at `ring` (this warp's, F4Stage BYTES each). Writes h (up) or the
 * per-pair partials part[pair][16·MT] (down). NAT (up only): walk the super-steps in column order (each row read
 * front to back, better DRAM locality) into 4 accumulator sets, one per chain, folded at the end in chain order -
 * the same sums as the chain walk at 16 more registers. */
template <bool UP, int MT, int NT, int STAGES, bool NAT>
static __device__ __forceinline__ void f4_stream(const dsv4_fp4_experts_params &p, const F4Tab &T, int pair0,
                                                 unsigned char *ring, float *part, int gw, int total)
{
    typedef F4Stage<MT, NT> St;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int K = UP ? p.dim : p.inter, nss = (K + F4_SS - 1) / F4_SS, n_e = *T.n_e, e_lo = f4_e_lo(p);
    auto item = [&](int n) {
        F4Item it;
        int rank, row0;
        if (UP) {
            const int tiles = p.inter / 16, i = gw + n * total;
            rank = i / tiles, row0 = (i % tiles) * 16;
        } else {
            rank = gw + n * total, row0 = blockIdx.x * 16 * MT;
        }
        it.live = rank < n_e;
        const size_t el = it.live ? (size_t)(T.elist[rank] - e_lo) : 0;
        it.w = UP ? p.w13 + el * 2 * p.inter * (p.dim / 2) : p.w2 + el * p.dim * (p.inter / 2);
        it.s = UP ? p.s13 + el * 2 * p.inter * (p.dim / 32) : p.s2 + el * p.dim * (p.inter / 32);
        it.list = T.plist + (it.live ? T.beg[rank] : 0);
        it.cnt = it.live ? T.cnt[rank] : 0;
        it.row0 = row0;
        return it;
    };
    auto xrow_of = [&](const F4Item &it, int pass) -> const uint16_t * {
        const int s = pass * NT + g;
        if (!it.live || g >= NT || s >= it.cnt) return NULL;
        const int pair = pair0 + it.list[s];
        return UP ? p.x + (size_t)(pair / p.k) * p.dim : p.h + (size_t)pair * p.inter;
    };
    auto start = [&](F4Cur &c, int n) {
        c.n = n, c.it = item(n), c.pass = 0, c.j = 0;
        c.xrow = xrow_of(c.it, 0);
    };
    auto advance = [&](F4Cur &c) {
        if (++c.j < nss) return;
        c.j = 0;
        if (++c.pass * NT < c.it.cnt) {
            c.xrow = xrow_of(c.it, c.pass);
            return;
        }
        start(c, c.n + 1);
    };
    auto ss_of = [&](int j, bool *last) {
        if (UP && !NAT) return f4_chain_ss(j, nss, last);
        *last = j == nss - 1;
        return j;
    };
    auto issue = [&](unsigned char *st, const F4Cur &c) {
        bool last;
        const int col = ss_of(c.j, &last) * F4_SS + 32 * t;
        const bool in = col < K; /* K % 32 == 0: a lane's 32 columns are all in or all out */
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const size_t row = f4_row<UP>(m, r, c.it.row0, g, p.inter);
                const int o = (m * 2 + r) * 32 + lane;
                dsv4_cp_async16(st + o * 16, c.it.w + row * (K / 2) + (in ? col / 2 : 0), in ? 16 : 0);
                const uintptr_t sa = (uintptr_t)(c.it.s + row * (K / 32) + (in ? col / 32 : 0));
                f4_cp_async4(st + St::W + o * 4, reinterpret_cast<const void *>(sa & ~(uintptr_t)3), in ? 4 : 0);
            }
        if (c.xrow && in) {
#pragma unroll
            for (int i = 0; i < 4; i++) dsv4_cp_async16(st + St::W + St::S + (i * 4 * NT + lane) * 16, c.xrow + col + 8 * i, 16);
        }
    };
    auto consume = [&](const unsigned char *st, const F4Cur &c, float acc[MT][4], float nat[4][MT][4]) {
        bool last;
        const int ss = ss_of(c.j, &last), col = ss * F4_SS + 32 * t;
        uint4 cur[MT][2];
        uint8_t csc[MT][2];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int o = (m * 2 + r) * 32 + lane;
                cur[m][r] = *reinterpret_cast<const uint4 *>(st + o * 16);
                const uint32_t sw = *reinterpret_cast<const uint32_t *>(st + St::W + o * 4);
                const size_t row = f4_row<UP>(m, r, c.it.row0, g, p.inter);
                /* the byte's place in its word: col/32 = 4·ss + t, so it does not depend on ss */
                const unsigned sh = (unsigned)(((uintptr_t)c.it.s + row * (K / 32) + t) & 3);
                csc[m][r] = (uint8_t)(sw >> (8 * sh));
            }
        uint32_t X[16];
        if (c.xrow && col < K) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint4 v = *reinterpret_cast<const uint4 *>(st + St::W + St::S + (i * 4 * NT + lane) * 16);
                X[4 * i] = v.x, X[4 * i + 1] = v.y, X[4 * i + 2] = v.z, X[4 * i + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 16; i++) X[i] = 0;
        }
        if (NAT) {
#pragma unroll
            for (int k = 0; k < 4; k++) /* a static index keeps the sets in registers */
                if ((ss & 3) == k) f4_ss_mma<MT>(nat[k], cur, csc, X);
        } else {
            f4_ss_mma<MT>(acc, cur, csc, X);
        }
        return last;
    };
    /* The end of a pass: up's SwiGLU epilogue (gate in run[0], up in run[1], same thread) or down's partials. */
    auto finish = [&](const F4Cur &c, const float v[MT][4]) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int n = 2 * t + (i & 1), slot = c.pass * NT + n;
            if (n >= NT || slot >= c.it.cnt) continue;
            const int lp = c.it.list[slot], rr = g + (i >= 2 ? 8 : 0);
            if (UP) {
                const int pair = pair0 + lp;
                const float gv = fminf(v[0][i], p.limit), uv = fminf(fmaxf(v[MT - 1][i], -p.limit), p.limit);
                const float h = gv / (1.0f + expf(-gv)) * uv * p.weights[pair];
                p.h[(size_t)pair * p.inter + c.it.row0 + rr] = dsv4_f32_to_bf16_bits(h);
            } else {
#pragma unroll
                for (int m = 0; m < MT; m++) part[lp * 16 * MT + 16 * m + rr] = v[m][i];
            }
        }
    };

    F4Cur prod, cons;
    start(prod, 0);
    start(cons, 0);
    int pslot = STAGES - 1, cslot = 0;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (prod.it.live) {
            issue(ring + s * St::BYTES, prod);
            advance(prod);
        }
        dsv4_cp_async_commit(); /* one group per stage, empty or not: wait_group counts stages */
    }
    float acc[MT][4], run[MT][4], nat[NAT ? 4 : 1][MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc[m][i] = 0.0f, run[m][i] = 0.0f;
#pragma unroll
            for (int k = 0; k < (NAT ? 4 : 1); k++) nat[k][m][i] = 0.0f;
        }
    while (cons.it.live) {
        dsv4_cp_async_wait<STAGES - 2>(); /* this lane's copies of the stage at cslot have landed */
        /* refill the slot consumed last iteration (its reads fed mma's already issued) */
        if (prod.it.live) {
            issue(ring + pslot * St::BYTES, prod);
            advance(prod);
        }
        dsv4_cp_async_commit();
        pslot = pslot + 1 == STAGES ? 0 : pslot + 1;
        const bool chain_end = consume(ring + cslot * St::BYTES, cons, acc, NAT ? nat : NULL);
        cslot = cslot + 1 == STAGES ? 0 : cslot + 1;
        if (UP && !NAT && chain_end) {
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int i = 0; i < 4; i++) run[m][i] = run[m][i] + acc[m][i], acc[m][i] = 0.0f;
        }
        if (cons.j == nss - 1) {
            if (NAT) { /* chains in order; an empty chain (c >= nss) adds +0 as in variant 0 */
#pragma unroll
                for (int k = 0; k < (NAT ? 4 : 1); k++)
#pragma unroll
                    for (int m = 0; m < MT; m++)
#pragma unroll
                        for (int i = 0; i < 4; i++) run[m][i] = run[m][i] + nat[k][m][i], nat[k][m][i] = 0.0f;
            }
            if (UP)
                finish(cons, run);
            else
                finish(cons, acc);
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[m][i] = 0.0f, run[m][i] = 0.0f;
        }
        advance(cons);
    }
    dsv4_cp_async_wait<0>();
}

/* Up, persistent: grid (blocks, 1, token chunks), W warps; dynamic shared memory f4_up_stream_smem(). */
template <int NT, int STAGES, int W, int MINB, bool NAT>
__global__ void __launch_bounds__(W * 32, MINB) fp4_up_stream_kernel(const __grid_constant__ dsv4_fp4_experts_params p)
{
    extern __shared__ __align__(16) unsigned char f4_smem[];
    const int warp = threadIdx.x >> 5, tok0 = blockIdx.z * F4_TOK;
    const int ntok = p.n_tok - tok0 < F4_TOK ? p.n_tok - tok0 : F4_TOK, pair0 = tok0 * p.k, n_pairs = ntok * p.k;
    const F4Tab T = f4_tab_carve(f4_smem, n_pairs);
    f4_tab_build(T, p.ids, pair0, n_pairs, f4_e_lo(p), f4_e_hi(p));
    unsigned char *ring = f4_smem + f4_tab_bytes(n_pairs) + (size_t)warp * STAGES * F4Stage<2, NT>::BYTES;
    f4_stream<true, 2, NT, STAGES, NAT>(p, T, pair0, ring, NULL, warp * gridDim.x + blockIdx.x, gridDim.x * W);
}

/* Down: grid (D/(16·MT), 1, token chunks), W warps; dynamic shared memory f4_down_stream_smem(). */
template <int MT, int NT, int STAGES, int W, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
    fp4_down_stream_kernel(const __grid_constant__ dsv4_fp4_experts_params p)
{
    extern __shared__ __align__(16) unsigned char f4_smem[];
    const int warp = threadIdx.x >> 5, tok0 = blockIdx.z * F4_TOK, R = 16 * MT, row0 = blockIdx.x * R;
    const int ntok = p.n_tok - tok0 < F4_TOK ? p.n_tok - tok0 : F4_TOK, pair0 = tok0 * p.k, n_pairs = ntok * p.k;
    const F4Tab T = f4_tab_carve(f4_smem, n_pairs);
    float *part = reinterpret_cast<float *>(f4_smem + f4_tab_bytes(n_pairs)); /* [n_pairs][R]; skipped pairs: 0 */
    for (int i = threadIdx.x; i < n_pairs * R; i += blockDim.x) part[i] = 0.0f;
    f4_tab_build(T, p.ids, pair0, n_pairs, f4_e_lo(p), f4_e_hi(p)); /* its barriers also order part's zeros */
    unsigned char *ring = reinterpret_cast<unsigned char *>(part + (size_t)n_pairs * R) +
                          (size_t)warp * STAGES * F4Stage<MT, NT>::BYTES;
    f4_stream<false, MT, NT, STAGES, false>(p, T, pair0, ring, part, warp, W);
    __syncthreads();
    for (int i = threadIdx.x; i < ntok * R; i += blockDim.x) {
        const int cl = i / R, r = i % R, row = row0 + r;
        float acc = 0.0f;
        for (int j = 0; j < p.k; j++) acc += part[(cl * p.k + j) * R + r];
        if (p.shared) acc = acc + p.shared[(size_t)(tok0 + cl) * p.shared_stride + row];
        p.out[(size_t)(tok0 + cl) * p.dim + row] = acc;
    }
}

/* The contract checks shared by every variant. */
static int f4_check(const dsv4_fp4_experts_params *p)
{
    DSV4_CHECK(p != NULL, "fp4_experts: params is NULL");
    DSV4_CHECK(p->n_tok >= 1 && p->k >= 1 && p->k <= F4_MAX_K, "fp4_experts: n_tok %d, k %d (1..%d)", p->n_tok, p->k,
               (int)F4_MAX_K);
    DSV4_CHECK(p->dim >= 32 && p->inter >= 32 && p->dim % 32 == 0 && p->inter % 32 == 0,
               "fp4_experts: dim %d, inter %d (multiples of 32)", p->dim, p->inter);
    DSV4_CHECK(p->x && p->ids && p->weights && p->w13 && p->s13 && p->w2 && p->s2 && p->h && p->out,
               "fp4_experts: NULL buffer");
    DSV4_CHECK(p->e_end == 0 || (p->e_begin >= 0 && p->e_end > p->e_begin), "fp4_experts: expert range [%d, %d)",
               p->e_begin, p->e_end);
    DSV4_CHECK(!p->shared || p->shared_stride >= p->dim, "fp4_experts: shared_stride %lld < dim %d",
               (long long)p->shared_stride, p->dim);
    DSV4_CHECK(dsv4_aligned16(p->x) && dsv4_aligned16(p->w13) && dsv4_aligned16(p->w2) && dsv4_aligned16(p->h),
               "fp4_experts: x, w13, w2 and h must be 16-byte aligned");
    if (dsv4_ceil_div(p->n_tok, F4_TOK) > 65535)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "fp4_experts: n_tok %d too large", p->n_tok);
    return 0;
}

/* Variant 0 (the first kernels, kept for A/B): the up half. */
static int f4_launch_up0(const dsv4_fp4_experts_params *p)
{
    const int chunks = dsv4_ceil_div(p->n_tok, F4_TOK);
    const int max_pairs = (p->n_tok < F4_TOK ? p->n_tok : F4_TOK) * p->k;
    const int slot_blocks = max_pairs < F4_UP_SLOT_BLOCKS ? max_pairs : F4_UP_SLOT_BLOCKS;
    const dim3 gu(p->inter / 16, slot_blocks, chunks);
    fp4_up_kernel<<<gu, F4_UP_WARPS * 32, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("fp4_up_kernel");
    return 0;
}

/* Variant 0: the down half. */
static int f4_launch_down0(const dsv4_fp4_experts_params *p)
{
    const size_t smem = f4_down_smem(p->n_tok, p->k);
    if (smem > 48 * 1024)
        DSV4_CUDA_CHECK(cudaFuncSetAttribute(fp4_down_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 gd(p->dim / 16, 1, dsv4_ceil_div(p->n_tok, F4_TOK));
    fp4_down_kernel<<<gd, F4_DOWN_WARPS * 32, smem, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("fp4_down_kernel");
    return 0;
}

/* ------------------------------------------------------------------------------------------------ variants */
/* The streamed variants the bench sweeps (bench_qweight --fp4-sweep); index 0 is the original pair above.
 * Shared memory per block: tables (~7 KB at 384 pairs) + W·STAGES·F4Stage::BYTES (3.5 KB at MT 2, NT 4)
 * [+ down's partials, n_pairs·16·MT·4 B]; weights in flight per warp: (STAGES-1)·MT KB. */
typedef struct f4_variant {
    const void *fn;
    int warps, stages, stage_bytes, mt, blocks_per_sm; /* blocks_per_sm: up's persistent grid target */
    const char *name;
} f4_variant;

#define F4_UP(NT, S, W, B, NAT)                                                                                   \
    {(const void *)fp4_up_stream_kernel<NT, S, W, B, NAT>, W, S, F4Stage<2, NT>::BYTES, 2, B,                      \
     "up NT" #NT " S" #S " W" #W " B" #B " nat" #NAT}
#define F4_DOWN(MT, NT, S, W, B)                                                                                  \
    {(const void *)fp4_down_stream_kernel<MT, NT, S, W, B>, W, S, F4Stage<MT, NT>::BYTES, MT, B,                   \
     "down MT" #MT " NT" #NT " S" #S " W" #W}
static const f4_variant f4_up_variants[] = {
    {NULL, F4_UP_WARPS, 0, 0, 2, 3, "up v0 (original)"},
    F4_UP(4, 6, 8, 1, false), /* 80 KB of weights in flight per SM */
    F4_UP(4, 6, 4, 2, false), /* the same bytes in flight, two blocks */
    F4_UP(4, 3, 16, 1, false), /* more warps for issue, shallower */
    F4_UP(4, 8, 6, 1, false), /* deepest */
    F4_UP(8, 4, 8, 1, false), /* 8 tokens a pass (fewer passes for busy experts) */
    F4_UP(4, 6, 8, 1, true),  /* variant 1 in column order */
    F4_UP(4, 6, 4, 2, true),  /* variant 2 in column order */
};
static const f4_variant f4_down_variants[] = {
    {NULL, F4_DOWN_WARPS, 0, 0, 1, 2, "down v0 (original)"},
    F4_DOWN(2, 4, 5, 8, 1), /* 32-row slices: 128 blocks, 64 KB in flight per SM */
    F4_DOWN(1, 4, 4, 8, 2), /* 16-row slices, two blocks per SM: 48 KB */
    F4_DOWN(2, 4, 3, 12, 1), /* more warps, shallower */
    F4_DOWN(2, 4, 7, 6, 1), /* deepest: 72 KB */
    F4_DOWN(1, 4, 5, 6, 2), /* 16-row slices, 6 warps x 2 blocks */
    F4_DOWN(2, 8, 4, 8, 1), /* 8 tokens a pass */
    F4_DOWN(1, 4, 6, 4, 3), /* 16-row slices, 4 warps x 3 blocks, deep */
};
enum {
    F4_N_UP = sizeof(f4_up_variants) / sizeof(f4_up_variants[0]),
    F4_N_DOWN = sizeof(f4_down_variants) / sizeof(f4_down_variants[0]),
    F4_DEFAULT_UP = 1,  /* the defaults: to be set from the H200 sweep */
    F4_DEFAULT_DOWN = 1,
};

/* Per device, once: SM count and the opt-in shared memory per block (cudaDeviceGetAttribute is not free). */
static int f4_device_limits(int *sms, int *smem_optin)
{
    enum { MAX_DEV = 64 };
    static int cached_sms[MAX_DEV], cached_smem[MAX_DEV];
    int dev = 0;
    DSV4_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= MAX_DEV) return dsv4_error(DSV4_ERR_UNSUPPORTED, "fp4_experts: device %d", dev);
    if (!cached_sms[dev]) {
        int s = 0, m = 0;
        DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&s, cudaDevAttrMultiProcessorCount, dev));
        DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&m, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        cached_smem[dev] = m;
        cached_sms[dev] = s;
    }
    *sms = cached_sms[dev], *smem_optin = cached_smem[dev];
    return 0;
}

static int f4_max_pairs(const dsv4_fp4_experts_params *p)
{
    return (p->n_tok < F4_TOK ? p->n_tok : F4_TOK) * p->k;
}
static size_t f4_variant_smem(const dsv4_fp4_experts_params *p, const f4_variant *v, int down)
{
    const int pairs = f4_max_pairs(p);
    return f4_tab_bytes(pairs) + (down ? (size_t)pairs * 16 * v->mt * sizeof(float) : 0) +
           (size_t)v->warps * v->stages * v->stage_bytes;
}
/* A streamed variant runs when its shared memory fits and the scale arrays allow the word copies. */
static int f4_variant_fits(const dsv4_fp4_experts_params *p, const f4_variant *v, int down)
{
    int sms, optin;
    if (!v->fn || f4_device_limits(&sms, &optin)) return 0;
    return f4_variant_smem(p, v, down) <= (size_t)optin && ((uintptr_t)p->s13 & 3) == 0 &&
           ((uintptr_t)p->s2 & 3) == 0;
}

static int f4_launch_stream(const dsv4_fp4_experts_params *p, const f4_variant *v, int down)
{
    int sms, optin;
    int rc = f4_device_limits(&sms, &optin);
    if (rc) return rc;
    const size_t smem = f4_variant_smem(p, v, down);
    if (smem > 48 * 1024)
        DSV4_CUDA_CHECK(cudaFuncSetAttribute(v->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int chunks = dsv4_ceil_div(p->n_tok, F4_TOK);
    dim3 grid(p->dim / (16 * v->mt), 1, chunks);
    if (!down) {
        /* persistent: as many blocks as are resident (any grid is correct; this one has no tail wave) */
        int per_sm = 0;
        DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v->fn, v->warps * 32, smem));
        if (per_sm > v->blocks_per_sm) per_sm = v->blocks_per_sm;
        grid = dim3(sms * (per_sm > 0 ? per_sm : 1), 1, chunks);
    }
    void *args[] = {(void *)p};
    DSV4_CUDA_CHECK(cudaLaunchKernel(v->fn, grid, dim3(v->warps * 32), args, smem, p->stream));
    DSV4_LAUNCH_CHECK(down ? "fp4_down_stream_kernel" : "fp4_up_stream_kernel");
    return 0;
}

static int f4_run(const dsv4_fp4_experts_params *p, int up, int down)
{
    int rc = f4_check(p);
    if (rc) return rc;
    if (up >= F4_N_UP || down >= F4_N_DOWN)
        return dsv4_error(DSV4_ERR_USAGE, "fp4_experts: variant up %d down %d (of %d, %d)", up, down, (int)F4_N_UP,
                          (int)F4_N_DOWN);
    if (up > 0 && !f4_variant_fits(p, &f4_up_variants[up], 0))
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "fp4_experts: %s does not fit here", f4_up_variants[up].name);
    if (down > 0 && !f4_variant_fits(p, &f4_down_variants[down], 1))
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "fp4_experts: %s does not fit here", f4_down_variants[down].name);
    if (up == 0) rc = f4_launch_up0(p);
    if (up > 0) rc = f4_launch_stream(p, &f4_up_variants[up], 0);
    if (rc) return rc;
    if (down == 0) rc = f4_launch_down0(p);
    if (down > 0) rc = f4_launch_stream(p, &f4_down_variants[down], 1);
    return rc;
}

int dsv4_opt_fp4_experts(const dsv4_fp4_experts_params *p)
{
    int rc = f4_check(p);
    if (rc) return rc;
    /* the default variants, or the original kernels where they do not fit (shared memory of sm_120, k = 16) */
    const int up = f4_variant_fits(p, &f4_up_variants[F4_DEFAULT_UP], 0) ? F4_DEFAULT_UP : 0;
    const int down = f4_variant_fits(p, &f4_down_variants[F4_DEFAULT_DOWN], 1) ? F4_DEFAULT_DOWN : 0;
    return f4_run(p, up, down);
}

int dsv4_opt_fp4_experts_config(const dsv4_fp4_experts_params *p, int up, int down)
{
    return f4_run(p, up, down);
}

const char *dsv4_opt_fp4_experts_variant(int down, int v)
{
    if (v < 0) return NULL;
    if (down) return v < F4_N_DOWN ? f4_down_variants[v].name : NULL;
    return v < F4_N_UP ? f4_up_variants[v].name : NULL;
}
