// Activation modules (ReLU, LeakyReLU, GELU, Sigmoid, Tanh, Identity): parameter-free wrappers over the functional ops.
#pragma once

#include <sstream>
#include <string>

#include "kiln/dynamic/functional/activation.hpp"
#include "kiln/dynamic/module.hpp"

namespace kiln::nn {

// max(x, 0).
template <class T>
class basic_relu : public basic_module<T> {
 public:
  basic_variable<T> forward(const basic_variable<T>& x) override { return relu(x); }
  std::string name() const override { return "ReLU"; }
};

// x for x > 0, negative_slope * x otherwise; negative_slope must not be negative (kiln::error, as nn::leaky_relu).
template <class T>
class basic_leaky_relu : public basic_module<T> {
 public:
  explicit basic_leaky_relu(T negative_slope = T(0.01)) : slope_(negative_slope) {
    detail::check_negative_slope(negative_slope, "LeakyReLU");
  }
  basic_variable<T> forward(const basic_variable<T>& x) override { return leaky_relu(x, slope_); }
  std::string name() const override { return "LeakyReLU"; }
  std::string extra_repr() const override {
    std::ostringstream s;
    s << "negative_slope=" << slope_;
    return s.str();
  }
  T negative_slope() const { return slope_; }

 private:
  T slope_;
};

// x * Phi(x) (exact erf form).
template <class T>
class basic_gelu : public basic_module<T> {
 public:
  basic_variable<T> forward(const basic_variable<T>& x) override { return gelu(x); }
  std::string name() const override { return "GELU"; }
};

// 1 / (1 + exp(-x)).
template <class T>
class basic_sigmoid : public basic_module<T> {
 public:
  basic_variable<T> forward(const basic_variable<T>& x) override { return sigmoid(x); }
  std::string name() const override { return "Sigmoid"; }
};

// tanh(x).
template <class T>
class basic_tanh : public basic_module<T> {
 public:
  basic_variable<T> forward(const basic_variable<T>& x) override { return nn::tanh(x); }
  std::string name() const override { return "Tanh"; }
};

// The input unchanged (the same handle: nothing is recorded).
template <class T>
class basic_identity : public basic_module<T> {
 public:
  basic_variable<T> forward(const basic_variable<T>& x) override { return x; }
  std::string name() const override { return "Identity"; }
};

using ReLU = basic_relu<float>;
using LeakyReLU = basic_leaky_relu<float>;
using GELU = basic_gelu<float>;
using Sigmoid = basic_sigmoid<float>;
using Tanh = basic_tanh<float>;
using Identity = basic_identity<float>;

}  // namespace kiln::nn
