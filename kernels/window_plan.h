/* window_plan.h - where a row's window entries live in a step with runs (step.cuh), plain C (host and device), so
 * the CPU test (tests/test_opt_prefill_plan.c) checks the rule against the one-token window where no GPU is.
 *
 * The ring holds W entries per sequence, slot = position mod W. A run of n tokens p0..p0+n-1 must not write the
 * ring before its rows attend (row p0 still reads p0 - W + 1, whose slot p0 + 1 would overwrite), so its window KV
 * goes to fresh rows, row r of the step holding position p0 + (r - first row of the run).
 */
#ifndef DSV4_KERNELS_WINDOW_PLAN_H
#define DSV4_KERNELS_WINDOW_PLAN_H

#include <stdint.h>

#ifdef __CUDACC__
#define DSV4_WIN_FN static __host__ __device__ __forceinline__
#else
#define DSV4_WIN_FN static inline
#endif

/* The gather slot of window position t (p - W < t <= p) for the step's row `row` at position p, run_off rows
 * into its run (-1 when the ring serves every position: a decode step): -1 before position 0; the fresh row of
 * the run for t >= p0 = p - run_off (slot fresh_base + that row); else the ring slot t mod W, which still holds t
 * (the ring was last written up to p0 - 1 and t > p - W >= p0 - W). */
DSV4_WIN_FN int32_t dsv4_window_slot(int64_t p, int run_off, int row, int64_t t, int W, int32_t fresh_base)
{
    if (t < 0) return -1;
    if (run_off >= 0 && t >= p - run_off) return fresh_base + (int32_t)(row - (p - t));
    return (int32_t)(t % W);
}

/* After the attention: a run's row run_off of run_len goes into the ring iff it is among the run's last W. */
DSV4_WIN_FN int dsv4_window_ring_keeps(int run_off, int run_len, int W) { return run_len - 1 - run_off < W; }

#endif /* DSV4_KERNELS_WINDOW_PLAN_H */
