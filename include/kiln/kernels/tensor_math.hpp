// The scalar formulas of dynamic mode's general tensor ops: each element-wise unary and binary op, its partial
// derivatives, and the row reductions' operations. KILN_HOST_DEVICE, so the CPU kernels (kernels/cpu/tensor_ops.hpp)
// and the CUDA kernels (kernels/cuda/tensor_ops.cuh) apply the very same arithmetic. The formulas follow PyTorch's
// definitions of each op and of its derivative, including where they pick a value at a kink (abs at 0, clamp at its
// bounds, maximum at a tie).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kiln/core/config.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/float_math.hpp"

namespace kiln::kernels {

// e^x over the whole float range: on the host a float goes through the branch-free saturating_exp (float_math.hpp),
// so loops of it vectorise, with the ends where it saturates put back: beyond +-87, the square of e^(x/2) (two
// roundings, and a subnormal result where the true one is), and inf above 88.72. double and the CUDA device use the
// library's exp.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T tensor_exp(T x) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) {
    const bool far = (x < -87.0f) | (x > 87.0f);  // no short circuit: a branch would stop the vectorisation
    const float e = saturating_exp(select_float(far, 0.5f * x, x));
    return select_float(x > 88.7228394f, INFINITY, select_float(far, e * e, e));
  }
#endif
  return std::exp(x);
}

// Element-wise unary ops. p and q are the op's parameters: the exponent of pow, the bounds of clamp.
enum class unary_op : int {
  exp, log, log1p, sqrt, rsqrt, abs, sin, cos, reciprocal, square, pow, clamp,
};

template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T unary_value(unary_op op, T x, T p, T q) {
  switch (op) {
    case unary_op::exp: return tensor_exp(x);
    case unary_op::log: return std::log(x);
    case unary_op::log1p: return std::log1p(x);
    case unary_op::sqrt: return std::sqrt(x);
    case unary_op::rsqrt: return T(1) / std::sqrt(x);
    case unary_op::abs: return std::abs(x);
    case unary_op::sin: return std::sin(x);
    case unary_op::cos: return std::cos(x);
    case unary_op::reciprocal: return T(1) / x;
    case unary_op::square: return x * x;
    case unary_op::pow: return std::pow(x, p);
    case unary_op::clamp: return x < p ? p : (x > q ? q : x);  // NaN stays NaN, as torch.clamp
  }
  return x;
}

// dy/dx times the upstream gradient g, from the input x and the output y (clamp reads only those: x is inside its
// bounds exactly where y == x).
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T unary_gradient(unary_op op, T x, T y, T g, T p) {
  switch (op) {
    case unary_op::exp: return g * y;
    case unary_op::log: return g / x;
    case unary_op::log1p: return g / (x + T(1));
    case unary_op::sqrt: return g / (T(2) * y);
    case unary_op::rsqrt: return g * T(-0.5) * y * y * y;
    case unary_op::abs: return x > T(0) ? g : (x < T(0) ? -g : T(0));
    case unary_op::sin: return g * std::cos(x);
    case unary_op::cos: return -g * std::sin(x);
    case unary_op::reciprocal: return -g * y * y;
    case unary_op::square: return g * T(2) * x;
    case unary_op::pow: return p == T(0) ? T(0) : g * p * std::pow(x, p - T(1));
    case unary_op::clamp: return x == y ? g : T(0);  // x inside [p, q], bounds included, as PyTorch's
  }
  return g;
}

// Element-wise binary ops over broadcast operands. The comparisons give 1 or 0 and have no gradient; keep_where and
// drop_where are the gradients of where(): a where the mask b is set (or not), else 0; fill_where is masked_fill:
// s where the mask b is set, else a.
enum class binary_op : int {
  add, sub, mul, div, maximum, minimum, pow,
  eq, ne, lt, le, gt, ge,
  keep_where, drop_where, fill_where,
};

constexpr bool binary_op_has_gradient(binary_op op) { return op <= binary_op::pow || op == binary_op::fill_where; }

template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T binary_value(binary_op op, T a, T b, T s) {
  switch (op) {
    case binary_op::add: return a + b;
    case binary_op::sub: return a - b;
    case binary_op::mul: return a * b;
    case binary_op::div: return a / b;
    case binary_op::maximum: return (a != a || a > b) ? a : b;  // NaN propagates, as torch.maximum
    case binary_op::minimum: return (a != a || a < b) ? a : b;
    case binary_op::pow: return std::pow(a, b);
    case binary_op::eq: return a == b ? T(1) : T(0);
    case binary_op::ne: return a != b ? T(1) : T(0);
    case binary_op::lt: return a < b ? T(1) : T(0);
    case binary_op::le: return a <= b ? T(1) : T(0);
    case binary_op::gt: return a > b ? T(1) : T(0);
    case binary_op::ge: return a >= b ? T(1) : T(0);
    case binary_op::keep_where: return b != T(0) ? a : T(0);
    case binary_op::drop_where: return b != T(0) ? T(0) : a;
    case binary_op::fill_where: return b != T(0) ? s : a;
  }
  return a;
}

// The upstream gradient g times the partial derivative of binary_value(op, a, b) in a (side 0) or in b (side 1).
// maximum and minimum split a tie evenly, pow's exponent gradient is 0 where the base is 0 and the exponent is not
// negative, as PyTorch's.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T binary_gradient(binary_op op, int side, T a, T b, T g) {
  switch (op) {
    case binary_op::add: return g;
    case binary_op::sub: return side == 0 ? g : -g;
    case binary_op::mul: return side == 0 ? g * b : g * a;
    case binary_op::div: return side == 0 ? g / b : -g * a / (b * b);
    case binary_op::maximum:
    case binary_op::minimum: {
      if (a == b) return g * T(0.5);
      const bool a_wins = op == binary_op::maximum ? a > b : a < b;
      return (side == 0) == a_wins ? g : T(0);
    }
    case binary_op::pow:
      if (side == 0) return b == T(0) ? T(0) : g * b * std::pow(a, b - T(1));
      return (a == T(0) && b >= T(0)) ? T(0) : g * std::pow(a, b) * std::log(a);
    case binary_op::fill_where: return side == 0 && b == T(0) ? g : T(0);
    default: return T(0);
  }
}

// The reductions of one row (the reduced elements, made contiguous) to one value.
enum class row_reduction : int {
  sum, mean, amax, amin, var, logsumexp, norm,
};


// A row's reduction (n elements, contiguous). p is norm's order, correction var's (the divisor is n - correction).
// An empty row gives the reduction of nothing: 0 for sum and norm, NaN for mean and var, -inf for logsumexp; amax
// and amin are refused by the op before they get here.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T sign_of(T v) {
  return v > T(0) ? T(1) : (v < T(0) ? T(-1) : T(0));
}

// The terms that the row reductions add up, as functors (no lambdas, for the CUDA device).
template <class T>
struct value_term {
  KILN_HOST_DEVICE T operator()(T v) const { return v; }
};
template <class T>
struct abs_term {
  KILN_HOST_DEVICE T operator()(T v) const { return std::abs(v); }
};
template <class T>
struct square_term {
  KILN_HOST_DEVICE T operator()(T v) const { return v * v; }
};
template <class T>
struct deviation_square_term {
  T mean;
  KILN_HOST_DEVICE T operator()(T v) const { return (v - mean) * (v - mean); }
};
template <class T>
struct shifted_exp_term {
  T shift;
  KILN_HOST_DEVICE T operator()(T v) const { return tensor_exp(v - shift); }
};
// e^(v - shift) as the softmax kernels take it (exp_value: saturating below e^-87.3, as they always have).
template <class T>
struct exp_minus_term {
  T shift;
  KILN_HOST_DEVICE T operator()(T v) const { return exp_value(v - shift); }
};
template <class T>
struct abs_pow_term {
  T p;
  KILN_HOST_DEVICE T operator()(T v) const { return std::pow(std::abs(v), p); }
};

// The number of partial sums a row reduction keeps: element i goes to lane i % 16 (in order), and the lanes are then
// added pairwise. The order depends on n alone, so the result does too, and the lanes make the loop vectorise.
inline constexpr int reduction_lanes = 16;

template <class T, class Term>
KILN_HOST_DEVICE T lane_sum(const T* x, index_t n, Term term) {
  T lane[reduction_lanes] = {};
  index_t i = 0;
  for (; i + reduction_lanes <= n; i += reduction_lanes)
    for (int k = 0; k < reduction_lanes; ++k) lane[k] += term(x[i + k]);
  for (int k = 0; i + k < n; ++k) lane[k] += term(x[i + k]);
  for (int width = reduction_lanes / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) lane[k] += lane[k + width];
  return lane[0];
}

// The largest (or smallest) of n > 0 elements of term(x), NaN if any is NaN, in lanes as lane_sum (the result does
// not depend on the order).
template <bool Largest, class T, class Term>
KILN_HOST_DEVICE T lane_extreme(const T* x, index_t n, Term term) {
  T lane[reduction_lanes];
  bool nan[reduction_lanes] = {};
  const T first = term(x[0]);
  for (int k = 0; k < reduction_lanes; ++k) lane[k] = first;
  index_t i = 0;
  for (; i + reduction_lanes <= n; i += reduction_lanes)
    for (int k = 0; k < reduction_lanes; ++k) {
      const T v = term(x[i + k]);
      nan[k] |= v != v;
      lane[k] = (Largest ? v > lane[k] : v < lane[k]) ? v : lane[k];
    }
  for (int k = 0; i + k < n; ++k) {
    const T v = term(x[i + k]);
    nan[k] |= v != v;
    lane[k] = (Largest ? v > lane[k] : v < lane[k]) ? v : lane[k];
  }
  T best = lane[0];
  bool any_nan = nan[0];
  for (int k = 1; k < reduction_lanes; ++k) {
    best = (Largest ? lane[k] > best : lane[k] < best) ? lane[k] : best;
    any_nan |= nan[k];
  }
  return any_nan ? T(NAN) : best;
}

template <class T>
KILN_HOST_DEVICE T reduce_row_value(row_reduction op, const T* x, index_t n, T p, T correction) {
  const T inf = T(INFINITY);
  switch (op) {
    case row_reduction::sum: return lane_sum(x, n, value_term<T>{});
    case row_reduction::mean: return lane_sum(x, n, value_term<T>{}) / static_cast<T>(n);
    case row_reduction::amax: return lane_extreme<true>(x, n, value_term<T>{});
    case row_reduction::amin: return lane_extreme<false>(x, n, value_term<T>{});
    case row_reduction::var: {
      const T m = lane_sum(x, n, value_term<T>{}) / static_cast<T>(n);
      const T ss = lane_sum(x, n, deviation_square_term<T>{m});
      const T divisor = static_cast<T>(n) - correction;  // as PyTorch: below 0 counts as 0, giving inf or NaN
      return ss / (divisor > T(0) ? divisor : T(0));
    }
    case row_reduction::logsumexp: {
      if (n == 0) return -inf;
      const T m = lane_extreme<true>(x, n, value_term<T>{});
      if (std::isinf(m) || m != m) return m;  // all -inf, some +inf, or a NaN: the result is m itself
      return m + std::log(lane_sum(x, n, shifted_exp_term<T>{m}));
    }
    case row_reduction::norm: {
      if (n == 0) return T(0);
      if (std::isinf(p)) return lane_extreme<true>(x, n, abs_term<T>{});
      if (p == T(1)) return lane_sum(x, n, abs_term<T>{});
      if (p == T(2)) return std::sqrt(lane_sum(x, n, square_term<T>{}));
      return std::pow(lane_sum(x, n, abs_pow_term<T>{p}), T(1) / p);
    }
  }
  return T(0);
}

template <class T>
KILN_HOST_DEVICE void reduce_row_gradient(row_reduction op, const T* x, T y, T g, T* dx, index_t n, T p,
                                        T correction) {
  switch (op) {
    case row_reduction::sum:
      for (index_t i = 0; i < n; ++i) dx[i] = g;
      return;
    case row_reduction::mean:
      for (index_t i = 0; i < n; ++i) dx[i] = g / static_cast<T>(n);
      return;
    case row_reduction::amax:
    case row_reduction::amin: {  // shared evenly between the elements equal to the result, as PyTorch's
      index_t ties = 0;
      for (index_t i = 0; i < n; ++i) ties += x[i] == y;
      for (index_t i = 0; i < n; ++i) dx[i] = x[i] == y ? g / static_cast<T>(ties) : T(0);
      return;
    }
    case row_reduction::var: {
      T s = 0;
      for (index_t i = 0; i < n; ++i) s += x[i];
      const T m = s / static_cast<T>(n), scale = T(2) * g / (static_cast<T>(n) - correction);
      for (index_t i = 0; i < n; ++i) dx[i] = scale * (x[i] - m);
      return;
    }
    case row_reduction::logsumexp:
      for (index_t i = 0; i < n; ++i) dx[i] = g * tensor_exp(x[i] - y);
      return;
    case row_reduction::norm: {
      if (std::isinf(p)) {  // the gradient of amax(|x|), shared between the ties
        index_t ties = 0;
        for (index_t i = 0; i < n; ++i) ties += std::abs(x[i]) == y;
        for (index_t i = 0; i < n; ++i)
          dx[i] = std::abs(x[i]) == y ? sign_of(x[i]) * g / static_cast<T>(ties) : T(0);
      } else if (p == T(1)) {
        for (index_t i = 0; i < n; ++i) dx[i] = sign_of(x[i]) * g;
      } else if (p == T(2)) {
        for (index_t i = 0; i < n; ++i) dx[i] = y == T(0) ? T(0) : x[i] * (g / y);
      } else {
        for (index_t i = 0; i < n; ++i)
          dx[i] = y == T(0) ? T(0) : sign_of(x[i]) * std::pow(std::abs(x[i]), p - T(1)) * g / std::pow(y, p - T(1));
      }
      return;
    }
  }
}

// The position of the first largest (or smallest) element of a row of n > 0; a NaN counts as the largest and the
// smallest, as in PyTorch.
template <class T>
KILN_HOST_DEVICE std::int64_t arg_reduce_row(const T* row, index_t n, bool largest) {
  index_t best = 0;
  for (index_t c = 1; c < n && row[best] == row[best]; ++c) {
    const T v = row[c];
    if (v != v || (largest ? v > row[best] : v < row[best])) best = c;
  }
  return static_cast<std::int64_t>(best);
}

}  // namespace kiln::kernels
