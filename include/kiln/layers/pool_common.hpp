// What the 2-D pooling layers share: the window geometry of a (channels, height, width) input.
#pragma once

#include <string>

#include "kiln/core/static_shape.hpp"
#include "kiln/kernels/cpu/conv.hpp"

namespace kiln {

using kernels::cpu::conv_geometry;
using kernels::cpu::window_output_size;

// Pooling keeps the channels: out_channels = channels, and each (sample, channel) plane is pooled on its own.
constexpr conv_geometry make_pool_geometry(index_t channels, index_t height, index_t width, index_t kernel_h,
                                           index_t kernel_w, index_t stride_h, index_t stride_w, index_t pad_h,
                                           index_t pad_w, bool ceil_mode, index_t dilation_h = 1,
                                           index_t dilation_w = 1) {
  conv_geometry g;
  g.channels = g.out_channels = channels;
  g.height = height;
  g.width = width;
  g.kernel_h = kernel_h;
  g.kernel_w = kernel_w;
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  g.pad_h = pad_h;
  g.pad_w = pad_w;
  g.dilation_h = dilation_h;
  g.dilation_w = dilation_w;
  g.out_height = window_output_size(height, kernel_h, stride_h, pad_h, dilation_h, ceil_mode);
  g.out_width = window_output_size(width, kernel_w, stride_w, pad_w, dilation_w, ceil_mode);
  return g;
}

namespace detail {
// The static pooling layers' geometry for input shape In (a default geometry when In is not 3-D).
template <class In, index_t K, index_t S, index_t P, bool Ceil>
constexpr conv_geometry static_pool_geometry() {
  if constexpr (In::rank == 3)
    return make_pool_geometry(In::extents[0], In::extents[1], In::extents[2], K, K, S, S, P, P, Ceil);
  else
    return conv_geometry{};
}
template <class In, index_t K, index_t S, index_t P, bool Ceil>
constexpr bool static_pool_accepts() {
  if constexpr (In::rank != 3) {
    return false;
  } else {
    constexpr conv_geometry g = static_pool_geometry<In, K, S, P, Ceil>();
    return g.out_height >= 1 && g.out_width >= 1 && In::extents[1] + 2 * P >= K && In::extents[2] + 2 * P >= K;
  }
}
inline std::string pool_description(const char* name, index_t k, index_t s, index_t p, bool ceil) {
  std::string d = name;
  d += "(";
  d += std::to_string(k);
  if (s != k) {
    d += ", stride=";
    d += std::to_string(s);
  }
  if (p) {
    d += ", padding=";
    d += std::to_string(p);
  }
  if (ceil) d += ", ceil_mode";
  d += ")";
  return d;
}
}  // namespace detail

}  // namespace kiln
