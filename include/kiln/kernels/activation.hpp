// Element-wise activation functions and their derivatives, as scalar inline functions. Every kernel that applies an
// activation (the element-wise kernels, the GEMM epilogue, later the GPU kernels) calls these, so fused and unfused
// paths compute bit-identical values. They are KILN_HOST_DEVICE, so the CUDA kernels apply the very same formulas.
#pragma once

#include <cmath>
#include <numbers>
#include <type_traits>

#include "kiln/core/config.hpp"
#include "kiln/kernels/float_math.hpp"

namespace kiln {

// Which activation a layer or a fused epilogue applies.
enum class activation { identity, relu, leaky_relu, gelu, sigmoid, tanh };

inline const char* activation_name(activation a) {
  switch (a) {
    case activation::identity: return "Identity";
    case activation::relu: return "ReLU";
    case activation::leaky_relu: return "LeakyReLU";
    case activation::gelu: return "GELU";
    case activation::sigmoid: return "Sigmoid";
    case activation::tanh: return "Tanh";
  }
  return "?";
}

// Whether the derivative needs the activation's input (GELU) rather than only its output (all the others).
constexpr bool activation_grad_needs_input(activation a) { return a == activation::gelu; }

namespace kernels {

// The logistic sigmoid. On the host a float goes through the branch-free saturating_exp, so loops applying it
// vectorise; double, and the CUDA device, use the library's exp.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T sigmoid_value(T x) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) return 1.0f / (1.0f + saturating_exp(-x));
#endif
  return T(1) / (T(1) + std::exp(-x));
}

// e^x, with the same split as sigmoid_value: saturating_exp for a float on the host (below -87.3 it gives 1.2e-38,
// not a subnormal or 0), the library's exp otherwise.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T exp_value(T x) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) return saturating_exp(x);
#endif
  return std::exp(x);
}

// tanh, with the same split as sigmoid_value: saturating_tanh for a float on the host, the library's tanh otherwise.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T tanh_value(T x) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) return saturating_tanh(x);
#endif
  return std::tanh(x);
}

// 2 Phi(x), twice the standard normal CDF that GELU multiplies x by, as erfc(-x / sqrt 2) rather than
// 1 + erf(x / sqrt 2): for negative x, erf is near -1 and the sum cancels (at x = -3.4 its few digits left made CPU
// and GPU disagree in the fourth), while erfc of a positive argument is accurate to its last bits.
// A float on the host takes the branch-free saturating_erfc (float_math.hpp), so that loops of GELU vectorise; double
// and the CUDA device use the library's erfc.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T gelu_cdf_times_two(T x) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) return saturating_erfc(-x * float(std::numbers::sqrt2 / 2));
#endif
  return std::erfc(-x * T(std::numbers::sqrt2 / 2));
}
// e^(-x^2 / 2) of GELU's derivative: branch-free for a float on the host (0 where it leaves the normal floats).
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T gelu_gaussian(T x) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) {
    const float arg = -0.5f * x * x;
    return select_float(arg < -87.3f, 0.0f, saturating_exp(arg));
  }
#endif
  return std::exp(T(-0.5) * x * x);
}

// y = f(x). slope is LeakyReLU's negative slope and is ignored by the others.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T activate(activation a, T x, T slope) {
  switch (a) {
    case activation::identity: return x;
    case activation::relu: return x > T(0) ? x : T(0);
    case activation::leaky_relu: return x > T(0) ? x : x * slope;
    case activation::gelu: return T(0.5) * x * gelu_cdf_times_two(x);
    case activation::sigmoid: return sigmoid_value(x);
    case activation::tanh: return tanh_value(x);
  }
  return x;
}

// dL/dx = dL/dy * f'(x), with f' written in terms of the output y where it can be (x is then unused).
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T activate_backward(activation a, T x, T y, T dy, T slope) {
  switch (a) {
    case activation::identity: return dy;
    case activation::relu: return y > T(0) ? dy : T(0);
    case activation::leaky_relu: return y > T(0) ? dy : dy * slope;
    case activation::gelu: {
      T cdf = T(0.5) * gelu_cdf_times_two(x);
      T pdf = gelu_gaussian(x) * T(std::numbers::inv_sqrtpi / std::numbers::sqrt2);
      return dy * (cdf + x * pdf);
    }
    case activation::sigmoid: return dy * y * (T(1) - y);
    case activation::tanh: return dy * (T(1) - y * y);
  }
  return dy;
}

}  // namespace kernels
}  // namespace kiln
