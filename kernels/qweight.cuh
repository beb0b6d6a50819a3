/* qweight.cuh - kernels that read the checkpoint's quantised weights as they are on disk (issue 11; model-spec §2,
 * §3): FP8 e4m3 linears with one scale per 128x128 block, and the routed experts in FP4 e2m1 (two codes per byte,
 * LOW nibble = EVEN input column) with one e8m0 scale per 32 input columns; the FP4 codes are held with the bits
 * of each 32-bit word permuted (dsv4_opt_fp4_repack below: lossless, cheaper to decode). Nothing is expanded to a
 * bf16 copy of the weights in GPU memory: the kernels dequantise in registers and multiply on bf16 tensor cores
 * (mma.sync m16n8k16, fp32 accumulation). The one exception is the prefill's grouped expert GEMMs
 * (dsv4_opt_fp4_dequant below): one expert's matrix at a time in a bounded scratch, read by cuBLAS. sm_90 and
 * sm_120; no sm_90a-only instructions.
 *
 * Numerics: the product is that of the dequantised weight (exact in bf16: e4m3 and e2m1 values times a power of
 * two) with the bf16 activation, accumulated in fp32 - the same as the bf16 path on the dequantised weights,
 * up to fp32 summation order. Activations are NOT quantised (the reference does not quantise them either).
 *
 * Shapes are any size: a linear's n_out and n_in need not be multiples of 128 (partial blocks use the scale of
 * their block), experts need inter and dim multiples of 32.
 */
#ifndef DSV4_KERNELS_QWEIGHT_CUH
#define DSV4_KERNELS_QWEIGHT_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The scale encodings of the checkpoints: e8m0 bytes (value 2^(b-127)) or f32. */
typedef enum dsv4_qscale { DSV4_QSCALE_E8M0, DSV4_QSCALE_F32 } dsv4_qscale;

/* y[S, n_out] = x[S, n_in] · dequant(W)ᵀ, W e4m3 [n_out, n_in] row-major, scale [ceil(n_out/128), ceil(n_in/128)]. */
typedef struct dsv4_fp8_linear_params {
    int n_tok;              /* S >= 1 (decode: the batch C, up to 64 and more) */
    int n_out, n_in;        /* >= 1; n_in even */
    int group_rows;         /* 0, or a grouped linear (the grouped wo_a): output row r reads input columns
                               [(r / group_rows)·n_in, +n_in) of x; a multiple of 64 that divides n_out */
    const uint16_t *x;      /* [S, ldx] bf16; device */
    int64_t ldx;
    const uint8_t *w;       /* [n_out, n_in] e4m3; device */
    const void *scale;      /* [ceil(n_out/128), ceil(n_in/128)] e8m0 bytes or f32; device */
    dsv4_qscale scale_kind;
    void *y;                /* [S, ldy] f32 (y_f32) or bf16; device */
    int y_f32;
    int64_t ldy;
    void *workspace;        /* split-K partials, dsv4_opt_fp8_linear_workspace_bytes; device (may be NULL if 0) */
    size_t workspace_bytes;
    cudaStream_t stream;
} dsv4_fp8_linear_params;

/* Workspace the launcher needs for these shapes (0 if none). */
size_t dsv4_opt_fp8_linear_workspace_bytes(int n_tok, int n_out, int n_in);
int dsv4_opt_fp8_linear(const dsv4_fp8_linear_params *p);
/* dst [n_out, n_in] bf16 = dequant(W): each e4m3 code times its 128x128 block's scale, in f32, rounded to bf16 (exact
 * with e8m0 scales; f32 scales round, so the step uses it only with e8m0). For the prefill's linears over long
 * runs (opt_model.c): the matrix expanded into a bounded scratch, then one cuBLAS GEMM over the run's rows. n_in a
 * multiple of 16; w and dst 16-byte aligned. */
int dsv4_opt_fp8_dequant(const uint8_t *w, const void *scale, dsv4_qscale scale_kind, int n_out, int n_in,
                         uint16_t *dst, cudaStream_t stream);

/* The routed experts of C tokens with FP4 weights: the same contract as dsv4_moe_experts_params (moe.cuh) with
 * the weights packed. Per expert e: w13[e] = [2I, D/2] bytes (rows 0..I-1 W1, I..2I-1 W3), s13[e] = [2I, D/32];
 * w2[e] = [D, I/2] bytes, s2[e] = [D, I/32]. */
typedef struct dsv4_fp4_experts_params {
    int n_tok;              /* C >= 1 */
    int k;                  /* experts per token */
    int dim;                /* D, multiple of 32 */
    int inter;              /* I, multiple of 32 */
    float limit;            /* SwiGLU clamp λ */
    const uint16_t *x;      /* [C, D] bf16 MoE input (after ffn_norm); device */
    const int32_t *ids;     /* [C, k]; device */
    const float *weights;   /* [C, k]; device */
    const uint8_t *w13;     /* [E][2I, D/2], repacked (dsv4_opt_fp4_repack); device */
    const uint8_t *s13;     /* [E][2I, D/32] e8m0; device */
    const uint8_t *w2;      /* [E][D, I/2], repacked; device */
    const uint8_t *s2;      /* [E][D, I/32] e8m0; device */
    int e_begin, e_end;     /* expert parallel: the weights hold only experts [e_begin, e_end) (expert e at index
                               e - e_begin), pairs of other experts add nothing; e_end = 0: every expert */
    uint16_t *h;            /* [C, k, I] bf16 workspace; device */
    const float *shared;    /* [C, shared_stride] f32 shared-expert output added last, or NULL; device */
    int64_t shared_stride;
    float *out;             /* [C, D] f32; device */
    cudaStream_t stream;
} dsv4_fp4_experts_params;

int dsv4_opt_fp4_experts(const dsv4_fp4_experts_params *p);

/* The FP4 expert kernel reads its codes (w13, w2) in the repacked layout of fp4_layout.h: this permutes the bits of
 * each 32-bit word of `codes` (device, 4-aligned, n_bytes a multiple of 4) from the checkpoint's layout into it, in
 * place, on `stream`. Rows of D/2 or I/2 bytes are whole words, so any row range of a repacked matrix is the repack
 * of the same rows (expert parallel slices stay valid). */
int dsv4_opt_fp4_repack(uint8_t *codes, size_t n_bytes, cudaStream_t stream);
/* dst [rows, cols] bf16 = the FP4 weights codes [rows, cols/2] (repacked) times their e8m0 scales [rows, cols/32]:
 * the values the FP4 expert kernel multiplies, exact in bf16 (unless subnormal there). For the grouped expert GEMMs
 * of a prefill step (opt_step.c): one expert's matrix at a time into a bounded scratch, then cuBLAS. cols a
 * multiple of 32; codes and dst 16-byte aligned. */
int dsv4_opt_fp4_dequant(const uint8_t *codes, const uint8_t *scales, int64_t rows, int cols, uint16_t *dst,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_KERNELS_QWEIGHT_CUH */
