// Element-wise activations (relu, leaky_relu, gelu, sigmoid, tanh): Policy::activation_forward and
// activation_backward, the kernels static mode's activation layers and fused Dense epilogues call.
#pragma once

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/kernels/activation.hpp"

namespace kiln::nn {

namespace detail {

template <class T>
void activation_backward_entry(const tape_entry<T>& e) {
  auto kind = static_cast<activation>(e.aux);
  variable_node<T>*x = e.in[0], *y = e.out;
  auto dx = grad_target_for(x);
  if (!dx.data) return;
  // Static mode writes dx = f'(.) * dy; with accumulate the kernel forms the same product, then adds it.
  dynamic_policy::activation_backward(kind, x->value, y->value, y->grad, dx.data, y->shape.numel(), e.scalar,
                                      dx.accumulate);
}

template <class T>
basic_variable<T> activation_op(const basic_variable<T>& x, activation kind, T slope, const char* op) {
  auto* xn = node_of(x, op);
  bool record = should_record<T>({xn});
  auto y = make_output<T>(xn->shape, record);
  dynamic_policy::activation_forward(kind, xn->value, y.data(), xn->shape.numel(), slope);
  if (record)
    tape<T>::instance().record(&activation_backward_entry<T>, y.node(), xn, nullptr, nullptr, slope,
                               static_cast<int>(kind));
  return y;
}

}  // namespace detail

// max(x, 0).
template <class T>
basic_variable<T> relu(const basic_variable<T>& x) {
  return detail::activation_op(x, activation::relu, T(0), "relu");
}
namespace detail {
// The shared backward kernel, as static mode's fused epilogues need, reads the sign of x from the output y, which a
// negative slope makes ambiguous (both signs of x give y > 0); static mode's LeakyReLU<Slope> rejects such slopes at
// compile time, and dynamic mode rejects them here rather than return a wrong gradient.
template <class T>
void check_negative_slope(T negative_slope, const char* where) {
  if (!(negative_slope >= T(0)))
    fail(where, ": expected negative_slope >= 0, found ", negative_slope,
         " (a negative slope makes the output's sign, which the backward reads, no longer tell the input's)");
}
}  // namespace detail

// x for x > 0, negative_slope * x otherwise; negative_slope must not be negative (kiln::error).
template <class T>
basic_variable<T> leaky_relu(const basic_variable<T>& x, std::type_identity_t<T> negative_slope = T(0.01)) {
  detail::check_negative_slope(negative_slope, "leaky_relu");
  return detail::activation_op(x, activation::leaky_relu, negative_slope, "leaky_relu");
}
// x * Phi(x), the exact erf form (PyTorch's approximate='none').
template <class T>
basic_variable<T> gelu(const basic_variable<T>& x) {
  return detail::activation_op(x, activation::gelu, T(0), "gelu");
}
// 1 / (1 + exp(-x)).
template <class T>
basic_variable<T> sigmoid(const basic_variable<T>& x) {
  return detail::activation_op(x, activation::sigmoid, T(0), "sigmoid");
}
// tanh(x).
template <class T>
basic_variable<T> tanh(const basic_variable<T>& x) {
  return detail::activation_op(x, activation::tanh, T(0), "tanh");
}

}  // namespace kiln::nn
