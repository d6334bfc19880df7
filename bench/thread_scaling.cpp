// How much faster the ladder's top static rung trains the MNIST MLP on several threads than on one, measured side by
// side: the modes take turns every few steps in one process, so that a shared machine's slow and fast phases fall on
// all of them alike. Separate runs a few seconds apart differ by up to 1.7x on this project's VMs (bench/RESULTS.md),
// more than the effect measured.
//
//   thread_scaling [--threads N] [--epochs 2] [--block 16] [--data DIR] [--precision single|bf16x3|bf16]
//
// Modes, each with its own copy of the same model (same seed, same batches in the same order):
//   1 thread;
//   N threads, the work split equally (set_thread_balancing(false));
//   N threads, the work split by each thread's recent speed (thread_balance.hpp, the default).
// Each mode trains `--block` steps, then the next takes over, until each has trained --epochs epochs. Before any time is
// reported, the bench checks that the three models' losses are the same bits at every step: the split of the work
// must not change results. Every step's time is kept; a mode's figure is the median over its steps, and the ratio is
// also given as the median of the per-round ratios (a round: one block of each mode, about 10 ms).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../examples/common.hpp"
#include "kiln/data/data.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(q * double(v.size() - 1) + 0.5))];
}

struct mode {
  const char* name;
  int threads;
  bool balanced;
};

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--epochs", "--block", "--data"});
  const int threads = int(flags.get_int("--threads", 2));
  const long long epochs = flags.get_int("--epochs", 2), block = flags.get_int("--block", 16);
  if (threads < 2) throw kiln::error("thread_scaling: --threads: expected 2 or more, found " + std::to_string(threads));
  if (epochs < 1 || block < 1)
    throw kiln::error("thread_scaling: --epochs and --block: expected 1 or more, found " + std::to_string(epochs) +
                      " and " + std::to_string(block));
  const bool restore_balancing = kernels::cpu::thread_balancing_active();

  auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
  auto train = data::load_mnist(dir, data::split::train, {.scale = true, .mean = data::mnist_mean, .std = data::mnist_std});
  // The ladder's epoch: batches of 64 in a seeded shuffled order, assembled before timing.
  std::vector<Tensor<float>> xs;
  std::vector<Tensor<std::int64_t>> ys;
  data::data_loader loader(train, data::loader_options<float>{.batch_size = 64, .shuffle = true, .seed = 5});
  for (const auto& batch : loader.epoch(0)) {
    xs.emplace_back(batch.x);
    ys.emplace_back(batch.y);
  }
  const std::string multi = std::to_string(threads) + " threads";
  const std::array<mode, 3> modes{mode{"1 thread", 1, false}, mode{"equal split", threads, false},
                                  mode{"balanced split", threads, true}};
  using Net = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;
  std::vector<std::unique_ptr<Net>> nets;
  std::vector<optim::Adam> opts;
  for (std::size_t m = 0; m < modes.size(); ++m) {
    nets.push_back(std::make_unique<Net>(64, 1, static_options{.fuse_epilogues = true, .flat_parameters = true}));
    opts.emplace_back(optim::adam_options{.lr = 1e-3});
  }
  std::printf("kiln thread_scaling: the MNIST MLP (784-128-10, batch 64, Adam, rung 5), 1 thread against %d, in turns "
              "of %lld steps; %s\n",
              threads, block, examples::products_description().c_str());

  const long long steps = epochs * static_cast<long long>(xs.size());
  std::array<std::vector<double>, 3> times, losses;
  std::array<std::vector<double>, 3> block_medians;
  using clock = std::chrono::steady_clock;
  for (long long start = 0; start < steps; start += block) {
    const long long end = std::min(steps, start + block);
    for (std::size_t m = 0; m < modes.size(); ++m) {
      set_num_threads(modes[m].threads);
      kernels::cpu::set_thread_balancing(modes[m].balanced);
      std::vector<double> these;
      for (long long s = start; s < end; ++s) {
        const std::size_t b = static_cast<std::size_t>(s) % xs.size();
        const auto t0 = clock::now();
        const float loss = nets[m]->train_step(xs[b].view(), ys[b].view(), loss::cross_entropy{}, opts[m]);
        const double us = std::chrono::duration<double, std::micro>(clock::now() - t0).count();
        these.push_back(us);
        losses[m].push_back(loss);
      }
      times[m].insert(times[m].end(), these.begin(), these.end());
      block_medians[m].push_back(median(these));
    }
  }
  kernels::cpu::set_thread_balancing(restore_balancing);

  for (std::size_t m = 1; m < modes.size(); ++m)
    for (std::size_t s = 0; s < losses[0].size(); ++s)
      if (losses[m][s] != losses[0][s]) {
        std::fprintf(stderr, "thread_scaling: %s's loss at step %zu is %.9g, against %.9g on 1 thread: a split of the "
                     "work changed the results\n", modes[m].name, s, losses[m][s], losses[0][s]);
        return 1;
      }
  std::printf("losses: the same bits in all three modes at all %lld steps (last %.6f)\n", steps, losses[0].back());

  std::printf("\n| mode | median us | p10 | p90 | 1 thread / this (medians) | median of per-round ratios |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  const double one = median(times[0]);
  for (std::size_t m = 0; m < modes.size(); ++m) {
    std::vector<double> ratios;
    for (std::size_t r = 0; r < block_medians[m].size(); ++r) ratios.push_back(block_medians[0][r] / block_medians[m][r]);
    const double med = median(times[m]);
    const std::string label = m == 0 ? std::string(modes[m].name) : multi + ", " + modes[m].name;
    std::printf("| %s | %.1f | %.1f | %.1f | %.2fx | %.2fx |\n", label.c_str(), med, quantile(times[m], 0.1),
                quantile(times[m], 0.9), one / med, median(ratios));
    std::printf("RESULT bench=thread_scaling workload=mnist_mlp threads=%d split=%s step_us=%.3f p10_us=%.3f "
                "p90_us=%.3f speedup=%.3f round_speedup=%.3f\n",
                modes[m].threads, m == 0 ? "none" : (modes[m].balanced ? "balanced" : "equal"), med,
                quantile(times[m], 0.1), quantile(times[m], 0.9), one / med, median(ratios));
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
