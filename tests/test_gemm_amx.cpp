// The AMX path of the single-precision GEMM (gemm_amx.hpp) against a double-precision reference and against the
// AVX-512 kernels: its error is no larger than theirs, products of integers are exact (the three-piece split loses no
// bit), a product computed as its transpose has the bits of the direct one, and the bits do not depend on the thread
// count. Skipped where the CPU (or the kernel) offers no AMX.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "kiln/core/threads.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/gemm.hpp"

using namespace kiln;
using kiln::kernels::cpu::epilogue;
using kiln::kernels::cpu::gemm;

namespace {

const bool no_amx = !kernels::cpu::amx_gemm_active();

std::vector<float> random_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> v(count);
  std::uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = float(double(s >> 11) / double(1ull << 53) * 2.0 - 1.0);
  }
  return v;
}

// One product with padded leading dimensions; runs it with the AMX path on or off.
struct product {
  bool ta, tb;
  index_t m, n, k, lda, ldb, ldc;
  std::vector<float> a, b, c, bias;

  product(bool ta_, bool tb_, index_t m_, index_t n_, index_t k_, index_t pad, std::uint64_t seed)
      : ta(ta_), tb(tb_), m(m_), n(n_), k(k_), lda((ta_ ? m_ : k_) + pad), ldb((tb_ ? k_ : n_) + pad), ldc(n_ + pad) {
    a = random_values(std::size_t((ta ? k : m) * lda), seed);
    b = random_values(std::size_t((tb ? n : k) * ldb), seed + 1);
    c = random_values(std::size_t(m * ldc), seed + 2);
    bias = random_values(std::size_t(n), seed + 3);
  }
  double op_a(index_t i, index_t p) const { return ta ? a[std::size_t(p * lda + i)] : a[std::size_t(i * lda + p)]; }
  double op_b(index_t p, index_t j) const { return tb ? b[std::size_t(j * ldb + p)] : b[std::size_t(p * ldb + j)]; }

  std::vector<float> run(bool amx, float alpha, float beta, const epilogue<float>& ep) const {
    kernels::cpu::set_amx_gemm(amx);
    std::vector<float> out = c;
    gemm<float>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, out.data(), ldc, ep);
    kernels::cpu::set_amx_gemm(true);
    return out;
  }

  // The largest error against the double reference, relative to the sum of the magnitudes of the terms; NaN where
  // the padding of C was touched.
  double worst_error(const std::vector<float>& out, float alpha, float beta, const epilogue<float>& ep) const {
    double worst = 0;
    for (index_t i = 0; i < m; ++i) {
      for (index_t j = n; j < ldc; ++j)
        if (std::memcmp(&out[std::size_t(i * ldc + j)], &c[std::size_t(i * ldc + j)], sizeof(float)) != 0)
          return std::numeric_limits<double>::quiet_NaN();
      for (index_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (index_t p = 0; p < k; ++p) {
          sum += op_a(i, p) * op_b(p, j);
          magnitude += std::abs(op_a(i, p) * op_b(p, j));
        }
        const double c0 = c[std::size_t(i * ldc + j)];
        double v = double(alpha) * sum + double(beta) * c0;
        magnitude = std::abs(double(alpha)) * magnitude + std::abs(double(beta) * c0);
        if (ep.bias) {
          v += ep.bias[j];
          magnitude += std::abs(double(ep.bias[j]));
        }
        const double expected = kernels::activate(ep.act, v, double(ep.slope));
        worst = std::max(worst, std::abs(out[std::size_t(i * ldc + j)] - expected) / (magnitude + 1e-30));
      }
    }
    return worst;
  }
};

bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

struct size3 {
  index_t m, n, k;
};

// Whole and partial tiles in every dimension (16 rows and columns, 32-deep chunks), one and several k blocks (128
// deep), an MLP layer's shapes, row counts that do and do not fill a 2 x 2 block of tiles, and a B too large for L2
// with all of k (400 x 1100: packed a k block at a time).
const size3 sizes[] = {{16, 1024, 64}, {37, 450, 100}, {64, 128, 784}, {128, 784, 64}, {130, 45, 1100},
                       {50, 333, 129}, {100, 100, 257}, {17, 1000, 70}, {40, 400, 1100}};

}  // namespace

TEST_CASE("the AMX path is as accurate as the AVX-512 kernels, for every transpose and epilogue" *
          doctest::skip(no_amx)) {
  std::uint64_t seed = 1;
  for (const auto& s : sizes) {
    for (int t = 0; t < 4; ++t) {
      CAPTURE(s.m);
      CAPTURE(s.n);
      CAPTURE(s.k);
      CAPTURE(t);
      REQUIRE(kernels::cpu::gemm_detail::amx_worthwhile(s.m, s.n, s.k));
      const product pr(t & 1, t & 2, s.m, s.n, s.k, index_t(t) * 3 + 1, seed++);
      const epilogue<float> plain{}, fused{pr.bias.data(), activation::relu};
      for (const auto& [alpha, beta, ep] : {std::tuple{1.0f, 0.0f, plain}, std::tuple{-0.75f, 1.5f, plain},
                                            std::tuple{2.0f, 0.5f, fused}}) {
        const auto amx = pr.run(true, alpha, beta, ep), avx = pr.run(false, alpha, beta, ep);
        const double amx_error = pr.worst_error(amx, alpha, beta, ep), avx_error = pr.worst_error(avx, alpha, beta, ep);
        CAPTURE(amx_error);
        CAPTURE(avx_error);
        // A float dot product's rounding: a few units of 2^-24 of the terms' magnitude, growing slowly with k.
        CHECK(amx_error <= 2 * avx_error + 1e-7);
        CHECK(amx_error < 1e-6);
        // And the AMX path did run: its sums round differently somewhere.
        CHECK_FALSE(bitwise_equal(amx, avx));
      }
    }
  }
}

TEST_CASE("the AMX path's split loses no bit: a product with one term per output is exact" * doctest::skip(no_amx)) {
  // One operand holds floats with all 24 significant bits (so all three bfloat16 pieces are used); the other has a
  // single nonzero, a power of two, in each row of op(A) or column of op(B). Every output is then one exact product,
  // which the pieces must rebuild to the last bit.
  for (int t = 0; t < 8; ++t) {
    CAPTURE(t);
    product pr(t & 1, t & 2, 48, 160, 128, 2, 900 + std::uint64_t(t));
    REQUIRE(kernels::cpu::gemm_detail::amx_worthwhile(pr.m, pr.n, pr.k));
    const bool a_sparse = t & 4;
    const float powers[] = {1.0f, -2.0f, 0.5f, -0.25f};
    if (a_sparse) {
      std::fill(pr.a.begin(), pr.a.end(), 0.0f);
      for (index_t i = 0; i < pr.m; ++i) {
        const index_t p = (i * 37 + 11) % pr.k;
        pr.a[std::size_t(pr.ta ? p * pr.lda + i : i * pr.lda + p)] = powers[i % 4];
      }
    } else {
      std::fill(pr.b.begin(), pr.b.end(), 0.0f);
      for (index_t j = 0; j < pr.n; ++j) {
        const index_t p = (j * 53 + 5) % pr.k;
        pr.b[std::size_t(pr.tb ? j * pr.ldb + p : p * pr.ldb + j)] = powers[j % 4];
      }
    }
    const auto amx = pr.run(true, 1.0f, 0.0f, {});
    int inexact = 0;
    for (index_t i = 0; i < pr.m; ++i)
      for (index_t j = 0; j < pr.n; ++j) {
        double sum = 0;
        for (index_t p = 0; p < pr.k; ++p) sum += pr.op_a(i, p) * pr.op_b(p, j);
        if (double(amx[std::size_t(i * pr.ldc + j)]) != sum) ++inexact;
      }
    CHECK(inexact == 0);
  }
}

TEST_CASE("a product the AMX path computes as its transpose has the direct product's bits" * doctest::skip(no_amx)) {
  // B stored n x k with fewer rows than columns (a Dense layer's forward) runs as C^T = B A^T; the same product with
  // B stored k x n runs directly. Each element must add the same piece products in the same order either way.
  for (const auto& s : {size3{64, 128, 784}, size3{20, 300, 100}, size3{33, 47, 400}}) {
    CAPTURE(s.m);
    REQUIRE(kernels::cpu::gemm_detail::amx_worthwhile(s.m, s.n, s.k));
    const product transposed(false, true, s.m, s.n, s.k, 3, 40);
    product direct(false, false, s.m, s.n, s.k, 3, 40);
    direct.a = transposed.a;
    direct.c = transposed.c;
    for (index_t p = 0; p < s.k; ++p)
      for (index_t j = 0; j < s.n; ++j)
        direct.b[std::size_t(p * direct.ldb + j)] = transposed.b[std::size_t(j * transposed.ldb + p)];
    const epilogue<float> fused{transposed.bias.data(), activation::tanh};
    CHECK(bitwise_equal(transposed.run(true, 1.5f, 0.25f, fused), direct.run(true, 1.5f, 0.25f, fused)));
    CHECK(bitwise_equal(transposed.run(true, 1.0f, 0.0f, {}), direct.run(true, 1.0f, 0.0f, {})));
  }
}

TEST_CASE("the AMX path gives the same bits on one, two and three threads" * doctest::skip(no_amx)) {
  const int saved = num_threads();
  for (const auto& s : sizes) {
    for (int t = 0; t < 4; ++t) {
      CAPTURE(s.m);
      CAPTURE(t);
      const product pr(t & 1, t & 2, s.m, s.n, s.k, 1, 70 + std::uint64_t(t));
      const epilogue<float> fused{pr.bias.data(), activation::leaky_relu};
      set_num_threads(1);
      const auto one = pr.run(true, 1.0f, 1.0f, fused);
      for (int threads : {2, 3}) {
        set_num_threads(threads);
        CHECK(bitwise_equal(one, pr.run(true, 1.0f, 1.0f, fused)));
      }
    }
  }
  set_num_threads(saved);
}

TEST_CASE("a NaN in an operand reaches the outputs it touches on the AMX path" * doctest::skip(no_amx)) {
  product pr(false, false, 40, 160, 128, 0, 5);
  REQUIRE(kernels::cpu::gemm_detail::amx_worthwhile(pr.m, pr.n, pr.k));
  pr.a[std::size_t(7 * pr.lda + 100)] = std::numeric_limits<float>::quiet_NaN();  // row 7 of A
  const auto out = pr.run(true, 1.0f, 0.0f, {});
  int nan_rows_right = 0;
  for (index_t i = 0; i < pr.m; ++i)
    for (index_t j = 0; j < pr.n; ++j) nan_rows_right += std::isnan(out[std::size_t(i * pr.ldc + j)]) == (i == 7);
  CHECK(nan_rows_right == pr.m * pr.n);
}

TEST_CASE("adding to a C of zeros writes the product; one nonzero element of C is still added" *
          doctest::skip(no_amx)) {
  // The AMX path turns beta != 0 onto an all-zero C (a freshly zeroed .grad) into beta = 0, after scanning C.
  product pr(true, false, 128, 784, 64, 0, 11);
  const epilogue<float> none{};
  std::fill(pr.c.begin(), pr.c.end(), 0.0f);
  const auto written = pr.run(true, 1.0f, 0.0f, none), added = pr.run(true, 1.0f, 1.0f, none);
  CHECK(bitwise_equal(written, added));
  pr.c.back() = 0.5f;  // the last element scanned
  const auto with_one = pr.run(true, 1.0f, 1.0f, none);
  CHECK(with_one.back() == written.back() + 0.5f);
  CHECK(pr.worst_error(with_one, 1.0f, 1.0f, none) < 1e-6);
}

TEST_CASE("a product of many rows runs in row panels with the bits of separate products" * doctest::skip(no_amx)) {
  // B (1024 x 256) is too large for L2 with all of k, so rows run in panels of 2048; rows 0-999 and 1000-2099 as two
  // products must give the bits of the one product that crosses a panel boundary.
  const int saved = num_threads();
  set_num_threads(1);  // on one thread the whole product is one sub-block, and its rows run in panels
  const product pr(false, false, 2100, 256, 1024, 0, 21);
  const epilogue<float> fused{pr.bias.data(), activation::relu};
  const auto whole = pr.run(true, 1.0f, 0.0f, fused);
  std::vector<float> split = pr.c;
  kernels::cpu::set_amx_gemm(true);
  const index_t first = 1000;
  gemm<float>(false, false, first, pr.n, pr.k, 1.0f, pr.a.data(), pr.lda, pr.b.data(), pr.ldb, 0.0f, split.data(),
              pr.ldc, fused);
  gemm<float>(false, false, pr.m - first, pr.n, pr.k, 1.0f, pr.a.data() + first * pr.lda, pr.lda, pr.b.data(),
              pr.ldb, 0.0f, split.data() + first * pr.ldc, pr.ldc, fused);
  set_num_threads(saved);
  CHECK(bitwise_equal(whole, split));
}
