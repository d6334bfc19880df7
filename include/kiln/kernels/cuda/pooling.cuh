// 2-D pooling on the GPU over NCHW planes with the CPU's exact semantics (kernels/cpu/pooling.hpp): max pooling with
// -inf padding, dilation and NaN propagation, its gradient to the first maximum of each window; average pooling with
// PyTorch's divisor rules for padding and ceil mode; global average pooling. The backward passes gather: one thread
// per input element adds the shares of the windows that cover it, in the CPU's order, so no atomics are needed and the
// gradients equal the CPU's bit for bit.
#pragma once

#include <cuda/std/limits>

#include "kiln/kernels/cpu/conv.hpp"
#include "kiln/kernels/cuda/cnn_common.cuh"
#include "kiln/kernels/pool_window.hpp"

namespace kiln::kernels::cuda {

using kernels::cpu::conv_geometry;

namespace detail {

template <class T>
__global__ void max_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, index_t planes,
                                        conv_geometry g) {
  const index_t out_plane = g.out_height * g.out_width, total = planes * out_plane;
  for (index_t at = global_thread(); at < total; at += global_threads()) {
    const index_t ow = at % g.out_width, oh = (at / g.out_width) % g.out_height, p = at / out_plane;
    const T* xp = x + p * g.height * g.width;
    y[at] = max_pool_window(xp, oh, ow, g, -::cuda::std::numeric_limits<T>::infinity());
  }
}

// dx[p, ih, iw] (+)= dy of every window whose first maximum is (ih, iw), windows taken in increasing (oh, ow) as the
// CPU adds them. Window rows covering ih: oh = (ih + ph - i dh) / sh for the kernel rows i that divide evenly; larger
// i gives smaller oh, so i runs downwards.
template <class T>
__global__ void max_pool_backward_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy,
                                         T* dx, index_t planes, conv_geometry g, bool accumulate) {
  const index_t in_plane = g.height * g.width, out_plane = g.out_height * g.out_width, total = planes * in_plane;
  for (index_t at = global_thread(); at < total; at += global_threads()) {
    const index_t iw = at % g.width, ih = (at / g.width) % g.height, p = at / in_plane;
    const index_t here = ih * g.width + iw;
    const T* xp = x + p * in_plane;
    T sum = accumulate ? dx[at] : T(0);
    for (index_t i = g.kernel_h - 1; i >= 0; --i) {
      const index_t th = ih + g.pad_h - i * g.dilation_h;
      if (th < 0 || th % g.stride_h != 0 || th / g.stride_h >= g.out_height) continue;
      const index_t oh = th / g.stride_h;
      for (index_t j = g.kernel_w - 1; j >= 0; --j) {
        const index_t tw = iw + g.pad_w - j * g.dilation_w;
        if (tw < 0 || tw % g.stride_w != 0 || tw / g.stride_w >= g.out_width) continue;
        const index_t ow = tw / g.stride_w;
        const index_t o = p * out_plane + oh * g.out_width + ow;
        if (max_pool_argmax(xp, y[o], oh, ow, g) == here) sum += dy[o];
      }
    }
    dx[at] = sum;
  }
}

template <class T>
__global__ void avg_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, index_t planes, conv_geometry g,
                                        bool count_include_pad) {
  const index_t out_plane = g.out_height * g.out_width, total = planes * out_plane;
  for (index_t at = global_thread(); at < total; at += global_threads()) {
    const index_t ow = at % g.out_width, oh = (at / g.out_width) % g.out_height, p = at / out_plane;
    const T* xp = x + p * g.height * g.width;
    const index_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
    T sum = T(0);
    for (index_t ih = max(h0, index_t(0)); ih < min(h0 + g.kernel_h, g.height); ++ih)
      for (index_t iw = max(w0, index_t(0)); iw < min(w0 + g.kernel_w, g.width); ++iw) sum += xp[ih * g.width + iw];
    const index_t d = avg_pool_divisor(oh, ow, g, count_include_pad);
    y[at] = d > 0 ? sum / static_cast<T>(d) : T(0);
  }
}

// dx[p, ih, iw] (+)= dy / divisor of every window covering (ih, iw), in increasing (oh, ow) as on the CPU.
template <class T>
__global__ void avg_pool_backward_kernel(const T* __restrict__ dy, T* dx, index_t planes, conv_geometry g,
                                         bool count_include_pad, bool accumulate) {
  const index_t in_plane = g.height * g.width, out_plane = g.out_height * g.out_width, total = planes * in_plane;
  for (index_t at = global_thread(); at < total; at += global_threads()) {
    const index_t iw = at % g.width, ih = (at / g.width) % g.height, p = at / in_plane;
    T sum = accumulate ? dx[at] : T(0);
    // Windows start at oh * sh - ph and cover kernel_h rows: oh from ceil((ih + ph - kh + 1) / sh) to (ih + ph) / sh.
    const index_t oh_lo = max(index_t(0), (ih + g.pad_h - g.kernel_h + g.stride_h) / g.stride_h);
    const index_t oh_hi = min(g.out_height - 1, (ih + g.pad_h) / g.stride_h);
    const index_t ow_lo = max(index_t(0), (iw + g.pad_w - g.kernel_w + g.stride_w) / g.stride_w);
    const index_t ow_hi = min(g.out_width - 1, (iw + g.pad_w) / g.stride_w);
    for (index_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (index_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const index_t d = avg_pool_divisor(oh, ow, g, count_include_pad);
        if (d > 0) sum += dy[p * out_plane + oh * g.out_width + ow] / static_cast<T>(d);
      }
    dx[at] = sum;
  }
}

// One block per plane: the mean, summed in double for float data as on the CPU.
template <class T>
__global__ void global_avg_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, index_t plane) {
  using S = cuda_sum_type<T>;
  const T* xp = x + index_t(blockIdx.x) * plane;
  S total = 0, unused = 0;
  for (index_t s = threadIdx.x; s < plane; s += blockDim.x) total += xp[s];
  block_sum2(total, unused);
  if (threadIdx.x == 0) y[blockIdx.x] = static_cast<T>(total / static_cast<S>(plane));
}

template <class T>
__global__ void global_avg_pool_backward_kernel(const T* __restrict__ dy, T* dx, index_t planes, index_t plane,
                                                bool accumulate) {
  for (index_t at = global_thread(); at < planes * plane; at += global_threads()) {
    const T share = dy[at / plane] / static_cast<T>(plane);
    dx[at] = accumulate ? dx[at] + share : share;
  }
}

}  // namespace detail

// The pooling kernels of the CUDA policies (device pointers; same signatures as kernels::cpu::pooling_kernels).
// planes = batch * channels.
struct pooling_kernels {
  template <class T>
  static void max_pool_forward(const T* x, T* y, index_t planes, const conv_geometry& g) {
    detail::launch_elementwise(planes * g.out_plane(), detail::max_pool_forward_kernel<T>, x, y, planes, g);
  }
  template <class T>
  static void max_pool_backward(const T* x, const T* y, const T* dy, T* dx, index_t planes, const conv_geometry& g,
                                bool accumulate) {
    detail::launch_elementwise(planes * g.height * g.width, detail::max_pool_backward_kernel<T>, x, y, dy, dx,
                               planes, g, accumulate);
  }
  template <class T>
  static void avg_pool_forward(const T* x, T* y, index_t planes, const conv_geometry& g, bool count_include_pad) {
    detail::launch_elementwise(planes * g.out_plane(), detail::avg_pool_forward_kernel<T>, x, y, planes, g,
                               count_include_pad);
  }
  template <class T>
  static void avg_pool_backward(const T* dy, T* dx, index_t planes, const conv_geometry& g, bool count_include_pad,
                                bool accumulate) {
    detail::launch_elementwise(planes * g.height * g.width, detail::avg_pool_backward_kernel<T>, dy, dx, planes, g,
                               count_include_pad, accumulate);
  }
  template <class T>
  static void global_avg_pool_forward(const T* x, T* y, index_t planes, index_t plane) {
    detail::launch_per_item(planes, detail::global_avg_pool_forward_kernel<T>, x, y, plane);
  }
  template <class T>
  static void global_avg_pool_backward(const T* dy, T* dx, index_t planes, index_t plane, bool accumulate) {
    detail::launch_elementwise(planes * plane, detail::global_avg_pool_backward_kernel<T>, dy, dx, planes, plane,
                               accumulate);
  }
};

}  // namespace kiln::kernels::cuda
