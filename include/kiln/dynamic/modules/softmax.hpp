// Softmax(dim) and LogSoftmax(dim) modules. dim has no default (PyTorch's implicit choice is deprecated there).
#pragma once

#include <string>

#include "kiln/dynamic/functional/softmax.hpp"
#include "kiln/dynamic/module.hpp"

namespace kiln::nn {

// softmax, or log_softmax when Log, along a fixed dimension (negative counts from the end).
template <class T, bool Log>
class basic_softmax_module : public basic_module<T> {
 public:
  explicit basic_softmax_module(int dim) : dim_(dim) {}
  basic_variable<T> forward(const basic_variable<T>& x) override {
    if (x.defined() && (dim_ >= x.dim() || dim_ < -x.dim()))
      fail(this->describe(), ": dim ", dim_, " is out of range for an input of shape ", x.shape(), " (expected dim in [",
           -x.dim(), ", ", x.dim() - 1, "])");
    return Log ? log_softmax(x, dim_) : softmax(x, dim_);
  }
  std::string name() const override { return Log ? "LogSoftmax" : "Softmax"; }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim_); }
  int dim() const { return dim_; }

 private:
  int dim_;
};

template <class T>
using basic_softmax = basic_softmax_module<T, false>;
template <class T>
using basic_log_softmax = basic_softmax_module<T, true>;
using Softmax = basic_softmax<float>;
using LogSoftmax = basic_log_softmax<float>;

}  // namespace kiln::nn
