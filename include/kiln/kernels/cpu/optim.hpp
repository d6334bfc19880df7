// Optimizer update kernels with PyTorch's formulas. One call updates one contiguous span of parameters: a whole
// static model's flat buffer, or one dynamic parameter tensor. Both modes call these, so their updates agree bit for bit.
#pragma once

#include <cmath>

#include "kiln/core/config.hpp"

namespace kiln::kernels::cpu {

// Hyper-parameters of an SGD step (torch.optim.SGD).
template <class T>
struct sgd_step_args {
  T lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first_step;  // the momentum buffer starts as the first gradient, undampened
};

// Hyper-parameters of an Adam or AdamW step (torch.optim.Adam / AdamW); step counts from 1.
template <class T>
struct adam_step_args {
  T lr, beta1, beta2, eps, weight_decay;
  bool decoupled_weight_decay;  // AdamW
  bool amsgrad;
  long long step;
};

// The optimizer kernels of the CPU policies.
struct optim_kernels {
  template <class T>
  static void sgd_update(T* param, const T* grad, T* momentum_buffer, index_t n, const sgd_step_args<T>& a) {
    for (index_t i = 0; i < n; ++i) {
      T g = grad[i];
      if (a.weight_decay != T(0)) g += a.weight_decay * param[i];
      if (a.momentum != T(0)) {
        T buf = a.first_step ? g : a.momentum * momentum_buffer[i] + (T(1) - a.dampening) * g;
        momentum_buffer[i] = buf;
        g = a.nesterov ? g + a.momentum * buf : buf;
      }
      param[i] -= a.lr * g;
    }
  }

  // exp_avg_sq_max is only touched with amsgrad.
  template <class T>
  KILN_VECTORIZE_MATH static void adam_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* exp_avg_sq_max, index_t n,
                          const adam_step_args<T>& a) {
    T bias_correction1 = T(1) - static_cast<T>(std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step)));
    T bias_correction2 = T(1) - static_cast<T>(std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step)));
    T step_size = a.lr / bias_correction1;
    T bias_correction2_sqrt = std::sqrt(bias_correction2);
    T decay = T(1) - a.lr * a.weight_decay;
    for (index_t i = 0; i < n; ++i) {
      T g = grad[i];
      T p = param[i];
      if (a.weight_decay != T(0)) {
        if (a.decoupled_weight_decay)
          p *= decay;
        else
          g += a.weight_decay * p;
      }
      T m = exp_avg[i] + (g - exp_avg[i]) * (T(1) - a.beta1);
      T v = a.beta2 * exp_avg_sq[i] + (T(1) - a.beta2) * g * g;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      if (a.amsgrad) {
        v = std::max(exp_avg_sq_max[i], v);
        exp_avg_sq_max[i] = v;
      }
      T denom = std::sqrt(v) / bias_correction2_sqrt + a.eps;
      param[i] = p - step_size * (m / denom);
    }
  }

  // grad += l1 * sign(param) + 2 * l2 * param: the gradient of the penalty l1 * sum|p| + l2 * sum p^2 (Keras' form).
  template <class T>
  static void regularize_gradient(const T* param, T* grad, index_t n, T l1, T l2) {
    for (index_t i = 0; i < n; ++i) {
      T p = param[i];
      T sign = p > T(0) ? T(1) : (p < T(0) ? T(-1) : T(0));
      grad[i] += l1 * sign + T(2) * l2 * p;
    }
  }
};

}  // namespace kiln::kernels::cpu
