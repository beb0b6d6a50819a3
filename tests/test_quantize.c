/* test_quantize.c - the load-time quantisers of model/quant.c (model-spec §2, §3): e4m3 and e2m1 scalar rounding
 * (every code round-trips, midpoints go to the even code, saturation, signed zero), the FP8 128x128 block and
 * FP4 per-32 scale rules on odd shapes (257 x 300: partial blocks), the round-trip error bound (half a step of
 * the code grid at each value), the nibble order read back through model/dtype.c's dequantisation (a file
 * written with the quantised tensors and read by the loader), and byte identity with golden/tiny-fp8, whose
 * codes golden/make_golden.py computed from the golden/tiny weights with the same rules. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4_test.h"
#include "st_writer.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static float urand(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

START_TEST(test_e4m3_rounding)
{
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue; /* NaN codes */
        ck_assert_msg(dsv4_f32_to_e4m3(dsv4_e4m3_to_f32((uint8_t)c)) == c, "code 0x%02x does not round-trip", c);
    }
    /* midpoints between neighbours go to the even code; just off them, to the nearer one */
    for (int c = 0; c < 0x7e; c++) {
        float a = dsv4_e4m3_to_f32((uint8_t)c), b = dsv4_e4m3_to_f32((uint8_t)(c + 1)), mid = 0.5f * (a + b);
        int even = c & 1 ? c + 1 : c;
        ck_assert_msg(dsv4_f32_to_e4m3(mid) == even, "midpoint %g of 0x%02x/0x%02x -> 0x%02x", (double)mid, c, c + 1,
                      dsv4_f32_to_e4m3(mid));
        ck_assert_int_eq(dsv4_f32_to_e4m3(nextafterf(mid, 0.0f)), c);
        ck_assert_int_eq(dsv4_f32_to_e4m3(nextafterf(mid, 1e9f)), c + 1);
        ck_assert_int_eq(dsv4_f32_to_e4m3(-mid), 0x80 | even);
    }
    ck_assert_int_eq(dsv4_f32_to_e4m3(464.0f), 0x7e); /* past 448 saturates (torch clamps first) */
    ck_assert_int_eq(dsv4_f32_to_e4m3(1e30f), 0x7e);
    ck_assert_int_eq(dsv4_f32_to_e4m3(-INFINITY), 0xfe);
    ck_assert_int_eq(dsv4_f32_to_e4m3(-1e-30f), 0x80); /* sign kept on zero, as torch's cast */
    ck_assert_int_eq(dsv4_f32_to_e4m3(ldexpf(1.0f, -10)), 0x00); /* half the smallest subnormal: tie to 0 */
    ck_assert_int_eq(dsv4_f32_to_e4m3(1.5f * ldexpf(1.0f, -10)), 0x01);
    ck_assert_int_eq(dsv4_f32_to_e4m3(NAN) & 0x7f, 0x7f);
}
END_TEST

START_TEST(test_e2m1_rounding)
{
    for (int c = 0; c < 16; c++) {
        int want = c == 8 ? 0 : c; /* -0 quantises to +0 */
        ck_assert_msg(dsv4_f32_to_e2m1(dsv4_e2m1_to_f32((uint8_t)c)) == want, "code %d does not round-trip", c);
    }
    /* the ties between neighbours: to the even code */
    static const float tie[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const int want[7] = {0, 2, 2, 4, 4, 6, 6};
    for (int i = 0; i < 7; i++) {
        ck_assert_msg(dsv4_f32_to_e2m1(tie[i]) == want[i], "tie %g -> %d, want %d", (double)tie[i],
                      dsv4_f32_to_e2m1(tie[i]), want[i]);
        ck_assert_int_eq(dsv4_f32_to_e2m1(-tie[i]), want[i] ? (want[i] | 8) : 0);
        ck_assert_int_eq(dsv4_f32_to_e2m1(nextafterf(tie[i], 0.0f)), i);
        ck_assert_int_eq(dsv4_f32_to_e2m1(nextafterf(tie[i], 10.0f)), i + 1);
    }
    ck_assert_int_eq(dsv4_f32_to_e2m1(7.0f), 7);
    ck_assert_int_eq(dsv4_f32_to_e2m1(-1e20f), 15);
    ck_assert_int_eq(dsv4_f32_to_e2m1(-0.1f), 0);
}
END_TEST

/* Half the spacing of the e4m3 grid around |x| (x in code units, |x| <= 448). */
static double e4m3_half_step(double x)
{
    x = fabs(x);
    if (x < ldexp(1.0, -6)) return ldexp(1.0, -10);
    int e;
    frexp(x, &e); /* x in [2^(e-1), 2^e) */
    return ldexp(1.0, e - 1 - 3 - 1);
}

START_TEST(test_fp8_block_scales_and_error)
{
    const int R = 257, C = 300, BR = 3, BC = 3;
    float *w = malloc((size_t)R * C * 4);
    uint8_t *q = malloc((size_t)R * C), sc[9];
    /* a different magnitude per block, one block all zeros, one with a single huge value */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            int b = (r / 128) * BC + c / 128;
            float mag = ldexpf(1.0f, 3 * b - 12);
            w[r * C + c] = b == 4 ? 0.0f : mag * urand();
        }
    w[5 * C + 290] = 3.0e4f; /* block (0, 2) */
    ck_assert_int_eq(dsv4_quant_fp8_block(w, R, C, q, sc, "test"), 0);
    for (int b = 0; b < BR * BC; b++) {
        double amax = 0;
        for (int r = (b / BC) * 128; r < R && r < (b / BC + 1) * 128; r++)
            for (int c = (b % BC) * 128; c < C && c < (b % BC + 1) * 128; c++)
                if (fabs(w[r * C + c]) > amax) amax = fabs(w[r * C + c]);
        double a = amax > 1e-4 ? amax : 1e-4, s = ldexp(1.0, sc[b] - 127);
        /* the smallest power of two with a / s <= 448 */
        ck_assert_msg(a / s <= 448.0 && a / (s / 2) > 448.0, "block %d: amax %g, scale 2^%d", b, amax, sc[b] - 127);
    }
    ck_assert_int_eq(sc[4], 127 + (int)ceil(log2(1e-4 / 448.0))); /* the all-zero block: the floor */
    double worst = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            double s = ldexp(1.0, sc[(r / 128) * BC + c / 128] - 127), x = w[r * C + c] / s;
            double d = dsv4_e4m3_to_f32(q[r * C + c]) - x, lim = e4m3_half_step(x);
            ck_assert_msg(fabs(d) <= lim, "[%d, %d]: w %g -> %g (x %g, half step %g)", r, c, (double)w[r * C + c],
                          dsv4_e4m3_to_f32(q[r * C + c]) * s, x, lim);
            if (fabs(x) >= ldexp(1.0, -6) && fabs(d / x) > worst) worst = fabs(d / x); /* normals */
        }
    /* 3 mantissa bits: a normal value is within 1/16 of itself */
    ck_assert_msg(worst <= 1.0 / 16, "worst relative error %g", worst);
    w[7] = NAN;
    ck_assert_int_eq(dsv4_quant_fp8_block(w, R, C, q, sc, "test"), DSV4_ERR_FORMAT);
    free(w);
    free(q);
}
END_TEST

START_TEST(test_fp4_scales_error_and_nibbles)
{
    const int R = 17, C = 96;
    float w[17 * 96];
    uint8_t q[17 * 48], sc[17 * 3];
    for (int i = 0; i < R * C; i++) w[i] = ldexpf(urand(), (i / 32) % 9 - 4);
    for (int c = 32; c < 64; c++) w[3 * C + c] = 0.0f; /* an all-zero group: the floor */
    ck_assert_int_eq(dsv4_quant_fp4(w, R, C, q, sc, "test"), 0);
    static const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int r = 0; r < R; r++)
        for (int g = 0; g < 3; g++) {
            double amax = 0;
            for (int c = 32 * g; c < 32 * g + 32; c++)
                if (fabs(w[r * C + c]) > amax) amax = fabs(w[r * C + c]);
            double a = amax > 6 * ldexp(1.0, -126) ? amax : 6 * ldexp(1.0, -126), s = ldexp(1.0, sc[r * 3 + g] - 127);
            ck_assert_msg(a / s <= 6.0 && a / (s / 2) > 6.0, "row %d group %d: amax %g scale 2^%d", r, g, amax,
                          sc[r * 3 + g] - 127);
            for (int c = 32 * g; c < 32 * g + 32; c++) {
                uint8_t nib = (q[r * 48 + c / 2] >> (c % 2 ? 4 : 0)) & 0xf;
                double x = w[r * C + c] / s, v = dsv4_e2m1_to_f32(nib);
                /* nearest grid point: no other code is closer */
                for (int k = 0; k < 8; k++)
                    ck_assert_msg(fabs(v - x) <= fabs(copysign(grid[k], x) - x), "[%d, %d]: x %g -> %g, %g is nearer",
                                  r, c, x, v, (double)grid[k]);
            }
        }
    ck_assert_int_eq(sc[3 * 3 + 1], 1); /* 2^-126 */

    /* the loader's dequantisation of the written codes gives the same values (nibble order, scale index) */
    dsv4_stw *st = dsv4_stw_new();
    int64_t s[2] = {R, C / 2}, ss[2] = {R, 3};
    ck_assert_int_eq(dsv4_stw_add(st, "layers.1.ffn.experts.0.w1.weight", "I8", 2, s, q, sizeof q), 0);
    ck_assert_int_eq(dsv4_stw_add(st, "layers.1.ffn.experts.0.w1.scale", "F8_E8M0", 2, ss, sc, sizeof sc), 0);
    char *dir = dsv4_test_mkdtemp("quant");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(dsv4_stw_tiny_config(), f);
    fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(dsv4_stw_write(st, path, NULL), 0);
    dsv4_stw_free(st);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    float back[17 * 96];
    ck_assert_int_eq(dsv4_model_read_f32(m, "layers.1.ffn.experts.0.w1.weight", back, (size_t)R * C), 0);
    for (int i = 0; i < R * C; i++) {
        int r = i / C, c = i % C;
        float want = dsv4_e2m1_to_f32((q[r * 48 + c / 2] >> (c % 2 ? 4 : 0)) & 0xf) *
                     dsv4_e8m0_to_f32(sc[r * 3 + c / 32]);
        ck_assert_msg(back[i] == want, "[%d, %d]: loader %g, quantiser %g", r, c, (double)back[i], (double)want);
        /* the widest step of the grid is 2 (4 -> 6): at most half of it times the scale */
        ck_assert_msg(fabs(back[i] - w[i]) <= ldexp(1.0, sc[r * 3 + c / 32] - 127),
                      "[%d, %d]: %g -> %g", r, c, (double)w[i], (double)back[i]);
    }
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
    ck_assert_int_eq(dsv4_quant_fp4(w, R, 95, q, sc, "test"), DSV4_ERR_USAGE);
}
END_TEST

/* Every FP8 / FP4 tensor of golden/tiny-fp8 against the quantiser applied to golden/tiny's f32 weights. */
START_TEST(test_golden_tiny_fp8_bytes)
{
    dsv4_model *t32, *t8;
    ck_assert_int_eq(dsv4_model_open(dsv4_test_source_path("golden/tiny"), &t32), 0);
    ck_assert_int_eq(dsv4_model_open(dsv4_test_source_path("golden/tiny-fp8"), &t8), 0);
    int n_fp8 = 0, n_fp4 = 0;
    long bad_q = 0, bad_s = 0, ties = 0;
    for (int i = 0; i < dsv4_model_tensor_count(t8); i++) {
        const dsv4_tensor *t = dsv4_model_tensor_at(t8, i);
        const int fp8 = t->dtype == DSV4_DTYPE_F8_E4M3, fp4 = (t->dtype == DSV4_DTYPE_I8) && t->scale;
        if (!fp8 && !fp4) continue;
        ck_assert_int_eq(t->ndim, 2);
        const int64_t R = t->shape[0], C = fp4 ? 2 * t->shape[1] : t->shape[1];
        const size_t nq = (size_t)t->nbytes, ns = t->scale->nbytes;
        float *w = malloc((size_t)(R * C) * 4);
        uint8_t *q = malloc(nq), *sc = malloc(ns);
        ck_assert_int_eq(dsv4_model_read_f32(t32, t->name, w, (size_t)(R * C)), 0);
        ck_assert_int_eq(fp8 ? dsv4_quant_fp8_block(w, R, C, q, sc, t->name) : dsv4_quant_fp4(w, R, C, q, sc, t->name),
                         0);
        ck_assert_int_eq(t->scale->dtype, DSV4_DTYPE_F8_E8M0);
        for (size_t j = 0; j < ns; j++) bad_s += sc[j] != ((const uint8_t *)t->scale->data)[j];
        for (size_t j = 0; j < nq; j++)
            if (q[j] != ((const uint8_t *)t->data)[j]) {
                if (bad_q++ < 5)
                    fprintf(stderr, "%s byte %zu: quantiser 0x%02x, golden 0x%02x\n", t->name, j, q[j],
                            ((const uint8_t *)t->data)[j]);
            }
        if (fp4) /* ties of e2m1 (golden/make_golden.py sends them to the smaller magnitude, we to the even code) */
            for (int64_t j = 0; j < R * C; j++) {
                float x = w[j] / dsv4_e8m0_to_f32(sc[(j / C) * ((C + 31) / 32) + (j % C) / 32]), a = fabsf(x);
                ties += a == 0.75f || a == 1.75f || a == 3.5f;
            }
        n_fp8 += fp8, n_fp4 += fp4;
        free(w), free(q), free(sc);
    }
    fprintf(stderr, "golden/tiny-fp8: %d FP8 and %d FP4 tensors, %ld code and %ld scale bytes differ, %ld e2m1 ties\n",
            n_fp8, n_fp4, bad_q, bad_s, ties);
    ck_assert_int_gt(n_fp8, 40);
    ck_assert_int_gt(n_fp4, 100);
    ck_assert_int_eq(bad_s, 0);
    ck_assert_int_le(bad_q, ties); /* only where the tie rules differ */
    dsv4_model_free(t32);
    dsv4_model_free(t8);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("quantize");
    TCase *tc = tcase_create("quantize");
    tcase_add_test(tc, test_e4m3_rounding);
    tcase_add_test(tc, test_e2m1_rounding);
    tcase_add_test(tc, test_fp8_block_scales_and_error);
    tcase_add_test(tc, test_fp4_scales_error_and_nibbles);
    tcase_add_test(tc, test_golden_tiny_fp8_bytes);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
