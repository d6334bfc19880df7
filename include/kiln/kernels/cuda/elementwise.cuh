// Element-wise CUDA kernels: activations forward and backward (the formulas of kernels/activation.hpp, compiled for
// the device), bias, arithmetic, copy and fill. Same names and signatures as kernels::cpu::elementwise_kernels, with
// device pointers. The activation is chosen on the host, so each kernel is compiled once per activation and has no
// switch in its loop.
#pragma once

#include <cuda_runtime.h>

#include <cstring>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/elementwise.hpp"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

namespace detail {

template <class T, activation A>
struct activation_forward_op {
  const T* x;
  T* y;
  T slope;
  template <int W>
  __device__ void apply(index_t i) const {
    vec<T, W> v = load<W>(x + i);
#pragma unroll
    for (int k = 0; k < W; ++k) v.v[k] = activate(A, v.v[k], slope);
    store<W>(y + i, v);
  }
};

// x or y may be null when the activation does not read it; the loads then give zeros, as on the CPU.
template <class T, activation A, bool Accumulate>
struct activation_backward_op {
  const T *x, *y, *dy;
  T* dx;
  T slope;
  template <int W>
  __device__ void apply(index_t i) const {
    vec<T, W> xv{}, yv{};
    if (x) xv = load<W>(x + i);
    if (y) yv = load<W>(y + i);
    const vec<T, W> g = load<W>(dy + i);
    vec<T, W> out{};
    if constexpr (Accumulate) out = load<W>(dx + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const T d = activate_backward(A, xv.v[k], yv.v[k], g.v[k], slope);
      out.v[k] = Accumulate ? out.v[k] + d : d;
    }
    store<W>(dx + i, out);
  }
};

// out = f(a, b) element by element, for the binary arithmetic kernels.
template <class T, class F>
struct binary_op {
  const T *a, *b;
  T* out;
  F f;
  template <int W>
  __device__ void apply(index_t i) const {
    const vec<T, W> av = load<W>(a + i), bv = load<W>(b + i);
    vec<T, W> r;
#pragma unroll
    for (int k = 0; k < W; ++k) r.v[k] = f(av.v[k], bv.v[k]);
    store<W>(out + i, r);
  }
};
struct plus {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct minus {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a - b;
  }
};
struct times {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a * b;
  }
};
// y + alpha * x, written as the CPU writes it (the compilers may contract it to one FMA on either side).
template <class T>
struct add_scaled {
  T alpha;
  __device__ T operator()(T x, T y) const { return y + alpha * x; }
};

template <class T>
struct scale_op {
  const T* a;
  T s;
  T* out;
  template <int W>
  __device__ void apply(index_t i) const {
    vec<T, W> v = load<W>(a + i);
#pragma unroll
    for (int k = 0; k < W; ++k) v.v[k] = v.v[k] * s;
    store<W>(out + i, v);
  }
};

template <class T>
struct fill_op {
  T* y;
  T value;
  template <int W>
  __device__ void apply(index_t i) const {
    vec<T, W> v;
#pragma unroll
    for (int k = 0; k < W; ++k) v.v[k] = value;
    store<W>(y + i, v);
  }
};

// x[r, c] += bias[c]: threads run along the columns (coalesced), the grid's y dimension and a stride over the rows.
template <class T>
__global__ void add_row_bias_kernel(T* x, const T* bias, index_t rows, index_t cols) {
  for (index_t c = index_t(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += index_t(gridDim.x) * blockDim.x) {
    const T b = bias[c];
    for (index_t r = blockIdx.y; r < rows; r += gridDim.y) x[r * cols + c] += b;
  }
}

// The 2-D kernels over a strided rows x cols block (row strides ld_x, ld_y), laid out as add_row_bias_kernel.
template <class T>
__global__ void fill_rows_kernel(index_t rows, index_t cols, T value, T* y, index_t ld_y) {
  for (index_t c = index_t(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += index_t(gridDim.x) * blockDim.x)
    for (index_t r = blockIdx.y; r < rows; r += gridDim.y) y[r * ld_y + c] = value;
}
template <class T>
__global__ void accumulate_rows_kernel(index_t rows, index_t cols, const T* x, index_t ld_x, T* y, index_t ld_y) {
  for (index_t c = index_t(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += index_t(gridDim.x) * blockDim.x)
    for (index_t r = blockIdx.y; r < rows; r += gridDim.y) y[r * ld_y + c] += x[r * ld_x + c];
}

}  // namespace detail

// The element-wise kernels of the CUDA policies.
struct elementwise_kernels {
  // y = f(x); y may alias x.
  template <class T>
  static void activation_forward(activation a, const T* x, T* y, index_t n, T slope) {
    cpu::with_activation(a, [&](auto act) {
      detail::launch_map<T>(n, detail::activation_forward_op<T, decltype(act)::value>{x, y, slope}, x, y);
    });
  }
  // dx = dy * f'(x), from the input x and/or the output y (either may be null when the activation does not use it).
  // dx may alias dy. accumulate adds into dx instead of overwriting it.
  template <class T>
  static void activation_backward(activation a, const T* x, const T* y, const T* dy, T* dx, index_t n, T slope,
                                  bool accumulate = false) {
    cpu::with_activation(a, [&](auto act) {
      constexpr activation A = decltype(act)::value;
      if (accumulate)
        detail::launch_map<T>(n, detail::activation_backward_op<T, A, true>{x, y, dy, dx, slope}, x, y, dy, dx);
      else
        detail::launch_map<T>(n, detail::activation_backward_op<T, A, false>{x, y, dy, dx, slope}, x, y, dy, dx);
    });
  }

  // x[r, :] += bias for every row r of a rows x cols matrix.
  template <class T>
  static void add_row_bias(T* x, const T* bias, index_t rows, index_t cols) {
    if (rows <= 0 || cols <= 0) return;
    detail::add_row_bias_kernel<<<detail::matrix_grid(rows, cols), detail::block_threads, 0,
                                  kiln::cuda::current_stream()>>>(x, bias, rows, cols);
    KILN_CUDA_CHECK_LAUNCH();
  }
  // out = a + b (out may alias either).
  template <class T>
  static void add(const T* a, const T* b, T* out, index_t n) {
    detail::launch_map<T>(n, detail::binary_op<T, detail::plus>{a, b, out, {}}, a, b, out);
  }
  // out = a - b.
  template <class T>
  static void subtract(const T* a, const T* b, T* out, index_t n) {
    detail::launch_map<T>(n, detail::binary_op<T, detail::minus>{a, b, out, {}}, a, b, out);
  }
  // out = a * b, element by element.
  template <class T>
  static void multiply(const T* a, const T* b, T* out, index_t n) {
    detail::launch_map<T>(n, detail::binary_op<T, detail::times>{a, b, out, {}}, a, b, out);
  }
  // out = a * s.
  template <class T>
  static void scale(const T* a, T s, T* out, index_t n) {
    detail::launch_map<T>(n, detail::scale_op<T>{a, s, out}, a, out);
  }
  // y += alpha * x.
  template <class T>
  static void axpy(T alpha, const T* x, T* y, index_t n) {
    detail::launch_map<T>(n, detail::binary_op<T, detail::add_scaled<T>>{x, y, y, {alpha}}, x, y);
  }
  // y += x: how gradients accumulate when a value feeds several consumers.
  template <class T>
  static void accumulate(const T* x, T* y, index_t n) {
    detail::launch_map<T>(n, detail::binary_op<T, detail::plus>{x, y, y, {}}, x, y);
  }
  template <class T>
  static void copy(const T* x, T* y, index_t n) {
    if (n <= 0 || x == y) return;
    KILN_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDeviceToDevice,
                                    kiln::cuda::current_stream()));
  }
  // The 2-D kernels of the CPU policies, over a strided block (rows x cols; row strides ld_x, ld_y), one launch
  // each: a recurrent layer's final state into its (batch, directions * H) output, and the LSTM's stacked
  // parameter-gradient operand (layers/recurrent.hpp), instead of one launch per sample or per step.
  template <class T>
  static void copy_rows(index_t rows, index_t cols, const T* x, index_t ld_x, T* y, index_t ld_y) {
    if (rows <= 0 || cols <= 0) return;
    KILN_CUDA_CHECK(cudaMemcpy2DAsync(y, static_cast<std::size_t>(ld_y) * sizeof(T), x,
                                      static_cast<std::size_t>(ld_x) * sizeof(T),
                                      static_cast<std::size_t>(cols) * sizeof(T), static_cast<std::size_t>(rows),
                                      cudaMemcpyDeviceToDevice, kiln::cuda::current_stream()));
  }
  template <class T>
  static void fill_rows(index_t rows, index_t cols, T value, T* y, index_t ld_y) {
    if (rows <= 0 || cols <= 0) return;
    detail::fill_rows_kernel<<<detail::matrix_grid(rows, cols), detail::block_threads, 0,
                               kiln::cuda::current_stream()>>>(rows, cols, value, y, ld_y);
    KILN_CUDA_CHECK_LAUNCH();
  }
  // y's block += x's block.
  template <class T>
  static void accumulate_rows(index_t rows, index_t cols, const T* x, index_t ld_x, T* y, index_t ld_y) {
    if (rows <= 0 || cols <= 0) return;
    detail::accumulate_rows_kernel<<<detail::matrix_grid(rows, cols), detail::block_threads, 0,
                                     kiln::cuda::current_stream()>>>(rows, cols, x, ld_x, y, ld_y);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void fill(T* y, T value, index_t n) {
    if (n <= 0) return;
    T zero{};
    if (std::memcmp(&value, &zero, sizeof(T)) == 0) {  // all-zero bits (0, not -0): a memset, the fastest fill
      KILN_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<std::size_t>(n) * sizeof(T), kiln::cuda::current_stream()));
      return;
    }
    detail::launch_map<T>(n, detail::fill_op<T>{y, value}, y);
  }
};

}  // namespace kiln::kernels::cuda
