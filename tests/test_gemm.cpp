// The blocked CPU GEMM against a naive double-precision reference: all transpose cases, odd sizes, padded leading
// dimensions, alpha/beta, fused bias + activations, k = 0; plus bitwise determinism across thread counts and bitwise
// equality of the fused epilogue with the same steps done by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kiln/core/memory.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/gemm.hpp"

using namespace kiln;
using kiln::kernels::cpu::epilogue;
using kiln::kernels::cpu::gemm;

namespace {

// Deterministic values in [-1, 1).
template <class T>
std::vector<T> random_values(std::size_t count, std::uint64_t seed) {
  std::vector<T> v(count);
  std::uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = T(double(s >> 11) / double(1ull << 53) * 2.0 - 1.0);
  }
  return v;
}

// One GEMM problem with its operands stored with padded leading dimensions.
template <class T>
struct problem {
  bool ta, tb;
  index_t m, n, k, lda, ldb, ldc;
  std::vector<T> a, b, c, bias;

  problem(bool ta_, bool tb_, index_t m_, index_t n_, index_t k_, index_t pad, std::uint64_t seed)
      : ta(ta_), tb(tb_), m(m_), n(n_), k(k_) {
    lda = (ta ? m : k) + pad;
    ldb = (tb ? k : n) + pad;
    ldc = n + pad;
    a = random_values<T>(std::size_t((ta ? k : m) * lda) + 1, seed);
    b = random_values<T>(std::size_t((tb ? n : k) * ldb) + 1, seed + 1);
    c = random_values<T>(std::size_t(m * ldc) + 1, seed + 2);
    bias = random_values<T>(std::size_t(n), seed + 3);
  }
  double op_a(index_t i, index_t p) const { return ta ? a[std::size_t(p * lda + i)] : a[std::size_t(i * lda + p)]; }
  double op_b(index_t p, index_t j) const { return tb ? b[std::size_t(j * ldb + p)] : b[std::size_t(p * ldb + j)]; }

  std::vector<T> run(T alpha, T beta, const epilogue<T>& ep, const std::vector<T>& c0) const {
    std::vector<T> out = c0;
    gemm<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, out.data(), ldc, ep);
    return out;
  }

  // Checks `out` against the double-precision reference, element by element, with a tolerance scaled by the sum of
  // the magnitudes of the terms (the bound on float rounding error of a dot product), and checks the padding of C
  // was left untouched.
  void check(const std::vector<T>& out, const std::vector<T>& c0, T alpha, T beta, const epilogue<T>& ep) const {
    const double eps = std::numeric_limits<T>::epsilon();
    int failures = 0;
    for (index_t i = 0; i < m; ++i) {
      for (index_t j = 0; j < ldc; ++j) {
        const std::size_t at = std::size_t(i * ldc + j);
        if (j >= n) {  // padding
          if (!(out[at] == c0[at] || (std::isnan(out[at]) && std::isnan(c0[at])))) ++failures;
          continue;
        }
        double sum = 0, magnitude = 0;
        for (index_t p = 0; p < k; ++p) {
          sum += op_a(i, p) * op_b(p, j);
          magnitude += std::abs(op_a(i, p) * op_b(p, j));
        }
        double v = double(alpha) * sum;
        magnitude = std::abs(double(alpha)) * magnitude;
        if (beta != T(0)) {
          v += double(beta) * c0[at];
          magnitude += std::abs(double(beta) * c0[at]);
        }
        if (ep.bias) {
          v += ep.bias[j];
          magnitude += std::abs(double(ep.bias[j]));
        }
        const double expected = kernels::activate(ep.act, v, double(ep.slope));
        const double tolerance = 4 * eps * (double(k) + 4) * (magnitude + 1e-3);
        const double got = out[at];
        if (!(std::abs(got - expected) <= tolerance)) {
          if (failures < 5)
            MESSAGE("mismatch ta=" << ta << " tb=" << tb << " m=" << m << " n=" << n << " k=" << k << " at (" << i
                                   << "," << j << "): got " << got << " expected " << expected);
          ++failures;
        }
      }
    }
    CHECK(failures == 0);
  }
};

template <class T>
bool bitwise_equal(const std::vector<T>& x, const std::vector<T>& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(T)) != 0) return false;
  return true;
}

struct size3 {
  index_t m, n, k;
};

// Odd sizes around the register and cache blocks (mr = 8, nr = 32, kc = 512 for float on AVX-512), tiny direct-path
// sizes, the MLP's own shapes, and skinny ones whose A or B panels are read in place (one column panel: the seed
// regression's forward 1000 x 10 x 100; one or two row panels: its weight gradient 10 x 100 x 1000). Row counts of
// 9 to 12 and 20 (8 + 12) end in a tall in-place tile; column counts that leave a partial panel (100, 70, 45, 257)
// read it in place under a mask where the instruction set allows.
const size3 sizes[] = {{1, 1, 1},     {1, 8, 8},     {3, 17, 5},     {17, 31, 3},    {8, 32, 16},
                       {31, 65, 17},  {65, 33, 130}, {9, 257, 31},   {130, 17, 257}, {64, 128, 10},
                       {33, 49, 600}, {17, 40, 1100}, {257, 65, 65}, {1000, 10, 100}, {10, 100, 1000},
                       {12, 48, 300}, {200, 7, 60},   {5, 64, 700},  {11, 70, 40},   {20, 45, 90},
                       {1, 10, 1000}, {1000, 1, 10},  {1000, 10, 1},
                       // Narrow products (A stored m x k, B stored n x k, n below a vector's lanes, k >= 32) of every
                       // output-pair count, with tiles and leftover rows, and k in whole steps and not
                       // (gemm_narrow.hpp): a 10-class head, 1 to 4 pairs, 8 pairs with a step of one value.
                       {64, 10, 128}, {37, 3, 45},    {13, 15, 33},   {21, 1, 70},    {9, 2, 1100},
                       {50, 9, 40},   {30, 5, 64},    {26, 13, 257},
                       // Outer products (k = 1) in strips of two vectors and one, with leftover rows.
                       {130, 45, 1},  {301, 20, 1}};

template <class T>
void check_all_sizes() {
  std::uint64_t seed = 1;
  for (const auto& s : sizes) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      problem<T> pr(ta, tb, s.m, s.n, s.k, /*pad=*/index_t(t + 1) * 3, seed++);
      const epilogue<T> none{};
      pr.check(pr.run(T(1), T(0), none, pr.c), pr.c, T(1), T(0), none);
      pr.check(pr.run(T(-0.75), T(1.5), none, pr.c), pr.c, T(-0.75), T(1.5), none);
      pr.check(pr.run(T(2), T(1), none, pr.c), pr.c, T(2), T(1), none);
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("gemm matches a double reference for all transposes, odd sizes and padded strides", T, float,
                   double) {
  check_all_sizes<T>();
}

TEST_CASE_TEMPLATE("gemm with beta = 0 never reads C", T, float, double) {
  for (const auto& s : {size3{3, 5, 7}, size3{31, 65, 17}, size3{65, 130, 600}, size3{17, 40, 1100}}) {
    for (int t = 0; t < 4; ++t) {
      problem<T> pr(t & 1, t & 2, s.m, s.n, s.k, 2, 77 + std::uint64_t(t));
      std::vector<T> nan_c(pr.c.size(), std::numeric_limits<T>::quiet_NaN());
      const epilogue<T> none{};
      auto out = pr.run(T(1), T(0), none, nan_c);
      for (index_t i = 0; i < pr.m; ++i)
        for (index_t j = 0; j < pr.n; ++j) REQUIRE(!std::isnan(out[std::size_t(i * pr.ldc + j)]));
      pr.check(out, nan_c, T(1), T(0), none);
    }
  }
}

TEST_CASE_TEMPLATE("gemm fuses bias and every activation", T, float, double) {
  const activation acts[] = {activation::identity, activation::relu,    activation::leaky_relu,
                             activation::gelu,     activation::sigmoid, activation::tanh};
  std::uint64_t seed = 300;
  for (const auto& s : {size3{1, 8, 8}, size3{17, 31, 3}, size3{33, 70, 45}, size3{64, 130, 600}}) {
    for (int t = 0; t < 4; ++t) {
      problem<T> pr(t & 1, t & 2, s.m, s.n, s.k, 1, seed++);
      for (activation act : acts) {
        const epilogue<T> ep{pr.bias.data(), act, T(0.1)};
        pr.check(pr.run(T(1), T(0), ep, pr.c), pr.c, T(1), T(0), ep);
        pr.check(pr.run(T(0.5), T(-1), ep, pr.c), pr.c, T(0.5), T(-1), ep);
      }
    }
  }
}

TEST_CASE_TEMPLATE("gemm with k = 0 gives act(beta * C + bias); m or n = 0 is a no-op", T, float, double) {
  for (const auto& s : {size3{3, 5, 0}, size3{70, 300, 0}}) {
    problem<T> pr(false, true, s.m, s.n, s.k, 2, 5);
    const epilogue<T> ep{pr.bias.data(), activation::relu, T(0.01)};
    pr.check(pr.run(T(1), T(0.5), ep, pr.c), pr.c, T(1), T(0.5), ep);
    std::vector<T> nan_c(pr.c.size(), std::numeric_limits<T>::quiet_NaN());
    auto out = pr.run(T(1), T(0), ep, nan_c);
    for (index_t i = 0; i < pr.m; ++i)
      for (index_t j = 0; j < pr.n; ++j) CHECK(out[std::size_t(i * pr.ldc + j)] == std::max(pr.bias[j], T(0)));
  }
  T c = T(7);
  gemm<T>(false, false, 0, 1, 4, T(1), nullptr, 4, nullptr, 1, T(0), &c, 1);
  gemm<T>(false, false, 1, 0, 4, T(1), nullptr, 4, nullptr, 1, T(0), &c, 1);
  CHECK(c == T(7));
}

TEST_CASE_TEMPLATE("gemm is bitwise identical across thread counts and calls", T, float, double) {
  const int saved = num_threads();
  // {20, 100, 300}: B panels packed on one thread (4 row panels) and read in place on two (2 each).
  for (const auto& s : {size3{64, 128, 784}, size3{130, 257, 100}, size3{65, 784, 128}, size3{40, 300, 1100},
                        size3{1000, 10, 100}, size3{10, 100, 1000}, size3{20, 100, 300}, size3{44, 70, 600},
                        size3{1000, 1, 10},   size3{203, 7, 600},   size3{999, 13, 33}}) {
    for (int t = 0; t < 4; ++t) {
      problem<T> pr(t & 1, t & 2, s.m, s.n, s.k, 3, 900 + std::uint64_t(t));
      const epilogue<T> ep{pr.bias.data(), activation::leaky_relu, T(0.2)};
      set_num_threads(1);
      auto one = pr.run(T(1), T(0.5), ep, pr.c);
      set_num_threads(2);
      auto two = pr.run(T(1), T(0.5), ep, pr.c);
      auto again = pr.run(T(1), T(0.5), ep, pr.c);
      CHECK(bitwise_equal(one, two));
      CHECK(bitwise_equal(two, again));
    }
  }
  set_num_threads(saved);
}

TEST_CASE_TEMPLATE("a narrow product's rows have the same bits wherever they fall in the tiles", T, float, double) {
  // The narrow kernel sums each output's phases in an order fixed by k alone: a row computed in a full tile, in the
  // leftover rows, or in a product that starts elsewhere must come out bit for bit the same.
  for (const auto& s : {size3{23, 10, 100}, size3{40, 7, 61}, size3{17, 15, 33}, size3{30, 3, 200}}) {
    CAPTURE(s.n);
    problem<T> pr(false, true, s.m, s.n, s.k, 1, 1500 + std::uint64_t(s.n));
    const epilogue<T> ep{pr.bias.data(), activation::relu};
    const auto whole = pr.run(T(1), T(0), ep, pr.c);
    for (index_t offset : {index_t(1), index_t(3), index_t(6)}) {
      const index_t rows = s.m - offset;
      std::vector<T> part(std::size_t(rows * pr.ldc), T(0));
      gemm<T>(false, true, rows, s.n, s.k, T(1), pr.a.data() + offset * pr.lda, pr.lda, pr.b.data(), pr.ldb, T(0),
              part.data(), pr.ldc, ep);
      int mismatches = 0;
      for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < s.n; ++j)
          if (std::memcmp(&part[std::size_t(i * pr.ldc + j)], &whole[std::size_t((i + offset) * pr.ldc + j)],
                          sizeof(T)) != 0)
            ++mismatches;
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE_TEMPLATE("gemm on a prepacked B gives gemm's bits, on one thread and two", T, float, double) {
  const int saved = num_threads();
  // A recurrent step's shapes (64 x 512 x 128 forward, 64 x 128 x 512 backward), partial panels in m and n, and
  // three k blocks (1100).
  for (const auto& s : {size3{64, 512, 128}, size3{64, 128, 512}, size3{13, 37, 20}, size3{40, 300, 1100},
                        size3{7, 16, 1}, size3{32, 100, 300}, size3{130, 45, 1}}) {
    for (int t = 0; t < 4; ++t) {
      CAPTURE(s.m);
      CAPTURE(s.n);
      CAPTURE(s.k);
      CAPTURE(t);
      problem<T> pr(t & 1, t & 2, s.m, s.n, s.k, 2, 1300 + std::uint64_t(t));
      const epilogue<T> ep{pr.bias.data(), activation::tanh};
      std::vector<T> packed(std::size_t(kernels::cpu::packed_gemm_b_size<T>(s.k, s.n)));
      kernels::cpu::pack_gemm_b(pr.tb, s.k, s.n, pr.b.data(), pr.ldb, packed.data());
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        const auto plain = pr.run(T(1), T(0.5), ep, pr.c);
        std::vector<T> prepacked = pr.c;
        kernels::cpu::gemm_prepacked_b<T>(pr.ta, s.m, s.n, s.k, T(1), pr.a.data(), pr.lda, packed.data(), T(0.5),
                                          prepacked.data(), pr.ldc, ep);
        CHECK(bitwise_equal(plain, prepacked));
      }
    }
  }
  set_num_threads(saved);
}

TEST_CASE_TEMPLATE("a short product swept panel by panel over groups of A's tiles has the blocked loops' bits", T,
                   float, double) {
  // Weight gradients over a small batch, dL/dY^T X: op(A) = A^T (m x k), B (k x n) row-major on 64-byte lines. With
  // B where gemm_short_k reads it in place (aligned rows, a multiple of 64 bytes apart but not of 256, under a page),
  // against the same B one element off a line, which the blocked loops pack. The MNIST MLP's 128 x 784 x 64; a
  // partial row tile and a partial column panel (50 x 400 x 30); several groups of tiles (200 x 784 x 64 in float);
  // a row split on two threads.
  const int saved = num_threads();
  const index_t n_fit = sizeof(T) == 4 ? 784 : 200;  // rows 3136 / 1600 bytes apart
  for (const auto& s : {size3{128, n_fit, 64}, size3{50, sizeof(T) == 4 ? 400 : 200, 30}, size3{200, n_fit, 40}}) {
    CAPTURE(s.m);
    CAPTURE(s.n);
    CAPTURE(s.k);
    const auto a = random_values<T>(std::size_t(s.k * s.m), 71);
    const auto b = random_values<T>(std::size_t(s.k * s.n), 72);
    const auto bias = random_values<T>(std::size_t(s.n), 73);
    aligned_buffer<T> b_aligned(s.k * s.n), b_off(s.k * s.n + 1);
    std::copy(b.begin(), b.end(), b_aligned.data());
    std::copy(b.begin(), b.end(), b_off.data() + 1);
    const epilogue<T> ep{bias.data(), activation::leaky_relu, T(0.1)};
    using kernels::cpu::gemm_detail::gemm_problem;
    const auto problem_on = [&](const T* b_data) {
      return gemm_problem<T>{true, false, s.m, s.n, s.k, T(1), a.data(), s.m, b_data, s.n, T(0), nullptr, s.n, &ep};
    };
    REQUIRE(kernels::cpu::gemm_detail::short_k_path(problem_on(b_aligned.data()), s.m, false));
    REQUIRE_FALSE(kernels::cpu::gemm_detail::short_k_path(problem_on(b_off.data() + 1), s.m, false));
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      set_num_threads(threads);
      const auto c0 = random_values<T>(std::size_t(s.m * s.n), 74);
      std::vector<T> in_place = c0, packed = c0;
      gemm<T>(true, false, s.m, s.n, s.k, T(0.75), a.data(), s.m, b_aligned.data(), s.n, T(0.5), in_place.data(), s.n,
              ep);
      gemm<T>(true, false, s.m, s.n, s.k, T(0.75), a.data(), s.m, b_off.data() + 1, s.n, T(0.5), packed.data(), s.n,
              ep);
      CHECK(bitwise_equal(in_place, packed));
    }
  }
  set_num_threads(saved);
}

TEST_CASE_TEMPLATE("an outer product (k = 1) has the blocked path's bits, signed zeros included", T, float, double) {
  // gemm runs k = 1 on its own loop and gemm_prepacked_b on the blocked kernel. A product that is exactly zero with a
  // negative factor (-0 * 2, 0 * -3) is -0 as a plain product but +0 as the kernels' FMA onto +0: both must agree.
  for (int t = 0; t < 4; ++t) {
    problem<T> pr(t & 1, t & 2, 200, 37, 1, 2, 1700 + std::uint64_t(t));
    for (std::size_t i = 0; i < pr.a.size(); i += 3) pr.a[i] = i % 2 ? T(-0.0) : T(0);
    for (std::size_t i = 0; i < pr.b.size(); i += 4) pr.b[i] = -pr.b[i];
    std::vector<T> packed(std::size_t(kernels::cpu::packed_gemm_b_size<T>(1, 37)));
    kernels::cpu::pack_gemm_b(pr.tb, 1, 37, pr.b.data(), pr.ldb, packed.data());
    for (activation act : {activation::identity, activation::relu}) {
      const epilogue<T> ep{nullptr, act};
      const auto plain = pr.run(T(1), T(0), ep, pr.c);
      std::vector<T> blocked = pr.c;
      kernels::cpu::gemm_prepacked_b<T>(pr.ta, 200, 37, 1, T(1), pr.a.data(), pr.lda, packed.data(), T(0),
                                        blocked.data(), pr.ldc, ep);
      CHECK(bitwise_equal(plain, blocked));
    }
  }
}

TEST_CASE_TEMPLATE("gemm's fused epilogue equals gemm, then + bias, then the activation by hand", T, float, double) {
  const activation acts[] = {activation::identity, activation::relu,    activation::leaky_relu,
                             activation::gelu,     activation::sigmoid, activation::tanh};
  std::uint64_t seed = 500;
  for (const auto& s : {size3{1, 8, 8}, size3{64, 128, 10}, size3{64, 128, 784}, size3{31, 70, 1100},
                        size3{64, 10, 128}, size3{29, 5, 77}}) {
    for (int t = 0; t < 4; ++t) {
      problem<T> pr(t & 1, t & 2, s.m, s.n, s.k, 2, seed++);
      for (T beta : {T(0), T(0.5)}) {
        for (activation act : acts) {
          const T alpha = T(0.7), slope = T(0.05);
          auto fused = pr.run(alpha, beta, {pr.bias.data(), act, slope}, pr.c);
          auto by_hand = pr.run(alpha, beta, {}, pr.c);
          for (index_t i = 0; i < pr.m; ++i) {
            for (index_t j = 0; j < pr.n; ++j) {
              T& v = by_hand[std::size_t(i * pr.ldc + j)];
              v = v + pr.bias[std::size_t(j)];
              v = kernels::activate(act, v, slope);
            }
          }
          CHECK(bitwise_equal(fused, by_hand));
        }
      }
    }
  }
}
