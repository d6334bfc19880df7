// Softmax and log-softmax over one explicit dimension, forward and backward. A tensor of any rank is seen as
// (outer, size, inner): the softmax runs along the middle extent for every (outer, inner) pair.
#pragma once

#include <cmath>
#include <limits>

#include "kiln/core/config.hpp"
#include "kiln/kernels/activation.hpp"

namespace kiln::kernels::cpu {

// The softmax kernels of the CPU policies.
struct softmax_kernels {
  // y = softmax(x) or log_softmax(x) along the middle extent; y may alias x. Computed stably: subtract the maximum.
  template <class T>
  KILN_KERNEL static void softmax_forward(const T* x, T* y, index_t outer, index_t size, index_t inner, bool log) {
    for (index_t o = 0; o < outer; ++o) {
      for (index_t in = 0; in < inner; ++in) {
        const T* xs = x + o * size * inner + in;
        T* ys = y + o * size * inner + in;
        T max_value = -std::numeric_limits<T>::infinity();
        for (index_t i = 0; i < size; ++i) max_value = std::max(max_value, xs[i * inner]);
        T total = 0;
        if (log) {
          for (index_t i = 0; i < size; ++i) total += exp_value(xs[i * inner] - max_value);
          // (x - max) - log(total), not x - (log(total) + max): for logits near 1e4 the sum in brackets rounds to the
          // float spacing there (2^-10), which the second form would leave in every output.
          T log_total = std::log(total);
          for (index_t i = 0; i < size; ++i) ys[i * inner] = (xs[i * inner] - max_value) - log_total;
        } else {
          // Each exponential once, into y (each x is read before its y is written, so y may alias x), then scaled.
          for (index_t i = 0; i < size; ++i) ys[i * inner] = exp_value(xs[i * inner] - max_value);
          for (index_t i = 0; i < size; ++i) total += ys[i * inner];
          T inverse = T(1) / total;
          for (index_t i = 0; i < size; ++i) ys[i * inner] = ys[i * inner] * inverse;
        }
      }
    }
  }
  // dx from the forward output y and the upstream gradient dy:
  //   softmax:     dx = y * (dy - sum(dy * y))
  //   log-softmax: dx = dy - exp(y) * sum(dy)
  template <class T>
  KILN_KERNEL static void softmax_backward(const T* y, const T* dy, T* dx, index_t outer, index_t size, index_t inner, bool log,
                               bool accumulate = false) {
    for (index_t o = 0; o < outer; ++o) {
      for (index_t in = 0; in < inner; ++in) {
        index_t base = o * size * inner + in;
        T dot = 0;
        for (index_t i = 0; i < size; ++i) {
          index_t at = base + i * inner;
          dot += log ? dy[at] : dy[at] * y[at];
        }
        for (index_t i = 0; i < size; ++i) {
          index_t at = base + i * inner;
          T g = log ? dy[at] - exp_value(y[at]) * dot : y[at] * (dy[at] - dot);
          dx[at] = accumulate ? dx[at] + g : g;
        }
      }
    }
  }
};

}  // namespace kiln::kernels::cpu
