/* ref_gpu_model.cuh - the GPU reference's private types (ref_gpu.cu runs the forward, ref_gpu_init.cu uploads the
 * weights and lays out the state and scratch arenas, ref_gpu_emu.cu follows a dump's choices): per-layer device
 * weights and decode state, the scratch of one call, the whole object. */
#ifndef DSV4_REF_GPU_MODEL_CUH
#define DSV4_REF_GPU_MODEL_CUH

extern "C" {
#include "ref_model.h"
}
#include "ref_gpu.cuh"

enum { GPU_CHUNK = 4096, LOGIT_ROWS = 64, ISCORE_FLOATS = 1 << 24 };

typedef struct gpu_hc {
    float *fn, *base, *scale; /* [(2+n)·n, n·D], [(2+n)·n], [3] */
} gpu_hc;

/* Device weights and state of one layer. Weights in the weight arena, state in the state arena. */
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
} gpu_layer;

/* Device scratch of one call of up to S tokens (one arena). */
typedef struct gpu_scratch {
    int S;
    float *X, *X2, *vn;               /* [S, n, D] */
    float *mix, *pre, *post, *comb;   /* [S, (2+n)·n], [S, n], [S, n], [S, n, n] */
    float *xa, *xn;                   /* [S, D] */
    float *qr, *q, *kv;               /* [S, q_r], [S, H·d], [S, d] */
    float *ckv, *cg, *ikv, *ig;       /* [S, 2·d], [S, 2·d], [S, 2·d_I], [S, 2·d_I] */
    float *qI, *wI;                   /* [S, H_I·d_I], [S, H_I] */
    float *o, *z, *aout;              /* [S, H·d], [S, G·o_r], [S, D] */
    float *cos_m, *sin_m, *cos_c, *sin_c; /* [S, n_pairs] */
    float *iscore;                    /* [iq, pool_cap_max] indexer scores of iq queries */
    int32_t *topk;                    /* [S, topk] */
    float *rlogits, *rsbuf, *rw;      /* [S, E], [S, E], [S, k] */
    int32_t *rids;                    /* [S, k] */
    int32_t *row_tok, *slot_of;       /* [S·k] */
    int32_t *rflag;                   /* [S] following: 1 = the router row was merged, re-weight it */
    float *xg, *yg;                   /* [S·k, D] */
    float *eg, *eu;                   /* [S·k, I] */
    float *fout;                      /* [S, D] */
    float *hm, *hpre, *y;             /* [S, n], [S, n], [S, D] */
    float *yrows, *logits;            /* [LOGIT_ROWS, D], [LOGIT_ROWS, V] */
    int32_t *tokens, *lrows;          /* [S], [LOGIT_ROWS] */
} gpu_scratch;

typedef struct dsv4_ref_gpu {
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
    /* options (dsv4_ref_options) */
    int emu;                          /* 1: emulate bf16 at the CPU emulation's sites (ref_forward.c "emu:") */
    const dsv4_opt_follow *follow;    /* borrowed, NULL: off */
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

/* ref_gpu_emu.cu: decision following of one call of S tokens at p0, the CPU's rule (ref_forward.c). */
/* Stop following for good at the first of the call's positions whose token is not the dump's (before the layers). */
void ref_gpu_follow_start(dsv4_ref_gpu *g, int p0, const int32_t *tokens, int S);
/* After the topk_idx probe of CSA layer L: merge the dump's rows into sc.topk [S, topk] (own k picks per row).
 * Returns the picks per row the attention reads (k, or index_topk once a row changed), or a negative error. */
int ref_gpu_follow_topk(dsv4_ref_gpu *g, int L, int p0, int S, int k);
/* After the router probes of layer L: merge the dump's rows into the host ids h_rids [S, k] (the grouping reads
 * them), upload them and re-weight the merged rows from the own logits. 0 or a negative error. */
int ref_gpu_follow_router(dsv4_ref_gpu *g, int L, int p0, int S);

#endif /* DSV4_REF_GPU_MODEL_CUH */
