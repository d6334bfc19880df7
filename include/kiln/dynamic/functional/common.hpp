// What every dynamic-mode op shares: checking its inputs, making its output node, deciding whether to record.
#pragma once

#include <initializer_list>

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
