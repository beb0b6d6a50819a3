/* test_ref_gpu_emu_ops.c - the kernels of the GPU reference's bf16 emulation and following (reference/ref_gpu_emu.cu,
 * the bf16p attention of ref_gpu_attn.cu, route_reweight of ref_gpu_ops.cu) against the CPU emulation's code, on
 * inputs where the two sides can be held to (nearly) bit equality, so a rounding at the wrong place or a sum in
 * the wrong order fails here even though at the model level two faithful emulations differ by bf16-sized amounts
 * (docs/verify.md "The GPU emulation"):
 * - the rounding: every float class (random bit patterns, exact ties to even and to odd, the largest finite values
 *   that round to inf, subnormals, NaN payloads, signed zeros) bit for bit dsv4_f32_to_bf16 then back;
 * - bf16p attention: each score is ln t for a probability t a quarter bf16 ulp above a bf16 value (so the device's
 *   and the host's expf, a few ulp apart, round to the same bf16 p), every query's own row scores 0 (the row max),
 *   the values are -1/0/1 outside the score channels (P·V exact in any order): the kernel must match
 *   dsv4_ref_sink_attention_bf16p (+ the output's inverse RoPE) to 1e-6 and differ from the plain sink attention
 *   by >= 1e-5 (it rounds), on sliding, HCA, CSA (with -1 picks) and Flash-shaped cases;
 * - MoE: h · w rounded into the permuted rows (bit for bit), the unweighted slot-order sum plus the shared output
 *   (bit for bit, the CPU's float order);
 * - route_reweight: flagged rows get sqrtsoftplus(logit) / (Σ + 1e-20) · scale (1e-6), the others keep their
 *   weights bit for bit (a sentinel).
 * Outputs are poisoned with NaN before each launch. Without a CUDA device the test exits 77 (skipped).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../reference/ref_gpu.cuh"
#include "../../reference/ref_ops.h"
#include "dsv4_test.h"

#define TOL 1e-6

static unsigned long long rng_state;

static void seed(unsigned long long s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float urand(float a) /* uniform in [-a, a) */
{
    return ((float)(rng_u32() >> 8) / 16777216.0f * 2.0f - 1.0f) * a;
}
static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static void *dev(size_t bytes)
{
    void *p = NULL;
    ck_assert_int_eq(cudaMalloc(&p, bytes ? bytes : 4), cudaSuccess);
    return p;
}
static void *up_bytes(const void *h, size_t bytes)
{
    void *d = dev(bytes);
    ck_assert_int_eq(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
static float *up(const float *h, size_t n) { return up_bytes(h, n * sizeof *h); }
static float *dpoison(size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    ck_assert_ptr_nonnull(h);
    dsv4_test_poison_f32(h, n);
    float *d = up(h, n);
    free(h);
    return d;
}
static float *down(const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

/* relative L2 of got vs ref (every element finite) */
static double rel_l2(const char *what, const float *got, const float *ref, size_t n)
{
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(isfinite(got[i]), "%s: element %zu is %g (ref %g): not written", what, i, got[i], ref[i]);
        double d = (double)got[i] - ref[i];
        e2 += d * d;
        r2 += (double)ref[i] * ref[i];
    }
    return r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}

/* every element of got bit for bit ref's */
static void check_bits(const char *what, const float *got, const float *ref, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(bits_of(got[i]) == bits_of(ref[i]), "%s: element %zu is 0x%08x (%g), want 0x%08x (%g)", what, i,
                      bits_of(got[i]), got[i], bits_of(ref[i]), ref[i]);
    printf("  %-52s n=%-8zu bit for bit\n", what, n);
}

/* --------------------------------------------------------------------------------------------- rounding */
START_TEST(test_emu_round)
{
    enum { N_RAND = 1 << 20 };
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u,             /* signed zeros */
        0x7f800000u, 0xff800000u,             /* infinities */
        0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, /* the largest finite: round to inf; a tie at the top */
        0x7f7f7fffu,                          /* just below that tie: stays finite */
        0x00000001u, 0x00008000u, 0x00018000u, 0x80007fffu, 0x007fffffu, /* subnormals, ties among them */
        0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fbfffffu, 0xffffffffu, 0x7f80ffffu, /* NaNs: quieted, sign kept */
        0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, /* ties: to the even (down) and to the even (up) */
        0x3f807fffu, 0x3f808001u, 0x3fffffffu, 0x3f7fffffu, /* beside the ties; carries into the exponent */
    };
    const size_t ns = sizeof special / sizeof special[0], n = ns + N_RAND;
    float *x = malloc(n * sizeof *x), *ref = malloc(n * sizeof *ref);
    ck_assert(x && ref);
    for (size_t i = 0; i < ns; i++) x[i] = from_bits(special[i]);
    seed(34);
    for (size_t i = ns; i < n; i++) {
        uint32_t u = rng_u32();
        if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u; /* a tie: half to even down, half up */
        x[i] = from_bits(u);
    }
    for (size_t i = 0; i < n; i++) ref[i] = dsv4_bf16_to_f32(dsv4_f32_to_bf16(x[i]));
    float *dx = up(x, n);
    ck_assert_int_eq(dsv4_ref_gpu_emu_round(dx, n), 0);
    float *got = down(dx, n);
    check_bits("emu_round: specials + 2^20 random bit patterns", got, ref, n);
    free(x), free(ref), free(got);
    cudaFree(dx);
}
END_TEST

/* ---------------------------------------------------------------------------------------- bf16p attention */
/* A probability in [1/16, 1) whose low 16 bits are 0x4000: a quarter bf16 ulp above a bf16 value, 16,384 ulp from
 * the rounding midpoint, so e^{ln t} computed by any libm within a few ulp rounds to that bf16 value. */
static float quarter_above(void)
{
    float b = 1.0f / 16 + (float)(rng_u32() >> 8) / 16777216.0f * (15.0f / 16);
    return from_bits((bits_of(b) & 0xffff0000u) | 0x4000u);
}

/* The query of head h at position p is the unit vector of score channel (p + 7h) mod nc, so its score against a
 * row is that row's channel times d^-1/2. */
static int score_channel(int64_t p, int h, int nc) { return (int)((p + 7 * (int64_t)h) % nc); }

/* A key=value row [d] of position t (t < 0: a compressed entry, nobody's own row): the score channels c < nc hold
 * ln t_c · sqrt(d), except the channels of t's own queries (score_channel(t, h)), which hold 0: every query's own
 * row scores 0, the row max (p = 1), and the others ln t_c < 0 or 0. The other channels are -1/0/1. */
static void key_row(float *k, int d, int H, int nc, int64_t t)
{
    for (int c = 0; c < d; c++) k[c] = (float)((int)(rng_u32() % 3) - 1);
    for (int c = 0; c < nc; c++) k[c] = logf(quarter_above()) * sqrtf((float)d);
    for (int h = 0; t >= 0 && h < H; h++) k[score_channel(t, h, nc)] = 0.0f;
}

static void run_bf16p_case(const char *what, int S, int H, int d, int np, int window, int64_t p0, int ratio,
                           int n_pool, int csa, int n_topk)
{
    float inv[32];
    for (int i = 0; i < np; i++) inv[i] = powf(10000.0f, -(float)i / (float)np);
    seed(3400 + S + H + ratio + csa);
    const int nc = H < 16 ? 16 : H; /* score channels, below the rope channels */
    ck_assert_int_le(nc, d - 2 * np);
    float *q = calloc((size_t)S * H * d, sizeof(float)), *kv = malloc((size_t)S * d * sizeof(float));
    float *ring = calloc((size_t)window * d, sizeof(float)); /* slots before position 0 stay unread */
    float *pool = malloc((size_t)(n_pool ? n_pool : 1) * d * sizeof(float)), *sinks = malloc((size_t)H * 4);
    for (int s = 0; s < S; s++)
        for (int h = 0; h < H; h++) q[((size_t)s * H + h) * d + score_channel(p0 + s, h, nc)] = 1.0f;
    for (int s = 0; s < S; s++) key_row(kv + (size_t)s * d, d, H, nc, p0 + s);
    for (int64_t t = p0 - window > 0 ? p0 - window : 0; t < p0; t++) key_row(ring + (t % window) * d, d, H, nc, t);
    for (int w = 0; w < n_pool; w++) key_row(pool + (size_t)w * d, d, H, nc, -1);
    for (int h = 0; h < H; h++) sinks[h] = urand(2.0f);
    int32_t *topk = malloc((size_t)S * (n_topk ? n_topk : 1) * 4);
    for (int s = 0; s < S; s++)
        for (int i = 0; i < n_topk; i++)
            topk[(size_t)s * n_topk + i] = (i * 3 + s) % 5 == 4 ? -1 : (int32_t)((i * 37 + s * 11) % n_pool);
    float *cs = calloc((size_t)S * np, 4), *sn = calloc((size_t)S * np, 4);
    float *ref = calloc((size_t)S * H * d, 4), *plain = calloc((size_t)S * H * d, 4);
    int m_max = window + (csa ? n_topk : n_pool);
    float *gather = calloc((size_t)m_max * d, 4), *scores = calloc((size_t)H * m_max, 4);
    for (int s = 0; s < S; s++) {
        int64_t p = p0 + s, lo = p - window + 1 > 0 ? p - window + 1 : 0;
        int m = 0;
        dsv4_ref_rope_cos_sin(inv, np, p, cs + s * np, sn + s * np);
        for (int64_t t = lo; t <= p; t++, m++)
            memcpy(gather + (size_t)m * d, t >= p0 ? kv + (t - p0) * d : ring + (t % window) * d, d * sizeof(float));
        if (n_pool && !csa)
            for (int w = 0; w < (p + 1) / ratio; w++, m++) memcpy(gather + (size_t)m * d, pool + (size_t)w * d, d * 4);
        if (csa)
            for (int i = 0; i < n_topk; i++) {
                int32_t e = topk[(size_t)s * n_topk + i];
                if (e >= 0) memcpy(gather + (size_t)m++ * d, pool + (size_t)e * d, d * sizeof(float));
            }
        for (int pass = 0; pass < 2; pass++) {
            float *o = (pass ? plain : ref) + (size_t)s * H * d;
            if (pass) dsv4_ref_sink_attention(o, q + (size_t)s * H * d, gather, m, sinks, H, d, scores);
            else dsv4_ref_sink_attention_bf16p(o, q + (size_t)s * H * d, gather, m, sinks, H, d, scores);
            for (int h = 0; h < H; h++) dsv4_ref_rope_apply(o + (size_t)h * d, d, np, cs + s * np, sn + s * np, 1);
        }
    }
    dsv4_ref_gpu_attn_params ap;
    memset(&ap, 0, sizeof ap);
    ap.o = dpoison((size_t)S * H * d);
    ap.q = up(q, (size_t)S * H * d);
    ap.kv = up(kv, (size_t)S * d);
    ap.ring = up(ring, (size_t)window * d);
    ap.pool = n_pool ? up(pool, (size_t)n_pool * d) : NULL;
    ap.topk = csa ? up_bytes(topk, (size_t)S * n_topk * 4) : NULL;
    ap.topk_stride = n_topk;
    ap.n_topk = n_topk;
    ap.sinks = up(sinks, H);
    ap.cos_t = up(cs, (size_t)S * np);
    ap.sin_t = up(sn, (size_t)S * np);
    ap.S = S, ap.H = H, ap.d = d, ap.n_pairs = np, ap.window = window, ap.ratio = ratio, ap.p0 = p0;
    ap.m_max = m_max;
    ap.bf16p = 1;
    ck_assert_int_eq(dsv4_ref_gpu_attention_prepare(m_max, d, n_topk), 0);
    ck_assert_int_eq(dsv4_ref_gpu_attention(&ap), 0);
    float *got = down(ap.o, (size_t)S * H * d);
    const size_t n = (size_t)S * H * d;
    double e_emu = rel_l2(what, got, ref, n), e_plain = rel_l2(what, got, plain, n);
    printf("  %-52s rel_l2 %.3g to the CPU bf16p, %.3g to the plain attention\n", what, e_emu, e_plain);
    ck_assert_msg(e_emu <= TOL, "%s: relative L2 %.3g to dsv4_ref_sink_attention_bf16p > %.1g", what, e_emu, TOL);
    ck_assert_msg(e_plain >= 1e-5, "%s: relative L2 %.3g to the plain sink attention: P is not rounded (or the "
                  "test's inputs do not show it)", what, e_plain);
    cudaFree(ap.o), cudaFree((void *)ap.q), cudaFree((void *)ap.kv), cudaFree((void *)ap.ring);
    cudaFree((void *)ap.pool), cudaFree((void *)ap.topk), cudaFree((void *)ap.sinks), cudaFree((void *)ap.cos_t);
    cudaFree((void *)ap.sin_t);
    free(q), free(kv), free(ring), free(pool), free(sinks), free(topk), free(cs), free(sn), free(ref), free(plain);
    free(gather), free(scores), free(got);
}

START_TEST(test_attention_bf16p)
{
    run_bf16p_case("bf16p sliding, prefill from 0", 17, 3, 64, 8, 8, 0, 0, 0, 0, 0);
    run_bf16p_case("bf16p sliding, ring + call rows", 13, 3, 64, 8, 8, 20, 0, 0, 0, 0);
    run_bf16p_case("bf16p hca, ratio 4", 31, 5, 64, 8, 8, 3, 4, 10, 0, 0);
    run_bf16p_case("bf16p csa picks with -1", 13, 3, 64, 8, 8, 20, 4, 31, 1, 7);
    run_bf16p_case("bf16p flash csa 64x512, 128+512 keys", 2, 64, 512, 32, 128, 2598, 4, 650, 1, 512);
    run_bf16p_case("bf16p flash hca 64x512, decode", 1, 64, 512, 32, 128, 2600, 128, 20, 0, 0);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------- MoE */
START_TEST(test_moe_emu)
{
    const int S = 17, k = 3, NI = 31, D = 29, nk = S * k;
    seed(3410);
    float *h = malloc((size_t)nk * NI * 4), *w = malloc((size_t)nk * 4), *href = malloc((size_t)nk * NI * 4);
    float *y = malloc((size_t)nk * D * 4), *fo = malloc((size_t)S * D * 4), *fref = malloc((size_t)S * D * 4);
    int32_t slot[17 * 3];
    for (int i = 0; i < nk; i++) slot[i] = (i * 5 + 2) % nk; /* a permutation: gcd(5, 51) = 1 */
    for (int i = 0; i < nk * NI; i++) h[i] = urand(3.0f);
    for (int i = 0; i < nk; i++) w[i] = 0.1f + (urand(1.0f) + 1.0f);
    for (int i = 0; i < nk * D; i++) y[i] = urand(1.0f);
    for (int i = 0; i < S * D; i++) fo[i] = urand(1.0f);
    /* the CPU emulation (moe_experts_emu): eg *= wt, rounded; racc += ey in slot order from 0; fo = racc + fo */
    memcpy(href, h, (size_t)nk * NI * 4);
    for (int i = 0; i < nk; i++)
        for (int c = 0; c < NI; c++) {
            float *v = href + (size_t)slot[i] * NI + c;
            *v = dsv4_bf16_to_f32(dsv4_f32_to_bf16(*v * w[i]));
        }
    for (int s = 0; s < S; s++)
        for (int c = 0; c < D; c++) {
            float acc = 0.0f;
            for (int j = 0; j < k; j++) acc += y[(size_t)slot[s * k + j] * D + c];
            fref[s * D + c] = acc + fo[s * D + c];
        }
    float *dh = up(h, (size_t)nk * NI), *dw = up(w, nk), *dy = up(y, (size_t)nk * D), *dfo = up(fo, (size_t)S * D);
    int32_t *dslot = up_bytes(slot, sizeof slot);
    ck_assert_int_eq(dsv4_ref_gpu_moe_scale_round(dh, dslot, dw, nk, NI), 0);
    float *got = down(dh, (size_t)nk * NI);
    check_bits("moe_scale_round: bf16(h . w) into permuted rows", got, href, (size_t)nk * NI);
    ck_assert_int_eq(dsv4_ref_gpu_moe_sum(dfo, dy, dslot, S, k, D), 0);
    float *gfo = down(dfo, (size_t)S * D);
    check_bits("moe_sum: slot order, then the shared output", gfo, fref, (size_t)S * D);
    free(h), free(w), free(href), free(y), free(fo), free(fref), free(got), free(gfo);
    cudaFree(dh), cudaFree(dw), cudaFree(dy), cudaFree(dfo), cudaFree(dslot);
}
END_TEST

/* ------------------------------------------------------------------------------------------ route_reweight */
START_TEST(test_route_reweight)
{
    const int S = 19, E = 17, k = 3;
    const float scale = 2.5f, sentinel = -12345.0f;
    seed(3420);
    float *lg = malloc((size_t)S * E * 4), *wt = malloc((size_t)S * k * 4), *ref = malloc((size_t)S * k * 4);
    int32_t ids[19 * 3], flag[19];
    for (int i = 0; i < S * E; i++) lg[i] = urand(6.0f);
    lg[5] = 30.0f; /* softplus's threshold (z > 20: z) */
    for (int s = 0; s < S; s++) {
        flag[s] = s % 3 != 1;
        for (int j = 0; j < k; j++) ids[s * k + j] = (s * 7 + j * 5) % E; /* distinct: 5·j mod 17 */
        float sum = 0.0f;
        for (int j = 0; j < k; j++) {
            wt[s * k + j] = sentinel;
            ref[s * k + j] = dsv4_ref_sqrtsoftplus(lg[(size_t)s * E + ids[s * k + j]]);
            sum += ref[s * k + j];
        }
        for (int j = 0; j < k; j++) ref[s * k + j] = flag[s] ? ref[s * k + j] / (sum + 1e-20f) * scale : sentinel;
    }
    float *dlg = up(lg, (size_t)S * E), *dwt = up(wt, (size_t)S * k);
    int32_t *dids = up_bytes(ids, sizeof ids), *dflag = up_bytes(flag, sizeof flag);
    ck_assert_int_eq(dsv4_ref_gpu_route_reweight(dlg, S, E, k, dids, dflag, scale, dwt), 0);
    float *got = down(dwt, (size_t)S * k);
    for (int s = 0; s < S; s++)
        for (int j = 0; j < k; j++) {
            const float g = got[s * k + j], r = ref[s * k + j];
            if (!flag[s])
                ck_assert_msg(bits_of(g) == bits_of(sentinel), "row %d (not flagged) slot %d was written: %g", s, j, g);
            else
                ck_assert_msg(fabsf(g - r) <= 1e-6f * fabsf(r), "row %d slot %d: %.9g, want %.9g", s, j, g, r);
        }
    printf("  %-52s rows %d: flagged re-weighted, the rest untouched\n", "route_reweight", S);
    free(lg), free(wt), free(ref), free(got);
    cudaFree(dlg), cudaFree(dwt), cudaFree(dids), cudaFree(dflag);
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("ref_gpu_emu_ops");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_emu_round);
    tcase_add_test(tc, test_attention_bf16p);
    tcase_add_test(tc, test_moe_emu);
    tcase_add_test(tc, test_route_reweight);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
