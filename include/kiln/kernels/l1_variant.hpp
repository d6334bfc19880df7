// The L1 family of regression losses (PyTorch's l1_loss, smooth_l1_loss and huber_loss) as scalar functions of one
// element's difference d = input - target. They are KILN_HOST_DEVICE, so the CPU and CUDA kernels apply the same
// formulas.
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::kernels {

// Which loss of the family, with its threshold (smooth_l1's beta, huber's delta; unused by l1). Made through the
// named constructors, which check the threshold as PyTorch does.
template <class T>
struct l1_variant {
  enum class kind { l1, smooth_l1, huber };
  kind k = kind::l1;
  T threshold = 0;

  // |d|.
  static l1_variant l1() { return {kind::l1, T(0)}; }
  // 0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere; beta = 0 is l1 (but for the gradient at d = 0).
  static l1_variant smooth_l1(T beta) {
    if (!(beta >= T(0))) fail("smooth_l1_loss: expected beta >= 0, found ", beta);
    return {kind::smooth_l1, beta};
  }
  // 0.5 d^2 where |d| < delta, delta (|d| - 0.5 delta) elsewhere: delta times smooth_l1 with beta = delta.
  static l1_variant huber(T delta) {
    if (!(delta > T(0))) fail("huber_loss: expected delta > 0, found ", delta);
    return {kind::huber, delta};
  }

  // The loss's name, as PyTorch's function.
  const char* name() const {
    return k == kind::smooth_l1 ? "smooth_l1_loss" : k == kind::huber ? "huber_loss" : "l1_loss";
  }

  KILN_HOST_DEVICE T value(T d) const {
    const T a = d < T(0) ? -d : d;
    switch (k) {
      case kind::smooth_l1: return a < threshold ? T(0.5) * a * a / threshold : a - T(0.5) * threshold;
      case kind::huber: return a < threshold ? T(0.5) * a * a : threshold * (a - T(0.5) * threshold);
      default: return a;
    }
  }
  // dL/dd, in PyTorch's form: at d = 0, where |d| has no derivative, l1's is 0 (sign(d)), and so is the others' for a
  // threshold above 0; smooth_l1 with beta = 0 gives -1 there, as PyTorch's (d <= -beta holds).
  KILN_HOST_DEVICE T grad(T d) const {
    switch (k) {
      case kind::smooth_l1: return d <= -threshold ? T(-1) : d >= threshold ? T(1) : d / threshold;
      case kind::huber: return d <= -threshold ? -threshold : d >= threshold ? threshold : d;
      default: return T(d > T(0)) - T(d < T(0));
    }
  }
};

}  // namespace kiln::kernels
