// A Vision Transformer (Dosovitskiy et al.) on MNIST, trained with Model::fit (AdamW, a cosine schedule): each image
// cut into 16 patches of 7 x 7 pixels, each patch a token of width 64 (one Linear), a learned class token in front,
// learned positions, 4 pre-norm TransformerEncoderLayers (GELU), a LayerNorm, and a Linear that reads the class token
// (the model in examples/vit_net.hpp).
//
//   [N, 28, 28] -> patches [N, 16, 49] -> Linear(49, 64) -> [class; tokens] [N, 17, 64] + positions
//               -> TransformerEncoderLayer x 4 -> LayerNorm -> token 0 -> Linear(64, 10)
//
// --mode static trains examples::StaticViT (the default sizes); --mode both trains each mode from the seed, dynamic
// first: the same weights, the same losses.
//
//   vit_mnist [--mode dynamic|static|both] [--epochs 8] [--layers 4] [--width 64] [--heads 4] [--limit N]
//             [--data DIR] [--threads 1] [--seed 42]
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "common.hpp"
#include "vit_net.hpp"
#include "kiln/data/find_data.hpp"
#include "kiln/data/mnist.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;

namespace {

constexpr index_t static_layers = 4, static_width = 64, static_heads = 4;

// Trains `net` (either mode) and prints the RESULT line.
template <class Net, class Data>
void train_and_report(Net& net, const char* mode, int epochs, std::uint64_t seed, const Data& train, const Data& test) {
  Model model(net);
  model.compile(optim::AdamW({.lr = 1e-3, .weight_decay = 0.01}), loss::cross_entropy{}, {metric::accuracy});
  const auto start = std::chrono::steady_clock::now();
  model.fit(train, {.epochs = epochs,
                    .batch_size = 64,
                    .callbacks = {std::make_shared<train::LearningRateScheduler>(
                        train::LearningRateScheduler::cosine(epochs))},
                    .seed = seed});
  const double train_s = examples::seconds_since(start);
  const auto result = model.evaluate(test);
  std::printf("RESULT example=vit_mnist mode=%s epochs=%d test_acc=%.4f test_loss=%.4f train_s=%.1f step_us=%.1f\n",
              mode, epochs, result["accuracy"], result["loss"], train_s, model.timing().step_microseconds());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv,
                        {"--epochs", "--layers", "--width", "--heads", "--limit", "--data", "--seed", "--mode"});
  const int epochs = static_cast<int>(flags.get_int("--epochs", 8));
  const index_t layers = flags.get_int("--layers", 4), width = flags.get_int("--width", 64);
  const index_t heads = flags.get_int("--heads", 4), limit = flags.get_int("--limit", 0);
  const auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  const std::string mode = flags.get("--mode", "dynamic");
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  set_num_threads(threads);
  if (mode != "dynamic" && mode != "static" && mode != "both")
    fail("vit_mnist: --mode is dynamic, static or both, found '", mode, "'");
  if (mode != "dynamic" && (layers != static_layers || width != static_width || heads != static_heads))
    fail("vit_mnist: static mode is compiled for ", static_layers, " layers of width ", static_width, " and ",
         static_heads, " heads (examples/vit_mnist.cpp); other sizes run with --mode dynamic");
  const auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
  const auto train =
      data::load_mnist(dir, data::split::train, {.mean = data::mnist_mean, .std = data::mnist_std, .limit = limit});
  const auto test = data::load_mnist(dir, data::split::test, {.mean = data::mnist_mean, .std = data::mnist_std});

  std::printf("ViT on MNIST: 16 patches of 7x7 and a class token, width %lld, %lld heads, %lld layers; %lld "
              "training images, %d epochs, %d thread%s\n",
              static_cast<long long>(width), static_cast<long long>(heads), static_cast<long long>(layers),
              static_cast<long long>(train.size()), epochs, threads, threads == 1 ? "" : "s");
  if (mode != "static") {
    manual_seed(seed);
    examples::VisionTransformer vit(width, heads, layers);
    std::printf("dynamic mode: %lld parameters\n", static_cast<long long>(vit.parameter_count()));
    train_and_report(vit, "dynamic", epochs, seed, train, test);
  }
  if (mode != "dynamic") {
    using Net = examples::StaticViT<static_layers, static_width, static_heads>;
    auto net = std::make_unique<Net>(64, seed);
    std::printf("static mode: %lld parameters\n", static_cast<long long>(Net::parameter_count()));
    train_and_report(*net, "static", epochs, seed, train, test);
  }
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "vit_mnist: %s\n", e.what());
  return 1;
}
