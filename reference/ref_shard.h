/* ref_shard.h - the tensor/expert-parallel partition of one decoder layer into N shards, on the CPU reference
 * ops (issue 8; model-spec §6, §8, §10; design.md "multi-GPU"). It is the partition math the N-GPU path runs,
 * proven here without GPUs: for every shard r the functions below compute r's PARTIAL of a layer's outputs,
 * and the sums of the partials over r = 0..N-1 equal the unsharded reference within fp32 rounding.
 *
 * The partition of shard r of N (N must divide H, o_groups, index_n_heads, n_routed_experts and
 * moe_intermediate_size; dsv4_ref_shard_partition says which one it does not):
 * - attention: query heads [r·H/N, (r+1)·H/N): their rows of wq_b, their sinks, per-head norm, RoPE, sink
 *   attention over the REPLICATED key list, inverse RoPE; output groups [r·G/N, (r+1)·G/N) of the grouped
 *   o_a (exactly the groups of those heads: groups are contiguous runs of H/G heads, §6.8) and the matching
 *   columns of o_b → a partial [D]. Replicated on every rank: wq_a + q_norm (q_res also feeds the indexer),
 *   wkv + kv_norm (the one 512-d K=V vector), both compressors, the window ring and the entry pools.
 * - indexer (CSA): indexer heads [r·H_I/N, (r+1)·H_I/N): their rows of idx_wq_b and idx_wproj → partial
 *   scores over the (replicated) indexer key pool; score = Σ_h ω_h ReLU(q_h·k)·d_I^-½ is a sum over heads.
 * - MoE: the router (gate, bias, tid2eid) runs on every rank on the same input, so every rank holds the same
 *   ids and weights; rank r applies only the routed experts with id in [r·E/N, (r+1)·E/N) and its slice
 *   [r·I/N, (r+1)·I/N) of the shared expert's intermediate columns (rows of w1/w3, columns of w2; SwiGLU is
 *   elementwise per column, so the slice is exact) → a partial [D] = its routed sum + its shared slice.
 *
 * Where the partials meet (one all-reduce, sum, each): attention partial [C, D] after o_b (→ attn_out);
 * indexer partial scores [C, n_entries] before the top-k (→ indexer_scores); MoE partial [C, D] (→ ffn_out).
 * The top-k is identical on every rank because every rank selects from the SAME all-reduced scores (one sum,
 * delivered to every rank) with the same deterministic dsv4_ref_topk rule (descending, equal scores keep the
 * lower entry first); routing is identical because its input (the all-reduced residual) and weights are.
 *
 * Quiet traps:
 * - dsv4_ref_index_scores applies H_I^-½ with the H_I it is given. A shard passes its H_I/N heads, so its head
 *   weights are pre-scaled by sqrt(H_I/N)/sqrt(H_I) (exactly 1 at N = 1); forgetting it scales scores by √N.
 * - A shard's heads must be whole output groups (h0 = g0·H/G, nh = ng·H/G): o_a mixes the heads of a group.
 * - The o_b and shared-w2 slices are COLUMN ranges; dsv4_ref_linear takes contiguous weights, so the shard
 *   holds copies of them (what a GPU rank uploads anyway); every row range is a borrowed view.
 */
#ifndef DSV4_REF_SHARD_H
#define DSV4_REF_SHARD_H

#include "ref_model.h"

/* The ranges one shard owns (half-open [x0, x0 + nx)). */
typedef struct dsv4_ref_shard_part {
    int rank, n_shards;
    int h0, nh;   /* query heads: rows h0·d.. of wq_b, sinks[h0..] */
    int g0, ng;   /* output groups: rows g0·o_r.. of wo_a, columns g0·o_r.. of wo_b */
    int hi0, nhi; /* indexer heads: rows hi0·d_I.. of idx_wq_b, rows hi0.. of idx_wproj */
    int e0, ne;   /* routed experts */
    int i0, ni;   /* shared-expert intermediate columns: rows of sh_w1/sh_w3, columns of sh_w2 */
} dsv4_ref_shard_part;

/* The partition of shard `rank` of `n_shards` for cfg. DSV4_ERR_USAGE naming the quantity n_shards does not
 * divide (or a rank outside [0, n_shards)). */
int dsv4_ref_shard_partition(const dsv4_config *cfg, int rank, int n_shards, dsv4_ref_shard_part *out);
/* The plan of `--gpus N` (the optimized path's ranks, docs/multigpu.md), checked before anything is allocated:
 * 1 <= N <= DSV4_REF_SHARD_MAX, N divides every split quantity (the message of dsv4_ref_shard_partition), and
 * N <= n_devices (the CUDA devices of this machine: "--gpus 2: this machine has 1 CUDA device"). All
 * DSV4_ERR_USAGE. parts [N] (NULL: not wanted) receives every rank's ranges. */
enum { DSV4_REF_SHARD_MAX = 64 };
int dsv4_ref_shard_plan(const dsv4_config *cfg, int n_shards, int n_devices, dsv4_ref_shard_part *parts);

/* The FP8 split of `--gpus N --weights fp8` (the optimized path holds each rank's block of an FP8 tensor with
 * its block scales): every per-rank slice of an FP8 linear - rows of wq_b (nh·d), indexer wq_b (nhi·d_I), wo_a
 * (ng·o_r) and shared w1/w3 (ni), columns of wo_b (ng·o_r) and shared w2 (ni) - must be a multiple of `block`
 * (128) so each slice starts and ends on a scale block. N = 1: 0 (every slice is the whole tensor). A plan
 * error first (dsv4_ref_shard_plan's, device count not checked); else DSV4_ERR_USAGE naming the tensor and N. */
int dsv4_ref_shard_check_blocks(const dsv4_config *cfg, int n_shards, int block);

/* One shard: its ranges, borrowed row views of the layer weights, owned column copies, scratch. */
typedef struct dsv4_ref_shard {
    dsv4_config cfg;
    dsv4_ref_shard_part part;
    const dsv4_ref_layer_w *lw; /* [num_hidden_layers] borrowed */
    float **wo_b;               /* [L] -> [D, ng·o_r] owned copies of wo_b's columns g0·o_r.. */
    float **sh_w2;              /* [L] -> [D, ni] owned copies of sh_w2's columns i0.. */
    float idx_wscale;           /* sqrt(nhi)/sqrt(H_I): see the trap above */
    int S_max, m_max, n_max;    /* capacities: tokens per call, keys per query, indexer entries */
    float *z;                   /* [S_max, ng·o_r] */
    float *scores;              /* [nh, m_max] */
    float *idots;               /* [nhi, n_max] */
    float *rlogits;             /* [S_max, E] */
    float *rs;                  /* [E] */
    float *eg, *eu;             /* [S_max, I] */
    float *ey, *racc;           /* [D] */
    float *mem;                 /* owned: every buffer above */
} dsv4_ref_shard;

/* Bind shard `part` (any ranges inside the model: a test may pass a deliberately wrong partition; only
 * bounds and head/group alignment are checked) to the layer weights lw [cfg->num_hidden_layers]. Capacities:
 * S_max tokens per call, m_max keys per query, n_max indexer entries per query. */
int dsv4_ref_shard_init(const dsv4_config *cfg, const dsv4_ref_layer_w *lw, const dsv4_ref_shard_part *part,
                        int S_max, int m_max, int n_max, dsv4_ref_shard **out);
void dsv4_ref_shard_free(dsv4_ref_shard *sh); /* NULL: no-op */

/* Replicated (every rank): q_res [S, q_r] = q_norm(xn [S, D] · wq_aᵀ). */
void dsv4_ref_shard_q_lora(const dsv4_ref_shard *sh, int L, const float *xn, int S, float *qr);
/* The shard's queries q [S, nh·d] = per-head unweighted norm + RoPE of q_res · wq_b[its rows]ᵀ.
 * cos_v/sin_v [S, n_pairs]: the layer's table (main for sliding layers, compress otherwise). */
void dsv4_ref_shard_attn_q(const dsv4_ref_shard *sh, int L, const float *qr, int S, const float *cos_v,
                           const float *sin_v, float *q);
/* Sink attention of one query's nh heads q [nh·d] over its key=value rows kv [m, d] (the same list on every
 * rank), then inverse RoPE: o [nh·d]. cos_v/sin_v [n_pairs] at the query position. DSV4_ERR_USAGE past m_max. */
int dsv4_ref_shard_attn_core(dsv4_ref_shard *sh, int L, const float *q, const float *kv, int m,
                             const float *cos_v, const float *sin_v, float *o);
/* The shard's grouped output projection: partial [S, D] = z · wo_b[:, its columns]ᵀ, z = its groups of o_a
 * over o [S, nh·d]. Σ over shards = attn_out. */
void dsv4_ref_shard_attn_out(dsv4_ref_shard *sh, int L, const float *o, int S, float *partial);
/* The shard's indexer queries qI [S, nhi·d_I] (RoPE'd with the compress table cos_c/sin_c [S, n_pairs]) and
 * pre-scaled head weights wI [S, nhi], from q_res [S, q_r] and xn [S, D]. */
void dsv4_ref_shard_index_q(const dsv4_ref_shard *sh, int L, const float *qr, const float *xn, int S,
                            const float *cos_c, const float *sin_c, float *qI, float *wI);
/* Partial index scores [n] of one query (qI [nhi·d_I], wI [nhi]) over the indexer keys [n, d_I]. Σ over
 * shards = the full score. DSV4_ERR_USAGE past n_max. */
int dsv4_ref_shard_index_scores(dsv4_ref_shard *sh, const float *qI, const float *wI, const float *keys, int n,
                                float *partial);
/* Replicated (every rank): the router of S tokens from xn [S, D] (token ids for hash layers) → ids [S, k],
 * weights [S, k], exactly as the unsharded reference routes. */
void dsv4_ref_shard_route(dsv4_ref_shard *sh, int L, const float *xn, const int32_t *tokens, int S, int32_t *ids,
                          float *weights);
/* The shard's MoE partial [S, D]: its routed experts' weighted sum (router order) + its shared-expert slice.
 * Σ over shards = ffn_out. */
void dsv4_ref_shard_moe(dsv4_ref_shard *sh, int L, const float *xn, const int32_t *ids, const float *weights,
                        int S, float *partial);

#endif /* DSV4_REF_SHARD_H */
