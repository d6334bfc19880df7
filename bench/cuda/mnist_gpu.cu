// The MNIST MLP (Flatten - Dense 128 ReLU - Dense 10, cross-entropy, Adam lr 1e-3, batch 64, one epoch of 938 steps)
// as a static model on the GPU with the whole training set uploaded once and resident on the device, in three ways,
// and on the CPU policy in the same run for the ratio:
//   cpu        Sequential<policy::cpu>: host batches, the loss returned every step (the ladder's rung 5)
//   gpu_eager  Sequential<policy::cuda>, train_step(kiln::resident, ...): the loss comes back to the host every step,
//              so the host waits for the GPU once per step (PyTorch's loss.item() in every step)
//   gpu_async  enqueue_train_step: the loss stays on the device (one slot per step), nothing waits until the end of
//              the epoch; the host only issues kernels
//   gpu_graph  rung 6: the whole step (forward, fused loss, backward, capturable Adam) captured once into a CUDA graph
//              and replayed; per step, the batch is copied (device to device) into the graph's fixed input buffers,
//              the graph launched and its loss copied to the step's slot
//   gpu_fused  rung 7: the whole step as one kernel launch (static/fused_mlp.cuh: fused_mlp_trainer), the loss read
//              on the host every step as in gpu_eager
//   gpu_fused_async  the same launches with the loss left on the device, as in gpu_async; _u1, _u4 and _u8 with 1, 4
//              and 8 hidden units per block instead of the trainer's choice, 2 (128, 32 and 16 blocks instead of 64)
//   gpu_dynamic  dynamic mode on the GPU (this file builds it on policy::cuda): nn::Sequential, the tape, Adam over
//              its parameters, the PyTorch-style loop with loss.item() every step; the batch is copied on the device
//              into a Variable, the labels (512 bytes) are uploaded from the host by cross_entropy
// Every mode starts from the same weights (seed 42) and see the same batches (one seeded shuffled epoch, as the
// ladder's, assembled on the host before any timing). Before any time is reported the losses are checked: the GPU
// modes against each other (eager and async bit for bit; graph within 1e-5, Adam's bias corrections being computed
// on the device there; the fused modes, whose products sum in another order, within 1e-4 over the first 50 steps)
// and against the CPU (within 1e-3 over the first 50 steps: FP32 sums in another order).
// Reported: µs per step (epoch time / steps), the epoch's seconds (graph: capture and instantiation included; also
// shown separately), test accuracy, and the CPU/GPU ratio.
//
//   mnist_gpu [--data DIR] [--threads N] [--seed 42]          (data: --data, $KILN_DATA, ./data, ...; see find_data)
// Dynamic mode on the GPU: the dynamic headers name the policy, so policy_cuda.cuh comes first.
#define KILN_DYNAMIC_POLICY ::kiln::policy::cuda
#include "kiln/policy_cuda.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../../examples/common.hpp"
#include "../../examples/mnist_common.hpp"
#include "kiln/core/cuda/device.cuh"
#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/kiln.hpp"
#include "kiln/static/fused_mlp.cuh"

using namespace kiln;
using clock_type = std::chrono::steady_clock;

namespace {

template <class P>
using mlp = Sequential<P, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;
using gpu_adam = optim::basic_adam<float, policy::cuda>;

constexpr index_t batch_size = 64;
constexpr index_t sample_size = 784;

// One epoch's batches laid out one after another: batch b holds samples [b * 64, b * 64 + size(b)).
struct epoch_data {
  Tensor<float> x;
  Tensor<std::int64_t> y;
  std::vector<index_t> first, size;
  index_t steps() const { return static_cast<index_t>(first.size()); }
};

struct outcome {
  std::string mode;
  std::vector<float> losses;
  double epoch_seconds = 0, extra_seconds = 0;  // extra: graph capture + instantiation (inside epoch_seconds)
  double accuracy = 0;
};

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double accuracy_of(const Tensor<float>& outputs, const Tensor<std::int64_t>& labels) {
  index_t correct = 0, n = labels.numel();
  for (index_t i = 0; i < n; ++i) {
    const float* row = outputs.data() + i * 10;
    correct += (std::max_element(row, row + 10) - row) == labels[i];
  }
  return double(correct) / double(n);
}

outcome run_cpu(const epoch_data& d, const data::tensor_dataset<float, std::int64_t>& test, std::uint64_t seed) {
  outcome r{"cpu", {}, 0, 0, 0};
  mlp<policy::cpu> net(batch_size, seed);
  optim::Adam adam({.lr = 1e-3});
  const auto start = clock_type::now();
  for (index_t s = 0; s < d.steps(); ++s)
    r.losses.push_back(
        net.train_step(d.x.rows(d.first[s], d.size[s]), d.y.rows(d.first[s], d.size[s]), loss::cross_entropy{}, adam));
  r.epoch_seconds = seconds_since(start);
  r.accuracy = accuracy_of(net.predict(test.features()), test.labels());
  return r;
}

// The device copies of the epoch and of the test images.
struct resident_data {
  kiln::cuda::device_buffer<float> x, test_x;
  kiln::cuda::device_buffer<std::int64_t> y;
  tensor_view<const float> batch_x(const epoch_data& d, index_t s) const {
    return {x.data() + d.first[s] * sample_size, shape{d.size[s], 28, 28}};
  }
  tensor_view<const std::int64_t> batch_y(const epoch_data& d, index_t s) const {
    return {y.data() + d.first[s], shape{d.size[s]}};
  }
};

// The GPU modes, over the first `steps` batches (all: -1). The accuracy is measured when test labels are given.
outcome run_gpu(const std::string& mode, const epoch_data& d, const resident_data& data,
                const Tensor<std::int64_t>* test_labels, std::uint64_t seed, index_t steps = -1) {
  outcome r{mode, {}, 0, 0, 0};
  mlp<policy::cuda> net(batch_size, seed);
  gpu_adam adam({.lr = 1e-3, .capturable = mode == "gpu_graph"});
  if (steps < 0) steps = d.steps();
  kiln::cuda::device_buffer<float> losses(steps);
  const cudaStream_t stream = kiln::cuda::current_stream();
  kiln::cuda::synchronize();
  const auto start = clock_type::now();
  if (mode.starts_with("gpu_fused")) {
    fused_mlp_trainer<mlp<policy::cuda>> trainer(net, optim::adam_options{.lr = 1e-3});
    // gpu_fused_async_uN: the kernel with N hidden units per block instead of the default.
    if (const auto at = mode.find("_u"); at != std::string::npos)
      trainer.set_units_per_block(std::stoi(mode.substr(at + 2)));
    for (index_t s = 0; s < steps; ++s) {
      if (mode == "gpu_fused")
        r.losses.push_back(trainer.train_step(resident, data.batch_x(d, s), data.batch_y(d, s)));
      else
        trainer.enqueue_train_step(resident, data.batch_x(d, s), data.batch_y(d, s), losses.data() + s);
    }
  } else if (mode == "gpu_eager") {
    for (index_t s = 0; s < steps; ++s)
      r.losses.push_back(net.train_step(resident, data.batch_x(d, s), data.batch_y(d, s), loss::cross_entropy{}, adam));
  } else if (mode == "gpu_async") {
    for (index_t s = 0; s < steps; ++s)
      net.enqueue_train_step(resident, data.batch_x(d, s), data.batch_y(d, s), loss::cross_entropy{}, adam,
                             losses.data() + s);
  } else {
    // Step 0 runs uncaptured (it allocates Adam's state); a step is then captured reading fixed input buffers and
    // writing a fixed loss slot, and replayed for every full batch; a smaller last batch runs uncaptured.
    kiln::cuda::device_buffer<float> x_fixed(batch_size * sample_size), loss_slot(1);
    kiln::cuda::device_buffer<std::int64_t> y_fixed(batch_size);
    const tensor_view<const float> xv(x_fixed.data(), shape{batch_size, 28, 28});
    const tensor_view<const std::int64_t> yv(y_fixed.data(), shape{batch_size});
    net.enqueue_train_step(resident, data.batch_x(d, 0), data.batch_y(d, 0), loss::cross_entropy{}, adam,
                           losses.data());
    const auto capture_start = clock_type::now();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    net.enqueue_train_step(resident, xv, yv, loss::cross_entropy{}, adam, loss_slot.data());
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    r.extra_seconds = seconds_since(capture_start);
    for (index_t s = 1; s < steps; ++s) {
      if (d.size[s] != batch_size) {
        net.enqueue_train_step(resident, data.batch_x(d, s), data.batch_y(d, s), loss::cross_entropy{}, adam,
                               losses.data() + s);
        continue;
      }
      KILN_CUDA_CHECK(cudaMemcpyAsync(x_fixed.data(), data.x.data() + d.first[s] * sample_size,
                                      batch_size * sample_size * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      KILN_CUDA_CHECK(cudaMemcpyAsync(y_fixed.data(), data.y.data() + d.first[s], batch_size * sizeof(std::int64_t),
                                      cudaMemcpyDeviceToDevice, stream));
      KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(losses.data() + s, loss_slot.data(), sizeof(float), cudaMemcpyDeviceToDevice, stream));
    }
    kiln::cuda::synchronize();
    KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
    KILN_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  kiln::cuda::synchronize();
  r.epoch_seconds = seconds_since(start);
  if (mode != "gpu_eager" && mode != "gpu_fused") {
    r.losses.resize(static_cast<std::size_t>(steps));
    policy::cuda::download(losses.data(), r.losses.data(), steps);
  }
  if (!test_labels) return r;
  const tensor_view<const float> test_x(data.test_x.data(), shape{test_labels->numel(), 28, 28});
  r.accuracy = accuracy_of(net.predict(resident, test_x), *test_labels);
  return r;
}

// Dynamic mode on the GPU over the first `steps` batches (all: -1).
outcome run_gpu_dynamic(const epoch_data& d, const resident_data& data, const Tensor<std::int64_t>* test_labels,
                        std::uint64_t seed, index_t steps = -1) {
  outcome r{"gpu_dynamic", {}, 0, 0, 0};
  nn::Sequential model = examples::mnist_dynamic_mlp(seed);
  optim::basic_adam<float, policy::cuda> adam(model.parameters(), {.lr = 1e-3});
  if (steps < 0) steps = d.steps();
  kiln::cuda::synchronize();
  const auto start = clock_type::now();
  for (index_t s = 0; s < steps; ++s) {
    adam.zero_grad();
    const auto x = nn::Variable::copy_of_policy_memory(data.batch_x(d, s));
    nn::Variable loss = nn::cross_entropy(model(x), d.y.rows(d.first[s], d.size[s]).span());
    loss.backward();
    adam.step();
    r.losses.push_back(loss.item());
  }
  kiln::cuda::synchronize();
  r.epoch_seconds = seconds_since(start);
  if (!test_labels) return r;
  model.eval();
  nn::no_grad guard;
  const tensor_view<const float> test_x(data.test_x.data(), shape{test_labels->numel(), 28, 28});
  r.accuracy = accuracy_of(model(nn::Variable::copy_of_policy_memory(test_x)).tensor(), *test_labels);
  return r;
}

// Largest |a - b| / max(|b|, 1e-6) over the first n values.
double worst_relative(const std::vector<float>& a, const std::vector<float>& b, std::size_t n) {
  double worst = 0;
  for (std::size_t i = 0; i < std::min({n, a.size(), b.size()}); ++i) {
    const double e = std::abs(double(a[i]) - double(b[i])) / std::max(std::abs(double(b[i])), 1e-6);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--seed"});
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  const auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  const cudaError_t status = kiln::cuda::device_status();
  if (status != cudaSuccess) {
    std::printf("SKIPPED: no CUDA device (%s)\n", cudaGetErrorString(status));
    return 0;
  }
  set_num_threads(threads);
  auto mnist = examples::load_mnist_data(flags.get("--data", ""));

  // One epoch's batches in the ladder's order (data_loader, shuffle, seed 5), copied one after another.
  epoch_data d{Tensor<float>(shape{mnist.train.size(), 28, 28}), Tensor<std::int64_t>(shape{mnist.train.size()}), {}, {}};
  {
    data::data_loader loader(mnist.train, {.batch_size = batch_size, .shuffle = true, .seed = 5});
    index_t at = 0;
    for (const auto& b : loader.epoch(0)) {
      std::copy_n(b.x.data(), b.x.numel(), d.x.data() + at * sample_size);
      std::copy_n(b.y.data(), b.y.numel(), d.y.data() + at);
      d.first.push_back(at);
      d.size.push_back(b.x.extent(0));
      at += b.x.extent(0);
    }
  }
  std::printf("mnist_gpu on %s: MNIST from %s, %lld steps of batch %lld (last %lld), CPU on %d thread%s\n",
              kiln::cuda::describe_device().c_str(), mnist.dir.c_str(), static_cast<long long>(d.steps()),
              static_cast<long long>(batch_size), static_cast<long long>(d.size.back()), threads,
              threads == 1 ? "" : "s");

  // The whole training set (and the test images) uploaded once.
  const auto upload_start = clock_type::now();
  resident_data data{kiln::cuda::device_buffer<float>(d.x.numel()), kiln::cuda::device_buffer<float>(mnist.test.features().numel()),
                     kiln::cuda::device_buffer<std::int64_t>(d.y.numel())};
  policy::cuda::upload(d.x.data(), data.x.data(), d.x.numel());
  policy::cuda::upload(d.y.data(), data.y.data(), d.y.numel());
  policy::cuda::upload(mnist.test.features().data(), data.test_x.data(), mnist.test.features().numel());
  kiln::cuda::synchronize();
  std::printf("upload of %.1f MB: %.3f s\n\n",
              double(d.x.numel() * 4 + d.y.numel() * 8 + mnist.test.features().numel() * 4) / 1e6,
              seconds_since(upload_start));

  std::vector<outcome> results;
  results.push_back(run_cpu(d, mnist.test, seed));
  for (const char* mode : {"gpu_eager", "gpu_async", "gpu_graph", "gpu_fused", "gpu_fused_async", "gpu_fused_async_u1",
                           "gpu_fused_async_u4", "gpu_fused_async_u8"}) {
    // A throwaway model runs a few steps the same way first, so that library handles, cuBLASLt plans and scratch
    // buffers (per process, not per model) exist before the clock starts.
    run_gpu(mode, d, data, nullptr, seed + 1, 8);
    results.push_back(run_gpu(mode, d, data, &mnist.test.labels(), seed));
  }
  run_gpu_dynamic(d, data, nullptr, seed + 1, 8);
  results.push_back(run_gpu_dynamic(d, data, &mnist.test.labels(), seed));

  // Agreement before any time.
  const outcome& cpu = results[0];
  const outcome& eager = results[1];
  bool ok = true;
  for (std::size_t i = 1; i < results.size(); ++i) {
    // Dynamic mode applies ReLU in a kernel of its own where static mode fuses it into the product's epilogue; a
    // maximum rounds nothing, so the losses should agree exactly, but only the first 50 steps are held to it, with
    // room for rounding, as the CPU's are.
    const bool dynamic = results[i].mode == "gpu_dynamic";
    const bool fused = results[i].mode.starts_with("gpu_fused");
    const bool first_50 = dynamic || fused;
    const double vs_cpu = worst_relative(results[i].losses, cpu.losses, 50);
    const double vs_eager =
        worst_relative(results[i].losses, eager.losses, first_50 ? 50 : results[i].losses.size());
    const double limit = first_50 ? 1e-4 : results[i].mode == "gpu_graph" ? 1e-5 : 0.0;
    const bool pass = vs_cpu <= 1e-3 && vs_eager <= limit;
    std::printf("check %-18s first 50 losses vs cpu: %.2e (limit 1e-3); %s losses vs gpu_eager: %.2e (limit %.0e) %s\n",
                results[i].mode.c_str(), vs_cpu, first_50 ? "first 50" : "all", vs_eager, limit,
                pass ? "ok" : "FAILED");
    ok = ok && pass;
  }
  if (!ok) {
    std::fprintf(stderr, "mnist_gpu: the modes disagree; no times reported\n");
    return 1;
  }
  std::printf("\n%-18s %10s %10s %10s %10s %10s\n", "mode", "step_us", "epoch_s", "test_acc", "final_loss", "cpu/x");
  for (const auto& r : results) {
    const double step_us = r.epoch_seconds / double(d.steps()) * 1e6;
    std::printf("%-18s %10.1f %10.3f %10.4f %10.4f %9.1fx\n", r.mode.c_str(), step_us, r.epoch_seconds, r.accuracy,
                double(r.losses.back()), cpu.epoch_seconds / r.epoch_seconds);
  }
  std::printf("(gpu_graph's epoch includes %.1f ms of capture and instantiation)\n\n", results[3].extra_seconds * 1e3);
  for (const auto& r : results)
    std::printf("RESULT bench=mnist_gpu system=%s mode=%s threads=%d steps=%lld step_us=%.2f epoch_s=%.4f "
                "test_acc=%.4f final_loss=%.6g\n",
                r.mode == "gpu_dynamic" ? "kiln_dynamic" : "kiln_static", r.mode.c_str(), r.mode == "cpu" ? threads : 0,
                static_cast<long long>(d.steps()),
                r.epoch_seconds / double(d.steps()) * 1e6, r.epoch_seconds, r.accuracy, double(r.losses.back()));
  for (std::size_t i = 1; i < results.size(); ++i)
    std::printf("RESULT bench=mnist_gpu metric=cpu_gpu_ratio mode=%s threads=%d ratio=%.2f\n", results[i].mode.c_str(),
                threads, cpu.epoch_seconds / results[i].epoch_seconds);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "mnist_gpu: %s\n", e.what());
  return 1;
}
