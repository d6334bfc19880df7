// Helpers of the tests of lower-precision products (test_bf16_products, test_bf16x3_products): products checked
// against a double reference over the operands as a precision takes them, and small models trained under a policy.
// Each test program chooses its dynamic-mode policy (KILN_DYNAMIC_POLICY) before it includes this.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/threads.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kiln.hpp"
#include "same_training.hpp"
#include "thread_settings.hpp"

namespace kiln::precision_test {

using kernels::cpu::epilogue;
using kernels::cpu::product_precision;
using kernels::cpu::round_to_bfloat16;

inline const bool no_amx = !kernels::cpu::amx_gemm_active();

// Whether products of this precision now take the bfloat16 path (AMX tiles, or for bfloat16 operands AVX512-BF16
// dot products) where their shape suits it; elsewhere they keep single precision's bits.
inline bool rounds_products(product_precision precision) { return kernels::cpu::bfloat16_path_active(precision); }

inline float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }

inline std::vector<float> random_values(std::size_t count, std::uint64_t seed) {
  random_generator rng(seed);
  std::vector<float> v(count);
  for (auto& x : v) x = rng.uniform<float>(-1.0f, 1.0f);
  return v;
}

// x rounded to bfloat16 as a product of bfloat16x3 rounds its pieces: to nearest, ties away from zero (a NaN stays
// one). Written from the definition, as a reference for the kernels' vector code.
inline float round_half_away_to_bfloat16(float x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const float magnitude = std::abs(x);
  // The bfloat16 values on either side (their gaps are even across subnormals and binades' ends); past the largest,
  // the next one up is 2^128, which rounds to infinity.
  const std::uint32_t down_bits = std::bit_cast<std::uint32_t>(magnitude) & 0xFFFF0000u;
  const double down = std::bit_cast<float>(down_bits);
  const double up = down_bits + 0x10000u == 0x7F800000u ? std::ldexp(1.0, 128)
                                                         : double(std::bit_cast<float>(down_bits + 0x10000u));
  const double rounded = double(magnitude) - down >= up - double(magnitude) ? up : down;  // ties go up
  return std::copysign(float(rounded), x);  // 2^128 overflows to infinity
}

// x's two pieces in a product of bfloat16x3: hi = x rounded, lo = the remainder (exact) rounded.
inline float bfloat16x3_hi(float x) { return round_half_away_to_bfloat16(x); }
inline float bfloat16x3_lo(float x) { return round_half_away_to_bfloat16(x - bfloat16x3_hi(x)); }

// x * y as a product of this precision forms it from its pieces, in double (each piece product is exact).
inline double piece_product(float x, float y, product_precision precision) {
  switch (precision) {
    case product_precision::bfloat16: return double(round_to_bfloat16(x)) * round_to_bfloat16(y);
    case product_precision::bfloat16x3: {
      const double x_hi = bfloat16x3_hi(x), y_hi = bfloat16x3_hi(y);
      return x_hi * y_hi + double(bfloat16x3_lo(x)) * y_hi + x_hi * double(bfloat16x3_lo(y));
    }
    case product_precision::single: break;
  }
  return double(x) * y;
}

// One product with padded leading dimensions and a double reference over its operands.
struct product {
  bool ta, tb;
  index_t m, n, k, lda, ldb, ldc;
  std::vector<float> a, b, c, bias;

  product(bool ta_, bool tb_, index_t m_, index_t n_, index_t k_, std::uint64_t seed)
      : ta(ta_), tb(tb_), m(m_), n(n_), k(k_), lda((ta_ ? m_ : k_) + 3), ldb((tb_ ? k_ : n_) + 5),
        ldc(n_ == 1 ? 1 : n_ + 2) {  // a single column stored tight: gemm's route for a matrix-vector product
    a = random_values(std::size_t((ta ? k : m) * lda), seed);
    b = random_values(std::size_t((tb ? n : k) * ldb), seed + 1);
    c = random_values(std::size_t(m * ldc), seed + 2);
    bias = random_values(std::size_t(n), seed + 3);
  }
  float op_a(index_t i, index_t p) const { return ta ? a[std::size_t(p * lda + i)] : a[std::size_t(i * lda + p)]; }
  float op_b(index_t p, index_t j) const { return tb ? b[std::size_t(j * ldb + p)] : b[std::size_t(p * ldb + j)]; }

  std::vector<float> run(product_precision precision, const epilogue<float>& ep, float beta) const {
    std::vector<float> out = c;
    kernels::cpu::gemm<float>(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, beta, out.data(), ldc, ep,
                              precision);
    return out;
  }

  // The largest error of out against alpha = 1 products of the operands as `operands` takes them (piece_product), in
  // double, plus beta * C and the bias, before the activation (applied to both); relative to the sum of the terms'
  // magnitudes. Infinite where the padding of C was touched.
  double worst_error(const std::vector<float>& out, product_precision operands, const epilogue<float>& ep,
                     float beta) const {
    double worst = 0;
    for (index_t i = 0; i < m; ++i) {
      for (index_t j = n; j < ldc; ++j)
        if (std::memcmp(&out[std::size_t(i * ldc + j)], &c[std::size_t(i * ldc + j)], sizeof(float)) != 0)
          return std::numeric_limits<double>::infinity();
      for (index_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (index_t p = 0; p < k; ++p) {
          const double term = piece_product(op_a(i, p), op_b(p, j), operands);
          sum += term;
          magnitude += std::abs(term);
        }
        sum += double(beta) * c[std::size_t(i * ldc + j)] + (ep.bias ? double(ep.bias[j]) : 0.0);
        magnitude += std::abs(double(beta) * c[std::size_t(i * ldc + j)]) + (ep.bias ? std::abs(ep.bias[j]) : 0.0f);
        if (ep.act == activation::relu) sum = std::max(sum, 0.0);
        worst = std::max(worst, std::abs(out[std::size_t(i * ldc + j)] - sum) / std::max(magnitude, 1e-30));
      }
    }
    return worst;
  }
};

// A Dense layer's forward product (64 x 784 times 784 x 128) twice, with the same values: B stored n x k (first;
// the bfloat16 path computes it as its transpose, C^T = B A^T) and B stored k x n (second; computed directly).
inline std::pair<product, product> forward_as_stored_both_ways() {
  product transposed(false, true, 64, 128, 784, 5);
  product direct(false, false, 64, 128, 784, 5);
  direct.a = transposed.a;
  direct.c = transposed.c;
  for (index_t p = 0; p < direct.k; ++p)
    for (index_t j = 0; j < direct.n; ++j)
      direct.b[std::size_t(p * direct.ldb + j)] = transposed.b[std::size_t(j * transposed.ldb + p)];
  return {std::move(transposed), std::move(direct)};
}

// A recurrent layer's W_hh packed once for this precision (rounded or split where the bfloat16 path takes it), then
// multiplied with gemm_prepacked_b: the bits of gemm on the unpacked matrix, with each engine of the bfloat16 path on
// alone and with both off (then single precision, packed and not).
inline void check_prepacked_b_has_gemm_bits(product_precision precision) {
  for_each_bfloat16_engine([precision](const char* engine) {
    CAPTURE(engine);
    const product step(false, true, 64, 128, 96, 9);
    std::vector<float> packed(std::size_t(kernels::cpu::packed_gemm_b_size<float>(step.k, step.n)));
    kernels::cpu::pack_gemm_b<float>(true, step.k, step.n, step.b.data(), step.ldb, packed.data(), precision);
    std::vector<float> out = step.c;
    kernels::cpu::gemm_prepacked_b<float>(false, step.m, step.n, step.k, 1.0f, step.a.data(), step.lda, packed.data(),
                                          0.0f, out.data(), step.ldc, {}, precision);
    const auto unpacked = step.run(precision, {}, 0.0f);
    CHECK(std::memcmp(out.data(), unpacked.data(), out.size() * sizeof(float)) == 0);
  });
}

// Calls check(pr, ep, beta, on_path) for products of every route gemm takes (direct, one column, outer product,
// narrow, blocked, the bfloat16 path), every transpose and two epilogues, with each engine of the bfloat16 path on
// alone and with both off; on_path says whether a product of this precision ran on the bfloat16 path. Single
// precision's results are checked here: within float rounding of the operands.
template <class Check>
void for_every_route(product_precision precision, Check&& check) {
  struct shape_case {
    index_t m, n, k;
    const char* route;
  };
  const shape_case shapes[] = {{4, 4, 8, "direct"},     {70, 1, 90, "one column"}, {33, 45, 1, "outer product"},
                               {64, 10, 128, "narrow"}, {37, 45, 71, "blocked"},   {64, 128, 784, "AMX tiles"},
                               {130, 96, 200, "AMX tiles, several row groups"}};
  for_each_bfloat16_engine([&](const char* engine) {
    for (const auto& s : shapes) {
      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          CAPTURE(engine);
          CAPTURE(s.route);
          CAPTURE(ta);
          CAPTURE(tb);
          const product pr(ta, tb, s.m, s.n, s.k, std::uint64_t(s.m * 1000 + s.n * 10 + s.k));
          const std::vector<float> bias = pr.bias;
          for (const auto& [ep, beta] : {std::pair{epilogue<float>{}, 0.0f},
                                         std::pair{epilogue<float>{bias.data(), activation::relu}, 0.5f}}) {
            const auto single = pr.run(product_precision::single, ep, beta);
            CHECK(pr.worst_error(single, product_precision::single, ep, beta) <= 2e-7 * double(s.k + 2));
            check(pr, ep, beta, rounds_products(precision) && std::strncmp(s.route, "AMX", 3) == 0);
          }
        }
      }
    }
  });
}

// A small MLP's losses and trained parameters after `steps` Adam steps on one batch, in static mode under Policy.
template <class Policy>
std::vector<float> static_mlp_losses(const Tensor<float>& x, const Tensor<std::int64_t>& y, int steps,
                                     std::vector<float>* trained = nullptr) {
  Sequential<Policy, Input<784>, Dense<128, ReLU>, Dense<10>> net(64, 7);
  optim::Adam opt({.lr = 1e-3});
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) losses.push_back(net.train_step(x, y, loss::cross_entropy{}, opt));
  if (trained)
    for (const auto& [name, tensor] : net.state_dict())
      trained->insert(trained->end(), tensor.data(), tensor.data() + tensor.numel());
  return losses;
}

// Normal inputs of the given shape and uniform labels below `classes`.
inline std::pair<Tensor<float>, Tensor<std::int64_t>> random_batch(shape s, std::uint64_t classes,
                                                                  random_generator& rng) {
  Tensor<float> x(s);
  Tensor<std::int64_t> y(shape{s[0]});
  for (auto& v : x.span()) v = rng.normal<float>();
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(classes));
  return {std::move(x), std::move(y)};
}

// An MNIST-like batch for the MLP above: 64 rows of 784 inputs uniform in [0, 1), labels below 10.
inline std::pair<Tensor<float>, Tensor<std::int64_t>> mnist_like_batch(std::uint64_t seed) {
  random_generator rng(seed);
  Tensor<float> x(shape{64, 784});
  Tensor<std::int64_t> y(shape{64});
  for (auto& v : x.span()) v = rng.uniform<float>(0.0f, 1.0f);
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(10));
  return {std::move(x), std::move(y)};
}

// Policy (a fixed-precision CPU policy, which is also this program's dynamic policy) trains a static MLP as dynamic
// mode does, bit for bit, with losses within `tolerance` (relative) of policy::cpu's; different from them where the
// products run on the bfloat16 path.
template <class Policy>
void check_mlp_in_both_modes(float tolerance) {
  const auto [x, y] = mnist_like_batch(3);
  std::vector<float> static_trained;
  const auto losses = static_mlp_losses<Policy>(x, y, 6, &static_trained);
  const auto float_losses = static_mlp_losses<policy::cpu>(x, y, 6);

  static_assert(std::is_same_v<nn::dynamic_policy, Policy>);
  Sequential<Policy, Input<784>, Dense<128, ReLU>, Dense<10>> reference(64, 7);
  manual_seed(7);
  nn::Sequential model(nn::Linear(784, 128), nn::ReLU(), nn::Linear(128, 10));
  const auto dynamic_initial = model.state_dict();
  for (const auto& [name, tensor] : reference.state_dict()) {
    CAPTURE(name);
    bool found = false;
    for (const auto& [other, values] : dynamic_initial)
      if (other == name) {
        found = true;
        CHECK(std::memcmp(values.data(), tensor.data(), std::size_t(tensor.numel()) * sizeof(float)) == 0);
      }
    CHECK(found);
  }
  optim::Adam opt(model.parameters(), {.lr = 1e-3});
  nn::Variable input(x);
  bool any_differs_from_float = false;
  for (std::size_t step = 0; step < losses.size(); ++step) {
    CAPTURE(step);
    opt.zero_grad();
    auto l = nn::cross_entropy(model(input), y);
    l.backward();
    opt.step();
    CHECK(l.item() == losses[step]);
    // The same training, close to single precision's: the arithmetic changed, the model did not.
    CHECK(std::abs(losses[step] - float_losses[step]) <= tolerance * std::abs(float_losses[step]));
    any_differs_from_float |= losses[step] != float_losses[step];
  }
  // The 784 x 128 layer's products run on the bfloat16 path where there is one for this precision.
  CHECK(any_differs_from_float == rounds_products(Policy::precision));
  std::vector<float> dynamic_trained;
  for (const auto& [name, tensor] : model.state_dict())
    dynamic_trained.insert(dynamic_trained.end(), tensor.data(), tensor.data() + tensor.numel());
  REQUIRE(dynamic_trained.size() == static_trained.size());
  CHECK(std::memcmp(dynamic_trained.data(), static_trained.data(), static_trained.size() * sizeof(float)) == 0);
}

// Policy (as above) runs a CNN and an LSTM in both modes with the same bits.
template <class Policy>
void check_cnn_and_lstm_in_both_modes() {
  random_generator rng(8);
  SUBCASE("Conv2D") {
    using Net = Sequential<Policy, Input<3, 16, 16>, Conv2D<32, 3, conv_options{.padding = 1}>, ReLU, MaxPool2D<2>,
                           Flatten, Dense<10>>;
    Net net(16, 4);
    net.set_options({.flat_parameters = false});  // one slot per tensor in both modes (see test_cnn_layers)
    manual_seed(4);
    nn::Sequential model(nn::Conv2d(3, 32, 3, 1, 1), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                         nn::Linear(32 * 8 * 8, 10));
    check_same_losses(net, model, random_batch(shape{16, 3, 16, 16}, 10, rng), 3);
  }
  SUBCASE("LSTM") {
    using Net = Sequential<Policy, Input<12, 32>, FinalState<LSTM<96>>, Dense<5>>;
    Net net(32, 6);
    manual_seed(6);
    nn::Sequential model(nn::FinalState(nn::LSTM(32, 96, {.batch_first = true})), nn::Linear(96, 5));
    check_same_losses(net, model, random_batch(shape{32, 12, 32}, 5, rng), 3);
  }
}

// set_default_product_precision(Policy::precision) switches policy::cpu to Policy's arithmetic, and back.
template <class Policy>
void check_global_switch() {
  const auto [x, y] = mnist_like_batch(12);
  REQUIRE(kernels::cpu::default_product_precision() == product_precision::single);
  const auto single = static_mlp_losses<policy::cpu>(x, y, 3);
  kernels::cpu::set_default_product_precision(Policy::precision);
  const auto switched = static_mlp_losses<policy::cpu>(x, y, 3);
  kernels::cpu::set_default_product_precision(product_precision::single);
  const auto fixed_in_type = static_mlp_losses<Policy>(x, y, 3);
  const auto back = static_mlp_losses<policy::cpu>(x, y, 3);
  CHECK(switched == fixed_in_type);
  CHECK(back == single);
  CHECK((switched != single) == rounds_products(Policy::precision));
}

}  // namespace kiln::precision_test
