// ONNX export of static mode's sequence layers (kiln/io/onnx.hpp has the table of operators), through the functions
// dynamic mode's modules export with (onnx_attention.hpp, onnx_embedding.hpp), so both modes give the same graph:
//   Embedding<Num, Dim>                          Cast to int64 + Gather
//   LearnedPositionalEmbedding, Sinusoidal...    Slice of the table's first L rows + Add
//   MultiheadSelfAttention<Heads, Causal>        as nn::MultiheadAttention's self-attention (the causal mask a
//                                                constant [L, L] initializer)
//   TimeDistributed<L>                           L's own export on the sequence (a Dense: MatMul + Add)
//   TransformerEncoderLayer, CausalTransformer.. as nn::TransformerEncoderLayer's, under the same names
//   Patches<P>                                   Reshape [N, C, H/P, P, W/P, P] + Transpose + Reshape
//   ClassToken                                   the token Expanded over the batch (Shape, Slice, Concat, Expand),
//                                                then Concat in front of the sequence
//   SelectToken<I>                               Slice of token I + Reshape to [N, E]
// A static sample is batch first, so every sequence here is [N, L, E].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/onnx_attention.hpp"
#include "kiln/io/onnx_blocks.hpp"
#include "kiln/io/onnx_builder.hpp"
#include "kiln/io/onnx_embedding.hpp"
#include "kiln/io/onnx_recurrent.hpp"
#include "kiln/layers/embedding.hpp"
#include "kiln/layers/positional_embedding.hpp"
#include "kiln/layers/self_attention.hpp"
#include "kiln/layers/time_distributed.hpp"
#include "kiln/layers/tokens.hpp"
#include "kiln/layers/transformer_encoder_layer.hpp"

namespace kiln::io {

namespace detail {
// The state_dict entry `name` (a sub-layer's tensors, "0.self_attn.out_proj.weight", are not the layer's own
// entries, so blocks look them up by name).
inline const Tensor<float>& onnx_entry(const onnx_state_dict& dict, const std::string& name) {
  for (const auto& [n, tensor] : dict)
    if (n == name) return tensor;
  fail("export_onnx: the model's state_dict has no tensor '", name, "'");
}
inline onnx_attention_weights onnx_attention_entries(const onnx_state_dict& dict, const std::string& prefix) {
  return {onnx_entry(dict, prefix + "in_proj_weight").data(), onnx_entry(dict, prefix + "in_proj_bias").data(),
          onnx_entry(dict, prefix + "out_proj.weight").data(), onnx_entry(dict, prefix + "out_proj.bias").data()};
}
}  // namespace detail

template <index_t Num, index_t Dim>
void onnx_emit(onnx_builder& b, const Embedding<Num, Dim>&, const std::vector<const Tensor<float>*>& params) {
  onnx_embedding(b, params.at(0)->data(), Num, Dim);
}
template <index_t MaxLen, double Std>
void onnx_emit(onnx_builder& b, const LearnedPositionalEmbedding<MaxLen, Std>&,
               const std::vector<const Tensor<float>*>& params) {
  const Tensor<float>& table = *params.at(0);
  onnx_add_positions(b, "LearnedPositionalEmbedding", "weight", table.data(), MaxLen, table.extent(1), true);
}
template <index_t MaxLen>
void onnx_emit(onnx_builder& b, const SinusoidalPositionalEncoding<MaxLen>&,
               const std::vector<const Tensor<float>*>& buffers) {
  const Tensor<float>& table = *buffers.at(0);
  onnx_add_positions(b, "SinusoidalPositionalEncoding", "pe", table.data(), MaxLen, table.extent(1), true);
}

template <index_t P>
void onnx_emit(onnx_builder& b, const Patches<P>&, const std::vector<const Tensor<float>*>&) {
  const std::vector<index_t> s = b.sample_shape();
  if (s.size() != 2 && s.size() != 3)
    fail("export_onnx: Patches expects an image [N, C, H, W] or [N, H, W], found a value of shape ", b.shape_text());
  const index_t C = s.size() == 3 ? s[0] : 1, H = s[s.size() - 2], W = s[s.size() - 1];
  const index_t rows = H / P, cols = W / P;
  const std::string cut = detail::onnx_reshape(b, b.current(), {0, C, rows, P, cols, P});
  const std::string tokens =
      detail::onnx_reshape(b, detail::onnx_transpose(b, cut, {0, 2, 4, 1, 3, 5}), {0, rows * cols, C * P * P});
  b.set_current(tokens, {rows * cols, C * P * P});
}

template <double Std>
void onnx_emit(onnx_builder& b, const ClassToken<Std>&, const std::vector<const Tensor<float>*>& params) {
  const std::vector<index_t> s = b.sample_shape();
  const index_t L = s.at(0), E = s.at(1);
  const std::string x = b.current();
  const std::string token = b.parameter("class_token", params.at(0)->data(), {1, 1, E});
  // [N, 1, E]: the batch's extent from the input's shape, then 1 and E.
  const std::string shape = b.fresh("shape"), batch = b.fresh("batch"), target = b.fresh("token_shape");
  b.add_node(onnx_builder::node("Shape", {x}, shape));
  b.add_node(onnx_builder::node("Slice",
                                {shape, b.int64_initializer("starts", {0}), b.int64_initializer("ends", {1}),
                                 b.int64_initializer("axes", {0})},
                                batch));
  auto joined = onnx_builder::node("Concat", {batch, b.int64_initializer("token_extents", {1, E})}, target);
  onnx_builder::attr_int(joined, "axis", 0);
  b.add_node(std::move(joined));
  const std::string tokens = b.fresh("class_tokens"), y = b.fresh("with_class_token");
  b.add_node(onnx_builder::node("Expand", {token, target}, tokens));
  auto concat = onnx_builder::node("Concat", {tokens, x}, y);
  onnx_builder::attr_int(concat, "axis", 1);
  b.add_node(std::move(concat));
  b.set_current(y, {L + 1, E});
}

template <index_t I>
void onnx_emit(onnx_builder& b, const SelectToken<I>&, const std::vector<const Tensor<float>*>&) {
  const index_t E = b.sample_shape().at(1);
  const std::string token = b.fresh("token");
  b.add_node(onnx_builder::node("Slice",
                                {b.current(), b.int64_initializer("starts", {I}), b.int64_initializer("ends", {I + 1}),
                                 b.int64_initializer("axes", {1})},
                                token));
  b.set_current(detail::onnx_reshape(b, token, {0, E}), {E});
}

// Self-attention under its prefix ("2."): in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias.
template <index_t Heads, bool Causal>
void onnx_emit_block(onnx_builder& b, const MultiheadSelfAttention<Heads, Causal>&, const onnx_state_dict& dict,
                     const std::string& prefix) {
  b.set_parameter_prefix(prefix);
  onnx_self_attention(b, {.embed_dim = b.sample_shape().at(1), .num_heads = Heads, .batch_first = true},
                      detail::onnx_attention_entries(dict, prefix), Causal);
}

// TimeDistributed<L>: L's export on the whole sequence, under L's names.
template <class L>
void onnx_emit_block(onnx_builder& b, const TimeDistributed<L>&, const onnx_state_dict& dict,
                     const std::string& prefix) {
  detail::onnx_emit_static<L>(b, dict, prefix);
}

// TransformerEncoderLayer under its prefix: self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*.
template <index_t Heads, index_t FeedForward, transformer_layer_options O>
void onnx_emit_block(onnx_builder& b, const TransformerEncoderLayer<Heads, FeedForward, O>&,
                     const onnx_state_dict& dict, const std::string& prefix) {
  auto at = [&](const char* name) { return detail::onnx_entry(dict, prefix + name).data(); };
  onnx_transformer_layer_weights w;
  w.self_attn = detail::onnx_attention_entries(dict, prefix + "self_attn.");
  w.linear1_weight = at("linear1.weight");
  w.linear1_bias = at("linear1.bias");
  w.linear2_weight = at("linear2.weight");
  w.linear2_bias = at("linear2.bias");
  w.norm1_weight = at("norm1.weight");
  w.norm1_bias = at("norm1.bias");
  w.norm2_weight = at("norm2.weight");
  w.norm2_bias = at("norm2.bias");
  onnx_transformer_layer_dims d;
  d.attention = {.embed_dim = b.sample_shape().at(1), .num_heads = Heads, .batch_first = true};
  d.dim_feedforward = FeedForward;
  d.feed_forward_activation = O.feed_forward_activation;
  d.layer_norm_eps = O.layer_norm_eps;
  d.norm_first = O.norm_first;
  d.causal = O.causal;
  b.set_parameter_prefix(prefix);
  onnx_transformer_encoder_layer(b, d, w);
}

}  // namespace kiln::io
