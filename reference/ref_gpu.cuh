/* ref_gpu.cuh - the kernels of the GPU fp32 reference (model-spec §3-§10), as C-callable host launchers over
 * device pointers: ref_gpu_ops.cu (linear, RMSNorm, RoPE, mHC, embedding, MoE pieces) and ref_gpu_attn.cu
 * (compressor state machine, indexer scores and selection, sink attention over gathered entries), the bf16
 * emulation's roundings in ref_gpu_emu.cu, and the streamed weights' dequantiser in ref_gpu_stream.cu. The model (ref_gpu.cu) composes them; tests/gpu/test_ref_gpu_ops.c and
 * tests/gpu/test_ref_gpu_emu_ops.c check each one against the CPU op of ref_ops.h (or the CPU emulation's code).
 *
 * Every kernel mirrors its CPU op (same formulas, same order of the per-element arithmetic; products and sums
 * that the CPU evaluates separately are not fused here either), so differences come only from reduction
 * order, the libm of each side (expf, cos) and cuBLAS's summation order. All launches go to the legacy default
 * stream; a launcher returns 0 or DSV4_ERR_CUDA (message recorded) and never synchronises unless it says so.
 * Linears are cuBLAS SGEMM in plain fp32 (the handle is set to CUBLAS_DEFAULT_MATH: never TF32).
 *
 * Conventions: row-major; "[S, n]" is S rows of n floats; all pointers are device pointers, borrowed.
 */
#ifndef DSV4_REF_GPU_CUH
#define DSV4_REF_GPU_CUH

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "dsv4/dsv4.h"
#include "ref_gpu_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ checks */
/* Record a CUDA / cuBLAS failure with the call text, file and line; returns DSV4_ERR_CUDA (0 if ok). */
int dsv4_ref_gpu_cuda_fail(cudaError_t e, const char *call, const char *file, int line);
int dsv4_ref_gpu_cublas_fail(cublasStatus_t s, const char *call, const char *file, int line);

#define DSV4_REF_CUDA_CHECK(call)                                                                                \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) return dsv4_ref_gpu_cuda_fail(e_, #call, __FILE__, __LINE__);                     \
    } while (0)
#define DSV4_REF_CUBLAS_CHECK(call)                                                                              \
    do {                                                                                                         \
        cublasStatus_t s_ = (call);                                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) return dsv4_ref_gpu_cublas_fail(s_, #call, __FILE__, __LINE__);         \
    } while (0)
/* After every kernel launch: a bad launch configuration is reported at the launch site. */
#define DSV4_REF_LAUNCH_CHECK(what) DSV4_REF_CUDA_CHECK((cudaGetLastError()))

/* Create a cuBLAS handle in plain fp32 math (no TF32). */
int dsv4_ref_gpu_blas_init(cublasHandle_t *h);

#ifdef __CUDACC__
/* x rounded to bf16 and back, bit for bit dsv4_f32_to_bf16 then dsv4_bf16_to_f32 (model/dtype.c): round to nearest
 * even, a NaN kept NaN (sign kept, quieted), overflow to inf. The bf16 emulation's one rounding. */
static __device__ __forceinline__ float dsv4_ref_gpu_bf16_round(float x)
{
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(((u >> 16) | 0x0040u) << 16);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float((u >> 16) << 16);
}
#endif

/* ------------------------------------------------------------------------------- ref_gpu_ops.cu (§3) */

/* y [S, n_out] = x [S, n_in] · w [n_out, n_in]ᵀ (SGEMM). y must not alias x. S >= 1. */
int dsv4_ref_gpu_linear(cublasHandle_t h, float *y, const float *x, const float *w, int S, int n_in, int n_out);
/* Grouped output projection (§6.8): z [S, G·o_r], z_g = o_g · W_oa[g]ᵀ with o [S, H·d] in G groups of gin =
 * H·d/G channels and wo_a [G·o_r, gin]; then out [S, D] = z · wo_bᵀ (wo_b [D, G·o_r]). */
int dsv4_ref_gpu_grouped_out(cublasHandle_t h, float *out, float *z, const float *o, const float *wo_a,
                             const float *wo_b, int S, int gin, int G, int o_r, int D);
/* Rows of n: y = w ⊙ x / sqrt(mean(x²) + eps), the mean accumulated in double like the CPU.
 * w [n] may be NULL (unweighted); y may alias x. */
int dsv4_ref_gpu_rmsnorm(float *y, const float *x, const float *w, int rows, int n, float eps);
/* cos/sin [S, n_pairs] of positions p0 .. p0+S-1: angle inv_freq[i]·(float)pos in fp32, cos/sin in double
 * rounded to float (dsv4_ref_rope_cos_sin). inv_freq [n_pairs] device. */
int dsv4_ref_gpu_rope_table(float *cos_t, float *sin_t, const float *inv_freq, int n_pairs, int64_t p0, int S);
/* Interleaved-pair RoPE on the trailing 2·n_pairs channels of every head of x [S, heads, dim], with the
 * angles of row s from cos_t/sin_t [S, n_pairs]; inverse = 1 rotates by −angle. */
int dsv4_ref_gpu_rope(float *x, int S, int heads, int dim, int n_pairs, const float *cos_t, const float *sin_t,
                      int inverse);

/* ------------------------------------------------------------------------------- ref_gpu_ops.cu (§5) */

/* mHC coefficients of S tokens from their mixes m [S, (2+n)·n] (= fn · normalised flatten): pre [S, n]
 * (sigmoid + hc_eps), post [S, n] (2·sigmoid), comb [S, n, n] (row softmax + eps, Sinkhorn ending on a column
 * step). base [(2+n)·n], scale [3]. n <= 16. */
int dsv4_ref_gpu_hc_coeff(const float *mix, const float *base, const float *scale, int S, int n, int iters,
                          float hc_eps, float *pre, float *post, float *comb);
/* x [S, D] = Σ_j pre[s, j] · X[s, j] with X [S, n, D], pre [S, n]. */
int dsv4_ref_gpu_hc_collapse(float *x, const float *X, const float *pre, int S, int n, int D);
/* Xo [S, n, D]: Xo[k] = post[k]·out + Σ_j comb[j][k]·X[j] (comb [S, n, n] FROM j TO k). Xo must not alias X. */
int dsv4_ref_gpu_hc_post(float *Xo, const float *X, const float *out, const float *post, const float *comb, int S,
                         int n, int D);
/* hc_head weights pre [S, n] = sigmoid(scale[0]·m + base) + hc_eps from m [S, n]. */
int dsv4_ref_gpu_hc_head_pre(const float *m, const float *base, const float *scale, int S, int n, float hc_eps,
                             float *pre);
/* X [S, n, D]: every stream of token s = embed[tokens[s]] (embed [V, D], tokens [S] device). */
int dsv4_ref_gpu_embed(float *X, const float *embed, const int32_t *tokens, int S, int n, int D);

/* ------------------------------------------------------------------------------ ref_gpu_ops.cu (§10) */

/* h [n] = silu(min(g, λ)) · clamp(u, −λ, λ); h may alias g. */
int dsv4_ref_gpu_swiglu(float *h, const float *g, const float *u, size_t n, float limit);
/* Router of S tokens from logits [S, E]: learned (bias [E] != NULL): ids = top-k of sqrtsoftplus + bias (ties:
 * lower expert first); hash (bias == NULL): ids = tid2eid [V, k] row of tokens[s]. weights = s_id / (Σ + 1e-20)
 * · routed_scale. ids, weights [S, k]; s_buf [S, E] scratch. */
int dsv4_ref_gpu_route(const float *logits, int S, int E, int k, const float *bias, const int32_t *tid2eid,
                       const int32_t *tokens, float routed_scale, int32_t *ids, float *weights, float *s_buf);
/* Decision following's re-weighting (ref_forward.c moe_all): for the rows s with flag[s] != 0, weights [s, k] =
 * sqrtsoftplus(logits[s, ids[s, j]]) / (Σ_j + 1e-20) · routed_scale, the router's formula and order for the ids the
 * row now holds (the dump's, merged in); other rows are left as they are. logits [S, E], ids [S, k], flag [S]. */
int dsv4_ref_gpu_route_reweight(const float *logits, int S, int E, int k, const int32_t *ids, const int32_t *flag,
                                float routed_scale, float *weights);
/* dst [n_rows, row_len] = src rows `rows` [n_rows]. */
int dsv4_ref_gpu_gather_rows(float *dst, const float *src, const int32_t *rows, int n_rows, int row_len);
/* MoE sum of S tokens: fo [S, D] ← (Σ_j y[slot[s·k + j]] · w[s·k + j]) + fo, j ascending (the routed sum
 * first, the shared expert's fo added last, as the CPU does). y [S·k, D], slot [S·k], w [S·k]. */
int dsv4_ref_gpu_moe_combine(float *fo, const float *y, const int32_t *slot, const float *w, int S, int k, int D);
/* dst [n, d] rows r0.. of the ring (slot = pos mod window) ← src rows; positions pos0 .. pos0+n-1. */
int dsv4_ref_gpu_ring_write(float *ring, int window, const float *src, int64_t pos0, int n, int d);

/* ------------------------------------------------------------------------------ ref_gpu_emu.cu (bf16) */
/* The bf16 emulation (docs/verify.md "The bf16 emulation of the reference"; the CPU's sites in ref_forward.c). */
/* x [n] ← dsv4_ref_gpu_bf16_round(x): a value the optimized path stores in bf16. */
int dsv4_ref_gpu_emu_round(float *x, size_t n);
/* The routed SwiGLU rows as moe_up_kernel stores them (o->h_r): h [nk, NI] row slot[i] ← bf16(h · w[i]) for each
 * (token, expert) pair i < nk (the route weight enters BEFORE the bf16 store). slot is a permutation of 0..nk-1. */
int dsv4_ref_gpu_moe_scale_round(float *h, const int32_t *slot, const float *w, int nk, int NI);
/* The emulated MoE sum (moe_down_kernel): fo [S, D] ← (Σ_j y[slot[s·k + j]]) + fo, j ascending, the route weights
 * already inside y (dsv4_ref_gpu_moe_scale_round); the shared expert's fo added last, as the CPU emulation does. */
int dsv4_ref_gpu_moe_sum(float *fo, const float *y, const int32_t *slot, int S, int k, int D);

/* -------------------------------------------------------------------- ref_gpu_stream.cu (dequantiser) */
/* The streamed weights' dequantiser: f32 values bit for bit model/dtype.c's (dsv4_model_read_f32), NaN bits
 * included, from the bytes as on disk (ref_gpu_layout.h's pieces). */
/* Fill the code tables (FP8 e4m3, E8M0, FP4 e2m1) from model/dtype.c's scalar conversions; once per process. */
int dsv4_ref_gpu_dequant_init(void);
/* Dequantise the pieces of `part`, staged at dev [part->bytes] (device; dsv4_ref_part_fill's layout), into dst
 * (device; piece i at dst + dst_at, [nrows, cols] f32); with emu, round the pieces flagged `round` to bf16. */
int dsv4_ref_gpu_part_dequant(const dsv4_ref_part *part, const uint8_t *dev, float *dst, int emu);

/* ------------------------------------------------------------------------------ ref_gpu_attn.cu (§7) */

/* The device state of one compressor (the CPU's dsv4_ref_compressor, §7.6): rows × width of [kv] and
 * [score] (score = gate + ape; −∞ empty). overlap = 1 (CSA): width 2·d_c, rows 2·ratio. */
typedef struct dsv4_ref_gpu_compressor {
    int ratio, d_c, overlap, width, rows;
    float *kv;    /* [rows, width] device, owned by the model's state arena */
    float *score; /* [rows, width] */
} dsv4_ref_gpu_compressor;

/* Bind to mem [2·rows·width] (device) and reset: kv 0, score −∞. */
int dsv4_ref_gpu_compressor_init(dsv4_ref_gpu_compressor *c, int ratio, int d_c, int overlap, float *mem);
/* Feed tokens p0 .. p0+S-1 (projections kvp, gp [S, width], gp without ape; ape [ratio, width]) through the
 * state machine, one token after the other; each window closing at p ((p+1) mod r == 0) writes its pooled
 * entry, before norm and RoPE, to pool row p div r (pool [cap, d_c]; the caller checks the capacity). */
int dsv4_ref_gpu_compressor_run(dsv4_ref_gpu_compressor *c, const float *kvp, const float *gp, const float *ape,
                                int64_t p0, int S, float *pool);
/* Finalise pool rows w0 .. w0+n-1 in place (§7.3): RMSNorm with norm_w [d_c], RoPE at position ratio·w
 * (inv_freq [n_pairs], the compress table). */
int dsv4_ref_gpu_compressor_finish(float *pool, int w0, int n, int d_c, const float *norm_w, float eps,
                                   const float *inv_freq, int n_pairs, int ratio);

/* ------------------------------------------------------------------------------ ref_gpu_attn.cu (§8) */

/* Index scores of S queries over n_pool keys: score [S, n_pool], score[s][w] = Σ_h (ReLU(qI_h · K_w)·d_I^-½)
 * · (wraw[s][h]·H_I^-½), heads summed in ascending order. qI [S, H_I, d_I], keys [n_pool, d_I], wraw [S, H_I].
 * n_pool >= 1. */
int dsv4_ref_gpu_index_scores(float *score, const float *qI, const float *keys, const float *wraw, int S,
                              int n_pool, int H_I, int d_I);
/* Selection (§8.5-6) of query rows s (positions p0+s): k = min(topk, n_pool) picks of score [S, n_pool]
 * (read only) with entries w >= (p+1) div ratio ranked as −∞ (NaN too), in the CPU's order (descending, equal
 * scores lower index first); picks of invisible entries become −1. idx [S, stride], first k per row. */
int dsv4_ref_gpu_index_select(int32_t *idx, int stride, const float *score, int S, int n_pool, int64_t p0,
                              int ratio, int k);

/* ------------------------------------------------------------------------------ ref_gpu_attn.cu (§6, §9) */

/* Sink attention of S queries over their gathered key=value rows (K = V), then inverse RoPE of each head's
 * output at the query position. Keys of the query at p = p0+s: window positions max(0, p−window+1) .. p (the
 * call's own rows from kv when >= p0, older ones from ring slot pos mod window), then HCA (ratio > 0, topk
 * NULL) entries w < (p+1) div ratio of pool, or CSA (topk != NULL) the n_topk picks of row s (−1 skipped). */
typedef struct dsv4_ref_gpu_attn_params {
    float *o;              /* [S, H, d] output */
    const float *q;        /* [S, H, d] rope'd queries */
    const float *kv;       /* [S, d] this call's key=value rows */
    const float *ring;     /* [window, d] earlier positions; may be NULL when p0 == 0 */
    const float *pool;     /* [cap, d] compressed entries, or NULL (sliding) */
    const int32_t *topk;   /* [S, topk_stride] CSA picks, or NULL */
    int topk_stride, n_topk;
    const float *sinks;    /* [H] */
    const float *cos_t, *sin_t; /* [S, n_pairs] the query positions' angles */
    int S, H, d, n_pairs, window, ratio;
    int64_t p0;
    int m_max;             /* bound on the key count of any query (sizes shared memory) */
    int bf16p;             /* 1: the bf16 emulation's P (dsv4_ref_sink_attention_bf16p): p_j = bf16(e^{s_j - max_j s})
                              enters P·V, the denominator sums the rounded p in ascending j plus e^{sink} in fp32 */
} dsv4_ref_gpu_attn_params;

/* Raise the kernel's shared-memory limit for m_max keys of d channels (once, at init). */
int dsv4_ref_gpu_attention_prepare(int m_max, int d, int topk_stride);
int dsv4_ref_gpu_attention(const dsv4_ref_gpu_attn_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_REF_GPU_CUH */
