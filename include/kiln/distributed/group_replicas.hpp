// kiln::distributed::group_replicas: kiln::replica_reducer (core/replicas.hpp) over the ranks of a process group, each
// rank one replica of a data-parallel model. static_data_parallel holds one and lends it to the model it wraps
// (Sequential::set_replicas), through which static mode's SyncBatchNorm sums its statistics over the ranks;
// dynamic_data_parallel lends its own to the module's distributed::SyncBatchNorm layers on its group.
//
// A sum is a blocking all-reduce on the group. During a training step the gradient reducer may have buckets in flight
// on the same group, started by its progress thread at moments that differ from rank to rank; a sum therefore runs
// through the reducer's within_step, which puts it in the same place among the buckets on every rank and keeps the
// two threads from calling MPI at once.
#pragma once

#include <span>

#include "kiln/core/replicas.hpp"
#include "kiln/distributed/gradient_reducer.hpp"
#include "kiln/distributed/process_group.hpp"

namespace kiln::distributed {

// T: the value type of the gradient reducer the sums share the group with.
template <class T>
class group_replicas final : public replica_reducer {
 public:
  // reducer: the one reducing the model's gradients over the same group, or null where none does; both outlive this.
  explicit group_replicas(process_group& group, gradient_reducer<T>* reducer = nullptr)
      : group_(&group), reducer_(reducer) {}

  void sum(std::span<float> values) override { all_reduce(values); }
  void sum(std::span<double> values) override { all_reduce(values); }

 private:
  template <class U>
  void all_reduce(std::span<U> values) {
    const auto run = [&] { group_->all_reduce(values, reduce_op::sum, "sum over the replicas (SyncBatchNorm)"); };
    if (reducer_) reducer_->within_step(run);
    else run();
  }

  process_group* group_;
  gradient_reducer<T>* reducer_;
};

}  // namespace kiln::distributed
