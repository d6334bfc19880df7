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
  clipping clip{};  // of the gradients before each update: their joint 2-norm or each value (0: off)
  // GPU policies: keep each slot's step count on the device, so that no host value changes from step to step and the
  // update can be captured into a CUDA graph and replayed (PyTorch's capturable). Take one step before capturing
  // (it allocates the state). No effect on CPU policies.
  bool capturable = false;
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
  clipping clip{};  // of the gradients before each update: their joint 2-norm or each value (0: off)
  // GPU policies: keep each slot's step count on the device, so that no host value changes from step to step and the
  // update can be captured into a CUDA graph and replayed (PyTorch's capturable). Take one step before capturing
  // (it allocates the state). No effect on CPU policies.
  bool capturable = false;
};

namespace detail {
// A policy whose Adam kernel can read the step count from its own memory.
template <class Policy, class T>
concept capturable_adam_policy = requires(T* p, const kernels::cpu::adam_step_args<T>& a, long long* step) {
  Policy::adam_update_capturable(p, p, p, p, p, index_t{}, a, step);
};
}  // namespace detail

// Adam, or AdamW when Decoupled: weight decay shrinks the parameters directly instead of entering the gradient.
template <class T = float, class Policy = policy::cpu, bool Decoupled = false>
class basic_adam : public optimizer_base<T, Policy> {
  using base = optimizer_base<T, Policy>;
  using step_buffer = typename Policy::template buffer<long long>;

 public:
  using options_type = std::conditional_t<Decoupled, adamw_options, adam_options>;

  explicit basic_adam(options_type o = {}) : base(o.lr, o.regularize, o.clip), options_(o) {
    validate();
    if constexpr (!Policy::host_accessible && !detail::capturable_adam_policy<Policy, T>)
      if (options_.capturable)
        fail(Decoupled ? "AdamW" : "Adam", ": capturable is not supported by policy '", Policy::name, "'");
    // Clipping reads the gradients back to the host each step, which a captured graph cannot replay.
    if constexpr (!Policy::host_accessible)
      if (options_.capturable && (options_.clip.norm > 0 || options_.clip.value > 0))
        fail(Decoupled ? "AdamW" : "Adam", ": expected no clip with capturable on policy '", Policy::name,
             "', found clip norm ", options_.clip.norm, " and value ", options_.clip.value);
  }
  template <std::ranges::range Range>
  basic_adam(const Range& params, options_type o = {}) : basic_adam(o) {
    this->add_parameters(params);
  }

  void step() {
    if (state_.size() != this->slots_.size()) state_.resize(this->slots_.size());
    this->for_each_trainable([&](parameter_slot<T>& s, std::size_t i) {
      auto& st = state_[i];
      if (st.exp_avg.size() != s.size) {
        st.exp_avg = this->zeroed_buffer(s.size);
        st.exp_avg_sq = this->zeroed_buffer(s.size);
        if (options_.amsgrad) st.exp_avg_sq_max = this->zeroed_buffer(s.size);
      }
      ++st.step;
      kernels::cpu::adam_step_args<T> args{T(this->lr_),  T(options_.beta1),        T(options_.beta2),
                                           T(options_.eps), T(options_.weight_decay), Decoupled,
                                           options_.amsgrad, st.step};
      if constexpr (detail::capturable_adam_policy<Policy, T>) {
        if (options_.capturable) {
          // The device counter starts from the host's (a fresh slot, or state restored from a checkpoint).
          if (st.device_step.size() != 1) {
            st.device_step = step_buffer(1);
            const long long taken = st.step - 1;
            Policy::upload(&taken, st.device_step.data(), 1);
          }
          Policy::adam_update_capturable(s.value, s.grad, st.exp_avg.data(), st.exp_avg_sq.data(),
                                         st.exp_avg_sq_max.data(), s.size, args, st.device_step.data());
          return;
        }
      }
      Policy::adam_update(s.value, s.grad, st.exp_avg.data(), st.exp_avg_sq.data(), st.exp_avg_sq_max.data(), s.size,
                          args);
    });
  }
  const options_type& options() const { return options_; }

  // Per-slot moment estimates and step count (a checkpoint saves these), in the policy's memory.
  struct slot_state {
    typename base::state_buffer exp_avg, exp_avg_sq, exp_avg_sq_max;
    long long step = 0;
    // capturable on a GPU: the step count on the device, which replayed graphs advance without the host.
    step_buffer device_step{};
    // Calls visit(name, buffer, used) for each moment under its name in PyTorch's state_dict, with whether the
    // options use it (a slot that has stepped must then have it).
    template <class Visit>
    void for_each_buffer(const options_type& o, Visit&& visit) {
      visit("exp_avg", exp_avg, true);
      visit("exp_avg_sq", exp_avg_sq, true);
      visit("max_exp_avg_sq", exp_avg_sq_max, o.amsgrad);
    }
  };
  // The state; with capturable on a GPU the host step counts are first read back from the device (a wait).
  std::vector<slot_state>& state() {
    if constexpr (!Policy::host_accessible) {
      for (auto& st : state_)
        if (st.device_step.size() == 1) Policy::download(st.device_step.data(), &st.step, 1);
    }
    return state_;
  }

 private:
  // The values torch.optim.Adam and AdamW reject, written so that NaNs fail too.
  void validate() const {
    const char* name = Decoupled ? "AdamW" : "Adam";
    auto in_unit_interval = [](double beta) { return beta >= 0 && beta < 1; };
    if (!(options_.lr >= 0)) fail(name, ": expected lr >= 0, found ", options_.lr);
    if (!in_unit_interval(options_.beta1) || !in_unit_interval(options_.beta2))
      fail(name, ": expected betas in [0, 1), found (", options_.beta1, ", ", options_.beta2, ")");
    if (!(options_.eps >= 0)) fail(name, ": expected eps >= 0, found ", options_.eps);
    if (!(options_.weight_decay >= 0)) fail(name, ": expected weight_decay >= 0, found ", options_.weight_decay);
  }
  options_type options_;
  std::vector<slot_state> state_;
};

template <class T = float, class Policy = policy::cpu>
using basic_adamw = basic_adam<T, Policy, true>;

using Adam = basic_adam<float>;
using AdamW = basic_adamw<float>;

}  // namespace kiln::optim
