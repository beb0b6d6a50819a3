/* writer.c - the dsv4-dump/1 writer (dump-format.md; API in include/dsv4/dsv4_dump.h).
 *
 * The file is built as "<path>.tmp.<pid>" and renamed over <path> only by commit, so a crash or an abort
 * never leaves a half-written dump under the final name; the temporary is registered (model/tempfile.c) from
 * before it is created until after the rename, so SIGINT/SIGTERM in the dsv4 command remove it.
 * Per-position datasets [R, row...] are created on their first row write, chunked by whole rows
 * (dsv4_dump_chunk: ~256 KiB per chunk, never more than 1 MiB) with shuffle + gzip 4.
 * Quiet trap: rows may arrive in any order and some never arrive; HDF5 would read an unwritten chunk as
 * zeros, which a verifier cannot tell from data. The fill value is NaN (f32) / -1 (i32) so a missing row
 * is visible.
 * Open datasets stay open in a name table until commit, so a row write is a hash lookup + one H5Dwrite,
 * and each keeps a one-chunk cache so rows of a chunk arriving one by one are compressed once.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dump/dump_internal.h"

#define DSV4_DUMP_CHUNK_TARGET (256u * 1024u) /* bytes a chunk aims for: several small rows per chunk */
#define DSV4_DUMP_CHUNK_MAX (1024u * 1024u)   /* a chunk is never larger: a huge row is split */
#define DSV4_DUMP_GZIP_LEVEL 4

struct dsv4_dump_writer {
    char *path;            /* final name */
    char *tmp_path;        /* "<path>.tmp.<pid>" */
    int tmp_slot;          /* its slot in the temporary-file registry (SIGINT/SIGTERM unlink it), or < 0 */
    hid_t file;
    int n_tokens;          /* T = prompt_len + n_decode */
    int n_positions;       /* R */
    int32_t *positions;    /* [R] ascending, owned */
    dsv4_h5_table dsets;   /* open datasets by name */
};

/* Names the writer sets itself; dsv4_dump_writer_attr may not overwrite them. */
static const char *const dsv4_dump_reserved_attrs[] = {"schema",   "producer", "config_json", "weights_digest",
                                                       "prompt_len", "n_decode", "mode"};

/* Chunk dims for a dataset of `ndim` dims (dims[0] = rows): whole rows, ~TARGET bytes, at most MAX bytes. */
static void dsv4_dump_chunk(int ndim, const hsize_t *dims, size_t elem, hsize_t *chunk)
{
    size_t row_bytes = elem;
    for (int i = 1; i < ndim; i++) {
        chunk[i] = dims[i];
        row_bytes *= dims[i];
    }
    hsize_t rows = 1;
    if (row_bytes < DSV4_DUMP_CHUNK_TARGET) rows = DSV4_DUMP_CHUNK_TARGET / row_bytes;
    if (dims[0] > 0 && rows > dims[0]) rows = dims[0];
    chunk[0] = rows;
    /* A row over MAX: shrink the row dims from the outermost so the chunk stays under MAX. */
    for (int i = 1; i < ndim; i++) {
        size_t inner = elem;
        for (int j = i + 1; j < ndim; j++) inner *= chunk[j];
        if (chunk[i] * inner > DSV4_DUMP_CHUNK_MAX) {
            hsize_t c = DSV4_DUMP_CHUNK_MAX / inner;
            chunk[i] = c ? c : 1;
        }
    }
}

/* Creates dataset `name` [dims] with the dump's layout: chunked, shuffle+gzip, fill NaN / -1.
 * unlimited_rows: first dim extendible (per-entry arrays may have 0 rows). Returns the dataset or < 0. */
static hid_t dsv4_dump_create_dataset(hid_t file, const char *name, dsv4_dtype dtype, int ndim, const hsize_t *dims,
                                      int unlimited_rows)
{
    hid_t ftype = dtype == DSV4_DTYPE_F32 ? H5T_IEEE_F32LE : H5T_STD_I32LE;
    hid_t mtype = dtype == DSV4_DTYPE_F32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32;
    size_t elem = 4;
    hsize_t maxdims[5], chunk[5];
    int empty = 0;
    for (int i = 0; i < ndim; i++) {
        maxdims[i] = dims[i];
        if (dims[i] == 0 && !(i == 0 && unlimited_rows)) empty = 1;
    }
    if (unlimited_rows && !empty) maxdims[0] = H5S_UNLIMITED;
    hid_t space = H5Screate_simple(ndim, dims, maxdims);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    hid_t dset = -1;
    if (space < 0 || dcpl < 0 || lcpl < 0 || dapl < 0) goto out;
    if (H5Pset_create_intermediate_group(lcpl, 1) < 0) goto out;
    float fill_f = NAN;
    int32_t fill_i = -1;
    if (H5Pset_fill_value(dcpl, mtype, dtype == DSV4_DTYPE_F32 ? (const void *)&fill_f : (const void *)&fill_i) < 0)
        goto out;
    if (!empty) {
        /* A dataset with a zero-length row dim cannot be chunked (chunk dims must be >= 1 and <= fixed dims);
         * it holds no data, so it stays contiguous and unfiltered. */
        dsv4_dump_chunk(ndim, dims, elem, chunk);
        if (H5Pset_chunk(dcpl, ndim, chunk) < 0 || H5Pset_shuffle(dcpl) < 0 ||
            H5Pset_deflate(dcpl, DSV4_DUMP_GZIP_LEVEL) < 0)
            goto out;
        size_t chunk_bytes = elem;
        for (int i = 0; i < ndim; i++) chunk_bytes *= chunk[i];
        if (H5Pset_chunk_cache(dapl, 521, chunk_bytes + 4096, 0.75) < 0) goto out;
    }
    dset = H5Dcreate2(file, name, ftype, space, lcpl, dcpl, dapl);
out:
    if (dapl >= 0) H5Pclose(dapl);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    return dset;
}

/* Writes a small contiguous int32 dataset (tokens, positions); data NULL leaves it at the fill value -1. */
static int dsv4_dump_write_ids(dsv4_dump_writer *w, const char *name, const int32_t *data, int n)
{
    char msg[256];
    hsize_t dims[1] = {(hsize_t)n};
    hid_t space = H5Screate_simple(1, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    int32_t fill = -1;
    hid_t dset = -1;
    int rc = -1;
    if (space >= 0 && dcpl >= 0 && H5Pset_fill_value(dcpl, H5T_NATIVE_INT32, &fill) >= 0)
        dset = H5Dcreate2(w->file, name, H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (dset >= 0 && (!data || n == 0 || H5Dwrite(dset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0))
        rc = 0;
    if (dset >= 0) H5Dclose(dset);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    if (rc) return dsv4_error(DSV4_ERR_IO, "%s: cannot write /%s: %s", w->path, name, dsv4_h5_errmsg(msg, sizeof msg));
    return 0;
}

static int dsv4_dump_write_int_attr(hid_t obj, const char *name, int64_t value)
{
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = space >= 0 ? H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT) : -1;
    long long v = value;
    int rc = attr >= 0 && H5Awrite(attr, H5T_NATIVE_LLONG, &v) >= 0 ? 0 : -1;
    if (attr >= 0) H5Aclose(attr);
    if (space >= 0) H5Sclose(space);
    return rc;
}

/* Root attributes, /tokens, /positions, /layers/<L> with their types, /final. */
static int dsv4_dump_writer_layout(dsv4_dump_writer *w, const dsv4_dump_meta *meta, const dsv4_config *cfg,
                                   const int32_t *tokens)
{
    char msg[256];
    const char *what = "root attributes";
    if (dsv4_h5_write_str_attr(w->file, "schema", DSV4_DUMP_SCHEMA) < 0 ||
        dsv4_h5_write_str_attr(w->file, "producer", meta->producer) < 0 ||
        dsv4_h5_write_str_attr(w->file, "config_json", meta->config_json) < 0 ||
        dsv4_h5_write_str_attr(w->file, "weights_digest", meta->weights_digest) < 0 ||
        dsv4_dump_write_int_attr(w->file, "prompt_len", meta->prompt_len) < 0 ||
        dsv4_dump_write_int_attr(w->file, "n_decode", meta->n_decode) < 0 ||
        dsv4_h5_write_str_attr(w->file, "mode", meta->mode) < 0)
        goto fail;
    int rc = dsv4_dump_write_ids(w, "tokens", tokens, w->n_tokens);
    if (rc) return rc;
    rc = dsv4_dump_write_ids(w, "positions", w->positions, w->n_positions);
    if (rc) return rc;
    what = "/layers";
    hid_t layers = H5Gcreate2(w->file, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (layers < 0) goto fail;
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        char name[16];
        snprintf(name, sizeof name, "%d", l);
        hid_t g = H5Gcreate2(layers, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        int bad = g < 0 || dsv4_h5_write_str_attr(g, "attention", dsv4_attn_type_name(cfg->attn_type[l])) < 0 ||
                  dsv4_h5_write_str_attr(g, "mlp", dsv4_mlp_type_name(cfg->mlp_type[l])) < 0;
        if (g >= 0) H5Gclose(g);
        if (bad) {
            H5Gclose(layers);
            goto fail;
        }
    }
    H5Gclose(layers);
    what = "/final";
    hid_t fin = H5Gcreate2(w->file, "final", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (fin < 0) goto fail;
    H5Gclose(fin);
    return 0;
fail:
    return dsv4_error(DSV4_ERR_IO, "%s: cannot write %s: %s", w->path, what, dsv4_h5_errmsg(msg, sizeof msg));
}

/* Closes the file and every dataset; returns 0 or DSV4_ERR_IO (message set). */
static int dsv4_dump_writer_close(dsv4_dump_writer *w)
{
    char msg[256];
    int rc = dsv4_h5_table_clear(&w->dsets);
    if (w->file >= 0 && H5Fclose(w->file) < 0) rc = -1;
    w->file = -1;
    if (rc) return dsv4_error(DSV4_ERR_IO, "%s: cannot close %s: %s", w->path, w->tmp_path, dsv4_h5_errmsg(msg, sizeof msg));
    return 0;
}

static void dsv4_dump_writer_destroy(dsv4_dump_writer *w)
{
    dsv4_tempfile_unregister(w->tmp_slot); /* after the rename or the unlink */
    free(w->path);
    free(w->tmp_path);
    free(w->positions);
    free(w);
}

int dsv4_dump_writer_open(const char *path, const dsv4_dump_meta *meta, const dsv4_config *cfg,
                          const int32_t *tokens, int n_tokens, const int32_t *positions, int n_positions,
                          dsv4_dump_writer **out)
{
    char msg[256];
    DSV4_CHECK(out, "dsv4_dump_writer_open: out is NULL");
    *out = NULL;
    DSV4_CHECK(path && *path && meta && cfg, "dsv4_dump_writer_open: path, meta and cfg are required");
    DSV4_CHECK(meta->producer && meta->config_json && meta->weights_digest && meta->mode,
               "%s: dump meta needs producer, config_json, weights_digest and mode", path);
    DSV4_CHECK(meta->prompt_len >= 0 && meta->n_decode >= 0 && n_tokens == meta->prompt_len + meta->n_decode,
               "%s: %d tokens for prompt_len %d + n_decode %d", path, n_tokens, meta->prompt_len, meta->n_decode);
    DSV4_CHECK(cfg->num_hidden_layers >= 0 && cfg->num_hidden_layers <= DSV4_MAX_LAYERS,
               "%s: num_hidden_layers %d out of range", path, cfg->num_hidden_layers);
    DSV4_CHECK(n_positions >= 0 && (positions || n_positions == 0), "%s: positions missing", path);
    for (int i = 0; i < n_positions; i++)
        DSV4_CHECK(positions[i] >= 0 && positions[i] < n_tokens && (i == 0 || positions[i] > positions[i - 1]),
                   "%s: positions[%d] = %d: positions must ascend within [0, %d)", path, i, positions[i], n_tokens);

    /* The final name is only used by the rename at commit, after the whole run: a directory there (or "dir/")
     * would fail it then and lose the run, and another non-file (a device) would be replaced by the dump. */
    struct stat st;
    const size_t plen = strlen(path);
    const int exists = !stat(path, &st);
    if (path[plen - 1] == '/' || (exists && S_ISDIR(st.st_mode)))
        return dsv4_error(DSV4_ERR_IO, "%s: names a directory; give the dump's file name (e.g. %s%sdump.h5)", path,
                          path, path[plen - 1] == '/' ? "" : "/");
    if (exists && !S_ISREG(st.st_mode))
        return dsv4_error(DSV4_ERR_IO, "%s: exists and is not a regular file; the dump would replace it", path);

    dsv4_h5_quiet();
    dsv4_dump_writer *w = calloc(1, sizeof *w);
    if (!w) return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
    w->file = -1;
    w->tmp_slot = -1;
    w->n_tokens = n_tokens;
    w->n_positions = n_positions;
    size_t tlen = strlen(path) + 32;
    w->path = strdup(path);
    w->tmp_path = malloc(tlen);
    w->positions = malloc(((size_t)n_positions + 1) * sizeof *w->positions);
    if (!w->path || !w->tmp_path || !w->positions) {
        dsv4_dump_writer_destroy(w);
        return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(w->tmp_path, tlen, "%s.tmp.%ld", path, (long)getpid());
    if (n_positions) memcpy(w->positions, positions, (size_t)n_positions * sizeof *positions);
    w->tmp_slot = dsv4_tempfile_register(w->tmp_path); /* before the file exists: no window without cleanup */

    /* STRONG: closing the file closes anything still open in it, so an error path never leaks the file. */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0 && H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) >= 0)
        w->file = H5Fcreate(w->tmp_path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (fapl >= 0) H5Pclose(fapl);
    if (w->file < 0) {
        /* the system's reason (a missing folder, no permission) reads better than HDF5's "unable to open file:
         * name = ..., errno = 2, ..., o_flags = 242"; HDF5's stays for what the system does not explain */
        char why[300];
        snprintf(why, sizeof why, "%s", dsv4_h5_errmsg(msg, sizeof msg));
        int fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0) snprintf(why, sizeof why, "%s", strerror(errno));
        else close(fd), unlink(w->tmp_path);
        int rc = dsv4_error(DSV4_ERR_IO, "%s: cannot create %s: %s", path, w->tmp_path, why);
        dsv4_dump_writer_destroy(w);
        return rc;
    }
    int rc = dsv4_dump_writer_layout(w, meta, cfg, tokens);
    if (rc) {
        char keep[2048];
        snprintf(keep, sizeof keep, "%s", dsv4_last_error());
        dsv4_dump_writer_abort(w);
        return dsv4_error(rc, "%s", keep);
    }
    *out = w;
    return 0;
}

int dsv4_dump_writer_set_tokens(dsv4_dump_writer *w, const int32_t *tokens, int n_tokens)
{
    char msg[256];
    DSV4_CHECK(w && tokens, "dsv4_dump_writer_set_tokens: writer and tokens are required");
    DSV4_CHECK(n_tokens == w->n_tokens, "%s: /tokens holds %d tokens, got %d", w->path, w->n_tokens, n_tokens);
    hid_t d = H5Dopen2(w->file, "tokens", H5P_DEFAULT);
    int ok = d >= 0 && (n_tokens == 0 || H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens) >= 0);
    if (d >= 0) H5Dclose(d);
    if (!ok) return dsv4_error(DSV4_ERR_IO, "%s: cannot write /tokens: %s", w->path, dsv4_h5_errmsg(msg, sizeof msg));
    return 0;
}

/* Checks dtype / shape arguments shared by row and array writes. */
static int dsv4_dump_check_shape(const dsv4_dump_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                                 const int64_t *shape, int max_ndim)
{
    DSV4_CHECK(name && *name && name[0] != '/', "%s: dataset name must be relative (\"layers/3/attn_out\")", w->path);
    DSV4_CHECK(dtype == DSV4_DTYPE_F32 || dtype == DSV4_DTYPE_I32, "%s: %s: dtype must be F32 or I32, got %s",
               w->path, name, dsv4_dtype_name(dtype));
    DSV4_CHECK(ndim >= 0 && ndim <= max_ndim && (shape || ndim == 0), "%s: %s: %d dims (at most %d)", w->path,
               name, ndim, max_ndim);
    for (int i = 0; i < ndim; i++)
        DSV4_CHECK(shape[i] >= 0 && shape[i] <= ((int64_t)1 << 40), "%s: %s: dim %d = %lld", w->path, name, i,
                   (long long)shape[i]);
    return 0;
}

int dsv4_dump_writer_row(dsv4_dump_writer *w, const char *name, int row, dsv4_dtype dtype, int row_ndim,
                         const int64_t *row_shape, const void *data)
{
    char msg[256];
    DSV4_CHECK(w, "dsv4_dump_writer_row: writer is NULL");
    int rc = dsv4_dump_check_shape(w, name, dtype, row_ndim, row_shape, 3);
    if (rc) return rc;
    DSV4_CHECK(row >= 0 && row < w->n_positions, "%s: %s: row %d out of range [0, %d)", w->path, name, row,
               w->n_positions);
    DSV4_CHECK(data, "%s: %s: data is NULL", w->path, name);

    dsv4_h5_dset *e = dsv4_h5_table_get(&w->dsets, name);
    if (!e) {
        hsize_t dims[4] = {(hsize_t)w->n_positions};
        for (int i = 0; i < row_ndim; i++) dims[i + 1] = (hsize_t)row_shape[i];
        hid_t id = dsv4_dump_create_dataset(w->file, name, dtype, row_ndim + 1, dims, 0);
        if (id < 0)
            return dsv4_error(DSV4_ERR_IO, "%s: cannot create dataset %s: %s", w->path, name,
                              dsv4_h5_errmsg(msg, sizeof msg));
        rc = dsv4_h5_table_put(&w->dsets, name, id, &e);
        if (rc) return rc;
        e->dtype = dtype;
        e->ndim = row_ndim + 1;
        for (int i = 0; i < e->ndim; i++) e->shape[i] = (int64_t)dims[i];
    } else {
        int same = e->dtype == dtype && e->ndim == row_ndim + 1;
        for (int i = 0; same && i < row_ndim; i++) same = e->shape[i + 1] == row_shape[i];
        if (!same) {
            char want[96] = "", got[96] = "";
            size_t o = 0;
            for (int i = 1; i < e->ndim; i++) o += snprintf(want + o, sizeof want - o, "%s%lld", i > 1 ? "," : "", (long long)e->shape[i]);
            o = 0;
            for (int i = 0; i < row_ndim; i++) o += snprintf(got + o, sizeof got - o, "%s%lld", i ? "," : "", (long long)row_shape[i]);
            return dsv4_error(DSV4_ERR_SHAPE, "%s: %s: row is %s [%s], the dataset holds %s [%s]", w->path, name,
                              dsv4_dtype_name(dtype), got, dsv4_dtype_name(e->dtype), want);
        }
    }
    size_t row_elems = 1;
    for (int i = 1; i < e->ndim; i++) row_elems *= (size_t)e->shape[i];
    if (row_elems == 0) return 0;

    hsize_t start[4] = {(hsize_t)row}, count[4] = {1};
    for (int i = 1; i < e->ndim; i++) count[i] = (hsize_t)e->shape[i];
    hid_t fspace = H5Dget_space(e->id);
    hid_t mspace = H5Screate_simple(e->ndim, count, NULL);
    int ok = fspace >= 0 && mspace >= 0 &&
             H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
             H5Dwrite(e->id, dtype == DSV4_DTYPE_F32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32, mspace, fspace,
                      H5P_DEFAULT, data) >= 0;
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    if (!ok) return dsv4_error(DSV4_ERR_IO, "%s: cannot write row %d of %s: %s", w->path, row, name,
                               dsv4_h5_errmsg(msg, sizeof msg));
    return 0;
}

int dsv4_dump_writer_array(dsv4_dump_writer *w, const char *name, dsv4_dtype dtype, int ndim, const int64_t *shape,
                           const void *data)
{
    char msg[256];
    DSV4_CHECK(w, "dsv4_dump_writer_array: writer is NULL");
    int rc = dsv4_dump_check_shape(w, name, dtype, ndim, shape, 4);
    if (rc) return rc;
    DSV4_CHECK(ndim >= 1, "%s: %s: an array needs at least one dim", w->path, name);
    htri_t exists = dsv4_h5_table_get(&w->dsets, name) ? 1 : H5Lexists(w->file, name, H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT); /* H5Lexists fails (quietly) when an intermediate group is missing */
    DSV4_CHECK(exists <= 0, "%s: dataset %s is already written", w->path, name);
    hsize_t dims[4];
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        dims[i] = (hsize_t)shape[i];
        n *= dims[i];
    }
    DSV4_CHECK(data || n == 0, "%s: %s: data is NULL", w->path, name);
    hid_t id = dsv4_dump_create_dataset(w->file, name, dtype, ndim, dims, 1);
    int ok = id >= 0 &&
             (n == 0 || H5Dwrite(id, dtype == DSV4_DTYPE_F32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32, H5S_ALL,
                                 H5S_ALL, H5P_DEFAULT, data) >= 0);
    if (!ok) {
        rc = dsv4_error(DSV4_ERR_IO, "%s: cannot write dataset %s: %s", w->path, name, dsv4_h5_errmsg(msg, sizeof msg));
        if (id >= 0) H5Dclose(id);
        return rc;
    }
    /* Kept open with the others: commit closes it, and a second write of the same name is refused. */
    dsv4_h5_dset *e;
    rc = dsv4_h5_table_put(&w->dsets, name, id, &e);
    if (rc) return rc;
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    return 0;
}

int dsv4_dump_writer_attr(dsv4_dump_writer *w, const char *name, const char *value)
{
    char msg[256];
    DSV4_CHECK(w && name && *name && value, "dsv4_dump_writer_attr: writer, name and value are required");
    for (size_t i = 0; i < sizeof dsv4_dump_reserved_attrs / sizeof dsv4_dump_reserved_attrs[0]; i++)
        DSV4_CHECK(strcmp(name, dsv4_dump_reserved_attrs[i]) != 0, "%s: attribute '%s' is set by the writer itself",
                   w->path, name);
    if (dsv4_h5_write_str_attr(w->file, name, value) < 0)
        return dsv4_error(DSV4_ERR_IO, "%s: cannot write attribute '%s': %s", w->path, name,
                          dsv4_h5_errmsg(msg, sizeof msg));
    return 0;
}

int dsv4_dump_writer_commit(dsv4_dump_writer *w)
{
    DSV4_CHECK(w, "dsv4_dump_writer_commit: writer is NULL");
    int rc = dsv4_dump_writer_close(w);
    if (rc == 0 && rename(w->tmp_path, w->path) != 0)
        rc = dsv4_error(DSV4_ERR_IO, "%s: cannot rename %s into place: %s", w->path, w->tmp_path, strerror(errno));
    if (rc) unlink(w->tmp_path);
    dsv4_dump_writer_destroy(w);
    return rc;
}

void dsv4_dump_writer_abort(dsv4_dump_writer *w)
{
    if (!w) return;
    dsv4_h5_table_clear(&w->dsets);
    if (w->file >= 0) H5Fclose(w->file);
    H5Eclear2(H5E_DEFAULT);
    unlink(w->tmp_path);
    dsv4_dump_writer_destroy(w);
}

const int32_t *dsv4_dump_writer_positions(const dsv4_dump_writer *w, int *n)
{
    *n = w->n_positions;
    return w->positions;
}

const char *dsv4_dump_writer_path(const dsv4_dump_writer *w)
{
    return w->path;
}
