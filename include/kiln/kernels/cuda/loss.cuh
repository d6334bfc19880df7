// Loss kernels on the GPU with the CPU's formulas (kernels/cpu/loss.hpp): mean squared error, softmax cross-entropy
// from logits with int64 labels (plain, or with PyTorch's class weights, ignore_index and label smoothing), negative
// log-likelihood, binary cross-entropy with logits, and the L1 family (l1_variant.hpp). Each is fused with its
// gradient: one pass reads the inputs once, writes dL/dinput (scaled by the upstream gradient) and leaves one partial
// loss per block, which the second pass of kernels/cuda/reduce.cuh adds up in double. A class loss's mean first sums
// the label weights of its rows on the device, where the loss pass reads that sum: no wait in between.
//
// The loss returns on the host, so these functions synchronise (and the class losses throw kiln::error for a label
// out of range, as the CPU does, once the kernel has flagged it). The *_on_device variants leave the loss in device
// memory instead and do not wait, for a training step captured into a CUDA graph; they cannot report bad labels
// (such rows add nothing to the loss and get no -1 in their gradient, or with options no gradient at all).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include <cuda/std/limits>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/core/error.hpp"
#include "kiln/kernels/cpu/loss.hpp"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/cuda/reduce.cuh"

namespace kiln::kernels::cuda {

namespace detail {

// (input - target)^2, writing grad = factor * (input - target) on the way.
template <class T>
struct mse_term {
  const T *input, *target;
  T* grad;
  T factor;
  __device__ double operator()(index_t i) const {
    const T d = input[i] - target[i];
    if (grad) grad[i] = factor * d;
    return double(d) * d;
  }
};

// max(x, 0) - x t + log(1 + exp(-|x|)), writing grad = (sigmoid(x) - t) * factor on the way.
template <class T>
struct bce_term {
  const T *logits, *target;
  T* grad;
  T factor;
  __device__ double operator()(index_t i) const {
    const T x = logits[i];
    if (grad) grad[i] = (T(1) / (T(1) + exp(-x)) - target[i]) * factor;
    return double((x > T(0) ? x : T(0)) - x * target[i] + log1p(exp(-fabs(x))));
  }
};

// What a warp's row of logits gives its softmax, on every lane: the row's largest value and sum of exp(x - max).
template <class T>
struct row_softmax_sums {
  T max_value, exp_sum;
};
template <class T>
__device__ row_softmax_sums<T> warp_row_softmax_sums(const T* x, index_t classes, int lane) {
  T max_value = -::cuda::std::numeric_limits<T>::infinity();
  for (index_t c = lane; c < classes; c += 32) max_value = max_value < x[c] ? x[c] : max_value;
  max_value = warp_reduce(max_value, max_op{});
  T exp_sum = 0;
  for (index_t c = lane; c < classes; c += 32) exp_sum += exp(x[c] - max_value);
  return {max_value, warp_reduce(exp_sum, sum_op{})};
}

// One warp per row: the row's log-sum-exp, its loss log_sum - x[label] (summed per warp in double, then per block),
// and its gradient (softmax - onehot) * factor. A label outside [0, classes) flags the row.
template <class T>
__global__ void softmax_cross_entropy_kernel(const T* logits, const std::int64_t* labels, index_t rows,
                                             index_t classes, T* grad, T factor, double* partials, long long* flag) {
  const int lane = threadIdx.x % 32;
  const index_t first_warp = global_thread() / 32, warps = global_threads() / 32;
  double total = 0;
  for (index_t row = first_warp; row < rows; row += warps) {
    const T* x = logits + row * classes;
    const std::int64_t label = labels[row];
    const bool valid = label >= 0 && label < classes;
    if (!valid && lane == 0) atomicMin(flag, static_cast<long long>(row));
    const auto [max_value, exp_sum] = warp_row_softmax_sums(x, classes, lane);
    // log(sum) - (x[label] - max), as on the CPU: the difference of two large logits is exact, their sum is not.
    if (lane == 0 && valid) total += double(log(exp_sum) - (x[label] - max_value));
    if (grad) {
      T* g = grad + row * classes;
      const T inverse = T(1) / exp_sum;
      for (index_t c = lane; c < classes; c += 32) {
        const T p = exp(x[c] - max_value) * inverse * factor;
        g[c] = valid && c == label ? p - factor : p;
      }
    }
  }
  total = block_reduce(total, sum_op{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// The reduction's scale (reduction::none, which these kernels do not give, throws naming the loss).
template <class T>
T scale_of(const char* loss, reduction r, index_t count) {
  return kernels::reduction_scale<T>(loss, r, count);
}

// The first pass of an element-wise loss; the caller holds the scratch's mutex. Returns the number of partials.
template <class Term>
unsigned loss_first_pass(reduce_scratch& s, index_t n, const Term& term) {
  const unsigned blocks = reduce_blocks(n);
  partial_sums_kernel<<<blocks, block_threads, 0, kiln::cuda::current_stream()>>>(n, term, s.partials());
  KILN_CUDA_CHECK_LAUNCH();
  return blocks;
}

template <class T>
unsigned cross_entropy_first_pass(reduce_scratch& s, const T* logits, const std::int64_t* labels, index_t rows,
                                  index_t classes, T* grad, T factor) {
  const unsigned blocks = reduce_blocks(rows * 32);
  softmax_cross_entropy_kernel<<<blocks, block_threads, 0, kiln::cuda::current_stream()>>>(
      logits, labels, rows, classes, grad, factor, s.partials(), s.flag());
  KILN_CUDA_CHECK_LAUNCH();
  return blocks;
}

// f(input - target) for f of the L1 family, writing grad = f'(input - target) * factor on the way.
template <class T>
struct l1_family_term {
  const T *input, *target;
  T* grad;
  T factor;
  l1_variant<T> f;
  __device__ double operator()(index_t i) const {
    const T d = input[i] - target[i];
    if (grad) grad[i] = f.grad(d) * factor;
    return double(f.value(d));
  }
};

// Where the loss pass of a class loss's mean finds the sum of its rows' label weights: the previous pass's result.
inline const double* class_weight_total(reduce_scratch& s) { return &s.device_result()->value; }

// The weight a row's label carries in a class loss's mean: 0 for an ignored row or a label out of range.
template <class T>
struct label_weight_term {
  const std::int64_t* labels;
  index_t classes;
  class_loss_options<T> o;
  __device__ double operator()(index_t row) const {
    const std::int64_t label = labels[row];
    if (o.ignores(label) || label < 0 || label >= classes) return 0;
    return double(o.weight_of(label));
  }
};

// For the mean (else nothing): the pass that sums the label weights, leaving the sum where class_weight_total finds
// it. Returns that address, or null for the sum. The caller holds the scratch's mutex.
template <class T>
const double* class_loss_denominator(const char* loss, reduce_scratch& s, const std::int64_t* labels, index_t rows,
                                     index_t classes, reduction r, const class_loss_options<T>& o) {
  kernels::reduction_scale<T>(loss, r, rows);  // (reduction::none throws)
  if (r != reduction::mean) return nullptr;
  const unsigned blocks = loss_first_pass(s, rows, label_weight_term<T>{labels, classes, o});
  finish_on_device(s, blocks, static_cast<T*>(nullptr), T(1));
  return class_weight_total(s);
}

// The reduction's scale of a class loss on the device: 1 / the label weights' sum for the mean, 1 for the sum.
template <class T>
__device__ inline T class_loss_scale(const double* denominator) {
  return denominator ? T(1) / static_cast<T>(*denominator) : T(1);
}

// One element of rows x classes log-probabilities: -w_y logp[row, y] at a counted row's label (over the
// denominator), 0 elsewhere; the gradient -w_y * scale * upstream there, 0 elsewhere. A label neither in
// [0, classes) nor ignored flags its row.
template <class T>
struct nll_term {
  const T* log_probs;
  const std::int64_t* labels;
  index_t classes;
  class_loss_options<T> o;
  T* grad;
  T upstream;
  const double* denominator;
  long long* flag;
  __device__ double operator()(index_t i) const {
    const index_t row = i / classes, c = i - row * classes;
    const std::int64_t label = labels[row];
    const bool ignored = o.ignores(label), valid = !ignored && label >= 0 && label < classes;
    if (!ignored && !valid && c == 0) atomicMin(flag, static_cast<long long>(row));
    const bool hit = valid && c == label;
    const T w = hit ? o.weight_of(label) : T(0);
    if (grad) grad[i] = hit ? -w * (class_loss_scale<T>(denominator) * upstream) : T(0);
    if (!hit) return 0;
    return -double(w) * double(log_probs[i]) / (denominator ? *denominator : 1.0);
  }
};

// Cross-entropy with options, one warp per row, with the CPU's formulas: the row's loss
// (1 - s) w_y (-log p_y) + (s / C) sum_c w_c (-log p_c) over the denominator, and its gradient
// (p_c ((1 - s) w_y + (s / C) sum w) - (s / C) w_c - (1 - s) w_y [c = y]) * scale * upstream; ignored rows (and rows
// whose label is out of range, which flag the row) add nothing and get a zero gradient.
template <class T>
__global__ void softmax_cross_entropy_options_kernel(const T* logits, const std::int64_t* labels, index_t rows,
                                                     index_t classes, class_loss_options<T> o, T* grad, T upstream,
                                                     const double* denominator, double* partials, long long* flag) {
  const int lane = threadIdx.x % 32;
  const index_t first_warp = global_thread() / 32, warps = global_threads() / 32;
  const T factor = class_loss_scale<T>(denominator) * upstream;
  const double inverse = denominator ? 1.0 / *denominator : 1.0;
  const T smoothing = o.label_smoothing, spread = smoothing / static_cast<T>(classes);
  double total = 0;
  for (index_t row = first_warp; row < rows; row += warps) {
    const T* x = logits + row * classes;
    T* g = grad ? grad + row * classes : nullptr;
    const std::int64_t label = labels[row];
    const bool ignored = o.ignores(label), valid = !ignored && label >= 0 && label < classes;
    if (!ignored && !valid && lane == 0) atomicMin(flag, static_cast<long long>(row));
    if (!valid) {  // the same for the whole warp: the row is the warp's
      if (g)
        for (index_t c = lane; c < classes; c += 32) g[c] = T(0);
      continue;
    }
    const auto [max_value, exp_sum] = warp_row_softmax_sums(x, classes, lane);
    const T log_sum = log(exp_sum);
    const T hit = (T(1) - smoothing) * o.weight_of(label);
    T smooth = 0, weight_sum = 0;
    if (smoothing != T(0)) {
      for (index_t c = lane; c < classes; c += 32) {
        const T w = o.weight_of(c);
        smooth += w * (log_sum - (x[c] - max_value));
        weight_sum += w;
      }
      smooth = warp_reduce(smooth, sum_op{});
      weight_sum = warp_reduce(weight_sum, sum_op{});
    }
    if (lane == 0) total += double(hit * (log_sum - (x[label] - max_value)) + spread * smooth) * inverse;
    if (g) {
      const T inverse_sum = T(1) / exp_sum, mass = hit + spread * weight_sum;
      for (index_t c = lane; c < classes; c += 32) {
        g[c] = (exp(x[c] - max_value) * inverse_sum * mass - spread * o.weight_of(c) - (c == label ? hit : T(0))) *
               factor;
      }
    }
  }
  total = block_reduce(total, sum_op{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// The passes of a class loss with options, up to its partials: the caller holds the scratch's mutex and finishes.
template <class T>
unsigned cross_entropy_options_passes(reduce_scratch& s, const T* logits, const std::int64_t* labels, index_t rows,
                                      index_t classes, reduction r, const class_loss_options<T>& o, T* grad,
                                      T upstream) {
  const double* denominator = class_loss_denominator("cross_entropy", s, labels, rows, classes, r, o);
  const unsigned blocks = reduce_blocks(rows * 32);
  softmax_cross_entropy_options_kernel<<<blocks, block_threads, 0, kiln::cuda::current_stream()>>>(
      logits, labels, rows, classes, o, grad, upstream, denominator, s.partials(), s.flag());
  KILN_CUDA_CHECK_LAUNCH();
  return blocks;
}
template <class T>
unsigned nll_passes(reduce_scratch& s, const T* log_probs, const std::int64_t* labels, index_t rows, index_t classes,
                    reduction r, const class_loss_options<T>& o, T* grad, T upstream) {
  const double* denominator = class_loss_denominator("nll_loss", s, labels, rows, classes, r, o);
  return loss_first_pass(s, rows * classes,
                         nll_term<T>{log_probs, labels, classes, o, grad, upstream, denominator, s.flag()});
}

// Throws for the label at the row a class loss kernel flagged, as the CPU's check does.
template <class T>
[[noreturn]] void fail_flagged_label(const char* loss, const std::int64_t* labels, long long row, index_t classes,
                                     const class_loss_options<T>& o) {
  std::int64_t label = 0;
  KILN_CUDA_CHECK(cudaMemcpy(&label, labels + row, sizeof label, cudaMemcpyDeviceToHost));
  fail_bad_label(loss, label, static_cast<index_t>(row), classes, o);
}

}  // namespace detail

// The loss kernels of the CUDA policies.
struct loss_kernels {
  // L = reduce((input - target)^2). grad (optional) = upstream * dL/dinput.
  template <class T>
  static T mse(const T* input, const T* target, index_t n, reduction r, T* grad, T upstream = T(1)) {
    const T scale = detail::scale_of<T>("mse", r, n);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::loss_first_pass(s, n, detail::mse_term<T>{input, target, grad, T(2) * scale * upstream});
    return static_cast<T>(detail::finish_on_host(s, blocks).value) * scale;
  }
  template <class T>
  static void mse_on_device(const T* input, const T* target, index_t n, reduction r, T* grad, T* loss,
                            T upstream = T(1)) {
    const T scale = detail::scale_of<T>("mse", r, n);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::loss_first_pass(s, n, detail::mse_term<T>{input, target, grad, T(2) * scale * upstream});
    detail::finish_on_device(s, blocks, loss, scale);
  }

  // Cross-entropy of rows x classes logits against integer labels, through a stable log-softmax, fused with its
  // gradient: dL/dlogits = (softmax(logits) - onehot(label)) * scale. Labels outside [0, classes) throw.
  template <class T>
  static T softmax_cross_entropy(const T* logits, const std::int64_t* labels, index_t rows, index_t classes,
                                 reduction r, T* grad, T upstream = T(1)) {
    const T scale = detail::scale_of<T>("cross_entropy", r, rows);
    auto& s = detail::reduce_scratch::instance();
    std::unique_lock lock(s.mutex());
    const unsigned blocks =
        detail::cross_entropy_first_pass(s, logits, labels, rows, classes, grad, scale * upstream);
    const detail::reduce_result result = detail::finish_on_host(s, blocks);
    lock.unlock();
    if (result.flagged != detail::no_flag)
      detail::fail_flagged_label("cross_entropy", labels, result.flagged, classes, class_loss_options<T>{});
    return static_cast<T>(result.value) * scale;
  }
  template <class T>
  static void softmax_cross_entropy_on_device(const T* logits, const std::int64_t* labels, index_t rows,
                                              index_t classes, reduction r, T* grad, T* loss, T upstream = T(1)) {
    const T scale = detail::scale_of<T>("cross_entropy", r, rows);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::cross_entropy_first_pass(s, logits, labels, rows, classes, grad, scale * upstream);
    detail::finish_on_device(s, blocks, loss, scale);
  }

  // L = reduce(max(x, 0) - x * t + log(1 + exp(-|x|))), the stable form of -[t log s(x) + (1 - t) log(1 - s(x))].
  // dL/dx = sigmoid(x) - t.
  template <class T>
  static T bce_with_logits(const T* logits, const T* target, index_t n, reduction r, T* grad, T upstream = T(1)) {
    const T scale = detail::scale_of<T>("binary_cross_entropy_with_logits", r, n);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::loss_first_pass(s, n, detail::bce_term<T>{logits, target, grad, scale * upstream});
    return static_cast<T>(detail::finish_on_host(s, blocks).value) * scale;
  }
  template <class T>
  static void bce_with_logits_on_device(const T* logits, const T* target, index_t n, reduction r, T* grad, T* loss,
                                        T upstream = T(1)) {
    const T scale = detail::scale_of<T>("binary_cross_entropy_with_logits", r, n);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::loss_first_pass(s, n, detail::bce_term<T>{logits, target, grad, scale * upstream});
    detail::finish_on_device(s, blocks, loss, scale);
  }

  // Cross-entropy with PyTorch's options (see the CPU's kernel); plain options run the kernel above.
  template <class T>
  static T softmax_cross_entropy(const T* logits, const std::int64_t* labels, index_t rows, index_t classes,
                                 reduction r, const class_loss_options<T>& o, T* grad, T upstream = T(1)) {
    if (o.plain()) return softmax_cross_entropy(logits, labels, rows, classes, r, grad, upstream);
    check_class_loss_options("cross_entropy", 0, classes, o.label_smoothing);
    auto& s = detail::reduce_scratch::instance();
    std::unique_lock lock(s.mutex());
    const unsigned blocks =
        detail::cross_entropy_options_passes(s, logits, labels, rows, classes, r, o, grad, upstream);
    const detail::reduce_result result = detail::finish_on_host(s, blocks);
    lock.unlock();
    if (result.flagged != detail::no_flag)
      detail::fail_flagged_label("cross_entropy", labels, result.flagged, classes, o);
    return static_cast<T>(result.value);
  }
  template <class T>
  static void softmax_cross_entropy_on_device(const T* logits, const std::int64_t* labels, index_t rows,
                                              index_t classes, reduction r, const class_loss_options<T>& o, T* grad,
                                              T* loss, T upstream = T(1)) {
    if (o.plain()) return softmax_cross_entropy_on_device(logits, labels, rows, classes, r, grad, loss, upstream);
    check_class_loss_options("cross_entropy", 0, classes, o.label_smoothing);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::cross_entropy_options_passes(s, logits, labels, rows, classes, r, o, grad, upstream);
    detail::finish_on_device(s, blocks, loss, T(1));
  }

  // Negative log-likelihood of log-probabilities against integer labels, with class weights and an ignored label.
  template <class T>
  static T nll(const T* log_probs, const std::int64_t* labels, index_t rows, index_t classes, reduction r,
               const class_loss_options<T>& o, T* grad, T upstream = T(1)) {
    auto& s = detail::reduce_scratch::instance();
    std::unique_lock lock(s.mutex());
    const unsigned blocks = detail::nll_passes(s, log_probs, labels, rows, classes, r, o, grad, upstream);
    const detail::reduce_result result = detail::finish_on_host(s, blocks);
    lock.unlock();
    if (result.flagged != detail::no_flag) detail::fail_flagged_label("nll_loss", labels, result.flagged, classes, o);
    return static_cast<T>(result.value);
  }
  template <class T>
  static void nll_on_device(const T* log_probs, const std::int64_t* labels, index_t rows, index_t classes,
                            reduction r, const class_loss_options<T>& o, T* grad, T* loss, T upstream = T(1)) {
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks = detail::nll_passes(s, log_probs, labels, rows, classes, r, o, grad, upstream);
    detail::finish_on_device(s, blocks, loss, T(1));
  }

  // L = reduce(f(input - target)) for f of the L1 family; grad (optional) = upstream * dL/dinput.
  template <class T>
  static T l1_loss(const l1_variant<T>& f, const T* input, const T* target, index_t n, reduction r, T* grad,
                   T upstream = T(1)) {
    const T scale = detail::scale_of<T>(f.name(), r, n);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::loss_first_pass(s, n, detail::l1_family_term<T>{input, target, grad, scale * upstream, f});
    return static_cast<T>(detail::finish_on_host(s, blocks).value) * scale;
  }
  template <class T>
  static void l1_loss_on_device(const l1_variant<T>& f, const T* input, const T* target, index_t n, reduction r,
                                T* grad, T* loss, T upstream = T(1)) {
    const T scale = detail::scale_of<T>(f.name(), r, n);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::loss_first_pass(s, n, detail::l1_family_term<T>{input, target, grad, scale * upstream, f});
    detail::finish_on_device(s, blocks, loss, scale);
  }
};

}  // namespace kiln::kernels::cuda
