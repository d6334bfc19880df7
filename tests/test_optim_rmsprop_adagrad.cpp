// RMSprop and Adagrad (optim/rmsprop.hpp, optim/adagrad.hpp) against torch.optim: five steps of every variant give
// PyTorch's parameters (tests/fixtures, made by generate.py), options torch rejects raise kiln::error, the kernels give
// one thread's bits on two, regularisation, clipping and a scheduler's rate act as for the other optimizers, Model's
// fit trains with them, and static and dynamic mode train to bit-identical losses.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;
using kiln::test::check_close;
using kiln::test::fixture;

namespace {

// Runs 5 steps of an optimizer over one slot with PyTorch's recorded gradients and compares each step's parameters.
template <class Optimizer, class Options>
void check_against_torch(const fixture& f, Options options) {
  auto param = f.f32("p0");
  Tensor<float> grad(param.shape());
  std::vector<optim::parameter_slot<float>> slots{{param.data(), grad.data(), param.numel(), nullptr}};
  Optimizer opt(slots, options);
  for (int step = 1; step <= 5; ++step) {
    CAPTURE(step);
    const auto g = f.f32("g" + std::to_string(step));
    std::copy(g.span().begin(), g.span().end(), grad.data());
    opt.step();
    check_close(param, f.f32("p" + std::to_string(step)), "parameters after step");
  }
  REQUIRE(opt.state().size() == 1);
  CHECK(opt.state()[0].step == 5);
}

// Inputs and labels of a small three-class problem.
struct batch {
  Tensor<float> x{shape{16, 4}};
  Tensor<std::int64_t> y{shape{16}};
  batch() {
    random_generator rng(4);
    for (auto& v : x.span()) v = rng.normal<float>();
    for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(3));
  }
};

// The same network trained in static and dynamic mode from the same weights: the losses must be the same bits.
template <class Optimizer, class Options>
void check_modes_agree(Options options) {
  using Net = Sequential<policy::cpu, Input<4>, Dense<8, ReLU>, Dense<3>>;
  Net net(16, 21);
  manual_seed(21);
  nn::Sequential model(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3));
  const batch b;
  Optimizer static_opt(options);
  Optimizer dynamic_opt(model.parameters(), options);
  nn::Variable input(b.x);
  for (int step = 0; step < 8; ++step) {
    CAPTURE(step);
    const float s = net.train_step(b.x, b.y, loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    auto l = nn::cross_entropy(model(input), b.y);
    l.backward();
    dynamic_opt.step();
    CHECK(s == l.item());
    CHECK(std::isfinite(s));
  }
}

// Trains two copies of a layer from the same weights for three steps, each with its own optimizer, and requires the
// same parameters after every step.
// between(b) runs after b's backward, before its step.
template <class MakeA, class MakeB>
void check_same_updates(MakeA make_a, MakeB make_b, const std::function<void(nn::Linear&)>& between = {}) {
  manual_seed(3);
  nn::Linear a(5, 4);
  manual_seed(3);
  nn::Linear b(5, 4);
  auto opt_a = make_a(a.parameters());
  auto opt_b = make_b(b.parameters());
  random_generator rng(8);
  Tensor<float> x(shape{6, 5});
  for (auto& v : x.span()) v = rng.normal<float>();
  for (int step = 0; step < 3; ++step) {
    opt_a.zero_grad();
    nn::sum(a(nn::Variable(x)) * a(nn::Variable(x))).backward();
    opt_a.step();
    opt_b.zero_grad();
    nn::sum(b(nn::Variable(x)) * b(nn::Variable(x))).backward();
    if (between) between(b);
    opt_b.step();
    for (std::size_t i = 0; i < 2; ++i)
      for (index_t j = 0; j < a.parameters()[i].numel(); ++j)
        CHECK(a.parameters()[i].value()[j] == b.parameters()[i].value()[j]);
  }
}

// Parameters, gradients and state arrays of n values for the kernel tests.
struct kernel_arrays {
  std::vector<float> param, grad, first, second, third;
  kernel_arrays(index_t n, std::uint64_t seed, float state) {
    random_generator rng(seed);
    param.resize(std::size_t(n));
    grad.resize(std::size_t(n));
    for (auto& v : param) v = rng.uniform<float>(-1.0f, 1.0f);
    for (auto& v : grad) v = rng.uniform<float>(-0.5f, 0.5f);
    first.assign(std::size_t(n), state);
    second.assign(std::size_t(n), 0.0f);
    third.assign(std::size_t(n), 0.0f);
  }
  bool operator==(const kernel_arrays& o) const {
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    return same(param, o.param) && same(first, o.first) && same(second, o.second) && same(third, o.third);
  }
};

}  // namespace

TEST_CASE("RMSprop: plain, with momentum, centered (with momentum and weight decay) and weight decay match PyTorch") {
  for (std::string name : {"rmsprop", "rmsprop_momentum", "rmsprop_centered", "rmsprop_centered_momentum",
                           "rmsprop_weight_decay"}) {
    CAPTURE(name);
    fixture f(name);
    check_against_torch<optim::RMSprop>(f, optim::rmsprop_options{.lr = f.scalar("lr"),
                                                                  .alpha = f.scalar("alpha"),
                                                                  .eps = f.scalar("eps"),
                                                                  .weight_decay = f.scalar("weight_decay"),
                                                                  .momentum = f.scalar("momentum"),
                                                                  .centered = f.scalar("centered") != 0});
  }
}

TEST_CASE("Adagrad: plain, lr_decay, initial_accumulator_value and weight decay match PyTorch") {
  for (std::string name : {"adagrad", "adagrad_lr_decay", "adagrad_initial_accumulator", "adagrad_weight_decay"}) {
    CAPTURE(name);
    fixture f(name);
    check_against_torch<optim::Adagrad>(
        f, optim::adagrad_options{.lr = f.scalar("lr"),
                                  .lr_decay = f.scalar("lr_decay"),
                                  .weight_decay = f.scalar("weight_decay"),
                                  .initial_accumulator_value = f.scalar("initial_accumulator_value"),
                                  .eps = f.scalar("eps")});
  }
}

TEST_CASE("RMSprop and Adagrad: PyTorch's defaults, and only the state their options use") {
  const optim::rmsprop_options r;
  CHECK(r.lr == 0.01);
  CHECK(r.alpha == 0.99);
  CHECK(r.eps == 1e-8);
  CHECK(r.weight_decay == 0);
  CHECK(r.momentum == 0);
  CHECK(!r.centered);
  const optim::adagrad_options a;
  CHECK(a.lr == 0.01);
  CHECK(a.lr_decay == 0);
  CHECK(a.weight_decay == 0);
  CHECK(a.initial_accumulator_value == 0);
  CHECK(a.eps == 1e-10);

  nn::Variable p(Tensor<float>(shape{3}, {0.5f, -1.0f, 2.0f}), true);
  optim::RMSprop plain(std::vector<nn::Variable>{p});
  optim::RMSprop full(std::vector<nn::Variable>{p}, {.momentum = 0.9, .centered = true});
  optim::Adagrad adagrad(std::vector<nn::Variable>{p}, {.initial_accumulator_value = 0.25});
  p.ensure_grad();
  plain.step();
  full.step();
  adagrad.step();
  CHECK(plain.state()[0].square_avg.size() == 3);
  CHECK(plain.state()[0].grad_avg.size() == 0);
  CHECK(plain.state()[0].momentum_buffer.size() == 0);
  CHECK(full.state()[0].grad_avg.size() == 3);
  CHECK(full.state()[0].momentum_buffer.size() == 3);
  // A zero gradient adds nothing to the sum, which starts at initial_accumulator_value.
  for (index_t i = 0; i < 3; ++i) CHECK(adagrad.state()[0].sum.data()[i] == 0.25f);
}

TEST_CASE("RMSprop and Adagrad reject what torch.optim does, and NaNs, with kiln::error") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto rmsprop_with = [](auto change) {
    optim::rmsprop_options o;
    change(o);
    return optim::RMSprop(o);
  };
  auto adagrad_with = [](auto change) {
    optim::adagrad_options o;
    change(o);
    return optim::Adagrad(o);
  };
  CHECK_THROWS_WITH_AS(rmsprop_with([](auto& o) { o.lr = -0.1; }), "RMSprop: expected lr >= 0, found -0.1",
                       kiln::error);
  CHECK_THROWS_WITH_AS(rmsprop_with([&](auto& o) { o.lr = nan; }), doctest::Contains("lr >= 0, found nan"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(rmsprop_with([](auto& o) { o.alpha = -0.5; }), doctest::Contains("alpha >= 0"), kiln::error);
  CHECK_THROWS_WITH_AS(rmsprop_with([](auto& o) { o.eps = -1e-8; }), doctest::Contains("eps >= 0"), kiln::error);
  CHECK_THROWS_WITH_AS(rmsprop_with([](auto& o) { o.weight_decay = -1; }), doctest::Contains("weight_decay >= 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(rmsprop_with([](auto& o) { o.momentum = -0.9; }), doctest::Contains("momentum >= 0"),
                       kiln::error);
  CHECK_THROWS_AS(rmsprop_with([&](auto& o) { o.momentum = nan; }), kiln::error);
  CHECK_THROWS_AS(rmsprop_with([](auto& o) { o.regularize.l1 = -1; }), kiln::error);
  CHECK_THROWS_AS(rmsprop_with([](auto& o) { o.clip = {.norm = 1, .value = 1}; }), kiln::error);
  CHECK_NOTHROW(rmsprop_with([](auto& o) { o.momentum = 0.9; o.centered = true; o.weight_decay = 1e-4; }));

  CHECK_THROWS_WITH_AS(adagrad_with([](auto& o) { o.lr = -1; }), "Adagrad: expected lr >= 0, found -1", kiln::error);
  CHECK_THROWS_WITH_AS(adagrad_with([](auto& o) { o.lr_decay = -0.1; }), doctest::Contains("lr_decay >= 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(adagrad_with([](auto& o) { o.weight_decay = -1; }), doctest::Contains("weight_decay >= 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(adagrad_with([](auto& o) { o.initial_accumulator_value = -1; }),
                       doctest::Contains("initial_accumulator_value >= 0"), kiln::error);
  CHECK_THROWS_WITH_AS(adagrad_with([&](auto& o) { o.eps = nan; }), doctest::Contains("eps >= 0, found nan"),
                       kiln::error);
  CHECK_NOTHROW(adagrad_with([](auto& o) { o.lr_decay = 0.1; o.initial_accumulator_value = 0.1; }));

  optim::Adagrad adagrad;
  CHECK_THROWS_WITH_AS(adagrad.step(), doctest::Contains("no parameters"), kiln::error);
  CHECK_THROWS_AS(adagrad.set_lr(-1), kiln::error);
}

TEST_CASE("RMSprop and Adagrad kernels over a long span: bit-identical on one and two threads, in every variant") {
  const int saved = num_threads();
  using kernels::cpu::optim_kernels;
  // 100003 values: above the parallel threshold, and not a multiple of a cache line, so the last chunk is ragged.
  const index_t n = 100003;
  for (const float weight_decay : {0.0f, 0.01f})
    for (const bool centered : {false, true})
      for (const float momentum : {0.0f, 0.9f}) {
        CAPTURE(weight_decay);
        CAPTURE(centered);
        CAPTURE(momentum);
        kernel_arrays one(n, 5, 0.0f), two(n, 5, 0.0f);
        const kernels::cpu::rmsprop_step_args<float> a{1e-2f, 0.99f, 1e-8f, weight_decay, momentum, centered};
        for (int step = 0; step < 3; ++step)
          for (auto* arrays : {&one, &two}) {
            set_num_threads(arrays == &one ? 1 : 2);
            optim_kernels::rmsprop_update(arrays->param.data(), arrays->grad.data(), arrays->first.data(),
                                          centered ? arrays->second.data() : nullptr,
                                          momentum != 0 ? arrays->third.data() : nullptr, n, a);
          }
        CHECK(one == two);
        CHECK(std::isfinite(one.param[0]));
      }
  for (const float weight_decay : {0.0f, 0.01f}) {
    CAPTURE(weight_decay);
    kernel_arrays one(n, 6, 0.1f), two(n, 6, 0.1f);
    for (int step = 0; step < 3; ++step) {
      const kernels::cpu::adagrad_step_args<float> a{0.01f / (1.0f + float(step) * 0.1f), 1e-10f, weight_decay};
      set_num_threads(1);
      optim_kernels::adagrad_update(one.param.data(), one.grad.data(), one.first.data(), n, a);
      set_num_threads(2);
      optim_kernels::adagrad_update(two.param.data(), two.grad.data(), two.first.data(), n, a);
    }
    CHECK(one == two);
  }
  set_num_threads(saved);
}

TEST_CASE("RMSprop and Adagrad: static and dynamic mode train to bit-identical losses") {
  SUBCASE("RMSprop") { check_modes_agree<optim::RMSprop>(optim::rmsprop_options{.lr = 1e-2}); }
  SUBCASE("RMSprop, centered, with momentum, weight decay and clipping") {
    check_modes_agree<optim::RMSprop>(optim::rmsprop_options{
        .lr = 1e-2, .weight_decay = 1e-3, .momentum = 0.9, .centered = true, .clip = {.norm = 0.5}});
  }
  SUBCASE("Adagrad") { check_modes_agree<optim::Adagrad>(optim::adagrad_options{.lr = 0.1}); }
  SUBCASE("Adagrad with lr_decay, an initial accumulator and L1/L2 regularisation") {
    check_modes_agree<optim::Adagrad>(optim::adagrad_options{.lr = 0.1,
                                                             .lr_decay = 0.05,
                                                             .initial_accumulator_value = 0.1,
                                                             .regularize = {.l1 = 1e-4, .l2 = 1e-3}});
  }
}

TEST_CASE("RMSprop and Adagrad: the clip option is clip_grad_norm before the update, and L2 is weight decay") {
  // clip: the built-in clip against clip_grad_norm by hand before an unclipped optimizer's step.
  auto clip_by_hand = [](nn::Linear& layer) { CHECK(nn::clip_grad_norm(layer.parameters(), 0.1) > 0.1); };
  check_same_updates(
      [](auto params) { return optim::RMSprop(params, {.momentum = 0.5, .clip = {.norm = 0.1}}); },
      [](auto params) { return optim::RMSprop(params, {.momentum = 0.5}); }, clip_by_hand);
  check_same_updates([](auto params) { return optim::Adagrad(params, {.lr = 0.1, .clip = {.norm = 0.1}}); },
                     [](auto params) { return optim::Adagrad(params, {.lr = 0.1}); }, clip_by_hand);
  // regularize.l2 adds 2 * l2 * p to the gradient: weight_decay = 2 * l2, bit for bit (the doubling is exact).
  check_same_updates([](auto params) { return optim::RMSprop(params, {.centered = true, .regularize = {.l2 = 0.05}}); },
                     [](auto params) { return optim::RMSprop(params, {.weight_decay = 0.1, .centered = true}); });
  check_same_updates([](auto params) { return optim::Adagrad(params, {.regularize = {.l2 = 0.05}}); },
                     [](auto params) { return optim::Adagrad(params, {.weight_decay = 0.1}); });
}

TEST_CASE("a scheduler's rate is the one RMSprop and Adagrad use; Adagrad's lr_decay divides it") {
  // One value with a constant gradient of 1: RMSprop's and Adagrad's steps are then known in closed form.
  for (const bool adagrad : {false, true}) {
    CAPTURE(adagrad);
    nn::Variable p(Tensor<float>(shape{1}, {1.0f}), true);
    optim::RMSprop rmsprop(std::vector<nn::Variable>{p}, {.lr = 0.1, .alpha = 0.5});
    optim::Adagrad ada(std::vector<nn::Variable>{p}, {.lr = 0.1, .lr_decay = 0.5});
    optim::optimizer_base<float, policy::cpu>& opt =
        adagrad ? static_cast<optim::optimizer_base<float, policy::cpu>&>(ada) : rmsprop;
    optim::StepLR schedule(opt, {.step_size = 1, .gamma = 0.5});
    double value = 1.0, squares = 0.0;
    for (int step = 1; step <= 4; ++step) {
      CAPTURE(step);
      const double lr = 0.1 * std::pow(0.5, step - 1);
      REQUIRE(opt.lr() == lr);
      p.ensure_grad();
      p.grad()[0] = 1.0f;
      if (adagrad) {
        ada.step();
        squares += 1.0;
        value -= lr / (1 + (step - 1) * 0.5) / (std::sqrt(squares) + 1e-10);
      } else {
        rmsprop.step();
        squares = 0.5 * squares + 0.5;
        value -= lr / (std::sqrt(squares) + 1e-8);
      }
      CHECK(p.value()[0] == doctest::Approx(value).epsilon(1e-6));
      schedule.step();
    }
  }
}

TEST_CASE("Model::fit trains with RMSprop and with Adagrad") {
  using Net = Sequential<policy::cpu, Input<4>, Dense<8, ReLU>, Dense<3>>;
  const batch b;
  Net rmsprop_net(16, 5), adagrad_net(16, 5);
  Model rmsprop_model(rmsprop_net), adagrad_model(adagrad_net);
  rmsprop_model.compile(optim::RMSprop({.lr = 1e-2}), loss::cross_entropy{});
  adagrad_model.compile(optim::Adagrad({.lr = 0.1}), loss::cross_entropy{});
  for (auto* model : {&rmsprop_model, &adagrad_model}) {
    const auto losses = model->fit(b.x, b.y, {.epochs = 10, .batch_size = 16, .verbose = 0}).series("loss");
    REQUIRE(losses.size() == 10);
    CHECK(losses.back() < losses.front());
  }
}
