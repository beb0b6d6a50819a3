/* fp4_experts.cu - the routed experts of C tokens with FP4 e2m1 weights (two codes per byte, low nibble = even
 * column) and one e8m0 scale per 32 input columns (model-spec §2, §3, §10): the contract of dsv4_opt_moe_experts
 * (moe.cuh), each touched expert's bytes read ONCE for all its tokens by the grouped kernels of
 * grouped_experts.cuh. This file is the weight format: how a warp loads and multiplies its rows.
 *
 * Numerics: a lane's 16-byte load is 32 codes of one row, exactly one scale block; codes become bf16 by bit moves
 * and one exact bf16x2 multiply by 2^126·scale (qweight_dev.cuh), so the mma sees the dequantised weight exactly
 * (as the f32 dequantisation of the shared loader, unless the product is subnormal) times the bf16 activation.
 */
#include "opt_common.cuh"
#include "qweight.cuh"
#include "qweight_dev.cuh"
#include "fp4_layout.h"

#include "grouped_experts.cuh"

enum {
    F4_SS = 128,      /* columns per super-step: 4 lanes x 32 codes */
    F4_UP_DEPTH = 2,  /* super-steps per weight batch, up (2 m-tiles) and down (1): deeper batches, rings of */
    F4_DOWN_DEPTH = 2 /* single super-steps, L2 prefetch ahead and carrying a batch across experts were all slower
                       * on the H200 (docs/kernels.md) */
};

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

/* The FP4 weight format of the grouped kernels (grouped_experts.cuh). */
struct fp4_format {
    typedef dsv4_fp4_experts_params Params;
    /* one up variant: depth 4 at C = 1 was within the noise (H200: 48.8 -> 46.3-47.3 us) */
    enum {
        UP_DEPTH = F4_UP_DEPTH, DOWN_DEPTH = F4_DOWN_DEPTH, UP_MIN_BLOCKS = 3, DOWN_MIN_BLOCKS = 2,
        UP_DEPTH_FEW = F4_UP_DEPTH, UP_MIN_BLOCKS_FEW = 3
    };
    template <int MT> struct Rows {
        const uint8_t *w[MT][2], *s[MT][2]; /* codes and e8m0 scales of rows g and g + 8 of each m-tile */
    };
    template <int MT, int DEPTH> using Batch = f4_wbatch<MT, DEPTH>;
    template <int MT> static __device__ void w13_row(Rows<MT> &rows, int m, int r, const Params &p, size_t row)
    {
        rows.w[m][r] = p.w13 + row * (p.dim / 2);
        rows.s[m][r] = p.s13 + row * (p.dim / 32);
    }
    template <int MT> static __device__ void w2_row(Rows<MT> &rows, int m, int r, const Params &p, size_t row)
    {
        rows.w[m][r] = p.w2 + row * (p.inter / 2);
        rows.s[m][r] = p.s2 + row * (p.inter / 32);
    }
    template <int MT, int DEPTH>
    static __device__ __forceinline__ void load_batch(Batch<MT, DEPTH> &nb, const Rows<MT> &rows, int K, int b)
    {
        f4_load_batch<MT, DEPTH>(nb, rows.w, rows.s, K, b, 1);
    }
    template <int MT, int DEPTH, bool X_AHEAD>
    static __device__ __forceinline__ void warp_tile(float acc[MT][4], const Rows<MT> &rows, const uint16_t *xrow,
                                                     int K, Batch<MT, DEPTH> &nxt, bool preloaded)
    {
        f4_warp_tile<MT, DEPTH, X_AHEAD>(acc, rows.w, rows.s, xrow, K, 0, 1, nxt, preloaded);
    }
};

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

/* One thread per 32-column block of a row: its 16 code bytes (4 repacked words) and its scale byte in, 32 bf16 out.
 * A code's value is an e2m1 magnitude times 2^(b-127): at most 3 significant bits, so the f32 product and its bf16
 * are exact (unless subnormal in bf16); these are the values the FP4 expert kernel's bf16 mma sees. */
__global__ void fp4_dequant_kernel(const uint8_t *__restrict__ codes, const uint8_t *__restrict__ scales, int64_t n,
                                   uint16_t *__restrict__ dst)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint4 w4 = *reinterpret_cast<const uint4 *>(codes + i * 16);
    const uint8_t b = scales[i];
    const float sc = b == 0 ? __uint_as_float(0x00400000u) : b == 255 ? __uint_as_float(0x7fc00000u)
                                                                       : __uint_as_float((uint32_t)b << 23);
    const uint32_t wd[4] = {w4.x, w4.y, w4.z, w4.w};
    uint32_t out[16];
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int J = 0; J < 4; J++) {
            /* columns 8q + 2J (low half) and 8q + 2J + 1 (high half): magnitude bits 6..8, sign bit 15 per half */
            const uint32_t pr = dsv4_fp4_pair_repacked(wd[q], J);
            uint32_t v = 0;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t half = pr >> (16 * h);
                const uint32_t m = (half >> 6) & 7u; /* e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
                const float e2m1 = m < 4 ? 0.5f * (float)m : m == 4 ? 2.0f : m == 5 ? 3.0f : m == 6 ? 4.0f : 6.0f;
                float f = e2m1 * sc;
                if (half & 0x8000u) f = -f;
                v |= (uint32_t)dsv4_f32_to_bf16_bits(f) << (16 * h);
            }
            out[4 * q + J] = v;
        }
    uint4 *o = reinterpret_cast<uint4 *>(dst + i * 32);
#pragma unroll
    for (int j = 0; j < 4; j++) o[j] = make_uint4(out[4 * j], out[4 * j + 1], out[4 * j + 2], out[4 * j + 3]);
}

int dsv4_opt_fp4_dequant(const uint8_t *codes, const uint8_t *scales, int64_t rows, int cols, uint16_t *dst,
                         cudaStream_t stream)
{
    DSV4_CHECK(codes && scales && dst && rows >= 1 && cols >= 32 && cols % 32 == 0,
               "fp4_dequant: %lld rows of %d columns (multiples of 32), codes %p, scales %p, dst %p", (long long)rows,
               cols, (const void *)codes, (const void *)scales, (void *)dst);
    DSV4_CHECK(dsv4_aligned16(codes) && dsv4_aligned16(dst), "fp4_dequant: codes and dst must be 16-byte aligned");
    const int64_t n = rows * (cols / 32);
    fp4_dequant_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(codes, scales, n, dst);
    DSV4_LAUNCH_CHECK("fp4_dequant_kernel");
    return 0;
}

int dsv4_opt_fp4_experts(const dsv4_fp4_experts_params *p)
{
    DSV4_CHECK(p != NULL, "fp4_experts: params is NULL");
    DSV4_CHECK(p->n_tok >= 1 && p->k >= 1 && p->k <= GE_MAX_K, "fp4_experts: n_tok %d, k %d (1..%d)", p->n_tok,
               p->k, (int)GE_MAX_K);
    DSV4_CHECK(p->dim >= 32 && p->inter >= 32 && p->dim % 32 == 0 && p->inter % 32 == 0,
               "fp4_experts: dim %d, inter %d (multiples of 32)", p->dim, p->inter);
    DSV4_CHECK(p->x && p->ids && p->weights && p->w13 && p->s13 && p->w2 && p->s2 && p->h && p->out,
               "fp4_experts: NULL buffer");
    DSV4_CHECK(dsv4_aligned16(p->x) && dsv4_aligned16(p->w13) && dsv4_aligned16(p->w2) && dsv4_aligned16(p->h),
               "fp4_experts: x, w13, w2 and h must be 16-byte aligned");
    return ge_launch<fp4_format>("fp4_experts", *p);
}
