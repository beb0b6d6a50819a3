/* indexer.cu - lightning-indexer scores, model-spec §8 step 4; both variants of the `indexer` switch and both
 * positions of `index_context` (design.md "The paths"). Launcher contract in indexer.cuh.
 *
 * BF16 (fused): one block per (tile of IDX_TILE = 128 entries, sequence), 4 warps, each warp 32 entries. The
 * product is computed transposed, S^T = K.Q^T (M = entries, N = heads, K = d_I), so that one mma accumulator row is
 * one entry: the head sum is a per-thread sum over its n-tiles plus a 2-step shuffle inside the lane quad, in a
 * fixed order (deterministic). Q and the key tile go to shared memory with cp.async, operands through ldmatrix.
 * F32 (original): SIMT GEMM with a 4x4 register tile into scratch [C, H, n_work], then ReLU*weight in place, then
 * the head sum (h = 0..H-1 in order) with the -inf mask of the `max` position.
 *
 * Quiet traps:
 *  - heads are padded to a multiple of 16 with zero q rows and zero weights: ReLU(0) * 0 adds exactly 0.
 *  - key rows past the bound are zero-filled (cp.async src_bytes 0), never read; their scores are not written
 *    (live) or written as -inf (max).
 *  - with every head's ReLU at 0 the score is exactly 0 (possibly -0 from a negative weight): exact ties are real,
 *    top-k must treat -0 == +0 (topk.cu canonicalises).
 */
#include <math.h>

#include "common.cuh"
#include "indexer.cuh"

enum { IDX_TILE = 128, IDX_WARPS = 4, IDX_THREADS = IDX_WARPS * 32, IDX_MAX_H = 64, IDX_MAX_D = 128 };
enum { IDX_F32_TILE = 64, IDX_F32_THREADS = 256, IDX_EW_THREADS = 256 };

/* Entries of sequence c that are computed: the live ones, or all n_work. */
/* The key buffer of query row c. */
static __device__ __forceinline__ const uint16_t *idx_keys(const dsv4_indexer_params &p, int c)
{
    return p.keys + (size_t)(p.key_seq ? p.key_seq[c] : c) * p.key_seq_stride;
}

static __device__ __forceinline__ int idx_bound(const dsv4_indexer_params &p, int c)
{
    return p.context == DSV4_INDEX_CONTEXT_LIVE ? p.n_live[c] : p.n_work;
}

/* ------------------------------------------------------------------------------------------------ BF16 fused */
__global__ void __launch_bounds__(IDX_THREADS) idx_bf16_kernel(const __grid_constant__ dsv4_indexer_params p)
{
    const int c = blockIdx.y, w0 = blockIdx.x * IDX_TILE;
    const int bound = idx_bound(p, c);
    if (w0 >= bound) return;
    const int d = p.head_dim, pitch = d + 8, chunks = d / 8, n_pairs = (p.n_heads + 15) / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;

    extern __shared__ __align__(16) unsigned char idx_smem[];
    uint16_t *q_s = reinterpret_cast<uint16_t *>(idx_smem); /* [16*n_pairs][d+8] */
    uint16_t *k_s = q_s + 16 * n_pairs * pitch;               /* [IDX_TILE][d+8] */

    const uint16_t *qc = p.q + (size_t)c * p.n_heads * d;
    for (int i = threadIdx.x; i < 16 * n_pairs * chunks; i += IDX_THREADS) {
        int row = i / chunks, ch = i - row * chunks;
        bool ok = row < p.n_heads;
        dsv4_cp_async16(q_s + row * pitch + ch * 8, qc + (size_t)(ok ? row : 0) * d + ch * 8, ok ? 16 : 0);
    }
    const uint16_t *kc = idx_keys(p, c);
    for (int i = threadIdx.x; i < IDX_TILE * chunks; i += IDX_THREADS) {
        int row = i / chunks, ch = i - row * chunks;
        bool ok = w0 + row < bound;
        dsv4_cp_async16(k_s + row * pitch + ch * 8, kc + (size_t)(ok ? w0 + row : 0) * d + ch * 8, ok ? 16 : 0);
    }
    dsv4_cp_async_commit();

    /* Head weights of this thread's accumulator columns: head 8*nt + 2*tq + e. */
    float wv[8][2];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int h = nt * 8 + 2 * tq + e;
            wv[nt][e] = h < p.n_heads ? p.weights[(size_t)c * p.n_heads + h] : 0.0f;
        }

    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;

    dsv4_cp_async_wait<0>();
    __syncthreads();

    const uint16_t *ka = k_s + (warp * 32 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + (lane >> 4) * 8;
    const uint16_t *qb = q_s + (((lane >> 4) << 3) + (lane & 7)) * pitch + ((lane >> 3) & 1) * 8;
    for (int ks = 0; ks < d / 16; ks++) {
        uint32_t a0[4], a1[4];
        dsv4_ldmatrix_x4(a0, ka + ks * 16);
        dsv4_ldmatrix_x4(a1, ka + 16 * pitch + ks * 16);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            if (np < n_pairs) {
                uint32_t b[4];
                dsv4_ldmatrix_x4(b, qb + np * 16 * pitch + ks * 16);
                dsv4_mma_bf16_16816(acc[0][2 * np], a0, b);
                dsv4_mma_bf16_16816(acc[0][2 * np + 1], a0, b + 2);
                dsv4_mma_bf16_16816(acc[1][2 * np], a1, b);
                dsv4_mma_bf16_16816(acc[1][2 * np + 1], a1, b + 2);
            }
        }
    }

#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        float s0 = 0.0f, s1 = 0.0f; /* rows g and g+8 of the m-tile */
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            s0 += wv[nt][0] * fmaxf(acc[mt][nt][0], 0.0f) + wv[nt][1] * fmaxf(acc[mt][nt][1], 0.0f);
            s1 += wv[nt][0] * fmaxf(acc[mt][nt][2], 0.0f) + wv[nt][1] * fmaxf(acc[mt][nt][3], 0.0f);
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        if (tq == 0) {
            const int live = p.n_live[c];
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int w = w0 + warp * 32 + mt * 16 + g + half * 8;
                if (w < bound) p.scores[(size_t)c * p.score_stride + w] = w < live ? (half ? s1 : s0) : -INFINITY;
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------ F32 original */
/* dots[c, h, w] = q[c, h, :] . keys[c, w, :] for w < bound; 4 heads x 4 entries per thread. */
__global__ void __launch_bounds__(IDX_F32_THREADS) idx_f32_gemm(const __grid_constant__ dsv4_indexer_params p)
{
    const int c = blockIdx.y, w0 = blockIdx.x * IDX_F32_TILE, bound = idx_bound(p, c);
    if (w0 >= bound) return;
    const int d = p.head_dim, H = p.n_heads;
    extern __shared__ __align__(16) unsigned char f32_smem[];
    float *q_s = reinterpret_cast<float *>(f32_smem); /* [H][d] */
    float *k_s = q_s + H * d;                          /* [IDX_F32_TILE][d+1] */
    const uint16_t *qc = p.q + (size_t)c * H * d, *kc = idx_keys(p, c);
    for (int i = threadIdx.x; i < H * d; i += IDX_F32_THREADS) q_s[i] = __uint_as_float((uint32_t)qc[i] << 16);
    for (int i = threadIdx.x; i < IDX_F32_TILE * d; i += IDX_F32_THREADS) {
        int row = i / d, col = i - row * d;
        k_s[row * (d + 1) + col] = w0 + row < bound ? __uint_as_float((uint32_t)kc[(size_t)(w0 + row) * d + col] << 16) : 0.0f;
    }
    __syncthreads();
    const int hx = threadIdx.x / 16, wx = threadIdx.x % 16;
    float acc[4][4] = {};
    for (int k = 0; k < d; k++) {
        float qv[4], kv[4];
#pragma unroll
        for (int i = 0; i < 4; i++) qv[i] = (hx * 4 + i < H) ? q_s[(hx * 4 + i) * d + k] : 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) kv[j] = k_s[(wx + 16 * j) * (d + 1) + k];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] += qv[i] * kv[j];
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int h = hx * 4 + i;
        if (h >= H) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int w = w0 + wx + 16 * j;
            if (w < bound) p.scratch[((size_t)c * H + h) * p.n_work + w] = acc[i][j];
        }
    }
}

/* x = weight[c, h] * ReLU(x), elementwise over [C, H, bound(c)]. */
__global__ void idx_f32_relu_weight(const __grid_constant__ dsv4_indexer_params p)
{
    const int c = blockIdx.z, h = blockIdx.y, w = blockIdx.x * IDX_EW_THREADS + threadIdx.x;
    if (w >= idx_bound(p, c)) return;
    float *x = p.scratch + ((size_t)c * p.n_heads + h) * p.n_work + w;
    *x = p.weights[(size_t)c * p.n_heads + h] * fmaxf(*x, 0.0f);
}

/* scores[c, w] = sum over h in order; -inf past n_live (max position). */
__global__ void idx_f32_head_sum(const __grid_constant__ dsv4_indexer_params p)
{
    const int c = blockIdx.y, w = blockIdx.x * IDX_EW_THREADS + threadIdx.x;
    if (w >= idx_bound(p, c)) return;
    float s = 0.0f;
    for (int h = 0; h < p.n_heads; h++) s += p.scratch[((size_t)c * p.n_heads + h) * p.n_work + w];
    p.scores[(size_t)c * p.score_stride + w] = w < p.n_live[c] ? s : -INFINITY;
}

/* ------------------------------------------------------------------------------------------------ host */
static int idx_validate(const dsv4_indexer_params *p)
{
    DSV4_CHECK(p != NULL, "indexer: params is NULL");
    DSV4_CHECK(p->n_seq >= 1 && p->n_work >= 1, "indexer: n_seq %d and n_work %d must be >= 1", p->n_seq, p->n_work);
    if (p->n_heads < 1 || p->n_heads > IDX_MAX_H || p->head_dim < 16 || p->head_dim % 16 != 0 ||
        p->head_dim > IDX_MAX_D)
        return dsv4_error(DSV4_ERR_UNSUPPORTED,
                          "indexer: n_heads %d (1..%d) x head_dim %d (multiple of 16, <= %d) unsupported", p->n_heads,
                          IDX_MAX_H, p->head_dim, IDX_MAX_D);
    DSV4_CHECK(p->q && p->keys && p->weights && p->n_live && p->scores, "indexer: q, keys, weights, n_live, scores "
                                                                        "must be non-NULL");
    DSV4_CHECK(dsv4_aligned16(p->q) && dsv4_aligned16(p->keys), "indexer: q and keys must be 16-byte aligned");
    DSV4_CHECK(p->key_seq_stride % 8 == 0 && (p->n_seq == 1 || p->key_seq || p->key_seq_stride >= (int64_t)p->n_work * p->head_dim),
               "indexer: key_seq_stride %lld must be a multiple of 8 and >= n_work*head_dim",
               (long long)p->key_seq_stride);
    DSV4_CHECK(p->score_stride >= p->n_work, "indexer: score_stride %lld < n_work %d", (long long)p->score_stride,
               p->n_work);
    DSV4_CHECK(p->kernel == DSV4_INDEXER_KERNEL_BF16 || p->kernel == DSV4_INDEXER_KERNEL_F32,
               "indexer: bad kernel %d", (int)p->kernel);
    DSV4_CHECK(p->context == DSV4_INDEX_CONTEXT_LIVE || p->context == DSV4_INDEX_CONTEXT_MAX,
               "indexer: bad context %d", (int)p->context);
    return 0;
}

extern "C" size_t dsv4_opt_indexer_scratch_bytes(const dsv4_indexer_params *p)
{
    if (p == NULL || p->kernel != DSV4_INDEXER_KERNEL_F32) return 0;
    return (size_t)p->n_seq * p->n_heads * p->n_work * sizeof(float);
}

extern "C" int dsv4_opt_indexer_scores(const dsv4_indexer_params *p)
{
    int rc = idx_validate(p);
    if (rc != 0) return rc;
    const int d = p->head_dim;
    if (p->kernel == DSV4_INDEXER_KERNEL_BF16) {
        size_t smem = (size_t)(16 * ((p->n_heads + 15) / 16) + IDX_TILE) * (d + 8) * 2;
        DSV4_CUDA_CHECK(cudaFuncSetAttribute(idx_bf16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        idx_bf16_kernel<<<dim3(dsv4_ceil_div(p->n_work, IDX_TILE), p->n_seq), IDX_THREADS, smem, p->stream>>>(*p);
        DSV4_LAUNCH_CHECK("idx_bf16_kernel");
        return 0;
    }
    size_t need = dsv4_opt_indexer_scratch_bytes(p);
    DSV4_CHECK(p->scratch != NULL && p->scratch_bytes >= need, "indexer f32: scratch of %zu B needed, got %zu B at %p",
               need, p->scratch_bytes, (void *)p->scratch);
    size_t smem = ((size_t)p->n_heads * d + (size_t)IDX_F32_TILE * (d + 1)) * sizeof(float);
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(idx_f32_gemm, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    idx_f32_gemm<<<dim3(dsv4_ceil_div(p->n_work, IDX_F32_TILE), p->n_seq), IDX_F32_THREADS, smem, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("idx_f32_gemm");
    const int ew_blocks = dsv4_ceil_div(p->n_work, IDX_EW_THREADS);
    idx_f32_relu_weight<<<dim3(ew_blocks, p->n_heads, p->n_seq), IDX_EW_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("idx_f32_relu_weight");
    idx_f32_head_sum<<<dim3(ew_blocks, p->n_seq), IDX_EW_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("idx_f32_head_sum");
    return 0;
}
