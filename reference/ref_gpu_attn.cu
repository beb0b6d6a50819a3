/* ref_gpu_attn.cu - the GPU fp32 reference's attention side (model-spec §6-§9): the compressor state machine
 * and entry finalisation, the lightning indexer's scores and top-k selection, and the sink attention of every
 * query over its gathered key list with the inverse RoPE of the output.
 *
 * Quiet traps:
 * - Compressor: every channel's state evolves on its own (its kv/score columns, CSA: columns c and d_c + c),
 *   so one thread per channel runs the CPU state machine token after token; a window closes AT the token p with
 *   (p+1) mod r == 0, and CSA then moves the current rows (both halves) to the previous rows.
 * - Entries are RMSNorm'd and rope'd at position r·w, the first source position of their window.
 * - Selection: the rank of entry w is #{v: key_v > key_w} + #{v < w: key_v == key_w}, i.e. the CPU's stable
 *   descending order (equal scores lower index first); invisible entries and NaN rank as −∞, and a pick of an
 *   invisible entry is −1.
 * - Attention: K = V (rope'd channels included); the sink only enlarges the denominator (summed in double like
 *   the CPU); the output's rope channels are de-rotated at the query position.
 * - The bf16 emulation's attention (bf16p, a kernel of its own so the plain one stays as it was) is
 *   dsv4_ref_sink_attention_bf16p: the row max over the scores WITHOUT the sink, p = bf16(e^{s - max}) both in P·V
 *   and in the denominator (summed in fp32 in ascending j, one thread, the CPU's order), the sink added there in fp32
 *   against max(row max, sink).
 */
#include <math.h>

#include "ref_gpu.cuh"

#define FMUL(a, b) __fmul_rn((a), (b))
#define FADD(a, b) __fadd_rn((a), (b))

/* ------------------------------------------------------------------------------------- compressors */
__global__ static void fill_kernel(float *p, size_t n, float v)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

extern "C" int dsv4_ref_gpu_compressor_init(dsv4_ref_gpu_compressor *c, int ratio, int d_c, int overlap, float *mem)
{
    c->ratio = ratio;
    c->d_c = d_c;
    c->overlap = overlap;
    c->width = (overlap ? 2 : 1) * d_c;
    c->rows = (overlap ? 2 : 1) * ratio;
    size_t n = (size_t)c->rows * c->width;
    c->kv = mem;
    c->score = mem + n;
    DSV4_REF_CUDA_CHECK(cudaMemset(c->kv, 0, n * sizeof(float)));
    fill_kernel<<<(unsigned)((n + 255) / 256), 256>>>(c->score, n, -INFINITY);
    DSV4_REF_LAUNCH_CHECK("fill");
    return 0;
}

__global__ static void compressor_run_kernel(float *kv, float *score, const float *kvp, const float *gp,
                                             const float *ape, int64_t p0, int S, int r, int dc, int overlap,
                                             float *pool)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= dc) return;
    int W = overlap ? 2 * dc : dc, ncol = overlap ? 2 : 1, n_slots = overlap ? 2 * r : r;
    for (int s = 0; s < S; s++) {
        int64_t p = p0 + s;
        int slot = (int)(p % r);
        int row = overlap ? r + slot : slot;
        for (int h = 0; h < ncol; h++) {
            int col = ch + h * dc;
            kv[(size_t)row * W + col] = kvp[(size_t)s * W + col];
            score[(size_t)row * W + col] = FADD(gp[(size_t)s * W + col], ape[(size_t)slot * W + col]);
        }
        if ((p + 1) % r != 0) continue;
        /* slot i < r reads channel ch of row i (the a-half when overlapping), slot i >= r the b-half */
        float mx = -INFINITY;
        for (int i = 0; i < n_slots; i++) {
            int col = (overlap && i >= r) ? dc + ch : ch;
            float g = score[(size_t)i * W + col];
            if (g > mx) mx = g;
        }
        float sum = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            int col = (overlap && i >= r) ? dc + ch : ch;
            sum = FADD(sum, expf(score[(size_t)i * W + col] - mx));
        }
        float acc = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            int col = (overlap && i >= r) ? dc + ch : ch;
            float wgt = expf(score[(size_t)i * W + col] - mx) / sum;
            acc = FADD(acc, FMUL(kv[(size_t)i * W + col], wgt));
        }
        pool[(size_t)(p / r) * dc + ch] = acc;
        if (overlap)
            for (int i = 0; i < r; i++)
                for (int h = 0; h < ncol; h++) {
                    int col = ch + h * dc;
                    kv[(size_t)i * W + col] = kv[(size_t)(r + i) * W + col];
                    score[(size_t)i * W + col] = score[(size_t)(r + i) * W + col];
                }
    }
}

extern "C" int dsv4_ref_gpu_compressor_run(dsv4_ref_gpu_compressor *c, const float *kvp, const float *gp,
                                           const float *ape, int64_t p0, int S, float *pool)
{
    if (S <= 0) return 0;
    compressor_run_kernel<<<(unsigned)((c->d_c + 127) / 128), 128>>>(c->kv, c->score, kvp, gp, ape, p0, S, c->ratio,
                                                                     c->d_c, c->overlap, pool);
    DSV4_REF_LAUNCH_CHECK("compressor_run");
    return 0;
}

__device__ static double block_sum_attn(double v, double *part)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < nw; i++) t += part[i];
    return t;
}

__global__ static void compressor_finish_kernel(float *pool, int w0, int d_c, const float *norm_w, float eps,
                                                const float *inv_freq, int n_pairs, int ratio)
{
    __shared__ double part[32];
    int w = w0 + blockIdx.x;
    float *e = pool + (size_t)w * d_c;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d_c; i += blockDim.x) ss += (double)e[i] * (double)e[i];
    ss = block_sum_attn(ss, part);
    float r = 1.0f / sqrtf((float)(ss / d_c) + eps);
    for (int i = threadIdx.x; i < d_c; i += blockDim.x) e[i] = FMUL(norm_w[i], FMUL(e[i], r));
    __syncthreads();
    float pos = (float)((int64_t)ratio * w);
    float *rr = e + d_c - 2 * n_pairs;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        float a = FMUL(inv_freq[i], pos);
        float c = (float)cos((double)a), s = (float)sin((double)a);
        float x0 = rr[2 * i], x1 = rr[2 * i + 1];
        rr[2 * i] = FADD(FMUL(x0, c), FMUL(-x1, s));
        rr[2 * i + 1] = FADD(FMUL(x1, c), FMUL(x0, s));
    }
}

extern "C" int dsv4_ref_gpu_compressor_finish(float *pool, int w0, int n, int d_c, const float *norm_w, float eps,
                                              const float *inv_freq, int n_pairs, int ratio)
{
    if (n <= 0) return 0;
    compressor_finish_kernel<<<n, 128>>>(pool, w0, d_c, norm_w, eps, inv_freq, n_pairs, ratio);
    DSV4_REF_LAUNCH_CHECK("compressor_finish");
    return 0;
}

/* ----------------------------------------------------------------------------------------- indexer */
/* One warp per (query s, entry w): lanes split the d_I channels of each head's dot product. */
__global__ static void index_scores_kernel(float *score, const float *qI, const float *keys, const float *wraw,
                                           int n_pool, int H_I, int d_I)
{
    int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int s = blockIdx.y;
    if (w >= n_pool) return;
    float s_scale = 1.0f / sqrtf((float)d_I), w_scale = 1.0f / sqrtf((float)H_I);
    const float *k = keys + (size_t)w * d_I;
    float acc = 0.0f;
    for (int h = 0; h < H_I; h++) {
        const float *q = qI + ((size_t)s * H_I + h) * d_I;
        float part = 0.0f;
        for (int c = lane; c < d_I; c += 32) part += q[c] * k[c];
        for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
        float v = part > 0.0f ? part : 0.0f;
        float wh = FMUL(wraw[(size_t)s * H_I + h], w_scale);
        acc = FADD(acc, FMUL(FMUL(v, s_scale), wh));
    }
    if (lane == 0) score[(size_t)s * n_pool + w] = acc;
}

extern "C" int dsv4_ref_gpu_index_scores(float *score, const float *qI, const float *keys, const float *wraw, int S,
                                         int n_pool, int H_I, int d_I)
{
    if (S <= 0 || n_pool <= 0) return 0;
    dim3 grid((unsigned)((n_pool + 7) / 8), (unsigned)S);
    index_scores_kernel<<<grid, 256>>>(score, qI, keys, wraw, n_pool, H_I, d_I);
    DSV4_REF_LAUNCH_CHECK("index_scores");
    return 0;
}

__device__ static float select_key(const float *sc, int w, int n_vis)
{
    float v = sc[w];
    return (w >= n_vis || v != v) ? -INFINITY : v;
}

__global__ static void index_select_kernel(int32_t *idx, int stride, const float *score, int n_pool, int64_t p0,
                                           int ratio, int k)
{
    int s = blockIdx.x;
    const float *sc = score + (size_t)s * n_pool;
    int n_vis = (int)((p0 + s + 1) / ratio);
    for (int w = threadIdx.x; w < n_pool; w += blockDim.x) {
        float kw = select_key(sc, w, n_vis);
        int rank = 0;
        for (int v = 0; v < n_pool && rank < k; v++) {
            float kv = select_key(sc, v, n_vis);
            rank += (kv > kw) || (kv == kw && v < w);
        }
        if (rank < k) idx[(size_t)s * stride + rank] = w < n_vis ? w : -1;
    }
}

extern "C" int dsv4_ref_gpu_index_select(int32_t *idx, int stride, const float *score, int S, int n_pool, int64_t p0,
                                         int ratio, int k)
{
    if (S <= 0 || k <= 0) return 0;
    index_select_kernel<<<S, 256>>>(idx, stride, score, n_pool, p0, ratio, k);
    DSV4_REF_LAUNCH_CHECK("index_select");
    return 0;
}

/* ------------------------------------------------------------------------------------ sink attention */
enum { ATTN_THREADS = 128 };

/* Key row j of the query at p (window rows first, then the compressed entries). */
__device__ static const float *attn_row(const dsv4_ref_gpu_attn_params &P, int s, int64_t lo, int nwin,
                                        const int *cid, int j)
{
    if (j < nwin) {
        int64_t t = lo + j;
        return t >= P.p0 ? P.kv + (size_t)(t - P.p0) * P.d : P.ring + (size_t)(t % P.window) * P.d;
    }
    int e = P.topk ? cid[j - nwin] : j - nwin;
    return P.pool + (size_t)e * P.d;
}

__global__ static void sink_attention_kernel(const dsv4_ref_gpu_attn_params P)
{
    extern __shared__ float smem[];
    float *qs = smem;                 /* [d] */
    float *ov = qs + P.d;             /* [d] */
    float *sc = ov + P.d;             /* [m_max] */
    int *cid = (int *)(sc + P.m_max); /* [topk_stride] compacted picks */
    __shared__ double part[32];
    __shared__ float fpart[32];
    __shared__ int n_cmp;
    int s = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int nw = blockDim.x >> 5, d = P.d;
    int64_t p = P.p0 + s;
    int64_t lo = p - P.window + 1 > 0 ? p - P.window + 1 : 0;
    int nwin = (int)(p - lo + 1);
    const float *q = P.q + ((size_t)s * P.H + h) * d;
    for (int c = tid; c < d; c += blockDim.x) qs[c] = q[c];
    if (tid == 0) {
        int n = 0;
        if (P.pool && P.topk) {
            const int32_t *t = P.topk + (size_t)s * P.topk_stride;
            for (int i = 0; i < P.n_topk; i++)
                if (t[i] >= 0) cid[n++] = t[i];
        } else if (P.pool) {
            n = (int)((p + 1) / P.ratio);
        }
        n_cmp = n;
    }
    __syncthreads();
    int m = nwin + n_cmp;
    float scale = 1.0f / sqrtf((float)d);
    for (int j = warp; j < m; j += nw) {
        const float *row = attn_row(P, s, lo, nwin, cid, j);
        float part_dot = 0.0f;
        for (int c = lane; c < d; c += 32) part_dot += qs[c] * row[c];
        for (int off = 16; off > 0; off >>= 1) part_dot += __shfl_xor_sync(0xffffffffu, part_dot, off);
        if (lane == 0) sc[j] = FMUL(part_dot, scale);
    }
    __syncthreads();
    /* sink softmax: max over the scores and the sink, sum in double starting from the sink's term */
    float sink = P.sinks[h];
    float mx = sink;
    for (int j = tid; j < m; j += blockDim.x)
        if (sc[j] > mx) mx = sc[j];
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (lane == 0) fpart[warp] = mx;
    __syncthreads();
    mx = fpart[0];
    for (int i = 1; i < nw; i++) mx = fmaxf(mx, fpart[i]);
    double sum = 0.0;
    for (int j = tid; j < m; j += blockDim.x) {
        float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = block_sum_attn(sum, part) + exp((double)(sink - mx));
    float inv = (float)(1.0 / sum);
    for (int j = tid; j < m; j += blockDim.x) sc[j] = FMUL(sc[j], inv);
    __syncthreads();
    for (int c = tid; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < m; j++) acc += sc[j] * attn_row(P, s, lo, nwin, cid, j)[c];
        ov[c] = acc;
    }
    __syncthreads();
    float *o = P.o + ((size_t)s * P.H + h) * d;
    int r0 = d - 2 * P.n_pairs;
    for (int c = tid; c < r0; c += blockDim.x) o[c] = ov[c];
    for (int i = tid; i < P.n_pairs; i += blockDim.x) {
        float cs = P.cos_t[(size_t)s * P.n_pairs + i], sn = -P.sin_t[(size_t)s * P.n_pairs + i];
        float x0 = ov[r0 + 2 * i], x1 = ov[r0 + 2 * i + 1];
        o[r0 + 2 * i] = FADD(FMUL(x0, cs), FMUL(-x1, sn));
        o[r0 + 2 * i + 1] = FADD(FMUL(x1, cs), FMUL(x0, sn));
    }
}

/* The same keys and output as sink_attention_kernel, with the bf16 emulation's P (the header's last trap). */
__global__ static void sink_attention_bf16p_kernel(const dsv4_ref_gpu_attn_params P)
{
    extern __shared__ float smem[];
    float *qs = smem;                 /* [d] */
    float *ov = qs + P.d;             /* [d] */
    float *sc = ov + P.d;             /* [m_max] */
    int *cid = (int *)(sc + P.m_max); /* [topk_stride] compacted picks */
    __shared__ float fpart[32];
    __shared__ float fct;
    __shared__ int n_cmp;
    int s = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int nw = blockDim.x >> 5, d = P.d;
    int64_t p = P.p0 + s;
    int64_t lo = p - P.window + 1 > 0 ? p - P.window + 1 : 0;
    int nwin = (int)(p - lo + 1);
    const float *q = P.q + ((size_t)s * P.H + h) * d;
    for (int c = tid; c < d; c += blockDim.x) qs[c] = q[c];
    if (tid == 0) {
        int n = 0;
        if (P.pool && P.topk) {
            const int32_t *t = P.topk + (size_t)s * P.topk_stride;
            for (int i = 0; i < P.n_topk; i++)
                if (t[i] >= 0) cid[n++] = t[i];
        } else if (P.pool) {
            n = (int)((p + 1) / P.ratio);
        }
        n_cmp = n;
    }
    __syncthreads();
    int m = nwin + n_cmp;
    float scale = 1.0f / sqrtf((float)d);
    for (int j = warp; j < m; j += nw) {
        const float *row = attn_row(P, s, lo, nwin, cid, j);
        float part_dot = 0.0f;
        for (int c = lane; c < d; c += 32) part_dot += qs[c] * row[c];
        for (int off = 16; off > 0; off >>= 1) part_dot += __shfl_xor_sync(0xffffffffu, part_dot, off);
        if (lane == 0) sc[j] = FMUL(part_dot, scale);
    }
    __syncthreads();
    /* the row max over the scores only (m >= 1: the window holds the query's own position) */
    float mx = -INFINITY;
    for (int j = tid; j < m; j += blockDim.x)
        if (sc[j] > mx) mx = sc[j];
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (lane == 0) fpart[warp] = mx;
    __syncthreads();
    mx = fpart[0];
    for (int i = 1; i < nw; i++) mx = fmaxf(mx, fpart[i]);
    for (int j = tid; j < m; j += blockDim.x) sc[j] = dsv4_ref_gpu_bf16_round(expf(sc[j] - mx));
    __syncthreads();
    if (tid == 0) { /* the denominator: the rounded p in the CPU's order, then the sink in fp32 */
        float l = 0.0f;
        for (int j = 0; j < m; j++) l = FADD(l, sc[j]);
        float sink = P.sinks[h], M = mx > sink ? mx : sink, wm = expf(mx - M);
        fct = wm / FADD(FMUL(l, wm), expf(sink - M));
    }
    __syncthreads();
    for (int c = tid; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < m; j++) acc = FADD(acc, FMUL(sc[j], attn_row(P, s, lo, nwin, cid, j)[c]));
        ov[c] = FMUL(acc, fct);
    }
    __syncthreads();
    float *o = P.o + ((size_t)s * P.H + h) * d;
    int r0 = d - 2 * P.n_pairs;
    for (int c = tid; c < r0; c += blockDim.x) o[c] = ov[c];
    for (int i = tid; i < P.n_pairs; i += blockDim.x) {
        float cs = P.cos_t[(size_t)s * P.n_pairs + i], sn = -P.sin_t[(size_t)s * P.n_pairs + i];
        float x0 = ov[r0 + 2 * i], x1 = ov[r0 + 2 * i + 1];
        o[r0 + 2 * i] = FADD(FMUL(x0, cs), FMUL(-x1, sn));
        o[r0 + 2 * i + 1] = FADD(FMUL(x1, cs), FMUL(x0, sn));
    }
}

static size_t attn_smem_bytes(int m_max, int d, int topk_stride)
{
    return (size_t)(2 * d + m_max) * sizeof(float) + (size_t)(topk_stride > 0 ? topk_stride : 1) * sizeof(int);
}

extern "C" int dsv4_ref_gpu_attention_prepare(int m_max, int d, int topk_stride)
{
    size_t bytes = attn_smem_bytes(m_max, d, topk_stride);
    int dev = 0, optin = 0;
    DSV4_REF_CUDA_CHECK(cudaGetDevice(&dev));
    DSV4_REF_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes > (size_t)optin)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "ref-gpu: attention over %d keys of %d channels needs %zu bytes of "
                          "shared memory, the device allows %d", m_max, d, bytes, optin);
    DSV4_REF_CUDA_CHECK(cudaFuncSetAttribute(sink_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)bytes));
    DSV4_REF_CUDA_CHECK(cudaFuncSetAttribute(sink_attention_bf16p_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return 0;
}

extern "C" int dsv4_ref_gpu_attention(const dsv4_ref_gpu_attn_params *p)
{
    if (p->S <= 0) return 0;
    if (p->d % 2 || 2 * p->n_pairs > p->d)
        return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: attention with d %d and %d rope pairs", p->d, p->n_pairs);
    dim3 grid((unsigned)p->S, (unsigned)p->H);
    size_t smem = attn_smem_bytes(p->m_max, p->d, p->topk_stride);
    if (p->bf16p) sink_attention_bf16p_kernel<<<grid, ATTN_THREADS, smem>>>(*p);
    else sink_attention_kernel<<<grid, ATTN_THREADS, smem>>>(*p);
    DSV4_REF_LAUNCH_CHECK("sink_attention");
    return 0;
}
