/* opt_internal.h - internals of the optimized path shared by its host files (opt_layout.c: the arenas' layout and
 * the init sequence of both constructors; opt_model.c: options, the loader's weight source, init/free;
 * opt_random.cu: the generator's weight source and random state; opt_step.c: the step over a ragged batch, its
 * CUDA graphs and the probes).
 *
 * Ownership: three device arenas, one per lifetime (style rule 9): weights (read-only after init), state (the
 * per-sequence caches), scratch (the step's work buffers, sized for the step budget Tm of rows). Every view below points into one
 * of them; opt_free releases the three. All cudaMalloc calls of the object go through opt_dev_alloc (counted;
 * opt_bench.c's L2-flush buffer of the kernel timer, outside any step, is its own).
 *
 * Invariants that fail quietly:
 * - The attention KV buffer of a layer and sequence is [W + pool_cap, d] bf16: rows 0..W-1 the window ring
 *   (slot = pos mod W), rows W + w the compressed entries (OFF's kv_cache layout, model-spec §9).
 * - The x-projection of a layer writes the columns [wq_a | wkv | cmp_wkv | cmp_wgate | idx_wkv | idx_wgate |
 *   idx_wproj] of one output row (absent parts have 0 rows); the ffn projection [gate | sh_w1 | sh_w3].
 *   Consumers read their columns at the recorded offsets. In bf16 mode each is ONE fused GEMM; in fp8 mode the
 *   FP8 linears (wq_a, wkv; sh_w1, sh_w3) are separate from the bf16 ones, and two FP8 linears are fused only
 *   when the first one's rows are a multiple of 128 (its scale blocks then line up with the second's) and their
 *   scale encodings agree (opt_proj: up to 3 parts, each writing its columns at its offset).
 * - fp8 mode: wo_a's groups are row slices of one FP8 tensor; a group's scale rows are its slice of the scale
 *   tensor, valid only when the group starts on a 128-row block or sits inside one (checked at layout).
 * - --gpus N: a rank's views are its blocks of the file tensors (docs/multigpu.md §2); in fp8 mode a block of an
 *   FP8 tensor carries its own scale rows/columns, so at N > 1 it must start and end on 128 scale blocks
 *   (opt_check_config refuses the split otherwise, before anything is allocated). Routed experts are whole.
 * - Host positions are the truth: the device pos[] is uploaded from them at every step (also inside a graph,
 *   through a pinned staging buffer the graph's copy node reads when it runs).
 */
#ifndef DSV4_OPT_INTERNAL_H
#define DSV4_OPT_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "dsv4/dsv4_opt.h"
#include "kernels/moe_sorted.cuh"
#include "kernels/qweight.cuh"

#define DSV4_OPT_CUDA(call)                                                                                      \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess)                                                                                   \
            return dsv4_error(DSV4_ERR_CUDA, "%s: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#define DSV4_OPT_CUBLAS(call)                                                                                    \
    do {                                                                                                         \
        cublasStatus_t s_ = (call);                                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                         \
            return dsv4_error(DSV4_ERR_CUDA, "%s: cuBLAS status %d (%s:%d)", #call, (int)s_, __FILE__, __LINE__);  \
    } while (0)

/* One linear y = x · Wᵀ: bf16 W [n_out, n_in], or (fp8 mode) e4m3 W [n_out, n_in] with its block scales
 * [ceil(n_out/128), ceil(n_in/128)] (e8m0 bytes or f32, scale_kind). Views into the weights arena. */
typedef struct opt_linear {
    int n_out, n_in;
    uint16_t *bf16;                  /* or NULL (fp8) */
    uint8_t *fp8;                    /* or NULL (bf16) */
    void *scale;                     /* fp8 only */
    dsv4_qscale scale_kind;
} opt_linear;
/* Linears writing columns [off[i], off[i] + lin[i].n_out) of one f32 output row (a fused projection). */
typedef struct opt_proj {
    opt_linear lin[3];
    int off[3];
    int n;
} opt_proj;

typedef struct opt_layer {
    dsv4_attn_type attn;
    dsv4_mlp_type mlp;
    int ratio;                       /* 0 sliding, else compress ratio */
    /* f32 */
    float *hc_attn_fn, *hc_attn_base, *hc_attn_scale; /* [24, n·D], [24], [3] */
    float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    float *attn_norm, *ffn_norm;     /* [D] */
    float *q_norm;                   /* [q_r] */
    float *kv_norm;                  /* [d] */
    float *sinks;                    /* [H] */
    float *cmp_ape, *cmp_norm;       /* [r, width], [d] */
    float *idx_ape, *idx_norm;       /* [r, 2·d_I], [d_I] */
    float *gate_bias;                /* [E] (learned) or NULL */
    int32_t *tid2eid;                /* [V, k] (hash) or NULL */
    /* linears (bf16, or fp8 where the checkpoint keeps FP8) */
    opt_proj x;                      /* [n_x, D] x-projection */
    int n_x, off_qa, off_kv, off_ckv, off_cg, off_ikv, off_ig, off_iw;
    opt_linear wq_b;                 /* [H·d, q_r]: the rank's heads */
    opt_linear idx_wq_b;             /* [H_I·d_I, q_r]: the rank's indexer heads */
    opt_linear wo_a;                 /* [G·o_r, H·d/G]: the rank's G groups of o_r rows */
    opt_linear wo_b;                 /* [D, G·o_r]: the rank's groups' columns */
    opt_proj f;                      /* [E + 2·NI_sh, D] ffn projection: gate | sh_w1 | sh_w3 (the rank's rows) */
    opt_linear sh_w2;                /* [D, NI_sh]: the rank's columns of the shared w2 */
    /* routed experts, the rank's ids e0..e0+E_loc at index e - e0: bf16, or (fp8 mode) packed e2m1 with e8m0
     * scales per 32 input columns */
    uint16_t *w13;                   /* [E_loc][2I, D] bf16 or NULL */
    uint16_t *w2;                    /* [E_loc][D, I] bf16 or NULL */
    uint8_t *q13, *s13;              /* [E_loc][2I, D/2], [E_loc][2I, D/32] or NULL */
    uint8_t *q2, *s2;                /* [E_loc][D, I/2], [E_loc][D, I/32] or NULL */
    size_t w_bytes;                  /* this layer's bytes of the weights arena */
    /* state (per sequence, C of each) */
    uint16_t *kvc;                   /* [C][W + pool_cap, d] bf16, or NULL with --kv fp8: */
    uint8_t *kv8;                    /* [C][W + pool_cap] entries of kernels/kv_layout.h (--kv fp8) or NULL */
    size_t kv_entry_bytes;           /* one entry of kvc (d bf16) or of kv8 */
    int64_t kv_seq_stride;           /* one sequence's window ring + pool in the kernels' units: bf16 elements of
                                      * kvc, bytes of kv8 */
    int pool_cap;                    /* max_context / r entries (>= 1), 0 sliding */
    float *cmp_kv, *cmp_score;       /* [C][rows, width] */
    uint16_t *ipool;                 /* [C][pool_cap, d_I] (csa) */
    float *icmp_kv, *icmp_score;     /* [C][2r, 2·d_I] */
} opt_layer;

typedef struct opt_graph {
    int key_csa, key_hca;            /* the step's work sizes the graph was captured with */
    cudaGraphExec_t exec;
} opt_graph;
enum { OPT_MAX_GRAPHS = 64 };
/* The stages of a step that dsv4_opt_stage_timing measures, in step order (names in opt_bench.c). */
enum {
    OPT_STAGE_SETUP,        /* inputs up, step setup, embedding */
    OPT_STAGE_MHC_PRE,      /* both mHC pre sites of a layer */
    OPT_STAGE_GEMM_X,       /* the fused attention-input GEMM */
    OPT_STAGE_Q,            /* q norm, wq_b, q norm + RoPE */
    OPT_STAGE_WINDOW_CMP,   /* window KV norm + RoPE, the main compressor */
    OPT_STAGE_IDX_PREP,     /* indexer key compressor, indexer wq_b, queries, head weights */
    OPT_STAGE_IDX_SCORES,   /* indexer scores + top-k, every slab */
    OPT_STAGE_ATTN,         /* gather list, sparse attention, ring write */
    OPT_STAGE_WO,           /* grouped wo_a, wo_b */
    OPT_STAGE_MHC_POST,     /* both mHC post sites */
    OPT_STAGE_ROUTER_SHARED, /* gate | shared w1 | w3 GEMM, router, shared SwiGLU and w2 */
    OPT_STAGE_EXPERTS,      /* the routed experts and the combine */
    OPT_STAGE_HEAD,         /* final mHC head, head GEMM, argmax */
    OPT_STAGES,
    OPT_STAGE_END = OPT_STAGES
};

struct dsv4_opt {
    dsv4_opt_options opt;
    dsv4_config cfg;
    int C, D, n, V, H, d, qr, HI, dI, E, K, NI, W, G, o_r, np, topk;
    /* The rank's shard (docs/multigpu.md §2, the ranges of dsv4_ref_shard_partition); the plain path is rank 0
     * of 1, every range whole. H, HI, G above are the RANK's heads, indexer heads, groups; E is every expert
     * (every rank routes) and NI the routed experts' width (not split). */
    int rank, n_ranks;
    int h0, g0, hi0, e0, i0;         /* the first query head, group, indexer head, routed expert, shared column */
    int H_all, HI_all, G_all;        /* the model's counts (sinks are sliced from H_all; the indexer scale) */
    int E_loc, NI_sh;                /* routed experts held (ids e0..e0+E_loc), shared-expert columns held */
    struct opt_rank *rk;             /* this rank's NCCL context (opt_ranks.c); NULL: the plain path */
    struct opt_ranks *group;         /* set on the public handle of --gpus N only: it owns every rank */
    int fp8;                         /* weights mode fp8 (opt.weights resolved) */
    char producer[320];
    opt_layer *layers;               /* [L] host array of views */
    /* arenas */
    void *w_mem, *s_mem, *x_mem;
    size_t w_bytes, s_bytes, x_bytes;
    /* global weights */
    uint16_t *embed, *head;          /* [V, D] bf16 (head may alias embed when tied) */
    float *norm;                     /* [D] */
    float *hc_head_fn, *hc_head_base, *hc_head_scale;
    float *inv_main, *inv_cmp;       /* [np] */
    /* The step's rows (dsv4_opt.h): a decode step has T = C rows, row c = sequence c; a step with runs (some
     * sequence takes more than one token) has T = sum n_c rows, each sequence's run consecutive. */
    int Tm;                          /* rows a step may hold: max(C, max_step_tokens); the scratch is sized by it */
    int idx_rows;                    /* rows of one indexer slab: the scores are [idx_rows, pool_cap_csa] (>= C) */
    int logit_rows;                  /* rows of the logits buffer (>= C): the head runs in blocks of these */
    int T, runs;                     /* the current step: rows; 1 if it has runs (fresh KV rows, eager) */
    int *row0, *nrun;                /* host [C]: each sequence's first row and run length in the current step */
    int32_t *step_n, *step_tok;      /* host [C]: dsv4_opt_step's runs and tokens, handed to the ragged step */
    /* step inputs: device and pinned host staging, [6, T] (stride T of the current step): tokens, pos, active,
     * seq, run_off, run_len; then [logit_rows] the head rows of a step with runs */
    int32_t *d_in;
    int32_t *r_tok, *r_pos, *r_act, *r_seq, *r_off, *r_len; /* device views into d_in for the current step */
    int32_t *d_head;                 /* [logit_rows] device: rows whose logits a step with runs computes */
    int32_t *h_in;                   /* pinned [6·Tm + logit_rows] */
    int32_t *h_next;                 /* pinned [logit_rows] */
    int *pos;                        /* [C] host positions (truth) */
    void *kv_fresh;                  /* [Tm] window KV rows of a step with runs (bf16 rows or fp8 entries) */
    size_t kv_fresh_bytes;           /* bytes of one fresh row */
    uint16_t *xh;                    /* [logit_rows, D] the head's input rows of a step with runs */
    /* the routed experts of a step with runs as grouped GEMMs (kernels/moe_sorted.cuh; a budget of at least
     * OPT_SORTED_MIN_ROWS rows, options.prefill_experts grouped): [Tm·K] pairs sorted by expert; NULL otherwise */
    int32_t *ms_count, *ms_offset, *ms_perm, *ms_slot; /* [E + 1], [E + 1], [Tm·K], [Tm·K] */
    uint16_t *ms_xs, *ms_h;          /* [Tm·K, D], [Tm·K, NI] bf16 */
    float *ms_gu, *ms_y;             /* [Tm·K, 2·NI], [Tm·K, D] f32 */
    size_t ms_bytes;                 /* scratch bytes of the views above (the memory plan) */
    /* fp8 mode, a budget of at least OPT_SORTED_MIN_ROWS rows: weight matrices dequantised to bf16 for cuBLAS: an
     * FP8 linear over a long run (from wdq), or the grouped FP4 experts' lane slots of [2·NI, D] (lane i's at
     * wdq + i·wdq_slot, filled and read on lane i's stream); NULL otherwise */
    uint16_t *wdq;
    size_t wdq_elems, wdq_slot;
    /* the grouped experts' GEMMs on options.expert_lanes lanes (kernels/moe_sorted.cuh): lane 0 is stream and
     * cublas, lanes 1..n-1 their own streams and handles, each handle's workspace one of the lane_ws slots of
     * cublas_ws_bytes (the size of lane 0's: the same kernels on every lane); n = 1 without grouped experts */
    dsv4_moe_lanes lanes;
    void *lane_ws;                   /* [lanes.n - 1][cublas_ws_bytes] or NULL */
    int32_t *h_ms_offset;            /* pinned [E + 1] */
    /* scratch views (Tm rows each unless said) */
    uint16_t *X, *X2;                /* [C, n, D] */
    float *Xf;                       /* [C, n, D] roundtrip copy */
    float *pre, *post, *comb;        /* [C, n], [C, n], [C, n, n] */
    float *xa;                       /* [C, D] */
    uint16_t *xn;                    /* [C, D] */
    float *proj;                     /* [C, n_x_max] */
    int n_x_max;
    uint16_t *qr_b;                  /* [C, q_r] */
    float *qfull;                    /* [C, max(H·d, H_I·d_I)] */
    uint16_t *q, *qI;                /* [C, H·d], [C, H_I·d_I] */
    float *wI;                       /* [C, H_I] */
    float *kvf;                      /* [C, d] probe copy of the window KV */
    float *iscore;                   /* [idx_rows, pool_cap_csa] (one slab) */
    int pool_cap_csa, pool_cap_hca;
    int32_t *topk_ids;               /* [C, topk] */
    int32_t *idx;                    /* [C, W + max extra] */
    uint16_t *o;                     /* [C, H·d] */
    uint16_t *z;                     /* [C, G·o_r] */
    float *aout, *fout;              /* [C, D] */
    float *fproj;                    /* [C, E + 2·NI_sh] */
    int32_t *rids;                   /* [C, k] */
    float *rw;                       /* [C, k] */
    uint16_t *h_sh, *h_r;            /* [C, NI_sh], [C, k, I] */
    float *y_sh;                     /* [C, D] */
    float *logits;                   /* [logit_rows, V] */
    int32_t *next;                   /* [logit_rows] */
    int32_t *ring_slot, *live_csa, *live_hca; /* [C] */
    float *cos_m, *sin_m, *cos_c, *sin_c;     /* [C, np] */
    void *ws;                        /* shared workspace of the kernels (mHC, attention, indexer, top-k) */
    size_t ws_bytes;
    void *cublas_ws;
    size_t cublas_ws_bytes;
    /* runtime */
    cudaStream_t stream;
    cublasHandle_t cublas;
    opt_graph graphs[OPT_MAX_GRAPHS];
    int n_graphs;
    /* decision following (options.follow): the dump_seq's rows of this step, per layer L at L·follow_stride:
     * [topk flag, router flag, topk ids (topk), router ids (K)] (flags 0: keep the own selection) */
    const dsv4_opt_follow *follow;   /* NULL: off */
    int follow_stride;               /* 2 + topk + K */
    int32_t *h_follow;               /* pinned [Tm][L, follow_stride], filled by the host before each step (one
                                        [L, follow_stride] block per row of dump_seq's run) */
    int32_t *d_follow;               /* [Tm][L, follow_stride] scratch, copied from h_follow by the step */
    int32_t *d_follow_changed;       /* [2] device counters: top-k rows, router rows whose selection changed */
    long follow_rows[2];             /* rows staged so far: top-k, router */
    int follow_stop;                 /* position of dump_seq where following stopped (token differs), -1 */
    int broken;                      /* a step failed part way: later steps are refused (only free is left) */
    /* stage timing (dsv4_opt_stage_timing, opt_bench.c): in a step with runs an event at every stage boundary
     * (opt_prof_mark), so the stages tile the step; their times and work summed over the timed steps */
    int prof_on;
    cudaEvent_t *prof_ev;            /* [prof_cap] while on */
    int *prof_stage;                 /* [prof_cap] the stage that event i opens (OPT_STAGE_END: the last) */
    int prof_cap, prof_n;            /* events available, recorded in the current step */
    double prof_ms[OPT_STAGES], prof_flops[OPT_STAGES], prof_bytes[OPT_STAGES];
    int prof_steps;
    /* probing state of the current step */
    dsv4_probe_sink *probe;
    float *h_probe;                  /* pinned host staging for probe rows */
    size_t h_probe_floats;
};

/* ---- The one layout and init sequence of both constructors (opt_layout.c) ---------------------------------- */
/* A bump carver over one arena (256-byte aligned views); base NULL counts only. */
typedef struct opt_carver {
    char *base;
    size_t off;
} opt_carver;
void *opt_carve(opt_carver *cv, size_t bytes);

/* What a weight view is, for a source that generates it (the loader ignores it): a linear map of fan-in `fan_in`,
 * the embedding, mHC base / scale, an RMSNorm weight, attention sinks, a compressor position bias, the router
 * bias. */
typedef enum opt_wkind {
    OPT_W_LINEAR,
    OPT_W_EMBED,
    OPT_W_MHC_BASE,
    OPT_W_MHC_SCALE,
    OPT_W_NORM,
    OPT_W_SINK,
    OPT_W_APE,
    OPT_W_BIAS
} opt_wkind;

/* Where the weights come from: the loader (opt_model.c) or the generator (opt_random.cu). opt_init_common calls
 * it only on the filling pass, in carve order, with device views of the weights arena:
 *   f32       one f32 view = one file tensor `name`;
 *   bf16_view one bf16 view as a whole (the generator fills it here, one stream per view; the loader does nothing);
 *   bf16_part one file tensor `name` at dst inside the last bf16 view (the loader reads it; the generator does
 *             nothing); a fused view has several parts;
 *   tid2eid   the hash router's table [V, k] int32, every id in [0, E).
 * Each returns 0 or a negative error with a message. The source is borrowed for the call of opt_init_common. */
typedef struct opt_weight_src opt_weight_src;
struct opt_weight_src {
    const char *what; /* label of the memory checks: "optimized", "optimized (random)" */
    int (*f32)(opt_weight_src *s, const dsv4_opt *o, float *dst, size_t numel, opt_wkind kind, size_t fan_in,
               const char *name);
    int (*bf16_view)(opt_weight_src *s, const dsv4_opt *o, uint16_t *dst, size_t numel, opt_wkind kind,
                     size_t fan_in);
    int (*bf16_part)(opt_weight_src *s, const dsv4_opt *o, uint16_t *dst, size_t numel, const char *name);
    int (*tid2eid)(opt_weight_src *s, const dsv4_opt *o, int32_t *dst, const char *name);
    /* A rank's block [r0, r0 + nr) x [c0, c0 + nc) of file tensor `name` [rows, cols] (esz 2: bf16, 4: f32) at
     * dst, row stride nc. Called only for a split tensor at N > 1. NULL for the generator: it draws the view. */
    int (*slice)(opt_weight_src *s, const dsv4_opt *o, void *dst, int esz, const char *name, size_t rows,
                 size_t cols, size_t r0, size_t nr, size_t c0, size_t nc);
    /* fp8 mode: */
    /* the scale encoding file tensor `name` (an FP8 linear) gets on the device; asked on BOTH passes, since the
     * arena's size depends on it (the generator: e8m0) */
    dsv4_qscale (*qscale)(opt_weight_src *s, const dsv4_opt *o, const char *name);
    /* The block [r0, r0 + nr) x [c0, c0 + nc) of FP8 linear `name` [rows, cols] (the whole tensor at N = 1; a
     * rank's slice at N > 1, r0 and c0 then multiples of 128, nr and nc too or reaching the tensor's end):
     * e4m3 codes at q [nr, nc], the block's scales at scale [ceil(nr/128), ceil(nc/128)] in the encoding qscale
     * answered. The generator draws [nr, nc]. */
    int (*fp8)(opt_weight_src *s, const dsv4_opt *o, uint8_t *q, void *scale, dsv4_qscale kind, int rows,
               int cols, int r0, int nr, int c0, int nc, size_t fan_in, const char *name);
    /* FP4 expert matrix `name` [rows, cols] (experts are split by id, so always whole): packed codes at q
     * [rows, cols/2], e8m0 scales at scale [rows, cols/32] */
    int (*fp4)(opt_weight_src *s, const dsv4_opt *o, uint8_t *q, uint8_t *scale, int rows, int cols,
               size_t fan_in, const char *name);
};

/* ---- Ranks (opt_ranks.c; docs/multigpu.md) ----------------------------------------------------------------- */
/* Build one rank's object on op->device: rank `rank` of n_ranks (n_ranks 0: the plain path, no NCCL). ctx: the
 * constructor's argument (the model, or the config and seed). */
typedef int (*opt_build_fn)(void *ctx, const dsv4_opt_options *op, int rank, int n_ranks, dsv4_opt **out);
/* --gpus N: plan (before any device work), one NCCL communicator per GPU, every rank built by `build` on its own
 * thread; *out is the public handle (rank 0's object, owning the others). */
int opt_ranks_init(const dsv4_config *cfg, const dsv4_opt_options *op, opt_build_fn build, void *ctx,
                   dsv4_opt **out);
int opt_ranks_step(struct opt_ranks *g, const int32_t *tokens, const int32_t *n_tok, dsv4_probe_sink *probe,
                   float *logits, int32_t *next);
/* Refuses (DSV4_ERR_CUDA) once a collective failed or timed out: the communicators are aborted. */
int opt_ranks_usable(const struct opt_ranks *g);
void opt_ranks_free(struct opt_ranks *g);
/* fn on every rank's object in rank order on the calling thread, each on its GPU (calls without collectives:
 * reset, random state); the first error, prefixed with its rank. */
int opt_ranks_each(struct opt_ranks *g, int (*fn)(dsv4_opt *o, void *arg), void *arg);
/* The rank's step body (opt_step.c), the argument checks every rank would make alike (run once, first). */
int opt_step_rank(dsv4_opt *o, const int32_t *tokens, const int32_t *n_tok, dsv4_probe_sink *probe,
                  float *logits, int32_t *next);
int opt_step_check(const dsv4_opt *o, const int32_t *tokens, const int32_t *n_tok);
/* Free one rank's object (not the group). */
void opt_free_one(dsv4_opt *o);
/* Sum buf [n] f32 over the ranks in place on o->stream (ncclAllReduce, ncclFloat32, ncclSum); nothing on the
 * plain path. `what`/L name it in errors. */
int opt_allreduce(dsv4_opt *o, float *buf, size_t n, int L, const char *what);
/* Wait for o->stream: cudaStreamSynchronize on the plain path; with ranks a poll of the stream and the
 * communicator under the NCCL deadline (a hung peer becomes an error, never a hang). */
int opt_wait(dsv4_opt *o, const char *what);
/* 1: this step must run eagerly (NCCL timing events are recorded around the collectives). */
int opt_ranks_eager(const dsv4_opt *o);

/* The checks of the options and the config both constructors make before anything is allocated. */
int opt_check_config(const dsv4_config *f, const dsv4_opt_options *op);
/* Entries a compressed pool of one sequence holds: max_context / ratio, at least 1; 0 for a layer that does not
 * compress (ratio 0). The caches (opt_layout.c) and the emulated all-reduce's buffer (opt_ranks.c) are sized by it. */
int opt_pool_capacity(int max_context, int ratio);
/* Build o (o->opt and o->cfg set, the rest zero) from src: sizes, layers, stream, the three arenas (weights filled
 * from src, caches and scratch zeroed), pinned staging, cuBLAS, empty compressor states. On failure o holds what
 * was made so far: the caller releases it with dsv4_opt_free. */
int opt_init_common(dsv4_opt *o, opt_weight_src *src);
/* Clear the compressor states of sequence seq (seq < 0: all) to kv 0 / score -inf; synchronises the stream. */
int opt_state_reset(dsv4_opt *o, int seq);

/* The launches the step and the micro-benchmark share (opt_step.c), from o's buffers: mHC pre of a layer site;
 * the indexer scores and the top-k of layer ly over n_work entries (max_ctx: --index-context max); the gather list
 * and the sparse attention of ly with n_extra entries past the window. */
int opt_launch_mhc_pre(dsv4_opt *o, const float *fn, const float *base, const float *scale, const float *norm_w);
int opt_launch_indexer(dsv4_opt *o, const opt_layer *ly, int n_work, int max_ctx);
int opt_launch_topk(dsv4_opt *o, int n_work, int max_ctx);
int opt_launch_step_index(dsv4_opt *o, const opt_layer *ly, int n_extra);
int opt_launch_sparse_attn(dsv4_opt *o, const opt_layer *ly, int n_extra);

/* A step with runs of at least this many rows runs its routed experts as grouped GEMMs (bf16 weights, or FP4
 * weights dequantised per expert into wdq), unless options.prefill_experts asks for the decode kernels; and its
 * FP8 linears as cuBLAS GEMMs over the dequantised matrix (wdq), unless options.prefill_linears says kernel. */
enum { OPT_SORTED_MIN_ROWS = 128 };

/* Stage timing: record the event that opens `stage` (OPT_STAGE_END closes the step); a no-op unless timing is on
 * and the step has runs (those run eagerly: events and graphs are not mixed). opt_prof_account adds the finished
 * step's stage times and work (after the step's synchronisation). */
int opt_prof_mark(dsv4_opt *o, int stage);
int opt_prof_account(dsv4_opt *o);

/* Counted cudaMalloc (style rule 10). */
int opt_dev_alloc(void **p, size_t bytes, const char *what);

/* y [S, n_out] (f32 or bf16 by y_f32) = x [S, n_in] bf16 (row stride ldx) · W [n_out, n_in]ᵀ bf16; ldy = row
 * stride of y. fp32 accumulation (CUBLAS_COMPUTE_32F). */
int opt_gemm(dsv4_opt *o, void *y, int y_f32, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int n_out,
             int n_in, int S);

/* y [S, n_out] (f32 or bf16, row stride ldy) = x [S, n_in] bf16 (row stride ldx) · Wᵀ for a bf16 or fp8 linear:
 * cuBLAS or dsv4_opt_fp8_linear (the kernel workspace o->ws). The one dispatch the step uses. */
int opt_linear_apply(dsv4_opt *o, const opt_linear *w, void *y, int y_f32, int ldy, const uint16_t *x, int ldx,
                     int S);
/* Every part of p into y [S, ldy] f32 at its column offset. */
int opt_proj_apply(dsv4_opt *o, const opt_proj *p, float *y, int ldy, const uint16_t *x, int ldx, int S);
/* The grouped projection: for g < G, y[:, g·(n_out/G) ...] bf16 = x[:, g·n_in ...] · W_gᵀ, W_g the g-th slice
 * of n_out/G rows of w (w is [n_out, n_in] with n_out = G·rows per group). */
int opt_linear_apply_grouped(dsv4_opt *o, const opt_linear *w, int G, uint16_t *y, int ldy, const uint16_t *x,
                             int ldx, int S);
/* The routed experts of layer ly on the step's buffers (xn, rids, rw, h_r, y_sh -> fout): bf16 or FP4. */
int opt_experts(dsv4_opt *o, const opt_layer *ly);
/* Device bytes of a linear's weights (codes, scales). */
double opt_linear_bytes(const opt_linear *w);

/* Work sizes of a step for the runs n_tok (NULL: every sequence one token): CSA indexer/top-k entries and HCA
 * extra gather entries, the buckets of the largest live count any row reaches. */
void opt_step_sizes(const dsv4_opt *o, const int32_t *n_tok, int *n_csa, int *n_hca);
/* The bucket those sizes are rounded to: the smallest power of two >= n from 16, capped at cap (0 for n <= 0). */
int opt_bucket(int n, int cap);

#endif /* DSV4_OPT_INTERNAL_H */
