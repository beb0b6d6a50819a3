/* ref_model.h - internals of the reference path shared by its CPU files (ref_model.c, ref_forward.c) and the
 * GPU implementation: the dsv4_ref object with its per-device vtable, the allocation counter, and the CPU
 * weights / decode state / scratch.
 *
 * Invariants:
 * - dsv4_ref_prefill/decode are device-neutral: they check positions and capacity, then call vt->forward.
 * - Every allocation of the reference goes through dsv4_ref_alloc so that a test can prove the decode step
 *   allocates nothing (style rule 10).
 * - The decode state is sized by max_tokens at init (window ring of sliding_window rows, compressed pools of
 *   max_tokens div r entries, compressor states); never by max_position_embeddings.
 * - The CPU weights are dequantised when used (ref_weights.c): a layer's views in lw[L] are valid only after
 *   dsv4_ref_weights_layer(c, L) and until the next layer or the head is loaded.
 */
#ifndef DSV4_REF_MODEL_H
#define DSV4_REF_MODEL_H

#include <stdint.h>

#include "dsv4/dsv4_ref.h"
#include "ref_ops.h"

/* ------------------------------------------------------------------------------------ device-neutral */
typedef struct dsv4_ref_vtable {
    const char *producer; /* "dsv4 0.1 reference cpu fp32" */
    /* n tokens at positions r->pos .. r->pos+n-1; logits_last [vocab] or NULL. Does not advance r->pos. */
    int (*forward)(dsv4_ref *r, const int32_t *tokens, int n, dsv4_probe_sink *probe, float *logits_last);
    int (*dump_entries)(dsv4_ref *r, dsv4_probe_sink *probe);
    void (*free_impl)(void *impl);
    /* what decision following did so far (dsv4_ref_follow_stats_get) */
    void (*follow_stats)(const dsv4_ref *r, dsv4_ref_follow_stats *s);
    /* ref-gpu: where its time and memory went (dsv4_ref_gpu_stats_get); NULL: zeros */
    void (*gpu_stats)(const dsv4_ref *r, dsv4_ref_gpu_stats *s);
    /* replay (dsv4_ref_replay_run), before the segment starting at `first`: every compressor's entry count set to
     * first div ratio and the pools' rows below it the candidate's entries */
    int (*replay_seek)(dsv4_ref *r, int first);
} dsv4_ref_vtable;

struct dsv4_ref {
    const dsv4_ref_vtable *vt;
    void *impl;     /* owned: released by vt->free_impl */
    int pos;        /* positions consumed */
    int max_tokens; /* capacity given at init */
    const dsv4_ref_replay *replay; /* borrowed, NULL: off (dsv4_ref_replay_run) */
    char producer[320]; /* "" = vt->producer; else this instance's (options appended) */
};

/* Counted allocation (zeroed). NULL on failure (with the error recorded). */
void *dsv4_ref_alloc(size_t nbytes, const char *what);
void dsv4_ref_release(void *p);
/* Allocations made by the reference since the process started. */
long dsv4_ref_alloc_count(void);
/* The shapes both reference paths rely on (kv heads, layers, hc_mult, groups, rope dims, window, experts, scoring);
 * everything else is checked tensor by tensor when bound. DSV4_ERR_* with a message naming the value. */
int dsv4_ref_check_config(const dsv4_config *f, int max_tokens);
/* The options given to either path's init (dsv4_ref_options), checked against the model's config before anything
 * is set up: emulate, weights and gpu_weights each one of its enum's values; a follow table loaded for this config's
 * widths (index_topk, experts per token). who names the caller in the message. DSV4_ERR_USAGE naming the value. */
int dsv4_ref_options_check(const dsv4_config *f, const dsv4_ref_options *o, const char *who);
/* r->producer = the path's producer + " emulate=bf16" (emu) + extra (may be NULL: e.g. " fault=X" of the test-only
 * build) + " follow=<the follow dump's file name>" (follow may be NULL); left "" when none is set. */
void dsv4_ref_producer_set(dsv4_ref *r, int emu, const char *extra, const dsv4_opt_follow *follow);
/* Decision following's merge (the rule of kernels/follow.cu): the dump's row tgt [k] merged into the own row [k]:
 * ids both hold keep their slots (the attention and the MoE sum in slot order), the dump's other ids fill the
 * remaining slots in the dump's order (-1 when none is left). tmp [4k] scratch. Returns 1 when the row changed. */
int dsv4_ref_follow_merge(int32_t *row, const int32_t *tgt, int k, int32_t *tmp);

/* ------------------------------------------------------------------------------------------- cpu */
/* The f32 tensors of layer L that both reference paths bind, one X(field, numel, condition, bf16, name format) each,
 * in binding order (the GPU path's arena follows it). bf16 = 1: the optimized path holds the tensor in bf16, so the
 * bf16 emulation rounds it (docs/verify.md "The bf16 emulation of the reference"; both paths read this column, so
 * they round the same set). Expanded inside a binder that defines the size names D, H, d, qr, G, o_r, HI, dI, E,
 * NI, n, mix and the layer's w->attn / w->mlp / w->ratio; the routed experts (bf16 in the optimized path too),
 * tid2eid, the embedding and the head are bound by each path (their storage differs). */
#define DSV4_REF_LAYER_TENSORS(X)                                                                                \
    X(hc_attn.fn, mix * n * D, 1, 0, "layers.%d.hc_attn_fn")                                                     \
    X(hc_attn.base, mix, 1, 0, "layers.%d.hc_attn_base")                                                         \
    X(hc_attn.scale, 3, 1, 0, "layers.%d.hc_attn_scale")                                                         \
    X(hc_ffn.fn, mix * n * D, 1, 0, "layers.%d.hc_ffn_fn")                                                       \
    X(hc_ffn.base, mix, 1, 0, "layers.%d.hc_ffn_base")                                                           \
    X(hc_ffn.scale, 3, 1, 0, "layers.%d.hc_ffn_scale")                                                           \
    X(attn_norm, D, 1, 0, "layers.%d.attn_norm.weight")                                                          \
    X(ffn_norm, D, 1, 0, "layers.%d.ffn_norm.weight")                                                            \
    X(wq_a, qr * D, 1, 1, "layers.%d.attn.wq_a.weight")                                                          \
    X(q_norm, qr, 1, 0, "layers.%d.attn.q_norm.weight")                                                          \
    X(wq_b, H * d * qr, 1, 1, "layers.%d.attn.wq_b.weight")                                                      \
    X(wkv, d * D, 1, 1, "layers.%d.attn.wkv.weight")                                                             \
    X(kv_norm, d, 1, 0, "layers.%d.attn.kv_norm.weight")                                                         \
    X(wo_a, G * o_r * (H * d / G), 1, 1, "layers.%d.attn.wo_a.weight")                                           \
    X(wo_b, D * G * o_r, 1, 1, "layers.%d.attn.wo_b.weight")                                                     \
    X(sinks, H, 1, 0, "layers.%d.attn.attn_sink")                                                                \
    X(cmp_wkv, DSV4_REF_CMP_WIDTH(w, d) * D, w->ratio > 0, 1, "layers.%d.attn.compressor.wkv.weight")            \
    X(cmp_wgate, DSV4_REF_CMP_WIDTH(w, d) * D, w->ratio > 0, 1, "layers.%d.attn.compressor.wgate.weight")        \
    X(cmp_ape, (size_t)w->ratio * DSV4_REF_CMP_WIDTH(w, d), w->ratio > 0, 0, "layers.%d.attn.compressor.ape")    \
    X(cmp_norm, d, w->ratio > 0, 0, "layers.%d.attn.compressor.norm.weight")                                     \
    X(idx_wq_b, HI * dI * qr, w->attn == DSV4_ATTN_CSA, 1, "layers.%d.attn.indexer.wq_b.weight")                 \
    X(idx_wproj, HI * D, w->attn == DSV4_ATTN_CSA, 1, "layers.%d.attn.indexer.weights_proj.weight")              \
    X(idx_wkv, 2 * dI * D, w->attn == DSV4_ATTN_CSA, 1, "layers.%d.attn.indexer.compressor.wkv.weight")          \
    X(idx_wgate, 2 * dI * D, w->attn == DSV4_ATTN_CSA, 1, "layers.%d.attn.indexer.compressor.wgate.weight")      \
    X(idx_ape, (size_t)w->ratio * 2 * dI, w->attn == DSV4_ATTN_CSA, 0, "layers.%d.attn.indexer.compressor.ape")  \
    X(idx_norm, dI, w->attn == DSV4_ATTN_CSA, 0, "layers.%d.attn.indexer.compressor.norm.weight")                \
    X(gate_w, E * D, 1, 1, "layers.%d.ffn.gate.weight")                                                          \
    X(gate_bias, E, w->mlp != DSV4_MLP_HASH_MOE, 0, "layers.%d.ffn.gate.bias")                                   \
    X(sh_w1, NI * D, 1, 1, "layers.%d.ffn.shared_experts.w1.weight")                                             \
    X(sh_w3, NI * D, 1, 1, "layers.%d.ffn.shared_experts.w3.weight")                                             \
    X(sh_w2, D * NI, 1, 1, "layers.%d.ffn.shared_experts.w2.weight")
/* The compressor's width: CSA pools two overlapping windows (2·d), HCA one (d). */
#define DSV4_REF_CMP_WIDTH(w, d) ((size_t)((w)->attn == DSV4_ATTN_CSA ? 2 : 1) * (d))

/* Weights of one layer as f32 views (ref_weights.c): into the mmap (aligned F32 data), the weight arena (lazy, the
 * default: valid while the layer is the loaded one) or the loader's f32 cache (up-front). Shapes per model-spec §2. */
typedef struct dsv4_ref_layer_w {
    dsv4_attn_type attn;
    dsv4_mlp_type mlp;
    int ratio;                    /* 0, compress_rate_csa, compress_rate_hca */
    dsv4_ref_hc_params hc_attn, hc_ffn;
    const float *attn_norm, *ffn_norm; /* [D] */
    const float *wq_a;   /* [q_r, D] */
    const float *q_norm; /* [q_r] */
    const float *wq_b;   /* [H·d, q_r] */
    const float *wkv;    /* [d, D] */
    const float *kv_norm;/* [d] */
    const float *wo_a;   /* [G·o_r, H·d/G] */
    const float *wo_b;   /* [D, G·o_r] */
    const float *sinks;  /* [H] */
    /* compressor (ratio > 0): width = (csa ? 2 : 1)·d */
    const float *cmp_wkv, *cmp_wgate; /* [width, D] */
    const float *cmp_ape;             /* [ratio, width] */
    const float *cmp_norm;            /* [d] */
    /* indexer (csa) */
    const float *idx_wq_b;            /* [H_I·d_I, q_r] */
    const float *idx_wproj;           /* [H_I, D] */
    const float *idx_wkv, *idx_wgate; /* [2·d_I, D] */
    const float *idx_ape;             /* [ratio, 2·d_I] */
    const float *idx_norm;            /* [d_I] */
    /* moe */
    const float *gate_w;    /* [E, D] */
    const float *gate_bias; /* [E], learned layers; NULL on hash layers */
    int32_t *tid2eid;       /* [vocab, k] owned (hash layers), else NULL */
    const float **w1, **w3, **w2; /* up-front only (else NULL): [E] pointers, array owned: [I, D], [I, D], [D, I];
                                   * the forward asks dsv4_ref_weights_expert */
    const float *sh_w1, *sh_w3, *sh_w2;
} dsv4_ref_layer_w;

/* Decode state of one layer (model-spec §12.1). */
typedef struct dsv4_ref_layer_state {
    float *win;        /* [sliding_window, d] ring, slot = pos mod sliding_window */
    float *pool;       /* [pool_cap, d] compressed entries after norm + RoPE (ratio > 0) */
    int n_entries;
    int pool_cap;
    dsv4_ref_compressor cmp;
    float *ipool;      /* [pool_cap, d_I] indexer keys (csa) */
    int n_ientries;
    dsv4_ref_compressor icmp;
    /* replay only (else NULL): what the dump shows, [pool_cap, d] and [pool_cap, d_I]: the candidate's entries, each
     * judged one replaced by the entry this reference makes from the candidate's inputs (ref_replay.c); the pools
     * above hold the candidate's, which the layer reads */
    float *own_pool, *own_ipool;
} dsv4_ref_layer_state;

/* Scratch of one forward call over up to S tokens, carved from one allocation. */
typedef struct dsv4_ref_scratch {
    int S;          /* capacity in tokens */
    float *X, *X2;  /* [S, n, D] residual streams (double buffer) */
    float *pre, *post, *comb; /* [S, n], [S, n], [S, n, n] */
    float *xa, *xn; /* [S, D] collapsed input, normed input */
    float *qr;      /* [S, q_r] */
    float *q;       /* [S, H·d] */
    float *kv;      /* [S, d] */
    float *ckv, *cg;/* [S, 2·d] compressor projections */
    float *ikv, *ig;/* [S, 2·d_I] indexer compressor projections */
    float *qI;      /* [S, H_I·d_I] */
    float *wI;      /* [S, H_I] */
    float *o;       /* [S, H·d] */
    float *z;       /* [S, G·o_r] */
    float *aout;    /* [S, D] */
    float *cos_m, *sin_m, *cos_c, *sin_c; /* [S, n_pairs] main / compress tables at the call's positions */
    float *cos_e, *sin_e; /* [n_pairs] for a compressed entry */
    float *entry;   /* [max(d, d_I)] */
    float *gather;  /* [m_max, d] key=value rows of one query */
    float *scores;  /* [H, m_max] */
    float *iscore;  /* [pool_cap_max] */
    float *idots;   /* [H_I, pool_cap_max] */
    int32_t *topk;  /* [S, index_topk] */
    int *n_topk;    /* [S] */
    float *rlogits; /* [S, E] */
    int32_t *rids;  /* [S, k] */
    float *rw;      /* [S, k] */
    float *rs;      /* [E] */
    float *eg, *eu; /* [S, I] */
    float *eys;     /* [S, k, D] each (token, slot)'s routed expert output, computed expert by expert */
    float *fout;    /* [S, D] */
    float *vn;      /* [n·D] */
    float *mix;     /* [(2+n)·n] */
    float *y;       /* [D] */
    float *logits;  /* [vocab] */
    int32_t *fmerge;/* [4·max(index_topk, k)] decision following: the merge's rows and flags */
} dsv4_ref_scratch;

/* The CPU reference's weight store (ref_weights.c, docs/reference.md). */
typedef struct dsv4_ref_wstore {
    int upfront;         /* 1: every layer bound at init (lw[L] always valid); 0: lazy */
    float *arena;        /* owned. lazy: one layer's dense tensors, or the head, as f32; up-front: the bf16-rounded
                          * copies of the emulation (none without it) */
    size_t arena_floats;
    int loaded;          /* lazy: the layer the arena holds, -2 the head, -1 nothing */
    const float *head;   /* lazy: the head's view while loaded == -2 */
    float *expert;       /* owned (lazy): one routed expert [w1 | w3 | w2] as f32 */
    size_t expert_floats;
    int expert_layer, expert_id; /* the expert it holds (-1: none) */
    const float *ew[3];  /* its w1, w3, w2 views */
    float *globals;      /* owned (lazy): final norm and hc_head (when not mapped), then erow */
    float *erow;         /* [D] one embedding row (lazy, when embed is not served from the mmap) */
    int embed_round;     /* the emulation rounds embed rows */
    long layer_loads, expert_loads; /* lazy: layers / routed experts asked for and not already held (tests) */
} dsv4_ref_wstore;

/* Sizes in floats of the f32 copies the weights need (dsv4_ref_weights_measure): per mode. */
typedef struct dsv4_ref_weights_size {
    double layer;        /* the largest layer's dense tensors not served from the mmap */
    int layer_at;        /* that layer (-1: none) */
    double head;         /* the head (0: mapped) */
    double expert;       /* the largest routed expert (w1 + w3 + w2) */
    double globals, embed_row; /* final norm + hc_head; one embedding row (0: mapped) */
    double upfront_arena, upfront_loader; /* up-front: rounded copies; the loader's cache */
    double tid2eid_bytes;      /* the hash layers' tables (int32), both modes */
} dsv4_ref_weights_size;

typedef struct dsv4_ref_cpu {
    dsv4_model *model; /* borrowed */
    dsv4_config cfg;
    int n_pairs;       /* qk_rope_head_dim / 2 */
    float *inv_main, *inv_cmp; /* [n_pairs] */
    const float *embed, *head, *norm; /* [V, D], [V, D], [D]; lazy: embed / head NULL unless mapped (ask ws) */
    const float *hc_head_fn, *hc_head_base, *hc_head_scale;
    dsv4_ref_layer_w *lw;     /* [L] owned */
    dsv4_ref_layer_state *ls; /* [L] owned */
    float *state_mem;         /* owned: every layer's ring, pools and compressor states */
    int m_max;                /* largest key list of one query */
    int pool_cap_max;
    dsv4_ref_scratch step;    /* S = 1, preallocated: the decode step */
    float *step_mem;          /* owned */
    /* options (dsv4_ref_options) */
    int emu;                  /* 1: emulate bf16 (docs/verify.md "The bf16 emulation of the reference") */
    dsv4_ref_wstore ws;       /* where the f32 weights are (ref_weights.c) */
    dsv4_progress_fn layer_progress; /* NULL: none; called after each layer of a forward call */
    void *progress_ctx;
    const dsv4_opt_follow *follow; /* borrowed, NULL: off */
    const dsv4_ref_replay *replay; /* borrowed, NULL: off (layer-local replay, ref_forward.c) */
    int follow_stop;          /* first position whose token is not the dump's, -1: none yet */
    dsv4_ref_follow_stats fstats;
} dsv4_ref_cpu;

/* x [n] rounded to bf16 and back (round to nearest even, dsv4_f32_to_bf16): the emulation's one rounding. */
static inline void dsv4_ref_emu_round(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = dsv4_bf16_to_f32(dsv4_f32_to_bf16(x[i]));
}

/* ---------------------------------------------------------------------------------- ref_weights.c */
/* The kind of layer L (attn, mlp, ratio) into w. DSV4_ERR_CONFIG for a compress layer without a ratio. */
int dsv4_ref_layer_kind(const dsv4_config *f, int L, dsv4_ref_layer_w *w);
/* Look up and size-check every tensor the reference reads (no data read) and measure the f32 copies each mode
 * needs. emu: the bf16 emulation's rounded copies; upfront: the mode measured for upfront_*. */
int dsv4_ref_weights_measure(dsv4_model *m, const dsv4_config *f, int emu, int upfront, dsv4_ref_weights_size *sz);
/* Set up c->ws, c->lw[*]'s kinds, c->norm and hc_head (c->model, cfg, emu and lw set): up-front binds every
 * weight now; lazy allocates the arena, the expert slot and the row buffer. */
int dsv4_ref_weights_init(dsv4_ref_cpu *c, int upfront);
void dsv4_ref_weights_free(dsv4_ref_cpu *c);
/* Make c->lw[L]'s views valid (lazy: dequantise its dense tensors into the arena unless it holds them). */
int dsv4_ref_weights_layer(dsv4_ref_cpu *c, int L);
/* Routed expert e of layer L: w1, w3 [I, D], w2 [D, I] (lazy: into the expert slot unless it holds it). */
int dsv4_ref_weights_expert(dsv4_ref_cpu *c, int L, int e, const float **w1, const float **w3, const float **w2);
/* The embedding row [D] of a token (valid until the next call). */
int dsv4_ref_weights_embed(dsv4_ref_cpu *c, int32_t token, const float **row);
/* The head [V, D] (lazy: into the arena, evicting the layer it held). */
int dsv4_ref_weights_head(dsv4_ref_cpu *c, const float **head);

/* Carve a scratch for S tokens: returns the float count needed when mem == NULL. */
size_t dsv4_ref_scratch_layout(const dsv4_ref_cpu *c, int S, dsv4_ref_scratch *sc, float *mem);
/* One forward over n tokens at positions p0.. (ref_forward.c). */
int dsv4_ref_cpu_forward_scratch(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int p0, const int32_t *tokens, int n,
                                 dsv4_probe_sink *probe, float *logits_last);

#endif /* DSV4_REF_MODEL_H */
