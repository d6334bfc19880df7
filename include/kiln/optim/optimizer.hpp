// The part every optimizer shares: the parameter slots it updates, the learning rate, zero_grad, and L1/L2
// regularisation and clipping applied to the gradients before the update.
#pragma once

#include <algorithm>
#include <limits>
#include <span>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/optim/clip.hpp"
#include "kiln/optim/parameter.hpp"
#include "kiln/policy.hpp"

namespace kiln::optim {

// L1 and L2 penalties on every parameter the optimizer updates: gradient += l1 * sign(p) + 2 * l2 * p.
struct regularization {
  double l1 = 0.0;
  double l2 = 0.0;
};

// Holds the slots; derived classes implement update(slot index, step). Policy picks the update kernels, and its
// memory holds the parameters and the optimizer's state (device memory for the GPU policies).
template <class T, class Policy>
class optimizer_base {
 public:
  using value_type = T;
  using policy = Policy;
  // Per-slot state (moments, momentum) lives in the policy's buffers.
  using state_buffer = typename Policy::template buffer<T>;

  // Adds parameters: a range of slots (static mode) or of variables (dynamic mode).
  template <class Range>
  void add_parameters(const Range& params) {
    for (const auto& p : params) slots_.push_back(as_parameter_slot(p));
  }
  bool has_parameters() const { return !slots_.empty(); }
  const std::vector<parameter_slot<T>>& slots() const { return slots_; }

  // Zeroes every gradient: by its pending-zero flag where the slot has one (dynamic mode's parameters: the step fills
  // no gradient buffer, and the weight gradient's product then writes instead of adding), else by a fill.
  void zero_grad() {
    for (auto& s : slots_) {
      if (s.grad_pending_zero) *s.grad_pending_zero = true;
      else Policy::fill(s.grad, T(0), s.size);
    }
  }
  double lr() const { return lr_; }
  // A new learning rate (a schedule's); as the constructors, rejects a negative one or NaN.
  void set_lr(double lr) {
    if (!(lr >= 0)) fail("optimizer set_lr: expected lr >= 0, found ", lr);
    lr_ = lr;
  }
  // The clipping each step applies (the options' clip), and the norm the last step clipped by it (before clipping;
  // NaN before the first step or without clip.norm).
  const clipping& gradient_clipping() const { return clipping_; }
  double last_grad_norm() const { return last_grad_norm_; }
  long long steps_taken() const { return steps_; }
  // Restoring a checkpoint: the count of steps already taken.
  void set_steps_taken(long long steps) { steps_ = steps; }

  // The penalty term l1 * sum|p| + l2 * sum p^2 over all parameters, to report beside the data loss.
  T penalty() const {
    T total = 0;
    for (const auto& s : slots_) {
      if (regularization_.l1 != 0) total += T(regularization_.l1) * Policy::sum_abs(s.value, s.size);
      if (regularization_.l2 != 0) total += T(regularization_.l2) * Policy::sum_squares(s.value, s.size);
    }
    return total;
  }

 protected:
  optimizer_base(double lr, regularization r, clipping c = {}) : lr_(lr), regularization_(r), clipping_(c) {
    if (!(r.l1 >= 0) || !(r.l2 >= 0))
      fail("optimizer: expected regularization l1 >= 0 and l2 >= 0, found l1 = ", r.l1, " and l2 = ", r.l2);
    if (!(c.norm >= 0) || !(c.value >= 0))
      fail("optimizer: expected clip norm >= 0 and clip value >= 0 (0: off), found norm ", c.norm, " and value ",
           c.value);
    if (c.norm > 0 && c.value > 0)
      fail("optimizer: expected at most one of clip norm and clip value, found norm ", c.norm, " and value ", c.value);
  }

  // Runs body(slot, index) for each trainable slot, once every trainable gradient is regularised and clipped.
  template <class Body>
  void for_each_trainable(Body&& body) {
    if (slots_.empty()) fail("optimizer step: no parameters were given to the optimizer");
    ++steps_;
    const auto trainable = [](const parameter_slot<T>& s) { return !s.trainable || *s.trainable; };
    for (auto& s : slots_) {
      if (!trainable(s)) continue;
      if (s.grad_pending_zero && *s.grad_pending_zero) {  // no gradient reached it since zero_grad
        Policy::fill(s.grad, T(0), s.size);
        *s.grad_pending_zero = false;
      }
      if (regularization_.l1 != 0 || regularization_.l2 != 0)
        Policy::regularize_gradient(s.value, s.grad, s.size, T(regularization_.l1), T(regularization_.l2));
    }
    // Clipping needs every gradient first: the norm is over all of them.
    if (clipping_.norm > 0)
      last_grad_norm_ = clip_grad_norm<Policy>(std::span<const parameter_slot<T>>(slots_), clipping_.norm);
    if (clipping_.value > 0) clip_grad_value<Policy>(std::span<const parameter_slot<T>>(slots_), clipping_.value);
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (trainable(slots_[i])) body(slots_[i], i);
  }

  // A state buffer of n values, each set to value.
  static state_buffer filled_buffer(index_t n, T value) {
    state_buffer b(n);
    if (n > 0) Policy::fill(b.data(), value, n);
    return b;
  }
  // A zero-filled state buffer of n values.
  static state_buffer zeroed_buffer(index_t n) { return filled_buffer(n, T(0)); }

  std::vector<parameter_slot<T>> slots_;
  double lr_;
  regularization regularization_;
  clipping clipping_;
  double last_grad_norm_ = std::numeric_limits<double>::quiet_NaN();
  long long steps_ = 0;
};

// clip_grad_norm and clip_grad_value over an optimizer's slots (clip.hpp): in a manual loop, between backward and
// step. Frozen slots and gradients still waiting to be zeroed are left out.
template <class T, class Policy>
double clip_grad_norm(optimizer_base<T, Policy>& optimizer, double max_norm, clip_norm_options o = {}) {
  return clip_grad_norm<Policy>(std::span<const parameter_slot<T>>(optimizer.slots()), max_norm, o);
}
template <class T, class Policy>
void clip_grad_value(optimizer_base<T, Policy>& optimizer, double clip_value) {
  clip_grad_value<Policy>(std::span<const parameter_slot<T>>(optimizer.slots()), clip_value);
}

}  // namespace kiln::optim
