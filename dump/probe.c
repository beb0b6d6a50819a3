/* probe.c - the probe sink: what every path calls (dsv4_probe*) to put its intermediate tensors in a dump.
 *
 * The sink maps a position to its row in /positions (positions not stored are ignored, so a path can probe
 * unconditionally), knows each probe's row shape from its name and the config (dump/probe_defs.c), and
 * pads the two ragged probes to their dataset width:
 *   indexer_scores: a step knows n <= N entries; the row is N = (last stored position + 1) div
 *                   compress_ratio wide, entries past n are -inf (not visible to that position);
 *   topk_idx:       n <= index_topk picks, the rest -1 (= no entry).
 * Quiet trap: prefill computes scores over the whole pool (S div ratio entries), which can be more than N
 * when the last prompt positions are not stored; the extra entries are invisible to every stored position
 * (-inf), so they are dropped, and anything finite there is refused rather than silently cut off.
 * The padding buffer is allocated at init: a decode step allocates nothing here.
 * A NULL sink makes every call a no-op returning 0 (dumping off costs one branch).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dump/dump_internal.h"

struct dsv4_probe_sink {
    dsv4_dump_writer *w;  /* borrowed */
    dsv4_config cfg;      /* copy */
    int n_tokens;
    int *row_of_pos;      /* [n_tokens]: row in /positions, -1 = not stored */
    int64_t last_pos;     /* last stored position, -1 if none */
    size_t pad_cap;       /* elements of each padding buffer */
    float *pad_f32;       /* [pad_cap] */
    int32_t *pad_i32;     /* [pad_cap] */
    char keep[512];       /* ",name,name," of the probes stored; "" = all */
};

int dsv4_probe_sink_init(dsv4_dump_writer *w, const dsv4_config *cfg, const int32_t *positions, int n_positions,
                         int n_tokens, dsv4_probe_sink **out)
{
    DSV4_CHECK(out, "dsv4_probe_sink_init: out is NULL");
    *out = NULL;
    DSV4_CHECK(w && cfg, "dsv4_probe_sink_init: writer and config are required");
    DSV4_CHECK(n_tokens >= 0, "probe sink: n_tokens %d", n_tokens);
    DSV4_CHECK(cfg->num_hidden_layers >= 0 && cfg->num_hidden_layers <= DSV4_MAX_LAYERS,
               "probe sink: num_hidden_layers %d out of range", cfg->num_hidden_layers);
    int wn;
    const int32_t *wpos = dsv4_dump_writer_positions(w, &wn);
    const char *path = dsv4_dump_writer_path(w);
    /* The sink's positions must be the writer's /positions, or rows would land under the wrong position. */
    int np = positions ? n_positions : n_tokens;
    DSV4_CHECK(np == wn, "%s: probe sink stores %d positions, the dump's /positions has %d", path, np, wn);
    for (int i = 0; i < np; i++) {
        int pos = positions ? positions[i] : i;
        DSV4_CHECK(pos == wpos[i], "%s: probe sink position %d is %d, /positions[%d] is %d", path, i, pos, i, wpos[i]);
        DSV4_CHECK(pos >= 0 && pos < n_tokens, "%s: probe sink position %d out of [0, %d)", path, pos, n_tokens);
    }

    dsv4_probe_sink *p = calloc(1, sizeof *p);
    if (!p) return dsv4_error(DSV4_ERR_NOMEM, "%s: probe sink: out of memory", path);
    p->w = w;
    p->cfg = *cfg;
    p->n_tokens = n_tokens;
    p->last_pos = np ? wpos[np - 1] : -1;
    p->row_of_pos = malloc(((size_t)n_tokens + 1) * sizeof *p->row_of_pos);
    size_t cap = cfg->index_topk > 0 ? (size_t)cfg->index_topk : 0;
    for (int l = 0; l < cfg->num_hidden_layers; l++)
        if (cfg->compress_ratio[l] > 0 && (size_t)((p->last_pos + 1) / cfg->compress_ratio[l]) > cap)
            cap = (size_t)((p->last_pos + 1) / cfg->compress_ratio[l]);
    p->pad_cap = cap;
    p->pad_f32 = malloc((cap + 1) * sizeof *p->pad_f32);
    p->pad_i32 = malloc((cap + 1) * sizeof *p->pad_i32);
    if (!p->row_of_pos || !p->pad_f32 || !p->pad_i32) {
        dsv4_probe_sink_free(p);
        return dsv4_error(DSV4_ERR_NOMEM, "%s: probe sink: out of memory", path);
    }
    for (int i = 0; i < n_tokens; i++) p->row_of_pos[i] = -1;
    for (int i = 0; i < np; i++) p->row_of_pos[wpos[i]] = i;
    *out = p;
    return 0;
}

void dsv4_probe_sink_free(dsv4_probe_sink *p)
{
    if (!p) return;
    free(p->row_of_pos);
    free(p->pad_f32);
    free(p->pad_i32);
    free(p);
}

int dsv4_probe_sink_keep(dsv4_probe_sink *p, const char *names)
{
    DSV4_CHECK(p, "dsv4_probe_sink_keep: sink is NULL");
    p->keep[0] = 0;
    if (!names || !*names) return 0;
    size_t len = 1;
    strcpy(p->keep, ",");
    for (const char *s = names; *s;) {
        size_t n = strcspn(s, ",");
        char name[64];
        DSV4_CHECK(n > 0 && n < sizeof name, "probe list '%s': empty or overlong name", names);
        memcpy(name, s, n);
        name[n] = 0;
        DSV4_CHECK(dsv4_probe_def_find(0, name) || dsv4_probe_def_find(1, name),
                   "probe list '%s': unknown probe '%s' (dump-format.md lists the names)", names, name);
        DSV4_CHECK(len + n + 1 < sizeof p->keep, "probe list '%s' is too long", names);
        memcpy(p->keep + len, name, n);
        len += n;
        p->keep[len++] = ',';
        p->keep[len] = 0;
        s += n;
        if (*s == ',') s++;
    }
    return 0;
}

/* Whether probe `name` passes the keep list. */
static int dsv4_probe_kept(const dsv4_probe_sink *p, const char *name)
{
    if (!p->keep[0] || !name) return 1;
    char key[72];
    snprintf(key, sizeof key, ",%s,", name);
    return strstr(p->keep, key) != NULL;
}

int dsv4_probe_wants(const dsv4_probe_sink *p, int pos)
{
    return p && pos >= 0 && pos < p->n_tokens && p->row_of_pos[pos] >= 0;
}

/* The probe `name` of `layer` (-1: final) checked against how it is being called. */
static int dsv4_probe_find(const dsv4_probe_sink *p, int layer, const char *name, int per_entry, dsv4_dtype dtype,
                           const dsv4_probe_def **out)
{
    const char *path = dsv4_dump_writer_path(p->w);
    DSV4_CHECK(name, "%s: probe name is NULL", path);
    DSV4_CHECK(layer >= -1 && layer < p->cfg.num_hidden_layers, "%s: probe %s: layer %d out of range [-1, %d)",
               path, name, layer, p->cfg.num_hidden_layers);
    const dsv4_probe_def *def = dsv4_probe_def_find(layer == -1, name);
    DSV4_CHECK(def, "%s: unknown %s probe '%s' (dump-format.md lists the names)", path,
               layer == -1 ? "final" : "layer", name);
    DSV4_CHECK(def->per_entry == per_entry, "%s: probe %s is %s: use %s", path, name,
               def->per_entry ? "per entry" : "per position", def->per_entry ? "dsv4_probe_entries" : "dsv4_probe");
    DSV4_CHECK(def->dtype == dtype, "%s: probe %s is %s: use %s", path, name, dsv4_dtype_name(def->dtype),
               def->dtype == DSV4_DTYPE_I32 ? "dsv4_probe_i32" : "dsv4_probe");
    *out = def;
    return 0;
}

static int dsv4_probe_dataset_name(char *buf, size_t size, int layer, const char *name)
{
    if (layer < 0) return snprintf(buf, size, "final/%s", name);
    return snprintf(buf, size, "layers/%d/%s", layer, name);
}

static int dsv4_probe_row(dsv4_probe_sink *p, int layer, const char *name, int pos, dsv4_dtype dtype,
                          const void *buf, size_t n)
{
    if (!p || !dsv4_probe_kept(p, name)) return 0;
    const dsv4_probe_def *def = NULL;
    int rc = dsv4_probe_find(p, layer, name, 0, dtype, &def);
    if (rc) return rc;
    const char *path = dsv4_dump_writer_path(p->w);
    DSV4_CHECK(pos >= 0 && pos < p->n_tokens, "%s: probe %s: position %d out of [0, %d)", path, name, pos, p->n_tokens);
    int row = p->row_of_pos[pos];
    if (row < 0) return 0;
    int64_t shape[2] = {0, 0};
    rc = dsv4_probe_def_row_shape(def, &p->cfg, layer, p->last_pos, shape);
    if (rc) return rc;
    size_t size = 1;
    for (int i = 0; i < def->row_ndim; i++) size *= (size_t)shape[i];
    DSV4_CHECK(buf || n == 0, "%s: probe %s: buffer is NULL", path, name);

    const void *data = buf;
    int ragged = def->dims[0] == DSV4_PROBE_DIM_N_ENTRIES || def->dims[0] == DSV4_PROBE_DIM_INDEX_TOPK;
    if (!ragged) {
        DSV4_CHECK(n == size, "%s: probe layers/%d/%s at position %d: %zu values, the row holds %zu", path, layer,
                   name, pos, n, size);
    } else if (dtype == DSV4_DTYPE_F32) {
        const float *f = buf;
        for (size_t i = size; i < n; i++)
            DSV4_CHECK(isinf(f[i]) && f[i] < 0, "%s: probe layers/%d/%s at position %d: %zu scores, the row holds %zu "
                       "(entries at the last stored position) and score %zu = %g is visible", path, layer, name, pos,
                       n, size, i, (double)f[i]);
        size_t keep = n < size ? n : size;
        memcpy(p->pad_f32, f, keep * sizeof *f);
        for (size_t i = keep; i < size; i++) p->pad_f32[i] = -INFINITY;
        data = p->pad_f32;
    } else {
        DSV4_CHECK(n <= size, "%s: probe layers/%d/%s at position %d: %zu ids, at most %zu", path, layer, name, pos, n,
                   size);
        memcpy(p->pad_i32, buf, n * sizeof(int32_t));
        for (size_t i = n; i < size; i++) p->pad_i32[i] = -1;
        data = p->pad_i32;
    }
    char dname[160];
    dsv4_probe_dataset_name(dname, sizeof dname, layer, name);
    return dsv4_dump_writer_row(p->w, dname, row, dtype, def->row_ndim, shape, data);
}

int dsv4_probe(dsv4_probe_sink *p, int layer, const char *name, int pos, const float *buf, size_t n)
{
    return dsv4_probe_row(p, layer, name, pos, DSV4_DTYPE_F32, buf, n);
}

int dsv4_probe_i32(dsv4_probe_sink *p, int layer, const char *name, int pos, const int32_t *buf, size_t n)
{
    return dsv4_probe_row(p, layer, name, pos, DSV4_DTYPE_I32, buf, n);
}

int dsv4_probe_entries(dsv4_probe_sink *p, int layer, const char *name, const float *buf, int64_t n_rows,
                       int64_t row_len)
{
    if (!p || !dsv4_probe_kept(p, name)) return 0;
    const dsv4_probe_def *def = NULL;
    int rc = dsv4_probe_find(p, layer, name, 1, DSV4_DTYPE_F32, &def);
    if (rc) return rc;
    const char *path = dsv4_dump_writer_path(p->w);
    DSV4_CHECK(layer >= 0, "%s: probe %s belongs to a layer", path, name);
    int64_t shape[2];
    rc = dsv4_probe_def_row_shape(def, &p->cfg, layer, p->last_pos, shape);
    if (rc) return rc;
    int ratio = p->cfg.compress_ratio[layer];
    int64_t max_rows = ratio > 0 ? p->n_tokens / ratio : 0;
    DSV4_CHECK(row_len == shape[0], "%s: probe layers/%d/%s: rows of %lld, expected %lld", path, layer, name,
               (long long)row_len, (long long)shape[0]);
    DSV4_CHECK(n_rows >= 0 && n_rows <= max_rows, "%s: probe layers/%d/%s: %lld entries, at most %lld for %d tokens",
               path, layer, name, (long long)n_rows, (long long)max_rows, p->n_tokens);
    int64_t dims[2] = {n_rows, row_len};
    char dname[160];
    dsv4_probe_dataset_name(dname, sizeof dname, layer, name);
    return dsv4_dump_writer_array(p->w, dname, DSV4_DTYPE_F32, 2, dims, buf);
}
