/* test_opt_shard_plan.c - the plan of `--gpus N` (dsv4_ref_shard_plan, reference/ref_shard.h), which the
 * optimized path's NCCL ranks check before any device work (docs/multigpu.md §2, §5):
 * - Flash's counts (64 heads, 8 output groups, 64 indexer heads, 256 experts, width 2048): N = 1, 2, 4, 8 plan,
 *   and the ranks' ranges tile every split quantity exactly (disjoint, in rank order, heads = whole groups);
 * - golden/tiny (6 heads, 2 groups, 16 indexer heads, 8 experts, width 32): N = 1, 2 plan, N = 3 does not;
 * - an N that does not divide is DSV4_ERR_USAGE naming each quantity it does not divide and only those;
 * - fewer devices than N is DSV4_ERR_USAGE naming both numbers; N outside 1..64 is DSV4_ERR_USAGE;
 * - --weights fp8 (dsv4_ref_shard_check_blocks): Flash's FP8 slices lie on 128 scale blocks for N = 1, 2, 4, 8;
 *   golden/tiny's do at N = 1 only (N = 2 is refused naming the tensor and N); an indivisible N is the plan's error.
 */
#include <stdio.h>
#include <string.h>

#include "../reference/ref_shard.h"
#include "dsv4_test.h"

static dsv4_config flash_counts(void)
{
    dsv4_config c;
    memset(&c, 0, sizeof c);
    c.num_attention_heads = 64, c.o_groups = 8, c.index_n_heads = 64, c.n_routed_experts = 256;
    c.moe_intermediate_size = 2048;
    c.head_dim = 512, c.index_head_dim = 128, c.o_lora_rank = 1024;
    return c;
}

/* Every split range of the N parts tiles [0, total) in rank order; heads are the heads of the groups. */
static void check_tiling(const dsv4_config *c, const dsv4_ref_shard_part *p, int N)
{
    int h = 0, g = 0, hi = 0, e = 0, i = 0;
    const int hpg = c->num_attention_heads / c->o_groups;
    for (int r = 0; r < N; r++) {
        ck_assert_int_eq(p[r].rank, r);
        ck_assert_int_eq(p[r].n_shards, N);
        ck_assert_msg(p[r].h0 == h && p[r].g0 == g && p[r].hi0 == hi && p[r].e0 == e && p[r].i0 == i,
                      "N %d rank %d: ranges do not continue the previous rank's", N, r);
        ck_assert_msg(p[r].nh > 0 && p[r].ng > 0 && p[r].nhi > 0 && p[r].ne > 0 && p[r].ni > 0,
                      "N %d rank %d: an empty range", N, r);
        ck_assert_msg(p[r].h0 == p[r].g0 * hpg && p[r].nh == p[r].ng * hpg, "N %d rank %d: heads [%d, +%d) are not "
                      "its groups [%d, +%d)", N, r, p[r].h0, p[r].nh, p[r].g0, p[r].ng);
        h += p[r].nh, g += p[r].ng, hi += p[r].nhi, e += p[r].ne, i += p[r].ni;
    }
    ck_assert_int_eq(h, c->num_attention_heads);
    ck_assert_int_eq(g, c->o_groups);
    ck_assert_int_eq(hi, c->index_n_heads);
    ck_assert_int_eq(e, c->n_routed_experts);
    ck_assert_int_eq(i, c->moe_intermediate_size);
}

START_TEST(test_flash_plans)
{
    dsv4_config c = flash_counts();
    dsv4_ref_shard_part p[DSV4_REF_SHARD_MAX];
    for (int N = 1; N <= 8; N *= 2) {
        memset(p, 0xff, sizeof p);
        ck_assert_msg(dsv4_ref_shard_plan(&c, N, 8, p) == 0, "N %d: %s", N, dsv4_last_error());
        check_tiling(&c, p, N);
    }
    ck_assert_int_eq(p[7].e0, 224);
    ck_assert_int_eq(p[7].ne, 32);
    ck_assert_int_eq(p[3].i0, 768);
    ck_assert_int_eq(p[3].ni, 256);
    ck_assert_int_eq(p[5].h0, 40);
    ck_assert_int_eq(p[5].g0, 5);
    ck_assert_msg(dsv4_ref_shard_plan(&c, 8, 8, NULL) == 0, "%s", dsv4_last_error());
}
END_TEST

START_TEST(test_indivisible)
{
    dsv4_config c = flash_counts();
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 16, 16, NULL), DSV4_ERR_USAGE); /* 16 | 64, 256, 2048; not 8 */
    const char *e = dsv4_last_error();
    ck_assert_msg(strstr(e, "N = 16") && strstr(e, "o_groups = 8") && !strstr(e, "num_attention_heads") &&
                      !strstr(e, "n_routed_experts"), "%s", e);
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 3, 8, NULL), DSV4_ERR_USAGE);
    e = dsv4_last_error();
    ck_assert_msg(strstr(e, "num_attention_heads = 64") && strstr(e, "o_groups = 8") &&
                      strstr(e, "index_n_heads = 64") && strstr(e, "n_routed_experts = 256") &&
                      strstr(e, "moe_intermediate_size = 2048"), "%s", e);
    /* the model's numbers are checked before the machine's */
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 3, 1, NULL), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "does not divide"), "%s", dsv4_last_error());
    c.index_n_heads = 12; /* 4 | 64, 8, 256, 2048, not 12 */
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 8, 8, NULL), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "index_n_heads = 12") && !strstr(dsv4_last_error(), "o_groups"), "%s",
                  dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 4, 8, NULL), 0);
}
END_TEST

START_TEST(test_devices_and_range)
{
    dsv4_config c = flash_counts();
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 2, 1, NULL), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "--gpus 2: this machine has 1 CUDA device") &&
                      !strstr(dsv4_last_error(), "devices"), "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 8, 4, NULL), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "--gpus 8: this machine has 4 CUDA devices"), "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 1, 0, NULL), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "has 0 CUDA devices"), "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 0, 8, NULL), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, -2, 8, NULL), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_ref_shard_plan(&c, 65, 128, NULL), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "--gpus 65"), "%s", dsv4_last_error());
}
END_TEST

START_TEST(test_golden_tiny)
{
    dsv4_model *m = NULL;
    ck_assert_msg(dsv4_model_open(dsv4_test_source_path("golden/tiny"), &m) == 0, "%s", dsv4_last_error());
    const dsv4_config *c = dsv4_model_config(m);
    dsv4_ref_shard_part p[2];
    for (int N = 1; N <= 2; N++) {
        ck_assert_msg(dsv4_ref_shard_plan(c, N, 2, p) == 0, "N %d: %s", N, dsv4_last_error());
        check_tiling(c, p, N);
    }
    ck_assert_int_eq(dsv4_ref_shard_plan(c, 3, 4, NULL), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "o_groups = 2") && !strstr(dsv4_last_error(), "num_attention_heads"),
                  "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_plan(c, 2, 1, NULL), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "this machine has 1 CUDA device"), "%s", dsv4_last_error());
    dsv4_model_free(m);
}
END_TEST

START_TEST(test_fp8_blocks)
{
    dsv4_config c = flash_counts();
    for (int N = 1; N <= 8; N *= 2)
        ck_assert_msg(dsv4_ref_shard_check_blocks(&c, N, 128) == 0, "Flash N %d: %s", N, dsv4_last_error());
    /* per rank at N = 8: wq_b 4096 rows, indexer wq_b 1024, wo_a / wo_b 1024, shared 256: all whole blocks */
    ck_assert_int_eq(dsv4_ref_shard_check_blocks(&c, 3, 128), DSV4_ERR_USAGE); /* the plan's message */
    ck_assert_msg(strstr(dsv4_last_error(), "does not divide"), "%s", dsv4_last_error());
    c.moe_intermediate_size = 2048 + 64 * 8; /* 2560 / 8 = 320 shared columns per rank: not on a 128 block */
    ck_assert_int_eq(dsv4_ref_shard_check_blocks(&c, 8, 128), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "--gpus 8 --weights fp8") &&
                      strstr(dsv4_last_error(), "shared_experts.w1") && strstr(dsv4_last_error(), "320 rows"),
                  "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_check_blocks(&c, 2, 128), 0); /* 1280 per rank */
    ck_assert_int_eq(dsv4_ref_shard_check_blocks(&c, 1, 128), 0); /* N = 1: every slice is the whole tensor */

    dsv4_model *m = NULL;
    ck_assert_msg(dsv4_model_open(dsv4_test_source_path("golden/tiny"), &m) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_shard_check_blocks(dsv4_model_config(m), 1, 128), 0);
    ck_assert_int_eq(dsv4_ref_shard_check_blocks(dsv4_model_config(m), 2, 128), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "--gpus 2 --weights fp8") && strstr(dsv4_last_error(), "layers.*.attn."),
                  "%s", dsv4_last_error());
    dsv4_model_free(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("opt_shard_plan");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, test_flash_plans);
    tcase_add_test(tc, test_indivisible);
    tcase_add_test(tc, test_devices_and_range);
    tcase_add_test(tc, test_golden_tiny);
    tcase_add_test(tc, test_fp8_blocks);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
