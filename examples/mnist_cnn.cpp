// A small CNN on MNIST, in either mode, trained with kiln::Model (Adam 1e-3 with the rate annealed over the epochs on
// a cosine, batch 64):
//   Conv 32 3x3 - ReLU - Conv 64 3x3 - ReLU - MaxPool 2 - Dropout 0.5 - Flatten - Dense 128 ReLU - Dense 10
// (examples/mnist_cnn_net.hpp). With a constant rate (--schedule constant) three epochs end just under 0.99 test
// accuracy, and where they land depends on the rounding of the kernels; the annealed rate settles the weights in the
// last epoch (bench/RESULTS.md has the figures for several seeds).
//
//   mnist_cnn [--mode static|dynamic] [--epochs 3] [--schedule cosine|constant] [--data DIR] [--threads N] [--seed 42]
//             [--onnx FILE]
#include <cstdio>

#include "cnn_common.hpp"
#include "mnist_cnn_net.hpp"
#include "onnx_flag.hpp"

using namespace kiln;

using static_cnn = examples::static_mnist_cnn;
using examples::dynamic_mnist_cnn;

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--mode", "--onnx", "--schedule", "--seed"});
  std::string mode = flags.get("--mode", "static");
  int epochs = static_cast<int>(flags.get_int("--epochs", 3));
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  if (mode != "static" && mode != "dynamic") fail("mnist_cnn: expected --mode static|dynamic, found ", mode);
  const std::string schedule = flags.get("--schedule", "cosine");
  if (schedule != "constant" && schedule != "cosine")
    fail("mnist_cnn: expected --schedule cosine|constant, found ", schedule);
  std::vector<std::shared_ptr<train::callback>> callbacks;
  if (schedule == "cosine")
    callbacks.push_back(std::make_shared<train::LearningRateScheduler>(train::LearningRateScheduler::cosine(epochs)));
  set_num_threads(threads);
  auto mnist = examples::load_mnist_data(flags.get("--data", ""));
  examples::add_channel_dim(mnist);
  std::printf("MNIST from %s: %lld training and %lld test images; %s mode, %d thread%s\n", mnist.dir.c_str(),
              static_cast<long long>(mnist.train.size()), static_cast<long long>(mnist.test.size()), mode.c_str(),
              threads, threads == 1 ? "" : "s");
  examples::cnn_outcome result;
  if (mode == "static") {
    static_cnn net(64, seed);
    result = examples::fit_cnn(net, mnist, epochs, seed, {}, 1e-3, {}, callbacks);
    examples::export_onnx_if_asked(flags, net, {});
  } else {
    auto model = dynamic_mnist_cnn(seed);
    result = examples::fit_cnn(model, mnist, epochs, seed, {}, 1e-3, {}, callbacks);
    examples::export_onnx_if_asked(flags, model, {1, 28, 28});
  }
  examples::print_result("mnist_cnn", mode, epochs, result);
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "mnist_cnn: %s\n", e.what());
  return 1;
}
