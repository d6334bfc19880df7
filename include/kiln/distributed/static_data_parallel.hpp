// kiln::distributed::static_data_parallel: data-parallel training of a static model (kiln::Sequential) over the ranks
// of a process group, as PyTorch's DistributedDataParallel. Each rank holds a copy of the model and trains on its own
// shard of every batch (distributed_sampler); the gradients are averaged over the ranks before each optimizer step,
// so every rank takes the same step and the copies stay equal.
//
//   distributed::process_group group;
//   Net net(32, /*seed=*/42);
//   distributed::static_data_parallel ddp(net, group);  // checks the ranks' models agree, copies rank 0's to the rest
//   optim::Adam adam({.lr = 1e-3});
//   float loss = ddp.train_step(x, labels, loss::cross_entropy{}, adam);  // x: this rank's 32 samples
//
// The flat gradient buffer is reduced in buckets (gradient_reducer) as the backward produces them, the last layer's
// first: net.forward_backward tells as each layer's gradients are final, and their bucket's all-reduce starts while
// the layers below are still in their backward. Then the unchanged optimizer step. Buffers (BatchNorm's running
// statistics) are rank 0's at the start and each rank's own afterwards, as DDP's without broadcast_buffers.
//
// While it wraps the model, the model's replicas are the ranks (group_replicas, lent through Sequential::set_replicas):
// SyncBatchNorm1d / 2d layers normalise by the statistics of the whole batch across the ranks, and every rank must
// run each training pass of the model (train_step, forward in training mode) together with the others. Why the
// averaged gradients are then the whole batch's: layers/sync_batch_norm.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "kiln/core/config.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/distributed/gradient_reducer.hpp"
#include "kiln/distributed/group_distribution.hpp"
#include "kiln/distributed/group_replicas.hpp"
#include "kiln/distributed/process_group.hpp"
#include "kiln/train/distribution.hpp"

namespace kiln::distributed {

namespace detail {
// FNV-1a over bytes: a fingerprint of a model's parameter names and shapes, compared across ranks.
inline std::uint64_t fingerprint(std::uint64_t h, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
inline constexpr std::uint64_t fingerprint_seed = 0xcbf29ce484222325ull;
inline std::uint64_t fingerprint(std::uint64_t h, std::string_view name, const shape& s) {
  h = fingerprint(h, name.data(), name.size());
  for (index_t e : s) h = fingerprint(h, &e, sizeof e);
  return fingerprint(h, "|", 1);
}
}  // namespace detail

template <class Net>
class static_data_parallel {
 public:
  using T = typename Net::value_type;
  static_assert(Net::host_accessible,
                "kiln::distributed::static_data_parallel: MPI reduces host memory; a model on a GPU policy needs a "
                "process group over NCCL");

  // Checks that every rank holds a model of the same parameter layout (every rank fails, naming each rank's size,
  // when one differs) and copies rank 0's parameters and buffers to the others. Every rank must make it at the same
  // point of the program.
  static_data_parallel(Net& net, process_group& group, bucket_options options = {})
      : net_(&net), group_(&group), reducer_(group, options), replicas_(group, &reducer_) {
    group.check_same(Net::flat_parameter_size, "number of parameter values (the model's flat buffer, with padding)");
    group.check_same(Net::flat_buffer_size, "number of buffer values (running statistics)");
    std::uint64_t h = detail::fingerprint_seed;
    for (const auto& p : Net::named_parameter_infos()) h = detail::fingerprint(h, p.name, p.shape);
    group.check_same(static_cast<std::int64_t>(h), "fingerprint of the parameter names and shapes");
    broadcast_state();
    net.set_replicas(&replicas_);
  }
  // The model is a model alone again: its SyncBatchNorm layers compute as BatchNorm.
  ~static_data_parallel() {
    if (net_->replicas() == &replicas_) net_->set_replicas(nullptr);
  }
  // The model holds the address of this wrapper's replicas.
  static_data_parallel(const static_data_parallel&) = delete;
  static_data_parallel& operator=(const static_data_parallel&) = delete;

  // Copies the parameters and buffers of rank `root` to every rank.
  void broadcast_state(int root = 0) {
    group_->broadcast(net_->parameter_values(), root, "broadcast of the parameters");
    if (Net::flat_buffer_size > 0) group_->broadcast(net_->buffer_values(), root, "broadcast of the buffers");
  }

  // One step on this rank's part of the batch: forward, loss and backward with the gradients all-reduced in buckets
  // as they are produced, averaged over the ranks, then the optimizer's step. Returns this rank's loss (average() of
  // it gives the whole batch's when every rank has as many samples).
  template <class Loss, class Optimizer>
  T train_step(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss, Optimizer& optimizer) {
    reducer_.begin(net_->gradient_values());
    T value;
    try {
      value = net_->forward_backward(x, target, loss, [this](index_t first, index_t count) {
        reducer_.ready(first, count);
      });
    } catch (...) {
      reducer_.cancel();  // a refused batch (a wrong shape, a label out of range) leaves the trainer usable
      throw;
    }
    reducer_.finish();
    if (!optimizer.has_parameters()) optimizer.add_parameters(net_->parameters());
    optimizer.step();
    return value;
  }

  // The average over the ranks of one number per rank (a loss, a metric): a blocking all-reduce.
  double average(double value) {
    group_->all_reduce(std::span<double>(&value, 1), reduce_op::average, "average");
    return value;
  }

  Net& model() { return *net_; }
  const Net& model() const { return *net_; }
  process_group& group() { return *group_; }
  // The ranks as Model::fit trains across them (distributed/data_parallel_model.hpp).
  train::distribution& distribution() { return distribution_; }
  // The last step's buckets and the time its end waited for them (what the overlap did not hide).
  const gradient_reducer<T>& reducer() const { return reducer_; }

 private:
  Net* net_;
  process_group* group_;
  gradient_reducer<T> reducer_;
  group_replicas<T> replicas_;
  group_distribution distribution_{*group_};
};

}  // namespace kiln::distributed
