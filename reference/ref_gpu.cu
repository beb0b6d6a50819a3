/* ref_gpu.cu - the GPU fp32 reference (issue 5 item 3; model-spec §4-§12): the same math as the CPU reference
 * (ref_forward.c) on one GPU, behind the device-neutral dsv4_ref object of ref_model.h. cuBLAS SGEMM for every
 * linear (batched over the call's tokens), the kernels of ref_gpu_ops.cu / ref_gpu_attn.cu for the rest; the
 * arenas below are set up by ref_gpu_init.cu (types in ref_gpu_model.cuh).
 *
 * Layout: the weights resident in one device arena (uploaded once from the loader's f32 view) or streamed a part at
 * a time through slots in their on-disk formats and dequantised on the GPU (ref_gpu_stream.cu: a layer's views are
 * valid while it is the loaded layer; the step asks ref_gpu_weights_* for each), one arena for the decode state
 * (window rings, compressor states, compressed pools, indexer key pools; sized by max_tokens), one for the
 * scratch of a call of up to chunk tokens (allocated at init, so a decode step allocates nothing). A prefill
 * longer than the chunk runs as consecutive calls: the forward of n tokens at p0 is exact for any p0 given
 * the state (the window keys older than the call come from the ring, the compressors are state machines, the
 * indexer's valid picks do not depend on the pool's future entries).
 *
 * Invariants that fail quietly (the CPU's, ref_forward.c):
 * - The ring is written after the call's attention; compressed entries are emitted before it.
 * - Sliding layers use the main RoPE table; CSA/HCA layers the compress table (q, window kv, entries, indexer).
 * - Probes are copied back only for stored positions (dsv4_probe_wants), with the CPU's row lengths (the
 *   indexer scores of the visible entries only, k = min(index_topk, pool) picks).
 * - The MoE groups the call's (token, expert) pairs by expert on the host: the routing ids come back once
 *   per layer; each routed expert then runs on its rows (w1, w3, SwiGLU, w2), one expert after the other (its
 *   weights fetched once, streamed or not); the sum over a token's experts is formed in its routing order, then the
 *   shared expert added. The per-row kernels (SwiGLU, the emulation's scaled rounding) give the same values on an
 *   expert's rows as on all rows at once.
 * - Options (dsv4_ref_options, ref_gpu_emu.cu): with g->emu every value the CPU emulation rounds is rounded at the
 *   same place (each site marked "emu:" as in ref_forward.c; probes taken where the CPU takes them, kv before its
 *   rounding, norm after); with g->follow the own picks are probed, then the dump's rows merged in. With neither
 *   set not one kernel differs from the plain reference (the emulated attention and MoE sum are kernels of their
 *   own, the plain ones untouched).
 * - Layer-local replay (g->replay; ref_replay.c, docs/verify.md "Layer-local replay"): the candidate's rows are
 *   uploaded where the CPU injects them (ref_forward.c), from the one data model both references share: the streams
 *   at each layer's start and before the head, the window KV after the own kv is probed, each compressor's new
 *   entries after the judged ones are kept in own_pool / own_ipool, the top-k and router rows through following's
 *   merge, the attention output with post / comb before the mid-layer mHC post. dsv4_ref_replay_run runs the
 *   segments, gpu_replay_seek setting the pools before each.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ref_gpu_model.cuh"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* -------------------------------------------------------------------------------------------- probes */
/* Copy the rows [S, row_len] of the stored positions back and hand each to the sink. */
static int probe_rows(dsv4_ref_gpu *g, dsv4_probe_sink *probe, int L, const char *name, const float *dev,
                      size_t row_len, int p0, int S)
{
    int s0 = -1, s1 = -1;
    for (int s = 0; s < S; s++)
        if (dsv4_probe_wants(probe, p0 + s)) {
            if (s0 < 0) s0 = s;
            s1 = s;
        }
    if (s0 < 0) return 0;
    size_t n = (size_t)(s1 - s0 + 1) * row_len;
    if (n > g->host_floats) return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: probe %s needs %zu staging floats", name, n);
    DSV4_REF_CUDA_CHECK(cudaMemcpy(g->host, dev + (size_t)s0 * row_len, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int s = s0; s <= s1; s++) {
        if (!dsv4_probe_wants(probe, p0 + s)) continue;
        int rc = dsv4_probe(probe, L, name, p0 + s, g->host + (size_t)(s - s0) * row_len, row_len);
        if (rc) return rc;
    }
    return 0;
}

/* int rows [S, stride] of which the first n per row are probed. */
static int probe_rows_i32(dsv4_ref_gpu *g, dsv4_probe_sink *probe, int L, const char *name, const int32_t *dev,
                          size_t stride, size_t n_each, int p0, int S)
{
    int s0 = -1, s1 = -1;
    for (int s = 0; s < S; s++)
        if (dsv4_probe_wants(probe, p0 + s)) {
            if (s0 < 0) s0 = s;
            s1 = s;
        }
    if (s0 < 0) return 0;
    size_t n = (size_t)(s1 - s0 + 1) * stride;
    if (n > g->host_floats) return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: probe %s needs %zu staging words", name, n);
    int32_t *h = (int32_t *)(void *)g->host;
    if (n_each > 0)
        DSV4_REF_CUDA_CHECK(cudaMemcpy(h, dev + (size_t)s0 * stride, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (int s = s0; s <= s1; s++) {
        if (!dsv4_probe_wants(probe, p0 + s)) continue;
        int rc = dsv4_probe_i32(probe, L, name, p0 + s, h + (size_t)(s - s0) * stride, n_each);
        if (rc) return rc;
    }
    return 0;
}

/* --------------------------------------------------------------------------------------------- replay */
/* Layer-local replay (g->replay; ref_replay.c, the CPU's sites in ref_forward.c): the candidate's rows [S, width] of
 * `kind` at layer L from position p0 into dev (consecutive rows: the positions of one segment). */
static int replay_upload(dsv4_ref_gpu *g, dsv4_ref_replay_kind kind, int L, int p0, int S, float *dev, size_t width)
{
    const void *rows = dsv4_ref_replay_rows_at(g->replay, kind, L, p0, S);
    if (!rows)
        return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: replay of %s: layer %d lacks rows at positions %d..%d",
                          dsv4_ref_replay_path(g->replay), L, p0, p0 + S - 1);
    DSV4_REF_CUDA_CHECK(cudaMemcpy(dev, rows, (size_t)S * width * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

/* Replay: the candidate's entries [w0, w0+n) of kind at layer L into pool rows w0.. (width floats each). */
static int replay_upload_entries(dsv4_ref_gpu *g, dsv4_ref_replay_kind kind, int L, float *pool, int w0, int n,
                                 size_t width)
{
    const void *rows = dsv4_ref_replay_rows_at(g->replay, kind, L, w0, n);
    if (!rows)
        return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: replay of %s: layer %d lacks entries %d..%d",
                          dsv4_ref_replay_path(g->replay), L, w0, w0 + n - 1);
    DSV4_REF_CUDA_CHECK(cudaMemcpy(pool + (size_t)w0 * width, rows, (size_t)n * width * sizeof(float),
                                   cudaMemcpyHostToDevice));
    return 0;
}

/* Replay: of the entries [from, to) a compressor just made in pool, the judged ones go to own (what the dump shows),
 * then the candidate's take their place in the pool (what the layer reads from now on). */
static int replay_entries(dsv4_ref_gpu *g, dsv4_ref_replay_kind kind, int L, const dsv4_ref_gpu_compressor *c,
                          float *pool, float *own, int from, int to)
{
    const size_t width = (size_t)c->d_c;
    for (int w = from; w < to;) { /* runs of judged entries, one copy each */
        int e = w;
        while (e < to && dsv4_ref_replay_entry_judged(g->replay, c->ratio, c->overlap, e)) e++;
        if (e > w)
            DSV4_REF_CUDA_CHECK(cudaMemcpy(own + (size_t)w * width, pool + (size_t)w * width,
                                           (size_t)(e - w) * width * sizeof(float), cudaMemcpyDeviceToDevice));
        w = e > w ? e : w + 1;
    }
    return to > from ? replay_upload_entries(g, kind, L, pool, from, to - from, width) : 0;
}

/* --------------------------------------------------------------------------------------------- forward */
/* mHC pre of the call's tokens and the site's RMSNorm into sc->xn; probes <site>_hc_* and <site>_in. */
static int mhc_pre(dsv4_ref_gpu *g, int L, const gpu_hc *hp, const float *norm_w, int p0, int S, int attn_site,
                   dsv4_probe_sink *probe)
{
    const dsv4_config *f = &g->cfg;
    gpu_scratch *sc = &g->sc;
    int n = f->hc_mult, D = f->hidden_size;
    float eps = (float)f->rms_norm_eps;
    DSV4_TRY(dsv4_ref_gpu_rmsnorm(sc->vn, sc->X, NULL, S, n * D, eps));
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->mix, sc->vn, hp->fn, S, n * D, (2 + n) * n));
    DSV4_TRY(dsv4_ref_gpu_hc_coeff(sc->mix, hp->base, hp->scale, S, n, f->hc_sinkhorn_iters, (float)f->hc_eps, sc->pre,
                              sc->post, sc->comb));
    DSV4_TRY(dsv4_ref_gpu_hc_collapse(sc->xa, sc->X, sc->pre, S, n, D));
    DSV4_TRY(dsv4_ref_gpu_rmsnorm(sc->xn, sc->xa, norm_w, S, D, eps));
    if (g->emu) DSV4_TRY(dsv4_ref_gpu_emu_round(sc->xn, (size_t)S * D)); /* emu: o->xn, the GEMM input */
    if (!probe) return 0;
    DSV4_TRY(probe_rows(g, probe, L, attn_site ? "attn_hc_pre" : "ffn_hc_pre", sc->pre, n, p0, S));
    DSV4_TRY(probe_rows(g, probe, L, attn_site ? "attn_hc_post" : "ffn_hc_post", sc->post, n, p0, S));
    DSV4_TRY(probe_rows(g, probe, L, attn_site ? "attn_hc_comb" : "ffn_hc_comb", sc->comb, (size_t)n * n, p0, S));
    DSV4_TRY(probe_rows(g, probe, L, attn_site ? "attn_in" : "ffn_in", sc->xa, D, p0, S));
    return 0;
}

/* X ← post ⊗ out + combᵀ X through the double buffer. */
static int mhc_post(dsv4_ref_gpu *g, const float *out, int S)
{
    gpu_scratch *sc = &g->sc;
    DSV4_TRY(dsv4_ref_gpu_hc_post(sc->X2, sc->X, out, sc->post, sc->comb, S, g->cfg.hc_mult, g->cfg.hidden_size));
    if (g->emu) /* emu: o->X, the residual streams */
        DSV4_TRY(dsv4_ref_gpu_emu_round(sc->X2, (size_t)S * g->cfg.hc_mult * g->cfg.hidden_size));
    float *t = sc->X;
    sc->X = sc->X2;
    sc->X2 = t;
    return 0;
}

/* Push the call's tokens through a compressor; finished entries (norm + RoPE at r·w) land in pool. */
static int compress(dsv4_ref_gpu *g, dsv4_ref_gpu_compressor *c, const float *kvp, const float *gp, const float *ape,
                    const float *norm_w, float *pool, int *n_entries, int cap, int p0, int S)
{
    int r = c->ratio;
    int w0 = p0 / r, n_new = (p0 + S) / r - p0 / r; /* windows closing at p with (p+1) mod r == 0 */
    if (n_new > 0 && (w0 != *n_entries || w0 + n_new > cap))
        return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: compressed entries %d..%d out of order or past capacity %d "
                          "(have %d)", w0, w0 + n_new - 1, cap, *n_entries);
    DSV4_TRY(dsv4_ref_gpu_compressor_run(c, kvp, gp, ape, p0, S, pool));
    DSV4_TRY(dsv4_ref_gpu_compressor_finish(pool, w0, n_new, c->d_c, norm_w, (float)g->cfg.rms_norm_eps, g->inv_cmp,
                                       g->n_pairs, r));
    if (g->emu && n_new > 0) /* emu: ly->kvc rows W + w / ly->ipool (bf16 caches) */
        DSV4_TRY(dsv4_ref_gpu_emu_round(pool + (size_t)w0 * c->d_c, (size_t)n_new * c->d_c));
    if (n_new > 0) *n_entries = w0 + n_new;
    return 0;
}

/* The lightning indexer of a CSA layer: keys, queries, head weights, scores and picks of every token. */
static int indexer(dsv4_ref_gpu *g, int L, int p0, int S, dsv4_probe_sink *probe)
{
    const dsv4_config *f = &g->cfg;
    gpu_layer *w = &g->lw[L];
    gpu_scratch *sc = &g->sc;
    int D = f->hidden_size, HI = f->index_n_heads, dI = f->index_head_dim, qr = f->q_lora_rank;
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->ikv, sc->xn, w->idx_wkv, S, D, 2 * dI));
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->ig, sc->xn, w->idx_wgate, S, D, 2 * dI));
    const int ifrom = w->n_ientries;
    DSV4_TRY(compress(g, &w->icmp, sc->ikv, sc->ig, w->idx_ape, w->idx_norm, w->ipool, &w->n_ientries, w->pool_cap, p0,
                 S));
    if (g->replay)
        DSV4_TRY(replay_entries(g, DSV4_REF_REPLAY_IDX, L, &w->icmp, w->ipool, w->own_ipool, ifrom, w->n_ientries));
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->qI, sc->qr, w->idx_wq_b, S, qr, HI * dI));
    DSV4_TRY(dsv4_ref_gpu_rope(sc->qI, S, HI, dI, g->n_pairs, sc->cos_c, sc->sin_c, 0));
    if (g->emu) DSV4_TRY(dsv4_ref_gpu_emu_round(sc->qI, (size_t)S * HI * dI)); /* emu: o->qI, the indexer queries */
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->wI, sc->xn, w->idx_wproj, S, D, HI));
    int n_pool = w->n_ientries;
    int k = f->index_topk < n_pool ? f->index_topk : n_pool;
    if (k < 0) k = 0;
    int iq = n_pool > 0 ? (int)(ISCORE_FLOATS / (size_t)n_pool) : S;
    if (iq > g->iq) iq = g->iq;
    if (iq < 1) iq = 1;
    for (int s0 = 0; s0 < S; s0 += iq) {
        int ns = S - s0 < iq ? S - s0 : iq;
        if (n_pool > 0) {
            DSV4_TRY(dsv4_ref_gpu_index_scores(sc->iscore, sc->qI + (size_t)s0 * HI * dI, w->ipool,
                                          sc->wI + (size_t)s0 * HI, ns, n_pool, HI, dI));
            DSV4_TRY(dsv4_ref_gpu_index_select(sc->topk + (size_t)s0 * g->topk, g->topk, sc->iscore, ns, n_pool,
                                          (int64_t)p0 + s0, w->ratio, k));
        }
        if (!probe) continue;
        /* the visible entries of each stored row only: the sink pads the invisible rest with -inf */
        for (int s = s0; s < s0 + ns; s++) {
            int p = p0 + s;
            if (!dsv4_probe_wants(probe, p)) continue;
            int n_vis = dsv4_ref_entries_visible(p, w->ratio);
            if (n_vis > n_pool) n_vis = n_pool;
            if (n_vis > 0)
                DSV4_REF_CUDA_CHECK(cudaMemcpy(g->host, sc->iscore + (size_t)(s - s0) * n_pool,
                                               (size_t)n_vis * sizeof(float), cudaMemcpyDeviceToHost));
            DSV4_TRY(dsv4_probe(probe, L, "indexer_scores", p, g->host, (size_t)n_vis));
        }
    }
    if (probe) DSV4_TRY(probe_rows_i32(g, probe, L, "topk_idx", sc->topk, g->topk, (size_t)k, p0, S));
    /* following: after the probe (the dump records the own picks), the attention reads the dump's */
    return g->follow || g->replay ? ref_gpu_follow_topk(g, L, p0, S, k) : k;
}

/* Attention block of layer L (after the mHC pre): q, kv, compressors, indexer, sink attention, output. */
static int attention(dsv4_ref_gpu *g, int L, int p0, int S, dsv4_probe_sink *probe)
{
    const dsv4_config *f = &g->cfg;
    gpu_layer *w = &g->lw[L];
    gpu_scratch *sc = &g->sc;
    int D = f->hidden_size, H = f->num_attention_heads, d = f->head_dim, qr = f->q_lora_rank;
    int np = g->n_pairs, Wn = f->sliding_window;
    float eps = (float)f->rms_norm_eps;
    int sliding = w->attn == DSV4_ATTN_SLIDING;
    const float *cosv = sliding ? sc->cos_m : sc->cos_c, *sinv = sliding ? sc->sin_m : sc->sin_c;

    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->qr, sc->xn, w->wq_a, S, D, qr));
    DSV4_TRY(dsv4_ref_gpu_rmsnorm(sc->qr, sc->qr, w->q_norm, S, qr, eps));
    if (g->emu) DSV4_TRY(dsv4_ref_gpu_emu_round(sc->qr, (size_t)S * qr)); /* emu: o->qr_b, input of both wq_b */
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->q, sc->qr, w->wq_b, S, qr, H * d));
    DSV4_TRY(dsv4_ref_gpu_rmsnorm(sc->q, sc->q, NULL, S * H, d, eps));
    DSV4_TRY(dsv4_ref_gpu_rope(sc->q, S, H, d, np, cosv, sinv, 0));
    if (g->emu) DSV4_TRY(dsv4_ref_gpu_emu_round(sc->q, (size_t)S * H * d)); /* emu: o->q, the attention queries */

    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->kv, sc->xn, w->wkv, S, D, d));
    DSV4_TRY(dsv4_ref_gpu_rmsnorm(sc->kv, sc->kv, w->kv_norm, S, d, eps));
    DSV4_TRY(dsv4_ref_gpu_rope(sc->kv, S, 1, d, np, cosv, sinv, 0));
    if (probe) DSV4_TRY(probe_rows(g, probe, L, "kv", sc->kv, d, p0, S)); /* emu: o->kvf, the fp32 copy */
    if (g->replay) /* the candidate's KV is what the window holds from here on */
        DSV4_TRY(replay_upload(g, DSV4_REF_REPLAY_KV, L, p0, S, sc->kv, (size_t)d));
    if (g->emu) DSV4_TRY(dsv4_ref_gpu_emu_round(sc->kv, (size_t)S * d)); /* emu: ly->kvc ring slot (attention's) */

    if (w->ratio > 0) {
        int width = w->cmp.width;
        DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->ckv, sc->xn, w->cmp_wkv, S, D, width));
        DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->cg, sc->xn, w->cmp_wgate, S, D, width));
        const int from = w->n_entries;
        DSV4_TRY(compress(g, &w->cmp, sc->ckv, sc->cg, w->cmp_ape, w->cmp_norm, w->pool, &w->n_entries, w->pool_cap, p0,
                     S));
        if (g->replay)
            DSV4_TRY(replay_entries(g, DSV4_REF_REPLAY_CMP, L, &w->cmp, w->pool, w->own_pool, from, w->n_entries));
    }
    int n_topk = 0;
    if (w->attn == DSV4_ATTN_CSA) {
        n_topk = indexer(g, L, p0, S, probe);
        if (n_topk < 0) return n_topk;
    }

    dsv4_ref_gpu_attn_params ap;
    memset(&ap, 0, sizeof ap);
    ap.o = sc->o;
    ap.q = sc->q;
    ap.kv = sc->kv;
    ap.ring = w->win;
    ap.pool = w->ratio > 0 ? w->pool : NULL;
    ap.topk = w->attn == DSV4_ATTN_CSA ? sc->topk : NULL;
    ap.topk_stride = g->topk;
    ap.n_topk = n_topk;
    ap.sinks = w->sinks;
    ap.cos_t = cosv;
    ap.sin_t = sinv;
    ap.S = S;
    ap.H = H;
    ap.d = d;
    ap.n_pairs = np;
    ap.window = Wn;
    ap.ratio = w->ratio;
    ap.p0 = p0;
    ap.m_max = g->m_max;
    ap.bf16p = g->emu; /* emu: the mma kernel's P (bf16) entering P.V */
    DSV4_TRY(dsv4_ref_gpu_attention(&ap));
    if (g->emu) DSV4_TRY(dsv4_ref_gpu_emu_round(sc->o, (size_t)S * H * d)); /* emu: o->o, the attention output */
    int first = S - Wn > 0 ? S - Wn : 0;
    DSV4_TRY(dsv4_ref_gpu_ring_write(w->win, Wn, sc->kv + (size_t)first * d, (int64_t)p0 + first, S - first, d));

    int gin = H * d / f->o_groups;
    DSV4_TRY(dsv4_ref_gpu_grouped_out(g->blas, sc->aout, sc->z, sc->o, w->wo_a, w->wo_b, S, gin, f->o_groups,
                                 f->o_lora_rank, D));
    if (g->emu) { /* emu: o->z, the grouped projection's output (bf16), then wo_b on the rounded z */
        const int Go = f->o_groups * f->o_lora_rank;
        DSV4_TRY(dsv4_ref_gpu_emu_round(sc->z, (size_t)S * Go));
        DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->aout, sc->z, w->wo_b, S, Go, D));
    }
    if (probe) DSV4_TRY(probe_rows(g, probe, L, "attn_out", sc->aout, D, p0, S));
    return 0;
}

/* MoE block of layer L (after the mHC pre): router, shared expert, routed experts grouped by expert. */
static int moe(dsv4_ref_gpu *g, int L, int p0, int S, dsv4_probe_sink *probe)
{
    const dsv4_config *f = &g->cfg;
    gpu_layer *w = &g->lw[L];
    gpu_scratch *sc = &g->sc;
    int D = f->hidden_size, E = f->n_routed_experts, k = f->num_experts_per_tok, NI = f->moe_intermediate_size;
    float limit = (float)f->swiglu_limit;
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->rlogits, sc->xn, w->gate_w, S, D, E));
    int hash = w->mlp == DSV4_MLP_HASH_MOE;
    DSV4_TRY(dsv4_ref_gpu_route(sc->rlogits, S, E, k, hash ? NULL : w->gate_bias, w->tid2eid, sc->tokens,
                           (float)f->routed_scaling_factor, sc->rids, sc->rw, sc->rsbuf));
    if (probe) {
        DSV4_TRY(probe_rows_i32(g, probe, L, "router_ids", sc->rids, k, k, p0, S));
        DSV4_TRY(probe_rows(g, probe, L, "router_weights", sc->rw, k, p0, S));
    }

    /* group the (token, expert) pairs by expert: slot_of[s·k + j] = row of that pair in xg / yg */
    size_t nk = (size_t)S * k;
    DSV4_REF_CUDA_CHECK(cudaMemcpy(g->h_rids, sc->rids, nk * sizeof(int32_t), cudaMemcpyDeviceToHost));
    /* following: after the probes, the experts run the dump's ids, weighted by the own scores of those ids */
    if (g->follow || g->replay) DSV4_TRY(ref_gpu_follow_router(g, L, p0, S));
    int32_t *count = g->h_count, *start = g->h_count + E;
    memset(count, 0, (size_t)E * sizeof(int32_t));
    for (size_t i = 0; i < nk; i++) {
        int e = g->h_rids[i];
        if (e < 0 || e >= E) return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: layer %d routed to expert %d", L, e);
        count[e]++;
    }
    int n_ex = 0; /* the experts some pair routes to, ascending */
    for (int e = 0, acc = 0; e < E; e++) {
        start[e] = acc;
        acc += count[e];
        if (count[e]) g->h_ex[n_ex++] = e;
        count[e] = 0;
    }
    for (size_t i = 0; i < nk; i++) {
        int e = g->h_rids[i];
        int slot = start[e] + count[e]++;
        g->h_slot_of[i] = slot;
        g->h_row_tok[slot] = (int32_t)(i / k);
        g->h_pair_of[slot] = (int32_t)i;
    }
    DSV4_TRY(ref_gpu_weights_experts_begin(g, L, g->h_ex, n_ex)); /* streamed: the first expert's copy starts */
    DSV4_REF_CUDA_CHECK(cudaMemcpy(sc->slot_of, g->h_slot_of, nk * sizeof(int32_t), cudaMemcpyHostToDevice));
    DSV4_REF_CUDA_CHECK(cudaMemcpy(sc->row_tok, g->h_row_tok, nk * sizeof(int32_t), cudaMemcpyHostToDevice));
    DSV4_TRY(dsv4_ref_gpu_gather_rows(sc->xg, sc->xn, sc->row_tok, (int)nk, D));
    if (g->emu) { /* each grouped row's route weight, for its expert's scaled rounding */
        DSV4_REF_CUDA_CHECK(cudaMemcpy(sc->pair_of, g->h_pair_of, nk * sizeof(int32_t), cudaMemcpyHostToDevice));
        DSV4_TRY(dsv4_ref_gpu_gather_rows(sc->wslot, sc->rw, sc->pair_of, (int)nk, 1));
    }
    /* shared expert over all tokens, into fout */
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->eg, sc->xn, w->sh_w1, S, D, NI));
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->eu, sc->xn, w->sh_w3, S, D, NI));
    DSV4_TRY(dsv4_ref_gpu_swiglu(sc->eg, sc->eg, sc->eu, (size_t)S * NI, limit));
    if (g->emu) DSV4_TRY(dsv4_ref_gpu_emu_round(sc->eg, (size_t)S * NI)); /* emu: o->h_sh */
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->fout, sc->eg, w->sh_w2, S, NI, D));
    /* the routed experts, one after the other on their rows r0 .. r0+c-1 of xg / eg / eu / yg */
    for (int j = 0; j < n_ex; j++) {
        const int e = g->h_ex[j], c = count[e];
        const size_t r0 = start[e];
        const float *w1, *w3, *w2;
        DSV4_TRY(ref_gpu_weights_expert(g, L, g->h_ex, n_ex, j, &w1, &w3, &w2));
        float *eg = sc->eg + r0 * NI, *eu = sc->eu + r0 * NI;
        DSV4_TRY(dsv4_ref_gpu_linear(g->blas, eg, sc->xg + r0 * D, w1, c, D, NI));
        DSV4_TRY(dsv4_ref_gpu_linear(g->blas, eu, sc->xg + r0 * D, w3, c, D, NI));
        DSV4_TRY(dsv4_ref_gpu_swiglu(eg, eg, eu, (size_t)c * NI, limit));
        if (g->emu) /* emu: o->h_r, the route weight entering BEFORE the bf16 store */
            DSV4_TRY(dsv4_ref_gpu_moe_scale_round(eg, sc->ident, sc->wslot + r0, c, NI));
        DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->yg + r0 * D, eg, w2, c, NI, D));
    }
    if (g->emu) DSV4_TRY(dsv4_ref_gpu_moe_sum(sc->fout, sc->yg, sc->slot_of, S, k, D)); /* moe_down_kernel's order */
    else DSV4_TRY(dsv4_ref_gpu_moe_combine(sc->fout, sc->yg, sc->slot_of, sc->rw, S, k, D));
    if (probe) DSV4_TRY(probe_rows(g, probe, L, "ffn_out", sc->fout, D, p0, S));
    return 0;
}

static int layer_forward(dsv4_ref_gpu *g, int L, int p0, int S, dsv4_probe_sink *probe)
{
    gpu_layer *w = &g->lw[L];
    gpu_scratch *sc = &g->sc;
    DSV4_TRY(ref_gpu_weights_layer(g, L)); /* streamed: the layer's dense tensors, dequantised into the arena */
    const int n = g->cfg.hc_mult, D = g->cfg.hidden_size;
    /* replay: the layer starts from the candidate's streams (layer 0 from the embedding, as the candidate's) */
    if (g->replay && L > 0) DSV4_TRY(replay_upload(g, DSV4_REF_REPLAY_OUT, L - 1, p0, S, sc->X, (size_t)n * D));
    DSV4_TRY(mhc_pre(g, L, &w->hc_attn, w->attn_norm, p0, S, 1, probe));
    DSV4_TRY(attention(g, L, p0, S, probe));
    if (g->replay) { /* the streams between the sublayers: the candidate's attention output, post and comb */
        DSV4_TRY(replay_upload(g, DSV4_REF_REPLAY_ATTN_OUT, L, p0, S, sc->aout, (size_t)D));
        DSV4_TRY(replay_upload(g, DSV4_REF_REPLAY_HC_POST, L, p0, S, sc->post, (size_t)n));
        DSV4_TRY(replay_upload(g, DSV4_REF_REPLAY_HC_COMB, L, p0, S, sc->comb, (size_t)n * n));
    }
    DSV4_TRY(mhc_post(g, sc->aout, S));
    DSV4_TRY(mhc_pre(g, L, &w->hc_ffn, w->ffn_norm, p0, S, 0, probe));
    DSV4_TRY(moe(g, L, p0, S, probe));
    DSV4_TRY(mhc_post(g, sc->fout, S));
    if (probe) DSV4_TRY(probe_rows(g, probe, L, "out", sc->X, (size_t)n * D, p0, S));
    return 0;
}

/* hc_head, final norm and the logits of the stored rows (and of the last row when logits_last is set). */
static int head_forward(dsv4_ref_gpu *g, int p0, int S, dsv4_probe_sink *probe, float *logits_last)
{
    const dsv4_config *f = &g->cfg;
    gpu_scratch *sc = &g->sc;
    int n = f->hc_mult, D = f->hidden_size, V = f->vocab_size;
    float eps = (float)f->rms_norm_eps;
    DSV4_TRY(dsv4_ref_gpu_rmsnorm(sc->vn, sc->X, NULL, S, n * D, eps));
    DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->hm, sc->vn, g->hc_head_fn, S, n * D, n));
    DSV4_TRY(dsv4_ref_gpu_hc_head_pre(sc->hm, g->hc_head_base, g->hc_head_scale, S, n, (float)f->hc_eps, sc->hpre));
    DSV4_TRY(dsv4_ref_gpu_hc_collapse(sc->y, sc->X, sc->hpre, S, n, D));
    if (probe) DSV4_TRY(probe_rows(g, probe, -1, "hc_head", sc->y, D, p0, S));
    DSV4_TRY(dsv4_ref_gpu_rmsnorm(sc->y, sc->y, g->norm, S, D, eps));
    if (g->emu) DSV4_TRY(dsv4_ref_gpu_emu_round(sc->y, (size_t)S * D)); /* emu: o->xn of the head, the logits input */
    if (probe) DSV4_TRY(probe_rows(g, probe, -1, "norm", sc->y, D, p0, S));
    int32_t rows[LOGIT_ROWS];
    int nr = 0;
    const float *head = NULL; /* asked for at the first row that needs logits: once per call */
    for (int s = 0; s < S; s++) {
        int want = dsv4_probe_wants(probe, p0 + s), last = s == S - 1 && logits_last;
        if (want || last) rows[nr++] = s;
        if (nr < LOGIT_ROWS && s < S - 1) continue;
        if (!nr) continue;
        if (!head) DSV4_TRY(ref_gpu_weights_head(g, &head));
        DSV4_REF_CUDA_CHECK(cudaMemcpy(sc->lrows, rows, (size_t)nr * sizeof(int32_t), cudaMemcpyHostToDevice));
        DSV4_TRY(dsv4_ref_gpu_gather_rows(sc->yrows, sc->y, sc->lrows, nr, D));
        DSV4_TRY(dsv4_ref_gpu_linear(g->blas, sc->logits, sc->yrows, head, nr, D, V));
        DSV4_REF_CUDA_CHECK(cudaMemcpy(g->host, sc->logits, (size_t)nr * V * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < nr; i++) {
            int p = p0 + rows[i];
            const float *lg = g->host + (size_t)i * V;
            if (dsv4_probe_wants(probe, p)) DSV4_TRY(dsv4_probe(probe, -1, "logits", p, lg, V));
            if (rows[i] == S - 1 && logits_last) memcpy(logits_last, lg, (size_t)V * sizeof(float));
        }
        nr = 0;
    }
    return 0;
}

/* One call of S <= chunk tokens at positions p0.. */
static int forward_call(dsv4_ref_gpu *g, int p0, const int32_t *tokens, int S, dsv4_probe_sink *probe,
                        float *logits_last)
{
    const dsv4_config *f = &g->cfg;
    gpu_scratch *sc = &g->sc;
    const int V = f->vocab_size;
    for (int s = 0; s < S; s++)
        DSV4_CHECK(tokens[s] >= 0 && tokens[s] < V, "reference: token %d at position %d outside [0, %d)", tokens[s],
                   p0 + s, V);
    if (g->replay) { /* the candidate's state belongs to its tokens: another token is a caller's mistake */
        int nt;
        const int32_t *rt = dsv4_ref_replay_tokens(g->replay, &nt);
        for (int s = 0; s < S; s++)
            if (p0 + s >= nt || rt[p0 + s] != tokens[s])
                return dsv4_error(DSV4_ERR_USAGE, "replay of %s: position %d is not the candidate's token (%d, "
                                  "candidate %d)", dsv4_ref_replay_path(g->replay), p0 + s, tokens[s],
                                  p0 + s < nt ? rt[p0 + s] : -1);
    }
    ref_gpu_follow_start(g, p0, tokens, S); /* following stops for good at a token that is not the dump's */
    DSV4_REF_CUDA_CHECK(cudaMemcpy(sc->tokens, tokens, (size_t)S * sizeof(int32_t), cudaMemcpyHostToDevice));
    DSV4_TRY(ref_gpu_weights_embed(g, tokens, S));
    DSV4_TRY(dsv4_ref_gpu_rope_table(sc->cos_m, sc->sin_m, g->inv_main, g->n_pairs, p0, S));
    DSV4_TRY(dsv4_ref_gpu_rope_table(sc->cos_c, sc->sin_c, g->inv_cmp, g->n_pairs, p0, S));
    for (int L = 0; L < f->num_hidden_layers; L++) {
        DSV4_TRY(layer_forward(g, L, p0, S, probe));
        /* the host is at most a layer ahead of the GPU here: each MoE waits for its routing ids */
        if (g->layer_progress) g->layer_progress(g->progress_ctx, L + 1, f->num_hidden_layers);
    }
    if (g->replay) /* the head on the candidate's last streams */
        DSV4_TRY(replay_upload(g, DSV4_REF_REPLAY_OUT, f->num_hidden_layers - 1, p0, S, sc->X,
                               (size_t)f->hc_mult * f->hidden_size));
    DSV4_TRY(head_forward(g, p0, S, probe, logits_last));
    DSV4_REF_CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}

/* ------------------------------------------------------------------------------------------- vtable */
static int gpu_forward(dsv4_ref *r, const int32_t *tokens, int n, dsv4_probe_sink *probe, float *logits_last)
{
    dsv4_ref_gpu *g = (dsv4_ref_gpu *)r->impl;
    for (int i = 0; i < n; i += g->chunk) {
        int S = n - i < g->chunk ? n - i : g->chunk;
        const double t0 = now_s();
        DSV4_TRY(forward_call(g, r->pos + i, tokens + i, S, probe, i + S == n ? logits_last : NULL));
        ref_gpu_stats_call_end(g, now_s() - t0);
    }
    return 0;
}

static int gpu_dump_entries(dsv4_ref *r, dsv4_probe_sink *probe)
{
    dsv4_ref_gpu *g = (dsv4_ref_gpu *)r->impl;
    const dsv4_config *f = &g->cfg;
    int rc = 0;
    for (int L = 0; L < f->num_hidden_layers && !rc; L++) {
        const gpu_layer *w = &g->lw[L];
        /* replay: what own_pool shows (the judged entries made here, the candidate's elsewhere), every entry */
        const int n_cmp = g->replay ? (int)dsv4_ref_replay_rows(g->replay, DSV4_REF_REPLAY_CMP, L) : w->n_entries;
        const int n_idx = g->replay ? (int)dsv4_ref_replay_rows(g->replay, DSV4_REF_REPLAY_IDX, L) : w->n_ientries;
        if (w->ratio <= 0 || n_cmp == 0) continue;
        for (int which = 0; which < 2 && !rc; which++) {
            int rows = which ? n_idx : n_cmp, len = which ? f->index_head_dim : f->head_dim;
            if (which && (w->attn != DSV4_ATTN_CSA || rows == 0)) break;
            const float *src = g->replay ? (which ? w->own_ipool : w->own_pool) : (which ? w->ipool : w->pool);
            float *h = (float *)malloc((size_t)rows * len * sizeof(float));
            if (!h) return dsv4_error(DSV4_ERR_NOMEM, "ref-gpu: no memory for %d entries", rows);
            cudaError_t e = cudaMemcpy(h, src, (size_t)rows * len * sizeof(float), cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) rc = dsv4_ref_gpu_cuda_fail(e, "cudaMemcpy(entries)", __FILE__, __LINE__);
            else rc = dsv4_probe_entries(probe, L, which ? "indexer_kv" : "compressed_kv", h, rows, len);
            free(h);
        }
    }
    return rc;
}

/* Replay, before the segment starting at `first`: the pools' rows below first div ratio are the candidate's entries
 * and the entry counts say so (the compressors' state is stale: the entries it makes first are not judged). */
static int gpu_replay_seek(dsv4_ref *r, int first)
{
    dsv4_ref_gpu *g = (dsv4_ref_gpu *)r->impl;
    const dsv4_config *f = &g->cfg;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        gpu_layer *w = &g->lw[L];
        if (w->ratio <= 0) continue;
        w->n_entries = first / w->ratio;
        if (w->n_entries > 0)
            DSV4_TRY(replay_upload_entries(g, DSV4_REF_REPLAY_CMP, L, w->pool, 0, w->n_entries, (size_t)f->head_dim));
        if (w->attn != DSV4_ATTN_CSA) continue;
        w->n_ientries = first / w->ratio;
        if (w->n_ientries > 0)
            DSV4_TRY(replay_upload_entries(g, DSV4_REF_REPLAY_IDX, L, w->ipool, 0, w->n_ientries,
                                           (size_t)f->index_head_dim));
    }
    return 0;
}

static void gpu_free(void *impl)
{
    dsv4_ref_gpu *g = (dsv4_ref_gpu *)impl;
    if (!g) return;
    ref_gpu_stream_free(g);
    if (g->lw)
        for (int L = 0; L < g->cfg.num_hidden_layers; L++) dsv4_ref_release((void *)g->lw[L].w1);
    dsv4_ref_release(g->lw);
    cudaFree(g->w_arena);
    cudaFree(g->i_arena);
    cudaFree(g->state_mem);
    cudaFree(g->own_mem);
    cudaFree(g->scratch_mem);
    cudaFree(g->inv_main);
    if (g->blas) cublasDestroy(g->blas);
    dsv4_ref_release(g->host);
    dsv4_ref_release(g->h_rids);
    dsv4_ref_release(g->h_ftopk);
    dsv4_ref_release(g);
}

static void gpu_follow_stats(const dsv4_ref *r, dsv4_ref_follow_stats *s)
{
    *s = ((const dsv4_ref_gpu *)r->impl)->fstats;
}

static void gpu_stats(const dsv4_ref *r, dsv4_ref_gpu_stats *s)
{
    const dsv4_ref_gpu *g = (const dsv4_ref_gpu *)r->impl;
    *s = g->stats;
    s->gpu = 1;
    s->streamed = g->streamed;
    s->sync = g->stream.sync;
}

static const dsv4_ref_vtable dsv4_ref_gpu_vtable = {
    "dsv4 " DSV4_VERSION " reference gpu fp32",
    gpu_forward,
    gpu_dump_entries,
    gpu_free,
    gpu_follow_stats,
    gpu_stats,
    gpu_replay_seek,
};

extern "C" int dsv4_ref_gpu_init(dsv4_model *m, int max_tokens, dsv4_ref **out)
{
    return dsv4_ref_gpu_init_opts(m, max_tokens, NULL, out);
}

extern "C" int dsv4_ref_gpu_init_opts(dsv4_model *m, int max_tokens, const dsv4_ref_options *o, dsv4_ref **out)
{
    DSV4_CHECK(m && out, "dsv4_ref_gpu_init: NULL argument");
    *out = NULL;
    dsv4_ref_options defaults;
    dsv4_ref_options_default(&defaults);
    if (!o) o = &defaults;
    DSV4_TRY(dsv4_ref_options_check(dsv4_model_config(m), o, "ref-gpu")); /* before any device is touched */
    dsv4_ref *r = (dsv4_ref *)dsv4_ref_alloc(sizeof *r, "reference");
    dsv4_ref_gpu *g = (dsv4_ref_gpu *)dsv4_ref_alloc(sizeof *g, "reference gpu");
    if (!r || !g) {
        dsv4_ref_release(r);
        dsv4_ref_release(g);
        return DSV4_ERR_NOMEM;
    }
    r->vt = &dsv4_ref_gpu_vtable;
    r->impl = g;
    r->max_tokens = max_tokens;
    r->replay = o->replay;
    int rc = ref_gpu_init_model(m, max_tokens, o, g);
    if (rc) {
        dsv4_ref_free(r);
        return rc;
    }
    char extra[160] = ""; /* a replay says whose candidate it replayed */
    if (g->replay) {
        const char *rp = dsv4_ref_replay_path(g->replay), *base = strrchr(rp, '/');
        snprintf(extra, sizeof extra, " replay=%.120s", base ? base + 1 : rp);
    }
    dsv4_ref_producer_set(r, g->emu, extra, g->follow); /* what was rounded and whose choices were followed */
    *out = r;
    return 0;
}
