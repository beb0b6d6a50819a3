/* elementwise.cu - embedding gather, fused RMSNorm/RoPE/FP8-sim/bf16 store, casts, fills, argmax.
 *
 * Quiet traps:
 * - RoPE rotates interleaved PAIRS (c, c+1) of the TRAILING channels: x'_c = x_c cos - x_{c+1} sin,
 *   x'_{c+1} = x_{c+1} cos + x_c sin (model-spec §3).
 * - The FP8 simulation runs after the norm and the RoPE and never touches the rope channels.
 * - The window-ring write is skipped for an inactive sequence (out_slot < 0): its ring keeps older positions.
 */
#include <math.h>

#include "elementwise.cuh"
#include "kv_layout.h"
#include "opt_common.cuh"

enum { EW_THREADS = 256, EW_MAX_DIM = 4096 };

__global__ void embed_kernel(dsv4_embed_params p)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)p.n_tok * p.n_streams * p.dim;
    if (i >= total) return;
    int d = (int)(i % p.dim);
    int c = (int)(i / ((size_t)p.n_streams * p.dim));
    p.X[i] = p.embed[(size_t)p.tokens[c] * p.dim + d];
}

__global__ void __launch_bounds__(EW_THREADS) norm_rope_kernel(dsv4_norm_rope_params p)
{
    __shared__ float v[EW_MAX_DIM];
    const int row = blockIdx.x, t = row / p.heads, h = row % p.heads, dim = p.dim;
    uint16_t *dst;
    uint8_t *dst8 = NULL;
    if (p.out8) {
        const int s = p.out_slot ? p.out_slot[t] : 0; /* no slots: row t at t·out8_seq_stride (fresh rows) */
        dst = NULL;
        const int64_t eb = dsv4_kv8_entry_bytes(dim, 2 * p.rope_pairs);
        dst8 = s < 0 ? NULL : p.out8 + (size_t)t * p.out8_seq_stride + (size_t)s * eb;
    } else if (p.out_slot) {
        const int s = p.out_slot[t];
        dst = s < 0 ? NULL : p.out + (size_t)t * p.out_seq_stride + (size_t)s * dim;
    } else {
        dst = p.out ? p.out + (size_t)t * p.out_tok_stride + (size_t)h * dim : NULL;
    }
    const size_t src = (size_t)t * p.x_tok_stride + (size_t)h * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += EW_THREADS) {
        float a = p.x_bf16 ? dsv4_bf16_bits_to_f32(((const uint16_t *)p.x)[src + i]) : ((const float *)p.x)[src + i];
        v[i] = a;
        ss += a * a;
    }
    if (p.norm) {
        const float r = 1.0f / sqrtf(dsv4_block_sum(ss) / (float)dim + p.eps);
        for (int i = threadIdx.x; i < dim; i += EW_THREADS) v[i] = p.weight ? p.weight[i] * (v[i] * r) : v[i] * r;
    }
    __syncthreads();
    const int np = p.rope_pairs, r0 = dim - 2 * np;
    for (int i = threadIdx.x; i < np; i += EW_THREADS) {
        float cs = p.cos[(size_t)t * np + i], sn = p.sin[(size_t)t * np + i];
        float x0 = v[r0 + 2 * i], x1 = v[r0 + 2 * i + 1];
        v[r0 + 2 * i] = x0 * cs + (-x1) * sn;
        v[r0 + 2 * i + 1] = x1 * cs + x0 * sn;
    }
    __syncthreads();
    if (p.fp8_nope)
        dsv4_fp8_nope_sim_smem(v, r0, dst8 ? dst8 + dsv4_kv8_codes_at(2 * np) : NULL,
                               dst8 ? dst8 + dsv4_kv8_scales_at(dim, 2 * np) : NULL);
    for (int i = threadIdx.x; i < dim; i += EW_THREADS) {
        float a = v[i] * p.post_scale;
        if (dst) dst[i] = dsv4_f32_to_bf16_bits(a);
        if (dst8 && i >= r0) reinterpret_cast<uint16_t *>(dst8)[i - r0] = dsv4_f32_to_bf16_bits(a); /* rope part */
        if (p.out_f32) p.out_f32[(size_t)row * dim + i] = a;
    }
}

/* One warp per row, for the long runs of a prefill step: at 524,288 rows of 512 (the q heads of an 8K-token step)
 * the block kernel above is bound by its barriers and block reductions (1.5 ms a call on the H200, 1 TB/s). A lane
 * holds E = dim / 32 consecutive channels in registers; E is even, so a RoPE pair never straddles two lanes. The
 * sum of squares is one warp reduction (dsv4_warp_sum), so the bits differ from the block kernel's (ulps of r);
 * they depend only on the row, never on the batch. Conditions: dsv4_opt_norm_rope_warp_ok. */
enum { NR_WARP_ROWS = 8 }; /* rows (warps) per block */
template <int E>
__global__ void __launch_bounds__(NR_WARP_ROWS * 32) norm_rope_warp_kernel(dsv4_norm_rope_params p, int n_rows)
{
    const int row = blockIdx.x * NR_WARP_ROWS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_rows) return;
    const int t = row / p.heads, h = row % p.heads, dim = p.dim, c0 = lane * E;
    const size_t src = (size_t)t * p.x_tok_stride + (size_t)h * dim + c0;
    float v[E];
    if (p.x_bf16) {
        const uint32_t *x2 = reinterpret_cast<const uint32_t *>(static_cast<const uint16_t *>(p.x) + src);
#pragma unroll
        for (int e = 0; e < E; e += 2) {
            const uint32_t w = x2[e / 2];
            v[e] = dsv4_bf16_bits_to_f32((uint16_t)(w & 0xffffu)), v[e + 1] = dsv4_bf16_bits_to_f32((uint16_t)(w >> 16));
        }
    } else {
        const float2 *x2 = reinterpret_cast<const float2 *>(static_cast<const float *>(p.x) + src);
#pragma unroll
        for (int e = 0; e < E; e += 2) {
            const float2 w = x2[e / 2];
            v[e] = w.x, v[e + 1] = w.y;
        }
    }
    if (p.norm) {
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) ss += v[e] * v[e];
        const float r = 1.0f / sqrtf(dsv4_warp_sum(ss) / (float)dim + p.eps);
#pragma unroll
        for (int e = 0; e < E; e++) v[e] = p.weight ? p.weight[c0 + e] * (v[e] * r) : v[e] * r;
    }
    const int np = p.rope_pairs, r0 = dim - 2 * np;
#pragma unroll
    for (int e = 0; e < E; e += 2) {
        if (c0 + e < r0) continue;
        const int i = (c0 + e - r0) >> 1;
        const float cs = p.cos[(size_t)t * np + i], sn = p.sin[(size_t)t * np + i];
        const float x0 = v[e], x1 = v[e + 1];
        v[e] = x0 * cs + (-x1) * sn;
        v[e + 1] = x1 * cs + x0 * sn;
    }
    uint32_t *dst = p.out ? reinterpret_cast<uint32_t *>(p.out + (size_t)t * p.out_tok_stride + (size_t)h * dim + c0)
                          : NULL;
    float2 *dst_f32 = p.out_f32 ? reinterpret_cast<float2 *>(p.out_f32 + (size_t)row * dim + c0) : NULL;
#pragma unroll
    for (int e = 0; e < E; e += 2) {
        const float a = v[e] * p.post_scale, b = v[e + 1] * p.post_scale;
        if (dst) dst[e / 2] = (uint32_t)dsv4_f32_to_bf16_bits(a) | ((uint32_t)dsv4_f32_to_bf16_bits(b) << 16);
        if (dst_f32) dst_f32[e / 2] = make_float2(a, b);
    }
}

__global__ void gather_rows_kernel(uint32_t *dst, const uint32_t *src, const int32_t *rows, size_t words)
{
    const size_t r = (size_t)rows[blockIdx.x];
    for (size_t i = threadIdx.x; i < words; i += blockDim.x) dst[blockIdx.x * words + i] = src[r * words + i];
}

__global__ void cast_b2f_kernel(float *dst, const uint16_t *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = dsv4_bf16_bits_to_f32(src[i]);
}
__global__ void cast_f2b_kernel(uint16_t *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = dsv4_f32_to_bf16_bits(src[i]);
}
__global__ void fill_kernel(float *dst, float value, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = value;
}

__global__ void __launch_bounds__(EW_THREADS) argmax_kernel(int32_t *out, const float *x, int n, int64_t stride)
{
    __shared__ float bv[EW_THREADS];
    __shared__ int bi[EW_THREADS];
    const float *r = x + (size_t)blockIdx.x * stride;
    float best = -INFINITY;
    int besti = -1;
    for (int i = threadIdx.x; i < n; i += EW_THREADS) {
        float a = r[i];
        if (a == a && (besti < 0 || a > best)) {
            best = a;
            besti = i;
        }
    }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = besti;
    __syncthreads();
    for (int s = EW_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = bv[threadIdx.x + s];
            int oi = bi[threadIdx.x + s];
            int mi = bi[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < mi))) {
                bv[threadIdx.x] = ov;
                bi[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = bi[0] < 0 ? 0 : bi[0];
}

/* ------------------------------------------------------------------------------------------- host */
static int ew_blocks(size_t n) { return (int)((n + 255) / 256); }

int dsv4_opt_cast_bf16_to_f32(float *dst, const uint16_t *src, size_t n, cudaStream_t stream)
{
    DSV4_CHECK(dst && src, "cast: NULL buffer");
    if (!n) return 0;
    cast_b2f_kernel<<<ew_blocks(n), 256, 0, stream>>>(dst, src, n);
    DSV4_LAUNCH_CHECK("cast_b2f_kernel");
    return 0;
}
int dsv4_opt_cast_f32_to_bf16(uint16_t *dst, const float *src, size_t n, cudaStream_t stream)
{
    DSV4_CHECK(dst && src, "cast: NULL buffer");
    if (!n) return 0;
    cast_f2b_kernel<<<ew_blocks(n), 256, 0, stream>>>(dst, src, n);
    DSV4_LAUNCH_CHECK("cast_f2b_kernel");
    return 0;
}
int dsv4_opt_fill_f32(float *dst, float value, size_t n, cudaStream_t stream)
{
    DSV4_CHECK(dst, "fill: NULL buffer");
    if (!n) return 0;
    fill_kernel<<<ew_blocks(n), 256, 0, stream>>>(dst, value, n);
    DSV4_LAUNCH_CHECK("fill_kernel");
    return 0;
}
int dsv4_opt_argmax(int32_t *out, const float *x, int n_rows, int n, int64_t stride, cudaStream_t stream)
{
    DSV4_CHECK(out && x && n_rows >= 1 && n >= 1 && stride >= n, "argmax: bad arguments");
    argmax_kernel<<<n_rows, EW_THREADS, 0, stream>>>(out, x, n, stride);
    DSV4_LAUNCH_CHECK("argmax_kernel");
    return 0;
}

int dsv4_opt_embed(const dsv4_embed_params *p)
{
    DSV4_CHECK(p && p->n_tok >= 1 && p->n_streams >= 1 && p->dim >= 1 && p->tokens && p->embed && p->X,
               "embed: bad params");
    size_t total = (size_t)p->n_tok * p->n_streams * p->dim;
    embed_kernel<<<ew_blocks(total), 256, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("embed_kernel");
    return 0;
}

int dsv4_opt_gather_rows(void *dst, const void *src, const int32_t *rows, int n, size_t row_bytes,
                         cudaStream_t stream)
{
    DSV4_CHECK(dst && src && rows && n >= 1 && row_bytes >= 4 && row_bytes % 4 == 0,
               "gather_rows: bad arguments (n %d, row_bytes %zu)", n, row_bytes);
    gather_rows_kernel<<<n, 256, 0, stream>>>(static_cast<uint32_t *>(dst), static_cast<const uint32_t *>(src), rows,
                                              row_bytes / 4);
    DSV4_LAUNCH_CHECK("gather_rows_kernel");
    return 0;
}

int dsv4_opt_norm_rope_warp_ok(const dsv4_norm_rope_params *p)
{
    const int E = p->dim / 32;
    const size_t in_align = p->x_bf16 ? 4 : 8, in_elem = p->x_bf16 ? 2 : 4;
    return p->warp_rows && !p->out8 && !p->out_slot && !p->fp8_nope && p->dim % 64 == 0 &&
           (E == 2 || E == 4 || E == 8 || E == 16 || E == 32) && (uintptr_t)p->x % in_align == 0 &&
           (p->x_tok_stride * in_elem) % in_align == 0 && (!p->out || ((uintptr_t)p->out % 4 == 0 &&
                                                                    p->out_tok_stride % 2 == 0)) &&
           (!p->out_f32 || (uintptr_t)p->out_f32 % 8 == 0);
}

int dsv4_opt_norm_rope(const dsv4_norm_rope_params *p)
{
    DSV4_CHECK(p != NULL, "norm_rope: params is NULL");
    if (p->dim < 1 || p->dim > EW_MAX_DIM)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "norm_rope: dim %d unsupported (1..%d)", p->dim, EW_MAX_DIM);
    DSV4_CHECK(p->n_tok >= 1 && p->heads >= 1 && p->x && (p->out || p->out8 || p->out_f32),
               "norm_rope: n_tok %d, heads %d or NULL x/out", p->n_tok, p->heads);
    DSV4_CHECK(!p->out8 || (!p->out && (p->out_slot || p->heads == 1) && p->fp8_nope && p->post_scale == 1.0f &&
                            dsv4_kv8_shape_ok(p->dim, 2 * p->rope_pairs) && p->out8_seq_stride % 16 == 0),
               "norm_rope: the fp8 cache write (out8) needs out NULL, out_slot or one head, fp8_nope, post_scale 1, a layout of "
               "kernels/kv_layout.h for dim %d with %d rope pairs and a 16-byte sequence stride", p->dim,
               p->rope_pairs);
    DSV4_CHECK(p->rope_pairs >= 0 && 2 * p->rope_pairs <= p->dim && (p->rope_pairs == 0 || (p->cos && p->sin)),
               "norm_rope: %d rope pairs for dim %d, or cos/sin NULL", p->rope_pairs, p->dim);
    DSV4_CHECK(!p->out_slot || p->heads == 1, "norm_rope: out_slot needs heads == 1");
    if (dsv4_opt_norm_rope_warp_ok(p)) {
        const int n_rows = p->n_tok * p->heads, grid = dsv4_ceil_div(n_rows, NR_WARP_ROWS);
        switch (p->dim / 32) {
        case 2: norm_rope_warp_kernel<2><<<grid, NR_WARP_ROWS * 32, 0, p->stream>>>(*p, n_rows); break;
        case 4: norm_rope_warp_kernel<4><<<grid, NR_WARP_ROWS * 32, 0, p->stream>>>(*p, n_rows); break;
        case 8: norm_rope_warp_kernel<8><<<grid, NR_WARP_ROWS * 32, 0, p->stream>>>(*p, n_rows); break;
        case 16: norm_rope_warp_kernel<16><<<grid, NR_WARP_ROWS * 32, 0, p->stream>>>(*p, n_rows); break;
        default: norm_rope_warp_kernel<32><<<grid, NR_WARP_ROWS * 32, 0, p->stream>>>(*p, n_rows); break;
        }
        DSV4_LAUNCH_CHECK("norm_rope_warp_kernel");
        return 0;
    }
    norm_rope_kernel<<<p->n_tok * p->heads, EW_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("norm_rope_kernel");
    return 0;
}
