// Products of bfloat16 operands (product_precision::bfloat16, policy::cpu_bf16): rounding to nearest with ties to
// even; the products on AMX tiles against a double reference over the rounded operands, every other route with
// single precision's bits; prepacked right-hand sides; both modes under policy::cpu_bf16 giving the same bits. The
// checks that bfloat16 changed a result are skipped where the CPU has no AMX (there nothing changes). Dynamic mode's
// policy is chosen before kiln is included, for this whole program.
#define KILN_DYNAMIC_POLICY ::kiln::policy::cpu_bf16
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kiln/core/threads.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using kernels::cpu::epilogue;
using kernels::cpu::product_precision;
using kernels::cpu::round_to_bfloat16;

namespace {

constexpr auto bf16 = product_precision::bfloat16;
const bool no_amx = !kernels::cpu::amx_gemm_active();

float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }

std::vector<float> random_values(std::size_t count, std::uint64_t seed) {
  random_generator rng(seed);
  std::vector<float> v(count);
  for (auto& x : v) x = rng.uniform<float>(-1.0f, 1.0f);
  return v;
}

// One product with padded leading dimensions and a double reference over its operands, rounded or not.
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

  // The largest error of out against alpha = 1 products of the operands (rounded to bfloat16 or as they are) in
  // double, plus beta * C and the bias, before the activation (applied to both); relative to the sum of the terms'
  // magnitudes. Infinite where the padding of C was touched.
  double worst_error(const std::vector<float>& out, bool rounded, const epilogue<float>& ep, float beta) const {
    double worst = 0;
    for (index_t i = 0; i < m; ++i) {
      for (index_t j = n; j < ldc; ++j)
        if (std::memcmp(&out[std::size_t(i * ldc + j)], &c[std::size_t(i * ldc + j)], sizeof(float)) != 0)
          return std::numeric_limits<double>::infinity();
      for (index_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (index_t p = 0; p < k; ++p) {
          const double x = rounded ? round_to_bfloat16(op_a(i, p)) : op_a(i, p);
          const double y = rounded ? round_to_bfloat16(op_b(p, j)) : op_b(p, j);
          sum += x * y;
          magnitude += std::abs(x * y);
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
std::pair<Tensor<float>, Tensor<std::int64_t>> random_batch(shape s, std::uint64_t classes, random_generator& rng) {
  Tensor<float> x(s);
  Tensor<std::int64_t> y(shape{s[0]});
  for (auto& v : x.span()) v = rng.normal<float>();
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(classes));
  return {std::move(x), std::move(y)};
}

// `steps` Adam steps of the static `net` and of the dynamic `model` (the same weights) on one batch: equal losses.
template <class Net>
void check_same_losses(Net& net, nn::Sequential& model,
                       const std::pair<Tensor<float>, Tensor<std::int64_t>>& batch, int steps) {
  const auto& [x, y] = batch;
  optim::Adam static_opt({.lr = 1e-3});
  optim::Adam dynamic_opt(model.parameters(), {.lr = 1e-3});
  nn::Variable input(x);
  for (int step = 0; step < steps; ++step) {
    const float s = net.train_step(x, y, loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    auto l = nn::cross_entropy(model(input), y);
    l.backward();
    dynamic_opt.step();
    CHECK(s == l.item());
  }
}

}  // namespace

TEST_CASE("rounding to bfloat16: to nearest, ties to even, infinities and NaN kept") {
  CHECK(round_to_bfloat16(1.0f) == 1.0f);
  CHECK(round_to_bfloat16(1.0f + 0x1p-8f) == 1.0f);                            // a tie, down to the even 1
  CHECK(round_to_bfloat16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);              // a tie, up to the even neighbour
  CHECK(round_to_bfloat16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);       // past the tie: up
  CHECK(round_to_bfloat16(-(1.0f + 0x1p-8f + 0x1p-20f)) == -(1.0f + 0x1p-7f));  // the same below zero
  CHECK(round_to_bfloat16(0.1f) == from_bits(0x3DCD0000u));
  CHECK(round_to_bfloat16(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(round_to_bfloat16(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  CHECK(round_to_bfloat16(from_bits(0x7F7F0000u)) == from_bits(0x7F7F0000u));  // bfloat16's largest stays
  const float nan = round_to_bfloat16(from_bits(0xFFFFFFFFu));
  CHECK(std::isnan(nan));
  CHECK(std::signbit(nan));
  CHECK(std::isnan(round_to_bfloat16(from_bits(0x7F800001u))));  // a signalling NaN whose payload is all low bits
  CHECK((std::bit_cast<std::uint32_t>(round_to_bfloat16(0.3f)) & 0xFFFFu) == 0u);
}

TEST_CASE("a product with one term per output on AMX tiles gives each operand rounded" * doctest::skip(no_amx)) {
  // A holds one 1 per row, so that every output is one element of B rounded: the rounding the packing does must be
  // round_to_bfloat16's, bit for bit, halfway cases included, whichever way B is stored.
  const index_t m = 48, n = 128, k = 160;  // n * k >= 128^2: on the tiles
  std::vector<float> b_values = random_values(std::size_t(k * n), 11);
  // Halfway cases (0x3F808000: ties to the even 1) and their neighbours. (No infinities: the zeros of A would make
  // NaN of them in every other row.)
  for (std::size_t i = 0; i < b_values.size(); i += 7) b_values[i] = from_bits(0x3F808000u + std::uint32_t(i % 3));
  b_values[9] = from_bits(0x3F818000u);  // a tie up to the even neighbour
  for (const bool tb : {false, true}) {  // B stored n x k is packed through 16 x 16 transposes
    CAPTURE(tb);
    std::vector<float> a(std::size_t(m * k), 0.0f), b(std::size_t(k * n)), c(std::size_t(m * n));
    for (index_t i = 0; i < m; ++i) a[std::size_t(i * k + (i * 37) % k)] = 1.0f;
    for (index_t p = 0; p < k; ++p)
      for (index_t j = 0; j < n; ++j) b[std::size_t(tb ? j * k + p : p * n + j)] = b_values[std::size_t(p * n + j)];
    kernels::cpu::gemm<float>(false, tb, m, n, k, 1.0f, a.data(), k, b.data(), tb ? k : n, 0.0f, c.data(), n, {},
                              bf16);
    int differing = 0;
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) {
        const float expected = round_to_bfloat16(b_values[std::size_t(((i * 37) % k) * n + j)]);
        differing += std::memcmp(&expected, &c[std::size_t(i * n + j)], sizeof(float)) != 0;
      }
    CHECK(differing == 0);
  }
}

TEST_CASE("bfloat16 operands: float sums of the rounded operands on AMX tiles, single precision's bits elsewhere") {
  struct shape_case {
    index_t m, n, k;
    const char* route;
  };
  const shape_case shapes[] = {{4, 4, 8, "direct"},      {70, 1, 90, "one column"}, {33, 45, 1, "outer product"},
                               {64, 10, 128, "narrow"},  {37, 45, 71, "blocked"},   {64, 128, 784, "AMX tiles"},
                               {130, 96, 200, "AMX tiles, several row groups"}};
  for (const bool amx : {true, false}) {
    if (amx && no_amx) continue;
    kernels::cpu::set_amx_gemm(amx);
    for (const auto& s : shapes) {
      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          CAPTURE(amx);
          CAPTURE(s.route);
          CAPTURE(ta);
          CAPTURE(tb);
          const product pr(ta, tb, s.m, s.n, s.k, std::uint64_t(s.m * 1000 + s.n * 10 + s.k));
          const std::vector<float> bias = pr.bias;
          for (const auto& [ep, beta] : {std::pair{epilogue<float>{}, 0.0f},
                                         std::pair{epilogue<float>{bias.data(), activation::relu}, 0.5f}}) {
            const auto out = pr.run(bf16, ep, beta);
            const auto single = pr.run(product_precision::single, ep, beta);
            // Single precision: within float rounding of the exact operands.
            CHECK(pr.worst_error(single, false, ep, beta) <= 2e-7 * double(s.k + 2));
            if (amx && std::strncmp(s.route, "AMX", 3) == 0) {
              // Against the rounded operands: a float dot product's error (k terms, each sum rounded once). Against
              // the operands themselves the rounding shows (bfloat16 keeps 8 bits).
              CHECK(pr.worst_error(out, true, ep, beta) <= 2e-7 * double(s.k + 2));
              CHECK(pr.worst_error(out, false, ep, beta) > 1e-4);
            } else {  // too small for the tiles, or no tiles: single precision, bit for bit
              CHECK(std::memcmp(out.data(), single.data(), out.size() * sizeof(float)) == 0);
            }
          }
        }
      }
    }
  }
  kernels::cpu::set_amx_gemm(!no_amx);  // as the test started (KILN_AMX=0 keeps it off)
}

TEST_CASE("bfloat16 products: the same bits on one thread and two, and with the right-hand side packed once") {
  // (Without AMX these are single precision's products, whose bits test_gemm checks the same way.)
  const product pr(false, true, 64, 128, 784, 5);
  const index_t saved_threads = num_threads();
  set_num_threads(1);
  const auto one = pr.run(bf16, {}, 0.0f);
  set_num_threads(2);
  const auto two = pr.run(bf16, {}, 0.0f);
  set_num_threads(saved_threads);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);

  for (const bool amx : {true, false}) {
    CAPTURE(amx);
    kernels::cpu::set_amx_gemm(amx);  // off (or no AMX): single precision, packed and not
    // A recurrent layer's W_hh: packed once (rounded), then multiplied by several left-hand sides.
    const product step(false, true, 64, 128, 96, 9);
    std::vector<float> packed(std::size_t(kernels::cpu::packed_gemm_b_size<float>(step.k, step.n)));
    kernels::cpu::pack_gemm_b<float>(true, step.k, step.n, step.b.data(), step.ldb, packed.data(), bf16);
    std::vector<float> out = step.c;
    kernels::cpu::gemm_prepacked_b<float>(false, step.m, step.n, step.k, 1.0f, step.a.data(), step.lda, packed.data(),
                                          0.0f, out.data(), step.ldc, {}, bf16);
    const auto direct = step.run(bf16, {}, 0.0f);
    CHECK(std::memcmp(out.data(), direct.data(), out.size() * sizeof(float)) == 0);
  }
  kernels::cpu::set_amx_gemm(!no_amx);  // as the test started (KILN_AMX=0 keeps it off)
}

TEST_CASE("policy::cpu_bf16 trains a static MLP as dynamic mode does, bit for bit, near policy::cpu's losses") {
  random_generator rng(3);
  Tensor<float> x(shape{64, 784});
  Tensor<std::int64_t> y(shape{64});
  for (auto& v : x.span()) v = rng.uniform<float>(0.0f, 1.0f);
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(10));

  std::vector<float> static_trained;
  const auto bf16_losses = static_mlp_losses<policy::cpu_bf16>(x, y, 6, &static_trained);
  const auto float_losses = static_mlp_losses<policy::cpu>(x, y, 6);

  // Dynamic mode runs policy::cpu_bf16 in this program (KILN_DYNAMIC_POLICY above).
  static_assert(std::is_same_v<nn::dynamic_policy, policy::cpu_bf16>);
  Sequential<policy::cpu_bf16, Input<784>, Dense<128, ReLU>, Dense<10>> reference(64, 7);
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
  for (std::size_t step = 0; step < bf16_losses.size(); ++step) {
    CAPTURE(step);
    opt.zero_grad();
    auto l = nn::cross_entropy(model(input), y);
    l.backward();
    opt.step();
    CHECK(l.item() == bf16_losses[step]);
    // The same training, a few thousandths apart from single precision's: the arithmetic changed, the model did not.
    CHECK(std::abs(bf16_losses[step] - float_losses[step]) <= 1e-2f * std::abs(float_losses[step]));
    any_differs_from_float |= bf16_losses[step] != float_losses[step];
  }
  CHECK(any_differs_from_float != no_amx);  // the 784 x 128 layer's products run on AMX tiles where there are any
  std::vector<float> dynamic_trained;
  for (const auto& [name, tensor] : model.state_dict())
    dynamic_trained.insert(dynamic_trained.end(), tensor.data(), tensor.data() + tensor.numel());
  REQUIRE(dynamic_trained.size() == static_trained.size());
  CHECK(std::memcmp(dynamic_trained.data(), static_trained.data(), static_trained.size() * sizeof(float)) == 0);
}

TEST_CASE("policy::cpu_bf16 runs convolutions and recurrent layers in both modes with the same bits") {
  random_generator rng(8);
  SUBCASE("Conv2D") {
    using Net = Sequential<policy::cpu_bf16, Input<3, 16, 16>, Conv2D<32, 3, conv_options{.padding = 1}>, ReLU,
                           MaxPool2D<2>, Flatten, Dense<10>>;
    Net net(16, 4);
    net.set_options({.flat_parameters = false});  // one slot per tensor in both modes (see test_cnn_layers)
    manual_seed(4);
    nn::Sequential model(nn::Conv2d(3, 32, 3, 1, 1), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                         nn::Linear(32 * 8 * 8, 10));
    check_same_losses(net, model, random_batch(shape{16, 3, 16, 16}, 10, rng), 3);
  }
  SUBCASE("LSTM") {
    using Net = Sequential<policy::cpu_bf16, Input<12, 32>, FinalState<LSTM<96>>, Dense<5>>;
    Net net(32, 6);
    manual_seed(6);
    nn::Sequential model(nn::FinalState(nn::LSTM(32, 96, {.batch_first = true})), nn::Linear(96, 5));
    check_same_losses(net, model, random_batch(shape{32, 12, 32}, 5, rng), 3);
  }
}

TEST_CASE("set_default_product_precision switches policy::cpu to bfloat16 operands and back") {
  random_generator rng(12);
  Tensor<float> x(shape{64, 784});
  Tensor<std::int64_t> y(shape{64});
  for (auto& v : x.span()) v = rng.uniform<float>(0.0f, 1.0f);
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(10));
  REQUIRE(kernels::cpu::default_product_precision() == product_precision::single);
  const auto single = static_mlp_losses<policy::cpu>(x, y, 3);
  kernels::cpu::set_default_product_precision(bf16);
  const auto switched = static_mlp_losses<policy::cpu>(x, y, 3);
  kernels::cpu::set_default_product_precision(product_precision::single);
  const auto fixed_in_type = static_mlp_losses<policy::cpu_bf16>(x, y, 3);
  const auto back = static_mlp_losses<policy::cpu>(x, y, 3);
  CHECK(switched == fixed_in_type);
  CHECK(back == single);
  CHECK((switched != single) != no_amx);
}
