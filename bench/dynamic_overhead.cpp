// The fixed cost of dynamic mode: nn::Linear(8, 8) on a 1 x 8 input, where the arithmetic (64 multiply-adds) is
// negligible and what is measured is the dynamism: a Variable and its node, storage, the tape entry, the virtual
// call. Cases: forward with autograd recording, forward under no_grad, forward + backward, and the same with the
// caching allocator off (the ladder's rung 1). Reports the median over repetitions of ns per call.
//   dynamic_overhead [--threads N] [--calls N] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/core/threads.hpp"
#include "kiln/dynamic/nn.hpp"

namespace {

template <class Body>
double median_ns_per_call(long calls, int reps, Body&& body) {
  for (long i = 0; i < calls / 10 + 1; ++i) body();  // warm-up: caches, tape capacity, branch predictors
  std::vector<double> per_call;
  for (int r = 0; r < reps; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) body();
    auto stop = std::chrono::steady_clock::now();
    per_call.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(calls));
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, reps = 7;
  long calls = 200000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--calls" && i + 1 < argc) calls = std::atol(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--calls N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  kiln::set_num_threads(threads);
  kiln::manual_seed(0);
  kiln::nn::Linear layer(8, 8);
  kiln::nn::Variable x(kiln::Tensor<float>(kiln::shape{1, 8}, 0.5f));
  volatile float sink = 0;

  struct result {
    const char* name;
    double ns;
  };
  std::vector<result> results;
  for (bool caching : {true, false}) {
    kiln::nn::set_caching_allocator(caching);
    std::string suffix = caching ? "" : "_nocache";
    double fwd = median_ns_per_call(calls, reps, [&] {
      auto y = layer(x);
      sink = sink + y.data()[0];
    });
    double fwd_nograd = median_ns_per_call(calls, reps, [&] {
      kiln::nn::no_grad guard;
      auto y = layer(x);
      sink = sink + y.data()[0];
    });
    double fwd_bwd = median_ns_per_call(calls, reps, [&] {
      auto loss = kiln::nn::sum(layer(x));
      loss.backward();
      sink = sink + loss.item();
    });
    static std::string names[6];
    int base = caching ? 0 : 3;
    names[base] = "linear8_forward" + suffix;
    names[base + 1] = "linear8_forward_nograd" + suffix;
    names[base + 2] = "linear8_forward_backward" + suffix;
    results.push_back({names[base].c_str(), fwd});
    results.push_back({names[base + 1].c_str(), fwd_nograd});
    results.push_back({names[base + 2].c_str(), fwd_bwd});
  }
  kiln::nn::set_caching_allocator(true);
  std::printf("dynamic_overhead: nn::Linear(8, 8) on a 1x8 input, %ld calls x %d repetitions, median, threads=%d\n",
              calls, reps, threads);
  for (const auto& r : results) std::printf("  %-36s %8.1f ns/call\n", r.name, r.ns);
  for (const auto& r : results) std::printf("RESULT bench=dynamic_overhead case=%s ns=%.1f\n", r.name, r.ns);
  return sink == 12345.0f ? 1 : 0;
}
