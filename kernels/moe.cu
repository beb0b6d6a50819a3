/* moe.cu - MoE routing, the routed experts with bf16 weights and the shared expert's SwiGLU (model-spec §10, §3).
 *
 * Quiet traps (as reference/ref_moe.c):
 * - The correction bias only SELECTS; the weights are the plain scores of the selected experts, normalised
 *   (+1e-20) and times routed_scaling_factor. Hash layers select by tid2eid[token] and weight by the gate scores.
 * - Top-k ties keep the lower expert id first (strictly-greater insertion, as dsv4_ref_topk); NaN ranks last.
 * - SwiGLU clamps the gate from above only and the up projection on both sides, routed AND shared.
 * - softplus uses torch's threshold (z > 20 -> z) (dsv4_sqrtsoftplus, shared with follow.cu's re-weighting).
 * Routed experts: dim and inter multiples of 16 (every DeepSeek-V4 shape) take the grouped kernels of
 * grouped_experts.cuh with the bf16 format below (each touched expert's rows read once per chunk of 64 tokens,
 * multiplied on mma.sync); other even shapes take moe_up_kernel / moe_down_kernel, one warp per output row of one
 * (token, expert) pair, the weights re-read per pair. Both are bitwise deterministic (fixed summation orders);
 * the grouped kernels skip expert ids outside [0, 1024), the per-pair ones need every id to be a held expert.
 */
#include <math.h>

#include "grouped_experts.cuh"
#include "moe.cuh"
#include "opt_common.cuh"
#include "qweight_dev.cuh"

enum { MOE_MAX_E = 1024, MOE_MAX_K = 16, MOE_WARPS = 8 };

static __device__ __forceinline__ float moe_key(float s) { return s != s ? -INFINITY : s; }

/* Selection order of the route: the larger key first, on equal keys the lower expert id (what the reference's
 * strictly-greater insertion gives). */
static __device__ __forceinline__ int moe_before(float v, int e, float bv, int be)
{
    return v > bv || (v == bv && e < be);
}

/* grid C, block 256: scores and keys in shared memory by all threads, then warp 0 picks the top-k by k rounds of
 * a warp arg-max (it was one thread scanning all E experts with a global load each: ~40 µs per call). */
__global__ void moe_route_kernel(dsv4_moe_route_params p)
{
    __shared__ float s[MOE_MAX_E], key[MOE_MAX_E];
    __shared__ unsigned char taken[MOE_MAX_E];
    __shared__ int32_t ids[MOE_MAX_K];
    const int c = blockIdx.x, E = p.n_experts, k = p.k;
    const float *lg = p.logits + (size_t)c * p.logit_stride;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        s[e] = dsv4_sqrtsoftplus(lg[e]);
        if (p.bias) key[e] = moe_key(s[e] + p.bias[e]);
        taken[e] = 0;
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (p.bias) {
        for (int j = 0; j < k; j++) {
            float bv = -INFINITY;
            int be = E; /* sentinel: any expert, even one at -inf, comes before it */
            for (int e = lane; e < E; e += 32)
                if (!taken[e] && moe_before(key[e], e, bv, be)) bv = key[e], be = e;
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                int oe = __shfl_xor_sync(0xffffffffu, be, o);
                if (moe_before(ov, oe, bv, be)) bv = ov, be = oe;
            }
            if (lane == 0) {
                ids[j] = be;
                taken[be] = 1;
            }
            __syncwarp();
        }
    } else if (lane < k) {
        ids[lane] = p.tid2eid[(size_t)p.tokens[c] * k + lane];
    }
    __syncwarp();
    if (lane != 0) return;
    float sum = 0.0f, wv[MOE_MAX_K];
    for (int j = 0; j < k; j++) {
        wv[j] = s[ids[j]];
        sum += wv[j];
    }
    for (int j = 0; j < k; j++) {
        p.ids[(size_t)c * k + j] = ids[j];
        p.weights[(size_t)c * k + j] = wv[j] / (sum + 1e-20f) * p.routed_scale;
    }
}

/* ------------------------------------------------------------------------------------------------ grouped, bf16 */
enum { B16_SS = 32 /* columns per super-step: 4 lanes x 8 bf16 (one 16-byte load per row) */ };

/* The bf16 weight format of the grouped kernels (grouped_experts.cuh). Lane (g, t) loads columns 8t..8t+7 of a
 * super-step from its rows and from its token's activations; the mma's k slots 2t, 2t+1 / 2t+8, 2t+9 of step s
 * take words 2s / 2s+1 of those loads, the same permutation of the columns on both operands, so the products are
 * the plain bf16 x bf16 ones (exact in fp32) and only the fp32 accumulation order differs from a row dot. */
struct bf16_format {
    typedef dsv4_moe_experts_params Params;
    /* super-steps per weight batch: 4 KB (up: 2 x 2 m-tiles) and 3 KB (down: 3 x 1) of weights per warp in flight;
     * down at 4 spilled under its 128-register bound. A few-blocks up grid (C = 1 in Flash: 192 blocks of 4 warps,
     * under 6 warps per SM) takes 8 KB a warp at 2 blocks per SM: H200, bench_moe C = 1 107.4 -> 95.4 us; the same
     * depth at C = 16 / 64 gained nothing / lost 1.5%, and deeper down batches gained nothing at C = 1. */
    enum {
        UP_DEPTH = 2, DOWN_DEPTH = 3, UP_MIN_BLOCKS = 4, DOWN_MIN_BLOCKS = 2,
        UP_DEPTH_FEW = 4, UP_MIN_BLOCKS_FEW = 2
    };
    template <int MT> struct Rows {
        const uint16_t *w[MT][2]; /* rows g and g + 8 of each m-tile */
    };
    template <int MT, int DEPTH> struct Batch {
        uint4 w[DEPTH][MT][2];
    };
    template <int MT> static __device__ void w13_row(Rows<MT> &rows, int m, int r, const Params &p, size_t row)
    {
        rows.w[m][r] = p.w13 + row * p.dim;
    }
    template <int MT> static __device__ void w2_row(Rows<MT> &rows, int m, int r, const Params &p, size_t row)
    {
        rows.w[m][r] = p.w2 + row * p.inter;
    }
    /* One warp: super-steps b .. b + DEPTH - 1 of its rows (zeros past K). */
    template <int MT, int DEPTH>
    static __device__ __forceinline__ void load_batch(Batch<MT, DEPTH> &nb, const Rows<MT> &rows, int K, int b)
    {
        const int t = threadIdx.x & 3;
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            const int col = (b + d) * B16_SS + 8 * t;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    nb.w[d][m][r] = col < K ? qw_ld_stream(rows.w[m][r] + col) : make_uint4(0, 0, 0, 0);
        }
    }
    /* One warp: acc[m] += W_m[16 rows, 0..K) · x[8 tokens, 0..K)ᵀ. The next batch of weights AND activations is
     * loaded while the current one is multiplied (X_AHEAD is the FP4 format's choice; here always ahead: a
     * batch's activations are DEPTH registers of 4 words). */
    template <int MT, int DEPTH, bool X_AHEAD>
    static __device__ __forceinline__ void warp_tile(float acc[MT][4], const Rows<MT> &rows, const uint16_t *xrow,
                                                     int K, Batch<MT, DEPTH> &nxt, bool preloaded)
    {
        const int t = threadIdx.x & 3, nss = (K + B16_SS - 1) / B16_SS;
        auto load_x = [&](uint4 X[DEPTH], int b) {
#pragma unroll
            for (int d = 0; d < DEPTH; d++) {
                const int col = (b + d) * B16_SS + 8 * t;
                X[d] = xrow && col < K ? __ldg(reinterpret_cast<const uint4 *>(xrow + col)) : make_uint4(0, 0, 0, 0);
            }
        };
        uint4 Xn[DEPTH];
        if (!preloaded) load_batch<MT, DEPTH>(nxt, rows, K, 0);
        load_x(Xn, 0);
        for (int b = 0; b < nss; b += DEPTH) {
            const Batch<MT, DEPTH> cur = nxt;
            uint4 X[DEPTH];
#pragma unroll
            for (int d = 0; d < DEPTH; d++) X[d] = Xn[d];
            if (b + DEPTH < nss) {
                load_batch<MT, DEPTH>(nxt, rows, K, b + DEPTH);
                load_x(Xn, b + DEPTH);
            }
#pragma unroll
            for (int d = 0; d < DEPTH; d++) {
                if (b + d >= nss) break;
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    const uint32_t bb[2] = {qw_word(X[d], 2 * s), qw_word(X[d], 2 * s + 1)};
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        const uint32_t a[4] = {qw_word(cur.w[d][m][0], 2 * s), qw_word(cur.w[d][m][1], 2 * s),
                                               qw_word(cur.w[d][m][0], 2 * s + 1), qw_word(cur.w[d][m][1], 2 * s + 1)};
                        dsv4_mma_bf16_16816(acc[m], a, bb);
                    }
                }
            }
        }
    }
};

/* ------------------------------------------------------------------------------------------------ per pair */
/* Σ_i a[i]·x[i] over n (even) bf16 weights a and f32 x (shared memory), by one warp. */
static __device__ __forceinline__ float moe_warp_dot(const uint16_t *__restrict__ a, const float *x, int n)
{
    const int lane = threadIdx.x & 31;
    const uint32_t *a2 = reinterpret_cast<const uint32_t *>(a);
    float acc = 0.0f;
    for (int i = lane; i < n / 2; i += 32) {
        uint32_t w = __ldg(a2 + i);
        acc += dsv4_bf16_lo(w) * x[2 * i] + dsv4_bf16_hi(w) * x[2 * i + 1];
    }
    return dsv4_warp_sum(acc);
}

/* grid (ceil(I / MOE_WARPS), C·k): intermediate rows of one (token, expert) pair. */
__global__ void __launch_bounds__(MOE_WARPS * 32) moe_up_kernel(dsv4_moe_experts_params p)
{
    extern __shared__ float xs[]; /* [D] */
    const int pair = blockIdx.y, c = pair / p.k, D = p.dim, I = p.inter;
    for (int i = threadIdx.x; i < D; i += blockDim.x) xs[i] = dsv4_bf16_bits_to_f32(p.x[(size_t)c * D + i]);
    __syncthreads();
    const int m = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (m >= I) return;
    int e = p.ids[pair];
    if (p.e_end) {
        if (e < p.e_begin || e >= p.e_end) return; /* another rank's expert: moe_down skips the pair too */
        e -= p.e_begin;
    }
    const uint16_t *w = p.w13 + (size_t)e * 2 * I * D;
    float g = moe_warp_dot(w + (size_t)m * D, xs, D);
    float u = moe_warp_dot(w + (size_t)(I + m) * D, xs, D);
    if ((threadIdx.x & 31) != 0) return;
    g = fminf(g, p.limit);
    u = fminf(fmaxf(u, -p.limit), p.limit);
    float h = g / (1.0f + expf(-g)) * u * p.weights[pair];
    p.h[(size_t)pair * I + m] = dsv4_f32_to_bf16_bits(h);
}

/* grid (ceil(D / MOE_WARPS), C): output rows of one token, the k experts summed in order, then the shared one. */
__global__ void __launch_bounds__(MOE_WARPS * 32) moe_down_kernel(dsv4_moe_experts_params p)
{
    extern __shared__ float hs[]; /* [k, I] */
    const int c = blockIdx.y, D = p.dim, I = p.inter, k = p.k;
    for (int i = threadIdx.x; i < k * I; i += blockDim.x) hs[i] = dsv4_bf16_bits_to_f32(p.h[(size_t)c * k * I + i]);
    __syncthreads();
    const int row = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (row >= D) return;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
        int e = p.ids[(size_t)c * k + j];
        if (p.e_end) {
            if (e < p.e_begin || e >= p.e_end) continue;
            e -= p.e_begin;
        }
        acc += moe_warp_dot(p.w2 + ((size_t)e * D + row) * I, hs + (size_t)j * I, I);
    }
    if ((threadIdx.x & 31) != 0) return;
    if (p.shared) acc = acc + p.shared[(size_t)c * p.shared_stride + row];
    p.out[(size_t)c * D + row] = acc;
}

__global__ void swiglu_kernel(dsv4_swiglu_params p)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n_tok * p.inter) return;
    int c = i / p.inter, m = i % p.inter;
    const float *gu = p.gu + (size_t)c * p.gu_stride;
    float g = fminf(gu[p.g_off + m], p.limit);
    float u = fminf(fmaxf(gu[p.u_off + m], -p.limit), p.limit);
    p.h[i] = dsv4_f32_to_bf16_bits(g / (1.0f + expf(-g)) * u);
}

int dsv4_opt_moe_route(const dsv4_moe_route_params *p)
{
    DSV4_CHECK(p != NULL, "moe_route: params is NULL");
    if (p->n_experts < 1 || p->n_experts > MOE_MAX_E || p->k < 1 || p->k > MOE_MAX_K || p->k > p->n_experts)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "moe_route: %d experts, k %d unsupported", p->n_experts, p->k);
    DSV4_CHECK(p->n_tok >= 1 && p->logits && p->ids && p->weights, "moe_route: n_tok %d or NULL buffers", p->n_tok);
    DSV4_CHECK(p->bias || (p->tid2eid && p->tokens), "moe_route: hash routing needs tid2eid and tokens");
    moe_route_kernel<<<p->n_tok, 128, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("moe_route_kernel");
    return 0;
}

int dsv4_opt_moe_experts(const dsv4_moe_experts_params *p)
{
    DSV4_CHECK(p != NULL, "moe_experts: params is NULL");
    DSV4_CHECK(p->n_tok >= 1 && p->k >= 1 && p->dim >= 2 && p->inter >= 2 && p->dim % 2 == 0 && p->inter % 2 == 0,
               "moe_experts: n_tok %d, k %d, dim %d, inter %d (dim and inter even)", p->n_tok, p->k, p->dim, p->inter);
    DSV4_CHECK(p->x && p->ids && p->weights && p->w13 && p->w2 && p->h && p->out, "moe_experts: NULL buffer");
    DSV4_CHECK(p->e_end == 0 || (p->e_begin >= 0 && p->e_end > p->e_begin), "moe_experts: expert range [%d, %d)",
               p->e_begin, p->e_end);
    if (p->dim % 16 == 0 && p->inter % 16 == 0 && p->k <= GE_MAX_K && dsv4_aligned16(p->x) &&
        dsv4_aligned16(p->w13) && dsv4_aligned16(p->w2) && dsv4_aligned16(p->h))
        return ge_launch<bf16_format>("moe_experts", *p);
    const size_t up_smem = (size_t)p->dim * sizeof(float), down_smem = (size_t)p->k * p->inter * sizeof(float);
    if (up_smem > 48 * 1024 || down_smem > 96 * 1024)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "moe_experts: dim %d / k·inter %d too large for shared memory",
                          p->dim, p->k * p->inter);
    if (down_smem > 48 * 1024)
        DSV4_CUDA_CHECK(cudaFuncSetAttribute(moe_down_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)down_smem));
    dim3 gu(dsv4_ceil_div(p->inter, MOE_WARPS), p->n_tok * p->k);
    moe_up_kernel<<<gu, MOE_WARPS * 32, up_smem, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("moe_up_kernel");
    dim3 gd(dsv4_ceil_div(p->dim, MOE_WARPS), p->n_tok);
    moe_down_kernel<<<gd, MOE_WARPS * 32, down_smem, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("moe_down_kernel");
    return 0;
}

int dsv4_opt_swiglu(const dsv4_swiglu_params *p)
{
    DSV4_CHECK(p != NULL && p->n_tok >= 1 && p->inter >= 1 && p->gu && p->h, "swiglu: bad params");
    swiglu_kernel<<<dsv4_ceil_div((int64_t)p->n_tok * p->inter, 256), 256, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("swiglu_kernel");
    return 0;
}
