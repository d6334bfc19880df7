// ONNX export of dynamic-mode models: an nn::Sequential (nested ones included) of Linear, the activations, Softmax,
// LogSoftmax, Flatten and Identity. The input's per-sample shape must be given (options.input_shape), since a module
// does not know it. See kiln/io/onnx.hpp for the operators written.
//
//   kiln::io::export_onnx(model, "mlp.onnx", {.input_shape = {28, 28}});
#pragma once

#include <filesystem>
#include <string>

#include "kiln/dynamic/nn.hpp"
#include "kiln/io/onnx.hpp"

namespace kiln::io {

namespace detail {
inline void onnx_emit_module(onnx_builder& b, const nn::Module& m, const std::string& where) {
  if (auto* seq = dynamic_cast<const nn::Sequential*>(&m)) {
    for (std::size_t i = 0; i < seq->size(); ++i) {
      std::string w = where;
      w += "[";
      w += std::to_string(i);
      w += "]";
      onnx_emit_module(b, (*seq)[i], w);
    }
  } else if (auto* lin = dynamic_cast<const nn::Linear*>(&m)) {
    b.linear(lin->weight.value().data(), lin->bias.defined() ? lin->bias.value().data() : nullptr, lin->in_features(),
             lin->out_features());
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
  } else if (dynamic_cast<const nn::Identity*>(&m)) {
  } else if (auto* sm = dynamic_cast<const nn::Softmax*>(&m)) {
    b.softmax(sm->dim(), false);
  } else if (auto* lsm = dynamic_cast<const nn::LogSoftmax*>(&m)) {
    b.softmax(lsm->dim(), true);
  } else if (auto* flat = dynamic_cast<const nn::Flatten*>(&m)) {
    b.flatten(flat->start_dim(), flat->end_dim());
  } else {
    fail("export_onnx: ", where, " ", m.describe(), " has no ONNX export (exported: Sequential, Linear, ReLU, "
         "LeakyReLU, GELU, Sigmoid, Tanh, Identity, Softmax, LogSoftmax, Flatten)");
  }
}
}  // namespace detail

// The ONNX bytes of a dynamic float model; options.input_shape is the per-sample input shape.
inline std::string onnx_model_bytes(const nn::Module& model, onnx_options options) {
  if (options.input_shape.empty())
    fail("export_onnx: a dynamic model needs options.input_shape, the per-sample input shape (e.g. {28, 28})");
  std::vector<index_t> sample = options.input_shape;
  if (sample.size() > 1 && sample.front() == -1) sample.erase(sample.begin());  // the batch, as onnx_options says
  onnx_builder b(std::move(options), sample);
  try {
    detail::onnx_emit_module(b, model, model.name());
  } catch (const error& e) {
    fail(e.what());
  }
  return b.finish();
}

inline void export_onnx(const nn::Module& model, const std::filesystem::path& path, onnx_options options) {
  write_file_atomically(path, onnx_model_bytes(model, std::move(options)));
}

}  // namespace kiln::io
