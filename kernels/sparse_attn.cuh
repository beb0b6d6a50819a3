/* sparse_attn.cuh - sparse attention decode (model-spec §6 steps 6-7, §9 gather form) for a batch of C sequences.
 *
 * Per query row c (a decode token or one token of a prefill chunk) and head h: s_j = (q_h . K_j) * scale over the listed entries j (idx = -1: skip);
 * p_j = e^{s_j} / (sum_k e^{s_k} + e^{sink_h}); o_h = sum_j p_j K_j (V = K); inverse RoPE on the trailing
 * rope_dim channels of o_h with the query position's cos/sin. Shapes as in Flash: H = 64, d = 512, rope_dim = 64,
 * n_idx = 128 window + 512 selected = 640.
 *
 * Variants (design.md switch `attn`):
 *   DSV4_ATTN_KERNEL_MMA  - every KV tile loaded once per sequence (cp.async), used by all heads through mma.sync
 *                           bf16 m16n8k16; split-K over the entries, then a fixed-order combine (bitwise
 *                           deterministic run to run). Probabilities enter the P.V product as bf16.
 *   DSV4_ATTN_KERNEL_SIMT - the original: one block per (sequence, head), fp32 SIMT, the entries re-read per head.
 * Either variant reads the KV as bf16 rows (kv) or as fp8 cache entries (kv8: e4m3 nope codes with ue8m0 scales,
 * bf16 rope; kernels/kv_layout.h), expanded to bf16 on the way (exact), so both forms of the same values give the
 * same output bits.
 */
#ifndef DSV4_KERNELS_SPARSE_ATTN_CUH
#define DSV4_KERNELS_SPARSE_ATTN_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_attn_kernel { DSV4_ATTN_KERNEL_MMA, DSV4_ATTN_KERNEL_SIMT } dsv4_attn_kernel;
typedef enum dsv4_out_dtype { DSV4_OUT_F32, DSV4_OUT_BF16 } dsv4_out_dtype;

typedef struct dsv4_sparse_attn_params {
    int n_seq;            /* C >= 1 */
    int n_heads;          /* H >= 1 (mma: any H, in blocks of 64 heads) */
    int head_dim;         /* d: multiple of 16, <= 512 */
    int rope_dim;         /* trailing channels to un-rotate: even, <= d (0: no inverse RoPE) */
    int n_idx;            /* entries listed per sequence (window + selected), >= 1 */
    int n_slots;          /* rows of each sequence's KV buffer; every idx must be -1 or < n_slots */
    float scale;          /* softmax scale, d^-1/2 */
    const uint16_t *q;    /* [C, H, d] bf16 bits, contiguous; device */
    const uint16_t *kv;   /* [C][n_slots, d] bf16 bits, row stride d; sequence c at kv + c*kv_seq_stride; device */
    const uint8_t *kv8;   /* or (kv NULL) the --kv fp8 entries of kernels/kv_layout.h, dsv4_kv8_entry_bytes(d,
                             rope_dim) bytes per slot; sequence c at kv8 + c*kv_seq_stride; device */
    int64_t kv_seq_stride;/* between two sequences' KV buffers: elements (kv, multiple of 8) or BYTES (kv8,
                             multiple of 16) */
    const int32_t *idx;   /* [C, n_idx] slot ids, -1 = skip; device */
    const int32_t *seq;   /* [C] the KV buffer of each query row (the rows of a prefill chunk share their
                             sequence's), each a valid buffer; NULL: row c reads buffer c; device */
    const void *fresh;    /* this step's own new KV rows, in the form of kv / kv8 (d bf16 / one entry each,
                             contiguous): slot n_slots + i reads row i (a chunk's rows see their chunk's window
                             entries here before the ring holds them); NULL when n_fresh is 0; device */
    int n_fresh;          /* rows of fresh; every idx must be -1 or < n_slots + n_fresh */
    const float *sink;    /* [H] sink logits; device */
    const float *rope_cos;/* [C, rope_dim/2] cos(p_c * theta_i) of each sequence's query position; device */
    const float *rope_sin;/* [C, rope_dim/2] sin(p_c * theta_i); device */
    void *out;            /* [C, H, d] f32 or bf16 bits (out_dtype); device, written in full */
    dsv4_out_dtype out_dtype;
    dsv4_attn_kernel kernel;
    void *workspace;      /* split-K partials, dsv4_opt_sparse_attn_workspace_bytes() bytes, 16-aligned; device;
                             may be NULL when that size is 0; owned by the caller (preallocated, rule 10) */
    size_t workspace_bytes;
    cudaStream_t stream;
} dsv4_sparse_attn_params;

/* Workspace the launch needs for these shapes on the current device (0 for SIMT, when no split happens, or when
 * the shapes are invalid). Answers from the shapes alone: n_seq, n_heads, head_dim, rope_dim, n_idx, n_slots,
 * out_dtype, kernel; the pointers, kv_seq_stride, workspace and stream are not read (they may be NULL/0), so the
 * workspace can be sized before any buffer exists. Deterministic for a given device and shape: the same split is
 * chosen by the launcher. */
size_t dsv4_opt_sparse_attn_workspace_bytes(const dsv4_sparse_attn_params *p);
/* Validates p, launches the work on p->stream. 0, or DSV4_ERR_USAGE / _UNSUPPORTED / _CUDA with a message. */
int dsv4_opt_sparse_attn(const dsv4_sparse_attn_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_SPARSE_ATTN_CUH */
