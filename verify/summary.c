/* summary.c - the aggregates the text and HTML reports share: per-layer cells, top-k and logits summaries.
 *
 * A table cell groups the probes that share a column label (the six mHC probes share "hc"); the probe shown
 * is the one whose primary gate (gates[0]) is worst RELATIVE to its tolerance, so one column can mix probes
 * with different tolerances without hiding the failing one.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "verify_internal.h"

int dsv4_verify_columns(const dsv4_verify_result *r, const char **labels, int max)
{
    int n = 0;
    /* probes are in model order per layer; merge the labels of all layers keeping probe order */
    for (int order = 0; order <= 64 && n < max; order++)
        for (int i = 0; i < r->n_probes && n < max; i++) {
            const dsv4_verify_probe *p = &r->probes[i];
            if (p->layer < 0 || p->presence != DSV4_VERIFY_IN_BOTH) continue;
            int o = p->order > 64 ? 64 : p->order;
            if (o != order) continue;
            const char *lab = dsv4_verify_probe_label(p->probe);
            int seen = 0;
            for (int j = 0; j < n; j++) seen |= !strcmp(labels[j], lab);
            if (!seen) labels[n++] = lab;
        }
    return n;
}

void dsv4_verify_cell_at(const dsv4_verify_result *r, int layer, const char *label, dsv4_verify_cell *cell)
{
    memset(cell, 0, sizeof *cell);
    cell->probe = -1;
    cell->value = NAN;
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (p->layer != layer || p->presence != DSV4_VERIFY_IN_BOTH) continue;
        if (strcmp(dsv4_verify_probe_label(p->probe), label)) continue;
        dsv4_verify_metric m = p->n_gates ? p->gates[0].metric : DSV4_METRIC_REL_L2;
        double tol = p->n_gates ? p->gates[0].tol : NAN;
        double v = p->worst[m];
        double ratio = p->n_gates ? dsv4_verify_gate_ratio(m, v, tol) : 0;
        const dsv4_verify_base_stat *b = &p->base;
        if (r->baseline && b->n_rows) { /* the RMS ratio, against its gate's ratio (the floor aside) */
            m = DSV4_METRIC_REL_L2;
            /* a ratio of two fp32-level errors (both under the floor) means nothing: NAN, shown "x-" */
            v = b->cand_rms <= DSV4_VERIFY_BASE_RMS_FLOOR && b->base_rms <= DSV4_VERIFY_BASE_RMS_FLOOR
                    ? NAN
                    : b->base_rms > 0 ? b->cand_rms / b->base_rms : INFINITY;
            tol = DSV4_VERIFY_BASE_RMS_FACTOR;
            ratio = b->cand_rms / b->rms_tol;
            cell->failed |= b->failed != 0;
        }
        cell->after_tie_saved |= p->n_after_tie_saved > 0;
        if (p->n_failed_rows) {
            cell->failed = 1;
            for (int k = 0; k < p->n_rows; k++) {
                cell->nonfinite |= (p->rows[k].failed >> DSV4_METRIC_NONFINITE) & 1u;
                cell->structure |= (p->rows[k].failed >> DSV4_METRIC_STRUCTURE) & 1u;
            }
        }
        if (cell->probe < 0 || ratio > cell->ratio) {
            cell->probe = i;
            cell->base = r->baseline && b->n_rows;
            cell->metric = m;
            cell->value = v;
            cell->tol = tol;
            cell->ratio = ratio;
        }
    }
}

void dsv4_verify_topk_summarise(const dsv4_verify_result *r, int probe, dsv4_verify_topk_summary *s)
{
    const dsv4_verify_probe *p = &r->probes[probe];
    memset(s, 0, sizeof *s);
    s->probe = probe;
    s->layer = p->layer;
    s->recall_min = s->jaccard_min = NAN;
    double rs = 0, js = 0;
    int n = 0;
    for (int i = 0; i < p->n_rows; i++) {
        const dsv4_verify_row *row = &p->rows[i];
        if (isnan(row->v[DSV4_METRIC_RECALL])) continue;
        n++;
        double rc = row->v[DSV4_METRIC_RECALL], jc = row->v[DSV4_METRIC_JACCARD];
        rs += rc;
        js += jc;
        if (isnan(s->recall_min) || rc < s->recall_min) s->recall_min = rc;
        if (isnan(s->jaccard_min) || jc < s->jaccard_min) s->jaccard_min = jc;
        s->accepted += (long)row->v[DSV4_METRIC_ACCEPTED];
        s->strict += (long)row->v[DSV4_METRIC_STRICT];
        if (jc < 1) s->rows_differ++;
    }
    s->n_rows = n;
    s->recall_mean = n ? rs / n : NAN;
    s->jaccard_mean = n ? js / n : NAN;
}

void dsv4_verify_logits_summarise(const dsv4_verify_result *r, dsv4_verify_logits_summary *s)
{
    memset(s, 0, sizeof *s);
    s->probe = -1;
    s->top5_min = s->kl_max = s->rel_l2_max = NAN;
    s->kl_max_position = s->rel_l2_max_position = -1;
    for (int i = 0; i < r->n_probes; i++)
        if (r->probes[i].kind == DSV4_VERIFY_KIND_LOGITS && r->probes[i].presence == DSV4_VERIFY_IN_BOTH) s->probe = i;
    if (s->probe < 0) return;
    const dsv4_verify_probe *p = &r->probes[s->probe];
    double t5 = 0, kl = 0;
    int nt = 0, nk = 0;
    for (int i = 0; i < p->n_rows; i++) {
        const dsv4_verify_row *row = &p->rows[i];
        if (isnan(row->v[DSV4_METRIC_ARGMAX])) continue;
        s->n_rows++;
        if (row->argmax_g == row->argmax_c)
            s->argmax_equal++;
        else if (row->v[DSV4_METRIC_ARGMAX] == 0)
            s->argmax_tie++;
        else
            s->argmax_strict++;
        double v = row->v[DSV4_METRIC_TOP5];
        t5 += v;
        nt++;
        if (isnan(s->top5_min) || v < s->top5_min) s->top5_min = v;
        v = row->v[DSV4_METRIC_KL];
        if (!isnan(v)) {
            kl += v;
            nk++;
            if (isnan(s->kl_max) || v > s->kl_max) {
                s->kl_max = v;
                s->kl_max_position = row->position;
            }
        }
        v = row->v[DSV4_METRIC_REL_L2];
        if (!isnan(v) && (isnan(s->rel_l2_max) || v > s->rel_l2_max)) {
            s->rel_l2_max = v;
            s->rel_l2_max_position = row->position;
        }
    }
    s->top5_mean = nt ? t5 / nt : NAN;
    s->kl_mean = nk ? kl / nk : NAN;
}

const char *dsv4_verify_layer_type(const dsv4_verify_result *r, int layer, char *buf, size_t n)
{
    if (layer < 0 || layer >= r->n_layers) {
        snprintf(buf, n, "final");
        return buf;
    }
    const char *a = r->layer_attention[layer], *m = r->layer_mlp[layer];
    snprintf(buf, n, "%s/%s", !strcmp(a, "sliding") ? "swa" : a, !strcmp(m, "hash_moe") ? "hash" : m);
    return buf;
}

const char *dsv4_verify_where(const dsv4_verify_result *r, const dsv4_verify_divergence *d, char *buf, size_t n)
{
    char t[32];
    if (d->probe_index < 0) {
        snprintf(buf, n, "position %d, tokens", d->position);
        return buf;
    }
    const dsv4_verify_probe *p = &r->probes[d->probe_index];
    char pos[64];
    if (d->entry >= 0) {
        if (d->position >= 0)
            snprintf(pos, sizeof pos, "position %d (entry %d closes there)", d->position, d->entry);
        else
            snprintf(pos, sizeof pos, "entry %d", d->entry);
    } else {
        snprintf(pos, sizeof pos, "position %d", d->position);
    }
    if (p->layer >= 0)
        snprintf(buf, n, "%s, layer %d (%s), %s", pos, p->layer, dsv4_verify_layer_type(r, p->layer, t, sizeof t),
                 p->probe);
    else
        snprintf(buf, n, "%s, %s", pos, p->dataset);
    return buf;
}

int dsv4_verify_failing_probes(const dsv4_verify_result *r)
{
    int n = 0;
    for (int i = 0; i < r->n_probes; i++) n += r->probes[i].n_failed_rows > 0 || r->probes[i].base.failed;
    return n;
}

const char *dsv4_verify_base_sentence(const dsv4_verify_result *r, char *buf, size_t n)
{
    buf[0] = 0;
    if (!r->baseline || r->status == DSV4_VERIFY_ERROR) return buf;
    int judged = 0, wr = -1, wz = -1;
    double ratio = 0, z = 0;
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_base_stat *b = &r->probes[i].base;
        if (!b->n_rows) continue;
        judged++;
        const double q = b->base_rms > 0 ? b->cand_rms / b->base_rms : 0;
        if (wr < 0 || q > ratio) ratio = q, wr = i;
        if (!isnan(b->scale_se) && b->scale_se > 0) {
            const double zz = fabs(b->cand_scale - b->base_scale) / b->scale_se;
            if (wz < 0 || zz > z) z = zz, wz = i;
        }
    }
    int len = snprintf(buf, n,
                       "baseline mode: %d float probes judged against the baseline's error on the same rows (RMS "
                       "rel_l2 within x%g + %g; scale bias within %g standard errors + %g where >= %d rows); "
                       "selections by the %s profile's rules.",
                       judged, DSV4_VERIFY_BASE_RMS_FACTOR, DSV4_VERIFY_BASE_RMS_FLOOR, DSV4_VERIFY_BASE_SCALE_Z,
                       DSV4_VERIFY_BASE_SCALE_FLOOR, DSV4_VERIFY_BASE_SCALE_MIN_ROWS, r->profile_name);
    if (wr >= 0 && len > 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " Largest RMS ratio x%.2f (%.120s)", ratio, r->probes[wr].dataset);
    if (wz >= 0 && len > 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, ", largest scale difference %.1f se (%.120s)", z,
                        r->probes[wz].dataset);
    if (wr >= 0 && len > 0 && (size_t)len < n) snprintf(buf + len, n - (size_t)len, ".");
    return buf;
}

const char *dsv4_verify_profile_note(const dsv4_verify_result *r)
{
    if (r->baseline || strcmp(r->profile_name, "bf16")) return "";
    return "the bf16 profile's tolerances are fixed numbers, calibrated on the shipped golden sets (2x the bf16 "
           "emulation's worst there); on another model a correct bf16 path may exceed them: judge it with --baseline "
           "(docs/verify.md \"Baseline mode\")";
}

const char *dsv4_verify_tie_where(const dsv4_verify_result *r, char *buf, size_t n)
{
    const dsv4_verify_tie *t = &r->first_tie;
    char ty[32];
    snprintf(buf, n, "position %d, layer %d (%s), topk_idx", t->position, t->layer,
             dsv4_verify_layer_type(r, t->layer, ty, sizeof ty));
    return buf;
}

const char *dsv4_verify_tie_sentence(const dsv4_verify_result *r, char *buf, size_t n)
{
    const dsv4_verify_tie *t = &r->first_tie;
    char where[160];
    if (!t->found) {
        snprintf(buf, n, "%s", "");
        return buf;
    }
    dsv4_verify_tie_where(r, where, sizeof where);
    int len;
    if (t->given)
        len = snprintf(buf, n,
                       "first tie-accepted top-k difference: %s, given by --tie-at (established by another "
                       "comparison; these files do not show it). ",
                       where);
    else
        len = snprintf(buf, n,
                       "first tie-accepted top-k difference: %s: %d pick%s outside the golden set, within the tie "
                       "tolerance of the k-th golden score. ",
                       where, t->accepted, t->accepted == 1 ? "" : "s");
    if (len < 0 || (size_t)len >= n) return buf;
    if (!r->profile_after_tie)
        snprintf(buf + len, n - (size_t)len,
                 "The profile has no after_tie section: later comparisons used the normal gates.");
    else
        snprintf(buf + len, n - (size_t)len,
                 "Every later comparison (model order) used the profile's after_tie gates: %ld checks, %ld of them "
                 "passed only thanks to those gates.",
                 r->n_after_tie_checks, r->n_after_tie_saved);
    return buf;
}

int dsv4_verify_utf8_len(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    int n;
    unsigned cp;
    if (u[0] < 0x80) return 1;
    if (u[0] >= 0xc2 && u[0] <= 0xdf) n = 2, cp = u[0] & 0x1fu;
    else if (u[0] >= 0xe0 && u[0] <= 0xef) n = 3, cp = u[0] & 0x0fu;
    else if (u[0] >= 0xf0 && u[0] <= 0xf4) n = 4, cp = u[0] & 0x07u;
    else return 0;
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xc0) != 0x80) return 0; /* also stops at the terminating 0 */
        cp = cp << 6 | (u[i] & 0x3fu);
    }
    /* overlong forms, UTF-16 surrogates and code points past U+10FFFF are not valid */
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* Appends "a-b" / "a" ranges of the ascending ints v[n] to buf at *len, ", "-separated; stops with ", ..." when the
 * buffer would overflow. */
static void append_ranges(char *buf, size_t n, size_t *len, const int *v, int count)
{
    for (int i = 0; i < count && *len + 1 < n;) {
        int j = i;
        while (j + 1 < count && v[j + 1] == v[j] + 1) j++;
        char item[48];
        if (i == j) snprintf(item, sizeof item, "%s%d", i ? ", " : "", v[i]);
        else snprintf(item, sizeof item, "%s%d-%d", i ? ", " : "", v[i], v[j]);
        if (*len + strlen(item) + 6 >= n) {
            *len += (size_t)snprintf(buf + *len, n - *len, ", ...");
            return;
        }
        *len += (size_t)snprintf(buf + *len, n - *len, "%s", item);
        i = j + 1;
    }
}

const char *dsv4_verify_lacks_datasets(const dsv4_verify_result *r, dsv4_verify_presence which, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    int layers[DSV4_MAX_LAYERS];
    /* one group per probe name, in the order the names first appear (layer-major model order), final/ last */
    for (int i = 0; i < r->n_probes && len + 1 < n; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (p->presence != which || p->layer < 0) continue;
        int first = 1;
        for (int k = 0; k < i && first; k++)
            first = !(r->probes[k].presence == which && r->probes[k].layer >= 0 && !strcmp(r->probes[k].probe, p->probe));
        if (!first) continue;
        int count = 0, required = 0;
        for (int k = i; k < r->n_probes; k++) {
            const dsv4_verify_probe *q = &r->probes[k];
            if (q->presence != which || q->layer < 0 || strcmp(q->probe, p->probe)) continue;
            if (count < (int)(sizeof layers / sizeof layers[0])) layers[count++] = q->layer;
            required |= q->required;
        }
        len += (size_t)snprintf(buf + len, n - len, "%s%s (layer%s ", len ? ", " : "", p->probe, count > 1 ? "s" : "");
        if (len + 1 < n) append_ranges(buf, n, &len, layers, count);
        if (len + 1 < n) len += (size_t)snprintf(buf + len, n - len, "%s)", required ? "; REQUIRED" : "");
    }
    for (int i = 0; i < r->n_probes && len + 1 < n; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (p->presence != which || p->layer >= 0) continue;
        len += (size_t)snprintf(buf + len, n - len, "%s%s%s", len ? ", " : "", p->dataset,
                                p->required ? " (REQUIRED)" : "");
    }
    return buf;
}

const char *dsv4_verify_lacks_positions(const dsv4_verify_result *r, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    append_ranges(buf, n, &len, r->positions_only_golden, r->n_positions_only_golden);
    return buf;
}
