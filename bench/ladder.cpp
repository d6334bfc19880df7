// The cost-of-dynamism ladder (docs/design.md): one workload, the same initial weights and the same batches, run on
// rungs from most dynamic to most static, each switching on one thing so that each difference in time has one cause:
//   1 dynamic eager       tape, heap tensors from the system allocator, per-op dispatch, per-parameter optimizer
//   2 dynamic + cache     the caching allocator: no malloc in the steady state
//   3 static unfused      compile-time graph and planned workspace, the same per-op kernels as rung 2
//   4 static + fusion     bias and activation inside the GEMM's epilogue (and a Dense layer's backward taking in
//                         the ReLU's backward of the Dense layer below it)
//   5 static + flat       one optimizer update over one flat parameter buffer
//   7 static, fused step  the whole training step in one parallel region, on mnist_mlp only (kiln::fused_mlp_trainer:
//                         models of the form Dense<Hidden, ReLU> - Dense<Out> with cross-entropy and Adam)
// (6, the captured step graph, is a GPU rung; bench/cuda/mnist_gpu runs the MNIST MLP on it and on the GPU's rung 7,
// gpu_graph and gpu_fused_async, beside rungs 2 and 5 on the GPU.)
// Before any time is reported, every rung's losses over the first steps must be identical to rung 1's: they run the
// same kernels on the same numbers, so anything else is a bug. On mnist_mlp a data loader assembles each batch right
// before its step and the two are timed apart, as the peers (bench/peers) time their index_select and step.
//
//   ladder [--threads N] [--workload seed_regression|mnist_mlp|wide_mlp|tiny_op|mnist_cnn|lstm|resnet|all] [--reps 5]
//          [--data DIR] [--quick] [--batches-ready] [--precision single|bf16x3|bf16]
// --precision bf16: every rung's products take bfloat16 operands (kernels::cpu::set_default_product_precision);
// bf16x3: each operand as two bfloat16 values.
// --batches-ready: mnist_mlp's batches too are assembled before timing, so that each step reads its batch from memory.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "../examples/common.hpp"
#include "../examples/tiny_gpt_net.hpp"
#include "mnist_nets.hpp"
#include "kiln/data/data.hpp"
#include "kiln/data/text.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

namespace {
std::atomic<long long> heap_allocations{0};
}
// The replacements pair malloc with free on purpose; GCC's heuristic cannot see that both sides are replaced.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t bytes) {
  heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace kiln;

namespace {

// Heap allocations so far: operator new plus the dynamic storage blocks taken from the system allocator.
long long allocations_now() {
  return heap_allocations.load() + static_cast<long long>(nn::caching_allocator_stats().system_allocations);
}

// One rung of one workload: step() trains on batch i and returns the loss.
struct rung {
  int number;
  const char* name;
  std::function<float(std::size_t batch)> step;
};

struct measurement {
  double median_us = 0, mean_us = 0, min_us = 0, max_us = 0, allocations_per_step = 0;
  double data_us = -1;  // median time to assemble a batch, where a loader assembles one before each step
};

measurement summarise(std::vector<double>& times, long long allocations, long long steps) {
  measurement m;
  for (double t : times) m.mean_us += t / double(times.size());
  std::sort(times.begin(), times.end());
  m.median_us = times[times.size() / 2];
  m.min_us = times.front();
  m.max_us = times.back();
  m.allocations_per_step = double(allocations) / double(steps);
  return m;
}

// Times every rung `reps` times, `steps` consecutive steps each, after a warm-up. The repetitions are interleaved
// (rung 1, 2, ..., 5, then again) so that the clock drift of a shared machine, which over a minute reaches 20%, falls
// on every rung alike instead of on whichever ran last; the ratios between rungs are then measured side by side.
//
// Without `assemble` the batches are ready before timing, and a rung's time is the median over repetitions of the
// mean step. With it (a workload read through a data loader), assemble(i) puts batch i together right before step i,
// as the peers' index_select does, and the two are timed apart, as the peers time them: each step alone, a rung's time
// being the median over all its steps, and assembling apart (data_us). The step then finds its batch in the cache
// where the assembling left it, as every peer's step does.
std::vector<measurement> measure_all(std::vector<rung>& rungs, std::size_t batches, long long steps, int reps,
                                     const std::function<void(std::size_t)>& assemble) {
  const auto ready = [&](std::size_t i) {
    if (assemble) assemble(i);
  };
  for (auto& r : rungs)
    for (long long i = 0; i < std::min<long long>(steps, 20); ++i) {
      ready(static_cast<std::size_t>(i) % batches);
      r.step(static_cast<std::size_t>(i) % batches);
    }
  const std::size_t samples = static_cast<std::size_t>(reps) * (assemble ? static_cast<std::size_t>(steps) : 1);
  std::vector<std::vector<double>> step_times(rungs.size()), data_times(rungs.size());
  for (auto& times : step_times) times.reserve(samples);  // no allocation of ours is counted
  for (auto& times : data_times) times.reserve(samples);
  std::vector<long long> allocations(rungs.size(), 0);
  for (int rep = 0; rep < reps; ++rep)
    for (std::size_t k = 0; k < rungs.size(); ++k) {
      ready(0);
      rungs[k].step(0);  // untimed: refills what the previous rung's run evicted (caches, the caching allocator)
      if (assemble) {
        for (long long i = 0; i < steps; ++i) {
          const auto batch = static_cast<std::size_t>(i) % batches;
          const auto assembling = std::chrono::steady_clock::now();
          assemble(batch);
          const auto stepping = std::chrono::steady_clock::now();
          const long long allocations_before = allocations_now();
          rungs[k].step(batch);
          const auto done = std::chrono::steady_clock::now();
          allocations[k] += allocations_now() - allocations_before;
          data_times[k].push_back(std::chrono::duration<double, std::micro>(stepping - assembling).count());
          step_times[k].push_back(std::chrono::duration<double, std::micro>(done - stepping).count());
        }
      } else {
        const long long allocations_before = allocations_now();
        auto start = std::chrono::steady_clock::now();
        for (long long i = 0; i < steps; ++i) rungs[k].step(static_cast<std::size_t>(i) % batches);
        const double seconds = examples::seconds_since(start);
        allocations[k] += allocations_now() - allocations_before;
        step_times[k].push_back(seconds * 1e6 / double(steps));
      }
    }
  std::vector<measurement> result(rungs.size());
  for (std::size_t k = 0; k < rungs.size(); ++k) {
    result[k] = summarise(step_times[k], allocations[k], steps * reps);
    if (assemble) result[k].data_us = summarise(data_times[k], 0, 1).median_us;
  }
  return result;
}

// The batches of a workload, as plain views (static mode) and as dynamic variables. Either all are made once, before
// timing, the way a PyTorch user holds preloaded tensors, or `assemble` (set where a data loader reads the workload's
// data) makes entry i from the loader's next batch right before step i, and is timed apart from the step.
template <class Target>
struct batch_set {
  std::vector<tensor_view<const float>> x;
  std::vector<tensor_view<const Target>> y;
  std::vector<nn::Variable> x_var, y_var;
  std::function<void(std::size_t)> assemble;
};

// The convolutional workloads' batches: the first `count` of xs, each reshaped to 1 x 28 x 28 images, with their
// labels in ys. out.batches views out.images and ys, which must outlive it.
struct image_batches {
  std::vector<Tensor<float>> images;
  batch_set<std::int64_t> batches;
};
void view_as_images(const std::vector<Tensor<float>>& xs, const std::vector<Tensor<std::int64_t>>& ys,
                    std::size_t count, image_batches& out) {
  out.images.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    out.images.push_back(xs[i]);
    out.images.back().reshape(shape{xs[i].extent(0), 1, 28, 28});
  }
  for (std::size_t i = 0; i < count; ++i) {
    out.batches.x.push_back(out.images[i].view());
    out.batches.y.push_back(ys[i].view());
    out.batches.x_var.emplace_back(out.images[i]);
  }
}

// Static mode's rungs: the options each adds.
struct static_rung {
  int number;
  const char* name;
  static_options options;
};
constexpr static_rung static_rungs[] = {
    {3, "static unfused", {.fuse_epilogues = false, .flat_parameters = false}},
    {4, "static + fused epilogues", {.fuse_epilogues = true, .flat_parameters = false}},
    {5, "static + flat parameters", {.fuse_epilogues = true, .flat_parameters = true}}};

template <class StaticNet, class Target, class Loss>
std::vector<rung> make_rungs(std::uint64_t seed, index_t max_batch, std::function<nn::Sequential()> make_dynamic,
                             batch_set<Target>& batches, Loss loss, std::vector<std::shared_ptr<void>>& keep) {
  std::vector<rung> rungs;
  for (bool caching : {false, true}) {
    auto model = std::make_shared<nn::Sequential>(make_dynamic());
    auto opt = std::make_shared<optim::Adam>(model->parameters(), optim::adam_options{.lr = 1e-3});
    keep.push_back(model);
    keep.push_back(opt);
    rungs.push_back({caching ? 2 : 1, caching ? "dynamic + caching allocator" : "dynamic eager",
                     [model, opt, caching, &batches, loss](std::size_t b) {
                       nn::set_caching_allocator(caching);
                       opt->zero_grad();
                       nn::Variable out = (*model)(batches.x_var[b]);
                       nn::Variable l;
                       if constexpr (std::is_integral_v<Target>) l = nn::cross_entropy(out, batches.y[b].span(), loss.reduce);
                       else l = nn::mse_loss(out, batches.y_var[b], loss.reduce);
                       l.backward();
                       opt->step();
                       return l.item();
                     }});
  }
  for (const static_rung& spec : static_rungs) {
    auto net = std::make_shared<StaticNet>(max_batch, seed, spec.options);
    auto opt = std::make_shared<optim::Adam>(optim::adam_options{.lr = 1e-3});
    keep.push_back(net);
    keep.push_back(opt);
    rungs.push_back({spec.number, spec.name, [net, opt, &batches, loss](std::size_t b) {
                       return net->train_step(batches.x[b], batches.y[b], loss, *opt);
                     }});
  }
  // Rung 7 on the CPU, for the models it takes (Dense<Hidden, ReLU> - Dense<Out> with cross-entropy): the whole
  // step in one parallel region (kiln::fused_mlp_trainer), the same bits as rung 5.
  if constexpr (detail::fused_mlp_layout<StaticNet>::matches && std::is_integral_v<Target> &&
                std::is_same_v<Loss, loss::cross_entropy>) {
    auto net = std::make_shared<StaticNet>(max_batch, seed);
    auto trainer = std::make_shared<fused_mlp_trainer<StaticNet>>(*net, optim::adam_options{.lr = 1e-3});
    keep.push_back(net);
    keep.push_back(trainer);
    rungs.push_back({7, "static + fused step (CPU)", [trainer, &batches](std::size_t b) {
                       return trainer->train_step(batches.x[b], batches.y[b]);
                     }});
  }
  return rungs;
}

// The transformer's rungs: examples/tiny_gpt's model at its default size from seed 1, AdamW(lr 2e-3, weight decay
// 0.01), the mean cross-entropy of the logits [N, L, 256] against the next tokens over all N * L positions; in dynamic
// mode without and with the caching allocator, then static mode's StaticTinyGPT (the same weights from the same
// seed) with the static rungs' options.
std::vector<rung> make_transformer_rungs(batch_set<std::int64_t>& batches, std::vector<std::shared_ptr<void>>& keep) {
  std::vector<rung> rungs;
  for (bool caching : {false, true}) {
    manual_seed(1);
    auto model = std::make_shared<examples::TinyGPT>(examples::gpt_options{});
    auto opt = std::make_shared<optim::AdamW>(model->parameters(),
                                              optim::adamw_options{.lr = 2e-3, .weight_decay = 0.01});
    keep.push_back(model);
    keep.push_back(opt);
    rungs.push_back({caching ? 2 : 1, caching ? "dynamic + caching allocator" : "dynamic eager",
                     [model, opt, caching, &batches](std::size_t b) {
                       nn::set_caching_allocator(caching);
                       opt->zero_grad();
                       const nn::Variable logits = (*model)(batches.x_var[b]);
                       const index_t rows = logits.shape()[0] * logits.shape()[1];
                       nn::Variable l = nn::cross_entropy(nn::view(logits, {rows, logits.shape()[2]}),
                                                          batches.y[b].span());
                       l.backward();
                       opt->step();
                       return l.item();
                     }});
  }
  using StaticGpt = examples::StaticTinyGPT<4, 128, 4, 128>;
  static_assert(examples::gpt_options{}.layers == 4 && examples::gpt_options{}.width == 128 &&
                examples::gpt_options{}.heads == 4 && examples::gpt_options{}.context == 128);
  for (const static_rung& spec : static_rungs) {
    auto net = std::make_shared<StaticGpt>(32, 1, spec.options);
    auto opt = std::make_shared<optim::AdamW>(optim::adamw_options{.lr = 2e-3, .weight_decay = 0.01});
    keep.push_back(net);
    keep.push_back(opt);
    rungs.push_back({spec.number, spec.name, [net, opt, &batches](std::size_t b) {
                       return net->train_step(batches.x[b], batches.y[b], loss::cross_entropy{}, *opt);
                     }});
  }
  return rungs;
}

struct workload_result {
  std::string name;
  std::vector<std::pair<rung*, measurement>> rows;
};

// Checks that every rung gives rung 1's losses for the first steps (check_steps of them; 0: three passes over the
// batches, at most 30 steps), then measures each rung.
template <class Target>
bool run_workload(const std::string& name, std::vector<rung>& rungs, batch_set<Target>& batches, long long steps,
                  int reps, int threads, const char* unit_note, std::size_t check_steps = 0) {
  if (check_steps == 0) check_steps = std::min<std::size_t>(30, batches.x.size() * 3);
  std::vector<std::vector<float>> losses(rungs.size());
  for (std::size_t r = 0; r < rungs.size(); ++r)
    for (std::size_t i = 0; i < check_steps; ++i) {
      if (batches.assemble) batches.assemble(i % batches.x.size());
      losses[r].push_back(rungs[r].step(i % batches.x.size()));
    }
  for (std::size_t r = 1; r < rungs.size(); ++r)
    if (losses[r] != losses[0]) {
      std::printf("%s: rung %d (%s) gives losses different from rung 1 — refusing to report times\n", name.c_str(),
                  rungs[r].number, rungs[r].name);
      for (std::size_t i = 0; i < check_steps; ++i)
        if (losses[r][i] != losses[0][i]) {
          std::printf("  first difference at step %zu: %.9g vs %.9g\n", i, losses[r][i], losses[0][i]);
          break;
        }
      return false;
    }
  std::printf("\n%s (%s; %zu steps: losses identical on all rungs, last %.6f)\n", name.c_str(), unit_note, check_steps,
              losses[0].back());
  std::printf("  %-2s %-28s %12s %10s %10s %12s %10s\n", "#", "rung", "median us", "min", "max", "allocs/step",
              "vs above");
  double above = 0;
  const auto measurements = measure_all(rungs, batches.x.size(), steps, reps, batches.assemble);
  for (std::size_t k = 0; k < rungs.size(); ++k) {
    const auto& r = rungs[k];
    const auto& m = measurements[k];
    double ratio = above > 0 ? m.median_us / above : 1.0;
    std::printf("  %-2d %-28s %12.3f %10.3f %10.3f %12.2f %9.2fx\n", r.number, r.name, m.median_us, m.min_us,
                m.max_us, m.allocations_per_step, ratio);
    std::printf("RESULT bench=ladder workload=%s rung=%d threads=%d step_us=%.3f mean_us=%.3f min_us=%.3f "
                "max_us=%.3f data_us=%.2f allocs_per_step=%.2f ratio_to_above=%.3f precision=%s\n",
                name.c_str(), r.number, threads, m.median_us, m.mean_us, m.min_us, m.max_us, m.data_us,
                m.allocations_per_step, ratio,
                kernels::cpu::product_precision_name(kernels::cpu::default_product_precision()));
    above = m.median_us;
  }
  if (measurements[0].data_us >= 0) {
    std::printf("  (each batch assembled by the data loader right before its step, timed apart: median %.2f us;\n"
                "   mean step, which a step the VM stalls for milliseconds moves:",
                measurements[0].data_us);
    for (const auto& m : measurements) std::printf(" %.1f", m.mean_us);
    std::printf(" us)\n");
  }
  return true;
}

Tensor<float> random_tensor(shape s, random_generator& rng) {
  Tensor<float> t(s);
  for (auto& v : t.span()) v = rng.normal<float>();
  return t;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--batches-ready", "--data", "--quick", "--reps", "--workload"});
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  int reps = static_cast<int>(flags.get_int("--reps", 5));
  bool quick = flags.has("--quick");
  const bool batches_ready = flags.has("--batches-ready");
  std::string only = flags.get("--workload", "all");
  set_num_threads(threads);
  std::printf("kiln ladder: %d thread%s, median of %d repetitions; %s\n", threads, threads == 1 ? "" : "s", reps,
              examples::products_description().c_str());
  std::vector<std::shared_ptr<void>> keep;
  bool ok = true;
  random_generator rng(2024);

  if (only == "all" || only == "seed_regression") {
    batch_set<float> b;
    auto x = random_tensor(shape{1000, 100}, rng), y = random_tensor(shape{1000, 1}, rng);
    b.x = {x.view()};
    b.y = {y.view()};
    b.x_var = {nn::Variable(x)};
    b.y_var = {nn::Variable(y)};
    using Net = Sequential<policy::cpu, Input<100>, Dense<10, ReLU>, Dense<1>>;
    auto rungs = make_rungs<Net, float>(
        1, 1000, [] { manual_seed(1); return nn::Sequential(nn::Linear(100, 10), nn::ReLU(), nn::Linear(10, 1)); }, b,
        loss::mse{}, keep);
    ok &= run_workload("seed_regression", rungs, b, quick ? 100 : 400, reps, threads, "1000x100 full batch, MSE, Adam");
  }
  if (only == "all" || only == "tiny_op") {
    // 64 different samples in turn: a model fitting one fixed sample drives its gradients, and so Adam's moments, into
    // denormal numbers, whose arithmetic is ~100x slower and would be measured instead of the dispatch cost.
    batch_set<float> b;
    std::vector<Tensor<float>> xs, ys;
    for (int i = 0; i < 64; ++i) {
      xs.push_back(random_tensor(shape{1, 8}, rng));
      ys.push_back(random_tensor(shape{1, 8}, rng));
    }
    for (std::size_t i = 0; i < xs.size(); ++i) {
      b.x.push_back(xs[i].view());
      b.y.push_back(ys[i].view());
      b.x_var.emplace_back(xs[i]);
      b.y_var.emplace_back(ys[i]);
    }
    using Net = Sequential<policy::cpu, Input<8>, Dense<8>>;
    auto rungs = make_rungs<Net, float>(
        1, 1, [] { manual_seed(1); return nn::Sequential(nn::Linear(8, 8)); }, b, loss::mse{}, keep);
    ok &= run_workload("tiny_op", rungs, b, quick ? 20000 : 100000, reps, threads,
                       "Linear(8,8) on 1x8: forward, MSE, backward, Adam");
  }
  if (only == "all" || only == "wide_mlp") {
    batch_set<std::int64_t> b;
    std::vector<Tensor<float>> xs;
    std::vector<Tensor<std::int64_t>> ys;
    for (int i = 0; i < 8; ++i) {
      xs.push_back(random_tensor(shape{256, 784}, rng));
      ys.emplace_back(shape{256});
      for (auto& l : ys.back().span()) l = static_cast<std::int64_t>(rng.below(10));
    }
    for (int i = 0; i < 8; ++i) {
      b.x.push_back(xs[static_cast<std::size_t>(i)].view());
      b.y.push_back(ys[static_cast<std::size_t>(i)].view());
      b.x_var.emplace_back(xs[static_cast<std::size_t>(i)]);
    }
    using Net = Sequential<policy::cpu, Input<784>, Dense<1024, ReLU>, Dense<1024, ReLU>, Dense<10>>;
    auto rungs = make_rungs<Net, std::int64_t>(
        1, 256,
        [] {
          manual_seed(1);
          return nn::Sequential(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(),
                                nn::Linear(1024, 10));
        },
        b, loss::cross_entropy{}, keep);
    ok &= run_workload("wide_mlp", rungs, b, quick ? 5 : 20, reps, threads, "784-1024-1024-10, batch 256, CE, Adam");
  }
  const bool mnist_workloads = only == "all" || only == "mnist_mlp" || only == "mnist_cnn" || only == "lstm";
  std::optional<data::tensor_dataset<float, std::int64_t>> train;
  std::vector<Tensor<float>> xs;
  std::vector<Tensor<std::int64_t>> ys;
  // One epoch's batches in a seeded shuffled order.
  const data::loader_options<float> mnist_order{.batch_size = 64, .shuffle = true, .seed = 5};
  if (mnist_workloads) {
    auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
    train = data::load_mnist(dir, data::split::train,
                             {.scale = true, .mean = data::mnist_mean, .std = data::mnist_std});
    // The CNN and the LSTM cycle over the epoch's first batches, assembled before timing: a step of theirs takes
    // milliseconds, against the few microseconds of copying a batch.
    data::data_loader loader(*train, mnist_order);
    for (const auto& batch : loader.epoch(0)) {
      xs.emplace_back(batch.x);
      ys.emplace_back(batch.y);
    }
  }
  if (only == "all" || only == "mnist_mlp") {
    // A data loader puts each batch together right before its step (timed apart), as the peers' index_select does:
    // the MLP's step takes ~150 us, and one that read a batch assembled long before would read it from memory
    // (~11 us of the step, docs/benchmarks.md) where the peers' steps find theirs in the cache.
    // The loader copies on the bench's threads, each its own rows of the batch (data_loader.hpp).
    data::loader_options<float> mlp_order = mnist_order;
    mlp_order.threads = threads;
    auto loader = std::make_shared<data::data_loader<data::tensor_dataset<float, std::int64_t>>>(*train, mlp_order);
    keep.push_back(loader);
    auto b = std::make_shared<batch_set<std::int64_t>>();
    keep.push_back(b);
    b->x.resize(xs.size());
    b->y.resize(xs.size());
    b->x_var.resize(xs.size());
    if (batches_ready) {
      // --batches-ready: every batch assembled before timing, as the other workloads' are (the same timing per
      // step, so that the difference is where the step finds its batch).
      for (std::size_t i = 0; i < xs.size(); ++i) {
        b->x[i] = xs[i].view();
        b->y[i] = ys[i].view();
        b->x_var[i] = nn::Variable::borrowing(xs[i]);
      }
      b->assemble = [](std::size_t) {};
    } else {
      b->assemble = [loader, b = b.get(), next = std::size_t{0}](std::size_t i) mutable {
        if (i == 0 || i != next) {
          loader->start_epoch(0);
          for (std::size_t k = 0; k < i; ++k) loader->next();
        }
        const auto* batch = loader->next();
        b->x[i] = batch->x;
        b->y[i] = batch->y;
        b->x_var[i] = nn::Variable::borrowing(batch->x);  // read where the loader put it, as the static rungs do
        next = i + 1;
      };
    }
    using Net = bench::mnist_mlp_net;
    auto rungs = make_rungs<Net, std::int64_t>(
        1, 64,
        [] { manual_seed(1); return nn::Sequential(nn::Flatten(), nn::Linear(784, 128), nn::ReLU(), nn::Linear(128, 10)); },
        *b, loss::cross_entropy{}, keep);
    long long steps = quick ? 200 : static_cast<long long>(xs.size());
    ok &= run_workload("mnist_mlp", rungs, *b, steps, reps, threads,
                       quick ? "batch 64, Adam, 200 steps of MNIST" : "batch 64, Adam, one epoch of MNIST (938 steps)");
  }
  if (only == "all" || only == "mnist_cnn") {
    // examples/mnist_cnn's network without its dropout: Conv 32 3x3 - ReLU - Conv 64 3x3 - ReLU - MaxPool 2 -
    // Flatten - Dense 128 ReLU - Dense 10, on the first batches of the same epoch, as 1 x 28 x 28 images.
    image_batches images;
    view_as_images(xs, ys, std::min<std::size_t>(xs.size(), 32), images);
    auto& b = images.batches;
    using Net = bench::mnist_cnn_net;
    auto rungs = make_rungs<Net, std::int64_t>(
        1, 64,
        [] {
          manual_seed(1);
          return nn::Sequential(nn::Conv2d(1, 32, 3), nn::ReLU(), nn::Conv2d(32, 64, 3), nn::ReLU(), nn::MaxPool2d(2),
                                nn::Flatten(), nn::Linear(9216, 128), nn::ReLU(), nn::Linear(128, 10));
        },
        b, loss::cross_entropy{}, keep);
    ok &= run_workload("mnist_cnn", rungs, b, quick ? 3 : 10, reps, threads,
                       "Conv32-Conv64-MaxPool-Dense128-Dense10, batch 64, CE, Adam");
  }
  if (only == "all" || only == "lstm") {
    // examples/sequence_classify's task: each image read as 28 rows of 28 pixels by a one-layer LSTM(128), its final
    // hidden state into Dense 10 (one direction: the bidirectional case is bench/lstm_bench's).
    batch_set<std::int64_t> b;
    const std::size_t count = std::min<std::size_t>(xs.size(), 64);
    for (std::size_t i = 0; i < count; ++i) {
      b.x.push_back(xs[i].view());
      b.y.push_back(ys[i].view());
      b.x_var.emplace_back(xs[i]);
    }
    using Net = bench::lstm_net;
    auto rungs = make_rungs<Net, std::int64_t>(
        1, 64,
        [] {
          manual_seed(1);
          return nn::Sequential(nn::FinalState(nn::LSTM(28, 128, {.batch_first = true})), nn::Linear(128, 10));
        },
        b, loss::cross_entropy{}, keep);
    ok &= run_workload("lstm", rungs, b, quick ? 10 : 40, reps, threads,
                       "sequential MNIST rows, LSTM(128) final state - Dense 10, batch 64, CE, Adam");
  }
  if (only == "all" || only == "resnet") {
    // examples/resnet_fashion's network (bench::resnet_net: a stem, three stages of two residual blocks with
    // BatchNorm, global average pooling, Dense 10) on the first 32 batches of a seeded epoch of Fashion-MNIST, as
    // 1 x 28 x 28 images normalised with its mean and deviation, without the example's augmentation.
    auto dir = data::find_data_dir("fashion-mnist", flags.get("--data", ""));
    const auto fashion = data::load_mnist(
        dir, data::split::train, {.scale = true, .mean = data::fashion_mnist_mean, .std = data::fashion_mnist_std});
    std::vector<Tensor<float>> fashion_xs;
    std::vector<Tensor<std::int64_t>> fashion_ys;
    data::data_loader loader(fashion, mnist_order);
    for (const auto& batch : loader.epoch(0)) {
      if (fashion_xs.size() == 32) break;
      fashion_xs.emplace_back(batch.x);
      fashion_ys.emplace_back(batch.y);
    }
    image_batches images;
    view_as_images(fashion_xs, fashion_ys, fashion_xs.size(), images);
    auto& b = images.batches;
    using Net = bench::resnet_net;
    auto rungs = make_rungs<Net, std::int64_t>(
        1, 64,
        [] { return examples::dynamic_resnet(1); },
        b, loss::cross_entropy{}, keep);
    ok &= run_workload("resnet", rungs, b, quick ? 3 : 10, reps, threads,
                       "ResNet 16-32-64, 2 blocks a stage, BatchNorm, batch 64 of Fashion-MNIST, CE, Adam");
  }
  if (only == "all" || only == "transformer") {
    // examples/tiny_gpt's training step on the first 8 batches of 32 windows of 128 bytes of the training text, side
    // by side and in order (the peers read the same ones, bench/peers/common.text_batches), with next-token targets.
    const auto corpus = data::load_text_corpus(data::find_data_dir("text", flags.get("--data", "")));
    const data::text_windows<float> windows(corpus.train, examples::gpt_options{}.context);
    constexpr index_t batch = 32, count = 8;
    if (windows.size() < batch * count) fail("ladder: the text corpus has ", windows.size(), " windows, fewer than ",
                                             batch * count);
    std::vector<Tensor<float>> ids;
    std::vector<Tensor<std::int64_t>> targets;
    for (index_t i = 0; i < count; ++i) {
      ids.emplace_back(shape{batch, examples::gpt_options{}.context});
      targets.emplace_back(shape{batch, examples::gpt_options{}.context});
      for (index_t j = 0; j < batch; ++j)
        windows.get(i * batch + j, ids.back().view().rows(j, 1), targets.back().view().rows(j, 1));
    }
    batch_set<std::int64_t> b;
    for (index_t i = 0; i < count; ++i) {
      const auto k = static_cast<std::size_t>(i);
      b.x.push_back(ids[k].view());
      b.y.push_back(targets[k].view());
      b.x_var.emplace_back(ids[k]);
    }
    auto rungs = make_transformer_rungs(b, keep);
    // The loss check covers each of the 8 batches once: static and dynamic mode train alike from the first step.
    ok &= run_workload("transformer", rungs, b, quick ? 3 : 10, reps, threads,
                       "tiny GPT, 4 layers of width 128, batch 32 x 128 bytes, CE, AdamW", 8);
  }
  nn::set_caching_allocator(true);
  return ok ? 0 : 1;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "ladder: %s\n", e.what());
  return 1;
}
