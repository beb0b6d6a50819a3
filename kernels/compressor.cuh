/* compressor.cuh - the decode update of the KV compressors (model-spec §7.2-§7.6) for C sequences, one token
 * each: the main compressor of CSA/HCA layers (d_c = head_dim) and the indexer's (d_c = index_head_dim).
 *
 * Per active sequence c at position p = pos[c]: write state row (overlap ? r : 0) + p mod r with kv and gate + ape
 * (fp32 state); when (p+1) mod r == 0 the window closes: per channel a softmax over the slots' gates pools the kv
 * (CSA: a-halves of the previous window's rows and b-halves of the current rows), then RMSNorm(norm_w), RoPE at
 * position p+1-r = r·w on the trailing rope channels, optionally the FP8 simulation of the nope channels
 * (--kv fp8, main compressor only), and the bf16 entry goes to pool row pool_row0 + w of that sequence. CSA then
 * moves the current rows to the previous rows. Inactive sequences are untouched.
 */
#ifndef DSV4_KERNELS_COMPRESSOR_CUH
#define DSV4_KERNELS_COMPRESSOR_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_compressor_params {
    int n_seq;               /* C >= 1 */
    int ratio;               /* r >= 1 */
    int d_c;                 /* entry width, <= 1024 */
    int overlap;             /* 1: CSA (projections 2·d_c wide, 2r state rows), 0: HCA */
    int rope_pairs;          /* trailing channel pairs rotated, 2·rope_pairs <= d_c */
    int fp8_nope;            /* 1: FP8 e4m3 simulation of channels [0, d_c - 2·rope_pairs) (block 64, ue8m0) */
    float eps;               /* RMSNorm epsilon */
    const int32_t *pos;      /* [C] position of this step's token; device */
    const int32_t *active;   /* [C] 0/1; device */
    const float *proj;       /* [C, proj_stride] f32 projections of the attention input; device */
    int64_t proj_stride;
    int kv_off, gate_off;    /* columns of the kv and gate parts (width = (overlap ? 2 : 1)·d_c each) */
    const float *ape;        /* [r, width] f32 position bias; device */
    const float *norm_w;     /* [d_c] f32; device */
    const float *inv_freq;   /* [rope_pairs] f32 (compress table); device */
    float *state_kv;         /* [C][rows, width] f32, rows = (overlap ? 2 : 1)·r; device */
    float *state_score;      /* [C][rows, width] f32 (empty = -inf); device */
    uint16_t *pool;          /* [C][pool_seq_stride] bf16 rows of d_c; device */
    int64_t pool_seq_stride; /* elements between sequences' pools */
    uint8_t *pool8;          /* --kv fp8: the entries of kernels/kv_layout.h instead of pool (then NULL; fp8_nope
                                1), entry pool_row0 + w of sequence c at pool8 + c·pool8_seq_stride; device */
    int64_t pool8_seq_stride;/* BYTES between sequences' entries */
    int pool_row0;           /* row of entry 0 (the window ring size for the attention KV buffer, else 0) */
    int pool_cap;            /* entries a pool holds; an entry w >= pool_cap is dropped (host checks capacity) */
    /* Runs (a prefill chunk; compressor_plan.h): with seq set, the n_seq entries above are ROWS, and sequence
     * seq[c]'s rows are consecutive: row c holds position pos[c] = p0 + run_off[c] of a run of run_len[c] rows.
     * Every entry that closes in a run is pooled from the run's rows and the state, then the state becomes what
     * one-token steps leave (two launches; the same bits as one-token steps). NULL: row c is sequence c. */
    const int32_t *seq, *run_off, *run_len; /* [n_seq]; device */
    cudaStream_t stream;
} dsv4_compressor_params;

/* Validates p and launches on p->stream. 0, or DSV4_ERR_USAGE / _UNSUPPORTED / _CUDA with a message. */
int dsv4_opt_compressor_update(const dsv4_compressor_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_COMPRESSOR_CUH */
