// The geometry of a 2-D convolution or pooling window over NCHW data, shared by the CPU, CUDA and cuDNN kernels.
#pragma once

#include "kiln/core/config.hpp"

namespace kiln::kernels::cpu {

// The geometry of one 2-D convolution or pooling window over NCHW data. pad_h / pad_w are the padding before the
// first row / column; the output extents fix how far the windows reach past the end (PyTorch's "same" padding puts
// the odd extra pixel there).
struct conv_geometry {
  index_t channels = 1, height = 1, width = 1;  // input, per sample
  index_t out_channels = 1, out_height = 1, out_width = 1;
  index_t kernel_h = 1, kernel_w = 1;
  index_t stride_h = 1, stride_w = 1;
  index_t pad_h = 0, pad_w = 0;
  index_t dilation_h = 1, dilation_w = 1;
  index_t groups = 1;

  constexpr index_t in_size() const { return channels * height * width; }
  constexpr index_t out_plane() const { return out_height * out_width; }
  constexpr index_t out_size() const { return out_channels * out_plane(); }
  // Rows of one group's column matrix: its input channels times the kernel window.
  constexpr index_t group_k() const { return channels / groups * kernel_h * kernel_w; }
  // Elements of one sample's column matrix (all groups).
  constexpr index_t col_size() const { return channels * kernel_h * kernel_w * out_plane(); }
  // A 1x1 kernel with unit stride and no padding reads the input as its own column matrix.
  constexpr bool pointwise() const {
    return kernel_h == 1 && kernel_w == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 && pad_w == 0 &&
           out_height == height && out_width == width;
  }
};

// The output extent of a window sweep (PyTorch's formula): floor or ceil of
// (in + 2 pad - dilation (k - 1) - 1) / stride, plus one; in ceil mode the last window must start inside the input or
// the left padding.
constexpr index_t window_output_size(index_t in, index_t kernel, index_t stride, index_t pad, index_t dilation,
                                     bool ceil_mode = false) {
  index_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  if (span < 0) return 0;
  index_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

}  // namespace kiln::kernels::cpu
