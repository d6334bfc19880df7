// Whether dynamic-mode ops record themselves for autograd on this thread, and the no_grad guard that turns it off
// (evaluation, inference, optimizer-side arithmetic), as torch.no_grad().
#pragma once

namespace kiln::nn {

namespace detail {
inline bool& grad_enabled_flag() {
  static thread_local bool enabled = true;
  return enabled;
}
}  // namespace detail

// True when ops on this thread record their backward on the tape.
inline bool is_grad_enabled() { return detail::grad_enabled_flag(); }
inline void set_grad_enabled(bool enabled) { detail::grad_enabled_flag() = enabled; }

// RAII: no op records anything while one is alive; the previous mode comes back when it dies. Nestable.
class no_grad {
 public:
  no_grad() : previous_(detail::grad_enabled_flag()) { detail::grad_enabled_flag() = false; }
  no_grad(const no_grad&) = delete;
  no_grad& operator=(const no_grad&) = delete;
  ~no_grad() { detail::grad_enabled_flag() = previous_; }

 private:
  bool previous_;
};

// RAII: the opposite of no_grad, for a region that must record inside one.
class enable_grad {
 public:
  enable_grad() : previous_(detail::grad_enabled_flag()) { detail::grad_enabled_flag() = true; }
  enable_grad(const enable_grad&) = delete;
  enable_grad& operator=(const enable_grad&) = delete;
  ~enable_grad() { detail::grad_enabled_flag() = previous_; }

 private:
  bool previous_;
};

}  // namespace kiln::nn
