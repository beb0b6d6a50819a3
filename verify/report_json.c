/* report_json.c - --json: every number of the result (schema dsv4-verify/1, docs/verify.md "JSON").
 *
 * JSON has no NaN or infinity: a metric that does not apply to a row is left out of that row, and an
 * infinite value (rel_l2 of a zero golden row against a non-zero candidate) is written as the string "inf".
 * The file is written under a temporary name and renamed, like the dumps; the temporary is registered so that
 * SIGINT/SIGTERM remove it (model/tempfile.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "verify_internal.h"

static json_t *num(double v)
{
    if (isnan(v)) return json_string("nan");
    if (isinf(v)) return json_string(v > 0 ? "inf" : "-inf");
    return json_real(v);
}

static json_t *coord(const dsv4_dataset_info *info, int64_t flat)
{
    json_t *a = json_array();
    int nd = info->ndim > 1 ? info->ndim - 1 : 1;
    int64_t idx[4] = {0, 0, 0, 0};
    for (int d = nd - 1; d >= 0; d--) {
        int64_t ext = info->ndim > 1 ? info->shape[d + 1] : 1;
        if (d == 0 || ext <= 0)
            idx[d] = flat;
        else {
            idx[d] = flat % ext;
            flat /= ext;
        }
    }
    for (int d = 0; d < nd; d++) json_array_append_new(a, json_integer(idx[d]));
    return a;
}

/* A JSON string of text from the files or the command line (names, paths, attributes, messages that quote
 * them): jansson refuses invalid UTF-8, and json_pack then drops the whole object, so each byte that does not
 * start a valid sequence becomes U+FFFD. */
static json_t *text(const char *s)
{
    if (!s) s = "";
    json_t *j = json_string(s);
    if (j) return j;
    size_t n = strlen(s), len = 0;
    char *clean = malloc(3 * n + 1);
    if (!clean) return NULL;
    for (size_t i = 0; i < n;) {
        int k = dsv4_verify_utf8_len(s + i);
        if (k > 0) {
            memcpy(clean + len, s + i, (size_t)k);
            len += (size_t)k, i += (size_t)k;
        } else {
            memcpy(clean + len, "\xef\xbf\xbd", 3);
            len += 3, i++;
        }
    }
    clean[len] = 0;
    j = json_string(clean);
    free(clean);
    return j;
}

static json_t *file_obj(const dsv4_verify_file *f)
{
    return json_pack("{s:o, s:o, s:o, s:o, s:i, s:i, s:i, s:i}", "path", text(f->path), "producer", text(f->producer),
                     "weights_digest", text(f->weights_digest), "mode", text(f->mode), "prompt_len", f->prompt_len,
                     "n_decode", f->n_decode, "n_tokens", f->n_tokens, "n_positions", f->n_positions);
}

static json_t *shape_obj(const dsv4_dataset_info *info)
{
    if (info->ndim == 0) return json_null();
    json_t *a = json_array();
    for (int d = 0; d < info->ndim; d++) json_array_append_new(a, json_integer(info->shape[d]));
    return json_pack("{s:s, s:o}", "dtype", dsv4_dtype_name(info->dtype), "shape", a);
}

static const char *const kind_names[] = {"dense", "entries", "topk", "router_ids", "router_weights", "logits", "int"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == DSV4_VERIFY_KIND_COUNT, "one name per kind");

static json_t *row_obj(const dsv4_verify_probe *p, const dsv4_verify_row *row)
{
    json_t *o = json_object();
    json_object_set_new(o, "position", json_integer(row->position));
    if (row->entry >= 0) json_object_set_new(o, "entry", json_integer(row->entry));
    for (int m = 0; m < DSV4_METRIC_COUNT; m++)
        if (!isnan(row->v[m])) json_object_set_new(o, dsv4_verify_metric_name(m), num(row->v[m]));
    if (row->max_abs_at >= 0)
        json_object_set_new(o, p->kind == DSV4_VERIFY_KIND_INT ? "mismatch_at" : "max_abs_at",
                            coord(&p->golden_info, row->max_abs_at));
    if (row->nonfinite_at >= 0) json_object_set_new(o, "nonfinite_at", coord(&p->golden_info, row->nonfinite_at));
    if (row->argmax_g >= 0) {
        json_object_set_new(o, "argmax_golden", json_integer(row->argmax_g));
        json_object_set_new(o, "argmax_candidate", json_integer(row->argmax_c));
    }
    if (row->after_tie) json_object_set_new(o, "after_tie", json_true());
    if (row->after_tie_saved) {
        json_t *sv = json_array();
        for (int m = 0; m < DSV4_METRIC_COUNT; m++)
            if (row->after_tie_saved >> m & 1u) json_array_append_new(sv, json_string(dsv4_verify_metric_name(m)));
        json_object_set_new(o, "passed_only_after_tie", sv);
    }
    json_object_set_new(o, "pass", json_boolean(!row->failed));
    if (row->failed) {
        json_t *fl = json_array();
        for (int m = 0; m < DSV4_METRIC_COUNT; m++)
            if (row->failed >> m & 1u) json_array_append_new(fl, json_string(dsv4_verify_metric_name(m)));
        json_object_set_new(o, "failed", fl);
    }
    return o;
}

/* Baseline mode: the probe's statistic over its rows and its two gates (docs/verify.md "Baseline mode"). */
static json_t *base_obj(const dsv4_verify_probe *p)
{
    const dsv4_verify_base_stat *b = &p->base;
    json_t *fl = json_array();
    if (b->failed & 1u) json_array_append_new(fl, json_string("rms"));
    if (b->failed & 2u) json_array_append_new(fl, json_string("scale"));
    json_t *o = json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:b, s:o}", "rows", b->n_rows,
                          "candidate_rms", num(b->cand_rms), "baseline_rms", num(b->base_rms), "ratio",
                          num(b->base_rms > 0 ? b->cand_rms / b->base_rms : NAN), "rms_tolerance", num(b->rms_tol),
                          "candidate_scale", num(b->cand_scale), "baseline_scale", num(b->base_scale), "scale_se",
                          num(b->scale_se), "scale_tolerance", num(b->scale_tol), "pass", !b->failed, "failed", fl);
    if (b->worst_row >= 0) {
        const dsv4_verify_row *wr = &p->rows[b->worst_row];
        json_t *w = json_pack("{s:i, s:o, s:o}", "position", wr->position, "candidate", num(b->worst_cand),
                              "baseline", num(b->worst_base));
        if (wr->entry >= 0) json_object_set_new(w, "entry", json_integer(wr->entry));
        json_object_set_new(o, "worst_row", w);
    }
    return o;
}

static json_t *probe_obj(const dsv4_verify_probe *p)
{
    static const char *const presence[] = {"both", "golden", "candidate"};
    json_t *o = json_pack("{s:o, s:o, s:i, s:s, s:s}", "dataset", text(p->dataset), "probe", text(p->probe), "layer",
                          p->layer, "kind", kind_names[p->kind], "in", presence[p->presence]);
    json_object_set_new(o, "golden", shape_obj(&p->golden_info));
    json_object_set_new(o, "candidate", shape_obj(&p->candidate_info));
    json_t *gates = json_object();
    for (int i = 0; i < p->n_gates; i++)
        json_object_set_new(gates, dsv4_verify_metric_name(p->gates[i].metric), num(p->gates[i].tol));
    json_object_set_new(o, "gates", gates);
    json_t *agates = json_object();
    for (int i = 0; i < p->n_gates; i++)
        json_object_set_new(agates, dsv4_verify_metric_name(p->after_gates[i].metric), num(p->after_gates[i].tol));
    json_object_set_new(o, "after_tie_gates", agates);
    if (p->kind == DSV4_VERIFY_KIND_TOPK || p->kind == DSV4_VERIFY_KIND_LOGITS) {
        json_object_set_new(o, "tie_abs", num(p->tie_abs));
        json_object_set_new(o, "tie_rel", num(p->tie_rel));
        json_object_set_new(o, "after_tie_tie_abs", num(p->after_tie_abs));
        json_object_set_new(o, "after_tie_tie_rel", num(p->after_tie_rel));
    }
    if (p->note[0]) json_object_set_new(o, "note", text(p->note));
    if (p->row_scale > 0) json_object_set_new(o, "row_scale", num(p->row_scale));
    if (p->presence != DSV4_VERIFY_IN_BOTH) return o;
    if (p->base.n_rows) json_object_set_new(o, "baseline", base_obj(p));
    json_t *worst = json_object(), *mean = json_object();
    for (int m = 0; m < DSV4_METRIC_COUNT; m++) {
        if (p->worst_row[m] < 0) continue;
        const dsv4_verify_row *wr = &p->rows[p->worst_row[m]];
        json_t *w = json_pack("{s:o, s:i}", "value", num(p->worst[m]), "position", wr->position);
        if (wr->entry >= 0) json_object_set_new(w, "entry", json_integer(wr->entry));
        json_object_set_new(worst, dsv4_verify_metric_name(m), w);
        json_object_set_new(mean, dsv4_verify_metric_name(m), num(p->mean[m]));
    }
    json_object_set_new(o, "worst", worst);
    json_object_set_new(o, "mean", mean);
    json_object_set_new(o, "pass", json_boolean(p->n_failed_rows == 0 && !p->base.failed));
    json_object_set_new(o, "failed_rows", json_integer(p->n_failed_rows));
    json_object_set_new(o, "after_tie_rows", json_integer(p->n_after_tie_rows));
    json_object_set_new(o, "passed_only_after_tie", json_integer(p->n_after_tie_saved));
    json_t *rows = json_array();
    for (int i = 0; i < p->n_rows; i++) json_array_append_new(rows, row_obj(p, &p->rows[i]));
    json_object_set_new(o, "rows", rows);
    return o;
}

static json_t *result_obj(const dsv4_verify_result *r)
{
    static const char *const verdict[] = {"pass", "diverged", "error"};
    json_t *o = json_pack("{s:s, s:s, s:i}", "schema", DSV4_VERIFY_JSON_SCHEMA, "verdict", verdict[r->status],
                          "exit_status", r->status);
    if (r->status == DSV4_VERIFY_ERROR) json_object_set_new(o, "error", text(r->error));
    json_object_set_new(o, "golden", file_obj(&r->golden));
    json_object_set_new(o, "candidate", file_obj(&r->candidate));
    json_object_set_new(o, "profile",
                        json_pack("{s:o, s:o}", "name", text(r->profile_name), "source", text(r->profile_source)));
    if (dsv4_verify_profile_note(r)[0]) json_object_set_new(o, "profile_note", text(dsv4_verify_profile_note(r)));
    if (r->baseline) {
        char sentence[768];
        json_t *b = file_obj(&r->base);
        json_object_set_new(b, "gates", json_pack("{s:f, s:f, s:f, s:f, s:i}", "rms_factor",
                                                  DSV4_VERIFY_BASE_RMS_FACTOR, "rms_floor", DSV4_VERIFY_BASE_RMS_FLOOR,
                                                  "scale_z", DSV4_VERIFY_BASE_SCALE_Z, "scale_floor",
                                                  DSV4_VERIFY_BASE_SCALE_FLOOR, "scale_min_rows",
                                                  DSV4_VERIFY_BASE_SCALE_MIN_ROWS));
        json_object_set_new(b, "checks", json_integer(r->base_checks));
        json_object_set_new(b, "failed_checks", json_integer(r->base_failed));
        json_object_set_new(b, "summary", text(dsv4_verify_base_sentence(r, sentence, sizeof sentence)));
        json_object_set_new(o, "baseline", b);
    }
    json_object_set_new(o, "weights_differ", json_boolean(r->digests_differ));
    json_object_set_new(o, "seconds", json_real(r->seconds));
    json_object_set_new(o, "bytes_read", json_integer(r->bytes_read));
    json_t *layers = json_array();
    for (int l = 0; l < r->n_layers; l++)
        json_array_append_new(layers, json_pack("{s:i, s:s, s:s}", "layer", l, "attention", r->layer_attention[l],
                                                "mlp", r->layer_mlp[l]));
    json_object_set_new(o, "layers", layers);
    json_t *pos = json_array();
    for (int i = 0; i < r->n_positions; i++) json_array_append_new(pos, json_integer(r->positions[i]));
    json_object_set_new(o, "positions", pos);
    json_object_set_new(o, "positions_not_compared", json_integer(r->n_positions_not_compared));
    json_t *tok = json_null();
    if (r->token_diff_position >= 0)
        tok = json_pack("{s:i, s:i, s:i}", "position", r->token_diff_position, "golden", r->token_golden, "candidate",
                        r->token_candidate);
    json_object_set_new(o, "tokens_differ", tok);
    json_object_set_new(o, "checks", json_integer(r->n_checks));
    json_object_set_new(o, "failed_checks", json_integer(r->n_failed_checks));
    json_t *first = json_null();
    if (r->first.found) {
        const dsv4_verify_divergence *d = &r->first;
        first = json_pack("{s:i, s:i, s:o, s:s, s:o, s:o, s:o}", "position", d->position, "layer", d->layer, "dataset",
                          text(d->dataset), "metric", dsv4_verify_metric_name(d->metric), "value", num(d->value),
                          "tolerance", num(d->tolerance), "detail", text(d->detail));
        if (d->entry >= 0) json_object_set_new(first, "entry", json_integer(d->entry));
        if (d->probe_index >= 0) json_object_set_new(first, "probe", text(r->probes[d->probe_index].probe));
    }
    json_object_set_new(o, "first_divergence", first);
    /* the after_tie rule (docs/verify.md "After a tie"): where it started and what it changed */
    json_t *tie = json_null();
    if (r->first_tie.found) {
        const dsv4_verify_tie *t = &r->first_tie;
        char sentence[768];
        tie = json_pack("{s:i, s:i, s:o, s:i, s:b, s:o}", "position", t->position, "layer", t->layer, "dataset",
                        text(t->dataset), "accepted", t->accepted, "given", t->given, "summary",
                        text(dsv4_verify_tie_sentence(r, sentence, sizeof sentence)));
    }
    json_object_set_new(o, "first_tie", tie);
    json_object_set_new(o, "after_tie",
                        json_pack("{s:b, s:I, s:I}", "profile_has_after_tie", r->profile_after_tie, "checks",
                                  (json_int_t)r->n_after_tie_checks, "passed_only_after_tie",
                                  (json_int_t)r->n_after_tie_saved));
    json_t *og = json_array(), *oc = json_array(), *probes = json_array();
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (p->presence == DSV4_VERIFY_ONLY_GOLDEN) json_array_append_new(og, text(p->dataset));
        if (p->presence == DSV4_VERIFY_ONLY_CANDIDATE) json_array_append_new(oc, text(p->dataset));
        json_array_append_new(probes, probe_obj(p));
    }
    json_object_set_new(o, "only_in_golden", og);
    json_object_set_new(o, "only_in_candidate", oc);
    /* what a partial candidate did not provide (docs/dump-format.md "Partial dumps"): never compared; the datasets
     * --require named are failures */
    json_t *req = json_array(), *lp = json_array();
    for (int i = 0; i < r->n_probes; i++)
        if (r->probes[i].required) json_array_append_new(req, text(r->probes[i].dataset));
    for (int i = 0; i < r->n_positions_only_golden; i++)
        json_array_append_new(lp, json_integer(r->positions_only_golden[i]));
    json_object_set_new(o, "candidate_lacks",
                        json_pack("{s:O, s:o, s:o, s:i}", "datasets", og, "required_missing", req, "positions", lp,
                                  "positions_only_in_candidate", r->n_positions_only_candidate));
    json_t *topk = json_array();
    for (int i = 0; i < r->n_probes; i++) {
        if (r->probes[i].kind != DSV4_VERIFY_KIND_TOPK || r->probes[i].presence != DSV4_VERIFY_IN_BOTH) continue;
        dsv4_verify_topk_summary s;
        dsv4_verify_topk_summarise(r, i, &s);
        json_array_append_new(topk, json_pack("{s:i, s:i, s:o, s:o, s:o, s:o, s:i, s:i, s:i}", "layer", s.layer, "rows",
                                              s.n_rows, "recall_min", num(s.recall_min), "recall_mean",
                                              num(s.recall_mean), "jaccard_min", num(s.jaccard_min), "jaccard_mean",
                                              num(s.jaccard_mean), "rows_differ", s.rows_differ, "accepted",
                                              (int)s.accepted, "strict", (int)s.strict));
    }
    json_object_set_new(o, "topk", topk);
    dsv4_verify_logits_summary ls;
    dsv4_verify_logits_summarise(r, &ls);
    json_t *lo = json_null();
    if (ls.probe >= 0)
        lo = json_pack("{s:i, s:i, s:i, s:i, s:o, s:o, s:o, s:i, s:o, s:o, s:i}", "rows", ls.n_rows, "argmax_equal",
                       ls.argmax_equal, "argmax_tie_accepted", ls.argmax_tie, "argmax_strict", ls.argmax_strict,
                       "top5_min", num(ls.top5_min), "top5_mean", num(ls.top5_mean), "kl_max", num(ls.kl_max),
                       "kl_max_position", ls.kl_max_position, "kl_mean", num(ls.kl_mean), "rel_l2_max",
                       num(ls.rel_l2_max), "rel_l2_max_position", ls.rel_l2_max_position);
    json_object_set_new(o, "logits", lo);
    json_object_set_new(o, "probes", probes);
    return o;
}

int dsv4_verify_write_json(const dsv4_verify_result *r, const char *path)
{
    json_t *o = result_obj(r);
    if (!o) return dsv4_error(DSV4_ERR_NOMEM, "%s: cannot build the JSON report", path);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int slot = dsv4_tempfile_register(tmp); /* a signal while writing removes it (model/tempfile.c) */
    errno = 0;
    int rc = json_dump_file(o, tmp, JSON_INDENT(1) | JSON_REAL_PRECISION(10));
    json_decref(o);
    if (rc || rename(tmp, path)) {
        const char *why = errno ? strerror(errno) : "write failed";
        rc = dsv4_error(DSV4_ERR_IO, "%s: cannot write the JSON report: %s", path, why);
        unlink(tmp);
        dsv4_tempfile_unregister(slot);
        return rc;
    }
    dsv4_tempfile_unregister(slot);
    return 0;
}
