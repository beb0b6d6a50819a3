/* opt_follow.c - the table of a dump's discrete choices that `dsv4 run --path opt --follow DUMP` runs on
 * (dsv4_opt.h "Decision following"; dump-format.md topk_idx, router_ids). Host code only, no CUDA: it is built in
 * the CPU-only build too, so the loader is tested without a GPU.
 *
 * The dump is read once, whole datasets at a time, into [rows, width] int32 arrays per layer and kind, with a
 * position -> row map; the step then looks a row up per (layer, position) without touching HDF5.
 * Invariants that fail quietly:
 * - A row of -1 only (transformers and the references pad rows before the first entry exists) is "no row": the
 *   path keeps its own selection there. A top-k row may be partly -1 (fewer visible entries than index_topk):
 *   it is used as it is (the gather drops -1).
 * - A router row must name k distinct experts in [0, E): the experts kernel indexes weights by them. A top-k id
 *   at or past (p+1) div ratio would be an entry that does not exist yet at p; both are refused at load, with
 *   the file, dataset and position, rather than clamped.
 * - The dump's config must be the model's in every dimension a row depends on: otherwise the ids are about
 *   another model and following them is meaningless (ids of a 512-wide top-k cut to 4, say).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_opt.h"

struct dsv4_opt_follow {
    char *path;
    char digest[65];                      /* the dump's weights_digest */
    int n_layers;
    int width[2];                         /* TOPK: index_topk, ROUTER: num_experts_per_tok */
    int n_tokens;
    int32_t *tokens;                      /* [n_tokens] the dump's /tokens */
    int n_rows;                           /* |/positions| */
    int32_t *row_of_pos;                  /* [n_tokens]: row in /positions, -1 = not stored */
    int32_t *ids[2][DSV4_MAX_LAYERS];     /* [n_rows, width] or NULL (layer absent) */
    uint8_t *has[2][DSV4_MAX_LAYERS];     /* [n_rows]: 1 = a row to follow (not -1 only) */
    long n_have[2];
};

static const char *const kind_probe[2] = {"topk_idx", "router_ids"};

/* The dump's config against the model's, in every field a followed row depends on. */
static int follow_check_config(const char *path, const dsv4_config *d, const dsv4_config *m)
{
#define SAME(field)                                                                                              \
    if (d->field != m->field)                                                                                    \
        return dsv4_error(DSV4_ERR_SHAPE, "%s: the dump's config has " #field " %d, the model %d: its choices "  \
                          "are about another model", path, (int)d->field, (int)m->field);
    SAME(num_hidden_layers)
    SAME(index_topk)
    SAME(num_experts_per_tok)
    SAME(n_routed_experts)
    SAME(compress_rate_csa)
#undef SAME
    for (int L = 0; L < m->num_hidden_layers; L++)
        if (d->attn_type[L] != m->attn_type[L] || d->mlp_type[L] != m->mlp_type[L] ||
            d->compress_ratio[L] != m->compress_ratio[L])
            return dsv4_error(DSV4_ERR_SHAPE, "%s: layer %d is %s/%s ratio %d in the dump, %s/%s ratio %d in the "
                              "model", path, L, dsv4_attn_type_name(d->attn_type[L]),
                              dsv4_mlp_type_name(d->mlp_type[L]), d->compress_ratio[L],
                              dsv4_attn_type_name(m->attn_type[L]), dsv4_mlp_type_name(m->mlp_type[L]),
                              m->compress_ratio[L]);
    return 0;
}

/* Read layer L's dataset of `kind` (when the dump has it) into f and check every row. */
static int follow_read_layer(dsv4_opt_follow *f, const dsv4_dump *d, const dsv4_config *cfg, const int32_t *pos,
                             int kind, int L)
{
    char name[96];
    snprintf(name, sizeof name, "layers/%d/%s", L, kind_probe[kind]);
    if (!dsv4_dump_has(d, name)) return 0;
    dsv4_dataset_info info;
    int rc = dsv4_dump_info(d, name, &info);
    if (rc) return rc;
    const int w = f->width[kind];
    if (info.dtype != DSV4_DTYPE_I32 || info.ndim != 2 || info.shape[0] != f->n_rows || info.shape[1] != w)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: %s is %s [%lld, %lld], want int32 [%d, %d] (/positions x %s)", f->path,
                          name, dsv4_dtype_name(info.dtype), (long long)info.shape[0],
                          (long long)(info.ndim > 1 ? info.shape[1] : 0), f->n_rows, w,
                          kind ? "num_experts_per_tok" : "index_topk");
    int32_t *ids = malloc(((size_t)f->n_rows * w + 1) * sizeof *ids);
    uint8_t *has = calloc((size_t)f->n_rows + 1, 1);
    f->ids[kind][L] = ids;
    f->has[kind][L] = has;
    if (!ids || !has) return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory for %s", f->path, name);
    if ((rc = dsv4_dump_read_rows(d, name, 0, f->n_rows, ids))) return rc;
    const int E = cfg->n_routed_experts, ratio = cfg->compress_ratio[L];
    for (int r = 0; r < f->n_rows; r++) {
        const int32_t *row = ids + (size_t)r * w;
        int valid = 0;
        for (int j = 0; j < w; j++) valid += row[j] != -1;
        if (!valid) continue;
        for (int j = 0; j < w; j++) {
            int bad;
            if (kind == DSV4_OPT_FOLLOW_ROUTER) bad = row[j] < 0 || row[j] >= E;
            else bad = row[j] < -1 || (ratio > 0 && row[j] >= (pos[r] + 1) / ratio);
            for (int i = 0; !bad && kind == DSV4_OPT_FOLLOW_ROUTER && i < j; i++) bad = row[i] == row[j];
            if (bad)
                return dsv4_error(DSV4_ERR_FORMAT, "%s: %s at position %d: id %d (slot %d) is %s", f->path, name,
                                  pos[r], row[j], j,
                                  kind == DSV4_OPT_FOLLOW_ROUTER
                                      ? "not one of k distinct experts in [0, n_routed_experts)"
                                      : "not -1 or an entry visible there, [0, (p+1) div ratio)");
        }
        has[r] = 1;
        f->n_have[kind]++;
    }
    return 0;
}

int dsv4_opt_follow_load(const char *path, const dsv4_config *cfg, dsv4_opt_follow **out)
{
    DSV4_CHECK(path && cfg && out, "dsv4_opt_follow_load: NULL argument");
    *out = NULL;
    DSV4_CHECK(cfg->num_hidden_layers >= 1 && cfg->num_hidden_layers <= DSV4_MAX_LAYERS,
               "dsv4_opt_follow_load: %d layers", cfg->num_hidden_layers);
    dsv4_dump *d = NULL;
    int rc = dsv4_dump_open(path, &d);
    if (rc) return rc;
    dsv4_opt_follow *f = calloc(1, sizeof *f);
    const dsv4_config *dc = NULL;
    if (!f) rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
    if (!rc) rc = dsv4_dump_config(d, &dc);
    if (!rc) rc = follow_check_config(path, dc, cfg);
    if (!rc) {
        f->path = strdup(path);
        snprintf(f->digest, sizeof f->digest, "%s", dsv4_dump_attr(d, "weights_digest")); /* required: present */
        f->n_layers = cfg->num_hidden_layers;
        f->width[DSV4_OPT_FOLLOW_TOPK] = cfg->index_topk;
        f->width[DSV4_OPT_FOLLOW_ROUTER] = cfg->num_experts_per_tok;
        int n_tok = 0, n_pos = 0;
        const int32_t *tok = dsv4_dump_tokens(d, &n_tok);
        const int32_t *pos = dsv4_dump_positions(d, &n_pos);
        f->n_tokens = n_tok;
        f->n_rows = n_pos;
        f->tokens = malloc(((size_t)n_tok + 1) * sizeof *f->tokens);
        f->row_of_pos = malloc(((size_t)n_tok + 1) * sizeof *f->row_of_pos);
        if (!f->path || !f->tokens || !f->row_of_pos) rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
        for (int i = 0; !rc && i < n_tok; i++) {
            f->tokens[i] = tok[i];
            f->row_of_pos[i] = -1;
        }
        for (int r = 0; !rc && r < n_pos; r++) {
            if (pos[r] < 0 || pos[r] >= n_tok || (r > 0 && pos[r] <= pos[r - 1]))
                rc = dsv4_error(DSV4_ERR_FORMAT, "%s: /positions[%d] = %d is not ascending in [0, %d)", path, r,
                                pos[r], n_tok);
            else f->row_of_pos[pos[r]] = r;
        }
        for (int L = 0; !rc && L < f->n_layers; L++) {
            if (cfg->attn_type[L] == DSV4_ATTN_CSA && cfg->index_topk > 0)
                rc = follow_read_layer(f, d, cfg, pos, DSV4_OPT_FOLLOW_TOPK, L);
            if (!rc) rc = follow_read_layer(f, d, cfg, pos, DSV4_OPT_FOLLOW_ROUTER, L);
        }
    }
    dsv4_dump_free(d);
    if (rc) {
        dsv4_opt_follow_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

void dsv4_opt_follow_free(dsv4_opt_follow *f)
{
    if (!f) return;
    for (int k = 0; k < 2; k++)
        for (int L = 0; L < DSV4_MAX_LAYERS; L++) {
            free(f->ids[k][L]);
            free(f->has[k][L]);
        }
    free(f->tokens);
    free(f->row_of_pos);
    free(f->path);
    free(f);
}

const char *dsv4_opt_follow_path(const dsv4_opt_follow *f) { return f ? f->path : NULL; }
const char *dsv4_opt_follow_weights_digest(const dsv4_opt_follow *f) { return f ? f->digest : NULL; }

const int32_t *dsv4_opt_follow_tokens(const dsv4_opt_follow *f, int *n)
{
    if (n) *n = f ? f->n_tokens : 0;
    return f ? f->tokens : NULL;
}

int dsv4_opt_follow_width(const dsv4_opt_follow *f, dsv4_opt_follow_kind kind)
{
    return f && (unsigned)kind < 2 ? f->width[kind] : 0;
}

const int32_t *dsv4_opt_follow_row(const dsv4_opt_follow *f, dsv4_opt_follow_kind kind, int layer, int pos)
{
    if (!f || (unsigned)kind >= 2 || layer < 0 || layer >= f->n_layers || pos < 0 || pos >= f->n_tokens) return NULL;
    const int r = f->row_of_pos[pos];
    if (r < 0 || !f->ids[kind][layer] || !f->has[kind][layer][r]) return NULL;
    return f->ids[kind][layer] + (size_t)r * f->width[kind];
}

long dsv4_opt_follow_rows(const dsv4_opt_follow *f, dsv4_opt_follow_kind kind)
{
    return f && (unsigned)kind < 2 ? f->n_have[kind] : 0;
}
