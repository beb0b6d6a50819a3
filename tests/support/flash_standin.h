/* flash_standin.h - a stand-in of the official DeepSeek-V4-Flash checkpoint at full size that costs no disk: the
 * released config.json (model-spec §1.1, num_hidden_layers cut when asked), model.safetensors.index.json and shards
 * named model-000NN-of-000MM.safetensors holding every tensor of model-spec §2 under its official name, dtype and
 * shape (FP8 e4m3 linears with F8_E8M0 128x128 block scales, FP4 e2m1 routed experts as I8 with F8_E8M0 scales
 * per 32 columns, BF16 norms / embeddings / compressor and gate weights, F32 mHC / sinks / ape / router bias, I64
 * tid2eid; the MTP block mtp.0.* when asked). Each shard is its header followed by a hole (ftruncate): the data reads
 * as zeros and occupies no blocks, so the 43-layer stand-in (about 150 GB) is written in a second.
 *
 * What it is for: memory and plumbing at the real size (the plan, the lazy weights, the digest, progress), not
 * numerics. Zero weights route every learned token to experts 0..5 (equal scores, lowest ids first) and every hash
 * token to expert 0 (tid2eid all 0). The shard boundaries are this writer's (tensors in model order, cut at equal
 * byte counts), not those of the released checkpoint.
 */
#ifndef DSV4_FLASH_STANDIN_H
#define DSV4_FLASH_STANDIN_H

typedef struct dsv4_standin_opts {
    int n_layers; /* 1..43: config num_hidden_layers and the layers written */
    int n_shards; /* >= 1 */
    int mtp;      /* 1: the mtp.0.* block too (the released checkpoint has it; the loader ignores it) */
} dsv4_standin_opts;

/* Write DIR/config.json, DIR/model.safetensors.index.json and the shards (DIR must exist). *total_bytes (may be
 * NULL) receives the shards' size. Returns 0, or -1 with a message on stderr. */
int dsv4_flash_standin_write(const char *dir, const dsv4_standin_opts *o, double *total_bytes);

#endif
