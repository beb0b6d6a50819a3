/* sparse_attn_plan.h - the work split of the mma sparse-attention kernel (sparse_attn.cu, part 1): host arithmetic
 * only, plain C, so the CPU tests (tests/test_attn_split_plan.c) check it where no GPU is.
 *
 * A block takes a run of tiles (DSV4_ATTN_TILE entries each) of one sequence for one head group. With
 * n_split > 1 the entries are cut into n_split runs and a combine kernel merges the partials. The plan
 * minimises waves x (tiles per split + a split's fixed work), where the fixed work is what every block does
 * besides streaming its tiles: load the head group's Q, and with a split write its partial output and have the
 * combine read it back. Counted in tiles: Q is hg·d bf16 and the partial hg·d f32 twice, against a tile of
 * DSV4_ATTN_TILE·d bf16, so 10·hg / (2·DSV4_ATTN_TILE) tiles. Without that term the plan took the longest HCA
 * lists (a 1M-position pool: 260 tiles) at C = 64 as 260 splits of one tile each (127 waves, a 2.1 GB
 * workspace, 0.8% fewer "tile waves" than 2 splits): the term keeps splits only where they fill idle SMs.
 *
 * The plan depends only on the shapes and the SM count, never on timing, so a run is bitwise reproducible.
 */
#ifndef DSV4_KERNELS_SPARSE_ATTN_PLAN_H
#define DSV4_KERNELS_SPARSE_ATTN_PLAN_H

#include <stdint.h>

enum { DSV4_ATTN_TILE = 32 };

/* A split's fixed work in tiles, for a head group of head_group heads (rounded up). */
static inline int64_t dsv4_attn_split_overhead_tiles(int head_group)
{
    return (10 * (int64_t)head_group + 2 * DSV4_ATTN_TILE - 1) / (2 * DSV4_ATTN_TILE);
}

/* The split of n_tiles tiles for blocks0 = sequences x head groups blocks on sms SMs: *n_split runs of
 * *tiles_per_split tiles (the last may be shorter, none empty). n_tiles, blocks0, sms >= 1. */
static inline void dsv4_attn_choose_split(int64_t blocks0, int n_tiles, int sms, int head_group, int *n_split,
                                          int *tiles_per_split)
{
    const int64_t overhead = dsv4_attn_split_overhead_tiles(head_group);
    int best = 1;
    int64_t best_cost = INT64_MAX;
    for (int ns = 1; ns <= n_tiles; ns++) {
        const int tps = (n_tiles + ns - 1) / ns;
        if ((n_tiles + tps - 1) / tps != ns) continue; /* the same runs as a smaller split */
        const int64_t waves = (blocks0 * ns + sms - 1) / sms;
        const int64_t cost = waves * (tps + overhead);
        if (cost < best_cost) {
            best_cost = cost;
            best = ns;
        }
    }
    *n_split = best;
    *tiles_per_split = (n_tiles + best - 1) / best;
}

#endif /* DSV4_KERNELS_SPARSE_ATTN_PLAN_H */
