/* st_writer.h - a small safetensors fixture writer for tests: single files with deliberate corruptions, and
 * whole tiny model folders (config.json + tensors) in any of the three namings of model-spec §2.
 *
 * Files: dsv4_stw_new, dsv4_stw_add (raw bytes, copied), then dsv4_stw_write. The header is written as text
 * (not through a JSON library) so that a test can make it wrong: override an entry's dtype, shape or offsets
 * as raw text, add a raw duplicate entry, replace the whole header, lie about the header length, truncate.
 *
 * Models: dsv4_stw_make_model writes every tensor dsv4_config_expected_tensors lists for the config, with
 * deterministic values (dsv4_stw_value: multiples of 1/64 in [-1, 1), exact in bf16), in
 *   DSV4_STW_OFFICIAL_QUANT   official names; FP8 e4m3 linears with E8M0 128x128 block scales ("<base>.scale"),
 *                             FP4 e2m1 routed experts (I8, E8M0 scale per 32), BF16 norms/embeddings, F32 rest;
 *                             FP8/FP4 codes and scales are pseudo-random bytes (read them back from the file)
 *   DSV4_STW_OFFICIAL_F32     official names, all F32 (tid2eid I64)
 *   DSV4_STW_TRANSFORMERS_F32 transformers module names, fused experts gate_up_proj [E,2I,D] / down_proj [E,D,I]
 *   DSV4_STW_SAVE_F32         the save_pretrained layout (model.layers.L.<official>, attn.norm.weight, head.weight)
 * Every function returns 0 on success, -1 on failure (a message on stderr).
 */
#ifndef DSV4_ST_WRITER_H
#define DSV4_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

typedef struct dsv4_stw dsv4_stw;

dsv4_stw *dsv4_stw_new(void);
void dsv4_stw_free(dsv4_stw *w); /* NULL: no-op */
/* Append a tensor; `dtype` is the safetensors name ("F32", "F8_E4M3", ...); data is copied (nbytes). */
int dsv4_stw_add(dsv4_stw *w, const char *name, const char *dtype, int ndim, const int64_t *shape, const void *data,
                 size_t nbytes);
int dsv4_stw_add_f32(dsv4_stw *w, const char *name, int ndim, const int64_t *shape, const float *data);

/* Corruptions of one entry's header text (the data stays as added). */
int dsv4_stw_set_dtype_text(dsv4_stw *w, const char *name, const char *dtype);     /* e.g. "F7" */
int dsv4_stw_set_shape_text(dsv4_stw *w, const char *name, const char *shape_json); /* e.g. "[-1, 4]" */
int dsv4_stw_set_offsets(dsv4_stw *w, const char *name, int64_t begin, int64_t end);
/* An extra raw header entry `"name": value_json` written after the others (duplicate keys possible). */
int dsv4_stw_add_raw_entry(dsv4_stw *w, const char *name, const char *value_json);

typedef struct dsv4_stw_corrupt {
    const char *header_text;  /* replaces the whole header JSON when non-NULL */
    int64_t header_len_delta; /* added to the 8-byte header length written */
    size_t truncate_bytes;    /* bytes cut off the end of the file */
} dsv4_stw_corrupt;
/* Write the file; `c` may be NULL (a valid file). */
int dsv4_stw_write(const dsv4_stw *w, const char *path, const dsv4_stw_corrupt *c);

/* ------------------------------------------------------------------------------------- tiny models */
typedef enum dsv4_stw_naming {
    DSV4_STW_OFFICIAL_QUANT,
    DSV4_STW_OFFICIAL_F32,
    DSV4_STW_TRANSFORMERS_F32,
    DSV4_STW_SAVE_F32,
} dsv4_stw_naming;

typedef struct dsv4_stw_model_opts {
    dsv4_stw_naming naming;
    const char *omit;     /* canonical name of a tensor to leave out, or NULL */
    const char *misshape; /* canonical name of a tensor written with its first dim + 1, or NULL */
    int shards;           /* <= 1: model.safetensors; N > 1: N shards + model.safetensors.index.json */
} dsv4_stw_model_opts;

/* Write DIR/config.json (config_json verbatim) and the tensors. */
int dsv4_stw_make_model(const char *dir, const char *config_json, const dsv4_stw_model_opts *o);
/* The value written for element i (row-major, logical shape) of canonical tensor `name` (float tensors
 * that are not FP8/FP4 in the quantised layout). */
float dsv4_stw_value(const char *name, size_t i);
/* The tid2eid entry written for token t, slot j: (7t + j) mod E (distinct over j while k <= E). */
int64_t dsv4_stw_tid2eid(int64_t t, int64_t j, int64_t n_experts);
/* A small valid config.json (4 layers: sliding, csa, hca, csa; hash layer 0; FP8 block quantisation
 * declared) in the transformers dialect; a static string. */
const char *dsv4_stw_tiny_config(void);

#endif
