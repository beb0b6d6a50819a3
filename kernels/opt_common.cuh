/* opt_common.cuh - device helpers shared by the optimized path's own kernel families (mhc, compressor, moe,
 * elementwise, step): fixed-order block reductions, activation loads, and the FP8 e4m3 simulation of the KV nope
 * channels (model-spec §3 act_quant, block 64, ue8m0 scales).
 *
 * Quiet traps:
 *  - The reductions are a butterfly inside each warp and then warp 0 over the warp sums: the order depends only on
 *    blockDim, so results are bitwise identical run to run (no atomics).
 *  - dsv4_block_sum ends with a __syncthreads: every thread of the block must call it (no early returns before).
 *  - ue8m0 scale s = 2^ceil(log2(amax/448)) with amax floored at 1e-4; q = e4m3(clamp(x/s, ±448)) round to
 *    nearest even; the stored value is q·s, which a bf16 holds exactly (3 mantissa bits, exponent in range).
 */
#ifndef DSV4_KERNELS_OPT_COMMON_CUH
#define DSV4_KERNELS_OPT_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "common.cuh"

/* A device-side range check of the prefill bookkeeping (row, slot and source indices): on failure it names the
 * kernel and the values and traps, so the step fails with a CUDA error at its next synchronisation instead of
 * reading another sequence's cache. Costs a compare where it stands. */
#define DSV4_DEV_CHECK(cond, fmt, ...)                                                                           \
    do {                                                                                                         \
        if (!(cond)) {                                                                                           \
            printf("dsv4 device check failed in %s: %s: " fmt "\n", __func__, #cond, __VA_ARGS__);              \
            __trap();                                                                                            \
        }                                                                                                        \
    } while (0)

static __device__ __forceinline__ float dsv4_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float dsv4_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. */
static __device__ __forceinline__ float dsv4_block_sum(float v)
{
    __shared__ float part[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = dsv4_warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nw ? part[lane] : 0.0f;
        s = dsv4_warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

static __device__ __forceinline__ float dsv4_bf16_bits_to_f32(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}
static __device__ __forceinline__ uint16_t dsv4_f32_to_bf16_bits(float f)
{
    __nv_bfloat16 h = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t *>(&h);
}

/* x quantised to e4m3 with the ue8m0 scale of its block (amax = max |x| over the block) and dequantised; the code
 * and the scale's byte (2^(byte-127)) go to *code / *scale_byte when those are not NULL (the --kv fp8 cache). */
static __device__ __forceinline__ float dsv4_fp8_e4m3_sim(float x, float amax, uint8_t *code = nullptr,
                                                          uint8_t *scale_byte = nullptr)
{
    float a = fmaxf(amax, 1e-4f);
    float e = ceilf(log2f(a / 448.0f));
    float s = exp2f(e);
    float v = fminf(fmaxf(x / s, -448.0f), 448.0f);
    __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    if (code) *code = (uint8_t)q;
    if (scale_byte) *scale_byte = (uint8_t)((int)e + 127); /* e in [-22, 121] for amax in [1e-4, f32 max] */
    __half_raw hr = __nv_cvt_fp8_to_halfraw(q, __NV_E4M3);
    return __half2float(__half(hr)) * s;
}

/* In place on the first n_nope values of v [dim] in shared memory: FP8 simulation per block of 64 channels (the
 * last block may be partial). With codes / scales (global memory, may be NULL) the e4m3 code of channel i goes to
 * codes[i] and the scale byte of block b to scales[b] (kernels/kv_layout.h). Call with all threads; ends with a
 * __syncthreads. */
static __device__ __forceinline__ void dsv4_fp8_nope_sim_smem(float *v, int n_nope, uint8_t *codes = nullptr,
                                                              uint8_t *scales = nullptr)
{
    __shared__ float amax[64]; /* n_nope <= 4096 */
    const int nb = (n_nope + 63) / 64;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        float a = 0.0f;
        for (int i = b * 64; i < n_nope && i < b * 64 + 64; i++) a = fmaxf(a, fabsf(v[i]));
        amax[b] = a;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_nope; i += blockDim.x) {
        uint8_t q = 0, sb = 0;
        v[i] = dsv4_fp8_e4m3_sim(v[i], amax[i / 64], &q, &sb);
        if (codes) codes[i] = q;
        if (scales && i % 64 == 0) scales[i / 64] = sb;
    }
    __syncthreads();
}

/* cos/sin of pos·θ_i: the angle formed in fp32 like the reference, the functions in double. */
static __device__ __forceinline__ void dsv4_rope_cos_sin(float inv_freq, int64_t pos, float *c, float *s)
{
    float a = inv_freq * (float)pos;
    *c = (float)cos((double)a);
    *s = (float)sin((double)a);
}

/* The router score sqrt(softplus(z)) with torch's threshold (z > 20 -> z). One definition for the route and for
 * decision following (follow.cu), so both weight the same experts with the same bits. */
static __device__ __forceinline__ float dsv4_sqrtsoftplus(float z)
{
    float sp = z > 20.0f ? z : log1pf(expf(z));
    return sqrtf(sp);
}

#endif /* DSV4_KERNELS_OPT_COMMON_CUH */
