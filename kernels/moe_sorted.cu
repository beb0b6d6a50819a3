/* moe_sorted.cu - the routed experts of a prefill step as grouped GEMMs: sort, gather, SwiGLU, combine
 * (moe_sorted.cuh). The GEMMs themselves are the caller's cuBLAS calls, one up and one down per held expert.
 *
 * Quiet traps:
 * - The sort is stable: block e walks the pairs in order, a warp ballot ranks its matches, so an expert's rows
 *   are its pairs in pair order and the step is bitwise reproducible.
 * - A pair whose expert is not held (expert parallel) keeps slot -1 and adds nothing, as in the decode kernels.
 * - The combine sums a token's k rows in j order, then adds the shared expert, as grouped_experts.cuh does.
 */
#include "moe_sorted.cuh"
#include "opt_common.cuh"

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
