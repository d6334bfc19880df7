// Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay (torch.optim.SGD).
#pragma once

#include <ranges>
#include <type_traits>

#include "kiln/core/tensor.hpp"
#include "kiln/optim/optimizer.hpp"

namespace kiln::optim {

// SGD's hyper-parameters, PyTorch's defaults (lr has none there; 0.01 here).
struct sgd_options {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  regularization regularize{};
  clipping clip{};  // of the gradients before each update: their joint 2-norm or each value (0: off)
};

// SGD over any parameters; one momentum buffer per slot, allocated on the slot's first update.
template <class T = float, class Policy = policy::cpu>
class basic_sgd : public optimizer_base<T, Policy> {
  using base = optimizer_base<T, Policy>;

 public:
  using options_type = sgd_options;

  explicit basic_sgd(sgd_options o = {}) : base(o.lr, o.regularize, o.clip), options_(o) { validate(); }
  template <std::ranges::range Range>
  basic_sgd(const Range& params, sgd_options o = {}) : basic_sgd(o) {
    this->add_parameters(params);
  }

  void step() {
    if (momentum_.size() < this->slots_.size()) momentum_.resize(this->slots_.size());  // slots added since
    this->for_each_trainable([&](parameter_slot<T>& s, std::size_t i) {
      // As PyTorch, a slot's buffer starts as its first gradient, undampened, on the slot's own first update: a slot
      // added later, or frozen until now, starts then, not on the optimizer's first step.
      bool first = momentum_[i].size() != s.size;
      if (options_.momentum != 0 && first) momentum_[i] = this->zeroed_buffer(s.size);
      kernels::cpu::sgd_step_args<T> args{T(this->lr_),           T(options_.momentum), T(options_.dampening),
                                          T(options_.weight_decay), options_.nesterov,    first};
      Policy::sgd_update(s.value, s.grad, momentum_[i].data(), s.size, args);
    });
  }
  const sgd_options& options() const { return options_; }
  // One momentum buffer per slot (empty until the slot's first update with momentum), in the policy's memory.
  std::vector<typename base::state_buffer>& momentum_buffers() { return momentum_; }

 private:
  // The values torch.optim.SGD rejects, and NaNs, which every comparison lets through unless it is written to fail.
  void validate() const {
    if (!(options_.lr >= 0)) fail("SGD: expected lr >= 0, found ", options_.lr);
    if (!(options_.momentum >= 0)) fail("SGD: expected momentum >= 0, found ", options_.momentum);
    if (options_.dampening != options_.dampening) fail("SGD: expected a number for dampening, found NaN");
    if (!(options_.weight_decay >= 0)) fail("SGD: expected weight_decay >= 0, found ", options_.weight_decay);
    if (options_.nesterov && (options_.momentum <= 0 || options_.dampening != 0))
      fail("SGD: Nesterov momentum needs momentum > 0 and dampening 0, found momentum ", options_.momentum,
           " and dampening ", options_.dampening);
  }
  sgd_options options_;
  std::vector<typename base::state_buffer> momentum_;
};

using SGD = basic_sgd<float>;

}  // namespace kiln::optim
