// What every dynamic-mode op shares: checking its inputs, making its output node, deciding whether to record.
#pragma once

#include <initializer_list>
#include <iterator>

#include "kiln/dynamic/policy.hpp"
#include "kiln/dynamic/variable.hpp"

namespace kiln::nn::detail {

// The node behind a handle, or a clear error naming the op when the handle is empty.
template <class T>
KILN_ALWAYS_INLINE variable_node<T>* node_of(const basic_variable<T>& v, const char* op) {
  if (!v.defined()) fail(op, ": an input Variable is empty (default-constructed or moved from)");
  return v.node();
}

// Whether an op with these inputs records itself: grad mode is on and at least one input requires grad.
template <class T>
KILN_ALWAYS_INLINE bool should_record(std::initializer_list<const variable_node<T>*> inputs) {
  if (!is_grad_enabled()) return false;
  for (const auto* n : inputs)
    if (n && n->requires_grad) return true;
  return false;
}

// A one-element constant (rank 0) holding s: the other operand of an op between a Variable and a scalar.
template <class T>
basic_variable<T> scalar_constant(T s) {
  auto v = basic_variable<T>::adopt(make_node<T>(kiln::shape{}, false, true));
  write_value(v.data(), s);
  return v;
}

// The product of every extent but the last: the rows of a [*, features] tensor.
inline index_t leading_size(const kiln::shape& s) {
  index_t n = 1;
  for (int d = 0; d + 1 < s.rank(); ++d) n *= s[d];
  return n;
}

// A fresh output (value uninitialised) owned by the returned handle, so that a kernel that throws leaks nothing.
template <class T>
KILN_ALWAYS_INLINE basic_variable<T> make_output(const kiln::shape& s, bool record) {
  return basic_variable<T>::adopt(make_node<T>(s, record, false));
}

}  // namespace kiln::nn::detail

namespace kiln::nn {

// The dimensions an op reduces or permutes over: one (an int converts) or a braced list, {0, 2}; negative dims count
// from the end, as in PyTorch.
class dims {
 public:
  dims(int d) : count_(1) { dims_[0] = d; }  // NOLINT: an int is one dimension, as in PyTorch's sum(x, 1)
  dims(std::initializer_list<int> list) {
    if (list.size() > static_cast<std::size_t>(kiln::shape::max_rank))
      fail("dims: expected at most ", kiln::shape::max_rank, " dimensions, found ", list.size());
    for (int d : list) dims_[count_++] = d;
  }
  template <class Range>
    requires requires(const Range& r) { std::begin(r); std::end(r); }
  explicit dims(const Range& r) {
    for (auto d : r) {
      if (count_ == kiln::shape::max_rank) fail("dims: expected at most ", kiln::shape::max_rank, " dimensions");
      dims_[count_++] = static_cast<int>(d);
    }
  }
  int size() const { return count_; }
  int operator[](int i) const { return dims_[i]; }
  const int* begin() const { return dims_; }
  const int* end() const { return dims_ + count_; }

 private:
  int dims_[kiln::shape::max_rank] = {};
  int count_ = 0;
};

}  // namespace kiln::nn
