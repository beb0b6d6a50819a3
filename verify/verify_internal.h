/* verify_internal.h - what the verify/ sources share: row metrics, probe order, number formatting.
 *
 * (The row metrics themselves are public, in dsv4_verify.h, so tests elsewhere compare through them.)
 */
#ifndef DSV4_VERIFY_INTERNAL_H
#define DSV4_VERIFY_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4/dsv4_verify.h"

/* Rank of a probe name inside its layer in model order; unknown names sort last. Per-entry probes are
 * placed where they are computed (compressed_kv after kv, indexer_kv before indexer_scores). */
int dsv4_verify_probe_order(const char *probe);
/* 1 when probe is a probe name of dump-format.md. */
int dsv4_verify_probe_known(const char *probe);
/* Short column label of a probe for the terminal table ("attn_out" -> "attn_out", "indexer_scores" ->
 * "idx_sc"). */
const char *dsv4_verify_probe_label(const char *probe);

/* "3.2e-06" style (%.1e) in buf, or an integer for count metrics, "-" for NAN, "0" for 0. */
const char *dsv4_verify_fmt(dsv4_verify_metric m, double v, char *buf, size_t n);
/* Compact "3.2e-6" (exponent without padding), for narrow table cells. */
const char *dsv4_verify_fmt_short(dsv4_verify_metric m, double v, char *buf, size_t n);
/* Flat index -> "[i,j]" using the row shape (info->shape[1..]). */
const char *dsv4_verify_fmt_coord(const dsv4_dataset_info *info, int64_t flat, char *buf, size_t n);

/* Value of gate g for row (NAN: not applicable) and whether it fails. */
int dsv4_verify_gate_fails(dsv4_verify_metric m, double value, double tol);

/* Ratio value/tol mapped so that > 1 means failing, for min-type metrics too (worst-of comparisons). */
double dsv4_verify_gate_ratio(dsv4_verify_metric m, double value, double tol);

/* ------------------------------------------------------------------------------------------------ summaries
 * What the text and HTML reports show, computed once from a result (summary.c). */

/* The per-layer table cell of one column label (dsv4_verify_probe_label) at one layer: the probe of that
 * label whose primary gate is worst relative to its tolerance. */
typedef struct dsv4_verify_cell {
    int probe;                 /* index into r->probes, -1 = no such probe at this layer */
    dsv4_verify_metric metric; /* the primary gate's metric */
    double value, tol, ratio;  /* worst value over rows, tolerance, value/tol (> 1 fails) */
    int failed;                /* any row of any probe of the cell failed any gate */
    int nonfinite, structure;  /* a row failed because of NaN/Inf / structure */
    int after_tie_saved;       /* some check of the cell passed only under the after_tie gates */
    int base;                  /* baseline mode: value is the RMS ratio candidate / baseline of the probe shown */
} dsv4_verify_cell;

#define DSV4_VERIFY_MAX_COLUMNS 24
/* Column labels present in r (model order), at most max. */
int dsv4_verify_columns(const dsv4_verify_result *r, const char **labels, int max);
/* layer -1: final/. */
void dsv4_verify_cell_at(const dsv4_verify_result *r, int layer, const char *label, dsv4_verify_cell *cell);

typedef struct dsv4_verify_topk_summary {
    int probe, layer, n_rows;
    double recall_min, recall_mean, jaccard_min, jaccard_mean;
    long accepted, strict;
    int rows_differ; /* rows whose set differs from the golden */
} dsv4_verify_topk_summary;
void dsv4_verify_topk_summarise(const dsv4_verify_result *r, int probe, dsv4_verify_topk_summary *s);

typedef struct dsv4_verify_logits_summary {
    int probe, n_rows; /* probe -1: no logits compared */
    int argmax_equal, argmax_tie, argmax_strict;
    double top5_min, top5_mean, kl_max, kl_mean, rel_l2_max;
    int kl_max_position, rel_l2_max_position;
} dsv4_verify_logits_summary;
void dsv4_verify_logits_summarise(const dsv4_verify_result *r, dsv4_verify_logits_summary *s);

/* Short type of a layer, "csa/moe", "swa/hash" ("?" parts when unknown). */
const char *dsv4_verify_layer_type(const dsv4_verify_result *r, int layer, char *buf, size_t n);
/* "position 17, layer 3 (csa/moe), attn_out" / "position 20, tokens" / "entry 4 (closes position 19), ..." */
const char *dsv4_verify_where(const dsv4_verify_result *r, const dsv4_verify_divergence *d, char *buf, size_t n);

/* Probes that failed a gate: rows, or (baseline mode) the probe's baseline statistic. */
int dsv4_verify_failing_probes(const dsv4_verify_result *r);
/* Baseline mode: one sentence on the gates and on the margins (the largest RMS ratio and scale difference in
 * standard errors, with their probes). "" outside baseline mode. */
const char *dsv4_verify_base_sentence(const dsv4_verify_result *r, char *buf, size_t n);
/* Without a baseline, for the bf16 profile: that its tolerances are fixed numbers calibrated on the shipped golden
 * sets, and that --baseline judges other models. "" otherwise. */
const char *dsv4_verify_profile_note(const dsv4_verify_result *r);

/* The datasets only one file holds (which: ONLY_GOLDEN or ONLY_CANDIDATE), grouped by probe: "kv (layers 0-3),
 * indexer_scores (layers 1, 3; REQUIRED), final/norm" (REQUIRED: named by --require); cut with "..." to fit. */
const char *dsv4_verify_lacks_datasets(const dsv4_verify_result *r, dsv4_verify_presence which, char *buf, size_t n);
/* The golden's positions the candidate does not store, as ranges "0-19, 25". */
const char *dsv4_verify_lacks_positions(const dsv4_verify_result *r, char *buf, size_t n);

/* "position 2136, layer 1 (csa/moe), topk_idx" for r->first_tie (which must be found). */
const char *dsv4_verify_tie_where(const dsv4_verify_result *r, char *buf, size_t n);
/* One sentence on the after_tie rule for the reports: where the first tie-accepted difference is (or that it
 * was given), and how many checks used / passed only thanks to the after_tie gates. "" when no tie. */
const char *dsv4_verify_tie_sentence(const dsv4_verify_result *r, char *buf, size_t n);
/* Length of the valid UTF-8 sequence at s (1-4 bytes), or 0 when the byte at s does not start one. The reports
 * write U+FFFD for such a byte: dataset names and paths are arbitrary bytes, and a message cut by snprintf may
 * end inside a character. */
int dsv4_verify_utf8_len(const char *s);

#endif
