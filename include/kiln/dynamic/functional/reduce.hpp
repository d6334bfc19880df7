// sum and mean of all elements, to a rank-0 value (Policy::sum, the reduction kernel static mode uses).
#pragma once

#include "kiln/dynamic/functional/common.hpp"

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

}  // namespace kiln::nn
