/* internal.h - what the files of model/ share and nothing outside model/ may include.
 *
 * model/ is split by concern: dtype.c (dtype table, scalar conversions, dequantisation kernels),
 * config.c (config.json -> dsv4_config), safetensors.c (one mmapped file, validated header),
 * naming.c (three on-disk namings -> canonical official names), model.c (the weight set),
 * expected.c (the tensor list a config implies, and the check against it), digest.c (weights_digest).
 */
#ifndef DSV4_MODEL_INTERNAL_H
#define DSV4_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4/dsv4.h"

/* ---------------------------------------------------------------------------------------- config.c */
/* Read a whole file into a malloc'd NUL-terminated buffer (*out, caller frees); *len may be NULL. */
int dsv4_file_read_text(const char *path, char **out, size_t *len);

/* ----------------------------------------------------------------------------------- safetensors.c */
typedef struct dsv4_st_entry {
    char *name;          /* name in the file (owned) */
    dsv4_dtype dtype;
    int ndim;
    int64_t shape[4];
    uint64_t begin, end; /* byte range relative to the data section */
} dsv4_st_entry;

/* One safetensors file, mmapped read-only, its header fully validated. */
typedef struct dsv4_st_file {
    char *path;             /* owned */
    const uint8_t *map;     /* whole file, or NULL for an empty mapping */
    size_t size;            /* file size in bytes */
    const uint8_t *data;    /* start of the data section (map + 8 + header length) */
    size_t data_size;       /* bytes after the header */
    dsv4_st_entry *entries; /* [n] owned */
    int n;
    int mapped;             /* 1: map is our mmap (unmapped by dsv4_st_free); 0: borrowed (dsv4_st_parse) */
} dsv4_st_file;

/* Open and validate `path`: header length, JSON (duplicate keys rejected), dtypes, dims, byte ranges,
 * overlaps. DSV4_ERR_IO if unreadable, DSV4_ERR_FORMAT with file and tensor named otherwise. */
int dsv4_st_open(const char *path, dsv4_st_file **out);
/* The same checks on a file already in memory: `buf` [size] is borrowed (must outlive *out), `origin` names it in
 * messages. For the fuzzers and for callers that hold the bytes already. */
int dsv4_st_parse(const void *buf, size_t size, const char *origin, dsv4_st_file **out);
void dsv4_st_free(dsv4_st_file *f);

/* ---------------------------------------------------------------------------------------- naming.c */
enum {
    DSV4_NAMING_OFFICIAL = 1u << 0,     /* layers.L.attn.wq_a.weight, embed.weight */
    DSV4_NAMING_TRANSFORMERS = 1u << 1, /* model.layers.L.self_attn.q_a_proj.weight, lm_head.weight */
    DSV4_NAMING_SAVE = 1u << 2,         /* model.layers.L.attn.wq_a.weight (save_pretrained layout) */
};
/* Which fused transformers expert tensor a disk name is. */
typedef enum dsv4_fused_kind { DSV4_FUSED_NONE, DSV4_FUSED_GATE_UP, DSV4_FUSED_DOWN } dsv4_fused_kind;

/* Map a disk name to its canonical official name in `out`. Sets *naming to one DSV4_NAMING_* bit (0 for
 * names that look like none of them; they are kept verbatim). For the fused transformers expert tensors
 * (model.layers.L.mlp.experts.gate_up_proj / down_proj) sets *fused and *layer and writes nothing useful
 * to `out`: the caller makes the per-expert views. Returns 0, or DSV4_ERR_FORMAT if `out` is too small. */
int dsv4_naming_canonical(const char *disk, char *out, size_t cap, unsigned *naming, dsv4_fused_kind *fused,
                          int *layer);
/* "official", "transformers", "save_pretrained", or a '+'-joined mix, for a set of DSV4_NAMING_* bits. */
const char *dsv4_naming_describe(unsigned naming);

/* ----------------------------------------------------------------------------------------- dtype.c */
/* Dequantise a canonical tensor (with its scale, if any) into `numel` f32 values; numel must equal the
 * logical element count. Errors name the tensor. */
int dsv4_tensor_dequant_f32(const dsv4_tensor *t, float *dst, size_t numel);
/* Rows [row0, row0 + nrows) of a tensor of >= 2 dims (rows = the first dim) into dst [nrows, the rest], the same
 * values as the whole-tensor dequantisation. DSV4_ERR_SHAPE naming the tensor for a range outside it. */
int dsv4_tensor_dequant_rows_f32(const dsv4_tensor *t, int64_t row0, int64_t nrows, float *dst);
/* Logical (dequantised) shape: FP4-packed I8/U8 with a scale has twice the last dim. Returns ndim. */
int dsv4_tensor_logical_shape(const dsv4_tensor *t, int64_t shape[4]);
size_t dsv4_tensor_logical_numel(const dsv4_tensor *t);
/* dsv4_tensor_is_fp4 and dsv4_tensor_check_scale are public (dsv4.h). */

#endif
