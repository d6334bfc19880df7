// kiln::Model: Keras' compile / fit / evaluate / predict / summary for a model of either mode.
#pragma once

#include <chrono>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/step_profile.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/data/data_loader.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/policy.hpp"
#include "kiln/train/callbacks.hpp"
#include "kiln/train/history.hpp"
#include "kiln/train/metrics.hpp"
#include "kiln/train/model_access.hpp"
#include "kiln/train/progress_bar.hpp"

namespace kiln {

// Features and targets held in memory, viewed without copying: x is (N, ...) floats, y is (N) integer labels or
// (N, ...) real targets. It is a data::dataset, and any data set that holds its tensors (data::tensor_dataset,
// MNIST) converts to it.
template <class Target>
struct labelled_data {
  using feature_type = float;
  using label_type = Target;

  tensor_view<const float> x;
  tensor_view<const Target> y;

  labelled_data(tensor_view<const float> features, tensor_view<const Target> targets) : x(features), y(targets) {}
  template <class Dataset>
    requires requires(const Dataset& d) {
      { d.features() } -> std::convertible_to<tensor_view<const float>>;
      { d.labels() } -> std::convertible_to<tensor_view<const Target>>;
    }
  labelled_data(const Dataset& d) : x(d.features()), y(d.labels()) {}

  index_t size() const { return x.rank() ? x.extent(0) : 0; }
  shape sample_shape() const { return data::detail::drop_first(x.shape()); }
  shape label_shape() const { return data::detail::drop_first(y.shape()); }
  void get(index_t i, tensor_view<float> xs, tensor_view<Target> ys) const {
    index_t fr = x.shape().row_size(), lr = y.shape().row_size();
    std::copy_n(x.data() + i * fr, fr, xs.data());
    std::copy_n(y.data() + i * lr, lr, ys.data());
  }
};
template <class Target>
labelled_data(const Tensor<float>&, const Tensor<Target>&) -> labelled_data<Target>;
template <class Dataset>
labelled_data(const Dataset&) -> labelled_data<typename Dataset::label_type>;

// Options of Model::fit, as Keras names them.
template <class Target>
struct fit_options {
  int epochs = 1;
  index_t batch_size = 32;
  bool shuffle = true;
  // Held-out data evaluated after every epoch; or, when absent, the last validation_split of the training data.
  std::optional<labelled_data<Target>> validation_data{};
  double validation_split = 0.0;
  std::vector<std::shared_ptr<train::callback>> callbacks{};
  int verbose = 1;  // 0: silent; 1: progress bar
  std::uint64_t seed = 0;  // fixes the shuffling order and the augmentation draws of every epoch
  int prefetch = 1;        // batches assembled ahead by the loader's background thread (0: none)
  data::transform_fn<float> transform{};  // augmentation, applied to each training sample
  // When set, every training step's parts (each layer's forward and backward, the loss, the update) are timed into
  // it: Sequential::train_step's profile in static mode, nn::train_step's for a dynamic nn::Sequential.
  step_profile* profile = nullptr;
};

// Where the time of the last fit went: assembling batches (the data pipeline) versus training steps.
struct fit_timing {
  double data_seconds = 0, step_seconds = 0, eval_seconds = 0;
  long long steps = 0;
  double step_microseconds() const { return steps ? step_seconds * 1e6 / double(steps) : 0.0; }
};

// Loss and metrics of Model::evaluate.
struct evaluation {
  double loss = 0;
  train::logs metrics;
  double operator[](const std::string& name) const { return name == "loss" ? loss : metrics.get(name).value_or(0); }
};

// A model of either mode with Keras' training interface. The wrapped model is referenced, not copied.
template <class Net>
class Model {
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
    compiled_ = std::make_shared<compiled_state>();
    compiled_->wants_labels = std::is_integral_v<target>;
    if constexpr (requires { loss.ignore_index; }) compiled_->ignored_label = loss.ignore_index;
    compiled_->loss_name = Loss::name;
    compiled_->get_lr = [opt] { return opt->lr(); };
    compiled_->set_lr = [opt](double lr) { opt->set_lr(lr); };
    compiled_->train_labels = [this, opt, loss](tensor_view<const float> x, tensor_view<const std::int64_t> y) {
      if constexpr (std::is_integral_v<target>) return access_.train_batch(net_, x, y, loss, *opt, compiled_->profile);
      else return wrong_target<float>();
    };
    compiled_->train_values = [this, opt, loss](tensor_view<const float> x, tensor_view<const float> y) {
      if constexpr (!std::is_integral_v<target>) return access_.train_batch(net_, x, y, loss, *opt, compiled_->profile);
      else return wrong_target<float>();
    };
    compiled_->eval_labels = [this, loss](tensor_view<const float> x, tensor_view<const std::int64_t> y) {
      if constexpr (std::is_integral_v<target>) return access_.eval_batch(net_, x, y, loss);
      else return wrong_target<float>();
    };
    compiled_->eval_values = [this, loss](tensor_view<const float> x, tensor_view<const float> y) {
      if constexpr (!std::is_integral_v<target>) return access_.eval_batch(net_, x, y, loss);
      else return wrong_target<float>();
    };
    metrics_ = std::move(metrics);
  }

  // Trains for options.epochs epochs over (x, y) and returns the per-epoch history.
  template <class Target>
  train::history fit(const Tensor<float>& x, const Tensor<Target>& y, fit_options<Target> options = {}) {
    return fit(labelled_data<Target>{x, y}, std::move(options));
  }
  // Trains on any data set held in memory (tensor_dataset, MNIST): validation_split can carve it.
  template <class Dataset>
    requires std::constructible_from<labelled_data<typename Dataset::label_type>, const Dataset&>
  train::history fit(const Dataset& dataset, fit_options<typename Dataset::label_type> options = {}) {
    using Target = typename Dataset::label_type;
    labelled_data<Target> data(dataset);
    check_data(data, "fit");
    check_validation_split(options.validation_split);
    if (!options.validation_data && options.validation_split > 0) {
      index_t n = data.size();
      index_t held = static_cast<index_t>(static_cast<double>(n) * options.validation_split);
      if (held < 1 || held >= n)
        fail("Model::fit: validation_split ", options.validation_split, " of ", n,
             " samples leaves no training or no validation data");
      // As Keras: the last samples, before any shuffling, are held out.
      options.validation_data = labelled_data<Target>{data.x.rows(n - held, held), data.y.rows(n - held, held)};
      data = labelled_data<Target>{data.x.rows(0, n - held), data.y.rows(0, n - held)};
    }
    return fit_loader(data, options);
  }
  // Trains on any data::dataset through a data_loader (no validation_split: pass validation_data instead).
  template <data::dataset Dataset>
    requires(!std::constructible_from<labelled_data<typename Dataset::label_type>, const Dataset&>)
  train::history fit(const Dataset& dataset, fit_options<typename Dataset::label_type> options = {}) {
    if (options.validation_split != 0)
      fail("Model::fit: validation_split needs a data set held in memory; pass validation_data instead");
    if (dataset.size() < 1) fail("Model::fit: expected at least one training sample, found an empty data set");
    return fit_loader(dataset, options);
  }

  // Loss and metrics over data, in evaluation mode, batch by batch.
  template <class Target>
  evaluation evaluate(const Tensor<float>& x, const Tensor<Target>& y, index_t batch_size = 0) {
    return evaluate(labelled_data<Target>{x, y}, batch_size);
  }
  template <class Dataset>
    requires std::constructible_from<labelled_data<typename Dataset::label_type>, const Dataset&>
  evaluation evaluate(const Dataset& dataset, index_t batch_size = 0) {
    return evaluate(labelled_data<typename Dataset::label_type>(dataset), batch_size);
  }
  template <class Target>
  evaluation evaluate(labelled_data<Target> data, index_t batch_size = 0) {
    require_compiled("evaluate");
    check_data(data, "evaluate");
    const index_t batch = evaluation_batch(batch_size);
    std::vector<metric::accumulator> acc;
    for (auto& spec : metrics_) acc.emplace_back(spec);
    double loss_sum = 0;
    index_t n = data.x.extent(0);
    for (index_t first = 0; first < n; first += batch) {
      index_t count = std::min(batch, n - first);
      auto xb = data.x.rows(first, count);
      auto yb = data.y.rows(first, count);
      check_labels(yb, "evaluate", [&](index_t row) { return first + row; });
      float loss;
      if constexpr (std::is_integral_v<Target>) loss = compiled_->eval_labels(xb, yb);
      else loss = compiled_->eval_values(xb, yb);
      loss_sum += double(loss) * double(count);
      update_metrics(acc, yb, count);
    }
    evaluation result;
    result.loss = n ? loss_sum / double(n) : 0.0;
    for (auto& m : acc) result.metrics.set(m.name(), m.result());
    return result;
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
    check_data(data, "confusion_matrix");
    if (data.y.rank() != 1)
      fail("Model::confusion_matrix: expected one class label per sample, found labels of shape ", data.y.shape());
    const index_t batch = evaluation_batch(batch_size);
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
    rule('_');
  }

  // Where the time of the last fit went.
  const fit_timing& timing() const { return timing_; }
  Net& net() { return net_; }
  double lr() const { return compiled_ ? compiled_->get_lr() : 0.0; }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

  struct compiled_state {
    bool wants_labels = true;
    std::optional<std::int64_t> ignored_label;  // the loss's ignore_index: a label the range check lets through
    std::string loss_name;
    step_profile* profile = nullptr;  // fit_options::profile during a fit
    std::function<double()> get_lr;
    std::function<void(double)> set_lr;
    std::function<float(tensor_view<const float>, tensor_view<const std::int64_t>)> train_labels, eval_labels;
    std::function<float(tensor_view<const float>, tensor_view<const float>)> train_values, eval_values;
  };

  // What callbacks may steer: the learning rate, stopping, and the weights.
  class control : public train::training_control {
   public:
    explicit control(Model& m) : model_(m) {}
    double lr() const override { return model_.compiled_->get_lr(); }
    void set_lr(double lr) override { model_.compiled_->set_lr(lr); }
    void request_stop() override { model_.stop_requested_ = true; }
    train::weight_snapshot weights() const override { return model_.access_.weights(model_.net_); }
    void set_weights(const train::weight_snapshot& w) override { model_.access_.set_weights(model_.net_, w); }

   private:
    Model& model_;
  };

  template <class Dataset>
  train::history fit_loader(const Dataset& data, const fit_options<typename Dataset::label_type>& options) {
    using Target = typename Dataset::label_type;
    require_compiled("fit");
    if (access_.input_size(net_) > 0 && data.sample_shape().numel() != access_.input_size(net_))
      fail("Model::fit: expected samples of ", access_.input_size(net_), " values, found shape ", data.sample_shape());
    check_sample_layout(data.sample_shape(), 0, "fit");
    if (options.batch_size < 1 || options.batch_size > access_.max_batch(net_))
      fail("Model::fit: expected a batch size of 1 to ", access_.max_batch(net_),
           " (the model's maximum batch), found ", options.batch_size);
    if (options.epochs < 0) fail("Model::fit: expected epochs >= 0, found ", options.epochs);
    if (options.validation_data) check_data(*options.validation_data, "fit (validation data)");

    train::history history;
    compiled_->profile = options.profile;
    struct stop_profiling {  // also when the fit fails
      compiled_state& state;
      ~stop_profiling() { state.profile = nullptr; }
    } stop{*compiled_};
    timing_ = {};
    stop_requested_ = false;
    control control_impl(*this);
    for (auto& cb : options.callbacks) cb->on_train_begin(control_impl);

    data::data_loader loader(data, {.batch_size = options.batch_size,
                                    .shuffle = options.shuffle,
                                    .seed = options.seed,
                                    .prefetch = options.prefetch,
                                    .transform = options.transform});
    long long steps = loader.batches_per_epoch();
    train::progress_bar bar(std::cout, options.verbose > 0 && ::isatty(STDOUT_FILENO) != 0);
    std::vector<metric::accumulator> running;
    for (auto& spec : metrics_) running.emplace_back(spec);

    for (int epoch = 0; epoch < options.epochs && !stop_requested_; ++epoch) {
      for (auto& cb : options.callbacks) cb->on_epoch_begin(epoch, control_impl);
      if (options.verbose > 0) bar.begin_epoch(epoch + 1, options.epochs, steps);
      for (auto& m : running) m.reset();
      double loss_sum = 0;
      index_t seen = 0;
      train::logs step_logs;
      auto epoch_start = clock::now();
      loader.start_epoch(static_cast<std::uint64_t>(epoch));
      for (long long step = 0;; ++step) {
        auto t0 = clock::now();
        const auto* b = loader.next();
        auto t1 = clock::now();
        timing_.data_seconds += seconds(t1 - t0);
        if (!b) break;
        tensor_view<const float> xb = b->x;
        if (access_.input_size(net_) > 0) xb = xb.reshaped(shape{b->size, access_.input_size(net_)});
        tensor_view<const Target> yb = b->y;
        check_labels(yb, "fit", [&](index_t row) { return b->samples[static_cast<std::size_t>(row)]; });
        float loss = train_batch(xb, yb);
        timing_.step_seconds += seconds(clock::now() - t1);
        ++timing_.steps;
        loss_sum += double(loss) * double(b->size);
        seen += b->size;
        update_metrics(running, yb, b->size);
        if (options.verbose > 0 || !options.callbacks.empty()) {
          step_logs.set("loss", loss_sum / double(seen));
          for (auto& m : running) step_logs.set(m.name(), m.result());
          if (options.verbose > 0) bar.update(step + 1, step_logs);
          for (auto& cb : options.callbacks) cb->on_batch_end(step, step_logs, control_impl);
        }
        if (stop_requested_) break;  // as Keras: a stop asked for after a batch ends the epoch there
      }
      train::logs epoch_logs;
      epoch_logs.set("loss", seen ? loss_sum / double(seen) : 0.0);
      for (auto& m : running) epoch_logs.set(m.name(), m.result());
      if (options.validation_data) {
        auto t0 = clock::now();
        evaluation v = evaluate(*options.validation_data, options.batch_size);
        timing_.eval_seconds += seconds(clock::now() - t0);
        epoch_logs.set("val_loss", v.loss);
        for (auto& [k, value] : v.metrics.entries()) {
          std::string key = "val_";
          key += k;
          epoch_logs.set(key, value);
        }
      }
      epoch_logs.set("epoch_seconds", seconds(clock::now() - epoch_start));
      for (auto& cb : options.callbacks) cb->on_epoch_end(epoch, epoch_logs, control_impl);
      if (options.verbose > 0) {
        train::logs shown;
        for (auto& [k, value] : epoch_logs.entries())
          if (k != "epoch_seconds") shown.set(k, value);
        bar.end_epoch(shown);
      }
      history.record(epoch_logs);
    }
    for (auto& cb : options.callbacks) cb->on_train_end(control_impl);
    return history;
  }

  template <class R>
  R wrong_target() const {
    fail("Model: the loss '", compiled_->loss_name, "' expects ",
         compiled_->wants_labels ? "integer class labels" : "real-valued targets", ", but the data holds ",
         compiled_->wants_labels ? "real-valued targets" : "integer labels");
  }
  template <class Target>
  float train_batch(tensor_view<const float> x, tensor_view<const Target> y) {
    if constexpr (std::is_integral_v<Target>) return compiled_->train_labels(x, y);
    else return compiled_->train_values(x, y);
  }
  template <class Target>
  void update_metrics(std::vector<metric::accumulator>& acc, tensor_view<const Target> y, index_t count) {
    if (acc.empty()) return;
    auto out = access_.last_output(net_);
    metric::batch_view view{out.data(), count, access_.output_size(net_), nullptr, nullptr};
    if constexpr (std::is_integral_v<Target>) view.labels = y.data();
    else view.targets = y.data();
    for (auto& m : acc) m.update(view);
  }
  // The batch size of evaluate and confusion_matrix: the one asked for, at most the model's largest.
  index_t evaluation_batch(index_t batch_size) const {
    return batch_size > 0 ? std::min(batch_size, access_.max_batch(net_)) : access_.max_batch(net_);
  }
  void require_compiled(const char* where) const {
    if (!compiled_) fail("Model::", where, ": call compile(optimizer, loss, metrics) first");
  }
  template <class Target>
  void check_data(const labelled_data<Target>& d, const char* where) const {
    if (d.x.rank() < 1 || (access_.input_size(net_) > 0 && d.x.shape().row_size() != access_.input_size(net_)))
      fail("Model::", where, ": expected inputs of shape [N, ", access_.input_size(net_),
           " values per sample], found ", d.x.shape());
    check_sample_layout(d.x.shape(), 1, where);
    if (d.y.rank() < 1 || d.y.extent(0) != d.x.extent(0))
      fail("Model::", where, ": expected as many targets as inputs (", d.x.extent(0), "), found targets of shape ",
           d.y.shape());
    // A loss over no samples would read as 0, a perfect score to EarlyStopping and ModelCheckpoint.
    if (d.x.extent(0) < 1) fail("Model::", where, ": expected at least one sample, found inputs of shape ", d.x.shape());
  }
  // A sample (the extents of `shape` from `first` on) with as many extents as a static model's input must have the
  // input's: channels-last images hold as many values as channels-first ones, in another order. (fit and evaluate
  // hand the model flat rows, which its own check would accept.)
  void check_sample_layout(const shape& s, int first, const char* where) const {
    if constexpr (requires { access::is_other_layout(s, first); }) {
      if (!access::is_other_layout(s, first)) return;
      const shape expected = access_.input_shape(net_);  // [1, extents...]
      fail("Model::", where, ": expected samples of shape ", shape::from_range(expected.begin() + 1, expected.end()),
           ", found ", s, first ? " (with the batch first)" : "",
           ": the same number of values in another layout (channels last?); reshape the data if the values are "
           "already in the model's order");
    }
  }
  // Class labels outside the model's outputs are caught here rather than in the loss, so that the error names the
  // sample in the data set (the loss knows only the row of its batch, which fit draws shuffled).
  template <class Target, class SampleOf>
  void check_labels(tensor_view<const Target> y, const char* where, SampleOf sample_of) const {
    if constexpr (std::is_integral_v<Target>) {
      if (!compiled_->wants_labels) return;  // the loss's own error says that it wants real-valued targets
      // Only where each sample has one label over all of its outputs; a dynamic model's output size is known after
      // its first forward. Elsewhere the loss checks the labels.
      const index_t classes = access_.output_size(net_);
      if (classes <= 0 || y.rank() != 1) return;
      const Target* labels = y.data();
      for (index_t row = 0; row < y.numel(); ++row)
        if ((labels[row] < 0 || labels[row] >= classes) && labels[row] != compiled_->ignored_label)
          fail("Model::", where, ": expected class labels in [0, ", classes, ") for the model's ", classes,
               " outputs, found ", labels[row], " for sample ", sample_of(row), " of the data set");
    }
  }
  static void check_validation_split(double split) {
    if (!(split >= 0 && split < 1))  // also NaN
      fail("Model::fit: expected validation_split in [0, 1), found ", split);
  }

  Net& net_;
  access access_{};
  std::shared_ptr<compiled_state> compiled_;
  std::vector<metric::metric_spec> metrics_;
  fit_timing timing_;
  bool stop_requested_ = false;
};

}  // namespace kiln
