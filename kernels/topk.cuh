/* topk.cuh - exact top-k of the indexer scores per sequence (model-spec §8 steps 5-6, §13 ties).
 *
 * Order: higher score first, then lower entry id (deterministic; -0.0 and +0.0 are the same score). Output per
 * sequence: k int32 ids in that order; when fewer than k entries are live, all live entries followed by -1.
 * Handles up to 2^22 entries per sequence (Flash at 1M context: 262144) and any k <= 2048.
 * `context` mirrors the indexer's switch: LIVE scans [0, n_live[c]); MAX scans all n_work scores (those past
 * n_live[c] are -inf from the indexer) and turns picks >= n_live[c] into -1, as [OFF] does in prefill.
 */
#ifndef DSV4_KERNELS_TOPK_CUH
#define DSV4_KERNELS_TOPK_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "indexer.cuh" /* dsv4_index_context */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_topk_params {
    int n_seq;             /* C >= 1 */
    int k;                 /* 1..2048 */
    int n_work;            /* scores per sequence the grid covers: 1..2^22; live: >= max_c n_live[c] */
    const float *scores;   /* [C, score_stride] fp32; device */
    int64_t score_stride;  /* >= n_work */
    const int32_t *n_live; /* [C] live entries, 0 <= n_live[c] <= n_work; device */
    dsv4_index_context context;
    int32_t *out;          /* [C, k] ids, -1 padded; device, written in full */
    void *workspace;       /* dsv4_opt_topk_workspace_bytes() bytes, 16-aligned; device; caller-owned */
    size_t workspace_bytes;
    cudaStream_t stream;
} dsv4_topk_params;

/* Workspace of dsv4_opt_topk for n_seq and k: answers from the shapes alone, no pointer is read (they may be NULL);
 * 0 when n_seq or k < 1. */
size_t dsv4_opt_topk_workspace_bytes(const dsv4_topk_params *p);
/* Validates p and launches on p->stream. 0, or DSV4_ERR_USAGE / _UNSUPPORTED / _CUDA with a message. */
int dsv4_opt_topk(const dsv4_topk_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_TOPK_CUH */
