// kiln::distributed::shard_dataset: one rank's shard of a data set for one epoch, as a data set of its own, so that a
// data::data_loader batches it:
//
//   distributed::shard_dataset shard(train, distributed::distributed_sampler(train.size(), rank, world, {.seed = 1}));
//   data::data_loader loader(shard, {.batch_size = 32, .shuffle = false});  // the sampler already shuffles
//   for (int e = 0; e < epochs; ++e) {
//     shard.set_epoch(e);                                // before the loader starts the epoch
//     for (const auto& batch : loader.epoch(e)) ...
//   }
//
// Sample i of the shard is sample indices(epoch)[i] of the data set, which is referenced, not copied.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/distributed/distributed_sampler.hpp"

namespace kiln::distributed {

template <data::dataset D>
class shard_dataset {
 public:
  using feature_type = typename D::feature_type;
  using label_type = typename D::label_type;

  // Starts at epoch 0. The sampler must be for a data set of data's size.
  shard_dataset(const D& data, distributed_sampler sampler) : data_(&data), sampler_(std::move(sampler)) {
    if (sampler_.dataset_size() != data.size())
      fail("shard_dataset: expected a sampler for the data set's ", data.size(), " samples, found one for ",
           sampler_.dataset_size());
    set_epoch(0);
  }

  // Moves to another epoch's shard. Not while a data loader is in the middle of an epoch over this one.
  void set_epoch(std::uint64_t epoch) {
    sampler_.indices(epoch, indices_);
  }

  index_t size() const { return static_cast<index_t>(indices_.size()); }
  shape sample_shape() const { return data_->sample_shape(); }
  shape label_shape() const { return data_->label_shape(); }
  void get(index_t i, tensor_view<feature_type> x, tensor_view<label_type> y) const {
    if (i < 0 || i >= size()) fail("shard_dataset::get: index ", i, " is out of range for a shard of ", size());
    data_->get(indices_[static_cast<std::size_t>(i)], x, y);
  }

  // The data set indices of this epoch's shard, in order.
  const std::vector<index_t>& indices() const { return indices_; }
  const distributed_sampler& sampler() const { return sampler_; }

 private:
  const D* data_;
  distributed_sampler sampler_;
  std::vector<index_t> indices_;
};

}  // namespace kiln::distributed
