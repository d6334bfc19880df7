// nn::Conv2d(in_channels, out_channels, kernel_size, stride = 1, padding = 0, dilation = 1, groups = 1, bias = true),
// as torch.nn.Conv2d (padding may also be "same" or "valid").
#pragma once

#include <span>
#include <string>

#include "kiln/core/random.hpp"
#include "kiln/dynamic/functional/conv.hpp"
#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/dynamic/module.hpp"
#include "kiln/layers/conv2d.hpp"

namespace kiln::nn {

template <class T>
class basic_conv2d : public basic_module<T> {
 public:
  using variable = basic_variable<T>;

  // Initialised as PyTorch does (conv2d_init) from kiln::next_init_generator(), like the k-th parameterised layer of
  // a static Sequential.
  basic_conv2d(index_t in_channels, index_t out_channels, index_t kernel_size, index_t stride = 1,
               conv_padding padding = 0, index_t dilation = 1, index_t groups = 1, bool bias = true)
      : in_(in_channels), out_(out_channels), kernel_(kernel_size), stride_(stride), padding_(padding),
        dilation_(dilation), groups_(groups) {
    if (in_channels <= 0 || out_channels <= 0 || kernel_size <= 0 || groups <= 0 || in_channels % groups ||
        out_channels % groups)
      fail("Conv2d: expected positive channels and kernel, with in_channels (", in_channels, ") and out_channels (",
           out_channels, ") divisible by groups (", groups, ")");
    weight = this->register_parameter(
        "weight", Tensor<T>(kiln::shape{out_channels, in_channels / groups, kernel_size, kernel_size}));
    if (bias) this->bias = this->register_parameter("bias", Tensor<T>(kiln::shape{out_channels}));
    random_generator rng = this->take_init_generator();
    reset_parameters(rng);
  }

  // x: [batch, in_channels, height, width], or one image unbatched, [in_channels, height, width], as PyTorch's Conv2d
  // takes it (the result is then unbatched too).
  variable forward(const variable& x) override {
    const bool unbatched = x.defined() && x.dim() == 3 && x.shape()[0] == in_;
    if (!x.defined() || (!unbatched && (x.dim() != 4 || x.shape()[1] != in_))) {
      // A batch of single-channel images without its channel dimension ([N, 28, 28]) is the usual slip: say how to
      // add it (a static model's Input<1, 28, 28> reads such a batch as that reshape).
      const bool channel_missing = x.defined() && x.dim() == 3 && in_ == 1;
      fail(describe(), ": expected input of shape [batch, ", in_, ", height, width] or an unbatched [", in_,
           ", height, width], found ", x.defined() ? x.shape().str() : std::string("an empty Variable"),
           channel_missing ? " (a batch of single-channel images? add their channel dimension: unsqueeze(x, 1))" : "");
    }
    try {
      if (unbatched) return squeeze(conv2d(unsqueeze(x, 0), weight, bias, stride_, padding_, dilation_, groups_), 0);
      return conv2d(x, weight, bias, stride_, padding_, dilation_, groups_);
    } catch (const error& e) {
      fail(describe(), ": ", e.what());
    }
  }

  std::string name() const override { return "Conv2d"; }
  std::string extra_repr() const override {
    std::string s = std::to_string(in_);
    s += ", ";
    s += std::to_string(out_);
    s += ", kernel_size=(";
    s += std::to_string(kernel_);
    s += ", ";
    s += std::to_string(kernel_);
    s += "), stride=(";
    s += std::to_string(stride_);
    s += ", ";
    s += std::to_string(stride_);
    s += ")";
    if (padding_.same) s += ", padding=same";
    else if (padding_.value) {
      s += ", padding=(";
      s += std::to_string(padding_.value);
      s += ", ";
      s += std::to_string(padding_.value);
      s += ")";
    }
    if (dilation_ != 1) {
      s += ", dilation=";
      s += std::to_string(dilation_);
    }
    if (groups_ != 1) {
      s += ", groups=";
      s += std::to_string(groups_);
    }
    if (!bias.defined()) s += ", bias=False";
    return s;
  }
  using basic_module<T>::describe;
  void reset_parameters(random_generator& rng) override {
    detail::host_values<T> w(weight), b(bias);
    conv2d_init<T>(w.span(), b.span(), in_ / groups_ * kernel_ * kernel_, rng);
    w.write_back();
    b.write_back();
  }

  index_t in_channels() const { return in_; }
  index_t out_channels() const { return out_; }
  index_t kernel_size() const { return kernel_; }
  index_t stride() const { return stride_; }
  const conv_padding& padding() const { return padding_; }
  index_t dilation() const { return dilation_; }
  index_t groups() const { return groups_; }

  variable weight;  // (out_channels, in_channels / groups, kernel_size, kernel_size)
  variable bias;    // (out_channels), or empty

 private:
  index_t in_, out_, kernel_, stride_;
  conv_padding padding_;
  index_t dilation_, groups_;
};

using Conv2d = basic_conv2d<float>;

}  // namespace kiln::nn
