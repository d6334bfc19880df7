// Attention's memory against the sequence length: the peak of heap bytes in use during one forward and backward of
// nn::scaled_dot_product_attention (the tiled kernel, which keeps a tile of scores per thread) and of the same
// attention composed of matmul, softmax and matmul (which holds the whole [L, L] score matrix and its gradient),
// for causal self-attention over 4 heads of width 32, one sequence, L from 256 to 4096. Each measurement runs in a
// process of its own (this program with --length and --variant), which reports how far one forward and backward
// raised its peak resident memory above what it held before them (the inputs, the upstream gradient, the program):
// memory the step touched, whoever allocated it.
//
//   attention_memory [--max-length 4096] [--naive-max-length 2048] [--threads 1]
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "../examples/common.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

constexpr index_t heads = 4, head_dim = 32;

long long peak_resident_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;  // KiB on Linux
}

// One forward and backward of attention over q, k, v [1, heads, L, head_dim] in this process: prints the rise of the
// peak resident memory in KiB and the time in ms.
template <class Attend>
void measure_here(index_t length, Attend attend) {
  random_generator rng(static_cast<std::uint64_t>(length));
  auto values = [&] {
    Tensor<float> t(shape{1, heads, length, head_dim});
    for (auto& v : t.span()) v = rng.normal<float>();
    return t;
  };
  nn::Variable q(values(), true), k(values(), true), v(values(), true);
  const nn::Variable upstream(values());
  const long long before = peak_resident_kib();
  const auto start = std::chrono::steady_clock::now();
  nn::sum(nn::mul(attend(q, k, v), upstream)).backward();
  const double ms = 1e3 * examples::seconds_since(start);
  std::printf("%lld %.3f\n", peak_resident_kib() - before, ms);
}

nn::Variable tiled(const nn::Variable& q, const nn::Variable& k, const nn::Variable& v) {
  return nn::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
}

nn::Variable composed(const nn::Variable& q, const nn::Variable& k, const nn::Variable& v) {
  const index_t length = q.shape()[2];
  Tensor<float> later(shape{length, length});
  for (index_t i = 0; i < length; ++i)
    for (index_t j = i + 1; j < length; ++j) later[i * length + j] = 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  nn::Variable scores = nn::mul(nn::matmul(q, nn::transpose(k, -2, -1)), scale);
  scores = nn::masked_fill(scores, nn::Variable(later), -INFINITY);
  return nn::matmul(nn::softmax(scores, -1), v);
}

}  // namespace

// Runs this program for one measurement and reads back its KiB and ms.
bool measure_in_child(const char* self, index_t length, const char* variant, int threads, double& mib, double& ms) {
  const std::string command = std::string(self) + " --length " + std::to_string(length) + " --variant " + variant +
                              " --threads " + std::to_string(threads);
  std::unique_ptr<FILE, int (*)(FILE*)> child(popen(command.c_str(), "r"), pclose);
  long long kib = 0;
  if (!child || std::fscanf(child.get(), "%lld %lf", &kib, &ms) != 2) return false;
  mib = static_cast<double>(kib) / 1024.0;
  return true;
}

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--max-length", "--naive-max-length", "--length", "--variant"});
  const index_t max_length = flags.get_int("--max-length", 4096);
  const index_t naive_max = flags.get_int("--naive-max-length", 2048);
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  set_num_threads(threads);
  if (flags.has("--length")) {
    const std::string variant = flags.get("--variant", "tiled");
    if (variant != "tiled" && variant != "composed") fail("--variant: expected tiled or composed, found ", variant);
    variant == "tiled" ? measure_here(flags.get_int("--length", 0), tiled)
                       : measure_here(flags.get_int("--length", 0), composed);
    return 0;
  }
  std::printf("causal self-attention, %lld heads of width %lld, one sequence, forward + backward, %d thread%s\n"
              "peak resident memory the step added, each measured in a fresh process\n",
              static_cast<long long>(heads), static_cast<long long>(head_dim), threads, threads == 1 ? "" : "s");
  std::printf("%8s  %10s %10s %10s  %13s %12s\n", "length", "tiled MiB", "KiB/token", "tiled ms", "composed MiB",
              "composed ms");
  for (index_t length = 256; length <= max_length; length *= 2) {
    double mib = 0, ms = 0;
    if (!measure_in_child(argv[0], length, "tiled", threads, mib, ms)) fail("the measurement at ", length, " failed");
    std::printf("%8lld  %10.2f %10.2f %10.1f", static_cast<long long>(length), mib,
                1024.0 * mib / static_cast<double>(length), ms);
    if (length <= naive_max && measure_in_child(argv[0], length, "composed", threads, mib, ms))
      std::printf("  %13.2f %12.1f\n", mib, ms);
    else
      std::printf("  %13s %12s\n", "-", "-");
    std::fflush(stdout);
  }
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "attention_memory: %s\n", e.what());
  return 1;
}
