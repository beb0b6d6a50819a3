/* baseline.c - baseline mode of dsv4_verify_run (docs/verify.md "Baseline mode").
 *
 * A low-precision candidate is judged against a precision-matched BASELINE of the same tokens and weights (normally
 * the reference with the design's roundings, `--emulate bf16`, following the golden's choices): the baseline says
 * how much error a faithful implementation has on THIS model and prompt, so the verdict holds on models no constant
 * was fitted to. Two comparisons run, golden vs candidate and golden vs baseline, with the same options; then every
 * float probe of a layer gets two gates over its rows (all stored positions, or all entries):
 *   rms:   RMS(rel_l2 of the candidate) <= F * RMS(rel_l2 of the baseline) + floor   (how large its error is)
 *   scale: |s_cand - s_base| <= Z * se + floor, s = sum<c - g, g> / sum<g, g>        (whether it is biased)
 * where se combines both runs' row scatter (>= DSV4_VERIFY_BASE_SCALE_MIN_ROWS rows, else not gated). The
 * selections (topk_idx's tie rule, router_ids, the logits' argmax), non-finite values and structure keep the
 * profile's row rules (compare.c strips only the float gates in this mode).
 *
 * Quiet traps:
 * - The two runs' rows are paired by (position, entry); the golden row is the same, so each row's weight <g, g>
 *   is too. A candidate row the baseline lacks makes the comparison impossible (status 2), never a skipped row.
 * - A baseline that cannot stand in for "a faithful implementation of the same tokens" is refused (status 2):
 *   another prompt or tokens, other weights (as for the candidate, unless --allow-different-weights), missing
 *   probes or positions, not a dump.
 * - The first divergence is layer-major: a gate judges a layer's probe over all positions, so among failures the
 *   lowest layer (then probe order) is where the candidate first leaves the baseline's envelope.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify_compare.h"

static int float_probe(const dsv4_verify_probe *p)
{
    return p->presence == DSV4_VERIFY_IN_BOTH &&
           (p->kind == DSV4_VERIFY_KIND_DENSE || p->kind == DSV4_VERIFY_KIND_ENTRIES ||
            p->kind == DSV4_VERIFY_KIND_ROUTER_WEIGHTS || p->kind == DSV4_VERIFY_KIND_LOGITS);
}

static const dsv4_verify_probe *find_probe(const dsv4_verify_result *r, const char *dataset)
{
    for (int i = 0; i < r->n_probes; i++)
        if (!strcmp(r->probes[i].dataset, dataset)) return &r->probes[i];
    return NULL;
}

/* Status 2 with the message; the baseline's own comparison messages name it "candidate": say "baseline". A message
 * about the file itself ("candidate: PATH: cannot open ...") names the path already. */
static void refuse(dsv4_verify_result *r, const char *path, const char *why)
{
    char msg[sizeof r->error];
    size_t len = 0;
    const int names_file = !strncmp(why, "candidate: ", 11);
    if (names_file) why += 11;
    for (const char *s = why; *s && len + 9 < sizeof msg;) {
        if (!strncmp(s, "candidate", 9)) {
            memcpy(msg + len, "baseline", 8);
            len += 8;
            s += 9;
        } else
            msg[len++] = *s++;
    }
    msg[len] = 0;
    r->status = DSV4_VERIFY_ERROR;
    if (names_file)
        snprintf(r->error, sizeof r->error, "baseline: %.500s", msg);
    else
        snprintf(r->error, sizeof r->error, "baseline %.150s: %.340s", path, msg);
}

/* The candidate's float probes the baseline lacks, as "a, b, c (and N more)"; 0 when none. */
static int missing_probes(const dsv4_verify_result *rc, const dsv4_verify_result *rb, char *out, size_t n)
{
    int miss = 0;
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < rc->n_probes; i++) {
        const dsv4_verify_probe *p = &rc->probes[i], *q;
        if (!float_probe(p)) continue;
        if ((q = find_probe(rb, p->dataset)) && q->presence == DSV4_VERIFY_IN_BOTH) continue;
        if (miss < 6 && len < n) len += (size_t)snprintf(out + len, n - len, "%s%s", miss ? ", " : "", p->dataset);
        miss++;
    }
    if (miss > 6 && len < n) snprintf(out + len, n - len, " (and %d more)", miss - 6);
    return miss;
}

/* The statistic of candidate probe p against baseline probe q (rows paired by position and entry). Returns the
 * first candidate row without a baseline row (its index), or -1 when every row has one. */
static int probe_stat(dsv4_verify_probe *p, const dsv4_verify_probe *q)
{
    dsv4_verify_base_stat *b = &p->base;
    memset(b, 0, sizeof *b);
    b->worst_row = -1;
    b->scale_se = b->scale_tol = NAN;
    double sc2 = 0, sb2 = 0, w = 0, wsc = 0, wsb = 0, worst = -INFINITY;
    int j = 0;
    for (int i = 0; i < p->n_rows; i++) {
        const dsv4_verify_row *rc = &p->rows[i];
        /* rows ascend by (position, entry) in both runs */
        while (j < q->n_rows && (q->rows[j].position < rc->position ||
                                 (q->rows[j].position == rc->position && q->rows[j].entry < rc->entry)))
            j++;
        if (j == q->n_rows || q->rows[j].position != rc->position || q->rows[j].entry != rc->entry) return i;
        const dsv4_verify_row *rb = &q->rows[j];
        const double ec = rc->v[DSV4_METRIC_REL_L2], eb = rb->v[DSV4_METRIC_REL_L2];
        /* a row without a value (structure) or where the baseline itself is unbounded adds nothing; an unbounded
         * candidate error (a zero golden row it does not reproduce) makes the RMS infinite */
        if (isnan(ec) || !isfinite(eb)) continue;
        b->n_rows++;
        sc2 += ec * ec;
        sb2 += eb * eb;
        const double excess = ec - DSV4_VERIFY_BASE_RMS_FACTOR * eb;
        if (excess > worst) {
            worst = excess;
            b->worst_row = i;
            b->worst_cand = ec;
            b->worst_base = eb;
        }
        const double wi = rc->g_norm2;
        w += wi;
        wsc += wi * rc->v[DSV4_METRIC_SCALE];
        wsb += wi * rb->v[DSV4_METRIC_SCALE];
    }
    if (!b->n_rows) return -1;
    b->cand_rms = sqrt(sc2 / b->n_rows);
    b->base_rms = sqrt(sb2 / b->n_rows);
    b->rms_tol = DSV4_VERIFY_BASE_RMS_FACTOR * b->base_rms + DSV4_VERIFY_BASE_RMS_FLOOR;
    if (!(b->cand_rms <= b->rms_tol)) b->failed |= 1u;
    b->cand_scale = w > 0 ? wsc / w : 0;
    b->base_scale = w > 0 ? wsb / w : 0;
    if (b->n_rows < DSV4_VERIFY_BASE_SCALE_MIN_ROWS || !(w > 0)) return -1;
    /* the standard error of each pooled scale from its rows' scatter about it, weighted as pooled */
    double vc = 0, vb = 0;
    j = 0;
    for (int i = 0; i < p->n_rows; i++) {
        const dsv4_verify_row *rc = &p->rows[i];
        while (q->rows[j].position != rc->position || q->rows[j].entry != rc->entry) j++;
        const dsv4_verify_row *rb = &q->rows[j];
        if (isnan(rc->v[DSV4_METRIC_REL_L2]) || !isfinite(rb->v[DSV4_METRIC_REL_L2])) continue;
        const double wi = rc->g_norm2, dc = rc->v[DSV4_METRIC_SCALE] - b->cand_scale,
                     db = rb->v[DSV4_METRIC_SCALE] - b->base_scale;
        vc += wi * wi * dc * dc;
        vb += wi * wi * db * db;
    }
    b->scale_se = sqrt(vc + vb) / w;
    b->scale_tol = DSV4_VERIFY_BASE_SCALE_Z * b->scale_se + DSV4_VERIFY_BASE_SCALE_FLOOR;
    if (!(fabs(b->cand_scale - b->base_scale) <= b->scale_tol)) b->failed |= 2u;
    return -1;
}

/* 1 (why says so) when the two goldens do not hold the same tokens and positions, 0 when they do, < 0 when one
 * cannot be read: rows of the two comparisons are paired by position. */
static int same_tokens(const char *a, const char *b, char *why, size_t n)
{
    dsv4_dump *da = NULL, *db = NULL;
    int rc = dsv4_dump_open(a, &da);
    if (!rc) rc = dsv4_dump_open(b, &db);
    int nta = 0, ntb = 0, npa = 0, npb = 0, differ = 0;
    if (!rc) {
        const int32_t *ta = dsv4_dump_tokens(da, &nta), *tb = dsv4_dump_tokens(db, &ntb);
        const int32_t *pa = dsv4_dump_positions(da, &npa), *pb = dsv4_dump_positions(db, &npb);
        differ = nta != ntb || npa != npb || memcmp(ta, tb, (size_t)nta * sizeof *ta) ||
                 memcmp(pa, pb, (size_t)npa * sizeof *pa);
        if (differ)
            snprintf(why, n, "its golden %.150s holds other tokens or positions than the candidate's golden (%d tokens, "
                     "%d positions against %d, %d): the two runs' rows cannot be paired", b, ntb, npb, nta, npa);
    }
    dsv4_dump_free(da);
    dsv4_dump_free(db);
    return rc ? rc : differ;
}

/* Layer-major order of a failure: (layer rank, probe order). */
static int before(const dsv4_verify_result *r, const dsv4_verify_probe *p, const dsv4_verify_divergence *d)
{
    if (!d->found) return 1;
    if (d->probe_index < 0) return 0; /* the token streams part: before every probe */
    const int ra = p->layer < 0 ? r->n_layers : p->layer, rb = d->layer < 0 ? r->n_layers : d->layer;
    if (ra != rb) return ra < rb;
    return p->order < r->probes[d->probe_index].order;
}

static void base_divergence(dsv4_verify_result *r, int pi)
{
    const dsv4_verify_probe *p = &r->probes[pi];
    const dsv4_verify_base_stat *b = &p->base;
    dsv4_verify_divergence *d = &r->first;
    const dsv4_verify_row *wr = b->worst_row >= 0 ? &p->rows[b->worst_row] : NULL;
    d->found = 1;
    d->position = wr ? wr->position : -1;
    d->entry = wr ? wr->entry : -1;
    d->layer = p->layer;
    d->probe_index = pi;
    snprintf(d->dataset, sizeof d->dataset, "%s", p->dataset);
    const char *rows = p->kind == DSV4_VERIFY_KIND_ENTRIES ? "entries" : "positions";
    if (b->failed & 1u) {
        d->metric = DSV4_METRIC_REL_L2;
        d->value = b->cand_rms;
        d->tolerance = b->rms_tol;
        snprintf(d->detail, sizeof d->detail,
                 "RMS over %d %s: candidate %.3e, baseline %.3e (x%.2f; gate x%g + %g); the row departing most: "
                 "candidate %.3e, baseline %.3e",
                 b->n_rows, rows, b->cand_rms, b->base_rms, b->base_rms > 0 ? b->cand_rms / b->base_rms : INFINITY,
                 DSV4_VERIFY_BASE_RMS_FACTOR, DSV4_VERIFY_BASE_RMS_FLOOR, b->worst_cand, b->worst_base);
    } else {
        d->metric = DSV4_METRIC_SCALE;
        d->value = fabs(b->cand_scale - b->base_scale);
        d->tolerance = b->scale_tol;
        snprintf(d->detail, sizeof d->detail,
                 "scale error <c-g,g>/<g,g> over %d %s: candidate %+.3e, baseline %+.3e, a difference of %.1f standard "
                 "errors (gate %g se + %g): a systematic bias the baseline does not have",
                 b->n_rows, rows, b->cand_scale, b->base_scale, d->value / b->scale_se, DSV4_VERIFY_BASE_SCALE_Z,
                 DSV4_VERIFY_BASE_SCALE_FLOOR);
    }
}

/* Judge rc (golden vs candidate, float gates stripped) against rb (golden vs baseline). */
static void judge(dsv4_verify_result *rc, const dsv4_verify_result *rb, const char *bpath)
{
    for (int i = 0; i < rc->n_probes; i++) {
        dsv4_verify_probe *p = &rc->probes[i];
        if (!float_probe(p)) continue;
        const dsv4_verify_probe *q = find_probe(rb, p->dataset);
        const int lack = probe_stat(p, q);
        if (lack >= 0) {
            char why[384];
            const dsv4_verify_row *row = &p->rows[lack];
            if (row->entry >= 0)
                snprintf(why, sizeof why,
                         "it has no entry %d of %.120s (the candidate has): a baseline must store every entry and "
                         "position the candidate is compared at",
                         row->entry, p->dataset);
            else
                snprintf(why, sizeof why,
                         "it does not store position %d of %.120s: a baseline must store every position the "
                         "candidate is compared at (dsv4 run --dump-positions all)",
                         row->position, p->dataset);
            refuse(rc, bpath, why);
            return;
        }
        const dsv4_verify_base_stat *b = &p->base;
        if (!b->n_rows) continue;
        const int checks = 1 + !isnan(b->scale_tol), failed = (b->failed & 1u) + (b->failed >> 1 & 1u);
        rc->base_checks += checks;
        rc->base_failed += failed;
        rc->n_checks += checks;
        rc->n_failed_checks += failed;
        if (b->failed && before(rc, p, &rc->first)) base_divergence(rc, i);
    }
    rc->status = rc->first.found ? DSV4_VERIFY_DIVERGED : DSV4_VERIFY_PASS;
}

int dsv4_verify_baseline_run(const char *golden_path, const char *candidate_path, const dsv4_verify_options *o,
                             dsv4_verify_result **out)
{
    dsv4_verify_result *rc = NULL, *rb = NULL;
    int ret = dsv4_cmp_run(golden_path, candidate_path, o, &rc);
    if (ret) return ret;
    *out = rc;
    rc->baseline = 1;
    rc->base.path = dsv4_cmp_strdup(o->baseline);
    if (!rc->base.path) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
    if (rc->status == DSV4_VERIFY_ERROR) return 0; /* the candidate cannot be compared: that message first */
    dsv4_verify_options ob = *o;
    ob.baseline = NULL;
    ob.require = NULL; /* what the candidate must hold; the baseline must hold what the candidate is compared on */
    ob.progress = NULL; /* the progress line follows the candidate's comparison */
    const char *bgolden = o->baseline_golden ? o->baseline_golden : golden_path;
    if ((ret = dsv4_cmp_run(bgolden, o->baseline, &ob, &rb))) return ret;
    if (rb->candidate.path) { /* the baseline's file info (it opened), moved */
        free(rc->base.path);
        rc->base = rb->candidate;
        memset(&rb->candidate, 0, sizeof rb->candidate);
    }
    char why[480];
    if (rb->status == DSV4_VERIFY_ERROR)
        refuse(rc, o->baseline, rb->error);
    else if (o->baseline_golden && (ret = same_tokens(golden_path, bgolden, why, sizeof why)) != 0) {
        if (ret < 0) return ret;
        refuse(rc, o->baseline, why);
    }
    else if (rb->token_diff_position >= 0) {
        snprintf(why, sizeof why, "its tokens differ from the golden's at position %d (golden %d, baseline %d): a "
                 "baseline must run the golden's tokens (e.g. --tokens-from GOLDEN --forced)",
                 rb->token_diff_position, rb->token_golden, rb->token_candidate);
        refuse(rc, o->baseline, why);
    } else {
        char list[400];
        int miss = missing_probes(rc, rb, list, sizeof list);
        if (miss) {
            snprintf(why, sizeof why, "it lacks %d probe%s that the golden and the candidate both hold: %.380s", miss,
                     miss == 1 ? "" : "s", list);
            refuse(rc, o->baseline, why);
        } else
            judge(rc, rb, o->baseline);
    }
    dsv4_verify_result_free(rb);
    return 0;
}
