/* grouped_experts.cuh - the routed experts of C tokens, each touched expert's weights read ONCE for all its tokens
 * of a chunk, for any weight format (fp4_experts.cu: FP4 e2m1 codes with e8m0 scales; moe.cu: bf16). The contract
 * is dsv4_opt_moe_experts's (moe.cuh): h[c, j] = silu(min(x·W1ᵀ, λ)) · clamp(x·W3ᵀ, ±λ) · weight[c, j] (bf16),
 * out[c] = Σ_j h[c, j]·W2ᵀ (j ascending, fp32) + shared[c].
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
 * A weight format F supplies the multiplies; the kernels here only group. F has:
 *   Params (the struct of the format's entry point, with the fields of dsv4_moe_experts_params used here);
 *   UP_DEPTH, DOWN_DEPTH (weight super-steps per register batch), UP_MIN_BLOCKS, DOWN_MIN_BLOCKS (launch bounds);
 *   UP_DEPTH_FEW, UP_MIN_BLOCKS_FEW: the up kernel's depth and bound for a grid the GPU holds in one wave at
 *     UP_MIN_BLOCKS_FEW blocks per SM (C = 1 in Flash: 192 blocks), where fewer warps per SM need more bytes in
 *     flight each; equal to UP_DEPTH / UP_MIN_BLOCKS where the format gains nothing from it. The depth only
 *     groups the loads: the multiplies and their order are the same, so both variants give the same bits;
 *   Rows<MT>: where a warp's rows g and g + 8 of each of its MT m-tiles start, set by w13_row / w2_row from the
 *     row index in the held experts' stacked matrix ([E_held · 2I, D] and [E_held · D, I]);
 *   Batch<MT, DEPTH> and load_batch: the registers of one weight batch;
 *   warp_tile<MT, DEPTH, X_AHEAD>: acc[m] += W_m[16 rows, 0..K) · x[8 tokens, 0..K)ᵀ, xrow the bf16 row of this
 *     lane's token (n index g) or NULL for a padding token; `preloaded`: the first batch is already in `nxt`.
 * Quiet traps: expert ids must lie in [0, 1024) (others are skipped and their pairs contribute 0); a token with the
 * same expert twice has two pairs, both computed. Expert parallel (e_end > 0, --gpus N): only experts
 * [e_begin, e_end) are held (at index e - e_begin); pairs of other experts are skipped and add 0.
 */
#ifndef DSV4_KERNELS_GROUPED_EXPERTS_CUH
#define DSV4_KERNELS_GROUPED_EXPERTS_CUH

#include "opt_common.cuh"

enum {
    GE_TOK = 64,      /* tokens per chunk (grid.z) */
    GE_MAX_K = 16,
    GE_MAX_PAIRS = GE_TOK * GE_MAX_K,
    GE_MAX_E = 1024,  /* bitmap size: expert ids must be below this */
    GE_UP_WARPS = 4,
    GE_DOWN_WARPS = 8,
    GE_UP_SLOT_BLOCKS = 128 /* blocks along the expert slots; each loops over slots y, y + 128, ... */
};

/* Copies the ids of pairs [pair0, pair0 + n_pairs) into sids (shared: the pair scans below read them many times)
 * and builds the bitmap of the experts in [e_lo, e_hi) (within [0, GE_MAX_E)) they touch into bits[GE_MAX_E / 32].
 * All threads; ends with a __syncthreads. */
static __device__ void ge_touched_bitmap(uint32_t *bits, int32_t *sids, const int32_t *ids, int pair0, int n_pairs,
                                         int e_lo, int e_hi)
{
    for (int i = threadIdx.x; i < GE_MAX_E / 32; i += blockDim.x) bits[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        const int e = ids[pair0 + i];
        sids[i] = e;
        if (e >= e_lo && e < e_hi) atomicOr(&bits[e >> 5], 1u << (e & 31));
    }
    __syncthreads();
}

/* The experts this call holds (expert parallel: [e_begin, e_end), stored at index e - e_begin; e_end 0: all). */
template <class P> static __device__ int ge_e_lo(const P &p) { return p.e_end ? p.e_begin : 0; }
template <class P> static __device__ int ge_e_hi(const P &p)
{
    return p.e_end && p.e_end < GE_MAX_E ? p.e_end : GE_MAX_E;
}

/* One warp: the touched experts before and up to this lane's bitmap word, c its popcount (an inclusive scan). */
static __device__ int ge_warp_inclusive_count(int c)
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
template <typename T> static __device__ int ge_warp_pairs_of(T *list, const int32_t *sids, int n_pairs, int e)
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

/* Programmatic dependent launch (sm_90 and later; the down kernel is launched with the attribute): the up kernel
 * lets the down kernel's blocks start once all its own blocks run, and the down kernel waits for the up kernel's
 * completion (its h, and everything before it) only where it first reads h; no-ops where not launched so. */
static __device__ __forceinline__ void ge_allow_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n");
#endif
}
static __device__ __forceinline__ void ge_wait_prerequisites()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* grid (I/(16·GE_UP_WARPS), slot blocks, token chunks), GE_UP_WARPS warps. Warp w owns rows m0 = 16·(GE_UP_WARPS·x
 * + w) of W1 and W3 over the whole of D, so it needs no other warp after the block's bitmap: it finds the expert of
 * each of its slots (y, y + gridDim.y, ...) and that expert's pairs itself, in its own list, and writes h from its
 * own accumulators. (The earlier split of D over the warps, summed through shared memory by warp 0, stalled the
 * block on barriers for ~20% of its cycles: ncu, H200, C = 64, FP4.) */
template <class F, int DEPTH, int MIN_BLOCKS>
__global__ void __launch_bounds__(GE_UP_WARPS * 32, MIN_BLOCKS)
    ge_up_kernel(const __grid_constant__ typename F::Params p)
{
    __shared__ uint32_t bits[GE_MAX_E / 32];
    __shared__ int32_t sids[GE_MAX_PAIRS];
    __shared__ int16_t lists[GE_UP_WARPS][GE_MAX_PAIRS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tok0 = blockIdx.z * GE_TOK, ntok = p.n_tok - tok0 < GE_TOK ? p.n_tok - tok0 : GE_TOK;
    const int pair0 = tok0 * p.k, n_pairs = ntok * p.k, D = p.dim, I = p.inter;
    const int m0 = (blockIdx.x * GE_UP_WARPS + warp) * 16;
    int16_t *list = lists[warp];
    ge_allow_dependents();
    ge_touched_bitmap(bits, sids, p.ids, pair0, n_pairs, ge_e_lo(p), ge_e_hi(p));
    if (m0 >= I) return; /* a tail warp (I is a multiple of 16, so a live warp has all 16 rows) */
    const uint32_t word = bits[lane];
    const int c = __popc(word), incl = ge_warp_inclusive_count(c);
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
        const int cnt = ge_warp_pairs_of(list, sids, n_pairs, e);
        const size_t el = (size_t)(e - ge_e_lo(p)); /* the held expert's index */
        typename F::template Rows<2> rows;
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) F::w13_row(rows, m, r, p, el * 2 * I + (size_t)m * I + m0 + g + 8 * r);
        for (int pass = 0; pass * 8 < cnt; pass++) {
            const int idx = pass * 8 + g;
            const uint16_t *xrow = idx < cnt ? p.x + (size_t)((pair0 + list[idx]) / p.k) * D : NULL;
            float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
            typename F::template Batch<2, DEPTH> batch;
            F::template warp_tile<2, DEPTH, false>(acc, rows, xrow, D, batch, false);
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

/* grid (D/16, 1, token chunks), GE_DOWN_WARPS warps; dynamic shared memory ge_down_smem(). */
template <class F>
__global__ void __launch_bounds__(GE_DOWN_WARPS * 32, F::DOWN_MIN_BLOCKS)
    ge_down_kernel(const __grid_constant__ typename F::Params p)
{
    __shared__ uint32_t bits[GE_MAX_E / 32];
    __shared__ int16_t elist[GE_MAX_E];
    __shared__ int32_t sids[GE_MAX_PAIRS];
    __shared__ int n_e;
    extern __shared__ float part[]; /* [n_pairs][16] f32, then int16 lists [GE_DOWN_WARPS][n_pairs] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tok0 = blockIdx.z * GE_TOK, ntok = p.n_tok - tok0 < GE_TOK ? p.n_tok - tok0 : GE_TOK;
    const int pair0 = tok0 * p.k, n_pairs = ntok * p.k, D = p.dim, I = p.inter, row0 = blockIdx.x * 16;
    int16_t *mylist = reinterpret_cast<int16_t *>(part + (size_t)n_pairs * 16) + (size_t)warp * n_pairs;
    for (int i = threadIdx.x; i < n_pairs * 16; i += blockDim.x) part[i] = 0.0f;
    ge_touched_bitmap(bits, sids, p.ids, pair0, n_pairs, ge_e_lo(p), ge_e_hi(p));
    if (warp == 0) {
        uint32_t word = bits[lane];
        const int c = __popc(word), incl = ge_warp_inclusive_count(c);
        for (int n = incl - c; word; n++, word &= word - 1) elist[n] = (int16_t)(lane * 32 + __ffs(word) - 1);
        if (lane == 31) n_e = incl;
    }
    __syncthreads();
    auto rows_of = [&](int e, typename F::template Rows<1> &rows) {
#pragma unroll
        for (int r = 0; r < 2; r++) F::w2_row(rows, 0, r, p, (size_t)(e - ge_e_lo(p)) * D + row0 + g + 8 * r);
    };
    /* the weights do not depend on the up kernel: the first batch is loaded before waiting for its h (the first
     * expert's first pass takes it: every listed expert has at least one pair, so that pass runs) */
    typename F::template Batch<1, F::DOWN_DEPTH> batch;
    bool preloaded = false;
    if (warp < n_e) {
        typename F::template Rows<1> rows;
        rows_of(elist[warp], rows);
        F::template load_batch<1, F::DOWN_DEPTH>(batch, rows, I, 0);
        preloaded = true;
    }
    ge_wait_prerequisites();
    for (int ei = warp; ei < n_e; ei += GE_DOWN_WARPS) {
        const int e = elist[ei];
        const int cnt = ge_warp_pairs_of(mylist, sids, n_pairs, e);
        typename F::template Rows<1> rows;
        rows_of(e, rows);
        for (int pass = 0; pass * 8 < cnt; pass++) {
            const int idx = pass * 8 + g;
            const uint16_t *hrow = idx < cnt ? p.h + (size_t)(pair0 + mylist[idx]) * I : NULL;
            float acc[1][4] = {{0, 0, 0, 0}};
            F::template warp_tile<1, F::DOWN_DEPTH, true>(acc, rows, hrow, I, batch, preloaded);
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

static inline size_t ge_down_smem(int n_tok, int k)
{
    const size_t pairs = (size_t)(n_tok < GE_TOK ? n_tok : GE_TOK) * k;
    return pairs * 16 * sizeof(float) + (size_t)GE_DOWN_WARPS * pairs * sizeof(int16_t);
}

/* Checks what the grouping needs (the format checks its own shapes and buffers first: dim and inter multiples
 * of 16, 16-byte aligned rows) and launches up, then down with programmatic dependent launch: its set-up and
 * first weight loads overlap the up kernel's last blocks (H200, C = 64, FP4: 919-924 -> 915 us). The up kernel's
 * variant follows the grid's size alone (the same for every launch of a shape, so graphs replay what eager runs
 * ran); a grid of slot blocks counts blocks whose slots no expert fills, so it may take the default variant
 * where the few-blocks one would fit. */
template <class F> static int ge_launch(const char *name, const typename F::Params &p)
{
    DSV4_CHECK(p.k >= 1 && p.k <= GE_MAX_K, "%s: k %d (1..%d)", name, p.k, (int)GE_MAX_K);
    DSV4_CHECK(p.e_end == 0 || (p.e_begin >= 0 && p.e_end > p.e_begin), "%s: expert range [%d, %d)", name,
               p.e_begin, p.e_end);
    DSV4_CHECK(!p.shared || p.shared_stride >= p.dim, "%s: shared_stride %lld < dim %d", name,
               (long long)p.shared_stride, p.dim);
    const int chunks = dsv4_ceil_div(p.n_tok, GE_TOK);
    if (chunks > 65535) return dsv4_error(DSV4_ERR_UNSUPPORTED, "%s: n_tok %d too large", name, p.n_tok);
    const int max_pairs = (p.n_tok < GE_TOK ? p.n_tok : GE_TOK) * p.k;
    const int slot_blocks = max_pairs < GE_UP_SLOT_BLOCKS ? max_pairs : GE_UP_SLOT_BLOCKS;
    const dim3 gu(dsv4_ceil_div(p.inter, 16 * GE_UP_WARPS), slot_blocks, chunks);
    bool few = false;
    if (F::UP_DEPTH_FEW != F::UP_DEPTH) {
        int dev = 0, sms = 0;
        DSV4_CUDA_CHECK(cudaGetDevice(&dev));
        DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        few = (long long)gu.x * gu.y * gu.z <= (long long)F::UP_MIN_BLOCKS_FEW * sms;
    }
    if (few)
        ge_up_kernel<F, F::UP_DEPTH_FEW, F::UP_MIN_BLOCKS_FEW><<<gu, GE_UP_WARPS * 32, 0, p.stream>>>(p);
    else
        ge_up_kernel<F, F::UP_DEPTH, F::UP_MIN_BLOCKS><<<gu, GE_UP_WARPS * 32, 0, p.stream>>>(p);
    DSV4_LAUNCH_CHECK("ge_up_kernel");
    const size_t smem = ge_down_smem(p.n_tok, p.k);
    if (smem > 48 * 1024)
        DSV4_CUDA_CHECK(cudaFuncSetAttribute(ge_down_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(p.dim / 16, 1, chunks);
    cfg.blockDim = dim3(GE_DOWN_WARPS * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = p.stream;
    cudaLaunchAttribute pdl;
    pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &pdl;
    cfg.numAttrs = 1;
    DSV4_CUDA_CHECK(cudaLaunchKernelEx(&cfg, ge_down_kernel<F>, p));
    DSV4_LAUNCH_CHECK("ge_down_kernel");
    return 0;
}

#endif /* DSV4_KERNELS_GROUPED_EXPERTS_CUH */
