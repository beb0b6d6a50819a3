/* ref_gpu_stream.cu - the GPU reference's weights when they stream (issue 36; docs/reference.md "ref-gpu streams
 * layers"), and the resident mode's trivial answers to the same questions (ref_gpu_model.cuh "ref_gpu_stream.cu").
 *
 * The checkpoint stays mapped in its own formats. The weights travel in parts (ref_gpu_layout.h): a layer's dense
 * tensors when the layer starts, a routed expert when a token of the call routes to it (the host knows the routing:
 * ref_gpu.cu copies the ids back per layer), the head in row ranges after the last layer. A part's bytes are copied
 * from the mapping into a pinned host buffer (the "fill": page cache or disk), then to the GPU on a copy stream, then
 * dequantised to f32 on the compute stream (the legacy default stream, where every other kernel runs) by the kernels
 * below, which give model/dtype.c's values bit for bit; the bf16 emulation then rounds the tensors it rounds (the same
 * rule and rounding as the resident upload). Two slots per kind (dense, expert): while one part is in use the next
 * is filled and copied, so the copy overlaps the compute; the dense parts of a call run in a fixed cycle (layers,
 * then head ranges), so the next one is always known, and the first layer of the next call is staged after the head.
 *
 * Invariants that fail quietly:
 * - A slot is refilled only after the host has waited for its previous copy (the pinned side is free) and its
 *   previous dequantisation (the device side is free); the compute stream waits for a part's copy by an event.
 * - One f32 arena for the dense parts and one f32 buffer for an expert: the dequantisation of the next part is
 *   ordered after the compute that reads the previous one by the compute stream itself.
 * - A layer's views (g->lw[L]) are valid while it is the loaded dense part; loading another part sets them to NULL.
 * - The dequantiser multiplies code by scale as the host does: IEEE round to nearest, no FMA, no flush to zero (nvcc
 *   without --use_fast_math), and a NaN operand kept with its own bits, quieted (the GPU's multiply would return its
 *   canonical NaN; x86's returns the NaN operand, the code's when both are). The code tables come from the host's
 *   own conversion functions.
 * - The decode step allocates nothing: the parts live in the slots' fixed arrays, every buffer is made at init.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ref_gpu_model.cuh"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------------ dequantiser */
__constant__ float dq_e4m3[256]; /* dsv4_e4m3_to_f32 of every code */
__constant__ float dq_e8m0[256]; /* dsv4_e8m0_to_f32 */
__constant__ float dq_e2m1[16];  /* dsv4_e2m1_to_f32 */
static int dq_ready;

extern "C" int dsv4_ref_gpu_dequant_init(void)
{
    if (dq_ready) return 0;
    float e4m3[256], e8m0[256], e2m1[16];
    for (int b = 0; b < 256; b++) {
        e4m3[b] = dsv4_e4m3_to_f32((uint8_t)b);
        e8m0[b] = dsv4_e8m0_to_f32((uint8_t)b);
    }
    for (int b = 0; b < 16; b++) e2m1[b] = dsv4_e2m1_to_f32((uint8_t)b);
    DSV4_REF_CUDA_CHECK(cudaMemcpyToSymbol(dq_e4m3, e4m3, sizeof e4m3));
    DSV4_REF_CUDA_CHECK(cudaMemcpyToSymbol(dq_e8m0, e8m0, sizeof e8m0));
    DSV4_REF_CUDA_CHECK(cudaMemcpyToSymbol(dq_e2m1, e2m1, sizeof e2m1));
    dq_ready = 1;
    return 0;
}

/* code × scale as model/dtype.c's loop computes it on the host (see the header). */
static __device__ __forceinline__ float dq_mul(float code, float s)
{
    if (isnan(code)) return __uint_as_float(__float_as_uint(code) | 0x00400000u);
    if (isnan(s)) return __uint_as_float(__float_as_uint(s) | 0x00400000u);
    return __fmul_rn(code, s);
}

static __device__ __forceinline__ float dq_scale(const uint8_t *scale, int scale_f32, const float *e8, size_t i)
{
    return scale_f32 ? ((const float *)scale)[i] : e8[scale[i]];
}

enum { DQ_THREADS = 256, DQ_MAX_BLOCKS = 8192 }; /* grid-stride loops past that */

static unsigned dq_blocks(size_t n)
{
    size_t b = (n + DQ_THREADS - 1) / DQ_THREADS;
    return (unsigned)(b < DQ_MAX_BLOCKS ? (b ? b : 1) : DQ_MAX_BLOCKS);
}

/* dst [nrows, cols] = e4m3(q) × the scale of its 128x128 block; the scale rows start at row0/128. */
__global__ static void dq_fp8_kernel(float *dst, const uint8_t *q, const uint8_t *scale, int scale_f32, int64_t nrows,
                                     int64_t cols, int64_t row0, int64_t scale_cols)
{
    __shared__ float code[256], e8[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        code[i] = dq_e4m3[i];
        e8[i] = dq_e8m0[i];
    }
    __syncthreads();
    const size_t n = (size_t)nrows * (size_t)cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int64_t r = (int64_t)(i / (size_t)cols), c = (int64_t)(i % (size_t)cols);
        const size_t si = (size_t)((row0 + r) / 128 - row0 / 128) * (size_t)scale_cols + (size_t)(c / 128);
        dst[i] = dq_mul(code[q[i]], dq_scale(scale, scale_f32, e8, si));
    }
}

/* dst [nrows, 2·packed]: byte j of a row holds columns 2j (low nibble) and 2j+1 (high), scale [nrows, scale_cols]
 * per 32 columns (16 bytes). */
__global__ static void dq_fp4_kernel(float *dst, const uint8_t *q, const uint8_t *scale, int scale_f32, int64_t nrows,
                                     int64_t packed, int64_t scale_cols)
{
    __shared__ float code[16], e8[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        if (i < 16) code[i] = dq_e2m1[i];
        e8[i] = dq_e8m0[i];
    }
    __syncthreads();
    const size_t n = (size_t)nrows * (size_t)packed;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)packed, j = i % (size_t)packed;
        const uint8_t b = q[i];
        const float s = dq_scale(scale, scale_f32, e8, r * (size_t)scale_cols + j / 16);
        float *d = dst + r * 2 * (size_t)packed + 2 * j;
        d[0] = dq_mul(code[b & 15], s);
        d[1] = dq_mul(code[b >> 4], s);
    }
}

/* bf16: the 16 bits become the high half of the f32 (dsv4_bf16_to_f32). */
__global__ static void dq_bf16_kernel(float *dst, const uint16_t *q, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __uint_as_float((uint32_t)q[i] << 16);
}

/* f32 (on disk, or dequantised on the host): copied as bits. */
__global__ static void dq_copy_kernel(uint32_t *dst, const uint32_t *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

extern "C" int dsv4_ref_gpu_part_dequant(const dsv4_ref_part *part, const uint8_t *dev, float *dst, int emu)
{
    if (!dq_ready) return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: dsv4_ref_gpu_dequant_init not called");
    for (int i = 0; i < part->n; i++) {
        const dsv4_ref_piece *p = &part->p[i];
        const size_t n = (size_t)p->nrows * (size_t)p->cols;
        const uint8_t *data = dev + p->data_at, *scale = dev + p->scale_at;
        float *out = dst + p->dst_at;
        if (n == 0) continue;
        switch (p->fmt) {
        case DSV4_REF_WFMT_FP8:
            dq_fp8_kernel<<<dq_blocks(n), DQ_THREADS>>>(out, data, scale, p->scale_f32, p->nrows, p->cols, p->row0,
                                                        p->scale_cols);
            break;
        case DSV4_REF_WFMT_FP4:
            dq_fp4_kernel<<<dq_blocks(n / 2), DQ_THREADS>>>(out, data, scale, p->scale_f32, p->nrows, p->cols / 2,
                                                            p->scale_cols);
            break;
        case DSV4_REF_WFMT_BF16:
            dq_bf16_kernel<<<dq_blocks(n), DQ_THREADS>>>(out, (const uint16_t *)(const void *)data, n);
            break;
        case DSV4_REF_WFMT_F32:
        case DSV4_REF_WFMT_HOST:
            dq_copy_kernel<<<dq_blocks(n), DQ_THREADS>>>((uint32_t *)(void *)out, (const uint32_t *)(const void *)data,
                                                         n);
            break;
        default: return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: %s: weight format %d", p->t->name, (int)p->fmt);
        }
        DSV4_REF_LAUNCH_CHECK("dequant");
        if (emu && p->round) DSV4_TRY(dsv4_ref_gpu_emu_round(out, n)); /* the resident upload's rounding */
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------- slots */
/* Wait until s's previous copy and dequantisation are done, and add their times to the stats. */
static int slot_wait(dsv4_ref_gpu *g, gpu_slot *s)
{
    dsv4_ref_gpu_stats *st = &g->stats;
    const double t0 = now_s();
    if (s->copy_rec) DSV4_REF_CUDA_CHECK(cudaEventSynchronize(s->copied));
    if (s->deq_rec) DSV4_REF_CUDA_CHECK(cudaEventSynchronize(s->consumed));
    st->wait_s += now_s() - t0;
    float ms;
    if (s->copy_rec) {
        DSV4_REF_CUDA_CHECK(cudaEventElapsedTime(&ms, s->c0, s->copied));
        st->copy_s += 1e-3 * ms;
        s->copy_rec = 0;
    }
    if (s->deq_rec) {
        DSV4_REF_CUDA_CHECK(cudaEventElapsedTime(&ms, s->d0, s->consumed));
        st->dequant_s += 1e-3 * ms;
        s->deq_rec = 0;
    }
    return 0;
}

/* Dense part i of a call: layer i, or row range i - L of the head. */
static int dense_part(dsv4_ref_gpu *g, int i, dsv4_ref_part *part)
{
    const int nl = g->cfg.num_hidden_layers;
    return i < nl ? dsv4_ref_part_layer(g->model, &g->cfg, i, g->emu, part)
                  : dsv4_ref_part_head(g->model, &g->cfg, &g->stream.sz, i - nl, g->emu, part);
}

/* Fill s with dense part i (dense) or expert e of layer L, and start its copy to the GPU. */
static int slot_stage(dsv4_ref_gpu *g, gpu_slot *s, int dense, int i, int L, int e)
{
    gpu_stream *gs = &g->stream;
    dsv4_ref_gpu_stats *st = &g->stats;
    if (gs->sync) DSV4_REF_CUDA_CHECK(cudaDeviceSynchronize()); /* measuring: nothing runs beside the fill */
    DSV4_TRY(slot_wait(g, s));
    s->staged = 0;
    DSV4_TRY(dense ? dense_part(g, i, &s->part) : dsv4_ref_part_expert(g->model, &g->cfg, L, e, g->emu, &s->part));
    if (s->part.bytes > s->cap) /* the plan sized the slots from the same parts: only a changed model gets here */
        return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: a part of %zu bytes in a slot of %zu", s->part.bytes, s->cap);
    const double t0 = now_s();
    DSV4_TRY(dsv4_ref_part_fill(&s->part, g->model, s->host));
    st->fill_s += now_s() - t0;
    DSV4_REF_CUDA_CHECK(cudaEventRecord(s->c0, gs->copy));
    DSV4_REF_CUDA_CHECK(cudaMemcpyAsync(s->dev, s->host, s->part.bytes, cudaMemcpyHostToDevice, gs->copy));
    DSV4_REF_CUDA_CHECK(cudaEventRecord(s->copied, gs->copy));
    s->copy_rec = 1;
    s->staged = 1;
    st->bytes += (double)s->part.bytes;
    if (s->part.kind == DSV4_REF_PART_LAYER) st->dense_parts++;
    else if (s->part.kind == DSV4_REF_PART_HEAD) st->head_parts++;
    else st->expert_parts++;
    if (gs->sync) DSV4_REF_CUDA_CHECK(cudaEventSynchronize(s->copied));
    return 0;
}

/* Dequantise the part staged in s into dst on the compute stream, once its copy is done. */
static int slot_use(dsv4_ref_gpu *g, gpu_slot *s, float *dst)
{
    if (!s->staged) return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: a weight slot used before it was filled");
    DSV4_REF_CUDA_CHECK(cudaStreamWaitEvent(0, s->copied, 0));
    DSV4_REF_CUDA_CHECK(cudaEventRecord(s->d0, 0));
    DSV4_TRY(dsv4_ref_gpu_part_dequant(&s->part, s->dev, dst, g->emu));
    DSV4_REF_CUDA_CHECK(cudaEventRecord(s->consumed, 0));
    s->deq_rec = 1;
    s->staged = 0;
    if (g->stream.sync) DSV4_REF_CUDA_CHECK(cudaEventSynchronize(s->consumed));
    return 0;
}

static int part_is(const gpu_slot *s, dsv4_ref_part_kind kind, int layer, int index)
{
    return s->staged && s->part.kind == kind && s->part.layer == layer && s->part.index == index;
}

/* The slot of a pair holding the part, else NULL. */
static gpu_slot *slot_find(gpu_slot *pair, dsv4_ref_part_kind kind, int layer, int index)
{
    for (int k = 0; k < 2; k++)
        if (part_is(&pair[k], kind, layer, index)) return &pair[k];
    return NULL;
}

/* A slot of the pair to fill, not `keep`: one holding nothing staged if there is one. */
static gpu_slot *slot_free(gpu_slot *pair, const gpu_slot *keep)
{
    for (int k = 0; k < 2; k++)
        if (&pair[k] != keep && !pair[k].staged) return &pair[k];
    return &pair[0] != keep ? &pair[0] : &pair[1];
}

/* ------------------------------------------------------------------------------------ dense parts */
/* Dense part i as the arena's content: what the binder of a layer checks its names against. */
static void dense_ident(const dsv4_ref_gpu *g, int i, dsv4_ref_part_kind *kind, int *layer, int *index)
{
    const int nl = g->cfg.num_hidden_layers;
    *kind = i < nl ? DSV4_REF_PART_LAYER : DSV4_REF_PART_HEAD;
    *layer = i < nl ? i : -1;
    *index = i < nl ? 0 : i - nl;
}

/* Drop the views of the layer the arena held: they would point at the next part's values. */
static void layer_unbind(dsv4_ref_gpu *g)
{
    const int L = g->stream.loaded;
    if (L < 0 || L >= g->cfg.num_hidden_layers) return;
    gpu_layer *w = &g->lw[L];
#define UNBIND_LISTED(field, numel, cond, bf16, name) w->field = NULL;
    DSV4_REF_LAYER_TENSORS(UNBIND_LISTED)
#undef UNBIND_LISTED
}

/* Layer L's views into the arena at its pieces' offsets, in DSV4_REF_LAYER_TENSORS's order (names checked). */
static int layer_bind(dsv4_ref_gpu *g, int L, const dsv4_ref_part *part)
{
    gpu_layer *w = &g->lw[L];
    int i = 0;
    char name[160];
#define BIND_LISTED(field, numel, cond, bf16, fmt)                                                               \
    if (cond) {                                                                                                  \
        snprintf(name, sizeof name, fmt, L);                                                                     \
        if (i >= part->n || strcmp(part->p[i].t->name, name))                                                    \
            return dsv4_error(DSV4_ERR_USAGE, "ref-gpu: layer %d's part holds %s where %s belongs", L,          \
                              i < part->n ? part->p[i].t->name : "nothing", name);                              \
        w->field = g->stream.arena + part->p[i++].dst_at;                                                        \
    }
    DSV4_REF_LAYER_TENSORS(BIND_LISTED)
#undef BIND_LISTED
    return i == part->n ? 0 : dsv4_error(DSV4_ERR_USAGE, "ref-gpu: layer %d's part holds %d tensors, %d bound", L,
                                         part->n, i);
}

/* Dense part i into the arena, then the next one staged in the other slot. */
static int dense_load(dsv4_ref_gpu *g, int i)
{
    gpu_stream *gs = &g->stream;
    dsv4_ref_part_kind kind;
    int layer, index;
    dense_ident(g, i, &kind, &layer, &index);
    gpu_slot *s = slot_find(gs->dense, kind, layer, index);
    if (!s) { /* not staged ahead: the first call, or the head was skipped */
        s = slot_free(gs->dense, NULL);
        DSV4_TRY(slot_stage(g, s, 1, i, 0, 0));
    }
    layer_unbind(g);
    gs->loaded = -1;
    DSV4_TRY(slot_use(g, s, gs->arena));
    gs->loaded = i;
    if (kind == DSV4_REF_PART_LAYER) DSV4_TRY(layer_bind(g, layer, &s->part));
    const int next = (i + 1) % gs->n_dense;
    dense_ident(g, next, &kind, &layer, &index);
    if (!slot_find(gs->dense, kind, layer, index)) DSV4_TRY(slot_stage(g, slot_free(gs->dense, s), 1, next, 0, 0));
    return 0;
}

int ref_gpu_weights_layer(dsv4_ref_gpu *g, int L) { return g->streamed ? dense_load(g, L) : 0; }

int ref_gpu_weights_head(dsv4_ref_gpu *g, const float **head)
{
    if (!g->streamed) {
        *head = g->head;
        return 0;
    }
    for (int k = 0; k < g->stream.sz.head_parts; k++) DSV4_TRY(dense_load(g, g->cfg.num_hidden_layers + k));
    *head = g->stream.arena;
    return 0;
}

/* --------------------------------------------------------------------------------------- experts */
int ref_gpu_weights_experts_begin(dsv4_ref_gpu *g, int L, const int32_t *ex, int n_ex)
{
    gpu_stream *gs = &g->stream;
    if (!g->streamed || n_ex < 1 || slot_find(gs->expert, DSV4_REF_PART_EXPERT, L, ex[0])) return 0;
    return slot_stage(g, slot_free(gs->expert, NULL), 0, 0, L, ex[0]);
}

int ref_gpu_weights_expert(dsv4_ref_gpu *g, int L, const int32_t *ex, int n_ex, int j, const float **w1,
                           const float **w3, const float **w2)
{
    const int e = ex[j];
    if (!g->streamed) {
        *w1 = g->lw[L].w1[e];
        *w3 = g->lw[L].w3[e];
        *w2 = g->lw[L].w2[e];
        return 0;
    }
    gpu_stream *gs = &g->stream;
    gpu_slot *s = slot_find(gs->expert, DSV4_REF_PART_EXPERT, L, e);
    if (!s) {
        s = slot_free(gs->expert, NULL);
        DSV4_TRY(slot_stage(g, s, 0, 0, L, e));
    }
    for (int k = 0; k < 3; k++) gs->exp_off[k] = s->part.p[k].dst_at;
    DSV4_TRY(slot_use(g, s, gs->expert_f32));
    if (j + 1 < n_ex && !slot_find(gs->expert, DSV4_REF_PART_EXPERT, L, ex[j + 1]))
        DSV4_TRY(slot_stage(g, slot_free(gs->expert, s), 0, 0, L, ex[j + 1]));
    *w1 = gs->expert_f32 + gs->exp_off[0];
    *w3 = gs->expert_f32 + gs->exp_off[1];
    *w2 = gs->expert_f32 + gs->exp_off[2];
    return 0;
}

/* ------------------------------------------------------------------------------------- embedding */
int ref_gpu_weights_embed(dsv4_ref_gpu *g, const int32_t *tokens, int S)
{
    const dsv4_config *f = &g->cfg;
    gpu_scratch *sc = &g->sc;
    const int n = f->hc_mult, D = f->hidden_size;
    if (!g->streamed) return dsv4_ref_gpu_embed(sc->X, g->embed, sc->tokens, S, n, D);
    gpu_stream *gs = &g->stream;
    const double t0 = now_s();
    for (int s = 0; s < S; s++) { /* a row per token, as ref-cpu reads them */
        float *row = gs->h_erows + (size_t)s * D;
        DSV4_TRY(dsv4_model_read_f32_rows(g->model, "embed.weight", tokens[s], 1, row));
        if (gs->embed_round) dsv4_ref_emu_round(row, (size_t)D);
    }
    g->stats.fill_s += now_s() - t0;
    DSV4_REF_CUDA_CHECK(cudaMemcpy(sc->erows, gs->h_erows, (size_t)S * D * sizeof(float), cudaMemcpyHostToDevice));
    return dsv4_ref_gpu_embed(sc->X, sc->erows, sc->ident, S, n, D); /* row s of erows for token s */
}

/* ------------------------------------------------------------------------------------ init, stats */
static int slot_init(gpu_slot *s, uint8_t *dev, size_t cap)
{
    s->dev = dev;
    s->cap = cap;
    DSV4_REF_CUDA_CHECK(cudaMallocHost((void **)&s->host, cap ? cap : 1));
    DSV4_REF_CUDA_CHECK(cudaEventCreate(&s->c0));
    DSV4_REF_CUDA_CHECK(cudaEventCreate(&s->copied));
    DSV4_REF_CUDA_CHECK(cudaEventCreate(&s->d0));
    DSV4_REF_CUDA_CHECK(cudaEventCreate(&s->consumed));
    return 0;
}

int ref_gpu_stream_init(dsv4_ref_gpu *g, int max_tokens)
{
    gpu_stream *gs = &g->stream;
    const dsv4_config *f = &g->cfg;
    gs->loaded = -1;
    const char *env = getenv("DSV4_REF_GPU_SYNC");
    gs->sync = env && !strcmp(env, "1");
    DSV4_TRY(dsv4_ref_gpu_dequant_init());
    DSV4_TRY(dsv4_ref_stream_measure(g->model, f, g->emu, &gs->sz));
    gs->n_dense = f->num_hidden_layers + gs->sz.head_parts;
    const size_t ds = gs->sz.dense_slot, es = gs->sz.expert_slot;
    char what[160];
    snprintf(what, sizeof what, "ref-gpu pinned buffers of the streamed weights (2 x %zu + 2 x %zu bytes)", ds, es);
    DSV4_TRY(dsv4_mem_check_host(2.0 * (double)(ds + es), what));
    DSV4_TRY(ref_gpu_alloc(g, (void **)&gs->dev_mem, 2 * (ds + es), "ref-gpu weight slots (as on disk)"));
    DSV4_TRY(ref_gpu_alloc(g, (void **)&gs->arena, gs->sz.arena_floats * sizeof(float),
                          "ref-gpu weights of one layer or the head (f32)"));
    DSV4_TRY(ref_gpu_alloc(g, (void **)&gs->expert_f32, gs->sz.expert_floats * sizeof(float),
                          "ref-gpu one routed expert (f32)"));
    DSV4_TRY(slot_init(&gs->dense[0], gs->dev_mem, ds));
    DSV4_TRY(slot_init(&gs->dense[1], gs->dev_mem + ds, ds));
    DSV4_TRY(slot_init(&gs->expert[0], gs->dev_mem + 2 * ds, es));
    DSV4_TRY(slot_init(&gs->expert[1], gs->dev_mem + 2 * ds + es, es));
    DSV4_REF_CUDA_CHECK(cudaStreamCreateWithFlags(&gs->copy, cudaStreamNonBlocking));
    const dsv4_tensor *t;
    DSV4_TRY(dsv4_model_tensor(g->model, "embed.weight", &t));
    gs->embed_round = g->emu && t->dtype != DSV4_DTYPE_F8_E4M3 && t->dtype != DSV4_DTYPE_I8;
    const int chunk = max_tokens < GPU_CHUNK ? max_tokens : GPU_CHUNK;
    gs->h_erows = (float *)dsv4_ref_alloc((size_t)chunk * f->hidden_size * sizeof(float), "ref-gpu embedding rows");
    return gs->h_erows ? 0 : DSV4_ERR_NOMEM;
}

void ref_gpu_stream_free(dsv4_ref_gpu *g)
{
    gpu_stream *gs = &g->stream;
    gpu_slot *all[4] = {&gs->dense[0], &gs->dense[1], &gs->expert[0], &gs->expert[1]};
    if (gs->copy) cudaStreamSynchronize(gs->copy);
    for (int k = 0; k < 4; k++) {
        gpu_slot *s = all[k];
        if (s->host) cudaFreeHost(s->host);
        if (s->c0) cudaEventDestroy(s->c0);
        if (s->copied) cudaEventDestroy(s->copied);
        if (s->d0) cudaEventDestroy(s->d0);
        if (s->consumed) cudaEventDestroy(s->consumed);
    }
    if (gs->copy) cudaStreamDestroy(gs->copy);
    cudaFree(gs->dev_mem);
    cudaFree(gs->arena);
    cudaFree(gs->expert_f32);
    dsv4_ref_release(gs->h_erows);
    memset(gs, 0, sizeof *gs);
}

void ref_gpu_stats_call_end(dsv4_ref_gpu *g, double wall_s)
{
    dsv4_ref_gpu_stats *st = &g->stats;
    st->calls++;
    st->wall_s += wall_s;
    if (g->streamed) { /* the device is synchronised: every recorded pair is done */
        gpu_slot *all[4] = {&g->stream.dense[0], &g->stream.dense[1], &g->stream.expert[0], &g->stream.expert[1]};
        for (int k = 0; k < 4; k++) (void)slot_wait(g, all[k]);
    }
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && g->free0 > fr && (double)(g->free0 - fr) > st->gpu_peak)
        st->gpu_peak = (double)(g->free0 - fr);
}
