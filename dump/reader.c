/* reader.c - the dsv4-dump/1 reader (dump-format.md; API in include/dsv4/dsv4_dump.h).
 *
 * Open validates what every later call relies on: the file is HDF5, `schema` is dsv4-dump/1, the required
 * root attributes exist, /tokens has prompt_len + n_decode entries, /positions ascend within [0, T).
 * Dumps come from other tools too (h5py, transformers), so strings may be fixed- or variable-length,
 * integer attributes any integer type, datasets float32/float64/int32/int64: everything is read through
 * HDF5's conversion into f32 / i32.
 * A dataset's shape is checked against the config the first time it is asked for (dsv4_dump_info), and
 * the open handle is kept with a one-chunk cache, so reading a dataset row by row decompresses each chunk
 * once and never loads the whole dataset.
 * HDF5 never prints: a silent error handler keeps its innermost message, which is folded into ours.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dump/dump_internal.h"

typedef struct dsv4_dump_kv {
    char *name;
    char *value;
} dsv4_dump_kv;

struct dsv4_dump {
    char *path;
    hid_t file;
    dsv4_dump_kv *attrs; /* [n_attrs] every string attribute of the root */
    int n_attrs;
    int prompt_len, n_decode;
    int32_t *tokens;     /* [n_tokens] */
    int n_tokens;
    int32_t *positions;  /* [n_positions] ascending */
    int n_positions;
    char **names;        /* [n_names] datasets under layers/ and final/, model order */
    int n_names;
    int config_rc;       /* result of parsing config_json; its message in config_err */
    char *config_err;
    dsv4_config config;
    dsv4_h5_table *dsets; /* open datasets, filled lazily (behind a pointer: the API takes const dsv4_dump) */
};

/* ------------------------------------------------------------------------------------------ root attrs */

typedef struct dsv4_dump_attr_iter {
    dsv4_dump *d;
    int rc; /* our error, if the callback stopped the iteration */
} dsv4_dump_attr_iter;

static herr_t dsv4_dump_attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *data)
{
    dsv4_dump_attr_iter *it = data;
    dsv4_dump *d = it->d;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0) return 0;
    hid_t t = H5Aget_type(a);
    int is_str = t >= 0 && H5Tget_class(t) == H5T_STRING;
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    if (!is_str) return 0;
    char *value = NULL;
    if ((it->rc = dsv4_h5_read_str_attr(loc, name, d->path, &value)) != 0) return -1;
    dsv4_dump_kv *kv = realloc(d->attrs, ((size_t)d->n_attrs + 1) * sizeof *kv);
    char *nm = strdup(name);
    if (!kv || !nm) {
        free(value);
        free(nm);
        if (kv) d->attrs = kv;
        it->rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", d->path);
        return -1;
    }
    d->attrs = kv;
    d->attrs[d->n_attrs].name = nm;
    d->attrs[d->n_attrs].value = value;
    d->n_attrs++;
    return 0;
}

static int dsv4_dump_read_root(dsv4_dump *d)
{
    char msg[256];
    char *schema = NULL;
    int rc = dsv4_h5_read_str_attr(d->file, "schema", d->path, &schema);
    if (rc == DSV4_ERR_MISSING)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: no 'schema' attribute: not a %s dump", d->path, DSV4_DUMP_SCHEMA);
    if (rc) return rc;
    if (strcmp(schema, DSV4_DUMP_SCHEMA) != 0) {
        rc = dsv4_error(DSV4_ERR_FORMAT, "%s: schema is '%s', this reader reads '%s'", d->path, schema,
                        DSV4_DUMP_SCHEMA);
        free(schema);
        return rc;
    }
    free(schema);
    hsize_t idx = 0;
    dsv4_dump_attr_iter it = {d, 0};
    if (H5Aiterate2(d->file, H5_INDEX_NAME, H5_ITER_INC, &idx, dsv4_dump_attr_cb, &it) < 0) {
        if (it.rc) return it.rc;
        return dsv4_error(DSV4_ERR_FORMAT, "%s: cannot list root attributes: %s", d->path,
                          dsv4_h5_errmsg(msg, sizeof msg));
    }
    static const char *const required[] = {"producer", "config_json", "weights_digest", "mode"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        if (dsv4_dump_attr(d, required[i])) continue;
        if (H5Aexists(d->file, required[i]) > 0)
            return dsv4_error(DSV4_ERR_FORMAT, "%s: root attribute '%s' is not a string", d->path, required[i]);
        return dsv4_error(DSV4_ERR_MISSING, "%s: missing root attribute '%s'", d->path, required[i]);
    }
    const char *mode = dsv4_dump_attr(d, "mode");
    if (strcmp(mode, "forced") != 0 && strcmp(mode, "greedy") != 0)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: mode is '%s', expected 'forced' or 'greedy'", d->path, mode);
    int64_t p = 0, n = 0;
    if ((rc = dsv4_h5_read_int_attr(d->file, "prompt_len", d->path, &p)) != 0) return rc;
    if ((rc = dsv4_h5_read_int_attr(d->file, "n_decode", d->path, &n)) != 0) return rc;
    if (p < 0 || n < 0 || p + n > INT_MAX)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: prompt_len %lld / n_decode %lld out of range", d->path, (long long)p,
                          (long long)n);
    d->prompt_len = (int)p;
    d->n_decode = (int)n;
    return 0;
}

/* Reads a 1-D integer dataset (tokens, positions) of at most max_n entries into a malloc'd int32 array. The
 * count is checked before anything is allocated: a declared shape costs nothing to write, its buffer does. */
static int dsv4_dump_read_ids(dsv4_dump *d, const char *name, int64_t max_n, int32_t **out, int *n)
{
    char msg[256];
    *out = NULL;
    *n = 0;
    htri_t ex = H5Lexists(d->file, name, H5P_DEFAULT);
    if (ex <= 0) return dsv4_error(DSV4_ERR_MISSING, "%s: missing dataset /%s", d->path, name);
    hid_t ds = H5Dopen2(d->file, name, H5P_DEFAULT);
    if (ds < 0)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: /%s is not a readable dataset: %s", d->path, name,
                          dsv4_h5_errmsg(msg, sizeof msg));
    int rc = DSV4_ERR_SHAPE;
    hid_t t = H5Dget_type(ds), s = H5Dget_space(ds);
    hsize_t dims[1] = {0};
    if (t < 0 || s < 0 || H5Tget_class(t) != H5T_INTEGER || H5Sget_simple_extent_ndims(s) != 1) {
        dsv4_error(rc, "%s: /%s must be a 1-D integer dataset", d->path, name);
        goto out;
    }
    H5Sget_simple_extent_dims(s, dims, NULL);
    if (dims[0] > INT_MAX || (int64_t)dims[0] > max_n) {
        dsv4_error(rc, "%s: /%s has %llu entries, expected at most %lld (prompt_len + n_decode)", d->path, name,
                   (unsigned long long)dims[0], (long long)max_n);
        goto out;
    }
    char what[4200];
    snprintf(what, sizeof what, "%s: /%s", d->path, name);
    if ((rc = dsv4_mem_check_host(((double)dims[0] + 1) * sizeof **out, what)) != 0) goto out;
    rc = DSV4_ERR_SHAPE;
    *out = malloc(((size_t)dims[0] + 1) * sizeof **out);
    if (!*out) {
        rc = dsv4_error(DSV4_ERR_NOMEM, "%s: /%s: out of memory", d->path, name);
        goto out;
    }
    if (dims[0] && H5Dread(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0) {
        rc = dsv4_error(DSV4_ERR_FORMAT, "%s: cannot read /%s: %s", d->path, name, dsv4_h5_errmsg(msg, sizeof msg));
        goto out;
    }
    *n = (int)dims[0];
    rc = 0;
out:
    if (s >= 0) H5Sclose(s);
    if (t >= 0) H5Tclose(t);
    H5Dclose(ds);
    return rc;
}

static int dsv4_dump_read_tokens(dsv4_dump *d)
{
    int rc = dsv4_dump_read_ids(d, "tokens", (int64_t)d->prompt_len + d->n_decode, &d->tokens, &d->n_tokens);
    if (rc) return rc;
    if (d->n_tokens != d->prompt_len + d->n_decode)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: /tokens has %d entries, expected prompt_len %d + n_decode %d = %d",
                          d->path, d->n_tokens, d->prompt_len, d->n_decode, d->prompt_len + d->n_decode);
    rc = dsv4_dump_read_ids(d, "positions", d->n_tokens, &d->positions, &d->n_positions);
    if (rc) return rc;
    for (int i = 0; i < d->n_positions; i++)
        if (d->positions[i] < 0 || d->positions[i] >= d->n_tokens || (i && d->positions[i] <= d->positions[i - 1]))
            return dsv4_error(DSV4_ERR_FORMAT, "%s: /positions[%d] = %d: positions must ascend within [0, %d)",
                              d->path, i, d->positions[i], d->n_tokens);
    return 0;
}

/* ------------------------------------------------------------------------------------------- listing */

typedef struct dsv4_dump_entry {
    int layer; /* INT_MAX for final */
    int rank;  /* probe rank in model order */
    char *name;
} dsv4_dump_entry;

static int dsv4_dump_entry_cmp(const void *a, const void *b)
{
    const dsv4_dump_entry *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The name of link i of group g, malloc'd. */
static char *dsv4_dump_link_name(hid_t g, hsize_t i)
{
    ssize_t len = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, NULL, 0, H5P_DEFAULT);
    if (len < 0) return NULL;
    char *s = malloc((size_t)len + 1);
    if (s && H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, s, (size_t)len + 1, H5P_DEFAULT) < 0) {
        free(s);
        return NULL;
    }
    return s;
}

static int dsv4_dump_is_dataset(hid_t g, const char *name)
{
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) return 0;
    int is = H5Iget_type(o) == H5I_DATASET;
    H5Oclose(o);
    return is;
}

/* Appends the datasets of group `gname` ("layers/3" or "final") to the list. */
static int dsv4_dump_list_group(dsv4_dump *d, const char *gname, int layer, dsv4_dump_entry **list, int *n, int *cap)
{
    char msg[256];
    hid_t g = H5Gopen2(d->file, gname, H5P_DEFAULT);
    if (g < 0) return dsv4_error(DSV4_ERR_FORMAT, "%s: /%s is not a group: %s", d->path, gname, dsv4_h5_errmsg(msg, sizeof msg));
    H5G_info_t gi;
    int rc = 0;
    if (H5Gget_info(g, &gi) < 0) {
        rc = dsv4_error(DSV4_ERR_FORMAT, "%s: cannot list /%s: %s", d->path, gname, dsv4_h5_errmsg(msg, sizeof msg));
        goto out;
    }
    for (hsize_t i = 0; i < gi.nlinks; i++) {
        char *m = dsv4_dump_link_name(g, i);
        if (!m) {
            rc = dsv4_error(DSV4_ERR_FORMAT, "%s: cannot list /%s: %s", d->path, gname, dsv4_h5_errmsg(msg, sizeof msg));
            goto out;
        }
        if (!dsv4_dump_is_dataset(g, m)) {
            free(m);
            continue;
        }
        size_t len = strlen(gname) + strlen(m) + 2;
        char *full = malloc(len);
        if (*n == *cap) {
            int ncap = *cap ? *cap * 2 : 256;
            dsv4_dump_entry *nl = realloc(*list, (size_t)ncap * sizeof *nl);
            if (nl) {
                *list = nl;
                *cap = ncap;
            }
        }
        if (!full || *n == *cap) {
            free(full);
            free(m);
            rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory listing /%s", d->path, gname);
            goto out;
        }
        snprintf(full, len, "%s/%s", gname, m);
        (*list)[*n].layer = layer;
        (*list)[*n].rank = dsv4_probe_def_rank(layer == INT_MAX, m);
        (*list)[*n].name = full;
        (*n)++;
        free(m);
    }
out:
    H5Gclose(g);
    return rc;
}

/* Fills d->names: every dataset of /layers/<L> (L ascending) then /final, each in model order. */
static int dsv4_dump_list(dsv4_dump *d)
{
    char msg[256];
    dsv4_dump_entry *list = NULL;
    int n = 0, cap = 0, rc = 0;
    if (H5Lexists(d->file, "layers", H5P_DEFAULT) > 0) {
        hid_t g = H5Gopen2(d->file, "layers", H5P_DEFAULT);
        H5G_info_t gi;
        if (g < 0 || H5Gget_info(g, &gi) < 0) {
            if (g >= 0) H5Gclose(g);
            return dsv4_error(DSV4_ERR_FORMAT, "%s: /layers is not a readable group: %s", d->path,
                              dsv4_h5_errmsg(msg, sizeof msg));
        }
        for (hsize_t i = 0; i < gi.nlinks && rc == 0; i++) {
            char *m = dsv4_dump_link_name(g, i);
            if (!m) {
                rc = dsv4_error(DSV4_ERR_FORMAT, "%s: cannot list /layers: %s", d->path, dsv4_h5_errmsg(msg, sizeof msg));
                break;
            }
            char *end = NULL;
            errno = 0;
            long layer = strtol(m, &end, 10);
            if (m[0] < '0' || m[0] > '9' || *end || errno || layer >= INT_MAX) {
                rc = dsv4_error(DSV4_ERR_FORMAT, "%s: /layers/%s: layer groups are named by their number", d->path, m);
            } else {
                char gname[48];
                snprintf(gname, sizeof gname, "layers/%ld", layer);
                if (strcmp(gname + 7, m) != 0) /* "007": not the canonical name */
                    rc = dsv4_error(DSV4_ERR_FORMAT, "%s: /layers/%s: layer groups are named by their number", d->path, m);
                else
                    rc = dsv4_dump_list_group(d, gname, (int)layer, &list, &n, &cap);
            }
            free(m);
        }
        H5Gclose(g);
    }
    if (rc == 0 && H5Lexists(d->file, "final", H5P_DEFAULT) > 0) rc = dsv4_dump_list_group(d, "final", INT_MAX, &list, &n, &cap);
    if (rc == 0 && n) {
        qsort(list, (size_t)n, sizeof *list, dsv4_dump_entry_cmp);
        d->names = malloc((size_t)n * sizeof *d->names);
        if (!d->names) rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", d->path);
    }
    for (int i = 0; i < n; i++) {
        if (rc == 0) d->names[d->n_names++] = list[i].name;
        else free(list[i].name);
    }
    free(list);
    return rc;
}

/* ------------------------------------------------------------------------------------------ open/free */

/* Parsed once at open; a config error is kept and reported by dsv4_dump_config / dsv4_dump_info, so a dump
 * with an unreadable config still opens (its attributes and tokens can be inspected). */
static void dsv4_dump_parse_config(dsv4_dump *d)
{
    char origin[4200];
    snprintf(origin, sizeof origin, "%s: config_json", d->path);
    d->config_rc = dsv4_config_parse(dsv4_dump_attr(d, "config_json"), origin, &d->config);
    if (d->config_rc) d->config_err = strdup(dsv4_last_error());
}

int dsv4_dump_open(const char *path, dsv4_dump **out)
{
    char msg[256];
    DSV4_CHECK(out, "dsv4_dump_open: out is NULL");
    *out = NULL;
    DSV4_CHECK(path && *path, "dsv4_dump_open: path is empty");
    dsv4_h5_quiet();
    struct stat st;
    if (stat(path, &st) != 0) return dsv4_error(DSV4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return dsv4_error(DSV4_ERR_IO, "%s: not a regular file", path);
    htri_t is_h5 = H5Fis_hdf5(path);
    if (is_h5 <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return dsv4_error(DSV4_ERR_FORMAT, "%s: not an HDF5 file (no HDF5 signature)", path);
    }
    dsv4_dump *d = calloc(1, sizeof *d);
    if (d) d->dsets = calloc(1, sizeof *d->dsets);
    if (d) d->path = strdup(path);
    if (!d || !d->dsets || !d->path) {
        dsv4_dump_free(d);
        return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
    }
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    d->file = -1;
    if (fapl >= 0 && H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) >= 0) d->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (fapl >= 0) H5Pclose(fapl);
    if (d->file < 0) {
        int rc = dsv4_error(DSV4_ERR_FORMAT, "%s: cannot open HDF5 file (damaged or truncated?): %s", path,
                            dsv4_h5_errmsg(msg, sizeof msg));
        dsv4_dump_free(d);
        return rc;
    }
    int rc = dsv4_dump_read_root(d);
    if (rc == 0) rc = dsv4_dump_read_tokens(d);
    if (rc == 0) rc = dsv4_dump_list(d);
    if (rc) {
        H5Eclear2(H5E_DEFAULT);
        dsv4_dump_free(d);
        return rc;
    }
    dsv4_dump_parse_config(d);
    H5Eclear2(H5E_DEFAULT);
    *out = d;
    return 0;
}

void dsv4_dump_free(dsv4_dump *d)
{
    if (!d) return;
    if (d->dsets) {
        dsv4_h5_table_clear(d->dsets);
        free(d->dsets);
    }
    if (d->file >= 0) H5Fclose(d->file);
    H5Eclear2(H5E_DEFAULT);
    for (int i = 0; i < d->n_attrs; i++) {
        free(d->attrs[i].name);
        free(d->attrs[i].value);
    }
    free(d->attrs);
    for (int i = 0; i < d->n_names; i++) free(d->names[i]);
    free(d->names);
    free(d->tokens);
    free(d->positions);
    free(d->config_err);
    free(d->path);
    free(d);
}

const char *dsv4_dump_path(const dsv4_dump *d)
{
    return d ? d->path : NULL;
}

const char *dsv4_dump_attr(const dsv4_dump *d, const char *name)
{
    if (!d || !name) return NULL;
    for (int i = 0; i < d->n_attrs; i++)
        if (strcmp(d->attrs[i].name, name) == 0) return d->attrs[i].value;
    return NULL;
}

int dsv4_dump_prompt_len(const dsv4_dump *d)
{
    return d->prompt_len;
}

int dsv4_dump_n_decode(const dsv4_dump *d)
{
    return d->n_decode;
}

const int32_t *dsv4_dump_tokens(const dsv4_dump *d, int *n)
{
    if (n) *n = d->n_tokens;
    return d->tokens;
}

const int32_t *dsv4_dump_positions(const dsv4_dump *d, int *n)
{
    if (n) *n = d->n_positions;
    return d->positions;
}

int dsv4_dump_config(const dsv4_dump *d, const dsv4_config **out)
{
    DSV4_CHECK(d && out, "dsv4_dump_config: dump and out are required");
    *out = NULL;
    if (d->config_rc) return dsv4_error(d->config_rc, "%s", d->config_err ? d->config_err : "config_json unreadable");
    *out = &d->config;
    return 0;
}

int dsv4_dump_dataset_count(const dsv4_dump *d)
{
    return d ? d->n_names : 0;
}

const char *dsv4_dump_dataset_name(const dsv4_dump *d, int i)
{
    return d && i >= 0 && i < d->n_names ? d->names[i] : NULL;
}

int dsv4_dump_has(const dsv4_dump *d, const char *name)
{
    if (!d || !name) return 0;
    for (int i = 0; i < d->n_names; i++)
        if (strcmp(d->names[i], name) == 0) return 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------- datasets */

static void dsv4_dump_fmt_shape(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (o < size) snprintf(buf + o, size - o, "]");
}

/* Splits "layers/<L>/<probe>" / "final/<probe>": *final, *layer and the probe name, or NULL if neither. */
static const char *dsv4_dump_split_name(const char *name, int *final, int *layer)
{
    *final = 0;
    *layer = -1;
    if (strncmp(name, "final/", 6) == 0 && !strchr(name + 6, '/')) {
        *final = 1;
        return name + 6;
    }
    if (strncmp(name, "layers/", 7) != 0 || name[7] < '0' || name[7] > '9') return NULL;
    char *end = NULL;
    long l = strtol(name + 7, &end, 10);
    if (*end != '/' || strchr(end + 1, '/') || l >= DSV4_MAX_LAYERS) return NULL;
    *layer = (int)l;
    return end + 1;
}

/* Checks dataset e against the probe table and the config, where the probe is known. */
static int dsv4_dump_validate(const dsv4_dump *d, dsv4_h5_dset *e)
{
    int final, layer;
    const char *probe = dsv4_dump_split_name(e->name, &final, &layer);
    const dsv4_probe_def *def = probe ? dsv4_probe_def_find(final, probe) : NULL;
    if (!def) return 0; /* an extra dataset (another tool's probe): nothing to check it against */
    const dsv4_config *cfg;
    int rc = dsv4_dump_config(d, &cfg);
    char why[1024];
    if (rc) {
        snprintf(why, sizeof why, "%s", dsv4_last_error()); /* dsv4_error must not read its own buffer */
        return dsv4_error(rc, "%s: cannot check %s against the config: %s", d->path, e->name, why);
    }
    if (!final && layer >= cfg->num_hidden_layers)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: %s: the config has %d layers", d->path, e->name, cfg->num_hidden_layers);
    int64_t last_pos = d->n_positions ? d->positions[d->n_positions - 1] : -1;
    int64_t row[2] = {0, 0};
    rc = dsv4_probe_def_row_shape(def, cfg, layer, last_pos, row);
    if (rc) {
        snprintf(why, sizeof why, "%s", dsv4_last_error());
        return dsv4_error(DSV4_ERR_SHAPE, "%s: %s", d->path, why);
    }
    if (e->dtype != def->dtype)
        return dsv4_error(DSV4_ERR_SHAPE, "%s: dataset %s is stored as %s, expected %s", d->path, e->name,
                          e->dtype == DSV4_DTYPE_F32 ? "floating point" : "integer",
                          def->dtype == DSV4_DTYPE_F32 ? "float32" : "int32");
    int64_t want[3];
    int ok = e->ndim == def->row_ndim + 1;
    if (def->per_entry) {
        /* Entries made over the whole run: w < T div ratio. */
        int64_t max_n = d->n_tokens / (cfg->compress_ratio[layer] > 0 ? cfg->compress_ratio[layer] : 1);
        want[0] = ok && e->shape[0] <= max_n ? e->shape[0] : max_n;
    } else {
        want[0] = d->n_positions;
    }
    for (int i = 0; i < def->row_ndim; i++) want[i + 1] = row[i];
    for (int i = 0; ok && i < e->ndim; i++) ok = e->shape[i] == want[i];
    if (!ok) {
        char got_s[96], want_s[96];
        dsv4_dump_fmt_shape(got_s, sizeof got_s, e->ndim, e->shape);
        dsv4_dump_fmt_shape(want_s, sizeof want_s, def->row_ndim + 1, want);
        return dsv4_error(DSV4_ERR_SHAPE, "%s: dataset %s has shape %s, expected %s%s", d->path, e->name, got_s,
                          want_s, def->per_entry ? " (at most that many entries)" : "");
    }
    e->validated = 1;
    return 0;
}

/* The open, validated entry for dataset `name` (opened on first use). */
static int dsv4_dump_dataset(const dsv4_dump *d, const char *name, dsv4_h5_dset **out)
{
    char msg[256];
    DSV4_CHECK(d && name, "dsv4_dump: dump and dataset name are required");
    dsv4_h5_dset *e = dsv4_h5_table_get(d->dsets, name);
    if (e) {
        *out = e;
        return 0;
    }
    if (!dsv4_dump_has(d, name)) return dsv4_error(DSV4_ERR_MISSING, "%s: no dataset %s", d->path, name);
    hid_t id = H5Dopen2(d->file, name, H5P_DEFAULT);
    if (id < 0)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: cannot open dataset %s: %s", d->path, name, dsv4_h5_errmsg(msg, sizeof msg));
    hid_t t = H5Dget_type(id), s = H5Dget_space(id), dcpl = H5Dget_create_plist(id);
    H5T_class_t cls = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    int ndim = s >= 0 ? H5Sget_simple_extent_ndims(s) : -1;
    hsize_t dims[4] = {0}, chunk[4] = {0};
    int chunk_nd = -1;
    if (ndim >= 1 && ndim <= 4) {
        H5Sget_simple_extent_dims(s, dims, NULL);
        if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED) chunk_nd = H5Pget_chunk(dcpl, 4, chunk);
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    if (s >= 0) H5Sclose(s);
    if (t >= 0) H5Tclose(t);
    if (cls != H5T_FLOAT && cls != H5T_INTEGER) {
        H5Dclose(id);
        return dsv4_error(DSV4_ERR_SHAPE, "%s: dataset %s is neither floating point nor integer", d->path, name);
    }
    if (ndim < 1 || ndim > 4) {
        H5Dclose(id);
        return dsv4_error(DSV4_ERR_SHAPE, "%s: dataset %s has %d dims (1 to 4 supported)", d->path, name, ndim);
    }
    /* One chunk of cache: rows of a chunk read one call at a time inflate it once, and a dump with hundreds of
     * datasets does not hold hundreds of default 1 MiB caches. */
    if (chunk_nd == ndim) {
        size_t bytes = 4;
        for (int i = 0; i < ndim; i++) bytes *= chunk[i];
        hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
        hid_t id2 = -1;
        if (dapl >= 0 && H5Pset_chunk_cache(dapl, 521, bytes * 2 + 4096, 0.75) >= 0)
            id2 = H5Dopen2(d->file, name, dapl);
        if (dapl >= 0) H5Pclose(dapl);
        if (id2 >= 0) {
            H5Dclose(id);
            id = id2;
        }
        H5Eclear2(H5E_DEFAULT);
    }
    int rc = dsv4_h5_table_put(d->dsets, name, id, &e);
    if (rc) return rc;
    e->dtype = cls == H5T_FLOAT ? DSV4_DTYPE_F32 : DSV4_DTYPE_I32;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = (int64_t)dims[i];
    *out = e;
    return 0;
}

int dsv4_dump_info(const dsv4_dump *d, const char *name, dsv4_dataset_info *info)
{
    dsv4_h5_dset *e;
    int rc = dsv4_dump_dataset(d, name, &e);
    if (rc) return rc;
    if (!e->validated && (rc = dsv4_dump_validate(d, e)) != 0) return rc;
    if (info) {
        memset(info, 0, sizeof *info);
        info->dtype = e->dtype;
        info->ndim = e->ndim;
        for (int i = 0; i < e->ndim; i++) info->shape[i] = e->shape[i];
    }
    return 0;
}

int dsv4_dump_read_rows(const dsv4_dump *d, const char *name, int64_t row0, int64_t nrows, void *dst)
{
    char msg[256];
    dsv4_dataset_info info;
    int rc = dsv4_dump_info(d, name, &info);
    if (rc) return rc;
    DSV4_CHECK(row0 >= 0 && nrows >= 0 && row0 + nrows <= info.shape[0], "%s: %s: rows [%lld, %lld) out of [0, %lld)",
               d->path, name, (long long)row0, (long long)(row0 + nrows), (long long)info.shape[0]);
    hsize_t start[4] = {(hsize_t)row0}, count[4] = {(hsize_t)nrows};
    size_t n = (size_t)nrows;
    for (int i = 1; i < info.ndim; i++) {
        count[i] = (hsize_t)info.shape[i];
        n *= count[i];
    }
    if (n == 0) return 0; /* no elements (no rows, or rows of width 0): nothing to read, dst may be NULL */
    DSV4_CHECK(dst, "%s: %s: dst is NULL", d->path, name);
    dsv4_h5_dset *e = dsv4_h5_table_get(d->dsets, name);
    hid_t fspace = H5Dget_space(e->id);
    hid_t mspace = H5Screate_simple(info.ndim, count, NULL);
    int ok = fspace >= 0 && mspace >= 0 &&
             H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
             H5Dread(e->id, info.dtype == DSV4_DTYPE_F32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32, mspace, fspace,
                     H5P_DEFAULT, dst) >= 0;
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    if (!ok)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: cannot read rows [%lld, %lld) of %s: %s", d->path, (long long)row0,
                          (long long)(row0 + nrows), name, dsv4_h5_errmsg(msg, sizeof msg));
    return 0;
}
