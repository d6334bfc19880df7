// 2-D pooling on the CPU over NCHW planes: max (the gradient goes to the first maximum of each window, as in
// PyTorch), average (PyTorch's divisor rules for padding and ceil mode) and global average.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <limits>

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/conv.hpp"
#include "kiln/kernels/cpu/elementwise.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kernels/cpu/pooling_simd.hpp"
#include "kiln/kernels/cpu/reduce.hpp"
#include "kiln/kernels/pool_window.hpp"

namespace kiln::kernels::cpu {

// The pooling kernels of the CPU policies. planes = batch * channels; g gives the window (dilation for max only).
// Planes are independent: large inputs (a convolution's output) are cut into one slice of planes per thread, each
// plane computed by the same code on any thread.
struct pooling_kernels {
  template <class T>
  KILN_KERNEL static void max_pool_forward(const T* x, T* y, index_t planes, const conv_geometry& g) {
    const index_t in_plane = g.height * g.width;
    for_plane_slices(planes, in_plane, [&](index_t p0, index_t p1) {
      if (is_plain_2x2(g)) return max_pool_2x2_forward(x, y, p0, p1, g);
      for (index_t p = p0; p < p1; ++p) {
        const T* xp = x + p * in_plane;
        T* yp = y + p * g.out_plane();
        for (index_t oh = 0; oh < g.out_height; ++oh)
          for (index_t ow = 0; ow < g.out_width; ++ow)
            yp[oh * g.out_width + ow] = max_pool_window(xp, oh, ow, g, -std::numeric_limits<T>::infinity());
      }
    });
  }
  // dx (+)= dy routed to the first element of each window that equals the window's maximum y.
  template <class T>
  KILN_KERNEL static void max_pool_backward(const T* x, const T* y, const T* dy, T* dx, index_t planes, const conv_geometry& g,
                                bool accumulate) {
    const index_t in_plane = g.height * g.width;
    for_plane_slices(planes, in_plane,
                     [&](index_t p0, index_t p1) { max_pool_backward_planes(x, y, dy, dx, p0, p1, g, accumulate); });
  }

  // max_pool_backward (overwriting dx) followed by the backward of the activation whose output x is (act, with
  // act_input its input or null, as activation_backward takes them), plane by plane: each plane's gradient goes
  // through the activation while it is still in L1, instead of in a pass of its own over the whole batch, which read
  // and wrote a CNN's largest tensor in memory once more (a static model's Conv2D - ReLU - MaxPool2D). The same
  // functions on the same values as the two passes: the same bits.
  template <class T>
  KILN_KERNEL static void max_pool_activated_backward(const T* x, const T* y, const T* dy, T* dx, index_t planes,
                                          const conv_geometry& g, activation act, const T* act_input, T slope) {
    const index_t in_plane = g.height * g.width;
    with_activation(act, [&](auto kind) {
      for_plane_slices(planes, in_plane, [&](index_t p0, index_t p1) {
        for (index_t p = p0; p < p1; ++p) {
          max_pool_backward_planes(x, y, dy, dx, p, p + 1, g, false);
          activation_backward_in_place<kind.value>(act_input ? act_input + p * in_plane : nullptr, x + p * in_plane,
                                                   dx + p * in_plane, in_plane, slope);
        }
      });
    });
  }

  // The commonest pooling, 2 x 2 windows at stride 2 that all lie inside the plane (no padding, no partial ceil-mode
  // window), written out: the generic loops above test every window position against the plane's edges, which a
  // static layer's compiler folds away for its constant geometry but a dynamic module's cannot. The same comparisons
  // (max_pool_prefers, max_pool_matches) in the same window order as max_pool_window and max_pool_argmax: the same
  // results.
  static bool is_plain_2x2(const conv_geometry& g) {
    return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 && g.pad_w == 0 &&
           g.dilation_h == 1 && g.dilation_w == 1 && 2 * g.out_height <= g.height && 2 * g.out_width <= g.width;
  }
  // Planes [p0, p1).
  template <class T>
  static void max_pool_2x2_forward(const T* x, T* y, index_t p0, index_t p1, const conv_geometry& g) {
    const index_t W = g.width;
    for (index_t p = p0; p < p1; ++p)
      for (index_t oh = 0; oh < g.out_height; ++oh) {
        const T* top = x + p * g.height * W + 2 * oh * W;
        const T* bottom = top + W;
        T* out = y + p * g.out_plane() + oh * g.out_width;
        max_pool_2x2_row_forward(top, bottom, out, g.out_width);
      }
  }
  // Each window writes all four of its pixels: the gradient to the first that matches the maximum, zero to the
  // others (or adds them, accumulating: adding zero leaves a pixel as it was, -0 aside). Which pixel matches is data,
  // not pattern, so the choice is made with bit masks rather than branches: a branch per pixel mispredicted about
  // once per window, and the zeroing is not a pass of its own. Pixels that no window covers (an odd last row or column)
  // are zeroed. Where AVX-512 is there, pooling_simd.hpp runs the same comparisons on 16 windows of a row at a time,
  // forward and backward.
  template <class T>
  static void max_pool_2x2_backward(const T* x, const T* y, const T* dy, T* dx, index_t p0, index_t p1,
                                    const conv_geometry& g, bool accumulate) {
    if (accumulate)
      max_pool_2x2_backward_planes<true>(x, y, dy, dx, p0, p1, g);
    else
      max_pool_2x2_backward_planes<false>(x, y, dy, dx, p0, p1, g);
  }

  template <class T>
  KILN_KERNEL static void avg_pool_forward(const T* x, T* y, index_t planes, const conv_geometry& g, bool count_include_pad) {
    const index_t in_plane = g.height * g.width;
    for_plane_slices(planes, in_plane, [&](index_t p0, index_t p1) {
      for (index_t p = p0; p < p1; ++p) {
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
    });
  }
  template <class T>
  KILN_KERNEL static void avg_pool_backward(const T* dy, T* dx, index_t planes, const conv_geometry& g, bool count_include_pad,
                                bool accumulate) {
    const index_t in_plane = g.height * g.width;
    for_plane_slices(planes, in_plane, [&](index_t p0, index_t p1) {
      if (!accumulate) std::fill_n(dx + p0 * in_plane, (p1 - p0) * in_plane, T(0));
      for (index_t p = p0; p < p1; ++p) {
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
    });
  }

  // y[p] = mean of plane p of x (planes of `plane` elements).
  template <class T>
  KILN_KERNEL static void global_avg_pool_forward(const T* x, T* y, index_t planes, index_t plane) {
    for (index_t p = 0; p < planes; ++p) {
      sum_type<T> total = 0;
      for (index_t s = 0; s < plane; ++s) total += x[p * plane + s];
      y[p] = static_cast<T>(total / static_cast<sum_type<T>>(plane));
    }
  }
  template <class T>
  KILN_KERNEL static void global_avg_pool_backward(const T* dy, T* dx, index_t planes, index_t plane, bool accumulate) {
    for (index_t p = 0; p < planes; ++p) {
      const T share = dy[p] / static_cast<T>(plane);
      for (index_t s = 0; s < plane; ++s) dx[p * plane + s] = accumulate ? dx[p * plane + s] + share : share;
    }
  }

 private:
  // max_pool_backward on planes [p0, p1), on the calling thread.
  template <class T>
  static void max_pool_backward_planes(const T* x, const T* y, const T* dy, T* dx, index_t p0, index_t p1,
                                       const conv_geometry& g, bool accumulate) {
    if (is_plain_2x2(g)) return max_pool_2x2_backward(x, y, dy, dx, p0, p1, g, accumulate);
    const index_t in_plane = g.height * g.width;
    if (!accumulate) std::fill_n(dx + p0 * in_plane, (p1 - p0) * in_plane, T(0));
    for (index_t p = p0; p < p1; ++p) max_pool_scatter_plane(x, y, dy, dx, p, g);
  }
  // Adds each output gradient of plane p to the first maximum of its window in dx (the generic geometry).
  template <class T>
  static void max_pool_scatter_plane(const T* x, const T* y, const T* dy, T* dx, index_t p, const conv_geometry& g) {
    const index_t in_plane = g.height * g.width;
    const T* xp = x + p * in_plane;
    T* dxp = dx + p * in_plane;
    for (index_t oh = 0; oh < g.out_height; ++oh)
      for (index_t ow = 0; ow < g.out_width; ++ow) {
        const index_t o = p * g.out_plane() + oh * g.out_width + ow;
        const index_t at = max_pool_argmax(xp, y[o], oh, ow, g);
        if (at >= 0) dxp[at] += dy[o];
      }
  }

  template <bool Accumulate, class T>
  static void max_pool_2x2_backward_planes(const T* KILN_RESTRICT x, const T* KILN_RESTRICT y,
                                           const T* KILN_RESTRICT dy, T* KILN_RESTRICT dx, index_t p0, index_t p1,
                                           const conv_geometry& g) {
    const index_t W = g.width, covered_rows = 2 * g.out_height, covered_cols = 2 * g.out_width;
    for (index_t p = p0; p < p1; ++p) {
      T* dxp = dx + p * g.height * W;
      if constexpr (!Accumulate) {
        for (index_t r = 0; r < covered_rows; ++r) std::fill(dxp + r * W + covered_cols, dxp + (r + 1) * W, T(0));
        std::fill(dxp + covered_rows * W, dxp + g.height * W, T(0));
      }
      for (index_t oh = 0; oh < g.out_height; ++oh) {
        const T* top = x + p * g.height * W + 2 * oh * W;
        const T* bottom = top + W;
        T* dtop = dxp + 2 * oh * W;
        T* dbottom = dtop + W;
        const T* best_row = y + p * g.out_plane() + oh * g.out_width;
        const T* grad_row = dy + p * g.out_plane() + oh * g.out_width;
        max_pool_2x2_row_backward<Accumulate>(top, bottom, best_row, grad_row, dtop, dbottom, g.out_width);
      }
    }
  }
  // One output row of 2 x 2 windows: on AVX-512 (single precision) pooling_simd.hpp's, otherwise the scalar loop.
  template <class T>
  static void max_pool_2x2_row_forward(const T* top, const T* bottom, T* out, index_t windows) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>)
      pooling_simd::max_pool_2x2_row_forward(top, bottom, out, windows);
    else
      max_pool_2x2_row_forward_scalar(top, bottom, out, windows);
#else
    max_pool_2x2_row_forward_scalar(top, bottom, out, windows);
#endif
  }
  template <bool Accumulate, class T>
  static void max_pool_2x2_row_backward(const T* top, const T* bottom, const T* best_row, const T* grad_row, T* dtop,
                                        T* dbottom, index_t windows) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>)
      pooling_simd::max_pool_2x2_row_backward<Accumulate>(top, bottom, best_row, grad_row, dtop, dbottom, windows);
    else
      max_pool_2x2_row_backward_scalar<Accumulate>(top, bottom, best_row, grad_row, dtop, dbottom, windows);
#else
    max_pool_2x2_row_backward_scalar<Accumulate>(top, bottom, best_row, grad_row, dtop, dbottom, windows);
#endif
  }
  template <class T>
  static void max_pool_2x2_row_forward_scalar(const T* top, const T* bottom, T* out, index_t windows) {
    for (index_t ow = 0; ow < windows; ++ow) {
      T best = -std::numeric_limits<T>::infinity();
      for (const T v : {top[2 * ow], top[2 * ow + 1], bottom[2 * ow], bottom[2 * ow + 1]})
        if (max_pool_prefers(v, best)) best = v;
      out[ow] = best;
    }
  }
  template <bool Accumulate, class T>
  static void max_pool_2x2_row_backward_scalar(const T* top, const T* bottom, const T* best_row, const T* grad_row,
                                               T* dtop, T* dbottom, index_t windows) {
    using bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    for (index_t ow = 0; ow < windows; ++ow) {
      const T best = best_row[ow];
      const T values[4] = {top[2 * ow], top[2 * ow + 1], bottom[2 * ow], bottom[2 * ow + 1]};
      T* const targets[4] = {dtop + 2 * ow, dtop + 2 * ow + 1, dbottom + 2 * ow, dbottom + 2 * ow + 1};
      // The generic path adds the gradient to zero when it overwrites: so does this.
      const bits grad = std::bit_cast<bits>(Accumulate ? grad_row[ow] : T(0) + grad_row[ow]);
      bits taken = 0;
      for (int i = 0; i < 4; ++i) {
        const bits mask = (bits(0) - bits(max_pool_matches(values[i], best))) & ~taken;
        taken |= mask;
        const T share = std::bit_cast<T>(grad & mask);
        *targets[i] = Accumulate ? *targets[i] + share : share;
      }
    }
  }

  template <class Body>
  static void for_plane_slices(index_t planes, index_t plane_elements, Body&& body) {
    const index_t min_planes = parallel_min_elements_per_thread / std::max<index_t>(plane_elements, 1);
    parallel_row_slices(planes, std::max<index_t>(min_planes, 1), body);
  }
};

}  // namespace kiln::kernels::cpu
