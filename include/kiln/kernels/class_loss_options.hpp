// What the classification loss kernels (cross-entropy, negative log-likelihood) take beyond logits, labels and the
// reduction: PyTorch's per-class weight, ignore_index and label_smoothing, and the checks both backends and both modes
// apply to them, so that a bad option or label gives the same kiln::error everywhere.
#pragma once

#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::kernels {

// The options of one call to a classification loss kernel. The defaults change nothing: a kernel given them runs its
// plain path. Passed by value to CUDA kernels, so it holds no host-only types.
template <class T>
struct class_loss_options {
  const T* weight = nullptr;       // one weight per class, in the policy's memory; null: every class weighs 1
  bool has_ignore_index = false;   // whether rows labelled ignore_index count for nothing
  std::int64_t ignore_index = 0;
  T label_smoothing = 0;           // cross-entropy only: the target is (1 - s) one-hot + s uniform over the classes

  KILN_HOST_DEVICE bool ignores(std::int64_t label) const { return has_ignore_index && label == ignore_index; }
  // The weight of class c: 1 without per-class weights.
  KILN_HOST_DEVICE T weight_of(std::int64_t c) const { return weight ? weight[c] : T(1); }
  bool plain() const { return !weight && !has_ignore_index && label_smoothing == T(0); }
};

// Checks what a kernel cannot: that there is one weight per class (weight_count 0: no weights) and that
// label_smoothing lies in [0, 1] (NaN does not). `loss` names the loss in the message.
inline void check_class_loss_options(const char* loss, index_t weight_count, index_t classes, double label_smoothing) {
  if (weight_count != 0 && weight_count != classes)
    fail(loss, ": expected ", classes, " class weights (one per class of the input's ", classes, " columns), found ",
         weight_count);
  if (!(label_smoothing >= 0 && label_smoothing <= 1))
    fail(loss, ": expected label_smoothing in [0, 1], found ", label_smoothing);
}

// The error for a label outside [0, classes) that the options do not ignore, found at `row` of the batch.
template <class T>
[[noreturn]] void fail_bad_label(const char* loss, std::int64_t label, index_t row, index_t classes,
                                 const class_loss_options<T>& o) {
  if (o.has_ignore_index)
    fail(loss, ": expected labels in [0, ", classes, ") or the ignore_index ", o.ignore_index, ", found ", label,
         " at row ", row);
  fail(loss, ": expected labels in [0, ", classes, "), found ", label, " at row ", row);
}

// Checks every label of a batch in host memory.
template <class T>
void check_class_labels(const char* loss, const std::int64_t* labels, index_t rows, index_t classes,
                        const class_loss_options<T>& o) {
  for (index_t row = 0; row < rows; ++row)
    if (!o.ignores(labels[row]) && (labels[row] < 0 || labels[row] >= classes))
      fail_bad_label(loss, labels[row], row, classes, o);
}

}  // namespace kiln::kernels
