/* opt_step.c - one step of the optimized path over a ragged batch (model-spec §12.2 order, per row), its CUDA
 * graphs, the probes of the dump sequence, and the launches the step shares with dsv4 bench's per-kernel timing
 * (opt_launch_*, used by opt_bench.c).
 *
 * A step's rows are its tokens (dsv4_opt.h). A decode step (every sequence one token or none) has row c =
 * sequence c and replays a CUDA graph; a step with runs (a prefill chunk, a mixed batch) packs each sequence's run
 * into consecutive rows and runs eagerly. Everything that is per token (GEMMs, norms, mHC, router, experts, the
 * indexer's queries and scores, top-k, attention) simply runs over the T rows; what is per sequence is indexed
 * through the row's sequence (r_seq): the compressor states and pools, the indexer keys, the KV buffers.
 *
 * Invariants that fail quietly:
 * - Order inside a layer as the reference: mHC pre; q, window kv; main compressor and (CSA) indexer compressor,
 *   both before the indexer scores and the attention, so the token closing a window already sees its entry;
 *   gather list; sink attention with the inverse RoPE fused; grouped output; mHC post; mHC pre; MoE; mHC post.
 * - Causality inside a run: a pool entry closed by row j is written before any row attends, and stays invisible to
 *   the rows before j through their own live counts ((p+1) div r per row). The window ring is the one thing a run
 *   could overwrite while its earlier rows still need it: with runs the window KV goes to fresh rows, each row
 *   reads its run's positions from them and older ones from the ring, and the ring is written after the attention
 *   (step.cuh). The compressors pool a run's entries from its rows and the old state, then carry the state
 *   (compressor_plan.h): the entries and the state are those of one-token steps, bit for bit.
 * - Every work size a launch depends on is a function of (T, n_csa, n_hca) only, where n_csa / n_hca are
 *   power-of-two buckets of the largest live entry count of any row (opt_step_sizes): a graph captured for a key
 *   replays exactly the launches an eager step with the same key makes, so graph and eager steps give bitwise
 *   identical results. Only decode steps (T = C) are captured.
 * - The indexer's scores are computed in slabs of idx_rows rows (the [rows, pool_cap] scores of a long prefill
 *   would not fit otherwise); a decode step is one slab.
 * - Decision following (options.follow): the own top-k / router picks are probed first, then follow.cu puts the
 *   dump's rows in for dump_seq's rows; the rows travel with the step inputs (pinned h_follow -> d_follow).
 * - Probes copy the dump sequence's rows to the host right after the kernel that produced them (the buffers are
 *   reused by the next layer), so a probing step runs eagerly and synchronises; it costs nothing otherwise.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/compressor.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/follow.cuh"
#include "kernels/indexer.cuh"
#include "kernels/kv_layout.h"
#include "kernels/mhc.cuh"
#include "kernels/moe.cuh"
#include "kernels/moe_sorted.cuh"
#include "kernels/sparse_attn.cuh"
#include "kernels/step.cuh"
#include "kernels/topk.cuh"
#include "opt_internal.h"

/* ------------------------------------------------------------------------------------------ probes */
typedef enum { PR_F32, PR_BF16, PR_I32 } probe_kind;

/* Copy n values at dev (position p of the dump sequence) to the host and hand them to the sink. */
static int probe_row(dsv4_opt *o, int L, const char *name, const void *dev, size_t n, probe_kind kind, int p)
{
    size_t bytes = n * (kind == PR_BF16 ? 2 : 4);
    DSV4_OPT_CUDA(cudaMemcpyAsync(o->h_probe, dev, bytes, cudaMemcpyDeviceToHost, o->stream));
    DSV4_TRY(opt_wait(o, name));
    if (kind == PR_I32) return dsv4_probe_i32(o->probe, L, name, p, (const int32_t *)o->h_probe, n);
    if (kind == PR_BF16) {
        const uint16_t *b = (const uint16_t *)o->h_probe;
        for (size_t i = n; i-- > 0;) o->h_probe[i] = dsv4_bf16_to_f32(b[i]); /* backwards: in place */
    }
    return dsv4_probe(o->probe, L, name, p, o->h_probe, n);
}

/* Every stored position of the dump sequence's run in this step: its row r at base + r·stride elements. */
static int probe_rows(dsv4_opt *o, int L, const char *name, const void *base, size_t stride, size_t n,
                      probe_kind kind)
{
    const int s = o->opt.dump_seq;
    const size_t esz = kind == PR_BF16 ? 2 : 4;
    for (int j = 0; j < o->nrun[s]; j++) {
        const int p = o->pos[s] + j;
        if (!dsv4_probe_wants(o->probe, p)) continue;
        DSV4_TRY(probe_row(o, L, name, (const char *)base + (size_t)(o->row0[s] + j) * stride * esz, n, kind, p));
    }
    return 0;
}
#define PROBE(name, base, stride, n, kind)                                                                       \
    do {                                                                                                         \
        if (o->probe) DSV4_TRY(probe_rows(o, L, name, base, stride, n, kind));                                   \
    } while (0)

/* ------------------------------------------------------------------------------------------ the launches */
/* The tiled mHC partials (long runs) only in a step with runs: a decode step keeps the per-token kernel at any C,
 * and with it its bits. */
static dsv4_mhc_partial mhc_partial(const dsv4_opt *o)
{
    return o->runs && o->opt.prefill_mhc == DSV4_OPT_PREFILL_MHC_TILED ? DSV4_MHC_PARTIAL_TILED : DSV4_MHC_PARTIAL_ROWS;
}

/* The launches whose parameters the step and the micro-benchmark (opt_bench.c) share: one place sets them up. */
int opt_launch_mhc_pre(dsv4_opt *o, const float *fn, const float *base, const float *scale, const float *norm_w)
{
    dsv4_mhc_pre_params mp = {
        .n_tok = o->T, .n_streams = o->n, .dim = o->D, .head = 0, .sinkhorn_iters = o->cfg.hc_sinkhorn_iters,
        .hc_eps = (float)o->cfg.hc_eps, .norm_eps = (float)o->cfg.rms_norm_eps, .X = o->X, .fn = fn,
        .base = base, .scale = scale, .norm_w = norm_w, .pre = o->pre, .post = o->post, .comb = o->comb,
        .x = o->xa, .xn = o->xn, .kernel = (dsv4_mhc_kernel)o->opt.mhc, .partial = mhc_partial(o), .X_f32 = o->Xf,
        .workspace = o->ws, .workspace_bytes = o->ws_bytes, .cublas = o->cublas, .stream = o->stream};
    return dsv4_opt_mhc_pre(&mp);
}

/* The indexer scores and the top-k of rows r0 .. r0 + R - 1 (one slab: R <= idx_rows) into the slab's scores. */
static int launch_indexer_slab(dsv4_opt *o, const opt_layer *ly, int n_work, int max_ctx, int r0, int R)
{
    const int fp32 = o->opt.indexer == DSV4_OPT_INDEXER_FP32;
    dsv4_indexer_params ip = {.n_seq = R, .n_heads = o->HI, .head_dim = o->dI, .n_work = n_work,
                              .q = o->qI + (size_t)r0 * o->HI * o->dI, .keys = ly->ipool,
                              .key_seq_stride = (int64_t)ly->pool_cap * o->dI,
                              .key_seq = o->runs ? o->r_seq + r0 : NULL, .weights = o->wI + (size_t)r0 * o->HI,
                              .n_live = o->live_csa + r0, .scores = o->iscore, .score_stride = o->pool_cap_csa,
                              .kernel = (dsv4_indexer_kernel)o->opt.indexer,
                              .context = max_ctx ? DSV4_INDEX_CONTEXT_MAX : DSV4_INDEX_CONTEXT_LIVE,
                              .scratch = fp32 ? o->ws : NULL, .scratch_bytes = fp32 ? o->ws_bytes : 0,
                              .stream = o->stream};
    return dsv4_opt_indexer_scores(&ip);
}

static int launch_topk_slab(dsv4_opt *o, int n_work, int max_ctx, int r0, int R)
{
    dsv4_topk_params tp = {.n_seq = R, .k = o->topk, .n_work = n_work, .scores = o->iscore,
                           .score_stride = o->pool_cap_csa, .n_live = o->live_csa + r0,
                           .context = max_ctx ? DSV4_INDEX_CONTEXT_MAX : DSV4_INDEX_CONTEXT_LIVE,
                           .out = o->topk_ids + (size_t)r0 * o->topk, .workspace = o->ws,
                           .workspace_bytes = o->ws_bytes, .stream = o->stream};
    return dsv4_opt_topk(&tp);
}

/* The micro-benchmark's launches: the whole step (a decode step is one slab). */
int opt_launch_indexer(dsv4_opt *o, const opt_layer *ly, int n_work, int max_ctx)
{
    return launch_indexer_slab(o, ly, n_work, max_ctx, 0, o->T);
}

int opt_launch_topk(dsv4_opt *o, int n_work, int max_ctx) { return launch_topk_slab(o, n_work, max_ctx, 0, o->T); }

int opt_launch_step_index(dsv4_opt *o, const opt_layer *ly, int n_extra)
{
    dsv4_step_index_params xp = {.n_seq = o->T, .window = o->W, .pos = o->r_pos, .topk = o->topk_ids,
                                 .live = ly->attn == DSV4_ATTN_CSA ? o->live_csa : o->live_hca, .idx = o->idx,
                                 .n_extra = n_extra, .run_off = o->runs ? o->r_off : NULL,
                                 .fresh_base = o->W + ly->pool_cap, .stream = o->stream};
    xp.kind = ly->attn == DSV4_ATTN_SLIDING ? DSV4_STEP_INDEX_WINDOW
              : ly->attn == DSV4_ATTN_CSA   ? DSV4_STEP_INDEX_CSA
                                            : DSV4_STEP_INDEX_HCA;
    return dsv4_opt_step_index(&xp);
}

int opt_launch_sparse_attn(dsv4_opt *o, const opt_layer *ly, int n_extra)
{
    const int sliding = ly->attn == DSV4_ATTN_SLIDING;
    dsv4_sparse_attn_params ap = {.n_seq = o->T, .n_heads = o->H, .head_dim = o->d, .rope_dim = 2 * o->np,
                                  .n_idx = o->W + n_extra, .n_slots = o->W + ly->pool_cap,
                                  .scale = 1.0f / sqrtf((float)o->d), .q = o->q, .kv = ly->kvc,
                                  .kv8 = ly->kv8, .kv_seq_stride = ly->kv_seq_stride, .idx = o->idx,
                                  .seq = o->runs ? o->r_seq : NULL, .fresh = o->runs ? o->kv_fresh : NULL,
                                  .n_fresh = o->runs ? o->T : 0,
                                  .sink = ly->sinks, .rope_cos = sliding ? o->cos_m : o->cos_c,
                                  .rope_sin = sliding ? o->sin_m : o->sin_c, .out = o->o,
                                  .out_dtype = DSV4_OUT_BF16, .kernel = (dsv4_attn_kernel)o->opt.attn,
                                  .workspace = o->ws, .workspace_bytes = o->ws_bytes, .stream = o->stream};
    return dsv4_opt_sparse_attn(&ap);
}

/* ------------------------------------------------------------------------------------------ the layer */
static int mhc_pre(dsv4_opt *o, int L, const float *fn, const float *base, const float *scale, const float *norm_w,
                   int attn_site)
{
    const int n = o->n, D = o->D;
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_MHC_PRE));
    DSV4_TRY(opt_launch_mhc_pre(o, fn, base, scale, norm_w));
    PROBE(attn_site ? "attn_hc_pre" : "ffn_hc_pre", o->pre, n, n, PR_F32);
    PROBE(attn_site ? "attn_hc_post" : "ffn_hc_post", o->post, n, n, PR_F32);
    PROBE(attn_site ? "attn_hc_comb" : "ffn_hc_comb", o->comb, (size_t)n * n, (size_t)n * n, PR_F32);
    PROBE(attn_site ? "attn_in" : "ffn_in", o->xa, D, D, PR_F32);
    return 0;
}

static int mhc_post(dsv4_opt *o, const float *out)
{
    dsv4_mhc_post_params pp = {.n_tok = o->T, .n_streams = o->n, .dim = o->D, .X = o->X, .X_f32 = o->Xf,
                               .out = out, .post = o->post, .comb = o->comb, .X_out = o->X2,
                               .kernel = (dsv4_mhc_kernel)o->opt.mhc, .stream = o->stream};
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_MHC_POST));
    DSV4_TRY(dsv4_opt_mhc_post(&pp));
    uint16_t *t = o->X;
    o->X = o->X2;
    o->X2 = t;
    return 0;
}

/* norm_rope over `heads` rows per token. */
/* Steps with runs of >= OPT_SORTED_MIN_ROWS rows may take the warp-per-row kernel (its own bits); decode keeps the
 * block kernel at any C. */
static int norm_rope(dsv4_opt *o, const void *x, int x_bf16, int64_t x_stride, int heads, int dim, int norm,
                     const float *w, int rope, const float *cs, const float *sn, uint16_t *out, int64_t out_stride)
{
    dsv4_norm_rope_params p = {.n_tok = o->T, .heads = heads, .dim = dim, .x = x, .x_bf16 = x_bf16,
                               .x_tok_stride = x_stride, .norm = norm, .weight = w, .eps = (float)o->cfg.rms_norm_eps,
                               .rope_pairs = rope ? o->np : 0, .cos = cs, .sin = sn, .out = out,
                               .out_tok_stride = out_stride, .post_scale = 1.0f,
                               .warp_rows = o->runs && o->T >= OPT_SORTED_MIN_ROWS, .stream = o->stream};
    return dsv4_opt_norm_rope(&p);
}

static int compressor(dsv4_opt *o, const opt_layer *ly, int d_c, int overlap, int kv_off, int gate_off,
                      const float *ape, const float *norm_w, float *skv, float *ssc, uint16_t *pool,
                      uint8_t *pool8, int64_t pool_stride, int row0, int fp8)
{
    dsv4_compressor_params p = {
        .n_seq = o->T, .ratio = ly->ratio, .d_c = d_c, .overlap = overlap, .rope_pairs = o->np, .fp8_nope = fp8,
        .eps = (float)o->cfg.rms_norm_eps, .pos = o->r_pos, .active = o->r_act, .proj = o->proj,
        .proj_stride = ly->n_x, .kv_off = kv_off, .gate_off = gate_off, .ape = ape, .norm_w = norm_w,
        .inv_freq = o->inv_cmp, .state_kv = skv, .state_score = ssc, .pool = pool, .pool_seq_stride = pool_stride,
        .pool8 = pool8, .pool8_seq_stride = pool_stride, .pool_row0 = row0, .pool_cap = ly->pool_cap,
        .seq = o->runs ? o->r_seq : NULL, .run_off = o->runs ? o->r_off : NULL, .run_len = o->runs ? o->r_len : NULL,
        .stream = o->stream};
    return dsv4_opt_compressor_update(&p);
}

/* The rows of the dump sequence in this step follow the dump's rows (flag 0: their own), after their probes. */
static int follow_rows(dsv4_opt *o, int L, int k, int32_t *sel, int router, const dsv4_moe_route_params *rp)
{
    const int s = o->opt.dump_seq;
    if (!o->follow || (o->runs && o->nrun[s] == 0)) return 0;
    const int32_t *row = o->d_follow + (size_t)L * o->follow_stride;
    dsv4_follow_params fp = {.n_seq = o->T, .seq = o->row0[s], .n_rows = o->nrun[s] > 0 ? o->nrun[s] : 1,
                             .row_stride = (int64_t)o->cfg.num_hidden_layers * o->follow_stride, .k = k,
                             .flag = row + router, .ids = row + 2 + (router ? o->topk : 0), .sel = sel,
                             .changed = o->d_follow_changed + router, .stream = o->stream};
    if (!router) return dsv4_opt_follow_topk(&fp);
    fp.logits = rp->logits, fp.logit_stride = rp->logit_stride, fp.n_experts = rp->n_experts;
    fp.routed_scale = rp->routed_scale, fp.weights = rp->weights;
    return dsv4_opt_follow_route(&fp);
}

/* The lightning indexer of a CSA layer: key update, queries, head weights, then per slab of rows the scores and
 * the top-k. */
static int indexer(dsv4_opt *o, int L, const opt_layer *ly, int n_csa)
{
    const int s = o->opt.dump_seq, T = o->T, HI = o->HI, dI = o->dI;
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_IDX_PREP));
    DSV4_TRY(compressor(o, ly, dI, 1, ly->off_ikv, ly->off_ig, ly->idx_ape, ly->idx_norm, ly->icmp_kv,
                            ly->icmp_score, ly->ipool, NULL, (int64_t)ly->pool_cap * dI, 0, 0));
    DSV4_TRY(opt_linear_apply(o, &ly->idx_wq_b, o->qfull, 1, HI * dI, o->qr_b, o->qr, T));
    DSV4_TRY(norm_rope(o, o->qfull, 0, (int64_t)HI * dI, HI, dI, 0, NULL, 1, o->cos_c, o->sin_c, o->qI,
                           (int64_t)HI * dI));
    dsv4_norm_rope_params wp = {.n_tok = T, .heads = 1, .dim = HI, .x = o->proj + ly->off_iw,
                                .x_tok_stride = ly->n_x, .out = NULL, .out_f32 = o->wI,
                                .post_scale = 1.0f / sqrtf((float)dI) / sqrtf((float)o->HI_all),
                                .stream = o->stream};
    DSV4_TRY(dsv4_opt_norm_rope(&wp));
    const int max_ctx = o->opt.index_context == DSV4_OPT_INDEX_MAX;
    const int n_work = max_ctx ? ly->pool_cap : (n_csa > 0 ? n_csa : 1);
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_IDX_SCORES));
    for (int r0 = 0; r0 < T; r0 += o->idx_rows) {
        const int R = T - r0 < o->idx_rows ? T - r0 : o->idx_rows;
        DSV4_TRY(launch_indexer_slab(o, ly, n_work, max_ctx, r0, R));
        /* the ranks' head partials meet BEFORE the top-k, so every rank selects from the same sums; the live
         * columns of the slab's rows are one contiguous run at the score stride */
        DSV4_TRY(opt_allreduce(o, o->iscore, (size_t)(R - 1) * o->pool_cap_csa + (size_t)n_work, L,
                                   "indexer_scores"));
        for (int j = 0; o->probe && j < o->nrun[s]; j++) {
            const int r = o->row0[s] + j, p = o->pos[s] + j;
            if (r < r0 || r >= r0 + R || !dsv4_probe_wants(o->probe, p)) continue;
            DSV4_TRY(probe_row(o, L, "indexer_scores", o->iscore + (size_t)(r - r0) * o->pool_cap_csa,
                               (size_t)((p + 1) / ly->ratio), PR_F32, p));
        }
        DSV4_TRY(launch_topk_slab(o, n_work, max_ctx, r0, R));
    }
    PROBE("topk_idx", o->topk_ids, o->topk, (size_t)o->topk, PR_I32);
    /* after the probe: the dump records the own picks, the gather reads the followed ones */
    return follow_rows(o, L, o->topk, o->topk_ids, 0, NULL);
}

static int attention(dsv4_opt *o, int L, int n_csa, int n_hca)
{
    const opt_layer *ly = &o->layers[L];
    const int T = o->T, D = o->D, H = o->H, d = o->d, W = o->W, nx = ly->n_x;
    const int sliding = ly->attn == DSV4_ATTN_SLIDING, fp8 = o->opt.kv == DSV4_OPT_KV_FP8;
    const float *cs = sliding ? o->cos_m : o->cos_c, *sn = sliding ? o->sin_m : o->sin_c;
    const int64_t kv_stride = ly->kv_seq_stride;

    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_GEMM_X));
    DSV4_TRY(opt_proj_apply(o, &ly->x, o->proj, nx, o->xn, D, T));
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_Q));
    DSV4_TRY(norm_rope(o, o->proj + ly->off_qa, 0, nx, 1, o->qr, 1, ly->q_norm, 0, NULL, NULL, o->qr_b, o->qr));
    DSV4_TRY(opt_linear_apply(o, &ly->wq_b, o->qfull, 1, H * d, o->qr_b, o->qr, T));
    DSV4_TRY(norm_rope(o, o->qfull, 0, (int64_t)H * d, H, d, 1, NULL, 1, cs, sn, o->q, (int64_t)H * d));
    /* the window KV: straight into the ring (decode), or into the step's fresh rows (runs; ring_write below) */
    dsv4_norm_rope_params kp = {.n_tok = T, .heads = 1, .dim = d, .x = o->proj + ly->off_kv, .x_tok_stride = nx,
                                .norm = 1, .weight = ly->kv_norm, .eps = (float)o->cfg.rms_norm_eps,
                                .rope_pairs = o->np, .cos = cs, .sin = sn, .fp8_nope = fp8, .out = ly->kvc,
                                .out_slot = o->ring_slot, .out_seq_stride = kv_stride, .out8 = ly->kv8,
                                .out8_seq_stride = kv_stride, .out_f32 = o->kvf,
                                .post_scale = 1.0f, .stream = o->stream};
    if (o->runs) {
        kp.out_slot = NULL;
        kp.out = fp8 ? NULL : (uint16_t *)o->kv_fresh;
        kp.out_tok_stride = d;
        kp.out8 = fp8 ? (uint8_t *)o->kv_fresh : NULL;
        kp.out8_seq_stride = (int64_t)ly->kv_entry_bytes;
    }
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_WINDOW_CMP));
    DSV4_TRY(dsv4_opt_norm_rope(&kp));
    PROBE("kv", o->kvf, d, d, PR_F32);

    if (ly->ratio > 0)
        DSV4_TRY(compressor(o, ly, d, ly->attn == DSV4_ATTN_CSA, ly->off_ckv, ly->off_cg, ly->cmp_ape,
                                ly->cmp_norm, ly->cmp_kv, ly->cmp_score, ly->kvc, ly->kv8, kv_stride, W, fp8));
    if (ly->attn == DSV4_ATTN_CSA) DSV4_TRY(indexer(o, L, ly, n_csa));

    const int n_extra = sliding ? 0 : ly->attn == DSV4_ATTN_CSA ? o->topk : n_hca; /* entries past the window */
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_ATTN));
    DSV4_TRY(opt_launch_step_index(o, ly, n_extra));
    DSV4_TRY(opt_launch_sparse_attn(o, ly, n_extra));
    if (o->runs) { /* every row has attended: the runs' last W window entries enter the ring */
        dsv4_ring_write_params rw = {.n_rows = T, .window = W, .entry_bytes = (int64_t)ly->kv_entry_bytes,
                                     .pos = o->r_pos, .active = o->r_act, .seq = o->r_seq, .run_off = o->r_off,
                                     .run_len = o->r_len, .fresh = o->kv_fresh,
                                     .ring = fp8 ? (void *)ly->kv8 : (void *)ly->kvc,
                                     .ring_seq_stride = kv_stride * (fp8 ? 1 : 2), .stream = o->stream};
        DSV4_TRY(dsv4_opt_ring_write(&rw));
    }

    /* grouped output projection: z_g = o_g · W_oa[g]ᵀ for the G groups of H/G heads, then out = z · W_obᵀ */
    const int G = o->G, o_r = o->o_r;
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_WO));
    DSV4_TRY(opt_linear_apply_grouped(o, &ly->wo_a, G, o->z, G * o_r, o->o, H * d, T));
    DSV4_TRY(opt_linear_apply(o, &ly->wo_b, o->aout, 1, D, o->z, G * o_r, T));
    DSV4_TRY(opt_allreduce(o, o->aout, (size_t)T * D, L, "attn_out"));
    PROBE("attn_out", o->aout, D, D, PR_F32);
    return 0;
}

/* The routed experts of a long run as grouped GEMMs: the pairs sorted by expert (their offsets come to the host:
 * the step runs eagerly), each held expert's rows through one up and one down cuBLAS GEMM, then the combine. FP4
 * experts (fp8 mode) are first dequantised, one matrix of one expert at a time: the same bf16 values the decode
 * kernels multiply (exact), read by the same GEMM; only experts with rows are expanded. The GEMMs (and the
 * dequantisations) go round-robin over options.expert_lanes streams, forked from the step's stream after the
 * gather and after the SwiGLU, joined back before the SwiGLU and before the combine: one expert's GEMM of a few
 * hundred rows leaves most SMs idle (kernels/moe_sorted.cuh; the values depend on neither the lanes nor the
 * timing). */
static int experts_sorted(dsv4_opt *o, const opt_layer *ly, int e_begin, int e_end)
{
    const int T = o->T, D = o->D, NI = o->NI, K = o->K;
    dsv4_moe_sorted_params mp = {.n_tok = T, .k = K, .dim = D, .inter = NI, .n_experts = o->E, .e_begin = e_begin,
                                 .e_end = e_end, .limit = (float)o->cfg.swiglu_limit, .x = o->xn, .ids = o->rids,
                                 .weights = o->rw, .count = o->ms_count, .offset = o->ms_offset, .perm = o->ms_perm,
                                 .slot = o->ms_slot, .xs = o->ms_xs, .gu = o->ms_gu, .h = o->ms_h, .y = o->ms_y,
                                 .shared = o->y_sh, .shared_stride = D, .out = o->fout, .stream = o->stream};
    const int held = dsv4_moe_sorted_held(&mp);
    DSV4_TRY(dsv4_opt_moe_sort(&mp));
    DSV4_OPT_CUDA(cudaMemcpyAsync(o->h_ms_offset, o->ms_offset, ((size_t)held + 1) * 4, cudaMemcpyDeviceToHost,
                                  o->stream));
    DSV4_TRY(opt_wait(o, "the experts' sort"));
    const int32_t *off = o->h_ms_offset;
    DSV4_CHECK(off[held] >= 0 && off[held] <= T * K, "optimized: the experts' sort gave %d rows for %d pairs",
               off[held], T * K);
    DSV4_TRY(dsv4_opt_moe_gather(&mp, off[held]));
    const dsv4_moe_gemm_weights w = {.w13 = ly->w13, .w2 = ly->w2, .q13 = ly->q13, .s13 = ly->s13, .q2 = ly->q2,
                                     .s2 = ly->s2};
    DSV4_CHECK(!o->fp8 || (!w.w13 && o->wdq_slot), "optimized: FP4 grouped experts without their slots");
    DSV4_TRY(dsv4_opt_moe_gemms(&mp, &w, &o->lanes, off, 1));
    DSV4_TRY(dsv4_opt_moe_swiglu_sorted(&mp, off[held]));
    DSV4_TRY(dsv4_opt_moe_gemms(&mp, &w, &o->lanes, off, 0));
    return dsv4_opt_moe_combine(&mp);
}

int opt_experts(dsv4_opt *o, const opt_layer *ly)
{
    const int T = o->T, D = o->D, NI = o->NI, K = o->K;
    /* the rank's experts e0..e0+E_loc (whole experts); e_end 0 when it holds every one */
    const int e_begin = o->e0, e_end = o->E_loc < o->E ? o->e0 + o->E_loc : 0;
    /* ms_xs exists only when the budget allows such runs and options.prefill_experts is grouped (and then wdq in
     * fp8 mode) */
    if (o->runs && o->ms_xs && T >= OPT_SORTED_MIN_ROWS) return experts_sorted(o, ly, e_begin, e_end);
    if (o->fp8) {
        dsv4_fp4_experts_params fp = {.n_tok = T, .k = K, .dim = D, .inter = NI,
                                      .limit = (float)o->cfg.swiglu_limit, .x = o->xn, .ids = o->rids,
                                      .weights = o->rw, .w13 = ly->q13, .s13 = ly->s13, .w2 = ly->q2, .s2 = ly->s2,
                                      .e_begin = e_begin, .e_end = e_end, .h = o->h_r, .shared = o->y_sh,
                                      .shared_stride = D, .out = o->fout, .stream = o->stream};
        return dsv4_opt_fp4_experts(&fp);
    }
    dsv4_moe_experts_params ep = {.n_tok = T, .k = K, .dim = D, .inter = NI, .limit = (float)o->cfg.swiglu_limit,
                                  .x = o->xn, .ids = o->rids, .weights = o->rw, .w13 = ly->w13, .w2 = ly->w2,
                                  .e_begin = e_begin, .e_end = e_end, .h = o->h_r, .shared = o->y_sh,
                                  .shared_stride = D, .out = o->fout, .stream = o->stream};
    return dsv4_opt_moe_experts(&ep);
}

static int moe(dsv4_opt *o, int L)
{
    const opt_layer *ly = &o->layers[L];
    /* NS: the rank's shared-expert columns; the routed experts keep their whole width NI */
    const int T = o->T, D = o->D, E = o->E, K = o->K, NS = o->NI_sh;
    const int nf = E + 2 * NS;
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_ROUTER_SHARED));
    DSV4_TRY(opt_proj_apply(o, &ly->f, o->fproj, nf, o->xn, D, T));
    dsv4_moe_route_params rp = {.n_tok = T, .n_experts = E, .k = K, .logits = o->fproj, .logit_stride = nf,
                                .bias = ly->gate_bias, .tid2eid = ly->tid2eid, .tokens = o->r_tok,
                                .routed_scale = (float)o->cfg.routed_scaling_factor, .ids = o->rids,
                                .weights = o->rw, .stream = o->stream};
    DSV4_TRY(dsv4_opt_moe_route(&rp));
    PROBE("router_ids", o->rids, K, K, PR_I32);
    PROBE("router_weights", o->rw, K, K, PR_F32);
    /* after the probes, as the top-k: the experts run the dump's ids, weighted by our scores */
    DSV4_TRY(follow_rows(o, L, K, o->rids, 1, &rp));
    dsv4_swiglu_params sp = {.n_tok = T, .inter = NS, .limit = (float)o->cfg.swiglu_limit, .gu = o->fproj,
                             .gu_stride = nf, .g_off = E, .u_off = E + NS, .h = o->h_sh, .stream = o->stream};
    DSV4_TRY(dsv4_opt_swiglu(&sp));
    DSV4_TRY(opt_linear_apply(o, &ly->sh_w2, o->y_sh, 1, D, o->h_sh, NS, T));
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_EXPERTS));
    DSV4_TRY(opt_experts(o, ly));
    DSV4_TRY(opt_allreduce(o, o->fout, (size_t)T * D, L, "ffn_out"));
    PROBE("ffn_out", o->fout, D, D, PR_F32);
    return 0;
}

static int layer(dsv4_opt *o, int L, int n_csa, int n_hca)
{
    const opt_layer *ly = &o->layers[L];
    const int n = o->n, D = o->D;
    DSV4_TRY(mhc_pre(o, L, ly->hc_attn_fn, ly->hc_attn_base, ly->hc_attn_scale, ly->attn_norm, 1));
    DSV4_TRY(attention(o, L, n_csa, n_hca));
    DSV4_TRY(mhc_post(o, o->aout));
    DSV4_TRY(mhc_pre(o, L, ly->hc_ffn_fn, ly->hc_ffn_base, ly->hc_ffn_scale, ly->ffn_norm, 0));
    DSV4_TRY(moe(o, L));
    DSV4_TRY(mhc_post(o, o->fout));
    PROBE("out", o->X, (size_t)n * D, (size_t)n * D, PR_BF16);
    return 0;
}

/* The head of a step with runs: the logits of dump_seq's stored positions (probing: its rows in blocks of
 * logit_rows, straight from xn), then of each sequence's last row (gathered into xh) with their argmax. */
static int head_runs(dsv4_opt *o, int n_head)
{
    const int s = o->opt.dump_seq, D = o->D, V = o->V, L = -1;
    for (int j0 = 0; o->probe && j0 < o->nrun[s]; j0 += o->logit_rows) {
        const int nb = o->nrun[s] - j0 < o->logit_rows ? o->nrun[s] - j0 : o->logit_rows;
        int any = 0;
        for (int j = j0; j < j0 + nb; j++) any |= dsv4_probe_wants(o->probe, o->pos[s] + j);
        if (!any) continue;
        DSV4_TRY(opt_gemm(o, o->logits, 1, V, o->xn + (size_t)(o->row0[s] + j0) * D, D, o->head, V, D, nb));
        for (int j = j0; j < j0 + nb; j++)
            if (dsv4_probe_wants(o->probe, o->pos[s] + j))
                DSV4_TRY(probe_row(o, L, "logits", o->logits + (size_t)(j - j0) * V, (size_t)V, PR_F32,
                                   o->pos[s] + j));
    }
    DSV4_TRY(dsv4_opt_gather_rows(o->xh, o->xn, o->d_head, n_head, (size_t)D * 2, o->stream));
    DSV4_TRY(opt_gemm(o, o->logits, 1, V, o->xh, D, o->head, V, D, n_head));
    DSV4_TRY(dsv4_opt_argmax(o->next, o->logits, n_head, V, V, o->stream));
    DSV4_OPT_CUDA(cudaMemcpyAsync(o->h_next, o->next, (size_t)n_head * 4, cudaMemcpyDeviceToHost, o->stream));
    return 0;
}

/* The whole step on o->stream: inputs up, layers, head, argmax down. */
static int step_launch(dsv4_opt *o, int n_csa, int n_hca, int n_head)
{
    const int T = o->T, s = o->opt.dump_seq, D = o->D, V = o->V, n = o->n;
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_SETUP));
    DSV4_OPT_CUDA(cudaMemcpyAsync(o->d_in, o->h_in, (size_t)6 * T * 4, cudaMemcpyHostToDevice, o->stream));
    if (o->runs)
        DSV4_OPT_CUDA(cudaMemcpyAsync(o->d_head, o->h_in + 6 * (size_t)o->Tm, (size_t)n_head * 4,
                                      cudaMemcpyHostToDevice, o->stream));
    if (o->follow) { /* pinned like h_in: a graph's copy node reads this step's rows when it runs */
        const int rows = o->nrun[s] > 0 ? o->nrun[s] : 1;
        DSV4_OPT_CUDA(cudaMemcpyAsync(o->d_follow, o->h_follow,
                                      (size_t)rows * o->cfg.num_hidden_layers * o->follow_stride * sizeof *o->h_follow,
                                      cudaMemcpyHostToDevice, o->stream));
    }
    dsv4_step_setup_params su = {.n_seq = T, .window = o->W, .ratio_csa = o->cfg.compress_rate_csa,
                                 .ratio_hca = o->cfg.compress_rate_hca, .rope_pairs = o->np, .runs = o->runs,
                                 .pos = o->r_pos, .active = o->r_act, .inv_main = o->inv_main,
                                 .inv_cmp = o->inv_cmp, .ring_slot = o->ring_slot, .live_csa = o->live_csa,
                                 .live_hca = o->live_hca, .cos_main = o->cos_m, .sin_main = o->sin_m,
                                 .cos_cmp = o->cos_c, .sin_cmp = o->sin_c, .stream = o->stream};
    DSV4_TRY(dsv4_opt_step_setup(&su));
    dsv4_embed_params ep = {.n_tok = T, .n_streams = n, .dim = D, .tokens = o->r_tok, .embed = o->embed, .X = o->X,
                            .stream = o->stream};
    DSV4_TRY(dsv4_opt_embed(&ep));
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) DSV4_TRY(layer(o, L, n_csa, n_hca));
    const int L = -1; /* the PROBE macro's layer: /final */
    DSV4_TRY(opt_prof_mark(o, OPT_STAGE_HEAD));
    dsv4_mhc_pre_params hp = {
        .n_tok = T, .n_streams = n, .dim = D, .head = 1, .hc_eps = (float)o->cfg.hc_eps,
        .norm_eps = (float)o->cfg.rms_norm_eps, .X = o->X, .fn = o->hc_head_fn, .base = o->hc_head_base,
        .scale = o->hc_head_scale, .norm_w = o->norm, .pre = o->pre, .x = o->xa, .xn = o->xn,
        .kernel = (dsv4_mhc_kernel)o->opt.mhc, .partial = mhc_partial(o), .X_f32 = o->Xf, .workspace = o->ws,
        .workspace_bytes = o->ws_bytes, .cublas = o->cublas, .stream = o->stream};
    DSV4_TRY(dsv4_opt_mhc_pre(&hp));
    PROBE("hc_head", o->xa, D, D, PR_F32);
    PROBE("norm", o->xn, D, D, PR_BF16);
    if (o->runs) {
        DSV4_TRY(head_runs(o, n_head));
        return opt_prof_mark(o, OPT_STAGE_END);
    }
    DSV4_TRY(opt_gemm(o, o->logits, 1, V, o->xn, D, o->head, V, D, T));
    PROBE("logits", o->logits, V, V, PR_F32);
    DSV4_TRY(dsv4_opt_argmax(o->next, o->logits, T, V, V, o->stream));
    DSV4_OPT_CUDA(cudaMemcpyAsync(o->h_next, o->next, (size_t)T * 4, cudaMemcpyDeviceToHost, o->stream));
    return 0;
}

/* The smallest power of two >= n (from 16), capped at cap; 0 for n <= 0: the live entry count a step is sized
 * (and its graph keyed) by. opt_layout.c's workspace sizing enumerates every value it can return. */
int opt_bucket(int n, int cap)
{
    if (n <= 0 || cap <= 0) return 0;
    int b = 16;
    while (b < n && b < cap) b *= 2;
    return b < cap ? b : cap;
}

void opt_step_sizes(const dsv4_opt *o, const int32_t *n_tok, int *n_csa, int *n_hca)
{
    int mc = 0, mh = 0;
    const int rc = o->cfg.compress_rate_csa, rh = o->cfg.compress_rate_hca;
    for (int c = 0; c < o->C; c++) {
        const int nc = n_tok ? n_tok[c] : 1;
        if (nc <= 0) continue;
        const int p = o->pos[c] + nc - 1; /* the run's last row sees the most */
        if (rc > 0 && (p + 1) / rc > mc) mc = (p + 1) / rc;
        if (rh > 0 && (p + 1) / rh > mh) mh = (p + 1) / rh;
    }
    *n_csa = opt_bucket(mc, o->pool_cap_csa);
    *n_hca = opt_bucket(mh, o->pool_cap_hca);
}

/* Replay the graph of this key, capturing it first when it is new (decode steps only: T = C). */
static int step_graph(dsv4_opt *o, int n_csa, int n_hca)
{
    opt_graph *g = NULL;
    for (int i = 0; i < o->n_graphs; i++)
        if (o->graphs[i].key_csa == n_csa && o->graphs[i].key_hca == n_hca) g = &o->graphs[i];
    if (!g) {
        if (o->n_graphs == OPT_MAX_GRAPHS) { /* cannot happen with power-of-two buckets; drop the oldest */
            cudaGraphExecDestroy(o->graphs[0].exec);
            memmove(o->graphs, o->graphs + 1, (OPT_MAX_GRAPHS - 1) * sizeof *o->graphs);
            o->n_graphs--;
        }
        cudaGraph_t graph;
        DSV4_OPT_CUDA(cudaStreamBeginCapture(o->stream, cudaStreamCaptureModeRelaxed));
        int rc = step_launch(o, n_csa, n_hca, 0);
        cudaError_t e = cudaStreamEndCapture(o->stream, &graph);
        if (rc) {
            if (e == cudaSuccess) cudaGraphDestroy(graph);
            return rc;
        }
        if (e != cudaSuccess) return dsv4_error(DSV4_ERR_CUDA, "step graph capture: %s", cudaGetErrorString(e));
        g = &o->graphs[o->n_graphs];
        e = cudaGraphInstantiate(&g->exec, graph, 0);
        cudaGraphDestroy(graph);
        if (e != cudaSuccess) return dsv4_error(DSV4_ERR_CUDA, "step graph instantiate: %s", cudaGetErrorString(e));
        g->key_csa = n_csa;
        g->key_hca = n_hca;
        o->n_graphs++;
    }
    DSV4_OPT_CUDA(cudaGraphLaunch(g->exec, o->stream));
    return 0;
}

int opt_step_check(const dsv4_opt *o, const int32_t *tokens, const int32_t *n_tok)
{
    DSV4_CHECK(o && tokens && n_tok, "dsv4_opt_step: NULL argument");
    long total = 0;
    for (int c = 0; c < o->C; c++) {
        DSV4_CHECK(n_tok[c] >= 0, "dsv4_opt_step: sequence %d takes %d tokens", c, n_tok[c]);
        DSV4_CHECK((long)o->pos[c] + n_tok[c] <= o->opt.max_context,
                   "dsv4_opt_step: sequence %d at position %d cannot take %d tokens (max_context %d)", c, o->pos[c],
                   n_tok[c], o->opt.max_context);
        for (int j = 0; j < n_tok[c]; j++)
            DSV4_CHECK(tokens[total + j] >= 0 && tokens[total + j] < o->V,
                       "dsv4_opt_step: token %d of sequence %d (position %d) outside [0, %d)", tokens[total + j], c,
                       o->pos[c] + j, o->V);
        total += n_tok[c];
    }
    DSV4_CHECK(total <= o->Tm, "dsv4_opt_step: %ld tokens exceed the step budget %d (options.max_step_tokens)",
               total, o->Tm);
    return 0;
}

/* Stage dump_seq's followed rows of this step into h_follow, one [L, follow_stride] block per row of its run
 * (flags 0 where the dump has none; a decode step stages one block). The previous step synchronised, so the
 * pinned rows are free to rewrite. Following stops for good at the first position whose token is not the
 * dump's. With --gpus N every rank stages its own copy from the same table, tokens and positions, so every rank
 * applies the same rows (the top-k and routing stay identical across ranks). */
static void follow_stage(dsv4_opt *o, const int32_t *tok, int n)
{
    const int s = o->opt.dump_seq, F = o->follow_stride, NL = o->cfg.num_hidden_layers;
    int nt;
    const int32_t *ft = dsv4_opt_follow_tokens(o->follow, &nt);
    for (int j = 0; j < (n > 0 ? n : 1); j++) {
        const int p = o->pos[s] + j, act = j < n;
        if (act && o->follow_stop < 0 && (p >= nt || ft[p] != tok[j])) o->follow_stop = p;
        const int on = act && o->follow_stop < 0;
        for (int L = 0; L < NL; L++) {
            int32_t *h = o->h_follow + ((size_t)j * NL + L) * F;
            const int32_t *tk = on ? dsv4_opt_follow_row(o->follow, DSV4_OPT_FOLLOW_TOPK, L, p) : NULL;
            const int32_t *rt = on ? dsv4_opt_follow_row(o->follow, DSV4_OPT_FOLLOW_ROUTER, L, p) : NULL;
            h[0] = tk != NULL;
            h[1] = rt != NULL;
            if (tk) memcpy(h + 2, tk, (size_t)o->topk * sizeof *h);
            if (rt) memcpy(h + 2 + o->topk, rt, (size_t)o->K * sizeof *h);
            o->follow_rows[0] += tk != NULL;
            o->follow_rows[1] += rt != NULL;
        }
    }
}

/* One token per active sequence: the ragged step with runs of 0 or 1 (the decode layout). */
int dsv4_opt_step(dsv4_opt *o, const int32_t *tokens, const uint8_t *active, dsv4_probe_sink *probe,
                  float *logits, int32_t *next)
{
    DSV4_CHECK(o && tokens, "dsv4_opt_step: NULL argument");
    int32_t *n = o->step_n, *tok = o->step_tok, k = 0;
    for (int c = 0; c < o->C; c++) {
        n[c] = !active || active[c];
        if (n[c]) tok[k++] = tokens[c];
    }
    return dsv4_opt_step_ragged(o, tok, n, probe, logits, next);
}

int dsv4_opt_step_ragged(dsv4_opt *o, const int32_t *tokens, const int32_t *n_tok, dsv4_probe_sink *probe,
                         float *logits, int32_t *next)
{
    DSV4_TRY(opt_step_check(o, tokens, n_tok));
    if (o->group) return opt_ranks_step(o->group, tokens, n_tok, probe, logits, next); /* its own broken flag */
    /* a failure inside the step leaves the layers before it with this token in their caches and compressor
     * states, and the positions not advanced: a retry would count the token twice (as opt_ranks_step refuses) */
    DSV4_CHECK(!o->broken, "dsv4_opt_step: an earlier step failed part way (its caches are half written): only "
               "dsv4_opt_free is left");
    int rc = opt_step_rank(o, tokens, n_tok, probe, logits, next);
    if (rc) o->broken = 1;
    return rc;
}

/* The rows of this step into h_in (stride T) and the row views; returns the head rows of a step with runs. */
static int stage_rows(dsv4_opt *o, const int32_t *tokens, const int32_t *n_tok)
{
    const int C = o->C;
    o->runs = 0;
    for (int c = 0; c < C; c++) o->runs |= n_tok[c] > 1;
    int T = 0, n_head = 0, k = 0;
    if (!o->runs) { /* decode: row c = sequence c, an inactive row computes on token 0 and writes nothing */
        T = C;
        for (int c = 0; c < C; c++) {
            const int act = n_tok[c] == 1;
            o->row0[c] = c;
            o->nrun[c] = act;
            o->h_in[c] = act ? tokens[k++] : 0;
            o->h_in[T + c] = o->pos[c];
            o->h_in[2 * T + c] = act;
            o->h_in[3 * T + c] = c;
            o->h_in[4 * T + c] = 0;
            o->h_in[5 * T + c] = 1;
        }
    } else {
        for (int c = 0; c < C; c++) T += n_tok[c];
        int r = 0;
        for (int c = 0; c < C; c++) {
            o->row0[c] = r;
            o->nrun[c] = n_tok[c];
            for (int j = 0; j < n_tok[c]; j++, r++) {
                o->h_in[r] = tokens[k++];
                o->h_in[T + r] = o->pos[c] + j;
                o->h_in[2 * T + r] = 1;
                o->h_in[3 * T + r] = c;
                o->h_in[4 * T + r] = j;
                o->h_in[5 * T + r] = n_tok[c];
            }
            if (n_tok[c] > 0) o->h_in[6 * (size_t)o->Tm + n_head++] = r - 1;
        }
    }
    o->T = T;
    o->r_tok = o->d_in, o->r_pos = o->d_in + T, o->r_act = o->d_in + 2 * T;
    o->r_seq = o->d_in + 3 * T, o->r_off = o->d_in + 4 * T, o->r_len = o->d_in + 5 * T;
    return n_head;
}

int opt_step_rank(dsv4_opt *o, const int32_t *tokens, const int32_t *n_tok, dsv4_probe_sink *probe,
                  float *logits, int32_t *next)
{
    const int C = o->C, s = o->opt.dump_seq;
    const int n_head = stage_rows(o, tokens, n_tok);
    if (o->T == 0) return 0; /* nothing to do (every run empty) */
    if (o->follow) {
        long first = 0;
        for (int c = 0; c < s; c++) first += n_tok[c];
        follow_stage(o, tokens + first, n_tok[s]);
    }
    int n_csa, n_hca;
    opt_step_sizes(o, n_tok, &n_csa, &n_hca);
    int probing = 0;
    for (int j = 0; probe && j < o->nrun[s]; j++) probing |= dsv4_probe_wants(probe, o->pos[s] + j);
    o->probe = probing ? probe : NULL;
    const int eager = probing || o->runs || !o->opt.cuda_graph || opt_ranks_eager(o);
    int rc = eager ? step_launch(o, n_csa, n_hca, n_head) : step_graph(o, n_csa, n_hca);
    o->probe = NULL;
    if (rc) return rc;
    DSV4_TRY(opt_wait(o, "the step"));
    if (o->prof_on && o->runs) DSV4_TRY(opt_prof_account(o));
    if (!o->runs) {
        if (logits)
            DSV4_OPT_CUDA(cudaMemcpy(logits, o->logits + (size_t)s * o->V, (size_t)o->V * 4, cudaMemcpyDeviceToHost));
        if (next) memcpy(next, o->h_next, (size_t)C * sizeof *next);
    } else {
        for (int c = 0, i = 0; c < C; c++) {
            if (n_tok[c] > 0 && c == s && logits)
                DSV4_OPT_CUDA(cudaMemcpy(logits, o->logits + (size_t)i * o->V, (size_t)o->V * 4,
                                         cudaMemcpyDeviceToHost));
            if (next) next[c] = n_tok[c] > 0 ? o->h_next[i] : -1;
            i += n_tok[c] > 0;
        }
    }
    for (int c = 0; c < C; c++) o->pos[c] += n_tok[c];
    return 0;
}

/* One --kv fp8 entry (kernels/kv_layout.h) as its d f32 values: code x scale for the nope channels, the bf16 rope
 * channels; the same values the attention kernels expand it to. */
static void kv8_entry_to_f32(const uint8_t *e, int d, int rope, float *out)
{
    const int nope = d - rope;
    const uint8_t *codes = e + dsv4_kv8_codes_at(rope), *scales = e + dsv4_kv8_scales_at(d, rope);
    for (int ch = 0; ch < nope; ch++)
        out[ch] = dsv4_e4m3_to_f32(codes[ch]) * dsv4_e8m0_to_f32(scales[ch / DSV4_KV8_BLOCK]);
    for (int i = 0; i < rope; i++) {
        uint16_t b;
        memcpy(&b, e + 2 * i, 2);
        out[nope + i] = dsv4_bf16_to_f32(b);
    }
}

int dsv4_opt_dump_entries(dsv4_opt *o, dsv4_probe_sink *probe)
{
    DSV4_CHECK(o, "dsv4_opt_dump_entries: NULL argument");
    if (!probe) return 0;
    if (o->group) { /* the entries are replicated: rank 0 (this object) writes its own */
        DSV4_TRY(opt_ranks_usable(o->group));
        DSV4_OPT_CUDA(cudaSetDevice(o->opt.device));
    }
    const int s = o->opt.dump_seq, p = o->pos[s];
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        const opt_layer *ly = &o->layers[L];
        if (ly->ratio <= 0) continue;
        for (int which = 0; which < (ly->attn == DSV4_ATTN_CSA ? 2 : 1); which++) {
            const int dc = which ? o->dI : o->d;
            int64_t n = p / ly->ratio;
            if (n > ly->pool_cap) n = ly->pool_cap;
            if (n <= 0) continue;
            /* the entries as stored: bf16 rows, or fp8 cache entries (--kv fp8, main pool only) */
            const int form8 = !which && ly->kv8;
            const size_t eb = which ? (size_t)dc * 2 : ly->kv_entry_bytes;
            const void *src = which   ? (const void *)(ly->ipool + (size_t)s * ly->pool_cap * dc)
                              : form8 ? (const void *)(ly->kv8 + (size_t)s * ly->kv_seq_stride + (size_t)o->W * eb)
                                      : (const void *)(ly->kvc + (size_t)s * ly->kv_seq_stride + (size_t)o->W * dc);
            uint8_t *hb = malloc((size_t)n * eb);
            float *hf = malloc((size_t)n * dc * 4);
            int rc = hb && hf ? 0 : dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory for entry probes");
            if (!rc && cudaMemcpy(hb, src, (size_t)n * eb, cudaMemcpyDeviceToHost) != cudaSuccess)
                rc = dsv4_error(DSV4_ERR_CUDA, "optimized: copying the entries of layer %d failed", L);
            for (int64_t i = 0; !rc && i < n; i++) {
                if (form8)
                    kv8_entry_to_f32(hb + i * eb, dc, 2 * o->np, hf + i * dc);
                else
                    for (int ch = 0; ch < dc; ch++)
                        hf[i * dc + ch] = dsv4_bf16_to_f32(((const uint16_t *)hb)[i * dc + ch]);
            }
            if (!rc) rc = dsv4_probe_entries(probe, L, which ? "indexer_kv" : "compressed_kv", hf, n, dc);
            free(hb);
            free(hf);
            if (rc) return rc;
        }
    }
    return 0;
}
