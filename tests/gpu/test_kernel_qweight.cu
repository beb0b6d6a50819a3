/* test_kernel_qweight.cu - kernels/fp8_linear.cu and the grouped experts (kernels/grouped_experts.cuh) in their FP4
 * format (fp4_experts.cu) and their bf16 one (moe.cu; the same cases but the scale kinds) against CPU references
 * that dequantise with the shared loader's own functions (dsv4_e4m3_to_f32, dsv4_e2m1_to_f32, dsv4_e8m0_to_f32;
 * model/dtype.c) and multiply in double, on random codes (every finite e4m3 code, every e2m1 code), random scales (e8m0 bytes
 * 116..130, which includes scales above 2 that take the kernels' two-multiply path; f32 scales over 2^-12..2^-6),
 * random bf16 activations, fixed seeds, outputs NaN-poisoned first. Shapes: tails (n_out, n_in not multiples of
 * 128, n_in not a multiple of 16, strided x and y), S in {1, 3, 16, 64, 257}, C > 64 (two token chunks), experts
 * with more than 8 tokens (several passes), and Flash sizes.
 *
 * Tolerances: the kernels multiply the exactly dequantised weight (bf16 holds every e4m3/e2m1 value times a power
 * of two) by the bf16 activation, so each product is exact in fp32 and only the fp32 accumulation differs from the
 * double reference: about 2^-24 per addition of partial sums of the size of the result. Gates: relative L2 <= 1e-5
 * and max |err| <= 1e-5 · Σ|terms| per output (the scale at which accumulation error lives, safe under
 * cancellation). The experts' h is bf16 by contract (as moe.cu), so it is gated at one bf16 rounding (2^-8 relative)
 * plus the 1e-5 · Σ|terms| accumulation term carried through the SwiGLU (|dh/dg|, |dh/du| <= 1.1·λ·weight), and the
 * down projection is then gated at 1e-5 against a reference built from the kernel's own h. Each gate is shown to
 * fail against a deliberately wrong reference: fp8 with the scale blocks transposed, fp4 with the nibbles swapped,
 * bf16 experts with neighbouring columns swapped.
 * Determinism: a second launch must give bitwise the same output, and the experts' last token alone the same h and
 * out as in its batch (alone, a grid of few blocks: the up kernel's few-blocks variant, grouped_experts.cuh).
 */
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "dsv4_test.h"
}
#include "dsv4/dsv4.h"
#include "../../kernels/moe.cuh"
#include "../../kernels/qweight.cuh"

static uint64_t rs;
static uint32_t rnd32(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rs >> 32);
}
static double urand(void) { return (double)(rnd32() >> 8) * (1.0 / 16777216.0); } /* [0, 1) */
static uint16_t rand_bf16(double amp) { return dsv4_f32_to_bf16((float)((urand() * 2 - 1) * amp)); }

static void *to_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    ck_assert(cudaMalloc(&d, bytes ? bytes : 16) == cudaSuccess);
    if (h) ck_assert(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    else ck_assert(cudaMemset(d, 0xff, bytes) == cudaSuccess); /* NaN for f32 and bf16 */
    return d;
}
static void from_dev(void *h, const void *d, size_t bytes)
{
    ck_assert(cudaDeviceSynchronize() == cudaSuccess);
    ck_assert(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
}

/* Gate of got[i] against ref[i] with Σ|terms| mag[i]: relative L2 and max |err| / mag; prints the worst. */
typedef struct gate {
    double rel_l2, worst;
    size_t worst_i;
    int nonfinite;
} gate;
static gate gate_eval(const float *got, const double *ref, const double *mag, size_t n)
{
    gate g = {0, 0, 0, 0};
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            if (!g.nonfinite) g.worst_i = i;
            g.nonfinite++;
            continue;
        }
        const double e = fabs(got[i] - ref[i]);
        num += e * e;
        den += ref[i] * ref[i];
        const double s = e / (mag[i] > 0 ? mag[i] : 1e-30);
        if (s > g.worst) g.worst = s, g.worst_i = i;
    }
    g.rel_l2 = sqrt(num / (den > 0 ? den : 1));
    return g;
}
static int gate_pass(const gate *g, double tol) { return !g->nonfinite && g->rel_l2 <= tol && g->worst <= tol; }

/* The loader's decoders (model/dtype.c), tabulated once: the references call them per element millions of times. */
static float e8m0_tab[256], e2m1_tab[16], e4m3_tab[256];
static void tables_init(void)
{
    for (int b = 0; b < 256; b++) e8m0_tab[b] = dsv4_e8m0_to_f32((uint8_t)b), e4m3_tab[b] = dsv4_e4m3_to_f32((uint8_t)b);
    for (int b = 0; b < 16; b++) e2m1_tab[b] = dsv4_e2m1_to_f32((uint8_t)b);
}

/* ------------------------------------------------------------------------------------------------ fp8 linear */
typedef struct f8_case {
    int S, n_out, n_in, ldx_pad, ldy_pad;
    dsv4_qscale kind;
    int y_f32;
    int groups; /* > 1: a grouped linear (group_rows = n_out / groups), x holds groups x n_in columns */
} f8_case;

static const f8_case f8_cases[] = {
    {1, 32, 64, 0, 0, DSV4_QSCALE_E8M0, 1},
    {3, 96, 160, 0, 5, DSV4_QSCALE_F32, 1},
    {16, 160, 96, 8, 0, DSV4_QSCALE_E8M0, 1},
    {64, 64, 192, 0, 0, DSV4_QSCALE_F32, 1},
    {257, 96, 256, 0, 0, DSV4_QSCALE_E8M0, 1},
    {3, 33, 34, 1, 0, DSV4_QSCALE_F32, 1},       /* n_in % 16 != 0, odd ldx: the byte-wise path */
    {5, 200, 1000, 0, 0, DSV4_QSCALE_E8M0, 0},   /* bf16 out */
    {16, 1024, 1024, 0, 0, DSV4_QSCALE_E8M0, 1}, /* split-K */
    {1, 1024, 4096, 0, 0, DSV4_QSCALE_E8M0, 1},  /* Flash wq_a */
    {64, 512, 4096, 0, 0, DSV4_QSCALE_F32, 1},   /* Flash wkv, S = 64 */
    {2, 4096, 8192, 0, 0, DSV4_QSCALE_E8M0, 1},  /* Flash wo_b */
    {16, 32768, 1024, 0, 0, DSV4_QSCALE_E8M0, 0}, /* Flash wq_b, bf16 out */
    {5, 192, 96, 3, 2, DSV4_QSCALE_F32, 1, 3},     /* grouped: 3 x 64 rows, padded ldx / ldy */
    {3, 128, 34, 1, 0, DSV4_QSCALE_E8M0, 1, 2},    /* grouped, the byte-wise path */
    {64, 8192, 4096, 0, 0, DSV4_QSCALE_E8M0, 0, 8}, /* Flash wo_a: 8 x 1024 rows, S = 64, bf16 out */
};
enum { N_F8 = sizeof(f8_cases) / sizeof(f8_cases[0]) };

static uint8_t rand_e4m3(void)
{
    uint8_t b;
    do b = (uint8_t)rnd32();
    while ((b & 0x7f) == 0x7f); /* NaN codes */
    return b;
}

START_TEST(test_fp8_linear)
{
    const f8_case *k = &f8_cases[_i];
    rs = 1000 + 17 * _i;
    const int S = k->S, no = k->n_out, ni = k->n_in, sr = (no + 127) / 128, sc = (ni + 127) / 128;
    const int G = k->groups > 1 ? k->groups : 1, grows = no / G; /* row r reads x columns (r / grows)·ni.. */
    const int64_t ldx = (int64_t)G * ni + k->ldx_pad, ldy = no + k->ldy_pad;
    uint8_t *w = (uint8_t *)malloc((size_t)no * ni);
    uint16_t *x = (uint16_t *)malloc((size_t)S * ldx * 2);
    float *fs = (float *)malloc((size_t)sr * sc * 4);
    uint8_t *bs = (uint8_t *)malloc((size_t)sr * sc);
    for (size_t i = 0; i < (size_t)no * ni; i++) w[i] = rand_e4m3();
    for (size_t i = 0; i < (size_t)S * ldx; i++) x[i] = rand_bf16(1.0);
    for (int i = 0; i < sr * sc; i++) {
        bs[i] = (uint8_t)(116 + rnd32() % 15);
        fs[i] = (float)(ldexp(1.0, -12 + (int)(rnd32() % 6)) * (1.0 + urand()));
    }
    const int f32s = k->kind == DSV4_QSCALE_F32;

    dsv4_fp8_linear_params p;
    memset(&p, 0, sizeof p);
    p.n_tok = S, p.n_out = no, p.n_in = ni, p.group_rows = G > 1 ? grows : 0;
    p.x = (const uint16_t *)to_dev(x, (size_t)S * ldx * 2), p.ldx = ldx;
    p.w = (const uint8_t *)to_dev(w, (size_t)no * ni);
    p.scale = f32s ? to_dev(fs, (size_t)sr * sc * 4) : to_dev(bs, (size_t)sr * sc);
    p.scale_kind = k->kind;
    const size_t ybytes = (size_t)S * ldy * (k->y_f32 ? 4 : 2);
    p.y = to_dev(NULL, ybytes), p.y_f32 = k->y_f32, p.ldy = ldy;
    p.workspace_bytes = dsv4_opt_fp8_linear_workspace_bytes(S, no, ni);
    p.workspace = p.workspace_bytes ? to_dev(NULL, p.workspace_bytes) : NULL;
    ck_assert_msg(dsv4_opt_fp8_linear(&p) == 0, "%s", dsv4_last_error());
    void *y1 = malloc(ybytes), *y2 = malloc(ybytes);
    from_dev(y1, p.y, ybytes);
    ck_assert(cudaMemset(p.y, 0xff, ybytes) == cudaSuccess);
    ck_assert_msg(dsv4_opt_fp8_linear(&p) == 0, "%s", dsv4_last_error());
    from_dev(y2, p.y, ybytes);
    ck_assert_msg(memcmp(y1, y2, ybytes) == 0, "fp8 %dx%dx%d: two launches differ", S, no, ni);

    /* The loader's dequantisation, in f32: W[r][c] = e4m3(w) · scale[r/128][c/128]; the wrong one transposes
     * the scale grid (index (c/128, r/128) mod the grid). */
    float *wd = (float *)malloc((size_t)no * ni * 4), *wbad = (float *)malloc((size_t)no * ni * 4);
    int differs = 0; /* a grid of one block, or equal random scales, would make the wrong reference right */
    for (int r = 0; r < no; r++)
        for (int c = 0; c < ni; c++) {
            const int si = (r / 128) * sc + c / 128, sb = ((c / 128) % sr) * sc + (r / 128) % sc;
            const float q = e4m3_tab[w[(size_t)r * ni + c]];
            wd[(size_t)r * ni + c] = q * (f32s ? fs[si] : e8m0_tab[bs[si]]);
            wbad[(size_t)r * ni + c] = q * (f32s ? fs[sb] : e8m0_tab[bs[sb]]);
            differs |= wbad[(size_t)r * ni + c] != wd[(size_t)r * ni + c];
        }
    const size_t n = (size_t)S * no;
    double *ref = (double *)malloc(n * 8), *bad = (double *)malloc(n * 8), *mag = (double *)malloc(n * 8);
    float *got = (float *)malloc(n * 4);
    for (int s = 0; s < S; s++)
        for (int r = 0; r < no; r++) {
            double acc = 0, accb = 0, m = 0;
            const float *wr = wd + (size_t)r * ni, *wb = wbad + (size_t)r * ni;
            /* grouped: the wrong reference also reads group 0's columns for every row */
            const size_t xg = (size_t)s * ldx + (size_t)(r / grows) * ni, xb = G > 1 ? (size_t)s * ldx : xg;
            for (int c = 0; c < ni; c++) {
                const double xv = dsv4_bf16_to_f32(x[xg + c]), xvb = dsv4_bf16_to_f32(x[xb + c]);
                acc += wr[c] * xv, accb += wb[c] * xvb, m += fabs(wr[c] * xv);
            }
            const size_t i = (size_t)s * no + r;
            ref[i] = acc, bad[i] = accb, mag[i] = m;
            const size_t yi = (size_t)s * ldy + r;
            got[i] = k->y_f32 ? ((float *)y1)[yi] : dsv4_bf16_to_f32(((uint16_t *)y1)[yi]);
            /* bf16 out: its rounding is part of the contract, so the max gate allows 2^-8 |y| on top (expressed
             * in units of the 1e-5 gate) and the rel L2 gate is 2^-8 */
            if (!k->y_f32) mag[i] += fabs(acc) * (1.0 / 256) / 1e-5;
        }
    gate gt = gate_eval(got, ref, mag, n), gb = gate_eval(got, bad, mag, n);
    if (!k->y_f32) {
        gt.rel_l2 *= 1e-5 * 256;
        gb.rel_l2 *= 1e-5 * 256;
    }
    printf("fp8_linear S=%-3d %5dx%-5d G=%d %s scale, %s out, ws %zu B: rel L2 %.3g, max err/Σ|t| %.3g at (tok %zu, "
           "row %zu) got %.7g ref %.7g; wrong scales%s: rel L2 %.3g\n",
           S, no, ni, G, f32s ? "f32 " : "e8m0", k->y_f32 ? "f32 " : "bf16", p.workspace_bytes, gt.rel_l2, gt.worst,
           gt.worst_i / no, gt.worst_i % no, got[gt.worst_i], ref[gt.worst_i], G > 1 ? " and group 0's x" : "",
           gb.rel_l2);
    ck_assert_msg(gate_pass(&gt, 1e-5), "fp8 %dx%dx%d: rel L2 %.3g, max %.3g (tol 1e-5), %d non-finite", S, no, ni,
                  gt.rel_l2, gt.worst, gt.nonfinite);
    if (differs || G > 1)
        ck_assert_msg(!gate_pass(&gb, 1e-5), "fp8 %dx%dx%d: gate too weak (wrong scales pass)", S, no, ni);

    cudaFree((void *)p.x), cudaFree((void *)p.w), cudaFree((void *)p.scale), cudaFree(p.y), cudaFree(p.workspace);
    free(w), free(x), free(fs), free(bs), free(y1), free(y2), free(wd), free(wbad), free(ref), free(bad), free(mag);
    free(got);
}
END_TEST

START_TEST(test_fp8_rejects)
{
    dsv4_fp8_linear_params p;
    memset(&p, 0, sizeof p);
    ck_assert_int_eq(dsv4_opt_fp8_linear(NULL), DSV4_ERR_USAGE);
    p.n_tok = 1, p.n_out = 64, p.n_in = 63;
    ck_assert_int_eq(dsv4_opt_fp8_linear(&p), DSV4_ERR_USAGE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "n_in 63"));
    p.n_in = 64;
    ck_assert_int_eq(dsv4_opt_fp8_linear(&p), DSV4_ERR_USAGE); /* NULL buffers */
    void *d = to_dev(NULL, 1 << 20);
    p.x = (const uint16_t *)d, p.w = (const uint8_t *)d, p.scale = d, p.y = d, p.ldx = 64, p.ldy = 32;
    ck_assert_int_eq(dsv4_opt_fp8_linear(&p), DSV4_ERR_USAGE); /* ldy < n_out */
    p.ldy = 64, p.scale_kind = (dsv4_qscale)7;
    ck_assert_int_eq(dsv4_opt_fp8_linear(&p), DSV4_ERR_USAGE);
    p.scale_kind = DSV4_QSCALE_E8M0, p.n_out = 1024, p.ldy = 1024, p.n_in = 1024, p.ldx = 1024;
    ck_assert_uint_gt(dsv4_opt_fp8_linear_workspace_bytes(1, 1024, 1024), 0);
    ck_assert_int_eq(dsv4_opt_fp8_linear(&p), DSV4_ERR_USAGE); /* split-K without a workspace */
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "workspace"));
    p.group_rows = 96; /* not a multiple of 64 */
    ck_assert_int_eq(dsv4_opt_fp8_linear(&p), DSV4_ERR_USAGE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "group_rows 96"));
    p.group_rows = 256; /* 4 groups of 1024 input columns: ldx 1024 is too narrow */
    ck_assert_int_eq(dsv4_opt_fp8_linear(&p), DSV4_ERR_USAGE);
    cudaFree(d);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ fp4 experts */
/* Routing of a case: distinct experts per token (as top-k gives), or the quiet traps of fp4_experts.cu - ids
 * outside [0, 1024) and duplicates within a token - or expert parallel: the weights hold only experts [3, E - 2)
 * and the other pairs must add nothing. */
enum { F4_DISTINCT, F4_TRAPS, F4_EXPERT_PARALLEL };
/* Scale bytes of a case: 116..130 (about one in eight above 128, so nearly every warp's super-step takes the
 * kernels' two-multiply copy), 104..128 (every one takes the one-multiply copy), or 116..128 with one in 2,000
 * at 129..130 (both copies in one launch, a few super-steps of each warp on the rare one). */
enum { F4_SC_MIXED, F4_SC_SMALL, F4_SC_RARE };
typedef struct f4_case {
    const char *name;
    int C, E, k, D, I, routing, scales;
} f4_case;

static uint8_t f4_scale_byte(int kind)
{
    if (kind == F4_SC_SMALL) return (uint8_t)(104 + rnd32() % 25);
    if (kind == F4_SC_RARE) return (uint8_t)(rnd32() % 2000 == 0 ? 129 + rnd32() % 2 : 116 + rnd32() % 13);
    return (uint8_t)(116 + rnd32() % 15);
}

static const f4_case f4_cases[] = {
    {"minimal", 1, 4, 1, 32, 32},
    {"small, tails of 128", 5, 8, 3, 96, 160},
    {"C=70: two chunks, >8 tokens/expert", 70, 8, 6, 64, 96},
    {"C=16 E=64 k=6", 16, 64, 6, 256, 128},
    {"Flash D/I, C=3", 3, 12, 6, 4096, 2048},
    {"Flash D/I, C=1: the few-blocks up variant", 1, 12, 6, 4096, 2048},
    {"k=16, busy experts", 64, 20, 16, 64, 64},
    {"ids -1/1024/5000 and duplicates", 9, 8, 4, 64, 64, F4_TRAPS},
    {"expert parallel [3, E-2)", 12, 10, 3, 64, 96, F4_EXPERT_PARALLEL},
    {"Flash D/I, C=3, scales <= 2", 3, 12, 6, 4096, 2048, F4_DISTINCT, F4_SC_SMALL},
    {"C=70, scales <= 2", 70, 8, 6, 64, 96, F4_DISTINCT, F4_SC_SMALL},
    {"Flash D/I, C=2, rare scales > 2", 2, 12, 6, 4096, 2048, F4_DISTINCT, F4_SC_RARE},
};
enum { N_F4 = sizeof(f4_cases) / sizeof(f4_cases[0]) };

/* The loader's dequantisation of one code: e2m1(nibble) · e8m0(scale), in f32. */
static float f4_deq(const uint8_t *w, const uint8_t *s, size_t row, int cols, int c, int swap)
{
    const uint8_t b = w[row * (cols / 2) + c / 2];
    const int hi = (c & 1) ^ swap;
    return e2m1_tab[hi ? b >> 4 : b & 0xf] * e8m0_tab[s[row * (cols / 32) + c / 32]];
}

/* One expert matrix of a case in either format: FP4 codes + e8m0 scales, or bf16. `bad` reads it wrongly for the
 * weak-gate checks: nibbles swapped (FP4), neighbouring columns swapped (bf16). */
typedef struct ex_matrix {
    const uint8_t *codes, *scales; /* FP4 */
    const uint16_t *bf16;          /* bf16 (codes NULL) */
} ex_matrix;
static double ex_weight(const ex_matrix *w, size_t row, int cols, int c, int bad)
{
    if (w->codes) return f4_deq(w->codes, w->scales, row, cols, c, bad);
    return dsv4_bf16_to_f32(w->bf16[row * cols + (c ^ bad)]);
}

/* Does the call hold expert `id` (the kernel computes the pair), or must the pair be skipped? */
static int f4_held(int id, int e_lo, int e_hi) { return id >= e_lo && id < e_hi && id < 1024; }

/* One case of the grouped experts (grouped_experts.cuh) with the FP4 format (dsv4_opt_fp4_experts) or the bf16 one
 * (dsv4_opt_moe_experts, whose shapes here are all multiples of 16, so it takes the grouped kernels). */
static void experts_case(const f4_case *k, int bf16, int case_no)
{
    rs = 5000 + 31 * case_no + (bf16 ? 7919 : 0);
    const char *fmt = bf16 ? "moe_experts (bf16)" : "fp4_experts";
    const int C = k->C, E = k->E, K = k->k, D = k->D, I = k->I;
    const float lim = 2.5f; /* small: the clamps act */
    /* the experts held: [e_lo, e_hi), expert e at index e - e_lo */
    const int ep = k->routing == F4_EXPERT_PARALLEL, e_lo = ep ? 3 : 0, e_hi = ep ? E - 2 : E;
    const size_t n13 = (size_t)(e_hi - e_lo) * 2 * I * D, n2 = (size_t)(e_hi - e_lo) * D * I; /* weights */
    uint8_t *w13 = NULL, *w2 = NULL, *s13 = NULL, *s2 = NULL;
    uint16_t *b13 = NULL, *b2 = NULL;
    int n_big = 0; /* scale bytes above 128 */
    if (bf16) {
        b13 = (uint16_t *)malloc(n13 * 2), b2 = (uint16_t *)malloc(n2 * 2);
        for (size_t i = 0; i < n13; i++) b13[i] = rand_bf16(0.25);
        for (size_t i = 0; i < n2; i++) b2[i] = rand_bf16(0.25);
    } else {
        w13 = (uint8_t *)malloc(n13 / 2), w2 = (uint8_t *)malloc(n2 / 2);
        s13 = (uint8_t *)malloc(n13 / 32), s2 = (uint8_t *)malloc(n2 / 32);
        for (size_t i = 0; i < n13 / 2; i++) w13[i] = (uint8_t)rnd32();
        for (size_t i = 0; i < n2 / 2; i++) w2[i] = (uint8_t)rnd32();
        for (size_t i = 0; i < n13 / 32; i++) s13[i] = f4_scale_byte(k->scales), n_big += s13[i] > 128;
        for (size_t i = 0; i < n2 / 32; i++) s2[i] = f4_scale_byte(k->scales), n_big += s2[i] > 128;
        ck_assert_msg(k->scales == F4_SC_SMALL ? n_big == 0 : n_big > 0, "%s: %d scales > 2", k->name, n_big);
    }
    const ex_matrix m13 = {w13, s13, b13}, m2 = {w2, s2, b2};
    uint16_t *x = (uint16_t *)malloc((size_t)C * D * 2);
    for (size_t i = 0; i < (size_t)C * D; i++) x[i] = rand_bf16(1.0);
    int32_t *ids = (int32_t *)malloc((size_t)C * K * 4);
    float *wt = (float *)malloc((size_t)C * K * 4), *sh = (float *)malloc((size_t)C * D * 4);
    for (int c = 0; c < C; c++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do { /* distinct experts per token, as top-k gives (the traps case allows duplicates) */
                e = (int)(rnd32() % E), dup = 0;
                for (int q = 0; q < j && k->routing != F4_TRAPS; q++) dup |= ids[c * K + q] == e;
            } while (dup);
            if (k->routing != F4_DISTINCT && rnd32() % 5 == 0) { /* an id the kernel must skip */
                const int bad[3] = {-1, 1024, 5000};
                e = bad[rnd32() % 3];
            }
            if (k->routing == F4_TRAPS && j == 1 && c % 3 == 0) e = ids[c * K]; /* the same expert twice */
            ids[c * K + j] = e;
            wt[c * K + j] = (float)(0.1 + urand());
        }
    for (size_t i = 0; i < (size_t)C * D; i++) sh[i] = (float)(urand() * 2 - 1);

    /* both formats' parameters carry the same fields but the weights */
    dsv4_fp4_experts_params p;
    dsv4_moe_experts_params pb;
    memset(&p, 0, sizeof p);
    p.n_tok = C, p.k = K, p.dim = D, p.inter = I, p.limit = lim;
    if (ep) p.e_begin = e_lo, p.e_end = e_hi;
    p.x = (const uint16_t *)to_dev(x, (size_t)C * D * 2);
    p.ids = (const int32_t *)to_dev(ids, (size_t)C * K * 4);
    p.weights = (const float *)to_dev(wt, (size_t)C * K * 4);
    if (bf16) {
        p.w13 = (const uint8_t *)to_dev(b13, n13 * 2), p.w2 = (const uint8_t *)to_dev(b2, n2 * 2);
    } else {
        p.w13 = (const uint8_t *)to_dev(w13, n13 / 2), p.s13 = (const uint8_t *)to_dev(s13, n13 / 32);
        p.w2 = (const uint8_t *)to_dev(w2, n2 / 2), p.s2 = (const uint8_t *)to_dev(s2, n2 / 32);
        /* the kernel's bit layout; the references below read the checkpoint layout kept in w13 / w2 */
        ck_assert_msg(dsv4_opt_fp4_repack((uint8_t *)p.w13, n13 / 2, 0) == 0, "%s", dsv4_last_error());
        ck_assert_msg(dsv4_opt_fp4_repack((uint8_t *)p.w2, n2 / 2, 0) == 0, "%s", dsv4_last_error());
    }
    p.h = (uint16_t *)to_dev(NULL, (size_t)C * K * I * 2);
    p.shared = (const float *)to_dev(sh, (size_t)C * D * 4), p.shared_stride = D;
    p.out = (float *)to_dev(NULL, (size_t)C * D * 4);
    memset(&pb, 0, sizeof pb);
    pb.n_tok = C, pb.k = K, pb.dim = D, pb.inter = I, pb.limit = lim, pb.e_begin = p.e_begin, pb.e_end = p.e_end;
    pb.x = p.x, pb.ids = p.ids, pb.weights = p.weights, pb.h = p.h, pb.shared = p.shared, pb.out = p.out;
    pb.w13 = (const uint16_t *)p.w13, pb.w2 = (const uint16_t *)p.w2, pb.shared_stride = D;
    const int rc1 = bf16 ? dsv4_opt_moe_experts(&pb) : dsv4_opt_fp4_experts(&p);
    ck_assert_msg(rc1 == 0, "%s", dsv4_last_error());
    const size_t nh = (size_t)C * K * I, no = (size_t)C * D;
    uint16_t *hk = (uint16_t *)malloc(nh * 2);
    float *out = (float *)malloc(no * 4), *out2 = (float *)malloc(no * 4), *hg = (float *)malloc(nh * 4);
    from_dev(hk, p.h, nh * 2);
    from_dev(out, p.out, no * 4);
    ck_assert(cudaMemset(p.out, 0xff, no * 4) == cudaSuccess);
    const int rc2 = bf16 ? dsv4_opt_moe_experts(&pb) : dsv4_opt_fp4_experts(&p);
    ck_assert_msg(rc2 == 0, "%s", dsv4_last_error());
    from_dev(out2, p.out, no * 4);
    ck_assert_msg(memcmp(out, out2, no * 4) == 0, "%s %s: two launches differ", fmt, k->name);
    /* batch invariance: the last token alone gives the same bits as in the batch. Alone it takes a grid of a few
     * blocks, so where the batch's grid is large this crosses the up kernel's two variants (grouped_experts.cuh). */
    if (C > 1) {
        const size_t c1 = (size_t)C - 1;
        dsv4_fp4_experts_params p1 = p;
        p1.n_tok = 1, p1.x = p.x + c1 * D, p1.ids = p.ids + c1 * K, p1.weights = p.weights + c1 * K;
        p1.shared = p.shared + c1 * D;
        p1.h = (uint16_t *)to_dev(NULL, (size_t)K * I * 2), p1.out = (float *)to_dev(NULL, (size_t)D * 4);
        dsv4_moe_experts_params pb1 = pb;
        pb1.n_tok = 1, pb1.x = p1.x, pb1.ids = p1.ids, pb1.weights = p1.weights, pb1.shared = p1.shared;
        pb1.h = p1.h, pb1.out = p1.out;
        const int rc = bf16 ? dsv4_opt_moe_experts(&pb1) : dsv4_opt_fp4_experts(&p1);
        ck_assert_msg(rc == 0, "%s", dsv4_last_error());
        uint16_t *h1 = (uint16_t *)malloc((size_t)K * I * 2);
        float *o1 = (float *)malloc((size_t)D * 4);
        from_dev(h1, p1.h, (size_t)K * I * 2);
        from_dev(o1, p1.out, (size_t)D * 4);
        ck_assert_msg(memcmp(o1, out + c1 * D, (size_t)D * 4) == 0,
                      "%s %s: token %zu alone: out differs from the batch's", fmt, k->name, c1);
        for (int j = 0; j < K; j++)
            if (f4_held(ids[c1 * K + j], e_lo, e_hi))
                ck_assert_msg(memcmp(h1 + (size_t)j * I, hk + (c1 * K + j) * I, (size_t)I * 2) == 0,
                              "%s %s: token %zu alone: h of pair %d differs from the batch's", fmt, k->name, c1, j);
        cudaFree(p1.h), cudaFree(p1.out), free(h1), free(o1);
    }

    /* up: h in double from the loader's dequantisation (and read wrongly for the weak-gate check) */
    double *href = (double *)malloc(nh * 8), *hbad = (double *)malloc(nh * 8), *hmag = (double *)malloc(nh * 8);
    for (int c = 0; c < C; c++)
        for (int j = 0; j < K; j++) {
            const int e = ids[c * K + j] - e_lo; /* the held expert's index */
            const size_t pr = (size_t)c * K + j;
            for (int m = 0; m < I; m++) {
                if (!f4_held(ids[pr], e_lo, e_hi)) { /* skipped pair: h undefined (not compared), adds nothing */
                    href[pr * I + m] = hbad[pr * I + m] = 0, hmag[pr * I + m] = 1;
                    continue;
                }
                double h2[2], mg = 0;
                for (int sw = 0; sw < 2; sw++) {
                    double g = 0, u = 0, ag = 0, au = 0;
                    const size_t rg = (size_t)e * 2 * I + m, ru = rg + I;
                    for (int i = 0; i < D; i++) {
                        const double xv = dsv4_bf16_to_f32(x[(size_t)c * D + i]);
                        const double tg = ex_weight(&m13, rg, D, i, sw) * xv, tu = ex_weight(&m13, ru, D, i, sw) * xv;
                        g += tg, u += tu, ag += fabs(tg), au += fabs(tu);
                    }
                    g = fmin(g, lim), u = fmax(fmin(u, lim), -lim);
                    h2[sw] = g / (1 + exp(-g)) * u * wt[pr];
                    if (!sw) mg = 1.1 * lim * wt[pr] * (ag + au);
                }
                href[pr * I + m] = h2[0], hbad[pr * I + m] = h2[1];
                /* one bf16 rounding, expressed in units of the 1e-5 gate */
                hmag[pr * I + m] = mg + fabs(h2[0]) * (1.0 / 256) / 1e-5;
            }
        }
    for (size_t i = 0; i < nh; i++)
        hg[i] = f4_held(ids[i / I], e_lo, e_hi) ? dsv4_bf16_to_f32(hk[i]) : 0.0f; /* the kernel leaves those rows */
    gate gh = gate_eval(hg, href, hmag, nh), ghb = gate_eval(hg, hbad, hmag, nh);
    /* down: from the kernel's own h, in double */
    double *oref = (double *)malloc(no * 8), *obad = (double *)malloc(no * 8), *omag = (double *)malloc(no * 8);
    for (int c = 0; c < C; c++)
        for (int r = 0; r < D; r++) {
            double acc = 0, accb = 0, mg = 0;
            for (int j = 0; j < K; j++) {
                if (!f4_held(ids[c * K + j], e_lo, e_hi)) continue; /* its h is still the NaN poison */
                const int e = ids[c * K + j] - e_lo;
                const size_t row = (size_t)e * D + r;
                for (int m = 0; m < I; m++) {
                    const double hv = hg[((size_t)c * K + j) * I + m];
                    const double t = ex_weight(&m2, row, I, m, 0) * hv;
                    acc += t, mg += fabs(t), accb += ex_weight(&m2, row, I, m, 1) * hv;
                }
            }
            oref[(size_t)c * D + r] = acc + sh[(size_t)c * D + r];
            obad[(size_t)c * D + r] = accb + sh[(size_t)c * D + r];
            omag[(size_t)c * D + r] = mg + fabs(sh[(size_t)c * D + r]);
        }
    gate go = gate_eval(out, oref, omag, no), gob = gate_eval(out, obad, omag, no);
    printf("%s %-36s C=%d E=%d k=%d D=%d I=%d, %d scales > 2: h rel L2 %.3g, max %.3g (units of 1e-5 + 1 bf16 ulp); "
           "out rel L2 %.3g, max err/Σ|t| %.3g at (tok %zu, row %zu) got %.7g ref %.7g; read wrongly: h max %.3g, "
           "out rel L2 %.3g\n",
           fmt, k->name, C, E, K, D, I, n_big, gh.rel_l2, gh.worst, go.rel_l2, go.worst, go.worst_i / D,
           go.worst_i % D, out[go.worst_i], oref[go.worst_i], ghb.worst, gob.rel_l2);
    ck_assert_msg(!gh.nonfinite && gh.worst <= 1e-5 && gh.rel_l2 <= 4e-3,
                  "%s %s: h max %.3g (tol 1e-5 units), rel L2 %.3g (tol 4e-3), %d non-finite (first at %zu)", fmt,
                  k->name, gh.worst, gh.rel_l2, gh.nonfinite, gh.worst_i);
    ck_assert_msg(gate_pass(&go, 1e-5), "%s %s: out rel L2 %.3g, max %.3g (tol 1e-5), %d non-finite", fmt, k->name,
                  go.rel_l2, go.worst, go.nonfinite);
    ck_assert_msg(ghb.worst > 1e-5, "%s %s: h gate too weak (the wrong reading passes)", fmt, k->name);
    ck_assert_msg(!gate_pass(&gob, 1e-5), "%s %s: out gate too weak (the wrong reading passes)", fmt, k->name);

    cudaFree((void *)p.x), cudaFree((void *)p.ids), cudaFree((void *)p.weights), cudaFree((void *)p.w13);
    cudaFree((void *)p.s13), cudaFree((void *)p.w2), cudaFree((void *)p.s2), cudaFree(p.h);
    cudaFree((void *)p.shared), cudaFree(p.out);
    free(w13), free(w2), free(s13), free(s2), free(b13), free(b2), free(x), free(ids), free(wt), free(sh), free(hk);
    free(out), free(out2), free(hg), free(href), free(hbad), free(hmag), free(oref), free(obad), free(omag);
}

START_TEST(test_fp4_experts)
{
    experts_case(&f4_cases[_i], 0, _i);
}
END_TEST

/* The bf16 format on the cases whose scale kind does not matter to it (the first of each shape and routing). */
START_TEST(test_bf16_experts)
{
    int n = -1, i = 0;
    for (; i < N_F4; i++)
        if (f4_cases[i].scales == F4_SC_MIXED && ++n == _i) break;
    ck_assert_int_lt(i, N_F4);
    experts_case(&f4_cases[i], 1, i);
}
END_TEST

static int n_bf16_cases(void)
{
    int n = 0;
    for (int i = 0; i < N_F4; i++) n += f4_cases[i].scales == F4_SC_MIXED;
    return n;
}

START_TEST(test_fp4_rejects)
{
    dsv4_fp4_experts_params p;
    memset(&p, 0, sizeof p);
    ck_assert_int_eq(dsv4_opt_fp4_experts(NULL), DSV4_ERR_USAGE);
    p.n_tok = 1, p.k = 6, p.dim = 48, p.inter = 64;
    ck_assert_int_eq(dsv4_opt_fp4_experts(&p), DSV4_ERR_USAGE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "dim 48"));
    p.dim = 64, p.k = 17;
    ck_assert_int_eq(dsv4_opt_fp4_experts(&p), DSV4_ERR_USAGE);
    p.k = 6;
    ck_assert_int_eq(dsv4_opt_fp4_experts(&p), DSV4_ERR_USAGE); /* NULL buffers */
    uint8_t *d = (uint8_t *)to_dev(NULL, 1 << 16);
    p.x = (const uint16_t *)(d + 2), p.ids = (const int32_t *)d, p.weights = (const float *)d;
    p.w13 = p.s13 = p.w2 = p.s2 = d, p.h = (uint16_t *)d, p.out = (float *)d;
    ck_assert_int_eq(dsv4_opt_fp4_experts(&p), DSV4_ERR_USAGE); /* misaligned x */
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "aligned"));
    ck_assert_int_eq(dsv4_opt_fp4_repack(NULL, 16, 0), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_opt_fp4_repack(d + 2, 16, 0), DSV4_ERR_USAGE); /* not on a word */
    ck_assert_int_eq(dsv4_opt_fp4_repack(d, 18, 0), DSV4_ERR_USAGE);     /* not whole words */
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "whole 32-bit words"));
    cudaFree(d);
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    tables_init();
    Suite *s = suite_create("kernel_qweight");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_fp8_linear, 0, N_F8);
    tcase_add_test(tc, test_fp8_rejects);
    tcase_add_loop_test(tc, test_fp4_experts, 0, N_F4);
    tcase_add_loop_test(tc, test_bf16_experts, 0, n_bf16_cases());
    tcase_add_test(tc, test_fp4_rejects);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
