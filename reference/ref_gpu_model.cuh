/* ref_gpu_model.cuh - the GPU reference's private types (ref_gpu.cu runs the forward, ref_gpu_init.cu uploads the
 * resident weights and lays out the state and scratch arenas, ref_gpu_stream.cu streams the weights, ref_gpu_emu.cu
 * follows a dump's choices): per-layer device weights and decode state, the streamed weights' slots, the whole
 * object. The scratch of one call is ref_gpu_layout.h's (the plan sizes it). */
#ifndef DSV4_REF_GPU_MODEL_CUH
#define DSV4_REF_GPU_MODEL_CUH

extern "C" {
#include "ref_model.h"
}
#include "ref_gpu.cuh"
#include "ref_gpu_layout.h"

typedef struct gpu_hc {
    float *fn, *base, *scale; /* [(2+n)·n, n·D], [(2+n)·n], [3] */
} gpu_hc;

/* Device weights and state of one layer. Weights in the weight arena (resident) or, while the layer is the loaded
 * one, in the streamed weights' arena (else NULL; w1/w3/w2 resident only); state in the state arena. */
typedef struct gpu_layer {
    dsv4_attn_type attn;
    dsv4_mlp_type mlp;
    int ratio;
    gpu_hc hc_attn, hc_ffn;
    float *attn_norm, *ffn_norm;       /* [D] */
    float *wq_a, *q_norm, *wq_b;       /* [q_r, D], [q_r], [H·d, q_r] */
    float *wkv, *kv_norm;              /* [d, D], [d] */
    float *wo_a, *wo_b, *sinks;        /* [G·o_r, H·d/G], [D, G·o_r], [H] */
    float *cmp_wkv, *cmp_wgate, *cmp_ape, *cmp_norm; /* [width, D] ×2, [ratio, width], [d] */
    float *idx_wq_b, *idx_wproj;       /* [H_I·d_I, q_r], [H_I, D] */
    float *idx_wkv, *idx_wgate, *idx_ape, *idx_norm; /* [2·d_I, D] ×2, [ratio, 2·d_I], [d_I] */
    float *gate_w, *gate_bias;         /* [E, D], [E] (learned layers; NULL on hash layers) */
    int32_t *tid2eid;                  /* [V, k] (hash layers) in the int arena, else NULL */
    float **w1, **w3, **w2;            /* [E] host arrays of device pointers: [I, D], [I, D], [D, I] */
    float *sh_w1, *sh_w3, *sh_w2;
    /* decode state */
    float *win;                        /* [window, d] ring */
    float *pool;                       /* [pool_cap, d] compressed entries (ratio > 0) */
    float *ipool;                      /* [pool_cap, d_I] indexer keys (csa) */
    int n_entries, n_ientries, pool_cap;
    dsv4_ref_gpu_compressor cmp, icmp;
    /* replay only (else NULL), in g->own_mem: what the dump shows, [pool_cap, d] and [pool_cap, d_I] (the CPU's
     * own_pool / own_ipool: the candidate's entries, each judged one replaced by the entry made here) */
    float *own_pool, *own_ipool;
} gpu_layer;

typedef dsv4_ref_gpu_scratch gpu_scratch;

/* One slot of the streamed weights (ref_gpu_stream.cu): a part's bytes as on disk, in pinned host memory and on the
 * device. Reused only once the host has waited for its previous copy and dequantisation. */
typedef struct gpu_slot {
    uint8_t *host;              /* [cap] pinned, owned */
    uint8_t *dev;               /* [cap] device, in the stream's dev_mem */
    size_t cap;
    cudaEvent_t c0, copied;     /* copy stream: around the part's host-to-device copy */
    cudaEvent_t d0, consumed;   /* compute stream: around its dequantisation */
    int staged;                 /* 1: holds `part`, copied or being copied, not dequantised yet */
    int copy_rec, deq_rec;      /* 1: that event pair was recorded and not yet waited for and timed */
    dsv4_ref_part part;
} gpu_slot;

/* The streamed weights (docs/reference.md "ref-gpu streams layers"). The dense parts of a call run in a fixed cycle:
 * the layers 0 .. L-1, then the head's row ranges; the next one is staged while the current one is in use. */
typedef struct gpu_stream {
    cudaStream_t copy;          /* host-to-device copies; non-blocking: ordered against the compute stream by events */
    gpu_slot dense[2], expert[2];
    uint8_t *dev_mem;           /* device, owned: the four slots' device sides */
    float *arena;               /* [sz.arena_floats] device, owned: the loaded layer's dense tensors, or the head */
    float *expert_f32;          /* [sz.expert_floats] device, owned: one routed expert */
    size_t exp_off[3];          /* floats: w1, w3, w2 in expert_f32 */
    dsv4_ref_stream_size sz;
    int n_dense;                /* dense parts of a call: the layers, then the head's ranges */
    int loaded;                 /* the dense part in the arena, -1: none */
    float *h_erows;             /* [chunk, D] host, owned: the call's embedding rows */
    int embed_round;            /* the emulation rounds the embedding rows */
    int sync;                   /* $DSV4_REF_GPU_SYNC=1: each stage runs alone (measurement) */
} gpu_stream;

typedef struct dsv4_ref_gpu {
    dsv4_model *model;                /* borrowed: the streamed weights read it while the reference lives */
    dsv4_config cfg;
    int n_pairs, topk, chunk, iq, m_max, pool_cap_max;
    cublasHandle_t blas;
    float *inv_main, *inv_cmp;        /* [n_pairs] device */
    float *embed, *head, *norm, *hc_head_fn, *hc_head_base, *hc_head_scale;
    gpu_layer *lw;                    /* [L] host, owned */
    float *w_arena;                   /* device, owned: every weight */
    int32_t *i_arena;                 /* device, owned: tid2eid of the hash layers */
    float *state_mem;                 /* device, owned */
    float *scratch_mem;               /* device, owned */
    gpu_scratch sc;
    float *host;                      /* [host_floats] staging of probe rows, owned */
    size_t host_floats;
    int32_t *h_rids, *h_row_tok, *h_slot_of, *h_count; /* host MoE grouping: [chunk·k] ×3, [2·E] */
    int32_t *h_pair_of, *h_ex;        /* [chunk·k] each grouped row's pair; [E] the experts routed to, ascending */
    int streamed;                     /* 1: the weights stream (g->stream); 0: resident in w_arena */
    gpu_stream stream;
    dsv4_progress_fn layer_progress;  /* NULL: none; called after each layer of a forward call */
    void *progress_ctx;
    dsv4_ref_gpu_stats stats;
    size_t free0;                     /* cudaMemGetInfo's free bytes before init */
    /* options (dsv4_ref_options) */
    int emu;                          /* 1: emulate bf16 at the CPU emulation's sites (ref_forward.c "emu:") */
    const dsv4_opt_follow *follow;    /* borrowed, NULL: off */
    const dsv4_ref_replay *replay;    /* borrowed, NULL: off (layer-local replay: the CPU's injection sites) */
    float *own_mem;                   /* device, owned (replay): every layer's own_pool / own_ipool */
    int follow_stop;                  /* first position whose token is not the dump's, -1: none yet */
    dsv4_ref_follow_stats fstats;
    int32_t *h_ftopk;                 /* following, host, owned (one allocation): [chunk, topk] the picks of a call */
    int32_t *h_fmerge;                /* [4·max(topk, k)] dsv4_ref_follow_merge's scratch */
    int32_t *h_rflag;                 /* [chunk] router rows merged */
} dsv4_ref_gpu;

/* Fill g for model m and up to max_tokens positions with options o (checked by the caller): config checks, cuBLAS,
 * RoPE tables, the weight arena (counted, allocated, uploaded; with o->emulate BF16 the bf16-held weights rounded on
 * the way), the decode state and the scratch of one call, the host staging (and following's host rows). On failure
 * g holds what was allocated so far (the caller frees it). */
int ref_gpu_init_model(dsv4_model *m, int max_tokens, const dsv4_ref_options *o, dsv4_ref_gpu *g);

/* Device allocation of one of the reference's buffers (ref_gpu_init.cu): refused with both sizes before cudaMalloc
 * when the GPU cannot hold it, a failed cudaMalloc reported with the size and what it was for (never a NULL that
 * crashes later); counted in g->stats.gpu_alloc. */
int ref_gpu_alloc(dsv4_ref_gpu *g, void **p, size_t bytes, const char *what);

/* ref_gpu_stream.cu: where the weights of a step come from. Resident: the arena's views; streamed: parts staged
 * through the slots and dequantised on the GPU (a layer's views valid while it is the loaded one). */
/* Slots, buffers, copy stream and events of the streamed mode (g->model, cfg, emu, sc set; g->streamed). */
int ref_gpu_stream_init(dsv4_ref_gpu *g, int max_tokens);
void ref_gpu_stream_free(dsv4_ref_gpu *g);
/* Make g->lw[L]'s weight views valid (streamed: its dense part into the arena, the next part staged). */
int ref_gpu_weights_layer(dsv4_ref_gpu *g, int L);
/* Before the shared expert of layer L: stage the first of the n_ex experts ex [n_ex] the call routes to. */
int ref_gpu_weights_experts_begin(dsv4_ref_gpu *g, int L, const int32_t *ex, int n_ex);
/* Expert ex[j] of layer L: w1, w3 [I, D], w2 [D, I] (streamed: into the expert buffer, ex[j+1] staged). */
int ref_gpu_weights_expert(dsv4_ref_gpu *g, int L, const int32_t *ex, int n_ex, int j, const float **w1,
                           const float **w3, const float **w2);
/* The head [V, D] (streamed: every row range into the arena, then the next call's first layer staged). */
int ref_gpu_weights_head(dsv4_ref_gpu *g, const float **head);
/* The call's embedding rows into every stream of sc.X [S, n, D] (sc.tokens uploaded). Streamed: the rows
 * dequantised on the host (model/dtype.c, as ref-cpu does), uploaded into sc.erows. */
int ref_gpu_weights_embed(dsv4_ref_gpu *g, const int32_t *tokens, int S);
/* After a call (the device synchronised): its wall time, the copy and dequantisation times, the GPU memory held. */
void ref_gpu_stats_call_end(dsv4_ref_gpu *g, double wall_s);

/* ref_gpu_emu.cu: decision following (and replay's choices) of one call of S tokens at p0, the CPU's rule
 * (ref_forward.c). */
/* Stop following for good at the first of the call's positions whose token is not the dump's (before the layers). */
void ref_gpu_follow_start(dsv4_ref_gpu *g, int p0, const int32_t *tokens, int S);
/* After the topk_idx probe of CSA layer L: merge the dump's rows into sc.topk [S, topk] (own k picks per row).
 * Returns the picks per row the attention reads (k, or index_topk once a row changed), or a negative error. */
int ref_gpu_follow_topk(dsv4_ref_gpu *g, int L, int p0, int S, int k);
/* After the router probes of layer L: merge the dump's rows into the host ids h_rids [S, k] (the grouping reads
 * them), upload them and re-weight the merged rows from the own logits. 0 or a negative error. */
int ref_gpu_follow_router(dsv4_ref_gpu *g, int L, int p0, int S);

#endif /* DSV4_REF_GPU_MODEL_CUH */
