// Dropout on the CPU: a keep mask drawn from the counter-based generator (one 32-bit number per element, in order),
// scaled by 1 / (1 - p) so that evaluation is the identity (inverted dropout).
#pragma once

#include <cmath>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/random.hpp"

namespace kiln::kernels::cpu {

// The dropout kernels of the CPU policies.
struct dropout_kernels {
  // mask[i] = 1 / (1 - p) with probability 1 - p, else 0; y = x * mask. p = 1 drops everything.
  template <class T>
  KILN_KERNEL static void dropout_forward(const T* x, T* y, T* mask, index_t n, T p, random_generator& rng) {
    const T keep_scale = p < T(1) ? T(1) / (T(1) - p) : T(0);
    // Keep when the 24-bit uniform u = bits / 2^24 satisfies u >= p.
    const double scaled = std::ceil(static_cast<double>(p) * 16777216.0);
    const std::uint32_t threshold = scaled >= 16777216.0 ? (1u << 24) : static_cast<std::uint32_t>(scaled > 0 ? scaled : 0);
    for (index_t i = 0; i < n; ++i) {
      const std::uint32_t bits = rng.next_u32() >> 8;
      mask[i] = bits >= threshold ? keep_scale : T(0);
      y[i] = x[i] * mask[i];
    }
  }
  // dx (+)= dy * mask.
  template <class T>
  KILN_KERNEL static void dropout_backward(const T* dy, const T* mask, T* dx, index_t n, bool accumulate) {
    for (index_t i = 0; i < n; ++i) dx[i] = accumulate ? dx[i] + dy[i] * mask[i] : dy[i] * mask[i];
  }
};

}  // namespace kiln::kernels::cpu
