// Static mode: compile-time shapes, planned workspace, flat parameters, training.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "kiln/kiln.hpp"

using namespace kiln;

TEST_CASE("static MLP infers shapes and counts parameters") {
  using Net = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>, LogSoftmax<1>>;
  static_assert(std::is_same_v<Net::output_shape, dims<10>>);
  static_assert(Net::parameter_count() == 784 * 128 + 128 + 128 * 10 + 10);
  Net net(64, 42);
  auto names = Net::named_parameter_infos();
  REQUIRE(names.size() == 4);
  CHECK(names[0].name == "1.weight");
  CHECK(names[0].shape == shape{128, 784});
  CHECK(names[1].name == "1.bias");
  CHECK(names[2].name == "3.weight");
  CHECK(names[3].name == "3.bias");
  Tensor<float> x(shape{5, 28, 28}, 0.5f);
  auto y = net.forward(x);
  CHECK(y.shape() == shape{5, 10});
  double total = 0;
  for (int c = 0; c < 10; ++c) total += std::exp(y[c]);
  CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
  CHECK_THROWS_AS(net.forward(Tensor<float>(shape{65, 28, 28})), kiln::error);
  CHECK_THROWS_AS(net.forward(Tensor<float>(shape{2, 27, 28})), kiln::error);
}

TEST_CASE("static MLP learns a regression") {
  using Net = Sequential<policy::cpu, Input<4>, Dense<16, Tanh>, Dense<1>>;
  Net net(32, 1);
  random_generator rng(5);
  Tensor<float> x(shape{32, 4}), y(shape{32, 1});
  for (index_t i = 0; i < 32; ++i) {
    float s = 0;
    for (int j = 0; j < 4; ++j) s += (x.at(i, j) = rng.normal<float>()) * float(j + 1) * 0.25f;
    y.at(i, 0) = std::sin(s);
  }
  optim::Adam opt({.lr = 1e-2});
  float first = net.train_step(x, y, loss::mse{}, opt);
  float last = first;
  for (int step = 0; step < 300; ++step) last = net.train_step(x, y, loss::mse{}, opt);
  CHECK(last < 0.05f * first);
}

TEST_CASE("static model whose first layer is an activation") {
  // The pass-through test for a fused activation looked at the layer before the first one, which does not exist:
  // this model did not compile once forward was used.
  using Net = Sequential<policy::cpu, Input<5>, ReLU, Dense<3>>;
  Net net(4, 11);
  Tensor<float> x(shape{2, 5}, {-1, 2, -3, 4, -5, 1, -2, 3, -4, 5});
  auto y = net.predict(x);
  auto state = net.state_dict();
  REQUIRE(state.size() == 2);
  const Tensor<float>& weight = state[0].second;  // (3, 5)
  const Tensor<float>& bias = state[1].second;
  for (index_t s = 0; s < 2; ++s)
    for (index_t o = 0; o < 3; ++o) {
      double expected = bias[o];
      for (index_t i = 0; i < 5; ++i) expected += double(weight.at(o, i)) * std::max(0.0, double(x.at(s, i)));
      CHECK(y.at(s, o) == doctest::Approx(expected).epsilon(1e-5));
    }
}
