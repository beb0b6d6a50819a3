/* test_kernel_sparse_attn.cu - kernels/sparse_attn.cu, both variants of the `attn` switch, against a CPU
 * computation in double precision on the SAME bf16-rounded inputs (fresh random inputs per case, fixed seeds).
 *
 * Tolerances (relative L2 over the whole output, plus every element finite: outputs are NaN-poisoned first):
 *   simt, f32 out: 1e-5   fp32 accumulation and expf over exact bf16 inputs; observed ~1e-7.
 *   simt, bf16 out: 4e-3  the output rounding alone is ~2^-9/sqrt(3) = 1.1e-3 relative.
 *   mma (either out): 4e-3 the probabilities enter the P.V mma as bf16 (the same ~1.1e-3 per weight, averaged over
 *                     the entries); the running sum uses the rounded p, so there is no normalisation bias.
 * Each gate is shown to fail: the same GPU output against a reference without the sink, and without the
 * inverse RoPE, must miss the tolerance.
 * The fp8 cache form (kv8, kernels/kv_layout.h): random entries (codes, scales, bf16 rope, garbage padding) and
 * the bf16 rows of their values must give the SAME output bits, for both kernels and both output types.
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
#include "../../kernels/kv_layout.h"
#include "../../kernels/sparse_attn.cuh"

typedef struct attn_case {
    const char *name;
    int C, H, d, rope, n_idx, n_slots;
    double hole_rate;   /* fraction of -1 entries */
    int all_holes_seq;  /* this sequence gets only -1 (or -1 for none) */
    float q_amp;        /* sharpness of the softmax */
} attn_case;

typedef struct attn_data {
    uint16_t *q, *kv;
    int32_t *idx;
    float *sink, *cs, *sn;
} attn_data;

static uint64_t rng_state;
static double rng_uniform(void) /* [0, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static uint16_t rng_bf16(double amp)
{
    return dsv4_f32_to_bf16((float)((rng_uniform() * 2 - 1) * amp));
}

static void attn_data_make(const attn_case *k, attn_data *a, uint64_t seed)
{
    rng_state = seed;
    size_t nq = (size_t)k->C * k->H * k->d, nkv = (size_t)k->C * k->n_slots * k->d;
    a->q = (uint16_t *)malloc(nq * 2);
    a->kv = (uint16_t *)malloc(nkv * 2);
    a->idx = (int32_t *)malloc((size_t)k->C * k->n_idx * 4);
    a->sink = (float *)malloc((size_t)k->H * 4);
    a->cs = (float *)malloc((size_t)k->C * (k->rope / 2 + 1) * 4);
    a->sn = (float *)malloc((size_t)k->C * (k->rope / 2 + 1) * 4);
    for (size_t i = 0; i < nq; i++) a->q[i] = rng_bf16(k->q_amp);
    for (size_t i = 0; i < nkv; i++) a->kv[i] = rng_bf16(1.0);
    for (int c = 0; c < k->C; c++)
        for (int j = 0; j < k->n_idx; j++) {
            int v = (int)(rng_uniform() * k->n_slots);
            if (rng_uniform() < k->hole_rate || c == k->all_holes_seq) v = -1;
            a->idx[(size_t)c * k->n_idx + j] = v;
        }
    for (int h = 0; h < k->H; h++) a->sink[h] = (float)(rng_uniform() * 4 - 0.5); /* large enough to matter */
    for (int i = 0; i < k->C * (k->rope / 2); i++) {
        double ang = rng_uniform() * 6.283185307179586;
        a->cs[i] = (float)cos(ang);
        a->sn[i] = (float)sin(ang);
    }
}

static void attn_data_free(attn_data *a)
{
    free(a->q);
    free(a->kv);
    free(a->idx);
    free(a->sink);
    free(a->cs);
    free(a->sn);
}

/* The CPU computation; use_sink / use_rope = 0 give the deliberately wrong references. */
static void attn_cpu(const attn_case *k, const attn_data *a, int use_sink, int use_rope, double *out)
{
    const int d = k->d;
    const double scale = 1.0 / sqrt((double)d);
    double *s = (double *)malloc(sizeof(double) * k->n_idx), *o = (double *)malloc(sizeof(double) * d);
    for (int c = 0; c < k->C; c++)
        for (int h = 0; h < k->H; h++) {
            const uint16_t *q = a->q + ((size_t)c * k->H + h) * d;
            double m = use_sink ? a->sink[h] : -INFINITY;
            for (int j = 0; j < k->n_idx; j++) {
                int slot = a->idx[(size_t)c * k->n_idx + j];
                s[j] = -INFINITY;
                if (slot < 0) continue;
                const uint16_t *kv = a->kv + ((size_t)c * k->n_slots + slot) * d;
                double dot = 0;
                for (int i = 0; i < d; i++) dot += (double)dsv4_bf16_to_f32(q[i]) * dsv4_bf16_to_f32(kv[i]);
                s[j] = dot * scale;
                if (s[j] > m) m = s[j];
            }
            double den = use_sink ? exp(a->sink[h] - m) : 0.0;
            memset(o, 0, sizeof(double) * d);
            for (int j = 0; j < k->n_idx; j++) {
                int slot = a->idx[(size_t)c * k->n_idx + j];
                if (slot < 0) continue;
                double pj = exp(s[j] - m);
                den += pj;
                const uint16_t *kv = a->kv + ((size_t)c * k->n_slots + slot) * d;
                for (int i = 0; i < d; i++) o[i] += pj * dsv4_bf16_to_f32(kv[i]);
            }
            double *dst = out + ((size_t)c * k->H + h) * d;
            for (int i = 0; i < d; i++) dst[i] = den > 0 ? o[i] / den : 0.0;
            for (int i = 0; use_rope && i < k->rope / 2; i++) {
                int ch = d - k->rope + 2 * i;
                double cs = a->cs[c * (k->rope / 2) + i], sn = a->sn[c * (k->rope / 2) + i];
                double x = dst[ch], y = dst[ch + 1];
                dst[ch] = x * cs + y * sn;
                dst[ch + 1] = y * cs - x * sn;
            }
        }
    free(s);
    free(o);
}

/* Device buffers for one case. */
typedef struct attn_dev {
    dsv4_sparse_attn_params p;
    void *bufs[8];
} attn_dev;

static void attn_dev_make(const attn_case *k, const attn_data *a, dsv4_attn_kernel kern, dsv4_out_dtype od,
                          attn_dev *dv)
{
    memset(dv, 0, sizeof(*dv));
    size_t nq = (size_t)k->C * k->H * k->d, nkv = (size_t)k->C * k->n_slots * k->d, nr = (size_t)k->C * (k->rope / 2 + 1);
    size_t sz[7] = {nq * 2, nkv * 2, (size_t)k->C * k->n_idx * 4, (size_t)k->H * 4, nr * 4, nr * 4, nq * 4};
    const void *src[6] = {a->q, a->kv, a->idx, a->sink, a->cs, a->sn};
    for (int i = 0; i < 7; i++) {
        ck_assert_int_eq(cudaMalloc(&dv->bufs[i], sz[i]), cudaSuccess);
        if (i < 6) ck_assert_int_eq(cudaMemcpy(dv->bufs[i], src[i], sz[i], cudaMemcpyHostToDevice), cudaSuccess);
    }
    dsv4_sparse_attn_params *p = &dv->p;
    p->n_seq = k->C;
    p->n_heads = k->H;
    p->head_dim = k->d;
    p->rope_dim = k->rope;
    p->n_idx = k->n_idx;
    p->n_slots = k->n_slots;
    p->scale = (float)(1.0 / sqrt((double)k->d));
    p->q = (const uint16_t *)dv->bufs[0];
    p->kv = (const uint16_t *)dv->bufs[1];
    p->kv_seq_stride = (int64_t)k->n_slots * k->d;
    p->idx = (const int32_t *)dv->bufs[2];
    p->sink = (const float *)dv->bufs[3];
    p->rope_cos = (const float *)dv->bufs[4];
    p->rope_sin = (const float *)dv->bufs[5];
    p->out = dv->bufs[6];
    p->out_dtype = od;
    p->kernel = kern;
    p->stream = 0;
    p->workspace_bytes = dsv4_opt_sparse_attn_workspace_bytes(p);
    if (p->workspace_bytes) {
        ck_assert_int_eq(cudaMalloc(&dv->bufs[7], p->workspace_bytes), cudaSuccess);
        p->workspace = dv->bufs[7];
    }
}

static void attn_dev_free(attn_dev *dv)
{
    for (int i = 0; i < 8; i++) cudaFree(dv->bufs[i]);
}

/* Poison, run, read back as float. */
static void attn_dev_run(const attn_case *k, attn_dev *dv, float *out)
{
    size_t n = (size_t)k->C * k->H * k->d;
    ck_assert_int_eq(cudaMemset(dv->p.out, 0xff, n * 4), cudaSuccess); /* NaN in f32 and bf16 */
    int rc = dsv4_opt_sparse_attn(&dv->p);
    ck_assert_msg(rc == 0, "dsv4_opt_sparse_attn: %s", dsv4_last_error());
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    if (dv->p.out_dtype == DSV4_OUT_F32) {
        ck_assert_int_eq(cudaMemcpy(out, dv->p.out, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
        uint16_t *b = (uint16_t *)malloc(n * 2);
        ck_assert_int_eq(cudaMemcpy(b, dv->p.out, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t i = 0; i < n; i++) out[i] = dsv4_bf16_to_f32(b[i]);
        free(b);
    }
}

static double rel_l2(const float *x, const double *ref, size_t n, size_t *bad)
{
    double e = 0, r = 0;
    *bad = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) && *bad == (size_t)-1) *bad = i;
        e += (x[i] - ref[i]) * (x[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

static const attn_case cases[] = {
    {"one entry", 1, 4, 32, 16, 1, 8, 0.0, -1, 1.0f},
    {"17 entries, holes", 3, 16, 64, 16, 17, 50, 0.2, -1, 2.0f},
    {"31 entries (< 64)", 2, 16, 64, 32, 31, 40, 0.1, -1, 1.0f},
    {"257 entries, holes", 2, 4, 32, 32, 257, 300, 0.2, -1, 3.0f},
    {"all holes in seq 1", 2, 16, 64, 64, 40, 64, 0.0, 1, 1.0f},
    {"H=20, d=48", 2, 20, 48, 16, 70, 90, 0.1, -1, 2.0f},
    {"H=80 (two head groups)", 2, 80, 64, 64, 100, 128, 0.05, -1, 2.0f},
    {"Flash 64x512, 640 entries", 3, 64, 512, 64, 640, 1152, 0.05, -1, 4.0f},
};
enum { N_CASES = sizeof(cases) / sizeof(cases[0]) };

static void check_case(int ci, dsv4_attn_kernel kern, dsv4_out_dtype od)
{
    const attn_case *k = &cases[ci];
    attn_data a;
    attn_data_make(k, &a, 1000 + 17 * ci + 3 * kern + od);
    attn_dev dv;
    attn_dev_make(k, &a, kern, od, &dv);
    size_t n = (size_t)k->C * k->H * k->d;
    float *got = (float *)malloc(n * 4);
    attn_dev_run(k, &dv, got); /* before the reference is allocated: nothing stale can pass */
    double *ref = (double *)malloc(n * 8);
    attn_cpu(k, &a, 1, 1, ref);
    size_t bad;
    double rel = rel_l2(got, ref, n, &bad);
    double tol = (kern == DSV4_ATTN_KERNEL_SIMT && od == DSV4_OUT_F32) ? 1e-5 : 4e-3;
    printf("sparse_attn %-4s %-4s %-28s C=%d H=%d d=%d n_idx=%d split_ws=%zu B: rel L2 %.3g (tol %.0e)\n",
           kern == DSV4_ATTN_KERNEL_MMA ? "mma" : "simt", od == DSV4_OUT_F32 ? "f32" : "bf16", k->name, k->C, k->H,
           k->d, k->n_idx, dv.p.workspace_bytes, rel, tol);
    ck_assert_msg(bad == (size_t)-1, "%s: output[%zu] = %g not written / not finite", k->name, bad, got[bad]);
    ck_assert_msg(rel < tol, "%s: relative L2 %.3g >= %.0e", k->name, rel, tol);
    if (k->all_holes_seq >= 0) /* the sink takes all the probability: exactly 0 */
        for (size_t i = (size_t)k->all_holes_seq * k->H * k->d; i < (size_t)(k->all_holes_seq + 1) * k->H * k->d; i++)
            ck_assert_msg(got[i] == 0.0f, "%s: all-holes output[%zu] = %g, want 0", k->name, i, got[i]);
    /* The gate fails on wrong references. */
    if (k->n_idx > 1 && k->all_holes_seq < 0) {
        attn_cpu(k, &a, 0, 1, ref);
        double rel_nosink = rel_l2(got, ref, n, &bad);
        attn_cpu(k, &a, 1, 0, ref);
        double rel_norope = rel_l2(got, ref, n, &bad);
        ck_assert_msg(rel_nosink > tol && rel_norope > tol, "%s: gate too weak: no-sink %.3g, no-rope %.3g", k->name,
                      rel_nosink, rel_norope);
    }
    free(ref);
    free(got);
    attn_dev_free(&dv);
    attn_data_free(&a);
}

START_TEST(test_mma_f32)
{
    check_case(_i, DSV4_ATTN_KERNEL_MMA, DSV4_OUT_F32);
}
END_TEST

START_TEST(test_mma_bf16)
{
    check_case(_i, DSV4_ATTN_KERNEL_MMA, DSV4_OUT_BF16);
}
END_TEST

START_TEST(test_simt_f32)
{
    check_case(_i, DSV4_ATTN_KERNEL_SIMT, DSV4_OUT_F32);
}
END_TEST

START_TEST(test_simt_bf16)
{
    check_case(_i, DSV4_ATTN_KERNEL_SIMT, DSV4_OUT_BF16);
}
END_TEST

/* Split-K with a fixed-order combine: two runs (output poisoned in between) are bitwise identical. */
/* The fp8 cache form against the bf16 rows of the same values: bit for bit (the expansion is exact). */
static void check_fp8_form(int ci, dsv4_attn_kernel kern, dsv4_out_dtype od)
{
    const attn_case *k = &cases[ci];
    if (!dsv4_kv8_shape_ok(k->d, k->rope)) return; /* no nope part, or not in 8s: the layout refuses it */
    attn_data a;
    attn_data_make(k, &a, 5000 + 17 * ci + 3 * kern + od);
    const int nope = k->d - k->rope, eb = (int)dsv4_kv8_entry_bytes(k->d, k->rope);
    const size_t n_ent = (size_t)k->C * k->n_slots;
    uint8_t *e8 = (uint8_t *)malloc(n_ent * eb);
    memset(e8, 0xff, n_ent * eb); /* the padding stays 0xff: never data */
    for (size_t s = 0; s < n_ent; s++) {
        uint8_t *e = e8 + s * eb;
        uint16_t *row = a.kv + s * k->d;
        uint8_t *scales = e + dsv4_kv8_scales_at(k->d, k->rope);
        for (int b = 0; b < dsv4_kv8_scales(nope); b++) scales[b] = (uint8_t)(119 + rng_uniform() * 6);
        for (int ch = 0; ch < nope; ch++) {
            uint8_t c = (uint8_t)(rng_uniform() * 256);
            if ((c & 0x7f) == 0x7f) c ^= 1; /* 0x7f / 0xff are NaN in e4m3 */
            e[dsv4_kv8_codes_at(k->rope) + ch] = c;
            float v = dsv4_e4m3_to_f32(c) * dsv4_e8m0_to_f32(scales[ch / DSV4_KV8_BLOCK]);
            row[ch] = dsv4_f32_to_bf16(v);
            ck_assert_msg(dsv4_bf16_to_f32(row[ch]) == v, "code %#x x scale is not exact in bf16", c);
        }
        memcpy(e, row + nope, (size_t)k->rope * 2); /* the rope part: the rows' own bf16 */
    }
    attn_dev dv;
    attn_dev_make(k, &a, kern, od, &dv);
    size_t n = (size_t)k->C * k->H * k->d;
    float *from_bf16 = (float *)malloc(n * 4), *from_fp8 = (float *)malloc(n * 4);
    attn_dev_run(k, &dv, from_bf16);
    void *d8 = NULL;
    ck_assert_int_eq(cudaMalloc(&d8, n_ent * eb), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d8, e8, n_ent * eb, cudaMemcpyHostToDevice), cudaSuccess);
    dsv4_sparse_attn_params bf = dv.p;
    dv.p.kv = NULL;
    dv.p.kv8 = (const uint8_t *)d8;
    dv.p.kv_seq_stride = (int64_t)k->n_slots * eb;
    ck_assert_uint_le(dsv4_opt_sparse_attn_workspace_bytes(&dv.p), dv.p.workspace_bytes);
    attn_dev_run(k, &dv, from_fp8);
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++)
        if (memcmp(&from_bf16[i], &from_fp8[i], 4) != 0) first = i;
    printf("sparse_attn %-4s %-4s %-28s fp8 entries of %d B: %s\n", kern == DSV4_ATTN_KERNEL_MMA ? "mma" : "simt",
           od == DSV4_OUT_F32 ? "f32" : "bf16", k->name, eb, first == n ? "bitwise equal to bf16 rows" : "DIFFER");
    ck_assert_msg(first == n, "%s: fp8 form output[%zu] = %a, bf16 rows give %a", k->name, first, from_fp8[first],
                  from_bf16[first]);
    /* both forms at once, or neither, is refused */
    dv.p.kv = bf.kv;
    ck_assert_int_eq(dsv4_opt_sparse_attn(&dv.p), DSV4_ERR_USAGE);
    cudaFree(d8);
    free(e8);
    free(from_bf16);
    free(from_fp8);
    attn_dev_free(&dv);
    attn_data_free(&a);
}

START_TEST(test_fp8_form)
{
    check_fp8_form(_i, DSV4_ATTN_KERNEL_MMA, DSV4_OUT_F32);
    check_fp8_form(_i, DSV4_ATTN_KERNEL_MMA, DSV4_OUT_BF16);
    check_fp8_form(_i, DSV4_ATTN_KERNEL_SIMT, DSV4_OUT_F32);
    check_fp8_form(_i, DSV4_ATTN_KERNEL_SIMT, DSV4_OUT_BF16);
}
END_TEST

START_TEST(test_mma_bitwise_deterministic)
{
    const attn_case k = {"determinism", 4, 64, 512, 64, 640, 1024, 0.05, -1, 4.0f};
    attn_data a;
    attn_data_make(&k, &a, 4242);
    attn_dev dv;
    attn_dev_make(&k, &a, DSV4_ATTN_KERNEL_MMA, DSV4_OUT_F32, &dv);
    ck_assert_msg(dv.p.workspace_bytes > 0, "the determinism case must exercise split-K");
    size_t n = (size_t)k.C * k.H * k.d;
    float *r1 = (float *)malloc(n * 4), *r2 = (float *)malloc(n * 4);
    attn_dev_run(&k, &dv, r1);
    attn_dev_run(&k, &dv, r2);
    ck_assert_msg(memcmp(r1, r2, n * 4) == 0, "two mma runs differ");
    free(r1);
    free(r2);
    attn_dev_free(&dv);
    attn_data_free(&a);
}
END_TEST

/* The workspace size answers from the shapes alone: at Flash width with C = 64 (where the mma kernel splits K)
 * the query with every pointer NULL and kv_seq_stride 0 equals the query on real buffers, and is > 0. The
 * launcher still rejects the NULL pointers (the full check), and a bad shape still answers 0. */
START_TEST(test_workspace_size_from_shapes)
{
    const int C = 64, H = 64, d = 512, W = 128, topk = 512, n_slots = W + 4096 / 4;
    dsv4_sparse_attn_params shape;
    memset(&shape, 0, sizeof(shape));
    shape.n_seq = C;
    shape.n_heads = H;
    shape.head_dim = d;
    shape.rope_dim = 64;
    shape.n_idx = W + topk;
    shape.n_slots = n_slots;
    shape.scale = (float)(1.0 / sqrt((double)d));
    shape.out_dtype = DSV4_OUT_BF16;
    shape.kernel = DSV4_ATTN_KERNEL_MMA;
    const size_t from_shapes = dsv4_opt_sparse_attn_workspace_bytes(&shape);

    dsv4_sparse_attn_params real = shape;
    void *b[6];
    size_t sz[6] = {(size_t)C * H * d * 2, (size_t)C * n_slots * d * 2, (size_t)C * shape.n_idx * 4, (size_t)H * 4,
                    (size_t)C * 33 * 4, (size_t)C * H * d * 2};
    for (int i = 0; i < 6; i++) ck_assert_int_eq(cudaMalloc(&b[i], sz[i]), cudaSuccess);
    real.q = (const uint16_t *)b[0];
    real.kv = (const uint16_t *)b[1];
    real.kv_seq_stride = (int64_t)n_slots * d;
    real.idx = (const int32_t *)b[2];
    real.sink = (const float *)b[3];
    real.rope_cos = real.rope_sin = (const float *)b[4];
    real.out = b[5];
    const size_t from_buffers = dsv4_opt_sparse_attn_workspace_bytes(&real);
    for (int i = 0; i < 6; i++) cudaFree(b[i]);

    ck_assert_msg(from_shapes > 0, "Flash shape, C = 64: the mma kernel must split K (workspace 0)");
    ck_assert_msg(from_shapes == from_buffers, "size from shapes %zu B != size with buffers %zu B", from_shapes,
                  from_buffers);
    /* the launcher's full check still refuses what the size query accepts */
    ck_assert_int_eq(dsv4_opt_sparse_attn(&shape), DSV4_ERR_USAGE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "non-NULL"));
    /* and a bad shape still answers 0 */
    shape.head_dim = 40;
    ck_assert_uint_eq(dsv4_opt_sparse_attn_workspace_bytes(&shape), 0);
    shape.head_dim = d;
    shape.kernel = DSV4_ATTN_KERNEL_SIMT;
    ck_assert_uint_eq(dsv4_opt_sparse_attn_workspace_bytes(&shape), 0);
}
END_TEST

START_TEST(test_rejects_bad_shapes)
{
    dsv4_sparse_attn_params p;
    memset(&p, 0, sizeof(p));
    p.n_seq = 1;
    p.n_heads = 4;
    p.head_dim = 40; /* not a multiple of 16 */
    p.n_idx = 4;
    p.n_slots = 4;
    ck_assert_int_eq(dsv4_opt_sparse_attn(&p), DSV4_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "head_dim 40"));
    p.head_dim = 32;
    p.rope_dim = 3;
    ck_assert_int_eq(dsv4_opt_sparse_attn(&p), DSV4_ERR_USAGE);
    ck_assert_int_eq(dsv4_opt_sparse_attn(NULL), DSV4_ERR_USAGE);
}
END_TEST

int main(void)
{
    dsv4_test_require_gpu();
    Suite *s = suite_create("kernel_sparse_attn");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_mma_f32, 0, N_CASES);
    tcase_add_loop_test(tc, test_mma_bf16, 0, N_CASES);
    tcase_add_loop_test(tc, test_simt_f32, 0, N_CASES);
    tcase_add_loop_test(tc, test_simt_bf16, 0, N_CASES);
    tcase_add_loop_test(tc, test_fp8_form, 0, N_CASES);
    tcase_add_test(tc, test_mma_bitwise_deterministic);
    tcase_add_test(tc, test_workspace_size_from_shapes);
    tcase_add_test(tc, test_rejects_bad_shapes);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
