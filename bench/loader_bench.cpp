// MNIST data_loader throughput (samples per second), batch 64: plain batches and augmented ones (shift + rotation +
// noise), each with and without the background prefetch thread.
//   loader_bench [--data DIR] [--threads N] [--epochs E] [--work-us U]
// --threads: threads assembling each batch; --work-us: simulated training work per batch (busy wait) in the consumer,
// which is what prefetching overlaps with; 0 measures the loader alone.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "kiln/core/threads.hpp"
#include "kiln/data/data.hpp"

using namespace kiln;
using namespace kiln::data;
using clock_type = std::chrono::steady_clock;

namespace {
const char* flag(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}
double seconds(clock_type::time_point since) { return std::chrono::duration<double>(clock_type::now() - since).count(); }

volatile float sink = 0;
}  // namespace

int main(int argc, char** argv) try {
  const std::string data_flag = flag(argc, argv, "--data", "");
  const int threads = std::atoi(flag(argc, argv, "--threads", "1"));
  const int epochs = std::atoi(flag(argc, argv, "--epochs", "2"));
  const double work_us = std::atof(flag(argc, argv, "--work-us", "0"));
  set_num_threads(threads);

  auto start = clock_type::now();
  auto dir = find_data_dir("mnist", data_flag);
  auto train = load_mnist(dir, split::train, {.mean = mnist_mean, .std = mnist_std});
  const double load_s = seconds(start);
  std::printf("MNIST from %s: %td samples, loaded (gunzip + IDX + float) in %.3f s; threads %d, work %.0f us/batch\n",
              dir.c_str(), train.size(), load_s, threads, work_us);
  std::printf("RESULT bench=loader case=load_mnist_train seconds=%.4f\n", load_s);

  struct bench_case {
    const char* name;
    bool augment;
    int prefetch;
  };
  const bench_case cases[] = {{"plain", false, 0}, {"plain_prefetch", false, 2}, {"augment", true, 0},
                              {"augment_prefetch", true, 2}};
  for (const auto& c : cases) {
    loader_options<float> options{.batch_size = 64, .seed = 1, .prefetch = c.prefetch, .threads = threads};
    if (c.augment) options.transform = compose(random_shift{2}, random_rotation{10.0f}, gaussian_noise{0.1f});
    data_loader loader(train, options);
    double best = 0;
    for (int e = 0; e < epochs; ++e) {
      auto t0 = clock_type::now();
      index_t samples = 0;
      for (const auto& batch : loader.epoch(static_cast<std::uint64_t>(e))) {
        samples += batch.size;
        sink = sink + batch.x[0] + static_cast<float>(batch.y[batch.size - 1]);  // touch the batch
        if (work_us > 0) {
          auto w = clock_type::now();
          while (seconds(w) * 1e6 < work_us) {
          }
        }
      }
      const double rate = static_cast<double>(samples) / seconds(t0);
      if (rate > best) best = rate;
    }
    std::printf("%-18s %12.0f samples/s (best of %d epochs)\n", c.name, best, epochs);
    std::printf("RESULT bench=loader case=%s threads=%d work_us=%.0f samples_per_s=%.0f\n", c.name, threads, work_us,
                best);
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "loader_bench: " << e.what() << "\n";
  return 1;
}
