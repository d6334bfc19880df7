// Shape ops with PyTorch's names. reshape, view, flatten, unflatten, squeeze and unsqueeze give a new shape over the
// same storage (no copy, as static mode's Flatten), with a backward that passes the gradient through unchanged.
// permute, transpose, expand, slice, narrow, cat, stack, split and chunk copy into a new contiguous value (a strided
// copy, kernels/strided.hpp) where PyTorch would return a strided view: every kiln value is contiguous, so contiguous()
// returns its argument. Their backward is the strided copy the other way (adding where expand repeated an element).
//   auto heads = kiln::nn::transpose(kiln::nn::view(x, {batch, length, heads, width}), 1, 2);
//   auto parts = kiln::nn::chunk(qkv, 3, -1);
#pragma once

#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "kiln/dynamic/functional/broadcast.hpp"
#include "kiln/dynamic/functional/common.hpp"
#include "kiln/kernels/strided.hpp"

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

// The same elements under another shape, as Tensor.view (kiln's values are contiguous, so view and reshape agree).
template <class T>
basic_variable<T> view(const basic_variable<T>& x, const kiln::shape& new_shape) {
  return reshape(x, new_shape);
}

// Splits dimension dim into the extents `sizes` (one may be -1), as torch.unflatten.
template <class T>
basic_variable<T> unflatten(const basic_variable<T>& x, int dim, const kiln::shape& sizes) {
  auto* xn = detail::node_of(x, "unflatten");
  const kiln::shape& in = xn->shape;
  const int d = in.normalize_dim(dim, "unflatten");
  kiln::shape s;
  for (int k = 0; k < d; ++k) s.push_back(in[k]);
  for (index_t e : sizes) s.push_back(e);
  for (int k = d + 1; k < in.rank(); ++k) s.push_back(in[k]);
  index_t known = 1;
  int inferred = -1;
  for (int k = 0; k < sizes.rank(); ++k) {
    if (sizes[k] == -1 && inferred < 0) inferred = k;
    else known *= sizes[k];
  }
  if (inferred >= 0 && known != 0) s[d + inferred] = in[d] / known;
  if ((inferred >= 0 && (known == 0 || in[d] % known != 0)) || (inferred < 0 && known != in[d]))
    fail("unflatten: cannot split dimension ", dim, " of extent ", in[d], " (shape ", in, ") into ", sizes);
  return detail::view_as(xn, s);
}

// Removes every dimension of extent 1.
template <class T>
basic_variable<T> squeeze(const basic_variable<T>& x) {
  auto* xn = detail::node_of(x, "squeeze");
  kiln::shape s;
  for (index_t e : xn->shape)
    if (e != 1) s.push_back(e);
  return detail::view_as(xn, s);
}
// Removes dimension dim if its extent is 1 (otherwise the shape stays), as torch.squeeze(x, dim).
template <class T>
basic_variable<T> squeeze(const basic_variable<T>& x, int dim) {
  auto* xn = detail::node_of(x, "squeeze");
  if (xn->shape.rank() == 0) return detail::view_as(xn, xn->shape);
  const int d = xn->shape.normalize_dim(dim, "squeeze");
  kiln::shape s;
  for (int k = 0; k < xn->shape.rank(); ++k)
    if (k != d || xn->shape[k] != 1) s.push_back(xn->shape[k]);
  return detail::view_as(xn, s);
}
// Inserts a dimension of extent 1 at dim (-1: last), as torch.unsqueeze.
template <class T>
basic_variable<T> unsqueeze(const basic_variable<T>& x, int dim) {
  auto* xn = detail::node_of(x, "unsqueeze");
  const int rank = xn->shape.rank();
  const int d = dim < 0 ? dim + rank + 1 : dim;
  if (d < 0 || d > rank) fail("unsqueeze: dim ", dim, " is out of range for a tensor of shape ", xn->shape);
  kiln::shape s;
  for (int k = 0; k < rank; ++k) {
    if (k == d) s.push_back(1);
    s.push_back(xn->shape[k]);
  }
  if (d == rank) s.push_back(1);
  return detail::view_as(xn, s);
}
// x itself: kiln's values are always contiguous.
template <class T>
basic_variable<T> contiguous(const basic_variable<T>& x) {
  detail::node_of(x, "contiguous");
  return x;
}

namespace detail {

// aux of a permute: dimension k of the output is dimension (aux >> 3k) & 7 of the input.
template <class T>
void permute_backward(const tape_entry<T>& e) {
  auto t = grad_target_for(e.in[0]);
  if (!t.data) return;
  const kiln::shape& out = e.out->shape;
  index_t in_strides[kiln::shape::max_rank] = {}, out_strides[kiln::shape::max_rank] = {};
  kernels::contiguous_strides(e.in[0]->shape, in_strides);
  kernels::contiguous_strides(out, out_strides);
  kernels::strided_walk<2> w;
  w.rank = out.rank();
  for (int k = 0; k < out.rank(); ++k) {
    w.extent[k] = out[k];
    w.stride[0][k] = in_strides[(e.aux >> (3 * k)) & 7];
    w.stride[1][k] = out_strides[k];
  }
  dynamic_policy::copy_strided(static_cast<const T*>(e.out->grad), t.data, w.coalesce(), t.accumulate);
}

template <class T>
void expand_backward(const tape_entry<T>& e) {
  reduce_to_operand(static_cast<const T*>(e.out->grad), e.out->shape, e.in[0]->shape, grad_target_for(e.in[0]));
}

// A slice's start and step along its dimension (aux).
template <class T>
struct slice_state : saved_state<T> {
  index_t start = 0, step = 1;
};

// The walk between a slice (operand `slice_side`, contiguous) and x (the other, strided), and x's offset.
inline kernels::strided_walk<2> slice_walk(const kiln::shape& x, const kiln::shape& out, int dim, index_t start,
                                           index_t step, int slice_side, index_t& offset) {
  index_t x_strides[kiln::shape::max_rank] = {};
  kernels::contiguous_strides(x, x_strides);
  kernels::strided_walk<2> w;
  w.rank = out.rank();
  kernels::contiguous_strides(out, w.stride[slice_side]);
  for (int k = 0; k < out.rank(); ++k) {
    w.extent[k] = out[k];
    w.stride[1 - slice_side][k] = k == dim ? x_strides[k] * step : x_strides[k];
  }
  offset = start * x_strides[dim];
  return w.coalesce();
}

template <class T>
void slice_backward(const tape_entry<T>& e) {
  auto t = grad_target_for(e.in[0]);
  if (!t.data) return;
  const auto& state = static_cast<const slice_state<T>&>(*e.saved);
  index_t offset = 0;
  auto w = slice_walk(e.in[0]->shape, e.out->shape, e.aux, state.start, state.step, 1, offset);
  if (!t.accumulate) zero_values(t.data, e.in[0]->shape.numel());
  dynamic_policy::copy_strided(static_cast<const T*>(e.out->grad), t.data + offset, w, true);
}

// A cat's inputs are all in its saved state (there may be more than an entry holds); aux is the dimension.
template <class T>
void cat_backward(const tape_entry<T>& e) {
  const kiln::shape& out = e.out->shape;
  index_t out_strides[kiln::shape::max_rank] = {};
  kernels::contiguous_strides(out, out_strides);
  index_t at = 0;
  for (variable_node<T>* in : e.saved->inputs) {
    if (in->shape.rank() != out.rank()) continue;  // a legacy empty [0] input, skipped
    const index_t extent = in->shape[e.aux];
    if (auto t = grad_target_for(in); t.data) {
      kernels::strided_walk<2> w;
      w.rank = out.rank();
      kernels::contiguous_strides(in->shape, w.stride[0]);
      for (int k = 0; k < out.rank(); ++k) {
        w.extent[k] = in->shape[k];
        w.stride[1][k] = out_strides[k];
      }
      dynamic_policy::copy_strided(static_cast<const T*>(e.out->grad) + at * out_strides[e.aux], t.data, w.coalesce(),
                                   t.accumulate);
    }
    at += extent;
  }
}

}  // namespace detail

// The dimensions of x in the order dims (a permutation of 0..rank-1), as torch.permute.
template <class T>
basic_variable<T> permute(const basic_variable<T>& x, const dims& order) {
  auto* xn = detail::node_of(x, "permute");
  const kiln::shape& in = xn->shape;
  if (order.size() != in.rank())
    fail("permute: expected ", in.rank(), " dimensions for a tensor of shape ", in, ", found ", order.size());
  int perm[kiln::shape::max_rank] = {};
  unsigned seen = 0;
  int code = 0;
  kiln::shape out;
  for (int k = 0; k < in.rank(); ++k) {
    perm[k] = in.normalize_dim(order[k], "permute");
    if (seen & (1u << perm[k])) fail("permute: dim ", order[k], " appears twice in the permutation");
    seen |= 1u << perm[k];
    code |= perm[k] << (3 * k);
    out.push_back(in[perm[k]]);
  }
  const bool record = detail::should_record<T>({xn});
  auto y = detail::make_output<T>(out, record);
  index_t in_strides[kiln::shape::max_rank] = {};
  kernels::contiguous_strides(in, in_strides);
  kernels::strided_walk<2> w;
  w.rank = in.rank();
  kernels::contiguous_strides(out, w.stride[0]);
  for (int k = 0; k < in.rank(); ++k) {
    w.extent[k] = out[k];
    w.stride[1][k] = in_strides[perm[k]];
  }
  dynamic_policy::copy_strided(static_cast<const T*>(xn->value), y.data(), w.coalesce(), false);
  if (record)
    detail::tape<T>::instance().record(&detail::permute_backward<T>, y.node(), xn, nullptr, nullptr, T(0), code);
  return y;
}
// x with dimensions d0 and d1 swapped, as torch.transpose.
template <class T>
basic_variable<T> transpose(const basic_variable<T>& x, int d0, int d1) {
  auto* xn = detail::node_of(x, "transpose");
  const int a = xn->shape.normalize_dim(d0, "transpose"), b = xn->shape.normalize_dim(d1, "transpose");
  int order[kiln::shape::max_rank] = {};
  for (int k = 0; k < xn->shape.rank(); ++k) order[k] = k == a ? b : (k == b ? a : k);
  return permute(x, dims(std::span<const int>(order, static_cast<std::size_t>(xn->shape.rank()))));
}

// x repeated along its dimensions of extent 1 (and new leading ones) to `size`, as Tensor.expand; -1 keeps an extent.
template <class T>
basic_variable<T> expand(const basic_variable<T>& x, const kiln::shape& size) {
  auto* xn = detail::node_of(x, "expand");
  const kiln::shape& in = xn->shape;
  if (size.rank() < in.rank())
    fail("expand: the target ", size, " has fewer dimensions than the tensor's shape ", in);
  kiln::shape out = size;
  const int shift = size.rank() - in.rank();
  for (int d = 0; d < size.rank(); ++d) {
    const int id = d - shift;
    if (size[d] == -1) {
      if (id < 0) fail("expand: -1 is not allowed for a new leading dimension (target ", size, ")");
      out[d] = in[id];
    } else if (id >= 0 && in[id] != 1 && in[id] != size[d]) {
      fail("expand: cannot expand shape ", in, " to ", size, ": dimension ", d, " has extent ", in[id],
           ", which must be 1 or ", size[d]);
    }
  }
  const bool record = detail::should_record<T>({xn});
  auto y = detail::make_output<T>(out, record);
  kernels::strided_walk<2> w;
  w.rank = out.rank();
  for (int d = 0; d < out.rank(); ++d) w.extent[d] = out[d];
  kernels::contiguous_strides(out, w.stride[0]);
  kernels::broadcast_strides(in, out, w.stride[1]);
  dynamic_policy::copy_strided(static_cast<const T*>(xn->value), y.data(), w.coalesce(), false);
  if (record) detail::tape<T>::instance().record(&detail::expand_backward<T>, y.node(), xn);
  return y;
}

// x[start:end:step] along dim, with Python's rules: negative start and end count from the end, both are clamped to
// the extent, and an end before the start gives an empty slice. step must be positive.
template <class T>
basic_variable<T> slice(const basic_variable<T>& x, int dim, index_t start, index_t end, index_t step = 1) {
  auto* xn = detail::node_of(x, "slice");
  const int d = xn->shape.normalize_dim(dim, "slice");
  if (step <= 0) fail("slice: expected a positive step, found ", step);
  const index_t n = xn->shape[d];
  auto clamp_index = [n](index_t i) { return i < 0 ? (i + n < 0 ? 0 : i + n) : (i > n ? n : i); };
  start = clamp_index(start);
  end = clamp_index(end);
  const index_t count = end > start ? (end - start + step - 1) / step : 0;
  kiln::shape out = xn->shape;
  out[d] = count;
  const bool record = detail::should_record<T>({xn});
  auto y = detail::make_output<T>(out, record);
  index_t offset = 0;
  auto w = detail::slice_walk(xn->shape, out, d, start, step, 0, offset);
  dynamic_policy::copy_strided(static_cast<const T*>(xn->value) + offset, y.data(), w, false);
  if (record) {
    auto state = std::make_unique<detail::slice_state<T>>();
    state->start = start;
    state->step = step;
    detail::tape<T>::instance().record(&detail::slice_backward<T>, y.node(), std::move(state), xn, nullptr, T(0), d);
  }
  return y;
}
// length elements of dim from start (negative: from the end), as torch.narrow.
template <class T>
basic_variable<T> narrow(const basic_variable<T>& x, int dim, index_t start, index_t length) {
  auto* xn = detail::node_of(x, "narrow");
  const int d = xn->shape.normalize_dim(dim, "narrow");
  const index_t n = xn->shape[d];
  if (start < 0) start += n;
  if (start < 0 || length < 0 || start + length > n)
    fail("narrow: elements [", start, ", ", start + length, ") are outside dimension ", dim, " of shape ", xn->shape);
  return slice(x, d, start, start + length, 1);
}

// The tensors joined along dim; all have the same shape but along dim (a 1-D empty tensor is skipped, as PyTorch
// allows), as torch.cat.
template <class T>
basic_variable<T> cat(const std::vector<basic_variable<T>>& tensors, int dim = 0) {
  if (tensors.empty()) fail("cat: expected a non-empty list of tensors");
  const basic_variable<T>* first = nullptr;
  for (const auto& t : tensors) {
    detail::node_of(t, "cat");
    if (!first && !(t.dim() == 1 && t.numel() == 0)) first = &t;
  }
  if (!first) first = &tensors[0];
  const kiln::shape& ref = first->shape();
  const int d = ref.normalize_dim(dim, "cat");
  kiln::shape out = ref;
  out[d] = 0;
  bool record = false;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const kiln::shape& s = tensors[i].shape();
    if (s.rank() == 1 && s[0] == 0 && ref.rank() != 1) continue;
    bool fits = s.rank() == ref.rank();
    for (int k = 0; fits && k < s.rank(); ++k) fits = k == d || s[k] == ref[k];
    if (!fits)
      fail("cat: tensor ", i, " has shape ", s, ", which does not match ", ref, " outside dimension ", dim);
    out[d] += s[d];
    record = record || tensors[i].requires_grad();
  }
  record = record && is_grad_enabled();
  auto y = detail::make_output<T>(out, record);
  index_t out_strides[kiln::shape::max_rank] = {};
  kernels::contiguous_strides(out, out_strides);
  index_t at = 0;
  for (const auto& t : tensors) {
    const kiln::shape& s = t.shape();
    if (s.rank() != out.rank()) continue;
    kernels::strided_walk<2> w;
    w.rank = out.rank();
    for (int k = 0; k < out.rank(); ++k) {
      w.extent[k] = s[k];
      w.stride[0][k] = out_strides[k];
    }
    kernels::contiguous_strides(s, w.stride[1]);
    dynamic_policy::copy_strided(static_cast<const T*>(t.data()), y.data() + at * out_strides[d], w.coalesce(), false);
    at += s[d];
  }
  if (record) {
    auto state = std::make_unique<detail::saved_state<T>>();
    for (const auto& t : tensors) state->keep_input(t.node());
    detail::tape<T>::instance().record(&detail::cat_backward<T>, y.node(), std::move(state), nullptr, nullptr, T(0), d);
  }
  return y;
}
template <class T>
basic_variable<T> cat(std::initializer_list<basic_variable<T>> tensors, int dim = 0) {
  return cat(std::vector<basic_variable<T>>(tensors), dim);
}
// The tensors (all of one shape) joined along a new dimension dim, as torch.stack.
template <class T>
basic_variable<T> stack(const std::vector<basic_variable<T>>& tensors, int dim = 0) {
  if (tensors.empty()) fail("stack: expected a non-empty list of tensors");
  std::vector<basic_variable<T>> parts;
  parts.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    detail::node_of(tensors[i], "stack");
    if (!(tensors[i].shape() == tensors[0].shape()))
      fail("stack: tensor ", i, " has shape ", tensors[i].shape(), ", expected ", tensors[0].shape(),
           " as tensor 0 has");
    parts.push_back(unsqueeze(tensors[i], dim));
  }
  return cat(parts, dim);
}
template <class T>
basic_variable<T> stack(std::initializer_list<basic_variable<T>> tensors, int dim = 0) {
  return stack(std::vector<basic_variable<T>>(tensors), dim);
}
// Consecutive pieces of split_size elements along dim (the last may be smaller), as torch.split.
template <class T>
std::vector<basic_variable<T>> split(const basic_variable<T>& x, index_t split_size, int dim = 0) {
  auto* xn = detail::node_of(x, "split");
  const int d = xn->shape.normalize_dim(dim, "split");
  if (split_size <= 0 && xn->shape[d] > 0) fail("split: expected a positive split_size, found ", split_size);
  std::vector<basic_variable<T>> parts;
  for (index_t at = 0; at < xn->shape[d] || (at == 0 && xn->shape[d] == 0); at += split_size) {
    const index_t n = xn->shape[d] - at < split_size ? xn->shape[d] - at : split_size;
    parts.push_back(narrow(x, d, at, n));
    if (xn->shape[d] == 0) break;
  }
  return parts;
}
// Pieces of the given extents along dim, which must add up to its extent, as torch.split with a list.
template <class T>
std::vector<basic_variable<T>> split(const basic_variable<T>& x, const std::vector<index_t>& sizes, int dim = 0) {
  auto* xn = detail::node_of(x, "split");
  const int d = xn->shape.normalize_dim(dim, "split");
  index_t total = 0;
  for (index_t s : sizes) total += s;
  if (total != xn->shape[d])
    fail("split: the sizes add up to ", total, ", expected the extent ", xn->shape[d], " of dimension ", dim,
         " of shape ", xn->shape);
  std::vector<basic_variable<T>> parts;
  index_t at = 0;
  for (index_t s : sizes) {
    parts.push_back(narrow(x, d, at, s));
    at += s;
  }
  return parts;
}
// chunks pieces of equal extent along dim (the last smaller when it does not divide; fewer pieces when the extent is
// smaller), as torch.chunk.
template <class T>
std::vector<basic_variable<T>> chunk(const basic_variable<T>& x, index_t chunks, int dim = 0) {
  auto* xn = detail::node_of(x, "chunk");
  if (chunks <= 0) fail("chunk: expected a positive number of chunks, found ", chunks);
  const index_t n = xn->shape[xn->shape.normalize_dim(dim, "chunk")];
  return split(x, n == 0 ? 1 : (n + chunks - 1) / chunks, dim);
}

}  // namespace kiln::nn
