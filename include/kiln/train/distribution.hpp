// What Model::fit needs to train across processes, apart from any transport: the process's rank among how many, and
// sums over them. kiln/distributed implements it over MPI (distributed::group_distribution), and a Model over a
// data-parallel model (distributed::static_data_parallel) trains through it: each rank on its shard of every epoch
// (distributed_sampler), the epoch's logs summed over the ranks so that every rank sees the same numbers and its
// callbacks decide alike, the progress bar and the callbacks' files on rank 0 only.
#pragma once

#include <span>

namespace kiln::train {

// Contract:
//   requires: every rank calls sum at the same points, with as many values.
//   ensures:  sum leaves in values[i] the sum over the ranks of their values[i], the same on every rank.
class distribution {
 public:
  virtual ~distribution() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void sum(std::span<double> values) = 0;
};

}  // namespace kiln::train
