// Convolution on the GPU with kiln's own kernels: im2col / col2im (one launch for the whole batch), the per-channel
// bias of NCHW tensors, and the convolution built from them and the policy's GEMM (cuBLAS for policy::cuda), with the
// CPU's exact semantics and column layout. Every kernel runs on the kiln stream.
#pragma once

#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/kernels/cpu/conv.hpp"
#include "kiln/kernels/cuda/cnn_common.cuh"

namespace kiln::kernels::cuda {

using kernels::cpu::conv_geometry;

namespace detail {

// col[n][(c * kh + i) * kw + j, oh * out_w + ow] = x[n, c, oh * sh - ph + i * dh, ow * sw - pw + j * dw] (0 outside)
// for every sample n; one thread per column entry. Sample n's column matrix starts at n * g.col_size().
template <class T>
__global__ void im2col_kernel(const T* __restrict__ x, T* __restrict__ col, conv_geometry g, index_t batch) {
  const index_t plane = g.out_height * g.out_width, rows = g.channels * g.kernel_h * g.kernel_w;
  const index_t total = batch * rows * plane, in_size = g.channels * g.height * g.width;
  for (index_t at = global_thread(); at < total; at += global_threads()) {
    const index_t p = at % plane, r = (at / plane) % rows, n = at / (plane * rows);
    const index_t ow = p % g.out_width, oh = p / g.out_width;
    const index_t j = r % g.kernel_w, i = (r / g.kernel_w) % g.kernel_h, c = r / (g.kernel_w * g.kernel_h);
    const index_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
    const index_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    col[at] = inside ? x[n * in_size + (c * g.height + ih) * g.width + iw] : T(0);
  }
}

// The adjoint of im2col: x[n, c, ih, iw] = sum of the column entries copied from it (overwritten). One thread per
// input element gathers its entries in the order (i, j) in which the CPU's col2im adds them, so no atomics are needed
// and the sums equal the CPU's bit for bit.
template <class T>
__global__ void col2im_kernel(const T* __restrict__ col, T* __restrict__ x, conv_geometry g, index_t batch) {
  const index_t plane = g.out_height * g.out_width, in_plane = g.height * g.width;
  const index_t col_size = g.channels * g.kernel_h * g.kernel_w * plane;
  const index_t total = batch * g.channels * in_plane;
  for (index_t at = global_thread(); at < total; at += global_threads()) {
    const index_t iw = at % g.width, ih = (at / g.width) % g.height, c = (at / in_plane) % g.channels,
                  n = at / (in_plane * g.channels);
    const T* cn = col + n * col_size;
    T sum = T(0);
    for (index_t i = 0; i < g.kernel_h; ++i) {
      const index_t th = ih + g.pad_h - i * g.dilation_h;
      if (th < 0 || th % g.stride_h != 0 || th / g.stride_h >= g.out_height) continue;
      const index_t oh = th / g.stride_h;
      for (index_t j = 0; j < g.kernel_w; ++j) {
        const index_t tw = iw + g.pad_w - j * g.dilation_w;
        if (tw < 0 || tw % g.stride_w != 0 || tw / g.stride_w >= g.out_width) continue;
        const index_t ow = tw / g.stride_w;
        sum += cn[((c * g.kernel_h + i) * g.kernel_w + j) * plane + oh * g.out_width + ow];
      }
    }
    x[at] = sum;
  }
}

template <class T>
__global__ void add_channel_bias_kernel(T* y, const T* __restrict__ bias, index_t batch, index_t channels,
                                        index_t plane) {
  const index_t total = batch * channels * plane;
  for (index_t at = global_thread(); at < total; at += global_threads()) y[at] += bias[(at / plane) % channels];
}

// One block per channel: the sum over samples and the plane, accumulated in double for float data as on the CPU.
template <class T>
__global__ void sum_channels_kernel(const T* __restrict__ dy, T* sums, index_t batch, index_t channels,
                                    index_t plane, bool accumulate) {
  using S = cuda_sum_type<T>;
  const index_t c = blockIdx.x;
  S total = 0, unused = 0;
  for (index_t at = threadIdx.x; at < batch * plane; at += blockDim.x)
    total += dy[((at / plane) * channels + c) * plane + at % plane];
  block_sum2(total, unused);
  if (threadIdx.x == 0) sums[c] = accumulate ? sums[c] + static_cast<T>(total) : static_cast<T>(total);
}

}  // namespace detail

// The convolution kernels of the CUDA policies (device pointers; same signatures as kernels::cpu::conv_kernels).
struct conv_kernels {
  // One sample's column matrix (the CPU's layout).
  template <class T>
  static void im2col(const T* x, T* col, const conv_geometry& g) {
    detail::launch_elementwise(g.col_size(), detail::im2col_kernel<T>, x, col, g, index_t(1));
  }
  // The adjoint of im2col for one sample (x overwritten).
  template <class T>
  static void col2im(const T* col, T* x, const conv_geometry& g) {
    detail::launch_elementwise(g.in_size(), detail::col2im_kernel<T>, col, x, g, index_t(1));
  }
  // y[n, c, :] += bias[c].
  template <class T>
  static void add_channel_bias(T* y, const T* bias, index_t batch, index_t channels, index_t plane) {
    detail::launch_elementwise(batch * channels * plane, detail::add_channel_bias_kernel<T>, y, bias, batch, channels,
                               plane);
  }
  // sums[c] (+)= sum over n and the plane of dy[n, c, :].
  template <class T>
  static void sum_channels(const T* dy, T* sums, index_t batch, index_t channels, index_t plane, bool accumulate) {
    detail::launch_per_item(channels, detail::sum_channels_kernel<T>, dy, sums, batch, channels, plane, accumulate);
  }

  // The CPU's convolution (kernels::cpu::conv_kernels::conv2d_forward: same arguments), with im2col of the whole
  // batch into col in one launch, kept there for the backward, and one strided batched GEMM per group over all
  // samples (Policy::gemm_strided_batched: cuBLAS; a launch per sample gives each launch a small image's product, too
  // little work to fill the device).
  template <class Policy, class T>
  static void conv2d_forward(const T* x, const T* weight, const T* bias, T* y, T* col, index_t batch,
                             const conv_geometry& g) {
    const index_t k = g.group_k(), plane = g.out_plane(), out_per_group = g.out_channels / g.groups;
    if (!g.pointwise()) detail::launch_elementwise(batch * g.col_size(), detail::im2col_kernel<T>, x, col, g, batch);
    const T* columns = g.pointwise() ? x : col;
    const index_t column_stride = g.pointwise() ? g.in_size() : g.col_size();
    for (index_t grp = 0; grp < g.groups; ++grp)
      Policy::gemm_strided_batched(false, false, out_per_group, plane, k, T(1), weight + grp * out_per_group * k, k,
                                   index_t(0), columns + grp * k * plane, plane, column_stride, T(0),
                                   y + grp * out_per_group * plane, plane, g.out_size(), batch);
    if (bias) add_channel_bias(y, bias, batch, g.out_channels, plane);
  }
  // The CPU's convolution backward (dweight, dbias (+)= with accumulate; dx overwritten, skipped when null; col
  // overwritten with the column gradients), with col2im of the whole batch in one launch.
  template <class Policy, class T>
  static void conv2d_backward(const T* x, const T* weight, const T* dy, T* dx, T* dweight, T* dbias, T* col,
                              index_t batch, const conv_geometry& g, bool accumulate) {
    const index_t k = g.group_k(), plane = g.out_plane(), out_per_group = g.out_channels / g.groups;
    const T* columns = g.pointwise() ? x : col;
    const index_t column_stride = g.pointwise() ? g.in_size() : g.col_size();
    if (dbias) sum_channels(dy, dbias, batch, g.out_channels, plane, accumulate);
    // The weight gradient sums over the samples. When the per-sample gradients fit in 64 MiB: every sample's product
    // in one launch, then their sum as one more product (a row of ones times them). Else one product per sample, each
    // adding to the last.
    const index_t weight_size = g.out_channels * k;
    if (dweight && static_cast<std::size_t>(batch * weight_size) * sizeof(T) <= (std::size_t{64} << 20)) {
      // From the caching allocator, back to it at the end of this block; a later request reuses them in stream order,
      // after these products.
      kiln::cuda::device_buffer<T> per_sample(batch * weight_size), ones(batch);
      Policy::fill(ones.data(), T(1), batch);
      for (index_t grp = 0; grp < g.groups; ++grp)
        Policy::gemm_strided_batched(false, true, out_per_group, k, plane, T(1), dy + grp * out_per_group * plane,
                                     plane, g.out_size(), columns + grp * k * plane, plane, column_stride, T(0),
                                     per_sample.data() + grp * out_per_group * k, k, weight_size, batch);
      Policy::gemm(false, false, 1, weight_size, batch, T(1), ones.data(), batch, per_sample.data(), weight_size,
                   accumulate ? T(1) : T(0), dweight, weight_size);
    } else if (dweight) {
      for (index_t n = 0; n < batch; ++n) {
        const T beta = (n == 0 && !accumulate) ? T(0) : T(1);
        for (index_t grp = 0; grp < g.groups; ++grp)
          Policy::gemm(false, true, out_per_group, k, plane, T(1), dy + n * g.out_size() + grp * out_per_group * plane,
                       plane, columns + n * column_stride + grp * k * plane, plane, beta,
                       dweight + grp * out_per_group * k, k);
      }
    }
    // The column gradients replace the column matrices, which the weight gradient above has used (the products run
    // in stream order).
    if (dx) {
      T* dcol = g.pointwise() ? dx : col;
      for (index_t grp = 0; grp < g.groups; ++grp)
        Policy::gemm_strided_batched(true, false, k, plane, out_per_group, T(1), weight + grp * out_per_group * k, k,
                                     index_t(0), dy + grp * out_per_group * plane, plane, g.out_size(), T(0),
                                     dcol + grp * k * plane, plane, column_stride, batch);
    }
    if (dx && !g.pointwise())
      detail::launch_elementwise(batch * g.in_size(), detail::col2im_kernel<T>, col, dx, g, batch);
  }
};

}  // namespace kiln::kernels::cuda
