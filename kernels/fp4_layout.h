/* fp4_layout.h - the bit layout the FP4 expert kernel (fp4_experts.cu) reads its e2m1 codes in, and the repack
 * that produces it from the checkpoint's layout; plain C (host and device), so the CPU tests check it.
 *
 * The checkpoint packs two codes per byte (low nibble = even column): a 32-bit word (little endian) holds the codes
 * of 8 consecutive columns, nibble k = column k, bits 4k (mantissa), 4k+1..4k+2 (exponent), 4k+3 (sign). The kernel
 * turns pair J = columns (2J, 2J + 1) of a word into a bf16x2 of (code·2^-126) by putting the 3 magnitude bits at
 * bf16 bits 6..8 and the sign at bit 15 of each half (qweight_dev.cuh): target bits T = {6,7,8,15, 22,23,24,31}.
 * Pairing adjacent columns matches the activations' own bf16 pairs, so the mma's B fragment is a plain register
 * (no byte permute per step).
 *
 * The repacked layout moves every bit of a word so that
 *   pair 0 = w & T                                   (one LOP3)
 *   pair 1 = (w << 4) & T                            (an IMAD on the FMA pipe + one LOP3)
 *   pair 2 = rotl(w, 10) & T                         (one SHF + one LOP3)
 *   pair 3 = (w << 6) & M1 | rotl(w, 14) & M2        (IMAD + SHF + two LOP3; M1 = T \ {8, 24}, M2 = {8, 24})
 * - 7 ALU instructions per word, 9 in all (an exhaustive search over such layouts finds none cheaper on the ALU
 * pipe, the one the kernel saturates); from the checkpoint's layout a pair costs two shifts and two LOP3 (two
 * masks; a LOP3 takes one immediate), and columns (J, J + 4) was the cheap pairing there. The repack is a
 * permutation of the bits within each 32-bit word: lossless, the same bytes, every code in its word.
 */
#ifndef DSV4_KERNELS_FP4_LAYOUT_H
#define DSV4_KERNELS_FP4_LAYOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define DSV4_FP4_FN static __host__ __device__ __forceinline__
#else
#define DSV4_FP4_FN static inline
#endif

#define DSV4_FP4_T 0x81C081C0u  /* bf16x2 bits 6-8, 15 of each half */
#define DSV4_FP4_M2 0x01000100u /* bits 8 and 24: pair 3's part that comes by rotl 14 */
#define DSV4_FP4_M1 (DSV4_FP4_T & ~DSV4_FP4_M2)

DSV4_FP4_FN uint32_t dsv4_fp4_rotl(uint32_t w, int n)
{
#ifdef __CUDA_ARCH__
    return __funnelshift_l(w, w, n); /* one SHF */
#else
    return n ? (w << n) | (w >> (32 - n)) : w;
#endif
}

/* The bf16 bits of the code of column col of a checkpoint-layout word: magnitude at bits 6..8, sign at 15. */
DSV4_FP4_FN uint32_t dsv4_fp4_code_bits(uint32_t w, int col)
{
    const uint32_t code = (w >> 4 * col) & 0xFu;
    return ((code & 7u) << 6) | ((code >> 3) << 15);
}

/* Pair J of a checkpoint-layout word, by definition: columns 2J (low half) and 2J + 1 (high half). */
DSV4_FP4_FN uint32_t dsv4_fp4_pair_plain(uint32_t w, int J)
{
    return dsv4_fp4_code_bits(w, 2 * J) | dsv4_fp4_code_bits(w, 2 * J + 1) << 16;
}

/* Pair J of a repacked word. */
DSV4_FP4_FN uint32_t dsv4_fp4_pair_repacked(uint32_t w, int J)
{
    switch (J) {
    case 0: return w & DSV4_FP4_T;
    case 1: return (w << 4) & DSV4_FP4_T;
    case 2: return dsv4_fp4_rotl(w, 10) & DSV4_FP4_T;
    default: return ((w << 6) & DSV4_FP4_M1) | (dsv4_fp4_rotl(w, 14) & DSV4_FP4_M2);
    }
}

/* Where target bit t (in T) of pair J comes from: the rotation (left) the extraction applies. */
DSV4_FP4_FN int dsv4_fp4_rotation(int J, int t)
{
    return J == 0 ? 0 : J == 1 ? 4 : J == 2 ? 10 : (t == 8 || t == 24) ? 14 : 6;
}

/* The checkpoint-layout bit that lands on target bit t of pair J. */
DSV4_FP4_FN int dsv4_fp4_plain_bit(int J, int t)
{
    const int nib = t < 16 ? 2 * J : 2 * J + 1, in = t & 15; /* 6, 7, 8: magnitude bits 0..2; 15: the sign */
    return 4 * nib + (in == 15 ? 3 : in - 6);
}

/* Checkpoint layout -> repacked (dir 1), or back (dir 0). */
DSV4_FP4_FN uint32_t dsv4_fp4_permute_word(uint32_t w, int dir)
{
    uint32_t out = 0;
    for (int J = 0; J < 4; J++)
        for (int t = 0; t < 32; t++) {
            if (!((DSV4_FP4_T >> t) & 1)) continue;
            const int packed = (t - dsv4_fp4_rotation(J, t) + 32) & 31, plain = dsv4_fp4_plain_bit(J, t);
            const int from = dir ? plain : packed, to = dir ? packed : plain;
            out |= ((w >> from) & 1u) << to;
        }
    return out;
}
DSV4_FP4_FN uint32_t dsv4_fp4_repack_word(uint32_t w) { return dsv4_fp4_permute_word(w, 1); }
DSV4_FP4_FN uint32_t dsv4_fp4_unpack_word(uint32_t w) { return dsv4_fp4_permute_word(w, 0); }

#endif /* DSV4_KERNELS_FP4_LAYOUT_H */
