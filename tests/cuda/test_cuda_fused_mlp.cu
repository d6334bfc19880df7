// The fused MLP step (rung 7: static/fused_mlp.cuh, one kernel launch per training step) against static mode's
// unfused step on the same GPU policy (rungs 5 and 6: cuBLAS products, kiln's loss and Adam kernels), from the same
// initial weights on the same batches.
//
// Tolerances: the fused kernel sums each product in another order than cuBLAS, so every value may differ in its last
// bits (relative 1e-7 per addition, ~1e-6 after a dot product of 784 terms). One step's gradients are held to 1e-5
// relative (with an absolute floor for near-zero entries); over 20 Adam steps at lr 1e-3 the differences grow through
// the updates and the losses are held to 1e-4 relative, the parameters to 1e-4 absolute (Adam moves each by at most
// lr per step, so 20 steps move them by 2e-2: 1e-4 is half a percent of that).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_helpers.cuh"
#include "kiln/kiln.hpp"
#include "kiln/policy_cuda.cuh"
#include "kiln/static/fused_mlp.cuh"

using namespace kiln;
using namespace kiln::cuda_test;

namespace {

// Random inputs in [-1, 1) and labels in [0, classes), `samples` of them, on the device and on the host.
struct device_batch {
  Tensor<std::int64_t> host_labels;
  kiln::cuda::device_buffer<float> x;
  kiln::cuda::device_buffer<std::int64_t> y;
  shape x_shape;
};
device_batch make_batch(shape sample_shape, index_t samples, index_t classes, std::uint64_t seed) {
  shape full{samples};
  for (index_t e : sample_shape) full.push_back(e);
  Tensor<std::int64_t> labels(shape{samples});
  for (index_t i = 0; i < samples; ++i) labels[i] = (i * 7 + index_t(seed)) % classes;
  return {labels, to_device(random_values<float>(full.numel(), seed)),
          to_device(std::vector<std::int64_t>(labels.data(), labels.data() + samples)), full};
}

// Trains two copies of Net from one seed for `steps` steps, one unfused (train_step with the policy's Adam or
// AdamW), one fused, over batches of `batch` samples cycling through three sets; compares the first step's
// gradients, every loss, and the parameters at the end.
template <class Net, class Options>
void check_fused_against_unfused(shape sample_shape, index_t batch, int steps, const Options& options,
                                 const std::string& what, int units = 0) {
  constexpr bool decoupled = std::is_same_v<Options, optim::adamw_options>;
  constexpr index_t classes = Net::output_shape::size;
  Net unfused(64, 42), fused(64, 42);
  optim::basic_adam<float, typename Net::policy, decoupled> adam(options);
  fused_mlp_trainer<Net> trainer(fused, options);
  if (units != 0) trainer.set_units_per_block(units);  // 0: the trainer's own choice
  std::vector<device_batch> batches;
  for (std::uint64_t seed : {3, 4, 5}) batches.push_back(make_batch(sample_shape, batch, classes, seed));
  std::vector<float> unfused_losses, fused_losses;
  for (int s = 0; s < steps; ++s) {
    const device_batch& b = batches[std::size_t(s) % batches.size()];
    const tensor_view<const float> x(b.x.data(), b.x_shape);
    const tensor_view<const std::int64_t> y(b.y.data(), shape{batch});
    unfused_losses.push_back(unfused.train_step(resident, x, y, loss::cross_entropy{}, adam));
    fused_losses.push_back(trainer.train_step(resident, x, y));
    if (s == 0) {
      const auto fused_grads = to_host(fused.gradient_values().data(), Net::flat_parameter_size);
      const auto unfused_grads = to_host(unfused.gradient_values().data(), Net::flat_parameter_size);
      // Rounding error follows the size of the terms summed, not of the sum: an entry that cancels to near zero is
      // held to 1e-5 of the largest entry instead.
      double largest = 0;
      for (float v : unfused_grads) largest = std::max(largest, double(std::abs(v)));
      check_close(fused_grads, unfused_grads, 1e-5, 1e-5 * largest, what + ": first step's gradients");
    }
  }
  check_close(fused_losses, unfused_losses, 1e-4, 0.0, what + ": losses");
  CHECK(trainer.steps() == steps);
  check_close(to_host(fused.parameter_values().data(), Net::flat_parameter_size),
              to_host(unfused.parameter_values().data(), Net::flat_parameter_size), 0.0, 1e-4,
              what + ": parameters after training");
}

template <class P>
using mnist_mlp = Sequential<P, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;

}  // namespace

TEST_CASE("the fused step trains the MNIST MLP as the unfused step does (Adam; full and partial batches)") {
  check_fused_against_unfused<mnist_mlp<policy::cuda>>(shape{28, 28}, 64, 20, optim::adam_options{.lr = 1e-3},
                                                       "MNIST MLP, batch 64");
  check_fused_against_unfused<mnist_mlp<policy::cuda>>(shape{28, 28}, 37, 20, optim::adam_options{.lr = 1e-3},
                                                       "MNIST MLP, batch 37");
}

TEST_CASE("the fused step gives the same training with 1, 2, 4 or 8 hidden units per block") {
  for (int units : {1, 2, 4, 8})
    check_fused_against_unfused<mnist_mlp<policy::cuda>>(shape{28, 28}, 64, 10, optim::adam_options{.lr = 1e-3},
                                                         "MNIST MLP, " + std::to_string(units) + " units per block",
                                                         units);
  mnist_mlp<policy::cuda> net(64, 1);
  fused_mlp_trainer<mnist_mlp<policy::cuda>> trainer(net);
  CHECK_THROWS_AS(trainer.set_units_per_block(3), kiln::error);
}

TEST_CASE("the fused step's bits do not depend on the hidden units per block") {
  // Each sample's sums are added in one order whatever the grouping of units and samples, so one unit per block and
  // eight train to the same bits (batch 37: the last group of samples in each warp is partial).
  mnist_mlp<policy::cuda> one(64, 42), eight(64, 42);
  fused_mlp_trainer<mnist_mlp<policy::cuda>> one_trainer(one), eight_trainer(eight);
  one_trainer.set_units_per_block(1);
  eight_trainer.set_units_per_block(8);
  const device_batch b = make_batch(shape{28, 28}, 37, 10, 6);
  const tensor_view<const float> x(b.x.data(), b.x_shape);
  const tensor_view<const std::int64_t> y(b.y.data(), shape{37});
  for (int step = 0; step < 5; ++step) {
    const float one_loss = one_trainer.train_step(resident, x, y);
    CHECK(one_loss == eight_trainer.train_step(resident, x, y));
  }
  const auto one_values = to_host(one.parameter_values().data(), mnist_mlp<policy::cuda>::flat_parameter_size);
  const auto eight_values = to_host(eight.parameter_values().data(), mnist_mlp<policy::cuda>::flat_parameter_size);
  CHECK(one_values == eight_values);
}

namespace {
// Every lane's warp_sum_scatter result and each value's warp_reduce total (lane 0's), for one warp.
template <int N>
__global__ void warp_sum_scatter_kernel(const float* values, float* scattered, float* reduced) {
  float mine[N];
  for (int i = 0; i < N; ++i) mine[i] = values[threadIdx.x * N + i];
  scattered[threadIdx.x] = kernels::cuda::detail::warp_sum_scatter(mine);
  for (int i = 0; i < N; ++i) {
    const float total = kernels::cuda::detail::warp_reduce(mine[i], kernels::cuda::detail::sum_op{});
    if (threadIdx.x == 0) reduced[i] = total;
  }
}
template <int N>
void check_warp_sum_scatter() {
  // Values of mixed sign and size, so that another order of additions would round differently.
  std::vector<float> host = random_values<float>(32 * N, 11 + N);
  for (std::size_t i = 0; i < host.size(); i += 3) host[i] *= 1000.0f;
  const auto values = to_device(host);
  kiln::cuda::device_buffer<float> scattered(32), reduced(N);
  const cudaStream_t stream = kiln::cuda::current_stream();
  warp_sum_scatter_kernel<N><<<1, 32, 0, stream>>>(values.data(), scattered.data(), reduced.data());
  KILN_CUDA_CHECK_LAUNCH();
  const auto s = to_host(scattered), r = to_host(reduced);
  for (int lane = 0; lane < 32; ++lane) CHECK(s[std::size_t(lane)] == r[std::size_t(lane / (32 / N))]);
}
}  // namespace

TEST_CASE("the head's reduce-scatter adds each value's lanes as warp_reduce does, bit for bit") {
  check_warp_sum_scatter<16>();
  check_warp_sum_scatter<32>();
}

TEST_CASE("the fused step with AdamW and with Adam's L2 weight decay") {
  check_fused_against_unfused<mnist_mlp<policy::cuda>>(
      shape{28, 28}, 64, 20, optim::adamw_options{.lr = 1e-3, .weight_decay = 0.05}, "AdamW");
  check_fused_against_unfused<mnist_mlp<policy::cuda>>(
      shape{28, 28}, 64, 20, optim::adam_options{.lr = 1e-3, .weight_decay = 0.01}, "Adam, weight decay");
}

TEST_CASE("the fused step on other shapes: a flat input, hidden units not a multiple of a block's, a wide layer") {
  using flat = Sequential<policy::cuda, Input<50>, Dense<100, ReLU>, Dense<3>>;
  check_fused_against_unfused<flat>(shape{50}, 64, 20, optim::adam_options{.lr = 1e-3}, "50-100-3");
  using wide = Sequential<policy::cuda, Input<784>, Dense<1024, ReLU>, Dense<32>>;
  check_fused_against_unfused<wide>(shape{784}, 16, 10, optim::adam_options{.lr = 1e-3}, "784-1024-32");
  using tiny = Sequential<policy::cudnn, Input<2, 3>, Flatten, Dense<5, ReLU>, Dense<2>>;
  check_fused_against_unfused<tiny>(shape{2, 3}, 1, 20, optim::adam_options{.lr = 1e-2}, "6-5-2, one sample");
}

TEST_CASE("the fused step refuses what it cannot run, with a kiln::error") {
  mnist_mlp<policy::cuda> net(64, 1);
  CHECK_THROWS_AS(fused_mlp_trainer<mnist_mlp<policy::cuda>>(net, optim::adam_options{.amsgrad = true}), kiln::error);
  CHECK_THROWS_AS(fused_mlp_trainer<mnist_mlp<policy::cuda>>(net, optim::adam_options{.clip = {.norm = 1.0}}),
                  kiln::error);
  fused_mlp_trainer<mnist_mlp<policy::cuda>> trainer(net);
  device_batch b = make_batch(shape{28, 28}, 8, 10, 9);
  const tensor_view<const float> x(b.x.data(), b.x_shape);
  // More samples than the model plans for, a sample of the wrong size, fewer labels than samples.
  device_batch big = make_batch(shape{28, 28}, 65, 10, 9);
  CHECK_THROWS_AS(trainer.train_step(resident, tensor_view<const float>(big.x.data(), big.x_shape),
                                     tensor_view<const std::int64_t>(big.y.data(), shape{65})),
                  kiln::error);
  CHECK_THROWS_AS(trainer.train_step(resident, tensor_view<const float>(b.x.data(), shape{8, 784 / 2}),
                                     tensor_view<const std::int64_t>(b.y.data(), shape{8})),
                  kiln::error);
  CHECK_THROWS_AS(trainer.train_step(resident, x, tensor_view<const std::int64_t>(b.y.data(), shape{7})), kiln::error);
  // A label out of range is reported with its row, after the step, and the next good step runs.
  std::vector<std::int64_t> labels(b.host_labels.data(), b.host_labels.data() + 8);
  labels[5] = 10;
  const auto bad = to_device(labels);
  try {
    trainer.train_step(resident, x, tensor_view<const std::int64_t>(bad.data(), shape{8}));
    FAIL("expected a kiln::error for label 10");
  } catch (const kiln::error& e) {
    const std::string message = e.what();
    CHECK_MESSAGE(message.find("10") != std::string::npos, message);
    CHECK_MESSAGE(message.find("5") != std::string::npos, message);
  }
  const float loss = trainer.train_step(resident, x, tensor_view<const std::int64_t>(b.y.data(), shape{8}));
  CHECK(std::isfinite(loss));
  CHECK(loss > 0.0f);
  // A frozen layer is refused rather than trained.
  net.freeze(1);
  CHECK_THROWS_AS(trainer.train_step(resident, x, tensor_view<const std::int64_t>(b.y.data(), shape{8})), kiln::error);
  net.unfreeze(1);
  CHECK(std::isfinite(trainer.train_step(resident, x, tensor_view<const std::int64_t>(b.y.data(), shape{8}))));
}
