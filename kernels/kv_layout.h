/* kv_layout.h - the cache entry of `--kv fp8` (model-spec §3: FP8 e4m3 nope channels with one ue8m0 scale per 64,
 * bf16 rope channels), as the window ring and the compressed pools store it; plain C (host and device).
 *
 * One entry of head_dim d = n_nope + rope_dim channels (the rope channels are the trailing ones of the vector):
 *   bytes [0, 2·rope_dim)                          rope channels, bf16, in channel order
 *   bytes [2·rope_dim, 2·rope_dim + n_nope)        nope channels 0..n_nope-1, one e4m3 code each
 *   bytes [.., + ceil(n_nope / 64))                one ue8m0 scale (2^(b-127)) per 64 nope channels, the last
 *                                                  block partial when 64 does not divide n_nope
 *   padding to a multiple of 16 bytes (cp.async moves whole 16-byte chunks; the padding is never read as data).
 * Flash (d 512, rope 64): 128 + 448 + 7 -> 592 bytes, 58% of the 1,024 of a bf16 entry.
 * The rope part comes first so that it and the codes start 16- and 8-byte aligned (rope_dim % 8 == 0).
 *
 * A value is code · scale. Both factors are exact in bf16 (3 mantissa bits, a power of two), so an entry
 * expanded to bf16 holds exactly the values that the fp8 simulation of the bf16 cache held before this layout.
 */
#ifndef DSV4_KERNELS_KV_LAYOUT_H
#define DSV4_KERNELS_KV_LAYOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define DSV4_KV_FN static __host__ __device__ __forceinline__
#else
#define DSV4_KV_FN static inline
#endif

enum { DSV4_KV8_BLOCK = 64 }; /* nope channels per scale */

DSV4_KV_FN int dsv4_kv8_scales(int n_nope) { return (n_nope + DSV4_KV8_BLOCK - 1) / DSV4_KV8_BLOCK; }
/* Byte offsets inside an entry. */
DSV4_KV_FN int dsv4_kv8_codes_at(int rope_dim) { return 2 * rope_dim; }
DSV4_KV_FN int dsv4_kv8_scales_at(int head_dim, int rope_dim) { return 2 * rope_dim + (head_dim - rope_dim); }
/* Bytes per entry (a multiple of 16). */
DSV4_KV_FN int64_t dsv4_kv8_entry_bytes(int head_dim, int rope_dim)
{
    const int raw = dsv4_kv8_scales_at(head_dim, rope_dim) + dsv4_kv8_scales(head_dim - rope_dim);
    return (raw + 15) / 16 * 16;
}
/* The shapes the layout supports: 8 | rope_dim (aligned parts) and 8 | n_nope (8 codes per load). */
DSV4_KV_FN int dsv4_kv8_shape_ok(int head_dim, int rope_dim)
{
    return rope_dim >= 0 && rope_dim % 8 == 0 && head_dim > rope_dim && (head_dim - rope_dim) % 8 == 0;
}

#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_fp8.h>

/* The --kv fp8 entry's scale byte as a float: 2^(b-127) for b in 1..254, which is all a writer produces; 0 for b = 0
 * (the zero fill of a skipped slot, so that its decoded row is 0, never NaN). */
static __device__ __forceinline__ float dsv4_kv8_scale(uint8_t b) { return __uint_as_float((uint32_t)b << 23); }

/* Two e4m3 codes (low byte = the lower channel) times scale s: exact in f32 and in bf16. */
static __device__ __forceinline__ float2 dsv4_kv8_decode2(uint16_t two, float s)
{
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    float2 f = __half22float2(__half2(h));
    return make_float2(f.x * s, f.y * s);
}
#endif

#endif /* DSV4_KERNELS_KV_LAYOUT_H */
