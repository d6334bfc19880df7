// Learning-rate schedulers (optim/lr_scheduler.hpp) against torch.optim.lr_scheduler: every scheduler's rates over
// 30 epochs (OneCycleLR over its cycle, ReduceLROnPlateau fed a fixed metric sequence) equal PyTorch's to 1e-12,
// SequentialLR hands over at its milestones, bad settings raise kiln::error naming the scheduler, and a scheduler
// drives the optimizer that a training step uses, in both modes.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fixture.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

// The optimizer's rate once the scheduler is made and after each step, beside PyTorch's (tests/fixtures/lr_*.txt).
struct rates {
  std::string case_name;
  std::vector<double> kiln, torch;
};

// Makes SGD at the fixture's base rate and make(opt)'s scheduler on it, then steps it as many times as PyTorch was
// (ReduceLROnPlateau with the fixture's metrics). last_epoch() counts the steps and last_lr() is the optimizer's rate.
template <class Make>
rates run(const char* case_name, Make&& make) {
  test::fixture f(case_name);
  optim::SGD opt({.lr = f.f64("base_lr")[0]});
  auto scheduler = make(opt);
  const auto torch = f.f64("lr");
  rates r{case_name, {}, {}};
  for (index_t epoch = 0; epoch < torch.numel(); ++epoch) {
    if (epoch > 0) {
      if constexpr (std::is_same_v<decltype(scheduler), optim::ReduceLROnPlateau>)
        scheduler.step(f.f64("metric")[epoch - 1]);
      else
        scheduler.step();
    }
    CHECK(scheduler.last_epoch() == epoch);
    CHECK(scheduler.last_lr() == opt.lr());
    r.kiln.push_back(opt.lr());
    r.torch.push_back(torch[epoch]);
  }
  return r;
}

// Relative error 1e-12: the closed forms here and PyTorch's chained updates (rate *= factor each step) differ by a
// few rounding errors over 30 steps, nothing more. Zeros must be exact.
void check_matches(const rates& r) {
  INFO(r.case_name);
  REQUIRE(r.kiln.size() == r.torch.size());
  for (std::size_t epoch = 0; epoch < r.kiln.size(); ++epoch) {
    const double a = r.kiln[epoch], e = r.torch[epoch];
    std::ostringstream message;
    message.precision(17);
    message << "epoch " << epoch << ": kiln " << a << ", PyTorch " << e;
    CHECK_MESSAGE((a == e || std::fabs(a - e) <= 1e-12 * std::fabs(e)), message.str());
  }
}

template <class Make>
void check_against_pytorch(const char* case_name, Make&& make) {
  check_matches(run(case_name, make));
}

}  // namespace

TEST_CASE("StepLR, MultiStepLR and ExponentialLR give PyTorch's rates") {
  check_against_pytorch("lr_step", [](optim::SGD& o) { return optim::StepLR(o, {.step_size = 7, .gamma = 0.3}); });
  check_against_pytorch("lr_multi_step", [](optim::SGD& o) {
    return optim::MultiStepLR(o, {.milestones = {5, 12, 20}, .gamma = 0.3});
  });
  check_against_pytorch("lr_exponential", [](optim::SGD& o) { return optim::ExponentialLR(o, {.gamma = 0.9}); });
}

TEST_CASE("CosineAnnealingLR and LinearLR give PyTorch's rates") {
  // Past t_max the cosine rises again, as PyTorch's does.
  check_against_pytorch("lr_cosine", [](optim::SGD& o) {
    return optim::CosineAnnealingLR(o, {.t_max = 10, .eta_min = 0.001});
  });
  auto to_zero = run("lr_cosine_to_zero", [](optim::SGD& o) { return optim::CosineAnnealingLR(o, {.t_max = 30}); });
  check_matches(to_zero);
  CHECK(to_zero.kiln.back() == 0.0);
  check_against_pytorch("lr_linear", [](optim::SGD& o) {
    return optim::LinearLR(o, {.start_factor = 0.25, .end_factor = 0.9, .total_iters = 8});
  });
}

TEST_CASE("LambdaLR gives base_lr * lr_lambda(epoch), as PyTorch's") {
  check_against_pytorch("lr_lambda", [](optim::SGD& o) {
    return optim::LambdaLR(o, [](long long epoch) { return epoch < 3 ? (epoch + 1) / 4.0 : std::pow(0.95, epoch); });
  });
}

TEST_CASE("OneCycleLR gives PyTorch's rates: cosine, linear and three phases") {
  check_against_pytorch("lr_one_cycle", [](optim::SGD& o) {
    return optim::OneCycleLR(o, {.max_lr = 0.5, .total_steps = 30});
  });
  check_against_pytorch("lr_one_cycle_three_phase", [](optim::SGD& o) {
    optim::OneCycleLR s(o, {.max_lr = 0.5, .epochs = 5, .steps_per_epoch = 6, .pct_start = 0.25, .three_phase = true});
    CHECK(s.total_steps() == 30);
    CHECK(s.base_lr() == 0.5 / 25);
    return s;
  });
  // The step after the last batch overshoots linearly below zero in PyTorch; here it stops at 0.
  auto linear = run("lr_one_cycle_linear", [](optim::SGD& o) {
    return optim::OneCycleLR(o, {.max_lr = 0.5, .total_steps = 25, .pct_start = 0.25,
                                 .anneal_strategy = optim::annealing::linear, .div_factor = 10,
                                 .final_div_factor = 100});
  });
  CHECK(linear.torch.back() < 0);
  CHECK(linear.kiln.back() == 0.0);
  linear.kiln.pop_back();
  linear.torch.pop_back();
  check_matches(linear);

  // As PyTorch, total_steps steps after construction and no more; the refused step changes nothing.
  optim::SGD opt({.lr = 0.1});
  optim::OneCycleLR cycle(opt, {.max_lr = 0.5, .total_steps = 4});
  for (int i = 0; i < 4; ++i) cycle.step();
  const double last = opt.lr();
  CHECK_THROWS_WITH_AS(cycle.step(), doctest::Contains("OneCycleLR: expected at most total_steps = 4 steps"),
                       kiln::error);
  CHECK(opt.lr() == last);
  CHECK(cycle.last_epoch() == 4);
}

TEST_CASE("SequentialLR: a LinearLR warm-up, then cosine annealing from the base rate") {
  check_against_pytorch("lr_sequential", [](optim::SGD& o) {
    return optim::SequentialLR(o, {optim::LinearLR(o, {.start_factor = 0.1, .total_iters = 5}),
                                   optim::CosineAnnealingLR(o, {.t_max = 25})}, {5});
  });
  check_against_pytorch("lr_sequential3", [](optim::SGD& o) {
    return optim::SequentialLR(o, {optim::LinearLR(o, {.start_factor = 0.5, .total_iters = 4}),
                                   optim::StepLR(o, {.step_size = 3, .gamma = 0.5}),
                                   optim::ExponentialLR(o, {.gamma = 0.8})}, {4, 15});
  });

  optim::SGD opt({.lr = 0.1});
  optim::SequentialLR warm_cosine(opt, {optim::LinearLR(opt, {.start_factor = 0.1, .total_iters = 5}),
                                        optim::CosineAnnealingLR(opt, {.t_max = 25})}, {5});
  // The cosine took the rate the warm-up had set as its own when it was made; SequentialLR gives it the base rate.
  CHECK(warm_cosine.base_lr() == 0.1);
  CHECK(opt.lr() == 0.1 * 0.1);
  for (int epoch = 1; epoch <= 5; ++epoch) warm_cosine.step();
  CHECK(opt.lr() == 0.1);  // the cosine's epoch 0
  for (int epoch = 6; epoch <= 30; ++epoch) warm_cosine.step();
  CHECK(opt.lr() == 0.0);  // its epoch 25 = t_max
  CHECK(warm_cosine.last_epoch() == 30);
  CHECK(warm_cosine.milestones() == std::vector<long long>{5});
}

TEST_CASE("ReduceLROnPlateau gives PyTorch's rates for a loss and an accuracy") {
  // min mode, relative threshold, cooldown and min_lr; one NaN loss counts as no improvement.
  check_against_pytorch("lr_plateau", [](optim::SGD& o) {
    return optim::ReduceLROnPlateau(o, {.factor = 0.5, .patience = 2, .threshold = 0.01, .cooldown = 1,
                                        .min_lr = 0.01});
  });
  // max mode, absolute threshold; the last reductions are smaller than eps and skipped.
  check_against_pytorch("lr_plateau_max_abs", [](optim::SGD& o) {
    return optim::ReduceLROnPlateau(o, {.mode = optim::plateau_mode::max, .factor = 0.3, .patience = 1,
                                        .threshold = 0.05, .threshold_mode = optim::plateau_threshold::abs,
                                        .cooldown = 2, .eps = 1e-3});
  });

  optim::SGD opt({.lr = 1.0});
  optim::ReduceLROnPlateau plateau(opt, {.factor = 0.5, .patience = 1});
  CHECK(plateau.best() == std::numeric_limits<double>::infinity());
  plateau.step(2.0);
  plateau.step(2.0);
  CHECK(plateau.num_bad_epochs() == 1);
  plateau.step(3.0);  // the second bad epoch in a row: more than patience
  CHECK(opt.lr() == 0.5);
  CHECK(plateau.last_lr() == 0.5);
  CHECK(plateau.best() == 2.0);
  CHECK(plateau.num_bad_epochs() == 0);
  CHECK_THROWS_WITH_AS(plateau.step(), doctest::Contains("ReduceLROnPlateau: expected step(metric)"), kiln::error);
}

TEST_CASE("schedulers refuse bad settings with kiln::error naming the scheduler") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  optim::SGD opt({.lr = 0.1});
  using doctest::Contains;
  CHECK_THROWS_WITH_AS(optim::StepLR(opt, {}), Contains("StepLR: expected step_size > 0, found 0"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::StepLR(opt, {.step_size = 2, .gamma = 0}), Contains("StepLR: expected gamma > 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::StepLR(opt, {.step_size = 2, .gamma = nan}), Contains("StepLR: expected gamma > 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::MultiStepLR(opt, {.milestones = {5, 3}}),
                       Contains("MultiStepLR: expected increasing milestones, found 3 after 5 at index 1"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::MultiStepLR(opt, {.milestones = {0, 3}}),
                       Contains("MultiStepLR: expected milestones > 0, found 0 at index 0"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::ExponentialLR(opt, {}), Contains("ExponentialLR: expected gamma > 0, found 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::CosineAnnealingLR(opt, {}), Contains("CosineAnnealingLR: expected t_max > 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::CosineAnnealingLR(opt, {.t_max = 5, .eta_min = -1}),
                       Contains("CosineAnnealingLR: expected eta_min >= 0"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::LinearLR(opt, {.start_factor = 0}), Contains("LinearLR: expected start_factor in (0, 1]"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::LinearLR(opt, {.end_factor = 1.5}), Contains("LinearLR: expected end_factor in [0, 1]"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::LinearLR(opt, {.total_iters = 0}), Contains("LinearLR: expected total_iters > 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::LambdaLR(opt, nullptr), Contains("LambdaLR: expected a function of the epoch"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::OneCycleLR(opt, {.total_steps = 10}), Contains("OneCycleLR: expected max_lr > 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::OneCycleLR(opt, {.max_lr = 1, .epochs = 3}),
                       Contains("OneCycleLR: expected total_steps > 0, or epochs > 0 and steps_per_epoch > 0"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::OneCycleLR(opt, {.max_lr = 1, .total_steps = 10, .pct_start = 1.5}),
                       Contains("OneCycleLR: expected pct_start in [0, 1]"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::OneCycleLR(opt, {.max_lr = 1, .total_steps = 10, .div_factor = 0}),
                       Contains("OneCycleLR: expected div_factor > 0"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::ReduceLROnPlateau(opt, {.factor = 1}),
                       Contains("ReduceLROnPlateau: expected factor in (0, 1), found 1"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::ReduceLROnPlateau(opt, {.patience = -1}),
                       Contains("ReduceLROnPlateau: expected patience >= 0"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::ReduceLROnPlateau(opt, {.threshold = nan}),
                       Contains("ReduceLROnPlateau: expected threshold >= 0"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::ReduceLROnPlateau(opt, {.min_lr = -1}), Contains("ReduceLROnPlateau: expected min_lr"),
                       kiln::error);
  CHECK(opt.lr() == 0.1);  // a refused scheduler leaves the rate alone

  // A function that gives a negative factor is refused at that epoch, before the optimizer's rate changes.
  optim::LambdaLR negative(opt, [](long long epoch) { return 1.0 - 0.5 * double(epoch); });
  negative.step();
  CHECK(opt.lr() == 0.05);
  negative.step();
  CHECK_THROWS_WITH_AS(negative.step(),
                       Contains("LambdaLR: expected a finite learning rate >= 0, found -0.05 at epoch 3"), kiln::error);
  CHECK(opt.lr() == 0.0);
  CHECK(negative.last_epoch() == 2);
}

TEST_CASE("SequentialLR refuses a bad list of schedulers") {
  using doctest::Contains;
  optim::SGD opt({.lr = 0.1}), other({.lr = 0.1});
  CHECK_THROWS_WITH_AS(optim::SequentialLR(opt, {}, {}), Contains("SequentialLR: expected at least one scheduler"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::SequentialLR(opt, {optim::StepLR(opt, {.step_size = 2}), optim::LinearLR(opt)}, {}),
                       Contains("SequentialLR: expected one milestone fewer than schedulers, found 2 schedulers and "
                                "0 milestones"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(
      optim::SequentialLR(opt, {optim::LinearLR(opt), optim::LinearLR(opt), optim::LinearLR(opt)}, {4, 4}),
      Contains("SequentialLR: expected increasing milestones, found 4 after 4 at index 1"), kiln::error);
  CHECK_THROWS_WITH_AS(optim::SequentialLR(opt, {optim::LinearLR(opt), optim::ReduceLROnPlateau(opt)}, {3}),
                       Contains("SequentialLR: expected schedulers stepped without a metric, found ReduceLROnPlateau "
                                "at index 1"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(optim::SequentialLR(opt, {optim::LinearLR(opt), optim::LinearLR(other)}, {3}),
                       Contains("SequentialLR: expected every scheduler to drive the optimizer given to SequentialLR, "
                                "found LinearLR at index 1"),
                       kiln::error);
}

TEST_CASE("a scheduler held as lr_scheduler sets the rate that a dynamic training step uses") {
  manual_seed(3);
  nn::Linear model(3, 1);
  optim::SGD opt(model.parameters(), {.lr = 0.5});
  std::unique_ptr<optim::lr_scheduler> schedule =
      std::make_unique<optim::StepLR>(opt, optim::step_lr_options{.step_size = 1, .gamma = 0.5});
  nn::Variable x(Tensor<float>(shape{4, 3}, {1, 2, 0, -1, 0.5f, 1, 0, -2, 3, 2, 1, -1}));
  nn::Variable y(Tensor<float>(shape{4, 1}, {1, -1, 2, 0.5f}));
  for (int epoch = 0; epoch < 3; ++epoch) {
    CAPTURE(epoch);
    const double lr = 0.5 * std::pow(0.5, epoch);
    REQUIRE(opt.lr() == lr);
    opt.zero_grad();
    nn::mse_loss(model(x), y).backward();
    const Tensor<float> before = model.weight.tensor();
    const Tensor<float> grad(tensor_view<const float>(model.weight.grad()));
    opt.step();
    // Plain SGD: the update is the scheduled rate times the gradient.
    for (index_t i = 0; i < 3; ++i)
      CHECK(model.weight.value()[i] == doctest::Approx(before[i] - lr * grad[i]).epsilon(1e-6));
    schedule->step();
    CHECK(opt.lr() == lr / 2);
    CHECK(schedule->last_lr() == lr / 2);
  }
  CHECK(std::string(schedule->name()) == "StepLR");
}

TEST_CASE("a scheduler sets the rate that a static train_step uses") {
  using Net = Sequential<policy::cpu, Input<3>, Dense<1>>;
  Net net(4, 7);
  Tensor<float> x(shape{4, 3}, {1, 2, 0, -1, 0.5f, 1, 0, -2, 3, 2, 1, -1}), y(shape{4, 1}, {1, -1, 2, 0.5f});
  optim::SGD opt({.lr = 0.05});
  // Rate 0 for epoch 1 only: the step of epoch 1 leaves the weights alone, so epoch 2 sees the loss epoch 1 saw.
  optim::LambdaLR schedule(opt, [](long long epoch) { return epoch == 1 ? 0.0 : 1.0; });
  const float loss0 = net.train_step(x, y, loss::mse{}, opt);
  schedule.step();
  CHECK(opt.lr() == 0.0);
  const float loss1 = net.train_step(x, y, loss::mse{}, opt);
  schedule.step();
  CHECK(opt.lr() == 0.05);
  const float loss2 = net.train_step(x, y, loss::mse{}, opt);
  const float loss3 = net.train_step(x, y, loss::mse{}, opt);
  CHECK(loss1 < loss0);
  CHECK(loss2 == loss1);
  CHECK(loss3 < loss2);
}

namespace {

// Steps `first` for `stop` epochs, then a second scheduler made by make() on a second optimizer restores first's
// state and both go on for `more` epochs: the two must set the same rates (and the same plateau state) at every one.
template <class Make, class Step>
void check_resumes(Make&& make, Step&& step, int stop, int more) {
  optim::SGD opt_a({.lr = 0.1}), opt_b({.lr = 0.1});
  auto a = make(opt_a);
  for (int e = 0; e < stop; ++e) step(a, e);
  auto b = make(opt_b);
  b.restore(a.state());
  CHECK(b.last_epoch() == a.last_epoch());
  opt_b.set_lr(opt_a.lr());  // a checkpoint restores the optimizer's rate itself
  CHECK(opt_b.lr() == opt_a.lr());
  for (int e = stop; e < stop + more; ++e) {
    step(a, e);
    step(b, e);
    INFO("epoch " << e);
    CHECK(opt_b.lr() == opt_a.lr());
    CHECK(b.last_lr() == a.last_lr());
    CHECK(b.last_epoch() == a.last_epoch());
  }
}

}  // namespace

TEST_CASE("a scheduler restored from another's state() goes on as that one does") {
  auto plain = [](auto& s, int) { s.step(); };
  check_resumes([](optim::SGD& o) { return optim::StepLR(o, {.step_size = 3, .gamma = 0.5}); }, plain, 7, 10);
  check_resumes([](optim::SGD& o) { return optim::CosineAnnealingLR(o, {.t_max = 12, .eta_min = 1e-3}); }, plain, 5,
                20);
  check_resumes([](optim::SGD& o) { return optim::OneCycleLR(o, {.max_lr = 1, .total_steps = 20}); }, plain, 9, 11);
  // SequentialLR: restored into the warm-up, and past the milestone into the cosine.
  auto sequential = [](optim::SGD& o) {
    return optim::SequentialLR(o, {optim::LinearLR(o, {.start_factor = 0.1, .total_iters = 4}),
                                   optim::CosineAnnealingLR(o, {.t_max = 10})},
                               {4});
  };
  check_resumes(sequential, plain, 2, 12);
  check_resumes(sequential, plain, 4, 8);
  check_resumes(sequential, plain, 9, 5);
  // ReduceLROnPlateau: restored in the middle of a patience count and of a cooldown.
  const std::vector<double> metric{5, 4, 4, 4, 4, 4, 3.5, 3.5, 3.5, 3.5, 3.5, 3.5, 3.5, 3, 3, 3, 3, 3, 3, 3};
  auto plateau = [](optim::SGD& o) {
    return optim::ReduceLROnPlateau(o, {.factor = 0.5, .patience = 2, .cooldown = 2});
  };
  auto with_metric = [&](optim::ReduceLROnPlateau& s, int e) { s.step(metric[static_cast<std::size_t>(e)]); };
  for (int stop : {3, 5, 6, 8}) check_resumes(plateau, with_metric, stop, 20 - stop);
}

TEST_CASE("restore refuses a state the scheduler cannot be in, and changes nothing then") {
  optim::SGD opt({.lr = 0.1});
  optim::OneCycleLR cycle(opt, {.max_lr = 1, .total_steps = 10});
  cycle.step();
  const double lr = opt.lr();
  CHECK_THROWS_WITH_AS(cycle.restore({.last_epoch = 11}), doctest::Contains("OneCycleLR"), kiln::error);
  CHECK_THROWS_WITH_AS(cycle.restore({.last_epoch = -1}), doctest::Contains("last_epoch >= 0"), kiln::error);
  CHECK(opt.lr() == lr);
  CHECK(cycle.last_epoch() == 1);
  optim::ReduceLROnPlateau plateau(opt);
  CHECK_THROWS_WITH_AS(plateau.restore({.last_epoch = 3, .best = 1, .bad_epochs = -2}),
                       doctest::Contains("ReduceLROnPlateau"), kiln::error);
  CHECK(plateau.last_epoch() == 0);
}

TEST_CASE("restore refuses counts that stepping on from would overflow (a hostile checkpoint)") {
  optim::SGD opt({.lr = 0.1});
  optim::StepLR step(opt, {.step_size = 2});
  const long long near_overflow = std::numeric_limits<long long>::max() - 1;
  CHECK_THROWS_WITH_AS(step.restore({.last_epoch = near_overflow}), doctest::Contains("at most 2^48"), kiln::error);
  CHECK(step.last_epoch() == 0);
  step.restore({.last_epoch = optim::lr_scheduler::max_saved_count});  // the bound itself is a state it can be in
  step.step();
  CHECK(step.last_epoch() == optim::lr_scheduler::max_saved_count + 1);
  optim::ReduceLROnPlateau plateau(opt, {.cooldown = 2});
  CHECK_THROWS_WITH_AS(plateau.restore({.last_epoch = 3, .best = 1, .bad_epochs = near_overflow}),
                       doctest::Contains("bad_epochs in [0, 2^48]"), kiln::error);
  CHECK_THROWS_WITH_AS(plateau.restore({.last_epoch = 3, .best = 1, .cooldown_left = 3}),
                       doctest::Contains("cooldown_left in [0, 2]"), kiln::error);
  CHECK(plateau.last_epoch() == 0);
  plateau.restore({.last_epoch = 3, .best = 1, .bad_epochs = 1, .cooldown_left = 2});
  CHECK(plateau.last_epoch() == 3);
}
