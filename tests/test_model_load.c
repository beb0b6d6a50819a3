/* test_model_load.c - whole tiny model folders written by st_writer, loaded and checked:
 * official naming with FP8 linears + FP4 experts + E8M0 scales (values checked against an independent
 * decode of the raw bytes), transformers naming in f32 with fused experts (per-expert views checked against
 * the values written), the save_pretrained layout, a sharded folder (index + 3 shards) with its weights
 * digest checked against sha256sum, and `dsv4 inspect` on each (output and exit status). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4_test.h"
#include "st_writer.h"

static char *make_model(const char *tag, dsv4_stw_naming naming, int shards)
{
    char *dir = dsv4_test_mkdtemp(tag);
    ck_assert_ptr_nonnull(dir);
    dsv4_stw_model_opts o = {naming, NULL, NULL, shards};
    ck_assert_int_eq(dsv4_stw_make_model(dir, dsv4_stw_tiny_config(), &o), 0);
    return dir;
}

static void count_line(void *ctx, const char *line)
{
    fprintf(stderr, "check: %s\n", line);
    ++*(int *)ctx;
}

/* Independent reference decodes (written from the spec, not shared with model/). */
static float ref_e4m3(uint8_t b)
{
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? m / 8.0 * pow(2, -6) : (1 + m / 8.0) * pow(2, e - 7);
    return (float)(s ? -v : v);
}

static float ref_e2m1(uint8_t c)
{
    static const float t[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    return (c & 8) ? -t[c & 7] : t[c & 7];
}

static void run_inspect(const char *dir, int want_status, const char *needle1, const char *needle2)
{
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s'", dsv4_test_bin(), dir);
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == want_status, "inspect exit %d, want %d:\n%s", st, want_status, out ? out : "");
    if (needle1) ck_assert_msg(strstr(out, needle1), "inspect output lacks '%s':\n%s", needle1, out);
    if (needle2) ck_assert_msg(strstr(out, needle2), "inspect output lacks '%s':\n%s", needle2, out);
    free(out);
}

START_TEST(test_official_fp8_fp4_model)
{
    char *dir = make_model("official", DSV4_STW_OFFICIAL_QUANT, 1);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    ck_assert_str_eq(dsv4_model_naming(m), "official");
    int problems = 0;
    ck_assert_int_eq(dsv4_model_check(m, count_line, &problems), 0);
    ck_assert_int_eq(problems, 0);
    const dsv4_config *c = dsv4_model_config(m);

    /* FP8 wq_a [160, 64]: two row blocks, the second partial (32 rows) */
    const dsv4_tensor *t;
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.1.attn.wq_a.weight", &t), 0);
    ck_assert_int_eq(t->dtype, DSV4_DTYPE_F8_E4M3);
    ck_assert_ptr_nonnull(t->scale);
    ck_assert_int_eq(t->scale->shape[0], 2);
    const float *v;
    ck_assert_int_eq(dsv4_model_f32(m, "layers.1.attn.wq_a.weight", 160 * 64, &v), 0);
    const uint8_t *q = t->data, *s = t->scale->data;
    for (int r = 0; r < 160; r++)
        for (int k = 0; k < 64; k++) {
            float want = ref_e4m3(q[r * 64 + k]) * (float)pow(2, s[(r / 128) * 1] - 127);
            ck_assert_msg(v[r * 64 + k] == want, "wq_a[%d][%d] = %g, want %g", r, k, v[r * 64 + k], want);
        }
    /* FP8 wq_b [128, 160]: two column blocks */
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.3.attn.wq_b.weight", &t), 0);
    ck_assert_int_eq(dsv4_model_f32(m, "layers.3.attn.wq_b.weight", 128 * 160, &v), 0);
    q = t->data;
    s = t->scale->data;
    for (int r = 0; r < 128; r++)
        for (int k = 0; k < 160; k++)
            ck_assert(v[r * 160 + k] == ref_e4m3(q[r * 160 + k]) * (float)pow(2, s[k / 128] - 127));

    /* FP4 expert w2 [64, 32] stored I8 [64, 16], scale [64, 1] */
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.2.ffn.experts.3.w2.weight", &t), 0);
    ck_assert_int_eq(t->dtype, DSV4_DTYPE_I8);
    ck_assert_int_eq(t->shape[1], 16);
    ck_assert_int_eq(dsv4_model_f32(m, "layers.2.ffn.experts.3.w2.weight", 64 * 32, &v), 0);
    q = t->data;
    s = t->scale->data;
    for (int r = 0; r < 64; r++)
        for (int k = 0; k < 32; k++) {
            uint8_t b = q[r * 16 + k / 2];
            float want = ref_e2m1(k % 2 ? b >> 4 : b & 15) * (float)pow(2, s[r] - 127);
            ck_assert(v[r * 32 + k] == want);
        }
    /* FP4 w1 [32, 64]: two scale columns per row */
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.0.ffn.experts.0.w1.weight", &t), 0);
    ck_assert_int_eq(dsv4_model_f32(m, "layers.0.ffn.experts.0.w1.weight", 32 * 64, &v), 0);
    q = t->data;
    s = t->scale->data;
    for (int r = 0; r < 32; r++)
        for (int k = 0; k < 64; k++) {
            uint8_t b = q[r * 32 + k / 2];
            ck_assert(v[r * 64 + k] == ref_e2m1(k % 2 ? b >> 4 : b & 15) * (float)pow(2, s[r * 2 + k / 32] - 127));
        }
    /* BF16 and F32 tensors hold the writer's values exactly */
    ck_assert_int_eq(dsv4_model_tensor(m, "embed.weight", &t), 0);
    ck_assert_int_eq(t->dtype, DSV4_DTYPE_BF16);
    ck_assert_int_eq(dsv4_model_f32(m, "embed.weight", 96 * 64, &v), 0);
    for (int i = 0; i < 96 * 64; i++) ck_assert(v[i] == dsv4_stw_value("embed.weight", (size_t)i));
    ck_assert_int_eq(dsv4_model_f32(m, "layers.1.attn.compressor.ape", 4 * 64, &v), 0);
    for (int i = 0; i < 4 * 64; i++) ck_assert(v[i] == dsv4_stw_value("layers.1.attn.compressor.ape", (size_t)i));
    int32_t *ids = malloc(96 * 2 * sizeof *ids);
    ck_assert_int_eq(dsv4_model_read_i32(m, "layers.0.ffn.gate.tid2eid", ids, 96 * 2), 0);
    for (int i = 0; i < 96 * 2; i++) ck_assert_int_eq(ids[i], dsv4_stw_tid2eid(i / 2, i % 2, c->n_routed_experts));
    free(ids);
    dsv4_model_free(m);

    run_inspect(dir, 0, "naming official", "check: 0 problems");
    run_inspect(dir, 0, "F8_E4M3", "  0-3      Sh Cm Hm Cm");
    run_inspect(dir, 0, "I8", "yarn factor 16");
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_transformers_f32_model)
{
    char *dir = make_model("tf", DSV4_STW_TRANSFORMERS_F32, 1);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    ck_assert_str_eq(dsv4_model_naming(m), "transformers");
    int problems = 0;
    ck_assert_int_eq(dsv4_model_check(m, count_line, &problems), 0);
    /* fused gate_up_proj [E, 2I, D] -> w1 = rows 0..I-1, w3 = rows I..2I-1; down_proj -> w2 */
    static const char *const names[] = {"layers.1.ffn.experts.2.w1.weight", "layers.1.ffn.experts.2.w3.weight",
                                        "layers.3.ffn.experts.3.w2.weight", "layers.0.ffn.experts.0.w3.weight"};
    for (int k = 0; k < 4; k++) {
        const dsv4_tensor *t;
        ck_assert_int_eq(dsv4_model_tensor(m, names[k], &t), 0);
        ck_assert_int_eq(t->ndim, 2);
        const float *v;
        ck_assert_int_eq(dsv4_model_f32(m, names[k], 32 * 64, &v), 0);
        for (int i = 0; i < 32 * 64; i++)
            ck_assert_msg(v[i] == dsv4_stw_value(names[k], (size_t)i), "%s[%d] wrong", names[k], i);
    }
    static const char *const plain[] = {"layers.1.attn.indexer.weights_proj.weight", "layers.2.attn.kv_norm.weight",
                                        "layers.3.ffn.gate.bias", "hc_head_fn", "head.weight",
                                        "layers.1.hc_ffn_scale", "layers.3.attn.indexer.compressor.ape"};
    for (int k = 0; k < 7; k++) {
        const dsv4_tensor *t;
        ck_assert_msg(dsv4_model_tensor(m, plain[k], &t) == 0, "%s", dsv4_last_error());
        size_t n = t->nbytes / 4;
        const float *v;
        ck_assert_int_eq(dsv4_model_f32(m, plain[k], n, &v), 0);
        for (size_t i = 0; i < n; i++) ck_assert(v[i] == dsv4_stw_value(plain[k], i));
    }
    dsv4_model_free(m);
    run_inspect(dir, 0, "naming transformers", "check: 0 problems");
    run_inspect(dir, 0, "fused experts split", NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_save_pretrained_layout)
{
    char *dir = make_model("save", DSV4_STW_SAVE_F32, 1);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    ck_assert_str_eq(dsv4_model_naming(m), "save_pretrained");
    int problems = 0;
    ck_assert_int_eq(dsv4_model_check(m, count_line, &problems), 0);
    const dsv4_tensor *t;
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.2.attn.kv_norm.weight", &t), 0);
    ck_assert_str_eq(t->disk_name, "model.layers.2.attn.norm.weight");
    ck_assert_int_eq(dsv4_model_tensor(m, "layers.2.attn.compressor.norm.weight", &t), 0);
    ck_assert_str_eq(t->disk_name, "model.layers.2.attn.compressor.norm.weight");
    ck_assert_int_eq(dsv4_model_tensor(m, "embed.weight", &t), 0);
    ck_assert_str_eq(t->disk_name, "model.embed_tokens.weight");
    float v[32];
    ck_assert_int_eq(dsv4_model_read_f32(m, "layers.2.attn.kv_norm.weight", v, 32), 0);
    for (int i = 0; i < 32; i++) ck_assert(v[i] == dsv4_stw_value("layers.2.attn.kv_norm.weight", (size_t)i));
    dsv4_model_free(m);
    run_inspect(dir, 0, "naming save_pretrained", "check: 0 problems");
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_sharded_model_and_digest)
{
    char *dir = make_model("shards", DSV4_STW_OFFICIAL_F32, 3);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    int problems = 0;
    ck_assert_int_eq(dsv4_model_check(m, count_line, &problems), 0);
    char hex[65], cmd[4400], *out = NULL;
    ck_assert_int_eq(dsv4_model_weights_digest(m, hex), 0);
    ck_assert_int_eq(strlen(hex), 64);
    snprintf(cmd, sizeof cmd, "cd '%s' && cat $(ls *.safetensors | LC_ALL=C sort) | sha256sum", dir);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 0);
    ck_assert_msg(!strncmp(out, hex, 64), "digest %s, sha256sum %s", hex, out);
    free(out);
    dsv4_model_free(m);
    run_inspect(dir, 0, "check: 0 problems", NULL);
    dsv4_test_rmtree(dir);

    dir = make_model("single", DSV4_STW_OFFICIAL_QUANT, 1);
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    ck_assert_int_eq(dsv4_model_weights_digest(m, hex), 0);
    snprintf(cmd, sizeof cmd, "sha256sum '%s/model.safetensors'", dir);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 0);
    ck_assert_msg(!strncmp(out, hex, 64), "digest %s, sha256sum %s", hex, out);
    free(out);
    dsv4_model_free(m);
    snprintf(cmd, sizeof cmd, "'%s' inspect --digest '%s'", dsv4_test_bin(), dir);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, hex));
    free(out);
    dsv4_test_rmtree(dir);
}
END_TEST

/* The digest reads every weight byte (minutes on a full checkpoint): it reports its progress in bytes, the total
 * first known (the sum of the files' sizes), ending at done == total, and the digest is the plain one. The dsv4
 * command prints that as a progress line (here forced at once with DSV4_PROGRESS_AFTER_S=0). */
typedef struct digest_calls {
    int n, bad;
    double last_done, total;
} digest_calls;

static void on_digest(void *ctx, double done, double total)
{
    digest_calls *c = ctx;
    if (done < c->last_done || done > total || (c->n && total != c->total)) c->bad++;
    c->n++;
    c->last_done = done;
    c->total = total;
}

START_TEST(test_digest_reports_progress)
{
    char *dir = make_model("digest-progress", DSV4_STW_OFFICIAL_F32, 3);
    dsv4_model *m;
    ck_assert_int_eq(dsv4_model_open(dir, &m), 0);
    char plain[65], hex[65], cmd[4400], *out = NULL;
    ck_assert_int_eq(dsv4_model_weights_digest(m, plain), 0);
    digest_calls c = {0};
    ck_assert_int_eq(dsv4_model_weights_digest_progress(m, hex, on_digest, &c), 0);
    ck_assert_str_eq(hex, plain);
    snprintf(cmd, sizeof cmd, "cd '%s' && cat *.safetensors | wc -c", dir);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 0);
    ck_assert_msg(c.n >= 3 && !c.bad && c.last_done == c.total && c.total == atof(out),
                  "%d calls, %d out of order, last %.0f of %.0f, files %s", c.n, c.bad, c.last_done, c.total, out);
    free(out);
    dsv4_model_free(m);
    snprintf(cmd, sizeof cmd, "DSV4_PROGRESS_AFTER_S=0 '%s' inspect --digest '%s' 2>&1", dsv4_test_bin(), dir);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "weights_digest: hashed") && strstr(out, plain), "%s", out);
    free(out);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_inspect_usage)
{
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' inspect --help", dsv4_test_bin());
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: dsv4 inspect"));
    ck_assert_ptr_nonnull(strstr(out, "exit status"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' inspect", dsv4_test_bin());
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' inspect --bogus x", dsv4_test_bin());
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' inspect /nonexistent/dsv4-model", dsv4_test_bin());
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "/nonexistent/dsv4-model/config.json"));
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_load");
    TCase *tc = tcase_create("load");
    tcase_add_test(tc, test_official_fp8_fp4_model);
    tcase_add_test(tc, test_transformers_f32_model);
    tcase_add_test(tc, test_save_pretrained_layout);
    tcase_add_test(tc, test_sharded_model_and_digest);
    tcase_add_test(tc, test_digest_reports_progress);
    tcase_add_test(tc, test_inspect_usage);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
