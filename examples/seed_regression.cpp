// The seed example: one small regression trained in static mode and then in dynamic mode from the same seed.
// x (1000 x 100) and y (1000 x 1) are drawn from N(0, 1); the model is Linear(100, 10) -> ReLU -> Linear(10, 1) with
// MSE and Adam(lr = 1e-3), trained full-batch: 10 steps (timed as "first 10", which includes warm-up), then 2000
// more (timed per step). Both modes start from the same weights and print the same losses.
//
//   seed_regression [--threads N] [--steps 2000] [--seed 42]
#include <chrono>
#include <cstdio>

#include "common.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using clock_type = std::chrono::steady_clock;

namespace {

struct run_result {
  double first10_ms = 0, step_us = 0;
  float first_loss = 0, loss_at_10 = 0, final_loss = 0;
};

void report(const char* mode, const run_result& r, long long steps) {
  std::printf("%-8s loss: step 1 %.6f, step 10 %.6f, step %lld %.6f | first 10 steps %.3f ms | %.2f us/step\n", mode,
              r.first_loss, r.loss_at_10, 10 + steps, r.final_loss, r.first10_ms, r.step_us);
  std::printf("RESULT example=seed_regression mode=%s first10_ms=%.3f step_us=%.3f final_loss=%.9g\n", mode,
              r.first10_ms, r.step_us, r.final_loss);
}

// Runs `step` 10 times (timed together), then `steps` more times (timed per step).
template <class Step>
run_result run_steps(Step&& step, long long steps) {
  run_result r;
  auto t0 = clock_type::now();
  for (int i = 0; i < 10; ++i) {
    float loss = step();
    if (i == 0) r.first_loss = loss;
    r.loss_at_10 = loss;
  }
  r.first10_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  auto t1 = clock_type::now();
  for (long long i = 0; i < steps; ++i) r.final_loss = step();
  r.step_us = std::chrono::duration<double, std::micro>(clock_type::now() - t1).count() / double(steps);
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--seed", "--steps"});
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  long long steps = flags.get_int("--steps", 2000);
  std::uint64_t seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  set_num_threads(threads);

  random_generator data_rng(seed ^ 0xDA7A);
  Tensor<float> x(shape{1000, 100}), y(shape{1000, 1});
  for (float& v : x.span()) v = data_rng.normal<float>();
  for (float& v : y.span()) v = data_rng.normal<float>();
  std::printf("seed regression: x %s, y %s, Linear(100,10) -> ReLU -> Linear(10,1), MSE, Adam(lr=1e-3), %d thread%s\n",
              x.shape().str().c_str(), y.shape().str().c_str(), threads, threads == 1 ? "" : "s");

  // Static mode: the model is a type; memory is planned once for a batch of 1000.
  using Net = Sequential<policy::cpu, Input<100>, Dense<10, ReLU>, Dense<1>>;
  Net net(1000, seed);
  optim::Adam static_opt({.lr = 1e-3});
  auto static_result = run_steps([&] { return net.train_step(x, y, loss::mse{}, static_opt); }, steps);

  // Dynamic mode: the same layers as objects, the same initial weights after manual_seed.
  manual_seed(seed);
  auto model = nn::Sequential(nn::Linear(100, 10), nn::ReLU(), nn::Linear(10, 1));
  optim::Adam dynamic_opt(model.parameters(), {.lr = 1e-3});
  nn::Variable input(x), target(y);
  auto dynamic_result = run_steps(
      [&] {
        dynamic_opt.zero_grad();
        auto loss = nn::mse_loss(model(input), target);
        loss.backward();
        dynamic_opt.step();
        return loss.item();
      },
      steps);

  report("static", static_result, steps);
  report("dynamic", dynamic_result, steps);
  bool same = static_result.final_loss == dynamic_result.final_loss && static_result.first_loss == dynamic_result.first_loss;
  std::printf("losses %s; dynamic/static time per step: %.2fx\n", same ? "identical in both modes" : "DIFFER",
              dynamic_result.step_us / static_result.step_us);
  return same ? 0 : 1;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "seed_regression: %s\n", e.what());
  return 1;
}
