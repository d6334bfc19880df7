// A CNN with batch normalisation on Fashion-MNIST, in either mode, with augmentation from kiln::data's transforms
// (left-right flips, and with --shift N random shifts of up to N pixels: the pixels shifted in are 0 after
// normalisation, the mean grey, so large shifts hurt more than they help), trained with kiln::Model (Adam 1e-3,
// batch 64), then a per-class report (precision, recall, F1) of the test set:
//   [Conv 32 3x3 same - BatchNorm - ReLU - MaxPool 2] - [Conv 64 3x3 same - BatchNorm - ReLU - MaxPool 2] -
//   Dropout 0.25 - Flatten - Dense 128 ReLU - Dropout 0.25 - Dense 10
//
//   fashion_cnn [--mode static|dynamic] [--epochs 5] [--shift 0] [--data DIR] [--threads N] [--seed 42] [--onnx FILE]
//               [--precision single|bf16x3|bf16]
#include <cstdio>

#include "cnn_common.hpp"
#include "onnx_flag.hpp"
#include "kiln/data/transforms.hpp"

using namespace kiln;

// Fashion-MNIST's ten classes, in label order.
const std::vector<std::string> fashion_classes{"T-shirt/top", "Trouser", "Pullover", "Dress",   "Coat",
                                               "Sandal",      "Shirt",   "Sneaker",  "Bag",     "Ankle boot"};

constexpr conv_options same_no_bias{.same = true, .bias = false};  // the BatchNorm after it supplies the shift
using static_cnn = Sequential<policy::cpu, Input<1, 28, 28>, Conv2D<32, 3, same_no_bias>, BatchNorm2d<>, ReLU,
                              MaxPool2D<2>, Conv2D<64, 3, same_no_bias>, BatchNorm2d<>, ReLU, MaxPool2D<2>,
                              Dropout<0.25>, Flatten, Dense<128, ReLU>, Dropout<0.25>, Dense<10>>;

nn::Sequential dynamic_cnn(std::uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential(nn::Conv2d(1, 32, 3, 1, "same", 1, 1, false), nn::BatchNorm2d(32), nn::ReLU(),
                        nn::MaxPool2d(2), nn::Conv2d(32, 64, 3, 1, "same", 1, 1, false), nn::BatchNorm2d(64),
                        nn::ReLU(), nn::MaxPool2d(2), nn::Dropout(0.25), nn::Flatten(), nn::Linear(3136, 128),
                        nn::ReLU(), nn::Dropout(0.25), nn::Linear(128, 10));
}

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--mode", "--onnx", "--seed", "--shift"});
  std::string mode = flags.get("--mode", "static");
  int epochs = static_cast<int>(flags.get_int("--epochs", 5));
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  if (mode != "static" && mode != "dynamic") fail("fashion_cnn: expected --mode static|dynamic, found ", mode);
  set_num_threads(threads);
  auto fashion = examples::load_mnist_data(flags.get("--data", ""), "fashion-mnist");
  examples::add_channel_dim(fashion);
  std::printf("Fashion-MNIST from %s: %lld training and %lld test images; %s mode, %d thread%s, %s\n",
              fashion.dir.c_str(), static_cast<long long>(fashion.train.size()),
              static_cast<long long>(fashion.test.size()), mode.c_str(), threads, threads == 1 ? "" : "s",
              examples::products_description().c_str());
  const index_t shift = flags.get_int("--shift", 0);
  data::transform_fn<float> augment = data::random_hflip{.p = 0.5f};
  if (shift > 0) augment = data::compose{data::random_shift{.pad = shift}, data::random_hflip{.p = 0.5f}};
  examples::cnn_outcome result;
  if (mode == "static") {
    static_cnn net(64, seed);
    result = examples::fit_cnn(net, fashion, epochs, seed, augment, 1e-3, fashion_classes);
    examples::export_onnx_if_asked(flags, net, {});
  } else {
    auto model = dynamic_cnn(seed);
    result = examples::fit_cnn(model, fashion, epochs, seed, augment, 1e-3, fashion_classes);
    examples::export_onnx_if_asked(flags, model, {1, 28, 28});
  }
  examples::print_result("fashion_cnn", mode, epochs, result);
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "fashion_cnn: %s\n", e.what());
  return 1;
}
