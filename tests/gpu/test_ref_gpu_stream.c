/* test_ref_gpu_stream.c - ref-gpu's streamed weights (issue 36 phase 2; docs/reference.md "ref-gpu streams layers"):
 *
 *   dequant:  the GPU dequantiser, through the streamed path's own fill (dsv4_ref_part_fill) and launcher
 *             (dsv4_ref_gpu_part_dequant), bit for bit model/dtype.c's values (dsv4_model_read_f32_rows): every FP8
 *             e4m3 code with E8M0 scales (0 = 2^-127: subnormal products; 255 = NaN) and with F32 scales
 *             (subnormal, large enough to overflow to inf, negative, NaN), every FP4 byte with E8M0 and F32 scales,
 *             bf16 and f32 of every class (NaN payloads kept), F16 through the host; odd shapes with partial 128x128
 *             blocks and partial 32-column scale groups; row ranges starting inside a block and crossing block
 *             edges; with the emulation, the pieces it rounds equal dsv4_ref_emu_round of the host's values. The
 *             outputs are poisoned with NaN first; the inputs hold subnormal products and non-canonical NaNs, which a
 *             flush to zero or the GPU's canonical NaN would change.
 *   bitwise:  `dsv4 run --path ref-gpu --gpu-weights stream` writes bitwise the dump of `--gpu-weights resident` on
 *             every golden set (tiny, tiny-fp8, topk512), plain and --emulate bf16, prefill and the forced decode
 *             steps, every position, the head cut into 37-row ranges ($DSV4_REF_GPU_HEAD_ROWS); on tiny-fp8 also
 *             the head whole, the prompt token by token, and following the golden's choices with the emulation. The
 *             comparison can fail: the plain and the emulated dumps differ.
 *   memory:   the streamed reference on a full-size sparse stand-in of the released checkpoint (tests/support/
 *             flash_standin.h; 3 and 5 layers, a 16-token prefill and 4 decode steps, in process) allocates what
 *             its plan says (between 90% and 100% of it: the plan's state is a bound), loses at most the plan +
 *             512 MiB of GPU memory by cudaMemGetInfo (at the end of init and of every call; what CUDA makes lazily,
 *             kernels' local memory, modules, cuBLAS's workspace, is not in the plan), the same within 64 MiB on 3
 *             and 5 layers; it copies each layer's part once per call and a routed
 *             expert only when a token routes to it, and reports every layer through the progress callback.
 * Without a CUDA device: exit 77. `test_ref_gpu_stream --write-standin DIR N` writes an N-layer stand-in and a
 * 16-token prompt (DIR/prompt.txt) and exits (scripts/ref_scale_on_device.sh).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../reference/ref_gpu.cuh"
#include "../../reference/ref_gpu_layout.h"
#include "../../reference/ref_model.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_ref.h"
#include "dsv4_test.h"
#include "flash_standin.h"
#include "st_writer.h"

#define MIB (1024.0 * 1024.0)
#define CUDA_OK(call) ck_assert_msg((call) == cudaSuccess, "%s: %s", #call, cudaGetErrorString(cudaGetLastError()))

static char *dir;

/* ------------------------------------------------------------------------------------------- dequant */
static uint32_t rng = 12345;
static uint8_t next_byte(void) { return (uint8_t)((rng = rng * 1664525u + 1013904223u) >> 24); }

static void add(dsv4_stw *w, const char *name, const char *dtype, int64_t d0, int64_t d1, const void *data,
                size_t bytes)
{
    int64_t s[2] = {d0, d1};
    ck_assert_int_eq(dsv4_stw_add(w, name, dtype, d1 ? 2 : 1, s, data, bytes), 0);
}

static uint8_t *random_bytes(size_t n)
{
    uint8_t *p = malloc(n + 1);
    for (size_t i = 0; i < n; i++) p[i] = next_byte();
    return p;
}

/* A model folder with odd-shaped tensors of every format the streamed path reads. */
static char *write_dequant_model(void)
{
    dsv4_stw *w = dsv4_stw_new();
    /* FP8 [259, 300], E8M0 scales [3, 3]: partial blocks; every code in row 0; scale 0 (2^-127) and 255 (NaN) */
    uint8_t *q = random_bytes(259 * 300), sc[9];
    for (int i = 0; i < 256; i++) q[i] = (uint8_t)i;
    for (int i = 0; i < 9; i++) sc[i] = (uint8_t)(118 + 3 * i);
    sc[4] = 0;
    sc[8] = 255;
    add(w, "layers.0.attn.wq_a.weight", "F8_E4M3", 259, 300, q, 259 * 300);
    add(w, "layers.0.attn.wq_a.scale", "F8_E8M0", 3, 3, sc, 9);
    free(q);
    /* FP8 [131, 129], F32 scales [2, 2]: subnormal, 2^120 (448 x 2^120 overflows to inf), negative, NaN */
    q = random_bytes(131 * 129);
    for (int i = 0; i < 256; i++) q[i] = (uint8_t)i;
    /* 3·2^-149 (products round in the subnormal range), 2^120, -0.25, NaN with the code NaN's own bits (so a
     * product of two NaNs is the same whichever operand the host's compiler puts first) */
    uint32_t fs[4] = {0x00000003u, 0x7b800000u, 0xbe800000u, 0x7fc00000u};
    add(w, "layers.0.attn.wq_b.weight", "F8_E4M3", 131, 129, q, 131 * 129);
    add(w, "layers.0.attn.wq_b.scale", "F32", 2, 2, fs, sizeof fs);
    free(q);
    /* FP4 [259, 80] (40 bytes a row), E8M0 scales [259, 3]: the last group of 16 columns; every byte in row 0 */
    q = random_bytes(259 * 40);
    for (int i = 0; i < 256; i++) q[i] = (uint8_t)i;
    uint8_t *s4 = random_bytes(259 * 3);
    for (int i = 0; i < 259 * 3; i++) s4[i] = (uint8_t)(100 + s4[i] % 40);
    s4[1] = 0;
    s4[5] = 255;
    add(w, "layers.0.ffn.experts.0.w1.weight", "I8", 259, 40, q, 259 * 40);
    add(w, "layers.0.ffn.experts.0.w1.scale", "F8_E8M0", 259, 3, s4, 259 * 3);
    free(q);
    free(s4);
    /* FP4 [17, 70] (35 bytes a row), scales [17, 3]: a group of 6 columns at the end */
    q = random_bytes(17 * 35);
    s4 = random_bytes(17 * 3);
    for (int i = 0; i < 17 * 3; i++) s4[i] = (uint8_t)(110 + s4[i] % 30);
    add(w, "layers.0.ffn.experts.1.w1.weight", "I8", 17, 35, q, 17 * 35);
    add(w, "layers.0.ffn.experts.1.w1.scale", "F8_E8M0", 17, 3, s4, 17 * 3);
    free(q);
    free(s4);
    /* FP4 [5, 64], F32 scales [5, 2] */
    q = random_bytes(5 * 32);
    uint32_t fs4[10] = {0x3f800000u, 0x00000001u, 0xbf000000u, 0x7fc00000u, 0x40000000u,
                        0x3e000000u, 0x7f000000u, 0x00400000u, 0xc0800000u, 0x3f000000u};
    add(w, "layers.0.ffn.experts.2.w1.weight", "I8", 5, 32, q, 5 * 32);
    add(w, "layers.0.ffn.experts.2.w1.scale", "F32", 5, 2, fs4, sizeof fs4);
    free(q);
    /* bf16 [17, 31] and f32 [17, 31] of random bits (NaN payloads, infinities, subnormals), f16 [9, 13], bf16 [300] */
    q = random_bytes(17 * 31 * 2);
    add(w, "layers.0.attn.wkv.weight", "BF16", 17, 31, q, 17 * 31 * 2);
    free(q);
    q = random_bytes(17 * 31 * 4);
    uint32_t *u = (uint32_t *)(void *)q;
    u[0] = 0x7f800001u; /* a signalling NaN: copied, never computed on */
    u[1] = 0xffc01234u;
    u[2] = 0x00000007u;
    add(w, "layers.0.attn.wo_a.weight", "F32", 17, 31, q, 17 * 31 * 4);
    free(q);
    q = random_bytes(9 * 13 * 2);
    add(w, "layers.0.attn.wo_b.weight", "F16", 9, 13, q, 9 * 13 * 2);
    free(q);
    q = random_bytes(300 * 2);
    add(w, "layers.0.attn_norm.weight", "BF16", 300, 0, q, 300 * 2);
    free(q);
    char *d = dsv4_test_mkdtemp("stream-dequant"), path[4200];
    snprintf(path, sizeof path, "%s/config.json", d);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(dsv4_stw_tiny_config(), f);
    fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    ck_assert_int_eq(dsv4_stw_write(w, path, NULL), 0);
    dsv4_stw_free(w);
    return d;
}

/* Every piece of `part` dequantised on the GPU against the host's values; counts of the host's subnormal and
 * non-canonical NaN outputs into *subn, *nans. */
static void check_part_on_gpu(dsv4_model *m, const dsv4_ref_part *part, int emu, long *subn, long *nans)
{
    uint8_t *host = malloc(part->bytes + 1), *dev = NULL;
    float *dst = NULL, *got = malloc(part->floats * sizeof(float) + 4);
    ck_assert_int_eq(dsv4_ref_part_fill(part, m, host), 0);
    CUDA_OK(cudaMalloc((void **)&dev, part->bytes + 1));
    CUDA_OK(cudaMalloc((void **)&dst, part->floats * sizeof(float) + 4));
    CUDA_OK(cudaMemcpy(dev, host, part->bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dst, 0xff, part->floats * sizeof(float))); /* NaN: an unwritten element fails */
    ck_assert_msg(dsv4_ref_gpu_part_dequant(part, dev, dst, emu) == 0, "%s", dsv4_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got, dst, part->floats * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < part->n; i++) {
        const dsv4_ref_piece *p = &part->p[i];
        const size_t n = (size_t)p->nrows * (size_t)p->cols;
        float *want = malloc(n * sizeof(float) + 4);
        if (p->t->ndim >= 2) ck_assert_int_eq(dsv4_model_read_f32_rows(m, p->t->name, p->row0, p->nrows, want), 0);
        else ck_assert_int_eq(dsv4_model_read_f32(m, p->t->name, want, n), 0);
        if (emu && p->round) dsv4_ref_emu_round(want, n);
        const uint32_t *a = (const uint32_t *)(const void *)want;
        const uint32_t *b = (const uint32_t *)(const void *)(got + p->dst_at);
        for (size_t j = 0; j < n; j++) {
            ck_assert_msg(a[j] == b[j], "%s (%s) rows %lld+%lld, element %zu (row %lld, col %lld): GPU %08x, host %08x",
                          p->t->name, dsv4_ref_wfmt_name(p->fmt), (long long)p->row0, (long long)p->nrows, j,
                          (long long)(p->row0 + (int64_t)(j / (size_t)p->cols)), (long long)(j % (size_t)p->cols),
                          b[j], a[j]);
            *subn += fpclassify(want[j]) == FP_SUBNORMAL;
            *nans += isnan(want[j]) && a[j] != 0x7fffffffu;
        }
        free(want);
    }
    CUDA_OK(cudaFree(dev));
    CUDA_OK(cudaFree(dst));
    free(host);
    free(got);
}

START_TEST(dequant_is_the_hosts_bit_for_bit)
{
    char *d = write_dequant_model();
    dsv4_model *m = NULL;
    ck_assert_msg(dsv4_model_open(d, &m) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_gpu_dequant_init(), 0);
    static const char *const names[] = {"layers.0.attn.wq_a.weight",        "layers.0.attn.wq_b.weight",
                                        "layers.0.ffn.experts.0.w1.weight", "layers.0.ffn.experts.1.w1.weight",
                                        "layers.0.ffn.experts.2.w1.weight", "layers.0.attn.wkv.weight",
                                        "layers.0.attn.wo_a.weight",        "layers.0.attn.wo_b.weight",
                                        "layers.0.attn_norm.weight"};
    static const dsv4_ref_wfmt fmts[] = {DSV4_REF_WFMT_FP8,  DSV4_REF_WFMT_FP8, DSV4_REF_WFMT_FP4,
                                         DSV4_REF_WFMT_FP4,  DSV4_REF_WFMT_FP4, DSV4_REF_WFMT_BF16,
                                         DSV4_REF_WFMT_F32,  DSV4_REF_WFMT_HOST, DSV4_REF_WFMT_BF16};
    long subn = 0, nans = 0, pieces = 0;
    for (int emu = 0; emu < 2; emu++)
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            const dsv4_tensor *t;
            ck_assert_int_eq(dsv4_model_tensor(m, names[i], &t), 0);
            const int64_t rows = t->ndim >= 2 ? t->shape[0] : 1;
            dsv4_ref_part part;
            dsv4_ref_part_clear(&part);
            ck_assert_msg(dsv4_ref_part_add(&part, m, names[i], 0, -1, emu, 1) == 0, "%s", dsv4_last_error());
            ck_assert_int_eq(part.p[0].fmt, fmts[i]);
            /* row ranges: inside a 128-row block, across its edge, single rows, the last row */
            static const int64_t r0s[] = {1, 37, 127, 128, 129, 200, 258};
            static const int64_t ns[] = {1, 130, 3, 2, 131, 59, 1};
            for (size_t k = 0; t->ndim >= 2 && k < sizeof r0s / sizeof r0s[0]; k++) {
                if (r0s[k] >= rows) continue;
                const int64_t n = r0s[k] + ns[k] <= rows ? ns[k] : rows - r0s[k];
                ck_assert_int_eq(dsv4_ref_part_add(&part, m, names[i], r0s[k], n, emu, 1), 0);
            }
            if (t->ndim >= 2) ck_assert_int_eq(dsv4_ref_part_add(&part, m, names[i], rows - 1, 1, emu, 1), 0);
            check_part_on_gpu(m, &part, emu, &subn, &nans);
            pieces += part.n;
        }
    printf("dequantiser: %ld pieces of 9 tensors bit for bit the host's, plain and emulated; the host's outputs hold "
           "%ld subnormals and %ld non-canonical NaNs\n", pieces, subn, nans);
    ck_assert_int_gt(subn, 100);
    ck_assert_int_gt(nans, 10);
    dsv4_model_free(m);
    dsv4_test_rmtree(d);
}
END_TEST

/* ------------------------------------------------------------------------------------------- bitwise */
static char *path_of(const char *file)
{
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", dir, file);
    return p;
}

/* dsv4 run on golden/SET's forced tokens with ARGS into DIR/out; returns the output (exit 0 asserted). */
static char *run(const char *set, const char *args, const char *out)
{
    char cmd[8192], *o = NULL, *dump = path_of(out);
    dsv4_test_run_command(cmd, sizeof cmd, set, args, NULL, dump);
    const int st = dsv4_test_run(cmd, &o);
    printf("$ %s -> %d\n%s", cmd, st, o ? o : "");
    ck_assert_msg(st == 0, "%s: exit %d\n%s", cmd, st, o ? o : "");
    free(dump);
    return o;
}

/* Datasets of DIR/a and DIR/b whose bytes differ (the same names and shapes). */
static int datasets_differing(const char *fa, const char *fb)
{
    char *pa = path_of(fa), *pb = path_of(fb);
    dsv4_dump *a = NULL, *b = NULL;
    ck_assert_int_eq(dsv4_dump_open(pa, &a), 0);
    ck_assert_int_eq(dsv4_dump_open(pb, &b), 0);
    int differ = 0;
    for (int i = 0; i < dsv4_dump_dataset_count(a); i++) {
        const char *name = dsv4_dump_dataset_name(a, i);
        dsv4_dataset_info ia, ib;
        ck_assert_msg(dsv4_dump_info(a, name, &ia) == 0 && dsv4_dump_info(b, name, &ib) == 0, "%s", name);
        size_t n = 1;
        for (int k = 0; k < ia.ndim; k++) n *= (size_t)ia.shape[k];
        void *x = malloc(n * 4 + 4), *y = malloc(n * 4 + 4);
        ck_assert(dsv4_dump_read_rows(a, name, 0, ia.shape[0], x) == 0);
        ck_assert(dsv4_dump_read_rows(b, name, 0, ib.shape[0], y) == 0);
        differ += memcmp(x, y, n * 4) != 0;
        free(x);
        free(y);
    }
    dsv4_dump_free(a);
    dsv4_dump_free(b);
    free(pa);
    free(pb);
    return differ;
}

/* The streamed run of SET with EXTRA (head in head_rows-row ranges, NULL: whole) against the resident one. */
static void stream_vs_resident(const char *set, const char *extra, const char *head_rows, const char *tag)
{
    char args[4096], res[128], str[128], what[256];
    snprintf(res, sizeof res, "%s-%s-resident.h5", set, tag);
    snprintf(str, sizeof str, "%s-%s-stream.h5", set, tag);
    snprintf(args, sizeof args, "--path ref-gpu --gpu-weights resident --dump-positions all %s", extra);
    char *o = run(set, args, res);
    ck_assert_msg(strstr(o, "ref-gpu weights: resident"), "no resident stats line");
    free(o);
    if (head_rows) setenv("DSV4_REF_GPU_HEAD_ROWS", head_rows, 1);
    snprintf(args, sizeof args, "--path ref-gpu --gpu-weights stream --dump-positions all %s", extra);
    o = run(set, args, str);
    unsetenv("DSV4_REF_GPU_HEAD_ROWS");
    ck_assert_msg(strstr(o, "weights streamed as on disk") && strstr(o, "ref-gpu weights: streamed") &&
                      strstr(o, "ref-gpu time, "),
                  "the streamed run does not say so");
    if (head_rows) ck_assert_msg(!strstr(o, "of the head, in 1,"), "the head was not cut into ranges");
    free(o);
    char *a = path_of(res), *b = path_of(str);
    snprintf(what, sizeof what, "%s %s: streamed vs resident", set, tag);
    dsv4_test_assert_dumps_equal(a, b, what);
    printf("%s %s: streamed bitwise resident\n", set, tag);
    free(a);
    free(b);
}

static const char *const sets[] = {"tiny", "tiny-fp8", "topk512"};

START_TEST(streamed_is_resident_bitwise)
{
    for (int i = 0; i < 3; i++) {
        if (i == 2 && dsv4_test_leave_out_long(__func__)) break;
        stream_vs_resident(sets[i], "", "37", "plain");
        stream_vs_resident(sets[i], "--emulate bf16", "37", "emu");
        char a[128], b[128];
        snprintf(a, sizeof a, "%s-plain-stream.h5", sets[i]);
        snprintf(b, sizeof b, "%s-emu-stream.h5", sets[i]);
        const int d = datasets_differing(a, b);
        printf("%s: plain vs emulated: %d datasets differ\n", sets[i], d);
        ck_assert_msg(d > 10, "%s: the plain and emulated dumps differ in only %d datasets", sets[i], d);
    }
    stream_vs_resident("tiny-fp8", "", NULL, "whole-head");
    stream_vs_resident("tiny-fp8", "--decode-from 0", "37", "tbt");
    stream_vs_resident("tiny-fp8", "--emulate bf16 --decode-from 0", NULL, "emu-tbt");
    char follow[4400];
    snprintf(follow, sizeof follow, "--emulate bf16 --follow %sgolden/tiny-fp8/forced.h5", dsv4_test_source_path(""));
    stream_vs_resident("tiny-fp8", follow, "37", "emu-follow");
}
END_TEST

/* -------------------------------------------------------------------------------------------- memory */
typedef struct progress_count {
    long calls;
    double last_done, total;
} progress_count;

static void count_layers(void *ctx, double done, double total)
{
    progress_count *c = ctx;
    c->calls++;
    c->last_done = done;
    c->total = total;
}

/* A stand-in of n layers in d with a 16-token prompt (d/prompt.txt). */
static void write_standin(const char *d, int n_layers)
{
    dsv4_standin_opts so = {.n_layers = n_layers, .n_shards = n_layers >= 43 ? 46 : 2 + n_layers,
                            .mtp = n_layers >= 43};
    double bytes;
    ck_assert_int_eq(dsv4_flash_standin_write(d, &so, &bytes), 0);
    char path[4200];
    snprintf(path, sizeof path, "%s/prompt.txt", d);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 16; i++) fprintf(f, "%d ", 100 + 7919 * i);
    fclose(f);
    printf("stand-in of %d layers: %.1f GB (sparse) in %s\n", n_layers, bytes / 1e9, d);
}

/* The streamed reference on an n-layer stand-in: 16 tokens, 4 decode steps; its peak GPU memory. */
static double standin_peak(int n_layers)
{
    char *d = dsv4_test_mkdtemp("stream-standin");
    write_standin(d, n_layers);
    dsv4_model *m = NULL;
    ck_assert_msg(dsv4_model_open(d, &m) == 0, "%s", dsv4_last_error());
    const dsv4_config *f = dsv4_model_config(m);
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    o.gpu_weights = DSV4_REF_GPU_WEIGHTS_STREAM;
    progress_count pc = {0, 0, 0};
    o.layer_progress = count_layers;
    o.progress_ctx = &pc;
    dsv4_ref_plan plan;
    ck_assert_msg(dsv4_ref_gpu_plan(m, 20, &o, &plan) == 0, "%s", dsv4_last_error());
    dsv4_ref *r = NULL;
    double t0 = dsv4_test_now_s();
    ck_assert_msg(dsv4_ref_gpu_init_opts(m, 20, &o, &r) == 0, "%s", dsv4_last_error());
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = 100 + 7919 * i;
    float *logits = malloc((size_t)f->vocab_size * sizeof *logits);
    ck_assert_msg(dsv4_ref_prefill(r, tok, 16, NULL, logits) == 0, "%s", dsv4_last_error());
    const double t1 = dsv4_test_now_s();
    for (int s = 0; s < 4; s++) ck_assert_msg(dsv4_ref_decode(r, 3 + s, NULL, logits) == 0, "%s", dsv4_last_error());
    const double t2 = dsv4_test_now_s();
    dsv4_ref_gpu_stats st;
    dsv4_ref_gpu_stats_get(r, &st);
    char line[1200];
    printf("%d layers: plan %s\n  init + prefill %.1f s, 4 decode steps %.1f s; GPU memory: %.1f MiB allocated by the "
           "reference, plan %.1f MiB; cudaMemGetInfo %.0f MiB at init, %.0f MiB peak; %ld calls, %ld dense / %ld head "
           "/ %ld expert parts, %.2f GB copied; host fill %.2f s, H2D %.2f s, dequant %.2f s, waits %.2f s\n",
           n_layers, dsv4_ref_plan_describe(&plan, 20, 0, line, sizeof line), t1 - t0, t2 - t1, st.gpu_alloc / MIB,
           plan.total / MIB, st.gpu_init / MIB, st.gpu_peak / MIB, st.calls, st.dense_parts, st.head_parts,
           st.expert_parts, st.bytes / 1e9, st.fill_s, st.copy_s, st.dequant_s, st.wait_s);
    ck_assert_int_eq(st.gpu, 1);
    ck_assert_int_eq(st.streamed, 1);
    ck_assert_int_eq(st.calls, 5);
    /* what the reference allocates is what its plan says (the state is the plan's upper bound) */
    ck_assert_msg(st.gpu_alloc <= plan.total && st.gpu_alloc >= 0.9 * plan.total, "allocated %.1f MiB, plan %.1f MiB",
                  st.gpu_alloc / MIB, plan.total / MIB);
    /* all the GPU lost, measured: + what CUDA makes for it lazily (the local memory of kernels with per-thread arrays:
     * hc_coeff's 1 KiB a thread is 264 MiB for the 270,336 threads an H200 holds; modules; cuBLAS's workspace) */
    ck_assert_msg(st.gpu_peak <= plan.total + 512 * MIB, "GPU peak %.0f MiB, plan %.0f MiB", st.gpu_peak / MIB,
                  plan.total / MIB);
    ck_assert_msg(st.gpu_peak >= st.gpu_alloc, "GPU peak %.0f MiB below the %.0f MiB allocated: not measured?",
                  st.gpu_peak / MIB, st.gpu_alloc / MIB);
    /* each layer's dense part once per call (+ the first call's own first layer), each head range once per call */
    ck_assert_int_eq(st.dense_parts, 5L * n_layers + 1);
    ck_assert_int_eq(st.head_parts, 5L * plan.head_parts);
    /* a routed expert only when a token routes to it: zero weights route every learned token to experts 0..5, every
     * hash token to expert 0 */
    long ex = 0;
    for (int L = 0; L < n_layers; L++) ex += f->mlp_type[L] == DSV4_MLP_HASH_MOE ? 1 : f->num_experts_per_tok;
    ck_assert_int_eq(st.expert_parts, 5 * ex);
    ck_assert_int_eq(pc.calls, 5L * n_layers);
    ck_assert(pc.last_done == n_layers && pc.total == n_layers);
    for (int v = 0; v < f->vocab_size; v++) ck_assert(isfinite(logits[v]));
    dsv4_ref_free(r);
    dsv4_model_free(m);
    free(logits);
    dsv4_test_rmtree(d);
    return st.gpu_peak;
}

START_TEST(memory_is_bounded_on_a_full_size_standin)
{
    if (dsv4_test_leave_out_long(__func__)) return;
    const double p3 = standin_peak(3), p5 = standin_peak(5);
    printf("GPU peak: 3 layers %.0f MiB, 5 layers %.0f MiB\n", p3 / MIB, p5 / MIB);
    ck_assert_msg(p5 - p3 < 64 * MIB && p3 - p5 < 64 * MIB, "the GPU peak moved by %.0f MiB from 3 to 5 layers",
                  (p5 - p3) / MIB);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--write-standin")) { /* scripts/ref_scale_on_device.sh */
        mkdir(argv[2], 0755);
        dsv4_standin_opts so = {.n_layers = atoi(argv[3]), .n_shards = 46, .mtp = 1};
        double bytes;
        if (dsv4_flash_standin_write(argv[2], &so, &bytes)) return 1;
        char path[4200];
        snprintf(path, sizeof path, "%s/prompt.txt", argv[2]);
        FILE *f = fopen(path, "w");
        if (!f) return 1;
        for (int i = 0; i < 16; i++) fprintf(f, "%d ", 100 + 7919 * i);
        fclose(f);
        printf("stand-in of %d layers: %.1f GB (sparse) in %s\n", so.n_layers, bytes / 1e9, argv[2]);
        return 0;
    }
    dsv4_test_require_gpu();
    dir = dsv4_test_mkdtemp("ref-gpu-stream");
    Suite *s = suite_create("ref_gpu_stream");
    const TTest *const tests[] = {
        dequant_is_the_hosts_bit_for_bit,
        streamed_is_resident_bitwise,
        memory_is_bounded_on_a_full_size_standin,
    };
    dsv4_test_add_each(s, 1800, tests, (int)(sizeof tests / sizeof tests[0]));
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(dir);
    return rc;
}
