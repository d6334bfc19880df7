// kiln::Sequential<Policy, Input<...>, Layers...>: a model whose layers are types. Shapes are inferred and checked by
// the compiler, all memory (parameters, gradients, activations, scratch) is planned and allocated once at
// construction for a maximum batch, parameters live in one flat buffer, and a training step allocates nothing.
//
// It is made of three parts, each in a file of its own: the plan (static/plan.hpp: shapes, offsets and names, all
// fixed by the type), the state (static/state.hpp: parameters, gradients, buffers, generators, state_dict, freezing;
// Sequential derives from it, so its members are the model's) and the executor (static/executor.hpp: the workspace,
// planned by liveness, and the forward and backward passes, fused by the rules of static/fusion_rules.hpp). Here they
// are put together behind the training API: staging, input checks, the loss and the optimizer step, profiling.
//
// Memory lives where the policy keeps it (Policy::buffer): host memory for the CPU policies, device memory for the
// CUDA ones. Batches passed as plain views are host data: on a device policy they are uploaded into staging buffers
// planned at construction. A batch already in the policy's memory is passed with kiln::resident and read in place.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/replicas.hpp"
#include "kiln/core/step_profile.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"
#include "kiln/optim/parameter.hpp"
#include "kiln/policy.hpp"
#include "kiln/static/executor.hpp"
#include "kiln/static/input.hpp"
#include "kiln/static/options.hpp"
#include "kiln/static/plan.hpp"
#include "kiln/static/resident.hpp"
#include "kiln/static/state.hpp"

namespace kiln {

namespace detail {
// An optimizer that names its policy must name the model's, or one whose memory is the model's: its kernels read the
// model's parameters (policy::cpu's Adam updates a policy::cpu_bf16 model, whose parameters are host floats too).
template <class O, class P>
concept optimizer_for_policy = !requires { typename O::policy; } || std::is_same_v<typename O::policy, P> ||
                               (O::policy::host_accessible && P::host_accessible);
}  // namespace detail

template <class Policy, class InputSpec, class... Layers>
class Sequential : public static_state<static_plan<Policy, InputSpec, Layers...>> {
 public:
  using plan = static_plan<Policy, InputSpec, Layers...>;
  using value_type = typename InputSpec::value_type;
  using T = value_type;
  using policy = Policy;
  using input_shape = typename plan::input_shape;
  using binding = typename plan::binding;
  using output_shape = typename plan::output_shape;
  static constexpr std::size_t layer_count = plan::layer_count;
  // Whether the model's memory (parameters, workspace, forward's result) can be read on the host.
  static constexpr bool host_accessible = Policy::host_accessible;
  // Total parameter elements including alignment padding between layers (the padding stays zero).
  static constexpr index_t flat_parameter_size = plan::flat_parameter_size;
  // Total non-trainable state (running statistics), kept in a second flat buffer.
  static constexpr index_t flat_buffer_size = plan::flat_buffer_size;

 private:
  using state = static_state<plan>;
  using executor = static_executor<plan>;
  template <class U>
  using policy_buffer = typename Policy::template buffer<U>;

 public:
  // Plans and allocates everything for batches of up to max_batch samples, initialising the k-th layer that has
  // parameters from random_generator(seed).fork(k), like dynamic mode after kiln::manual_seed(seed).
  explicit Sequential(index_t max_batch, std::uint64_t seed = 0, static_options options = {})
      : state(seed), max_batch_(checked_max_batch(max_batch)), options_(options), executor_(planned(max_batch)) {
    plan_staging();
  }

  // A copy is a model of its own: the same parameters, gradients, running statistics, generators, frozen layers and
  // mode, with its own workspace.
  Sequential(const Sequential& other)
      : state(other), max_batch_(other.max_batch_), options_(other.options_), training_(other.training_),
        executor_(planned(other.max_batch_)) {
    plan_staging();
  }
  Sequential& operator=(const Sequential& other) {
    if (this != &other) *this = Sequential(other);
    return *this;
  }
  // Moving keeps every buffer where it is.
  Sequential(Sequential&&) noexcept = default;
  Sequential& operator=(Sequential&&) noexcept = default;
  ~Sequential() = default;

  index_t max_batch() const { return max_batch_; }
  const static_options& options() const { return options_; }
  void set_options(const static_options& o) { options_ = o; }
  // Training mode affects layers such as dropout and batch normalisation; train_step always trains.
  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool is_training() const { return training_; }

  // Data-parallel training: the sums over this model's replicas, which its layers that compute across them
  // (SyncBatchNorm) reach in layer_context::replicas. distributed::static_data_parallel sets them while it wraps the
  // model; null, the default, for a model alone. Every replica then runs each training pass (train_step,
  // forward_backward, forward in training mode) together with the others. They are lent to this object: a copy or a
  // move of the model starts without them, and assigning to the model keeps its own.
  void set_replicas(replica_reducer* replicas) { replicas_.lent = replicas; }
  replica_reducer* replicas() const { return replicas_.lent; }

  // Runs the layers on a batch of host data and returns a view of the output inside the workspace (valid until the
  // next call; in the policy's memory, see last_output_on_host).
  tensor_view<const T> forward(tensor_view<const T> x) {
    index_t batch = check_input(x, "Sequential::forward");
    return forward_batch(stage_input(x, batch), batch);
  }
  // The same on a batch already in the policy's memory.
  tensor_view<const T> forward(resident_t, tensor_view<const T> x) {
    return forward_batch(x.data(), check_input(x, "Sequential::forward"));
  }

  // The output of the last forward pass (train_step included), still in the workspace, in the policy's memory.
  tensor_view<const T> last_output() const { return {executor_.output(), output_shape::batch_shape(executor_.last_batch())}; }
  // The same, readable on the host: the workspace itself on CPU policies, otherwise a host copy (valid until the
  // next call) downloaded into a buffer planned at construction.
  tensor_view<const T> last_output_on_host() {
    if constexpr (host_accessible) {
      return last_output();
    } else {
      this->download(executor_.output(), output_host_.data(), executor_.last_batch() * output_shape::size);
      return {output_host_.data(), output_shape::batch_shape(executor_.last_batch())};
    }
  }

  // Forward in evaluation mode for any number of host samples (processed in chunks of max_batch), into a new host
  // tensor.
  Tensor<T> predict(tensor_view<const T> x) { return predict_chunks(x, false); }
  // The same for samples already in the policy's memory; the result is still a host tensor.
  Tensor<T> predict(resident_t, tensor_view<const T> x) { return predict_chunks(x, true); }

  // One training step: forward, loss and its gradient, backward, optimizer update. Returns the loss.
  // target holds values of the output's shape for the regression losses, and integer labels for cross-entropy and
  // nll: one per sample ([N]: the output's values are the classes), or, for an output of rank 2 or more, one per
  // position ([N, L] for an output [L, C]: the classes are the last axis, as Keras' sparse cross-entropy and a
  // language model's next-token loss take them; the loss is the mean over every position). x and target are host
  // data; the optimizer must use the model's policy.
  template <class Loss, class Optimizer>
  T train_step(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss, Optimizer& optimizer) {
    T value = forward_backward(x, target, loss);
    update(optimizer);
    return value;
  }
  // The same on a batch already in the policy's memory.
  template <class Loss, class Optimizer>
  T train_step(resident_t, tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss, Optimizer& optimizer) {
    T value = forward_backward(resident, x, target, loss);
    update(optimizer);
    return value;
  }
  // The same step, with the time of each of its parts added to `profile` (see step_profile.hpp): an empty profile
  // is sized for this model, one from another model is an error.
  template <class Loss, class Optimizer>
  T train_step(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss, Optimizer& optimizer, step_profile& profile) {
    return profiled_step(x, target, loss, optimizer, profile, false);
  }
  template <class Loss, class Optimizer>
  T train_step(resident_t, tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss, Optimizer& optimizer, step_profile& profile) {
    return profiled_step(x, target, loss, optimizer, profile, true);
  }
  // A training step on a resident batch that never waits for the device: the loss is written to *loss_out in the
  // policy's memory instead of being returned. On a GPU policy nothing in it synchronises, so the whole step can be
  // captured into a CUDA graph (with an optimizer that keeps its step count on the device, such as Adam with
  // .capturable = true). No input checks beyond shapes: a bad label is not reported (see the *_on_device losses).
  template <class Loss, class Optimizer>
  void enqueue_train_step(resident_t, tensor_view<const T> x,
                          tensor_view<const typename Loss::template target_type<T>> target, const Loss& loss,
                          Optimizer& optimizer, T* loss_out) {
    index_t batch = check_input(x, "Sequential::enqueue_train_step");
    const loss_rows rows = check_target<Loss>(target, batch);
    layer_context ctx{batch, true};
    run_forward(x.data(), ctx);
    loss.template forward_backward_into<Policy>(output_pointer(), target.data(), executor_.output_gradient(),
                                                rows.count, rows.size, loss_out);
    run_backward(ctx);
    update(optimizer);
  }

  // Forward, loss and backward without an update: the gradients are left in gradient_values().
  template <class Loss>
  T forward_backward(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
                     const Loss& loss) {
    index_t batch = check_input(x, "Sequential::train_step");
    const loss_rows rows = check_target<Loss>(target, batch);
    return forward_backward_batch(stage_input(x, batch), stage_target(target), batch, rows, loss);
  }
  // The same, calling ready(first, count) as soon as a layer's backward has finished its gradients: values [first,
  // first + count) of gradient_values() are then final (the last layer's first; count > 0). Data-parallel training
  // starts reducing them there while the layers below are still in their backward.
  template <class Loss, class Ready>
    requires std::invocable<Ready&, index_t, index_t>
  T forward_backward(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
                     const Loss& loss, Ready&& ready) {
    index_t batch = check_input(x, "Sequential::train_step");
    const loss_rows rows = check_target<Loss>(target, batch);
    return forward_backward_batch(stage_input(x, batch), stage_target(target), batch, rows, loss, ready);
  }
  template <class Loss>
  T forward_backward(resident_t, tensor_view<const T> x,
                     tensor_view<const typename Loss::template target_type<T>> target, const Loss& loss) {
    index_t batch = check_input(x, "Sequential::train_step");
    const loss_rows rows = check_target<Loss>(target, batch);
    return forward_backward_batch(x.data(), target.data(), batch, rows, loss);
  }

  // The loss on a batch in evaluation mode, without gradients.
  template <class Loss>
  T loss_value(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss) {
    index_t batch = check_input(x, "Sequential::loss_value");
    const loss_rows rows = check_target<Loss>(target, batch);
    return loss_value_batch(stage_input(x, batch), stage_target(target), batch, rows, loss);
  }
  template <class Loss>
  T loss_value(resident_t, tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss) {
    index_t batch = check_input(x, "Sequential::loss_value");
    const loss_rows rows = check_target<Loss>(target, batch);
    return loss_value_batch(x.data(), target.data(), batch, rows, loss);
  }

  // What the optimizer updates: one slot for the whole flat buffer, or one per parameter tensor when
  // options().flat_parameters is off (see static_state::parameter_slots).
  std::vector<optim::parameter_slot<T>> parameters() { return this->parameter_slots(options_.flat_parameters); }

  // The plan's tables, on the model's type.
  static std::vector<static_parameter_info> named_parameter_infos() { return plan::named_parameter_infos(); }
  static std::vector<static_parameter_info> named_buffer_infos() { return plan::named_buffer_infos(); }
  static std::span<const optim::tensor_range> tensor_ranges(std::size_t i) { return plan::tensor_ranges(i); }
  static std::size_t layer_holding(index_t offset) { return plan::layer_holding(offset); }
  static constexpr index_t parameter_count() { return plan::parameter_count(); }
  // One row per layer: the table behind Model::summary().
  static std::vector<layer_summary> summary_rows() { return plan::summary_rows(); }

  // The fusions a training step of a full batch makes with the current options, one line each ("1 Conv2D(3x3) + 2
  // ReLU: activation into the layer before it (forward)"); the rules are in static/fusion_rules.hpp.
  std::vector<std::string> fusions() const {
    typename executor::pass p;
    p.ctx = layer_context{max_batch_, true};
    p.fuse = options_.fuse_epilogues;
    return executor::fusions(p);
  }

  // Bytes of activations, gradients and scratch planned at construction: the workspace, where tensors whose lives in
  // a step are apart share memory (static/workspace_plan.hpp).
  index_t workspace_bytes() const { return executor_.workspace_bytes(); }
  // What the same tensors would take each in memory of its own.
  index_t unshared_workspace_bytes() const { return executor_.unshared_workspace_bytes(); }
  // Bytes of the input and target staging buffers (device policies only; zero on the CPU).
  index_t staging_bytes() const {
    return static_cast<index_t>(input_stage_.size() * sizeof(T) + target_stage_.size() * sizeof(T) +
                                label_stage_.size() * sizeof(std::int64_t));
  }

 private:
  static index_t checked_max_batch(index_t max_batch) {
    if (max_batch <= 0) fail("Sequential: expected a positive maximum batch, found ", max_batch);
    // The workspace holds each layer's output and gradient and its scratch for max_batch samples: a product that
    // overflowed planned a tiny workspace, and the first forward wrote past it.
    constexpr index_t per_sample = executor::unshared_per_sample;
    constexpr index_t largest_batch = (index_t{1} << 46) / (per_sample + input_shape::size + output_shape::size + 1);
    if (max_batch > largest_batch)
      fail("Sequential: a maximum batch of ", max_batch, " needs ", per_sample, " workspace values per sample, more ",
           "than memory can hold; expected at most ", largest_batch);
    return max_batch;
  }
  static executor planned(index_t max_batch) {
    try {
      return executor(max_batch);
    } catch (const std::bad_alloc&) {
      fail("Sequential: cannot allocate the workspace for a maximum batch of ", max_batch, " (",
           executor::unshared_per_sample, " values per sample before sharing)");
    }
  }

  // The rows a loss sees: `count` rows of `size` values (the classes, for labels).
  struct loss_rows {
    index_t count, size;
  };
  // Labels per sample when there is one per position of an output of rank 2 or more (its last axis the classes).
  static constexpr index_t positions =
      output_shape::rank >= 2 ? output_shape::size / output_shape::extents[output_shape::rank - 1] : 1;
  // Device policies read host batches from staging buffers of max_batch samples: inputs, real-valued targets and
  // integer labels (which one a loss needs is known only at train_step, and each is small), plus a host copy of the
  // output for metrics. CPU policies read host data in place and plan none of them.
  void plan_staging() {
    if constexpr (!host_accessible) {
      input_stage_ = policy_buffer<T>(max_batch_ * input_shape::size);
      target_stage_ = policy_buffer<T>(max_batch_ * output_shape::size);
      label_stage_ = policy_buffer<std::int64_t>(max_batch_ * positions);
      output_host_ = aligned_buffer<T>(max_batch_ * output_shape::size);
    }
  }
  // Where the layers read a host batch from: in place on the CPU, its staged copy on a device.
  const T* stage_input(const tensor_view<const T>& x, index_t batch) {
    if constexpr (host_accessible) {
      return x.data();
    } else {
      this->upload(x.data(), input_stage_.data(), batch * input_shape::size);
      return input_stage_.data();
    }
  }
  template <class Target>
  const Target* stage_target(const tensor_view<const Target>& target) {
    if constexpr (host_accessible) {
      return target.data();
    } else if constexpr (std::is_integral_v<Target>) {
      static_assert(std::is_same_v<Target, std::int64_t>, "kiln::Sequential: integer targets are int64 labels");
      this->upload(target.data(), label_stage_.data(), target.numel());
      return label_stage_.data();
    } else {
      this->upload(target.data(), target_stage_.data(), target.numel());
      return target_stage_.data();
    }
  }

  tensor_view<const T> forward_batch(const T* x, index_t batch) {
    layer_context ctx{batch, training_};
    run_forward(x, ctx);
    return {output_pointer(), output_shape::batch_shape(batch)};
  }
  // No gradient is awaited: the pass's hook does nothing.
  struct no_gradient_hook {
    void operator()(index_t, index_t) const {}
  };
  template <class Loss, class Target, class Ready = no_gradient_hook>
  T forward_backward_batch(const T* x, const Target* target, index_t batch, loss_rows rows, const Loss& loss,
                           Ready&& ready = {}) {
    layer_context ctx{batch, true};
    run_forward(x, ctx);
    T value = loss.template forward_backward<Policy>(output_pointer(), target, executor_.output_gradient(),
                                                     rows.count, rows.size);
    if (profile_) profile_lap(profile_->loss_seconds);
    run_backward(ctx, ready);
    return value;
  }
  template <class Loss, class Target>
  T loss_value_batch(const T* x, const Target* target, index_t batch, loss_rows rows, const Loss& loss) {
    layer_context ctx{batch, false};
    run_forward(x, ctx);
    return loss.template forward_backward<Policy>(output_pointer(), target, static_cast<T*>(nullptr), rows.count,
                                                  rows.size);
  }
  template <class Optimizer>
  void update(Optimizer& optimizer) {
    static_assert(detail::optimizer_for_policy<Optimizer, Policy>,
                  "kiln::Sequential: the optimizer must use the model's policy (e.g. optim::basic_adam<float, "
                  "policy::cuda> for a Sequential<policy::cuda, ...>)");
    if (!optimizer.has_parameters()) optimizer.add_parameters(parameters());
    else this->check_optimizer_slots(optimizer);
    optimizer.step();
    if (profile_) profile_lap(profile_->update_seconds);
  }

  // Evaluation-mode forward over any number of samples; resident: x is in the policy's memory.
  Tensor<T> predict_chunks(const tensor_view<const T>& x, bool resident_input) {
    if (x.rank() == 0 || x.shape().row_size() != input_shape::size)
      fail("Sequential::predict: expected input of shape [*, ", input_shape::str(), " = ", input_shape::size,
           " values per sample], found ", x.shape());
    index_t samples = x.extent(0);
    Tensor<T> out(output_shape::batch_shape(samples));
    bool was_training = training_;
    training_ = false;
    for (index_t first = 0; first < samples; first += max_batch_) {
      index_t count = std::min(max_batch_, samples - first);
      layer_context ctx{count, false};
      const T* chunk = x.data() + first * input_shape::size;
      if (!resident_input) chunk = stage_input(tensor_view<const T>(chunk, input_shape::batch_shape(count)), count);
      run_forward(chunk, ctx);
      T* dst = out.data() + first * output_shape::size;
      if constexpr (host_accessible) Policy::copy(output_pointer(), dst, count * output_shape::size);
      else this->download(output_pointer(), dst, count * output_shape::size);
    }
    training_ = was_training;
    return out;
  }

  // One pass's view of the state for the executor.
  typename executor::pass make_pass(layer_context ctx) {
    ctx.replicas = replicas_.lent;
    return {this->params_.data(), this->buffers_.data(), this->grads_.data(), this->generators_.data(), ctx,
            options_.fuse_epilogues};
  }
  void run_forward(const T* x, const layer_context& ctx) {
    executor_.forward(make_pass(ctx), x, [&](bool, std::size_t layer) {
      if (profile_) profile_lap(profile_->forward_seconds[layer]);
    });
  }
  // Runs right after run_forward, within one call: each layer's input is as the forward saw it.
  template <class Ready = no_gradient_hook>
  void run_backward(const layer_context& forward_ctx, Ready&& ready = {}) {
    executor_.backward(make_pass(forward_ctx), [&](bool, std::size_t layer) {
      if (profile_) profile_lap(profile_->backward_seconds[layer]);
      const index_t first = plan::param_offsets[layer], count = plan::param_offsets[layer + 1] - first;
      if (count > 0) ready(first, count);
    });
  }
  const T* output_pointer() const { return executor_.output(); }

  template <class Loss, class Optimizer>
  T profiled_step(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
                  const Loss& loss, Optimizer& optimizer, step_profile& profile, bool resident_batch) {
    index_t batch = check_input(x, "Sequential::train_step");
    const loss_rows rows = check_target<Loss>(target, batch);
    detail::prepare_profile(profile, plan::layer_names(), "Sequential::train_step");
    struct detach {  // the model stops timing when the step ends, also by an exception
      step_profile*& slot;
      ~detach() { slot = nullptr; }
    } stop{profile_};
    Policy::synchronize();
    profile_clock_.start();
    profile_ = &profile;
    const T* staged_x = resident_batch ? x.data() : stage_input(x, batch);
    const auto* staged_target = resident_batch ? target.data() : stage_target(target);
    profile_lap(profile.staging_seconds);
    T value = forward_backward_batch(staged_x, staged_target, batch, rows, loss);
    update(optimizer);
    ++profile.steps;
    return value;
  }
  // Adds the time since the previous lap of a profiled step to `slot`, once the policy's work so far has finished.
  void profile_lap(double& slot) {
    Policy::synchronize();
    profile_clock_.lap(slot);
  }

  index_t check_input(const tensor_view<const T>& x, const char* where) const {
    if (x.rank() == 0 || x.shape().row_size() != input_shape::size)
      fail(where, ": expected input of shape [batch, ", input_shape::str(), "] (", input_shape::size,
           " values per sample), found ", x.shape());
    // Channels-last images ([N, 32, 32, 3] for Input<3, 32, 32>) hold as many values per sample, in another order;
    // a flat [N, 3072], or [N, 28, 28] for Input<784>, is a reshape.
    if (input_shape::is_other_layout(x.shape(), 1))
      fail(where, ": expected input of shape [batch, ", input_shape::str(), "], found ", x.shape(),
           " (the same number of values per sample, in another layout: channels last? reshape it if the "
           "values are already in the input's order)");
    index_t batch = x.extent(0);
    if (batch < 1 || batch > max_batch_)
      fail(where, ": expected a batch of 1 to ", max_batch_, " samples (the maximum this model was planned for), found ",
           batch);
    return batch;
  }
  template <class Loss, class Target>
  loss_rows check_target(const tensor_view<const Target>& target, index_t batch) const {
    if constexpr (std::is_integral_v<Target>) {
      if (target.numel() == batch) return {batch, output_shape::size};
      if (positions > 1 && target.numel() == batch * positions)
        return {batch * positions, output_shape::extents[output_shape::rank - 1]};
      if (positions > 1)
        fail(Loss::name, ": expected ", batch, " labels (one per sample) or ", batch * positions,
             " (one per position, the classes on the last axis) for a batch of ", batch, " with output ",
             output_shape::str(), ", found labels of shape ", target.shape());
      fail(Loss::name, ": expected ", batch, " labels for a batch of ", batch, " with output ", output_shape::str(),
           ", found labels of shape ", target.shape());
    } else {
      if (target.numel() != batch * output_shape::size)
        fail(Loss::name, ": expected ", batch * output_shape::size, " target values for a batch of ", batch,
             " with output ", output_shape::str(), ", found target of shape ", target.shape());
      return {batch, output_shape::size};
    }
  }

  index_t max_batch_;
  static_options options_;
  bool training_ = true;
  executor executor_;
  // Staging for host batches on device policies (empty on the CPU): see plan_staging.
  policy_buffer<T> input_stage_, target_stage_;
  policy_buffer<std::int64_t> label_stage_;
  aligned_buffer<T> output_host_;
  lent_replicas replicas_;  // see set_replicas
  step_profile* profile_ = nullptr;  // set during a profiled train_step
  detail::profile_clock profile_clock_;
};

}  // namespace kiln
