// Conv2D (PyTorch's Conv2d) over NCHW data: stride, zero padding (explicit or "same"), dilation, groups, optional
// bias. The math lives in the policy's conv2d_forward / conv2d_backward kernels: on the CPU (and policy::cuda) im2col
// of each sample into a column matrix, then one GEMM per group (a 1x1 kernel with unit stride reads the input
// directly); policy::cudnn calls cuDNN. Static mode's kiln::Conv2D and dynamic mode's nn::Conv2d both call
// conv2d_forward and conv2d_backward; the column-matrix scratch lives in the layer's scratch (static) or in a node
// the tape keeps (dynamic). policy::cuda keeps the batch's column matrices there for the backward; the CPU kernels
// build each sample's again, in cache.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kiln/core/init.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/kernels/cpu/conv.hpp"
#include "kiln/layers/dense.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"

namespace kiln {

using kernels::cpu::conv_geometry;
using kernels::cpu::window_output_size;

// The geometry of a convolution of a (channels, height, width) sample with out_channels square or rectangular
// kernels. With same, the padding keeps the spatial size (stride 1 only), the odd extra pixel after the end as in
// PyTorch's padding="same".
constexpr conv_geometry make_conv_geometry(index_t channels, index_t height, index_t width, index_t out_channels,
                                           index_t kernel_h, index_t kernel_w, index_t stride_h, index_t stride_w,
                                           index_t pad_h, index_t pad_w, index_t dilation_h, index_t dilation_w,
                                           index_t groups, bool same = false) {
  conv_geometry g;
  g.channels = channels;
  g.height = height;
  g.width = width;
  g.out_channels = out_channels;
  g.kernel_h = kernel_h;
  g.kernel_w = kernel_w;
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  g.dilation_h = dilation_h;
  g.dilation_w = dilation_w;
  g.groups = groups;
  if (same) {
    g.pad_h = dilation_h * (kernel_h - 1) / 2;
    g.pad_w = dilation_w * (kernel_w - 1) / 2;
    g.out_height = height;
    g.out_width = width;
  } else {
    g.pad_h = pad_h;
    g.pad_w = pad_w;
    g.out_height = window_output_size(height, kernel_h, stride_h, pad_h, dilation_h);
    g.out_width = window_output_size(width, kernel_w, stride_w, pad_w, dilation_w);
  }
  return g;
}

// Elements of column-matrix scratch for a batch (none for pointwise convolutions).
constexpr index_t conv2d_col_size(const conv_geometry& g, index_t batch) {
  return g.pointwise() ? 0 : g.col_size() * batch;
}

// y[n, o, :, :] = sum over the group's channels and the window of weight[o, c, i, j] x[n, c, ...] + bias[o].
// weight is (out_channels, channels / groups, kernel_h, kernel_w); bias may be null; col holds conv2d_col_size(g,
// batch) elements (null for pointwise) of column-matrix scratch, handed to the backward as it was left (policies that
// convolve without it, as cuDNN does, leave it alone). The policy's conv2d_forward does the work, with Policy's own
// GEMM. act, when not identity, is applied to y as well: by the policy's convolution where it takes an activation (the
// CPU's, per sample while the output is in cache), else by a pass after it.
template <class Policy, class T>
void conv2d_forward(const T* x, const T* weight, const T* bias, T* y, T* col, index_t batch, const conv_geometry& g,
                    activation act = activation::identity, T slope = T(0)) {
  if constexpr (requires { Policy::template conv2d_forward<Policy>(x, weight, bias, y, col, batch, g, act, slope); }) {
    Policy::template conv2d_forward<Policy>(x, weight, bias, y, col, batch, g, act, slope);
  } else {
    Policy::template conv2d_forward<Policy>(x, weight, bias, y, col, batch, g);
    if (act != activation::identity) Policy::activation_forward(act, y, y, batch * g.out_size(), slope);
  }
}

// Given dL/dy: dweight (+)= sum over samples of dy_n col_n^T, dbias (+)= channel sums of dy (accumulate adds, as
// dynamic mode's .grad; static mode overwrites), and dx = col2im(weight^T dy_n) (overwritten; skipped when null).
// col must be the scratch the forward was given, as the forward left it; the backward overwrites it.
template <class Policy, class T>
void conv2d_backward(const T* x, const T* weight, const T* dy, T* dx, T* dweight, T* dbias, T* col, index_t batch,
                     const conv_geometry& g, bool accumulate) {
  Policy::template conv2d_backward<Policy>(x, weight, dy, dx, dweight, dbias, col, batch, g, accumulate);
}

// PyTorch's Conv2d initialisation: kaiming_uniform(a = sqrt(5)) over fan_in = channels / groups * kh * kw, which is
// Linear's default (dense_init), and the bias U(+-1/sqrt(fan_in)).
template <class T>
void conv2d_init(std::span<T> weight, std::span<T> bias, index_t fan_in, random_generator& rng) {
  dense_init<T>(weight, bias, fan_in, rng);
}

// The options of a static Conv2D, a structural type usable as a template argument:
//   kiln::Conv2D<64, 3, kiln::conv_options{.padding = 1}>   kiln::Conv2D<32, 5, kiln::conv_options{.same = true}>
struct conv_options {
  index_t stride = 1;
  index_t padding = 0;
  bool same = false;  // PyTorch's padding="same" (stride 1)
  index_t dilation = 1;
  index_t groups = 1;
  bool bias = true;
};

// Static-mode Conv2D with Out channels and Kernel x Kernel windows over a (channels, height, width) input.
// Parameters in the flat buffer: weight (Out, channels / groups, Kernel, Kernel) then bias (Out).
template <index_t Out, index_t Kernel, conv_options Opt = conv_options{}>
struct Conv2D {
  static_assert(Out > 0 && Kernel > 0, "kiln::Conv2D<Out, Kernel>: Out and Kernel must be positive");
  static_assert(Opt.stride > 0 && Opt.dilation > 0 && Opt.groups > 0 && Opt.padding >= 0,
                "kiln::Conv2D: stride, dilation and groups must be positive and padding not negative");
  static_assert(!Opt.same || Opt.stride == 1, "kiln::Conv2D: padding \"same\" needs stride 1 (as in PyTorch)");
  static constexpr const char* name = "Conv2D";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr conv_geometry geometry() {
    if constexpr (In::rank == 3)
      return make_conv_geometry(In::extents[0], In::extents[1], In::extents[2], Out, Kernel, Kernel, Opt.stride,
                                Opt.stride, Opt.padding, Opt.padding, Opt.dilation, Opt.dilation, Opt.groups,
                                Opt.same);
    else
      return conv_geometry{};
  }
  template <class In>
  static constexpr bool accepts_shape() {
    if constexpr (In::rank != 3) {
      return false;
    } else {
      constexpr conv_geometry g = geometry<In>();
      return g.channels % Opt.groups == 0 && Out % Opt.groups == 0 && g.out_height >= 1 && g.out_width >= 1 &&
             In::extents[1] + 2 * g.pad_h >= Opt.dilation * (Kernel - 1) + 1 &&
             In::extents[2] + 2 * g.pad_w >= Opt.dilation * (Kernel - 1) + 1;
    }
  }
  template <class In>
  static constexpr bool accepts = accepts_shape<In>();
  static constexpr const char* requirement =
      "a (channels, height, width) input whose padded size holds the (dilated) kernel, with channels and Out "
      "divisible by groups";

  template <class In>
  struct bind {
    static constexpr conv_geometry g = geometry<In>();
    using output = dims<Out, (g.out_height > 0 ? g.out_height : 1), (g.out_width > 0 ? g.out_width : 1)>;
    static constexpr index_t fan_in = g.group_k();
    static constexpr index_t weight_size = Out * fan_in;
    static constexpr index_t param_count = weight_size + (Opt.bias ? Out : 0);
    // The column matrix of each sample, kept from forward to backward.
    static constexpr index_t scratch_per_sample = conv2d_col_size(g, 1);
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T* params, random_generator& rng) {
      conv2d_init<T>({params, weight_size}, {params + weight_size, Opt.bias ? Out : 0}, fan_in, rng);
    }
    template <class Policy, class T>
    static void forward(const T* params, T*, const T* x, T* y, T* scratch, const layer_context& ctx, bool) {
      conv2d_forward<Policy>(x, params, Opt.bias ? params + weight_size : nullptr, y, scratch, ctx.batch, g);
    }
    // The forward with the activation layer that follows fused in (Sequential does this with fused epilogues on):
    // the backward needs only x, never this layer's output, so the output may hold the activation's.
    template <class Policy, class T>
    static void forward_activated(const T* params, T*, const T* x, T* y, T* scratch, const layer_context& ctx,
                                  activation act, T slope) {
      conv2d_forward<Policy>(x, params, Opt.bias ? params + weight_size : nullptr, y, scratch, ctx.batch, g, act,
                             slope);
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      conv2d_backward<Policy>(x, params, dy, dx, dparams, Opt.bias ? dparams + weight_size : nullptr, scratch,
                              ctx.batch, g, false);
    }
    // The backward with the backward of the activation layer before this one taken in (Sequential, with fused
    // epilogues, where the policy's convolution can: the CPU's): dx is the activation's input gradient (null: none
    // wanted), act_input its input; x, this layer's input, is the activation's output.
    template <class Policy, class T>
      requires requires(const T* c, T* m) {
        Policy::template conv2d_backward<Policy>(c, c, c, m, m, m, m, index_t{}, g, false, activation::relu, c, T{});
      }
    static void backward_activated(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                                   const layer_context& ctx, activation act, const T* act_input, T slope) {
      Policy::template conv2d_backward<Policy>(x, params, dy, dx, dparams, Opt.bias ? dparams + weight_size : nullptr,
                                               scratch, ctx.batch, g, false, act, act_input, slope);
    }
    static std::vector<static_parameter_info> parameter_tensors() {
      std::vector<static_parameter_info> tensors{{"weight", shape{Out, g.channels / Opt.groups, Kernel, Kernel}, 0}};
      if constexpr (Opt.bias) tensors.push_back({"bias", shape{Out}, weight_size});
      return tensors;
    }
    static std::string description() {
      std::string d = "Conv2D(";
      d += std::to_string(Kernel);
      d += "x";
      d += std::to_string(Kernel);
      if (Opt.stride != 1) { d += ", stride="; d += std::to_string(Opt.stride); }
      if (Opt.same) d += ", padding=same";
      else if (Opt.padding) { d += ", padding="; d += std::to_string(Opt.padding); }
      if (Opt.dilation != 1) { d += ", dilation="; d += std::to_string(Opt.dilation); }
      if (Opt.groups != 1) { d += ", groups="; d += std::to_string(Opt.groups); }
      d += ")";
      return d;
    }
  };
};

}  // namespace kiln
