// Flatten(start_dim = 1, end_dim = -1): merges dimensions into one without copying, as torch.nn.Flatten.
#pragma once

#include <string>

#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/dynamic/module.hpp"

namespace kiln::nn {

template <class T>
class basic_flatten : public basic_module<T> {
 public:
  explicit basic_flatten(int start_dim = 1, int end_dim = -1) : start_(start_dim), end_(end_dim) {}
  basic_variable<T> forward(const basic_variable<T>& x) override {
    try {
      return flatten(x, start_, end_);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  std::string name() const override { return "Flatten"; }
  int start_dim() const { return start_; }
  int end_dim() const { return end_; }
  std::string extra_repr() const override {
    return "start_dim=" + std::to_string(start_) + ", end_dim=" + std::to_string(end_);
  }

 private:
  int start_, end_;
};

using Flatten = basic_flatten<float>;

}  // namespace kiln::nn
