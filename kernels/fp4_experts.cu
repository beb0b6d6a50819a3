/* fp4_experts.cu - the routed experts of C tokens with FP4 e2m1 weights (two codes per byte, low nibble = even
 * column) and one e8m0 scale per 32 input columns (model-spec §2, §3, §10): the contract of dsv4_opt_moe_experts
 * (moe.cuh) - h[c, j] = silu(min(x·W1ᵀ, λ)) · clamp(x·W3ᵀ, ±λ) · weight[c, j] (bf16), out[c] = Σ_j h[c, j]·W2ᵀ
 * (j ascending, fp32) + shared[c] - but each touched expert's bytes are read ONCE for all its tokens.
 *
 * Grouping without a host round trip or workspace (graph-capturable): every block rebuilds, in shared memory, the
 * set of experts its chunk of <= 64 tokens touches (a bitmap of ids) and the pairs of the expert it works on (a
 * ballot scan in pair order, so the order is fixed).
 *  - up: grid (I/64 row groups, min(pairs, 128) slot blocks, token chunk). Slot block y takes the touched experts
 *    of rank y, y + 128, ... in id order. Each of the 4 warps owns 16 W1 rows and the 16 matching W3 rows (two
 *    m-tiles) over all of D against 8 tokens (one n-tile) per pass, finds its experts' pairs itself and applies
 *    the SwiGLU to its own accumulators: no barrier after the bitmap.
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
#include "fp4_layout.h"

enum {
    F4_TOK = 64,      /* tokens per chunk (grid.z) */
    F4_MAX_K = 16,
    F4_MAX_PAIRS = F4_TOK * F4_MAX_K,
    F4_MAX_E = 1024,  /* bitmap size: expert ids must be below this */
    F4_UP_WARPS = 4,
    F4_DOWN_WARPS = 8,
    F4_SS = 128,      /* columns per super-step: 4 lanes x 32 codes */
    F4_UP_DEPTH = 2,  /* super-steps per weight batch, up (2 m-tiles) and down (1): deeper batches, rings of */
    F4_DOWN_DEPTH = 2, /* single super-steps, L2 prefetch ahead and carrying a batch across experts were all slower
                        * on the H200 (docs/kernels.md) */
    F4_UP_SLOT_BLOCKS = 128 /* blocks along the expert slots; each loops over slots y, y + 128, ... */
};

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

/* One warp: the touched experts before and up to this lane's bitmap word, c its popcount (an inclusive scan). */
static __device__ int f4_warp_inclusive_count(int c)
{
    const int lane = threadIdx.x & 31;
    int incl = c;
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    return incl;
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

/* The multiplies of one super-step: 8 mma steps per m-tile over this lane's 32 codes of each row; TWO: some
 * lanes' scales need the second multiply m2 (per lane: 0 where not). */
template <int MT, bool TWO>
static __device__ __forceinline__ void f4_superstep(float acc[MT][4], const uint4 (&w)[MT][2],
                                                    const uint32_t (&m1)[MT][2], const uint32_t (&m2)[MT][2],
                                                    const uint32_t X[16])
{
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const int q = s >> 1, u = s & 1;
        /* columns 4u..4u+3 of word q: pairs 2u (k 2t, 2t+1) and 2u+1 (k 2t+8, 2t+9), the activations' pairs */
        const uint32_t bb[2] = {X[4 * q + 2 * u], X[4 * q + 2 * u + 1]};
#pragma unroll
        for (int m = 0; m < MT; m++) {
            uint32_t a[4];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint32_t wd = qw_word(w[m][r], q);
                uint32_t lo = dsv4_fp4_pair_repacked(wd, 2 * u);
                uint32_t hi = dsv4_fp4_pair_repacked(wd, 2 * u + 1);
                lo = qw_bf16x2_mul(lo, m1[m][r]);
                hi = qw_bf16x2_mul(hi, m1[m][r]);
                if (TWO && m2[m][r]) {
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

/* The weight registers of one batch of DEPTH super-steps (codes and scale bytes). */
template <int MT, int DEPTH> struct f4_wbatch {
    uint4 w[DEPTH][MT][2];
    uint8_t s[DEPTH][MT][2];
};

/* One warp: loads batch b (super-steps b, b + stride, ... DEPTH of them) of the rows wrow / srow into nb. */
template <int MT, int DEPTH>
static __device__ __forceinline__ void f4_load_batch(f4_wbatch<MT, DEPTH> &nb, const uint8_t *const wrow[MT][2],
                                                     const uint8_t *const srow[MT][2], int K, int b, int stride)
{
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
        const int col = (b + d * stride) * F4_SS + 32 * t;
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                if (col < K) {
                    nb.w[d][m][r] = qw_ld_stream(wrow[m][r] + col / 2);
                    nb.s[d][m][r] = srow[m][r][col / 32];
                } else {
                    nb.w[d][m][r] = make_uint4(0, 0, 0, 0);
                    nb.s[d][m][r] = 0;
                }
            }
    }
}

/* One warp: acc[m] += W_m[16 rows, cols] · x[8 tokens, cols]ᵀ over super-steps ss0, ss0 + stride, ... of K columns.
 * wrow[m][r] / srow[m][r]: the packed codes / e8m0 scales of row g (r = 0) and g + 8 (r = 1) of m-tile m; xrow: the
 * bf16 row of this lane's token (n index g), or NULL for a padding token. The weights come in batches of DEPTH
 * super-steps, the next batch loaded while the current one is multiplied, so up to 2·DEPTH·MT KB are in flight
 * per warp (what keeps HBM busy with few warps per SM). nxt: the batch registers; preloaded: the caller has already
 * loaded the first batch into it (f4_load_batch(nxt, wrow, srow, K, ss0, stride)). */
template <int MT, int DEPTH, bool X_AHEAD>
static __device__ __forceinline__ void f4_warp_tile(float acc[MT][4], const uint8_t *const wrow[MT][2],
                                                    const uint8_t *const srow[MT][2], const uint16_t *xrow, int K,
                                                    int ss0, int stride, f4_wbatch<MT, DEPTH> &nxt, bool preloaded)
{
    const int t = threadIdx.x & 3, nss = (K + F4_SS - 1) / F4_SS;
    /* activations (L2/L1 hits): one super-step ahead within a weight batch; with X_AHEAD also across batches, so
     * their latency hides behind a super-step's multiplies instead of stalling the start of every batch (down; in
     * up the 16 registers it keeps live through the weight loads would spill) */
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
    if (X_AHEAD) load_x(Xn, ss0);
    if (!preloaded && ss0 < nss) f4_load_batch<MT, DEPTH>(nxt, wrow, srow, K, ss0, stride);
    for (int b = ss0; b < nss; b += DEPTH * stride) {
        const f4_wbatch<MT, DEPTH> cur = nxt;
        if (b + DEPTH * stride < nss) f4_load_batch<MT, DEPTH>(nxt, wrow, srow, K, b + DEPTH * stride, stride);
        if (!X_AHEAD) load_x(Xn, b);
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            if (b + d * stride >= nss) break;
            uint32_t X[16];
#pragma unroll
            for (int i = 0; i < 16; i++) X[i] = Xn[i];
            if (X_AHEAD || d + 1 < DEPTH) load_x(Xn, b + (d + 1) * stride); /* the next super-step's */
            /* Scales above 2 (e8m0 bytes > 128) need a second multiply. They are rare, so when no lane has one
             * the warp runs a copy of the multiplies without it: no predicated multiplies on the common path
             * (A/B on the H200 at C = 64: up 758 -> 680 us, down 416 -> 388 us). */
            bool two = false;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) two |= cur.s[d][m][r] > 128;
            uint32_t m1[MT][2], m2[MT][2];
            if (__any_sync(0xffffffffu, two)) {
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int r = 0; r < 2; r++) qw_e8m0_mults(cur.s[d][m][r], &m1[m][r], &m2[m][r]);
                f4_superstep<MT, true>(acc, cur.w[d], m1, m2, X);
            } else {
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int r = 0; r < 2; r++) m1[m][r] = qw_e8m0_mult1(cur.s[d][m][r]);
                f4_superstep<MT, false>(acc, cur.w[d], m1, m1, X);
            }
        }
    }
}

/* Programmatic dependent launch (sm_90 and later; the down kernel is launched with the attribute): the up kernel
 * lets the down kernel's blocks start once all its own blocks run, and the down kernel waits for the up kernel's
 * completion (its h, and everything before it) only where it first reads h; no-ops where not launched so. */
static __device__ __forceinline__ void f4_allow_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n");
#endif
}
static __device__ __forceinline__ void f4_wait_prerequisites()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* grid (I/(16·F4_UP_WARPS), slot blocks, token chunks), F4_UP_WARPS warps. Warp w owns rows m0 = 16·(F4_UP_WARPS·x
 * + w) of W1 and W3 over the whole of D, so it needs no other warp after the block's bitmap: it finds the expert of
 * each of its slots (y, y + gridDim.y, ...) and that expert's pairs itself, in its own list, and writes h from its
 * own accumulators. (The earlier split of D over the warps, summed through shared memory by warp 0, stalled the
 * block on barriers for ~20% of its cycles: ncu, H200, C = 64.) */
__global__ void __launch_bounds__(F4_UP_WARPS * 32, 3) fp4_up_kernel(const __grid_constant__ dsv4_fp4_experts_params p)
{
    __shared__ uint32_t bits[F4_MAX_E / 32];
    __shared__ int32_t sids[F4_MAX_PAIRS];
    __shared__ int16_t lists[F4_UP_WARPS][F4_MAX_PAIRS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tok0 = blockIdx.z * F4_TOK, ntok = p.n_tok - tok0 < F4_TOK ? p.n_tok - tok0 : F4_TOK;
    const int pair0 = tok0 * p.k, n_pairs = ntok * p.k, D = p.dim, I = p.inter;
    const int m0 = (blockIdx.x * F4_UP_WARPS + warp) * 16;
    int16_t *list = lists[warp];
    f4_allow_dependents();
    f4_touched_bitmap(bits, sids, p.ids, pair0, n_pairs, f4_e_lo(p), f4_e_hi(p));
    if (m0 >= I) return; /* a tail warp (I is a multiple of 16, so a live warp has all 16 rows) */
    const uint32_t word = bits[lane];
    const int c = __popc(word), incl = f4_warp_inclusive_count(c);
    const int excl = incl - c, n_e = __shfl_sync(0xffffffffu, incl, 31);
    for (int slot = blockIdx.y; slot < n_e; slot += gridDim.y) {
        /* the expert of rank `slot` in id order: the lane whose bitmap word holds it */
        int e = -1;
        if (slot >= excl && slot < incl) {
            uint32_t w = word;
            for (int n = slot - excl; n > 0; n--) w &= w - 1; /* drop the lower set bits */
            e = lane * 32 + __ffs(w) - 1;
        }
        e = __shfl_sync(0xffffffffu, e, __ffs(__ballot_sync(0xffffffffu, e >= 0)) - 1);
        const int cnt = f4_warp_pairs_of(list, sids, n_pairs, e);
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
            const uint16_t *xrow = idx < cnt ? p.x + (size_t)((pair0 + list[idx]) / p.k) * D : NULL;
            float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
            f4_wbatch<2, F4_UP_DEPTH> batch;
            f4_warp_tile<2, F4_UP_DEPTH, false>(acc, wrow, srow, xrow, D, 0, 1, batch, false);
#pragma unroll
            for (int i = 0; i < 4; i++) { /* acc[m][i]: row g (+8 for i >= 2), token slot 2t + (i & 1) */
                const int row = m0 + g + (i >= 2 ? 8 : 0), slot_i = pass * 8 + 2 * t + (i & 1);
                if (slot_i >= cnt) continue;
                const int pair = pair0 + list[slot_i];
                const float gv = fminf(acc[0][i], p.limit), uv = fminf(fmaxf(acc[1][i], -p.limit), p.limit);
                const float h = gv / (1.0f + expf(-gv)) * uv * p.weights[pair];
                p.h[(size_t)pair * I + row] = dsv4_f32_to_bf16_bits(h);
            }
        }
        __syncwarp(); /* the list is rebuilt for the next slot */
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
        const int c = __popc(word), incl = f4_warp_inclusive_count(c);
        for (int n = incl - c; word; n++, word &= word - 1) elist[n] = (int16_t)(lane * 32 + __ffs(word) - 1);
        if (lane == 31) n_e = incl;
    }
    __syncthreads();
    auto rows_of = [&](int e, const uint8_t *wrow[1][2], const uint8_t *srow[1][2]) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const size_t row = (size_t)(e - f4_e_lo(p)) * D + row0 + g + 8 * r;
            wrow[0][r] = p.w2 + row * (I / 2);
            srow[0][r] = p.s2 + row * (I / 32);
        }
    };
    /* the weights do not depend on the up kernel: the first batch is loaded before waiting for its h (the first
     * expert's first pass takes it: every listed expert has at least one pair, so that pass runs) */
    f4_wbatch<1, F4_DOWN_DEPTH> batch;
    bool preloaded = false;
    if (warp < n_e) {
        const uint8_t *wrow[1][2], *srow[1][2];
        rows_of(elist[warp], wrow, srow);
        f4_load_batch<1, F4_DOWN_DEPTH>(batch, wrow, srow, I, 0, 1);
        preloaded = true;
    }
    f4_wait_prerequisites();
    for (int ei = warp; ei < n_e; ei += F4_DOWN_WARPS) {
        const int e = elist[ei];
        const int cnt = f4_warp_pairs_of(mylist, sids, n_pairs, e);
        const uint8_t *wrow[1][2], *srow[1][2];
        rows_of(e, wrow, srow);
        for (int pass = 0; pass * 8 < cnt; pass++) {
            const int idx = pass * 8 + g;
            const uint16_t *hrow = idx < cnt ? p.h + (size_t)(pair0 + mylist[idx]) * I : NULL;
            float acc[1][4] = {{0, 0, 0, 0}};
            f4_warp_tile<1, F4_DOWN_DEPTH, true>(acc, wrow, srow, hrow, I, 0, 1, batch, preloaded);
            preloaded = false;
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

__global__ void fp4_repack_kernel(uint32_t *w, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = dsv4_fp4_repack_word(w[i]);
}

int dsv4_opt_fp4_repack(uint8_t *codes, size_t n_bytes, cudaStream_t stream)
{
    DSV4_CHECK(codes != NULL && n_bytes % 4 == 0 && ((uintptr_t)codes & 3) == 0,
               "fp4_repack: %zu bytes at %p (want a 4-aligned buffer of whole 32-bit words)", n_bytes, (void *)codes);
    const size_t n = n_bytes / 4;
    if (n == 0) return 0;
    const size_t blocks = (n + 255) / 256;
    fp4_repack_kernel<<<(unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16), 256, 0, stream>>>(
        reinterpret_cast<uint32_t *>(codes), n);
    DSV4_LAUNCH_CHECK("fp4_repack_kernel");
    return 0;
}

int dsv4_opt_fp4_experts(const dsv4_fp4_experts_params *p)
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
    const int chunks = dsv4_ceil_div(p->n_tok, F4_TOK);
    if (chunks > 65535) return dsv4_error(DSV4_ERR_UNSUPPORTED, "fp4_experts: n_tok %d too large", p->n_tok);
    const int max_pairs = (p->n_tok < F4_TOK ? p->n_tok : F4_TOK) * p->k;
    const int slot_blocks = max_pairs < F4_UP_SLOT_BLOCKS ? max_pairs : F4_UP_SLOT_BLOCKS;
    const dim3 gu(dsv4_ceil_div(p->inter, 16 * F4_UP_WARPS), slot_blocks, chunks);
    fp4_up_kernel<<<gu, F4_UP_WARPS * 32, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("fp4_up_kernel");
    const size_t smem = f4_down_smem(p->n_tok, p->k);
    if (smem > 48 * 1024)
        DSV4_CUDA_CHECK(cudaFuncSetAttribute(fp4_down_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* the down kernel with programmatic dependent launch: its set-up and first weight loads overlap the up
     * kernel's last blocks (H200, C = 64: 919-924 -> 915 us) */
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(p->dim / 16, 1, chunks);
    cfg.blockDim = dim3(F4_DOWN_WARPS * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = p->stream;
    cudaLaunchAttribute pdl;
    pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &pdl;
    cfg.numAttrs = 1;
    DSV4_CUDA_CHECK(cudaLaunchKernelEx(&cfg, fp4_down_kernel, *p));
    DSV4_LAUNCH_CHECK("fp4_down_kernel");
    return 0;
}
