/* ref_gpu_ops.cu - the GPU fp32 reference's primitives (model-spec §3, §5, §10): cuBLAS SGEMM linears and the
 * grouped output projection, RMSNorm, RoPE tables and rotation, mHC coefficients (Sinkhorn), collapse and post,
 * hc_head weights, embedding, clamped SwiGLU, the router, and the row gathers of the MoE. Plain fp32 kernels, one
 * thread per output element or one block per row; readable, not fast.
 *
 * Quiet traps (the CPU ops' traps, kept here):
 * - Products and sums the CPU rounds separately are rounded separately here (__fmul_rn/__fadd_rn), so that
 *   the compiler's FMA contraction cannot make the two references differ in the elementwise ops.
 * - RMSNorm accumulates the mean square in double, then forms 1/sqrtf(var + eps) in float, like the CPU.
 * - RoPE angles: inv_freq·(float)pos rounded in fp32 first, then cos/sin in double rounded to float.
 * - Sinkhorn: one row softmax + eps, one column step, then (iters−1) × (row, column): it ends on a column step.
 * - comb[j][k] is FROM stream j TO stream k: Xo[k] = post[k]·out + Σ_j comb[j][k]·X[j].
 * - Router: the bias selects only; ties on s + bias keep the lower expert first (the CPU's top-k order). A followed
 *   row re-weighted (route_reweight) uses the same formula and order for the ids it holds after the merge.
 */
#include <math.h>

#include "ref_gpu.cuh"

#define FMUL(a, b) __fmul_rn((a), (b))
#define FADD(a, b) __fadd_rn((a), (b))

extern "C" int dsv4_ref_gpu_cuda_fail(cudaError_t e, const char *call, const char *file, int line)
{
    return dsv4_error(DSV4_ERR_CUDA, "ref-gpu: %s failed at %s:%d: %s", call, file, line, cudaGetErrorString(e));
}

extern "C" int dsv4_ref_gpu_cublas_fail(cublasStatus_t s, const char *call, const char *file, int line)
{
    return dsv4_error(DSV4_ERR_CUDA, "ref-gpu: %s failed at %s:%d: cuBLAS status %d", call, file, line, (int)s);
}

extern "C" int dsv4_ref_gpu_blas_init(cublasHandle_t *h)
{
    DSV4_REF_CUBLAS_CHECK(cublasCreate(h));
    /* DEFAULT keeps at least fp32 mantissa bits (TF32 needs CUBLAS_TF32_TENSOR_OP_MATH): fp32-accurate. */
    DSV4_REF_CUBLAS_CHECK(cublasSetMathMode(*h, CUBLAS_DEFAULT_MATH));
    return 0;
}

static unsigned blocks_for(size_t n, unsigned threads) { return (unsigned)((n + threads - 1) / threads); }

/* ------------------------------------------------------------------------------------------ linears */
extern "C" int dsv4_ref_gpu_linear(cublasHandle_t h, float *y, const float *x, const float *w, int S, int n_in,
                                   int n_out)
{
    /* Row-major y = x·wᵀ is column-major yᵀ [n_out, S] = wᵀ(col-major w is [n_in, n_out])ᵀ · xᵀ. */
    const float one = 1.0f, zero = 0.0f;
    DSV4_REF_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, S, n_in, &one, w, n_in, x, n_in, &zero,
                                      y, n_out));
    return 0;
}

extern "C" int dsv4_ref_gpu_grouped_out(cublasHandle_t h, float *out, float *z, const float *o, const float *wo_a,
                                        const float *wo_b, int S, int gin, int G, int o_r, int D)
{
    const float one = 1.0f, zero = 0.0f;
    /* group g: z[:, g·o_r ..] (ld G·o_r) = o[:, g·gin ..] (ld G·gin) · W_oa[g]ᵀ (W_oa[g] = rows g·o_r of wo_a) */
    DSV4_REF_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, o_r, S, gin, &one, wo_a, gin,
                                                    (long long)o_r * gin, o, G * gin, gin, &zero, z, G * o_r, o_r,
                                                    G));
    return dsv4_ref_gpu_linear(h, out, z, wo_b, S, G * o_r, D);
}

/* ------------------------------------------------------------------------------------------ RMSNorm */
/* Sum of a double over the block (blockDim a multiple of 32, <= 1024); every thread gets the total. */
__device__ static double block_sum_d(double v)
{
    __shared__ double part[32];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0) part[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < nw; i++) t += part[i];
    return t;
}

__global__ static void rmsnorm_kernel(float *y, const float *x, const float *w, int n, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_d(ss);
    float var = (float)(ss / n);
    float r = 1.0f / sqrtf(var + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = FMUL(xr[i], r);
        yr[i] = w ? FMUL(w[i], v) : v;
    }
}

extern "C" int dsv4_ref_gpu_rmsnorm(float *y, const float *x, const float *w, int rows, int n, float eps)
{
    if (rows <= 0) return 0;
    rmsnorm_kernel<<<rows, 256>>>(y, x, w, n, eps);
    DSV4_REF_LAUNCH_CHECK("rmsnorm");
    return 0;
}

/* --------------------------------------------------------------------------------------------- RoPE */
__device__ static void rope_cs(const float *inv_freq, int i, int64_t pos, float *c, float *s)
{
    float a = FMUL(inv_freq[i], (float)pos);
    *c = (float)cos((double)a);
    *s = (float)sin((double)a);
}

__global__ static void rope_table_kernel(float *cos_t, float *sin_t, const float *inv_freq, int n_pairs, int64_t p0,
                                         int S)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)S * n_pairs) return;
    int s = (int)(t / n_pairs), i = (int)(t % n_pairs);
    rope_cs(inv_freq, i, p0 + s, &cos_t[t], &sin_t[t]);
}

extern "C" int dsv4_ref_gpu_rope_table(float *cos_t, float *sin_t, const float *inv_freq, int n_pairs, int64_t p0,
                                       int S)
{
    size_t n = (size_t)S * n_pairs;
    if (n == 0) return 0;
    rope_table_kernel<<<blocks_for(n, 256), 256>>>(cos_t, sin_t, inv_freq, n_pairs, p0, S);
    DSV4_REF_LAUNCH_CHECK("rope_table");
    return 0;
}

__global__ static void rope_kernel(float *x, int S, int heads, int dim, int n_pairs, const float *cos_t,
                                   const float *sin_t, int inverse)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)S * heads * n_pairs) return;
    int i = (int)(t % n_pairs);
    size_t sh = t / n_pairs; /* s·heads + head */
    int s = (int)(sh / heads);
    float *r = x + sh * dim + dim - 2 * n_pairs;
    float c = cos_t[(size_t)s * n_pairs + i], sn = sin_t[(size_t)s * n_pairs + i];
    if (inverse) sn = -sn;
    float x0 = r[2 * i], x1 = r[2 * i + 1];
    r[2 * i] = FADD(FMUL(x0, c), FMUL(-x1, sn));
    r[2 * i + 1] = FADD(FMUL(x1, c), FMUL(x0, sn));
}

extern "C" int dsv4_ref_gpu_rope(float *x, int S, int heads, int dim, int n_pairs, const float *cos_t,
                                 const float *sin_t, int inverse)
{
    size_t n = (size_t)S * heads * n_pairs;
    if (n == 0) return 0;
    rope_kernel<<<blocks_for(n, 256), 256>>>(x, S, heads, dim, n_pairs, cos_t, sin_t, inverse);
    DSV4_REF_LAUNCH_CHECK("rope");
    return 0;
}

/* ---------------------------------------------------------------------------------------------- mHC */
__device__ static float sigmoid_f(float x) { return 1.0f / FADD(1.0f, expf(-x)); }

/* The CPU's dsv4_ref_hc_sinkhorn, step for step. */
__device__ static void sinkhorn(float *c, int n, int iters, float eps)
{
    for (int j = 0; j < n; j++) {
        float *row = c + j * n;
        float mx = row[0];
        for (int k = 1; k < n; k++)
            if (row[k] > mx) mx = row[k];
        float sum = 0.0f;
        for (int k = 0; k < n; k++) {
            row[k] = expf(row[k] - mx);
            sum = FADD(sum, row[k]);
        }
        for (int k = 0; k < n; k++) row[k] = FADD(row[k] / sum, eps);
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            for (int j = 0; j < n; j++) {
                float s = 0.0f;
                for (int k = 0; k < n; k++) s = FADD(s, c[j * n + k]);
                for (int k = 0; k < n; k++) c[j * n + k] /= FADD(s, eps);
            }
        }
        for (int k = 0; k < n; k++) {
            float s = 0.0f;
            for (int j = 0; j < n; j++) s = FADD(s, c[j * n + k]);
            for (int j = 0; j < n; j++) c[j * n + k] /= FADD(s, eps);
        }
    }
}

__global__ static void hc_coeff_kernel(const float *mix, const float *base, const float *scale, int S, int n,
                                       int iters, float hc_eps, float *pre, float *post, float *comb)
{
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= S) return;
    const float *m = mix + (size_t)s * (2 + n) * n;
    for (int j = 0; j < n; j++) {
        pre[(size_t)s * n + j] = FADD(sigmoid_f(FADD(FMUL(m[j], scale[0]), base[j])), hc_eps);
        post[(size_t)s * n + j] = FMUL(2.0f, sigmoid_f(FADD(FMUL(m[n + j], scale[1]), base[n + j])));
    }
    float c[16 * 16];
    for (int i = 0; i < n * n; i++) c[i] = FADD(FMUL(m[2 * n + i], scale[2]), base[2 * n + i]);
    sinkhorn(c, n, iters, hc_eps);
    for (int i = 0; i < n * n; i++) comb[(size_t)s * n * n + i] = c[i];
}

extern "C" int dsv4_ref_gpu_hc_coeff(const float *mix, const float *base, const float *scale, int S, int n,
                                     int iters, float hc_eps, float *pre, float *post, float *comb)
{
    if (n < 1 || n > 16) return dsv4_error(DSV4_ERR_UNSUPPORTED, "ref-gpu: hc_mult %d outside [1, 16]", n);
    hc_coeff_kernel<<<blocks_for((size_t)S, 64), 64>>>(mix, base, scale, S, n, iters, hc_eps, pre, post, comb);
    DSV4_REF_LAUNCH_CHECK("hc_coeff");
    return 0;
}

__global__ static void hc_collapse_kernel(float *x, const float *X, const float *pre, int S, int n, int D)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)S * D) return;
    size_t s = t / D, d = t % D;
    float acc = 0.0f;
    for (int j = 0; j < n; j++) acc = FADD(acc, FMUL(pre[s * n + j], X[(s * n + j) * D + d]));
    x[t] = acc;
}

extern "C" int dsv4_ref_gpu_hc_collapse(float *x, const float *X, const float *pre, int S, int n, int D)
{
    hc_collapse_kernel<<<blocks_for((size_t)S * D, 256), 256>>>(x, X, pre, S, n, D);
    DSV4_REF_LAUNCH_CHECK("hc_collapse");
    return 0;
}

__global__ static void hc_post_kernel(float *Xo, const float *X, const float *out, const float *post,
                                      const float *comb, int S, int n, int D)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)S * n * D) return;
    size_t d = t % D, sk = t / D, s = sk / n;
    int k = (int)(sk % n);
    const float *cb = comb + s * n * n;
    float acc = 0.0f;
    for (int j = 0; j < n; j++) acc = FADD(acc, FMUL(cb[j * n + k], X[(s * n + j) * D + d]));
    Xo[t] = FADD(FMUL(post[s * n + k], out[s * D + d]), acc);
}

extern "C" int dsv4_ref_gpu_hc_post(float *Xo, const float *X, const float *out, const float *post,
                                    const float *comb, int S, int n, int D)
{
    hc_post_kernel<<<blocks_for((size_t)S * n * D, 256), 256>>>(Xo, X, out, post, comb, S, n, D);
    DSV4_REF_LAUNCH_CHECK("hc_post");
    return 0;
}

__global__ static void hc_head_pre_kernel(const float *m, const float *base, const float *scale, int S, int n,
                                          float hc_eps, float *pre)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)S * n) return;
    int j = (int)(t % n);
    pre[t] = FADD(sigmoid_f(FADD(FMUL(m[t], scale[0]), base[j])), hc_eps);
}

extern "C" int dsv4_ref_gpu_hc_head_pre(const float *m, const float *base, const float *scale, int S, int n,
                                        float hc_eps, float *pre)
{
    hc_head_pre_kernel<<<blocks_for((size_t)S * n, 256), 256>>>(m, base, scale, S, n, hc_eps, pre);
    DSV4_REF_LAUNCH_CHECK("hc_head_pre");
    return 0;
}

__global__ static void embed_kernel(float *X, const float *embed, const int32_t *tokens, int S, int n, int D)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)S * n * D) return;
    size_t d = t % D, s = t / D / n;
    X[t] = embed[(size_t)tokens[s] * D + d];
}

extern "C" int dsv4_ref_gpu_embed(float *X, const float *embed, const int32_t *tokens, int S, int n, int D)
{
    embed_kernel<<<blocks_for((size_t)S * n * D, 256), 256>>>(X, embed, tokens, S, n, D);
    DSV4_REF_LAUNCH_CHECK("embed");
    return 0;
}

/* ---------------------------------------------------------------------------------------------- MoE */
__global__ static void swiglu_kernel(float *h, const float *g, const float *u, size_t n, float limit)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i] > limit ? limit : g[i];
    float ui = u[i] > limit ? limit : (u[i] < -limit ? -limit : u[i]);
    float silu = gi / FADD(1.0f, expf(-gi));
    h[i] = FMUL(silu, ui);
}

extern "C" int dsv4_ref_gpu_swiglu(float *h, const float *g, const float *u, size_t n, float limit)
{
    if (n == 0) return 0;
    swiglu_kernel<<<blocks_for(n, 256), 256>>>(h, g, u, n, limit);
    DSV4_REF_LAUNCH_CHECK("swiglu");
    return 0;
}

__device__ static float sqrtsoftplus(float z)
{
    float sp = z > 20.0f ? z : log1pf(expf(z));
    return sqrtf(sp);
}

/* NaN ranks last, below -inf (dsv4_ref_topk). */
__device__ static float topk_key(float s) { return s != s ? -INFINITY : s; }

/* The CPU's dsv4_ref_topk (insertion, strictly greater moves up: equal scores keep the lower index first). */
__device__ static void topk_insert(const float *score, int n, int k, int32_t *idx)
{
    int have = 0;
    for (int i = 0; i < n; i++) {
        float s = topk_key(score[i]);
        if (have == k && !(s > topk_key(score[idx[k - 1]]))) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && s > topk_key(score[idx[j - 1]])) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
}

__global__ static void route_kernel(const float *logits, int S, int E, int k, const float *bias,
                                    const int32_t *tid2eid, const int32_t *tokens, float routed_scale, int32_t *ids,
                                    float *weights, float *s_buf)
{
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= S) return;
    const float *lg = logits + (size_t)s * E;
    float *sb = s_buf + (size_t)s * E;
    int32_t *id = ids + (size_t)s * k;
    float *wt = weights + (size_t)s * k;
    for (int e = 0; e < E; e++) sb[e] = sqrtsoftplus(lg[e]);
    if (bias) {
        for (int e = 0; e < E; e++) sb[e] = FADD(sb[e], bias[e]);
        topk_insert(sb, E, k, id);
        for (int e = 0; e < E; e++) sb[e] = sqrtsoftplus(lg[e]);
    } else {
        for (int j = 0; j < k; j++) id[j] = tid2eid[(size_t)tokens[s] * k + j];
    }
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        wt[j] = sb[id[j]];
        sum = FADD(sum, wt[j]);
    }
    for (int j = 0; j < k; j++) wt[j] = FMUL(wt[j] / FADD(sum, 1e-20f), routed_scale);
}

extern "C" int dsv4_ref_gpu_route(const float *logits, int S, int E, int k, const float *bias,
                                  const int32_t *tid2eid, const int32_t *tokens, float routed_scale, int32_t *ids,
                                  float *weights, float *s_buf)
{
    route_kernel<<<blocks_for((size_t)S, 64), 64>>>(logits, S, E, k, bias, tid2eid, tokens, routed_scale, ids,
                                                    weights, s_buf);
    DSV4_REF_LAUNCH_CHECK("route");
    return 0;
}

/* moe_all's re-weighting of a followed row, step for step (route_kernel's sum and scaling). */
__global__ static void route_reweight_kernel(const float *logits, int S, int E, int k, const int32_t *ids,
                                             const int32_t *flag, float routed_scale, float *weights)
{
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= S || !flag[s]) return;
    const float *lg = logits + (size_t)s * E;
    const int32_t *id = ids + (size_t)s * k;
    float *wt = weights + (size_t)s * k;
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        wt[j] = sqrtsoftplus(lg[id[j]]);
        sum = FADD(sum, wt[j]);
    }
    for (int j = 0; j < k; j++) wt[j] = FMUL(wt[j] / FADD(sum, 1e-20f), routed_scale);
}

extern "C" int dsv4_ref_gpu_route_reweight(const float *logits, int S, int E, int k, const int32_t *ids,
                                           const int32_t *flag, float routed_scale, float *weights)
{
    if (S <= 0) return 0;
    route_reweight_kernel<<<blocks_for((size_t)S, 64), 64>>>(logits, S, E, k, ids, flag, routed_scale, weights);
    DSV4_REF_LAUNCH_CHECK("route_reweight");
    return 0;
}

__global__ static void gather_rows_kernel(float *dst, const float *src, const int32_t *rows, int n_rows, int row_len)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)n_rows * row_len) return;
    size_t i = t / row_len, c = t % row_len;
    dst[t] = src[(size_t)rows[i] * row_len + c];
}

extern "C" int dsv4_ref_gpu_gather_rows(float *dst, const float *src, const int32_t *rows, int n_rows, int row_len)
{
    size_t n = (size_t)n_rows * row_len;
    if (n == 0) return 0;
    gather_rows_kernel<<<blocks_for(n, 256), 256>>>(dst, src, rows, n_rows, row_len);
    DSV4_REF_LAUNCH_CHECK("gather_rows");
    return 0;
}

__global__ static void moe_combine_kernel(float *fo, const float *y, const int32_t *slot, const float *w, int S,
                                          int k, int D)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)S * D) return;
    size_t s = t / D, d = t % D;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) acc = FADD(acc, FMUL(y[(size_t)slot[s * k + j] * D + d], w[s * k + j]));
    fo[t] = FADD(acc, fo[t]);
}

extern "C" int dsv4_ref_gpu_moe_combine(float *fo, const float *y, const int32_t *slot, const float *w, int S, int k,
                                        int D)
{
    moe_combine_kernel<<<blocks_for((size_t)S * D, 256), 256>>>(fo, y, slot, w, S, k, D);
    DSV4_REF_LAUNCH_CHECK("moe_combine");
    return 0;
}

__global__ static void ring_write_kernel(float *ring, int window, const float *src, int64_t pos0, int n, int d)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)n * d) return;
    size_t i = t / d, c = t % d;
    ring[(size_t)((pos0 + (int64_t)i) % window) * d + c] = src[t];
}

extern "C" int dsv4_ref_gpu_ring_write(float *ring, int window, const float *src, int64_t pos0, int n, int d)
{
    size_t cnt = (size_t)n * d;
    if (cnt == 0) return 0;
    ring_write_kernel<<<blocks_for(cnt, 256), 256>>>(ring, window, src, pos0, n, d);
    DSV4_REF_LAUNCH_CHECK("ring_write");
    return 0;
}
