// nn::MaxPool2d(kernel_size, stride = kernel_size, padding = 0, ceil_mode = false), nn::AvgPool2d(kernel_size,
// stride, padding, ceil_mode, count_include_pad = true), nn::AdaptiveAvgPool2d(1) ([N, C, 1, 1]) and
// nn::GlobalAvgPool2d ([N, C], static mode's GlobalAvgPool2D), as in PyTorch.
#pragma once

#include <string>

#include "kiln/dynamic/functional/conv.hpp"
#include "kiln/dynamic/module.hpp"

namespace kiln::nn {

namespace detail {
inline std::string pool_repr(index_t kernel, index_t stride, index_t padding, bool ceil_mode) {
  std::string s = "kernel_size=";
  s += std::to_string(kernel);
  s += ", stride=";
  s += std::to_string(stride);
  s += ", padding=";
  s += std::to_string(padding);
  s += ceil_mode ? ", ceil_mode=True" : ", ceil_mode=False";
  return s;
}
}  // namespace detail

template <class T>
class basic_max_pool2d : public basic_module<T> {
 public:
  explicit basic_max_pool2d(index_t kernel_size, index_t stride = 0, index_t padding = 0, bool ceil_mode = false)
      : kernel_(kernel_size), stride_(stride > 0 ? stride : kernel_size), padding_(padding), ceil_(ceil_mode) {}
  basic_variable<T> forward(const basic_variable<T>& x) override {
    try {
      return max_pool2d(x, kernel_, stride_, padding_, ceil_);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  std::string name() const override { return "MaxPool2d"; }
  std::string extra_repr() const override { return detail::pool_repr(kernel_, stride_, padding_, ceil_); }
  index_t kernel_size() const { return kernel_; }
  index_t stride() const { return stride_; }
  index_t padding() const { return padding_; }
  bool ceil_mode() const { return ceil_; }

 private:
  index_t kernel_, stride_, padding_;
  bool ceil_;
};

template <class T>
class basic_avg_pool2d : public basic_module<T> {
 public:
  explicit basic_avg_pool2d(index_t kernel_size, index_t stride = 0, index_t padding = 0, bool ceil_mode = false,
                            bool count_include_pad = true)
      : kernel_(kernel_size), stride_(stride > 0 ? stride : kernel_size), padding_(padding), ceil_(ceil_mode),
        include_pad_(count_include_pad) {}
  basic_variable<T> forward(const basic_variable<T>& x) override {
    try {
      return avg_pool2d(x, kernel_, stride_, padding_, ceil_, include_pad_);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  std::string name() const override { return "AvgPool2d"; }
  std::string extra_repr() const override { return detail::pool_repr(kernel_, stride_, padding_, ceil_); }
  index_t kernel_size() const { return kernel_; }
  index_t stride() const { return stride_; }
  index_t padding() const { return padding_; }
  bool ceil_mode() const { return ceil_; }
  bool count_include_pad() const { return include_pad_; }

 private:
  index_t kernel_, stride_, padding_;
  bool ceil_, include_pad_;
};

template <class T>
class basic_adaptive_avg_pool2d : public basic_module<T> {
 public:
  explicit basic_adaptive_avg_pool2d(index_t output_size = 1) : size_(output_size) {
    if (output_size != 1) fail("AdaptiveAvgPool2d: only output_size 1 is supported, found ", output_size);
  }
  basic_variable<T> forward(const basic_variable<T>& x) override {
    try {
      return adaptive_avg_pool2d(x, size_);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  std::string name() const override { return "AdaptiveAvgPool2d"; }
  std::string extra_repr() const override { return "output_size=1"; }

 private:
  index_t size_;
};

template <class T>
class basic_global_avg_pool2d : public basic_module<T> {
 public:
  basic_variable<T> forward(const basic_variable<T>& x) override {
    try {
      return global_avg_pool2d(x);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  std::string name() const override { return "GlobalAvgPool2d"; }
};

using MaxPool2d = basic_max_pool2d<float>;
using AvgPool2d = basic_avg_pool2d<float>;
using AdaptiveAvgPool2d = basic_adaptive_avg_pool2d<float>;
using GlobalAvgPool2d = basic_global_avg_pool2d<float>;

}  // namespace kiln::nn
