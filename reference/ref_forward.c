/* ref_forward.c - one forward call of the CPU reference over n tokens at positions p0..p0+n-1 (model-spec §4,
 * §6-§10, §12.2): prefill (n = prompt) and the decode step (n = 1) are the same code, with the linears batched
 * over the call's tokens, the compressors driven token by token through their state machines, and attention
 * one query at a time over its gathered key list. Probes are emitted for every stored position.
 *
 * Invariants that fail quietly:
 * - Window keys of query p are positions max(0, p−W+1)..p; those of the current call come from the call's kv
 *   rows, older ones from the ring (slot pos mod W). The ring is written after the call's attention.
 * - Compressed entries are emitted while the call's tokens are pushed, before any attention of the call:
 *   query p then sees HCA entries w < (p+1) div r, and CSA picks of the indexer (−1 = none).
 * - The indexer scores the whole pool known after the call (k = min(index_topk, pool)); in decode that pool
 *   is exactly the visible set.
 * - Sliding layers use the main RoPE table; CSA/HCA layers use the compress table for q, window kv,
 *   compressed entries and the indexer.
 * - The MoE reads token ids (hash layers) from the call's tokens, not from positions.
 * - Weights are asked for when used (ref_weights.c): a layer's dense tensors when the layer starts, a routed expert
 *   once per call for all the (token, slot) pairs routed to it (routed_all, expert by expert; each pair's output is
 *   kept and summed per token in slot order, so the sums are those of a token-by-token loop), the head once per
 *   call, an embedding row per token.
 * - bf16 emulation (c->emu, docs/verify.md "The bf16 emulation of the reference"): every rounding sits where the
 *   optimized path stores that value in bf16, marked "emu:" with the buffer of optimized/ it mirrors; probes are
 *   taken where the optimized path takes them (kv before the cache store, norm after the bf16 store). With
 *   emulation off not one operation differs from the plain reference.
 * - Decision following (c->follow): the own top-k / router picks are probed first, then the dump's row is merged in
 *   (dsv4_ref_follow_merge, the rule of kernels/follow.cu), so a row that agrees leaves the step bitwise unchanged.
 * - Layer-local replay (c->replay, docs/verify.md "Layer-local replay"): the candidate's state is injected where
 *   the layer would read its own: the streams at each layer's start (and before the head), the window KV after the
 *   own kv is probed, each compressed / indexer entry after the own one is kept for the dump, the top-k and router
 *   choices as following applies them, and the attention output with the mHC post / comb before the mid-layer
 *   post. Everything probed is then this reference's output on the candidate's inputs. The forward runs one segment
 *   of stored positions at a time (dsv4_ref_replay_run); an entry made here is kept for the dump only when judged
 *   (its window inside the segment, ref_replay.c).
 * - DSV4_FAULT(...) sites plant the bugs of ref_fault.h in the emulation; they exist only in the test-only binary
 *   dsv4_faults (everywhere else the condition is the constant 0).
 */
#include <math.h>
#include <string.h>

#include "dsv4/dsv4_opt.h"
#include "ref_fault.h"
#include "ref_model.h"

#define PROBE(name, pos, buf, n)                                                                                 \
    do {                                                                                                         \
        int rc_ = dsv4_probe(probe, L, name, pos, buf, n);                                                       \
        if (rc_) return rc_;                                                                                     \
    } while (0)
#define PROBE_I32(name, pos, buf, n)                                                                             \
    do {                                                                                                         \
        int rc_ = dsv4_probe_i32(probe, L, name, pos, buf, n);                                                   \
        if (rc_) return rc_;                                                                                     \
    } while (0)

/* Is position p following the dump? Until the first position whose token is not the dump's (set per call). */
static int follow_on(const dsv4_ref_cpu *c, int p) { return c->follow && (c->follow_stop < 0 || p < c->follow_stop); }

/* The choice row to run on at (L, p) instead of the own one: the follow table's, or the replayed candidate's (a top-k
 * row of -1 only is no choice); NULL: keep the own. */
static const int32_t *choice_row(const dsv4_ref_cpu *c, dsv4_opt_follow_kind kind, int L, int p, int k)
{
    if (follow_on(c, p)) return dsv4_opt_follow_row(c->follow, kind, L, p);
    if (!c->replay) return NULL;
    const int32_t *row =
        dsv4_ref_replay_row(c->replay, kind == DSV4_OPT_FOLLOW_TOPK ? DSV4_REF_REPLAY_TOPK : DSV4_REF_REPLAY_ROUTER,
                            L, p);
    for (int j = 0; row && j < k; j++)
        if (row[j] != -1) return row;
    return NULL;
}

/* Replay: rows [S] of the candidate's `kind` at layer L from position p0, each `width` floats, into dst (stride
 * `stride` floats). */
static void replay_rows(const dsv4_ref_cpu *c, dsv4_ref_replay_kind kind, int L, int p0, int S, float *dst,
                        size_t width, size_t stride)
{
    for (int s = 0; s < S; s++)
        memcpy(dst + (size_t)s * stride, dsv4_ref_replay_row(c->replay, kind, L, p0 + s), width * sizeof(float));
}

/* Replay: of the entries [from, to) this layer just made, the judged ones go to `own` (what the dump shows; it holds
 * the candidate's elsewhere), and the candidate's take their place in the pool (what the layer reads from now on). */
static void replay_entries(const dsv4_ref_cpu *c, dsv4_ref_replay_kind kind, int L, const dsv4_ref_compressor *cmp,
                           float *pool, float *own, int from, int to, size_t d)
{
    for (int w = from; w < to; w++) {
        if (dsv4_ref_replay_entry_judged(c->replay, cmp->ratio, cmp->overlap, w))
            memcpy(own + (size_t)w * d, pool + (size_t)w * d, d * sizeof(float));
        memcpy(pool + (size_t)w * d, dsv4_ref_replay_row(c->replay, kind, L, w), d * sizeof(float));
    }
}

/* ref_model.h: the GPU reference merges with this function too, so both follow by one rule. */
int dsv4_ref_follow_merge(int32_t *row, const int32_t *tgt, int k, int32_t *tmp)
{
    if (!memcmp(row, tgt, (size_t)k * sizeof *row)) return 0;
    int32_t *own = tmp, *keep = tmp + k, *miss = tmp + 2 * k;
    memcpy(own, row, (size_t)k * sizeof *own);
    for (int j = 0; j < k; j++) {
        const int32_t v = own[j], t = tgt[j];
        int kp = v >= 0, in = 0;
        for (int i = 0; kp && i < j; i++) kp = own[i] != v; /* first occurrence only */
        for (int i = 0; kp && !in && i < k; i++) in = tgt[i] == v;
        keep[j] = kp && in;
        int ms = t >= 0;
        for (int i = 0; ms && i < j; i++) ms = tgt[i] != t;
        for (int i = 0; ms && i < k; i++) ms = own[i] != t;
        miss[j] = ms;
    }
    int m = 0, ch = 0;
    for (int j = 0; j < k; j++) {
        if (keep[j]) continue;
        while (m < k && !miss[m]) m++;
        const int32_t v = m < k ? tgt[m++] : -1;
        ch |= v != own[j];
        own[j] = v;
    }
    if (ch) memcpy(row, own, (size_t)k * sizeof *row);
    return ch;
}

/* A bf16 cache store of the emulation: round to nearest even, or (fault KV_TRUNCATE) truncate toward zero. */
static void emu_store_cache(float *x, size_t n, int L, int p)
{
    if (!DSV4_FAULT(KV_TRUNCATE)) {
        dsv4_ref_emu_round(x, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        float t = dsv4_bf16_to_f32((uint16_t)(bits >> 16)); /* the high half: toward zero */
        if (t != dsv4_bf16_to_f32(dsv4_f32_to_bf16(x[i]))) dsv4_ref_fault_acted(L, p);
        x[i] = t;
    }
}

/* mHC pre of every token of the call, then the site's RMSNorm; probes <site>_hc_* and <site>_in. */
static int mhc_pre_all(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int L, const dsv4_ref_hc_params *hp,
                       const float *norm_w, int p0, int S, int attn_site, dsv4_probe_sink *probe)
{
    const dsv4_config *f = &c->cfg;
    int n = f->hc_mult, D = f->hidden_size, iters = f->hc_sinkhorn_iters;
    if (DSV4_FAULT(SINKHORN_SHORT) && iters > 0) {
        iters--;
        dsv4_ref_fault_acted(L, p0);
    }
    for (int s = 0; s < S; s++) {
        float *pre = sc->pre + (size_t)s * n, *post = sc->post + (size_t)s * n;
        float *comb = sc->comb + (size_t)s * n * n, *xa = sc->xa + (size_t)s * D;
        dsv4_ref_hc_pre(hp, sc->X + (size_t)s * n * D, n, D, iters, (float)f->hc_eps,
                        (float)f->rms_norm_eps, pre, post, comb, xa, sc->vn, sc->mix);
        dsv4_ref_rmsnorm(sc->xn + (size_t)s * D, xa, norm_w, D, (float)f->rms_norm_eps);
        if (c->emu) dsv4_ref_emu_round(sc->xn + (size_t)s * D, D); /* emu: o->xn, the GEMM input (bf16) */
        int p = p0 + s;
        if (!dsv4_probe_wants(probe, p)) continue;
        PROBE(attn_site ? "attn_hc_pre" : "ffn_hc_pre", p, pre, n);
        PROBE(attn_site ? "attn_hc_post" : "ffn_hc_post", p, post, n);
        PROBE(attn_site ? "attn_hc_comb" : "ffn_hc_comb", p, comb, (size_t)n * n);
        PROBE(attn_site ? "attn_in" : "ffn_in", p, xa, D);
    }
    return 0;
}

/* mHC post of every token: X ← post ⊗ out + combᵀ X (through the double buffer). */
static void mhc_post_all(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, const float *out, int S)
{
    int n = c->cfg.hc_mult, D = c->cfg.hidden_size;
    for (int s = 0; s < S; s++)
        dsv4_ref_hc_post(sc->X2 + (size_t)s * n * D, sc->X + (size_t)s * n * D, out + (size_t)s * D,
                         sc->post + (size_t)s * n, sc->comb + (size_t)s * n * n, n, D);
    if (c->emu) dsv4_ref_emu_round(sc->X2, (size_t)S * n * D); /* emu: o->X, the residual streams (bf16) */
    float *t = sc->X;
    sc->X = sc->X2;
    sc->X2 = t;
}

/* Push the call's tokens through one compressor; finished entries (norm + RoPE at r·w) go to pool. */
static int compress_all(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int L, dsv4_ref_compressor *cmp, const float *kvp,
                        const float *gp, const float *ape, const float *norm_w, float *pool, int *n_entries,
                        int cap, int p0, int S)
{
    int dc = cmp->d_c, width = cmp->width, r = cmp->ratio;
    for (int s = 0; s < S; s++) {
        int64_t p = p0 + s;
        if (!dsv4_ref_compressor_push(cmp, p, kvp + (size_t)s * width, gp + (size_t)s * width, ape, sc->entry))
            continue;
        int w = (int)(p / r);
        if (w != *n_entries || w >= cap)
            return dsv4_error(DSV4_ERR_USAGE, "reference: compressed entry %d out of order or past capacity %d "
                              "(have %d)", w, cap, *n_entries);
        dsv4_ref_rope_cos_sin(c->inv_cmp, c->n_pairs, (int64_t)r * w, sc->cos_e, sc->sin_e);
        dsv4_ref_compressor_finish(sc->entry, dc, norm_w, (float)c->cfg.rms_norm_eps, c->n_pairs, sc->cos_e,
                                   sc->sin_e);
        if (c->emu) emu_store_cache(sc->entry, dc, L, (int)p); /* emu: ly->kvc rows W + w / ly->ipool (bf16 caches) */
        if (DSV4_FAULT(COMPRESSOR_APE)) dsv4_ref_fault_acted(L, (int)p); /* ref_compressor.c pooled it */
        memcpy(pool + (size_t)w * dc, sc->entry, (size_t)dc * sizeof(float));
        *n_entries = w + 1;
    }
    return 0;
}

/* The lightning indexer of a CSA layer: keys, queries, head weights, scores and picks of every token. */
static int indexer_all(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int L, int p0, int S, dsv4_probe_sink *probe)
{
    const dsv4_config *f = &c->cfg;
    const dsv4_ref_layer_w *w = &c->lw[L];
    dsv4_ref_layer_state *st = &c->ls[L];
    int D = f->hidden_size, HI = f->index_n_heads, dI = f->index_head_dim, qr = f->q_lora_rank;
    int np = c->n_pairs, topk = f->index_topk > 0 ? f->index_topk : 1;
    dsv4_ref_linear(sc->ikv, sc->xn, w->idx_wkv, S, D, 2 * dI);
    dsv4_ref_linear(sc->ig, sc->xn, w->idx_wgate, S, D, 2 * dI);
    const int ifrom = st->n_ientries;
    int rc = compress_all(c, sc, L, &st->icmp, sc->ikv, sc->ig, w->idx_ape, w->idx_norm, st->ipool, &st->n_ientries,
                          st->pool_cap, p0, S);
    if (rc) return rc;
    if (c->replay)
        replay_entries(c, DSV4_REF_REPLAY_IDX, L, &st->icmp, st->ipool, st->own_ipool, ifrom, st->n_ientries, dI);
    dsv4_ref_linear(sc->qI, sc->qr, w->idx_wq_b, S, qr, HI * dI);
    for (int s = 0; s < S; s++)
        for (int h = 0; h < HI; h++)
            dsv4_ref_rope_apply(sc->qI + ((size_t)s * HI + h) * dI, dI, np, sc->cos_c + (size_t)s * np,
                                sc->sin_c + (size_t)s * np, 0);
    if (c->emu) dsv4_ref_emu_round(sc->qI, (size_t)S * HI * dI); /* emu: o->qI, the indexer queries (bf16) */
    dsv4_ref_linear(sc->wI, sc->xn, w->idx_wproj, S, D, HI);
    int n_pool = st->n_ientries;
    for (int s = 0; s < S; s++) {
        int p = p0 + s;
        int n_vis = dsv4_ref_entries_visible(p, w->ratio);
        int32_t *idx = sc->topk + (size_t)s * topk;
        dsv4_ref_index_scores(sc->iscore, sc->qI + (size_t)s * HI * dI, st->ipool, n_pool, sc->wI + (size_t)s * HI,
                              HI, dI, sc->idots);
        sc->n_topk[s] = dsv4_ref_index_select(sc->iscore, n_pool, n_vis, f->index_topk, idx);
        if (DSV4_FAULT(TOPK_DROP_LAST))
            for (int i = sc->n_topk[s] - 1; i >= 0; i--)
                if (idx[i] >= 0) {
                    idx[i] = -1;
                    dsv4_ref_fault_acted(L, p);
                    break;
                }
        if (dsv4_probe_wants(probe, p)) {
            /* the visible entries only: the sink pads the invisible rest with -inf */
            PROBE("indexer_scores", p, sc->iscore, (size_t)n_vis);
            PROBE_I32("topk_idx", p, idx, (size_t)sc->n_topk[s]);
        }
        /* following: after the probe (the dump records the own picks), the gather reads the dump's */
        const int32_t *row = choice_row(c, DSV4_OPT_FOLLOW_TOPK, L, p, topk);
        if (!row) continue;
        for (int i = sc->n_topk[s]; i < topk; i++) idx[i] = -1; /* the row as wide as the dump's (the gather skips -1) */
        c->fstats.topk_rows++;
        if (dsv4_ref_follow_merge(idx, row, topk, sc->fmerge)) {
            sc->n_topk[s] = topk;
            c->fstats.topk_changed++;
        }
    }
    return 0;
}

/* Attention block of layer L (after the mHC pre): q, kv, compressors, indexer, sink attention, output. */
static int attention_all(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int L, int p0, int S, dsv4_probe_sink *probe)
{
    const dsv4_config *f = &c->cfg;
    const dsv4_ref_layer_w *w = &c->lw[L];
    dsv4_ref_layer_state *st = &c->ls[L];
    int D = f->hidden_size, H = f->num_attention_heads, d = f->head_dim, qr = f->q_lora_rank;
    int np = c->n_pairs, Wn = f->sliding_window, topk = f->index_topk > 0 ? f->index_topk : 1;
    float eps = (float)f->rms_norm_eps;
    int sliding = w->attn == DSV4_ATTN_SLIDING;
    const float *cosv = sliding ? sc->cos_m : sc->cos_c, *sinv = sliding ? sc->sin_m : sc->sin_c;
    int rc;

    /* low-rank query with per-head unweighted norm and RoPE; q_res also feeds the indexer */
    dsv4_ref_linear(sc->qr, sc->xn, w->wq_a, S, D, qr);
    for (int s = 0; s < S; s++) dsv4_ref_rmsnorm(sc->qr + (size_t)s * qr, sc->qr + (size_t)s * qr, w->q_norm, qr, eps);
    if (c->emu) dsv4_ref_emu_round(sc->qr, (size_t)S * qr); /* emu: o->qr_b, input of wq_b and the indexer wq_b */
    dsv4_ref_linear(sc->q, sc->qr, w->wq_b, S, qr, H * d);
    for (int s = 0; s < S; s++)
        for (int h = 0; h < H; h++) {
            float *qh = sc->q + ((size_t)s * H + h) * d;
            dsv4_ref_rmsnorm(qh, qh, NULL, d, eps);
            const int wrong = DSV4_FAULT(ROPE_SIGN) && h >= H / 2; /* a rotation by -angle: none at position 0 */
            if (wrong && p0 + s > 0) dsv4_ref_fault_acted(L, p0 + s);
            dsv4_ref_rope_apply(qh, d, np, cosv + (size_t)s * np, sinv + (size_t)s * np, wrong);
        }
    if (c->emu) dsv4_ref_emu_round(sc->q, (size_t)S * H * d); /* emu: o->q, the attention queries (bf16) */

    /* the one shared key=value vector of each token */
    dsv4_ref_linear(sc->kv, sc->xn, w->wkv, S, D, d);
    for (int s = 0; s < S; s++) {
        float *kv = sc->kv + (size_t)s * d;
        dsv4_ref_rmsnorm(kv, kv, w->kv_norm, d, eps);
        dsv4_ref_rope_apply(kv, d, np, cosv + (size_t)s * np, sinv + (size_t)s * np, 0);
        if (dsv4_probe_wants(probe, p0 + s)) PROBE("kv", p0 + s, kv, d); /* emu: o->kvf, the fp32 copy */
        if (c->replay) /* the candidate's KV is what the window holds from here on */
            memcpy(kv, dsv4_ref_replay_row(c->replay, DSV4_REF_REPLAY_KV, L, p0 + s), (size_t)d * sizeof(float));
        if (c->emu) emu_store_cache(kv, d, L, p0 + s); /* emu: ly->kvc ring slot (bf16 cache), what attention reads */
    }

    if (w->ratio > 0) {
        int width = st->cmp.width, from = st->n_entries;
        dsv4_ref_linear(sc->ckv, sc->xn, w->cmp_wkv, S, D, width);
        dsv4_ref_linear(sc->cg, sc->xn, w->cmp_wgate, S, D, width);
        rc = compress_all(c, sc, L, &st->cmp, sc->ckv, sc->cg, w->cmp_ape, w->cmp_norm, st->pool, &st->n_entries,
                          st->pool_cap, p0, S);
        if (rc) return rc;
        if (c->replay)
            replay_entries(c, DSV4_REF_REPLAY_CMP, L, &st->cmp, st->pool, st->own_pool, from, st->n_entries, d);
    }
    if (w->attn == DSV4_ATTN_CSA && (rc = indexer_all(c, sc, L, p0, S, probe))) return rc;

    for (int s = 0; s < S; s++) {
        int p = p0 + s, m = 0;
        int lo = p - Wn + 1 > 0 ? p - Wn + 1 : 0;
        for (int t = lo; t <= p; t++, m++) {
            const float *src = t >= p0 ? sc->kv + (size_t)(t - p0) * d : st->win + (size_t)(t % Wn) * d;
            memcpy(sc->gather + (size_t)m * d, src, (size_t)d * sizeof(float));
        }
        if (w->attn == DSV4_ATTN_HCA) {
            int nv = dsv4_ref_entries_visible(p, w->ratio);
            memcpy(sc->gather + (size_t)m * d, st->pool, (size_t)nv * d * sizeof(float));
            m += nv;
        } else if (w->attn == DSV4_ATTN_CSA) {
            const int32_t *idx = sc->topk + (size_t)s * topk;
            for (int i = 0; i < sc->n_topk[s]; i++) {
                if (idx[i] < 0) continue;
                memcpy(sc->gather + (size_t)m * d, st->pool + (size_t)idx[i] * d, (size_t)d * sizeof(float));
                m++;
            }
        }
        float *o = sc->o + (size_t)s * H * d;
        const float *sinks = w->sinks;
        if (DSV4_FAULT(SINK_DROPPED)) { /* a sink of -inf adds e^-inf = 0 to the denominator */
            static float no_sinks[DSV4_MAX_HEADS];
            for (int h = 0; h < H; h++) no_sinks[h] = -INFINITY;
            sinks = no_sinks;
            dsv4_ref_fault_acted(L, p);
        }
        if (c->emu) /* emu: the mma kernel's P (bf16) entering P.V */
            dsv4_ref_sink_attention_bf16p(o, sc->q + (size_t)s * H * d, sc->gather, m, sinks, H, d, sc->scores);
        else dsv4_ref_sink_attention(o, sc->q + (size_t)s * H * d, sc->gather, m, w->sinks, H, d, sc->scores);
        for (int h = 0; h < H; h++)
            dsv4_ref_rope_apply(o + (size_t)h * d, d, np, cosv + (size_t)s * np, sinv + (size_t)s * np, 1);
        if (c->emu) dsv4_ref_emu_round(o, (size_t)H * d); /* emu: o->o, the attention output (bf16) */
    }
    for (int s = S - Wn > 0 ? S - Wn : 0; s < S; s++)
        memcpy(st->win + (size_t)((p0 + s) % Wn) * d, sc->kv + (size_t)s * d, (size_t)d * sizeof(float));

    dsv4_ref_grouped_out(sc->aout, sc->z, sc->o, w->wo_a, w->wo_b, S, H, d, f->o_groups, f->o_lora_rank, D);
    if (c->emu) { /* emu: o->z, the grouped projection's output (bf16), then wo_b on the rounded z */
        const int Go = f->o_groups * f->o_lora_rank;
        dsv4_ref_emu_round(sc->z, (size_t)S * Go);
        dsv4_ref_linear(sc->aout, sc->z, w->wo_b, S, Go, D);
    }
    for (int s = 0; s < S; s++)
        if (dsv4_probe_wants(probe, p0 + s)) PROBE("attn_out", p0 + s, sc->aout + (size_t)s * D, D);
    return 0;
}

/* Fault SWIGLU_NOCLAMP: record where the clamp it leaves out would have changed a value (g above the limit, u
 * outside +-limit), for g, u [S, n] of the tokens from position p0. */
static void note_unclamped(int L, int p0, const float *g, const float *u, int S, int n, float limit)
{
    for (int s = 0; s < S; s++)
        for (int i = 0; i < n; i++) {
            const float gi = g[(size_t)s * n + i], ui = u[(size_t)s * n + i];
            if (gi > limit || ui > limit || ui < -limit) {
                dsv4_ref_fault_acted(L, p0 + s);
                break;
            }
        }
}

/* The routed experts of the call, expert by expert: each expert some token routes to is asked for once (lazy
 * weights: dequantised once per call) and applied to every (token, slot) pair routed to it, one token at a time as
 * before; pair p = s·k + j's output goes to sc->eys [p]. Plain: the expert's output; emu (moe_up_kernel's o->h_r):
 * SwiGLU · route weight rounded to bf16 BEFORE w2, so the weight is already in. limit: the SwiGLU clamp. */
static int routed_all(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int L, int p0, int S, float limit)
{
    const dsv4_config *f = &c->cfg;
    int D = f->hidden_size, E = f->n_routed_experts, k = f->num_experts_per_tok, NI = f->moe_intermediate_size;
    for (int e = 0; e < E; e++) {
        const float *w1 = NULL, *w3 = NULL, *w2 = NULL;
        for (int p = 0; p < S * k; p++) {
            if (sc->rids[p] != e) continue;
            if (!w1) DSV4_TRY(dsv4_ref_weights_expert(c, L, e, &w1, &w3, &w2));
            const float *x = sc->xn + (size_t)(p / k) * D;
            float *y = sc->eys + (size_t)p * D;
            if (!c->emu) {
                dsv4_ref_expert(y, x, w1, w3, w2, 1, D, NI, limit, sc->eg, sc->eu);
                continue;
            }
            dsv4_ref_linear(sc->eg, x, w1, 1, D, NI);
            dsv4_ref_linear(sc->eu, x, w3, 1, D, NI);
            if (DSV4_FAULT(SWIGLU_NOCLAMP))
                note_unclamped(L, p0 + p / k, sc->eg, sc->eu, 1, NI, (float)f->swiglu_limit);
            dsv4_ref_swiglu(sc->eg, sc->eg, sc->eu, NI, limit);
            for (int i = 0; i < NI; i++) sc->eg[i] *= sc->rw[p];
            dsv4_ref_emu_round(sc->eg, NI); /* emu: o->h_r row of this (token, expert) (bf16) */
            dsv4_ref_linear(y, sc->eg, w2, 1, NI, D);
            if (DSV4_FAULT(EXPERT_SCALE) && e == 0) {
                for (int i = 0; i < D; i++) y[i] *= dsv4_ref_test_fault_scale;
                dsv4_ref_fault_acted(L, p0 + p / k);
            }
        }
    }
    return 0;
}

/* The experts of moe_all as the optimized path rounds them (emu): the shared SwiGLU output h rounded (o->h_sh), the
 * routed h = SwiGLU · route weight rounded (moe_up_kernel's o->h_r: the weight enters BEFORE the bf16 store), each
 * routed expert's w2 product summed in slot order, then the shared output added (moe_down_kernel). */
static int moe_experts_emu(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int L, int p0, int S, dsv4_probe_sink *probe)
{
    const dsv4_config *f = &c->cfg;
    const dsv4_ref_layer_w *w = &c->lw[L];
    int D = f->hidden_size, k = f->num_experts_per_tok, NI = f->moe_intermediate_size;
    float limit = DSV4_FAULT(SWIGLU_NOCLAMP) ? INFINITY : (float)f->swiglu_limit;
    dsv4_ref_linear(sc->eg, sc->xn, w->sh_w1, S, D, NI);
    dsv4_ref_linear(sc->eu, sc->xn, w->sh_w3, S, D, NI);
    if (DSV4_FAULT(SWIGLU_NOCLAMP)) note_unclamped(L, p0, sc->eg, sc->eu, S, NI, (float)f->swiglu_limit);
    dsv4_ref_swiglu(sc->eg, sc->eg, sc->eu, S * NI, limit);
    dsv4_ref_emu_round(sc->eg, (size_t)S * NI); /* emu: o->h_sh (bf16) */
    dsv4_ref_linear(sc->fout, sc->eg, w->sh_w2, S, NI, D);
    DSV4_TRY(routed_all(c, sc, L, p0, S, limit));
    for (int s = 0; s < S; s++) {
        float *racc = sc->aout + (size_t)s * D, *fo = sc->fout + (size_t)s * D;
        memset(racc, 0, (size_t)D * sizeof(float));
        for (int j = 0; j < k; j++) {
            const float *ey = sc->eys + ((size_t)s * k + j) * D;
            for (int i = 0; i < D; i++) racc[i] += ey[i];
        }
        for (int i = 0; i < D; i++) fo[i] = racc[i] + fo[i];
        if (dsv4_probe_wants(probe, p0 + s)) PROBE("ffn_out", p0 + s, fo, D);
    }
    return 0;
}

/* MoE block of layer L (after the mHC pre): router, routed experts, shared expert. Output in sc->fout. */
static int moe_all(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int L, int p0, const int32_t *tokens, int S,
                   dsv4_probe_sink *probe)
{
    const dsv4_config *f = &c->cfg;
    const dsv4_ref_layer_w *w = &c->lw[L];
    int D = f->hidden_size, E = f->n_routed_experts, k = f->num_experts_per_tok, NI = f->moe_intermediate_size;
    float limit = (float)f->swiglu_limit;
    dsv4_ref_linear(sc->rlogits, sc->xn, w->gate_w, S, D, E);
    for (int s = 0; s < S; s++) {
        const int32_t *hash = w->tid2eid ? w->tid2eid + (size_t)tokens[s] * k : NULL;
        dsv4_ref_route(sc->rlogits + (size_t)s * E, E, k, w->tid2eid ? NULL : w->gate_bias, hash,
                       (float)f->routed_scaling_factor, sc->rids + (size_t)s * k, sc->rw + (size_t)s * k, sc->rs);
        if (dsv4_probe_wants(probe, p0 + s)) {
            PROBE_I32("router_ids", p0 + s, sc->rids + (size_t)s * k, k);
            PROBE("router_weights", p0 + s, sc->rw + (size_t)s * k, k);
        }
        /* following: after the probes, the experts run the dump's ids, weighted by the own scores of those ids
         * (dsv4_ref_route's formula and order, as follow.cu re-weights) */
        const int32_t *row = choice_row(c, DSV4_OPT_FOLLOW_ROUTER, L, p0 + s, k);
        if (!row) continue;
        c->fstats.router_rows++;
        int32_t *ids = sc->rids + (size_t)s * k;
        if (!dsv4_ref_follow_merge(ids, row, k, sc->fmerge)) continue;
        c->fstats.router_changed++;
        const float *lg = sc->rlogits + (size_t)s * E;
        float *wt = sc->rw + (size_t)s * k, sum = 0.0f;
        for (int j = 0; j < k; j++) {
            wt[j] = dsv4_ref_sqrtsoftplus(lg[ids[j]]);
            sum += wt[j];
        }
        for (int j = 0; j < k; j++) wt[j] = wt[j] / (sum + 1e-20f) * (float)f->routed_scaling_factor;
    }
    if (c->emu) return moe_experts_emu(c, sc, L, p0, S, probe);
    /* shared expert over all tokens at once, into fout */
    dsv4_ref_expert(sc->fout, sc->xn, w->sh_w1, w->sh_w3, w->sh_w2, S, D, NI, limit, sc->eg,
                    sc->eu);
    /* routed experts (each (token, slot)'s output in eys); the routed sum (aout, free after the attention's mHC
     * post) is formed per token in slot order and the shared output added last, as transformers does */
    DSV4_TRY(routed_all(c, sc, L, p0, S, limit));
    for (int s = 0; s < S; s++) {
        float *racc = sc->aout + (size_t)s * D, *fo = sc->fout + (size_t)s * D;
        memset(racc, 0, (size_t)D * sizeof(float));
        for (int j = 0; j < k; j++) {
            const float *ey = sc->eys + ((size_t)s * k + j) * D;
            float wt = sc->rw[(size_t)s * k + j];
            for (int i = 0; i < D; i++) racc[i] += ey[i] * wt;
        }
        for (int i = 0; i < D; i++) fo[i] = racc[i] + fo[i];
        if (dsv4_probe_wants(probe, p0 + s)) PROBE("ffn_out", p0 + s, fo, D);
    }
    return 0;
}

static int layer_forward(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int L, int p0, const int32_t *tokens, int S,
                         dsv4_probe_sink *probe)
{
    DSV4_TRY(dsv4_ref_weights_layer(c, L)); /* lazy: the layer's dense tensors dequantised now, once per call */
    const dsv4_ref_layer_w *w = &c->lw[L];
    int n = c->cfg.hc_mult, D = c->cfg.hidden_size;
    /* replay: the layer starts from the candidate's streams (layer 0 from the embedding, as the candidate's) */
    if (c->replay && L > 0) replay_rows(c, DSV4_REF_REPLAY_OUT, L - 1, p0, S, sc->X, (size_t)n * D, (size_t)n * D);
    int rc = mhc_pre_all(c, sc, L, &w->hc_attn, w->attn_norm, p0, S, 1, probe);
    if (rc || (rc = attention_all(c, sc, L, p0, S, probe))) return rc;
    if (c->replay) { /* the streams between the sublayers: the candidate's attention output, post and comb */
        replay_rows(c, DSV4_REF_REPLAY_ATTN_OUT, L, p0, S, sc->aout, (size_t)D, (size_t)D);
        replay_rows(c, DSV4_REF_REPLAY_HC_POST, L, p0, S, sc->post, (size_t)n, (size_t)n);
        replay_rows(c, DSV4_REF_REPLAY_HC_COMB, L, p0, S, sc->comb, (size_t)n * n, (size_t)n * n);
    }
    mhc_post_all(c, sc, sc->aout, S);
    if ((rc = mhc_pre_all(c, sc, L, &w->hc_ffn, w->ffn_norm, p0, S, 0, probe))) return rc;
    if ((rc = moe_all(c, sc, L, p0, tokens, S, probe))) return rc;
    mhc_post_all(c, sc, sc->fout, S);
    for (int s = 0; s < S; s++)
        if (dsv4_probe_wants(probe, p0 + s)) PROBE("out", p0 + s, sc->X + (size_t)s * n * D, (size_t)n * D);
    return 0;
}

int dsv4_ref_cpu_forward_scratch(dsv4_ref_cpu *c, dsv4_ref_scratch *sc, int p0, const int32_t *tokens, int S,
                                 dsv4_probe_sink *probe, float *logits_last)
{
    const dsv4_config *f = &c->cfg;
    int n = f->hc_mult, D = f->hidden_size, V = f->vocab_size, np = c->n_pairs;
    DSV4_CHECK(S >= 1 && S <= sc->S, "reference: %d tokens for a scratch of %d", S, sc->S);
    for (int s = 0; s < S; s++)
        DSV4_CHECK(tokens[s] >= 0 && tokens[s] < V, "reference: token %d at position %d outside [0, %d)", tokens[s],
                   p0 + s, V);
    for (int s = 0; s < S; s++) {
        const float *row;
        DSV4_TRY(dsv4_ref_weights_embed(c, tokens[s], &row));
        for (int j = 0; j < n; j++)
            memcpy(sc->X + ((size_t)s * n + j) * D, row, (size_t)D * sizeof(float));
        dsv4_ref_rope_cos_sin(c->inv_main, np, p0 + s, sc->cos_m + (size_t)s * np, sc->sin_m + (size_t)s * np);
        dsv4_ref_rope_cos_sin(c->inv_cmp, np, p0 + s, sc->cos_c + (size_t)s * np, sc->sin_c + (size_t)s * np);
    }
    if (c->replay) { /* the candidate's state belongs to its tokens: another token is a caller's mistake */
        int nt;
        const int32_t *rt = dsv4_ref_replay_tokens(c->replay, &nt);
        for (int s = 0; s < S; s++)
            if (p0 + s >= nt || rt[p0 + s] != tokens[s])
                return dsv4_error(DSV4_ERR_USAGE, "replay of %s: position %d is not the candidate's token (%d, "
                                  "candidate %d)", dsv4_ref_replay_path(c->replay), p0 + s, tokens[s],
                                  p0 + s < nt ? rt[p0 + s] : -1);
    }
    if (c->follow) { /* following stops for good at the first position whose token is not the dump's */
        int nt;
        const int32_t *ft = dsv4_opt_follow_tokens(c->follow, &nt);
        for (int s = 0; s < S && c->follow_stop < 0; s++)
            if (p0 + s >= nt || ft[p0 + s] != tokens[s]) c->follow_stop = c->fstats.stopped_at = p0 + s;
    }
    for (int L = 0; L < f->num_hidden_layers; L++) {
        int rc = layer_forward(c, sc, L, p0, tokens, S, probe);
        if (rc) return rc;
        if (c->layer_progress) c->layer_progress(c->progress_ctx, L + 1, f->num_hidden_layers);
    }
    if (c->replay) /* the head on the candidate's last streams */
        replay_rows(c, DSV4_REF_REPLAY_OUT, f->num_hidden_layers - 1, p0, S, sc->X, (size_t)n * D, (size_t)n * D);
    const int L = -1; /* the PROBE macros' layer: /final */
    const float *head = NULL; /* asked for at the first position that needs logits: once per call */
    for (int s = 0; s < S; s++) {
        int p = p0 + s, want = dsv4_probe_wants(probe, p), last = s == S - 1 && logits_last;
        if (!want && !last) continue;
        if (!head) DSV4_TRY(dsv4_ref_weights_head(c, &head));
        dsv4_ref_hc_head(c->hc_head_fn, c->hc_head_base, c->hc_head_scale, sc->X + (size_t)s * n * D, n, D,
                         (float)f->hc_eps, (float)f->rms_norm_eps, sc->y, sc->vn);
        if (want) PROBE("hc_head", p, sc->y, D);
        dsv4_ref_rmsnorm(sc->y, sc->y, c->norm, D, (float)f->rms_norm_eps);
        if (c->emu) dsv4_ref_emu_round(sc->y, D); /* emu: o->xn of the head, the logits GEMM input (bf16) */
        if (want) PROBE("norm", p, sc->y, D);
        dsv4_ref_linear(sc->logits, sc->y, head, 1, D, V);
        if (want) PROBE("logits", p, sc->logits, V);
        if (last) memcpy(logits_last, sc->logits, (size_t)V * sizeof(float));
    }
    return 0;
}
