// Max and average pooling forward through cuDNN where its semantics are the CPU's; kiln's CUDA kernels otherwise:
//  - ceil mode, when it adds a window: cuDNN's output extent is always floor((in + 2 pad - k) / stride) + 1;
//  - dilated max pooling: cuDNN's pooling has no dilation;
//  - the max-pooling gradient: kiln (as PyTorch) sends it to the first maximum of each window, cuDNN does not promise
//    which of tied maxima gets it (ties are common after a ReLU), so the backward is kiln's kernel, which only needs
//    x and y and finds the same maximum from cuDNN's y (max is exact);
//  - the average-pooling gradient: the layer's signature passes dy and dx only, and cuDNN's backward insists on x
//    and y as well; kiln's gather kernel computes the same shares.
// Within those limits cuDNN matches: -inf padding with NaN propagated for max, and for average the divisor counts
// the padding (CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING: the full window in floor mode) or not (EXCLUDE_PADDING).
#pragma once

#include "kiln/kernels/cpu/conv.hpp"
#include "kiln/kernels/cuda/pooling.cuh"
#include "kiln/kernels/cudnn/common.cuh"

namespace kiln::kernels::cudnn {

using kernels::cpu::conv_geometry;

namespace detail {

// The descriptors of one pooling shape; usable is false when cuDNN cannot pool it as the CPU does.
struct pool_plan {
  bool usable = false;
  pooling_descriptor pool;
  tensor_descriptor x, y;
};

template <class T>
void build_pool_plan(pool_plan& plan, cudnnPoolingMode_t mode, index_t planes, const conv_geometry& g) {
  if (planes < 1 || g.dilation_h != 1 || g.dilation_w != 1 || !fits_int({planes, g.height, g.width}) ||
      !fits_int({planes, g.out_height, g.out_width}) || !fits_int({g.kernel_h, g.kernel_w, g.stride_h, g.stride_w}))
    return;
  // Each (sample, channel) plane is pooled on its own: planes x 1 x H x W.
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.x, CUDNN_TENSOR_NCHW, data_type<T>, int(planes), 1, int(g.height),
                                              int(g.width)));
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NCHW, data_type<T>, int(planes), 1,
                                              int(g.out_height), int(g.out_width)));
  KILN_CUDNN_CHECK(cudnnSetPooling2dDescriptor(plan.pool, mode, CUDNN_PROPAGATE_NAN, int(g.kernel_h), int(g.kernel_w),
                                               int(g.pad_h), int(g.pad_w), int(g.stride_h), int(g.stride_w)));
  int n = 0, c = 0, h = 0, w = 0;
  KILN_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(plan.pool, plan.x, &n, &c, &h, &w));
  plan.usable = n == planes && c == 1 && h == g.out_height && w == g.out_width;
}

template <class T>
const pool_plan& pool_plan_for(cudnnPoolingMode_t mode, index_t planes, const conv_geometry& g) {
  using key = std::array<index_t, 14>;
  static std::mutex mutex;
  static auto* plans = new std::map<key, pool_plan>();
  const key k{index_t(mode), planes,     g.height,   g.width,  g.out_height, g.out_width, g.kernel_h,
              g.kernel_w,    g.stride_h, g.stride_w, g.pad_h,  g.pad_w,      g.dilation_h, g.dilation_w};
  std::lock_guard lock(mutex);
  auto [it, added] = plans->try_emplace(k);
  if (added) build_pool_plan<T>(it->second, mode, planes, g);
  return it->second;
}

template <class T>
bool cudnn_pool_forward(cudnnPoolingMode_t mode, const T* x, T* y, index_t planes, const conv_geometry& g) {
  const auto& plan = pool_plan_for<T>(mode, planes, g);
  if (!plan.usable) return false;
  using B = blend<T>;
  KILN_CUDNN_CHECK(
      cudnnPoolingForward(kiln::cuda::cudnn_handle(), plan.pool, &B::one, plan.x, x, &B::zero, plan.y, y));
  return true;
}

}  // namespace detail

// The pooling kernels policy::cudnn replaces (the forward passes; see the top of this file for the rest).
struct pooling_kernels {
  template <class T>
  static void max_pool_forward(const T* x, T* y, index_t planes, const conv_geometry& g) {
    if (!detail::cudnn_pool_forward(CUDNN_POOLING_MAX_DETERMINISTIC, x, y, planes, g))
      kernels::cuda::pooling_kernels::max_pool_forward(x, y, planes, g);
  }
  template <class T>
  static void avg_pool_forward(const T* x, T* y, index_t planes, const conv_geometry& g, bool count_include_pad) {
    const auto mode =
        count_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    if (!detail::cudnn_pool_forward(mode, x, y, planes, g))
      kernels::cuda::pooling_kernels::avg_pool_forward(x, y, planes, g, count_include_pad);
  }
};

}  // namespace kiln::kernels::cudnn
