/* flash_model.h - a Flash-width random model folder for the GPU-vs-CPU reference check (issue 5): D = 4096,
 * 64 heads × 512 (64 rope), q_lora 1024, 8 output groups × 1024, window 128, 64 indexer heads × 128 with
 * index_topk 512, 4 layers CSA/HCA/CSA/HCA (ratios 4/128; layer 0 hash-routed), 32 experts of 2048 (+1 shared,
 * 6 per token), vocab 8192. About 3.6 G parameters: 7.2 GB on disk (BF16 weights, F32 mHC/ape/sink/bias,
 * I64 tid2eid); write it under /tmp, never into the repository.
 *
 * Values are uniform random from a fixed seed with scales that keep every activation O(1): linears
 * ±sqrt(3/fan_in) (unit variance out for unit-variance in), norms 1 ± 0.2, mHC fn ±sqrt(3/(4·D)). The same seed
 * gives the same bytes on every machine (per-tensor xorshift seeded from the tensor name).
 */
#ifndef DSV4_FLASH_MODEL_H
#define DSV4_FLASH_MODEL_H

#include <stdint.h>

/* config.json of the model (a static string, transformers dialect). */
const char *dsv4_flash_model_config(void);
/* Write DIR/config.json and DIR/model.safetensors (DIR must exist). Returns 0, or -1 with a message on stderr. */
int dsv4_flash_model_write(const char *dir, uint64_t seed);

#endif
