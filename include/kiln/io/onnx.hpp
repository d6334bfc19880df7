// ONNX export of Sequential models in both modes: kiln::io::export_onnx(net, "model.onnx") for a static
// kiln::Sequential, and export_onnx(model, "model.onnx", {.input_shape = {28, 28}}) for a dynamic nn::Sequential
// (whose input shape is not part of its type). The file is a ModelProto (ir_version, opset_import, producer "kiln")
// whose graph has one input "input" of shape [N, ...] with a symbolic batch dimension "N" ([seq, N, ...] for a
// time-major dynamic model, see onnx_options::input_shape), one output "output", the weights as float initializers
// (raw_data) named as in the model's state_dict ("0.weight", "1.body.0.running_mean"; a tensor the exporter derives
// says how, "2.weight_t", "0.self_attn.in_proj_weight_t", or has a name of its own, the recurrent layers' gates in
// ONNX's order), and one node per operation:
//   Dense / Linear          Gemm (transB = 1) on 2-d inputs, MatMul + Add on higher ranks
//   ReLU, Sigmoid, Tanh     Relu, Sigmoid, Tanh;  LeakyReLU: LeakyRelu (alpha)
//   GELU                    Gelu (opset >= 20), else its erf form 0.5 * x * (1 + Erf(x / sqrt 2))
//   Softmax, LogSoftmax     Softmax / LogSoftmax with the axis attribute (opset >= 13 semantics)
//   Flatten                 Flatten (axis = 1) for the default start_dim = 1, end_dim = -1; Reshape otherwise
//   Conv2D / Conv2d         Conv (strides, pads, dilations, group; "same" as explicit pads, the odd pixel at the end)
//   MaxPool2D, AvgPool2D    MaxPool, AveragePool; ceil_mode as end padding that gives kiln's size (see onnx_cnn.hpp),
//                           count_include_pad as kiln's (a Pad node first where a ceil-mode window overhangs)
//   GlobalAvgPool2D         GlobalAveragePool + Flatten;  nn::AdaptiveAvgPool2d(1): GlobalAveragePool
//   BatchNorm1d, 2d         BatchNormalization in inference form: running mean and variance, epsilon (SyncBatchNorm1d
//                           and 2d too, which evaluate as BatchNorm)
//   LayerNorm               LayerNormalization (opset >= 17), else ReduceMean, Sub, Mul, Add, Sqrt, Div
//   Dropout                 nothing (the identity at inference)
//   LSTM, GRU               LSTM / GRU, one node per stacked layer: ONNX's gate order, "bidirectional" direction,
//                           GRU linear_before_reset = 1; Transposes around the time-major nodes for batch first.
//                           AllSteps: Y; LastStep: Gather of step -1; FinalState: Y_h; directions joined along the
//                           features by Transpose + Reshape (Squeeze for one direction); see onnx_recurrent.hpp
//   nn::MultiheadAttention  self-attention (its one-argument forward: query = key = value, no masks): MatMul with the
//                           transposed in_proj_weight + Add, Split into q, k, v, Reshape + Transpose into heads, Mul
//                           by 1 / sqrt(head_dim), MatMul (q k^T), Softmax over the keys, MatMul with v, Transpose +
//                           Reshape merging the heads, out_proj as a Linear; Transposes around it for a time-major
//                           (batch second) sequence; see onnx_attention.hpp
//   nn::TransformerEncoderLayer  its sublayers as above (self_attn, linear1, ReLU or GELU, linear2, norm1, norm2 as
//                           LayerNorm) with an Add per residual, norm first or after;  nn::CausalTransformerLayer: the
//                           same with a constant [L, L] mask (-inf above the diagonal) added to the scores
//   nn::TransformerEncoder  its layers in turn, then its norm (if any); static mode's TransformerEncoderLayer,
//                           CausalTransformerLayer and MultiheadSelfAttention as their dynamic twins (and
//                           Patches, ClassToken, SelectToken, TimeDistributed: see onnx_static_transformer.hpp)
//   nn::Embedding           Cast of the float ids to int64 + Gather of the weight's rows (see onnx_embedding.hpp)
//   nn::SinusoidalPositionalEncoding, nn::LearnedPositionalEmbedding   Slice of the table's first L rows (the whole
//                           table is the initializer) + Add (a Reshape to [L, 1, E] first for a time-major sequence)
//   Chain, nn::Sequential   its layers in turn
//   Residual, nn::Residual  the body and the shortcut (if any) from the block's input, then Add (shortcut or input,
//                           body)
//   Add, nn::Add            every branch from the block's input, then one Add per branch after the first, in order
//   Concat, nn::Concat      every branch from the block's input, then Concat along the block's dim (the batch's is 0);
//                           blocks nest (see onnx_blocks.hpp)
// The graph is the model's evaluation-mode computation, whatever mode the model is in. A fused activation of a
// static Dense becomes its own node after the Gemm, as does the activation layer a static Conv2D fuses. A layer the
// exporter does not know is a compile error (static) or a kiln::error naming it (dynamic); a new layer joins by
// adding an onnx_emit overload. Written with kiln's own protobuf writer (kiln/io/protobuf.hpp); the format is
// onnx.proto's.
#pragma once

#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/io/atomic_file.hpp"
#include "kiln/io/onnx_blocks.hpp"
#include "kiln/io/onnx_builder.hpp"
#include "kiln/io/onnx_cnn.hpp"
#include "kiln/io/onnx_recurrent.hpp"
#include "kiln/io/onnx_static_transformer.hpp"
#include "kiln/layers/activation.hpp"
#include "kiln/layers/dense.hpp"
#include "kiln/layers/flatten.hpp"
#include "kiln/layers/softmax.hpp"
#include "kiln/static/sequential.hpp"

namespace kiln::io {

// --- static mode: one onnx_emit overload per layer type --------------------------------------------------------------
// params: the layer's state_dict entries in PyTorch order (weight, bias, then buffers such as running_mean).
template <index_t Out, class Act, bool Bias>
void onnx_emit(onnx_builder& b, const Dense<Out, Act, Bias>&, const std::vector<const Tensor<float>*>& params) {
  const Tensor<float>& w = *params.at(0);
  b.linear(w.data(), Bias ? params.at(1)->data() : nullptr, w.extent(1), Out);
  b.activation_node(Act::kind, Act::slope);
}
template <activation Kind, double Slope>
void onnx_emit(onnx_builder& b, const activation_layer<Kind, Slope>&, const std::vector<const Tensor<float>*>&) {
  b.activation_node(Kind, Slope);
}
template <int Dim, bool Log>
void onnx_emit(onnx_builder& b, const softmax_layer<Dim, Log>&, const std::vector<const Tensor<float>*>&) {
  b.softmax(Dim, Log);
}
inline void onnx_emit(onnx_builder& b, const Flatten&, const std::vector<const Tensor<float>*>&) { b.flatten(); }

// The ONNX bytes of a static float Sequential. Its layers are written as a chain under the state_dict's names
// (onnx_blocks.hpp); a layer without an export stops the build with a static_assert naming it.
template <class Policy, class InputSpec, class... Layers>
std::string onnx_model_bytes(const Sequential<Policy, InputSpec, Layers...>& net, onnx_options options = {}) {
  static_assert(std::is_same_v<typename InputSpec::value_type, float>, "kiln::io::export_onnx: float models only");
  using net_type = Sequential<Policy, InputSpec, Layers...>;
  shape in = net_type::input_shape::batch_shape(1);
  std::vector<index_t> sample(in.begin() + 1, in.end());
  onnx_builder b(std::move(options), sample);
  const onnx_state_dict dict = net.state_dict();
  detail::onnx_emit_layers<Layers...>(b, dict, "");
  return b.finish();
}

template <class Policy, class InputSpec, class... Layers>
void export_onnx(const Sequential<Policy, InputSpec, Layers...>& net, const std::filesystem::path& path,
                 onnx_options options = {}) {
  write_file_atomically(path, onnx_model_bytes(net, std::move(options)));
}

}  // namespace kiln::io
