// The dataset concept (indexed samples copied into caller-owned memory) and tensor_dataset, the in-memory one.
#pragma once

#include <concepts>
#include <cstring>
#include <span>
#include <utility>

#include "kiln/core/tensor.hpp"

namespace kiln::data {

// A data set of size() samples. Sample i is copied by get(i, x, y) into views the caller owns, shaped sample_shape()
// and label_shape() (an empty shape for a scalar label), so a loader can fill pre-allocated batch buffers row by row
// without the data set allocating anything.
template <class D>
concept dataset = requires(const D& d, index_t i, tensor_view<typename D::feature_type> x,
                           tensor_view<typename D::label_type> y) {
  typename D::feature_type;
  typename D::label_type;
  { d.size() } -> std::convertible_to<index_t>;
  { d.sample_shape() } -> std::convertible_to<shape>;
  { d.label_shape() } -> std::convertible_to<shape>;
  d.get(i, x, y);
};

// Copies the samples `indices` of `data` into the first indices.size() rows of the batch tensors x and y.
template <dataset D>
void get_batch(const D& data, std::span<const index_t> indices, tensor_view<typename D::feature_type> x,
               tensor_view<typename D::label_type> y) {
  const auto count = static_cast<index_t>(indices.size());
  if (x.rank() == 0 || x.extent(0) < count || y.rank() == 0 || y.extent(0) < count)
    fail("get_batch: expected batch tensors with at least ", count, " rows, found ", x.shape(), " and ", y.shape());
  for (index_t b = 0; b < count; ++b) {
    auto xr = x.rows(b, 1);
    auto yr = y.rows(b, 1);
    data.get(indices[static_cast<std::size_t>(b)], xr.reshaped(data.sample_shape()), yr.reshaped(data.label_shape()));
  }
}

namespace detail {
inline shape drop_first(const shape& s) {
  shape out;
  for (int d = 1; d < s.rank(); ++d) out.push_back(s[d]);
  return out;
}
}  // namespace detail

// An in-memory data set: features (N, ...) and labels (N) for classification or targets (N, ...) for regression.
template <class T, class Label = std::int64_t>
class tensor_dataset {
 public:
  using feature_type = T;
  using label_type = Label;

  tensor_dataset() = default;
  tensor_dataset(Tensor<T> features, Tensor<Label> labels) : features_(std::move(features)), labels_(std::move(labels)) {
    if (features_.rank() == 0 || labels_.rank() == 0 || features_.extent(0) != labels_.extent(0))
      fail("tensor_dataset: features ", features_.shape(), " and labels ", labels_.shape(),
           " must both have rank >= 1 and the same number of samples in dimension 0");
  }

  index_t size() const { return features_.rank() ? features_.extent(0) : 0; }
  shape sample_shape() const { return detail::drop_first(features_.shape()); }
  shape label_shape() const { return detail::drop_first(labels_.shape()); }

  // Copies sample i into x (sample_shape()) and its label into y (label_shape()).
  void get(index_t i, tensor_view<T> x, tensor_view<Label> y) const {
    if (i < 0 || i >= size()) fail("tensor_dataset::get: index ", i, " is out of range for ", size(), " samples");
    if (x.numel() != features_.shape().row_size() || y.numel() != labels_.shape().row_size())
      fail("tensor_dataset::get: expected views of shape ", sample_shape(), " and ", label_shape(), ", found ",
           x.shape(), " and ", y.shape());
    const index_t fr = features_.shape().row_size(), lr = labels_.shape().row_size();
    if (fr) std::memcpy(x.data(), features_.data() + i * fr, static_cast<std::size_t>(fr) * sizeof(T));
    if (lr) std::memcpy(y.data(), labels_.data() + i * lr, static_cast<std::size_t>(lr) * sizeof(Label));
  }

  const Tensor<T>& features() const { return features_; }
  const Tensor<Label>& labels() const { return labels_; }
  Tensor<T>& features() { return features_; }

 private:
  Tensor<T> features_;
  Tensor<Label> labels_;
};

}  // namespace kiln::data
