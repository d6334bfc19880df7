// scaled_dot_product_attention, as torch.nn.functional.scaled_dot_product_attention: softmax(q k^T scale + mask) v
// over the last two dimensions, the leading ones broadcast, with dropout on the weights.
//
// On a policy whose values are in host memory it runs kiln's tiled CPU kernel (kernels/cpu/attention.hpp), which never
// holds more than a tile of the [L, S] scores: the forward keeps each query's log-sum-exp and the backward computes
// the scores again. A policy with a fused kernel of its own (Policy::attention_forward and attention_backward with
// the CPU kernel's arguments) takes that instead; any other policy (the GPU's, until it has one) composes the
// reference from matmul, softmax and dropout, which holds the scores.
//   auto y = kiln::nn::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);  // [B, H, L, Ev]
//   auto z = kiln::nn::scaled_dot_product_attention(q, k, v, kiln::nn::bool_mask(keep));      // keep: 1 = attends
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/dynamic/functional/arithmetic.hpp"
#include "kiln/dynamic/functional/broadcast.hpp"
#include "kiln/dynamic/functional/common.hpp"
#include "kiln/dynamic/functional/matmul.hpp"
#include "kiln/dynamic/functional/normalization.hpp"
#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/dynamic/functional/softmax.hpp"
#include "kiln/kernels/attention_math.hpp"
#include "kiln/kernels/attention_dispatch.hpp"
#include "kiln/kernels/strided.hpp"

namespace kiln::nn {

// An attention mask: none (the default), additive (a Variable converts to one: its values are added to the scores,
// -inf excludes), or boolean (nn::bool_mask(v): v's nonzero elements are True, kiln's stand-in for a torch bool
// tensor, such as the 1 and 0 of nn::lt or nn::eq). What True means is the op's: scaled_dot_product_attention lets a
// query attend where the mask is True; MultiheadAttention's attn_mask and key_padding_mask exclude where it is True,
// as in PyTorch. A mask is a constant: one that requires grad is refused.
template <class T>
struct basic_attention_mask {
  basic_attention_mask() = default;
  basic_attention_mask(std::nullptr_t) {}                                     // NOLINT: None
  basic_attention_mask(const basic_variable<T>& additive) : values(additive) {}  // NOLINT: a float mask, as torch's
  bool defined() const { return values.defined(); }
  basic_variable<T> values;
  bool boolean = false;
};
using AttentionMask = basic_attention_mask<float>;

// v as a boolean mask: nonzero is True.
template <class T>
basic_attention_mask<T> bool_mask(const basic_variable<T>& v) {
  basic_attention_mask<T> m(v);
  m.boolean = true;
  return m;
}

namespace detail {

// The tape's record of one attention: the shapes and options, the mask (kept alive), its per-batch offsets, the
// forward's log-sum-exp. q and k are the entry's inputs, v the state's.
template <class T>
struct attention_state : saved_state<T> {
  kernels::cpu::attention_problem<T> problem;
  basic_variable<T> mask;
  std::vector<index_t> mask_offset;
  basic_variable<T> lse;
};

template <class T>
using attention_kernel = kernels::attention_kernel<dynamic_policy, T>;

template <class T>
void attention_backward_entry(const tape_entry<T>& e) {
  auto& state = static_cast<attention_state<T>&>(*e.saved);
  kernels::cpu::attention_problem<T> p = state.problem;
  variable_node<T>*q = e.in[0], *k = e.in[1], *v = state.inputs[0];
  p.q = q->value;
  p.k = k->value;
  p.v = v->value;
  if (state.mask.defined()) {
    p.mask = state.mask.node()->value;
    p.mask_offset = state.mask_offset.data();
  }
  auto target = [](variable_node<T>* n) {
    const grad_target<T> t = grad_target_for(n);
    return kernels::cpu::attention_grad<T>{t.data, t.accumulate};
  };
  // In this order: when q, k or v are one node, the first target is written fresh and the kernel clears it before
  // any of them adds (each batch's slice, by the thread that owns it).
  const auto dq = target(q);
  const auto dk = target(k);
  const auto dv = target(v);
  attention_kernel<T>::backward(p, e.out->value, state.lse.node()->value, e.out->grad, dq, dk, dv);
}

// The reference composed of differentiable ops, for policies without a kernel: it holds the [..., L, S] scores, and a
// query that sees no key gets NaN (softmax over nothing) where the kernels give 0.
template <class T>
basic_variable<T> attention_reference(const basic_variable<T>& q, const basic_variable<T>& k,
                                      const basic_variable<T>& v, const basic_attention_mask<T>& mask, T dropout_p,
                                      bool is_causal, T scale, random_generator* generator) {
  const index_t l_dim = q.shape()[q.dim() - 2], s_dim = k.shape()[k.dim() - 2];
  basic_variable<T> scores = mul(matmul(q, transpose(k, -2, -1)), scale);
  if (mask.defined()) {
    if (mask.boolean) scores = masked_fill(scores, eq(mask.values, T(0)), T(-INFINITY));
    else scores = add(scores, mask.values);
  }
  if (is_causal) {
    Tensor<T> future(kiln::shape{l_dim, s_dim});
    for (index_t i = 0; i < l_dim; ++i)
      for (index_t j = 0; j < s_dim; ++j) future[i * s_dim + j] = kernels::attention_causal_keeps(i, j) ? T(0) : T(1);
    scores = masked_fill(scores, basic_variable<T>(future), T(-INFINITY));
  }
  basic_variable<T> weights = softmax(scores, -1);
  if (dropout_p > T(0)) weights = dropout(weights, dropout_p, true, *generator);
  return matmul(weights, v);
}

}  // namespace detail

// softmax(query key^T * scale + attn_mask) value, as torch.nn.functional.scaled_dot_product_attention:
// query [..., L, E], key [..., S, E], value [..., S, Ev] (leading dimensions broadcast) give [..., L, Ev].
// - attn_mask, broadcastable to [..., L, S]: boolean (nn::bool_mask: True = the query attends to the key) or
//   additive (a Variable of floats added to the scaled scores). A query whose every key is masked gets 0.
// - is_causal: query i attends to keys j <= i (the upper-left aligned mask, torch.ones(L, S).tril()); not together
//   with attn_mask, as PyTorch.
// - scale: 1 / sqrt(E) unless given.
// - dropout_p: each attention weight is dropped with this probability (the rest scaled by 1 / (1 - p)) whenever it is
//   above 0, as PyTorch's (which knows no training flag); the masks come from `generator`, which then moves past
//   one number per weight ([..., L, S]): a module passes its own run-time generator (kiln::next_runtime_generator()),
//   as nn::Dropout does, and draws the masks nn::dropout would draw over the weights.
template <class T>
basic_variable<T> scaled_dot_product_attention(const basic_variable<T>& query, const basic_variable<T>& key,
                                               const basic_variable<T>& value,
                                               const std::type_identity_t<basic_attention_mask<T>>& attn_mask = {},
                                               double dropout_p = 0.0, bool is_causal = false,
                                               std::optional<double> scale = std::nullopt,
                                               random_generator* generator = nullptr) {
  constexpr const char* op = "scaled_dot_product_attention";
  auto* qn = detail::node_of(query, op);
  auto* kn = detail::node_of(key, op);
  auto* vn = detail::node_of(value, op);
  const kiln::shape &qs = qn->shape, &ks = kn->shape, &vs = vn->shape;
  if (qs.rank() < 2 || ks.rank() < 2 || vs.rank() < 2)
    fail(op, ": expected query [..., L, E], key [..., S, E] and value [..., S, Ev], found ", qs, ", ", ks, " and ", vs);
  const index_t l_dim = qs[qs.rank() - 2], e_dim = qs[qs.rank() - 1];
  const index_t s_dim = ks[ks.rank() - 2], ev_dim = vs[vs.rank() - 1];
  if (ks[ks.rank() - 1] != e_dim)
    fail(op, ": query and key must end in the same E, found query ", qs, " and key ", ks);
  if (vs[vs.rank() - 2] != s_dim)
    fail(op, ": key and value must have the same number of keys S, found key ", ks, " and value ", vs);
  if (!(dropout_p >= 0.0 && dropout_p <= 1.0)) fail(op, ": expected dropout_p in [0, 1], found ", dropout_p);
  const T p_drop = static_cast<T>(dropout_p);
  if (p_drop > T(0) && !generator)
    fail(op, ": dropout_p = ", dropout_p, " needs a generator to draw its masks from (a module's own, from "
         "kiln::next_runtime_generator(), as nn::Dropout's)");
  if (is_causal && attn_mask.defined())
    fail(op, ": an explicit attn_mask should not be set when is_causal is true (PyTorch's rule)");
  if (attn_mask.defined() && attn_mask.values.requires_grad())
    fail(op, ": attn_mask of shape ", attn_mask.values.shape(),
         " requires grad; masks are constants here: detach() it");
  const T scale_value = static_cast<T>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(e_dim)));

  // The leading dimensions broadcast; an operand with fewer is expanded (a copy, differentiable) to the full batch.
  kiln::shape batch, bq, bk, bv;
  for (int d = 0; d + 2 < qs.rank(); ++d) bq.push_back(qs[d]);
  for (int d = 0; d + 2 < ks.rank(); ++d) bk.push_back(ks[d]);
  for (int d = 0; d + 2 < vs.rank(); ++d) bv.push_back(vs[d]);
  batch = detail::broadcast_shapes(detail::broadcast_shapes(bq, bk, op), bv, op);
  auto full = [&](index_t rows, index_t cols) {
    kiln::shape s = batch;
    s.push_back(rows);
    s.push_back(cols);
    return s;
  };
  auto expanded = [&](const basic_variable<T>& x, const kiln::shape& b, index_t rows, index_t cols) {
    return b == batch ? x : expand(x, full(rows, cols));
  };
  const basic_variable<T> q = expanded(query, bq, l_dim, e_dim), k = expanded(key, bk, s_dim, e_dim),
                          v = expanded(value, bv, s_dim, ev_dim);
  const kiln::shape scores_shape = full(l_dim, s_dim);
  if (attn_mask.defined() && !(detail::broadcast_shapes(attn_mask.values.shape(), scores_shape, op) == scores_shape))
    fail(op, ": attn_mask of shape ", attn_mask.values.shape(), " does not broadcast to the scores' shape ",
         scores_shape);

  if constexpr (!dynamic_policy::host_accessible && !kernels::has_attention_kernel<dynamic_policy, T>) {
    return detail::attention_reference(q, k, v, attn_mask, p_drop, is_causal, scale_value, generator);
  } else {
    const index_t b_dim = batch.numel();
    auto state = std::make_unique<detail::attention_state<T>>();
    kernels::cpu::attention_problem<T>& p = state->problem;
    p.q = q.node()->value;
    p.k = k.node()->value;
    p.v = v.node()->value;
    p.batch = b_dim;
    p.queries = l_dim;
    p.keys = s_dim;
    p.head_dim = e_dim;
    p.value_dim = ev_dim;
    p.scale = scale_value;
    p.causal = is_causal;
    p.precision = kernels::product_precision_of<dynamic_policy>();
    if (attn_mask.defined()) {
      p.mask_kind = attn_mask.boolean ? kernels::attention_mask_kind::boolean : kernels::attention_mask_kind::additive;
      index_t stride[kiln::shape::max_rank] = {};
      kernels::broadcast_strides(attn_mask.values.shape(), scores_shape, stride);
      const int rank = scores_shape.rank();
      p.mask_row_stride = stride[rank - 2];
      p.mask_col_stride = stride[rank - 1];
      // The offset of each [L, S] matrix of the broadcast batch, batch index b in row-major order.
      state->mask_offset.resize(static_cast<std::size_t>(b_dim));
      for (index_t b = 0; b < b_dim; ++b) {
        index_t rest = b, offset = 0;
        for (int d = rank - 3; d >= 0; --d) {
          offset += (rest % scores_shape[d]) * stride[d];
          rest /= scores_shape[d];
        }
        state->mask_offset[static_cast<std::size_t>(b)] = offset;
      }
      state->mask = attn_mask.values;
      p.mask = state->mask.node()->value;
      p.mask_offset = state->mask_offset.data();
    }
    if (p_drop > T(0)) {
      p.dropout = kernels::attention_dropout::make(static_cast<double>(p_drop), random_stream_position_of(*generator));
      advance(*generator, static_cast<std::uint64_t>(b_dim * l_dim * s_dim));
    }
    const bool record = detail::should_record<T>({q.node(), k.node(), v.node()});
    auto y = detail::make_output<T>(full(l_dim, ev_dim), record);
    state->lse = detail::make_output<T>(kiln::shape{b_dim, l_dim}, false);
    detail::attention_kernel<T>::forward(p, y.data(), state->lse.data());
    if (record) {
      state->keep_input(v.node());
      detail::tape<T>::instance().record(&detail::attention_backward_entry<T>, y.node(), std::move(state), q.node(),
                                         k.node());
    }
    return y;
  }
}

}  // namespace kiln::nn
