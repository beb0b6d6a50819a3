/* test_kv_layout.c - the --kv fp8 cache entry (kernels/kv_layout.h), on the CPU:
 * - the sizes the memory plans and the attention kernels rely on: Flash 592 bytes, tiny 48, topk512 32;
 * - for every supported shape up to d = 1024: the three parts (bf16 rope, e4m3 codes, ue8m0 scales) lie in that
 *   order without overlap or gap, the codes start 8-byte aligned (the kernels load 8 at a time), the entry is the
 *   parts rounded up to 16 bytes (cp.async moves 16-byte chunks), and a 64-channel block has one scale byte;
 * - the shapes the layout cannot hold are refused: rope or nope channels not in 8s, no nope channels.
 */
#include <stdio.h>

#include "../kernels/kv_layout.h"
#include "dsv4_test.h"

START_TEST(test_known_sizes)
{
    ck_assert_int_eq(dsv4_kv8_entry_bytes(512, 64), 592); /* Flash: 128 + 448 + 7, padded */
    ck_assert_int_eq(dsv4_kv8_entry_bytes(32, 8), 48);    /* golden/tiny: 16 + 24 + 1 */
    ck_assert_int_eq(dsv4_kv8_entry_bytes(16, 8), 32);    /* golden/topk512: 16 + 8 + 1 */
    ck_assert_int_eq(dsv4_kv8_entry_bytes(160, 32), 208); /* tests/gpu/test_opt_kernels.cu's writer case */
    ck_assert_int_eq(dsv4_kv8_scales(448), 7);
    ck_assert_int_eq(dsv4_kv8_scales(24), 1);
    ck_assert_int_eq(dsv4_kv8_scales(64), 1);
    ck_assert_int_eq(dsv4_kv8_scales(65), 2);
}
END_TEST

START_TEST(test_parts_in_order)
{
    int shapes = 0;
    for (int d = 8; d <= 1024; d += 8)
        for (int rope = 0; rope < d; rope += 8) {
            ck_assert_msg(dsv4_kv8_shape_ok(d, rope), "d %d rope %d refused", d, rope);
            const int nope = d - rope, codes = dsv4_kv8_codes_at(rope), scales = dsv4_kv8_scales_at(d, rope);
            const int64_t eb = dsv4_kv8_entry_bytes(d, rope);
            const int raw = scales + dsv4_kv8_scales(nope);
            ck_assert_msg(codes == 2 * rope && codes % 8 == 0, "d %d rope %d: codes at %d", d, rope, codes);
            ck_assert_msg(scales == codes + nope, "d %d rope %d: scales at %d, codes end at %d", d, rope, scales,
                          codes + nope);
            ck_assert_msg(eb % 16 == 0 && eb >= raw && eb < raw + 16, "d %d rope %d: %lld bytes for %d", d, rope,
                          (long long)eb, raw);
            ck_assert_msg(dsv4_kv8_scales(nope) * DSV4_KV8_BLOCK >= nope &&
                              (dsv4_kv8_scales(nope) - 1) * DSV4_KV8_BLOCK < nope,
                          "d %d rope %d: %d scales for %d codes", d, rope, dsv4_kv8_scales(nope), nope);
            shapes++;
        }
    ck_assert_int_eq(shapes, 128 * 129 / 2);
}
END_TEST

START_TEST(test_refused_shapes)
{
    ck_assert(!dsv4_kv8_shape_ok(64, 64));  /* no nope channels */
    ck_assert(!dsv4_kv8_shape_ok(64, 12));  /* rope not in 8s */
    ck_assert(!dsv4_kv8_shape_ok(60, 16));  /* nope 44: not in 8s */
    ck_assert(!dsv4_kv8_shape_ok(64, -8));
    ck_assert(!dsv4_kv8_shape_ok(32, 40));  /* rope wider than the head */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_layout");
    TCase *tc = tcase_create("layout");
    tcase_add_test(tc, test_known_sizes);
    tcase_add_test(tc, test_parts_in_order);
    tcase_add_test(tc, test_refused_shapes);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
