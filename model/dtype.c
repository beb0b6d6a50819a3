/* dtype.c - the dtype table, exact scalar conversions and the dequantisation kernels (model-spec §2, §3).
 *
 * Quiet traps:
 * - F8_E4M3 is the "fn" variant: no infinities; 0x7f/0xff are NaN; 0x7e = 448 is the largest finite value;
 *   exponent 0 is subnormal (m·2^-9); 0x80 is -0.
 * - E8M0 has no sign and no mantissa: 2^(b-127); 0xff is NaN; 0x00 is 2^-127 (a float subnormal, exact).
 * - FP4 e2m1 is packed two per byte with the LOW nibble holding the EVEN input column.
 * - FP8 block scales are per 128x128 block of [out, in]: scale[r/128][c/128]; edge blocks are partial.
 *   FP4 scales are per 32 input columns of one row: scale[r][c/32].
 * - bf16 output is round-to-nearest-even of the f32 value (ties to even); NaN stays NaN (quieted).
 */
#include <math.h>
#include <string.h>

#include "model/internal.h"

static const struct {
    const char *name;
    size_t size;
} dsv4_dtype_table[] = {
    [DSV4_DTYPE_F32] = {"F32", 4},        [DSV4_DTYPE_F16] = {"F16", 2},
    [DSV4_DTYPE_BF16] = {"BF16", 2},      [DSV4_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [DSV4_DTYPE_F8_E8M0] = {"F8_E8M0", 1}, [DSV4_DTYPE_I8] = {"I8", 1},
    [DSV4_DTYPE_U8] = {"U8", 1},          [DSV4_DTYPE_I32] = {"I32", 4},
    [DSV4_DTYPE_I64] = {"I64", 8},        [DSV4_DTYPE_F64] = {"F64", 8},
};
_Static_assert(sizeof dsv4_dtype_table / sizeof dsv4_dtype_table[0] == DSV4_DTYPE_COUNT,
               "one dtype table entry per dsv4_dtype");

const char *dsv4_dtype_name(dsv4_dtype t)
{
    return (unsigned)t < DSV4_DTYPE_COUNT ? dsv4_dtype_table[t].name : "?";
}

int dsv4_dtype_from_name(const char *name)
{
    for (int i = 0; i < DSV4_DTYPE_COUNT; i++)
        if (!strcmp(name, dsv4_dtype_table[i].name)) return i;
    return -1;
}

size_t dsv4_dtype_size(dsv4_dtype t)
{
    return (unsigned)t < DSV4_DTYPE_COUNT ? dsv4_dtype_table[t].size : 0;
}

/* ------------------------------------------------------------------------------ scalar conversions */
static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float dsv4_bf16_to_f32(uint16_t b)
{
    return f32_from_bits((uint32_t)b << 16);
}

uint16_t dsv4_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep sign, quiet */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dsv4_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = ldexpf((float)m, -24); /* subnormal (or zero): exact in f32 */
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

float dsv4_e4m3_to_f32(uint8_t b)
{
    int e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 0xf && m == 7) return NAN;
    if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10); /* (1 + m/8) * 2^(e-7) */
    return (b & 0x80) ? -v : v;
}

float dsv4_e8m0_to_f32(uint8_t b)
{
    return b == 0xff ? NAN : ldexpf(1.0f, (int)b - 127);
}

float dsv4_e2m1_to_f32(uint8_t nibble)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[nibble & 7];
    return (nibble & 8) ? -v : v;
}

/* ------------------------------------------------------------------------------- tensor helpers */
int dsv4_tensor_is_fp4(const dsv4_tensor *t)
{
    return (t->dtype == DSV4_DTYPE_I8 || t->dtype == DSV4_DTYPE_U8) && t->scale != NULL;
}

int dsv4_tensor_logical_shape(const dsv4_tensor *t, int64_t shape[4])
{
    for (int i = 0; i < 4; i++) shape[i] = i < t->ndim ? t->shape[i] : 1;
    if (dsv4_tensor_is_fp4(t) && t->ndim > 0) shape[t->ndim - 1] *= 2;
    return t->ndim;
}

size_t dsv4_tensor_logical_numel(const dsv4_tensor *t)
{
    int64_t s[4];
    int nd = dsv4_tensor_logical_shape(t, s);
    size_t n = 1;
    for (int i = 0; i < nd; i++) n *= (size_t)s[i];
    return n;
}

static float scale_at(const dsv4_tensor *s, size_t i)
{
    if (s->dtype == DSV4_DTYPE_F32) {
        float v;
        memcpy(&v, (const uint8_t *)s->data + 4 * i, 4);
        return v;
    }
    return dsv4_e8m0_to_f32(((const uint8_t *)s->data)[i]);
}

int dsv4_tensor_check_scale(const dsv4_tensor *t)
{
    const dsv4_tensor *s = t->scale;
    if (!s) {
        if (t->dtype == DSV4_DTYPE_F8_E4M3)
            return dsv4_error(DSV4_ERR_MISSING, "%s: tensor %s is F8_E4M3 but has no .scale tensor", t->file,
                              t->name);
        return 0;
    }
    if (s->dtype != DSV4_DTYPE_F8_E8M0 && s->dtype != DSV4_DTYPE_F32)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: scale %s of %s has dtype %s (want F8_E8M0 or F32)", s->file, s->name,
                          t->name, dsv4_dtype_name(s->dtype));
    int64_t want[2];
    if (t->dtype == DSV4_DTYPE_F8_E4M3) {
        if (t->ndim != 2)
            return dsv4_error(DSV4_ERR_SHAPE, "%s: FP8 tensor %s has %d dims (block scales need 2)", t->file, t->name,
                              t->ndim);
        want[0] = (t->shape[0] + 127) / 128;
        want[1] = (t->shape[1] + 127) / 128;
    } else if (t->dtype == DSV4_DTYPE_I8 || t->dtype == DSV4_DTYPE_U8) {
        if (t->ndim != 2)
            return dsv4_error(DSV4_ERR_SHAPE, "%s: FP4 tensor %s has %d dims (want 2)", t->file, t->name, t->ndim);
        want[0] = t->shape[0];
        want[1] = (2 * t->shape[1] + 31) / 32;
    } else {
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s is %s but has a scale tensor %s", t->file, t->name,
                          dsv4_dtype_name(t->dtype), s->name);
    }
    if (s->ndim != 2 || s->shape[0] != want[0] || s->shape[1] != want[1])
        return dsv4_error(DSV4_ERR_SHAPE, "%s: scale %s has shape [%lld,%lld] (ndim %d), want [%lld,%lld] for %s",
                          s->file, s->name, (long long)(s->ndim > 0 ? s->shape[0] : 0),
                          (long long)(s->ndim > 1 ? s->shape[1] : 0), s->ndim, (long long)want[0],
                          (long long)want[1], t->name);
    return 0;
}

/* ------------------------------------------------------------------------------- dequantisation */
/* Rows and columns of a tensor as the dequantisers see it: the first dim by the rest (logical: FP4 unpacked). */
static void row_shape(const dsv4_tensor *t, size_t *rows, size_t *cols)
{
    size_t numel = dsv4_tensor_logical_numel(t);
    *rows = t->ndim >= 1 ? (size_t)t->shape[0] : 1;
    *cols = *rows ? numel / *rows : 0;
}

/* Rows [row0, row0 + nrows) into dst [nrows, cols]. The per-byte codes come from tables filled by the scalar
 * conversions above (the same f32 values, without a libm call per element); a block's scale is read once per
 * block and multiplies every code of it, as the whole-tensor loop did element by element. */
static int dequant_rows(const dsv4_tensor *t, size_t row0, size_t nrows, float *dst)
{
    size_t rows, cols;
    row_shape(t, &rows, &cols);
    (void)rows;
    const uint8_t *p = t->data;
    size_t i0 = row0 * cols, n = nrows * cols;
    switch (t->dtype) {
    case DSV4_DTYPE_F32:
        memcpy(dst, p + 4 * i0, n * 4);
        return 0;
    case DSV4_DTYPE_F64:
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, p + 8 * (i0 + i), 8);
            dst[i] = (float)v;
        }
        return 0;
    case DSV4_DTYPE_BF16: /* dsv4_bf16_to_f32, inline: the bits shifted into the high half */
        for (size_t i = 0; i < n; i++) {
            const uint8_t *q = p + 2 * (i0 + i);
            const uint32_t u = (uint32_t)q[0] << 16 | (uint32_t)q[1] << 24;
            memcpy(&dst[i], &u, 4);
        }
        return 0;
    case DSV4_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            const uint8_t *q = p + 2 * (i0 + i);
            dst[i] = dsv4_f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
        }
        return 0;
    case DSV4_DTYPE_F8_E8M0:
        for (size_t i = 0; i < n; i++) dst[i] = dsv4_e8m0_to_f32(p[i0 + i]);
        return 0;
    default: break;
    }
    int rc = dsv4_tensor_check_scale(t);
    if (rc) return rc;
    if (!t->scale || (t->dtype != DSV4_DTYPE_F8_E4M3 && !dsv4_tensor_is_fp4(t)))
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s is %s, not a float tensor (integer tensors: "
                          "dsv4_model_read_i32)", t->file, t->name, dsv4_dtype_name(t->dtype));
    float e8[256]; /* E8M0 scales by code */
    for (int b = 0; b < 256; b++) e8[b] = dsv4_e8m0_to_f32((uint8_t)b);
    const uint8_t *sp = t->scale->data;
    const int f32_scale = t->scale->dtype == DSV4_DTYPE_F32;
#define SCALE(i) (f32_scale ? scale_at(t->scale, (i)) : e8[sp[i]])
    if (t->dtype == DSV4_DTYPE_F8_E4M3) {
        float code[256];
        for (int b = 0; b < 256; b++) code[b] = dsv4_e4m3_to_f32((uint8_t)b);
        size_t sc = (size_t)t->scale->shape[1];
        for (size_t r = row0; r < row0 + nrows; r++) {
            const uint8_t *src = p + r * cols;
            float *d = dst + (r - row0) * cols;
            for (size_t cb = 0; cb < sc; cb++) { /* one 128-column block of the row */
                const float s = SCALE((r / 128) * sc + cb);
                size_t c1 = (cb + 1) * 128 < cols ? (cb + 1) * 128 : cols;
                for (size_t c = cb * 128; c < c1; c++) d[c] = code[src[c]] * s;
            }
        }
        return 0;
    }
    { /* FP4 e2m1 packed (the only other quantised kind: checked above) */
        float code[16];
        for (int b = 0; b < 16; b++) code[b] = dsv4_e2m1_to_f32((uint8_t)b);
        size_t packed = (size_t)t->shape[1], sc = (size_t)t->scale->shape[1];
        for (size_t r = row0; r < row0 + nrows; r++) {
            const uint8_t *src = p + r * packed;
            float *d = dst + (r - row0) * cols;
            for (size_t j0 = 0; j0 < packed; j0 += 16) { /* 16 bytes = the 32 columns of one scale */
                const float s = SCALE(r * sc + j0 / 16);
                const size_t j1 = j0 + 16 < packed ? j0 + 16 : packed;
                for (size_t j = j0; j < j1; j++) {
                    const uint8_t b = src[j];
                    d[2 * j] = code[b & 0xf] * s;
                    d[2 * j + 1] = code[b >> 4] * s;
                }
            }
        }
        return 0;
    }
#undef SCALE
}

int dsv4_tensor_dequant_f32(const dsv4_tensor *t, float *dst, size_t numel)
{
    size_t want = dsv4_tensor_logical_numel(t);
    if (numel != want)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s has %zu elements, caller expects %zu", t->file, t->name,
                          want, numel);
    size_t rows, cols;
    row_shape(t, &rows, &cols);
    return dequant_rows(t, 0, cols ? rows : 0, dst);
}

int dsv4_tensor_dequant_rows_f32(const dsv4_tensor *t, int64_t row0, int64_t nrows, float *dst)
{
    size_t rows, cols;
    row_shape(t, &rows, &cols);
    if (t->ndim < 2 || row0 < 0 || nrows < 0 || (size_t)row0 > rows || (size_t)nrows > rows - (size_t)row0)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s: rows [%lld, %lld) of a %d-dim tensor with %zu rows", t->file,
                          t->name, (long long)row0, (long long)(row0 + nrows), t->ndim, rows);
    return dequant_rows(t, (size_t)row0, (size_t)nrows, dst);
}
