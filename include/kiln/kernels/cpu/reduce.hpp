// Reductions on the CPU. Every sum runs in a fixed order, so results never depend on the thread count.
#pragma once

#include "kiln/core/config.hpp"

namespace kiln::kernels::cpu {

// Accumulator wide enough that a float sum of a few million terms keeps its digits.
template <class T>
using sum_type = std::conditional_t<(sizeof(T) < sizeof(double)), double, T>;

// The reduction kernels of the CPU policies.
struct reduce_kernels {
  // column_sums[c] (+)= sum over rows of x[r, c]: the bias gradient of a Dense layer.
  template <class T>
  static void sum_rows(const T* x, T* column_sums, index_t rows, index_t cols, bool accumulate) {
    if (!accumulate)
      for (index_t c = 0; c < cols; ++c) column_sums[c] = T(0);
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c) column_sums[c] += x[r * cols + c];
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
};

}  // namespace kiln::kernels::cpu
