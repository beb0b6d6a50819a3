/* model.c - the weight set: a model folder opened once, every tensor under its canonical name (dsv4.h).
 *
 * Open = config.json + (model.safetensors.index.json + shards | model.safetensors), every header validated,
 * every disk name mapped to its canonical official name (naming.c), fused transformers expert tensors split
 * into per-expert views, FP8/FP4 scale siblings attached. No tensor data is read at open.
 * Quiet traps:
 * - `scale` pointers point into `tensors`, so they are resolved only after the array stops growing.
 * - dsv4_model_f32 returns the mmap directly only for F32 data that is 4-byte aligned (safetensors does not
 *   promise alignment); everything else is dequantised once into a cache the model owns.
 * - Two disk names mapping to one canonical name (e.g. both lm_head.weight and head.weight) is an error, not
 *   a silent pick.
 * - dsv4_model_f32 caches without locking: call it from one thread at a time.
 * - A dequantised copy is checked against the host's memory before it is allocated (dsv4_mem_check_host): an FP4
 *   checkpoint is 8x larger as f32, and an overcommitted malloc would otherwise end in an OOM kill.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/internal.h"

struct dsv4_model {
    char *dir;
    char *config_json;   /* config.json verbatim */
    dsv4_config cfg;
    dsv4_st_file **files; /* [nfiles] */
    int nfiles;
    int sharded;
    dsv4_tensor *tensors; /* [n]; name strings owned */
    float **cache;        /* [n] dequantised copies, NULL until asked */
    int n, cap;
    int *slots;           /* open-addressing hash of canonical names -> tensor index, -1 empty */
    size_t nslots;
    unsigned naming;      /* DSV4_NAMING_* bits seen */
};

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int find_index(const dsv4_model *m, const char *name)
{
    if (!m->nslots) return -1;
    for (size_t i = hash_name(name) & (m->nslots - 1);; i = (i + 1) & (m->nslots - 1)) {
        int k = m->slots[i];
        if (k < 0) return -1;
        if (!strcmp(m->tensors[k].name, name)) return k;
    }
}

static int build_hash(dsv4_model *m)
{
    size_t ns = 16;
    while (ns < 2 * (size_t)m->n) ns *= 2;
    m->slots = malloc(ns * sizeof *m->slots);
    if (!m->slots) return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", m->dir);
    m->nslots = ns;
    for (size_t i = 0; i < ns; i++) m->slots[i] = -1;
    for (int k = 0; k < m->n; k++) {
        const char *name = m->tensors[k].name;
        size_t i = hash_name(name) & (ns - 1);
        while (m->slots[i] >= 0) {
            const dsv4_tensor *o = &m->tensors[m->slots[i]];
            if (!strcmp(o->name, name))
                return dsv4_error(DSV4_ERR_FORMAT, "tensor %s appears twice: as %s in %s and as %s in %s", name,
                                  o->disk_name, o->file, m->tensors[k].disk_name, m->tensors[k].file);
            i = (i + 1) & (ns - 1);
        }
        m->slots[i] = k;
    }
    return 0;
}

static int add_tensor(dsv4_model *m, const char *name, const char *disk_name, const dsv4_st_file *f,
                      const dsv4_st_entry *e, size_t offset, size_t nbytes, int ndim, const int64_t *shape)
{
    if (m->n == m->cap) {
        if (m->cap > INT_MAX / 2) return dsv4_error(DSV4_ERR_NOMEM, "%s: more than %d tensors", m->dir, m->cap);
        int nc = m->cap ? m->cap * 2 : 256;
        dsv4_tensor *nt = realloc(m->tensors, (size_t)nc * sizeof *nt);
        if (!nt) return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", m->dir);
        m->tensors = nt;
        m->cap = nc;
    }
    dsv4_tensor *t = &m->tensors[m->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", m->dir);
    m->n++;
    t->disk_name = disk_name;
    t->file = f->path;
    t->dtype = e->dtype;
    t->ndim = ndim;
    for (int i = 0; i < 4; i++) t->shape[i] = i < ndim ? shape[i] : 1;
    t->data = f->data + e->begin + offset;
    t->nbytes = nbytes;
    return 0;
}

/* mlp.experts.gate_up_proj [E, 2I, D] -> w1 = rows 0..I-1, w3 = rows I..2I-1; down_proj [E, D, I] -> w2. */
static int add_fused(dsv4_model *m, const dsv4_st_file *f, const dsv4_st_entry *e, dsv4_fused_kind kind, int layer)
{
    if (e->ndim != 3)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: fused expert tensor must have 3 dims, has %d", f->path,
                          e->name, e->ndim);
    if (e->dtype != DSV4_DTYPE_F32 && e->dtype != DSV4_DTYPE_BF16 && e->dtype != DSV4_DTYPE_F16)
        return dsv4_error(DSV4_ERR_UNSUPPORTED, "%s: tensor %s: fused expert tensor in %s (only F32/BF16/F16)",
                          f->path, e->name, dsv4_dtype_name(e->dtype));
    int64_t E = e->shape[0], R = e->shape[1], C = e->shape[2];
    /* every view is a tensor of its own: a header claiming 10^9 experts of 0 bytes would otherwise make 10^9 of
     * them, so the count is checked against the config before any is added */
    if (E != m->cfg.n_routed_experts)
        return dsv4_error(DSV4_ERR_FORMAT,
                          "%s: tensor %s: fused expert tensor holds %lld experts, the config's n_routed_experts is %d",
                          f->path, e->name, (long long)E, m->cfg.n_routed_experts);
    size_t es = dsv4_dtype_size(e->dtype);
    if (kind == DSV4_FUSED_GATE_UP && R % 2)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: gate_up_proj has an odd row count %lld", f->path, e->name,
                          (long long)R);
    char name[160];
    for (int64_t x = 0; x < E; x++) {
        size_t base = (size_t)(x * R * C) * es;
        int rc;
        if (kind == DSV4_FUSED_GATE_UP) {
            int64_t sh[2] = {R / 2, C};
            size_t half = (size_t)(R / 2 * C) * es;
            snprintf(name, sizeof name, "layers.%d.ffn.experts.%lld.w1.weight", layer, (long long)x);
            if ((rc = add_tensor(m, name, e->name, f, e, base, half, 2, sh))) return rc;
            snprintf(name, sizeof name, "layers.%d.ffn.experts.%lld.w3.weight", layer, (long long)x);
            if ((rc = add_tensor(m, name, e->name, f, e, base + half, half, 2, sh))) return rc;
        } else {
            int64_t sh[2] = {R, C};
            snprintf(name, sizeof name, "layers.%d.ffn.experts.%lld.w2.weight", layer, (long long)x);
            if ((rc = add_tensor(m, name, e->name, f, e, base, (size_t)(R * C) * es, 2, sh))) return rc;
        }
    }
    return 0;
}

static int add_file(dsv4_model *m, dsv4_st_file *f)
{
    dsv4_st_file **nf = realloc(m->files, (size_t)(m->nfiles + 1) * sizeof *nf);
    if (!nf) {
        dsv4_st_free(f);
        return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", m->dir);
    }
    m->files = nf;
    m->files[m->nfiles++] = f;
    char canon[256];
    for (int i = 0; i < f->n; i++) {
        const dsv4_st_entry *e = &f->entries[i];
        unsigned naming;
        dsv4_fused_kind fused;
        int layer, rc = dsv4_naming_canonical(e->name, canon, sizeof canon, &naming, &fused, &layer);
        if (rc) return dsv4_error(rc, "%s: %s", f->path, dsv4_last_error());
        m->naming |= naming;
        if (fused != DSV4_FUSED_NONE) rc = add_fused(m, f, e, fused, layer);
        else rc = add_tensor(m, canon, e->name, f, e, 0, (size_t)(e->end - e->begin), e->ndim, e->shape);
        if (rc) return rc;
    }
    return 0;
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int open_sharded(dsv4_model *m, const char *index_path)
{
    /* read through dsv4_file_read_text: a FIFO or a directory under the index's name is refused, not read for ever */
    char *text;
    size_t len;
    int rc = dsv4_file_read_text(index_path, &text, &len);
    if (rc) return rc;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: not valid JSON (%s, line %d)", index_path, jerr.text, jerr.line);
    json_t *wm = json_object_get(root, "weight_map");
    const char **shards = NULL;
    size_t nshards = 0;
    if (!json_is_object(wm)) {
        rc = dsv4_error(DSV4_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
        goto done;
    }
    shards = calloc(json_object_size(wm) + 1, sizeof *shards);
    if (!shards) {
        rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val)
    {
        if (!json_is_string(val) || !json_string_length(val) || strstr(json_string_value(val), "..")) {
            rc = dsv4_error(DSV4_ERR_FORMAT, "%s: weight_map entry for %s is not a shard file name", index_path, key);
            goto done;
        }
        const char *s = json_string_value(val);
        size_t j = 0;
        while (j < nshards && strcmp(shards[j], s)) j++;
        if (j == nshards) shards[nshards++] = s;
    }
    int first_file = m->nfiles;
    for (size_t j = 0; j < nshards && !rc; j++) {
        char *path = join(m->dir, shards[j]);
        if (!path) {
            rc = dsv4_error(DSV4_ERR_NOMEM, "out of memory");
            break;
        }
        if (!file_exists(path)) {
            rc = dsv4_error(DSV4_ERR_IO, "%s: names shard %s, which does not exist (%s)", index_path, shards[j], path);
        } else {
            dsv4_st_file *f;
            rc = dsv4_st_open(path, &f);
            if (!rc) rc = add_file(m, f);
        }
        free(path);
    }
    /* every name the index promises must be in the shard it names */
    json_object_foreach(wm, key, val)
    {
        if (rc) break;
        const char *s = json_string_value(val);
        int found = 0;
        for (int k = first_file; k < m->nfiles && !found; k++) {
            if (strcmp(m->files[k]->path + strlen(m->dir) + 1, s)) continue;
            for (int i = 0; i < m->files[k]->n && !found; i++) found = !strcmp(m->files[k]->entries[i].name, key);
        }
        if (!found) rc = dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s is not in its shard %s", index_path, key, s);
    }
done:
    free(shards);
    json_decref(root);
    return rc;
}

void dsv4_model_free(dsv4_model *m)
{
    if (!m) return;
    for (int i = 0; i < m->n; i++) {
        free((char *)m->tensors[i].name);
        if (m->cache) free(m->cache[i]);
    }
    free(m->cache);
    free(m->tensors);
    free(m->slots);
    for (int i = 0; i < m->nfiles; i++) dsv4_st_free(m->files[i]);
    free(m->files);
    free(m->config_json);
    free(m->dir);
    free(m);
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !memcmp(s + a - b, suf, b);
}

static int attach_scales(dsv4_model *m)
{
    char buf[300];
    for (int i = 0; i < m->n; i++) {
        dsv4_tensor *t = &m->tensors[i];
        if (!ends_with(t->name, ".weight")) continue;
        size_t n = strlen(t->name) - 7;
        if (n + 7 >= sizeof buf) continue;
        memcpy(buf, t->name, n);
        memcpy(buf + n, ".scale", 7);
        int k = find_index(m, buf);
        if (k >= 0) t->scale = &m->tensors[k];
    }
    return 0;
}

int dsv4_model_open(const char *dir, dsv4_model **out)
{
    *out = NULL;
    dsv4_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", dir);
    }
    char *cfg_path = join(dir, "config.json"), *index = join(dir, "model.safetensors.index.json");
    char *single = join(dir, "model.safetensors");
    int rc = 0;
    if (!cfg_path || !index || !single) rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", dir);
    if (!rc) rc = dsv4_file_read_text(cfg_path, &m->config_json, NULL);
    if (!rc) rc = dsv4_config_parse(m->config_json, cfg_path, &m->cfg);
    if (!rc) {
        if (file_exists(index)) {
            m->sharded = 1;
            rc = open_sharded(m, index);
        } else if (file_exists(single)) {
            dsv4_st_file *f;
            rc = dsv4_st_open(single, &f);
            if (!rc) rc = add_file(m, f);
        } else {
            rc = dsv4_error(DSV4_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
        }
    }
    /* tied embeddings: the head is the embedding */
    if (!rc && m->cfg.tie_word_embeddings) {
        int has_head = 0, embed = -1;
        for (int i = 0; i < m->n; i++) {
            if (!strcmp(m->tensors[i].name, "head.weight")) has_head = 1;
            if (!strcmp(m->tensors[i].name, "embed.weight")) embed = i;
        }
        if (!has_head && embed >= 0) {
            dsv4_tensor e = m->tensors[embed];
            dsv4_st_entry fake = {.dtype = e.dtype};
            dsv4_st_file holder = {.path = (char *)e.file, .data = e.data};
            rc = add_tensor(m, "head.weight", e.disk_name, &holder, &fake, 0, e.nbytes, e.ndim, e.shape);
        }
    }
    if (!rc) rc = build_hash(m);
    if (!rc) rc = attach_scales(m);
    if (!rc && !(m->cache = calloc((size_t)m->n + 1, sizeof *m->cache)))
        rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", dir);
    free(cfg_path);
    free(index);
    free(single);
    if (rc) {
        dsv4_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

const dsv4_config *dsv4_model_config(const dsv4_model *m)
{
    return &m->cfg;
}

const char *dsv4_model_dir(const dsv4_model *m)
{
    return m->dir;
}

const char *dsv4_model_config_json(const dsv4_model *m)
{
    return m->config_json;
}

const char *dsv4_model_naming(const dsv4_model *m)
{
    return dsv4_naming_describe(m->naming);
}

int dsv4_model_tensor(const dsv4_model *m, const char *name, const dsv4_tensor **out)
{
    int k = find_index(m, name);
    if (k < 0) {
        *out = NULL;
        return dsv4_error(DSV4_ERR_MISSING, "%s: tensor %s is missing", m->dir, name);
    }
    *out = &m->tensors[k];
    return 0;
}

int dsv4_model_tensor_count(const dsv4_model *m)
{
    return m->n;
}

const dsv4_tensor *dsv4_model_tensor_at(const dsv4_model *m, int i)
{
    return i >= 0 && i < m->n ? &m->tensors[i] : NULL;
}

int dsv4_model_f32(dsv4_model *m, const char *name, size_t expect_numel, const float **out)
{
    *out = NULL;
    int k = find_index(m, name);
    if (k < 0) return dsv4_error(DSV4_ERR_MISSING, "%s: tensor %s is missing", m->dir, name);
    const dsv4_tensor *t = &m->tensors[k];
    size_t numel = dsv4_tensor_logical_numel(t);
    if (numel != expect_numel)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s has %zu elements, caller expects %zu", t->file, name, numel,
                          expect_numel);
    if (dsv4_tensor_f32_mapped(t)) {
        *out = t->data;
        return 0;
    }
    if (!m->cache[k]) {
        char what[256];
        snprintf(what, sizeof what, "%s: tensor %s dequantised to f32", t->file, name);
        int rc = dsv4_mem_check_host((double)numel * sizeof(float), what);
        if (rc) return rc;
        float *buf = malloc((numel ? numel : 1) * sizeof *buf);
        if (!buf) return dsv4_error(DSV4_ERR_NOMEM, "%s: tensor %s: out of memory (%zu floats)", t->file, name, numel);
        rc = dsv4_tensor_dequant_f32(t, buf, numel);
        if (rc) {
            free(buf);
            return rc;
        }
        m->cache[k] = buf;
    }
    *out = m->cache[k];
    return 0;
}

int dsv4_model_read_f32(const dsv4_model *m, const char *name, float *dst, size_t numel)
{
    const dsv4_tensor *t;
    int rc = dsv4_model_tensor(m, name, &t);
    return rc ? rc : dsv4_tensor_dequant_f32(t, dst, numel);
}

int dsv4_model_read_f32_rows(const dsv4_model *m, const char *name, int64_t row0, int64_t nrows, float *dst)
{
    const dsv4_tensor *t;
    int rc = dsv4_model_tensor(m, name, &t);
    return rc ? rc : dsv4_tensor_dequant_rows_f32(t, row0, nrows, dst);
}

size_t dsv4_tensor_numel(const dsv4_tensor *t) { return dsv4_tensor_logical_numel(t); }

int dsv4_tensor_f32_mapped(const dsv4_tensor *t)
{
    return t->dtype == DSV4_DTYPE_F32 && ((uintptr_t)t->data & 3u) == 0;
}

int dsv4_model_read_bf16(const dsv4_model *m, const char *name, uint16_t *dst, size_t numel)
{
    const dsv4_tensor *t;
    int rc = dsv4_model_tensor(m, name, &t);
    if (rc) return rc;
    if (t->dtype == DSV4_DTYPE_BF16) {
        if (numel != dsv4_tensor_logical_numel(t))
            return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s has %zu elements, caller expects %zu", t->file, name,
                              dsv4_tensor_logical_numel(t), numel);
        memcpy(dst, t->data, numel * 2);
        return 0;
    }
    char what[256];
    snprintf(what, sizeof what, "%s: tensor %s dequantised to f32 (for bf16)", t->file, name);
    if ((rc = dsv4_mem_check_host((double)numel * sizeof(float), what))) return rc;
    float *tmp = malloc((numel ? numel : 1) * sizeof *tmp);
    if (!tmp) return dsv4_error(DSV4_ERR_NOMEM, "%s: tensor %s: out of memory", t->file, name);
    rc = dsv4_tensor_dequant_f32(t, tmp, numel);
    for (size_t i = 0; !rc && i < numel; i++) dst[i] = dsv4_f32_to_bf16(tmp[i]);
    free(tmp);
    return rc;
}

int dsv4_model_read_i32(const dsv4_model *m, const char *name, int32_t *dst, size_t numel)
{
    const dsv4_tensor *t;
    int rc = dsv4_model_tensor(m, name, &t);
    if (rc) return rc;
    if (t->dtype != DSV4_DTYPE_I32 && t->dtype != DSV4_DTYPE_I64)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s is %s, not I32/I64", t->file, name, dsv4_dtype_name(t->dtype));
    size_t n = t->nbytes / dsv4_dtype_size(t->dtype);
    if (n != numel)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: tensor %s has %zu elements, caller expects %zu", t->file, name, n, numel);
    /* tid2eid holds expert ids: anything outside [0, n_routed_experts) would index out of bounds later */
    int64_t lo = INT32_MIN, hi = INT32_MAX;
    if (ends_with(name, ".tid2eid")) {
        lo = 0;
        hi = m->cfg.n_routed_experts - 1;
    }
    const uint8_t *p = t->data;
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (t->dtype == DSV4_DTYPE_I64) memcpy(&v, p + 8 * i, 8);
        else {
            int32_t w;
            memcpy(&w, p + 4 * i, 4);
            v = w;
        }
        if (v < lo || v > hi)
            return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: element %zu = %lld is outside [%lld, %lld]", t->file,
                              name, i, (long long)v, (long long)lo, (long long)hi);
        dst[i] = (int32_t)v;
    }
    return 0;
}
