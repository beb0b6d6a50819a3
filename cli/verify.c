/* verify.c - `dsv4 verify GOLDEN CANDIDATE [options]`: compare two dumps (verify/, docs/verify.md).
 * Exit status: 0 within tolerance, 1 diverged, 2 could not compare or bad usage. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "dsv4/dsv4.h"
#include "dsv4/dsv4_verify.h"
#include "progress.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4 verify GOLDEN.h5 CANDIDATE.h5 [options]\n\n"
               "Compares two dsv4-dump/1 files probe by probe, layer by layer, at the positions both store, and\n"
               "reports the first (position, layer, probe) in model order that breaks its tolerance. The format is\n"
               "docs/dump-format.md; what one file holds and the other does not (a partial candidate: another\n"
               "engine that cannot give every probe or position) is listed, not compared and, but for --require,\n"
               "not failed.\n\n"
               "options:\n"
               "  --profile fp32|bf16|FILE   tolerance profile (default fp32, or bf16 with --baseline; files in\n"
               "                             verify/profiles/)\n"
               "  --baseline BASELINE.h5     baseline mode, for a low-precision candidate: BASELINE is a\n"
               "                             precision-matched run of the same tokens and weights (normally\n"
               "                             dsv4 run --path ref-cpu|ref-gpu --emulate bf16 --follow GOLDEN.h5);\n"
               "                             each float probe of a layer must keep, over its positions, an RMS\n"
               "                             rel_l2 within 2x the baseline's (+1e-4) and a scale bias within 6\n"
               "                             standard errors of the baseline's (+1e-4); selections keep the\n"
               "                             profile's rules. The gates come from this run, not from numbers\n"
               "                             fitted to other models (docs/verify.md \"Baseline mode\")\n"
               "  --tol PROBE=METRIC:VALUE   override one gate, repeatable; PROBE is a probe name (attn_out), a\n"
               "                             dataset (layers/3/attn_out) or default; METRIC is a metric name,\n"
               "                             tie_abs or tie_rel; VALUE a number or 'off'. e.g. --tol out=rel_l2:1e-3\n"
               "  --json OUT                 write every number as JSON\n"
               "  --html OUT                 write a self-contained HTML report with plots\n"
               "  --probes GLOB[,GLOB...]    only datasets or probe names matching (e.g. 'attn_*,final/*')\n"
               "  --layers A-B               only layers A..B (A-, -B open; final/ counts as layer L)\n"
               "  --positions A-B            only positions A..B (per-entry rows by the position closing them)\n"
               "  --require GLOB[,GLOB...]   probes the candidate must hold (dataset or probe names, globs), e.g.\n"
               "                             'topk_idx,router_ids,final/logits': a golden dataset matching one that\n"
               "                             the candidate lacks fails (structure, exit 1) instead of being listed;\n"
               "                             a glob matching no golden dataset is an error (exit 2)\n"
               "  --allow-different-weights  compare dumps whose weights_digest differ\n"
               "  --tie-at POSITION:LAYER    a tie-accepted top-k difference established by another comparison\n"
               "                             (one that stores that position): later comparisons use the profile's\n"
               "                             after_tie gates, as they do after a tie seen in these files\n"
               "  --color / --no-color       ANSI colours (default: when stdout is a terminal)\n"
               "  --quiet                    no terminal report (exit status and files only); the progress line\n"
               "                             below still goes to stderr\n"
               "  -h, --help                 this text\n\n"
               "metrics: max_abs (with coordinate), rel_l2, nmse, cosine, nonfinite; topk_idx: recall, jaccard,\n"
               "accepted/strict (tie-aware with the golden indexer_scores); router_ids: mismatch; logits: argmax,\n"
               "top5, kl; another tool's int32 probe: mismatch (exact unless the profile's default sets it).\n"
               "NaN/Inf and shape differences always fail. After the first tie-accepted top-k pick\n"
               "(model order) every comparison uses the profile's after_tie gates; the report says where and how\n"
               "many checks passed only thanks to them. See docs/verify.md; the dump format: docs/dump-format.md;\n"
               "dumps from other engines (transformers, vLLM, SGLang, TensorRT-LLM, llama.cpp): the Python kit\n"
               "python/dsv4dump and docs/external-engines.md.\n\n"
               "progress: a comparison that runs longer than 3 s ($DSV4_PROGRESS_AFTER_S, 'inf' = never) shows\n"
               "\"read X of Y MiB (Z%%), R MiB/s, ETA S s\" on stderr (in place on a terminal, a line every ~5 s\n"
               "otherwise): the bytes the comparison reads of the total it will read, filters applied.\n\n"
               "--probes, --layers and --positions may each be given once (a second would replace the first);\n"
               "another option given twice takes its last value.\n\n"
               "exit status: 0 within tolerance, 1 diverged, 2 could not compare (unreadable file, wrong schema,\n"
               "different weights_digest, different prompts, no common positions or probes, a profile that leaves\n"
               "a probe gated by nothing, a --baseline of other tokens or weights or lacking probes or positions,\n"
               "a --require glob that matches no dataset of the golden) or bad usage.\n");
}

/* "A-B", "A", "A-", "-B" -> lo/hi (-1 open). */
static int parse_range(const char *s, int *lo, int *hi)
{
    char *end;
    *lo = *hi = -1;
    const char *dash = strchr(s, '-');
    if (!*s) return -1;
    if (dash != s) {
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT_MAX || (end != dash && *end)) return -1;
        *lo = (int)v;
    }
    if (!dash) {
        *hi = *lo;
        return 0;
    }
    if (dash[1]) {
        long v = strtol(dash + 1, &end, 10);
        if (end == dash + 1 || *end || v < 0 || v > INT_MAX) return -1;
        *hi = (int)v;
    }
    if (*lo >= 0 && *hi >= 0 && *hi < *lo) return -1;
    return 0;
}

/* Before the comparison: can the report OPT be written at path? Refuses a directory (the rename at the end would
 * fail, after the comparison), a non-file, one of the dumps (the report would replace it) and the other report's
 * file, and creates and removes the writers' temporary, so a missing or read-only folder is named with its reason
 * up front. */
static int report_check(const char *opt, const char *path, const char *const inputs[4], const char *other)
{
    static const char *const roles[4] = {"golden dump", "candidate dump", "--profile file", "--baseline dump"};
    struct stat st;
    size_t len = strlen(path);
    if (!len) return dsv4_error(DSV4_ERR_USAGE, "%s '': no file name", opt);
    const int exists = !stat(path, &st);
    if (path[len - 1] == '/' || (exists && S_ISDIR(st.st_mode)))
        return dsv4_error(DSV4_ERR_USAGE, "%s %s: is a directory; give the report's file name", opt, path);
    if (exists && !S_ISREG(st.st_mode))
        return dsv4_error(DSV4_ERR_USAGE, "%s %s: exists and is not a regular file; the report would replace it",
                          opt, path);
    for (int i = 0; i < 4; i++)
        if (inputs[i] && dsv4_cli_same_file(path, inputs[i]))
            return dsv4_error(DSV4_ERR_USAGE, "%s %s: is the %s; the report would replace it", opt, path, roles[i]);
    if (other && (!strcmp(other, path) || dsv4_cli_same_file(other, path)))
        return dsv4_error(DSV4_ERR_USAGE, "--json and --html name the same file %s; give each its own", path);
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return dsv4_error(DSV4_ERR_USAGE, "%s %s: the name is too long", opt, path);
    int slot = dsv4_tempfile_register(tmp), rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) rc = dsv4_error(DSV4_ERR_IO, "%s %s: cannot write there: %s", opt, path, strerror(errno));
    else {
        close(fd);
        unlink(tmp);
    }
    dsv4_tempfile_unregister(slot);
    return rc;
}

int dsv4_cmd_verify(int argc, char **argv)
{
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    const char *paths[2] = {NULL, NULL}, *json = NULL, *html = NULL;
    const char **tol = calloc((size_t)argc + 1, sizeof *tol);
    int npaths = 0, color = isatty(STDOUT_FILENO), quiet = 0, profile_given = 0;
    dsv4_cli_seen lists = {{0}, 0};
    if (!tol) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = dsv4_cli_value(argc, argv, i) != NULL;
#define NEED_VALUE()                                                                                                   \
    do {                                                                                                               \
        if (!has_val) {                                                                                                \
            fprintf(stderr, "dsv4 verify: %s needs a value\n", a);                                                     \
            free(tol);                                                                                                 \
            return 2;                                                                                                  \
        }                                                                                                              \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            free(tol);
            return 0;
        } else if (!strcmp(a, "--profile")) {
            NEED_VALUE();
            o.profile = argv[++i];
            profile_given = 1;
        } else if (!strcmp(a, "--baseline")) {
            NEED_VALUE();
            o.baseline = argv[++i];
        } else if (!strcmp(a, "--require")) {
            NEED_VALUE();
            o.require = argv[++i];
        } else if (!strcmp(a, "--tol")) {
            NEED_VALUE();
            tol[o.n_tol++] = argv[++i];
        } else if (!strcmp(a, "--json")) {
            NEED_VALUE();
            json = argv[++i];
        } else if (!strcmp(a, "--html")) {
            NEED_VALUE();
            html = argv[++i];
        } else if ((!strcmp(a, "--probes") || !strcmp(a, "--layers") || !strcmp(a, "--positions")) &&
                   dsv4_cli_list_again(&lists, a)) {
            fprintf(stderr, "dsv4 verify: %s\n", dsv4_last_error());
            free(tol);
            return 2;
        } else if (!strcmp(a, "--probes")) {
            NEED_VALUE();
            o.probes = argv[++i];
        } else if (!strcmp(a, "--layers") || !strcmp(a, "--positions")) {
            NEED_VALUE();
            int lo, hi;
            if (parse_range(argv[++i], &lo, &hi)) {
                fprintf(stderr, "dsv4 verify: %s '%s': expected A-B, A, A- or -B with 0 <= A <= B\n", a, argv[i]);
                free(tol);
                return 2;
            }
            if (a[2] == 'l') {
                o.layer_lo = lo;
                o.layer_hi = hi;
            } else {
                o.pos_lo = lo;
                o.pos_hi = hi;
            }
        } else if (!strcmp(a, "--tie-at")) {
            NEED_VALUE();
            char *end;
            const char *v = argv[++i];
            long pos = strtol(v, &end, 10), layer = -1;
            if (end != v && *end == ':' && end[1]) {
                const char *l = end + 1;
                layer = strtol(l, &end, 10);
                if (end == l || *end) layer = -1;
            }
            if (pos < 0 || pos > INT_MAX || layer < 0 || layer > INT_MAX) {
                fprintf(stderr, "dsv4 verify: --tie-at '%s': expected POSITION:LAYER (e.g. 2136:1)\n", v);
                free(tol);
                return 2;
            }
            o.tie_at_position = (int)pos;
            o.tie_at_layer = (int)layer;
        } else if (!strcmp(a, "--allow-different-weights")) {
            o.allow_different_weights = 1;
        } else if (!strcmp(a, "--color")) {
            color = 1;
        } else if (!strcmp(a, "--no-color")) {
            color = 0;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dsv4 verify: unknown option '%s' (see dsv4 verify --help)\n", a);
            free(tol);
            return 2;
        } else if (npaths < 2) {
            paths[npaths++] = a;
        } else {
            fprintf(stderr, "dsv4 verify: one golden and one candidate dump, got a third argument '%s'\n", a);
            free(tol);
            return 2;
        }
#undef NEED_VALUE
    }
    if (npaths != 2) {
        /* nothing given: the usage; one dump: say which is missing rather than bury it under the whole text */
        if (npaths == 0) usage(stderr);
        else
            fprintf(stderr, "dsv4 verify: '%s' is the golden dump; give the candidate dump too (see dsv4 verify "
                            "--help)\n", paths[0]);
        free(tol);
        return 2;
    }
    if (o.baseline && !profile_given) o.profile = "bf16"; /* a baseline means a low-precision candidate */
    const char *inputs[4] = {paths[0], paths[1], o.profile, o.baseline};
    if ((json && report_check("--json", json, inputs, html)) || (html && report_check("--html", html, inputs, NULL))) {
        fprintf(stderr, "dsv4 verify: %s\n", dsv4_last_error());
        free(tol);
        return 2;
    }
    o.tol = tol;
    dsv4_verify_result *r;
    cli_progress pr;
    cli_progress_init(&pr, "dsv4 verify");
    o.progress = cli_progress_verify;
    o.progress_ctx = &pr;
    int rc = dsv4_verify_run(paths[0], paths[1], &o, &r);
    cli_progress_end(&pr);
    free(tol);
    if (rc) {
        fprintf(stderr, "dsv4 verify: %s\n", dsv4_last_error());
        return 2;
    }
    if (!quiet)
        dsv4_verify_write_text(r, stdout, color);
    else if (r->status == DSV4_VERIFY_ERROR)
        fprintf(stderr, "dsv4 verify: %s\n", r->error);
    int status = r->status;
    if (json && dsv4_verify_write_json(r, json)) {
        fprintf(stderr, "dsv4 verify: %s\n", dsv4_last_error());
        status = 2;
    }
    if (html && dsv4_verify_write_html(r, html)) {
        fprintf(stderr, "dsv4 verify: %s\n", dsv4_last_error());
        status = 2;
    }
    dsv4_verify_result_free(r);
    return status;
}
