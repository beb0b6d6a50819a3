/* moe_sorted.cuh - the routed experts of a prefill step as grouped GEMMs (issue 35): the (token, expert) pairs of
 * T tokens are sorted by expert, each expert's tokens gathered into consecutive rows, and every expert runs two
 * dense bf16 GEMMs over its rows (the caller's cuBLAS calls between these kernels), so an expert's weights are
 * read once per step instead of once per 64 tokens (kernels/grouped_experts.cuh, the decode kernels). The
 * contract is dsv4_opt_moe_experts's: h = bf16(silu(min(x·W1ᵀ, λ)) · clamp(x·W3ᵀ, ±λ) · weight),
 * out[t] = Σ_j h[t, j]·W2ᵀ (j ascending, fp32) + shared[t]. The GEMMs' summation order is cuBLAS's, so the bits
 * differ from the decode kernels (bf16 rounding of other sums), never run to run.
 *   sort:    count[e], offset[e] (exclusive prefix) of the held experts [e_begin, e_end); perm (sorted row ->
 *            pair, an expert's pairs in pair order) and slot (pair -> sorted row, -1 for a pair of an expert not
 *            held: it adds nothing, a rank's partial sum). No atomics: deterministic.
 *   gather:  xs[q] = x[perm[q] div k] (bf16 rows of dim).
 *   swiglu:  h[q, i] from the up GEMM's gu[q] = [g (inter) | u (inter)] f32 and the pair's weight.
 *   combine: out[t] as above from the down GEMM's y[q] rows.
 */
#ifndef DSV4_KERNELS_MOE_SORTED_CUH
#define DSV4_KERNELS_MOE_SORTED_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_moe_sorted_params {
    int n_tok, k, dim, inter;
    int n_experts;           /* E: ids in [0, E) */
    int e_begin, e_end;      /* held experts (e_end 0: all E); expert e's rows in the held matrices at e - e_begin */
    float limit;             /* SwiGLU clamp λ */
    const uint16_t *x;       /* [T, dim] bf16; device */
    const int32_t *ids;      /* [T, k]; device */
    const float *weights;    /* [T, k]; device */
    int32_t *count;          /* [held] out; device */
    int32_t *offset;         /* [held + 1] out; device */
    int32_t *perm;           /* [T·k] out; device */
    int32_t *slot;           /* [T·k] out; device */
    uint16_t *xs;            /* [T·k, dim] bf16; device */
    const float *gu;         /* [T·k, 2·inter] f32: the up GEMM's output; device */
    uint16_t *h;             /* [T·k, inter] bf16; device */
    const float *y;          /* [T·k, dim] f32: the down GEMM's output; device */
    const float *shared;     /* [T, shared_stride] f32 or NULL; device */
    int64_t shared_stride;
    float *out;              /* [T, dim] f32; device */
    cudaStream_t stream;
} dsv4_moe_sorted_params;

/* The held experts' count (e_end - e_begin, or E). */
int dsv4_moe_sorted_held(const dsv4_moe_sorted_params *p);
int dsv4_opt_moe_sort(const dsv4_moe_sorted_params *p);    /* count, offset, perm, slot */
int dsv4_opt_moe_gather(const dsv4_moe_sorted_params *p, int n_rows); /* xs rows 0..n_rows-1 */
int dsv4_opt_moe_swiglu_sorted(const dsv4_moe_sorted_params *p, int n_rows);
int dsv4_opt_moe_combine(const dsv4_moe_sorted_params *p);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_MOE_SORTED_CUH */
