/* opt_bench.c - kernel-level timing of the optimized path's decode step, for `dsv4 bench`'s per-kernel roofline
 * and its context-scaling curve: each kernel relaunched alone with the parameters the step gives it, on the
 * object's current state.
 *
 * Invariants that fail quietly:
 * - Run after at least one dsv4_opt_step: the step's per-step inputs (positions, live counts, RoPE rows, the
 *   last CSA layer's picks) are what these launches read. Relaunching a kernel rewrites only scratch that the
 *   next step recomputes (scores, picks, gather list, attention/MoE outputs) and never a cache, so timing here
 *   leaves the decode state as it was. dsv4_opt_time_indexer writes live_csa and so must be followed by a step
 *   (which recomputes it) before trusting live_csa again.
 * - Each timed launch starts with a cold L2: a 3 x 60 MB memset runs before it, outside the events (the
 *   conservative case, as bench/bench_common.cuh does). Bytes are the fewest the launch must move; FLOPs the
 *   useful ones (2 per multiply-add of q.k, p.v and the GEMMs).
 * - Experts touched: the distinct ids of the routed picks the last layer's router made for this batch, read back.
 * - Weight bytes are as held: bf16, or in fp8 mode e4m3 codes + block scales and packed e2m1 + e8m0 per 32.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/indexer.cuh"
#include "kernels/kv_layout.h"
#include "kernels/mhc.cuh"
#include "kernels/moe.cuh"
#include "kernels/sparse_attn.cuh"
#include "kernels/step.cuh"
#include "kernels/topk.cuh"
#include "opt_internal.h"

enum { FLUSH_BYTES = 3 * (60 << 20) };

typedef int (*launch_fn)(dsv4_opt *o, const void *ctx);

typedef struct timer {
    cudaEvent_t e0, e1;
    void *flush;
} timer;

static int timer_init(timer *t)
{
    memset(t, 0, sizeof *t);
    DSV4_OPT_CUDA(cudaEventCreate(&t->e0));
    DSV4_OPT_CUDA(cudaEventCreate(&t->e1));
    DSV4_OPT_CUDA(cudaMalloc(&t->flush, FLUSH_BYTES)); /* outside the step: not an opt_dev_alloc */
    return 0;
}

static void timer_free(timer *t)
{
    if (t->e0) cudaEventDestroy(t->e0);
    if (t->e1) cudaEventDestroy(t->e1);
    cudaFree(t->flush);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median µs of `reps` single launches, each after a cold-L2 flush, after 2 warm-up launches. */
static int time_launch(dsv4_opt *o, timer *t, launch_fn fn, const void *ctx, int reps, double *us)
{
    if (reps < 1) reps = 1;
    double *v = malloc((size_t)reps * sizeof *v);
    if (!v) return dsv4_error(DSV4_ERR_NOMEM, "opt_bench: out of host memory");
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) rc = fn(o, ctx);
    for (int i = 0; i < reps && !rc; i++) {
        float ms = 0;
        if (cudaMemsetAsync(t->flush, i & 0xff, FLUSH_BYTES, o->stream) != cudaSuccess ||
            cudaEventRecord(t->e0, o->stream) != cudaSuccess) {
            rc = dsv4_error(DSV4_ERR_CUDA, "opt_bench: flush/event failed");
            break;
        }
        if ((rc = fn(o, ctx))) break;
        if (cudaEventRecord(t->e1, o->stream) != cudaSuccess || cudaEventSynchronize(t->e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, t->e0, t->e1) != cudaSuccess) {
            rc = dsv4_error(DSV4_ERR_CUDA, "opt_bench: event timing failed: %s", cudaGetErrorString(cudaGetLastError()));
            break;
        }
        v[i] = 1000.0 * ms;
    }
    if (!rc) {
        qsort(v, (size_t)reps, sizeof *v, cmp_double);
        *us = v[reps / 2];
    }
    free(v);
    return rc;
}

/* ------------------------------------------------------------------------------------ the launches */
typedef struct kctx {
    int L;            /* layer */
    int n_work;       /* indexer / top-k grid */
    int max_ctx;      /* indexer / top-k context */
    int n_extra;      /* attention: gathered entries past the window */
} kctx;

static int k_mhc_pre(dsv4_opt *o, const void *vc)
{
    const opt_layer *ly = &o->layers[((const kctx *)vc)->L];
    return opt_launch_mhc_pre(o, ly->hc_attn_fn, ly->hc_attn_base, ly->hc_attn_scale, ly->attn_norm);
}

static int k_gemm_x(dsv4_opt *o, const void *vc)
{
    const opt_layer *ly = &o->layers[((const kctx *)vc)->L];
    return opt_proj_apply(o, &ly->x, o->proj, ly->n_x, o->xn, o->D, o->C);
}

static int k_gemm_q(dsv4_opt *o, const void *vc)
{
    const opt_layer *ly = &o->layers[((const kctx *)vc)->L];
    return opt_linear_apply(o, &ly->wq_b, o->qfull, 1, o->H * o->d, o->qr_b, o->qr, o->C);
}

static int k_indexer(dsv4_opt *o, const void *vc)
{
    const kctx *k = vc;
    return opt_launch_indexer(o, &o->layers[k->L], k->n_work, k->max_ctx);
}

static int k_topk(dsv4_opt *o, const void *vc)
{
    const kctx *k = vc;
    return opt_launch_topk(o, k->n_work, k->max_ctx);
}

static int build_index(dsv4_opt *o, const kctx *k)
{
    return opt_launch_step_index(o, &o->layers[k->L], k->n_extra);
}

static int k_attn(dsv4_opt *o, const void *vc)
{
    const kctx *k = vc;
    return opt_launch_sparse_attn(o, &o->layers[k->L], k->n_extra);
}

static int k_gemm_o(dsv4_opt *o, const void *vc)
{
    const opt_layer *ly = &o->layers[((const kctx *)vc)->L];
    const int G = o->G, o_r = o->o_r, C = o->C;
    DSV4_TRY(opt_linear_apply_grouped(o, &ly->wo_a, G, o->z, G * o_r, o->o, o->H * o->d, C));
    return opt_linear_apply(o, &ly->wo_b, o->aout, 1, o->D, o->z, G * o_r, C);
}

static int k_gemm_ffn(dsv4_opt *o, const void *vc)
{
    const opt_layer *ly = &o->layers[((const kctx *)vc)->L];
    const int nf = o->E + 2 * o->NI_sh; /* the rank's shared-expert columns */
    return opt_proj_apply(o, &ly->f, o->fproj, nf, o->xn, o->D, o->C);
}

static int k_experts(dsv4_opt *o, const void *vc)
{
    return opt_experts(o, &o->layers[((const kctx *)vc)->L]); /* the rank's expert range */
}

static int k_head(dsv4_opt *o, const void *vc)
{
    (void)vc;
    return opt_gemm(o, o->logits, 1, o->V, o->xn, o->D, o->head, o->V, o->D, o->C);
}

/* ------------------------------------------------------------------------------------ public */
static int distinct_experts(dsv4_opt *o, int *n)
{
    const int nk = o->C * o->K;
    int32_t *ids = malloc((size_t)nk * sizeof *ids);
    char *seen = calloc((size_t)o->E, 1);
    int rc = ids && seen ? 0 : dsv4_error(DSV4_ERR_NOMEM, "opt_bench: out of host memory");
    if (!rc && cudaMemcpy(ids, o->rids, (size_t)nk * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        rc = dsv4_error(DSV4_ERR_CUDA, "opt_bench: reading the router picks failed");
    *n = 0;
    for (int i = 0; !rc && i < nk; i++)
        if (ids[i] >= o->e0 && ids[i] < o->e0 + o->E_loc && !seen[ids[i]]) seen[ids[i]] = 1, ++*n; /* the rank's */
    free(ids);
    free(seen);
    return rc;
}

static int first_layer(const dsv4_opt *o, dsv4_attn_type t)
{
    for (int L = 0; L < o->cfg.num_hidden_layers; L++)
        if (o->layers[L].attn == t) return L;
    return -1;
}

int dsv4_opt_time_kernels(dsv4_opt *o, int reps, dsv4_opt_kernel_time *out, int max_out, int *n_out)
{
    DSV4_CHECK(o && out && n_out && max_out >= 12, "dsv4_opt_time_kernels: bad arguments");
    *n_out = 0;
    int n_csa = 0, n_hca = 0, n_exp = 0;
    /* the work sizes of the last step: positions already advanced, so step back by one */
    for (int c = 0; c < o->C; c++) o->pos[c]--;
    opt_step_sizes(o, NULL, &n_csa, &n_hca);
    for (int c = 0; c < o->C; c++) o->pos[c]++;
    DSV4_TRY(distinct_experts(o, &n_exp));
    timer t;
    int rc = timer_init(&t);
    const double C = o->C, D = o->D, n = o->n, H = o->H, d = o->d, HI = o->HI, dI = o->dI, NI = o->NI, K = o->K;
    const double mix = (2 + n) * n;
    const int Lc = first_layer(o, DSV4_ATTN_CSA), Lh = first_layer(o, DSV4_ATTN_HCA);
    const int L0 = Lc >= 0 ? Lc : 0;
    const int max_ctx = o->opt.index_context == DSV4_OPT_INDEX_MAX;
    const opt_layer *l0 = &o->layers[L0];
    struct {
        const char *name;
        int L;
        launch_fn fn;
        kctx k;
        double bytes, flops;
        int skip;
    } ks[12];
    int nk = 0;
#define KADD(nm, layer, f, ctxv, b, fl, sk)                                                                      \
    do {                                                                                                         \
        ks[nk].name = (nm), ks[nk].L = (layer), ks[nk].fn = (f), ks[nk].k = (ctxv), ks[nk].bytes = (b);          \
        ks[nk].flops = (fl), ks[nk].skip = (sk), nk++;                                                           \
    } while (0)
    kctx k0 = {L0, 0, 0, 0};
    KADD("mhc_pre", L0, k_mhc_pre, k0, C * n * D * 2 + mix * n * D * 4 + C * D * 6, 2 * C * mix * n * D, 0);
    double wx = 0, wf = 0; /* weight bytes as held (bf16, or fp8 codes + scales) */
    for (int i = 0; i < l0->x.n; i++) wx += opt_linear_bytes(&l0->x.lin[i]);
    for (int i = 0; i < l0->f.n; i++) wf += opt_linear_bytes(&l0->f.lin[i]);
    const double w_expert = o->fp8 ? 3 * NI * D * (0.5 + 1.0 / 32) : 3 * NI * D * 2;
    KADD("gemm_x", L0, k_gemm_x, k0, wx + C * D * 2 + C * l0->n_x * 4, 2 * C * l0->n_x * D, 0);
    KADD("gemm_wq_b", L0, k_gemm_q, k0, opt_linear_bytes(&l0->wq_b) + C * o->qr * 2 + C * H * d * 4,
         2 * C * H * d * o->qr, 0);
    const int nw = max_ctx ? o->pool_cap_csa : (n_csa > 0 ? n_csa : 1);
    kctx ki = {L0, nw, max_ctx, 0};
    /* live entries per sequence of the last step (all sequences share one position in dsv4 bench) */
    double live = Lc >= 0 ? (double)((o->pos[0]) / o->layers[Lc].ratio) : 0;
    KADD("indexer", Lc, k_indexer, ki, C * live * dI * 2 + C * HI * dI * 2 + C * live * 4, 2 * C * live * HI * dI,
         Lc < 0);
    KADD("topk", Lc, k_topk, ki, C * live * 4 + C * o->topk * 4, 0, Lc < 0);
    kctx ka = {Lc, 0, 0, o->topk};
    double nidx_c = o->W + (live < o->topk ? live : o->topk);
    const double entry = (double)o->layers[0].kv_entry_bytes;
    KADD("attn_csa", Lc, k_attn, ka, C * nidx_c * entry + C * H * d * 4, 4 * C * H * nidx_c * d, Lc < 0);
    kctx kh = {Lh, 0, 0, n_hca};
    double hlive = Lh >= 0 ? (double)(o->pos[0] / o->layers[Lh].ratio) : 0;
    KADD("attn_hca", Lh, k_attn, kh, C * (o->W + hlive) * entry + C * H * d * 4, 4 * C * H * (o->W + hlive) * d,
         Lh < 0);
    KADD("gemm_wo", L0, k_gemm_o, k0,
         opt_linear_bytes(&l0->wo_a) + opt_linear_bytes(&l0->wo_b) + C * H * d * 2 + C * D * 4,
         2 * C * (H * d * o->o_r + D * o->G * o->o_r), 0);
    const double NS = o->NI_sh; /* the rank's shared-expert columns */
    KADD("gemm_ffn", L0, k_gemm_ffn, k0, wf + C * D * 2 + C * (o->E + 2 * NS) * 4, 2 * C * (o->E + 2 * NS) * D, 0);
    KADD("moe_experts", L0, k_experts, k0, n_exp * w_expert + C * D * 2 + C * D * 8, 2 * C * K * 3 * NI * D, 0);
    KADD("head", -1, k_head, k0, (double)o->V * D * 2 + C * D * 2 + C * o->V * 4, 2 * C * o->V * D, 0);
#undef KADD
    for (int i = 0; i < nk && !rc; i++) {
        if (ks[i].skip) continue;
        if (ks[i].fn == k_attn) rc = build_index(o, &ks[i].k);
        double us = 0;
        if (!rc) rc = time_launch(o, &t, ks[i].fn, &ks[i].k, reps, &us);
        if (rc) break;
        dsv4_opt_kernel_time *r = &out[(*n_out)++];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "%s", ks[i].name);
        r->layer = ks[i].L, r->us = us, r->bytes = ks[i].bytes, r->flops = ks[i].flops;
        r->work = ks[i].fn == k_indexer || ks[i].fn == k_topk ? nw : ks[i].fn == k_attn ? o->W + ks[i].k.n_extra : 0;
        r->experts = ks[i].fn == k_experts ? n_exp : 0;
    }
    timer_free(&t);
    return rc;
}

int dsv4_opt_time_indexer(dsv4_opt *o, int n_live, int max_context_work, int reps, double *us_scores,
                          double *us_topk)
{
    const int Lc = o ? first_layer(o, DSV4_ATTN_CSA) : -1;
    DSV4_CHECK(o && us_scores && us_topk, "dsv4_opt_time_indexer: NULL argument");
    DSV4_CHECK(Lc >= 0, "dsv4_opt_time_indexer: the model has no CSA layer");
    DSV4_CHECK(n_live >= 1 && n_live <= o->pool_cap_csa, "dsv4_opt_time_indexer: %d live entries outside [1, %d]",
               n_live, o->pool_cap_csa);
    int *h = malloc((size_t)o->C * sizeof *h);
    if (!h) return dsv4_error(DSV4_ERR_NOMEM, "opt_bench: out of host memory");
    for (int c = 0; c < o->C; c++) h[c] = n_live;
    /* on o->stream and waited for: a pageable cudaMemcpy may return before its DMA lands, and the timed kernels
     * run on the non-blocking o->stream */
    cudaError_t e = cudaMemcpyAsync(o->live_csa, h, (size_t)o->C * 4, cudaMemcpyHostToDevice, o->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(o->stream);
    free(h);
    if (e != cudaSuccess) return dsv4_error(DSV4_ERR_CUDA, "opt_bench: live counts: %s", cudaGetErrorString(e));
    /* the live grid as the step sizes it */
    kctx k = {Lc, max_context_work ? o->pool_cap_csa : opt_bucket(n_live, o->pool_cap_csa), max_context_work, 0};
    timer t;
    int rc = timer_init(&t);
    if (!rc) rc = time_launch(o, &t, k_indexer, &k, reps, us_scores);
    if (!rc) rc = time_launch(o, &t, k_topk, &k, reps, us_topk);
    timer_free(&t);
    return rc;
}

/* ------------------------------------------------------------------------------------ stage timing (prefill) */
/* The stages tile a step with runs: one event opens each stage (opt_prof_mark in opt_step.c), the next event
 * closes it, so the stage times sum to the step's device time from its input copy to its argmax, host launch gaps
 * and the experts' offset read-back included in the stage they fall in. Unlike dsv4_opt_time_kernels (each kernel
 * relaunched alone, cold L2) this times the step itself: a prefill step writes caches and compressor states that a
 * relaunch would write twice, and its stages see the L2 the previous stage left, as in a real prefill. */
static const char *const stage_names[OPT_STAGES] = {
    "setup",  "mhc_pre", "gemm_x",   "q_path",   "window_cmp",    "indexer_prep",   "indexer_scores",
    "attn",   "gemm_wo", "mhc_post", "router_shared", "routed_experts", "head"};

int opt_prof_mark(dsv4_opt *o, int stage)
{
    if (!o->prof_on || !o->runs) return 0;
    DSV4_CHECK(o->prof_n < o->prof_cap, "stage timing: more than %d stage boundaries in one step", o->prof_cap);
    DSV4_OPT_CUDA(cudaEventRecord(o->prof_ev[o->prof_n], o->stream));
    o->prof_stage[o->prof_n++] = stage;
    return 0;
}

/* The useful FLOPs and fewest bytes of each stage of the step just run (its rows: row0/nrun/pos, positions not
 * yet advanced), counted as dsv4_opt_time_kernels counts a decode step's kernels, with each row's own live
 * counts; weights as held, read once per step. */
static void prof_work(dsv4_opt *o, double *fl, double *by)
{
    const double T = o->T, D = o->D, n = o->n, H = o->H, d = o->d, qr = o->qr, HI = o->HI, dI = o->dI,
                 E = o->E, K = o->K, NI = o->NI, NS = o->NI_sh, G = o->G, o_r = o->o_r, V = o->V;
    const double mix = (2 + n) * n;
    const double w_expert = o->fp8 ? 3 * NI * D * (0.5 + 1.0 / 32) : 3 * NI * D * 2;
    /* distinct experts T·K uniform picks touch, expected (the held ones) */
    const double touched = o->E_loc * (1.0 - pow(1.0 - K / E, T));
    double n_head = 0;
    for (int c = 0; c < o->C; c++) n_head += o->nrun[c] > 0;
    by[OPT_STAGE_SETUP] += T * n * D * 2;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        const opt_layer *ly = &o->layers[L];
        const int csa = ly->attn == DSV4_ATTN_CSA, hca = ly->attn == DSV4_ATTN_HCA, r = ly->ratio;
        const double nx = ly->n_x, entry = (double)ly->kv_entry_bytes, width = (csa ? 2 : 1) * d;
        double wx = 0, wf = 0;
        for (int i = 0; i < ly->x.n; i++) wx += opt_linear_bytes(&ly->x.lin[i]);
        for (int i = 0; i < ly->f.n; i++) wf += opt_linear_bytes(&ly->f.lin[i]);
        fl[OPT_STAGE_MHC_PRE] += 2 * 2 * T * mix * n * D;
        by[OPT_STAGE_MHC_PRE] += 2 * (T * n * D * 2 + T * D * 6 + mix * n * D * 4);
        fl[OPT_STAGE_GEMM_X] += 2 * T * nx * D;
        by[OPT_STAGE_GEMM_X] += wx + T * D * 2 + T * nx * 4;
        fl[OPT_STAGE_Q] += 2 * T * H * d * qr;
        by[OPT_STAGE_Q] += opt_linear_bytes(&ly->wq_b) + T * qr * 2 + T * H * d * 6;
        by[OPT_STAGE_WINDOW_CMP] += T * entry + (r > 0 ? T * 2 * width * 4 + T / r * entry : 0);
        if (csa) {
            fl[OPT_STAGE_IDX_PREP] += 2 * T * HI * dI * qr;
            by[OPT_STAGE_IDX_PREP] += opt_linear_bytes(&ly->idx_wq_b) + T * (qr * 2 + HI * dI * 6 + 4 * dI * 4);
        }
        double live_sum = 0, ent_sum = 0, last_live = 0;
        for (int c = 0; c < o->C; c++) {
            double lv = 0;
            for (int j = 0; j < o->nrun[c]; j++) {
                const int p = o->pos[c] + j;
                lv = r > 0 ? (double)((p + 1) / r) : 0;
                if (lv > ly->pool_cap) lv = ly->pool_cap;
                live_sum += lv;
                ent_sum += (p + 1 < o->W ? p + 1 : o->W) + (csa ? (lv < o->topk ? lv : o->topk) : hca ? lv : 0);
            }
            last_live += lv; /* the entries each sequence's run reaches: its pool, read once at best */
        }
        if (csa) {
            fl[OPT_STAGE_IDX_SCORES] += 2 * HI * dI * live_sum;
            by[OPT_STAGE_IDX_SCORES] += last_live * dI * 2 + live_sum * 8 + T * HI * dI * 2;
        }
        fl[OPT_STAGE_ATTN] += 4 * H * d * ent_sum;
        by[OPT_STAGE_ATTN] += T * H * d * 4 + last_live * entry;
        fl[OPT_STAGE_WO] += 2 * T * (H * d * o_r + G * o_r * D);
        by[OPT_STAGE_WO] += opt_linear_bytes(&ly->wo_a) + opt_linear_bytes(&ly->wo_b) +
                            T * (H * d * 2 + G * o_r * 2 + D * 4);
        fl[OPT_STAGE_MHC_POST] += 2 * 2 * T * n * (n + 1) * D;
        by[OPT_STAGE_MHC_POST] += 2 * T * (2 * n * D * 2 + D * 4);
        fl[OPT_STAGE_ROUTER_SHARED] += 2 * T * (E + 2 * NS) * D + 2 * T * D * NS;
        by[OPT_STAGE_ROUTER_SHARED] +=
            wf + opt_linear_bytes(&ly->sh_w2) + T * (D * 2 + (E + 2 * NS) * 4 + NS * 2 + D * 4);
        fl[OPT_STAGE_EXPERTS] += 2 * T * K * 3 * NI * D;
        by[OPT_STAGE_EXPERTS] += touched * w_expert + T * (D * 2 + D * 4);
    }
    fl[OPT_STAGE_HEAD] += 2 * n_head * V * D;
    by[OPT_STAGE_HEAD] += V * D * 2 + T * n * D * 2;
}

int opt_prof_account(dsv4_opt *o)
{
    const int ne = o->prof_n;
    o->prof_n = 0;
    DSV4_CHECK(ne >= 2 && o->prof_stage[0] == OPT_STAGE_SETUP && o->prof_stage[ne - 1] == OPT_STAGE_END,
               "stage timing: the step recorded %d boundaries, not from setup to its end", ne);
    for (int i = 0; i + 1 < ne; i++) {
        float ms = 0.0f;
        DSV4_OPT_CUDA(cudaEventElapsedTime(&ms, o->prof_ev[i], o->prof_ev[i + 1]));
        o->prof_ms[o->prof_stage[i]] += ms;
    }
    prof_work(o, o->prof_flops, o->prof_bytes);
    o->prof_steps++;
    return 0;
}

int dsv4_opt_stage_timing(dsv4_opt *o, int on)
{
    DSV4_CHECK(o && !o->group, "dsv4_opt_stage_timing: the one-GPU path only");
    /* per layer at most 13 boundaries (two mHC pre and post sites, the indexer's two), plus setup, head, end */
    const int cap = 13 * o->cfg.num_hidden_layers + 3;
    if (on && !o->prof_ev) {
        o->prof_ev = calloc((size_t)cap, sizeof *o->prof_ev);
        o->prof_stage = calloc((size_t)cap, sizeof *o->prof_stage);
        if (!o->prof_ev || !o->prof_stage) {
            free(o->prof_ev), free(o->prof_stage);
            o->prof_ev = NULL, o->prof_stage = NULL;
            return dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory");
        }
        o->prof_cap = cap;
        for (int i = 0; i < cap; i++) DSV4_OPT_CUDA(cudaEventCreate(&o->prof_ev[i]));
    }
    if (!on && o->prof_ev) {
        for (int i = 0; i < o->prof_cap; i++)
            if (o->prof_ev[i]) cudaEventDestroy(o->prof_ev[i]);
        free(o->prof_ev);
        free(o->prof_stage);
        o->prof_ev = NULL, o->prof_stage = NULL, o->prof_cap = 0;
    }
    o->prof_on = on;
    o->prof_n = 0, o->prof_steps = 0;
    for (int i = 0; i < OPT_STAGES; i++) o->prof_ms[i] = o->prof_flops[i] = o->prof_bytes[i] = 0.0;
    return 0;
}

int dsv4_opt_stage_times(const dsv4_opt *o, dsv4_opt_kernel_time *out, int max_out, int *n_out, int *steps)
{
    _Static_assert((int)OPT_STAGES <= (int)DSV4_OPT_MAX_STAGES, "the public bound on the stages");
    DSV4_CHECK(o && out && n_out && steps && max_out >= OPT_STAGES, "dsv4_opt_stage_times: bad arguments");
    for (int i = 0; i < OPT_STAGES; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", stage_names[i]);
        out[i].layer = -1, out[i].us = 1e3 * o->prof_ms[i];
        out[i].flops = o->prof_flops[i], out[i].bytes = o->prof_bytes[i];
    }
    *n_out = OPT_STAGES;
    *steps = o->prof_steps;
    return 0;
}
