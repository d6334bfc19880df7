// Convolution through cuDNN: forward, backward data, backward filter and bias, with stride, padding, dilation and
// groups. The descriptors and the three algorithms are chosen once per (geometry, batch, type) with cuDNN's
// heuristics (cudnnGet*Algorithm_v7: no trial runs, no device allocation, so the first step of a captured graph needs
// none either) and cached; the workspace is the shared cuDNN workspace. FP32 runs with CUDNN_FMA_MATH (no TF32), so
// results agree with the CPU's float math within ordinary rounding.
// A geometry cuDNN cannot express falls back to kiln's CUDA im2col + GEMM path (kernels/cuda/conv.cuh): PyTorch's
// padding="same" with an even kernel pads one pixel more after the end than before, and cuDNN's padding is symmetric.
#pragma once

#include "kiln/kernels/cpu/conv.hpp"
#include "kiln/kernels/cuda/conv.cuh"
#include "kiln/kernels/cudnn/common.cuh"

namespace kiln::kernels::cudnn {

using kernels::cpu::conv_geometry;

namespace detail {

// Workspace beyond this is not worth an algorithm's speed; such algorithms are skipped.
inline constexpr std::size_t max_conv_workspace = std::size_t(1) << 30;

// Everything cuDNN needs to run one convolution shape. usable is false when cuDNN cannot (the caller falls back).
struct conv_plan {
  bool usable = false;
  tensor_descriptor x, y, bias;
  filter_descriptor w;
  convolution_descriptor conv;
  cudnnConvolutionFwdAlgo_t forward_algo{};
  cudnnConvolutionBwdDataAlgo_t backward_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t backward_filter_algo{};
  std::size_t forward_bytes = 0, backward_data_bytes = 0, backward_filter_bytes = 0;
};

// The first of cuDNN's ranked candidates that succeeded, uses FMA math (no tensor-op TF32) and fits the workspace
// limit, preferring deterministic ones (some backward algorithms add with atomics, so two runs could differ).
template <class Perf>
const Perf* pick_algorithm(const Perf* candidates, int count) {
  const Perf* fallback = nullptr;
  for (int i = 0; i < count; ++i) {
    const Perf& p = candidates[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > max_conv_workspace) continue;
    if (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    if (p.determinism == CUDNN_DETERMINISTIC) return &p;
    if (!fallback) fallback = &p;
  }
  return fallback;
}

template <class T>
void build_conv_plan(conv_plan& plan, index_t batch, const conv_geometry& g) {
  const index_t cpg = g.channels / g.groups;
  if (batch < 1 || !fits_int({batch, g.channels, g.height, g.width}) ||
      !fits_int({batch, g.out_channels, g.out_height, g.out_width}) ||
      !fits_int({g.out_channels, cpg, g.kernel_h, g.kernel_w}))
    return;
  cudnnHandle_t handle = kiln::cuda::cudnn_handle();
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.x, CUDNN_TENSOR_NCHW, data_type<T>, int(batch), int(g.channels),
                                              int(g.height), int(g.width)));
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NCHW, data_type<T>, int(batch),
                                              int(g.out_channels), int(g.out_height), int(g.out_width)));
  KILN_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(plan.bias, CUDNN_TENSOR_NCHW, data_type<T>, 1, int(g.out_channels), 1, 1));
  KILN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan.w, data_type<T>, CUDNN_TENSOR_NCHW, int(g.out_channels), int(cpg),
                                              int(g.kernel_h), int(g.kernel_w)));
  // kiln's (and PyTorch's) convolution is a cross-correlation: the kernel is not flipped.
  KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan.conv, int(g.pad_h), int(g.pad_w), int(g.stride_h),
                                                   int(g.stride_w), int(g.dilation_h), int(g.dilation_w),
                                                   CUDNN_CROSS_CORRELATION, data_type<T>));
  KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(plan.conv, int(g.groups)));
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv, CUDNN_FMA_MATH));
  // cuDNN's output extents must be the geometry's; they differ only for asymmetric padding.
  int n = 0, c = 0, h = 0, w = 0;
  KILN_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan.conv, plan.x, plan.w, &n, &c, &h, &w));
  if (n != batch || c != g.out_channels || h != g.out_height || w != g.out_width) return;

  int returned = 0;
  cudnnConvolutionFwdAlgoPerf_t forward[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, plan.x, plan.w, plan.conv, plan.y,
                                                          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, forward));
  const auto* f = pick_algorithm(forward, returned);
  cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, plan.w, plan.y, plan.conv, plan.x,
                                                               CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned,
                                                               data));
  const auto* d = pick_algorithm(data, returned);
  cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, plan.x, plan.y, plan.conv, plan.w,
                                                                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned,
                                                                 filter));
  const auto* k = pick_algorithm(filter, returned);
  if (!f || !d || !k) return;
  plan.forward_algo = f->algo;
  plan.backward_data_algo = d->algo;
  plan.backward_filter_algo = k->algo;
  KILN_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, plan.x, plan.w, plan.conv, plan.y,
                                                           plan.forward_algo, &plan.forward_bytes));
  KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(handle, plan.w, plan.y, plan.conv, plan.x,
                                                                plan.backward_data_algo, &plan.backward_data_bytes));
  KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
      handle, plan.x, plan.y, plan.conv, plan.w, plan.backward_filter_algo, &plan.backward_filter_bytes));
  plan.usable = true;
}

// The cached plan of a convolution shape (built on first use; kept for the process's life).
template <class T>
const conv_plan& conv_plan_for(index_t batch, const conv_geometry& g) {
  using key = std::array<index_t, 16>;
  static std::mutex mutex;
  static auto* plans = new std::map<key, conv_plan>();
  const key k{batch,      g.channels, g.height,   g.width,    g.out_channels, g.out_height, g.out_width, g.kernel_h,
              g.kernel_w, g.stride_h, g.stride_w, g.pad_h,    g.pad_w,        g.dilation_h, g.dilation_w, g.groups};
  std::lock_guard lock(mutex);
  auto [it, added] = plans->try_emplace(k);
  if (added) build_conv_plan<T>(it->second, batch, g);
  return it->second;
}

}  // namespace detail

// The convolution kernels of policy::cudnn (device pointers; the arguments of kernels::cpu::conv_kernels). col, the
// im2col scratch the layers plan, is left alone unless the geometry falls back to kiln's kernels.
struct conv_kernels {
  // Whether cuDNN runs this convolution shape (otherwise kiln's CUDA kernels do): the admissibility check.
  template <class T>
  static bool cudnn_convolves(index_t batch, const conv_geometry& g) {
    return detail::conv_plan_for<T>(batch, g).usable;
  }

  template <class Policy, class T>
  static void conv2d_forward(const T* x, const T* weight, const T* bias, T* y, T* col, index_t batch,
                             const conv_geometry& g) {
    const auto& plan = detail::conv_plan_for<T>(batch, g);
    if (!plan.usable) {
      kernels::cuda::conv_kernels::conv2d_forward<Policy>(x, weight, bias, y, col, batch, g);
      return;
    }
    using B = detail::blend<T>;
    cudnnHandle_t handle = kiln::cuda::cudnn_handle();
    KILN_CUDNN_CHECK(cudnnConvolutionForward(handle, &B::one, plan.x, x, plan.w, weight, plan.conv,
                                             plan.forward_algo, detail::workspace(plan.forward_bytes),
                                             plan.forward_bytes, &B::zero, plan.y, y));
    if (bias) KILN_CUDNN_CHECK(cudnnAddTensor(handle, &B::one, plan.bias, bias, &B::one, plan.y, y));
  }

  // dweight and dbias (+)= with accumulate, dx overwritten (skipped when null), as the CPU's conv2d_backward.
  template <class Policy, class T>
  static void conv2d_backward(const T* x, const T* weight, const T* dy, T* dx, T* dweight, T* dbias, T* col,
                              index_t batch, const conv_geometry& g, bool accumulate) {
    const auto& plan = detail::conv_plan_for<T>(batch, g);
    if (!plan.usable) {
      kernels::cuda::conv_kernels::conv2d_backward<Policy>(x, weight, dy, dx, dweight, dbias, col, batch, g,
                                                           accumulate);
      return;
    }
    using B = detail::blend<T>;
    cudnnHandle_t handle = kiln::cuda::cudnn_handle();
    if (dbias)
      KILN_CUDNN_CHECK(
          cudnnConvolutionBackwardBias(handle, &B::one, plan.y, dy, B::factor(accumulate), plan.bias, dbias));
    if (dweight)
      KILN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &B::one, plan.x, x, plan.y, dy, plan.conv,
                                                      plan.backward_filter_algo,
                                                      detail::workspace(plan.backward_filter_bytes),
                                                      plan.backward_filter_bytes, B::factor(accumulate), plan.w,
                                                      dweight));
    if (dx)
      KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &B::one, plan.w, weight, plan.y, dy, plan.conv,
                                                    plan.backward_data_algo,
                                                    detail::workspace(plan.backward_data_bytes),
                                                    plan.backward_data_bytes, &B::zero, plan.x, dx));
  }
};

}  // namespace kiln::kernels::cudnn
