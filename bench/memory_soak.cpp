// Memory over a long run: trains examples/mnist_cnn's network (Conv 32 3x3 - ReLU - Conv 64 3x3 - ReLU - MaxPool 2 -
// Dropout 0.5 - Flatten - Dense 128 ReLU - Dense 10, Adam, batch 64) in static and in dynamic mode for a long loop of
// steps on synthetic data of MNIST's shape (random images and labels: no data set needed), and reads the resident set
// size (/proc/self/statm) every --every steps. Every --eval-every steps it also evaluates and predicts through
// kiln::Model on held-out samples, and every --save-every steps saves the weights to a temporary file: memory that the
// step, the evaluation, the prediction or the save keeps each time shows as growth. Each periodic call also runs
// after the first two steps, so that the memory it holds in the steady state is there before the warm-up ends: twice,
// because glibc's malloc serves a large block from mmap until one has been freed and from its heap after that, where
// the memory stays resident once freed.
// Beside the RSS it reads the heap in use (glibc's mallinfo2), where a leak shows before it outgrows the free memory
// malloc keeps resident. The baselines are the values at the end of warm-up (the first 5% of the steps); a mode fails
// when its final RSS or heap in use exceeds its baseline by more than --limit percent, and the program then exits
// with status 1, so that it can serve as a check.
// Each mode runs in a process of its own, so that neither finds memory the other freed.
//
//   memory_soak [--mode static|dynamic|both] [--steps 1500] [--every 50] [--eval-every 100] [--save-every 100]
//               [--batch 64] [--threads 1] [--limit 1]
#include <malloc.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../examples/common.hpp"
#include "../examples/mnist_cnn_net.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/io/weights.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;

namespace {

using static_cnn = examples::static_mnist_cnn;
using examples::dynamic_mnist_cnn;

struct soak_options {
  long long steps = 1500, every = 50, eval_every = 100, save_every = 100;
  index_t batch = 64;
  double limit_percent = 1;
};

// The resident set size in MiB: the second field of /proc/self/statm, in pages.
double resident_mib() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (!statm) fail("memory_soak: cannot open /proc/self/statm");
  long long size = 0, resident = 0;
  const int fields = std::fscanf(statm, "%lld %lld", &size, &resident);
  std::fclose(statm);
  if (fields != 2) fail("memory_soak: cannot read the resident set size from /proc/self/statm");
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

// The bytes malloc has handed out and not had back (glibc's mallinfo2: its heaps' blocks in use plus its mmapped
// blocks), in MiB. A leak shows here at once, where the RSS may not move until the leak outgrows the memory that
// malloc keeps resident but free; -1 where the C library does not say.
double heap_in_use_mib() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 info = ::mallinfo2();
  return static_cast<double>(info.uordblks + info.hblkhd) / (1024.0 * 1024.0);
#else
  return -1;
#endif
}

// Random images of MNIST's shape (N, 1, 28, 28) and labels in [0, 10).
struct synthetic_set {
  Tensor<float> x;
  Tensor<std::int64_t> y;
  synthetic_set(index_t n, std::uint64_t seed) : x(shape{n, 1, 28, 28}), y(shape{n}) {
    random_generator rng(seed);
    for (float& v : x.span()) v = rng.normal<float>();
    for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(10));
  }
};

// One quantity sampled after warm-up: its value at the end of warm-up (the baseline), the last and the largest.
struct samples_after_warm_up {
  double baseline = -1, last = 0, max = 0;
  void add(double value) {
    if (baseline < 0) baseline = value;
    last = value;
    max = std::max(max, value);
  }
  double growth_percent() const { return (last - baseline) / baseline * 100; }
  double max_growth_percent() const { return (max - baseline) / baseline * 100; }
};

// Trains with step(x, y) (one training step on a batch, returning its loss) for options.steps steps, cycling over
// the training batches, with the periodic evaluation, prediction and save through model; prints the table and the
// summary; returns whether the final RSS and heap in use stayed within the limit of their values after warm-up.
template <class Net, class Step>
bool soak(const char* mode, Net& net, Step&& step, const soak_options& options) {
  const synthetic_set train(32 * options.batch, 1), held_out(512, 2);
  Model model(net);
  model.compile(optim::Adam(), loss::cross_entropy{}, {metric::accuracy});
  const auto weights_file = std::filesystem::temp_directory_path() /
                            ("kiln_memory_soak_" + std::to_string(::getpid()) + "_" + mode + ".safetensors");
  const index_t batches = train.x.extent(0) / options.batch;
  const long long warm_up = std::max(1LL, options.steps * 5 / 100);
  auto due = [](long long s, long long period) { return period > 0 && (s <= 2 || s % period == 0); };

  std::printf("\n%s mode: %lld steps of batch %lld, memory every %lld steps; evaluate + predict every %lld, "
              "save_weights every %lld; warm-up %lld steps\n",
              mode, options.steps, static_cast<long long>(options.batch), options.every, options.eval_every,
              options.save_every, warm_up);
  std::printf("  %8s %10s %10s %10s %10s\n", "step", "RSS MiB", "heap MiB", "loss", "eval loss");
  samples_after_warm_up rss, heap;
  double eval_loss = 0, train_loss = 0;
  std::printf("  %8d %10.2f %10.2f\n", 0, resident_mib(), heap_in_use_mib());
  const auto start = std::chrono::steady_clock::now();
  for (long long s = 1; s <= options.steps; ++s) {
    const index_t first = static_cast<index_t>((s - 1) % batches) * options.batch;
    train_loss = step(train.x.rows(first, options.batch), train.y.rows(first, options.batch));
    if (due(s, options.eval_every)) {
      eval_loss = model.evaluate(held_out.x, held_out.y, options.batch).loss;
      const Tensor<float> predicted = model.predict(held_out.x.rows(0, 256));
      if (predicted.extent(0) != 256) fail("memory_soak: predict returned ", predicted.extent(0), " rows for 256");
    }
    if (due(s, options.save_every)) io::save_weights(net, weights_file);
    if (s % options.every == 0 || s == options.steps || s == warm_up) {
      const double resident = resident_mib(), in_use = heap_in_use_mib();
      if (s >= warm_up) {
        rss.add(resident);
        heap.add(in_use);
      }
      std::printf("  %8lld %10.2f %10.2f %10.4f %10.4f\n", s, resident, in_use, train_loss, eval_loss);
      std::fflush(stdout);
    }
  }
  const double seconds = examples::seconds_since(start);
  std::filesystem::remove(weights_file);
  const bool heap_known = heap.baseline > 0;
  const bool flat = rss.growth_percent() <= options.limit_percent &&
                    (!heap_known || heap.growth_percent() <= options.limit_percent);
  std::printf("%s mode: %.1f s (%.2f ms/step); after warm-up (step %lld) -> final, max:\n", mode, seconds,
              seconds * 1e3 / static_cast<double>(options.steps), warm_up);
  std::printf("  RSS          %8.2f -> %8.2f MiB, max %8.2f MiB: growth %+.3f%% (max %+.3f%%)\n", rss.baseline,
              rss.last, rss.max, rss.growth_percent(), rss.max_growth_percent());
  if (heap_known)
    std::printf("  heap in use  %8.2f -> %8.2f MiB, max %8.2f MiB: growth %+.3f%% (max %+.3f%%)\n", heap.baseline,
                heap.last, heap.max, heap.growth_percent(), heap.max_growth_percent());
  std::printf("  %s (limit %.2f%%)\n", flat ? "flat" : "GROWS", options.limit_percent);
  std::printf("RESULT bench=memory_soak mode=%s steps=%lld warmup_rss_mib=%.2f final_rss_mib=%.2f max_rss_mib=%.2f "
              "growth_percent=%.3f max_growth_percent=%.3f warmup_heap_mib=%.2f final_heap_mib=%.2f "
              "heap_growth_percent=%.3f\n",
              mode, options.steps, rss.baseline, rss.last, rss.max, rss.growth_percent(), rss.max_growth_percent(),
              heap.baseline, heap.last, heap_known ? heap.growth_percent() : 0.0);
  return flat;
}

bool soak_static(const soak_options& options) {
  static_cnn net(options.batch, 42);
  optim::Adam opt;
  return soak(
      "static", net,
      [&](tensor_view<const float> x, tensor_view<const std::int64_t> y) {
        return net.train_step(x, y, loss::cross_entropy{}, opt);
      },
      options);
}

bool soak_dynamic(const soak_options& options) {
  auto net = dynamic_mnist_cnn(42);
  optim::Adam opt(net.parameters());
  return soak(
      "dynamic", net,
      [&](tensor_view<const float> x, tensor_view<const std::int64_t> y) {
        opt.zero_grad();
        auto loss = nn::cross_entropy(net(nn::Variable::borrowing(x)), y.span());
        loss.backward();
        opt.step();
        return loss.item();
      },
      options);
}

// Runs one mode in a child process; true when it ran and stayed flat.
bool soak_in_child(bool (*run)(const soak_options&), const soak_options& options) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) fail("memory_soak: fork failed");
  if (pid == 0) {
    int status = 1;
    try {
      status = run(options) ? 0 : 1;
    } catch (const kiln::error& e) {
      std::fprintf(stderr, "memory_soak: %s\n", e.what());
    }
    std::fflush(stdout);
    ::_exit(status);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) fail("memory_soak: waiting for the child failed");
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv,
                        {"--mode", "--steps", "--every", "--eval-every", "--save-every", "--batch", "--limit"});
  const std::string mode = flags.get("--mode", "both");
  if (mode != "static" && mode != "dynamic" && mode != "both")
    fail("memory_soak: expected --mode static|dynamic|both, found ", mode);
  soak_options options;
  options.steps = flags.get_int("--steps", options.steps);
  options.every = flags.get_int("--every", options.every);
  options.eval_every = flags.get_int("--eval-every", options.eval_every);
  options.save_every = flags.get_int("--save-every", options.save_every);
  options.batch = static_cast<index_t>(flags.get_int("--batch", options.batch));
  options.limit_percent = flags.get_double("--limit", options.limit_percent);
  if (options.steps < 1 || options.every < 1 || options.batch < 1)
    fail("memory_soak: expected --steps, --every and --batch >= 1");
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  set_num_threads(threads);
  std::printf("memory_soak: MNIST CNN on synthetic data, %d thread%s, %s; limit %.2f%% growth after warm-up\n", threads,
              threads == 1 ? "" : "s", examples::products_description().c_str(), options.limit_percent);
  bool flat = true;
  if (mode != "dynamic") flat &= soak_in_child(soak_static, options);
  if (mode != "static") flat &= soak_in_child(soak_dynamic, options);
  return flat ? 0 : 1;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "memory_soak: %s\n", e.what());
  return 1;
}
