// A small ResNet on Fashion-MNIST (examples/resnet_net.hpp: a stem, three stages of two basic blocks of 16, 32 and
// 64 channels with BatchNorm and strided shortcuts, global average pooling, Dense 10), trained in static and then in
// dynamic mode from the same seed on the same batches, through the same Model::fit, so that the two modes' losses
// agree bit for bit.
//
// Training: SGD with Nesterov momentum 0.9 and weight decay 5e-4, batch 128, learning rate 0.1 annealed to 0 along a
// cosine, set at the start of every epoch; augmentation from kiln::data's transforms: a random crop of the image
// padded by 2 pixels (random_shift) and a left-right flip, both on the pixels in [0, 1] so that the pixels shifted in
// are black, the background of Fashion-MNIST, and then the normalisation (the order of torchvision's RandomCrop,
// RandomHorizontalFlip, Normalize). The test set is evaluated after every epoch.
//
//   resnet_fashion [--mode both|static|dynamic] [--epochs 15] [--limit N] [--data DIR] [--threads N] [--seed 42]
//                  [--precision single|bf16x3|bf16]
// --limit N trains on the first N training images only (quick runs); the test set stays whole.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cnn_common.hpp"
#include "resnet_net.hpp"
#include "kiln/data/transforms.hpp"

using namespace kiln;

namespace {

// Fashion-MNIST's ten classes, in label order.
const std::vector<std::string> fashion_classes{"T-shirt/top", "Trouser", "Pullover", "Dress",   "Coat",
                                               "Sandal",      "Shirt",   "Sneaker",  "Bag",     "Ankle boot"};

constexpr index_t batch_size = 128;
constexpr double initial_lr = 0.1;

using static_resnet = examples::static_resnet<>;
using examples::dynamic_resnet;

struct mode_result {
  examples::cnn_outcome outcome;
  std::vector<double> losses;  // the mean training loss of every epoch
};

template <class Net>
mode_result train_mode(const char* mode, Net& net, const examples::mnist_data& fashion, int epochs,
                       std::uint64_t seed) {
  std::printf("\n== %s mode ==\n", mode);
  Model model(net);
  model.compile(optim::SGD({.lr = initial_lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true}),
                loss::cross_entropy{}, {metric::accuracy});
  if (std::string(mode) == "static") model.summary();
  // Crop and flip on pixels in [0, 1] (the training set is loaded unnormalised), then Fashion-MNIST's normalisation,
  // the same arithmetic as load_mnist's for the test set.
  data::transform_fn<float> augment =
      data::compose{data::random_shift{.pad = 2}, data::random_hflip{.p = 0.5f},
                    data::normalize{.mean = data::fashion_mnist_mean, .std = data::fashion_mnist_std}};
  std::vector<std::shared_ptr<train::callback>> schedule{
      std::make_shared<train::LearningRateScheduler>(train::LearningRateScheduler::cosine(epochs))};
  auto start = std::chrono::steady_clock::now();
  auto history = model.fit(fashion.train, {.epochs = epochs,
                                           .batch_size = batch_size,
                                           .validation_data = fashion.test,
                                           .callbacks = std::move(schedule),
                                           .seed = seed,
                                           .transform = std::move(augment)});
  mode_result r;
  r.outcome.train_s = examples::seconds_since(start);
  auto test = model.evaluate(fashion.test);
  r.outcome.test_acc = test["accuracy"];
  r.outcome.step_us = model.timing().step_microseconds();
  r.losses = history.series("loss");
  std::printf("test loss %.4f, test accuracy %.4f; %.1f s per epoch (validation included), %.0f us per step\n",
              test.loss, r.outcome.test_acc, r.outcome.train_s / epochs, r.outcome.step_us);
  std::printf("%s", model.confusion_matrix(fashion.test).report(fashion_classes).c_str());
  examples::print_result("resnet_fashion", mode, epochs, r.outcome);
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--limit", "--mode", "--seed"});
  const std::string mode = flags.get("--mode", "both");
  const int epochs = static_cast<int>(flags.get_int("--epochs", 15));
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  const index_t limit = flags.get_int("--limit", 0);
  const auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  if (mode != "both" && mode != "static" && mode != "dynamic")
    fail("resnet_fashion: expected --mode both|static|dynamic, found ", mode);
  if (epochs < 1) fail("resnet_fashion: expected --epochs >= 1, found ", epochs);
  if (limit < 0) fail("resnet_fashion: expected --limit >= 0 (0: all), found ", limit);
  set_num_threads(threads);

  // The training images unnormalised (the augmentation normalises them), the test images normalised.
  const auto dir = data::find_data_dir("fashion-mnist", flags.get("--data", ""));
  examples::mnist_data fashion{
      data::load_mnist(dir, data::split::train, {.scale = true, .limit = limit}),
      data::load_mnist(dir, data::split::test,
                       {.scale = true, .mean = data::fashion_mnist_mean, .std = data::fashion_mnist_std}),
      dir.string()};
  examples::add_channel_dim(fashion);
  std::printf("resnet_fashion: ResNet (16-32-64 channels, 2 blocks a stage), SGD Nesterov 0.9, weight decay 5e-4, "
              "lr %.2g cosine per epoch, batch %lld, %d epoch%s, crop (pad 2) + flip\nFashion-MNIST from %s: %lld "
              "training and %lld test images; %s mode%s, %d thread%s, %s\n",
              initial_lr, static_cast<long long>(batch_size), epochs, epochs == 1 ? "" : "s", fashion.dir.c_str(),
              static_cast<long long>(fashion.train.size()), static_cast<long long>(fashion.test.size()),
              mode.c_str(), mode == "both" ? "s" : "", threads, threads == 1 ? "" : "s",
              examples::products_description().c_str());

  std::vector<mode_result> results;
  if (mode != "dynamic") {
    static_resnet net(batch_size, seed);
    results.push_back(train_mode("static", net, fashion, epochs, seed));
  }
  if (mode != "static") {
    auto model = dynamic_resnet(seed);
    results.push_back(train_mode("dynamic", model, fashion, epochs, seed));
  }
  if (mode != "both") {  // the losses in full, to compare with a run of the other mode
    for (std::size_t e = 0; e < results[0].losses.size(); ++e)
      std::printf("  epoch %zu: %s loss %.9g\n", e + 1, mode.c_str(), results[0].losses[e]);
    return 0;
  }
  const bool same = results[0].losses == results[1].losses;
  std::printf("\ntraining losses of the two modes: %s\n", same ? "bit-identical in every epoch" : "DIFFERENT");
  for (std::size_t e = 0; e < results[0].losses.size(); ++e)
    std::printf("  epoch %zu: static %.9g, dynamic %.9g\n", e + 1, results[0].losses[e], results[1].losses[e]);
  std::printf("RESULT example=resnet_fashion mode=both epochs=%d static_test_acc=%.4f dynamic_test_acc=%.4f "
              "dynamic_over_static=%.3f losses_identical=%d\n",
              epochs, results[0].outcome.test_acc, results[1].outcome.test_acc,
              results[1].outcome.step_us / results[0].outcome.step_us, same ? 1 : 0);
  return same ? 0 : 1;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "resnet_fashion: %s\n", e.what());
  return 1;
}
