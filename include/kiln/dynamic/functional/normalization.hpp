// batch_norm, layer_norm and dropout (PyTorch's F.*), calling the layer functions of static mode's BatchNorm1d/2d,
// LayerNorm and Dropout. The statistics the forward used (or the dropout mask) are saved in a node the tape keeps.
#pragma once

#include "kiln/core/random.hpp"
#include "kiln/dynamic/functional/common.hpp"
#include "kiln/dynamic/functional/conv.hpp"  // detail::saved_node
#include "kiln/layers/batchnorm.hpp"
#include "kiln/layers/dropout.hpp"
#include "kiln/layers/layernorm.hpp"

namespace kiln::nn {

namespace detail {

// in: x, weight (or null), bias (or null), saved (mean, invstd per channel). aux: whether batch statistics were used.
template <class T>
void batch_norm_backward_entry(const tape_entry<T>& e) {
  using P = dynamic_policy;
  variable_node<T>*x = e.in[0], *w = e.in[1], *b = e.in[2], *saved = e.in[3];
  const index_t batch = x->shape[0], channels = x->shape[1], spatial = x->shape.numel() / (batch * channels);
  T* dweight = zeroed_grad_for(w);
  T* dbias = zeroed_grad_for(b);
  auto dx = grad_target_for(x);
  const T* gamma = w ? w->value : nullptr;
  auto run = [&](T* dst) {
    batch_norm_backward<P>(x->value, gamma, e.out->grad, dst, dweight, dbias, saved->value, saved->value + channels,
                           batch, channels, spatial, e.aux != 0, true);
  };
  if (dx.data && dx.accumulate) {
    scratch_buffer<T> scratch(x->shape.numel());
    run(scratch.data());
    P::accumulate(scratch.data(), dx.data, x->shape.numel());
  } else {
    run(dx.data);
  }
}

// in: x, weight, bias, saved (mean, invstd per row). aux: the normalised size (columns).
template <class T>
void layer_norm_backward_entry(const tape_entry<T>& e) {
  using P = dynamic_policy;
  variable_node<T>*x = e.in[0], *w = e.in[1], *b = e.in[2], *saved = e.in[3];
  const index_t cols = e.aux, rows = x->shape.numel() / cols;
  T* dweight = zeroed_grad_for(w);
  T* dbias = zeroed_grad_for(b);
  auto dx = grad_target_for(x);
  auto run = [&](T* dst) {
    layer_norm_backward<P>(x->value, w ? w->value : nullptr, e.out->grad, dst, dweight, dbias, saved->value,
                           saved->value + rows, rows, cols, true);
  };
  if (dx.data && dx.accumulate) {
    scratch_buffer<T> scratch(x->shape.numel());
    run(scratch.data());
    P::accumulate(scratch.data(), dx.data, x->shape.numel());
  } else {
    run(dx.data);
  }
}

// in: x, mask. scalar: p.
template <class T>
void dropout_backward_entry(const tape_entry<T>& e) {
  auto dx = grad_target_for(e.in[0]);
  if (!dx.data) return;
  dropout_backward<dynamic_policy>(e.out->grad, e.in[1]->value, dx.data, e.out->shape.numel(), e.scalar, true,
                                   dx.accumulate);
}

}  // namespace detail

// PyTorch's F.batch_norm over x [N, C, *]: training normalises with batch statistics and updates running_mean /
// running_var (when defined) with momentum; evaluation uses them. weight / bias may be empty handles.
template <class T>
basic_variable<T> batch_norm(const basic_variable<T>& x, const basic_variable<T>& running_mean,
                             const basic_variable<T>& running_var, const basic_variable<T>& weight = {},
                             const basic_variable<T>& bias = {}, bool training = false,
                             std::type_identity_t<T> momentum = T(0.1), std::type_identity_t<T> eps = T(1e-5),
                             T* num_batches_tracked = nullptr) {
  auto* xn = detail::node_of(x, "batch_norm");
  const kiln::shape& s = xn->shape;
  if (s.rank() < 2) fail("batch_norm: expected input of shape [batch, channels, *], found ", s);
  const index_t batch = s[0], channels = s[1], spatial = s.numel() / std::max<index_t>(1, batch * channels);
  auto check = [&](const basic_variable<T>& v, const char* what) {
    if (v.defined() && !(v.shape().rank() == 1 && v.shape()[0] == channels))
      fail("batch_norm: expected ", what, " of shape [", channels, "] for input ", s, ", found ", v.shape());
  };
  check(running_mean, "running_mean");
  check(running_var, "running_var");
  check(weight, "weight");
  check(bias, "bias");
  if (!training && !(running_mean.defined() && running_var.defined()))
    fail("batch_norm: evaluation needs running_mean and running_var");
  if (training && batch * spatial <= 1)
    fail("batch_norm: expected more than one value per channel when training, found input ", s);
  auto* wn = weight.defined() ? weight.node() : nullptr;
  auto* bn = bias.defined() ? bias.node() : nullptr;
  bool record = detail::should_record<T>({xn, wn, bn});
  auto y = detail::make_output<T>(s, record);
  auto saved = detail::saved_node<T>(2 * channels);
  batch_norm_state<T> state{running_mean.defined() ? running_mean.data() : nullptr,
                            running_var.defined() ? running_var.data() : nullptr, num_batches_tracked};
  batch_norm_forward<dynamic_policy>(xn->value, wn ? wn->value : nullptr, bn ? bn->value : nullptr, y.data(),
                                     saved.data(), saved.data() + channels, state, batch, channels, spatial, T(eps),
                                     T(momentum), training);
  if (record)
    detail::tape<T>::instance().record(&detail::batch_norm_backward_entry<T>, y.node(), xn, wn, bn, T(0),
                                       training ? 1 : 0, saved.node());
  return y;
}

// PyTorch's F.layer_norm: x's trailing dims must equal normalized_shape; weight / bias of that shape, or empty.
template <class T>
basic_variable<T> layer_norm(const basic_variable<T>& x, const kiln::shape& normalized_shape,
                             const basic_variable<T>& weight = {}, const basic_variable<T>& bias = {},
                             std::type_identity_t<T> eps = T(1e-5)) {
  auto* xn = detail::node_of(x, "layer_norm");
  const kiln::shape& s = xn->shape;
  const int k = normalized_shape.rank();
  bool fits = k >= 1 && k <= s.rank();
  for (int i = 0; fits && i < k; ++i) fits = s[s.rank() - k + i] == normalized_shape[i];
  if (!fits) fail("layer_norm: expected input whose trailing dims are ", normalized_shape, ", found ", s);
  for (const auto* v : {&weight, &bias})
    if (v->defined() && v->shape() != normalized_shape)
      fail("layer_norm: expected weight and bias of shape ", normalized_shape, ", found ", v->shape());
  const index_t cols = normalized_shape.numel(), rows = s.numel() / cols;
  auto* wn = weight.defined() ? weight.node() : nullptr;
  auto* bn = bias.defined() ? bias.node() : nullptr;
  bool record = detail::should_record<T>({xn, wn, bn});
  auto y = detail::make_output<T>(s, record);
  auto saved = detail::saved_node<T>(2 * rows);
  layer_norm_forward<dynamic_policy>(xn->value, wn ? wn->value : nullptr, bn ? bn->value : nullptr, y.data(),
                                     saved.data(), saved.data() + rows, rows, cols, T(eps));
  if (record)
    detail::tape<T>::instance().record(&detail::layer_norm_backward_entry<T>, y.node(), xn, wn, bn, T(0),
                                       static_cast<int>(cols), saved.node());
  return y;
}

// PyTorch's F.dropout: in training zero each element with probability p (mask from rng) and scale the rest by
// 1 / (1 - p); otherwise the input itself.
template <class T>
basic_variable<T> dropout(const basic_variable<T>& x, std::type_identity_t<T> p, bool training,
                          random_generator& rng) {
  auto* xn = detail::node_of(x, "dropout");
  if (!(p >= T(0) && p <= T(1))) fail("dropout: expected p in [0, 1], found ", p);
  if (!training || p == T(0)) return x;
  bool record = detail::should_record<T>({xn});
  auto y = detail::make_output<T>(xn->shape, record);
  auto mask = detail::saved_node<T>(xn->shape.numel());
  dropout_forward<dynamic_policy>(xn->value, y.data(), mask.data(), xn->shape.numel(), T(p), true, rng);
  if (record)
    detail::tape<T>::instance().record(&detail::dropout_backward_entry<T>, y.node(), xn, mask.node(), nullptr, T(p));
  return y;
}

}  // namespace kiln::nn
