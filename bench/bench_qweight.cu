/* bench_qweight.cu - micro-benchmark of kernels/fp8_linear.cu and kernels/fp4_experts.cu on Flash shapes, beside
 * their bf16 equivalents, against the ceilings measured in the same run (bench_common.cuh: copy bandwidth, cuBLAS
 * bf16 GEMM; cold L2 before every rep, events, warm-up, medians).
 *   run: build/bench_qweight [--quick]
 *  - fp8 linear, S = 1, 16, 64: wq_a 1024x4096, wkv 512x4096, wq_b 32768x1024, indexer wq_b 8192x1024, wo_b
 *    4096x8192, shared w1/w3 2048x4096, shared w2 4096x2048 (bf16 out, e8m0 scales). The bf16 row is cuBLAS
 *    (cublasGemmEx, bf16 in, fp32 compute, bf16 out) on a bf16 copy of the dequantised weight.
 *  - fp4 experts, C = 1, 16, 64: D 4096, I 2048, E 256, k 6, random routing (distinct experts per token, uniform).
 *    The bf16 row is dsv4_opt_moe_experts on bf16 weights of the same shapes.
 * Bytes counted (the fewest): the weights (and scales) of what is used read once - each touched expert once, for
 * both rows, though moe.cu's bf16 kernel re-reads an expert per pair - plus the activations read and written once.
 * FLOPs: 2·S·n_out·n_in; experts 6·C·k·D·I. --quick: fewer reps (bench_common.cuh). Each fp8 and fp4 row is
 * spot-checked against the loader's decoders in double (a wrong result fails the run, exit status 1).
 */
#include <cuda_fp8.h>
#include <string.h>

#include "../kernels/fp4_layout.h"
#include "../kernels/moe.cuh"
#include "../kernels/qweight.cuh"
#include "bench_common.cuh"

static __device__ uint64_t qb_hash(size_t i, uint64_t seed)
{
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}
/* random bytes; fp8: no NaN codes; scale: lo + (hash mod span) */
static __global__ void qb_fill_u8_kernel(uint8_t *p, size_t n, uint64_t seed, int mode, int lo, int span)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = qb_hash(i, seed);
        uint8_t b = (uint8_t)(h >> 24);
        if (mode == 1 && (b & 0x7f) == 0x7f) b ^= 1;
        if (mode == 2) b = (uint8_t)(lo + (int)((h >> 24) % (uint64_t)span));
        p[i] = b;
    }
}
static void qb_fill_u8(void *p, size_t n, uint64_t seed, int mode, int lo, int span)
{
    qb_fill_u8_kernel<<<2048, 256>>>((uint8_t *)p, n, seed, mode, lo, span);
    BENCH_CHECK(cudaGetLastError());
}
/* bf16 copy of the dequantised fp8 weight, for the cuBLAS row */
static __global__ void qb_deq_fp8_kernel(uint16_t *dst, const uint8_t *w, const uint8_t *s, int n_out, int n_in)
{
    const size_t n = (size_t)n_out * n_in;
    const int sc = (n_in + 127) / 128;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / n_in, c = i % n_in;
        __half_raw hr = __nv_cvt_fp8_to_halfraw(w[i], __NV_E4M3);
        const float v = __half2float(__half(hr)) * exp2f((float)s[(r / 128) * sc + c / 128] - 127.0f);
        __nv_bfloat16 b = __float2bfloat16_rn(v);
        dst[i] = *reinterpret_cast<uint16_t *>(&b);
    }
}

typedef struct qb_record {
    char kernel[16], var[8], shape[40];
    int C;
    double us, gbs, tflops;
} qb_record;
static qb_record records[128];
static int n_records;
static void qb_row(const bench_ceilings *cl, const char *kernel, const char *var, int C, const char *shape, double us,
                   double bytes, double flops)
{
    bench_row(cl, kernel, var, "-", C, shape, us, bytes, flops);
    if (n_records < 128) {
        qb_record *r = &records[n_records++];
        snprintf(r->kernel, sizeof r->kernel, "%s", kernel);
        snprintf(r->var, sizeof r->var, "%s", var);
        snprintf(r->shape, sizeof r->shape, "%s", shape);
        r->C = C, r->us = us, r->gbs = bytes / (us * 1e3), r->tflops = flops / (us * 1e6);
    }
}

/* ------------------------------------------------------------------------------------------------ fp8 linear */
typedef struct f8_bench {
    dsv4_fp8_linear_params p;
    cublasHandle_t h;
    const void *wb; /* bf16 copy [n_out, n_in] */
    int cublas;
} f8_bench;
static void f8_fn(void *ctx, int rep)
{
    f8_bench *b = (f8_bench *)ctx;
    if (!b->cublas) {
        BENCH_OK(dsv4_opt_fp8_linear(&b->p));
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, b->p.n_out, b->p.n_tok, b->p.n_in, &one, b->wb,
                                    CUDA_R_16BF, b->p.n_in, b->p.x, CUDA_R_16BF, b->p.n_in, &zero, b->p.y,
                                    CUDA_R_16BF, b->p.n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasGemmEx: status %d\n", (int)s);
        exit(1);
    }
}

/* Spot check of the fp8 row just timed: tokens 0 and S-1, 4 rows, against the loader's decoders in double. */
static void f8_spot_check(const dsv4_fp8_linear_params *p, const char *name)
{
    const int S = p->n_tok, no = p->n_out, ni = p->n_in, sc = (ni + 127) / 128;
    const int toks[2] = {0, S - 1}, rows[4] = {0, 1, no / 2, no - 1};
    uint8_t *wr = (uint8_t *)malloc((size_t)ni), *srow = (uint8_t *)malloc((size_t)sc);
    uint16_t *xr = (uint16_t *)malloc((size_t)ni * 2), *y = (uint16_t *)bench_to_host(p->y, (size_t)S * no * 2);
    double want[8];
    float got[8];
    for (int ri = 0; ri < 4; ri++) {
        const int r = rows[ri];
        BENCH_CHECK(cudaMemcpy(wr, p->w + (size_t)r * ni, ni, cudaMemcpyDeviceToHost));
        BENCH_CHECK(cudaMemcpy(srow, (const uint8_t *)p->scale + (size_t)(r / 128) * sc, sc, cudaMemcpyDeviceToHost));
        for (int ti = 0; ti < 2; ti++) {
            BENCH_CHECK(cudaMemcpy(xr, p->x + (size_t)toks[ti] * p->ldx, (size_t)ni * 2, cudaMemcpyDeviceToHost));
            double a = 0.0;
            for (int c = 0; c < ni; c++)
                a += (double)(dsv4_e4m3_to_f32(wr[c]) * dsv4_e8m0_to_f32(srow[c / 128])) * bench_bf16_to_f32(xr[c]);
            want[ti * 4 + ri] = a;
            got[ti * 4 + ri] = bench_bf16_to_f32(y[(size_t)toks[ti] * p->ldy + r]);
        }
    }
    char what[96];
    snprintf(what, sizeof(what), "fp8_linear %s S=%d (2 tokens x 4 rows, bf16)", name, S);
    bench_check_close(what, got, want, 8, 1e-3, 1e-2);
    free(wr), free(srow), free(xr), free(y);
}

static void bench_fp8(const bench_ceilings *cl, cublasHandle_t h, const char *name, int n_out, int n_in)
{
    const int Ss[3] = {1, 16, 64};
    const size_t nw = (size_t)n_out * n_in, ns = (size_t)((n_out + 127) / 128) * ((n_in + 127) / 128);
    void *w, *s, *wb, *x, *y, *ws = NULL;
    BENCH_CHECK(cudaMalloc(&w, nw));
    BENCH_CHECK(cudaMalloc(&s, ns));
    BENCH_CHECK(cudaMalloc(&wb, nw * 2));
    BENCH_CHECK(cudaMalloc(&x, (size_t)64 * n_in * 2));
    BENCH_CHECK(cudaMalloc(&y, (size_t)64 * n_out * 2));
    qb_fill_u8(w, nw, 31, 1, 0, 0);
    qb_fill_u8(s, ns, 32, 2, 115, 8);
    bench_fill_bf16(x, (size_t)64 * n_in, 33, 1.0f);
    qb_deq_fp8_kernel<<<2048, 256>>>((uint16_t *)wb, (const uint8_t *)w, (const uint8_t *)s, n_out, n_in);
    BENCH_CHECK(cudaGetLastError());
    const size_t ws_max = dsv4_opt_fp8_linear_workspace_bytes(64, n_out, n_in);
    if (ws_max) BENCH_CHECK(cudaMalloc(&ws, ws_max));
    for (int si = 0; si < 3; si++) {
        const int S = Ss[si];
        f8_bench b;
        memset(&b, 0, sizeof b);
        b.p.n_tok = S, b.p.n_out = n_out, b.p.n_in = n_in;
        b.p.x = (const uint16_t *)x, b.p.ldx = n_in;
        b.p.w = (const uint8_t *)w, b.p.scale = s, b.p.scale_kind = DSV4_QSCALE_E8M0;
        b.p.y = y, b.p.y_f32 = 0, b.p.ldy = n_out;
        b.p.workspace = ws, b.p.workspace_bytes = ws_max;
        b.h = h, b.wb = wb;
        char shape[40];
        snprintf(shape, sizeof shape, "%s %dx%d", name, n_out, n_in);
        const double act = (double)S * n_in * 2 + (double)S * n_out * 2, flops = 2.0 * S * n_out * (double)n_in;
        b.cublas = 0;
        qb_row(cl, "fp8_linear", "fp8", S, shape, bench_median_us(f8_fn, &b), (double)nw + ns + act, flops);
        f8_spot_check(&b.p, name);
        b.cublas = 1;
        qb_row(cl, "cublas", "bf16", S, shape, bench_median_us(f8_fn, &b), 2.0 * nw + act, flops);
    }
    cudaFree(w), cudaFree(s), cudaFree(wb), cudaFree(x), cudaFree(y), cudaFree(ws);
}

/* ------------------------------------------------------------------------------------------------ fp4 experts */
enum { XD = 4096, XI = 2048, XE = 256, XK = 6, XC_MAX = 64 };

typedef struct f4_bench {
    dsv4_fp4_experts_params p;
    dsv4_moe_experts_params q;
    int bf16;
} f4_bench;
static void f4_fn(void *ctx, int rep)
{
    f4_bench *b = (f4_bench *)ctx;
    if (b->bf16)
        BENCH_OK(dsv4_opt_moe_experts(&b->q));
    else
        BENCH_OK(dsv4_opt_fp4_experts(&b->p));
}

static uint64_t host_rs = 12345;
static uint32_t host_rand(void)
{
    host_rs = host_rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(host_rs >> 33);
}

/* A row of the kernel's repacked codes back to the checkpoint layout the decoders read. */
static void f4_unpack_row(uint8_t *w, size_t bytes)
{
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
        uint32_t v;
        memcpy(&v, w + i, 4);
        v = dsv4_fp4_unpack_word(v);
        memcpy(w + i, &v, 4);
    }
}

/* Σ_i dequant(w)[i]·v[i]; *mag += Σ|terms| */
static double f4_row_dot(const uint8_t *w, const uint8_t *s, const uint16_t *v, int n, double *mag)
{
    double a = 0.0;
    for (int i = 0; i < n; i++) {
        const uint8_t b = w[i / 2];
        const double t = (double)(dsv4_e2m1_to_f32(i & 1 ? b >> 4 : b & 0xf) * dsv4_e8m0_to_f32(s[i / 32])) *
                         bench_bf16_to_f32(v[i]);
        a += t, *mag += fabs(t);
    }
    return a;
}
/* Spot check of the fp4 row just timed: token 0 (and C-1), h at 8 rows of each of its k experts and out at 4 rows
 * (from the kernel's own h), against the loader's decoders in double. */
static void f4_spot_check(const dsv4_fp4_experts_params *p, const int32_t *ids, const float *wts)
{
    const int C = p->n_tok, D = p->dim, I = p->inter, K = p->k;
    const int toks[2] = {0, C - 1}, ms[8] = {0, 1, 63, 500, 1024, 1337, 2046, 2047}, ds[4] = {0, 777, 2048, 4095};
    uint16_t *x = (uint16_t *)bench_to_host(p->x, (size_t)C * D * 2);
    uint16_t *h = (uint16_t *)bench_to_host(p->h, (size_t)C * K * I * 2);
    float *out = (float *)bench_to_host(p->out, (size_t)C * D * 4);
    uint8_t *wr = (uint8_t *)malloc((size_t)D), *sr = (uint8_t *)malloc((size_t)D / 16);
    for (int t = 0; t < (C > 1 ? 2 : 1); t++) {
        const int c = toks[t];
        double want[XK * 8], wo[4];
        float got[XK * 8], go[4];
        for (int j = 0; j < K; j++) {
            const int e = ids[c * K + j];
            for (int mi = 0; mi < 8; mi++) {
                double gu[2];
                for (int half = 0; half < 2; half++) {
                    const size_t row = (size_t)e * 2 * I + (size_t)half * I + ms[mi];
                    BENCH_CHECK(cudaMemcpy(wr, p->w13 + row * (D / 2), D / 2, cudaMemcpyDeviceToHost));
                    f4_unpack_row(wr, D / 2);
                    BENCH_CHECK(cudaMemcpy(sr, p->s13 + row * (D / 32), D / 32, cudaMemcpyDeviceToHost));
                    double mag = 0.0;
                    gu[half] = f4_row_dot(wr, sr, x + (size_t)c * D, D, &mag);
                }
                const double g = fmin(gu[0], p->limit), u = fmax(fmin(gu[1], p->limit), -p->limit);
                want[j * 8 + mi] = g / (1.0 + exp(-g)) * u * wts[c * K + j];
                got[j * 8 + mi] = bench_bf16_to_f32(h[((size_t)c * K + j) * I + ms[mi]]);
            }
        }
        char what[96];
        snprintf(what, sizeof(what), "fp4_experts C=%d tok %d h (bf16, 8 rows x %d)", C, c, K);
        bench_check_close(what, got, want, K * 8, 1e-3, 1e-2);
        double omag = 0.0; /* fp32 accumulation error lives at 1e-6 of Σ|terms|: the absolute tolerance */
        for (int di = 0; di < 4; di++) {
            double a = 0.0, mag = 0.0;
            for (int j = 0; j < K; j++) {
                const size_t row = (size_t)ids[c * K + j] * D + ds[di];
                BENCH_CHECK(cudaMemcpy(wr, p->w2 + row * (I / 2), I / 2, cudaMemcpyDeviceToHost));
                f4_unpack_row(wr, I / 2);
                BENCH_CHECK(cudaMemcpy(sr, p->s2 + row * (I / 32), I / 32, cudaMemcpyDeviceToHost));
                a += f4_row_dot(wr, sr, h + ((size_t)c * K + j) * I, I, &mag);
            }
            wo[di] = a;
            omag = mag > omag ? mag : omag;
            go[di] = out[(size_t)c * D + ds[di]];
        }
        snprintf(what, sizeof(what), "fp4_experts C=%d tok %d out (4 rows)", C, c);
        bench_check_close(what, go, wo, 4, 1e-5 * omag, 1e-3);
    }
    free(x), free(h), free(out), free(wr), free(sr);
}

static void bench_fp4(const bench_ceilings *cl)
{
    const size_t n13 = (size_t)XE * 2 * XI * XD / 2, n2 = (size_t)XE * XD * XI / 2;
    void *w13, *s13, *w2, *s2, *b13, *b2, *x, *ids, *wt, *h, *out;
    BENCH_CHECK(cudaMalloc(&w13, n13));
    BENCH_CHECK(cudaMalloc(&s13, n13 / 16));
    BENCH_CHECK(cudaMalloc(&w2, n2));
    BENCH_CHECK(cudaMalloc(&s2, n2 / 16));
    BENCH_CHECK(cudaMalloc(&b13, n13 * 4)); /* bf16: 4 bytes per packed byte */
    BENCH_CHECK(cudaMalloc(&b2, n2 * 4));
    BENCH_CHECK(cudaMalloc(&x, (size_t)XC_MAX * XD * 2));
    BENCH_CHECK(cudaMalloc(&ids, (size_t)XC_MAX * XK * 4));
    BENCH_CHECK(cudaMalloc(&wt, (size_t)XC_MAX * XK * 4));
    BENCH_CHECK(cudaMalloc(&h, (size_t)XC_MAX * XK * XI * 2));
    BENCH_CHECK(cudaMalloc(&out, (size_t)XC_MAX * XD * 4));
    qb_fill_u8(w13, n13, 41, 0, 0, 0);
    qb_fill_u8(w2, n2, 42, 0, 0, 0);
    BENCH_OK(dsv4_opt_fp4_repack((uint8_t *)w13, n13, 0)); /* random codes either way; the spot checks unpack */
    BENCH_OK(dsv4_opt_fp4_repack((uint8_t *)w2, n2, 0));
    qb_fill_u8(s13, n13 / 16, 43, 2, 118, 8);
    qb_fill_u8(s2, n2 / 16, 44, 2, 118, 8);
    bench_fill_bf16(b13, n13 * 2, 45, 0.05f);
    bench_fill_bf16(b2, n2 * 2, 46, 0.05f);
    bench_fill_bf16(x, (size_t)XC_MAX * XD, 47, 1.0f);
    float hwt[XC_MAX * XK]; /* positive routing weights, as the router gives */
    for (int i = 0; i < XC_MAX * XK; i++) hwt[i] = 0.05f + 0.3f * (float)(host_rand() % 1000) / 1000.0f;
    BENCH_CHECK(cudaMemcpy(wt, hwt, sizeof hwt, cudaMemcpyHostToDevice));
    const int Cs[3] = {1, 16, 64};
    for (int ci = 0; ci < 3; ci++) {
        const int C = Cs[ci];
        int32_t hid[XC_MAX * XK];
        int touched[XE];
        memset(touched, 0, sizeof touched);
        for (int c = 0; c < C; c++)
            for (int j = 0; j < XK; j++) {
                int e, dup;
                do {
                    e = (int)(host_rand() % XE), dup = 0;
                    for (int q = 0; q < j; q++) dup |= hid[c * XK + q] == e;
                } while (dup);
                hid[c * XK + j] = e;
                touched[e] = 1;
            }
        int n_touched = 0;
        for (int e = 0; e < XE; e++) n_touched += touched[e];
        BENCH_CHECK(cudaMemcpy(ids, hid, (size_t)C * XK * 4, cudaMemcpyHostToDevice));
        f4_bench b;
        memset(&b, 0, sizeof b);
        dsv4_fp4_experts_params *p = &b.p;
        p->n_tok = C, p->k = XK, p->dim = XD, p->inter = XI, p->limit = 10.0f;
        p->x = (const uint16_t *)x, p->ids = (const int32_t *)ids, p->weights = (const float *)wt;
        p->w13 = (const uint8_t *)w13, p->s13 = (const uint8_t *)s13, p->w2 = (const uint8_t *)w2;
        p->s2 = (const uint8_t *)s2, p->h = (uint16_t *)h, p->out = (float *)out;
        dsv4_moe_experts_params *q = &b.q;
        q->n_tok = C, q->k = XK, q->dim = XD, q->inter = XI, q->limit = 10.0f;
        q->x = p->x, q->ids = p->ids, q->weights = p->weights;
        q->w13 = (const uint16_t *)b13, q->w2 = (const uint16_t *)b2, q->h = p->h, q->out = p->out;
        const double per_expert4 = (double)(n13 + n2 + (n13 + n2) / 16) / XE, per_expert16 = 4.0 * (n13 + n2) / XE;
        const double act = (double)C * XD * 2 + 2.0 * C * XK * XI * 2 + (double)C * XD * 4;
        const double flops = 6.0 * C * XK * (double)XD * XI;
        char shape[40];
        snprintf(shape, sizeof shape, "D4096 I2048 E256 k6 (%d used)", n_touched);
        b.bf16 = 0;
        qb_row(cl, "fp4_experts", "fp4", C, shape, bench_median_us(f4_fn, &b), n_touched * per_expert4 + act, flops);
        f4_spot_check(p, hid, hwt);
        b.bf16 = 1;
        qb_row(cl, "moe_experts", "bf16", C, shape, bench_median_us(f4_fn, &b), n_touched * per_expert16 + act,
               flops);
    }
    cudaFree(w13), cudaFree(s13), cudaFree(w2), cudaFree(s2), cudaFree(b13), cudaFree(b2), cudaFree(x);
    cudaFree(ids), cudaFree(wt), cudaFree(h), cudaFree(out);
}

int main(int argc, char **argv)
{
    bench_init(argc, argv);
    bench_ceilings cl = bench_measure_ceilings();
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    bench_header();
    bench_fp8(&cl, h, "wq_a", 1024, 4096);
    bench_fp8(&cl, h, "wkv", 512, 4096);
    bench_fp8(&cl, h, "wq_b", 32768, 1024);
    bench_fp8(&cl, h, "idx.wq_b", 8192, 1024);
    bench_fp8(&cl, h, "wo_b", 4096, 8192);
    bench_fp8(&cl, h, "shared.w1", 2048, 4096);
    bench_fp8(&cl, h, "shared.w2", 4096, 2048);
    cublasDestroy(h);
    bench_fp4(&cl);

    printf("\n| kernel | weights | C/S | shape | µs | GB/s | %% copy | TFLOP/s |\n|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n_records; i++) {
        const qb_record *r = &records[i];
        printf("| %s | %s | %d | %s | %.1f | %.0f | %.1f%% | %.1f |\n", r->kernel, r->var, r->C, r->shape, r->us,
               r->gbs, 100.0 * r->gbs / cl.copy_gbs, r->tflops);
    }
    return bench_finish();
}
