// The losses added after the first three on the GPU: nll, cross-entropy with class weights, ignore_index and label
// smoothing, and the L1 family (l1, smooth L1, Huber), against policy::cpu on the same inputs, in float and double;
// their *_on_device variants against the host-returning ones (bit for bit); bad labels; and both modes on the GPU
// (this translation unit builds dynamic mode on policy::cuda) against the CPU.
//
// Tolerances, as tests/cuda/test_cuda_kernels.cu's losses: float rel 1e-5, double rel 1e-12 (exp and log differ by a
// few ulps, sums run in double in another order). A gradient element is a difference of values of order one times the
// reduction's scale, so its absolute tolerance is that relative one times the largest gradient element.
#define KILN_DYNAMIC_POLICY ::kiln::policy::cuda
#include "kiln/policy_cuda.cuh"
// policy_cuda.cuh first: the dynamic headers name the policy.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuda_test_helpers.cuh"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using namespace kiln::cuda_test;
using cpu_policy = policy::cpu;
using gpu_policy = policy::cuda;

namespace {

template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

template <class T>
double largest(const std::vector<T>& v) {
  double m = 0;
  for (T x : v) m = std::max(m, std::abs(double(x)));
  return m;
}

template <class T>
std::string label(const std::string& what) {
  return what + (std::is_same_v<T, float> ? " float" : " double");
}

// Labels in [0, classes), with every fifth row given `ignored` when set.
std::vector<std::int64_t> random_labels(index_t rows, index_t classes, std::optional<std::int64_t> ignored) {
  std::vector<std::int64_t> labels(static_cast<std::size_t>(rows));
  random_generator rng(61);
  for (auto& l : labels) l = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(classes)));
  if (ignored)
    for (std::size_t i = 0; i < labels.size(); i += 5) labels[i] = *ignored;
  return labels;
}

}  // namespace

TEST_CASE_TEMPLATE("nll and cross-entropy with options match the CPU, and their on-device losses the host's", T, float,
                   double) {
  const double tol = tolerance<T>();
  for (auto [rows, classes] : {std::pair<index_t, index_t>{1, 1}, {7, 3}, {64, 10}, {1000, 10}, {5, 1000}, {3, 37}}) {
    const auto input = random_values<T>(rows * classes, 62, T(-6), T(6));
    const auto weight = random_values<T>(classes, 63, T(0.25), T(2));
    auto input_d = to_device(input), weight_d = to_device(weight);
    kiln::cuda::device_buffer<T> grad_d(rows * classes), loss_d(1);
    std::vector<T> grad(static_cast<std::size_t>(rows * classes));
    for (bool weighted : {false, true})
      for (std::optional<std::int64_t> ignored : {std::optional<std::int64_t>(), std::optional<std::int64_t>(-100),
                                                  std::optional<std::int64_t>(0)})
        for (T smoothing : {T(0), T(0.2)})
          for (reduction r : {reduction::mean, reduction::sum}) {
            const auto labels = random_labels(rows, classes, ignored);
            auto labels_d = to_device(labels);
            kernels::class_loss_options<T> cpu_options{weighted ? weight.data() : nullptr, ignored.has_value(),
                                                       ignored.value_or(0), smoothing};
            auto gpu_options = cpu_options;
            gpu_options.weight = weighted ? weight_d.data() : nullptr;
            const std::string what = label<T>(std::to_string(rows) + "x" + std::to_string(classes) +
                                              (weighted ? " weighted" : "") + (ignored ? " ignoring" : "") +
                                              (smoothing != T(0) ? " smoothed" : "") +
                                              (r == reduction::mean ? " mean" : " sum"));
            if (ignored && rows == 1) continue;  // every row ignored: NaN on both, checked elsewhere
            // Cross-entropy, upstream gradient 1.3.
            const T cpu_ce = cpu_policy::softmax_cross_entropy(input.data(), labels.data(), rows, classes, r,
                                                               cpu_options, grad.data(), T(1.3));
            const T gpu_ce = gpu_policy::softmax_cross_entropy(input_d.data(), labels_d.data(), rows, classes, r,
                                                               gpu_options, grad_d.data(), T(1.3));
            check_close(std::vector<T>{gpu_ce}, std::vector<T>{cpu_ce}, tol, 0.0, "cross_entropy " + what);
            check_close(to_host(grad_d), grad, tol, tol * largest(grad), "cross_entropy gradient " + what);
            gpu_policy::softmax_cross_entropy_on_device(input_d.data(), labels_d.data(), rows, classes, r, gpu_options,
                                                        grad_d.data(), loss_d.data(), T(1.3));
            check_identical(to_host(loss_d), std::vector<T>{gpu_ce}, "cross_entropy on device " + what);
            if (smoothing != T(0)) continue;
            // nll on the same values (read as log-probabilities: nll is linear in them).
            const T cpu_nll =
                cpu_policy::nll(input.data(), labels.data(), rows, classes, r, cpu_options, grad.data(), T(0.7));
            const T gpu_nll =
                gpu_policy::nll(input_d.data(), labels_d.data(), rows, classes, r, gpu_options, grad_d.data(), T(0.7));
            check_close(std::vector<T>{gpu_nll}, std::vector<T>{cpu_nll}, tol, 0.0, "nll " + what);
            check_close(to_host(grad_d), grad, tol, tol * largest(grad), "nll gradient " + what);
            CHECK(gpu_policy::nll(input_d.data(), labels_d.data(), rows, classes, r, gpu_options,
                                  static_cast<T*>(nullptr)) == gpu_nll);
            gpu_policy::nll_on_device(input_d.data(), labels_d.data(), rows, classes, r, gpu_options, grad_d.data(),
                                      loss_d.data(), T(0.7));
            check_identical(to_host(loss_d), std::vector<T>{gpu_nll}, "nll on device " + what);
          }
  }
}

TEST_CASE_TEMPLATE("l1, smooth L1 and Huber match the CPU, and their on-device losses the host's", T, float, double) {
  const double tol = tolerance<T>();
  using variant = kernels::l1_variant<T>;
  for (index_t n : {index_t(1), index_t(7), index_t(1000), index_t(100'003)}) {
    const auto input = random_values<T>(n, 64, T(-3), T(3));
    auto target = random_values<T>(n, 65, T(-3), T(3));
    target[0] = input[0];  // one zero difference
    auto input_d = to_device(input), target_d = to_device(target);
    kiln::cuda::device_buffer<T> grad_d(n), loss_d(1);
    std::vector<T> grad(static_cast<std::size_t>(n));
    for (const variant& f :
         {variant::l1(), variant::smooth_l1(T(0.5)), variant::smooth_l1(T(0)), variant::huber(T(1.5))})
      for (reduction r : {reduction::mean, reduction::sum}) {
        const std::string what = label<T>("L1 family kind " + std::to_string(int(f.k)) + " threshold " +
                                          std::to_string(double(f.threshold)) + " n=" + std::to_string(n) +
                                          (r == reduction::mean ? " mean" : " sum"));
        const T cpu_loss = cpu_policy::l1_loss(f, input.data(), target.data(), n, r, grad.data(), T(0.9));
        const T gpu_loss = gpu_policy::l1_loss(f, input_d.data(), target_d.data(), n, r, grad_d.data(), T(0.9));
        check_close(std::vector<T>{gpu_loss}, std::vector<T>{cpu_loss}, tol, 0.0, what);
        check_close(to_host(grad_d), grad, tol, tol * largest(grad), what + " gradient");
        gpu_policy::l1_loss_on_device(f, input_d.data(), target_d.data(), n, r, grad_d.data(), loss_d.data(), T(0.9));
        check_identical(to_host(loss_d), std::vector<T>{gpu_loss}, what + " on device");
      }
  }
}

TEST_CASE_TEMPLATE("a label out of range and not ignored throws the CPU's error, and the flag is reset", T, float,
                   double) {
  const auto input = random_values<T>(5 * 10, 66);
  auto input_d = to_device(input);
  const std::vector<std::int64_t> bad = {1, -100, 3, 12, 2};
  auto bad_d = to_device(bad);
  const kernels::class_loss_options<T> ignoring{nullptr, true, -100, T(0.1)};
  CHECK_THROWS_WITH_AS(gpu_policy::softmax_cross_entropy(input_d.data(), bad_d.data(), 5, 10, reduction::mean,
                                                         ignoring, static_cast<T*>(nullptr)),
                       "cross_entropy: expected labels in [0, 10) or the ignore_index -100, found 12 at row 3",
                       kiln::error);
  CHECK_THROWS_WITH_AS(gpu_policy::nll(input_d.data(), bad_d.data(), 5, 10, reduction::sum,
                                       kernels::class_loss_options<T>{}, static_cast<T*>(nullptr)),
                       "nll_loss: expected labels in [0, 10), found -100 at row 1", kiln::error);
  const std::vector<std::int64_t> good = {1, 2, 3, 4, 5};
  auto good_d = to_device(good);
  CHECK_NOTHROW(gpu_policy::nll(input_d.data(), good_d.data(), 5, 10, reduction::mean, ignoring,
                                static_cast<T*>(nullptr)));
}

TEST_CASE("static mode on the GPU: the new losses give the CPU's losses and gradients; class weights upload once") {
  using cpu_net = Sequential<policy::cpu, Input<6>, Dense<8, ReLU>, Dense<4>>;
  using gpu_net = Sequential<policy::cuda, Input<6>, Dense<8, ReLU>, Dense<4>>;
  constexpr index_t batch = 32;
  Tensor<float> x(shape{batch, 6}), targets(shape{batch, 4});
  random_generator rng(67);
  for (auto& v : x.span()) v = rng.normal<float>();
  for (auto& v : targets.span()) v = rng.normal<float>();
  Tensor<std::int64_t> labels(shape{batch});
  for (index_t i = 0; i < batch; ++i) labels[i] = i % 7 == 3 ? -1 : static_cast<std::int64_t>(rng.below(4));
  auto compare = [&](const auto& y, const auto& loss, const char* what) {
    cpu_net on_cpu(batch, 5);
    gpu_net on_gpu(batch, 5);
    const float cpu_loss = on_cpu.forward_backward(x.view(), y.view(), loss);
    for (int call = 0; call < 2; ++call) {  // the second call reads the kept copy of any class weights
      const float gpu_loss = on_gpu.forward_backward(x.view(), y.view(), loss);
      check_close(std::vector<float>{gpu_loss}, std::vector<float>{cpu_loss}, 1e-4, 1e-6, what);
    }
    std::vector<float> cpu_grads(on_cpu.gradient_values().begin(), on_cpu.gradient_values().end());
    const auto gpu_grads = to_host(on_gpu.gradient_values().data(), index_t(on_gpu.gradient_values().size()));
    check_close(gpu_grads, cpu_grads, 1e-3, 1e-5 * largest(cpu_grads), std::string(what) + " gradients");
  };
  const loss::cross_entropy ce{.weight = {0.5, 1, 2, 1.5}, .ignore_index = -1, .label_smoothing = 0.1f};
  compare(labels, ce, "cross_entropy with options");
  compare(labels, loss::nll{.weight = {0.5, 1, 2, 1.5}, .ignore_index = -1}, "nll");
  compare(targets, loss::l1{}, "l1");
  compare(targets, loss::smooth_l1{.beta = 0.5f}, "smooth_l1");
  compare(targets, loss::huber{.delta = 0.8f}, "huber");
}

TEST_CASE("dynamic mode on the GPU: the new losses give the CPU kernels' losses and gradients") {
  constexpr index_t rows = 9, classes = 5;
  const auto logits = random_values<float>(rows * classes, 68, -4.0f, 4.0f);
  const auto target = random_values<float>(rows * classes, 69, -2.0f, 2.0f);
  const std::vector<float> weight = {1, 0.5f, 2, 1.25f, 0.75f};
  const std::vector<std::int64_t> labels = {0, 4, -1, 2, 2, 1, -1, 3, 0};
  const Tensor<float> logits_host(shape{rows, classes}, std::span<const float>(logits));
  const Tensor<float> target_host(shape{rows, classes}, std::span<const float>(target));
  const kernels::class_loss_options<float> options{weight.data(), true, -1, 0.15f};
  auto check = [&](auto dynamic_loss, auto cpu_kernel, const char* what) {
    nn::Variable x(logits_host, true);
    nn::Variable l = dynamic_loss(x);
    l.backward();
    std::vector<float> cpu_grad(logits.size());
    const float cpu_loss = cpu_kernel(cpu_grad.data());
    check_close(std::vector<float>{l.item()}, std::vector<float>{cpu_loss}, 1e-5, 0.0, what);
    check_close(to_host(x.node()->grad, rows * classes), cpu_grad, 1e-5, 1e-5 * largest(cpu_grad),
                std::string(what) + " gradient");
  };
  check([&](const nn::Variable& x) {
    return nn::cross_entropy(x, labels, {.weight = weight, .ignore_index = -1, .label_smoothing = 0.15f});
  }, [&](float* g) {
    return cpu_policy::softmax_cross_entropy(logits.data(), labels.data(), rows, classes, reduction::mean, options, g);
  }, "cross_entropy with options");
  auto nll_options = options;
  nll_options.label_smoothing = 0;
  check([&](const nn::Variable& x) {
    return nn::nll_loss(x, labels, {.reduce = reduction::sum, .weight = weight, .ignore_index = -1});
  }, [&](float* g) {
    return cpu_policy::nll(logits.data(), labels.data(), rows, classes, reduction::sum, nll_options, g);
  }, "nll_loss");
  check([&](const nn::Variable& x) { return nn::huber_loss(x, nn::Variable(target_host), reduction::mean, 0.6f); },
        [&](float* g) {
          return cpu_policy::l1_loss(kernels::l1_variant<float>::huber(0.6f), logits.data(), target.data(),
                                     rows * classes, reduction::mean, g);
        },
        "huber_loss");
  // A bad label is reported on the host before the upload, with the ignored label named.
  nn::Variable x(logits_host, true);
  std::vector<std::int64_t> bad = labels;
  bad[3] = 7;
  CHECK_THROWS_WITH_AS(nn::nll_loss(x, bad, {.ignore_index = -1}),
                       "nll_loss: expected labels in [0, 5) or the ignore_index -1, found 7 at row 3", kiln::error);
}
