// RMSprop (Tieleman & Hinton, 2012; the centered form from Graves, 2013) with torch.optim.RMSprop's formulas and
// defaults.
#pragma once

#include <ranges>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/optim/optimizer.hpp"

namespace kiln::optim {

// RMSprop's hyper-parameters with torch.optim.RMSprop's defaults.
struct rmsprop_options {
  double lr = 1e-2;
  double alpha = 0.99;  // decay of the running average of the squared gradient
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;  // divide by the gradient's running variance rather than its running mean square
  regularization regularize{};
  clipping clip{};  // of the gradients before each update: their joint 2-norm or each value (0: off)
};

// RMSprop over any parameters: each step divides the gradient by the root of a running average of its square. The
// state of a slot is allocated, zeroed as PyTorch's, on the slot's own first update.
template <class T = float, class Policy = policy::cpu>
class basic_rmsprop : public optimizer_base<T, Policy> {
  using base = optimizer_base<T, Policy>;

 public:
  using options_type = rmsprop_options;

  explicit basic_rmsprop(rmsprop_options o = {}) : base(o.lr, o.regularize, o.clip), options_(o) { validate(); }
  template <std::ranges::range Range>
  basic_rmsprop(const Range& params, rmsprop_options o = {}) : basic_rmsprop(o) {
    this->add_parameters(params);
  }

  void step() {
    if (state_.size() != this->slots_.size()) state_.resize(this->slots_.size());
    this->for_each_trainable([&](parameter_slot<T>& s, std::size_t i) {
      auto& st = state_[i];
      if (st.square_avg.size() != s.size) {
        st.square_avg = this->zeroed_buffer(s.size);
        if (options_.centered) st.grad_avg = this->zeroed_buffer(s.size);
        if (options_.momentum != 0) st.momentum_buffer = this->zeroed_buffer(s.size);
      }
      ++st.step;
      kernels::cpu::rmsprop_step_args<T> args{T(this->lr_),           T(options_.alpha),    T(options_.eps),
                                              T(options_.weight_decay), T(options_.momentum), options_.centered};
      Policy::rmsprop_update(s.value, s.grad, st.square_avg.data(), st.grad_avg.data(), st.momentum_buffer.data(),
                             s.size, args);
    });
  }
  const rmsprop_options& options() const { return options_; }

  // Per-slot running averages, momentum and step count (a checkpoint saves these), in the policy's memory.
  struct slot_state {
    typename base::state_buffer square_avg, grad_avg, momentum_buffer;
    long long step = 0;
    // Calls visit(name, buffer, used) for each buffer under its name in PyTorch's state_dict, with whether the
    // options use it (a slot that has stepped must then have it).
    template <class Visit>
    void for_each_buffer(const rmsprop_options& o, Visit&& visit) {
      visit("square_avg", square_avg, true);
      visit("grad_avg", grad_avg, o.centered);
      visit("momentum_buffer", momentum_buffer, o.momentum != 0);
    }
  };
  std::vector<slot_state>& state() { return state_; }

 private:
  // The values torch.optim.RMSprop rejects, written so that NaNs fail too.
  void validate() const {
    if (!(options_.lr >= 0)) fail("RMSprop: expected lr >= 0, found ", options_.lr);
    if (!(options_.alpha >= 0)) fail("RMSprop: expected alpha >= 0, found ", options_.alpha);
    if (!(options_.eps >= 0)) fail("RMSprop: expected eps >= 0, found ", options_.eps);
    if (!(options_.weight_decay >= 0)) fail("RMSprop: expected weight_decay >= 0, found ", options_.weight_decay);
    if (!(options_.momentum >= 0)) fail("RMSprop: expected momentum >= 0, found ", options_.momentum);
  }
  rmsprop_options options_;
  std::vector<slot_state> state_;
};

using RMSprop = basic_rmsprop<float>;

}  // namespace kiln::optim
