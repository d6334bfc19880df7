// Max pooling's 2 x 2, stride-2 windows on AVX-512, 16 windows of one output row at a time: the scalar loops of
// pooling.hpp spent about 40 cycles a window on four scalar loads, compares and stores, several times the cost of
// copying the whole input from memory. Each lane runs the scalar code's comparisons in its order, so the results are
// the same bits: the forward keeps the first of equal values and the last NaN (max_pool_prefers), the backward gives
// the gradient to the first pixel that matches (max_pool_matches) and +0 to the others.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kiln/core/config.hpp"

namespace kiln::kernels::cpu::pooling_simd {

#if defined(__AVX512F__)
namespace detail {
// The loads of `windows` (1 to 16) windows' pixels in one input row: 2 * windows floats, as two masked vectors.
struct row_masks {
  __mmask16 first, second, windows;
  explicit row_masks(index_t count) {
    const auto ones = [](index_t n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u); };
    first = ones(std::min<index_t>(2 * count, 16));
    second = ones(std::max<index_t>(2 * count - 16, 0));
    windows = ones(count);
  }
};
// Lanes 2i and 2i + 1 of the 32 pixels a, b: the windows' left and right columns.
inline void split_columns(const float* row, const row_masks& m, __m512& left, __m512& right) {
  const __m512 a = _mm512_maskz_loadu_ps(m.first, row), b = _mm512_maskz_loadu_ps(m.second, row + 16);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  left = _mm512_permutex2var_ps(a, even, b);
  right = _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
}
// The inverse of split_columns: left and right interleaved back into the row's two vectors, stored (or added to the
// row's values when accumulating).
template <bool Accumulate>
void merge_columns(float* row, const row_masks& m, __m512 left, __m512 right) {
  const __m512i low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
  __m512 a = _mm512_permutex2var_ps(left, low, right), b = _mm512_permutex2var_ps(left, high, right);
  if constexpr (Accumulate) {
    a = _mm512_add_ps(_mm512_maskz_loadu_ps(m.first, row), a);
    b = _mm512_add_ps(_mm512_maskz_loadu_ps(m.second, row + 16), b);
  }
  _mm512_mask_storeu_ps(row, m.first, a);
  _mm512_mask_storeu_ps(row + 16, m.second, b);
}
inline __mmask16 is_nan(__m512 v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
}  // namespace detail

// out[w] = the maximum of window w, whose pixels are top[2w], top[2w + 1], bottom[2w], bottom[2w + 1].
inline void max_pool_2x2_row_forward(const float* top, const float* bottom, float* out, index_t windows) {
  for (index_t w = 0; w < windows; w += 16) {
    const detail::row_masks m(std::min<index_t>(16, windows - w));
    __m512 pixels[4];
    detail::split_columns(top + 2 * w, m, pixels[0], pixels[1]);
    detail::split_columns(bottom + 2 * w, m, pixels[2], pixels[3]);
    __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (const __m512 v : pixels) {  // max_pool_prefers: v > best, or v is NaN
      const __mmask16 prefers = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | detail::is_nan(v);
      best = _mm512_mask_blend_ps(prefers, best, v);
    }
    _mm512_mask_storeu_ps(out + w, m.windows, best);
  }
}

// The gradient of each window (grad_row[w]) to the first of its pixels that matches its maximum (best_row[w]), +0 to
// the others; added to the pixels' values when accumulating. Not accumulating, the gradient is written as 0 + g, as
// the generic path adds it to a zeroed pixel.
template <bool Accumulate>
void max_pool_2x2_row_backward(const float* top, const float* bottom, const float* best_row, const float* grad_row,
                               float* dtop, float* dbottom, index_t windows) {
  for (index_t w = 0; w < windows; w += 16) {
    const detail::row_masks m(std::min<index_t>(16, windows - w));
    __m512 pixels[4];
    detail::split_columns(top + 2 * w, m, pixels[0], pixels[1]);
    detail::split_columns(bottom + 2 * w, m, pixels[2], pixels[3]);
    const __m512 best = _mm512_maskz_loadu_ps(m.windows, best_row + w);
    __m512 grad = _mm512_maskz_loadu_ps(m.windows, grad_row + w);
    if constexpr (!Accumulate) grad = _mm512_add_ps(_mm512_setzero_ps(), grad);
    const __mmask16 best_is_nan = detail::is_nan(best);
    __mmask16 taken = 0;
    __m512 shares[4];
    for (int i = 0; i < 4; ++i) {  // max_pool_matches: v == best, or both NaN; the first match only
      const __mmask16 matches =
          _mm512_cmp_ps_mask(pixels[i], best, _CMP_EQ_OQ) | (detail::is_nan(pixels[i]) & best_is_nan);
      const __mmask16 mine = static_cast<__mmask16>(matches & ~taken);
      taken = static_cast<__mmask16>(taken | mine);
      shares[i] = _mm512_maskz_mov_ps(mine, grad);
    }
    detail::merge_columns<Accumulate>(dtop + 2 * w, m, shares[0], shares[1]);
    detail::merge_columns<Accumulate>(dbottom + 2 * w, m, shares[2], shares[3]);
  }
}
#endif

}  // namespace kiln::kernels::cpu::pooling_simd
