/* opt_model.c - the optimized path's object (dsv4_opt.h): options and switch names, the weight upload (bf16
 * through the shared loader; fp32 for mHC parameters, norms, sinks, router bias, compressor position bias), the
 * per-sequence caches sized for max_context, the step's scratch, cuBLAS, init/free/reset.
 *
 * Invariants that fail quietly:
 * - Each arena is laid out twice with the same function: once to count (base NULL), once to carve and upload,
 *   so the views can never disagree with the size.
 * - The compressor states start as kv 0 / score -inf (an empty slot has weight 0); reset restores exactly that.
 * - The kernel workspace is the maximum over every shape a step can use (the gather-list sizes are the buckets
 *   of opt_step_sizes), so no step can need more than was allocated.
 * - RoPE tables are built like the reference's (fp32 pow, YaRN ramp between floor/ceil correction dims, no mscale).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/elementwise.cuh"
#include "kernels/indexer.cuh"
#include "kernels/mhc.cuh"
#include "kernels/sparse_attn.cuh"
#include "kernels/topk.cuh"
#include "opt_internal.h"

/* ------------------------------------------------------------------------------------ options and names */
void dsv4_opt_options_default(dsv4_opt_options *o)
{
    memset(o, 0, sizeof *o);
    o->n_seq = 1;
    o->max_context = 4096;
    o->cuda_graph = 1;
}

static const char *const attn_names[] = {"mma", "simt"};
static const char *const indexer_names[] = {"bf16", "fp32"};
static const char *const mhc_names[] = {"castfree", "roundtrip"};
static const char *const ictx_names[] = {"live", "max"};
static const char *const kv_names[] = {"bf16", "fp8"};
_Static_assert(DSV4_OPT_ATTN_SIMT == 1 && DSV4_OPT_INDEXER_FP32 == 1 && DSV4_OPT_MHC_ROUNDTRIP == 1 &&
                   DSV4_OPT_INDEX_MAX == 1 && DSV4_OPT_KV_FP8 == 1, "switch name tables have two entries");

const char *dsv4_opt_attn_name(dsv4_opt_attn v) { return (unsigned)v < 2 ? attn_names[v] : "?"; }
const char *dsv4_opt_indexer_name(dsv4_opt_indexer v) { return (unsigned)v < 2 ? indexer_names[v] : "?"; }
const char *dsv4_opt_mhc_name(dsv4_opt_mhc v) { return (unsigned)v < 2 ? mhc_names[v] : "?"; }
const char *dsv4_opt_index_context_name(dsv4_opt_index_context v) { return (unsigned)v < 2 ? ictx_names[v] : "?"; }
const char *dsv4_opt_kv_name(dsv4_opt_kv v) { return (unsigned)v < 2 ? kv_names[v] : "?"; }

static int pick(const char *const names[2], const char *name, const char *value, int *out)
{
    for (int i = 0; i < 2; i++)
        if (!strcmp(value, names[i])) {
            *out = i;
            return 0;
        }
    return dsv4_error(DSV4_ERR_USAGE, "--%s '%s': want %s or %s", name, value, names[0], names[1]);
}

int dsv4_opt_options_set(dsv4_opt_options *o, const char *name, const char *value)
{
    int v = 0, rc;
    if (!strcmp(name, "attn")) {
        if (!(rc = pick(attn_names, name, value, &v))) o->attn = (dsv4_opt_attn)v;
    } else if (!strcmp(name, "indexer")) {
        if (!(rc = pick(indexer_names, name, value, &v))) o->indexer = (dsv4_opt_indexer)v;
    } else if (!strcmp(name, "mhc")) {
        if (!(rc = pick(mhc_names, name, value, &v))) o->mhc = (dsv4_opt_mhc)v;
    } else if (!strcmp(name, "index-context")) {
        if (!(rc = pick(ictx_names, name, value, &v))) o->index_context = (dsv4_opt_index_context)v;
    } else if (!strcmp(name, "kv")) {
        if (!(rc = pick(kv_names, name, value, &v))) o->kv = (dsv4_opt_kv)v;
    } else {
        rc = dsv4_error(DSV4_ERR_USAGE, "unknown switch '%s' (attn, indexer, mhc, index-context, kv)", name);
    }
    return rc;
}

/* ------------------------------------------------------------------------------------ allocation */
static long opt_allocs;

int opt_dev_alloc(void **p, size_t bytes, const char *what)
{
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 256);
    __atomic_add_fetch(&opt_allocs, 1, __ATOMIC_RELAXED);
    if (e != cudaSuccess) {
        *p = NULL;
        return dsv4_error(DSV4_ERR_NOMEM, "optimized: cannot allocate %zu bytes of device memory for %s: %s", bytes,
                          what, cudaGetErrorString(e));
    }
    return 0;
}

long dsv4_opt_device_alloc_count(void) { return __atomic_load_n(&opt_allocs, __ATOMIC_RELAXED); }

/* A bump carver over one arena; base NULL counts only. */
typedef struct carver {
    char *base;
    size_t off;
} carver;

static void *carve(carver *cv, size_t bytes)
{
    cv->off = (cv->off + 255) & ~(size_t)255;
    void *p = cv->base ? cv->base + cv->off : NULL;
    cv->off += bytes;
    return p;
}

/* ------------------------------------------------------------------------------------ weight upload */
typedef struct uploader {
    dsv4_model *m;
    int go;          /* 0: count only */
    void *host;      /* staging */
    size_t host_bytes;
} uploader;

static int stage(uploader *u, size_t bytes)
{
    if (bytes <= u->host_bytes) return 0;
    void *h = realloc(u->host, bytes);
    if (!h) return dsv4_error(DSV4_ERR_NOMEM, "optimized: cannot allocate %zu bytes of host staging", bytes);
    u->host = h;
    u->host_bytes = bytes;
    return 0;
}

static int up_tensor(uploader *u, void *dst, int bf16, size_t numel, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int up_tensor(uploader *u, void *dst, int bf16, size_t numel, const char *fmt, ...)
{
    if (!u->go) return 0;
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    size_t bytes = numel * (bf16 ? 2 : 4);
    DSV4_OPT_TRY(stage(u, bytes));
    if (bf16) DSV4_OPT_TRY(dsv4_model_read_bf16(u->m, name, u->host, numel));
    else DSV4_OPT_TRY(dsv4_model_read_f32(u->m, name, u->host, numel));
    DSV4_OPT_CUDA(cudaMemcpy(dst, u->host, bytes, cudaMemcpyHostToDevice));
    return 0;
}

#define UPF(dst, numel, ...)                                                                                     \
    do {                                                                                                         \
        (dst) = carve(cv, (size_t)(numel) * 4);                                                                  \
        DSV4_OPT_TRY(up_tensor(u, (dst), 0, (size_t)(numel), __VA_ARGS__));                                     \
    } while (0)
#define UPB_AT(ptr, numel, ...) DSV4_OPT_TRY(up_tensor(u, (ptr), 1, (size_t)(numel), __VA_ARGS__))
#define UPB(dst, numel, ...)                                                                                     \
    do {                                                                                                         \
        (dst) = carve(cv, (size_t)(numel) * 2);                                                                  \
        UPB_AT((dst), numel, __VA_ARGS__);                                                                       \
    } while (0)

static int layer_weights(dsv4_opt *o, uploader *u, carver *cv, int L)
{
    opt_layer *ly = &o->layers[L];
    const size_t D = o->D, nD = (size_t)o->n * o->D, mix = (size_t)(2 + o->n) * o->n, E = o->E, NI = o->NI;
    const size_t d = o->d, dI = o->dI;
    const int csa = ly->attn == DSV4_ATTN_CSA;
    const size_t width = (csa ? 2 : 1) * d;
    UPF(ly->hc_attn_fn, mix * nD, "layers.%d.hc_attn_fn", L);
    UPF(ly->hc_attn_base, mix, "layers.%d.hc_attn_base", L);
    UPF(ly->hc_attn_scale, 3, "layers.%d.hc_attn_scale", L);
    UPF(ly->hc_ffn_fn, mix * nD, "layers.%d.hc_ffn_fn", L);
    UPF(ly->hc_ffn_base, mix, "layers.%d.hc_ffn_base", L);
    UPF(ly->hc_ffn_scale, 3, "layers.%d.hc_ffn_scale", L);
    UPF(ly->attn_norm, D, "layers.%d.attn_norm.weight", L);
    UPF(ly->ffn_norm, D, "layers.%d.ffn_norm.weight", L);
    UPF(ly->q_norm, o->qr, "layers.%d.attn.q_norm.weight", L);
    UPF(ly->kv_norm, d, "layers.%d.attn.kv_norm.weight", L);
    UPF(ly->sinks, o->H, "layers.%d.attn.attn_sink", L);
    /* the fused x-projection */
    int r = 0;
    ly->off_qa = r, r += o->qr;
    ly->off_kv = r, r += (int)d;
    ly->off_ckv = r, r += ly->ratio > 0 ? (int)width : 0;
    ly->off_cg = r, r += ly->ratio > 0 ? (int)width : 0;
    ly->off_ikv = r, r += csa ? 2 * (int)dI : 0;
    ly->off_ig = r, r += csa ? 2 * (int)dI : 0;
    ly->off_iw = r, r += csa ? o->HI : 0;
    ly->n_x = r;
    if (r > o->n_x_max) o->n_x_max = r;
    ly->w_x = carve(cv, (size_t)r * D * 2);
    uint16_t *wx = ly->w_x;
    UPB_AT(wx + ly->off_qa * D, (size_t)o->qr * D, "layers.%d.attn.wq_a.weight", L);
    UPB_AT(wx + ly->off_kv * D, d * D, "layers.%d.attn.wkv.weight", L);
    if (ly->ratio > 0) {
        UPB_AT(wx + ly->off_ckv * D, width * D, "layers.%d.attn.compressor.wkv.weight", L);
        UPB_AT(wx + ly->off_cg * D, width * D, "layers.%d.attn.compressor.wgate.weight", L);
        UPF(ly->cmp_ape, (size_t)ly->ratio * width, "layers.%d.attn.compressor.ape", L);
        UPF(ly->cmp_norm, d, "layers.%d.attn.compressor.norm.weight", L);
    }
    if (csa) {
        UPB_AT(wx + ly->off_ikv * D, 2 * dI * D, "layers.%d.attn.indexer.compressor.wkv.weight", L);
        UPB_AT(wx + ly->off_ig * D, 2 * dI * D, "layers.%d.attn.indexer.compressor.wgate.weight", L);
        UPB_AT(wx + ly->off_iw * D, (size_t)o->HI * D, "layers.%d.attn.indexer.weights_proj.weight", L);
        UPF(ly->idx_ape, (size_t)ly->ratio * 2 * dI, "layers.%d.attn.indexer.compressor.ape", L);
        UPF(ly->idx_norm, dI, "layers.%d.attn.indexer.compressor.norm.weight", L);
        UPB(ly->idx_wq_b, (size_t)o->HI * dI * o->qr, "layers.%d.attn.indexer.wq_b.weight", L);
    }
    UPB(ly->wq_b, (size_t)o->H * d * o->qr, "layers.%d.attn.wq_b.weight", L);
    UPB(ly->wo_a, (size_t)o->G * o->o_r * (o->H * d / o->G), "layers.%d.attn.wo_a.weight", L);
    UPB(ly->wo_b, D * o->G * o->o_r, "layers.%d.attn.wo_b.weight", L);
    /* the fused ffn projection: router gate | shared w1 | shared w3 */
    ly->w_f = carve(cv, (E + 2 * NI) * D * 2);
    UPB_AT(ly->w_f, E * D, "layers.%d.ffn.gate.weight", L);
    UPB_AT(ly->w_f + E * D, NI * D, "layers.%d.ffn.shared_experts.w1.weight", L);
    UPB_AT(ly->w_f + (E + NI) * D, NI * D, "layers.%d.ffn.shared_experts.w3.weight", L);
    UPB(ly->sh_w2, D * NI, "layers.%d.ffn.shared_experts.w2.weight", L);
    if (ly->mlp == DSV4_MLP_HASH_MOE) {
        size_t n = (size_t)o->V * o->K;
        ly->tid2eid = carve(cv, n * 4);
        if (u->go) {
            char name[96];
            snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", L);
            DSV4_OPT_TRY(stage(u, n * 4));
            int32_t *t = u->host;
            DSV4_OPT_TRY(dsv4_model_read_i32(u->m, name, t, n));
            for (size_t i = 0; i < n; i++)
                if (t[i] < 0 || t[i] >= o->E)
                    return dsv4_error(DSV4_ERR_FORMAT, "%s: token %zu maps to expert %d, outside [0, %d)", name,
                                      i / o->K, t[i], o->E);
            DSV4_OPT_CUDA(cudaMemcpy(ly->tid2eid, t, n * 4, cudaMemcpyHostToDevice));
        }
    } else {
        UPF(ly->gate_bias, E, "layers.%d.ffn.gate.bias", L);
    }
    ly->w13 = carve(cv, E * 2 * NI * D * 2);
    ly->w2 = carve(cv, E * D * NI * 2);
    for (size_t e = 0; e < E && u->go; e++) {
        UPB_AT(ly->w13 + e * 2 * NI * D, NI * D, "layers.%d.ffn.experts.%zu.w1.weight", L, e);
        UPB_AT(ly->w13 + (e * 2 + 1) * NI * D, NI * D, "layers.%d.ffn.experts.%zu.w3.weight", L, e);
        UPB_AT(ly->w2 + e * D * NI, D * NI, "layers.%d.ffn.experts.%zu.w2.weight", L, e);
    }
    return 0;
}

/* transformers' rope inverse frequencies in fp32 (model-spec §3). */
static void rope_inv_freq(const dsv4_rope_params *rp, int rope_dim, float *inv)
{
    int lo = 0, hi = 0;
    if (rp->yarn) {
        double l0 = (double)rp->original_max_position_embeddings, pi = 3.14159265358979323846;
        double bf = rp->beta_fast > 0 ? rp->beta_fast : 32.0, bs = rp->beta_slow > 0 ? rp->beta_slow : 1.0;
        int l = (int)floor((rope_dim * log(l0 / (bf * 2.0 * pi))) / (2.0 * log(rp->theta)));
        int h = (int)ceil((rope_dim * log(l0 / (bs * 2.0 * pi))) / (2.0 * log(rp->theta)));
        lo = l < 0 ? 0 : l;
        hi = h > rope_dim - 1 ? rope_dim - 1 : h;
    }
    float span = (float)(hi - lo);
    if (lo == hi) span = (float)((double)hi + 0.001 - lo);
    for (int i = 0; i < rope_dim / 2; i++) {
        float pos_freq = powf((float)rp->theta, (float)(2 * i) / (float)rope_dim), extra = 1.0f / pos_freq;
        if (!rp->yarn) {
            inv[i] = extra;
            continue;
        }
        float inter = 1.0f / ((float)rp->factor * pos_freq);
        float ramp = ((float)i - (float)lo) / span;
        ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
        float ef = 1.0f - ramp;
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
}

static int weights_layout(dsv4_opt *o, uploader *u, carver *cv)
{
    const size_t V = o->V, D = o->D, n = o->n;
    o->n_x_max = 0;
    UPB(o->embed, V * D, "embed.weight");
    if (o->cfg.tie_word_embeddings) o->head = o->embed;
    else UPB(o->head, V * D, "head.weight");
    UPF(o->norm, D, "norm.weight");
    UPF(o->hc_head_fn, n * n * D, "hc_head_fn");
    UPF(o->hc_head_base, n, "hc_head_base");
    UPF(o->hc_head_scale, 1, "hc_head_scale");
    o->inv_main = carve(cv, (size_t)(o->np + 1) * 4);
    o->inv_cmp = carve(cv, (size_t)(o->np + 1) * 4);
    if (u->go && o->np > 0) {
        float t[2][512];
        rope_inv_freq(&o->cfg.rope_main, o->cfg.qk_rope_head_dim, t[0]);
        rope_inv_freq(&o->cfg.rope_compress, o->cfg.qk_rope_head_dim, t[1]);
        DSV4_OPT_CUDA(cudaMemcpy(o->inv_main, t[0], (size_t)o->np * 4, cudaMemcpyHostToDevice));
        DSV4_OPT_CUDA(cudaMemcpy(o->inv_cmp, t[1], (size_t)o->np * 4, cudaMemcpyHostToDevice));
    }
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) DSV4_OPT_TRY(layer_weights(o, u, cv, L));
    return 0;
}
#undef UPF
#undef UPB
#undef UPB_AT

/* ------------------------------------------------------------------------------------ caches */
static void state_layout(dsv4_opt *o, carver *cv)
{
    const size_t C = o->C, d = o->d, dI = o->dI, W = o->W;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        opt_layer *ly = &o->layers[L];
        const int csa = ly->attn == DSV4_ATTN_CSA;
        ly->pool_cap = ly->ratio > 0 ? (o->opt.max_context / ly->ratio > 0 ? o->opt.max_context / ly->ratio : 1) : 0;
        ly->kvc = carve(cv, C * (W + ly->pool_cap) * d * 2);
        if (ly->ratio <= 0) continue;
        size_t rows = (size_t)(csa ? 2 : 1) * ly->ratio, width = (size_t)(csa ? 2 : 1) * d;
        ly->cmp_kv = carve(cv, C * rows * width * 4);
        ly->cmp_score = carve(cv, C * rows * width * 4);
        if (!csa) continue;
        ly->ipool = carve(cv, C * ly->pool_cap * dI * 2);
        ly->icmp_kv = carve(cv, C * 2 * ly->ratio * 2 * dI * 4);
        ly->icmp_score = carve(cv, C * 2 * ly->ratio * 2 * dI * 4);
    }
}

/* Clear the compressor states of sequence c (seq < 0: all). */
static int state_reset(dsv4_opt *o, int seq)
{
    const int c0 = seq < 0 ? 0 : seq, nc = seq < 0 ? o->C : 1;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        opt_layer *ly = &o->layers[L];
        if (ly->ratio <= 0) continue;
        const int csa = ly->attn == DSV4_ATTN_CSA;
        size_t n = (size_t)(csa ? 2 : 1) * ly->ratio * (csa ? 2 : 1) * o->d;
        DSV4_OPT_CUDA(cudaMemsetAsync(ly->cmp_kv + c0 * n, 0, nc * n * 4, o->stream));
        DSV4_OPT_TRY(dsv4_opt_fill_f32(ly->cmp_score + c0 * n, -INFINITY, nc * n, o->stream));
        if (!csa) continue;
        n = (size_t)2 * ly->ratio * 2 * o->dI;
        DSV4_OPT_CUDA(cudaMemsetAsync(ly->icmp_kv + c0 * n, 0, nc * n * 4, o->stream));
        DSV4_OPT_TRY(dsv4_opt_fill_f32(ly->icmp_score + c0 * n, -INFINITY, nc * n, o->stream));
    }
    DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
    return 0;
}

/* ------------------------------------------------------------------------------------ scratch */
static size_t workspace_need(const dsv4_opt *o)
{
    size_t need = 0, s;
    dsv4_mhc_pre_params mp = {.n_tok = o->C, .n_streams = o->n, .dim = o->D, .kernel = (dsv4_mhc_kernel)o->opt.mhc};
    if ((s = dsv4_opt_mhc_pre_workspace_bytes(&mp)) > need) need = s;
    mp.head = 1;
    if ((s = dsv4_opt_mhc_pre_workspace_bytes(&mp)) > need) need = s;
    dsv4_sparse_attn_params ap = {.n_seq = o->C, .n_heads = o->H, .head_dim = o->d, .rope_dim = 2 * o->np,
                                  .kernel = (dsv4_attn_kernel)o->opt.attn, .out_dtype = DSV4_OUT_BF16};
    /* every gather-list size a step can use: the window, the CSA picks, the HCA buckets */
    int extras[64], ne = 0;
    extras[ne++] = 0;
    extras[ne++] = o->topk;
    for (int b = 16; ne < 62; b *= 2) {
        extras[ne++] = b < o->pool_cap_hca ? b : o->pool_cap_hca;
        if (b >= o->pool_cap_hca) break;
    }
    for (int i = 0; i < ne; i++) {
        ap.n_idx = o->W + extras[i];
        ap.n_slots = o->W + (o->pool_cap_hca > o->pool_cap_csa ? o->pool_cap_hca : o->pool_cap_csa);
        if ((s = dsv4_opt_sparse_attn_workspace_bytes(&ap)) > need) need = s;
    }
    if (o->pool_cap_csa > 0) {
        dsv4_indexer_params ip = {.n_seq = o->C, .n_heads = o->HI, .head_dim = o->dI, .n_work = o->pool_cap_csa,
                                  .kernel = (dsv4_indexer_kernel)o->opt.indexer};
        if ((s = dsv4_opt_indexer_scratch_bytes(&ip)) > need) need = s;
        dsv4_topk_params tp = {.n_seq = o->C, .k = o->topk, .n_work = o->pool_cap_csa,
                               .score_stride = o->pool_cap_csa};
        for (int b = 1; b < 2 * o->pool_cap_csa; b *= 2) {
            tp.n_work = b < o->pool_cap_csa ? b : o->pool_cap_csa;
            tp.context = DSV4_INDEX_CONTEXT_LIVE;
            if ((s = dsv4_opt_topk_workspace_bytes(&tp)) > need) need = s;
            tp.context = DSV4_INDEX_CONTEXT_MAX;
            if ((s = dsv4_opt_topk_workspace_bytes(&tp)) > need) need = s;
        }
    }
    return need;
}

static void scratch_layout(dsv4_opt *o, carver *cv)
{
    const size_t C = o->C, D = o->D, n = o->n, Hd = (size_t)o->H * o->d, HId = (size_t)o->HI * o->dI;
    const size_t NI = o->NI, K = o->K;
    o->X = carve(cv, C * n * D * 2);
    o->X2 = carve(cv, C * n * D * 2);
    o->Xf = carve(cv, C * n * D * 4);
    o->pre = carve(cv, C * n * 4);
    o->post = carve(cv, C * n * 4);
    o->comb = carve(cv, C * n * n * 4);
    o->xa = carve(cv, C * D * 4);
    o->xn = carve(cv, C * D * 2);
    o->proj = carve(cv, C * o->n_x_max * 4);
    o->qr_b = carve(cv, C * o->qr * 2);
    o->qfull = carve(cv, C * (Hd > HId ? Hd : HId) * 4);
    o->q = carve(cv, C * Hd * 2);
    o->qI = carve(cv, C * HId * 2);
    o->wI = carve(cv, C * o->HI * 4);
    o->kvf = carve(cv, C * o->d * 4);
    o->iscore = carve(cv, C * (o->pool_cap_csa > 0 ? o->pool_cap_csa : 1) * 4);
    o->topk_ids = carve(cv, C * o->topk * 4);
    int extra = o->topk > o->pool_cap_hca ? o->topk : o->pool_cap_hca;
    o->idx = carve(cv, C * (o->W + extra) * 4);
    o->o = carve(cv, C * Hd * 2);
    o->z = carve(cv, C * o->G * o->o_r * 2);
    o->aout = carve(cv, C * D * 4);
    o->fout = carve(cv, C * D * 4);
    o->fproj = carve(cv, C * (o->E + 2 * NI) * 4);
    o->rids = carve(cv, C * K * 4);
    o->rw = carve(cv, C * K * 4);
    o->h_sh = carve(cv, C * NI * 2);
    o->h_r = carve(cv, C * K * NI * 2);
    o->y_sh = carve(cv, C * D * 4);
    o->logits = carve(cv, C * o->V * 4);
    o->next = carve(cv, C * 4);
    o->ring_slot = carve(cv, C * 4);
    o->live_csa = carve(cv, C * 4);
    o->live_hca = carve(cv, C * 4);
    o->cos_m = carve(cv, C * (o->np + 1) * 4);
    o->sin_m = carve(cv, C * (o->np + 1) * 4);
    o->cos_c = carve(cv, C * (o->np + 1) * 4);
    o->sin_c = carve(cv, C * (o->np + 1) * 4);
    o->d_in = carve(cv, 3 * C * 4);
    o->ws = carve(cv, o->ws_bytes);
    o->cublas_ws = carve(cv, o->cublas_ws_bytes);
}

/* ------------------------------------------------------------------------------------ init / free */
static int check_config(const dsv4_config *f, const dsv4_opt_options *op)
{
    DSV4_CHECK(op->n_seq >= 1 && op->n_seq <= 4096, "optimized: n_seq %d outside [1, 4096]", op->n_seq);
    DSV4_CHECK(op->max_context >= 1 && op->max_context <= (1 << 20), "optimized: max_context %d outside [1, 2^20]",
               op->max_context);
    DSV4_CHECK(op->dump_seq >= 0 && op->dump_seq < op->n_seq, "optimized: dump_seq %d outside [0, %d)", op->dump_seq,
               op->n_seq);
    if (f->num_key_value_heads != 1 || f->hc_mult < 1 || f->hc_mult > 4 || f->qk_rope_head_dim % 2 ||
        f->qk_rope_head_dim > 1024 || f->o_groups < 1 || f->num_attention_heads % f->o_groups ||
        f->num_experts_per_tok > 16 || strcmp(f->scoring_func, "sqrtsoftplus"))
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized: config outside what the path supports (1 KV head, "
                          "hc_mult <= 4, even rope dim, heads divisible by o_groups, <= 16 experts per token, "
                          "sqrtsoftplus)");
    if (f->hidden_size % 2 || f->moe_intermediate_size % 2)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized: hidden_size %d and moe_intermediate_size %d must be even",
                          f->hidden_size, f->moe_intermediate_size);
    return 0;
}

static int opt_init_impl(dsv4_opt *o, dsv4_model *m)
{
    const dsv4_config *f = &o->cfg;
    o->C = o->opt.n_seq;
    o->D = f->hidden_size, o->n = f->hc_mult, o->V = f->vocab_size, o->H = f->num_attention_heads;
    o->d = f->head_dim, o->qr = f->q_lora_rank, o->HI = f->index_n_heads, o->dI = f->index_head_dim;
    o->E = f->n_routed_experts, o->K = f->num_experts_per_tok, o->NI = f->moe_intermediate_size;
    o->W = f->sliding_window, o->G = f->o_groups, o->o_r = f->o_lora_rank, o->np = f->qk_rope_head_dim / 2;
    o->topk = f->index_topk > 0 ? f->index_topk : 1;
    DSV4_OPT_CUDA(cudaSetDevice(o->opt.device));
    int dev_major = 0, dev_minor = 0;
    DSV4_OPT_CUDA(cudaDeviceGetAttribute(&dev_major, cudaDevAttrComputeCapabilityMajor, o->opt.device));
    DSV4_OPT_CUDA(cudaDeviceGetAttribute(&dev_minor, cudaDevAttrComputeCapabilityMinor, o->opt.device));
    snprintf(o->producer, sizeof o->producer,
             "dsv4 %s optimized cuda bf16 sm_%d%d attn=%s indexer=%s mhc=%s index_context=%s kv=%s", DSV4_VERSION,
             dev_major, dev_minor, dsv4_opt_attn_name(o->opt.attn), dsv4_opt_indexer_name(o->opt.indexer),
             dsv4_opt_mhc_name(o->opt.mhc), dsv4_opt_index_context_name(o->opt.index_context),
             dsv4_opt_kv_name(o->opt.kv));
    o->layers = calloc((size_t)f->num_hidden_layers, sizeof *o->layers);
    o->pos = calloc((size_t)o->C, sizeof *o->pos);
    if (!o->layers || !o->pos) return dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory");
    for (int L = 0; L < f->num_hidden_layers; L++) {
        opt_layer *ly = &o->layers[L];
        ly->attn = f->attn_type[L];
        ly->mlp = f->mlp_type[L];
        ly->ratio = ly->attn == DSV4_ATTN_SLIDING ? 0 : f->compress_ratio[L];
        if (ly->attn != DSV4_ATTN_SLIDING && ly->ratio <= 0)
            return dsv4_error(DSV4_ERR_CONFIG, "layer %d: %s attention with compress ratio %d", L,
                              dsv4_attn_type_name(ly->attn), ly->ratio);
        if (ly->attn == DSV4_ATTN_CSA && ly->ratio != f->compress_rate_csa)
            return dsv4_error(DSV4_ERR_UNSUPPORTED, "layer %d: CSA ratio %d differs from compress_rate_csa %d", L,
                              ly->ratio, f->compress_rate_csa);
        if (ly->attn == DSV4_ATTN_HCA && ly->ratio != f->compress_rate_hca)
            return dsv4_error(DSV4_ERR_UNSUPPORTED, "layer %d: HCA ratio %d differs from compress_rate_hca %d", L,
                              ly->ratio, f->compress_rate_hca);
    }
    /* weights: count, allocate, upload */
    uploader u = {.m = m};
    carver cv = {0};
    DSV4_OPT_TRY(weights_layout(o, &u, &cv));
    o->w_bytes = cv.off;
    DSV4_OPT_TRY(opt_dev_alloc(&o->w_mem, o->w_bytes, "weights"));
    u.go = 1;
    cv = (carver){.base = o->w_mem};
    int rc = weights_layout(o, &u, &cv);
    free(u.host);
    if (rc) return rc;
    /* caches */
    cv = (carver){0};
    state_layout(o, &cv);
    o->s_bytes = cv.off;
    DSV4_OPT_TRY(opt_dev_alloc(&o->s_mem, o->s_bytes, "caches"));
    cv = (carver){.base = o->s_mem};
    state_layout(o, &cv);
    DSV4_OPT_CUDA(cudaMemset(o->s_mem, 0, o->s_bytes));
    for (int L = 0; L < f->num_hidden_layers; L++) {
        if (o->layers[L].attn == DSV4_ATTN_CSA) o->pool_cap_csa = o->layers[L].pool_cap;
        if (o->layers[L].attn == DSV4_ATTN_HCA) o->pool_cap_hca = o->layers[L].pool_cap;
    }
    /* scratch */
    o->ws_bytes = workspace_need(o);
    o->cublas_ws_bytes = (size_t)32 << 20;
    cv = (carver){0};
    scratch_layout(o, &cv);
    o->x_bytes = cv.off;
    DSV4_OPT_TRY(opt_dev_alloc(&o->x_mem, o->x_bytes, "scratch"));
    cv = (carver){.base = o->x_mem};
    scratch_layout(o, &cv);
    DSV4_OPT_CUDA(cudaMemset(o->x_mem, 0, o->x_bytes));
    o->h_probe_floats = (size_t)o->V;
    size_t more[] = {(size_t)o->n * o->D, (size_t)(o->pool_cap_csa > 0 ? o->pool_cap_csa : 1), (size_t)o->topk};
    for (int i = 0; i < 3; i++)
        if (more[i] > o->h_probe_floats) o->h_probe_floats = more[i];
    DSV4_OPT_CUDA(cudaMallocHost((void **)&o->h_probe, o->h_probe_floats * 4));
    DSV4_OPT_CUDA(cudaMallocHost((void **)&o->h_in, (size_t)4 * o->C * 4));
    o->h_next = o->h_in + 3 * o->C;
    DSV4_OPT_CUDA(cudaStreamCreateWithFlags(&o->stream, cudaStreamNonBlocking));
    DSV4_OPT_CUBLAS(cublasCreate(&o->cublas));
    DSV4_OPT_CUBLAS(cublasSetStream(o->cublas, o->stream));
    DSV4_OPT_CUBLAS(cublasSetWorkspace(o->cublas, o->cublas_ws, o->cublas_ws_bytes));
    return state_reset(o, -1);
}

int dsv4_opt_init(dsv4_model *m, const dsv4_opt_options *op, dsv4_opt **out)
{
    DSV4_CHECK(m && op && out, "dsv4_opt_init: NULL argument");
    *out = NULL;
    const dsv4_config *f = dsv4_model_config(m);
    DSV4_OPT_TRY(check_config(f, op));
    dsv4_opt *o = calloc(1, sizeof *o);
    if (!o) return dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory");
    o->opt = *op;
    o->cfg = *f;
    int rc = opt_init_impl(o, m);
    if (rc) {
        dsv4_opt_free(o);
        return rc;
    }
    *out = o;
    return 0;
}

void dsv4_opt_free(dsv4_opt *o)
{
    if (!o) return;
    if (o->stream) cudaStreamSynchronize(o->stream);
    for (int i = 0; i < o->n_graphs; i++) cudaGraphExecDestroy(o->graphs[i].exec);
    if (o->cublas) cublasDestroy(o->cublas);
    if (o->stream) cudaStreamDestroy(o->stream);
    cudaFree(o->w_mem);
    cudaFree(o->s_mem);
    cudaFree(o->x_mem);
    cudaFreeHost(o->h_probe);
    cudaFreeHost(o->h_in);
    free(o->layers);
    free(o->pos);
    free(o);
}

int dsv4_opt_position(const dsv4_opt *o, int seq) { return o && seq >= 0 && seq < o->C ? o->pos[seq] : 0; }

int dsv4_opt_reset(dsv4_opt *o, int seq)
{
    DSV4_CHECK(o && seq >= 0 && seq < o->C, "dsv4_opt_reset: sequence %d outside [0, %d)", seq, o ? o->C : 0);
    o->pos[seq] = 0;
    return state_reset(o, seq);
}

const char *dsv4_opt_producer(const dsv4_opt *o) { return o ? o->producer : "dsv4 optimized"; }

void dsv4_opt_memory(const dsv4_opt *o, size_t *weights, size_t *state, size_t *scratch)
{
    if (weights) *weights = o ? o->w_bytes : 0;
    if (state) *state = o ? o->s_bytes : 0;
    if (scratch) *scratch = o ? o->x_bytes : 0;
}

int opt_gemm(dsv4_opt *o, void *y, int y_f32, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int n_out,
             int n_in, int S)
{
    const float one = 1.0f, zero = 0.0f;
    DSV4_OPT_CUBLAS(cublasGemmEx(o->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, S, n_in, &one, W, CUDA_R_16BF, n_in, x,
                                 CUDA_R_16BF, ldx, &zero, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF, ldy, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    return 0;
}
