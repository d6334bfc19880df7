// Indexing ops with PyTorch's names: index_select, gather, scatter_add, embedding and one_hot. Indices are int64
// arrays in host memory (kiln::Tensor<std::int64_t>, or a view of one), checked against the extent they index before
// anything is read; on a GPU policy they are copied to the device with the op.
//   auto rows = kiln::nn::embedding(token_ids, table);        // [B, L] ids -> [B, L, D]
//   auto picked = kiln::nn::gather(log_probs, 1, targets);     // [N, C] with [N, 1] -> [N, 1]
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/kernels/strided.hpp"

namespace kiln::nn {

namespace detail {

// An op's index array where its kernels read it (the caller's on the host policy, a copy on a GPU), kept for the
// backward.
template <class T>
struct index_state : saved_state<T> {
  index_state(tensor_view<const std::int64_t> index) : shape(index.shape()), count(index.numel()), host(index.data()) {
    if constexpr (!dynamic_policy::host_accessible) {
      copy.emplace(count);
      copy_values_from_host(index.data(), copy->data(), count);
    } else {
      owned.assign(index.data(), index.data() + count);  // the backward may run after the caller's array is gone
    }
  }
  const std::int64_t* data() const {
    if constexpr (!dynamic_policy::host_accessible) return copy->data();
    return owned.data();
  }
  kiln::shape shape;
  index_t count;
  const std::int64_t* host;  // the caller's, valid during the forward only
  std::vector<std::int64_t> owned;
  std::optional<scratch_buffer<std::int64_t>> copy;
  std::int64_t skip = -1;  // embedding's padding_idx
};

inline void check_indices(tensor_view<const std::int64_t> index, index_t extent, const char* op, const char* what) {
  for (index_t i = 0; i < index.numel(); ++i) {
    const std::int64_t v = index.data()[i];
    if (v < 0 || v >= extent)
      fail(op, ": index ", v, " at position ", i, " of the ", what, " of shape ", index.shape(),
           " is out of range for an extent of ", extent);
  }
}

// [outer, n, inner] around dimension d.
inline void split_around(const kiln::shape& s, int d, index_t& outer, index_t& n, index_t& inner) {
  outer = inner = 1;
  for (int k = 0; k < d; ++k) outer *= s[k];
  n = s[d];
  for (int k = d + 1; k < s.rank(); ++k) inner *= s[k];
}

// aux: the dimension.
template <class T>
void index_select_backward(const tape_entry<T>& e) {
  auto t = grad_target_for(e.in[0]);
  if (!t.data) return;
  const auto& state = static_cast<const index_state<T>&>(*e.saved);
  index_t outer, n, inner;
  split_around(e.in[0]->shape, e.aux, outer, n, inner);
  if (!t.accumulate) zero_values(t.data, e.in[0]->shape.numel());
  dynamic_policy::index_add(static_cast<const T*>(e.out->grad), state.data(), t.data, outer, n, inner, state.count,
                            state.skip);
}

template <class T>
basic_variable<T> index_select_op(variable_node<T>* xn, int d, std::unique_ptr<index_state<T>> state,
                                  const kiln::shape& out) {
  index_t outer, n, inner;
  split_around(xn->shape, d, outer, n, inner);
  const bool record = should_record<T>({xn});
  auto y = make_output<T>(out, record);
  dynamic_policy::index_select(static_cast<const T*>(xn->value), state->data(), y.data(), outer, n, inner,
                               state->count);
  if (record) tape<T>::instance().record(&index_select_backward<T>, y.node(), std::move(state), xn, nullptr, T(0), d);
  return y;
}

// The walk of gather and scatter_add over the index's shape: operand 0 the index (contiguous), operand 1 the tensor
// that the index addresses along dimension d (its stride there 0: the kernel adds index * its stride), then the
// tensors read or written at the index's own positions.
template <int K>
kernels::strided_walk<K> index_walk(const kiln::shape& index, int d, std::initializer_list<kiln::shape> tensors) {
  kernels::strided_walk<K> w;
  w.rank = index.rank();
  for (int k = 0; k < index.rank(); ++k) w.extent[k] = index[k];
  kernels::contiguous_strides(index, w.stride[0]);
  int at = 1;
  for (const auto& s : tensors) {
    kernels::contiguous_strides(s, w.stride[at]);
    if (at == 1) w.stride[at][d] = 0;
    ++at;
  }
  return w.coalesce();
}
inline index_t stride_of(const kiln::shape& s, int d) {
  index_t stride = 1;
  for (int k = d + 1; k < s.rank(); ++k) stride *= s[k];
  return stride;
}

// The index's shape must fit inside the tensor's outside dimension d, as PyTorch requires.
inline void check_index_shape(const kiln::shape& index, const kiln::shape& x, int d, const char* op, const char* what) {
  bool fits = index.rank() == x.rank();
  for (int k = 0; fits && k < x.rank(); ++k) fits = k == d || index[k] <= x[k];
  if (!fits)
    fail(op, ": expected an index with the rank of ", what, " ", x, " and no larger outside dimension ", d,
         ", found ", index);
}

template <class T>
void gather_backward(const tape_entry<T>& e) {  // aux: the dimension
  auto t = grad_target_for(e.in[0]);
  if (!t.data) return;
  const auto& state = static_cast<const index_state<T>&>(*e.saved);
  const kiln::shape& xs = e.in[0]->shape;
  if (!t.accumulate) zero_values(t.data, xs.numel());
  dynamic_policy::scatter_add(static_cast<const T*>(e.out->grad), state.data(), t.data,
                              index_walk<3>(state.shape, e.aux, {xs, state.shape}), stride_of(xs, e.aux));
}

// in[0] is x, in[1] is src; aux the dimension.
template <class T>
void scatter_add_backward(const tape_entry<T>& e) {
  using P = dynamic_policy;
  const auto& state = static_cast<const index_state<T>&>(*e.saved);
  const kiln::shape& out = e.out->shape;
  if (auto t = grad_target_for(e.in[0]); t.data) {
    if (t.accumulate) P::accumulate(static_cast<const T*>(e.out->grad), t.data, out.numel());
    else P::copy(static_cast<const T*>(e.out->grad), t.data, out.numel());
  }
  variable_node<T>* src = e.in[1];
  auto t = grad_target_for(src);
  if (!t.data) return;
  // d src = the output's gradient gathered at the index, over the index's shape; zero elsewhere in src.
  scratch_buffer<T> g(state.count);
  P::gather(static_cast<const T*>(e.out->grad), state.data(), g.data(), index_walk<2>(state.shape, e.aux, {out}),
            stride_of(out, e.aux));
  kernels::strided_walk<2> w;
  w.rank = state.shape.rank();
  for (int k = 0; k < w.rank; ++k) w.extent[k] = state.shape[k];
  kernels::contiguous_strides(src->shape, w.stride[0]);
  kernels::contiguous_strides(state.shape, w.stride[1]);
  if (!t.accumulate && !(src->shape == state.shape)) zero_values(t.data, src->shape.numel());
  P::copy_strided(static_cast<const T*>(g.data()), t.data, w.coalesce(), t.accumulate);
}

}  // namespace detail

// The entries of x at positions `index` (1-D) along dim, as torch.index_select.
template <class T>
basic_variable<T> index_select(const basic_variable<T>& x, int dim, tensor_view<const std::int64_t> index) {
  auto* xn = detail::node_of(x, "index_select");
  const int d = xn->shape.rank() == 0 ? 0 : xn->shape.normalize_dim(dim, "index_select");
  if (index.shape().rank() > 1) fail("index_select: expected a 1-D index, found shape ", index.shape());
  if (xn->shape.rank() == 0) fail("index_select: expected a tensor with at least one dimension, found a scalar");
  detail::check_indices(index, xn->shape[d], "index_select", "index");
  kiln::shape out = xn->shape;
  out[d] = index.numel();
  return detail::index_select_op(xn, d, std::make_unique<detail::index_state<T>>(index), out);
}

// out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (and likewise for the others), as torch.gather: the index has x's
// rank and no larger extent outside dim; the result has the index's shape.
template <class T>
basic_variable<T> gather(const basic_variable<T>& x, int dim, tensor_view<const std::int64_t> index) {
  auto* xn = detail::node_of(x, "gather");
  const int d = xn->shape.normalize_dim(dim, "gather");
  detail::check_index_shape(index.shape(), xn->shape, d, "gather", "the input");
  detail::check_indices(index, xn->shape[d], "gather", "index");
  auto state = std::make_unique<detail::index_state<T>>(index);
  const bool record = detail::should_record<T>({xn});
  auto y = detail::make_output<T>(index.shape(), record);
  dynamic_policy::gather(static_cast<const T*>(xn->value), state->data(), y.data(),
                         detail::index_walk<2>(index.shape(), d, {xn->shape}), detail::stride_of(xn->shape, d));
  if (record)
    detail::tape<T>::instance().record(&detail::gather_backward<T>, y.node(), std::move(state), xn, nullptr, T(0), d);
  return y;
}

// x with src added at the positions the index gives along dim (out[index[i][j]][j] += src[i][j] for dim 0), as
// torch.scatter_add: the index has x's rank and no larger extent than src anywhere, nor than x outside dim.
template <class T>
basic_variable<T> scatter_add(const basic_variable<T>& x, int dim, tensor_view<const std::int64_t> index,
                              const basic_variable<T>& src) {
  auto* xn = detail::node_of(x, "scatter_add");
  auto* sn = detail::node_of(src, "scatter_add");
  const int d = xn->shape.normalize_dim(dim, "scatter_add");
  detail::check_index_shape(index.shape(), xn->shape, d, "scatter_add", "the input");
  bool fits_src = index.shape().rank() == sn->shape.rank();
  for (int k = 0; fits_src && k < sn->shape.rank(); ++k) fits_src = index.shape()[k] <= sn->shape[k];
  if (!fits_src)
    fail("scatter_add: expected an index no larger than src ", sn->shape, " in any dimension, found ", index.shape());
  detail::check_indices(index, xn->shape[d], "scatter_add", "index");
  auto state = std::make_unique<detail::index_state<T>>(index);
  const bool record = detail::should_record<T>({xn, sn});
  auto y = detail::make_output<T>(xn->shape, record);
  dynamic_policy::copy(static_cast<const T*>(xn->value), y.data(), xn->shape.numel());
  dynamic_policy::scatter_add(static_cast<const T*>(sn->value), state->data(), y.data(),
                              detail::index_walk<3>(index.shape(), d, {xn->shape, sn->shape}),
                              detail::stride_of(xn->shape, d));
  if (record)
    detail::tape<T>::instance().record(&detail::scatter_add_backward<T>, y.node(), std::move(state), xn, sn, T(0), d);
  return y;
}

// The rows of weight ([num_embeddings, embedding_dim]) at the ids (any shape): the result is ids.shape + [dim], as
// torch.nn.functional.embedding. The rows at padding_idx get no gradient.
template <class T>
basic_variable<T> embedding(tensor_view<const std::int64_t> ids, const basic_variable<T>& weight,
                            std::optional<index_t> padding_idx = std::nullopt) {
  auto* wn = detail::node_of(weight, "embedding");
  if (wn->shape.rank() != 2) fail("embedding: expected a weight of shape [num_embeddings, embedding_dim], found ",
                                  wn->shape);
  detail::check_indices(ids, wn->shape[0], "embedding", "ids");
  kiln::shape out = ids.shape();
  out.push_back(wn->shape[1]);
  auto state = std::make_unique<detail::index_state<T>>(ids);
  if (padding_idx) state->skip = *padding_idx < 0 ? *padding_idx + wn->shape[0] : *padding_idx;
  return detail::index_select_op(wn, 0, std::move(state), out);
}

// ids ([*], each in [0, num_classes)) as one-hot rows [*, num_classes] of 1 and 0, without gradient (PyTorch's
// one_hot gives int64; here the Variable's type).
template <class T = float>
basic_variable<T> one_hot(tensor_view<const std::int64_t> ids, index_t num_classes) {
  if (num_classes <= 0) fail("one_hot: expected a positive num_classes, found ", num_classes);
  detail::check_indices(ids, num_classes, "one_hot", "ids");
  kiln::shape out = ids.shape();
  out.push_back(num_classes);
  kiln::Tensor<T> host(out);
  for (index_t i = 0; i < ids.numel(); ++i) host.data()[i * num_classes + ids.data()[i]] = T(1);
  return basic_variable<T>(host);
}

}  // namespace kiln::nn
