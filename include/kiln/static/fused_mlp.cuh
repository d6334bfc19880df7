// kiln::fused_mlp_trainer: trains a static MLP on a CUDA policy with one kernel launch per step, the ladder's rung 7
// (kernels/cuda/fused_mlp.cuh). It takes a model of the form
//
//   Sequential<policy::cuda (or cuda_tf32, cudnn), Input<...>, [Flatten,] Dense<Hidden, ReLU>, Dense<Out>>
//
// with softmax cross-entropy (mean) and Adam or AdamW, and updates the model's own parameters in place, so that
// predict, evaluate, state_dict and the safetensors writers see the trained weights as after train_step. The
// gradients of the last step are left in the model's gradient_values(), as Sequential::train_step leaves them.
// Adam's moments and step count are the trainer's (a checkpoint of the model alone resumes with fresh ones).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/core/error.hpp"
#include "kiln/kernels/cuda/fused_mlp.cuh"
#include "kiln/kernels/cuda/loss.cuh"
#include "kiln/layers/activation.hpp"
#include "kiln/layers/dense.hpp"
#include "kiln/layers/flatten.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/static/fused_mlp_common.hpp"
#include "kiln/static/resident.hpp"
#include "kiln/static/sequential.hpp"

namespace kiln {


// Trains `Net` one fused kernel launch per step (see the top of this file). The model must outlive the trainer.
template <class Net>
class fused_mlp_trainer<Net, false> {
  using model = detail::fused_mlp_model<Net>;
  static constexpr index_t in = model::in, hidden = model::hidden, out = model::out;

 public:
  // Adam (decoupled = false) or AdamW (true) with these hyper-parameters, which detail::check_fused_mlp_options
  // checks (no amsgrad, regularisation or clipping).
  fused_mlp_trainer(Net& net, const optim::adam_options& o = {}, bool decoupled = false)
      : net_(net),
        exp_avg_(Net::flat_parameter_size),
        exp_avg_sq_(Net::flat_parameter_size),
        hidden_values_(net.max_batch() * hidden),
        step_(1),
        bias_corrections_(4),
        loss_(1),
        bad_label_(1) {
    detail::check_fused_mlp_options(o);
    kernels::cuda::check_fused_mlp(net.max_batch(), in, hidden, out, units_);
    // What every step passes alike; enqueue_train_step fills in the batch.
    arguments_.in = in;
    arguments_.hidden = hidden;
    arguments_.out = out;
    arguments_.hidden_values = hidden_values_.data();
    arguments_.step = step_.data();
    arguments_.bias_corrections = bias_corrections_.data();
    arguments_.bad_label = bad_label_.data();
    lr_ = o.lr;
    arguments_.adam = {float(o.lr),           float(o.beta1), float(o.beta2), float(o.eps),
                       float(o.weight_decay), decoupled,      false,          0};
    detail::bind_fused_parameters(net, exp_avg_.data(), exp_avg_sq_.data(),
                                  {&arguments_.w1, &arguments_.b1, &arguments_.w2, &arguments_.b2});
    const cudaStream_t stream = kiln::cuda::current_stream();
    KILN_CUDA_CHECK(cudaMemsetAsync(exp_avg_.data(), 0, sizeof(float) * std::size_t(exp_avg_.size()), stream));
    KILN_CUDA_CHECK(cudaMemsetAsync(exp_avg_sq_.data(), 0, sizeof(float) * std::size_t(exp_avg_sq_.size()), stream));
    KILN_CUDA_CHECK(cudaMemsetAsync(step_.data(), 0, sizeof(long long), stream));
    kernels::cuda::fused_mlp_prepare_adam(arguments_);
  }
  // AdamW's hyper-parameters (its default weight decay 0.01, decoupled from the gradient).
  fused_mlp_trainer(Net& net, const optim::adamw_options& o)
      : fused_mlp_trainer(net, detail::adam_options_of(o), true) {}

  // Hidden units per block of the kernel (1, 2, 4 or 8; kernels::cuda::fused_mlp_auto_units(Hidden) until set): fewer
  // give more blocks, each reading the whole batch. For measuring the split; the results agree to rounding either way.
  void set_units_per_block(int units) {
    kernels::cuda::check_fused_mlp(net_.max_batch(), in, hidden, out, units);
    units_ = units;
  }
  int units_per_block() const { return units_; }

  // Adam's learning rate, which the optimizer's schedulers (optim/lr_scheduler.hpp) set as they set an optimizer's.
  double lr() const { return lr_; }
  void set_lr(double lr) {
    if (!(lr >= 0)) fail("fused_mlp_trainer::set_lr: expected lr >= 0, found ", lr);
    lr_ = lr;
    arguments_.adam.lr = float(lr);
  }

  fused_mlp_trainer(const fused_mlp_trainer&) = delete;
  fused_mlp_trainer& operator=(const fused_mlp_trainer&) = delete;

  // One step on a batch in device memory; waits for it and returns its loss. A label outside [0, Out) is a
  // kiln::error naming the row and the label, after the step (as the CUDA loss kernels report it).
  float train_step(resident_t, tensor_view<const float> x, tensor_view<const std::int64_t> labels) {
    enqueue_train_step(resident, x, labels, loss_.data());
    float loss = 0;
    unsigned long long flagged = 0;
    const cudaStream_t stream = kiln::cuda::current_stream();
    KILN_CUDA_CHECK(cudaMemcpyAsync(&loss, loss_.data(), sizeof loss, cudaMemcpyDeviceToHost, stream));
    KILN_CUDA_CHECK(cudaMemcpyAsync(&flagged, bad_label_.data(), sizeof flagged, cudaMemcpyDeviceToHost, stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (flagged != no_flag)
      kernels::cuda::detail::fail_flagged_label("cross_entropy", labels.data(), static_cast<long long>(flagged), out,
                                                kernels::class_loss_options<float>{});
    return loss;
  }

  // The same step with nothing waiting: the loss goes to loss_out (device memory). Labels are not checked here (a
  // row whose label is out of range adds nothing to the loss), as Sequential::enqueue_train_step.
  void enqueue_train_step(resident_t, tensor_view<const float> x, tensor_view<const std::int64_t> labels,
                          float* loss_out) {
    const index_t batch = detail::check_fused_mlp_batch(net_, x, labels);
    arguments_.x = x.data();
    arguments_.labels = labels.data();
    arguments_.batch = batch;
    arguments_.loss = loss_out;
    arguments_.loss_scale = kernels::reduction_scale<float>("cross_entropy", reduction::mean, batch);
    kernels::cuda::fused_mlp_step(arguments_, units_);
  }

  // Adam's steps taken so far (waits for the device).
  long long steps() const {
    long long taken = 0;
    KILN_CUDA_CHECK(cudaMemcpy(&taken, step_.data(), sizeof taken, cudaMemcpyDeviceToHost));
    return taken;
  }

 private:
  // No row flagged: every bit set, the largest value of the unsigned minimum the kernel keeps.
  static constexpr unsigned long long no_flag = ~0ull;

  Net& net_;
  kiln::cuda::device_buffer<float> exp_avg_, exp_avg_sq_, hidden_values_;
  kiln::cuda::device_buffer<long long> step_;
  kiln::cuda::device_buffer<float> bias_corrections_;
  kiln::cuda::device_buffer<float> loss_;
  kiln::cuda::device_buffer<long long> bad_label_;
  kernels::cuda::fused_mlp_step_arguments arguments_{};
  int units_ = kernels::cuda::fused_mlp_auto_units(hidden);
  double lr_ = 0;  // Adam's rate as set, in double as an optimizer keeps it
};

}  // namespace kiln
