/* mhc.cu - mHC pre / post / hc_head of the optimized path (model-spec §5.1-§5.3), cast-free and roundtrip.
 *
 * FOUR PLACES THIS GOES WRONG QUIETLY (as in reference/ref_mhc.c):
 * 1. Sinkhorn: one row softmax (+eps), ONE column normalisation, then (iters-1) x (row, column): ends on a column.
 * 2. comb[j][k] is the weight FROM stream j TO stream k: X'[k] = post[k]·out + Σ_j comb[j][k]·X[j].
 * 3. pre = sigmoid(..) + hc_eps; post = 2·sigmoid(..) without eps.
 * 4. The RMS is over the whole flattened n·D vector, unweighted: m = rho·(fn·v) with rho = rsqrt(mean(v²)+eps).
 * Cast-free layout: part[c][chunk][0..n_mix-1] = Σ fn·v over the chunk, part[..][n_mix] = Σ v²; the finish kernel
 * sums the chunks in ascending order (deterministic). A partial block serves up to 4 tokens of one chunk
 * (mhc_tokens_per_block; each fn value loaded once for all of them) and reduces in the order of dsv4_block_sum,
 * so a token's partials are the same bits whatever the batch size below DSV4_MHC_TILED_MIN_TOKENS. From there on
 * (a long prefill run) the tiled kernel takes 128 tokens per block (DSV4_MHC_PARTIAL_ROWS keeps the per-token one):
 * the same layout, its own order of adds, again the same bits whatever the batch size as long as it tiles.
 */
#include <math.h>

#include "mhc.cuh"
#include "opt_common.cuh"

enum { MHC_MAX_N = 4, MHC_MAX_MIX = 24, MHC_CHUNK = 512, MHC_THREADS = 256, MHC_WARPS = MHC_THREADS / 32 };
/* a partial block's elements per thread in one chunk */
enum { MHC_PER_THREAD = MHC_CHUNK / MHC_THREADS };
static_assert(MHC_CHUNK % MHC_THREADS == 0, "a chunk is whole rounds of the block");
/* the finish kernel keeps a token's collapsed row in registers when D <= MHC_THREADS * MHC_ROW_REGS */
enum { MHC_ROW_REGS = 16 };
/* the finish kernel stages a token's cast-free partials in shared memory when there are at most this many
 * (8 KB; Flash: 32 chunks x 25 = 800; D = 7168 with 4 streams: 1,400) */
enum { MHC_STAGE_FLOATS = 2048 };

static __device__ __forceinline__ float mhc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Σ_q v of lane first + q·stride, q = 0 .. n-1 ascending: a row (first j·n, stride 1) or a column (first k,
 * stride n) of the n x n matrix the lanes hold. */
static __device__ float mhc_lane_sum(float v, int first, int stride, int n)
{
    float t = 0.0f;
#pragma unroll
    for (int q = 0; q < MHC_MAX_N; q++) {
        const float x = __shfl_sync(0xffffffffu, v, first + q * stride);
        if (q < n) t += x;
    }
    return t;
}

/* Coefficients of one token from its raw mix m[0 .. n_mix) (already times rho), on warp 0 (every lane calls it):
 * lane i < n·n owns comb entry (j, k) = (i / n, i % n), lanes < n own pre/post. Row and column sums add the
 * other lanes' values, fetched by shuffles, in ascending index order, the order of reference/ref_mhc.c's loops.
 * It used to run on thread 0 alone: 20 Sinkhorn rounds of 32 dependent divisions made the pre ~90 µs at any C.
 * Then through shared memory, a store and two __syncwarp per normalisation: still most of the finish kernel's
 * ~45,000 cycles at C = 1 (ncu, session 8); the shuffles give the same bits without the round trips. */
static __device__ void mhc_coeffs_warp(const float *m, int n, int head, int iters, float eps, const float *base,
                                       const float *scale, float *pre, float *post, float *comb)
{
    const int lane = threadIdx.x & 31, nn = n * n, on = lane < nn;
    const int j = on ? lane / n : 0, k = on ? lane % n : 0; /* lanes >= n·n shadow entry (0, 0) */
    if (lane < n) pre[lane] = mhc_sigmoid(m[lane] * scale[0] + base[lane]) + eps;
    if (head) return;
    if (lane < n) post[lane] = 2.0f * mhc_sigmoid(m[n + lane] * scale[1] + base[n + lane]);
    const int e = on ? lane : 0;
    float v = m[2 * n + e] * scale[2] + base[2 * n + e];
    float mx = __shfl_sync(0xffffffffu, v, j * n); /* row softmax */
#pragma unroll
    for (int q = 1; q < MHC_MAX_N; q++) {
        const float x = __shfl_sync(0xffffffffu, v, j * n + q);
        if (q < n) mx = fmaxf(mx, x);
    }
    v = expf(v - mx);
    v = v / mhc_lane_sum(v, j * n, 1, n) + eps;
    for (int it = 0; it < iters; it++) {
        if (it > 0) v /= mhc_lane_sum(v, j * n, 1, n) + eps;
        v /= mhc_lane_sum(v, k, n, n) + eps;
    }
    if (on) comb[lane] = v;
}

/* ------------------------------------------------------------------------------------------- cast-free */
/* dsv4_block_sum's second stage for MHC_WARPS = 8, written out: lane 0 of dsv4_warp_sum over the 8 warp sums
 * and 24 zero lanes (xor offsets 16 and 8 add the zeros, then 4, 2, 1), so the result has the same bits. */
static_assert(MHC_WARPS == 8, "mhc_sum_warps is written for 8 warps");
static __device__ __forceinline__ float mhc_sum_warps(const float *w, int stride)
{
    float q[8];
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = (w[i * stride] + 0.0f) + 0.0f;
    const float a0 = q[0] + q[4], a1 = q[1] + q[5], a2 = q[2] + q[6], a3 = q[3] + q[7];
    return (a0 + a2) + (a1 + a3);
}

/* grid (n_chunks, ceil(C / TOK)): partial projection and sum of squares of one chunk of TOK tokens' flattened
 * streams. Per token and output the adds run in the order of the one-token kernel it replaced (elements
 * ascending per thread, then dsv4_warp_sum, then the warps as mhc_sum_warps): one __syncthreads instead of one
 * block reduction per output. */
template <int NMIX, int TOK>
__global__ void __launch_bounds__(MHC_THREADS) mhc_partial_kernel(const uint16_t *__restrict__ X,
                                                                  const float *__restrict__ fn, int nD, int C,
                                                                  float *__restrict__ part)
{
    __shared__ float wsum[MHC_WARPS][TOK * (NMIX + 1)];
    const int chunk = blockIdx.x, c0 = blockIdx.y * TOK, n_chunks = gridDim.x;
    const int n_tok = min(TOK, C - c0), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float acc[TOK][NMIX + 1];
#pragma unroll
    for (int t = 0; t < TOK; t++)
#pragma unroll
        for (int r = 0; r <= NMIX; r++) acc[t][r] = 0.0f;
    const int i0 = chunk * MHC_CHUNK, i1 = min(nD, i0 + MHC_CHUNK);
    /* DEPTH elements' loads first, from valid (clamped) addresses, then their adds in the order of the plain loop
     * (elements ascending, then outputs). One token: both elements of a thread at once, one L2 latency where there
     * were two (partial block 2.2 -> 1.4-1.5 us, session 15). More tokens: one element at a time, as the registers the
     * deeper prefetch takes (226 at 4 tokens) halve the blocks per SM, which cost more than it saved. */
    constexpr int DEPTH = TOK == 1 ? MHC_PER_THREAD : 1;
#pragma unroll 1
    for (int s0 = 0; s0 < MHC_PER_THREAD; s0 += DEPTH) {
        float xs[DEPTH][TOK], fs[DEPTH][NMIX];
#pragma unroll
        for (int s = 0; s < DEPTH; s++) {
            const int i = min(i0 + (int)threadIdx.x + (s0 + s) * MHC_THREADS, nD - 1);
#pragma unroll
            for (int t = 0; t < TOK; t++) /* a token past the batch reads the last one's value; unused */
                xs[s][t] = dsv4_bf16_bits_to_f32(X[(size_t)(c0 + min(t, n_tok - 1)) * nD + i]);
#pragma unroll
            for (int r = 0; r < NMIX; r++) fs[s][r] = __ldg(fn + (size_t)r * nD + i);
        }
#pragma unroll
        for (int s = 0; s < DEPTH; s++) {
            if (i0 + (int)threadIdx.x + (s0 + s) * MHC_THREADS >= i1) break;
            float v[TOK];
#pragma unroll
            for (int t = 0; t < TOK; t++) {
                v[t] = t < n_tok ? xs[s][t] : 0.0f;
                acc[t][NMIX] += v[t] * v[t];
            }
#pragma unroll
            for (int r = 0; r < NMIX; r++)
#pragma unroll
                for (int t = 0; t < TOK; t++) acc[t][r] += fs[s][r] * v[t];
        }
    }
#pragma unroll
    for (int t = 0; t < TOK; t++)
#pragma unroll
        for (int r = 0; r <= NMIX; r++) {
            const float w = dsv4_warp_sum(acc[t][r]);
            if (lane == 0) wsum[warp][t * (NMIX + 1) + r] = w;
        }
    __syncthreads();
    for (int k = threadIdx.x; k < n_tok * (NMIX + 1); k += MHC_THREADS) {
        const int t = k / (NMIX + 1), r = k % (NMIX + 1);
        part[((size_t)(c0 + t) * n_chunks + chunk) * (NMIX + 1) + r] = mhc_sum_warps(&wsum[0][k], TOK * (NMIX + 1));
    }
}

/* ------------------------------------------------------------------------------------- cast-free, long runs */
/* A call of >= DSV4_MHC_TILED_MIN_TOKENS tokens. The per-token kernel above loads a chunk of fn (24 x 512 fp32, 48 KB)
 * for every 4 tokens: 3 GB of L2 traffic per call at 8K tokens, and its SIMT loop waits on it (2.2 ms per call on
 * the H200, session 23, where X alone would take 0.07 ms). Here block (chunk, tile) takes MHC_TILE_TOK tokens x one
 * MHC_CHUNK chunk, the same partial layout, so the finish kernel is shared. The chunk goes through shared memory
 * MHC_SUB elements at a time as fp32 (X [token][k], fn [output][k]; the next sub-step's loads are in registers
 * while this one is multiplied), so fn is read once per 128 tokens and X once.
 * Thread (tg, og, kg) keeps a register tile: tokens tg + 16·m (m < 8) x outputs og·TN .. og·TN + TN - 1, and the
 * sum of squares of its tokens m = og and og + 4, over the k's kg·16 .. kg·16 + 15 of every sub-step; float4 reads
 * of 4 k's (one for fn per half warp, the same address: a broadcast; the X rows of a quarter warp 17 quads apart:
 * no bank conflict). Then the four k groups are summed in ascending order. Per token and output the adds run in
 * an order that depends on neither the batch nor the token's place in its tile (deterministic, and a token's
 * partials are the same bits in any call that tiles), but not the per-token kernel's order. */
enum { MHC_TILE_TOK = 128, MHC_SUB = 64, MHC_TG = 16, MHC_TM = MHC_TILE_TOK / MHC_TG, MHC_OG = 4, MHC_KG = 4 };
enum { MHC_XS = MHC_SUB + 4 }; /* X row stride in shared memory: 17 quads, so 8 rows hit 8 bank quads */
static_assert(MHC_TG * MHC_OG * MHC_KG == MHC_THREADS, "one thread per (token group, output group, k group)");
static_assert(MHC_SUB == MHC_KG * 16 && MHC_CHUNK % MHC_SUB == 0, "a k group takes 16 of a sub-step's k");
static_assert(MHC_TM == 2 * MHC_OG, "each output group sums the squares of two of its thread's tokens");
static_assert(MHC_KG == 4, "the last adds of mhc_partial_tiled_kernel are written for four k groups");
static_assert(MHC_TILE_TOK * MHC_SUB / 8 == 4 * MHC_THREADS, "X: four 8-element segments per thread");

/* 8 bf16 of X from k on (k a multiple of 8; zero past k_end): one 16-byte load when vec (n·D % 8 == 0 and X
 * 16-aligned), else element by element. Streamed (evict first): fn should stay in L2, X is read once. */
static __device__ __forceinline__ uint4 mhc_x8(const uint16_t *__restrict__ row, int k, int k_end, int vec)
{
    if (k >= k_end) return make_uint4(0, 0, 0, 0);
    if (vec) return __ldcs(reinterpret_cast<const uint4 *>(row + k));
    uint32_t h[8];
#pragma unroll
    for (int e = 0; e < 8; e++) h[e] = k + e < k_end ? row[k + e] : 0u;
    return make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
}
/* 4 fn values from k on (k a multiple of 4; zero past k_end) */
static __device__ __forceinline__ float4 mhc_f4(const float *__restrict__ row, int k, int k_end, int vec)
{
    if (k >= k_end) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (vec) return __ldg(reinterpret_cast<const float4 *>(row + k));
    float f[4];
#pragma unroll
    for (int e = 0; e < 4; e++) f[e] = k + e < k_end ? row[k + e] : 0.0f;
    return make_float4(f[0], f[1], f[2], f[3]);
}
static __device__ __forceinline__ float4 mhc_bf16x4(uint32_t lo, uint32_t hi)
{
    return make_float4(__uint_as_float(lo << 16), __uint_as_float(lo & 0xffff0000u), __uint_as_float(hi << 16),
                       __uint_as_float(hi & 0xffff0000u));
}

/* grid (n_chunks, ceil(C / MHC_TILE_TOK)); 40 KB of static shared memory, two blocks per SM. */
template <int NMIX>
__global__ void __launch_bounds__(MHC_THREADS, 2) mhc_partial_tiled_kernel(const uint16_t *__restrict__ X,
                                                                           const float *__restrict__ fn, int nD,
                                                                           int C, int vec, float *__restrict__ part)
{
    constexpr int TN = (NMIX + MHC_OG - 1) / MHC_OG, NF = MHC_OG * TN; /* fn rows staged; rows >= NMIX are zero */
    constexpr int FV = NMIX * MHC_SUB / 4, FV_PER = (FV + MHC_THREADS - 1) / MHC_THREADS; /* fn float4s per sub-step */
    constexpr int STAGE = MHC_TILE_TOK * MHC_XS + NF * MHC_SUB, RED = (MHC_KG - 1) * (NMIX + 1) * MHC_TILE_TOK;
    __shared__ __align__(16) float sm[STAGE > RED ? STAGE : RED];
    float *xs = sm, *fs = sm + MHC_TILE_TOK * MHC_XS;
    const int chunk = blockIdx.x, n_chunks = gridDim.x, c0 = blockIdx.y * MHC_TILE_TOK;
    const int n_tok = min(MHC_TILE_TOK, C - c0), i0 = chunk * MHC_CHUNK, k_end = min(nD, i0 + MHC_CHUNK);
    const int n_sub = (k_end - i0 + MHC_SUB - 1) / MHC_SUB;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tg = lane & 15, og = 2 * (warp & 1) + (lane >> 4), kg = warp >> 1;
    for (int i = threadIdx.x; i < (NF - NMIX) * MHC_SUB; i += MHC_THREADS) fs[NMIX * MHC_SUB + i] = 0.0f;

    uint4 xr[4];
    float4 fr[FV_PER];
    auto load = [&](int s) { /* sub-step s into registers: X segment (row, q) = 8 k's; fn (row, q) = 4 k's */
        const int k0 = i0 + s * MHC_SUB;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int seg = threadIdx.x + u * MHC_THREADS, row = seg >> 3, q = seg & 7;
            xr[u] = row < n_tok ? mhc_x8(X + (size_t)(c0 + row) * nD, k0 + q * 8, k_end, vec) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < FV_PER; u++) {
            const int v = threadIdx.x + u * MHC_THREADS, r = v >> 4, q = v & 15;
            if (v < FV) fr[u] = mhc_f4(fn + (size_t)r * nD, k0 + q * 4, k_end, vec);
        }
    };
    float acc[MHC_TM][TN], ss[2] = {0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < MHC_TM; m++)
#pragma unroll
        for (int q = 0; q < TN; q++) acc[m][q] = 0.0f;
    load(0);
#pragma unroll 1
    for (int s = 0; s < n_sub; s++) {
        if (s > 0) __syncthreads(); /* the last sub-step's reads are done */
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int seg = threadIdx.x + u * MHC_THREADS, row = seg >> 3, q = seg & 7;
            float4 *dst = reinterpret_cast<float4 *>(xs + row * MHC_XS + q * 8);
            dst[0] = mhc_bf16x4(xr[u].x, xr[u].y);
            dst[1] = mhc_bf16x4(xr[u].z, xr[u].w);
        }
#pragma unroll
        for (int u = 0; u < FV_PER; u++) {
            const int v = threadIdx.x + u * MHC_THREADS;
            if (v < FV) reinterpret_cast<float4 *>(fs)[v] = fr[u];
        }
        __syncthreads();
        if (s + 1 < n_sub) load(s + 1);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int kk = kg * 16 + j * 4;
            float4 f[TN];
#pragma unroll
            for (int q = 0; q < TN; q++) f[q] = *reinterpret_cast<const float4 *>(fs + (og * TN + q) * MHC_SUB + kk);
#pragma unroll
            for (int m = 0; m < MHC_TM; m++) {
                const float4 x = *reinterpret_cast<const float4 *>(xs + (tg + MHC_TG * m) * MHC_XS + kk);
#pragma unroll
                for (int q = 0; q < TN; q++) {
                    float a = acc[m][q];
                    a += f[q].x * x.x, a += f[q].y * x.y, a += f[q].z * x.z, a += f[q].w * x.w;
                    acc[m][q] = a;
                }
                if ((m & (MHC_OG - 1)) == og) {
                    float t = ss[m / MHC_OG];
                    t += x.x * x.x, t += x.y * x.y, t += x.z * x.z, t += x.w * x.w;
                    ss[m / MHC_OG] = t;
                }
            }
        }
    }
    /* k groups 1..3 hand their sums over in shared memory ([kg - 1][r][token]), k group 0 adds them in order */
    __syncthreads();
    float *red = sm;
    if (kg > 0) {
        float *rk = red + (size_t)(kg - 1) * (NMIX + 1) * MHC_TILE_TOK;
#pragma unroll
        for (int m = 0; m < MHC_TM; m++) {
#pragma unroll
            for (int q = 0; q < TN; q++)
                if (og * TN + q < NMIX) rk[(og * TN + q) * MHC_TILE_TOK + tg + MHC_TG * m] = acc[m][q];
            if ((m & (MHC_OG - 1)) == og) rk[NMIX * MHC_TILE_TOK + tg + MHC_TG * m] = ss[m / MHC_OG];
        }
    }
    __syncthreads();
    if (kg > 0) return;
    constexpr int RS = (NMIX + 1) * MHC_TILE_TOK; /* one k group's block of red */
#pragma unroll
    for (int m = 0; m < MHC_TM; m++) {
        const int t = tg + MHC_TG * m;
        if (t >= n_tok) continue;
        float *dst = part + ((size_t)(c0 + t) * n_chunks + chunk) * (NMIX + 1);
#pragma unroll
        for (int q = 0; q < TN; q++) {
            const int r = og * TN + q, i = r * MHC_TILE_TOK + t;
            if (r < NMIX) dst[r] = ((acc[m][q] + red[i]) + red[RS + i]) + red[2 * RS + i];
        }
        if ((m & (MHC_OG - 1)) == og) {
            const int i = NMIX * MHC_TILE_TOK + t;
            dst[NMIX] = ((ss[m / MHC_OG] + red[i]) + red[RS + i]) + red[2 * RS + i];
        }
    }
}

/* grid C: sum the partials, coefficients, collapse and the site's RMSNorm. mix_in != NULL (roundtrip): the
 * projection comes from the SGEMM ([C, n_mix]) and the sum of squares from part ([C]). One block per token, so at
 * small C the kernel is a chain of latencies: the cast-free path first starts every load it will need (the
 * token's partials into shared memory when staged, its row and the norm weights into registers), then sums and
 * works out the coefficients on warp 0 while the loads land. */
__global__ void __launch_bounds__(MHC_THREADS) mhc_finish_kernel(dsv4_mhc_pre_params p, int n_mix, int n_chunks,
                                                                 const float *__restrict__ part,
                                                                 const float *__restrict__ mix_in, int staged)
{
    extern __shared__ float part_s[]; /* staged: this token's partials, [n_chunks][n_mix + 1] */
    __shared__ float m[MHC_MAX_MIX + 1], pre[MHC_MAX_N];
    const int c = blockIdx.x, n = p.n_streams, D = p.dim, nD = n * D, lane = threadIdx.x;
    const uint16_t *x = p.X + (size_t)c * nD;
    const float *pc = part + (size_t)c * n_chunks * (n_mix + 1);
    const bool in_regs = !mix_in && D <= MHC_THREADS * MHC_ROW_REGS;
    float xv[MHC_ROW_REGS][MHC_MAX_N], nw[MHC_ROW_REGS];
    if (in_regs) {
        /* Every load from a valid (clamped) address, not predicated: with `d < D && j < n ? load : 0` ptxas loaded
         * into one scratch register and converted it before the next load, 32 L2 round trips in a row (18,400
         * cycles at C = 1, session 15). The collapse skips d >= D and j >= n. */
#pragma unroll
        for (int k = 0; k < MHC_ROW_REGS; k++) {
            const int d = threadIdx.x + k * MHC_THREADS;
#pragma unroll
            for (int j = 0; j < MHC_MAX_N; j++)
                xv[k][j] = dsv4_bf16_bits_to_f32(x[(size_t)min(j, n - 1) * D + min(d, D - 1)]);
            nw[k] = d < D && p.norm_w ? p.norm_w[d] : 0.0f;
        }
    }
    if (staged) { /* all loads of a round before its stores: one L2 latency per 1,024 partials, not n_chunks / 8 */
        const int total = n_chunks * (n_mix + 1);
        for (int i0 = 0; i0 < total; i0 += 4 * MHC_THREADS) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int i = i0 + u * MHC_THREADS + threadIdx.x;
                v[u] = i < total ? pc[i] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int i = i0 + u * MHC_THREADS + threadIdx.x;
                if (i < total) part_s[i] = v[u];
            }
        }
        __syncthreads();
    }
    if (threadIdx.x < 32) { /* warp 0: lane r sums partial r over the chunks (ascending), then the coefficients */
        float s = 0.0f;
        if (lane <= n_mix) {
            if (mix_in) s = lane < n_mix ? mix_in[(size_t)c * n_mix + lane] : part[c];
            else if (staged)
#pragma unroll 8
                for (int k = 0; k < n_chunks; k++) s += part_s[k * (n_mix + 1) + lane];
            else
#pragma unroll 8 /* the loads go ahead of the in-order adds: one L2 latency per 8 chunks, not per chunk */
                for (int k = 0; k < n_chunks; k++) s += pc[k * (n_mix + 1) + lane];
            m[lane] = s;
        }
        __syncwarp();
        const float rho = 1.0f / sqrtf(m[n_mix] / (float)nD + p.norm_eps);
        __syncwarp();
        if (lane < n_mix) m[lane] = s * rho;
        __syncwarp();
        float *g_post = p.head ? NULL : p.post + (size_t)c * n, *g_comb = p.head ? NULL : p.comb + (size_t)c * n * n;
        mhc_coeffs_warp(m, n, p.head, p.sinkhorn_iters, p.hc_eps, p.base, p.scale, pre, g_post, g_comb);
        if (lane < n) p.pre[(size_t)c * n + lane] = pre[lane];
    }
    __syncthreads();
    if (mix_in) return; /* roundtrip: collapse and norm are their own kernels */
    float ss = 0.0f;
    if (in_regs) {
        /* the row stays in registers for the norm; the same adds in the same order as the loop below */
        float a[MHC_ROW_REGS];
#pragma unroll
        for (int k = 0; k < MHC_ROW_REGS; k++) {
            const int d = threadIdx.x + k * MHC_THREADS;
            a[k] = 0.0f;
#pragma unroll
            for (int j = 0; j < MHC_MAX_N; j++)
                if (d < D && j < n) a[k] += pre[j] * xv[k][j];
        }
#pragma unroll
        for (int k = 0; k < MHC_ROW_REGS; k++) {
            const int d = threadIdx.x + k * MHC_THREADS;
            if (d < D) p.x[(size_t)c * D + d] = a[k], ss += a[k] * a[k];
        }
        if (!p.norm_w) return;
        const float r = 1.0f / sqrtf(dsv4_block_sum(ss) / (float)D + p.norm_eps);
#pragma unroll
        for (int k = 0; k < MHC_ROW_REGS; k++) {
            const int d = threadIdx.x + k * MHC_THREADS;
            if (d < D) p.xn[(size_t)c * D + d] = dsv4_f32_to_bf16_bits(nw[k] * (a[k] * r));
        }
        return;
    }
    for (int d = threadIdx.x; d < D; d += MHC_THREADS) {
        float a = 0.0f;
        for (int j = 0; j < n; j++) a += pre[j] * dsv4_bf16_bits_to_f32(x[(size_t)j * D + d]);
        p.x[(size_t)c * D + d] = a;
        ss += a * a;
    }
    if (!p.norm_w) return;
    float r = 1.0f / sqrtf(dsv4_block_sum(ss) / (float)D + p.norm_eps);
    for (int d = threadIdx.x; d < D; d += MHC_THREADS)
        p.xn[(size_t)c * D + d] = dsv4_f32_to_bf16_bits(p.norm_w[d] * (p.x[(size_t)c * D + d] * r));
}

/* ------------------------------------------------------------------------------------------- roundtrip */
__global__ void mhc_cast_kernel(const uint16_t *__restrict__ X, float *__restrict__ Xf, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Xf[i] = dsv4_bf16_bits_to_f32(X[i]);
}
__global__ void __launch_bounds__(MHC_THREADS) mhc_sumsq_kernel(const float *__restrict__ Xf, int nD,
                                                                float *__restrict__ ss)
{
    const float *x = Xf + (size_t)blockIdx.x * nD;
    float s = 0.0f;
    for (int i = threadIdx.x; i < nD; i += MHC_THREADS) s += x[i] * x[i];
    s = dsv4_block_sum(s);
    if (threadIdx.x == 0) ss[blockIdx.x] = s;
}
__global__ void mhc_collapse_kernel(const float *__restrict__ Xf, const float *__restrict__ pre, int n, int D,
                                    int C, float *__restrict__ x)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C * D) return;
    int c = i / D, d = i % D;
    float a = 0.0f;
    for (int j = 0; j < n; j++) a += pre[c * n + j] * Xf[((size_t)c * n + j) * D + d];
    x[i] = a;
}
__global__ void __launch_bounds__(MHC_THREADS) mhc_norm_kernel(const float *__restrict__ x,
                                                               const float *__restrict__ w, int D, float eps,
                                                               uint16_t *__restrict__ xn)
{
    const float *r = x + (size_t)blockIdx.x * D;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += MHC_THREADS) ss += r[d] * r[d];
    float rr = 1.0f / sqrtf(dsv4_block_sum(ss) / (float)D + eps);
    for (int d = threadIdx.x; d < D; d += MHC_THREADS)
        xn[(size_t)blockIdx.x * D + d] = dsv4_f32_to_bf16_bits(w[d] * (r[d] * rr));
}

/* ------------------------------------------------------------------------------------------- post */
template <typename T> static __device__ __forceinline__ float mhc_ld(const T *p, size_t i);
template <> __device__ __forceinline__ float mhc_ld<uint16_t>(const uint16_t *p, size_t i)
{
    return dsv4_bf16_bits_to_f32(p[i]);
}
template <> __device__ __forceinline__ float mhc_ld<float>(const float *p, size_t i) { return p[i]; }

template <typename T>
__global__ void mhc_post_kernel(const T *__restrict__ X, const float *__restrict__ out,
                                const float *__restrict__ post, const float *__restrict__ comb, int n, int D, int C,
                                uint16_t *__restrict__ Xo)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C * D) return;
    int c = i / D, d = i % D;
    float xs[MHC_MAX_N];
    for (int j = 0; j < n; j++) xs[j] = mhc_ld<T>(X, ((size_t)c * n + j) * D + d);
    float o = out[i];
    const float *cb = comb + (size_t)c * n * n;
    for (int k = 0; k < n; k++) {
        float a = 0.0f;
        for (int j = 0; j < n; j++) a += cb[j * n + k] * xs[j];
        Xo[((size_t)c * n + k) * D + d] = dsv4_f32_to_bf16_bits(post[c * n + k] * o + a);
    }
}

/* Calls of >= DSV4_MHC_TILED_MIN_TOKENS tokens (D % 8 == 0, X, out and X_out 16-aligned): 8 consecutive d per thread,
 * 16-byte loads and stores (the kernel above moves 2 bytes per access: 1.3 of the 4.2 TB/s copy rate at 8K tokens,
 * session 23). The same expressions per element in the same order as mhc_post_kernel<uint16_t>: the same bits. */
__global__ void __launch_bounds__(256) mhc_post_vec_kernel(const uint16_t *__restrict__ X,
                                                           const float *__restrict__ out,
                                                           const float *__restrict__ post,
                                                           const float *__restrict__ comb, int n, int D, int C,
                                                           uint16_t *__restrict__ Xo)
{
    const int D8 = D / 8, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C * D8) return;
    const int c = i / D8, d0 = (i % D8) * 8;
    float xs[MHC_MAX_N][8], o[8];
#pragma unroll
    for (int j = 0; j < MHC_MAX_N; j++) {
        if (j >= n) break;
        const uint4 w = __ldcs(reinterpret_cast<const uint4 *>(X + ((size_t)c * n + j) * D + d0));
        const float4 lo = mhc_bf16x4(w.x, w.y), hi = mhc_bf16x4(w.z, w.w);
        xs[j][0] = lo.x, xs[j][1] = lo.y, xs[j][2] = lo.z, xs[j][3] = lo.w;
        xs[j][4] = hi.x, xs[j][5] = hi.y, xs[j][6] = hi.z, xs[j][7] = hi.w;
    }
    const float4 o0 = __ldcs(reinterpret_cast<const float4 *>(out + (size_t)c * D + d0)),
                 o1 = __ldcs(reinterpret_cast<const float4 *>(out + (size_t)c * D + d0 + 4));
    o[0] = o0.x, o[1] = o0.y, o[2] = o0.z, o[3] = o0.w, o[4] = o1.x, o[5] = o1.y, o[6] = o1.z, o[7] = o1.w;
    const float *cb = comb + (size_t)c * n * n;
#pragma unroll
    for (int k = 0; k < MHC_MAX_N; k++) {
        if (k >= n) break;
        const float pk = post[c * n + k];
        uint32_t h[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float a = 0.0f;
#pragma unroll
            for (int j = 0; j < MHC_MAX_N; j++)
                if (j < n) a += cb[j * n + k] * xs[j][e];
            h[e] = dsv4_f32_to_bf16_bits(pk * o[e] + a);
        }
        __stcs(reinterpret_cast<uint4 *>(Xo + ((size_t)c * n + k) * D + d0),
               make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16));
    }
}

/* ------------------------------------------------------------------------------------------- host */
static int mhc_n_mix(const dsv4_mhc_pre_params *p) { return p->head ? p->n_streams : (2 + p->n_streams) * p->n_streams; }

size_t dsv4_opt_mhc_pre_workspace_bytes(const dsv4_mhc_pre_params *p)
{
    const int n_mix = mhc_n_mix(p);
    const size_t nD = (size_t)p->n_streams * p->dim;
    if (p->kernel == DSV4_MHC_KERNEL_ROUNDTRIP) return ((size_t)p->n_tok * (n_mix + 1) * sizeof(float) + 15) & ~(size_t)15;
    return ((size_t)p->n_tok * dsv4_ceil_div((int64_t)nD, MHC_CHUNK) * (n_mix + 1) * sizeof(float) + 15) & ~(size_t)15;
}

/* Tokens per partial block: enough blocks to fill the GPU at small C, fn loaded once per 4 tokens at large C. */
static int mhc_tokens_per_block(int C) { return C >= 32 ? 4 : C >= 8 ? 2 : 1; }

template <int NMIX> static void mhc_launch_partial(int n_chunks, const dsv4_mhc_pre_params *p, int nD, float *part)
{
    const int C = p->n_tok, tok = mhc_tokens_per_block(C);
    if (C >= DSV4_MHC_TILED_MIN_TOKENS && p->partial == DSV4_MHC_PARTIAL_TILED) {
        const int vec = nD % 8 == 0 && ((uintptr_t)p->X & 15) == 0 && ((uintptr_t)p->fn & 15) == 0;
        const dim3 g(n_chunks, dsv4_ceil_div(C, MHC_TILE_TOK));
        mhc_partial_tiled_kernel<NMIX><<<g, MHC_THREADS, 0, p->stream>>>(p->X, p->fn, nD, C, vec, part);
        return;
    }
    const dim3 g(n_chunks, dsv4_ceil_div(C, tok));
    if (tok == 4) mhc_partial_kernel<NMIX, 4><<<g, MHC_THREADS, 0, p->stream>>>(p->X, p->fn, nD, C, part);
    else if (tok == 2) mhc_partial_kernel<NMIX, 2><<<g, MHC_THREADS, 0, p->stream>>>(p->X, p->fn, nD, C, part);
    else mhc_partial_kernel<NMIX, 1><<<g, MHC_THREADS, 0, p->stream>>>(p->X, p->fn, nD, C, part);
}

int dsv4_opt_mhc_pre(const dsv4_mhc_pre_params *p)
{
    DSV4_CHECK(p != NULL, "mhc_pre: params is NULL");
    DSV4_CHECK(p->n_tok >= 1 && p->dim >= 1, "mhc_pre: n_tok %d, dim %d", p->n_tok, p->dim);
    if (p->n_streams < 1 || p->n_streams > MHC_MAX_N)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "mhc_pre: hc_mult %d unsupported (1..%d)", p->n_streams, MHC_MAX_N);
    DSV4_CHECK(p->X && p->fn && p->base && p->scale && p->pre && p->x, "mhc_pre: X, fn, base, scale, pre, x are NULL");
    DSV4_CHECK(p->head || (p->post && p->comb && p->sinkhorn_iters >= 1), "mhc_pre: post/comb NULL or iters < 1");
    DSV4_CHECK(!p->norm_w || p->xn, "mhc_pre: norm_w given without xn");
    DSV4_CHECK((unsigned)p->partial < 2, "mhc_pre: partial %d is neither tiled (0) nor rows (1)", (int)p->partial);
    DSV4_CHECK(p->workspace && p->workspace_bytes >= dsv4_opt_mhc_pre_workspace_bytes(p),
               "mhc_pre: workspace of %zu B needed, got %zu B", dsv4_opt_mhc_pre_workspace_bytes(p), p->workspace_bytes);
    const int n = p->n_streams, D = p->dim, nD = n * D, C = p->n_tok, n_mix = mhc_n_mix(p);
    float *part = (float *)p->workspace;
    if (p->kernel == DSV4_MHC_KERNEL_CASTFREE) {
        const int n_chunks = dsv4_ceil_div(nD, MHC_CHUNK);
        switch (n_mix) {
        case 1: mhc_launch_partial<1>(n_chunks, p, nD, part); break;
        case 2: mhc_launch_partial<2>(n_chunks, p, nD, part); break;
        case 3: mhc_launch_partial<3>(n_chunks, p, nD, part); break;
        case 4: mhc_launch_partial<4>(n_chunks, p, nD, part); break;
        case 8: mhc_launch_partial<8>(n_chunks, p, nD, part); break;
        case 15: mhc_launch_partial<15>(n_chunks, p, nD, part); break;
        case 24: mhc_launch_partial<24>(n_chunks, p, nD, part); break;
        default: return dsv4_error(DSV4_ERR_UNSUPPORTED, "mhc_pre: n_mix %d", n_mix);
        }
        DSV4_LAUNCH_CHECK("mhc_partial_kernel");
        const int part_floats = n_chunks * (n_mix + 1), staged = part_floats <= MHC_STAGE_FLOATS;
        mhc_finish_kernel<<<C, MHC_THREADS, staged ? part_floats * sizeof(float) : 0, p->stream>>>(
            *p, n_mix, n_chunks, part, NULL, staged);
        DSV4_LAUNCH_CHECK("mhc_finish_kernel");
        return 0;
    }
    DSV4_CHECK(p->X_f32 && p->cublas, "mhc_pre roundtrip: X_f32 and cublas must be set");
    const size_t total = (size_t)C * nD;
    mhc_cast_kernel<<<dsv4_ceil_div((int64_t)total, 256), 256, 0, p->stream>>>(p->X, p->X_f32, total);
    DSV4_LAUNCH_CHECK("mhc_cast_kernel");
    float *mix = part + C; /* part[0..C) sums of squares, then [C, n_mix] projections */
    const float one = 1.0f, zero = 0.0f;
    /* set only when the handle is elsewhere: cublasSetStream also drops the workspace the caller gave it */
    cudaStream_t handle_stream = NULL;
    if (cublasGetStream(p->cublas, &handle_stream) != CUBLAS_STATUS_SUCCESS ||
        (handle_stream != p->stream && cublasSetStream(p->cublas, p->stream) != CUBLAS_STATUS_SUCCESS))
        return dsv4_error(DSV4_ERR_CUDA, "mhc_pre: cublasGetStream/cublasSetStream failed");
    cublasStatus_t st = cublasSgemm(p->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_mix, C, nD, &one, p->fn, nD, p->X_f32, nD,
                                    &zero, mix, n_mix);
    if (st != CUBLAS_STATUS_SUCCESS) return dsv4_error(DSV4_ERR_CUDA, "mhc_pre: cublasSgemm failed (%d)", (int)st);
    mhc_sumsq_kernel<<<C, MHC_THREADS, 0, p->stream>>>(p->X_f32, nD, part);
    DSV4_LAUNCH_CHECK("mhc_sumsq_kernel");
    mhc_finish_kernel<<<C, MHC_THREADS, 0, p->stream>>>(*p, n_mix, 0, part, mix, 0);
    DSV4_LAUNCH_CHECK("mhc_finish_kernel");
    mhc_collapse_kernel<<<dsv4_ceil_div((int64_t)C * D, 256), 256, 0, p->stream>>>(p->X_f32, p->pre, n, D, C, p->x);
    DSV4_LAUNCH_CHECK("mhc_collapse_kernel");
    if (p->norm_w) {
        mhc_norm_kernel<<<C, MHC_THREADS, 0, p->stream>>>(p->x, p->norm_w, D, p->norm_eps, p->xn);
        DSV4_LAUNCH_CHECK("mhc_norm_kernel");
    }
    return 0;
}

int dsv4_opt_mhc_post(const dsv4_mhc_post_params *p)
{
    DSV4_CHECK(p != NULL, "mhc_post: params is NULL");
    DSV4_CHECK(p->n_tok >= 1 && p->dim >= 1, "mhc_post: n_tok %d, dim %d", p->n_tok, p->dim);
    if (p->n_streams < 1 || p->n_streams > MHC_MAX_N)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "mhc_post: hc_mult %d unsupported (1..%d)", p->n_streams, MHC_MAX_N);
    DSV4_CHECK(p->out && p->post && p->comb && p->X_out, "mhc_post: out, post, comb, X_out are NULL");
    const int total = p->n_tok * p->dim, nb = dsv4_ceil_div(total, 256);
    if (p->kernel == DSV4_MHC_KERNEL_ROUNDTRIP) {
        DSV4_CHECK(p->X_f32, "mhc_post roundtrip: X_f32 is NULL");
        mhc_post_kernel<float><<<nb, 256, 0, p->stream>>>(p->X_f32, p->out, p->post, p->comb, p->n_streams, p->dim,
                                                          p->n_tok, p->X_out);
    } else {
        DSV4_CHECK(p->X && (const void *)p->X != (const void *)p->X_out, "mhc_post: X NULL or aliasing X_out");
        const int vec = p->n_tok >= DSV4_MHC_TILED_MIN_TOKENS && p->dim % 8 == 0 &&
                        (((uintptr_t)p->X | (uintptr_t)p->out | (uintptr_t)p->X_out) & 15) == 0;
        if (vec) {
            mhc_post_vec_kernel<<<dsv4_ceil_div(total / 8, 256), 256, 0, p->stream>>>(
                p->X, p->out, p->post, p->comb, p->n_streams, p->dim, p->n_tok, p->X_out);
            DSV4_LAUNCH_CHECK("mhc_post_vec_kernel");
            return 0;
        }
        mhc_post_kernel<uint16_t><<<nb, 256, 0, p->stream>>>(p->X, p->out, p->post, p->comb, p->n_streams, p->dim,
                                                             p->n_tok, p->X_out);
    }
    DSV4_LAUNCH_CHECK("mhc_post_kernel");
    return 0;
}
