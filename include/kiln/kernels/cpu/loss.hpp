// Loss kernels: mean squared error, softmax cross-entropy from logits with integer labels (fused: one pass gives the
// loss and the gradient), negative log-likelihood, binary cross-entropy with logits, and the L1 family (l1, smooth
// L1, Huber). Each returns the loss and, when asked, writes dL/dinput scaled by an upstream gradient. The *_elements
// and *_rows kernels give reduction::none's losses instead: one per element (one per row for the classification
// losses), with each one's gradient.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/class_loss_options.hpp"
#include "kiln/kernels/cpu/reduce.hpp"
#include "kiln/kernels/l1_variant.hpp"

namespace kiln {

// How a loss folds per-element values into one number, or (none) keeps them: one loss per element, or per row for
// the classification losses, as PyTorch's reduction="none". Only dynamic mode's functional losses keep them; a
// static model trains on one number.
enum class reduction { mean, sum, none };

namespace kernels {
// The scale of a reduction over `count` values: 1 / count for the mean, 1 for the sum. reduction::none has no scale:
// a kernel that reduces was asked for per-element losses, which is an error that names the loss.
template <class T>
T reduction_scale(const char* loss, reduction r, index_t count) {
  if (r == reduction::none)
    fail(loss, ": expected reduction mean or sum, found none (one loss per element; dynamic mode's functional ",
         "losses give them, a static model trains on one number)");
  return r == reduction::mean ? T(1) / static_cast<T>(count) : T(1);
}
}  // namespace kernels

namespace kernels::cpu {

// The loss kernels of the CPU policies.
struct loss_kernels {
  // One row of softmax_cross_entropy: writes the row's gradient (g, unless null) scaled by factor and returns the
  // row's loss, -log softmax(x)[label], which the callers add up in order.
  template <class T>
  static T softmax_cross_entropy_row(const T* x, std::int64_t label, index_t classes, T* g, T factor) {
    const T label_logit = x[label];  // read before the gradient row, which may alias the logits, is written
    T max_value = -std::numeric_limits<T>::infinity();
    for (index_t c = 0; c < classes; ++c) max_value = std::max(max_value, x[c]);
    T exp_sum = 0;
    if (g) {
      for (index_t c = 0; c < classes; ++c) g[c] = exp_value(x[c] - max_value);
      for (index_t c = 0; c < classes; ++c) exp_sum += g[c];
      const T inverse = T(1) / exp_sum;
      for (index_t c = 0; c < classes; ++c) g[c] = g[c] * inverse * factor;
      g[label] -= factor;
    } else {
      for (index_t c = 0; c < classes; ++c) exp_sum += exp_value(x[c] - max_value);
    }
    return std::log(exp_sum) - (label_logit - max_value);  // as log_softmax: large logits cancel exactly first
  }

  // L = reduce((input - target)^2). grad (optional) = upstream * dL/dinput.
  // The squares are summed in `mse_chains` interleaved chains (element i into chain i % mse_chains), then pairwise:
  // one chain waits on the latency of every add.
  static constexpr int mse_chains = 8;
  template <class T>
  KILN_KERNEL static T mse(const T* input, const T* target, index_t n, reduction r, T* grad, T upstream = T(1)) {
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
    const T scale = reduction_scale<T>("mse", r, n);
    if (grad) {
      T factor = T(2) * scale * upstream;
      for (index_t i = 0; i < n; ++i) grad[i] = factor * (input[i] - target[i]);
    }
    return static_cast<T>(total) * scale;
  }

  // Cross-entropy of rows x classes logits against integer labels, through a stable log-softmax, fused with its
  // gradient: dL/dlogits = (softmax(logits) - onehot(label)) * scale. Labels outside [0, classes) throw.
  // Each e^(x - max) is computed once, by exp_value: with a gradient, a loop that vectorises writes them into the
  // gradient row, which then sums and scales them in place, rather than libm's expf called twice per logit, a visible
  // share of a small classifier's step. The loss is the same with or without a gradient: both sum the same values in
  // order.
  template <class T>
  KILN_KERNEL static T softmax_cross_entropy(const T* logits, const std::int64_t* labels, index_t rows,
                                             index_t classes, reduction r, T* grad, T upstream = T(1)) {
    check_class_labels("cross_entropy", labels, rows, classes, class_loss_options<T>{});
    const T scale = reduction_scale<T>("cross_entropy", r, rows);
    const T factor = scale * upstream;
    sum_type<T> total = 0;
    for (index_t row = 0; row < rows; ++row)
      total += softmax_cross_entropy_row(logits + row * classes, labels[row], classes,
                                         grad ? grad + row * classes : nullptr, factor);
    return static_cast<T>(total) * scale;
  }

  // Rows [begin, end) of softmax_cross_entropy: their gradient rows, scaled by `factor` (the whole call's scale times
  // its upstream gradient), and each row's loss before the reduction into row_losses[row]. Summed in row order into
  // a sum_type<T> and scaled, these give the whole call's loss, bit for bit: a caller may share a batch's rows out
  // over threads (kernels/cpu/fused_mlp.hpp). Labels must have been checked.
  template <class T>
  static void softmax_cross_entropy_rows(const T* logits, const std::int64_t* labels, index_t begin, index_t end,
                                         index_t classes, T factor, T* grad, T* row_losses) {
    for (index_t row = begin; row < end; ++row)
      row_losses[row] = softmax_cross_entropy_row(logits + row * classes, labels[row], classes,
                                                  grad ? grad + row * classes : nullptr, factor);
  }

  // Cross-entropy with PyTorch's options (class_loss_options): for a row with label y, weights w (all 1 without
  // o.weight) and smoothing s over C classes, L_row = (1 - s) w_y (-log p_y) + (s / C) sum_c w_c (-log p_c), with p the
  // softmax of the row; ignored rows count for nothing, and the mean divides by the sum of w_y over the counted rows
  // (PyTorch's normalisation: a batch of only ignored rows gives NaN, and a zero gradient). The gradient is
  // p_c ((1 - s) w_y + (s / C) sum w) - (s / C) w_c - (1 - s) w_y [c = y]. Plain options run the kernel above.
  template <class T>
  KILN_KERNEL static T softmax_cross_entropy(const T* logits, const std::int64_t* labels, index_t rows,
                                             index_t classes, reduction r, const class_loss_options<T>& o, T* grad,
                                             T upstream = T(1)) {
    if (o.plain()) return softmax_cross_entropy(logits, labels, rows, classes, r, grad, upstream);
    check_class_loss_options("cross_entropy", 0, classes, o.label_smoothing);
    const T scale = class_loss_scale("cross_entropy", labels, rows, classes, r, o), factor = scale * upstream;
    const T smoothing = o.label_smoothing, spread = smoothing / static_cast<T>(classes);
    T weight_sum = 0;
    for (index_t c = 0; c < classes; ++c) weight_sum += o.weight_of(c);
    sum_type<T> total = 0;
    for (index_t row = 0; row < rows; ++row) {
      T* g = grad ? grad + row * classes : nullptr;
      const std::int64_t label = labels[row];
      if (o.ignores(label)) {
        if (g) std::fill_n(g, classes, T(0));
        continue;
      }
      const T* x = logits + row * classes;
      T max_value = -std::numeric_limits<T>::infinity();
      for (index_t c = 0; c < classes; ++c) max_value = std::max(max_value, x[c]);
      T exp_sum = 0;
      for (index_t c = 0; c < classes; ++c) exp_sum += exp_value(x[c] - max_value);
      const T log_sum = std::log(exp_sum);
      const T hit = (T(1) - smoothing) * o.weight_of(label);  // -log p_y's weight in the row's loss
      T row_loss = hit * (log_sum - (x[label] - max_value));
      if (smoothing != T(0)) {
        T smooth = 0;
        for (index_t c = 0; c < classes; ++c) smooth += o.weight_of(c) * (log_sum - (x[c] - max_value));
        row_loss += spread * smooth;
      }
      total += row_loss;
      if (g) {  // each x[c] is read before g[c], which may alias it, is written
        const T inverse = T(1) / exp_sum, mass = hit + spread * weight_sum;
        for (index_t c = 0; c < classes; ++c)
          g[c] = (exp_value(x[c] - max_value) * inverse * mass - spread * o.weight_of(c) - (c == label ? hit : T(0))) *
                 factor;
      }
    }
    return static_cast<T>(total) * scale;
  }

  // Negative log-likelihood of rows x classes log-probabilities against integer labels (PyTorch's F.nll_loss):
  // L = -sum over counted rows of w_y logp[row, y], divided for the mean by the sum of their w_y (w: o.weight, or all
  // 1). dL/dlogp is -w_y times the scale at each counted row's label, 0 elsewhere. log_softmax followed by nll is
  // cross-entropy. o.label_smoothing is not an option of this loss and is ignored.
  template <class T>
  KILN_KERNEL static T nll(const T* log_probs, const std::int64_t* labels, index_t rows, index_t classes, reduction r,
               const class_loss_options<T>& o, T* grad, T upstream = T(1)) {
    const T scale = class_loss_scale("nll_loss", labels, rows, classes, r, o);
    sum_type<T> total = 0;
    for (index_t row = 0; row < rows; ++row)
      if (!o.ignores(labels[row]))
        total += o.weight_of(labels[row]) * log_probs[row * classes + labels[row]];
    if (grad) {  // after the loss: the gradient may alias the log-probabilities
      const T factor = scale * upstream;
      std::fill_n(grad, rows * classes, T(0));
      for (index_t row = 0; row < rows; ++row)
        if (!o.ignores(labels[row]))
          grad[row * classes + labels[row]] = -o.weight_of(labels[row]) * factor;
    }
    return static_cast<T>(-total) * scale;
  }

  // L = reduce(f(input - target)) for f of the L1 family (l1_variant.hpp); grad (optional) = upstream * dL/dinput.
  template <class T>
  KILN_KERNEL static T l1_loss(const l1_variant<T>& f, const T* input, const T* target, index_t n, reduction r, T* grad,
                   T upstream = T(1)) {
    sum_type<T> total = 0;
    for (index_t i = 0; i < n; ++i) total += f.value(input[i] - target[i]);
    const T scale = reduction_scale<T>(f.name(), r, n);
    if (grad) {
      const T factor = scale * upstream;
      for (index_t i = 0; i < n; ++i) grad[i] = f.grad(input[i] - target[i]) * factor;
    }
    return static_cast<T>(total) * scale;
  }

  // L = reduce(max(x, 0) - x * t + log(1 + exp(-|x|))), the stable form of -[t log s(x) + (1 - t) log(1 - s(x))].
  // dL/dx = sigmoid(x) - t (bce_value and bce_grad, per element).
  template <class T>
  KILN_KERNEL static T bce_with_logits(const T* logits, const T* target, index_t n, reduction r, T* grad, T upstream = T(1)) {
    sum_type<T> total = 0;
    for (index_t i = 0; i < n; ++i) total += bce_value(logits[i], target[i]);
    const T scale = reduction_scale<T>("binary_cross_entropy_with_logits", r, n);
    if (grad) {
      T factor = scale * upstream;
      for (index_t i = 0; i < n; ++i) grad[i] = bce_grad(logits[i], target[i]) * factor;
    }
    return static_cast<T>(total) * scale;
  }

  // reduction::none of the element-wise losses: losses[i] = the loss of element i, and grad (optional) its gradient,
  // d losses[i] / d input[i]: what the reducing kernels above sum and scale.
  template <class T>
  KILN_KERNEL static void mse_elements(const T* input, const T* target, index_t n, T* losses, T* grad) {
    for (index_t i = 0; i < n; ++i) {
      const T d = input[i] - target[i];
      losses[i] = d * d;
      if (grad) grad[i] = T(2) * d;
    }
  }
  template <class T>
  KILN_KERNEL static void l1_loss_elements(const l1_variant<T>& f, const T* input, const T* target, index_t n, T* losses,
                               T* grad) {
    for (index_t i = 0; i < n; ++i) {
      const T d = input[i] - target[i];
      losses[i] = f.value(d);
      if (grad) grad[i] = f.grad(d);
    }
  }
  template <class T>
  KILN_KERNEL static void bce_with_logits_elements(const T* logits, const T* target, index_t n, T* losses, T* grad) {
    for (index_t i = 0; i < n; ++i) {
      const T x = logits[i], t = target[i];  // read before grad, which may alias the logits, is written
      losses[i] = bce_value(x, t);
      if (grad) grad[i] = bce_grad(x, t);
    }
  }

  // reduction::none of the classification losses: losses[row] = the row's loss (its label's weight included, 0 for
  // an ignored row), and grad (optional) the row's gradient, d losses[row] / d input[row, :]. Each row runs the
  // reducing kernel's sum over that row alone, so each is what the sum adds.
  template <class T>
  static void softmax_cross_entropy_rows(const T* logits, const std::int64_t* labels, index_t rows, index_t classes,
                                         const class_loss_options<T>& o, T* losses, T* grad) {
    check_class_labels("cross_entropy", labels, rows, classes, o);
    for (index_t row = 0; row < rows; ++row)
      losses[row] = softmax_cross_entropy(logits + row * classes, labels + row, 1, classes, reduction::sum, o,
                                          grad ? grad + row * classes : nullptr);
  }
  template <class T>
  KILN_KERNEL static void nll_rows(const T* log_probs, const std::int64_t* labels, index_t rows, index_t classes,
                       const class_loss_options<T>& o, T* losses, T* grad) {
    check_class_labels("nll_loss", labels, rows, classes, o);
    for (index_t row = 0; row < rows; ++row)
      losses[row] = nll(log_probs + row * classes, labels + row, 1, classes, reduction::sum, o,
                        grad ? grad + row * classes : nullptr);
  }

 private:
  template <class T>
  static T bce_value(T x, T t) {
    return std::max(x, T(0)) - x * t + std::log1p(std::exp(-std::abs(x)));
  }
  template <class T>
  static T bce_grad(T x, T t) {
    return T(1) / (T(1) + std::exp(-x)) - t;
  }

  // Checks every label of a classification loss and returns the reduction's scale: 1 for the sum, and for the mean
  // 1 / (the sum of the label weights of the rows not ignored).
  template <class T>
  KILN_KERNEL static T class_loss_scale(const char* loss, const std::int64_t* labels, index_t rows, index_t classes, reduction r,
                            const class_loss_options<T>& o) {
    check_class_labels(loss, labels, rows, classes, o);
    reduction_scale<T>(loss, r, rows);  // (reduction::none throws)
    if (r != reduction::mean) return T(1);
    sum_type<T> weight_total = 0;
    for (index_t row = 0; row < rows; ++row)
      if (!o.ignores(labels[row])) weight_total += o.weight_of(labels[row]);
    return T(1) / static_cast<T>(weight_total);
  }
};

}  // namespace kernels::cpu
}  // namespace kiln
