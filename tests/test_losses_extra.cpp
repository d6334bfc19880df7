// nll, cross-entropy's options (class weights, ignore_index, label smoothing), l1, smooth L1 and Huber: against
// PyTorch's numbers (tests/fixtures, made by tests/fixtures/generate.py) through the kernels, the static loss structs
// and the dynamic functions; log_softmax + nll against cross-entropy; static against dynamic mode, directly and
// through kiln::Model; and the errors for bad labels and options. Their finite-difference gradient checks are with the
// other losses' (test_dynamic.cpp, test_static_gradients.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;
using kiln::test::check_close;
using kiln::test::fixture;
using P = policy::cpu;

namespace {

std::span<const float> one(const float& value) { return {&value, 1}; }

// A class loss fixture's options, as the static struct, the dynamic options and the kernel options hold them.
struct class_case {
  fixture f;
  Tensor<float> input;
  std::vector<std::int64_t> labels;
  std::vector<float> weight;
  std::optional<std::int64_t> ignore_index;
  float label_smoothing = 0;
  reduction reduce;

  explicit class_case(const std::string& name)
      : f(name), input(f.f32("input")), labels(f.i64("labels")),
        reduce(name.ends_with("_sum") ? reduction::sum : reduction::mean) {
    if (f.has("weight")) {
      auto w = f.f32("weight");
      weight.assign(w.span().begin(), w.span().end());
    }
    if (f.has("ignore_index")) ignore_index = f.i64("ignore_index")[0];
    if (f.has("label_smoothing")) label_smoothing = f.scalar("label_smoothing");
  }
  index_t rows() const { return input.extent(0); }
  index_t classes() const { return input.extent(1); }
  kernels::class_loss_options<float> kernel_options() const {
    return {weight.empty() ? nullptr : weight.data(), ignore_index.has_value(), ignore_index.value_or(0),
            label_smoothing};
  }
};

// The three ways to the same numbers: the policy's kernel, the static loss struct, the dynamic function.
template <class Kernel, class StaticLoss, class DynamicLoss>
void check_three_ways(const fixture& f, const Tensor<float>& input, Kernel kernel, const StaticLoss& static_loss,
                      DynamicLoss dynamic_loss) {
  const float expected_loss = f.scalar("loss");
  const Tensor<float> expected_grad = f.f32("dinput");
  Tensor<float> grad(input.shape());
  float loss = kernel(grad.data());
  check_close(one(loss), f.f32("loss"), "kernel loss");
  check_close(grad, expected_grad, "kernel gradient");
  CHECK(kernel(static_cast<float*>(nullptr)) == loss);  // the same loss without a gradient

  Tensor<float> static_grad(input.shape());
  loss = static_loss(static_grad.data());
  check_close(one(loss), f.f32("loss"), "static loss");
  check_close(static_grad, expected_grad, "static gradient");

  nn::Variable x(input, true);
  nn::Variable l = dynamic_loss(x);
  l.backward();
  loss = l.item();
  check_close(one(loss), f.f32("loss"), "dynamic loss");
  check_close(x.grad().span(), expected_grad, "dynamic gradient");
  CHECK(std::isfinite(expected_loss));
}

}  // namespace

TEST_CASE("nll_loss and cross-entropy's weight, ignore_index and label_smoothing match PyTorch") {
  for (std::string name : {"nll_mean", "nll_sum", "nll_weight_ignore_mean", "nll_weight_sum"}) {
    CAPTURE(name);
    const class_case c(name);
    const loss::nll static_loss{.reduce = c.reduce, .weight = c.weight, .ignore_index = c.ignore_index};
    check_three_ways(
        c.f, c.input,
        [&](float* grad) {
          return P::nll(c.input.data(), c.labels.data(), c.rows(), c.classes(), c.reduce, c.kernel_options(), grad);
        },
        [&](float* grad) {
          return static_loss.forward_backward<P>(c.input.data(), c.labels.data(), grad, c.rows(), c.classes());
        },
        [&](const nn::Variable& x) {
          return nn::nll_loss(x, c.labels, {.reduce = c.reduce, .weight = c.weight, .ignore_index = c.ignore_index});
        });
  }
  for (std::string name : {"cross_entropy_smoothing_mean", "cross_entropy_weight_mean", "cross_entropy_ignore_mean",
                           "cross_entropy_all_options_mean", "cross_entropy_all_options_sum"}) {
    CAPTURE(name);
    const class_case c(name);
    const loss::cross_entropy static_loss{.reduce = c.reduce, .weight = c.weight, .ignore_index = c.ignore_index,
                                          .label_smoothing = c.label_smoothing};
    CHECK(!static_loss.plain());
    check_three_ways(
        c.f, c.input,
        [&](float* grad) {
          return P::softmax_cross_entropy(c.input.data(), c.labels.data(), c.rows(), c.classes(), c.reduce,
                                          c.kernel_options(), grad);
        },
        [&](float* grad) {
          return static_loss.forward_backward<P>(c.input.data(), c.labels.data(), grad, c.rows(), c.classes());
        },
        [&](const nn::Variable& x) {
          return nn::cross_entropy(x, c.labels,
                                   {.reduce = c.reduce, .weight = c.weight, .ignore_index = c.ignore_index,
                                    .label_smoothing = c.label_smoothing});
        });
  }
}

TEST_CASE("l1_loss, smooth_l1_loss and huber_loss match PyTorch, at a zero difference too") {
  for (std::string name : {"l1_mean", "l1_sum", "smooth_l1_mean", "smooth_l1_beta_sum", "smooth_l1_beta0_mean",
                           "huber_mean", "huber_delta_sum"}) {
    CAPTURE(name);
    fixture f(name);
    const auto input = f.f32("input"), target = f.f32("target");
    const reduction r = name.ends_with("_sum") ? reduction::sum : reduction::mean;
    const index_t batch = input.extent(0), row = input.extent(1);
    REQUIRE(input[1 * row + 2] == target[1 * row + 2]);  // the zero difference
    nn::Variable t(target);
    auto run = [&](auto static_loss, kernels::l1_variant<float> variant, auto dynamic_loss) {
      check_three_ways(
          f, input,
          [&](float* grad) { return P::l1_loss(variant, input.data(), target.data(), input.numel(), r, grad); },
          [&](float* grad) {
            return static_loss.template forward_backward<P>(input.data(), target.data(), grad, batch, row);
          },
          dynamic_loss);
    };
    if (name.starts_with("l1")) {
      run(loss::l1{.reduce = r}, kernels::l1_variant<float>::l1(),
          [&](const nn::Variable& x) { return nn::l1_loss(x, t, r); });
    } else if (name.starts_with("smooth_l1")) {
      const float beta = f.scalar("beta");
      run(loss::smooth_l1{.reduce = r, .beta = beta}, kernels::l1_variant<float>::smooth_l1(beta),
          [&](const nn::Variable& x) { return nn::smooth_l1_loss(x, t, r, beta); });
    } else {
      const float delta = f.scalar("delta");
      run(loss::huber{.reduce = r, .delta = delta}, kernels::l1_variant<float>::huber(delta),
          [&](const nn::Variable& x) { return nn::huber_loss(x, t, r, delta); });
    }
  }
  // The defaults are PyTorch's: beta = delta = 1.
  CHECK(loss::smooth_l1{}.beta == 1.0f);
  CHECK(loss::huber{}.delta == 1.0f);
}

TEST_CASE("log_softmax followed by nll_loss is cross_entropy, in value and gradient, in both modes") {
  random_generator rng(31);
  Tensor<double> logits(shape{7, 6});
  for (auto& v : logits.span()) v = 3 * rng.normal<double>();
  const std::vector<std::int64_t> labels = {0, 5, -1, 3, 3, 1, -1};
  const std::vector<double> weight = {0.5, 1, 2, 0.25, 1.5, 1};
  using V = nn::basic_variable<double>;
  for (reduction r : {reduction::mean, reduction::sum})
    for (bool options : {false, true}) {
      CAPTURE(options);
      const std::vector<std::int64_t> used = options ? labels : std::vector<std::int64_t>{0, 5, 2, 3, 3, 1, 4};
      const std::span<const double> w = options ? std::span<const double>(weight) : std::span<const double>();
      const std::optional<std::int64_t> ignore = options ? std::optional<std::int64_t>(-1) : std::nullopt;
      V a(logits, true), b(logits, true);
      V via_nll = nn::nll_loss(nn::log_softmax(a, 1), used, {.reduce = r, .weight = w, .ignore_index = ignore});
      V fused = nn::cross_entropy(b, used, {.reduce = r, .weight = w, .ignore_index = ignore});
      CHECK(via_nll.item() == doctest::Approx(fused.item()).epsilon(1e-14));
      via_nll.backward();
      fused.backward();
      for (index_t i = 0; i < logits.numel(); ++i) CHECK(a.grad()[i] == doctest::Approx(b.grad()[i]).epsilon(1e-12));
    }

  // Static mode: a LogSoftmax<1> layer and loss::nll against the same Dense and loss::cross_entropy.
  using WithLogSoftmax = Sequential<policy::cpu, InputOf<double, 5>, Dense<6, Tanh>, Dense<4>, LogSoftmax<1>>;
  using Logits = Sequential<policy::cpu, InputOf<double, 5>, Dense<6, Tanh>, Dense<4>>;
  WithLogSoftmax log_net(8, 3);
  Logits logit_net(8, 3);
  Tensor<double> x(shape{8, 5});
  for (auto& v : x.span()) v = rng.normal<double>();
  Tensor<std::int64_t> y(shape{8}, {0, 3, 2, 9, 1, 1, 9, 3});
  const double nll_value = log_net.forward_backward(x, y, loss::nll{.weight = {1, 2, 0.5, 1}, .ignore_index = 9});
  const double ce_value =
      logit_net.forward_backward(x, y, loss::cross_entropy{.weight = {1, 2, 0.5, 1}, .ignore_index = 9});
  CHECK(nll_value == doctest::Approx(ce_value).epsilon(1e-14));
  const auto g_nll = log_net.gradient_values(), g_ce = logit_net.gradient_values();
  REQUIRE(g_nll.size() == g_ce.size());
  for (std::size_t i = 0; i < g_nll.size(); ++i) CHECK(g_nll[i] == doctest::Approx(g_ce[i]).epsilon(1e-12));
}

namespace {

// A static and a dynamic MLP with the same weights (the same seed draws them).
struct twin_models {
  static constexpr index_t batch = 16;
  Sequential<policy::cpu, Input<4>, Dense<8, ReLU>, Dense<3>> net{batch, 21};
  nn::Sequential model;
  Tensor<float> x{shape{batch, 4}};
  twin_models() {
    manual_seed(21);
    model = nn::Sequential(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3));
    random_generator rng(4);
    for (auto& v : x.span()) v = rng.normal<float>();
  }
  // The static model's loss and gradients against the dynamic model's, bit for bit.
  template <class Target, class Loss, class DynamicLoss>
  void check_same(const Tensor<Target>& y, const Loss& static_loss, DynamicLoss dynamic_loss) {
    const float s = net.forward_backward(x, y, static_loss);
    for (auto& p : model.parameters()) p.zero_grad();
    nn::Variable l = dynamic_loss(model(nn::Variable(x)));
    l.backward();
    CHECK(s == l.item());
    const auto static_grads = net.gradient_values();
    const auto dynamic_parameters = model.named_parameters();
    for (const auto& info : decltype(net)::named_parameter_infos()) {
      CAPTURE(info.name);
      const nn::Variable* dynamic = nullptr;
      for (const auto& [name, p] : dynamic_parameters)
        if (name == info.name) dynamic = &p;
      REQUIRE(dynamic);
      REQUIRE(dynamic->numel() == info.shape.numel());
      for (index_t i = 0; i < info.shape.numel(); ++i) CHECK(static_grads[info.offset + i] == dynamic->grad()[i]);
    }
  }
};

}  // namespace

TEST_CASE("static and dynamic mode give the same loss and gradients with every new loss and option") {
  twin_models m;
  Tensor<std::int64_t> labels(shape{twin_models::batch}, {0, 1, 2, 2, 1, 0, 7, 1, 2, 0, 7, 1, 1, 2, 0, 0});
  random_generator rng(5);
  Tensor<float> targets(shape{twin_models::batch, 3});
  for (auto& v : targets.span()) v = 2 * rng.normal<float>();
  const std::vector<float> weight = {0.2f, 1.5f, 1};
  for (reduction r : {reduction::mean, reduction::sum}) {
    CAPTURE(r == reduction::mean);
    m.check_same(labels, loss::cross_entropy{.reduce = r, .weight = weight, .ignore_index = 7, .label_smoothing = 0.3f},
                 [&](const nn::Variable& out) {
                   return nn::cross_entropy(
                       out, labels, {.reduce = r, .weight = weight, .ignore_index = 7, .label_smoothing = 0.3f});
                 });
    m.check_same(labels, loss::nll{.reduce = r, .weight = weight, .ignore_index = 7}, [&](const nn::Variable& out) {
      return nn::nll_loss(out, labels, {.reduce = r, .weight = weight, .ignore_index = 7});
    });
    m.check_same(targets, loss::l1{.reduce = r}, [&](const nn::Variable& out) {
      return nn::l1_loss(out, nn::Variable(targets), r);
    });
    m.check_same(targets, loss::smooth_l1{.reduce = r, .beta = 0.4f}, [&](const nn::Variable& out) {
      return nn::smooth_l1_loss(out, nn::Variable(targets), r, 0.4f);
    });
    m.check_same(targets, loss::huber{.reduce = r, .delta = 1.7f}, [&](const nn::Variable& out) {
      return nn::huber_loss(out, nn::Variable(targets), r, 1.7f);
    });
  }
}

TEST_CASE("kiln::Model trains with the new losses in both modes, and lets ignore_index labels through") {
  // Both modes' evaluate give the same loss; each Model is over fresh twins, since an optimizer keeps its model.
  auto evaluate_both = [](const auto& loss, const auto& y) {
    twin_models m;
    Model static_model(m.net), dynamic_model(m.model);
    static_model.compile(optim::SGD({.lr = 0.1}), loss);
    dynamic_model.compile(optim::SGD({.lr = 0.1}), loss);
    const double s = static_model.evaluate(m.x, y).loss;
    CHECK(std::isfinite(s));
    CHECK(s == dynamic_model.evaluate(m.x, y).loss);
  };
  Tensor<std::int64_t> labels(shape{twin_models::batch}, {0, 1, 2, 2, 1, 0, -1, 1, 2, 0, -1, 1, 1, 2, 0, 0});
  const loss::cross_entropy ce{.weight = {1, 2, 1}, .ignore_index = -1, .label_smoothing = 0.1f};
  evaluate_both(ce, labels);
  evaluate_both(loss::nll{.ignore_index = -1}, labels);
  Tensor<float> targets(shape{twin_models::batch, 3}, 0.5f);
  evaluate_both(loss::huber{.delta = 0.5f}, targets);
  evaluate_both(loss::smooth_l1{.beta = 0.5f}, targets);
  evaluate_both(loss::mean_absolute_error, targets);

  twin_models m;
  Model model(m.net);
  model.compile(optim::SGD({.lr = 0.1}), ce);
  const auto history = model.fit(m.x, labels, {.epochs = 3, .batch_size = 8, .verbose = 0});
  CHECK(history.series("loss").back() < history.series("loss").front());
  // A label out of range that is not the ignored one is still named by the Model.
  labels[3] = -2;
  CHECK_THROWS_WITH_AS(model.evaluate(m.x, labels),
                       "Model::evaluate: expected class labels in [0, 3) for the model's 3 outputs, found -2 for "
                       "sample 3 of the data set",
                       kiln::error);
}

TEST_CASE("bad labels and options are errors that say what was expected, what was found and where") {
  const Tensor<float> logits(shape{2, 3}, {0.1f, 0.2f, 0.3f, -1, 0, 1});
  Tensor<float> grad(logits.shape());
  const std::vector<std::int64_t> bad = {1, 3};
  // Labels out of range: the kernels (both losses, with and without an ignored label) and both modes.
  CHECK_THROWS_WITH_AS(P::nll(logits.data(), bad.data(), 2, 3, reduction::mean, {}, grad.data()),
                       "nll_loss: expected labels in [0, 3), found 3 at row 1", kiln::error);
  CHECK_THROWS_WITH_AS(P::softmax_cross_entropy(logits.data(), bad.data(), 2, 3, reduction::mean,
                                                {.has_ignore_index = true, .ignore_index = -100}, grad.data()),
                       "cross_entropy: expected labels in [0, 3) or the ignore_index -100, found 3 at row 1",
                       kiln::error);
  CHECK_THROWS_WITH_AS(loss::nll{}.forward_backward<P>(logits.data(), bad.data(), grad.data(), 2, 3),
                       "nll_loss: expected labels in [0, 3), found 3 at row 1", kiln::error);
  nn::Variable x(logits, true);
  CHECK_THROWS_WITH_AS(nn::nll_loss(x, bad), "nll_loss: expected labels in [0, 3), found 3 at row 1", kiln::error);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, bad, {.label_smoothing = 0.1f}),
                       "cross_entropy: expected labels in [0, 3), found 3 at row 1", kiln::error);
  const std::vector<std::int64_t> good = {1, 2};
  CHECK_THROWS_WITH_AS(nn::nll_loss(nn::Variable(shape{2, 3, 1}), good),
                       "nll_loss: expected log-probabilities of shape [batch, classes], found [2, 3, 1]", kiln::error);
  CHECK_THROWS_WITH_AS(nn::nll_loss(x, std::vector<std::int64_t>{1}),
                       "nll_loss: expected 2 labels for log-probabilities of shape [2, 3], found 1", kiln::error);

  // A weight vector of the wrong length.
  CHECK_THROWS_WITH_AS(
      (loss::cross_entropy{.weight = {1, 2}}.forward_backward<P>(logits.data(), good.data(), grad.data(), 2, 3)),
      "cross_entropy: expected 3 class weights (one per class of the input's 3 columns), found 2", kiln::error);
  CHECK_THROWS_WITH_AS(
      (loss::nll{.weight = {1, 2, 3, 4}}.forward_backward<P>(logits.data(), good.data(), grad.data(), 2, 3)),
      "nll_loss: expected 3 class weights (one per class of the input's 3 columns), found 4",
                       kiln::error);
  const std::vector<float> two = {1, 2};
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, good, {.weight = two}),
                       "cross_entropy: expected 3 class weights (one per class of the input's 3 columns), found 2",
                       kiln::error);
  CHECK_THROWS_WITH_AS(nn::nll_loss(x, good, {.weight = two}),
                       "nll_loss: expected 3 class weights (one per class of the input's 3 columns), found 2",
                       kiln::error);

  // label_smoothing outside [0, 1], NaN included.
  CHECK_THROWS_WITH_AS(
      loss::cross_entropy{.label_smoothing = 1.5f}.forward_backward<P>(logits.data(), good.data(), grad.data(), 2, 3),
      "cross_entropy: expected label_smoothing in [0, 1], found 1.5", kiln::error);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, good, {.label_smoothing = -0.25f}),
                       "cross_entropy: expected label_smoothing in [0, 1], found -0.25", kiln::error);
  CHECK_THROWS_AS(nn::cross_entropy(x, good, {.label_smoothing = std::numeric_limits<float>::quiet_NaN()}),
                  kiln::error);
  CHECK_NOTHROW(nn::cross_entropy(x, good, {.label_smoothing = 1.0f}));

  // Negative beta, and delta not above 0.
  const Tensor<float> target(shape{2, 3}, 0.0f);
  nn::Variable t(target);
  CHECK_THROWS_WITH_AS(nn::smooth_l1_loss(x, t, reduction::mean, -1.0f),
                       "smooth_l1_loss: expected beta >= 0, found -1", kiln::error);
  CHECK_THROWS_WITH_AS(
      loss::smooth_l1{.beta = -0.5f}.forward_backward<P>(logits.data(), target.data(), grad.data(), 2, 3),
      "smooth_l1_loss: expected beta >= 0, found -0.5", kiln::error);
  CHECK_THROWS_WITH_AS(nn::huber_loss(x, t, reduction::mean, -2.0f), "huber_loss: expected delta > 0, found -2",
                       kiln::error);
  CHECK_THROWS_WITH_AS(loss::huber{.delta = 0}.forward_backward<P>(logits.data(), target.data(), grad.data(), 2, 3),
                       "huber_loss: expected delta > 0, found 0", kiln::error);
  CHECK_THROWS_WITH_AS(nn::l1_loss(x, nn::Variable(shape{3, 2})),
                       "l1_loss: expected input and target of the same shape, found [2, 3] and [3, 2]", kiln::error);
}

TEST_CASE("every row ignored: the mean is NaN and the gradient zero, as in PyTorch") {
  const Tensor<float> logits(shape{2, 3}, {0.1f, 0.2f, 0.3f, -1, 0, 1});
  const std::vector<std::int64_t> ignored = {-100, -100};
  nn::Variable x(logits, true);
  nn::Variable l = nn::cross_entropy(x, ignored, {.ignore_index = -100, .label_smoothing = 0.2f});
  CHECK(std::isnan(l.item()));
  l.backward();
  for (float g : x.grad().span()) CHECK(g == 0);
  nn::Variable sum = nn::nll_loss(x, ignored, {.reduce = reduction::sum, .ignore_index = -100});
  CHECK(sum.item() == 0);
}

TEST_CASE("reduction::none keeps one loss per element (per row for the class losses) that the sum adds up") {
  random_generator rng(31);
  Tensor<float> input(shape{5, 4}), target(shape{5, 4});
  for (auto& v : input.span()) v = rng.normal<float>();
  for (auto& v : target.span()) v = rng.normal<float>();
  const nn::Variable x(input), t(target);
  const auto none = reduction::none;

  // Element-wise losses: each element's value by its formula, and their sum the sum reduction's.
  const auto check_elements = [&](const nn::Variable& unreduced, const nn::Variable& summed, auto formula) {
    REQUIRE(unreduced.shape() == input.shape());
    double total = 0;
    for (index_t i = 0; i < input.numel(); ++i) {
      CHECK(unreduced.value()[i] == doctest::Approx(formula(input[i], target[i])).epsilon(1e-6));
      total += unreduced.value()[i];
    }
    CHECK(summed.item() == doctest::Approx(total).epsilon(1e-5));
  };
  check_elements(nn::mse_loss(x, t, none), nn::mse_loss(x, t, reduction::sum),
                 [](double a, double b) { return (a - b) * (a - b); });
  check_elements(nn::l1_loss(x, t, none), nn::l1_loss(x, t, reduction::sum),
                 [](double a, double b) { return std::abs(a - b); });
  check_elements(nn::huber_loss(x, t, none, 0.7f), nn::huber_loss(x, t, reduction::sum, 0.7f), [](double a, double b) {
    const double d = std::abs(a - b);
    return d < 0.7 ? 0.5 * d * d : 0.7 * (d - 0.35);
  });
  Tensor<float> probabilities(input.shape());
  for (auto& v : probabilities.span()) v = rng.uniform<float>(0.0f, 1.0f);
  const nn::Variable p(probabilities);
  const auto bce = nn::binary_cross_entropy_with_logits(x, p, none);
  for (index_t i = 0; i < input.numel(); ++i) {
    const double s = 1 / (1 + std::exp(-double(input[i])));
    const double expected = -(probabilities[i] * std::log(s) + (1 - probabilities[i]) * std::log(1 - s));
    CHECK(bce.value()[i] == doctest::Approx(expected).epsilon(1e-5));
  }

  // Class losses: one value per row, the row alone's sum; an ignored row 0; with class weights, the mean is the sum
  // of the rows over the sum of their labels' weights.
  const std::vector<std::int64_t> labels = {3, -1, 0, 2, 3};
  const std::vector<float> weight = {0.5f, 2.0f, 1.25f, 3.0f};
  const nn::cross_entropy_options<float> options{.reduce = none, .weight = weight, .ignore_index = -1,
                                                 .label_smoothing = 0.1f};
  const auto rows = nn::cross_entropy(x, labels, options);
  REQUIRE(rows.shape() == shape{5});
  auto summed_options = options;
  summed_options.reduce = reduction::sum;
  double total = 0;
  for (index_t row = 0; row < 5; ++row) {
    const nn::Variable one_row(
        Tensor<float>(shape{1, 4}, {input[row * 4], input[row * 4 + 1], input[row * 4 + 2], input[row * 4 + 3]}));
    const std::vector<std::int64_t> one_label = {labels[std::size_t(row)]};
    CHECK(rows.value()[row] == nn::cross_entropy(one_row, one_label, summed_options).item());
    total += rows.value()[row];
  }
  CHECK(rows.value()[1] == 0.0f);
  CHECK(nn::cross_entropy(x, labels, summed_options).item() == doctest::Approx(total).epsilon(1e-6));
  auto mean_options = options;
  mean_options.reduce = reduction::mean;
  CHECK(nn::cross_entropy(x, labels, mean_options).item() ==
        doctest::Approx(total / (3.0 + 0.5 + 1.25 + 3.0)).epsilon(1e-6));
  // Without options, and nll after log_softmax: the same per-row cross-entropy.
  const std::vector<std::int64_t> all = {3, 1, 0, 2, 3};
  const auto plain = nn::cross_entropy(x, all, none);
  const auto via_nll = nn::nll_loss(nn::log_softmax(x, 1), all, none);
  for (index_t row = 0; row < 5; ++row) CHECK(plain.value()[row] == doctest::Approx(via_nll.value()[row]));

  // A per-sample weighting through backward: each row's gradient scaled by its own upstream value.
  nn::Variable logits(input, true);
  nn::Variable sample_weight(Tensor<float>(shape{5}, {1, 0, 2, 0.5f, 1}));
  nn::sum(nn::cross_entropy(logits, all, none) * sample_weight).backward();
  nn::Variable reference(input, true);
  nn::cross_entropy(reference, all, reduction::sum).backward();
  for (index_t row = 0; row < 5; ++row)
    for (index_t c = 0; c < 4; ++c)
      CHECK(logits.grad()[row * 4 + c] ==
            doctest::Approx(sample_weight.value()[row] * reference.grad()[row * 4 + c]).epsilon(1e-6));
}

TEST_CASE("reduction::none where one number is needed is an error that names the loss") {
  const Tensor<float> x(shape{2, 3}, {0.1f, 0.2f, 0.3f, -1, 0, 1});
  Tensor<float> grad(x.shape());
  const std::vector<std::int64_t> labels = {1, 2};
  CHECK_THROWS_WITH_AS(P::mse(x.data(), x.data(), 6, reduction::none, grad.data()),
                       doctest::Contains("mse: expected reduction mean or sum, found none"), kiln::error);
  CHECK_THROWS_WITH_AS(
      (loss::cross_entropy{.reduce = reduction::none}.forward_backward<P>(x.data(), labels.data(), grad.data(), 2, 3)),
      doctest::Contains("cross_entropy: expected reduction mean or sum, found none"), kiln::error);
  CHECK_THROWS_WITH_AS(
      (loss::huber{.reduce = reduction::none}.forward_backward<P>(x.data(), x.data(), grad.data(), 2, 3)),
      doctest::Contains("huber_loss: expected reduction mean or sum, found none"), kiln::error);
  // A static model trains on one number.
  Sequential<P, Input<3>, Dense<2>> net(2, 1);
  optim::SGD opt({.lr = 0.1});
  CHECK_THROWS_WITH_AS(net.train_step(x, Tensor<std::int64_t>(shape{2}, {0, 1}),
                                      loss::cross_entropy{.reduce = reduction::none}, opt),
                       doctest::Contains("found none"), kiln::error);
}
