// train::training_loop: the part of kiln::Model that does not depend on the model's type: the epochs of fit over a
// data loader, the callbacks and the progress bar, evaluate, and the checks of the data. It reaches the model through
// train::model_port, which Model<Net> implements, and the loss and optimizer through the type-erased calls that
// Model::compile sets (train::compiled_training). Being independent of the model, the loop over the data sets held in
// memory is compiled once into kiln::kernels (train/compiled_training.hpp) instead of once per model.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/step_profile.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/data/data_loader.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/labelled_data.hpp"
#include "kiln/distributed/shard_dataset.hpp"
#include "kiln/train/callbacks.hpp"
#include "kiln/train/distribution.hpp"
#include "kiln/train/history.hpp"
#include "kiln/train/metrics.hpp"
#include "kiln/train/progress_bar.hpp"

namespace kiln {

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

namespace train {

// What the training loop needs of a model, whatever its type and mode.
class model_port {
 public:
  virtual ~model_port() = default;
  // Values per sample the model takes, or -1 for any (a dynamic module checks its input itself).
  virtual index_t input_size() const = 0;
  // Values per sample of the output; 0 while unknown (a dynamic module's, before its first forward).
  virtual index_t output_size() const = 0;
  virtual index_t max_batch() const = 0;
  // Whether the extents of s from `first` on are the model's input extents in another layout (channels last for
  // channels first); when so, input_shape() is the input's shape with a batch of 1, for the error.
  virtual bool is_other_layout(const shape& s, int first) const = 0;
  virtual shape input_shape() const = 0;
  // The output of the last training or evaluation batch, on the host.
  virtual tensor_view<const float> last_output() = 0;
  virtual weight_snapshot weights() const = 0;
  virtual void set_weights(const weight_snapshot& weights) = 0;
  // The processes the model trains across (a data-parallel model's), or null for this process alone.
  virtual distribution* distributed() { return nullptr; }
};

// The loss and optimizer Model::compile chose, behind calls that know their types: each trains on or evaluates one
// batch and returns its loss.
struct compiled_training {
  bool wants_labels = true;                   // the loss takes integer class labels, not real-valued targets
  std::optional<std::int64_t> ignored_label;  // the loss's ignore_index: a label the range check lets through
  std::string loss_name;
  std::function<double()> get_lr;
  std::function<void(double)> set_lr;
  std::function<float(tensor_view<const float>, tensor_view<const std::int64_t>, step_profile*)> train_labels;
  std::function<float(tensor_view<const float>, tensor_view<const float>, step_profile*)> train_values;
  std::function<float(tensor_view<const float>, tensor_view<const std::int64_t>)> eval_labels;
  std::function<float(tensor_view<const float>, tensor_view<const float>)> eval_values;
};

// Contract:
//   requires: the port outlives the loop; compile() before fit() or evaluate();
//   ensures:  fit() and evaluate() behave as Keras' (see kiln::Model), and every bad argument is a kiln::error that
//             names the Model call it came through.
class training_loop {
 public:
  explicit training_loop(model_port& model) : model_(model) {}
  training_loop(const training_loop&) = delete;
  training_loop& operator=(const training_loop&) = delete;

  void compile(compiled_training calls, std::vector<metric::metric_spec> metrics) {
    compiled_ = std::make_shared<compiled_training>(std::move(calls));
    metrics_ = std::move(metrics);
  }
  bool compiled() const { return compiled_ != nullptr; }
  double lr() const { return compiled_ ? compiled_->get_lr() : 0.0; }
  const fit_timing& timing() const { return timing_; }

  // Trains on data held in memory; validation_split carves the validation data off its end.
  template <class Target>
  history fit(labelled_data<Target> data, fit_options<Target> options);
  // Trains on any data::dataset through a data_loader.
  template <class Dataset>
  history fit_loader(const Dataset& data, const fit_options<typename Dataset::label_type>& options);
  // Loss and metrics over data, in evaluation mode, at most max_batch() samples at a time.
  template <class Target>
  evaluation evaluate(labelled_data<Target> data, index_t batch_size);

  // A loss's call with the other kind of target: the error that says so.
  [[noreturn]] void wrong_target() const {
    fail("Model: the loss '", compiled_->loss_name, "' expects ",
         compiled_->wants_labels ? "integer class labels" : "real-valued targets", ", but the data holds ",
         compiled_->wants_labels ? "real-valued targets" : "integer labels");
  }
  // The batch size of evaluate and confusion_matrix: the one asked for, at most the model's largest.
  index_t evaluation_batch(index_t batch_size) const {
    return batch_size > 0 ? std::min(batch_size, model_.max_batch()) : model_.max_batch();
  }
  template <class Target>
  void check_data(const labelled_data<Target>& d, const char* where) const;

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

  // What callbacks may steer: the learning rate, stopping, and the weights.
  class control : public training_control {
   public:
    explicit control(training_loop& loop) : loop_(loop) {}
    double lr() const override { return loop_.compiled_->get_lr(); }
    void set_lr(double lr) override { loop_.compiled_->set_lr(lr); }
    void request_stop() override { loop_.stop_requested_ = true; }
    weight_snapshot weights() const override { return loop_.model_.weights(); }
    void set_weights(const weight_snapshot& w) override { loop_.model_.set_weights(w); }
    bool writes_files() const override {
      const distribution* d = loop_.model_.distributed();
      return !d || d->rank() == 0;
    }

   private:
    training_loop& loop_;
  };

  void require_compiled(const char* where) const {
    if (!compiled_) fail("Model::", where, ": call compile(optimizer, loss, metrics) first");
  }
  template <class Target>
  float train_batch(tensor_view<const float> x, tensor_view<const Target> y, step_profile* profile) {
    if constexpr (std::is_integral_v<Target>) return compiled_->train_labels(x, y, profile);
    else return compiled_->train_values(x, y, profile);
  }
  template <class Target>
  void update_metrics(std::vector<metric::accumulator>& acc, tensor_view<const Target> y, index_t count);
  // The epochs over a loader of the training data; begin_epoch(epoch) runs before each epoch's batches.
  template <class Target, class Loader, class BeginEpoch>
  history train_epochs(Loader& loader, BeginEpoch&& begin_epoch, const fit_options<Target>& options,
                       distribution* across);
  // Every rank's loss sum, sample count and metric sums added, so that each holds the whole epoch's.
  static void sum_over_ranks(distribution& across, double& loss_sum, index_t& seen,
                             std::vector<metric::accumulator>& metrics);
  // Whether any rank asks to stop: every rank stops at the same batch, or the others would wait for its gradients.
  bool stop_on_any_rank(distribution* across) const {
    if (!across) return stop_requested_;
    double stop = stop_requested_ ? 1.0 : 0.0;
    across->sum(std::span<double>(&stop, 1));
    return stop > 0;
  }
  void check_sample_layout(const shape& s, int first, const char* where) const;
  template <class Target, class SampleOf>
  void check_labels(tensor_view<const Target> y, const char* where, SampleOf sample_of) const;
  static void check_validation_split(double split) {
    if (!(split >= 0 && split < 1))  // also NaN
      fail("Model::fit: expected validation_split in [0, 1), found ", split);
  }

  model_port& model_;
  std::shared_ptr<compiled_training> compiled_;
  std::vector<metric::metric_spec> metrics_;
  fit_timing timing_;
  bool stop_requested_ = false;
};

template <class Target>
history training_loop::fit(labelled_data<Target> data, fit_options<Target> options) {
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

template <class Dataset>
history training_loop::fit_loader(const Dataset& data, const fit_options<typename Dataset::label_type>& options) {
  using Target = typename Dataset::label_type;
  require_compiled("fit");
  const index_t input_size = model_.input_size();
  if (input_size > 0 && data.sample_shape().numel() != input_size)
    fail("Model::fit: expected samples of ", input_size, " values, found shape ", data.sample_shape());
  check_sample_layout(data.sample_shape(), 0, "fit");
  if (options.batch_size < 1 || options.batch_size > model_.max_batch())
    fail("Model::fit: expected a batch size of 1 to ", model_.max_batch(), " (the model's maximum batch), found ",
         options.batch_size);
  if (options.epochs < 0) fail("Model::fit: expected epochs >= 0, found ", options.epochs);
  if (options.validation_data) check_data(*options.validation_data, "fit (validation data)");

  // Across processes: each rank its shard of every epoch's permutation (the one the loader would shuffle by, padded to
  // as many samples on every rank), batched in the shard's order.
  if (distribution* across = model_.distributed()) {
    distributed::shard_dataset shard(data, distributed::distributed_sampler(
                                               data.size(), across->rank(), across->size(),
                                               {.shuffle = options.shuffle, .seed = options.seed}));
    data::data_loader loader(shard, {.batch_size = options.batch_size,
                                     .shuffle = false,
                                     .seed = options.seed,
                                     .prefetch = options.prefetch,
                                     .transform = options.transform});
    return train_epochs<Target>(loader, [&](int epoch) { shard.set_epoch(static_cast<std::uint64_t>(epoch)); },
                                options, across);
  }
  data::data_loader loader(data, {.batch_size = options.batch_size,
                                  .shuffle = options.shuffle,
                                  .seed = options.seed,
                                  .prefetch = options.prefetch,
                                  .transform = options.transform});
  return train_epochs<Target>(loader, [](int) {}, options, nullptr);
}

template <class Target, class Loader, class BeginEpoch>
history training_loop::train_epochs(Loader& loader, BeginEpoch&& begin_epoch, const fit_options<Target>& options,
                                    distribution* across) {
  const index_t input_size = model_.input_size();
  const bool shows_progress = options.verbose > 0 && (!across || across->rank() == 0);
  history result;
  timing_ = {};
  stop_requested_ = false;
  control control_impl(*this);
  for (auto& cb : options.callbacks) cb->on_train_begin(control_impl);

  long long steps = loader.batches_per_epoch();
  progress_bar bar(std::cout, shows_progress && ::isatty(STDOUT_FILENO) != 0);
  std::vector<metric::accumulator> running;
  for (auto& spec : metrics_) running.emplace_back(spec);

  for (int epoch = 0; epoch < options.epochs && !stop_requested_; ++epoch) {
    for (auto& cb : options.callbacks) cb->on_epoch_begin(epoch, control_impl);
    if (shows_progress) bar.begin_epoch(epoch + 1, options.epochs, steps);
    for (auto& m : running) m.reset();
    double loss_sum = 0;
    index_t seen = 0;
    logs step_logs;
    auto epoch_start = clock::now();
    begin_epoch(epoch);
    loader.start_epoch(static_cast<std::uint64_t>(epoch));
    for (long long step = 0;; ++step) {
      auto t0 = clock::now();
      const auto* b = loader.next();
      auto t1 = clock::now();
      timing_.data_seconds += seconds(t1 - t0);
      if (!b) break;
      tensor_view<const float> xb = b->x;
      if (input_size > 0) xb = xb.reshaped(shape{b->size, input_size});
      tensor_view<const Target> yb = b->y;
      check_labels(yb, "fit", [&](index_t row) { return b->samples[static_cast<std::size_t>(row)]; });
      float loss = train_batch(xb, yb, options.profile);
      timing_.step_seconds += seconds(clock::now() - t1);
      ++timing_.steps;
      loss_sum += double(loss) * double(b->size);
      seen += b->size;
      update_metrics(running, yb, b->size);
      if (shows_progress || !options.callbacks.empty()) {
        step_logs.set("loss", loss_sum / double(seen));
        for (auto& m : running) step_logs.set(m.name(), m.result());
        if (shows_progress) bar.update(step + 1, step_logs);
        for (auto& cb : options.callbacks) cb->on_batch_end(step, step_logs, control_impl);
      }
      // As Keras: a stop asked for after a batch ends the epoch there (on every rank at once).
      if (!options.callbacks.empty() && stop_on_any_rank(across)) {
        stop_requested_ = true;
        break;
      }
    }
    if (across) sum_over_ranks(*across, loss_sum, seen, running);
    logs epoch_logs;
    epoch_logs.set("loss", seen ? loss_sum / double(seen) : 0.0);
    for (auto& m : running) epoch_logs.set(m.name(), m.result());
    if (options.validation_data) {
      auto t0 = clock::now();
      evaluation v = evaluate(*options.validation_data, options.batch_size);
      timing_.eval_seconds += seconds(clock::now() - t0);
      // Every rank evaluates the whole validation data with its own running statistics: their mean is reported.
      std::vector<double> values{v.loss};
      for (auto& [k, value] : v.metrics.entries()) values.push_back(value);
      if (across) {
        across->sum(values);
        for (double& value : values) value /= double(across->size());
      }
      epoch_logs.set("val_loss", values[0]);
      std::size_t i = 1;
      for (auto& [k, value] : v.metrics.entries()) {
        std::string key = "val_";
        key += k;
        epoch_logs.set(key, values[i++]);
      }
    }
    epoch_logs.set("epoch_seconds", seconds(clock::now() - epoch_start));
    for (auto& cb : options.callbacks) cb->on_epoch_end(epoch, epoch_logs, control_impl);
    if (!options.callbacks.empty()) stop_requested_ = stop_on_any_rank(across);
    if (shows_progress) {
      logs shown;
      for (auto& [k, value] : epoch_logs.entries())
        if (k != "epoch_seconds") shown.set(k, value);
      bar.end_epoch(shown);
    }
    result.record(epoch_logs);
  }
  for (auto& cb : options.callbacks) cb->on_train_end(control_impl);
  return result;
}

inline void training_loop::sum_over_ranks(distribution& across, double& loss_sum, index_t& seen,
                                          std::vector<metric::accumulator>& metrics) {
  std::vector<double> values{loss_sum, static_cast<double>(seen)};
  std::vector<std::size_t> sizes;
  for (auto& m : metrics) {
    const auto sums = m.sums();
    sizes.push_back(sums.size());
    values.insert(values.end(), sums.begin(), sums.end());
  }
  across.sum(values);
  loss_sum = values[0];
  seen = static_cast<index_t>(values[1]);
  std::size_t at = 2;
  for (std::size_t i = 0; i < metrics.size(); ++i) {
    metrics[i].set_sums(std::span<const double>(values).subspan(at, sizes[i]));
    at += sizes[i];
  }
}

template <class Target>
evaluation training_loop::evaluate(labelled_data<Target> data, index_t batch_size) {
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

template <class Target>
void training_loop::update_metrics(std::vector<metric::accumulator>& acc, tensor_view<const Target> y,
                                   index_t count) {
  if (acc.empty()) return;
  auto out = model_.last_output();
  metric::batch_view view{out.data(), count, model_.output_size(), nullptr, nullptr};
  if constexpr (std::is_integral_v<Target>) view.labels = y.data();
  else view.targets = y.data();
  for (auto& m : acc) m.update(view);
}

template <class Target>
void training_loop::check_data(const labelled_data<Target>& d, const char* where) const {
  const index_t input_size = model_.input_size();
  if (d.x.rank() < 1 || (input_size > 0 && d.x.shape().row_size() != input_size))
    fail("Model::", where, ": expected inputs of shape [N, ", input_size, " values per sample], found ", d.x.shape());
  check_sample_layout(d.x.shape(), 1, where);
  if (d.y.rank() < 1 || d.y.extent(0) != d.x.extent(0))
    fail("Model::", where, ": expected as many targets as inputs (", d.x.extent(0), "), found targets of shape ",
         d.y.shape());
  // A loss over no samples would read as 0, a perfect score to EarlyStopping and ModelCheckpoint.
  if (d.x.extent(0) < 1) fail("Model::", where, ": expected at least one sample, found inputs of shape ", d.x.shape());
}

// A sample (the extents of `s` from `first` on) with as many extents as a static model's input must have the
// input's: channels-last images hold as many values as channels-first ones, in another order. (fit and evaluate hand
// the model flat rows, which its own check would accept.)
inline void training_loop::check_sample_layout(const shape& s, int first, const char* where) const {
  if (!model_.is_other_layout(s, first)) return;
  const shape expected = model_.input_shape();  // [1, extents...]
  fail("Model::", where, ": expected samples of shape ", shape::from_range(expected.begin() + 1, expected.end()),
       ", found ", s, first ? " (with the batch first)" : "",
       ": the same number of values in another layout (channels last?); reshape the data if the values are already "
       "in the model's order");
}

// Class labels outside the model's outputs are caught here rather than in the loss, so that the error names the
// sample in the data set (the loss knows only the row of its batch, which fit draws shuffled).
template <class Target, class SampleOf>
void training_loop::check_labels(tensor_view<const Target> y, const char* where, SampleOf sample_of) const {
  if constexpr (std::is_integral_v<Target>) {
    if (!compiled_->wants_labels) return;  // the loss's own error says that it wants real-valued targets
    // Only where each sample has one label over all of its outputs; a dynamic model's output size is known after its
    // first forward. Elsewhere the loss checks the labels.
    const index_t classes = model_.output_size();
    if (classes <= 0 || y.rank() != 1) return;
    const Target* labels = y.data();
    for (index_t row = 0; row < y.numel(); ++row)
      if ((labels[row] < 0 || labels[row] >= classes) && labels[row] != compiled_->ignored_label)
        fail("Model::", where, ": expected class labels in [0, ", classes, ") for the model's ", classes,
             " outputs, found ", labels[row], " for sample ", sample_of(row), " of the data set");
  }
}

}  // namespace train
}  // namespace kiln

#include "kiln/train/compiled_training.hpp"
