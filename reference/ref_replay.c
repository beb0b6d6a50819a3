/* ref_replay.c - the candidate state that layer-local replay injects into either reference (issue 40, docs/verify.md
 * "Layer-local replay"; dsv4_ref.h): one data model, read row by row by ref_forward.c and uploaded per forward call
 * by ref_gpu.cu.
 *
 * A free-running candidate cannot follow the reference's choices, so after one near-tie flip its caches differ and
 * a comparison against the reference's own trajectory compounds every earlier difference. Replay judges each layer
 * on the candidate's OWN inputs instead: the reference runs the sequence once more, and at every layer it starts from
 * the candidate's residual streams, reads the candidate's window KV and compressed / indexer entries, runs on the
 * candidate's top-k and router choices, and rebuilds the streams between the two sublayers from the candidate's
 * attention output and mHC post / comb. What it computes (and dumps) is then what layer L adds to the candidate's
 * state; the candidate's own probes are compared with it.
 *
 * What a candidate must dump (dsv4_ref_replay_load refuses it otherwise, naming what is missing), at every position it
 * stores: per layer `out`, `kv`, `attn_out`, `attn_hc_post`, `attn_hc_comb`, `router_ids`, and `topk_idx` (CSA
 * layers); and the per-entry `compressed_kv` (CSA, HCA) and `indexer_kv` (CSA) of every entry closed by T. The rest of
 * its probes are compared when present.
 *
 * Positions (docs/verify.md "Layer-local replay", "Replay at long context"): a candidate may store a subset. The
 * stored positions fall into runs of consecutive positions; a stored position p is COMPARED when its whole window
 * max(0, p-W+1)..p lies in its run (W = sliding_window): layer L at p reads the window KV of those positions, the
 * entries (all stored) and nothing else of earlier positions. The reference runs each run that holds a compared
 * position (a "segment", dsv4_ref_replay_segment) and nothing between them; before a segment starting at a, the pools
 * hold the candidate's entries w < a div r (the reference's entry count is set to a div r). An entry the reference
 * makes is JUDGED (shown in the replay's dump) only when every position of its window (CSA: r(w-1)..r(w+1)-1, clipped
 * at 0; HCA: rw..r(w+1)-1) lies in one segment; the dump shows the candidate's own entry elsewhere (nothing to judge).
 * With every position stored there is one segment 0..T-1: every position compared, every entry judged.
 *
 * Invariants that fail quietly:
 * - Within a segment every position is stored, so the rows of the positions of one forward call are consecutive rows
 *   of the candidate's datasets (dsv4_ref_replay_rows_at).
 * - Rows are held whole in memory ([stored positions, width] per dataset, [entries, width] for the pools): a Flash-
 *   width candidate must store a subset (a few windows) to stay small.
 * - A top-k row of -1 only (prefill rows before the first entry) is "no choice": the reference keeps its own (none).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_ref.h"

static const char *const replay_names[DSV4_REF_REPLAY_COUNT] = {"out", "kv", "attn_out", "attn_hc_post",
                                                               "attn_hc_comb", "topk_idx", "router_ids",
                                                               "compressed_kv", "indexer_kv"};
_Static_assert(sizeof replay_names / sizeof replay_names[0] == DSV4_REF_REPLAY_COUNT, "one name per replay kind");

struct dsv4_ref_replay {
    char *path;
    char digest[65];
    int n_layers, n_tokens, n_pos, window;
    int32_t *tokens;                                    /* [n_tokens] */
    int32_t *row_of;                                    /* [n_tokens] the dataset row of position p, -1 not stored */
    int32_t *seg_of;                                    /* [n_tokens] the segment holding p, -1 none */
    int n_seg;
    int32_t *seg;                                       /* [2 n_seg] first, last position of each segment */
    int n_cmp;
    int32_t *cmp;                                       /* [n_cmp] the compared positions, ascending */
    int width[DSV4_REF_REPLAY_COUNT][DSV4_MAX_LAYERS];  /* elements per row (0: the layer has no such rows) */
    int64_t rows[DSV4_REF_REPLAY_COUNT][DSV4_MAX_LAYERS]; /* rows held: stored positions, or entries for the pools */
    void *data[DSV4_REF_REPLAY_COUNT][DSV4_MAX_LAYERS]; /* [rows, width] f32 or (topk_idx, router_ids) i32 */
};

static int is_ids(int kind) { return kind == DSV4_REF_REPLAY_TOPK || kind == DSV4_REF_REPLAY_ROUTER; }

/* Which kinds layer L needs, and each row's width (0: none), from the config. */
static int needed_width(const dsv4_config *f, int kind, int L)
{
    const int csa = f->attn_type[L] == DSV4_ATTN_CSA, compress = f->compress_ratio[L] > 0;
    switch (kind) {
    case DSV4_REF_REPLAY_OUT: return f->hc_mult * f->hidden_size;
    case DSV4_REF_REPLAY_KV: return f->head_dim;
    case DSV4_REF_REPLAY_ATTN_OUT: return f->hidden_size;
    case DSV4_REF_REPLAY_HC_POST: return f->hc_mult;
    case DSV4_REF_REPLAY_HC_COMB: return f->hc_mult * f->hc_mult;
    case DSV4_REF_REPLAY_TOPK: return csa && f->index_topk > 0 ? f->index_topk : 0;
    case DSV4_REF_REPLAY_ROUTER: return f->num_experts_per_tok;
    case DSV4_REF_REPLAY_CMP: return compress ? f->head_dim : 0;
    case DSV4_REF_REPLAY_IDX: return csa ? f->index_head_dim : 0;
    default: return 0;
    }
}

/* Append "name" to the list of what is missing (the first few, then a count). */
static void note_missing(char *list, size_t n, int *count, const char *what)
{
    size_t len = strlen(list);
    if (*count < 8 && len + 2 < n) snprintf(list + len, n - len, "%s%s", *count ? ", " : "", what);
    (*count)++;
}

/* From the stored positions pos [n_pos] (ascending): row_of, the segments (runs of consecutive stored positions that
 * hold a compared position), seg_of and the compared positions. DSV4_ERR_USAGE when nothing can be compared. */
static int plan_segments(dsv4_ref_replay *r, const int32_t *pos, const char *path)
{
    const int T = r->n_tokens, W = r->window > 0 ? r->window : 1;
    for (int p = 0; p < T; p++) r->row_of[p] = r->seg_of[p] = -1;
    for (int i = 0; i < r->n_pos; i++) {
        if (pos[i] < 0 || pos[i] >= T || (i > 0 && pos[i] <= pos[i - 1]))
            return dsv4_error(DSV4_ERR_FORMAT, "%s: /positions is not ascending in [0, %d) at row %d", path, T, i);
        r->row_of[pos[i]] = i;
    }
    r->n_seg = r->n_cmp = 0;
    int longest = 0;
    for (int i = 0; i < r->n_pos;) {
        int j = i; /* the run pos[i] .. pos[j] */
        while (j + 1 < r->n_pos && pos[j + 1] == pos[j] + 1) j++;
        const int a = pos[i], b = pos[j], first = a == 0 ? a : a + W - 1; /* the first compared position */
        if (b - a + 1 > longest) longest = b - a + 1;
        if (first <= b) {
            r->seg[2 * r->n_seg] = a;
            r->seg[2 * r->n_seg + 1] = b;
            for (int p = a; p <= b; p++) r->seg_of[p] = r->n_seg;
            for (int p = first; p <= b; p++) r->cmp[r->n_cmp++] = p;
            r->n_seg++;
        }
        i = j + 1;
    }
    if (!r->n_cmp)
        return dsv4_error(DSV4_ERR_USAGE, "%s: replay compares a position p only when the candidate stores every "
                          "position of its window max(0, p-%d)..p (sliding_window %d); it stores %d positions, at most "
                          "%d consecutive ones and none of them from 0: dump a run of at least %d consecutive "
                          "positions (or all)", path, W - 1, W, r->n_pos, longest, W);
    return 0;
}

int dsv4_ref_replay_load(const char *path, const dsv4_config *cfg, dsv4_ref_replay **out)
{
    DSV4_CHECK(path && cfg && out, "dsv4_ref_replay_load: NULL argument");
    *out = NULL;
    dsv4_dump *d = NULL;
    int rc = dsv4_dump_open(path, &d);
    if (rc) return rc;
    dsv4_ref_replay *r = calloc(1, sizeof *r);
    const dsv4_config *dc = NULL;
    if (!r || !(r->path = strdup(path))) rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
    if (!rc) rc = dsv4_dump_config(d, &dc);
    if (!rc && (dc->num_hidden_layers != cfg->num_hidden_layers || dc->hidden_size != cfg->hidden_size ||
                dc->hc_mult != cfg->hc_mult || dc->head_dim != cfg->head_dim || dc->index_topk != cfg->index_topk ||
                dc->num_experts_per_tok != cfg->num_experts_per_tok))
        rc = dsv4_error(DSV4_ERR_SHAPE, "%s: the candidate's config is another model's (layers, widths, top-k or "
                        "experts per token differ from the model's)", path);
    int n_tok = 0, n_pos = 0;
    const int32_t *tok = rc ? NULL : dsv4_dump_tokens(d, &n_tok), *pos = rc ? NULL : dsv4_dump_positions(d, &n_pos);
    if (!rc) {
        snprintf(r->digest, sizeof r->digest, "%s", dsv4_dump_attr(d, "weights_digest"));
        r->n_layers = cfg->num_hidden_layers;
        r->n_tokens = n_tok;
        r->n_pos = n_pos;
        r->window = cfg->sliding_window;
        if (n_tok < 1 || n_pos < 1) rc = dsv4_error(DSV4_ERR_USAGE, "%s: no tokens or no stored positions", path);
    }
    if (!rc && (!(r->tokens = malloc((size_t)n_tok * sizeof *r->tokens)) ||
                !(r->row_of = malloc((size_t)n_tok * sizeof *r->row_of)) ||
                !(r->seg_of = malloc((size_t)n_tok * sizeof *r->seg_of)) ||
                !(r->seg = malloc(2 * ((size_t)n_pos + 1) * sizeof *r->seg)) ||
                !(r->cmp = malloc(((size_t)n_pos + 1) * sizeof *r->cmp))))
        rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
    if (!rc) {
        memcpy(r->tokens, tok, (size_t)n_tok * sizeof *tok);
        rc = plan_segments(r, pos, path);
    }
    /* what is missing, all of it in one message */
    char missing[640] = "";
    int n_missing = 0;
    for (int L = 0; !rc && L < r->n_layers; L++)
        for (int k = 0; k < DSV4_REF_REPLAY_COUNT; k++) {
            const int w = needed_width(cfg, k, L);
            if (!w) continue;
            char name[96];
            snprintf(name, sizeof name, "layers/%d/%s", L, replay_names[k]);
            dsv4_dataset_info info;
            const int entries = k == DSV4_REF_REPLAY_CMP || k == DSV4_REF_REPLAY_IDX;
            const int64_t want = entries ? n_tok / cfg->compress_ratio[L] : n_pos;
            if (!dsv4_dump_has(d, name)) {
                note_missing(missing, sizeof missing, &n_missing, name);
                continue;
            }
            if ((rc = dsv4_dump_info(d, name, &info))) break;
            int64_t width = 1;
            for (int j = 1; j < info.ndim; j++) width *= info.shape[j];
            if (info.dtype != (is_ids(k) ? DSV4_DTYPE_I32 : DSV4_DTYPE_F32) || width != w || info.shape[0] < want) {
                rc = dsv4_error(DSV4_ERR_USAGE, "%s: %s is %s with %lld rows of %lld; replay needs %s rows of %d, %lld "
                                "of them (%s)", path, name, dsv4_dtype_name(info.dtype), (long long)info.shape[0],
                                (long long)width, is_ids(k) ? "int32" : "f32", w, (long long)want,
                                entries ? "every entry closed by the last position" : "every stored position");
                break;
            }
            r->width[k][L] = w;
            r->rows[k][L] = want;
            const size_t bytes = (size_t)want * (size_t)w * 4;
            if (!(r->data[k][L] = malloc(bytes ? bytes : 1))) {
                rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory for %s (%zu bytes)", path, name, bytes);
                break;
            }
            if (want && (rc = dsv4_dump_read_rows(d, name, 0, want, r->data[k][L]))) break;
        }
    if (!rc && n_missing)
        rc = dsv4_error(DSV4_ERR_USAGE, "%s: replay needs probes the candidate did not dump (%d): %s%s", path,
                        n_missing, missing, n_missing > 8 ? ", ..." : "");
    dsv4_dump_free(d);
    if (rc) {
        dsv4_ref_replay_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void dsv4_ref_replay_free(dsv4_ref_replay *r)
{
    if (!r) return;
    for (int k = 0; k < DSV4_REF_REPLAY_COUNT; k++)
        for (int L = 0; L < DSV4_MAX_LAYERS; L++) free(r->data[k][L]);
    free(r->tokens);
    free(r->row_of);
    free(r->seg_of);
    free(r->seg);
    free(r->cmp);
    free(r->path);
    free(r);
}

const char *dsv4_ref_replay_path(const dsv4_ref_replay *r) { return r ? r->path : NULL; }
const char *dsv4_ref_replay_weights_digest(const dsv4_ref_replay *r) { return r ? r->digest : NULL; }

const int32_t *dsv4_ref_replay_tokens(const dsv4_ref_replay *r, int *n)
{
    if (n) *n = r ? r->n_tokens : 0;
    return r ? r->tokens : NULL;
}

/* The dataset row of `row` (a position, or an entry of the per-entry kinds), -1 when not held. */
static int64_t row_index(const dsv4_ref_replay *r, dsv4_ref_replay_kind kind, int layer, int64_t row)
{
    if (!r || (unsigned)kind >= DSV4_REF_REPLAY_COUNT || layer < 0 || layer >= r->n_layers || row < 0 ||
        !r->data[kind][layer])
        return -1;
    const int64_t i = kind == DSV4_REF_REPLAY_CMP || kind == DSV4_REF_REPLAY_IDX ? row
                      : row < r->n_tokens                                      ? r->row_of[row]
                                                                               : -1;
    return i >= 0 && i < r->rows[kind][layer] ? i : -1;
}

const void *dsv4_ref_replay_row(const dsv4_ref_replay *r, dsv4_ref_replay_kind kind, int layer, int64_t row)
{
    const int64_t i = row_index(r, kind, layer, row);
    return i < 0 ? NULL : (const char *)r->data[kind][layer] + (size_t)i * (size_t)r->width[kind][layer] * 4;
}

const void *dsv4_ref_replay_rows_at(const dsv4_ref_replay *r, dsv4_ref_replay_kind kind, int layer, int64_t row,
                                    int n)
{
    const int64_t i = row_index(r, kind, layer, row), j = row_index(r, kind, layer, row + n - 1);
    if (n < 1 || i < 0 || j != i + n - 1) return NULL;
    return dsv4_ref_replay_row(r, kind, layer, row);
}

int64_t dsv4_ref_replay_rows(const dsv4_ref_replay *r, dsv4_ref_replay_kind kind, int layer)
{
    return r && (unsigned)kind < DSV4_REF_REPLAY_COUNT && layer >= 0 && layer < r->n_layers ? r->rows[kind][layer] : 0;
}

int dsv4_ref_replay_segments(const dsv4_ref_replay *r) { return r ? r->n_seg : 0; }

void dsv4_ref_replay_segment(const dsv4_ref_replay *r, int i, int *first, int *last)
{
    *first = r->seg[2 * i];
    *last = r->seg[2 * i + 1];
}

const int32_t *dsv4_ref_replay_compared(const dsv4_ref_replay *r, int *n)
{
    if (n) *n = r ? r->n_cmp : 0;
    return r ? r->cmp : NULL;
}

int dsv4_ref_replay_entry_judged(const dsv4_ref_replay *r, int ratio, int overlap, int64_t w)
{
    int64_t lo = overlap ? (int64_t)ratio * (w - 1) : (int64_t)ratio * w, hi = (int64_t)ratio * (w + 1) - 1;
    if (lo < 0) lo = 0;
    if (!r || ratio < 1 || w < 0 || hi >= r->n_tokens) return 0;
    return r->seg_of[lo] >= 0 && r->seg_of[lo] == r->seg_of[hi];
}
