/* test_fp4_layout.c - the FP4 expert kernel's bit layout (kernels/fp4_layout.h), on the CPU:
 * - the repack is a permutation of the 32 bits of a word (every target position written once) and unpack undoes
 *   it, for random words and for every single bit;
 * - on a repacked word, each of the kernel's four pair extractions gives exactly the bf16x2 the checkpoint-layout
 *   extraction gives on the original word, for random words, for every code in every nibble (the other nibbles
 *   random), and for the all-zero and all-one words;
 * - the extraction fails on a word that was not repacked (the layouts differ, so a missed repack cannot pass).
 */
#include <stdio.h>

#include "../kernels/fp4_layout.h"
#include "dsv4_test.h"

static uint64_t rs = 0x5eed;
static uint32_t rnd(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rs >> 32);
}

static void check_word(uint32_t w)
{
    const uint32_t r = dsv4_fp4_repack_word(w);
    ck_assert_msg(dsv4_fp4_unpack_word(r) == w, "word %08x: unpack(repack) = %08x", w, dsv4_fp4_unpack_word(r));
    for (int J = 0; J < 4; J++)
        ck_assert_msg(dsv4_fp4_pair_repacked(r, J) == dsv4_fp4_pair_plain(w, J),
                      "word %08x pair %d: repacked %08x, checkpoint layout %08x", w, J, dsv4_fp4_pair_repacked(r, J),
                      dsv4_fp4_pair_plain(w, J));
}

START_TEST(test_permutation)
{
    uint32_t seen = 0;
    for (int b = 0; b < 32; b++) {
        const uint32_t r = dsv4_fp4_repack_word(1u << b);
        ck_assert_msg(r && !(r & (r - 1)), "bit %d goes to %08x, not one bit", b, r);
        ck_assert_msg(!(seen & r), "bit %d lands where another bit did (%08x)", b, r);
        seen |= r;
        ck_assert_uint_eq(dsv4_fp4_unpack_word(r), 1u << b);
    }
    ck_assert_uint_eq(seen, 0xffffffffu);
}
END_TEST

START_TEST(test_pairs_match)
{
    check_word(0), check_word(0xffffffffu);
    for (int i = 0; i < 1000000; i++) check_word(rnd());
    for (int nib = 0; nib < 8; nib++)
        for (uint32_t code = 0; code < 16; code++)
            for (int i = 0; i < 64; i++) check_word((rnd() & ~(0xfu << 4 * nib)) | code << 4 * nib);
}
END_TEST

START_TEST(test_unrepacked_fails)
{
    int differ = 0;
    for (int i = 0; i < 1000; i++) {
        const uint32_t w = rnd();
        for (int J = 0; J < 4; J++) differ += dsv4_fp4_pair_repacked(w, J) != dsv4_fp4_pair_plain(w, J);
    }
    ck_assert_msg(differ > 3000, "only %d of 4000 pairs differ without the repack", differ);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fp4_layout");
    TCase *tc = tcase_create("layout");
    tcase_add_test(tc, test_permutation);
    tcase_add_test(tc, test_pairs_match);
    tcase_add_test(tc, test_unrepacked_fails);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
