// Dynamic mode on the GPU: this translation unit builds kiln's dynamic mode on policy::cuda (KILN_DYNAMIC_POLICY), so
// every Variable's value and gradient live in device memory and every op runs the CUDA kernels. The same models,
// built after kiln::manual_seed(42), must train as static mode's Sequential(batch, 42) does: on the GPU (policy::cuda,
// the same kernels) and on the CPU.
//
// Tolerances: against static mode on the GPU both modes call the same kernels (the models keep ReLU a layer of its
// own, so neither fuses it into the product); 1e-5 of the loss over 20 Adam steps leaves room for a different order
// of operations in the modes' wrappers while a wrong gradient fails by far more. Against the CPU, cuBLAS's summation
// order too: 1e-3, as tests/cuda/test_cuda_static.cu.
#define KILN_DYNAMIC_POLICY ::kiln::policy::cuda
#include "kiln/policy_cuda.cuh"
// policy_cuda.cuh first: the dynamic headers name the policy.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_test_helpers.cuh"
#include "cuda_training_helpers.cuh"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using namespace kiln::cuda_test;

static_assert(std::is_same_v<nn::dynamic_policy, policy::cuda>, "this test builds dynamic mode on policy::cuda");

namespace {

constexpr index_t batch = training_batch;

template <class P>
struct mlp_model {
  using type = Sequential<P, Input<28, 28>, Flatten, Dense<64>, ReLU, Dense<10>>;
  static nn::Sequential dynamic() {
    return nn::Sequential(nn::Flatten(), nn::Linear(784, 64), nn::ReLU(), nn::Linear(64, 10));
  }
  static shape sample() { return shape{28, 28}; }
};
// Convolution, batch norm (running statistics, a buffer incremented on the device), pooling: the ops whose backward
// reads a saved geometry.
template <class P>
struct cnn_model {
  using type = Sequential<P, Input<1, 12, 12>, Conv2D<4, 3>, BatchNorm2d<>, ReLU, MaxPool2D<2>, Flatten, Dense<16>,
                          ReLU, Dense<10>>;
  static nn::Sequential dynamic() {
    return nn::Sequential(nn::Conv2d(1, 4, 3), nn::BatchNorm2d(4), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                          nn::Linear(100, 16), nn::ReLU(), nn::Linear(16, 10));
  }
  static shape sample() { return shape{1, 12, 12}; }
};
template <class P>
struct lstm_model {
  using type = Sequential<P, Input<6, 5>, FinalState<LSTM<8>>, Dense<10>>;
  static nn::Sequential dynamic() {
    return nn::Sequential(nn::FinalState(nn::LSTM(5, 8, {.batch_first = true})), nn::Linear(8, 10));
  }
  static shape sample() { return shape{6, 5}; }
};

// The same with a dynamic model on the GPU: the PyTorch-style loop, the batch uploaded into a Variable each step.
std::vector<float> dynamic_losses(nn::Sequential& model, const batch_data& d, int steps) {
  optim::basic_adam<float, policy::cuda> adam(model.parameters(), {.lr = 1e-3});
  const index_t batches = d.x.extent(0) / batch;
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    const index_t first = (s % batches) * batch;
    adam.zero_grad();
    nn::Variable x(d.x.rows(first, batch));
    nn::Variable loss = nn::cross_entropy(model(x), d.y.rows(first, batch).span());
    loss.backward();
    adam.step();
    losses.push_back(loss.item());
  }
  return losses;
}

std::vector<float> flat(const std::vector<std::pair<std::string, Tensor<float>>>& dict) {
  std::vector<float> out;
  for (const auto& [name, t] : dict) out.insert(out.end(), t.data(), t.data() + t.numel());
  return out;
}

template <template <class> class Model>
void check_dynamic_on_gpu(double cpu_tolerance, const char* what) {
  CAPTURE(what);
  const batch_data d = make_data(Model<policy::cpu>::sample(), 4 * batch, 11);
  typename Model<policy::cpu>::type cpu_net(batch, 42);
  typename Model<policy::cuda>::type gpu_net(batch, 42);
  manual_seed(42);
  nn::Sequential model = Model<policy::cpu>::dynamic();
  model.train();

  // Initial weights: drawn on the host from the same streams, uploaded; state_dict brings them back.
  check_identical(flat(model.state_dict()), flat(cpu_net.state_dict()), std::string(what) + " initial state_dict");

  const auto dynamic = dynamic_losses(model, d, 20);
  const auto on_gpu = train_losses(gpu_net, d, 20);
  const auto on_cpu = train_losses(cpu_net, d, 20);
  for (float l : dynamic) REQUIRE(std::isfinite(l));
  check_close(dynamic, on_gpu, 1e-5, 1e-7, std::string(what) + ": dynamic vs static, both on the GPU, 20 Adam steps");
  check_close(dynamic, on_cpu, cpu_tolerance, 1e-6, std::string(what) + ": dynamic on the GPU vs static on the CPU");

  // Inference under no_grad, and the weights it used, against the static GPU model loaded with the same weights.
  gpu_net.load_state_dict(model.state_dict());
  model.eval();
  const auto x = d.x.rows(0, batch);
  Tensor<float> dynamic_out;
  {
    nn::no_grad guard;
    dynamic_out = model(nn::Variable(x)).tensor();
  }
  const auto static_out = gpu_net.predict(x);
  check_close(std::vector<float>(dynamic_out.data(), dynamic_out.data() + dynamic_out.numel()),
              std::vector<float>(static_out.data(), static_out.data() + static_out.numel()), 1e-5, 1e-6,
              std::string(what) + " eval forward");

  // load_state_dict uploads: a fresh dynamic model loaded from the trained one holds the same values.
  manual_seed(7);
  nn::Sequential copy = Model<policy::cpu>::dynamic();
  copy.load_state_dict(model.state_dict());
  check_identical(flat(copy.state_dict()), flat(model.state_dict()), std::string(what) + " state_dict round trip");
}

}  // namespace

TEST_CASE("dynamic MLP on the GPU trains as static mode does") { check_dynamic_on_gpu<mlp_model>(1e-3, "MLP"); }
// BatchNorm's statistics are summed in another order on the GPU: 2e-3 against the CPU, as test_cuda_static.
TEST_CASE("dynamic CNN (Conv2d, BatchNorm2d, MaxPool2d) on the GPU trains as static mode does") {
  check_dynamic_on_gpu<cnn_model>(2e-3, "CNN");
}
TEST_CASE("dynamic LSTM on the GPU trains as static mode does") { check_dynamic_on_gpu<lstm_model>(1e-3, "LSTM"); }

TEST_CASE("dynamic mode on the GPU: values, gradients and item() cross to the host only on request") {
  nn::Variable a(Tensor<float>(shape{2, 3}, {1, 2, 3, 4, 5, 6}), true);
  nn::Variable b(Tensor<float>(shape{2, 3}, {0.5f, -1, 2, 0, 1, -2}), true);
  nn::Variable loss = nn::sum(a * b);
  CHECK(loss.item() == doctest::Approx(0.5 - 2 + 6 + 0 + 5 - 12));
  loss.backward();
  // d(sum a*b)/da = b and /db = a; the gradients are device memory, read back through a host copy.
  const auto da = to_host(a.node()->grad, 6), db = to_host(b.node()->grad, 6);
  check_identical(da, std::vector<float>{0.5f, -1, 2, 0, 1, -2}, "grad of a");
  check_identical(db, std::vector<float>{1, 2, 3, 4, 5, 6}, "grad of b");
  // A second backward through a fresh graph accumulates into the leaves' gradients.
  nn::sum(a * b).backward();
  check_identical(to_host(a.node()->grad, 6), std::vector<float>{1, -2, 4, 0, 2, -4}, "accumulated grad of a");
  // zero_grad is lazy (PyTorch's set_to_none): the buffer keeps its old values until grad() reads it, which writes
  // the zeros, or a backward overwrites it. Both on the GPU, as on the CPU.
  a.zero_grad();
  check_identical(to_host(a.grad().data(), 6), std::vector<float>(6, 0.0f), "zeroed grad of a");
  b.zero_grad();
  nn::sum(a * b).backward();
  check_identical(to_host(b.node()->grad, 6), std::vector<float>{1, 2, 3, 4, 5, 6}, "grad of b after zero_grad");
  check_identical(to_host(a.node()->grad, 6), std::vector<float>{0.5f, -1, 2, 0, 1, -2}, "grad of a after zero_grad");
  // A bad label is still reported (the GPU kernel flags it, the host throws).
  nn::Variable logits(Tensor<float>(shape{2, 3}), true);
  const std::vector<std::int64_t> labels = {0, 3};
  CHECK_THROWS_AS(nn::cross_entropy(logits, std::span<const std::int64_t>(labels)), kiln::error);
}
