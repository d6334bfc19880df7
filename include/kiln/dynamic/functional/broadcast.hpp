// Element-wise binary ops with NumPy's and PyTorch's broadcasting over any rank: div, maximum, minimum, pow; the
// comparisons eq, ne, lt, le, gt, ge (masks of 1 and 0, without gradient); where and masked_fill. add, sub and mul
// (arithmetic.hpp) take the same general path for shapes outside their fast ones.
//
// Broadcasting: the shapes are aligned at their last dimension; along each dimension the extents must be equal or one
// of them 1 (or missing), and the result takes the larger. Each operand's gradient is the output's gradient times the
// partial derivative, summed over the dimensions along which that operand was broadcast.
//   auto z = kiln::nn::div(x, kiln::nn::sum(x, 1, true));           // [N, F] / [N, 1]
//   auto masked = kiln::nn::masked_fill(scores, causal_mask, -1e9f);
#pragma once

#include <sstream>
#include <type_traits>

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/kernels/strided.hpp"
#include "kiln/kernels/tensor_math.hpp"

namespace kiln::nn {

namespace detail {

// The broadcast shape of a and b, or an error naming the op, both shapes and the dimension that breaks the rule.
inline kiln::shape broadcast_shapes(const kiln::shape& a, const kiln::shape& b, const char* op) {
  const int rank = a.rank() > b.rank() ? a.rank() : b.rank();
  kiln::shape out;
  for (int d = 0; d < rank; ++d) {
    const int da = d - (rank - a.rank()), db = d - (rank - b.rank());
    const index_t ea = da < 0 ? 1 : a[da], eb = db < 0 ? 1 : b[db];
    if (ea != eb && ea != 1 && eb != 1)
      fail(op, ": shapes ", a, " and ", b, " do not broadcast: aligned at the last dimension, dimension ", d - rank,
           " has extents ", ea, " and ", eb, ", which must be equal or one of them 1");
    out.push_back(ea == 1 ? eb : ea);
  }
  return out;
}

// Adds g (of shape out, contiguous) into an operand's gradient target, summing over the dimensions along which the
// operand (of shape operand) was broadcast.
template <class T>
void reduce_to_operand(const T* g, const kiln::shape& out, const kiln::shape& operand, grad_target<T> target) {
  using P = dynamic_policy;
  if (!target.data) return;
  if (operand == out) {
    if (target.accumulate) P::accumulate(g, target.data, out.numel());
    else P::copy(g, target.data, out.numel());
    return;
  }
  if (!target.accumulate) zero_values(target.data, operand.numel());
  kernels::strided_walk<2> w;
  w.rank = out.rank();
  for (int d = 0; d < out.rank(); ++d) w.extent[d] = out[d];
  kernels::broadcast_strides(operand, out, w.stride[0]);
  kernels::contiguous_strides(out, w.stride[1]);
  P::copy_strided(g, target.data, w.coalesce(), true);
}

// The entry of a binary op: aux is the op, scalar its constant (masked_fill's value).
template <class T>
void binary_backward_entry(const tape_entry<T>& e) {
  using P = dynamic_policy;
  const auto op = static_cast<kernels::binary_op>(e.aux);
  const kiln::shape& out = e.out->shape;
  for (int side = 0; side < 2; ++side) {
    variable_node<T>* operand = e.in[side];
    if (!operand->requires_grad || (side == 1 && op == kernels::binary_op::fill_where)) continue;
    auto walk = kernels::broadcast_walk<3>(out, {out, e.in[0]->shape, e.in[1]->shape});
    scratch_buffer<T> g(out.numel());
    P::binary_backward(op, side, static_cast<const T*>(e.in[0]->value), static_cast<const T*>(e.in[1]->value),
                       static_cast<const T*>(e.out->grad), g.data(), walk);
    reduce_to_operand(static_cast<const T*>(g.data()), out, operand->shape, grad_target_for(operand));
  }
}

template <class T>
basic_variable<T> binary(kernels::binary_op op, const basic_variable<T>& a, const basic_variable<T>& b,
                         const char* name, T s = T(0)) {
  auto* an = node_of(a, name);
  auto* bn = node_of(b, name);
  const kiln::shape out = broadcast_shapes(an->shape, bn->shape, name);
  if (op == kernels::binary_op::fill_where && !(out == an->shape))
    fail(name, ": the mask of shape ", bn->shape, " must broadcast to the input's shape ", an->shape,
         ", found a result of shape ", out);
  const bool record = kernels::binary_op_has_gradient(op) && should_record<T>({an, bn});
  auto y = make_output<T>(out, record);
  dynamic_policy::binary(op, static_cast<const T*>(an->value), static_cast<const T*>(bn->value), y.data(),
                         kernels::broadcast_walk<3>(out, {out, an->shape, bn->shape}), s);
  if (record) tape<T>::instance().record(&binary_backward_entry<T>, y.node(), an, bn, nullptr, s, static_cast<int>(op));
  return y;
}

template <class T>
void where_backward_entry(const tape_entry<T>& e) {
  using P = dynamic_policy;
  const kiln::shape& out = e.out->shape;
  variable_node<T>* mask = e.in[0];
  for (int side = 1; side < 3; ++side) {
    variable_node<T>* operand = e.in[side];
    if (!operand->requires_grad) continue;
    scratch_buffer<T> g(out.numel());
    P::binary(side == 1 ? kernels::binary_op::keep_where : kernels::binary_op::drop_where,
              static_cast<const T*>(e.out->grad), static_cast<const T*>(mask->value), g.data(),
              kernels::broadcast_walk<3>(out, {out, out, mask->shape}), T(0));
    reduce_to_operand(static_cast<const T*>(g.data()), out, operand->shape, grad_target_for(operand));
  }
}

}  // namespace detail

// a / b.
template <class T>
basic_variable<T> div(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::div, a, b, "div");
}
template <class T>
basic_variable<T> div(const basic_variable<T>& a, std::type_identity_t<T> s) {
  return detail::binary(kernels::binary_op::div, a, detail::scalar_constant<T>(s), "div");
}
// The larger of a and b element by element (NaN propagates); a tie splits the gradient evenly, as PyTorch's.
template <class T>
basic_variable<T> maximum(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::maximum, a, b, "maximum");
}
// The smaller of a and b element by element.
template <class T>
basic_variable<T> minimum(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::minimum, a, b, "minimum");
}
// a to the power b element by element (torch.pow with a tensor exponent).
template <class T>
basic_variable<T> pow(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::pow, a, b, "pow");
}

// Comparisons: 1 where the relation holds, else 0 (torch's bool result as the Variable's type), without gradient.
template <class T>
basic_variable<T> eq(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::eq, a, b, "eq");
}
template <class T>
basic_variable<T> eq(const basic_variable<T>& a, std::type_identity_t<T> s) {
  return detail::binary(kernels::binary_op::eq, a, detail::scalar_constant<T>(s), "eq");
}
template <class T>
basic_variable<T> ne(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::ne, a, b, "ne");
}
template <class T>
basic_variable<T> ne(const basic_variable<T>& a, std::type_identity_t<T> s) {
  return detail::binary(kernels::binary_op::ne, a, detail::scalar_constant<T>(s), "ne");
}
template <class T>
basic_variable<T> lt(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::lt, a, b, "lt");
}
template <class T>
basic_variable<T> lt(const basic_variable<T>& a, std::type_identity_t<T> s) {
  return detail::binary(kernels::binary_op::lt, a, detail::scalar_constant<T>(s), "lt");
}
template <class T>
basic_variable<T> le(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::le, a, b, "le");
}
template <class T>
basic_variable<T> le(const basic_variable<T>& a, std::type_identity_t<T> s) {
  return detail::binary(kernels::binary_op::le, a, detail::scalar_constant<T>(s), "le");
}
template <class T>
basic_variable<T> gt(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::gt, a, b, "gt");
}
template <class T>
basic_variable<T> gt(const basic_variable<T>& a, std::type_identity_t<T> s) {
  return detail::binary(kernels::binary_op::gt, a, detail::scalar_constant<T>(s), "gt");
}
template <class T>
basic_variable<T> ge(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::binary(kernels::binary_op::ge, a, b, "ge");
}
template <class T>
basic_variable<T> ge(const basic_variable<T>& a, std::type_identity_t<T> s) {
  return detail::binary(kernels::binary_op::ge, a, detail::scalar_constant<T>(s), "ge");
}

// a where mask is non-zero, else b; the three shapes broadcast together (torch.where). The mask gets no gradient.
template <class T>
basic_variable<T> where(const basic_variable<T>& mask, const basic_variable<T>& a, const basic_variable<T>& b) {
  auto* mn = detail::node_of(mask, "where");
  auto* an = detail::node_of(a, "where");
  auto* bn = detail::node_of(b, "where");
  const kiln::shape out =
      detail::broadcast_shapes(detail::broadcast_shapes(mn->shape, an->shape, "where"), bn->shape, "where");
  const bool record = detail::should_record<T>({an, bn});
  auto y = detail::make_output<T>(out, record);
  dynamic_policy::where(static_cast<const T*>(mn->value), static_cast<const T*>(an->value),
                        static_cast<const T*>(bn->value), y.data(),
                        kernels::broadcast_walk<4>(out, {out, mn->shape, an->shape, bn->shape}));
  if (record) detail::tape<T>::instance().record(&detail::where_backward_entry<T>, y.node(), mn, an, bn);
  return y;
}
template <class T>
basic_variable<T> where(const basic_variable<T>& mask, const basic_variable<T>& a, std::type_identity_t<T> b) {
  return where(mask, a, detail::scalar_constant<T>(b));
}
// x with value wherever mask (broadcast to x's shape) is non-zero (Tensor.masked_fill).
template <class T>
basic_variable<T> masked_fill(const basic_variable<T>& x, const basic_variable<T>& mask,
                              std::type_identity_t<T> value) {
  return detail::binary(kernels::binary_op::fill_where, x, mask, "masked_fill", value);
}

template <class T>
basic_variable<T> operator/(const basic_variable<T>& a, const basic_variable<T>& b) {
  return div(a, b);
}
template <class T>
basic_variable<T> operator/(const basic_variable<T>& a, std::type_identity_t<T> s) {
  return div(a, s);
}
template <class T>
basic_variable<T> operator/(std::type_identity_t<T> s, const basic_variable<T>& b) {
  return div(detail::scalar_constant<T>(s), b);
}

}  // namespace kiln::nn
