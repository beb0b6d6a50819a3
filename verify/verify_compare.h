/* verify_compare.h - the comparison context shared by compare.c (setup, judging) and compare_probe.c (the
 * per-kind streaming loops). Internal to verify/.
 */
#ifndef DSV4_VERIFY_COMPARE_H
#define DSV4_VERIFY_COMPARE_H

#include "verify_internal.h"

/* How far dsv4_verify_run is, over all its passes (a filtered run makes two: every top-k row first). The total is
 * planned from the datasets' shapes before anything is read: what each pass will read (dsv4_cmp_probe_plan). */
typedef struct dsv4_cmp_progress {
    dsv4_progress_fn fn;             /* NULL: nothing is planned or counted */
    void *ctx;
    const dsv4_verify_options *next; /* the pass after this one, whose plan joins the total; NULL none */
    double total;                    /* every pass's planned bytes; set by the first pass that plans */
    double base;                     /* planned bytes of the passes before the current one */
    double done;                     /* the last value reported */
    long calls;                      /* calls made; a call repeating done is left out */
    int planned;
} dsv4_cmp_progress;

typedef struct dsv4_cmp_ctx {
    dsv4_verify_result *r;
    const dsv4_verify_options *o;
    dsv4_verify_profile *prof;
    dsv4_dump *g, *c;       /* both open */
    const dsv4_config *cfg; /* golden config, NULL when config_json could not be parsed */
    int *grow, *crow;       /* [r->n_positions] the file rows of the compared positions */
    int pos_limit;          /* positions >= pos_limit are not compared (inputs differ); INT_MAX none */
    int entry_limit;        /* entries closing at >= entry_limit are not compared */
    void *scratch;          /* span buffer for non-contiguous row sets */
    size_t scratch_cap;
    int scan;               /* 1 while looking for the first tie (top-k probes only): rows are computed with
                             * the normal tie tolerance and not judged; dsv4_cmp_judge only notes ties */
    int scan_hit;           /* the probe being scanned has a tie-accepted row (its later rows cannot be first) */
    int tie_only;           /* this pass only finds the first tie (a filtered run's first pass): no probe is
                             * compared after the scan */
    const double *normal_tie_v; /* while judging an after-tie top-k or logits row: its metrics under the normal
                                 * tie tolerance (the judge counts what passed only thanks to the after_tie one) */
    dsv4_cmp_progress *prog;    /* NULL: no progress reported */
    int pass_planned;           /* this pass has added its plan: pass_at..pass_end are its bytes */
    double pass_at, pass_end;   /* planned bytes up to the probe being read / up to the end of this pass */
    double probe_plan, probe_read; /* the probe being read: its planned bytes, what it has read so far */
} dsv4_cmp_ctx;

/* 1 when a row of probe p at (position, entry) comes after the first tie-accepted top-k difference in model
 * order, and so is judged with p's after_tie gates and tie tolerance. 0 while scanning. */
int dsv4_cmp_after_tie(const dsv4_cmp_ctx *x, const dsv4_verify_probe *p, int position, int entry);

/* Stream probe p (present in both files) and judge every row. Fills p->rows. */
int dsv4_cmp_probe(dsv4_cmp_ctx *x, dsv4_verify_probe *p);

/* Judge row p->rows[ri] against p's gates (and the non-finite/structure gates), count the checks, and
 * update the first divergence. g/c/aux: the row data (for the divergence's detail line), may be NULL. */
void dsv4_cmp_judge(dsv4_cmp_ctx *x, dsv4_verify_probe *p, int ri, const void *g, const void *c, const void *aux_g,
                    const void *aux_c, int64_t aux_n);

/* The bytes dsv4_cmp_probe(x, p) reads (the scan of a top-k probe may stop short of them: at its first tie). */
double dsv4_cmp_probe_plan(const dsv4_cmp_ctx *x, const dsv4_verify_probe *p);
/* compare_progress.c. Each does nothing until the pass has planned (x->pass_planned, only with a callback). */
/* Report done (clamped to [last reported, total]) to the callback, unless it is the last value reported. */
void dsv4_cmp_progress_report(dsv4_cmp_ctx *x, double done);
/* Count bytes just read by the probe being compared and report the progress. */
void dsv4_cmp_progress_read(dsv4_cmp_ctx *x, double bytes);
/* Around dsv4_cmp_probe: the probe's plan; at its end the count is at its plan, whatever it read. */
void dsv4_cmp_progress_probe_begin(dsv4_cmp_ctx *x, const dsv4_verify_probe *p);
void dsv4_cmp_progress_probe_end(dsv4_cmp_ctx *x);
/* What a pass whose probes are built reads: the tie scan of its top-k probes, then every probe in both files
 * (the scan alone in a tie_only pass). */
double dsv4_cmp_pass_plan(const dsv4_cmp_ctx *x);

/* dsv4_verify_run without baseline mode's second comparison (compare.c): one golden vs candidate comparison; with
 * o->baseline set, the float probes' gates are left to the caller and the first divergence is layer-major. */
int dsv4_cmp_run(const char *golden_path, const char *candidate_path, const dsv4_verify_options *o,
                 dsv4_verify_result **out);
/* baseline.c: dsv4_verify_run with o->baseline set. */
int dsv4_verify_baseline_run(const char *golden_path, const char *candidate_path, const dsv4_verify_options *o,
                             dsv4_verify_result **out);

/* A malloc'd copy of s ("" for NULL); NULL when out of memory. */
char *dsv4_cmp_strdup(const char *s);

/* A new row for p (grows p->rows); NULL when out of memory. */
dsv4_verify_row *dsv4_cmp_new_row(dsv4_verify_probe *p, int position, int entry);
/* Elements in one row of a dataset: the product of its shape past the first dimension. */
size_t dsv4_cmp_row_elems(const dsv4_dataset_info *info);

/* Read rows[0..n) (ascending file rows) of dataset name into dst [n, row_elems]; reads the span
 * rows[0]..rows[n-1] once through the scratch buffer when the rows are not contiguous. */
int dsv4_cmp_read_rows(dsv4_cmp_ctx *x, const dsv4_dump *d, const char *name, const int *rows, int n, size_t row_bytes,
                       void *dst);

#endif
