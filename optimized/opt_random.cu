/* opt_random.cu - the optimized path built from a config and a seed instead of a model folder (for `dsv4 bench`):
 * every weight generated on the GPU by a counter-based hash, so a Flash-shaped model of ~13 GB per layer needs no
 * files and no host staging; and random decode state ("the caches as if `position` tokens had been decoded").
 *
 * Invariants that fail quietly:
 * - This is the second constructor of struct dsv4_opt (opt_internal.h). It mirrors opt_model.c's layouts
 *   (weights_layout / layer_weights, state_layout, state_reset, workspace_need, scratch_layout, opt_init_impl)
 *   view for view; a view added there must be added here, or the step reads a NULL pointer. The weights arena is
 *   carved in the same order so that both constructors give the same w_bytes for the same config.
 * - Same (config, seed) -> the same weights, bit for bit, whatever C, max_context or switches: every tensor's
 *   values are a function of the seed and a per-tensor stream id only (variants compare on identical weights).
 * - Random state is valid state: entries of the window ring, the compressed pools and the indexer pool are
 *   RMS-normed random rows (what a norm + RoPE leaves, magnitude 1), the compressor states are empty (kv 0,
 *   score -inf: a window boundary, since positions are multiples of the largest ratio) and the entries past
 *   `position` stay as cudaMemset left them (zeros), as in a real run. FP8 kv (--kv fp8) is not simulated here.
 * Spec: model-spec §1 (shapes), §12.1 (the caches).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/elementwise.cuh"
#include "kernels/indexer.cuh"
#include "kernels/mhc.cuh"
#include "kernels/sparse_attn.cuh"
#include "kernels/topk.cuh"
#include "opt_internal.h"
}

/* ------------------------------------------------------------------------------------ device fills */
static __device__ __forceinline__ float rnd_uniform(uint64_t seed, uint64_t i) /* [-1, 1) */
{
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 32;
    return (float)(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

static __global__ void rnd_bf16_kernel(uint16_t *p, size_t n, uint64_t seed, float offset, float amp)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        __nv_bfloat16 b = __float2bfloat16_rn(offset + amp * rnd_uniform(seed, i));
        p[i] = *reinterpret_cast<uint16_t *>(&b);
    }
}

static __global__ void rnd_f32_kernel(float *p, size_t n, uint64_t seed, float offset, float amp)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = offset + amp * rnd_uniform(seed, i);
}

/* tid2eid [V, k]: k distinct experts per token (stride 37 is odd, so distinct for k <= E when E is a power of 2;
 * for other E the ids are still valid, possibly repeated). */
static __global__ void rnd_tid2eid_kernel(int32_t *t, int V, int k, int E, uint64_t seed)
{
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < V; v += gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)((rnd_uniform(seed, (uint64_t)v) + 1.0f) * 0.5f * (float)E);
        for (int j = 0; j < k; j++) t[(size_t)v * k + j] = (int32_t)((h + 37u * (uint32_t)j) % (uint32_t)E);
    }
}

static int launch_check(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return dsv4_error(DSV4_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
    return 0;
}

static uint64_t stream_seed(uint64_t seed, uint64_t id)
{
    uint64_t h = seed * 0xD1B54A32D192ED03ull + id * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    h ^= h >> 33;
    return h * 0xFF51AFD7ED558CCDull;
}

extern "C" int dsv4_opt_random_bf16(void *dst, size_t n, uint64_t seed, float offset, float amp, void *stream)
{
    if (!n) return 0;
    rnd_bf16_kernel<<<1056, 256, 0, (cudaStream_t)stream>>>((uint16_t *)dst, n, seed, offset, amp);
    return launch_check("dsv4_opt_random_bf16");
}

extern "C" int dsv4_opt_random_f32(float *dst, size_t n, uint64_t seed, float offset, float amp, void *stream)
{
    if (!n) return 0;
    rnd_f32_kernel<<<1056, 256, 0, (cudaStream_t)stream>>>(dst, n, seed, offset, amp);
    return launch_check("dsv4_opt_random_f32");
}

/* ------------------------------------------------------------------------------------ weights */
typedef struct gen {
    char *base;       /* NULL: count only */
    size_t off;
    uint64_t seed, id; /* id: the next tensor's stream */
    cudaStream_t s;
} gen;

static void *carve(gen *g, size_t bytes)
{
    g->off = (g->off + 255) & ~(size_t)255;
    void *p = g->base ? g->base + g->off : NULL;
    g->off += bytes;
    return p;
}

/* A tensor of numel values offset + amp·U[-1, 1): carved, then filled when generating. */
static int gen_f32(gen *g, float **dst, size_t numel, float offset, float amp)
{
    *dst = (float *)carve(g, numel * 4);
    uint64_t id = g->id++;
    return g->base ? dsv4_opt_random_f32(*dst, numel, stream_seed(g->seed, id), offset, amp, g->s) : 0;
}
static int gen_bf16_at(gen *g, uint16_t *dst, size_t numel, float amp)
{
    uint64_t id = g->id++;
    return g->base ? dsv4_opt_random_bf16(dst, numel, stream_seed(g->seed, id), 0.0f, amp, g->s) : 0;
}
static int gen_bf16(gen *g, uint16_t **dst, size_t numel, float amp)
{
    *dst = (uint16_t *)carve(g, numel * 2);
    return gen_bf16_at(g, *dst, numel, amp);
}

/* uniform amplitude giving a linear layer of fan-in n_in unit gain: std = amp/sqrt(3) = 1/sqrt(n_in) */
static float lin_amp(size_t n_in) { return sqrtf(3.0f / (float)n_in); }

static int layer_gen(dsv4_opt *o, gen *g, int L)
{
    opt_layer *ly = &o->layers[L];
    const size_t D = o->D, nD = (size_t)o->n * o->D, mix = (size_t)(2 + o->n) * o->n, E = o->E, NI = o->NI;
    const size_t d = o->d, dI = o->dI;
    const int csa = ly->attn == DSV4_ATTN_CSA;
    const size_t width = (csa ? 2 : 1) * d;
    const float fn_amp = lin_amp(nD);
    DSV4_OPT_TRY(gen_f32(g, &ly->hc_attn_fn, mix * nD, 0.0f, fn_amp));
    DSV4_OPT_TRY(gen_f32(g, &ly->hc_attn_base, mix, 0.0f, 0.5f));
    DSV4_OPT_TRY(gen_f32(g, &ly->hc_attn_scale, 3, 0.5f, 0.25f));
    DSV4_OPT_TRY(gen_f32(g, &ly->hc_ffn_fn, mix * nD, 0.0f, fn_amp));
    DSV4_OPT_TRY(gen_f32(g, &ly->hc_ffn_base, mix, 0.0f, 0.5f));
    DSV4_OPT_TRY(gen_f32(g, &ly->hc_ffn_scale, 3, 0.5f, 0.25f));
    DSV4_OPT_TRY(gen_f32(g, &ly->attn_norm, D, 1.0f, 0.1f));
    DSV4_OPT_TRY(gen_f32(g, &ly->ffn_norm, D, 1.0f, 0.1f));
    DSV4_OPT_TRY(gen_f32(g, &ly->q_norm, o->qr, 1.0f, 0.1f));
    DSV4_OPT_TRY(gen_f32(g, &ly->kv_norm, d, 1.0f, 0.1f));
    DSV4_OPT_TRY(gen_f32(g, &ly->sinks, o->H, 0.0f, 1.0f));
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
    DSV4_OPT_TRY(gen_bf16(g, &ly->w_x, (size_t)r * D, lin_amp(D)));
    if (ly->ratio > 0) {
        DSV4_OPT_TRY(gen_f32(g, &ly->cmp_ape, (size_t)ly->ratio * width, 0.0f, 0.5f));
        DSV4_OPT_TRY(gen_f32(g, &ly->cmp_norm, d, 1.0f, 0.1f));
    }
    if (csa) {
        DSV4_OPT_TRY(gen_f32(g, &ly->idx_ape, (size_t)ly->ratio * 2 * dI, 0.0f, 0.5f));
        DSV4_OPT_TRY(gen_f32(g, &ly->idx_norm, dI, 1.0f, 0.1f));
        DSV4_OPT_TRY(gen_bf16(g, &ly->idx_wq_b, (size_t)o->HI * dI * o->qr, lin_amp(o->qr)));
    }
    DSV4_OPT_TRY(gen_bf16(g, &ly->wq_b, (size_t)o->H * d * o->qr, lin_amp(o->qr)));
    DSV4_OPT_TRY(gen_bf16(g, &ly->wo_a, (size_t)o->G * o->o_r * (o->H * d / o->G), lin_amp(o->H * d / o->G)));
    DSV4_OPT_TRY(gen_bf16(g, &ly->wo_b, D * o->G * o->o_r, lin_amp((size_t)o->G * o->o_r)));
    DSV4_OPT_TRY(gen_bf16(g, &ly->w_f, (E + 2 * NI) * D, lin_amp(D)));
    DSV4_OPT_TRY(gen_bf16(g, &ly->sh_w2, D * NI, lin_amp(NI)));
    if (ly->mlp == DSV4_MLP_HASH_MOE) {
        ly->tid2eid = (int32_t *)carve(g, (size_t)o->V * o->K * 4);
        uint64_t id = g->id++;
        if (g->base) {
            rnd_tid2eid_kernel<<<512, 256, 0, g->s>>>(ly->tid2eid, o->V, o->K, o->E, stream_seed(g->seed, id));
            DSV4_OPT_TRY(launch_check("tid2eid"));
        }
    } else {
        DSV4_OPT_TRY(gen_f32(g, &ly->gate_bias, E, 0.0f, 0.05f));
    }
    DSV4_OPT_TRY(gen_bf16(g, &ly->w13, E * 2 * NI * D, lin_amp(D)));
    DSV4_OPT_TRY(gen_bf16(g, &ly->w2, E * D * NI, lin_amp(NI)));
    return 0;
}

/* transformers' rope inverse frequencies in fp32 (model-spec §3); the same formula as opt_model.c. */
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

static int weights_gen(dsv4_opt *o, gen *g)
{
    const size_t V = o->V, D = o->D, n = o->n;
    o->n_x_max = 0;
    DSV4_OPT_TRY(gen_bf16(g, &o->embed, V * D, 1.0f));
    if (o->cfg.tie_word_embeddings) o->head = o->embed;
    else DSV4_OPT_TRY(gen_bf16(g, &o->head, V * D, lin_amp(D)));
    DSV4_OPT_TRY(gen_f32(g, &o->norm, D, 1.0f, 0.1f));
    DSV4_OPT_TRY(gen_f32(g, &o->hc_head_fn, n * n * D, 0.0f, lin_amp(n * D)));
    DSV4_OPT_TRY(gen_f32(g, &o->hc_head_base, n, 0.0f, 0.5f));
    DSV4_OPT_TRY(gen_f32(g, &o->hc_head_scale, 1, 0.5f, 0.25f));
    o->inv_main = (float *)carve(g, (size_t)(o->np + 1) * 4);
    o->inv_cmp = (float *)carve(g, (size_t)(o->np + 1) * 4);
    if (g->base && o->np > 0) {
        static float t[2][512];
        rope_inv_freq(&o->cfg.rope_main, o->cfg.qk_rope_head_dim, t[0]);
        rope_inv_freq(&o->cfg.rope_compress, o->cfg.qk_rope_head_dim, t[1]);
        DSV4_OPT_CUDA(cudaMemcpy(o->inv_main, t[0], (size_t)o->np * 4, cudaMemcpyHostToDevice));
        DSV4_OPT_CUDA(cudaMemcpy(o->inv_cmp, t[1], (size_t)o->np * 4, cudaMemcpyHostToDevice));
    }
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) DSV4_OPT_TRY(layer_gen(o, g, L));
    return 0;
}

/* ------------------------------------------------------------------------------------ caches and scratch */
static void state_layout(dsv4_opt *o, gen *cv)
{
    const size_t C = o->C, d = o->d, dI = o->dI, W = o->W;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        opt_layer *ly = &o->layers[L];
        const int csa = ly->attn == DSV4_ATTN_CSA;
        ly->pool_cap = ly->ratio > 0 ? (o->opt.max_context / ly->ratio > 0 ? o->opt.max_context / ly->ratio : 1) : 0;
        ly->kvc = (uint16_t *)carve(cv, C * (W + ly->pool_cap) * d * 2);
        if (ly->ratio <= 0) continue;
        size_t rows = (size_t)(csa ? 2 : 1) * ly->ratio, width = (size_t)(csa ? 2 : 1) * d;
        ly->cmp_kv = (float *)carve(cv, C * rows * width * 4);
        ly->cmp_score = (float *)carve(cv, C * rows * width * 4);
        if (!csa) continue;
        ly->ipool = (uint16_t *)carve(cv, C * ly->pool_cap * dI * 2);
        ly->icmp_kv = (float *)carve(cv, C * 2 * ly->ratio * 2 * dI * 4);
        ly->icmp_score = (float *)carve(cv, C * 2 * ly->ratio * 2 * dI * 4);
    }
}

static int state_reset_all(dsv4_opt *o)
{
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        opt_layer *ly = &o->layers[L];
        if (ly->ratio <= 0) continue;
        const int csa = ly->attn == DSV4_ATTN_CSA;
        size_t n = (size_t)o->C * (csa ? 2 : 1) * ly->ratio * (csa ? 2 : 1) * o->d;
        DSV4_OPT_CUDA(cudaMemsetAsync(ly->cmp_kv, 0, n * 4, o->stream));
        DSV4_OPT_TRY(dsv4_opt_fill_f32(ly->cmp_score, -INFINITY, n, o->stream));
        if (!csa) continue;
        n = (size_t)o->C * 2 * ly->ratio * 2 * o->dI;
        DSV4_OPT_CUDA(cudaMemsetAsync(ly->icmp_kv, 0, n * 4, o->stream));
        DSV4_OPT_TRY(dsv4_opt_fill_f32(ly->icmp_score, -INFINITY, n, o->stream));
    }
    DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
    return 0;
}

static size_t workspace_need(const dsv4_opt *o)
{
    size_t need = 0, s;
    dsv4_mhc_pre_params mp;
    memset(&mp, 0, sizeof mp);
    mp.n_tok = o->C, mp.n_streams = o->n, mp.dim = o->D, mp.kernel = (dsv4_mhc_kernel)o->opt.mhc;
    if ((s = dsv4_opt_mhc_pre_workspace_bytes(&mp)) > need) need = s;
    mp.head = 1;
    if ((s = dsv4_opt_mhc_pre_workspace_bytes(&mp)) > need) need = s;
    /* dsv4_opt_sparse_attn_workspace_bytes validates the whole params struct (pointers non-NULL and 16-aligned,
     * the KV stride) and answers 0 when it does not pass: give it placeholders that pass, never dereferenced. */
    static uint16_t placeholder[8] __attribute__((aligned(16)));
    dsv4_sparse_attn_params ap;
    memset(&ap, 0, sizeof ap);
    ap.n_seq = o->C, ap.n_heads = o->H, ap.head_dim = o->d, ap.rope_dim = 2 * o->np;
    ap.kernel = (dsv4_attn_kernel)o->opt.attn, ap.out_dtype = DSV4_OUT_BF16;
    ap.q = ap.kv = placeholder, ap.idx = (const int32_t *)placeholder, ap.sink = (const float *)placeholder;
    ap.rope_cos = ap.rope_sin = (const float *)placeholder, ap.out = placeholder;
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
        ap.kv_seq_stride = (int64_t)ap.n_slots * o->d;
        if ((s = dsv4_opt_sparse_attn_workspace_bytes(&ap)) > need) need = s;
    }
    if (o->pool_cap_csa > 0) {
        dsv4_indexer_params ip;
        memset(&ip, 0, sizeof ip);
        ip.n_seq = o->C, ip.n_heads = o->HI, ip.head_dim = o->dI, ip.n_work = o->pool_cap_csa;
        ip.kernel = (dsv4_indexer_kernel)o->opt.indexer;
        if ((s = dsv4_opt_indexer_scratch_bytes(&ip)) > need) need = s;
        dsv4_topk_params tp;
        memset(&tp, 0, sizeof tp);
        tp.n_seq = o->C, tp.k = o->topk, tp.n_work = o->pool_cap_csa, tp.score_stride = o->pool_cap_csa;
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

#define CARVE(field, bytes) (o->field = (decltype(o->field))carve(cv, (bytes)))
static void scratch_layout(dsv4_opt *o, gen *cv)
{
    const size_t C = o->C, D = o->D, n = o->n, Hd = (size_t)o->H * o->d, HId = (size_t)o->HI * o->dI;
    const size_t NI = o->NI, K = o->K;
    CARVE(X, C * n * D * 2);
    CARVE(X2, C * n * D * 2);
    CARVE(Xf, C * n * D * 4);
    CARVE(pre, C * n * 4);
    CARVE(post, C * n * 4);
    CARVE(comb, C * n * n * 4);
    CARVE(xa, C * D * 4);
    CARVE(xn, C * D * 2);
    CARVE(proj, C * o->n_x_max * 4);
    CARVE(qr_b, C * o->qr * 2);
    CARVE(qfull, C * (Hd > HId ? Hd : HId) * 4);
    CARVE(q, C * Hd * 2);
    CARVE(qI, C * HId * 2);
    CARVE(wI, C * o->HI * 4);
    CARVE(kvf, C * o->d * 4);
    CARVE(iscore, C * (o->pool_cap_csa > 0 ? o->pool_cap_csa : 1) * 4);
    CARVE(topk_ids, C * o->topk * 4);
    int extra = o->topk > o->pool_cap_hca ? o->topk : o->pool_cap_hca;
    CARVE(idx, C * (o->W + extra) * 4);
    CARVE(o, C * Hd * 2);
    CARVE(z, C * o->G * o->o_r * 2);
    CARVE(aout, C * D * 4);
    CARVE(fout, C * D * 4);
    CARVE(fproj, C * (o->E + 2 * NI) * 4);
    CARVE(rids, C * K * 4);
    CARVE(rw, C * K * 4);
    CARVE(h_sh, C * NI * 2);
    CARVE(h_r, C * K * NI * 2);
    CARVE(y_sh, C * D * 4);
    CARVE(logits, C * o->V * 4);
    CARVE(next, C * 4);
    CARVE(ring_slot, C * 4);
    CARVE(live_csa, C * 4);
    CARVE(live_hca, C * 4);
    CARVE(cos_m, C * (o->np + 1) * 4);
    CARVE(sin_m, C * (o->np + 1) * 4);
    CARVE(cos_c, C * (o->np + 1) * 4);
    CARVE(sin_c, C * (o->np + 1) * 4);
    CARVE(d_in, 3 * C * 4);
    CARVE(ws, o->ws_bytes);
    CARVE(cublas_ws, o->cublas_ws_bytes);
}
#undef CARVE

/* ------------------------------------------------------------------------------------ init */
static int random_init_impl(dsv4_opt *o, uint64_t seed)
{
    const dsv4_config *f = &o->cfg;
    o->C = o->opt.n_seq;
    o->D = f->hidden_size, o->n = f->hc_mult, o->V = f->vocab_size, o->H = f->num_attention_heads;
    o->d = f->head_dim, o->qr = f->q_lora_rank, o->HI = f->index_n_heads, o->dI = f->index_head_dim;
    o->E = f->n_routed_experts, o->K = f->num_experts_per_tok, o->NI = f->moe_intermediate_size;
    o->W = f->sliding_window, o->G = f->o_groups, o->o_r = f->o_lora_rank, o->np = f->qk_rope_head_dim / 2;
    o->topk = f->index_topk > 0 ? f->index_topk : 1;
    DSV4_OPT_CUDA(cudaSetDevice(o->opt.device));
    int mj = 0, mn = 0;
    DSV4_OPT_CUDA(cudaDeviceGetAttribute(&mj, cudaDevAttrComputeCapabilityMajor, o->opt.device));
    DSV4_OPT_CUDA(cudaDeviceGetAttribute(&mn, cudaDevAttrComputeCapabilityMinor, o->opt.device));
    snprintf(o->producer, sizeof o->producer,
             "dsv4 %s optimized cuda bf16 sm_%d%d attn=%s indexer=%s mhc=%s index_context=%s kv=%s random-seed=%llu",
             DSV4_VERSION, mj, mn, dsv4_opt_attn_name(o->opt.attn), dsv4_opt_indexer_name(o->opt.indexer),
             dsv4_opt_mhc_name(o->opt.mhc), dsv4_opt_index_context_name(o->opt.index_context),
             dsv4_opt_kv_name(o->opt.kv), (unsigned long long)seed);
    o->layers = (opt_layer *)calloc((size_t)f->num_hidden_layers, sizeof *o->layers);
    o->pos = (int *)calloc((size_t)o->C, sizeof *o->pos);
    if (!o->layers || !o->pos) return dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory");
    for (int L = 0; L < f->num_hidden_layers; L++) {
        opt_layer *ly = &o->layers[L];
        ly->attn = f->attn_type[L];
        ly->mlp = f->mlp_type[L];
        ly->ratio = ly->attn == DSV4_ATTN_SLIDING ? 0 : f->compress_ratio[L];
        if (ly->attn != DSV4_ATTN_SLIDING && ly->ratio <= 0)
            return dsv4_error(DSV4_ERR_CONFIG, "layer %d: compressed attention with ratio %d", L, ly->ratio);
    }
    DSV4_OPT_CUDA(cudaStreamCreateWithFlags(&o->stream, cudaStreamNonBlocking));
    gen g;
    memset(&g, 0, sizeof g);
    DSV4_OPT_TRY(weights_gen(o, &g));
    o->w_bytes = g.off;
    DSV4_OPT_TRY(dsv4_mem_check_device((double)o->w_bytes, "optimized (random): weights"));
    DSV4_OPT_TRY(opt_dev_alloc(&o->w_mem, o->w_bytes, "weights"));
    memset(&g, 0, sizeof g);
    g.base = (char *)o->w_mem, g.seed = seed, g.s = o->stream;
    DSV4_OPT_TRY(weights_gen(o, &g));
    memset(&g, 0, sizeof g);
    state_layout(o, &g);
    o->s_bytes = g.off;
    DSV4_OPT_TRY(dsv4_mem_check_device((double)o->s_bytes, "optimized (random): caches"));
    DSV4_OPT_TRY(opt_dev_alloc(&o->s_mem, o->s_bytes, "caches"));
    memset(&g, 0, sizeof g);
    g.base = (char *)o->s_mem;
    state_layout(o, &g);
    DSV4_OPT_CUDA(cudaMemsetAsync(o->s_mem, 0, o->s_bytes, o->stream));
    for (int L = 0; L < f->num_hidden_layers; L++) {
        if (o->layers[L].attn == DSV4_ATTN_CSA) o->pool_cap_csa = o->layers[L].pool_cap;
        if (o->layers[L].attn == DSV4_ATTN_HCA) o->pool_cap_hca = o->layers[L].pool_cap;
    }
    o->ws_bytes = workspace_need(o);
    o->cublas_ws_bytes = (size_t)32 << 20;
    memset(&g, 0, sizeof g);
    scratch_layout(o, &g);
    o->x_bytes = g.off;
    DSV4_OPT_TRY(dsv4_mem_check_device((double)o->x_bytes, "optimized (random): scratch"));
    DSV4_OPT_TRY(opt_dev_alloc(&o->x_mem, o->x_bytes, "scratch"));
    memset(&g, 0, sizeof g);
    g.base = (char *)o->x_mem;
    scratch_layout(o, &g);
    DSV4_OPT_CUDA(cudaMemsetAsync(o->x_mem, 0, o->x_bytes, o->stream));
    o->h_probe_floats = (size_t)o->V;
    size_t more[] = {(size_t)o->n * o->D, (size_t)(o->pool_cap_csa > 0 ? o->pool_cap_csa : 1), (size_t)o->topk};
    for (int i = 0; i < 3; i++)
        if (more[i] > o->h_probe_floats) o->h_probe_floats = more[i];
    DSV4_OPT_CUDA(cudaMallocHost((void **)&o->h_probe, o->h_probe_floats * 4));
    DSV4_OPT_CUDA(cudaMallocHost((void **)&o->h_in, (size_t)4 * o->C * 4));
    o->h_next = o->h_in + 3 * o->C;
    DSV4_OPT_CUBLAS(cublasCreate(&o->cublas));
    DSV4_OPT_CUBLAS(cublasSetStream(o->cublas, o->stream));
    DSV4_OPT_CUBLAS(cublasSetWorkspace(o->cublas, o->cublas_ws, o->cublas_ws_bytes));
    return state_reset_all(o);
}

extern "C" int dsv4_opt_init_random(const dsv4_config *cfg, uint64_t seed, const dsv4_opt_options *op,
                                    dsv4_opt **out)
{
    DSV4_CHECK(cfg && op && out, "dsv4_opt_init_random: NULL argument");
    *out = NULL;
    DSV4_CHECK(op->n_seq >= 1 && op->n_seq <= 4096, "optimized: n_seq %d outside [1, 4096]", op->n_seq);
    DSV4_CHECK(op->max_context >= 1 && op->max_context <= (1 << 20), "optimized: max_context %d outside [1, 2^20]",
               op->max_context);
    DSV4_CHECK(op->dump_seq >= 0 && op->dump_seq < op->n_seq, "optimized: dump_seq %d outside [0, %d)", op->dump_seq,
               op->n_seq);
    if (cfg->num_key_value_heads != 1 || cfg->hc_mult < 1 || cfg->hc_mult > 4 || cfg->qk_rope_head_dim % 2 ||
        cfg->qk_rope_head_dim > 1024 || cfg->o_groups < 1 || cfg->num_attention_heads % cfg->o_groups ||
        cfg->num_experts_per_tok > 16 || cfg->hidden_size % 2 || cfg->moe_intermediate_size % 2)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "optimized (random): config outside what the path supports");
    dsv4_opt *o = (dsv4_opt *)calloc(1, sizeof *o);
    if (!o) return dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory");
    o->opt = *op;
    o->cfg = *cfg;
    int rc = random_init_impl(o, seed);
    if (rc) {
        dsv4_opt_free(o);
        return rc;
    }
    *out = o;
    return 0;
}

/* ------------------------------------------------------------------------------------ random state */
extern "C" int dsv4_opt_random_state(dsv4_opt *o, int position, uint64_t seed)
{
    DSV4_CHECK(o, "dsv4_opt_random_state: NULL argument");
    DSV4_CHECK(position >= 0 && position < o->opt.max_context, "dsv4_opt_random_state: position %d outside [0, %d)",
               position, o->opt.max_context);
    const float amp = sqrtf(3.0f); /* U[-√3, √3): RMS 1, like a normed row */
    const size_t d = o->d, dI = o->dI, W = o->W;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        const opt_layer *ly = &o->layers[L];
        size_t n_ent = ly->ratio > 0 ? (size_t)(position / ly->ratio) : 0;
        if (n_ent > (size_t)ly->pool_cap) n_ent = (size_t)ly->pool_cap;
        for (int c = 0; c < o->C; c++) {
            uint64_t sid = stream_seed(seed, ((uint64_t)L << 32) | ((uint64_t)c << 1));
            uint16_t *kv = ly->kvc + (size_t)c * (W + ly->pool_cap) * d;
            DSV4_OPT_TRY(dsv4_opt_random_bf16(kv, (W + n_ent) * d, sid, 0.0f, amp, o->stream));
            if (ly->attn == DSV4_ATTN_CSA && n_ent > 0)
                DSV4_OPT_TRY(dsv4_opt_random_bf16(ly->ipool + (size_t)c * ly->pool_cap * dI, n_ent * dI, sid + 1,
                                                  0.0f, amp, o->stream));
        }
    }
    DSV4_OPT_TRY(state_reset_all(o));
    for (int c = 0; c < o->C; c++) o->pos[c] = position;
    return 0;
}
