// TransformerEncoderLayer<Heads, FeedForward, Options>: static mode's transformer block, as
// torch.nn.TransformerEncoderLayer(E, Heads, FeedForward, dropout=0, activation, layer_norm_eps, batch_first=True,
// norm_first) on a sample [L, E], and as dynamic mode's nn::TransformerEncoderLayer: the same parameters under the same
// names (self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*), drawn from the same init streams, so one seed gives
// both modes the same weights and the same training, bit for bit. CausalTransformerLayer is the decoder-only block of
// a language model (nn::CausalTransformerLayer): the same layer under the causal mask.
//   constexpr kiln::transformer_layer_options pre_norm{.feed_forward_activation = kiln::activation::gelu,
//                                                      .norm_first = true};
//   using Gpt = kiln::Sequential<kiln::policy::cpu, kiln::Input<128>, kiln::Embedding<256, 128>,
//                                kiln::LearnedPositionalEmbedding<128>, kiln::CausalTransformerLayer<4, 512, pre_norm>,
//                                ..., kiln::LayerNorm<128>, kiln::TimeDistributed<kiln::Dense<256>>>;
//
// The layer is a chain of static mode's blocks (static/blocks.hpp), planned and fused as any other chain:
//   norm_first:  Residual<LayerNorm, MultiheadSelfAttention>, Residual<LayerNorm, TimeDistributed<Dense<FF, Act>>,
//                TimeDistributed<Dense<E>>>
//   otherwise:   Residual<MultiheadSelfAttention>, LayerNorm, Residual<TimeDistributed<Dense<FF, Act>>,
//                TimeDistributed<Dense<E>>>, LayerNorm
// What it adds to the chain is PyTorch's naming of the five parts and dynamic mode's order of drawing their weights
// (self_attn, linear1, linear2, then the norms, whose values no draw changes). There is no dropout: static mode's
// attention kernel has none, so a layer with dropout is dynamic mode's.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/layers/activation.hpp"
#include "kiln/layers/dense.hpp"
#include "kiln/layers/layernorm.hpp"
#include "kiln/layers/parameter_info.hpp"
#include "kiln/layers/self_attention.hpp"
#include "kiln/layers/time_distributed.hpp"
#include "kiln/static/blocks.hpp"

namespace kiln {

// torch.nn.TransformerEncoderLayer's arguments that static mode takes (d_model is the input's width, nhead and
// dim_feedforward the template's first arguments, batch_first is always true and dropout 0).
struct transformer_layer_options {
  activation feed_forward_activation = activation::relu;  // relu or gelu, as torch's activation="relu" / "gelu"
  bool norm_first = false;
  double layer_norm_eps = 1e-5;
  bool causal = false;  // attend to the present and the past only (CausalTransformerLayer)
};

namespace transformer_layer_detail {

template <activation A>
struct activation_type;
template <>
struct activation_type<activation::relu> {
  using type = ReLU;
};
template <>
struct activation_type<activation::gelu> {
  using type = GELU;
};

// The layer's chain on a sample [L, E], and where each of PyTorch's parts sits in the chain's names (a Dense with its
// activation counts as two modules, as in a Sequential).
template <index_t Heads, index_t FeedForward, transformer_layer_options O, index_t E>
struct parts {
  using norm = layer_norm_layer<O.layer_norm_eps, true, E>;
  using attention = MultiheadSelfAttention<Heads, O.causal>;
  using expand = TimeDistributed<Dense<FeedForward, typename activation_type<O.feed_forward_activation>::type>>;
  using contract = TimeDistributed<Dense<E>>;
  using chain = std::conditional_t<O.norm_first,
                                   Chain<Residual<norm, attention>, Residual<norm, expand, contract>>,
                                   Chain<Residual<attention>, norm, Residual<expand, contract>, norm>>;
  static std::vector<std::pair<std::string_view, std::string_view>> names() {
    if constexpr (O.norm_first)
      return {{"0.body.0.", "norm1."}, {"0.body.1.", "self_attn."}, {"1.body.0.", "norm2."},
              {"1.body.1.", "linear1."}, {"1.body.3.", "linear2."}};
    else
      return {{"0.body.0.", "self_attn."}, {"1.", "norm1."}, {"2.body.0.", "linear1."}, {"2.body.2.", "linear2."},
              {"3.", "norm2."}};
  }
};

}  // namespace transformer_layer_detail

template <index_t Heads, index_t FeedForward, transformer_layer_options Options = transformer_layer_options{}>
struct TransformerEncoderLayer : block_detail::block_layer {
  static_assert(Heads >= 1 && FeedForward >= 1,
                "kiln::TransformerEncoderLayer<Heads, FeedForward>: expected at least one head and one feed-forward "
                "unit");
  static_assert(Options.feed_forward_activation == activation::relu ||
                    Options.feed_forward_activation == activation::gelu,
                "kiln::TransformerEncoderLayer: the feed-forward activation is relu or gelu, as PyTorch's");
  static_assert(Options.layer_norm_eps > 0, "kiln::TransformerEncoderLayer: layer_norm_eps must be positive");
  static constexpr const char* name = Options.causal ? "CausalTransformerLayer" : "TransformerEncoderLayer";

  template <class In>
  static constexpr bool accepts = In::rank == 2 && sequence_extent<In>(1) % Heads == 0;
  static constexpr const char* requirement =
      "a sequence [L, E] whose width E the number of heads divides (Embedding<V, E> on Input<L>, or Input<L, E>)";

  template <class In>
  using parts_of = transformer_layer_detail::parts<Heads, FeedForward, Options, sequence_extent<In>(1)>;

  template <class In>
  struct bind : parts_of<In>::chain::template bind<In> {
    using parts = parts_of<In>;
    using chain = typename parts::chain::template bind<In>;
    using sequence = In;
    using hidden = dims<In::rank == 2 ? In::extents[0] : 1, FeedForward>;

    // Every part from the stream dynamic mode's layer gives it: self_attn two (its own, out_proj's), then linear1,
    // linear2, norm1 and norm2 one each. The chain takes as many streams, in its own order; the norms' values are
    // fixed, and the three parts drawn at random are drawn again from their streams.
    template <class T>
    static void init(T* params, random_generator& rng) {
      chain::template init<T>(params, rng);
      const auto base = rng.state();
      random_generator attention(base.seed, base.stream), expand(base.seed, base.stream + 2),
          contract(base.seed, base.stream + 3);
      parts::attention::template bind<In>::template init<T>(params + offset_of("self_attn.in_proj_weight"), attention);
      parts::expand::template bind<In>::template init<T>(params + offset_of("linear1.weight"), expand);
      parts::contract::template bind<hidden>::template init<T>(params + offset_of("linear2.weight"), contract);
    }
    static std::vector<static_parameter_info> parameter_tensors() { return renamed(chain::parameter_tensors()); }
    static std::vector<static_parameter_info> buffer_tensors() { return renamed(chain::buffer_tensors()); }
    static std::string description() {
      return std::string(name) + "(" + std::to_string(Heads) + " heads, feed-forward " + std::to_string(FeedForward) +
             ", " + activation_name(Options.feed_forward_activation) + (Options.norm_first ? ", norm first" : "") +
             ")";
    }

   private:
    static std::vector<static_parameter_info> renamed(std::vector<static_parameter_info> tensors) {
      const auto names = parts::names();
      for (auto& t : tensors)
        for (const auto& [from, to] : names)
          if (t.name.starts_with(from)) {
            t.name = std::string(to) + t.name.substr(from.size());
            break;
          }
      return tensors;
    }
    static index_t offset_of(std::string_view tensor) {
      for (const auto& t : parameter_tensors())
        if (t.name == tensor) return t.offset;
      fail("kiln::TransformerEncoderLayer: no parameter ", tensor, " in its chain (the part names are out of date)");
    }
  };
};

template <index_t Heads, index_t FeedForward, transformer_layer_options Options = transformer_layer_options{}>
using CausalTransformerLayer = TransformerEncoderLayer<Heads, FeedForward,
                                                       transformer_layer_options{Options.feed_forward_activation,
                                                                                 Options.norm_first,
                                                                                 Options.layer_norm_eps, true}>;

}  // namespace kiln
