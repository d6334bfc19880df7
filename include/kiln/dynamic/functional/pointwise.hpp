// Element-wise unary ops on Variables, with PyTorch's names: exp, log, log1p, sqrt, rsqrt, abs, sin, cos, reciprocal,
// square, pow with a scalar exponent, clamp. The formulas and their derivatives are kernels/tensor_math.hpp's.
//   auto y = kiln::nn::clamp(kiln::nn::exp(x), 0.0f, 10.0f);
#pragma once

#include <limits>
#include <type_traits>

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/kernels/tensor_math.hpp"

namespace kiln::nn {

namespace detail {

// The entry of one unary op: aux is the op, scalar its first parameter (pow's exponent); clamp's gradient needs only
// its input and output.
template <class T>
void unary_backward_entry(const tape_entry<T>& e) {
  auto t = grad_target_for(e.in[0]);
  if (!t.data) return;
  dynamic_policy::unary_backward(static_cast<kernels::unary_op>(e.aux), e.in[0]->value, e.out->value, e.out->grad,
                                 t.data, e.out->shape.numel(), e.scalar, t.accumulate);
}

template <class T>
basic_variable<T> unary(const basic_variable<T>& x, kernels::unary_op op, const char* name, T p = T(0), T q = T(0)) {
  auto* xn = node_of(x, name);
  const bool record = should_record<T>({xn});
  auto y = make_output<T>(xn->shape, record);
  dynamic_policy::unary(op, static_cast<const T*>(xn->value), y.data(), xn->shape.numel(), p, q);
  if (record)
    tape<T>::instance().record(&unary_backward_entry<T>, y.node(), xn, nullptr, nullptr, p, static_cast<int>(op));
  return y;
}

}  // namespace detail

// e^x.
template <class T>
basic_variable<T> exp(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::exp, "exp");
}
// The natural logarithm.
template <class T>
basic_variable<T> log(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::log, "log");
}
// log(1 + x), accurate for small x.
template <class T>
basic_variable<T> log1p(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::log1p, "log1p");
}
template <class T>
basic_variable<T> sqrt(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::sqrt, "sqrt");
}
// 1 / sqrt(x).
template <class T>
basic_variable<T> rsqrt(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::rsqrt, "rsqrt");
}
// |x|; its gradient at 0 is 0, as PyTorch's.
template <class T>
basic_variable<T> abs(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::abs, "abs");
}
template <class T>
basic_variable<T> sin(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::sin, "sin");
}
template <class T>
basic_variable<T> cos(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::cos, "cos");
}
// 1 / x.
template <class T>
basic_variable<T> reciprocal(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::reciprocal, "reciprocal");
}
// x * x.
template <class T>
basic_variable<T> square(const basic_variable<T>& x) {
  return detail::unary(x, kernels::unary_op::square, "square");
}
// x to a scalar power (torch.pow(x, exponent)); the tensor-exponent form is in broadcast.hpp.
template <class T>
basic_variable<T> pow(const basic_variable<T>& x, double exponent) {
  return detail::unary(x, kernels::unary_op::pow, "pow", static_cast<T>(exponent));
}
// x limited to [min, max] (torch.clamp); the gradient passes where x is inside, bounds included.
template <class T>
basic_variable<T> clamp(const basic_variable<T>& x, std::type_identity_t<T> min, std::type_identity_t<T> max) {
  return detail::unary(x, kernels::unary_op::clamp, "clamp", min, max);
}
// max(x, min) element by element (torch.clamp(x, min=...)).
template <class T>
basic_variable<T> clamp_min(const basic_variable<T>& x, std::type_identity_t<T> min) {
  return detail::unary(x, kernels::unary_op::clamp, "clamp_min", min, std::numeric_limits<T>::infinity());
}
// min(x, max) element by element (torch.clamp(x, max=...)).
template <class T>
basic_variable<T> clamp_max(const basic_variable<T>& x, std::type_identity_t<T> max) {
  return detail::unary(x, kernels::unary_op::clamp, "clamp_max", -std::numeric_limits<T>::infinity(), max);
}

}  // namespace kiln::nn
