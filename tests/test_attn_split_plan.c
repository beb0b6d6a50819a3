/* test_attn_split_plan.c - the work split of the mma sparse-attention kernel (kernels/sparse_attn_plan.h), host
 * arithmetic the CPU can check:
 * - the regression: Flash's longest HCA list (1M positions / 128 + the 128-entry window = 260 tiles) at C = 64 on
 *   an H200 (132 SMs) used to be cut into 260 one-tile splits (127 waves; a 2.1 GB partials workspace the bench's
 *   memory plan did not count, so `dsv4 bench --layers auto --weights fp8` ran out of memory at C = 64). It must
 *   take a few splits now, with a workspace of a few MiB;
 * - the shapes the committed bench rows ran with (C = 1, 16, 64; the CSA list of 640 entries, the HCA lists of
 *   4K and 32K live positions) keep the splits they had, so those numbers still describe this code;
 * - C = 1 with at most one tile per SM splits into one tile per block (the latency case);
 * - over a sweep of shapes and SM counts: the runs are valid (none empty, they cover the tiles), and a split that
 *   queues blocks (more than one wave) gives each block more than one tile and more tiles than its fixed work.
 */
#include <stdio.h>

#include "../kernels/sparse_attn_plan.h"
#include "dsv4_test.h"

enum { FLASH_H = 64, FLASH_D = 512, FLASH_W = 128, H200_SMS = 132 };

static int tiles_of(int n_idx) { return (n_idx + DSV4_ATTN_TILE - 1) / DSV4_ATTN_TILE; }

/* The kernel's partials for a split: [C, n_split, H, d] f32 plus (max, sum) per row; 0 without a split. */
static double workspace_mib(int C, int n_split)
{
    return n_split > 1 ? (double)C * n_split * FLASH_H * (FLASH_D + 2) * 4 / (1 << 20) : 0.0;
}

START_TEST(test_flash_longest_hca_list)
{
    const int nt = tiles_of(FLASH_W + (1 << 20) / 128);
    ck_assert_int_eq(nt, 260);
    for (int C = 1; C <= 64; C *= 4) {
        int ns = 0, tps = 0;
        dsv4_attn_choose_split(C, nt, H200_SMS, 64, &ns, &tps);
        printf("attn split: C=%-2d %d tiles -> %d splits of %d tiles, workspace %.1f MiB\n", C, nt, ns, tps,
               workspace_mib(C, ns));
        ck_assert_msg(workspace_mib(C, ns) <= 32.0, "C %d: %d splits need %.1f MiB of partials", C, ns,
                      workspace_mib(C, ns));
    }
    int ns = 0, tps = 0;
    dsv4_attn_choose_split(64, nt, H200_SMS, 64, &ns, &tps);
    ck_assert_msg(ns <= 4 && tps >= 65, "C 64: %d splits of %d tiles (was 260 of 1)", ns, tps);
}
END_TEST

START_TEST(test_bench_shapes_keep_their_splits)
{
    /* {C, entries, splits}: the CSA list (window + top-512), the HCA lists at 4K and 32K live positions */
    static const int want[][3] = {
        {1, 640, 20}, {1, 160, 5}, {1, 384, 12},  {16, 640, 7}, {16, 160, 5},
        {16, 384, 6}, {64, 640, 2}, {64, 160, 2}, {64, 384, 2},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int ns = 0, tps = 0;
        dsv4_attn_choose_split(want[i][0], tiles_of(want[i][1]), H200_SMS, 64, &ns, &tps);
        ck_assert_msg(ns == want[i][2], "C %d, %d entries: %d splits, the bench rows ran with %d", want[i][0],
                      want[i][1], ns, want[i][2]);
    }
}
END_TEST

START_TEST(test_one_sequence_fills_the_sms)
{
    for (int nt = 1; nt <= H200_SMS; nt++) {
        int ns = 0, tps = 0;
        dsv4_attn_choose_split(1, nt, H200_SMS, 64, &ns, &tps);
        ck_assert_msg(ns == nt && tps == 1, "C 1, %d tiles: %d splits of %d", nt, ns, tps);
    }
}
END_TEST

START_TEST(test_sweep_properties)
{
    static const int sms_list[] = {16, 84, 132, 170, 188}, hg_list[] = {16, 32, 48, 64};
    static const int extra_blocks[] = {96, 128, 200, 256}, extra_tiles[] = {100, 128, 260, 513, 1000};
    int checked = 0;
    for (size_t si = 0; si < sizeof sms_list / sizeof sms_list[0]; si++)
        for (size_t hi = 0; hi < sizeof hg_list / sizeof hg_list[0]; hi++)
            for (int bi = 1; bi <= 70 + 4; bi++)
                for (int ti = 1; ti <= 80 + 5; ti++) {
                    const int sms = sms_list[si], hg = hg_list[hi];
                    const int64_t b0 = bi <= 70 ? bi : extra_blocks[bi - 71];
                    const int nt = ti <= 80 ? ti : extra_tiles[ti - 81];
                    int ns = 0, tps = 0;
                    dsv4_attn_choose_split(b0, nt, sms, hg, &ns, &tps);
                    ck_assert_msg(ns >= 1 && ns <= nt && tps >= 1 && (int64_t)(ns - 1) * tps < nt &&
                                      (int64_t)ns * tps >= nt,
                                  "blocks %lld, %d tiles: %d runs of %d", (long long)b0, nt, ns, tps);
                    if (ns > 1 && b0 * ns > sms)
                        ck_assert_msg(tps > 1 && tps > dsv4_attn_split_overhead_tiles(hg),
                                      "blocks %lld, %d tiles, %d SMs, head group %d: %d splits queue blocks "
                                      "(%lld > %d) with %d tiles each, not more than their fixed work (%lld)",
                                      (long long)b0, nt, sms, hg, ns, (long long)(b0 * ns), sms, tps,
                                      (long long)dsv4_attn_split_overhead_tiles(hg));
                    checked++;
                }
    printf("attn split: %d plans checked\n", checked);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attn_split_plan");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, test_flash_longest_hca_list);
    tcase_add_test(tc, test_bench_shapes_keep_their_splits);
    tcase_add_test(tc, test_one_sequence_fills_the_sms);
    tcase_add_test(tc, test_sweep_properties);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
