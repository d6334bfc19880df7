// Optimizer update kernels with PyTorch's formulas. One call updates one contiguous span of parameters: a whole
// static model's flat buffer, or one dynamic parameter tensor. Both modes call these, so their updates agree bit for bit.
//
// The updates run with subnormal floats flushed to zero (flush_denormals_scope). Optimizer state decays geometrically
// where a gradient stays zero (a dead ReLU's weights: Adam's m by 0.9 and SGD's momentum by its factor per step) and
// reaches the subnormal range within an epoch, where every x86 operation on it takes a microcode assist, so that the
// step slows down epoch by epoch. Only values below 1.2e-38 change, to zero, as in TensorFlow's kernels; PyTorch keeps
// them.
#pragma once

#include <cmath>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#endif

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/flush_denormals.hpp"
#include "kiln/kernels/cpu/parallel.hpp"

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

// Hyper-parameters of an RMSprop step (torch.optim.RMSprop).
template <class T>
struct rmsprop_step_args {
  T lr, alpha, eps, weight_decay, momentum;
  bool centered;  // divide by the gradient's running standard deviation instead of its root mean square
};

// Hyper-parameters of an Adagrad step (torch.optim.Adagrad).
template <class T>
struct adagrad_step_args {
  T lr;  // this step's rate, already decayed: lr / (1 + (step - 1) * lr_decay), computed in double as PyTorch does
  T eps, weight_decay;
};

// The optimizer kernels of the CPU policies.
struct optim_kernels {
  template <class T>
  KILN_KERNEL static void sgd_update(T* param, const T* grad, T* momentum_buffer, index_t n, const sgd_step_args<T>& a) {
    const flush_denormals_scope flush;
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
  KILN_KERNEL static void adam_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* exp_avg_sq_max, index_t n,
                          const adam_step_args<T>& a) {
    adam_step_constants<T> c;
    const bias_corrections<T> corrections = bias_corrections_for(a);
    c.step_size = a.lr / corrections.first;
    c.inverse_bias_correction2 = T(1) / corrections.second;
    c.decay = T(1) - a.lr * a.weight_decay;
    // One loop per case, so that each is free of branches and vectorises.
    const adam_decay decay = a.weight_decay == T(0)   ? adam_decay::none
                             : a.decoupled_weight_decay ? adam_decay::decoupled
                                                        : adam_decay::l2;
    // Large spans (a static model's flat buffer) are split over the threads: the update is memory-bound, and each
    // thread's share then streams through its own core's cache.
    auto run = [&]<adam_decay Decay>() {
      parallel_chunks<T>(n, [&](index_t begin, index_t end) {
        const flush_denormals_scope flush;  // on each thread: the control register is per thread
        T* const p = param + begin;
        const T* const g = grad + begin;
        T* const m = exp_avg + begin;
        T* const v = exp_avg_sq + begin;
        if (a.amsgrad) adam_loop<Decay, true>(p, g, m, v, exp_avg_sq_max + begin, end - begin, a, c);
        else adam_loop<Decay, false>(p, g, m, v, static_cast<T*>(nullptr), end - begin, a, c);
      });
    };
    if (decay == adam_decay::none) run.template operator()<adam_decay::none>();
    else if (decay == adam_decay::decoupled) run.template operator()<adam_decay::decoupled>();
    else run.template operator()<adam_decay::l2>();
  }

  // grad_avg is only touched when centered, momentum_buffer only with momentum. PyTorch's order of operations, term
  // for term; as Adam's, large spans are split over the threads.
  template <class T>
  KILN_KERNEL static void rmsprop_update(T* param, const T* grad, T* square_avg, T* grad_avg, T* momentum_buffer, index_t n,
                             const rmsprop_step_args<T>& a) {
    // One loop per case, so that each is free of branches and vectorises.
    with_flag(a.weight_decay != T(0), [&](auto decay) {
      with_flag(a.centered, [&](auto centered) {
        with_flag(a.momentum != T(0), [&](auto momentum) {
          parallel_chunks<T>(n, [&](index_t begin, index_t end) {
            const flush_denormals_scope flush;  // on each thread: the control register is per thread
            constexpr bool Centered = decltype(centered)::value, Momentum = decltype(momentum)::value;
            rmsprop_loop<decltype(decay)::value, Centered, Momentum>(
                param + begin, grad + begin, square_avg + begin, Centered ? grad_avg + begin : nullptr,
                Momentum ? momentum_buffer + begin : nullptr, end - begin, a);
          });
        });
      });
    });
  }

  template <class T>
  KILN_KERNEL static void adagrad_update(T* param, const T* grad, T* state_sum, index_t n, const adagrad_step_args<T>& a) {
    with_flag(a.weight_decay != T(0), [&](auto decay) {
      parallel_chunks<T>(n, [&](index_t begin, index_t end) {
        const flush_denormals_scope flush;
        adagrad_loop<decltype(decay)::value>(param + begin, grad + begin, state_sum + begin, end - begin, a);
      });
    });
  }

  // grad += l1 * sign(param) + 2 * l2 * param: the gradient of the penalty l1 * sum|p| + l2 * sum p^2 (Keras' form).
  template <class T>
  KILN_KERNEL static void regularize_gradient(const T* param, T* grad, index_t n, T l1, T l2) {
    for (index_t i = 0; i < n; ++i) {
      T p = param[i];
      T sign = p > T(0) ? T(1) : (p < T(0) ? T(-1) : T(0));
      grad[i] += l1 * sign + T(2) * l2 * p;
    }
  }

 private:
  enum class adam_decay { none, l2, decoupled };
  // 1 - beta1^step and 1 - beta2^step, computed in double as PyTorch does, for each call: two pow calls a parameter
  // tensor, a small part of the tensor's update.
  template <class T>
  struct bias_corrections {
    T first, second;
  };
  template <class T>
  static bias_corrections<T> bias_corrections_for(const adam_step_args<T>& a) {
    const double step = static_cast<double>(a.step);
    return {T(1) - static_cast<T>(std::pow(static_cast<double>(a.beta1), step)),
            T(1) - static_cast<T>(std::pow(static_cast<double>(a.beta2), step))};
  }
  // What one step derives from its arguments once, for every element.
  template <class T>
  struct adam_step_constants {
    T step_size, inverse_bias_correction2, decay;
  };

  // The element loop of adam_update for one case; the arithmetic is the same in every case, term for term. It
  // vectorises only where sqrt need not set errno (-fno-math-errno, which kiln::kiln adds for GCC): unvectorised, this
  // loop is a large part of a small model's training step. PyTorch divides sqrt(v) by sqrt(bias_correction2); this
  // takes sqrt(v / bias_correction2) with the division as a multiply by the inverse, which may differ in the last bit:
  // the second division per element made the loop bound by the divider rather than by memory. The product sits under
  // the square root, where it cannot be contracted into an FMA with the add of eps: sqrt(v) * inverse + eps could be,
  // and was in one caller's inlined copy of this loop but not in another's, which made the static and dynamic CNN
  // test's losses differ.
  template <adam_decay Decay, bool Amsgrad, class T>
  static void adam_loop(T* KILN_RESTRICT param, const T* KILN_RESTRICT grad, T* KILN_RESTRICT exp_avg,
                        T* KILN_RESTRICT exp_avg_sq, T* KILN_RESTRICT exp_avg_sq_max, index_t n,
                        const adam_step_args<T> a, const adam_step_constants<T> c) {
    for (index_t i = 0; i < n; ++i) {
      T g = grad[i];
      T p = param[i];
      if constexpr (Decay == adam_decay::decoupled) p *= c.decay;
      if constexpr (Decay == adam_decay::l2) g += a.weight_decay * p;
      T m = exp_avg[i] + (g - exp_avg[i]) * (T(1) - a.beta1);
      T v = a.beta2 * exp_avg_sq[i] + (T(1) - a.beta2) * g * g;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      if constexpr (Amsgrad) {
        v = exp_avg_sq_max[i] < v ? v : exp_avg_sq_max[i];
        exp_avg_sq_max[i] = v;
      }
      T denom = std::sqrt(v * c.inverse_bias_correction2) + a.eps;
      param[i] = p - c.step_size * (m / denom);
    }
  }

  // Calls body(std::true_type{}) or body(std::false_type{}): a run-time switch made a template argument.
  template <class Body>
  static void with_flag(bool flag, Body&& body) {
    if (flag) body(std::true_type{});
    else body(std::false_type{});
  }

  // The element loop of rmsprop_update for one case. sqrt(square_avg - grad_avg^2) may see a value rounded below
  // zero and give NaN, as PyTorch's does.
  template <bool Decay, bool Centered, bool Momentum, class T>
  static void rmsprop_loop(T* KILN_RESTRICT param, const T* KILN_RESTRICT grad, T* KILN_RESTRICT square_avg,
                           T* KILN_RESTRICT grad_avg, T* KILN_RESTRICT momentum_buffer, index_t n,
                           const rmsprop_step_args<T> a) {
    const T one_minus_alpha = T(1) - a.alpha;
    for (index_t i = 0; i < n; ++i) {
      T g = grad[i];
      if constexpr (Decay) g += a.weight_decay * param[i];
      const T v = a.alpha * square_avg[i] + one_minus_alpha * g * g;
      square_avg[i] = v;
      T avg;
      if constexpr (Centered) {
        const T m = a.alpha * grad_avg[i] + one_minus_alpha * g;
        grad_avg[i] = m;
        avg = std::sqrt(v - m * m) + a.eps;
      } else {
        avg = std::sqrt(v) + a.eps;
      }
      if constexpr (Momentum) {
        const T buf = a.momentum * momentum_buffer[i] + g / avg;
        momentum_buffer[i] = buf;
        param[i] -= a.lr * buf;
      } else {
        param[i] -= a.lr * g / avg;
      }
    }
  }

  // The element loop of adagrad_update for one case.
  template <bool Decay, class T>
  static void adagrad_loop(T* KILN_RESTRICT param, const T* KILN_RESTRICT grad, T* KILN_RESTRICT state_sum, index_t n,
                           const adagrad_step_args<T> a) {
    for (index_t i = 0; i < n; ++i) {
      T g = grad[i];
      if constexpr (Decay) g += a.weight_decay * param[i];
      const T sum = state_sum[i] + g * g;
      state_sum[i] = sum;
      param[i] -= a.lr * g / (std::sqrt(sum) + a.eps);
    }
  }

#if defined(__AVX512F__) && defined(__AVX512DQ__)
  // m / d for 16 lanes without the divider: a reciprocal estimate (14 bits), one Newton step, the quotient, and one
  // correction by its exact residual m - q d (an FMA), which lands on the correctly rounded quotient in every case
  // tested (tests/test_optim_kernels.cpp, and 10^11 random pairs offline). The square root and the division share one
  // unit, and with both on it the loop was bound by that unit rather than by memory. Lanes where the estimate breaks
  // down (d zero, subnormal or infinite, or a quotient that overflows) take the division.
  static KILN_ALWAYS_INLINE __m512 quotient(__m512 m, __m512 d) {
    const __m512 one = _mm512_set1_ps(1.0f);
    // (The maskz forms: GCC 12 warns that the plain ones' undefined pass-through registers may be used uninitialised.)
    __m512 r = _mm512_maskz_rcp14_ps(__mmask16(0xFFFF), d);
    r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, one), r);
    const __m512 q0 = _mm512_mul_ps(m, r);
    const __m512 q = _mm512_fmadd_ps(_mm512_fnmadd_ps(q0, d, m), r, q0);
    // fpclass: 0x02 / 0x04 zero, 0x08 / 0x10 infinite, 0x20 subnormal.
    const __mmask16 special = _kor_mask16(_mm512_fpclass_ps_mask(d, 0x3E), _mm512_fpclass_ps_mask(q0, 0x18));
    if (special) [[unlikely]]
      return _mm512_mask_div_ps(q, special, m, d);
    return q;
  }

  // adam_loop for floats, 16 lanes at a time, in the same arithmetic term for term except the division (quotient
  // above). The last partial vector runs masked through the same code, so that an element's bits do not depend on
  // where it falls in the span.
  template <adam_decay Decay, bool Amsgrad>
  static void adam_loop(float* KILN_RESTRICT param, const float* KILN_RESTRICT grad, float* KILN_RESTRICT exp_avg,
                        float* KILN_RESTRICT exp_avg_sq, float* KILN_RESTRICT exp_avg_sq_max, index_t n,
                        const adam_step_args<float> a, const adam_step_constants<float> c) {
    const __m512 one_minus_beta1 = _mm512_set1_ps(1.0f - a.beta1), beta2 = _mm512_set1_ps(a.beta2);
    const __m512 one_minus_beta2 = _mm512_set1_ps(1.0f - a.beta2), eps = _mm512_set1_ps(a.eps);
    const __m512 inverse_bias_correction2 = _mm512_set1_ps(c.inverse_bias_correction2);
    const __m512 step_size = _mm512_set1_ps(c.step_size), decay = _mm512_set1_ps(c.decay);
    const __m512 weight_decay = _mm512_set1_ps(a.weight_decay);
    auto update = [&](index_t i, __mmask16 lanes) {
      __m512 g = _mm512_maskz_loadu_ps(lanes, grad + i);
      __m512 p = _mm512_maskz_loadu_ps(lanes, param + i);
      if constexpr (Decay == adam_decay::decoupled) p = _mm512_mul_ps(p, decay);
      if constexpr (Decay == adam_decay::l2) g = _mm512_add_ps(g, _mm512_mul_ps(weight_decay, p));
      const __m512 m_old = _mm512_maskz_loadu_ps(lanes, exp_avg + i);
      const __m512 m = _mm512_add_ps(m_old, _mm512_mul_ps(_mm512_sub_ps(g, m_old), one_minus_beta1));
      __m512 v = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_maskz_loadu_ps(lanes, exp_avg_sq + i)),
                               _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
      _mm512_mask_storeu_ps(exp_avg + i, lanes, m);
      _mm512_mask_storeu_ps(exp_avg_sq + i, lanes, v);
      if constexpr (Amsgrad) {
        const __m512 v_max = _mm512_maskz_loadu_ps(lanes, exp_avg_sq_max + i);
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v_max, v, _CMP_LT_OQ), v_max, v);
        _mm512_mask_storeu_ps(exp_avg_sq_max + i, lanes, v);
      }
      const __m512 scaled = _mm512_mul_ps(v, inverse_bias_correction2);
      __m512 denom = _mm512_add_ps(_mm512_maskz_sqrt_ps(__mmask16(0xFFFF), scaled), eps);
      // Masked-off lanes get a nonzero denominator, so that they do not send the vector to the division.
      if (lanes != 0xFFFF) denom = _mm512_mask_blend_ps(lanes, one_minus_beta1, denom);
      _mm512_mask_storeu_ps(param + i, lanes, _mm512_sub_ps(p, _mm512_mul_ps(step_size, quotient(m, denom))));
    };
    index_t i = 0;
    for (; i + 16 <= n; i += 16) update(i, __mmask16(0xFFFF));
    if (i < n) update(i, __mmask16((1u << (n - i)) - 1u));
  }
#endif
};

}  // namespace kiln::kernels::cpu
