/* elementwise.cuh - row-wise and elementwise kernels of the optimized path (model-spec §3, §4, §6): embedding
 * gather into the residual streams, the fused RMSNorm + RoPE + FP8-KV-simulation + bf16 store used for q_norm, the
 * per-head query norm, the window KV and the final norm, bf16/f32 casts, fills, and the greedy argmax.
 */
#ifndef DSV4_KERNELS_ELEMENTWISE_CUH
#define DSV4_KERNELS_ELEMENTWISE_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X[c, j, :] = embed[tokens[c], :] for every stream j. */
typedef struct dsv4_embed_params {
    int n_tok, n_streams, dim;
    const int32_t *tokens;   /* [C]; device; each in [0, vocab) (checked by the host) */
    const uint16_t *embed;   /* [vocab, D] bf16; device */
    uint16_t *X;             /* [C, n, D] bf16; device */
    cudaStream_t stream;
} dsv4_embed_params;

/* One row per (token t, head h), row = t·heads + h, `dim` channels:
 *   v = x (f32 or bf16 input); if norm: v = v / sqrt(mean(v²) + eps) (· weight if given);
 *   if rope_pairs: interleaved RoPE of the trailing 2·rope_pairs channels with cos/sin row t;
 *   if fp8_nope: FP8 e4m3 simulation of channels [0, dim - 2·rope_pairs) per 64 (ue8m0 scales);
 *   out_bf16 row (t, h) = bf16(v); out_f32 (if given) row (t, h) = v.
 * Destination rows: out + t·out_tok_stride + h·dim, or, when out_slot != NULL, out + t·out_seq_stride +
 * out_slot[t]·dim (one head only; out_slot[t] < 0: not written) - the window-ring write of the KV.
 * With out8 (--kv fp8; out NULL, fp8_nope 1, post_scale 1) the row is stored as the fp8 cache entry of
 * kernels/kv_layout.h at out8 + t·out8_seq_stride + out_slot[t]·entry bytes (rope_dim = 2·rope_pairs; without
 * out_slot, one head: at out8 + t·out8_seq_stride, the fresh rows of a step with runs): the
 * codes and scales of the simulation, so the entry decodes to exactly the values out_f32 receives. */
typedef struct dsv4_norm_rope_params {
    int n_tok, heads, dim;       /* dim <= 4096 */
    const void *x;               /* f32 or bf16 (x_bf16 = 1); row (t, h) at x + t·x_tok_stride + h·dim; device */
    int x_bf16;
    int64_t x_tok_stride;
    int norm;                    /* 1: RMSNorm */
    const float *weight;         /* [dim] f32 or NULL (unweighted); device */
    float eps;
    int rope_pairs;
    const float *cos, *sin;      /* [n_tok, rope_pairs] f32; device; NULL when rope_pairs == 0 */
    int fp8_nope;
    uint16_t *out;               /* bf16; device */
    int64_t out_tok_stride;
    const int32_t *out_slot;     /* [n_tok] or NULL; device */
    int64_t out_seq_stride;
    uint8_t *out8;               /* fp8 cache entries instead of out, or NULL; device */
    int64_t out8_seq_stride;     /* BYTES between two sequences' entries */
    float *out_f32;              /* [n_tok, heads, dim] f32 copy or NULL; device */
    float post_scale;            /* multiplies the final value (1 for all but special uses) */
    int warp_rows;               /* 1: a long run's call may take one warp per row (dsv4_opt_norm_rope_warp_ok;
                                    other bits than the block kernel: the sum of squares adds in another order) */
    cudaStream_t stream;
} dsv4_norm_rope_params;

/* dst[i] = f32(src[i]) (bf16 -> f32) or dst = bf16(src) for n elements. */
int dsv4_opt_cast_bf16_to_f32(float *dst, const uint16_t *src, size_t n, cudaStream_t stream);
int dsv4_opt_cast_f32_to_bf16(uint16_t *dst, const float *src, size_t n, cudaStream_t stream);
/* dst[i] = value for n elements. */
int dsv4_opt_fill_f32(float *dst, float value, size_t n, cudaStream_t stream);
/* dst row i = src row rows[i] for i < n, row_bytes each (a multiple of 4): the rows a step with runs takes to
 * the head (each sequence's last token). */
int dsv4_opt_gather_rows(void *dst, const void *src, const int32_t *rows, int n, size_t row_bytes,
                         cudaStream_t stream);
/* out[c] = the lowest index of the largest of x[c, 0..n) (NaN never wins). One block per row. */
int dsv4_opt_argmax(int32_t *out, const float *x, int n_rows, int n, int64_t stride, cudaStream_t stream);

int dsv4_opt_embed(const dsv4_embed_params *p);
int dsv4_opt_norm_rope(const dsv4_norm_rope_params *p);
/* 1 when p would run one warp per row: warp_rows set, plain outputs (no ring slot, no fp8), dim a multiple of 64
 * up to 1024, 8-byte aligned f32 input rows and 4-byte aligned bf16 output rows. */
int dsv4_opt_norm_rope_warp_ok(const dsv4_norm_rope_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_ELEMENTWISE_CUH */
