/* test_ref_gpu_plan.c - the host side of ref-gpu's streamed weights (issue 36 phase 2; reference/ref_gpu_layout.h,
 * docs/reference.md "ref-gpu streams layers"), without a GPU:
 *
 *   parts:   on golden/tiny-fp8 (FP8 + E8M0, FP4, bf16, f32) and golden/tiny (f32), plain and emulated, with the head
 *            whole and cut into row ranges ($DSV4_REF_GPU_HEAD_ROWS): every tensor the streamed reference reads is in
 *            exactly one part (the embedding and the globals apart), the layer parts in DSV4_REF_LAYER_TENSORS's
 *            order; each part fits its slot; the pieces' slot bytes and f32 views are 256-byte aligned and do not
 *            overlap; the head's ranges tile its rows and land at their rows of one view; a filled slot holds the
 *            tensors' bytes as on disk (and their scale rows); the rounding flags are the emulation's rule.
 *   plan:    on a full-size sparse stand-in of the released checkpoint (tests/support/flash_standin.h), 3 and 43
 *            layers: the streamed plan is a few GiB (the resident one 1 TiB), its weights do not grow with the layers,
 *            the head travels in several ranges of at most a dense slot each; auto picks streamed under a device
 *            limit below the resident total (+10%); a limit below the streamed plan refuses it with its numbers
 *            (DSV4_ERR_NOMEM). On golden/tiny-fp8 auto picks resident where it fits with 10% to spare.
 *   options: --gpu-weights's names and parse; a value outside the enum is refused by dsv4_ref_options_check and by
 *            dsv4_ref_gpu_init_opts before any device is touched (both builds).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/ref_gpu_layout.h"
#include "../reference/ref_model.h"
#include "dsv4/dsv4_ref.h"
#include "dsv4_test.h"
#include "flash_standin.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* The tensors the streamed reference reads through parts: every expected tensor but tid2eid, the embedding (a row
 * per token, on the host), the final norm and hc_head (resident); the head is head.weight (untied). */
static int streamed_tensor(const char *name)
{
    return !strstr(name, ".tid2eid") && strcmp(name, "embed.weight") && strcmp(name, "norm.weight") &&
           strncmp(name, "hc_head_", 8);
}

typedef struct seen {
    char name[96];
    int64_t rows_covered;
    int pieces;
} seen;

static seen *seen_find(seen *s, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s[i].name, name)) return &s[i];
    return NULL;
}

/* One part's invariants against its slot and buffer sizes; the filled slot against the bytes on disk. */
static void check_part(dsv4_model *m, const dsv4_ref_part *part, size_t slot, size_t floats, int emu, seen *s,
                       int n_seen, uint8_t *host)
{
    ck_assert_msg(part->bytes <= slot, "part %d/%d/%d: %zu bytes in a slot of %zu", part->kind, part->layer,
                  part->index, part->bytes, slot);
    ck_assert_msg(part->floats <= floats, "part %d/%d/%d: %zu floats in a buffer of %zu", part->kind, part->layer,
                  part->index, part->floats, floats);
    memset(host, 0xA5, slot);
    ck_assert_msg(dsv4_ref_part_fill(part, m, host) == 0, "%s", dsv4_last_error());
    size_t end_bytes = 0, end_floats = 0;
    for (int i = 0; i < part->n; i++) {
        const dsv4_ref_piece *p = &part->p[i];
        const dsv4_tensor *t = p->t;
        ck_assert_msg(p->data_at % 256 == 0 && p->scale_at % 256 == 0, "%s: slot offsets %zu, %zu", t->name,
                      p->data_at, p->scale_at);
        ck_assert_msg(p->data_at >= end_bytes && p->scale_at >= p->data_at + p->src_len, "%s: overlapping bytes",
                      t->name);
        end_bytes = p->scale_at + p->ssrc_len;
        if (part->kind != DSV4_REF_PART_HEAD) {
            ck_assert_msg(p->dst_at % 64 == 0 && p->dst_at >= end_floats, "%s: f32 view at %zu", t->name, p->dst_at);
            end_floats = p->dst_at + (size_t)p->nrows * (size_t)p->cols;
        } else {
            ck_assert_int_eq(p->dst_at, (size_t)p->row0 * (size_t)p->cols); /* its rows of the one head view */
        }
        /* the bytes as on disk, and the scale rows the rows need */
        if (p->fmt == DSV4_REF_WFMT_HOST) {
            float *want = malloc((size_t)p->nrows * p->cols * 4 + 4);
            ck_assert_int_eq(dsv4_model_read_f32_rows(m, t->name, p->row0, p->nrows, want), 0);
            ck_assert(!memcmp(host + p->data_at, want, (size_t)p->nrows * p->cols * 4));
            free(want);
        } else {
            ck_assert(!memcmp(host + p->data_at, p->src, p->src_len));
            ck_assert_ptr_eq(p->src, (const uint8_t *)t->data + (size_t)p->row0 * (t->nbytes / (size_t)t->shape[0]));
        }
        const int fp8 = p->fmt == DSV4_REF_WFMT_FP8, fp4 = p->fmt == DSV4_REF_WFMT_FP4;
        ck_assert_int_eq(fp8, t->dtype == DSV4_DTYPE_F8_E4M3);
        ck_assert_int_eq(fp4, t->dtype == DSV4_DTYPE_I8);
        if (fp8 || fp4) {
            const size_t srow = (size_t)t->scale->shape[1] * (t->scale->dtype == DSV4_DTYPE_F32 ? 4 : 1);
            const int64_t s0 = fp8 ? p->row0 / 128 : p->row0, s1 = fp8 ? (p->row0 + p->nrows - 1) / 128
                                                                        : p->row0 + p->nrows - 1;
            ck_assert_ptr_eq(p->ssrc, (const uint8_t *)t->scale->data + (size_t)s0 * srow);
            ck_assert_int_eq(p->ssrc_len, (size_t)(s1 - s0 + 1) * srow);
            ck_assert(!memcmp(host + p->scale_at, p->ssrc, p->ssrc_len));
        } else {
            ck_assert_int_eq(p->ssrc_len, 0);
        }
        /* the emulation's rule (ref_weights.c emu_rounds): bf16-held tensors, unless FP8 / FP4 on disk */
        if (!emu) ck_assert_int_eq(p->round, 0);
        if (fp8 || fp4) ck_assert_int_eq(p->round, 0);
        seen *e = seen_find(s, n_seen, t->name);
        ck_assert_msg(e != NULL, "%s: in a part but not a streamed tensor", t->name);
        e->rows_covered += p->nrows;
        e->pieces++;
    }
    ck_assert_int_le(end_bytes, part->bytes);
}

/* Every part of the model: covers each streamed tensor's rows exactly once, within the measured sizes. */
static void check_all_parts(const char *set, int emu, const char *head_rows)
{
    if (head_rows) setenv("DSV4_REF_GPU_HEAD_ROWS", head_rows, 1);
    dsv4_model *m = dsv4_test_open_golden(set);
    const dsv4_config *f = dsv4_model_config(m);
    dsv4_ref_stream_size sz;
    ck_assert_msg(dsv4_ref_stream_measure(m, f, emu, &sz) == 0, "%s", dsv4_last_error());
    dsv4_expected_tensor *ex = NULL;
    int n_ex = 0;
    ck_assert_int_eq(dsv4_config_expected_tensors(f, &ex, &n_ex), 0);
    seen *s = calloc((size_t)n_ex, sizeof *s);
    int n = 0;
    for (int i = 0; i < n_ex; i++)
        if (streamed_tensor(ex[i].name)) snprintf(s[n++].name, sizeof s[0].name, "%s", ex[i].name);
    uint8_t *host = malloc(sz.dense_slot > sz.expert_slot ? sz.dense_slot : sz.expert_slot);
    dsv4_ref_part part;
    int pieces_per_layer_max = 0;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        ck_assert_int_eq(dsv4_ref_part_layer(m, f, L, emu, &part), 0);
        ck_assert_int_eq(part.kind, DSV4_REF_PART_LAYER);
        char first[64]; /* DSV4_REF_LAYER_TENSORS's order */
        snprintf(first, sizeof first, "layers.%d.hc_attn_fn", L);
        ck_assert_str_eq(part.p[0].t->name, first);
        check_part(m, &part, sz.dense_slot, sz.layer_floats, emu, s, n, host);
        if (part.n > pieces_per_layer_max) pieces_per_layer_max = part.n;
        for (int e = 0; e < f->n_routed_experts; e++) {
            ck_assert_int_eq(dsv4_ref_part_expert(m, f, L, e, emu, &part), 0);
            ck_assert_int_eq(part.n, 3);
            check_part(m, &part, sz.expert_slot, sz.expert_floats, emu, s, n, host);
        }
    }
    int64_t rows = 0;
    for (int k = 0; k < sz.head_parts; k++) {
        ck_assert_int_eq(dsv4_ref_part_head(m, f, &sz, k, emu, &part), 0);
        ck_assert_int_eq(part.n, 1);
        ck_assert_int_eq(part.p[0].row0, rows); /* the ranges tile the rows in order */
        rows += part.p[0].nrows;
        check_part(m, &part, sz.dense_slot, sz.arena_floats, emu, s, n, host);
    }
    ck_assert_int_eq(rows, f->vocab_size);
    ck_assert_int_eq(dsv4_ref_part_head(m, f, &sz, sz.head_parts, emu, &part), DSV4_ERR_USAGE);
    for (int i = 0; i < n; i++) {
        const dsv4_tensor *t;
        ck_assert_int_eq(dsv4_model_tensor(m, s[i].name, &t), 0);
        ck_assert_msg(s[i].rows_covered == (t->ndim >= 1 ? t->shape[0] : 1), "%s: %lld rows in parts of %lld",
                      s[i].name, (long long)s[i].rows_covered, (long long)(t->ndim >= 1 ? t->shape[0] : 1));
        if (strcmp(s[i].name, "head.weight")) ck_assert_int_eq(s[i].pieces, 1);
    }
    ck_assert_int_eq(sz.arena_floats, sz.layer_floats > sz.head_floats ? sz.layer_floats : sz.head_floats);
    printf("%s emulate %d head rows %s: %d streamed tensors; dense slot %zu bytes (layer %d), expert slot %zu, "
           "arena %zu floats, expert %zu floats, head in %d ranges of %lld rows, <= %d pieces a layer\n", set, emu,
           head_rows ? head_rows : "(fit)", n, sz.dense_slot, sz.dense_at, sz.expert_slot, sz.arena_floats,
           sz.expert_floats, sz.head_parts, (long long)sz.head_rows, pieces_per_layer_max);
    if (head_rows) ck_assert_int_gt(sz.head_parts, 1);
    free(host);
    free(s);
    free(ex);
    dsv4_model_free(m);
    unsetenv("DSV4_REF_GPU_HEAD_ROWS");
}

START_TEST(parts_cover_every_tensor_once)
{
    for (int emu = 0; emu < 2; emu++) {
        check_all_parts("tiny-fp8", emu, NULL);
        check_all_parts("tiny-fp8", emu, "37"); /* 7 ranges of 37 rows, the last of 34 */
        check_all_parts("tiny", emu, NULL);
        check_all_parts("tiny", emu, "100");
    }
    /* the emulation rounds the bf16 / f32 tensors the optimized path holds in bf16, not FP8 / FP4 ones */
    dsv4_model *m = dsv4_test_open_golden("tiny-fp8");
    dsv4_ref_part part;
    int rounded = 0, fp = 0;
    ck_assert_int_eq(dsv4_ref_part_layer(m, dsv4_model_config(m), 2, 1, &part), 0);
    for (int i = 0; i < part.n; i++) {
        rounded += part.p[i].round;
        fp += part.p[i].fmt == DSV4_REF_WFMT_FP8;
        if (!strcmp(part.p[i].t->name, "layers.2.ffn.gate.weight")) ck_assert_int_eq(part.p[i].round, 1);
        if (!strcmp(part.p[i].t->name, "layers.2.attn_norm.weight")) ck_assert_int_eq(part.p[i].round, 0);
    }
    printf("tiny-fp8 layer 2: %d pieces, %d FP8, %d rounded by the emulation\n", part.n, fp, rounded);
    ck_assert_int_gt(fp, 3);
    ck_assert_int_gt(rounded, 0);
    dsv4_model_free(m);
}
END_TEST

/* The plan of a stand-in of n layers (a fresh sparse copy) with gpu_weights w; rc its return. */
static int standin_plan(const char *dir, dsv4_ref_gpu_weights w, dsv4_ref_plan *p, char *line, size_t size)
{
    dsv4_model *m = NULL;
    ck_assert_msg(dsv4_model_open(dir, &m) == 0, "%s", dsv4_last_error());
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    o.gpu_weights = w;
    int rc = dsv4_ref_gpu_plan(m, 20, &o, p);
    dsv4_ref_plan_describe(p, 20, 0, line, size);
    dsv4_model_free(m);
    return rc;
}

START_TEST(full_size_plan_is_bounded)
{
    unsetenv("DSV4_DEVICE_MEM_LIMIT");
    const int layers[2] = {3, 43};
    dsv4_ref_plan st[2], res[2];
    char line[1200];
    for (int i = 0; i < 2; i++) {
        char *dir = dsv4_test_mkdtemp("gpu-plan");
        dsv4_standin_opts so = {.n_layers = layers[i], .n_shards = layers[i] >= 43 ? 46 : 4, .mtp = 0};
        double bytes;
        ck_assert_int_eq(dsv4_flash_standin_write(dir, &so, &bytes), 0);
        setenv("DSV4_DEVICE_MEM_LIMIT", "64T", 1); /* a check that passes without asking a device */
        ck_assert_msg(standin_plan(dir, DSV4_REF_GPU_WEIGHTS_STREAM, &st[i], line, sizeof line) == 0, "%s",
                      dsv4_last_error());
        printf("%d layers (%.1f GB), streamed: %s\n", layers[i], bytes / 1e9, line);
        int rc = standin_plan(dir, DSV4_REF_GPU_WEIGHTS_RESIDENT, &res[i], line, sizeof line); /* filled anyway */
        ck_assert_msg(rc == 0 || rc == DSV4_ERR_NOMEM, "%s", dsv4_last_error()); /* NOMEM: a GPU was asked */
        printf("%d layers, resident: %s\n", layers[i], line);
        ck_assert_int_eq(st[i].streamed, 1);
        ck_assert_int_eq(res[i].streamed, 0);
        ck_assert(st[i].resident == res[i].total);
        ck_assert_msg(st[i].total < 8 * GIB, "streamed plan %.1f GiB", st[i].total / GIB);
        ck_assert(st[i].head_parts >= 2); /* the 1.06 GB bf16 head in ranges of at most a dense slot */
        ck_assert(st[i].dense_slot < 512.0 * 1024 * 1024 && st[i].expert_slot < 32.0 * 1024 * 1024);
        ck_assert(st[i].pinned == st[i].slots);
        /* auto: streamed under a limit below the resident total (+10%) */
        char lim[64];
        snprintf(lim, sizeof lim, "%.0f", res[i].total * 1.05);
        setenv("DSV4_DEVICE_MEM_LIMIT", lim, 1);
        dsv4_ref_plan a;
        ck_assert_int_eq(standin_plan(dir, DSV4_REF_GPU_WEIGHTS_AUTO, &a, line, sizeof line), 0);
        ck_assert_int_eq(a.streamed, 1);
        snprintf(lim, sizeof lim, "%.0f", res[i].total * 0.95);
        setenv("DSV4_DEVICE_MEM_LIMIT", lim, 1);
        ck_assert_int_eq(standin_plan(dir, DSV4_REF_GPU_WEIGHTS_RESIDENT, &a, line, sizeof line), DSV4_ERR_NOMEM);
        /* below the streamed plan: refused with its numbers */
        setenv("DSV4_DEVICE_MEM_LIMIT", "1G", 1);
        ck_assert_int_eq(standin_plan(dir, DSV4_REF_GPU_WEIGHTS_STREAM, &a, line, sizeof line), DSV4_ERR_NOMEM);
        ck_assert_msg(strstr(dsv4_last_error(), "weights streamed as on disk") &&
                          strstr(dsv4_last_error(), "DSV4_DEVICE_MEM_LIMIT (1.0 GiB)"),
                      "%s", dsv4_last_error());
        unsetenv("DSV4_DEVICE_MEM_LIMIT");
        dsv4_test_rmtree(dir);
    }
    ck_assert_msg(res[1].total > 900 * GIB, "resident 43 layers: %.1f GiB", res[1].total / GIB);
    /* the weights do not grow with the layers: the same head and expert, the largest layer of the same kind (43
     * layers: layer 4, CSA with learned routing, 1 KiB of router bias more than layer 2, CSA with hash routing) */
    ck_assert_msg(st[1].weights - st[0].weights < 1 << 20 && st[1].weights >= st[0].weights, "weights %.0f, %.0f",
                  st[0].weights, st[1].weights);
    ck_assert(st[1].dense_slot - st[0].dense_slot < 1 << 20 && st[0].arena == st[1].arena);
    printf("streamed total: 3 layers %.2f GiB, 43 layers %.2f GiB (weights %.2f GiB both); resident 43 layers "
           "%.1f GiB\n", st[0].total / GIB, st[1].total / GIB, st[1].weights / GIB, res[1].total / GIB);
}
END_TEST

/* auto on a small model: resident when it fits with 10% to spare, else streamed (golden/tiny-fp8: 4 MiB resident) */
START_TEST(auto_picks_resident_when_it_fits)
{
    dsv4_model *m = dsv4_test_open_golden("tiny-fp8");
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    dsv4_ref_plan p, s;
    char lim[64], line[1200];
    unsetenv("DSV4_DEVICE_MEM_LIMIT");
    ck_assert_msg(dsv4_ref_gpu_plan(m, 64, &o, &p) == 0, "%s", dsv4_last_error());
    ck_assert_int_eq(p.streamed, 0);
    ck_assert(p.total == p.resident);
    o.gpu_weights = DSV4_REF_GPU_WEIGHTS_STREAM;
    ck_assert_int_eq(dsv4_ref_gpu_plan(m, 64, &o, &s), 0);
    printf("tiny-fp8, 64 tokens: resident %s\n", dsv4_ref_plan_describe(&p, 64, 0, line, sizeof line));
    printf("tiny-fp8, 64 tokens: streamed %s\n", dsv4_ref_plan_describe(&s, 64, 0, line, sizeof line));
    ck_assert_int_eq(s.streamed, 1);
    ck_assert(s.total < p.total && s.resident == p.total && s.state == p.state && s.scratch == p.scratch);
    o.gpu_weights = DSV4_REF_GPU_WEIGHTS_AUTO;
    snprintf(lim, sizeof lim, "%.0f", p.total * 1.2);
    setenv("DSV4_DEVICE_MEM_LIMIT", lim, 1);
    ck_assert_int_eq(dsv4_ref_gpu_plan(m, 64, &o, &p), 0);
    ck_assert_int_eq(p.streamed, 0);
    snprintf(lim, sizeof lim, "%.0f", p.total * 1.05);
    setenv("DSV4_DEVICE_MEM_LIMIT", lim, 1);
    ck_assert_int_eq(dsv4_ref_gpu_plan(m, 64, &o, &p), 0);
    ck_assert_int_eq(p.streamed, 1);
    unsetenv("DSV4_DEVICE_MEM_LIMIT");
    dsv4_model_free(m);
}
END_TEST

START_TEST(gpu_weights_option)
{
    dsv4_ref_gpu_weights w;
    static const char *const names[] = {"auto", "resident", "stream"};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(dsv4_ref_gpu_weights_parse(names[i], &w), 0);
        ck_assert_int_eq(w, i);
        ck_assert_str_eq(dsv4_ref_gpu_weights_name(w), names[i]);
    }
    ck_assert_int_eq(dsv4_ref_gpu_weights_parse("streamed", &w), DSV4_ERR_USAGE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "want auto, resident or stream"));
    ck_assert_int_eq(dsv4_ref_gpu_weights_parse(NULL, &w), DSV4_ERR_USAGE);
    dsv4_ref_options o;
    dsv4_ref_options_default(&o);
    ck_assert_int_eq(o.gpu_weights, DSV4_REF_GPU_WEIGHTS_AUTO);
    o.gpu_weights = (dsv4_ref_gpu_weights)7;
    dsv4_model *m = dsv4_test_open_golden("tiny");
    ck_assert_int_eq(dsv4_ref_options_check(dsv4_model_config(m), &o, "ref-gpu"), DSV4_ERR_USAGE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "gpu_weights 7"));
    dsv4_ref *r = NULL; /* refused before any device is asked: the same in a build without CUDA */
    ck_assert_int_eq(dsv4_ref_gpu_init_opts(m, 8, &o, &r), DSV4_ERR_USAGE);
    ck_assert_ptr_nonnull(strstr(dsv4_last_error(), "gpu_weights 7"));
    ck_assert_ptr_null(r);
    dsv4_model_free(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ref_gpu_plan");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, gpu_weights_option);
    tcase_add_test(tc, parts_cover_every_tensor_once);
    tcase_add_test(tc, auto_picks_resident_when_it_fits);
    tcase_add_test(tc, full_size_plan_is_bounded);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
