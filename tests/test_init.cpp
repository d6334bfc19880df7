// Weight initialisers over whole tensors (torch.nn.init's and Keras' formulas): fans from shapes, gains, the
// distributions' bounds and moments, orthogonality, and the same initialisation in static and dynamic mode.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

struct moments {
  double mean = 0, stddev = 0, max_abs = 0;
};
moments moments_of(const Tensor<float>& t) {
  moments m;
  for (float v : t.span()) m.mean += v, m.max_abs = std::max(m.max_abs, double(std::abs(v)));
  m.mean /= double(t.numel());
  for (float v : t.span()) m.stddev += (v - m.mean) * (v - m.mean);
  m.stddev = std::sqrt(m.stddev / double(t.numel()));
  return m;
}

// Checks that a tensor's samples have mean 0 and the given standard deviation (to 2%, far beyond what 100,000
// samples leave to chance: their standard deviation's own relative spread is about 0.2%).
void check_zero_mean_with_stddev(const Tensor<float>& t, double stddev) {
  moments m = moments_of(t);
  CHECK(std::abs(m.mean) < 5 * stddev / std::sqrt(double(t.numel())));
  CHECK(m.stddev == doctest::Approx(stddev).epsilon(0.02));
}

// The largest |(W W^T)[i][j] - gain^2 [i == j]| over rows i, j of w viewed as a matrix of its first dimension's rows.
double distance_from_orthogonal(const Tensor<float>& w, bool rows, double gain) {
  index_t r = w.extent(0), c = w.numel() / r;
  index_t count = rows ? r : c, length = rows ? c : r;
  auto at = [&](index_t j, index_t i) { return double(rows ? w[j * c + i] : w[i * c + j]); };
  double worst = 0;
  for (index_t a = 0; a < count; ++a)
    for (index_t b = 0; b < count; ++b) {
      double dot = 0;
      for (index_t i = 0; i < length; ++i) dot += at(a, i) * at(b, i);
      worst = std::max(worst, std::abs(dot - (a == b ? gain * gain : 0.0)));
    }
  return worst;
}

}  // namespace

TEST_CASE("fans follow PyTorch's rule and gains torch.nn.init.calculate_gain") {
  CHECK(init::fans_of(shape{3, 5}).in == 5);
  CHECK(init::fans_of(shape{3, 5}).out == 3);
  auto conv = init::fans_of(shape{8, 4, 3, 3});  // (out, in / groups, kh, kw)
  CHECK(conv.in == 36);
  CHECK(conv.out == 72);
  CHECK_THROWS_WITH_AS(init::fans_of(shape{7}, "init::xavier_uniform"),
                       doctest::Contains("init::xavier_uniform: expected a weight of rank 2 or more"), kiln::error);

  using init::nonlinearity;
  CHECK(init::calculate_gain(nonlinearity::linear) == 1.0);
  CHECK(init::calculate_gain(nonlinearity::sigmoid) == 1.0);
  CHECK(init::calculate_gain(nonlinearity::tanh) == doctest::Approx(5.0 / 3));
  CHECK(init::calculate_gain(nonlinearity::relu) == doctest::Approx(std::sqrt(2.0)));
  CHECK(init::calculate_gain(nonlinearity::leaky_relu) == doctest::Approx(std::sqrt(2.0 / 1.0001)));
  CHECK(init::calculate_gain(nonlinearity::leaky_relu, 0.2) == doctest::Approx(std::sqrt(2.0 / 1.04)));
  CHECK(init::calculate_gain(nonlinearity::selu) == 0.75);
}

TEST_CASE("uniform initialisers stay inside their bounds and fill them") {
  random_generator rng(3);
  Tensor<float> w(shape{256, 512});
  auto check_bound = [&](double bound) {
    moments m = moments_of(w);
    CHECK(m.max_abs <= bound * (1 + 1e-6));
    CHECK(m.max_abs > 0.999 * bound);
    check_zero_mean_with_stddev(w, bound / std::sqrt(3.0));  // U(-b, b) has variance b^2 / 3
  };
  init::xavier_uniform(w.view(), rng);
  check_bound(std::sqrt(6.0 / (256 + 512)));
  init::xavier_uniform(w.view(), rng, 2.0);
  check_bound(2 * std::sqrt(6.0 / (256 + 512)));
  init::glorot_uniform(w.view(), rng);
  check_bound(std::sqrt(6.0 / (256 + 512)));
  init::kaiming_uniform(w.view(), rng);  // torch's defaults: a = 0, fan_in, leaky_relu: sqrt(6 / fan_in)
  check_bound(std::sqrt(6.0 / 512));
  init::kaiming_uniform(w.view(), rng, {.mode = init::fan_mode::fan_out, .nonlinear = init::nonlinearity::tanh});
  check_bound(5.0 / 3 * std::sqrt(3.0 / 256));
  init::he_uniform(w.view(), rng);
  check_bound(std::sqrt(6.0 / 512));
  init::lecun_uniform(w.view(), rng);
  check_bound(std::sqrt(3.0 / 512));
  init::uniform(w.view(), rng, -0.25, 0.25);
  check_bound(0.25);
  // a = sqrt(5) is nn.Linear's default: U(-1 / sqrt(fan_in), 1 / sqrt(fan_in)).
  init::kaiming_uniform(w.view(), rng, {.a = std::sqrt(5.0)});
  check_bound(1 / std::sqrt(512.0));
}

TEST_CASE("normal initialisers have the standard deviation of their formula") {
  random_generator rng(5);
  Tensor<float> conv(shape{64, 32, 7, 7});  // fan_in 1568, fan_out 3136
  init::kaiming_normal(conv.view(), rng, {.mode = init::fan_mode::fan_out, .nonlinear = init::nonlinearity::relu});
  check_zero_mean_with_stddev(conv, std::sqrt(2.0 / 3136));
  init::xavier_normal(conv.view(), rng, 0.5);
  check_zero_mean_with_stddev(conv, 0.5 * std::sqrt(2.0 / (1568 + 3136)));
  init::normal(conv.view(), rng, 0.0, 0.02);
  check_zero_mean_with_stddev(conv, 0.02);

  // Truncated: nothing beyond the bounds, and the unit normal cut at +-2 keeps a standard deviation of 0.8796.
  init::trunc_normal(conv.view(), rng);
  CHECK(moments_of(conv).max_abs <= 2.0);
  check_zero_mean_with_stddev(conv, 0.87962566103423978);
  init::trunc_normal(conv.view(), rng, 1.0, 0.5, 0.0, 1.0);
  CHECK(*std::min_element(conv.span().begin(), conv.span().end()) >= 0.0f);
  CHECK(*std::max_element(conv.span().begin(), conv.span().end()) <= 1.0f);
  // Keras' truncated variants scale up so that the truncated draw keeps the intended variance.
  init::he_normal(conv.view(), rng);
  check_zero_mean_with_stddev(conv, std::sqrt(2.0 / 1568));
  CHECK(moments_of(conv).max_abs <= 2 * std::sqrt(2.0 / 1568) / 0.87962566103423978 * (1 + 1e-6));
  init::glorot_normal(conv.view(), rng);
  check_zero_mean_with_stddev(conv, std::sqrt(2.0 / (1568 + 3136)));
  init::lecun_normal(conv.view(), rng);
  check_zero_mean_with_stddev(conv, std::sqrt(1.0 / 1568));

  init::ones(conv.view());
  CHECK(moments_of(conv).mean == 1.0);
  init::zeros(conv.view());
  CHECK(moments_of(conv).max_abs == 0.0);
}

TEST_CASE("orthogonal gives orthonormal rows or columns, times the gain") {
  random_generator rng(9);
  Tensor<float> wide(shape{20, 50}), tall(shape{50, 20}), conv(shape{8, 2, 3, 3}), square(shape{32, 32});
  init::orthogonal(wide.view(), rng);
  CHECK(distance_from_orthogonal(wide, true, 1.0) < 1e-5);
  init::orthogonal(tall.view(), rng);
  CHECK(distance_from_orthogonal(tall, false, 1.0) < 1e-5);
  init::orthogonal(conv.view(), rng, 2.0);  // 8 rows of 18
  CHECK(distance_from_orthogonal(conv, true, 2.0) < 1e-5);
  init::orthogonal(square.view(), rng);
  CHECK(distance_from_orthogonal(square, true, 1.0) < 1e-5);
  CHECK(distance_from_orthogonal(square, false, 1.0) < 1e-5);
}

TEST_CASE("initialisers refuse what they cannot fill") {
  random_generator rng(1);
  Tensor<float> bias(shape{10}), w(shape{4, 4});
  CHECK_THROWS_WITH_AS(init::xavier_uniform(bias.view(), rng),
                       doctest::Contains("xavier_uniform: expected a weight of rank 2 or more to compute its fans"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(init::orthogonal(bias.view(), rng), doctest::Contains("rank 2 or more"), kiln::error);
  CHECK_THROWS_WITH_AS(init::trunc_normal(w.view(), rng, 0.0, 1.0, 1.0, -1.0),
                       doctest::Contains("expected a < b, found a = 1 and b = -1"), kiln::error);
  CHECK_THROWS_WITH_AS(init::trunc_normal(w.view(), rng, 0.0, 1.0, 8.0, 9.0),
                       doctest::Contains("expected [a, b] to hold at least 0.1%"), kiln::error);
  CHECK_THROWS_WITH_AS(init::uniform(w.view(), rng, 1.0, 0.0), doctest::Contains("expected low <= high"), kiln::error);
  CHECK_THROWS_WITH_AS(init::normal(w.view(), rng, 0.0, -1.0), doctest::Contains("expected stddev >= 0"), kiln::error);
  Tensor<float> empty(shape{3, 0});  // as torch: nothing to fill, nothing done
  CHECK_NOTHROW(init::kaiming_uniform(empty.view(), rng));
  CHECK_NOTHROW(init::he_normal(empty.view(), rng));
}

// Equal weights give bit-identical losses in both modes ("static and dynamic mode: same seed, same weights,
// bit-identical losses" in test_dynamic.cpp), so equal weights are what this checks.
TEST_CASE("static and dynamic mode: the same initialiser from the same generator, the same weights") {
  using Net = Sequential<policy::cpu, Input<4>, Dense<8, ReLU>, Dense<3>>;
  Net net(16, 21);
  manual_seed(99);  // another seed: only the initialisers below decide the weights
  nn::Sequential model(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3));
  auto parameter = [&](const std::string& name) {
    for (auto& [n, v] : model.named_parameters())
      if (n == name) return v;
    FAIL("no parameter ", name);
    return nn::Variable();
  };

  random_generator static_rng(7), dynamic_rng(7);
  init::glorot_uniform(net.parameter("0.weight"), static_rng);
  init::zeros(net.parameter("0.bias"));
  init::orthogonal(net.parameter("2.weight"), static_rng, 0.5);
  init::constant(net.parameter("2.bias"), 0.1);
  nn::init::glorot_uniform(parameter("0.weight"), &dynamic_rng);
  nn::init::zeros(parameter("0.bias"));
  nn::init::orthogonal(parameter("2.weight"), 0.5, &dynamic_rng);
  nn::init::constant(parameter("2.bias"), 0.1);

  auto static_dict = net.state_dict();
  auto dynamic_dict = model.state_dict();
  REQUIRE(static_dict.size() == dynamic_dict.size());
  for (std::size_t i = 0; i < static_dict.size(); ++i)
    for (index_t j = 0; j < static_dict[i].second.numel(); ++j)
      CHECK(static_dict[i].second[j] == dynamic_dict[i].second[j]);
  CHECK(static_dict[3].second[2] == 0.1f);

  CHECK(net.parameter("2.weight").shape() == shape{3, 8});
  CHECK_THROWS_WITH_AS(net.parameter("1.weight"),
                       doctest::Contains("expected one of the parameter names 0.weight, 0.bias, 2.weight, 2.bias, "
                                         "found '1.weight'"),
                       kiln::error);
}

TEST_CASE("dynamic initialisers without a generator draw from the seeded initialisation streams") {
  auto draw = [] {
    manual_seed(5);
    nn::Linear layer(30, 20);
    nn::init::kaiming_normal(layer.weight, {.nonlinear = init::nonlinearity::relu});
    return layer.weight.tensor();
  };
  Tensor<float> a = draw(), b = draw();
  CHECK(std::equal(a.span().begin(), a.span().end(), b.span().begin()));
  CHECK(moments_of(a).stddev == doctest::Approx(std::sqrt(2.0 / 30)).epsilon(0.15));  // loose: only 600 samples
  nn::Linear other(30, 20);  // the next stream: different values
  nn::init::kaiming_normal(other.weight, {.nonlinear = init::nonlinearity::relu});
  CHECK(other.weight.tensor()[0] != a[0]);
}

TEST_CASE("Module::apply visits every module, children first, for initialising layers by kind") {
  manual_seed(3);
  nn::Sequential model(nn::Linear(6, 40), nn::ReLU(), nn::Sequential(nn::Linear(40, 40), nn::Tanh()),
                       nn::Linear(40, 2));
  std::vector<std::string> visited;
  model.apply([&](nn::Module& m) {
    visited.push_back(m.name());
    if (auto* linear = dynamic_cast<nn::Linear*>(&m)) {
      nn::init::xavier_uniform(linear->weight);
      nn::init::zeros(linear->bias);
    }
  });
  CHECK(visited == std::vector<std::string>{"Linear", "ReLU", "Linear", "Tanh", "Sequential", "Linear",
                                            "Sequential"});
  for (auto& [name, p] : model.named_parameters()) {
    Tensor<float> values = p.tensor();
    if (name.ends_with("bias")) {
      CHECK(moments_of(values).max_abs == 0.0);
    } else {
      double bound = std::sqrt(6.0 / double(p.shape()[0] + p.shape()[1]));
      CHECK(moments_of(values).max_abs <= bound * (1 + 1e-6));
      CHECK(moments_of(values).max_abs > 0.8 * bound);
    }
  }
}
