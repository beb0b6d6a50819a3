/* indexer.cuh - lightning-indexer scores (model-spec §8 step 4) for a batch of C sequences:
 *   I[c, w] = sum_h weights[c, h] * ReLU(q[c, h, :] . keys[c, w, :])   for w < n_live[c]
 * A row c is one query (a decode token, or one token of a prefill chunk); key_seq[c] names its sequence's keys.
 * Flash: H_I = 64 heads, d_I = 128, weights already carry 128^-1/2 * 64^-1/2. fp32 accumulation in both variants.
 *
 * Variants (design.md switch `indexer`):
 *   DSV4_INDEXER_KERNEL_BF16 - q.k on mma.sync m16n8k16 bf16, ReLU, head weights and head sum fused (one kernel).
 *   DSV4_INDEXER_KERNEL_F32  - the original: fp32 SIMT GEMM into a [C, H, n_work] scratch, then separate
 *                              elementwise ReLU*weight and head-sum kernels.
 * Switch `index_context`:
 *   DSV4_INDEX_CONTEXT_LIVE  - work sized by each sequence's live entries; scores written only for w < n_live[c].
 *   DSV4_INDEX_CONTEXT_MAX   - the original: every sequence computed over n_work (the configured maximum,
 *                              max_context/4) entries, then w >= n_live[c] masked to -inf (written for w < n_work).
 */
#ifndef DSV4_KERNELS_INDEXER_CUH
#define DSV4_KERNELS_INDEXER_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_indexer_kernel { DSV4_INDEXER_KERNEL_BF16, DSV4_INDEXER_KERNEL_F32 } dsv4_indexer_kernel;
typedef enum dsv4_index_context { DSV4_INDEX_CONTEXT_LIVE, DSV4_INDEX_CONTEXT_MAX } dsv4_index_context;

typedef struct dsv4_indexer_params {
    int n_seq;               /* C >= 1 */
    int n_heads;             /* H_I: 1..64 */
    int head_dim;            /* d_I: multiple of 16, <= 128 */
    int n_work;              /* entries the grid covers per sequence: live: >= max_c n_live[c]; max: the maximum */
    const uint16_t *q;       /* [C, H, d_I] bf16 bits, contiguous; device */
    const uint16_t *keys;    /* [C][>= n_work, d_I] bf16 bits, row stride d_I; device */
    int64_t key_seq_stride;  /* elements between sequences' key buffers (multiple of 8) */
    const int32_t *key_seq;  /* [n_seq] the key buffer of each query row (a prefill has several rows of one
                                sequence), each in [0, n_key_seqs); NULL: row c reads buffer c; device */
    const float *weights;    /* [C, H] head weights, already scaled; device */
    const int32_t *n_live;   /* [C] live entries per sequence, 0 <= n_live[c] <= n_work; device */
    float *scores;           /* [C, score_stride]; device; see index_context for what is written */
    int64_t score_stride;    /* >= n_work */
    dsv4_indexer_kernel kernel;
    dsv4_index_context context;
    float *scratch;          /* F32 only: dsv4_opt_indexer_scratch_bytes() bytes; device; caller-owned; else NULL */
    size_t scratch_bytes;
    cudaStream_t stream;
} dsv4_indexer_params;

/* Scratch the F32 variant needs (C * H * n_work floats); 0 for BF16. From the shapes and kernel alone: no pointer
 * is read (they may be NULL). */
size_t dsv4_opt_indexer_scratch_bytes(const dsv4_indexer_params *p);
/* Validates p and launches on p->stream. 0, or DSV4_ERR_USAGE / _UNSUPPORTED / _CUDA with a message. */
int dsv4_opt_indexer_scores(const dsv4_indexer_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_INDEXER_CUH */
