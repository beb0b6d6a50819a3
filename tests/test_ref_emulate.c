/* test_ref_emulate.c - the CPU reference's options (dsv4_ref_options): the bf16 emulation and decision following,
 * on golden/tiny (forced, all 64 positions; the model's fp32 weights).
 *
 *   emulate off:  dsv4_ref_cpu_init_opts with the default options (and emulate NONE set explicitly) writes a dump
 *                 whose every dataset is bitwise the one of dsv4_ref_cpu_init (the plain reference).
 *   emulate bf16: the dump differs; at layer 0 (before any error compounds) every float probe's relative L2 error
 *                 against the plain reference, over all positions, lies in [1e-4, 3e-2]: a bf16-sized error, so
 *                 the check fails when nothing is rounded and when the rounding is garbage. The values the
 *                 optimized path stores in bf16 and probes from there (the residual streams `out`, the head's
 *                 `norm`) are exactly bf16 in every element; the plain reference's are not.
 *   follow:       following the plain reference's own dump (emulate off) is bitwise the plain run, with every
 *                 row of the table used and none changed; following the bf16 emulation's dump changes rows (the
 *                 emulation flips a few near-tie picks on tiny) and so changes the run.
 *   the GPU init: dsv4_ref_gpu_init_opts (and dsv4_ref_cpu_init_opts) refuse options that do not fit the model (a
 *                 follow table of another config, an emulate outside the enum) with DSV4_ERR_USAGE naming the path
 *                 and the value, before any device is touched; options that fit get as far as the device: with none
 *                 visible (CUDA_VISIBLE_DEVICES=-1) DSV4_ERR_CUDA "no CUDA device", in a build without CUDA
 *                 DSV4_ERR_UNSUPPORTED "this build has no CUDA". The GPU runs themselves: tests/gpu/.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_opt.h"
#include "dsv4/dsv4_ref.h"
#include "dsv4_test.h"

static char *tmpdir;

/* Run golden/tiny's forced tokens through the CPU reference (prefill the prompt, decode the rest), every position
 * dumped to `out`. o NULL: dsv4_ref_cpu_init. Returns the follow statistics in fs (may be NULL). */
static void run_tiny(const dsv4_ref_options *o, const char *out, dsv4_ref_follow_stats *fs)
{
    char *model = strdup(dsv4_test_source_path("golden/tiny"));
    const char *golden = dsv4_test_source_path("golden/tiny/forced.h5");
    dsv4_dump *g = NULL;
    ck_assert_msg(dsv4_dump_open(golden, &g) == 0, "%s", dsv4_last_error());
    int T;
    const int32_t *tok = dsv4_dump_tokens(g, &T);
    const int P = dsv4_dump_prompt_len(g);
    dsv4_model *m = NULL;
    ck_assert_msg(dsv4_model_open(model, &m) == 0, "%s", dsv4_last_error());
    const dsv4_config *cfg = dsv4_model_config(m);
    dsv4_ref *r = NULL;
    int rc = o ? dsv4_ref_cpu_init_opts(m, T, o, &r) : dsv4_ref_cpu_init(m, T, &r);
    ck_assert_msg(rc == 0, "init: %s", dsv4_last_error());
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    for (int p = 0; p < T; p++) pos[p] = p;
    char digest[65];
    ck_assert_int_eq(dsv4_model_weights_digest(m, digest), 0);
    dsv4_dump_meta meta = {.producer = dsv4_ref_producer(r), .config_json = dsv4_model_config_json(m),
                           .weights_digest = digest, .prompt_len = P, .n_decode = T - P, .mode = "forced"};
    dsv4_dump_writer *w = NULL;
    dsv4_probe_sink *sink = NULL;
    ck_assert_int_eq(dsv4_dump_writer_open(out, &meta, cfg, tok, T, pos, T, &w), 0);
    ck_assert_int_eq(dsv4_probe_sink_init(w, cfg, pos, T, T, &sink), 0);
    ck_assert_msg(dsv4_ref_prefill(r, tok, P, sink, NULL) == 0, "%s", dsv4_last_error());
    for (int p = P; p < T; p++) ck_assert_msg(dsv4_ref_decode(r, tok[p], sink, NULL) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_dump_entries(r, sink), 0);
    dsv4_probe_sink_free(sink);
    ck_assert_msg(dsv4_dump_writer_commit(w) == 0, "%s", dsv4_last_error());
    if (fs) dsv4_ref_follow_stats_get(r, fs);
    dsv4_ref_free(r);
    dsv4_model_free(m);
    dsv4_dump_free(g);
    free(pos);
    free(model);
}

static char *tmp_path(const char *name)
{
    size_t n = strlen(tmpdir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", tmpdir, name);
    return p;
}

/* Bytes of dataset `name` of d (malloc'd), its element count in *n. */
static void *read_all(dsv4_dump *d, const char *name, size_t *n, dsv4_dataset_info *info)
{
    ck_assert_int_eq(dsv4_dump_info(d, name, info), 0);
    size_t cnt = 1;
    for (int k = 0; k < info->ndim; k++) cnt *= (size_t)info->shape[k];
    void *buf = malloc(cnt * 4 + 4);
    ck_assert_int_eq(dsv4_dump_read_rows(d, name, 0, info->shape[0], buf), 0);
    *n = cnt;
    return buf;
}

/* Number of datasets of a and b whose bytes differ (both must hold the same datasets). */
static int count_different(const char *pa, const char *pb, int verbose)
{
    dsv4_dump *a = NULL, *b = NULL;
    ck_assert_int_eq(dsv4_dump_open(pa, &a), 0);
    ck_assert_int_eq(dsv4_dump_open(pb, &b), 0);
    ck_assert_int_eq(dsv4_dump_dataset_count(a), dsv4_dump_dataset_count(b));
    int differ = 0;
    for (int i = 0; i < dsv4_dump_dataset_count(a); i++) {
        const char *name = dsv4_dump_dataset_name(a, i);
        ck_assert_msg(dsv4_dump_has(b, name), "%s: %s missing", pb, name);
        dsv4_dataset_info ia, ib;
        size_t na, nb;
        void *x = read_all(a, name, &na, &ia), *y = read_all(b, name, &nb, &ib);
        ck_assert_msg(na == nb && ia.dtype == ib.dtype, "%s: shape or dtype differs", name);
        if (memcmp(x, y, na * 4)) {
            differ++;
            if (verbose) printf("  %s differs\n", name);
        }
        free(x);
        free(y);
    }
    dsv4_dump_free(a);
    dsv4_dump_free(b);
    return differ;
}

START_TEST(emulate_off_is_plain)
{
    char *plain = tmp_path("plain.h5"), *def = tmp_path("default.h5"), *none = tmp_path("none.h5");
    run_tiny(NULL, plain, NULL);
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    ck_assert_int_eq(o.emulate, DSV4_REF_EMULATE_NONE);
    ck_assert_ptr_null(o.follow);
    run_tiny(&o, def, NULL);
    o.emulate = DSV4_REF_EMULATE_NONE;
    run_tiny(&o, none, NULL);
    ck_assert_int_eq(count_different(plain, def, 1), 0);
    ck_assert_int_eq(count_different(plain, none, 1), 0);
    free(plain);
    free(def);
    free(none);
}
END_TEST

/* rel_l2 of b against a over the whole dataset (all positions). */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) && a[i] == b[i]) continue; /* -inf padding */
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

static int all_bf16(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if (u & 0xffffu) return 0;
    }
    return 1;
}

START_TEST(emulate_bf16_is_bf16_sized)
{
    char *plain = tmp_path("plain.h5"), *emu = tmp_path("emu.h5");
    run_tiny(NULL, plain, NULL);
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    ck_assert_int_eq(dsv4_ref_emulate_parse("bf16", &o.emulate), 0);
    run_tiny(&o, emu, NULL);
    ck_assert_int_gt(count_different(plain, emu, 0), 0);
    dsv4_dump *a = NULL, *b = NULL;
    ck_assert_int_eq(dsv4_dump_open(plain, &a), 0);
    ck_assert_int_eq(dsv4_dump_open(emu, &b), 0);
    ck_assert_ptr_nonnull(strstr(dsv4_dump_attr(b, "producer"), "emulate=bf16"));
    int checked = 0;
    for (int i = 0; i < dsv4_dump_dataset_count(a); i++) {
        const char *name = dsv4_dump_dataset_name(a, i);
        if (strncmp(name, "layers/0/", 9)) continue;
        dsv4_dataset_info ia, ib;
        size_t na, nb;
        float *x = read_all(a, name, &na, &ia), *y = read_all(b, name, &nb, &ib);
        if (ia.dtype == DSV4_DTYPE_F32) {
            double e = rel_l2(x, y, na);
            printf("  %-28s rel_l2 %.3e\n", name, e);
            ck_assert_msg(e >= 1e-4 && e <= 3e-2, "%s: rel_l2 %.3e of the bf16 emulation against the fp32 reference "
                          "at layer 0 is not bf16-sized [1e-4, 3e-2]", name, e);
            checked++;
        }
        free(x);
        free(y);
    }
    ck_assert_int_ge(checked, 10); /* hc x6, attn_in, kv, attn_out, ffn_in, router_weights, ffn_out, out */
    /* the stored bf16 values: the residual streams of every layer and the head's norm */
    for (int i = 0; i < dsv4_dump_dataset_count(b); i++) {
        const char *name = dsv4_dump_dataset_name(b, i);
        size_t len = strlen(name);
        if (!(len > 4 && !strcmp(name + len - 4, "/out")) && strcmp(name, "final/norm")) continue;
        dsv4_dataset_info ia, ib;
        size_t na, nb;
        float *x = read_all(a, name, &na, &ia), *y = read_all(b, name, &nb, &ib);
        ck_assert_msg(all_bf16(y, nb), "emulation: %s is not bf16 in every element", name);
        ck_assert_msg(!all_bf16(x, na), "plain: %s is bf16 in every element (the test proves nothing)", name);
        free(x);
        free(y);
    }
    dsv4_dump_free(a);
    dsv4_dump_free(b);
    free(plain);
    free(emu);
}
END_TEST

START_TEST(follow_own_dump_is_plain)
{
    char *plain = tmp_path("plain.h5"), *fol = tmp_path("follow.h5"), *emu = tmp_path("emu.h5");
    char *fol_emu = tmp_path("follow_emu.h5");
    run_tiny(NULL, plain, NULL);
    dsv4_model *m = NULL;
    ck_assert_int_eq(dsv4_model_open(dsv4_test_source_path("golden/tiny"), &m), 0);
    dsv4_opt_follow *table = NULL;
    ck_assert_msg(dsv4_opt_follow_load(plain, dsv4_model_config(m), &table) == 0, "%s", dsv4_last_error());
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    o.follow = table;
    dsv4_ref_follow_stats fs;
    run_tiny(&o, fol, &fs);
    printf("follow own dump: %ld top-k rows (%ld changed), %ld router rows (%ld changed), stop %d\n", fs.topk_rows,
           fs.topk_changed, fs.router_rows, fs.router_changed, fs.stopped_at);
    ck_assert_int_eq(fs.topk_rows, dsv4_opt_follow_rows(table, DSV4_OPT_FOLLOW_TOPK));
    ck_assert_int_eq(fs.router_rows, dsv4_opt_follow_rows(table, DSV4_OPT_FOLLOW_ROUTER));
    ck_assert_int_gt(fs.topk_rows, 0);
    ck_assert_int_eq(fs.topk_changed, 0);
    ck_assert_int_eq(fs.router_changed, 0);
    ck_assert_int_eq(fs.stopped_at, -1);
    ck_assert_int_eq(count_different(plain, fol, 1), 0);
    dsv4_opt_follow_free(table);

    /* the emulation's choices differ in a few near-tie rows: following them must change the plain run */
    dsv4_ref_options_default(&o);
    o.emulate = DSV4_REF_EMULATE_BF16;
    run_tiny(&o, emu, NULL);
    ck_assert_int_eq(dsv4_opt_follow_load(emu, dsv4_model_config(m), &table), 0);
    dsv4_ref_options_default(&o);
    o.follow = table;
    run_tiny(&o, fol_emu, &fs);
    printf("follow the emulation: %ld top-k rows (%ld changed), %ld router rows (%ld changed)\n", fs.topk_rows,
           fs.topk_changed, fs.router_rows, fs.router_changed);
    ck_assert_int_gt(fs.topk_changed + fs.router_changed, 0);
    ck_assert_int_gt(count_different(plain, fol_emu, 0), 0);
    dsv4_opt_follow_free(table);
    dsv4_model_free(m);
    free(plain);
    free(fol);
    free(emu);
    free(fol_emu);
}
END_TEST

/* init with o: must fail with `code` and a message holding each of the needles; *out stays NULL */
static void expect_init_error(int gpu, dsv4_model *m, const dsv4_ref_options *o, int code, const char *const *needles)
{
    dsv4_ref *r = (dsv4_ref *)&r; /* not NULL: init must clear it */
    const int rc = gpu ? dsv4_ref_gpu_init_opts(m, 64, o, &r) : dsv4_ref_cpu_init_opts(m, 64, o, &r);
    const char *msg = dsv4_last_error();
    printf("%s init: %d: %s\n", gpu ? "gpu" : "cpu", rc, msg);
    ck_assert_msg(rc == code, "%s init returned %d, want %d: %s", gpu ? "gpu" : "cpu", rc, code, msg);
    ck_assert_ptr_null(r);
    for (int i = 0; needles[i]; i++) ck_assert_msg(strstr(msg, needles[i]), "'%s' lacks '%s'", msg, needles[i]);
}

START_TEST(gpu_init_checks_options_first)
{
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1); /* before this (forked) process's first CUDA call: no device anywhere */
    dsv4_model *tiny = dsv4_test_open_golden("tiny"), *t512 = dsv4_test_open_golden("topk512");
    dsv4_opt_follow *other = NULL, *own = NULL;
    ck_assert_int_eq(dsv4_opt_follow_load(dsv4_test_source_path("golden/topk512/forced.h5"), dsv4_model_config(t512),
                                          &other), 0);
    ck_assert_int_eq(dsv4_opt_follow_load(dsv4_test_source_path("golden/tiny/forced.h5"), dsv4_model_config(tiny),
                                          &own), 0);
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    o.follow = other; /* index_topk 512, 2 experts per token: tiny has 4 and 3 */
    for (int gpu = 0; gpu < 2; gpu++)
        expect_init_error(gpu, tiny, &o, DSV4_ERR_USAGE,
                          (const char *const[]){gpu ? "ref-gpu: " : "reference: ", "topk512/forced.h5",
                                                "loaded for another config", "index_topk 512", NULL});
    dsv4_ref_options_default(&o);
    o.emulate = (dsv4_ref_emulate)7;
    for (int gpu = 0; gpu < 2; gpu++)
        expect_init_error(gpu, tiny, &o, DSV4_ERR_USAGE,
                          (const char *const[]){gpu ? "ref-gpu: emulate 7" : "reference: emulate 7", NULL});
    o.emulate = DSV4_REF_EMULATE_BF16;
    o.follow = own;
#ifdef DSV4_HAVE_CUDA
    const int code = DSV4_ERR_CUDA;
    const char *const why[] = {"ref-gpu: no CUDA device", NULL};
#else
    const int code = DSV4_ERR_UNSUPPORTED;
    const char *const why[] = {"ref-gpu: this build has no CUDA", NULL};
#endif
    expect_init_error(1, tiny, &o, code, why);
    expect_init_error(1, tiny, NULL, code, why);
    dsv4_ref *r = NULL;
    ck_assert_int_eq(dsv4_ref_gpu_init(tiny, 64, &r), code);
    ck_assert_ptr_null(r);
    dsv4_ref_follow_stats fs;
    dsv4_ref_follow_stats_get(NULL, &fs);
    ck_assert(fs.topk_rows == 0 && fs.router_rows == 0 && fs.stopped_at == -1);
    dsv4_opt_follow_free(other);
    dsv4_opt_follow_free(own);
    dsv4_model_free(tiny);
    dsv4_model_free(t512);
}
END_TEST

static void setup(void) { tmpdir = dsv4_test_mkdtemp("ref_emulate"); }
static void teardown(void)
{
    dsv4_test_rmtree(tmpdir);
    tmpdir = NULL;
}

int main(void)
{
    Suite *s = suite_create("ref_emulate");
    TCase *tc = tcase_create("tiny");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, emulate_off_is_plain);
    tcase_add_test(tc, emulate_bf16_is_bf16_sized);
    tcase_add_test(tc, follow_own_dump_is_plain);
    tcase_add_test(tc, gpu_init_checks_options_first);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
