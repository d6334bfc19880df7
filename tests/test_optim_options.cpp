// Optimizer bookkeeping against torch.optim: SGD's momentum buffer starts on each parameter's own first update (a
// parameter added or unfrozen after the first step), and options torch.optim rejects (and NaNs) raise kiln::error.
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

// loss = sum(a * a * w) + sum(b * b * w) for the fixed weights w below, as the reference script computed it.
nn::Variable weighted_squares(const nn::Variable& a, const nn::Variable& b) {
  const nn::Variable w(Tensor<float>(shape{3}, {1.0f, 2.0f, -0.5f}));
  return nn::sum(a * a * w) + nn::sum(b * b * w);
}

void check_values(const nn::Variable& v, const std::vector<float>& expected) {
  REQUIRE(v.numel() == static_cast<index_t>(expected.size()));
  for (index_t i = 0; i < v.numel(); ++i)
    CHECK(v.value()[i] == doctest::Approx(expected[static_cast<std::size_t>(i)]).epsilon(1e-6));
}

optim::sgd_options damped() {
  optim::sgd_options o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.dampening = 0.5;
  return o;
}

// Both results below come from torch 2 (float32), with a = [0.2, -0.4, 0.6], b = [0.9, -1.1, 1.3] and
// torch.optim.SGD(lr=0.1, momentum=0.9, dampening=0.5), three steps of weighted_squares; b takes part from the second
// step on, by b.requires_grad_(True) in one case and by opt.add_param_group({"params": [b]}) in the other:
//   a: 0.0503999963, 0.134399995, 0.862650037    b: 0.485999972, -0.131999999, 1.61849999
const std::vector<float> torch_a{0.0503999963f, 0.134399995f, 0.862650037f};
const std::vector<float> torch_b{0.485999972f, -0.131999999f, 1.61849999f};

// Adam and AdamW reject what torch.optim.Adam and AdamW do, and NaNs.
template <class Options, class Optimizer>
void check_adam_options(const char* name) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto with = [](auto change) {
    Options o;
    change(o);
    return Optimizer(o);
  };
  INFO(name);
  CHECK_THROWS_WITH_AS(with([](auto& o) { o.weight_decay = -1; }), doctest::Contains("weight_decay >= 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(with([&](auto& o) { o.lr = nan; }), doctest::Contains("lr >= 0"), kiln::error);
  CHECK_THROWS_WITH_AS(with([](auto& o) { o.beta1 = 1.0; }), doctest::Contains("betas in [0, 1)"), kiln::error);
  CHECK_THROWS_AS(with([&](auto& o) { o.beta2 = nan; }), kiln::error);
  CHECK_THROWS_WITH_AS(with([](auto& o) { o.eps = -1e-8; }), doctest::Contains("eps >= 0"), kiln::error);
  CHECK_THROWS_AS(with([&](auto& o) { o.eps = nan; }), kiln::error);
  CHECK_NOTHROW(with([](auto&) {}));
}

}  // namespace

TEST_CASE("SGD: a parameter frozen on the first step starts its momentum undampened when it first updates") {
  nn::Variable a(Tensor<float>(shape{3}, {0.2f, -0.4f, 0.6f}), true);
  nn::Variable b(Tensor<float>(shape{3}, {0.9f, -1.1f, 1.3f}), true);
  optim::SGD opt(std::vector<nn::Variable>{a, b}, damped());
  b.set_requires_grad(false);
  for (int step = 0; step < 3; ++step) {
    if (step == 1) b.set_requires_grad(true);
    opt.zero_grad();
    weighted_squares(a, b).backward();
    opt.step();
  }
  check_values(a, torch_a);
  check_values(b, torch_b);
}

TEST_CASE("SGD: parameters added after the first step get momentum buffers of their own") {
  nn::Variable a(Tensor<float>(shape{3}, {0.2f, -0.4f, 0.6f}), true);
  nn::Variable b(Tensor<float>(shape{3}, {0.9f, -1.1f, 1.3f}), true);
  b.ensure_grad();
  optim::SGD opt(std::vector<nn::Variable>{a}, damped());
  for (int step = 0; step < 3; ++step) {
    if (step == 1) opt.add_parameters(std::vector<nn::Variable>{b});  // overran the buffers sized on step 0
    opt.zero_grad();
    weighted_squares(a, b).backward();
    opt.step();
  }
  check_values(a, torch_a);
  check_values(b, torch_b);
  REQUIRE(opt.momentum_buffers().size() == 2);
  CHECK(opt.momentum_buffers()[1].size() == 3);

  // Without momentum there are no buffers to size, and a late parameter still steps.
  nn::Variable c(Tensor<float>(shape{2}, {1.0f, -2.0f}), true);
  optim::sgd_options plain;
  plain.lr = 0.25;
  optim::SGD sgd(std::vector<nn::Variable>{a}, plain);
  sgd.zero_grad();
  nn::sum(a * a).backward();
  sgd.step();
  sgd.add_parameters(std::vector<nn::Variable>{c});
  sgd.zero_grad();
  nn::sum(c * c).backward();
  sgd.step();
  check_values(c, {0.5f, -1.0f});  // c - 0.25 * 2c
}

TEST_CASE("optimizer options that torch.optim rejects, and NaNs, raise kiln::error") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto sgd_with = [](auto change) {
    optim::sgd_options o;
    change(o);
    return optim::SGD(o);
  };
  CHECK_THROWS_WITH_AS(sgd_with([](auto& o) { o.momentum = -0.1; }), doctest::Contains("momentum >= 0"), kiln::error);
  CHECK_THROWS_WITH_AS(sgd_with([](auto& o) { o.weight_decay = -1; }), doctest::Contains("weight_decay >= 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(sgd_with([&](auto& o) { o.lr = nan; }), doctest::Contains("lr >= 0, found nan"), kiln::error);
  CHECK_THROWS_AS(sgd_with([&](auto& o) { o.momentum = nan; }), kiln::error);
  CHECK_THROWS_AS(sgd_with([&](auto& o) { o.dampening = nan; }), kiln::error);
  CHECK_THROWS_AS(sgd_with([](auto& o) { o.regularize.l2 = -0.5; }), kiln::error);
  CHECK_NOTHROW(sgd_with([](auto& o) { o.momentum = 0.9; o.weight_decay = 1e-4; }));

  check_adam_options<optim::adam_options, optim::Adam>("Adam");
  check_adam_options<optim::adamw_options, optim::AdamW>("AdamW");

  optim::SGD sgd;
  CHECK_THROWS_WITH_AS(sgd.set_lr(nan), doctest::Contains("lr >= 0"), kiln::error);
  CHECK_THROWS_AS(sgd.set_lr(-1e-3), kiln::error);
  sgd.set_lr(0.5);
  CHECK(sgd.lr() == 0.5);
}
