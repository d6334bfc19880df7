// MaxPool2D (PyTorch's MaxPool2d) over NCHW data: kernel, stride, padding (-inf, at most half the kernel), ceil mode.
// The backward routes each output's gradient to the first maximum of its window, found again from x and y, so
// nothing is saved between the passes.
#pragma once

#include <string>

#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/pool_common.hpp"

namespace kiln {

template <class Policy, class T>
void max_pool2d_forward(const T* x, T* y, index_t batch, const conv_geometry& g) {
  Policy::max_pool_forward(x, y, batch * g.channels, g);
}
// dx (+)= the pooled gradient (accumulate adds, as dynamic mode does when x has other users).
template <class Policy, class T>
void max_pool2d_backward(const T* x, const T* y, const T* dy, T* dx, index_t batch, const conv_geometry& g,
                         bool accumulate = false) {
  Policy::max_pool_backward(x, y, dy, dx, batch * g.channels, g, accumulate);
}

// Static-mode MaxPool2D with K x K windows, stride S (default K) and padding P.
template <index_t K, index_t S = K, index_t P = 0, bool Ceil = false>
struct MaxPool2D {
  static_assert(K > 0 && S > 0 && P >= 0, "kiln::MaxPool2D<K, S, P>: K and S must be positive, P not negative");
  static_assert(2 * P <= K, "kiln::MaxPool2D<K, S, P>: the padding must be at most half the kernel (as in PyTorch)");
  static constexpr const char* name = "MaxPool2D";
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
      max_pool2d_forward<Policy>(x, y, ctx.batch, g);
    }
    template <class Policy, class T>
    static void backward(const T*, const T* x, const T* y, T* dy, T* dx, T*, T*, const layer_context& ctx) {
      if (dx) max_pool2d_backward<Policy>(x, y, dy, dx, ctx.batch, g);
    }
    // The backward with the backward of the activation layer before this one taken in (Sequential, with fused
    // epilogues, where the policy has the kernel): dx is the activation's input gradient (null: none wanted),
    // act_input its input.
    template <class Policy, class T>
      requires requires(const T* c, T* m) {
        Policy::max_pool_activated_backward(c, c, c, m, index_t{}, g, activation::relu, c, T{});
      }
    static void backward_activated(const T*, const T* x, const T* y, T* dy, T* dx, T*, T*, const layer_context& ctx,
                                   activation act, const T* act_input, T slope) {
      if (dx) Policy::max_pool_activated_backward(x, y, dy, dx, ctx.batch * g.channels, g, act, act_input, slope);
    }
    static std::string description() { return detail::pool_description("MaxPool2D", K, S, P, Ceil); }
  };
};

}  // namespace kiln
