// GEMM packing: copies a block of op(A) or op(B) into the contiguous, zero-padded micro-panel layout the micro-kernel
// streams with unit stride. The transposes of op() are resolved here, so the micro-kernel sees one layout whatever
// transpose_a / transpose_b are, and no full transposed copy of either matrix is ever made.
#pragma once

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <type_traits>

#include "kiln/core/config.hpp"

namespace kiln::kernels::cpu::gemm_detail {

#if defined(__AVX__)
// In-register transpose of an 8 x 8 float block (rows r[0..7] become columns): 24 shuffles for 64 elements instead
// of 64 scalar gathers, which is what makes packing the strided side of the matrices cheap.
KILN_ALWAYS_INLINE void transpose_8x8(__m256 (&r)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// The same for a 6 x 8 block (AVX2's micro-panel of 6 rows): dst[(p + q) * 6 + r] = src[r * src_stride + p + q].
// Rows 6 and 7 of the transpose repeat row 5 (always readable). Groups 0-6 are stored 8 wide, in order, so each
// store's two extra lanes land on the next group's first two, which the next store rewrites; the last group is
// stored as 4 + 2 values, so nothing beyond the 48 packed values is touched. (No masked store: vmaskmovps stores are
// microcoded on AMD's Zen and made this slower than the scalar gather it replaces.)
KILN_ALWAYS_INLINE void transpose_6x8_block(const float* src, index_t src_stride, float* dst) {
  __m256 t[8];
  for (int q = 0; q < 6; ++q) t[q] = _mm256_loadu_ps(src + q * src_stride);
  t[6] = t[5];
  t[7] = t[5];
  transpose_8x8(t);
  for (int q = 0; q < 7; ++q) _mm256_storeu_ps(dst + q * 6, t[q]);
  _mm_storeu_ps(dst + 42, _mm256_castps256_ps128(t[7]));
  _mm_storel_pi(reinterpret_cast<__m64*>(dst + 46), _mm256_extractf128_ps(t[7], 1));
}

// dst[(p + q) * dst_stride + r] = src[r * src_stride + p + q] for an 8 x 8 block: rows of src become 8-wide groups.
KILN_ALWAYS_INLINE void transpose_8x8_block(const float* src, index_t src_stride, float* dst, index_t dst_stride) {
  __m256 t[8];
  for (int q = 0; q < 8; ++q) t[q] = _mm256_loadu_ps(src + q * src_stride);
  transpose_8x8(t);
  for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + q * dst_stride, t[q]);
}
#endif

#if defined(__AVX512F__)
// Transposes a 16 x 16 matrix of 32-bit words held one row per register, in place: the AMX path's operand packing
// (gemm_amx.hpp) and the sparse-input products' transposes of W and x (dense_sparse_input.hpp).
// (Masked forms throughout: GCC 12 warns that the plain ones' undefined pass-through registers may be used
// uninitialised.)
KILN_ALWAYS_INLINE void transpose_16x16(__m512i (&r)[16]) {
  constexpr __mmask16 all16 = 0xFFFF;
  constexpr __mmask8 all8 = 0xFF;
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_maskz_unpacklo_epi32(all16, r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_maskz_unpackhi_epi32(all16, r[2 * i], r[2 * i + 1]);
  }
  // Within each 128-bit lane L, b[4g + c] now holds column 4L + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 4; ++g) {
    b[4 * g + 0] = _mm512_maskz_unpacklo_epi64(all8, a[4 * g], a[4 * g + 2]);
    b[4 * g + 1] = _mm512_maskz_unpackhi_epi64(all8, a[4 * g], a[4 * g + 2]);
    b[4 * g + 2] = _mm512_maskz_unpacklo_epi64(all8, a[4 * g + 1], a[4 * g + 3]);
    b[4 * g + 3] = _mm512_maskz_unpackhi_epi64(all8, a[4 * g + 1], a[4 * g + 3]);
  }
  // Row 4L + c of the transpose is lane L of b[c], b[4 + c], b[8 + c], b[12 + c]: a 4 x 4 transpose of lanes.
  for (int c = 0; c < 4; ++c) {
    const __m512i s0 = _mm512_maskz_shuffle_i32x4(all16, b[c], b[4 + c], 0x44);
    const __m512i s1 = _mm512_maskz_shuffle_i32x4(all16, b[c], b[4 + c], 0xEE);
    const __m512i s2 = _mm512_maskz_shuffle_i32x4(all16, b[8 + c], b[12 + c], 0x44);
    const __m512i s3 = _mm512_maskz_shuffle_i32x4(all16, b[8 + c], b[12 + c], 0xEE);
    r[c] = _mm512_maskz_shuffle_i32x4(all16, s0, s2, 0x88);
    r[4 + c] = _mm512_maskz_shuffle_i32x4(all16, s0, s2, 0xDD);
    r[8 + c] = _mm512_maskz_shuffle_i32x4(all16, s1, s3, 0x88);
    r[12 + c] = _mm512_maskz_shuffle_i32x4(all16, s1, s3, 0xDD);
  }
}
#endif

// to[c * rows + r] = from[r * ld + c] for a rows x cols block: a whole transposed copy, in 8 x 8 blocks in registers
// where the instruction set allows, scalar at the edges. Packing never needs one; the GEMM's direct path (op(B) of a
// small transposed B) and the convolution's transposed weight gradient do.
template <class T>
void transpose_into(const T* from, index_t ld, index_t rows, index_t cols, T* KILN_RESTRICT to) {
  index_t r_done = 0, c_done = 0;
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float>) {
    r_done = rows / 8 * 8;
    c_done = cols / 8 * 8;
    for (index_t r = 0; r < r_done; r += 8)
      for (index_t c = 0; c < c_done; c += 8) transpose_8x8_block(from + r * ld + c, ld, to + c * rows + r, rows);
  }
#endif
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = r < r_done ? c_done : 0; c < cols; ++c) to[c * rows + r] = from[r * ld + c];
}

// Copies `count` (< Panel) values and zero-fills the rest of a Panel-wide group.
template <class T, int Panel>
KILN_ALWAYS_INLINE void copy_padded(const T* src, index_t src_stride, int count, T* KILN_RESTRICT dst) {
  int r = 0;
  for (; r < count; ++r) dst[r] = src[r * src_stride];
  for (; r < Panel; ++r) dst[r] = T(0);
}

// copy_padded for unit stride: `count` (< Panel) contiguous values, then zeros. With AVX-512 (or AVX2), masked loads
// and stores (a masked-off element is never read, so nothing past src[count - 1] is touched). Written as a plain loop, GCC turns
// it into memcpy and memset calls, which for the few values of a narrow panel (N = 10 or 1 columns, per packed k) cost
// more than the copy.
template <class T, int Panel>
KILN_ALWAYS_INLINE void copy_padded_contiguous(const T* src, int count, T* KILN_RESTRICT dst) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    constexpr int lanes = 64 / int(sizeof(T));
    for (int g = 0; g < Panel; g += lanes) {
      const int valid = count - g < 0 ? 0 : (count - g > lanes ? lanes : count - g);
      const int width = Panel - g < lanes ? Panel - g : lanes;
      const unsigned load_mask = (1u << valid) - 1u, store_mask = (1u << width) - 1u;
      if constexpr (std::is_same_v<T, float>)
        _mm512_mask_storeu_ps(dst + g, __mmask16(store_mask), _mm512_maskz_loadu_ps(__mmask16(load_mask), src + g));
      else
        _mm512_mask_storeu_pd(dst + g, __mmask8(store_mask), _mm512_maskz_loadu_pd(__mmask8(load_mask), src + g));
    }
    return;
  }
#elif defined(__AVX2__)
  // The same with AVX2's masked loads (masked-off lanes read as zero) and plain stores of whole groups.
  if constexpr (std::is_same_v<T, float> && Panel % 8 == 0) {
    for (int g = 0; g < Panel; g += 8) {
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count - g), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      _mm256_storeu_ps(dst + g, _mm256_maskload_ps(src + g, mask));
    }
    return;
  }
#endif
  copy_padded<T, Panel>(src, 1, count, dst);
}

// Packs `rows` (1..MR) rows by kc columns of op(A), starting at `a` = &op(A)(i0, p0), into out[p * MR + r]; rows
// beyond `rows` are zero. transpose_a: A is stored k x m, op(A)(i, p) = a[p * lda + i]; else op(A)(i, p) = a[i * lda + p].
template <class T, int MR>
void pack_a(bool transpose_a, const T* a, index_t lda, int rows, index_t kc, T* KILN_RESTRICT out) {
  if (transpose_a) {  // each p is already a contiguous run of rows: a straight copy
    for (index_t p = 0; p < kc; ++p) {
      const T* src = a + p * lda;
      T* dst = out + p * MR;
      if (rows == MR) {
        for (int r = 0; r < MR; ++r) dst[r] = src[r];
      } else {
        copy_padded_contiguous<T, MR>(src, rows, dst);
      }
    }
    return;
  }
  index_t p = 0;
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float> && MR % 8 == 0) {
    if (rows == MR)
      for (; p + 8 <= kc; p += 8)
        for (int g = 0; g < MR; g += 8) transpose_8x8_block(a + g * lda + p, lda, out + p * MR + g, MR);
  }
  if constexpr (std::is_same_v<T, float> && MR == 6) {
    // Without it, packing the rows of a row-major A (every Dense forward) is a scalar gather per value, and every
    // thread of a column split repeats it.
    if (rows == MR)
      for (; p + 8 <= kc; p += 8) transpose_6x8_block(a + p, lda, out + p * MR);
  }
#endif
  for (; p < kc; ++p) copy_padded<T, MR>(a + p, lda, rows, out + p * MR);
}

// Packs kc rows by `cols` (1..NR) columns of op(B), starting at `b` = &op(B)(p0, j0), into out[p * NR + j]; columns
// beyond `cols` are zero. transpose_b: B is stored n x k, op(B)(p, j) = b[j * ldb + p]; else op(B)(p, j) = b[p * ldb + j].
template <class T, int NR>
void pack_b(bool transpose_b, const T* b, index_t ldb, int cols, index_t kc, T* KILN_RESTRICT out) {
  if (!transpose_b) {  // each p is a contiguous run of columns: a straight copy
    for (index_t p = 0; p < kc; ++p) {
      const T* src = b + p * ldb;
      T* dst = out + p * NR;
      if (cols == NR) {
        for (int j = 0; j < NR; ++j) dst[j] = src[j];
      } else {
        copy_padded_contiguous<T, NR>(src, cols, dst);
      }
    }
    return;
  }
  index_t p = 0;
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float> && NR % 8 == 0) {
    // Whole groups of 8 columns by in-register transposes, also in a partial panel (a Dense layer's weight with 10
    // outputs: 8 columns transposed, 2 gathered), whose padding is written once per 8 steps of k as zeros.
    const int groups = cols / 8 * 8;
    if (groups > 0)
      for (; p + 8 <= kc; p += 8) {
        for (int g = 0; g < groups; g += 8) transpose_8x8_block(b + g * ldb + p, ldb, out + p * NR + g, NR);
        for (int q = 0; q < 8 && groups < NR; ++q) {
          T* dst = out + (p + q) * NR;
          for (int j = groups; j < NR; j += 8) _mm256_storeu_ps(dst + j, _mm256_setzero_ps());
          for (int j = groups; j < cols; ++j) dst[j] = b[j * ldb + p + q];
        }
      }
  }
#endif
  for (; p < kc; ++p) copy_padded<T, NR>(b + p, ldb, cols, out + p * NR);
}

}  // namespace kiln::kernels::cpu::gemm_detail
