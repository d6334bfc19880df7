// Every kernel of policy::cuda that is not a CNN or recurrent one, against policy::cpu on the same random inputs, in
// float and double, at sizes that are odd, tiny, zero and larger than one vector or one block, and from misaligned
// pointers (which take the scalar path of the vectorised kernels).
//
// Tolerances, and why:
// - Exact (bit-identical): ReLU, leaky ReLU and identity, bias, add / subtract / multiply / scale, copy, fill, dropout
//   masks and outputs, dropout backward, column sums with few rows. These are single IEEE operations (or a fixed
//   sequence of them) that CPU and GPU round the same way.
// - A few ulps (float rel 1e-5, double rel 1e-12): activations and losses that call exp, erf, tanh, log1p. CUDA's
//   float versions are within 2 ulps of the correctly rounded value, glibc's within 1-2; a formula chains a handful.
//   Also the optimizer updates and axpy, where either compiler may fuse a multiply and an add into one FMA (one
//   rounding fewer).
// - Reductions: the GPU adds in a different order (trees of partial sums). Full sums run in double on both sides, so
//   the float results agree to rel 1e-6; softmax's float sums over a row reorder at most `size` terms: rel 1e-5 plus
//   abs 1e-7 near zero.
// - GEMM: any order of a k-term dot product in precision eps is within k * eps * sum_p |a_ip b_pj| of the exact value
//   (Higham's bound, which also holds for the CPU's order), so CPU and GPU differ by at most twice that, plus beta C's
//   and the epilogue's own rounding. The tests check that bound per element, computed in double on the host. TF32
//   rounds the inputs to a 10-bit mantissa first: eps becomes 2^-11 for the inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_helpers.cuh"
#include "kiln/optim/clip.hpp"
#include "kiln/policy.hpp"
#include "kiln/policy_cuda.cuh"

using namespace kiln;
using namespace kiln::cuda_test;
using cpu_policy = policy::cpu;
using gpu_policy = policy::cuda;

namespace {

const index_t sizes[] = {0, 1, 3, 4, 7, 33, 1000, 4099, 100'003};

const activation all_activations[] = {activation::identity, activation::relu,    activation::leaky_relu,
                                      activation::gelu,     activation::sigmoid, activation::tanh};

bool exact_activation(activation a) {
  return a == activation::identity || a == activation::relu || a == activation::leaky_relu;
}

template <class T>
double ulps_tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

template <class T>
std::string label(const std::string& what, index_t n) {
  return what + (std::is_same_v<T, float> ? " float" : " double") + " n=" + std::to_string(n);
}

}  // namespace

TEST_CASE_TEMPLATE("activations forward and backward", T, float, double) {
  for (index_t n : sizes) {
    for (index_t offset : {index_t(0), index_t(1)}) {  // offset 1: misaligned, the scalar path
      const auto x = random_values<T>(n + offset, 11, T(-4), T(4));
      const auto dy = random_values<T>(n + offset, 12);
      const auto previous = random_values<T>(n + offset, 13);
      auto dx_cpu_acc = previous;
      std::vector<T> y_cpu(x.size()), dx_cpu(x.size());
      auto x_d = to_device(x), dy_d = to_device(dy), prev_d = to_device(previous);
      kiln::cuda::device_buffer<T> y_d(n + offset), dx_d(n + offset);
      for (activation a : all_activations) {
        const T slope = T(0.03);
        const std::string what = label<T>(activation_name(a), n) + " offset " + std::to_string(offset);
        cpu_policy::activation_forward(a, x.data() + offset, y_cpu.data() + offset, n, slope);
        gpu_policy::activation_forward(a, x_d.data() + offset, y_d.data() + offset, n, slope);
        const auto y_gpu = to_host(y_d.data() + offset, n);
        const std::vector<T> y_ref(y_cpu.begin() + offset, y_cpu.end());
        if (exact_activation(a))
          check_identical(y_gpu, y_ref, what + " forward");
        else
          check_close(y_gpu, y_ref, ulps_tolerance<T>(), 1e-30, what + " forward");

        // The backward reads the CPU's forward output on both sides, so only the derivative itself is compared. Its
        // formulas are sums and differences of terms of order 1 (GELU's Phi(x) + x phi(x), 1 - y^2, y (1 - y)), which
        // the GPU's transcendentals give within a few ulps; where they cancel (GELU's derivative crosses zero near
        // x = -0.75) only an absolute error of a few ulps of 1 is meaningful: 16 eps.
        const double backward_abs = exact_activation(a) ? 0.0 : 16 * std::numeric_limits<T>::epsilon();
        auto y_ref_d = to_device(y_cpu);
        const T* x_arg = activation_grad_needs_input(a) ? x.data() + offset : nullptr;
        const T* x_arg_d = activation_grad_needs_input(a) ? x_d.data() + offset : nullptr;
        cpu_policy::activation_backward(a, x_arg, y_cpu.data() + offset, dy.data() + offset, dx_cpu.data() + offset,
                                        n, slope);
        gpu_policy::activation_backward(a, x_arg_d, y_ref_d.data() + offset, dy_d.data() + offset,
                                        dx_d.data() + offset, n, slope);
        const std::vector<T> dx_ref(dx_cpu.begin() + offset, dx_cpu.end());
        check_close(to_host(dx_d.data() + offset, n), dx_ref, exact_activation(a) ? 0.0 : ulps_tolerance<T>(),
                    backward_abs, what + " backward");

        // accumulate = true adds into dx.
        dx_cpu_acc = previous;
        cpu_policy::activation_backward(a, x_arg, y_cpu.data() + offset, dy.data() + offset,
                                        dx_cpu_acc.data() + offset, n, slope, true);
        kiln::cuda::copy_on_device(prev_d.data(), dx_d.data(), n + offset);
        gpu_policy::activation_backward(a, x_arg_d, y_ref_d.data() + offset, dy_d.data() + offset,
                                        dx_d.data() + offset, n, slope, true);
        check_close(to_host(dx_d.data() + offset, n), std::vector<T>(dx_cpu_acc.begin() + offset, dx_cpu_acc.end()),
                    ulps_tolerance<T>(), backward_abs, what + " backward accumulate");
      }
    }
  }
}

TEST_CASE_TEMPLATE("arithmetic, bias, copy and fill", T, float, double) {
  for (index_t n : sizes) {
    const auto a = random_values<T>(n, 21), b = random_values<T>(n, 22);
    auto a_d = to_device(a), b_d = to_device(b);
    kiln::cuda::device_buffer<T> out_d(n);
    std::vector<T> out(static_cast<std::size_t>(n));

    cpu_policy::add(a.data(), b.data(), out.data(), n);
    gpu_policy::add(a_d.data(), b_d.data(), out_d.data(), n);
    check_identical(to_host(out_d), out, label<T>("add", n));
    cpu_policy::subtract(a.data(), b.data(), out.data(), n);
    gpu_policy::subtract(a_d.data(), b_d.data(), out_d.data(), n);
    check_identical(to_host(out_d), out, label<T>("subtract", n));
    cpu_policy::multiply(a.data(), b.data(), out.data(), n);
    gpu_policy::multiply(a_d.data(), b_d.data(), out_d.data(), n);
    check_identical(to_host(out_d), out, label<T>("multiply", n));
    cpu_policy::scale(a.data(), T(-1.7), out.data(), n);
    gpu_policy::scale(a_d.data(), T(-1.7), out_d.data(), n);
    check_identical(to_host(out_d), out, label<T>("scale", n));

    auto y = b;
    auto y_d = to_device(b);
    cpu_policy::axpy(T(0.3), a.data(), y.data(), n);
    gpu_policy::axpy(T(0.3), a_d.data(), y_d.data(), n);
    check_close(to_host(y_d), y, ulps_tolerance<T>(), 1e-30, label<T>("axpy", n));
    y = b;
    y_d = to_device(b);
    cpu_policy::accumulate(a.data(), y.data(), n);
    gpu_policy::accumulate(a_d.data(), y_d.data(), n);
    check_identical(to_host(y_d), y, label<T>("accumulate", n));

    gpu_policy::copy(a_d.data(), out_d.data(), n);
    check_identical(to_host(out_d), a, label<T>("copy", n));
    for (T value : {T(0), T(-0.0), T(2.5)}) {
      std::vector<T> filled(static_cast<std::size_t>(n));
      cpu_policy::fill(filled.data(), value, n);
      gpu_policy::fill(out_d.data(), value, n);
      check_identical(to_host(out_d), filled, label<T>("fill " + std::to_string(double(value)), n));
    }
  }
  for (auto [rows, cols] : {std::pair<index_t, index_t>{1, 1}, {5, 7}, {64, 128}, {3, 1000}, {1000, 3}, {0, 4}}) {
    auto x = random_values<T>(rows * cols, 23);
    const auto bias = random_values<T>(cols, 24);
    auto x_d = to_device(x), bias_d = to_device(bias);
    cpu_policy::add_row_bias(x.data(), bias.data(), rows, cols);
    gpu_policy::add_row_bias(x_d.data(), bias_d.data(), rows, cols);
    check_identical(to_host(x_d), x, label<T>("add_row_bias " + std::to_string(rows) + "x", cols));
  }
}

TEST_CASE_TEMPLATE("reductions", T, float, double) {
  for (index_t n : sizes) {
    const auto x = random_values<T>(n, 31, T(-2), T(3));
    auto x_d = to_device(x);
    const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-13;
    check_close(std::vector<T>{gpu_policy::sum(x_d.data(), n)}, std::vector<T>{cpu_policy::sum(x.data(), n)}, tol,
                1e-30, label<T>("sum", n));
    check_close(std::vector<T>{gpu_policy::sum_abs(x_d.data(), n)}, std::vector<T>{cpu_policy::sum_abs(x.data(), n)},
                tol, 1e-30, label<T>("sum_abs", n));
    check_close(std::vector<T>{gpu_policy::sum_squares(x_d.data(), n)},
                std::vector<T>{cpu_policy::sum_squares(x.data(), n)}, tol, 1e-30, label<T>("sum_squares", n));
  }
  // sum_rows: up to 1024 rows the GPU adds each column in the CPU's order (identical); beyond, in double over 8
  // lanes, against the CPU's float sum, whose own error is at most rows * eps * sum |x| per column.
  for (auto [rows, cols] : {std::pair<index_t, index_t>{1, 1}, {64, 10}, {7, 129}, {1024, 33}, {0, 5}, {5000, 10},
                            {3000, 300}}) {
    const auto x = random_values<T>(rows * cols, 32);
    const auto previous = random_values<T>(cols, 33);
    auto x_d = to_device(x);
    for (bool accumulate : {false, true}) {
      auto sums = previous;
      auto sums_d = to_device(previous);
      cpu_policy::sum_rows(x.data(), sums.data(), rows, cols, accumulate);
      gpu_policy::sum_rows(x_d.data(), sums_d.data(), rows, cols, accumulate);
      const std::string what = label<T>("sum_rows " + std::to_string(rows) + "x", cols) +
                               (accumulate ? " accumulate" : "");
      if (rows <= 1024) {
        check_identical(to_host(sums_d), sums, what);
      } else {
        const double eps = std::numeric_limits<T>::epsilon();
        check_close(to_host(sums_d), sums, 0.0, double(rows) * eps * double(rows), what);  // sum |x| <= rows
      }
    }
  }
}

TEST_CASE_TEMPLATE("softmax and log-softmax over any dimension", T, float, double) {
  struct extents {
    index_t outer, size, inner;
  };
  for (auto e : {extents{5, 10, 1}, extents{3, 7, 4}, extents{2, 1000, 1}, extents{1, 1, 1}, extents{0, 5, 1},
                 extents{4, 33, 3}, extents{300, 2, 1}, extents{2, 3, 1000}}) {
    const index_t n = e.outer * e.size * e.inner;
    const auto x = random_values<T>(n, 41, T(-5), T(5));
    const auto dy = random_values<T>(n, 42);
    auto x_d = to_device(x), dy_d = to_device(dy);
    for (bool log : {false, true}) {
      const std::string what = label<T>(std::string(log ? "log_softmax" : "softmax") + " " +
                                            std::to_string(e.outer) + "x" + std::to_string(e.size) + "x",
                                        e.inner);
      std::vector<T> y(static_cast<std::size_t>(n));
      kiln::cuda::device_buffer<T> y_d(n);
      cpu_policy::softmax_forward(x.data(), y.data(), e.outer, e.size, e.inner, log);
      gpu_policy::softmax_forward(x_d.data(), y_d.data(), e.outer, e.size, e.inner, log);
      check_close(to_host(y_d), y, ulps_tolerance<T>(), std::is_same_v<T, float> ? 1e-7 : 1e-15, what);

      auto y_ref_d = to_device(y);
      for (bool accumulate : {false, true}) {
        auto dx = dy;
        auto dx_d = to_device(dy);
        cpu_policy::softmax_backward(y.data(), dy.data(), dx.data(), e.outer, e.size, e.inner, log, accumulate);
        gpu_policy::softmax_backward(y_ref_d.data(), dy_d.data(), dx_d.data(), e.outer, e.size, e.inner, log,
                                     accumulate);
        check_close(to_host(dx_d), dx, ulps_tolerance<T>(), std::is_same_v<T, float> ? 1e-6 : 1e-14,
                    what + " backward");
      }
    }
  }
}

TEST_CASE_TEMPLATE("losses and their gradients", T, float, double) {
  const double tol = ulps_tolerance<T>();
  for (index_t n : {index_t(1), index_t(7), index_t(1000), index_t(100'003)}) {
    // Each gradient element is a difference of two values of order 1 (sigmoid(x) - t, x - t) times the reduction's
    // scale: where they nearly cancel only an absolute error of a few ulps of 1, times that scale, is meaningful.
    const double grad_abs_sum = 4 * std::numeric_limits<T>::epsilon();
    const auto input = random_values<T>(n, 51, T(-3), T(3));
    const auto target = random_values<T>(n, 52, T(0), T(1));
    auto input_d = to_device(input), target_d = to_device(target);
    kiln::cuda::device_buffer<T> grad_d(n), loss_d(1);
    std::vector<T> grad(static_cast<std::size_t>(n));
    for (reduction r : {reduction::mean, reduction::sum}) {
      const std::string suffix = r == reduction::mean ? " mean" : " sum";
      const double grad_abs = r == reduction::mean ? grad_abs_sum / double(n) : grad_abs_sum;
      const T cpu_mse = cpu_policy::mse(input.data(), target.data(), n, r, grad.data(), T(0.7));
      const T gpu_mse = gpu_policy::mse(input_d.data(), target_d.data(), n, r, grad_d.data(), T(0.7));
      check_close(std::vector<T>{gpu_mse}, std::vector<T>{cpu_mse}, 1e-6, 0.0, label<T>("mse" + suffix, n));
      check_close(to_host(grad_d), grad, tol, grad_abs, label<T>("mse gradient" + suffix, n));
      gpu_policy::mse_on_device(input_d.data(), target_d.data(), n, r, grad_d.data(), loss_d.data(), T(0.7));
      check_identical(to_host(loss_d), std::vector<T>{gpu_mse}, label<T>("mse on device" + suffix, n));

      const T cpu_bce = cpu_policy::bce_with_logits(input.data(), target.data(), n, r, grad.data(), T(1));
      const T gpu_bce = gpu_policy::bce_with_logits(input_d.data(), target_d.data(), n, r, grad_d.data(), T(1));
      check_close(std::vector<T>{gpu_bce}, std::vector<T>{cpu_bce}, tol, 0.0, label<T>("bce" + suffix, n));
      check_close(to_host(grad_d), grad, tol, grad_abs, label<T>("bce gradient" + suffix, n));
      CHECK(gpu_policy::bce_with_logits(input_d.data(), target_d.data(), n, r, static_cast<T*>(nullptr)) == gpu_bce);
      gpu_policy::bce_with_logits_on_device(input_d.data(), target_d.data(), n, r, grad_d.data(), loss_d.data());
      check_identical(to_host(loss_d), std::vector<T>{gpu_bce}, label<T>("bce on device" + suffix, n));
    }
  }
  for (auto [rows, classes] : {std::pair<index_t, index_t>{1, 1}, {64, 10}, {7, 3}, {1000, 10}, {5, 1000},
                               {3, 37}}) {
    const auto logits = random_values<T>(rows * classes, 53, T(-6), T(6));
    std::vector<std::int64_t> labels(static_cast<std::size_t>(rows));
    random_generator rng(54);
    for (auto& l : labels) l = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(classes)));
    auto logits_d = to_device(logits);
    auto labels_d = to_device(labels);
    kiln::cuda::device_buffer<T> grad_d(rows * classes), loss_d(1);
    std::vector<T> grad(static_cast<std::size_t>(rows * classes));
    for (reduction r : {reduction::mean, reduction::sum}) {
      const std::string what =
          label<T>("cross_entropy " + std::to_string(rows) + "x" + std::to_string(classes), rows * classes);
      // softmax - onehot, times 1.3 and the reduction's scale (see grad_abs_sum above).
      const double grad_abs = 4 * std::numeric_limits<T>::epsilon() * 1.3 / (r == reduction::mean ? double(rows) : 1.0);
      const T cpu_loss =
          cpu_policy::softmax_cross_entropy(logits.data(), labels.data(), rows, classes, r, grad.data(), T(1.3));
      const T gpu_loss =
          gpu_policy::softmax_cross_entropy(logits_d.data(), labels_d.data(), rows, classes, r, grad_d.data(), T(1.3));
      check_close(std::vector<T>{gpu_loss}, std::vector<T>{cpu_loss}, tol, 0.0, what);
      check_close(to_host(grad_d), grad, tol, grad_abs, what + " gradient");
      gpu_policy::softmax_cross_entropy_on_device(logits_d.data(), labels_d.data(), rows, classes, r, grad_d.data(),
                                                  loss_d.data(), T(1.3));
      check_identical(to_host(loss_d), std::vector<T>{gpu_loss}, what + " on device");
    }
  }
}

TEST_CASE_TEMPLATE("a label out of range throws, naming the label and the row, as on the CPU", T, float, double) {
  const auto logits = random_values<T>(5 * 10, 55);
  std::vector<std::int64_t> labels = {1, 2, 3, 12, -1};
  auto logits_d = to_device(logits);
  auto labels_d = to_device(labels);
  CHECK_THROWS_WITH_AS(gpu_policy::softmax_cross_entropy(logits_d.data(), labels_d.data(), 5, 10, reduction::mean,
                                                         static_cast<T*>(nullptr)),
                       "cross_entropy: expected labels in [0, 10), found 12 at row 3", kiln::error);
  // The flag is reset: a valid call afterwards succeeds.
  labels = {1, 2, 3, 4, 5};
  labels_d = to_device(labels);
  CHECK_NOTHROW(gpu_policy::softmax_cross_entropy(logits_d.data(), labels_d.data(), 5, 10, reduction::mean,
                                                  static_cast<T*>(nullptr)));
}

TEST_CASE_TEMPLATE("optimizer updates over a flat buffer, several steps", T, float, double) {
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  for (index_t n : {index_t(1), index_t(7), index_t(1001), index_t(100'003)}) {
    const auto start = random_values<T>(n, 61);
    {  // SGD: plain, with momentum and dampening, Nesterov
      for (auto args : {kernels::cpu::sgd_step_args<T>{T(0.1), T(0), T(0), T(0), false, true},
                        kernels::cpu::sgd_step_args<T>{T(0.1), T(0.9), T(0.1), T(0.01), false, true},
                        kernels::cpu::sgd_step_args<T>{T(0.05), T(0.9), T(0), T(0.001), true, true}}) {
        auto param = start;
        std::vector<T> momentum(static_cast<std::size_t>(n));
        auto param_d = to_device(start);
        kiln::cuda::device_buffer<T> momentum_d(n);
        for (int step = 0; step < 3; ++step) {
          const auto grad = random_values<T>(n, 62 + step);
          auto grad_d = to_device(grad);
          args.first_step = step == 0;
          cpu_policy::sgd_update(param.data(), grad.data(), momentum.data(), n, args);
          gpu_policy::sgd_update(param_d.data(), grad_d.data(), momentum_d.data(), n, args);
        }
        check_close(to_host(param_d), param, tol, 1e-30, label<T>("sgd", n));
        if (args.momentum != T(0)) check_close(to_host(momentum_d), momentum, tol, 1e-30, label<T>("sgd momentum", n));
      }
    }
    {  // Adam, AdamW, AMSGrad
      for (auto args : {kernels::cpu::adam_step_args<T>{T(1e-3), T(0.9), T(0.999), T(1e-8), T(0), false, false, 1},
                        kernels::cpu::adam_step_args<T>{T(1e-2), T(0.8), T(0.99), T(1e-6), T(0.01), true, false, 1},
                        kernels::cpu::adam_step_args<T>{T(1e-2), T(0.9), T(0.999), T(1e-8), T(0.1), false, true, 1}}) {
        auto param = start;
        std::vector<T> m(static_cast<std::size_t>(n)), v(m), vmax(m);
        auto param_d = to_device(start), m_d = to_device(m), v_d = to_device(m), vmax_d = to_device(m);
        for (int step = 1; step <= 3; ++step) {
          const auto grad = random_values<T>(n, 70 + step);
          auto grad_d = to_device(grad);
          args.step = step;
          cpu_policy::adam_update(param.data(), grad.data(), m.data(), v.data(), vmax.data(), n, args);
          gpu_policy::adam_update(param_d.data(), grad_d.data(), m_d.data(), v_d.data(), vmax_d.data(), n, args);
        }
        check_close(to_host(param_d), param, tol, 1e-30, label<T>("adam parameters", n));
        check_close(to_host(m_d), m, tol, 1e-30, label<T>("adam exp_avg", n));
        check_close(to_host(v_d), v, tol, 1e-30, label<T>("adam exp_avg_sq", n));
        if (args.amsgrad) check_close(to_host(vmax_d), vmax, tol, 1e-30, label<T>("adam exp_avg_sq_max", n));
      }
    }
    {  // RMSprop: plain, with weight decay and momentum, centered with momentum
      for (auto args : {kernels::cpu::rmsprop_step_args<T>{T(1e-2), T(0.99), T(1e-8), T(0), T(0), false},
                        kernels::cpu::rmsprop_step_args<T>{T(1e-2), T(0.9), T(1e-8), T(0.01), T(0.9), false},
                        kernels::cpu::rmsprop_step_args<T>{T(5e-3), T(0.9), T(1e-6), T(0), T(0.5), true}}) {
        auto param = start;
        std::vector<T> square_avg(static_cast<std::size_t>(n)), grad_avg(square_avg), momentum(square_avg);
        auto param_d = to_device(start), square_avg_d = to_device(square_avg), grad_avg_d = to_device(square_avg),
             momentum_d = to_device(square_avg);
        for (int step = 0; step < 3; ++step) {
          const auto grad = random_values<T>(n, 75 + step);
          auto grad_d = to_device(grad);
          cpu_policy::rmsprop_update(param.data(), grad.data(), square_avg.data(), grad_avg.data(), momentum.data(),
                                     n, args);
          gpu_policy::rmsprop_update(param_d.data(), grad_d.data(), square_avg_d.data(), grad_avg_d.data(),
                                     momentum_d.data(), n, args);
        }
        check_close(to_host(param_d), param, tol, 1e-30, label<T>("rmsprop parameters", n));
        check_close(to_host(square_avg_d), square_avg, tol, 1e-30, label<T>("rmsprop square_avg", n));
        if (args.centered) check_close(to_host(grad_avg_d), grad_avg, tol, 1e-30, label<T>("rmsprop grad_avg", n));
        if (args.momentum != T(0))
          check_close(to_host(momentum_d), momentum, tol, 1e-30, label<T>("rmsprop momentum_buffer", n));
      }
    }
    {  // Adagrad: plain (a decayed rate), with weight decay and a nonzero initial accumulator
      for (auto args : {kernels::cpu::adagrad_step_args<T>{T(1e-2), T(1e-10), T(0)},
                        kernels::cpu::adagrad_step_args<T>{T(5e-2), T(1e-6), T(0.01)}}) {
        auto param = start;
        const std::vector<T> initial(static_cast<std::size_t>(n), args.weight_decay != T(0) ? T(0.1) : T(0));
        auto state_sum = initial;
        auto param_d = to_device(start), state_sum_d = to_device(initial);
        for (int step = 0; step < 3; ++step) {
          const auto grad = random_values<T>(n, 78 + step);
          auto grad_d = to_device(grad);
          cpu_policy::adagrad_update(param.data(), grad.data(), state_sum.data(), n, args);
          gpu_policy::adagrad_update(param_d.data(), grad_d.data(), state_sum_d.data(), n, args);
          args.lr /= T(1.1);  // as lr_decay would
        }
        check_close(to_host(param_d), param, tol, 1e-30, label<T>("adagrad parameters", n));
        check_close(to_host(state_sum_d), state_sum, tol, 1e-30, label<T>("adagrad sum", n));
      }
    }
    {  // L1 + L2 penalty gradient
      auto grad = random_values<T>(n, 80);
      auto param = start;
      param[0] = T(0);  // sign(0) = 0
      auto grad_d = to_device(grad), param_d = to_device(param);
      cpu_policy::regularize_gradient(param.data(), grad.data(), n, T(0.01), T(0.001));
      gpu_policy::regularize_gradient(param_d.data(), grad_d.data(), n, T(0.01), T(0.001));
      check_close(to_host(grad_d), grad, tol, 1e-30, label<T>("regularize_gradient", n));
    }
  }
}

TEST_CASE("gradient clipping on the GPU policy gives the CPU's norm and gradients, bit for bit") {
  // The norm is summed on the host from a copy of the gradients; the scaling runs on the device, one multiply each.
  const auto a = random_values<float>(1001, 95, -3.0f, 3.0f), b = random_values<float>(7, 96, -3.0f, 3.0f);
  for (const bool by_value : {false, true}) {
    std::vector<float> a_cpu = a, b_cpu = b, values(1001);
    auto a_d = to_device(a), b_d = to_device(b);
    kiln::cuda::device_buffer<float> values_d(1001);
    const std::vector<optim::parameter_slot<float>> cpu_slots{{values.data(), a_cpu.data(), 1001},
                                                              {values.data(), b_cpu.data(), 7}};
    const std::vector<optim::parameter_slot<float>> gpu_slots{{values_d.data(), a_d.data(), 1001},
                                                              {values_d.data(), b_d.data(), 7}};
    const std::span<const optim::parameter_slot<float>> cpu_view(cpu_slots), gpu_view(gpu_slots);
    if (by_value) {
      optim::clip_grad_value<cpu_policy>(cpu_view, 0.5);
      optim::clip_grad_value<gpu_policy>(gpu_view, 0.5);
    } else {
      const double norm = optim::clip_grad_norm<cpu_policy>(cpu_view, 1.0);
      CHECK(norm > 1.0);
      CHECK(optim::clip_grad_norm<gpu_policy>(gpu_view, 1.0) == norm);
      CHECK(optim::grad_norm<gpu_policy>(gpu_view, std::numeric_limits<double>::infinity()) ==
            optim::grad_norm<cpu_policy>(cpu_view, std::numeric_limits<double>::infinity()));
    }
    CHECK(to_host(a_d) == a_cpu);
    CHECK(to_host(b_d) == b_cpu);
  }
}

TEST_CASE_TEMPLATE("dropout masks are the CPU's, bit for bit, and the generators stay in step", T, float, double) {
  for (index_t n : {index_t(1), index_t(3), index_t(5), index_t(1000), index_t(100'003)}) {
    for (T p : {T(0), T(0.1), T(0.5), T(1)}) {
      for (int skip : {0, 1, 2, 3}) {  // start the stream at every position within a Philox block
        random_generator cpu_rng(1234, 5), gpu_rng(1234, 5);
        for (int i = 0; i < skip; ++i) {
          cpu_rng.next_u32();
          gpu_rng.next_u32();
        }
        const auto x = random_values<T>(n, 91);
        auto x_d = to_device(x);
        std::vector<T> y(x.size()), mask(x.size());
        kiln::cuda::device_buffer<T> y_d(n), mask_d(n);
        const std::string what = label<T>("dropout p=" + std::to_string(double(p)) + " skip " + std::to_string(skip), n);
        for (int call = 0; call < 2; ++call) {  // two calls in a row: the second continues where the first stopped
          cpu_policy::dropout_forward(x.data(), y.data(), mask.data(), n, p, cpu_rng);
          gpu_policy::dropout_forward(x_d.data(), y_d.data(), mask_d.data(), n, p, gpu_rng);
          check_identical(to_host(mask_d), mask, what + " mask");
          check_identical(to_host(y_d), y, what + " output");
          CHECK(gpu_rng.state().position == cpu_rng.state().position);
        }
        CHECK(gpu_rng.next_u32() == cpu_rng.next_u32());

        const auto dy = random_values<T>(n, 92);
        auto dy_d = to_device(dy);
        for (bool accumulate : {false, true}) {
          auto dx = x;
          auto dx_d = to_device(x);
          cpu_policy::dropout_backward(dy.data(), mask.data(), dx.data(), n, accumulate);
          gpu_policy::dropout_backward(dy_d.data(), mask_d.data(), dx_d.data(), n, accumulate);
          check_identical(to_host(dx_d), dx, what + (accumulate ? " backward accumulate" : " backward"));
        }
      }
    }
  }
}

// ---- GEMM -----------------------------------------------------------------------------------------------------------

namespace {

struct gemm_case {
  bool transpose_a, transpose_b;
  index_t m, n, k;
  index_t pad;  // added to every leading dimension
};

// The GEMM problem on the host: inputs, and the per-element error bound of the comparison.
template <class T>
struct gemm_problem {
  gemm_case g;
  index_t lda, ldb, ldc;
  std::vector<T> a, b, c, bias;

  explicit gemm_problem(gemm_case gc, std::uint64_t seed) : g(gc) {
    lda = (g.transpose_a ? g.m : g.k) + g.pad;
    ldb = (g.transpose_b ? g.k : g.n) + g.pad;
    ldc = g.n + g.pad;
    a = random_values<T>((g.transpose_a ? g.k : g.m) * lda, seed);
    b = random_values<T>((g.transpose_b ? g.n : g.k) * ldb, seed + 1);
    c = random_values<T>(g.m * ldc, seed + 2);
    bias = random_values<T>(g.n, seed + 3);
  }
  T a_at(index_t i, index_t p) const { return g.transpose_a ? a[p * lda + i] : a[i * lda + p]; }
  T b_at(index_t p, index_t j) const { return g.transpose_b ? b[j * ldb + p] : b[p * ldb + j]; }

  // Per element of C (row-major m x ldc, padding 0): twice Higham's bound k eps sum |alpha a b|, plus the rounding of
  // beta C, the bias and the activation (slope 1.2 covers GELU's steepest slope).
  std::vector<T> bounds(T alpha, T beta, double eps, bool epilogue) const {
    std::vector<T> out(c.size(), T(0));
    for (index_t i = 0; i < g.m; ++i)
      for (index_t j = 0; j < g.n; ++j) {
        double magnitude = 0;
        for (index_t p = 0; p < g.k; ++p) magnitude += std::abs(double(alpha) * a_at(i, p) * b_at(p, j));
        const double rest = std::abs(double(beta) * c[i * ldc + j]) + (epilogue ? std::abs(double(bias[j])) : 0.0);
        const double value_eps = std::numeric_limits<T>::epsilon();
        double bound = 2 * double(g.k + 2) * eps * magnitude + 4 * value_eps * (magnitude + rest);
        if (epilogue) bound = 1.2 * bound + 4 * value_eps;
        out[i * ldc + j] = static_cast<T>(bound);
      }
    return out;
  }
};

template <class T>
void check_within(const std::vector<T>& gpu, const std::vector<T>& cpu, const std::vector<T>& bound,
                  const std::string& what) {
  REQUIRE(gpu.size() == cpu.size());
  std::size_t worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const double error = std::abs(double(gpu[i]) - double(cpu[i]));
    const double ratio = std::isnan(error) ? 1e300 : (bound[i] > 0 ? error / double(bound[i]) : (error > 0 ? 1e300 : 0));
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (gpu.empty()) return;  // an empty product (m or n = 0): nothing to compare, and no element to name
  std::ostringstream message;
  message << what << ": worst element " << worst << " GPU " << double(gpu[worst]) << " CPU " << double(cpu[worst])
          << " bound " << double(bound[worst]) << " (error / bound = " << worst_ratio << ")";
  CHECK_MESSAGE(worst_ratio <= 1.0, message.str());
}

const gemm_case gemm_shapes[] = {
    {false, false, 1, 1, 1, 0},     {false, false, 7, 5, 3, 0},     {false, true, 64, 128, 784, 0},
    {true, false, 33, 17, 65, 3},   {true, true, 129, 65, 31, 1},   {false, true, 10, 128, 64, 0},
    {true, false, 784, 128, 64, 0}, {false, false, 0, 4, 4, 0},     {false, false, 4, 0, 4, 0},
    {false, false, 4, 4, 0, 0},     {true, true, 5, 9, 1000, 2},    {false, false, 256, 256, 256, 0}};

template <class T>
std::string gemm_label(const gemm_case& g, const std::string& path) {
  return path + (std::is_same_v<T, float> ? " float " : " double ") + (g.transpose_a ? "T" : "N") +
         (g.transpose_b ? "T" : "N") + " m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
         " k=" + std::to_string(g.k) + " pad=" + std::to_string(g.pad);
}

// Runs C = act(alpha op(A) op(B) + beta C + bias) through `run` on the device and through the CPU, and compares.
template <class T, class Run>
void compare_gemm(const gemm_problem<T>& p, T alpha, T beta, const kernels::cpu::epilogue<T>& host_ep, double eps,
                  const std::string& what, Run run) {
  auto a_d = to_device(p.a), b_d = to_device(p.b), c_d = to_device(p.c), bias_d = to_device(p.bias);
  kernels::cpu::epilogue<T> device_ep = host_ep;
  if (host_ep.bias) device_ep.bias = bias_d.data();
  auto c = p.c;
  cpu_policy::gemm(p.g.transpose_a, p.g.transpose_b, p.g.m, p.g.n, p.g.k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb,
                   beta, c.data(), p.ldc, host_ep);
  run(a_d.data(), b_d.data(), c_d.data(), device_ep);
  const bool epilogue = host_ep.bias || host_ep.act != activation::identity;
  auto bound = p.bounds(alpha, beta, eps, epilogue);
  // Padding columns must be untouched: bound 0 there and identical values on both sides.
  check_within(to_host(c_d), c, bound, what);
}

}  // namespace

TEST_CASE_TEMPLATE("GEMM through cuBLAS and cuBLASLt, all four transpose cases, with and without epilogues", T, float,
                   double) {
  const double eps = std::numeric_limits<T>::epsilon();
  std::uint64_t seed = 100;
  for (const gemm_case& g : gemm_shapes) {
    const gemm_problem<T> p(g, seed += 10);
    for (auto [alpha, beta] : {std::pair<T, T>{T(1), T(0)}, std::pair<T, T>{T(0.5), T(-1.5)}}) {
      const std::string ab = " alpha=" + std::to_string(double(alpha)) + " beta=" + std::to_string(double(beta));
      compare_gemm<T>(p, alpha, beta, {}, eps, gemm_label<T>(g, "policy gemm") + ab,
                      [&](const T* a, const T* b, T* c, const kernels::cpu::epilogue<T>& ep) {
                        gpu_policy::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, alpha, a, p.lda, b, p.ldb, beta,
                                         c, p.ldc, ep);
                      });
      for (activation act : all_activations) {
        for (bool with_bias : {false, true}) {
          kernels::cpu::epilogue<T> ep{with_bias ? p.bias.data() : nullptr, act, T(0.02)};
          if (!with_bias && act == activation::identity) continue;
          const std::string what = std::string(" epilogue ") + activation_name(act) + (with_bias ? "+bias" : "") + ab;
          compare_gemm<T>(p, alpha, beta, ep, eps, gemm_label<T>(g, "cuBLASLt") + what,
                          [&](const T* a, const T* b, T* c, const kernels::cpu::epilogue<T>& dep) {
                            gpu_policy::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, alpha, a, p.lda, b, p.ldb,
                                             beta, c, p.ldc, dep);
                          });
          compare_gemm<T>(p, alpha, beta, ep, eps, gemm_label<T>(g, "cuBLAS + epilogue kernel") + what,
                          [&](const T* a, const T* b, T* c, const kernels::cpu::epilogue<T>& dep) {
                            kernels::cuda::gemm_cublas(g.transpose_a, g.transpose_b, g.m, g.n, g.k, alpha, a, p.lda, b,
                                                       p.ldb, beta, c, p.ldc, dep);
                          });
        }
      }
    }
  }
}

TEST_CASE("the cuBLASLt path agrees with the cuBLAS path, and its plans are cached") {
  const gemm_case g{false, true, 64, 128, 784, 0};
  const gemm_problem<float> p(g, 500);
  auto a_d = to_device(p.a), b_d = to_device(p.b), bias_d = to_device(p.bias);
  kiln::cuda::device_buffer<float> c1(g.m * p.ldc), c2(g.m * p.ldc);
  const kernels::cpu::epilogue<float> ep{bias_d.data(), activation::relu, 0.0f};
  kernels::cuda::gemm_cublaslt(false, true, g.m, g.n, g.k, 1.0f, a_d.data(), p.lda, b_d.data(), p.ldb, 0.0f, c1.data(),
                               p.ldc, ep);
  kernels::cuda::gemm_cublas(false, true, g.m, g.n, g.k, 1.0f, a_d.data(), p.lda, b_d.data(), p.ldb, 0.0f, c2.data(),
                             p.ldc, ep);
  check_within(to_host(c1), to_host(c2), p.bounds(1.0f, 0.0f, std::numeric_limits<float>::epsilon(), true),
               "cuBLASLt vs cuBLAS, Dense 784->128 ReLU");
  const std::size_t plans = kernels::cuda::detail::lt_plan_cache::instance().size();
  for (int i = 0; i < 3; ++i)
    kernels::cuda::gemm_cublaslt(false, true, g.m, g.n, g.k, 1.0f, a_d.data(), p.lda, b_d.data(), p.ldb, 0.0f,
                                 c1.data(), p.ldc, ep);
  CHECK(kernels::cuda::detail::lt_plan_cache::instance().size() == plans);
}

// policy::cuda_tf32's products are the TF32 ones (its using-declarations hide policy::cuda's FP32 products); checked
// here because FP32 results would pass the tolerance below too.
static_assert(&policy::cuda_tf32::gemm<float> == &policy::cuda_gemm<kernels::cuda::gemm_math::tf32>::gemm<float>);
static_assert(&policy::cuda_tf32::gemm_strided_batched<float> ==
              &policy::cuda_gemm<kernels::cuda::gemm_math::tf32>::gemm_strided_batched<float>);
static_assert(&policy::cuda::gemm<float> == &policy::cuda_gemm<kernels::cuda::gemm_math::fp32>::gemm<float>);

TEST_CASE("TF32 GEMMs (policy::cuda_tf32) agree within TF32's precision") {
  const double tf32_eps = std::ldexp(1.0, -10);  // inputs rounded to 10 explicit mantissa bits
  std::uint64_t seed = 700;
  for (const gemm_case& g : gemm_shapes) {
    const gemm_problem<float> p(g, seed += 10);
    compare_gemm<float>(p, 1.0f, 0.0f, {}, tf32_eps, gemm_label<float>(g, "tf32"),
                        [&](const float* a, const float* b, float* c, const kernels::cpu::epilogue<float>& ep) {
                          policy::cuda_tf32::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, 1.0f, a, p.lda, b,
                                                  p.ldb, 0.0f, c, p.ldc, ep);
                        });
    kernels::cpu::epilogue<float> ep{p.bias.data(), activation::relu, 0.0f};
    compare_gemm<float>(p, 1.0f, 0.0f, ep, tf32_eps, gemm_label<float>(g, "tf32 bias+relu"),
                        [&](const float* a, const float* b, float* c, const kernels::cpu::epilogue<float>& dep) {
                          policy::cuda_tf32::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, 1.0f, a, p.lda, b,
                                                  p.ldb, 0.0f, c, p.ldc, dep);
                        });
  }
}

TEST_CASE("what cuBLASLt's own GELU epilogue computes (why kiln runs its exact GELU as a second kernel)") {
  // A 1 x n product with k = 1, a = 1: C = GELU(b + bias) over a range of inputs.
  const index_t n = 1001;
  std::vector<float> b(static_cast<std::size_t>(n));
  for (index_t j = 0; j < n; ++j) b[j] = -5.0f + 10.0f * float(j) / float(n - 1);
  const std::vector<float> a = {1.0f}, bias(static_cast<std::size_t>(n), 0.0f);
  auto a_d = to_device(a), b_d = to_device(b), bias_d = to_device(bias);
  kiln::cuda::device_buffer<float> c_d(n);
  if (!kernels::cuda::gemm_cublaslt_raw(false, false, 1, n, 1, 1.0f, a_d.data(), 1, b_d.data(), n, 0.0f, c_d.data(),
                                        n, CUBLASLT_EPILOGUE_GELU_BIAS, bias_d.data())) {
    MESSAGE("cuBLASLt has no algorithm for this probe");
    return;
  }
  const auto c = to_host(c_d);
  double exact_error = 0, tanh_error = 0;
  for (index_t j = 0; j < n; ++j) {
    const double x = b[j];
    const double exact = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    const double approx = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    exact_error = std::max(exact_error, std::abs(c[j] - exact));
    tanh_error = std::max(tanh_error, std::abs(c[j] - approx));
  }
  MESSAGE("cuBLASLt GELU epilogue: max |error| vs exact GELU " << exact_error << ", vs tanh approximation "
                                                                << tanh_error);
  CHECK(std::min(exact_error, tanh_error) < 1e-3);
}

// Attention (kernels/cuda/attention.cuh) against the CPU's tiled kernel: lengths that fill no tile, every mask kind,
// causal or not, dropout (the same draws), and gradients that are written or added to what is there.
TEST_CASE_TEMPLATE("attention forward and backward, every mask kind, causal and dropout", T, float, double) {
  const double tol = std::is_same_v<T, float> ? 2e-4 : 1e-10;
  struct shape_case {
    index_t batch, queries, keys, head_dim, value_dim;
    bool causal;
    kernels::attention_mask_kind mask;
    double dropout;
  };
  using kernels::attention_mask_kind;
  for (const shape_case c : {shape_case{3, 37, 45, 24, 40, false, attention_mask_kind::none, 0.0},
                             shape_case{2, 50, 50, 32, 32, true, attention_mask_kind::none, 0.0},
                             shape_case{4, 19, 33, 16, 8, false, attention_mask_kind::boolean, 0.0},
                             shape_case{2, 40, 40, 64, 64, true, attention_mask_kind::additive, 0.0},
                             shape_case{2, 21, 29, 8, 12, false, attention_mask_kind::none, 0.25}}) {
    CAPTURE(c.queries);
    CAPTURE(c.causal);
    const index_t B = c.batch, L = c.queries, S = c.keys, E = c.head_dim, Ev = c.value_dim;
    const auto q = random_values<T>(B * L * E, 1), k = random_values<T>(B * S * E, 2),
               v = random_values<T>(B * S * Ev, 3), dout = random_values<T>(B * L * Ev, 4);
    // A [L, S] mask shared by every batch entry (offsets 0): keeps about 3 keys in 4, or adds values in [-2, 0).
    auto mask = random_values<T>(L * S, 5, T(-2), T(0));
    if (c.mask == attention_mask_kind::boolean)
      for (auto& m : mask) m = m > T(-1.5) ? T(1) : T(0);
    const std::vector<index_t> offsets(static_cast<std::size_t>(B), 0);
    kernels::cpu::attention_problem<T> p;
    p.batch = B;
    p.queries = L;
    p.keys = S;
    p.head_dim = E;
    p.value_dim = Ev;
    p.scale = T(1) / std::sqrt(T(E));
    p.causal = c.causal;
    p.mask_kind = c.mask;
    p.mask_offset = offsets.data();
    p.mask_row_stride = S;
    p.mask_col_stride = 1;
    p.dropout = kernels::attention_dropout::make(c.dropout, random_stream_position_of(random_generator(9)));
    // The CPU's results.
    std::vector<T> out(static_cast<std::size_t>(B * L * Ev)), lse(static_cast<std::size_t>(B * L)),
        dq(q.size()), dk(k.size()), dv(v.size(), T(0.5));
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.mask = mask.data();
    kernels::cpu::attention_forward(p, out.data(), lse.data());
    kernels::cpu::attention_backward(p, out.data(), lse.data(), dout.data(), {dq.data(), false}, {dk.data(), false},
                                     {dv.data(), true});
    // The GPU's.
    auto q_d = to_device(q), k_d = to_device(k), v_d = to_device(v), mask_d = to_device(mask),
         dout_d = to_device(dout), out_d = to_device(out), lse_d = to_device(lse), gq = to_device(dq),
         gk = to_device(dk), gv = to_device(std::vector<T>(v.size(), T(0.5)));
    p.q = q_d.data();
    p.k = k_d.data();
    p.v = v_d.data();
    p.mask = mask_d.data();
    policy::cuda::attention_forward(p, out_d.data(), lse_d.data());
    check_close(to_host(out_d), out, tol, tol, "attention output");
    check_close(to_host(lse_d), lse, tol, tol, "attention log-sum-exp");
    policy::cuda::attention_backward(p, static_cast<const T*>(out_d.data()), static_cast<const T*>(lse_d.data()),
                                     static_cast<const T*>(dout_d.data()), {gq.data(), false}, {gk.data(), false},
                                     {gv.data(), true});
    check_close(to_host(gq), dq, tol, tol, "attention dq");
    check_close(to_host(gk), dk, tol, tol, "attention dk");
    check_close(to_host(gv), dv, tol, tol, "attention dv (added to 0.5)");
  }
}
