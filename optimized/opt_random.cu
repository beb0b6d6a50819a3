/* opt_random.cu - the optimized path built from a config and a seed instead of a model folder (for `dsv4 bench`):
 * every weight generated on the GPU by a counter-based hash, so a Flash-shaped model of ~13 GB per layer needs no
 * files and no host staging; and random decode state ("the caches as if `position` tokens had been decoded").
 * Only the generator lives here: the arenas' layout and the init sequence are opt_layout.c's, shared with the
 * model-folder constructor (opt_model.c), so both give the same views and the same arena sizes.
 *
 * Invariants that fail quietly:
 * - Same (config, seed) -> the same weights, bit for bit, whatever C, max_context or switches: every view's
 *   values are a function of the seed and a per-view stream id only, the ids counted in carve order (one per
 *   f32 / bf16_view / tid2eid call of opt_layout.c); variants compare on identical weights.
 * - Random state is valid state: entries of the window ring, the compressed pools and the indexer pool are
 *   RMS-normed random rows (what a norm + RoPE leaves, magnitude 1), the compressor states are empty (kv 0,
 *   score -inf: a window boundary, since positions are multiples of the largest ratio) and the entries past
 *   `position` stay as cudaMemset left them (zeros), as in a real run. With --kv fp8 the window ring and the main
 *   pool hold fp8 cache entries (kernels/kv_layout.h) of the same distribution.
 * - fp8 weights: the FP8 linears and FP4 experts are drawn as codes with the scale the quantiser would give a
 *   block of amax = the bf16 draw's amplitude (one stream per file tensor), so their gain matches bf16 mode's;
 *   they are NOT the bf16 mode's values quantised (throughput runs only compare times).
 * Spec: model-spec §1 (shapes), §12.1 (the caches).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kv_layout.h"
extern "C" {
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

/* e4m3 codes of offset-free U[-1, 1) * amp / 2^sexp (round to nearest even, saturating): the fp8 mode's linears,
 * drawn as codes directly (no bf16 copy); every scale byte is sexp + 127. */
static __global__ void rnd_fp8_kernel(uint8_t *q, size_t n, uint8_t *scale, size_t ns, uint64_t seed, float amp,
                                      int sexp)
{
    const float inv = ldexpf(1.0f, -sexp);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        q[i] = (uint8_t)__nv_cvt_float_to_fp8(amp * rnd_uniform(seed, i) * inv, __NV_SATFINITE, __NV_E4M3);
        if (i < ns) scale[i] = (uint8_t)(sexp + 127);
    }
}

/* e2m1 code of x (|x| <= 6 here): nearest, ties to the even code, as model/quant.c */
static __device__ __forceinline__ uint32_t e2m1_code(float x)
{
    const float a = fabsf(x);
    uint32_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5
               : a <= 5.0f ? 6 : 7;
    return c && x < 0 ? c | 8 : c;
}

/* Packed e2m1 codes (two per byte, low nibble = even column) of U[-1, 1) * amp / 2^sexp; scales sexp + 127. */
static __global__ void rnd_fp4_kernel(uint8_t *q, size_t n_bytes, uint8_t *scale, size_t ns, uint64_t seed, float amp,
                                      int sexp)
{
    const float inv = ldexpf(1.0f, -sexp);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_bytes; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t lo = e2m1_code(amp * rnd_uniform(seed, 2 * i) * inv);
        uint32_t hi = e2m1_code(amp * rnd_uniform(seed, 2 * i + 1) * inv);
        q[i] = (uint8_t)(lo | hi << 4);
        if (i < ns) scale[i] = (uint8_t)(sexp + 127);
    }
}

/* n --kv fp8 cache entries (kernels/kv_layout.h) of U[-amp, amp) rows: bf16 rope channels, e4m3 codes with the
 * scale 2^sexp that the quantiser gives a block of amax = amp (every scale byte sexp + 127), zero padding. */
static __global__ void rnd_kv8_kernel(uint8_t *e, size_t n, int d, int rope, uint64_t seed, float amp, int sexp)
{
    const int eb = (int)dsv4_kv8_entry_bytes(d, rope), nope = d - rope, codes = dsv4_kv8_codes_at(rope);
    const int scales = dsv4_kv8_scales_at(d, rope), ns = dsv4_kv8_scales(nope);
    const float inv = ldexpf(1.0f, -sexp);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n * eb; i += (size_t)gridDim.x * blockDim.x) {
        const size_t ent = i / eb;
        const int b = (int)(i % eb);
        uint8_t v = 0;
        if (b < codes) {
            const int ch = nope + b / 2; /* rope channel of this byte */
            __nv_bfloat16 h = __float2bfloat16_rn(amp * rnd_uniform(seed, ent * d + ch));
            v = (uint8_t)(*reinterpret_cast<uint16_t *>(&h) >> (8 * (b & 1)));
        } else if (b < scales) {
            const int ch = b - codes;
            v = (uint8_t)__nv_cvt_float_to_fp8(amp * rnd_uniform(seed, ent * d + ch) * inv, __NV_SATFINITE, __NV_E4M3);
        } else if (b < scales + ns) {
            v = (uint8_t)(sexp + 127);
        }
        e[i] = v;
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

/* ------------------------------------------------------------------------------------ the generator's source */
typedef struct gen_src {
    opt_weight_src base;
    uint64_t seed, id; /* id: the next view's stream */
} gen_src;

/* uniform amplitude giving a linear layer of fan-in n_in unit gain: std = amp/sqrt(3) = 1/sqrt(n_in) */
static float lin_amp(size_t n_in) { return sqrtf(3.0f / (float)n_in); }

/* The distribution of a view: offset + amp·U[-1, 1). */
static void gen_dist(opt_wkind kind, size_t fan_in, float *offset, float *amp)
{
    *offset = 0.0f;
    switch (kind) {
    case OPT_W_LINEAR: *amp = lin_amp(fan_in); break;
    case OPT_W_EMBED: *amp = 1.0f; break;
    case OPT_W_MHC_BASE: *amp = 0.5f; break;
    case OPT_W_MHC_SCALE: *offset = 0.5f, *amp = 0.25f; break;
    case OPT_W_NORM: *offset = 1.0f, *amp = 0.1f; break;
    case OPT_W_SINK: *amp = 1.0f; break;
    case OPT_W_APE: *amp = 0.5f; break;
    case OPT_W_BIAS: *amp = 0.05f; break;
    }
}

static int gen_f32(opt_weight_src *s, const dsv4_opt *o, float *dst, size_t numel, opt_wkind kind, size_t fan_in,
                   const char *name)
{
    gen_src *g = (gen_src *)s;
    float offset = 0.0f, amp = 0.0f; /* set by every case below; initialised for -O3's maybe-uninitialized */
    (void)name;
    gen_dist(kind, fan_in, &offset, &amp);
    return dsv4_opt_random_f32(dst, numel, stream_seed(g->seed, g->id++), offset, amp, o->stream);
}

static int gen_bf16_view(opt_weight_src *s, const dsv4_opt *o, uint16_t *dst, size_t numel, opt_wkind kind,
                         size_t fan_in)
{
    gen_src *g = (gen_src *)s;
    float offset = 0.0f, amp = 0.0f; /* set by every case below; initialised for -O3's maybe-uninitialized */
    gen_dist(kind, fan_in, &offset, &amp);
    return dsv4_opt_random_bf16(dst, numel, stream_seed(g->seed, g->id++), offset, amp, o->stream);
}

static int gen_bf16_part(opt_weight_src *s, const dsv4_opt *o, uint16_t *dst, size_t numel, const char *name)
{
    (void)s, (void)o, (void)dst, (void)numel, (void)name;
    return 0; /* the view was drawn as a whole */
}

static dsv4_qscale gen_qscale(opt_weight_src *s, const dsv4_opt *o, const char *name)
{
    (void)s, (void)o, (void)name;
    return DSV4_QSCALE_E8M0;
}

/* The power of two the quantiser would pick for a block whose amax is amp: 2^ceil(log2(amp / top)). */
static int gen_sexp(float amp, float top)
{
    return (int)ceil(log2((double)amp / top));
}

/* Draws the block [nr, nc] (a rank's slice is drawn at its own size, like the bf16 views). */
static int gen_fp8(opt_weight_src *s, const dsv4_opt *o, uint8_t *q, void *scale, dsv4_qscale kind, int rows,
                   int cols, int r0, int nr, int c0, int nc, size_t fan_in, const char *name)
{
    gen_src *g = (gen_src *)s;
    (void)kind, (void)name, (void)rows, (void)cols, (void)r0, (void)c0;
    const size_t n = (size_t)nr * nc, ns = (size_t)((nr + 127) / 128) * ((nc + 127) / 128);
    const float amp = lin_amp(fan_in);
    rnd_fp8_kernel<<<1056, 256, 0, o->stream>>>(q, n, (uint8_t *)scale, ns, stream_seed(g->seed, g->id++), amp,
                                                gen_sexp(amp, 448.0f));
    return launch_check("random fp8 linear");
}

static int gen_fp4(opt_weight_src *s, const dsv4_opt *o, uint8_t *q, uint8_t *scale, int rows, int cols,
                   size_t fan_in, const char *name)
{
    gen_src *g = (gen_src *)s;
    (void)name;
    const float amp = lin_amp(fan_in);
    rnd_fp4_kernel<<<264, 256, 0, o->stream>>>(q, (size_t)rows * cols / 2, scale, (size_t)rows * cols / 32,
                                               stream_seed(g->seed, g->id++), amp, gen_sexp(amp, 6.0f));
    return launch_check("random fp4 experts");
}

static int gen_tid2eid(opt_weight_src *s, const dsv4_opt *o, int32_t *dst, const char *name)
{
    gen_src *g = (gen_src *)s;
    (void)name;
    rnd_tid2eid_kernel<<<512, 256, 0, o->stream>>>(dst, o->V, o->K, o->E, stream_seed(g->seed, g->id++));
    return launch_check("tid2eid");
}

/* ------------------------------------------------------------------------------------ init */
typedef struct gen_ctx {
    const dsv4_config *cfg;
    uint64_t seed;
} gen_ctx;

/* One rank's object. Every rank draws its views from the same seed in the same carve order, so replicated
 * weights agree across ranks; the split views are drawn at the rank's size (throughput runs only). */
static int build_random(void *ctx, const dsv4_opt_options *op, int rank, int n_ranks, dsv4_opt **out)
{
    const gen_ctx *x = (const gen_ctx *)ctx;
    const uint64_t seed = x->seed;
    *out = NULL;
    dsv4_opt *o = (dsv4_opt *)calloc(1, sizeof *o);
    if (!o) return dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory");
    o->opt = *op;
    o->cfg = *x->cfg;
    o->rank = rank, o->n_ranks = n_ranks;
    gen_src g;
    memset(&g, 0, sizeof g);
    g.base.what = "optimized (random)";
    g.base.f32 = gen_f32;
    g.base.bf16_view = gen_bf16_view;
    g.base.bf16_part = gen_bf16_part;
    g.base.tid2eid = gen_tid2eid;
    g.base.qscale = gen_qscale;
    g.base.fp8 = gen_fp8;
    g.base.fp4 = gen_fp4;
    g.seed = seed;
    int rc = opt_init_common(o, &g.base);
    if (rc) {
        opt_free_one(o);
        return rc;
    }
    size_t n = strlen(o->producer);
    snprintf(o->producer + n, sizeof o->producer - n, " random-seed=%llu", (unsigned long long)seed);
    *out = o;
    return 0;
}

extern "C" int dsv4_opt_init_random(const dsv4_config *cfg, uint64_t seed, const dsv4_opt_options *op,
                                    dsv4_opt **out)
{
    DSV4_CHECK(cfg && op && out, "dsv4_opt_init_random: NULL argument");
    *out = NULL;
    dsv4_opt_options r = *op;
    /* no checkpoint: bf16 unless quantised; bf16 weights are drawn as bf16, never quantised */
    if (r.weights == DSV4_OPT_WEIGHTS_AUTO)
        r.weights = r.quantize == DSV4_OPT_QUANTIZE_FP8 ? DSV4_OPT_WEIGHTS_FP8 : DSV4_OPT_WEIGHTS_BF16;
    if (r.weights == DSV4_OPT_WEIGHTS_BF16 && r.quantize == DSV4_OPT_QUANTIZE_FP8)
        return dsv4_error(DSV4_ERR_USAGE, "optimized (random): --weights bf16 with --quantize fp8: the random "
                          "model's bf16 weights are drawn as bf16 (use --weights fp8)");
    DSV4_TRY(opt_check_config(cfg, &r)); /* with --gpus N --weights fp8 also the scale-block split */
    gen_ctx x = {cfg, seed};
    if (r.n_gpus > 0) return opt_ranks_init(cfg, &r, build_random, &x, out);
    return build_random(&x, &r, 0, 0, out);
}

/* ------------------------------------------------------------------------------------ random state */
typedef struct state_args {
    int position;
    uint64_t seed;
} state_args;
static int random_state_one(dsv4_opt *o, void *arg);

extern "C" int dsv4_opt_random_state(dsv4_opt *o, int position, uint64_t seed)
{
    DSV4_CHECK(o, "dsv4_opt_random_state: NULL argument");
    DSV4_CHECK(position >= 0 && position < o->opt.max_context, "dsv4_opt_random_state: position %d outside [0, %d)",
               position, o->opt.max_context);
    state_args a = {position, seed};
    /* every rank draws the same state from the same seed: the replicated caches agree */
    if (o->group) return opt_ranks_each(o->group, random_state_one, &a);
    return random_state_one(o, &a);
}

static int random_state_one(dsv4_opt *o, void *arg)
{
    const int position = ((const state_args *)arg)->position;
    const uint64_t seed = ((const state_args *)arg)->seed;
    const float amp = sqrtf(3.0f); /* U[-√3, √3): RMS 1, like a normed row */
    const size_t d = o->d, dI = o->dI, W = o->W;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) {
        const opt_layer *ly = &o->layers[L];
        size_t n_ent = ly->ratio > 0 ? (size_t)(position / ly->ratio) : 0;
        if (n_ent > (size_t)ly->pool_cap) n_ent = (size_t)ly->pool_cap;
        for (int c = 0; c < o->C; c++) {
            uint64_t sid = stream_seed(seed, ((uint64_t)L << 32) | ((uint64_t)c << 1));
            if (ly->kv8) { /* --kv fp8: the same distribution, stored as the fp8 cache stores it */
                const int sexp = (int)ceilf(log2f(amp / 448.0f));
                rnd_kv8_kernel<<<1056, 256, 0, (cudaStream_t)o->stream>>>(ly->kv8 + (size_t)c * ly->kv_seq_stride,
                                                                          W + n_ent, (int)d, 2 * o->np, sid, amp, sexp);
                DSV4_TRY(launch_check("rnd_kv8_kernel"));
            } else {
                uint16_t *kv = ly->kvc + (size_t)c * ly->kv_seq_stride;
                DSV4_TRY(dsv4_opt_random_bf16(kv, (W + n_ent) * d, sid, 0.0f, amp, o->stream));
            }
            if (ly->attn == DSV4_ATTN_CSA && n_ent > 0)
                DSV4_TRY(dsv4_opt_random_bf16(ly->ipool + (size_t)c * ly->pool_cap * dI, n_ent * dI, sid + 1,
                                                  0.0f, amp, o->stream));
        }
    }
    DSV4_TRY(opt_state_reset(o, -1));
    for (int c = 0; c < o->C; c++) o->pos[c] = position;
    return 0;
}
