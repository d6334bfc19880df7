// MNIST digits read row by row: each image is a sequence of 28 steps of 28 pixels, classified by a bidirectional
// LSTM(128) whose final state (forward direction after row 27, reverse direction after row 0) feeds a Dense(10).
// The same model in either mode, trained with Model::fit (Adam 1e-3, batch 64):
//   static:  Sequential<cpu, Input<28, 28>, FinalState<LSTM<128, 1, true>>, Dense<10>>
//   dynamic: nn::Sequential(nn::FinalState(nn::LSTM(28, 128, {.batch_first = true, .bidirectional = true})),
//                           nn::Linear(256, 10))
//
//   sequence_classify [--mode static|dynamic] [--epochs 2] [--limit N] [--data DIR] [--threads N]
//                     [--seed 42] [--onnx FILE]
#include <chrono>
#include <cstdio>
#include <string>

#include "common.hpp"
#include "onnx_flag.hpp"
#include "kiln/data/find_data.hpp"
#include "kiln/data/mnist.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;

namespace {

struct outcome {
  double test_acc = 0, train_s = 0, step_us = 0;
};

template <class Net>
outcome fit(Net& net, const data::tensor_dataset<float, std::int64_t>& train,
            const data::tensor_dataset<float, std::int64_t>& test, int epochs, std::uint64_t seed) {
  Model model(net);
  model.compile(optim::Adam({.lr = 1e-3}), loss::cross_entropy{}, {metric::accuracy});
  auto start = std::chrono::steady_clock::now();
  model.fit(train, {.epochs = epochs, .batch_size = 64, .seed = seed});
  double train_s = examples::seconds_since(start);
  auto result = model.evaluate(test);
  std::printf("test loss %.4f, test accuracy %.4f\n", result.loss, result["accuracy"]);
  return {result["accuracy"], train_s, model.timing().step_microseconds()};
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--limit", "--mode", "--onnx", "--seed"});
  std::string mode = flags.get("--mode", "static");
  int epochs = static_cast<int>(flags.get_int("--epochs", 2));
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  index_t limit = flags.get_int("--limit", 0);
  auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  set_num_threads(threads);
  if (mode != "static" && mode != "dynamic") {
    std::fprintf(stderr, "sequence_classify: --mode must be static or dynamic, found '%s'\n", mode.c_str());
    return 2;
  }
  auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
  data::mnist_options options{.mean = data::mnist_mean, .std = data::mnist_std, .limit = limit};
  auto train = data::load_mnist(dir, data::split::train, options);
  auto test = data::load_mnist(dir, data::split::test, {.mean = data::mnist_mean, .std = data::mnist_std});
  std::printf("MNIST as sequences: %lld training and %lld test images, 28 steps of 28 pixels; bidirectional "
              "LSTM(128) -> final state -> Dense(10); %s mode, %d epochs, %d thread%s\n",
              static_cast<long long>(train.size()), static_cast<long long>(test.size()), mode.c_str(), epochs, threads,
              threads == 1 ? "" : "s");

  outcome r;
  if (mode == "static") {
    using Net = Sequential<policy::cpu, Input<28, 28>, FinalState<LSTM<128, 1, true>>, Dense<10>>;
    Net net(64, seed);
    r = fit(net, train, test, epochs, seed);
    examples::export_onnx_if_asked(flags, net, {});
  } else {
    manual_seed(seed);
    auto model = nn::Sequential(nn::FinalState(nn::LSTM(28, 128, {.batch_first = true, .bidirectional = true})),
                                nn::Linear(256, 10));
    r = fit(model, train, test, epochs, seed);
    examples::export_onnx_if_asked(flags, model, {28, 28});
  }
  std::printf("RESULT example=sequence_classify mode=%s epochs=%d test_acc=%.4f train_s=%.2f step_us=%.1f\n",
              mode.c_str(), epochs, r.test_acc, r.train_s, r.step_us);
  return r.test_acc >= 0.97 || limit > 0 ? 0 : 1;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "sequence_classify: %s\n", e.what());
  return 1;
}
