/* dsv4_dump.h - HDF5 dumps of schema dsv4-dump/1 (docs/dump-format.md): writer, reader, probes.
 *
 * Writer: datasets are chunked, gzip+shuffle; the file is written as "<path>.tmp.<pid>" and renamed to
 * <path> only by dsv4_dump_writer_commit(), so a crash never leaves a half-written dump under its name.
 * Reader: never loads a whole dataset when a slice is asked for (hyperslab reads).
 * Probes: every path calls dsv4_probe*(); with a NULL sink they cost nothing.
 */
#ifndef DSV4_DUMP_H
#define DSV4_DUMP_H

#include "dsv4.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_DUMP_SCHEMA "dsv4-dump/1"

/* Root attributes of a dump. Strings are borrowed for the call. */
typedef struct dsv4_dump_meta {
    const char *producer;       /* "dsv4 0.1 reference cpu fp32" */
    const char *config_json;    /* config.json verbatim */
    const char *weights_digest; /* lowercase hex SHA-256 */
    int prompt_len;             /* P */
    int n_decode;
    const char *mode;           /* "forced" | "greedy" */
} dsv4_dump_meta;

/* ------------------------------------------------------------------------------------------------ writer */
typedef struct dsv4_dump_writer dsv4_dump_writer;

/* Creates "<path>.tmp.<pid>", writes the root attributes, /tokens (n_tokens, may be updated later with
 * dsv4_dump_writer_set_tokens for greedy runs), /positions, and one /layers/<L> group per layer with its
 * `attention`/`mlp` attributes from cfg. */
int dsv4_dump_writer_open(const char *path, const dsv4_dump_meta *meta, const dsv4_config *cfg,
                          const int32_t *tokens /* [n_tokens] */, int n_tokens,
                          const int32_t *positions /* [n_positions] ascending */, int n_positions,
                          dsv4_dump_writer **out);
/* Replace /tokens (greedy runs learn their tokens as they go). */
int dsv4_dump_writer_set_tokens(dsv4_dump_writer *w, const int32_t *tokens, int n_tokens);
/* Write row `row` of the per-position dataset `name` (e.g. "layers/3/attn_out", "final/logits").
 * The dataset [n_positions, row_shape...] is created on the first write; later writes must give the same
 * dtype and row shape. dtype is DSV4_DTYPE_F32 or DSV4_DTYPE_I32. */
int dsv4_dump_writer_row(dsv4_dump_writer *w, const char *name, int row, dsv4_dtype dtype, int row_ndim,
                         const int64_t *row_shape, const void *data);
/* Write a whole dataset at once (per-entry probes such as "layers/2/compressed_kv" [N, head_dim]). */
int dsv4_dump_writer_array(dsv4_dump_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                           const int64_t *shape, const void *data);
/* Set a string attribute on the root (for extras such as "seed", "command"). */
int dsv4_dump_writer_attr(dsv4_dump_writer *w, const char *name, const char *value);
/* Close and rename into place. Frees w in every case. */
int dsv4_dump_writer_commit(dsv4_dump_writer *w);
/* Close and remove the temporary file. Frees w. NULL is a no-op. */
void dsv4_dump_writer_abort(dsv4_dump_writer *w);

/* ------------------------------------------------------------------------------------------------ reader */
typedef struct dsv4_dump dsv4_dump;

typedef struct dsv4_dataset_info {
    dsv4_dtype dtype; /* F32 (any stored float type) or I32 (any stored integer type), converted by HDF5 on
                         read; other stored classes are reported as an error */
    int ndim;
    int64_t shape[4];
} dsv4_dataset_info;

/* Opens and validates: schema attribute, required root attributes, /tokens and /positions. */
int dsv4_dump_open(const char *path, dsv4_dump **out);
void dsv4_dump_free(dsv4_dump *d);
const char *dsv4_dump_path(const dsv4_dump *d);
/* Root string attribute (owned by d) or NULL if absent. */
const char *dsv4_dump_attr(const dsv4_dump *d, const char *name);
int dsv4_dump_prompt_len(const dsv4_dump *d);
int dsv4_dump_n_decode(const dsv4_dump *d);
const int32_t *dsv4_dump_tokens(const dsv4_dump *d, int *n);    /* owned by d */
const int32_t *dsv4_dump_positions(const dsv4_dump *d, int *n); /* owned by d */
/* The config embedded in config_json (parsed once). */
int dsv4_dump_config(const dsv4_dump *d, const dsv4_config **out);
/* Every dataset path under /layers and /final, e.g. "layers/0/attn_out", sorted in model order
 * (layers ascending, then final). Owned by d. */
int dsv4_dump_dataset_count(const dsv4_dump *d);
const char *dsv4_dump_dataset_name(const dsv4_dump *d, int i);
int dsv4_dump_has(const dsv4_dump *d, const char *name);
/* For a probe name of dump-format.md, the first call checks dtype and shape against the config and
 * /positions: DSV4_ERR_SHAPE naming file, dataset, actual and expected shape (DSV4_ERR_CONFIG if
 * config_json cannot be parsed). Other names are not checked. */
int dsv4_dump_info(const dsv4_dump *d, const char *name, dsv4_dataset_info *info);
/* Read rows [row0, row0+nrows) of dataset `name` into dst (f32 or i32 as stored; dst holds
 * nrows * prod(shape[1:]) elements, and may be NULL when that is 0). Reads only that slab. */
int dsv4_dump_read_rows(const dsv4_dump *d, const char *name, int64_t row0, int64_t nrows, void *dst);

/* ------------------------------------------------------------------------------------------------ probes */
/* A probe sink: routes each path's probes to the writer, for the positions being dumped. */
typedef struct dsv4_probe_sink dsv4_probe_sink;

/* positions: which positions are stored (ascending); NULL = all of 0..n_tokens-1. The sink borrows w. */
int dsv4_probe_sink_init(dsv4_dump_writer *w, const dsv4_config *cfg, const int32_t *positions,
                         int n_positions, int n_tokens, dsv4_probe_sink **out);
void dsv4_probe_sink_free(dsv4_probe_sink *p);
/* Store only the probes named in `names` (comma separated, e.g. "topk_idx,router_ids"; NULL or "" = all):
 * the others are dropped silently. DSV4_ERR_USAGE naming an unknown probe. A dump of all positions but few probes
 * stays small, e.g. the selections that `dsv4 run --follow` needs of a long prompt. */
int dsv4_probe_sink_keep(dsv4_probe_sink *p, const char *names);
/* Non-zero if position `pos` is stored (so a path can skip computing costly probes). NULL sink: 0. */
int dsv4_probe_wants(const dsv4_probe_sink *p, int pos);

/* A per-position probe of dump-format.md. layer = -1 for /final probes. The row shape is known from the
 * name and the config (e.g. "attn_out" is [D], "attn_hc_comb" [4,4]); n must equal the row size, except
 * "indexer_scores" (n <= N, the entries known at that step; the sink pads to N = entries at the last stored
 * position with -inf) and "topk_idx" (n <= index_topk, padded with -1). Positions not stored are ignored;
 * NULL p is a no-op. */
int dsv4_probe(dsv4_probe_sink *p, int layer, const char *name, int pos, const float *buf, size_t n);
int dsv4_probe_i32(dsv4_probe_sink *p, int layer, const char *name, int pos, const int32_t *buf, size_t n);
/* A per-entry probe (compressed_kv, indexer_kv): the whole [n_rows, row_len] array, written once at end. */
int dsv4_probe_entries(dsv4_probe_sink *p, int layer, const char *name, const float *buf, int64_t n_rows,
                       int64_t row_len);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_DUMP_H */
