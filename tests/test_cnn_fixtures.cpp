// Conv2D, pooling, BatchNorm and LayerNorm against PyTorch's numbers (tests/fixtures, made by
// tests/fixtures/generate.py): forward, input and parameter gradients, batch norm's running statistics after three
// training steps and its evaluation, at relative error <= 1e-5 in float32. The layer functions are the ones both
// modes call; the dynamic modules are checked on the same fixtures.
#include <doctest/doctest.h>

#include <string>

#include "fixture.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using kiln::test::check_close;
using kiln::test::fixture;
using P = policy::cpu;

namespace {
// "x0", "x1", ... built with += (a literal + std::string trips GCC 12's false -Wrestrict at -O3).
std::string step_name(int step) {
  std::string name = "x";
  name += std::to_string(step);
  return name;
}
}  // namespace

TEST_CASE("Conv2D forward and backward match PyTorch (stride, padding, same, dilation, groups, no bias)") {
  for (std::string name : {"conv2d", "conv2d_stride_padding", "conv2d_dilation_groups", "conv2d_same_nobias"}) {
    CAPTURE(name);
    fixture f(name);
    auto x = f.f32("x"), w = f.f32("weight"), dy = f.f32("dy");
    bool has_bias = f.has("bias");
    auto stride = index_t(f.scalar("stride")), padding = index_t(f.scalar("padding"));
    auto dilation = index_t(f.scalar("dilation")), groups = index_t(f.scalar("groups"));
    bool same = padding < 0;
    const index_t batch = x.extent(0);
    conv_geometry g = make_conv_geometry(x.extent(1), x.extent(2), x.extent(3), w.extent(0), w.extent(2), w.extent(3),
                                         stride, stride, same ? 0 : padding, same ? 0 : padding, dilation, dilation,
                                         groups, same);
    Tensor<float> b = has_bias ? f.f32("bias") : Tensor<float>();
    Tensor<float> y(f.shape_of("y")), dx(x.shape()), dw(w.shape()), db(shape{w.extent(0)});
    Tensor<float> col(shape{std::max<index_t>(1, conv2d_col_size(g, batch))});
    conv2d_forward<P>(x.data(), w.data(), has_bias ? b.data() : nullptr, y.data(), col.data(), batch, g);
    check_close(y, f.f32("y"), "y");
    conv2d_backward<P>(x.data(), w.data(), dy.data(), dx.data(), dw.data(), has_bias ? db.data() : nullptr, col.data(),
                       batch, g, false);
    check_close(dx, f.f32("dx"), "dx");
    check_close(dw, f.f32("dweight"), "dweight");
    if (has_bias) check_close(db, f.f32("dbias"), "dbias");

    // The dynamic module, loaded with the fixture's weights.
    nn::Conv2d conv(x.extent(1), w.extent(0), w.extent(2), stride, same ? nn::conv_padding("same") : padding,
                    dilation, groups, has_bias);
    std::vector<std::pair<std::string, Tensor<float>>> dict{{"weight", w}};
    if (has_bias) dict.emplace_back("bias", b);
    conv.load_state_dict(dict);
    nn::Variable xv(x, true);
    auto out = conv(xv);
    check_close(out.value().span(), f.f32("y"), "module y");
    nn::sum(nn::mul(out, nn::Variable(dy))).backward();
    check_close(xv.grad().span(), f.f32("dx"), "module dx");
    check_close(conv.weight.grad().span(), f.f32("dweight"), "module dweight");
  }
}

TEST_CASE("max, average and adaptive average pooling match PyTorch") {
  for (std::string name : {"max_pool2d", "max_pool2d_padding_ceil", "avg_pool2d", "avg_pool2d_padding_ceil",
                           "avg_pool2d_exclude_pad", "adaptive_avg_pool2d"}) {
    CAPTURE(name);
    fixture f(name);
    auto x = f.f32("x"), dy = f.f32("dy");
    Tensor<float> y(f.shape_of("y")), dx(x.shape());
    const index_t batch = x.extent(0);
    nn::Variable xv(x, true);
    nn::Variable out;
    if (name == "adaptive_avg_pool2d") {
      const index_t plane = x.extent(2) * x.extent(3);
      global_avg_pool2d_forward<P>(x.data(), y.data(), batch, x.extent(1), plane);
      global_avg_pool2d_backward<P>(dy.data(), dx.data(), batch, x.extent(1), plane);
      out = nn::AdaptiveAvgPool2d(1)(xv);
    } else {
      auto k = index_t(f.scalar("kernel")), s = index_t(f.scalar("stride")), p = index_t(f.scalar("padding"));
      bool ceil = f.scalar("ceil_mode") != 0, include_pad = f.scalar("count_include_pad") != 0;
      conv_geometry g = make_pool_geometry(x.extent(1), x.extent(2), x.extent(3), k, k, s, s, p, p, ceil);
      REQUIRE(g.out_height == y.extent(2));
      REQUIRE(g.out_width == y.extent(3));
      if (name.starts_with("max")) {
        max_pool2d_forward<P>(x.data(), y.data(), batch, g);
        max_pool2d_backward<P>(x.data(), y.data(), dy.data(), dx.data(), batch, g);
        out = nn::MaxPool2d(k, s, p, ceil)(xv);
      } else {
        avg_pool2d_forward<P>(x.data(), y.data(), batch, g, include_pad);
        avg_pool2d_backward<P>(dy.data(), dx.data(), batch, g, include_pad);
        out = nn::AvgPool2d(k, s, p, ceil, include_pad)(xv);
      }
    }
    check_close(y, f.f32("y"), "y");
    check_close(dx, f.f32("dx"), "dx");
    check_close(out.value().span(), f.f32("y"), "module y");
    nn::sum(nn::mul(out, nn::Variable(dy))).backward();
    check_close(xv.grad().span(), f.f32("dx"), "module dx");
  }
}

TEST_CASE("BatchNorm: three training steps, running statistics and evaluation match PyTorch (both modes)") {
  for (std::string name : {"batch_norm2d", "batch_norm1d", "batch_norm1d_length"}) {
    CAPTURE(name);
    fixture f(name);
    auto w = f.f32("weight"), b = f.f32("bias");
    const kiln::shape s = f.shape_of("x0");
    const index_t batch = s[0], channels = s[1], spatial = s.numel() / (batch * channels);
    // The layer functions (static mode's).
    Tensor<float> buffers(shape{2 * channels + 1});
    batch_norm_init_buffers(buffers.data(), channels);
    batch_norm_state<float> state{buffers.data(), buffers.data() + channels, buffers.data() + 2 * channels};
    Tensor<float> y(s), dx(s), dw(shape{channels}), db(shape{channels}), saved(shape{2 * channels});
    Tensor<float> x;
    for (int step = 0; step < 3; ++step) {
      x = f.f32(step_name(step));
      batch_norm_forward<P>(x.data(), w.data(), b.data(), y.data(), saved.data(), saved.data() + channels, state,
                            batch, channels, spatial, 1e-5f, 0.1f, true);
    }
    check_close(y, f.f32("y"), "y");
    batch_norm_backward<P>(x.data(), w.data(), f.f32("dy").data(), dx.data(), dw.data(), db.data(), saved.data(),
                           saved.data() + channels, batch, channels, spatial, true, false);
    check_close(dx, f.f32("dx"), "dx");
    check_close(dw, f.f32("dweight"), "dweight");
    check_close(db, f.f32("dbias"), "dbias");
    check_close(std::span<const float>(buffers.data(), channels), f.f32("running_mean"), "running_mean");
    check_close(std::span<const float>(buffers.data() + channels, channels), f.f32("running_var"), "running_var");
    CHECK(buffers[2 * channels] == f.scalar("num_batches_tracked"));
    auto ex = f.f32("eval_x");
    batch_norm_forward<P>(ex.data(), w.data(), b.data(), y.data(), saved.data(), saved.data() + channels, state, batch,
                          channels, spatial, 1e-5f, 0.1f, false);
    check_close(y, f.f32("eval_y"), "eval y");
    batch_norm_backward<P>(ex.data(), w.data(), f.f32("eval_dy").data(), dx.data(), dw.data(), db.data(), saved.data(),
                           saved.data() + channels, batch, channels, spatial, false, false);
    check_close(dx, f.f32("eval_dx"), "eval dx");
    check_close(dw, f.f32("eval_dweight"), "eval dweight");
    check_close(db, f.f32("eval_dbias"), "eval dbias");

    // The dynamic module: same steps, same buffers.
    std::shared_ptr<nn::basic_batch_norm<float>> bn;
    if (s.rank() == 4) bn = std::make_shared<nn::BatchNorm2d>(channels);
    else bn = std::make_shared<nn::BatchNorm1d>(channels);
    bn->load_state_dict(std::vector<std::pair<std::string, Tensor<float>>>{{"weight", w}, {"bias", b}}, false);
    nn::Variable last;
    nn::Variable xv;
    for (int step = 0; step < 3; ++step) {
      xv = nn::Variable(f.f32(step_name(step)), true);
      last = (*bn)(xv);
    }
    check_close(last.value().span(), f.f32("y"), "module y");
    nn::sum(nn::mul(last, nn::Variable(f.f32("dy")))).backward();
    check_close(xv.grad().span(), f.f32("dx"), "module dx");
    check_close(bn->weight.grad().span(), f.f32("dweight"), "module dweight");
    check_close(bn->running_mean.value().span(), f.f32("running_mean"), "module running_mean");
    check_close(bn->running_var.value().span(), f.f32("running_var"), "module running_var");
    CHECK(bn->num_batches_tracked.item() == 3.0f);
    bn->eval();
    nn::no_grad guard;
    check_close((*bn)(nn::Variable(ex)).tensor().span(), f.f32("eval_y"), "module eval y");
  }
}

TEST_CASE("LayerNorm forward and backward match PyTorch (both modes)") {
  for (std::string name : {"layer_norm", "layer_norm_last"}) {
    CAPTURE(name);
    fixture f(name);
    auto x = f.f32("x"), w = f.f32("weight"), b = f.f32("bias"), dy = f.f32("dy");
    const index_t cols = w.numel(), rows = x.numel() / cols;
    Tensor<float> y(x.shape()), dx(x.shape()), dw(w.shape()), db(b.shape()), saved(shape{2 * rows});
    layer_norm_forward<P>(x.data(), w.data(), b.data(), y.data(), saved.data(), saved.data() + rows, rows, cols, 1e-5f);
    check_close(y, f.f32("y"), "y");
    layer_norm_backward<P>(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), saved.data(),
                           saved.data() + rows, rows, cols, false);
    check_close(dx, f.f32("dx"), "dx");
    check_close(dw, f.f32("dweight"), "dweight");
    check_close(db, f.f32("dbias"), "dbias");

    nn::LayerNorm ln(w.shape());
    ln.load_state_dict(std::vector<std::pair<std::string, Tensor<float>>>{{"weight", w}, {"bias", b}});
    nn::Variable xv(x, true);
    auto out = ln(xv);
    check_close(out.value().span(), f.f32("y"), "module y");
    nn::sum(nn::mul(out, nn::Variable(dy))).backward();
    check_close(xv.grad().span(), f.f32("dx"), "module dx");
    check_close(ln.weight.grad().span(), f.f32("dweight"), "module dweight");
    check_close(ln.bias.grad().span(), f.f32("dbias"), "module dbias");
  }
}
