// CUDA kernels of dynamic mode's general tensor ops: the same names and signatures as kernels::cpu::tensor_kernels
// (kernels/cpu/tensor_ops.hpp), with device pointers, and the formulas of kernels/tensor_math.hpp.
//
// Layout: values contiguous and row-major; a strided_walk (kernels/strided.hpp), passed by value, gives each
// operand's strides. One thread per element of the walk, which it locates by dividing its index by the extents
// (a grid-stride loop). Where two elements of a walk can land on one destination (a broadcast destination, a repeated
// index), the kernel adds with atomicAdd, so the order of those additions, and the last bits of such a sum, may vary
// from run to run. A row reduction runs one thread per row, in the CPU kernel's order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/strided.hpp"
#include "kiln/kernels/tensor_math.hpp"

namespace kiln::kernels::cuda {

namespace detail {

// The offsets of element i of a walk (row-major over its extents) in each operand.
template <int K>
__device__ inline void walk_offsets(const strided_walk<K>& w, index_t i, index_t (&offset)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) offset[k] = 0;
  for (int d = w.rank - 1; d >= 0; --d) {
    const index_t e = w.extent[d];
    const index_t c = i % e;
    i /= e;
#pragma unroll
    for (int k = 0; k < K; ++k) offset[k] += c * w.stride[k][d];
  }
}

template <class T>
__global__ void unary_kernel(::kiln::kernels::unary_op op, const T* x, T* y, index_t n, T p, T q) {
  for (index_t i = global_thread(); i < n; i += global_threads()) y[i] = unary_value(op, x[i], p, q);
}
template <class T>
__global__ void unary_backward_kernel(::kiln::kernels::unary_op op, const T* x, const T* y, const T* dy, T* dx,
                                      index_t n, T p, bool accumulate) {
  for (index_t i = global_thread(); i < n; i += global_threads()) {
    const T g = unary_gradient(op, x[i], y[i], dy[i], p);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}
template <class T>
__global__ void binary_kernel(::kiln::kernels::binary_op op, const T* a, const T* b, T* out, strided_walk<3> w,
                              index_t n, T s) {
  for (index_t i = global_thread(); i < n; i += global_threads()) {
    index_t at[3];
    walk_offsets(w, i, at);
    out[at[0]] = binary_value(op, a[at[1]], b[at[2]], s);
  }
}
template <class T>
__global__ void binary_backward_kernel(::kiln::kernels::binary_op op, int side, const T* a, const T* b, const T* dy,
                                       T* g, strided_walk<3> w, index_t n) {
  for (index_t i = global_thread(); i < n; i += global_threads()) {
    index_t at[3];
    walk_offsets(w, i, at);
    g[at[0]] = binary_gradient(op, side, a[at[1]], b[at[2]], dy[at[0]]);
  }
}
template <class T>
__global__ void where_kernel(const T* mask, const T* a, const T* b, T* out, strided_walk<4> w, index_t n) {
  for (index_t i = global_thread(); i < n; i += global_threads()) {
    index_t at[4];
    walk_offsets(w, i, at);
    out[at[0]] = mask[at[1]] != T(0) ? a[at[2]] : b[at[3]];
  }
}
template <class T>
__global__ void copy_strided_kernel(const T* src, T* dst, strided_walk<2> w, index_t n, bool accumulate) {
  for (index_t i = global_thread(); i < n; i += global_threads()) {
    index_t at[2];
    walk_offsets(w, i, at);
    if (accumulate)
      atomicAdd(dst + at[0], src[at[1]]);
    else
      dst[at[0]] = src[at[1]];
  }
}
template <class T>
__global__ void reduce_rows_kernel(::kiln::kernels::row_reduction op, const T* x, T* out, index_t rows, index_t cols,
                                   T p, T c) {
  for (index_t r = global_thread(); r < rows; r += global_threads())
    out[r] = reduce_row_value(op, x + r * cols, cols, p, c);
}
template <class T>
__global__ void reduce_middle_kernel(::kiln::kernels::row_reduction op, const T* x, T* out, index_t outer, index_t n,
                                     index_t inner) {
  for (index_t t = global_thread(); t < outer * inner; t += global_threads()) {
    const index_t o = t / inner, i = t % inner;
    const T* column = x + o * n * inner + i;
    if (n == 0) {
      out[t] = op == ::kiln::kernels::row_reduction::mean ? T(NAN) : T(0);
      continue;
    }
    T acc = column[0];
    for (index_t r = 1; r < n; ++r) {
      const T v = column[r * inner];
      if (op == ::kiln::kernels::row_reduction::amax)
        acc = (v > acc || v != v) ? v : acc;
      else if (op == ::kiln::kernels::row_reduction::amin)
        acc = (v < acc || v != v) ? v : acc;
      else
        acc += v;
    }
    out[t] = op == ::kiln::kernels::row_reduction::mean ? acc / static_cast<T>(n) : acc;
  }
}
template <class T>
__global__ void reduce_rows_backward_kernel(::kiln::kernels::row_reduction op, const T* x, const T* out, const T* dy,
                                            T* dx, index_t rows, index_t cols, T p, T c) {
  for (index_t r = global_thread(); r < rows; r += global_threads())
    reduce_row_gradient(op, x + r * cols, out[r], dy[r], dx + r * cols, cols, p, c);
}
template <class T>
__global__ void arg_reduce_rows_kernel(const T* x, std::int64_t* out, index_t rows, index_t cols, bool largest) {
  for (index_t r = global_thread(); r < rows; r += global_threads())
    out[r] = arg_reduce_row(x + r * cols, cols, largest);
}
template <class T>
__global__ void index_select_kernel(const T* x, const std::int64_t* index, T* out, index_t outer, index_t n,
                                    index_t inner, index_t m) {
  const index_t total = outer * m * inner;
  for (index_t t = global_thread(); t < total; t += global_threads()) {
    const index_t i = t % inner, j = (t / inner) % m, o = t / (inner * m);
    out[t] = x[(o * n + index[j]) * inner + i];
  }
}
template <class T>
__global__ void index_add_kernel(const T* dy, const std::int64_t* index, T* dx, index_t outer, index_t n, index_t inner,
                                 index_t m, std::int64_t skip) {
  const index_t total = outer * m * inner;
  for (index_t t = global_thread(); t < total; t += global_threads()) {
    const index_t i = t % inner, j = (t / inner) % m, o = t / (inner * m);
    if (index[j] != skip) atomicAdd(dx + (o * n + index[j]) * inner + i, dy[t]);
  }
}
template <class T>
__global__ void gather_kernel(const T* x, const std::int64_t* index, T* out, strided_walk<2> w, index_t n,
                              index_t dim_stride) {
  for (index_t i = global_thread(); i < n; i += global_threads()) {
    index_t at[2];
    walk_offsets(w, i, at);
    out[at[0]] = x[at[1] + index[at[0]] * dim_stride];
  }
}
template <class T>
__global__ void scatter_add_kernel(const T* src, const std::int64_t* index, T* dst, strided_walk<3> w, index_t n,
                                   index_t dim_stride) {
  for (index_t i = global_thread(); i < n; i += global_threads()) {
    index_t at[3];
    walk_offsets(w, i, at);
    atomicAdd(dst + at[1] + index[at[0]] * dim_stride, src[at[2]]);
  }
}

// An id outside [0, num) (it cannot be refused from the device) reads and adds nothing: its row is zero.
template <class T>
__global__ void embedding_lookup_kernel(const T* ids, const T* weight, T* out, index_t count, index_t num,
                                        index_t dim) {
  for (index_t t = global_thread(); t < count * dim; t += global_threads()) {
    const T v = ids[t / dim];
    const bool valid = v >= T(0) && v < T(num);
    out[t] = valid ? weight[static_cast<index_t>(v) * dim + t % dim] : T(0);
  }
}
template <class T>
__global__ void embedding_gradient_kernel(const T* ids, const T* dy, T* dweight, index_t count, index_t num,
                                          index_t dim) {
  for (index_t t = global_thread(); t < count * dim; t += global_threads()) {
    const T v = ids[t / dim];
    if (v >= T(0) && v < T(num)) atomicAdd(dweight + static_cast<index_t>(v) * dim + t % dim, dy[t]);
  }
}

}  // namespace detail

// The tensor-op kernels of the CUDA policies.
struct tensor_kernels {
  template <class T>
  static void unary(::kiln::kernels::unary_op op, const T* x, T* y, index_t n, T p, T q) {
    if (n <= 0) return;
    detail::unary_kernel<<<detail::grid_for(n), detail::block_threads, 0, kiln::cuda::current_stream()>>>(op, x, y, n,
                                                                                                          p, q);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void unary_backward(::kiln::kernels::unary_op op, const T* x, const T* y, const T* dy, T* dx, index_t n, T p,
                             bool accumulate) {
    if (n <= 0) return;
    detail::unary_backward_kernel<<<detail::grid_for(n), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        op, x, y, dy, dx, n, p, accumulate);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void binary(::kiln::kernels::binary_op op, const T* a, const T* b, T* out, const strided_walk<3>& w, T s) {
    const index_t n = w.numel();
    if (n <= 0) return;
    detail::binary_kernel<<<detail::grid_for(n), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        op, a, b, out, w, n, s);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void binary_backward(::kiln::kernels::binary_op op, int side, const T* a, const T* b, const T* dy, T* g,
                              const strided_walk<3>& w) {
    const index_t n = w.numel();
    if (n <= 0) return;
    detail::binary_backward_kernel<<<detail::grid_for(n), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        op, side, a, b, dy, g, w, n);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void where(const T* mask, const T* a, const T* b, T* out, const strided_walk<4>& w) {
    const index_t n = w.numel();
    if (n <= 0) return;
    detail::where_kernel<<<detail::grid_for(n), detail::block_threads, 0, kiln::cuda::current_stream()>>>(mask, a, b,
                                                                                                          out, w, n);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void copy_strided(const T* src, T* dst, const strided_walk<2>& w, bool accumulate) {
    const index_t n = w.numel();
    if (n <= 0) return;
    detail::copy_strided_kernel<<<detail::grid_for(n), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        src, dst, w, n, accumulate);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void reduce_rows(::kiln::kernels::row_reduction op, const T* x, T* out, index_t rows, index_t cols, T p,
                          T correction) {
    if (rows <= 0) return;
    detail::reduce_rows_kernel<<<detail::grid_for(rows), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        op, x, out, rows, cols, p, correction);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void reduce_middle(::kiln::kernels::row_reduction op, const T* x, T* out, index_t outer, index_t n,
                            index_t inner) {
    if (outer * inner <= 0) return;
    detail::reduce_middle_kernel<<<detail::grid_for(outer * inner), detail::block_threads, 0,
                                   kiln::cuda::current_stream()>>>(op, x, out, outer, n, inner);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void reduce_rows_backward(::kiln::kernels::row_reduction op, const T* x, const T* out, const T* dy, T* dx,
                                   index_t rows, index_t cols, T p, T correction) {
    if (rows <= 0) return;
    detail::
        reduce_rows_backward_kernel<<<detail::grid_for(rows), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
            op, x, out, dy, dx, rows, cols, p, correction);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void arg_reduce_rows(const T* x, std::int64_t* out, index_t rows, index_t cols, bool largest) {
    if (rows <= 0) return;
    detail::arg_reduce_rows_kernel<<<detail::grid_for(rows), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        x, out, rows, cols, largest);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void index_select(const T* x, const std::int64_t* index, T* out, index_t outer, index_t n, index_t inner,
                           index_t m) {
    const index_t total = outer * m * inner;
    if (total <= 0) return;
    detail::index_select_kernel<<<detail::grid_for(total), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        x, index, out, outer, n, inner, m);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void index_add(const T* dy, const std::int64_t* index, T* dx, index_t outer, index_t n, index_t inner,
                        index_t m, std::int64_t skip) {
    const index_t total = outer * m * inner;
    if (total <= 0) return;
    detail::index_add_kernel<<<detail::grid_for(total), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        dy, index, dx, outer, n, inner, m, skip);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void embedding_lookup(const T* ids, const T* weight, T* out, index_t count, index_t num, index_t dim) {
    if (count * dim <= 0) return;
    detail::embedding_lookup_kernel<<<detail::grid_for(count * dim), detail::block_threads, 0,
                                      kiln::cuda::current_stream()>>>(ids, weight, out, count, num, dim);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void embedding_gradient(const T* ids, const T* dy, T* dweight, index_t count, index_t num, index_t dim) {
    KILN_CUDA_CHECK(
        cudaMemsetAsync(dweight, 0, static_cast<std::size_t>(num * dim) * sizeof(T), kiln::cuda::current_stream()));
    if (count * dim <= 0) return;
    detail::embedding_gradient_kernel<<<detail::grid_for(count * dim), detail::block_threads, 0,
                                        kiln::cuda::current_stream()>>>(ids, dy, dweight, count, num, dim);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void gather(const T* x, const std::int64_t* index, T* out, const strided_walk<2>& w, index_t dim_stride) {
    const index_t n = w.numel();
    if (n <= 0) return;
    detail::gather_kernel<<<detail::grid_for(n), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        x, index, out, w, n, dim_stride);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void scatter_add(const T* src, const std::int64_t* index, T* dst, const strided_walk<3>& w,
                          index_t dim_stride) {
    const index_t n = w.numel();
    if (n <= 0) return;
    detail::scatter_add_kernel<<<detail::grid_for(n), detail::block_threads, 0, kiln::cuda::current_stream()>>>(
        src, index, dst, w, n, dim_stride);
    KILN_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace kiln::kernels::cuda
