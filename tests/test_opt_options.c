/* test_opt_options.c - the optimized path's options (optimized/opt_options.c, one file in the CUDA build and in the
 * build without CUDA):
 * - the defaults are design.md's "all on" (mma, bf16 indexer, cast-free mHC, live context, bf16 caches, weights
 *   auto, no quantize; a long prefill run's grouped experts on 4 lanes, dequantised FP8 GEMMs and tiled mHC
 *   pre), C = 1, graphs
 *   on, and pass dsv4_opt_options_check;
 * - dsv4_opt_options_set takes each switch's two values by their command-line names and refuses others naming
 *   the allowed ones;
 * - dsv4_opt_options_check refuses each field out of range, naming it: n_seq, max_context, n_gpus, dump_seq,
 *   expert_lanes (1 .. 8 pass), and a switch holding no value of its enum (an API caller's int: it ran as the
 *   default of some switches, failed at the first step for others and mixed the mHC variants).
 */
#include <string.h>

#include "dsv4/dsv4_opt.h"
#include "dsv4_test.h"

static void expect_refused(const dsv4_opt_options *o, const char *needle)
{
    int rc = dsv4_opt_options_check(o);
    ck_assert_msg(rc == DSV4_ERR_USAGE, "want DSV4_ERR_USAGE naming '%s', got %d", needle, rc);
    ck_assert_msg(strstr(dsv4_last_error(), needle), "'%s' lacks '%s'", dsv4_last_error(), needle);
}

START_TEST(test_defaults_are_all_on_and_legal)
{
    dsv4_opt_options o;
    memset(&o, 0x5a, sizeof o);
    dsv4_opt_options_default(&o);
    ck_assert_int_eq(o.n_seq, 1);
    ck_assert_int_eq(o.cuda_graph, 1);
    ck_assert_int_eq(o.dump_seq, 0);
    ck_assert_int_eq(o.n_gpus, 0);
    ck_assert_ptr_null(o.follow);
    ck_assert_str_eq(dsv4_opt_attn_name(o.attn), "mma");
    ck_assert_str_eq(dsv4_opt_indexer_name(o.indexer), "bf16");
    ck_assert_str_eq(dsv4_opt_mhc_name(o.mhc), "castfree");
    ck_assert_str_eq(dsv4_opt_index_context_name(o.index_context), "live");
    ck_assert_str_eq(dsv4_opt_kv_name(o.kv), "bf16");
    ck_assert_str_eq(dsv4_opt_weights_name(o.weights), "auto");
    ck_assert_str_eq(dsv4_opt_quantize_name(o.quantize), "none");
    ck_assert_int_eq(o.prefill_experts, DSV4_OPT_PREFILL_EXPERTS_GROUPED);
    ck_assert_int_eq(o.prefill_linears, DSV4_OPT_PREFILL_LINEARS_GEMM);
    ck_assert_int_eq(o.expert_lanes, 4);
    ck_assert_int_eq(o.prefill_mhc, DSV4_OPT_PREFILL_MHC_TILED);
    ck_assert_int_eq(dsv4_opt_options_check(&o), 0);
}
END_TEST

START_TEST(test_set_takes_each_switch_by_name)
{
    static const char *const sw[][3] = {{"attn", "mma", "simt"},           {"indexer", "bf16", "fp32"},
                                        {"mhc", "castfree", "roundtrip"},  {"index-context", "live", "max"},
                                        {"kv", "bf16", "fp8"},             {"quantize", "none", "fp8"}};
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
        dsv4_opt_options o;
        dsv4_opt_options_default(&o);
        ck_assert_int_eq(dsv4_opt_options_set(&o, sw[i][0], sw[i][2]), 0);
        const char *now = i == 0   ? dsv4_opt_attn_name(o.attn)
                          : i == 1 ? dsv4_opt_indexer_name(o.indexer)
                          : i == 2 ? dsv4_opt_mhc_name(o.mhc)
                          : i == 3 ? dsv4_opt_index_context_name(o.index_context)
                          : i == 4 ? dsv4_opt_kv_name(o.kv)
                                   : dsv4_opt_quantize_name(o.quantize);
        ck_assert_str_eq(now, sw[i][2]);
        ck_assert_int_eq(dsv4_opt_options_check(&o), 0);
        ck_assert_int_eq(dsv4_opt_options_set(&o, sw[i][0], sw[i][1]), 0);
        ck_assert_int_eq(dsv4_opt_options_set(&o, sw[i][0], "naive"), DSV4_ERR_USAGE);
        ck_assert_msg(strstr(dsv4_last_error(), sw[i][1]) && strstr(dsv4_last_error(), sw[i][2]), "%s",
                      dsv4_last_error());
    }
    dsv4_opt_options o;
    dsv4_opt_options_default(&o);
    ck_assert_int_eq(dsv4_opt_options_set(&o, "weights", "fp8"), 0);
    ck_assert_str_eq(dsv4_opt_weights_name(o.weights), "fp8");
    ck_assert_int_eq(dsv4_opt_options_set(&o, "weights", "auto"), 0);
    ck_assert_str_eq(dsv4_opt_weights_name(o.weights), "auto");
    ck_assert_int_eq(dsv4_opt_options_set(&o, "weights", "bf16"), 0);
    ck_assert_str_eq(dsv4_opt_weights_name(o.weights), "bf16");
    ck_assert_int_eq(dsv4_opt_options_set(&o, "weights", "fp4"), DSV4_ERR_USAGE);
    /* every value it takes, auto too (the message once said "want bf16 or fp8") */
    ck_assert_msg(strstr(dsv4_last_error(), "--weights 'fp4': want auto, bf16 or fp8"), "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_opt_options_set(&o, "attention", "mma"), DSV4_ERR_USAGE);
    ck_assert_msg(strstr(dsv4_last_error(), "unknown switch 'attention'"), "%s", dsv4_last_error());
}
END_TEST

START_TEST(test_check_names_the_field_out_of_range)
{
    dsv4_opt_options d, o;
    dsv4_opt_options_default(&d);
    o = d, o.n_seq = 0;
    expect_refused(&o, "n_seq 0");
    o = d, o.n_seq = DSV4_OPT_MAX_SEQ + 1;
    expect_refused(&o, "n_seq 4097");
    o = d, o.n_seq = DSV4_OPT_MAX_SEQ, o.dump_seq = DSV4_OPT_MAX_SEQ - 1;
    ck_assert_int_eq(dsv4_opt_options_check(&o), 0);
    o = d, o.max_context = 0;
    expect_refused(&o, "max_context 0");
    o = d, o.max_context = DSV4_OPT_MAX_CONTEXT + 1;
    expect_refused(&o, "max_context 1048577");
    o = d, o.max_context = DSV4_OPT_MAX_CONTEXT;
    ck_assert_int_eq(dsv4_opt_options_check(&o), 0);
    o = d, o.n_gpus = -1;
    expect_refused(&o, "n_gpus -1");
    o = d, o.n_gpus = 65;
    expect_refused(&o, "n_gpus 65");
    o = d, o.n_seq = 2, o.dump_seq = 2;
    expect_refused(&o, "dump_seq 2");
    o = d, o.attn = (dsv4_opt_attn)2;
    expect_refused(&o, "options.attn = 2");
    o = d, o.indexer = (dsv4_opt_indexer)-1;
    expect_refused(&o, "options.indexer = -1");
    o = d, o.mhc = (dsv4_opt_mhc)2;
    expect_refused(&o, "options.mhc = 2");
    o = d, o.index_context = (dsv4_opt_index_context)2;
    expect_refused(&o, "options.index_context = 2");
    o = d, o.kv = (dsv4_opt_kv)2;
    expect_refused(&o, "options.kv = 2");
    o = d, o.weights = (dsv4_opt_weights)3;
    expect_refused(&o, "options.weights = 3");
    o = d, o.quantize = (dsv4_opt_quantize)2;
    expect_refused(&o, "options.quantize = 2");
    o = d, o.prefill_experts = (dsv4_opt_prefill_experts)2;
    expect_refused(&o, "options.prefill_experts = 2");
    o = d, o.prefill_linears = (dsv4_opt_prefill_linears)2;
    expect_refused(&o, "options.prefill_linears = 2");
    o = d, o.prefill_mhc = (dsv4_opt_prefill_mhc)2;
    expect_refused(&o, "options.prefill_mhc = 2");
    o = d, o.prefill_mhc = (dsv4_opt_prefill_mhc)-1;
    expect_refused(&o, "options.prefill_mhc = -1");
    o = d, o.prefill_experts = DSV4_OPT_PREFILL_EXPERTS_DECODE, o.prefill_linears = DSV4_OPT_PREFILL_LINEARS_KERNEL;
    o.prefill_mhc = DSV4_OPT_PREFILL_MHC_ROWS;
    ck_assert_int_eq(dsv4_opt_options_check(&o), 0);
    o = d, o.expert_lanes = 0;
    expect_refused(&o, "expert_lanes 0");
    o = d, o.expert_lanes = DSV4_OPT_MAX_EXPERT_LANES + 1;
    expect_refused(&o, "expert_lanes 9");
    for (int n = 1; n <= DSV4_OPT_MAX_EXPERT_LANES; n++) {
        o = d, o.expert_lanes = n;
        ck_assert_int_eq(dsv4_opt_options_check(&o), 0);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("opt_options");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_defaults_are_all_on_and_legal);
    tcase_add_test(tc, test_set_takes_each_switch_by_name);
    tcase_add_test(tc, test_check_names_the_field_out_of_range);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
