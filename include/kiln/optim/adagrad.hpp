// Adagrad (Duchi, Hazan & Singer, 2011) with torch.optim.Adagrad's formulas and defaults.
#pragma once

#include <ranges>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/optim/optimizer.hpp"

namespace kiln::optim {

// Adagrad's hyper-parameters with torch.optim.Adagrad's defaults.
struct adagrad_options {
  double lr = 1e-2;
  double lr_decay = 0.0;  // step t runs at lr / (1 + (t - 1) * lr_decay)
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;  // where each sum of squared gradients starts
  double eps = 1e-10;
  regularization regularize{};
  clipping clip{};  // of the gradients before each update: their joint 2-norm or each value (0: off)
};

// Adagrad over any parameters: each step divides the gradient by the root of the sum of all its squares so far. The
// state of a slot is allocated on the slot's own first update (PyTorch fills it at construction: the same values).
template <class T = float, class Policy = policy::cpu>
class basic_adagrad : public optimizer_base<T, Policy> {
  using base = optimizer_base<T, Policy>;

 public:
  using options_type = adagrad_options;

  explicit basic_adagrad(adagrad_options o = {}) : base(o.lr, o.regularize, o.clip), options_(o) { validate(); }
  template <std::ranges::range Range>
  basic_adagrad(const Range& params, adagrad_options o = {}) : basic_adagrad(o) {
    this->add_parameters(params);
  }

  void step() {
    if (state_.size() != this->slots_.size()) state_.resize(this->slots_.size());
    this->for_each_trainable([&](parameter_slot<T>& s, std::size_t i) {
      auto& st = state_[i];
      if (st.sum.size() != s.size) st.sum = this->filled_buffer(s.size, T(options_.initial_accumulator_value));
      ++st.step;
      // The decayed rate in double, as PyTorch computes it in Python floats; the rate a scheduler set is the base.
      const double decayed_lr = this->lr_ / (1 + static_cast<double>(st.step - 1) * options_.lr_decay);
      kernels::cpu::adagrad_step_args<T> args{T(decayed_lr), T(options_.eps), T(options_.weight_decay)};
      Policy::adagrad_update(s.value, s.grad, st.sum.data(), s.size, args);
    });
  }
  const adagrad_options& options() const { return options_; }

  // Per-slot sums of squared gradients and step count (a checkpoint saves these), in the policy's memory.
  struct slot_state {
    typename base::state_buffer sum;
    long long step = 0;
    // Calls visit(name, buffer, used) for each buffer under its name in PyTorch's state_dict, with whether the
    // options use it (a slot that has stepped must then have it).
    template <class Visit>
    void for_each_buffer(const adagrad_options&, Visit&& visit) {
      visit("sum", sum, true);
    }
  };
  std::vector<slot_state>& state() { return state_; }

 private:
  // The values torch.optim.Adagrad rejects, written so that NaNs fail too.
  void validate() const {
    if (!(options_.lr >= 0)) fail("Adagrad: expected lr >= 0, found ", options_.lr);
    if (!(options_.lr_decay >= 0)) fail("Adagrad: expected lr_decay >= 0, found ", options_.lr_decay);
    if (!(options_.weight_decay >= 0)) fail("Adagrad: expected weight_decay >= 0, found ", options_.weight_decay);
    if (!(options_.initial_accumulator_value >= 0))
      fail("Adagrad: expected initial_accumulator_value >= 0, found ", options_.initial_accumulator_value);
    if (!(options_.eps >= 0)) fail("Adagrad: expected eps >= 0, found ", options_.eps);
  }
  adagrad_options options_;
  std::vector<slot_state> state_;
};

using Adagrad = basic_adagrad<float>;

}  // namespace kiln::optim
