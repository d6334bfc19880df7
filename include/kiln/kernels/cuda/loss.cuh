// Loss kernels on the GPU with the CPU's formulas (kernels/cpu/loss.hpp): mean squared error, softmax cross-entropy
// from logits with int64 labels, binary cross-entropy with logits. Each is fused with its gradient: one pass reads the
// inputs once, writes dL/dinput (scaled by the upstream gradient) and leaves one partial loss per block, which the
// second pass of kernels/cuda/reduce.cuh adds up in double.
//
// The loss returns on the host, so these functions synchronise (and softmax_cross_entropy throws kiln::error for a
// label out of range, as the CPU does, once the kernel has flagged it). The *_on_device variants leave the loss in
// device memory instead and do not wait, for a training step captured into a CUDA graph; they cannot report bad
// labels (such rows add nothing to the loss and get no -1 in their gradient).
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
    T max_value = -::cuda::std::numeric_limits<T>::infinity();
    for (index_t c = lane; c < classes; c += 32) max_value = max_value < x[c] ? x[c] : max_value;
    max_value = warp_reduce(max_value, max_op{});
    T exp_sum = 0;
    for (index_t c = lane; c < classes; c += 32) exp_sum += exp(x[c] - max_value);
    exp_sum = warp_reduce(exp_sum, sum_op{});
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

template <class T>
T scale_of(reduction r, index_t count) {
  return r == reduction::mean ? T(1) / static_cast<T>(count) : T(1);
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

}  // namespace detail

// The loss kernels of the CUDA policies.
struct loss_kernels {
  // L = reduce((input - target)^2). grad (optional) = upstream * dL/dinput.
  template <class T>
  static T mse(const T* input, const T* target, index_t n, reduction r, T* grad, T upstream = T(1)) {
    const T scale = detail::scale_of<T>(r, n);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::loss_first_pass(s, n, detail::mse_term<T>{input, target, grad, T(2) * scale * upstream});
    return static_cast<T>(detail::finish_on_host(s, blocks).value) * scale;
  }
  template <class T>
  static void mse_on_device(const T* input, const T* target, index_t n, reduction r, T* grad, T* loss,
                            T upstream = T(1)) {
    const T scale = detail::scale_of<T>(r, n);
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
    const T scale = detail::scale_of<T>(r, rows);
    auto& s = detail::reduce_scratch::instance();
    std::unique_lock lock(s.mutex());
    const unsigned blocks =
        detail::cross_entropy_first_pass(s, logits, labels, rows, classes, grad, scale * upstream);
    const detail::reduce_result result = detail::finish_on_host(s, blocks);
    lock.unlock();
    if (result.flagged != detail::no_flag) {
      std::int64_t label = 0;
      KILN_CUDA_CHECK(cudaMemcpy(&label, labels + result.flagged, sizeof label, cudaMemcpyDeviceToHost));
      fail("cross_entropy: expected labels in [0, ", classes, "), found ", label, " at row ", result.flagged);
    }
    return static_cast<T>(result.value) * scale;
  }
  template <class T>
  static void softmax_cross_entropy_on_device(const T* logits, const std::int64_t* labels, index_t rows,
                                              index_t classes, reduction r, T* grad, T* loss, T upstream = T(1)) {
    const T scale = detail::scale_of<T>(r, rows);
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
    const T scale = detail::scale_of<T>(r, n);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::loss_first_pass(s, n, detail::bce_term<T>{logits, target, grad, scale * upstream});
    return static_cast<T>(detail::finish_on_host(s, blocks).value) * scale;
  }
  template <class T>
  static void bce_with_logits_on_device(const T* logits, const T* target, index_t n, reduction r, T* grad, T* loss,
                                        T upstream = T(1)) {
    const T scale = detail::scale_of<T>(r, n);
    auto& s = detail::reduce_scratch::instance();
    std::lock_guard lock(s.mutex());
    const unsigned blocks =
        detail::loss_first_pass(s, n, detail::bce_term<T>{logits, target, grad, scale * upstream});
    detail::finish_on_device(s, blocks, loss, scale);
  }
};

}  // namespace kiln::kernels::cuda
