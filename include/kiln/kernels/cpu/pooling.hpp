// 2-D pooling on the CPU over NCHW planes: max (the gradient goes to the first maximum of each window, as in
// PyTorch), average (PyTorch's divisor rules for padding and ceil mode) and global average.
#pragma once

#include <algorithm>
#include <limits>

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/conv.hpp"
#include "kiln/kernels/cpu/reduce.hpp"

namespace kiln::kernels::cpu {

// The pooling kernels of the CPU policies. planes = batch * channels; g gives the window (dilation for max only).
struct pooling_kernels {
  template <class T>
  static void max_pool_forward(const T* x, T* y, index_t planes, const conv_geometry& g) {
    const index_t in_plane = g.height * g.width;
    for (index_t p = 0; p < planes; ++p) {
      const T* xp = x + p * in_plane;
      T* yp = y + p * g.out_plane();
      for (index_t oh = 0; oh < g.out_height; ++oh)
        for (index_t ow = 0; ow < g.out_width; ++ow) {
          T best = -std::numeric_limits<T>::infinity();
          for (index_t i = 0; i < g.kernel_h; ++i) {
            const index_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
            if (ih < 0 || ih >= g.height) continue;
            for (index_t j = 0; j < g.kernel_w; ++j) {
              const index_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
              if (iw < 0 || iw >= g.width) continue;
              const T v = xp[ih * g.width + iw];
              if (v > best || v != v) best = v;
            }
          }
          yp[oh * g.out_width + ow] = best;
        }
    }
  }
  // dx (+)= dy routed to the first element of each window that equals the window's maximum y.
  template <class T>
  static void max_pool_backward(const T* x, const T* y, const T* dy, T* dx, index_t planes, const conv_geometry& g,
                                bool accumulate) {
    const index_t in_plane = g.height * g.width;
    if (!accumulate) std::fill_n(dx, planes * in_plane, T(0));
    for (index_t p = 0; p < planes; ++p) {
      const T* xp = x + p * in_plane;
      T* dxp = dx + p * in_plane;
      for (index_t oh = 0; oh < g.out_height; ++oh)
        for (index_t ow = 0; ow < g.out_width; ++ow) {
          const index_t o = p * g.out_plane() + oh * g.out_width + ow;
          const T best = y[o];
          index_t at = -1;
          for (index_t i = 0; i < g.kernel_h && at < 0; ++i) {
            const index_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
            if (ih < 0 || ih >= g.height) continue;
            for (index_t j = 0; j < g.kernel_w; ++j) {
              const index_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
              if (iw < 0 || iw >= g.width) continue;
              const T v = xp[ih * g.width + iw];
              if (v == best || (v != v && best != best)) {
                at = ih * g.width + iw;
                break;
              }
            }
          }
          if (at >= 0) dxp[at] += dy[o];
        }
    }
  }

  // The divisor of output (oh, ow) of an average pool: the window clipped to the padded input (count_include_pad)
  // or to the input itself.
  static index_t avg_pool_divisor(index_t oh, index_t ow, const conv_geometry& g, bool count_include_pad) {
    index_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
    index_t h1 = std::min(h0 + g.kernel_h, g.height + g.pad_h), w1 = std::min(w0 + g.kernel_w, g.width + g.pad_w);
    index_t pool = (h1 - h0) * (w1 - w0);
    if (count_include_pad) return pool;
    h0 = std::max<index_t>(h0, 0);
    w0 = std::max<index_t>(w0, 0);
    h1 = std::min(h1, g.height);
    w1 = std::min(w1, g.width);
    return (h1 - h0) * (w1 - w0);
  }

  template <class T>
  static void avg_pool_forward(const T* x, T* y, index_t planes, const conv_geometry& g, bool count_include_pad) {
    const index_t in_plane = g.height * g.width;
    for (index_t p = 0; p < planes; ++p) {
      const T* xp = x + p * in_plane;
      T* yp = y + p * g.out_plane();
      for (index_t oh = 0; oh < g.out_height; ++oh)
        for (index_t ow = 0; ow < g.out_width; ++ow) {
          const index_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
          T sum = T(0);
          for (index_t ih = std::max<index_t>(h0, 0); ih < std::min(h0 + g.kernel_h, g.height); ++ih)
            for (index_t iw = std::max<index_t>(w0, 0); iw < std::min(w0 + g.kernel_w, g.width); ++iw)
              sum += xp[ih * g.width + iw];
          const index_t d = avg_pool_divisor(oh, ow, g, count_include_pad);
          yp[oh * g.out_width + ow] = d > 0 ? sum / static_cast<T>(d) : T(0);
        }
    }
  }
  template <class T>
  static void avg_pool_backward(const T* dy, T* dx, index_t planes, const conv_geometry& g, bool count_include_pad,
                                bool accumulate) {
    const index_t in_plane = g.height * g.width;
    if (!accumulate) std::fill_n(dx, planes * in_plane, T(0));
    for (index_t p = 0; p < planes; ++p) {
      const T* dyp = dy + p * g.out_plane();
      T* dxp = dx + p * in_plane;
      for (index_t oh = 0; oh < g.out_height; ++oh)
        for (index_t ow = 0; ow < g.out_width; ++ow) {
          const index_t d = avg_pool_divisor(oh, ow, g, count_include_pad);
          if (d <= 0) continue;
          const T share = dyp[oh * g.out_width + ow] / static_cast<T>(d);
          const index_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
          for (index_t ih = std::max<index_t>(h0, 0); ih < std::min(h0 + g.kernel_h, g.height); ++ih)
            for (index_t iw = std::max<index_t>(w0, 0); iw < std::min(w0 + g.kernel_w, g.width); ++iw)
              dxp[ih * g.width + iw] += share;
        }
    }
  }

  // y[p] = mean of plane p of x (planes of `plane` elements).
  template <class T>
  static void global_avg_pool_forward(const T* x, T* y, index_t planes, index_t plane) {
    for (index_t p = 0; p < planes; ++p) {
      sum_type<T> total = 0;
      for (index_t s = 0; s < plane; ++s) total += x[p * plane + s];
      y[p] = static_cast<T>(total / static_cast<sum_type<T>>(plane));
    }
  }
  template <class T>
  static void global_avg_pool_backward(const T* dy, T* dx, index_t planes, index_t plane, bool accumulate) {
    for (index_t p = 0; p < planes; ++p) {
      const T share = dy[p] / static_cast<T>(plane);
      for (index_t s = 0; s < plane; ++s) dx[p * plane + s] = accumulate ? dx[p * plane + s] + share : share;
    }
  }
};

}  // namespace kiln::kernels::cpu
