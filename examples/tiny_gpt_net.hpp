// examples/tiny_gpt's model, shared with bench/ladder's transformer workload: a decoder-only transformer over byte
// tokens. ids [N, L] (whole numbers) -> Embedding(256, width) + a learned position table -> layers x
// CausalTransformerLayer(width, heads, feed-forward 4 width, GELU, batch_first, norm_first) -> LayerNorm ->
// Linear(width, 256): next-token logits [N, L, 256].
#pragma once

#include <memory>
#include <string>

#include "kiln/data/text.hpp"
#include "kiln/dynamic/nn.hpp"

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

}  // namespace kiln::examples
