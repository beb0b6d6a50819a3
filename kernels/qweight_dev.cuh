/* qweight_dev.cuh - device helpers of the quantised-weight kernels (fp8_linear.cu, fp4_experts.cu): e4m3 / e2m1
 * codes to bf16 in registers, streaming 16-byte loads, and the k permutation that lets one thread's 16-byte weight
 * load feed several mma.sync steps.
 *
 * Quiet traps:
 *  - The k permutation: in m16n8k16 the thread with lane%4 = t holds, for A (weights) and for B (activations) alike,
 *    the k indices {2t, 2t+1, 2t+8, 2t+9} of each step. Any map from those logical k to physical columns is valid
 *    as long as A and B use the SAME map, because the dot product does not care about order. Here thread t owns a
 *    contiguous run of physical columns (16 for fp8, 32 for fp4); the helpers below give, per step, the weight
 *    registers and the matching activation registers of that run.
 *  - e4m3 -> bf16 by bit moves gives the value times 2^-120 (subnormal codes included, as bf16 subnormals); one
 *    exact bf16x2 multiply by 2^120 restores it. e2m1 likewise gives value times 2^-126 and the multiply by
 *    2^126·scale (an e8m0 power of two) restores and scales it exactly.
 */
#ifndef DSV4_KERNELS_QWEIGHT_DEV_CUH
#define DSV4_KERNELS_QWEIGHT_DEV_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"

/* 16 bytes of a weight stream: read once, so kept out of L1 (the activations live there). */
static __device__ __forceinline__ uint4 qw_ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __device__ __forceinline__ uint32_t qw_word(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

static __device__ __forceinline__ uint32_t qw_bf16x2_mul(uint32_t a, uint32_t b)
{
    __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a), y = *reinterpret_cast<__nv_bfloat162 *>(&b);
    __nv_bfloat162 r = __hmul2(x, y);
    return *reinterpret_cast<uint32_t *>(&r);
}

/* Four e4m3 bytes b0..b3 of a word -> bf16x2 (b0, b2) [hi = 0] and (b1, b3) [hi = 1], each times 2^-120. */
template <int HI> static __device__ __forceinline__ uint32_t qw_e4m3_pair_raw(uint32_t w)
{
    if (HI) return ((w >> 4) & 0x07F007F0u) | (w & 0x80008000u);
    return ((w << 4) & 0x07F007F0u) | ((w << 8) & 0x80008000u);
}
#define QW_BF16X2_2POW120 0x7B807B80u /* bf16 2^120 in both halves */

/* e2m1 pairs -> bf16x2 (code times 2^-126): dsv4_fp4_pair_repacked (fp4_layout.h), on the repacked layout. */

/* The bf16x2 multipliers that restore an e2m1 code times 2^-126 to code·2^(b-127): one multiply when b <= 128
 * (2^(b-1) is a finite bf16), else two (2^126, then 2^(b-127)); b = 255 (NaN scale) gives NaN. */
static __device__ __forceinline__ void qw_e8m0_mults(uint8_t b, uint32_t *m1, uint32_t *m2)
{
    if (b <= 128) {
        uint32_t h = (uint32_t)(b + 126) << 7;
        *m1 = h | (h << 16);
        *m2 = 0;
    } else {
        *m1 = 0x7E807E80u; /* 2^126 */
        uint32_t h = b == 255 ? 0x7FC0u : (uint32_t)b << 7;
        *m2 = h | (h << 16);
    }
}

/* The one multiplier of qw_e8m0_mults when b <= 128 (every scale up to 2): (2^(b-1), 2^(b-1)) as bf16x2. */
static __device__ __forceinline__ uint32_t qw_e8m0_mult1(uint8_t b)
{
    return (((uint32_t)b + 126u) << 7) * 0x10001u;
}

#endif /* DSV4_KERNELS_QWEIGHT_DEV_CUH */
