/* dsv4_ref.h - the fp32 reference path (model-spec §4-§12), CPU (C + OpenBLAS) and GPU (CUDA + cuBLAS).
 *
 * One sequence. Prefill of the whole prompt at positions 0..n-1 in one call, then one-token decode steps
 * with the full decode state of model-spec §7.6/§12 (window ring, compressor states, compressed pools,
 * indexer key pool). The decode state grows with the live context, never with max_position_embeddings.
 * The reference borrows the model's weights read-only; it never reads files itself.
 */
#ifndef DSV4_REF_H
#define DSV4_REF_H

#include "dsv4.h"
#include "dsv4_dump.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_ref dsv4_ref;
typedef struct dsv4_ref_replay dsv4_ref_replay; /* a candidate's state for layer-local replay (below) */
typedef struct dsv4_opt_follow dsv4_opt_follow; /* the follow table of dsv4_opt.h (optimized/opt_follow.c) */

/* What the reference rounds besides its own fp32 arithmetic (docs/verify.md "The bf16 emulation of the
 * reference"). NONE: the plain fp32 reference, bitwise what it was before the option existed. BF16: every value the
 * optimized path holds in bf16 (its weights, residual streams, GEMM inputs, caches, attention P and outputs) is
 * rounded to bf16 (round to nearest even) at that place, so the reference becomes an independent model of the bf16
 * design's rounding error. Both references, at the same places (the CPU one, ref_forward.c, is the specification;
 * the GPU one differs from it only in its fp32 summation orders, which the roundings amplify to bf16 size). */
typedef enum dsv4_ref_emulate { DSV4_REF_EMULATE_NONE, DSV4_REF_EMULATE_BF16 } dsv4_ref_emulate;

/* How the CPU reference holds its weights (docs/reference.md "Weights as on disk, dequantised when used"). Both give
 * bitwise the same results. */
typedef enum dsv4_ref_weights_mode {
    /* The default: the checkpoint stays mmapped in its own formats; a layer's tensors are dequantised to f32 when the
     * layer runs (once per call), a routed expert when a token routes to it, the head after the last layer. Memory:
     * about one layer's working set (or the head) + the caches, whatever the number of layers. */
    DSV4_REF_WEIGHTS_LAZY,
    /* Every weight dequantised to f32 at init (the loader's cache), as before issue 36: memory = the whole model in
     * f32. For small models run many times, and to hold the lazy scheme to it (tests/test_ref_lazy.c). */
    DSV4_REF_WEIGHTS_UPFRONT,
} dsv4_ref_weights_mode;

typedef struct dsv4_ref_options {
    dsv4_ref_emulate emulate;      /* default NONE */
    dsv4_ref_weights_mode weights; /* default LAZY */
    /* Called after each layer of every forward call (a prefill or a decode step) with done = layers finished
     * (1..num_hidden_layers) and total = num_hidden_layers: a run of a full-size model takes seconds per layer.
     * NULL: none. ctx is the caller's. */
    dsv4_progress_fn layer_progress;
    void *progress_ctx;
    /* NULL: off. Else decision following as dsv4_opt.h "Decision following": at each position and layer where the
     * table has a topk_idx / router_ids row, the own selection is computed and probed, then the dump's is used
     * (ids both chose keep their slots; router weights recomputed from the own scores for the dump's ids).
     * Following stops at the first position whose token is not the dump's. Borrowed while the reference lives. */
    const dsv4_opt_follow *follow;
    /* NULL: off. Else layer-local replay (docs/verify.md "Layer-local replay"; the CPU reference, emulate NONE, no
     * follow, one forward over all the candidate's tokens): every layer starts from the candidate's streams and runs
     * on its window KV, compressed and indexer entries, top-k and router choices and inter-sublayer streams, so the
     * probes are what each layer adds to the CANDIDATE's state; the per-entry probes are the entries this reference
     * makes from the candidate's inputs. Borrowed while the reference lives. */
    const dsv4_ref_replay *replay;
} dsv4_ref_options;

/* ---- Layer-local replay's input (reference/ref_replay.c) ----------------------------------------------------
 * The rows of a candidate dump that replay injects. DSV4_ERR_USAGE, naming every missing probe (or the first missing
 * position), when the dump lacks what replay needs: every position 0..T-1 of out, kv, attn_out, attn_hc_post,
 * attn_hc_comb, router_ids and (CSA) topk_idx, and every entry of compressed_kv (CSA, HCA) and indexer_kv (CSA). */
typedef enum dsv4_ref_replay_kind {
    DSV4_REF_REPLAY_OUT,      /* f32 [hc_mult * D] the layer's output streams */
    DSV4_REF_REPLAY_KV,       /* f32 [head_dim] the window KV vector */
    DSV4_REF_REPLAY_ATTN_OUT, /* f32 [D] */
    DSV4_REF_REPLAY_HC_POST,  /* f32 [hc_mult] attn_hc_post */
    DSV4_REF_REPLAY_HC_COMB,  /* f32 [hc_mult * hc_mult] attn_hc_comb */
    DSV4_REF_REPLAY_TOPK,     /* i32 [index_topk] */
    DSV4_REF_REPLAY_ROUTER,   /* i32 [experts per token] */
    DSV4_REF_REPLAY_CMP,      /* f32 [head_dim] per entry: compressed_kv */
    DSV4_REF_REPLAY_IDX,      /* f32 [index_head_dim] per entry: indexer_kv */
    DSV4_REF_REPLAY_COUNT
} dsv4_ref_replay_kind;
int dsv4_ref_replay_load(const char *path, const dsv4_config *cfg, dsv4_ref_replay **out);
void dsv4_ref_replay_free(dsv4_ref_replay *r);
const char *dsv4_ref_replay_path(const dsv4_ref_replay *r);
const char *dsv4_ref_replay_weights_digest(const dsv4_ref_replay *r);
const int32_t *dsv4_ref_replay_tokens(const dsv4_ref_replay *r, int *n);
/* Row `row` (a position, or an entry for the per-entry kinds) of `kind` at layer L: f32 or int32 by kind; NULL when
 * out of range or the layer has none. */
const void *dsv4_ref_replay_row(const dsv4_ref_replay *r, dsv4_ref_replay_kind kind, int layer, int64_t row);

/* The defaults: emulate NONE, weights LAZY, no following, no progress. */
void dsv4_ref_options_default(dsv4_ref_options *o);
/* "none", "bf16"; parse: DSV4_ERR_USAGE naming the allowed values. */
const char *dsv4_ref_emulate_name(dsv4_ref_emulate e);
int dsv4_ref_emulate_parse(const char *s, dsv4_ref_emulate *out);

/* The memory plan of a reference run (docs/reference.md "The plan before the work"): what it will hold at its peak,
 * in bytes, from the config and the tensors' on-disk dtypes alone (no weight byte is read, so it takes milliseconds
 * on a full checkpoint). */
typedef struct dsv4_ref_plan {
    int gpu;         /* 0: ref-cpu, host memory; 1: ref-gpu, GPU memory (at least: host staging not counted) */
    int upfront;     /* ref-cpu: DSV4_REF_WEIGHTS_UPFRONT */
    double weights;  /* f32 weights held at once. Lazy: arena + expert + the small globals; else every weight */
    double arena;    /* lazy: the larger of the biggest layer's dense tensors and the head, as f32 */
    double layer;    /* lazy: the biggest layer's dense tensors as f32 (what is not served from the mmap) */
    int layer_at;    /* that layer (-1: none) */
    double head;     /* lazy: the head as f32 (0: served from the mmap) */
    double expert;   /* lazy: one routed expert as f32 */
    double state;    /* decode state for max_tokens positions (+ the hash layers' tid2eid tables) */
    double scratch;  /* the decode step's scratch (ref-gpu: one call of up to 4096 tokens) */
    double prefill;  /* ref-cpu: the prefill's scratch for prefill_tokens tokens */
    double total;
} dsv4_ref_plan;

/* The CPU reference's plan for max_tokens positions of which the first prefill_tokens are one prefill (0: none, the
 * prompt fed token by token), with options o (NULL: the defaults), checked against the host (dsv4_mem_check_host,
 * so DSV4_HOST_MEM_LIMIT applies): 0 when it fits, DSV4_ERR_NOMEM with every number in the message when it does
 * not, another error for a config or tensor the reference cannot run (missing, mis-shaped). out is filled as far as
 * computed. dsv4_ref_cpu_init checks the same plan (without a prefill) before allocating anything. */
int dsv4_ref_cpu_plan(dsv4_model *m, int max_tokens, int prefill_tokens, const dsv4_ref_options *o,
                      dsv4_ref_plan *out);
/* The GPU reference's plan (every weight as f32 on the GPU, the decode state, the scratch of a call), checked
 * against the current device (dsv4_mem_check_device: DSV4_DEVICE_MEM_LIMIT applies; a build without CUDA checks the
 * limit only; with no device to ask, 0: dsv4_ref_gpu_init then says why it cannot run). */
int dsv4_ref_gpu_plan(dsv4_model *m, int max_tokens, dsv4_ref_plan *out);
/* One line of the plan's numbers into buf ("weights 2.1 GiB (a layer at a time: ...), state ..., total ..."). */
const char *dsv4_ref_plan_describe(const dsv4_ref_plan *p, int max_tokens, int prefill_tokens, char *buf,
                                   size_t size);

/* max_tokens: the longest sequence this instance will see (prompt + decode); sizes the whole decode state
 * (window ring, max_tokens div r entries per compressed pool, scratch) once, so decode steps allocate nothing.
 * Every tensor is looked up and size-checked here, so a missing or mis-shaped tensor fails at init; lazy weights
 * (the default) are dequantised when used, up-front ones here. */
int dsv4_ref_cpu_init(dsv4_model *m, int max_tokens, dsv4_ref **out);
/* The same with options (NULL: the defaults, i.e. dsv4_ref_cpu_init). With emulate BF16 the rounded weights are
 * f32 copies (made when used, or here with up-front weights); the decode step still allocates nothing. */
int dsv4_ref_cpu_init_opts(dsv4_model *m, int max_tokens, const dsv4_ref_options *o, dsv4_ref **out);
/* GPU variant on the current CUDA device; DSV4_ERR_UNSUPPORTED in a build without CUDA, DSV4_ERR_CUDA
 * when no device is present. */
int dsv4_ref_gpu_init(dsv4_model *m, int max_tokens, dsv4_ref **out);
/* The same with options (NULL: the defaults, i.e. dsv4_ref_gpu_init), as dsv4_ref_cpu_init_opts: emulate BF16
 * uploads bf16-rounded weights (no extra copy) and rounds the activations where the CPU emulation does; follow as
 * there. Options that do not fit the model (a follow table of another config, an emulate outside the enum) are
 * DSV4_ERR_USAGE before any device is touched, in a build without CUDA too. */
int dsv4_ref_gpu_init_opts(dsv4_model *m, int max_tokens, const dsv4_ref_options *o, dsv4_ref **out);
void dsv4_ref_free(dsv4_ref *r);

/* Prefill tokens [n] at positions 0..n-1 (only valid as the first call; 1 <= n <= max_tokens). Probes go to
 * `probe` (may be NULL) for the stored positions, logits of stored positions included. logits_last [vocab]
 * receives the logits of position n-1 (may be NULL). The prefill allocates its own scratch (freed on return). */
int dsv4_ref_prefill(dsv4_ref *r, const int32_t *tokens, int n, dsv4_probe_sink *probe, float *logits_last);
/* One decode step: feeds `token` at the next position (also valid as the first call: the prompt can be fed
 * token by token from position 0, which gives the same results as one prefill). logits [vocab] (may be NULL).
 * DSV4_ERR_USAGE past max_tokens or for a token outside the vocabulary. Allocates nothing. */
int dsv4_ref_decode(dsv4_ref *r, int32_t token, dsv4_probe_sink *probe, float *logits);
/* Positions consumed so far. */
int dsv4_ref_position(const dsv4_ref *r);
/* Write the per-entry probes (compressed_kv, indexer_kv of every compress layer) to the sink; called once
 * at the end of a run. */
int dsv4_ref_dump_entries(dsv4_ref *r, dsv4_probe_sink *probe);
/* "dsv4 0.1 reference cpu fp32" / "... gpu fp32"; " emulate=bf16" and " follow=<dump file name>" are appended
 * when those options are set. */
const char *dsv4_ref_producer(const dsv4_ref *r);

/* What following did so far (options.follow): rows of the table used, of them the rows whose own selection
 * differed (so the rest ran on the dump's), and the position where following stopped (-1: never). All 0 / -1
 * without following. */
typedef struct dsv4_ref_follow_stats {
    long topk_rows, topk_changed;
    long router_rows, router_changed;
    int stopped_at;
} dsv4_ref_follow_stats;
void dsv4_ref_follow_stats_get(const dsv4_ref *r, dsv4_ref_follow_stats *s);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_REF_H */
