/* test_model_dequant.c - exact scalar conversions and block dequantisation against hand-computed values
 * (model-spec §2): F8_E4M3 (fn: no inf, NaN codes, subnormals, -0, saturation ±448), E8M0 (2^(b-127)),
 * FP4 e2m1 (table and LOW nibble = EVEN column), bf16 round-to-nearest-even ties, f16; 128x128 FP8 blocks
 * with partial edge blocks and E8M0 or F32 scales; FP4 scales per 32 columns; every code and row range of the
 * table dequantiser bitwise against the scalar formulas; the f32 cache and mmap path; tid2eid as int32 with its
 * range check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4_test.h"
#include "st_writer.h"

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

START_TEST(test_e4m3_values)
{
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x00), 0.0f);
    ck_assert(!signbit(dsv4_e4m3_to_f32(0x00)));
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x80), 0.0f);
    ck_assert(signbit(dsv4_e4m3_to_f32(0x80))); /* negative zero */
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x01), ldexpf(1.0f, -9)); /* smallest subnormal */
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x07), 7.0f * ldexpf(1.0f, -9));
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x08), ldexpf(1.0f, -6)); /* smallest normal */
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x38), 1.0f);
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x3c), 1.5f);
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x40), 2.0f);
    ck_assert_float_eq(dsv4_e4m3_to_f32(0xb8), -1.0f);
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x77), 240.0f);
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x78), 256.0f); /* exponent 15 is finite in the fn variant */
    ck_assert_float_eq(dsv4_e4m3_to_f32(0x7e), 448.0f); /* saturation value */
    ck_assert_float_eq(dsv4_e4m3_to_f32(0xfe), -448.0f);
    ck_assert(isnan(dsv4_e4m3_to_f32(0x7f)));
    ck_assert(isnan(dsv4_e4m3_to_f32(0xff)));
    int finite = 0;
    for (int b = 0; b < 256; b++) finite += isfinite(dsv4_e4m3_to_f32((uint8_t)b));
    ck_assert_int_eq(finite, 254); /* no infinities anywhere */
}
END_TEST

START_TEST(test_e8m0_values)
{
    ck_assert_float_eq(dsv4_e8m0_to_f32(127), 1.0f);
    ck_assert_float_eq(dsv4_e8m0_to_f32(128), 2.0f);
    ck_assert_float_eq(dsv4_e8m0_to_f32(120), 1.0f / 128.0f);
    ck_assert_float_eq(dsv4_e8m0_to_f32(254), ldexpf(1.0f, 127));
    ck_assert_float_eq(dsv4_e8m0_to_f32(0), ldexpf(1.0f, -127));
    ck_assert(dsv4_e8m0_to_f32(0) > 0.0f);
    ck_assert(isnan(dsv4_e8m0_to_f32(255)));
}
END_TEST

START_TEST(test_e2m1_table)
{
    static const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++) {
        ck_assert_float_eq(dsv4_e2m1_to_f32((uint8_t)c), want[c]);
        ck_assert_int_eq(!!signbit(dsv4_e2m1_to_f32((uint8_t)c)), c >= 8);
    }
}
END_TEST

START_TEST(test_bf16_round_nearest_even)
{
    ck_assert_uint_eq(dsv4_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(dsv4_f32_to_bf16(bits_f32(0x3f808000u)), 0x3f80); /* tie, even below: stays */
    ck_assert_uint_eq(dsv4_f32_to_bf16(bits_f32(0x3f818000u)), 0x3f82); /* tie, odd below: rounds up */
    ck_assert_uint_eq(dsv4_f32_to_bf16(bits_f32(0x3f808001u)), 0x3f81); /* above the tie */
    ck_assert_uint_eq(dsv4_f32_to_bf16(bits_f32(0x3f807fffu)), 0x3f80); /* below the tie */
    ck_assert_uint_eq(dsv4_f32_to_bf16(bits_f32(0xbf818000u)), 0xbf82); /* negative tie */
    ck_assert_uint_eq(dsv4_f32_to_bf16(-0.0f), 0x8000);
    ck_assert_uint_eq(dsv4_f32_to_bf16(INFINITY), 0x7f80);
    ck_assert_uint_eq(dsv4_f32_to_bf16(bits_f32(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    uint16_t n = dsv4_f32_to_bf16(bits_f32(0x7f800001u));             /* NaN with payload only in low bits */
    ck_assert(isnan(dsv4_bf16_to_f32(n)));
    ck_assert_float_eq(dsv4_bf16_to_f32(0x3f82), 1.015625f);
    ck_assert_float_eq(dsv4_bf16_to_f32(0xc0c0), -6.0f);
}
END_TEST

START_TEST(test_f16_values)
{
    ck_assert_float_eq(dsv4_f16_to_f32(0x3c00), 1.0f);
    ck_assert_float_eq(dsv4_f16_to_f32(0xc000), -2.0f);
    ck_assert_float_eq(dsv4_f16_to_f32(0x7bff), 65504.0f);
    ck_assert_float_eq(dsv4_f16_to_f32(0x0001), ldexpf(1.0f, -24));
    ck_assert_float_eq(dsv4_f16_to_f32(0x0400), ldexpf(1.0f, -14));
    ck_assert(signbit(dsv4_f16_to_f32(0x8000)));
    ck_assert(isinf(dsv4_f16_to_f32(0x7c00)) && dsv4_f16_to_f32(0x7c00) > 0);
    ck_assert(isinf(dsv4_f16_to_f32(0xfc00)) && dsv4_f16_to_f32(0xfc00) < 0);
    ck_assert(isnan(dsv4_f16_to_f32(0x7e00)));
}
END_TEST

START_TEST(test_dtype_table)
{
    ck_assert_str_eq(dsv4_dtype_name(DSV4_DTYPE_F8_E4M3), "F8_E4M3");
    ck_assert_int_eq(dsv4_dtype_from_name("F8_E8M0"), DSV4_DTYPE_F8_E8M0);
    ck_assert_int_eq(dsv4_dtype_from_name("F7"), -1);
    ck_assert_uint_eq(dsv4_dtype_size(DSV4_DTYPE_I64), 8);
    ck_assert_uint_eq(dsv4_dtype_size(DSV4_DTYPE_BF16), 2);
}
END_TEST

/* A model folder with the tiny config and only the given tensors (open does not need the full set). */
static char *write_folder(dsv4_stw *w)
{
    char *dir = dsv4_test_mkdtemp("dequant");
    ck_assert_ptr_nonnull(dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(dsv4_stw_tiny_config(), f);
    fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(dsv4_stw_write(w, path, NULL), 0);
    dsv4_stw_free(w);
    return dir;
}

START_TEST(test_fp8_blocks_e8m0_partial_edges)
{
    /* [130, 129]: 2x2 blocks, the second row/column block partial (2 rows, 1 column) */
    enum { R = 130, C = 129 };
    uint8_t *q = malloc(R * C);
    for (int i = 0; i < R * C; i++) q[i] = 0x38; /* 1.0 */
    q[0] = 0x7e;                                 /* 448 */
    q[C * (R - 1) + C - 1] = 0xfe;               /* -448 in the corner block */
    q[1] = 0x80;                                 /* -0 */
    q[2] = 0x01;                                 /* 2^-9 */
    uint8_t sc[4] = {127, 128, 126, 130};        /* 1, 2, 0.5, 8 */
    dsv4_stw *w = dsv4_stw_new();
    int64_t s[2] = {R, C}, ss[2] = {2, 2};
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.attn.wq_a.weight", "F8_E4M3", 2, s, q, R * C), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.attn.wq_a.scale", "F8_E8M0", 2, ss, sc, 4), 0);
    free(q);
    char *dir = write_folder(w);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    const float *v;
    ck_assert_int_eq(dsv4_model_f32(m, "layers.0.attn.wq_a.weight", R * C, &v), 0);
    ck_assert_float_eq(v[0], 448.0f);
    ck_assert(signbit(v[1]) && v[1] == 0.0f);
    ck_assert_float_eq(v[2], ldexpf(1.0f, -9));
    ck_assert_float_eq(v[127], 1.0f);               /* block (0,0) */
    ck_assert_float_eq(v[128], 2.0f);               /* block (0,1): the 1-column edge */
    ck_assert_float_eq(v[127 * C + 128], 2.0f);
    ck_assert_float_eq(v[128 * C + 0], 0.5f);       /* block (1,0): the 2-row edge */
    ck_assert_float_eq(v[128 * C + 127], 0.5f);
    ck_assert_float_eq(v[129 * C + 127], 0.5f);
    ck_assert_float_eq(v[128 * C + 128], 8.0f);     /* block (1,1) */
    ck_assert_float_eq(v[R * C - 1], -448.0f * 8.0f);
    const float *v2;
    ck_assert_int_eq(dsv4_model_f32(m, "layers.0.attn.wq_a.weight", R * C, &v2), 0);
    ck_assert_ptr_eq(v, v2); /* dequantised once, cached */
    ck_assert_int_eq(dsv4_model_f32(m, "layers.0.attn.wq_a.weight", R * C - 1, &v2), DSV4_ERR_SHAPE);
    uint16_t *b = malloc(R * C * 2);
    ck_assert_int_eq(dsv4_model_read_bf16(m, "layers.0.attn.wq_a.weight", b, R * C), 0);
    ck_assert_uint_eq(b[0], 0x43e0);    /* 448 */
    ck_assert_uint_eq(b[1], 0x8000);    /* -0 */
    ck_assert_uint_eq(b[128], 0x4000);  /* 2 */
    free(b);
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_fp8_f32_scales_transformers_names)
{
    /* transformers' FP8 quantizer names the scale "<name>_scale_inv" and may store it as F32 */
    enum { R = 3, C = 200 };
    uint8_t q[R * C];
    for (int i = 0; i < R * C; i++) q[i] = 0x3c; /* 1.5 */
    float sc[2] = {3.0f, 0.25f};
    dsv4_stw *w = dsv4_stw_new();
    int64_t s[2] = {R, C}, ss[2] = {1, 2};
    ck_assert_int_eq(dsv4_stw_add(w, "model.layers.1.self_attn.q_a_proj.weight", "F8_E4M3", 2, s, q, sizeof q), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "model.layers.1.self_attn.q_a_proj.weight_scale_inv", "F32", 2, ss, sc, 8), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.2.attn.wkv.weight", "F8_E4M3", 2, s, q, sizeof q), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.2.attn.wkv.weight.scale", "F32", 2, ss, sc, 8), 0);
    char *dir = write_folder(w);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    const dsv4_tensor *t;
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.1.attn.wq_a.weight", &t), 0);
    ck_assert_ptr_nonnull(t->scale);
    ck_assert_str_eq(t->scale->name, "layers.1.attn.wq_a.scale");
    float v[R * C];
    ck_assert_int_eq(dsv4_model_read_f32(m, "layers.1.attn.wq_a.weight", v, R * C), 0);
    ck_assert_float_eq(v[0], 4.5f);
    ck_assert_float_eq(v[127], 4.5f);
    ck_assert_float_eq(v[128], 0.375f);
    ck_assert_float_eq(v[2 * C + 199], 0.375f);
    ck_assert_int_eq(dsv4_model_read_f32(m, "layers.2.attn.wkv.weight", v, R * C), 0);
    ck_assert_float_eq(v[C + 130], 0.375f);
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_fp4_nibble_order_and_scales)
{
    /* [2 rows, 64 logical columns] = I8 [2, 32]; scale [2, 2] per 32 columns */
    uint8_t q[2 * 32] = {0};
    q[0] = 0x21;                           /* col 0 = code 1 (0.5), col 1 = code 2 (1.0): low nibble first */
    q[16] = 0xf8;                          /* col 32 = code 8 (-0), col 33 = code 15 (-6) */
    q[31] = 0x7e;                          /* col 62 = code 14 (-4), col 63 = code 7 (6) */
    for (int j = 0; j < 8; j++) q[32 + j] = (uint8_t)((2 * j) | ((2 * j + 1) << 4)); /* row 1: codes 0..15 */
    uint8_t sc[4] = {127, 129, 126, 127};  /* row 0: x1, x4; row 1: x0.5, x1 */
    dsv4_stw *w = dsv4_stw_new();
    int64_t s[2] = {2, 32}, ss[2] = {2, 2};
    ck_assert_int_eq(dsv4_stw_add(w, "layers.1.ffn.experts.0.w1.weight", "I8", 2, s, q, sizeof q), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.1.ffn.experts.0.w1.scale", "F8_E8M0", 2, ss, sc, 4), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.1.ffn.experts.1.w1.weight", "U8", 2, s, q, sizeof q), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.1.ffn.experts.1.w1.scale", "F8_E8M0", 2, ss, sc, 4), 0);
    char *dir = write_folder(w);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    static const float tbl[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int k = 0; k < 2; k++) {
        const float *v;
        ck_assert_int_eq(dsv4_model_f32(m, k ? "layers.1.ffn.experts.1.w1.weight" : "layers.1.ffn.experts.0.w1.weight",
                                        128, &v),
                         0);
        ck_assert_float_eq(v[0], 0.5f);
        ck_assert_float_eq(v[1], 1.0f);
        ck_assert_float_eq(v[2], 0.0f);
        ck_assert(signbit(v[32]) && v[32] == 0.0f);
        ck_assert_float_eq(v[33], -24.0f);
        ck_assert_float_eq(v[62], -16.0f);
        ck_assert_float_eq(v[63], 24.0f);
        for (int c = 0; c < 16; c++) ck_assert_float_eq(v[64 + c], 0.5f * tbl[c]);
        ck_assert_float_eq(v[64 + 32], 0.0f);
    }
    ck_assert_int_eq(dsv4_model_f32(m, "layers.1.ffn.experts.0.w1.weight", 64, &(const float *){0}), DSV4_ERR_SHAPE);
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

/* Every FP8 and FP4 code with varied scales, against the scalar formula element by element (bitwise: the table
 * dequantiser must give the values of dsv4_e4m3_to_f32 / dsv4_e2m1_to_f32 times the block's scale), and every row
 * range of dsv4_model_read_f32_rows against the whole tensor (the reference reads embed rows one at a time). */
START_TEST(test_tables_and_row_ranges_bitwise)
{
    enum { R = 259, C = 300, P = 40 }; /* FP8 [259, 300]: 3 x 3 blocks, partial edges; FP4 [259, 2·40] */
    uint8_t *q = malloc(R * C), *q4 = malloc(R * P), sc[9], sc4[R * 3];
    uint32_t x = 12345;
    for (int i = 0; i < R * C; i++) q[i] = (uint8_t)((x = x * 1664525u + 1013904223u) >> 24);
    for (int i = 0; i < 256; i++) q[i] = (uint8_t)i; /* every code in row 0 */
    for (int i = 0; i < R * P; i++) q4[i] = (uint8_t)((x = x * 1664525u + 1013904223u) >> 24);
    for (int i = 0; i < 9; i++) sc[i] = (uint8_t)(120 + 2 * i);
    sc[4] = 0;   /* 2^-127: subnormal products */
    sc[8] = 255; /* NaN scale */
    for (int i = 0; i < R * 3; i++) sc4[i] = (uint8_t)(110 + (i * 7) % 30);
    dsv4_stw *w = dsv4_stw_new();
    int64_t s[2] = {R, C}, ss[2] = {3, 3}, s4[2] = {R, P}, ss4[2] = {R, 3};
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.attn.wq_a.weight", "F8_E4M3", 2, s, q, R * C), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.attn.wq_a.scale", "F8_E8M0", 2, ss, sc, 9), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.ffn.experts.0.w1.weight", "I8", 2, s4, q4, R * P), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.ffn.experts.0.w1.scale", "F8_E8M0", 2, ss4, sc4, R * 3), 0);
    char *dir = write_folder(w);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    float *v = malloc(R * C * sizeof *v), *rows = malloc(R * C * sizeof *rows);
    ck_assert_int_eq(dsv4_model_read_f32(m, "layers.0.attn.wq_a.weight", v, R * C), 0);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float want = dsv4_e4m3_to_f32(q[r * C + c]) * dsv4_e8m0_to_f32(sc[(r / 128) * 3 + c / 128]);
            ck_assert_msg(!memcmp(&want, &v[r * C + c], 4), "FP8 (%d, %d): %a, want %a", r, c, v[r * C + c], want);
        }
    for (int r0 = 0; r0 < R; r0 += 37) { /* ranges crossing the 128-row scale blocks */
        int n = r0 + 130 <= R ? 130 : R - r0;
        ck_assert_int_eq(dsv4_model_read_f32_rows(m, "layers.0.attn.wq_a.weight", r0, n, rows), 0);
        ck_assert_msg(!memcmp(rows, v + (size_t)r0 * C, (size_t)n * C * 4), "FP8 rows %d..%d differ", r0, r0 + n);
    }
    ck_assert_int_eq(dsv4_model_read_f32(m, "layers.0.ffn.experts.0.w1.weight", v, R * 2 * P), 0);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 2 * P; c++) {
            uint8_t b = q4[r * P + c / 2];
            float want = dsv4_e2m1_to_f32(c % 2 ? b >> 4 : b & 15) * dsv4_e8m0_to_f32(sc4[r * 3 + c / 32]);
            ck_assert_msg(!memcmp(&want, &v[r * 2 * P + c], 4), "FP4 (%d, %d)", r, c);
        }
    ck_assert_int_eq(dsv4_model_read_f32_rows(m, "layers.0.ffn.experts.0.w1.weight", 5, 3, rows), 0);
    ck_assert(!memcmp(rows, v + 5 * 2 * P, 3 * 2 * P * 4));
    /* a range outside the tensor is refused with the tensor named */
    ck_assert_int_eq(dsv4_model_read_f32_rows(m, "layers.0.attn.wq_a.weight", R - 1, 2, rows), DSV4_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "layers.0.attn.wq_a.weight"));
    ck_assert_int_eq(dsv4_model_read_f32_rows(m, "layers.0.attn.wq_a.weight", -1, 1, rows), DSV4_ERR_SHAPE);
    free(v);
    free(rows);
    free(q);
    free(q4);
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_f32_mmap_and_misaligned_copy)
{
    dsv4_stw *w = dsv4_stw_new();
    float a[5] = {1, -2, 3.5f, 0.25f, -0.0f};
    uint8_t pad = 7;
    int64_t s1[1] = {5}, s0[1] = {1};
    ck_assert_int_eq(dsv4_stw_add_f32(w, "layers.0.attn.attn_sink", 1, s1, a), 0); /* data offset 0: aligned */
    ck_assert_int_eq(dsv4_stw_add(w, "pad", "U8", 1, s0, &pad, 1), 0);
    ck_assert_int_eq(dsv4_stw_add_f32(w, "layers.1.attn.attn_sink", 1, s1, a), 0); /* offset 21: misaligned */
    uint16_t bf[3] = {0x3f80, 0xc0c0, 0x0001};
    int64_t s3[1] = {3};
    ck_assert_int_eq(dsv4_stw_add(w, "norm.weight", "BF16", 1, s3, bf, 6), 0);
    char *dir = write_folder(w);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    const dsv4_tensor *t0, *t1;
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.0.attn.attn_sink", &t0), 0);
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.1.attn.attn_sink", &t1), 0);
    const float *v0, *v1;
    ck_assert_int_eq(dsv4_model_f32(m, "layers.0.attn.attn_sink", 5, &v0), 0);
    ck_assert_ptr_eq(v0, t0->data); /* straight from the mmap */
    ck_assert_int_eq(dsv4_model_f32(m, "layers.1.attn.attn_sink", 5, &v1), 0);
    ck_assert_ptr_ne(v1, t1->data); /* misaligned: a cached copy */
    ck_assert_int_eq(((uintptr_t)v1) % 4, 0);
    for (int i = 0; i < 5; i++) ck_assert_float_eq(v1[i], a[i]);
    const float *vn;
    ck_assert_int_eq(dsv4_model_f32(m, "norm.weight", 3, &vn), 0);
    ck_assert_float_eq(vn[0], 1.0f);
    ck_assert_float_eq(vn[1], -6.0f);
    ck_assert_float_eq(vn[2], bits_f32(0x00010000u));
    uint16_t out[3];
    ck_assert_int_eq(dsv4_model_read_bf16(m, "norm.weight", out, 3), 0);
    ck_assert_uint_eq(out[2], 0x0001);
    ck_assert_int_eq(dsv4_model_f32(m, "no.such.tensor", 1, &vn), DSV4_ERR_MISSING);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "no.such.tensor"));
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_tid2eid_i64_i32_and_range)
{
    dsv4_stw *w = dsv4_stw_new();
    int64_t a[4] = {0, 3, 2, 1}, bad[4] = {0, 4, 1, 2}; /* tiny config: 4 experts */
    int32_t b[4] = {3, 2, 1, 0};
    int64_t s[2] = {2, 2};
    ck_assert_int_eq(dsv4_stw_add(w, "layers.0.ffn.gate.tid2eid", "I64", 2, s, a, sizeof a), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.1.ffn.gate.tid2eid", "I32", 2, s, b, sizeof b), 0);
    ck_assert_int_eq(dsv4_stw_add(w, "layers.2.ffn.gate.tid2eid", "I64", 2, s, bad, sizeof bad), 0);
    char *dir = write_folder(w);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    int32_t out[4];
    ck_assert_int_eq(dsv4_model_read_i32(m, "layers.0.ffn.gate.tid2eid", out, 4), 0);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(out[i], a[i]);
    ck_assert_int_eq(dsv4_model_read_i32(m, "layers.1.ffn.gate.tid2eid", out, 4), 0);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(out[i], b[i]);
    ck_assert_int_eq(dsv4_model_read_i32(m, "layers.2.ffn.gate.tid2eid", out, 4), DSV4_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "layers.2.ffn.gate.tid2eid"));
    ck_assert_int_eq(dsv4_model_read_i32(m, "layers.0.ffn.gate.tid2eid", out, 3), DSV4_ERR_SHAPE);
    float f[4];
    ck_assert_int_eq(dsv4_model_read_f32(m, "layers.0.ffn.gate.tid2eid", f, 4), DSV4_ERR_SHAPE);
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_tied_embeddings_alias_head)
{
    /* tie_word_embeddings: no head.weight on disk; the loader serves the embedding under that name */
    char *dir = dsv4_test_mkdtemp("tied");
    char cfg[8192], path[4200];
    snprintf(cfg, sizeof cfg, "%s", dsv4_stw_tiny_config());
    char *p = strstr(cfg, "\"tie_word_embeddings\": false");
    ck_assert_ptr_nonnull(p);
    memcpy(p, "\"tie_word_embeddings\":  true", strlen("\"tie_word_embeddings\": false"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(cfg, f);
    fclose(f);
    dsv4_stw *w = dsv4_stw_new();
    float e[6] = {1, 2, 3, 4, 5, 6};
    int64_t s[2] = {3, 2};
    ck_assert_int_eq(dsv4_stw_add_f32(w, "model.embed_tokens.weight", 2, s, e), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(dsv4_stw_write(w, path, NULL), 0);
    dsv4_stw_free(w);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    ck_assert_int_eq(dsv4_model_config(m)->tie_word_embeddings, 1);
    const dsv4_tensor *h, *em;
    ck_assert_int_eq(dsv4_model_tensor(m, "head.weight", &h), 0);
    ck_assert_int_eq(dsv4_model_tensor(m, "embed.weight", &em), 0);
    ck_assert_ptr_eq(h->data, em->data);
    float v[6];
    ck_assert_int_eq(dsv4_model_read_f32(m, "head.weight", v, 6), 0);
    ck_assert_float_eq(v[5], 6.0f);
    dsv4_model_free(m);
    dsv4_test_rmtree(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_dequant");
    TCase *tc = tcase_create("dequant");
    tcase_add_test(tc, test_e4m3_values);
    tcase_add_test(tc, test_e8m0_values);
    tcase_add_test(tc, test_e2m1_table);
    tcase_add_test(tc, test_bf16_round_nearest_even);
    tcase_add_test(tc, test_f16_values);
    tcase_add_test(tc, test_dtype_table);
    tcase_add_test(tc, test_fp8_blocks_e8m0_partial_edges);
    tcase_add_test(tc, test_fp8_f32_scales_transformers_names);
    tcase_add_test(tc, test_fp4_nibble_order_and_scales);
    tcase_add_test(tc, test_tables_and_row_ranges_bitwise);
    tcase_add_test(tc, test_f32_mmap_and_misaligned_copy);
    tcase_add_test(tc, test_tid2eid_i64_i32_and_range);
    tcase_add_test(tc, test_tied_embeddings_alias_head);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
