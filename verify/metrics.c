/* metrics.c - the numbers of one compared row (docs/verify.md "Metrics"): dense errors, selections, logits.
 *
 * Quiet traps this file guards against:
 * - +-inf in BOTH files at the same element is agreement (indexer_scores pads invisible entries with -inf);
 *   NaN never equals anything, so a NaN in either file is always counted as non-finite.
 * - topk_idx and router_ids are sets (torch.topk order is unspecified); -1 is "no pick", not an entry.
 * - The k-th golden score is the lowest golden score among the golden's own valid picks, so prefill rows
 *   (future entries at -inf, their picks replaced by -1) need no special case.
 * - A tie-accepted pick must replace a golden pick that is itself at the k-th rank (within tol above s_k):
 *   checking only the candidate's pick would accept a selection that drops the golden's best entry.
 * - Softmax and KL are computed in double with the log-sum-exp shift; KL is clamped at 0 from below (a
 *   negative value is only rounding).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify_internal.h"

static const char *const dsv4_verify_metric_names[] = {
    "max_abs", "rel_l2",  "nmse",     "cosine", "nonfinite", "strict", "accepted",
    "recall",  "jaccard", "mismatch", "argmax", "top5",      "kl",     "structure", "scale",
};
_Static_assert(sizeof dsv4_verify_metric_names / sizeof dsv4_verify_metric_names[0] == DSV4_METRIC_COUNT,
               "one name per dsv4_verify_metric");

const char *dsv4_verify_metric_name(dsv4_verify_metric m)
{
    return (unsigned)m < DSV4_METRIC_COUNT ? dsv4_verify_metric_names[m] : "?";
}

int dsv4_verify_metric_from_name(const char *name)
{
    for (int m = 0; m < DSV4_METRIC_COUNT; m++)
        if (!strcmp(name, dsv4_verify_metric_names[m])) return m;
    return -1;
}

int dsv4_verify_metric_is_min(dsv4_verify_metric m)
{
    return m == DSV4_METRIC_COSINE || m == DSV4_METRIC_RECALL || m == DSV4_METRIC_JACCARD || m == DSV4_METRIC_TOP5;
}

static int metric_is_count(dsv4_verify_metric m)
{
    return m == DSV4_METRIC_NONFINITE || m == DSV4_METRIC_STRICT || m == DSV4_METRIC_ACCEPTED ||
           m == DSV4_METRIC_MISMATCH || m == DSV4_METRIC_ARGMAX || m == DSV4_METRIC_STRUCTURE;
}

int dsv4_verify_gate_fails(dsv4_verify_metric m, double value, double tol)
{
    if (isnan(value)) return 0;
    return dsv4_verify_metric_is_min(m) ? value < tol : value > tol;
}

double dsv4_verify_gate_ratio(dsv4_verify_metric m, double value, double tol)
{
    if (isnan(value)) return 0.0;
    if (dsv4_verify_metric_is_min(m)) {
        /* distance below 1 relative to the allowed distance (1 - tol); 1 - value > 1 - tol fails */
        double allowed = 1.0 - tol, got = 1.0 - value;
        if (allowed <= 0) return got > 0 ? INFINITY : 0.0;
        return got / allowed;
    }
    if (tol <= 0) return value > 0 ? INFINITY : 0.0;
    return value / tol;
}

void dsv4_verify_row_clear(dsv4_verify_row *row, int position, int entry)
{
    for (int m = 0; m < DSV4_METRIC_COUNT; m++) row->v[m] = NAN;
    row->position = position;
    row->entry = entry;
    row->max_abs_at = -1;
    row->nonfinite_at = -1;
    row->argmax_g = row->argmax_c = -1;
    row->failed = 0;
    row->after_tie = 0;
    row->after_tie_saved = 0;
    row->g_norm2 = 0;
}

void dsv4_verify_dense_f32(const float *g, const float *c, int64_t n, dsv4_verify_row *row)
{
    double d2 = 0, g2 = 0, c2 = 0, gc = 0, maxd = 0;
    int64_t maxat = -1, nonfinite = 0, nfat = -1;
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i], ci = c[i];
        if (isfinite(gi) && isfinite(ci)) {
            double d = (double)ci - (double)gi;
            d2 += d * d;
            g2 += (double)gi * gi;
            c2 += (double)ci * ci;
            gc += (double)gi * ci;
            if (fabs(d) > maxd || maxat < 0) {
                maxd = fabs(d);
                maxat = i;
            }
        } else if (!(isinf(gi) && gi == ci)) {
            if (nfat < 0) nfat = i;
            nonfinite++;
        }
    }
    row->v[DSV4_METRIC_MAX_ABS] = maxd;
    row->max_abs_at = maxat;
    row->v[DSV4_METRIC_NONFINITE] = (double)nonfinite;
    row->nonfinite_at = nfat;
    double rel;
    if (g2 > 0)
        rel = sqrt(d2 / g2);
    else
        rel = d2 > 0 ? INFINITY : 0.0;
    row->v[DSV4_METRIC_REL_L2] = rel;
    row->v[DSV4_METRIC_NMSE] = g2 > 0 ? d2 / g2 : (d2 > 0 ? INFINITY : 0.0);
    if (g2 > 0 && c2 > 0)
        row->v[DSV4_METRIC_COSINE] = gc / sqrt(g2 * c2);
    else
        row->v[DSV4_METRIC_COSINE] = (g2 == 0 && c2 == 0) ? 1.0 : 0.0;
    /* <c - g, g> / <g, g>, with <c, g> and <g, g> summed above */
    row->v[DSV4_METRIC_SCALE] = g2 > 0 ? (gc - g2) / g2 : 0.0;
    row->g_norm2 = g2;
}

void dsv4_verify_scores_f32(const float *g, const float *c, int64_t n, double scale, dsv4_verify_row *row)
{
    dsv4_verify_dense_f32(g, c, n, row);
    if (!(scale > 0)) return;
    int64_t pairs = 0;
    double d2 = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(g[i]) && isfinite(c[i])) {
            double d = (double)c[i] - (double)g[i];
            d2 += d * d;
            pairs++;
        }
    /* the row's norm, floored at the norm a row of this many entries has at the layer's typical score */
    double floor2 = (double)pairs * scale * scale, den2 = row->g_norm2 > floor2 ? row->g_norm2 : floor2;
    if (den2 > 0) {
        row->v[DSV4_METRIC_REL_L2] = sqrt(d2 / den2);
        row->v[DSV4_METRIC_NMSE] = d2 / den2;
    }
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Valid (>= 0) ids of row src [k], sorted, duplicates kept (a duplicate pick is a defect, counted). */
static int sorted_ids(const int32_t *src, int k, int32_t *dst)
{
    int n = 0;
    for (int i = 0; i < k; i++)
        if (src[i] >= 0) dst[n++] = src[i];
    qsort(dst, (size_t)n, sizeof *dst, cmp_i32);
    return n;
}

/* Intersection size of sorted multisets; marks in cand_in_g[j] whether cand element j matched, and in
 * g_in_cand[i] (may be NULL) whether golden element i did. */
static int intersect(const int32_t *gs, int ng, const int32_t *cs, int nc, unsigned char *cand_in_g,
                     unsigned char *g_in_cand)
{
    int i = 0, j = 0, common = 0;
    for (int t = 0; t < nc; t++) cand_in_g[t] = 0;
    for (int t = 0; g_in_cand && t < ng; t++) g_in_cand[t] = 0;
    while (i < ng && j < nc) {
        if (gs[i] < cs[j])
            i++;
        else if (gs[i] > cs[j])
            j++;
        else {
            cand_in_g[j] = 1;
            if (g_in_cand) g_in_cand[i] = 1;
            common++;
            i++;
            j++;
        }
    }
    return common;
}

int dsv4_verify_topk_threshold(const int32_t *g, int k, const float *gscores, int64_t n_scores, double tie_abs,
                               double tie_rel, double *kth, double *tol)
{
    int ng = 0;
    double lowest = INFINITY, scale = 0;
    for (int i = 0; i < k; i++) {
        if (g[i] < 0) continue;
        ng++;
        if (gscores && g[i] < n_scores && isfinite(gscores[g[i]]) && gscores[g[i]] < lowest) lowest = gscores[g[i]];
    }
    if (gscores)
        for (int64_t i = 0; i < n_scores; i++)
            if (isfinite(gscores[i]) && fabs(gscores[i]) > scale) scale = fabs(gscores[i]);
    *kth = lowest;
    *tol = tie_abs + tie_rel * scale;
    return ng;
}

void dsv4_verify_topk(const int32_t *g, const int32_t *c, int k, const float *gscores, int64_t n_scores, double tie_abs,
                      double tie_rel, dsv4_verify_row *row)
{
    int32_t gs_stack[1024], cs_stack[1024];
    unsigned char in_stack[1024], gin_stack[1024];
    int32_t *gs = gs_stack, *cs = cs_stack;
    unsigned char *in = in_stack, *gin = gin_stack;
    if (k > 1024) {
        gs = malloc((size_t)k * sizeof *gs);
        cs = malloc((size_t)k * sizeof *cs);
        in = malloc((size_t)k);
        gin = malloc((size_t)k);
        if (!gs || !cs || !in || !gin) {
            free(gs);
            free(cs);
            free(in);
            free(gin);
            row->v[DSV4_METRIC_STRUCTURE] = 1;
            return;
        }
    }
    int ng = sorted_ids(g, k, gs), nc = sorted_ids(c, k, cs);
    int common = intersect(gs, ng, cs, nc, in, gin);
    double kth, tol;
    dsv4_verify_topk_threshold(g, k, gscores, n_scores, tie_abs, tie_rel, &kth, &tol);
    int accepted = 0, outside = 0;
    for (int j = 0; j < nc; j++) {
        if (in[j]) continue;
        outside++;
        int32_t w = cs[j];
        int dup = j > 0 && cs[j - 1] == w; /* a repeated pick is never acceptable */
        if (!dup && gscores && w < n_scores && isfinite(gscores[w]) && isfinite(kth) && gscores[w] >= kth - tol)
            accepted++;
    }
    /* A tie-accepted pick stands in for a golden pick the candidate left out, and a tie exchanges entries AT the
     * k-th rank: the golden pick it replaces must itself score within the tolerance of the k-th (s <= s_k + tol).
     * A candidate that drops the golden's best entry for one tied with the k-th has not broken a tie. So no more
     * picks can be accepted than golden picks are missing from that band; extra or dropped picks (a selection of
     * the wrong size) are strict. */
    int droppable = 0;
    for (int i = 0; i < ng; i++) {
        int32_t w = gs[i];
        if (!gin[i] && gscores && w < n_scores && isfinite(gscores[w]) && isfinite(kth) && gscores[w] <= kth + tol)
            droppable++;
    }
    if (accepted > droppable) accepted = droppable;
    int strict = outside - accepted + (ng > nc ? ng - nc : 0);
    row->v[DSV4_METRIC_ACCEPTED] = accepted;
    row->v[DSV4_METRIC_STRICT] = strict;
    row->v[DSV4_METRIC_RECALL] = ng > 0 ? (double)common / ng : (nc == 0 ? 1.0 : 0.0);
    int uni = ng + nc - common;
    row->v[DSV4_METRIC_JACCARD] = uni > 0 ? (double)common / uni : 1.0;
    if (gs != gs_stack) {
        free(gs);
        free(cs);
        free(in);
        free(gin);
    }
}

void dsv4_verify_router_ids(const int32_t *g, const int32_t *c, int k, dsv4_verify_row *row)
{
    int32_t gs[256], cs[256];
    unsigned char in[256];
    if (k > 256) k = 256; /* num_experts_per_tok is 6 in Flash; a row this wide is not a router */
    int ng = sorted_ids(g, k, gs), nc = sorted_ids(c, k, cs);
    int common = intersect(gs, ng, cs, nc, in, NULL);
    /* one swapped expert counts 1; a router never picks an expert twice, so each repeat in a set counts 1 more
     * (without that {1, 1, 5} against {1, 2, 5} would look like one swap) */
    int repeats = 0;
    for (int i = 1; i < ng; i++) repeats += gs[i] == gs[i - 1];
    for (int i = 1; i < nc; i++) repeats += cs[i] == cs[i - 1];
    /* likewise a set that is short (an expert dropped: -1) is not a swap: {1, -1, 5} against {1, 2, 5} counts 2 */
    const int short_by = ng > nc ? ng - nc : nc - ng;
    row->v[DSV4_METRIC_MISMATCH] =
        ((ng - common) > (nc - common) ? (ng - common) : (nc - common)) + repeats + short_by;
    row->v[DSV4_METRIC_RECALL] = ng > 0 ? (double)common / ng : (nc == 0 ? 1.0 : 0.0);
    int uni = ng + nc - common;
    row->v[DSV4_METRIC_JACCARD] = uni > 0 ? (double)common / uni : 1.0;
}

void dsv4_verify_router_weights(const float *gw, const float *cw, const int32_t *gid, const int32_t *cid, int k,
                                dsv4_verify_row *row)
{
    float gp[256], cp[256];
    if (k > 256) k = 256;
    int n = 0;
    if (!gid || !cid) {
        dsv4_verify_dense_f32(gw, cw, k, row);
        return;
    }
    int n_valid = 0;
    for (int i = 0; i < k; i++) {
        if (gid[i] < 0) continue;
        n_valid++;
        for (int j = 0; j < k; j++)
            if (cid[j] == gid[i]) {
                gp[n] = gw[i];
                cp[n] = cw[j];
                n++;
                break;
            }
    }
    if (n > 0 && n < n_valid) {
        /* the sets differ (a swap the router_ids gate judges): each side normalised its weights over its own set,
         * so the common experts' weights differ by the swapped one's share; compare their shares of the common
         * experts instead, each side renormalised over them */
        double sg = 0, sc = 0;
        for (int i = 0; i < n; i++) sg += gp[i], sc += cp[i];
        for (int i = 0; i < n && sg != 0 && sc != 0; i++) {
            gp[i] = (float)(gp[i] / sg);
            cp[i] = (float)(cp[i] / sc);
        }
    }
    dsv4_verify_dense_f32(gp, cp, n, row);
    row->max_abs_at = -1; /* an index into the paired list means nothing to the reader */
}

/* Indices of the 5 largest finite values of x [n] (fewer if n < 5), descending. */
static int top5(const float *x, int64_t n, int64_t out[5])
{
    int m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) continue;
        if (m < 5 || x[i] > x[out[m - 1]]) {
            int j = m < 5 ? m++ : 4;
            while (j > 0 && x[out[j - 1]] < x[i]) {
                out[j] = out[j - 1];
                j--;
            }
            out[j] = i;
        }
    }
    return m;
}

void dsv4_verify_logits_argmax(const float *g, int64_t V, double tie_abs, double tie_rel, dsv4_verify_row *row)
{
    if (row->argmax_g < 0 || row->argmax_c < 0) return;
    double scale = 0;
    for (int64_t i = 0; i < V; i++)
        if (isfinite(g[i]) && fabs(g[i]) > scale) scale = fabs(g[i]);
    double margin = (double)g[row->argmax_g] - (double)g[row->argmax_c]; /* golden's view of the candidate's choice */
    row->v[DSV4_METRIC_ARGMAX] =
        (row->argmax_g == row->argmax_c || (isfinite(margin) && margin <= tie_abs + tie_rel * scale)) ? 0 : 1;
}

void dsv4_verify_logits(const float *g, const float *c, int64_t V, double tie_abs, double tie_rel, dsv4_verify_row *row)
{
    dsv4_verify_dense_f32(g, c, V, row);
    int64_t tg[5], tc[5];
    int ng = top5(g, V, tg), nc = top5(c, V, tc);
    if (ng == 0 || nc == 0) return; /* nothing finite: the non-finite gate reports it */
    row->argmax_g = (int)tg[0];
    row->argmax_c = (int)tc[0];
    dsv4_verify_logits_argmax(g, V, tie_abs, tie_rel, row);
    int common = 0;
    for (int i = 0; i < ng; i++)
        for (int j = 0; j < nc; j++)
            if (tg[i] == tc[j]) common++;
    /* out of the picks there are: a row with 3 finite logits whose 3 match is 1, not 0.6; a side that lost
     * finite logits is measured against the other's count */
    row->v[DSV4_METRIC_TOP5] = common / (double)(ng > nc ? ng : nc);
    if (row->v[DSV4_METRIC_NONFINITE] > 0) return; /* KL of a broken row is meaningless */
    double mg = g[tg[0]], mc = c[tc[0]], sg = 0, sc = 0;
    for (int64_t i = 0; i < V; i++) {
        if (!isfinite(g[i])) continue; /* both -inf: zero probability in both */
        sg += exp((double)g[i] - mg);
        sc += exp((double)c[i] - mc);
    }
    double lg = mg + log(sg), lc = mc + log(sc), kl = 0;
    for (int64_t i = 0; i < V; i++) {
        if (!isfinite(g[i])) continue;
        double lp = (double)g[i] - lg, lq = (double)c[i] - lc;
        kl += exp(lp) * (lp - lq);
    }
    row->v[DSV4_METRIC_KL] = kl > 0 ? kl : 0.0;
}

void dsv4_verify_int(const int32_t *g, const int32_t *c, int64_t n, dsv4_verify_row *row)
{
    int64_t bad = 0, at = -1;
    for (int64_t i = 0; i < n; i++)
        if (g[i] != c[i]) {
            if (at < 0) at = i;
            bad++;
        }
    row->v[DSV4_METRIC_MISMATCH] = (double)bad;
    row->max_abs_at = at;
}

/* ------------------------------------------------------------------------------------------------ names */
static const struct {
    const char *probe, *label;
} dsv4_verify_probe_table[] = {
    {"attn_hc_pre", "hc"},
    {"attn_hc_post", "hc"},
    {"attn_hc_comb", "hc"},
    {"attn_in", "attn_in"},
    {"kv", "kv"},
    {"compressed_kv", "cmp_kv"},
    {"indexer_kv", "idx_kv"},
    {"indexer_scores", "idx_sc"},
    {"topk_idx", "topk"},
    {"attn_out", "attn_out"},
    {"ffn_hc_pre", "hc"},
    {"ffn_hc_post", "hc"},
    {"ffn_hc_comb", "hc"},
    {"ffn_in", "ffn_in"},
    {"router_ids", "rt_ids"},
    {"router_weights", "rt_w"},
    {"ffn_out", "ffn_out"},
    {"out", "out"},
    {"hc_head", "hc_head"},
    {"norm", "norm"},
    {"logits", "logits"},
};

int dsv4_verify_probe_order(const char *probe)
{
    int n = (int)(sizeof dsv4_verify_probe_table / sizeof dsv4_verify_probe_table[0]);
    for (int i = 0; i < n; i++)
        if (!strcmp(probe, dsv4_verify_probe_table[i].probe)) return i;
    return n;
}

int dsv4_verify_probe_known(const char *probe)
{
    return dsv4_verify_probe_order(probe) < (int)(sizeof dsv4_verify_probe_table / sizeof dsv4_verify_probe_table[0]);
}

const char *dsv4_verify_probe_label(const char *probe)
{
    int i = dsv4_verify_probe_order(probe);
    int n = (int)(sizeof dsv4_verify_probe_table / sizeof dsv4_verify_probe_table[0]);
    return i < n ? dsv4_verify_probe_table[i].label : probe;
}

const char *dsv4_verify_fmt(dsv4_verify_metric m, double v, char *buf, size_t n)
{
    if (isnan(v))
        snprintf(buf, n, "-");
    else if (isinf(v))
        snprintf(buf, n, v > 0 ? "inf" : "-inf");
    else if (metric_is_count(m))
        snprintf(buf, n, "%.0f", v);
    else if (m == DSV4_METRIC_COSINE)
        snprintf(buf, n, "%.8f", v);
    else if (dsv4_verify_metric_is_min(m))
        snprintf(buf, n, "%.4f", v);
    else if (v == 0)
        snprintf(buf, n, "0");
    else
        snprintf(buf, n, "%.2e", v);
    return buf;
}

/* v != 0 as "1.6e-3" */
static void fmt_short_sci(double v, const char *prefix, char *buf, size_t n)
{
    int e = (int)floor(log10(fabs(v)));
    double mant = v / pow(10, e);
    if (fabs(mant) >= 9.95) {
        mant /= 10;
        e++;
    }
    snprintf(buf, n, "%s%.1fe%d", prefix, mant, e);
}

const char *dsv4_verify_fmt_short(dsv4_verify_metric m, double v, char *buf, size_t n)
{
    if (isnan(v))
        snprintf(buf, n, "-");
    else if (isinf(v))
        snprintf(buf, n, v > 0 ? "inf" : "-inf");
    else if (metric_is_count(m))
        snprintf(buf, n, "%.0f", v);
    else if (m == DSV4_METRIC_COSINE && v > 0.9999 && v < 1) /* "1.0000" would hide 1 - cos = 1.4e-7 */
        fmt_short_sci(1.0 - v, "1-", buf, n);
    else if (dsv4_verify_metric_is_min(m))
        snprintf(buf, n, "%.4f", v);
    else if (v == 0)
        snprintf(buf, n, "0");
    else
        fmt_short_sci(v, "", buf, n);
    return buf;
}

const char *dsv4_verify_fmt_coord(const dsv4_dataset_info *info, int64_t flat, char *buf, size_t n)
{
    if (flat < 0) {
        snprintf(buf, n, "[-]");
        return buf;
    }
    int64_t idx[4] = {0, 0, 0, 0};
    int nd = info->ndim - 1;
    if (nd < 1) nd = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t ext = info->ndim > 1 ? info->shape[d + 1] : 1;
        if (ext <= 0) ext = 1;
        idx[d] = d == 0 ? flat : flat % ext;
        flat = d == 0 ? flat : flat / ext;
    }
    size_t len = 0;
    len += (size_t)snprintf(buf + len, n - len, "[");
    for (int d = 0; d < nd && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, d ? ",%lld" : "%lld", (long long)idx[d]);
    if (len < n) snprintf(buf + len, n - len, "]");
    return buf;
}
