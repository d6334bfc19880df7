// Batch normalisation whose statistics are those of the whole batch across the ranks, as PyTorch's SyncBatchNorm,
// for data-parallel training of a dynamic model when each rank's share of a batch is too small for statistics of its
// own:
//
//   kiln::distributed::process_group group;
//   auto model = kiln::nn::Sequential(kiln::nn::Conv2d(1, 16, 3),
//                                     kiln::distributed::SyncBatchNorm(group, 16), kiln::nn::ReLU(), ...);
//
// BatchNorm keeps per-rank statistics (each rank normalises by its own share's mean and variance); SyncBatchNorm is
// the option that normalises every rank's share by the mean and variance of all of them, so that 2 ranks of 32
// samples compute what one process computes on the 64. (Static mode's is a layer, kiln::SyncBatchNorm1d / 2d in
// layers/sync_batch_norm.hpp.) Its parameters and buffers are BatchNorm's, under the same names (weight, bias,
// running_mean, running_var, num_batches_tracked), so state dicts move between the two.
//
// In training its forward is differentiable ops around all_reduce_sum, an op whose gradient is itself an all-reduce
// sum of the output's gradient (the adjoint of a sum over the ranks): per channel, mean = all_reduce_sum(sum(x)) /
// count, then var = all_reduce_sum(sum((x - mean)^2)) / count (two passes, as precise as the one-process kernel's),
// y = (x - mean) / sqrt(var + eps) * weight + bias. So its backward computes, on each rank, the gradient of the sum of
// every rank's loss; with the gradients averaged over the ranks (dynamic_data_parallel) that is the gradient of the
// loss of the whole batch. The running statistics take the global mean and the global unbiased variance. In
// evaluation it is BatchNorm (the running statistics, no communication).
//
// Every rank must call forward and backward the same number of times in the same order: each is a collective (in
// training). Under dynamic_data_parallel the wrapper's reducer may have gradient buckets in flight on the same group
// while the backward runs (ddp.backward(loss) starts them from its progress thread, at moments that differ from rank
// to rank), so the wrapper lends the module its replicas (group_replicas, set_replicas) while it wraps it, and every
// sum of the forward and the backward goes through them: through the reducer's within_step, which starts the buckets
// closed so far first, so that the sum comes in the same place among the buckets on every rank, and keeps the two
// threads from calling MPI at once. A forward keeps the replicas it ran with for its backward: the wrapper outlives
// the backward of a forward it lent them to.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/replicas.hpp"
#include "kiln/dynamic/functional/arithmetic.hpp"
#include "kiln/dynamic/functional/common.hpp"
#include "kiln/dynamic/functional/normalization.hpp"
#include "kiln/dynamic/functional/pointwise.hpp"
#include "kiln/dynamic/functional/reduce.hpp"
#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/dynamic/grad_mode.hpp"
#include "kiln/dynamic/modules/normalization.hpp"
#include "kiln/dynamic/policy.hpp"
#include "kiln/distributed/process_group.hpp"

namespace kiln::distributed {

namespace detail {

// Replaces values by their sums over the ranks: through replicas where they are given (those of a data-parallel
// wrapper, which keep the sum in step with its gradient buckets), else by an all-reduce on the group.
template <class U>
void sum_over_ranks(process_group* group, replica_reducer* replicas, std::span<U> values, const char* what) {
  if (replicas) replicas->sum(values);
  else group->all_reduce(values, reduce_op::sum, what);
}

// Where all_reduce_sum sums: one of the two is set.
template <class T>
struct all_reduce_state : nn::detail::saved_state<T> {
  process_group* group = nullptr;
  replica_reducer* replicas = nullptr;
};

// The gradient of y = all_reduce_sum(x): dx = the sum over the ranks of dy.
template <class T>
void all_reduce_backward_entry(const nn::detail::tape_entry<T>& e) {
  auto& state = static_cast<all_reduce_state<T>&>(*e.saved);
  nn::detail::variable_node<T>* input = state.inputs[0];
  const index_t n = input->shape.numel();
  std::vector<T> summed(e.out->grad, e.out->grad + n);
  sum_over_ranks(state.group, state.replicas, std::span<T>(summed), "all_reduce_sum backward");
  auto target = nn::detail::grad_target_for(input);
  if (!target.data) return;
  if (target.accumulate) nn::dynamic_policy::accumulate(summed.data(), target.data, n);
  else nn::dynamic_policy::copy(summed.data(), target.data, n);
}

// all_reduce_sum below, summing as sum_over_ranks does.
template <class T>
nn::basic_variable<T> all_reduce_sum(const nn::basic_variable<T>& x, process_group* group, replica_reducer* replicas) {
  static_assert(nn::dynamic_policy::host_accessible,
                "kiln::distributed::all_reduce_sum: MPI reduces host memory; dynamic mode on a GPU policy needs a "
                "process group over NCCL");
  auto* xn = nn::detail::node_of(x, "all_reduce_sum");
  const bool record = nn::detail::should_record<T>({xn});
  auto y = nn::detail::make_output<T>(xn->shape, record);
  nn::dynamic_policy::copy(xn->value, y.data(), xn->shape.numel());
  sum_over_ranks(group, replicas, std::span<T>(y.data(), static_cast<std::size_t>(xn->shape.numel())),
                 "all_reduce_sum");
  if (record) {
    auto state = std::make_unique<all_reduce_state<T>>();
    state->keep_input(xn);
    state->group = group;
    state->replicas = replicas;
    nn::detail::tape<T>::instance().record(&all_reduce_backward_entry<T>, y.node(), std::move(state));
  }
  return y;
}

}  // namespace detail

// The element-wise sum of x over the ranks of group, differentiable: its gradient on each rank is the sum over the
// ranks of the output's gradient. Every rank must call it with x of the same shape, and run its backward.
template <class T>
nn::basic_variable<T> all_reduce_sum(const nn::basic_variable<T>& x, process_group& group) {
  return detail::all_reduce_sum(x, &group, nullptr);
}
// The same over the replicas of a data-parallel model, each rank one (dynamic_data_parallel::replicas(), whose sums
// keep their place among the gradient buckets in ddp.backward). The replicas outlive the backward.
template <class T>
nn::basic_variable<T> all_reduce_sum(const nn::basic_variable<T>& x, replica_reducer& replicas) {
  return detail::all_reduce_sum(x, nullptr, &replicas);
}

struct sync_batch_norm_options {
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;
};

template <class T>
class basic_sync_batch_norm : public nn::basic_batch_norm<T> {
 public:
  using variable = nn::basic_variable<T>;

  // The group outlives the module.
  basic_sync_batch_norm(process_group& group, index_t num_features, sync_batch_norm_options options = {})
      : nn::basic_batch_norm<T>(false, num_features, static_cast<T>(options.eps), static_cast<T>(options.momentum),
                                options.affine),
        group_(&group) {}

  // x: [N, C, *], C = num_features. Every rank's N may differ; the channels may not.
  variable forward(const variable& x) override {
    const index_t channels = this->num_features();
    if (!x.defined() || x.dim() < 2 || x.shape()[1] != channels)
      fail(describe(), ": expected input of shape [batch, ", channels, ", *], found ",
           x.defined() ? x.shape().str() : std::string("an empty Variable"));
    try {
      if (!this->is_training())
        return nn::batch_norm(x, this->running_mean, this->running_var, this->weight, this->bias, false,
                              this->momentum(), this->eps());
      return synchronised(x);
    } catch (const error& e) {
      fail(describe(), ": ", e.what());
    }
  }
  std::string name() const override { return "SyncBatchNorm"; }
  using nn::basic_module<T>::describe;
  process_group& group() const { return *group_; }

  // The replicas its sums go through, over the same group: dynamic_data_parallel lends its own while it wraps the
  // module (see the top of this file); null, the default, for an all-reduce on the group itself. The loan stays with
  // this object: a copy of the module starts without it.
  void set_replicas(replica_reducer* replicas) { replicas_.lent = replicas; }
  replica_reducer* replicas() const { return replicas_.lent; }

 private:
  variable synchronised(const variable& x) {
    const index_t batch = x.shape()[0], channels = this->num_features();
    const index_t spatial = batch > 0 ? x.numel() / (batch * channels) : 0;
    // Summed in double, as the static layer's: exact up to 2^53 values.
    double count = static_cast<double>(batch * spatial);
    detail::sum_over_ranks(group_, replicas_.lent, std::span<double>(&count, 1), "SyncBatchNorm count");
    if (count <= 1) fail("expected more than one value per channel across the ranks when training, found ", count);
    const T total = static_cast<T>(count);
    const kiln::shape per_channel{1, channels, 1};
    const auto summed = [&](const variable& v) { return detail::all_reduce_sum(v, group_, replicas_.lent); };
    const variable rows = nn::view(x, {batch, channels, spatial});
    const variable mean = nn::mul(summed(nn::sum(rows, {0, 2})), T(1) / total);
    const variable centered = nn::sub(rows, nn::view(mean, per_channel));
    const variable var = nn::mul(summed(nn::sum(nn::square(centered), {0, 2})), T(1) / total);
    variable y = nn::mul(centered, nn::view(nn::rsqrt(nn::add(var, this->eps())), per_channel));
    if (this->weight.defined())
      y = nn::add(nn::mul(y, nn::view(this->weight, per_channel)), nn::view(this->bias, per_channel));
    update_running_statistics(mean, var, total);
    return nn::view(y, x.shape());
  }

  // running = (1 - momentum) running + momentum batch, with the batch's unbiased variance, as BatchNorm's.
  void update_running_statistics(const variable& mean, const variable& var, T total) {
    nn::no_grad guard;
    const Tensor<T> m = mean.tensor(), v = var.tensor();
    nn::detail::host_values<T> running_mean(this->running_mean), running_var(this->running_var),
        tracked(this->num_batches_tracked);
    const T momentum = this->momentum(), unbiased = total / (total - T(1));
    for (index_t c = 0; c < this->num_features(); ++c) {
      running_mean.span()[static_cast<std::size_t>(c)] =
          (T(1) - momentum) * running_mean.span()[static_cast<std::size_t>(c)] + momentum * m[c];
      running_var.span()[static_cast<std::size_t>(c)] =
          (T(1) - momentum) * running_var.span()[static_cast<std::size_t>(c)] + momentum * v[c] * unbiased;
    }
    tracked.span()[0] += T(1);
    running_mean.write_back();
    running_var.write_back();
    tracked.write_back();
  }

  process_group* group_;
  lent_replicas replicas_;
};

using SyncBatchNorm = basic_sync_batch_norm<float>;

}  // namespace kiln::distributed
