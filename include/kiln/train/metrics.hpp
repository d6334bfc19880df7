// Metrics for Model::fit and evaluate: accuracy, top-k accuracy, precision, recall, F1, mean squared and mean absolute
// error. Each accumulates over batches and reports its value over all samples seen since reset().
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/train/confusion_matrix.hpp"

namespace kiln::metric {

// Which metric, with its setting: k for top-k accuracy, the average for precision, recall and F1.
struct metric_spec {
  enum class kind { accuracy, top_k_accuracy, mse, mae, precision, recall, f1 } what;
  int k = 1;
  average how = average::automatic;

  std::string name() const {
    switch (what) {
      case kind::accuracy: return "accuracy";
      case kind::top_k_accuracy: {
        std::string n = "top";
        n += std::to_string(k);
        n += "_accuracy";
        return n;
      }
      case kind::mse: return "mse";
      case kind::mae: return "mae";
      case kind::precision: return "precision" + suffix();
      case kind::recall: return "recall" + suffix();
      case kind::f1: return "f1" + suffix();
    }
    return "?";
  }

 private:
  // Keras' plain names for the default average; the others say which they are.
  std::string suffix() const {
    switch (how) {
      case average::automatic: return "";
      case average::macro: return "_macro";
      case average::weighted: return "_weighted";
      case average::micro: return "_micro";
      case average::binary: return "_binary";
    }
    return "";
  }
};

// Fraction of samples whose highest output is the label (one output: positive logit means class 1).
inline constexpr metric_spec accuracy{metric_spec::kind::accuracy, 1};
// Fraction of samples whose label is among the k highest outputs.
inline metric_spec top_k_accuracy(int k) {
  if (k < 1) fail("top_k_accuracy: expected k >= 1, found ", k);
  return {metric_spec::kind::top_k_accuracy, k};
}
// Precision, recall and F1 of a classifier: of class 1 for a model with one output (a positive logit predicts it),
// the macro average over the classes for several outputs, or as `how` says (see metric::average).
inline metric_spec precision(average how = average::automatic) { return {metric_spec::kind::precision, 1, how}; }
inline metric_spec recall(average how = average::automatic) { return {metric_spec::kind::recall, 1, how}; }
inline metric_spec f1_score(average how = average::automatic) { return {metric_spec::kind::f1, 1, how}; }
// Mean squared error against real targets.
inline constexpr metric_spec mse{metric_spec::kind::mse, 1};
// Mean absolute error against real targets.
inline constexpr metric_spec mae{metric_spec::kind::mae, 1};

// The running state of one metric during an epoch: sums for the means, counts for the scores of a confusion matrix.
class accumulator {
 public:
  explicit accumulator(metric_spec spec) : spec_(spec) {}
  const metric_spec& spec() const { return spec_; }
  std::string name() const { return spec_.name(); }
  void reset() { total_ = 0, count_ = 0, confusion_.reset(); }
  // The sums behind result(), as numbers to add across processes (Model::fit over several ranks), and back: after
  // set_sums with every rank's added, result() is the whole epoch's.
  std::vector<double> sums() const {
    if (is_confusion()) return confusion_.count_values();
    return {total_, static_cast<double>(count_)};
  }
  void set_sums(std::span<const double> values) {
    if (is_confusion()) return confusion_.set_count_values(values);
    if (values.size() != 2) fail("metric ", name(), ": expected 2 sums, found ", values.size());
    total_ = values[0];
    count_ = static_cast<long long>(values[1]);
  }
  double result() const {
    switch (spec_.what) {
      case metric_spec::kind::precision: return confusion_.precision(resolved_average());
      case metric_spec::kind::recall: return confusion_.recall(resolved_average());
      case metric_spec::kind::f1: return confusion_.f1(resolved_average());
      default: return count_ ? total_ / static_cast<double>(count_) : 0.0;
    }
  }

  void update(const batch_view& b) {
    switch (spec_.what) {
      case metric_spec::kind::accuracy:
      case metric_spec::kind::top_k_accuracy: update_top_k(b, spec_.what == metric_spec::kind::accuracy ? 1 : spec_.k); break;
      case metric_spec::kind::mse:
      case metric_spec::kind::mae: update_error(b, spec_.what == metric_spec::kind::mse); break;
      case metric_spec::kind::precision:
      case metric_spec::kind::recall:
      case metric_spec::kind::f1:
        if (!b.labels) fail("metric ", name(), ": expected integer labels, found real-valued targets");
        if (spec_.how == average::binary && b.width > 2)
          fail("metric ", name(), ": average::binary expects one or two outputs, found ", b.width);
        confusion_.update(b);
        width_ = b.width;
        break;
    }
  }

 private:
  void update_top_k(const batch_view& b, int k) {
    if (!b.labels) fail("metric ", name(), ": expected integer labels, found real-valued targets");
    for (index_t i = 0; i < b.batch; ++i) {
      const float* row = b.output + i * b.width;
      std::int64_t label = b.labels[i];
      bool hit;
      if (b.width == 1) {
        hit = (row[0] > 0) == (label == 1);
      } else {
        // The label is in the top k when fewer than k outputs beat it (ties go to the lower index, as argmax).
        int better = 0;
        for (index_t c = 0; c < b.width; ++c)
          if (row[c] > row[label] || (row[c] == row[label] && c < label)) ++better;
        hit = better < k;
      }
      total_ += hit ? 1.0 : 0.0;
    }
    count_ += b.batch;
  }
  void update_error(const batch_view& b, bool squared) {
    if (!b.targets) fail("metric ", name(), ": expected real-valued targets, found integer labels");
    double sum = 0;
    for (index_t i = 0; i < b.batch * b.width; ++i) {
      double d = static_cast<double>(b.output[i]) - b.targets[i];
      sum += squared ? d * d : std::abs(d);
    }
    total_ += sum / static_cast<double>(b.width);
    count_ += b.batch;
  }

  bool is_confusion() const {
    return spec_.what == metric_spec::kind::precision || spec_.what == metric_spec::kind::recall ||
           spec_.what == metric_spec::kind::f1;
  }
  average resolved_average() const {
    if (spec_.how != average::automatic) return spec_.how;
    return width_ == 1 ? average::binary : average::macro;
  }

  metric_spec spec_;
  double total_ = 0;
  long long count_ = 0;
  confusion_matrix confusion_;
  index_t width_ = 0;
};

}  // namespace kiln::metric
