// The MNIST MLP (Flatten -> Dense 128 ReLU -> Dense 10, batch 64) trained from the same initial weights with each of
// kiln's optimizers through Model::fit, in static or dynamic mode: test accuracy and time per step side by side. The
// learning rates are the usual starting points for each method on this model, not tuned per optimizer.
//
//   optimizers [--mode static|dynamic] [--epochs 1] [--data DIR] [--threads N] [--seed 42]
#include <chrono>
#include <cstdio>
#include <string>

#include "common.hpp"
#include "kiln/train.hpp"
#include "mnist_common.hpp"

using namespace kiln;

namespace {

struct outcome {
  double test_acc = 0, test_loss = 0, train_s = 0, step_us = 0;
};

// A fresh model of the chosen mode from the same seed, trained with `optimizer`.
template <class Optimizer>
outcome train_with(Optimizer optimizer, const std::string& mode, const examples::mnist_data& mnist, int epochs,
                   std::uint64_t seed) {
  auto run = [&](auto& net) {
    Model model(net);
    model.compile(std::move(optimizer), loss::cross_entropy{}, {metric::accuracy});
    auto start = std::chrono::steady_clock::now();
    model.fit(mnist.train, {.epochs = epochs, .batch_size = 64, .verbose = 0, .seed = seed});
    double train_s = examples::seconds_since(start);
    auto test = model.evaluate(mnist.test);
    return outcome{test["accuracy"], test.loss, train_s, model.timing().step_microseconds()};
  };
  if (mode == "static") {
    examples::mnist_static_mlp net(64, seed);
    return run(net);
  }
  auto net = examples::mnist_dynamic_mlp(seed);
  return run(net);
}

void report(const char* name, const std::string& mode, int epochs, const outcome& r) {
  std::printf("%-36s test accuracy %.4f, test loss %.4f, %7.1f us per step\n", name, r.test_acc, r.test_loss,
              r.step_us);
  std::printf("RESULT example=optimizers optimizer=\"%s\" mode=%s epochs=%d test_acc=%.4f test_loss=%.4f "
              "train_s=%.3f step_us=%.2f\n",
              name, mode.c_str(), epochs, r.test_acc, r.test_loss, r.train_s, r.step_us);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--mode", "--seed"});
  const std::string mode = flags.get("--mode", "static");
  const int epochs = static_cast<int>(flags.get_int("--epochs", 1));
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  const auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  if (mode != "static" && mode != "dynamic") fail("optimizers: expected --mode static|dynamic, found ", mode);
  set_num_threads(threads);
  auto mnist = examples::load_mnist_data(flags.get("--data", ""));
  std::printf("MNIST from %s; %s mode, %d epoch%s, %d thread%s, every run from seed %llu\n", mnist.dir.c_str(),
              mode.c_str(), epochs, epochs == 1 ? "" : "s", threads, threads == 1 ? "" : "s",
              static_cast<unsigned long long>(seed));

  report("SGD lr 0.01", mode, epochs, train_with(optim::SGD({.lr = 0.01}), mode, mnist, epochs, seed));
  report("SGD lr 0.05, momentum 0.9, Nesterov", mode, epochs,
         train_with(optim::SGD({.lr = 0.05, .momentum = 0.9, .nesterov = true}), mode, mnist, epochs, seed));
  report("Adam lr 1e-3", mode, epochs, train_with(optim::Adam({.lr = 1e-3}), mode, mnist, epochs, seed));
  report("AdamW lr 1e-3, weight decay 0.01", mode, epochs,
         train_with(optim::AdamW({.lr = 1e-3, .weight_decay = 0.01}), mode, mnist, epochs, seed));
  report("RMSprop lr 1e-3", mode, epochs, train_with(optim::RMSprop({.lr = 1e-3}), mode, mnist, epochs, seed));
  report("RMSprop lr 1e-3, centered", mode, epochs,
         train_with(optim::RMSprop({.lr = 1e-3, .centered = true}), mode, mnist, epochs, seed));
  report("Adagrad lr 0.01", mode, epochs, train_with(optim::Adagrad({.lr = 0.01}), mode, mnist, epochs, seed));
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "optimizers: %s\n", e.what());
  return 1;
}
