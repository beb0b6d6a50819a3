/* test_ref_golden.c - the CPU reference against the committed transformers goldens (golden/<set>/ holds the
 * model folder and its dumps), in-process and with its own small checks (the fp32 profile's numbers, so this
 * test stands whatever state the verifier is in):
 *   every float probe, per stored position: relative L2 <= 1e-4 (finite entries; -inf where the golden has it);
 *   topk_idx: equal sets, or each differing pick within a tie tolerance of the golden k-th score (a repeated
 *   pick fails); router_ids: equal sets (sorted rows equal); logits argmax equal at every position; per-entry
 *   probes row by row;
 *   greedy: the golden's tokens exactly.
 * Every set is committed (golden/README.md): a missing one fails its case, it is not skipped. On failure every
 * probe out of tolerance is listed in model order, so the first divergence is the first line.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_ref.h"
#include "dsv4_test.h"

#define REL_L2_TOL 1e-4
#define TIE_TOL 1e-5 /* relative to the row's largest |score| */

typedef struct golden_run {
    const char *set, *dump;
} golden_run;

static const golden_run golden_runs[] = {
    {"tiny", "forced.h5"},
    {"tiny", "greedy.h5"},
    {"tiny-fp8", "forced.h5"},
    {"topk512", "forced.h5"},
};

/* Run the reference like `dsv4 run --tokens-from`: prefill the prompt, decode forced or greedy, dump. */
static int run_reference(const char *model_dir, const char *golden, const char *out, int32_t **tokens_out, int *T_out)
{
    dsv4_dump *g = NULL;
    dsv4_model *m = NULL;
    dsv4_ref *r = NULL;
    dsv4_dump_writer *w = NULL;
    dsv4_probe_sink *sink = NULL;
    int rc = dsv4_dump_open(golden, &g);
    if (rc) return rc;
    int T, R;
    const int32_t *gt = dsv4_dump_tokens(g, &T), *pos = dsv4_dump_positions(g, &R);
    int P = dsv4_dump_prompt_len(g);
    const char *mode = dsv4_dump_attr(g, "mode");
    int greedy = mode && !strcmp(mode, "greedy");
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    memcpy(tok, gt, (size_t)T * sizeof *tok);
    float *logits = NULL;
    if ((rc = dsv4_model_open(model_dir, &m))) goto out;
    const dsv4_config *cfg = dsv4_model_config(m);
    logits = malloc((size_t)cfg->vocab_size * sizeof *logits);
    if ((rc = dsv4_ref_cpu_init(m, T, &r))) goto out;
    char digest[65];
    if ((rc = dsv4_model_weights_digest(m, digest))) goto out;
    dsv4_dump_meta meta = {.producer = dsv4_ref_producer(r), .config_json = dsv4_model_config_json(m),
                           .weights_digest = digest, .prompt_len = P, .n_decode = T - P,
                           .mode = greedy ? "greedy" : "forced"};
    if ((rc = dsv4_dump_writer_open(out, &meta, cfg, tok, T, pos, R, &w))) goto out;
    if ((rc = dsv4_probe_sink_init(w, cfg, pos, R, T, &sink))) goto out;
    if ((rc = dsv4_ref_prefill(r, tok, P, sink, logits))) goto out;
    for (int p = P; p < T; p++) {
        if (greedy) {
            int best = 0;
            for (int v = 1; v < cfg->vocab_size; v++)
                if (logits[v] > logits[best]) best = v;
            tok[p] = best;
        }
        if ((rc = dsv4_ref_decode(r, tok[p], sink, logits))) goto out;
    }
    if ((rc = dsv4_ref_dump_entries(r, sink))) goto out;
    if ((rc = dsv4_dump_writer_set_tokens(w, tok, T))) goto out;
    dsv4_probe_sink_free(sink);
    sink = NULL;
    rc = dsv4_dump_writer_commit(w);
    w = NULL;
out:
    dsv4_probe_sink_free(sink);
    dsv4_dump_writer_abort(w);
    dsv4_ref_free(r);
    dsv4_model_free(m);
    dsv4_dump_free(g);
    free(logits);
    if (rc) free(tok);
    else *tokens_out = tok, *T_out = T;
    return rc;
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int in_set(const int32_t *v, int n, int32_t x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

/* router_weights are in the order of router_ids, which is arbitrary (torch.topk sorted=False): reorder the
 * reference's weights into the golden's id order (ids not in the golden row keep their place and fail). */
static void align_router_weights(dsv4_dump *g, dsv4_dump *o, const char *name, size_t rows, size_t row, void *a,
                                 void *b)
{
    (void)a;
    char iname[96];
    snprintf(iname, sizeof iname, "%.*srouter_ids", (int)(strstr(name, "router_weights") - name), name);
    int32_t *ig = malloc(rows * row * 4), *io = malloc(rows * row * 4);
    float *tmp = malloc(row * 4);
    ck_assert_int_eq(dsv4_dump_read_rows(g, iname, 0, (int64_t)rows, ig), 0);
    ck_assert_int_eq(dsv4_dump_read_rows(o, iname, 0, (int64_t)rows, io), 0);
    for (size_t r = 0; r < rows; r++) {
        float *y = (float *)b + r * row;
        for (size_t i = 0; i < row; i++) {
            tmp[i] = y[i];
            for (size_t j = 0; j < row; j++)
                if (io[r * row + j] == ig[r * row + i]) tmp[i] = y[j];
        }
        memcpy(y, tmp, row * 4);
    }
    free(ig);
    free(io);
    free(tmp);
}

/* Compare one dataset; returns the number of failing rows and prints them (up to a few). */
static int compare_dataset(dsv4_dump *g, dsv4_dump *o, const char *name, const char *label)
{
    dsv4_dataset_info ig, io;
    if (!dsv4_dump_has(o, name)) {
        printf("%s: %s missing from the reference dump\n", label, name);
        return 1;
    }
    ck_assert_int_eq(dsv4_dump_info(g, name, &ig), 0);
    ck_assert_int_eq(dsv4_dump_info(o, name, &io), 0);
    size_t row = 1, rows = (size_t)ig.shape[0];
    for (int k = 1; k < ig.ndim; k++) row *= (size_t)ig.shape[k];
    int same = ig.ndim == io.ndim && ig.dtype == io.dtype;
    for (int k = 0; same && k < ig.ndim; k++) same = ig.shape[k] == io.shape[k];
    if (!same) {
        printf("%s: %s shape/dtype differs\n", label, name);
        return 1;
    }
    void *a = malloc(rows * row * 4 + 4), *b = malloc(rows * row * 4 + 4);
    ck_assert_int_eq(dsv4_dump_read_rows(g, name, 0, (int64_t)rows, a), 0);
    ck_assert_int_eq(dsv4_dump_read_rows(o, name, 0, (int64_t)rows, b), 0);
    int bad = 0, npos;
    const int32_t *pos = dsv4_dump_positions(g, &npos);
    int per_pos = (size_t)npos == rows && !strstr(name, "compressed_kv") && !strstr(name, "indexer_kv");
    int is_topk = strstr(name, "topk_idx") != NULL, is_logits = !strcmp(name, "final/logits");
    float *scores = NULL;
    if (is_topk) { /* the golden's scores of this layer judge ties */
        char sname[96];
        snprintf(sname, sizeof sname, "%.*sindexer_scores", (int)(strstr(name, "topk_idx") - name), name);
        dsv4_dataset_info is;
        ck_assert_int_eq(dsv4_dump_info(g, sname, &is), 0);
        scores = malloc((size_t)(is.shape[0] * is.shape[1]) * 4);
        ck_assert_int_eq(dsv4_dump_read_rows(g, sname, 0, is.shape[0], scores), 0);
        size_t nw = (size_t)is.shape[1];
        for (size_t r = 0; r < rows; r++) {
            const int32_t *x = (int32_t *)a + r * row, *y = (int32_t *)b + r * row;
            const float *s = scores + r * nw;
            float kth = INFINITY, mx = 0;
            for (size_t i = 0; i < row; i++)
                if (x[i] >= 0 && s[x[i]] < kth) kth = s[x[i]];
            for (size_t w = 0; w < nw; w++)
                if (isfinite(s[w])) mx = fmaxf(mx, fabsf(s[w]));
            for (size_t i = 0; i < row; i++) {
                if (y[i] >= 0 && in_set(y, (int)i, y[i])) { /* a repeated pick is never a set's */
                    if (bad++ < 4) printf("%s: %s position %d: pick %d twice\n", label, name, pos[r], y[i]);
                    break;
                }
                if (in_set(x, (int)row, y[i])) continue;
                int ok = y[i] >= 0 && (size_t)y[i] < nw && isfinite(s[y[i]]) && fabsf(s[y[i]] - kth) <= TIE_TOL * mx;
                if (!ok && bad++ < 4)
                    printf("%s: %s position %d: pick %d not in the golden set (score %g, k-th %g)\n", label, name,
                           pos[r], y[i], y[i] >= 0 && (size_t)y[i] < nw ? s[y[i]] : NAN, kth);
                if (!ok) break;
            }
        }
        free(scores);
    } else if (ig.dtype == DSV4_DTYPE_I32) {
        /* equal sets: the rows sorted are equal (so {5, 5, 7} is not {5, 1, 7}) */
        for (size_t r = 0; r < rows; r++) {
            int32_t *x = (int32_t *)a + r * row, *y = (int32_t *)b + r * row;
            qsort(x, row, sizeof *x, cmp_i32);
            qsort(y, row, sizeof *y, cmp_i32);
            if (memcmp(x, y, row * sizeof *x) && bad++ < 4) {
                printf("%s: %s position %d: ids {", label, name, pos[r]);
                for (size_t i = 0; i < row; i++) printf("%s%d", i ? ", " : "", y[i]);
                printf("}, golden {");
                for (size_t i = 0; i < row; i++) printf("%s%d", i ? ", " : "", x[i]);
                printf("}\n");
            }
        }
    } else {
        if (strstr(name, "router_weights")) align_router_weights(g, o, name, rows, row, a, b);
        for (size_t r = 0; r < rows; r++) {
            const float *x = (float *)a + r * row, *y = (float *)b + r * row;
            double num = 0, den = 0;
            int inf_bad = 0;
            for (size_t i = 0; i < row; i++) {
                if (isinf(x[i]) || isinf(y[i])) {
                    inf_bad |= x[i] != y[i];
                    continue;
                }
                num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
                den += (double)x[i] * x[i];
            }
            double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            int fail = inf_bad || !(rel <= REL_L2_TOL);
            if (is_logits) {
                size_t ax = 0, ay = 0;
                for (size_t i = 1; i < row; i++) {
                    if (x[i] > x[ax]) ax = i;
                    if (y[i] > y[ay]) ay = i;
                }
                if (ax != ay) {
                    fail = 1;
                    printf("%s: logits argmax differs at position %d: %zu vs %zu\n", label, pos[r], ax, ay);
                }
            }
            if (fail && bad++ < 4)
                printf("%s: %s %s %d: rel L2 %.3g%s\n", label, name, per_pos ? "position" : "entry",
                       per_pos ? pos[r] : (int)r, rel, inf_bad ? " (-inf pattern differs)" : "");
        }
    }
    free(a);
    free(b);
    return bad;
}

static void check_golden(const golden_run *gr)
{
    char model_dir[4096], golden[4200], label[128];
    snprintf(model_dir, sizeof model_dir, "%s", dsv4_test_source_path("golden"));
    size_t ml = strlen(model_dir);
    snprintf(model_dir + ml, sizeof model_dir - ml, "/%s", gr->set);
    snprintf(golden, sizeof golden, "%s/%s", model_dir, gr->dump);
    snprintf(label, sizeof label, "%s/%s", gr->set, gr->dump);
    ck_assert_msg(access(golden, R_OK) == 0, "%s: cannot read %s (the golden sets are committed)", label, golden);
    char *tmp = dsv4_test_mkdtemp("ref-golden");
    char out[4200];
    snprintf(out, sizeof out, "%s/out.h5", tmp);
    int32_t *tok = NULL;
    int T = 0;
    int rc = run_reference(model_dir, golden, out, &tok, &T);
    ck_assert_msg(rc == 0, "%s: reference run failed: %s", label, dsv4_last_error());
    dsv4_dump *g = NULL, *o = NULL;
    ck_assert_int_eq(dsv4_dump_open(golden, &g), 0);
    ck_assert_int_eq(dsv4_dump_open(out, &o), 0);
    int gT;
    const int32_t *gt = dsv4_dump_tokens(g, &gT);
    ck_assert_int_eq(gT, T);
    int tok_bad = 0;
    for (int p = 0; p < T; p++) tok_bad += gt[p] != tok[p];
    if (tok_bad) {
        printf("%s: %d tokens differ from the golden; first at", label, tok_bad);
        for (int p = 0; p < T; p++)
            if (gt[p] != tok[p]) {
                printf(" position %d (%d vs golden %d)", p, tok[p], gt[p]);
                break;
            }
        printf("\n");
    }
    int bad = 0, n = dsv4_dump_dataset_count(g);
    for (int i = 0; i < n; i++) bad += compare_dataset(g, o, dsv4_dump_dataset_name(g, i), label) > 0;
    printf("%s: %d datasets compared, %d out of tolerance, %d tokens differ\n", label, n, bad, tok_bad);
    dsv4_dump_free(g);
    dsv4_dump_free(o);
    free(tok);
    dsv4_test_rmtree(tmp);
    fflush(stdout);
    ck_assert_msg(bad == 0 && tok_bad == 0, "%s: %d datasets out of tolerance, %d tokens differ", label, bad, tok_bad);
}

START_TEST(test_golden)
{
    check_golden(&golden_runs[_i]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ref_golden");
    TCase *t = tcase_create("golden");
    tcase_set_timeout(t, 1500);
    tcase_add_loop_test(t, test_golden, 0, (int)(sizeof golden_runs / sizeof golden_runs[0]));
    suite_add_tcase(s, t);
    return dsv4_test_main(s);
}
