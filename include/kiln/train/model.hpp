// kiln::Model: Keras' compile / fit / evaluate / predict / summary for a model of either mode.
// The epochs, callbacks and checks are train::training_loop's, which does not depend on the model's type; Model adds
// what does: compile (the loss and optimizer for this model), predict, confusion_matrix and summary.
#pragma once

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/labelled_data.hpp"
#include "kiln/policy.hpp"
#include "kiln/train/callbacks.hpp"
#include "kiln/train/history.hpp"
#include "kiln/train/metrics.hpp"
#include "kiln/train/model_access.hpp"
#include "kiln/train/training_loop.hpp"

namespace kiln {

// A model of either mode with Keras' training interface. The wrapped model is referenced, not copied.
template <class Net>
class Model : private train::model_port {
  using access = train::model_access<Net>;

 public:
  explicit Model(Net& net) : net_(net) {}
  // Not copied or moved: what compile() sets up refers to this object, and a copy would train through the original
  // (after it is gone, through a dangling pointer). Make another Model over the same net instead.
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Chooses the optimizer (taken by value; it is given the model's parameters), the loss and the metrics.
  template <class Optimizer, class Loss>
  void compile(Optimizer optimizer, Loss loss, std::vector<metric::metric_spec> metrics = {}) {
    auto opt = std::make_shared<Optimizer>(std::move(optimizer));
    if (!opt->has_parameters()) opt->add_parameters(access_.parameters(net_));
    using target = typename Loss::template target_type<float>;
    constexpr bool labels = std::is_integral_v<target>;
    train::compiled_training calls;
    calls.wants_labels = labels;
    if constexpr (requires { loss.ignore_index; }) calls.ignored_label = loss.ignore_index;
    calls.loss_name = Loss::name;
    calls.get_lr = [opt] { return opt->lr(); };
    calls.set_lr = [opt](double lr) { opt->set_lr(lr); };
    calls.train_labels = [this, opt, loss](tensor_view<const float> x, tensor_view<const std::int64_t> y,
                                           step_profile* profile) -> float {
      if constexpr (labels) return access_.train_batch(net_, x, y, loss, *opt, profile);
      else loop_.wrong_target();
    };
    calls.train_values = [this, opt, loss](tensor_view<const float> x, tensor_view<const float> y,
                                           step_profile* profile) -> float {
      if constexpr (!labels) return access_.train_batch(net_, x, y, loss, *opt, profile);
      else loop_.wrong_target();
    };
    calls.eval_labels = [this, loss](tensor_view<const float> x, tensor_view<const std::int64_t> y) -> float {
      if constexpr (labels) return access_.eval_batch(net_, x, y, loss);
      else loop_.wrong_target();
    };
    calls.eval_values = [this, loss](tensor_view<const float> x, tensor_view<const float> y) -> float {
      if constexpr (!labels) return access_.eval_batch(net_, x, y, loss);
      else loop_.wrong_target();
    };
    loop_.compile(std::move(calls), std::move(metrics));
  }

  // Trains for options.epochs epochs over (x, y) and returns the per-epoch history.
  template <class Target>
  train::history fit(const Tensor<float>& x, const Tensor<Target>& y, fit_options<Target> options = {}) {
    return loop_.fit(labelled_data<Target>{x, y}, std::move(options));
  }
  // Trains on any data set held in memory (tensor_dataset, MNIST): validation_split can carve it.
  template <class Dataset>
    requires std::constructible_from<labelled_data<typename Dataset::label_type>, const Dataset&>
  train::history fit(const Dataset& dataset, fit_options<typename Dataset::label_type> options = {}) {
    return loop_.fit(labelled_data<typename Dataset::label_type>(dataset), std::move(options));
  }
  // Trains on any data::dataset through a data_loader (no validation_split: pass validation_data instead).
  template <data::dataset Dataset>
    requires(!std::constructible_from<labelled_data<typename Dataset::label_type>, const Dataset&>)
  train::history fit(const Dataset& dataset, fit_options<typename Dataset::label_type> options = {}) {
    if (options.validation_split != 0)
      fail("Model::fit: validation_split needs a data set held in memory; pass validation_data instead");
    if (dataset.size() < 1) fail("Model::fit: expected at least one training sample, found an empty data set");
    return loop_.fit_loader(dataset, options);
  }

  // Loss and metrics over data, in evaluation mode, batch by batch.
  template <class Target>
  evaluation evaluate(const Tensor<float>& x, const Tensor<Target>& y, index_t batch_size = 0) {
    return loop_.evaluate(labelled_data<Target>{x, y}, batch_size);
  }
  template <class Dataset>
    requires std::constructible_from<labelled_data<typename Dataset::label_type>, const Dataset&>
  evaluation evaluate(const Dataset& dataset, index_t batch_size = 0) {
    return loop_.evaluate(labelled_data<typename Dataset::label_type>(dataset), batch_size);
  }
  template <class Target>
  evaluation evaluate(labelled_data<Target> data, index_t batch_size = 0) {
    return loop_.evaluate(data, batch_size);
  }

  // The model's outputs for x, in evaluation mode.
  Tensor<float> predict(tensor_view<const float> x) { return access_.predict(net_, x); }

  // The confusion matrix of the model's predictions on labelled data (evaluation mode, batch by batch); its report()
  // prints precision, recall and F1 per class.
  metric::confusion_matrix confusion_matrix(const Tensor<float>& x, const Tensor<std::int64_t>& y,
                                            index_t batch_size = 0) {
    return confusion_matrix(labelled_data<std::int64_t>{x, y}, batch_size);
  }
  template <class Dataset>
    requires std::constructible_from<labelled_data<std::int64_t>, const Dataset&>
  metric::confusion_matrix confusion_matrix(const Dataset& dataset, index_t batch_size = 0) {
    return confusion_matrix(labelled_data<std::int64_t>(dataset), batch_size);
  }
  metric::confusion_matrix confusion_matrix(labelled_data<std::int64_t> data, index_t batch_size = 0) {
    loop_.check_data(data, "confusion_matrix");
    if (data.y.rank() != 1)
      fail("Model::confusion_matrix: expected one class label per sample, found labels of shape ", data.y.shape());
    const index_t batch = loop_.evaluation_batch(batch_size);
    metric::confusion_matrix matrix;
    index_t n = data.x.extent(0);
    for (index_t first = 0; first < n; first += batch) {
      index_t count = std::min(batch, n - first);
      auto yb = data.y.rows(first, count);
      Tensor<float> out = access_.predict(net_, data.x.rows(first, count));
      index_t width = out.shape().row_size(), classes = width == 1 ? 2 : width;
      for (index_t row = 0; row < count; ++row)
        if (yb.data()[row] < 0 || yb.data()[row] >= classes)
          fail("Model::confusion_matrix: expected class labels in [0, ", classes, ") for the model's ", width,
               " outputs, found ", yb.data()[row], " for sample ", first + row, " of the data set");
      matrix.update({out.data(), count, width, yb.data(), nullptr});
    }
    return matrix;
  }

  // Prints a table of layers, output shapes and parameter counts, with totals.
  void summary(std::ostream& out = std::cout) const {
    auto rows = access_.summary_rows(net_);
    std::size_t name_w = 20, shape_w = 18;
    for (auto& r : rows) name_w = std::max(name_w, r.name.size() + 2);
    auto rule = [&](char c) { out << std::string(name_w + shape_w + 14, c) << '\n'; };
    out << "Model (" << access_.mode << " mode)\n";
    rule('_');
    out << std::left << std::setw(int(name_w)) << "Layer (type)" << std::setw(int(shape_w)) << "Output Shape"
        << std::right << std::setw(14) << "Param #" << '\n';
    rule('=');
    for (auto& r : rows) {
      std::ostringstream shape_text;
      shape_text << "(None";
      for (int d = 1; d < r.output_shape.rank(); ++d) shape_text << ", " << r.output_shape[d];
      shape_text << ')';
      out << std::left << std::setw(int(name_w)) << r.name << std::setw(int(shape_w)) << shape_text.str()
          << std::right << std::setw(14) << r.parameters << '\n';
    }
    rule('=');
    index_t trainable = access_.trainable_parameters(net_), frozen = access_.non_trainable_parameters(net_);
    out << "Total params: " << trainable + frozen << "\nTrainable params: " << trainable
        << "\nNon-trainable params: " << frozen << '\n';
    for (const auto& note : access_.plan_notes(net_)) out << note << '\n';
    rule('_');
  }

  // Where the time of the last fit went.
  const fit_timing& timing() const { return loop_.timing(); }
  Net& net() { return net_; }
  double lr() const { return loop_.lr(); }

 private:
  // train::model_port, over model_access<Net>.
  index_t input_size() const override { return access_.input_size(net_); }
  index_t output_size() const override { return access_.output_size(net_); }
  index_t max_batch() const override { return access_.max_batch(net_); }
  bool is_other_layout(const shape& s, int first) const override {
    if constexpr (requires { access::is_other_layout(s, first); }) return access::is_other_layout(s, first);
    else return false;
  }
  shape input_shape() const override {
    if constexpr (requires { access_.input_shape(net_); }) return access_.input_shape(net_);
    else return {};
  }
  tensor_view<const float> last_output() override { return access_.last_output(net_); }
  train::weight_snapshot weights() const override { return access_.weights(net_); }
  void set_weights(const train::weight_snapshot& w) override { access_.set_weights(net_, w); }
  train::distribution* distributed() override {
    if constexpr (requires { access_.distribution(net_); }) return &access_.distribution(net_);
    else return nullptr;
  }

  Net& net_;
  access access_{};
  train::training_loop loop_{*this};
};

}  // namespace kiln
