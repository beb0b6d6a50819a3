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

/* Where ref-gpu holds its weights (docs/reference.md "ref-gpu streams layers"). Both modes give bitwise the same
 * results: the GPU dequantiser gives model/dtype.c's f32 values, and the kernels and their order are the same. */
typedef enum dsv4_ref_gpu_weights {
    /* RESIDENT when the whole model as f32 fits the GPU with a margin (the resident plan's total plus 10% within what
     * dsv4_mem_check_device allows), else STREAM. The default; the plan (dsv4_ref_gpu_plan) says which it chose. */
    DSV4_REF_GPU_WEIGHTS_AUTO,
    /* Every weight dequantised to f32 on the host (model/dtype.c) and uploaded at init: the model in f32 on the GPU. */
    DSV4_REF_GPU_WEIGHTS_RESIDENT,
    /* The checkpoint's own bytes (FP8 + scales, FP4 + scales, bf16, f32) go to the GPU a part at a time (a layer's
     * dense tensors; a routed expert, only when a token routes to it; a row range of the head) through pinned host
     * buffers, the copy of the next part overlapping the compute of the current one, and are dequantised to f32 on
     * the GPU. GPU memory: the state, the scratch, two slots per kind of part and one layer (or the head) and one
     * expert as f32, whatever the number of layers. The model must stay open while the reference lives. */
    DSV4_REF_GPU_WEIGHTS_STREAM,
} dsv4_ref_gpu_weights;

typedef struct dsv4_ref_options {
    dsv4_ref_emulate emulate;      /* default NONE */
    dsv4_ref_weights_mode weights; /* ref-cpu; default LAZY */
    dsv4_ref_gpu_weights gpu_weights; /* ref-gpu; default AUTO */
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
    /* NULL: off. Else layer-local replay (docs/verify.md "Layer-local replay"; either reference, emulate NONE, no
     * follow, run by dsv4_ref_replay_run): every layer starts from the candidate's streams and runs on its window KV,
     * compressed and indexer entries, top-k and router choices and inter-sublayer streams, so the probes are what
     * each layer adds to the CANDIDATE's state; the per-entry probes are the entries this reference makes from the
     * candidate's inputs where judged (ref_replay.c). max_tokens must be the candidate's token count. Borrowed while
     * the reference lives. */
    const dsv4_ref_replay *replay;
} dsv4_ref_options;

/* ---- Layer-local replay's input (reference/ref_replay.c) ----------------------------------------------------
 * The rows of a candidate dump that replay injects. DSV4_ERR_USAGE, naming every missing probe, when the dump lacks
 * what replay needs: at every stored position out, kv, attn_out, attn_hc_post, attn_hc_comb, router_ids and (CSA)
 * topk_idx, and every entry of compressed_kv (CSA, HCA) and indexer_kv (CSA); or when no stored position has its
 * whole window (sliding_window positions up to it, or all from 0) stored. A candidate may store a subset of positions:
 * only the positions whose window is stored are compared (dsv4_ref_replay_compared), and the reference runs only the
 * runs of consecutive stored positions that hold them (the segments). */
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
 * not stored or the layer has none. */
const void *dsv4_ref_replay_row(const dsv4_ref_replay *r, dsv4_ref_replay_kind kind, int layer, int64_t row);
/* The n rows from `row` when all are held as consecutive rows (positions of one segment; entries), else NULL. */
const void *dsv4_ref_replay_rows_at(const dsv4_ref_replay *r, dsv4_ref_replay_kind kind, int layer, int64_t row,
                                    int n);
/* Rows held of kind at layer L: stored positions, or the entries closed by the last token (0: none). */
int64_t dsv4_ref_replay_rows(const dsv4_ref_replay *r, dsv4_ref_replay_kind kind, int layer);
/* The segments the reference runs, ascending: segment i is positions first..last, all stored. */
int dsv4_ref_replay_segments(const dsv4_ref_replay *r);
void dsv4_ref_replay_segment(const dsv4_ref_replay *r, int i, int *first, int *last);
/* The compared positions (those whose window is stored), ascending: what the replay's dump stores. */
const int32_t *dsv4_ref_replay_compared(const dsv4_ref_replay *r, int *n);
/* 1 when the reference's entry w of a compressor of this ratio (overlap 1: CSA's two windows) is made from positions
 * of one segment only, so it is the reference's on the candidate's inputs; else the replay shows the candidate's. */
int dsv4_ref_replay_entry_judged(const dsv4_ref_replay *r, int ratio, int overlap, int64_t w);
/* Run the replay: for each segment the reference's pools get the candidate's entries before it and its entry count is
 * set to the segment's first entry, then one forward over the segment's tokens (probes for the positions probe wants:
 * the compared ones). r was made with options.replay = this replay and max_tokens = its token count. */
int dsv4_ref_replay_run(dsv4_ref *r, dsv4_probe_sink *probe);
/* The defaults: emulate NONE, weights LAZY, gpu_weights AUTO, no following, no progress. */
void dsv4_ref_options_default(dsv4_ref_options *o);
/* "auto", "resident", "stream"; parse: DSV4_ERR_USAGE naming the allowed values. */
const char *dsv4_ref_gpu_weights_name(dsv4_ref_gpu_weights w);
int dsv4_ref_gpu_weights_parse(const char *s, dsv4_ref_gpu_weights *out);
/* "none", "bf16"; parse: DSV4_ERR_USAGE naming the allowed values. */
const char *dsv4_ref_emulate_name(dsv4_ref_emulate e);
int dsv4_ref_emulate_parse(const char *s, dsv4_ref_emulate *out);

/* The memory plan of a reference run (docs/reference.md "The plan before the work"): what it will hold at its peak,
 * in bytes, from the config and the tensors' on-disk dtypes alone (no weight byte is read, so it takes milliseconds
 * on a full checkpoint). */
typedef struct dsv4_ref_plan {
    int gpu;         /* 0: ref-cpu, host memory; 1: ref-gpu, GPU memory (the host's pinned staging apart: pinned) */
    int upfront;     /* ref-cpu: DSV4_REF_WEIGHTS_UPFRONT */
    int streamed;    /* ref-gpu: 1 the weights stream (gpu_weights STREAM, or AUTO when resident does not fit) */
    double weights;  /* weights held at once. Lazy / streamed: arena + expert (+ the slots) + the small globals; else
                      * every weight as f32 */
    double arena;    /* lazy / streamed: the larger of the biggest layer's dense tensors and the head, as f32 */
    double layer;    /* lazy / streamed: the biggest layer's dense tensors as f32 (ref-cpu: not served from the mmap) */
    int layer_at;    /* that layer (-1: none) */
    double head;     /* lazy / streamed: the head as f32 (0: served from the mmap) */
    double expert;   /* lazy / streamed: one routed expert as f32 */
    double slots;    /* streamed: the on-disk bytes' slots on the GPU: 2 x dense_slot + 2 x expert_slot */
    double dense_slot;  /* streamed: one slot for a layer's dense tensors as on disk (or a row range of the head) */
    double expert_slot; /* streamed: one slot for a routed expert as on disk */
    int head_parts;  /* streamed: the row ranges the head travels in */
    double pinned;   /* streamed: pinned host memory (the slots' host side), checked against the host */
    double resident; /* ref-gpu: the resident mode's total (what AUTO compared) */
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
/* The GPU reference's plan with options o (NULL: the defaults): resident (every weight as f32 on the GPU) or
 * streamed (o->gpu_weights; AUTO picks resident when it fits with a margin), the decode state and the scratch of a
 * call, checked against the current device (dsv4_mem_check_device: DSV4_DEVICE_MEM_LIMIT applies; a build without
 * CUDA checks the limit only; with no device to ask, 0: dsv4_ref_gpu_init then says why it cannot run), and the
 * streamed mode's pinned buffers against the host. dsv4_ref_gpu_init_opts makes the same choice. */
int dsv4_ref_gpu_plan(dsv4_model *m, int max_tokens, const dsv4_ref_options *o, dsv4_ref_plan *out);
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
 * rounds the bf16-held weights (on upload, or after the GPU dequantises them) and the activations where the CPU
 * emulation does; follow as there; gpu_weights resident, streamed or auto (decided by dsv4_ref_gpu_plan, checked here
 * before anything is allocated); layer_progress after each layer. Options that do not fit the model (a follow table
 * of another config, an enum value outside its enum) are DSV4_ERR_USAGE before any device is touched, in a build
 * without CUDA too. */
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
/* Where a GPU reference's time and memory went (docs/reference.md "Measured"), summed over its forward calls so far:
 * take it before and after a stretch of calls and subtract. All 0 for ref-cpu. */
typedef struct dsv4_ref_gpu_stats {
    int gpu;                /* 1: ref-gpu */
    int streamed;           /* 1: the weights stream (the counts below); 0: resident */
    int sync;               /* 1: $DSV4_REF_GPU_SYNC=1: every stage ran alone (nothing overlapped), so that
                               wall - fill - copy - dequant is the compute (GEMMs and the other kernels) */
    long calls;             /* forward calls (a prefill of up to 4096 tokens, or a decode step) */
    double wall_s;          /* their wall time */
    long dense_parts, head_parts, expert_parts; /* parts copied: layers' dense tensors, head row ranges, experts */
    double bytes;           /* on-disk bytes copied to the GPU */
    double fill_s;          /* host: the parts' bytes from the mapped checkpoint into pinned buffers (page cache or
                               disk; dtypes the GPU does not read dequantised here) */
    double wait_s;          /* host: waiting for a slot still being copied or dequantised */
    double copy_s;          /* GPU: host-to-device copies (events on the copy stream) */
    double dequant_s;       /* GPU: dequantisation to f32 and the emulation's rounding of the weights (events) */
    double gpu_alloc;       /* bytes the reference allocated on the GPU itself (what its plan counts) */
    double gpu_base;        /* bytes of GPU memory in use before the reference's init (cudaMemGetInfo) */
    double gpu_init;        /* bytes of GPU memory the reference took at init (cudaMemGetInfo before and after) */
    double gpu_peak;        /* the most it held at the end of any call so far: its own buffers and what CUDA made
                               for it lazily (modules, the local memory of kernels with per-thread arrays, cuBLAS's
                               workspace) */
} dsv4_ref_gpu_stats;
/* r's stats into s (zeros for ref-cpu). */
void dsv4_ref_gpu_stats_get(const dsv4_ref *r, dsv4_ref_gpu_stats *s);

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
