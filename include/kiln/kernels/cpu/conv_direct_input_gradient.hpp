// A unit-stride convolution's input gradient as a forward convolution (conv_direct.hpp) of its output gradient.
// Layout: NCHW, one sample at a time, weight (out_channels, channels / groups, kernel_h, kernel_w).
//
// With unit strides, dx[c, ih, iw] = sum over o, i, j of w[o, c, i, j] dy[o, ih + pad_h - i * dh, iw + pad_w - j * dw].
// Written with the window flipped, i' = kernel_h - 1 - i, that is a correlation of dy with the weights
// w'[c, o, i', j'] = w[o, c, kernel_h - 1 - i', kernel_w - 1 - j'] (PyTorch's transposed-convolution layout, flipped),
// padded by dh (kernel_h - 1) - pad_h before the first row (and likewise for columns), whose output is the input's
// extent: the forward convolution of the geometry transposed_geometry returns. The direct forward reads dy in place
// where im2col's GEMM would write W^T dy as a column matrix for col2im to scatter back; the sum over (o, i', j') is
// the blocked GEMM's order, so the bits differ from that path's but are the same in both modes, which share it.
#pragma once

#include <algorithm>

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/conv_direct.hpp"
#include "kiln/kernels/cpu/conv_geometry.hpp"

namespace kiln::kernels::cpu {

// The geometry of the forward convolution that gives g's input gradient (see the top of the file): dy's extents in,
// x's extents out, the window and dilation unchanged, unit strides.
constexpr conv_geometry transposed_geometry(const conv_geometry& g) {
  conv_geometry t = g;
  t.channels = g.out_channels;
  t.height = g.out_height;
  t.width = g.out_width;
  t.out_channels = g.channels;
  t.out_height = g.height;
  t.out_width = g.width;
  t.pad_h = g.dilation_h * (g.kernel_h - 1) - g.pad_h;
  t.pad_w = g.dilation_w * (g.kernel_w - 1) - g.pad_w;
  return t;
}

// Whether conv2d_direct_input_gradient computes g's input gradient: unit strides, padding no wider than the window's
// reach (so that the transposed padding is not negative), and the transposed forward one that conv2d_direct_forward
// takes (conv_direct_applies).
template <class T>
bool conv_direct_input_gradient_applies(const conv_geometry& g,
                                        product_precision precision = product_precision::single) {
  if (g.stride_h != 1 || g.stride_w != 1 || g.pointwise() || g.out_height < 1 || g.out_width < 1) return false;
  const conv_geometry t = transposed_geometry(g);
  if (t.pad_h < 0 || t.pad_w < 0) return false;
  return conv_direct_applies<T>(t, precision);
}

// The flipped, transposed weights w' of the top of the file, packed for conv2d_direct_forward over
// transposed_geometry(g): built once per backward in the calling thread's scratch (valid until its next call; other
// threads may read it meanwhile).
template <class T>
const T* conv_direct_pack_transposed_weights(const T* weight, const conv_geometry& g) {
  const index_t in_per_group = g.channels / g.groups, out_per_group = g.out_channels / g.groups;
  const index_t window = g.kernel_h * g.kernel_w;
  T* flipped = conv_scratch<T, conv_scratch_use::transposed_weights>(g.channels * out_per_group * window);
  for (index_t grp = 0; grp < g.groups; ++grp)
    for (index_t c = 0; c < in_per_group; ++c)
      for (index_t o = 0; o < out_per_group; ++o) {
        const T* from = weight + ((grp * out_per_group + o) * in_per_group + c) * window;
        T* to = flipped + ((grp * in_per_group + c) * out_per_group + o) * window;
        for (index_t e = 0; e < window; ++e) to[e] = from[window - 1 - e];
      }
  return conv_direct_pack_weights<T, conv_scratch_use::packed_transposed_weights>(flipped, transposed_geometry(g));
}

// One sample: dx = the input gradient of g for output gradient dy (overwritten), `packed` from
// conv_direct_pack_transposed_weights. The caller has checked conv_direct_input_gradient_applies.
template <class T>
void conv2d_direct_input_gradient(const T* dy, const T* packed, T* dx, const conv_geometry& g) {
  conv2d_direct_forward(dy, packed, static_cast<const T*>(nullptr), dx, transposed_geometry(g));
}

}  // namespace kiln::kernels::cpu
