/* opt_model.c - the optimized path's object (dsv4_opt.h) built from a model folder: options and switch names, the
 * loader's weight source (bf16 through the shared loader; fp32 for mHC parameters, norms, sinks, router bias,
 * compressor position bias), init/free/reset, cuBLAS GEMMs. The arenas' layout and the init sequence are
 * opt_layout.c's, shared with the random-weights constructor (opt_random.cu).
 *
 * Invariants that fail quietly:
 * - The loader fills only the file tensors (bf16_part, f32, tid2eid); a fused view's parts cover it exactly, so
 *   no byte of the weights arena is left unwritten.
 * - tid2eid is checked on upload: an id outside [0, E) would index past the experts.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
    DSV4_OPT_TRY(stage(u, numel * 4));
    DSV4_OPT_TRY(read_locked(u->m, name, u->host, numel, 4));
    DSV4_OPT_CUDA(cudaMemcpy(dst, u->host, numel * 4, cudaMemcpyHostToDevice));
    return 0;
}

static int load_bf16_view(opt_weight_src *s, const dsv4_opt *o, uint16_t *dst, size_t numel, opt_wkind kind,
                          size_t fan_in)
{
    (void)s, (void)o, (void)dst, (void)numel, (void)kind, (void)fan_in;
    return 0; /* the parts fill it */
}

static int load_bf16_part(opt_weight_src *s, const dsv4_opt *o, uint16_t *dst, size_t numel, const char *name)
{
    loader_src *u = (loader_src *)s;
    (void)o;
    DSV4_OPT_TRY(stage(u, numel * 2));
    DSV4_OPT_TRY(read_locked(u->m, name, u->host, numel, 2));
    DSV4_OPT_CUDA(cudaMemcpy(dst, u->host, numel * 2, cudaMemcpyHostToDevice));
    return 0;
}

static int load_tid2eid(opt_weight_src *s, const dsv4_opt *o, int32_t *dst, const char *name)
{
    loader_src *u = (loader_src *)s;
    const size_t n = (size_t)o->V * o->K;
    DSV4_OPT_TRY(stage(u, n * 4));
    int32_t *t = u->host;
    pthread_mutex_lock(&load_lock);
    int rc = dsv4_model_read_i32(u->m, name, t, n);
    pthread_mutex_unlock(&load_lock);
    DSV4_OPT_TRY(rc);
    for (size_t i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= o->E)
            return dsv4_error(DSV4_ERR_FORMAT, "%s: token %zu maps to expert %d, outside [0, %d)", name, i / o->K,
                              t[i], o->E);
    DSV4_OPT_CUDA(cudaMemcpy(dst, t, n * 4, cudaMemcpyHostToDevice));
    return 0;
}

/* The block of a split tensor: the whole tensor is read (the shared loader reads tensors whole), the block
 * uploaded with one strided copy. */
static int load_slice(opt_weight_src *s, const dsv4_opt *o, void *dst, int esz, const char *name, size_t rows,
                      size_t cols, size_t r0, size_t nr, size_t c0, size_t nc)
{
    loader_src *u = (loader_src *)s;
    (void)o;
    if (r0 + nr > rows || c0 + nc > cols)
        return dsv4_error(DSV4_ERR_USAGE, "%s: block [%zu, +%zu) x [%zu, +%zu) outside [%zu, %zu]", name, r0, nr,
                          c0, nc, rows, cols);
    DSV4_OPT_TRY(stage(u, rows * cols * (size_t)esz));
    DSV4_OPT_TRY(read_locked(u->m, name, u->host, rows * cols, esz));
    const char *src = (const char *)u->host + (r0 * cols + c0) * (size_t)esz;
    DSV4_OPT_CUDA(cudaMemcpy2D(dst, nc * (size_t)esz, src, cols * (size_t)esz, nc * (size_t)esz, nr,
                               cudaMemcpyHostToDevice));
    return 0;
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
    o->rank = rank, o->n_ranks = n_ranks;
    loader_src u = {.base = {.what = "optimized",
                             .f32 = load_f32,
                             .bf16_view = load_bf16_view,
                             .bf16_part = load_bf16_part,
                             .tid2eid = load_tid2eid,
                             .slice = load_slice},
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
    DSV4_OPT_TRY(opt_check_config(dsv4_model_config(m), op));
    if (op->n_gpus > 0) return opt_ranks_init(dsv4_model_config(m), op, build_from_model, m, out);
    return build_from_model(m, op, 0, 0, out);
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

static int reset_one(dsv4_opt *o, void *arg)
{
    const int seq = *(const int *)arg;
    o->pos[seq] = 0;
    return opt_state_reset(o, seq);
}

int dsv4_opt_reset(dsv4_opt *o, int seq)
{
    DSV4_CHECK(o && seq >= 0 && seq < o->C, "dsv4_opt_reset: sequence %d outside [0, %d)", seq, o ? o->C : 0);
    if (o->group) return opt_ranks_each(o->group, reset_one, &seq);
    return reset_one(o, &seq);
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
