// kiln::labelled_data: features and targets held in memory, viewed without copying. What Model::fit and evaluate
// iterate over for a data set held in memory.
#pragma once

#include <algorithm>
#include <concepts>

#include "kiln/core/tensor.hpp"
#include "kiln/data/dataset.hpp"

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

}  // namespace kiln
