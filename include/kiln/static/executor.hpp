// The executor of a static model: it owns the workspace (each layer's output, the gradient of that output, the layer's
// scratch) planned by liveness (static/workspace_plan.hpp), and runs the layers of a plan (static/plan.hpp) forward and
// backward over the values of a state (static/state.hpp).
//
// How each position runs is decided once at the start of each pass by the fusion rules (static/fusion_rules.hpp,
// applied as static/fusion_schedule.hpp says); where no rule takes a position, the layer's own forward or backward
// runs.
#pragma once

#include <array>
#include <cstddef>
#include <new>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/random.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/static/fusion_rules.hpp"
#include "kiln/static/fusion_schedule.hpp"
#include "kiln/static/plan.hpp"
#include "kiln/static/workspace_plan.hpp"

namespace kiln {

template <class Plan>
class static_executor {
  using T = typename Plan::T;
  using Policy = typename Plan::policy;
  template <class U>
  using policy_buffer = typename Policy::template buffer<U>;
  static constexpr std::size_t layer_count = Plan::layer_count;
  template <std::size_t I>
  using bound = typename Plan::template bound<I>;

 public:
  // One pass over the layers: where the state's values are, the pass's context and whether fusion is on.
  struct pass {
    const T* params = nullptr;
    T* buffers = nullptr;
    T* grads = nullptr;
    random_generator* generators = nullptr;
    layer_context ctx{};
    bool fuse = true;
  };
  // Everything one layer's forward or backward reads and writes in a pass.
  struct layer_memory {
    const T* params;
    T* buffers;
    T* dparams;
    const T* x;   // the layer's input
    T* y;         // its output
    T* dy;        // the gradient of its output
    T* dx;        // the gradient of its input, or null where no layer before it computes
    T* scratch;
    layer_context ctx;  // the pass's, with the layer's own generators where it draws
  };

  // Plans the workspace for batches of up to max_batch samples and allocates it.
  explicit static_executor(index_t max_batch) {
    std::vector<live_range> ranges;
    for (std::size_t i = 0; i < layer_count; ++i) {
      ranges.push_back({activation_size[i] * max_batch, 0, 0});
      ranges.push_back({activation_size[i] * max_batch, 0, 0});
      ranges.push_back({scratch_size[i] * max_batch, 0, 0});
    }
    set_moments(ranges);
    layout_ = plan_by_liveness(ranges);
    workspace_ = policy_buffer<T>(layout_.peak);
    T* base = workspace_.data();
    for (std::size_t i = 0; i < layer_count; ++i) {
      activations_[i] = ranges[3 * i].size ? base + layout_.offsets[3 * i] : nullptr;
      gradients_[i] = ranges[3 * i + 1].size ? base + layout_.offsets[3 * i + 1] : nullptr;
      scratch_[i] = ranges[3 * i + 2].size ? base + layout_.offsets[3 * i + 2] : nullptr;
    }
    // The gradient each layer writes for its input: that of the nearest computing layer before it, or none.
    T* current = nullptr;
    for (std::size_t i = 0; i < layer_count; ++i) {
      input_gradients_[i] = current;
      if (Plan::computes[i]) current = gradients_[i];
    }
    output_grad_ = current;
  }

  // Values per sample of a layer's output (and of its gradient; 0 for a layer that aliases its input) and scratch.
  static constexpr auto activation_size = [] {
    std::array<index_t, layer_count> sizes{};
    Plan::for_each_layer([&]<std::size_t I>() { sizes[I] = bound<I>::aliases_input ? 0 : bound<I>::output::size; });
    return sizes;
  }();
  static constexpr auto scratch_size = [] {
    std::array<index_t, layer_count> sizes{};
    Plan::for_each_layer([&]<std::size_t I>() { sizes[I] = bound<I>::scratch_per_sample; });
    return sizes;
  }();
  // Values per sample over every layer's output, gradient and scratch: what a workspace without reuse holds.
  static constexpr index_t unshared_per_sample = [] {
    index_t n = 0;
    for (std::size_t i = 0; i < layer_count; ++i) n += 2 * activation_size[i] + scratch_size[i];
    return n;
  }();

  // Runs every layer forward from x (n samples in the policy's memory); lap(forward, I) after each layer.
  template <class Lap>
  void forward(const pass& p, const T* x, Lap&& lap) {
    last_batch_ = p.ctx.batch;
    const auto choices = fusion::choose<Plan, fusion::forward_rules, +1>(p);
    const T* in = x;
    Plan::for_each_layer([&]<std::size_t I>() {
      inputs_[I] = in;
      outputs_[I] = bound<I>::aliases_input ? const_cast<T*>(in) : activations_[I];
      if (!fusion::run<Plan, fusion::forward_rules, I>(choices[I], *this, p)) {
        const layer_memory m = at<I>(p);
        bound<I>::template forward<Policy>(m.params, m.buffers, m.x, m.y, m.scratch, m.ctx, p.fuse);
      }
      in = outputs_[I];
      lap(true, I);
    });
    output_ = in;
  }

  // Runs every layer backward, right after forward within one call: each layer's input is as the forward saw it, and
  // the loss has written the gradient of the model's output into output_gradient(). lap(forward, I) after each layer.
  template <class Lap>
  void backward(const pass& forward_pass, Lap&& lap) {
    pass p = forward_pass;
    p.ctx.input_as_in_forward = true;
    const auto choices = fusion::choose<Plan, fusion::backward_rules, -1>(p);
    [&]<std::size_t... R>(std::index_sequence<R...>) {
      ((backward_layer<layer_count - 1 - R>(choices[layer_count - 1 - R], p), lap(false, layer_count - 1 - R)),
       ...);
    }(std::make_index_sequence<layer_count>{});
  }

  // The fusions a pass with these options and this batch makes, one line each, those inside blocks included
  // (Model::summary prints them).
  static std::vector<std::string> fusions(const pass& p) {
    std::vector<std::string> labels, out;
    Plan::for_each_layer([&]<std::size_t I>() {
      labels.push_back(std::to_string(Plan::module_index[I]) + " " + Plan::layer_names()[I]);
    });
    fusion::describe<fusion::forward_rules>(fusion::choose<Plan, fusion::forward_rules, +1>(p), labels, out);
    pass b = p;
    b.ctx.input_as_in_forward = true;
    fusion::describe<fusion::backward_rules>(fusion::choose<Plan, fusion::backward_rules, -1>(b), labels, out);
    Plan::for_each_layer([&]<std::size_t I>() {
      if constexpr (requires { &bound<I>::template fusions<Policy, T>; })
        bound<I>::template fusions<Policy, T>(p.ctx, p.fuse, std::to_string(Plan::module_index[I]) + ".", out);
    });
    return out;
  }

  // The model's output after the last forward, and where the loss writes its gradient (both in the workspace).
  const T* output() const { return output_; }
  T* output_gradient() const { return output_grad_; }
  index_t last_batch() const { return last_batch_; }
  // Bytes of the workspace, and what it would take without sharing memory between tensors whose lives are apart.
  index_t workspace_bytes() const { return static_cast<index_t>(workspace_.size() * sizeof(T)); }
  index_t unshared_workspace_bytes() const { return layout_.unshared * static_cast<index_t>(sizeof(T)); }

  // For the fusion rules: layer I's memory in pass p.
  template <std::size_t I>
  layer_memory at(const pass& p) const {
    layer_context ctx = p.ctx;
    ctx.fuse_epilogues = p.fuse;
    if constexpr (detail::runtime_generators_of<bound<I>>() > 0) ctx.rng = p.generators + Plan::runtime_index[I];
    return {p.params + Plan::param_offsets[I], p.buffers + Plan::buffer_offsets[I], p.grads + Plan::param_offsets[I],
            inputs_[I], outputs_[I], gradients_[I], input_gradients_[I], scratch_[I], ctx};
  }
  // For the fusion rules: layer I's forward is done by the layer before it; its output is its input.
  template <std::size_t I>
  void pass_through() {
    outputs_[I] = const_cast<T*>(inputs_[I]);
  }

 private:
  template <std::size_t I>
  void backward_layer(int choice, const pass& p) {
    if constexpr (!bound<I>::aliases_input) {
      if (!fusion::run<Plan, fusion::backward_rules, I>(choice, *this, p)) {
        const layer_memory m = at<I>(p);
        bound<I>::template backward<Policy>(m.params, m.x, m.y, m.dy, m.dx, m.dparams, m.scratch, m.ctx);
      }
    }
  }

  // The moments each layer's output, gradient and scratch are live (workspace_plan.hpp numbers them): an output from
  // its layer's forward to its layer's backward, which reads it last (the layer after it reads it as input earlier);
  // a gradient from the earliest backward that may write it (the computing layer after the next, which a fusion
  // rule may let write it, else the next, else the loss) to its layer's backward; scratch from forward to backward.
  // The model's output, and the output of the computing layer before it (a forward rule may pass that through as the
  // model's), stay live to the end of the step: last_output reads them after it.
  static void set_moments(std::vector<live_range>& ranges) {
    constexpr int L = int(layer_count);
    std::vector<int> computing;
    for (int i = 0; i < L; ++i)
      if (Plan::computes[std::size_t(i)]) computing.push_back(i);
    for (std::size_t c = 0; c < computing.size(); ++c) {
      const int i = computing[c];
      live_range& y = ranges[3 * std::size_t(i)];
      live_range& dy = ranges[3 * std::size_t(i) + 1];
      live_range& scratch = ranges[3 * std::size_t(i) + 2];
      y.first = scratch.first = i;
      y.last = scratch.last = dy.last = 2 * L - i;
      if (c + 2 >= computing.size()) y.last = 2 * L + 1;
      if (c + 1 == computing.size()) dy.first = L;
      else if (c + 2 == computing.size()) dy.first = 2 * L - computing[c + 1];
      else dy.first = 2 * L - computing[c + 2];
    }
  }

  workspace_layout layout_;
  policy_buffer<T> workspace_;
  std::array<T*, layer_count> activations_{}, gradients_{}, scratch_{}, input_gradients_{};
  std::array<const T*, layer_count> inputs_{};
  std::array<T*, layer_count> outputs_{};
  T* output_grad_ = nullptr;
  const T* output_ = nullptr;
  index_t last_batch_ = 0;
};

}  // namespace kiln
