// The sparse-input products (kernels/cpu/dense_sparse_input.hpp): the listing of an input mostly of one value, the
// forward and the weight gradient against a double-precision product for inputs of background 0 and not, parts over
// output ranges with the whole call's bits, NaNs reaching the outputs they would reach, Dense's forward and backward
// in both modes taking them on policy::cpu_sparse_input (and the same values within float rounding with them switched
// off, or on policy::cpu), and which inputs they decline. The fused step's agreement with them is in
// test_fused_mlp.cpp.
// Dynamic mode's policy is chosen before kiln is included, for this whole program.
#define KILN_DYNAMIC_POLICY ::kiln::policy::cpu_sparse_input
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "same_training.hpp"
#include "thread_settings.hpp"

using namespace kiln;
namespace cpu = kiln::kernels::cpu;

namespace {

// rows x cols with `background` everywhere but at about `density` of the elements (none at [0][0]).
std::vector<float> mostly_background(index_t rows, index_t cols, float background, double density,
                                     std::uint64_t seed) {
  random_generator rng(seed);
  std::vector<float> x(std::size_t(rows * cols), background);
  for (std::size_t i = 1; i < x.size(); ++i)
    if (rng.uniform<double>() < density) x[i] = rng.normal<float>() + 0.5f;
  return x;
}

std::vector<float> normal_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  random_generator rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * rng.normal<float>();
  return v;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// |got - exact| within float rounding of a sum of n products whose magnitudes add up to `scale`.
void check_close(float got, double exact, double scale, index_t n) {
  CHECK(std::fabs(double(got) - exact) <= 4.0 * double(n) * 6e-8 * scale + 1e-30);
}

bool avx512() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

}  // namespace

TEST_CASE("sparse_input lists the rows off the background by groups of columns, and declines dense inputs") {
  if (!avx512()) return;  // the kernels are AVX-512 only; the layers then run the GEMM
  // 3 x 22 (groups of 4 columns, the last one padded by two): a background of 2 with five other elements, one a NaN.
  std::vector<float> x(66, 2.0f);
  x[1 * 22 + 3] = 5.0f;
  x[1 * 22 + 17] = -1.0f;
  x[2 * 22 + 0] = std::numeric_limits<float>::quiet_NaN();
  x[2 * 22 + 3] = 2.5f;
  x[0 * 22 + 21] = 0.0f;
  cpu::sparse_input s;
  REQUIRE(cpu::sparse_input::group == 4);
  REQUIRE(s.scan(x.data(), 3, 22, 22, 0.5));
  CHECK(s.background == 2.0f);
  CHECK(s.groups == 6);
  CHECK(s.entries == 4);
  CHECK(std::vector<index_t>(s.start, s.start + 7) == std::vector<index_t>{0, 2, 2, 2, 2, 3, 4});
  CHECK(std::vector<std::int32_t>(s.row, s.row + 4) == std::vector<std::int32_t>{1, 2, 1, 0});
  // Each listed row carries its group's four differences, 0 at the background and past the last column.
  const auto values = [&](index_t t) {
    return std::vector<float>{s.value[0][t], s.value[1][t], s.value[2][t], s.value[3][t]};
  };
  CHECK(values(0) == std::vector<float>{0.0f, 0.0f, 0.0f, 3.0f});
  CHECK(std::isnan(values(1)[0]));
  CHECK(values(1)[3] == 0.5f);
  CHECK(values(1)[1] == 0.0f);
  CHECK(values(2) == std::vector<float>{0.0f, -3.0f, 0.0f, 0.0f});
  CHECK(values(3) == std::vector<float>{0.0f, -2.0f, 0.0f, 0.0f});
  // The same input over 40 rows (the listing runs down the rows 16 at a time): rows ascending across vectors.
  std::vector<float> tall(40 * 22, 2.0f);
  tall[0 * 22 + 21] = 0.0f;
  tall[15 * 22 + 5] = 1.0f;
  tall[16 * 22 + 6] = 1.0f;
  tall[39 * 22 + 4] = 1.0f;
  REQUIRE(s.scan(tall.data(), 40, 22, 22, 0.5));
  CHECK(std::vector<index_t>(s.start, s.start + 7) == std::vector<index_t>{0, 0, 3, 3, 3, 3, 4});
  CHECK(std::vector<std::int32_t>(s.row, s.row + 4) == std::vector<std::int32_t>{15, 16, 39, 0});
  // Four rows listed, 16 multiply-adds per output against the dense product's 66: more than a fraction of 0.2
  // allows; a background that is not finite.
  CHECK_FALSE(s.scan(x.data(), 3, 22, 22, 0.2));
  CHECK(s.scan(x.data(), 3, 22, 22, 0.25));
  x[0] = std::numeric_limits<float>::infinity();
  CHECK_FALSE(s.scan(x.data(), 3, 22, 22, 0.5));
  const auto dense = normal_values(64 * 100, 5);
  CHECK_FALSE(s.scan(dense.data(), 64, 100, 100));
}

TEST_CASE("the sparse-input forward and weight gradient are the products within float rounding") {
  if (!avx512()) return;
  thread_settings_guard guard;
  struct shape_case {
    index_t batch, in, out;
    float background;
  };
  // MNIST's first layer; a background of 0 (the plain sparse product); rows and inputs off the vector width, more
  // outputs than one pass holds (144 = 128 + 16), many passes (1024).
  for (const shape_case c : {shape_case{64, 784, 128, -0.4242f}, shape_case{67, 100, 48, 0.0f},
                             shape_case{7, 333, 144, 1.25f}, shape_case{16, 784, 1024, -0.4242f}}) {
    for (int threads : {1, 2}) {
      CAPTURE(c.batch);
      CAPTURE(c.in);
      CAPTURE(c.out);
      CAPTURE(threads);
      set_num_threads(threads);
      auto x = mostly_background(c.batch, c.in, c.background, 0.2, 11);
      // Columns [16, 48) at the background in every row, as MNIST's blank borders are: two strips that list nothing,
      // whose columns of W still count in W's row sums (the background's share).
      for (index_t i = 0; i < c.batch; ++i)
        for (index_t k = 16; k < std::min<index_t>(48, c.in); ++k) x[std::size_t(i * c.in + k)] = c.background;
      const auto w = normal_values(std::size_t(c.out * c.in), 12, 0.05f);
      const auto bias = normal_values(std::size_t(c.out), 13, 0.1f);
      const auto dy = normal_values(std::size_t(c.batch * c.out), 14);
      std::vector<float> y(std::size_t(c.batch * c.out), std::numeric_limits<float>::quiet_NaN());
      REQUIRE(cpu::sparse_input_kernels::dense_forward_sparse_input(x.data(), w.data(), bias.data(), y.data(), c.batch,
                                                                     c.in, c.out, activation::identity, 0.0f));
      for (index_t i = 0; i < c.batch; ++i)
        for (index_t o = 0; o < c.out; ++o) {
          double exact = bias[std::size_t(o)], scale = std::fabs(bias[std::size_t(o)]);
          for (index_t k = 0; k < c.in; ++k) {
            const double term = double(x[std::size_t(i * c.in + k)]) * double(w[std::size_t(o * c.in + k)]);
            exact += term;
            scale += std::fabs(term);
          }
          check_close(y[std::size_t(i * c.out + o)], exact, scale, c.in);
        }
      // The weight gradient, overwriting and then accumulating onto what is there.
      std::vector<float> dw(std::size_t(c.out * c.in), std::numeric_limits<float>::quiet_NaN());
      REQUIRE(cpu::sparse_input_kernels::dense_weight_gradient_sparse_input(x.data(), dy.data(), dw.data(), c.batch,
                                                                             c.in, c.out, false));
      std::vector<float> dw_sum = dw;
      REQUIRE(cpu::sparse_input_kernels::dense_weight_gradient_sparse_input(x.data(), dy.data(), dw_sum.data(),
                                                                             c.batch, c.in, c.out, true));
      for (index_t o = 0; o < c.out; ++o)
        for (index_t k = 0; k < c.in; ++k) {
          double exact = 0, scale = 0;
          for (index_t i = 0; i < c.batch; ++i) {
            const double term = double(dy[std::size_t(i * c.out + o)]) * double(x[std::size_t(i * c.in + k)]);
            exact += term;
            scale += std::fabs(term);
          }
          const std::size_t at = std::size_t(o * c.in + k);
          check_close(dw[at], exact, scale, c.batch);
          CHECK(dw_sum[at] == dw[at] + dw[at]);
        }
    }
  }
}

TEST_CASE("the sparse-input products' parts over output ranges are the whole call's elements") {
  if (!avx512()) return;
  const index_t batch = 29, in = 200, out = 160;
  const auto x = mostly_background(batch, in, -0.5f, 0.15, 21);
  const auto w = normal_values(std::size_t(out * in), 22, 0.1f);
  const auto bias = normal_values(std::size_t(out), 23);
  const auto dy = normal_values(std::size_t(batch * out), 24);
  cpu::sparse_input listed;
  REQUIRE(listed.scan(x.data(), batch, in, in));
  std::vector<float> y_whole(std::size_t(batch * out)), y_parts(y_whole.size());
  std::vector<float> dw_whole(std::size_t(out * in)), dw_parts(dw_whole.size());
  cpu::sparse_input_forward_part(listed, w.data(), in, bias.data(), activation::relu, 0.0f, y_whole.data(), out, 0,
                                 out);
  cpu::sparse_input_weight_gradient_part(listed, dy.data(), out, dw_whole.data(), in, false, 0, out);
  for (const auto& [o0, o1] : {std::pair<index_t, index_t>{0, 16}, {16, 144}, {144, 160}}) {
    cpu::sparse_input_forward_part(listed, w.data(), in, bias.data(), activation::relu, 0.0f, y_parts.data(), out,
                                   o0, o1);
    cpu::sparse_input_weight_gradient_part(listed, dy.data(), out, dw_parts.data(), in, false, o0, o1);
  }
  CHECK(bitwise_equal(y_parts, y_whole));
  CHECK(bitwise_equal(dw_parts, dw_whole));
  CHECK(*std::min_element(y_whole.begin(), y_whole.end()) == 0.0f);  // the ReLU ran
}

TEST_CASE("listings of shares of an input's rows give the whole listing's bits, and qualify as the whole does") {
  if (!avx512()) return;
  thread_settings_guard guard;
  const index_t batch = 45, in = 203, out = 96;
  auto x = mostly_background(batch, in, -0.5f, 0.15, 25);
  // The second share's first element is off the background: each share lists against the whole input's x[0].
  x[std::size_t(23 * in)] = 1.25f;
  const auto w = normal_values(std::size_t(out * in), 26, 0.1f);
  const auto bias = normal_values(std::size_t(out), 27);
  const auto dy = normal_values(std::size_t(batch * out), 28);
  cpu::sparse_input whole;
  REQUIRE(whole.scan(x.data(), batch, in, in));
  std::vector<float> y_whole(std::size_t(batch * out)), dw_whole(std::size_t(out * in));
  cpu::sparse_input_forward_part(whole, w.data(), in, bias.data(), activation::relu, 0.0f, y_whole.data(), out, 0,
                                 out);
  cpu::sparse_input_weight_gradient_part(whole, dy.data(), out, dw_whole.data(), in, false, 0, out);
  const index_t limit = cpu::sparse_input::work_limit(batch, in);
  std::vector<cpu::sparse_input> shares(3);
  const index_t bounds[] = {0, 23, 24, batch};  // one share of a single row
  index_t entries = 0;
  for (std::size_t k = 0; k < shares.size(); ++k) {
    REQUIRE(shares[k].scan_rows(x.data(), bounds[k], bounds[k + 1] - bounds[k], in, in, x[0], limit));
    CHECK(shares[k].first_row == bounds[k]);
    entries += shares[k].entries;
  }
  CHECK(entries == whole.entries);
  const cpu::sparse_input* const parts[] = {&shares[0], &shares[1], &shares[2]};
  std::vector<float> y_parts(y_whole.size()), dw_parts(dw_whole.size());
  for (const auto& [o0, o1] : {std::pair<index_t, index_t>{0, 32}, {32, 96}}) {
    cpu::sparse_input_forward_part(parts, w.data(), in, bias.data(), activation::relu, 0.0f, y_parts.data(), out, o0,
                                   o1);
    cpu::sparse_input_weight_gradient_part(parts, dy.data(), out, dw_parts.data(), in, false, o0, o1);
  }
  CHECK(bitwise_equal(y_parts, y_whole));
  CHECK(bitwise_equal(dw_parts, dw_whole));
  // The shares added one call each, out of row order, and all 96 outputs in one object (a block of 64 and one of 32):
  // the rows' sums are still the whole listing's.
  {
    cpu::sparse_input_forward_sums sums(w.data(), in, in, batch, x[0], 0, out);
    for (const std::size_t k : {2u, 0u, 1u}) sums.add(shares[k]);
    std::vector<float> y_calls(y_whole.size());
    sums.finish(bias.data(), activation::relu, 0.0f, y_calls.data(), out);
    CHECK(bitwise_equal(y_calls, y_whole));
  }
  // Through the kernels, on one to three threads: each lists its share, and the results are the whole listing's.
  using kernels = cpu::sparse_input_kernels;
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    set_num_threads(threads);
    std::vector<float> y(y_whole.size()), dw(dw_whole.size());
    REQUIRE(kernels::dense_forward_sparse_input(x.data(), w.data(), bias.data(), y.data(), batch, in, out,
                                                activation::relu, 0.0f));
    REQUIRE(kernels::dense_weight_gradient_sparse_input(x.data(), dy.data(), dw.data(), batch, in, out, false));
    CHECK(bitwise_equal(y, y_whole));
    CHECK(bitwise_equal(dw, dw_whole));
  }
  // Shares that each list under the limit but pass it together decline the input, as the whole does: a dense input,
  // whose halves each list half of the groups' rows that it has.
  const auto dense = normal_values(64 * 200, 29);
  const index_t dense_limit = cpu::sparse_input::work_limit(64, 200);
  cpu::sparse_input first_half, second_half;
  REQUIRE(first_half.scan_rows(dense.data(), 0, 32, 200, 200, dense[0], dense_limit));
  REQUIRE(second_half.scan_rows(dense.data(), 32, 32, 200, 200, dense[0], dense_limit));
  CHECK(first_half.entries + second_half.entries > dense_limit);
  CHECK_FALSE(whole.scan(dense.data(), 64, 200, 200));
  const auto w32 = normal_values(std::size_t(32 * 200), 30);  // two tiles of outputs: one for each thread
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    std::vector<float> y(64 * 32);
    const float* no_bias = nullptr;
    CHECK_FALSE(kernels::dense_forward_sparse_input(dense.data(), w32.data(), no_bias, y.data(), 64, 200, 32,
                                                    activation::identity, 0.0f));
  }
}

TEST_CASE("a NaN in a sparse input reaches the outputs and gradients it would reach in the product") {
  if (!avx512()) return;
  const index_t batch = 16, in = 128, out = 128;
  auto x = mostly_background(batch, in, 0.0f, 0.1, 31);
  x[std::size_t(3 * in + 10)] = std::numeric_limits<float>::quiet_NaN();
  const auto w = normal_values(std::size_t(out * in), 32);
  const auto dy = normal_values(std::size_t(batch * out), 33);
  std::vector<float> y(std::size_t(batch * out)), dw(std::size_t(out * in));
  REQUIRE(cpu::sparse_input_kernels::dense_forward_sparse_input(x.data(), w.data(), static_cast<const float*>(nullptr),
                                                                 y.data(), batch, in, out, activation::identity, 0.0f));
  REQUIRE(cpu::sparse_input_kernels::dense_weight_gradient_sparse_input(x.data(), dy.data(), dw.data(), batch, in, out,
                                                                         false));
  for (index_t i = 0; i < batch; ++i)
    for (index_t o = 0; o < out; ++o) CHECK(std::isnan(y[std::size_t(i * out + o)]) == (i == 3));
  for (index_t o = 0; o < out; ++o)
    for (index_t k = 0; k < in; ++k) CHECK(std::isnan(dw[std::size_t(o * in + k)]) == (k == 10));
}

TEST_CASE("Dense takes the sparse-input products in both modes, and the GEMM's values within rounding without them") {
  if (!avx512()) return;
  thread_settings_guard guard;
  set_num_threads(1);
  const index_t batch = 32, in = 784, out = 64;
  const auto x = mostly_background(batch, in, -0.4242f, 0.2, 41);
  const auto w = normal_values(std::size_t(out * in), 42, 0.05f);
  const auto bias = normal_values(std::size_t(out), 43, 0.1f);
  const auto dy = normal_values(std::size_t(batch * out), 44);
  const auto run = [&]<class Policy>() {
    std::vector<float> y(std::size_t(batch * out)), dw(std::size_t(out * in)), db(static_cast<std::size_t>(out));
    dense_forward<Policy>(x.data(), w.data(), bias.data(), y.data(), batch, in, out, activation::relu, 0.0f);
    dense_backward<Policy>(x.data(), w.data(), dy.data(), static_cast<float*>(nullptr), dw.data(), db.data(), batch,
                           in, out, false);
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  REQUIRE(cpu::sparse_input_products_enabled());
  const auto sparse = run.template operator()<policy::cpu_sparse_input>();
  // The kernels' own results: Dense took them.
  std::vector<float> y(std::size_t(batch * out)), dw(std::size_t(out * in));
  REQUIRE(cpu::sparse_input_kernels::dense_forward_sparse_input(x.data(), w.data(), bias.data(), y.data(), batch, in,
                                                                 out, activation::relu, 0.0f));
  REQUIRE(cpu::sparse_input_kernels::dense_weight_gradient_sparse_input(x.data(), dy.data(), dw.data(), batch, in, out,
                                                                         false));
  y.insert(y.end(), dw.begin(), dw.end());
  CHECK(bitwise_equal(sparse, y));
  // policy::cpu takes the GEMM, as the switch turned off does.
  const auto dense = run.template operator()<policy::cpu>();
  cpu::set_sparse_input_products(false);
  CHECK(bitwise_equal(run.template operator()<policy::cpu_sparse_input>(), dense));
  cpu::set_sparse_input_products(true);
  CHECK_FALSE(bitwise_equal(sparse, dense));  // another order of the sums
  double worst = 0;
  for (std::size_t i = 0; i < dense.size(); ++i)
    worst = std::max(worst, std::fabs(double(sparse[i]) - double(dense[i])) / (1.0 + std::fabs(double(dense[i]))));
  CHECK(worst < 1e-5);

  // A GELU, whose backward needs the pre-activation: the sparse product writes it, and the activation runs after.
  const auto gelu = [&]<class Policy>() {
    std::vector<float> out_values(std::size_t(batch * out)), pre(out_values.size());
    dense_forward<Policy>(x.data(), w.data(), bias.data(), out_values.data(), batch, in, out, activation::gelu, 0.0f,
                          pre.data());
    out_values.insert(out_values.end(), pre.begin(), pre.end());
    return out_values;
  };
  const auto gelu_sparse = gelu.template operator()<policy::cpu_sparse_input>();
  const auto gelu_dense = gelu.template operator()<policy::cpu>();
  worst = 0;
  for (std::size_t i = 0; i < gelu_dense.size(); ++i)
    worst = std::max(worst, std::fabs(double(gelu_sparse[i]) - double(gelu_dense[i])) /
                                (1.0 + std::fabs(double(gelu_dense[i]))));
  CHECK(worst < 1e-5);
  CHECK_FALSE(bitwise_equal(gelu_sparse, gelu_dense));
}

TEST_CASE("static and dynamic mode train alike, bit for bit, on an input that takes the sparse-input products") {
  if (!avx512()) return;
  thread_settings_guard guard;
  const index_t batch = 32;
  using Net = Sequential<policy::cpu_sparse_input, Input<784>, Dense<64, ReLU>, Dense<10>>;
  Net net(batch, 21);
  manual_seed(21);
  nn::Sequential model(nn::Linear(784, 64), nn::ReLU(), nn::Linear(64, 10));
  Tensor<float> x(shape{batch, 784});
  const auto values = mostly_background(batch, 784, -0.4242f, 0.2, 61);
  std::copy(values.begin(), values.end(), x.span().begin());
  Tensor<std::int64_t> y(shape{batch});
  for (index_t i = 0; i < batch; ++i) y[i] = std::int64_t(i % 10);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_same_losses(net, model, {x, y}, 3);
  }
}

TEST_CASE("the sparse-input products decline what they cannot take") {
  const auto x = mostly_background(64, 784, 0.0f, 0.1, 51);
  const auto w = normal_values(std::size_t(10 * 784), 52);
  std::vector<float> y(64 * 16);
  // 10 outputs (not a multiple of 16), a tiny product, doubles; switched off.
  const float* no_bias = nullptr;
  CHECK_FALSE(cpu::sparse_input_kernels::dense_forward_sparse_input(x.data(), w.data(), no_bias, y.data(), 64, 784, 10,
                                                                     activation::identity, 0.0f));
  CHECK_FALSE(cpu::dense_sparse_input_applies<float>(1, 8, 16));
  CHECK_FALSE(cpu::dense_sparse_input_applies<double>(64, 784, 128));
  CHECK(cpu::dense_sparse_input_applies<float>(64, 784, 128) == avx512());
  cpu::set_sparse_input_products(false);
  CHECK_FALSE(cpu::dense_sparse_input_applies<float>(64, 784, 128));
  cpu::set_sparse_input_products(true);
  // A dense input: the scan declines it, and Dense runs the GEMM.
  const auto dense = normal_values(64 * 784, 53);
  const auto w16 = normal_values(std::size_t(16 * 784), 54);
  CHECK_FALSE(cpu::sparse_input_kernels::dense_forward_sparse_input(dense.data(), w16.data(),
                                                                     static_cast<const float*>(nullptr), y.data(), 64,
                                                                     784, 16, activation::identity, 0.0f));
}

TEST_CASE("a weight gradient lists its own input, whatever forward ran before it") {
  if (!avx512()) return;
  thread_settings_guard guard;
  using kernels = cpu::sparse_input_kernels;
  const index_t batch = 64, in = 200, out = 128;
  const auto first = mostly_background(batch, in, -0.5f, 0.15, 61);
  const auto second = mostly_background(batch, in, -0.5f, 0.15, 62);
  const auto w = normal_values(std::size_t(out * in), 63, 0.1f);
  const auto dy = normal_values(std::size_t(batch * out), 64);
  std::vector<float> y(std::size_t(batch * out));
  const auto gradient = [&](const std::vector<float>& x) {
    std::vector<float> dw(std::size_t(out * in));
    REQUIRE(kernels::dense_weight_gradient_sparse_input(x.data(), dy.data(), dw.data(), batch, in, out, false));
    return dw;
  };
  std::vector<float> buffer = first;
  const auto of_first = gradient(buffer);
  buffer = second;
  const auto of_second = gradient(buffer);
  REQUIRE_FALSE(bitwise_equal(of_first, of_second));
  // A forward lists the first input, on one thread or two; the buffer is then overwritten in place, and the weight
  // gradient, on either, is the second input's.
  for (int forward_threads : {1, 2})
    for (int backward_threads : {1, 2}) {
      CAPTURE(forward_threads);
      CAPTURE(backward_threads);
      set_num_threads(forward_threads);
      buffer = first;
      REQUIRE(kernels::dense_forward_sparse_input(buffer.data(), w.data(), static_cast<const float*>(nullptr),
                                                  y.data(), batch, in, out, activation::identity, 0.0f));
      buffer = second;
      set_num_threads(backward_threads);
      CHECK(bitwise_equal(gradient(buffer), of_second));
    }
}
