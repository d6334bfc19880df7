// Softmax and log-softmax through cuDNN (CUDNN_SOFTMAX_ACCURATE subtracts the maximum first, as the CPU does;
// CUDNN_SOFTMAX_LOG). kiln's (outer, size, inner) view maps onto cuDNN's channel mode directly: an (outer, size,
// inner, 1) tensor whose "channels" are the softmax dimension, so any dimension works, the last one (inner = 1)
// included. kiln's CUDA kernels run instead for extents beyond int and for an in-place forward (y aliasing x, which
// the CPU allows and cuDNN does not promise).
#pragma once

#include "kiln/kernels/cuda/softmax.cuh"
#include "kiln/kernels/cudnn/common.cuh"

namespace kiln::kernels::cudnn {

// The softmax kernels policy::cudnn replaces (device pointers; the CPU's signatures and semantics).
struct softmax_kernels {
  template <class T>
  static void softmax_forward(const T* x, T* y, index_t outer, index_t size, index_t inner, bool log) {
    if (x == y || outer * size * inner == 0 || !detail::fits_int({outer, size, inner})) {
      kernels::cuda::softmax_kernels::softmax_forward(x, y, outer, size, inner, log);
      return;
    }
    using B = detail::blend<T>;
    auto desc = detail::tensor_4d<T>(outer, size, inner, 1);
    KILN_CUDNN_CHECK(cudnnSoftmaxForward(kiln::cuda::cudnn_handle(), log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE,
                                         CUDNN_SOFTMAX_MODE_CHANNEL, &B::one, desc, x, &B::zero, desc, y));
  }
  // softmax: dx (+)= y (dy - sum(dy y)); log-softmax: dx (+)= dy - exp(y) sum(dy).
  template <class T>
  static void softmax_backward(const T* y, const T* dy, T* dx, index_t outer, index_t size, index_t inner, bool log,
                               bool accumulate = false) {
    if (outer * size * inner == 0 || !detail::fits_int({outer, size, inner})) {
      kernels::cuda::softmax_kernels::softmax_backward(y, dy, dx, outer, size, inner, log, accumulate);
      return;
    }
    using B = detail::blend<T>;
    auto desc = detail::tensor_4d<T>(outer, size, inner, 1);
    KILN_CUDNN_CHECK(cudnnSoftmaxBackward(kiln::cuda::cudnn_handle(),
                                          log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE,
                                          CUDNN_SOFTMAX_MODE_CHANNEL, &B::one, desc, y, desc, dy,
                                          B::factor(accumulate), desc, dx));
  }
};

}  // namespace kiln::kernels::cudnn
