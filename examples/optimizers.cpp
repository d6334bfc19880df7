// The MNIST MLP (Flatten -> Dense 128 ReLU -> Dense 10, batch 64) trained from the same initial weights with each of
// kiln's optimizers through Model::fit, in static or dynamic mode: test accuracy and time per step side by side. The
// learning rates are the usual starting points for each method on this model, not tuned per optimizer.
//
//   optimizers [--mode static|dynamic] [--epochs 1] [--init pytorch|glorot_uniform|he_normal] [--data DIR]
//              [--threads N] [--seed 42]
//
// --init chooses the initial weights: PyTorch's Linear default (kaiming_uniform with a = sqrt(5)), or Keras' Dense
// default (glorot_uniform weights, zero biases), or he_normal with zero biases; both modes get the same values.
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

// A fresh model of the chosen mode from the same seed and initialisation, trained with `optimizer`.
template <class Optimizer>
outcome train_with(Optimizer optimizer, const std::string& mode, const std::string& init,
                   const examples::mnist_data& mnist, int epochs, std::uint64_t seed) {
  auto run = [&](auto& net) {
    Model model(net);
    model.compile(std::move(optimizer), loss::cross_entropy{}, {metric::accuracy});
    auto start = std::chrono::steady_clock::now();
    model.fit(mnist.train, {.epochs = epochs, .batch_size = 64, .verbose = 0, .seed = seed});
    double train_s = examples::seconds_since(start);
    auto test = model.evaluate(mnist.test);
    return outcome{test["accuracy"], test.loss, train_s, model.timing().step_microseconds()};
  };
  // Unless init is "pytorch" (the layers' own initialisation), each weight from the named initialiser and each bias
  // zero, drawn in parameter order from one generator: both modes get the same values.
  random_generator rng(seed, 1);
  if (mode == "static") {
    examples::mnist_static_mlp net(64, seed);
    for (const auto& [name, value] : net.state_dict()) {
      if (init == "pytorch") break;
      auto w = net.parameter(name);
      if (name.ends_with(".bias")) init::zeros(w);
      else if (init == "glorot_uniform") init::glorot_uniform(w, rng);
      else init::he_normal(w, rng);
    }
    return run(net);
  }
  auto net = examples::mnist_dynamic_mlp(seed);
  for (const auto& [name, w] : net.named_parameters()) {
    if (init == "pytorch") break;
    if (name.ends_with(".bias")) nn::init::zeros(w);
    else if (init == "glorot_uniform") nn::init::glorot_uniform(w, &rng);
    else nn::init::he_normal(w, &rng);
  }
  return run(net);
}

void report(const char* name, const std::string& mode, const std::string& init, int epochs, const outcome& r) {
  std::printf("%-36s test accuracy %.4f, test loss %.4f, %7.1f us per step\n", name, r.test_acc, r.test_loss,
              r.step_us);
  std::printf("RESULT example=optimizers optimizer=\"%s\" mode=%s init=%s epochs=%d test_acc=%.4f test_loss=%.4f "
              "train_s=%.3f step_us=%.2f\n",
              name, mode.c_str(), init.c_str(), epochs, r.test_acc, r.test_loss, r.train_s, r.step_us);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--init", "--mode", "--seed"});
  const std::string mode = flags.get("--mode", "static");
  const int epochs = static_cast<int>(flags.get_int("--epochs", 1));
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  const auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  if (mode != "static" && mode != "dynamic") fail("expected --mode static|dynamic, found ", mode);
  const std::string init = flags.get("--init", "pytorch");
  if (init != "pytorch" && init != "glorot_uniform" && init != "he_normal")
    fail("expected --init pytorch|glorot_uniform|he_normal, found ", init);
  set_num_threads(threads);
  auto mnist = examples::load_mnist_data(flags.get("--data", ""));
  std::printf("MNIST from %s; %s mode, %d epoch%s, %d thread%s, every run from seed %llu, %s initialisation\n",
              mnist.dir.c_str(), mode.c_str(), epochs, epochs == 1 ? "" : "s", threads, threads == 1 ? "" : "s",
              static_cast<unsigned long long>(seed), init.c_str());

  auto compare = [&](const char* name, auto optimizer) {
    report(name, mode, init, epochs, train_with(std::move(optimizer), mode, init, mnist, epochs, seed));
  };
  compare("SGD lr 0.01", optim::SGD({.lr = 0.01}));
  compare("SGD lr 0.05, momentum 0.9, Nesterov", optim::SGD({.lr = 0.05, .momentum = 0.9, .nesterov = true}));
  compare("Adam lr 1e-3", optim::Adam({.lr = 1e-3}));
  compare("AdamW lr 1e-3, weight decay 0.01", optim::AdamW({.lr = 1e-3, .weight_decay = 0.01}));
  compare("RMSprop lr 1e-3", optim::RMSprop({.lr = 1e-3}));
  compare("RMSprop lr 1e-3, centered", optim::RMSprop({.lr = 1e-3, .centered = true}));
  compare("Adagrad lr 0.01", optim::Adagrad({.lr = 0.01}));
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "optimizers: %s\n", e.what());
  return 1;
}
