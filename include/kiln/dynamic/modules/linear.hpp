// nn::Linear(in_features, out_features, bias = true): y = x W^T + b with W of shape (out, in), as torch.nn.Linear.
#pragma once

#include <span>
#include <string>

#include "kiln/core/random.hpp"
#include "kiln/dynamic/functional/linear.hpp"
#include "kiln/dynamic/module.hpp"
#include "kiln/layers/dense.hpp"

namespace kiln::nn {

template <class T>
class basic_linear : public basic_module<T> {
 public:
  using variable = basic_variable<T>;

  // Initialised as PyTorch does (dense_init), from kiln::next_init_generator(): after kiln::manual_seed(S) the k-th
  // module with parameters gets stream k of S, as the k-th parameterised layer of a static Sequential seeded with S.
  basic_linear(index_t in_features, index_t out_features, bool bias = true)
      : in_(in_features), out_(out_features) {
    if (in_features < 0 || out_features < 0)
      fail("Linear: expected non-negative in_features and out_features, found ", in_features, " and ", out_features);
    Tensor<T> w(kiln::shape{out_features, in_features});
    Tensor<T> b(kiln::shape{bias ? out_features : 0});
    weight = this->register_parameter("weight", w);
    if (bias) this->bias = this->register_parameter("bias", b);
    random_generator rng = this->take_init_generator();
    reset_parameters(rng);
  }

  variable forward(const variable& x) override {
    if (!x.defined() || x.dim() < 1 || x.shape()[x.dim() - 1] != in_)
      fail(describe(), ": expected input of shape [*, ", in_, "], found ",
           x.defined() ? x.shape().str() : std::string("an empty Variable"));
    return linear(x, weight, bias);
  }

  std::string name() const override { return "Linear"; }
  std::string extra_repr() const override {
    return "in_features=" + std::to_string(in_) + ", out_features=" + std::to_string(out_) +
           (bias.defined() ? "" : ", bias=false");
  }
  using basic_module<T>::describe;
  // PyTorch's default Linear initialisation (dense_init, the function static mode's Dense uses).
  void reset_parameters(random_generator& rng) override {
    detail::host_values<T> w(weight), b(bias);
    dense_init<T>(w.span(), b.span(), in_, rng);
    w.write_back();
    b.write_back();
  }
  index_t in_features() const { return in_; }
  index_t out_features() const { return out_; }

  variable weight;  // (out_features, in_features)
  variable bias;    // (out_features), or empty when constructed with bias = false

 private:
  index_t in_, out_;
};

using Linear = basic_linear<float>;

}  // namespace kiln::nn
