/* step.cuh - per-step bookkeeping of the optimized step on the device (model-spec §9, §12.2, §13), so the step
 * needs no host round trip and can be a CUDA graph. A step's ROWS are its tokens: in a decode step row c is
 * sequence c (one token or inactive); in a step with runs (prefill chunks, mixed batches) sequence s's run of
 * n tokens is n consecutive rows, row c at position pos[c] = p0 + run_off[c].
 *   setup:  from pos[c] / active[c] the window-ring slot of this token (-1 when inactive, or when the step has
 *           runs: the ring is then written after the attention, ring_write), the live compressed entries
 *           (p+1) div r of the CSA and HCA ratios (0 when inactive), and the RoPE cos/sin of both tables;
 *   index:  the attention's gather list [C, n_idx] = window slots of positions p-W+1..p (-1 before 0), then the
 *           compressed part: CSA W + topk pick (-1 stays -1), HCA W + w for w < live (else -1). With runs a
 *           window position of the row's own run (>= p0) is the step's fresh KV row instead (slot fresh_base +
 *           that row): a run longer than one token would otherwise overwrite ring slots its earlier rows read;
 *   ring_write (runs only, after the attention): the last W rows of each run into their ring slots.
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
    int n_seq, window, ratio_csa, ratio_hca, rope_pairs; /* n_seq: the step's rows */
    int runs;                        /* 1: the step has runs (no ring slot: ring_write after the attention) */
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
    const int32_t *run_off;          /* [C] row c's index in its run (runs), or NULL (decode: the ring holds all) */
    int fresh_base;                  /* runs: the slot of fresh row 0 (the attention's n_slots) */
    cudaStream_t stream;
} dsv4_step_index_params;

/* Runs: the fresh KV row c (entry_bytes each, contiguous) goes to ring slot pos[c] mod window of sequence seq[c]
 * (ring + seq·ring_seq_stride bytes) when it is among its run's last `window` rows. */
typedef struct dsv4_ring_write_params {
    int n_rows, window;
    int64_t entry_bytes;             /* multiple of 16 */
    const int32_t *pos, *active, *seq, *run_off, *run_len; /* [n_rows]; device */
    const void *fresh;               /* [n_rows, entry_bytes]; device */
    void *ring;                      /* sequence s's ring at ring + s·ring_seq_stride; device */
    int64_t ring_seq_stride;         /* bytes */
    cudaStream_t stream;
} dsv4_ring_write_params;

int dsv4_opt_step_setup(const dsv4_step_setup_params *p);
int dsv4_opt_step_index(const dsv4_step_index_params *p);
int dsv4_opt_ring_write(const dsv4_ring_write_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_STEP_CUH */
