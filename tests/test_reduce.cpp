// The CPU reductions: sum_rows (a Dense layer's bias gradient) against a plain loop that adds each column's rows in
// the documented order (interleaved chains for narrow strips), for widths around every vector boundary, bit for bit,
// overwriting and accumulating, touching nothing past the last column.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/kernels/cpu/gemm_microkernel.hpp"
#include "kiln/kernels/cpu/reduce.hpp"

using namespace kiln;
using kiln::kernels::cpu::reduce_kernels;

TEST_CASE_TEMPLATE("sum_rows adds each column's rows in its documented order, for every width", T, float, double) {
  constexpr index_t width = kernels::cpu::gemm_detail::simd<T>::width;
  random_generator rng(12);
  for (index_t cols : {1, 2, 3, 4, 5, 7, 8, 9, 10, 15, 16, 17, 31, 32, 33, 40, 64, 100}) {
    for (index_t rows : {1, 3, 1000}) {
      for (bool accumulate : {false, true}) {
        CAPTURE(cols);
        CAPTURE(rows);
        CAPTURE(accumulate);
        std::vector<T> x(std::size_t(rows * cols));
        for (auto& v : x) v = rng.template normal<T>();
        const index_t guard = 8;
        std::vector<T> sums(std::size_t(cols + guard), T(7));
        std::vector<T> expected(static_cast<std::size_t>(cols));
        for (index_t c = 0; c < cols; ++c) sums[std::size_t(c)] = rng.template normal<T>();
        for (index_t c = 0; c < cols; ++c) {
          // The strip of up to 4 vectors holding column c, and its chains of rows.
          const index_t strip_start = c / (4 * width) * (4 * width);
          const index_t strip_vecs = (std::min(4 * width, cols - strip_start) + width - 1) / width;
          const int chains = reduce_kernels::sum_rows_chains(int(strip_vecs));
          T chain[4] = {};
          for (index_t r = 0; r < rows; ++r) chain[r % chains] += x[std::size_t(r * cols + c)];
          T s = chains == 4 ? (chain[0] + chain[1]) + (chain[2] + chain[3]) : chains == 2 ? chain[0] + chain[1] : chain[0];
          expected[std::size_t(c)] = accumulate ? sums[std::size_t(c)] + s : s;
        }
        reduce_kernels::sum_rows(x.data(), sums.data(), rows, cols, accumulate);
        CHECK(std::memcmp(sums.data(), expected.data(), std::size_t(cols) * sizeof(T)) == 0);
        for (index_t g = 0; g < guard; ++g) CHECK(sums[std::size_t(cols + g)] == T(7));
      }
    }
  }
}
