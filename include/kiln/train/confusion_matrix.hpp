// The confusion matrix of a classifier and the per-class scores that follow from it: precision, recall, F1 and their
// averages (scikit-learn's definitions), and a printable per-class report.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

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

// How per-class scores become one number. macro: their plain mean; weighted: their mean weighted by each class's
// number of samples; micro: the score of all decisions pooled (for one label per sample, precision, recall and F1
// all equal the accuracy); binary: class 1's score alone. Macro and weighted average over the classes that occur
// among the labels or the predictions, as scikit-learn does. automatic: binary for a model with one output, macro
// for several.
enum class average { automatic, macro, weighted, micro, binary };

// The class a sample's outputs predict: the highest output (ties to the lower index, as argmax), or for a single
// output, class 1 when it is positive (a logit above 0, a probability of one half for a sigmoid's logit).
inline index_t predicted_class(const float* row, index_t width) {
  if (width == 1) return row[0] > 0 ? 1 : 0;
  return static_cast<index_t>(std::max_element(row, row + width) - row);
}

// Counts of (true class, predicted class) over the samples seen since reset(). Sized by the first batch when made
// without a class count: the output width, or two classes for a model with one output.
class confusion_matrix {
 public:
  confusion_matrix() = default;
  explicit confusion_matrix(index_t classes) { resize(classes); }

  index_t classes() const { return classes_; }
  long long total() const { return total_; }
  // Samples of class truth predicted as class predicted.
  long long count(index_t truth, index_t predicted) const {
    check_class(truth, "count");
    check_class(predicted, "count");
    return counts_[static_cast<std::size_t>(truth * classes_ + predicted)];
  }
  // Samples whose label is c (the row's sum), and samples predicted as c (the column's sum).
  long long support(index_t c) const {
    check_class(c, "support");
    long long s = 0;
    for (index_t p = 0; p < classes_; ++p) s += count(c, p);
    return s;
  }
  long long predictions(index_t c) const {
    check_class(c, "predictions");
    long long s = 0;
    for (index_t t = 0; t < classes_; ++t) s += count(t, c);
    return s;
  }

  void reset() { std::fill(counts_.begin(), counts_.end(), 0), total_ = 0; }
  // The counts row by row, then the total, as numbers to add across processes; set_count_values takes them back.
  std::vector<double> count_values() const {
    std::vector<double> values(counts_.begin(), counts_.end());
    values.push_back(static_cast<double>(total_));
    return values;
  }
  void set_count_values(std::span<const double> values) {
    if (values.size() != counts_.size() + 1)
      fail("confusion_matrix: expected ", counts_.size() + 1, " count values, found ", values.size());
    for (std::size_t i = 0; i < counts_.size(); ++i) counts_[i] = static_cast<long long>(values[i]);
    total_ = static_cast<long long>(values.back());
  }
  void update(const batch_view& b) {
    if (!b.labels) fail("confusion_matrix: expected integer labels, found real-valued targets");
    index_t classes = b.width == 1 ? 2 : b.width;
    if (classes_ == 0) resize(classes);
    if (classes != classes_)
      fail("confusion_matrix: expected outputs for ", classes_, " classes, found a batch of width ", b.width);
    for (index_t i = 0; i < b.batch; ++i) {
      std::int64_t label = b.labels[i];
      if (label < 0 || label >= classes_)
        fail("confusion_matrix: expected labels in [0, ", classes_, "), found ", label, " at sample ", i,
             " of the batch");
      index_t predicted = predicted_class(b.output + i * b.width, b.width);
      ++counts_[static_cast<std::size_t>(label * classes_ + predicted)];
    }
    total_ += b.batch;
  }

  // Of the samples predicted as c, the fraction whose label is c (0 when none is predicted as c).
  double precision(index_t c) const { return ratio(count(c, c), predictions(c)); }
  // Of the samples whose label is c, the fraction predicted as c (0 when none has label c).
  double recall(index_t c) const { return ratio(count(c, c), support(c)); }
  // The harmonic mean of precision and recall (0 when both are 0).
  double f1(index_t c) const {
    double p = precision(c), r = recall(c);
    return p + r > 0 ? 2 * p * r / (p + r) : 0.0;
  }
  // Fraction of samples predicted correctly.
  double accuracy() const {
    long long hits = 0;
    for (index_t c = 0; c < classes_; ++c) hits += count(c, c);
    return ratio(hits, total_);
  }

  double precision(average how) const { return averaged(how, &confusion_matrix::precision); }
  double recall(average how) const { return averaged(how, &confusion_matrix::recall); }
  double f1(average how) const { return averaged(how, &confusion_matrix::f1); }

  // A table of precision, recall, F1 and support per class, then their macro and weighted averages and the accuracy.
  // names, when given, label the classes (one per class).
  std::string report(const std::vector<std::string>& names = {}) const {
    if (!names.empty() && static_cast<index_t>(names.size()) != classes_)
      fail("confusion_matrix::report: expected ", classes_, " class names, found ", names.size());
    std::size_t label_width = 12;
    for (auto& n : names) label_width = std::max(label_width, n.size());
    std::string out;
    auto row = [&](const std::string& label, double p, double r, double f, long long s) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "%*s %9.4f %9.4f %9.4f %9lld\n", static_cast<int>(label_width), label.c_str(), p,
                    r, f, s);
      out += buf;
    };
    char head[128];
    std::snprintf(head, sizeof head, "%*s %9s %9s %9s %9s\n", static_cast<int>(label_width), "", "precision",
                  "recall", "f1", "support");
    out += head;
    for (index_t c = 0; c < classes_; ++c)
      row(names.empty() ? std::to_string(c) : names[static_cast<std::size_t>(c)], precision(c), recall(c), f1(c),
          support(c));
    row("macro avg", precision(average::macro), recall(average::macro), f1(average::macro), total_);
    row("weighted avg", precision(average::weighted), recall(average::weighted), f1(average::weighted), total_);
    char tail[128];
    std::snprintf(tail, sizeof tail, "%*s %29.4f %9lld\n", static_cast<int>(label_width), "accuracy", accuracy(),
                  total_);
    out += tail;
    return out;
  }

 private:
  static double ratio(long long a, long long b) { return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0; }
  void resize(index_t classes) {
    if (classes < 2) fail("confusion_matrix: expected at least 2 classes, found ", classes);
    classes_ = classes;
    counts_.assign(static_cast<std::size_t>(classes * classes), 0);
    total_ = 0;
  }
  void check_class(index_t c, const char* where) const {
    if (c < 0 || c >= classes_)
      fail("confusion_matrix::", where, ": expected a class in [0, ", classes_, "), found ", c);
  }
  double averaged(average how, double (confusion_matrix::*score)(index_t) const) const {
    if (classes_ == 0) return 0.0;
    switch (how) {
      case average::automatic:
        fail("confusion_matrix: average::automatic depends on the model's outputs; choose macro or binary");
      case average::binary:
        if (classes_ != 2) fail("confusion_matrix: average::binary expects 2 classes, found ", classes_);
        return (this->*score)(1);
      case average::micro:
        // One label and one prediction per sample: every miss is one false positive and one false negative, so
        // pooled precision, recall and F1 are all the accuracy.
        return accuracy();
      case average::macro:
      case average::weighted: {
        double sum = 0, weight = 0;
        for (index_t c = 0; c < classes_; ++c) {
          long long s = support(c);
          if (s == 0 && predictions(c) == 0) continue;  // a class that never occurs does not count
          double w = how == average::weighted ? static_cast<double>(s) : 1.0;
          sum += w * (this->*score)(c);
          weight += w;
        }
        return weight > 0 ? sum / weight : 0.0;
      }
    }
    return 0.0;
  }

  index_t classes_ = 0;
  std::vector<long long> counts_;
  long long total_ = 0;
};

}  // namespace kiln::metric
