// kiln::distributed::distributed_sampler: which samples of a data set each rank trains on in each epoch, as PyTorch's
// DistributedSampler. Every rank draws the same seeded permutation of the whole data set for the epoch, makes its
// length a multiple of the number of ranks (by repeating its first samples, or by dropping its last ones with
// drop_last), and takes every world_size-th sample from its own rank on: rank r gets positions r, r + W, r + 2W, ...
//
// The permutation is the one a data::data_loader with the same seed draws for the epoch, so one rank's sampler gives
// the loader's order, and batch k of B samples on each of W ranks holds the samples of batch k of W * B samples on one
// process: data-parallel training sees the batches a single process would. It needs no MPI: rank and world size are
// numbers here, so every rank's shard can also be computed on one process.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/random.hpp"
#include "kiln/data/data_loader.hpp"

namespace kiln::distributed {

struct sampler_options {
  bool shuffle = true;     // a new permutation each epoch; false: the samples in order
  std::uint64_t seed = 0;  // fixes every epoch's permutation (the data_loader's seed gives its order)
  bool drop_last = false;  // drop the samples past the last multiple of the world size instead of repeating some
};

class distributed_sampler {
 public:
  distributed_sampler(index_t dataset_size, int rank, int world_size, sampler_options options = {})
      : size_(dataset_size), rank_(rank), world_(world_size), options_(options) {
    if (dataset_size < 0) fail("distributed_sampler: expected a data set size >= 0, found ", dataset_size);
    if (world_size < 1 || rank < 0 || rank >= world_size)
      fail("distributed_sampler: expected a rank from 0 to world_size - 1 and world_size >= 1, found rank ", rank,
           " of ", world_size);
    if (options_.drop_last ? dataset_size < world_size : dataset_size == 0)
      fail("distributed_sampler: expected at least ", options_.drop_last ? world_size : 1, " samples for ",
           world_size, " ranks", options_.drop_last ? " with drop_last" : "", ", found ", dataset_size);
  }

  // Samples per rank per epoch, the same on every rank.
  index_t samples_per_rank() const {
    const index_t w = world_;
    return options_.drop_last ? size_ / w : (size_ + w - 1) / w;
  }
  // Samples over all ranks per epoch: the data set's size, padded or cut to a multiple of the world size.
  index_t total_size() const { return samples_per_rank() * world_; }
  index_t dataset_size() const { return size_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const sampler_options& options() const { return options_; }

  // This rank's data set indices for `epoch`, in the order to train on them.
  std::vector<index_t> indices(std::uint64_t epoch) const {
    std::vector<index_t> out;
    indices(epoch, out);
    return out;
  }
  // The same into `out`, whose capacity is kept from epoch to epoch.
  void indices(std::uint64_t epoch, std::vector<index_t>& out) const {
    permutation(epoch, order_);
    const index_t count = samples_per_rank();
    out.resize(static_cast<std::size_t>(count));
    for (index_t i = 0; i < count; ++i) {
      // Padding repeats the permutation from its start, as often as needed (more ranks than samples included).
      const index_t position = (rank_ + i * world_) % size_;
      out[static_cast<std::size_t>(i)] = order_[static_cast<std::size_t>(position)];
    }
  }

 private:
  // data::data_loader's order for the epoch: a Fisher-Yates shuffle on the loader's stream for it.
  void permutation(std::uint64_t epoch, std::vector<index_t>& order) const {
    order.resize(static_cast<std::size_t>(size_));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<index_t>(i);
    if (options_.shuffle && order.size() > 1) {
      random_generator rng = random_generator(options_.seed).fork(data::shuffle_stream(epoch));
      for (std::size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    }
  }

  index_t size_;
  int rank_, world_;
  sampler_options options_;
  mutable std::vector<index_t> order_;  // the whole permutation, kept to save its allocation each epoch
};

}  // namespace kiln::distributed
