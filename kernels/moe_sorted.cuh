/* moe_sorted.cuh - the routed experts of a prefill step as grouped GEMMs (issue 35): the (token, expert) pairs of
 * T tokens are sorted by expert, each expert's tokens gathered into consecutive rows, and every expert runs two
 * dense bf16 GEMMs over its rows (dsv4_opt_moe_gemms between these kernels: cuBLAS, on lanes), so an expert's
 * weights are read once per step instead of once per 64 tokens (kernels/grouped_experts.cuh, the decode kernels). The
 * contract is dsv4_opt_moe_experts's: h = bf16(silu(min(x·W1ᵀ, λ)) · clamp(x·W3ᵀ, ±λ) · weight),
 * out[t] = Σ_j h[t, j]·W2ᵀ (j ascending, fp32) + shared[t]. The GEMMs' summation order is cuBLAS's, so the bits
 * differ from the decode kernels (bf16 rounding of other sums), never run to run.
 *   sort:    count[e], offset[e] (exclusive prefix) of the held experts [e_begin, e_end); perm (sorted row ->
 *            pair, an expert's pairs in pair order) and slot (pair -> sorted row, -1 for a pair of an expert not
 *            held: it adds nothing, a rank's partial sum). No atomics: deterministic.
 *   gather:  xs[q] = x[perm[q] div k] (bf16 rows of dim).
 *   swiglu:  h[q, i] from the up GEMM's gu[q] = [g (inter) | u (inter)] f32 and the pair's weight.
 *   combine: out[t] as above from the down GEMM's y[q] rows.
 *   gemms:   the up (gu = xs·W13ᵀ) or down (y = h·W2ᵀ) GEMMs of every held expert with rows, fp32 out, spread
 *            over lanes (below); bf16 weights as held, FP4 weights dequantised per expert and matrix first.
 */
#ifndef DSV4_KERNELS_MOE_SORTED_CUH
#define DSV4_KERNELS_MOE_SORTED_CUH

#include <cublas_v2.h>
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

/* The lanes of the per-expert GEMMs. One expert's GEMM of a prefill chunk has about T·k/E rows (192 for 8K tokens,
 * k 6, E 256): a few dozen CTAs on a 132-SM GPU, so one after another they leave most SMs idle. The i-th held
 * expert with rows goes to lane i mod n; lane i is a stream with its own cuBLAS handle (a handle is not to be used
 * on several streams at once with one workspace) and, for FP4 weights, its own bf16 slot: on a lane an expert's
 * dequantisation and its GEMM are simply ordered on the lane's stream, while the other lanes multiply. Lane 0 is
 * the caller's stream and handle (p->stream); lanes 1..n-1 wait for `fork` recorded on it before their first
 * launch, and it waits for each lane's join[i] after the last, so the launches before and after stay ordered on
 * p->stream alone. Each GEMM writes its own rows of gu / y and each lane its own slot: the values do not depend
 * on the timing. They do not depend on n either (test_opt_prefill checks 1 against 4) as long as every lane's
 * handle has the same settings: cuBLAS picks its kernel by the shape, the math mode and the workspace it may use,
 * so each handle needs a workspace of the same size (cublasSetWorkspace after cublasSetStream, which drops it). */
enum { DSV4_MOE_MAX_LANES = 8 };
typedef struct dsv4_moe_lanes {
    int n;                                     /* 1 .. DSV4_MOE_MAX_LANES */
    cudaStream_t stream[DSV4_MOE_MAX_LANES];   /* stream[0] = p->stream */
    cublasHandle_t cublas[DSV4_MOE_MAX_LANES]; /* cublas[i] bound to stream[i], each with its own workspace */
    uint16_t *wdq[DSV4_MOE_MAX_LANES];         /* FP4 weights: lane i's bf16 slot of 2·inter·dim elements,
                                                  16-byte aligned; unused with bf16 weights */
    cudaEvent_t fork, join[DSV4_MOE_MAX_LANES]; /* n > 1 (join[0] unused); timing disabled */
} dsv4_moe_lanes;

/* The held experts' weights (expert e of the rank at e - e_begin): bf16, or FP4 (qweight.cuh: repacked codes and
 * e8m0 scales per 32 input columns) when w13 is NULL. */
typedef struct dsv4_moe_gemm_weights {
    const uint16_t *w13, *w2;            /* [held][2·inter, dim], [held][dim, inter] bf16; or NULL */
    const uint8_t *q13, *s13, *q2, *s2;  /* [held][2·inter, dim/2], [held][2·inter, dim/32], [held][dim, inter/2],
                                            [held][dim, inter/32] */
} dsv4_moe_gemm_weights;

/* up 1: gu[q] = xs[q]·W13[e]ᵀ; up 0: y[q] = h[q]·W2[e]ᵀ, for every held expert e with rows q in
 * [off[e], off[e + 1]) (off: a HOST copy of offset[0..held]), fp32 out (CUBLAS_COMPUTE_32F), over l's lanes. */
int dsv4_opt_moe_gemms(const dsv4_moe_sorted_params *p, const dsv4_moe_gemm_weights *w, const dsv4_moe_lanes *l,
                       const int32_t *off, int up);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_MOE_SORTED_CUH */
