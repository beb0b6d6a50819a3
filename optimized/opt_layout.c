/* opt_layout.c - the one layout of the optimized path's three arenas and the one init sequence, shared by both
 * constructors of struct dsv4_opt: dsv4_opt_init (opt_model.c, weights uploaded from a model folder) and
 * dsv4_opt_init_random (opt_random.cu, weights generated on the GPU from a seed). The constructors differ only in
 * their opt_weight_src (opt_internal.h), which fills the views this file carves.
 *
 * Invariants that fail quietly:
 * - Each arena is laid out twice with the same function: once to count (base NULL, the weight source is not
 *   called), once to carve and fill, so the views can never disagree with the size, and both constructors give
 *   the same w_bytes, s_bytes and x_bytes for the same config and options.
 * - A weight view is filled by one bf16_view / f32 call (the generator draws one stream per view, in carve order:
 *   that order is part of the random weights' identity) and by one bf16_part call per file tensor inside it
 *   (fused projections have several parts at row offsets). In fp8 mode an FP8 linear or FP4 expert matrix is
 *   filled by one fp8 / fp4 call per file tensor (codes and scales together); its scale encoding (qscale) is
 *   asked on both passes, since the arena's size depends on it.
 * - Layer L's weights are contiguous in the arena (ly->w_bytes, alignment included): the per-layer memory report.
 * - The compressor states start as kv 0 / score -inf (an empty slot has weight 0); reset restores exactly that.
 * - The kernel workspace is the maximum over every shape a step can use (the gather-list sizes are the buckets
 *   of opt_step_sizes), so no step can need more than was allocated. The kernels' size queries answer from the
 *   shapes alone (no buffer exists yet when this runs).
 * - RoPE tables are built like the reference's (fp32 pow, YaRN ramp between floor/ceil correction dims, no mscale).
 * Spec: model-spec §1 (shapes), §3 (RoPE), §12.1 (the caches).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/elementwise.cuh"
#include "kernels/indexer.cuh"
#include "kernels/kv_layout.h"
#include "kernels/mhc.cuh"
#include "kernels/sparse_attn.cuh"
#include "kernels/topk.cuh"
#include "opt_internal.h"
#include "reference/ref_shard.h"

/* A long prefill's indexer scores are computed in slabs of rows of about this many bytes (with the fp32 indexer
 * its per-head dots too); a decode step is always one slab. The head of a step with runs runs in blocks of at
 * least OPT_LOGIT_ROWS rows. */
enum { OPT_LOGIT_ROWS = 64 };
#define OPT_SCORE_SLAB_BYTES ((size_t)256 << 20)

void *opt_carve(opt_carver *cv, size_t bytes)
{
    cv->off = (cv->off + 255) & ~(size_t)255;
    void *p = cv->base ? cv->base + cv->off : NULL;
    cv->off += bytes;
    return p;
}

/* ------------------------------------------------------------------------------------ weights */
static int fill_f32(opt_weight_src *s, const dsv4_opt *o, float *dst, size_t numel, opt_wkind kind, size_t fan_in,
                    const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int fill_f32(opt_weight_src *s, const dsv4_opt *o, float *dst, size_t numel, opt_wkind kind, size_t fan_in,
                    const char *fmt, ...)
{
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return s->f32(s, o, dst, numel, kind, fan_in, name);
}

/* One file tensor into dst: the whole tensor (rows x cols) through the ordinary calls (so the plain path and N = 1
 * load and draw exactly as before), or a rank's block [r0, +nr) x [c0, +nc) through the loader's slice; the
 * generator (slice NULL) draws an f32 block / has drawn the bf16 view already. esz 4: f32, 2: bf16. */
static int fill_block(opt_weight_src *s, const dsv4_opt *o, void *dst, int esz, opt_wkind kind, size_t fan_in,
                      size_t rows, size_t cols, size_t r0, size_t nr, size_t c0, size_t nc, const char *name)
{
    if (nr == rows && nc == cols)
        return esz == 4 ? s->f32(s, o, dst, rows * cols, kind, fan_in, name)
                        : s->bf16_part(s, o, dst, rows * cols, name);
    if (s->slice) return s->slice(s, o, dst, esz, name, rows, cols, r0, nr, c0, nc);
    return esz == 4 ? s->f32(s, o, dst, nr * nc, kind, fan_in, name) : 0;
}
/* An f32 view of one file tensor. */
#define WF(dst, numel, kind, fan_in, ...)                                                                        \
    do {                                                                                                         \
        (dst) = opt_carve(cv, (size_t)(numel) * 4);                                                              \
        if (cv->base) DSV4_TRY(fill_f32(src, o, (dst), (size_t)(numel), (kind), (size_t)(fan_in), __VA_ARGS__)); \
    } while (0)

/* One file tensor of a linear: its name, the rows the linear holds, and where they lie in the file tensor: a
 * rank's block rows [r0, r0 + rows) of f_rows, columns [c0, c0 + n_in) of f_cols (f_rows / f_cols 0: whole). */
typedef struct lin_part {
    char name[128];
    int rows;
    int f_rows, r0, f_cols, c0;
} lin_part;

static lin_part part(int rows, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static lin_part part(int rows, const char *fmt, ...)
{
    lin_part p = {.rows = rows};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p.name, sizeof p.name, fmt, ap);
    va_end(ap);
    return p;
}

/* p as the block rows [r0, +p.rows) of f_rows (0: all), columns [c0, +n_in) of f_cols (0: all). */
static lin_part block(lin_part p, int f_rows, int r0, int f_cols, int c0)
{
    p.f_rows = f_rows, p.r0 = r0, p.f_cols = f_cols, p.c0 = c0;
    return p;
}

/* One linear of the parts stacked by rows: bf16 (one view, the parts inside it), or fp8 (the caller stacks only
 * parts that fusable() accepts, so every scale row belongs to one part). A rank's block of an FP8 tensor carries
 * its scale rows/columns, so it must start on a 128 scale block (opt_check_config refused the split otherwise;
 * checked again here, on the counting pass, before any arena exists). */
static int linear(dsv4_opt *o, opt_weight_src *src, opt_carver *cv, opt_linear *w, int fp8, int n_in,
                  const lin_part *p, int np)
{
    int n_out = 0;
    for (int i = 0; i < np; i++) n_out += p[i].rows;
    memset(w, 0, sizeof *w);
    w->n_out = n_out, w->n_in = n_in;
    const size_t in = (size_t)n_in, fan_in = (size_t)(p[0].f_cols ? p[0].f_cols : n_in); /* the file's */
    if (!fp8) {
        w->bf16 = opt_carve(cv, (size_t)n_out * in * 2);
        if (!cv->base) return 0;
        DSV4_TRY(src->bf16_view(src, o, w->bf16, (size_t)n_out * in, OPT_W_LINEAR, fan_in));
        for (int i = 0, r = 0; i < np; r += p[i++].rows) {
            const size_t fr = (size_t)(p[i].f_rows ? p[i].f_rows : p[i].rows);
            const size_t fc = p[i].f_cols ? (size_t)p[i].f_cols : in;
            DSV4_TRY(fill_block(src, o, w->bf16 + (size_t)r * in, 2, OPT_W_LINEAR, fan_in, fr, fc,
                                    (size_t)p[i].r0, (size_t)p[i].rows, (size_t)p[i].c0, in, p[i].name));
        }
        return 0;
    }
    for (int i = 0; i < np; i++) {
        const int fr = p[i].f_rows ? p[i].f_rows : p[i].rows, fc = p[i].f_cols ? p[i].f_cols : n_in;
        const int sliced = fr != p[i].rows || fc != n_in;
        if (sliced && (p[i].r0 % 128 || p[i].c0 % 128 || (p[i].r0 + p[i].rows < fr && p[i].rows % 128) ||
                       (p[i].c0 + n_in < fc && n_in % 128)))
            return dsv4_error(DSV4_ERR_USAGE, "optimized --gpus %d --weights fp8: rank %d's block rows [%d, %d) x "
                              "columns [%d, %d) of %s [%d, %d] does not lie on 128x128 scale blocks", o->n_ranks,
                              o->rank, p[i].r0, p[i].r0 + p[i].rows, p[i].c0, p[i].c0 + n_in, p[i].name, fr, fc);
    }
    w->scale_kind = src->qscale(src, o, p[0].name);
    const size_t sc = (in + 127) / 128, sb = w->scale_kind == DSV4_QSCALE_F32 ? 4 : 1;
    w->fp8 = opt_carve(cv, (size_t)n_out * in);
    w->scale = opt_carve(cv, (size_t)((n_out + 127) / 128) * sc * sb);
    if (!cv->base) return 0;
    for (int i = 0, r = 0; i < np; r += p[i++].rows) {
        const int fr = p[i].f_rows ? p[i].f_rows : p[i].rows, fc = p[i].f_cols ? p[i].f_cols : n_in;
        DSV4_TRY(src->fp8(src, o, w->fp8 + (size_t)r * in, (char *)w->scale + (size_t)(r / 128) * sc * sb,
                              w->scale_kind, fr, fc, p[i].r0, p[i].rows, p[i].c0, n_in, fan_in, p[i].name));
    }
    return 0;
}

/* fp8 mode: may b follow a in one linear? Only when a's rows end on a scale block and the encodings agree. */
static int fusable(dsv4_opt *o, opt_weight_src *src, const lin_part *a, const lin_part *b)
{
    return a->rows % 128 == 0 && src->qscale(src, o, a->name) == src->qscale(src, o, b->name);
}

/* The projection of FP8 parts q[0..nq) at column offsets qoff, then (one bf16 linear) the bf16 parts b[0..nb)
 * at boff; in bf16 mode all of them in one bf16 linear (q then b, as their offsets are laid out). */
static int projection(dsv4_opt *o, opt_weight_src *src, opt_carver *cv, opt_proj *pj, int n_in, const lin_part *q,
                      const int *qoff, int nq, const lin_part *b, int boff, int nb, int q_first)
{
    memset(pj, 0, sizeof *pj);
    if (!o->fp8) {
        lin_part all[8];
        int n = 0;
        for (int i = 0; q_first && i < nq; i++) all[n++] = q[i];
        for (int i = 0; i < nb; i++) all[n++] = b[i];
        for (int i = 0; !q_first && i < nq; i++) all[n++] = q[i];
        pj->n = 1;
        pj->off[0] = 0;
        return linear(o, src, cv, &pj->lin[0], 0, n_in, all, n);
    }
    if (nb > 0 && !q_first) {
        pj->off[pj->n] = boff;
        DSV4_TRY(linear(o, src, cv, &pj->lin[pj->n++], 0, n_in, b, nb));
    }
    if (nq == 2 && fusable(o, src, &q[0], &q[1])) {
        pj->off[pj->n] = qoff[0];
        DSV4_TRY(linear(o, src, cv, &pj->lin[pj->n++], 1, n_in, q, 2));
    } else {
        for (int i = 0; i < nq; i++) {
            pj->off[pj->n] = qoff[i];
            DSV4_TRY(linear(o, src, cv, &pj->lin[pj->n++], 1, n_in, &q[i], 1));
        }
    }
    if (nb > 0 && q_first) {
        pj->off[pj->n] = boff;
        DSV4_TRY(linear(o, src, cv, &pj->lin[pj->n++], 0, n_in, b, nb));
    }
    return 0;
}

/* A linear of one file tensor (or the rank's block p of it) the checkpoint keeps in FP8: fp8 in fp8 mode, else
 * bf16. */
static int linear1(dsv4_opt *o, opt_weight_src *src, opt_carver *cv, opt_linear *w, int n_out, int n_in, lin_part p)
{
    p.rows = n_out;
    return linear(o, src, cv, w, o->fp8, n_in, &p, 1);
}

/* The rank's routed experts, ids e0..e0+E_loc at local index e - e0 (whole experts: split by id): bf16
 * w13 [E_loc][w1; w3] and w2 [E_loc], or (fp8 mode) the same as packed FP4 + e8m0 scales. */
static int experts(dsv4_opt *o, opt_weight_src *src, opt_carver *cv, opt_layer *ly, int L)
{
    const size_t EL = o->E_loc, e0 = o->e0, NI = o->NI, D = o->D;
    char name[128];
    if (!o->fp8) {
        ly->w13 = opt_carve(cv, EL * 2 * NI * D * 2);
        ly->w2 = opt_carve(cv, EL * D * NI * 2);
        if (!cv->base) return 0;
        DSV4_TRY(src->bf16_view(src, o, ly->w13, EL * 2 * NI * D, OPT_W_LINEAR, D));
        DSV4_TRY(src->bf16_view(src, o, ly->w2, EL * D * NI, OPT_W_LINEAR, NI));
        for (size_t e = 0; e < EL; e++) {
            static const char *const w[3] = {"w1", "w3", "w2"};
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "layers.%d.ffn.experts.%zu.%s.weight", L, e0 + e, w[k]);
                uint16_t *dst = k < 2 ? ly->w13 + (e * 2 + (size_t)k) * NI * D : ly->w2 + e * D * NI;
                DSV4_TRY(src->bf16_part(src, o, dst, NI * D, name));
            }
        }
        return 0;
    }
    if (D % 32 || NI % 32)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized --weights fp8: hidden_size %zu and moe_intermediate_size "
                          "%zu must be multiples of 32 (FP4 scale groups)", D, NI);
    ly->q13 = opt_carve(cv, EL * 2 * NI * D / 2);
    ly->s13 = opt_carve(cv, EL * 2 * NI * D / 32);
    ly->q2 = opt_carve(cv, EL * D * NI / 2);
    ly->s2 = opt_carve(cv, EL * D * NI / 32);
    for (size_t e = 0; e < EL && cv->base; e++) {
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "layers.%d.ffn.experts.%zu.%s.weight", L, e0 + e, k ? "w3" : "w1");
            size_t row0 = (e * 2 + (size_t)k) * NI;
            DSV4_TRY(src->fp4(src, o, ly->q13 + row0 * D / 2, ly->s13 + row0 * D / 32, (int)NI, (int)D, D, name));
        }
        snprintf(name, sizeof name, "layers.%d.ffn.experts.%zu.w2.weight", L, e0 + e);
        DSV4_TRY(src->fp4(src, o, ly->q2 + e * D * NI / 2, ly->s2 + e * D * NI / 32, (int)D, (int)NI, NI, name));
    }
    if (!cv->base) return 0;
    /* into the kernel's bit layout (kernels/fp4_layout.h), once the fills have landed (the loader's copies are
     * synchronous from pageable memory, the generator's on o->stream) */
    DSV4_OPT_CUDA(cudaDeviceSynchronize());
    DSV4_TRY(dsv4_opt_fp4_repack(ly->q13, EL * 2 * NI * D / 2, o->stream));
    DSV4_TRY(dsv4_opt_fp4_repack(ly->q2, EL * D * NI / 2, o->stream));
    return 0;
}

static int layer_weights(dsv4_opt *o, opt_weight_src *src, opt_carver *cv, int L)
{
    opt_layer *ly = &o->layers[L];
    const size_t D = o->D, nD = (size_t)o->n * o->D, mix = (size_t)(2 + o->n) * o->n, E = o->E, NI = o->NI;
    const size_t d = o->d, dI = o->dI;
    const int csa = ly->attn == DSV4_ATTN_CSA;
    const size_t width = (csa ? 2 : 1) * d;
    WF(ly->hc_attn_fn, mix * nD, OPT_W_LINEAR, nD, "layers.%d.hc_attn_fn", L);
    WF(ly->hc_attn_base, mix, OPT_W_MHC_BASE, 0, "layers.%d.hc_attn_base", L);
    WF(ly->hc_attn_scale, 3, OPT_W_MHC_SCALE, 0, "layers.%d.hc_attn_scale", L);
    WF(ly->hc_ffn_fn, mix * nD, OPT_W_LINEAR, nD, "layers.%d.hc_ffn_fn", L);
    WF(ly->hc_ffn_base, mix, OPT_W_MHC_BASE, 0, "layers.%d.hc_ffn_base", L);
    WF(ly->hc_ffn_scale, 3, OPT_W_MHC_SCALE, 0, "layers.%d.hc_ffn_scale", L);
    WF(ly->attn_norm, D, OPT_W_NORM, 0, "layers.%d.attn_norm.weight", L);
    WF(ly->ffn_norm, D, OPT_W_NORM, 0, "layers.%d.ffn_norm.weight", L);
    WF(ly->q_norm, o->qr, OPT_W_NORM, 0, "layers.%d.attn.q_norm.weight", L);
    WF(ly->kv_norm, d, OPT_W_NORM, 0, "layers.%d.attn.kv_norm.weight", L);
    ly->sinks = opt_carve(cv, (size_t)o->H * 4); /* the rank's heads' sinks */
    if (cv->base) {
        char sn[96];
        snprintf(sn, sizeof sn, "layers.%d.attn.attn_sink", L);
        DSV4_TRY(fill_block(src, o, ly->sinks, 4, OPT_W_SINK, 0, (size_t)o->H_all, 1, (size_t)o->h0,
                                (size_t)o->H, 0, 1, sn));
    }
    /* the x-projection: FP8 wq_a | wkv, then the bf16 compressor and indexer parts (the rank's rows of
     * weights_proj) */
    int r = 0;
    ly->off_qa = r, r += o->qr;
    ly->off_kv = r, r += (int)d;
    ly->off_ckv = r, r += ly->ratio > 0 ? (int)width : 0;
    ly->off_cg = r, r += ly->ratio > 0 ? (int)width : 0;
    ly->off_ikv = r, r += csa ? 2 * (int)dI : 0;
    ly->off_ig = r, r += csa ? 2 * (int)dI : 0;
    ly->off_iw = r, r += csa ? o->HI : 0;
    ly->n_x = r;
    if (r > o->n_x_max) o->n_x_max = r;
    lin_part xq[2] = {part(o->qr, "layers.%d.attn.wq_a.weight", L), part((int)d, "layers.%d.attn.wkv.weight", L)};
    const int xq_off[2] = {ly->off_qa, ly->off_kv};
    lin_part xb[5];
    int nb = 0;
    if (ly->ratio > 0) {
        xb[nb++] = part((int)width, "layers.%d.attn.compressor.wkv.weight", L);
        xb[nb++] = part((int)width, "layers.%d.attn.compressor.wgate.weight", L);
    }
    if (csa) {
        xb[nb++] = part(2 * (int)dI, "layers.%d.attn.indexer.compressor.wkv.weight", L);
        xb[nb++] = part(2 * (int)dI, "layers.%d.attn.indexer.compressor.wgate.weight", L);
        xb[nb++] = block(part(o->HI, "layers.%d.attn.indexer.weights_proj.weight", L), o->HI_all, o->hi0, 0, 0);
    }
    DSV4_TRY(projection(o, src, cv, &ly->x, (int)D, xq, xq_off, 2, xb, ly->off_ckv, nb, 1));
    if (ly->ratio > 0) {
        WF(ly->cmp_ape, (size_t)ly->ratio * width, OPT_W_APE, 0, "layers.%d.attn.compressor.ape", L);
        WF(ly->cmp_norm, d, OPT_W_NORM, 0, "layers.%d.attn.compressor.norm.weight", L);
    }
    if (csa) {
        WF(ly->idx_ape, (size_t)ly->ratio * 2 * dI, OPT_W_APE, 0, "layers.%d.attn.indexer.compressor.ape", L);
        WF(ly->idx_norm, dI, OPT_W_NORM, 0, "layers.%d.attn.indexer.compressor.norm.weight", L);
        DSV4_TRY(linear1(o, src, cv, &ly->idx_wq_b, o->HI * (int)dI, o->qr,
                             block(part(0, "layers.%d.attn.indexer.wq_b.weight", L), o->HI_all * (int)dI,
                                   o->hi0 * (int)dI, 0, 0)));
    }
    /* the rank's heads: rows of wq_b, its groups' rows of wo_a and their columns of wo_b */
    const int Gr = o->G * o->o_r, Gr_all = o->G_all * o->o_r, gr0 = o->g0 * o->o_r;
    DSV4_TRY(linear1(o, src, cv, &ly->wq_b, o->H * (int)d, o->qr,
                         block(part(0, "layers.%d.attn.wq_b.weight", L), o->H_all * (int)d, o->h0 * (int)d, 0, 0)));
    DSV4_TRY(linear1(o, src, cv, &ly->wo_a, Gr, o->H * (int)d / o->G,
                         block(part(0, "layers.%d.attn.wo_a.weight", L), Gr_all, gr0, 0, 0)));
    for (int g = 0; o->fp8 && g < o->G; g++) { /* a group's scale rows must be its own slice (opt_internal.h) */
        const int off = g * o->o_r;
        if (off % 128 && off % 128 + o->o_r > 128)
            return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized --weights fp8: wo_a group %d (rows %d..%d) straddles "
                              "a 128-row scale block", o->g0 + g, gr0 + off, gr0 + off + o->o_r - 1);
    }
    DSV4_TRY(linear1(o, src, cv, &ly->wo_b, (int)D, Gr,
                         block(part(0, "layers.%d.attn.wo_b.weight", L), 0, 0, Gr_all, gr0)));
    /* the ffn projection: router gate (bf16, every expert: every rank routes) | shared w1 | shared w3 (FP8; the
     * rank's intermediate columns = rows of w1/w3, columns of w2) */
    const int NS = o->NI_sh, i0 = o->i0;
    lin_part fq[2] = {block(part(NS, "layers.%d.ffn.shared_experts.w1.weight", L), (int)NI, i0, 0, 0),
                      block(part(NS, "layers.%d.ffn.shared_experts.w3.weight", L), (int)NI, i0, 0, 0)};
    const int fq_off[2] = {(int)E, (int)E + NS};
    lin_part fb = part((int)E, "layers.%d.ffn.gate.weight", L);
    DSV4_TRY(projection(o, src, cv, &ly->f, (int)D, fq, fq_off, 2, &fb, 0, 1, 0));
    DSV4_TRY(linear1(o, src, cv, &ly->sh_w2, (int)D, NS,
                         block(part(0, "layers.%d.ffn.shared_experts.w2.weight", L), 0, 0, (int)NI, i0)));
    if (ly->mlp == DSV4_MLP_HASH_MOE) {
        ly->tid2eid = opt_carve(cv, (size_t)o->V * o->K * 4);
        if (cv->base) {
            char name[96];
            snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", L);
            DSV4_TRY(src->tid2eid(src, o, ly->tid2eid, name));
        }
    } else {
        WF(ly->gate_bias, E, OPT_W_BIAS, 0, "layers.%d.ffn.gate.bias", L);
    }
    return experts(o, src, cv, ly, L);
}

static int weights_layout(dsv4_opt *o, opt_weight_src *src, opt_carver *cv)
{
    const size_t V = o->V, D = o->D, n = o->n;
    o->n_x_max = 0;
    o->embed = opt_carve(cv, V * D * 2);
    if (cv->base) {
        DSV4_TRY(src->bf16_view(src, o, o->embed, V * D, OPT_W_EMBED, 0));
        DSV4_TRY(src->bf16_part(src, o, o->embed, V * D, "embed.weight"));
    }
    if (o->cfg.tie_word_embeddings) o->head = o->embed;
    else {
        opt_linear h;
        DSV4_TRY(linear(o, src, cv, &h, 0, (int)D, &(lin_part){.name = "head.weight", .rows = (int)V}, 1));
        o->head = h.bf16;
    }
    WF(o->norm, D, OPT_W_NORM, 0, "norm.weight");
    WF(o->hc_head_fn, n * n * D, OPT_W_LINEAR, n * D, "hc_head_fn");
    WF(o->hc_head_base, n, OPT_W_MHC_BASE, 0, "hc_head_base");
    WF(o->hc_head_scale, 1, OPT_W_MHC_SCALE, 0, "hc_head_scale");
    o->inv_main = opt_carve(cv, (size_t)(o->np + 1) * 4);
    o->inv_cmp = opt_carve(cv, (size_t)(o->np + 1) * 4);
    if (cv->base && o->np > 0) {
        float t[2][512];
        dsv4_rope_inv_freq(&o->cfg.rope_main, o->cfg.qk_rope_head_dim, t[0]);
        dsv4_rope_inv_freq(&o->cfg.rope_compress, o->cfg.qk_rope_head_dim, t[1]);
        DSV4_OPT_CUDA(cudaMemcpy(o->inv_main, t[0], (size_t)o->np * 4, cudaMemcpyHostToDevice));
        DSV4_OPT_CUDA(cudaMemcpy(o->inv_cmp, t[1], (size_t)o->np * 4, cudaMemcpyHostToDevice));
    }
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        const size_t off0 = cv->off;
        DSV4_TRY(layer_weights(o, src, cv, L));
        o->layers[L].w_bytes = cv->off - off0;
    }
    return 0;
}
#undef WF


/* ------------------------------------------------------------------------------------ caches */
int opt_pool_capacity(int max_context, int ratio)
{
    if (ratio <= 0) return 0;
    return max_context / ratio > 0 ? max_context / ratio : 1;
}

static void state_layout(dsv4_opt *o, opt_carver *cv)
{
    const size_t C = o->C, d = o->d, dI = o->dI, W = o->W;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        opt_layer *ly = &o->layers[L];
        const int csa = ly->attn == DSV4_ATTN_CSA;
        ly->pool_cap = opt_pool_capacity(o->opt.max_context, ly->ratio);
        /* --kv fp8 stores the entries as model-spec §3's fp8 cache (kernels/kv_layout.h): 592 of 1,024 bytes in
         * Flash */
        const int fp8 = o->opt.kv == DSV4_OPT_KV_FP8;
        ly->kv_entry_bytes = fp8 ? (size_t)dsv4_kv8_entry_bytes((int)d, 2 * o->np) : d * 2;
        ly->kv_seq_stride = (int64_t)((W + ly->pool_cap) * (fp8 ? ly->kv_entry_bytes : d));
        void *kv = opt_carve(cv, C * (W + ly->pool_cap) * ly->kv_entry_bytes);
        if (fp8)
            ly->kv8 = kv;
        else
            ly->kvc = kv;
        if (ly->ratio <= 0) continue;
        size_t rows = (size_t)(csa ? 2 : 1) * ly->ratio, width = (size_t)(csa ? 2 : 1) * d;
        ly->cmp_kv = opt_carve(cv, C * rows * width * 4);
        ly->cmp_score = opt_carve(cv, C * rows * width * 4);
        if (!csa) continue;
        ly->ipool = opt_carve(cv, C * ly->pool_cap * dI * 2);
        ly->icmp_kv = opt_carve(cv, C * 2 * ly->ratio * 2 * dI * 4);
        ly->icmp_score = opt_carve(cv, C * 2 * ly->ratio * 2 * dI * 4);
    }
}

int opt_state_reset(dsv4_opt *o, int seq)
{
    const int c0 = seq < 0 ? 0 : seq, nc = seq < 0 ? o->C : 1;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        opt_layer *ly = &o->layers[L];
        if (ly->ratio <= 0) continue;
        const int csa = ly->attn == DSV4_ATTN_CSA;
        size_t n = (size_t)(csa ? 2 : 1) * ly->ratio * (csa ? 2 : 1) * o->d;
        DSV4_OPT_CUDA(cudaMemsetAsync(ly->cmp_kv + c0 * n, 0, nc * n * 4, o->stream));
        DSV4_TRY(dsv4_opt_fill_f32(ly->cmp_score + c0 * n, -INFINITY, nc * n, o->stream));
        if (!csa) continue;
        n = (size_t)2 * ly->ratio * 2 * o->dI;
        DSV4_OPT_CUDA(cudaMemsetAsync(ly->icmp_kv + c0 * n, 0, nc * n * 4, o->stream));
        DSV4_TRY(dsv4_opt_fill_f32(ly->icmp_score + c0 * n, -INFINITY, nc * n, o->stream));
    }
    DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
    return 0;
}

/* ------------------------------------------------------------------------------------ scratch */
/* The row counts a step can launch with: C (a decode step), and with a step budget Tm > C every count of a step
 * with runs, 1..Tm (the kernels' splits depend on it, not monotonically). */
static int row_count(const dsv4_opt *o, int i) { return o->Tm > o->C ? i + 1 : o->C; }
static int row_counts(const dsv4_opt *o) { return o->Tm > o->C ? o->Tm : 1; }

static size_t workspace_need(const dsv4_opt *o)
{
    size_t need = 0, s;
    for (int i = 0; i < row_counts(o); i++) {
        dsv4_mhc_pre_params mp = {.n_tok = row_count(o, i), .n_streams = o->n, .dim = o->D,
                                  .kernel = (dsv4_mhc_kernel)o->opt.mhc};
        if ((s = dsv4_opt_mhc_pre_workspace_bytes(&mp)) > need) need = s;
        mp.head = 1;
        if ((s = dsv4_opt_mhc_pre_workspace_bytes(&mp)) > need) need = s;
    }
    dsv4_sparse_attn_params ap = {.n_seq = o->C, .n_heads = o->H, .head_dim = o->d, .rope_dim = 2 * o->np,
                                  .kernel = (dsv4_attn_kernel)o->opt.attn, .out_dtype = DSV4_OUT_BF16};
    /* every gather-list size a step can use: the window, the CSA picks, the HCA buckets (each value opt_bucket
     * returns for the HCA pool) */
    int extras[64], ne = 0;
    extras[ne++] = 0;
    extras[ne++] = o->topk;
    for (int b = 16; ne < 62; b *= 2) {
        extras[ne++] = b < o->pool_cap_hca ? b : o->pool_cap_hca;
        if (b >= o->pool_cap_hca) break;
    }
    for (int t = 0; t < row_counts(o); t++)
        for (int i = 0; i < ne; i++) {
            ap.n_seq = row_count(o, t);
            ap.n_idx = o->W + extras[i];
            ap.n_slots = o->W + (o->pool_cap_hca > o->pool_cap_csa ? o->pool_cap_hca : o->pool_cap_csa);
            if ((s = dsv4_opt_sparse_attn_workspace_bytes(&ap)) > need) need = s;
        }
    /* fp8 mode: the split-K partials of every FP8 linear (wo_a: its groups in one launch) */
    for (int L = 0; L < o->cfg.num_hidden_layers && o->fp8; L++) {
        const opt_layer *ly = &o->layers[L];
        const opt_linear *w[10] = {&ly->wq_b, &ly->idx_wq_b, &ly->wo_b, &ly->sh_w2};
        int nw = 4;
        for (int i = 0; i < ly->x.n; i++) w[nw++] = &ly->x.lin[i];
        for (int i = 0; i < ly->f.n; i++) w[nw++] = &ly->f.lin[i];
        for (int t = 0; t < row_counts(o); t++) {
            const int S = row_count(o, t);
            for (int i = 0; i < nw; i++)
                if (w[i]->fp8 && (s = dsv4_opt_fp8_linear_workspace_bytes(S, w[i]->n_out, w[i]->n_in)) > need)
                    need = s;
            const int wo_rows = o->o_r % 64 == 0 ? ly->wo_a.n_out : o->o_r; /* one launch, or one per group */
            if ((s = dsv4_opt_fp8_linear_workspace_bytes(S, wo_rows, ly->wo_a.n_in)) > need) need = s;
        }
    }
    if (o->pool_cap_csa > 0) { /* one indexer slab at most: idx_rows rows (a smaller last slab needs less) */
        dsv4_indexer_params ip = {.n_seq = o->idx_rows, .n_heads = o->HI, .head_dim = o->dI,
                                  .n_work = o->pool_cap_csa, .kernel = (dsv4_indexer_kernel)o->opt.indexer};
        if ((s = dsv4_opt_indexer_scratch_bytes(&ip)) > need) need = s;
        dsv4_topk_params tp = {.n_seq = o->idx_rows, .k = o->topk, .n_work = o->pool_cap_csa,
                               .score_stride = o->pool_cap_csa};
        for (int b = 1; b < 2 * o->pool_cap_csa; b *= 2) { /* every power of two: opt_bucket's values and more */
            tp.n_work = b < o->pool_cap_csa ? b : o->pool_cap_csa;
            tp.context = DSV4_INDEX_CONTEXT_LIVE;
            if ((s = dsv4_opt_topk_workspace_bytes(&tp)) > need) need = s;
            tp.context = DSV4_INDEX_CONTEXT_MAX;
            if ((s = dsv4_opt_topk_workspace_bytes(&tp)) > need) need = s;
        }
    }
    return need;
}

/* 1: the budget allows steps with runs of >= OPT_SORTED_MIN_ROWS rows and their routed experts are grouped GEMMs
 * (the sorted buffers, the expert lanes). A condition, not a view: the counting pass carves NULL views. */
static int grouped_experts(const dsv4_opt *o)
{
    return o->Tm > o->C && o->Tm >= OPT_SORTED_MIN_ROWS &&
           o->opt.prefill_experts == DSV4_OPT_PREFILL_EXPERTS_GROUPED;
}

static void scratch_layout(dsv4_opt *o, opt_carver *cv)
{
    /* every per-row view holds Tm rows (a decode-only object: C); the indexer scores one slab, the logits one
     * block of head rows */
    const size_t C = o->Tm, D = o->D, n = o->n, Hd = (size_t)o->H * o->d, HId = (size_t)o->HI * o->dI;
    const size_t NI = o->NI, K = o->K, LR = o->logit_rows, L = o->cfg.num_hidden_layers;
    o->X = opt_carve(cv, C * n * D * 2);
    o->X2 = opt_carve(cv, C * n * D * 2);
    o->Xf = opt_carve(cv, C * n * D * 4);
    o->pre = opt_carve(cv, C * n * 4);
    o->post = opt_carve(cv, C * n * 4);
    o->comb = opt_carve(cv, C * n * n * 4);
    o->xa = opt_carve(cv, C * D * 4);
    o->xn = opt_carve(cv, C * D * 2);
    o->proj = opt_carve(cv, C * o->n_x_max * 4);
    o->qr_b = opt_carve(cv, C * o->qr * 2);
    o->qfull = opt_carve(cv, C * (Hd > HId ? Hd : HId) * 4);
    o->q = opt_carve(cv, C * Hd * 2);
    o->qI = opt_carve(cv, C * HId * 2);
    o->wI = opt_carve(cv, C * o->HI * 4);
    o->kvf = opt_carve(cv, C * o->d * 4);
    o->iscore = opt_carve(cv, (size_t)o->idx_rows * (o->pool_cap_csa > 0 ? o->pool_cap_csa : 1) * 4);
    o->topk_ids = opt_carve(cv, C * o->topk * 4);
    const size_t extra = (size_t)(o->topk > o->pool_cap_hca ? o->topk : o->pool_cap_hca);
    o->idx = opt_carve(cv, C * (o->W + extra) * 4);
    o->o = opt_carve(cv, C * Hd * 2);
    o->z = opt_carve(cv, C * o->G * o->o_r * 2);
    o->aout = opt_carve(cv, C * D * 4);
    o->fout = opt_carve(cv, C * D * 4);
    o->fproj = opt_carve(cv, C * (o->E + 2 * (size_t)o->NI_sh) * 4);
    o->rids = opt_carve(cv, C * K * 4);
    o->rw = opt_carve(cv, C * K * 4);
    o->h_sh = opt_carve(cv, C * o->NI_sh * 2);
    o->h_r = opt_carve(cv, C * K * NI * 2);
    o->y_sh = opt_carve(cv, C * D * 4);
    o->logits = opt_carve(cv, LR * o->V * 4);
    o->next = opt_carve(cv, LR * 4);
    o->ring_slot = opt_carve(cv, C * 4);
    o->live_csa = opt_carve(cv, C * 4);
    o->live_hca = opt_carve(cv, C * 4);
    o->cos_m = opt_carve(cv, C * (o->np + 1) * 4);
    o->sin_m = opt_carve(cv, C * (o->np + 1) * 4);
    o->cos_c = opt_carve(cv, C * (o->np + 1) * 4);
    o->sin_c = opt_carve(cv, C * (o->np + 1) * 4);
    o->d_in = opt_carve(cv, (6 * C + LR) * 4);
    o->d_head = o->d_in ? o->d_in + 6 * C : NULL;
    /* a decode-only object never has runs: no fresh rows, no gathered head rows */
    o->kv_fresh = o->Tm > o->C ? opt_carve(cv, C * o->kv_fresh_bytes) : NULL;
    o->xh = o->Tm > o->C ? opt_carve(cv, LR * D * 2) : NULL;
    const size_t ms0 = cv->off;
    /* the conditions, not the views: the counting pass (base NULL) carves NULL views of the same sizes */
    const int long_runs = o->Tm > o->C && o->Tm >= OPT_SORTED_MIN_ROWS, grouped = grouped_experts(o);
    if (grouped) { /* grouped expert GEMMs of a long run */
        const size_t P = C * K, E1 = (size_t)o->E + 1;
        o->ms_count = opt_carve(cv, E1 * 4);
        o->ms_offset = opt_carve(cv, E1 * 4);
        o->ms_perm = opt_carve(cv, P * 4);
        o->ms_slot = opt_carve(cv, P * 4);
        o->ms_xs = opt_carve(cv, P * D * 2);
        o->ms_gu = opt_carve(cv, P * 2 * NI * 4);
        o->ms_h = opt_carve(cv, P * NI * 2);
        o->ms_y = opt_carve(cv, P * D * 4);
    }
    /* the expert lanes 1..n-1: a cuBLAS workspace each, as large as lane 0's (o->cublas_ws) */
    const int n_lanes = grouped ? o->opt.expert_lanes : 1;
    o->lane_ws = n_lanes > 1 ? opt_carve(cv, (size_t)(n_lanes - 1) * o->cublas_ws_bytes) : NULL;
    /* fp8 mode: the largest matrix a long run dequantises (an FP4 expert's w13; an FP8 linear: wq_a, wkv, wq_b,
     * indexer wq_b, wo_a, wo_b, shared w1 / w3 / w2, the rank's shapes) */
    o->wdq_elems = 0, o->wdq_slot = 0;
    if (o->fp8 && long_runs) {
        /* one slot per expert lane, each on 256 bytes (the FP4 dequantisation writes 16-byte vectors) */
        o->wdq_slot = grouped ? ((size_t)2 * NI * D + 127) / 128 * 128 : 0;
        size_t m = (size_t)n_lanes * o->wdq_slot;
        if (o->opt.prefill_linears == DSV4_OPT_PREFILL_LINEARS_GEMM) {
            const size_t cand[] = {(size_t)o->qr * D,        (size_t)o->d * D,    Hd * o->qr,
                                   (size_t)o->HI * o->dI * o->qr, (size_t)o->o_r * Hd, (size_t)D * o->G * o->o_r,
                                   (size_t)o->NI_sh * D};
            for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) m = cand[i] > m ? cand[i] : m;
        }
        o->wdq_elems = m;
    }
    o->wdq = o->wdq_elems ? opt_carve(cv, o->wdq_elems * 2) : NULL;
    o->ms_bytes = cv->off - ms0;
    o->ws = opt_carve(cv, o->ws_bytes);
    o->cublas_ws = opt_carve(cv, o->cublas_ws_bytes);
    if (o->follow) {
        o->d_follow = opt_carve(cv, C * L * o->follow_stride * 4);
        o->d_follow_changed = opt_carve(cv, 2 * 4);
    }
}

/* ------------------------------------------------------------------------------------ init */
int opt_check_config(const dsv4_config *f, const dsv4_opt_options *op)
{
    DSV4_TRY(dsv4_opt_options_check(op));
    if (f->num_key_value_heads != 1 || f->hc_mult < 1 || f->hc_mult > 4 || f->qk_rope_head_dim % 2 ||
        f->qk_rope_head_dim > 1024 || f->o_groups < 1 || f->num_attention_heads % f->o_groups ||
        f->num_experts_per_tok > 16 || strcmp(f->scoring_func, "sqrtsoftplus"))
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized: config outside what the path supports (1 KV head, "
                          "hc_mult <= 4, even rope dim, heads divisible by o_groups, <= 16 experts per token, "
                          "sqrtsoftplus)");
    if (f->hidden_size % 2 || f->moe_intermediate_size % 2)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized: hidden_size %d and moe_intermediate_size %d must be even",
                          f->hidden_size, f->moe_intermediate_size);
    /* --gpus N > 1 --weights fp8 (weights resolved by the constructor): the ranks' FP8 slices on scale blocks */
    if (op->n_gpus > 1 && op->weights == DSV4_OPT_WEIGHTS_FP8)
        DSV4_TRY(dsv4_ref_shard_check_blocks(f, op->n_gpus, 128));
    return 0;
}

_Static_assert((int)DSV4_OPT_MAX_EXPERT_LANES <= (int)DSV4_MOE_MAX_LANES,
               "every allowed expert_lanes fits dsv4_moe_lanes");

/* The grouped experts' lanes (kernels/moe_sorted.cuh): lane 0 is the step's stream and handle; lanes 1..n-1 get
 * their own, each handle bound to its stream first and then given its workspace (cublasSetStream drops a
 * workspace set before it), as o->cublas is. Without grouped experts one lane, nothing made. */
static int lanes_init(dsv4_opt *o)
{
    dsv4_moe_lanes *l = &o->lanes;
    l->n = grouped_experts(o) ? o->opt.expert_lanes : 1;
    l->stream[0] = o->stream, l->cublas[0] = o->cublas;
    for (int i = 0; i < l->n; i++) l->wdq[i] = o->wdq_slot ? o->wdq + (size_t)i * o->wdq_slot : NULL;
    if (l->n > 1) DSV4_OPT_CUDA(cudaEventCreateWithFlags(&l->fork, cudaEventDisableTiming));
    for (int i = 1; i < l->n; i++) {
        DSV4_OPT_CUDA(cudaStreamCreateWithFlags(&l->stream[i], cudaStreamNonBlocking));
        DSV4_OPT_CUDA(cudaEventCreateWithFlags(&l->join[i], cudaEventDisableTiming));
        DSV4_OPT_CUBLAS(cublasCreate(&l->cublas[i]));
        DSV4_OPT_CUBLAS(cublasSetStream(l->cublas[i], l->stream[i]));
        DSV4_OPT_CUBLAS(cublasSetWorkspace(l->cublas[i], (char *)o->lane_ws + (size_t)(i - 1) * o->cublas_ws_bytes,
                                           o->cublas_ws_bytes));
    }
    return 0;
}

/* Count an arena with `layout`, check the device has room, allocate it, carve it, zero it on the stream. */
static int arena(dsv4_opt *o, const opt_weight_src *src, void (*layout)(dsv4_opt *, opt_carver *), void **mem,
                 size_t *bytes, const char *label)
{
    char what[96];
    opt_carver cv = {0};
    layout(o, &cv);
    *bytes = cv.off;
    snprintf(what, sizeof what, "%s: %s", src->what, label);
    DSV4_TRY(dsv4_mem_check_device((double)*bytes, what));
    DSV4_TRY(opt_dev_alloc(mem, *bytes, label));
    cv = (opt_carver){.base = *mem};
    layout(o, &cv);
    DSV4_OPT_CUDA(cudaMemsetAsync(*mem, 0, *bytes, o->stream));
    return 0;
}

int opt_init_common(dsv4_opt *o, opt_weight_src *src)
{
    const dsv4_config *f = &o->cfg;
    char what[96];
    o->C = o->opt.n_seq;
    o->D = f->hidden_size, o->n = f->hc_mult, o->V = f->vocab_size, o->H = f->num_attention_heads;
    o->d = f->head_dim, o->qr = f->q_lora_rank, o->HI = f->index_n_heads, o->dI = f->index_head_dim;
    o->E = f->n_routed_experts, o->K = f->num_experts_per_tok, o->NI = f->moe_intermediate_size;
    o->W = f->sliding_window, o->G = f->o_groups, o->o_r = f->o_lora_rank, o->np = f->qk_rope_head_dim / 2;
    o->topk = f->index_topk > 0 ? f->index_topk : 1;
    /* the rank's shard; the plain path is rank 0 of 1 */
    if (o->n_ranks < 1) o->rank = 0, o->n_ranks = 1;
    dsv4_ref_shard_part part;
    DSV4_TRY(dsv4_ref_shard_partition(f, o->rank, o->n_ranks, &part));
    o->H_all = o->H, o->HI_all = o->HI, o->G_all = o->G;
    o->H = part.nh, o->h0 = part.h0, o->HI = part.nhi, o->hi0 = part.hi0, o->G = part.ng, o->g0 = part.g0;
    o->E_loc = part.ne, o->e0 = part.e0, o->NI_sh = part.ni, o->i0 = part.i0;
    if (o->opt.kv == DSV4_OPT_KV_FP8 && !dsv4_kv8_shape_ok(o->d, 2 * o->np))
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized: --kv fp8 needs head_dim %d and its %d rope channels to "
                          "be multiples of 8 (the fp8 cache entry of kernels/kv_layout.h)", o->d, 2 * o->np);
    o->follow = o->opt.follow;
    o->follow_stride = 2 + o->topk + o->K;
    o->follow_stop = -1;
    if (o->follow && (dsv4_opt_follow_width(o->follow, DSV4_OPT_FOLLOW_TOPK) != f->index_topk ||
                      dsv4_opt_follow_width(o->follow, DSV4_OPT_FOLLOW_ROUTER) != o->K))
        return dsv4_error(DSV4_ERR_USAGE, "optimized: the follow table of %s was loaded for another config "
                          "(index_topk %d, experts per token %d; the model has %d, %d)",
                          dsv4_opt_follow_path(o->follow), dsv4_opt_follow_width(o->follow, DSV4_OPT_FOLLOW_TOPK),
                          dsv4_opt_follow_width(o->follow, DSV4_OPT_FOLLOW_ROUTER), f->index_topk, o->K);
    int n_dev = 0; /* no GPU is the user's situation, not a failed call of ours: say so, as ref-gpu does */
    cudaError_t dev_err = cudaGetDeviceCount(&n_dev);
    if (dev_err != cudaSuccess || n_dev < 1)
        return dsv4_error(DSV4_ERR_CUDA, "optimized: no CUDA device (%s)",
                          dev_err != cudaSuccess ? cudaGetErrorString(dev_err) : "0 devices");
    DSV4_OPT_CUDA(cudaSetDevice(o->opt.device));
    int dev_major = 0, dev_minor = 0;
    DSV4_OPT_CUDA(cudaDeviceGetAttribute(&dev_major, cudaDevAttrComputeCapabilityMajor, o->opt.device));
    DSV4_OPT_CUDA(cudaDeviceGetAttribute(&dev_minor, cudaDevAttrComputeCapabilityMinor, o->opt.device));
    /* the constructor resolved auto */
    DSV4_CHECK(o->opt.weights == DSV4_OPT_WEIGHTS_BF16 || o->opt.weights == DSV4_OPT_WEIGHTS_FP8,
               "optimized: weights mode %d not resolved", (int)o->opt.weights);
    o->fp8 = o->opt.weights == DSV4_OPT_WEIGHTS_FP8;
    snprintf(o->producer, sizeof o->producer,
             "dsv4 %s optimized cuda bf16 sm_%d%d attn=%s indexer=%s mhc=%s index_context=%s kv=%s weights=%s%s",
             DSV4_VERSION, dev_major, dev_minor, dsv4_opt_attn_name(o->opt.attn),
             dsv4_opt_indexer_name(o->opt.indexer), dsv4_opt_mhc_name(o->opt.mhc),
             dsv4_opt_index_context_name(o->opt.index_context), dsv4_opt_kv_name(o->opt.kv),
             dsv4_opt_weights_name(o->opt.weights), o->opt.quantize == DSV4_OPT_QUANTIZE_FP8 ? " quantize=fp8" : "");
    if (o->follow) { /* the producer says the run's choices were the dump's */
        const char *fp = dsv4_opt_follow_path(o->follow), *base = strrchr(fp, '/');
        size_t len = strlen(o->producer);
        snprintf(o->producer + len, sizeof o->producer - len, " follow=%s", base ? base + 1 : fp);
    }
    o->layers = calloc((size_t)f->num_hidden_layers, sizeof *o->layers);
    o->pos = calloc((size_t)o->C, sizeof *o->pos);
    if (!o->layers || !o->pos) return dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory");
    for (int L = 0; L < f->num_hidden_layers; L++) {
        opt_layer *ly = &o->layers[L];
        ly->attn = f->attn_type[L];
        ly->mlp = f->mlp_type[L];
        ly->ratio = ly->attn == DSV4_ATTN_SLIDING ? 0 : f->compress_ratio[L];
        if (ly->attn != DSV4_ATTN_SLIDING && ly->ratio <= 0)
            return dsv4_error(DSV4_ERR_CONFIG, "layer %d: %s attention with compress ratio %d", L,
                              dsv4_attn_type_name(ly->attn), ly->ratio);
        if (ly->attn == DSV4_ATTN_CSA && ly->ratio != f->compress_rate_csa)
            return dsv4_error(DSV4_ERR_UNSUPPORTED, "layer %d: CSA ratio %d differs from compress_rate_csa %d", L,
                              ly->ratio, f->compress_rate_csa);
        if (ly->attn == DSV4_ATTN_HCA && ly->ratio != f->compress_rate_hca)
            return dsv4_error(DSV4_ERR_UNSUPPORTED, "layer %d: HCA ratio %d differs from compress_rate_hca %d", L,
                              ly->ratio, f->compress_rate_hca);
    }
    /* the generator fills on this stream; everything below is ordered on it */
    DSV4_OPT_CUDA(cudaStreamCreateWithFlags(&o->stream, cudaStreamNonBlocking));
    /* weights: count, check, allocate, fill (not zeroed: every byte is written by the source) */
    opt_carver cv = {0};
    DSV4_TRY(weights_layout(o, src, &cv));
    o->w_bytes = cv.off;
    /* caches, then the pool sizes the scratch depends on (counting passes: the plan before any allocation) */
    cv = (opt_carver){0};
    state_layout(o, &cv);
    const size_t state_count = cv.off;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        if (o->layers[L].attn == DSV4_ATTN_CSA) o->pool_cap_csa = o->layers[L].pool_cap;
        if (o->layers[L].attn == DSV4_ATTN_HCA) o->pool_cap_hca = o->layers[L].pool_cap;
    }
    /* the step budget: rows of the scratch, of one indexer slab (its scores, and the fp32 indexer's per-head dots,
     * are the big buffers of a long prefill: a slab keeps them near OPT_SCORE_SLAB_BYTES), of one head block */
    o->Tm = o->opt.max_step_tokens > o->C ? o->opt.max_step_tokens : o->C;
    const size_t per_row = (size_t)(o->pool_cap_csa > 0 ? o->pool_cap_csa : 1) * 4 *
                           (o->opt.indexer == DSV4_OPT_INDEXER_FP32 ? 1 + (size_t)o->HI : 1);
    size_t slab = OPT_SCORE_SLAB_BYTES / per_row;
    if (slab < (size_t)o->C) slab = (size_t)o->C; /* a decode step is one slab, as before */
    o->idx_rows = slab < (size_t)o->Tm ? (int)slab : o->Tm;
    o->logit_rows = o->Tm > o->C && o->C < OPT_LOGIT_ROWS ? OPT_LOGIT_ROWS : o->C;
    o->kv_fresh_bytes = (size_t)2 * o->d;
    if (o->opt.kv == DSV4_OPT_KV_FP8 && (size_t)dsv4_kv8_entry_bytes(o->d, 2 * o->np) > o->kv_fresh_bytes)
        o->kv_fresh_bytes = (size_t)dsv4_kv8_entry_bytes(o->d, 2 * o->np);
    o->row0 = calloc((size_t)o->C, sizeof *o->row0);
    o->nrun = calloc((size_t)o->C, sizeof *o->nrun);
    o->step_n = calloc((size_t)o->C, sizeof *o->step_n);
    o->step_tok = calloc((size_t)o->C, sizeof *o->step_tok);
    if (!o->row0 || !o->nrun || !o->step_n || !o->step_tok)
        return dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory");
    o->ws_bytes = workspace_need(o);
    o->cublas_ws_bytes = (size_t)32 << 20;
    cv = (opt_carver){0};
    scratch_layout(o, &cv);
    if (o->opt.print_plan) {
        char b[7][32], lanes[160] = "";
        const int nl = o->opt.expert_lanes;
        if (grouped_experts(o) && nl > 1) /* what the lanes add */
            snprintf(lanes, sizeof lanes, "; %d expert lanes: %d more cuBLAS workspaces of %s%s", nl, nl - 1,
                     dsv4_mem_format((double)o->cublas_ws_bytes, b[6], 32),
                     o->wdq_slot ? ", a dequantised FP4 matrix each" : "");
        else if (grouped_experts(o))
            snprintf(lanes, sizeof lanes, "; one expert lane%s", o->wdq_slot ? " with a dequantised FP4 matrix" : "");
        fprintf(stderr, "%s: memory plan (rank %d of %d): weights %s, caches %s, scratch %s for steps of up to %d "
                "tokens over %d sequences (indexer scores in slabs of %d rows: %s; kernel workspace %s; the "
                "GEMMs of long runs %s%s%s)\n",
                src->what, o->rank, o->n_ranks, dsv4_mem_format((double)o->w_bytes, b[0], 32),
                dsv4_mem_format((double)state_count, b[1], 32), dsv4_mem_format((double)cv.off, b[2], 32), o->Tm,
                o->C, o->idx_rows, dsv4_mem_format((double)o->idx_rows * per_row, b[3], 32),
                dsv4_mem_format((double)o->ws_bytes, b[4], 32), dsv4_mem_format((double)o->ms_bytes, b[5], 32),
                o->wdq_elems && !o->wdq_slot ? " with one dequantised weight matrix" : "", lanes);
    }
    snprintf(what, sizeof what, "%s: weights", src->what);
    DSV4_TRY(dsv4_mem_check_device((double)o->w_bytes, what));
    DSV4_TRY(opt_dev_alloc(&o->w_mem, o->w_bytes, "weights"));
    cv = (opt_carver){.base = o->w_mem};
    DSV4_TRY(weights_layout(o, src, &cv));
    DSV4_TRY(arena(o, src, state_layout, &o->s_mem, &o->s_bytes, "caches"));
    /* scratch */
    DSV4_TRY(arena(o, src, scratch_layout, &o->x_mem, &o->x_bytes, "scratch"));
    o->h_probe_floats = (size_t)o->V;
    size_t more[] = {(size_t)o->n * o->D, (size_t)(o->pool_cap_csa > 0 ? o->pool_cap_csa : 1), (size_t)o->topk};
    for (int i = 0; i < 3; i++)
        if (more[i] > o->h_probe_floats) o->h_probe_floats = more[i];
    DSV4_OPT_CUDA(cudaMallocHost((void **)&o->h_probe, o->h_probe_floats * 4));
    DSV4_OPT_CUDA(cudaMallocHost((void **)&o->h_in, ((size_t)6 * o->Tm + 2 * (size_t)o->logit_rows) * 4));
    o->h_next = o->h_in + 6 * (size_t)o->Tm + o->logit_rows;
    if (o->ms_offset) DSV4_OPT_CUDA(cudaMallocHost((void **)&o->h_ms_offset, ((size_t)o->E + 1) * 4));
    if (o->follow) {
        const size_t nf = (size_t)o->Tm * f->num_hidden_layers * o->follow_stride;
        DSV4_OPT_CUDA(cudaMallocHost((void **)&o->h_follow, nf * sizeof *o->h_follow));
        memset(o->h_follow, 0, nf * sizeof *o->h_follow);
    }
    DSV4_OPT_CUBLAS(cublasCreate(&o->cublas));
    /* the stream once, then the workspace: cublasSetStream puts the handle back on cuBLAS's own workspace pool,
     * so a later call of it (once in every mHC pre) left this 32 MiB unused and made cuBLAS allocate its own */
    DSV4_OPT_CUBLAS(cublasSetStream(o->cublas, o->stream));
    DSV4_OPT_CUBLAS(cublasSetWorkspace(o->cublas, o->cublas_ws, o->cublas_ws_bytes));
    DSV4_TRY(lanes_init(o));
    DSV4_TRY(opt_state_reset(o, -1));
    /* the rows of a decode step until the first step sets them (dsv4_opt_time_indexer may run before one) */
    o->T = o->C;
    o->r_tok = o->d_in, o->r_pos = o->d_in + o->C, o->r_act = o->d_in + 2 * o->C;
    o->r_seq = o->d_in + 3 * o->C, o->r_off = o->d_in + 4 * o->C, o->r_len = o->d_in + 5 * o->C;
    for (int c = 0; c < o->C; c++) o->row0[c] = c, o->nrun[c] = 1;
    /* the loader's uploads ran on the legacy stream: finish everything before the first step */
    DSV4_OPT_CUDA(cudaDeviceSynchronize());
    return 0;
}
