/* step.cu - device-side bookkeeping of one step: ring slots, live entry counts, RoPE tables, gather lists, and the
 * ring write of a step with runs (step.cuh).
 *
 * Quiet traps:
 * - The ring slot of position p is p mod W, written BEFORE the attention of p (the window includes the current
 *   token; the slot it overwrites held p - W, which is no longer in the window).
 * - Entry w is visible iff w < (p+1) div r (a window closing at p is already visible to p).
 * - CSA picks are filtered to live, distinct ids before they enter the gather list.
 * - With runs, no ring slot is written before the attention: row j of a run reads positions of its own run from
 *   the fresh rows, older ones from the ring, which still holds them; ring_write then keeps each run's last W.
 */
#include "opt_common.cuh"
#include "step.cuh"
#include "window_plan.h"

__global__ void step_setup_kernel(dsv4_step_setup_params p)
{
    const int c = blockIdx.x;
    const int64_t pos = p.pos[c];
    const int act = p.active[c];
    if (threadIdx.x == 0) {
        p.ring_slot[c] = act && !p.runs ? (int32_t)(pos % p.window) : -1;
        p.live_csa[c] = act && p.ratio_csa > 0 ? (int32_t)((pos + 1) / p.ratio_csa) : 0;
        p.live_hca[c] = act && p.ratio_hca > 0 ? (int32_t)((pos + 1) / p.ratio_hca) : 0;
    }
    for (int i = threadIdx.x; i < p.rope_pairs; i += blockDim.x) {
        size_t o = (size_t)c * p.rope_pairs + i;
        dsv4_rope_cos_sin(p.inv_main[i], pos, &p.cos_main[o], &p.sin_main[o]);
        dsv4_rope_cos_sin(p.inv_cmp[i], pos, &p.cos_cmp[o], &p.sin_cmp[o]);
    }
}

__global__ void step_index_kernel(dsv4_step_index_params p)
{
    const int c = blockIdx.x, W = p.window, n_idx = W + p.n_extra;
    const int64_t pos = p.pos[c];
    int32_t *out = p.idx + (size_t)c * n_idx;
    for (int j = threadIdx.x; j < n_idx; j += blockDim.x) {
        int32_t v;
        if (j < W) { /* window_plan.h: the ring, or with runs the run's own fresh rows */
            const int64_t t = pos - (W - 1) + j;
            v = dsv4_window_slot(pos, p.run_off ? p.run_off[c] : -1, c, t, W, p.fresh_base);
            DSV4_DEV_CHECK(v < p.fresh_base || (v - p.fresh_base >= 0 && v - p.fresh_base <= c),
                           "row %d position %lld window position %lld: slot %d", c, (long long)pos, (long long)t, v);
        } else if (p.kind == DSV4_STEP_INDEX_CSA) {
            /* a pick must be a live entry and listed once: a repeated id would be attended twice */
            const int32_t *tk = p.topk + (size_t)c * p.n_extra;
            int32_t w = tk[j - W];
            int ok = w >= 0 && w < p.live[c];
            for (int i = 0; ok && i < j - W; i++) ok = tk[i] != w;
            v = ok ? W + w : -1;
        } else {
            int w = j - W;
            v = w < p.live[c] ? W + w : -1;
        }
        out[j] = v;
    }
}

__global__ void ring_write_kernel(dsv4_ring_write_params p)
{
    const int c = blockIdx.x;
    if (!p.active[c] || !dsv4_window_ring_keeps(p.run_off[c], p.run_len[c], p.window)) return; /* a later row wins */
    const int64_t slot = p.pos[c] % p.window;
    const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const char *>(p.fresh) + (size_t)c * p.entry_bytes);
    uint4 *dst = reinterpret_cast<uint4 *>(static_cast<char *>(p.ring) + (size_t)p.seq[c] * p.ring_seq_stride +
                                           (size_t)slot * p.entry_bytes);
    for (int i = threadIdx.x; i < p.entry_bytes / 16; i += blockDim.x) dst[i] = src[i];
}

int dsv4_opt_ring_write(const dsv4_ring_write_params *p)
{
    DSV4_CHECK(p && p->n_rows >= 1 && p->window >= 1 && p->entry_bytes > 0 && p->entry_bytes % 16 == 0 &&
                   p->ring_seq_stride % 16 == 0 && p->pos && p->active && p->seq && p->run_off && p->run_len &&
                   p->fresh && p->ring,
               "ring_write: bad params");
    ring_write_kernel<<<p->n_rows, 64, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("ring_write_kernel");
    return 0;
}

int dsv4_opt_step_setup(const dsv4_step_setup_params *p)
{
    DSV4_CHECK(p && p->n_seq >= 1 && p->window >= 1 && p->pos && p->active && p->ring_slot && p->live_csa &&
               p->live_hca, "step_setup: bad params");
    DSV4_CHECK(p->rope_pairs == 0 || (p->inv_main && p->inv_cmp && p->cos_main && p->sin_main && p->cos_cmp &&
               p->sin_cmp), "step_setup: rope tables are NULL");
    step_setup_kernel<<<p->n_seq, 64, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("step_setup_kernel");
    return 0;
}

int dsv4_opt_step_index(const dsv4_step_index_params *p)
{
    DSV4_CHECK(p && p->n_seq >= 1 && p->window >= 1 && p->n_extra >= 0 && p->pos && p->idx, "step_index: bad params");
    DSV4_CHECK(p->kind == DSV4_STEP_INDEX_WINDOW || (p->kind == DSV4_STEP_INDEX_CSA && p->topk && p->live) ||
               (p->kind == DSV4_STEP_INDEX_HCA && p->live), "step_index: kind %d without its input", (int)p->kind);
    step_index_kernel<<<p->n_seq, 128, 0, p->stream>>>(*p);
    DSV4_LAUNCH_CHECK("step_index_kernel");
    return 0;
}
