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
  // Columns go in strips of up to 4 vectors. A strip of v vectors sums its rows in sum_rows_chains(v) interleaved
  // chains (chain i takes rows i, i + chains, ... in order), added pairwise ((c0 + c1) + (c2 + c3)), then added to the
  // old value when accumulating: the order depends on the shape alone.
  // (Also called by the CUDA column sums, which follow this order.)
  KILN_HOST_DEVICE static constexpr int sum_rows_chains(int vecs) { return vecs == 1 ? 4 : vecs == 2 ? 2 : 1; }
  // The number of chains in which sum_rows sums column `column` of a matrix `cols` wide: its strip's.
  template <class T>
  static int sum_rows_column_chains(index_t cols, index_t column) {
    constexpr index_t W = gemm_detail::simd<T>::width, strip_width = 4 * W;
    const index_t s0 = column / strip_width * strip_width;
    return sum_rows_chains(int((std::min(strip_width, cols - s0) + W - 1) / W));
  }
  template <class T>
  KILN_KERNEL static void sum_rows(const T* x, T* column_sums, index_t rows, index_t cols, bool accumulate) {
    constexpr int W = gemm_detail::simd<T>::width;
    for (index_t c0 = 0; c0 < cols; c0 += 4 * W) {
      const int strip = int(std::min<index_t>(4 * W, cols - c0));
      const int vecs = (strip + W - 1) / W;
      switch (sum_rows_chains(vecs)) {
        case 4: sum_rows_vectors<4>(vecs, x + c0, column_sums + c0, rows, cols, strip, accumulate); break;
        case 2: sum_rows_vectors<2>(vecs, x + c0, column_sums + c0, rows, cols, strip, accumulate); break;
        default: sum_rows_vectors<1>(vecs, x + c0, column_sums + c0, rows, cols, strip, accumulate); break;
      }
    }
  }
  // sum_rows's sums of columns [c0, c1) alone, each column summed in the chains of the strip that holds it in the
  // whole matrix, so that the sums are sum_rows's bits: for a caller that shares a matrix's columns out over threads
  // (fused_mlp.hpp). c0 must be a multiple of the vector width (16 is one on every target).
  template <class T>
  KILN_KERNEL static void sum_rows_part(const T* x, T* column_sums, index_t rows, index_t cols, index_t c0, index_t c1,
                            bool accumulate) {
    constexpr index_t W = gemm_detail::simd<T>::width, strip_width = 4 * W;
    for (index_t s0 = c0 / strip_width * strip_width; s0 < c1; s0 += strip_width) {
      const index_t begin = std::max(c0, s0), end = std::min(c1, s0 + strip_width);
      const int strip = int(end - begin), vecs = int((strip + W - 1) / W);
      switch (sum_rows_column_chains<T>(cols, s0)) {
        case 4: sum_rows_vectors<4>(vecs, x + begin, column_sums + begin, rows, cols, strip, accumulate); break;
        case 2: sum_rows_vectors<2>(vecs, x + begin, column_sums + begin, rows, cols, strip, accumulate); break;
        default: sum_rows_vectors<1>(vecs, x + begin, column_sums + begin, rows, cols, strip, accumulate); break;
      }
    }
  }
  template <class T>
  KILN_KERNEL static T sum(const T* x, index_t n) {
    sum_type<T> total = 0;
    for (index_t i = 0; i < n; ++i) total += x[i];
    return static_cast<T>(total);
  }
  template <class T>
  KILN_KERNEL static T sum_abs(const T* x, index_t n) {
    sum_type<T> total = 0;
    for (index_t i = 0; i < n; ++i) total += x[i] < T(0) ? -x[i] : x[i];
    return static_cast<T>(total);
  }
  template <class T>
  KILN_KERNEL static T sum_squares(const T* x, index_t n) {
    sum_type<T> total = 0;
    for (index_t i = 0; i < n; ++i) total += sum_type<T>(x[i]) * x[i];
    return static_cast<T>(total);
  }

 private:
  // sum_rows over `strip` columns (Vecs vectors, the last possibly partial) with the running sums in registers:
  // summed in memory, every add waited on the store of the one before. A narrow strip has too few vectors to hide the
  // add's latency and sums its rows in interleaved chains instead.
  // Chains is sum_rows_chains(Vecs) but where sum_rows_part sums part of a strip: then the whole strip's.
  template <int Vecs, int Chains, class T>
  static void sum_rows_strip(const T* x, T* column_sums, index_t rows, index_t cols, int strip, bool accumulate) {
    using S = gemm_detail::simd<T>;
    using Reg = typename S::reg;
    constexpr int W = S::width, chains = Chains;
    const int last_lanes = strip - (Vecs - 1) * W;
    auto load_last = [last_lanes](const T* p) { return last_lanes == W ? S::load(p) : S::load_n(p, last_lanes); };
    Reg acc[chains][Vecs];
    for (int c = 0; c < chains; ++c)
      for (int v = 0; v < Vecs; ++v) acc[c][v] = S::zero();
    const auto add_row = [&](Reg(&sums)[Vecs], const T* row) {
      for (int v = 0; v < Vecs - 1; ++v) sums[v] = S::add(sums[v], S::load(row + v * W));
      sums[Vecs - 1] = S::add(sums[Vecs - 1], load_last(row + (Vecs - 1) * W));
    };
    index_t r = 0;
    for (; r + chains <= rows; r += chains)
      for (int c = 0; c < chains; ++c) add_row(acc[c], x + (r + c) * cols);
    for (int c = 0; c < chains && r < rows; ++r, ++c) add_row(acc[c], x + r * cols);  // the last rows % chains
    T* const last_sums = column_sums + (Vecs - 1) * W;
    for (int v = 0; v < Vecs; ++v) {
      Reg total = acc[0][v];
      if constexpr (chains == 2) total = S::add(acc[0][v], acc[1][v]);
      if constexpr (chains == 4) total = S::add(S::add(acc[0][v], acc[1][v]), S::add(acc[2][v], acc[3][v]));
      const bool last = v == Vecs - 1;
      if (accumulate) total = S::add(last ? load_last(last_sums) : S::load(column_sums + v * W), total);
      if (!last || last_lanes == W)
        S::store(column_sums + v * W, total);
      else
        S::store_n(last_sums, total, last_lanes);
    }
  }
  // sum_rows_strip with Chains chains over a strip of `vecs` vectors.
  template <int Chains, class T>
  static void sum_rows_vectors(int vecs, const T* x, T* column_sums, index_t rows, index_t cols, int strip,
                               bool accumulate) {
    switch (vecs) {
      case 1: sum_rows_strip<1, Chains>(x, column_sums, rows, cols, strip, accumulate); break;
      case 2: sum_rows_strip<2, Chains>(x, column_sums, rows, cols, strip, accumulate); break;
      case 3: sum_rows_strip<3, Chains>(x, column_sums, rows, cols, strip, accumulate); break;
      default: sum_rows_strip<4, Chains>(x, column_sums, rows, cols, strip, accumulate); break;
    }
  }
};

}  // namespace kiln::kernels::cpu
