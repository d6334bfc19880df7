// GlobalAvgPool2D: the mean of each channel's plane, (channels, height, width) -> (channels,). PyTorch's
// AdaptiveAvgPool2d(1) followed by a flatten.
#pragma once

#include <string>

#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"

namespace kiln {

template <class Policy, class T>
void global_avg_pool2d_forward(const T* x, T* y, index_t batch, index_t channels, index_t plane) {
  Policy::global_avg_pool_forward(x, y, batch * channels, plane);
}
template <class Policy, class T>
void global_avg_pool2d_backward(const T* dy, T* dx, index_t batch, index_t channels, index_t plane,
                                bool accumulate = false) {
  Policy::global_avg_pool_backward(dy, dx, batch * channels, plane, accumulate);
}

// Static-mode global average pooling.
struct GlobalAvgPool2D {
  static constexpr const char* name = "GlobalAvgPool2D";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = In::rank == 3;
  static constexpr const char* requirement = "a (channels, height, width) input";

  template <class In>
  struct bind {
    static constexpr index_t channels = In::rank == 3 ? In::extents[0] : 1;
    static constexpr index_t plane = In::size / channels;
    using output = dims<channels>;
    static constexpr index_t param_count = 0;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T*, random_generator&) {}
    template <class Policy, class T>
    static void forward(const T*, T*, const T* x, T* y, T*, const layer_context& ctx, bool) {
      global_avg_pool2d_forward<Policy>(x, y, ctx.batch, channels, plane);
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T* dy, T* dx, T*, T*, const layer_context& ctx) {
      if (dx) global_avg_pool2d_backward<Policy>(dy, dx, ctx.batch, channels, plane);
    }
    static std::string description() { return "GlobalAvgPool2D"; }
  };
};

}  // namespace kiln
