/* dump_internal.h - what the writer, reader and probe sink of dump/ share (not a public header).
 *
 * - The probe table: every probe name of dump-format.md with its dtype and row shape as a function of the
 *   config. The sink uses it to size rows, the reader to validate a dataset's shape, both to order names in
 *   model order. Quiet trap: indexer_scores rows are N = (last stored position + 1) div compress_ratio wide,
 *   which depends on the positions stored, not only on the config.
 * - HDF5 helpers: error stack capture (messages name file and dataset, HDF5 never prints to stderr),
 *   string attributes (fixed or variable length), and a name -> open dataset table.
 *
 * Only APIs present in HDF5 1.10 are used (no H5Oget_info*, no H5Literate callbacks whose info struct changed
 * in 1.12): group members are listed with H5Gget_info + H5Lget_name_by_idx.
 */
#ifndef DSV4_DUMP_INTERNAL_H
#define DSV4_DUMP_INTERNAL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"

/* ------------------------------------------------------------------------------------------- probe table */

/* What one dimension of a probe's row is, in config terms. */
typedef enum dsv4_probe_dim {
    DSV4_PROBE_DIM_HC,             /* hc_mult */
    DSV4_PROBE_DIM_D,              /* hidden_size */
    DSV4_PROBE_DIM_HEAD_DIM,       /* head_dim */
    DSV4_PROBE_DIM_INDEX_HEAD_DIM, /* index_head_dim */
    DSV4_PROBE_DIM_INDEX_TOPK,     /* index_topk */
    DSV4_PROBE_DIM_K_EXPERTS,      /* num_experts_per_tok */
    DSV4_PROBE_DIM_VOCAB,          /* vocab_size */
    DSV4_PROBE_DIM_N_ENTRIES,      /* (last stored position + 1) div compress_ratio[layer] */
    DSV4_PROBE_DIM_COUNT
} dsv4_probe_dim;

/* Which layers a probe exists on. */
enum {
    DSV4_PROBE_ON_SLIDING = 1 << DSV4_ATTN_SLIDING,
    DSV4_PROBE_ON_CSA = 1 << DSV4_ATTN_CSA,
    DSV4_PROBE_ON_HCA = 1 << DSV4_ATTN_HCA,
    DSV4_PROBE_ON_ALL = DSV4_PROBE_ON_SLIDING | DSV4_PROBE_ON_CSA | DSV4_PROBE_ON_HCA,
};

typedef struct dsv4_probe_def {
    const char *name;       /* dataset name inside its group, e.g. "attn_out" */
    int final;              /* 1: under /final, 0: under /layers/<L> */
    int per_entry;          /* 1: first dimension = compressed entries (written whole), 0: per position */
    dsv4_dtype dtype;       /* DSV4_DTYPE_F32 or DSV4_DTYPE_I32 */
    int row_ndim;           /* dims after the first */
    dsv4_probe_dim dims[2]; /* row dims */
    unsigned on;            /* DSV4_PROBE_ON_* mask of layer attention types (final probes: ALL) */
} dsv4_probe_def;

/* The probe named `name` (final = 1 for /final probes), or NULL if unknown. */
const dsv4_probe_def *dsv4_probe_def_find(int final, const char *name);
/* Rank of a probe in model order (its index in the table); unknown names rank after every known one. */
int dsv4_probe_def_rank(int final, const char *name);
/* Row shape of `def` on layer `layer` (ignored for final probes). last_pos = last stored position (for
 * indexer_scores). Returns 0, or DSV4_ERR_USAGE if the probe does not exist on that layer's attention type. */
int dsv4_probe_def_row_shape(const dsv4_probe_def *def, const dsv4_config *cfg, int layer, int64_t last_pos,
                             int64_t shape[2]);

/* ------------------------------------------------------------------------------------------------- HDF5 */

/* Replaces HDF5's automatic error printing (process-wide) by a silent handler that keeps the innermost
 * message of the last failed call for dsv4_h5_errmsg: HDF5 never prints to stderr. */
void dsv4_h5_quiet(void);
/* The innermost HDF5 message of the last failed call, copied into buf (then forgotten). */
const char *dsv4_h5_errmsg(char *buf, size_t size);
/* Writes a variable-length UTF-8 string attribute (what h5py writes) on obj. Returns 0 or negative HDF5. */
int dsv4_h5_write_str_attr(hid_t obj, const char *name, const char *value);
/* Reads a string attribute stored fixed- or variable-length. *out is malloc'd (caller frees).
 * Returns 0, DSV4_ERR_MISSING if absent, DSV4_ERR_FORMAT if not a string (messages name path/what). */
int dsv4_h5_read_str_attr(hid_t obj, const char *name, const char *path, char **out);
/* Reads an integer attribute of any stored integer type. Same returns. */
int dsv4_h5_read_int_attr(hid_t obj, const char *name, const char *path, int64_t *out);

/* A name -> open dataset table (open addressing). Owns the names and the handles. */
typedef struct dsv4_h5_dset {
    char *name;      /* "layers/3/attn_out" */
    hid_t id;        /* open dataset */
    dsv4_dtype dtype;
    int ndim;
    int64_t shape[4];
    int validated;   /* reader: shape checked against the config */
} dsv4_h5_dset;

typedef struct dsv4_h5_table {
    dsv4_h5_dset *slots; /* [cap], name == NULL: empty */
    size_t cap, count;
} dsv4_h5_table;

/* Entry for name or NULL. */
dsv4_h5_dset *dsv4_h5_table_get(dsv4_h5_table *t, const char *name);
/* Inserts name (copied) with id; the table owns id from then on (closed by _clear even on failure). */
int dsv4_h5_table_put(dsv4_h5_table *t, const char *name, hid_t id, dsv4_h5_dset **out);
/* Closes every dataset and frees the table's memory. Returns 0 or a negative value if a close failed. */
int dsv4_h5_table_clear(dsv4_h5_table *t);

/* ------------------------------------------------------------------------------------------------ writer */

/* The positions the writer stores (borrowed from w), for the probe sink. */
const int32_t *dsv4_dump_writer_positions(const dsv4_dump_writer *w, int *n);
const char *dsv4_dump_writer_path(const dsv4_dump_writer *w);

#endif /* DSV4_DUMP_INTERNAL_H */
