// Adam with its step count in device memory (adam_options::capturable): the bias corrections are derived on the
// device from that count, so no argument of the launches changes from one step to the next, and a CUDA graph that
// captured one update replays every later one correctly. The element-wise arithmetic is adam_update's
// (kernels/cuda/optim.cuh); only where the per-step constants come from differs.
#pragma once

#include <cuda_runtime.h>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/cuda/optim.cuh"

namespace kiln::kernels::cuda {

namespace detail {

// Advances a step count kept on the device (one thread).
template <class Count>
__global__ void advance_count_kernel(Count* count) {
  *count += 1;
}

// Adam's two bias corrections for step `step`, 1 - beta^step, by the formulas adam_update uses on the host
// (double-precision powers rounded to T), for kernels that read the step count on the device.
template <class T>
struct adam_bias_corrections {
  T first, second;
};
template <class T>
__device__ inline adam_bias_corrections<T> adam_bias_corrections_at(const adam_step_args<T>& a, long long step) {
  const double s = static_cast<double>(step);
  return {T(1) - static_cast<T>(pow(static_cast<double>(a.beta1), s)),
          T(1) - static_cast<T>(pow(static_cast<double>(a.beta2), s))};
}
// The constants of one update from its bias corrections.
template <class T>
__device__ inline adam_constants<T> adam_constants_from(const adam_step_args<T>& a, adam_bias_corrections<T> b) {
  return {a.lr / b.first, T(1) / b.second, T(1) - a.lr * a.weight_decay};
}
// Adam's constants for step `step`.
template <class T>
__device__ inline adam_constants<T> adam_constants_at(const adam_step_args<T>& a, long long step) {
  return adam_constants_from(a, adam_bias_corrections_at(a, step));
}

// adam_op with its constants computed from *step. Every thread derives them itself: two powers per thread cost less
// than another launch.
template <class T>
struct capturable_adam_op {
  adam_op<T> op;
  const long long* step;
  template <int W>
  __device__ void apply(index_t i) const {
    adam_op<T> now = op;
    now.c = adam_constants_at(op.a, *step);
    now.template apply<W>(i);
  }
};

}  // namespace detail

// The capturable optimizer kernels of the CUDA policies.
struct capturable_optim_kernels {
  // As adam_update, except that a.step is ignored: *step (device memory, the steps taken so far) is advanced by one
  // and the update uses the new count.
  template <class T>
  static void adam_update_capturable(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* exp_avg_sq_max, index_t n,
                                     const adam_step_args<T>& a, long long* step) {
    detail::advance_count_kernel<<<1, 1, 0, kiln::cuda::current_stream()>>>(step);
    KILN_CUDA_CHECK_LAUNCH();
    const detail::adam_op<T> op{param, grad, exp_avg, exp_avg_sq, exp_avg_sq_max, a, {}};
    detail::launch_map<T>(n, detail::capturable_adam_op<T>{op, step}, param, grad, exp_avg, exp_avg_sq,
                          a.amsgrad ? exp_avg_sq_max : static_cast<T*>(nullptr));
  }
};

}  // namespace kiln::kernels::cuda
