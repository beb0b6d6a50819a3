/* moe.cuh - the MoE of the optimized path (model-spec §10) for C tokens: routing, the routed experts (a grouped
 * GEMV kernel over the (token, expert) pairs of the batch, reading each pair's expert rows directly, so no host
 * round trip is needed to learn which experts are active and the step can be a CUDA graph), the clamped SwiGLU,
 * and the combine with the shared expert (whose GEMMs the host runs through cuBLAS, weights shared by all tokens).
 *
 * Routing: s = sqrt(softplus(logit)); learned layers: ids = top-k of s + bias (ties: lower expert id first, as the
 * reference); hash layers: ids = tid2eid[token]. weights = s_id / (Σ s_id + 1e-20) · routed_scale.
 * Experts: h[c, j] = silu(min(x·W1ᵀ, λ)) · clamp(x·W3ᵀ, ±λ) · weight[c, j] (the weight applied before W2, as [OFF]),
 * out[c] = Σ_j h[c, j]·W2ᵀ (j ascending, fp32) + shared[c].
 */
#ifndef DSV4_KERNELS_MOE_CUH
#define DSV4_KERNELS_MOE_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_moe_route_params {
    int n_tok;              /* C >= 1 */
    int n_experts;          /* E: 1..1024 */
    int k;                  /* experts per token: 1..16 */
    const float *logits;    /* [C, logit_stride] f32 router logits (first E columns); device */
    int64_t logit_stride;
    const float *bias;      /* [E] f32 selection bias (learned layers) or NULL (hash layers); device */
    const int32_t *tid2eid; /* [vocab, k] (hash layers) or NULL; device */
    const int32_t *tokens;  /* [C] token ids (hash layers); device */
    float routed_scale;
    int32_t *ids;           /* [C, k] out; device */
    float *weights;         /* [C, k] out; device */
    cudaStream_t stream;
} dsv4_moe_route_params;

typedef struct dsv4_moe_experts_params {
    int n_tok;              /* C >= 1 */
    int k;                  /* experts per token */
    int dim;                /* D (even) */
    int inter;              /* I (even) */
    float limit;            /* SwiGLU clamp λ */
    const uint16_t *x;      /* [C, D] bf16 MoE input (after ffn_norm); device */
    const int32_t *ids;     /* [C, k]; device */
    const float *weights;   /* [C, k]; device */
    const uint16_t *w13;    /* [E][2I, D] bf16: rows 0..I-1 = W1 (gate), I..2I-1 = W3 (up); device */
    const uint16_t *w2;     /* [E][D, I] bf16; device */
    int e_begin, e_end;     /* expert parallel: w13/w2 hold only experts [e_begin, e_end) (expert e at index
                               e - e_begin) and pairs of other experts add nothing (a rank's partial sum);
                               e_end = 0: w13/w2 hold every expert */
    uint16_t *h;            /* [C, k, I] bf16 workspace; device */
    const float *shared;    /* [C, shared_stride] f32 shared-expert output added last, or NULL; device */
    int64_t shared_stride;
    float *out;             /* [C, D] f32; device */
    cudaStream_t stream;
} dsv4_moe_experts_params;

/* Clamped SwiGLU of the shared expert: h[c, i] = silu(min(g, λ))·clamp(u, ±λ), g = gu[c, g_off + i],
 * u = gu[c, u_off + i]; h bf16 [C, I]. */
typedef struct dsv4_swiglu_params {
    int n_tok, inter;
    float limit;
    const float *gu;        /* [C, gu_stride] f32; device */
    int64_t gu_stride;
    int g_off, u_off;
    uint16_t *h;            /* [C, I] bf16; device */
    cudaStream_t stream;
} dsv4_swiglu_params;

int dsv4_opt_moe_route(const dsv4_moe_route_params *p);
int dsv4_opt_moe_experts(const dsv4_moe_experts_params *p);
int dsv4_opt_swiglu(const dsv4_swiglu_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_MOE_CUH */
