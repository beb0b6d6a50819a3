/* synth_dump.h - synthetic dsv4-dump/1 pairs for the verifier tests, written with the dump writer.
 *
 * synth_write(path, spec, 0) writes a "golden": every probe of dump-format.md for a small model whose
 * layers are sliding, then CSA (ratio 4) and HCA (ratio 8) alternating, values drawn from a fixed seed per
 * (dataset, row) so the golden and the candidate of one spec agree exactly wherever no perturbation is asked
 * for. synth_write(path, spec, 1) writes the candidate: the same values with the spec's perturbations
 * (noise from a layer on, tied or clearly lower top-k swaps, a NaN, a missing dataset, parted tokens).
 * indexer_scores are distinct random scores (-inf for entries not yet visible) and topk_idx is their exact
 * top-k, so the golden is a consistent selection.
 */
#ifndef DSV4_SYNTH_DUMP_H
#define DSV4_SYNTH_DUMP_H

#include <stdint.h>

typedef struct synth_spec {
    int n_layers; /* layer 0 sliding, then csa, hca, csa, ... */
    int hidden;   /* D */
    int head_dim, index_head_dim, index_topk;
    int n_experts, k_experts, vocab;
    int prompt_len, n_decode;
    const int32_t *positions; /* stored positions, ascending; NULL = all */
    int n_positions;
    uint64_t seed;
    const char *digest;   /* weights_digest, NULL = a fixed one */
    const char *producer; /* NULL = "synth golden" / "synth candidate" */
    const char *mode;     /* NULL = "forced" */
    /* candidate only ------------------------------------------------------------------------------------ */
    double noise;       /* relative rms noise on every float probe of layer >= noise_layer and final/ */
    int noise_layer;    /* -1 = none */
    int noise_position; /* ...at positions >= this (entries: closing at >= this) */
    double base_noise;  /* relative rms noise on every float probe everywhere (0 = exact copy) */
    int tie_layer, tie_position, tie_count; /* golden: tie_count*2 scores tied at the k-th rank there;
                                                 candidate: swaps tie_count picks for the tied non-picks */
    int low_layer, low_position, low_count; /* candidate: swaps low_count picks for the lowest-scored entries */
    const char *nan_dataset;                /* candidate: one NaN in this dataset ... */
    int nan_position;                       /* ... at this position (per-entry datasets: entry row) ... */
    int64_t nan_index;                      /* ... at this flat index of the row */
    const char *omit_dataset;               /* not written in this file (either role) */
    const char *omit_probes;                /* also not written: comma-separated fnmatch globs on dataset or probe
                                               names ("kv,attn_hc_*,final/norm"), in the same role */
    int omit_role;                          /* 0: omitted from the golden, 1: from the candidate */
    const int32_t *candidate_positions;     /* candidate only: the positions it stores (ascending; a partial
                                               candidate), NULL = the same as the golden's */
    int n_candidate_positions;
    int token_diff_position;                /* candidate: /tokens differ from here on (-1 none) */
} synth_spec;

/* A small default: 4 layers, D 64, 24-token prompt + 16 decode steps, index_topk 4, no perturbation. */
void synth_spec_init(synth_spec *s);
/* candidate: 0 = golden, 1 = candidate. Returns 0 or a negative DSV4_ERR_*. */
int synth_write(const char *path, const synth_spec *s, int candidate);
/* Replace a root string attribute of an existing file in place (HDF5 directly: e.g. a wrong schema). */
int synth_set_root_attr(const char *path, const char *name, const char *value);
/* Overwrite element [row, col] of the 2-D dataset `dataset` (float or int) of an existing file in place (HDF5
 * directly, converting the value to the dataset's type). */
int synth_set_element(const char *path, const char *dataset, int64_t row, int64_t col, double value);
/* Copy dataset src of an existing file to a new dataset dst of the same file (groups made as needed). */
int synth_copy_dataset(const char *path, const char *src, const char *dst);
/* Copy dump src to dst through the dump reader and writer, adding relative rms noise `rel` to every float
 * probe of layer `layer` only (final/ when layer == -1). Every other byte of probe data is kept. */
int synth_copy_perturbed(const char *src, const char *dst, int layer, double rel, uint64_t seed);
/* The same, and then every value of those probes times `scale`; layer SYNTH_ALL_LAYERS: every layer and final/. */
#define SYNTH_ALL_LAYERS (-2)
int synth_copy_transformed(const char *src, const char *dst, int layer, double rel, double scale, uint64_t seed);
/* The config.json text synth_write embeds for spec s (malloc'd). */
char *synth_config_json(const synth_spec *s);
/* The text report of r (dsv4_verify_write_text, not verbose) as a malloc'd string, also printed to stdout: a
 * forked Check case that fails right after shows what it read. NULL when it cannot be written. */
struct dsv4_verify_result;
char *synth_text_report(const struct dsv4_verify_result *r);

#endif
