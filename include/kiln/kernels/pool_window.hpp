// One pooling window of a 2-D pool, as scalar functions shared by the CPU and the CUDA kernels (KILN_HOST_DEVICE, as
// the activations are), so both backends scan a window, pick its maximum and divide an average by the same rules.
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/conv.hpp"

namespace kiln::kernels {

// Max pooling's two comparisons. A value replaces the best so far when it is larger or NaN (the first NaN wins, as in
// PyTorch); the gradient goes to the first element that equals the maximum, NaN matching NaN. The bitwise | and &
// evaluate every comparison, so the compiler can combine them without a branch on data that decides nothing
// predictable.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE bool max_pool_prefers(T v, T best) {
  return (v > best) | (v != v);
}
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE bool max_pool_matches(T v, T best) {
  return (v == best) | ((v != v) & (best != best));
}

// Calls visit(v) for the elements of window (oh, ow) of plane xp that lie inside the plane, row by row, until visit
// returns true; returns the offset (within the plane) of that element, or -1.
template <class T, class Visit>
KILN_HOST_DEVICE index_t scan_pool_window(const T* xp, index_t oh, index_t ow, const cpu::conv_geometry& g,
                                          Visit&& visit) {
  for (index_t i = 0; i < g.kernel_h; ++i) {
    const index_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
    if (ih < 0 || ih >= g.height) continue;
    for (index_t j = 0; j < g.kernel_w; ++j) {
      const index_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
      if (iw < 0 || iw >= g.width) continue;
      if (visit(xp[ih * g.width + iw])) return ih * g.width + iw;
    }
  }
  return -1;
}

// The maximum of window (oh, ow) of plane xp: padding counts as `lowest` (-inf).
template <class T>
KILN_HOST_DEVICE T max_pool_window(const T* xp, index_t oh, index_t ow, const cpu::conv_geometry& g, T lowest) {
  T best = lowest;
  scan_pool_window(xp, oh, ow, g, [&](T v) {
    if (max_pool_prefers(v, best)) best = v;
    return false;
  });
  return best;
}

// The offset (within its plane) of the first element of window (oh, ow) that matches best, or -1: where max
// pooling's gradient goes.
template <class T>
KILN_HOST_DEVICE index_t max_pool_argmax(const T* xp, T best, index_t oh, index_t ow, const cpu::conv_geometry& g) {
  return scan_pool_window(xp, oh, ow, g, [&](T v) { return max_pool_matches(v, best); });
}

// The divisor of output (oh, ow) of an average pool (PyTorch's rules): the window clipped to the padded input
// (count_include_pad) or to the input itself.
KILN_HOST_DEVICE inline index_t avg_pool_divisor(index_t oh, index_t ow, const cpu::conv_geometry& g,
                                                 bool count_include_pad) {
  index_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
  index_t h1 = h0 + g.kernel_h < g.height + g.pad_h ? h0 + g.kernel_h : g.height + g.pad_h;
  index_t w1 = w0 + g.kernel_w < g.width + g.pad_w ? w0 + g.kernel_w : g.width + g.pad_w;
  const index_t pool = (h1 - h0) * (w1 - w0);
  if (count_include_pad) return pool;
  h0 = h0 > 0 ? h0 : 0;
  w0 = w0 > 0 ? w0 : 0;
  h1 = h1 < g.height ? h1 : g.height;
  w1 = w1 < g.width ? w1 : g.width;
  return (h1 - h0) * (w1 - w0);
}

}  // namespace kiln::kernels
