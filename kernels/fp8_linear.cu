/* fp8_linear.cu - y = x · dequant(W)ᵀ for the FP8 e4m3 linears with one scale per 128x128 block (model-spec §2,
 * §3), for decode-sized S: the weight bytes stream from HBM once, the tokens ride along.
 *
 * Layout: a block is 4 warps, each owning 16 output rows (the mma M side = weights) and up to 64 tokens (the N side,
 * 8 per n-tile, zero-padded). Per 128-column k-block a lane loads 2 x 16 bytes of each of its two rows (rows g and
 * g+8, columns 16t.. of each 64-column half), converts them to bf16 in registers and runs 8 mma.sync m16n8k16 per
 * n-tile into a k-block partial, which is then scaled by the block's scale and added to the accumulator (so an f32
 * scale is applied exactly, not rounded into bf16 weights). The next k-block's weights are loaded before the
 * current batch is multiplied (a batch is 2 k-blocks for S <= 16, else 1). The block's activations of a k-block
 * are staged in shared memory once for its 4 warps (cp.async, double-buffered: the next k-block's while this one
 * is multiplied); loaded by each warp from L1/L2 right before its mma they were a dependent load per n-tile.
 *
 * The k order: a lane multiplies only its own 16 columns, so the 16 k of an mma may be any of their orders, the
 * same for both operands. Two orders are used, both taking mma q from columns 16t + 4q .. 4q + 3:
 *   - weights permuted (NT >= 2): (4q, 4q + 1) as the mma's k = 2t, 2t + 1 and (4q + 2, 4q + 3) as k = 2t + 8,
 *     2t + 9. Each activation fragment is one 32-bit word of shared memory as it lies; the weights pay one byte
 *     permute per word of 4 e4m3 before the pair converters (which take bytes 0, 2 and 1, 3): 16 per k-block.
 *   - activations permuted (NT = 1): (4q, 4q + 2) and (4q + 1, 4q + 3), the converters' own pairs; the
 *     activations pay 2 permutes per mma, 16 per k-block and n-tile. With one n-tile the counts are equal and
 *     the H200 showed no gain at C = 1 from the other order (bench_qweight; two builds of the same code differ
 *     by up to 5% there), so NT = 1 keeps this, the kernel's first order. From NT = 2 the weights-permuted
 *     order was 3-8% faster (C = 16 and 64, every shape but one at C = 16).
 *
 * Grouped (group_rows > 0, wo_a): the groups' weights are the rows of one matrix, so one launch covers them all;
 * a block's 64 rows lie in one group (64 | group_rows) and read that group's slice of x.
 *
 * Split-K: when rows x token chunks give fewer than F8_TARGET_BLOCKS blocks, the k-blocks are cut into `splits`
 * contiguous ranges (a function of the shape only); each writes f32 partials to the workspace and a combine
 * kernel sums them in split order. No atomics: bitwise identical run to run.
 *
 * Quiet traps: rows past n_out and columns past n_in load as zeros (both operands, so garbage never meets a zero);
 * a 16-row warp tile never straddles a 128-row scale block (16 divides 128); the fast path needs n_in % 16 == 0
 * and 16-byte aligned rows of W and x, else a byte-wise path (tiny models only) runs the same math.
 */
#include "opt_common.cuh"
#include "qweight.cuh"
#include "qweight_dev.cuh"

enum { F8_WARPS = 4, F8_BLOCK_ROWS = 16 * F8_WARPS, F8_KB = 128, F8_TOK = 64, F8_TARGET_BLOCKS = 528 };
enum { F8_XPITCH = F8_KB + 8 }; /* bf16 per staged token row: 16 bytes of padding, so the 8 tokens of a warp's
                                 * 16-byte reads fall in different banks */

typedef struct f8_plan {
    int row_blocks, tok_chunks, kblocks, splits, kb_per_split;
} f8_plan;

static f8_plan f8_make_plan(int n_tok, int n_out, int n_in)
{
    f8_plan pl;
    pl.row_blocks = dsv4_ceil_div(n_out, F8_BLOCK_ROWS);
    pl.tok_chunks = dsv4_ceil_div(n_tok, F8_TOK);
    pl.kblocks = dsv4_ceil_div(n_in, F8_KB);
    const int64_t base = (int64_t)pl.row_blocks * pl.tok_chunks;
    int splits = base >= F8_TARGET_BLOCKS ? 1 : dsv4_ceil_div(F8_TARGET_BLOCKS, base);
    const int max_splits = pl.kblocks / 2 > 1 ? pl.kblocks / 2 : 1; /* at least 2 k-blocks per split */
    if (splits > max_splits) splits = max_splits;
    pl.kb_per_split = dsv4_ceil_div(pl.kblocks, splits);
    pl.splits = dsv4_ceil_div(pl.kblocks, pl.kb_per_split); /* no empty split */
    return pl;
}

typedef struct f8_args {
    dsv4_fp8_linear_params p;
    int kblocks, splits, kb_per_split;
} f8_args;

static __device__ __forceinline__ float f8_e8m0_f32(uint8_t b)
{
    return b == 0 ? __uint_as_float(0x00400000u) : b == 255 ? __uint_as_float(0x7fc00000u) : __uint_as_float((uint32_t)b << 23);
}

/* 16 e4m3 bytes of row `row` from column `col`; zeros past the matrix. */
template <bool AL>
static __device__ __forceinline__ uint4 f8_load_w(const uint8_t *w, int n_out, int n_in, int row, int col)
{
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row >= n_out || col >= n_in) return v;
    const uint8_t *src = w + (size_t)row * n_in + col;
    if constexpr (AL) {
        return qw_ld_stream(src); /* n_in % 16 == 0: the whole 16 bytes are inside */
    } else {
        uint32_t b[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < 16; i++)
            if (col + i < n_in) b[i >> 2] |= (uint32_t)src[i] << (8 * (i & 3));
        return make_uint4(b[0], b[1], b[2], b[3]);
    }
}

/* Stages the activations of k-block kb for tokens tok0 .. tok0 + 8·NT - 1 into xs (all threads of the block):
 * 16-byte chunks by cp.async (zero-filled past the matrix) on the fast path, element by element otherwise. */
template <int NT, bool AL>
static __device__ __forceinline__ void f8_stage_x(uint16_t (*xs)[F8_XPITCH], const dsv4_fp8_linear_params &p,
                                                  const uint16_t *x, int tok0, int kb)
{
    for (int i = threadIdx.x; i < NT * 8 * (F8_KB / 8); i += F8_WARPS * 32) {
        const int r = i / (F8_KB / 8), c = (i % (F8_KB / 8)) * 8, tok = tok0 + r, col = kb * F8_KB + c;
        const bool in = tok < p.n_tok && col < p.n_in;
        const uint16_t *src = x + (in ? (size_t)tok * p.ldx + col : 0);
        if constexpr (AL) {
            dsv4_cp_async16(&xs[r][c], src, in ? 16 : 0); /* n_in % 16 == 0: a chunk is all in or all out */
        } else {
            uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (in && col + e < p.n_in) w[e >> 1] |= (uint32_t)src[e] << (16 * (e & 1));
            *reinterpret_cast<uint4 *>(&xs[r][c]) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

/* grid (row_blocks, splits, tok_chunks), F8_WARPS warps. KD k-blocks per weight batch, double-buffered: 2 for the
 * few-token variants (memory-bound: more bytes in flight per warp), 1 where registers go to the accumulators. */
template <int NT, bool AL, int KD = (NT <= 2 ? 2 : 1)>
__global__ void __launch_bounds__(F8_WARPS * 32) fp8_linear_kernel(const __grid_constant__ f8_args a)
{
    const dsv4_fp8_linear_params &p = a.p;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * F8_BLOCK_ROWS + warp * 16, split = blockIdx.y, tok0 = blockIdx.z * F8_TOK;
    /* a warp past n_out runs on (its weights load as zeros, it stores nothing): the block shares barriers */
    const int kb_begin = split * a.kb_per_split;
    const int kb_end = kb_begin + a.kb_per_split < a.kblocks ? kb_begin + a.kb_per_split : a.kblocks;
    const int left = (p.n_tok - tok0 + 7) / 8, n_tiles = left < NT ? left : NT;
    const uint16_t *x = p.x + (p.group_rows ? (size_t)(blockIdx.x * F8_BLOCK_ROWS / p.group_rows) * p.n_in : 0);
    /* the block's activations of one k-block, double-buffered: staged once for all 4 warps (they were 16 dependent
     * L1/L2 loads per warp and k-block before) */
    __shared__ __align__(16) uint16_t xs[2][NT * 8][F8_XPITCH];

    constexpr bool weights_permute = NT >= 2; /* the k order (header comment) */
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

    uint4 nxt[KD][2][2]; /* [k-block of the batch][64-column half][row g, g+8] */
    auto load = [&](int kb0) {
#pragma unroll
        for (int d = 0; d < KD; d++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int col = (kb0 + d) * F8_KB + h * 64 + 16 * t;
                const bool in = kb0 + d < kb_end; /* never read past the split */
                nxt[d][h][0] = in ? f8_load_w<AL>(p.w, p.n_out, p.n_in, row0 + g, col) : make_uint4(0, 0, 0, 0);
                nxt[d][h][1] = in ? f8_load_w<AL>(p.w, p.n_out, p.n_in, row0 + g + 8, col) : make_uint4(0, 0, 0, 0);
            }
    };
    f8_stage_x<NT, AL>(xs[0], p, x, tok0, kb_begin);
    dsv4_cp_async_commit();
    load(kb_begin);
    for (int kb0 = kb_begin; kb0 < kb_end; kb0 += KD) {
        uint4 cur[KD][2][2];
#pragma unroll
        for (int d = 0; d < KD; d++)
#pragma unroll
            for (int h = 0; h < 2; h++) cur[d][h][0] = nxt[d][h][0], cur[d][h][1] = nxt[d][h][1];
        if (kb0 + KD < kb_end) load(kb0 + KD);
#pragma unroll
        for (int d = 0; d < KD; d++) {
            const int kb = kb0 + d;
            if (kb >= kb_end) break; /* uniform over the block */
            const int buf = (kb - kb_begin) & 1;
            if (kb + 1 < kb_end) f8_stage_x<NT, AL>(xs[buf ^ 1], p, x, tok0, kb + 1); /* read by no one now */
            dsv4_cp_async_commit();
            dsv4_cp_async_wait<1>(); /* this k-block's group has landed (the next one may still fly) */
            __syncthreads();
            float tmp[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) tmp[nt][0] = tmp[nt][1] = tmp[nt][2] = tmp[nt][3] = 0.0f;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t A[4][4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const uint32_t r0 = qw_word(cur[d][h][0], q), r1 = qw_word(cur[d][h][1], q);
                    /* bytes (b0, b1, b2, b3) -> (b0, b2, b1, b3): the pair converters take bytes 0, 2 and 1, 3 */
                    const uint32_t w0 = weights_permute ? __byte_perm(r0, 0, 0x3120) : r0,
                                   w1 = weights_permute ? __byte_perm(r1, 0, 0x3120) : r1;
                    A[q][0] = qw_bf16x2_mul(qw_e4m3_pair_raw<0>(w0), QW_BF16X2_2POW120);
                    A[q][1] = qw_bf16x2_mul(qw_e4m3_pair_raw<0>(w1), QW_BF16X2_2POW120);
                    A[q][2] = qw_bf16x2_mul(qw_e4m3_pair_raw<1>(w0), QW_BF16X2_2POW120);
                    A[q][3] = qw_bf16x2_mul(qw_e4m3_pair_raw<1>(w1), QW_BF16X2_2POW120);
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    if (nt >= n_tiles) break;
                    /* 16 activations of token tok0 + 8nt + g, columns h·64 + 16t.. of the k-block */
                    const uint4 *xr = reinterpret_cast<const uint4 *>(&xs[buf][nt * 8 + g][h * 64 + 16 * t]);
                    const uint4 xa = xr[0], xb = xr[1];
                    const uint32_t X[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const uint32_t b[2] = {
                            weights_permute ? X[2 * q] : __byte_perm(X[2 * q], X[2 * q + 1], 0x5410),
                            weights_permute ? X[2 * q + 1] : __byte_perm(X[2 * q], X[2 * q + 1], 0x7632)};
                        dsv4_mma_bf16_16816(tmp[nt], A[q], b);
                    }
                }
            }
            __syncthreads(); /* every warp is done with xs[buf] before the next k-block's staging overwrites it */
            const int si = (row0 / F8_KB) * a.kblocks + kb;
            const float s = row0 >= p.n_out ? 0.0f
                            : p.scale_kind == DSV4_QSCALE_F32
                                ? static_cast<const float *>(p.scale)[si]
                                : f8_e8m0_f32(static_cast<const uint8_t *>(p.scale)[si]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[nt][i] = fmaf(s, tmp[nt][i], acc[nt][i]);
        }
    }
    dsv4_cp_async_wait<0>();

    /* acc[nt][i]: row row0 + g (+8 for i >= 2), token tok0 + 8nt + 2t (+1 for odd i) */
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        if (nt >= n_tiles) break;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = row0 + g + (i >= 2 ? 8 : 0), tok = tok0 + nt * 8 + 2 * t + (i & 1);
            if (row >= p.n_out || tok >= p.n_tok) continue;
            if (a.splits > 1) {
                static_cast<float *>(p.workspace)[((size_t)split * p.n_tok + tok) * p.n_out + row] = acc[nt][i];
            } else if (p.y_f32) {
                static_cast<float *>(p.y)[(size_t)tok * p.ldy + row] = acc[nt][i];
            } else {
                static_cast<uint16_t *>(p.y)[(size_t)tok * p.ldy + row] = dsv4_f32_to_bf16_bits(acc[nt][i]);
            }
        }
    }
}

/* y[tok, row] = Σ_split part[split, tok, row], splits in order. */
__global__ void fp8_linear_combine_kernel(const __grid_constant__ f8_args a)
{
    const dsv4_fp8_linear_params &p = a.p;
    const int64_t n = (int64_t)p.n_tok * p.n_out;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float *part = static_cast<const float *>(p.workspace);
        float s = 0.0f;
        for (int sp = 0; sp < a.splits; sp++) s += part[sp * n + i];
        const int64_t tok = i / p.n_out, row = i % p.n_out;
        if (p.y_f32)
            static_cast<float *>(p.y)[tok * p.ldy + row] = s;
        else
            static_cast<uint16_t *>(p.y)[tok * p.ldy + row] = dsv4_f32_to_bf16_bits(s);
    }
}

size_t dsv4_opt_fp8_linear_workspace_bytes(int n_tok, int n_out, int n_in)
{
    if (n_tok < 1 || n_out < 1 || n_in < 1) return 0;
    const f8_plan pl = f8_make_plan(n_tok, n_out, n_in);
    return pl.splits > 1 ? (size_t)pl.splits * n_tok * n_out * sizeof(float) : 0;
}

template <int NT> static void f8_launch(const f8_args &a, dim3 grid, bool al, cudaStream_t st)
{
    if (al)
        fp8_linear_kernel<NT, true><<<grid, F8_WARPS * 32, 0, st>>>(a);
    else
        fp8_linear_kernel<NT, false><<<grid, F8_WARPS * 32, 0, st>>>(a);
}

/* e4m3fn (no inf; 0x7f / 0xff NaN) as f32. */
static __device__ __forceinline__ float f8_e4m3_f32(uint32_t b)
{
    const uint32_t e = (b >> 3) & 15u, m = b & 7u;
    float v = e == 0 ? (float)m * 0.001953125f                                     /* m/8 · 2^-6 */
              : e == 15 && m == 7 ? __uint_as_float(0x7fc00000u)                  /* NaN */
                                  : __uint_as_float(((e + 120u) << 23) | (m << 20)); /* (1 + m/8) · 2^(e-7) */
    return b & 0x80u ? -v : v;
}

/* One thread per 16 columns of a row: 16 codes in, 16 bf16 out (the block's scale applied in f32, then rounded:
 * exact for e8m0 scales, whose products have at most 4 significant bits). */
__global__ void fp8_dequant_kernel(const uint8_t *__restrict__ w, const void *__restrict__ scale, int f32_scale,
                                   int n_in, int64_t n, uint16_t *__restrict__ dst)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t per_row = n_in / 16, r = i / per_row, c = (i % per_row) * 16;
    const int64_t si = (r / 128) * ((n_in + 127) / 128) + c / 128;
    float sc;
    if (f32_scale) {
        sc = static_cast<const float *>(scale)[si];
    } else {
        const uint8_t b = static_cast<const uint8_t *>(scale)[si];
        sc = b == 0 ? __uint_as_float(0x00400000u) : b == 255 ? __uint_as_float(0x7fc00000u)
                                                              : __uint_as_float((uint32_t)b << 23);
    }
    const uint4 q = *reinterpret_cast<const uint4 *>(w + r * n_in + c);
    const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
    uint32_t out[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint32_t word = wd[j / 2], sh = 16 * (j & 1);
        const float lo = f8_e4m3_f32((word >> sh) & 0xffu) * sc, hi = f8_e4m3_f32((word >> (sh + 8)) & 0xffu) * sc;
        out[j] = (uint32_t)dsv4_f32_to_bf16_bits(lo) | (uint32_t)dsv4_f32_to_bf16_bits(hi) << 16;
    }
    uint4 *o = reinterpret_cast<uint4 *>(dst + r * n_in + c);
    o[0] = make_uint4(out[0], out[1], out[2], out[3]);
    o[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

int dsv4_opt_fp8_dequant(const uint8_t *w, const void *scale, dsv4_qscale scale_kind, int n_out, int n_in,
                         uint16_t *dst, cudaStream_t stream)
{
    DSV4_CHECK(w && scale && dst && n_out >= 1 && n_in >= 16 && n_in % 16 == 0,
               "fp8_dequant: %d x %d (n_in a multiple of 16), w %p, scale %p, dst %p", n_out, n_in, (const void *)w,
               scale, (void *)dst);
    DSV4_CHECK(dsv4_aligned16(w) && dsv4_aligned16(dst), "fp8_dequant: w and dst must be 16-byte aligned");
    DSV4_CHECK(scale_kind == DSV4_QSCALE_E8M0 || scale_kind == DSV4_QSCALE_F32, "fp8_dequant: scale_kind %d unknown",
               (int)scale_kind);
    const int64_t n = (int64_t)n_out * (n_in / 16);
    fp8_dequant_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(w, scale, scale_kind == DSV4_QSCALE_F32,
                                                                        n_in, n, dst);
    DSV4_LAUNCH_CHECK("fp8_dequant_kernel");
    return 0;
}

int dsv4_opt_fp8_linear(const dsv4_fp8_linear_params *p)
{
    DSV4_CHECK(p != NULL, "fp8_linear: params is NULL");
    DSV4_CHECK(p->n_tok >= 1 && p->n_out >= 1 && p->n_in >= 2 && p->n_in % 2 == 0,
               "fp8_linear: n_tok %d, n_out %d, n_in %d (all >= 1, n_in even)", p->n_tok, p->n_out, p->n_in);
    DSV4_CHECK(p->x && p->w && p->scale && p->y, "fp8_linear: NULL x, w, scale or y");
    DSV4_CHECK(p->ldx >= p->n_in && p->ldy >= p->n_out, "fp8_linear: ldx %lld < n_in %d or ldy %lld < n_out %d",
               (long long)p->ldx, p->n_in, (long long)p->ldy, p->n_out);
    DSV4_CHECK(p->group_rows == 0 || (p->group_rows > 0 && p->group_rows % F8_BLOCK_ROWS == 0 &&
                                      p->n_out % p->group_rows == 0 &&
                                      p->ldx >= (int64_t)(p->n_out / p->group_rows) * p->n_in),
               "fp8_linear: group_rows %d must be a multiple of %d dividing n_out %d, with ldx %lld >= groups x "
               "n_in %d", p->group_rows, F8_BLOCK_ROWS, p->n_out, (long long)p->ldx, p->n_in);
    DSV4_CHECK(p->scale_kind == DSV4_QSCALE_E8M0 || p->scale_kind == DSV4_QSCALE_F32,
               "fp8_linear: scale_kind %d unknown", (int)p->scale_kind);
    const f8_plan pl = f8_make_plan(p->n_tok, p->n_out, p->n_in);
    const size_t need = dsv4_opt_fp8_linear_workspace_bytes(p->n_tok, p->n_out, p->n_in);
    if (need && (!p->workspace || p->workspace_bytes < need))
        return dsv4_error(DSV4_ERR_USAGE, "fp8_linear: workspace %zu bytes (%s), need %zu for S %d, %dx%d",
                          p->workspace_bytes, p->workspace ? "set" : "NULL", need, p->n_tok, p->n_out, p->n_in);
    if (pl.tok_chunks > 65535)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "fp8_linear: n_tok %d too large", p->n_tok);

    f8_args a;
    a.p = *p;
    a.kblocks = pl.kblocks;
    a.splits = pl.splits;
    a.kb_per_split = pl.kb_per_split;
    const bool al = p->n_in % 16 == 0 && p->ldx % 8 == 0 && dsv4_aligned16(p->w) && dsv4_aligned16(p->x);
    const dim3 grid(pl.row_blocks, pl.splits, pl.tok_chunks);
    const int tiles = dsv4_ceil_div(p->n_tok < F8_TOK ? p->n_tok : F8_TOK, 8);
    if (tiles <= 1)
        f8_launch<1>(a, grid, al, p->stream);
    else if (tiles <= 2)
        f8_launch<2>(a, grid, al, p->stream);
    else if (tiles <= 4)
        f8_launch<4>(a, grid, al, p->stream);
    else
        f8_launch<8>(a, grid, al, p->stream);
    DSV4_LAUNCH_CHECK("fp8_linear_kernel");
    if (pl.splits > 1) {
        const int64_t n = (int64_t)p->n_tok * p->n_out;
        const int blocks = (int)(dsv4_ceil_div(n, 256) < 4096 ? dsv4_ceil_div(n, 256) : 4096);
        fp8_linear_combine_kernel<<<blocks, 256, 0, p->stream>>>(a);
        DSV4_LAUNCH_CHECK("fp8_linear_combine_kernel");
    }
    return 0;
}
