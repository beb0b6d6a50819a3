/* opt_model.c - the optimized path's object (dsv4_opt.h) built from a model folder (its options and switch names:
 * opt_options.c): the loader's weight source (bf16 through the shared loader; fp32 for mHC parameters, norms, sinks, router bias,
 * compressor position bias; in fp8 mode the FP8 linears and FP4 experts as on disk, or quantised at load by
 * model/quant.c with --quantize fp8), init/free/reset, the linear dispatch (cuBLAS bf16 or the FP8 kernel).
 * The arenas' layout and the init sequence are opt_layout.c's, shared with the random-weights constructor
 * (opt_random.cu).
 *
 * Invariants that fail quietly:
 * - The loader fills only the file tensors (bf16_part, f32, tid2eid); a fused view's parts cover it exactly, so
 *   no byte of the weights arena is left unwritten.
 * - tid2eid's ids are in [0, E) when they reach the GPU: the shared loader (dsv4_model_read_i32) refuses any
 *   other, which would index past the experts.
 * - The quantised sets are model-spec §2's: a name ending in one of quant_set's FP8 suffixes, or a routed expert.
 *   bf16 mode with --quantize dequantises the quantiser's codes (not the file's values), so both modes multiply
 *   the same weights; a tensor already FP8/FP4 on disk is never requantised.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "opt_internal.h"

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

/* ------------------------------------------------------------------------------------ the loader's source */
/* With --gpus N the ranks' threads load at once; the model's readers are not promised to be thread-safe. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int read_locked(const dsv4_model *m, const char *name, void *dst, size_t numel, int esz)
{
    pthread_mutex_lock(&load_lock);
    int rc = esz == 4 ? dsv4_model_read_f32(m, name, dst, numel) : dsv4_model_read_bf16(m, name, dst, numel);
    pthread_mutex_unlock(&load_lock);
    return rc;
}

typedef struct loader_src {
    opt_weight_src base;
    dsv4_model *m;
    void *host;      /* staging */
    size_t host_bytes;
} loader_src;

static int stage(loader_src *u, size_t bytes)
{
    if (bytes <= u->host_bytes) return 0;
    void *h = realloc(u->host, bytes);
    if (!h) return dsv4_error(DSV4_ERR_NOMEM, "optimized: cannot allocate %zu bytes of host staging", bytes);
    u->host = h;
    u->host_bytes = bytes;
    return 0;
}

static int load_f32(opt_weight_src *s, const dsv4_opt *o, float *dst, size_t numel, opt_wkind kind, size_t fan_in,
                    const char *name)
{
    loader_src *u = (loader_src *)s;
    (void)o, (void)kind, (void)fan_in;
    DSV4_TRY(stage(u, numel * 4));
    DSV4_TRY(read_locked(u->m, name, u->host, numel, 4));
    DSV4_OPT_CUDA(cudaMemcpy(dst, u->host, numel * 4, cudaMemcpyHostToDevice));
    return 0;
}

static int load_bf16_view(opt_weight_src *s, const dsv4_opt *o, uint16_t *dst, size_t numel, opt_wkind kind,
                          size_t fan_in)
{
    (void)s, (void)o, (void)dst, (void)numel, (void)kind, (void)fan_in;
    return 0; /* the parts fill it */
}

/* Which set a file tensor belongs to: 8 = the checkpoint's FP8 linears, 4 = the FP4 routed experts, 0 = neither
 * (model-spec §2). */
static int quant_set(const char *name)
{
    static const char *const fp8[] = {".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight",
                                      ".attn.wo_a.weight", ".attn.wo_b.weight", ".attn.indexer.wq_b.weight",
                                      ".ffn.shared_experts.w1.weight", ".ffn.shared_experts.w2.weight",
                                      ".ffn.shared_experts.w3.weight"};
    if (strstr(name, ".ffn.experts.")) return 4;
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof fp8 / sizeof *fp8; i++) {
        const size_t k = strlen(fp8[i]);
        if (n > k && !strcmp(name + n - k, fp8[i])) return 8;
    }
    return 0;
}

static int is_fp4(const dsv4_tensor *t) { return (t->dtype == DSV4_DTYPE_I8 || t->dtype == DSV4_DTYPE_U8) && t->scale; }

/* --quantize fp8: file tensor `name` [rows, cols] read as f32 and quantised into host buffers q / scale (sizes of
 * dsv4_quant_fp8_block or dsv4_quant_fp4 by `set`); u->host holds the f32 copy. */
static int quantise_host(loader_src *u, const char *name, int set, int rows, int cols, uint8_t **q, uint8_t **scale)
{
    const size_t n = (size_t)rows * cols, nq = set == 8 ? n : n / 2;
    const size_t ns = set == 8 ? (size_t)((rows + 127) / 128) * ((cols + 127) / 128)
                               : (size_t)rows * ((cols + 31) / 32);
    DSV4_TRY(stage(u, n * 4 + nq + ns));
    float *w = u->host;
    *q = (uint8_t *)(w + n);
    *scale = *q + nq;
    DSV4_TRY(read_locked(u->m, name, w, n, 4)); /* the ranks' threads quantise at once too */
    return set == 8 ? dsv4_quant_fp8_block(w, rows, cols, *q, *scale, name)
                    : dsv4_quant_fp4(w, rows, cols, *q, *scale, name);
}

/* File tensor `name` of numel elements as bf16 in host staging (*out = u->host): read by the shared loader, or in
 * bf16 mode with --quantize the quantised values, dequantised (the weights fp8 mode multiplies). */
static int host_bf16(loader_src *u, const dsv4_opt *o, const char *name, size_t numel, uint16_t **out)
{
    const dsv4_tensor *t;
    const int set = o->opt.quantize == DSV4_OPT_QUANTIZE_FP8 ? quant_set(name) : 0;
    if (set && !dsv4_model_tensor(u->m, name, &t) && t->ndim == 2 &&
        !(set == 8 ? t->dtype == DSV4_DTYPE_F8_E4M3 : is_fp4(t))) {
        int64_t sh[2] = {t->shape[0], t->shape[1]};
        if ((size_t)(sh[0] * sh[1]) != numel)
            return dsv4_error(DSV4_ERR_SHAPE, "%s: %lld x %lld elements, the layout wants %zu", name,
                              (long long)sh[0], (long long)sh[1], numel);
        uint8_t *q, *sc;
        DSV4_TRY(quantise_host(u, name, set, (int)sh[0], (int)sh[1], &q, &sc));
        uint16_t *b = (uint16_t *)u->host; /* over the f32 copy, no longer needed; q and sc lie behind it */
        for (size_t i = 0; i < numel; i++) {
            const size_t r = i / (size_t)sh[1], c = i % (size_t)sh[1];
            const size_t si = set == 8 ? (r / 128) * (size_t)((sh[1] + 127) / 128) + c / 128
                                       : r * (size_t)((sh[1] + 31) / 32) + c / 32;
            const float code =
                set == 8 ? dsv4_e4m3_to_f32(q[i]) : dsv4_e2m1_to_f32((q[i / 2] >> (i % 2 ? 4 : 0)) & 0xf);
            b[i] = dsv4_f32_to_bf16(code * dsv4_e8m0_to_f32(sc[si]));
        }
        *out = b;
        return 0;
    }
    DSV4_TRY(stage(u, numel * 2));
    DSV4_TRY(read_locked(u->m, name, u->host, numel, 2));
    *out = u->host;
    return 0;
}

static int load_bf16_part(opt_weight_src *s, const dsv4_opt *o, uint16_t *dst, size_t numel, const char *name)
{
    uint16_t *b;
    DSV4_TRY(host_bf16((loader_src *)s, o, name, numel, &b));
    DSV4_OPT_CUDA(cudaMemcpy(dst, b, numel * 2, cudaMemcpyHostToDevice));
    return 0;
}

static dsv4_qscale load_qscale(opt_weight_src *s, const dsv4_opt *o, const char *name)
{
    loader_src *u = (loader_src *)s;
    const dsv4_tensor *t;
    (void)o;
    if (!dsv4_model_tensor(u->m, name, &t) && t->dtype == DSV4_DTYPE_F8_E4M3 && t->scale &&
        t->scale->dtype == DSV4_DTYPE_F32)
        return DSV4_QSCALE_F32;
    return DSV4_QSCALE_E8M0; /* also what the quantiser writes */
}

/* The quantised tensor as on disk (shape-checked), or NULL when it must be quantised; an error when it is
 * neither in the format nor allowed to be quantised. */
static int disk_quant(loader_src *u, const dsv4_opt *o, const char *name, int set, int rows, int cols,
                      const dsv4_tensor **out)
{
    const dsv4_tensor *t;
    *out = NULL;
    DSV4_TRY(dsv4_model_tensor(u->m, name, &t));
    const int in_format = set == 8 ? t->dtype == DSV4_DTYPE_F8_E4M3 : is_fp4(t);
    if (!in_format) {
        if (o->opt.quantize == DSV4_OPT_QUANTIZE_FP8) return 0;
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "%s: %s is %s on disk; --weights fp8 holds it as %s (give "
                          "--quantize fp8 to quantise it at load, or --weights bf16)", t->file, name,
                          dsv4_dtype_name(t->dtype), set == 8 ? "F8_E4M3 with 128x128 scales" : "FP4 e2m1");
    }
    const int64_t want1 = set == 8 ? cols : cols / 2;
    const int64_t s0 = set == 8 ? (rows + 127) / 128 : rows, s1 = set == 8 ? (cols + 127) / 128 : cols / 32;
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != want1 || !t->scale || t->scale->ndim != 2 ||
        t->scale->shape[0] != s0 || t->scale->shape[1] != s1)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: %s (or its .scale) does not have the shape [%d, %lld] / scale "
                          "[%lld, %lld] the config implies", t->file, name, rows, (long long)want1, (long long)s0,
                          (long long)s1);
    *out = t;
    return 0;
}

/* Copies the block [r0, +nr) x [c0, +nc) of a host matrix [., cols] of esz-byte elements to dst [nr, nc]. */
static int upload_block(void *dst, const void *src, size_t esz, size_t cols, size_t r0, size_t nr, size_t c0,
                        size_t nc)
{
    DSV4_OPT_CUDA(cudaMemcpy2D(dst, nc * esz, (const char *)src + (r0 * cols + c0) * esz, cols * esz, nc * esz, nr,
                               cudaMemcpyHostToDevice));
    return 0;
}

/* The block of FP8 linear `name` [rows, cols] (the whole tensor, or a rank's slice on 128x128 scale blocks): its
 * codes and the matching block scales, from disk or quantised at load (the whole tensor: the same codes). */
static int load_fp8(opt_weight_src *s, const dsv4_opt *o, uint8_t *q, void *scale, dsv4_qscale kind, int rows,
                    int cols, int r0, int nr, int c0, int nc, size_t fan_in, const char *name)
{
    loader_src *u = (loader_src *)s;
    const dsv4_tensor *t;
    (void)fan_in;
    const int sliced = nr != rows || nc != cols;
    if (r0 < 0 || c0 < 0 || r0 + nr > rows || c0 + nc > cols || (sliced && (r0 % 128 || c0 % 128)))
        return dsv4_error(DSV4_ERR_USAGE, "%s: block [%d, +%d) x [%d, +%d) of [%d, %d] is not on its scale blocks",
                          name, r0, nr, c0, nc, rows, cols);
    const size_t scols = (size_t)(cols + 127) / 128, sr0 = (size_t)r0 / 128, snr = (size_t)(nr + 127) / 128;
    const size_t sc0 = (size_t)c0 / 128, snc = (size_t)(nc + 127) / 128;
    DSV4_TRY(disk_quant(u, o, name, 8, rows, cols, &t));
    if (t) { /* as on disk: the codes and the scale encoding qscale chose from this tensor */
        DSV4_TRY(upload_block(q, t->data, 1, (size_t)cols, (size_t)r0, (size_t)nr, (size_t)c0, (size_t)nc));
        const size_t sb = kind == DSV4_QSCALE_F32 ? 4 : 1;
        return upload_block(scale, t->scale->data, sb, scols, sr0, snr, sc0, snc);
    }
    uint8_t *hq, *hs;
    DSV4_TRY(quantise_host(u, name, 8, rows, cols, &hq, &hs));
    DSV4_CHECK(kind == DSV4_QSCALE_E8M0, "%s: quantised at load, but the layout chose f32 scales", name);
    DSV4_TRY(upload_block(q, hq, 1, (size_t)cols, (size_t)r0, (size_t)nr, (size_t)c0, (size_t)nc));
    return upload_block(scale, hs, 1, scols, sr0, snr, sc0, snc);
}

static int load_fp4(opt_weight_src *s, const dsv4_opt *o, uint8_t *q, uint8_t *scale, int rows, int cols,
                    size_t fan_in, const char *name)
{
    loader_src *u = (loader_src *)s;
    const dsv4_tensor *t;
    (void)fan_in;
    const size_t nq = (size_t)rows * cols / 2, ns = (size_t)rows * cols / 32;
    DSV4_TRY(disk_quant(u, o, name, 4, rows, cols, &t));
    if (!t) {
        uint8_t *hq, *hs;
        DSV4_TRY(quantise_host(u, name, 4, rows, cols, &hq, &hs));
        DSV4_OPT_CUDA(cudaMemcpy(q, hq, nq, cudaMemcpyHostToDevice));
        DSV4_OPT_CUDA(cudaMemcpy(scale, hs, ns, cudaMemcpyHostToDevice));
        return 0;
    }
    DSV4_OPT_CUDA(cudaMemcpy(q, t->data, nq, cudaMemcpyHostToDevice));
    if (t->scale->dtype == DSV4_DTYPE_F8_E8M0) {
        DSV4_OPT_CUDA(cudaMemcpy(scale, t->scale->data, ns, cudaMemcpyHostToDevice));
        return 0;
    }
    /* f32 scales: the kernels take e8m0, exact only for powers of two */
    DSV4_TRY(stage(u, ns));
    uint8_t *hs = u->host;
    for (size_t i = 0; i < ns; i++) {
        float v;
        int e;
        memcpy(&v, (const uint8_t *)t->scale->data + 4 * i, 4);
        if (!(v > 0) || frexpf(v, &e) != 0.5f || e - 1 < -127 || e - 1 > 127)
            return dsv4_error(DSV4_ERR_UNSUPPORTED, "%s: scale %zu of %s is %g, not a power of two (the FP4 "
                              "kernels take e8m0 scales)", t->file, i, name, (double)v);
        hs[i] = (uint8_t)(e - 1 + 127);
    }
    DSV4_OPT_CUDA(cudaMemcpy(scale, hs, ns, cudaMemcpyHostToDevice));
    return 0;
}

static int load_tid2eid(opt_weight_src *s, const dsv4_opt *o, int32_t *dst, const char *name)
{
    loader_src *u = (loader_src *)s;
    const size_t n = (size_t)o->V * o->K;
    DSV4_TRY(stage(u, n * 4));
    int32_t *t = u->host;
    pthread_mutex_lock(&load_lock);
    int rc = dsv4_model_read_i32(u->m, name, t, n);
    pthread_mutex_unlock(&load_lock);
    DSV4_TRY(rc);
    DSV4_OPT_CUDA(cudaMemcpy(dst, t, n * 4, cudaMemcpyHostToDevice));
    return 0;
}

/* The block of a split tensor: the whole tensor is read (the shared loader reads tensors whole), the block
 * uploaded with one strided copy. */
static int load_slice(opt_weight_src *s, const dsv4_opt *o, void *dst, int esz, const char *name, size_t rows,
                      size_t cols, size_t r0, size_t nr, size_t c0, size_t nc)
{
    loader_src *u = (loader_src *)s;
    if (r0 + nr > rows || c0 + nc > cols)
        return dsv4_error(DSV4_ERR_USAGE, "%s: block [%zu, +%zu) x [%zu, +%zu) outside [%zu, %zu]", name, r0, nr,
                          c0, nc, rows, cols);
    void *h = NULL;
    if (esz == 2) { /* with --quantize fp8 in bf16 mode: the dequantised codes of the whole tensor */
        uint16_t *b;
        DSV4_TRY(host_bf16(u, o, name, rows * cols, &b));
        h = b;
    } else {
        DSV4_TRY(stage(u, rows * cols * 4));
        DSV4_TRY(read_locked(u->m, name, u->host, rows * cols, 4));
        h = u->host;
    }
    return upload_block(dst, h, (size_t)esz, cols, r0, nr, c0, nc);
}

/* ------------------------------------------------------------------------------------ init / free */
static int build_from_model(void *ctx, const dsv4_opt_options *op, int rank, int n_ranks, dsv4_opt **out)
{
    dsv4_model *m = ctx;
    *out = NULL;
    dsv4_opt *o = calloc(1, sizeof *o);
    if (!o) return dsv4_error(DSV4_ERR_NOMEM, "optimized: out of host memory");
    o->opt = *op;
    o->cfg = *dsv4_model_config(m);
    o->rank = rank, o->n_ranks = n_ranks; /* op->weights was resolved by dsv4_opt_init */
    loader_src u = {.base = {.what = "optimized",
                             .f32 = load_f32,
                             .bf16_view = load_bf16_view,
                             .bf16_part = load_bf16_part,
                             .tid2eid = load_tid2eid,
                             .slice = load_slice,
                             .qscale = load_qscale,
                             .fp8 = load_fp8,
                             .fp4 = load_fp4},
                    .m = m};
    int rc = opt_init_common(o, &u.base);
    free(u.host);
    if (rc) {
        opt_free_one(o);
        return rc;
    }
    *out = o;
    return 0;
}

int dsv4_opt_init(dsv4_model *m, const dsv4_opt_options *op, dsv4_opt **out)
{
    DSV4_CHECK(m && op && out, "dsv4_opt_init: NULL argument");
    *out = NULL;
    dsv4_opt_options r = *op;
    if (r.weights == DSV4_OPT_WEIGHTS_AUTO) { /* the checkpoint's own format */
        const dsv4_tensor *t;
        int q8 = r.quantize == DSV4_OPT_QUANTIZE_FP8;
        if (!q8 && !dsv4_model_tensor(m, "layers.0.attn.wq_a.weight", &t)) q8 = t->dtype == DSV4_DTYPE_F8_E4M3;
        if (!q8 && !dsv4_model_tensor(m, "layers.0.ffn.experts.0.w1.weight", &t)) q8 = is_fp4(t);
        r.weights = q8 ? DSV4_OPT_WEIGHTS_FP8 : DSV4_OPT_WEIGHTS_BF16;
    }
    /* resolved before the ranks exist: with --gpus N --weights fp8 the scale-block split is checked here */
    DSV4_TRY(opt_check_config(dsv4_model_config(m), &r));
    if (r.n_gpus > 0) return opt_ranks_init(dsv4_model_config(m), &r, build_from_model, m, out);
    return build_from_model(m, &r, 0, 0, out);
}

void dsv4_opt_free(dsv4_opt *o)
{
    if (o && o->group) opt_ranks_free(o->group); /* every rank, this one included */
    else opt_free_one(o);
}

void opt_free_one(dsv4_opt *o)
{
    if (!o) return;
    if (o->stream) cudaStreamSynchronize(o->stream);
    if (o->prof_ev) dsv4_opt_stage_timing(o, 0);
    for (int i = 0; i < o->n_graphs; i++) cudaGraphExecDestroy(o->graphs[i].exec);
    if (o->cublas) cublasDestroy(o->cublas);
    /* the expert lanes 1..n-1 (lane 0 is stream and cublas); a failed step may have left work on them */
    for (int i = 1; i < DSV4_MOE_MAX_LANES; i++) {
        if (o->lanes.stream[i]) cudaStreamSynchronize(o->lanes.stream[i]);
        if (o->lanes.cublas[i]) cublasDestroy(o->lanes.cublas[i]);
        if (o->lanes.join[i]) cudaEventDestroy(o->lanes.join[i]);
        if (o->lanes.stream[i]) cudaStreamDestroy(o->lanes.stream[i]);
    }
    if (o->lanes.fork) cudaEventDestroy(o->lanes.fork);
    if (o->stream) cudaStreamDestroy(o->stream);
    cudaFree(o->w_mem);
    cudaFree(o->s_mem);
    cudaFree(o->x_mem);
    cudaFreeHost(o->h_probe);
    cudaFreeHost(o->h_in);
    cudaFreeHost(o->h_follow);
    cudaFreeHost(o->h_ms_offset);
    free(o->layers);
    free(o->pos);
    free(o->row0);
    free(o->nrun);
    free(o->step_n);
    free(o->step_tok);
    free(o);
}

int dsv4_opt_position(const dsv4_opt *o, int seq) { return o && seq >= 0 && seq < o->C ? o->pos[seq] : 0; }
int dsv4_opt_step_budget(const dsv4_opt *o) { return o ? o->Tm : 0; }

static int reset_one(dsv4_opt *o, void *arg)
{
    const int seq = *(const int *)arg;
    o->pos[seq] = 0;
    if (seq == o->opt.dump_seq) o->follow_stop = -1; /* a fresh start follows from position 0 again */
    return opt_state_reset(o, seq);
}

int dsv4_opt_reset(dsv4_opt *o, int seq)
{
    DSV4_CHECK(o && seq >= 0 && seq < o->C, "dsv4_opt_reset: sequence %d outside [0, %d)", seq, o ? o->C : 0);
    if (o->group) return opt_ranks_each(o->group, reset_one, &seq);
    return reset_one(o, &seq);
}

int dsv4_opt_follow_stats_get(dsv4_opt *o, dsv4_opt_follow_stats *s)
{
    DSV4_CHECK(o && s, "dsv4_opt_follow_stats_get: NULL argument");
    memset(s, 0, sizeof *s);
    s->stopped_at = o->follow_stop;
    if (!o->follow) return 0;
    if (o->group) { /* every rank followed the same rows: rank 0's (this object's) counts stand for all */
        DSV4_TRY(opt_ranks_usable(o->group));
        DSV4_OPT_CUDA(cudaSetDevice(o->opt.device));
    }
    int32_t changed[2];
    DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
    DSV4_OPT_CUDA(cudaMemcpy(changed, o->d_follow_changed, sizeof changed, cudaMemcpyDeviceToHost));
    s->topk_rows = o->follow_rows[0];
    s->router_rows = o->follow_rows[1];
    s->topk_changed = changed[0];
    s->router_changed = changed[1];
    return 0;
}

const char *dsv4_opt_producer(const dsv4_opt *o) { return o ? o->producer : "dsv4 optimized"; }

void dsv4_opt_memory(const dsv4_opt *o, size_t *weights, size_t *state, size_t *scratch)
{
    if (weights) *weights = o ? o->w_bytes : 0;
    if (state) *state = o ? o->s_bytes : 0;
    if (scratch) *scratch = o ? o->x_bytes : 0;
}

dsv4_opt_weights dsv4_opt_weights_mode(const dsv4_opt *o) { return o ? o->opt.weights : DSV4_OPT_WEIGHTS_AUTO; }

size_t dsv4_opt_layer_weight_bytes(const dsv4_opt *o, int layer)
{
    if (!o || layer < -1 || layer >= o->cfg.num_hidden_layers) return 0;
    if (layer >= 0) return o->layers[layer].w_bytes;
    size_t rest = o->w_bytes;
    for (int L = 0; L < o->cfg.num_hidden_layers; L++) rest -= o->layers[L].w_bytes;
    return rest;
}

double opt_linear_bytes(const opt_linear *w)
{
    const double n = (double)w->n_out * w->n_in;
    if (w->bf16) return 2 * n;
    return n + (double)((w->n_out + 127) / 128) * ((w->n_in + 127) / 128) * (w->scale_kind == DSV4_QSCALE_F32 ? 4 : 1);
}

/* An FP8 linear over a long run (a step with runs, >= OPT_SORTED_MIN_ROWS rows) as one cuBLAS GEMM over its
 * matrix dequantised into wdq: the FP8 kernel re-reads its weights once per 64 tokens (it is shaped for decode),
 * the expansion costs one pass over the matrix. Only with e8m0 scales, where the bf16 values are exact (the same
 * products as the kernel's, other fp32 summation order); decode steps never take it. */
static const uint16_t *linear_dequant(dsv4_opt *o, const opt_linear *w, int S, int *rc)
{
    *rc = 0;
    if (!o->runs || !o->wdq || S < OPT_SORTED_MIN_ROWS || o->opt.prefill_linears != DSV4_OPT_PREFILL_LINEARS_GEMM ||
        w->scale_kind != DSV4_QSCALE_E8M0 || w->n_in % 16 || (uintptr_t)w->fp8 % 16 ||
        (size_t)w->n_out * w->n_in > o->wdq_elems)
        return NULL;
    *rc = dsv4_opt_fp8_dequant(w->fp8, w->scale, w->scale_kind, w->n_out, w->n_in, o->wdq, o->stream);
    return *rc ? NULL : o->wdq;
}

int opt_linear_apply(dsv4_opt *o, const opt_linear *w, void *y, int y_f32, int ldy, const uint16_t *x, int ldx,
                     int S)
{
    if (w->n_out == 0) return 0;
    if (w->bf16) return opt_gemm(o, y, y_f32, ldy, x, ldx, w->bf16, w->n_out, w->n_in, S);
    int rc = 0;
    const uint16_t *wd = linear_dequant(o, w, S, &rc);
    DSV4_TRY(rc);
    if (wd) return opt_gemm(o, y, y_f32, ldy, x, ldx, wd, w->n_out, w->n_in, S);
    dsv4_fp8_linear_params p = {.n_tok = S, .n_out = w->n_out, .n_in = w->n_in, .x = x, .ldx = ldx, .w = w->fp8,
                                .scale = w->scale, .scale_kind = w->scale_kind, .y = y, .y_f32 = y_f32, .ldy = ldy,
                                .workspace = o->ws, .workspace_bytes = o->ws_bytes, .stream = o->stream};
    return dsv4_opt_fp8_linear(&p);
}

int opt_proj_apply(dsv4_opt *o, const opt_proj *p, float *y, int ldy, const uint16_t *x, int ldx, int S)
{
    for (int i = 0; i < p->n; i++) DSV4_TRY(opt_linear_apply(o, &p->lin[i], y + p->off[i], 1, ldy, x, ldx, S));
    return 0;
}

int opt_linear_apply_grouped(dsv4_opt *o, const opt_linear *w, int G, uint16_t *y, int ldy, const uint16_t *x,
                             int ldx, int S)
{
    const int rows = w->n_out / G, in = w->n_in;
    int rc = 0;
    const uint16_t *wb = w->bf16 ? w->bf16 : linear_dequant(o, w, S, &rc);
    if (!w->bf16) DSV4_TRY(rc);
    if (wb) {
        const float one = 1.0f, zero = 0.0f;
        DSV4_OPT_CUBLAS(cublasGemmStridedBatchedEx(o->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, S, in, &one, wb,
                                                   CUDA_R_16BF, in, (long long)rows * in, x, CUDA_R_16BF, ldx, in,
                                                   &zero, y, CUDA_R_16BF, ldy, rows, G, CUBLAS_COMPUTE_32F,
                                                   CUBLAS_GEMM_DEFAULT));
        return 0;
    }
    if (rows % 64 == 0) { /* one launch for the G groups (Flash: 8 x 1024 rows); the scale grid is the whole one's */
        dsv4_fp8_linear_params p = {.n_tok = S, .n_out = w->n_out, .n_in = in, .group_rows = rows, .x = x,
                                    .ldx = ldx, .w = w->fp8, .scale = w->scale, .scale_kind = w->scale_kind, .y = y,
                                    .y_f32 = 0, .ldy = ldy, .workspace = o->ws, .workspace_bytes = o->ws_bytes,
                                    .stream = o->stream};
        return dsv4_opt_fp8_linear(&p);
    }
    /* small groups (tiny: 16 rows) share a 64-row block: one launch per group */
    const size_t sc = (size_t)(in + 127) / 128, sb = w->scale_kind == DSV4_QSCALE_F32 ? 4 : 1;
    for (int g = 0; g < G; g++) { /* the layout checked that group g's scale rows are its own slice */
        opt_linear sub = *w;
        sub.n_out = rows;
        sub.fp8 = w->fp8 + (size_t)g * rows * in;
        sub.scale = (char *)w->scale + (size_t)(g * rows / 128) * sc * sb;
        DSV4_TRY(opt_linear_apply(o, &sub, y + (size_t)g * rows, 0, ldy, x + (size_t)g * in, ldx, S));
    }
    return 0;
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
