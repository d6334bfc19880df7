// Element-wise CPU kernels: activations forward and backward, bias, arithmetic. Plain loops over contiguous arrays
// that the compiler vectorises; the activation switch is hoisted out of the loop.
#pragma once

#include <algorithm>
#include <cstring>

#include "kiln/core/config.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/parallel.hpp"

namespace kiln::kernels::cpu {

// Calls body(std::integral_constant<activation, a>{}) so that loops are compiled once per activation.
template <class Body>
KILN_ALWAYS_INLINE void with_activation(activation a, Body&& body) {
  switch (a) {
    case activation::identity: return body(std::integral_constant<activation, activation::identity>{});
    case activation::relu: return body(std::integral_constant<activation, activation::relu>{});
    case activation::leaky_relu: return body(std::integral_constant<activation, activation::leaky_relu>{});
    case activation::gelu: return body(std::integral_constant<activation, activation::gelu>{});
    case activation::sigmoid: return body(std::integral_constant<activation, activation::sigmoid>{});
    case activation::tanh: return body(std::integral_constant<activation, activation::tanh>{});
  }
}

// dx = the backward of activation Kind applied to dx in place, given the activation's output y and its input x (null
// where Kind's backward does not read it): for a block of a gradient that is still in cache, where a layer takes in
// the backward of the activation before it (Conv2D sample by sample, MaxPool2D plane by plane). The arithmetic of
// activation_backward: the same bits.
template <activation Kind, class T>
KILN_ALWAYS_INLINE void activation_backward_in_place(const T* KILN_RESTRICT x, const T* KILN_RESTRICT y,
                                                     T* KILN_RESTRICT dx, index_t count, T slope) {
  if (x)
    for (index_t i = 0; i < count; ++i) dx[i] = activate_backward(Kind, x[i], y[i], dx[i], slope);
  else
    for (index_t i = 0; i < count; ++i) dx[i] = activate_backward(Kind, T(0), y[i], dx[i], slope);
}

// The element-wise kernels of the CPU policies.
struct elementwise_kernels {
  // y = f(x); y may alias x. Long arrays (a convolution's output) are split over the threads.
  template <class T>
  KILN_KERNEL static void activation_forward(activation a, const T* x, T* y, index_t n, T slope) {
    with_activation(a, [&](auto act) {
      parallel_chunks<T>(n, [&](index_t begin, index_t end) {
        for (index_t i = begin; i < end; ++i) y[i] = activate(act.value, x[i], slope);
      });
    });
  }
  // dx = dy * f'(x), from the input x and/or the output y (either may be null when the activation does not use it).
  // dx may alias dy. accumulate adds into dx instead of overwriting it.
  template <class T>
  KILN_KERNEL static void activation_backward(activation a, const T* x, const T* y, const T* dy, T* dx, index_t n, T slope,
                                  bool accumulate = false) {
    with_activation(a, [&](auto act) {
      parallel_chunks<T>(n, [&](index_t begin, index_t end) {
        if (x && y && !accumulate) {  // the common case, in a loop without conditions, so that it vectorises
          for (index_t i = begin; i < end; ++i) dx[i] = activate_backward(act.value, x[i], y[i], dy[i], slope);
          return;
        }
        for (index_t i = begin; i < end; ++i) {
          T g = activate_backward(act.value, x ? x[i] : T(0), y ? y[i] : T(0), dy[i], slope);
          dx[i] = accumulate ? dx[i] + g : g;
        }
      });
    });
  }

  // x[r, :] += bias for every row r of a rows x cols matrix.
  template <class T>
  KILN_KERNEL static void add_row_bias(T* x, const T* bias, index_t rows, index_t cols) {
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c) x[r * cols + c] += bias[c];
  }
  // out = a + b (out may alias either).
  template <class T>
  KILN_KERNEL static void add(const T* a, const T* b, T* out, index_t n) {
    for (index_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }
  // out = a - b.
  template <class T>
  KILN_KERNEL static void subtract(const T* a, const T* b, T* out, index_t n) {
    for (index_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
  }
  // out = a * b, element by element.
  template <class T>
  KILN_KERNEL static void multiply(const T* a, const T* b, T* out, index_t n) {
    for (index_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
  }
  // out = a * s.
  template <class T>
  KILN_KERNEL static void scale(const T* a, T s, T* out, index_t n) {
    for (index_t i = 0; i < n; ++i) out[i] = a[i] * s;
  }
  // out[r, :] = a[r, :] * s[r]: each row by its own factor (a per-row loss's gradient times its upstream gradient).
  template <class T>
  KILN_KERNEL static void scale_rows(const T* a, const T* s, T* out, index_t rows, index_t cols) {
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c) out[r * cols + c] = a[r * cols + c] * s[r];
  }
  // y += alpha * x.
  template <class T>
  KILN_KERNEL static void axpy(T alpha, const T* x, T* y, index_t n) {
    for (index_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }
  // y += x: how gradients accumulate when a value feeds several consumers.
  template <class T>
  KILN_KERNEL static void accumulate(const T* x, T* y, index_t n) {
    for (index_t i = 0; i < n; ++i) y[i] += x[i];
  }
  template <class T>
  KILN_KERNEL static void copy(const T* x, T* y, index_t n) {
    if (n > 0 && x != y) std::memcpy(y, x, static_cast<std::size_t>(n) * sizeof(T));
  }
  // The 2-D forms of copy, fill and accumulate: `rows` rows of `cols` elements, each matrix with its own row stride.
  // They assemble a GEMM operand from column blocks of other matrices and spread a product's column blocks back.
  template <class T>
  KILN_KERNEL static void copy_rows(index_t rows, index_t cols, const T* x, index_t ld_x, T* y, index_t ld_y) {
    for (index_t r = 0; r < rows; ++r) copy(x + r * ld_x, y + r * ld_y, cols);
  }
  template <class T>
  KILN_KERNEL static void fill_rows(index_t rows, index_t cols, T value, T* y, index_t ld_y) {
    for (index_t r = 0; r < rows; ++r) std::fill_n(y + r * ld_y, cols, value);
  }
  template <class T>
  KILN_KERNEL static void accumulate_rows(index_t rows, index_t cols, const T* x, index_t ld_x, T* y, index_t ld_y) {
    for (index_t r = 0; r < rows; ++r) accumulate(x + r * ld_x, y + r * ld_y, cols);
  }
  // Large fills are split over the threads like every element-wise loop (parallel_chunks), so each thread writes the
  // same part of a buffer that the threaded kernels around it read and write. Zeroing dynamic mode's gradients on
  // the calling thread alone before each step moved the lines of the other threads' parts of the weight gradient, and
  // of their Adam state's inputs, between the cores twice per step.
  template <class T>
  KILN_KERNEL static void fill(T* y, T value, index_t n) {
    parallel_chunks<T>(n, [&](index_t begin, index_t end) { std::fill(y + begin, y + end, value); });
  }
};

}  // namespace kiln::kernels::cpu
