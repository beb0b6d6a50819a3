/* test_verify_progress.c - dsv4_verify_run reports how far it is (dsv4_verify_options.progress), and `dsv4 verify`
 * shows that as a progress line on stderr.
 *
 * What is checked: the callback sees one total from its first call on, done never goes down and ends at exactly
 * that total; the total is the bytes the comparison reads, counted here from the datasets' shapes independently of
 * the verifier (every pass: the top-k tie scan, a filtered run's unfiltered first pass, which is that scan alone,
 * the comparison itself, whose part is also the report's bytes_read); the result is the same with and without a callback; the CLI line
 * goes to stderr only and leaves the text and JSON reports as they were. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_verify.h"
#include "dsv4_test.h"
#include "synth_dump.h"

static char *g_dir;
static char g_golden[4200], g_cand[4200];

/* noise from layer 2, position 30 on; a tie at (30, layer 1) when tie (the scan of a top-k probe stops at its
 * first tie; the count jumps to the probe's plan there, so the totals below are checked on pairs without) */
static void write_pair(int tie)
{
    synth_spec s;
    synth_spec_init(&s);
    s.noise = tie ? 5e-2 : 1e-3; /* after a tie: beyond the after_tie gates too */
    s.noise_layer = 2;
    s.noise_position = 30;
    if (tie) {
        s.tie_layer = 1;
        s.tie_position = 30;
        s.tie_count = 1;
    }
    ck_assert_int_eq(synth_write(g_golden, &s, 0), 0);
    ck_assert_int_eq(synth_write(g_cand, &s, 1), 0);
}

typedef struct calls {
    int n, bad_order, bad_total;
    double first_total, last_done, total;
} calls;

static void on_progress(void *ctx, double done, double total)
{
    calls *c = ctx;
    if (c->n == 0) c->first_total = total;
    if (done < c->last_done || done > total) c->bad_order++;
    if (total != c->first_total) c->bad_total++;
    c->n++;
    c->last_done = done;
    c->total = total;
}

static int64_t row_bytes(const dsv4_dataset_info *info)
{
    int64_t n = 4;
    for (int d = 1; d < info->ndim; d++) n *= info->shape[d];
    return n;
}

/* Bytes one file holds in dataset name, rows [lo, hi] of it (hi -1: all). */
static int64_t rows_bytes(const dsv4_dump *d, const char *name, int64_t lo, int64_t hi)
{
    dsv4_dataset_info info;
    ck_assert_int_eq(dsv4_dump_info(d, name, &info), 0);
    if (hi < 0 || hi >= info.shape[0]) hi = info.shape[0] - 1;
    return (hi - lo + 1) * row_bytes(&info);
}

/* Bytes of the golden's indexer_scores a top-k comparison reads as pick scores (mode 0), or of both files'
 * topk_idx and those scores (mode 1: what comparing every top-k probe reads). All positions are stored and
 * compared in these pairs. */
static int64_t topk_bytes(const dsv4_dump *g, const dsv4_dump *c, int mode)
{
    int64_t sum = 0;
    for (int i = 0; i < dsv4_dump_dataset_count(g); i++) {
        const char *name = dsv4_dump_dataset_name(g, i);
        size_t n = strlen(name);
        if (n < 9 || strcmp(name + n - 9, "/topk_idx")) continue;
        char scores[256];
        snprintf(scores, sizeof scores, "%.*s/indexer_scores", (int)(n - 9), name);
        sum += rows_bytes(g, scores, 0, -1) + (mode ? rows_bytes(g, name, 0, -1) + rows_bytes(c, name, 0, -1) : 0);
    }
    return sum;
}

/* What comparing every probe reads: every dataset of both files, plus the auxiliary rows (topk_idx: golden
 * indexer_scores; router_weights: both files' router_ids). */
static int64_t all_bytes(const dsv4_dump *g, const dsv4_dump *c)
{
    int64_t sum = 0;
    for (int i = 0; i < dsv4_dump_dataset_count(g); i++) {
        const char *name = dsv4_dump_dataset_name(g, i);
        if (strncmp(name, "layers/", 7) && strncmp(name, "final/", 6)) continue;
        sum += rows_bytes(g, name, 0, -1) + rows_bytes(c, name, 0, -1);
        size_t n = strlen(name);
        if (n > 15 && !strcmp(name + n - 15, "/router_weights")) {
            char ids[256];
            snprintf(ids, sizeof ids, "%.*s/router_ids", (int)(n - 15), name);
            sum += rows_bytes(g, ids, 0, -1) + rows_bytes(c, ids, 0, -1);
        }
    }
    return sum + topk_bytes(g, c, 0);
}

static void open_pair(dsv4_dump **g, dsv4_dump **c)
{
    ck_assert_int_eq(dsv4_dump_open(g_golden, g), 0);
    ck_assert_int_eq(dsv4_dump_open(g_cand, c), 0);
}

START_TEST(callback_ends_at_the_bytes_compared)
{
    write_pair(0);
    dsv4_dump *g, *c;
    open_pair(&g, &c);
    const int64_t scan = topk_bytes(g, c, 1), compare = all_bytes(g, c);
    dsv4_dump_free(g);
    dsv4_dump_free(c);
    calls k = {0};
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.progress = on_progress;
    o.progress_ctx = &k;
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(g_golden, g_cand, &o, &r), 0);
    ck_assert_int_eq(r->status, DSV4_VERIFY_DIVERGED);
    ck_assert_msg(k.n >= 10 && !k.bad_order && !k.bad_total && k.last_done == k.total,
                  "%d calls, %d out of order, %d with another total, last %.0f of %.0f", k.n, k.bad_order, k.bad_total,
                  k.last_done, k.total);
    /* the comparison's part is what the report says it read; the tie scan reads the top-k rows once more */
    ck_assert_int_eq(r->bytes_read, compare);
    ck_assert_msg(k.total == (double)(scan + compare), "total %.0f, expected scan %lld + compared %lld", k.total,
                  (long long)scan, (long long)compare);
    dsv4_verify_result_free(r);
}
END_TEST

START_TEST(filtered_total_is_what_the_filters_leave)
{
    write_pair(0);
    dsv4_dump *g, *c;
    open_pair(&g, &c);
    /* attn_out at positions 10..20 of every layer; a filtered run first scans every top-k probe of the files for
     * the first tie (the scan alone: nothing judged, so no second read), then its own probes (no top-k among
     * them: no scan) */
    const int64_t scan = topk_bytes(g, c, 1);
    int64_t compare = 0;
    for (int i = 0; i < dsv4_dump_dataset_count(g); i++) {
        const char *name = dsv4_dump_dataset_name(g, i);
        size_t n = strlen(name);
        if (n >= 9 && !strcmp(name + n - 9, "/attn_out"))
            compare += rows_bytes(g, name, 10, 20) + rows_bytes(c, name, 10, 20);
    }
    dsv4_dump_free(g);
    dsv4_dump_free(c);
    ck_assert(compare > 0);
    calls k = {0};
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.probes = "attn_out";
    o.pos_lo = 10;
    o.pos_hi = 20;
    o.progress = on_progress;
    o.progress_ctx = &k;
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(g_golden, g_cand, &o, &r), 0);
    ck_assert_int_eq(r->n_positions, 11);
    ck_assert_msg(k.n >= 3 && !k.bad_order && !k.bad_total && k.last_done == k.total,
                  "%d calls, %d out of order, %d with another total, last %.0f of %.0f", k.n, k.bad_order, k.bad_total,
                  k.last_done, k.total);
    ck_assert_int_eq(r->bytes_read, compare);
    ck_assert_msg(k.total == (double)(scan + compare), "total %.0f, expected the top-k scan %lld + compared %lld",
                  k.total, (long long)scan, (long long)compare);
    dsv4_verify_result_free(r);
}
END_TEST

/* Everything of two results but the wall time. */
static void assert_same_result(const dsv4_verify_result *a, const dsv4_verify_result *b)
{
    ck_assert_int_eq(a->status, b->status);
    ck_assert_int_eq(a->n_checks, b->n_checks);
    ck_assert_int_eq(a->n_failed_checks, b->n_failed_checks);
    ck_assert_int_eq(a->n_after_tie_checks, b->n_after_tie_checks);
    ck_assert_int_eq(a->n_after_tie_saved, b->n_after_tie_saved);
    ck_assert_int_eq(a->bytes_read, b->bytes_read);
    ck_assert_int_eq(a->n_positions, b->n_positions);
    ck_assert(!memcmp(&a->first, &b->first, sizeof a->first));
    ck_assert(!memcmp(&a->first_tie, &b->first_tie, sizeof a->first_tie));
    ck_assert_int_eq(a->n_probes, b->n_probes);
    for (int i = 0; i < a->n_probes; i++) {
        const dsv4_verify_probe *p = &a->probes[i], *q = &b->probes[i];
        ck_assert_str_eq(p->dataset, q->dataset);
        ck_assert_str_eq(p->note, q->note);
        ck_assert_int_eq(p->n_rows, q->n_rows);
        ck_assert_int_eq(p->n_failed_rows, q->n_failed_rows);
        for (int j = 0; j < p->n_rows; j++) { /* field by field: the struct's padding is not set */
            const dsv4_verify_row *u = &p->rows[j], *w = &q->rows[j];
            ck_assert_msg(u->position == w->position && u->entry == w->entry && !memcmp(u->v, w->v, sizeof u->v) &&
                              u->max_abs_at == w->max_abs_at && u->nonfinite_at == w->nonfinite_at &&
                              u->argmax_g == w->argmax_g && u->argmax_c == w->argmax_c && u->failed == w->failed &&
                              u->after_tie == w->after_tie && u->after_tie_saved == w->after_tie_saved,
                          "%s row %d", p->dataset, j);
        }
        ck_assert(!memcmp(p->worst, q->worst, sizeof p->worst) && !memcmp(p->mean, q->mean, sizeof p->mean));
    }
}

START_TEST(same_result_with_and_without_a_callback)
{
    write_pair(1); /* a tie at (27, layer 1): after_tie gates and the filtered run's pre-scan in play */
    for (int filtered = 0; filtered < 2; filtered++) {
        dsv4_verify_options o;
        dsv4_verify_options_init(&o);
        if (filtered) {
            o.layer_lo = 2;
            o.pos_lo = 20;
        }
        dsv4_verify_result *plain = NULL, *with = NULL;
        ck_assert_int_eq(dsv4_verify_run(g_golden, g_cand, &o, &plain), 0);
        calls k = {0};
        o.progress = on_progress;
        o.progress_ctx = &k;
        ck_assert_int_eq(dsv4_verify_run(g_golden, g_cand, &o, &with), 0);
        ck_assert(k.n > 0 && k.last_done == k.total);
        ck_assert(plain->first_tie.found && plain->status == DSV4_VERIFY_DIVERGED);
        assert_same_result(plain, with);
        dsv4_verify_result_free(plain);
        dsv4_verify_result_free(with);
    }
}
END_TEST

/* The command's line: stderr only (DSV4_PROGRESS_AFTER_S=0 shows it at once), the reports as without it. The
 * wall time in the text report ("in 0.02 s") and the JSON ("seconds") is masked. */
START_TEST(cli_line_on_stderr_only)
{
    write_pair(0);
    char cmd[20000], *out = NULL, *plain = NULL, *err = NULL;
    const char *mask = "sed -E 's/ in [0-9.]+ s / in T s /; s/\"seconds\": *[0-9.e+-]+/\"seconds\": T/'";
    for (int quiet = 0; quiet < 2; quiet++) {
        const char *q = quiet ? " --quiet" : "";
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && DSV4_PROGRESS_AFTER_S=0 '%s' verify --no-color '%s' '%s'%s --json with.json 2>err.txt "
                 "| %s; %s with.json",
                 g_dir, dsv4_test_bin(), g_golden, g_cand, q, mask, mask);
        dsv4_test_run(cmd, &out);
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && '%s' verify --no-color '%s' '%s'%s --json plain.json 2>/dev/null | %s; %s plain.json",
                 g_dir, dsv4_test_bin(), g_golden, g_cand, q, mask, mask);
        dsv4_test_run(cmd, &plain);
        ck_assert_str_eq(out, plain);
        ck_assert_msg(quiet || strstr(out, "VERDICT: DIVERGED"), "%s", out);
        ck_assert_msg(!strstr(out, "dsv4 verify: read"), "the progress line reached stdout: %s", out);
        snprintf(cmd, sizeof cmd, "cat '%s/err.txt'", g_dir);
        ck_assert_int_eq(dsv4_test_run(cmd, &err), 0);
        /* not a terminal: whole lines, the last one at 100% */
        ck_assert_msg(strstr(err, "dsv4 verify: read ") && strstr(err, " MiB (100%)") && strstr(err, "ETA 0 s\n") &&
                          !strchr(err, '\r'),
                      "stderr%s: %s", q, err);
        free(out);
        free(plain);
        free(err);
    }
    /* DSV4_PROGRESS_AFTER_S=inf: never */
    snprintf(cmd, sizeof cmd, "DSV4_PROGRESS_AFTER_S=inf '%s' verify --quiet '%s' '%s' 2>&1", dsv4_test_bin(), g_golden,
             g_cand);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 1);
    ck_assert_str_eq(out, "");
    free(out);
}
END_TEST

int main(void)
{
    g_dir = dsv4_test_mkdtemp("verify-progress");
    snprintf(g_golden, sizeof g_golden, "%s/golden.h5", g_dir);
    snprintf(g_cand, sizeof g_cand, "%s/cand.h5", g_dir);
    Suite *s = suite_create("verify_progress");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, callback_ends_at_the_bytes_compared);
    tcase_add_test(tc, filtered_total_is_what_the_filters_leave);
    tcase_add_test(tc, same_result_with_and_without_a_callback);
    tcase_add_test(tc, cli_line_on_stderr_only);
    suite_add_tcase(s, tc);
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(g_dir);
    return rc;
}
