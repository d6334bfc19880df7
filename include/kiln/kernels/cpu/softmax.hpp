// Softmax and log-softmax over one explicit dimension, forward and backward. A tensor of any rank is seen as
// (outer, size, inner): the softmax runs along the middle extent for every (outer, inner) pair.
#pragma once

#include <cmath>
#include <limits>

#include "kiln/core/config.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/tensor_math.hpp"

namespace kiln::kernels::cpu {

// The softmax kernels of the CPU policies.
struct softmax_kernels {
  // y = softmax(x) or log_softmax(x) along the middle extent; y may alias x. Computed stably: subtract the maximum.
  // Along the last extent (inner 1), the maximum and the sums run in the lanes of kernels/tensor_math.hpp's row
  // reductions, which vectorise; otherwise one element after another.
  template <class T>
  KILN_KERNEL static void softmax_forward(const T* x, T* y, index_t outer, index_t size, index_t inner, bool log) {
    if (inner == 1 && size > 0) {
      for (index_t o = 0; o < outer; ++o) {
        const T* xs = x + o * size;
        T* ys = y + o * size;
        const T max_value = lane_extreme<true>(xs, size, value_term<T>{});
        if (log) {
          const T log_total = std::log(lane_sum(xs, size, exp_minus_term<T>{max_value}));
          for (index_t i = 0; i < size; ++i) ys[i] = (xs[i] - max_value) - log_total;
        } else {
          for (index_t i = 0; i < size; ++i) ys[i] = exp_value(xs[i] - max_value);
          const T inverse = T(1) / lane_sum(static_cast<const T*>(ys), size, value_term<T>{});
          for (index_t i = 0; i < size; ++i) ys[i] = ys[i] * inverse;
        }
      }
      return;
    }
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
  KILN_KERNEL static void softmax_backward(const T* y, const T* dy, T* dx, index_t outer, index_t size, index_t inner,
                                           bool log, bool accumulate = false) {
    if (inner == 1) {
      for (index_t o = 0; o < outer; ++o) {
        const T *ys = y + o * size, *dys = dy + o * size;
        T* dxs = dx + o * size;
        if (log) {
          const T dot = lane_sum(dys, size, value_term<T>{});
          if (accumulate) for (index_t i = 0; i < size; ++i) dxs[i] += dys[i] - exp_value(ys[i]) * dot;
          else for (index_t i = 0; i < size; ++i) dxs[i] = dys[i] - exp_value(ys[i]) * dot;
        } else {
          T dot = 0;
          {
            T lane[reduction_lanes] = {};
            index_t i = 0;
            for (; i + reduction_lanes <= size; i += reduction_lanes)
              for (int k = 0; k < reduction_lanes; ++k) lane[k] += dys[i + k] * ys[i + k];
            for (int k = 0; i + k < size; ++k) lane[k] += dys[i + k] * ys[i + k];
            for (int width = reduction_lanes / 2; width > 0; width /= 2)
              for (int k = 0; k < width; ++k) lane[k] += lane[k + width];
            dot = lane[0];
          }
          if (accumulate) for (index_t i = 0; i < size; ++i) dxs[i] += ys[i] * (dys[i] - dot);
          else for (index_t i = 0; i < size; ++i) dxs[i] = ys[i] * (dys[i] - dot);
        }
      }
      return;
    }
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
