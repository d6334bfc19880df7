// nn::BatchNorm1d / nn::BatchNorm2d(num_features, eps = 1e-5, momentum = 0.1, affine = true), nn::LayerNorm
// (normalized_shape, eps = 1e-5, elementwise_affine = true) and nn::Dropout(p = 0.5), as in PyTorch. Batch norm keeps
// running_mean, running_var and num_batches_tracked as buffers (state_dict has them; parameters() does not).
#pragma once

#include <cstdio>
#include <span>
#include <string>

#include "kiln/core/random.hpp"
#include "kiln/dynamic/functional/normalization.hpp"
#include "kiln/dynamic/module.hpp"

namespace kiln::nn {

template <class T>
class basic_batch_norm : public basic_module<T> {
 public:
  using variable = basic_variable<T>;

  // two_d: BatchNorm2d (input [N, C, H, W]); otherwise BatchNorm1d ([N, C] or [N, C, L]).
  basic_batch_norm(bool two_d, index_t num_features, T eps, T momentum, bool affine)
      : two_d_(two_d), features_(num_features), eps_(eps), momentum_(momentum) {
    if (num_features <= 0) fail(name(), ": expected a positive num_features, found ", num_features);
    if (affine) {
      weight = this->register_parameter("weight", Tensor<T>(kiln::shape{num_features}));
      bias = this->register_parameter("bias", Tensor<T>(kiln::shape{num_features}));
      // Like every module with parameters it takes the next init stream, keeping later layers' streams aligned
      // with static mode's (its values are fixed: weight 1, bias 0).
      random_generator rng = this->take_init_generator();
      reset_parameters(rng);
    }
    running_mean = this->register_buffer("running_mean", Tensor<T>(kiln::shape{num_features}));
    running_var = this->register_buffer("running_var", Tensor<T>(kiln::shape{num_features}));
    num_batches_tracked = this->register_buffer("num_batches_tracked", Tensor<T>(kiln::shape{}));
    reset_running_stats();
  }

  variable forward(const variable& x) override {
    bool ok = x.defined() && (two_d_ ? x.dim() == 4 : (x.dim() == 2 || x.dim() == 3)) && x.shape()[1] == features_;
    if (!ok)
      fail(describe(), ": expected input of shape [batch, ", features_,
           two_d_ ? ", height, width]" : "] or [batch, num_features, length]", ", found ",
           x.defined() ? x.shape().str() : std::string("an empty Variable"));
    try {
      return batch_norm(x, running_mean, running_var, weight, bias, this->is_training(), momentum_, eps_,
                        this->is_training() ? num_batches_tracked.data() : nullptr);
    } catch (const error& e) {
      fail(describe(), ": ", e.what());
    }
  }

  void reset_running_stats() {
    dynamic_policy::fill(running_mean.data(), T(0), features_);
    dynamic_policy::fill(running_var.data(), T(1), features_);
    dynamic_policy::fill(num_batches_tracked.data(), T(0), 1);
  }
  void reset_parameters(random_generator&) override {
    if (!weight.defined()) return;
    detail::host_values<T> w(weight), b(bias);
    batch_norm_init<T>(w.span(), b.span());
    w.write_back();
    b.write_back();
  }

  std::string name() const override { return two_d_ ? "BatchNorm2d" : "BatchNorm1d"; }
  std::string extra_repr() const override {
    char text[128];
    std::snprintf(text, sizeof text, "%lld, eps=%g, momentum=%g, affine=%s", static_cast<long long>(features_),
                  static_cast<double>(eps_), static_cast<double>(momentum_), weight.defined() ? "True" : "False");
    return text;
  }
  using basic_module<T>::describe;
  bool is_2d() const { return two_d_; }
  index_t num_features() const { return features_; }
  T eps() const { return eps_; }
  T momentum() const { return momentum_; }

  variable weight, bias;                                  // (num_features) each, or empty without affine
  variable running_mean, running_var, num_batches_tracked;  // buffers

 private:
  bool two_d_;
  index_t features_;
  T eps_, momentum_;
};

template <class T>
class basic_batch_norm1d : public basic_batch_norm<T> {
 public:
  explicit basic_batch_norm1d(index_t num_features, T eps = T(1e-5), T momentum = T(0.1), bool affine = true)
      : basic_batch_norm<T>(false, num_features, eps, momentum, affine) {}
};
template <class T>
class basic_batch_norm2d : public basic_batch_norm<T> {
 public:
  explicit basic_batch_norm2d(index_t num_features, T eps = T(1e-5), T momentum = T(0.1), bool affine = true)
      : basic_batch_norm<T>(true, num_features, eps, momentum, affine) {}
};

template <class T>
class basic_layer_norm : public basic_module<T> {
 public:
  using variable = basic_variable<T>;

  // bias: whether the affine transform has a bias (torch's LayerNorm(bias=False) has a weight alone).
  explicit basic_layer_norm(kiln::shape normalized_shape, T eps = T(1e-5), bool elementwise_affine = true,
                            bool bias = true)
      : shape_(normalized_shape), eps_(eps) {
    if (normalized_shape.rank() < 1 || normalized_shape.numel() <= 0)
      fail("LayerNorm: expected a non-empty normalized_shape, found ", normalized_shape);
    if (elementwise_affine) {
      weight = this->register_parameter("weight", Tensor<T>(normalized_shape));
      if (bias) this->bias = this->register_parameter("bias", Tensor<T>(normalized_shape));
      random_generator rng = this->take_init_generator();
      reset_parameters(rng);
    }
  }
  explicit basic_layer_norm(index_t normalized_size, T eps = T(1e-5), bool elementwise_affine = true,
                            bool bias = true)
      : basic_layer_norm(kiln::shape{normalized_size}, eps, elementwise_affine, bias) {}

  variable forward(const variable& x) override {
    try {
      return layer_norm(x, shape_, weight, bias, eps_);
    } catch (const error& e) {
      fail(describe(), ": ", e.what());
    }
  }
  void reset_parameters(random_generator&) override {
    if (!weight.defined()) return;
    detail::host_values<T> w(weight);
    if (bias.defined()) {
      detail::host_values<T> b(bias);
      layer_norm_init<T>(w.span(), b.span());
      b.write_back();
    } else {
      layer_norm_init<T>(w.span(), std::span<T>());
    }
    w.write_back();
  }
  std::string name() const override { return "LayerNorm"; }
  std::string extra_repr() const override {
    std::string s = shape_.str();
    char text[96];
    std::snprintf(text, sizeof text, ", eps=%g, elementwise_affine=%s", static_cast<double>(eps_),
                  weight.defined() ? "True" : "False");
    s += text;
    return s;
  }
  using basic_module<T>::describe;
  const kiln::shape& normalized_shape() const { return shape_; }
  T eps() const { return eps_; }

  variable weight, bias;

 private:
  kiln::shape shape_;
  T eps_;
};

// Masks come from the module's own generator, kiln::next_runtime_generator() at construction: the k-th Dropout (or
// other module that draws at run time) after kiln::manual_seed(S) draws from stream runtime_stream_base + k of S, as
// the k-th such layer of a static Sequential with seed S does, so both modes draw the same masks.
template <class T>
class basic_dropout : public basic_module<T> {
 public:
  explicit basic_dropout(T p = T(0.5))
      : p_(p), rng_(next_runtime_generator()) {
    if (!(p >= T(0) && p <= T(1))) fail("Dropout: expected p in [0, 1], found ", p);
  }
  basic_variable<T> forward(const basic_variable<T>& x) override { return dropout(x, p_, this->is_training(), rng_); }
  std::string name() const override { return "Dropout"; }
  std::string extra_repr() const override {
    char text[64];
    std::snprintf(text, sizeof text, "p=%g, inplace=False", static_cast<double>(p_));
    return text;
  }
  random_generator& generator() { return rng_; }
  T p() const { return p_; }

 protected:
  random_generator* own_runtime_generator() override { return &rng_; }

 private:
  T p_;
  random_generator rng_;
};

using BatchNorm1d = basic_batch_norm1d<float>;
using BatchNorm2d = basic_batch_norm2d<float>;
using LayerNorm = basic_layer_norm<float>;
using Dropout = basic_dropout<float>;

}  // namespace kiln::nn
