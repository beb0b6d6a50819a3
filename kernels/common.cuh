/* common.cuh - what every kernel family of kernels/ shares: error macros, bf16 helpers, and thin wrappers of
 * the sm_80+ instructions the fast kernels use (cp.async, ldmatrix, mma.sync m16n8k16 bf16). Nothing here is
 * sm_90a-only, so the same code builds for sm_90 (H100/H200) and sm_120 (RTX PRO 6000 Blackwell).
 *
 * Quiet traps:
 *  - DSV4_CUDA_CHECK / DSV4_LAUNCH_CHECK `return` a negative DSV4_ERR_CUDA from the enclosing function, so they
 *    only belong in host functions returning int (the house convention).
 *  - cp.async with src_bytes = 0 writes 16 zero bytes and reads nothing: the kernels use it for -1 holes so a
 *    skipped entry is an exact zero in shared memory (0 * NaN garbage would poison the mma).
 *  - mma fragments follow the PTX ISA layout for m16n8k16: lane = 4*g + t (g = lane/4, t = lane%4); A holds rows
 *    g and g+8, columns 2t,2t+1 (+8); C holds rows g, g+8 and columns 2t, 2t+1. A channel pair (2i, 2i+1) of an
 *    output row is therefore in ONE thread's registers, which is what makes the fused inverse RoPE cheap.
 */
#ifndef DSV4_KERNELS_COMMON_CUH
#define DSV4_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "dsv4/dsv4.h"

/* A CUDA runtime call; on failure records "call: error (file:line)" and returns DSV4_ERR_CUDA. */
#define DSV4_CUDA_CHECK(call)                                                                                    \
    do {                                                                                                         \
        cudaError_t dsv4_cuda_err_ = (call);                                                                     \
        if (dsv4_cuda_err_ != cudaSuccess)                                                                       \
            return dsv4_error(DSV4_ERR_CUDA, "%s: %s (%s:%d)", #call, cudaGetErrorString(dsv4_cuda_err_),       \
                              __FILE__, __LINE__);                                                               \
    } while (0)

/* After every kernel launch: a bad configuration shows up here, not at the next unrelated call. */
#define DSV4_LAUNCH_CHECK(kernel_name)                                                                           \
    do {                                                                                                         \
        cudaError_t dsv4_cuda_err_ = cudaGetLastError();                                                         \
        if (dsv4_cuda_err_ != cudaSuccess)                                                                       \
            return dsv4_error(DSV4_ERR_CUDA, "launch of %s: %s (%s:%d)", kernel_name,                           \
                              cudaGetErrorString(dsv4_cuda_err_), __FILE__, __LINE__);                           \
    } while (0)

/* ------------------------------------------------------------------------------------------------ bf16 */
static __device__ __forceinline__ float dsv4_bf16_lo(uint32_t packed)
{
    return __uint_as_float(packed << 16);
}
static __device__ __forceinline__ float dsv4_bf16_hi(uint32_t packed)
{
    return __uint_as_float(packed & 0xffff0000u);
}
/* Two floats to one 32-bit word of bf16 (round to nearest even), `lo` in the low half: the mma operand order. */
static __device__ __forceinline__ uint32_t dsv4_bf16_pack2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
static __device__ __forceinline__ float dsv4_bf16_round(float x)
{
    return __bfloat162float(__float2bfloat16_rn(x));
}

/* ------------------------------------------------------------------------------------------------ cp.async */
static __device__ __forceinline__ uint32_t dsv4_smem_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
/* 16 bytes global -> shared, bypassing L1; src_bytes = 0 zero-fills without reading. */
static __device__ __forceinline__ void dsv4_cp_async16(void *smem_dst, const void *gmem_src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dsv4_smem_addr(smem_dst)),
                 "l"(gmem_src), "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void dsv4_cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Wait until at most N committed groups are still in flight. */
template <int N> static __device__ __forceinline__ void dsv4_cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ------------------------------------------------------------------------------------------------ ldmatrix / mma */
/* Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. */
static __device__ __forceinline__ void dsv4_ldmatrix_x4(uint32_t r[4], const void *smem_row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(dsv4_smem_addr(smem_row)));
}
static __device__ __forceinline__ void dsv4_ldmatrix_x4_trans(uint32_t r[4], const void *smem_row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(dsv4_smem_addr(smem_row)));
}
/* D = A(16x16, row) * B(16x8, col) + D, bf16 inputs, fp32 accumulators. */
static __device__ __forceinline__ void dsv4_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ------------------------------------------------------------------------------------------------ host helpers */
static inline int dsv4_ceil_div(int64_t a, int64_t b)
{
    return (int)((a + b - 1) / b);
}
static inline int dsv4_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

#endif /* DSV4_KERNELS_COMMON_CUH */
