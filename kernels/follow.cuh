/* follow.cuh - decision following on the device (dsv4_opt.h "Decision following"): after the path has made (and
 * probed) its own selection, the following sequence's row is replaced by a reference dump's row for the rest of
 * the step, when the host staged one for this step (flag != 0; the flag and the row live in device memory that
 * the step's input copy fills, so a CUDA graph replays this unchanged).
 *   topk:  sel = the top-k picks [C, k]; the merged row goes back into sel (the gather list reads it next).
 *   route: sel = the router ids [C, k]; when the merged row differs, the weights of that token are recomputed
 *          from its router logits as the route computes them: s = sqrt(softplus(logit)),
 *          w_j = s_j / (Σ_j s_j + 1e-20) · routed_scale, j ascending.
 * The merge keeps every own id the dump also picked in its slot, puts the dump's other ids (first occurrences,
 * in the dump's order) into the remaining slots and -1 into any left over: when both selections are the same
 * set, nothing is written at all, so the step stays bitwise the free-running one.
 */
#ifndef DSV4_KERNELS_FOLLOW_CUH
#define DSV4_KERNELS_FOLLOW_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_follow_params {
    int n_seq;              /* C >= 1 */
    int seq;                /* the following sequence's (first) row, 0 <= seq < C */
    int n_rows;             /* rows seq .. seq + n_rows - 1 follow (a prefill run); 0 counts as 1 */
    int64_t row_stride;     /* ints between consecutive rows' flag (and ids) */
    int k;                  /* ids per row: 1..1024 (route: <= 16) */
    const int32_t *flag;    /* [1] nonzero: follow this step; device */
    const int32_t *ids;     /* [k] the dump's row (-1 = none); device */
    int32_t *sel;           /* [C, k] the path's own selection, row seq replaced in place; device */
    int32_t *changed;       /* [1] counter, +1 per row whose selection changed; device */
    /* route only */
    const float *logits;    /* [C, logit_stride] f32 router logits (first n_experts columns); device */
    int64_t logit_stride;
    int n_experts;
    float routed_scale;
    float *weights;         /* [C, k] f32, row seq recomputed when the ids changed; device */
    cudaStream_t stream;
} dsv4_follow_params;

int dsv4_opt_follow_topk(const dsv4_follow_params *p);
int dsv4_opt_follow_route(const dsv4_follow_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_FOLLOW_CUH */
