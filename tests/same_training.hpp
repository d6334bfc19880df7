// Trains two static models side by side on one batch and requires the same bits from both: the check behind every
// static option that must not change results (fused epilogues, flat parameters), each fusion of one layer's work into
// another's included. And a static model beside its dynamic twin: the same losses.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <utility>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

// Trains `a` and `b` (the same model type and seed, built with different static options) for `steps` steps on one
// batch of `batch` random normal inputs and random class labels below the model's output size, with cross-entropy:
// every step's loss and every gradient must be the same bits, and so must the parameters at the end.
template <class Net, class Optimizer>
void require_same_training(Net& a, Optimizer& optimizer_a, Net& b, Optimizer& optimizer_b, kiln::index_t batch,
                           std::uint64_t seed, int steps) {
  using namespace kiln;
  random_generator rng(seed);
  Tensor<float> x(Net::input_shape::batch_shape(batch));
  for (auto& v : x.span()) v = rng.normal<float>();
  Tensor<std::int64_t> labels(shape{batch});
  for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(Net::output_shape::size));
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    const float loss_a = a.train_step(x, labels, loss::cross_entropy{}, optimizer_a);
    const float loss_b = b.train_step(x, labels, loss::cross_entropy{}, optimizer_b);
    REQUIRE(loss_a == loss_b);
    const auto grads_a = a.gradient_values(), grads_b = b.gradient_values();
    REQUIRE(grads_a.size() == grads_b.size());
    for (std::size_t i = 0; i < grads_a.size(); ++i) REQUIRE(grads_a[i] == grads_b[i]);
  }
  const auto params_a = a.parameter_values(), params_b = b.parameter_values();
  REQUIRE(params_a.size() == params_b.size());
  for (std::size_t i = 0; i < params_a.size(); ++i) REQUIRE(params_a[i] == params_b[i]);
}

// `steps` Adam steps (with `options`) of the static `net` and of the dynamic `model` (the same weights) on one batch:
// equal losses. after_step(static optimizer, dynamic optimizer) runs after each step, for checks of the optimizers'
// own state.
template <class Net, class AfterStep>
void check_same_losses(Net& net, kiln::nn::Sequential& model,
                       const std::pair<kiln::Tensor<float>, kiln::Tensor<std::int64_t>>& batch, int steps,
                       const kiln::optim::adam_options& options, AfterStep&& after_step) {
  using namespace kiln;
  const auto& [x, y] = batch;
  optim::Adam static_opt(options);
  optim::Adam dynamic_opt(model.parameters(), options);
  nn::Variable input(x);
  for (int step = 0; step < steps; ++step) {
    const float s = net.train_step(x, y, loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    auto l = nn::cross_entropy(model(input), y);
    l.backward();
    dynamic_opt.step();
    CHECK(s == l.item());
    after_step(static_opt, dynamic_opt);
  }
}
template <class Net>
void check_same_losses(Net& net, kiln::nn::Sequential& model,
                       const std::pair<kiln::Tensor<float>, kiln::Tensor<std::int64_t>>& batch, int steps) {
  check_same_losses(net, model, batch, steps, {.lr = 1e-3}, [](const auto&, const auto&) {});
}
