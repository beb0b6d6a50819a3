/* mhc.cuh - manifold-constrained hyper-connections of the optimized path (model-spec §5) for C tokens: the pre
 * (flatten RMS, [n_mix, n·D] projection, sigmoid / Sinkhorn coefficients, stream collapse, the site's RMSNorm),
 * the post (X'[k] = post[k]·out + Σ_j comb[j][k]·X[j]) and the final hc_head collapse (head = 1: n_mix = n, only
 * pre = sigmoid(scale·m + base) + eps).
 *
 * Variants (design.md switch `mhc`):
 *   DSV4_MHC_KERNEL_CASTFREE  - the projection and the RMS statistic read the bf16 streams directly (split over
 *                               n·D in fixed chunks, partials summed in a fixed order), then ONE kernel sums the
 *                               partials, runs sigmoid + Sinkhorn, collapses the streams and applies the RMSNorm.
 *   DSV4_MHC_KERNEL_ROUNDTRIP - the original: streams cast to an fp32 copy first (X_f32), cuBLAS SGEMM for the
 *                               projection, then separate kernels for the RMS, the coefficients, the collapse and
 *                               the norm; the post reads the fp32 copy.
 * Both are bitwise deterministic run to run (no atomics).
 */
#ifndef DSV4_KERNELS_MHC_CUH
#define DSV4_KERNELS_MHC_CUH

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_mhc_kernel { DSV4_MHC_KERNEL_CASTFREE, DSV4_MHC_KERNEL_ROUNDTRIP } dsv4_mhc_kernel;
/* The cast-free partials of a call of >= DSV4_MHC_TILED_MIN_TOKENS tokens (a long prefill run):
 *   DSV4_MHC_PARTIAL_TILED - blocks of 128 tokens x one chunk of n·D, X and fn staged in shared memory: fn read once
 *                            per 128 tokens, X once (the default);
 *   DSV4_MHC_PARTIAL_ROWS  - the decode kernel, up to 4 tokens per block (fn re-read per 4 tokens): the ablation.
 * Fewer tokens always take the decode kernel, so decode keeps its bits. Both are deterministic, but a token's
 * partials differ in the last bits between the two (another order of adds). */
typedef enum dsv4_mhc_partial { DSV4_MHC_PARTIAL_TILED, DSV4_MHC_PARTIAL_ROWS } dsv4_mhc_partial;
enum { DSV4_MHC_TILED_MIN_TOKENS = 256 };

typedef struct dsv4_mhc_pre_params {
    int n_tok;            /* C >= 1 */
    int n_streams;        /* n = hc_mult: 1..4 */
    int dim;              /* D >= 1 */
    int head;             /* 0: a block site (n_mix = (2+n)·n); 1: hc_head (n_mix = n) */
    int sinkhorn_iters;   /* >= 1 (block sites) */
    float hc_eps, norm_eps;
    const uint16_t *X;    /* [C, n, D] bf16 residual streams; device */
    const float *fn;      /* [n_mix, n·D] f32; device */
    const float *base;    /* [n_mix] f32; device */
    const float *scale;   /* [3] (block) or [1] (head) f32; device */
    const float *norm_w;  /* [D] f32 weight of the RMSNorm of the collapsed input; NULL: xn not written */
    float *pre;           /* [C, n] f32; device */
    float *post;          /* [C, n] f32; device; unused (may be NULL) when head */
    float *comb;          /* [C, n, n] f32, comb[j][k] = weight from stream j to stream k; may be NULL when head */
    float *x;             /* [C, D] f32 collapsed input Σ_j pre_j X[j]; device */
    uint16_t *xn;         /* [C, D] bf16 RMSNorm(x; norm_w); device; NULL when norm_w is NULL */
    dsv4_mhc_kernel kernel;
    dsv4_mhc_partial partial; /* castfree, n_tok >= DSV4_MHC_TILED_MIN_TOKENS: tiled (0, default) or rows */
    float *X_f32;         /* roundtrip: [C, n, D] f32 copy of X, written here and read by the post; else unused */
    void *workspace;      /* dsv4_opt_mhc_pre_workspace_bytes() bytes, 16-aligned; device; caller-owned */
    size_t workspace_bytes;
    cublasHandle_t cublas;/* roundtrip: the handle for the SGEMM (bound to `stream` by the launcher) */
    cudaStream_t stream;
} dsv4_mhc_pre_params;

typedef struct dsv4_mhc_post_params {
    int n_tok, n_streams, dim;
    const uint16_t *X;    /* castfree: [C, n, D] bf16 streams the pre read; device */
    const float *X_f32;   /* roundtrip: [C, n, D] the pre's fp32 copy; device */
    const float *out;     /* [C, D] f32 attention / MoE output; device */
    const float *post;    /* [C, n] f32 */
    const float *comb;    /* [C, n, n] f32 */
    uint16_t *X_out;      /* [C, n, D] bf16; must not alias X; device */
    dsv4_mhc_kernel kernel;
    cudaStream_t stream;
} dsv4_mhc_post_params;

/* Workspace of dsv4_opt_mhc_pre for these shapes (n_tok, n_streams, dim, head, kernel): answers from the shapes
 * alone, no pointer is read (they may be NULL), so the caller can size the workspace before any buffer exists. */
size_t dsv4_opt_mhc_pre_workspace_bytes(const dsv4_mhc_pre_params *p);
/* Validates p and launches on p->stream. 0, or DSV4_ERR_USAGE / _UNSUPPORTED / _CUDA with a message. */
int dsv4_opt_mhc_pre(const dsv4_mhc_pre_params *p);
int dsv4_opt_mhc_post(const dsv4_mhc_post_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_MHC_CUH */
