/* ref_shard.c - one decoder layer split into N tensor/expert-parallel shards on the reference ops (issue 8;
 * model-spec §6, §8, §10). The partition, where the partials meet and why the top-k agrees on every rank are
 * in ref_shard.h. This file only slices: every number is computed by an op of ref_ops.h, given the shard's row
 * ranges as pointer offsets and its column ranges as owned contiguous copies.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ref_shard.h"

int dsv4_ref_shard_partition(const dsv4_config *cfg, int rank, int n_shards, dsv4_ref_shard_part *out)
{
    if (n_shards < 1) return dsv4_error(DSV4_ERR_USAGE, "shards: N = %d, need N >= 1", n_shards);
    if (rank < 0 || rank >= n_shards)
        return dsv4_error(DSV4_ERR_USAGE, "shards: rank %d outside [0, %d)", rank, n_shards);
    const struct {
        const char *name;
        int v;
    } q[] = {{"num_attention_heads", cfg->num_attention_heads}, {"o_groups", cfg->o_groups},
             {"index_n_heads", cfg->index_n_heads},             {"n_routed_experts", cfg->n_routed_experts},
             {"moe_intermediate_size", cfg->moe_intermediate_size}};
    char bad[256] = "";
    size_t len = 0;
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        if (q[i].v % n_shards && len < sizeof bad)
            len += (size_t)snprintf(bad + len, sizeof bad - len, "%s%s = %d", len ? ", " : "", q[i].name, q[i].v);
    if (len)
        return dsv4_error(DSV4_ERR_USAGE, "shards: N = %d does not divide %s (N must divide the heads, output "
                          "groups, indexer heads, routed experts and expert width)", n_shards, bad);
    int H = cfg->num_attention_heads, G = cfg->o_groups, HI = cfg->index_n_heads, E = cfg->n_routed_experts;
    int I = cfg->moe_intermediate_size, r = rank, N = n_shards;
    *out = (dsv4_ref_shard_part){.rank = r, .n_shards = N,
                                 .h0 = H * r / N, .nh = H / N, .g0 = G * r / N, .ng = G / N,
                                 .hi0 = HI * r / N, .nhi = HI / N, .e0 = E * r / N, .ne = E / N,
                                 .i0 = I * r / N, .ni = I / N};
    return 0;
}

int dsv4_ref_shard_plan(const dsv4_config *cfg, int n_shards, int n_devices, dsv4_ref_shard_part *parts)
{
    if (n_shards < 1 || n_shards > DSV4_REF_SHARD_MAX)
        return dsv4_error(DSV4_ERR_USAGE, "--gpus %d: want 1..%d", n_shards, DSV4_REF_SHARD_MAX);
    for (int r = 0; r < n_shards; r++) {
        dsv4_ref_shard_part p;
        int rc = dsv4_ref_shard_partition(cfg, r, n_shards, &p);
        if (rc) { /* say it in the command line's words */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", dsv4_last_error());
            return dsv4_error(rc, "--gpus %d: %s", n_shards, strncmp(msg, "shards: ", 8) ? msg : msg + 8);
        }
        if (parts) parts[r] = p;
    }
    /* divisibility first: it is a property of the model, the device count one of the machine */
    if (n_devices < n_shards)
        return dsv4_error(DSV4_ERR_USAGE, "--gpus %d: this machine has %d CUDA device%s", n_shards, n_devices,
                          n_devices == 1 ? "" : "s");
    return 0;
}

/* [lo, lo + n) inside [0, total), n >= min_n */
int dsv4_ref_shard_check_blocks(const dsv4_config *cfg, int n_shards, int block)
{
    if (n_shards == 1) return 0;
    int rc = dsv4_ref_shard_plan(cfg, n_shards, n_shards, NULL);
    if (rc) return rc;
    const int N = n_shards, d = cfg->head_dim, dI = cfg->index_head_dim, o_r = cfg->o_lora_rank;
    const struct {
        const char *tensor, *what;
        int n;
    } s[] = {{"attn.wq_b", "rows", cfg->num_attention_heads / N * d},
             {"attn.indexer.wq_b", "rows", cfg->index_n_heads / N * dI},
             {"attn.wo_a", "rows", cfg->o_groups / N * o_r},
             {"attn.wo_b", "columns", cfg->o_groups / N * o_r},
             {"ffn.shared_experts.w1 / w3", "rows", cfg->moe_intermediate_size / N},
             {"ffn.shared_experts.w2", "columns", cfg->moe_intermediate_size / N}};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        if (s[i].n % block)
            return dsv4_error(DSV4_ERR_USAGE, "--gpus %d --weights fp8: each rank's slice of layers.*.%s is %d %s, "
                              "not a multiple of the %d-%s FP8 scale block (use --weights bf16 or another --gpus)",
                              N, s[i].tensor, s[i].n, s[i].what, block, s[i].what[0] == 'r' ? "row" : "column");
    return 0;
}

static int range_ok(int lo, int n, int total, int min_n) { return lo >= 0 && n >= min_n && lo + n <= total; }

int dsv4_ref_shard_init(const dsv4_config *cfg, const dsv4_ref_layer_w *lw, const dsv4_ref_shard_part *part,
                        int S_max, int m_max, int n_max, dsv4_ref_shard **out)
{
    *out = NULL;
    const dsv4_ref_shard_part *p = part;
    int H = cfg->num_attention_heads, G = cfg->o_groups, HI = cfg->index_n_heads, E = cfg->n_routed_experts;
    int I = cfg->moe_intermediate_size, D = cfg->hidden_size, o_r = cfg->o_lora_rank, L = cfg->num_hidden_layers;
    DSV4_CHECK(G > 0 && H % G == 0, "shards: o_groups %d does not divide the %d heads", G, H);
    int hpg = H / G;
    DSV4_CHECK(range_ok(p->g0, p->ng, G, 1) && p->h0 == p->g0 * hpg && p->nh == p->ng * hpg,
               "shards: rank %d heads [%d, %d) are not the heads of its output groups [%d, %d) (%d heads a group)",
               p->rank, p->h0, p->h0 + p->nh, p->g0, p->g0 + p->ng, hpg);
    DSV4_CHECK(range_ok(p->hi0, p->nhi, HI, 1), "shards: rank %d indexer heads [%d, %d) outside [0, %d)", p->rank,
               p->hi0, p->hi0 + p->nhi, HI);
    DSV4_CHECK(range_ok(p->e0, p->ne, E, 0), "shards: rank %d experts [%d, %d) outside [0, %d)", p->rank, p->e0,
               p->e0 + p->ne, E);
    DSV4_CHECK(range_ok(p->i0, p->ni, I, 1), "shards: rank %d shared-expert columns [%d, %d) outside [0, %d)",
               p->rank, p->i0, p->i0 + p->ni, I);
    DSV4_CHECK(S_max >= 1 && m_max >= 1 && n_max >= 1, "shards: capacities S %d, m %d, n %d must be >= 1", S_max,
               m_max, n_max);

    size_t n_wo = (size_t)D * p->ng * o_r, n_w2 = (size_t)D * p->ni;
    size_t floats = (size_t)L * (n_wo + n_w2) + (size_t)S_max * p->ng * o_r + (size_t)p->nh * m_max +
                    (size_t)p->nhi * n_max + (size_t)S_max * E + (size_t)E + 2 * (size_t)S_max * I + 2 * (size_t)D;
    dsv4_ref_shard *sh = dsv4_ref_alloc(sizeof *sh, "shard");
    if (!sh) return DSV4_ERR_NOMEM;
    sh->wo_b = dsv4_ref_alloc((size_t)L * sizeof *sh->wo_b, "shard wo_b views");
    sh->sh_w2 = dsv4_ref_alloc((size_t)L * sizeof *sh->sh_w2, "shard sh_w2 views");
    sh->mem = dsv4_ref_alloc(floats * sizeof(float), "shard weights + scratch");
    if (!sh->wo_b || !sh->sh_w2 || !sh->mem) {
        dsv4_ref_shard_free(sh);
        return DSV4_ERR_NOMEM;
    }
    sh->cfg = *cfg;
    sh->part = *p;
    sh->lw = lw;
    sh->S_max = S_max;
    sh->m_max = m_max;
    sh->n_max = n_max;
    sh->idx_wscale = sqrtf((float)p->nhi) / sqrtf((float)HI);
    float *m = sh->mem;
    int gw = G * o_r, gs = p->ng * o_r;
    for (int l = 0; l < L; l++) {
        sh->wo_b[l] = m;
        for (int i = 0; i < D; i++)
            memcpy(m + (size_t)i * gs, lw[l].wo_b + (size_t)i * gw + (size_t)p->g0 * o_r, (size_t)gs * sizeof(float));
        m += n_wo;
        sh->sh_w2[l] = m;
        for (int i = 0; i < D; i++)
            memcpy(m + (size_t)i * p->ni, lw[l].sh_w2 + (size_t)i * I + p->i0, (size_t)p->ni * sizeof(float));
        m += n_w2;
    }
    sh->z = m, m += (size_t)S_max * gs;
    sh->scores = m, m += (size_t)p->nh * m_max;
    sh->idots = m, m += (size_t)p->nhi * n_max;
    sh->rlogits = m, m += (size_t)S_max * E;
    sh->rs = m, m += E;
    sh->eg = m, m += (size_t)S_max * I;
    sh->eu = m, m += (size_t)S_max * I;
    sh->ey = m, m += D;
    sh->racc = m;
    *out = sh;
    return 0;
}

void dsv4_ref_shard_free(dsv4_ref_shard *sh)
{
    if (!sh) return;
    dsv4_ref_release(sh->mem);
    dsv4_ref_release(sh->sh_w2);
    dsv4_ref_release(sh->wo_b);
    dsv4_ref_release(sh);
}

void dsv4_ref_shard_q_lora(const dsv4_ref_shard *sh, int L, const float *xn, int S, float *qr)
{
    const dsv4_config *f = &sh->cfg;
    int D = f->hidden_size, q_r = f->q_lora_rank;
    dsv4_ref_linear(qr, xn, sh->lw[L].wq_a, S, D, q_r);
    for (int s = 0; s < S; s++)
        dsv4_ref_rmsnorm(qr + (size_t)s * q_r, qr + (size_t)s * q_r, sh->lw[L].q_norm, q_r, (float)f->rms_norm_eps);
}

void dsv4_ref_shard_attn_q(const dsv4_ref_shard *sh, int L, const float *qr, int S, const float *cos_v,
                           const float *sin_v, float *q)
{
    const dsv4_config *f = &sh->cfg;
    int d = f->head_dim, q_r = f->q_lora_rank, nh = sh->part.nh, np = f->qk_rope_head_dim / 2;
    dsv4_ref_linear(q, qr, sh->lw[L].wq_b + (size_t)sh->part.h0 * d * q_r, S, q_r, nh * d);
    for (int s = 0; s < S; s++)
        for (int h = 0; h < nh; h++) {
            float *qh = q + ((size_t)s * nh + h) * d;
            dsv4_ref_rmsnorm(qh, qh, NULL, d, (float)f->rms_norm_eps);
            dsv4_ref_rope_apply(qh, d, np, cos_v + (size_t)s * np, sin_v + (size_t)s * np, 0);
        }
}

int dsv4_ref_shard_attn_core(dsv4_ref_shard *sh, int L, const float *q, const float *kv, int m,
                             const float *cos_v, const float *sin_v, float *o)
{
    int d = sh->cfg.head_dim, nh = sh->part.nh, np = sh->cfg.qk_rope_head_dim / 2;
    DSV4_CHECK(m >= 1 && m <= sh->m_max, "shards: %d keys for a capacity of %d", m, sh->m_max);
    dsv4_ref_sink_attention(o, q, kv, m, sh->lw[L].sinks + sh->part.h0, nh, d, sh->scores);
    for (int h = 0; h < nh; h++) dsv4_ref_rope_apply(o + (size_t)h * d, d, np, cos_v, sin_v, 1);
    return 0;
}

void dsv4_ref_shard_attn_out(dsv4_ref_shard *sh, int L, const float *o, int S, float *partial)
{
    const dsv4_config *f = &sh->cfg;
    int d = f->head_dim, o_r = f->o_lora_rank, gin = f->num_attention_heads * d / f->o_groups;
    dsv4_ref_grouped_out(partial, sh->z, o, sh->lw[L].wo_a + (size_t)sh->part.g0 * o_r * gin, sh->wo_b[L], S,
                         sh->part.nh, d, sh->part.ng, o_r, f->hidden_size);
}

void dsv4_ref_shard_index_q(const dsv4_ref_shard *sh, int L, const float *qr, const float *xn, int S,
                            const float *cos_c, const float *sin_c, float *qI, float *wI)
{
    const dsv4_config *f = &sh->cfg;
    int D = f->hidden_size, dI = f->index_head_dim, q_r = f->q_lora_rank, nhi = sh->part.nhi;
    int np = f->qk_rope_head_dim / 2;
    dsv4_ref_linear(qI, qr, sh->lw[L].idx_wq_b + (size_t)sh->part.hi0 * dI * q_r, S, q_r, nhi * dI);
    for (int s = 0; s < S; s++)
        for (int h = 0; h < nhi; h++)
            dsv4_ref_rope_apply(qI + ((size_t)s * nhi + h) * dI, dI, np, cos_c + (size_t)s * np,
                                sin_c + (size_t)s * np, 0);
    dsv4_ref_linear(wI, xn, sh->lw[L].idx_wproj + (size_t)sh->part.hi0 * D, S, D, nhi);
    if (sh->idx_wscale != 1.0f)
        for (size_t i = 0; i < (size_t)S * nhi; i++) wI[i] *= sh->idx_wscale;
}

int dsv4_ref_shard_index_scores(dsv4_ref_shard *sh, const float *qI, const float *wI, const float *keys, int n,
                                float *partial)
{
    DSV4_CHECK(n >= 0 && n <= sh->n_max, "shards: %d indexer entries for a capacity of %d", n, sh->n_max);
    dsv4_ref_index_scores(partial, qI, keys, n, wI, sh->part.nhi, sh->cfg.index_head_dim, sh->idots);
    return 0;
}

void dsv4_ref_shard_route(dsv4_ref_shard *sh, int L, const float *xn, const int32_t *tokens, int S, int32_t *ids,
                          float *weights)
{
    const dsv4_config *f = &sh->cfg;
    const dsv4_ref_layer_w *w = &sh->lw[L];
    int D = f->hidden_size, E = f->n_routed_experts, k = f->num_experts_per_tok;
    dsv4_ref_linear(sh->rlogits, xn, w->gate_w, S, D, E);
    for (int s = 0; s < S; s++) {
        const int32_t *hash = w->tid2eid ? w->tid2eid + (size_t)tokens[s] * k : NULL;
        dsv4_ref_route(sh->rlogits + (size_t)s * E, E, k, w->tid2eid ? NULL : w->gate_bias, hash,
                       (float)f->routed_scaling_factor, ids + (size_t)s * k, weights + (size_t)s * k, sh->rs);
    }
}

void dsv4_ref_shard_moe(dsv4_ref_shard *sh, int L, const float *xn, const int32_t *ids, const float *weights,
                        int S, float *partial)
{
    const dsv4_config *f = &sh->cfg;
    const dsv4_ref_layer_w *w = &sh->lw[L];
    const dsv4_ref_shard_part *p = &sh->part;
    int D = f->hidden_size, k = f->num_experts_per_tok, I = f->moe_intermediate_size;
    float limit = (float)f->swiglu_limit;
    dsv4_ref_expert(partial, xn, w->sh_w1 + (size_t)p->i0 * D, w->sh_w3 + (size_t)p->i0 * D, sh->sh_w2[L], S, D,
                    p->ni, limit, sh->eg, sh->eu);
    /* as the unsharded MoE: the routed sum first (router order), the shared output added last */
    for (int s = 0; s < S; s++) {
        const float *x = xn + (size_t)s * D;
        float *po = partial + (size_t)s * D;
        memset(sh->racc, 0, (size_t)D * sizeof(float));
        for (int j = 0; j < k; j++) {
            int e = ids[(size_t)s * k + j];
            if (e < p->e0 || e >= p->e0 + p->ne) continue;
            float wt = weights[(size_t)s * k + j];
            dsv4_ref_expert(sh->ey, x, w->w1[e], w->w3[e], w->w2[e], 1, D, I, limit, sh->eg, sh->eu);
            for (int i = 0; i < D; i++) sh->racc[i] += sh->ey[i] * wt;
        }
        for (int i = 0; i < D; i++) po[i] = sh->racc[i] + po[i];
    }
}
