/* compressor_plan.h - where a compressor's inputs live when a step feeds a sequence a RUN of tokens p0..p1 at
 * once (a prefill chunk) instead of one (model-spec §7, §12); plain C (host and device), so the CPU test
 * (tests/test_opt_prefill_plan.c) checks it against the reference's own per-token state machine
 * (reference/ref_compressor.c), where no GPU is.
 *
 * The per-token machine keeps (kv, gate + ape) rows: HCA row p mod r; CSA row r + p mod r (the current window)
 * and rows 0..r-1 (the previous window, moved there when a window closes). A run computes every entry that
 * closes inside it from its sources directly, then rewrites the state to what the per-token machine would hold
 * after p1. Both read the same fp32 values in the same order, so a run gives the per-token entries and state
 * bit for bit:
 *   - entry w pools slots i = 0 .. (overlap ? 2r : r) - 1 at positions dsv4_cmp_slot_pos(w, i);
 *   - a source position q >= p0 is the run's own projection row q - p0; q < 0 is an empty slot (kv 0, gate -inf,
 *     what a fresh state holds); 0 <= q < p0 is state row dsv4_cmp_state_row(q, p0);
 *   - after the run, state row `row` is what dsv4_cmp_carry says.
 */
#ifndef DSV4_KERNELS_COMPRESSOR_PLAN_H
#define DSV4_KERNELS_COMPRESSOR_PLAN_H

#include <stdint.h>

#ifdef __CUDACC__
#define DSV4_CMP_FN static __host__ __device__ __forceinline__
#else
#define DSV4_CMP_FN static inline
#endif

/* The position slot i of entry w pools (CSA: a-halves of window w-1 for i < r, b-halves of window w after;
 * HCA: window w). May be negative (CSA, w = 0): an empty slot. */
DSV4_CMP_FN int64_t dsv4_cmp_slot_pos(int64_t w, int i, int r, int overlap)
{
    return overlap ? (i < r ? (int64_t)r * (w - 1) + i : (int64_t)r * w + (i - r)) : (int64_t)r * w + i;
}

/* The state row holding position q (0 <= q < p0) before a run that starts at p0: the sources of an entry that
 * closes in the run lie in the window of p0 (current rows) or the one before it (CSA: previous rows). */
DSV4_CMP_FN int dsv4_cmp_state_row(int64_t q, int64_t p0, int r, int overlap)
{
    const int slot = (int)(q % r);
    if (!overlap) return slot;
    return q / r == p0 / r ? r + slot : slot;
}

enum { DSV4_CMP_KEEP = 0, DSV4_CMP_FROM_RUN = 1, DSV4_CMP_FROM_STATE = 2 };

/* What state row `row` holds after a run p0..p1 (p0 <= p1), as the per-token machine leaves it:
 *   DSV4_CMP_KEEP        unchanged;
 *   DSV4_CMP_FROM_RUN    position *src (p0 <= *src <= p1) of the run;
 *   DSV4_CMP_FROM_STATE  the OLD state row *src (CSA: the previous rows take a window that started before p0
 *                        and closed inside the run; read every old row before writing any).
 * Current rows (HCA: all; CSA: r + j) hold the latest position <= p1 of their slot j; the CSA previous row j holds
 * slot j of the last window that closed at or before p1, when that close happened inside the run. */
DSV4_CMP_FN int dsv4_cmp_carry(int64_t p0, int64_t p1, int r, int overlap, int row, int64_t *src)
{
    if (!overlap || row >= r) {
        const int j = overlap ? row - r : row;
        const int64_t q = p1 - (((p1 - j) % r) + r) % r; /* the latest q <= p1 with q mod r == j */
        if (q < p0) return DSV4_CMP_KEEP;
        *src = q;
        return DSV4_CMP_FROM_RUN;
    }
    const int64_t pc = ((p1 + 1) / r) * r - 1; /* the last closing position <= p1 */
    if (pc < p0) return DSV4_CMP_KEEP;
    const int64_t q = pc - (r - 1) + row;
    if (q >= p0) {
        *src = q;
        return DSV4_CMP_FROM_RUN;
    }
    *src = r + row; /* the closed window began before the run: its early slots were current rows */
    return DSV4_CMP_FROM_STATE;
}

#endif /* DSV4_KERNELS_COMPRESSOR_PLAN_H */
