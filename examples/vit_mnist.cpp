// A Vision Transformer (Dosovitskiy et al.) on MNIST in dynamic mode, trained with Model::fit: each image cut into 16
// patches of 7 x 7 pixels, each patch a token of width 64 (one Linear), a learned class token in front, learned
// positions, 4 pre-norm TransformerEncoderLayers (GELU), a LayerNorm, and a Linear that reads the class token.
//
//   [N, 28, 28] -> patches [N, 16, 49] -> Linear(49, 64) -> [class; tokens] [N, 17, 64] + positions
//               -> TransformerEncoderLayer x 4 -> LayerNorm -> token 0 -> Linear(64, 10)
//
//   vit_mnist [--epochs 8] [--layers 4] [--width 64] [--heads 4] [--limit N] [--data DIR] [--threads 1] [--seed 42]
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "common.hpp"
#include "kiln/data/find_data.hpp"
#include "kiln/data/mnist.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;

namespace {

struct VisionTransformer : nn::Module {
  static constexpr index_t patch = 7, grid = 28 / patch, patches = grid * grid;

  VisionTransformer(index_t width, index_t heads, index_t layers) : width(width) {
    embed = register_module("embed", nn::Linear(patch * patch, width));
    Tensor<float> token(shape{1, 1, width});
    random_generator rng = next_init_generator();
    for (auto& v : token.span()) v = 0.02f * rng.normal<float>();
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

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--epochs", "--layers", "--width", "--heads", "--limit", "--data", "--seed"});
  const int epochs = static_cast<int>(flags.get_int("--epochs", 8));
  const index_t layers = flags.get_int("--layers", 4), width = flags.get_int("--width", 64);
  const index_t heads = flags.get_int("--heads", 4), limit = flags.get_int("--limit", 0);
  const auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  set_num_threads(threads);
  const auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
  const auto train =
      data::load_mnist(dir, data::split::train, {.mean = data::mnist_mean, .std = data::mnist_std, .limit = limit});
  const auto test = data::load_mnist(dir, data::split::test, {.mean = data::mnist_mean, .std = data::mnist_std});

  manual_seed(seed);
  VisionTransformer vit(width, heads, layers);
  std::printf("ViT on MNIST: 16 patches of 7x7 and a class token, width %lld, %lld heads, %lld layers, %lld "
              "parameters; %lld training images, %d epochs, %d thread%s\n",
              static_cast<long long>(width), static_cast<long long>(heads), static_cast<long long>(layers),
              static_cast<long long>(vit.parameter_count()), static_cast<long long>(train.size()), epochs, threads,
              threads == 1 ? "" : "s");
  Model model(vit);
  model.compile(optim::AdamW({.lr = 1e-3, .weight_decay = 0.01}), loss::cross_entropy{}, {metric::accuracy});
  const auto start = std::chrono::steady_clock::now();
  model.fit(train, {.epochs = epochs,
                    .batch_size = 64,
                    .callbacks = {std::make_shared<train::LearningRateScheduler>(
                        train::LearningRateScheduler::cosine(epochs))},
                    .seed = seed});
  const double train_s = examples::seconds_since(start);
  const auto result = model.evaluate(test);
  std::printf("RESULT example=vit_mnist mode=dynamic epochs=%d test_acc=%.4f train_s=%.1f step_us=%.1f\n", epochs,
              result["accuracy"], train_s, model.timing().step_microseconds());
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "vit_mnist: %s\n", e.what());
  return 1;
}
