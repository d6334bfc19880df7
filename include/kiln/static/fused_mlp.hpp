// kiln::fused_mlp_trainer on a CPU policy: trains a static MLP with one parallel region per step
// (kernels/cpu/fused_mlp.hpp), the CPU counterpart of the GPU's one-launch step (static/fused_mlp.cuh). It takes a
// model of the form
//
//   Sequential<policy::cpu (or cpu_sparse_input, cpu_bf16, cpu_bf16x3), Input<...>, [Flatten,] Dense<Hidden, ReLU>,
//              Dense<Out>>
//
// with softmax cross-entropy (mean) and Adam or AdamW, and updates the model's own parameters in place, so that
// predict, evaluate, state_dict and the weight writers see the trained weights. Its losses, parameters and gradients
// are those of Sequential::train_step with the same Adam, bit for bit, on any number of threads; the gradients of
// the last step are left in the model's gradient_values() as train_step leaves them. Adam's moments and step count
// are the trainer's (a checkpoint of the model alone resumes with fresh ones).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/class_loss_options.hpp"
#include "kiln/kernels/cpu/fused_mlp.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/policy.hpp"
#include "kiln/static/fused_mlp_common.hpp"

namespace kiln {

namespace detail {

// The CPU policies whose products the fused step runs itself: policy::cpu and cpu_sparse_input (the default product
// precision) and those that fix a precision (cpu_bf16, cpu_bf16x3). Not cpu_blas, whose products are OpenBLAS's.
template <class Policy>
constexpr bool fused_cpu_policy =
    std::is_same_v<Policy, policy::cpu> || std::is_same_v<Policy, policy::cpu_sparse_input> ||
    (std::is_base_of_v<policy::cpu, Policy> && requires { Policy::precision; });

template <class Policy>
kernels::cpu::product_precision fused_product_precision() {
  if constexpr (requires { Policy::precision; }) return Policy::precision;
  else return kernels::cpu::default_product_precision();
}

}  // namespace detail

// Trains `Net` one fused step per batch on the CPU threads (see the top of this file). The model must outlive the
// trainer.
template <class Net>
class fused_mlp_trainer<Net, true> {
  using model = detail::fused_mlp_model<Net>;
  static_assert(detail::fused_cpu_policy<typename Net::policy>,
                "kiln::fused_mlp_trainer: expected a model on policy::cpu, cpu_sparse_input, cpu_bf16 or cpu_bf16x3 "
                "(cpu_blas's products are OpenBLAS's)");
  static constexpr index_t in = model::in, hidden = model::hidden, out = model::out;

 public:
  // Adam (decoupled = false) or AdamW (true) with these hyper-parameters, which detail::check_fused_mlp_options
  // checks (no amsgrad, regularisation or clipping).
  fused_mlp_trainer(Net& net, const optim::adam_options& o = {}, bool decoupled = false)
      : net_(net),
        exp_avg_(Net::flat_parameter_size),
        exp_avg_sq_(Net::flat_parameter_size),
        hidden_values_(net.max_batch() * hidden),
        hidden_grads_(net.max_batch() * hidden),
        head_values_(net.max_batch() * out),
        row_losses_(net.max_batch()),
        options_(o),
        decoupled_(decoupled) {
    detail::check_fused_mlp_options(o);
    detail::bind_fused_parameters(net, exp_avg_.data(), exp_avg_sq_.data(),
                                  {&arguments_.w1, &arguments_.b1, &arguments_.w2, &arguments_.b2});
    std::fill_n(exp_avg_.data(), exp_avg_.size(), 0.0f);
    std::fill_n(exp_avg_sq_.data(), exp_avg_sq_.size(), 0.0f);
    arguments_.in = in;
    arguments_.hidden = hidden;
    arguments_.out = out;
    arguments_.hidden_values = hidden_values_.data();
    arguments_.hidden_grads = hidden_grads_.data();
    arguments_.head_values = head_values_.data();
    arguments_.row_losses = row_losses_.data();
  }
  // AdamW's hyper-parameters (its default weight decay 0.01, decoupled from the gradient).
  fused_mlp_trainer(Net& net, const optim::adamw_options& o)
      : fused_mlp_trainer(net, detail::adam_options_of(o), true) {}

  // Adam's learning rate, which the optimizer's schedulers (optim/lr_scheduler.hpp) set as they set an optimizer's.
  double lr() const { return options_.lr; }
  void set_lr(double lr) {
    if (!(lr >= 0)) fail("fused_mlp_trainer::set_lr: expected lr >= 0, found ", lr);
    options_.lr = lr;
  }

  fused_mlp_trainer(const fused_mlp_trainer&) = delete;
  fused_mlp_trainer& operator=(const fused_mlp_trainer&) = delete;

  // One step on a batch in host memory; returns its loss. A label outside [0, Out) is a kiln::error naming the row
  // and the label, before anything is changed.
  float train_step(tensor_view<const float> x, tensor_view<const std::int64_t> labels) {
    const index_t batch = detail::check_fused_mlp_batch(net_, x, labels);
    // Checked here, outside the parallel region, where an error can still leave it.
    kernels::check_class_labels("cross_entropy", labels.data(), batch, out, kernels::class_loss_options<float>{});
    ++steps_;
    arguments_.x = x.data();
    arguments_.labels = labels.data();
    arguments_.batch = batch;
    arguments_.adam = {float(options_.lr),           float(options_.beta1), float(options_.beta2), float(options_.eps),
                       float(options_.weight_decay), decoupled_,            false,                 steps_};
    arguments_.precision = detail::fused_product_precision<typename Net::policy>();
    arguments_.sparse_input = Net::policy::sparse_input_products;
    return kernels::cpu::fused_mlp_step(arguments_, balance_);
  }
  // The same step, each thread's parts timed into `parts` (the same kernels and bits).
  float train_step(tensor_view<const float> x, tensor_view<const std::int64_t> labels,
                   kernels::cpu::fused_mlp_parts& parts) {
    arguments_.parts = &parts;
    struct stop_timing {
      kernels::cpu::fused_mlp_step_arguments& arguments;
      ~stop_timing() { arguments.parts = nullptr; }
    } stop{arguments_};
    return train_step(x, labels);
  }

  // Adam's steps taken so far.
  long long steps() const { return steps_; }

 private:
  Net& net_;
  aligned_buffer<float> exp_avg_, exp_avg_sq_;
  aligned_buffer<float> hidden_values_, hidden_grads_, head_values_, row_losses_;  // the step's scratch
  optim::adam_options options_;
  bool decoupled_;
  long long steps_ = 0;
  kernels::cpu::fused_mlp_step_arguments arguments_{};
  // The threads' shares of the hidden units, learned from this trainer's steps: a thread keeps its units (their rows
  // of W1, their Adam state) in its core's cache from step to step, so the shares cannot be handed out afresh per step
  // as the layer-by-layer kernels hand out their chunks.
  kernels::cpu::thread_balance balance_;
};

}  // namespace kiln
