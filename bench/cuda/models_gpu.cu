// The ladder's CNN and LSTM workloads on the GPU, and the LSTM's GRU twin: a training step (forward, cross-entropy,
// backward, Adam) with the batches resident on the device, in static mode on policy::cuda (kiln's convolution:
// im2col + cuBLAS, kiln's pooling, kiln's recurrent steps) and on policy::cudnn (cuDNN's convolution, pooling and
// RNN), and in dynamic mode on policy::cuda (this file builds dynamic mode for the GPU). The peer is
// bench/peers/torch_gpu_models.py.
//   mnist_cnn  Conv 32 3x3 - ReLU - Conv 64 3x3 - ReLU - MaxPool 2 - Flatten - Dense 128 ReLU - Dense 10, batch 64
//   lstm       each 28 x 28 image read as 28 rows by LSTM(128), its final hidden state into Dense 10, batch 64
//   gru        the same with GRU(128)
// Inputs are random (uniform in [-1, 1), fixed seed), 8 batches uploaded once and cycled. Every model starts from the
// same weights (seed 1; dynamic after manual_seed(1)); before any time is reported, each one's first 10 losses are
// checked against static policy::cuda's (1e-3 relative: cuDNN sums in another order). Each figure is the median of 5
// repetitions of `steps` steps (µs per step, the loss read on the host every step, as PyTorch's loss.item()).
//
//   models_gpu [--workload mnist_cnn|lstm|gru|all] [--steps 50]
#define KILN_DYNAMIC_POLICY ::kiln::policy::cuda
#include "kiln/policy_cuda.cuh"
// policy_cuda.cuh first: the dynamic headers name the policy.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../../examples/common.hpp"
#include "kiln/core/cuda/device.cuh"
#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr index_t batch_size = 64, batches = 8;

// Each model named through a member type: nvcc 13 mis-writes an alias template whose arguments hold LSTM's
// rnn_options into its host code (see tests/cuda/test_cuda_static.cu).
template <class P>
struct cnn_model {
  using type = Sequential<P, Input<1, 28, 28>, Conv2D<32, 3>, ReLU, Conv2D<64, 3>, ReLU, MaxPool2D<2>, Flatten,
                          Dense<128, ReLU>, Dense<10>>;
};
template <class P>
struct lstm_model {
  using type = Sequential<P, Input<28, 28>, FinalState<LSTM<128>>, Dense<10>>;
};
template <class P>
struct gru_model {
  using type = Sequential<P, Input<28, 28>, FinalState<GRU<128>>, Dense<10>>;
};
nn::Sequential dynamic_cnn() {
  manual_seed(1);
  return nn::Sequential(nn::Conv2d(1, 32, 3), nn::ReLU(), nn::Conv2d(32, 64, 3), nn::ReLU(), nn::MaxPool2d(2),
                        nn::Flatten(), nn::Linear(9216, 128), nn::ReLU(), nn::Linear(128, 10));
}
nn::Sequential dynamic_lstm() {
  manual_seed(1);
  return nn::Sequential(nn::FinalState(nn::LSTM(28, 128, {.batch_first = true})), nn::Linear(128, 10));
}
nn::Sequential dynamic_gru() {
  manual_seed(1);
  return nn::Sequential(nn::FinalState(nn::GRU(28, 128, {.batch_first = true})), nn::Linear(128, 10));
}

// The batches, on the host (labels, which dynamic mode's cross_entropy takes from there) and on the device.
struct resident_batches {
  shape sample;
  std::vector<float> host_x;
  std::vector<std::int64_t> host_y;
  kiln::cuda::device_buffer<float> x;
  kiln::cuda::device_buffer<std::int64_t> y;
  index_t sample_size() const { return sample.numel(); }
  tensor_view<const float> batch_x(index_t b) const {
    shape s{batch_size};
    for (index_t e : sample) s.push_back(e);
    return {x.data() + (b % batches) * batch_size * sample_size(), s};
  }
  tensor_view<const std::int64_t> batch_y(index_t b) const {
    return {y.data() + (b % batches) * batch_size, shape{batch_size}};
  }
  std::span<const std::int64_t> host_labels(index_t b) const {
    return {host_y.data() + (b % batches) * batch_size, static_cast<std::size_t>(batch_size)};
  }
};

resident_batches make_batches(shape sample) {
  resident_batches r{sample, {}, {}, {}, {}};
  const index_t n = batches * batch_size * r.sample_size();
  random_generator rng(3, 0);
  r.host_x.resize(static_cast<std::size_t>(n));
  for (auto& v : r.host_x) v = rng.uniform<float>(-1.0f, 1.0f);
  r.host_y.resize(static_cast<std::size_t>(batches * batch_size));
  for (auto& l : r.host_y) l = static_cast<std::int64_t>(rng.below(10));
  r.x = kiln::cuda::device_buffer<float>(n);
  r.y = kiln::cuda::device_buffer<std::int64_t>(batches * batch_size);
  policy::cuda::upload(r.host_x.data(), r.x.data(), n);
  policy::cuda::upload(r.host_y.data(), r.y.data(), batches * batch_size);
  kiln::cuda::synchronize();
  return r;
}

// A way to train: step(b) runs one training step on batch b and returns its loss.
struct system_under_test {
  std::string name;
  std::function<float(index_t)> step;
};

// Model<P>::type is named inside the function, not as a template argument at the call (see lstm_model).
template <template <class> class Model, class P>
system_under_test static_system(const std::string& name, const resident_batches& data) {
  using Net = typename Model<P>::type;
  auto net = std::make_shared<Net>(batch_size, 1);
  auto adam = std::make_shared<optim::basic_adam<float, typename Net::policy>>(optim::adam_options{.lr = 1e-3});
  return {name, [net, adam, &data](index_t b) {
            return net->train_step(resident, data.batch_x(b), data.batch_y(b), loss::cross_entropy{}, *adam);
          }};
}

system_under_test dynamic_system(const std::string& name, nn::Sequential model, const resident_batches& data) {
  auto net = std::make_shared<nn::Sequential>(std::move(model));
  auto adam =
      std::make_shared<optim::basic_adam<float, policy::cuda>>(net->parameters(), optim::adam_options{.lr = 1e-3});
  return {name, [net, adam, &data](index_t b) {
            adam->zero_grad();
            nn::Variable loss =
                nn::cross_entropy((*net)(nn::Variable::copy_of_policy_memory(data.batch_x(b))), data.host_labels(b));
            loss.backward();
            adam->step();
            return loss.item();
          }};
}

bool run_workload(const std::string& workload, std::vector<system_under_test> systems, index_t steps) {
  // Agreement first: the first 10 losses of each system against the first's.
  std::vector<std::vector<float>> losses(systems.size());
  for (std::size_t i = 0; i < systems.size(); ++i)
    for (index_t b = 0; b < 10; ++b) losses[i].push_back(systems[i].step(b));
  bool ok = true;
  for (std::size_t i = 1; i < systems.size(); ++i) {
    double worst = 0;
    for (std::size_t k = 0; k < losses[i].size(); ++k)
      worst = std::max(worst, std::abs(double(losses[i][k]) - losses[0][k]) /
                                  std::max(1e-6, std::abs(double(losses[0][k]))));
    const bool pass = std::isfinite(worst) && worst <= 1e-3;
    std::printf("check %s %-16s first 10 losses vs %s: %.2e (limit 1e-3) %s\n", workload.c_str(),
                systems[i].name.c_str(), systems[0].name.c_str(), worst, pass ? "ok" : "FAILED");
    ok = ok && pass;
  }
  if (!ok) return false;
  // Interleaved repetitions, so that drift falls on every system alike; the median of each.
  constexpr int reps = 5;
  std::vector<std::vector<double>> us(systems.size());
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < systems.size(); ++i) {
      kiln::cuda::synchronize();
      const auto start = clock_type::now();
      for (index_t s = 0; s < steps; ++s) systems[i].step(10 + r * steps + s);
      kiln::cuda::synchronize();
      us[i].push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count() / double(steps));
    }
  for (std::size_t i = 0; i < systems.size(); ++i) {
    std::sort(us[i].begin(), us[i].end());
    std::printf("RESULT bench=models_gpu workload=%s system=%s steps=%lld step_us=%.1f min_us=%.1f max_us=%.1f\n",
                workload.c_str(), systems[i].name.c_str(), static_cast<long long>(steps), us[i][reps / 2], us[i][0],
                us[i][reps - 1]);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--steps", "--workload"});
  const std::string workload = flags.get("--workload", "all");
  const index_t steps = flags.get_int("--steps", 50);
  const cudaError_t status = kiln::cuda::device_status();
  if (status != cudaSuccess) {
    std::printf("SKIPPED: no CUDA device (%s)\n", cudaGetErrorString(status));
    return 0;
  }
  std::printf("models_gpu on %s: batch %lld, %lld timed steps x 5 repetitions per system\n",
              kiln::cuda::describe_device().c_str(), static_cast<long long>(batch_size), static_cast<long long>(steps));
  bool ok = true;
  if (workload == "all" || workload == "mnist_cnn") {
    const auto data = make_batches(shape{1, 28, 28});
    ok &= run_workload("mnist_cnn",
                       {static_system<cnn_model, policy::cuda>("static_cuda", data),
                        static_system<cnn_model, policy::cudnn>("static_cudnn", data),
                        dynamic_system("dynamic_cuda", dynamic_cnn(), data)},
                       steps);
  }
  if (workload == "all" || workload == "lstm") {
    const auto data = make_batches(shape{28, 28});
    ok &= run_workload("lstm",
                       {static_system<lstm_model, policy::cuda>("static_cuda", data),
                        static_system<lstm_model, policy::cudnn>("static_cudnn", data),
                        dynamic_system("dynamic_cuda", dynamic_lstm(), data)},
                       steps);
  }
  if (workload == "all" || workload == "gru") {
    const auto data = make_batches(shape{28, 28});
    ok &= run_workload("gru",
                       {static_system<gru_model, policy::cuda>("static_cuda", data),
                        static_system<gru_model, policy::cudnn>("static_cudnn", data),
                        dynamic_system("dynamic_cuda", dynamic_gru(), data)},
                       steps);
  }
  // Evidence that policy::cudnn's recurrent steps ran through cuDNN's RNN, not kiln's step loop.
  const auto rnn_calls = policy::cudnn::rnn_sequence_calls();
  std::printf("cuDNN RNN passes run by static_cudnn: %llu forward, %llu backward\n",
              static_cast<unsigned long long>(rnn_calls.forward), static_cast<unsigned long long>(rnn_calls.backward));
  if (!ok) {
    std::fprintf(stderr, "models_gpu: the systems disagree; no times reported\n");
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "models_gpu: %s\n", e.what());
  return 1;
}
