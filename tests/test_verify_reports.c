/* test_verify_reports.c - the --json report parses with jansson and holds the numbers of the result; the
 * --html report is one well-formed self-contained file (tags balanced, no scripts or external references,
 * xmllint --noout where installed) that headless Chromium renders (where installed; the screenshot is left
 * in the build tree as verify_report.png for a person to look at). A report that cannot be written (a missing
 * folder, a directory, one of the dumps, the other report's file) is refused with its reason before comparing. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_verify.h"
#include "dsv4_test.h"
#include "synth_dump.h"

static char *g_dir;
static char g_golden[4200], g_cand[4200], g_json[4200], g_html[4200];

static void write_pair(void)
{
    synth_spec s;
    synth_spec_init(&s);
    s.noise = 3e-4;
    s.noise_layer = 2;
    s.noise_position = 30;
    s.base_noise = 1e-6;
    s.low_layer = 3;
    s.low_position = 35;
    s.low_count = 1;
    s.tie_layer = 1;
    s.tie_position = 39;
    s.tie_count = 1;
    s.omit_dataset = "layers/2/kv";
    s.omit_role = 1;
    ck_assert_int_eq(synth_write(g_golden, &s, 0), 0);
    ck_assert_int_eq(synth_write(g_cand, &s, 1), 0);
}

START_TEST(json_holds_the_numbers)
{
    write_pair();
    char cmd[16000];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --json '%s' --quiet", dsv4_test_bin(), g_golden, g_cand, g_json);
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 1);
    json_error_t e;
    json_t *root = json_load_file(g_json, 0, &e);
    ck_assert_msg(root != NULL, "%s:%d: %s", g_json, e.line, e.text);
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(g_golden, g_cand, NULL, &r), 0);
    ck_assert_str_eq(json_string_value(json_object_get(root, "schema")), DSV4_VERIFY_JSON_SCHEMA);
    ck_assert_str_eq(json_string_value(json_object_get(root, "verdict")), "diverged");
    ck_assert_int_eq(json_integer_value(json_object_get(root, "exit_status")), 1);
    json_t *fd = json_object_get(root, "first_divergence");
    ck_assert_int_eq(json_integer_value(json_object_get(fd, "position")), r->first.position);
    ck_assert_int_eq(json_integer_value(json_object_get(fd, "layer")), r->first.layer);
    ck_assert_str_eq(json_string_value(json_object_get(fd, "dataset")), r->first.dataset);
    ck_assert_double_eq_tol(json_real_value(json_object_get(fd, "value")), r->first.value, 1e-9 * r->first.value);
    ck_assert_int_eq(json_array_size(json_object_get(root, "positions")), 40);
    ck_assert_int_eq(json_array_size(json_object_get(root, "only_in_golden")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(root, "checks")), r->n_checks);
    /* every probe, every row, every metric */
    json_t *probes = json_object_get(root, "probes");
    ck_assert_int_eq(json_array_size(probes), r->n_probes);
    int checked = 0;
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        json_t *jp = json_array_get(probes, (size_t)i);
        ck_assert_str_eq(json_string_value(json_object_get(jp, "dataset")), p->dataset);
        if (p->presence != DSV4_VERIFY_IN_BOTH) continue;
        json_t *rows = json_object_get(jp, "rows");
        ck_assert_int_eq(json_array_size(rows), p->n_rows);
        for (int k = 0; k < p->n_rows; k++) {
            json_t *jr = json_array_get(rows, (size_t)k);
            ck_assert_int_eq(json_integer_value(json_object_get(jr, "position")), p->rows[k].position);
            for (int m = 0; m < DSV4_METRIC_COUNT; m++) {
                double v = p->rows[k].v[m];
                json_t *jv = json_object_get(jr, dsv4_verify_metric_name(m));
                if (isnan(v)) {
                    ck_assert_ptr_null(jv);
                    continue;
                }
                ck_assert_msg(json_is_number(jv), "%s row %d %s", p->dataset, k, dsv4_verify_metric_name(m));
                ck_assert_double_eq_tol(json_number_value(jv), v, 1e-9 * fabs(v) + 1e-300);
                checked++;
            }
        }
    }
    ck_assert_int_gt(checked, 5000);
    /* the top-k summary of the low swap */
    json_t *topk = json_object_get(root, "topk");
    ck_assert_int_eq(json_array_size(topk), 2);
    long strict = 0, accepted = 0;
    for (size_t i = 0; i < 2; i++) {
        strict += json_integer_value(json_object_get(json_array_get(topk, i), "strict"));
        accepted += json_integer_value(json_object_get(json_array_get(topk, i), "accepted"));
    }
    ck_assert_int_eq(strict, 1);
    ck_assert_int_eq(accepted, 1);
    ck_assert(json_is_object(json_object_get(root, "logits")));
    json_decref(root);
    dsv4_verify_result_free(r);
}
END_TEST

/* Balanced tags of an XML-style document: returns NULL if fine, else a message (static). */
static const char *check_tags(const char *s)
{
    static char msg[256];
    char stack[256][32];
    int depth = 0;
    for (const char *p = s; (p = strchr(p, '<')) != NULL;) {
        if (!strncmp(p, "<!--", 4)) {
            const char *e = strstr(p, "-->");
            if (!e) return "unterminated comment";
            p = e + 3;
            continue;
        }
        const char *e = strchr(p, '>');
        if (!e) return "unterminated tag";
        if (p[1] == '!' || p[1] == '?') {
            p = e + 1;
            continue;
        }
        int closing = p[1] == '/', selfclose = e[-1] == '/';
        const char *n = p + 1 + closing;
        size_t len = strcspn(n, " \t\n/>");
        if (len == 0 || len >= 32) return "bad tag name";
        /* attribute values must be quoted: no '<' inside a tag, an even number of quotes */
        int quotes = 0;
        for (const char *q = p + 1; q < e; q++) {
            if (*q == '<') return "'<' inside a tag";
            quotes += *q == '"';
        }
        if (quotes % 2) return "unbalanced quotes in a tag";
        if (closing) {
            if (depth == 0 || strncmp(stack[depth - 1], n, len) || stack[depth - 1][len]) {
                snprintf(msg, sizeof msg, "</%.*s> closes <%s>", (int)len, n, depth ? stack[depth - 1] : "(nothing)");
                return msg;
            }
            depth--;
        } else if (!selfclose) {
            if (depth == 256) return "too deep";
            snprintf(stack[depth++], 32, "%.*s", (int)len, n);
        }
        p = e + 1;
    }
    if (depth) {
        snprintf(msg, sizeof msg, "<%s> never closed", stack[depth - 1]);
        return msg;
    }
    return NULL;
}

START_TEST(tag_checker_catches_errors)
{
    ck_assert_ptr_null(check_tags("<a><b x=\"1\"/><c>t</c></a>"));
    ck_assert_ptr_nonnull(check_tags("<a><b></a>"));
    ck_assert_ptr_nonnull(check_tags("<a><b x=\"1></b></a>"));
    ck_assert_ptr_nonnull(check_tags("<a>"));
}
END_TEST

/* A file may hold a probe of any name (an unknown one is compared as a dense probe): in the HTML its name is
 * escaped wherever it appears (the plot's tooltips, the per-layer table's column heads). */
START_TEST(html_escapes_probe_names)
{
    write_pair();
    ck_assert_int_eq(synth_copy_dataset(g_golden, "layers/0/attn_out", "layers/0/q&k<2>"), 0);
    ck_assert_int_eq(synth_copy_dataset(g_cand, "layers/0/attn_out", "layers/0/q&k<2>"), 0);
    char cmd[16000];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --html '%s' --quiet", dsv4_test_bin(), g_golden, g_cand, g_html);
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 1);
    char *html = dsv4_test_read_file(g_html, NULL);
    ck_assert_ptr_nonnull(strstr(html, "q&amp;k&lt;2&gt;"));
    ck_assert_ptr_null(strstr(html, "q&k<2>"));
    const char *bad = check_tags(html);
    ck_assert_msg(bad == NULL, "HTML: %s", bad);
    free(html);
}
END_TEST

/* 1 when s is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF). */
static int valid_utf8(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        int n = *u < 0x80                 ? 1
                : *u >= 0xc2 && *u <= 0xdf ? 2
                : *u >= 0xe0 && *u <= 0xef ? 3
                : *u >= 0xf0 && *u <= 0xf4 ? 4
                                           : 0;
        if (!n) return 0;
        unsigned cp = n == 1 ? *u : *u & (0x7fu >> n);
        for (int i = 1; i < n; i++) {
            if ((u[i] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (u[i] & 0x3fu);
        }
        if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        u += n;
    }
    return 1;
}

/* A file's text is any bytes (a producer attribute in Latin-1, a dataset name): the JSON keeps every key, with
 * U+FFFD for each byte that is not UTF-8 (jansson refused the string, and the object holding it was dropped), and
 * the HTML page, declared UTF-8, is valid UTF-8. */
START_TEST(reports_keep_text_that_is_not_utf8)
{
    write_pair();
    ck_assert_int_eq(synth_set_root_attr(g_cand, "producer", "caf\xe9 tool 1.0"), 0);
    ck_assert_int_eq(synth_copy_dataset(g_golden, "layers/0/attn_out", "layers/0/x\xff"), 0);
    ck_assert_int_eq(synth_copy_dataset(g_cand, "layers/0/attn_out", "layers/0/x\xff"), 0);
    char cmd[20000];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --json '%s' --html '%s' --quiet", dsv4_test_bin(), g_golden,
             g_cand, g_json, g_html);
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 1);
    json_error_t e;
    json_t *root = json_load_file(g_json, 0, &e);
    ck_assert_msg(root != NULL, "%s: %s", g_json, e.text);
    json_t *cand = json_object_get(root, "candidate");
    ck_assert_msg(json_is_object(cand), "no \"candidate\" object");
    ck_assert_str_eq(json_string_value(json_object_get(cand, "producer")), "caf\xef\xbf\xbd tool 1.0");
    int found = 0;
    json_t *probes = json_object_get(root, "probes"), *pr;
    size_t i;
    json_array_foreach(probes, i, pr)
    {
        found += !strcmp(json_string_value(json_object_get(pr, "dataset")), "layers/0/x\xef\xbf\xbd");
    }
    ck_assert_int_eq(found, 1);
    json_decref(root);
    char *html = dsv4_test_read_file(g_html, NULL);
    ck_assert_msg(valid_utf8(html), "the HTML is not valid UTF-8");
    ck_assert_ptr_nonnull(strstr(html, "caf\xef\xbf\xbd tool"));
    free(html);
}
END_TEST

START_TEST(html_is_well_formed_and_renders)
{
    write_pair();
    char cmd[16000];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --html '%s' --quiet", dsv4_test_bin(), g_golden, g_cand, g_html);
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 1);
    char *html = dsv4_test_read_file(g_html, NULL);
    const char *bad = check_tags(html);
    ck_assert_msg(bad == NULL, "HTML: %s", bad);
    ck_assert_ptr_nonnull(strstr(html, "<svg"));
    ck_assert_ptr_nonnull(strstr(html, "Per-layer error"));
    ck_assert_ptr_nonnull(strstr(html, "Top-k recall"));
    ck_assert_ptr_nonnull(strstr(html, "KL(golden || candidate) per position"));
    ck_assert_ptr_null(strstr(html, "<script"));
    ck_assert_ptr_null(strstr(html, "src="));
    ck_assert_ptr_null(strstr(html, "href="));
    /* the head: an HTML5 document declared UTF-8 (reports_keep_text_that_is_not_utf8 relies on the declaration) */
    ck_assert_msg(!strncmp(html, "<!DOCTYPE html>", 15), "the report does not start with <!DOCTYPE html>");
    const char *head_end = strstr(html, "</head>"), *charset = strstr(html, "<meta charset=\"utf-8\"");
    ck_assert_msg(head_end && charset && charset < head_end, "no <meta charset=\"utf-8\"> in the head");
    free(html);
    if (dsv4_test_run("command -v xmllint", NULL) == 0) {
        snprintf(cmd, sizeof cmd, "xmllint --noout '%s'", g_html);
        char *out = NULL;
        int st = dsv4_test_run(cmd, &out);
        ck_assert_msg(st == 0, "xmllint: %s", out);
        free(out);
    } else {
        printf("xmllint not installed: XML parse skipped (tag balance checked)\n");
    }
    if (dsv4_test_run("command -v chromium", NULL) != 0) {
        printf("chromium not installed: render skipped\n");
        return;
    }
    const char *bin = getenv("DSV4_BINARY_DIR");
    char png[4300], prof[4300];
    char ccmd[32000];
    snprintf(png, sizeof png, "%s/verify_report.png", bin ? bin : g_dir);
    snprintf(prof, sizeof prof, "%s/chromium-profile", g_dir);
    remove(png);
    snprintf(ccmd, sizeof ccmd,
             "timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-background-networking "
             "--disable-component-update --disable-sync --no-first-run --user-data-dir='%s' --screenshot='%s' "
             "--window-size=1200,2600 'file://%s'",
             prof, png, g_html);
    char *out = NULL;
    int st = dsv4_test_run(ccmd, &out);
    struct stat sb;
    int have = stat(png, &sb) == 0;
    ck_assert_msg(st == 0 && have && sb.st_size > 20000, "chromium (status %d): %s", st, out);
    printf("rendered %s (%lld bytes)\n", png, (long long)sb.st_size);
    free(out);
}
END_TEST

START_TEST(reports_of_a_failed_comparison)
{
    /* could-not-compare still writes both reports, saying why */
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(g_golden, &s, 0), 0);
    s.digest = "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
    ck_assert_int_eq(synth_write(g_cand, &s, 1), 0);
    char cmd[24000];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' --json '%s' --html '%s' --quiet", dsv4_test_bin(), g_golden,
             g_cand, g_json, g_html);
    ck_assert_int_eq(dsv4_test_run(cmd, NULL), 2);
    json_t *root = json_load_file(g_json, 0, NULL);
    ck_assert_ptr_nonnull(root);
    ck_assert_str_eq(json_string_value(json_object_get(root, "verdict")), "error");
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(root, "error")), "different weights"));
    json_decref(root);
    char *html = dsv4_test_read_file(g_html, NULL);
    ck_assert_ptr_null(check_tags(html));
    ck_assert_ptr_nonnull(strstr(html, "COULD NOT COMPARE"));
    free(html);
}
END_TEST

/* `dsv4 verify` with ARGS after the pair: exit status want, output holding needle and no verdict (refused before
 * the comparison). */
static void expect_refused(const char *args, const char *needle)
{
    char cmd[24000], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' '%s' %s 2>&1", dsv4_test_bin(), g_golden, g_cand, args);
    int st = dsv4_test_run(cmd, &out);
    printf("$ %s -> %d\n%s", cmd, st, out ? out : "");
    ck_assert_msg(st == 2, "%s: exit %d, want 2\n%s", cmd, st, out ? out : "");
    ck_assert_msg(out && strstr(out, needle), "%s: output lacks '%s'\n%s", cmd, needle, out ? out : "");
    ck_assert_msg(!strstr(out, "VERDICT"), "%s: compared before refusing the report\n%s", cmd, out);
    free(out);
}

/* A report that cannot be written is refused, with the reason, before the comparison: a missing folder and a
 * directory said only "cannot write the JSON report", after the whole comparison; a report named like one of the
 * dumps replaced that dump (the candidate became a JSON file), and --json X --html X kept only the HTML. */
/* The text report of r without colours (malloc'd), also printed for the test's log. */
START_TEST(text_table_cells_never_run_together)
{
    /* a candidate with one expert per token fewer: its router probes cannot be compared, and "struct!" (7
     * characters) filled the 7-wide rt_ids column, printed as "struct!struct!" */
    char g[4300], c[4300];
    snprintf(g, sizeof g, "%s/experts-g.h5", g_dir);
    snprintf(c, sizeof c, "%s/experts-c.h5", g_dir);
    synth_spec s;
    synth_spec_init(&s);
    ck_assert_int_eq(synth_write(g, &s, 0), 0);
    s.k_experts--;
    ck_assert_int_eq(synth_write(c, &s, 1), 0);
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.allow_different_weights = 1;
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(g, c, &o, &r), 0);
    char *buf = synth_text_report(r);
    ck_assert_ptr_nonnull(buf);
    ck_assert_msg(strstr(buf, "struct!"), "the pair should have structure failures");
    for (const char *p = buf; (p = strstr(p, "struct!")); p += 7)
        ck_assert_msg(p[7] == ' ' || p[7] == '\n', "a cell runs into the next one: '%.20s'", p);
    free(buf);
    dsv4_verify_result_free(r);
    remove(g);
    remove(c);
}
END_TEST

/* A column whose cells are of different gated metrics (one mHC probe gated by cosine, the others by rel_l2)
 * is headed "mixed" with a line saying why, not by the first cell's metric; a cosine cell near 1 shows 1 - cos
 * (the table's "1.0000" hid 1 - cos = 6e-7 against a gate of 1e-5). */
START_TEST(text_table_says_when_a_column_mixes_metrics)
{
    char g[4300], c[4300];
    snprintf(g, sizeof g, "%s/mixed-g.h5", g_dir);
    snprintf(c, sizeof c, "%s/mixed-c.h5", g_dir);
    synth_spec s;
    synth_spec_init(&s);
    s.noise = 1e-3;
    s.noise_layer = 2;
    s.noise_position = 30;
    ck_assert_int_eq(synth_write(g, &s, 0), 0);
    ck_assert_int_eq(synth_write(c, &s, 1), 0);
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "'%s' verify --no-color '%s' '%s' --tol attn_hc_pre=cosine:0.9999999 --tol attn_hc_pre=rel_l2:off "
             "--tol attn_out=cosine:0.99999 --tol attn_out=rel_l2:off",
             dsv4_test_bin(), g, c);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 1);
    printf("%s", out);
    const char *t = strstr(out, "per layer:");
    ck_assert_ptr_nonnull(t);
    const char *row2 = strstr(t, "\n1   "), *units = strchr(strchr(t, '\n') + 1, '\n') + 1;
    ck_assert_ptr_nonnull(row2);
    /* the units line: hc mixed, attn_out cosine */
    ck_assert_msg(!strncmp(units + 13, "mixed ", 6), "hc's unit: '%.20s'", units + 13);
    ck_assert_msg(strstr(units, "cosine") && strstr(units, "cosine") < row2, "%.200s", units);
    ck_assert_msg(strstr(out, "mixed: the column's cells are of different gated metrics"), "%s", out);
    /* layer 2's attn_out: within its cosine gate, shown as 1 - cos */
    const char *l2 = strstr(t, "\n2   ");
    ck_assert_ptr_nonnull(l2);
    char line[400];
    snprintf(line, sizeof line, "%.*s", (int)(strchr(l2 + 1, '\n') - l2), l2 + 1);
    ck_assert_msg(strstr(line, " 1-") && !strstr(line, "1.0000"), "layer 2: %s", line);
    free(out);
    remove(g);
    remove(c);
}
END_TEST

START_TEST(topk_table_names_a_layer_with_its_own_tie_tolerance)
{
    /* the header states the first top-k layer's tie tolerance; layer 3 with its own said nothing of it */
    write_pair();
    char prof[4300];
    snprintf(prof, sizeof prof, "%s/layer-tol.json", g_dir);
    FILE *f = fopen(prof, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\"profile\": \"layer-tol\", \"probes\": {\"default\": {\"rel_l2\": 1e-3},\n"
          " \"topk_idx\": {\"strict\": 0, \"tie_abs\": 1e-6, \"tie_rel\": 1e-4},\n"
          " \"layers/3/topk_idx\": {\"strict\": 0, \"tie_abs\": 1e-6, \"tie_rel\": 0.07},\n"
          " \"router_ids\": {\"mismatch\": 0}}}\n", f);
    fclose(f);
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.profile = prof;
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(g_golden, g_cand, &o, &r), 0);
    char *buf = synth_text_report(r);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(strstr(buf, "= 1e-06 + 0.0001*max|score|)"));
    /* the header states both sides of the tie rule (it gave only the candidate's) */
    ck_assert_ptr_nonnull(strstr(buf, "the golden pick it replaces scores <= k-th + tol"));
    const char *topk = strstr(buf, "\ntop-k per CSA layer");
    ck_assert_ptr_nonnull(topk);
    const char *l1 = strstr(topk, "\n1   "), *l3 = strstr(topk, "\n3   ");
    ck_assert_ptr_nonnull(l1);
    ck_assert_ptr_nonnull(l3);
    const char *e1 = strchr(l1 + 1, '\n'), *e3 = strchr(l3 + 1, '\n'), *own = strstr(l1, "this layer: tol");
    ck_assert_msg(own && own > e1 && own < e3 && strstr(own, "1e-06 + 0.07*max|score|"),
                  "layer 3's row should give its own tolerance, layer 1's not");
    free(buf);
    dsv4_verify_result_free(r);
    remove(prof);
}
END_TEST

START_TEST(reports_that_cannot_be_written_are_refused_first)
{
    write_pair();
    char args[24000], sub[4200];
    snprintf(args, sizeof args, "--json '%s/no/such/folder/r.json'", g_dir);
    expect_refused(args, "No such file or directory");
    snprintf(args, sizeof args, "--html '%s/no/such/folder/r.html'", g_dir);
    expect_refused(args, "No such file or directory");
    snprintf(sub, sizeof sub, "%s/adir", g_dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    snprintf(args, sizeof args, "--html '%s'", sub);
    expect_refused(args, "is a directory");
    snprintf(args, sizeof args, "--json '%s/'", sub);
    expect_refused(args, "is a directory");
    snprintf(args, sizeof args, "--json '%s' --quiet", g_cand);
    expect_refused(args, "is the candidate dump");
    snprintf(args, sizeof args, "--html '%s' --quiet", g_golden);
    expect_refused(args, "is the golden dump");
    snprintf(args, sizeof args, "--json '%s' --html '%s' --quiet", g_json, g_json);
    expect_refused(args, "--json and --html name the same file");
    for (int i = 0; i < 2; i++) { /* both dumps are still dumps */
        dsv4_dump *d = NULL;
        ck_assert_msg(dsv4_dump_open(i ? g_cand : g_golden, &d) == 0, "%s", dsv4_last_error());
        dsv4_dump_free(d);
    }
    rmdir(sub);
    /* the good case still writes both */
    snprintf(args, sizeof args, "'%s' verify '%s' '%s' --json '%s' --html '%s' --quiet", dsv4_test_bin(), g_golden,
             g_cand, g_json, g_html);
    ck_assert_int_eq(dsv4_test_run(args, NULL), 1);
    struct stat sb;
    ck_assert_int_eq(stat(g_json, &sb), 0);
    ck_assert_int_eq(stat(g_html, &sb), 0);
}
END_TEST

int main(void)
{
    g_dir = dsv4_test_mkdtemp("verify-reports");
    snprintf(g_golden, sizeof g_golden, "%s/golden.h5", g_dir);
    snprintf(g_cand, sizeof g_cand, "%s/cand.h5", g_dir);
    snprintf(g_json, sizeof g_json, "%s/report.json", g_dir);
    snprintf(g_html, sizeof g_html, "%s/report.html", g_dir);
    Suite *s = suite_create("verify_reports");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, json_holds_the_numbers);
    tcase_add_test(tc, tag_checker_catches_errors);
    tcase_add_test(tc, html_escapes_probe_names);
    tcase_add_test(tc, reports_keep_text_that_is_not_utf8);
    tcase_add_test(tc, html_is_well_formed_and_renders);
    tcase_add_test(tc, reports_of_a_failed_comparison);
    tcase_add_test(tc, text_table_cells_never_run_together);
    tcase_add_test(tc, text_table_says_when_a_column_mixes_metrics);
    tcase_add_test(tc, topk_table_names_a_layer_with_its_own_tie_tolerance);
    tcase_add_test(tc, reports_that_cannot_be_written_are_refused_first);
    suite_add_tcase(s, tc);
    int rc = dsv4_test_main(s);
    dsv4_test_rmtree(g_dir);
    return rc;
}
