// Gradient clipping over dynamic parameters, as torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) and
// clip_grad_value_: the slot functions of optim/clip.hpp on the variables' gradients, with dynamic mode's policy.
//
//   loss.backward();
//   double norm = nn::clip_grad_norm(model.parameters(), 1.0);
//   optimizer.step();
#pragma once

#include <vector>

#include "kiln/dynamic/policy.hpp"
#include "kiln/dynamic/variable.hpp"
#include "kiln/optim/clip.hpp"

namespace kiln::nn {

namespace detail {
template <class T>
std::vector<optim::parameter_slot<T>> gradient_slots(const std::vector<basic_variable<T>>& parameters) {
  std::vector<optim::parameter_slot<T>> slots;
  slots.reserve(parameters.size());
  for (const auto& p : parameters) slots.push_back(as_parameter_slot(p));
  return slots;
}
}  // namespace detail

// Scales the parameters' gradients so that their joint norm is at most max_norm; returns the norm before scaling.
// Parameters that do not require a gradient, and gradients still waiting to be zeroed, are left out.
template <class T>
double clip_grad_norm(const std::vector<basic_variable<T>>& parameters, double max_norm,
                      optim::clip_norm_options options = {}) {
  const auto slots = detail::gradient_slots(parameters);
  return optim::clip_grad_norm<dynamic_policy>(std::span<const optim::parameter_slot<T>>(slots), max_norm, options);
}

// Clamps every gradient value of the parameters to [-clip_value, clip_value].
template <class T>
void clip_grad_value(const std::vector<basic_variable<T>>& parameters, double clip_value) {
  const auto slots = detail::gradient_slots(parameters);
  optim::clip_grad_value<dynamic_policy>(std::span<const optim::parameter_slot<T>>(slots), clip_value);
}

}  // namespace kiln::nn
