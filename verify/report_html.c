/* report_html.c - --html: one self-contained XHTML file with inline SVG plots made here (no scripts, no
 * network): per-layer error curves per probe (log scale), top-k recall per CSA layer, logits KL per position,
 * and a (position x layer) map of the worst gate ratio; then the tables of the text report, complete.
 *
 * Well-formedness is a contract (tests parse the file as XML): every element is closed, attributes are
 * quoted, text goes through esc(). Log axes clamp values below the axis floor to the floor and draw them
 * hollow, so a zero error stays visible instead of vanishing.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "verify_internal.h"

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                                      "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39",
                                      "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363"};
#define PALETTE_N ((int)(sizeof palette / sizeof palette[0]))

static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x80) { /* the page is UTF-8: a byte that starts no valid sequence is U+FFFD */
                int k = dsv4_verify_utf8_len(s);
                if (k > 0) fwrite(s, 1, (size_t)k, f), s += k - 1;
                else fputs("\xef\xbf\xbd", f);
            } else if ((unsigned char)*s >= 0x20 || *s == '\n' || *s == '\t') {
                fputc(*s, f);
            }
        }
    }
}

typedef struct plot {
    double x0, y0, w, h; /* the data area in SVG units */
    double xmin, xmax, ymin, ymax;
    int ylog;
} plot;

static double px(const plot *p, double x)
{
    double span = p->xmax - p->xmin;
    return p->x0 + (span > 0 ? (x - p->xmin) / span : 0.5) * p->w;
}

static double py(const plot *p, double y)
{
    double t;
    if (p->ylog) {
        double v = y < p->ymin ? p->ymin : y > p->ymax ? p->ymax : y;
        t = (log10(v) - log10(p->ymin)) / (log10(p->ymax) - log10(p->ymin));
    } else {
        t = (y - p->ymin) / (p->ymax - p->ymin);
    }
    return p->y0 + p->h - t * p->h;
}

/* Axes, grid and labels. Integer x ticks every xstep (0: none, the caller labels the x axis). */
static void axes(FILE *f, const plot *p, const char *xlabel, const char *ylabel, int xstep)
{
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fcfcfc\" stroke=\"#999\"/>\n", p->x0,
            p->y0, p->w, p->h);
    if (p->ylog) {
        for (int e = (int)floor(log10(p->ymin)); e <= (int)ceil(log10(p->ymax)); e++) {
            double v = pow(10, e);
            if (v < p->ymin * 0.999 || v > p->ymax * 1.001) continue;
            double y = py(p, v);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", p->x0, y,
                    p->x0 + p->w, y);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">1e%d</text>\n", p->x0 - 4,
                    y + 3, e);
        }
    } else {
        for (int i = 0; i <= 4; i++) {
            double v = p->ymin + (p->ymax - p->ymin) * i / 4.0, y = py(p, v);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", p->x0, y,
                    p->x0 + p->w, y);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%.3g</text>\n", p->x0 - 4,
                    y + 3, v);
        }
    }
    for (int x = (int)ceil(p->xmin); xstep > 0 && x <= (int)p->xmax; x += xstep)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%d</text>\n", px(p, x),
                p->y0 + p->h + 13, x);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">", p->x0 + p->w / 2,
            p->y0 + p->h + 28);
    esc(f, xlabel);
    fprintf(
        f,
        "</text>\n<text x=\"12\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 12 %.1f)\">",
        p->y0 + p->h / 2, p->y0 + p->h / 2);
    esc(f, ylabel);
    fprintf(f, "</text>\n");
}

static void hline(FILE *f, const plot *p, double y, const char *color, const char *label)
{
    double yy = py(p, y);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"5,3\"/>\n",
            p->x0, yy, p->x0 + p->w, yy, color);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"end\" fill=\"%s\">", p->x0 + p->w - 3, yy - 3,
            color);
    esc(f, label);
    fprintf(f, "</text>\n");
}

/* Log range covering the finite positive values in [lo, hi] plus the tolerances, in whole decades. */
static void log_range(double lo, double hi, double *ymin, double *ymax)
{
    if (!(lo > 0) || !isfinite(lo)) lo = 1e-9;
    if (!(hi > 0) || !isfinite(hi)) hi = lo * 10;
    *ymin = pow(10, floor(log10(lo)));
    *ymax = pow(10, ceil(log10(hi)));
    if (*ymax <= *ymin) *ymax = *ymin * 10;
    if (*ymin < 1e-12) *ymin = 1e-12;
}

static int dense_like(const dsv4_verify_probe *p)
{
    return p->presence == DSV4_VERIFY_IN_BOTH && p->layer >= 0 &&
           (p->kind == DSV4_VERIFY_KIND_DENSE || p->kind == DSV4_VERIFY_KIND_ENTRIES ||
            p->kind == DSV4_VERIFY_KIND_ROUTER_WEIGHTS);
}

static void plot_layers(FILE *f, const dsv4_verify_result *r)
{
    /* distinct probe names with a rel_l2 curve, in model order */
    const char *names[64];
    int nn = 0;
    double lo = INFINITY, hi = 0;
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (!dense_like(p)) continue;
        int seen = 0;
        for (int j = 0; j < nn; j++) seen |= !strcmp(names[j], p->probe);
        if (!seen && nn < 64) names[nn++] = p->probe;
        double v = p->worst[DSV4_METRIC_REL_L2];
        if (v > 0 && isfinite(v)) {
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
        for (int g = 0; g < p->n_gates; g++)
            if (p->gates[g].metric == DSV4_METRIC_REL_L2 && p->gates[g].tol > hi) hi = p->gates[g].tol;
    }
    if (!nn || r->n_layers == 0) return;
    plot pl = {70, 20, 760, 300, 0, r->n_layers > 1 ? r->n_layers - 1 : 1, 0, 0, 1};
    log_range(lo, hi * 1.01, &pl.ymin, &pl.ymax);
    int legend_rows = (nn + 4) / 5;
    fprintf(f, "<h2>Per-layer error (worst relative L2 over positions)</h2>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"%d\" viewBox=\"0 0 860 %d\">\n",
            370 + 16 * legend_rows, 370 + 16 * legend_rows);
    axes(f, &pl, "layer", "rel_l2 (log)", r->n_layers > 24 ? 4 : 1);
    /* tolerance lines: each distinct rel_l2 tolerance once */
    double tols[16];
    int nt = 0;
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (!dense_like(p)) continue;
        for (int g = 0; g < p->n_gates; g++) {
            if (p->gates[g].metric != DSV4_METRIC_REL_L2) continue;
            int seen = 0;
            for (int t = 0; t < nt; t++) seen |= tols[t] == p->gates[g].tol;
            if (!seen && nt < 16) tols[nt++] = p->gates[g].tol;
        }
    }
    for (int t = 0; t < nt; t++) {
        char lab[48];
        snprintf(lab, sizeof lab, "tolerance %.0e", tols[t]);
        hline(f, &pl, tols[t], "#c00", lab);
    }
    for (int j = 0; j < nn; j++) {
        const char *col = palette[j % PALETTE_N];
        /* one polyline per run of consecutive layers: a probe absent from a layer breaks its curve */
        int open = 0, last = -2;
        for (int i = 0; i < r->n_probes; i++) {
            const dsv4_verify_probe *p = &r->probes[i];
            if (!dense_like(p) || strcmp(p->probe, names[j]) || isnan(p->worst[DSV4_METRIC_REL_L2])) continue;
            if (open && p->layer != last + 1) {
                fprintf(f, "\"/>\n");
                open = 0;
            }
            if (!open) fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", col);
            open = 1;
            last = p->layer;
            fprintf(f, "%.1f,%.1f ", px(&pl, p->layer), py(&pl, p->worst[DSV4_METRIC_REL_L2]));
        }
        if (open) fprintf(f, "\"/>\n");
        for (int i = 0; i < r->n_probes; i++) {
            const dsv4_verify_probe *p = &r->probes[i];
            if (!dense_like(p) || strcmp(p->probe, names[j]) || isnan(p->worst[DSV4_METRIC_REL_L2])) continue;
            double v = p->worst[DSV4_METRIC_REL_L2];
            int floor_hit = !(v >= pl.ymin);
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%s\" fill=\"%s\" stroke=\"%s\"><title>", px(&pl, p->layer),
                    py(&pl, v), p->n_failed_rows ? "4.5" : "2.5", floor_hit ? "white" : col,
                    p->n_failed_rows ? "#c00" : col);
            esc(f, p->dataset);
            fprintf(f, ": rel_l2 %.3e%s</title></circle>\n", v, p->n_failed_rows ? " (fails)" : "");
        }
        int lx = 70 + (j % 5) * 155, ly = 365 + (j / 5) * 16;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"4\" fill=\"%s\"/>", lx, ly - 4, col);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\">", lx + 16, ly);
        esc(f, names[j]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
}

static void plot_topk(FILE *f, const dsv4_verify_result *r)
{
    int idx[DSV4_MAX_LAYERS], n = 0;
    for (int i = 0; i < r->n_probes && n < DSV4_MAX_LAYERS; i++)
        if (r->probes[i].kind == DSV4_VERIFY_KIND_TOPK && r->probes[i].presence == DSV4_VERIFY_IN_BOTH) idx[n++] = i;
    if (!n) return;
    double mn = 1;
    dsv4_verify_topk_summary s[DSV4_MAX_LAYERS];
    for (int i = 0; i < n; i++) {
        dsv4_verify_topk_summarise(r, idx[i], &s[i]);
        if (s[i].recall_min < mn) mn = s[i].recall_min;
    }
    plot pl = {70, 20, 760, 220, -0.5, n - 0.5, mn > 0.9 ? 0.9 : floor(mn * 10) / 10, 1.0, 0};
    fprintf(f, "<h2>Top-k recall per CSA layer</h2>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"290\" viewBox=\"0 0 860 290\">\n");
    axes(f, &pl, "CSA layer (bar: mean recall; red tick: min; label: strict/accepted picks)", "recall", 0);
    double bw = pl.w / n * 0.6;
    for (int i = 0; i < n; i++) {
        double x = px(&pl, i), top = py(&pl, s[i].recall_mean), base = py(&pl, pl.ymin);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">L%d</text>\n", x,
                pl.y0 + pl.h + 13, s[i].layer);
        if (isnan(s[i].recall_mean)) { /* no row had a recall (a structure failure): no bar, the table says why */
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"middle\">not compared</text>\n",
                    x, pl.y0 + 12);
            continue;
        }
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>layer %d: recall mean "
                "%.4f min %.4f</title></rect>\n",
                x - bw / 2, top, bw, base - top > 0 ? base - top : 0, s[i].strict ? "#e57373" : "#64b5f6", s[i].layer,
                s[i].recall_mean, s[i].recall_min);
        double ym = py(&pl, s[i].recall_min);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#b00\" stroke-width=\"2\"/>\n",
                x - bw / 2, ym, x + bw / 2, ym);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"middle\">%ld/%ld</text>\n", x, pl.y0 + 12,
                s[i].strict, s[i].accepted);
    }
    fprintf(f, "</svg>\n");
}

static void plot_logits(FILE *f, const dsv4_verify_result *r)
{
    dsv4_verify_logits_summary s;
    dsv4_verify_logits_summarise(r, &s);
    if (s.probe < 0) return;
    const dsv4_verify_probe *p = &r->probes[s.probe];
    double lo = INFINITY, hi = 0, tol = NAN;
    for (int i = 0; i < p->n_rows; i++) {
        double v = p->rows[i].v[DSV4_METRIC_KL];
        if (v > 0 && v < lo) lo = v;
        if (v > hi) hi = v;
    }
    for (int g = 0; g < p->n_gates; g++)
        if (p->gates[g].metric == DSV4_METRIC_KL) tol = p->gates[g].tol;
    if (tol > hi) hi = tol;
    int pmin = r->positions[0], pmax = r->positions[r->n_positions - 1];
    plot pl = {70, 20, 760, 220, pmin, pmax > pmin ? pmax : pmin + 1, 0, 0, 1};
    log_range(lo, hi * 1.01, &pl.ymin, &pl.ymax);
    fprintf(f, "<h2>Logits: KL(golden || candidate) per position</h2>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"290\" viewBox=\"0 0 860 290\">\n");
    int span = pmax - pmin;
    axes(f, &pl, "position (red ring: argmax differs beyond the tie tolerance; hollow: at or below the axis floor)",
         "KL nats (log)",
         span > 40   ? (span / 10 + 4) / 5 * 5
         : span > 20 ? 2
                     : 1);
    if (!isnan(tol)) {
        char lab[48];
        snprintf(lab, sizeof lab, "tolerance %.0e", tol);
        hline(f, &pl, tol, "#c00", lab);
    }
    double xb = r->golden.prompt_len - 0.5;
    if (xb > pl.xmin && xb < pl.xmax) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" stroke-dasharray=\"2,2\"/>\n",
                px(&pl, xb), pl.y0, px(&pl, xb), pl.y0 + pl.h);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" fill=\"#666\">prefill | decode</text>\n",
                px(&pl, xb) + 3, pl.y0 + 10);
    }
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.2\" points=\"");
    for (int i = 0; i < p->n_rows; i++)
        if (!isnan(p->rows[i].v[DSV4_METRIC_KL]))
            fprintf(f, "%.1f,%.1f ", px(&pl, p->rows[i].position), py(&pl, p->rows[i].v[DSV4_METRIC_KL]));
    fprintf(f, "\"/>\n");
    for (int i = 0; i < p->n_rows; i++) {
        const dsv4_verify_row *row = &p->rows[i];
        double v = row->v[DSV4_METRIC_KL];
        if (isnan(v)) continue;
        int bad = row->v[DSV4_METRIC_ARGMAX] > 0;
        fprintf(f,
                "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%s\" fill=\"%s\" stroke=\"%s\"><title>position %d: KL %.3e, "
                "argmax %d/%d</title></circle>\n",
                px(&pl, row->position), py(&pl, v), bad ? "4.5" : "2.2", v >= pl.ymin ? "#1f77b4" : "white",
                bad ? "#c00" : "#1f77b4", row->position, v, row->argmax_g, row->argmax_c);
    }
    fprintf(f, "</svg>\n");
}

/* Worst gate ratio of a row over the gates it was judged with: the after_tie ones for a row after the first tie
 * (else a row that passed under them would be painted "> 1 fails"); non-finite and structure count as failing
 * hard. */
static double row_ratio(const dsv4_verify_probe *p, const dsv4_verify_row *row)
{
    if (row->failed & ((1u << DSV4_METRIC_NONFINITE) | (1u << DSV4_METRIC_STRUCTURE))) return INFINITY;
    const dsv4_verify_gate *gates = row->after_tie ? p->after_gates : p->gates;
    double w = 0;
    for (int g = 0; g < p->n_gates; g++) {
        double q = dsv4_verify_gate_ratio(gates[g].metric, row->v[gates[g].metric], gates[g].tol);
        if (q > w) w = q;
    }
    return w;
}

static int position_index(const dsv4_verify_result *r, int pos)
{
    int lo = 0, hi = r->n_positions - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (r->positions[mid] == pos) return mid;
        if (r->positions[mid] < pos)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static void plot_map(FILE *f, const dsv4_verify_result *r)
{
    int nl = r->n_layers + 1, np = r->n_positions; /* last row: final/ */
    if (np < 1 || np > 4096) return;
    double *q = calloc((size_t)nl * (size_t)np, sizeof *q);
    if (!q) return;
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (p->presence != DSV4_VERIFY_IN_BOTH) continue;
        int l = p->layer >= 0 ? p->layer : r->n_layers;
        if (l >= nl) continue;
        for (int k = 0; k < p->n_rows; k++) {
            int pi = position_index(r, p->rows[k].position);
            if (pi < 0) continue;
            double v = row_ratio(p, &p->rows[k]);
            if (v > q[(size_t)l * np + pi]) q[(size_t)l * np + pi] = v;
        }
    }
    double cw = 760.0 / np, ch = nl > 40 ? 8 : 16;
    double height = 30 + ch * nl + 40;
    fprintf(f, "<h2>Worst gate ratio (value / tolerance) per position and layer</h2>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"%.0f\" viewBox=\"0 0 860 %.0f\">\n",
            height, height);
    for (int l = 0; l < nl; l++) {
        fprintf(f, "<text x=\"64\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"end\">", 20 + ch * l + ch * 0.75,
                ch < 12 ? 7 : 10);
        if (l < r->n_layers)
            fprintf(f, "L%d", l);
        else
            fprintf(f, "final");
        fprintf(f, "</text>\n");
        for (int i = 0; i < np; i++) {
            double v = q[(size_t)l * np + i];
            const char *col = v > 1      ? "#d32f2f"
                              : v > 0.3  ? "#ffb74d"
                              : v > 0.03 ? "#fff176"
                              : v > 0    ? "#a5d6a7"
                                         : "#eeeeee";
            fprintf(f,
                    "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>position %d, %s: "
                    "%.3g</title></rect>\n",
                    70 + cw * i, 20 + ch * l, cw > 1.5 ? cw - 0.5 : cw, ch - 1, col, r->positions[i],
                    l < r->n_layers ? "layer" : "final", v);
        }
    }
    double ly = 20 + ch * nl + 18;
    const char *leg[][2] = {{"#a5d6a7", "&lt; 0.03"},
                            {"#fff176", "0.03-0.3"},
                            {"#ffb74d", "0.3-1"},
                            {"#d32f2f", "&gt; 1 fails"},
                            {"#eeeeee", "0 or no probe"}};
    for (int i = 0; i < 5; i++)
        fprintf(f,
                "<rect x=\"%d\" y=\"%.1f\" width=\"12\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%.1f\" "
                "font-size=\"10\">%s</text>\n",
                70 + 130 * i, ly - 9, leg[i][0], 86 + 130 * i, ly, leg[i][1]);
    fprintf(f, "<text x=\"70\" y=\"%.1f\" font-size=\"10\">positions %d..%d left to right</text>\n", ly + 16,
            r->positions[0], r->positions[np - 1]);
    fprintf(f, "</svg>\n");
    free(q);
}

static void td_value(FILE *f, dsv4_verify_metric m, double v, int failed, const char *title)
{
    char b[32];
    fprintf(f, "<td class=\"%s\" title=\"", failed ? "bad" : "ok");
    esc(f, title);
    fprintf(f, "\">%s</td>", dsv4_verify_fmt(m, v, b, sizeof b));
}

static void table_probes(FILE *f, const dsv4_verify_result *r)
{
    fprintf(f,
            "<h2>Every probe</h2>\n<table>\n<tr><th>dataset</th><th>kind</th><th>rows</th><th>failed "
            "rows</th><th>gates</th>"
            "<th>worst rel_l2</th><th>worst max_abs</th><th>min cosine</th><th>worst (gated)</th><th>note</th></tr>\n");
    static const char *const kinds[] = {"dense", "entries", "topk", "router_ids", "router_weights", "logits", "int"};
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        fprintf(f, "<tr><td>");
        esc(f, p->dataset);
        fprintf(f, "</td><td>%s</td>", kinds[p->kind]);
        if (p->presence != DSV4_VERIFY_IN_BOTH) {
            fprintf(f, "<td colspan=\"8\" class=\"bad\">only in the %s</td></tr>\n",
                    p->presence == DSV4_VERIFY_ONLY_GOLDEN ? "golden" : "candidate");
            continue;
        }
        fprintf(f, "<td>%d</td><td class=\"%s\">%d</td><td>", p->n_rows, p->n_failed_rows ? "bad" : "ok",
                p->n_failed_rows);
        for (int g = 0; g < p->n_gates; g++) {
            char b[32];
            fprintf(f, "%s%s %s %s", g ? "; " : "", dsv4_verify_metric_name(p->gates[g].metric),
                    dsv4_verify_metric_is_min(p->gates[g].metric) ? "&gt;=" : "&lt;=",
                    dsv4_verify_fmt(p->gates[g].metric, p->gates[g].tol, b, sizeof b));
        }
        fprintf(f, "</td>");
        td_value(f, DSV4_METRIC_REL_L2, p->worst[DSV4_METRIC_REL_L2], 0, "");
        td_value(f, DSV4_METRIC_MAX_ABS, p->worst[DSV4_METRIC_MAX_ABS], 0, "");
        td_value(f, DSV4_METRIC_COSINE, p->worst[DSV4_METRIC_COSINE], 0, "");
        fprintf(f, "<td>");
        for (int g = 0; g < p->n_gates; g++) {
            char b[32];
            dsv4_verify_metric m = p->gates[g].metric;
            fprintf(f, "%s%s %s", g ? "; " : "", dsv4_verify_metric_name(m),
                    dsv4_verify_fmt(m, p->worst[m], b, sizeof b));
        }
        fprintf(f, "</td><td>");
        esc(f, p->note);
        fprintf(f, "</td></tr>\n");
    }
    fprintf(f, "</table>\n");
}

/* Baseline mode: each float probe's two statistics against the baseline's, and the gates. */
static void table_baseline(FILE *f, const dsv4_verify_result *r)
{
    char sentence[768], b1[32], b2[32], b3[32];
    if (!r->baseline) return;
    fprintf(f, "<h2>Against the baseline</h2>\n<p>");
    esc(f, dsv4_verify_base_sentence(r, sentence, sizeof sentence));
    fprintf(f, "</p>\n<table>\n<tr><th>dataset</th><th>rows</th><th>RMS rel_l2 candidate</th><th>baseline</th>"
               "<th>ratio</th><th>scale candidate</th><th>baseline</th><th>difference / se</th></tr>\n");
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        const dsv4_verify_base_stat *b = &p->base;
        if (!b->n_rows) continue;
        fprintf(f, "<tr><td>");
        esc(f, p->dataset);
        fprintf(f, "</td><td>%d</td><td class=\"%s\">%s</td><td>%s</td><td class=\"%s\">%.2f</td>", b->n_rows,
                b->failed & 1u ? "bad" : "ok", dsv4_verify_fmt(DSV4_METRIC_REL_L2, b->cand_rms, b1, sizeof b1),
                dsv4_verify_fmt(DSV4_METRIC_REL_L2, b->base_rms, b2, sizeof b2), b->failed & 1u ? "bad" : "ok",
                b->base_rms > 0 ? b->cand_rms / b->base_rms : NAN);
        fprintf(f, "<td class=\"%s\">%+.2e</td><td>%+.2e</td><td class=\"%s\">%s</td></tr>\n",
                b->failed & 2u ? "bad" : "ok", b->cand_scale, b->base_scale, b->failed & 2u ? "bad" : "ok",
                isnan(b->scale_se) ? "not gated (few rows)"
                                   : (snprintf(b3, sizeof b3, "%.1f", fabs(b->cand_scale - b->base_scale) / b->scale_se),
                                      b3));
    }
    fprintf(f, "</table>\n");
}

static void table_layers(FILE *f, const dsv4_verify_result *r)
{
    const char *labels[DSV4_VERIFY_MAX_COLUMNS];
    int nl = dsv4_verify_columns(r, labels, DSV4_VERIFY_MAX_COLUMNS);
    if (!nl) return;
    fprintf(f, "<h2>Per layer: worst gated metric of each probe</h2>\n<table>\n<tr><th>layer</th><th>type</th>");
    for (int j = 0; j < nl; j++) { /* a column label is a probe name, and a file may hold any name */
        fprintf(f, "<th>");
        esc(f, labels[j]);
        fprintf(f, "</th>");
    }
    fprintf(f, "</tr>\n");
    for (int l = 0; l < r->n_layers; l++) {
        char t[32];
        fprintf(f, "<tr><td>%d</td><td>%s</td>", l, dsv4_verify_layer_type(r, l, t, sizeof t));
        for (int j = 0; j < nl; j++) {
            dsv4_verify_cell c;
            dsv4_verify_cell_at(r, l, labels[j], &c);
            if (c.probe < 0) {
                fprintf(f, "<td>.</td>");
                continue;
            }
            char title[DSV4_VERIFY_NAME_MAX + 64], tb[32];
            snprintf(title, sizeof title, "%s: %s (tolerance %s)", r->probes[c.probe].dataset,
                     dsv4_verify_metric_name(c.metric), dsv4_verify_fmt(c.metric, c.tol, tb, sizeof tb));
            td_value(f, c.metric, c.value, c.failed, title);
        }
        fprintf(f, "</tr>\n");
    }
    fprintf(f, "</table>\n");
}

int dsv4_verify_write_html(const dsv4_verify_result *r, const char *path)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int slot = dsv4_tempfile_register(tmp); /* a signal while writing removes it (model/tempfile.c) */
    FILE *f = fopen(tmp, "w");
    if (!f) {
        int rc = dsv4_error(DSV4_ERR_IO, "%s: cannot write the HTML report (its temporary %s): %s", path, tmp,
                            strerror(errno));
        dsv4_tempfile_unregister(slot);
        return rc;
    }
    static const char *const verdict[] = {"PASS", "DIVERGED", "COULD NOT COMPARE"};
    fprintf(f,
            "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n<meta "
            "charset=\"utf-8\"/>\n"
            "<title>dsv4 verify: %s</title>\n<style>\n"
            "body{font-family:sans-serif;margin:20px;max-width:1100px;color:#222}\n"
            "table{border-collapse:collapse;font-size:12px;margin-bottom:16px}\n"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}\n"
            "th{background:#f0f0f0}\ntd.bad{background:#fdd}\n"
            ".verdict0{color:#2e7d32}\n.verdict1,.verdict2{color:#c62828}\ncode{background:#f4f4f4}\n"
            "</style>\n</head>\n<body>\n",
            verdict[r->status]);
    fprintf(f, "<h1>dsv4 verify: <span class=\"verdict%d\">%s</span></h1>\n<table>\n", r->status, verdict[r->status]);
    const dsv4_verify_file *fs[2] = {&r->golden, &r->candidate};
    const char *who[2] = {"golden", "candidate"};
    for (int i = 0; i < 2; i++) {
        fprintf(f, "<tr><th>%s</th><td>", who[i]);
        esc(f, fs[i]->path);
        fprintf(f, "</td><td>");
        esc(f, fs[i]->producer);
        fprintf(f, "</td><td>");
        esc(f, fs[i]->mode);
        fprintf(f, ", prompt %d + decode %d, %d stored positions</td></tr>\n", fs[i]->prompt_len, fs[i]->n_decode,
                fs[i]->n_positions);
    }
    if (r->baseline) {
        fprintf(f, "<tr><th>baseline</th><td>");
        esc(f, r->base.path);
        fprintf(f, "</td><td>");
        esc(f, r->base.producer);
        fprintf(f, "</td><td>");
        esc(f, r->base.mode);
        fprintf(f, ", prompt %d + decode %d, %d stored positions</td></tr>\n", r->base.prompt_len, r->base.n_decode,
                r->base.n_positions);
    }
    fprintf(f, "<tr><th>profile</th><td colspan=\"3\">");
    esc(f, r->profile_name);
    fprintf(f, " (");
    esc(f, r->profile_source);
    fprintf(f, ")%s%s</td></tr>\n</table>\n", r->baseline ? ": selections only; float probes against the baseline" : "",
            r->digests_differ ? "; weights differ (allowed)" : "");
    if (dsv4_verify_profile_note(r)[0]) {
        fprintf(f, "<p>Note: ");
        esc(f, dsv4_verify_profile_note(r));
        fprintf(f, "</p>\n");
    }
    if (r->status == DSV4_VERIFY_ERROR) {
        fprintf(f, "<p class=\"verdict2\">");
        esc(f, r->error);
        fprintf(f, "</p>\n</body>\n</html>\n");
    } else {
        fprintf(f, "<p>%d positions (%d..%d), %d layers, %d probes compared; %ld of %ld checks fail; %.2f s.</p>\n",
                r->n_positions, r->positions[0], r->positions[r->n_positions - 1], r->n_layers, r->n_compared,
                r->n_failed_checks, r->n_checks, r->seconds);
        if (r->first.found) {
            char where[256], v[32], t[32];
            fprintf(f, "<p><b>First divergence</b>: ");
            esc(f, dsv4_verify_where(r, &r->first, where, sizeof where));
            fprintf(f, ": <code>%s = %s %s %s</code>; ", dsv4_verify_metric_name(r->first.metric),
                    dsv4_verify_fmt(r->first.metric, r->first.value, v, sizeof v),
                    dsv4_verify_metric_is_min(r->first.metric) ? "&lt;" : "&gt;",
                    dsv4_verify_fmt(r->first.metric, r->first.tolerance, t, sizeof t));
            esc(f, r->first.detail);
            fprintf(f, "</p>\n");
        }
        if (r->first_tie.found) {
            char sentence[768];
            fprintf(f, "<p><b>After a tie</b>: ");
            esc(f, dsv4_verify_tie_sentence(r, sentence, sizeof sentence));
            fprintf(f, "</p>\n");
        }
        if (r->token_diff_position >= 0)
            fprintf(f,
                    "<p class=\"verdict1\">Tokens differ from position %d (golden %d, candidate %d); %d stored "
                    "positions after it "
                    "are not compared.</p>\n",
                    r->token_diff_position, r->token_golden, r->token_candidate, r->n_positions_not_compared);
        for (int side = 0; side < 2; side++) {
            dsv4_verify_presence which = side ? DSV4_VERIFY_ONLY_CANDIDATE : DSV4_VERIFY_ONLY_GOLDEN;
            int n = side ? r->n_only_candidate : r->n_only_golden;
            if (!n) continue;
            fprintf(f, "<p class=\"verdict1\">Only in the %s (%d, not compared%s):", side ? "candidate" : "golden", n,
                    !side && r->n_required_missing ? "; REQUIRED ones fail" : "");
            for (int i = 0, k = 0; i < r->n_probes; i++)
                if (r->probes[i].presence == which) {
                    fprintf(f, "%s <code>", k++ ? "," : "");
                    esc(f, r->probes[i].dataset);
                    fprintf(f, "</code>%s", r->probes[i].required ? " (REQUIRED)" : "");
                }
            fprintf(f, "</p>\n");
        }
        if (r->n_positions_only_golden) {
            char buf[1200];
            fprintf(f, "<p class=\"verdict1\">Only in the golden: %d of its %d stored positions the candidate did "
                       "not store (not compared): ",
                    r->n_positions_only_golden, r->golden.n_positions);
            esc(f, dsv4_verify_lacks_positions(r, buf, sizeof buf));
            fprintf(f, "</p>\n");
        }
        plot_layers(f, r);
        plot_topk(f, r);
        plot_logits(f, r);
        plot_map(f, r);
        table_baseline(f, r);
        table_layers(f, r);
        table_probes(f, r);
        fprintf(f, "<p>Every number of every row: <code>dsv4 verify --json</code>. How to read this page: "
                   "docs/verify.md.</p>\n"
                   "</body>\n</html>\n");
    }
    int bad = ferror(f) ? (errno ? errno : EIO) : 0; /* the reason: the failed write's, the close's, the rename's */
    if (fclose(f) && !bad) bad = errno ? errno : EIO;
    if (!bad && rename(tmp, path)) bad = errno;
    if (bad) {
        int rc = dsv4_error(DSV4_ERR_IO, "%s: cannot write the HTML report: %s", path, strerror(bad));
        unlink(tmp);
        dsv4_tempfile_unregister(slot);
        return rc;
    }
    dsv4_tempfile_unregister(slot);
    return 0;
}
