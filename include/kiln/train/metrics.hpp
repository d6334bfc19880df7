// Metrics for Model::fit and evaluate: accuracy, top-k accuracy, mean squared and mean absolute error. Each
// accumulates over batches and reports the mean over all samples seen since reset().
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::metric {

// What a metric sees of one batch: the model's output (batch x width) and either integer labels or real targets.
struct batch_view {
  const float* output = nullptr;
  index_t batch = 0, width = 0;
  const std::int64_t* labels = nullptr;  // classification
  const float* targets = nullptr;        // regression, batch x width
};

// A metric accumulates per-batch sums; result() is the running mean.
struct metric_spec {
  enum class kind { accuracy, top_k_accuracy, mse, mae } what;
  int k = 1;

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
    }
    return "?";
  }
};

// Fraction of samples whose highest output is the label (one output: positive logit means class 1).
inline constexpr metric_spec accuracy{metric_spec::kind::accuracy, 1};
// Fraction of samples whose label is among the k highest outputs.
inline metric_spec top_k_accuracy(int k) {
  if (k < 1) fail("top_k_accuracy: expected k >= 1, found ", k);
  return {metric_spec::kind::top_k_accuracy, k};
}
// Mean squared error against real targets.
inline constexpr metric_spec mse{metric_spec::kind::mse, 1};
// Mean absolute error against real targets.
inline constexpr metric_spec mae{metric_spec::kind::mae, 1};

// The running state of one metric during an epoch.
class accumulator {
 public:
  explicit accumulator(metric_spec spec) : spec_(spec) {}
  const metric_spec& spec() const { return spec_; }
  std::string name() const { return spec_.name(); }
  void reset() { total_ = 0, count_ = 0; }
  double result() const { return count_ ? total_ / static_cast<double>(count_) : 0.0; }

  void update(const batch_view& b) {
    switch (spec_.what) {
      case metric_spec::kind::accuracy:
      case metric_spec::kind::top_k_accuracy: update_top_k(b, spec_.what == metric_spec::kind::accuracy ? 1 : spec_.k); break;
      case metric_spec::kind::mse:
      case metric_spec::kind::mae: update_error(b, spec_.what == metric_spec::kind::mse); break;
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

  metric_spec spec_;
  double total_ = 0;
  long long count_ = 0;
};

}  // namespace kiln::metric
