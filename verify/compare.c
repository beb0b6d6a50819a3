/* compare.c - dsv4_verify_run: can the two dumps be compared, which positions and probes, in what order, and
 * judging rows against the profile (docs/verify.md). The per-kind streaming loops are in compare_probe.c.
 *
 * Quiet traps:
 * - Only positions stored in BOTH files are compared, and only before the first position where /tokens
 *   differ (from there on the two runs had different inputs). A difference inside the prompt means different
 *   prompts: nothing is comparable (status 2). A difference after the prompt (greedy runs that parted) is a
 *   divergence at that position, placed before layer 0.
 * - Model order is position-major (design.md "First divergence"): (position, layer, probe order, entry).
 *   final/ ranks as layer n_layers.
 * - A probe in only one file is listed in the result, never dropped.
 * - After a tie (model-spec 13, docs/verify.md "After a tie"): the first tie-accepted top-k difference in
 *   model order is found BEFORE any row is judged (a scan of the topk_idx probes), because probes are streamed
 *   one at a time and a row of layer 1 at position 40 comes after a tie at (35, layer 3). Every row after it
 *   is judged with the probe's after_tie gates; the checks that pass only thanks to them are counted.
 */
#define _POSIX_C_SOURCE 200809L
#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "verify_compare.h"

void dsv4_verify_options_init(dsv4_verify_options *o)
{
    memset(o, 0, sizeof *o);
    o->profile = "fp32";
    o->layer_lo = o->layer_hi = -1;
    o->pos_lo = o->pos_hi = -1;
    o->tie_at_position = o->tie_at_layer = -1;
}

char *dsv4_cmp_strdup(const char *s)
{
    s = s ? s : "";
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static void file_info(dsv4_verify_file *f, const dsv4_dump *d)
{
    f->path = dsv4_cmp_strdup(dsv4_dump_path(d));
    f->producer = dsv4_cmp_strdup(dsv4_dump_attr(d, "producer"));
    f->weights_digest = dsv4_cmp_strdup(dsv4_dump_attr(d, "weights_digest"));
    f->mode = dsv4_cmp_strdup(dsv4_dump_attr(d, "mode"));
    f->prompt_len = dsv4_dump_prompt_len(d);
    f->n_decode = dsv4_dump_n_decode(d);
    dsv4_dump_tokens(d, &f->n_tokens);
    dsv4_dump_positions(d, &f->n_positions);
}

static void file_free(dsv4_verify_file *f)
{
    free(f->path);
    free(f->producer);
    free(f->weights_digest);
    free(f->mode);
}

void dsv4_verify_result_free(dsv4_verify_result *r)
{
    if (!r) return;
    file_free(&r->golden);
    file_free(&r->candidate);
    file_free(&r->base);
    free(r->layer_attention);
    free(r->layer_mlp);
    free(r->positions);
    free(r->positions_only_golden);
    for (int i = 0; i < r->n_probes; i++) free(r->probes[i].rows);
    free(r->probes);
    free(r);
}

static void fail_compare(dsv4_verify_result *r, const char *fmt, const char *a, const char *b)
{
    r->status = DSV4_VERIFY_ERROR;
    snprintf(r->error, sizeof r->error, fmt, a, b);
}

/* "layers/<L>/<probe>" -> layer L; "final/<probe>" -> -1. Returns -2 for anything else. */
static int parse_dataset(const char *name, char *probe, size_t n)
{
    if (!strncmp(name, "final/", 6)) {
        snprintf(probe, n, "%s", name + 6);
        return -1;
    }
    if (!strncmp(name, "layers/", 7) && name[7] >= '0' && name[7] <= '9') {
        char *end;
        long layer = strtol(name + 7, &end, 10);
        if (*end == '/' && layer <= INT_MAX) {
            snprintf(probe, n, "%s", end + 1);
            return (int)layer;
        }
    }
    snprintf(probe, n, "%s", name);
    return -2;
}

static int layer_rank(const dsv4_verify_result *r, int layer)
{
    return layer >= 0 ? layer : r->n_layers;
}

/* 1 when a glob of the comma-separated list matches the dataset name or the probe name. */
static int glob_list_match(const char *list, const char *dataset, const char *probe)
{
    char globs[1024];
    snprintf(globs, sizeof globs, "%s", list);
    char *save = NULL;
    for (char *gl = strtok_r(globs, ",", &save); gl; gl = strtok_r(NULL, ",", &save))
        if (!fnmatch(gl, dataset, 0) || !fnmatch(gl, probe, 0)) return 1;
    return 0;
}

static int probe_selected(const dsv4_cmp_ctx *x, const char *dataset, const char *probe, int layer)
{
    const dsv4_verify_options *o = x->o;
    int rank = layer_rank(x->r, layer);
    if (o->layer_lo >= 0 && rank < o->layer_lo) return 0;
    if (o->layer_hi >= 0 && rank > o->layer_hi) return 0;
    if (!o->probes || !*o->probes) return 1;
    return glob_list_match(o->probes, dataset, probe);
}

/* Model order of probes: layers ascending, final/ last, then the probe order inside a layer. */
static int cmp_probe_order(const void *a, const void *b)
{
    const dsv4_verify_probe *p = a, *q = b;
    int ra = p->layer < 0 ? INT_MAX : p->layer, rb = q->layer < 0 ? INT_MAX : q->layer;
    if (ra != rb) return ra < rb ? -1 : 1;
    if (p->order != q->order) return p->order < q->order ? -1 : 1;
    return strcmp(p->dataset, q->dataset);
}

static dsv4_verify_kind probe_kind(const char *probe, int layer, const dsv4_dataset_info *info)
{
    if (!strcmp(probe, "topk_idx")) return DSV4_VERIFY_KIND_TOPK;
    if (!strcmp(probe, "router_ids")) return DSV4_VERIFY_KIND_ROUTER_IDS;
    if (!strcmp(probe, "router_weights")) return DSV4_VERIFY_KIND_ROUTER_WEIGHTS;
    if (layer == -1 && !strcmp(probe, "logits")) return DSV4_VERIFY_KIND_LOGITS;
    if (!strcmp(probe, "compressed_kv") || !strcmp(probe, "indexer_kv")) return DSV4_VERIFY_KIND_ENTRIES;
    if (info->dtype == DSV4_DTYPE_I32) return DSV4_VERIFY_KIND_INT;
    return DSV4_VERIFY_KIND_DENSE;
}

/* An integer probe of another tool is compared exactly when the entry that applies to it (usually "default",
 * whose rel_l2 no integer row has) sets no mismatch gate: else no gate would apply and any change would pass.
 * Gates switched off (none at all) stay off: that is a choice. */
static void extra_int_probe_exact(dsv4_verify_probe *p)
{
    if (p->kind != DSV4_VERIFY_KIND_INT || dsv4_verify_probe_known(p->probe) || p->n_gates == 0) return;
    for (int g = 0; g < p->n_gates; g++)
        if (p->gates[g].metric == DSV4_METRIC_MISMATCH) return;
    p->gates[0] = (dsv4_verify_gate){.metric = DSV4_METRIC_MISMATCH, .tol = 0};
    p->n_gates = 1;
}

/* Baseline mode: the float probes are judged against the baseline's errors (baseline.c), not by fixed gates; what
 * keeps the profile's rules here are the selections (topk_idx, router_ids, the logits' argmax) and the int probes. */
static void baseline_gates(dsv4_verify_probe *p)
{
    switch (p->kind) {
    case DSV4_VERIFY_KIND_DENSE:
    case DSV4_VERIFY_KIND_ENTRIES:
    case DSV4_VERIFY_KIND_ROUTER_WEIGHTS: p->n_gates = 0; break;
    case DSV4_VERIFY_KIND_LOGITS: {
        int n = 0;
        for (int g = 0; g < p->n_gates; g++)
            if (p->gates[g].metric == DSV4_METRIC_ARGMAX) p->gates[n++] = p->gates[g];
        p->n_gates = n;
        break;
    }
    default: break;
    }
}

/* The union of both files' datasets, filtered, in model order. */
static int build_probes(dsv4_cmp_ctx *x)
{
    dsv4_verify_result *r = x->r;
    int ng = dsv4_dump_dataset_count(x->g), nc = dsv4_dump_dataset_count(x->c);
    r->probes = calloc((size_t)(ng + nc + 1), sizeof *r->probes);
    if (!r->probes) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
    for (int side = 0; side < 2; side++) {
        const dsv4_dump *d = side ? x->c : x->g, *other = side ? x->g : x->c;
        int n = side ? nc : ng;
        for (int i = 0; i < n; i++) {
            const char *name = dsv4_dump_dataset_name(d, i);
            int in_other = dsv4_dump_has(other, name);
            if (side == 1 && in_other) continue; /* already taken from the golden */
            dsv4_verify_probe *p = &r->probes[r->n_probes];
            memset(p, 0, sizeof *p);
            snprintf(p->dataset, sizeof p->dataset, "%s", name);
            const int too_long = strlen(name) >= sizeof p->dataset;
            p->layer = parse_dataset(name, p->probe, sizeof p->probe);
            if (p->layer == -2) continue; /* not a probe path of dump-format.md */
            if (!probe_selected(x, p->dataset, p->probe, p->layer)) continue;
            p->order = dsv4_verify_probe_order(p->probe);
            p->presence = in_other ? DSV4_VERIFY_IN_BOTH : side ? DSV4_VERIFY_ONLY_CANDIDATE : DSV4_VERIFY_ONLY_GOLDEN;
            p->required = p->presence == DSV4_VERIFY_ONLY_GOLDEN && x->o->require && *x->o->require &&
                          glob_list_match(x->o->require, p->dataset, p->probe);
            /* a dataset the reader rejects (shape against the config, dtype) is a structure failure of that
             * probe, reported with the reader's message, not a reason to stop comparing the rest */
            int rc = too_long ? 0 : dsv4_dump_info(d, name, side ? &p->candidate_info : &p->golden_info);
            if (rc == DSV4_ERR_NOMEM) return rc;
            if (rc) snprintf(p->note, sizeof p->note, "%s", dsv4_last_error());
            if (too_long) /* its info stays empty: one structure-failure row with this note */
                snprintf(p->note, sizeof p->note, "dataset name of %zu bytes, longer than the %d the verifier holds: "
                         "not compared", strlen(name), DSV4_VERIFY_NAME_MAX - 1);
            else if (in_other) {
                rc = dsv4_dump_info(other, name, side ? &p->golden_info : &p->candidate_info);
                if (rc == DSV4_ERR_NOMEM) return rc;
                if (rc) snprintf(p->note, sizeof p->note, "%s", dsv4_last_error());
            }
            p->kind = probe_kind(p->probe, p->layer, &p->golden_info);
            p->first_failed_row = -1;
            for (int m = 0; m < DSV4_METRIC_COUNT; m++) {
                p->worst[m] = p->mean[m] = NAN;
                p->worst_row[m] = -1;
            }
            if ((rc = dsv4_verify_profile_lookup(x->prof, p->dataset, p->probe, p->gates, &p->n_gates, &p->tie_abs,
                                                 &p->tie_rel)))
                return rc;
            extra_int_probe_exact(p);
            if (x->o->baseline) baseline_gates(p);
            memcpy(p->after_gates, p->gates, sizeof p->gates);
            p->after_tie_abs = p->tie_abs;
            p->after_tie_rel = p->tie_rel;
            dsv4_verify_profile_after_tie(x->prof, p->dataset, p->probe, p->after_gates, p->n_gates, &p->after_tie_abs,
                                          &p->after_tie_rel);
            r->n_probes++;
            if (p->presence == DSV4_VERIFY_IN_BOTH)
                r->n_compared++;
            else if (p->presence == DSV4_VERIFY_ONLY_GOLDEN) {
                r->n_only_golden++;
                r->n_required_missing += p->required;
            }
            else
                r->n_only_candidate++;
        }
    }
    qsort(r->probes, (size_t)r->n_probes, sizeof *r->probes, cmp_probe_order);
    return 0;
}

/* The metrics a row of this kind has (bit m: dsv4_verify_metric m); structure is always possible. */
static unsigned kind_metrics(dsv4_verify_kind k)
{
    const unsigned dense = 1u << DSV4_METRIC_MAX_ABS | 1u << DSV4_METRIC_REL_L2 | 1u << DSV4_METRIC_NMSE |
                           1u << DSV4_METRIC_COSINE | 1u << DSV4_METRIC_NONFINITE;
    const unsigned sets = 1u << DSV4_METRIC_RECALL | 1u << DSV4_METRIC_JACCARD;
    unsigned m = 1u << DSV4_METRIC_STRUCTURE;
    switch (k) {
    case DSV4_VERIFY_KIND_TOPK: return m | sets | 1u << DSV4_METRIC_STRICT | 1u << DSV4_METRIC_ACCEPTED;
    case DSV4_VERIFY_KIND_ROUTER_IDS: return m | sets | 1u << DSV4_METRIC_MISMATCH;
    case DSV4_VERIFY_KIND_INT: return m | 1u << DSV4_METRIC_MISMATCH;
    case DSV4_VERIFY_KIND_LOGITS:
        return m | dense | 1u << DSV4_METRIC_ARGMAX | 1u << DSV4_METRIC_TOP5 | 1u << DSV4_METRIC_KL;
    default: return m | dense;
    }
}

/* A probe of dump-format.md whose profile gates name only metrics its rows do not have is gated by nothing: a
 * profile without a router_ids entry gives router_ids the default's rel_l2, and any expert set would pass.
 * Returns 1 (status set to could-not-compare, naming the probe) for the first such probe. Gates switched off
 * (no gates at all) are a choice, not this mistake. */
static int gates_apply(dsv4_cmp_ctx *x)
{
    dsv4_verify_result *r = x->r;
    for (int i = 0; i < r->n_probes; i++) {
        const dsv4_verify_probe *p = &r->probes[i];
        if (p->presence != DSV4_VERIFY_IN_BOTH || !p->n_gates || !dsv4_verify_probe_known(p->probe)) continue;
        unsigned have = kind_metrics(p->kind);
        int any = 0;
        for (int g = 0; g < p->n_gates; g++) any |= (have >> p->gates[g].metric) & 1u;
        if (any) continue;
        char gates[128] = "", metrics[160] = "";
        size_t a = 0, b = 0;
        for (int g = 0; g < p->n_gates && a < sizeof gates; g++)
            a += (size_t)snprintf(gates + a, sizeof gates - a, "%s%s", g ? ", " : "",
                                  dsv4_verify_metric_name(p->gates[g].metric));
        for (int m = 0; m < DSV4_METRIC_COUNT && b < sizeof metrics; m++)
            if ((have >> m & 1u) && m != DSV4_METRIC_STRUCTURE)
                b += (size_t)snprintf(metrics + b, sizeof metrics - b, "%s%s", b ? ", " : "",
                                      dsv4_verify_metric_name((dsv4_verify_metric)m));
        char msg[1024];
        snprintf(msg, sizeof msg,
                 "profile %s (%.200s): %.120s would be gated by nothing: its gates (%s) are not metrics of %.40s "
                 "rows (%s); give %.40s its own entry",
                 r->profile_name, r->profile_source, p->dataset, gates, p->probe, metrics, p->probe);
        size_t len = strlen(msg) < sizeof r->error ? strlen(msg) : sizeof r->error - 1;
        memcpy(r->error, msg, len);
        r->error[len] = 0;
        r->status = DSV4_VERIFY_ERROR;
        return 1;
    }
    return 0;
}

/* Layers: from the golden config when it parses, else from the dataset names. */
static int layer_table(dsv4_cmp_ctx *x)
{
    dsv4_verify_result *r = x->r;
    if (dsv4_dump_config(x->g, &x->cfg) != 0) x->cfg = NULL;
    int n = 0;
    if (x->cfg) n = x->cfg->num_hidden_layers;
    for (int side = 0; side < 2; side++) {
        const dsv4_dump *d = side ? x->c : x->g;
        for (int i = 0; i < dsv4_dump_dataset_count(d); i++) {
            char probe[64];
            int l = parse_dataset(dsv4_dump_dataset_name(d, i), probe, sizeof probe);
            if (l + 1 > n) n = l + 1;
        }
    }
    r->n_layers = n;
    r->layer_attention = calloc((size_t)(n ? n : 1), sizeof *r->layer_attention);
    r->layer_mlp = calloc((size_t)(n ? n : 1), sizeof *r->layer_mlp);
    if (!r->layer_attention || !r->layer_mlp) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
    for (int l = 0; l < n; l++) {
        int known = x->cfg && l < x->cfg->num_hidden_layers && l < DSV4_MAX_LAYERS;
        snprintf(r->layer_attention[l], sizeof r->layer_attention[l], "%s",
                 known ? dsv4_attn_type_name(x->cfg->attn_type[l]) : "?");
        snprintf(r->layer_mlp[l], sizeof r->layer_mlp[l], "%s", known ? dsv4_mlp_type_name(x->cfg->mlp_type[l]) : "?");
    }
    return 0;
}

/* Common positions, the token check, the rows of each position in each file. Returns 1 when status is set
 * to could-not-compare. */
static int positions_table(dsv4_cmp_ctx *x)
{
    dsv4_verify_result *r = x->r;
    int ntg, ntc, npg, npc;
    const int32_t *tg = dsv4_dump_tokens(x->g, &ntg), *tc = dsv4_dump_tokens(x->c, &ntc);
    const int32_t *pg = dsv4_dump_positions(x->g, &npg), *pc = dsv4_dump_positions(x->c, &npc);
    int nt = ntg < ntc ? ntg : ntc;
    x->pos_limit = INT_MAX;
    r->token_diff_position = -1;
    for (int p = 0; p < nt; p++)
        if (tg[p] != tc[p]) {
            r->token_diff_position = p;
            r->token_golden = tg[p];
            r->token_candidate = tc[p];
            x->pos_limit = p;
            break;
        }
    int prompt = r->golden.prompt_len < r->candidate.prompt_len ? r->golden.prompt_len : r->candidate.prompt_len;
    if (r->token_diff_position >= 0 && r->token_diff_position < prompt) {
        char a[128];
        snprintf(a, sizeof a, "%d (golden token %d, candidate token %d)", r->token_diff_position, r->token_golden,
                 r->token_candidate);
        fail_compare(r, "different prompts: /tokens differ at prompt position %s%s", a, "");
        return 1;
    }
    x->entry_limit = x->pos_limit < nt ? x->pos_limit : nt;
    int cap = npg < npc ? npg : npc;
    r->positions = malloc((size_t)(cap ? cap : 1) * sizeof *r->positions);
    x->grow = malloc((size_t)(cap ? cap : 1) * sizeof *x->grow);
    x->crow = malloc((size_t)(cap ? cap : 1) * sizeof *x->crow);
    free(r->positions_only_golden);
    r->positions_only_golden = malloc((size_t)(npg ? npg : 1) * sizeof *r->positions_only_golden);
    r->n_positions_only_golden = r->n_positions_only_candidate = 0;
    if (!r->positions || !x->grow || !x->crow || !r->positions_only_golden)
        return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
    const dsv4_verify_options *o = x->o;
#define IN_RANGE(p) ((o->pos_lo < 0 || (p) >= o->pos_lo) && (o->pos_hi < 0 || (p) <= o->pos_hi))
    for (int i = 0, j = 0; i < npg || j < npc;) {
        if (j == npc || (i < npg && pg[i] < pc[j])) { /* the golden stores it, the candidate does not */
            if (IN_RANGE(pg[i])) r->positions_only_golden[r->n_positions_only_golden++] = pg[i];
            i++;
        } else if (i == npg || pg[i] > pc[j]) {
            r->n_positions_only_candidate += IN_RANGE(pc[j]);
            j++;
        } else {
            int p = pg[i];
            if (IN_RANGE(p)) {
                if (p >= x->pos_limit)
                    r->n_positions_not_compared++;
                else {
                    r->positions[r->n_positions] = p;
                    x->grow[r->n_positions] = i;
                    x->crow[r->n_positions] = j;
                    r->n_positions++;
                }
            }
            i++;
            j++;
        }
    }
#undef IN_RANGE
    if (r->n_positions == 0) {
        char a[160];
        snprintf(a, sizeof a, "golden stores %d, candidate %d positions%s", npg, npc,
                 r->n_positions_not_compared ? "; the common ones are past the token difference" : "");
        fail_compare(r, "no common positions to compare (%s)%s", a, "");
        return 1;
    }
    return 0;
}

dsv4_verify_row *dsv4_cmp_new_row(dsv4_verify_probe *p, int position, int entry)
{
    /* rows grow by doubling; capacity is implied by n_rows (powers of two from 16) */
    int n = p->n_rows;
    if (n == 0 || (n >= 16 && (n & (n - 1)) == 0)) {
        int cap = n == 0 ? 16 : 2 * n;
        dsv4_verify_row *rows = realloc(p->rows, (size_t)cap * sizeof *rows);
        if (!rows) return NULL;
        p->rows = rows;
    }
    dsv4_verify_row *row = &p->rows[p->n_rows++];
    dsv4_verify_row_clear(row, position, entry);
    return row;
}

int dsv4_cmp_read_rows(dsv4_cmp_ctx *x, const dsv4_dump *d, const char *name, const int *rows, int n, size_t row_bytes,
                       void *dst)
{
    int64_t lo = rows[0], span = (int64_t)rows[n - 1] - lo + 1;
    x->r->bytes_read += (long long)(span * (int64_t)row_bytes);
    dsv4_cmp_progress_read(x, (double)span * (double)row_bytes);
    if (row_bytes == 0) return 0; /* rows of width 0: nothing to read */
    if (span == n) return dsv4_dump_read_rows(d, name, lo, n, dst);
    size_t need = (size_t)span * row_bytes;
    if (need > x->scratch_cap) {
        void *s = realloc(x->scratch, need);
        if (!s) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory (%zu bytes for %s)", need, name);
        x->scratch = s;
        x->scratch_cap = need;
    }
    int rc = dsv4_dump_read_rows(d, name, lo, span, x->scratch);
    if (rc) return rc;
    for (int i = 0; i < n; i++)
        memcpy((char *)dst + (size_t)i * row_bytes, (char *)x->scratch + (size_t)(rows[i] - lo) * row_bytes, row_bytes);
    return 0;
}

/* ------------------------------------------------------------------------------------------------ judging */
/* Model order, position-major; layer-major in baseline mode (a baseline gate judges a layer's probe over all its
 * positions, so there the earliest failing layer is the root cause). */
static int key_before(int layer_major, int pos_a, int rank_a, int order_a, int entry_a,
                      const dsv4_verify_divergence *b, int rank_b, int order_b)
{
    if (!b->found) return 1;
    int pb = b->position < 0 ? INT_MAX : b->position;
    if (layer_major && rank_a != rank_b) return rank_a < rank_b;
    if (pos_a != pb) return pos_a < pb;
    if (rank_a != rank_b) return rank_a < rank_b;
    if (order_a != order_b) return order_a < order_b;
    return entry_a < b->entry;
}

size_t dsv4_cmp_row_elems(const dsv4_dataset_info *info)
{
    size_t n = 1;
    for (int d = 1; d < info->ndim; d++) n *= (size_t)info->shape[d];
    return n;
}

static void describe(const dsv4_verify_probe *p, const dsv4_verify_row *row, dsv4_verify_metric m, const void *g,
                     const void *c, const void *aux_g, int64_t aux_n, char *out, size_t n)
{
    char coord[64];
    const dsv4_dataset_info *info = &p->golden_info;
    if (m == DSV4_METRIC_STRUCTURE) {
        snprintf(out, n, "%.*s", (int)(n > 1 ? n - 1 : 0), p->note[0] ? p->note : "rows cannot be compared");
        return;
    }
    if (m == DSV4_METRIC_NONFINITE && g && c && row->nonfinite_at >= 0 && p->kind != DSV4_VERIFY_KIND_ROUTER_WEIGHTS) {
        /* rows of differing widths (indexer_scores over N entries): the first bad value may be a finite score in a
         * column that only the wider file has */
        const int64_t at = row->nonfinite_at, wg = (int64_t)dsv4_cmp_row_elems(&p->golden_info),
                      wc = (int64_t)dsv4_cmp_row_elems(&p->candidate_info);
        char gv[40] = "absent", cv[40] = "absent";
        if (at < wg) snprintf(gv, sizeof gv, "%g", (double)((const float *)g)[at]);
        if (at < wc) snprintf(cv, sizeof cv, "%g", (double)((const float *)c)[at]);
        snprintf(out, n, "%.0f non-finite; first at %s: golden %s, candidate %s", row->v[m],
                 dsv4_verify_fmt_coord(wg >= wc ? info : &p->candidate_info, at, coord, sizeof coord), gv, cv);
        return;
    }
    switch (p->kind) {
    case DSV4_VERIFY_KIND_TOPK: {
        const int32_t *gi = g, *ci = c;
        int k = (int)(p->golden_info.ndim > 1 ? p->golden_info.shape[1] : 1);
        double kth = NAN, tol = NAN;
        if (gi)
            dsv4_verify_topk_threshold(gi, k, aux_g, aux_n, row->after_tie ? p->after_tie_abs : p->tie_abs,
                                       row->after_tie ? p->after_tie_rel : p->tie_rel, &kth, &tol);
        int len =
            snprintf(out, n, "recall %.4f, %.0f tie-accepted, %.0f strict; k-th golden score %.6g, tie tol %.3g",
                     row->v[DSV4_METRIC_RECALL], row->v[DSV4_METRIC_ACCEPTED], row->v[DSV4_METRIC_STRICT], kth, tol);
        int shown = 0;
        if (gi && ci && aux_g)
            for (int j = 0; j < k && len > 0 && (size_t)len < n; j++) {
                int32_t w = ci[j];
                int in_g = 0;
                for (int i = 0; i < k; i++) in_g |= gi[i] == w;
                if (w < 0 || in_g) continue;
                double s = w < aux_n ? ((const float *)aux_g)[w] : NAN;
                if (!(s >= kth - tol)) {
                    snprintf(out + len, n - (size_t)len, "; e.g. pick %d has golden score %.6g", w, s);
                    shown = 1;
                    break;
                }
            }
        /* no pick below the band: the strict one is a golden pick left out that scores above it (no tie) */
        if (!shown && gi && ci && aux_g)
            for (int i = 0; i < k && len > 0 && (size_t)len < n; i++) {
                int32_t w = gi[i];
                int in_c = 0;
                for (int j = 0; j < k; j++) in_c |= ci[j] == w;
                if (w < 0 || in_c) continue;
                double s = w < aux_n ? ((const float *)aux_g)[w] : NAN;
                if (!(s <= kth + tol)) {
                    snprintf(out + len, n - (size_t)len,
                             "; e.g. golden pick %d (golden score %.6g, above the k-th + tol) is left out", w, s);
                    break;
                }
            }
        return;
    }
    case DSV4_VERIFY_KIND_ROUTER_IDS:
    case DSV4_VERIFY_KIND_INT: {
        const int32_t *gi = g, *ci = c;
        int k = (int)(info->ndim > 1 ? info->shape[1] : 1);
        if (p->kind == DSV4_VERIFY_KIND_INT || !gi || !ci || k > 16) {
            snprintf(out, n, "%.0f differ%s", row->v[DSV4_METRIC_MISMATCH],
                     p->kind == DSV4_VERIFY_KIND_INT ? "ing elements" : "");
            return;
        }
        int len = snprintf(out, n, "golden {");
        for (int i = 0; i < k && (size_t)len < n; i++)
            len += snprintf(out + len, n - (size_t)len, i ? ",%d" : "%d", gi[i]);
        if ((size_t)len < n) len += snprintf(out + len, n - (size_t)len, "} candidate {");
        for (int i = 0; i < k && (size_t)len < n; i++)
            len += snprintf(out + len, n - (size_t)len, i ? ",%d" : "%d", ci[i]);
        if ((size_t)len < n) snprintf(out + len, n - (size_t)len, "}");
        return;
    }
    case DSV4_VERIFY_KIND_LOGITS:
        if (m == DSV4_METRIC_ARGMAX || m == DSV4_METRIC_TOP5 || m == DSV4_METRIC_KL) {
            const float *gf = g;
            double margin = gf && row->argmax_c >= 0 ? (double)gf[row->argmax_g] - gf[row->argmax_c] : NAN;
            snprintf(out, n, "argmax golden %d, candidate %d (golden margin %.3g); top-5 overlap %.2f; KL %.3g",
                     row->argmax_g, row->argmax_c, margin, row->v[DSV4_METRIC_TOP5], row->v[DSV4_METRIC_KL]);
            return;
        }
        /* fall through - the dense numbers */
    default: {
        int len = snprintf(out, n, "max |d| %.3e at %s", row->v[DSV4_METRIC_MAX_ABS],
                           dsv4_verify_fmt_coord(info, row->max_abs_at, coord, sizeof coord));
        if (g && c && row->max_abs_at >= 0 && (size_t)len < n)
            len += snprintf(out + len, n - (size_t)len, " (golden %.6g, candidate %.6g)",
                            (double)((const float *)g)[row->max_abs_at], (double)((const float *)c)[row->max_abs_at]);
        if ((size_t)len < n)
            snprintf(out + len, n - (size_t)len, "; rel_l2 %.3e, 1 - cosine %.2e", row->v[DSV4_METRIC_REL_L2],
                     1.0 - row->v[DSV4_METRIC_COSINE]);
        return;
    }
    }
}

/* (position, layer rank, probe order, entry) of a row against the first tie: 1 when the row is after it. */
int dsv4_cmp_after_tie(const dsv4_cmp_ctx *x, const dsv4_verify_probe *p, int position, int entry)
{
    const dsv4_verify_tie *t = &x->r->first_tie;
    if (x->scan || !t->found) return 0;
    int pos = position < 0 ? INT_MAX : position;
    if (pos != t->position) return pos > t->position;
    int rank = layer_rank(x->r, p->layer), trank = layer_rank(x->r, t->layer);
    if (rank != trank) return rank > trank;
    int order = dsv4_verify_probe_order("topk_idx");
    if (p->order != order) return p->order > order;
    return entry > -1; /* the tie row itself (entry -1) is not after itself */
}

/* While scanning: keep the earliest row (model order) with a tie-accepted pick. */
static void note_tie(dsv4_cmp_ctx *x, dsv4_verify_probe *p, const dsv4_verify_row *row)
{
    dsv4_verify_tie *t = &x->r->first_tie;
    if (p->kind != DSV4_VERIFY_KIND_TOPK || !(row->v[DSV4_METRIC_ACCEPTED] > 0)) return;
    x->scan_hit = 1;
    int rank = layer_rank(x->r, p->layer);
    if (t->found && (row->position > t->position ||
                     (row->position == t->position && rank >= layer_rank(x->r, t->layer))))
        return;
    t->found = 1;
    t->given = 0;
    t->position = row->position;
    t->layer = p->layer;
    t->probe_index = (int)(p - x->r->probes);
    t->accepted = (int)row->v[DSV4_METRIC_ACCEPTED];
    snprintf(t->dataset, sizeof t->dataset, "%s", p->dataset);
}

void dsv4_cmp_judge(dsv4_cmp_ctx *x, dsv4_verify_probe *p, int ri, const void *g, const void *c, const void *aux_g,
                    const void *aux_c, int64_t aux_n)
{
    (void)aux_c;
    dsv4_verify_result *r = x->r;
    dsv4_verify_row *row = &p->rows[ri];
    if (x->scan) {
        note_tie(x, p, row);
        return;
    }
    /* after the first tie: the after_tie gates (the same metrics, looser tolerances) */
    row->after_tie = dsv4_cmp_after_tie(x, p, row->position, row->entry);
    const dsv4_verify_gate *pg = row->after_tie ? p->after_gates : p->gates;
    if (row->after_tie) p->n_after_tie_rows++;
    /* implicit gates first: they are what the reader must see when they fail */
    dsv4_verify_gate gates[DSV4_VERIFY_MAX_GATES + 2];
    double normal[DSV4_VERIFY_MAX_GATES + 2];
    int ng = 0;
    gates[ng] = (dsv4_verify_gate){DSV4_METRIC_STRUCTURE, 0};
    normal[ng++] = 0;
    gates[ng] = (dsv4_verify_gate){DSV4_METRIC_NONFINITE, 0};
    normal[ng++] = 0;
    for (int i = 0; i < p->n_gates; i++)
        if (pg[i].metric != DSV4_METRIC_STRUCTURE && pg[i].metric != DSV4_METRIC_NONFINITE) {
            normal[ng] = p->gates[i].tol;
            gates[ng++] = pg[i];
        }
    int first_m = -1;
    double first_v = 0, first_t = 0;
    for (int i = 0; i < ng; i++) {
        double v = row->v[gates[i].metric];
        if (isnan(v)) continue;
        r->n_checks++;
        r->n_after_tie_checks += row->after_tie;
        if (dsv4_verify_gate_fails(gates[i].metric, v, gates[i].tol)) {
            row->failed |= 1u << gates[i].metric;
            r->n_failed_checks++;
            if (first_m < 0) {
                first_m = gates[i].metric;
                first_v = v;
                first_t = gates[i].tol;
            }
        } else if (row->after_tie &&
                   dsv4_verify_gate_fails(gates[i].metric, x->normal_tie_v ? x->normal_tie_v[gates[i].metric] : v,
                                          normal[i])) {
            row->after_tie_saved |= 1u << gates[i].metric;
            r->n_after_tie_saved++;
            p->n_after_tie_saved++;
        }
    }
    if (!row->failed) return;
    p->n_failed_rows++;
    if (p->first_failed_row < 0) p->first_failed_row = ri;
    int pos = row->position < 0 ? INT_MAX : row->position;
    int rank = layer_rank(r, p->layer);
    int rank_b = r->first.found ? (r->first.probe_index < 0 ? -1 : layer_rank(r, r->first.layer)) : 0;
    int order_b = r->first.found && r->first.probe_index >= 0 ? r->probes[r->first.probe_index].order : -1;
    if (!key_before(x->o->baseline != NULL, pos, rank, p->order, row->entry, &r->first, rank_b, order_b)) return;
    dsv4_verify_divergence *d = &r->first;
    d->found = 1;
    d->position = row->position;
    d->layer = p->layer;
    d->entry = row->entry;
    d->probe_index = (int)(p - r->probes);
    snprintf(d->dataset, sizeof d->dataset, "%s", p->dataset);
    d->metric = (dsv4_verify_metric)first_m;
    d->value = first_v;
    d->tolerance = first_t;
    describe(p, row, d->metric, g, c, aux_g, aux_n, d->detail, sizeof d->detail);
}

static void aggregate(dsv4_verify_probe *p)
{
    for (int m = 0; m < DSV4_METRIC_COUNT; m++) {
        double sum = 0;
        int n = 0, is_min = dsv4_verify_metric_is_min(m);
        for (int i = 0; i < p->n_rows; i++) {
            double v = p->rows[i].v[m];
            if (isnan(v)) continue;
            sum += v;
            n++;
            if (p->worst_row[m] < 0 || (is_min ? v < p->worst[m] : v > p->worst[m])) {
                p->worst[m] = v;
                p->worst_row[m] = i;
            }
        }
        p->mean[m] = n ? sum / n : NAN;
    }
}

/* --require: each glob must match a dataset (or probe name) of the golden, or it would require nothing. Returns 1
 * (status set to could-not-compare, naming the glob) for the first that matches none. */
static int require_matches(dsv4_cmp_ctx *x)
{
    const char *req = x->o->require;
    if (!req || !*req) return 0;
    char globs[1024];
    snprintf(globs, sizeof globs, "%s", req);
    char *save = NULL;
    for (char *gl = strtok_r(globs, ",", &save); gl; gl = strtok_r(NULL, ",", &save)) {
        int hit = 0;
        for (int i = 0; i < dsv4_dump_dataset_count(x->g) && !hit; i++) {
            const char *name = dsv4_dump_dataset_name(x->g, i);
            char probe[DSV4_VERIFY_NAME_MAX];
            parse_dataset(name, probe, sizeof probe);
            hit = !fnmatch(gl, name, 0) || !fnmatch(gl, probe, 0);
        }
        if (!hit) {
            fail_compare(x->r, "--require '%s' matches no dataset of the golden (give probe names such as topk_idx, "
                               "datasets such as layers/1/topk_idx or final/logits, or globs such as 'final/*')%s",
                         gl, "");
            return 1;
        }
    }
    return 0;
}

/* A probe --require names that the candidate lacks: one failed structure check, at the first compared position (an
 * entry probe: its first entry's closing position, when compared), in model order with the other failures. */
static int require_failures(dsv4_cmp_ctx *x)
{
    dsv4_verify_result *r = x->r;
    for (int i = 0; i < r->n_probes; i++) {
        dsv4_verify_probe *p = &r->probes[i];
        if (!p->required) continue;
        snprintf(p->note, sizeof p->note, "required by --require, and the candidate does not have %.200s",
                 p->dataset);
        dsv4_verify_row *row = dsv4_cmp_new_row(p, r->positions[0], -1);
        if (!row) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
        row->v[DSV4_METRIC_STRUCTURE] = 1;
        row->failed = 1u << DSV4_METRIC_STRUCTURE;
        r->n_checks++;
        r->n_failed_checks++;
        p->n_failed_rows = 1;
        p->first_failed_row = 0;
        int rank_b = r->first.found ? (r->first.probe_index < 0 ? -1 : layer_rank(r, r->first.layer)) : 0;
        int order_b = r->first.found && r->first.probe_index >= 0 ? r->probes[r->first.probe_index].order : -1;
        if (!key_before(x->o->baseline != NULL, row->position, layer_rank(r, p->layer), p->order, -1, &r->first,
                        rank_b, order_b))
            continue;
        dsv4_verify_divergence *d = &r->first;
        d->found = 1;
        d->position = row->position;
        d->layer = p->layer;
        d->entry = -1;
        d->probe_index = i;
        snprintf(d->dataset, sizeof d->dataset, "%s", p->dataset);
        d->metric = DSV4_METRIC_STRUCTURE;
        d->value = 1;
        d->tolerance = 0;
        snprintf(d->detail, sizeof d->detail, "%s", p->note);
    }
    return 0;
}

/* The first tie-accepted top-k difference: given in the options, or the earliest row of a topk_idx probe with
 * an accepted pick (normal tie tolerance), whichever comes first. Rows computed here are thrown away. */
static int find_first_tie(dsv4_cmp_ctx *x)
{
    dsv4_verify_result *r = x->r;
    const dsv4_verify_options *o = x->o;
    r->profile_after_tie = dsv4_verify_profile_has_after_tie(x->prof);
    x->scan = 1;
    for (int i = 0; i < r->n_probes; i++) {
        dsv4_verify_probe *p = &r->probes[i];
        if (p->presence != DSV4_VERIFY_IN_BOTH || p->kind != DSV4_VERIFY_KIND_TOPK) continue;
        char note[sizeof p->note];
        long long bytes = r->bytes_read;
        memcpy(note, p->note, sizeof note);
        x->scan_hit = 0;
        dsv4_cmp_progress_probe_begin(x, p);
        int rc = dsv4_cmp_probe(x, p);
        dsv4_cmp_progress_probe_end(x);
        memcpy(p->note, note, sizeof note);
        free(p->rows);
        p->rows = NULL;
        p->n_rows = 0;
        r->bytes_read = bytes; /* the report counts each byte once */
        if (rc) {
            x->scan = 0;
            return rc;
        }
    }
    x->scan = 0;
    if (o->tie_at_position >= 0 && o->tie_at_layer >= 0) {
        dsv4_verify_tie *t = &r->first_tie;
        int rank = layer_rank(r, o->tie_at_layer);
        if (!t->found || o->tie_at_position < t->position ||
            (o->tie_at_position == t->position && rank < layer_rank(r, t->layer))) {
            t->found = 1;
            t->given = 1;
            t->position = o->tie_at_position;
            t->layer = o->tie_at_layer;
            t->accepted = 0;
            snprintf(t->dataset, sizeof t->dataset, "layers/%d/topk_idx", o->tie_at_layer);
            t->probe_index = -1;
            for (int i = 0; i < r->n_probes; i++)
                if (!strcmp(r->probes[i].dataset, t->dataset)) t->probe_index = i;
        }
    }
    return 0;
}

/* The plan of another pass over the files x has open, with options o: what verify_once(o) will read (its
 * positions and probes built aside, metadata only; 0 when that pass stops before comparing). */
static int other_plan(const dsv4_cmp_ctx *x, const dsv4_verify_options *o, double *out)
{
    dsv4_verify_result r = {.golden = x->r->golden, .candidate = x->r->candidate, .token_diff_position = -1};
    dsv4_cmp_ctx y = {.r = &r, .o = o, .prof = x->prof, .g = x->g, .c = x->c, .pos_limit = INT_MAX,
                      .entry_limit = INT_MAX};
    *out = 0;
    int rc = layer_table(&y);
    if (!rc && (rc = positions_table(&y)) == 0 && (rc = build_probes(&y)) == 0) *out = dsv4_cmp_pass_plan(&y);
    free(r.layer_attention);
    free(r.layer_mlp);
    free(r.positions);
    free(r.positions_only_golden);
    free(r.probes);
    free(y.grow);
    free(y.crow);
    return rc < 0 ? rc : 0;
}

/* This pass's share of the progress, once its probes are built; the first pass that gets here fixes the total
 * (its plan and the next pass's). */
static int progress_plan(dsv4_cmp_ctx *x)
{
    dsv4_cmp_progress *pr = x->prog;
    double own = dsv4_cmp_pass_plan(x), next = 0;
    if (!pr->planned) {
        int rc = pr->next ? other_plan(x, pr->next, &next) : 0;
        if (rc) return rc;
        pr->total = pr->base + own + next;
        pr->planned = 1;
    }
    x->pass_planned = 1;
    x->pass_at = pr->base;
    x->pass_end = pr->base + own;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run(dsv4_cmp_ctx *x, const char *golden_path, const char *candidate_path)
{
    dsv4_verify_result *r = x->r;
    const dsv4_verify_options *o = x->o;
    int rc = dsv4_verify_profile_load(o->profile, &x->prof);
    for (int i = 0; !rc && i < o->n_tol; i++) rc = dsv4_verify_profile_override(x->prof, o->tol[i]);
    if (rc) {
        fail_compare(r, "profile: %s%s", dsv4_last_error(), "");
        return 0;
    }
    snprintf(r->profile_name, sizeof r->profile_name, "%s", dsv4_verify_profile_name(x->prof));
    snprintf(r->profile_source, sizeof r->profile_source, "%s", dsv4_verify_profile_source(x->prof));
    if (dsv4_dump_open(golden_path, &x->g)) {
        fail_compare(r, "golden: %s%s", dsv4_last_error(), "");
        return 0;
    }
    if (dsv4_dump_open(candidate_path, &x->c)) {
        fail_compare(r, "candidate: %s%s", dsv4_last_error(), "");
        return 0;
    }
    file_info(&r->golden, x->g);
    file_info(&r->candidate, x->c);
    if (!r->golden.path || !r->candidate.path) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
    if (strcmp(r->golden.weights_digest, r->candidate.weights_digest)) {
        if (!o->allow_different_weights) {
            fail_compare(r,
                         "different weights: weights_digest %s (golden) vs %s (candidate); "
                         "pass --allow-different-weights to compare anyway",
                         r->golden.weights_digest, r->candidate.weights_digest);
            return 0;
        }
        r->digests_differ = 1;
    }
    if ((rc = layer_table(x))) return rc;
    if (o->tie_at_position >= 0 && o->tie_at_layer >= 0) { /* a typo there would loosen later gates silently */
        char opt[64], why[160] = "";
        const int L = o->tie_at_layer;
        snprintf(opt, sizeof opt, "%d:%d", o->tie_at_position, L);
        if (L >= r->n_layers)
            snprintf(why, sizeof why, "the dumps have layers 0..%d", r->n_layers - 1);
        else if (strcmp(r->layer_attention[L], "csa") && strcmp(r->layer_attention[L], "?"))
            snprintf(why, sizeof why, "layer %d is %s; only csa layers pick a top-k", L, r->layer_attention[L]);
        else if (o->tie_at_position >= r->golden.n_tokens)
            snprintf(why, sizeof why, "the golden has positions 0..%d", r->golden.n_tokens - 1);
        if (why[0]) {
            fail_compare(r, "--tie-at %s: %s (no comparison can have seen a tie there)", opt, why);
            return 0;
        }
    }
    if (positions_table(x)) return 0;
    if (require_matches(x)) return 0;
    if ((rc = build_probes(x))) return rc;
    if (x->prog && (rc = progress_plan(x))) return rc;
    if (r->n_compared == 0) {
        fail_compare(r, "no common probes to compare%s%s",
                     (o->probes || o->layer_lo >= 0 || o->layer_hi >= 0) ? " (after --probes/--layers)" : "", "");
        return 0;
    }
    if (gates_apply(x)) return 0;
    if (r->token_diff_position >= 0) {
        dsv4_verify_divergence *d = &r->first;
        d->found = 1;
        d->position = r->token_diff_position;
        d->layer = -1;
        d->entry = -1;
        d->probe_index = -1;
        snprintf(d->dataset, sizeof d->dataset, "tokens");
        d->metric = DSV4_METRIC_MISMATCH;
        d->value = 1;
        d->tolerance = 0;
        int greedy = !strcmp(r->golden.mode, "greedy") || !strcmp(r->candidate.mode, "greedy");
        snprintf(d->detail, sizeof d->detail,
                 "golden token %d, candidate token %d: the runs fed different tokens from here on (%s); later "
                 "positions are not compared",
                 r->token_golden, r->token_candidate,
                 greedy ? "greedy runs whose argmax parted" : "different forced tokens");
        r->n_checks++;
        r->n_failed_checks++;
    }
    if ((rc = find_first_tie(x))) return rc;
    if (x->tie_only) return 0; /* the caller wants r->first_tie only; r->status stays ERROR, nothing was judged */
    for (int i = 0; i < r->n_probes; i++) {
        dsv4_verify_probe *p = &r->probes[i];
        if (p->presence != DSV4_VERIFY_IN_BOTH) continue;
        dsv4_cmp_progress_probe_begin(x, p);
        if ((rc = dsv4_cmp_probe(x, p))) return rc;
        dsv4_cmp_progress_probe_end(x);
        aggregate(p);
    }
    if ((rc = require_failures(x))) return rc;
    r->status = r->first.found ? DSV4_VERIFY_DIVERGED : DSV4_VERIFY_PASS;
    return 0;
}

/* One pass over the two files; tie_only: find the first tie and stop (verify_passes' first pass). */
static int verify_once(const char *golden_path, const char *candidate_path, const dsv4_verify_options *o,
                       dsv4_verify_result **out, dsv4_cmp_progress *prog, int tie_only)
{
    *out = NULL;
    DSV4_CHECK(golden_path && candidate_path, "verify: two dump paths are needed");
    dsv4_verify_result *r = calloc(1, sizeof *r);
    if (!r) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
    r->status = DSV4_VERIFY_ERROR;
    r->token_diff_position = -1;
    r->first.probe_index = -1;
    r->first.entry = -1;
    r->first_tie.probe_index = -1;
    dsv4_cmp_ctx x = {.r = r, .o = o, .pos_limit = INT_MAX, .entry_limit = INT_MAX, .tie_only = tie_only,
                      .prog = prog->fn ? prog : NULL};
    double t0 = now_s();
    int rc = run(&x, golden_path, candidate_path);
    r->seconds = now_s() - t0;
    if (x.pass_planned) { /* this pass's bytes are done, whether it read them all or stopped */
        dsv4_cmp_progress_report(&x, x.pass_end);
        prog->base = x.pass_end;
    }
    dsv4_dump_free(x.g);
    dsv4_dump_free(x.c);
    dsv4_verify_profile_free(x.prof);
    free(x.grow);
    free(x.crow);
    free(x.scratch);
    if (rc) {
        /* a failure while reading a file that opened: still a could-not-compare, with the reason */
        if (rc == DSV4_ERR_NOMEM || rc == DSV4_ERR_USAGE) {
            dsv4_verify_result_free(r);
            return rc;
        }
        r->status = DSV4_VERIFY_ERROR;
        snprintf(r->error, sizeof r->error, "%s", dsv4_last_error());
    }
    *out = r;
    return 0;
}

/* Filters (--probes, --layers, --positions) narrow what is compared and shown, not which gates apply: a first
 * tie outside them still puts the later rows under the after_tie gates. So a filtered run first scans the top-k
 * probes, unfiltered, for that tie (a tie_only pass: nothing judged), and then runs as if it had been given by
 * --tie-at (the earlier of the two). */
static int verify_passes(const char *golden_path, const char *candidate_path, const dsv4_verify_options *o,
                         dsv4_verify_result **out, dsv4_cmp_progress *prog)
{
    const int filtered = o->probes || o->layer_lo >= 0 || o->layer_hi >= 0 || o->pos_lo >= 0 || o->pos_hi >= 0;
    if (!filtered) return verify_once(golden_path, candidate_path, o, out, prog, 0);
    dsv4_verify_options all = *o;
    all.probes = "topk_idx";
    all.require = NULL; /* this pass judges nothing */
    all.layer_lo = all.layer_hi = all.pos_lo = all.pos_hi = -1;
    dsv4_verify_result *scan = NULL;
    prog->next = o; /* the total counts this pass and the one after */
    int rc = verify_once(golden_path, candidate_path, &all, &scan, prog, 1);
    prog->next = NULL;
    if (rc) return rc;
    dsv4_verify_tie seen = scan->first_tie;
    dsv4_verify_result_free(scan);
    if (!seen.found || seen.given) return verify_once(golden_path, candidate_path, o, out, prog, 0);
    dsv4_verify_options with_tie = *o;
    const int user_first = o->tie_at_position >= 0 && o->tie_at_layer >= 0 &&
                           (o->tie_at_position < seen.position ||
                            (o->tie_at_position == seen.position && o->tie_at_layer <= seen.layer));
    if (!user_first) {
        with_tie.tie_at_position = seen.position;
        with_tie.tie_at_layer = seen.layer;
    }
    if ((rc = verify_once(golden_path, candidate_path, &with_tie, out, prog, 0))) return rc;
    dsv4_verify_tie *t = &(*out)->first_tie;
    if (!user_first && t->found && t->given && t->position == seen.position && t->layer == seen.layer) {
        t->given = 0; /* seen in these files, if outside the filters */
        t->accepted = seen.accepted;
    }
    return 0;
}

int dsv4_verify_run(const char *golden_path, const char *candidate_path, const dsv4_verify_options *o,
                    dsv4_verify_result **out)
{
    *out = NULL;
    dsv4_verify_options def;
    if (!o) {
        dsv4_verify_options_init(&def);
        o = &def;
    }
    if (o->baseline) return dsv4_verify_baseline_run(golden_path, candidate_path, o, out);
    return dsv4_cmp_run(golden_path, candidate_path, o, out);
}

int dsv4_cmp_run(const char *golden_path, const char *candidate_path, const dsv4_verify_options *o,
                 dsv4_verify_result **out)
{
    *out = NULL;
    dsv4_cmp_progress prog = {.fn = o->progress, .ctx = o->progress_ctx};
    int rc = verify_passes(golden_path, candidate_path, o, out, &prog);
    if (!rc && prog.fn && prog.planned && prog.done < prog.total) { /* a pass planned but never reached */
        prog.done = prog.total;
        prog.fn(prog.ctx, prog.total, prog.total);
    }
    return rc;
}
