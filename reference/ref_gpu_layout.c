/* ref_gpu_layout.c - the GPU reference's memory layout on the host side (ref_gpu_layout.h): the scratch of one
 * call, and the parts and pieces the streamed weights travel in, with the sizes of their slots and buffers.
 * Plain C: the plan (ref_plan.c) and the CPU tests use it without a GPU; ref_gpu_init.cu and ref_gpu_stream.cu
 * allocate and fill exactly what it says.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_gpu_layout.h"
#include "ref_model.h"

/* ------------------------------------------------------------------------------------------- scratch */
void dsv4_ref_gpu_dims_of(const dsv4_config *f, int max_tokens, dsv4_ref_gpu_dims *d)
{
    d->chunk = max_tokens < GPU_CHUNK ? max_tokens : GPU_CHUNK;
    d->topk = f->index_topk > 0 ? f->index_topk : 1;
    d->n_pairs = f->qk_rope_head_dim / 2;
    d->pool_cap_max = 1;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        int r = f->compress_ratio[L];
        if (f->attn_type[L] == DSV4_ATTN_CSA && r > 0 && max_tokens / r > d->pool_cap_max)
            d->pool_cap_max = max_tokens / r;
    }
    size_t iq = ISCORE_FLOATS / (size_t)d->pool_cap_max;
    d->iq = (int)(iq < (size_t)d->chunk ? (iq < 1 ? 1 : iq) : (size_t)d->chunk);
}

size_t dsv4_ref_gpu_scratch_layout(const dsv4_config *f, const dsv4_ref_gpu_dims *dm, dsv4_ref_gpu_scratch *sc,
                                   float *mem)
{
    size_t off = 0, s = (size_t)dm->chunk, n = f->hc_mult, D = f->hidden_size, H = f->num_attention_heads;
    size_t d = f->head_dim, HI = f->index_n_heads, dI = f->index_head_dim, E = f->n_routed_experts;
    size_t k = f->num_experts_per_tok, NI = f->moe_intermediate_size, np = dm->n_pairs, V = f->vocab_size;
#define CARVE(field, count)                                                                                      \
    do {                                                                                                         \
        if (mem) sc->field = (void *)(mem + off);                                                                \
        off += (size_t)(count);                                                                                  \
        off = (off + 63) & ~(size_t)63; /* 256-byte aligned views */                                             \
    } while (0)
    CARVE(X, s * n * D);
    CARVE(X2, s * n * D);
    CARVE(vn, s * n * D);
    CARVE(mix, s * (2 + n) * n);
    CARVE(pre, s * n);
    CARVE(post, s * n);
    CARVE(comb, s * n * n);
    CARVE(xa, s * D);
    CARVE(xn, s * D);
    CARVE(qr, s * f->q_lora_rank);
    CARVE(q, s * H * d);
    CARVE(kv, s * d);
    CARVE(ckv, s * 2 * d);
    CARVE(cg, s * 2 * d);
    CARVE(ikv, s * 2 * dI);
    CARVE(ig, s * 2 * dI);
    CARVE(qI, s * HI * dI);
    CARVE(wI, s * HI);
    CARVE(o, s * H * d);
    CARVE(z, s * f->o_groups * f->o_lora_rank);
    CARVE(aout, s * D);
    CARVE(cos_m, s * np);
    CARVE(sin_m, s * np);
    CARVE(cos_c, s * np);
    CARVE(sin_c, s * np);
    CARVE(iscore, (size_t)dm->iq * dm->pool_cap_max);
    CARVE(topk, s * dm->topk);
    CARVE(rlogits, s * E);
    CARVE(rsbuf, s * E);
    CARVE(rw, s * k);
    CARVE(rids, s * k);
    CARVE(row_tok, s * k);
    CARVE(slot_of, s * k);
    CARVE(pair_of, s * k);
    CARVE(wslot, s * k);
    CARVE(ident, s * k);
    CARVE(rflag, s);
    CARVE(xg, s * k * D);
    CARVE(yg, s * k * D);
    CARVE(eg, s * k * NI);
    CARVE(eu, s * k * NI);
    CARVE(fout, s * D);
    CARVE(hm, s * n);
    CARVE(hpre, s * n);
    CARVE(y, s * D);
    CARVE(erows, s * D);
    CARVE(yrows, (size_t)LOGIT_ROWS * D);
    CARVE(logits, (size_t)LOGIT_ROWS * V);
    CARVE(tokens, s);
    CARVE(lrows, LOGIT_ROWS);
#undef CARVE
    if (mem) sc->S = dm->chunk;
    return off;
}

/* ------------------------------------------------------------------------------------- streamed parts */
static const char *const wfmt_names[] = {"f32", "bf16", "fp8", "fp4", "host"};
_Static_assert(sizeof wfmt_names / sizeof wfmt_names[0] == DSV4_REF_WFMT_COUNT, "one name per dsv4_ref_wfmt");

const char *dsv4_ref_wfmt_name(dsv4_ref_wfmt f) { return (unsigned)f < DSV4_REF_WFMT_COUNT ? wfmt_names[f] : "?"; }

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

/* The head's tensor: the embedding when the config ties them. */
static const char *head_name(const dsv4_config *f) { return f->tie_word_embeddings ? "embed.weight" : "head.weight"; }

/* Rows of a tensor as the dequantisers see it (model/dtype.c): the first dim by the rest, FP4 unpacked. */
static void tensor_rows(const dsv4_tensor *t, int64_t *rows, int64_t *cols)
{
    size_t numel = dsv4_tensor_numel(t);
    *rows = t->ndim >= 1 ? t->shape[0] : 1;
    *cols = *rows > 0 ? (int64_t)(numel / (size_t)*rows) : 0;
}

/* Rows row0 .. row0+nrows-1 (nrows < 0: all) of tensor `name`, of numel elements (checked), appended to part;
 * held: the optimized path holds it in bf16 (the emulation rounds it unless FP8 / FP4 on disk). The f32 values go
 * to dst_at (< 0: the next 256-byte aligned floats of the part). */
static int piece_add(dsv4_ref_part *part, dsv4_model *m, int emu, int held, size_t numel, int64_t row0,
                     int64_t nrows, long dst_at, const char *name)
{
    const dsv4_tensor *t;
    DSV4_TRY(dsv4_model_tensor(m, name, &t));
    if (dsv4_tensor_numel(t) != numel)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s has %zu elements, the reference expects %zu", t->file, name,
                          dsv4_tensor_numel(t), numel);
    if (part->n >= DSV4_REF_PART_PIECES)
        return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: more than %d tensors in one part (at %s)", DSV4_REF_PART_PIECES,
                          name);
    dsv4_ref_piece *p = &part->p[part->n];
    memset(p, 0, sizeof *p);
    p->t = t;
    int64_t rows;
    tensor_rows(t, &rows, &p->cols);
    if (nrows < 0) {
        row0 = 0;
        nrows = rows;
    }
    if (row0 < 0 || nrows < 0 || row0 > rows || nrows > rows - row0)
        return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: rows %lld..%lld of %s (%lld rows)", (long long)row0,
                          (long long)(row0 + nrows), name, (long long)rows);
    p->row0 = row0;
    p->nrows = nrows;
    p->round = emu && held && t->dtype != DSV4_DTYPE_F8_E4M3 && t->dtype != DSV4_DTYPE_I8;
    size_t row_bytes = 0; /* bytes of one row on disk */
    int64_t srow0 = 0, srows = 0;
    if (t->dtype == DSV4_DTYPE_F32) {
        p->fmt = DSV4_REF_WFMT_F32;
        row_bytes = (size_t)p->cols * 4;
    } else if (t->dtype == DSV4_DTYPE_BF16) {
        p->fmt = DSV4_REF_WFMT_BF16;
        row_bytes = (size_t)p->cols * 2;
    } else if (t->dtype == DSV4_DTYPE_F8_E4M3 || dsv4_tensor_is_fp4(t)) {
        DSV4_TRY(dsv4_tensor_check_scale(t)); /* the bytes are copied as they are: their shapes must hold */
        const int fp8 = t->dtype == DSV4_DTYPE_F8_E4M3;
        p->fmt = fp8 ? DSV4_REF_WFMT_FP8 : DSV4_REF_WFMT_FP4;
        p->scale_f32 = t->scale->dtype == DSV4_DTYPE_F32;
        p->scale_cols = t->scale->shape[1];
        row_bytes = fp8 ? (size_t)p->cols : (size_t)t->shape[1];
        srow0 = fp8 ? row0 / 128 : row0;
        srows = nrows == 0 ? 0 : fp8 ? (row0 + nrows - 1) / 128 - srow0 + 1 : nrows;
    } else if (t->dtype == DSV4_DTYPE_F16 || t->dtype == DSV4_DTYPE_F64 || t->dtype == DSV4_DTYPE_F8_E8M0) {
        p->fmt = DSV4_REF_WFMT_HOST;
    } else {
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s is %s, not a float tensor", t->file, name,
                          dsv4_dtype_name(t->dtype));
    }
    if (p->fmt == DSV4_REF_WFMT_HOST) {
        p->src_len = (size_t)nrows * (size_t)p->cols * 4;
    } else {
        p->src = (const uint8_t *)t->data + (size_t)row0 * row_bytes;
        p->src_len = (size_t)nrows * row_bytes;
        if ((size_t)(row0 + nrows) * row_bytes > t->nbytes)
            return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s holds %zu bytes, rows ..%lld need %zu", t->file, name,
                              t->nbytes, (long long)(row0 + nrows), (size_t)(row0 + nrows) * row_bytes);
    }
    if (srows > 0) {
        const size_t srow_bytes = (size_t)p->scale_cols * (p->scale_f32 ? 4 : 1);
        p->ssrc = (const uint8_t *)t->scale->data + (size_t)srow0 * srow_bytes;
        p->ssrc_len = (size_t)srows * srow_bytes;
    }
    p->data_at = part->bytes;
    part->bytes += align256(p->src_len);
    p->scale_at = part->bytes;
    part->bytes += align256(p->ssrc_len);
    const size_t floats = (size_t)nrows * (size_t)p->cols;
    if (dst_at < 0) {
        p->dst_at = part->floats;
        part->floats = (part->floats + floats + 63) & ~(size_t)63; /* 256-byte aligned views */
    } else {
        p->dst_at = (size_t)dst_at;
        if ((size_t)dst_at + floats > part->floats) part->floats = (size_t)dst_at + floats;
    }
    part->n++;
    return 0;
}

static int piece_addf(dsv4_ref_part *part, dsv4_model *m, int emu, int held, size_t numel, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int piece_addf(dsv4_ref_part *part, dsv4_model *m, int emu, int held, size_t numel, const char *fmt, ...)
{
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return piece_add(part, m, emu, held, numel, 0, -1, -1, name);
}

static void part_start(dsv4_ref_part *part, dsv4_ref_part_kind kind, int layer, int index)
{
    part->kind = kind;
    part->layer = layer;
    part->index = index;
    part->n = 0;
    part->bytes = 0;
    part->floats = 0;
}

void dsv4_ref_part_clear(dsv4_ref_part *part) { part_start(part, DSV4_REF_PART_EXPERT, -1, -1); }

int dsv4_ref_part_add(dsv4_ref_part *part, dsv4_model *m, const char *name, int64_t row0, int64_t nrows, int emu,
                      int held)
{
    const dsv4_tensor *t;
    DSV4_TRY(dsv4_model_tensor(m, name, &t));
    return piece_add(part, m, emu, held, dsv4_tensor_numel(t), row0, nrows, -1, name);
}

int dsv4_ref_part_fill(const dsv4_ref_part *part, const dsv4_model *m, uint8_t *host)
{
    for (int i = 0; i < part->n; i++) {
        const dsv4_ref_piece *p = &part->p[i];
        if (p->fmt != DSV4_REF_WFMT_HOST) {
            memcpy(host + p->data_at, p->src, p->src_len);
            if (p->ssrc_len) memcpy(host + p->scale_at, p->ssrc, p->ssrc_len);
            continue;
        }
        float *dst = (float *)(void *)(host + p->data_at);
        int64_t rows, cols;
        tensor_rows(p->t, &rows, &cols);
        if (p->row0 == 0 && p->nrows == rows)
            DSV4_TRY(dsv4_model_read_f32(m, p->t->name, dst, (size_t)rows * (size_t)cols));
        else
            DSV4_TRY(dsv4_model_read_f32_rows(m, p->t->name, p->row0, p->nrows, dst));
    }
    return 0;
}

int dsv4_ref_part_layer(dsv4_model *m, const dsv4_config *f, int L, int emu, dsv4_ref_part *part)
{
    size_t D = f->hidden_size, H = f->num_attention_heads, d = f->head_dim, qr = f->q_lora_rank;
    size_t G = f->o_groups, o_r = f->o_lora_rank, HI = f->index_n_heads, dI = f->index_head_dim;
    size_t E = f->n_routed_experts, NI = f->moe_intermediate_size, n = f->hc_mult, mix = (2 + n) * n;
    dsv4_ref_layer_w kind, *w = &kind;
    DSV4_TRY(dsv4_ref_layer_kind(f, L, w));
    part_start(part, DSV4_REF_PART_LAYER, L, 0);
#define PIECE_LISTED(field, numel, cond, bf16, name)                                                             \
    if (cond) DSV4_TRY(piece_addf(part, m, emu, bf16, (size_t)(numel), name, L));
    DSV4_REF_LAYER_TENSORS(PIECE_LISTED)
#undef PIECE_LISTED
    return 0;
}

int dsv4_ref_part_expert(dsv4_model *m, const dsv4_config *f, int L, int e, int emu, dsv4_ref_part *part)
{
    size_t D = f->hidden_size, NI = f->moe_intermediate_size;
    part_start(part, DSV4_REF_PART_EXPERT, L, e);
    DSV4_TRY(piece_addf(part, m, emu, 1, NI * D, "layers.%d.ffn.experts.%d.w1.weight", L, e));
    DSV4_TRY(piece_addf(part, m, emu, 1, NI * D, "layers.%d.ffn.experts.%d.w3.weight", L, e));
    return piece_addf(part, m, emu, 1, D * NI, "layers.%d.ffn.experts.%d.w2.weight", L, e);
}

int dsv4_ref_part_head(dsv4_model *m, const dsv4_config *f, const dsv4_ref_stream_size *sz, int k, int emu,
                       dsv4_ref_part *part)
{
    const int64_t V = f->vocab_size, D = f->hidden_size, r0 = (int64_t)k * sz->head_rows;
    if (k < 0 || k >= sz->head_parts || r0 >= V)
        return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: head range %d of %d", k, sz->head_parts);
    const int64_t nr = V - r0 < sz->head_rows ? V - r0 : sz->head_rows;
    part_start(part, DSV4_REF_PART_HEAD, -1, k);
    return piece_add(part, m, emu, 1, (size_t)V * (size_t)D, r0, nr, (long)(r0 * D), head_name(f));
}

/* Rows of the head per range that fit `bytes` of slot: all bytes of r rows (data and scale rows, each 256-byte
 * aligned); FP8 ranges are whole 128-row blocks so that each range needs its own scale rows only. At least 1 (128). */
static int64_t head_rows_fitting(const dsv4_tensor *t, int64_t rows, int64_t cols, size_t bytes)
{
    const int fp8 = t->dtype == DSV4_DTYPE_F8_E4M3, fp4 = dsv4_tensor_is_fp4(t);
    const int64_t unit = fp8 ? 128 : 1;
    size_t per = 0; /* bytes of one unit of rows, data and scale */
    if (fp8) per = 128 * (size_t)cols + (size_t)t->scale->shape[1] * (t->scale->dtype == DSV4_DTYPE_F32 ? 4 : 1);
    else if (fp4) per = (size_t)t->shape[1] + (size_t)t->scale->shape[1] * (t->scale->dtype == DSV4_DTYPE_F32 ? 4 : 1);
    else if (t->dtype == DSV4_DTYPE_BF16) per = (size_t)cols * 2;
    else per = (size_t)cols * 4; /* F32, and f32 from the host */
    const size_t room = bytes > 512 ? bytes - 512 : 0; /* the two 256-byte roundings */
    int64_t units = per ? (int64_t)(room / per) : rows;
    if (units < 1) units = 1;
    int64_t r = units * unit;
    return r < rows ? r : rows;
}

int dsv4_ref_stream_measure(dsv4_model *m, const dsv4_config *f, int emu, dsv4_ref_stream_size *sz)
{
    memset(sz, 0, sizeof *sz);
    sz->dense_at = sz->layer_at = -1;
    dsv4_ref_part part;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        DSV4_TRY(dsv4_ref_part_layer(m, f, L, emu, &part));
        if (part.bytes > sz->dense_slot) {
            sz->dense_slot = part.bytes;
            sz->dense_at = L;
        }
        if (part.floats > sz->layer_floats) {
            sz->layer_floats = part.floats;
            sz->layer_at = L;
        }
        for (int e = 0; e < f->n_routed_experts; e++) {
            DSV4_TRY(dsv4_ref_part_expert(m, f, L, e, emu, &part));
            if (part.bytes > sz->expert_slot) sz->expert_slot = part.bytes;
            if (part.floats > sz->expert_floats) sz->expert_floats = part.floats;
        }
    }
    /* the head in row ranges that fit the dense slot (or $DSV4_REF_GPU_HEAD_ROWS rows: tests) */
    const dsv4_tensor *t;
    DSV4_TRY(dsv4_model_tensor(m, head_name(f), &t));
    const int64_t V = f->vocab_size, D = f->hidden_size;
    if (dsv4_tensor_numel(t) != (size_t)V * (size_t)D)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s has %zu elements, the reference expects %lld", t->file,
                          head_name(f), dsv4_tensor_numel(t), (long long)(V * D));
    if ((t->dtype == DSV4_DTYPE_F8_E4M3 || dsv4_tensor_is_fp4(t)) && !t->scale)
        return dsv4_error(DSV4_ERR_MISSING, "%s: tensor %s has no scale", t->file, head_name(f));
    if (t->dtype == DSV4_DTYPE_F8_E4M3 || dsv4_tensor_is_fp4(t)) DSV4_TRY(dsv4_tensor_check_scale(t));
    sz->head_rows = head_rows_fitting(t, V, D, sz->dense_slot);
    const char *env = getenv("DSV4_REF_GPU_HEAD_ROWS");
    if (env && *env) {
        char *end;
        long long r = strtoll(env, &end, 10);
        if (*end || r < 1)
            return dsv4_error(DSV4_ERR_USAGE, "DSV4_REF_GPU_HEAD_ROWS='%s': want a count of rows >= 1", env);
        if (t->dtype == DSV4_DTYPE_F8_E4M3) r = (r + 127) / 128 * 128;
        sz->head_rows = r < V ? r : V;
    }
    sz->head_parts = (int)((V + sz->head_rows - 1) / sz->head_rows);
    for (int k = 0; k < sz->head_parts; k++) {
        DSV4_TRY(dsv4_ref_part_head(m, f, sz, k, emu, &part));
        if (part.bytes > sz->dense_slot) sz->dense_slot = part.bytes; /* a range of many rows asked for */
    }
    sz->head_floats = (size_t)V * (size_t)D;
    sz->arena_floats = sz->layer_floats > sz->head_floats ? sz->layer_floats : sz->head_floats;
    /* what stays resident or comes a row at a time: looked up and checked here too */
    DSV4_TRY(dsv4_model_tensor(m, "embed.weight", &t));
    if (dsv4_tensor_numel(t) != (size_t)V * (size_t)D || t->ndim != 2)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor embed.weight has %zu elements in %d dims, the reference expects "
                          "[%lld, %lld]", t->file, dsv4_tensor_numel(t), t->ndim, (long long)V, (long long)D);
    return 0;
}
