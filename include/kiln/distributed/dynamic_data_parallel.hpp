// kiln::distributed::dynamic_data_parallel: data-parallel training of a dynamic model (an nn::Module) over the ranks of
// a process group, as PyTorch's DistributedDataParallel:
//
//   distributed::dynamic_data_parallel ddp(model, group);  // checks the ranks' models agree, copies rank 0's
//   optim::Adam adam(model.parameters(), {.lr = 1e-3});
//   adam.zero_grad();
//   auto loss = nn::cross_entropy(model(nn::Variable::borrowing(x)), y.span());
//   loss.backward();
//   ddp.reduce_gradients();                                // the average of every rank's gradients
//   adam.step();
//
// The parameters that require grad are reduced in buckets in reverse registration order (the order the backward
// finishes them), with the same caps as PyTorch's (bucket_options). Each bucket is a part of one flat host buffer that
// the gradients are copied into, and is all-reduced by gradient_reducer as soon as it is full, while the next ones
// are being copied. A parameter that got no gradient in this step (unused by the forward, or still lazily zeroed by
// zero_grad) counts as zeros, so the ranks' buckets still match; every reduced gradient is written back.
//
// To overlap the reduction with the backward, as static mode does, call ddp.backward(loss) instead of
// loss.backward(): the tape then says when each parameter's gradient is final (the last entry that reads the
// parameter has run), and a bucket's all-reduce starts as soon as every parameter in it, and every one registered
// after it, is final; reduce_gradients() then waits for the last buckets. After a plain loss.backward(),
// reduce_gradients() reduces everything at once. Either way the sums are the same, bit for bit.
//
//   adam.zero_grad();
//   ddp.backward(nn::cross_entropy(model(nn::Variable::borrowing(x)), y.span()));
//   ddp.reduce_gradients();
//   adam.step();
//
// Buffers (running statistics) are rank 0's at the start and each rank's own afterwards.
//
// Other collectives on the group. Every rank must make the same collectives on the group in the same order (in
// training, each forward and each backward of a SyncBatchNorm layer makes some; so does each call to average()).
// Between backward() and reduce_gradients() buckets may be in flight, started by the reducer's progress thread at
// moments that differ from rank to rank, so a collective there must also come in the same place among the buckets on
// every rank, and must not call MPI beside that thread: it runs through the reducer's within_step, which starts the
// buckets closed so far and then runs it under the reducer's lock. The wrapper's replicas (group_replicas,
// replicas()) sum that way. It lends them to the module's distributed::SyncBatchNorm layers on its group while it
// wraps the module (set_replicas); a layer of the program's own sums through all_reduce_sum(x, ddp.replicas()); and
// average() goes the same way. A SyncBatchNorm on another group is not lent them: under ddp.backward its all-reduces
// would call MPI beside the progress thread, so such a model takes a plain loss.backward().
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/dynamic/module.hpp"
#include "kiln/dynamic/policy.hpp"
#include "kiln/dynamic/variable.hpp"
#include "kiln/distributed/gradient_reducer.hpp"
#include "kiln/distributed/group_replicas.hpp"
#include "kiln/distributed/process_group.hpp"
#include "kiln/distributed/static_data_parallel.hpp"
#include "kiln/distributed/sync_batch_norm.hpp"

namespace kiln::distributed {

template <class T>
class basic_dynamic_data_parallel {
 public:
  static_assert(nn::dynamic_policy::host_accessible,
                "kiln::distributed::dynamic_data_parallel: MPI reduces host memory; dynamic mode on a GPU policy "
                "needs a process group over NCCL");

  // Checks that every rank's module has the same parameters (every rank fails, naming each rank's count, when one
  // differs) and copies rank 0's parameters and buffers to the others. The parameters that require grad now are
  // the ones reduced, and the SyncBatchNorm layers on this group now are the ones lent the replicas. Every rank must
  // make it at the same point of the program. The module outlives the wrapper.
  basic_dynamic_data_parallel(nn::basic_module<T>& module, process_group& group, bucket_options options = {})
      : module_(&module), group_(&group), reducer_(group, options), replicas_(group, &reducer_) {
    index_t offset = 0;
    std::uint64_t h = detail::fingerprint_seed;
    for (const auto& [name, p] : module.named_parameters()) {
      h = detail::fingerprint(h, name, p.shape());
      if (!p.requires_grad()) continue;
      entries_.push_back({p, offset});
      offset += p.numel();
    }
    group.check_same(static_cast<std::int64_t>(module.named_parameters().size()), "number of parameter tensors");
    group.check_same(offset, "number of parameter values that require grad");
    group.check_same(static_cast<std::int64_t>(h), "fingerprint of the parameter names and shapes");
    flat_ = aligned_buffer<T>(offset);
    for (const auto& e : entries_) leaves_.push_back(e.parameter.node());
    ready_.assign(entries_.size(), false);
    broadcast_state();
    for_each_sync_batch_norm([&](basic_sync_batch_norm<T>& norm) { norm.set_replicas(&replicas_); });
  }
  // The module's SyncBatchNorm layers sum on the group itself again.
  ~basic_dynamic_data_parallel() {
    for_each_sync_batch_norm([&](basic_sync_batch_norm<T>& norm) {
      if (norm.replicas() == &replicas_) norm.set_replicas(nullptr);
    });
  }
  // The module's layers hold the address of this wrapper's replicas.
  basic_dynamic_data_parallel(const basic_dynamic_data_parallel&) = delete;
  basic_dynamic_data_parallel& operator=(const basic_dynamic_data_parallel&) = delete;

  // loss.backward(options), with each bucket's all-reduce started as soon as its gradients are final; call
  // reduce_gradients() next.
  void backward(const nn::basic_variable<T>& loss, nn::backward_options options = {}) {
    if (step_open_)
      fail("dynamic_data_parallel::backward: the previous backward's gradients were never reduced "
           "(reduce_gradients() after each backward)");
    reducer_.begin(std::span<T>(flat_.data(), static_cast<std::size_t>(flat_.size())));
    step_open_ = true;
    std::fill(ready_.begin(), ready_.end(), false);
    next_ = entries_.size();
    try {
      loss.backward(listener_, options);
    } catch (...) {
      step_open_ = false;
      reducer_.cancel();
      throw;
    }
  }

  // Copies the parameters and buffers of rank `root` to every rank.
  void broadcast_state(int root = 0) {
    for (const auto& p : module_->parameters())
      group_->broadcast(std::span<T>(p.data(), static_cast<std::size_t>(p.numel())), root,
                        "broadcast of a parameter");
    for (const auto& b : module_->buffers())
      group_->broadcast(std::span<T>(b.data(), static_cast<std::size_t>(b.numel())), root, "broadcast of a buffer");
  }

  // Between backward() and the optimizer's step: every reduced parameter's gradient becomes the average over the
  // ranks.
  void reduce_gradients() {
    if (!step_open_) {
      reducer_.begin(std::span<T>(flat_.data(), static_cast<std::size_t>(flat_.size())));
      next_ = entries_.size();
    }
    step_open_ = false;
    while (next_ > 0) hand_over(--next_);
    reducer_.finish();
    for (const auto& e : entries_) {
      const optim::parameter_slot<T> slot = as_parameter_slot(e.parameter);
      std::memcpy(slot.grad, flat_.data() + e.offset, bytes(slot.size));
      if (slot.grad_pending_zero) *slot.grad_pending_zero = false;  // written now, whatever zero_grad left
    }
  }

  // The average over the ranks of one number per rank (a loss, a metric): a blocking all-reduce, in its place among
  // the buckets when called between backward() and reduce_gradients().
  double average(double value) {
    reducer_.within_step([&] { group_->all_reduce(std::span<double>(&value, 1), reduce_op::average, "average"); });
    return value;
  }

  nn::basic_module<T>& module() { return *module_; }
  process_group& group() { return *group_; }
  const gradient_reducer<T>& reducer() const { return reducer_; }
  // Sums over the ranks that keep their place among the gradient buckets (see the top of this file).
  replica_reducer& replicas() { return replicas_; }

 private:
  struct entry {
    nn::basic_variable<T> parameter;
    index_t offset;  // in flat_, registration order
  };
  static std::size_t bytes(index_t count) { return static_cast<std::size_t>(count) * sizeof(T); }

  // Calls fn on every SyncBatchNorm in the module that sums over this wrapper's group.
  template <class Fn>
  void for_each_sync_batch_norm(Fn fn) {
    module_->apply([&](nn::basic_module<T>& m) {
      if (auto* norm = dynamic_cast<basic_sync_batch_norm<T>*>(&m); norm && &norm->group() == group_) fn(*norm);
    });
  }

  // Copies entry k's gradient into the flat buffer and reports it final to the reducer (k counts down).
  void hand_over(std::size_t k) {
    const entry& e = entries_[k];
    const optim::parameter_slot<T> slot = as_parameter_slot(e.parameter);
    T* into = flat_.data() + e.offset;
    if (slot.grad_pending_zero && *slot.grad_pending_zero) std::memset(into, 0, bytes(slot.size));
    else std::memcpy(into, slot.grad, bytes(slot.size));
    reducer_.ready(e.offset, slot.size);
  }

  // The tape's side of backward(): parameter i is final; hands over every final parameter right below those handed
  // over (the reducer takes them from the end of the buffer down).
  class listener : public nn::detail::gradient_ready_listener<T> {
   public:
    explicit listener(basic_dynamic_data_parallel& owner) : owner_(&owner) {}
    std::span<nn::detail::variable_node<T>* const> watched_leaves() const override { return owner_->leaves_; }
    void gradient_ready(std::size_t i) override {
      owner_->ready_[i] = true;
      while (owner_->next_ > 0 && owner_->ready_[owner_->next_ - 1]) owner_->hand_over(--owner_->next_);
    }

   private:
    basic_dynamic_data_parallel* owner_;
  };

  nn::basic_module<T>* module_;
  process_group* group_;
  gradient_reducer<T> reducer_;
  group_replicas<T> replicas_;  // over group_, through reducer_
  std::vector<entry> entries_;
  aligned_buffer<T> flat_;
  std::vector<nn::detail::variable_node<T>*> leaves_;  // entries_' parameters, as the tape sees them
  std::vector<bool> ready_;                            // during backward(): which are final
  std::size_t next_ = 0;                               // entries [next_, end) are handed over
  bool step_open_ = false;                             // backward() began a step that reduce_gradients() ends
  listener listener_{*this};
};

using dynamic_data_parallel = basic_dynamic_data_parallel<float>;

}  // namespace kiln::distributed
