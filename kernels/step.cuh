/* step.cuh - per-step bookkeeping of the optimized decode step on the device (model-spec §9, §12.2, §13), so the
 * step needs no host round trip and can be a CUDA graph:
 *   setup:  from pos[c] / active[c] the window-ring slot of this token (-1 when inactive), the live compressed
 *           entries (p+1) div r of the CSA and HCA ratios (0 when inactive), and the RoPE cos/sin of both tables;
 *   index:  the attention's gather list [C, n_idx] = window slots of positions p-W+1..p (-1 before 0), then the
 *           compressed part: CSA W + topk pick (-1 stays -1), HCA W + w for w < live (else -1).
 */
#ifndef DSV4_KERNELS_STEP_CUH
#define DSV4_KERNELS_STEP_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_step_setup_params {
    int n_seq, window, ratio_csa, ratio_hca, rope_pairs;
    const int32_t *pos, *active;     /* [C]; device */
    const float *inv_main, *inv_cmp; /* [rope_pairs] f32; device */
    int32_t *ring_slot;              /* [C] out */
    int32_t *live_csa, *live_hca;    /* [C] out */
    float *cos_main, *sin_main, *cos_cmp, *sin_cmp; /* [C, rope_pairs] out */
    cudaStream_t stream;
} dsv4_step_setup_params;

typedef enum dsv4_step_index_kind { DSV4_STEP_INDEX_WINDOW, DSV4_STEP_INDEX_CSA, DSV4_STEP_INDEX_HCA } dsv4_step_index_kind;

typedef struct dsv4_step_index_params {
    int n_seq, window, n_extra;      /* n_idx = window + n_extra */
    dsv4_step_index_kind kind;
    const int32_t *pos;              /* [C]; device */
    const int32_t *topk;             /* CSA: [C, n_extra] picks; device */
    const int32_t *live;             /* [C] visible entries (CSA: picks >= live are dropped); device */
    int32_t *idx;                    /* [C, window + n_extra] out; device */
    cudaStream_t stream;
} dsv4_step_index_params;

int dsv4_opt_step_setup(const dsv4_step_setup_params *p);
int dsv4_opt_step_index(const dsv4_step_index_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_STEP_CUH */
