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

TEST_CASE("a copied static model is a model of its own") {
  using Net = Sequential<policy::cpu, Input<6>, Dense<8, ReLU>, Dense<3>>;
  auto original = std::make_unique<Net>(4, 21);
  Tensor<float> x(shape{4, 6});
  Tensor<std::int64_t> y(shape{4}, {0, 1, 2, 1});
  for (index_t i = 0; i < x.numel(); ++i) x[i] = float(i % 7) * 0.25f - 0.5f;
  optim::Adam opt({.lr = 1e-2});
  original->train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
  original->freeze(0);

  Net copy = *original;
  CHECK(copy.is_frozen(0));
  auto a = original->predict(x), b = copy.predict(x);
  CHECK(std::equal(a.span().begin(), a.span().end(), b.span().begin()));
  // The copy's forward writes its own workspace, and unfreezing it leaves the original frozen.
  CHECK(copy.forward(x.view()).data() != original->last_output().data());
  copy.unfreeze(0);
  CHECK(original->is_frozen(0));
  // It outlives the original (the member-wise copy read the original's freed workspace here).
  original.reset();
  auto c = copy.predict(x);
  CHECK(std::equal(b.span().begin(), b.span().end(), c.span().begin()));
  // And trains with an optimizer of its own.
  optim::Adam copy_opt({.lr = 1e-2});
  CHECK(std::isfinite(copy.train_step(x.view(), y.view(), loss::cross_entropy{}, copy_opt)));
}

TEST_CASE("static models refuse an optimizer holding another model's parameters, and impossible batch sizes") {
  using Net = Sequential<policy::cpu, Input<6>, Dense<3>>;
  Net first(4, 1), second(4, 2);
  Tensor<float> x(shape{4, 6}, 0.5f);
  Tensor<std::int64_t> y(shape{4}, {0, 1, 2, 1});
  optim::Adam opt({.lr = 1e-2});
  first.train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
  // Shared, it kept updating the first model and never trained the second.
  CHECK_THROWS_WITH_AS(second.train_step(x.view(), y.view(), loss::cross_entropy{}, opt),
                       doctest::Contains("another model's"), kiln::error);
  // Freezing a layer without parameters froze nothing, silently.
  Sequential<policy::cpu, Input<6>, Dense<3, ReLU>, Dropout<0.5>, Dense<2>> with_dropout(4);
  CHECK_THROWS_WITH_AS(with_dropout.freeze(1), doctest::Contains("which has none"), kiln::error);
  // A freeze after the optimizer took the flat buffer was ignored: the frozen layer went on training.
  Sequential<policy::cpu, Input<6>, Dense<4, ReLU>, Dense<3>> late(4, 3);
  optim::Adam late_opt({.lr = 1e-2});
  late.train_step(x.view(), y.view(), loss::cross_entropy{}, late_opt);
  late.freeze(0);
  CHECK_THROWS_WITH_AS(late.train_step(x.view(), y.view(), loss::cross_entropy{}, late_opt),
                       doctest::Contains("layer 0 (Dense+ReLU) is frozen, but the optimizer took the parameters "
                                         "as one flat buffer"),
                       kiln::error);
  // A new optimizer takes per-layer slots, which honour the freeze and a later unfreeze.
  optim::Adam fresh_opt({.lr = 1e-2});
  const auto before = late.state_dict();
  late.train_step(x.view(), y.view(), loss::cross_entropy{}, fresh_opt);
  const auto after = late.state_dict();
  CHECK(std::equal(before[0].second.span().begin(), before[0].second.span().end(), after[0].second.span().begin()));
  CHECK(!std::equal(before[2].second.span().begin(), before[2].second.span().end(), after[2].second.span().begin()));
  late.unfreeze(0);
  late.train_step(x.view(), y.view(), loss::cross_entropy{}, fresh_opt);
  const auto unfrozen = late.state_dict();
  CHECK(!std::equal(after[0].second.span().begin(), after[0].second.span().end(), unfrozen[0].second.span().begin()));
  // The workspace size for 2^62 samples overflowed to a tiny one, which the first forward overran.
  CHECK_THROWS_WITH_AS(Net(index_t{1} << 62), doctest::Contains("expected at most"), kiln::error);
}

TEST_CASE("batch normalisation refuses to train on one value per channel") {
  using Net = Sequential<policy::cpu, Input<3>, BatchNorm1d<>, Dense<2>>;
  Net net(4, 5);
  Tensor<float> one(shape{1, 3}, {1, 2, 3});
  Tensor<std::int64_t> label(shape{1}, {1});
  optim::SGD opt({.lr = 0.1});
  CHECK_THROWS_WITH_AS(net.train_step(one.view(), label.view(), loss::cross_entropy{}, opt),
                       doctest::Contains("more than 1 value per channel"), kiln::error);
  CHECK(net.predict(one).shape() == shape{1, 2});  // evaluation uses the running statistics: fine
}
