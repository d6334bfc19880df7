// The MNIST MLP (Flatten -> Dense 128 ReLU -> Dense 10, Adam 1e-3, batch 64), in either mode and either style:
//   --style fit   Keras: Model::compile / fit / evaluate with a progress bar
//   --style loop  PyTorch: a DataLoader loop that prints the running loss every 200 batches, as PyTorch's tutorial
//   --style fused the same loop through kiln::fused_mlp_trainer (static mode): the whole step in one parallel region,
//                 the same losses as --style loop
//
//   mnist_mlp [--mode static|dynamic] [--style fit|loop|fused] [--epochs 5] [--schedule cosine|constant] [--data DIR]
//             [--threads N] [--seed 42]
// The learning rate is annealed along a cosine by default (see mnist_schedule.hpp); --schedule constant keeps 1e-3.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "common.hpp"
#include "kiln/train.hpp"
#include "mnist_common.hpp"
#include "mnist_schedule.hpp"

using namespace kiln;

namespace {

struct outcome {
  double test_acc = 0, train_s = 0, step_us = 0;
};

// Keras style, for either mode: the same three calls.
template <class Net>
outcome run_fit(Net& net, const examples::mnist_data& mnist, int epochs, std::uint64_t seed,
                const std::string& schedule) {
  Model model(net);
  model.compile(optim::Adam({.lr = examples::mnist_lr}), loss::cross_entropy{}, {metric::accuracy});
  auto start = std::chrono::steady_clock::now();
  model.fit(mnist.train, {.epochs = epochs,
                          .batch_size = 64,
                          .callbacks = examples::mnist_schedule_callbacks(schedule, epochs),
                          .seed = seed});
  double train_s = examples::seconds_since(start);
  auto test = model.evaluate(mnist.test);
  std::printf("test loss %.4f, test accuracy %.4f\n", test.loss, test["accuracy"]);
  return {test["accuracy"], train_s, model.timing().step_microseconds()};
}

// Accuracy of a model's predictions over a data set.
template <class Predict>
double accuracy(const data::tensor_dataset<float, std::int64_t>& test, Predict&& predict) {
  Tensor<float> out = predict(test.features());
  index_t correct = 0;
  for (index_t i = 0; i < out.extent(0); ++i) {
    index_t best = 0;
    for (index_t c = 1; c < 10; ++c)
      if (out.at(i, c) > out.at(i, best)) best = c;
    correct += best == test.labels()[i];
  }
  return double(correct) / double(out.extent(0));
}

// PyTorch style: an explicit loop over a shuffling loader; step(x, y) trains on one batch and returns its loss, and
// the learning-rate scheduler (none for a constant rate) steps after each epoch.
template <class Step>
outcome run_loop(const examples::mnist_data& mnist, int epochs, std::uint64_t seed, optim::lr_scheduler* schedule,
                 Step&& step) {
  data::data_loader loader(mnist.train, {.batch_size = 64, .shuffle = true, .seed = seed, .prefetch = 1});
  double step_seconds = 0;
  long long steps = 0;
  auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    double running = 0;
    for (const auto& batch : loader.epoch(static_cast<std::uint64_t>(epoch))) {
      auto t0 = std::chrono::steady_clock::now();
      running += step(batch.x, batch.y);
      step_seconds += examples::seconds_since(t0);
      ++steps;
      if (batch.index % 200 == 199) {
        std::printf("[%d, %5lld] loss: %.3f\n", epoch + 1, static_cast<long long>(batch.index + 1), running / 200);
        running = 0;
      }
    }
    if (schedule) schedule->step();
  }
  return {0, examples::seconds_since(start), steps ? step_seconds * 1e6 / double(steps) : 0};
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--mode", "--schedule", "--seed", "--style"});
  std::string mode = flags.get("--mode", "static"), style = flags.get("--style", "fit");
  int epochs = static_cast<int>(flags.get_int("--epochs", 5));
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  std::string schedule = flags.get("--schedule", "cosine");
  examples::check_mnist_schedule(schedule);  // before loading anything
  if ((mode != "static" && mode != "dynamic") || (style != "fit" && style != "loop" && style != "fused") ||
      (style == "fused" && mode != "static"))
    fail("expected --mode static|dynamic and --style fit|loop, or --mode static --style fused, found ",
         "--mode ", mode, " --style ", style);
  set_num_threads(threads);
  auto mnist = examples::load_mnist_data(flags.get("--data", ""));
  std::printf("MNIST from %s: %lld training and %lld test images; %s mode, %s style, %d thread%s\n",
              mnist.dir.c_str(), static_cast<long long>(mnist.train.size()),
              static_cast<long long>(mnist.test.size()), mode.c_str(), style.c_str(), threads, threads == 1 ? "" : "s");

  outcome result;
  if (mode == "static") {
    examples::mnist_static_mlp net(64, seed);
    if (style == "fit") {
      result = run_fit(net, mnist, epochs, seed, schedule);
    } else if (style == "fused") {
      fused_mlp_trainer<examples::mnist_static_mlp> trainer(net, optim::adam_options{.lr = examples::mnist_lr});
      auto lr_schedule = examples::mnist_loop_schedule(trainer, schedule, epochs);
      result = run_loop(mnist, epochs, seed, lr_schedule.get(),
                        [&](auto x, auto y) { return trainer.train_step(x, y); });
      result.test_acc = accuracy(mnist.test, [&](const Tensor<float>& x) { return net.predict(x); });
    } else {
      optim::Adam opt({.lr = examples::mnist_lr});
      auto lr_schedule = examples::mnist_loop_schedule(opt, schedule, epochs);
      result = run_loop(mnist, epochs, seed, lr_schedule.get(),
                        [&](auto x, auto y) { return net.train_step(x, y, loss::cross_entropy{}, opt); });
      result.test_acc = accuracy(mnist.test, [&](const Tensor<float>& x) { return net.predict(x); });
    }
  } else {
    auto model = examples::mnist_dynamic_mlp(seed);
    if (style == "fit") {
      result = run_fit(model, mnist, epochs, seed, schedule);
    } else {
      optim::Adam opt(model.parameters(), {.lr = examples::mnist_lr});
      auto lr_schedule = examples::mnist_loop_schedule(opt, schedule, epochs);
      result = run_loop(mnist, epochs, seed, lr_schedule.get(), [&](auto x, auto y) {
        opt.zero_grad();
        // borrowing: the loader's batch goes in without a copy (torch.from_numpy's way).
        auto loss = nn::cross_entropy(model(nn::Variable::borrowing(x)), y.span());
        loss.backward();
        opt.step();
        return loss.item();
      });
      result.test_acc = accuracy(mnist.test, [&](const Tensor<float>& x) {
        nn::no_grad guard;
        model.eval();
        return model(nn::Variable::borrowing(x)).tensor();
      });
      if (style == "loop") std::printf("test accuracy %.4f\n", result.test_acc);
    }
  }
  if (mode == "static" && style != "fit") std::printf("test accuracy %.4f\n", result.test_acc);
  std::printf("RESULT example=mnist_mlp mode=%s style=%s epochs=%d test_acc=%.4f train_s=%.3f step_us=%.2f\n",
              mode.c_str(), style.c_str(), epochs, result.test_acc, result.train_s, result.step_us);
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "mnist_mlp: %s\n", e.what());
  return 1;
}
