// Transformer layers of dynamic mode, as torch.nn's: the same arguments, parameter names, forward and masks.
//   nn::TransformerEncoderLayer(d_model, nhead, {.dim_feedforward, .dropout, .activation, .layer_norm_eps,
//                               .batch_first, .norm_first, .bias})
//       children self_attn (MultiheadAttention), linear1, dropout, linear2, norm1, norm2, dropout1, dropout2
//   nn::TransformerEncoder(make_layer, num_layers, norm)     children layers.0, layers.1, ..., norm
//   nn::CausalTransformerLayer(d_model, nhead, options)     the decoder-only (GPT) block: a TransformerEncoderLayer
//       whose one-argument forward masks the future, so that a language model is a chain of them
//   nn::generate_square_subsequent_mask(L)                  the causal mask: [L, L], -inf above the diagonal, else 0
//
//   auto encoder = kiln::nn::TransformerEncoder(
//       [] { return kiln::nn::TransformerEncoderLayer(128, 4, {.dim_feedforward = 512, .batch_first = true}); }, 4);
//   auto y = encoder.forward(x, {.mask = kiln::nn::generate_square_subsequent_mask(x.shape()[1]), .is_causal = true});
//
// The sublayers (PyTorch's _sa_block and _ff_block):
//   sa(x) = dropout1(self_attn(x, x, x, attn_mask, key_padding_mask, need_weights = false))
//   ff(x) = dropout2(linear2(dropout(activation(linear1(x)))))
//   norm_first:  x = x + sa(norm1(x));  x = x + ff(norm2(x))
//   otherwise:   x = norm1(x + sa(x));  x = norm2(x + ff(x))
// With is_causal (and no key padding mask) the attention runs the tiled kernel's causal path, which never builds the
// [L, L] mask: the mask given is PyTorch's required hint and is checked only for its shape.
//
// TransformerEncoder calls make_layer once per layer, so each layer draws its own initial weights from its own
// streams; torch.nn.TransformerEncoder deep-copies one layer instead, so that all its layers start equal (load a
// state_dict to reproduce that).
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dynamic/functional/activation.hpp"
#include "kiln/dynamic/functional/arithmetic.hpp"
#include "kiln/dynamic/functional/normalization.hpp"
#include "kiln/dynamic/module.hpp"
#include "kiln/dynamic/modules/attention.hpp"
#include "kiln/dynamic/modules/linear.hpp"
#include "kiln/dynamic/modules/normalization.hpp"

namespace kiln::nn {

// The feed-forward sublayer's activation.
enum class transformer_activation { relu, gelu };

// TransformerEncoderLayer's options after d_model and nhead, with torch's defaults.
struct transformer_encoder_layer_options {
  index_t dim_feedforward = 2048;
  double dropout = 0.1;
  transformer_activation activation = transformer_activation::relu;
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  bool bias = true;  // in the attention's projections, both Linears and both LayerNorms
};

// forward's options, as torch's TransformerEncoderLayer.forward after src (and TransformerEncoder's, whose first is
// called mask there). src_mask: [L, L] or [N * nhead, L, L], boolean (nn::bool_mask: True excludes) or additive;
// src_key_padding_mask: [N, L] ([L] unbatched), True excludes; is_causal: src_mask is the causal mask.
template <class T>
struct basic_transformer_forward_options {
  basic_attention_mask<T> mask{};
  basic_attention_mask<T> src_key_padding_mask{};
  bool is_causal = false;
};

// The causal mask of torch.nn.Transformer.generate_square_subsequent_mask: [size, size], -inf where the key comes
// after the query, 0 elsewhere.
template <class T = float>
basic_variable<T> generate_square_subsequent_mask(index_t size) {
  if (size < 0) fail("generate_square_subsequent_mask: expected a non-negative size, found ", size);
  Tensor<T> mask(kiln::shape{size, size});
  for (index_t i = 0; i < size; ++i)
    for (index_t j = 0; j < size; ++j) mask[i * size + j] = j > i ? T(-INFINITY) : T(0);
  return basic_variable<T>(mask);
}

template <class T>
class basic_transformer_encoder_layer : public basic_module<T> {
 public:
  using variable = basic_variable<T>;
  using forward_options = basic_transformer_forward_options<T>;

  // Children registered in torch's order, so that their init and dropout streams follow it.
  basic_transformer_encoder_layer(index_t d_model, index_t nhead, transformer_encoder_layer_options options = {})
      : options_(options) {
    if (options.dim_feedforward <= 0)
      fail("TransformerEncoderLayer: expected a positive dim_feedforward, found ", options.dim_feedforward);
    if (!(options.dropout >= 0.0 && options.dropout <= 1.0))
      fail("TransformerEncoderLayer: expected dropout in [0, 1], found ", options.dropout);
    if (!(options.layer_norm_eps > 0.0))
      fail("TransformerEncoderLayer: expected a positive layer_norm_eps, found ", options.layer_norm_eps);
    const T p = static_cast<T>(options.dropout), eps = static_cast<T>(options.layer_norm_eps);
    self_attn = this->register_module(
        "self_attn", basic_multihead_attention<T>(d_model, nhead,
                                                  {.bias = options.bias, .dropout = options.dropout,
                                                   .batch_first = options.batch_first}));
    linear1 = this->register_module("linear1", basic_linear<T>(d_model, options.dim_feedforward, options.bias));
    dropout = this->register_module("dropout", basic_dropout<T>(p));
    linear2 = this->register_module("linear2", basic_linear<T>(options.dim_feedforward, d_model, options.bias));
    norm1 = this->register_module("norm1", layer_norm_module(d_model, eps, options.bias));
    norm2 = this->register_module("norm2", layer_norm_module(d_model, eps, options.bias));
    dropout1 = this->register_module("dropout1", basic_dropout<T>(p));
    dropout2 = this->register_module("dropout2", basic_dropout<T>(p));
  }

  // src: [L, N, E] ([N, L, E] with batch_first; [L, E] unbatched); the output has its shape.
  variable forward(const variable& src, const forward_options& o) {
    try {
      variable x = src;
      if (options_.norm_first) {
        x = add(x, self_attention_block((*norm1)(x), o));
        x = add(x, feed_forward_block((*norm2)(x)));
      } else {
        x = (*norm1)(add(x, self_attention_block(x, o)));
        x = (*norm2)(add(x, feed_forward_block(x)));
      }
      return x;
    } catch (const error& e) {
      fail(describe(), ": ", e.what());
    }
  }
  variable operator()(const variable& src, const forward_options& o) { return forward(src, o); }
  // Without masks, so that the layer can stand in a Sequential.
  variable forward(const variable& src) override { return forward(src, forward_options{}); }
  using basic_module<T>::operator();

  std::string name() const override { return "TransformerEncoderLayer"; }
  std::string extra_repr() const override {
    char text[200];
    std::snprintf(text, sizeof text,
                  "d_model=%lld, nhead=%lld, dim_feedforward=%lld, dropout=%g, activation=%s, batch_first=%s, "
                  "norm_first=%s",
                  static_cast<long long>(d_model()), static_cast<long long>(nhead()),
                  static_cast<long long>(options_.dim_feedforward), options_.dropout,
                  options_.activation == transformer_activation::gelu ? "gelu" : "relu",
                  options_.batch_first ? "True" : "False", options_.norm_first ? "True" : "False");
    return text;
  }
  using basic_module<T>::describe;
  index_t d_model() const { return self_attn->embed_dim(); }
  index_t nhead() const { return self_attn->num_heads(); }
  const transformer_encoder_layer_options& options() const { return options_; }

  std::shared_ptr<basic_multihead_attention<T>> self_attn;
  std::shared_ptr<basic_linear<T>> linear1, linear2;
  std::shared_ptr<basic_dropout<T>> dropout, dropout1, dropout2;
  std::shared_ptr<basic_layer_norm<T>> norm1, norm2;

 private:
  // A LayerNorm over d_model whose bias exists only with options.bias, as torch's LayerNorm(bias=...).
  static basic_layer_norm<T> layer_norm_module(index_t d_model, T eps, bool bias) {
    return basic_layer_norm<T>(d_model, eps, true, bias);
  }

  variable self_attention_block(const variable& x, const forward_options& o) {
    variable attended =
        self_attn
            ->forward(x, x, x,
                      {.key_padding_mask = o.src_key_padding_mask, .need_weights = false, .attn_mask = o.mask,
                       .is_causal = o.is_causal})
            .first;
    return (*dropout1)(attended);
  }
  variable feed_forward_block(const variable& x) {
    variable h = (*linear1)(x);
    h = options_.activation == transformer_activation::gelu ? gelu(h) : relu(h);
    return (*dropout2)((*linear2)((*dropout)(h)));
  }

  transformer_encoder_layer_options options_;
};

// The decoder-only block of a language model (GPT's): a TransformerEncoderLayer that attends only to the present and
// the past. Its parameters have TransformerEncoderLayer's names, so a PyTorch TransformerEncoderLayer's state_dict
// loads. The one-argument forward passes MultiheadAttention the [L, L] causal mask PyTorch requires beside is_causal;
// the attention checks its shape only and takes the tiled kernel's causal path, which never reads it.
template <class T>
class basic_causal_transformer_layer : public basic_transformer_encoder_layer<T> {
 public:
  using basic_transformer_encoder_layer<T>::basic_transformer_encoder_layer;
  using basic_transformer_encoder_layer<T>::forward;
  basic_variable<T> forward(const basic_variable<T>& src) override {
    const bool batched = src.dim() == 3;
    const int sequence_dim = batched && this->options().batch_first ? 1 : 0;
    const index_t length = src.dim() >= 1 ? src.shape()[sequence_dim] : 0;
    return this->forward(src, {.mask = generate_square_subsequent_mask<T>(length), .is_causal = true});
  }
  std::string name() const override { return "CausalTransformerLayer"; }
};

template <class T>
class basic_transformer_encoder : public basic_module<T> {
 public:
  using variable = basic_variable<T>;
  using layer_type = basic_transformer_encoder_layer<T>;
  using forward_options = basic_transformer_forward_options<T>;

  // num_layers layers made by make_layer() (a TransformerEncoderLayer or a type derived from it, by value or by
  // shared_ptr), then norm when given (registered as "norm", applied after the last layer).
  template <class MakeLayer>
  basic_transformer_encoder(MakeLayer&& make_layer, index_t num_layers,
                            std::shared_ptr<basic_layer_norm<T>> norm = nullptr) {
    if (num_layers < 1) fail("TransformerEncoder: expected num_layers >= 1, found ", num_layers);
    layers_container_ = this->register_module("layers", std::make_shared<layer_list>());
    for (index_t i = 0; i < num_layers; ++i) {
      auto layer = as_pointer(make_layer());
      layers.push_back(layer);
      layers_container_->add(std::to_string(i), layer);
    }
    if (norm) this->norm = this->register_module("norm", norm);
    // The norm, an argument, drew its init stream before the layers; handed out again in positional order, the
    // layers' streams are those of a static Sequential of the same layers (layers/transformer_encoder_layer.hpp).
    this->restore_construction_order();
  }

  variable forward(const variable& src, const forward_options& o) {
    variable x = src;
    for (auto& layer : layers) x = layer->forward(x, o);
    return norm ? (*norm)(x) : x;
  }
  variable operator()(const variable& src, const forward_options& o) { return forward(src, o); }
  // Every layer's own one-argument forward (no mask for a TransformerEncoderLayer, the causal one for a
  // CausalTransformerLayer).
  variable forward(const variable& src) override {
    variable x = src;
    for (auto& layer : layers) x = (*layer)(x);
    return norm ? (*norm)(x) : x;
  }
  using basic_module<T>::operator();

  std::string name() const override { return "TransformerEncoder"; }
  std::string extra_repr() const override { return "num_layers=" + std::to_string(layers.size()); }

  std::vector<std::shared_ptr<layer_type>> layers;
  std::shared_ptr<basic_layer_norm<T>> norm;

 private:
  // torch's ModuleList: children named 0, 1, ... and no forward of its own.
  class layer_list : public basic_module<T> {
   public:
    void add(const std::string& name, std::shared_ptr<basic_module<T>> m) { this->register_module(name, m); }
    variable forward(const variable&) override { fail("ModuleList has no forward; call its layers"); }
    std::string name() const override { return "ModuleList"; }
  };

  template <class L>
  static std::shared_ptr<layer_type> as_pointer(L&& layer) {
    if constexpr (requires { layer.get(); }) {
      if (!layer) fail("TransformerEncoder: make_layer returned a null layer");
      return std::shared_ptr<layer_type>(std::forward<L>(layer));
    } else {
      return std::make_shared<std::remove_cvref_t<L>>(std::forward<L>(layer));
    }
  }

  std::shared_ptr<layer_list> layers_container_;
};

using TransformerEncoderLayer = basic_transformer_encoder_layer<float>;
using CausalTransformerLayer = basic_causal_transformer_layer<float>;
using TransformerEncoder = basic_transformer_encoder<float>;
using TransformerForwardOptions = basic_transformer_forward_options<float>;
using TransformerEncoderLayerOptions = transformer_encoder_layer_options;

}  // namespace kiln::nn
