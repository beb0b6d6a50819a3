/* dsv4_verify.h - compare two dsv4-dump/1 files (golden vs candidate) probe by probe, layer by layer.
 *
 * dsv4_verify_run() opens both dumps, checks they can be compared (schema, weights_digest, common positions and
 * probes), streams every common probe in row slices and fills a dsv4_verify_result: per (probe, position) the
 * numbers of docs/verify.md, judged against a tolerance profile (verify/profiles/<name>.json, overridable per
 * probe). The result is plain data the caller reads directly; the writers turn it into the terminal report,
 * JSON and a self-contained HTML page.
 *
 * Ordering that decides "first divergence" (model order, position-major): a failure at an earlier position
 * comes first; within a position, layer 0..L-1 then final/; within a layer, the probe order of
 * dump-format.md with the per-entry probes placed where they are computed (compressed_kv after kv, indexer_kv
 * before indexer_scores). A per-entry row w belongs to the position that closes it, (w+1)*ratio - 1.
 *
 * Gates that no profile can turn off: a NaN/Inf in either file where the other is not the same non-finite
 * value ("nonfinite"), and structural differences (row shape, missing entry rows: "structure").
 */
#ifndef DSV4_VERIFY_H
#define DSV4_VERIFY_H

#include <stdint.h>
#include <stdio.h>

#include "dsv4.h"
#include "dsv4_dump.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_VERIFY_JSON_SCHEMA "dsv4-verify/1"

/* Outcome; also the exit status of `dsv4 verify`. */
enum dsv4_verify_status {
    DSV4_VERIFY_PASS = 0,     /* every gated metric within tolerance */
    DSV4_VERIFY_DIVERGED = 1, /* at least one gate broken (or the token streams differ after the prompt) */
    DSV4_VERIFY_ERROR = 2,    /* could not compare: unreadable, wrong schema, other weights, nothing in common */
};

/* Every number the verifier computes for one row. "max" metrics pass when value <= tolerance, "min" metrics
 * (marked) when value >= tolerance. A metric that does not apply to a row is NAN there. */
typedef enum dsv4_verify_metric {
    DSV4_METRIC_MAX_ABS,   /* max |c - g| over pairs where both are finite */
    DSV4_METRIC_REL_L2,    /* ||c - g|| / ||g|| (finite pairs; inf if ||g|| = 0 < ||c - g||) */
    DSV4_METRIC_NMSE,      /* mse(c, g) / mse(g, 0) = rel_l2^2 (ggml's test-backend-ops measure) */
    DSV4_METRIC_COSINE,    /* min: <g,c> / (|g||c|) */
    DSV4_METRIC_NONFINITE, /* elements where g and c are not both finite and not the same +-inf */
    DSV4_METRIC_STRICT,    /* topk_idx: picks that break the tie rule, plus |size(C) - size(G)| */
    DSV4_METRIC_ACCEPTED,  /* topk_idx: picks not in G but tie-acceptable (informative) */
    DSV4_METRIC_RECALL,    /* min: topk_idx / router_ids: |G n C| / |G| */
    DSV4_METRIC_JACCARD,   /* min: |G n C| / |G u C| */
    DSV4_METRIC_MISMATCH,  /* router_ids: max(|G \ C|, |C \ G|) + repeated ids + ||G| - |C||; other int probes:
                            * differing elements */
    DSV4_METRIC_ARGMAX,    /* logits: 1 when argmax differs and is not within the tie tolerance, else 0 */
    DSV4_METRIC_TOP5,      /* min: logits: |top5(g) n top5(c)| / 5 */
    DSV4_METRIC_KL,        /* logits: KL(softmax g || softmax c) in nats, computed in double */
    DSV4_METRIC_STRUCTURE, /* 1 when a row cannot be compared (shape differs, entry row missing) */
    DSV4_METRIC_SCALE,     /* <c - g, g> / <g, g>: the row's least-squares scale error (c ~ (1 + scale) g); signed,
                            * informative per row, what baseline mode's bias gate pools (docs/verify.md) */
    DSV4_METRIC_COUNT
} dsv4_verify_metric;

const char *dsv4_verify_metric_name(dsv4_verify_metric m); /* "rel_l2", ... (the names profiles use) */
int dsv4_verify_metric_from_name(const char *name);        /* a dsv4_verify_metric or -1 */
int dsv4_verify_metric_is_min(dsv4_verify_metric m);       /* 1 for min-type metrics (cosine, recall, ...) */

/* How a probe is compared (chosen from its name and dtype). */
typedef enum dsv4_verify_kind {
    DSV4_VERIFY_KIND_DENSE,          /* f32 per-position probe */
    DSV4_VERIFY_KIND_ENTRIES,        /* f32 per-entry probe (compressed_kv, indexer_kv), row = entry */
    DSV4_VERIFY_KIND_TOPK,           /* topk_idx: sets, tie-aware with the golden indexer_scores */
    DSV4_VERIFY_KIND_ROUTER_IDS,     /* router_ids: sets */
    DSV4_VERIFY_KIND_ROUTER_WEIGHTS, /* router_weights: paired by expert id through router_ids */
    DSV4_VERIFY_KIND_LOGITS,         /* final/logits: dense + argmax, top-5, KL */
    DSV4_VERIFY_KIND_INT,            /* any other i32 probe: exact */
    DSV4_VERIFY_KIND_COUNT
} dsv4_verify_kind;

typedef enum dsv4_verify_presence {
    DSV4_VERIFY_IN_BOTH,
    DSV4_VERIFY_ONLY_GOLDEN,
    DSV4_VERIFY_ONLY_CANDIDATE,
} dsv4_verify_presence;

typedef struct dsv4_verify_gate {
    dsv4_verify_metric metric;
    double tol;
} dsv4_verify_gate;

#define DSV4_VERIFY_MAX_GATES 8

/* One compared row: a position of a per-position probe, or an entry of a per-entry probe. */
/* Bytes of a dataset name the verifier holds, the terminating 0 included: a dataset with a longer name (another
 * tool's extra probe, say) is a structure failure "name too long", not compared. */
#define DSV4_VERIFY_NAME_MAX 256

typedef struct dsv4_verify_row {
    int position; /* the position (per-entry: the position closing the entry; -1 unknown ratio) */
    int entry;    /* per-entry row index, else -1 */
    double v[DSV4_METRIC_COUNT];
    int64_t max_abs_at;     /* flat index inside the row of the largest |c - g|, -1 none */
    int64_t nonfinite_at;   /* flat index of the first non-finite mismatch, -1 none */
    int argmax_g, argmax_c; /* logits only, else -1 */
    unsigned failed;        /* bit m set: metric m broke its gate on this row */
    int after_tie;          /* 1: the row comes after the first tie-accepted top-k difference (model order) and
                             * was judged with the profile's after_tie gates */
    unsigned after_tie_saved; /* bit m set: metric m breaks its normal gate and passed only under after_tie */
    double g_norm2;         /* dense rows: ||g||^2 over the finite pairs (the weight of the row's scale), else 0 */
} dsv4_verify_row;

/* Baseline mode (dsv4_verify_options.baseline, docs/verify.md "Baseline mode"): a float probe of a layer judged over
 * all its compared rows against a precision-matched baseline's errors on the same rows, instead of fixed gates. */
typedef struct dsv4_verify_base_stat {
    int n_rows;            /* rows compared in both runs (0: the probe has no baseline statistic) */
    double cand_rms;       /* RMS over the rows of the candidate's rel_l2 against the golden */
    double base_rms;       /* the same for the baseline */
    double rms_tol;        /* the gate on cand_rms: RMS_FACTOR * base_rms + RMS_FLOOR (the constants below) */
    double cand_scale, base_scale; /* pooled scale error sum(<c - g, g>) / sum(<g, g>) of each run */
    double scale_se;       /* standard error of cand_scale - base_scale from both runs' row scatter (NAN: too few
                            * rows) */
    double scale_tol;      /* the gate on |cand_scale - base_scale|: Z * scale_se + floor; NAN when not gated */
    unsigned failed;       /* bit 0: the rms gate, bit 1: the scale gate */
    int worst_row;         /* row of p->rows where the candidate's rel_l2 exceeds the baseline's the most, -1 none */
    double worst_cand, worst_base; /* the two rel_l2 values of that row */
} dsv4_verify_base_stat;

/* The baseline gates (docs/verify.md "Baseline mode" says how they were chosen). */
#define DSV4_VERIFY_BASE_RMS_FACTOR 2.0  /* candidate RMS error at most 2x the baseline's ... */
#define DSV4_VERIFY_BASE_RMS_FLOOR 1e-4  /* ... + 1e-4 (fp32-level, for probes the baseline computes exactly) */
#define DSV4_VERIFY_BASE_SCALE_Z 6.0     /* |scale difference| at most 6 standard errors ... */
#define DSV4_VERIFY_BASE_SCALE_FLOOR 1e-4 /* ... + 1e-4 */
#define DSV4_VERIFY_BASE_SCALE_MIN_ROWS 8 /* the scale gate needs this many rows to estimate its standard error */

typedef struct dsv4_verify_probe {
    char dataset[DSV4_VERIFY_NAME_MAX]; /* "layers/3/attn_out", "final/logits"; longer names are not compared */
    char probe[DSV4_VERIFY_NAME_MAX];   /* "attn_out", "logits" */
    int layer;        /* decoder layer, or -1 for final/ */
    int order;        /* rank inside its layer in model order (docs/verify.md) */
    dsv4_verify_kind kind;
    dsv4_verify_presence presence;
    int required;     /* only in the golden and named by options.require: a structure failure, not a listing */
    dsv4_dataset_info golden_info, candidate_info; /* zeroed for the missing side */
    int n_gates;
    dsv4_verify_gate gates[DSV4_VERIFY_MAX_GATES]; /* the profile's gates; gates[0] is the primary metric */
    double tie_abs, tie_rel; /* tie tolerance (topk_idx, logits argmax): tie_abs + tie_rel * max|golden row| */
    /* the same gates (same metrics, same order) as the profile's after_tie section sets them: what rows after
     * the first tie-accepted top-k difference are judged with; equal to gates[] when the profile has none */
    dsv4_verify_gate after_gates[DSV4_VERIFY_MAX_GATES];
    double after_tie_abs, after_tie_rel;
    int n_after_tie_rows;    /* rows judged with after_gates */
    long n_after_tie_saved;  /* (row, gate) checks that fail gates[] and passed only under after_gates */
    dsv4_verify_row *rows;   /* [n_rows], owned by the result */
    int n_rows;
    double worst[DSV4_METRIC_COUNT];  /* worst value over rows (max, or min for min-type); NAN if never set */
    int worst_row[DSV4_METRIC_COUNT]; /* row index of worst[m], -1 */
    double mean[DSV4_METRIC_COUNT];   /* mean over rows where defined, NAN otherwise */
    int n_failed_rows;
    int first_failed_row; /* in model order (rows are ascending), -1 none */
    char note[320];       /* a remark for the reader, e.g. why every top-k mismatch is strict */
    double row_scale;     /* indexer_scores: the layer's score scale that floors each row's norm (rel_l2), else 0 */
    dsv4_verify_base_stat base; /* baseline mode: the probe's statistic (base.n_rows 0: none) */
} dsv4_verify_probe;

/* The first (position, layer, probe) that breaks its tolerance. */
typedef struct dsv4_verify_divergence {
    int found;
    int position;     /* -1 when not tied to a position */
    int layer;        /* decoder layer, -1 final/ or tokens */
    int entry;        /* per-entry row, else -1 */
    int probe_index;  /* into result->probes, -1 for the token stream */
    char dataset[DSV4_VERIFY_NAME_MAX]; /* "layers/3/attn_out", or "tokens" */
    dsv4_verify_metric metric;
    double value, tolerance;
    char detail[320]; /* e.g. "max |d| 1.2e-02 at [2,311]" */
} dsv4_verify_divergence;

/* The first tie-accepted top-k difference in model order (model-spec 13): a candidate pick outside the golden
 * set whose golden score is within the tie tolerance of the k-th. A legitimate difference, but it changes that
 * token's attention output and everything computed from it, so every comparison after it in model order is
 * judged with the profile's after_tie gates (docs/verify.md "After a tie"). */
typedef struct dsv4_verify_tie {
    int found;
    int position, layer;
    int probe_index;  /* into result->probes, -1 when given and the files lack that dataset */
    char dataset[DSV4_VERIFY_NAME_MAX]; /* "layers/1/topk_idx" */
    int accepted;     /* tie-accepted picks in that row (0 when given) */
    int given;        /* 1: from dsv4_verify_options.tie_at_* (established by another comparison), not seen here */
} dsv4_verify_tie;

typedef struct dsv4_verify_file {
    char *path, *producer, *weights_digest, *mode; /* owned; "" when absent */
    int prompt_len, n_decode, n_tokens, n_positions;
} dsv4_verify_file;

typedef struct dsv4_verify_result {
    int status;      /* enum dsv4_verify_status */
    char error[512]; /* why status is DSV4_VERIFY_ERROR */
    dsv4_verify_file golden, candidate;
    char profile_name[64];
    char profile_source[512];    /* the file it was read from */
    int digests_differ;          /* 1 when allowed by the option and they differ */
    int n_layers;                /* from golden config (or the datasets when the config cannot be read) */
    char (*layer_attention)[12]; /* [n_layers] "sliding"/"csa"/"hca"/"?" */
    char (*layer_mlp)[12];       /* [n_layers] "hash_moe"/"moe"/"?" */
    int *positions;              /* [n_positions] compared positions, ascending */
    int n_positions;
    int token_diff_position;           /* first position where /tokens differ, -1 none */
    int token_golden, token_candidate; /* the tokens there */
    int n_positions_not_compared;      /* common stored positions dropped because the inputs differ */
    /* positions (within --positions) that one file stores and the other does not: never compared, never failed;
     * the golden's are listed (a partial candidate, docs/dump-format.md "Partial dumps") */
    int *positions_only_golden;        /* [n_positions_only_golden] ascending */
    int n_positions_only_golden, n_positions_only_candidate;
    dsv4_verify_probe *probes;         /* [n_probes] in model order, both-file and one-file probes */
    int n_probes;
    int n_compared; /* probes present in both */
    int n_only_golden, n_only_candidate;
    int n_required_missing;         /* of n_only_golden: named by options.require (each a failed check) */
    long n_checks, n_failed_checks; /* (row, gate) pairs evaluated / broken */
    dsv4_verify_divergence first;
    dsv4_verify_tie first_tie;   /* found = 0: no tie-accepted difference; after_tie gates never used */
    int profile_after_tie;       /* the profile has an after_tie section */
    long n_after_tie_checks;     /* (row, gate) checks judged with the after_tie gates */
    long n_after_tie_saved;      /* of those, checks that fail the normal gate: passed only thanks to after_tie */
    double seconds;       /* wall time of the comparison */
    long long bytes_read; /* uncompressed bytes read from both files */
    /* baseline mode (options.baseline): the baseline file; base_checks/base_failed count the probes' gates */
    int baseline;
    dsv4_verify_file base;
    long base_checks, base_failed;
} dsv4_verify_result;

typedef struct dsv4_verify_options {
    const char *profile;    /* "fp32", "bf16" or a JSON file; NULL = "fp32" */
    const char *const *tol; /* [n_tol] "PROBE=METRIC:VALUE" overrides, applied in order */
    int n_tol;
    const char *probes;     /* comma-separated fnmatch globs on the dataset or probe name; NULL = all */
    int layer_lo, layer_hi; /* inclusive; -1 = open. final/ counts as layer n_layers */
    int pos_lo, pos_hi;     /* inclusive; -1 = open */
    int allow_different_weights;
    /* A tie-accepted top-k difference established by another comparison (e.g. the same candidate against a
     * reference that stores every position) at (position, layer): comparisons after it use the after_tie gates
     * as if it had been seen here; the earlier of it and one seen in the files counts. -1 = none. */
    int tie_at_position, tie_at_layer;
    /* Called as the files are read, may be NULL (the library prints nothing itself): done of total bytes, where
     * total is every byte the run will read (the top-k tie scan and, for a filtered run, its unfiltered top-k pass
     * included; the comparison's own part is result->bytes_read), fixed from the first call on. done never goes
     * down and the last call has done == total; no call when the run stops before it knows what it will compare
     * (an unreadable file, say). Called about twice per 8 MB block read, so it should return quickly. */
    dsv4_progress_fn progress;
    void *progress_ctx;
    /* Baseline mode (docs/verify.md "Baseline mode"): a precision-matched implementation of the same tokens and
     * weights (normally `dsv4 run --path ref-cpu --emulate bf16 --follow GOLDEN`). Every float probe of a layer is
     * then judged over its positions against the baseline's error on the same rows (the base_stat gates) instead
     * of the profile's fixed tolerances; selections (topk_idx, router_ids, logits argmax), non-finite values and
     * structure keep their rules. The first divergence is layer-major. NULL: off. */
    const char *baseline;
    /* The golden the baseline is compared with, when it is not the candidate's (layer-local replay: each run is
     * judged against the reference's replay of its own state, docs/verify.md "Layer-local replay"). It must hold the
     * golden's tokens and positions. NULL: the golden. */
    const char *baseline_golden;
    /* Probes the candidate must hold (comma-separated fnmatch globs on dataset or probe names, e.g.
     * "topk_idx,router_ids,final/logits"): a golden dataset matching one that the candidate lacks is a structure
     * failure (status 1, placed at the first compared position in model order) instead of a listed omission. A glob
     * that matches no dataset of the golden is an error (status 2: a typo would require nothing). Applies to the
     * probes that --probes/--layers select. NULL: a candidate may omit any probe (docs/dump-format.md "Partial
     * dumps"). */
    const char *require;
} dsv4_verify_options;

void dsv4_verify_options_init(dsv4_verify_options *o);

/* Compare. Returns 0 and sets *out whenever a result exists (also for status DSV4_VERIFY_ERROR, with the
 * reason in result->error); a negative DSV4_ERR_* only when no result could be built (bad options, memory).
 * The caller frees *out with dsv4_verify_result_free. */
int dsv4_verify_run(const char *golden_path, const char *candidate_path, const dsv4_verify_options *o,
                    dsv4_verify_result **out);
void dsv4_verify_result_free(dsv4_verify_result *r);

/* Reports. text: one screen (verdict, first divergence, per-layer table, top-k, logits, one-file probes);
 * color = 1 adds ANSI colours. json/html write a file (temporary name, renamed when complete). */
int dsv4_verify_write_text(const dsv4_verify_result *r, FILE *f, int color);
int dsv4_verify_write_json(const dsv4_verify_result *r, const char *path);
int dsv4_verify_write_html(const dsv4_verify_result *r, const char *path);

/* ------------------------------------------------------------------------------------------------ row metrics
 * The comparisons themselves (style rule 16: one place), for the verifier and for any test that compares two
 * arrays. Each reads one golden row g and one candidate row c and fills a dsv4_verify_row; clear the row first
 * (v[] all NAN: a metric that does not apply stays NAN and is never gated). Accumulation is in double. */

/* Reset a row: v[] = NAN, indices -1, failed = 0. */
void dsv4_verify_row_clear(dsv4_verify_row *row, int position, int entry);

/* Dense f32 rows g, c [n]: max_abs (+ index), rel_l2, nmse, cosine, scale, nonfinite (+ first index), g_norm2.
 * Pairs where g == c == +-inf (e.g. the -inf of invisible indexer entries) are equal and skipped. */
void dsv4_verify_dense_f32(const float *g, const float *c, int64_t n, dsv4_verify_row *row);
/* indexer_scores rows g, c [n]: the dense metrics, with rel_l2 (and nmse) taken against the larger of ||g|| and
 * sqrt(finite pairs) * scale, scale > 0 being the layer's typical score (docs/verify.md "indexer_scores"): a row
 * of one or two entries whose head sum cancels to near 0 selects every entry, and its relative error means
 * nothing. scale <= 0: plain dense metrics. */
void dsv4_verify_scores_f32(const float *g, const float *c, int64_t n, double scale, dsv4_verify_row *row);

/* topk_idx rows g, c [k] i32 (-1 = no pick). gscores [n_scores] f32: the golden indexer_scores row, or NULL
 * (then every pick outside G is strict). Fills strict, accepted, recall, jaccard. */
void dsv4_verify_topk(const int32_t *g, const int32_t *c, int k, const float *gscores, int64_t n_scores, double tie_abs,
                      double tie_rel, dsv4_verify_row *row);
/* The tie threshold used by dsv4_verify_topk for a golden picks/scores row: entries scoring >= *kth - *tol
 * are acceptable. Returns the number of valid golden picks. */
int dsv4_verify_topk_threshold(const int32_t *g, int k, const float *gscores, int64_t n_scores, double tie_abs,
                               double tie_rel, double *kth, double *tol);

/* router_ids rows [k] i32 as sets: mismatch, recall, jaccard. */
void dsv4_verify_router_ids(const int32_t *g, const int32_t *c, int k, dsv4_verify_row *row);
/* router_weights rows [k] paired by expert id (gid/cid: the router_ids rows, NULL = pair by position):
 * dense metrics over the matched pairs. When the sets differ, each side is renormalised over the common experts
 * first (each path normalised over its own set, so the raw weights differ by the swapped expert's share). */
void dsv4_verify_router_weights(const float *gw, const float *cw, const int32_t *gid, const int32_t *cid, int k,
                                dsv4_verify_row *row);
/* Logits rows [V]: dense metrics + argmax (tie-aware), top-5 overlap, KL(softmax g || softmax c). */
void dsv4_verify_logits(const float *g, const float *c, int64_t V, double tie_abs, double tie_rel,
                        dsv4_verify_row *row);
/* The argmax metric alone of a row dsv4_verify_logits filled (its argmax_g / argmax_c), for another tie
 * tolerance: the other logits metrics do not depend on it. */
void dsv4_verify_logits_argmax(const float *g, int64_t V, double tie_abs, double tie_rel, dsv4_verify_row *row);
/* Other i32 rows [n]: mismatch = differing elements (first in max_abs_at). */
void dsv4_verify_int(const int32_t *g, const int32_t *c, int64_t n, dsv4_verify_row *row);

/* ------------------------------------------------------------------------------------------------ profiles */
/* A tolerance profile: per probe name ("attn_out" = every layer, "layers/3/attn_out" = one layer,
 * "final/logits", "default" = any probe not named) a list of gates and the tie tolerances. */
typedef struct dsv4_verify_profile dsv4_verify_profile;

/* name_or_path: "fp32" / "bf16" (verify/profiles/<name>.json, searched in $DSV4_PROFILE_DIR, next to the
 * executable's source tree, then the source tree this library was built from) or a path to a JSON file. */
int dsv4_verify_profile_load(const char *name_or_path, dsv4_verify_profile **out);
void dsv4_verify_profile_free(dsv4_verify_profile *p);
const char *dsv4_verify_profile_name(const dsv4_verify_profile *p);
const char *dsv4_verify_profile_source(const dsv4_verify_profile *p);
/* "PROBE=METRIC:VALUE": set (or add) a gate, or tie_abs/tie_rel, for PROBE (same keys as the file). */
int dsv4_verify_profile_override(dsv4_verify_profile *p, const char *spec);
/* The gates and tie tolerances that apply to a dataset (most specific key wins: dataset, probe, default). */
int dsv4_verify_profile_lookup(const dsv4_verify_profile *p, const char *dataset, const char *probe,
                               dsv4_verify_gate gates[DSV4_VERIFY_MAX_GATES], int *n_gates, double *tie_abs,
                               double *tie_rel);
/* The after_tie section: 1 when the profile has one. */
int dsv4_verify_profile_has_after_tie(const dsv4_verify_profile *p);
/* The gates that apply to a dataset after a tie: the normal gates[n_gates] (and tie tolerances) in place, each
 * tolerance replaced by the after_tie entry's value for that metric (entry: dataset, probe, then "default" of
 * the after_tie section) when it is looser. A metric the after_tie entry does not name keeps its gate; no
 * gate is added or removed. No after_tie section: nothing changes. */
void dsv4_verify_profile_after_tie(const dsv4_verify_profile *p, const char *dataset, const char *probe,
                                   dsv4_verify_gate *gates, int n_gates, double *tie_abs, double *tie_rel);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_VERIFY_H */
