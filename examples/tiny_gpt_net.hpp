// examples/tiny_gpt's model, shared with bench/ladder's transformer workload: a decoder-only transformer over byte
// tokens. ids [N, L] (whole numbers) -> Embedding(256, width) + a learned position table -> layers x
// CausalTransformerLayer(width, heads, feed-forward 4 width, GELU, batch_first, norm_first) -> LayerNorm ->
// Linear(width, 256): next-token logits [N, L, 256]. StaticTinyGPT is the same model in static mode, its sizes fixed
// at compile time: from one seed both have the same weights and train to the same losses.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "kiln/data/text.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

namespace kiln::examples {

struct gpt_options {
  index_t layers = 4, width = 128, heads = 4, context = 128;
  double dropout = 0.0;
};

struct TinyGPT : nn::Module {
  explicit TinyGPT(const gpt_options& o) {
    tokens = register_module("tokens", nn::Embedding(data::byte_vocabulary::size, o.width));
    positions = register_module("positions", nn::LearnedPositionalEmbedding(o.context, o.width, {.batch_first = true}));
    const nn::TransformerEncoderLayerOptions block{.dim_feedforward = 4 * o.width,
                                                   .dropout = o.dropout,
                                                   .activation = nn::transformer_activation::gelu,
                                                   .batch_first = true,
                                                   .norm_first = true};
    trunk = register_module(
        "trunk", nn::TransformerEncoder([&] { return nn::CausalTransformerLayer(o.width, o.heads, block); }, o.layers,
                                        std::make_shared<nn::LayerNorm>(o.width)));
    head = register_module("head", nn::Linear(o.width, data::byte_vocabulary::size));
  }
  nn::Variable forward(const nn::Variable& ids) override { return (*head)((*trunk)((*positions)((*tokens)(ids)))); }
  std::string name() const override { return "TinyGPT"; }

  std::shared_ptr<nn::Embedding> tokens;
  std::shared_ptr<nn::LearnedPositionalEmbedding> positions;
  std::shared_ptr<nn::TransformerEncoder> trunk;
  std::shared_ptr<nn::Linear> head;
};

namespace detail {
template <class Policy, index_t Width, index_t Heads, index_t Context, class Blocks>
struct static_gpt;
template <class Policy, index_t Width, index_t Heads, index_t Context, std::size_t... Block>
struct static_gpt<Policy, Width, Heads, Context, std::index_sequence<Block...>> {
  template <std::size_t>
  using block = CausalTransformerLayer<Heads, 4 * Width,
                                       transformer_layer_options{.feed_forward_activation = activation::gelu,
                                                                 .norm_first = true}>;
  using type = Sequential<Policy, Input<Context>, Embedding<data::byte_vocabulary::size, Width>,
                          LearnedPositionalEmbedding<Context>, block<Block>..., LayerNorm<Width>,
                          TimeDistributed<Dense<data::byte_vocabulary::size>>>;
};
}  // namespace detail

// TinyGPT with gpt_options{Layers, Width, Heads, Context} in static mode: ids [N, Context] -> logits [N, Context, 256],
// trained with one label per position (the next token).
template <index_t Layers, index_t Width, index_t Heads, index_t Context, class Policy = policy::cpu>
using StaticTinyGPT =
    typename detail::static_gpt<Policy, Width, Heads, Context, std::make_index_sequence<std::size_t(Layers)>>::type;

}  // namespace kiln::examples
