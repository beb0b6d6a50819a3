/* dsv4.h - the model: errors, config, dtypes, the shared weight loader.
 *
 * Every path (reference CPU/GPU, optimized) reads weights ONLY through this loader. A model folder is
 * config.json + model.safetensors (or model.safetensors.index.json + shards), mmapped read-only.
 * Three on-disk namings are accepted (official checkpoint names, transformers module names, and the mixed
 * layout transformers' save_pretrained writes; model-spec §2); all are mapped to ONE canonical naming,
 * the official checkpoint names, e.g. "layers.3.attn.wq_a.weight", "layers.5.ffn.experts.7.w2.weight",
 * "embed.weight", "head.weight", "norm.weight", "hc_head_fn".
 *
 * Conventions (style.md): functions return 0 on success and a negative DSV4_ERR_* on failure; the message
 * (file, tensor, expected vs actual) goes to one error sink, read with dsv4_last_error(). _free(NULL) is a no-op.
 */
#ifndef DSV4_H
#define DSV4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_VERSION "0.1"

/* ---------------------------------------------------------------------------------------------------------
 * Errors: one sink, thread-local, last message wins.
 */
enum dsv4_err {
    DSV4_OK = 0,
    DSV4_ERR_IO = -1,          /* cannot open/read/write/rename a file */
    DSV4_ERR_FORMAT = -2,      /* a file is malformed (safetensors header, JSON, HDF5 schema) */
    DSV4_ERR_CONFIG = -3,      /* config.json missing a field, wrong type, inconsistent values */
    DSV4_ERR_MISSING = -4,     /* a tensor / dataset / attribute that must exist does not */
    DSV4_ERR_SHAPE = -5,       /* a tensor or dataset has the wrong shape or dtype */
    DSV4_ERR_NOMEM = -6,       /* allocation failed or would exceed a limit */
    DSV4_ERR_CUDA = -7,        /* a CUDA / cuBLAS / NCCL call failed */
    DSV4_ERR_USAGE = -8,       /* bad arguments from the caller or the command line */
    DSV4_ERR_UNSUPPORTED = -9, /* valid input this build or path cannot handle */
    DSV4_ERR_MISMATCH = -10,   /* inputs that cannot be compared (different weights, no common probes) */
};

/* Record an error; returns `code` so callers can `return dsv4_error(DSV4_ERR_IO, "%s: ...", path)`. */
int dsv4_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last recorded message ("" if none). Valid until the next dsv4_error on this thread. */
const char *dsv4_last_error(void);
/* Short name of a code, e.g. "format error". */
const char *dsv4_err_name(int code);

/* Invariant check for internal use: records the message and returns DSV4_ERR_USAGE from the caller. */
#define DSV4_CHECK(cond, ...)                                                                                    \
    do {                                                                                                         \
        if (!(cond)) return dsv4_error(DSV4_ERR_USAGE, __VA_ARGS__);                                             \
    } while (0)
/* Internal use: evaluate a call returning a dsv4 error code, and return that code from the caller if nonzero. */
#define DSV4_TRY(call)                                                                                           \
    do {                                                                                                         \
        int rc_ = (call);                                                                                        \
        if (rc_) return rc_;                                                                                     \
    } while (0)

/* ---------------------------------------------------------------------------------------------------------
 * dtypes as safetensors names them.
 */
typedef enum dsv4_dtype {
    DSV4_DTYPE_F32,
    DSV4_DTYPE_F16,
    DSV4_DTYPE_BF16,
    DSV4_DTYPE_F8_E4M3,
    DSV4_DTYPE_F8_E8M0, /* block scales: value = 2^(byte-127) */
    DSV4_DTYPE_I8,      /* on disk: FP4 e2m1 packed two per byte for routed experts */
    DSV4_DTYPE_U8,
    DSV4_DTYPE_I32,
    DSV4_DTYPE_I64,
    DSV4_DTYPE_F64,
    DSV4_DTYPE_COUNT
} dsv4_dtype;

const char *dsv4_dtype_name(dsv4_dtype t);     /* "F32", "BF16", "F8_E4M3", ... */
int dsv4_dtype_from_name(const char *name);    /* a dsv4_dtype, or -1 if unknown */
size_t dsv4_dtype_size(dsv4_dtype t);          /* bytes per element */

/* ---------------------------------------------------------------------------------------------------------
 * Config (model-spec §1). Plain value type: no pointers, copyable.
 */
#define DSV4_MAX_LAYERS 128
/* Caps on the config's counts and widths (dsv4_config_parse refuses a value past them with the key named): each
 * sizes a list or a tensor before any weight is read, e.g. `dsv4 inspect` lists 3 x n_routed_experts x layers
 * expert tensors. Flash is 256 experts, 64 heads, width 4096, vocabulary 129280, hc_mult 4. */
#define DSV4_MAX_EXPERTS 1024 /* n_routed_experts, n_shared_experts, num_experts_per_tok */
#define DSV4_MAX_HEADS 1024   /* num_attention_heads, index_n_heads, o_groups */
#define DSV4_MAX_WIDTH 65536  /* hidden_size, head_dim, q_lora_rank, o_lora_rank, index_head_dim, moe_intermediate_size */
#define DSV4_MAX_VOCAB 16777216 /* vocab_size (2^24) */
#define DSV4_MAX_HC_MULT 16   /* hc_mult (mHC streams) */

typedef enum dsv4_attn_type { DSV4_ATTN_SLIDING, DSV4_ATTN_CSA, DSV4_ATTN_HCA } dsv4_attn_type;
typedef enum dsv4_mlp_type { DSV4_MLP_HASH_MOE, DSV4_MLP_MOE } dsv4_mlp_type;

typedef struct dsv4_rope_params {
    double theta;                 /* base */
    int yarn;                     /* 1: YaRN ramp applied (compress table), 0: plain */
    double factor;                /* YaRN s */
    int64_t original_max_position_embeddings; /* YaRN L0 */
    double beta_fast, beta_slow;
} dsv4_rope_params;

typedef struct dsv4_config {
    int vocab_size;
    int hidden_size;            /* D */
    int num_hidden_layers;
    int num_attention_heads;    /* H */
    int num_key_value_heads;    /* must be 1 */
    int head_dim;               /* d */
    int qk_rope_head_dim;       /* trailing RoPE channels of every head (main and indexer) */
    int q_lora_rank;
    int o_groups;
    int o_lora_rank;
    int sliding_window;         /* n_win, includes the current token */
    int index_n_heads;
    int index_head_dim;
    int index_topk;
    int n_routed_experts;
    int n_shared_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int num_hash_layers;
    int norm_topk_prob;
    double routed_scaling_factor;
    double swiglu_limit;
    int hc_mult;
    int hc_sinkhorn_iters;
    double hc_eps;
    double rms_norm_eps;
    int64_t max_position_embeddings;
    int tie_word_embeddings;
    int bos_token_id, eos_token_id;
    char scoring_func[32];      /* "sqrtsoftplus" */
    int compress_rate_csa;      /* default 4 */
    int compress_rate_hca;      /* default 128 */
    dsv4_rope_params rope_main;     /* sliding layers */
    dsv4_rope_params rope_compress; /* CSA/HCA layers */
    dsv4_attn_type attn_type[DSV4_MAX_LAYERS];
    dsv4_mlp_type mlp_type[DSV4_MAX_LAYERS];
    int compress_ratio[DSV4_MAX_LAYERS]; /* derived: 0 sliding, compress_rate_csa, compress_rate_hca */
    int fp8_block_quant;        /* quantization_config says fp8 e4m3 block weights */
    char expert_dtype[16];      /* "fp4", "fp8", "" */
} dsv4_config;

/* Parse a config.json file / string. Errors name the file and the key. */
int dsv4_config_load(const char *path, dsv4_config *cfg);
int dsv4_config_parse(const char *json_text, const char *origin /* for messages */, dsv4_config *cfg);
const char *dsv4_attn_type_name(dsv4_attn_type t); /* "sliding", "csa", "hca" (dump-format names) */
const char *dsv4_mlp_type_name(dsv4_mlp_type t);   /* "hash_moe", "moe" */

/* ---------------------------------------------------------------------------------------------------------
 * The weight loader.
 */
typedef struct dsv4_model dsv4_model; /* opaque: config, mmapped files, tensor index */

/* One tensor as it is on disk, under its canonical name. `data` points into the mmap (read-only).
 * For a fused transformers tensor (experts.gate_up_proj) the canonical per-expert tensor is a view:
 * data/nbytes/shape describe the slice. `scale` is the sibling block-scale tensor or NULL. */
typedef struct dsv4_tensor {
    const char *name;        /* canonical name */
    const char *disk_name;   /* name in the file */
    const char *file;        /* path of the file holding it */
    dsv4_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data;
    size_t nbytes;
    const struct dsv4_tensor *scale; /* F8_E8M0 or F32 block scales, or NULL */
} dsv4_tensor;

/* Open a model folder. Validates every header (offsets, sizes, dtypes) and the config; does not read
 * tensor data. Missing/mis-shaped tensors are NOT an error here (inspect reports them); paths fail when
 * they ask for a tensor that is missing. */
int dsv4_model_open(const char *dir, dsv4_model **out);
void dsv4_model_free(dsv4_model *m);
const dsv4_config *dsv4_model_config(const dsv4_model *m);
const char *dsv4_model_dir(const dsv4_model *m);
const char *dsv4_model_config_json(const dsv4_model *m); /* config.json verbatim */
/* The on-disk naming detected: "official", "transformers", "save_pretrained", or a '+'-joined mix. */
const char *dsv4_model_naming(const dsv4_model *m);

/* Lookup by canonical name; DSV4_ERR_MISSING (with the name and folder) if absent. */
int dsv4_model_tensor(const dsv4_model *m, const char *name, const dsv4_tensor **out);
int dsv4_model_tensor_count(const dsv4_model *m);
const dsv4_tensor *dsv4_model_tensor_at(const dsv4_model *m, int i);

/* The weight as f32, dequantised. Owned by the model (valid until dsv4_model_free), computed once and
 * cached; an aligned F32 tensor is returned straight from the mmap. `expect_numel` must match. */
int dsv4_model_f32(dsv4_model *m, const char *name, size_t expect_numel, const float **out);
/* Dequantise into a caller buffer of exactly `numel` elements, f32 or bf16 (uint16 bits, RNE). */
int dsv4_model_read_f32(const dsv4_model *m, const char *name, float *dst, size_t numel);
int dsv4_model_read_bf16(const dsv4_model *m, const char *name, uint16_t *dst, size_t numel);
/* Rows [row0, row0 + nrows) of a 2-D weight (e.g. one token's row of embed.weight) dequantised into dst
 * [nrows, columns]: the values dsv4_model_read_f32 gives for those rows. */
int dsv4_model_read_f32_rows(const dsv4_model *m, const char *name, int64_t row0, int64_t nrows, float *dst);
/* Elements of a tensor once dequantised to f32 (an FP4-packed tensor has two per byte). */
size_t dsv4_tensor_numel(const dsv4_tensor *t);
/* 1 when dsv4_model_f32 serves the tensor straight from the mmap (F32 data, 4-byte aligned): no copy, no private
 * memory; 0 when asking for it as f32 dequantises it into memory. */
int dsv4_tensor_f32_mapped(const dsv4_tensor *t);
/* 1 if the tensor is FP4 e2m1 packed two per byte (I8/U8 with a scale), 0 otherwise. */
int dsv4_tensor_is_fp4(const dsv4_tensor *t);
/* A quantised tensor's scale (FP8 e4m3: [ceil(rows/128), ceil(cols/128)]; FP4: [rows, ceil(cols/32)]; E8M0 or F32):
 * 0 if it fits or the tensor is not quantised, else DSV4_ERR_SHAPE (DSV4_ERR_MISSING for FP8 without one) naming
 * both. The GPU reference checks it before it copies a tensor's bytes and scales as they are. */
int dsv4_tensor_check_scale(const dsv4_tensor *t);
/* Integer tensors (tid2eid: I64 or I32 on disk) as int32. */
int dsv4_model_read_i32(const dsv4_model *m, const char *name, int32_t *dst, size_t numel);

/* SHA-256 of the weight bytes as dump-format.md defines weights_digest (lowercase hex, 65 bytes). */
int dsv4_model_weights_digest(const dsv4_model *m, char out[65]);
/* Progress of a long operation: `done` of `total` units (bytes for the digest), total fixed from the first call,
 * done ascending to total; called often (every few MiB), so it must be cheap. ctx is the caller's. */
typedef void (*dsv4_progress_fn)(void *ctx, double done, double total);
/* The same digest, calling progress (may be NULL) as the bytes are hashed: a full checkpoint takes minutes. */
int dsv4_model_weights_digest_progress(const dsv4_model *m, char out[65], dsv4_progress_fn progress, void *ctx);

/* The same digest through a cache (docs/reference.md "The weights digest and its cache"): for a checkpoint of at
 * least 1 GiB, the digest is kept in a text file keyed by the folder and, for every hashed file, its name, size,
 * modification and status-change times, device and inode, in $DSV4_DIGEST_CACHE (a folder), else
 * $XDG_CACHE_HOME/dsv4, else ~/.cache/dsv4. A hit returns it without reading the weights (*cached = 1; cached may be
 * NULL); a miss hashes as dsv4_model_weights_digest_progress does and stores it. DSV4_DIGEST_CACHE=off: no cache.
 * The trade-off: a file rewritten in place with the same size, mtime and ctime (a filesystem that keeps no ctime)
 * keeps its old digest until the cache is bypassed. A cache that cannot be read or written is skipped, never an
 * error. */
int dsv4_model_weights_digest_cached(const dsv4_model *m, char out[65], dsv4_progress_fn progress, void *ctx,
                                     int *cached);

/* The tensors the config says must exist, with their expected shapes. Used by inspect and the paths. */
typedef struct dsv4_expected_tensor {
    char name[96];
    int ndim;
    int64_t shape[4];  /* logical (dequantised) shape */
} dsv4_expected_tensor;
/* Fills *out with a malloc'd array (caller frees with free()). */
int dsv4_config_expected_tensors(const dsv4_config *cfg, dsv4_expected_tensor **out, int *n);

/* Problems of a model against its config (for `dsv4 inspect`): each line names the tensor and the
 * problem. Returns the number of problems (>= 0) or a negative error. Lines go to `report`. */
typedef void (*dsv4_report_fn)(void *ctx, const char *line);
int dsv4_model_check(const dsv4_model *m, dsv4_report_fn report, void *ctx);

/* ---------------------------------------------------------------------------------------------------------
 * Memory limits (model/memlimit.c). Call BEFORE a large allocation whose size comes from a config, a header or
 * the command line, so that it is refused with a message instead of an OOM kill or a segfault. Sizes are
 * doubles: sum them in double so a hostile config cannot wrap size_t first. `what` names the buffer or
 * tensor ("layers.3.attn.wkv.weight dequantised to f32"); it starts the message.
 */
/* 0 if `bytes` fits the host's available memory (MemAvailable, cgroup limit, less a margin) and
 * $DSV4_HOST_MEM_LIMIT (bytes, or K/M/G/T suffix) when set; else DSV4_ERR_NOMEM naming both sizes. */
int dsv4_mem_check_host(double bytes, const char *what);
/* The same against the current CUDA device (cudaMemGetInfo free, less a margin) and $DSV4_DEVICE_MEM_LIMIT.
 * GPU paths call it before cudaMalloc of weights, caches and scratch. Without CUDA: the environment limit only. */
int dsv4_mem_check_device(double bytes, const char *what);
/* Report a failed cudaMalloc: DSV4_ERR_CUDA, "<what>: cannot allocate <size> on the GPU (<free> free of <total>):
 * <why>" (why = cudaGetErrorString(err)). Returns the code, for `return dsv4_mem_device_alloc_failed(...)`. */
int dsv4_mem_device_alloc_failed(double bytes, const char *what, const char *why);
/* "1.5 GiB" into buf; returns buf. */
const char *dsv4_mem_format(double bytes, char *buf, size_t size);

/* ---------------------------------------------------------------------------------------------------------
 * Temporary files in progress (model/tempfile.c). A writer that builds "<path>.tmp.<pid>" and renames it into
 * place registers the temporary name BEFORE creating it and unregisters it AFTER the rename (or its unlink);
 * on SIGINT/SIGTERM/SIGHUP the handler unlinks every registered file, then the signal kills the process as it
 * would have. So an interrupted dump or report leaves nothing, neither under the final name nor the temporary.
 */
/* Returns a slot id (>= 0) for dsv4_tempfile_unregister, or a negative error (path too long, 64 in progress). */
int dsv4_tempfile_register(const char *path);
void dsv4_tempfile_unregister(int id); /* id < 0: no-op */
/* Unlinks every registered file (async-signal-safe; the handler's work, also usable at exit). */
void dsv4_tempfile_remove_all(void);
/* Installs the handler for SIGINT, SIGTERM and SIGHUP where their action is the default (the dsv4 command does,
 * first thing; a library user may). */
void dsv4_tempfile_install_signal_handlers(void);

/* ---------------------------------------------------------------------------------------------------------
 * RoPE frequency tables (model-spec §3), the same bits for every path.
 */
/* θ_i for i < rope_dim/2: plain base^(-2i/d), or YaRN blended with the ramp between floor/ceil of the correction
 * dims (no mscale), computed in fp32 as transformers does. */
void dsv4_rope_inv_freq(const dsv4_rope_params *rp, int rope_dim, float *inv_freq /* [rope_dim/2] */);
/* The YaRN correction range (lo, hi) of a table; (0, 0) for a plain table. */
void dsv4_rope_yarn_range(const dsv4_rope_params *rp, int rope_dim, int *lo, int *hi);

/* ---------------------------------------------------------------------------------------------------------
 * Scalar conversions (exact, shared by every path; model-spec §2/§3).
 */
float dsv4_bf16_to_f32(uint16_t b);
uint16_t dsv4_f32_to_bf16(float f); /* round to nearest even, NaN kept NaN */
float dsv4_f16_to_f32(uint16_t h);
float dsv4_e4m3_to_f32(uint8_t b);  /* F8_E4M3 (fn: no inf, 0x7f/0xff = NaN) */
float dsv4_e8m0_to_f32(uint8_t b);  /* 2^(b-127); 0xff = NaN */
float dsv4_e2m1_to_f32(uint8_t nibble); /* FP4 code 0..15 */

/* ---------------------------------------------------------------------------------------------------------
 * Quantisers (model/quant.c): a bf16/f32 model quantised at load into the checkpoint's formats (model-spec §2,
 * with §3's rounding: power-of-two scales 2^ceil(log2(amax/max_code))). Dequantising the output with
 * dsv4_e4m3_to_f32 / dsv4_e2m1_to_f32 times dsv4_e8m0_to_f32 gives the values the paths multiply.
 */
uint8_t dsv4_f32_to_e4m3(float f); /* round to nearest even, saturating at +-448; sign kept (-tiny -> 0x80) */
uint8_t dsv4_f32_to_e2m1(float f); /* nearest code, ties to the even code, saturating at +-6; 0 -> code 0 */
/* w [rows, cols] f32 -> q [rows, cols] e4m3 and scale [ceil(rows/128), ceil(cols/128)] e8m0: per 128x128 block
 * (edge blocks partial) s = 2^ceil(log2(max(amax, 1e-4) / 448)), q = e4m3(w / s). DSV4_ERR_FORMAT naming `what`
 * on a non-finite weight. */
int dsv4_quant_fp8_block(const float *w, int64_t rows, int64_t cols, uint8_t *q, uint8_t *scale, const char *what);
/* w [rows, cols] f32, cols even -> q [rows, cols/2] (two e2m1 codes per byte, LOW nibble = EVEN column) and
 * scale [rows, ceil(cols/32)] e8m0: per 32 columns of a row s = 2^ceil(log2(max(amax, 6*2^-126) / 6)),
 * q = e2m1(w / s). DSV4_ERR_FORMAT naming `what` on a non-finite weight. */
int dsv4_quant_fp4(const float *w, int64_t rows, int64_t cols, uint8_t *q, uint8_t *scale, const char *what);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_H */
