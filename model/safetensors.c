/* safetensors.c - one safetensors file, mmapped read-only, its header validated completely at open.
 *
 * Layout: u64 little-endian N, then N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]},
 * "__metadata__": {...}}, then the data section; offsets are relative to the data section.
 * Every check a reader would otherwise trip over later is done here, once, with the file and tensor named:
 * header length past EOF, JSON syntax, duplicate keys (jansson JSON_REJECT_DUPLICATES), unknown dtype,
 * negative or overflowing dims, shape x dtype size != byte range, begin > end, end past the data section,
 * and overlapping byte ranges. Nothing here dereferences tensor data.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/internal.h"

void dsv4_st_free(dsv4_st_file *f)
{
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->entries[i].name);
    free(f->entries);
    if (f->map && f->mapped) munmap((void *)f->map, f->size);
    free(f->path);
    free(f);
}

static int map_file(dsv4_st_file *f)
{
    /* O_NONBLOCK: a FIFO named like a shard must not block the open; only regular files are mapped */
    int fd = open(f->path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return dsv4_error(DSV4_ERR_IO, "%s: cannot open: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dsv4_error(DSV4_ERR_IO, "%s: cannot stat: %s", f->path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dsv4_error(DSV4_ERR_IO, "%s: not a regular file", f->path);
    }
    f->size = (size_t)st.st_size;
    if (f->size < 8) {
        close(fd);
        return dsv4_error(DSV4_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length",
                          f->path, f->size);
    }
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return dsv4_error(DSV4_ERR_IO, "%s: cannot mmap: %s", f->path, strerror(e));
    f->map = p;
    f->mapped = 1;
    return 0;
}

/* A dim as int64 >= 0; DSV4_ERR_FORMAT otherwise. */
static int parse_dim(const dsv4_st_file *f, const char *name, json_t *v, int64_t *out)
{
    if (!json_is_integer(v))
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: shape entries must be integers", f->path, name);
    json_int_t d = json_integer_value(v);
    if (d < 0)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: negative dim %lld in shape", f->path, name, (long long)d);
    *out = (int64_t)d;
    return 0;
}

static int parse_entry(const dsv4_st_file *f, const char *name, json_t *v, dsv4_st_entry *e)
{
    if (!json_is_object(v))
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: header entry is not an object", f->path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: missing or non-string \"dtype\"", f->path, name);
    int dt = dsv4_dtype_from_name(json_string_value(jd));
    if (dt < 0)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: unknown dtype \"%s\"", f->path, name,
                          json_string_value(jd));
    e->dtype = (dsv4_dtype)dt;
    if (!json_is_array(js))
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: missing or non-array \"shape\"", f->path, name);
    size_t nd = json_array_size(js);
    if (nd > 4)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: %zu dims (at most 4 supported)", f->path, name, nd);
    e->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        int rc = parse_dim(f, name, json_array_get(js, i), &e->shape[i]);
        if (rc) return rc;
        uint64_t d = (uint64_t)e->shape[i];
        if (d != 0 && numel > (UINT64_MAX / 16) / d)
            return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: shape overflows (dim %zu = %lld)", f->path, name, i,
                              (long long)e->shape[i]);
        numel *= d;
    }
    for (int i = e->ndim; i < 4; i++) e->shape[i] = 1;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: \"data_offsets\" must be [begin, end] integers", f->path,
                          name);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), en = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || en < 0 || b > en)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: data_offsets [%lld, %lld] out of range (begin > end or < 0)",
                          f->path, name, (long long)b, (long long)en);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    if (e->end > f->data_size)
        return dsv4_error(DSV4_ERR_FORMAT,
                          "%s: tensor %s: data_offsets end %llu is past the end of the data section (%zu bytes; "
                          "truncated file?)",
                          f->path, name, (unsigned long long)e->end, f->data_size);
    uint64_t bytes = numel * dsv4_dtype_size(e->dtype);
    if (e->end - e->begin != bytes)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: tensor %s: shape x %s = %llu bytes but data_offsets span %llu bytes",
                          f->path, name, dsv4_dtype_name(e->dtype), (unsigned long long)bytes,
                          (unsigned long long)(e->end - e->begin));
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const dsv4_st_entry *x = *(const dsv4_st_entry *const *)a, *y = *(const dsv4_st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int check_overlaps(const dsv4_st_file *f)
{
    if (f->n < 2) return 0;
    const dsv4_st_entry **s = malloc(sizeof *s * (size_t)f->n);
    if (!s) return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < f->n; i++) s[i] = &f->entries[i];
    qsort(s, (size_t)f->n, sizeof *s, cmp_begin);
    const dsv4_st_entry *prev = NULL;
    int rc = 0;
    for (int i = 0; i < f->n && !rc; i++) {
        if (s[i]->begin == s[i]->end) continue; /* empty tensors occupy no bytes */
        if (prev && s[i]->begin < prev->end)
            rc = dsv4_error(DSV4_ERR_FORMAT, "%s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap", f->path,
                            prev->name, (unsigned long long)prev->begin, (unsigned long long)prev->end, s[i]->name,
                            (unsigned long long)s[i]->begin, (unsigned long long)s[i]->end);
        prev = s[i];
    }
    free(s);
    return rc;
}

static int parse_header(dsv4_st_file *f)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->map[i];
    if (n > f->size - 8)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: header length %llu is past the end of the file (%zu bytes)", f->path,
                          (unsigned long long)n, f->size);
    f->data = f->map + 8 + n;
    f->data_size = f->size - 8 - (size_t)n;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return dsv4_error(DSV4_ERR_FORMAT, "%s: header is not valid JSON (%s, at byte %d)", f->path, jerr.text,
                          jerr.position);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = dsv4_error(DSV4_ERR_FORMAT, "%s: header is JSON but not an object", f->path);
        goto done;
    }
    size_t cap = json_object_size(root);
    f->entries = calloc(cap ? cap : 1, sizeof *f->entries);
    if (!f->entries) {
        rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory for %zu header entries", f->path, cap);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__")) continue;
        dsv4_st_entry *e = &f->entries[f->n];
        rc = parse_entry(f, key, val, e);
        if (rc) goto done;
        e->name = strdup(key);
        if (!e->name) {
            rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", f->path);
            goto done;
        }
        f->n++;
    }
    rc = check_overlaps(f);
done:
    json_decref(root);
    return rc;
}

int dsv4_st_parse(const void *buf, size_t size, const char *origin, dsv4_st_file **out)
{
    *out = NULL;
    if (!origin) origin = "safetensors buffer";
    dsv4_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(origin))) {
        free(f);
        return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", origin);
    }
    f->map = buf;
    f->size = size;
    int rc = 0;
    if (size < 8 || !buf)
        rc = dsv4_error(DSV4_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length", origin,
                        size);
    if (!rc) rc = parse_header(f);
    if (rc) {
        dsv4_st_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int dsv4_st_open(const char *path, dsv4_st_file **out)
{
    *out = NULL;
    dsv4_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
    }
    int rc = map_file(f);
    if (!rc) rc = parse_header(f);
    if (rc) {
        dsv4_st_free(f);
        return rc;
    }
    *out = f;
    return 0;
}
