/* ref_weights.c - where the CPU reference's f32 weights come from (docs/reference.md "Weights as on disk"): the
 * checkpoint stays mmapped in its own formats (FP8 e4m3 with block scales, FP4 e2m1 experts, bf16, f32) and each
 * tensor is dequantised to f32 into bounded scratch when it is used:
 * - a layer's dense tensors (DSV4_REF_LAYER_TENSORS) into one arena when the layer starts (dsv4_ref_weights_layer),
 *   once per forward call, whatever the number of tokens; the arena holds one layer at a time;
 * - a routed expert into an expert slot when a token routes to it (dsv4_ref_weights_expert; ref_forward.c runs the
 *   routed experts expert by expert, so each is dequantised once per call);
 * - the head into the same arena after the last layer (it is used only then), an embedding row per token.
 * An aligned F32 tensor is used straight from the mmap (no copy), as the loader serves it.
 * The up-front mode (dsv4_ref_options.weights UPFRONT) binds every layer at init from the loader's f32 cache
 * (dsv4_model_f32), as the reference did before issue 36: memory = the whole model in f32. It exists so the lazy
 * scheme can be held bitwise to it (tests/test_ref_lazy.c) and for small models run many times.
 *
 * Invariants that fail quietly:
 * - Both modes give the same f32 values: the loader's dequantisation (model/dtype.c) either way, and the bf16
 *   emulation rounds the same tensors (emu_rounds) after the same dequantisation.
 * - A lazy layer's views (c->lw[L]) are valid only while L is the loaded layer: loading another layer or the head
 *   sets them to NULL, so a stale use faults instead of reading another layer's weights.
 * - Every tensor is looked up and its size checked at init (the counting pass), so a missing or mis-shaped tensor
 *   fails there, never in the middle of a run; the arena is sized by the largest layer of that pass.
 * - The decode step allocates nothing: the arena, the expert slot and the row buffer are allocated at init.
 */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "ref_model.h"

enum { LOADED_NONE = -1, LOADED_HEAD = -2 };

/* ---------------------------------------------------------------------------------- bf16 emulation */
/* Does the emulation round this weight? Only those the optimized path holds in bf16 (`held`: the bf16 column of
 * DSV4_REF_LAYER_TENSORS, which ref-gpu's upload reads too; the routed experts, embed and head; not the mHC
 * weights, norms, sinks, ape biases, router bias or hc_head: fp32 there too), and of those not the FP8 e4m3 or FP4
 * (I8) ones on disk: the optimized path's default (auto) weights mode keeps those in their formats and its kernels
 * multiply by the exact dequantised values (qweight.cuh; with e8m0 scales they are exact in bf16 anyway). */
static int emu_rounds(int emu, int held, const dsv4_tensor *t)
{
    return emu && held && t->dtype != DSV4_DTYPE_F8_E4M3 && t->dtype != DSV4_DTYPE_I8;
}

/* ------------------------------------------------------------------------------------ binding */
/* One pass over a set of tensors: counting (bind 0: sizes only, every tensor looked up and checked) or binding
 * (views into the mmap, the loader's cache or `arena`). */
typedef struct wbind {
    dsv4_model *m;
    int emu;       /* the bf16 emulation: its tensors are rounded copies in the arena */
    int upfront;   /* the other copies come from the loader's f32 cache (dsv4_model_f32) */
    int bind;      /* 0: count only */
    float *arena;  /* bind: where copies go, [cap] floats */
    size_t cap;
    size_t off;    /* floats of the arena used (counted) */
    double loader; /* counting, upfront: floats the loader's cache will hold */
} wbind;

static int wbind_one(wbind *b, const float **out, size_t numel, int held, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* One weight: `held` 1 when the optimized path holds it in bf16 (emu_rounds). */
static int wbind_one(wbind *b, const float **out, size_t numel, int held, const char *fmt, ...)
{
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    *out = NULL;
    const dsv4_tensor *t;
    DSV4_TRY(dsv4_model_tensor(b->m, name, &t));
    if (dsv4_tensor_numel(t) != numel)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s has %zu elements, the reference expects %zu", t->file, name,
                          dsv4_tensor_numel(t), numel);
    const int round = emu_rounds(b->emu, held, t);
    if (!round && dsv4_tensor_f32_mapped(t)) {
        if (b->bind) *out = t->data;
        return 0;
    }
    if (!round && b->upfront) {
        if (!b->bind) {
            b->loader += (double)numel;
            return 0;
        }
        return dsv4_model_f32(b->m, name, numel, out);
    }
    size_t at = b->off;
    b->off = (b->off + numel + 15) & ~(size_t)15; /* 64-byte aligned views */
    if (!b->bind) return 0;
    if (b->off > b->cap) /* the counting pass sized the arena: only a model changed under us gets here */
        return dsv4_error(DSV4_ERR_USAGE, "reference: %s does not fit the weight arena (%zu of %zu floats)", name,
                          b->off, b->cap);
    float *dst = b->arena + at;
    DSV4_TRY(dsv4_model_read_f32(b->m, name, dst, numel));
    if (round) dsv4_ref_emu_round(dst, numel);
    *out = dst;
    return 0;
}

int dsv4_ref_layer_kind(const dsv4_config *f, int L, dsv4_ref_layer_w *w)
{
    w->attn = f->attn_type[L];
    w->mlp = f->mlp_type[L];
    w->ratio = w->attn == DSV4_ATTN_SLIDING ? 0 : f->compress_ratio[L];
    if (w->attn != DSV4_ATTN_SLIDING && w->ratio <= 0)
        return dsv4_error(DSV4_ERR_CONFIG, "layer %d: %s attention with compress ratio %d", L,
                          dsv4_attn_type_name(w->attn), w->ratio);
    return 0;
}

/* The dense tensors of layer L (w's kind set); with `experts`, every routed expert too (w->w1/w3/w2 [E] arrays). */
static int wbind_layer(wbind *b, const dsv4_config *f, int L, dsv4_ref_layer_w *w, int experts)
{
    size_t D = f->hidden_size, H = f->num_attention_heads, d = f->head_dim, qr = f->q_lora_rank;
    size_t G = f->o_groups, o_r = f->o_lora_rank, HI = f->index_n_heads, dI = f->index_head_dim;
    size_t E = f->n_routed_experts, NI = f->moe_intermediate_size;
    size_t n = f->hc_mult, mix = (2 + n) * n;
#define BIND_LISTED(field, numel, cond, bf16, name)                                                              \
    if (cond) DSV4_TRY(wbind_one(b, &w->field, (size_t)(numel), bf16, name, L));
    DSV4_REF_LAYER_TENSORS(BIND_LISTED)
#undef BIND_LISTED
    for (size_t e = 0; experts && e < E; e++) {
        DSV4_TRY(wbind_one(b, &w->w1[e], NI * D, 1, "layers.%d.ffn.experts.%zu.w1.weight", L, e));
        DSV4_TRY(wbind_one(b, &w->w3[e], NI * D, 1, "layers.%d.ffn.experts.%zu.w3.weight", L, e));
        DSV4_TRY(wbind_one(b, &w->w2[e], D * NI, 1, "layers.%d.ffn.experts.%zu.w2.weight", L, e));
    }
    return 0;
}

/* One routed expert into b (the expert slot): w [3] = w1, w3, w2. */
static int wbind_expert(wbind *b, const dsv4_config *f, int L, int e, const float **w)
{
    size_t D = f->hidden_size, NI = f->moe_intermediate_size;
    DSV4_TRY(wbind_one(b, &w[0], NI * D, 1, "layers.%d.ffn.experts.%d.w1.weight", L, e));
    DSV4_TRY(wbind_one(b, &w[1], NI * D, 1, "layers.%d.ffn.experts.%d.w3.weight", L, e));
    return wbind_one(b, &w[2], D * NI, 1, "layers.%d.ffn.experts.%d.w2.weight", L, e);
}

/* The global tensors other than embed and head: the final norm and hc_head. */
static int wbind_globals(wbind *b, const dsv4_config *f, const float **norm, const float **hc)
{
    size_t D = f->hidden_size, n = f->hc_mult;
    DSV4_TRY(wbind_one(b, norm, D, 0, "norm.weight"));
    DSV4_TRY(wbind_one(b, &hc[0], n * n * D, 0, "hc_head_fn"));
    DSV4_TRY(wbind_one(b, &hc[1], n, 0, "hc_head_base"));
    return wbind_one(b, &hc[2], 1, 0, "hc_head_scale");
}

/* The head's tensor: the embedding when the config ties them. */
static const char *head_name(const dsv4_config *f) { return f->tie_word_embeddings ? "embed.weight" : "head.weight"; }

/* ------------------------------------------------------------------------------------ measuring */
int dsv4_ref_weights_measure(dsv4_model *m, const dsv4_config *f, int emu, int upfront, dsv4_ref_weights_size *sz)
{
    memset(sz, 0, sizeof *sz);
    sz->layer_at = -1;
    size_t E = f->n_routed_experts, VD = (size_t)f->vocab_size * f->hidden_size;
    const float *scratch_views[3 * DSV4_MAX_EXPERTS];
    dsv4_ref_layer_w w;
    wbind all = {.m = m, .emu = emu, .upfront = upfront}; /* upfront: everything at once */
    for (int L = 0; L < f->num_hidden_layers; L++) {
        memset(&w, 0, sizeof w);
        DSV4_TRY(dsv4_ref_layer_kind(f, L, &w));
        w.w1 = scratch_views;
        w.w3 = scratch_views + E;
        w.w2 = scratch_views + 2 * E;
        wbind one = {.m = m, .emu = emu};
        DSV4_TRY(wbind_layer(&one, f, L, &w, 0));
        if ((double)one.off > sz->layer) {
            sz->layer = (double)one.off;
            sz->layer_at = L;
        }
        for (size_t e = 0; e < E; e++) {
            wbind ex = {.m = m, .emu = emu};
            DSV4_TRY(wbind_expert(&ex, f, L, (int)e, scratch_views));
            if ((double)ex.off > sz->expert) sz->expert = (double)ex.off;
        }
        DSV4_TRY(wbind_layer(&all, f, L, &w, 1));
    }
    const float *v, *hc[3];
    wbind g = {.m = m, .emu = emu};
    DSV4_TRY(wbind_globals(&g, f, &v, hc));
    sz->globals = (double)g.off;
    DSV4_TRY(wbind_globals(&all, f, &v, hc));
    wbind em = {.m = m, .emu = emu}, hd = {.m = m, .emu = emu};
    DSV4_TRY(wbind_one(&em, &v, VD, 1, "embed.weight"));
    DSV4_TRY(wbind_one(&hd, &v, VD, 1, "%s", head_name(f)));
    sz->embed_row = em.off ? (double)f->hidden_size : 0;
    sz->head = (double)hd.off;
    DSV4_TRY(wbind_one(&all, &v, VD, 1, "embed.weight"));
    if (!f->tie_word_embeddings) DSV4_TRY(wbind_one(&all, &v, VD, 1, "head.weight"));
    sz->upfront_arena = (double)all.off;
    sz->upfront_loader = all.loader;
    int n_hash = 0;
    for (int L = 0; L < f->num_hidden_layers; L++) n_hash += f->mlp_type[L] == DSV4_MLP_HASH_MOE;
    sz->tid2eid_bytes = (double)n_hash * f->vocab_size * f->num_experts_per_tok * sizeof(int32_t);
    return 0;
}

/* -------------------------------------------------------------------------------------- init */
/* The arena and the expert slot are rewritten every call: ask for 2 MiB pages (transparent huge pages, where the
 * kernel has them in madvise mode) so their first touch costs a fault per 2 MiB, not per 4 KiB (seconds for the 2
 * GiB arena of the full model in a VM). A hint: without it, or where it is refused, nothing changes but time. */
static void advise_huge(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = 2u << 20, a = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    const uintptr_t e = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

int dsv4_ref_weights_init(dsv4_ref_cpu *c, int upfront)
{
    const dsv4_config *f = &c->cfg;
    dsv4_ref_wstore *ws = &c->ws;
    ws->upfront = upfront;
    ws->loaded = LOADED_NONE;
    ws->expert_layer = ws->expert_id = -1;
    dsv4_ref_weights_size sz;
    DSV4_TRY(dsv4_ref_weights_measure(c->model, f, c->emu, upfront, &sz));
    size_t E = f->n_routed_experts, VD = (size_t)f->vocab_size * f->hidden_size;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        dsv4_ref_layer_w *w = &c->lw[L];
        DSV4_TRY(dsv4_ref_layer_kind(f, L, w));
        if (!upfront) continue;
        w->w1 = dsv4_ref_alloc(3 * E * sizeof(float *), "expert table");
        if (!w->w1) return DSV4_ERR_NOMEM;
        w->w3 = w->w1 + E;
        w->w2 = w->w1 + 2 * E;
    }
    const float *hc[3];
    if (upfront) { /* every weight now: the rounded copies (emulation) in one arena, the rest the loader's */
        ws->arena_floats = (size_t)sz.upfront_arena;
        ws->arena = dsv4_ref_alloc(ws->arena_floats * sizeof(float), "bf16-rounded weights (emulate bf16)");
        if (!ws->arena) return DSV4_ERR_NOMEM;
        wbind b = {.m = c->model, .emu = c->emu, .upfront = 1, .bind = 1, .arena = ws->arena,
                   .cap = ws->arena_floats};
        for (int L = 0; L < f->num_hidden_layers; L++) DSV4_TRY(wbind_layer(&b, f, L, &c->lw[L], 1));
        DSV4_TRY(wbind_globals(&b, f, &c->norm, hc));
        DSV4_TRY(wbind_one(&b, &c->embed, VD, 1, "embed.weight"));
        if (f->tie_word_embeddings) c->head = c->embed;
        else DSV4_TRY(wbind_one(&b, &c->head, VD, 1, "head.weight"));
    } else {
        /* the arena: the largest layer's dense tensors, or the head, whichever is larger (never both at once) */
        ws->arena_floats = (size_t)(sz.layer > sz.head ? sz.layer : sz.head);
        ws->expert_floats = (size_t)sz.expert;
        ws->globals = dsv4_ref_alloc(((size_t)sz.globals + (size_t)sz.embed_row + 16) * sizeof(float),
                                     "final norm, hc_head and an embedding row");
        ws->arena = dsv4_ref_alloc(ws->arena_floats * sizeof(float), "weights of one layer (f32)");
        ws->expert = dsv4_ref_alloc(ws->expert_floats * sizeof(float), "one routed expert (f32)");
        if (!ws->globals || !ws->arena || !ws->expert) return DSV4_ERR_NOMEM;
        advise_huge(ws->arena, ws->arena_floats * sizeof(float));
        advise_huge(ws->expert, ws->expert_floats * sizeof(float));
        wbind b = {.m = c->model, .emu = c->emu, .bind = 1, .arena = ws->globals, .cap = (size_t)sz.globals};
        DSV4_TRY(wbind_globals(&b, f, &c->norm, hc));
        ws->erow = ws->globals + b.off;
        /* embed and head served whole only from the mmap; else a row per token, the head when it is used */
        const dsv4_tensor *t;
        DSV4_TRY(dsv4_model_tensor(c->model, "embed.weight", &t));
        ws->embed_round = emu_rounds(c->emu, 1, t);
        if (!ws->embed_round && dsv4_tensor_f32_mapped(t)) c->embed = t->data;
        DSV4_TRY(dsv4_model_tensor(c->model, head_name(f), &t));
        if (!emu_rounds(c->emu, 1, t) && dsv4_tensor_f32_mapped(t)) c->head = t->data;
    }
    c->hc_head_fn = hc[0];
    c->hc_head_base = hc[1];
    c->hc_head_scale = hc[2];
    return 0;
}

void dsv4_ref_weights_free(dsv4_ref_cpu *c)
{
    if (c->lw)
        for (int L = 0; L < c->cfg.num_hidden_layers; L++) dsv4_ref_release((void *)c->lw[L].w1);
    dsv4_ref_release(c->ws.arena);
    dsv4_ref_release(c->ws.expert);
    dsv4_ref_release(c->ws.globals);
}

/* --------------------------------------------------------------------------------------- use */
/* Drop the views of whatever the arena held (a layer's): they would point at the next tenant's values. */
static void arena_evict(dsv4_ref_cpu *c)
{
    dsv4_ref_wstore *ws = &c->ws;
    if (ws->loaded >= 0) {
        dsv4_ref_layer_w *w = &c->lw[ws->loaded], keep = *w;
        memset(w, 0, sizeof *w);
        w->attn = keep.attn;
        w->mlp = keep.mlp;
        w->ratio = keep.ratio;
        w->tid2eid = keep.tid2eid;
    }
    ws->loaded = LOADED_NONE;
    ws->head = NULL;
}

int dsv4_ref_weights_layer(dsv4_ref_cpu *c, int L)
{
    dsv4_ref_wstore *ws = &c->ws;
    if (ws->upfront || ws->loaded == L) return 0;
    arena_evict(c);
    wbind b = {.m = c->model, .emu = c->emu, .bind = 1, .arena = ws->arena, .cap = ws->arena_floats};
    int rc = wbind_layer(&b, &c->cfg, L, &c->lw[L], 0);
    ws->loaded = L;
    ws->layer_loads++;
    if (rc) arena_evict(c);
    return rc;
}

int dsv4_ref_weights_expert(dsv4_ref_cpu *c, int L, int e, const float **w1, const float **w3, const float **w2)
{
    dsv4_ref_wstore *ws = &c->ws;
    if (ws->upfront) {
        *w1 = c->lw[L].w1[e];
        *w3 = c->lw[L].w3[e];
        *w2 = c->lw[L].w2[e];
        return 0;
    }
    if (ws->expert_layer != L || ws->expert_id != e) {
        ws->expert_layer = ws->expert_id = -1;
        wbind b = {.m = c->model, .emu = c->emu, .bind = 1, .arena = ws->expert, .cap = ws->expert_floats};
        DSV4_TRY(wbind_expert(&b, &c->cfg, L, e, ws->ew));
        ws->expert_layer = L;
        ws->expert_id = e;
        ws->expert_loads++;
    }
    *w1 = ws->ew[0];
    *w3 = ws->ew[1];
    *w2 = ws->ew[2];
    return 0;
}

int dsv4_ref_weights_embed(dsv4_ref_cpu *c, int32_t token, const float **row)
{
    const size_t D = c->cfg.hidden_size;
    if (c->embed) {
        *row = c->embed + (size_t)token * D;
        return 0;
    }
    *row = NULL;
    DSV4_TRY(dsv4_model_read_f32_rows(c->model, "embed.weight", token, 1, c->ws.erow));
    if (c->ws.embed_round) dsv4_ref_emu_round(c->ws.erow, D);
    *row = c->ws.erow;
    return 0;
}

int dsv4_ref_weights_head(dsv4_ref_cpu *c, const float **head)
{
    dsv4_ref_wstore *ws = &c->ws;
    if (c->head) {
        *head = c->head;
        return 0;
    }
    if (ws->loaded != LOADED_HEAD) {
        arena_evict(c);
        wbind b = {.m = c->model, .emu = c->emu, .bind = 1, .arena = ws->arena, .cap = ws->arena_floats};
        DSV4_TRY(wbind_one(&b, &ws->head, (size_t)c->cfg.vocab_size * c->cfg.hidden_size, 1, "%s",
                           head_name(&c->cfg)));
        ws->loaded = LOADED_HEAD;
    }
    *head = ws->head;
    return 0;
}
