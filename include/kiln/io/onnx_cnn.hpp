// ONNX export of the convolutional-network layers, for both modes (kiln/io/onnx.hpp has the table of operators):
// Conv2D / nn::Conv2d, MaxPool2D, AvgPool2D, global average pooling, BatchNorm1d / 2d, LayerNorm and Dropout. Each
// onnx_* function checks the current value's per-sample shape ((channels, height, width) for the 2-d layers), writes
// the layer's nodes and initializers and moves the builder on; static mode's onnx_emit overloads at the end and
// dynamic mode's dispatch (kiln/io/onnx_dynamic.hpp) call them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/onnx_builder.hpp"
#include "kiln/layers/avgpool2d.hpp"
#include "kiln/layers/batchnorm.hpp"
#include "kiln/layers/conv2d.hpp"
#include "kiln/layers/dropout.hpp"
#include "kiln/layers/global_avg_pool2d.hpp"
#include "kiln/layers/layernorm.hpp"
#include "kiln/layers/maxpool2d.hpp"

namespace kiln::io {

namespace detail {
inline void check_image(const onnx_builder& b, const char* layer) {
  if (b.sample_shape().size() != 3 || b.batch_axis() != 0)
    fail("export_onnx: ", layer, " expects input of shape [N, channels, height, width], found a value of shape ",
         b.shape_text());
}
}  // namespace detail

// y = conv(x, weight) + bias with weight (out, in / groups, kernel, kernel) as PyTorch stores it and bias (out) or
// null. same is PyTorch's padding="same" (stride 1), whose odd pixel goes after the end: it is written as the explicit
// pads kiln uses, since ONNX's auto_pad is deprecated and SAME_UPPER would tie the pads to the stride.
inline void onnx_conv2d(onnx_builder& b, const float* weight, const float* bias, index_t in_channels,
                        index_t out_channels, index_t kernel, index_t stride, index_t padding, bool same,
                        index_t dilation, index_t groups) {
  detail::check_image(b, "Conv2d");
  const std::vector<index_t> s = b.sample_shape();
  if (s[0] != in_channels)
    fail("export_onnx: Conv2d expects ", in_channels, " input channels, found a value of shape ", b.shape_text());
  if (out_channels < 1 || kernel < 1 || stride < 1 || dilation < 1 || groups < 1 || padding < 0)
    fail("export_onnx: Conv2d expects positive out_channels, kernel, stride, dilation and groups and a padding >= 0, "
         "found out_channels ", out_channels, ", kernel ", kernel, ", stride ", stride, ", dilation ", dilation,
         ", groups ", groups, ", padding ", padding);
  if (same && stride != 1) fail("export_onnx: Conv2d with padding \"same\" expects stride 1, found stride ", stride);
  if (in_channels % groups != 0 || out_channels % groups != 0)
    fail("export_onnx: Conv2d expects in_channels (", in_channels, ") and out_channels (", out_channels,
         ") divisible by groups (", groups, ")");
  const conv_geometry g = make_conv_geometry(s[0], s[1], s[2], out_channels, kernel, kernel, stride, stride, padding,
                                             padding, dilation, dilation, groups, same);
  if (g.out_height < 1 || g.out_width < 1)
    fail("export_onnx: a Conv2d ", kernel, "x", kernel, " kernel (dilation ", dilation, ", padding ", padding,
         ") does not fit a value of shape ", b.shape_text());
  // "same" pads dilation (kernel - 1) pixels per dimension, g.pad_h of them before the start.
  const index_t pad_end = same ? dilation * (kernel - 1) - g.pad_h : padding;
  const std::vector<index_t> weight_dims{out_channels, in_channels / groups, kernel, kernel};
  std::vector<std::string> inputs{b.current(), b.parameter("weight", weight, weight_dims)};
  if (bias) inputs.push_back(b.parameter("bias", bias, {out_channels}));
  std::string y = b.fresh("conv");
  auto n = onnx_builder::node("Conv", inputs, y);
  onnx_builder::attr_ints(n, "kernel_shape", {kernel, kernel});
  onnx_builder::attr_ints(n, "strides", {stride, stride});
  onnx_builder::attr_ints(n, "pads", {g.pad_h, g.pad_w, pad_end, pad_end});
  onnx_builder::attr_ints(n, "dilations", {dilation, dilation});
  onnx_builder::attr_int(n, "group", groups);
  b.add_node(std::move(n));
  b.set_current(y, {out_channels, g.out_height, g.out_width});
}

// Max or average pooling over kernel x kernel windows, as kiln's MaxPool2D / AvgPool2D (PyTorch's rules). ceil_mode is
// not written as ONNX's attribute: ONNX's shape inference keeps a last window that starts in the end padding, where
// kiln, PyTorch and onnxruntime drop it, so onnx.checker would refuse kiln's output shape. The padding after the end
// is chosen instead so that floor rounding gives kiln's size; that changes no value, since pooling never reads
// padding (max takes -inf there, and an average that counts no padding divides by the input's part of the window).
// An average with count_include_pad divides by the window clipped to the input padded by the layer's padding; where a
// ceil-mode window reaches past that, the layer's padding becomes a Pad node of zeros, counted as input, and the
// pool's own padding after it is counted out.
inline void onnx_pool2d(onnx_builder& b, bool max, index_t kernel, index_t stride, index_t padding, bool ceil_mode,
                        bool count_include_pad) {
  const char* layer = max ? "MaxPool2d" : "AvgPool2d";
  detail::check_image(b, layer);
  if (kernel < 1 || stride < 1 || padding < 0 || 2 * padding > kernel)
    fail("export_onnx: ", layer, " expects a positive kernel and stride and a padding of at most half the kernel, "
         "found kernel ", kernel, ", stride ", stride, ", padding ", padding);
  const std::vector<index_t> s = b.sample_shape();
  const conv_geometry g =
      make_pool_geometry(s[0], s[1], s[2], kernel, kernel, stride, stride, padding, padding, ceil_mode);
  if (g.out_height < 1 || g.out_width < 1 || s[1] + 2 * padding < kernel || s[2] + 2 * padding < kernel)
    fail("export_onnx: a ", layer, " ", kernel, "x", kernel, " window (padding ", padding,
         ") does not fit a value of shape ", b.shape_text());
  // Where the last window ends, past the input: at least the layer's padding (floor rounding then gives kiln's size).
  auto end_pad = [&](index_t in, index_t out) { return std::max(padding, (out - 1) * stride + kernel - in - padding); };
  index_t begin = padding, end_h = end_pad(s[1], g.out_height), end_w = end_pad(s[2], g.out_width);
  bool count_pad = !max && count_include_pad && padding > 0;  // without padding there is none to count
  std::string x = b.current();
  if (count_pad && (end_h > padding || end_w > padding)) {
    std::string amounts = b.int64_initializer("pads", {0, 0, padding, padding, 0, 0, padding, padding});
    std::string padded = b.fresh("pad");
    b.add_node(onnx_builder::node("Pad", {x, amounts}, padded));
    x = padded;
    begin = 0;
    end_h -= padding;
    end_w -= padding;
    count_pad = false;
  }
  std::string y = b.fresh(max ? "max_pool" : "avg_pool");
  auto n = onnx_builder::node(max ? "MaxPool" : "AveragePool", {x}, y);
  onnx_builder::attr_ints(n, "kernel_shape", {kernel, kernel});
  onnx_builder::attr_ints(n, "strides", {stride, stride});
  onnx_builder::attr_ints(n, "pads", {begin, begin, end_h, end_w});
  if (count_pad) onnx_builder::attr_int(n, "count_include_pad", 1);
  b.add_node(std::move(n));
  b.set_current(y, {s[0], g.out_height, g.out_width});
}

// The mean of each channel's plane: (C, H, W) -> (C, 1, 1), then flattened to (C) unless keep_dims
// (nn::AdaptiveAvgPool2d(1) keeps them; GlobalAvgPool2D does not).
inline void onnx_global_avg_pool2d(onnx_builder& b, bool keep_dims) {
  detail::check_image(b, keep_dims ? "AdaptiveAvgPool2d" : "GlobalAvgPool2d");
  std::string y = b.fresh("global_avg_pool");
  b.add_node(onnx_builder::node("GlobalAveragePool", {b.current()}, y));
  b.set_current(y, {b.sample_shape()[0], 1, 1});
  if (!keep_dims) b.flatten();
}

// Evaluation-mode batch norm over the first per-sample dim: (x - running_mean) / sqrt(running_var + eps) * weight +
// bias, each of `features` values. weight and bias are null without affine; ONNX needs them, so ones and zeros.
inline void onnx_batch_norm(onnx_builder& b, bool two_d, index_t features, const float* weight, const float* bias,
                            const float* running_mean, const float* running_var, double eps) {
  const std::vector<index_t> s = b.sample_shape();
  const bool fits =
      (two_d ? s.size() == 3 : s.size() == 1 || s.size() == 2) && s[0] == features && b.batch_axis() == 0;
  if (!fits) {
    std::string expected = "[N, " + std::to_string(features) + (two_d ? ", height, width]" : "] or [N, ");
    if (!two_d) expected += std::to_string(features) + ", length]";
    fail("export_onnx: ", two_d ? "BatchNorm2d" : "BatchNorm1d", " expects input of shape ", expected,
         ", found a value of shape ", b.shape_text());
  }
  const std::vector<float> ones(static_cast<std::size_t>(weight ? 0 : features), 1.0f),
      zeros(static_cast<std::size_t>(bias ? 0 : features), 0.0f);
  std::vector<std::string> inputs{
      b.current(), weight ? b.parameter("weight", weight, {features}) : b.initializer("ones", ones.data(), {features}),
      bias ? b.parameter("bias", bias, {features}) : b.initializer("zeros", zeros.data(), {features}),
      b.parameter("running_mean", running_mean, {features}), b.parameter("running_var", running_var, {features})};
  std::string y = b.fresh("batch_norm");
  auto n = onnx_builder::node("BatchNormalization", inputs, y);
  onnx_builder::attr_float(n, "epsilon", static_cast<float>(eps));
  b.add_node(std::move(n));
  b.set_current(y, s);
}

// Each sample's trailing dims `normalized` scaled to zero mean and unit (biased) variance, then times weight plus
// bias (both of shape normalized; null without elementwise affine). LayerNormalization exists from opset 17; below
// it the same formula is written out: ReduceMean, Sub, Mul, ReduceMean, Add eps, Sqrt, Div (then Mul, Add).
inline void onnx_layer_norm(onnx_builder& b, const kiln::shape& normalized, const float* weight, const float* bias,
                            double eps) {
  const std::vector<index_t> s = b.sample_shape();
  // The normalised dims are the value's last ones, which must not reach back to the batch (second in a time-major
  // sequence).
  const auto k = static_cast<std::size_t>(normalized.rank());
  if (k == 0 || k + static_cast<std::size_t>(b.batch_axis()) > s.size() ||
      !std::equal(normalized.begin(), normalized.end(), s.end() - normalized.rank()))
    fail("export_onnx: LayerNorm over ", normalized, " expects input whose last dims are ", normalized,
         ", found a value of shape ", b.shape_text());
  const std::vector<index_t> dims(normalized.begin(), normalized.end());
  const index_t rank = static_cast<index_t>(s.size()) + 1, axis = rank - static_cast<index_t>(k);
  const float epsilon = static_cast<float>(eps);
  std::string x = b.current(), y;
  if (b.opset() >= 17) {
    const std::vector<float> ones(static_cast<std::size_t>(weight ? 0 : normalized.numel()), 1.0f);
    std::vector<std::string> inputs{
        x, weight ? b.parameter("weight", weight, dims) : b.initializer("ones", ones.data(), dims)};
    if (bias) inputs.push_back(b.parameter("bias", bias, dims));
    y = b.fresh("layer_norm");
    auto n = onnx_builder::node("LayerNormalization", inputs, y);
    onnx_builder::attr_int(n, "axis", axis);
    onnx_builder::attr_float(n, "epsilon", epsilon);
    b.add_node(std::move(n));
    b.set_current(y, s);
    return;
  }
  std::vector<index_t> axes;
  for (index_t a = axis; a < rank; ++a) axes.push_back(a);
  auto reduce_mean = [&](const std::string& in, const char* what) {  // axes an attribute up to opset 17
    std::string out = b.fresh(what);
    auto n = onnx_builder::node("ReduceMean", {in}, out);
    onnx_builder::attr_ints(n, "axes", axes);
    b.add_node(std::move(n));
    return out;
  };
  auto binary = [&](const char* op, const std::string& l, const std::string& r, const char* what) {
    std::string out = b.fresh(what);
    b.add_node(onnx_builder::node(op, {l, r}, out));
    return out;
  };
  std::string mean = reduce_mean(x, "ln_mean");
  std::string centred = binary("Sub", x, mean, "ln_centred");
  std::string var = reduce_mean(binary("Mul", centred, centred, "ln_square"), "ln_var");
  std::string plus_eps = binary("Add", var, b.initializer("ln_eps", &epsilon, {}), "ln_var_eps");
  std::string sd = b.fresh("ln_std");
  b.add_node(onnx_builder::node("Sqrt", {plus_eps}, sd));
  y = binary("Div", centred, sd, "layer_norm");
  if (weight) y = binary("Mul", y, b.parameter("weight", weight, dims), "ln_scaled");
  if (bias) y = binary("Add", y, b.parameter("bias", bias, dims), "ln_shifted");
  b.set_current(y, s);
}

// --- static mode: the onnx_emit overloads of these layers (onnx.hpp has the others) ----------------------------------
// params: the layer's state_dict entries in order, as in onnx.hpp.
template <index_t Out, index_t Kernel, conv_options Opt>
void onnx_emit(onnx_builder& b, const Conv2D<Out, Kernel, Opt>&, const std::vector<const Tensor<float>*>& params) {
  const Tensor<float>& w = *params.at(0);
  onnx_conv2d(b, w.data(), Opt.bias ? params.at(1)->data() : nullptr, w.extent(1) * Opt.groups, Out, Kernel,
              Opt.stride, Opt.padding, Opt.same, Opt.dilation, Opt.groups);
}
template <index_t K, index_t S, index_t P, bool Ceil>
void onnx_emit(onnx_builder& b, const MaxPool2D<K, S, P, Ceil>&, const std::vector<const Tensor<float>*>&) {
  onnx_pool2d(b, true, K, S, P, Ceil, false);
}
template <index_t K, index_t S, index_t P, bool Ceil, bool CountIncludePad>
void onnx_emit(onnx_builder& b, const AvgPool2D<K, S, P, Ceil, CountIncludePad>&,
               const std::vector<const Tensor<float>*>&) {
  onnx_pool2d(b, false, K, S, P, Ceil, CountIncludePad);
}
inline void onnx_emit(onnx_builder& b, const GlobalAvgPool2D&, const std::vector<const Tensor<float>*>&) {
  onnx_global_avg_pool2d(b, false);
}
// params: weight and bias (when affine), then the buffers running_mean, running_var and num_batches_tracked.
template <bool TwoD, double Momentum, double Eps, bool Affine>
void onnx_emit(onnx_builder& b, const batch_norm_layer<TwoD, Momentum, Eps, Affine>&,
               const std::vector<const Tensor<float>*>& params) {
  const std::size_t stats = Affine ? 2 : 0;
  const Tensor<float>& mean = *params.at(stats);
  onnx_batch_norm(b, TwoD, mean.numel(), Affine ? params.at(0)->data() : nullptr,
                  Affine ? params.at(1)->data() : nullptr, mean.data(), params.at(stats + 1)->data(), Eps);
}
template <double Eps, bool Affine, index_t... Normalized>
void onnx_emit(onnx_builder& b, const layer_norm_layer<Eps, Affine, Normalized...>&,
               const std::vector<const Tensor<float>*>& params) {
  kiln::shape normalized;
  if constexpr (sizeof...(Normalized) == 0) normalized = kiln::shape::from_range(b.sample_shape().begin(),
                                                                                 b.sample_shape().end());
  else normalized = kiln::shape{Normalized...};
  onnx_layer_norm(b, normalized, Affine ? params.at(0)->data() : nullptr, Affine ? params.at(1)->data() : nullptr,
                  Eps);
}
template <double P>
void onnx_emit(onnx_builder&, const Dropout<P>&, const std::vector<const Tensor<float>*>&) {}

}  // namespace kiln::io
