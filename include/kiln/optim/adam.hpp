// Adam (Kingma & Ba, 2015) and AdamW (Loshchilov & Hutter, 2019) with PyTorch's formulas and defaults.
#pragma once

#include <ranges>
#include <type_traits>

#include "kiln/core/tensor.hpp"
#include "kiln/optim/optimizer.hpp"

namespace kiln::optim {

// Adam's hyper-parameters with torch.optim.Adam's defaults.
struct adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  regularization regularize{};
};

// AdamW's hyper-parameters: Adam's, with torch.optim.AdamW's default weight decay of 0.01.
struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  regularization regularize{};
};

// Adam, or AdamW when Decoupled: weight decay shrinks the parameters directly instead of entering the gradient.
template <class T = float, class Policy = policy::cpu, bool Decoupled = false>
class basic_adam : public optimizer_base<T, Policy> {
  using base = optimizer_base<T, Policy>;

 public:
  using options_type = std::conditional_t<Decoupled, adamw_options, adam_options>;

  explicit basic_adam(options_type o = {}) : base(o.lr, o.regularize), options_(o) { validate(); }
  template <std::ranges::range Range>
  basic_adam(const Range& params, options_type o = {}) : basic_adam(o) {
    this->add_parameters(params);
  }

  void step() {
    if (state_.size() != this->slots_.size()) state_.resize(this->slots_.size());
    this->for_each_trainable([&](parameter_slot<T>& s, std::size_t i) {
      auto& st = state_[i];
      if (st.exp_avg.numel() != s.size) {
        st.exp_avg = Tensor<T>(shape{s.size});
        st.exp_avg_sq = Tensor<T>(shape{s.size});
        if (options_.amsgrad) st.exp_avg_sq_max = Tensor<T>(shape{s.size});
      }
      ++st.step;
      kernels::cpu::adam_step_args<T> args{T(this->lr_),  T(options_.beta1),        T(options_.beta2),
                                           T(options_.eps), T(options_.weight_decay), Decoupled,
                                           options_.amsgrad, st.step};
      Policy::adam_update(s.value, s.grad, st.exp_avg.data(), st.exp_avg_sq.data(), st.exp_avg_sq_max.data(), s.size,
                          args);
    });
  }
  const options_type& options() const { return options_; }

  // Per-slot moment estimates and step count (a checkpoint saves these).
  struct slot_state {
    Tensor<T> exp_avg, exp_avg_sq, exp_avg_sq_max;
    long long step = 0;
  };
  std::vector<slot_state>& state() { return state_; }

 private:
  void validate() const {
    if (options_.lr < 0) fail(Decoupled ? "AdamW" : "Adam", ": expected lr >= 0, found ", options_.lr);
    if (options_.beta1 < 0 || options_.beta1 >= 1 || options_.beta2 < 0 || options_.beta2 >= 1)
      fail(Decoupled ? "AdamW" : "Adam", ": expected betas in [0, 1), found (", options_.beta1, ", ", options_.beta2,
           ")");
    if (options_.eps < 0) fail(Decoupled ? "AdamW" : "Adam", ": expected eps >= 0, found ", options_.eps);
  }
  options_type options_;
  std::vector<slot_state> state_;
};

template <class T = float, class Policy = policy::cpu>
using basic_adamw = basic_adam<T, Policy, true>;

using Adam = basic_adam<float>;
using AdamW = basic_adamw<float>;

}  // namespace kiln::optim
