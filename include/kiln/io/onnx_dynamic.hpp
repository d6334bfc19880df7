// ONNX export of dynamic-mode models: an nn::Sequential, nn::Residual, nn::Add or nn::Concat (nested in each other as
// deep as they go) of Linear, the activations, Softmax, LogSoftmax, Flatten, Identity, Conv2d, MaxPool2d, AvgPool2d,
// AdaptiveAvgPool2d(1), GlobalAvgPool2d, BatchNorm1d, BatchNorm2d, LayerNorm, Dropout, and LSTM and GRU (plain,
// handing on every step, or as nn::AllSteps, nn::LastStep, nn::FinalState), MultiheadAttention (self-attention, its
// one-argument forward), TransformerEncoderLayer, CausalTransformerLayer, TransformerEncoder, Embedding,
// SinusoidalPositionalEncoding and LearnedPositionalEmbedding. The weights are named as in the model's
// state_dict. The input's per-sample shape must be given (options.input_shape), since a module does not know it;
// a time-major model (a recurrent module without batch_first reading the input) puts -1 second, for the batch. The
// graph is the model's evaluation-mode computation (running statistics, no dropout) whether or not the model is in
// training mode. See kiln/io/onnx.hpp for the operators written.
//
//   kiln::io::export_onnx(model, "mlp.onnx", {.input_shape = {28, 28}});
//   kiln::io::export_onnx(lstm_model, "lstm.onnx", {.input_shape = {12, -1, 1}});  // (seq, batch, features) input
//   kiln::io::export_onnx(gpt, "gpt.onnx", {.input_shape = {64}});  // 64 token ids per sequence, as floats
#pragma once

#include <filesystem>
#include <string>
#include <typeinfo>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/io/onnx.hpp"
#include "kiln/io/onnx_attention.hpp"
#include "kiln/io/onnx_embedding.hpp"

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

// A float MultiheadAttention's shape and parameters (host values) as onnx_self_attention takes them. Self-attention
// has one width: kdim or vdim other than embed_dim (key and value of other widths) is refused.
class attention_host_weights {
 public:
  explicit attention_host_weights(const nn::MultiheadAttention& a)
      : dims_{a.embed_dim(), a.num_heads(), a.batch_first()}, in_w_(a.in_proj_weight), in_b_(a.in_proj_bias),
        out_w_(a.out_proj->weight), out_b_(a.out_proj->bias) {
    if (a.kdim() != a.embed_dim() || a.vdim() != a.embed_dim())
      fail("export_onnx: MultiheadAttention exports as self-attention, with kdim = vdim = embed_dim (", a.embed_dim(),
           "), found kdim ", a.kdim(), " and vdim ", a.vdim());
  }
  const onnx_attention_dims& dims() const { return dims_; }
  onnx_attention_weights weights() const { return {in_w_.data(), in_b_.data(), out_w_.data(), out_b_.data()}; }

 private:
  onnx_attention_dims dims_;
  host_copy in_w_, in_b_, out_w_, out_b_;
};

// A float TransformerEncoderLayer's one-argument forward (no mask), or a CausalTransformerLayer's (the causal mask).
// Another type derived from them may have a forward of its own, which the exporter cannot see, so it is refused.
inline void onnx_transformer_layer_module(onnx_builder& b, const nn::TransformerEncoderLayer& layer) {
  const bool causal = typeid(layer) == typeid(nn::CausalTransformerLayer);
  if (!causal && typeid(layer) != typeid(nn::TransformerEncoderLayer))
    fail("export_onnx: expected a TransformerEncoderLayer or a CausalTransformerLayer, found ", layer.name(),
         ", a type derived from them whose forward the exporter does not know");
  const attention_host_weights attention(*layer.self_attn);
  const nn::transformer_encoder_layer_options& o = layer.options();
  host_copy w1(layer.linear1->weight), b1(layer.linear1->bias), w2(layer.linear2->weight), b2(layer.linear2->bias),
      n1w(layer.norm1->weight), n1b(layer.norm1->bias), n2w(layer.norm2->weight), n2b(layer.norm2->bias);
  onnx_transformer_encoder_layer(
      b,
      {.attention = attention.dims(),
       .dim_feedforward = o.dim_feedforward,
       .feed_forward_activation =
           o.activation == nn::transformer_activation::gelu ? activation::gelu : activation::relu,
       .layer_norm_eps = static_cast<double>(layer.norm1->eps()),
       .norm_first = o.norm_first,
       .causal = causal},
      {.self_attn = attention.weights(),
       .linear1_weight = w1.data(),
       .linear1_bias = b1.data(),
       .linear2_weight = w2.data(),
       .linear2_bias = b2.data(),
       .norm1_weight = n1w.data(),
       .norm1_bias = n1b.data(),
       .norm2_weight = n2w.data(),
       .norm2_bias = n2b.data()});
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
  } else if (auto* attention = dynamic_cast<const nn::MultiheadAttention*>(&m)) {
    const attention_host_weights a(*attention);  // its one-argument forward: self-attention without masks
    onnx_self_attention(b, a.dims(), a.weights(), false);
  } else if (auto* layer = dynamic_cast<const nn::TransformerEncoderLayer*>(&m)) {
    onnx_transformer_layer_module(b, *layer);
  } else if (auto* tokens = dynamic_cast<const nn::Embedding*>(&m)) {
    host_copy w(tokens->weight);
    onnx_embedding(b, w.data(), tokens->num_embeddings(), tokens->embedding_dim());
  } else if (auto* sinusoid = dynamic_cast<const nn::SinusoidalPositionalEncoding*>(&m)) {
    host_copy pe(sinusoid->pe);
    onnx_add_positions(b, "SinusoidalPositionalEncoding", "pe", pe.data(), sinusoid->pe.shape()[0],
                       sinusoid->pe.shape()[1], sinusoid->batch_first());
  } else if (auto* learned = dynamic_cast<const nn::LearnedPositionalEmbedding*>(&m)) {
    host_copy w(learned->weight);
    onnx_add_positions(b, "LearnedPositionalEmbedding", "weight", w.data(), learned->weight.shape()[0],
                       learned->weight.shape()[1], learned->batch_first());
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
// ("1.body.0."). A container or block (a TransformerEncoder among them) writes its children under their names; a
// leaf through onnx_emit_leaf.
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
  if (auto* encoder = dynamic_cast<const nn::TransformerEncoder*>(&m)) {
    // Its layers' one-argument forwards in turn, then the final norm if any, as its one-argument forward.
    for (std::size_t i = 0; i < encoder->layers.size(); ++i)
      onnx_emit_module(b, *encoder->layers[i], where + ".layers[" + std::to_string(i) + "]",
                       prefix + "layers." + std::to_string(i) + ".");
    if (encoder->norm) onnx_emit_module(b, *encoder->norm, where + ".norm", prefix + "norm.");
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
         "LastStep, FinalState, MultiheadAttention, TransformerEncoderLayer, CausalTransformerLayer, "
         "TransformerEncoder, Embedding, SinusoidalPositionalEncoding, LearnedPositionalEmbedding, and the blocks "
         "Residual, Add, Concat)");
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
