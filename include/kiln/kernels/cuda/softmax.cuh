// Softmax and log-softmax over one explicit dimension on the GPU, forward and backward, with the CPU's formulas
// (kernels/cpu/softmax.hpp). A tensor is seen as (outer, size, inner). When the dimension is the last one (inner = 1,
// the classifier case) one warp handles one row: coalesced loads and shuffle reductions. Otherwise one thread handles
// one (outer, inner) column, and neighbouring threads read neighbouring addresses.
#pragma once

#include <cuda_runtime.h>

#include <cuda/std/limits>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

namespace detail {

// std::max's rule (the first unless it is less than the second), so NaNs propagate as on the CPU.
template <class T>
__device__ inline T larger(T a, T b) {
  return a < b ? b : a;
}

template <class T>
__global__ void softmax_rows_forward_kernel(const T* x, T* y, index_t rows, index_t size, bool log) {
  const int lane = threadIdx.x % 32;
  const index_t first_warp = (index_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const index_t warps = index_t(gridDim.x) * blockDim.x / 32;
  for (index_t row = first_warp; row < rows; row += warps) {
    const T* xs = x + row * size;
    T* ys = y + row * size;
    T max_value = -::cuda::std::numeric_limits<T>::infinity();
    for (index_t i = lane; i < size; i += 32) max_value = larger(max_value, xs[i]);
    max_value = warp_reduce(max_value, max_op{});
    T total = 0;
    for (index_t i = lane; i < size; i += 32) total += exp(xs[i] - max_value);
    total = warp_reduce(total, sum_op{});
    if (log) {
      const T log_total = ::log(total);  // (x - max) - log(total), as on the CPU: exact for large logits
      for (index_t i = lane; i < size; i += 32) ys[i] = (xs[i] - max_value) - log_total;
    } else {
      const T inverse = T(1) / total;
      for (index_t i = lane; i < size; i += 32) ys[i] = exp(xs[i] - max_value) * inverse;
    }
  }
}

template <class T>
__global__ void softmax_rows_backward_kernel(const T* y, const T* dy, T* dx, index_t rows, index_t size, bool log,
                                             bool accumulate) {
  const int lane = threadIdx.x % 32;
  const index_t first_warp = (index_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const index_t warps = index_t(gridDim.x) * blockDim.x / 32;
  for (index_t row = first_warp; row < rows; row += warps) {
    const index_t base = row * size;
    T dot = 0;
    for (index_t i = lane; i < size; i += 32) dot += log ? dy[base + i] : dy[base + i] * y[base + i];
    dot = warp_reduce(dot, sum_op{});
    for (index_t i = lane; i < size; i += 32) {
      const index_t at = base + i;
      const T g = log ? dy[at] - exp(y[at]) * dot : y[at] * (dy[at] - dot);
      dx[at] = accumulate ? dx[at] + g : g;
    }
  }
}

template <class T>
__global__ void softmax_strided_forward_kernel(const T* x, T* y, index_t outer, index_t size, index_t inner,
                                               bool log) {
  for (index_t column = global_thread(); column < outer * inner; column += global_threads()) {
    const index_t o = column / inner, in = column % inner;
    const T* xs = x + o * size * inner + in;
    T* ys = y + o * size * inner + in;
    T max_value = -::cuda::std::numeric_limits<T>::infinity();
    for (index_t i = 0; i < size; ++i) max_value = larger(max_value, xs[i * inner]);
    T total = 0;
    for (index_t i = 0; i < size; ++i) total += exp(xs[i * inner] - max_value);
    if (log) {
      const T log_total = ::log(total);
      for (index_t i = 0; i < size; ++i) ys[i * inner] = (xs[i * inner] - max_value) - log_total;
    } else {
      const T inverse = T(1) / total;
      for (index_t i = 0; i < size; ++i) ys[i * inner] = exp(xs[i * inner] - max_value) * inverse;
    }
  }
}

template <class T>
__global__ void softmax_strided_backward_kernel(const T* y, const T* dy, T* dx, index_t outer, index_t size,
                                                index_t inner, bool log, bool accumulate) {
  for (index_t column = global_thread(); column < outer * inner; column += global_threads()) {
    const index_t o = column / inner, in = column % inner;
    const index_t base = o * size * inner + in;
    T dot = 0;
    for (index_t i = 0; i < size; ++i) {
      const index_t at = base + i * inner;
      dot += log ? dy[at] : dy[at] * y[at];
    }
    for (index_t i = 0; i < size; ++i) {
      const index_t at = base + i * inner;
      const T g = log ? dy[at] - exp(y[at]) * dot : y[at] * (dy[at] - dot);
      dx[at] = accumulate ? dx[at] + g : g;
    }
  }
}

}  // namespace detail

// The softmax kernels of the CUDA policies.
struct softmax_kernels {
  // y = softmax(x) or log_softmax(x) along the middle extent; y may alias x. Computed stably: subtract the maximum.
  template <class T>
  static void softmax_forward(const T* x, T* y, index_t outer, index_t size, index_t inner, bool log) {
    if (outer <= 0 || size <= 0 || inner <= 0) return;
    const cudaStream_t stream = kiln::cuda::current_stream();
    if (inner == 1)
      detail::softmax_rows_forward_kernel<<<detail::grid_for(outer * 32), detail::block_threads, 0, stream>>>(
          x, y, outer, size, log);
    else
      detail::softmax_strided_forward_kernel<<<detail::grid_for(outer * inner), detail::block_threads, 0, stream>>>(
          x, y, outer, size, inner, log);
    KILN_CUDA_CHECK_LAUNCH();
  }
  // dx from the forward output y and the upstream gradient dy:
  //   softmax:     dx = y * (dy - sum(dy * y))
  //   log-softmax: dx = dy - exp(y) * sum(dy)
  template <class T>
  static void softmax_backward(const T* y, const T* dy, T* dx, index_t outer, index_t size, index_t inner, bool log,
                               bool accumulate = false) {
    if (outer <= 0 || size <= 0 || inner <= 0) return;
    const cudaStream_t stream = kiln::cuda::current_stream();
    if (inner == 1)
      detail::softmax_rows_backward_kernel<<<detail::grid_for(outer * 32), detail::block_threads, 0, stream>>>(
          y, dy, dx, outer, size, log, accumulate);
    else
      detail::softmax_strided_backward_kernel<<<detail::grid_for(outer * inner), detail::block_threads, 0,
                                                stream>>>(y, dy, dx, outer, size, inner, log, accumulate);
    KILN_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace kiln::kernels::cuda
