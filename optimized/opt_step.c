/* opt_step.c - one decode step of the optimized path for the batch (model-spec §12.2 order), its CUDA graphs,
 * the probes of the dump sequence, and the launches the step shares with dsv4 bench's per-kernel timing
 * (opt_launch_*, used by opt_bench.c).
 *
 * Invariants that fail quietly:
 * - Order inside a layer as the reference: mHC pre; q, window kv (written to the ring BEFORE the attention);
 *   main compressor and (CSA) indexer compressor, both before the indexer scores and the attention, so the
 *   token closing a window already sees its entry; gather list; sink attention with the inverse RoPE fused;
 *   grouped output; mHC post; mHC pre; MoE; mHC post.
 * - Every work size a launch depends on is a function of (C, n_csa, n_hca) only, where n_csa / n_hca are
 *   power-of-two buckets of the largest live entry count of the active sequences (opt_step_sizes): a graph
 *   captured for a key replays exactly the launches an eager step with the same key makes, so graph and eager
 *   steps give bitwise identical results, and a graph is captured once per (batch shape, bucket).
 * - Decision following (options.follow): the own top-k / router picks are probed first, then follow.cu puts the
 *   dump's row in for dump_seq; the rows travel with the step inputs (pinned h_follow -> d_follow), so graphs work.
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
#include "kernels/sparse_attn.cuh"
#include "kernels/step.cuh"
#include "kernels/topk.cuh"
#include "opt_internal.h"

/* ------------------------------------------------------------------------------------------ probes */
typedef enum { PR_F32, PR_BF16, PR_I32 } probe_kind;

/* Copy n values of the dump sequence at dev to the host and hand them to the sink. */
static int probe_row(dsv4_opt *o, int L, const char *name, const void *dev, size_t n, probe_kind kind)
{
    const int p = o->pos[o->opt.dump_seq];
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
#define PROBE(name, dev, n, kind)                                                                                \
    do {                                                                                                         \
        if (o->probe) DSV4_TRY(probe_row(o, L, name, dev, n, kind));                                         \
    } while (0)

/* ------------------------------------------------------------------------------------------ the launches */
/* The launches whose parameters the step and the micro-benchmark (opt_bench.c) share: one place sets them up. */
int opt_launch_mhc_pre(dsv4_opt *o, const float *fn, const float *base, const float *scale, const float *norm_w)
{
    dsv4_mhc_pre_params mp = {
        .n_tok = o->C, .n_streams = o->n, .dim = o->D, .head = 0, .sinkhorn_iters = o->cfg.hc_sinkhorn_iters,
        .hc_eps = (float)o->cfg.hc_eps, .norm_eps = (float)o->cfg.rms_norm_eps, .X = o->X, .fn = fn,
        .base = base, .scale = scale, .norm_w = norm_w, .pre = o->pre, .post = o->post, .comb = o->comb,
        .x = o->xa, .xn = o->xn, .kernel = (dsv4_mhc_kernel)o->opt.mhc, .X_f32 = o->Xf, .workspace = o->ws,
        .workspace_bytes = o->ws_bytes, .cublas = o->cublas, .stream = o->stream};
    return dsv4_opt_mhc_pre(&mp);
}

int opt_launch_indexer(dsv4_opt *o, const opt_layer *ly, int n_work, int max_ctx)
{
    const int fp32 = o->opt.indexer == DSV4_OPT_INDEXER_FP32;
    dsv4_indexer_params ip = {.n_seq = o->C, .n_heads = o->HI, .head_dim = o->dI, .n_work = n_work, .q = o->qI,
                              .keys = ly->ipool, .key_seq_stride = (int64_t)ly->pool_cap * o->dI, .weights = o->wI,
                              .n_live = o->live_csa, .scores = o->iscore, .score_stride = o->pool_cap_csa,
                              .kernel = (dsv4_indexer_kernel)o->opt.indexer,
                              .context = max_ctx ? DSV4_INDEX_CONTEXT_MAX : DSV4_INDEX_CONTEXT_LIVE,
                              .scratch = fp32 ? o->ws : NULL, .scratch_bytes = fp32 ? o->ws_bytes : 0,
                              .stream = o->stream};
    return dsv4_opt_indexer_scores(&ip);
}

int opt_launch_topk(dsv4_opt *o, int n_work, int max_ctx)
{
    dsv4_topk_params tp = {.n_seq = o->C, .k = o->topk, .n_work = n_work, .scores = o->iscore,
                           .score_stride = o->pool_cap_csa, .n_live = o->live_csa,
                           .context = max_ctx ? DSV4_INDEX_CONTEXT_MAX : DSV4_INDEX_CONTEXT_LIVE,
                           .out = o->topk_ids, .workspace = o->ws, .workspace_bytes = o->ws_bytes,
                           .stream = o->stream};
    return dsv4_opt_topk(&tp);
}

int opt_launch_step_index(dsv4_opt *o, const opt_layer *ly, int n_extra)
{
    dsv4_step_index_params xp = {.n_seq = o->C, .window = o->W, .pos = o->d_in + o->C, .topk = o->topk_ids,
                                 .live = ly->attn == DSV4_ATTN_CSA ? o->live_csa : o->live_hca, .idx = o->idx,
                                 .n_extra = n_extra, .stream = o->stream};
    xp.kind = ly->attn == DSV4_ATTN_SLIDING ? DSV4_STEP_INDEX_WINDOW
              : ly->attn == DSV4_ATTN_CSA   ? DSV4_STEP_INDEX_CSA
                                            : DSV4_STEP_INDEX_HCA;
    return dsv4_opt_step_index(&xp);
}

int opt_launch_sparse_attn(dsv4_opt *o, const opt_layer *ly, int n_extra)
{
    const int sliding = ly->attn == DSV4_ATTN_SLIDING;
    dsv4_sparse_attn_params ap = {.n_seq = o->C, .n_heads = o->H, .head_dim = o->d, .rope_dim = 2 * o->np,
                                  .n_idx = o->W + n_extra, .n_slots = o->W + ly->pool_cap,
                                  .scale = 1.0f / sqrtf((float)o->d), .q = o->q, .kv = ly->kvc,
                                  .kv8 = ly->kv8, .kv_seq_stride = ly->kv_seq_stride, .idx = o->idx,
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
    const int s = o->opt.dump_seq, n = o->n, D = o->D;
    DSV4_TRY(opt_launch_mhc_pre(o, fn, base, scale, norm_w));
    PROBE(attn_site ? "attn_hc_pre" : "ffn_hc_pre", o->pre + s * n, n, PR_F32);
    PROBE(attn_site ? "attn_hc_post" : "ffn_hc_post", o->post + s * n, n, PR_F32);
    PROBE(attn_site ? "attn_hc_comb" : "ffn_hc_comb", o->comb + s * n * n, (size_t)n * n, PR_F32);
    PROBE(attn_site ? "attn_in" : "ffn_in", o->xa + (size_t)s * D, D, PR_F32);
    return 0;
}

static int mhc_post(dsv4_opt *o, const float *out)
{
    dsv4_mhc_post_params pp = {.n_tok = o->C, .n_streams = o->n, .dim = o->D, .X = o->X, .X_f32 = o->Xf,
                               .out = out, .post = o->post, .comb = o->comb, .X_out = o->X2,
                               .kernel = (dsv4_mhc_kernel)o->opt.mhc, .stream = o->stream};
    DSV4_TRY(dsv4_opt_mhc_post(&pp));
    uint16_t *t = o->X;
    o->X = o->X2;
    o->X2 = t;
    return 0;
}

/* norm_rope over `heads` rows per token. */
static int norm_rope(dsv4_opt *o, const void *x, int x_bf16, int64_t x_stride, int heads, int dim, int norm,
                     const float *w, int rope, const float *cs, const float *sn, uint16_t *out, int64_t out_stride)
{
    dsv4_norm_rope_params p = {.n_tok = o->C, .heads = heads, .dim = dim, .x = x, .x_bf16 = x_bf16,
                               .x_tok_stride = x_stride, .norm = norm, .weight = w, .eps = (float)o->cfg.rms_norm_eps,
                               .rope_pairs = rope ? o->np : 0, .cos = cs, .sin = sn, .out = out,
                               .out_tok_stride = out_stride, .post_scale = 1.0f, .stream = o->stream};
    return dsv4_opt_norm_rope(&p);
}

static int compressor(dsv4_opt *o, const opt_layer *ly, int d_c, int overlap, int kv_off, int gate_off,
                      const float *ape, const float *norm_w, float *skv, float *ssc, uint16_t *pool,
                      uint8_t *pool8, int64_t pool_stride, int row0, int fp8)
{
    dsv4_compressor_params p = {
        .n_seq = o->C, .ratio = ly->ratio, .d_c = d_c, .overlap = overlap, .rope_pairs = o->np, .fp8_nope = fp8,
        .eps = (float)o->cfg.rms_norm_eps, .pos = o->d_in + o->C, .active = o->d_in + 2 * o->C, .proj = o->proj,
        .proj_stride = ly->n_x, .kv_off = kv_off, .gate_off = gate_off, .ape = ape, .norm_w = norm_w,
        .inv_freq = o->inv_cmp, .state_kv = skv, .state_score = ssc, .pool = pool, .pool_seq_stride = pool_stride,
        .pool8 = pool8, .pool8_seq_stride = pool_stride, .pool_row0 = row0,
        .pool_cap = ly->pool_cap, .stream = o->stream};
    return dsv4_opt_compressor_update(&p);
}

/* The lightning indexer of a CSA layer: key update, queries, head weights, scores, top-k. */
static int indexer(dsv4_opt *o, int L, const opt_layer *ly, int n_csa)
{
    const int s = o->opt.dump_seq, C = o->C, HI = o->HI, dI = o->dI;
    DSV4_TRY(compressor(o, ly, dI, 1, ly->off_ikv, ly->off_ig, ly->idx_ape, ly->idx_norm, ly->icmp_kv,
                            ly->icmp_score, ly->ipool, NULL, (int64_t)ly->pool_cap * dI, 0, 0));
    DSV4_TRY(opt_linear_apply(o, &ly->idx_wq_b, o->qfull, 1, HI * dI, o->qr_b, o->qr, C));
    DSV4_TRY(norm_rope(o, o->qfull, 0, (int64_t)HI * dI, HI, dI, 0, NULL, 1, o->cos_c, o->sin_c, o->qI,
                           (int64_t)HI * dI));
    dsv4_norm_rope_params wp = {.n_tok = C, .heads = 1, .dim = HI, .x = o->proj + ly->off_iw,
                                .x_tok_stride = ly->n_x, .out = NULL, .out_f32 = o->wI,
                                .post_scale = 1.0f / sqrtf((float)dI) / sqrtf((float)o->HI_all),
                                .stream = o->stream};
    DSV4_TRY(dsv4_opt_norm_rope(&wp));
    const int max_ctx = o->opt.index_context == DSV4_OPT_INDEX_MAX;
    const int n_work = max_ctx ? ly->pool_cap : (n_csa > 0 ? n_csa : 1);
    DSV4_TRY(opt_launch_indexer(o, ly, n_work, max_ctx));
    /* the ranks' head partials meet BEFORE the top-k, so every rank selects from the same sums; the live
     * columns of rows 0..C-1 are one contiguous run at the score stride */
    DSV4_TRY(opt_allreduce(o, o->iscore, (size_t)(C - 1) * o->pool_cap_csa + (size_t)n_work, L,
                               "indexer_scores"));
    if (o->probe) {
        int n_vis = (o->pos[s] + 1) / ly->ratio;
        PROBE("indexer_scores", o->iscore + (size_t)s * o->pool_cap_csa, (size_t)n_vis, PR_F32);
    }
    DSV4_TRY(opt_launch_topk(o, n_work, max_ctx));
    PROBE("topk_idx", o->topk_ids + (size_t)s * o->topk, (size_t)o->topk, PR_I32);
    if (o->follow) { /* after the probe: the dump records the own picks, the gather reads the followed ones */
        const int32_t *row = o->d_follow + (size_t)L * o->follow_stride;
        dsv4_follow_params fp = {.n_seq = C, .seq = s, .k = o->topk, .flag = row, .ids = row + 2,
                                 .sel = o->topk_ids, .changed = o->d_follow_changed, .stream = o->stream};
        DSV4_TRY(dsv4_opt_follow_topk(&fp));
    }
    return 0;
}

static int attention(dsv4_opt *o, int L, int n_csa, int n_hca)
{
    const opt_layer *ly = &o->layers[L];
    const int s = o->opt.dump_seq, C = o->C, D = o->D, H = o->H, d = o->d, W = o->W, nx = ly->n_x;
    const int sliding = ly->attn == DSV4_ATTN_SLIDING, fp8 = o->opt.kv == DSV4_OPT_KV_FP8;
    const float *cs = sliding ? o->cos_m : o->cos_c, *sn = sliding ? o->sin_m : o->sin_c;
    const int64_t kv_stride = ly->kv_seq_stride;

    DSV4_TRY(opt_proj_apply(o, &ly->x, o->proj, nx, o->xn, D, C));
    DSV4_TRY(norm_rope(o, o->proj + ly->off_qa, 0, nx, 1, o->qr, 1, ly->q_norm, 0, NULL, NULL, o->qr_b, o->qr));
    DSV4_TRY(opt_linear_apply(o, &ly->wq_b, o->qfull, 1, H * d, o->qr_b, o->qr, C));
    DSV4_TRY(norm_rope(o, o->qfull, 0, (int64_t)H * d, H, d, 1, NULL, 1, cs, sn, o->q, (int64_t)H * d));
    dsv4_norm_rope_params kp = {.n_tok = C, .heads = 1, .dim = d, .x = o->proj + ly->off_kv, .x_tok_stride = nx,
                                .norm = 1, .weight = ly->kv_norm, .eps = (float)o->cfg.rms_norm_eps,
                                .rope_pairs = o->np, .cos = cs, .sin = sn, .fp8_nope = fp8, .out = ly->kvc,
                                .out_slot = o->ring_slot, .out_seq_stride = kv_stride, .out8 = ly->kv8,
                                .out8_seq_stride = kv_stride, .out_f32 = o->kvf,
                                .post_scale = 1.0f, .stream = o->stream};
    DSV4_TRY(dsv4_opt_norm_rope(&kp));
    PROBE("kv", o->kvf + (size_t)s * d, d, PR_F32);

    if (ly->ratio > 0)
        DSV4_TRY(compressor(o, ly, d, ly->attn == DSV4_ATTN_CSA, ly->off_ckv, ly->off_cg, ly->cmp_ape,
                                ly->cmp_norm, ly->cmp_kv, ly->cmp_score, ly->kvc, ly->kv8, kv_stride, W, fp8));
    if (ly->attn == DSV4_ATTN_CSA) DSV4_TRY(indexer(o, L, ly, n_csa));

    const int n_extra = sliding ? 0 : ly->attn == DSV4_ATTN_CSA ? o->topk : n_hca; /* entries past the window */
    DSV4_TRY(opt_launch_step_index(o, ly, n_extra));
    DSV4_TRY(opt_launch_sparse_attn(o, ly, n_extra));

    /* grouped output projection: z_g = o_g · W_oa[g]ᵀ for the G groups of H/G heads, then out = z · W_obᵀ */
    const int G = o->G, o_r = o->o_r;
    DSV4_TRY(opt_linear_apply_grouped(o, &ly->wo_a, G, o->z, G * o_r, o->o, H * d, C));
    DSV4_TRY(opt_linear_apply(o, &ly->wo_b, o->aout, 1, D, o->z, G * o_r, C));
    DSV4_TRY(opt_allreduce(o, o->aout, (size_t)C * D, L, "attn_out"));
    PROBE("attn_out", o->aout + (size_t)s * D, D, PR_F32);
    return 0;
}

int opt_experts(dsv4_opt *o, const opt_layer *ly)
{
    const int C = o->C, D = o->D, NI = o->NI, K = o->K;
    /* the rank's experts e0..e0+E_loc (whole experts); e_end 0 when it holds every one */
    const int e_begin = o->e0, e_end = o->E_loc < o->E ? o->e0 + o->E_loc : 0;
    if (o->fp8) {
        dsv4_fp4_experts_params fp = {.n_tok = C, .k = K, .dim = D, .inter = NI,
                                      .limit = (float)o->cfg.swiglu_limit, .x = o->xn, .ids = o->rids,
                                      .weights = o->rw, .w13 = ly->q13, .s13 = ly->s13, .w2 = ly->q2, .s2 = ly->s2,
                                      .e_begin = e_begin, .e_end = e_end, .h = o->h_r, .shared = o->y_sh,
                                      .shared_stride = D, .out = o->fout, .stream = o->stream};
        return dsv4_opt_fp4_experts(&fp);
    }
    dsv4_moe_experts_params ep = {.n_tok = C, .k = K, .dim = D, .inter = NI, .limit = (float)o->cfg.swiglu_limit,
                                  .x = o->xn, .ids = o->rids, .weights = o->rw, .w13 = ly->w13, .w2 = ly->w2,
                                  .e_begin = e_begin, .e_end = e_end, .h = o->h_r, .shared = o->y_sh,
                                  .shared_stride = D, .out = o->fout, .stream = o->stream};
    return dsv4_opt_moe_experts(&ep);
}

static int moe(dsv4_opt *o, int L)
{
    const opt_layer *ly = &o->layers[L];
    /* NS: the rank's shared-expert columns; the routed experts keep their whole width NI */
    const int s = o->opt.dump_seq, C = o->C, D = o->D, E = o->E, K = o->K, NS = o->NI_sh;
    const int nf = E + 2 * NS;
    DSV4_TRY(opt_proj_apply(o, &ly->f, o->fproj, nf, o->xn, D, C));
    dsv4_moe_route_params rp = {.n_tok = C, .n_experts = E, .k = K, .logits = o->fproj, .logit_stride = nf,
                                .bias = ly->gate_bias, .tid2eid = ly->tid2eid, .tokens = o->d_in,
                                .routed_scale = (float)o->cfg.routed_scaling_factor, .ids = o->rids,
                                .weights = o->rw, .stream = o->stream};
    DSV4_TRY(dsv4_opt_moe_route(&rp));
    PROBE("router_ids", o->rids + (size_t)s * K, K, PR_I32);
    PROBE("router_weights", o->rw + (size_t)s * K, K, PR_F32);
    if (o->follow) { /* after the probes, as the top-k: the experts run the dump's ids, weighted by our scores */
        const int32_t *row = o->d_follow + (size_t)L * o->follow_stride;
        dsv4_follow_params fp = {.n_seq = C, .seq = s, .k = K, .flag = row + 1, .ids = row + 2 + o->topk,
                                 .sel = o->rids, .changed = o->d_follow_changed + 1, .logits = o->fproj,
                                 .logit_stride = nf, .n_experts = E, .routed_scale = rp.routed_scale,
                                 .weights = o->rw, .stream = o->stream};
        DSV4_TRY(dsv4_opt_follow_route(&fp));
    }
    dsv4_swiglu_params sp = {.n_tok = C, .inter = NS, .limit = (float)o->cfg.swiglu_limit, .gu = o->fproj,
                             .gu_stride = nf, .g_off = E, .u_off = E + NS, .h = o->h_sh, .stream = o->stream};
    DSV4_TRY(dsv4_opt_swiglu(&sp));
    DSV4_TRY(opt_linear_apply(o, &ly->sh_w2, o->y_sh, 1, D, o->h_sh, NS, C));
    DSV4_TRY(opt_experts(o, ly));
    DSV4_TRY(opt_allreduce(o, o->fout, (size_t)C * D, L, "ffn_out"));
    PROBE("ffn_out", o->fout + (size_t)s * D, D, PR_F32);
    return 0;
}

static int layer(dsv4_opt *o, int L, int n_csa, int n_hca)
{
    const opt_layer *ly = &o->layers[L];
    const int s = o->opt.dump_seq, n = o->n, D = o->D;
    DSV4_TRY(mhc_pre(o, L, ly->hc_attn_fn, ly->hc_attn_base, ly->hc_attn_scale, ly->attn_norm, 1));
    DSV4_TRY(attention(o, L, n_csa, n_hca));
    DSV4_TRY(mhc_post(o, o->aout));
    DSV4_TRY(mhc_pre(o, L, ly->hc_ffn_fn, ly->hc_ffn_base, ly->hc_ffn_scale, ly->ffn_norm, 0));
    DSV4_TRY(moe(o, L));
    DSV4_TRY(mhc_post(o, o->fout));
    PROBE("out", o->X + (size_t)s * n * D, (size_t)n * D, PR_BF16);
    return 0;
}

/* The whole step on o->stream: inputs up, layers, head, argmax down. */
static int step_launch(dsv4_opt *o, int n_csa, int n_hca)
{
    const int C = o->C, s = o->opt.dump_seq, D = o->D, V = o->V, n = o->n;
    DSV4_OPT_CUDA(cudaMemcpyAsync(o->d_in, o->h_in, (size_t)3 * C * 4, cudaMemcpyHostToDevice, o->stream));
    if (o->follow) /* pinned like h_in: a graph's copy node reads this step's rows when it runs */
        DSV4_OPT_CUDA(cudaMemcpyAsync(o->d_follow, o->h_follow,
                                      (size_t)o->cfg.num_hidden_layers * o->follow_stride * sizeof *o->h_follow,
                                      cudaMemcpyHostToDevice, o->stream));
    dsv4_step_setup_params su = {.n_seq = C, .window = o->W, .ratio_csa = o->cfg.compress_rate_csa,
                                 .ratio_hca = o->cfg.compress_rate_hca, .rope_pairs = o->np, .pos = o->d_in + C,
                                 .active = o->d_in + 2 * C, .inv_main = o->inv_main, .inv_cmp = o->inv_cmp,
                                 .ring_slot = o->ring_slot, .live_csa = o->live_csa, .live_hca = o->live_hca,
                                 .cos_main = o->cos_m, .sin_main = o->sin_m, .cos_cmp = o->cos_c,
                                 .sin_cmp = o->sin_c, .stream = o->stream};
    DSV4_TRY(dsv4_opt_step_setup(&su));
    dsv4_embed_params ep = {.n_tok = C, .n_streams = n, .dim = D, .tokens = o->d_in, .embed = o->embed, .X = o->X,
                            .stream = o->stream};
    DSV4_TRY(dsv4_opt_embed(&ep));
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) DSV4_TRY(layer(o, L, n_csa, n_hca));
    const int L = -1; /* the PROBE macro's layer: /final */
    dsv4_mhc_pre_params hp = {
        .n_tok = C, .n_streams = n, .dim = D, .head = 1, .hc_eps = (float)o->cfg.hc_eps,
        .norm_eps = (float)o->cfg.rms_norm_eps, .X = o->X, .fn = o->hc_head_fn, .base = o->hc_head_base,
        .scale = o->hc_head_scale, .norm_w = o->norm, .pre = o->pre, .x = o->xa, .xn = o->xn,
        .kernel = (dsv4_mhc_kernel)o->opt.mhc, .X_f32 = o->Xf, .workspace = o->ws, .workspace_bytes = o->ws_bytes,
        .cublas = o->cublas, .stream = o->stream};
    DSV4_TRY(dsv4_opt_mhc_pre(&hp));
    PROBE("hc_head", o->xa + (size_t)s * D, D, PR_F32);
    PROBE("norm", o->xn + (size_t)s * D, D, PR_BF16);
    DSV4_TRY(opt_gemm(o, o->logits, 1, V, o->xn, D, o->head, V, D, C));
    PROBE("logits", o->logits + (size_t)s * V, V, PR_F32);
    DSV4_TRY(dsv4_opt_argmax(o->next, o->logits, C, V, V, o->stream));
    DSV4_OPT_CUDA(cudaMemcpyAsync(o->h_next, o->next, (size_t)C * 4, cudaMemcpyDeviceToHost, o->stream));
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

void opt_step_sizes(const dsv4_opt *o, const uint8_t *active, int *n_csa, int *n_hca)
{
    int mc = 0, mh = 0;
    for (int c = 0; c < o->C; c++) {
        if (active && !active[c]) continue;
        int p = o->pos[c];
        if (o->cfg.compress_rate_csa > 0 && (p + 1) / o->cfg.compress_rate_csa > mc) mc = (p + 1) / o->cfg.compress_rate_csa;
        if (o->cfg.compress_rate_hca > 0 && (p + 1) / o->cfg.compress_rate_hca > mh) mh = (p + 1) / o->cfg.compress_rate_hca;
    }
    *n_csa = opt_bucket(mc, o->pool_cap_csa);
    *n_hca = opt_bucket(mh, o->pool_cap_hca);
}

/* Replay the graph of this key, capturing it first when it is new. */
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
        int rc = step_launch(o, n_csa, n_hca);
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

int opt_step_check(const dsv4_opt *o, const int32_t *tokens, const uint8_t *active)
{
    DSV4_CHECK(o && tokens, "dsv4_opt_step: NULL argument");
    for (int c = 0; c < o->C; c++) {
        if (active && !active[c]) continue;
        DSV4_CHECK(o->pos[c] < o->opt.max_context, "dsv4_opt_step: sequence %d is at max_context %d", c,
                   o->opt.max_context);
        DSV4_CHECK(tokens[c] >= 0 && tokens[c] < o->V, "dsv4_opt_step: token %d of sequence %d outside [0, %d)",
                   tokens[c], c, o->V);
    }
    return 0;
}

/* Stage dump_seq's followed rows of this step into h_follow (flags 0 where the dump has none). The previous step
 * synchronised, so the pinned rows are free to rewrite. Following stops for good at the first position whose token
 * is not the dump's. With --gpus N every rank stages its own copy from the same table, tokens and positions, so
 * every rank applies the same rows (the top-k and routing stay identical across ranks). */
static void follow_stage(dsv4_opt *o, const int32_t *tokens, int act)
{
    const int s = o->opt.dump_seq, p = o->pos[s], F = o->follow_stride;
    int nt;
    const int32_t *ft = dsv4_opt_follow_tokens(o->follow, &nt);
    if (act && o->follow_stop < 0 && (p >= nt || ft[p] != tokens[s])) o->follow_stop = p;
    const int on = act && o->follow_stop < 0;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        int32_t *h = o->h_follow + (size_t)L * F;
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

int dsv4_opt_step(dsv4_opt *o, const int32_t *tokens, const uint8_t *active, dsv4_probe_sink *probe,
                  float *logits, int32_t *next)
{
    DSV4_TRY(opt_step_check(o, tokens, active));
    if (o->group) return opt_ranks_step(o->group, tokens, active, probe, logits, next); /* its own broken flag */
    /* a failure inside the step leaves the layers before it with this token in their caches and compressor
     * states, and the positions not advanced: a retry would count the token twice (as opt_ranks_step refuses) */
    DSV4_CHECK(!o->broken, "dsv4_opt_step: an earlier step failed part way (its caches are half written): only "
               "dsv4_opt_free is left");
    int rc = opt_step_rank(o, tokens, active, probe, logits, next);
    if (rc) o->broken = 1;
    return rc;
}

int opt_step_rank(dsv4_opt *o, const int32_t *tokens, const uint8_t *active, dsv4_probe_sink *probe,
                  float *logits, int32_t *next)
{
    const int C = o->C, s = o->opt.dump_seq;
    for (int c = 0; c < C; c++) {
        int act = active ? active[c] != 0 : 1;
        o->h_in[c] = act ? tokens[c] : 0;
        o->h_in[C + c] = o->pos[c];
        o->h_in[2 * C + c] = act;
    }
    if (o->follow) follow_stage(o, tokens, !active || active[s]);
    int n_csa, n_hca;
    opt_step_sizes(o, active, &n_csa, &n_hca);
    const int probing = probe && (!active || active[s]) && dsv4_probe_wants(probe, o->pos[s]);
    o->probe = probing ? probe : NULL;
    const int eager = probing || !o->opt.cuda_graph || opt_ranks_eager(o);
    int rc = eager ? step_launch(o, n_csa, n_hca) : step_graph(o, n_csa, n_hca);
    o->probe = NULL;
    if (rc) return rc;
    DSV4_TRY(opt_wait(o, "the step"));
    if (logits)
        DSV4_OPT_CUDA(cudaMemcpy(logits, o->logits + (size_t)s * o->V, (size_t)o->V * 4, cudaMemcpyDeviceToHost));
    if (next) memcpy(next, o->h_next, (size_t)C * sizeof *next);
    for (int c = 0; c < C; c++)
        if (!active || active[c]) o->pos[c]++;
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
