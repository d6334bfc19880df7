// Loss kernels: mean squared error, softmax cross-entropy from logits with integer labels (fused: one pass gives the
// loss and the gradient), binary cross-entropy with logits. Each returns the loss and, when asked, writes dL/dinput
// scaled by an upstream gradient.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/reduce.hpp"

namespace kiln {

// How a loss folds per-element values into one number.
enum class reduction { mean, sum };

namespace kernels::cpu {

// The loss kernels of the CPU policies.
struct loss_kernels {
  // L = reduce((input - target)^2). grad (optional) = upstream * dL/dinput.
  // The squares are summed in `mse_chains` interleaved chains (element i into chain i % mse_chains), then pairwise:
  // one chain waited on the latency of every add (1000 elements: 1.1 us of a 40 us training step).
  static constexpr int mse_chains = 8;
  template <class T>
  static T mse(const T* input, const T* target, index_t n, reduction r, T* grad, T upstream = T(1)) {
    sum_type<T> chain[mse_chains] = {};
    index_t i = 0;
    for (; i + mse_chains <= n; i += mse_chains)
      for (int c = 0; c < mse_chains; ++c) {
        const T d = input[i + c] - target[i + c];
        chain[c] += sum_type<T>(d) * d;
      }
    for (int c = 0; c < mse_chains && i < n; ++i, ++c) {  // the last n % mse_chains elements
      const T d = input[i] - target[i];
      chain[c] += sum_type<T>(d) * d;
    }
    for (int width = mse_chains / 2; width > 0; width /= 2)
      for (int c = 0; c < width; ++c) chain[c] += chain[c + width];
    const sum_type<T> total = chain[0];
    T scale = r == reduction::mean ? T(1) / static_cast<T>(n) : T(1);
    if (grad) {
      T factor = T(2) * scale * upstream;
      for (index_t i = 0; i < n; ++i) grad[i] = factor * (input[i] - target[i]);
    }
    return static_cast<T>(total) * scale;
  }

  // Cross-entropy of rows x classes logits against integer labels, through a stable log-softmax, fused with its
  // gradient: dL/dlogits = (softmax(logits) - onehot(label)) * scale. Labels outside [0, classes) throw.
  // Each e^(x - max) is computed once, by exp_value: with a gradient, a loop that vectorises writes them into the
  // gradient row, which then sums and scales them in place. libm's expf, called twice per logit, took 3.6 us of an
  // MNIST MLP step (64 x 10). The loss is the same with or without a gradient: both sum the same values in order.
  template <class T>
  static T softmax_cross_entropy(const T* logits, const std::int64_t* labels, index_t rows, index_t classes,
                                 reduction r, T* grad, T upstream = T(1)) {
    for (index_t row = 0; row < rows; ++row)
      if (labels[row] < 0 || labels[row] >= classes)
        fail("cross_entropy: expected labels in [0, ", classes, "), found ", labels[row], " at row ", row);
    const T scale = r == reduction::mean ? T(1) / static_cast<T>(rows) : T(1);
    const T factor = scale * upstream;
    sum_type<T> total = 0;
    for (index_t row = 0; row < rows; ++row) {
      const T* x = logits + row * classes;
      const T label_logit = x[labels[row]];  // read before the gradient row, which may alias the logits, is written
      T max_value = -std::numeric_limits<T>::infinity();
      for (index_t c = 0; c < classes; ++c) max_value = std::max(max_value, x[c]);
      T exp_sum = 0;
      if (grad) {
        T* g = grad + row * classes;
        for (index_t c = 0; c < classes; ++c) g[c] = exp_value(x[c] - max_value);
        for (index_t c = 0; c < classes; ++c) exp_sum += g[c];
        const T inverse = T(1) / exp_sum;
        for (index_t c = 0; c < classes; ++c) g[c] = g[c] * inverse * factor;
        g[labels[row]] -= factor;
      } else {
        for (index_t c = 0; c < classes; ++c) exp_sum += exp_value(x[c] - max_value);
      }
      total += std::log(exp_sum) - (label_logit - max_value);  // as log_softmax: large logits cancel exactly first
    }
    return static_cast<T>(total) * scale;
  }

  // L = reduce(max(x, 0) - x * t + log(1 + exp(-|x|))), the stable form of -[t log s(x) + (1 - t) log(1 - s(x))].
  // dL/dx = sigmoid(x) - t.
  template <class T>
  static T bce_with_logits(const T* logits, const T* target, index_t n, reduction r, T* grad, T upstream = T(1)) {
    sum_type<T> total = 0;
    for (index_t i = 0; i < n; ++i) {
      T x = logits[i];
      total += std::max(x, T(0)) - x * target[i] + std::log1p(std::exp(-std::abs(x)));
    }
    T scale = r == reduction::mean ? T(1) / static_cast<T>(n) : T(1);
    if (grad) {
      T factor = scale * upstream;
      for (index_t i = 0; i < n; ++i) grad[i] = (T(1) / (T(1) + std::exp(-logits[i])) - target[i]) * factor;
    }
    return static_cast<T>(total) * scale;
  }
};

}  // namespace kernels::cpu
}  // namespace kiln
