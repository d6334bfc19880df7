// reshape and flatten: a new shape over the same storage (no copy, as static mode's Flatten), with a backward that
// passes the gradient through unchanged.
#pragma once

#include <utility>

#include "kiln/dynamic/functional/common.hpp"

namespace kiln::nn {

namespace detail {

template <class T>
void pass_through_gradient(variable_node<T>* x, const T* dy, index_t n) {
  auto t = grad_target_for(x);
  if (!t.data) return;
  if (t.accumulate) dynamic_policy::accumulate(dy, t.data, n);
  else dynamic_policy::copy(dy, t.data, n);
}

template <class T>
void reshape_backward(const tape_entry<T>& e) {
  variable_node<T>* x = e.in[0];
  variable_node<T>* out = e.out;
  // An intermediate value that gets its first gradient here takes the output's gradient buffer instead of a copy of
  // it: the tape frees that gradient right after this entry, and the two hold the same elements in the same order
  // (a CNN's Flatten then copies no feature maps). Leaves keep gradients of their own.
  if (x->requires_grad && !x->grad && !x->is_leaf && out->grad && !out->grad_pending_zero) {
    x->grad_block = std::exchange(out->grad_block, storage_block{});
    x->grad = std::exchange(out->grad, nullptr);
    return;
  }
  pass_through_gradient(x, out->grad, out->shape.numel());
}

template <class T>
basic_variable<T> view_as(variable_node<T>* xn, const kiln::shape& s) {
  bool record = should_record<T>({xn});
  auto y = basic_variable<T>::adopt(make_node<T>(s, record, false, false));
  y.node()->value = xn->value;
  y.node()->storage_owner = xn;
  retain(xn);
  if (record) tape<T>::instance().record(&reshape_backward<T>, y.node(), xn);
  return y;
}

}  // namespace detail

// The same elements under another shape; one extent may be -1 and is then inferred.
template <class T>
basic_variable<T> reshape(const basic_variable<T>& x, const kiln::shape& new_shape) {
  auto* xn = detail::node_of(x, "reshape");
  kiln::shape s = new_shape;
  int inferred = -1;
  index_t known = 1;
  for (int d = 0; d < s.rank(); ++d) {
    if (s[d] == -1 && inferred < 0) inferred = d;
    else if (s[d] < 0) fail("reshape: invalid target shape ", new_shape, " for a tensor of shape ", xn->shape);
    else known *= s[d];
  }
  if (inferred >= 0) {
    if (known == 0 || xn->shape.numel() % known != 0)
      fail("reshape: cannot infer the -1 extent of ", new_shape, " for a tensor of shape ", xn->shape);
    s[inferred] = xn->shape.numel() / known;
  }
  if (s.numel() != xn->shape.numel())
    fail("reshape: cannot view a tensor of shape ", xn->shape, " as ", new_shape, " (", xn->shape.numel(), " vs ",
         s.numel(), " elements)");
  return detail::view_as(xn, s);
}

// Merges dimensions start_dim..end_dim into one (negative dims count from the end), as torch.flatten.
template <class T>
basic_variable<T> flatten(const basic_variable<T>& x, int start_dim = 1, int end_dim = -1) {
  auto* xn = detail::node_of(x, "flatten");
  const kiln::shape& in = xn->shape;
  if (in.rank() == 0) return detail::view_as(xn, kiln::shape{1});
  int first = in.normalize_dim(start_dim, "flatten (start_dim)");
  int last = in.normalize_dim(end_dim, "flatten (end_dim)");
  if (first > last) fail("flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " for shape ", in);
  kiln::shape s;
  index_t merged = 1;
  for (int d = 0; d < in.rank(); ++d) {
    if (d < first || d > last) s.push_back(in[d]);
    else {
      merged *= in[d];
      if (d == last) s.push_back(merged);
    }
  }
  return detail::view_as(xn, s);
}

}  // namespace kiln::nn
