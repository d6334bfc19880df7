// examples/vit_mnist's model: a Vision Transformer (Dosovitskiy et al.) for 28 x 28 images, in dynamic mode
// (VisionTransformer, any width, heads and depth) and in static mode (StaticViT<Layers, Width, Heads>). From one seed
// both have the same weights and train to the same losses.
//
//   [N, 28, 28] -> patches [N, 16, 49] -> Linear(49, width) -> [class; tokens] [N, 17, width] + positions
//               -> TransformerEncoderLayer x layers (pre-norm, GELU, feed-forward 2 width) -> LayerNorm -> token 0
//               -> Linear(width, 10)
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

namespace kiln::examples {

struct VisionTransformer : nn::Module {
  static constexpr index_t patch = 7, grid = 28 / patch, patches = grid * grid;

  VisionTransformer(index_t width, index_t heads, index_t layers) : width(width) {
    embed = register_module("embed", nn::Linear(patch * patch, width));
    Tensor<float> token(shape{1, 1, width});
    random_generator rng = next_init_generator();
    for (auto& v : token.span()) v = static_cast<float>(0.02 * static_cast<double>(rng.normal<float>()));
    class_token = register_parameter("class_token", token);
    positions = register_module("positions", nn::LearnedPositionalEmbedding(patches + 1, width, {.batch_first = true}));
    encoder = register_module(
        "encoder", nn::TransformerEncoder(
                       [&] {
                         return nn::TransformerEncoderLayer(width, heads,
                                                            {.dim_feedforward = 2 * width,
                                                             .dropout = 0.0,
                                                             .activation = nn::transformer_activation::gelu,
                                                             .batch_first = true,
                                                             .norm_first = true});
                       },
                       layers, std::make_shared<nn::LayerNorm>(width)));
    head = register_module("head", nn::Linear(width, 10));
  }

  // x: [N, 28, 28] or [N, 1, 28, 28] or [N, 784].
  nn::Variable forward(const nn::Variable& x) override {
    const index_t n = x.shape()[0];
    // [N, row block, row, column block, column] -> [N, row block, column block, row, column] -> [N, 16, 49]
    const nn::Variable cut = nn::permute(nn::view(x, {n, grid, patch, grid, patch}), {0, 1, 3, 2, 4});
    const nn::Variable tokens = (*embed)(nn::reshape(cut, {n, patches, patch * patch}));
    const nn::Variable sequence = nn::cat({nn::expand(class_token, {n, 1, width}), tokens}, 1);
    const nn::Variable encoded = (*encoder)((*positions)(sequence));
    return (*head)(nn::squeeze(nn::narrow(encoded, 1, 0, 1), 1));
  }
  std::string name() const override { return "VisionTransformer"; }

  index_t width;
  nn::Variable class_token;
  std::shared_ptr<nn::Linear> embed, head;
  std::shared_ptr<nn::LearnedPositionalEmbedding> positions;
  std::shared_ptr<nn::TransformerEncoder> encoder;
};

namespace detail {
template <class Policy, index_t Width, index_t Heads, class Blocks>
struct static_vit;
template <class Policy, index_t Width, index_t Heads, std::size_t... Block>
struct static_vit<Policy, Width, Heads, std::index_sequence<Block...>> {
  template <std::size_t>
  using block = TransformerEncoderLayer<Heads, 2 * Width,
                                        transformer_layer_options{.feed_forward_activation = activation::gelu,
                                                                  .norm_first = true}>;
  using type = Sequential<Policy, Input<28, 28>, Patches<VisionTransformer::patch>, TimeDistributed<Dense<Width>>,
                          ClassToken<>, LearnedPositionalEmbedding<VisionTransformer::patches + 1>, block<Block>...,
                          LayerNorm<Width>, SelectToken<0>, Dense<10>>;
};
}  // namespace detail

template <index_t Layers, index_t Width, index_t Heads, class Policy = policy::cpu>
using StaticViT = typename detail::static_vit<Policy, Width, Heads, std::make_index_sequence<std::size_t(Layers)>>::type;

}  // namespace kiln::examples
