// parameter_slot: what an optimizer sees of a parameter, in either mode: a value span and its gradient span.
#pragma once

#include <span>
#include <string>

#include "kiln/core/config.hpp"

namespace kiln::optim {

// Where one parameter tensor lies in a slot: values [offset, offset + size) of its value and gradient spans.
struct tensor_range {
  index_t offset = 0;
  index_t size = 0;
};

// One contiguous run of parameters and its gradient. Static mode hands an optimizer one slot for its whole flat
// buffer; dynamic mode one slot per parameter tensor. trainable (optional) lets a frozen parameter be skipped.
// grad_pending_zero (optional) lets zero_grad clear the gradient by setting the flag instead of filling it: whoever
// produces the gradient next writes it rather than adding to it, and a step that finds the flag still set (no
// gradient reached the parameter) fills the zeros first.
// tensors (optional) lists the parameter tensors of a slot that holds several (static mode's flat slots, with the
// alignment padding between layers left out); empty, the slot is one tensor. A gradient norm sums tensor by tensor,
// so that it does not depend on how the slots cut the parameters (clip.hpp).
template <class T>
struct parameter_slot {
  T* value = nullptr;
  T* grad = nullptr;
  index_t size = 0;
  const bool* trainable = nullptr;
  bool* grad_pending_zero = nullptr;
  std::span<const tensor_range> tensors{};
};

// Static mode already yields slots; dynamic mode's variables provide their own as_parameter_slot overload.
template <class T>
parameter_slot<T> as_parameter_slot(const parameter_slot<T>& slot) {
  return slot;
}

}  // namespace kiln::optim
