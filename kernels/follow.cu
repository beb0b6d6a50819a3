/* follow.cu - decision following: a reference dump's top-k / router row replaces the following sequence's own
 * selection after it was probed (follow.cuh; dsv4_opt.h "Decision following").
 *
 * Quiet traps:
 * - The own selection must be probed BEFORE these kernels run (the dump records what the path chose).
 * - A shared id keeps its slot: the attention sums its entries and the MoE its experts in slot order, so moving
 *   an unchanged id would change the fp32 sums' bits and a followed step would not be the free-running one.
 * - The route's weights are recomputed only for a changed row, with the route kernel's formula and order
 *   (dsv4_sqrtsoftplus, sum j ascending, + 1e-20, then · routed_scale).
 * One block per launch (only one sequence follows): the membership tests are spread over the threads, the
 * placement is a short serial pass of thread 0, so the result does not depend on the schedule.
 */
#include "follow.cuh"
#include "opt_common.cuh"

enum { FOLLOW_MAX_K = 1024, FOLLOW_THREADS = 256, FOLLOW_MAX_ROUTE_K = 16 };

/* Merge the dump's row p.ids into sel row p.seq (see follow.cuh); returns 1 in every thread when it changed. */
static __device__ int follow_merge(const dsv4_follow_params &p)
{
    __shared__ int32_t own[FOLLOW_MAX_K], tgt[FOLLOW_MAX_K];
    __shared__ uint8_t keep[FOLLOW_MAX_K], miss[FOLLOW_MAX_K];
    __shared__ int changed;
    const int k = p.k;
    int32_t *row = p.sel + (size_t)(p.seq + blockIdx.x) * k;
    const int32_t *ids = p.ids + (size_t)blockIdx.x * p.row_stride;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        own[j] = row[j];
        tgt[j] = ids[j];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const int32_t v = own[j], t = tgt[j];
        int kp = v >= 0, in = 0;
        for (int i = 0; kp && i < j; i++) kp = own[i] != v; /* first occurrence only */
        for (int i = 0; kp && !in && i < k; i++) in = tgt[i] == v;
        keep[j] = kp && in;
        int ms = t >= 0;
        for (int i = 0; ms && i < j; i++) ms = tgt[i] != t;
        for (int i = 0; ms && i < k; i++) ms = own[i] != t;
        miss[j] = ms;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int m = 0, ch = 0;
        for (int j = 0; j < k; j++) {
            if (keep[j]) continue;
            while (m < k && !miss[m]) m++;
            const int32_t v = m < k ? tgt[m++] : -1;
            ch |= v != own[j];
            own[j] = v;
        }
        changed = ch;
        if (ch) atomicAdd(p.changed, 1);
    }
    __syncthreads();
    const int ch = changed;
    if (ch)
        for (int j = threadIdx.x; j < k; j += blockDim.x) row[j] = own[j];
    __syncthreads(); /* the row is read back by thread 0 (route weights): the other threads' writes first */
    return ch;
}

__global__ void __launch_bounds__(FOLLOW_THREADS) follow_topk_kernel(dsv4_follow_params p)
{
    if (p.flag[(size_t)blockIdx.x * p.row_stride] == 0) return; /* uniform over the block */
    follow_merge(p);
}

__global__ void __launch_bounds__(FOLLOW_THREADS) follow_route_kernel(dsv4_follow_params p)
{
    if (p.flag[(size_t)blockIdx.x * p.row_stride] == 0) return;
    if (!follow_merge(p) || threadIdx.x != 0) return;
    const int k = p.k, seq = p.seq + blockIdx.x;
    const int32_t *ids = p.sel + (size_t)seq * k;
    const float *lg = p.logits + (size_t)seq * p.logit_stride;
    float sum = 0.0f, wv[FOLLOW_MAX_ROUTE_K];
    for (int j = 0; j < k; j++) {
        wv[j] = dsv4_sqrtsoftplus(lg[ids[j]]);
        sum += wv[j];
    }
    for (int j = 0; j < k; j++) p.weights[(size_t)seq * k + j] = wv[j] / (sum + 1e-20f) * p.routed_scale;
}

/* The ints one row of flag + ids spans at least. */
static int64_t k_row(const dsv4_follow_params *p) { return p->k; }

static int follow_check(const dsv4_follow_params *p, const char *what, int max_k)
{
    DSV4_CHECK(p != NULL, "%s: params is NULL", what);
    if (p->k < 1 || p->k > max_k)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "%s: k %d outside [1, %d]", what, p->k, max_k);
    const int rows = p->n_rows > 0 ? p->n_rows : 1;
    DSV4_CHECK(p->n_seq >= 1 && p->seq >= 0 && p->seq + rows <= p->n_seq && (rows == 1 || p->row_stride >= k_row(p)),
               "%s: rows %d..%d outside [0, %d) or row stride %lld", what, p->seq, p->seq + rows - 1, p->n_seq,
               (long long)p->row_stride);
    DSV4_CHECK(p->flag && p->ids && p->sel && p->changed, "%s: NULL buffer", what);
    return 0;
}

int dsv4_opt_follow_topk(const dsv4_follow_params *p)
{
    int rc = follow_check(p, "follow_topk", FOLLOW_MAX_K);
    if (rc) return rc;
    follow_topk_kernel<<<p->n_rows > 0 ? p->n_rows : 1, FOLLOW_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("follow_topk_kernel");
    return 0;
}

int dsv4_opt_follow_route(const dsv4_follow_params *p)
{
    int rc = follow_check(p, "follow_route", FOLLOW_MAX_ROUTE_K);
    if (rc) return rc;
    DSV4_CHECK(p->logits && p->weights && p->n_experts >= p->k && p->logit_stride >= p->n_experts,
               "follow_route: logits/weights NULL or n_experts %d < k %d or stride %lld < n_experts", p->n_experts,
               p->k, (long long)p->logit_stride);
    follow_route_kernel<<<p->n_rows > 0 ? p->n_rows : 1, FOLLOW_THREADS, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("follow_route_kernel");
    return 0;
}
