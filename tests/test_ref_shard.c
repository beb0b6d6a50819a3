/* test_ref_shard.c - the multi-GPU partition math of issue 8 on the CPU (reference/ref_shard.h): a prefill of
 * the unsharded reference is dumped (every position, every layer), then for every layer the SAME inputs (the
 * reference's own attn_in / ffn_in / kv probes and its compressed pools, normed with the same ops) are fed to
 * N shards; the partials are summed in rank order 0..N-1 and checked against the reference's attn_out,
 * indexer_scores (+ the identical top-k) and ffn_out, at every prefill position:
 * - golden/tiny (6 heads, 2 groups, 16 indexer heads, 8 experts, width 32): N = 1 (bit-exact: the harness
 *   feeds the reference's own inputs) and N = 2;
 * - a fixture model (tests/support/st_writer.h) with 8 heads, 8 groups, 16 indexer heads, 8 experts, width 32:
 *   N = 2, 4, 8;
 * - the gate fails on wrong partitions (a shard dropping its last head, experts split off by one, a shard
 *   dropping its last indexer head, shared-expert columns off by one), and an N that does not divide the
 *   heads / groups / experts is a DSV4_ERR_USAGE naming them.
 *
 * The bound, 1e-6 on max_i |Σ_r partial_r,i − ref_i| / max_i A_i per position, A_i = Σ_j |t_ij| the sum of the
 * absolute terms the partition regroups (|z|·|W_ob|ᵀ for attn_out, Σ_h |ω_h|·ReLU(q_h·k)·d_I^-½ for the index
 * scores, Σ_j |w_j|·|y_j| + |h|·|W2|ᵀ for ffn_out, formed with the same ops): a shard computes exactly the
 * terms of the unsharded sums, through the same ops, only grouped differently, Σ_r (Σ_{j∈r} t_j) instead of one
 * Σ_j t_j. Both are fp32 sums of the same terms; each rounding step errs by at most 2^-24 ≈ 6e-8 of a partial
 * sum (≤ A_i), and the errors of the few dozen steps here add like a random walk: measured 1-3e-7 (2-5 units of
 * 2^-24), so 1e-6 leaves a 3x margin, while any missing or doubled term (a wrong partition) is of the order of
 * A_i itself (measured 0.2-4). A_i rather than |ref_i| or max|ref|: the index head weights ω can be negative and
 * the fixture's weights are large, so sums cancel (row-max-relative errors reach 2e-6 at N = 2 for a 16-term
 * head sum whose terms are bit-identical to the reference's); the row-max-relative numbers are printed too.
 * The indexer's head weights carry one extra rounding at N = 2, 8 (the H_I^-½ compensation, ref_shard.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/ref_shard.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4_test.h"
#include "st_writer.h"

#define SHARD_TOL 1e-6
enum { T_TOKENS = 40, MAX_SHARDS = 8 };

/* ---------------------------------------------------------------------------------- the reference run */
typedef struct ref_run {
    dsv4_model *m;
    const dsv4_config *cfg;
    dsv4_ref *r;
    dsv4_ref_cpu *c;
    dsv4_dump *d;
    char *dir;
    int32_t tokens[T_TOKENS];
} ref_run;

/* Prefill T_TOKENS tokens with the CPU reference, dumping every position to a temporary file, reopened. */
static void ref_run_open(ref_run *R, const char *model_dir)
{
    memset(R, 0, sizeof *R);
    ck_assert_msg(dsv4_model_open(model_dir, &R->m) == 0, "%s", dsv4_last_error());
    R->cfg = dsv4_model_config(R->m);
    dsv4_ref_options o; /* every layer's weights at once: the shards borrow them all (c->lw) */
    dsv4_ref_options_default(&o);
    o.weights = DSV4_REF_WEIGHTS_UPFRONT;
    ck_assert_msg(dsv4_ref_cpu_init_opts(R->m, T_TOKENS, &o, &R->r) == 0, "%s", dsv4_last_error());
    ck_assert_ptr_nonnull(strstr(dsv4_ref_producer(R->r), "cpu"));
    R->c = R->r->impl;
    int32_t pos[T_TOKENS];
    for (int i = 0; i < T_TOKENS; i++) {
        R->tokens[i] = (int32_t)((i * 37 + 11 + (i * i) % 7) % R->cfg->vocab_size);
        pos[i] = i;
    }
    R->dir = dsv4_test_mkdtemp("shard");
    char path[4096];
    snprintf(path, sizeof path, "%s/ref.h5", R->dir);
    dsv4_dump_meta meta = {.producer = dsv4_ref_producer(R->r), .config_json = dsv4_model_config_json(R->m),
                           .weights_digest = "0", .prompt_len = T_TOKENS, .n_decode = 0, .mode = "forced"};
    dsv4_dump_writer *w = NULL;
    dsv4_probe_sink *sink = NULL;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, R->cfg, R->tokens, T_TOKENS, pos, T_TOKENS, &w) == 0, "%s",
                  dsv4_last_error());
    ck_assert_msg(dsv4_probe_sink_init(w, R->cfg, pos, T_TOKENS, T_TOKENS, &sink) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_ref_prefill(R->r, R->tokens, T_TOKENS, sink, NULL) == 0, "%s", dsv4_last_error());
    dsv4_probe_sink_free(sink);
    ck_assert_msg(dsv4_dump_writer_commit(w) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_dump_open(path, &R->d) == 0, "%s", dsv4_last_error());
}

static void ref_run_close(ref_run *R)
{
    dsv4_dump_free(R->d);
    dsv4_ref_free(R->r);
    dsv4_model_free(R->m);
    dsv4_test_rmtree(R->dir);
}

/* Rows of layers/L/<name> into a malloc'd buffer of `n` elements per row (f32 or i32 as stored). */
static void *read_probe(const ref_run *R, int L, const char *name, size_t elem, size_t *row_len)
{
    char ds[128];
    snprintf(ds, sizeof ds, "layers/%d/%s", L, name);
    dsv4_dataset_info info;
    ck_assert_msg(dsv4_dump_info(R->d, ds, &info) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(info.shape[0], T_TOKENS);
    size_t n = 1;
    for (int k = 1; k < info.ndim; k++) n *= (size_t)info.shape[k];
    void *buf = malloc((size_t)T_TOKENS * n * elem);
    ck_assert_ptr_nonnull(buf);
    ck_assert_msg(dsv4_dump_read_rows(R->d, ds, 0, T_TOKENS, buf) == 0, "%s", dsv4_last_error());
    if (row_len) *row_len = n;
    return buf;
}

/* ------------------------------------------------------------------------------------ the comparison */
/* max_i |a_i − b_i| / max_i |b_i| over finite b (see the header for why row-relative). NaN → +inf. */
static double rel_err(const float *a, const float *b, int n)
{
    double num = 0.0, den = 0.0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(b[i])) continue;
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e == e)) return INFINITY;
        if (e > num) num = e;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return den > 0.0 ? num / den : num;
}

/* max_i |a_i − b_i| / max_i scale_i over finite b: errors against the sum of |terms|. */
static double rel_err_scaled(const float *a, const float *b, const float *scale, int n)
{
    double num = 0.0, den = 0.0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(b[i])) continue;
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e == e)) return INFINITY;
        if (e > num) num = e;
        if (fabs((double)scale[i]) > den) den = fabs((double)scale[i]);
    }
    return den > 0.0 ? num / den : num;
}

/* y [S, n_out] = |x| · |W|ᵀ: the sum of the absolute terms of x · Wᵀ (ax, aw scratch). */
static void linear_abs(float *y, const float *x, const float *w, int S, int n_in, int n_out, float *ax, float *aw)
{
    for (size_t i = 0; i < (size_t)S * n_in; i++) ax[i] = fabsf(x[i]);
    for (size_t i = 0; i < (size_t)n_out * n_in; i++) aw[i] = fabsf(w[i]);
    dsv4_ref_linear(y, ax, aw, S, n_in, n_out);
}

/* The rounding scale of a shard's MoE partial [S, D]: Σ_j |w_j|·|y_j| over its routed experts plus
 * |h|·|W2|ᵀ over its shared columns (h = the SwiGLU activation), recomputed with the ops. */
static void moe_scale(const dsv4_ref_shard *sh, int L, const float *xn, const int32_t *ids, const float *wts, int S,
                      float *out, float *ax, float *aw)
{
    const dsv4_config *f = &sh->cfg;
    const dsv4_ref_layer_w *w = &sh->lw[L];
    const dsv4_ref_shard_part *p = &sh->part;
    int D = f->hidden_size, I = f->moe_intermediate_size, k = f->num_experts_per_tok;
    float limit = (float)f->swiglu_limit;
    float *g = malloc((size_t)S * I * sizeof(float)), *u = malloc((size_t)S * I * sizeof(float));
    float *y = malloc((size_t)D * sizeof(float));
    dsv4_ref_linear(g, xn, w->sh_w1 + (size_t)p->i0 * D, S, D, p->ni);
    dsv4_ref_linear(u, xn, w->sh_w3 + (size_t)p->i0 * D, S, D, p->ni);
    dsv4_ref_swiglu(g, g, u, S * p->ni, limit);
    linear_abs(out, g, sh->sh_w2[L], S, p->ni, D, ax, aw);
    for (int s = 0; s < S; s++)
        for (int j = 0; j < k; j++) {
            int e = ids[(size_t)s * k + j];
            if (e < p->e0 || e >= p->e0 + p->ne) continue;
            dsv4_ref_expert(y, xn + (size_t)s * D, w->w1[e], w->w3[e], w->w2[e], 1, D, I, limit, g, u);
            for (int i = 0; i < D; i++) out[(size_t)s * D + i] += fabsf(wts[(size_t)s * k + j]) * fabsf(y[i]);
        }
    free(g), free(u), free(y);
}

/* A deliberately wrong partition, to prove the gate can fail. */
typedef enum shard_fault {
    FAULT_NONE,
    FAULT_DROP_LAST_HEAD,     /* the last shard leaves its last query head out of the output projection */
    FAULT_EXPERTS_OFF_BY_ONE, /* expert ranges [E·r/N, E·(r+1)/N − 1): the end taken as inclusive */
    FAULT_DROP_INDEX_HEAD,    /* the last shard drops its last indexer head */
    FAULT_SHARED_OFF_BY_ONE,  /* every shard's shared-expert columns start one late */
} shard_fault;

typedef struct shard_result {
    double attn, index, ffn;   /* worst row-relative errors over layers and positions */
    double attn_max, index_max, ffn_max; /* the same errors relative to the row's largest |value| */
    int topk_diff, route_diff; /* rows whose top-k / router ids differ from the reference */
    int index_rows;            /* indexer rows compared */
} shard_result;

/* Every layer, every position: the N shards' summed partials against the reference's dump. */
static shard_result check_shards(const ref_run *R, int N, shard_fault fault)
{
    const dsv4_config *f = R->cfg;
    dsv4_ref_cpu *c = R->c;
    int T = T_TOKENS, D = f->hidden_size, d = f->head_dim, q_r = f->q_lora_rank, np = c->n_pairs;
    int dI = f->index_head_dim, k = f->num_experts_per_tok, Wn = f->sliding_window;
    int topk = f->index_topk > 0 ? f->index_topk : 1;
    int m_max = c->m_max, n_max = c->pool_cap_max > 0 ? c->pool_cap_max : 1;
    shard_result res = {0};

    dsv4_ref_shard *sh[MAX_SHARDS] = {0};
    for (int r = 0; r < N; r++) {
        dsv4_ref_shard_part p;
        ck_assert_msg(dsv4_ref_shard_partition(f, r, N, &p) == 0, "%s", dsv4_last_error());
        if (fault == FAULT_EXPERTS_OFF_BY_ONE) p.ne -= 1;
        if (fault == FAULT_DROP_INDEX_HEAD && r == N - 1) p.nhi -= 1;
        if (fault == FAULT_SHARED_OFF_BY_ONE && p.i0 + p.ni < f->moe_intermediate_size) p.i0 += 1;
        ck_assert_msg(dsv4_ref_shard_init(f, c->lw, &p, T, m_max, n_max, &sh[r]) == 0, "%s", dsv4_last_error());
    }
    float *cos_m = malloc((size_t)T * np * sizeof(float)), *sin_m = malloc((size_t)T * np * sizeof(float));
    float *cos_c = malloc((size_t)T * np * sizeof(float)), *sin_c = malloc((size_t)T * np * sizeof(float));
    for (int s = 0; s < T; s++) {
        dsv4_ref_rope_cos_sin(c->inv_main, np, s, cos_m + (size_t)s * np, sin_m + (size_t)s * np);
        dsv4_ref_rope_cos_sin(c->inv_cmp, np, s, cos_c + (size_t)s * np, sin_c + (size_t)s * np);
    }
    float *xn = malloc((size_t)T * D * sizeof(float)), *qr = malloc((size_t)T * q_r * sizeof(float));
    float *q[MAX_SHARDS], *o[MAX_SHARDS], *qI[MAX_SHARDS], *wI[MAX_SHARDS];
    for (int r = 0; r < N; r++) {
        size_t nh = (size_t)sh[r]->part.nh, nhi = (size_t)sh[r]->part.nhi;
        q[r] = malloc((size_t)T * nh * d * sizeof(float));
        o[r] = malloc((size_t)T * nh * d * sizeof(float));
        qI[r] = malloc((size_t)T * nhi * dI * sizeof(float));
        wI[r] = malloc((size_t)T * nhi * sizeof(float));
        dsv4_test_poison_f32(o[r], (size_t)T * nh * d);
    }
    float *partial = malloc((size_t)T * D * sizeof(float)), *sum = malloc((size_t)T * D * sizeof(float));
    float *scale = malloc((size_t)T * D * sizeof(float));
    size_t wide = (size_t)f->o_groups * f->o_lora_rank > (size_t)f->moe_intermediate_size
                      ? (size_t)f->o_groups * f->o_lora_rank : (size_t)f->moe_intermediate_size;
    float *absx = malloc((size_t)T * (wide > (size_t)D ? wide : (size_t)D) * sizeof(float));
    float *absw = malloc((size_t)D * wide * sizeof(float));
    float *spart = malloc((size_t)n_max * sizeof(float)), *ssum = malloc((size_t)n_max * sizeof(float));
    float *sabs = malloc((size_t)n_max * sizeof(float)), *wabs = malloc((size_t)f->index_n_heads * sizeof(float));
    float *gather = malloc((size_t)m_max * d * sizeof(float));
    int32_t *idx = malloc((size_t)topk * sizeof(int32_t));
    int32_t *ids = malloc((size_t)T * k * sizeof(int32_t)), *ids0 = malloc((size_t)T * k * sizeof(int32_t));
    float *rw = malloc((size_t)T * k * sizeof(float)), *rw0 = malloc((size_t)T * k * sizeof(float));

    for (int L = 0; L < f->num_hidden_layers; L++) {
        const dsv4_ref_layer_w *w = &c->lw[L];
        const dsv4_ref_layer_state *st = &c->ls[L];
        int sliding = w->attn == DSV4_ATTN_SLIDING, csa = w->attn == DSV4_ATTN_CSA;
        const float *cv = sliding ? cos_m : cos_c, *sv = sliding ? sin_m : sin_c;
        float *attn_in = read_probe(R, L, "attn_in", sizeof(float), NULL);
        float *kv = read_probe(R, L, "kv", sizeof(float), NULL);
        float *attn_out = read_probe(R, L, "attn_out", sizeof(float), NULL);
        for (int s = 0; s < T; s++)
            dsv4_ref_rmsnorm(xn + (size_t)s * D, attn_in + (size_t)s * D, w->attn_norm, D, (float)f->rms_norm_eps);

        /* replicated q_res; each shard its heads (and indexer heads) */
        dsv4_ref_shard_q_lora(sh[0], L, xn, T, qr);
        for (int r = 0; r < N; r++) {
            dsv4_ref_shard_attn_q(sh[r], L, qr, T, cv, sv, q[r]);
            if (csa) dsv4_ref_shard_index_q(sh[r], L, qr, xn, T, cos_c, sin_c, qI[r], wI[r]);
        }
        float *iscores = NULL;
        int32_t *ref_topk = NULL;
        size_t n_is = 0;
        if (csa) {
            iscores = read_probe(R, L, "indexer_scores", sizeof(float), &n_is);
            ref_topk = read_probe(R, L, "topk_idx", sizeof(int32_t), NULL);
            ck_assert_int_eq((int)n_is, st->n_ientries);
        }
        for (int p = 0; p < T; p++) {
            /* the key list of query p, as the reference gathers it (window, then entries) */
            int m = 0, lo = p - Wn + 1 > 0 ? p - Wn + 1 : 0;
            for (int t = lo; t <= p; t++, m++)
                memcpy(gather + (size_t)m * d, kv + (size_t)t * d, (size_t)d * sizeof(float));
            if (w->attn == DSV4_ATTN_HCA) {
                int nv = dsv4_ref_entries_visible(p, w->ratio);
                memcpy(gather + (size_t)m * d, st->pool, (size_t)nv * d * sizeof(float));
                m += nv;
            } else if (csa) {
                int n_pool = st->n_ientries, n_vis = dsv4_ref_entries_visible(p, w->ratio);
                for (int r = 0; r < N; r++) {
                    int nhi = sh[r]->part.nhi;
                    const float *wr = wI[r] + (size_t)p * nhi, *qr_ = qI[r] + (size_t)p * nhi * dI;
                    ck_assert_int_eq(dsv4_ref_shard_index_scores(sh[r], qr_, wr, st->ipool, n_pool, spart), 0);
                    for (int i = 0; i < n_pool; i++) ssum[i] = r ? ssum[i] + spart[i] : spart[i];
                    /* the rounding scale: the same sum over |ω_h| (ReLU >= 0) = Σ_h |term_h| */
                    for (int h = 0; h < nhi; h++) wabs[h] = fabsf(wr[h]);
                    ck_assert_int_eq(dsv4_ref_shard_index_scores(sh[r], qr_, wabs, st->ipool, n_pool, spart), 0);
                    for (int i = 0; i < n_pool; i++) sabs[i] = r ? sabs[i] + spart[i] : spart[i];
                }
                if (n_vis > 0) {
                    double e = rel_err(ssum, iscores + (size_t)p * n_is, n_vis);
                    double e2 = rel_err_scaled(ssum, iscores + (size_t)p * n_is, sabs, n_vis);
                    if (e > res.index_max) res.index_max = e;
                    if (e2 > res.index) res.index = e2;
                    res.index_rows++;
                }
                /* the selection every rank makes from the same summed scores */
                int kk = dsv4_ref_index_select(ssum, n_pool, n_vis, f->index_topk, idx);
                const int32_t *rt = ref_topk + (size_t)p * topk;
                int same = 1;
                for (int i = 0; i < topk; i++) same &= (i < kk ? idx[i] : -1) == rt[i];
                res.topk_diff += !same;
                for (int i = 0; i < kk; i++) {
                    if (idx[i] < 0) continue;
                    memcpy(gather + (size_t)m * d, st->pool + (size_t)idx[i] * d, (size_t)d * sizeof(float));
                    m++;
                }
            }
            for (int r = 0; r < N; r++) {
                size_t nhd = (size_t)sh[r]->part.nh * d;
                ck_assert_int_eq(dsv4_ref_shard_attn_core(sh[r], L, q[r] + (size_t)p * nhd, gather, m,
                                                          cv + (size_t)p * np, sv + (size_t)p * np,
                                                          o[r] + (size_t)p * nhd), 0);
                if (fault == FAULT_DROP_LAST_HEAD && r == N - 1)
                    memset(o[r] + (size_t)p * nhd + nhd - d, 0, (size_t)d * sizeof(float));
            }
        }
        for (int r = 0; r < N; r++) {
            dsv4_ref_shard_attn_out(sh[r], L, o[r], T, partial);
            for (size_t i = 0; i < (size_t)T * D; i++) sum[i] = r ? sum[i] + partial[i] : partial[i];
            /* the rounding scale Σ_j |z_j|·|W_ob[i, j]| over this shard's columns (its z is in sh->z) */
            int zc = sh[r]->part.ng * f->o_lora_rank;
            linear_abs(partial, sh[r]->z, sh[r]->wo_b[L], T, zc, D, absx, absw);
            for (size_t i = 0; i < (size_t)T * D; i++) scale[i] = r ? scale[i] + partial[i] : partial[i];
        }
        for (int p = 0; p < T; p++) {
            const float *a = sum + (size_t)p * D, *b = attn_out + (size_t)p * D;
            double e = rel_err_scaled(a, b, scale + (size_t)p * D, D), e2 = rel_err(a, b, D);
            if (e > res.attn) res.attn = e;
            if (e2 > res.attn_max) res.attn_max = e2;
        }
        free(attn_in), free(kv), free(attn_out), free(iscores), free(ref_topk);

        /* MoE: routing on every rank from the same input, then each rank's experts and shared slice */
        float *ffn_in = read_probe(R, L, "ffn_in", sizeof(float), NULL);
        float *ffn_out = read_probe(R, L, "ffn_out", sizeof(float), NULL);
        int32_t *ref_ids = read_probe(R, L, "router_ids", sizeof(int32_t), NULL);
        for (int s = 0; s < T; s++)
            dsv4_ref_rmsnorm(xn + (size_t)s * D, ffn_in + (size_t)s * D, w->ffn_norm, D, (float)f->rms_norm_eps);
        for (int r = 0; r < N; r++) {
            dsv4_ref_shard_route(sh[r], L, xn, R->tokens, T, r ? ids : ids0, r ? rw : rw0);
            if (r) {
                ck_assert_msg(!memcmp(ids, ids0, (size_t)T * k * sizeof *ids), "layer %d: rank %d routes "
                              "differently from rank 0", L, r);
                ck_assert_msg(!memcmp(rw, rw0, (size_t)T * k * sizeof *rw), "layer %d: rank %d weights differ", L, r);
            }
            dsv4_ref_shard_moe(sh[r], L, xn, ids0, rw0, T, partial);
            for (size_t i = 0; i < (size_t)T * D; i++) sum[i] = r ? sum[i] + partial[i] : partial[i];
            moe_scale(sh[r], L, xn, ids0, rw0, T, partial, absx, absw);
            for (size_t i = 0; i < (size_t)T * D; i++) scale[i] = r ? scale[i] + partial[i] : partial[i];
        }
        for (int p = 0; p < T; p++) {
            res.route_diff += memcmp(ids0 + (size_t)p * k, ref_ids + (size_t)p * k, (size_t)k * sizeof *ids0) != 0;
            const float *a = sum + (size_t)p * D, *b = ffn_out + (size_t)p * D;
            double e = rel_err_scaled(a, b, scale + (size_t)p * D, D), e2 = rel_err(a, b, D);
            if (e > res.ffn) res.ffn = e;
            if (e2 > res.ffn_max) res.ffn_max = e2;
        }
        free(ffn_in), free(ffn_out), free(ref_ids);
    }

    for (int r = 0; r < N; r++) {
        free(q[r]), free(o[r]), free(qI[r]), free(wI[r]);
        dsv4_ref_shard_free(sh[r]);
    }
    free(cos_m), free(sin_m), free(cos_c), free(sin_c), free(xn), free(qr), free(partial), free(sum), free(scale), free(absx), free(absw);
    free(spart), free(ssum), free(sabs), free(wabs), free(gather), free(idx), free(ids), free(ids0), free(rw), free(rw0);
    return res;
}

static void print_result(const char *model, int N, const char *what, shard_result r)
{
    printf("shard %-8s N = %d %-22s attn_out %.2g (row-max %.2g)  indexer_scores %.2g (%.2g, %d rows)  ffn_out %.2g "
           "(%.2g)  top-k rows differing %d  router rows differing %d\n", model, N, what, r.attn, r.attn_max, r.index,
           r.index_max, r.index_rows, r.ffn, r.ffn_max, r.topk_diff, r.route_diff);
}

static void expect_pass(const ref_run *R, const char *model, int N)
{
    shard_result r = check_shards(R, N, FAULT_NONE);
    print_result(model, N, "", r);
    ck_assert_msg(r.attn <= SHARD_TOL, "%s N=%d: attn_out rel err %.3g > %g", model, N, r.attn, SHARD_TOL);
    ck_assert_msg(r.index <= SHARD_TOL, "%s N=%d: indexer_scores rel err %.3g > %g", model, N, r.index, SHARD_TOL);
    ck_assert_msg(r.ffn <= SHARD_TOL, "%s N=%d: ffn_out rel err %.3g > %g", model, N, r.ffn, SHARD_TOL);
    ck_assert_msg(r.index_rows > 0, "%s: no indexer rows compared (no CSA entries visible?)", model);
    ck_assert_msg(r.topk_diff == 0, "%s N=%d: %d top-k rows differ from the reference", model, N, r.topk_diff);
    ck_assert_msg(r.route_diff == 0, "%s N=%d: %d router rows differ", model, N, r.route_diff);
    if (N == 1) /* one shard is the reference's own computation: same ops, same shapes, same bits */
        ck_assert_msg(r.attn == 0.0 && r.index == 0.0 && r.ffn == 0.0, "%s N=1 is not bit-exact: %.3g %.3g %.3g",
                      model, r.attn, r.index, r.ffn);
}

/* ------------------------------------------------------------------------------------------- models */
/* The fixture config: dsv4_stw_tiny_config with 8 heads in 8 groups, 16 indexer heads, 8 experts. */
static char *shard_config(void)
{
    static const char *const edits[][2] = {
        {"\"num_attention_heads\": 4", "\"num_attention_heads\": 8"},
        {"\"o_groups\": 2", "\"o_groups\": 8"},
        {"\"index_n_heads\": 4", "\"index_n_heads\": 16"},
        {"\"n_routed_experts\": 4", "\"n_routed_experts\": 8"},
    };
    const char *base = dsv4_stw_tiny_config();
    char *s = malloc(strlen(base) + 64);
    ck_assert_ptr_nonnull(s);
    strcpy(s, base);
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        char *at = strstr(s, edits[e][0]);
        ck_assert_msg(at != NULL, "tiny config lacks %s", edits[e][0]);
        size_t a = strlen(edits[e][0]), b = strlen(edits[e][1]);
        memmove(at + b, at + a, strlen(at + a) + 1);
        memcpy(at, edits[e][1], b);
    }
    return s;
}

static char *make_fixture_model(void)
{
    char *dir = dsv4_test_mkdtemp("shard-model");
    char *cfg = shard_config();
    dsv4_stw_model_opts o = {DSV4_STW_OFFICIAL_F32, NULL, NULL, 1};
    ck_assert_int_eq(dsv4_stw_make_model(dir, cfg, &o), 0);
    free(cfg);
    return dir;
}

/* -------------------------------------------------------------------------------------------- tests */
START_TEST(test_golden_tiny_n1_n2)
{
    ref_run R;
    ref_run_open(&R, dsv4_test_source_path("golden/tiny"));
    expect_pass(&R, "tiny", 1);
    expect_pass(&R, "tiny", 2);
    ref_run_close(&R);
}
END_TEST

START_TEST(test_fixture_n2_n4_n8)
{
    char *dir = make_fixture_model();
    ref_run R;
    ref_run_open(&R, dir);
    const dsv4_config *f = R.cfg;
    ck_assert_int_eq(f->num_attention_heads, 8);
    ck_assert_int_eq(f->o_groups, 8);
    ck_assert_int_eq(f->index_n_heads, 16);
    ck_assert_int_eq(f->n_routed_experts, 8);
    ck_assert_int_eq(f->moe_intermediate_size % 8, 0);
    for (int N = 1; N <= 8; N *= 2) expect_pass(&R, "fixture", N);
    ref_run_close(&R);
    dsv4_test_rmtree(dir);
}
END_TEST

/* The gate can fail: each wrong partition misses or doubles terms of a sum the check covers. */
START_TEST(test_wrong_partition_fails)
{
    char *dir = make_fixture_model();
    ref_run R;
    ref_run_open(&R, dir);
    for (int N = 2; N <= 8; N *= 2) {
        shard_result r = check_shards(&R, N, FAULT_DROP_LAST_HEAD);
        print_result("fixture", N, "(drop last head)", r);
        ck_assert_msg(r.attn > 1e3 * SHARD_TOL, "N=%d: a dropped head passes (attn %.3g)", N, r.attn);
        r = check_shards(&R, N, FAULT_EXPERTS_OFF_BY_ONE);
        print_result("fixture", N, "(experts off by one)", r);
        ck_assert_msg(r.ffn > 1e3 * SHARD_TOL, "N=%d: experts off by one pass (ffn %.3g)", N, r.ffn);
        r = check_shards(&R, N, FAULT_DROP_INDEX_HEAD);
        print_result("fixture", N, "(drop last index head)", r);
        ck_assert_msg(r.index > 1e3 * SHARD_TOL, "N=%d: a dropped indexer head passes (%.3g)", N, r.index);
        r = check_shards(&R, N, FAULT_SHARED_OFF_BY_ONE);
        print_result("fixture", N, "(shared off by one)", r);
        ck_assert_msg(r.ffn > 1e3 * SHARD_TOL, "N=%d: shared columns off by one pass (ffn %.3g)", N, r.ffn);
    }
    ref_run_close(&R);
    dsv4_test_rmtree(dir);
}
END_TEST

/* An N that does not divide the heads, groups, indexer heads, experts or width: DSV4_ERR_USAGE naming it. */
START_TEST(test_indivisible_n_is_an_error)
{
    dsv4_config cfg;
    ck_assert_int_eq(dsv4_config_load(dsv4_test_source_path("golden/tiny/config.json"), &cfg), 0);
    dsv4_ref_shard_part p;
    ck_assert_int_eq(dsv4_ref_shard_partition(&cfg, 0, 4, &p), DSV4_ERR_USAGE); /* 6 heads, 2 groups */
    ck_assert_msg(strstr(dsv4_last_error(), "num_attention_heads = 6") && strstr(dsv4_last_error(), "o_groups = 2"),
                  "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_partition(&cfg, 0, 3, &p), DSV4_ERR_USAGE); /* 3 | 6 heads, not the rest */
    ck_assert_msg(strstr(dsv4_last_error(), "o_groups = 2") && !strstr(dsv4_last_error(), "num_attention_heads"),
                  "%s", dsv4_last_error());
    ck_assert_msg(strstr(dsv4_last_error(), "n_routed_experts = 8"), "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_partition(&cfg, 0, 8, &p), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_ref_shard_partition(&cfg, 0, 0, &p), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_ref_shard_partition(&cfg, 2, 2, &p), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "rank 2"), "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_partition(&cfg, 1, 2, &p), 0);
    ck_assert_int_eq(p.h0, 3);
    ck_assert_int_eq(p.nh, 3);
    ck_assert_int_eq(p.g0, 1);
    ck_assert_int_eq(p.hi0, 8);
    ck_assert_int_eq(p.e0, 4);
    ck_assert_int_eq(p.i0, 16);
    /* a partition whose heads are not whole output groups is refused at init */
    p.h0 = 2;
    dsv4_ref_shard *sh = NULL;
    ck_assert_int_eq(dsv4_ref_shard_init(&cfg, NULL, &p, 1, 1, 1, &sh), DSV4_ERR_USAGE);
    ck_assert_ptr_null(sh);
    ck_assert_msg(strstr(dsv4_last_error(), "output groups"), "%s", dsv4_last_error());
    dsv4_ref_shard_free(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ref_shard");
    TCase *tc = tcase_create("shard");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_golden_tiny_n1_n2);
    tcase_add_test(tc, test_fixture_n2_n4_n8);
    tcase_add_test(tc, test_wrong_partition_fails);
    tcase_add_test(tc, test_indivisible_n_is_an_error);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
