// kiln's flagship demo: the MNIST MLP trained in static mode and then in dynamic mode, from the same seed on the
// same batches, through the same Keras-style Model::fit. Both modes call the same kernels, so their losses agree
// bit for bit and the difference in time per step is the cost of dynamism.
//
//   mnist_demo [--epochs 5] [--schedule cosine|constant] [--data DIR] [--threads N] [--seed 42] [--profile]
//              [--precision single|bf16x3|bf16] [--rounds 6]
//
// The time per step is measured after both modes have trained (their warm-up): one more epoch of each, in
// alternation, the order swapped every round, so that neither mode is timed on a colder machine than the other. The
// printed ratio is the median of the rounds' ratios, with their range.
//
// --profile times every training step part by part (kiln::step_profile through fit_options::profile) and prints
// both modes' profiles and where dynamic mode's extra time goes. --precision bf16 rounds every product's operands to
// bfloat16 in both modes, bf16x3 splits each into two bfloat16 values (kernels::cpu::set_default_product_precision).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

#include "common.hpp"
#include "kiln/train.hpp"
#include "mnist_common.hpp"
#include "mnist_schedule.hpp"

using namespace kiln;

namespace {

struct mode_result {
  const char* mode = "";
  double test_acc = 0, test_loss = 0, step_us = 0, data_us = 0, train_s = 0;
  std::vector<double> losses;
  step_profile profile;
};

template <class Net>
mode_result train_mode(const char* mode, Net& net, const examples::mnist_data& mnist, int epochs, std::uint64_t seed,
                       const std::string& schedule, bool profiled) {
  std::printf("\n== %s mode ==\n", mode);
  Model model(net);
  model.compile(optim::Adam({.lr = examples::mnist_lr}), loss::cross_entropy{}, {metric::accuracy});
  mode_result r;
  auto start = std::chrono::steady_clock::now();
  auto history = model.fit(mnist.train, {.epochs = epochs,
                                         .batch_size = 64,
                                         .callbacks = examples::mnist_schedule_callbacks(schedule, epochs),
                                         .seed = seed,
                                         .profile = profiled ? &r.profile : nullptr});
  r.mode = mode;
  r.train_s = examples::seconds_since(start);
  auto test = model.evaluate(mnist.test);
  r.test_acc = test["accuracy"];
  r.test_loss = test.loss;
  r.step_us = model.timing().step_microseconds();
  r.data_us = model.timing().data_seconds * 1e6 / double(std::max<long long>(1, model.timing().steps));
  r.losses = history.series("loss");
  std::printf("test accuracy %.4f (loss %.4f)\n", r.test_acc, r.test_loss);
  std::printf("RESULT example=mnist_demo mode=%s epochs=%d test_acc=%.4f train_s=%.3f step_us=%.2f data_us=%.2f\n",
              mode, epochs, r.test_acc, r.train_s, r.step_us, r.data_us);
  return r;
}

// µs per step of one more epoch of training, through a Model that stays compiled across rounds.
template <class Net>
double timed_epoch(Model<Net>& model, const examples::mnist_data& mnist, std::uint64_t seed) {
  model.fit(mnist.train, {.epochs = 1, .batch_size = 64, .verbose = 0, .seed = seed});
  return model.timing().step_microseconds();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--profile", "--rounds", "--schedule", "--seed"});
  const bool profiled = flags.has("--profile");
  int epochs = static_cast<int>(flags.get_int("--epochs", 5));
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  const int rounds = static_cast<int>(flags.get_int("--rounds", 6));
  if (rounds < 1) fail("mnist_demo: expected --rounds >= 1, found ", rounds);
  std::string schedule = flags.get("--schedule", "cosine");
  examples::check_mnist_schedule(schedule);  // before loading anything
  set_num_threads(threads);
  auto load_start = std::chrono::steady_clock::now();
  auto mnist = examples::load_mnist_data(flags.get("--data", ""));
  std::printf("kiln demo: MNIST MLP (Flatten -> Dense 128 ReLU -> Dense 10), Adam 1e-3 (%s), batch 64, %d epochs, "
              "%d thread%s, %s\nMNIST from %s loaded in %.2f s\n",
              schedule == "cosine" ? "cosine annealing per epoch" : "constant", epochs, threads,
              threads == 1 ? "" : "s", examples::products_description().c_str(), mnist.dir.c_str(),
              examples::seconds_since(load_start));

  examples::mnist_static_mlp net(64, seed);
  auto model = examples::mnist_dynamic_mlp(seed);
  auto s = train_mode("static", net, mnist, epochs, seed, schedule, profiled);
  auto d = train_mode("dynamic", model, mnist, epochs, seed, schedule, profiled);

  // Timed in alternation after training, the order swapped every round.
  Model static_model(net);
  Model dynamic_model(model);
  static_model.compile(optim::Adam({.lr = examples::mnist_lr}), loss::cross_entropy{});
  dynamic_model.compile(optim::Adam({.lr = examples::mnist_lr}), loss::cross_entropy{});
  std::vector<double> static_us, dynamic_us, ratios;
  for (int round = 0; round < rounds; ++round) {
    double st = 0, dy = 0;
    if (round % 2 == 0) {
      st = timed_epoch(static_model, mnist, seed + round);
      dy = timed_epoch(dynamic_model, mnist, seed + round);
    } else {
      dy = timed_epoch(dynamic_model, mnist, seed + round);
      st = timed_epoch(static_model, mnist, seed + round);
    }
    static_us.push_back(st);
    dynamic_us.push_back(dy);
    ratios.push_back(dy / st);
  }
  s.step_us = median(static_us);
  d.step_us = median(dynamic_us);

  std::printf("\n| mode    | test accuracy | step (us) | data (us/step) | train (s) |\n");
  std::printf("|---------|---------------|-----------|----------------|-----------|\n");
  for (auto* r : {&s, &d})
    std::printf("| %-7s | %13.4f | %9.1f | %14.1f | %9.2f |\n", r->mode, r->test_acc, r->step_us, r->data_us, r->train_s);
  std::printf("(step: the median of %d epochs of each mode timed in alternation after training; train: the %d "
              "training epochs)\n", rounds, epochs);
  const double ratio = median(ratios);
  const auto [low, high] = std::minmax_element(ratios.begin(), ratios.end());
  bool same = s.losses == d.losses;
  std::printf("\ncost of dynamism: dynamic mode takes %.2fx the time per step of static mode (median of %d rounds, "
              "%.2f-%.2f)\n", ratio, rounds, *low, *high);
  std::printf("training losses of the two modes: %s\n", same ? "bit-identical in every epoch" : "DIFFERENT");
  if (profiled) {
    std::printf("\nstatic mode, ");
    s.profile.print(std::cout);
    std::printf("\ndynamic mode, ");
    d.profile.print(std::cout);
    std::printf("\nwhere the cost of dynamism goes (the same steps, profiled):\n");
    print_comparison(std::cout, s.profile, "static", d.profile, "dynamic");
  }
  std::printf("RESULT example=mnist_demo dynamic_over_static=%.3f losses_identical=%d\n", ratio, same ? 1 : 0);
  return same ? 0 : 1;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "mnist_demo: %s\n", e.what());
  return 1;
}
