// Whether the machine's cores keep their speed: one thread pinned to each core runs the same fixed work (the MNIST
// MLP's first-layer forward for half of its 128 units, 64 x 784 x 64, as each of two threads runs it in a training
// step) in rounds that start together, and each round prints every core's mean time per product. On a dedicated
// machine the columns stay equal and steady; on this project's shared VMs either core runs at about half speed for
// stretches, which is what kiln's balanced split of parallel work (kernels/cpu/thread_balance.hpp) answers.
//
//   core_speed [--threads N] [--rounds 20] [--products 500]
//
// --threads: the cores used (0 .. N-1; default: all the program may use, at most 8).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../examples/common.hpp"
#include "kiln/core/random.hpp"
#include "kiln/kernels/cpu/gemm.hpp"

using namespace kiln;

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--rounds", "--products"});
#if defined(_OPENMP)
  const int available = omp_get_num_procs();
#else
  const int available = 1;
#endif
  const int threads = int(flags.get_int("--threads", std::min(available, 8)));
  const long long rounds = flags.get_int("--rounds", 20), products = flags.get_int("--products", 500);
  if (threads < 1 || rounds < 1 || products < 1)
    throw kiln::error("core_speed: --threads, --rounds and --products: expected 1 or more");
  const index_t batch = 64, in = 784, units = 64;
  random_generator rng(3);
  std::vector<float> x(static_cast<std::size_t>(batch * in)), bias(static_cast<std::size_t>(units));
  for (auto& v : x) v = rng.normal<float>();
  std::vector<std::vector<float>> weights(std::size_t(threads), std::vector<float>(std::size_t(units * in)));
  std::vector<std::vector<float>> outputs(std::size_t(threads), std::vector<float>(std::size_t(batch * units)));
  for (auto& w : weights)
    for (auto& v : w) v = 0.05f * rng.normal<float>();
  std::vector<std::vector<double>> us(static_cast<std::size_t>(threads),
                                      std::vector<double>(static_cast<std::size_t>(rounds)));
  bool pinned = true;
  std::printf("kiln core_speed: %d thread%s, one per core, %lld rounds of %lld products 64 x 784 x 64 each; %s\n",
              threads, threads == 1 ? "" : "s", rounds, products, examples::products_description().c_str());

#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
#endif
  {
#if defined(_OPENMP)
    const int id = omp_get_thread_num();
#else
    const int id = 0;
#endif
    set_num_threads(1);  // each product on its own thread
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(id, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
#if defined(_OPENMP)
#pragma omp atomic write
#endif
      pinned = false;
    }
#else
    pinned = false;
#endif
    const kernels::cpu::epilogue<float> ep{bias.data(), activation::relu};
    for (long long r = 0; r < rounds; ++r) {
#if defined(_OPENMP)
#pragma omp barrier
#endif
      const auto t0 = std::chrono::steady_clock::now();
      for (long long p = 0; p < products; ++p)
        kernels::cpu::gemm(false, true, batch, units, in, 1.0f, x.data(), in, weights[std::size_t(id)].data(), in,
                           0.0f, outputs[std::size_t(id)].data(), units, ep);
      us[std::size_t(id)][std::size_t(r)] =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / double(products);
    }
  }
  if (!pinned) std::printf("(the threads could not be pinned to cores: each column is a thread, not a core)\n");
  std::printf("\n| round |");
  for (int t = 0; t < threads; ++t) std::printf(" core %d, us |", t);
  std::printf(" slowest / fastest |\n|---:|");
  for (int t = 0; t <= threads; ++t) std::printf("---:|");
  std::printf("\n");
  std::vector<double> spreads;
  for (long long r = 0; r < rounds; ++r) {
    std::printf("| %lld |", r);
    double lo = 1e300, hi = 0;
    for (int t = 0; t < threads; ++t) {
      const double v = us[std::size_t(t)][std::size_t(r)];
      std::printf(" %.1f |", v);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    spreads.push_back(hi / lo);
    std::printf(" %.2f |\n", hi / lo);
  }
  for (int t = 0; t < threads; ++t) {
    auto v = us[std::size_t(t)];
    std::sort(v.begin(), v.end());
    std::printf("RESULT bench=core_speed core=%d min_us=%.3f median_us=%.3f max_us=%.3f\n", t, v.front(),
                v[v.size() / 2], v.back());
  }
  std::sort(spreads.begin(), spreads.end());
  std::printf("RESULT bench=core_speed spread_median=%.3f spread_max=%.3f\n", spreads[spreads.size() / 2],
              spreads.back());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
