// model_access<Net>: what kiln::Model needs from a model, for each mode. The static specialisation lives here; the
// dynamic one in train/dynamic_access.hpp. A new kind of model joins Model by specialising this template.
#pragma once

#include <string>
#include <vector>

#include "kiln/static/sequential.hpp"
#include "kiln/train/callbacks.hpp"

namespace kiln::train {

template <class Net>
struct model_access;

template <class Policy, class InputSpec, class... Layers>
struct model_access<Sequential<Policy, InputSpec, Layers...>> {
  using net_type = Sequential<Policy, InputSpec, Layers...>;
  static_assert(std::is_same_v<typename net_type::value_type, float>, "kiln::Model trains float models");
  static constexpr const char* mode = "static";

  static index_t input_size(const net_type&) { return net_type::input_shape::size; }
  static index_t output_size(const net_type&) { return net_type::output_shape::size; }
  static shape input_shape(const net_type&) { return net_type::input_shape::batch_shape(1); }
  // Whether the extents of s from `first` on are the input's in another layout (dims::is_other_layout).
  static bool is_other_layout(const shape& s, int first) { return net_type::input_shape::is_other_layout(s, first); }
  static index_t max_batch(const net_type& net) { return net.max_batch(); }

  template <class Loss, class Optimizer, class Target>
  static float train_batch(net_type& net, tensor_view<const float> x, tensor_view<const Target> y, const Loss& loss,
                           Optimizer& opt, step_profile* profile = nullptr) {
    return profile ? net.train_step(x, y, loss, opt, *profile) : net.train_step(x, y, loss, opt);
  }
  template <class Loss, class Target>
  static float eval_batch(net_type& net, tensor_view<const float> x, tensor_view<const Target> y, const Loss& loss) {
    // Keeps the mode the user left the model in (as dynamic mode and predict do): after net.eval(), a fit's
    // validation must not switch dropout and batch normalisation back to training for what follows.
    const bool was_training = net.is_training();
    net.eval();
    float value = net.loss_value(x, y, loss);
    net.train(was_training);
    return value;
  }
  // The output of the last train_batch or eval_batch, readable on the host (downloaded on a GPU policy).
  static tensor_view<const float> last_output(net_type& net) { return net.last_output_on_host(); }
  static Tensor<float> predict(net_type& net, tensor_view<const float> x) { return net.predict(x); }

  static auto parameters(net_type& net) { return net.parameters(); }
  static weight_snapshot weights(const net_type& net) { return net.state_dict(); }
  static void set_weights(net_type& net, const weight_snapshot& w) { net.load_state_dict(w); }
  static std::vector<layer_summary> summary_rows(const net_type&) { return net_type::summary_rows(); }
  // Notes under the summary's table: the planned workspace against the same tensors without sharing, and the
  // fusions a training step makes.
  static std::vector<std::string> plan_notes(const net_type& net) {
    const auto kib = [](index_t bytes) { return std::to_string((bytes + 1023) / 1024) + " KiB"; };
    std::vector<std::string> notes{"Workspace for batches of " + std::to_string(net.max_batch()) + ": " +
                                   kib(net.workspace_bytes()) + " planned by liveness (" +
                                   kib(net.unshared_workspace_bytes()) + " for every tensor apart)"};
    for (auto& line : net.fusions()) notes.push_back("Fused: " + line);
    return notes;
  }
  static index_t trainable_parameters(const net_type& net) { return net.trainable_parameter_count(); }
  static index_t non_trainable_parameters(const net_type& net) {
    return net_type::parameter_count() - net.trainable_parameter_count();
  }
};

}  // namespace kiln::train
