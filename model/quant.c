/* quant.c - the quantisers of a bf16/f32 model into the checkpoint's formats (model-spec §2, rounding of §3):
 * FP8 e4m3 with one e8m0 scale per 128x128 block for the linears, FP4 e2m1 with one e8m0 scale per 32 input
 * columns for the routed experts. The inverse is model/dtype.c's dequantisation.
 *
 * Quiet traps:
 * - The scale exponent is ceil(log2(a / max_code)) computed exactly (frexp of the double ratio: a mantissa of
 *   exactly 0.5 is a power of two, whose log2 is an integer), so amax lands at or below the largest code; with
 *   the floors (1e-4 for FP8, 6*2^-126 for FP4) an all-zero block gets a finite scale.
 * - e4m3 rounding is to nearest, ties to the EVEN code (the codes 0..0x7e are monotonic in value, so the code
 *   parity is the mantissa parity); values past 448 saturate (torch clamps before its cast); the sign is kept
 *   on values that round to zero (torch gives 0x80 for -tiny).
 * - e2m1 has no code between 4 and 6 except the tie at 5; ties go to the even code (as the hardware's
 *   cvt.rn e2m1 conversion). A magnitude that rounds to 0 gets code 0, not the -0 code 8 (golden/make_golden.py
 *   does the same; both dequantise to zero).
 * - Packing: the LOW nibble holds the EVEN input column.
 */
#include <math.h>

#include "model/internal.h"

uint8_t dsv4_f32_to_e4m3(float f)
{
    if (isnan(f)) return 0x7f;
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    float v = fabsf(f);
    if (v >= 448.0f) return sign | 0x7e;
    /* largest code lo with value(lo) <= v, by bisection over the monotonic codes 0..0x7e */
    int lo = 0, hi = 0x7e;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (dsv4_e4m3_to_f32((uint8_t)mid) <= v) lo = mid;
        else hi = mid;
    }
    if (dsv4_e4m3_to_f32((uint8_t)hi) <= v) lo = hi;
    if (lo < 0x7e) {
        float a = dsv4_e4m3_to_f32((uint8_t)lo), b = dsv4_e4m3_to_f32((uint8_t)(lo + 1));
        if (v - a > b - v || (v - a == b - v && (lo & 1))) lo++;
    }
    return sign | (uint8_t)lo;
}

uint8_t dsv4_f32_to_e2m1(float f)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = fabsf(f);
    int c = 7;
    if (!(v >= 6.0f)) { /* NaN gives 0 here: the quantisers reject non-finite weights first */
        c = 0;
        while (c < 7 && mag[c + 1] <= v) c++;
        if (c < 7) {
            float a = mag[c], b = mag[c + 1];
            if (v - a > b - v || (v - a == b - v && (c & 1))) c++;
        }
    }
    if (c == 0) return 0;
    return (uint8_t)(c | (signbit(f) ? 8 : 0));
}

/* The e8m0 byte of 2^ceil(log2(a / top)), a > 0 finite. */
static int scale_byte(double a, double top, uint8_t *out)
{
    int e;
    double m = frexp(a / top, &e); /* a/top = m * 2^e, m in [0.5, 1) */
    int x = m == 0.5 ? e - 1 : e;
    if (x < -127 || x > 127) return -1;
    *out = (uint8_t)(x + 127);
    return 0;
}

int dsv4_quant_fp8_block(const float *w, int64_t rows, int64_t cols, uint8_t *q, uint8_t *scale, const char *what)
{
    DSV4_CHECK(w && q && scale && rows >= 1 && cols >= 1, "dsv4_quant_fp8_block: %s: bad arguments", what);
    const int64_t sc = (cols + 127) / 128;
    for (int64_t br = 0; br < (rows + 127) / 128; br++)
        for (int64_t bc = 0; bc < sc; bc++) {
            const int64_t r0 = br * 128, c0 = bc * 128;
            const int64_t r1 = r0 + 128 < rows ? r0 + 128 : rows, c1 = c0 + 128 < cols ? c0 + 128 : cols;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) {
                    float v = w[r * cols + c];
                    if (!isfinite(v))
                        return dsv4_error(DSV4_ERR_FORMAT, "%s: weight [%lld, %lld] is %g; cannot quantise to FP8",
                                          what, (long long)r, (long long)c, (double)v);
                    if (fabsf(v) > amax) amax = fabsf(v);
                }
            uint8_t b;
            if (scale_byte(amax > 1e-4 ? amax : 1e-4, 448.0, &b))
                return dsv4_error(DSV4_ERR_FORMAT, "%s: block scale of amax %g out of the e8m0 range", what,
                                  (double)amax);
            scale[br * sc + bc] = b;
            const float s = ldexpf(1.0f, (int)b - 127);
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) q[r * cols + c] = dsv4_f32_to_e4m3(w[r * cols + c] / s);
        }
    return 0;
}

int dsv4_quant_fp4(const float *w, int64_t rows, int64_t cols, uint8_t *q, uint8_t *scale, const char *what)
{
    DSV4_CHECK(w && q && scale && rows >= 1 && cols >= 2 && cols % 2 == 0, "dsv4_quant_fp4: %s: bad arguments "
               "(%lld x %lld; columns must be even)", what, (long long)rows, (long long)cols);
    const int64_t sc = (cols + 31) / 32;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < sc; g++) {
            const float *x = w + r * cols;
            const int64_t c0 = g * 32, c1 = c0 + 32 < cols ? c0 + 32 : cols;
            float amax = 0.0f;
            for (int64_t c = c0; c < c1; c++) {
                if (!isfinite(x[c]))
                    return dsv4_error(DSV4_ERR_FORMAT, "%s: weight [%lld, %lld] is %g; cannot quantise to FP4", what,
                                      (long long)r, (long long)c, (double)x[c]);
                if (fabsf(x[c]) > amax) amax = fabsf(x[c]);
            }
            const double floor_a = 6.0 * ldexp(1.0, -126);
            uint8_t b;
            if (scale_byte(amax > floor_a ? amax : floor_a, 6.0, &b))
                return dsv4_error(DSV4_ERR_FORMAT, "%s: FP4 scale of amax %g out of the e8m0 range", what,
                                  (double)amax);
            scale[r * sc + g] = b;
            const float s = ldexpf(1.0f, (int)b - 127);
            for (int64_t c = c0; c < c1; c += 2) {
                uint8_t lo = dsv4_f32_to_e2m1(x[c] / s), hi = dsv4_f32_to_e2m1(x[c + 1] / s);
                q[r * (cols / 2) + c / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
    return 0;
}
