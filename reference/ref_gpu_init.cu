/* ref_gpu_init.cu - setting up the GPU fp32 reference (ref_gpu.cu): the weights mode (dsv4_ref_gpu_plan decides:
 * resident or streamed), the resident weights uploaded once from the loader's f32 view into one device arena (two
 * passes over the same binding code: count, then carve and copy; streamed: only the final norm and hc_head, the rest
 * is ref_gpu_stream.cu's), the decode state (window rings, compressor states, pools) sized by max_tokens, and the
 * scratch of one call (ref_gpu_layout.c's layout, which the plan sizes).
 *
 * The bf16 emulation's weights (options.emulate BF16) are rounded in the host staging on their way up, so the arena
 * holds only them, as the CPU emulation's emu_weights rounds its copies: the bf16 column of DSV4_REF_LAYER_TENSORS,
 * the routed experts, the embedding and the head; a tensor stored FP8 e4m3 or FP4 on disk is left as dequantised
 * (the optimized path multiplies by those exact values). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_gpu_model.cuh"

/* ------------------------------------------------------------------------------------ weight upload */
/* Two passes over the same binding code: count (arena NULL) sizes the arena, upload carves and copies. */
typedef struct binder {
    dsv4_model *m;
    int emu;            /* 1: round the bf16-held weights (emulate bf16) */
    float *arena;       /* NULL: counting pass */
    size_t off;         /* floats */
    float *staging;     /* host, [staging_cap] */
    size_t staging_cap;
    size_t max_numel;
} binder;

int ref_gpu_alloc(dsv4_ref_gpu *g, void **p, size_t bytes, const char *what)
{
    int rc = dsv4_mem_check_device((double)bytes, what);
    if (rc) return rc;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return dsv4_mem_device_alloc_failed((double)bytes, what, cudaGetErrorString(e));
    }
    g->stats.gpu_alloc += (double)bytes;
    return 0;
}

/* Is the tensor `name` one the emulation rounds? bf16: the optimized path holds it in bf16; unless it is FP8 e4m3 or
 * FP4 on disk (ref_model.c emu_weight's rule). */
static int emu_rounds(const binder *b, int bf16, const char *name)
{
    if (!b->emu || !bf16) return 0;
    const dsv4_tensor *t = NULL;
    return !(!dsv4_model_tensor(b->m, name, &t) && (t->dtype == DSV4_DTYPE_F8_E4M3 || t->dtype == DSV4_DTYPE_I8));
}

static int bind(binder *b, float **out, size_t numel, int bf16, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int bind(binder *b, float **out, size_t numel, int bf16, const char *fmt, ...)
{
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (numel > b->max_numel) b->max_numel = numel;
    size_t at = b->off;
    b->off = (b->off + numel + 63) & ~(size_t)63; /* 256-byte aligned views */
    if (!b->arena) {
        *out = NULL;
        return 0;
    }
    *out = b->arena + at;
    int rc = dsv4_model_read_f32(b->m, name, b->staging, numel);
    if (rc) return rc;
    if (emu_rounds(b, bf16, name)) dsv4_ref_emu_round(b->staging, numel);
    DSV4_REF_CUDA_CHECK(cudaMemcpy(*out, b->staging, numel * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

/* BIND(dst, numel, bf16, name format, ...): bf16 = 1 for a weight the optimized path holds in bf16. */
#define BIND(dst, numel, bf16, ...)                                                                              \
    do {                                                                                                         \
        int rc_ = bind(b, &(dst), (size_t)(numel), (bf16), __VA_ARGS__);                                         \
        if (rc_) return rc_;                                                                                     \
    } while (0)

/* The kind of every layer (attention, MLP, compress ratio): both modes, before the state is laid out. */
static int layer_kinds(dsv4_ref_gpu *g)
{
    const dsv4_config *f = &g->cfg;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        gpu_layer *w = &g->lw[L];
        w->attn = f->attn_type[L];
        w->mlp = f->mlp_type[L];
        w->ratio = w->attn == DSV4_ATTN_SLIDING ? 0 : f->compress_ratio[L];
        if (w->attn != DSV4_ATTN_SLIDING && w->ratio <= 0)
            return dsv4_error(DSV4_ERR_CONFIG, "layer %d: %s attention with compress ratio %d", L,
                              dsv4_attn_type_name(w->attn), w->ratio);
    }
    return 0;
}

static int bind_layer(dsv4_ref_gpu *g, binder *b, int L)
{
    const dsv4_config *f = &g->cfg;
    gpu_layer *w = &g->lw[L];
    size_t D = f->hidden_size, H = f->num_attention_heads, d = f->head_dim, qr = f->q_lora_rank, n = f->hc_mult;
    size_t G = f->o_groups, o_r = f->o_lora_rank, HI = f->index_n_heads, dI = f->index_head_dim;
    size_t E = f->n_routed_experts, NI = f->moe_intermediate_size, mix = (2 + n) * n;
#define BIND_LISTED(field, numel, cond, bf16, name)                                                              \
    if (cond) BIND(w->field, numel, bf16, name, L);
    DSV4_REF_LAYER_TENSORS(BIND_LISTED)
#undef BIND_LISTED
    if (!w->w1) {
        w->w1 = (float **)dsv4_ref_alloc(3 * E * sizeof(float *), "ref-gpu expert table");
        if (!w->w1) return DSV4_ERR_NOMEM;
        w->w3 = w->w1 + E;
        w->w2 = w->w1 + 2 * E;
    }
    for (size_t e = 0; e < E; e++) {
        BIND(w->w1[e], NI * D, 1, "layers.%d.ffn.experts.%zu.w1.weight", L, e);
        BIND(w->w3[e], NI * D, 1, "layers.%d.ffn.experts.%zu.w3.weight", L, e);
        BIND(w->w2[e], D * NI, 1, "layers.%d.ffn.experts.%zu.w2.weight", L, e);
    }
    return 0;
}

/* Every weight (resident), or only the final norm and hc_head (streamed: the rest travels a part at a time). */
static int bind_all(dsv4_ref_gpu *g, binder *b)
{
    const dsv4_config *f = &g->cfg;
    size_t D = f->hidden_size, V = f->vocab_size, n = f->hc_mult;
    if (!g->streamed) {
        BIND(g->embed, V * D, 1, "embed.weight");
        if (f->tie_word_embeddings) g->head = g->embed;
        else BIND(g->head, V * D, 1, "head.weight");
    }
    BIND(g->norm, D, 0, "norm.weight");
    BIND(g->hc_head_fn, n * n * D, 0, "hc_head_fn");
    BIND(g->hc_head_base, n, 0, "hc_head_base");
    BIND(g->hc_head_scale, 1, 0, "hc_head_scale");
    for (int L = 0; L < f->num_hidden_layers && !g->streamed; L++) {
        int rc = bind_layer(g, b, L);
        if (rc) return rc;
    }
    return 0;
}
#undef BIND

/* tid2eid of every hash layer into the int arena, range-checked. */
static int upload_tid2eid(dsv4_ref_gpu *g, dsv4_model *m)
{
    const dsv4_config *f = &g->cfg;
    size_t V = f->vocab_size, k = f->num_experts_per_tok, E = f->n_routed_experts;
    int n_hash = 0;
    for (int L = 0; L < f->num_hidden_layers; L++) n_hash += g->lw[L].mlp == DSV4_MLP_HASH_MOE;
    if (!n_hash) return 0;
    int arc = ref_gpu_alloc(g, (void **)&g->i_arena, (size_t)n_hash * V * k * sizeof(int32_t),
                            "ref-gpu tid2eid tables");
    if (arc) return arc;
    int32_t *h = (int32_t *)dsv4_ref_alloc(V * k * sizeof(int32_t), "ref-gpu tid2eid staging");
    if (!h) return DSV4_ERR_NOMEM;
    int rc = 0, i = 0;
    for (int L = 0; L < f->num_hidden_layers && !rc; L++) {
        if (g->lw[L].mlp != DSV4_MLP_HASH_MOE) continue;
        char name[96];
        snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", L);
        if ((rc = dsv4_model_read_i32(m, name, h, V * k))) break;
        for (size_t t = 0; t < V * k && !rc; t++)
            if (h[t] < 0 || (size_t)h[t] >= E)
                rc = dsv4_error(DSV4_ERR_FORMAT, "%s: token %zu maps to expert %d, outside [0, %zu)", name, t / k,
                                h[t], E);
        if (rc) break;
        g->lw[L].tid2eid = g->i_arena + (size_t)i++ * V * k;
        cudaError_t e = cudaMemcpy(g->lw[L].tid2eid, h, V * k * sizeof(int32_t), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = dsv4_ref_gpu_cuda_fail(e, "cudaMemcpy(tid2eid)", __FILE__, __LINE__);
    }
    dsv4_ref_release(h);
    return rc;
}

/* ------------------------------------------------------------------------------------ state, scratch */
static size_t layout_state(dsv4_ref_gpu *g, int max_tokens, float *mem, int *rc)
{
    const dsv4_config *f = &g->cfg;
    size_t off = 0, d = f->head_dim, dI = f->index_head_dim;
    g->m_max = f->sliding_window;
    g->pool_cap_max = 1;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        gpu_layer *w = &g->lw[L];
        int csa = w->attn == DSV4_ATTN_CSA;
        if (mem) w->win = mem + off;
        off += (size_t)f->sliding_window * d;
        if (w->ratio <= 0) continue;
        w->pool_cap = max_tokens / w->ratio;
        if (mem) w->pool = mem + off;
        off += (size_t)w->pool_cap * d;
        if (mem && !*rc) *rc = dsv4_ref_gpu_compressor_init(&w->cmp, w->ratio, (int)d, csa, mem + off);
        off += dsv4_ref_compressor_state_floats(w->ratio, (int)d, csa);
        int extra = csa ? (g->topk < w->pool_cap ? g->topk : w->pool_cap) : w->pool_cap;
        if (f->sliding_window + extra > g->m_max) g->m_max = f->sliding_window + extra;
        if (!csa) continue;
        if (w->pool_cap > g->pool_cap_max) g->pool_cap_max = w->pool_cap;
        if (mem) w->ipool = mem + off;
        off += (size_t)w->pool_cap * dI;
        if (mem && !*rc) *rc = dsv4_ref_gpu_compressor_init(&w->icmp, w->ratio, (int)dI, 1, mem + off);
        off += dsv4_ref_compressor_state_floats(w->ratio, (int)dI, 1);
    }
    return off;
}

/* Replay: what the dump shows (own_pool / own_ipool of every compress layer, one device allocation), the
 * candidate's entries until the reference judges one (ref_replay.c). */
static int replay_own_init(dsv4_ref_gpu *g)
{
    const dsv4_config *f = &g->cfg;
    const size_t d = f->head_dim, dI = f->index_head_dim;
    size_t total = 0;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        const gpu_layer *w = &g->lw[L];
        if (w->ratio > 0) total += (size_t)w->pool_cap * (d + (w->attn == DSV4_ATTN_CSA ? dI : 0));
    }
    if (!total) return 0;
    DSV4_TRY(ref_gpu_alloc(g, (void **)&g->own_mem, total * sizeof(float), "ref-gpu replay entries"));
    size_t off = 0;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        gpu_layer *w = &g->lw[L];
        if (w->ratio <= 0) continue;
        const int csa = w->attn == DSV4_ATTN_CSA;
        for (int which = 0; which < 1 + csa; which++) {
            const dsv4_ref_replay_kind kind = which ? DSV4_REF_REPLAY_IDX : DSV4_REF_REPLAY_CMP;
            const size_t width = which ? dI : d;
            float *own = g->own_mem + off;
            off += (size_t)w->pool_cap * width;
            if (which) w->own_ipool = own;
            else w->own_pool = own;
            const int64_t n = dsv4_ref_replay_rows(g->replay, kind, L);
            if (n > w->pool_cap)
                return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: the replayed candidate has %lld entries at layer %d, the "
                                  "pool holds %d (max_tokens must be the candidate's token count)", (long long)n, L,
                                  w->pool_cap);
            if (n > 0)
                DSV4_REF_CUDA_CHECK(cudaMemcpy(own, dsv4_ref_replay_rows_at(g->replay, kind, L, 0, (int)n),
                                               (size_t)n * width * sizeof(float), cudaMemcpyHostToDevice));
        }
    }
    return 0;
}

int ref_gpu_init_model(dsv4_model *m, int max_tokens, const dsv4_ref_options *o, dsv4_ref_gpu *g)
{
    g->model = m;
    g->cfg = *dsv4_model_config(m);
    const dsv4_config *f = &g->cfg;
    DSV4_TRY(dsv4_ref_check_config(f, max_tokens));
    g->emu = o->emulate == DSV4_REF_EMULATE_BF16;
    g->follow = o->follow;
    g->replay = o->replay;
    g->follow_stop = -1;
    g->fstats.stopped_at = -1;
    g->layer_progress = o->layer_progress;
    g->progress_ctx = o->progress_ctx;
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev < 1)
        return dsv4_error(DSV4_ERR_CUDA, "ref-gpu: no CUDA device (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    size_t total_b = 0;
    DSV4_REF_CUDA_CHECK(cudaFree(0)); /* the context first: what the reference takes is measured from here */
    DSV4_REF_CUDA_CHECK(cudaMemGetInfo(&g->free0, &total_b));
    g->stats.gpu_base = (double)(total_b - g->free0);
    dsv4_ref_plan plan; /* resident or streamed, and the memory checked, before anything is allocated */
    DSV4_TRY(dsv4_ref_gpu_plan(m, max_tokens, o, &plan));
    g->streamed = plan.streamed;
    DSV4_TRY(dsv4_ref_gpu_blas_init(&g->blas));
    dsv4_ref_gpu_dims dm;
    dsv4_ref_gpu_dims_of(f, max_tokens, &dm);
    g->n_pairs = dm.n_pairs;
    g->topk = dm.topk;
    g->chunk = dm.chunk;

    /* RoPE inverse frequencies from the CPU's formula */
    float inv[2 * 512];
    if (g->n_pairs > 512) return dsv4_error(DSV4_ERR_UNSUPPORTED, "ref-gpu: %d rope pairs", g->n_pairs);
    dsv4_rope_inv_freq(&f->rope_main, f->qk_rope_head_dim, inv);
    dsv4_rope_inv_freq(&f->rope_compress, f->qk_rope_head_dim, inv + g->n_pairs);
    DSV4_TRY(ref_gpu_alloc(g, (void **)&g->inv_main, 2 * (size_t)(g->n_pairs + 1) * sizeof(float),
                           "ref-gpu rope tables"));
    g->inv_cmp = g->inv_main + g->n_pairs;
    DSV4_REF_CUDA_CHECK(cudaMemcpy(g->inv_main, inv, 2 * (size_t)g->n_pairs * sizeof(float), cudaMemcpyHostToDevice));

    /* weights: count, allocate, upload */
    g->lw = (gpu_layer *)dsv4_ref_alloc((size_t)f->num_hidden_layers * sizeof *g->lw, "ref-gpu layers");
    if (!g->lw) return DSV4_ERR_NOMEM;
    DSV4_TRY(layer_kinds(g));
    binder b;
    memset(&b, 0, sizeof b);
    b.m = m;
    b.emu = g->emu;
    DSV4_TRY(bind_all(g, &b));
    DSV4_TRY(ref_gpu_alloc(g, (void **)&g->w_arena, b.off * sizeof(float), "ref-gpu weights (f32)"));
    size_t total = b.off;
    b.arena = g->w_arena;
    b.off = 0;
    b.staging_cap = b.max_numel;
    DSV4_REF_CUDA_CHECK(cudaMallocHost((void **)&b.staging, b.staging_cap * sizeof(float)));
    int rc = bind_all(g, &b);
    cudaFreeHost(b.staging);
    if (rc) return rc;
    if (b.off != total) return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: weight arena %zu != %zu floats", b.off, total);
    DSV4_TRY(upload_tid2eid(g, m));
    if (g->streamed) DSV4_TRY(ref_gpu_stream_init(g, max_tokens));

    /* decode state sized by max_tokens */
    rc = 0;
    size_t st = layout_state(g, max_tokens, NULL, &rc);
    DSV4_TRY(ref_gpu_alloc(g, (void **)&g->state_mem, st * sizeof(float), "ref-gpu decode state"));
    DSV4_REF_CUDA_CHECK(cudaMemset(g->state_mem, 0, st * sizeof(float)));
    layout_state(g, max_tokens, g->state_mem, &rc);
    if (rc) return rc;
    DSV4_TRY(dsv4_ref_gpu_attention_prepare(g->m_max, f->head_dim, g->topk));
    if (g->replay) DSV4_TRY(replay_own_init(g));

    /* scratch of one call of up to chunk tokens (the plan's layout) */
    if (dm.pool_cap_max != g->pool_cap_max)
        return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: pool capacity %d, the layout says %d", g->pool_cap_max,
                          dm.pool_cap_max);
    g->iq = dm.iq;
    size_t scr = dsv4_ref_gpu_scratch_layout(f, &dm, &g->sc, NULL);
    DSV4_TRY(ref_gpu_alloc(g, (void **)&g->scratch_mem, scr * sizeof(float), "ref-gpu scratch"));
    dsv4_ref_gpu_scratch_layout(f, &dm, &g->sc, g->scratch_mem);

    /* host staging: the widest probe rows of a chunk, or a block of logits rows */
    size_t row = (size_t)f->hc_mult * f->hidden_size;
    if ((size_t)g->pool_cap_max > row) row = g->pool_cap_max;
    if ((size_t)g->topk > row) row = g->topk;
    g->host_floats = (size_t)g->chunk * row;
    if ((size_t)LOGIT_ROWS * f->vocab_size > g->host_floats) g->host_floats = (size_t)LOGIT_ROWS * f->vocab_size;
    g->host = (float *)dsv4_ref_alloc(g->host_floats * sizeof(float), "ref-gpu probe staging");
    size_t nk = (size_t)g->chunk * f->num_experts_per_tok;
    g->h_rids = (int32_t *)dsv4_ref_alloc((4 * nk + 3 * (size_t)f->n_routed_experts) * sizeof(int32_t),
                                          "ref-gpu moe grouping");
    if (!g->host || !g->h_rids) return DSV4_ERR_NOMEM;
    g->h_row_tok = g->h_rids + nk;
    g->h_slot_of = g->h_row_tok + nk;
    g->h_pair_of = g->h_slot_of + nk;
    g->h_count = g->h_pair_of + nk;
    g->h_ex = g->h_count + 2 * (size_t)f->n_routed_experts;
    for (size_t i = 0; i < nk; i++) g->h_pair_of[i] = (int32_t)i; /* sc.ident: 0, 1, 2, ... */
    DSV4_REF_CUDA_CHECK(cudaMemcpy(g->sc.ident, g->h_pair_of, nk * sizeof(int32_t), cudaMemcpyHostToDevice));
    if (g->follow || g->replay) { /* following's (and replay's) host rows: a call's picks, the merge's scratch, the
                                   * merged router rows */
        size_t tk = (size_t)g->topk, k = (size_t)f->num_experts_per_tok, mk = tk > k ? tk : k;
        g->h_ftopk = (int32_t *)dsv4_ref_alloc(((size_t)g->chunk * tk + 4 * mk + (size_t)g->chunk) * sizeof(int32_t),
                                               "ref-gpu following rows");
        if (!g->h_ftopk) return DSV4_ERR_NOMEM;
        g->h_fmerge = g->h_ftopk + (size_t)g->chunk * tk;
        g->h_rflag = g->h_fmerge + 4 * mk;
    }
    DSV4_REF_CUDA_CHECK(cudaDeviceSynchronize());
    size_t fr = 0;
    DSV4_REF_CUDA_CHECK(cudaMemGetInfo(&fr, &total_b));
    g->stats.gpu_init = g->free0 > fr ? (double)(g->free0 - fr) : 0.0;
    g->stats.gpu_peak = g->stats.gpu_init;
    return 0;
}
