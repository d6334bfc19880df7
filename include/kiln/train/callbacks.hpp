// Callbacks for Model::fit: EarlyStopping, ModelCheckpoint, CSVLogger, learning-rate schedules (step, cosine),
// ReduceLROnPlateau and LambdaCallback. A callback sees the epoch logs and steers training through training_control.
#pragma once

#include <algorithm>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/atomic_file.hpp"
#include "kiln/io/safetensors_format.hpp"
#include "kiln/optim/lr_scheduler.hpp"
#include "kiln/train/logs.hpp"

namespace kiln::train {

// A model's weights by name, as state_dict() gives them.
using weight_snapshot = std::vector<std::pair<std::string, Tensor<float>>>;

// What a callback may do to the training run it observes.
class training_control {
 public:
  virtual ~training_control() = default;
  virtual double lr() const = 0;
  virtual void set_lr(double lr) = 0;
  virtual void request_stop() = 0;
  virtual weight_snapshot weights() const = 0;
  virtual void set_weights(const weight_snapshot& weights) = 0;
  // Whether this process writes the callbacks' files: false on every rank but 0 when Model::fit trains across
  // processes (train/distribution.hpp), whose callbacks otherwise see the same logs and decide alike.
  virtual bool writes_files() const { return true; }
};

// The base of all callbacks; every hook does nothing unless overridden. Epochs count from 0.
class callback {
 public:
  virtual ~callback() = default;
  virtual void on_train_begin(training_control&) {}
  virtual void on_epoch_begin(int /*epoch*/, training_control&) {}
  virtual void on_batch_end(long long /*batch*/, const logs&, training_control&) {}
  virtual void on_epoch_end(int /*epoch*/, logs&, training_control&) {}
  virtual void on_train_end(training_control&) {}
};

// Whether a monitored quantity improves by going down (losses, errors) or up (accuracies).
enum class monitor_mode { automatic, min, max };

namespace detail {
inline bool lower_is_better(const std::string& monitor, monitor_mode mode) {
  if (mode != monitor_mode::automatic) return mode == monitor_mode::min;
  return monitor.find("acc") == std::string::npos;
}
inline double monitored(const logs& l, const std::string& monitor, const char* who) {
  auto v = l.get(monitor);
  if (!v) {
    std::string known;
    for (auto& [k, value] : l.entries()) {
      if (!known.empty()) known += ", ";
      known += k;
    }
    fail(who, ": the monitored quantity '", monitor, "' is not in the epoch logs (found: ", known, ")");
  }
  return *v;
}
}  // namespace detail

// Tracks the best value of a monitored quantity; the shared part of EarlyStopping, ModelCheckpoint and
// ReduceLROnPlateau.
class best_tracker {
 public:
  best_tracker(std::string monitor, monitor_mode mode, double min_delta)
      : monitor_(std::move(monitor)), lower_(detail::lower_is_better(monitor_, mode)), min_delta_(min_delta) {
    reset();
  }
  void reset() { best_ = lower_ ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity(); }
  // True when value beats the best so far by more than min_delta (and becomes the new best).
  bool improved(double value) {
    bool better = lower_ ? value < best_ - min_delta_ : value > best_ + min_delta_;
    if (better) best_ = value;
    return better;
  }
  double best() const { return best_; }
  const std::string& monitor() const { return monitor_; }

 private:
  std::string monitor_;
  bool lower_;
  double min_delta_;
  double best_ = 0;
};

// EarlyStopping's settings, with Keras' defaults.
struct early_stopping_options {
  std::string monitor = "val_loss";
  int patience = 0;
  double min_delta = 0.0;
  monitor_mode mode = monitor_mode::automatic;
  bool restore_best_weights = false;
};

// Stops training when the monitored quantity has not improved for `patience` epochs; optionally restores the
// weights of the best epoch.
class EarlyStopping : public callback {
 public:
  using options = early_stopping_options;
  explicit EarlyStopping(options o = {}) : options_(std::move(o)), best_(options_.monitor, options_.mode, options_.min_delta) {}

  void on_train_begin(training_control&) override {
    best_.reset();
    wait_ = 0;
    stopped_epoch_ = -1;
    best_epoch_ = -1;
  }
  void on_epoch_end(int epoch, logs& l, training_control& control) override {
    double value = detail::monitored(l, options_.monitor, "EarlyStopping");
    if (best_.improved(value)) {
      wait_ = 0;
      best_epoch_ = epoch;
      if (options_.restore_best_weights) best_weights_ = control.weights();
      return;
    }
    // As Keras: the patience-th epoch in a row without improvement is the last (patience 1 stops at the first).
    if (++wait_ >= options_.patience) {
      stopped_epoch_ = epoch;
      control.request_stop();
      if (options_.restore_best_weights && !best_weights_.empty()) control.set_weights(best_weights_);
    }
  }
  // The epoch at which training was stopped, or -1.
  int stopped_epoch() const { return stopped_epoch_; }
  int best_epoch() const { return best_epoch_; }
  double best_value() const { return best_.best(); }

 private:
  options options_;
  best_tracker best_;
  int wait_ = 0, stopped_epoch_ = -1, best_epoch_ = -1;
  weight_snapshot best_weights_;
};

// ModelCheckpoint's settings, with Keras' defaults: every epoch is saved unless save_best_only.
struct model_checkpoint_options {
  std::string monitor = "val_loss";
  monitor_mode mode = monitor_mode::automatic;
  // Write the file only at an epoch that improves on the best so far (Keras' default: false, every epoch).
  bool save_best_only = false;
  // When not empty, the weights are written there as a safetensors weights file (kiln::io::load_weights reads it; so
  // does PyTorch). "{epoch}" in the path is replaced by the epoch's number counted from 1, as the progress bar, the
  // history's rows and Keras count them: "ckpt_{epoch}.safetensors" after the first epoch is "ckpt_1.safetensors".
  std::string path{};
};

// Keeps the weights of the best epoch (by the monitored quantity) in memory; best_weights() and best_epoch() hand them
// out whatever save_best_only says. With a path, it also writes each epoch's weights (or, with save_best_only, those
// of each epoch that improves) to a file, atomically, with the epoch's number (from 1) and the monitored value in the
// metadata.
class ModelCheckpoint : public callback {
 public:
  using options = model_checkpoint_options;
  explicit ModelCheckpoint(options o = {}) : options_(std::move(o)), best_(options_.monitor, options_.mode, 0.0) {}

  void on_train_begin(training_control&) override { best_.reset(); }
  void on_epoch_end(int epoch, logs& l, training_control& control) override {
    const double value = detail::monitored(l, options_.monitor, "ModelCheckpoint");
    const bool improved = best_.improved(value);
    if (improved) {
      weights_ = control.weights();
      epoch_ = epoch;
    }
    if (options_.path.empty() || (options_.save_best_only && !improved) || !control.writes_files()) return;
    const std::string number = std::to_string(epoch + 1);
    std::string file = options_.path;
    for (std::size_t at; (at = file.find("{epoch}")) != std::string::npos;) file.replace(at, 7, number);
    std::ostringstream v;
    v.precision(17);
    v << value;
    io::write_state_dict(file, improved ? weights_ : control.weights(), {{"epoch", number}, {options_.monitor, v.str()}});
    last_path_ = file;
  }
  const weight_snapshot& best_weights() const { return weights_; }
  // The best epoch, counted from 0 as on_epoch_end's argument and EarlyStopping::best_epoch() count it; -1 before any.
  int best_epoch() const { return epoch_; }
  // The file written last ("" before any, or without a path).
  const std::string& last_path() const { return last_path_; }

 private:
  options options_;
  best_tracker best_;
  weight_snapshot weights_;
  int epoch_ = -1;
  std::string last_path_;
};

// Appends each epoch's logs to a CSV file (rewritten through a temporary file each epoch, so it is always whole).
class CSVLogger : public callback {
 public:
  explicit CSVLogger(std::string path) : path_(std::move(path)) {}
  void on_train_begin(training_control&) override { rows_.clear(); }
  void on_epoch_end(int epoch, logs& l, training_control& control) override {
    rows_.emplace_back(epoch, l);
    if (!control.writes_files()) return;
    std::vector<std::string> keys;
    for (auto& [e, row] : rows_)
      for (auto& [k, v] : row.entries())
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    std::ostringstream out;
    out.precision(9);
    out << "epoch";
    for (auto& k : keys) out << ',' << k;
    out << '\n';
    for (auto& [e, row] : rows_) {
      out << e;
      for (auto& k : keys) {
        out << ',';
        if (auto v = row.get(k)) out << *v;
      }
      out << '\n';
    }
    io::write_file_atomically(path_, out.str());
  }

 private:
  std::string path_;
  std::vector<std::pair<int, logs>> rows_;
};

// Sets the learning rate at the start of every epoch from a schedule: lr = schedule(epoch, initial lr).
class LearningRateScheduler : public callback {
 public:
  using schedule_fn = std::function<double(int epoch, double initial_lr)>;
  explicit LearningRateScheduler(schedule_fn schedule) : schedule_(std::move(schedule)) {}

  // Multiplies the rate by gamma every step_size epochs (optim::StepLR's formula).
  static LearningRateScheduler step(int step_size, double gamma) {
    if (step_size <= 0) fail("LearningRateScheduler::step: expected step_size > 0, found ", step_size);
    return LearningRateScheduler([=](int epoch, double lr0) {
      return optim::StepLR::closed_form(lr0, epoch, {.step_size = step_size, .gamma = gamma});
    });
  }
  // Cosine annealing from the initial rate to min_lr over t_max epochs, then held at min_lr (optim::CosineAnnealingLR's
  // formula, which would rise again past t_max).
  static LearningRateScheduler cosine(int t_max, double min_lr = 0.0) {
    if (t_max <= 0) fail("LearningRateScheduler::cosine: expected t_max > 0, found ", t_max);
    return LearningRateScheduler([=](int epoch, double lr0) {
      return optim::CosineAnnealingLR::closed_form(lr0, std::min(epoch, t_max), {.t_max = t_max, .eta_min = min_lr});
    });
  }

  void on_train_begin(training_control& control) override { initial_ = control.lr(); }
  void on_epoch_begin(int epoch, training_control& control) override { control.set_lr(schedule_(epoch, initial_)); }
  void on_epoch_end(int, logs& l, training_control& control) override { l.set("lr", control.lr()); }

 private:
  schedule_fn schedule_;
  double initial_ = 0;
};

// ReduceLROnPlateau's settings, with Keras' defaults.
struct reduce_lr_on_plateau_options {
  std::string monitor = "val_loss";
  double factor = 0.1;
  int patience = 10;
  double min_delta = 1e-4;
  double min_lr = 0.0;
  int cooldown = 0;
  monitor_mode mode = monitor_mode::automatic;
};

// Multiplies the learning rate by factor when the monitored quantity has not improved for patience epochs.
class ReduceLROnPlateau : public callback {
 public:
  using options = reduce_lr_on_plateau_options;
  explicit ReduceLROnPlateau(options o = {}) : options_(std::move(o)), best_(options_.monitor, options_.mode, options_.min_delta) {
    if (options_.factor <= 0 || options_.factor >= 1)
      fail("ReduceLROnPlateau: expected 0 < factor < 1, found ", options_.factor);
  }
  void on_train_begin(training_control&) override {
    best_.reset();
    wait_ = cooldown_left_ = 0;
  }
  void on_epoch_end(int, logs& l, training_control& control) override {
    double value = detail::monitored(l, options_.monitor, "ReduceLROnPlateau");
    if (cooldown_left_ > 0) --cooldown_left_;
    if (best_.improved(value)) {
      wait_ = 0;
    } else if (cooldown_left_ == 0 && ++wait_ >= options_.patience) {
      control.set_lr(std::max(control.lr() * options_.factor, options_.min_lr));
      cooldown_left_ = options_.cooldown;
      wait_ = 0;
    }
    l.set("lr", control.lr());
  }

 private:
  options options_;
  best_tracker best_;
  int wait_ = 0, cooldown_left_ = 0;
};

// A callback from lambdas, for anything the others don't do.
class LambdaCallback : public callback {
 public:
  std::function<void(int, training_control&)> epoch_begin;
  std::function<void(int, logs&, training_control&)> epoch_end;
  std::function<void(long long, const logs&, training_control&)> batch_end;

  void on_epoch_begin(int epoch, training_control& c) override {
    if (epoch_begin) epoch_begin(epoch, c);
  }
  void on_epoch_end(int epoch, logs& l, training_control& c) override {
    if (epoch_end) epoch_end(epoch, l, c);
  }
  void on_batch_end(long long batch, const logs& l, training_control& c) override {
    if (batch_end) batch_end(batch, l, c);
  }
};

}  // namespace kiln::train
