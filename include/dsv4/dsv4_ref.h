/* dsv4_ref.h - the fp32 reference path (model-spec §4-§12), CPU (C + OpenBLAS) and GPU (CUDA + cuBLAS).
 *
 * One sequence. Prefill of the whole prompt at positions 0..n-1 in one call, then one-token decode steps
 * with the full decode state of model-spec §7.6/§12 (window ring, compressor states, compressed pools,
 * indexer key pool). The decode state grows with the live context, never with max_position_embeddings.
 * The reference borrows the model's weights read-only; it never reads files itself.
 */
#ifndef DSV4_REF_H
#define DSV4_REF_H

#include "dsv4.h"
#include "dsv4_dump.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_ref dsv4_ref;

/* max_tokens: the longest sequence this instance will see (prompt + decode); sizes the whole decode state
 * (window ring, max_tokens div r entries per compressed pool, scratch) once, so decode steps allocate nothing.
 * All weights are bound (and dequantised by the loader) here: a missing or mis-shaped tensor fails at init. */
int dsv4_ref_cpu_init(dsv4_model *m, int max_tokens, dsv4_ref **out);
/* GPU variant on the current CUDA device; DSV4_ERR_UNSUPPORTED in a build without CUDA, DSV4_ERR_CUDA
 * when no device is present. */
int dsv4_ref_gpu_init(dsv4_model *m, int max_tokens, dsv4_ref **out);
void dsv4_ref_free(dsv4_ref *r);

/* Prefill tokens [n] at positions 0..n-1 (only valid as the first call; 1 <= n <= max_tokens). Probes go to
 * `probe` (may be NULL) for the stored positions, logits of stored positions included. logits_last [vocab]
 * receives the logits of position n-1 (may be NULL). The prefill allocates its own scratch (freed on return). */
int dsv4_ref_prefill(dsv4_ref *r, const int32_t *tokens, int n, dsv4_probe_sink *probe, float *logits_last);
/* One decode step: feeds `token` at the next position (also valid as the first call: the prompt can be fed
 * token by token from position 0, which gives the same results as one prefill). logits [vocab] (may be NULL).
 * DSV4_ERR_USAGE past max_tokens or for a token outside the vocabulary. Allocates nothing. */
int dsv4_ref_decode(dsv4_ref *r, int32_t token, dsv4_probe_sink *probe, float *logits);
/* Positions consumed so far. */
int dsv4_ref_position(const dsv4_ref *r);
/* Write the per-entry probes (compressed_kv, indexer_kv of every compress layer) to the sink; called once
 * at the end of a run. */
int dsv4_ref_dump_entries(dsv4_ref *r, dsv4_probe_sink *probe);
/* "dsv4 0.1 reference cpu fp32" / "... gpu fp32" */
const char *dsv4_ref_producer(const dsv4_ref *r);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_REF_H */
