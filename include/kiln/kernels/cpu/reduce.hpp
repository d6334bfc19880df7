// Reductions on the CPU. Every sum runs in a fixed order, so results never depend on the thread count.
#pragma once

#include <algorithm>

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/gemm_microkernel.hpp"

namespace kiln::kernels::cpu {

// Accumulator wide enough that a float sum of a few million terms keeps its digits.
template <class T>
using sum_type = std::conditional_t<(sizeof(T) < sizeof(double)), double, T>;

// The reduction kernels of the CPU policies.
struct reduce_kernels {
  // column_sums[c] (+)= sum over rows of x[r, c]: the bias gradient of a Dense layer.
  // Each column's sum runs over the rows in order, starting from its old value when accumulating.
  template <class T>
  static void sum_rows(const T* x, T* column_sums, index_t rows, index_t cols, bool accumulate) {
    constexpr int W = gemm_detail::simd<T>::width;
    for (index_t c0 = 0; c0 < cols; c0 += 4 * W) {
      const int strip = int(std::min<index_t>(4 * W, cols - c0));
      switch ((strip + W - 1) / W) {
        case 1: sum_rows_strip<1>(x + c0, column_sums + c0, rows, cols, strip, accumulate); break;
        case 2: sum_rows_strip<2>(x + c0, column_sums + c0, rows, cols, strip, accumulate); break;
        case 3: sum_rows_strip<3>(x + c0, column_sums + c0, rows, cols, strip, accumulate); break;
        default: sum_rows_strip<4>(x + c0, column_sums + c0, rows, cols, strip, accumulate); break;
      }
    }
  }
  template <class T>
  static T sum(const T* x, index_t n) {
    sum_type<T> total = 0;
    for (index_t i = 0; i < n; ++i) total += x[i];
    return static_cast<T>(total);
  }
  template <class T>
  static T sum_abs(const T* x, index_t n) {
    sum_type<T> total = 0;
    for (index_t i = 0; i < n; ++i) total += x[i] < T(0) ? -x[i] : x[i];
    return static_cast<T>(total);
  }
  template <class T>
  static T sum_squares(const T* x, index_t n) {
    sum_type<T> total = 0;
    for (index_t i = 0; i < n; ++i) total += sum_type<T>(x[i]) * x[i];
    return static_cast<T>(total);
  }

 private:
  // sum_rows over `strip` columns (Vecs vectors, the last possibly partial) with the running sums in registers:
  // summed in memory, every add waited on the store of the one before (a Dense layer's 10-wide bias gradient over
  // 1000 rows took 8 us of a 100 us training step).
  template <int Vecs, class T>
  static void sum_rows_strip(const T* x, T* column_sums, index_t rows, index_t cols, int strip, bool accumulate) {
    using S = gemm_detail::simd<T>;
    constexpr int W = S::width;
    const int last_lanes = strip - (Vecs - 1) * W;
    typename S::reg acc[Vecs];
    auto load_last = [last_lanes](const T* p) { return last_lanes == W ? S::load(p) : S::load_n(p, last_lanes); };
    T* const last_sums = column_sums + (Vecs - 1) * W;
    for (int v = 0; v < Vecs - 1; ++v) acc[v] = accumulate ? S::load(column_sums + v * W) : S::zero();
    acc[Vecs - 1] = accumulate ? load_last(last_sums) : S::zero();
    for (index_t r = 0; r < rows; ++r, x += cols) {
      for (int v = 0; v < Vecs - 1; ++v) acc[v] = S::add(acc[v], S::load(x + v * W));
      acc[Vecs - 1] = S::add(acc[Vecs - 1], load_last(x + (Vecs - 1) * W));
    }
    for (int v = 0; v < Vecs - 1; ++v) S::store(column_sums + v * W, acc[v]);
    if (last_lanes == W)
      S::store(last_sums, acc[Vecs - 1]);
    else
      S::store_n(last_sums, acc[Vecs - 1], last_lanes);
  }
};

}  // namespace kiln::kernels::cpu
