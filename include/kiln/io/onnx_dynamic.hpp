// ONNX export of dynamic-mode models: an nn::Sequential, nn::Residual, nn::Add or nn::Concat (nested in each other as
// deep as they go) of Linear, the activations, Softmax, LogSoftmax, Flatten, Identity, Conv2d, MaxPool2d, AvgPool2d,
// AdaptiveAvgPool2d(1), GlobalAvgPool2d, BatchNorm1d, BatchNorm2d, LayerNorm, Dropout, and LSTM and GRU (plain,
// handing on every step, or as nn::AllSteps, nn::LastStep, nn::FinalState). The weights are named as in the model's
// state_dict. The input's per-sample shape must be given (options.input_shape), since a module does not know it;
// a time-major model (a recurrent module without batch_first reading the input) puts -1 second, for the batch. The
// graph is the model's evaluation-mode computation (running statistics, no dropout) whether or not the model is in
// training mode. See kiln/io/onnx.hpp for the operators written.
//
//   kiln::io::export_onnx(model, "mlp.onnx", {.input_shape = {28, 28}});
//   kiln::io::export_onnx(lstm_model, "lstm.onnx", {.input_shape = {12, -1, 1}});  // (seq, batch, features) input
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/io/onnx.hpp"

namespace kiln::io {

namespace detail {
// A parameter or buffer as host values (a copy where the policy keeps them in device memory), or null when undefined
// (a layer without bias or affine parameters).
class host_copy {
 public:
  explicit host_copy(const nn::Variable& v) : defined_(v.defined()) {
    if (defined_) values_ = v.tensor();
  }
  const float* data() const { return defined_ ? values_.data() : nullptr; }

 private:
  bool defined_;
  Tensor<float> values_;
};

// A float LSTM or GRU module with the view of its results that its forward hands on: an adaptor's (nn::LastStep,
// nn::FinalState, nn::AllSteps), or every step for a plain nn::LSTM / nn::GRU.
template <class Cell, class Module>
void onnx_recurrent_module(onnx_builder& b, const nn::basic_recurrent<Cell, float>& r) {
  rnn_output output = rnn_output::sequence;
  if (dynamic_cast<const nn::basic_rnn_adaptor<Module, nn::rnn_part::last_step>*>(&r)) output = rnn_output::last_step;
  else if (dynamic_cast<const nn::basic_rnn_adaptor<Module, nn::rnn_part::final_state>*>(&r))
    output = rnn_output::final_state;
  host_copy params(r.flat_parameters());
  onnx_recurrent<Cell>(b, r.dims(), params.data(), output);
}

// Writes one module that is not a Sequential; false when the exporter does not know it.
inline bool onnx_emit_leaf(onnx_builder& b, const nn::Module& m) {
  if (auto* lin = dynamic_cast<const nn::Linear*>(&m)) {
    host_copy w(lin->weight), bias(lin->bias);
    b.linear(w.data(), bias.data(), lin->in_features(), lin->out_features());
  } else if (dynamic_cast<const nn::ReLU*>(&m)) {
    b.activation_node(activation::relu, 0);
  } else if (auto* leaky = dynamic_cast<const nn::LeakyReLU*>(&m)) {
    b.activation_node(activation::leaky_relu, leaky->negative_slope());
  } else if (dynamic_cast<const nn::GELU*>(&m)) {
    b.activation_node(activation::gelu, 0);
  } else if (dynamic_cast<const nn::Sigmoid*>(&m)) {
    b.activation_node(activation::sigmoid, 0);
  } else if (dynamic_cast<const nn::Tanh*>(&m)) {
    b.activation_node(activation::tanh, 0);
  } else if (dynamic_cast<const nn::Identity*>(&m) || dynamic_cast<const nn::Dropout*>(&m)) {
  } else if (auto* sm = dynamic_cast<const nn::Softmax*>(&m)) {
    b.softmax(sm->dim(), false);
  } else if (auto* lsm = dynamic_cast<const nn::LogSoftmax*>(&m)) {
    b.softmax(lsm->dim(), true);
  } else if (auto* flat = dynamic_cast<const nn::Flatten*>(&m)) {
    b.flatten(flat->start_dim(), flat->end_dim());
  } else if (auto* conv = dynamic_cast<const nn::Conv2d*>(&m)) {
    host_copy w(conv->weight), bias(conv->bias);
    onnx_conv2d(b, w.data(), bias.data(), conv->in_channels(), conv->out_channels(), conv->kernel_size(),
                conv->stride(), conv->padding().value, conv->padding().same, conv->dilation(), conv->groups());
  } else if (auto* max = dynamic_cast<const nn::MaxPool2d*>(&m)) {
    onnx_pool2d(b, true, max->kernel_size(), max->stride(), max->padding(), max->ceil_mode(), false);
  } else if (auto* avg = dynamic_cast<const nn::AvgPool2d*>(&m)) {
    onnx_pool2d(b, false, avg->kernel_size(), avg->stride(), avg->padding(), avg->ceil_mode(),
                avg->count_include_pad());
  } else if (dynamic_cast<const nn::AdaptiveAvgPool2d*>(&m)) {  // output size 1, the only one it takes
    onnx_global_avg_pool2d(b, true);
  } else if (dynamic_cast<const nn::GlobalAvgPool2d*>(&m)) {
    onnx_global_avg_pool2d(b, false);
  } else if (auto* bn = dynamic_cast<const nn::basic_batch_norm<float>*>(&m)) {
    host_copy w(bn->weight), bias(bn->bias), mean(bn->running_mean), var(bn->running_var);
    onnx_batch_norm(b, bn->is_2d(), bn->num_features(), w.data(), bias.data(), mean.data(), var.data(), bn->eps());
  } else if (auto* ln = dynamic_cast<const nn::LayerNorm*>(&m)) {
    host_copy w(ln->weight), bias(ln->bias);
    onnx_layer_norm(b, ln->normalized_shape(), w.data(), bias.data(), ln->eps());
  } else if (auto* lstm = dynamic_cast<const nn::basic_recurrent<lstm_cell, float>*>(&m)) {
    onnx_recurrent_module<lstm_cell, nn::LSTM>(b, *lstm);
  } else if (auto* gru = dynamic_cast<const nn::basic_recurrent<gru_cell, float>*>(&m)) {
    onnx_recurrent_module<gru_cell, nn::GRU>(b, *gru);
  } else {
    return false;
  }
  return true;
}

// Runs join, a block's Add or Concat, naming the block's place in a refusal, as a layer's refusal names it.
template <class Join>
void onnx_join(const nn::Module& block, const std::string& where, Join&& join) {
  try {
    join();
  } catch (const error& e) {
    fail(e.what(), " (at ", where, " ", block.describe(), ")");
  }
}

// Writes module m, found at where (for messages: "Sequential[1].body[0]"), whose state_dict names begin with prefix
// ("1.body.0."). A container or block writes its children under their names; a leaf through onnx_emit_leaf.
inline void onnx_emit_module(onnx_builder& b, const nn::Module& m, const std::string& where,
                             const std::string& prefix) {
  const auto& children = m.named_children();
  if (dynamic_cast<const nn::Sequential*>(&m)) {
    for (std::size_t i = 0; i < children.size(); ++i)
      onnx_emit_module(b, *children[i].second, where + "[" + std::to_string(i) + "]",
                       prefix + children[i].first + ".");
    return;
  }
  if (auto* residual = dynamic_cast<const nn::Residual*>(&m)) {
    const onnx_value x = b.value();
    onnx_emit_module(b, residual->body(), where + ".body", prefix + "body.");
    const onnx_value f = b.value();
    onnx_value s = x;
    if (residual->has_shortcut()) {
      b.set_current(x);
      onnx_emit_module(b, residual->shortcut(), where + ".shortcut", prefix + "shortcut.");
      s = b.value();
    }
    onnx_join(m, where, [&] {
      onnx_add(b, {s, f}, {residual->has_shortcut() ? "the shortcut" : "the input", "the body"}, "Residual", false);
    });
    return;
  }
  const bool add = dynamic_cast<const nn::Add*>(&m) != nullptr;
  const auto* concat = dynamic_cast<const nn::Concat*>(&m);
  if (add || concat) {
    // Every branch from the block's input, in the order the block runs (and sums) them.
    const onnx_value x = b.value();
    std::vector<onnx_value> values;
    std::vector<std::string> labels;
    for (const auto& [name, branch] : children) {
      b.set_current(x);
      onnx_emit_module(b, *branch, where + "[" + name + "]", prefix + name + ".");
      values.push_back(b.value());
      labels.push_back("branch " + name);
    }
    onnx_join(m, where, [&] {
      if (concat) onnx_concat(b, values, labels, "Concat", concat->dim());
      else onnx_add(b, values, labels, "Add", true);
    });
    return;
  }
  bool known = false;
  try {
    b.set_parameter_prefix(prefix);
    known = onnx_emit_leaf(b, m);
  } catch (const error& e) {
    // The layer's check names what it expected and found; where is added here, as nn::Sequential's forward does.
    fail(e.what(), " (at ", where, " ", m.describe(), ")");
  }
  if (!known)
    fail("export_onnx: ", where, " ", m.describe(), " has no ONNX export (exported: Sequential, Linear, ReLU, "
         "LeakyReLU, GELU, Sigmoid, Tanh, Identity, Softmax, LogSoftmax, Flatten, Conv2d, MaxPool2d, AvgPool2d, "
         "AdaptiveAvgPool2d(1), GlobalAvgPool2d, BatchNorm1d, BatchNorm2d, LayerNorm, Dropout, LSTM, GRU, AllSteps, "
         "LastStep, FinalState, and the blocks Residual, Add, Concat)");
}
}  // namespace detail

// The ONNX bytes of a dynamic float model; options.input_shape is the per-sample input shape.
inline std::string onnx_model_bytes(const nn::Module& model, onnx_options options) {
  if (options.input_shape.empty())
    fail("export_onnx: a dynamic model needs options.input_shape, the per-sample input shape (e.g. {28, 28})");
  // The batch, as onnx_options says: a leading -1, or a -1 second for a time-major input.
  std::vector<index_t> sample = options.input_shape;
  int batch_axis = 0;
  if (sample.size() > 1 && sample.front() == -1) {
    sample.erase(sample.begin());
  } else if (sample.size() > 1 && sample[1] == -1) {
    if (sample.size() < 3)
      fail("export_onnx: a -1 second in options.input_shape puts the batch second in a (seq, batch, features...) "
           "input, which needs at least three entries, found {", sample[0], ", -1}");
    sample.erase(sample.begin() + 1);
    batch_axis = 1;
  }
  onnx_builder b(std::move(options), sample, batch_axis);
  try {
    detail::onnx_emit_module(b, model, model.name(), "");
  } catch (const error& e) {
    fail(e.what());
  }
  return b.finish();
}

inline void export_onnx(const nn::Module& model, const std::filesystem::path& path, onnx_options options) {
  write_file_atomically(path, onnx_model_bytes(model, std::move(options)));
}

}  // namespace kiln::io
