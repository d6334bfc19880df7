// Optimizer update kernels on the GPU with the CPU's formulas (kernels/cpu/optim.hpp, PyTorch's), over one flat span
// of parameters: a static model's whole parameter buffer is one launch. The per-step constants (bias corrections,
// decay) are computed once on the host exactly as the CPU computes them; each element then runs the CPU's arithmetic,
// with 128-bit loads and stores when the buffers are aligned.
#pragma once

#include <cmath>

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/optim.hpp"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

using cpu::adagrad_step_args;
using cpu::adam_step_args;
using cpu::rmsprop_step_args;
using cpu::sgd_step_args;

namespace detail {

template <class T>
struct sgd_op {
  T* param;
  const T* grad;
  T* momentum_buffer;
  sgd_step_args<T> a;
  template <int W>
  __device__ void apply(index_t i) const {
    vec<T, W> p = load<W>(param + i);
    const vec<T, W> gv = load<W>(grad + i);
    vec<T, W> buf{};
    const bool momentum = a.momentum != T(0);
    if (momentum && !a.first_step) buf = load<W>(momentum_buffer + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      T g = gv.v[k];
      if (a.weight_decay != T(0)) g += a.weight_decay * p.v[k];
      if (momentum) {
        const T b = a.first_step ? g : a.momentum * buf.v[k] + (T(1) - a.dampening) * g;
        buf.v[k] = b;
        g = a.nesterov ? g + a.momentum * b : b;
      }
      p.v[k] -= a.lr * g;
    }
    if (momentum) store<W>(momentum_buffer + i, buf);
    store<W>(param + i, p);
  }
};

// Adam's per-step constants, from the host.
template <class T>
struct adam_constants {
  T step_size, inverse_bias_correction2, decay;
};

// One element of Adam's update given its gradient g: weight decay (L2 into the gradient, or AdamW's decay of the
// parameter), both moments, amsgrad's running maximum (read and written only with a.amsgrad) and the step. The
// arithmetic of every GPU Adam: adam_op here and the fused MLP step (fused_mlp.cuh).
template <class T>
__device__ inline void adam_element(T& param, T& m, T& v, T& v_max, T g, const adam_step_args<T>& a,
                                    const adam_constants<T>& c) {
  if (a.weight_decay != T(0)) {
    if (a.decoupled_weight_decay)
      param *= c.decay;
    else
      g += a.weight_decay * param;
  }
  m = m + (g - m) * (T(1) - a.beta1);
  v = a.beta2 * v + (T(1) - a.beta2) * g * g;
  T second = v;
  if (a.amsgrad) {
    second = v_max < second ? second : v_max;
    v_max = second;
  }
  const T denom = sqrt(second * c.inverse_bias_correction2) + a.eps;  // as the CPU kernel
  param = param - c.step_size * (m / denom);
}

template <class T>
struct adam_op {
  T *param;
  const T* grad;
  T *exp_avg, *exp_avg_sq, *exp_avg_sq_max;
  adam_step_args<T> a;
  adam_constants<T> c;
  template <int W>
  __device__ void apply(index_t i) const {
    vec<T, W> p = load<W>(param + i), m = load<W>(exp_avg + i), v = load<W>(exp_avg_sq + i);
    const vec<T, W> gv = load<W>(grad + i);
    vec<T, W> vmax{};
    if (a.amsgrad) vmax = load<W>(exp_avg_sq_max + i);
#pragma unroll
    for (int k = 0; k < W; ++k) adam_element(p.v[k], m.v[k], v.v[k], vmax.v[k], gv.v[k], a, c);
    store<W>(exp_avg + i, m);
    store<W>(exp_avg_sq + i, v);
    if (a.amsgrad) store<W>(exp_avg_sq_max + i, vmax);
    store<W>(param + i, p);
  }
};

// grad_avg is only read when centered, momentum_buffer only with momentum.
template <class T>
struct rmsprop_op {
  T *param;
  const T* grad;
  T *square_avg, *grad_avg, *momentum_buffer;
  rmsprop_step_args<T> a;
  template <int W>
  __device__ void apply(index_t i) const {
    vec<T, W> p = load<W>(param + i), v = load<W>(square_avg + i);
    const vec<T, W> gv = load<W>(grad + i);
    vec<T, W> m{}, buf{};
    const bool momentum = a.momentum != T(0);
    if (a.centered) m = load<W>(grad_avg + i);
    if (momentum) buf = load<W>(momentum_buffer + i);
    const T one_minus_alpha = T(1) - a.alpha;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      T g = gv.v[k];
      if (a.weight_decay != T(0)) g += a.weight_decay * p.v[k];
      v.v[k] = a.alpha * v.v[k] + one_minus_alpha * g * g;
      T avg;
      if (a.centered) {
        m.v[k] = a.alpha * m.v[k] + one_minus_alpha * g;
        avg = sqrt(v.v[k] - m.v[k] * m.v[k]) + a.eps;
      } else {
        avg = sqrt(v.v[k]) + a.eps;
      }
      if (momentum) {
        buf.v[k] = a.momentum * buf.v[k] + g / avg;
        p.v[k] -= a.lr * buf.v[k];
      } else {
        p.v[k] -= a.lr * g / avg;
      }
    }
    store<W>(square_avg + i, v);
    if (a.centered) store<W>(grad_avg + i, m);
    if (momentum) store<W>(momentum_buffer + i, buf);
    store<W>(param + i, p);
  }
};

template <class T>
struct adagrad_op {
  T* param;
  const T* grad;
  T* state_sum;
  adagrad_step_args<T> a;
  template <int W>
  __device__ void apply(index_t i) const {
    vec<T, W> p = load<W>(param + i), s = load<W>(state_sum + i);
    const vec<T, W> gv = load<W>(grad + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      T g = gv.v[k];
      if (a.weight_decay != T(0)) g += a.weight_decay * p.v[k];
      s.v[k] = s.v[k] + g * g;
      p.v[k] -= a.lr * g / (sqrt(s.v[k]) + a.eps);
    }
    store<W>(state_sum + i, s);
    store<W>(param + i, p);
  }
};

template <class T>
struct regularize_op {
  const T* param;
  T* grad;
  T l1, l2;
  template <int W>
  __device__ void apply(index_t i) const {
    const vec<T, W> p = load<W>(param + i);
    vec<T, W> g = load<W>(grad + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const T sign = p.v[k] > T(0) ? T(1) : (p.v[k] < T(0) ? T(-1) : T(0));
      g.v[k] += l1 * sign + T(2) * l2 * p.v[k];
    }
    store<W>(grad + i, g);
  }
};

}  // namespace detail

// The optimizer kernels of the CUDA policies.
struct optim_kernels {
  template <class T>
  static void sgd_update(T* param, const T* grad, T* momentum_buffer, index_t n, const sgd_step_args<T>& a) {
    detail::launch_map<T>(n, detail::sgd_op<T>{param, grad, momentum_buffer, a}, param, grad,
                          a.momentum != T(0) ? momentum_buffer : static_cast<T*>(nullptr));
  }

  // exp_avg_sq_max is only touched with amsgrad.
  template <class T>
  static void adam_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* exp_avg_sq_max, index_t n,
                          const adam_step_args<T>& a) {
    // The CPU's constants, computed the CPU's way.
    const double step = static_cast<double>(a.step);
    const T bias_correction1 = T(1) - static_cast<T>(std::pow(static_cast<double>(a.beta1), step));
    const T bias_correction2 = T(1) - static_cast<T>(std::pow(static_cast<double>(a.beta2), step));
    const detail::adam_constants<T> c{a.lr / bias_correction1, T(1) / bias_correction2,
                                      T(1) - a.lr * a.weight_decay};
    detail::launch_map<T>(n, detail::adam_op<T>{param, grad, exp_avg, exp_avg_sq, exp_avg_sq_max, a, c}, param, grad,
                          exp_avg, exp_avg_sq, a.amsgrad ? exp_avg_sq_max : static_cast<T*>(nullptr));
  }

  // grad_avg is only touched when centered, momentum_buffer only with momentum.
  template <class T>
  static void rmsprop_update(T* param, const T* grad, T* square_avg, T* grad_avg, T* momentum_buffer, index_t n,
                             const rmsprop_step_args<T>& a) {
    T* const averages = a.centered ? grad_avg : nullptr;
    T* const buffer = a.momentum != T(0) ? momentum_buffer : nullptr;
    detail::launch_map<T>(n, detail::rmsprop_op<T>{param, grad, square_avg, averages, buffer, a}, param, grad,
                          square_avg, averages, buffer);
  }

  template <class T>
  static void adagrad_update(T* param, const T* grad, T* state_sum, index_t n, const adagrad_step_args<T>& a) {
    detail::launch_map<T>(n, detail::adagrad_op<T>{param, grad, state_sum, a}, param, grad, state_sum);
  }

  // grad += l1 * sign(param) + 2 * l2 * param: the gradient of the penalty l1 * sum|p| + l2 * sum p^2 (Keras' form).
  template <class T>
  static void regularize_gradient(const T* param, T* grad, index_t n, T l1, T l2) {
    detail::launch_map<T>(n, detail::regularize_op<T>{param, grad, l1, l2}, param, grad);
  }
};

}  // namespace kiln::kernels::cuda
