/* h5util.c - HDF5 helpers shared by the dump writer and reader: quiet error stack, string and integer
 * attributes, and the name -> open dataset table.
 *
 * Strings: h5py writes variable-length UTF-8 strings, other tools fixed-length (null-padded or space-padded,
 * possibly without a terminator): both are read. We write variable-length UTF-8, like h5py, so there is no
 * 64 KiB attribute-size limit on config_json.
 * Integers: h5py writes int64; any stored integer type is read through HDF5's conversion to native long long.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dump/dump_internal.h"

typedef struct dsv4_h5_walk {
    char *buf;
    size_t size;
    int found;
} dsv4_h5_walk;

static herr_t dsv4_h5_walk_cb(unsigned n, const H5E_error2_t *err, void *data)
{
    dsv4_h5_walk *w = data;
    if (!w->found && err && err->desc && err->desc[0]) {
        snprintf(w->buf, w->size, "%s", err->desc);
        w->found = 1;
    }
    return 0;
}

/* HDF5's message of the last failed call. Kept by our own error handler at the moment the call fails:
 * any later HDF5 call (even a successful H5Sclose on the cleanup path) clears the error stack. */
static _Thread_local char dsv4_h5_last[512];

static herr_t dsv4_h5_auto(hid_t estack, void *data)
{
    /* Upward: the innermost frame first, the most specific ("truncated file: eof = ...", "inflate() failed"). */
    dsv4_h5_walk w = {dsv4_h5_last, sizeof dsv4_h5_last, 0};
    dsv4_h5_last[0] = 0;
    H5Ewalk2(estack, H5E_WALK_UPWARD, dsv4_h5_walk_cb, &w);
    return 0;
}

void dsv4_h5_quiet(void)
{
    H5Eset_auto2(H5E_DEFAULT, dsv4_h5_auto, NULL);
}

const char *dsv4_h5_errmsg(char *buf, size_t size)
{
    const char *src = dsv4_h5_last[0] ? dsv4_h5_last : "HDF5 call failed";
    if (size) {
        size_t n = strlen(src) < size ? strlen(src) : size - 1; /* HDF5 messages can be long: cut, never overflow */
        memcpy(buf, src, n);
        buf[n] = 0;
    }
    dsv4_h5_last[0] = 0;
    return buf;
}

int dsv4_h5_write_str_attr(hid_t obj, const char *name, const char *value)
{
    int rc = -1;
    hid_t type = H5Tcopy(H5T_C_S1), space = -1, attr = -1;
    if (type < 0) return -1;
    if (H5Tset_size(type, H5T_VARIABLE) < 0 || H5Tset_cset(type, H5T_CSET_UTF8) < 0) goto out;
    if ((space = H5Screate(H5S_SCALAR)) < 0) goto out;
    if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0) goto out;
    if ((attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT)) < 0) goto out;
    const char *v = value ? value : "";
    if (H5Awrite(attr, type, &v) < 0) goto out;
    rc = 0;
out:
    if (attr >= 0) H5Aclose(attr);
    if (space >= 0) H5Sclose(space);
    H5Tclose(type);
    return rc;
}

/* Opens attribute `name` of obj: 0 and *attr, or DSV4_ERR_MISSING / DSV4_ERR_FORMAT with a message. */
static int dsv4_h5_open_attr(hid_t obj, const char *name, const char *path, hid_t *attr)
{
    char msg[256];
    htri_t ex = H5Aexists(obj, name);
    if (ex < 0)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: cannot read attribute '%s': %s", path, name,
                          dsv4_h5_errmsg(msg, sizeof msg));
    if (ex == 0) return dsv4_error(DSV4_ERR_MISSING, "%s: missing attribute '%s'", path, name);
    *attr = H5Aopen(obj, name, H5P_DEFAULT);
    if (*attr < 0)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: cannot open attribute '%s': %s", path, name,
                          dsv4_h5_errmsg(msg, sizeof msg));
    return 0;
}

int dsv4_h5_read_str_attr(hid_t obj, const char *name, const char *path, char **out)
{
    char msg[256];
    hid_t attr = -1, ftype = -1, space = -1, mtype = -1;
    *out = NULL;
    int rc = dsv4_h5_open_attr(obj, name, path, &attr);
    if (rc) return rc;
    rc = DSV4_ERR_FORMAT;
    if ((ftype = H5Aget_type(attr)) < 0 || (space = H5Aget_space(attr)) < 0) {
        dsv4_error(rc, "%s: attribute '%s': %s", path, name, dsv4_h5_errmsg(msg, sizeof msg));
        goto out;
    }
    if (H5Tget_class(ftype) != H5T_STRING) {
        dsv4_error(rc, "%s: attribute '%s' is not a string", path, name);
        goto out;
    }
    hssize_t npoints = H5Sget_simple_extent_npoints(space);
    if (npoints != 1) {
        dsv4_error(rc, "%s: attribute '%s' holds %lld strings, expected one", path, name, (long long)npoints);
        goto out;
    }
    htri_t is_var = H5Tis_variable_str(ftype);
    if (is_var < 0 || (mtype = H5Tcopy(H5T_C_S1)) < 0) {
        dsv4_error(rc, "%s: attribute '%s': %s", path, name, dsv4_h5_errmsg(msg, sizeof msg));
        goto out;
    }
    H5Tset_cset(mtype, H5Tget_cset(ftype));
    if (is_var) {
        char *v = NULL;
        if (H5Tset_size(mtype, H5T_VARIABLE) < 0 || H5Aread(attr, mtype, &v) < 0) {
            dsv4_error(rc, "%s: cannot read string attribute '%s': %s", path, name, dsv4_h5_errmsg(msg, sizeof msg));
            goto out;
        }
        *out = strdup(v ? v : "");
        H5Dvlen_reclaim(mtype, space, H5P_DEFAULT, &v);
    } else {
        size_t n = H5Tget_size(ftype);
        char *v = calloc(n + 1, 1);
        if (!v) {
            rc = dsv4_error(DSV4_ERR_NOMEM, "%s: attribute '%s': out of memory", path, name);
            goto out;
        }
        /* Read with the file's own padding into n bytes, then terminate and drop space padding ourselves. */
        if (H5Tset_size(mtype, n) < 0 || H5Tset_strpad(mtype, H5Tget_strpad(ftype)) < 0 ||
            H5Aread(attr, mtype, v) < 0) {
            free(v);
            dsv4_error(rc, "%s: cannot read string attribute '%s': %s", path, name, dsv4_h5_errmsg(msg, sizeof msg));
            goto out;
        }
        v[n] = 0;
        if (H5Tget_strpad(ftype) == H5T_STR_SPACEPAD)
            for (size_t i = strlen(v); i > 0 && v[i - 1] == ' '; i--) v[i - 1] = 0;
        *out = v;
    }
    if (!*out) {
        rc = dsv4_error(DSV4_ERR_NOMEM, "%s: attribute '%s': out of memory", path, name);
        goto out;
    }
    rc = 0;
out:
    if (mtype >= 0) H5Tclose(mtype);
    if (space >= 0) H5Sclose(space);
    if (ftype >= 0) H5Tclose(ftype);
    H5Aclose(attr);
    return rc;
}

int dsv4_h5_read_int_attr(hid_t obj, const char *name, const char *path, int64_t *out)
{
    char msg[256];
    hid_t attr = -1, ftype = -1, space = -1;
    int rc = dsv4_h5_open_attr(obj, name, path, &attr);
    if (rc) return rc;
    rc = DSV4_ERR_FORMAT;
    if ((ftype = H5Aget_type(attr)) < 0 || (space = H5Aget_space(attr)) < 0) {
        dsv4_error(rc, "%s: attribute '%s': %s", path, name, dsv4_h5_errmsg(msg, sizeof msg));
        goto out;
    }
    if (H5Tget_class(ftype) != H5T_INTEGER) {
        dsv4_error(rc, "%s: attribute '%s' is not an integer", path, name);
        goto out;
    }
    if (H5Sget_simple_extent_npoints(space) != 1) {
        dsv4_error(rc, "%s: attribute '%s' is not a single integer", path, name);
        goto out;
    }
    long long v = 0;
    if (H5Aread(attr, H5T_NATIVE_LLONG, &v) < 0) {
        dsv4_error(rc, "%s: cannot read attribute '%s': %s", path, name, dsv4_h5_errmsg(msg, sizeof msg));
        goto out;
    }
    *out = v;
    rc = 0;
out:
    if (space >= 0) H5Sclose(space);
    if (ftype >= 0) H5Tclose(ftype);
    H5Aclose(attr);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ table */

static uint64_t dsv4_h5_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

dsv4_h5_dset *dsv4_h5_table_get(dsv4_h5_table *t, const char *name)
{
    if (!t->cap) return NULL;
    for (size_t i = dsv4_h5_hash(name) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        dsv4_h5_dset *e = &t->slots[i];
        if (!e->name) return NULL;
        if (strcmp(e->name, name) == 0) return e;
    }
}

static int dsv4_h5_table_grow(dsv4_h5_table *t)
{
    size_t cap = t->cap ? t->cap * 2 : 64;
    dsv4_h5_dset *slots = calloc(cap, sizeof *slots);
    if (!slots) return DSV4_ERR_NOMEM;
    for (size_t j = 0; j < t->cap; j++) {
        if (!t->slots[j].name) continue;
        size_t i = dsv4_h5_hash(t->slots[j].name) & (cap - 1);
        while (slots[i].name) i = (i + 1) & (cap - 1);
        slots[i] = t->slots[j];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

int dsv4_h5_table_put(dsv4_h5_table *t, const char *name, hid_t id, dsv4_h5_dset **out)
{
    char *copy = strdup(name);
    if (!copy || ((t->count + 1) * 2 > t->cap && dsv4_h5_table_grow(t) != 0)) {
        free(copy);
        H5Dclose(id);
        return dsv4_error(DSV4_ERR_NOMEM, "dataset table: out of memory for %s", name);
    }
    size_t i = dsv4_h5_hash(name) & (t->cap - 1);
    while (t->slots[i].name) i = (i + 1) & (t->cap - 1);
    dsv4_h5_dset *e = &t->slots[i];
    memset(e, 0, sizeof *e);
    e->name = copy;
    e->id = id;
    t->count++;
    *out = e;
    return 0;
}

int dsv4_h5_table_clear(dsv4_h5_table *t)
{
    int rc = 0;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slots[i].name) continue;
        if (H5Dclose(t->slots[i].id) < 0) rc = -1;
        free(t->slots[i].name);
    }
    free(t->slots);
    t->slots = NULL;
    t->cap = t->count = 0;
    return rc;
}
