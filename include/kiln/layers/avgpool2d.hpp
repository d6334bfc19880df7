// AvgPool2D (PyTorch's AvgPool2d) over NCHW data: kernel, stride, zero padding, ceil mode, and count_include_pad
// (PyTorch's default true: the divisor counts the padding, though never window parts past the padded input).
#pragma once

#include <string>

#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/pool_common.hpp"

namespace kiln {

template <class Policy, class T>
void avg_pool2d_forward(const T* x, T* y, index_t batch, const conv_geometry& g, bool count_include_pad = true) {
  Policy::avg_pool_forward(x, y, batch * g.channels, g, count_include_pad);
}
template <class Policy, class T>
void avg_pool2d_backward(const T* dy, T* dx, index_t batch, const conv_geometry& g, bool count_include_pad = true,
                         bool accumulate = false) {
  Policy::avg_pool_backward(dy, dx, batch * g.channels, g, count_include_pad, accumulate);
}

// Static-mode AvgPool2D with K x K windows, stride S (default K) and padding P.
template <index_t K, index_t S = K, index_t P = 0, bool Ceil = false, bool CountIncludePad = true>
struct AvgPool2D {
  static_assert(K > 0 && S > 0 && P >= 0, "kiln::AvgPool2D<K, S, P>: K and S must be positive, P not negative");
  static_assert(2 * P <= K, "kiln::AvgPool2D<K, S, P>: the padding must be at most half the kernel (as in PyTorch)");
  static constexpr const char* name = "AvgPool2D";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = detail::static_pool_accepts<In, K, S, P, Ceil>();
  static constexpr const char* requirement = "a (channels, height, width) input at least as large as the window";

  template <class In>
  struct bind {
    static constexpr conv_geometry g = detail::static_pool_geometry<In, K, S, P, Ceil>();
    using output = dims<g.channels, (g.out_height > 0 ? g.out_height : 1), (g.out_width > 0 ? g.out_width : 1)>;
    static constexpr index_t param_count = 0;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T*, random_generator&) {}
    template <class Policy, class T>
    static void forward(const T*, T*, const T* x, T* y, T*, const layer_context& ctx, bool) {
      avg_pool2d_forward<Policy>(x, y, ctx.batch, g, CountIncludePad);
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T* dy, T* dx, T*, T*, const layer_context& ctx) {
      if (dx) avg_pool2d_backward<Policy>(dy, dx, ctx.batch, g, CountIncludePad);
    }
    static std::string description() { return detail::pool_description("AvgPool2D", K, S, P, Ceil); }
  };
};

}  // namespace kiln
