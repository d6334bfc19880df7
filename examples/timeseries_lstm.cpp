// Forecasting the airline passengers series (monthly totals in thousands, 1949-1960) one month ahead with an LSTM,
// a 1-layer and a 2-layer one side by side.
//
// Windows of 12 months predict the 13th. Each window is scaled by its own last value: inputs log(x_t / x_last),
// target log(x_next / x_last), so the trend (the series triples) never leaves the range seen in training. The split is
// by time: windows whose target falls in the first 2/3 of the series train, the rest (the last 48 months) validate.
// Errors are RMSE in thousands of passengers on the validation months, next to two naive forecasts (repeat the last
// month; repeat the same month a year before).
//
//   timeseries_lstm [--mode static|dynamic] [--epochs 400] [--data DIR] [--threads N] [--seed 42] [--clip-norm C]
//
// --clip-norm C: Adam clips the joint 2-norm of the gradients to C before each update (0, the default: off), as
// recurrent networks often need; both modes clip alike and still train to the same losses.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common.hpp"
#include "kiln/data/csv.hpp"
#include "kiln/data/find_data.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

constexpr index_t window = 12;

struct windows {
  Tensor<float> x, y;             // (n, window, 1) and (n, 1), scaled
  std::vector<double> last, next;  // the window's last value and the true next value, in passengers
};

windows make_windows(const std::vector<double>& series, index_t first_target, index_t end_target) {
  index_t n = end_target - first_target;
  windows w{Tensor<float>(shape{n, window, 1}), Tensor<float>(shape{n, 1}), {}, {}};
  for (index_t i = 0; i < n; ++i) {
    index_t target = first_target + i;
    double last = series[static_cast<std::size_t>(target - 1)];
    for (index_t k = 0; k < window; ++k)
      w.x[i * window + k] = static_cast<float>(std::log(series[static_cast<std::size_t>(target - window + k)] / last));
    w.y[i] = static_cast<float>(std::log(series[static_cast<std::size_t>(target)] / last));
    w.last.push_back(last);
    w.next.push_back(series[static_cast<std::size_t>(target)]);
  }
  return w;
}

// RMSE in passengers of scaled predictions.
double rmse(const Tensor<float>& predicted, const windows& w) {
  double sum = 0;
  for (std::size_t i = 0; i < w.next.size(); ++i) {
    double p = w.last[i] * std::exp(double(predicted[static_cast<index_t>(i)]));
    sum += (p - w.next[i]) * (p - w.next[i]);
  }
  return std::sqrt(sum / double(w.next.size()));
}

struct outcome {
  double val_rmse = 0, train_s = 0, step_us = 0;
  float final_loss = 0;
};

// Full-batch training: `step` runs one optimizer step and returns the loss, `predict` maps inputs to outputs.
template <class Step, class Predict>
outcome train_epochs(int epochs, const windows& val, Step&& step, Predict&& predict) {
  outcome r;
  auto start = std::chrono::steady_clock::now();
  for (int e = 0; e < epochs; ++e) r.final_loss = step();
  r.train_s = examples::seconds_since(start);
  r.step_us = r.train_s * 1e6 / epochs;
  r.val_rmse = rmse(predict(val.x), val);
  return r;
}

template <class Net>
outcome run_static(const windows& tr, const windows& val, int epochs, std::uint64_t seed, double clip_norm) {
  Net net(tr.x.extent(0), seed);
  optim::Adam opt({.lr = 5e-3, .clip = {.norm = clip_norm}});
  return train_epochs(
      epochs, val, [&] { return net.train_step(tr.x, tr.y, loss::mse{}, opt); },
      [&](const Tensor<float>& x) { return net.predict(x); });
}

outcome run_dynamic(index_t layers, const windows& tr, const windows& val, int epochs, std::uint64_t seed,
                    double clip_norm) {
  manual_seed(seed);
  auto model = nn::Sequential(nn::LastStep(nn::LSTM(1, 32, {.num_layers = layers, .batch_first = true})),
                              nn::Linear(32, 1));
  optim::Adam opt(model.parameters(), {.lr = 5e-3, .clip = {.norm = clip_norm}});
  nn::Variable x(tr.x), y(tr.y);
  return train_epochs(
      epochs, val,
      [&] {
        opt.zero_grad();
        auto loss = nn::mse_loss(model(x), y);
        loss.backward();
        opt.step();
        return loss.item();
      },
      [&](const Tensor<float>& in) {
        nn::no_grad guard;
        model.eval();
        auto out = model(nn::Variable(in)).tensor();
        model.train();
        return out;
      });
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--mode", "--seed", "--clip-norm"});
  std::string mode = flags.get("--mode", "static");
  int epochs = static_cast<int>(flags.get_int("--epochs", 400));
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  const double clip_norm = flags.get_double("--clip-norm", 0.0);
  set_num_threads(threads);
  if (mode != "static" && mode != "dynamic") {
    std::fprintf(stderr, "timeseries_lstm: --mode must be static or dynamic, found '%s'\n", mode.c_str());
    return 2;
  }

  auto dir = data::find_data_dir("timeseries", flags.get("--data", ""));
  auto table = data::read_csv(dir / "airline-passengers.csv", {.features = {"Passengers"}});
  std::vector<double> series(table.features.span().begin(), table.features.span().end());
  const index_t n = static_cast<index_t>(series.size()), split = n * 2 / 3;
  windows tr = make_windows(series, window, split), val = make_windows(series, split, n);
  std::printf("airline passengers: %lld months; %lld training windows (targets before month %lld), %lld validation "
              "windows; %s mode, %d epochs, %d thread%s\n",
              static_cast<long long>(n), static_cast<long long>(tr.next.size()), static_cast<long long>(split),
              static_cast<long long>(val.next.size()), mode.c_str(), epochs, threads, threads == 1 ? "" : "s");

  if (clip_norm > 0) std::printf("Adam clips the gradients' joint 2-norm to %g before each update\n", clip_norm);

  double naive = 0, seasonal = 0;
  for (std::size_t i = 0; i < val.next.size(); ++i) {
    auto t = static_cast<std::size_t>(split) + i;
    naive += std::pow(series[t - 1] - series[t], 2);
    seasonal += std::pow(series[t - 12] - series[t], 2);
  }
  naive = std::sqrt(naive / double(val.next.size()));
  seasonal = std::sqrt(seasonal / double(val.next.size()));

  outcome one, two;
  if (mode == "static") {
    one = run_static<Sequential<policy::cpu, Input<window, 1>, LastStep<LSTM<32>>, Dense<1>>>(tr, val, epochs, seed,
                                                                                              clip_norm);
    two = run_static<Sequential<policy::cpu, Input<window, 1>, LastStep<LSTM<32, 2>>, Dense<1>>>(tr, val, epochs, seed,
                                                                                                     clip_norm);
  } else {
    one = run_dynamic(1, tr, val, epochs, seed, clip_norm);
    two = run_dynamic(2, tr, val, epochs, seed, clip_norm);
  }
  std::printf("\nvalidation RMSE (thousands of passengers, last %lld months):\n", static_cast<long long>(val.next.size()));
  std::printf("  %-28s %8s %10s %10s\n", "model", "RMSE", "train s", "us/step");
  std::printf("  %-28s %8.2f\n", "naive (last month)", naive);
  std::printf("  %-28s %8.2f\n", "seasonal naive (a year ago)", seasonal);
  std::printf("  %-28s %8.2f %10.2f %10.1f\n", "LSTM(32), 1 layer", one.val_rmse, one.train_s, one.step_us);
  std::printf("  %-28s %8.2f %10.2f %10.1f\n", "LSTM(32), 2 layers", two.val_rmse, two.train_s, two.step_us);
  std::printf("RESULT example=timeseries_lstm mode=%s layers=1 val_rmse=%.3f train_s=%.3f step_us=%.1f\n", mode.c_str(),
              one.val_rmse, one.train_s, one.step_us);
  std::printf("RESULT example=timeseries_lstm mode=%s layers=2 val_rmse=%.3f train_s=%.3f step_us=%.1f\n", mode.c_str(),
              two.val_rmse, two.train_s, two.step_us);
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "timeseries_lstm: %s\n", e.what());
  return 1;
}
