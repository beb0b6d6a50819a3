/* moe_sorted.cu - the routed experts of a prefill step as grouped GEMMs: sort, gather, SwiGLU, combine
 * (moe_sorted.cuh), and between them the per-expert cuBLAS GEMMs spread over lanes (dsv4_opt_moe_gemms).
 *
 * Quiet traps:
 * - The sort is stable: block e walks the pairs in order, a warp ballot ranks its matches, so an expert's rows
 *   are its pairs in pair order and the step is bitwise reproducible.
 * - A pair whose expert is not held (expert parallel) keeps slot -1 and adds nothing, as in the decode kernels.
 * - The combine sums a token's k rows in j order, then adds the shared expert, as grouped_experts.cuh does.
 * - The lanes: an expert's GEMM always runs on the lane its rank among the experts with rows gives, never on
 *   whichever lane is free, so the same step makes the same launches on the same handles every time.
 */
#include "moe_sorted.cuh"
#include "opt_common.cuh"
#include "qweight.cuh"

enum { MS_THREADS = 256 };

static __device__ __forceinline__ int ms_held_index(const dsv4_moe_sorted_params &p, int e)
{
    if (e < 0 || e >= p.n_experts) return -1;
    if (p.e_end == 0) return e;
    return e >= p.e_begin && e < p.e_end ? e - p.e_begin : -1;
}

/* count[e] for held expert e (block e). */
__global__ void __launch_bounds__(MS_THREADS) moe_count_kernel(dsv4_moe_sorted_params p)
{
    __shared__ int part[MS_THREADS / 32];
    const int e = blockIdx.x, n = p.n_tok * p.k;
    int c = 0;
    for (int i = threadIdx.x; i < n; i += MS_THREADS) c += ms_held_index(p, p.ids[i]) == e;
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int w = 0; w < MS_THREADS / 32; w++) s += part[w];
        p.count[e] = s;
    }
}

/* offset = exclusive prefix of count (one thread: at most 1024 experts). */
__global__ void moe_offset_kernel(dsv4_moe_sorted_params p, int held)
{
    if (threadIdx.x != 0) return;
    int s = 0;
    for (int e = 0; e < held; e++) {
        p.offset[e] = s;
        s += p.count[e];
    }
    p.offset[held] = s;
}

/* Block e writes its pairs in order: rows offset[e] + rank. */
__global__ void __launch_bounds__(MS_THREADS) moe_scatter_kernel(dsv4_moe_sorted_params p)
{
    __shared__ int warp_n[MS_THREADS / 32];
    const int e = blockIdx.x, n = p.n_tok * p.k, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int base = p.offset[e];
    for (int i0 = 0; i0 < n; i0 += MS_THREADS) {
        const int i = i0 + threadIdx.x;
        const bool hit = i < n && ms_held_index(p, p.ids[i]) == e;
        const unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_n[warp] = __popc(m);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < MS_THREADS / 32; w++) {
            before += w < warp ? warp_n[w] : 0;
            total += warp_n[w];
        }
        if (hit) {
            const int q = base + before + __popc(m & ((1u << lane) - 1u));
            DSV4_DEV_CHECK(q < p.offset[e + 1], "expert %d pair %d row %d past %d", e, i, q, p.offset[e + 1]);
            p.perm[q] = i;
            p.slot[i] = q;
        }
        base += total;
        __syncthreads();
    }
}

__global__ void moe_gather_kernel(dsv4_moe_sorted_params p)
{
    const int q = blockIdx.x;
    const uint32_t *src = reinterpret_cast<const uint32_t *>(p.x + (size_t)(p.perm[q] / p.k) * p.dim);
    uint32_t *dst = reinterpret_cast<uint32_t *>(p.xs + (size_t)q * p.dim);
    for (int i = threadIdx.x; i < p.dim / 2; i += blockDim.x) dst[i] = src[i];
}

__global__ void moe_swiglu_sorted_kernel(dsv4_moe_sorted_params p, int n_rows)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, I = p.inter;
    if (i >= (int64_t)n_rows * I) return;
    const int64_t q = i / I, m = i % I;
    const float *gu = p.gu + (size_t)q * 2 * I;
    const float gv = fminf(gu[m], p.limit), uv = fminf(fmaxf(gu[I + m], -p.limit), p.limit);
    const float h = gv / (1.0f + expf(-gv)) * uv * p.weights[p.perm[q]];
    p.h[i] = dsv4_f32_to_bf16_bits(h);
}

__global__ void moe_combine_kernel(dsv4_moe_sorted_params p)
{
    const int t = blockIdx.x;
    for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < p.k; j++) {
            const int q = p.slot[(size_t)t * p.k + j];
            if (q >= 0) acc += p.y[(size_t)q * p.dim + c];
        }
        if (p.shared) acc = acc + p.shared[(size_t)t * p.shared_stride + c];
        p.out[(size_t)t * p.dim + c] = acc;
    }
}

int dsv4_moe_sorted_held(const dsv4_moe_sorted_params *p) { return p->e_end ? p->e_end - p->e_begin : p->n_experts; }

int dsv4_opt_moe_sort(const dsv4_moe_sorted_params *p)
{
    DSV4_CHECK(p && p->n_tok >= 1 && p->k >= 1 && p->n_experts >= 1 && p->n_experts <= 1024 && p->ids &&
                   p->count && p->offset && p->perm && p->slot,
               "moe_sort: bad params");
    const int held = dsv4_moe_sorted_held(p);
    DSV4_CHECK(held >= 1 && held <= p->n_experts, "moe_sort: %d held experts of %d", held, p->n_experts);
    DSV4_CUDA_CHECK(cudaMemsetAsync(p->slot, 0xff, (size_t)p->n_tok * p->k * 4, p->stream));
    moe_count_kernel<<<held, MS_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("moe_count_kernel");
    moe_offset_kernel<<<1, 32, 0, p->stream>>>(*p, held);
    DSV4_LAUNCH_CHECK("moe_offset_kernel");
    moe_scatter_kernel<<<held, MS_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("moe_scatter_kernel");
    return 0;
}

int dsv4_opt_moe_gather(const dsv4_moe_sorted_params *p, int n_rows)
{
    DSV4_CHECK(p && p->x && p->perm && p->xs && p->dim % 2 == 0, "moe_gather: bad params");
    if (n_rows <= 0) return 0;
    moe_gather_kernel<<<n_rows, 256, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("moe_gather_kernel");
    return 0;
}

int dsv4_opt_moe_swiglu_sorted(const dsv4_moe_sorted_params *p, int n_rows)
{
    DSV4_CHECK(p && p->gu && p->h && p->perm && p->weights && p->inter >= 1, "moe_swiglu_sorted: bad params");
    if (n_rows <= 0) return 0;
    moe_swiglu_sorted_kernel<<<dsv4_ceil_div((int64_t)n_rows * p->inter, 256), 256, 0, p->stream>>>(*p, n_rows);
    DSV4_LAUNCH_CHECK("moe_swiglu_sorted_kernel");
    return 0;
}

int dsv4_opt_moe_combine(const dsv4_moe_sorted_params *p)
{
    DSV4_CHECK(p && p->slot && p->y && p->out && p->n_tok >= 1, "moe_combine: bad params");
    moe_combine_kernel<<<p->n_tok, 256, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("moe_combine_kernel");
    return 0;
}

/* Expert e's GEMM over its n sorted rows from q0, on lane `lane`; an FP4 matrix is first dequantised into the
 * lane's slot on the lane's stream (the lane's previous GEMM, which read the slot, is before it on that stream). */
static int moe_gemm_one(const dsv4_moe_sorted_params *p, const dsv4_moe_gemm_weights *w, const dsv4_moe_lanes *l,
                        int lane, int64_t e, int64_t q0, int n, int up)
{
    const int64_t D = p->dim, I = p->inter;
    const int n_out = (int)(up ? 2 * I : D), n_in = (int)(up ? D : I);
    const uint16_t *W = NULL;
    if (w->w13) {
        W = up ? w->w13 + e * 2 * I * D : w->w2 + e * D * I;
    } else {
        const uint8_t *q = up ? w->q13 + e * 2 * I * D / 2 : w->q2 + e * D * I / 2;
        const uint8_t *s = up ? w->s13 + e * 2 * I * D / 32 : w->s2 + e * D * I / 32;
        DSV4_TRY(dsv4_opt_fp4_dequant(q, s, n_out, n_in, l->wdq[lane], l->stream[lane]));
        W = l->wdq[lane];
    }
    /* gu and y are the GEMMs' outputs (const in the params: the SwiGLU and the combine read them) */
    float *y = (float *)(up ? p->gu : p->y) + q0 * n_out;
    const uint16_t *x = (up ? p->xs : p->h) + q0 * n_in;
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t st = cublasGemmEx(l->cublas[lane], CUBLAS_OP_T, CUBLAS_OP_N, n_out, n, n_in, &one, W,
                                           CUDA_R_16BF, n_in, x, CUDA_R_16BF, n_in, &zero, y, CUDA_R_32F, n_out,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return dsv4_error(DSV4_ERR_CUDA, "moe_gemms: the %s GEMM of held expert %lld (%d rows) on lane %d: cuBLAS "
                          "status %d", up ? "up" : "down", (long long)e, n, lane, (int)st);
    return 0;
}

int dsv4_opt_moe_gemms(const dsv4_moe_sorted_params *p, const dsv4_moe_gemm_weights *w, const dsv4_moe_lanes *l,
                       const int32_t *off, int up)
{
    DSV4_CHECK(p && w && l && off && p->inter >= 1 && p->dim >= 1 && (up ? p->xs && p->gu : p->h && p->y),
               "moe_gemms: bad params");
    DSV4_CHECK(l->n >= 1 && l->n <= DSV4_MOE_MAX_LANES && l->stream[0] == p->stream,
               "moe_gemms: %d lanes (want 1 .. %d, lane 0 on the step's stream)", l->n, DSV4_MOE_MAX_LANES);
    const int fp4 = w->w13 == NULL;
    DSV4_CHECK(fp4 ? w->q13 && w->s13 && w->q2 && w->s2 : w->w2 != NULL, "moe_gemms: the experts' weights are NULL");
    const int held = dsv4_moe_sorted_held(p);
    int busy = 0; /* experts with rows: no lane is forked for nothing */
    for (int e = 0; e < held; e++) busy += off[e + 1] > off[e];
    const int nl = busy < l->n ? busy : l->n;
    for (int i = 0; i < nl; i++)
        DSV4_CHECK(l->cublas[i] && (!fp4 || l->wdq[i]) && (i == 0 || (l->stream[i] && l->fork && l->join[i])),
                   "moe_gemms: lane %d of %d is not set up (handle, stream, events%s)", i, l->n,
                   fp4 ? ", FP4 slot" : "");
    if (nl > 1) { /* the lanes start after everything on the step's stream so far */
        DSV4_CUDA_CHECK(cudaEventRecord(l->fork, p->stream));
        for (int i = 1; i < nl; i++) DSV4_CUDA_CHECK(cudaStreamWaitEvent(l->stream[i], l->fork, 0));
    }
    int rc = 0;
    for (int e = 0, i = 0; e < held && !rc; e++) {
        const int n = off[e + 1] - off[e];
        if (n > 0) rc = moe_gemm_one(p, w, l, i++ % nl, e, off[e], n, up);
    }
    /* joined even after a failure: no lane's work is left unordered with the step's stream */
    for (int i = 1; i < nl; i++) {
        cudaError_t ce = cudaEventRecord(l->join[i], l->stream[i]);
        if (ce == cudaSuccess) ce = cudaStreamWaitEvent(p->stream, l->join[i], 0);
        if (ce != cudaSuccess && !rc)
            rc = dsv4_error(DSV4_ERR_CUDA, "moe_gemms: the join of lane %d: %s", i, cudaGetErrorString(ce));
    }
    return rc;
}
