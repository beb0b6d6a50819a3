/* ref_ops.h - the fp32 CPU reference ops (model-spec §3, §5, §6, §7, §8, §10), one section per op file.
 *
 * Internal to reference/ (and its tests): the model (ref_model.c) composes these; a GPU reference checks its
 * kernels against them. Every op is plain fp32; linears go through OpenBLAS. No op allocates: scratch is
 * passed in by the caller (the decode step allocates nothing, style rule 10).
 *
 * Conventions: row-major; a "[S, n]" pointer is S rows of n floats; pointers are borrowed, never owned.
 * Functions return void where they cannot fail (shapes are validated once when the model is bound).
 */
#ifndef DSV4_REF_OPS_H
#define DSV4_REF_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4/dsv4.h"

/* ------------------------------------------------------------------------------------- ref_ops.c (§3) */

/* y [S, n_out] = x [S, n_in] · W [n_out, n_in]ᵀ (sgemm; sgemv when S == 1). y must not alias x. */
void dsv4_ref_linear(float *y, const float *x, const float *w, int S, int n_in, int n_out);
/* y [n] = w ⊙ x / sqrt(mean(x²) + eps); w [n] may be NULL (unweighted). y may alias x. */
void dsv4_ref_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* cos/sin of pos·θ_i for one position: the angle is formed in fp32 like transformers (inv_freq @ pos). */
void dsv4_ref_rope_cos_sin(const float *inv_freq, int n_pairs, int64_t pos, float *cos_out, float *sin_out);
/* Interleaved-pair RoPE on the TRAILING 2·n_pairs channels of x [dim]; the leading channels are untouched.
 * Pair i is channels (c, c+1), c = dim − 2·n_pairs + 2i. inverse = 1 rotates by −angle (output de-rotation). */
void dsv4_ref_rope_apply(float *x, int dim, int n_pairs, const float *cos_v, const float *sin_v, int inverse);
/* Sink softmax (§3): p [m] = e^{s_j} / (Σ_k e^{s_k} + e^{sink}); the sink has no value. p may alias s. */
void dsv4_ref_sink_softmax(float *p, const float *s, int m, float sink);
/* Clamped SwiGLU activation (§3): h = silu(min(g, λ)) · clamp(u, −λ, λ); gate clamp is max-only. */
void dsv4_ref_swiglu(float *h, const float *g, const float *u, int n, float limit);
/* sqrt(softplus(z)) with torch's softplus threshold (z > 20 → z). */
float dsv4_ref_sqrtsoftplus(float z);
/* Indices of the k largest scores, descending; equal scores keep the LOWER index first (a fixed tie rule;
 * transformers' torch.topk order is unspecified, so selections are compared as sets). -inf scores are
 * ranked like any other value (after all finite ones). k <= n. */
void dsv4_ref_topk(const float *score, int n, int k, int32_t *idx /* [k] */);

/* ------------------------------------------------------------------------------------- ref_mhc.c (§5) */

/* mHC parameters of one site (hc_attn_* / hc_ffn_*), borrowed from the model. */
typedef struct dsv4_ref_hc_params {
    const float *fn;    /* [(2+n)·n, n·D] */
    const float *base;  /* [(2+n)·n] */
    const float *scale; /* [3]: pre, post, comb */
} dsv4_ref_hc_params;

/* Sinkhorn projection of the comb logits, in place (§5.1): row softmax + eps, one column normalisation, then
 * (iters − 1) × (row, column); it ENDS ON A COLUMN STEP. c [n, n], entry (j, k) at c[j·n + k]. */
void dsv4_ref_hc_sinkhorn(float *c, int n, int iters, float eps);
/* mHC pre of one token (§5.1). X [n, D] (stream-major), mix [(2+n)·n] scratch.
 * Outputs: pre [n] (sigmoid + hc_eps), post [n] (2·sigmoid), comb [n, n] (Sinkhorn'd), x [D] = Σ_j pre_j X[j].
 * vn [n·D] scratch for the normalised flatten. */
void dsv4_ref_hc_pre(const dsv4_ref_hc_params *hp, const float *X, int n, int D, int iters, float hc_eps,
                     float norm_eps, float *pre, float *post, float *comb, float *x, float *vn, float *mix);
/* mHC post (§5.2): Xo[k] = post[k]·out + Σ_j comb[j][k]·X[j]. Xo [n, D] must not alias X [n, D]. */
void dsv4_ref_hc_post(float *Xo, const float *X, const float *out, const float *post, const float *comb, int n,
                      int D);
/* hc_head (§5.3): y [D] = Σ_j pre_j X[j], pre_j = sigmoid(scale·m_j + base_j) + hc_eps, m = fn · norm(X).
 * fn [n, n·D], base [n], scale [1]; vn [n·D] scratch. */
void dsv4_ref_hc_head(const float *fn, const float *base, const float *scale, const float *X, int n, int D,
                      float hc_eps, float norm_eps, float *y, float *vn);

/* ------------------------------------------------------------------------------ ref_attention.c (§6, §9) */

/* Sink attention of one query over m gathered key=value rows (§6.5-6):
 * q [H, d], kv [m, d] (K = V), sinks [H]; o [H, d]; scores [H, m] scratch. Scale d^-½. m >= 1. */
void dsv4_ref_sink_attention(float *o, const float *q, const float *kv, int m, const float *sinks, int H, int d,
                             float *scores);
/* The same as the optimized path's mma kernel rounds it (bf16 emulation, docs/verify.md): each probability
 * p_j = bf16(e^{s_j − max_j s}) enters P·V rounded, the denominator is Σ_j p_j (rounded values) + e^{sink − max};
 * one row max over all m entries (the kernel's running max per 32-entry tile gives errors of the same size). */
void dsv4_ref_sink_attention_bf16p(float *o, const float *q, const float *kv, int m, const float *sinks, int H,
                                   int d, float *scores);
/* Grouped output projection (§6.8) for S tokens: o [S, H·d] viewed as G groups of H·d/G channels,
 * z [S, G·o_r] with z_g = o_g · W_oa[g]ᵀ (W_oa = wo_a [G·o_r, H·d/G]), out [S, D] = z · W_obᵀ. */
void dsv4_ref_grouped_out(float *out, float *z, const float *o, const float *wo_a, const float *wo_b, int S, int H,
                          int d, int G, int o_r, int D);

/* ----------------------------------------------------------------------------- ref_compressor.c (§7) */

/* The per-token state machine of one compressor (§7.6) over d_c channels with ratio r.
 * overlap = 1 (CSA): projections are 2·d_c wide (a | b halves); the state holds 2r rows (previous window,
 * current window); entry w pools the a-halves of window w−1 and the b-halves of window w.
 * overlap = 0 (HCA): projections d_c wide, r rows. State rows are [kv | score], score = gate + ape (−∞ empty). */
typedef struct dsv4_ref_compressor {
    int ratio, d_c, overlap;
    int width;   /* projection width: (overlap ? 2 : 1) · d_c */
    int rows;    /* (overlap ? 2 : 1) · ratio */
    float *kv;   /* [rows, width] owned by the caller's arena */
    float *score;/* [rows, width] */
} dsv4_ref_compressor;

/* Compressed entries visible to the query at position p (§7.4): w < (p+1) div r; the token closing a
 * window already sees its entry, a partial window is never visible. */
static inline int dsv4_ref_entries_visible(int64_t p, int r) { return (int)((p + 1) / r); }

/* Number of floats of state (kv + score) for these dimensions. */
size_t dsv4_ref_compressor_state_floats(int ratio, int d_c, int overlap);
/* Bind the state to `mem` [dsv4_ref_compressor_state_floats] and reset it (kv 0, score −∞). */
void dsv4_ref_compressor_init(dsv4_ref_compressor *c, int ratio, int d_c, int overlap, float *mem);
/* Feed token p: kv_p [width], gate_p [width] (without ape), ape [ratio, width]. When (p+1) mod r == 0 the
 * window closes: the pooled entry (before norm/RoPE) goes to entry [d_c] and 1 is returned, else 0. */
int dsv4_ref_compressor_push(dsv4_ref_compressor *c, int64_t p, const float *kv_p, const float *gate_p,
                             const float *ape, float *entry);
/* Finalise an entry (§7.3): RMSNorm with norm_w [d_c], RoPE at position r·w (cos/sin of that position). */
void dsv4_ref_compressor_finish(float *entry, int d_c, const float *norm_w, float eps, int n_pairs,
                                const float *cos_v, const float *sin_v);

/* -------------------------------------------------------------------------------- ref_indexer.c (§8) */

/* Index scores of one query over n entries (§8.4): score[w] = Σ_h ω_h · ReLU(qI_h · K_w) · d_I^-½, with
 * ω_h = wraw_h · H_I^-½. qI [H_I, d_I], keys [n, d_I], wraw [H_I] (x · W_wᵀ), dots [H_I, n] scratch. */
void dsv4_ref_index_scores(float *score, const float *qI, const float *keys, int n, const float *wraw, int H_I,
                           int d_I, float *dots);
/* Selection (§8.5-6): k = min(topk, n_pool) picks over score [n_pool] with entries w >= n_visible set to −∞
 * in place; picks >= n_visible become −1. Returns k. */
int dsv4_ref_index_select(float *score, int n_pool, int n_visible, int topk, int32_t *idx /* [k] */);

/* ------------------------------------------------------------------------------------ ref_moe.c (§10) */

/* Router of one token (§10.1-3). logits [E] = u · W_gateᵀ already computed. Learned (bias != NULL):
 * ids = top-k of s + bias; hash (bias == NULL): ids = hash_ids [k]. weights = s_id / (Σ s_id + 1e-20) · scale.
 * The bias selects only; it never enters the weights. */
void dsv4_ref_route(const float *logits, int E, int k, const float *bias, const int32_t *hash_ids,
                    float routed_scale, int32_t *ids, float *weights, float *s_scratch /* [E] */);
/* One clamped-SwiGLU expert on S tokens: y [S, D] = (silu(min(xW1ᵀ,λ)) · clamp(xW3ᵀ,±λ)) W2ᵀ.
 * w1, w3 [inter, D]; w2 [D, inter]; g, u [S, inter] scratch. */
void dsv4_ref_expert(float *y, const float *x, const float *w1, const float *w3, const float *w2, int S, int D,
                     int inter, float limit, float *g, float *u);

#endif /* DSV4_REF_OPS_H */
