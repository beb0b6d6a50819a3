/* ref_gpu_layout.h - the GPU reference's memory layout, host side and plain C (no CUDA), so that the plan
 * (ref_plan.c) sizes exactly what ref_gpu_init.cu and ref_gpu_stream.cu allocate, and CPU tests can check it
 * (ref_gpu_layout.c; docs/reference.md "ref-gpu streams layers"):
 * - the scratch of one forward call (dsv4_ref_gpu_scratch_layout);
 * - the streamed weights: the parts they travel to the GPU in (a layer's dense tensors, a routed expert, a row range
 *   of the head), each a list of pieces: where a piece's bytes lie in the mapped checkpoint, where they go in a slot
 *   (a pinned host buffer and its device twin), where its f32 values go, and how the GPU dequantiser reads them.
 *
 * Invariants that fail quietly:
 * - A part fits one slot: the dense slots are sized by the largest layer's dense part and the head is cut into row
 *   ranges that fit them; the expert slots by the largest routed expert.
 * - Slot offsets and f32 offsets are 256-byte aligned, as the resident arena's views are, so cuBLAS sees the same
 *   alignment in both modes (and picks the same kernels). A head range lands at its rows of the one head view.
 * - FP8 rows row0 .. row0+n-1 need the scale rows row0/128 .. (row0+n-1)/128, staged from row0/128 on: the kernel
 *   indexes them as (row0 + r)/128 - row0/128. FP4 rows need their own scale rows.
 * - A dtype the GPU dequantiser does not read (F16, F64, E8M0 as a tensor) is dequantised on the host
 *   (model/dtype.c) into the slot and travels as f32 (DSV4_REF_WFMT_HOST); an integer tensor is refused.
 * - The pieces of a layer's part follow DSV4_REF_LAYER_TENSORS's order (the GPU binder walks the same list and
 *   checks every name).
 */
#ifndef DSV4_REF_GPU_LAYOUT_H
#define DSV4_REF_GPU_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4/dsv4.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A call holds at most GPU_CHUNK tokens (longer prefills run as consecutive calls); logits are computed for at most
 * LOGIT_ROWS rows at a time; the indexer scores at most ISCORE_FLOATS at a time. */
enum { GPU_CHUNK = 4096, LOGIT_ROWS = 64, ISCORE_FLOATS = 1 << 24 };

/* ------------------------------------------------------------------------------------------- scratch */
/* Device scratch of one call of up to S tokens (one arena, ref_gpu_init.cu). */
typedef struct dsv4_ref_gpu_scratch {
    int S;
    float *X, *X2, *vn;               /* [S, n, D] */
    float *mix, *pre, *post, *comb;   /* [S, (2+n)·n], [S, n], [S, n], [S, n, n] */
    float *xa, *xn;                   /* [S, D] */
    float *qr, *q, *kv;               /* [S, q_r], [S, H·d], [S, d] */
    float *ckv, *cg, *ikv, *ig;       /* [S, 2·d], [S, 2·d], [S, 2·d_I], [S, 2·d_I] */
    float *qI, *wI;                   /* [S, H_I·d_I], [S, H_I] */
    float *o, *z, *aout;              /* [S, H·d], [S, G·o_r], [S, D] */
    float *cos_m, *sin_m, *cos_c, *sin_c; /* [S, n_pairs] */
    float *iscore;                    /* [iq, pool_cap_max] indexer scores of iq queries */
    int32_t *topk;                    /* [S, topk] */
    float *rlogits, *rsbuf, *rw;      /* [S, E], [S, E], [S, k] */
    int32_t *rids;                    /* [S, k] */
    int32_t *row_tok, *slot_of;       /* [S·k] */
    int32_t *pair_of;                 /* [S·k] the (token, slot) pair of each grouped row (inverse of slot_of) */
    float *wslot;                     /* [S·k] the route weight of each grouped row (emulation) */
    int32_t *ident;                   /* [S·k] 0, 1, 2, ... (set at init) */
    int32_t *rflag;                   /* [S] following: 1 = the router row was merged, re-weight it */
    float *xg, *yg;                   /* [S·k, D] */
    float *eg, *eu;                   /* [S·k, I] */
    float *fout;                      /* [S, D] */
    float *hm, *hpre, *y;             /* [S, n], [S, n], [S, D] */
    float *erows;                     /* [S, D] the call's embedding rows (streamed weights) */
    float *yrows, *logits;            /* [LOGIT_ROWS, D], [LOGIT_ROWS, V] */
    int32_t *tokens, *lrows;          /* [S], [LOGIT_ROWS] */
} dsv4_ref_gpu_scratch;

/* The sizes the scratch and the state derive from max_tokens, as ref_gpu_init.cu uses them. */
typedef struct dsv4_ref_gpu_dims {
    int chunk;        /* tokens of one call: min(max_tokens, GPU_CHUNK) */
    int pool_cap_max; /* the largest CSA pool (max_tokens div ratio), at least 1 */
    int iq;           /* indexer query rows per score block: ISCORE_FLOATS / pool_cap_max in [1, chunk] */
    int topk;         /* index_topk, at least 1 */
    int n_pairs;      /* qk_rope_head_dim / 2 */
} dsv4_ref_gpu_dims;
void dsv4_ref_gpu_dims_of(const dsv4_config *f, int max_tokens, dsv4_ref_gpu_dims *d);
/* Carve the scratch of a call of dm->chunk tokens from mem (NULL: count only): the floats it needs. */
size_t dsv4_ref_gpu_scratch_layout(const dsv4_config *f, const dsv4_ref_gpu_dims *dm, dsv4_ref_gpu_scratch *sc,
                                   float *mem);

/* ------------------------------------------------------------------------------------- streamed parts */
/* How the GPU turns a piece's bytes into f32 (ref_gpu_stream.cu's dequantiser, bit for bit model/dtype.c's). */
typedef enum dsv4_ref_wfmt {
    DSV4_REF_WFMT_F32,  /* 4-byte floats: copied */
    DSV4_REF_WFMT_BF16, /* the bits shifted into the high half */
    DSV4_REF_WFMT_FP8,  /* F8_E4M3 codes x their 128x128 block's scale (E8M0 or F32) */
    DSV4_REF_WFMT_FP4,  /* e2m1 codes packed two per byte (low nibble = even column) x their 32 columns' scale */
    DSV4_REF_WFMT_HOST, /* dequantised on the host into the slot; travels as f32 */
    DSV4_REF_WFMT_COUNT
} dsv4_ref_wfmt;
const char *dsv4_ref_wfmt_name(dsv4_ref_wfmt f);

/* Rows row0 .. row0+nrows-1 of one tensor. */
typedef struct dsv4_ref_piece {
    const dsv4_tensor *t;       /* borrowed from the model */
    dsv4_ref_wfmt fmt;
    int scale_f32;              /* FP8 / FP4: 1 F32 scales, 0 E8M0 */
    int round;                  /* the bf16 emulation rounds the f32 values (ref_weights.c's emu_rounds rule) */
    int64_t row0, nrows, cols;  /* the rows; cols logical (FP4 unpacked) */
    int64_t scale_cols;         /* FP8 / FP4: columns of the scale tensor */
    const uint8_t *src;         /* the rows' bytes in the mapped checkpoint (HOST: NULL) */
    size_t src_len;             /* bytes staged for the data: src's, or nrows·cols·4 (HOST) */
    const uint8_t *ssrc;        /* the scale rows they need (FP8 / FP4; else NULL) */
    size_t ssrc_len;
    size_t data_at, scale_at;   /* byte offsets in the slot, 256-byte aligned */
    size_t dst_at;              /* float offset of row row0 in the part's f32 buffer */
} dsv4_ref_piece;

enum { DSV4_REF_PART_PIECES = 32 }; /* DSV4_REF_LAYER_TENSORS lists 31 */

typedef enum dsv4_ref_part_kind { DSV4_REF_PART_LAYER, DSV4_REF_PART_EXPERT, DSV4_REF_PART_HEAD } dsv4_ref_part_kind;

/* What one slot holds: a layer's dense tensors, a routed expert (w1, w3, w2), or a row range of the head. */
typedef struct dsv4_ref_part {
    dsv4_ref_part_kind kind;
    int layer;                  /* LAYER, EXPERT; -1 for HEAD */
    int index;                  /* EXPERT: the expert; HEAD: the range (0 .. head_parts-1); LAYER: 0 */
    int n;                      /* pieces */
    dsv4_ref_piece p[DSV4_REF_PART_PIECES];
    size_t bytes;               /* slot bytes used */
    size_t floats;              /* floats of the part's f32 buffer used (HEAD: the end of its rows) */
} dsv4_ref_part;

/* The sizes of the streamed scheme (dsv4_ref_stream_measure): every tensor looked up and size-checked. */
typedef struct dsv4_ref_stream_size {
    size_t dense_slot;          /* bytes: the largest layer's dense part, or a head range if one is larger */
    int dense_at;               /* the layer of the largest dense part */
    size_t expert_slot;         /* bytes: the largest routed expert's part */
    size_t layer_floats;        /* the largest layer's dense tensors as f32 */
    int layer_at;
    size_t head_floats;         /* the head as f32 */
    size_t arena_floats;        /* the f32 arena: max(layer_floats, head_floats) */
    size_t expert_floats;       /* one routed expert as f32 */
    int64_t head_rows;          /* rows per head range (the last may hold fewer) */
    int head_parts;             /* ranges the head travels in */
} dsv4_ref_stream_size;

/* Layer L's dense tensors (DSV4_REF_LAYER_TENSORS) into part; emu: the bf16 emulation's rounding flags. */
int dsv4_ref_part_layer(dsv4_model *m, const dsv4_config *f, int L, int emu, dsv4_ref_part *part);
/* Routed expert e of layer L: w1, w3, w2. */
int dsv4_ref_part_expert(dsv4_model *m, const dsv4_config *f, int L, int e, int emu, dsv4_ref_part *part);
/* Row range k (0 .. sz->head_parts-1) of the head (embed.weight when tied): rows k·head_rows .. */
int dsv4_ref_part_head(dsv4_model *m, const dsv4_config *f, const dsv4_ref_stream_size *sz, int k, int emu,
                       dsv4_ref_part *part);
/* An empty part, then rows row0 .. row0+nrows-1 (nrows < 0: all) of tensor `name` appended, their f32 values at the
 * part's next 256-byte aligned floats (held: the optimized path holds it in bf16, so emu rounds it unless FP8 / FP4).
 * The parts above are made of these; tests make parts of any tensors with them. */
void dsv4_ref_part_clear(dsv4_ref_part *part);
int dsv4_ref_part_add(dsv4_ref_part *part, dsv4_model *m, const char *name, int64_t row0, int64_t nrows, int emu,
                      int held);
/* The part's bytes from the mapped checkpoint into host [part->bytes] at the pieces' offsets (HOST pieces
 * dequantised there by model/dtype.c): what a slot's pinned side receives before its copy to the GPU. */
int dsv4_ref_part_fill(const dsv4_ref_part *part, const dsv4_model *m, uint8_t *host);
/* Look up and size-check every tensor the streamed scheme reads (embed and the globals too) and measure its slots
 * and buffers. The head's rows per range: as many as fit the dense slot, or $DSV4_REF_GPU_HEAD_ROWS (tests cut the
 * small golden heads into several ranges with it; the dense slot then grows if a range needs more). */
int dsv4_ref_stream_measure(dsv4_model *m, const dsv4_config *f, int emu, dsv4_ref_stream_size *sz);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_REF_GPU_LAYOUT_H */
