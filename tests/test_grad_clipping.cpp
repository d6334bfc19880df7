// Gradient clipping (optim/clip.hpp): PyTorch's clip_grad_norm_ and clip_grad_value_ formulas, frozen and
// not-yet-zeroed gradients left out, errors for bad arguments, the optimizers' clip option, and static and dynamic
// mode still training to bit-identical losses with clipping on (the norm does not depend on how slots cut the
// parameters).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "same_training.hpp"

using namespace kiln;

namespace {

using cpu_slot = optim::parameter_slot<float>;

// Slots over plain arrays: values are never read by clipping, only gradients.
struct two_slots {
  std::vector<float> value_a{0, 0}, grad_a{3, -4}, value_b{0}, grad_b{12};
  bool trainable_b = true;
  std::vector<cpu_slot> slots() {
    return {{value_a.data(), grad_a.data(), 2}, {value_b.data(), grad_b.data(), 1, &trainable_b}};
  }
};

double clip_norm(std::vector<cpu_slot> slots, double max_norm, optim::clip_norm_options o = {}) {
  return optim::clip_grad_norm<policy::cpu>(std::span<const cpu_slot>(slots), max_norm, o);
}

}  // namespace

TEST_CASE("clip_grad_norm: scales by max_norm / (norm + 1e-6) in float, as PyTorch, and returns the norm") {
  two_slots g;
  CHECK(clip_norm(g.slots(), 6.5) == 13.0);  // sqrt(9 + 16 + 144)
  const float coefficient = 6.5f / (13.0f + 1e-6f);
  CHECK(g.grad_a[0] == 3.0f * coefficient);
  CHECK(g.grad_a[1] == -4.0f * coefficient);
  CHECK(g.grad_b[0] == 12.0f * coefficient);
  // The clipped gradients' norm is max_norm, to float rounding.
  CHECK(clip_norm(g.slots(), 100.0) == doctest::Approx(6.5).epsilon(1e-6));

  two_slots below;
  CHECK(clip_norm(below.slots(), 13.5) == 13.0);  // under max_norm: untouched
  CHECK(below.grad_a == std::vector<float>{3, -4});
  CHECK(below.grad_b == std::vector<float>{12});

  two_slots zero;
  clip_norm(zero.slots(), 0.0);  // max_norm 0 zeroes the gradients, as in PyTorch
  CHECK(zero.grad_a == std::vector<float>{0, 0});
}

TEST_CASE("clip_grad_norm: 1-, infinity- and p-norms") {
  two_slots g;
  CHECK(clip_norm(g.slots(), 100, {.norm_type = 1}) == 19.0);
  CHECK(clip_norm(g.slots(), 100, {.norm_type = std::numeric_limits<double>::infinity()}) == 12.0);
  CHECK(clip_norm(g.slots(), 100, {.norm_type = 3}) == doctest::Approx(std::cbrt(27.0 + 64.0 + 1728.0)));
  CHECK(optim::grad_norm<policy::cpu>(std::span<const cpu_slot>(g.slots())) == 13.0);
}

TEST_CASE("clip_grad_norm: a long gradient's norm is summed in double") {
  // One 1 and 100003 values of 1e-3: a float running sum drifts by more than 1e-6; the double one agrees with a
  // double reference to 1e-12.
  std::vector<float> value(100004), grad(100004, 1e-3f);
  grad.front() = 1.0f;
  double expected = 0;
  float drifting = 0;
  for (float v : grad) {
    expected += double(v) * double(v);
    drifting += v * v;
  }
  expected = std::sqrt(expected);
  CHECK(std::fabs(std::sqrt(double(drifting)) - expected) > 1e-6 * expected);
  std::vector<cpu_slot> slots{{value.data(), grad.data(), index_t(grad.size())}};
  CHECK(optim::grad_norm<policy::cpu>(std::span<const cpu_slot>(slots)) == doctest::Approx(expected).epsilon(1e-12));
}

TEST_CASE("clip_grad_norm: the vectorised sum of squares adds exactly what the plain lanes loop adds") {
  // Values over 12 orders of magnitude, so that the order of the adds shows in the bits; lengths with and without a
  // tail after the last whole block of lanes.
  random_generator rng(17);
  for (index_t n : {index_t(0), index_t(5), index_t(64), index_t(1000), index_t(4099)}) {
    CAPTURE(n);
    std::vector<float> g(static_cast<std::size_t>(n));
    for (auto& v : g) v = rng.normal<float>() * std::pow(10.0f, float(rng.below(12)) - 6.0f);
    constexpr int lanes = optim::clip_detail::sum_lanes;
    double acc[lanes] = {};
    for (index_t i = 0; i < n; ++i) acc[i % lanes] += double(g[std::size_t(i)]) * double(g[std::size_t(i)]);
    for (int width = lanes / 2; width > 0; width /= 2)
      for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
    CHECK(optim::clip_detail::power_sum(g.data(), n, 2.0) == acc[0]);
  }
}

TEST_CASE("clip_grad_norm: frozen slots and gradients waiting to be zeroed take no part") {
  two_slots g;
  g.trainable_b = false;
  CHECK(clip_norm(g.slots(), 1.0) == 5.0);
  CHECK(g.grad_b == std::vector<float>{12});  // frozen: left as it was
  CHECK(g.grad_a[0] == 3.0f * (1.0f / (5.0f + 1e-6f)));

  two_slots pending;
  bool zero_pending = true;
  auto slots = pending.slots();
  slots[1].grad_pending_zero = &zero_pending;  // its memory still holds the old 12, which stands for 0
  CHECK(clip_norm(slots, 1.0) == 5.0);
  CHECK(pending.grad_b == std::vector<float>{12});
}

TEST_CASE("clip_grad_norm: a non-finite norm turns the gradients to NaN, or is an error when asked") {
  two_slots g;
  g.grad_b[0] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(clip_norm(g.slots(), 1.0)));
  CHECK(std::isnan(g.grad_a[0]));

  two_slots h;
  h.grad_b[0] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(clip_norm(h.slots(), 1.0, {.error_if_nonfinite = true}), doctest::Contains("not finite"),
                       kiln::error);
  CHECK(h.grad_a == std::vector<float>{3, -4});  // the error comes before any gradient changes
}

TEST_CASE("clip_grad_value clamps every value and keeps NaN") {
  std::vector<float> value(4), grad{-5.0f, 0.5f, 7.0f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<cpu_slot> slots{{value.data(), grad.data(), 4}};
  optim::clip_grad_value<policy::cpu>(std::span<const cpu_slot>(slots), 1.0);
  CHECK(grad[0] == -1.0f);
  CHECK(grad[1] == 0.5f);
  CHECK(grad[2] == 1.0f);
  CHECK(std::isnan(grad[3]));
}

TEST_CASE("clipping refuses bad arguments with kiln::error") {
  two_slots g;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH_AS(clip_norm(g.slots(), -1.0), doctest::Contains("max_norm >= 0"), kiln::error);
  CHECK_THROWS_AS(clip_norm(g.slots(), nan), kiln::error);
  CHECK_THROWS_WITH_AS(clip_norm(g.slots(), 1.0, {.norm_type = 0}), doctest::Contains("norm_type > 0"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::clip_grad_value<policy::cpu>(std::span<const cpu_slot>(g.slots()), -0.5),
                       doctest::Contains("clip_value >= 0"), kiln::error);
  CHECK(g.grad_a == std::vector<float>{3, -4});
  CHECK_THROWS_WITH_AS(optim::Adam({.clip = {.norm = 1.0, .value = 0.5}}), doctest::Contains("at most one"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::SGD({.clip = {.norm = -1.0}}), doctest::Contains("clip norm >= 0"), kiln::error);
  CHECK_THROWS_AS(optim::AdamW({.clip = {.value = nan}}), kiln::error);
}

TEST_CASE("the optimizers' clip option is clip_grad_norm (or clip_grad_value) before the update") {
  for (const bool by_value : {false, true}) {
    INFO("by value: ", by_value);
    manual_seed(3);
    nn::Linear a(5, 4);
    manual_seed(3);
    nn::Linear b(5, 4);  // the same weights
    const optim::clipping clip = by_value ? optim::clipping{.value = 0.05} : optim::clipping{.norm = 0.1};
    optim::SGD built_in(a.parameters(), {.lr = 0.1, .momentum = 0.9, .clip = clip});
    optim::SGD manual(b.parameters(), {.lr = 0.1, .momentum = 0.9});
    random_generator rng(8);
    Tensor<float> x(shape{6, 5});
    for (auto& v : x.span()) v = rng.normal<float>();
    for (int step = 0; step < 3; ++step) {
      built_in.zero_grad();
      nn::sum(a(nn::Variable(x)) * a(nn::Variable(x))).backward();
      built_in.step();
      manual.zero_grad();
      nn::sum(b(nn::Variable(x)) * b(nn::Variable(x))).backward();
      if (by_value) {
        nn::clip_grad_value(b.parameters(), 0.05);
      } else {
        const double norm = nn::clip_grad_norm(b.parameters(), 0.1);
        CHECK(norm > 0.1);  // the clip engages
        CHECK(built_in.last_grad_norm() == norm);
      }
      manual.step();
      for (std::size_t i = 0; i < 2; ++i)
        for (index_t j = 0; j < a.parameters()[i].numel(); ++j)
          CHECK(a.parameters()[i].value()[j] == b.parameters()[i].value()[j]);
    }
  }
}

TEST_CASE("clip_grad_norm and clip_grad_value over an optimizer's slots, and over a static model's") {
  manual_seed(4);
  nn::Linear layer(3, 2);
  optim::Adam opt(layer.parameters(), {.lr = 1e-3});
  nn::sum(layer(nn::Variable(Tensor<float>(shape{2, 3}, {1, 2, 3, 4, 5, 6})))).backward();
  const double norm = optim::grad_norm<policy::cpu>(std::span<const cpu_slot>(opt.slots()));
  CHECK(norm > 0.1);
  CHECK(optim::clip_grad_norm(opt, 0.1) == norm);
  CHECK(nn::clip_grad_norm(layer.parameters(), 1.0) == doctest::Approx(0.1).epsilon(1e-6));
  optim::clip_grad_value(opt, 0.01);
  for (const auto& p : layer.parameters())
    for (index_t i = 0; i < p.numel(); ++i) CHECK(std::fabs(p.grad()[i]) <= 0.01f);

  // A static model's slots: its flat slot lists the tensors, so its norm is theirs, padding left out.
  using Net = Sequential<policy::cpu, Input<3>, Dense<2>, Dense<1>>;
  Net net(4, 1);
  const auto slots = net.parameters();
  REQUIRE(slots.size() == 1);
  CHECK(slots[0].tensors.size() == 4);
  CHECK(slots[0].size == 16 + 16);  // each layer padded to 16 values: 3 x 2 + 2 and 2 + 1
}

TEST_CASE("static and dynamic mode: bit-identical losses with clipping on, flat slots or not") {
  // Layer 1 holds 4 x 8 + 8 = 40 parameters: the flat buffer pads it to 48, so the second layer's tensors sit at
  // other offsets than in dynamic mode's slots.
  using Net = Sequential<policy::cpu, Input<4>, Dense<8, ReLU>, Dense<3>>;
  random_generator rng(4);
  Tensor<float> x(shape{16, 4});
  Tensor<std::int64_t> y(shape{16});
  for (auto& v : x.span()) v = 3.0f * rng.normal<float>();
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(3));
  for (const bool flat : {true, false}) {
    INFO("flat parameters: ", flat);
    Net net(16, 21);
    net.set_options({.flat_parameters = flat});
    manual_seed(21);
    nn::Sequential model(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3));
    check_same_losses(net, model, {x, y}, 8, {.lr = 1e-2, .clip = {.norm = 0.25}},
                      [](const optim::Adam& static_opt, const optim::Adam& dynamic_opt) {
                        CHECK(static_opt.last_grad_norm() == dynamic_opt.last_grad_norm());
                        CHECK(static_opt.last_grad_norm() > 0.25);
                      });
  }
}
