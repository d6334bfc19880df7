// linear, PyTorch's F.linear (matmul is in matmul.hpp). It calls the Dense layer's dense_forward / dense_backward,
// the very functions static mode's kiln::Dense calls, so both modes compute the same numbers.
#pragma once

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/layers/dense.hpp"

namespace kiln::nn {

namespace detail {

template <class T>
void linear_backward(const tape_entry<T>& e) {
  using P = dynamic_policy;
  variable_node<T>*x = e.in[0], *w = e.in[1], *b = e.in[2];
  const T* dy = e.out->grad;
  index_t out = w->shape[0], in = w->shape[1], batch = leading_size(x->shape);
  // dW and db are written where they are fresh (zero_grad left them pending: static mode's overwrite) and added to
  // .grad otherwise; dense_backward takes one flag for both, so a fresh one beside an accumulating one is zeroed.
  const grad_target<T> dweight = grad_target_for(w), dbias = b ? grad_target_for(b) : grad_target<T>{};
  const bool accumulate = dweight.accumulate || dbias.accumulate;
  if (accumulate && dweight.data && !dweight.accumulate) zero_values(dweight.data, w->shape.numel());
  if (accumulate && dbias.data && !dbias.accumulate) zero_values(dbias.data, b->shape.numel());
  grad_target<T> dx = grad_target_for(x);
  if (dweight.data) {
    if (dx.data && dx.accumulate) {
      scratch_buffer<T> scratch(x->shape.numel());
      dense_backward<P>(x->value, w->value, dy, scratch.data(), dweight.data, dbias.data, batch, in, out, accumulate);
      P::accumulate(scratch.data(), dx.data, x->shape.numel());
    } else {
      dense_backward<P>(x->value, w->value, dy, dx.data, dweight.data, dbias.data, batch, in, out, accumulate);
    }
  } else {
    // A frozen weight: dense_backward always forms dW, so make its two other kernel calls, with its arguments.
    if (dbias.data) P::sum_rows(dy, dbias.data, batch, out, dbias.accumulate);
    write_or_add<P>(dx, x->shape.numel(), [&](T* dst) {
      P::gemm(false, false, batch, in, out, T(1), dy, out, w->value, in, T(0), dst, in);
    });
  }
}

}  // namespace detail

// y = x W^T + b over the last dimension of x: x is [*, in], weight [out, in], bias [out] (or an empty handle).
template <class T>
basic_variable<T> linear(const basic_variable<T>& x, const basic_variable<T>& weight,
                         const basic_variable<T>& bias = {}) {
  auto* xn = detail::node_of(x, "linear");
  auto* wn = detail::node_of(weight, "linear");
  auto* bn = bias.defined() ? bias.node() : nullptr;
  if (wn->shape.rank() != 2) fail("linear: expected a weight of shape [out, in], found ", wn->shape);
  index_t out = wn->shape[0], in = wn->shape[1];
  const kiln::shape& xs = xn->shape;
  if (xs.rank() < 1 || xs[xs.rank() - 1] != in)
    fail("linear: expected input of shape [*, ", in, "], found ", xs);
  if (bn && !(bn->shape.rank() == 1 && bn->shape[0] == out))
    fail("linear: expected a bias of shape [", out, "], found ", bn->shape);
  kiln::shape ys = xs;
  ys[xs.rank() - 1] = out;
  index_t batch = detail::leading_size(xs);
  bool record = detail::should_record<T>({xn, wn, bn});
  auto y = detail::make_output<T>(ys, record);
  dense_forward<dynamic_policy>(xn->value, wn->value, bn ? bn->value : static_cast<const T*>(nullptr), y.data(), batch,
                                in, out);
  if (record) detail::tape<T>::instance().record(&detail::linear_backward<T>, y.node(), xn, wn, bn);
  return y;
}

}  // namespace kiln::nn
