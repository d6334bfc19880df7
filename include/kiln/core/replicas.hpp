// kiln::replica_reducer: sums of values over the replicas of a data-parallel model (each process holds a copy of the
// model and trains it on its part of every batch), as the code running on each replica asks for them. The interface
// lives here so that a layer that computes across the replicas (static mode's SyncBatchNorm) needs no MPI: kiln/
// distributed implements it over a process group (distributed::group_replicas), static_data_parallel lends one to the
// model it wraps, and the model hands it to its layers in layer_context::replicas (dynamic_data_parallel lends its
// own to the module's distributed::SyncBatchNorm layers).
#pragma once

#include <span>

namespace kiln {

class replica_reducer {
 public:
  virtual ~replica_reducer() = default;
  // Replaces every value by its sum over the replicas, on every replica. A collective: every replica calls it at the
  // same point of its program, with as many values, and waits for the others.
  virtual void sum(std::span<float> values) = 0;
  virtual void sum(std::span<double> values) = 0;

 protected:
  replica_reducer() = default;
  replica_reducer(const replica_reducer&) = default;
  replica_reducer& operator=(const replica_reducer&) = default;
};

// A replica_reducer lent to one object (a model, a layer) by the data-parallel wrapper around it, null when none is.
// The loan stays with that object, whose wrapper takes it back when it goes: a copy or a move of the object starts
// without one, and assigning to the object keeps its own.
struct lent_replicas {
  replica_reducer* lent = nullptr;
  lent_replicas() = default;
  lent_replicas(const lent_replicas&) noexcept {}
  lent_replicas& operator=(const lent_replicas&) noexcept { return *this; }
};

}  // namespace kiln
