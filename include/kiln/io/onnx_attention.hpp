// ONNX export of multi-head self-attention and the transformer encoder layer built on it (kiln/io/onnx.hpp has the
// table of operators), in plain opset-13 operators, as PyTorch computes them. Dynamic mode's dispatch
// (kiln/io/onnx_dynamic.hpp) calls them for nn::MultiheadAttention's one-argument forward (query = key = value, no
// masks), nn::TransformerEncoderLayer and nn::CausalTransformerLayer; the weights come in PyTorch's layout, as
// pointers, so that any layer holding them can call the same functions.
//
// Self-attention of x [N, L, E] with H heads of D = E / H features:
//   q, k, v = Split(x in_proj_weight^T + in_proj_bias)          one MatMul with "<prefix>in_proj_weight_t" [E, 3 E]
//   q, k, v -> [N, H, L, D]                                     Reshape [N, L, H, D] + Transpose (k to [N, H, D, L])
//   weights = Softmax((q / sqrt(D)) k^T + mask) over the keys   Mul by the scale, MatMul, Add of the causal mask
//   out = out_proj(merge heads(weights v))                      MatMul, Transpose + Reshape to [N, L, E], a Linear
// A time-major value [L, N, E] is transposed to [N, L, E] first and back after out_proj, as kiln does. The causal
// mask is a constant [L, L] initializer, -inf above the diagonal and 0 elsewhere: the graph's sequence length is fixed
// by options.input_shape, so the mask is too.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/onnx_blocks.hpp"
#include "kiln/io/onnx_builder.hpp"
#include "kiln/io/onnx_cnn.hpp"
#include "kiln/io/onnx_embedding.hpp"
#include "kiln/io/onnx_recurrent.hpp"
#include "kiln/kernels/activation.hpp"

namespace kiln::io {

// A self-attention's shape, as torch.nn.MultiheadAttention's arguments (kdim = vdim = embed_dim).
struct onnx_attention_dims {
  index_t embed_dim = 0;
  index_t num_heads = 1;
  bool batch_first = false;
};

// A self-attention's parameters in PyTorch's layout; a bias is null when the layer has none.
struct onnx_attention_weights {
  const float* in_proj_weight = nullptr;   // [3 E, E]: the rows of q, then k, then v
  const float* in_proj_bias = nullptr;     // [3 E]
  const float* out_proj_weight = nullptr;  // [E, E]
  const float* out_proj_bias = nullptr;    // [E]
};

namespace detail {
// torch.nn.Transformer.generate_square_subsequent_mask(length): -inf where the key comes after the query, else 0.
inline std::vector<float> onnx_causal_mask(index_t length) {
  std::vector<float> mask(static_cast<std::size_t>(length * length), 0.0f);
  for (index_t i = 0; i < length; ++i)
    for (index_t j = i + 1; j < length; ++j)
      mask[static_cast<std::size_t>(i * length + j)] = -std::numeric_limits<float>::infinity();
  return mask;
}

inline std::string onnx_binary(onnx_builder& b, const char* op, const std::string& l, const std::string& r,
                               const char* what) {
  std::string y = b.fresh(what);
  b.add_node(onnx_builder::node(op, {l, r}, y));
  return y;
}
}  // namespace detail

// Self-attention of the current value (query = key = value), as nn::MultiheadAttention's forward with
// need_weights = false and, when causal, the causal attn_mask: each query attends to itself and the keys before it.
// The builder's parameter prefix is the attention's own ("0.self_attn."): its weights are "<prefix>in_proj_weight_t"
// (in_proj_weight transposed), "<prefix>in_proj_bias", "<prefix>out_proj.weight_t" and "<prefix>out_proj.bias".
inline void onnx_self_attention(onnx_builder& b, const onnx_attention_dims& d, const onnx_attention_weights& w,
                                bool causal) {
  const char* layer = "MultiheadAttention";
  const index_t E = d.embed_dim, H = d.num_heads;
  if (E < 1 || H < 1 || E % H != 0)
    fail("export_onnx: ", layer, " expects embed_dim divisible by num_heads, both positive, found embed_dim ", E,
         " and num_heads ", H);
  const index_t D = E / H;
  const index_t L = detail::onnx_sequence_length(b, layer, E, d.batch_first);
  const std::string x = d.batch_first ? b.current() : detail::onnx_transpose(b, b.current(), {1, 0, 2});
  const std::string prefix = b.parameter_prefix();

  // The packed projection, one MatMul as kiln's linear(x, in_proj_weight, in_proj_bias), split into q, k and v.
  std::vector<float> w_t(static_cast<std::size_t>(3 * E * E));
  for (index_t o = 0; o < 3 * E; ++o)
    for (index_t i = 0; i < E; ++i) w_t[static_cast<std::size_t>(i * 3 * E + o)] = w.in_proj_weight[o * E + i];
  std::string qkv = detail::onnx_binary(b, "MatMul", x, b.parameter("in_proj_weight_t", w_t.data(), {E, 3 * E}),
                                        "qkv");
  if (w.in_proj_bias)
    qkv = detail::onnx_binary(b, "Add", qkv, b.parameter("in_proj_bias", w.in_proj_bias, {3 * E}), "qkv_bias");
  const std::string q = b.fresh("q"), k = b.fresh("k"), v = b.fresh("v");
  auto split = onnx_builder::node("Split", {qkv, b.int64_initializer("split", {E, E, E})}, {q, k, v});
  onnx_builder::attr_int(split, "axis", 2);
  b.add_node(std::move(split));

  // [N, L, E] -> [N, L, H, D] -> [N, H, L, D] ([N, H, D, L] for the keys, ready for q k^T).
  auto heads = [&](const std::string& part, const std::vector<index_t>& perm) {
    return detail::onnx_transpose(b, detail::onnx_reshape(b, part, {0, L, H, D}), perm);
  };
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const std::string q_scaled =
      detail::onnx_binary(b, "Mul", heads(q, {0, 2, 1, 3}), b.initializer("attention_scale", &scale, {}), "q_scaled");
  std::string scores = detail::onnx_binary(b, "MatMul", q_scaled, heads(k, {0, 2, 3, 1}), "scores");
  if (causal) {
    const std::vector<float> mask = detail::onnx_causal_mask(L);
    scores = detail::onnx_binary(b, "Add", scores, b.initializer("causal_mask", mask.data(), {L, L}), "scores_masked");
  }
  const std::string weights = b.fresh("attention_weights");
  auto softmax = onnx_builder::node("Softmax", {scores}, weights);
  onnx_builder::attr_int(softmax, "axis", -1);
  b.add_node(std::move(softmax));
  const std::string attended = detail::onnx_binary(b, "MatMul", weights, heads(v, {0, 2, 1, 3}), "attended");

  // Heads merged back, [N, H, L, D] -> [N, L, H, D] -> [N, L, E], then out_proj under its own prefix.
  const std::string merged =
      detail::onnx_reshape(b, detail::onnx_transpose(b, attended, {0, 2, 1, 3}), {0, L, E});
  b.set_current(merged, {L, E}, 0);
  b.set_parameter_prefix(prefix + "out_proj.");
  b.linear(w.out_proj_weight, w.out_proj_bias, E, E);
  b.set_parameter_prefix(prefix);
  if (!d.batch_first) b.set_current(detail::onnx_transpose(b, b.current(), {1, 0, 2}), {L, E}, 1);
}

// A transformer encoder layer's shape and options, as torch.nn.TransformerEncoderLayer's (dropout, used in training
// only, is left out); causal: the self-attention masks the future (nn::CausalTransformerLayer).
struct onnx_transformer_layer_dims {
  onnx_attention_dims attention{};
  index_t dim_feedforward = 0;
  activation feed_forward_activation = activation::relu;  // relu or gelu
  double layer_norm_eps = 1e-5;
  bool norm_first = false;
  bool causal = false;
};

// Its parameters in PyTorch's layout; the biases (Linear and LayerNorm) are null without bias.
struct onnx_transformer_layer_weights {
  onnx_attention_weights self_attn{};
  const float* linear1_weight = nullptr;  // [dim_feedforward, E]
  const float* linear1_bias = nullptr;
  const float* linear2_weight = nullptr;  // [E, dim_feedforward]
  const float* linear2_bias = nullptr;
  const float* norm1_weight = nullptr;  // [E]
  const float* norm1_bias = nullptr;
  const float* norm2_weight = nullptr;
  const float* norm2_bias = nullptr;
};

// A transformer encoder layer on the current value, as TransformerEncoderLayer's forward (PyTorch's _sa_block and
// _ff_block, residuals added input first, as kiln adds them):
//   norm_first:  x = x + sa(norm1(x));  x = x + ff(norm2(x))
//   otherwise:   x = norm1(x + sa(x));  x = norm2(x + ff(x))
// with sa the self-attention and ff linear2(activation(linear1(x))). The builder's parameter prefix is the layer's
// ("2."); its sublayers' weights are named under theirs ("2.self_attn.in_proj_weight_t", "2.linear1.weight_t",
// "2.norm1.weight").
inline void onnx_transformer_encoder_layer(onnx_builder& b, const onnx_transformer_layer_dims& d,
                                           const onnx_transformer_layer_weights& w) {
  const char* layer = d.causal ? "CausalTransformerLayer" : "TransformerEncoderLayer";
  if (d.feed_forward_activation != activation::relu && d.feed_forward_activation != activation::gelu)
    fail("export_onnx: ", layer, " expects a relu or gelu feed-forward activation");
  const index_t E = d.attention.embed_dim, F = d.dim_feedforward;
  if (F < 1) fail("export_onnx: ", layer, " expects a positive dim_feedforward, found ", F);
  detail::onnx_sequence_length(b, layer, E, d.attention.batch_first);  // checked before any node is written
  const std::string prefix = b.parameter_prefix();
  auto under = [&](const char* child) { b.set_parameter_prefix(prefix + child); };
  auto norm = [&](const char* child, const float* weight, const float* bias) {
    under(child);
    onnx_layer_norm(b, kiln::shape{E}, weight, bias, d.layer_norm_eps);
  };
  auto self_attention = [&] {
    under("self_attn.");
    onnx_self_attention(b, d.attention, w.self_attn, d.causal);
  };
  auto feed_forward = [&] {
    under("linear1.");
    b.linear(w.linear1_weight, w.linear1_bias, E, F);
    b.activation_node(d.feed_forward_activation, 0);
    under("linear2.");
    b.linear(w.linear2_weight, w.linear2_bias, F, E);
  };
  // x + sublayer(x), or x + sublayer(norm(x)) with norm_first.
  auto residual = [&](auto&& sublayer, const char* norm_child, const float* norm_weight, const float* norm_bias,
                      const char* label) {
    const onnx_value x = b.value();
    if (d.norm_first) norm(norm_child, norm_weight, norm_bias);
    sublayer();
    onnx_add(b, {x, b.value()}, {"the input", label}, layer, false);
    if (!d.norm_first) norm(norm_child, norm_weight, norm_bias);
  };
  residual(self_attention, "norm1.", w.norm1_weight, w.norm1_bias, "the self-attention");
  residual(feed_forward, "norm2.", w.norm2_weight, w.norm2_bias, "the feed-forward block");
  b.set_parameter_prefix(prefix);
}

}  // namespace kiln::io
