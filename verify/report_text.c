/* report_text.c - the one-screen terminal report (docs/verify.md "Reading the report").
 *
 * Order: the two files and the profile; the verdict; the first divergence with its metric, value and
 * tolerance; a per-layer table (rows = layers, one column per probe label, each cell the worst value over
 * positions of that probe's primary gated metric, '!' = some gate failed, '~' = some check passed only under
 * the after_tie gates); the first tie-accepted top-k difference and the after_tie counts; top-k per CSA layer; logits;
 * what only one file holds (the probes and positions a partial candidate lacks); the token streams. Everything else is in --json.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "verify_internal.h"

#define RED(c) ((c) ? "\033[1;31m" : "")
#define GREEN(c) ((c) ? "\033[1;32m" : "")
#define BOLD(c) ((c) ? "\033[1m" : "")
#define OFF(c) ((c) ? "\033[0m" : "")

static void cell_text(const dsv4_verify_cell *c, char *buf, size_t n)
{
    char v[32];
    if (c->probe < 0)
        snprintf(buf, n, ".");
    else if (c->base && !c->structure && !c->nonfinite && isnan(c->value))
        snprintf(buf, n, "x-%s", c->failed ? "!" : ""); /* both errors under the floor */
    else if (c->base && !c->structure && !c->nonfinite)
        snprintf(buf, n, "x%.2f%s", c->value, c->failed ? "!" : "");
    else if (c->structure)
        snprintf(buf, n, "struct!");
    else if (c->nonfinite)
        snprintf(buf, n, "NaN!");
    else
        snprintf(buf, n, "%s%s", dsv4_verify_fmt_short(c->metric, c->value, v, sizeof v),
                 c->failed ? "!" : c->after_tie_saved ? "~" : "");
}

static int narrow_metric(dsv4_verify_metric m)
{
    return m == DSV4_METRIC_STRICT || m == DSV4_METRIC_MISMATCH || m == DSV4_METRIC_ARGMAX;
}

static const char *metric_abbrev(dsv4_verify_metric m)
{
    switch (m) {
    case DSV4_METRIC_MISMATCH: return "mism";
    case DSV4_METRIC_STRICT: return "strict";
    case DSV4_METRIC_MAX_ABS: return "maxabs";
    default: return dsv4_verify_metric_name(m);
    }
}

/* What one file holds and the other does not: never compared and, but for --require, never failed. The golden's
 * extras say plainly what a partial candidate did not provide (docs/dump-format.md "Partial dumps"). */
static void print_lacks(FILE *f, const dsv4_verify_result *r, int color)
{
    char buf[1200];
    if (r->n_only_golden || r->n_positions_only_golden || r->n_only_candidate) fprintf(f, "\n");
    if (r->n_only_golden) {
        int opt = r->n_only_golden - r->n_required_missing;
        fprintf(f, "only in golden: %d dataset%s the candidate did not provide", r->n_only_golden,
                r->n_only_golden == 1 ? "" : "s");
        if (r->n_required_missing)
            fprintf(f, ": %s%d REQUIRED by --require (failed)%s, %d not compared\n", RED(color), r->n_required_missing,
                    OFF(color), opt);
        else
            fprintf(f, ", not compared (a partial dump; --require PROBES makes a missing probe fail)\n");
        fprintf(f, "  %s\n", dsv4_verify_lacks_datasets(r, DSV4_VERIFY_ONLY_GOLDEN, buf, sizeof buf));
    }
    if (r->n_positions_only_golden)
        fprintf(f, "only in golden: %d of its %d stored positions the candidate did not store, not compared: %s\n",
                r->n_positions_only_golden, r->golden.n_positions, dsv4_verify_lacks_positions(r, buf, sizeof buf));
    if (r->n_only_candidate)
        fprintf(f, "only in candidate (%d, not compared): %s\n", r->n_only_candidate,
                dsv4_verify_lacks_datasets(r, DSV4_VERIFY_ONLY_CANDIDATE, buf, sizeof buf));
}

static void print_table(FILE *f, const dsv4_verify_result *r, int color)
{
    const char *labels[DSV4_VERIFY_MAX_COLUMNS];
    int nl = dsv4_verify_columns(r, labels, DSV4_VERIFY_MAX_COLUMNS);
    if (!nl) return;
    int width[DSV4_VERIFY_MAX_COLUMNS];
    dsv4_verify_metric metric[DSV4_VERIFY_MAX_COLUMNS];
    int mixed[DSV4_VERIFY_MAX_COLUMNS], base[DSV4_VERIFY_MAX_COLUMNS], any_mixed = 0;
    const char *head[DSV4_VERIFY_MAX_COLUMNS]; /* the second header line: the metric, or "mixed" */
    for (int j = 0; j < nl; j++) {
        metric[j] = DSV4_METRIC_REL_L2;
        mixed[j] = base[j] = 0;
        int found = 0, widest = 0; /* a cell wider than the column ("struct!" in a narrow one) widens it */
        for (int l = 0; l < r->n_layers; l++) {
            dsv4_verify_cell c;
            char txt[32];
            dsv4_verify_cell_at(r, l, labels[j], &c);
            /* the cells of a column may be of different metrics (the 6 mHC probes, or a layer's own --tol): then
             * no one metric heads it */
            if (c.probe >= 0 && found && (c.metric != metric[j] || c.base != base[j])) mixed[j] = any_mixed = 1;
            if (c.probe >= 0 && !found) metric[j] = c.metric, base[j] = c.base, found = 1;
            cell_text(&c, txt, sizeof txt);
            if ((int)strlen(txt) > widest) widest = (int)strlen(txt);
        }
        head[j] = mixed[j] ? "mixed" : base[j] ? "ratio" : metric_abbrev(metric[j]);
        width[j] = narrow_metric(metric[j]) && !mixed[j] ? 6 : 8;
        if (widest + 1 > width[j]) width[j] = widest + 1;
        if ((int)strlen(labels[j]) + 1 > width[j]) width[j] = (int)strlen(labels[j]) + 1;
        if ((int)strlen(head[j]) + 1 > width[j]) width[j] = (int)strlen(head[j]) + 1;
    }
    if (r->baseline)
        fprintf(f, "\nper layer: the candidate's RMS rel_l2 over positions / the baseline's (! fails a baseline gate: "
                   "x%g + %g, or a scale bias;\nx- both under %g; hc = the worst of the 6 mHC probes); selections: "
                   "the profile's strict/mism counts\n",
                DSV4_VERIFY_BASE_RMS_FACTOR, DSV4_VERIFY_BASE_RMS_FLOOR, DSV4_VERIFY_BASE_RMS_FLOOR);
    else
        fprintf(f,
                "\nper layer: worst over positions of each probe's gated metric (! fails; hc = worst of the 6 mHC "
                "probes%s)\n",
                r->n_after_tie_saved ? "; ~ passes only under the after_tie gates" : "");
    fprintf(f, "%-3s %-9s", "L", "type");
    for (int j = 0; j < nl; j++) fprintf(f, "%-*s", width[j], labels[j]);
    fprintf(f, "\n%-13s", "");
    for (int j = 0; j < nl; j++) fprintf(f, "%-*s", width[j], head[j]);
    fprintf(f, "\n");
    for (int l = 0; l < r->n_layers; l++) {
        char t[32];
        int any = 0;
        for (int j = 0; j < nl; j++) {
            dsv4_verify_cell c;
            dsv4_verify_cell_at(r, l, labels[j], &c);
            any |= c.probe >= 0;
        }
        if (!any) continue; /* filtered out by --layers / --probes */
        fprintf(f, "%-3d %-9s", l, dsv4_verify_layer_type(r, l, t, sizeof t));
        for (int j = 0; j < nl; j++) {
            dsv4_verify_cell c;
            char txt[32];
            dsv4_verify_cell_at(r, l, labels[j], &c);
            cell_text(&c, txt, sizeof txt);
            if (c.failed)
                fprintf(f, "%s%-*s%s", RED(color), width[j], txt, OFF(color));
            else
                fprintf(f, "%-*s", width[j], txt);
        }
        fprintf(f, "\n");
    }
    /* final/ on one line: its probes have their own metrics */
    int first = 1;
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (p->layer >= 0 || p->presence != DSV4_VERIFY_IN_BOTH) continue;
        dsv4_verify_cell c;
        char txt[32];
        dsv4_verify_cell_at(r, -1, dsv4_verify_probe_label(p->probe), &c);
        cell_text(&c, txt, sizeof txt);
        fprintf(f, "%s %s %s %s%s%s", first ? "final:" : " ", p->probe, c.base ? "ratio" : metric_abbrev(c.metric),
                c.failed ? RED(color) : "", txt, c.failed ? OFF(color) : "");
        first = 0;
    }
    if (!first) fprintf(f, "\n");
    if (any_mixed)
        fprintf(f, "mixed: the column's cells are of different gated metrics (probes or layers gated differently); "
                   "--json has each probe's\n");
}

static void print_topk(FILE *f, const dsv4_verify_result *r, int color)
{
    int header = 0;
    double head_abs = 0, head_rel = 0; /* the tolerance the header states; a layer with its own says so */
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (p->kind != DSV4_VERIFY_KIND_TOPK || p->presence != DSV4_VERIFY_IN_BOTH) continue;
        dsv4_verify_topk_summary s;
        dsv4_verify_topk_summarise(r, i, &s);
        if (!header) {
            fprintf(f,
                    "\ntop-k per CSA layer (sets; a pick outside the golden set is accepted when its golden score >= "
                    "k-th - tol\nand the golden pick it replaces scores <= k-th + tol; "
                    "tol = tie_abs + tie_rel*max|score| = %g + %g*max|score|)\n",
                    p->tie_abs, p->tie_rel);
            head_abs = p->tie_abs, head_rel = p->tie_rel;
            if (r->first_tie.found && (p->after_tie_abs != p->tie_abs || p->after_tie_rel != p->tie_rel))
                fprintf(f, "after the first tie: tol = %g + %g*max|score| (after_tie)\n", p->after_tie_abs,
                        p->after_tie_rel);
            fprintf(f, "%-3s %-6s %-17s %-17s %-9s %-9s %s\n", "L", "rows", "recall min/mean", "jaccard min/mean",
                    "rows!=G", "accepted", "strict");
            header = 1;
        }
        char rec[40], jac[40];
        snprintf(rec, sizeof rec, "%.4f/%.4f", s.recall_min, s.recall_mean);
        snprintf(jac, sizeof jac, "%.4f/%.4f", s.jaccard_min, s.jaccard_mean);
        char own_tol[80] = "";
        if (p->tie_abs != head_abs || p->tie_rel != head_rel)
            snprintf(own_tol, sizeof own_tol, "  (this layer: tol = %g + %g*max|score|)", p->tie_abs, p->tie_rel);
        fprintf(f, "%-3d %-6d %-17s %-17s %-9d %-9ld %s%ld%s%s%s%s\n", p->layer, s.n_rows, rec, jac, s.rows_differ,
                s.accepted, s.strict ? RED(color) : "", s.strict, s.strict ? OFF(color) : "", own_tol,
                p->note[0] ? "  " : "", p->note); /* why: no golden scores, a shape that differs, ... */
    }
}

static void print_logits(FILE *f, const dsv4_verify_result *r, int color)
{
    dsv4_verify_logits_summary s;
    dsv4_verify_logits_summarise(r, &s);
    if (s.probe < 0) return;
    const dsv4_verify_probe *p = &r->probes[s.probe];
    char a[32], b[32], c[32];
    fprintf(f,
            "\nlogits (%d positions): argmax equal %d/%d, tie-accepted %d, %sstrict %d%s; top-5 overlap min %.2f mean "
            "%.2f\n",
            s.n_rows, s.argmax_equal, s.n_rows, s.argmax_tie, s.argmax_strict ? RED(color) : "", s.argmax_strict,
            s.argmax_strict ? OFF(color) : "", s.top5_min, s.top5_mean);
    fprintf(f, "  KL(golden||candidate) max %s (position %d) mean %s; rel_l2 max %s (position %d)%s\n",
            dsv4_verify_fmt(DSV4_METRIC_KL, s.kl_max, a, sizeof a), s.kl_max_position,
            dsv4_verify_fmt(DSV4_METRIC_KL, s.kl_mean, b, sizeof b),
            dsv4_verify_fmt(DSV4_METRIC_REL_L2, s.rel_l2_max, c, sizeof c), s.rel_l2_max_position,
            p->n_failed_rows ? "" : "");
}

int dsv4_verify_write_text(const dsv4_verify_result *r, FILE *f, int color)
{
    const dsv4_verify_file *g = &r->golden, *c = &r->candidate;
    if (g->path) {
        fprintf(f, "golden     %s  [%s; %s, prompt %d + decode %d]\n", g->path, g->producer, g->mode, g->prompt_len,
                g->n_decode);
        fprintf(f, "candidate  %s  [%s; %s, prompt %d + decode %d]\n", c->path ? c->path : "?",
                c->producer ? c->producer : "?", c->mode ? c->mode : "?", c->prompt_len, c->n_decode);
    }
    if (r->baseline) {
        const dsv4_verify_file *b = &r->base;
        fprintf(f, "baseline   %s", b->path ? b->path : "?");
        if (b->producer)
            fprintf(f, "  [%s; %s, prompt %d + decode %d]", b->producer, b->mode, b->prompt_len, b->n_decode);
        fprintf(f, "\n");
    }
    if (r->profile_name[0])
        fprintf(f, "profile    %s (%s)%s%s\n", r->profile_name, r->profile_source,
                r->baseline ? ": selections only; float probes against the baseline" : "",
                r->digests_differ ? "; WEIGHTS DIFFER (--allow-different-weights)" : "");
    if (r->status == DSV4_VERIFY_ERROR) {
        fprintf(f, "\n%sVERDICT: COULD NOT COMPARE%s: %s\n", RED(color), OFF(color), r->error);
        return 0;
    }
    int lo = r->positions[0], hi = r->positions[r->n_positions - 1];
    fprintf(f, "compared   %d positions (%d..%d), %d layers, %d probes, %ld checks in %.2f s (%.1f MB read)\n",
            r->n_positions, lo, hi, r->n_layers, r->n_compared, r->n_checks, r->seconds, r->bytes_read / 1e6);
    const int failing = dsv4_verify_failing_probes(r);
    if (r->status == DSV4_VERIFY_PASS && r->baseline)
        fprintf(f, "\n%sVERDICT: PASS%s  every float probe within the baseline's error, every selection within the %s "
                   "profile%s\n",
                GREEN(color), OFF(color), r->profile_name,
                (r->n_only_golden || r->n_only_candidate || r->n_positions_only_golden)
                    ? " (but see what only one file holds, below)" : "");
    else if (r->status == DSV4_VERIFY_PASS) {
        int saved = r->first_tie.found && r->n_after_tie_saved;
        fprintf(f, "\n%sVERDICT: PASS%s  every gated metric within the %s profile%s%s\n", GREEN(color), OFF(color),
                r->profile_name, saved ? " (its after_tie gates after the tie below)" : "",
                (r->n_only_golden || r->n_only_candidate || r->n_positions_only_golden)
                    ? " (but see what only one file holds, below)" : "");
    } else {
        if (failing)
            fprintf(f, "\n%sVERDICT: DIVERGED%s  %ld of %ld checks fail, in %d probe%s%s\n", RED(color), OFF(color),
                    r->n_failed_checks, r->n_checks, failing, failing == 1 ? "" : "s",
                    r->token_diff_position >= 0 ? ", and the token streams part" : "");
        else
            fprintf(f,
                    "\n%sVERDICT: DIVERGED%s  the token streams part at position %d; every probe before it is within "
                    "tolerance\n",
                    RED(color), OFF(color), r->token_diff_position);
        const dsv4_verify_divergence *d = &r->first;
        char where[256], v[32], t[32];
        fprintf(f, "%sfirst divergence: %s%s\n", BOLD(color), dsv4_verify_where(r, d, where, sizeof where), OFF(color));
        fprintf(f, "  %s = %s %s %s;  %s\n", dsv4_verify_metric_name(d->metric),
                dsv4_verify_fmt(d->metric, d->value, v, sizeof v), dsv4_verify_metric_is_min(d->metric) ? "<" : ">",
                dsv4_verify_fmt(d->metric, d->tolerance, t, sizeof t), d->detail);
    }
    char sentence[768];
    if (r->baseline) fprintf(f, "%s\n", dsv4_verify_base_sentence(r, sentence, sizeof sentence));
    if (dsv4_verify_profile_note(r)[0]) fprintf(f, "note: %s\n", dsv4_verify_profile_note(r));
    if (r->first_tie.found) {
        /* plainly: from the tie on, the gates were not the normal ones */
        const dsv4_verify_tie *t = &r->first_tie;
        char where[160];
        dsv4_verify_tie_where(r, where, sizeof where);
        if (t->given)
            fprintf(f, "%sfirst tie-accepted top-k difference: %s%s, given by --tie-at (not seen in these files)\n",
                    BOLD(color), where, OFF(color));
        else
            fprintf(f, "%sfirst tie-accepted top-k difference: %s%s (%d pick%s outside the golden set, within the tie "
                       "tolerance)\n",
                    BOLD(color), where, OFF(color), t->accepted, t->accepted == 1 ? "" : "s");
        if (r->profile_after_tie)
            fprintf(f,
                    "  every later comparison (model order) used the profile's after_tie gates: %ld checks, %s%ld "
                    "passed only thanks to them%s\n",
                    r->n_after_tie_checks, r->n_after_tie_saved ? BOLD(color) : "", r->n_after_tie_saved,
                    r->n_after_tie_saved ? OFF(color) : "");
        else
            fprintf(f, "  the profile has no after_tie section: later comparisons used the normal gates\n");
    }
    print_table(f, r, color);
    print_topk(f, r, color);
    print_logits(f, r, color);
    print_lacks(f, r, color);
    int notes = 0;
    for (int i = 0; i < r->n_probes && notes < 4; i++)
        if (r->probes[i].note[0] && r->probes[i].n_failed_rows && r->probes[i].kind != DSV4_VERIFY_KIND_TOPK) {
            fprintf(f, "%s%s: %s\n", notes ? "" : "\n", r->probes[i].dataset, r->probes[i].note);
            notes++;
        }
    if (r->token_diff_position >= 0)
        fprintf(f,
                "\n%stokens differ from position %d%s (golden %d, candidate %d): the runs parted there; %d stored "
                "position%s after it not compared\n",
                RED(color), r->token_diff_position, OFF(color), r->token_golden, r->token_candidate,
                r->n_positions_not_compared, r->n_positions_not_compared == 1 ? "" : "s");
    else
        fprintf(f, "\ntokens identical at all %d common token positions\n",
                g->n_tokens < c->n_tokens ? g->n_tokens : c->n_tokens);
    return 0;
}
