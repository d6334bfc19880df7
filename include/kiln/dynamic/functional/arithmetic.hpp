// Element-wise arithmetic on Variables: add, sub and mul with broadcasting, multiplication by a scalar, negation, and
// the operators +, -, * that spell them. Two shapes have a fast path of their own, the same shape and a 1-D operand
// broadcast over the rows (a bias, a per-feature scale); every other pair of shapes goes to the general broadcasting
// op of broadcast.hpp.
#pragma once

#include <type_traits>

#include "kiln/dynamic/functional/broadcast.hpp"
#include "kiln/dynamic/functional/common.hpp"

namespace kiln::nn {

namespace detail {

// How the right operand of add/sub/mul lines up with the left: the same shape, one row repeated over every row, or
// any other broadcast (the general path).
enum class broadcast_kind : int { same = 0, rows = 1, general = 2 };

template <class T>
broadcast_kind check_broadcast(const variable_node<T>* a, const variable_node<T>* b) {
  if (a->shape == b->shape) return broadcast_kind::same;
  const kiln::shape& s = a->shape;
  if (b->shape.rank() == 1 && s.rank() >= 1 && s[s.rank() - 1] == b->shape[0]) return broadcast_kind::rows;
  return broadcast_kind::general;
}

// dx (+)= sign * dy, for a same-shape operand.
template <class T>
void pass_gradient(variable_node<T>* x, const T* dy, index_t n, T sign) {
  using P = dynamic_policy;
  auto t = grad_target_for(x);
  if (!t.data) return;
  if (sign == T(1)) {
    if (t.accumulate) P::accumulate(dy, t.data, n);
    else P::copy(dy, t.data, n);
  } else {
    write_or_add<P>(t, n, [&](T* dst) { P::scale(dy, sign, dst, n); });
  }
}

// db (+)= sign * column sums of dy, for a row-broadcast operand.
template <class T>
void reduce_gradient(variable_node<T>* b, const T* dy, index_t rows, index_t cols, T sign) {
  using P = dynamic_policy;
  auto t = grad_target_for(b);
  if (!t.data) return;
  if (sign == T(1)) {
    P::sum_rows(dy, t.data, rows, cols, t.accumulate);
  } else {
    write_or_add<P>(t, cols, [&](T* dst) {
      P::sum_rows(dy, dst, rows, cols, false);
      P::scale(dst, sign, dst, cols);
    });
  }
}

template <class T>
void add_sub_backward(const tape_entry<T>& e) {  // scalar: +1 for add, -1 for sub
  index_t n = e.out->shape.numel();
  pass_gradient(e.in[0], e.out->grad, n, T(1));
  if (static_cast<broadcast_kind>(e.aux) == broadcast_kind::same) {
    pass_gradient(e.in[1], e.out->grad, n, e.scalar);
  } else {
    index_t cols = e.in[1]->shape[0];
    reduce_gradient(e.in[1], e.out->grad, cols ? n / cols : 0, cols, e.scalar);
  }
}

template <class T>
basic_variable<T> add_sub(const basic_variable<T>& a, const basic_variable<T>& b, bool subtract, const char* op) {
  using P = dynamic_policy;
  auto* an = node_of(a, op);
  auto* bn = node_of(b, op);
  broadcast_kind kind = check_broadcast(an, bn);
  if (kind == broadcast_kind::general)
    return binary(subtract ? kernels::binary_op::sub : kernels::binary_op::add, a, b, op);
  index_t n = an->shape.numel();
  bool record = should_record<T>({an, bn});
  auto y = make_output<T>(an->shape, record);
  if (kind == broadcast_kind::same) {
    if (subtract) P::subtract(an->value, bn->value, y.data(), n);
    else P::add(an->value, bn->value, y.data(), n);
  } else {
    index_t cols = bn->shape[0], rows = cols ? n / cols : 0;
    if (subtract) {
      scratch_buffer<T> negated(cols);
      P::scale(bn->value, T(-1), negated.data(), cols);
      P::copy(an->value, y.data(), n);
      P::add_row_bias(y.data(), negated.data(), rows, cols);
    } else {
      P::copy(an->value, y.data(), n);
      P::add_row_bias(y.data(), bn->value, rows, cols);
    }
  }
  if (record)
    tape<T>::instance().record(&add_sub_backward<T>, y.node(), an, bn, nullptr, subtract ? T(-1) : T(1),
                               static_cast<int>(kind));
  return y;
}

// out = a * b with b either a's shape or one row multiplying every row of a (the multiply kernel, row by row).
template <class T>
void multiply_rows(const T* a, const T* b, T* out, index_t n, index_t cols, broadcast_kind kind) {
  if (kind == broadcast_kind::same) {
    dynamic_policy::multiply(a, b, out, n);
  } else {
    for (index_t at = 0; at < n; at += cols) dynamic_policy::multiply(a + at, b, out + at, cols);
  }
}

template <class T>
void mul_backward(const tape_entry<T>& e) {
  using P = dynamic_policy;
  variable_node<T>*a = e.in[0], *b = e.in[1];
  auto kind = static_cast<broadcast_kind>(e.aux);
  index_t n = e.out->shape.numel(), cols = b->shape.numel();
  const T* dy = e.out->grad;
  write_or_add<P>(grad_target_for(a), n, [&](T* dst) { multiply_rows(dy, b->value, dst, n, cols, kind); });
  if (kind == broadcast_kind::same) {
    write_or_add<P>(grad_target_for(b), n, [&](T* dst) { P::multiply(dy, a->value, dst, n); });
  } else if (auto db = grad_target_for(b); db.data) {
    scratch_buffer<T> products(n);
    P::multiply(dy, a->value, products.data(), n);
    P::sum_rows(products.data(), db.data, cols ? n / cols : 0, cols, db.accumulate);
  }
}

template <class T>
basic_variable<T> mul_op(const basic_variable<T>& a, const basic_variable<T>& b) {
  auto* an = node_of(a, "mul");
  auto* bn = node_of(b, "mul");
  broadcast_kind kind = check_broadcast(an, bn);
  if (kind == broadcast_kind::general) return binary(kernels::binary_op::mul, a, b, "mul");
  index_t n = an->shape.numel();
  bool record = should_record<T>({an, bn});
  auto y = make_output<T>(an->shape, record);
  multiply_rows(an->value, bn->value, y.data(), n, bn->shape.numel(), kind);
  if (record) tape<T>::instance().record(&mul_backward<T>, y.node(), an, bn, nullptr, T(0), static_cast<int>(kind));
  return y;
}

template <class T>
void scale_backward(const tape_entry<T>& e) {
  pass_gradient(e.in[0], e.out->grad, e.out->shape.numel(), e.scalar);
}

}  // namespace detail

// a + b, broadcast.
template <class T>
basic_variable<T> add(const basic_variable<T>& a, const basic_variable<T>& b) {
  if (a.defined() && b.defined() && a.dim() == 1 && b.dim() > 1) return detail::add_sub(b, a, false, "add");
  return detail::add_sub(a, b, false, "add");
}
// x + s for a scalar s.
template <class T>
basic_variable<T> add(const basic_variable<T>& x, std::type_identity_t<T> s) {
  return detail::binary(kernels::binary_op::add, x, detail::scalar_constant<T>(s), "add");
}
// a - b, broadcast.
template <class T>
basic_variable<T> sub(const basic_variable<T>& a, const basic_variable<T>& b) {
  return detail::add_sub(a, b, true, "sub");
}
// x - s for a scalar s.
template <class T>
basic_variable<T> sub(const basic_variable<T>& x, std::type_identity_t<T> s) {
  return detail::binary(kernels::binary_op::sub, x, detail::scalar_constant<T>(s), "sub");
}
// a * b element by element, broadcast.
template <class T>
basic_variable<T> mul(const basic_variable<T>& a, const basic_variable<T>& b) {
  if (a.defined() && b.defined() && a.dim() == 1 && b.dim() > 1) return detail::mul_op(b, a);
  return detail::mul_op(a, b);
}
// x * s for a scalar s.
template <class T>
basic_variable<T> mul(const basic_variable<T>& x, std::type_identity_t<T> s) {
  auto* xn = detail::node_of(x, "mul");
  bool record = detail::should_record<T>({xn});
  auto y = detail::make_output<T>(xn->shape, record);
  dynamic_policy::scale(xn->value, s, y.data(), xn->shape.numel());
  if (record) detail::tape<T>::instance().record(&detail::scale_backward<T>, y.node(), xn, nullptr, nullptr, s);
  return y;
}
// -x.
template <class T>
basic_variable<T> neg(const basic_variable<T>& x) {
  return mul(x, T(-1));
}

template <class T>
basic_variable<T> operator+(const basic_variable<T>& a, const basic_variable<T>& b) {
  return add(a, b);
}
template <class T>
basic_variable<T> operator-(const basic_variable<T>& a, const basic_variable<T>& b) {
  return sub(a, b);
}
template <class T>
basic_variable<T> operator*(const basic_variable<T>& a, const basic_variable<T>& b) {
  return mul(a, b);
}
template <class T>
basic_variable<T> operator*(const basic_variable<T>& x, std::type_identity_t<T> s) {
  return mul(x, s);
}
template <class T>
basic_variable<T> operator*(std::type_identity_t<T> s, const basic_variable<T>& x) {
  return mul(x, s);
}
template <class T>
basic_variable<T> operator-(const basic_variable<T>& x) {
  return neg(x);
}
template <class T>
basic_variable<T> operator+(const basic_variable<T>& x, std::type_identity_t<T> s) {
  return add(x, s);
}
template <class T>
basic_variable<T> operator+(std::type_identity_t<T> s, const basic_variable<T>& x) {
  return add(x, s);
}
template <class T>
basic_variable<T> operator-(const basic_variable<T>& x, std::type_identity_t<T> s) {
  return sub(x, s);
}
template <class T>
basic_variable<T> operator-(std::type_identity_t<T> s, const basic_variable<T>& x) {
  return sub(detail::scalar_constant<T>(s), x);
}

}  // namespace kiln::nn
