// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_ and Keras' global_clipnorm / clipvalue:
// scale all gradients by one factor so that their joint norm is at most max_norm, or clamp every value.
//
//   loss.backward();
//   double norm = kiln::optim::clip_grad_norm(optimizer, 1.0);  // the optimizer's trainable gradients
//   optimizer.step();
// or let every step clip: kiln::optim::Adam opt(params, {.lr = 1e-3, .clip = {.norm = 1.0}}).
//
// The norm is summed in double, one parameter tensor at a time (a slot's `tensors`, or the slot as one tensor), and
// the tensors' sums are added in order: static mode's flat slot and dynamic mode's per-tensor slots give the same norm
// to the last bit, so the two modes still train to the same losses with clipping on.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kiln/core/error.hpp"
#include "kiln/optim/parameter.hpp"

namespace kiln::optim {

// How clip_grad_norm measures the gradients (torch.nn.utils.clip_grad_norm_'s arguments).
struct clip_norm_options {
  double norm_type = 2.0;           // p of the p-norm; std::numeric_limits<double>::infinity() for the largest |g|
  bool error_if_nonfinite = false;  // a NaN or infinite norm is a kiln::error instead of reaching the gradients
};

// The clipping an optimizer applies at each step, after regularisation and before its update: the joint 2-norm of
// its gradients (Keras' global_clipnorm, PyTorch's clip_grad_norm_) or each gradient value (clipvalue). 0 turns
// either off; as in Keras, at most one may be set.
struct clipping {
  double norm = 0.0;
  double value = 0.0;
};

namespace clip_detail {

// Whether a slot's gradient takes part: a frozen slot's does not, nor one still waiting to be zeroed (zero_grad's
// pending flag: the gradient is zero, and its memory is not yet).
template <class T>
bool takes_part(const parameter_slot<T>& s) {
  return s.size > 0 && (!s.trainable || *s.trainable) && !(s.grad_pending_zero && *s.grad_pending_zero);
}

// Runs f(first, count) for each parameter tensor of the slot, as ranges of its gradient.
template <class T, class F>
void for_each_tensor(const parameter_slot<T>& s, F&& f) {
  if (s.tensors.empty()) {
    f(index_t{0}, s.size);
    return;
  }
  for (const tensor_range& t : s.tensors) f(t.offset, t.size);
}

// The lanes of power_sum: value i of a range goes to lane i % sum_lanes. Enough independent sums to hide the add's
// latency: 16 left the sum of a large gradient still bound by that latency.
inline constexpr int sum_lanes = 64;

// acc[i % sum_lanes] += g[i]^2 over whole blocks of sum_lanes values from the start; returns where the blocks end.
// Each square of a float is exact in double, so the FMAs here round exactly as the plain loop's multiply and add.
template <class T>
index_t add_squares_by_lanes(const T* g, index_t n, double* acc) {
  index_t i = 0;
  const auto plain_loop = [&] {
    for (; i + sum_lanes <= n; i += sum_lanes)
      for (int l = 0; l < sum_lanes; ++l) acc[l] += static_cast<double>(g[i + l]) * static_cast<double>(g[i + l]);
  };
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    __m512d sums[sum_lanes / 8];
    for (int v = 0; v < sum_lanes / 8; ++v) sums[v] = _mm512_loadu_pd(acc + 8 * v);
    for (; i + sum_lanes <= n; i += sum_lanes)
      for (int v = 0; v < sum_lanes / 8; ++v) {
        // (The maskz form: GCC 12 warns that the plain one's undefined pass-through register may be used
        // uninitialised.)
        const __m512d x = _mm512_maskz_cvtps_pd(__mmask8(0xFF), _mm256_loadu_ps(g + i + 8 * v));
        sums[v] = _mm512_fmadd_pd(x, x, sums[v]);
      }
    for (int v = 0; v < sum_lanes / 8; ++v) _mm512_storeu_pd(acc + 8 * v, sums[v]);
  } else {
    plain_loop();
  }
#else
  plain_loop();
#endif
  return i;
}

// sum |g|^p over n values (max |g| for p = infinity), in double, in sum_lanes interleaved lanes added pairwise: the
// order depends on n alone. A NaN anywhere gives NaN.
template <class T>
double power_sum(const T* g, index_t n, double p) {
  double acc[sum_lanes] = {};
  const bool two = p == 2.0, one = p == 1.0, largest = std::isinf(p);
  auto term = [&](T v) {
    const double a = std::fabs(static_cast<double>(v));
    return two ? a * a : one || largest ? a : std::pow(a, p);
  };
  index_t i = 0;
  if (largest) {
    for (; i < n; ++i) {
      const double a = term(g[i]);
      if (!(a <= acc[0])) acc[0] = a;  // NaN sticks
    }
    return acc[0];
  }
  if (two) i = add_squares_by_lanes(g, n, acc);  // the common case
  for (; i + sum_lanes <= n; i += sum_lanes)
    for (int l = 0; l < sum_lanes; ++l) acc[l] += term(g[i + l]);
  for (int l = 0; i < n; ++i, ++l) acc[l] += term(g[i]);
  for (int width = sum_lanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

// Reads a gradient range where the host can: in place on a CPU policy, through a copy from a GPU's memory.
template <class Policy, class T, class F>
void with_host_values(const T* grad, index_t n, std::vector<T>& staging, F&& f) {
  if constexpr (Policy::host_accessible) {
    f(grad);
  } else {
    staging.resize(static_cast<std::size_t>(n));
    Policy::download(grad, staging.data(), n);
    f(static_cast<const T*>(staging.data()));
  }
}

// grad_norm's work, for grad_norm and clip_grad_norm, which check norm_type first and name themselves.
template <class Policy, class T>
double norm(std::span<const parameter_slot<T>> slots, double norm_type, const char* where) {
  if (!(norm_type > 0)) fail(where, ": expected norm_type > 0 (or infinity), found ", norm_type);
  const bool largest = std::isinf(norm_type);
  double total = 0;
  std::vector<T> staging;
  for (const auto& s : slots) {
    if (!clip_detail::takes_part(s)) continue;
    clip_detail::for_each_tensor(s, [&](index_t first, index_t count) {
      clip_detail::with_host_values<Policy>(s.grad + first, count, staging, [&](const T* g) {
        const double part = clip_detail::power_sum(g, count, norm_type);
        if (largest) {
          if (!(part <= total)) total = part;
        } else {
          total += part;
        }
      });
    });
  }
  if (largest || norm_type == 1.0) return total;
  return norm_type == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / norm_type);
}

}  // namespace clip_detail

// The p-norm of the gradients of `slots` that take part (trainable, not waiting to be zeroed), in double.
template <class Policy, class T>
double grad_norm(std::span<const parameter_slot<T>> slots, double norm_type = 2.0) {
  return clip_detail::norm<Policy>(slots, norm_type, "grad_norm");
}

// Scales the gradients of `slots` that take part by max_norm / (norm + 1e-6) where that is below 1, computed in T as
// PyTorch does, and returns their norm (before scaling). A NaN norm makes every gradient NaN, as in PyTorch, unless
// error_if_nonfinite asks for a kiln::error.
template <class Policy, class T>
double clip_grad_norm(std::span<const parameter_slot<T>> slots, double max_norm, clip_norm_options o = {}) {
  if (!(max_norm >= 0)) fail("clip_grad_norm: expected max_norm >= 0, found ", max_norm);
  const double norm = clip_detail::norm<Policy>(slots, o.norm_type, "clip_grad_norm");
  if (o.error_if_nonfinite && !std::isfinite(norm))
    fail("clip_grad_norm: the gradients' norm (norm_type ", o.norm_type, ") is ", norm,
         ", not finite: some gradient holds a NaN or an infinity");
  const T coefficient = static_cast<T>(max_norm) / (static_cast<T>(norm) + static_cast<T>(1e-6));
  if (coefficient >= T(1)) return norm;  // multiplying by min(coefficient, 1) = 1 would change nothing
  for (const auto& s : slots)
    if (clip_detail::takes_part(s)) Policy::scale(s.grad, coefficient, s.grad, s.size);
  return norm;
}

// Clamps every gradient value of `slots` that take part to [-clip_value, clip_value] (NaN stays NaN).
template <class Policy, class T>
void clip_grad_value(std::span<const parameter_slot<T>> slots, double clip_value) {
  if (!(clip_value >= 0)) fail("clip_grad_value: expected clip_value >= 0, found ", clip_value);
  const T limit = static_cast<T>(clip_value);
  std::vector<T> staging;
  for (const auto& s : slots) {
    if (!clip_detail::takes_part(s)) continue;
    T* values = s.grad;
    if constexpr (!Policy::host_accessible) {
      staging.resize(static_cast<std::size_t>(s.size));
      Policy::download(s.grad, staging.data(), s.size);
      values = staging.data();
    }
    for (index_t i = 0; i < s.size; ++i) {
      // (Comparisons, not std::clamp: a NaN compares false both ways and stays.)
      if (values[i] > limit) values[i] = limit;
      if (values[i] < -limit) values[i] = -limit;
    }
    if constexpr (!Policy::host_accessible) Policy::upload(staging.data(), s.grad, s.size);
  }
}

}  // namespace kiln::optim
