// kiln::ensemble: combines the predictions of N models of either mode (static Sequentials, dynamic modules, mixed)
// by averaging their outputs (optionally as softmax probabilities) or by majority vote over their predicted classes.
//
//   kiln::ensemble ens;
//   ens.add(net_a);            // any model with predict() (static) or an nn::Module (dynamic); referenced, not copied
//   ens.add(module_b);
//   Tensor<float> p = ens.predict(x);                       // mean of the softmax probabilities (the default)
//   Tensor<std::int64_t> c = ens.vote(x);                   // majority class; ties go to the higher mean probability
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/dynamic/grad_mode.hpp"
#include "kiln/dynamic/module.hpp"

namespace kiln {

enum class ensemble_average { probabilities, outputs };

class ensemble {
 public:
  using predictor = std::function<Tensor<float>(tensor_view<const float>)>;

  // A static model (anything with predict(x) returning a Tensor<float>), referenced.
  template <class Net>
    requires requires(Net& n, tensor_view<const float> x) {
      { n.predict(x) } -> std::convertible_to<Tensor<float>>;
    } && (!std::derived_from<Net, nn::Module>)
  ensemble& add(Net& net) {
    predictors_.push_back([&net](tensor_view<const float> x) { return net.predict(x); });
    return *this;
  }
  // A dynamic module, run in evaluation mode without gradients (its mode is restored afterwards).
  template <class M>
    requires std::derived_from<M, nn::Module>
  ensemble& add(M& net) {
    predictors_.push_back([&net](tensor_view<const float> x) {
      nn::no_grad guard;
      bool was_training = net.is_training();
      net.eval();
      auto y = net(nn::Variable::borrowing(x));
      net.train(was_training);
      return Tensor<float>(tensor_view<const float>(y.value()));
    });
    return *this;
  }
  // Any function from a batch to outputs of shape (N, classes).
  ensemble& add(predictor p) {
    predictors_.push_back(std::move(p));
    return *this;
  }

  std::size_t size() const { return predictors_.size(); }

  // Model i's outputs.
  Tensor<float> predict_one(std::size_t i, tensor_view<const float> x) const {
    if (i >= predictors_.size()) fail("ensemble: model ", i, " does not exist (", predictors_.size(), " models)");
    Tensor<float> y = predictors_[i](x);
    if (y.rank() != 2) fail("ensemble: model ", i, " gave outputs of shape ", y.shape(), "; expected (N, classes)");
    return y;
  }

  // The mean over the models of their softmax probabilities (or of their raw outputs).
  Tensor<float> predict(tensor_view<const float> x, ensemble_average how = ensemble_average::probabilities) const {
    require_models();
    Tensor<float> sum;
    for (std::size_t i = 0; i < predictors_.size(); ++i) {
      Tensor<float> y = predict_one(i, x);
      if (how == ensemble_average::probabilities) softmax_rows(y);
      if (i == 0) sum = Tensor<float>(y.shape());
      if (!(y.shape() == sum.shape()))
        fail("ensemble: model ", i, " gave outputs of shape ", y.shape(), ", model 0 of shape ", sum.shape());
      for (index_t k = 0; k < y.numel(); ++k) sum[k] += y[k];
    }
    for (float& v : sum.span()) v /= static_cast<float>(predictors_.size());
    return sum;
  }

  // Each sample's majority class over the models' arg-max predictions; a tie goes to the tied class with the higher
  // mean probability.
  Tensor<std::int64_t> vote(tensor_view<const float> x) const {
    require_models();
    Tensor<float> mean = predict(x, ensemble_average::probabilities);
    const index_t n = mean.extent(0), classes = mean.extent(1);
    std::vector<int> votes(static_cast<std::size_t>(n * classes), 0);
    for (std::size_t i = 0; i < predictors_.size(); ++i) {
      Tensor<std::int64_t> c = argmax(predict_one(i, x));
      for (index_t r = 0; r < n; ++r) ++votes[static_cast<std::size_t>(r * classes + c[r])];
    }
    Tensor<std::int64_t> out(shape{n});
    for (index_t r = 0; r < n; ++r) {
      index_t best = 0;
      for (index_t c = 1; c < classes; ++c) {
        int vc = votes[static_cast<std::size_t>(r * classes + c)], vb = votes[static_cast<std::size_t>(r * classes + best)];
        if (vc > vb || (vc == vb && mean.at(r, c) > mean.at(r, best))) best = c;
      }
      out[r] = best;
    }
    return out;
  }

  // The arg-max class of each row.
  static Tensor<std::int64_t> argmax(const Tensor<float>& y) {
    Tensor<std::int64_t> out(shape{y.extent(0)});
    for (index_t r = 0; r < y.extent(0); ++r) {
      index_t best = 0;
      for (index_t c = 1; c < y.extent(1); ++c)
        if (y.at(r, c) > y.at(r, best)) best = c;
      out[r] = best;
    }
    return out;
  }
  // The fraction of predicted classes equal to the labels.
  static double accuracy(const Tensor<std::int64_t>& predicted, tensor_view<const std::int64_t> labels) {
    if (predicted.numel() != labels.numel())
      fail("ensemble::accuracy: ", predicted.numel(), " predictions for ", labels.numel(), " labels");
    index_t correct = 0;
    for (index_t i = 0; i < predicted.numel(); ++i) correct += predicted[i] == labels[i];
    return predicted.numel() ? double(correct) / double(predicted.numel()) : 0.0;
  }

 private:
  void require_models() const {
    if (predictors_.empty()) fail("ensemble: add at least one model first");
  }
  static void softmax_rows(Tensor<float>& y) {
    for (index_t r = 0; r < y.extent(0); ++r) {
      float* row = y.data() + r * y.extent(1);
      float m = *std::max_element(row, row + y.extent(1));
      double s = 0;
      for (index_t c = 0; c < y.extent(1); ++c) s += std::exp(double(row[c] - m));
      for (index_t c = 0; c < y.extent(1); ++c) row[c] = static_cast<float>(std::exp(double(row[c] - m)) / s);
    }
  }

  std::vector<predictor> predictors_;
};

}  // namespace kiln
