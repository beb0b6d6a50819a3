/* compare_probe.c - stream one probe present in both files in row blocks and judge each row.
 *
 * Rows are read in blocks of about 8 MB (dsv4_dump_read_rows on a hyperslab), never a whole dataset, so
 * memory stays bounded whatever the dump size. Per-position probes are compared at the compared positions
 * (their rows in each file come from the position table); per-entry probes row by row, entry w belonging to
 * the position that closes it, (w+1)*ratio - 1.
 *
 * Quiet traps:
 * - indexer_scores rows of the two files may have different widths N (N = entries at the file's last stored
 *   position): the common columns are compared and any finite score in the wider file's extra columns is a
 *   non-finite mismatch (the other file says -inf, invisible).
 * - topk_idx judges picks by the GOLDEN indexer_scores only; the candidate's own scores never decide.
 * - router_weights are paired through each file's router_ids, since the id order is unspecified.
 * - Rows after the first tie (dsv4_cmp_after_tie) take the after_tie tie tolerance for topk_idx and logits.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify_compare.h"

#define DSV4_CMP_BLOCK_BYTES ((size_t)8 << 20)


static void shape_str(const dsv4_dataset_info *info, char *buf, size_t n)
{
    size_t len = (size_t)snprintf(buf, n, "%s[", dsv4_dtype_name(info->dtype));
    for (int d = 0; d < info->ndim && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, d ? ",%lld" : "%lld", (long long)info->shape[d]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

/* One structure-failure row, for a probe that cannot be compared row by row. */
static int structure_row(dsv4_cmp_ctx *x, dsv4_verify_probe *p, int position, int entry)
{
    dsv4_verify_row *row = dsv4_cmp_new_row(p, position, entry);
    if (!row) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
    row->v[DSV4_METRIC_STRUCTURE] = 1;
    dsv4_cmp_judge(x, p, p->n_rows - 1, NULL, NULL, NULL, NULL, 0);
    return 0;
}

/* A buffer of at least `need` bytes, and never NULL: a probe of width 0 ([R, 0], say indexer_scores before the
 * first compressed entry) gives rows of 0 bytes, whose pointers are still offset and passed on. */
static int grow_buf(void **buf, size_t *cap, size_t need)
{
    if (need == 0) need = 1;
    if (need <= *cap) return 0;
    void *b = realloc(*buf, need);
    if (!b) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory (%zu bytes)", need);
    *buf = b;
    *cap = need;
    return 0;
}

/* End of the block of compared positions starting at i whose row spans fit the budget. */
static int block_end(const dsv4_cmp_ctx *x, int i, size_t row_bytes)
{
    int n = x->r->n_positions, j = i + 1;
    while (j < n) {
        int gs = x->grow[j] - x->grow[i] + 1, cs = x->crow[j] - x->crow[i] + 1;
        if ((size_t)(gs > cs ? gs : cs) * row_bytes > DSV4_CMP_BLOCK_BYTES) break;
        j++;
    }
    return j;
}

/* Count finite values in columns [from, width) of row x: entries one file scores and the other hides. */
static void extra_columns(const float *x, int64_t from, int64_t width, dsv4_verify_row *row)
{
    for (int64_t i = from; i < width; i++)
        if (isfinite(x[i])) {
            if (row->nonfinite_at < 0) row->nonfinite_at = i;
            row->v[DSV4_METRIC_NONFINITE] += 1;
        }
}

typedef struct aux_src {
    const char *name; /* dataset in the file, NULL = none */
    size_t elems;     /* per row */
} aux_src;

/* The auxiliary rows a per-position probe reads (topk_idx: the golden indexer_scores; router_weights: both
 * files' router_ids) into ag/ac ({NULL, 0}: none; aux_name [128] holds the name). Returns 0, or 1 when the
 * golden has no usable scores (every pick outside G is strict), 2 when router_ids are missing or mis-shaped in a
 * file (weights paired by position). */
static int aux_sources(const dsv4_cmp_ctx *x, const dsv4_verify_probe *p, char *aux_name, aux_src *ag, aux_src *ac)
{
    const dsv4_verify_result *r = x->r;
    size_t eg = dsv4_cmp_row_elems(&p->golden_info), ec = dsv4_cmp_row_elems(&p->candidate_info);
    *ag = *ac = (aux_src){NULL, 0};
    aux_name[0] = 0;
    if (p->kind != DSV4_VERIFY_KIND_TOPK && p->kind != DSV4_VERIFY_KIND_ROUTER_WEIGHTS) return 0;
    const char *aux = p->kind == DSV4_VERIFY_KIND_TOPK ? "indexer_scores" : "router_ids";
    snprintf(aux_name, 128, "layers/%d/%s", p->layer, aux);
    dsv4_dataset_info ia, ib;
    int want = p->kind == DSV4_VERIFY_KIND_TOPK ? DSV4_DTYPE_F32 : DSV4_DTYPE_I32;
    int okg = dsv4_dump_has(x->g, aux_name) && !dsv4_dump_info(x->g, aux_name, &ia) && (int)ia.dtype == want &&
              ia.shape[0] == r->golden.n_positions;
    int okc = dsv4_dump_has(x->c, aux_name) && !dsv4_dump_info(x->c, aux_name, &ib) && (int)ib.dtype == want &&
              ib.shape[0] == r->candidate.n_positions;
    if (p->kind == DSV4_VERIFY_KIND_TOPK) {
        if (!okg) return 1;
        *ag = (aux_src){aux_name, dsv4_cmp_row_elems(&ia)};
        return 0;
    }
    if (!(okg && okc && dsv4_cmp_row_elems(&ia) == eg && dsv4_cmp_row_elems(&ib) == ec)) return 2;
    *ag = (aux_src){aux_name, eg};
    *ac = (aux_src){aux_name, ec};
    return 0;
}

/* indexer_scores: the layer's typical score, the RMS of the golden's visible scores at its last stored position
 * (the row holding the most entries), which floors every row's norm in rel_l2 (dsv4_verify_scores_f32). This one
 * row is read outside the byte count of the progress plan and the report. 0 when there is none. */
static int score_scale(dsv4_cmp_ctx *x, dsv4_verify_probe *p, size_t eg)
{
    p->row_scale = 0;
    if (p->kind != DSV4_VERIFY_KIND_DENSE || strcmp(p->probe, "indexer_scores") || eg == 0) return 0;
    float *row = malloc(eg * sizeof *row);
    if (!row) return dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
    int rc = dsv4_dump_read_rows(x->g, p->dataset, x->r->golden.n_positions - 1, 1, row);
    double s2 = 0;
    size_t n = 0;
    for (size_t i = 0; !rc && i < eg; i++)
        if (isfinite(row[i])) {
            s2 += (double)row[i] * row[i];
            n++;
        }
    free(row);
    if (!rc && n) p->row_scale = sqrt(s2 / (double)n);
    return rc;
}

static int per_position(dsv4_cmp_ctx *x, dsv4_verify_probe *p)
{
    dsv4_verify_result *r = x->r;
    const dsv4_dataset_info *gi = &p->golden_info, *ci = &p->candidate_info;
    size_t eg = dsv4_cmp_row_elems(gi), ec = dsv4_cmp_row_elems(ci);
    char aux_name[128];
    aux_src ag, ac;
    int aux = aux_sources(x, p, aux_name, &ag, &ac);
    if (aux == 1)
        snprintf(p->note, sizeof p->note, "the golden has no usable %s: every pick outside the golden set is strict",
                 aux_name);
    else if (aux == 2)
        snprintf(p->note, sizeof p->note, "%s missing or mis-shaped in a file: weights paired by position", aux_name);
    size_t row_bytes = 4 * ((eg > ec ? eg : ec) + ag.elems + ac.elems);
    void *gb = NULL, *cb = NULL, *gab = NULL, *cab = NULL;
    size_t gcap = 0, ccap = 0, gacap = 0, cacap = 0;
    int rc = x->scan ? 0 : score_scale(x, p, eg);
    for (int i = 0; i < r->n_positions && !rc && !(x->scan && x->scan_hit);) {
        int j = block_end(x, i, row_bytes), nb = j - i;
        if ((rc = grow_buf(&gb, &gcap, (size_t)nb * eg * 4)) || (rc = grow_buf(&cb, &ccap, (size_t)nb * ec * 4))) break;
        if ((rc = dsv4_cmp_read_rows(x, x->g, p->dataset, x->grow + i, nb, eg * 4, gb))) break;
        if ((rc = dsv4_cmp_read_rows(x, x->c, p->dataset, x->crow + i, nb, ec * 4, cb))) break;
        if (ag.name) {
            if ((rc = grow_buf(&gab, &gacap, (size_t)nb * ag.elems * 4))) break;
            if ((rc = dsv4_cmp_read_rows(x, x->g, ag.name, x->grow + i, nb, ag.elems * 4, gab))) break;
        }
        if (ac.name) {
            if ((rc = grow_buf(&cab, &cacap, (size_t)nb * ac.elems * 4))) break;
            if ((rc = dsv4_cmp_read_rows(x, x->c, ac.name, x->crow + i, nb, ac.elems * 4, cab))) break;
        }
        for (int t = 0; t < nb; t++) {
            const float *gf = (const float *)gb + (size_t)t * eg, *cf = (const float *)cb + (size_t)t * ec;
            const void *ga = ag.name ? (const char *)gab + (size_t)t * ag.elems * 4 : NULL;
            const void *ca = ac.name ? (const char *)cab + (size_t)t * ac.elems * 4 : NULL;
            dsv4_verify_row *row = dsv4_cmp_new_row(p, r->positions[i + t], -1);
            if (!row) {
                rc = dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
                break;
            }
            int64_t w = (int64_t)(eg < ec ? eg : ec);
            /* after the first tie the tie tolerance is the after_tie one too (the scores have moved) */
            int after = dsv4_cmp_after_tie(x, p, row->position, -1);
            double tie_abs = after ? p->after_tie_abs : p->tie_abs, tie_rel = after ? p->after_tie_rel : p->tie_rel;
            /* after the tie, the same row under the normal tie tolerance too: whether it passed only thanks to
             * the after_tie one (the gates on strict picks and argmax do not change, their tie tolerance does) */
            dsv4_verify_row normal_tie;
            const int tie_kind = p->kind == DSV4_VERIFY_KIND_TOPK || p->kind == DSV4_VERIFY_KIND_LOGITS;
            const int shadow = after && tie_kind && (tie_abs != p->tie_abs || tie_rel != p->tie_rel);
            if (shadow) dsv4_verify_row_clear(&normal_tie, row->position, row->entry);
            switch (p->kind) {
            case DSV4_VERIFY_KIND_TOPK:
                dsv4_verify_topk((const int32_t *)gf, (const int32_t *)cf, (int)eg, ga, (int64_t)ag.elems, tie_abs,
                                 tie_rel, row);
                if (shadow)
                    dsv4_verify_topk((const int32_t *)gf, (const int32_t *)cf, (int)eg, ga, (int64_t)ag.elems,
                                     p->tie_abs, p->tie_rel, &normal_tie);
                break;
            case DSV4_VERIFY_KIND_ROUTER_IDS:
                dsv4_verify_router_ids((const int32_t *)gf, (const int32_t *)cf, (int)eg, row);
                break;
            case DSV4_VERIFY_KIND_ROUTER_WEIGHTS: dsv4_verify_router_weights(gf, cf, ga, ca, (int)eg, row); break;
            case DSV4_VERIFY_KIND_LOGITS:
                dsv4_verify_logits(gf, cf, w, tie_abs, tie_rel, row);
                if (shadow) { /* only argmax depends on the tie tolerance: not the dense metrics and KL again */
                    normal_tie = *row;
                    dsv4_verify_logits_argmax(gf, w, p->tie_abs, p->tie_rel, &normal_tie);
                }
                break;
            case DSV4_VERIFY_KIND_INT: dsv4_verify_int((const int32_t *)gf, (const int32_t *)cf, w, row); break;
            default:
                dsv4_verify_scores_f32(gf, cf, w, p->row_scale, row); /* dense; indexer_scores floored */
                if (eg > ec) extra_columns(gf, w, (int64_t)eg, row);
                if (ec > eg) extra_columns(cf, w, (int64_t)ec, row);
                break;
            }
            x->normal_tie_v = shadow ? normal_tie.v : NULL;
            dsv4_cmp_judge(x, p, p->n_rows - 1, gf, cf, ga, ca, (int64_t)ag.elems);
            x->normal_tie_v = NULL;
        }
        i = j;
    }
    free(gb);
    free(cb);
    free(gab);
    free(cab);
    return rc;
}

/* The position closing entry w of layer L, or -1 when the ratio is unknown. */
static int entry_position(const dsv4_cmp_ctx *x, int layer, int64_t w)
{
    if (!x->cfg || layer < 0 || layer >= DSV4_MAX_LAYERS || x->cfg->compress_ratio[layer] <= 0) return -1;
    int64_t p = (w + 1) * x->cfg->compress_ratio[layer] - 1;
    return p > INT_MAX ? INT_MAX : (int)p;
}

static int entry_included(const dsv4_cmp_ctx *x, int pos)
{
    if (pos < 0) return 1;
    if (pos >= x->entry_limit) return 0;
    if (x->o->pos_lo >= 0 && pos < x->o->pos_lo) return 0;
    if (x->o->pos_hi >= 0 && pos > x->o->pos_hi) return 0;
    return 1;
}

static int per_entry(dsv4_cmp_ctx *x, dsv4_verify_probe *p)
{
    const dsv4_dataset_info *gi = &p->golden_info, *ci = &p->candidate_info;
    size_t e = dsv4_cmp_row_elems(gi);
    int64_t ng = gi->shape[0], nc = ci->shape[0], n = ng < nc ? ng : nc;
    int64_t block = (int64_t)(DSV4_CMP_BLOCK_BYTES / (e ? e * 4 : 4));
    if (block < 1) block = 1;
    float *gb = malloc((size_t)block * e * 4 + 4), *cb = malloc((size_t)block * e * 4 + 4);
    int rc = 0;
    if (!gb || !cb) rc = dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
    for (int64_t w0 = 0; w0 < n && !rc; w0 += block) {
        int64_t nb = n - w0 < block ? n - w0 : block;
        /* skip blocks that hold no included entry (positions ascend with w) */
        int first_pos = entry_position(x, p->layer, w0);
        if (first_pos >= 0 && first_pos >= x->entry_limit) break;
        if ((rc = dsv4_dump_read_rows(x->g, p->dataset, w0, nb, gb))) break;
        if ((rc = dsv4_dump_read_rows(x->c, p->dataset, w0, nb, cb))) break;
        x->r->bytes_read += 2LL * nb * (long long)e * 4;
        dsv4_cmp_progress_read(x, 2.0 * (double)nb * (double)e * 4);
        for (int64_t t = 0; t < nb; t++) {
            int pos = entry_position(x, p->layer, w0 + t);
            if (!entry_included(x, pos)) continue;
            dsv4_verify_row *row = dsv4_cmp_new_row(p, pos, (int)(w0 + t));
            if (!row) {
                rc = dsv4_error(DSV4_ERR_NOMEM, "verify: out of memory");
                break;
            }
            dsv4_verify_dense_f32(gb + t * (int64_t)e, cb + t * (int64_t)e, (int64_t)e, row);
            dsv4_cmp_judge(x, p, p->n_rows - 1, gb + t * (int64_t)e, cb + t * (int64_t)e, NULL, NULL, 0);
        }
    }
    free(gb);
    free(cb);
    if (rc) return rc;
    /* entries one file made and the other did not (within the compared range) */
    int64_t nmax = ng > nc ? ng : nc;
    for (int64_t w = n; w < nmax; w++) {
        int pos = entry_position(x, p->layer, w);
        if (!entry_included(x, pos)) continue;
        snprintf(p->note, sizeof p->note,
                 "the golden has %lld entries, the candidate %lld: entry %lld is missing in the %s", (long long)ng,
                 (long long)nc, (long long)w, ng > nc ? "candidate" : "golden");
        return structure_row(x, p, pos, (int)w);
    }
    return 0;
}

static int float_kind(const dsv4_verify_probe *p)
{
    return p->kind != DSV4_VERIFY_KIND_TOPK && p->kind != DSV4_VERIFY_KIND_ROUTER_IDS && p->kind != DSV4_VERIFY_KIND_INT;
}

/* 1 when p's rows differ in shape between the files: rank, or a dimension past the first (indexer_scores rows
 * may differ in width: the live entries of each file). */
static int row_shapes_differ(const dsv4_verify_probe *p)
{
    const dsv4_dataset_info *gi = &p->golden_info, *ci = &p->candidate_info;
    if (gi->ndim != ci->ndim) return 1;
    for (int d = 1; d < gi->ndim; d++)
        if (gi->shape[d] != ci->shape[d] && !(d == 1 && !strcmp(p->probe, "indexer_scores"))) return 1;
    return 0;
}

/* 1 when the rows of p can be compared: the same dtype (the one its kind reads) and row shape in both files
 * (indexer_scores rows may differ in width), and for a per-position probe as many rows as stored positions (else
 * -1); 0 otherwise. */
static int probe_comparable(const dsv4_cmp_ctx *x, const dsv4_verify_probe *p)
{
    const dsv4_dataset_info *gi = &p->golden_info, *ci = &p->candidate_info;
    int same = gi->dtype == ci->dtype && gi->ndim >= 1 && !row_shapes_differ(p);
    if (same && (gi->dtype == DSV4_DTYPE_F32) != float_kind(p)) same = 0;
    if (same && p->kind != DSV4_VERIFY_KIND_ENTRIES &&
        (gi->shape[0] != x->r->golden.n_positions || ci->shape[0] != x->r->candidate.n_positions))
        same = -1;
    return same;
}

/* Mirrors what per_entry and per_position read (dsv4_cmp_read_rows counts the span of each block's rows). */
double dsv4_cmp_probe_plan(const dsv4_cmp_ctx *x, const dsv4_verify_probe *p)
{
    const dsv4_dataset_info *gi = &p->golden_info, *ci = &p->candidate_info;
    if (gi->ndim == 0 || ci->ndim == 0 || probe_comparable(x, p) != 1) return 0; /* one structure row */
    double sum = 0;
    if (p->kind == DSV4_VERIFY_KIND_ENTRIES) {
        size_t e = dsv4_cmp_row_elems(gi);
        int64_t n = gi->shape[0] < ci->shape[0] ? gi->shape[0] : ci->shape[0];
        int64_t block = (int64_t)(DSV4_CMP_BLOCK_BYTES / (e ? e * 4 : 4));
        if (block < 1) block = 1;
        for (int64_t w0 = 0; w0 < n; w0 += block) {
            int first_pos = entry_position(x, p->layer, w0);
            if (first_pos >= 0 && first_pos >= x->entry_limit) break;
            sum += 2.0 * (double)(n - w0 < block ? n - w0 : block) * (double)e * 4;
        }
        return sum;
    }
    size_t eg = dsv4_cmp_row_elems(gi), ec = dsv4_cmp_row_elems(ci);
    char aux_name[128];
    aux_src ag, ac;
    aux_sources(x, p, aux_name, &ag, &ac);
    size_t row_bytes = 4 * ((eg > ec ? eg : ec) + ag.elems + ac.elems);
    for (int i = 0; i < x->r->n_positions;) {
        int j = block_end(x, i, row_bytes);
        double gs = x->grow[j - 1] - x->grow[i] + 1, cs = x->crow[j - 1] - x->crow[i] + 1;
        sum += 4 * (gs * (double)(eg + ag.elems) + cs * (double)(ec + ac.elems));
        i = j;
    }
    return sum;
}

int dsv4_cmp_probe(dsv4_cmp_ctx *x, dsv4_verify_probe *p)
{
    const dsv4_dataset_info *gi = &p->golden_info, *ci = &p->candidate_info;
    int same = probe_comparable(x, p);
    int entries = p->kind == DSV4_VERIFY_KIND_ENTRIES;
    int first_pos = entries ? entry_position(x, p->layer, 0) : x->r->positions[0];
    if (gi->ndim == 0 || ci->ndim == 0) /* the reader rejected it; p->note holds why */
        return structure_row(x, p, first_pos, entries ? 0 : -1);
    if (same != 1) {
        char a[48], b[48];
        shape_str(gi, a, sizeof a);
        shape_str(ci, b, sizeof b);
        const int shapes = row_shapes_differ(p);
        if (same == 0 && gi->dtype == ci->dtype && !shapes) /* both files agree, on a dtype this probe cannot be */
            snprintf(p->note, sizeof p->note, "%.40s is compared as %s, but both files store %s (golden %s, candidate %s)",
                     p->probe, float_kind(p) ? "floats" : "integer ids", dsv4_dtype_name(gi->dtype), a, b);
        else if (same == 0)
            snprintf(p->note, sizeof p->note, "%s differ: golden %s, candidate %s",
                     gi->dtype != ci->dtype ? (shapes ? "dtypes and shapes" : "dtypes") : "shapes", a, b);
        else
            snprintf(p->note, sizeof p->note,
                     "first dimension is not the number of stored positions (golden %s for %d, candidate %s for %d)", a,
                     x->r->golden.n_positions, b, x->r->candidate.n_positions);
        return structure_row(x, p, first_pos, entries ? 0 : -1);
    }
    return entries ? per_entry(x, p) : per_position(x, p);
}
