// conv2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d(1) and global_avg_pool2d (PyTorch's F.* over NCHW data). Each
// calls the layer functions static mode's Conv2D / MaxPool2D / AvgPool2D / GlobalAvgPool2D call, so both modes
// compute the same numbers. The window geometry (and, for conv2d, the column matrices the backward reuses) is
// saved in a node the tape keeps.
#pragma once

#include <cstring>
#include <string>

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/layers/avgpool2d.hpp"
#include "kiln/layers/conv2d.hpp"
#include "kiln/layers/global_avg_pool2d.hpp"
#include "kiln/layers/maxpool2d.hpp"

namespace kiln::nn {

// A convolution's padding: a number of pixels on every side, or "same" (output as large as the input; stride 1)
// or "valid" (none), as PyTorch's padding argument.
struct conv_padding {
  index_t value = 0;
  bool same = false;
  conv_padding(int pixels = 0) : value(pixels) {}  // NOLINT: implicit, as PyTorch's int argument
  conv_padding(index_t pixels) : value(pixels) {}  // NOLINT
  conv_padding(const char* mode) {                 // NOLINT
    std::string m = mode ? mode : "";
    if (m == "same") same = true;
    else if (m != "valid") fail("conv2d: padding must be a number of pixels, \"same\" or \"valid\", found \"", m, "\"");
  }
};

namespace detail {

inline constexpr index_t geometry_fields = 15;

// The geometry as T values at the start of a saved node (small integers: exact in float). The node is in the
// policy's memory, so the values go through a host array (on a GPU, a copy each way; the load waits).
template <class T>
void store_geometry(T* out, const conv_geometry& g) {
  const index_t f[geometry_fields] = {g.channels,   g.height,   g.width,    g.out_channels, g.out_height,
                                      g.out_width,  g.kernel_h, g.kernel_w, g.stride_h,     g.stride_w,
                                      g.pad_h,      g.pad_w,    g.dilation_h, g.dilation_w, g.groups};
  T values[geometry_fields];
  for (index_t i = 0; i < geometry_fields; ++i) values[i] = static_cast<T>(f[i]);
  copy_values_from_host(values, out, geometry_fields);
}
template <class T>
conv_geometry load_geometry(const T* in) {
  T values[geometry_fields];
  copy_values_to_host(in, values, geometry_fields);
  index_t f[geometry_fields];
  for (index_t i = 0; i < geometry_fields; ++i) f[i] = static_cast<index_t>(values[i]);
  conv_geometry g;
  g.channels = f[0];
  g.height = f[1];
  g.width = f[2];
  g.out_channels = f[3];
  g.out_height = f[4];
  g.out_width = f[5];
  g.kernel_h = f[6];
  g.kernel_w = f[7];
  g.stride_h = f[8];
  g.stride_w = f[9];
  g.pad_h = f[10];
  g.pad_w = f[11];
  g.dilation_h = f[12];
  g.dilation_w = f[13];
  g.groups = f[14];
  return g;
}
// A node that only the tape holds: saved values, no gradient.
template <class T>
basic_variable<T> saved_node(index_t count) {
  return basic_variable<T>::adopt(make_node<T>(kiln::shape{count}, false, true));
}

inline void check_nchw(const kiln::shape& s, const char* op) {
  if (s.rank() != 4) fail(op, ": expected input of shape [batch, channels, height, width], found ", s);
}

// in: x, weight, bias (or null), saved (geometry, then the column matrices).
template <class T>
void conv2d_backward_entry(const tape_entry<T>& e) {
  using P = dynamic_policy;
  variable_node<T>*x = e.in[0], *w = e.in[1], *b = e.in[2], *saved = e.in[3];
  const conv_geometry g = load_geometry(saved->value);
  const index_t batch = x->shape[0];
  T* col = saved->value + geometry_fields;
  T* dweight = zeroed_grad_for(w);
  T* dbias = zeroed_grad_for(b);
  grad_target<T> dx = grad_target_for(x);
  if (dx.data && dx.accumulate) {
    scratch_buffer<T> scratch(x->shape.numel());
    conv2d_backward<P>(x->value, w->value, e.out->grad, scratch.data(), dweight, dbias, col, batch, g, true);
    P::accumulate(scratch.data(), dx.data, x->shape.numel());
  } else {
    conv2d_backward<P>(x->value, w->value, e.out->grad, dx.data, dweight, dbias, col, batch, g, true);
  }
}

// in: x, saved geometry. aux: 0 max, 1 average with count_include_pad, 2 average without, 3 global average.
template <class T>
void pool_backward_entry(const tape_entry<T>& e) {
  using P = dynamic_policy;
  variable_node<T>* x = e.in[0];
  auto dx = grad_target_for(x);
  if (!dx.data) return;
  const index_t batch = x->shape[0];
  if (e.aux == 3) {
    global_avg_pool2d_backward<P>(e.out->grad, dx.data, batch, x->shape[1], x->shape[2] * x->shape[3],
                                  dx.accumulate);
    return;
  }
  const conv_geometry g = load_geometry(e.in[1]->value);
  if (e.aux == 0) max_pool2d_backward<P>(x->value, e.out->value, e.out->grad, dx.data, batch, g, dx.accumulate);
  else avg_pool2d_backward<P>(e.out->grad, dx.data, batch, g, e.aux == 1, dx.accumulate);
}

template <class T>
basic_variable<T> pool_op(const basic_variable<T>& x, const conv_geometry& g, int kind, const char* op) {
  auto* xn = node_of(x, op);
  const index_t batch = xn->shape[0];
  bool record = should_record<T>({xn});
  auto y = make_output<T>(kiln::shape{batch, g.channels, g.out_height, g.out_width}, record);
  if (kind == 0) max_pool2d_forward<dynamic_policy>(xn->value, y.data(), batch, g);
  else avg_pool2d_forward<dynamic_policy>(xn->value, y.data(), batch, g, kind == 1);
  if (record) {
    auto saved = saved_node<T>(geometry_fields);
    store_geometry(saved.data(), g);
    tape<T>::instance().record(&pool_backward_entry<T>, y.node(), xn, saved.node(), nullptr, T(0), kind);
  }
  return y;
}

inline conv_geometry pool_geometry(const kiln::shape& s, index_t kernel, index_t stride, index_t padding,
                                   bool ceil_mode, const char* op) {
  check_nchw(s, op);
  if (stride <= 0) stride = kernel;
  if (kernel <= 0 || padding < 0 || 2 * padding > kernel)
    fail(op, ": expected a positive kernel and a padding of at most half of it, found kernel ", kernel,
         " and padding ", padding);
  conv_geometry g = make_pool_geometry(s[1], s[2], s[3], kernel, kernel, stride, stride, padding, padding, ceil_mode);
  if (g.out_height < 1 || g.out_width < 1 || s[2] + 2 * padding < kernel || s[3] + 2 * padding < kernel)
    fail(op, ": a ", kernel, "x", kernel, " window (padding ", padding, ") does not fit input ", s);
  return g;
}

}  // namespace detail

// PyTorch's F.conv2d: x [N, C, H, W], weight [O, C / groups, kh, kw], bias [O] or an empty handle.
template <class T>
basic_variable<T> conv2d(const basic_variable<T>& x, const basic_variable<T>& weight,
                         const basic_variable<T>& bias = {}, index_t stride = 1, conv_padding padding = 0,
                         index_t dilation = 1, index_t groups = 1) {
  auto* xn = detail::node_of(x, "conv2d");
  auto* wn = detail::node_of(weight, "conv2d");
  auto* bn = bias.defined() ? bias.node() : nullptr;
  const kiln::shape& xs = xn->shape;
  const kiln::shape& ws = wn->shape;
  detail::check_nchw(xs, "conv2d");
  if (ws.rank() != 4) fail("conv2d: expected a weight of shape [out, in / groups, kh, kw], found ", ws);
  if (stride < 1 || dilation < 1 || groups < 1 || padding.value < 0)
    fail("conv2d: expected positive stride, dilation and groups and a non-negative padding, found stride ", stride,
         ", dilation ", dilation, ", groups ", groups, ", padding ", padding.value);
  if (padding.same && stride != 1) fail("conv2d: padding \"same\" needs stride 1, found stride ", stride);
  if (xs[1] % groups != 0 || ws[0] % groups != 0 || ws[1] * groups != xs[1])
    fail("conv2d: input ", xs, " and weight ", ws, " do not fit groups=", groups,
         " (channels = weight.shape[1] * groups, and both channel counts divisible by groups)");
  if (bn && !(bn->shape.rank() == 1 && bn->shape[0] == ws[0]))
    fail("conv2d: expected a bias of shape [", ws[0], "], found ", bn->shape);
  const conv_geometry g = make_conv_geometry(xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], stride, stride, padding.value,
                                             padding.value, dilation, dilation, groups, padding.same);
  if (g.out_height < 1 || g.out_width < 1)
    fail("conv2d: a ", ws[2], "x", ws[3], " kernel (dilation ", dilation, ", padding ", padding.value,
         ") does not fit input ", xs);
  const index_t batch = xs[0];
  bool record = detail::should_record<T>({xn, wn, bn});
  auto y = detail::make_output<T>(kiln::shape{batch, g.out_channels, g.out_height, g.out_width}, record);
  const T* bias_values = bn ? bn->value : nullptr;
  const index_t col_count = conv2d_col_size(g, batch);
  if (record) {
    auto saved = detail::saved_node<T>(detail::geometry_fields + col_count);
    detail::store_geometry(saved.data(), g);
    conv2d_forward<dynamic_policy>(xn->value, wn->value, bias_values, y.data(), saved.data() + detail::geometry_fields,
                                   batch, g);
    detail::tape<T>::instance().record(&detail::conv2d_backward_entry<T>, y.node(), xn, wn, bn, T(0), 0,
                                       saved.node());
  } else {
    detail::scratch_buffer<T> col(col_count);
    conv2d_forward<dynamic_policy>(xn->value, wn->value, bias_values, y.data(), col.data(), batch, g);
  }
  return y;
}

// PyTorch's F.max_pool2d with square windows (stride 0 means the kernel size).
template <class T>
basic_variable<T> max_pool2d(const basic_variable<T>& x, index_t kernel, index_t stride = 0, index_t padding = 0,
                             bool ceil_mode = false) {
  auto g = detail::pool_geometry(detail::node_of(x, "max_pool2d")->shape, kernel, stride, padding, ceil_mode,
                                 "max_pool2d");
  return detail::pool_op(x, g, 0, "max_pool2d");
}
// PyTorch's F.avg_pool2d with square windows.
template <class T>
basic_variable<T> avg_pool2d(const basic_variable<T>& x, index_t kernel, index_t stride = 0, index_t padding = 0,
                             bool ceil_mode = false, bool count_include_pad = true) {
  auto g = detail::pool_geometry(detail::node_of(x, "avg_pool2d")->shape, kernel, stride, padding, ceil_mode,
                                 "avg_pool2d");
  return detail::pool_op(x, g, count_include_pad ? 1 : 2, "avg_pool2d");
}

// The mean of each channel's plane: [N, C, H, W] -> [N, C] (static mode's GlobalAvgPool2D).
template <class T>
basic_variable<T> global_avg_pool2d(const basic_variable<T>& x) {
  auto* xn = detail::node_of(x, "global_avg_pool2d");
  detail::check_nchw(xn->shape, "global_avg_pool2d");
  const index_t batch = xn->shape[0], channels = xn->shape[1];
  bool record = detail::should_record<T>({xn});
  auto y = detail::make_output<T>(kiln::shape{batch, channels}, record);
  global_avg_pool2d_forward<dynamic_policy>(xn->value, y.data(), batch, channels, xn->shape[2] * xn->shape[3]);
  if (record)
    detail::tape<T>::instance().record(&detail::pool_backward_entry<T>, y.node(), xn, nullptr, nullptr, T(0), 3);
  return y;
}
// PyTorch's F.adaptive_avg_pool2d for output size 1: [N, C, H, W] -> [N, C, 1, 1].
template <class T>
basic_variable<T> adaptive_avg_pool2d(const basic_variable<T>& x, index_t output_size = 1) {
  if (output_size != 1) fail("adaptive_avg_pool2d: only output_size 1 is supported, found ", output_size);
  auto* xn = detail::node_of(x, "adaptive_avg_pool2d");
  detail::check_nchw(xn->shape, "adaptive_avg_pool2d");
  const index_t batch = xn->shape[0], channels = xn->shape[1];
  bool record = detail::should_record<T>({xn});
  auto y = detail::make_output<T>(kiln::shape{batch, channels, 1, 1}, record);
  global_avg_pool2d_forward<dynamic_policy>(xn->value, y.data(), batch, channels, xn->shape[2] * xn->shape[3]);
  if (record)
    detail::tape<T>::instance().record(&detail::pool_backward_entry<T>, y.node(), xn, nullptr, nullptr, T(0), 3);
  return y;
}

}  // namespace kiln::nn
