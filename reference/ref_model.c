/* ref_model.c - the reference object (model-spec §4, §12): binding the weights of every layer by their
 * canonical names, the decode state (window rings, compressor states, compressed pools, indexer key pools)
 * sized by max_tokens, the preallocated decode scratch, and the device-neutral public API of dsv4_ref.h.
 *
 * Invariants that fail quietly:
 * - The state is sized by max_tokens (given at init), never by max_position_embeddings: a ring of
 *   sliding_window rows, max_tokens div r entries per compressed pool.
 * - Every tensor is looked up and size-checked at init; the weights themselves are dequantised when used into
 *   buffers allocated here (ref_weights.c), so the decode step allocates nothing (the loader is only asked to
 *   dequantise into them, never to allocate).
 * - prefill is only valid as the first call; decode may also start at position 0 (token-by-token prompt).
 * - Sizes come from the config: the plan (ref_plan.c) bounds them (in double) against the host before anything is
 *   allocated.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_opt.h"
#include "ref_fault.h"
#include "ref_model.h"

/* ------------------------------------------------------------------------------------- allocation */
static long dsv4_ref_allocs;

void *dsv4_ref_alloc(size_t nbytes, const char *what)
{
    char buf[128];
    snprintf(buf, sizeof buf, "reference: %s", what);
    if (dsv4_mem_check_host((double)nbytes, buf)) return NULL; /* the message says how much */
    void *p = calloc(1, nbytes ? nbytes : 1);
    if (!p) {
        dsv4_error(DSV4_ERR_NOMEM, "reference: cannot allocate %zu bytes for %s", nbytes, what);
        return NULL;
    }
    __atomic_add_fetch(&dsv4_ref_allocs, 1, __ATOMIC_RELAXED);
    return p;
}

void dsv4_ref_release(void *p) { free(p); }

long dsv4_ref_alloc_count(void) { return __atomic_load_n(&dsv4_ref_allocs, __ATOMIC_RELAXED); }

/* ------------------------------------------------------------------------------------- tid2eid */
/* The hash layers' token -> expert tables, read once (int32, range-checked): small, and used by every token. */
static int bind_tid2eid(dsv4_ref_cpu *c, int L)
{
    const dsv4_config *f = &c->cfg;
    dsv4_ref_layer_w *w = &c->lw[L];
    size_t V = f->vocab_size, k = f->num_experts_per_tok, E = f->n_routed_experts;
    if (w->mlp != DSV4_MLP_HASH_MOE) return 0;
    w->tid2eid = dsv4_ref_alloc(V * k * sizeof(int32_t), "tid2eid");
    if (!w->tid2eid) return DSV4_ERR_NOMEM;
    char name[96];
    snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", L);
    DSV4_TRY(dsv4_model_read_i32(c->model, name, w->tid2eid, V * k));
    for (size_t i = 0; i < V * k; i++)
        if (w->tid2eid[i] < 0 || (size_t)w->tid2eid[i] >= E)
            return dsv4_error(DSV4_ERR_FORMAT, "%s: token %zu maps to expert %d, outside [0, %zu)", name, i / k,
                              w->tid2eid[i], E);
    return 0;
}

int dsv4_ref_check_config(const dsv4_config *f, int max_tokens)
{
    DSV4_CHECK(max_tokens >= 1, "reference: max_tokens %d must be >= 1", max_tokens);
    if (f->num_key_value_heads != 1)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "reference: num_key_value_heads %d (only 1, shared K=V)",
                          f->num_key_value_heads);
    if (f->num_hidden_layers < 1 || f->num_hidden_layers > DSV4_MAX_LAYERS)
        return dsv4_error(DSV4_ERR_CONFIG, "reference: num_hidden_layers %d", f->num_hidden_layers);
    if (f->hc_mult < 1 || f->hc_mult > 16)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "reference: hc_mult %d outside [1, 16]", f->hc_mult);
    if (f->o_groups < 1 || f->num_attention_heads % f->o_groups)
        return dsv4_error(DSV4_ERR_CONFIG, "reference: %d heads not divisible by o_groups %d",
                          f->num_attention_heads, f->o_groups);
    int rd = f->qk_rope_head_dim;
    if (rd < 0 || rd % 2 || rd > f->head_dim || rd > f->index_head_dim)
        return dsv4_error(DSV4_ERR_CONFIG, "reference: qk_rope_head_dim %d must be even and <= head_dim %d and "
                          "index_head_dim %d", rd, f->head_dim, f->index_head_dim);
    if (f->sliding_window < 1)
        return dsv4_error(DSV4_ERR_CONFIG, "reference: sliding_window %d", f->sliding_window);
    if (f->num_experts_per_tok < 1 || f->num_experts_per_tok > f->n_routed_experts)
        return dsv4_error(DSV4_ERR_CONFIG, "reference: num_experts_per_tok %d of %d experts",
                          f->num_experts_per_tok, f->n_routed_experts);
    if (strcmp(f->scoring_func, "sqrtsoftplus") != 0)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "reference: scoring_func '%s' (only sqrtsoftplus)",
                          f->scoring_func);
    return 0;
}

/* Carve every layer's state from one arena (mem == NULL: count only). */
static size_t layout_state(dsv4_ref_cpu *c, int max_tokens, float *mem)
{
    const dsv4_config *f = &c->cfg;
    size_t off = 0, d = f->head_dim, dI = f->index_head_dim;
    c->m_max = f->sliding_window;
    c->pool_cap_max = 1;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        dsv4_ref_layer_state *s = &c->ls[L];
        const dsv4_ref_layer_w *w = &c->lw[L];
        int csa = w->attn == DSV4_ATTN_CSA;
        if (mem) s->win = mem + off;
        off += (size_t)f->sliding_window * d;
        if (w->ratio <= 0) continue;
        s->pool_cap = max_tokens / w->ratio;
        if (mem) s->pool = mem + off;
        off += (size_t)s->pool_cap * d;
        if (c->replay) {
            if (mem) s->own_pool = mem + off;
            off += (size_t)s->pool_cap * d;
        }
        size_t n = dsv4_ref_compressor_state_floats(w->ratio, (int)d, csa);
        if (mem) dsv4_ref_compressor_init(&s->cmp, w->ratio, (int)d, csa, mem + off);
        off += n;
        int extra = csa ? (f->index_topk < s->pool_cap ? f->index_topk : s->pool_cap) : s->pool_cap;
        if (f->sliding_window + extra > c->m_max) c->m_max = f->sliding_window + extra;
        if (!csa) continue;
        if (s->pool_cap > c->pool_cap_max) c->pool_cap_max = s->pool_cap;
        if (mem) s->ipool = mem + off;
        off += (size_t)s->pool_cap * dI;
        if (c->replay) {
            if (mem) s->own_ipool = mem + off;
            off += (size_t)s->pool_cap * dI;
        }
        n = dsv4_ref_compressor_state_floats(w->ratio, (int)dI, 1);
        if (mem) dsv4_ref_compressor_init(&s->icmp, w->ratio, (int)dI, 1, mem + off);
        off += n;
    }
    return off;
}

size_t dsv4_ref_scratch_layout(const dsv4_ref_cpu *c, int S, dsv4_ref_scratch *sc, float *mem)
{
    const dsv4_config *f = &c->cfg;
    size_t off = 0;
    size_t n = f->hc_mult, D = f->hidden_size, H = f->num_attention_heads, d = f->head_dim;
    size_t HI = f->index_n_heads, dI = f->index_head_dim, E = f->n_routed_experts, k = f->num_experts_per_tok;
    size_t NI = f->moe_intermediate_size, np = c->n_pairs, s = (size_t)S;
    size_t topk = f->index_topk > 0 ? f->index_topk : 1;
#define CARVE(field, count)                                                                                      \
    do {                                                                                                         \
        if (mem) sc->field = (void *)(mem + off);                                                                \
        off += (size_t)(count);                                                                                  \
        off = (off + 15) & ~(size_t)15; /* 64-byte aligned views */                                              \
    } while (0)
    CARVE(X, s * n * D);
    CARVE(X2, s * n * D);
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
    CARVE(cos_e, np);
    CARVE(sin_e, np);
    CARVE(entry, d > dI ? d : dI);
    CARVE(gather, (size_t)c->m_max * d);
    CARVE(scores, H * c->m_max);
    CARVE(iscore, c->pool_cap_max);
    CARVE(idots, HI * c->pool_cap_max);
    CARVE(topk, s * topk);
    CARVE(n_topk, s);
    CARVE(rlogits, s * E);
    CARVE(rids, s * k);
    CARVE(rw, s * k);
    CARVE(rs, E);
    CARVE(eg, s * NI);
    CARVE(eu, s * NI);
    CARVE(eys, s * k * D);
    CARVE(fout, s * D);
    CARVE(vn, n * D);
    CARVE(mix, (2 + n) * n);
    CARVE(y, D);
    CARVE(logits, f->vocab_size);
    CARVE(fmerge, 4 * (topk > k ? topk : k));
#undef CARVE
    if (mem) sc->S = S;
    return off;
}

/* ------------------------------------------------------------------------------------ cpu vtable */
static void cpu_free(void *impl)
{
    dsv4_ref_cpu *c = impl;
    if (!c) return;
    dsv4_ref_weights_free(c);
    if (c->lw)
        for (int L = 0; L < c->cfg.num_hidden_layers; L++) dsv4_ref_release(c->lw[L].tid2eid);
    dsv4_ref_release(c->lw);
    dsv4_ref_release(c->ls);
    dsv4_ref_release(c->inv_main);
    dsv4_ref_release(c->state_mem);
    dsv4_ref_release(c->step_mem);
    dsv4_ref_release(c);
}

static int cpu_forward(dsv4_ref *r, const int32_t *tokens, int n, dsv4_probe_sink *probe, float *logits_last)
{
    dsv4_ref_cpu *c = r->impl;
    if (n == 1) return dsv4_ref_cpu_forward_scratch(c, &c->step, r->pos, tokens, n, probe, logits_last);
    dsv4_ref_scratch sc;
    size_t need = dsv4_ref_scratch_layout(c, n, &sc, NULL);
    float *mem = dsv4_ref_alloc(need * sizeof(float), "prefill scratch");
    if (!mem) return DSV4_ERR_NOMEM;
    dsv4_ref_scratch_layout(c, n, &sc, mem);
    int rc = dsv4_ref_cpu_forward_scratch(c, &sc, r->pos, tokens, n, probe, logits_last);
    dsv4_ref_release(mem);
    return rc;
}

static int cpu_dump_entries(dsv4_ref *r, dsv4_probe_sink *probe)
{
    dsv4_ref_cpu *c = r->impl;
    for (int L = 0; L < c->cfg.num_hidden_layers; L++) {
        const dsv4_ref_layer_state *s = &c->ls[L];
        /* replay: what own_pool shows (the judged entries made here, the candidate's elsewhere), every entry */
        const int n_cmp = c->replay ? (int)dsv4_ref_replay_rows(c->replay, DSV4_REF_REPLAY_CMP, L) : s->n_entries;
        const int n_idx = c->replay ? (int)dsv4_ref_replay_rows(c->replay, DSV4_REF_REPLAY_IDX, L) : s->n_ientries;
        if (c->lw[L].ratio <= 0 || n_cmp == 0) continue;
        int rc = dsv4_probe_entries(probe, L, "compressed_kv", c->replay ? s->own_pool : s->pool, n_cmp,
                                    c->cfg.head_dim);
        if (rc) return rc;
        if (c->lw[L].attn != DSV4_ATTN_CSA || n_idx == 0) continue;
        rc = dsv4_probe_entries(probe, L, "indexer_kv", c->replay ? s->own_ipool : s->ipool, n_idx,
                                c->cfg.index_head_dim);
        if (rc) return rc;
    }
    return 0;
}

/* Replay: rows [0, n) of the candidate's entries of kind at layer L into dst (width d). */
static void replay_entries_to(const dsv4_ref_replay *rp, dsv4_ref_replay_kind kind, int L, float *dst, int64_t n,
                              size_t d)
{
    if (n > 0) memcpy(dst, dsv4_ref_replay_rows_at(rp, kind, L, 0, (int)n), (size_t)n * d * sizeof(float));
}

static int cpu_replay_seek(dsv4_ref *r, int first)
{
    dsv4_ref_cpu *c = r->impl;
    for (int L = 0; L < c->cfg.num_hidden_layers; L++) {
        dsv4_ref_layer_state *s = &c->ls[L];
        const int ratio = c->lw[L].ratio;
        if (ratio <= 0) continue;
        s->n_entries = first / ratio;
        replay_entries_to(c->replay, DSV4_REF_REPLAY_CMP, L, s->pool, s->n_entries, c->cfg.head_dim);
        if (c->lw[L].attn != DSV4_ATTN_CSA) continue;
        s->n_ientries = first / ratio;
        replay_entries_to(c->replay, DSV4_REF_REPLAY_IDX, L, s->ipool, s->n_ientries, c->cfg.index_head_dim);
    }
    return 0;
}

static void cpu_follow_stats(const dsv4_ref *r, dsv4_ref_follow_stats *s)
{
    *s = ((const dsv4_ref_cpu *)r->impl)->fstats;
}

static const dsv4_ref_vtable dsv4_ref_cpu_vtable = {
    .producer = "dsv4 " DSV4_VERSION " reference cpu fp32",
    .forward = cpu_forward,
    .dump_entries = cpu_dump_entries,
    .free_impl = cpu_free,
    .follow_stats = cpu_follow_stats,
    .replay_seek = cpu_replay_seek,
};

static int cpu_init(dsv4_model *m, int max_tokens, const dsv4_ref_options *opt, dsv4_ref_cpu *c)
{
    const dsv4_config *cfg = dsv4_model_config(m);
    int rc = dsv4_ref_options_check(cfg, opt, "reference");
    if (rc) return rc;
    c->model = m;
    c->cfg = *cfg;
    const dsv4_config *f = &c->cfg;
    if ((rc = dsv4_ref_check_config(f, max_tokens))) return rc;
    dsv4_ref_plan plan; /* every tensor looked up, the memory checked, before anything is allocated */
    if ((rc = dsv4_ref_cpu_plan(m, max_tokens, 0, opt, &plan))) return rc;
    int nl = f->num_hidden_layers;
    c->n_pairs = f->qk_rope_head_dim / 2;
    c->inv_main = dsv4_ref_alloc(2 * (size_t)(c->n_pairs + 1) * sizeof(float), "rope tables");
    if (!c->inv_main) return DSV4_ERR_NOMEM;
    c->inv_cmp = c->inv_main + c->n_pairs + 1;
    dsv4_rope_inv_freq(&f->rope_main, f->qk_rope_head_dim, c->inv_main);
    dsv4_rope_inv_freq(&f->rope_compress, f->qk_rope_head_dim, c->inv_cmp);

    c->lw = dsv4_ref_alloc((size_t)nl * sizeof *c->lw, "layer weights");
    c->ls = dsv4_ref_alloc((size_t)nl * sizeof *c->ls, "layer state");
    if (!c->lw || !c->ls) return DSV4_ERR_NOMEM;
    c->emu = opt->emulate == DSV4_REF_EMULATE_BF16;
    if ((rc = dsv4_ref_weights_init(c, opt->weights == DSV4_REF_WEIGHTS_UPFRONT))) return rc;
    for (int L = 0; L < nl; L++)
        if ((rc = bind_tid2eid(c, L))) return rc;
    c->layer_progress = opt->layer_progress;
    c->progress_ctx = opt->progress_ctx;
    c->follow = opt->follow;
    c->replay = opt->replay;
    c->follow_stop = -1;
    c->fstats.stopped_at = -1;

    size_t state = layout_state(c, max_tokens, NULL);
    c->state_mem = dsv4_ref_alloc(state * sizeof(float), "decode state");
    if (!c->state_mem) return DSV4_ERR_NOMEM;
    layout_state(c, max_tokens, c->state_mem);
    for (int L = 0; c->replay && L < nl; L++) { /* what the dump shows where no entry is judged: the candidate's */
        const dsv4_ref_layer_state *s = &c->ls[L];
        if (c->lw[L].ratio <= 0) continue;
        const int64_t n_cmp = dsv4_ref_replay_rows(c->replay, DSV4_REF_REPLAY_CMP, L);
        const int64_t n_idx = dsv4_ref_replay_rows(c->replay, DSV4_REF_REPLAY_IDX, L);
        if (n_cmp > s->pool_cap || n_idx > s->pool_cap)
            return dsv4_error(DSV4_ERR_USAGE, "reference: the replayed candidate has %lld entries at layer %d, the "
                              "pool holds %d (max_tokens must be the candidate's token count)",
                              (long long)(n_cmp > n_idx ? n_cmp : n_idx), L, s->pool_cap);
        replay_entries_to(c->replay, DSV4_REF_REPLAY_CMP, L, s->own_pool, n_cmp, f->head_dim);
        if (c->lw[L].attn == DSV4_ATTN_CSA)
            replay_entries_to(c->replay, DSV4_REF_REPLAY_IDX, L, s->own_ipool, n_idx, f->index_head_dim);
    }

    size_t step = dsv4_ref_scratch_layout(c, 1, &c->step, NULL);
    c->step_mem = dsv4_ref_alloc(step * sizeof(float), "decode scratch");
    if (!c->step_mem) return DSV4_ERR_NOMEM;
    dsv4_ref_scratch_layout(c, 1, &c->step, c->step_mem);
    return 0;
}
void dsv4_ref_options_default(dsv4_ref_options *o)
{
    memset(o, 0, sizeof *o);
    o->emulate = DSV4_REF_EMULATE_NONE;
    o->weights = DSV4_REF_WEIGHTS_LAZY;
}

const char *dsv4_ref_emulate_name(dsv4_ref_emulate e) { return e == DSV4_REF_EMULATE_BF16 ? "bf16" : "none"; }

static const char *const gpu_weights_names[] = {"auto", "resident", "stream"};
_Static_assert(sizeof gpu_weights_names / sizeof gpu_weights_names[0] == DSV4_REF_GPU_WEIGHTS_STREAM + 1,
               "one name per dsv4_ref_gpu_weights");

const char *dsv4_ref_gpu_weights_name(dsv4_ref_gpu_weights w)
{
    return (unsigned)w <= DSV4_REF_GPU_WEIGHTS_STREAM ? gpu_weights_names[w] : "?";
}

int dsv4_ref_gpu_weights_parse(const char *s, dsv4_ref_gpu_weights *out)
{
    for (int i = 0; s && i <= DSV4_REF_GPU_WEIGHTS_STREAM; i++)
        if (!strcmp(s, gpu_weights_names[i])) {
            *out = (dsv4_ref_gpu_weights)i;
            return 0;
        }
    return dsv4_error(DSV4_ERR_USAGE, "--gpu-weights '%s': want auto, resident or stream", s ? s : "");
}

int dsv4_ref_emulate_parse(const char *s, dsv4_ref_emulate *out)
{
    if (s && !strcmp(s, "none")) *out = DSV4_REF_EMULATE_NONE;
    else if (s && !strcmp(s, "bf16")) *out = DSV4_REF_EMULATE_BF16;
    else return dsv4_error(DSV4_ERR_USAGE, "--emulate '%s': want none or bf16", s ? s : "");
    return 0;
}

int dsv4_ref_cpu_init(dsv4_model *m, int max_tokens, dsv4_ref **out)
{
    return dsv4_ref_cpu_init_opts(m, max_tokens, NULL, out);
}

int dsv4_ref_cpu_init_opts(dsv4_model *m, int max_tokens, const dsv4_ref_options *o, dsv4_ref **out)
{
    DSV4_CHECK(m && out, "dsv4_ref_cpu_init: NULL argument");
    *out = NULL;
    dsv4_ref_options defaults;
    dsv4_ref_options_default(&defaults);
    if (!o) o = &defaults;
    dsv4_ref *r = dsv4_ref_alloc(sizeof *r, "reference");
    dsv4_ref_cpu *c = dsv4_ref_alloc(sizeof *c, "reference cpu");
    if (!r || !c) {
        dsv4_ref_release(r);
        dsv4_ref_release(c);
        return DSV4_ERR_NOMEM;
    }
    r->vt = &dsv4_ref_cpu_vtable;
    r->impl = c;
    r->max_tokens = max_tokens;
    r->replay = o->replay;
    int rc = cpu_init(m, max_tokens, o, c);
#ifdef DSV4_TEST_FAULTS
    if (!rc && !(rc = dsv4_ref_fault_init()) && dsv4_ref_test_fault != DSV4_FAULT_NONE && !c->emu)
        rc = dsv4_error(DSV4_ERR_USAGE, "DSV4_TEST_FAULT=%s: the faults are planted in the emulation; add "
                        "--emulate bf16", dsv4_ref_fault_name(dsv4_ref_test_fault));
#endif
    if (rc) {
        dsv4_ref_free(r);
        return rc;
    }
    char extra[160] = ""; /* a dump of a planted fault says so, and a replay whose candidate it replayed */
#ifdef DSV4_TEST_FAULTS
    if (dsv4_ref_test_fault != DSV4_FAULT_NONE)
        snprintf(extra, sizeof extra, " fault=%s", dsv4_ref_fault_name(dsv4_ref_test_fault));
#endif
    if (c->replay) {
        const char *rp = dsv4_ref_replay_path(c->replay), *base = strrchr(rp, '/');
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " replay=%.120s", base ? base + 1 : rp);
    }
    dsv4_ref_producer_set(r, c->emu, extra, c->follow); /* what was rounded and whose choices were followed */
    *out = r;
    return 0;
}

void dsv4_ref_gpu_stats_get(const dsv4_ref *r, dsv4_ref_gpu_stats *s)
{
    memset(s, 0, sizeof *s);
    if (r && r->vt && r->vt->gpu_stats) r->vt->gpu_stats(r, s);
}

void dsv4_ref_follow_stats_get(const dsv4_ref *r, dsv4_ref_follow_stats *s)
{
    memset(s, 0, sizeof *s);
    s->stopped_at = -1;
    if (r && r->vt && r->vt->follow_stats) r->vt->follow_stats(r, s);
}

int dsv4_ref_options_check(const dsv4_config *f, const dsv4_ref_options *o, const char *who)
{
    if (o->emulate != DSV4_REF_EMULATE_NONE && o->emulate != DSV4_REF_EMULATE_BF16)
        return dsv4_error(DSV4_ERR_USAGE, "%s: emulate %d (want DSV4_REF_EMULATE_NONE or _BF16)", who,
                          (int)o->emulate);
    if (o->weights != DSV4_REF_WEIGHTS_LAZY && o->weights != DSV4_REF_WEIGHTS_UPFRONT)
        return dsv4_error(DSV4_ERR_USAGE, "%s: weights %d (want DSV4_REF_WEIGHTS_LAZY or _UPFRONT)", who,
                          (int)o->weights);
    if (o->replay) {
        int n = 0;
        dsv4_ref_replay_tokens(o->replay, &n);
        if (o->emulate != DSV4_REF_EMULATE_NONE || o->follow)
            return dsv4_error(DSV4_ERR_USAGE, "%s: replay runs the plain fp32 reference on the candidate's own "
                              "choices: not with emulate or follow", who);
    }
    if ((unsigned)o->gpu_weights > DSV4_REF_GPU_WEIGHTS_STREAM)
        return dsv4_error(DSV4_ERR_USAGE, "%s: gpu_weights %d (want DSV4_REF_GPU_WEIGHTS_AUTO, _RESIDENT or _STREAM)",
                          who, (int)o->gpu_weights);
    const dsv4_opt_follow *fl = o->follow;
    if (fl && (dsv4_opt_follow_width(fl, DSV4_OPT_FOLLOW_TOPK) != f->index_topk ||
               dsv4_opt_follow_width(fl, DSV4_OPT_FOLLOW_ROUTER) != f->num_experts_per_tok))
        return dsv4_error(DSV4_ERR_USAGE, "%s: the follow table of %s was loaded for another config "
                          "(index_topk %d, experts per token %d; the model has %d, %d)", who,
                          dsv4_opt_follow_path(fl), dsv4_opt_follow_width(fl, DSV4_OPT_FOLLOW_TOPK),
                          dsv4_opt_follow_width(fl, DSV4_OPT_FOLLOW_ROUTER), f->index_topk, f->num_experts_per_tok);
    return 0;
}

void dsv4_ref_producer_set(dsv4_ref *r, int emu, const char *extra, const dsv4_opt_follow *follow)
{
    if (!emu && !follow && !(extra && *extra)) return;
    size_t len = (size_t)snprintf(r->producer, sizeof r->producer, "%s", r->vt->producer);
    if (emu) len += (size_t)snprintf(r->producer + len, sizeof r->producer - len, " emulate=bf16");
    if (extra) len += (size_t)snprintf(r->producer + len, sizeof r->producer - len, "%s", extra);
    if (follow) {
        const char *fp = dsv4_opt_follow_path(follow), *base = strrchr(fp, '/');
        snprintf(r->producer + len, sizeof r->producer - len, " follow=%s", base ? base + 1 : fp);
    }
}

/* ------------------------------------------------------------------------------ device-neutral API */
void dsv4_ref_free(dsv4_ref *r)
{
    if (!r) return;
#ifdef DSV4_TEST_FAULTS
    if (r->vt == &dsv4_ref_cpu_vtable) dsv4_ref_fault_report();
#endif
    if (r->vt && r->vt->free_impl) r->vt->free_impl(r->impl);
    dsv4_ref_release(r);
}

int dsv4_ref_prefill(dsv4_ref *r, const int32_t *tokens, int n, dsv4_probe_sink *probe, float *logits_last)
{
    DSV4_CHECK(r && tokens, "dsv4_ref_prefill: NULL argument");
    DSV4_CHECK(r->pos == 0, "dsv4_ref_prefill: only valid as the first call (position is %d)", r->pos);
    DSV4_CHECK(n >= 1 && n <= r->max_tokens, "dsv4_ref_prefill: %d tokens, capacity %d (max_tokens)", n,
               r->max_tokens);
    int rc = r->vt->forward(r, tokens, n, probe, logits_last);
    if (rc) return rc;
    r->pos += n;
    return 0;
}

int dsv4_ref_replay_run(dsv4_ref *r, dsv4_probe_sink *probe)
{
    DSV4_CHECK(r, "dsv4_ref_replay_run: NULL argument");
    const dsv4_ref_replay *rp = r->replay;
    int T = 0;
    const int32_t *tokens = dsv4_ref_replay_tokens(rp, &T);
    DSV4_CHECK(rp && r->vt->replay_seek, "dsv4_ref_replay_run: the reference was made without a replay");
    DSV4_CHECK(r->pos == 0 && T <= r->max_tokens, "dsv4_ref_replay_run: only as the first call, with max_tokens >= "
               "the candidate's %d tokens (position %d, max_tokens %d)", T, r->pos, r->max_tokens);
    for (int i = 0; i < dsv4_ref_replay_segments(rp); i++) {
        int first, last;
        dsv4_ref_replay_segment(rp, i, &first, &last);
        DSV4_TRY(r->vt->replay_seek(r, first));
        r->pos = first;
        DSV4_TRY(r->vt->forward(r, tokens + first, last - first + 1, probe, NULL));
    }
    r->pos = T;
    return 0;
}

int dsv4_ref_decode(dsv4_ref *r, int32_t token, dsv4_probe_sink *probe, float *logits)
{
    DSV4_CHECK(r, "dsv4_ref_decode: NULL argument");
    DSV4_CHECK(r->pos < r->max_tokens, "dsv4_ref_decode: position %d is past max_tokens %d", r->pos,
               r->max_tokens);
    int rc = r->vt->forward(r, &token, 1, probe, logits);
    if (rc) return rc;
    r->pos += 1;
    return 0;
}

int dsv4_ref_position(const dsv4_ref *r) { return r ? r->pos : 0; }

int dsv4_ref_dump_entries(dsv4_ref *r, dsv4_probe_sink *probe)
{
    DSV4_CHECK(r, "dsv4_ref_dump_entries: NULL argument");
    if (!probe) return 0;
    return r->vt->dump_entries(r, probe);
}

const char *dsv4_ref_producer(const dsv4_ref *r)
{
    if (r && r->producer[0]) return r->producer;
    return r && r->vt ? r->vt->producer : "dsv4 reference";
}
