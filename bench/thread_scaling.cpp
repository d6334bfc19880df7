// How much faster the ladder's top static rung trains a workload on several threads than on one, measured side by
// side: the modes take turns every few steps in one process, so that a shared machine's slow and fast phases fall on
// all of them alike. Separate runs a few seconds apart differ by up to 1.7x on this project's VMs (docs/benchmarks.md),
// more than the effect measured.
//
//   thread_scaling [--workload mnist_mlp|lstm|mnist_cnn] [--threads N] [--epochs 2] [--steps N] [--block B]
//                  [--batches-ready] [--profile] [--data DIR] [--precision single|bf16x3|bf16] [--busy-cpu C]
//
// --busy-cpu C runs the whole measurement beside another process spinning on CPU C (bench::competing_load): a machine
// shared with other work, where N threads must not be much slower than one (the one-thread figure, the faster CPU's,
// then comes from a free one).
//
// Workloads, the ladder's (bench/ladder.cpp) on the same batches of MNIST: mnist_mlp (784-128-10), lstm (each image
// as 28 rows into LSTM(128), its final state into Dense 10) and mnist_cnn (Conv32-Conv64-MaxPool-Dense128-Dense10),
// all batch 64, cross-entropy, Adam. --steps N trains each mode N steps instead of --epochs epochs (the LSTM's and the
// CNN's default: 192 and 48 steps); --block defaults to 16 steps for the MLP, 4 for the LSTM and 2 for the CNN (tens of
// milliseconds a turn).
//
// As in bench/ladder, each mode's data loader puts each batch together right before its step, on the mode's threads,
// and that is timed apart; --batches-ready assembles every batch before timing instead, so that each step reads its
// batch from memory.
// Modes, each with its own copy of the same model (same seed, same batches in the same order):
//   1 thread, pinned to each of the first N CPUs the process may use in turn (one mode per CPU); each round's
//   one-thread figure is the faster CPU's, so that a core running slow for a while does not pass for scaling;
//   N threads, the fused step's hidden units split equally (set_thread_balancing(false));
//   N threads, the fused step's hidden units split by each thread's recent speed (thread_balance.hpp, the default);
//   the layer-by-layer step hands its loops' chunks to the threads as they come free (kernels/cpu/parallel.hpp) in
//   both;
//   N independent copies at once: N models, each trained on one thread pinned to its own CPU, all N running their
//   blocks at the same time. Its figure is each copy's step time divided by N (N steps done in that time), so that
//   "1 thread / this" is the throughput N cores give to work that shares nothing: the ceiling that this machine puts
//   on splitting one step, where the split's own costs (packing an operand on every thread, barriers, lines moving
//   between cores) are not paid.
// Each mode trains `--block` steps, then the next takes over, until each has trained its epochs or steps. Before any
// time is reported, the bench checks that every mode's losses (and every independent copy's) are the same bits at every
// step: the split of the work must not change results. Every step's time is kept; a mode's figure is the median over
// its steps, and the ratio is also given as the median of the per-round ratios (a round: one block of each mode) and
// as the ratio of the means (the epoch's time). --profile times each mode's steps part by part (kiln::step_profile,
// or for the fused step each thread's parts, kernels::cpu::fused_mlp_parts) and prints each part's median and 10th
// percentile over the steps, the modes side by side (the fastest tenth shows the parts when both cores run at full
// speed).
#include <algorithm>
#include <array>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../examples/common.hpp"
#include "cpu_pinning.hpp"
#include "mnist_nets.hpp"
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

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / double(v.size());
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(q * double(v.size() - 1) + 0.5))];
}

struct mode {
  std::string name;
  int threads;
  bool balanced;
  int cpu;  // the one CPU a one-thread mode is pinned to; -1: not pinned
  bool independent = false;  // `threads` copies trained at once, one thread each
};

struct settings {
  std::string workload;
  int threads = 2;
  long long epochs = 2, steps = 0, block = 16;
  bool batches_ready = false, profiled = false;
  bool fused = false;  // the MNIST MLP through kiln::fused_mlp_trainer
};

// The fused trainer of a model that has one; a model that has none never makes one.
template <class Net>
using fused_trainer = std::conditional_t<detail::fused_mlp_layout<Net>::matches, fused_mlp_trainer<Net>, int>;

// The batch as Net takes it: MNIST's 28 x 28 images, with a channel for a convolution.
template <class Net>
tensor_view<const float> as_input(const tensor_view<const float>& x) {
  return {x.data(), Net::input_shape::batch_shape(x.extent(0))};
}

template <class Net>
int measure(const settings& s, const data::tensor_dataset<float, std::int64_t>& train, const char* description) {
  const int threads = s.threads;
  const bool profiled = s.profiled, batches_ready = s.batches_ready;
  const long long block = s.block;
  const bool restore_balancing = kernels::cpu::thread_balancing_active();
  // The ladder's epoch: batches of 64 in a seeded shuffled order.
  const data::loader_options<float> order{.batch_size = 64, .shuffle = true, .seed = 5};
  std::vector<Tensor<float>> xs;
  std::vector<Tensor<std::int64_t>> ys;
  if (batches_ready) {
    data::data_loader loader(train, order);
    for (const auto& batch : loader.epoch(0)) {
      xs.emplace_back(batch.x);
      ys.emplace_back(batch.y);
    }
  }
  const std::string multi = std::to_string(threads) + " threads";
  // One thread runs pinned to each of the first `threads` CPUs in turn, and each round takes the faster: the cores of
  // a shared VM do not keep equal speeds, and a one-thread figure from whichever core the thread happened to land on
  // says more about that core than about scaling (a report's round once ran the one-thread mode at 422 us per step on
  // a core slow all through, against 206-233 us in the other rounds).
  const std::vector<int> cpus = bench::allowed_cpus();
  std::vector<mode> modes;
  for (std::size_t c = 0; c < std::min<std::size_t>(cpus.size(), std::size_t(threads)); ++c)
    modes.push_back({"1 thread on CPU " + std::to_string(cpus[c]), 1, false, cpus[c]});
  if (modes.empty()) modes.push_back({"1 thread", 1, false, -1});
  const std::size_t one_thread_modes = modes.size();
  const bool pinning = one_thread_modes > 1;  // one CPU to run on: nothing to choose, nothing to pin
  modes.push_back({multi + ", equal split", threads, false, -1});
  modes.push_back({multi + ", balanced split", threads, true, -1});
  // Independent copies need a CPU each to be pinned to.
  const int copies = int(std::min<std::size_t>(cpus.size(), std::size_t(threads)));
  const std::size_t independent_mode = modes.size();
  if (copies > 1)
    modes.push_back({std::to_string(copies) + " independent copies at once, 1 thread each (step / " +
                         std::to_string(copies) + ")",
                     copies, false, -1, true});
#if defined(_OPENMP)
  // The OpenMP team is made now, unpinned: a worker started while the opening thread was pinned would keep its CPU.
#pragma omp parallel num_threads(threads)
  {
  }
#endif
  using loader_type = data::data_loader<data::tensor_dataset<float, std::int64_t>>;
  std::vector<std::unique_ptr<Net>> nets;
  std::vector<optim::Adam> opts;
  std::vector<std::unique_ptr<loader_type>> loaders;
  // --workload mnist_mlp_fused: each mode trains through a fused step (kiln::fused_mlp_trainer) instead.
  std::vector<std::unique_ptr<fused_trainer<Net>>> fused;
  // One model per mode, and the independent mode's other copies after them: trainer i is nets[i], opts[i],
  // fused[i] (when fused) and loaders[i].
  const std::size_t trainers = modes.size() + (copies > 1 ? std::size_t(copies - 1) : 0);
  for (std::size_t m = 0; m < trainers; ++m) {
    nets.push_back(std::make_unique<Net>(64, 1, static_options{.fuse_epilogues = true, .flat_parameters = true}));
    opts.emplace_back(optim::adam_options{.lr = 1e-3});
    if constexpr (detail::fused_mlp_layout<Net>::matches)
      if (s.fused) fused.push_back(std::make_unique<fused_trainer<Net>>(*nets.back(), opts.back().options()));
    data::loader_options<float> mine = order;
    mine.threads = m < modes.size() && !modes[m].independent ? modes[m].threads : 1;
    loaders.push_back(std::make_unique<loader_type>(train, mine));
  }
  // The trainer that copy c of the independent mode uses.
  const auto copy_trainer = [&](int c) { return c == 0 ? independent_mode : modes.size() + std::size_t(c - 1); };
  const std::size_t batches = static_cast<std::size_t>(loaders[0]->batches_per_epoch());
  std::printf("kiln thread_scaling: %s, 1 thread against %d, in turns of %lld steps, %s; %s\n", description, threads,
              block,
              batches_ready ? "every batch assembled before timing" : "each batch assembled before its step",
              examples::products_description().c_str());

  const long long steps = s.steps > 0 ? s.steps : s.epochs * static_cast<long long>(batches);
  std::vector<std::vector<double>> times(modes.size()), losses(modes.size()), block_medians(modes.size()),
      block_means(modes.size());
  // --profile: each step's parts, in step_profile's order (the forwards, the loss, the backwards, the update); for the
  // fused step, fused_mlp_parts' parts of thread 0, then of thread 1, and so on.
  std::vector<std::vector<std::vector<double>>> parts(modes.size());
  std::vector<std::string> layers;
  using clock = std::chrono::steady_clock;
  // One step of trainer i on step `step`'s batch: its time in us and its loss; `profile` (or `fused_parts`, for the
  // fused step) gets its parts.
  const auto train_one = [&](std::size_t i, long long step, step_profile& profile,
                             kernels::cpu::fused_mlp_parts& fused_parts) {
    const std::size_t b = static_cast<std::size_t>(step) % batches;
    tensor_view<const float> x;
    tensor_view<const std::int64_t> y;
    if (batches_ready) {
      x = as_input<Net>(xs[b].view());
      y = ys[b].view();
    } else {
      if (b == 0) loaders[i]->start_epoch(0);
      const auto* batch = loaders[i]->next();
      x = as_input<Net>(batch->x);
      y = batch->y;
    }
    const auto t0 = clock::now();
    float loss = 0;
    if constexpr (detail::fused_mlp_layout<Net>::matches)
      if (s.fused) loss = profiled ? fused[i]->train_step(x, y, fused_parts) : fused[i]->train_step(x, y);
    if (!s.fused)
      loss = profiled ? nets[i]->train_step(x, y, loss::cross_entropy{}, opts[i], profile)
                      : nets[i]->train_step(x, y, loss::cross_entropy{}, opts[i]);
    return std::pair{std::chrono::duration<double, std::micro>(clock::now() - t0).count(), loss};
  };
  // The losses of the independent copies after the first (whose are the mode's), checked after the run.
  std::vector<std::vector<double>> copy_losses(static_cast<std::size_t>(std::max(copies, 1)));
  for (long long start = 0; start < steps; start += block) {
    const long long end = std::min(steps, start + block);
    for (std::size_t m = 0; m < modes.size(); ++m) {
      std::vector<double> these;
      if (modes[m].independent) {
        // Every copy pinned to its own CPU, one thread each, starting together.
        std::vector<std::vector<double>> copy_times(static_cast<std::size_t>(copies));
        std::barrier ready(copies);
        std::vector<std::string> failures(static_cast<std::size_t>(copies));
        const auto run_copy = [&](int c) {
          bool waited = false;
          try {
            bench::pin_to(cpus[std::size_t(c)], cpus, "thread_scaling");
            set_num_threads(1);
            waited = true;
            ready.arrive_and_wait();
            kernels::cpu::fused_mlp_parts unused_parts;  // 4 KiB: made once, not before every step
            for (long long step = start; step < end; ++step) {
              step_profile unused;
              const auto [us, loss] = train_one(copy_trainer(c), step, unused, unused_parts);
              copy_times[std::size_t(c)].push_back(us / double(copies));
              (c == 0 ? losses[m] : copy_losses[std::size_t(c)]).push_back(loss);
            }
          } catch (const std::exception& e) {  // reported on the opening thread, after every copy has stopped
            failures[std::size_t(c)] = e.what();
            if (!waited) ready.arrive_and_drop();
          }
        };
        std::vector<std::thread> others;
        for (int c = 1; c < copies; ++c) others.emplace_back(run_copy, c);
        run_copy(0);
        for (auto& t : others) t.join();
        for (const auto& failure : failures)
          if (!failure.empty()) throw kiln::error("thread_scaling: an independent copy failed: " + failure);
        for (const auto& t : copy_times) these.insert(these.end(), t.begin(), t.end());
      } else {
        if (pinning) bench::pin_to(modes[m].cpu, cpus, "thread_scaling");
        set_num_threads(modes[m].threads);
        kernels::cpu::set_thread_balancing(modes[m].balanced);
        // Made once: each profiled step writes every part of each of its threads.
        kernels::cpu::fused_mlp_parts fused_parts;
        for (long long step = start; step < end; ++step) {
          step_profile profile;
          const auto [us, loss] = train_one(m, step, profile, fused_parts);
          these.push_back(us);
          losses[m].push_back(loss);
          if (profiled && s.fused) {
            std::vector<double> us_of_parts;
            const auto& seconds = fused_parts.seconds;
            for (int t = 0; t < modes[m].threads; ++t)  // a smaller team than asked for leaves its columns at 0
              for (int k = 0; k < kernels::cpu::fused_mlp_parts::count; ++k)
                us_of_parts.push_back(t < fused_parts.threads ? 1e6 * seconds[std::size_t(t)][std::size_t(k)] : 0.0);
            parts[m].push_back(std::move(us_of_parts));
          } else if (profiled) {
            std::vector<double> us_of_parts;
            for (double seconds : profile.forward_seconds) us_of_parts.push_back(seconds * 1e6);
            us_of_parts.push_back(profile.loss_seconds * 1e6);
            for (std::size_t i = profile.backward_seconds.size(); i-- > 0;)
              us_of_parts.push_back(profile.backward_seconds[i] * 1e6);
            us_of_parts.push_back(profile.update_seconds * 1e6);
            parts[m].push_back(std::move(us_of_parts));
            if (layers.empty()) layers = profile.layers;
          }
        }
      }
      times[m].insert(times[m].end(), these.begin(), these.end());
      block_medians[m].push_back(median(these));
      block_means[m].push_back(mean(these));
    }
  }
  kernels::cpu::set_thread_balancing(restore_balancing);
  if (pinning) bench::pin_to(-1, cpus, "thread_scaling");

  for (std::size_t m = 1; m < modes.size(); ++m)
    for (std::size_t s = 0; s < losses[0].size(); ++s)
      if (losses[m][s] != losses[0][s]) {
        std::fprintf(stderr,
                     "thread_scaling: %s: the loss at step %zu is %.9g, against %.9g on 1 thread: a split of the work "
                     "changed the results\n",
                     modes[m].name.c_str(), s, losses[m][s], losses[0][s]);
        return 1;
      }
  for (int c = 1; c < copies; ++c)
    for (std::size_t i = 0; i < copy_losses[std::size_t(c)].size(); ++i)
      if (copy_losses[std::size_t(c)][i] != losses[0][i]) {
        std::fprintf(stderr,
                     "thread_scaling: independent copy %d: the loss at step %zu is %.9g, against %.9g on 1 thread\n", c,
                     i, copy_losses[std::size_t(c)][i], losses[0][i]);
        return 1;
      }
  std::printf("losses: the same bits in all %zu modes at all %lld steps (last %.6f)\n", modes.size(), steps,
              losses[0].back());

  // One thread's figure in each round: the faster CPU's block (its median step, and its mean).
  const std::size_t rounds = block_medians[0].size();
  std::vector<double> one_best(rounds), one_best_mean(rounds);
  for (std::size_t r = 0; r < rounds; ++r) {
    std::size_t fastest = 0;
    for (std::size_t m = 1; m < one_thread_modes; ++m)
      if (block_medians[m][r] < block_medians[fastest][r]) fastest = m;
    one_best[r] = block_medians[fastest][r];
    one_best_mean[r] = block_means[fastest][r];
  }
  std::printf("\n| mode | median us | p10 | p90 | mean us | 1 thread / this (medians) | median of per-round ratios | "
              "1 thread / this (means) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  const double one = median(one_best), one_mean = mean(one_best_mean);
  auto print = [&](const std::string& label, const char* split, int mode_threads, const std::string& cpu,
                   const std::vector<double>& steps_us, const std::vector<double>& per_round, double average) {
    std::vector<double> ratios;
    for (std::size_t r = 0; r < rounds; ++r) ratios.push_back(one_best[r] / per_round[r]);
    const double med = median(steps_us), p10 = quantile(steps_us, 0.1), p90 = quantile(steps_us, 0.9);
    const double round_ratio = median(ratios);
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx | %.2fx |\n", label.c_str(), med, p10, p90, average,
                one / med, round_ratio, one_mean / average);
    std::printf("RESULT bench=thread_scaling workload=%s threads=%d split=%s cpu=%s batches_ready=%d step_us=%.3f "
                "p10_us=%.3f p90_us=%.3f mean_us=%.3f speedup=%.3f round_speedup=%.3f mean_speedup=%.3f\n",
                s.workload.c_str(), mode_threads, split, cpu.c_str(), int(batches_ready), med, p10, p90, average,
                one / med, round_ratio, one_mean / average);
  };
  for (std::size_t m = 0; m < modes.size(); ++m) {
    const bool one_thread = m < one_thread_modes;
    print(modes[m].name,
          one_thread ? "none" : modes[m].independent ? "independent" : (modes[m].balanced ? "balanced" : "equal"),
          modes[m].threads,
          modes[m].cpu >= 0 ? std::to_string(modes[m].cpu) : "any", times[m], block_medians[m], mean(times[m]));
    // After the one-thread modes, the figure the ratios divide: each round's faster CPU (its block medians).
    if (m + 1 == one_thread_modes && pinning)
      print("1 thread, the faster CPU each round", "none", 1, "faster", one_best, one_best, one_mean);
  }
  if (profiled && !parts[0].empty()) {
    std::vector<std::string> names;
    if (s.fused) {
      for (const char* name : kernels::cpu::fused_mlp_parts::names) names.push_back(name);
    } else {
      for (const auto& layer : layers) names.push_back("forward " + layer);
      names.push_back("loss and its gradient");
      for (std::size_t i = layers.size(); i-- > 0;) names.push_back("backward " + layers[i]);
      names.push_back("optimizer update");
    }
    // A column per mode, or for the fused step per thread of each mode: where its parts start in a step's list.
    struct column {
      std::size_t mode, first_part;
      std::string name;
    };
    std::vector<column> columns;
    // The independent copies are not profiled: their parts would be those of the one-thread modes.
    for (std::size_t m = 0; m < std::min(modes.size(), independent_mode); ++m) {
      if (!s.fused || modes[m].threads == 1) columns.push_back({m, 0, modes[m].name});
      else
        for (int t = 0; t < modes[m].threads; ++t)
          columns.push_back({m, std::size_t(t) * names.size(), modes[m].name + ", thread " + std::to_string(t)});
    }
    std::printf("\nparts, us per step: median (p10)\n\n| part |");
    for (const auto& c : columns) std::printf(" %s |", c.name.c_str());
    std::printf("\n|---|");
    for (std::size_t c = 0; c < columns.size(); ++c) std::printf("---:|");
    std::printf("\n");
    for (std::size_t k = 0; k < names.size(); ++k) {
      std::printf("| %s |", names[k].c_str());
      for (const auto& c : columns) {
        std::vector<double> v;
        for (const auto& step : parts[c.mode]) v.push_back(step[c.first_part + k]);
        std::printf(" %.2f (%.2f) |", median(v), quantile(v, 0.1));
      }
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv,
                        {"--workload", "--epochs", "--steps", "--block", "--batches-ready", "--profile", "--data",
                         "--busy-cpu"});
  // Started first, before any of the bench's threads exist.
  std::optional<bench::competing_load> load;
  if (flags.has("--busy-cpu")) {
    const int cpu = int(flags.get_int("--busy-cpu", 1));
    load.emplace(cpu, "thread_scaling");
    std::printf("a competing load spins on CPU %d for the whole run\n", cpu);
  }
  settings s;
  s.workload = flags.get("--workload", "mnist_mlp");
  s.fused = s.workload == "mnist_mlp_fused";
  const bool mlp = s.workload == "mnist_mlp" || s.fused;
  s.profiled = flags.has("--profile");
  s.batches_ready = flags.has("--batches-ready");
  s.threads = int(flags.get_int("--threads", 2));
  s.epochs = flags.get_int("--epochs", 2);
  s.steps = flags.get_int("--steps", mlp || flags.has("--epochs") ? 0 : s.workload == "lstm" ? 192 : 48);
  s.block = flags.get_int("--block", mlp ? 16 : s.workload == "lstm" ? 4 : 2);
  if (s.threads < 2)
    throw kiln::error("thread_scaling: --threads: expected 2 or more, found " + std::to_string(s.threads));
  if (s.epochs < 1 || s.block < 1 || s.steps < 0)
    throw kiln::error("thread_scaling: --epochs, --block and --steps: expected 1 or more, found " +
                      std::to_string(s.epochs) + ", " + std::to_string(s.block) + " and " + std::to_string(s.steps));
  auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
  auto train =
      data::load_mnist(dir, data::split::train, {.scale = true, .mean = data::mnist_mean, .std = data::mnist_std});
  if (s.fused)
    return measure<bench::mnist_mlp_net>(s, train, "the MNIST MLP (784-128-10, batch 64, Adam, the fused step)");
  if (mlp)
    return measure<bench::mnist_mlp_net>(s, train, "the MNIST MLP (784-128-10, batch 64, Adam, rung 5)");
  if (s.workload == "lstm")
    return measure<bench::lstm_net>(
        s, train, "the LSTM on MNIST rows (LSTM(128) final state - Dense 10, batch 64, Adam, rung 5)");
  if (s.workload == "mnist_cnn")
    return measure<bench::mnist_cnn_net>(
        s, train, "the MNIST CNN (Conv32-Conv64-MaxPool-Dense128-Dense10, batch 64, Adam, rung 5)");
  throw kiln::error("thread_scaling: --workload: expected mnist_mlp, mnist_mlp_fused, lstm or mnist_cnn, found '" +
                    s.workload + "'");
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
