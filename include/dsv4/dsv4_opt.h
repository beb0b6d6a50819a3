/* dsv4_opt.h - the optimized CUDA path (design.md "The paths"; model-spec §4-§12) on one GPU.
 *
 * A batch of C sequences, each with its own length. A step feeds each sequence a RUN of n_c >= 0 consecutive
 * tokens at its next positions (dsv4_opt_step_ragged): 1 is a decode, more a prefill chunk, and all T = sum n_c
 * tokens are processed together as the rows of one step (GEMMs over T rows, the compressors and the window over
 * each run, the indexer and the attention per row with that row's own causal view). A step where every n_c <= 1
 * (dsv4_opt_step) is the decode step: row c is sequence c, CUDA graphs, no fresh-row bookkeeping. Chunked,
 * one-token and whole-prompt feeding run the same state machine (model-spec §7.6) and differ only by the
 * summation orders of GEMMs of other row counts. Per sequence the caches are allocated once for
 * max_context positions (window ring, compressed pools of max_context/r entries, compressor states, indexer key
 * pool); the step allocates nothing (dsv4_opt_device_alloc_count proves it) and is bitwise deterministic.
 * Weights live on the GPU in bf16 (dequantised by the shared loader), in fp32 where model-spec keeps fp32 (mHC
 * parameters, sinks, router bias, compressor position bias, norm weights). Linears are cuBLAS bf16 GEMMs with
 * fp32 accumulation. With weights = fp8 the checkpoint's FP8 linears and FP4 experts stay in their formats on
 * the GPU and run on kernels/qweight.cuh (bf16 activations, fp32 accumulation: the same products).
 *
 * Every named optimization has its switch; the second value of each enum is the naive variant ("the original").
 * Probes: one chosen sequence (dump_seq) of the batch is dumped with the reference's probe names and semantics.
 */
#ifndef DSV4_OPT_H
#define DSV4_OPT_H

#include "dsv4.h"
#include "dsv4_dump.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_opt_attn { DSV4_OPT_ATTN_MMA, DSV4_OPT_ATTN_SIMT } dsv4_opt_attn;
typedef enum dsv4_opt_indexer { DSV4_OPT_INDEXER_BF16, DSV4_OPT_INDEXER_FP32 } dsv4_opt_indexer;
typedef enum dsv4_opt_mhc { DSV4_OPT_MHC_CASTFREE, DSV4_OPT_MHC_ROUNDTRIP } dsv4_opt_mhc;
typedef enum dsv4_opt_index_context { DSV4_OPT_INDEX_LIVE, DSV4_OPT_INDEX_MAX } dsv4_opt_index_context;
typedef enum dsv4_opt_kv { DSV4_OPT_KV_BF16, DSV4_OPT_KV_FP8 } dsv4_opt_kv;
/* How the linears and experts are held on the GPU (issue 11). auto: the checkpoint's own format (fp8 when its
 * linears are F8_E4M3 or its routed experts FP4; bf16 otherwise and for the random bench model unless quantize).
 * bf16: everything dequantised to bf16 by the loader. fp8: the linears the checkpoint keeps in FP8 (wq_a, wq_b,
 * wkv, wo_a, wo_b, indexer wq_b, shared-expert w1/w2/w3) stay e4m3 with their 128x128 block scales, the routed
 * experts packed e2m1 with e8m0 scales per 32 (kernels/qweight.cuh); the rest as in bf16 mode. */
typedef enum dsv4_opt_weights { DSV4_OPT_WEIGHTS_AUTO, DSV4_OPT_WEIGHTS_BF16, DSV4_OPT_WEIGHTS_FP8 } dsv4_opt_weights;
/* fp8: a tensor of the quantised set that is not FP8/FP4 on disk is quantised at load (model/quant.c, model-spec
 * §3 rounding); in bf16 mode its quantised values are dequantised to bf16 (the same weight values as fp8 mode). */
typedef enum dsv4_opt_quantize { DSV4_OPT_QUANTIZE_NONE, DSV4_OPT_QUANTIZE_FP8 } dsv4_opt_quantize;
/* The routed experts of a step with runs of >= 128 rows: grouped (the pairs sorted by expert, one up and one down
 * GEMM per expert: bf16 weights as they are, FP4 weights dequantised per expert into a bounded scratch) or decode
 * (the decode kernels, weights read once per 64 tokens: the naive variant, for the ablation). */
typedef enum dsv4_opt_prefill_experts {
    DSV4_OPT_PREFILL_EXPERTS_GROUPED,
    DSV4_OPT_PREFILL_EXPERTS_DECODE
} dsv4_opt_prefill_experts;
/* The FP8 linears (fp8 mode) of a step with runs of >= 128 rows: gemm (the matrix dequantised to bf16 into a
 * bounded scratch, exact with e8m0 block scales, then one cuBLAS GEMM over the rows; f32 block scales keep the
 * kernel) or kernel (the FP8 linear kernel, tuned for decode: weights re-read per 64 tokens; the naive variant). */
typedef enum dsv4_opt_prefill_linears {
    DSV4_OPT_PREFILL_LINEARS_GEMM,
    DSV4_OPT_PREFILL_LINEARS_KERNEL
} dsv4_opt_prefill_linears;
/* The cast-free mHC pre's projection in a step with runs of >= 256 rows (kernels/mhc.cuh
 * DSV4_MHC_TILED_MIN_TOKENS): tiled (128 tokens per block, fn read once per tile) or rows (the decode kernel, fn
 * re-read per 4 tokens: the naive variant, for the ablation). Decode steps keep the decode kernel at any C. */
typedef enum dsv4_opt_prefill_mhc { DSV4_OPT_PREFILL_MHC_TILED, DSV4_OPT_PREFILL_MHC_ROWS } dsv4_opt_prefill_mhc;

typedef struct dsv4_opt_follow dsv4_opt_follow; /* opaque: the discrete choices of a dump (below) */

enum { DSV4_OPT_MAX_SEQ = 4096, DSV4_OPT_MAX_CONTEXT = 1 << 20 }; /* the bounds of n_seq and max_context */

typedef struct dsv4_opt_options {
    int n_seq;                /* C: sequences decoded together, 1 .. DSV4_OPT_MAX_SEQ */
    int max_context;          /* positions each sequence may reach (caches sized for it), 1 .. DSV4_OPT_MAX_CONTEXT */
    dsv4_opt_attn attn;
    dsv4_opt_indexer indexer;
    dsv4_opt_mhc mhc;
    dsv4_opt_index_context index_context;
    dsv4_opt_kv kv;           /* fp8: e4m3 nope channels with per-64 ue8m0 scales (values held in bf16 slots) */
    int cuda_graph;           /* 1: replay a captured step graph (one per batch shape), 0: launch eagerly */
    int dump_seq;             /* the sequence whose probes go to the sink, 0 <= dump_seq < n_seq */
    int device;               /* CUDA device ordinal (0 with n_gpus >= 1) */
    int n_gpus;               /* 0: one GPU, no NCCL. N >= 1: N ranks on GPUs 0..N-1, tensor + expert parallel
                                 over NCCL (docs/multigpu.md); N must divide the heads, output groups, indexer
                                 heads, routed experts and expert width; with weights fp8 and N > 1 every rank's
                                 FP8 slice must also lie on 128 scale blocks. N = 1 runs the whole NCCL path. */
    dsv4_opt_weights weights; /* default auto */
    dsv4_opt_quantize quantize; /* default none */
    const dsv4_opt_follow *follow; /* NULL: off; else dump_seq follows its choices (borrowed while o lives; with
                                      n_gpus every rank applies the same rows) */
    int max_step_tokens;      /* the token budget of one step (sum of the runs), which sizes the scratch: 0 or
                                 <= n_seq: n_seq (decode only, the scratch of a decode step); at most
                                 DSV4_OPT_MAX_STEP_TOKENS */
    int print_plan;           /* 1: the constructor prints its memory plan to stderr before it allocates */
    dsv4_opt_prefill_experts prefill_experts; /* default grouped */
    dsv4_opt_prefill_linears prefill_linears; /* default gemm */
    int expert_lanes;         /* grouped experts: the per-expert GEMMs (and FP4 dequantisations) of a long run on
                                 this many streams, expert i with rows on lane i mod expert_lanes, each lane with
                                 its own cuBLAS handle and workspace (and FP4 slot); 1 .. DSV4_OPT_MAX_EXPERT_LANES,
                                 default 4; 1: one after another on the step's stream (the ablation). The values do
                                 not depend on it */
    dsv4_opt_prefill_mhc prefill_mhc;         /* default tiled */
} dsv4_opt_options;

enum { DSV4_OPT_MAX_EXPERT_LANES = 8 };

enum { DSV4_OPT_MAX_STEP_TOKENS = 32768 }; /* rows of one step (a CUDA grid dimension bounds them below 65536) */

/* The defaults: every optimization on, C = 1, max_context 4096, graphs on, dump sequence 0, device 0, no NCCL,
 * 4 expert lanes. */
void dsv4_opt_options_default(dsv4_opt_options *o);
/* "mma", "simt", "bf16", "fp32", "castfree", "roundtrip", "live", "max", "bf16", "fp8". */
const char *dsv4_opt_attn_name(dsv4_opt_attn v);
const char *dsv4_opt_indexer_name(dsv4_opt_indexer v);
const char *dsv4_opt_mhc_name(dsv4_opt_mhc v);
const char *dsv4_opt_index_context_name(dsv4_opt_index_context v);
const char *dsv4_opt_kv_name(dsv4_opt_kv v);
const char *dsv4_opt_weights_name(dsv4_opt_weights v);   /* "auto", "bf16", "fp8" */
const char *dsv4_opt_quantize_name(dsv4_opt_quantize v); /* "none", "fp8" */
/* Parse one switch by its command-line name ("attn", "indexer", "mhc", "index-context", "kv", "weights",
 * "quantize") and value into o. DSV4_ERR_USAGE with the allowed values on a bad name or value. */
int dsv4_opt_options_set(dsv4_opt_options *o, const char *name, const char *value);
/* The ranges of the fields above (n_seq, max_context, n_gpus, dump_seq, max_step_tokens, expert_lanes, each switch
 * one of its values): 0, or DSV4_ERR_USAGE naming the field. dsv4_opt_init checks them first. */
int dsv4_opt_options_check(const dsv4_opt_options *o);

typedef struct dsv4_opt dsv4_opt; /* opaque */

/* Uploads the weights, allocates caches and scratch for o->n_seq sequences of o->max_context positions on
 * o->device. Borrows m (read-only) for the call only. DSV4_ERR_UNSUPPORTED in a build without CUDA. */
int dsv4_opt_init(dsv4_model *m, const dsv4_opt_options *o, dsv4_opt **out);
void dsv4_opt_free(dsv4_opt *o);

/* One decode step. tokens [C] (entries of inactive sequences are ignored); active [C] 0/1 or NULL = all active.
 * Each active sequence consumes its token at its next position. probe: sink for dump_seq's probes (NULL: none;
 * probing runs the step eagerly and synchronises after each layer). logits [vocab] (may be NULL): dump_seq's
 * logits. next [C] (may be NULL): each sequence's greedy argmax (ties: lowest id). DSV4_ERR_USAGE when an active
 * sequence is at max_context or a token is outside the vocabulary (nothing done). Any later failure (CUDA, a probe
 * write) leaves the step half done, so every later step is refused: only dsv4_opt_free is left. */
int dsv4_opt_step(dsv4_opt *o, const int32_t *tokens, const uint8_t *active, dsv4_probe_sink *probe,
                  float *logits, int32_t *next);
/* One step over a ragged batch: sequence c takes n_tok[c] >= 0 tokens at its next positions, tokens holding them
 * back to back in sequence order (sum n_tok[c] <= the step budget max(n_seq, max_step_tokens)). probe: dump_seq's
 * probes for every position of its run that the sink stores. logits [vocab] (may be NULL): the logits of
 * dump_seq's last token of this step (untouched when n_tok[dump_seq] is 0). next [C] (may be NULL): each
 * sequence's greedy argmax after its last token (-1 for a sequence with n_tok 0 in a step with runs; a step where
 * every n_tok <= 1 is dsv4_opt_step's and writes every entry). Errors as dsv4_opt_step. */
int dsv4_opt_step_ragged(dsv4_opt *o, const int32_t *tokens, const int32_t *n_tok, dsv4_probe_sink *probe,
                         float *logits, int32_t *next);
/* The step budget o was sized for: max(n_seq, max_step_tokens). */
int dsv4_opt_step_budget(const dsv4_opt *o);

/* ---- Chunk planning (optimized/opt_plan.c: host-only, also in a build without CUDA) ------------------------
 * How a batch is cut into steps within a token budget. want[c]: the tokens sequence c could take now (0: none, 1:
 * a decode, more: the rest of its prompt). Every decode (want 1) takes its token first, in sequence order, while
 * the budget lasts; then the prefills take min(want, what is left), in sequence order, so the earliest prompt
 * finishes first and a decode is never starved by a prompt. n[c] receives the tokens of sequence c in the step;
 * returns their sum (0 when nothing wants a token or budget < 1). */
int dsv4_opt_plan_step(int n_seq, const int32_t *want, int budget, int32_t *n);

/* Positions consumed so far by sequence `seq`. */
int dsv4_opt_position(const dsv4_opt *o, int seq);
/* Start sequence `seq` afresh at position 0 (its compressor states are cleared; caches are reused). */
int dsv4_opt_reset(dsv4_opt *o, int seq);
/* Write dump_seq's per-entry probes (compressed_kv, indexer_kv) to the sink; once, at the end of a run. */
int dsv4_opt_dump_entries(dsv4_opt *o, dsv4_probe_sink *probe);
/* "dsv4 0.1 optimized cuda bf16 sm_90 attn=mma indexer=bf16 mhc=castfree index_context=live kv=bf16 weights=bf16"
 * (+ " quantize=fp8" when set) */
const char *dsv4_opt_producer(const dsv4_opt *o);
/* Device allocations made by the optimized path since the process started (every cudaMalloc of its object: the
 * arenas, buffers and pinned memory; not the kernel timer's L2-flush buffer of dsv4_opt_time_kernels, made
 * outside any step). */
long dsv4_opt_device_alloc_count(void);
/* Device bytes held by o: weights, caches (state) and scratch (with n_gpus >= 1: rank 0's). */
void dsv4_opt_memory(const dsv4_opt *o, size_t *weights, size_t *state, size_t *scratch);
/* NCCL collective timing (n_gpus >= 1): on = 1 records CUDA events around every all-reduce of every rank and
 * runs the steps eagerly (events and graphs are not mixed); on = 0 stops. dsv4_opt_nccl_time: since the last
 * enable, the time inside the collectives summed over the timed steps (the slowest rank's per step, µs), the
 * collectives per step and the timed steps. DSV4_ERR_USAGE without ranks. */
int dsv4_opt_nccl_timing(dsv4_opt *o, int on);
int dsv4_opt_nccl_time(const dsv4_opt *o, double *us, int *calls_per_step, int *steps);
/* The weights mode o runs in (auto resolved: bf16 or fp8). */
dsv4_opt_weights dsv4_opt_weights_mode(const dsv4_opt *o);
/* Weight bytes of decoder layer `layer` on the device (with n_gpus >= 1: rank 0's shard); layer -1: the rest
 * (embedding, head, final norm, hc_head, RoPE tables). The layers and the rest sum to dsv4_opt_memory's weights.
 * 0 for a layer out of range. */
size_t dsv4_opt_layer_weight_bytes(const dsv4_opt *o, int layer);

/* ---- Decision following (optimized/opt_follow.c: host-only, also in a build without CUDA) -----------------
 * Teacher-forcing of the discrete choices, as --tokens-from forces tokens: a reference dump's topk_idx (CSA
 * layers) and router_ids (MoE layers) rows. With options.follow set, at each step of dump_seq at position p and
 * each layer L where the dump holds a row, the path first computes ITS OWN selection (that is what its probes
 * record, so the verifier still measures selection agreement), then runs the rest of the step on the dump's
 * selection: attention gathers the dump's entries; the MoE runs the dump's experts, weighted from the path's own
 * router scores for those ids as the route weights its own picks (s_id / Σ s_id · routed_scale). Ids the two
 * selections share keep their slots, so a step whose selections agree is bitwise the free-running one. No row
 * (position not stored, layer absent, a row of -1 padding only): the path's own selection. Other sequences of
 * the batch are unaffected. Following stops at the first position of dump_seq whose fed token differs from the
 * dump's /tokens (its choices are then about another text). */
typedef enum dsv4_opt_follow_kind { DSV4_OPT_FOLLOW_TOPK, DSV4_OPT_FOLLOW_ROUTER } dsv4_opt_follow_kind;

/* Reads every topk_idx and router_ids row of the dump at `path` into a compact table, checked against cfg (the
 * model that will follow it): layer count, attention and MLP types, index_topk, experts per token, expert count
 * and compression ratios must be the dump's; router rows hold k distinct experts in [0, E) (or only -1); top-k
 * ids lie in [-1, (p+1) div ratio). DSV4_ERR_SHAPE / DSV4_ERR_FORMAT naming the file and dataset otherwise. */
int dsv4_opt_follow_load(const char *path, const dsv4_config *cfg, dsv4_opt_follow **out);
void dsv4_opt_follow_free(dsv4_opt_follow *f);
const char *dsv4_opt_follow_path(const dsv4_opt_follow *f);
/* The dump's weights_digest (dump-format.md), to check it against the model that follows it. */
const char *dsv4_opt_follow_weights_digest(const dsv4_opt_follow *f);
/* The dump's /tokens (owned by f). */
const int32_t *dsv4_opt_follow_tokens(const dsv4_opt_follow *f, int *n);
/* Row width: index_topk (TOPK) or num_experts_per_tok (ROUTER). */
int dsv4_opt_follow_width(const dsv4_opt_follow *f, dsv4_opt_follow_kind kind);
/* The dump's row of `layer` at position `pos` (width ids, owned by f), or NULL when the path uses its own. */
const int32_t *dsv4_opt_follow_row(const dsv4_opt_follow *f, dsv4_opt_follow_kind kind, int layer, int pos);
/* Rows of that kind the table holds (over all layers). */
long dsv4_opt_follow_rows(const dsv4_opt_follow *f, dsv4_opt_follow_kind kind);

/* What following did so far on o: rows of the dump used, of them the rows where the dump's selection differed
 * from the path's own (so the step ran on the dump's), and the position where following stopped (-1: never). */
typedef struct dsv4_opt_follow_stats {
    long topk_rows, topk_changed;
    long router_rows, router_changed;
    int stopped_at;
} dsv4_opt_follow_stats;
int dsv4_opt_follow_stats_get(dsv4_opt *o, dsv4_opt_follow_stats *s);

/* ---- Benchmarking (optimized/opt_random.cu, optimized/opt_bench.c; used by `dsv4 bench`) ----------------- */
/* Like dsv4_opt_init, but from a config alone: every weight is generated on the GPU from `seed` (no files, no
 * host staging; the same (cfg, seed) gives the same weights for any options). For throughput runs only. */
int dsv4_opt_init_random(const dsv4_config *cfg, uint64_t seed, const dsv4_opt_options *o, dsv4_opt **out);
/* Put every sequence at `position` with random valid state: window ring, compressed pools and indexer pool rows
 * [0, position/r) filled with random RMS-1 rows, compressor states empty; positions set. For throughput runs. */
int dsv4_opt_random_state(dsv4_opt *o, int position, uint64_t seed);
/* n values offset + amp * U[-1, 1) from seed into device memory (bf16 bits / f32); stream: a cudaStream_t. */
int dsv4_opt_random_bf16(void *dst, size_t n, uint64_t seed, float offset, float amp, void *stream);
int dsv4_opt_random_f32(float *dst, size_t n, uint64_t seed, float offset, float amp, void *stream);

typedef struct dsv4_opt_kernel_time {
    char name[24];    /* "mhc_pre", "gemm_x", "gemm_wq_b", "indexer", "topk", "attn_csa", "attn_hca", "gemm_wo",
                         "gemm_ffn", "moe_experts", "head" */
    int layer;        /* the layer whose weights it used; -1: none (head) */
    double us;        /* median of single launches, each with a cold L2 (dsv4_opt_stage_times: the stage's
                         device time summed over the timed steps) */
    double bytes;     /* fewest bytes the launch must move */
    double flops;     /* useful FLOPs */
    int work;         /* indexer/top-k: entries per sequence the grid covers; attention: entries gathered */
    int experts;      /* moe_experts: distinct routed experts the batch touches */
} dsv4_opt_kernel_time;
/* Time the main kernels of one decode step, each launched alone with the step's parameters on the current state
 * (call after at least one dsv4_opt_step). Fills out[0 .. *n_out), max_out >= 12. */
int dsv4_opt_time_kernels(dsv4_opt *o, int reps, dsv4_opt_kernel_time *out, int max_out, int *n_out);
/* Indexer scores and top-k of the first CSA layer with n_live live entries per sequence: the grid sized as the
 * step sizes it (live), or over the whole pool (max_context_work = 1). Median µs of each. Clobbers the step's
 * live counts: the next dsv4_opt_step recomputes them. */
int dsv4_opt_time_indexer(dsv4_opt *o, int n_live, int max_context_work, int reps, double *us_scores,
                          double *us_topk);
/* Stage timing of the steps with runs (dsv4 bench --prefill; those steps run eagerly): on = 1 (re)starts it,
 * recording a device event at every stage boundary of each such step, so the stages tile the step from its
 * input copy to its argmax (dsv4_opt_stage_times); on = 0 stops. Decode steps (graphs) are not timed. The
 * one-GPU path only (DSV4_ERR_USAGE with --gpus). */
int dsv4_opt_stage_timing(dsv4_opt *o, int on);
enum { DSV4_OPT_MAX_STAGES = 16 };
/* Since timing was turned on: per stage, in step order, its name ("setup", "mhc_pre", "gemm_x", "q_path",
 * "window_cmp", "indexer_prep", "indexer_scores", "attn", "gemm_wo", "mhc_post", "router_shared",
 * "routed_experts", "head"), its device time summed over the timed steps (us), its useful FLOPs and the fewest
 * bytes it must move over those steps (layer -1, work and experts 0). max_out >= DSV4_OPT_MAX_STAGES; steps:
 * the timed steps. */
int dsv4_opt_stage_times(const dsv4_opt *o, dsv4_opt_kernel_time *out, int max_out, int *n_out, int *steps);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_OPT_H */
