/* topk.cu - exact per-sequence top-k (model-spec §8 step 6, §13 tie rule); launcher contract in topk.cuh.
 *
 * Every entry gets a distinct 54-bit key: [ordered score bits (32) | (2^22 - 1 - id) (22)], so "larger key" is
 * exactly "higher score, then lower id", and the top-k set is unambiguous. A radix select finds the k-th key:
 *   1. tk_hist<P>, P = 0..4: one pass over the scores per digit (11, 11, 10 score bits, then 11, 11 id bits), all
 *      blocks of a sequence histogram the entries matching the prefix found so far (shared-memory histogram,
 *      warp-aggregated with __match_any_sync, then global integer atomics: exact and order-independent). The last
 *      block to arrive picks the digit holding the k-th key; once the bin holding it holds exactly the keys still
 *      needed, the sequence is done (later passes return at once; they only run on exact score ties).
 *   2. tk_gather: keys >= threshold go to a candidate list (slots by atomics, so in any order).
 *   3. tk_sort: one block per sequence ranks the <= k candidates (rank = number of larger keys): the final order
 *      depends only on the keys, so the output is deterministic although step 2 is not ordered.
 * Small path (n_work <= 8192, the common 4K..32K contexts): the same select in ONE block per sequence with the
 * keys in registers and the histogram in shared memory, then the rank sort: one launch instead of eight.
 *
 * Quiet traps:
 *  - -0.0 is mapped to +0.0 before taking the bits (the indexer yields -0 when every ReLU is 0 and a weight < 0);
 *    otherwise -0 would rank below +0 and the tie rule would break.
 *  - the global histogram is zeroed by the pass's last block after its pick, for the next pass; the per-sequence
 *    state and histograms are cleared by one memset at the start of every launch (no state survives a launch).
 */
#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "topk.cuh"

enum { TK_ID_BITS = 22, TK_KEY_BITS = 54, TK_PASSES = 5, TK_BINS = 2048, TK_THREADS = 256, TK_PER_THREAD = 16 };
enum { TK_CHUNK = TK_THREADS * TK_PER_THREAD, TK_SORT_THREADS = 1024, TK_MAX_K = 2048 };
enum { TK_SMALL_THREADS = 1024, TK_SMALL_ITEMS = 8, TK_SMALL_N = TK_SMALL_THREADS * TK_SMALL_ITEMS };
#define TK_ID_MASK ((1u << TK_ID_BITS) - 1u)

typedef unsigned long long tk_key_t;

/* Per-sequence selection state (64 bytes). */
typedef struct tk_state {
    tk_key_t prefix;   /* key bits above the current pass's digit, of the bin holding the k-th key */
    tk_key_t thr;      /* once done: the selection is exactly the keys >= thr */
    int taken;         /* keys known to be above the current prefix (already selected) */
    int done;
    int count;         /* candidates gathered */
    int pad0;
    unsigned arrived[TK_PASSES];
    unsigned pad1[3];
} tk_state;

typedef struct tk_kparams {
    dsv4_topk_params p;
    tk_state *states;  /* [C] */
    unsigned *hist;    /* [C, TK_BINS] */
    tk_key_t *cand;    /* [C, k] */
} tk_kparams;

/* Score bits in an order that compares like the floats. */
static __device__ __forceinline__ uint32_t tk_ordered(float f)
{
    if (f == 0.0f) f = 0.0f; /* -0 -> +0 */
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ tk_key_t tk_key_of(uint32_t ordered, int w)
{
    return ((tk_key_t)ordered << TK_ID_BITS) | (tk_key_t)(TK_ID_MASK - (uint32_t)w);
}
static __device__ __forceinline__ tk_key_t tk_key(float f, int w)
{
    return tk_key_of(tk_ordered(f), w);
}

static __device__ __forceinline__ int tk_scan_len(const dsv4_topk_params &p, int c)
{
    return p.context == DSV4_INDEX_CONTEXT_LIVE ? min(p.n_live[c], p.n_work) : p.n_work;
}

template <int PASS> __global__ void __launch_bounds__(TK_THREADS) tk_hist(const __grid_constant__ tk_kparams kp)
{
    typedef cub::BlockScan<unsigned, TK_THREADS> scan_t;
    __shared__ unsigned h_s[TK_BINS];
    __shared__ typename scan_t::TempStorage scan_tmp;
    __shared__ int last_s;
    const dsv4_topk_params &p = kp.p;
    const int c = blockIdx.y, lane = threadIdx.x & 31;
    tk_state *st = kp.states + c;
    if (st->done) return;
    constexpr int shift = PASS == 0 ? 43 : PASS == 1 ? 32 : PASS == 2 ? 22 : PASS == 3 ? 11 : 0;
    constexpr int width = PASS == 2 ? 10 : 11;
    const int n_scan = tk_scan_len(p, c), w0 = blockIdx.x * TK_CHUNK;
    unsigned *hist = kp.hist + (size_t)c * TK_BINS;

    for (int b = threadIdx.x; b < TK_BINS; b += TK_THREADS) h_s[b] = 0;
    __syncthreads();
    if (w0 < n_scan) {
        const tk_key_t prefix = st->prefix;
        const float *sc = p.scores + (size_t)c * p.score_stride;
#pragma unroll 4
        for (int i = 0; i < TK_PER_THREAD; i++) {
            int w = w0 + i * TK_THREADS + threadIdx.x;
            unsigned bin = 0xffffffffu;
            if (w < n_scan) {
                tk_key_t key = tk_key(sc[w], w);
                if ((key >> (shift + width)) == prefix) bin = (unsigned)(key >> shift) & ((1u << width) - 1u);
            }
            if (__any_sync(0xffffffffu, bin != 0xffffffffu)) { /* later passes: most warps have no candidate */
                unsigned peers = __match_any_sync(0xffffffffu, bin);
                if (bin != 0xffffffffu && lane == __ffs(peers) - 1) atomicAdd(&h_s[bin], (unsigned)__popc(peers));
            }
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < TK_BINS; b += TK_THREADS)
        if (h_s[b]) atomicAdd(&hist[b], h_s[b]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last_s = atomicAdd(&st->arrived[PASS], 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last_s) return;
    __threadfence();

    /* Last block: pick the digit. Thread t sums 8 bins from the top: bins 2047-8t .. 2040-8t. */
    for (int b = threadIdx.x; b < TK_BINS; b += TK_THREADS) {
        h_s[b] = __ldcg(&hist[b]);
        hist[b] = 0;
    }
    __syncthreads();
    const int top = TK_BINS - 1 - 8 * threadIdx.x;
    unsigned gsum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) gsum += h_s[top - i];
    const unsigned k_rem = (unsigned)(p.k - st->taken); /* read before the scan's barrier: one thread writes it */
    unsigned above, total;
    scan_t(scan_tmp).ExclusiveSum(gsum, above, total);
    if (total < k_rem) { /* fewer candidates than k (only at pass 0): take everything */
        if (threadIdx.x == 0) {
            st->thr = 0;
            st->done = 1;
        }
        return;
    }
    if (above < k_rem && k_rem <= above + gsum) {
        for (int i = 0; i < 8; i++) {
            unsigned cnt = h_s[top - i];
            if (above + cnt >= k_rem) {
                const unsigned need = k_rem - above;
                const tk_key_t prefix = (st->prefix << width) | (tk_key_t)(top - i);
                st->taken += (int)above;
                st->prefix = prefix;
                if (cnt == need || PASS == TK_PASSES - 1) {
                    st->thr = prefix << shift;
                    st->done = 1;
                }
                break;
            }
            above += cnt;
        }
    }
}

/* Keys >= thr into the candidate list. */
__global__ void __launch_bounds__(TK_THREADS) tk_gather(const __grid_constant__ tk_kparams kp)
{
    __shared__ int n_s, base_s;
    const dsv4_topk_params &p = kp.p;
    const int c = blockIdx.y, n_scan = tk_scan_len(p, c), w0 = blockIdx.x * TK_CHUNK;
    if (w0 >= n_scan) return;
    tk_state *st = kp.states + c;
    const tk_key_t thr = st->thr;
    const float *sc = p.scores + (size_t)c * p.score_stride;
    if (threadIdx.x == 0) n_s = 0;
    __syncthreads();
    tk_key_t keys[TK_PER_THREAD];
    int slot[TK_PER_THREAD];
#pragma unroll
    for (int i = 0; i < TK_PER_THREAD; i++) {
        int w = w0 + i * TK_THREADS + threadIdx.x;
        slot[i] = -1;
        keys[i] = 0;
        if (w < n_scan) {
            keys[i] = tk_key(sc[w], w);
            if (keys[i] >= thr) slot[i] = atomicAdd(&n_s, 1);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0 && n_s > 0) base_s = atomicAdd(&st->count, n_s);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TK_PER_THREAD; i++)
        if (slot[i] >= 0) kp.cand[(size_t)c * p.k + base_s + slot[i]] = keys[i];
}

/* The final order: candidate i goes to rank #{j : key_j > key_i} (keys are distinct, so ranks are a permutation
 * of 0..count-1 and depend only on the keys). ids >= live (max position) become -1; ranks count..k-1 are -1. */
static __device__ __forceinline__ void tk_rank_write(const dsv4_topk_params &p, int c, const tk_key_t *cand_s,
                                                     int count)
{
    const int live = p.n_live[c];
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        const tk_key_t key = cand_s[i];
        int rank = 0;
        for (int j = 0; j < count; j++) rank += cand_s[j] > key;
        int id = (int)(TK_ID_MASK - (uint32_t)(key & TK_ID_MASK));
        p.out[(size_t)c * p.k + rank] = id < live ? id : -1;
    }
    for (int r = count + threadIdx.x; r < p.k; r += blockDim.x) p.out[(size_t)c * p.k + r] = -1;
}

/* Multi-block path, step 3: one block per sequence ranks the gathered candidates. */
__global__ void __launch_bounds__(TK_SORT_THREADS) tk_sort(const __grid_constant__ tk_kparams kp)
{
    __shared__ tk_key_t cand_s[TK_MAX_K];
    const int c = blockIdx.x, count = kp.states[c].count;
    for (int i = threadIdx.x; i < count; i += TK_SORT_THREADS) cand_s[i] = kp.cand[(size_t)c * kp.p.k + i];
    __syncthreads();
    tk_rank_write(kp.p, c, cand_s, count);
}

/* Small path (n_work <= TK_SMALL_N): the whole select in one block per sequence, keys in registers, the same
 * digits and picks as the multi-block path, then the rank sort. One launch, no workspace traffic. */
__global__ void __launch_bounds__(TK_SMALL_THREADS) tk_small(const __grid_constant__ dsv4_topk_params p)
{
    typedef cub::BlockScan<unsigned, TK_SMALL_THREADS> scan_t;
    __shared__ unsigned h_s[TK_BINS];
    __shared__ tk_key_t cand_s[TK_MAX_K];
    __shared__ typename scan_t::TempStorage scan_tmp;
    __shared__ tk_key_t prefix_s, thr_s;
    __shared__ int taken_s, done_s, count_s;
    const int c = blockIdx.x, lane = threadIdx.x & 31, n_scan = tk_scan_len(p, c);
    const float *sc = p.scores + (size_t)c * p.score_stride;
    uint32_t ord[TK_SMALL_ITEMS]; /* the key is rebuilt from (ord, w): half the registers */
#pragma unroll
    for (int i = 0; i < TK_SMALL_ITEMS; i++) {
        int w = i * TK_SMALL_THREADS + threadIdx.x;
        ord[i] = w < n_scan ? tk_ordered(sc[w]) : 0u;
    }
    if (threadIdx.x == 0) {
        prefix_s = 0;
        thr_s = 0;
        taken_s = 0;
        done_s = n_scan <= p.k; /* everything is selected */
        count_s = 0;
    }
    __syncthreads();
#pragma unroll 1
    for (int pass = 0; pass < TK_PASSES; pass++) {
        if (done_s) break; /* uniform: read after a barrier */
        const int shift = pass == 0 ? 43 : pass == 1 ? 32 : pass == 2 ? 22 : pass == 3 ? 11 : 0;
        const int width = pass == 2 ? 10 : 11;
        const tk_key_t prefix = prefix_s;
        const unsigned k_rem = (unsigned)(p.k - taken_s);
        for (int b = threadIdx.x; b < TK_BINS; b += TK_SMALL_THREADS) h_s[b] = 0;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TK_SMALL_ITEMS; i++) {
            int w = i * TK_SMALL_THREADS + threadIdx.x;
            unsigned bin = 0xffffffffu;
            const tk_key_t key = tk_key_of(ord[i], w);
            if (w < n_scan && (key >> (shift + width)) == prefix) bin = (unsigned)(key >> shift) & ((1u << width) - 1u);
            if (__any_sync(0xffffffffu, bin != 0xffffffffu)) {
                unsigned peers = __match_any_sync(0xffffffffu, bin);
                if (bin != 0xffffffffu && lane == __ffs(peers) - 1) atomicAdd(&h_s[bin], (unsigned)__popc(peers));
            }
        }
        __syncthreads();
        const int top = TK_BINS - 1 - 2 * threadIdx.x; /* thread t: bins top, top-1 */
        const unsigned c0 = h_s[top], c1 = h_s[top - 1];
        unsigned above, total;
        scan_t(scan_tmp).ExclusiveSum(c0 + c1, above, total);
        if (above < k_rem && k_rem <= above + c0 + c1) {
            const unsigned cnt = above + c0 >= k_rem ? c0 : c1;
            const int bin = above + c0 >= k_rem ? top : top - 1;
            const unsigned before = above + c0 >= k_rem ? above : above + c0;
            const tk_key_t np = (prefix << width) | (tk_key_t)bin;
            taken_s += (int)before;
            prefix_s = np;
            if (cnt == k_rem - before || pass == TK_PASSES - 1) {
                thr_s = np << shift;
                done_s = 1;
            }
        }
        __syncthreads();
    }
    const tk_key_t thr = thr_s;
#pragma unroll
    for (int i = 0; i < TK_SMALL_ITEMS; i++) {
        int w = i * TK_SMALL_THREADS + threadIdx.x;
        const tk_key_t key = tk_key_of(ord[i], w);
        if (w < n_scan && key >= thr) cand_s[atomicAdd(&count_s, 1)] = key;
    }
    __syncthreads();
    tk_rank_write(p, c, cand_s, count_s);
}

/* ------------------------------------------------------------------------------------------------ host */
static size_t tk_state_bytes(int n_seq)
{
    return (size_t)n_seq * (sizeof(tk_state) + TK_BINS * sizeof(unsigned));
}

extern "C" size_t dsv4_opt_topk_workspace_bytes(const dsv4_topk_params *p)
{
    if (p == NULL || p->n_seq < 1 || p->k < 1) return 0;
    return tk_state_bytes(p->n_seq) + (size_t)p->n_seq * p->k * sizeof(tk_key_t);
}

extern "C" int dsv4_opt_topk(const dsv4_topk_params *p)
{
    DSV4_CHECK(p != NULL, "topk: params is NULL");
    DSV4_CHECK(p->n_seq >= 1, "topk: n_seq %d must be >= 1", p->n_seq);
    if (p->k < 1 || p->k > TK_MAX_K)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "topk: k %d unsupported (1..%d)", p->k, TK_MAX_K);
    if (p->n_work < 1 || p->n_work > (1 << TK_ID_BITS))
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "topk: n_work %d unsupported (1..%d)", p->n_work, 1 << TK_ID_BITS);
    DSV4_CHECK(p->score_stride >= p->n_work, "topk: score_stride %lld < n_work %d", (long long)p->score_stride,
               p->n_work);
    DSV4_CHECK(p->scores && p->n_live && p->out, "topk: scores, n_live, out must be non-NULL");
    DSV4_CHECK(p->context == DSV4_INDEX_CONTEXT_LIVE || p->context == DSV4_INDEX_CONTEXT_MAX, "topk: bad context %d",
               (int)p->context);
    const size_t need = dsv4_opt_topk_workspace_bytes(p);
    DSV4_CHECK(p->workspace != NULL && p->workspace_bytes >= need && dsv4_aligned16(p->workspace),
               "topk: workspace of %zu B (16-aligned) needed, got %zu B at %p", need, p->workspace_bytes, p->workspace);
    if (p->n_work <= TK_SMALL_N) {
        tk_small<<<p->n_seq, TK_SMALL_THREADS, 0, p->stream>>>(*p);
        DSV4_LAUNCH_CHECK("tk_small");
        return 0;
    }
    tk_kparams kp;
    kp.p = *p;
    kp.states = static_cast<tk_state *>(p->workspace);
    kp.hist = reinterpret_cast<unsigned *>(kp.states + p->n_seq);
    kp.cand = reinterpret_cast<tk_key_t *>(static_cast<char *>(p->workspace) + tk_state_bytes(p->n_seq));
    DSV4_CUDA_CHECK(cudaMemsetAsync(p->workspace, 0, tk_state_bytes(p->n_seq), p->stream));
    const dim3 grid(dsv4_ceil_div(p->n_work, TK_CHUNK), p->n_seq);
    tk_hist<0><<<grid, TK_THREADS, 0, p->stream>>>(kp);
    DSV4_LAUNCH_CHECK("tk_hist<0>");
    tk_hist<1><<<grid, TK_THREADS, 0, p->stream>>>(kp);
    DSV4_LAUNCH_CHECK("tk_hist<1>");
    tk_hist<2><<<grid, TK_THREADS, 0, p->stream>>>(kp);
    DSV4_LAUNCH_CHECK("tk_hist<2>");
    tk_hist<3><<<grid, TK_THREADS, 0, p->stream>>>(kp);
    DSV4_LAUNCH_CHECK("tk_hist<3>");
    tk_hist<4><<<grid, TK_THREADS, 0, p->stream>>>(kp);
    DSV4_LAUNCH_CHECK("tk_hist<4>");
    tk_gather<<<grid, TK_THREADS, 0, p->stream>>>(kp);
    DSV4_LAUNCH_CHECK("tk_gather");
    tk_sort<<<p->n_seq, TK_SORT_THREADS, 0, p->stream>>>(kp);
    DSV4_LAUNCH_CHECK("tk_sort");
    return 0;
}
