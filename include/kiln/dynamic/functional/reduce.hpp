// Reductions. sum and mean of all elements, to a rank-0 value (Policy::sum, the reduction kernel static mode uses);
// and over any set of dimensions, with keepdim, as PyTorch's: sum, mean, amax, amin, var and std (with a correction),
// logsumexp, norm, and argmax/argmin (indices, without gradient).
//
// A reduction over the last dimensions reduces each row of the reduced elements with the row kernels of
// kernels/tensor_math.hpp; sum, mean, amax and amin over a block of dimensions with kept ones after it (dimension 0 of
// a matrix) reduce in place with reduce_middle; the others first move the reduced dimensions last (a strided copy).
// The backward of sum and mean repeats the gradient (a broadcasting copy); the others compute each row's gradient in
// the moved layout and move it back.
//   auto m = kiln::nn::mean(x, {1, 2}, true);   // [N, C, H, W] -> [N, 1, 1, W]
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/kernels/strided.hpp"
#include "kiln/dynamic/functional/pointwise.hpp"
#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/kernels/tensor_math.hpp"

namespace kiln::nn {

namespace detail {

template <class T>
void spread_backward(const tape_entry<T>& e) {  // scalar: the factor (1 for sum, 1 / n for mean)
  using P = dynamic_policy;
  auto t = grad_target_for(e.in[0]);
  index_t n = e.in[0]->shape.numel();
  const T g = tape<T>::instance().scalar_gradient(e.out) * e.scalar;
  write_or_add<P>(t, n, [&](T* dst) { P::fill(dst, g, n); });
}

template <class T>
basic_variable<T> reduce_all(const basic_variable<T>& x, bool mean, const char* op) {
  auto* xn = node_of(x, op);
  index_t n = xn->shape.numel();
  bool record = should_record<T>({xn});
  auto y = make_output<T>(kiln::shape{}, record);
  T total = dynamic_policy::sum(xn->value, n);
  write_value(y.data(), mean ? total / static_cast<T>(n) : total);
  if (record)
    tape<T>::instance().record(&spread_backward<T>, y.node(), xn, nullptr, nullptr,
                               mean ? T(1) / static_cast<T>(n) : T(1));
  return y;
}

}  // namespace detail

// The sum of every element (rank 0).
template <class T>
basic_variable<T> sum(const basic_variable<T>& x) {
  return detail::reduce_all(x, false, "sum");
}
// The mean of every element (rank 0).
template <class T>
basic_variable<T> mean(const basic_variable<T>& x) {
  return detail::reduce_all(x, true, "mean");
}

namespace detail {

// Which dimensions a reduction takes: a bit per dimension of x, and the shapes around it.
struct reduction_plan {
  unsigned mask = 0;        // bit d: dimension d is reduced
  kiln::shape kept;         // x's shape with the reduced extents at 1 (keepdim's result)
  kiln::shape out;          // the result's shape (kept, or without the reduced dimensions)
  kiln::shape moved;        // x's shape with the reduced dimensions last
  int order[kiln::shape::max_rank] = {};  // moved's dimensions as dimensions of x
  bool needs_move = false;  // some reduced dimension comes before a kept one
  index_t rows = 1, cols = 1;
  // The reduced dimensions are one block with kept ones after it: x is [outer, cols, inner] (reduce_middle's layout).
  bool middle = false;
  index_t outer = 1, inner = 1;
};

inline reduction_plan plan_reduction(const kiln::shape& x, const dims& d, bool keepdim, const char* op) {
  reduction_plan p;
  for (int dim : d) {
    const int n = x.normalize_dim(dim, op);
    if (p.mask & (1u << n)) fail(op, ": dim ", dim, " appears more than once in the dimensions to reduce");
    p.mask |= 1u << n;
  }
  int at = 0;
  for (int k = 0; k < x.rank(); ++k)
    if (!(p.mask & (1u << k))) p.order[at++] = k;
  for (int k = 0; k < x.rank(); ++k)
    if (p.mask & (1u << k)) p.order[at++] = k;
  for (int k = 0; k < x.rank(); ++k) {
    p.moved.push_back(x[p.order[k]]);
    if (p.order[k] != k) p.needs_move = true;
    const bool reduced = p.mask & (1u << k);
    p.kept.push_back(reduced ? 1 : x[k]);
    if (reduced) p.cols *= x[k];
    else p.rows *= x[k];
    if (!reduced || keepdim) p.out.push_back(reduced ? 1 : x[k]);
  }
  if (p.mask != 0) {
    int first = 0, last = x.rank() - 1;
    while (!(p.mask & (1u << first))) ++first;
    while (!(p.mask & (1u << last))) --last;
    const unsigned block = ((1u << (last + 1)) - 1) & ~((1u << first) - 1);
    p.middle = p.needs_move && block == p.mask;
    for (int k = 0; k < first; ++k) p.outer *= x[k];
    for (int k = last + 1; k < x.rank(); ++k) p.inner *= x[k];
  }
  return p;
}

// Whether reduce_middle computes this reduction (over a middle block of dimensions) without moving them last.
inline bool reduces_in_middle(kernels::row_reduction op, const reduction_plan& p) {
  return p.middle && (op == kernels::row_reduction::sum || op == kernels::row_reduction::mean ||
                      op == kernels::row_reduction::amax || op == kernels::row_reduction::amin);
}

// A walk that copies x (dst, operand 0) into the moved order, or (dst = x's layout) moves it back.
inline kernels::strided_walk<2> move_walk(const kiln::shape& x, const reduction_plan& p, bool back) {
  index_t own[kiln::shape::max_rank] = {}, moved_strides[kiln::shape::max_rank] = {};
  kernels::contiguous_strides(x, own);
  kernels::contiguous_strides(p.moved, moved_strides);
  kernels::strided_walk<2> w;
  w.rank = x.rank();
  for (int k = 0; k < x.rank(); ++k) {
    w.extent[k] = p.moved[k];
    w.stride[back ? 1 : 0][k] = moved_strides[k];
    w.stride[back ? 0 : 1][k] = own[p.order[k]];
  }
  return w.coalesce();
}

// x in the moved order: x itself, or a copy in `scratch`.
template <class T>
const T* moved_input(const variable_node<T>* x, const reduction_plan& p, std::optional<scratch_buffer<T>>& scratch) {
  if (!p.needs_move) return x->value;
  scratch.emplace(x->shape.numel());
  dynamic_policy::copy_strided(static_cast<const T*>(x->value), scratch->data(), move_walk(x->shape, p, false), false);
  return scratch->data();
}

// aux: the row reduction in its low byte and the mask above; scalar: norm's order or var's correction.
template <class T>
void reduce_dims_backward(const tape_entry<T>& e) {
  using P = dynamic_policy;
  auto t = grad_target_for(e.in[0]);
  if (!t.data) return;
  variable_node<T>* x = e.in[0];
  const auto op = static_cast<kernels::row_reduction>(e.aux & 0xff);
  reduction_plan p;
  {
    // Rebuild the plan from the mask (keepdim does not matter here: the output holds the same values either way).
    int list[kiln::shape::max_rank] = {}, n = 0;
    for (int k = 0; k < x->shape.rank(); ++k)
      if ((e.aux >> 8) & (1 << k)) list[n++] = k;
    p = plan_reduction(x->shape, dims(std::span<const int>(list, static_cast<std::size_t>(n))), true, "backward");
  }
  const index_t n = x->shape.numel();
  if (op == kernels::row_reduction::sum || op == kernels::row_reduction::mean) {
    // dx = dy (divided by the count, for mean) repeated along the reduced dimensions: a broadcasting copy.
    const T* dy = e.out->grad;
    std::optional<scratch_buffer<T>> scaled;
    if (op == kernels::row_reduction::mean) {
      scaled.emplace(p.rows);
      P::scale(dy, T(1) / static_cast<T>(p.cols), scaled->data(), p.rows);
      dy = scaled->data();
    }
    kernels::strided_walk<2> w;
    w.rank = x->shape.rank();
    for (int k = 0; k < w.rank; ++k) w.extent[k] = x->shape[k];
    kernels::contiguous_strides(x->shape, w.stride[0]);
    kernels::broadcast_strides(p.kept, x->shape, w.stride[1]);
    P::copy_strided(dy, t.data, w.coalesce(), t.accumulate);
    return;
  }
  std::optional<scratch_buffer<T>> moved;
  const T* xm = moved_input(x, p, moved);
  auto rows_backward = [&](T* dst) {
    P::reduce_rows_backward(op, xm, static_cast<const T*>(e.out->value), static_cast<const T*>(e.out->grad), dst,
                            p.rows, p.cols, e.scalar, e.scalar);
  };
  if (!p.needs_move) {
    write_or_add<P>(t, n, rows_backward);
    return;
  }
  scratch_buffer<T> g(n);
  rows_backward(g.data());
  P::copy_strided(static_cast<const T*>(g.data()), t.data, move_walk(x->shape, p, true), t.accumulate);
}

template <class T>
basic_variable<T> reduce_dims(const basic_variable<T>& x, const dims& d, bool keepdim, kernels::row_reduction op,
                              const char* name, T parameter = T(0)) {
  auto* xn = node_of(x, name);
  if (d.size() == 0) fail(name, ": expected at least one dimension to reduce (for all of them, call ", name, "(x))");
  const reduction_plan p = plan_reduction(xn->shape, d, keepdim, name);
  if ((op == kernels::row_reduction::amax || op == kernels::row_reduction::amin) && p.cols == 0 && p.rows > 0)
    fail(name, ": cannot reduce over an empty dimension of shape ", xn->shape, " (the result has no value)");
  const bool record = should_record<T>({xn});
  auto y = make_output<T>(p.out, record);
  if (reduces_in_middle(op, p)) {
    dynamic_policy::reduce_middle(op, static_cast<const T*>(xn->value), y.data(), p.outer, p.cols, p.inner);
  } else {
    std::optional<scratch_buffer<T>> moved;
    dynamic_policy::reduce_rows(op, moved_input(xn, p, moved), y.data(), p.rows, p.cols, parameter, parameter);
  }
  if (record)
    tape<T>::instance().record(&reduce_dims_backward<T>, y.node(), xn, nullptr, nullptr, parameter,
                               static_cast<int>(op) | static_cast<int>(p.mask << 8));
  return y;
}

template <class T>
kiln::Tensor<std::int64_t> arg_reduce(const basic_variable<T>& x, std::optional<int> dim, bool keepdim, bool largest,
                                      const char* name) {
  auto* xn = node_of(x, name);
  reduction_plan p;
  if (dim) {
    p = plan_reduction(xn->shape, *dim, keepdim, name);
  } else {  // over every element, as PyTorch's argmax(x): a rank-0 index into the flattened tensor
    p.cols = xn->shape.numel();
  }
  if (p.cols == 0) fail(name, ": cannot take the ", name, " of an empty dimension of shape ", xn->shape);
  std::optional<scratch_buffer<T>> moved;
  const T* xm = dim ? moved_input(xn, p, moved) : xn->value;
  kiln::Tensor<std::int64_t> out(dim ? p.out : kiln::shape{});
  scratch_buffer<std::int64_t> result(p.rows);
  dynamic_policy::arg_reduce_rows(xm, result.data(), p.rows, p.cols, largest);
  copy_values_to_host(static_cast<const std::int64_t*>(result.data()), out.data(), p.rows);
  return out;
}

}  // namespace detail

// The sum over dimensions d (keepdim: they stay, with extent 1).
template <class T>
basic_variable<T> sum(const basic_variable<T>& x, const dims& d, bool keepdim = false) {
  return detail::reduce_dims(x, d, keepdim, kernels::row_reduction::sum, "sum");
}
// The mean over dimensions d.
template <class T>
basic_variable<T> mean(const basic_variable<T>& x, const dims& d, bool keepdim = false) {
  return detail::reduce_dims(x, d, keepdim, kernels::row_reduction::mean, "mean");
}
// The largest element over dimensions d; the gradient is shared evenly between equal largest elements.
template <class T>
basic_variable<T> amax(const basic_variable<T>& x, const dims& d, bool keepdim = false) {
  return detail::reduce_dims(x, d, keepdim, kernels::row_reduction::amax, "amax");
}
// The smallest element over dimensions d.
template <class T>
basic_variable<T> amin(const basic_variable<T>& x, const dims& d, bool keepdim = false) {
  return detail::reduce_dims(x, d, keepdim, kernels::row_reduction::amin, "amin");
}
// The variance over dimensions d, dividing by N - correction (1: the unbiased estimate, PyTorch's default).
template <class T>
basic_variable<T> var(const basic_variable<T>& x, const dims& d, double correction = 1, bool keepdim = false) {
  return detail::reduce_dims(x, d, keepdim, kernels::row_reduction::var, "var", static_cast<T>(correction));
}
// The standard deviation over dimensions d: sqrt(var(x, d, correction)).
template <class T>
basic_variable<T> std(const basic_variable<T>& x, const dims& d, double correction = 1, bool keepdim = false) {
  return detail::unary(var(x, d, correction, keepdim), kernels::unary_op::sqrt, "std");
}
// log(sum(exp(x))) over dimensions d, computed stably.
template <class T>
basic_variable<T> logsumexp(const basic_variable<T>& x, const dims& d, bool keepdim = false) {
  return detail::reduce_dims(x, d, keepdim, kernels::row_reduction::logsumexp, "logsumexp");
}
// The p-norm over dimensions d, or of every element (torch.linalg.vector_norm's ord; p may be INFINITY).
template <class T>
basic_variable<T> norm(const basic_variable<T>& x, double p = 2, std::optional<dims> d = std::nullopt,
                       bool keepdim = false) {
  if (!d) {
    auto* xn = detail::node_of(x, "norm");
    int all[kiln::shape::max_rank] = {};
    for (int k = 0; k < xn->shape.rank(); ++k) all[k] = k;
    if (xn->shape.rank() == 0) return detail::reduce_dims(reshape(x, kiln::shape{1}), 0, false,
                                                          kernels::row_reduction::norm, "norm", static_cast<T>(p));
    d = dims(std::span<const int>(all, static_cast<std::size_t>(xn->shape.rank())));
  }
  return detail::reduce_dims(x, *d, keepdim, kernels::row_reduction::norm, "norm", static_cast<T>(p));
}
// The index of the first largest element along dim (no gradient); without dim, into the flattened tensor.
template <class T>
kiln::Tensor<std::int64_t> argmax(const basic_variable<T>& x, std::optional<int> dim = std::nullopt,
                                  bool keepdim = false) {
  return detail::arg_reduce(x, dim, keepdim, true, "argmax");
}
// The index of the first smallest element along dim.
template <class T>
kiln::Tensor<std::int64_t> argmin(const basic_variable<T>& x, std::optional<int> dim = std::nullopt,
                                  bool keepdim = false) {
  return detail::arg_reduce(x, dim, keepdim, false, "argmin");
}

}  // namespace kiln::nn
