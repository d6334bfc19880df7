// softmax and log_softmax along an explicit dimension (negative counts from the end, as in PyTorch), through the
// softmax layer functions of layers/softmax.hpp that static mode's Softmax<Dim> and LogSoftmax<Dim> call.
#pragma once

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/layers/softmax.hpp"

namespace kiln::nn {

namespace detail {

template <class T>
void softmax_backward_entry(const tape_entry<T>& e) {  // aux = 2 * dim + log
  auto dx = grad_target_for(e.in[0]);
  if (!dx.data) return;
  softmax_backward<dynamic_policy>(e.out->value, e.out->grad, dx.data, e.out->shape, e.aux / 2, (e.aux & 1) != 0,
                                   dx.accumulate);
}

template <class T>
basic_variable<T> softmax_op(const basic_variable<T>& x, int dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  auto* xn = node_of(x, op);
  int d = xn->shape.normalize_dim(dim, op);
  bool record = should_record<T>({xn});
  auto y = make_output<T>(xn->shape, record);
  softmax_forward<dynamic_policy>(xn->value, y.data(), xn->shape, d, log);
  if (record)
    tape<T>::instance().record(&softmax_backward_entry<T>, y.node(), xn, nullptr, nullptr, T(0), 2 * d + int(log));
  return y;
}

}  // namespace detail

// exp(x) / sum(exp(x)) along dim.
template <class T>
basic_variable<T> softmax(const basic_variable<T>& x, int dim) {
  return detail::softmax_op(x, dim, false);
}
// log(softmax(x)) along dim, computed stably.
template <class T>
basic_variable<T> log_softmax(const basic_variable<T>& x, int dim) {
  return detail::softmax_op(x, dim, true);
}

}  // namespace kiln::nn
