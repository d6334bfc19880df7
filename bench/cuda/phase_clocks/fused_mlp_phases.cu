// The fused MLP step's phases timed inside its kernel: built by bench/cuda/phase_clocks/build against a copy of the
// kernel with clocks (make_timed.py), not by CMake. 900 steps of the MNIST MLP on distinct random batches laid out as
// MNIST's training set (so that each batch's first reads come from device memory), for 2, 1, 4 and again 2 hidden
// units per block. Prints µs per step (events over the enqueued steps), block 0's start to end (global timer) and the
// gap to the next step's start, each phase's mean for block 0 and the largest over the blocks, and the first and last
// losses (kernels that sum in the same order print the same).
#include "kiln/policy_cuda.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "kiln/kiln.hpp"
#include "kiln/static/fused_mlp.cuh"

using namespace kiln;
using net_type = Sequential<policy::cuda, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;

namespace {
// A linear congruential stream: the same pixels and labels in every build, so that kernels which sum in the same
// order print the same losses.
struct pixel_stream {
  unsigned state = 12345;
  unsigned next() { return state = state * 1664525u + 1013904223u; }
};
constexpr int phase_count = 11;
const char* const phase_names[phase_count] = {
    "start", "W1 rows", "forward", "grid sync 1", "head: block_reduce", "dhidden+dW2", "b1+dW1+Adam",
    "grid sync 2", "W2/b2 Adam", "head: sums (warp 0)", "head: epilogue (w0)"};
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main() {
  const index_t samples = 60032, batch = 64, in = 784, steps = 900;
  std::vector<float> x(std::size_t(samples * in));
  std::vector<std::int64_t> y(static_cast<std::size_t>(samples));
  pixel_stream stream_of_values;
  for (auto& v : x) v = float(stream_of_values.next() >> 8) / float(1 << 24);
  for (auto& v : y) v = (stream_of_values.next() >> 8) % 10;
  kiln::cuda::device_buffer<float> dx(samples * in), losses(steps);
  kiln::cuda::device_buffer<std::int64_t> dy(samples);
  KILN_CUDA_CHECK(cudaMemcpy(dx.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(dy.data(), y.data(), y.size() * 8, cudaMemcpyHostToDevice));
  int clock_khz = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("SM clock attribute %.0f MHz\n", clock_khz / 1e3);
  const cudaStream_t stream = kiln::cuda::current_stream();
  for (int units : {2, 1, 4, 2}) {
    net_type net(batch, 42);
    fused_mlp_trainer<net_type> trainer(net, optim::adam_options{.lr = 1e-3});
    trainer.set_units_per_block(units);
    auto run = [&](index_t count) {
      for (index_t s = 0; s < count; ++s) {
        const tensor_view<const float> xv(dx.data() + (s * batch % (samples - batch)) * in, shape{batch, 28, 28});
        const tensor_view<const std::int64_t> yv(dy.data() + s * batch % (samples - batch), shape{batch});
        trainer.enqueue_train_step(resident, xv, yv, losses.data() + s);
      }
    };
    run(20);
    kiln::cuda::synchronize();
    static unsigned long long zeros[256][phase_count] = {};
    KILN_CUDA_CHECK(cudaMemcpyToSymbol(kernels::cuda::fused_phase_cycles, zeros, sizeof zeros));
    const long long first_step = trainer.steps() + 1;
    cudaEvent_t start, stop;
    KILN_CUDA_CHECK(cudaEventCreate(&start));
    KILN_CUDA_CHECK(cudaEventCreate(&stop));
    KILN_CUDA_CHECK(cudaEventRecord(start, stream));
    run(steps);
    KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    KILN_CUDA_CHECK(cudaEventDestroy(start));
    KILN_CUDA_CHECK(cudaEventDestroy(stop));
    static unsigned long long cycles[256][phase_count], ns[8192][2];
    KILN_CUDA_CHECK(cudaMemcpyFromSymbol(cycles, kernels::cuda::fused_phase_cycles, sizeof cycles));
    KILN_CUDA_CHECK(cudaMemcpyFromSymbol(ns, kernels::cuda::fused_step_ns, sizeof ns));
    std::vector<double> kernel_us, gap_us;
    for (long long s = first_step; s < first_step + steps; ++s) {
      kernel_us.push_back((ns[s][1] - ns[s][0]) / 1e3);
      if (s + 1 < first_step + steps) gap_us.push_back((double(ns[s + 1][0]) - double(ns[s][1])) / 1e3);
    }
    const index_t blocks = kernels::cuda::fused_mlp_blocks(128, units);
    std::printf("units %d (%lld blocks): %.2f us/step (events), block 0 start-to-end median %.2f us, gap to next "
                "start median %.2f us\n", units, (long long)blocks, 1e3 * ms / steps, median(kernel_us),
                median(gap_us));
    for (int p = 0; p < phase_count; ++p) {
      double largest = 0;
      for (index_t b = 0; b < blocks; ++b) largest = std::max(largest, double(cycles[b][p]));
      const double mhz = clock_khz / 1e3, block0 = double(cycles[0][p]) / steps;
      std::printf("  %-19s block 0 %8.0f cycles (%6.2f us)   largest block %8.0f cycles (%6.2f us)\n",
                  phase_names[p], block0, block0 / mhz, largest / steps, largest / steps / mhz);
    }
    std::vector<float> host_losses(static_cast<std::size_t>(steps));
    KILN_CUDA_CHECK(cudaMemcpy(host_losses.data(), losses.data(), steps * 4, cudaMemcpyDeviceToHost));
    std::printf("  losses: first %.7f last %.7f\n", host_losses.front(), host_losses.back());
  }
  return 0;
}
